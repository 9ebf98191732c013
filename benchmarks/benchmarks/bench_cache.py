"""Caching behaviour: memory as the cache grows, and how many compiles calls cost.

The compile and trace counts come from ``jax.monitoring`` events, which both
implementations emit (nbjit compiles through JAX's own path), so the two
``impl`` lines of a track must agree: a difference is a caching bug.
"""

import numpy as np

from . import common
from .common import IMPLS

_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_counts = {_TRACE_EVENT: 0, _COMPILE_EVENT: 0}
_listening = False


def _count_event(event, duration, **kwargs):
    if event in _counts:
        _counts[event] += 1


def _listen():
    global _listening
    if not _listening:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_count_event)
        _listening = True


class CacheGrowth:
    """One function called with many signatures: peak memory and cache size."""

    params = [[64], IMPLS]
    param_names = ["signatures", "impl"]
    timeout = 300

    def setup(self, signatures, impl):
        import jax

        self.jit = common.get_jit(impl)
        self.inputs = [jax.device_put(np.ones(n + 1, np.float32)) for n in range(signatures)]

    def _fill(self):
        f = self.jit(common.plus_one)
        for x in self.inputs:
            f(x)
        common.block(f(self.inputs[-1]))
        return f

    def peakmem_fill_cache(self, signatures, impl):
        self._fill()

    def track_cache_size(self, signatures, impl):
        f = self._fill()
        size = getattr(f, "_cache_size", None)
        if size is None:
            raise NotImplementedError("no _cache_size()")
        return size()

    track_cache_size.unit = "entries"


class CompileCounts:
    """Traces and compiles for a sequence of calls that should mostly hit the cache.

    The sequence: the same array 3 times; numpy input of the same aval;
    Python int then float scalars (weak types: one signature each); a new
    shape; a new dtype; a static argument changed and changed back.
    """

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        _listen()
        self.jit = common.get_jit(impl)

    def _run(self):
        import jax
        import jax.numpy as jnp

        def scale(x, k):
            return x * k

        x = jnp.ones(8, jnp.float32)
        x16, x_int = jnp.ones(16, jnp.float32), jnp.ones(8, jnp.int32)
        calls = [
            (x, 2), (x, 2), (x, 2),
            (np.ones(8, np.float32), 2),
            (1, 2), (2, 2), (1.5, 2),
            (x16, 2),
            (x_int, 2),
            (x, 3), (x, 2),
        ]
        jax.block_until_ready(calls)
        f = self.jit(scale, static_argnums=(1,))
        before = dict(_counts)
        for args in calls:
            out = f(*args)
        jax.block_until_ready(out)
        return {k: _counts[k] - before[k] for k in _counts}

    def track_traces(self, impl):
        return self._run()[_TRACE_EVENT]

    track_traces.unit = "traces"

    def track_compiles(self, impl):
        return self._run()[_COMPILE_EVENT]

    track_compiles.unit = "compiles"
