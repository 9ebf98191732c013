"""The agreement exchange at pod scale: N simulated processes (threads) over a
counting in-memory store (nbjit.multiprocess.simulate), one miss each run.

The store's load must grow with N, not N squared: when processes agree only
small markers travel (entries and bytes served bounded by c*N), a late process
costs O(1) entries per process per poll, and a mismatch or a missing process
is still told to every process, each naming every side's value (or the process
that did not call).
"""

from __future__ import annotations

import pytest

from nbjit.multiprocess import exchange as _exchange
from nbjit.multiprocess.simulate import simulate

MB = 1e6


def all_ok(run) -> None:
    bad = {q: o for q, o in run.outcomes.items() if o != "ok"}
    assert not bad and run.warned == 0, (bad, run.warned)
    assert len(run.outcomes) == run.processes


@pytest.mark.parametrize("n", [16, 64, 256])
def test_agreeing_processes_cost_a_few_small_entries_each(n):
    run = simulate(n, "agree")
    all_ok(run)
    assert run.entries <= 4 * n, run
    assert run.bytes <= 100 * n, run  # markers and counts, no descriptions
    assert run.round_trips <= 8 * n, run


def test_one_process_two_seconds_late_at_256():
    """The bar: at most 8N entries and 1 MB served per miss in all."""
    n = 256
    run = simulate(n, "late", late_s=2.0)
    all_ok(run)
    assert run.seconds >= 2.0
    assert run.entries <= 8 * n, run
    assert run.bytes <= 1 * MB, run
    # polls of 20 ms growing to 0.5 s: each waiting process makes a bounded number of
    # round trips per poll (no directory read per poll)
    assert run.round_trips <= 30 * n, run


def test_load_grows_linearly():
    small, large = simulate(32, "late", late_s=0.5), simulate(256, "late", late_s=0.5)
    all_ok(small)
    all_ok(large)
    per_process = small.entries / 32, large.entries / 256
    assert per_process[1] <= 1.5 * per_process[0] + 1, per_process
    assert large.bytes / 256 <= 2 * small.bytes / 32 + 100, (small.bytes, large.bytes)


@pytest.mark.parametrize("n", [2, 64, 256])
def test_one_process_with_another_shape_fails_every_process_early(n):
    odd = n // 2
    run = simulate(n, "shape", timeout_s=30.0)
    assert run.seconds < 15  # each side waits on the other: no need for the timeout
    assert set(run.outcomes.values()) == {"AgreementError"}, run.outcomes
    path = "args[0]['layer0']"
    expected = {q: "float32[2048,1024]" if q == odd else "float32[4096,1024]" for q in range(n)}
    for rank, error in run.errors.items():
        assert isinstance(error, _exchange.AgreementError)
        # a thread that had not published when a leader decided is named so in the
        # decision; it learns the decision at its next poll and names its own value
        assert error.path == path and error.values[rank] == expected[rank]
        assert error.values[odd] == expected[odd]  # the decision turned on it
        assert all(v in (expected[q], "(not called yet)") for q, v in error.values.items())
        assert set(error.values.values()) - {"(not called yet)"} == set(expected.values())
        assert "another process waits on a signature of its own" in str(error)
        assert f"process {odd}: float32[2048,1024]" in str(error)
        assert f"process {odd}: train.py:89" in str(error)
    assert run.entries <= 8 * n, run
    assert run.bytes <= 1 * MB, run


@pytest.mark.parametrize("n", [2, 64])
def test_one_process_that_never_calls_fails_every_other(n):
    run = simulate(n, "never", timeout_s=0.5)
    assert set(run.outcomes.values()) == {"AgreementError"} and len(run.outcomes) == n - 1
    odd = n // 2
    for error in run.errors.values():
        assert error.path == "call" and error.values[odd] == "not called"
        assert f"process {odd} did not call step" in str(error)
    assert run.warned == 0
    assert 0.5 <= run.seconds < 10
    assert run.entries <= 8 * n, run


def test_the_table_prints(capsys):
    from nbjit.multiprocess.simulate import main

    main(["--processes", "4", "16", "--late", "0.1"])
    out = capsys.readouterr().out
    assert "| processes | entries served | MB served |" in out
    assert "\n| 16 | " in out
