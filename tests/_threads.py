"""One helper for tests that call jitted functions from several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

JOIN_TIMEOUT = 120.0  # seconds; generous (shared 2-core machine), only bounds a deadlock


def run_threads(target: Callable[[int], object], n: int) -> list[BaseException]:
    """Runs `target(i)` in `n` threads started together; returns their errors
    (an assertion that fails in a thread is one of them)."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=JOIN_TIMEOUT)
            target(i)
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {JOIN_TIMEOUT}s (deadlock?): {stuck}"
    return errors
