"""nbjit: a drop-in `jax.jit` whose per-call dispatch is Python + Numba.

    import nbjit

    @nbjit.jit
    def f(x, y):
        return x * y + 1

Tracing, lowering and compiling are JAX's own; nbjit owns the cache-hit path.
"""

from nbjit import _jax  # noqa: F401  (checks the jax version at import)
from nbjit._binders import binder_source
from nbjit._compare import CompareResult, compare
from nbjit._explain import RankedMisses, assert_max_misses, explain_misses, ranked_misses
from nbjit._patch import patch_jax, patched_jax, unpatch_jax
from nbjit._profile import Profile, profile
from nbjit._stats import DispatchStats, stats
from nbjit.dispatch import PjitFunction, PjitFunctionCache, jit
from nbjit.sharding import device_put

__all__ = ["CompareResult", "DispatchStats", "PjitFunction", "PjitFunctionCache", "Profile",
           "RankedMisses", "assert_max_misses", "binder_source", "compare", "device_put",
           "explain_misses", "jit", "patch_jax", "patched_jax", "profile", "ranked_misses", "stats",
           "unpatch_jax"]
__version__ = "0.1.0"
