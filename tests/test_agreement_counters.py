"""The agreement exchange's counters (nbjit/multiprocess/exchange.py): every
write takes their lock, and `counters()` hands out a copy."""

from __future__ import annotations

import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit import _jax
from nbjit.multiprocess import agreement as _agreement
from nbjit.multiprocess import exchange as _exchange


def test_counts_added_from_many_threads_are_all_kept():
    """`add_counts` adds under the counters' lock, as the exchange's own writes
    do. Without it, a thread switched out between reading a field and writing
    it back loses what the others added meanwhile: with the switch interval
    made tiny, this test fails when the lock is taken out."""
    threads, adds = 8, 20_000
    before = _exchange.counters()
    start = threading.Barrier(threads)

    def add() -> None:
        start.wait()
        for _ in range(adds):
            _exchange.add_counts(round_trips=1, checks=2)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter checks
    try:
        workers = [threading.Thread(target=add) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
    after = _exchange.counters()
    assert after.round_trips - before.round_trips == threads * adds
    assert after.checks - before.checks == 2 * threads * adds


def test_counters_are_a_copy():
    """A caller's snapshot neither changes with later counts nor changes them."""
    snapshot = _agreement.counters()
    assert snapshot is not _agreement.counters()
    errors = snapshot.errors
    _exchange.add_counts(errors=1)
    assert snapshot.errors == errors
    assert _agreement.counters().errors == errors + 1
    snapshot.errors = -5
    assert _agreement.counters().errors == errors + 1


def test_a_miss_counts_its_description_and_a_failed_store_as_a_warning(monkeypatch):
    """Through the miss path: the time spent describing the signature and the
    warning of a store that failed are counted (through `add_counts`)."""

    class FailingClient:
        """jax.distributed's client with every store call failing."""

        def __getattr__(self, name: str):
            def fail(*args, **kwargs):
                raise _jax.JaxRuntimeError("UNAVAILABLE: the store is down")
            return fail

    monkeypatch.setattr(_jax, "process_count", lambda: 2)
    monkeypatch.setattr(_jax, "process_index", lambda: 0)
    monkeypatch.setattr(_jax, "distributed_client", FailingClient)
    monkeypatch.setattr(_agreement, "_spans_processes", lambda jitted, leaves: True)
    before = _agreement.counters()
    f = nbjit.jit(lambda x: x + 1)
    with pytest.warns(_agreement.AgreementWarning, match="agreement of .* skipped"):
        out = f(jnp.arange(3.0))
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])
    after = _agreement.counters()
    assert after.warnings == before.warnings + 1
    assert after.describe_seconds > before.describe_seconds
    assert after.checks == before.checks + 1 and after.errors == before.errors
