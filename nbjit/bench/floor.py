"""The floor of a call: its executable run from Python, with no dispatcher in front.

`floor_call` reads the cache entry nbjit made for the call and returns a
zero-argument callable that does only `execute_sharded` +
`consume_with_handlers` on inputs prepared once: what no Python dispatcher
can beat, reported beside every ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbjit import _jax
from nbjit.core.dispatch import PjitFunction
from nbjit.core.view import info


def floor_call(jitted: PjitFunction, /, *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """A zero-argument callable running only the executable for this call.

    It does `execute_sharded` + `consume_with_handlers` on inputs prepared
    once: the floor that no Python dispatcher can beat. Raises ValueError if
    the call's signature has no fast path.
    """
    _jax.block_until_ready(jitted(*args, **kwargs))
    keyed = jitted.key_of(args, kwargs)  # the node the call hits: its key, looked up
    node, leaves = None, []
    if keyed is not None:
        leaves, key, shardings = keyed
        node = info(jitted).namespace.find(key, shardings, _jax.trace_context())
    if node is None or node.record is None:
        raise ValueError("this call has no fast-path entry (it takes JAX's own path)")
    record = node.record
    inputs = record.inputs(leaves)
    executable, handlers = record.executable, record.out_handlers
    # One execute as the hit path makes it: a record's execute may hand back
    # the results of a run its prepare made (a resident record that ran before
    # its compare). The slot those inputs hold stays the floor's (no fence).
    _jax.block_until_ready(record.execute(inputs).consume_with_handlers(handlers))

    def run() -> Any:
        return executable.execute_sharded(inputs).consume_with_handlers(handlers)

    return run
