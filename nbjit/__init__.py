"""nbjit: a drop-in `jax.jit` whose per-call dispatch is Python + Numba.

    import nbjit

    @nbjit.jit
    def f(x, y):
        return x * y + 1

Tracing, lowering and compiling are JAX's own; nbjit owns the cache-hit path.
"""

# _jax checks the jax version at import; host, multiprocess and observe each
# register into the core (nbjit.core.hooks) when imported.
from nbjit import _jax, host, multiprocess, observe  # noqa: F401
from nbjit.core.binders import binder_source
from nbjit.core.dispatch import PjitFunction, PjitFunctionCache, jit
from nbjit.filter import filter_jit
from nbjit.host.plan import device_put
from nbjit.multiprocess.agreement import AgreementError, AgreementWarning
from nbjit.observe.explain import RankedMisses, assert_max_misses, explain_misses, ranked_misses
from nbjit.observe.profile import Profile, profile
from nbjit.observe.stats import DispatchStats, stats
from nbjit.routing.patch import patch_jax, patched_jax, unpatch_jax

__all__ = [
    "AgreementError", "AgreementWarning", "CompareResult", "DispatchStats", "PjitFunction",
    "PjitFunctionCache", "Profile", "RankedMisses", "assert_max_misses", "binder_source",
    "compare", "device_put", "explain_misses", "filter_jit", "jit", "patch_jax", "patched_jax",
    "profile", "ranked_misses", "stats", "unpatch_jax",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # `compare` and `CompareResult` live in the benchmark lab (nbjit.bench),
    # imported on first use so that `import nbjit` does not load it.
    if name in ("compare", "CompareResult"):
        from nbjit.bench import user

        value = getattr(user, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'nbjit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
