"""Per-call dispatch: nbjit.jit against jax.jit, one class per scenario.

The first classes are the jit cases of JAX's own benchmarks/api_benchmark.py;
the rest are inputs that take other branches of the fast path (numpy and
Python scalars, static args and kwargs, pytrees, host-sliced shardings) and
the cost of a cache miss. ``time_dispatch`` returns as soon as the call has
been dispatched; ``time_call`` waits for the outputs.
"""

import numpy as np

from . import common
from .common import IMPLS


class TrivialDispatch:
    """api_benchmark jit_trivial(_dispatch): swap two outputs of a previous call."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        self.f = common.get_jit(impl)(common.swap)
        self.a, self.b = self.f(1, 2)
        common.block(self.f(self.a, self.b))

    def time_dispatch(self, impl):
        self.f(self.a, self.b)

    def time_call(self, impl):
        c, d = self.f(self.a, self.b)
        c.block_until_ready()
        d.block_until_ready()


class SimpleDispatch:
    """api_benchmark jit_simple(_dispatch): add two device scalars."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        import operator

        self.f = common.get_jit(impl)(operator.add)
        self.a, self.b = common.device_scalars(2)
        common.block(self.f(self.a, self.b))

    def time_dispatch(self, impl):
        self.f(self.a, self.b)

    def time_call(self, impl):
        self.f(self.a, self.b).block_until_ready()


class ManyArgs:
    """api_benchmark jit_simple_many_args(_dispatch): sum a list of n device scalars."""

    params = [[10, 100, 1000], IMPLS]
    param_names = ["n_args", "impl"]
    timeout = 180  # compiling the 1000-way sum takes seconds

    def setup(self, n_args, impl):
        self.f = common.get_jit(impl)(common.sum_list)
        self.args = common.device_scalars(n_args)
        common.block(self.f(self.args))

    def time_dispatch(self, n_args, impl):
        self.f(self.args)

    def time_call(self, n_args, impl):
        self.f(self.args).block_until_ready()


class PrunedArgs:
    """api_benchmark jit_simple_pruned_args(_dispatch): n args, only the first is used."""

    params = [[10, 100, 1000], IMPLS]
    param_names = ["n_args", "impl"]

    def setup(self, n_args, impl):
        self.f = common.get_jit(impl)(common.first_plus_one)
        self.args = common.device_scalars(n_args)
        common.block(self.f(*self.args))

    def time_dispatch(self, n_args, impl):
        self.f(*self.args)

    def time_call(self, n_args, impl):
        self.f(*self.args).block_until_ready()


class Transfer:
    """api_benchmark jit_dispatch_with(out)_transfer: x + 1 on 128 images of 224x224."""

    params = [[False, True], IMPLS]
    param_names = ["transfer", "impl"]
    # Each call queues 25 MB of work: few calls per sample, so the queue stays short.
    number = 5
    repeat = (1, 10, 5.0)
    warmup_time = 0.0

    def setup(self, transfer, impl):
        import jax

        self.f = common.get_jit(impl)(common.plus_one)
        imgs = np.ones((128, 224, 224), np.float32)
        self.x = imgs if transfer else jax.device_put(imgs)
        common.block(self.f(self.x))

    def time_dispatch(self, transfer, impl):
        self.f(self.x)

    def teardown(self, transfer, impl):
        common.block(self.f(self.x))


class PjitSimple:
    """api_benchmark pjit_simple_4_devices: a list of n arrays sharded over 4 devices."""

    params = [[1, 10, 100], IMPLS]
    param_names = ["n_args", "impl"]

    def setup(self, n_args, impl):
        import jax

        common.require_devices(4)
        s = jax.sharding.NamedSharding(common.mesh((4,), ("x",)), jax.sharding.PartitionSpec("x"))
        x = jax.device_put(np.arange(4, dtype=np.float32), s)
        self.f = common.get_jit(impl)(common.tree_plus_one, in_shardings=s, out_shardings=s)
        self.x = self.f([x] * n_args)  # as upstream: the inputs are jit outputs
        common.block(self.f(self.x))

    def time_dispatch(self, n_args, impl):
        self.f(self.x)

    def time_call(self, n_args, impl):
        common.block(self.f(self.x))


class InputKinds:
    """Two arguments of each kind: jax.Array, numpy array, Python scalar."""

    params = [["jax.Array", "numpy", "python_scalar"], IMPLS]
    param_names = ["kind", "impl"]

    def setup(self, kind, impl):
        import operator

        import jax

        self.f = common.get_jit(impl)(operator.add)
        if kind == "jax.Array":
            self.args = tuple(jax.device_put(v) for v in common.numpy_vectors(2))
        elif kind == "numpy":
            self.args = tuple(common.numpy_vectors(2))
        elif kind == "python_scalar":
            self.args = (1, 2.0)
        else:
            raise NotImplementedError(kind)
        common.block(self.f(*self.args))

    def time_dispatch(self, kind, impl):
        self.f(*self.args)

    def time_call(self, kind, impl):
        self.f(*self.args).block_until_ready()


class InputKindsNewValues:
    """Two host arguments with new values on every call (64 pairs, in turn).

    InputKinds passes the same values again, which nbjit's host-input memo
    serves without a transfer; here every call transfers, as a loop over
    data batches does.
    """

    params = [["numpy", "python_scalar"], IMPLS]
    param_names = ["kind", "impl"]

    def setup(self, kind, impl):
        import operator

        self.f = common.get_jit(impl)(operator.add)
        if kind == "numpy":
            self.pool = [tuple(common.numpy_vectors(2, seed=i)) for i in range(64)]
        elif kind == "python_scalar":
            self.pool = [(i, i + 0.5) for i in range(1000, 1064)]  # not small-int cached
        else:
            raise NotImplementedError(kind)
        self.turn = 0
        for args in self.pool:
            common.block(self.f(*args))

    def time_dispatch(self, kind, impl):
        self.turn = (self.turn + 1) & 63
        self.f(*self.pool[self.turn])


class StaticArgsKwargs:
    """A static positional arg, a static kwarg and an array kwarg."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        import jax.numpy as jnp

        self.f = common.get_jit(impl)(
            common.add_static_kwargs, static_argnums=(1,), static_argnames=("mode",)
        )
        self.x, self.y = jnp.arange(8.0), jnp.ones(8)
        common.block(self.f(self.x, 3, y=self.y, mode="mul"))

    def time_dispatch(self, impl):
        self.f(self.x, 3, y=self.y, mode="mul")

    def time_call(self, impl):
        self.f(self.x, 3, y=self.y, mode="mul").block_until_ready()


class ParamDict100:
    """A 100-leaf parameter dict in, a 100-leaf dict out."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        import jax.numpy as jnp

        self.f = common.get_jit(impl)(common.tree_plus_one)
        self.params = {f"layer{i:03d}": jnp.full((4,), float(i)) for i in range(100)}
        common.block(self.f(self.params))

    def time_dispatch(self, impl):
        self.f(self.params)

    def time_call(self, impl):
        common.block(self.f(self.params))


class ShardedNumpy:
    """A numpy 64x64 input with NamedSharding P('x', 'y') over 8 host devices."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        import jax

        common.require_devices(8)
        s = jax.sharding.NamedSharding(
            common.mesh((4, 2), ("x", "y")), jax.sharding.PartitionSpec("x", "y")
        )
        self.f = common.get_jit(impl)(common.twice, in_shardings=s)
        self.x = common.rng().standard_normal((64, 64)).astype(np.float32)
        common.block(self.f(self.x))

    def time_dispatch(self, impl):
        self.f(self.x)

    def time_call(self, impl):
        self.f(self.x).block_until_ready()


class CacheMiss:
    """A new function on every call: trace, lower, compile, run."""

    params = [IMPLS]
    param_names = ["impl"]
    number = 1
    repeat = (1, 10, 10.0)

    def setup(self, impl):
        import jax.numpy as jnp

        self.jit = common.get_jit(impl)
        self.x = jnp.arange(8.0)

    def time_miss(self, impl):
        def fresh(x):  # a new function object each call: never in any cache
            return x + 1

        self.jit(fresh)(self.x).block_until_ready()
