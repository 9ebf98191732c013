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

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import common  # first: 8 host devices, before anything starts jax's backend

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


# Where the sharding plans' implementation lives, newest first (asv runs this
# suite against older commits too).
_PLAN_MODULES = ("nbjit.core.inputs.plans", "nbjit.host.plan", "nbjit.sharding")


def _plans_module():
    for name in _PLAN_MODULES[:-1]:
        try:
            return _nbjit_module(name)
        except NotImplementedError:
            pass
    return _nbjit_module(_PLAN_MODULES[-1])


def _mesh_4x2():
    if len(jax.devices()) < 8:
        raise NotImplementedError("needs 8 host devices")
    return jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("x", "y"))


def _array(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class SignatureKey(common.Prepared):
    """One signature key over n leaves of (dtype, weak, committed, sharding, layout, shape)."""

    params = [["python", "numba"], [1, 4, 10, 100, 1000]]
    param_names = ["impl", "leaves"]
    number = 200  # ~1-500 us a call

    def prepare(self, impl, leaves):
        kernels = _nbjit_module("nbjit._kernels")
        rows = [(i % 12, bool(i % 2), True, 1000 + i % 3, 0, (8, i % 7 + 1))
                for i in range(leaves)]
        key = (kernels.python_signature_key if impl == "python"
               else kernels.numba_signature_key)
        key(rows)  # compile / load from cache
        return functools.partial(key, rows)

    def time_key(self, impl, leaves):
        (self.run or self.start(impl, leaves))()


class DispatchKey(common.Prepared):
    """A hashed key for n jax.Array leaves, from the arrays themselves."""

    params = [["aval_pairs", "python_packed", "numba_packed"], [1, 4, 10, 100, 1000]]
    param_names = ["impl", "leaves"]
    number = 100  # ~1 us to ~2 ms a call

    def prepare(self, impl, leaves):
        kernels = _nbjit_module("nbjit._kernels")
        dtypes = [np.float32, np.int32, np.float16, np.bool_]
        arrays = [jax.device_put(np.zeros((8, i % 7 + 1), dtypes[i % 4]))
                       for i in range(leaves)]
        dtype_ids: dict = {}
        sharding_ids: dict = {}

        def fields(xs):  # what a packed key must read per leaf before packing
            return [(dtype_ids.setdefault(x.dtype, len(dtype_ids)), x.weak_type, x._committed,
                     sharding_ids.setdefault(x._sharding, len(sharding_ids)), 0, x.shape)
                    for x in xs]

        if impl == "aval_pairs":
            key = lambda xs: hash(tuple([(x.aval, x._committed) for x in xs]))  # noqa: E731
        elif impl == "python_packed":
            key = lambda xs: kernels.python_signature_key(fields(xs))  # noqa: E731
        else:
            key = lambda xs: kernels.numba_signature_key(fields(xs))[0]  # noqa: E731
        key(arrays)  # compile / load from cache, fill the id tables
        return functools.partial(key, arrays)

    def time_key(self, impl, leaves):
        (self.run or self.start(impl, leaves))()


class Gather(common.Prepared):
    """Every distinct shard of a 2-D float32 array into one staging buffer."""

    params = [["numpy", "numba"], ["C", "F", "negative"], [64, 512, 2048],
              ["P(x,y)", "P()"]]
    param_names = ["gather", "layout", "n", "spec"]
    number = 20  # ~10 us to ~10 ms a call

    def prepare(self, gather, layout, n, spec):
        sharding = _plans_module()
        kernels = _nbjit_module("nbjit._kernels")
        spec = P("x", "y") if spec == "P(x,y)" else P()
        plan = sharding.plan_for(NamedSharding(_mesh_4x2(), spec), (n, n), np.dtype(np.float32))
        base = _array((n, 2 * n))
        x = {"C": np.ascontiguousarray(base[:, :n]), "F": np.asfortranarray(base[:, :n]),
             "negative": base[::-1, ::-2]}[layout]
        out = np.empty(plan._nbytes // 4, np.float32)
        shards = [np.ndarray(s, np.float32, buffer=out, offset=o)
                  for s, o in zip(plan._shard_shapes, plan._byte_offsets, strict=True)]
        if gather == "numpy":
            pairs = list(zip(shards, plan._slices, strict=True))

            def run():
                for shard, index in pairs:
                    np.copyto(shard, x[index])
        else:
            args = (x, plan._starts, plan._stops, plan._elem_offsets, out)

            def run():
                kernels.gather_strided(*args)
        run()
        return run

    def time_gather(self, gather, layout, n, spec):
        (self.run or self.start(gather, layout, n, spec))()


class PlanBuild(common.Prepared):
    """A ShardingPlan built from scratch (what a cache miss costs once)."""

    params = [["P(x,y)", "P(('x','y'))", "P(None,y)", "P()"]]
    param_names = ["spec"]
    number = 100

    def prepare(self, spec):
        sharding_mod = _plans_module()
        spec = {"P(x,y)": P("x", "y"), "P(('x','y'))": P(("x", "y")),
                "P(None,y)": P(None, "y"), "P()": P()}[spec]
        build = functools.partial(sharding_mod._build_plan, NamedSharding(_mesh_4x2(), spec),
                                  (64, 64), np.dtype(np.float32), False)
        build()
        return build

    def time_build(self, spec):
        (self.run or self.start(spec))()


class NumpyToSharding(common.Prepared):
    """A numpy array onto a NamedSharding over 8 host devices, per call."""

    params = [["nbjit", "jax"], list(SHARDING_CASES)]
    param_names = ["impl", "case"]
    timeout = 120
    number = 10  # ~50 us to ~20 ms a call

    def prepare(self, impl, case):
        shape, spec = SHARDING_CASES[case]
        s = NamedSharding(_mesh_4x2(), spec)
        x = _array(shape)
        if impl == "jax":
            put = jax.device_put
        else:
            nbjit = _nbjit_module("nbjit")
            put = getattr(nbjit, "device_put", None) or _plans_module().device_put

        def run():
            jax.block_until_ready(put(x, s))
        run()
        return run

    def time_device_put(self, impl, case):
        (self.run or self.start(impl, case))()


def _double(a):
    return a * 2


class JitNumpyInputs(common.Prepared):
    """A jitted function called with a numpy input, in_shardings over 8 devices."""

    params = [["nbjit", "jax"], list(SHARDING_CASES)]
    param_names = ["impl", "case"]
    timeout = 180
    number = 10

    def prepare(self, impl, case):
        shape, spec = SHARDING_CASES[case]
        s = NamedSharding(_mesh_4x2(), spec)
        if impl == "jax":
            jit = jax.jit
        else:
            jit = getattr(_nbjit_module("nbjit"), "jit", None)
            if jit is None:
                raise NotImplementedError("this commit has no nbjit.jit")
        f = jit(_double, in_shardings=s)
        x = _array(shape)

        def run():
            jax.block_until_ready(f(x))
        run()
        return run

    def time_call(self, impl, case):
        (self.run or self.start(impl, case))()
