"""Host inputs: numpy arrays and Python scalars onto devices.

Fresh host values without a transfer per leaf:
`policy` (one `HostPolicy` per watched signature, the only code that
asks the cache to replace a node's record), `resident` (slots), `packing` (one put and a
second executable), `layout` (what those two share).
"""

from nbjit.core import hooks as _hooks
from nbjit.host import policy as _policy


def _arm_host_inputs(outcome: _hooks.MissOutcome) -> None:
    """The host-input policy may make the node's fresh host inputs resident or
    packed later; never breaks a miss."""
    if outcome.node is None or outcome.record is None:
        return
    _policy.on_miss(outcome.jitted, outcome.node, outcome.record, outcome.fastpath,
                    outcome.leaves, outcome.args, outcome.kwargs)  # never raises


_hooks.add_miss_observer(_arm_host_inputs)
