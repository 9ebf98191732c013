"""Agreement between real processes: 4 on loopback, 1 CPU device each.

Each case starts 4 processes joined by `jax.distributed.initialize` (its own
coordinator, a free port) that call one process-spanning `nbjit.jit` function
(`jnp.sum` over a global array: an all-reduce) once, each after a start-up
skew of its own drawn from the case's seed (tests/_agreement_worker.py).
Every process must end with the expected outcome: the sum (all agree; or
process 0's first call comes through another frame; or the last process
clears its cache and calls again from another line), or an AgreementError
naming both shapes (one differs, on time or 3 s late, or agrees but calls 3 s
after the others decided: then within 5 s of its call), or naming the
programs (the last process traces another program: decided early), or, when
one never calls, an AgreementError naming it after the (short) timeout.
Every process is killed at a bound far below the agreement timeout of the
differing cases (60 s): a process left waiting for it fails the case.

The default run (`-m "not slow"`) makes one pass of each case; the `slow`
repetitions vary the start-up skew.
"""

from __future__ import annotations

import pytest
from _agreement_worker import Result, run_scenario  # noqa: E402

pytestmark = pytest.mark.multiprocess

N = 4
BOUND_S = 45.0  # start-up (JAX imports on 2 cores), the call, the linger; not the timeout


def _check(result: Result) -> None:
    failures = result.failures()
    if failures:
        logs = "\n".join(f"----- process {q} (exit {result.codes[q]}) -----\n"
                         f"{result.logs[q][-3000:]}" for q in failures)
        pytest.fail(f"{result.scenario}: {failures}\n{logs}")


CASES = [("agree", 60.0), ("differ", 60.0), ("late", 60.0), ("after", 60.0), ("never", 3.0),
         ("warm", 60.0), ("cleared", 60.0), ("branch", 60.0)]


@pytest.mark.parametrize("scenario,timeout_s", CASES)
def test_four_processes(scenario, timeout_s):
    _check(run_scenario(N, scenario, seed=0, timeout_s=timeout_s, bound_s=BOUND_S))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("scenario,timeout_s", CASES)
def test_four_processes_skewed(scenario, timeout_s, seed):
    _check(run_scenario(N, scenario, seed=seed, timeout_s=timeout_s, bound_s=BOUND_S))
