"""The CPU's host-memory strategy: fresh host values without a transfer per leaf.

On the CPU a device's memory is host memory: a device array can alias a
host buffer, so a signature that keeps bringing new host values can have
them written where the executable reads them instead of put leaf by leaf.
`policy` (one `HostPolicy` per watched signature, the only code that asks
the cache to replace a node's record) arms that after a miss, `resident`
makes the slots, `packing` (one put and a second executable) is the way
where slots cannot be, `layout` is what those two share.

It is an optimisation, plugged into the core's per-platform choice of an
input strategy (`nbjit.core.inputs.platforms`) for the "cpu" platform when
this room is imported; the core's own path works without it.
"""

from nbjit.core.hooks import MissOutcome
from nbjit.core.inputs import platforms as _platforms
from nbjit.host import policy as _policy

__all__ = ["HOST_MEMORY", "HostMemory"]


class HostMemory(_platforms.InputStrategy):
    """The CPU's strategy: host inputs put as the core does, and after a miss
    the host-input policy may make the node's fresh host inputs resident
    (or packed) later."""

    name = "cpu host memory"

    def on_miss(self, outcome: MissOutcome) -> None:
        _policy.on_miss(outcome.jitted, outcome.node, outcome.record, outcome.fastpath,
                        outcome.leaves, outcome.args, outcome.kwargs)  # never raises


HOST_MEMORY = HostMemory()
_platforms.plug_in("cpu", HOST_MEMORY)
