"""Which signatures the host-input policy watches: after a miss, their host leaves laid out.

`on_miss` (called by the input strategies of `nbjit.host` after each miss:
`HostMemory` on a CPU device, `HostStaged` on an accelerator) arms a
`nbjit.host.policy.HostPolicy` for a freshly linked node whose record has a
host leaf that qualifies (`SLOT_MAX_BYTES` each, `TOTAL_MAX_BYTES`
together; where host arrays are staged, an accelerator,
`STAGED_PACK_MAX_BYTES` in all and no slots; a dtype in `PACKABLE`), all
inputs and outputs on one device, no donation, no explicit in/out
shardings; packing needs two such leaves (one leaf would still cost one
put). Never: donation, effects (no fast path at all), debug_nans/infs
(those calls never reach a record), more than one device, explicit layouts
(no record either).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbjit import _jax
from nbjit._common import align_up
from nbjit.core.hooks import MissOutcome
from nbjit.core.inputs.platforms import Staged, platform_of, strategy_for
from nbjit.core.inputs.staging import immutable
from nbjit.core.inputs.steps import HostInput
from nbjit.core.record import FastPath
from nbjit.core.view import JitInfo, info
from nbjit.host import policy as _policy
from nbjit.host.layout import PACKABLE, LeafLayout, Watched, host_counters, python_type

__all__ = ["RESIDENT_MAX_BYTES", "SLOT_MAX_BYTES", "STAGED_PACK_MAX_BYTES", "STAGED_PACK_MAX_EACH",
           "TOTAL_MAX_BYTES",
           "on_miss"]

SLOT_MAX_BYTES = 64 << 10  # a bigger host leaf is not packed (its own put)
TOTAL_MAX_BYTES = 256 << 10  # all packed leaves of a signature together
# Where host arrays are staged (an accelerator: `nbjit.core.inputs.platforms.Staged`)
# each is copied into staging anyway: packing costs no copy more and saves a
# put per leaf, whatever the leaf's size, up to this in all.
STAGED_PACK_MAX_BYTES = 16 << 20
# A bigger leaf keeps its own put there, read during the call (not copied).
STAGED_PACK_MAX_EACH = Staged.DIRECT_MIN_BYTES - 1
# All resident leaves of a signature together (one slot's staging): any host
# leaf bound for one device fits while the signature's total stays within.
RESIDENT_MAX_BYTES = 16 << 20

# jit options the packed executable keeps (the rest describe f's own inputs/outputs)
_PACKED_OPTIONS = ("keep_unused", "device", "backend", "compiler_options")


def on_miss(outcome: MissOutcome) -> None:
    """After a miss linked `outcome.node` with `outcome.record`: arms a
    `HostPolicy` if the signature qualifies (see the module's docstring).
    Never raises."""
    try:
        _arm(info(outcome.jitted), outcome.node, outcome.record, outcome.fastpath,
             outcome.leaves, outcome.args, outcome.kwargs)
    except Exception:  # never breaks a miss: the node keeps the miss's record
        pass


def _arm(jitted: JitInfo, node: Any, record: FastPath, fastpath: Any, leaves: list,
         args: tuple, kwargs: dict) -> None:
    if not _policy.enabled() or jitted.donates or _jax.post_hook_state.value is not None:
        return
    if any(k in jitted.options for k in ("in_shardings", "out_shardings")):
        return
    hosts = record.host_inputs()  # leaf -> its HostInput step
    if not hosts:
        return
    first = next(iter(hosts.values()))
    sharding = first.sharding
    shardings = [*fastpath.in_shardings, *fastpath.out_shardings]
    if not all(type(s) is _jax.SingleDeviceSharding for s in shardings) or any(
            s.device_set != sharding.device_set for s in shardings):
        return
    staged = isinstance(strategy_for(platform_of(sharding)), Staged)  # (one device: one strategy)
    if staged:  # never packed there: an array no one can write (put in place, zero
        # copy), and a complex leaf (a TPU cannot constrain its layout: other bits)
        layouts = _layouts({j: h for j, h in hosts.items()
                            if not immutable(leaves[j]) and h.dtype.kind != "c"},
                           leaves, STAGED_PACK_MAX_EACH, STAGED_PACK_MAX_BYTES)
    else:
        layouts = _layouts(hosts, leaves, SLOT_MAX_BYTES, TOTAL_MAX_BYTES)
    # Slots (where a zero-copy put aliases host memory: the CPU) hold bigger
    # leaves too; where puts copy (a GPU) a big leaf keeps its put, which
    # is a copy to the device in any case.
    resident = (_policy.RESIDENT and not staged
                and all(d.platform == "cpu" for d in sharding.device_set))
    resident_layouts = (_layouts(hosts, leaves, RESIDENT_MAX_BYTES, RESIDENT_MAX_BYTES)
                        if resident else [])
    if not layouts and not resident_layouts:
        return
    jaxpr = None  # fewer than two leaves to pack: resident or nothing
    if len(layouts) >= 2:
        jaxpr = _traced_jaxpr(jitted, args, kwargs, layouts, len(leaves))
        if jaxpr is None:
            layouts = []  # (packing needs the jaxpr; slots do not)
            if not resident_layouts:
                return
    input_layouts: tuple = ()
    if staged and layouts:  # (raises where the runtime cannot say: then nothing is armed)
        compiled = _jax.parameter_layouts(fastpath.xla_executable)
        input_layouts = tuple(compiled[hosts[s.leaf].index] for s in layouts)  # its input
    options = {k: v for k, v in jitted.options.items() if k in _PACKED_OPTIONS}
    watched = Watched(fastpath, jaxpr, tuple(layouts), len(leaves), sharding, options,
                      jitted.name, host_counters(jitted.counters), tuple(resident_layouts),
                      input_layouts)
    laid_out = {s.leaf for s in (*layouts, *resident_layouts)}
    # A leaf too big for a memo puts a copy of itself on every call, a new
    # value or not: slots (a copy into host memory the device reads) cost less.
    eager = any(not hosts[s.leaf].memo for s in resident_layouts)
    policy = _policy.HostPolicy(node, watched, leaves, [j for j in hosts if j in laid_out], eager)
    node.host_policy = policy  # the policy lives as long as its node
    policy.install(record)


def _layouts(hosts: dict[int, HostInput], leaves: list, max_each: int,
             max_total: int) -> list[LeafLayout]:
    """The qualifying host leaves' layouts (at most `max_each` bytes each,
    `max_total` together), in leaf order, each at an aligned offset."""
    layouts, offset = [], 0
    for leaf, h in hosts.items():
        if h.dtype not in PACKABLE:
            continue
        layout = LeafLayout(leaf, offset, tuple(h.aval.shape), h.dtype, bool(h.aval.weak_type),
                            python_type(leaves[leaf]))
        if layout.nbytes > max_each or offset + layout.nbytes > max_total:
            continue
        layouts.append(layout)
        offset += align_up(layout.nbytes)
    return layouts


def _traced_jaxpr(jitted: JitInfo, args: tuple, kwargs: dict, layouts: list[LeafLayout],
                  n_leaves: int) -> Any:
    """The jaxpr JAX traced the signature to, if its inputs are the leaves as laid out."""
    try:
        jaxpr = _jax.traced_jaxpr(jitted.jax_jitted, args, kwargs)
    except Exception:
        return None
    in_avals = list(jaxpr.in_avals)
    if len(in_avals) != n_leaves:
        return None
    for s in layouts:
        a = in_avals[s.leaf]
        if (tuple(a.shape), np.dtype(a.dtype), bool(a.weak_type)) != (s.shape, s.dtype, s.weak):
            return None
    return jaxpr
