"""Host-memory strategies: fresh host values without a transfer per leaf.

On the CPU a device's memory is host memory: a device array can alias a
host buffer, so a signature that keeps bringing new host values can have
them written where the executable reads them instead of put leaf by leaf.
`watch` arms a `policy` after a miss (one `HostPolicy` per watched
signature, the only code that asks the cache to replace a node's record);
`resident` makes a record write into slots (`slots`, `resident_prepare`,
`waker`), `packing` (one put and a second executable, its buffers pooled
by `staging`) is the way where slots cannot be, `layout` is what those two
share.

On a device with memory of its own (an accelerator) host arrays are staged
(the core's `Staged` transfer: a private copy, put zero copy); there the
policy packs a signature's changing host leaves into one staged buffer, one
put per call (`HostStaged`, plugged in for "tpu" and "gpu";
``NBJIT_PACK_ACCELERATOR=0`` in the environment, read at import, leaves
them staged leaf by leaf). The packed program is other HLO than the
original's: each unpacked leaf is constrained to the layout the original
executable compiled its parameter to, behind an optimization barrier, so
that XLA reads it as the original reads its parameter (on a TPU, without
the layout a packed reduction came out one ulp away from jax.jit's).

Both are optimisations, plugged into the core's per-platform choice of an
input strategy (`nbjit.core.inputs.platforms`) when this room is imported;
the core's own path works without them.
"""

import os

from nbjit.core.hooks import MissOutcome
from nbjit.core.inputs import platforms as _platforms
from nbjit.host import watch as _watch

__all__ = ["HOST_MEMORY", "HOST_STAGED", "HostMemory", "HostStaged"]


class HostMemory(_platforms.InputStrategy):
    """The CPU's strategy: host inputs put as the core does, and after a miss
    the host-input policy may make the node's fresh host inputs resident
    (or packed) later."""

    name = "cpu host memory"

    def on_miss(self, outcome: MissOutcome) -> None:
        _watch.on_miss(outcome)  # never raises


class HostStaged(_platforms.Staged):
    """An accelerator's strategy: host arrays staged as the core does, and
    after a miss the host-input policy may pack the node's changing host
    leaves into one staged put (no slots: device memory is not host memory)."""

    name = "staged host memory"
    on_miss = HostMemory.on_miss  # (the same watch; where host arrays are staged, it packs only)


HOST_MEMORY = HostMemory()
HOST_STAGED = HostStaged()
_platforms.plug_in("cpu", HOST_MEMORY)
if os.environ.get("NBJIT_PACK_ACCELERATOR", "1").strip().lower() not in ("0", "false", "no", "off"):
    for _platform in ("tpu", "gpu"):
        _platforms.plug_in(_platform, HOST_STAGED)
