"""nbjit: a drop-in `jax.jit` whose per-call dispatch is Python + Numba."""

from nbjit import _jax  # noqa: F401  (version check at import)
