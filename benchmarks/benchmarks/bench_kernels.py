"""nbjit's Numba kernels and host-side sharding of numpy inputs.

- SignatureKey: plain-Python vs Numba signature key, 1..1000 leaves (the
  crossover `nbjit._kernels.NUMBA_KEY_MIN_LEAVES` comes from here).
- DispatchKey: the same starting from jax.Arrays (reading each leaf's fields
  is part of the cost), next to the key the dispatcher's hit path builds:
  the tuple of (aval, committed) pairs, hashed (avals hash by identity).
- Gather: copying every distinct shard into a staging buffer, numpy's
  per-shard copy vs the Numba kernel, by source memory layout.
- PlanBuild: building a ShardingPlan (index domains, replicas) uncached.
- NumpyToSharding: nbjit.device_put vs jax.device_put.
- JitNumpyInputs: nbjit.jit vs jax.jit with numpy inputs and in_shardings.
"""

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import common  # noqa: F401  (8 host devices, before anything starts jax's backend)

SHARDING_CASES = {
    "64x64 P(x,y)": ((64, 64), P("x", "y")),
    "2048x2048 P(x,None)": ((2048, 2048), P("x", None)),
    "2048x2048 P(None,y)": ((2048, 2048), P(None, "y")),
    "2048x2048 P()": ((2048, 2048), P()),
}


def _nbjit_module(name):
    try:
        import importlib

        return importlib.import_module(name)
    except ImportError as exc:
        raise NotImplementedError(f"this commit has no {name}: {exc}") from exc


def _mesh_4x2():
    if len(jax.devices()) < 8:
        raise NotImplementedError("needs 8 host devices")
    return jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("x", "y"))


def _array(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class SignatureKey:
    """One signature key over n leaves of (dtype, weak, committed, sharding, layout, shape)."""

    params = [["python", "numba"], [1, 4, 10, 100, 1000]]
    param_names = ["impl", "leaves"]

    def setup(self, impl, leaves):
        kernels = _nbjit_module("nbjit._kernels")
        self.leaves = [(i % 12, bool(i % 2), True, 1000 + i % 3, 0, (8, i % 7 + 1))
                       for i in range(leaves)]
        self.key = (kernels.python_signature_key if impl == "python"
                    else kernels.numba_signature_key)
        self.key(self.leaves)  # compile / load from cache outside the timing

    def time_key(self, impl, leaves):
        self.key(self.leaves)


class DispatchKey:
    """A hashed key for n jax.Array leaves, from the arrays themselves."""

    params = [["aval_pairs", "python_packed", "numba_packed"], [1, 4, 10, 100, 1000]]
    param_names = ["impl", "leaves"]

    def setup(self, impl, leaves):
        kernels = _nbjit_module("nbjit._kernels")
        dtypes = [np.float32, np.int32, np.float16, np.bool_]
        self.arrays = [jax.device_put(np.zeros((8, i % 7 + 1), dtypes[i % 4]))
                       for i in range(leaves)]
        dtype_ids: dict = {}
        sharding_ids: dict = {}

        def fields(xs):  # what a packed key must read per leaf before packing
            return [(dtype_ids.setdefault(x.dtype, len(dtype_ids)), x.weak_type, x._committed,
                     sharding_ids.setdefault(x._sharding, len(sharding_ids)), 0, x.shape)
                    for x in xs]

        if impl == "aval_pairs":
            self.key = lambda xs: hash(tuple([(x.aval, x._committed) for x in xs]))
        elif impl == "python_packed":
            self.key = lambda xs: kernels.python_signature_key(fields(xs))
        else:
            self.key = lambda xs: kernels.numba_signature_key(fields(xs))[0]
        self.key(self.arrays)  # compile / load from cache, fill the id tables

    def time_key(self, impl, leaves):
        self.key(self.arrays)


class Gather:
    """Every distinct shard of a 2-D float32 array into one staging buffer."""

    params = [["numpy", "numba"], ["C", "F", "negative"], [64, 512, 2048],
              ["P(x,y)", "P()"]]
    param_names = ["gather", "layout", "n", "spec"]

    def setup(self, gather, layout, n, spec):
        sharding = _nbjit_module("nbjit.sharding")
        kernels = _nbjit_module("nbjit._kernels")
        spec = P("x", "y") if spec == "P(x,y)" else P()
        plan = sharding.plan_for(NamedSharding(_mesh_4x2(), spec), (n, n), np.dtype(np.float32))
        base = _array((n, 2 * n))
        self.x = {"C": np.ascontiguousarray(base[:, :n]), "F": np.asfortranarray(base[:, :n]),
                  "negative": base[::-1, ::-2]}[layout]
        self.out = np.empty(plan._nbytes // 4, np.float32)
        shards = [np.ndarray(s, np.float32, buffer=self.out, offset=o)
                  for s, o in zip(plan._shard_shapes, plan._byte_offsets, strict=True)]
        if gather == "numpy":
            pairs = list(zip(shards, plan._slices, strict=True))
            x = self.x

            def run():
                for shard, index in pairs:
                    np.copyto(shard, x[index])
        else:
            args = (self.x, plan._starts, plan._stops, plan._elem_offsets, self.out)

            def run():
                kernels.gather_strided(*args)
        self.run = run
        run()

    def time_gather(self, gather, layout, n, spec):
        self.run()


class PlanBuild:
    """A ShardingPlan built from scratch (what a cache miss costs once)."""

    params = [["P(x,y)", "P(('x','y'))", "P(None,y)", "P()"]]
    param_names = ["spec"]

    def setup(self, spec):
        self.sharding_mod = _nbjit_module("nbjit.sharding")
        spec = {"P(x,y)": P("x", "y"), "P(('x','y'))": P(("x", "y")),
                "P(None,y)": P(None, "y"), "P()": P()}[spec]
        self.s = NamedSharding(_mesh_4x2(), spec)
        self.sharding_mod._build_plan(self.s, (64, 64), np.dtype(np.float32), False)

    def time_build(self, spec):
        self.sharding_mod._build_plan(self.s, (64, 64), np.dtype(np.float32), False)


class NumpyToSharding:
    """A numpy array onto a NamedSharding over 8 host devices, per call."""

    params = [["nbjit", "jax"], list(SHARDING_CASES)]
    param_names = ["impl", "case"]
    timeout = 120

    def setup(self, impl, case):
        shape, spec = SHARDING_CASES[case]
        self.s = NamedSharding(_mesh_4x2(), spec)
        self.x = _array(shape)
        if impl == "jax":
            self.put = jax.device_put
        else:
            nbjit = _nbjit_module("nbjit")
            self.put = getattr(nbjit, "device_put", None) or _nbjit_module(
                "nbjit.sharding").device_put
        jax.block_until_ready(self.put(self.x, self.s))

    def time_device_put(self, impl, case):
        jax.block_until_ready(self.put(self.x, self.s))


def _double(a):
    return a * 2


class JitNumpyInputs:
    """A jitted function called with a numpy input, in_shardings over 8 devices."""

    params = [["nbjit", "jax"], list(SHARDING_CASES)]
    param_names = ["impl", "case"]
    timeout = 180

    def setup(self, impl, case):
        shape, spec = SHARDING_CASES[case]
        s = NamedSharding(_mesh_4x2(), spec)
        if impl == "jax":
            jit = jax.jit
        else:
            jit = getattr(_nbjit_module("nbjit"), "jit", None)
            if jit is None:
                raise NotImplementedError("this commit has no nbjit.jit")
        self.f = jit(_double, in_shardings=s)
        self.x = _array(shape)
        jax.block_until_ready(self.f(self.x))

    def time_call(self, impl, case):
        jax.block_until_ready(self.f(self.x))
