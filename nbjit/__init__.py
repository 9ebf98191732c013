"""nbjit: a drop-in `jax.jit` whose per-call dispatch is Python + Numba.

    import nbjit

    @nbjit.jit
    def f(x, y):
        return x * y + 1

Tracing, lowering and compiling are JAX's own; nbjit owns the cache-hit path.
"""

import importlib
import sys
import threading

from nbjit.routing import run as _run  # imports no jax

# `python -m nbjit run` imports this package before the script runs, which must
# import jax itself (nbjit/routing/run.py): the names below are then loaded on
# first use (`__getattr__`), else right here.
_deferred = _run.launching() and "_deferred" not in globals()  # (not on reload)
if not _deferred:
    # _jax checks the jax version at import; host, multiprocess and observe each
    # register into the core (nbjit.core.hooks, flavours, profiler, live, inputs.platforms)
    # when imported.
    from nbjit import _jax, host, multiprocess, observe  # noqa: F401
    from nbjit.core.binders import binder_source
    from nbjit.core.dispatch import PjitFunction, PjitFunctionCache, jit
    from nbjit.core.inputs import platforms as _platforms
    from nbjit.core.inputs.plans import device_put
    from nbjit.filter import filter_jit
    from nbjit.multiprocess.agreement import AgreementError, AgreementWarning
    from nbjit.observe.explain import (
        RankedMisses,
        assert_max_misses,
        explain_misses,
        ranked_misses,
        reset_ranked_misses,
    )
    from nbjit.observe.profile import Profile, profile
    from nbjit.observe.stats import DispatchStats, stats
    from nbjit.routing.patch import patch_jax, patched_jax, unpatch_jax

    _platforms.at_import()  # on an accelerator, the streamed copy's compile begins

__all__ = [
    "AgreementError", "AgreementWarning", "CompareResult", "DispatchStats", "PjitFunction",
    "PjitFunctionCache", "Profile", "RankedMisses", "assert_max_misses", "binder_source",
    "compare", "device_put", "explain_misses", "filter_jit", "jit", "patch_jax", "patched_jax",
    "profile", "ranked_misses", "reset_ranked_misses", "stats", "unpatch_jax",
]
__version__ = "0.1.0"


# one lock across the reload below (which runs this file again)
_load_lock = globals().get("_load_lock") or threading.Lock()


def __getattr__(name: str) -> object:
    global _deferred
    if name in __all__ and name not in ("compare", "CompareResult"):
        # The imports above, deferred: one thread runs them; a thread that asks
        # meanwhile waits for it (the reload sets _deferred before the imports end).
        with _load_lock:
            if _deferred:
                importlib.reload(sys.modules[__name__])
                _deferred = False
        if name in globals():
            return globals()[name]
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
