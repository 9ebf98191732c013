"""Which signatures the host-input policy watches: after a miss, their host leaves laid out.

`on_miss` (called by the CPU's input strategy, `nbjit.host.HostMemory`,
after each miss) arms a `nbjit.host.policy.HostPolicy` for a freshly linked
node whose record has a host leaf that qualifies (a dtype in `PACKABLE`;
`RESIDENT_MAX_BYTES` together), all inputs and outputs on one CPU device, no
donation, no explicit in/out shardings. Never: donation, effects (no fast
path at all), debug_nans/infs (those calls never reach a record), more than
one device, explicit layouts (no record either).
"""

from __future__ import annotations

from typing import Any

from nbjit import _jax
from nbjit._common import align_up
from nbjit.core.hooks import MissOutcome
from nbjit.core.inputs.fallbacks import gave_up
from nbjit.core.inputs.steps import HostInput
from nbjit.core.record import FastPath
from nbjit.core.view import JitInfo, info
from nbjit.host import policy as _policy
from nbjit.host.layout import PACKABLE, RESIDENT_SLOTS, LeafLayout, Watched, python_type

__all__ = ["COUNTED_MAX_BYTES", "COUNTED_MAX_EACH", "RESIDENT_MAX_BYTES", "on_miss"]

# The small leaves whose bytes the counting record compares call to call, to
# tell new values from the same ones (leaves too big for a memo): at most this
# much each, and together.
COUNTED_MAX_EACH = 64 << 10
COUNTED_MAX_BYTES = 256 << 10
# All resident leaves of a signature together (one slot's staging): any host
# leaf bound for one device fits while the signature's total stays within.
RESIDENT_MAX_BYTES = 16 << 20


def on_miss(outcome: MissOutcome) -> None:
    """After a miss linked `outcome.node` with `outcome.record`: arms a
    `HostPolicy` if the signature qualifies (see the module's docstring).
    Never raises: a failure keeps the miss's record, and says why."""
    jitted = None
    try:
        jitted = info(outcome.jitted)
        _arm(jitted, outcome.node, outcome.record, outcome.fastpath, outcome.leaves)
    except Exception as error:  # never breaks a miss: the per-leaf puts go on
        gave_up(RESIDENT_SLOTS, error, None if jitted is None else jitted.counters)


def _arm(jitted: JitInfo, node: Any, record: FastPath, fastpath: Any, leaves: list) -> None:
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
    # Slots need a device whose zero-copy put aliases host memory: the CPU's.
    if not all(d.platform == "cpu" for d in sharding.device_set):
        return
    resident_layouts = _layouts(hosts, leaves, RESIDENT_MAX_BYTES, RESIDENT_MAX_BYTES)
    if not resident_layouts:
        return
    counted = _layouts(hosts, leaves, COUNTED_MAX_EACH, COUNTED_MAX_BYTES)
    watched = Watched(fastpath, tuple(counted), len(leaves), sharding, jitted.counters,
                      tuple(resident_layouts))
    laid_out = {s.leaf for s in resident_layouts}
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
