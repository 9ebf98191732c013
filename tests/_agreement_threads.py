"""Processes played by threads over an in-memory store (tests/test_agreement*.py).

`Process(store, rank, n).call(sig)` runs one process's side of the exchange
(`nbjit.multiprocess.exchange.agree`) for the function `INFO`, in this
thread or (`call_in_thread`) another; `both` runs two at once.
`agreement_timeout` is the body of the test modules' `timeout` fixture.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable, Iterator

from nbjit.multiprocess import agreement as _agreement
from nbjit.multiprocess import exchange as _exchange
from nbjit.multiprocess.simulate import CountingStore


class FakeStore(CountingStore):
    """jax.distributed's client in memory (the simulation's), with a call count."""

    @property
    def calls(self) -> int:
        return self.round_trips

    @property
    def data(self) -> dict[str, str]:
        return self._data


INFO = _exchange.FunctionInfo("f (model.py:3)", "00000000000000f1", True, "{}")


def signature(shape: str, extra: tuple = ()) -> _agreement.Signature:
    entries = [("jit options", "{}"), ("args[0]", f"float32[{shape}]"), *extra]
    from nbjit import _kernels

    return _agreement.Signature(_kernels.stable_text_hash(json.dumps(entries)), entries)


class Process:
    """One pretend process: its rank and what it published."""

    def __init__(self, store: FakeStore, rank: int, n: int = 2) -> None:
        self.store, self.rank, self.n = store, rank, n
        self.state = _exchange.ProcessState()

    def call(self, sig: _agreement.Signature) -> None:
        _exchange.agree(self.store, INFO, sig, f"model.py:{10 + self.rank}", self.rank,
                        self.n, self.state)

    def call_in_thread(self, sig: _agreement.Signature) -> dict:
        outcome: dict = {}

        def run() -> None:
            start = time.perf_counter()
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    self.call(sig)
                outcome["warnings"] = [w for w in caught
                                       if issubclass(w.category, _agreement.AgreementWarning)]
            except Exception as error:  # noqa: BLE001 (the test inspects it)
                outcome["error"] = error
            outcome["seconds"] = time.perf_counter() - start

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        outcome["thread"] = thread
        return outcome


def agreement_timeout() -> Iterator[Callable[[float], None]]:
    """The body of the test modules' `timeout` fixture: yields a setter of the
    agreement timeout, and restores the configuration after the test."""
    def set_timeout(seconds: float) -> None:
        _agreement.configure(timeout_s=seconds)

    old = _agreement.configure()
    yield set_timeout
    _agreement.configure(**old)


def both(p0: Process, p1: Process, s0, s1) -> tuple[dict, dict]:
    a, b = p0.call_in_thread(s0), p1.call_in_thread(s1)
    for o in (a, b):
        o["thread"].join(60)
        assert not o["thread"].is_alive()
    return a, b
