"""Where host inputs are put, per platform: the one place that chooses, for a
device's platform ("cpu", "tpu", "gpu", ...), the strategy its host inputs
take.

The core's own path needs no strategy and works on every platform: a host
value bound for one device is a `HostInput` step (one `batched_device_put`
per leaf, the numpy array copied while the call runs, a memo for small
repeated values), a big or multi-device one a `ShardingPlan`, anything else
JAX's `shard_args` (`nbjit.core.inputs.steps`). That is `DEFAULT`.

A strategy (`InputStrategy`) changes four things, and nothing else:

  * `host_transfer(aval, sharding)`: how a `HostInput` step hands a numpy
    array to a put, as a `HostTransfer`: jaxlib's host buffer semantics
    and, optionally, `stage`, which makes the private copy the put reads
    instead of the caller's array (so that a transfer that reads after the
    call returns never sees a later write). Asked once per step, when a
    record is built; the generated preparer inlines it.
  * `launches`: whether a record whose host leaves go to its executable's
    one device hands them to jaxlib's own put (a launch record,
    `nbjit.core.inputs.launch`) instead of putting each from Python.
  * `plans_big_leaves`: whether a one-device numpy leaf of
    `SINGLE_DEVICE_PLAN_MIN_BYTES` or more goes through a `ShardingPlan`
    (the CPU's way) rather than `host_transfer`.
  * `on_miss(outcome)`: after a miss installed a node with a record, an
    optimisation may arm itself for that node (it must not raise).

`STAGED` is the core's own way for a device with memory of its own (an
accelerator): there a put that copies while the call runs waits for the
transfer, a put of the caller's array (what jax.jit does) reads it after
the call returns, so a write right after the call can change the result,
and a put from Python costs more than jaxlib's own. A `Staged` transfer
copies the array into a private buffer of the step's `StagingRing`, and
its records launch: jaxlib's own put reads that copy, zero copy, the call
returning while the transfer runs, and nothing the caller writes
afterwards is read. An array no one can write is put in place
(`staging.immutable`), and one of `Staged.DIRECT_MIN_BYTES` or more, at
any size, is read during the call by nbjit's own put (`DIRECT`), with no
copy of ours.

The table, `strategy_for(platform)`:

  * "cpu": the host-memory strategy of `nbjit.host` (the host-input policy:
    resident slots), plugged in when ``import nbjit`` imports that room
    (`plug_in`); the CPU's device memory is host memory, which the device
    can read in place. Without it, `DEFAULT`.
  * every other platform: `STAGED`, which launches (launch records); no
    room plugs in anything there.

A record's host inputs take the strategy of their sharding's platform
(`platform_of`); a miss's `on_miss` is that of its executable's first input.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pkgutil
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from nbjit import _jax
from nbjit.core.hooks import MissOutcome
from nbjit.core.inputs import stream as _stream
from nbjit.core.inputs.staging import StagingRing

__all__ = ["DEFAULT", "DIRECT", "STAGED", "HostTransfer", "InputStrategy", "Staged",
           "accelerator_expected", "after_miss", "at_import", "before_miss", "platform_of",
           "plug_in", "strategy_for"]


@dataclasses.dataclass(frozen=True, slots=True)
class HostTransfer:
    """How a `HostInput` step puts a numpy array: ``batched_device_put(aval,
    sharding, [stage(x) or x], devices, False, False, semantics)``.

    `semantics`: jaxlib's `HostBufferSemantics` for the put; `stage`, when
    not None, returns what the put reads in place of the caller's array `x`
    (a private copy, say into a pooled staging buffer).
    """

    semantics: Any = _jax.COPY_DURING_CALL
    stage: Callable[[np.ndarray], Any] | None = None
    # A private copy of a host scalar (one that converts exactly), for a
    # launch record's jaxlib put; None: the scalar goes as it is.
    stage_scalar: Callable[[Any], Any] | None = None


DIRECT = HostTransfer()
"""The caller's array itself, copied by jaxlib while the call runs (never aliased)."""


class InputStrategy:
    """How host inputs reach one platform's devices; the defaults are the
    core's own path. Subclass it and override what the platform does otherwise."""

    name = "default"
    # Whether a record whose host leaves go to its executable's one device
    # hands them to jaxlib's own put (`nbjit.core.inputs.launch`) instead of
    # putting each from Python.
    launches = False
    # Whether a numpy leaf of `SINGLE_DEVICE_PLAN_MIN_BYTES` or more bound for
    # one device goes through a `ShardingPlan` (a parallel copy into aligned
    # staging, then the put) rather than this strategy's `host_transfer`.
    plans_big_leaves = True

    def host_transfer(self, aval: Any, sharding: Any) -> HostTransfer:
        """How a `HostInput` step bound for `sharding` puts a numpy array of `aval`."""
        return DIRECT

    def on_miss(self, outcome: MissOutcome) -> None:
        """After a miss installed `outcome.node` with `outcome.record`. Must not raise."""

    def __repr__(self) -> str:
        return f"<input strategy {self.name!r}>"


DEFAULT = InputStrategy()


class Staged(InputStrategy):
    """A device with memory of its own: each numpy array is copied into a
    private staging buffer (its step's own `StagingRing`) and put zero copy
    (see the module's docstring)."""

    name = "staged"
    launches = True
    # A big leaf is read during the call (`DIRECT`), never first copied by a
    # plan: there the plan's copy came on top of the runtime's own read
    # (docs/host-inputs.md, "Accelerators").
    plans_big_leaves = False
    # Buffers a step's ring keeps: every call still in flight holds one (the
    # runtime lets go of it when its computation is done), and a loop that does
    # not block runs many calls ahead. With none free a call allocates a new
    # buffer, whose first writes fault its pages in; so a ring keeps up to
    # RING_CAP of them, RING_BYTES in all, at least RING_MIN.
    RING_MIN = 8
    RING_CAP = 64
    RING_BYTES = 128 << 20
    # From this size a leaf is not copied by us: its put reads the caller's
    # array during the call (`DIRECT`), which there waits for the transfer.
    # For such a leaf that wait costs less than a private copy and the
    # runtime's own read of it, and no ring of copies that size is kept
    # (docs/host-inputs.md, "Accelerators").
    DIRECT_MIN_BYTES = 8 << 20

    def host_transfer(self, aval: Any, sharding: Any) -> HostTransfer:
        dtype = np.dtype(aval.dtype)
        nbytes = int(np.prod(aval.shape, dtype=np.int64)) * dtype.itemsize
        if nbytes >= self.DIRECT_MIN_BYTES:
            return DIRECT
        cap = max(self.RING_MIN, min(self.RING_CAP, self.RING_BYTES // max(nbytes, 1)))
        ring = StagingRing(tuple(aval.shape), dtype, cap)
        scalar = ring.stage_scalar if not aval.shape else None
        return HostTransfer(_jax.ZERO_COPY, ring.stage, scalar)


STAGED = Staged()

# platform -> the strategy plugged in for it (see the module's docstring)
_plugged: dict[str, InputStrategy] = {}


def plug_in(platform: str, strategy: InputStrategy | None) -> None:
    """Makes `strategy` the one of `platform`'s devices, for records built from
    now on (None: `DEFAULT` again)."""
    if strategy is None:
        _plugged.pop(platform, None)
    else:
        _plugged[platform] = strategy


def strategy_for(platform: str) -> InputStrategy:
    """The strategy of `platform`'s devices: the one plugged in, else `DEFAULT`
    on the CPU and `STAGED` on any other."""
    strategy = _plugged.get(platform)
    if strategy is None:
        return DEFAULT if platform == "cpu" else STAGED
    return strategy


def platform_of(sharding: Any) -> str:
    """The platform of `sharding`'s devices (one executable's are all of one)."""
    return next(iter(sharding.device_set)).platform


def before_miss() -> None:
    """Called as a miss begins, before JAX traces and compiles (its compile
    leaves the GIL free): where the default device's strategy launches, the
    streamed copy's compile starts now, on its own thread (once per process),
    whatever the miss's leaves: ready before the first hit that copies a
    leaf of `STREAM_MIN_BYTES`, instead of sharing the GIL with it."""
    if not _stream.started() and strategy_for(_jax.default_platform()).launches:
        _stream.start()


def at_import() -> None:
    """Called as ``import nbjit`` ends: where JAX's default backend will likely
    be an accelerator's (`accelerator_expected`, which initializes no
    backend), the streamed copy's compile starts now, on its own thread, while
    the program still imports, builds and compiles, rather than beside the
    first hits of a signature whose program JAX had compiled before (jax.jit's
    own run, in the same process)."""
    if not _stream.started() and accelerator_expected():
        _stream.start()


def accelerator_expected() -> bool:
    """Whether JAX's default backend is, or will likely be, an accelerator's,
    judged without initializing a backend: the default platform where the
    backends are up; else False where `jax_platforms` names only the CPU;
    else whether a TPU or GPU plugin sits where JAX looks for one
    (`TPU_LIBRARY_PATH` or the `libtpu` module, a module under the
    `jax_plugins` namespace, `PJRT_NAMES_AND_LIBRARY_PATHS`). Plugins known
    only by an entry point are not looked for (that reads every installed
    distribution's metadata): a guess, whose misses cost only time."""
    if _jax.backends_initialized():
        return _jax.default_platform() != "cpu"
    platforms = jax.config.jax_platforms
    if platforms:
        return any(name.strip() not in ("", "cpu") for name in platforms.split(","))
    if os.environ.get("TPU_LIBRARY_PATH") or os.environ.get("PJRT_NAMES_AND_LIBRARY_PATHS"):
        return True
    if importlib.util.find_spec("libtpu") is not None:
        return True
    namespace = importlib.util.find_spec("jax_plugins")
    return namespace is not None and any(
        pkgutil.iter_modules(namespace.submodule_search_locations or ()))


def after_miss(outcome: MissOutcome) -> None:
    """Tells the strategy of the executable's platform about a miss that
    installed a node with a record (`InputStrategy.on_miss`)."""
    if outcome.node is None or outcome.record is None:
        return
    in_shardings = outcome.fastpath.in_shardings
    if len(in_shardings):  # no inputs: nothing to put
        strategy_for(platform_of(in_shardings[0])).on_miss(outcome)
