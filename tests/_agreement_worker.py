"""Real processes disagreeing at one call: N processes on loopback, 1 CPU device each.

    python tests/_agreement_worker.py --worker PORT RANK N SCENARIO SKEW_S LINGER_S

is one process; `run_scenario` (used by tests/test_agreement_processes.py and
benchmarks/agreement_processes.py) starts N of them, joined by
`jax.distributed.initialize` on a free port, and collects what each saw.

Every process calls one process-spanning function, `nbjit.jit(jnp.sum)` over a
global array (an all-reduce), once, after a start-up skew of its own
(`SKEW_S`, so that the order in which processes publish varies), then a second
time (a hit) when the first agreed. Scenarios (`odd` is the last process):

- ``agree``: every process passes the same global shape; each gets the sum.
- ``differ``: `odd` passes another global shape; each raises AgreementError
  naming both shapes.
- ``late``: as ``differ``, `odd` calls 3 s after the others.
- ``after``: as ``differ``, and process 1 (same shape as the others) calls 3 s
  late, when the others have already decided: it must still raise, at once.
- ``never``: `odd` never calls; the others raise AgreementError after the
  agreement timeout (the parent sets it short).
- ``warm``: process 0 makes its first call through a warm-up helper (another
  frame); each gets the sum (the same program everywhere).
- ``cleared``: after both calls `odd` clears the function's cache and calls
  again from another line; each gets the sum three times.
- ``branch``: the traced function branches on `jax.process_index()`, so
  `odd` traces another program; each raises AgreementError naming the
  programs, decided without waiting for the timeout.

Each process prints one line ``OUTCOME {json}`` as soon as it has its outcome
(with the seconds from its call to it), stays up `LINGER_S` seconds (a real
program goes on or exits; a process that exits takes the coordinator with it
when it is process 0), and exits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from _env import child_env

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("agree", "differ", "late", "after", "never", "warm", "cleared", "branch")
LATE_S = 3.0
# seconds from a call to its AgreementError when processes differ: a few polls,
# plus the 3 s of the late cases and a loaded machine; far below the timeout
OUTCOME_BOUND_S = 20.0


def _worker(port: int, rank: int, n: int, scenario: str, skew_s: float, linger_s: float) -> None:
    import jax

    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=n,
                               process_id=rank, initialization_timeout=120)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import nbjit

    mesh = Mesh(np.array(jax.devices()), ("x",))
    odd = n - 1
    rows = 2 * n * (2 if scenario in ("differ", "late", "after") and rank == odd else 1)
    data = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    x = jax.make_array_from_callback((rows, 4), NamedSharding(mesh, P("x")),
                                     lambda i: data[i])
    f = nbjit.jit(lambda x: jnp.sum(x) * (2.0 if scenario == "branch"
                                          and jax.process_index() == odd else 1.0))

    def warm_up() -> float:  # a first call from another frame
        return float(f(x))

    seen: dict = {"rank": rank}
    late = (scenario == "late" and rank == odd) or (scenario == "after" and rank == 1)
    time.sleep(skew_s + (LATE_S if late else 0.0))
    if not (scenario == "never" and rank == odd):
        start = time.perf_counter()
        try:
            first = warm_up() if scenario == "warm" and rank == 0 else float(f(x))
            sums = [first, float(f(x))]
            if scenario == "cleared":
                if rank == odd:
                    f.clear_cache()
                sums.append(warm_up() if rank == odd else float(f(x)))
            seen["outcome"] = "ok" if set(sums) == {float(data.sum())} else f"wrong {sums}"
        except nbjit.AgreementError as error:
            seen["outcome"] = "AgreementError"
            seen["path"], seen["values"] = error.path, error.values
            seen["message"] = str(error)
        except Exception as error:  # noqa: BLE001 (reported to the parent)
            seen["outcome"] = f"{type(error).__name__}: {error}"
        seen["seconds"] = round(time.perf_counter() - start, 3)
    else:
        seen["outcome"] = "not called"
    from nbjit.multiprocess import agreement

    seen["round_trips"] = agreement.counters().round_trips
    print("OUTCOME " + json.dumps(seen), flush=True)
    time.sleep(linger_s)


@dataclass
class Result:
    """One run: per rank, what it printed (None: it printed nothing) and how it ended."""

    n: int
    scenario: str
    timeout_s: float
    outcomes: dict[int, dict | None] = field(default_factory=dict)
    codes: dict[int, int | str] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)

    def expected(self, rank: int) -> str | None:
        """What `rank` should have seen; None when it holds, else what went wrong."""
        seen, n = self.outcomes.get(rank), self.n
        if seen is None:
            return f"no outcome (exit {self.codes.get(rank)})"
        odd = n - 1
        if self.scenario in ("agree", "warm", "cleared"):
            return None if seen["outcome"] == "ok" else seen["outcome"]
        if self.scenario == "branch":
            values, message = seen.get("values", {}), seen.get("message", "")
            programs = set(values.values()) - {"(not called yet)"}
            if (seen["outcome"] != "AgreementError" or seen["path"] != "program"
                    or len(programs) != 2 or "waits on a program of its own"
                    not in message):  # decided early, not after the timeout
                return f"{seen['outcome']} {seen.get('path')} {message}"
            return None
        if self.scenario == "never":
            if rank == odd:
                return None
            if seen["outcome"] != "AgreementError" or f"process {odd}" not in seen["message"]:
                return str(seen["outcome"])
            if seen["seconds"] > self.timeout_s + OUTCOME_BOUND_S:
                return f"raised {seen['seconds']} s after its call"
            return None
        if seen["outcome"] != "AgreementError":
            return str(seen["outcome"])
        # both shapes, each on the right processes (those that had not called when
        # the others decided are named so), this process's own among them
        want = {str(q): f"float32[{4 * n if q == odd else 2 * n},4]" for q in range(n)}
        values = seen["values"]
        if (seen["path"] != "x" or set(values) != set(want)
                or any(v not in (want[q], "(not called yet)") for q, v in values.items())
                or values[str(rank)] != want[str(rank)]
                or len(set(values.values()) - {"(not called yet)"}) != 2):
            return f"AgreementError {seen['path']} {values}"
        late = (self.scenario == "late" and rank == odd) or (self.scenario == "after"
                                                             and rank == 1)
        if late and seen["seconds"] > 5.0:
            return f"late process raised {seen['seconds']} s after its call"
        if seen["seconds"] > OUTCOME_BOUND_S:  # it waited for its timeout: nobody told it
            return f"raised {seen['seconds']} s after its call"
        return None

    def failures(self) -> dict[int, str]:
        found = {q: self.expected(q) for q in range(self.n)}
        return {q: why for q, why in found.items() if why is not None}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(devices: int, timeout_s: float) -> dict[str, str]:
    """The environment of a worker process: `devices` CPU devices, the agreement
    timeout, and the nbjit under test (this checkout) first on its path."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    return child_env(
        drop=("NBJIT_CHECK_AGREEMENT", "JAX_NUM_CPU_DEVICES"), JAX_PLATFORMS="cpu",
        XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]),
        NBJIT_AGREEMENT_TIMEOUT=str(timeout_s))


def run_scenario(n: int, scenario: str, *, seed: int = 0, timeout_s: float = 60.0,
                 linger_s: float = 1.0, bound_s: float = 90.0) -> Result:
    """Starts `n` processes for `scenario`; each gets a start-up skew of up to 0.5 s
    drawn from `seed`; every process is killed `bound_s` after the start."""
    import random

    rng = random.Random(seed)
    port = _free_port()
    env = worker_env(1, timeout_s)
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", str(port), str(r), str(n), scenario,
         f"{rng.uniform(0, 0.5):.3f}", str(linger_s)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        for r in range(n)]
    result = Result(n, scenario, timeout_s)
    deadline = time.monotonic() + bound_s
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            result.codes[r] = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            result.codes[r] = "killed"
        lines = [ln for ln in out.splitlines() if ln.startswith("OUTCOME ")]
        result.outcomes[r] = json.loads(lines[-1][8:]) if lines else None
        result.logs[r] = out
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        port, rank, n = map(int, sys.argv[2:5])
        _worker(port, rank, n, sys.argv[5], float(sys.argv[6]), float(sys.argv[7]))
