"""Shared setup for the asv suite: 8 host devices, seeded data, the implementations.

This module must stay importable on any commit and must not start JAX's
backend at import: asv imports every benchmark module in one process and
forks it for each benchmark, and XLA_FLAGS is read when the backend starts.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_FLAG}=8".strip()

import functools  # noqa: E402
import operator  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

# The `impl` parameter of every dispatch benchmark.
IMPLS = ["nbjit", "jax"]


def get_jit(impl):
    """``nbjit.jit`` or ``jax.jit``; NotImplementedError (asv: skipped) where it is missing."""
    if impl == "jax":
        return jax.jit
    try:
        import nbjit
    except ImportError as exc:  # a commit whose nbjit does not import
        raise NotImplementedError(f"nbjit does not import: {exc}") from exc
    jit = getattr(nbjit, "jit", None)
    if jit is None:
        raise NotImplementedError("this commit has no nbjit.jit")
    return jit


def require_devices(n):
    if len(jax.devices()) < n:
        raise NotImplementedError(f"needs {n} devices, have {len(jax.devices())}")


def rng(seed=0):
    return np.random.default_rng(seed)


def device_scalars(n):
    """``n`` committed scalar jax.Arrays 0..n-1, as api_benchmark builds them."""
    return [jax.device_put(i) for i in range(n)]


def numpy_vectors(n, size=8, seed=0):
    r = rng(seed)
    return [r.standard_normal(size).astype(np.float32) for _ in range(n)]


def mesh(shape, names):
    count = int(np.prod(shape))
    return jax.sharding.Mesh(np.asarray(jax.devices()[:count]).reshape(shape), names)


def block(out):
    return jax.block_until_ready(out)


# Traced functions: module level, so both implementations wrap the same object.
def swap(a, b):
    return b, a


def sum_list(xs):
    return functools.reduce(operator.add, xs)


def first_plus_one(*xs):
    return xs[0] + 1


def plus_one(x):
    return x + 1


def tree_plus_one(tree):
    return jax.tree.map(lambda v: v + 1, tree)


def add_static_kwargs(x, n, *, y, mode):
    return x * n + y if mode == "mul" else x + n + y


def twice(x):
    return x * 2
