"""Host-memory strategies: fresh host values without a transfer per leaf.

On the CPU a device's memory is host memory: a device array can alias a
host buffer, so a signature that keeps bringing new host values can have
them written where the executable reads them instead of put leaf by leaf.
`watch` arms a `policy` after a miss (one `HostPolicy` per watched
signature, the only code that asks the cache to replace a node's record);
`resident` makes a record write into slots (`slots`, `resident_prepare`,
`waker`; `layout`: where each leaf lies in a slot). The program that runs
is always the signature's own executable, jax.jit's.

A device with memory of its own (an accelerator) needs nothing from this
room: there the core hands host leaves to jaxlib's own put
(`nbjit.core.inputs.launch`). This room's strategy plugs into the core's
per-platform choice (`nbjit.core.inputs.platforms`) for "cpu" when it is
imported; the core's own path works without it.
"""

from nbjit.core.hooks import MissOutcome
from nbjit.core.inputs import platforms as _platforms
from nbjit.host import watch as _watch

__all__ = ["HOST_MEMORY", "HostMemory"]


class HostMemory(_platforms.InputStrategy):
    """The CPU's strategy: host inputs put as the core does, and after a miss
    the host-input policy may make the node's fresh host inputs resident
    later."""

    name = "cpu host memory"

    def on_miss(self, outcome: MissOutcome) -> None:
        _watch.on_miss(outcome)  # never raises


HOST_MEMORY = HostMemory()
_platforms.plug_in("cpu", HOST_MEMORY)
