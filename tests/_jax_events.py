"""Counting JAX's test events (what jax's test_util counters read), without absl.

`jax._src.util.test_event(name)` fires at, e.g., "jit_cpp_cache_miss" (every
call that runs JAX's own jit path: a compile or a retrieval from JAX's caches)
and "trace_to_jaxpr" (every trace). A JAX internal, used by tests only.
"""

import collections
import contextlib

from jax._src import util as _jax_util


@contextlib.contextmanager
def count_events():
    """Yields a Counter of event names fired inside the block (chains any listener)."""
    counts = collections.Counter()
    previous = _jax_util.test_event_listener

    def listener(name, *args):
        counts[name] += 1
        if previous is not None:
            previous(name, *args)

    _jax_util.test_event_listener = listener
    try:
        yield counts
    finally:
        _jax_util.test_event_listener = previous
