"""The scenario matrix of `python -m nbjit compare` (and of the asv suite).

Each `Scenario` names a case and how to time it; its builder returns a
`Case`: the function, its arguments, the jit options. Scenarios whose case
has an ``arg_pool`` pass new host values on every call (the loops people
write: a training step with a fresh batch, an environment step with a fresh
action). `scenarios()` is the full matrix in table order; `select` picks
rows by a name pattern, `scenario` one row by its name.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Upstream's own jit, captured where JAX defines it (see nbjit.bench.runner).
from nbjit._jax import jax_jit
from nbjit.bench import filter_cases as fc  # equinox is imported when a row is built
from nbjit.bench import training


@dataclass(frozen=True)
class Case:
    """What one scenario calls: ``jit(fun, **jit_options)(*args, **kwargs)``.

    ``fresh_function``: wrap a new copy of ``fun`` on every call (a cache miss
    each time: trace, lower, compile).

    ``arg_pool``: argument tuples with new values, prepared before timing;
    each call takes the next one (in turn, so no call repeats the previous
    call's values). ``args`` is then ``arg_pool[0]``. Both sides walk the same
    pool with the same iterator code, so fetching the next tuple costs both the
    same; making the values is not timed.
    """

    fun: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    jit_options: dict[str, Any] = field(default_factory=dict)
    fresh_function: bool = False
    arg_pool: tuple[tuple[Any, ...], ...] = ()
    # Contenders of their own, each with its argument pool: (name, callable, pool).
    # "a" and "b" are the ratio's sides, any other is timed with them and named
    # in the row's note (filter_jit rows: nbjit, the ideal, equinox).
    sides: tuple[tuple[str, Callable[..., Any], tuple[tuple[Any, ...], ...]], ...] = ()
    # A training loop (`nbjit.bench.training.Loop`): timed per step and until
    # each call returns, in segments of steps, instead of call by call.
    loop: Any = None

    @classmethod
    def new_values(cls, fun: Callable[..., Any], pool: Sequence[tuple[Any, ...]],
                   **options: Any) -> Case:
        """A case whose every call passes the next tuple of ``pool``."""
        pool = tuple(pool)
        return cls(fun, pool[0], arg_pool=pool, **options)


@dataclass(frozen=True)
class Scenario:
    name: str
    n_args: int  # leaves passed per call
    kind: str  # what the inputs are
    build: Callable[[], Case]
    block: bool  # time until the outputs are ready, not just dispatched
    family: str | None = None  # scenarios plotted as time against n_args
    min_devices: int = 1
    origin: str = "nbjit"  # "api_benchmark": a jit case of JAX's benchmarks/api_benchmark.py
    # Wait for each call's outputs, untimed, before the next call: for calls
    # that start large computations, whose queue would otherwise slow the
    # dispatches after them.
    sync_each: bool = False
    needs: str | None = None  # a module the case imports (an optional dependency): else skipped


def _swap(a, b):
    return b, a


def _sum_list(xs):
    return functools.reduce(operator.add, xs)


def _sum_args(*xs):
    return functools.reduce(operator.add, xs)


def _first_plus_one(*xs):
    return xs[0] + 1


def _plus_one(x):
    return x + 1


def _add_static_kwargs(x, n, *, y, mode):
    return x * n + y if mode == "mul" else x + n + y


def _tree_plus_one(params):
    return jax.tree.map(lambda v: v + 1, params)


def _twice(x):
    return x * 2


# Host inputs at a fixed alignment. jaxlib's fast path uses a 64-byte aligned
# numpy array in place (no copy, so cheaper per small input) and copies any
# other; numpy places only some fresh arrays on a 64-byte boundary (and large
# mmap'd ones almost never), so with fresh arrays a row's jax.jit time
# changed between builds by chance (docs/performance.md, "Measured constants
# behind the code"). Every numpy input here sits 16 bytes past a 64-byte
# boundary: the usual case.
HOST_OFFSET = 16


def _host(x: np.ndarray) -> np.ndarray:
    """A copy of `x` whose data starts `HOST_OFFSET` bytes past a 64-byte boundary."""
    buf = np.empty(x.nbytes + 64 + HOST_OFFSET, np.uint8)
    start = (-buf.ctypes.data) % 64 + HOST_OFFSET
    out = buf[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


def _scalars(n: int) -> list[jax.Array]:
    return [jax.device_put(i) for i in range(n)]


def _trivial() -> Case:
    a, b = jax_jit(_swap)(1, 2)
    return Case(_swap, (a, b))


def _simple() -> Case:
    return Case(operator.add, tuple(_scalars(2)))


def _many_args(n: int) -> Callable[[], Case]:
    return lambda: Case(_sum_list, (_scalars(n),))


def _pruned_args(n: int) -> Callable[[], Case]:
    return lambda: Case(_first_plus_one, tuple(_scalars(n)))


def _positional_args(n: int) -> Callable[[], Case]:
    return lambda: Case(_sum_args, tuple(_scalars(n)))


def _images(transfer: bool) -> Callable[[], Case]:
    def build() -> Case:
        # api_benchmark's "realistic input": 128 images of 224x224.
        imgs = _host(np.ones((128, 224, 224), np.float32))
        return Case(_plus_one, (imgs if transfer else jax.device_put(imgs),))

    return build


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    n = int(np.prod(shape))
    return jax.sharding.Mesh(np.asarray(jax.devices()[:n]).reshape(shape), names)


def _pjit_simple(n: int) -> Callable[[], Case]:
    def build() -> Case:
        s = jax.sharding.NamedSharding(_mesh((4,), ("x",)), jax.sharding.PartitionSpec("x"))
        x = jax.device_put(np.arange(4, dtype=np.float32), s)
        opts = {"in_shardings": s, "out_shardings": s}
        fun = _tree_plus_one
        # As upstream, feed the outputs back once so the inputs are jit outputs.
        xs = jax_jit(fun, **opts)([x] * n)  # type: ignore[call-overload]  # (stubs: **dict)
        return Case(fun, (xs,), jit_options=opts)

    return build


def _numpy_2() -> Case:
    rng = np.random.default_rng(0)
    return Case(operator.add, tuple(_host(rng.standard_normal(8).astype(np.float32))
                                    for _ in range(2)))


def _python_scalars_2() -> Case:
    return Case(operator.add, (1, 2.0))


def _static_kwargs() -> Case:
    x, y = jnp.arange(8.0), jnp.ones(8)
    return Case(
        _add_static_kwargs,
        (x, 3),
        {"y": y, "mode": "mul"},
        {"static_argnums": (1,), "static_argnames": ("mode",)},
    )


def _dict_100() -> Case:
    params = {f"layer{i:03d}": jnp.full((4,), float(i)) for i in range(100)}
    return Case(_tree_plus_one, (params,))


def _numpy_sharded() -> Case:
    s = jax.sharding.NamedSharding(_mesh((4, 2), ("x", "y")), jax.sharding.PartitionSpec("x", "y"))
    x = _host(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32))
    return Case(_twice, (x,), jit_options={"in_shardings": s})


def _cache_miss() -> Case:
    return Case(_plus_one, (jnp.arange(8.0),), fresh_function=True)


# Workloads: the loops people write, with host values new on every call.

POOL = 64  # distinct argument tuples per new-values case, taken in turn


def _numpy_2_new() -> Case:
    rng = np.random.default_rng(1)
    return Case.new_values(operator.add, [tuple(_host(rng.standard_normal(8).astype(np.float32))
                                                for _ in range(2)) for _ in range(POOL)])


def _python_scalars_2_new() -> Case:
    # From 1000 on: CPython caches small ints, and real values are not all cached.
    return Case.new_values(operator.add, [(i, i + 0.5) for i in range(1000, 1000 + POOL)])


def _mlp_params(rng: np.random.Generator, sizes: Sequence[int] = (16, 32, 32, 4)
                ) -> dict[str, jax.Array]:
    """A small MLP's parameters: w1, b1, w2, b2, w3, b3 (6 leaves), float32."""
    params = {}
    for i, (m, n) in enumerate(itertools.pairwise(sizes), start=1):
        params[f"w{i}"] = jax.device_put(rng.standard_normal((m, n)).astype(np.float32) / m)
        params[f"b{i}"] = jax.device_put(np.zeros(n, np.float32))
    return params


def _mlp_loss(params, batch, labels):
    h = jnp.tanh(batch @ params["w1"] + params["b1"])
    h = jnp.tanh(h @ params["w2"] + params["b2"])
    logp = jax.nn.log_softmax(h @ params["w3"] + params["b3"])
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def _train_step(params, batch, labels):
    loss, grads = jax.value_and_grad(_mlp_loss)(params, batch, labels)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss


def _batches(rng: np.random.Generator, rows: int = 32, features: int = 16,
             classes: int = 4) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(_host(rng.standard_normal((rows, features)).astype(np.float32)),
             _host(rng.integers(0, classes, rows).astype(np.int32))) for _ in range(POOL)]


def _train_step_case() -> Case:
    """A training step: params dict (6 leaves), a new float32[32,16] batch and int32[32] labels."""
    rng = np.random.default_rng(2)
    params = _mlp_params(rng)
    return Case.new_values(_train_step, [(params, x, y) for x, y in _batches(rng)])


def _masked_train_step(params, x, y, mask, weights):
    def loss(p):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        err = jnp.sum((h @ p["w2"] + p["b2"] - y) ** 2, axis=1)
        return jnp.sum(weights * mask * err) / jnp.maximum(jnp.sum(mask), 1.0)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


def _masked_train_step_case() -> Case:
    """A training step whose new batch is four small numpy leaves: x, y, mask, weights."""
    rng = np.random.default_rng(5)
    params = {"w1": jax.device_put(rng.standard_normal((16, 32)).astype(np.float32) / 16),
              "b1": jnp.zeros(32), "w2": jax.device_put(rng.standard_normal((32, 4))
                                                         .astype(np.float32) / 32),
              "b2": jnp.zeros(4)}
    pool = [(params, _host(rng.standard_normal((32, 16)).astype(np.float32)),
             _host(rng.standard_normal((32, 4)).astype(np.float32)),
             _host((rng.random(32) > 0.1).astype(np.float32)),
             _host(rng.random(32).astype(np.float32))) for _ in range(POOL)]
    return Case.new_values(_masked_train_step, pool)


def _optimizer_update(params, grads, lr):
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def _optimizer_case() -> Case:
    """SGD over 200 parameter leaves and their 200 gradients; a new Python float lr each call."""
    leaves = {f"layer{i:03d}": jnp.full((8,), float(i)) for i in range(200)}
    grads = {k: jnp.ones_like(v) for k, v in leaves.items()}
    lrs = np.linspace(1e-3, 1e-2, POOL).tolist()  # a schedule: Python floats
    return Case.new_values(_optimizer_update, [(leaves, grads, lr) for lr in lrs])


def _env_step(state, action, noise):
    pos = state["pos"] + (action % 3 - 1) * 0.1 + noise
    vel = state["vel"] * 0.9 + noise
    new = {"pos": pos, "vel": vel, "t": state["t"] + 1}
    return new, jnp.sum(pos * pos)


def _env_step_case() -> Case:
    """An environment step: state dict of 3 arrays, a new Python int action and float noise."""
    rng = np.random.default_rng(3)
    state = {"pos": jnp.zeros(4), "vel": jnp.ones(4), "t": jnp.asarray(0, jnp.int32)}
    actions = rng.integers(0, 1 << 20, POOL).tolist()  # Python ints, all distinct in turn
    noises = rng.standard_normal(POOL).tolist()  # Python floats
    return Case.new_values(_env_step, list(zip([state] * POOL, actions, noises, strict=True)))


@dataclass(frozen=True)
class StepConfig:
    """A static configuration object: hashable (frozen), compared by value."""

    lr: float = 0.05
    weight_decay: float = 1e-4
    clip: float = 1.0


def _configured_step(params, batch, config, *, activation):
    act = jnp.tanh if activation == "tanh" else jax.nn.relu

    def loss(p):
        return jnp.mean(act(batch @ p["w"] + p["b"]) ** 2)

    grads = jax.grad(loss)(params)
    grads = jax.tree.map(lambda g: jnp.clip(g, -config.clip, config.clip), grads)
    return jax.tree.map(lambda p, g: p * (1 - config.weight_decay) - config.lr * g,
                        params, grads)


def _static_config_case() -> Case:
    """A step with a static config (frozen dataclass), a static keyword and a new numpy batch."""
    rng = np.random.default_rng(4)
    params = {"w": jax.device_put(rng.standard_normal((16, 4)).astype(np.float32)),
              "b": jnp.zeros(4)}
    pool = [(params, x, StepConfig()) for x, _ in _batches(rng)]
    return Case(_configured_step, pool[0], {"activation": "tanh"},
                {"static_argnums": (2,), "static_argnames": ("activation",)}, arg_pool=tuple(pool))


def _data_parallel_step(params, batch, labels):
    def loss(p):
        return jnp.mean((batch @ p["w"] + p["b"] - labels[:, None]) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


def _data_parallel_case() -> Case:
    """A data-parallel step: a new numpy batch (64x16) and labels sliced over 8 devices."""
    mesh = _mesh((8,), ("batch",))
    P = jax.sharding.PartitionSpec
    replicated = jax.sharding.NamedSharding(mesh, P())
    by_row = jax.sharding.NamedSharding(mesh, P("batch"))
    rng = np.random.default_rng(5)
    params = jax.device_put({"w": rng.standard_normal((16, 1)).astype(np.float32),
                             "b": np.zeros(1, np.float32)}, replicated)
    pool = [(params, x, _host(y.astype(np.float32))) for x, y in _batches(rng, rows=64)]
    return Case.new_values(_data_parallel_step, pool,
                           jit_options={"in_shardings": (replicated, by_row, by_row)})


def _params_dict_step(params, x):
    """An SGD step on a params dict {"l0": {"w", "b"}, ...}: the call researchers write most."""
    def loss(p):
        y = x
        for name in sorted(p):
            y = jnp.tanh(y @ p[name]["w"] + p[name]["b"])
        return jnp.mean(y * y)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


def _params_dict_case(leaves: int) -> Callable[[], Case]:
    """A params dict of `leaves` leaves (w and b per layer, 4x4 and 4) and a jax.Array batch."""
    def build() -> Case:
        params = {f"l{i:03d}": {"w": jnp.full((4, 4), 0.1), "b": jnp.zeros(4)}
                  for i in range(leaves // 2)}
        return Case(_params_dict_step, (params, jnp.ones((2, 4))))

    return build


# Host arrays past the small leaves: `f(params, x)` with a float32 x of 8 KiB,
# 64 KiB or 1 MiB (rows of 256 features), the same array every call or one
# of four in turn, off or on a 64-byte boundary (jax.jit uses an aligned
# array in place, no copy; nbjit never aliases the caller's array).

HOST_SIZES = {"8k": 8 << 10, "64k": 64 << 10, "1m": 1 << 20}


def _aligned(x: np.ndarray) -> np.ndarray:
    """A copy of `x` whose data starts on a 64-byte boundary."""
    buf = np.empty(x.nbytes + 64, np.uint8)
    start = (-buf.ctypes.data) % 64
    out = buf[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


def _linear_rows(params, x):
    return jnp.sum(x * params["w"], axis=1) + params["b"]


def _host_array_case(size: str, fresh: bool, aligned: bool) -> Callable[[], Case]:
    def build() -> Case:
        rng = np.random.default_rng(7)
        params = {"w": jax.device_put(rng.standard_normal(256).astype(np.float32)),
                  "b": jnp.zeros((), jnp.float32)}
        place = _aligned if aligned else _host
        rows = HOST_SIZES[size] // (256 * 4)
        xs = [place(rng.standard_normal((rows, 256)).astype(np.float32))
              for _ in range(4 if fresh else 1)]
        return Case.new_values(_linear_rows, [(params, x) for x in xs])

    return build


def _mnist_step(params, batch, labels):
    def loss(p):
        h = jax.nn.relu(batch @ p["w1"] + p["b1"])
        logp = jax.nn.log_softmax(h @ p["w2"] + p["b2"])
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


def _mnist_case() -> Case:
    """An MNIST-sized training loop: a new float32[128,784] batch (392 KiB) and labels."""
    rng = np.random.default_rng(8)
    params = {"w1": jax.device_put(rng.standard_normal((784, 32)).astype(np.float32) / 28),
              "b1": jnp.zeros(32), "w2": jax.device_put(rng.standard_normal((32, 10))
                                                         .astype(np.float32) / 6),
              "b2": jnp.zeros(10)}
    pool = [(params, _host(rng.random((128, 784)).astype(np.float32)),
             _host(rng.integers(0, 10, 128).astype(np.int32))) for _ in range(8)]
    return Case.new_values(_mnist_step, pool)


def _training_loop_case() -> Case:
    """An MLP with Adam's state (optax's, else a hand-written one), a new numpy
    batch each step, waited for every few steps (`nbjit.bench.training`)."""
    loop = training.mlp_loop(offset=HOST_OFFSET)
    x, y = loop.sources[0]
    return Case(loop.step, (loop.params, loop.state, x, y), loop=loop)


def _host_array_rows() -> list[Scenario]:
    rows = []
    for fresh, aligned in ((False, False), (False, True), (True, False), (True, True)):
        for size in HOST_SIZES:
            name = (f"host_array_{'fresh' if fresh else 'same'}_{size}"
                    + ("_aligned" if aligned else ""))
            kind = (f"params + numpy {size.upper()}iB, "
                    + ("one of 4 in turn" if fresh else "same array")
                    + (", 64-byte aligned" if aligned else ""))
            rows.append(Scenario(name, 3, kind, _host_array_case(size, fresh, aligned), True))
    rows.append(Scenario("workload_mnist_train_step", 6, "4 params + new 392 KiB batch",
                         _mnist_case, False))
    rows.append(Scenario("workload_training_loop", 15, "per step: MLP + Adam, new batch",
                         _training_loop_case, False))
    return rows


def _upstream_pair(
    name: str, n: int, kind: str, build: Callable[[], Case], family: str | None = None
) -> list[Scenario]:
    """The ``*_dispatch`` (no waiting) and blocking variants of an api_benchmark case."""
    return [
        Scenario(f"{name}_dispatch", n, kind, build, False, family and f"{family} dispatch",
                 origin="api_benchmark"),
        Scenario(name, n, kind, build, True, family and f"{family} call", origin="api_benchmark"),
    ]


def scenarios() -> list[Scenario]:
    """The full matrix, in table order."""
    out: list[Scenario] = []
    out += _upstream_pair("jit_trivial", 2, "jax.Array", _trivial)
    out += _upstream_pair("jit_simple", 2, "jax.Array", _simple)
    for n in (10, 100, 1000):
        out += _upstream_pair(f"jit_simple_many_args_{n}", n, "list of jax.Array",
                              _many_args(n), "many args (list)")
    for n in (10, 100, 1000):
        out += _upstream_pair(f"jit_simple_pruned_args_{n}", n, "jax.Array, pruned",
                              _pruned_args(n), "pruned args")
    out.append(Scenario("jit_dispatch_without_transfer", 1, "jax.Array 25 MB",
                        _images(False), False, origin="api_benchmark", sync_each=True))
    out.append(Scenario("jit_dispatch_with_transfer", 1, "numpy 25 MB",
                        _images(True), False, origin="api_benchmark", sync_each=True))
    for n in (1, 10, 100):
        out.append(Scenario(f"pjit_simple_4_devices_{n}_args", n, "sharded jax.Array",
                            _pjit_simple(n), False, min_devices=4, origin="api_benchmark"))
    for n in (1, 2, 10, 100, 1000):
        out.append(Scenario(f"args_{n}", n, "jax.Array", _positional_args(n), False,
                            "positional args dispatch"))
    out += [
        Scenario("numpy_args_2", 2, "numpy", _numpy_2, False),
        Scenario("python_scalars_2", 2, "Python scalar", _python_scalars_2, False),
        Scenario("static_args_kwargs", 3, "static + kwargs", _static_kwargs, False),
        Scenario("dict_100_leaves", 100, "dict of jax.Array", _dict_100, False),
        Scenario("numpy_sharded_8_devices", 1, "numpy -> P('x','y')", _numpy_sharded, False,
                 min_devices=8),
        Scenario("cache_miss", 1, "new function", _cache_miss, True),
        # New values on every call (the host-input memo never hits).
        Scenario("numpy_args_2_new_values", 2, "numpy, new each call", _numpy_2_new, False),
        Scenario("python_scalars_2_new_values", 2, "Python scalar, new each call",
                 _python_scalars_2_new, False),
        Scenario("workload_train_step", 8, "6 params + new numpy batch", _train_step_case,
                 False),
        Scenario("workload_masked_train_step", 8, "4 params + new x, y, mask, weights",
                 _masked_train_step_case, False),
        Scenario("workload_optimizer_update", 401, "2x200 leaves + new lr", _optimizer_case,
                 False),
        Scenario("workload_env_step", 5, "3-array state + new int, float", _env_step_case,
                 False),
        Scenario("workload_static_config", 3, "static config/kw + new numpy",
                 _static_config_case, False),
        Scenario("workload_data_parallel_8_devices", 4, "new numpy batch -> 8 devices",
                 _data_parallel_case, False, min_devices=8),
    ]
    out += _host_array_rows()
    for n in (2, 32, 256):  # pytree calls: where flat arguments already are (issue 30)
        out.append(Scenario(f"params_dict_step_{n}", n + 1, "params dict + jax.Array batch",
                            _params_dict_case(n), False, "params dict step"))
    out += _filter_jit_rows()
    return out


def _filter_jit_rows() -> list[Scenario]:
    """nbjit.filter_jit (a) against the ideal (b: jax.jit on pre-partitioned arrays),
    with equinox.filter_jit timed alongside (nbjit.bench.filter_cases)."""
    def case(sides: Callable[..., tuple], *args: Any) -> Callable[[], Case]:
        return lambda: Case(sides, (), sides=sides(*args))

    kind = "eqx Module step vs ideal"
    return [
        Scenario("filter_jit_mlp_step_depth_2", 3, kind, case(fc.mlp_step, 2), True,
                 needs="equinox"),
        Scenario("filter_jit_mlp_step_depth_8", 3, kind, case(fc.mlp_step, 8), True,
                 needs="equinox"),
        Scenario("filter_jit_static_fields_step", 3, kind + ", static fields",
                 case(fc.static_fields_step), True, needs="equinox"),
        Scenario("filter_jit_fresh_numpy_batch", 3, kind + ", new numpy batch",
                 case(fc.fresh_batch_step), True, needs="equinox"),
        Scenario("filter_jit_error_if_step", 3, kind + ", eqx.error_if",
                 case(fc.error_if_step), True, needs="equinox"),
    ]


_REGEX_ONLY = frozenset("^$|()+\\{}.")  # a pattern with any of these is a regex, not a glob


def select(matrix: Sequence[Scenario], pattern: str | None) -> list[Scenario]:
    """Scenarios whose name matches ``pattern``: a regular expression searched
    in the name (``host_array_fresh|workload_mnist``, ``args_1$``,
    ``^args_[12]$``), so a plain word matches as a substring; or, written
    with ``*`` or ``?`` and nothing else of a regular expression's syntax, a
    glob that the whole name matches (``jit_simple_*_10``). ValueError for a
    pattern that is neither."""
    if not pattern:
        return list(matrix)
    if any(ch in pattern for ch in "*?") and not any(ch in pattern for ch in _REGEX_ONLY):
        return [s for s in matrix if fnmatch.fnmatchcase(s.name, pattern)]
    try:
        regex = re.compile(pattern)
    except re.error as error:
        raise ValueError(f"--only {pattern!r} is not a regular expression ({error})") from None
    return [s for s in matrix if regex.search(s.name)]


def scenario(name: str) -> Scenario:
    """The scenario of the full matrix called ``name``; KeyError if there is none."""
    for s in scenarios():
        if s.name == name:
            return s
    raise KeyError(f"no scenario {name!r} (python -m nbjit compare --list shows them)")
