"""The agreement exchange at pod scale, simulated: N processes as threads.

The real exchange code (`exchange.agree`) runs once per simulated
process against `CountingStore`, an in-memory stand-in for jax.distributed's
client (the calls nbjit makes, with the same errors) that counts round trips,
entries and bytes served. One miss of one function per run, its signature
with `leaves` array leaves (the issue's 100: a path, an aval and a sharding
each). Scenarios: every process agrees at once ("agree"); one process calls
`late_s` seconds after the others ("late"); one calls with another shape
("shape"); one never calls ("never": the others raise after the timeout).

    python -m nbjit.multiprocess.simulate [--processes 8 32 128 256 1024] [--late 2]

prints the table that docs/multi-controller.md shows. ``--exchange MODULE``
runs another implementation with the same `agree` signature, e.g. the
one before this exchange: ``PYTHONPATH=<old checkout> python
nbjit/multiprocess/simulate.py --exchange nbjit._agreement`` (this file
imports nothing of nbjit's for that reason, only the module named).
"""

from __future__ import annotations

import argparse
import importlib
import json
import threading
import time
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from jax.errors import JaxRuntimeError

__all__ = ["SCENARIOS", "CountingStore", "Run", "main", "simulate"]

SCENARIOS = ("agree", "late", "shape", "never")
DEFAULT_EXCHANGE = "nbjit.multiprocess.exchange"


class CountingStore:
    """jax.distributed's key-value client in memory, counting what it serves.

    An entry is one (key, value) a call returns (a directory read returns many;
    a get or an increment one; a missing key or a timed-out wait none); bytes
    are those of the values, plus the keys of a directory read.
    """

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s  # each call's round trip, slept outside the lock
        self._data: dict[str, str] = {}
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}  # key -> set once it is written
        self.round_trips = self.entries = self.bytes = 0

    def _trip(self) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)

    def _serve(self, entries: int, size: int) -> None:
        self.entries += entries
        self.bytes += size

    def _write(self, key: str, value: str) -> None:
        self._data[key] = value
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        self._trip()
        with self._lock:
            self.round_trips += 1
            if not allow_overwrite and key in self._data:
                raise JaxRuntimeError(f"ALREADY_EXISTS: key {key} already exists.")
            self._write(key, value)

    def key_value_try_get(self, key: str) -> str:
        self._trip()
        with self._lock:
            self.round_trips += 1
            if key not in self._data:
                raise JaxRuntimeError(f"NOT_FOUND: Config key {key} not found.")
            value = self._data[key]
            self._serve(1, len(value))
            return value

    def key_value_increment(self, key: str, increment: int) -> int:
        self._trip()
        with self._lock:
            self.round_trips += 1
            value = int(self._data.get(key, "0")) + increment
            if not -2**31 <= value < 2**31:  # the coordination service's counters are int32
                raise JaxRuntimeError(f'FAILED_PRECONDITION: Failed to parse value "{value}" '
                                      "as an integer.")
            self._write(key, str(value))
            self._serve(1, len(str(value)))
            return value

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        self._trip()
        with self._lock:
            self.round_trips += 1
            if key not in self._data:
                event = self._events.setdefault(key, threading.Event())
            else:
                event = None
        if event is not None and not event.wait(timeout_in_ms / 1e3):
            raise JaxRuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: "
                                  f"{key} and duration: {timeout_in_ms}ms")
        with self._lock:
            value = self._data[key]
            self._serve(1, len(value))
            return value

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        self._trip()
        with self._lock:
            self.round_trips += 1
            found = sorted((k, v) for k, v in self._data.items() if k.startswith(prefix))
            self._serve(len(found), sum(len(k) + len(v) for k, v in found))
            return found


@dataclass
class Run:
    """One simulated miss: what the store served, and what each process got."""

    processes: int
    scenario: str
    round_trips: int
    entries: int
    bytes: int
    seconds: float
    outcomes: dict[int, str] = field(default_factory=dict)  # rank -> "ok" or the error
    errors: dict[int, BaseException] = field(default_factory=dict)
    warned: int = 0


def _signature(module: ModuleType, leaves: int, processes: int, rows: int) -> Any:
    """A signature of `leaves` sharded leaves, described as nbjit describes them."""
    from nbjit._kernels import stable_text_hash  # the exchange's own hash; numba loads here

    mesh = f"NamedSharding(mesh x={processes} devices 0..{processes * 4 - 1}, P('x', None))"
    entries = [("jit options", "{}"), ("arguments", "1 leaves, keywords []"),
               ("args[0] (pytree)", "PyTreeDef({" + ", ".join(
                   f"'layer{i}': *" for i in range(leaves)) + "})")]
    for i in range(leaves):
        path = f"args[0]['layer{i}']"
        shape = f"{rows},1024" if i == 0 else "4096,1024"
        entries += [(path, f"float32[{shape}]"), (f"{path} sharding", f"{mesh} committed")]
    return module.Signature(stable_text_hash(json.dumps(entries)), entries)


def simulate(processes: int, scenario: str = "agree", *, leaves: int = 100,
             late_s: float = 2.0, timeout_s: float = 30.0, odd: int | None = None,
             latency_s: float = 0.0, exchange: str = DEFAULT_EXCHANGE) -> Run:
    """One miss of one function by `processes` simulated processes, as `scenario` says;
    `odd` is the rank that is late, differs or never calls (default: the middle one);
    `latency_s`: each store call's round trip."""
    module = importlib.import_module(exchange)
    odd = processes // 2 if odd is None else odd
    store = CountingStore(latency_s)
    info = module.FunctionInfo("step (train.py:41)", "00000000000000f1", True, "{}")
    agreed, other = (_signature(module, leaves, processes, rows) for rows in (4096, 2048))
    callers = [r for r in range(processes) if not (scenario == "never" and r == odd)]
    barrier = threading.Barrier(len(callers))
    run = Run(processes, scenario, 0, 0, 0, 0.0)
    old = module.configure(timeout_s=timeout_s)
    warned_before = module.counters().warnings

    def call(rank: int) -> None:
        signature = other if scenario == "shape" and rank == odd else agreed
        barrier.wait()
        if scenario == "late" and rank == odd:
            time.sleep(late_s)
        try:
            module.agree(store, info, signature, f"train.py:{88 + (rank == odd)}", rank,
                             processes, module.ProcessState())
            run.outcomes[rank] = "ok"
        except Exception as error:  # noqa: BLE001 (reported per process)
            run.outcomes[rank], run.errors[rank] = type(error).__name__, error

    threading.stack_size(512 * 1024)  # a thousand threads, each mostly waiting
    threads = [threading.Thread(target=call, args=(r,), daemon=True) for r in callers]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", module.AgreementWarning)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    run.seconds = time.perf_counter() - start
    module.configure(**old)
    run.round_trips, run.entries, run.bytes = store.round_trips, store.entries, store.bytes
    run.warned = module.counters().warnings - warned_before
    return run


def _table(rows: list[tuple[Run, Run | None]]) -> str:
    head = ("| processes | entries served | MB served | round trips | with one process "
            "late: entries | MB | round trips |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    lines = [head]
    for agree, late in rows:
        cells = [f"{agree.processes}", f"{agree.entries:,}", f"{agree.bytes / 1e6:.3f}",
                 f"{agree.round_trips:,}"]
        cells += ([f"{late.entries:,}", f"{late.bytes / 1e6:.3f}", f"{late.round_trips:,}"]
                  if late else ["", "", ""])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[8, 32, 128, 256, 1024])
    parser.add_argument("--late", type=float, default=2.0, help="seconds (0: skip that column)")
    parser.add_argument("--leaves", type=int, default=100)
    parser.add_argument("--exchange", default=DEFAULT_EXCHANGE)
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds each store call takes (the coordinator's round trip)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="NBJIT_AGREEMENT_TIMEOUT of the simulated processes")
    parser.add_argument("--others", action="store_true",
                        help="also the 'shape' and 'never' scenarios (timeout 2 s)")
    args = parser.parse_args(argv)
    rows, others = [], []
    for n in args.processes:
        common = {"leaves": args.leaves, "latency_s": args.latency, "exchange": args.exchange}
        agree = simulate(n, "agree", timeout_s=args.timeout, **common)
        late = (simulate(n, "late", late_s=args.late, timeout_s=args.timeout, **common)
                if args.late else None)
        for r in (agree, late) if late else (agree,):
            bad = {q: o for q, o in r.outcomes.items() if o != "ok"}
            assert not bad and r.warned == 0, (r.scenario, bad, r.warned)
        rows.append((agree, late))
        print(f"{n} processes: agree {agree.seconds:.2f} s"
              + (f", late {late.seconds:.2f} s" if late else ""), flush=True)
        if args.others:
            others += [simulate(n, s, timeout_s=2.0, **common) for s in ("shape", "never")]
    print(_table(rows))
    for r in others:
        kinds = sorted(set(r.outcomes.values()))
        print(f"{r.scenario} at {r.processes}: {r.entries:,} entries, {r.bytes / 1e6:.3f} MB, "
              f"{r.round_trips:,} round trips, {r.seconds:.2f} s; outcomes {kinds}, "
              f"{r.warned} warned")


if __name__ == "__main__":
    main()
