"""The runner of `python -m nbjit compare`: build, check and time scenarios.

The runner wraps each scenario's function with both dispatchers, checks that
they agree on the outputs, and times them interleaved (`nbjit.bench.measure`)
together with the *floor* (`nbjit.bench.floor`): the executable's own execute
+ output handling, called from Python, which no Python dispatcher can beat.
A `Row` holds one scenario's result; `run` runs a matrix and returns its
rows with the run's metadata (versions, machine, settings).

Numbers written into this checkout's docs/ (`writes_into_docs`) are the
published ones: `python -m nbjit compare` then also runs the self-check
(jax.jit against itself, same matrix, right after) and writes nothing there
when it fails (`self_check_record`, kept in the run's metadata).

Multi-device scenarios need 8 devices: the CLI asks for them
(`nbjit.routing.devices.request_host_devices`) before JAX's backend starts; where
fewer devices exist they are skipped with a note.
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata
import importlib.util
import itertools
import os
import pathlib
import platform
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TextIO

import jax
import numpy as np

# Upstream's own jit, captured where JAX defines it: users rebind the public
# name (`jax.jit = nbjit.jit`), and a comparison against that would compare
# nbjit with itself.
from nbjit._jax import jax_jit
from nbjit.bench import measure
from nbjit.bench.matrix import Case, Scenario
from nbjit.bench.training import loop_row


@dataclass
class Row:
    name: str
    n_args: int
    kind: str
    block: bool
    family: str | None
    origin: str
    a_us: float | None = None  # nbjit (or jax.jit "A" in the self-check)
    b_us: float | None = None  # jax.jit
    floor_us: float | None = None
    ratio: float | None = None  # median of per-round a/b
    ratio_p10: float | None = None
    ratio_p90: float | None = None
    rounds: int = 0
    calls_per_batch: int = 0
    seconds: float = 0.0
    note: str = ""
    # Contenders beyond a and b (Case.sides): name -> median of per-round a / it.
    other_ratios: dict[str, float] | None = None
    # A training loop's row (Case.loop): a_us/b_us are per step, and this holds
    # the time until each call returns (nbjit.bench.training.loop_row).
    loop: dict[str, Any] | None = None
    # Rows timed call by call (`Scenario.sync_each`: large asynchronous work):
    # a_us, b_us and ratio run until the result is ready; these, until the
    # call returned (None on other rows).
    a_return_us: float | None = None
    b_return_us: float | None = None
    return_ratio: float | None = None
    return_ratio_p10: float | None = None
    return_ratio_p90: float | None = None


Jit = Callable[..., Callable[..., Any]]


def fresh_copy(fun: Callable[..., Any]) -> Callable[..., Any]:
    """A new function object with ``fun``'s code: a cache miss for any jit, every time."""
    if isinstance(fun, types.FunctionType):
        return types.FunctionType(
            fun.__code__, fun.__globals__, fun.__name__, fun.__defaults__, fun.__closure__
        )
    return functools.partial(fun)


def _blocker(out: Any) -> Callable[[Any], Any]:
    if isinstance(out, jax.Array):
        return type(out).block_until_ready  # the concrete class's method: no lookup per call
    return jax.block_until_ready


def _caller(jitted: Callable[..., Any], case: Case, block: bool) -> Callable[[], Any]:
    """A zero-argument call of ``jitted`` with the case's inputs, as cheap as Python allows."""
    args, kwargs = case.args, case.kwargs
    if case.arg_pool:
        take = itertools.cycle(case.arg_pool).__next__
        call = (lambda: jitted(*take(), **kwargs)) if kwargs else (lambda: jitted(*take()))
    else:
        call = (lambda: jitted(*args, **kwargs)) if kwargs else (lambda: jitted(*args))
    if not block:
        return call
    blk = _blocker(call())
    return lambda: blk(call())


def _fresh_caller(jit: Jit, case: Case, block: bool) -> Callable[[], Any]:
    fun, opts, args, kwargs = case.fun, case.jit_options, case.args, case.kwargs

    def call():
        return jit(fresh_copy(fun), **opts)(*args, **kwargs)

    if not block:
        return call
    blk = _blocker(call())
    return lambda: blk(call())


def output_difference(x: Any, y: Any) -> str | None:
    """Why two call results differ (structure, dtype, weak type, sharding, values), or None."""
    lx, tx = jax.tree.flatten(x)
    ly, ty = jax.tree.flatten(y)
    if tx != ty:  # type: ignore[operator]  # (jax's stubs: PyTreeDef has no !=)
        return f"tree structure {tx} != {ty}"
    for i, (u, v) in enumerate(zip(lx, ly, strict=True)):
        for attr in ("dtype", "weak_type", "sharding"):
            if getattr(u, attr, None) != getattr(v, attr, None):
                return f"leaf {i}: {attr} {getattr(u, attr, None)} != {getattr(v, attr, None)}"
        if not np.array_equal(np.asarray(u), np.asarray(v)):
            return f"leaf {i}: values differ"
    return None


def first_difference(f_a: Callable[..., Any], f_b: Callable[..., Any], case: Case
                     ) -> str | None:
    """How the two sides' outputs differ on the case's inputs, or None.

    A new-values case is checked on its first three argument tuples, so a
    side that reuses an earlier call's values shows.
    """
    for args in case.arg_pool[:3] or (case.args,):
        diff = output_difference(f_a(*args, **case.kwargs), f_b(*args, **case.kwargs))
        if diff:
            return diff
    return None


def _floor_contender(target: Any, floor_call: Callable[..., Callable[[], Any]], case: Case,
                     block: bool) -> Callable[[], Any]:
    """The floor of `target` on this case (execute + outputs only), waited for if `block`."""
    target(*case.args, **case.kwargs)
    floor = floor_call(target, *case.args, **case.kwargs)
    if not block:
        return floor
    blk = _blocker(floor())
    return lambda: blk(floor())


SETTLE_CALLS = 32  # > 2 * nbjit.host.policy.ARM_AFTER: enough fresh values to arm host inputs


def settle(call: Callable[[], Any]) -> None:
    """Brings a contender to the steady state a long loop sees: enough calls for
    nbjit to make fresh host inputs resident (the CPU)."""
    for _ in range(SETTLE_CALLS):
        jax.block_until_ready(call())


def run_scenario(
    scenario: Scenario,
    jit_a: Jit,
    jit_b: Jit,
    settings: measure.Settings,
    floor_jit: Jit | None = None,
    floor_call: Callable[..., Callable[[], Any]] | None = None,
    *,
    self_check: bool = False,
) -> Row:
    """Build, check and time one scenario: A = ``jit_a``, B = ``jit_b``, plus the floor.
    A row with contenders of its own (`Case.sides`) times those (its ideal, side b,
    against itself with `self_check`)."""
    row = Row(scenario.name, scenario.n_args, scenario.kind, scenario.block, scenario.family,
              scenario.origin)
    if len(jax.devices()) < scenario.min_devices:
        row.note = f"skipped: needs {scenario.min_devices} devices, have {len(jax.devices())}"
        return row
    if scenario.needs and importlib.util.find_spec(scenario.needs) is None:
        row.note = f"skipped: needs {scenario.needs} (not installed)"
        return row
    case = scenario.build()
    if case.loop is not None:  # a training loop: per step, and until each call returns
        return loop_row(row, case.loop, jit_a, jit_b, settings, _side_names(self_check))
    if case.sides:
        if self_check:  # the row's B side (the ideal) against itself
            _, fun, pool = case.sides[1]
            case = replace(case, sides=(("a", fun, pool), ("b", fun, pool)))
        return _run_sides(row, case, scenario.block, settings)
    notes = []
    if case.fresh_function:
        call_a = _fresh_caller(jit_a, case, scenario.block)
        call_b = _fresh_caller(jit_b, case, scenario.block)
        f_a = jit_a(case.fun, **case.jit_options)
        f_b = jit_b(case.fun, **case.jit_options)
    else:
        f_a = jit_a(case.fun, **case.jit_options)
        f_b = jit_b(case.fun, **case.jit_options)
        call_a = _caller(f_a, case, scenario.block)
        call_b = _caller(f_b, case, scenario.block)
    diff = first_difference(f_a, f_b, case)
    if diff:
        notes.append(f"OUTPUTS DIFFER: {diff}"[:160])
    contenders = [("a", call_a), ("b", call_b)]
    if floor_call is not None and floor_jit is not None and not case.fresh_function:
        try:
            target = f_a if floor_jit is jit_a else floor_jit(case.fun, **case.jit_options)
            contenders.append(("floor", _floor_contender(target, floor_call, case,
                                                         scenario.block)))
        except Exception as exc:  # the floor is best effort; the comparison is not
            notes.append(f"no floor: {type(exc).__name__}: {exc}"[:120])
    if not case.fresh_function:
        for _, call in contenders[:2]:
            settle(call)
    result = measure.interleave(contenders, settings, sync=jax.block_until_ready,
                                 sync_each=scenario.sync_each)
    _record_times(row, result)
    if result.returned_s is not None:
        notes.insert(0, return_note(row))
    row.note = "; ".join(notes)
    return row


def _record_times(row: Row, result: measure.Interleaved) -> None:
    """A row's figures from its interleaved measurement (a, b, the floor)."""
    ratio = result.ratio("a", "b")
    row.a_us = result.median_us("a")
    row.b_us = result.median_us("b")
    if "floor" in result.names:
        row.floor_us = result.median_us("floor")
    row.ratio, row.ratio_p10, row.ratio_p90 = ratio.median, ratio.p10, ratio.p90
    if result.returned_s is not None:  # timed until ready: until the calls returned too
        returned = result.ratio("a", "b", returned=True)
        row.a_return_us = result.median_us("a", returned=True)
        row.b_return_us = result.median_us("b", returned=True)
        row.return_ratio = returned.median
        row.return_ratio_p10, row.return_ratio_p90 = returned.p10, returned.p90
    _record_rounds(row, result)


def _side_names(self_check: bool) -> tuple[str, str]:
    return ("jax.jit (A)", "jax.jit") if self_check else ("nbjit", "jax.jit")


def _record_rounds(row: Row, result: measure.Interleaved) -> None:
    row.rounds = result.per_call_s.shape[0]
    row.calls_per_batch = result.calls_per_batch
    row.seconds = result.seconds


def return_note(row: Row) -> str:
    """The note of a row timed until its result is ready: when the calls returned."""
    return (f"timed until the result is ready; the call returned after {row.a_return_us:.1f} "
            f"us / jax.jit {row.b_return_us:.1f} us, ratio {row.return_ratio:.2f} "
            f"[{row.return_ratio_p10:.2f}-{row.return_ratio_p90:.2f}]")


def _run_sides(row: Row, case: Case, block: bool, settings: measure.Settings) -> Row:
    """A case with contenders of its own (`Case.sides`): a / b is the row's ratio,
    every other contender's median and a / it go to the note; a's outputs are
    checked against each side that takes the same arguments."""
    calls, notes = {}, []
    for name, fun, pool in case.sides:
        calls[name] = _caller(fun, Case(fun, pool[0], arg_pool=pool), block)
    a_fun, a_pool = case.sides[0][1], case.sides[0][2]
    for name, fun, pool in case.sides[1:]:
        same = zip(pool, a_pool, strict=True)
        if all(u is v for t, s in same for u, v in zip(t, s, strict=True)):
            diff = output_difference(a_fun(*a_pool[0]), fun(*pool[0]))
            if diff:
                notes.append(f"OUTPUTS DIFFER from {name}: {diff}"[:160])
    for call in calls.values():
        settle(call)
    result = measure.interleave(list(calls.items()), settings, sync=jax.block_until_ready)
    ratio = result.ratio("a", "b")
    row.a_us, row.b_us = result.median_us("a"), result.median_us("b")
    row.ratio, row.ratio_p10, row.ratio_p90 = ratio.median, ratio.p10, ratio.p90
    row.other_ratios = {}
    for name in calls:
        if name not in ("a", "b"):
            other = result.ratio("a", name)
            row.other_ratios[name] = other.median
            notes.append(f"{name} {result.median_us(name):.1f} us, a/{name} {other.median:.3f} "
                         f"[{other.p10:.3f}-{other.p90:.3f}]")
    _record_rounds(row, result)
    row.note = "; ".join(notes)
    return row


class Progress:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 28) -> None:
        self.total, self.width = total, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()

    def update(self, done: int, label: str) -> None:
        elapsed = time.perf_counter() - self.start
        eta = elapsed / done * (self.total - done) if done else float("nan")
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        eta_s = f"eta {eta:4.0f}s" if done else "eta    ?"
        line = f"[{bar}] {done:>3}/{self.total} {elapsed:5.0f}s {eta_s}  {label}"
        if self.tty:
            self.stream.write("\r" + line[:118].ljust(118))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def run(
    matrix: Sequence[Scenario],
    settings: measure.Settings,
    self_check: bool = False,
    progress: bool = True,
    stream: TextIO | None = None,
) -> tuple[list[Row], dict[str, Any]]:
    """Run the matrix; return the rows and the run's metadata."""
    from nbjit.bench.floor import floor_call
    from nbjit.core.dispatch import jit as nbjit_jit

    jit_a, label_a = (jax_jit, "jax.jit (A)") if self_check else (nbjit_jit, "nbjit")
    bar = Progress(len(matrix), stream) if progress else None
    rows = []
    t0 = time.perf_counter()
    for i, scenario in enumerate(matrix):
        if bar:
            bar.update(i, scenario.name)
        rows.append(run_scenario(scenario, jit_a, jax_jit, settings, nbjit_jit, floor_call,
                                 self_check=self_check))
    if bar:
        bar.update(len(matrix), "done")
        bar.close()
    meta = metadata(settings, self_check, label_a)
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    return rows, meta


def git_commit() -> str | None:
    """HEAD's short hash, with ``+dirty`` when nbjit/ has uncommitted changes;
    ``NBJIT_COMMIT`` in the environment instead, where it is set (a copy of a
    checkout whose git, if any, is not the one it came from: a lent machine's,
    as scripts/accel_check.sh says)."""
    if named := os.environ.get("NBJIT_COMMIT"):
        return named
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # nbjit/

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", here)
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) if head else None


def _nbjit_version() -> str | None:
    try:
        return importlib.metadata.version("nbjit")
    except importlib.metadata.PackageNotFoundError:  # (a checkout on sys.path, not installed)
        return None


def metadata(settings: measure.Settings, self_check: bool, label_a: str) -> dict[str, Any]:
    import jaxlib
    import numba

    devices = jax.devices()
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "a": label_a,
        "b": "jax.jit",
        "self_check": self_check,
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "numba": numba.__version__,
            "numpy": np.__version__,
            "nbjit": _nbjit_version(),
            "nbjit_commit": git_commit(),
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
            "backend": devices[0].platform,
            "devices": len(devices),
        },
        "settings": asdict(settings),
        "notes": [],
    }


DOCS_DIR = pathlib.Path(__file__).resolve().parents[2] / "docs"  # this checkout's


def writes_into_docs(paths: Sequence[str | None]) -> bool:
    """Whether any of the output paths lies in this checkout's docs/."""
    return any(p and pathlib.Path(p).resolve().is_relative_to(DOCS_DIR) for p in paths)


def self_check_record(rows: Sequence[Row], band: tuple[float, float]) -> dict[str, Any]:
    """The self-check of a run, for its metadata: jax.jit against itself over
    the same matrix; passed when every timed row's ratio lies within `band`."""
    ratios = [(r.name, r.ratio) for r in rows if r.ratio is not None]
    outside = [[name, round(ratio, 3)] for name, ratio in ratios
               if not band[0] <= ratio <= band[1]]
    return {"passed": not outside, "band": list(band), "rows": len(ratios), "outside": outside}
