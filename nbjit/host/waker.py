"""The waker: a trivial computation that wakes a device's runtime worker.

A resident prepare that writes a few KiB to a MiB while the runtime's
worker thread is idle dispatches it first (`nbjit.host.resident_prepare`), so
the worker wakes while the values are written. It is compiled once per
device and kept by the process; where it cannot be, calls do not wake the
worker, and the process's fallbacks say why (`nbjit.core.inputs.fallbacks`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit.core.inputs.fallbacks import gave_up

__all__ = ["nbjit_wake_worker", "waker"]

_WAKE_LEAVES = 2048  # float32s summed: enough work that the runtime does not run it inline
_wakers: dict[Any, Callable[[], Any] | None] = {}  # device -> its waker (None: none)


def nbjit_wake_worker(v: Any) -> Any:  # (so named in compile logs)
    return v.sum()


def waker(device: Any) -> Callable[[], Any] | None:
    """A call dispatching a trivial computation on `device`, made once per
    device (None where it cannot be compiled, or the runtime has no worker
    thread to wake: no wake)."""
    try:
        return _wakers[device]
    except KeyError:
        pass
    if not _jax.cpu_async_dispatch():  # (no worker thread to wake)
        return _wakers.setdefault(device, None)
    wake = None
    try:
        ones = np.ones(_WAKE_LEAVES, np.float32)
        v = _jax.batched_device_put(_jax.ShapedArray(ones.shape, ones.dtype),
                                    _jax.SingleDeviceSharding(device), [ones], [device],
                                    True, True, _jax.COPY_DURING_CALL)
        execute = _jax.compiled_execute(_jax.jax_jit(nbjit_wake_worker).lower(v).compile())
        arguments = [v]
        execute(arguments)
        wake = functools.partial(execute, arguments)
    except Exception as error:  # calls just do not wake the worker first, and say why
        gave_up("worker wake", error)
        wake = None
    return _wakers.setdefault(device, wake)
