"""`python -m nbjit compare`: nbjit.jit against jax.jit, side by side, in one process.

The scenario matrix is a list of `Scenario` records. Each one's builder
returns a `Case` (the function, its arguments, the jit options); the runner
wraps the same function with both dispatchers, checks that they agree on the
outputs, and times them interleaved (see `nbjit._measure`) together with the
*floor*: the executable's own execute + output handling, called from Python,
which no Python dispatcher can beat.

Scenarios whose case has an ``arg_pool`` pass new host values on every call
(the loops people write: a training step with a fresh batch, an environment
step with a fresh action). `compare` runs the same machinery on a user's own
function and inputs (``nbjit.compare``); the asv suite builds its benchmarks
from `scenarios` too.

matplotlib is imported only when a plot is asked for, so `import nbjit` never
imports it. Multi-device scenarios need 8 devices: the CLI asks for them
(`nbjit._devices.request_host_devices`) before JAX's backend starts; where
fewer devices exist they are skipped with a note.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import functools
import itertools
import json
import operator
import os
import platform
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np

from nbjit import _measure

# Upstream's own jit, captured where JAX defines it: users rebind the public
# name (`jax.jit = nbjit.jit`), and a comparison against that would compare
# nbjit with itself.
from nbjit._jax import jax_jit

SELF_CHECK_BAND = (0.9, 1.1)

# ---------------------------------------------------------------------------
# Scenarios


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
# numpy array in place (no copy: ~2 us less per small input) and copies any
# other; numpy places 1 in 4 arrays up to ~1 MB on a 64-byte boundary (and
# large mmap'd ones almost never), so with fresh arrays a row's jax.jit time
# changed between builds (numpy_args_2 read 1.04 or 1.14 by chance). Every
# numpy input here sits 16 bytes past a 64-byte boundary: the usual case.
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
        xs = jax_jit(fun, **opts)([x] * n)
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
        Scenario("workload_optimizer_update", 401, "2x200 leaves + new lr", _optimizer_case,
                 False),
        Scenario("workload_env_step", 5, "3-array state + new int, float", _env_step_case,
                 False),
        Scenario("workload_static_config", 3, "static config/kw + new numpy",
                 _static_config_case, False),
        Scenario("workload_data_parallel_8_devices", 4, "new numpy batch -> 8 devices",
                 _data_parallel_case, False, min_devices=8),
    ]
    return out


def select(matrix: Sequence[Scenario], pattern: str | None) -> list[Scenario]:
    """Scenarios whose name matches ``pattern``: a glob if it has ``*?[``, else a substring."""
    if not pattern:
        return list(matrix)
    if any(ch in pattern for ch in "*?["):
        return [s for s in matrix if fnmatch.fnmatchcase(s.name, pattern)]
    return [s for s in matrix if pattern in s.name]


# ---------------------------------------------------------------------------
# Running


@dataclass
class Row:
    name: str
    n_args: int
    kind: str
    block: bool
    family: str | None
    origin: str
    a_us: float | None = None  # nbjit (or jax.jit "A" in the self-check)
    b_us: float | None = None  # jax.jit
    floor_us: float | None = None
    ratio: float | None = None  # median of per-round a/b
    ratio_p10: float | None = None
    ratio_p90: float | None = None
    rounds: int = 0
    calls_per_batch: int = 0
    seconds: float = 0.0
    note: str = ""


Jit = Callable[..., Callable[..., Any]]


def _fresh_copy(fun: Callable[..., Any]) -> Callable[..., Any]:
    if isinstance(fun, types.FunctionType):
        return types.FunctionType(
            fun.__code__, fun.__globals__, fun.__name__, fun.__defaults__, fun.__closure__
        )
    return functools.partial(fun)


def _blocker(out: Any) -> Callable[[Any], Any]:
    if isinstance(out, jax.Array):
        return type(out).block_until_ready  # the concrete class's method: no lookup per call
    return jax.block_until_ready


def _caller(jitted: Callable[..., Any], case: Case, block: bool) -> Callable[[], Any]:
    """A zero-argument call of ``jitted`` with the case's inputs, as cheap as Python allows."""
    args, kwargs = case.args, case.kwargs
    if case.arg_pool:
        take = itertools.cycle(case.arg_pool).__next__
        call = (lambda: jitted(*take(), **kwargs)) if kwargs else (lambda: jitted(*take()))
    else:
        call = (lambda: jitted(*args, **kwargs)) if kwargs else (lambda: jitted(*args))
    if not block:
        return call
    blk = _blocker(call())
    return lambda: blk(call())


def _fresh_caller(jit: Jit, case: Case, block: bool) -> Callable[[], Any]:
    fun, opts, args, kwargs = case.fun, case.jit_options, case.args, case.kwargs

    def call():
        return jit(_fresh_copy(fun), **opts)(*args, **kwargs)

    if not block:
        return call
    blk = _blocker(call())
    return lambda: blk(call())


def output_difference(x: Any, y: Any) -> str | None:
    """Why two call results differ (structure, dtype, weak type, sharding, values), or None."""
    lx, tx = jax.tree.flatten(x)
    ly, ty = jax.tree.flatten(y)
    if tx != ty:
        return f"tree structure {tx} != {ty}"
    for i, (u, v) in enumerate(zip(lx, ly, strict=True)):
        for attr in ("dtype", "weak_type", "sharding"):
            if getattr(u, attr, None) != getattr(v, attr, None):
                return f"leaf {i}: {attr} {getattr(u, attr, None)} != {getattr(v, attr, None)}"
        if not np.array_equal(np.asarray(u), np.asarray(v)):
            return f"leaf {i}: values differ"
    return None


def first_difference(f_a: Callable[..., Any], f_b: Callable[..., Any], case: Case
                     ) -> str | None:
    """How the two sides' outputs differ on the case's inputs, or None.

    A new-values case is checked on its first three argument tuples, so a
    side that reuses an earlier call's values shows.
    """
    for args in case.arg_pool[:3] or (case.args,):
        diff = output_difference(f_a(*args, **case.kwargs), f_b(*args, **case.kwargs))
        if diff:
            return diff
    return None


def run_scenario(
    scenario: Scenario,
    jit_a: Jit,
    jit_b: Jit,
    settings: _measure.Settings,
    floor_jit: Jit | None = None,
    floor_call: Callable[..., Callable[[], Any]] | None = None,
) -> Row:
    """Build, check and time one scenario: A = ``jit_a``, B = ``jit_b``, plus the floor."""
    row = Row(scenario.name, scenario.n_args, scenario.kind, scenario.block, scenario.family,
              scenario.origin)
    if len(jax.devices()) < scenario.min_devices:
        row.note = f"skipped: needs {scenario.min_devices} devices, have {len(jax.devices())}"
        return row
    case = scenario.build()
    notes = []
    if case.fresh_function:
        call_a = _fresh_caller(jit_a, case, scenario.block)
        call_b = _fresh_caller(jit_b, case, scenario.block)
        f_a = jit_a(case.fun, **case.jit_options)
        f_b = jit_b(case.fun, **case.jit_options)
    else:
        f_a = jit_a(case.fun, **case.jit_options)
        f_b = jit_b(case.fun, **case.jit_options)
        call_a = _caller(f_a, case, scenario.block)
        call_b = _caller(f_b, case, scenario.block)
    diff = first_difference(f_a, f_b, case)
    if diff:
        notes.append(f"OUTPUTS DIFFER: {diff}"[:160])
    contenders = [("a", call_a), ("b", call_b)]
    if floor_call is not None and floor_jit is not None and not case.fresh_function:
        try:
            target = f_a if floor_jit is jit_a else floor_jit(case.fun, **case.jit_options)
            target(*case.args, **case.kwargs)
            floor = floor_call(target, *case.args, **case.kwargs)
            if scenario.block:
                blk = _blocker(floor())
                contenders.append(("floor", lambda: blk(floor())))
            else:
                contenders.append(("floor", floor))
        except Exception as exc:  # the floor is best effort; the comparison is not
            notes.append(f"no floor: {type(exc).__name__}: {exc}"[:120])
    result = _measure.interleave(contenders, settings, sync=jax.block_until_ready,
                                 sync_each=scenario.sync_each)
    ratio = result.ratio("a", "b")
    row.a_us = result.median_us("a")
    row.b_us = result.median_us("b")
    if "floor" in result.names:
        row.floor_us = result.median_us("floor")
    row.ratio, row.ratio_p10, row.ratio_p90 = ratio.median, ratio.p10, ratio.p90
    row.rounds = result.per_call_s.shape[0]
    row.calls_per_batch = result.calls_per_batch
    row.seconds = result.seconds
    row.note = "; ".join(notes)
    return row


class Progress:
    """A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 28) -> None:
        self.total, self.width = total, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()

    def update(self, done: int, label: str) -> None:
        elapsed = time.perf_counter() - self.start
        eta = elapsed / done * (self.total - done) if done else float("nan")
        filled = int(self.width * done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        eta_s = f"eta {eta:4.0f}s" if done else "eta    ?"
        line = f"[{bar}] {done:>3}/{self.total} {elapsed:5.0f}s {eta_s}  {label}"
        if self.tty:
            self.stream.write("\r" + line[:118].ljust(118))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def run(
    matrix: Sequence[Scenario],
    settings: _measure.Settings,
    self_check: bool = False,
    progress: bool = True,
    stream: TextIO | None = None,
) -> tuple[list[Row], dict[str, Any]]:
    """Run the matrix; return the rows and the run's metadata."""
    import nbjit
    from nbjit.dispatch import floor_call

    jit_a, label_a = (jax_jit, "jax.jit (A)") if self_check else (nbjit.jit, "nbjit")
    bar = Progress(len(matrix), stream) if progress else None
    rows = []
    t0 = time.perf_counter()
    for i, scenario in enumerate(matrix):
        if bar:
            bar.update(i, scenario.name)
        rows.append(run_scenario(scenario, jit_a, jax_jit, settings, nbjit.jit, floor_call))
    if bar:
        bar.update(len(matrix), "done")
        bar.close()
    meta = metadata(settings, self_check, label_a)
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    return rows, meta


def _git_commit() -> str | None:
    """HEAD's short hash, with ``+dirty`` when nbjit/ has uncommitted changes."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() if out.returncode == 0 else ""

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", here)
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) if head else None


def metadata(settings: _measure.Settings, self_check: bool, label_a: str,
             notes: Sequence[str] = ()) -> dict[str, Any]:
    import jaxlib
    import numba

    import nbjit

    devices = jax.devices()
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "a": label_a,
        "b": "jax.jit",
        "self_check": self_check,
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "numba": numba.__version__,
            "numpy": np.__version__,
            "nbjit": getattr(nbjit, "__version__", None),
            "nbjit_commit": _git_commit(),
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
            "backend": devices[0].platform,
            "devices": len(devices),
        },
        "settings": asdict(settings),
        "notes": list(notes),
    }


# ---------------------------------------------------------------------------
# Reporting


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(rows: Sequence[Row], meta: dict[str, Any]) -> str:
    """The fixed-width table the CLI prints (and docs/compare.md shows)."""
    a = meta.get("a", "nbjit")
    a_col = "nbjit us" if a == "nbjit" else "A us"
    head = ("scenario", "n", "inputs", a_col, "jax.jit us", "floor us", "ratio", "p10-p90")
    body = []
    for r in rows:
        spread = "-" if r.ratio is None else f"{r.ratio_p10:.2f}-{r.ratio_p90:.2f}"
        body.append((r.name, str(r.n_args), r.kind, _fmt(r.a_us), _fmt(r.b_us),
                     _fmt(r.floor_us), _fmt(r.ratio, 2), spread))
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head)]
    right = {1, 3, 4, 5, 6, 7}

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    v = meta.get("versions", {})
    m = meta.get("machine", {})
    out = [
        f"{a} vs jax.jit, {meta.get('date', '')}: nbjit {v.get('nbjit_commit') or '?'}, "
        f"jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, numba {v.get('numba')}, "
        f"Python {v.get('python')}; {m.get('backend')} x{m.get('devices')} devices, "
        f"{m.get('cpus')} CPUs",
        f"ratio = {a} / jax.jit per call (median of paired rounds; < 1: {a} is faster); "
        "floor = execute + output handlers only",
        "",
        line(head),
        line(tuple("-" * w for w in widths)),
    ]
    out += [line(b) for b in body]
    for r in rows:
        if r.note:
            out.append(f"  note: {r.name}: {r.note}")
    for note in meta.get("notes", ()):
        out.append(f"  note: {note}")
    return "\n".join(out)


def self_check_failures(rows: Sequence[Row], band: tuple[float, float] = SELF_CHECK_BAND
                        ) -> list[Row]:
    """Rows whose median ratio lies outside ``band`` (skipped rows are not failures)."""
    return [r for r in rows if r.ratio is not None and not band[0] <= r.ratio <= band[1]]


def write_json(path: str, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1)
        f.write("\n")


def read_json(path: str) -> tuple[list[Row], dict[str, Any]]:
    with open(path) as f:
        data = json.load(f)
    return [Row(**r) for r in data["rows"]], data["meta"]


PLOT_FAMILIES = ("positional args dispatch", "pruned args dispatch", "many args (list) dispatch")


def plot(path: str, rows: Sequence[Row], meta: dict[str, Any]) -> None:
    """Two panels: the ratio per scenario, and time against number of arguments."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    timed = [r for r in rows if r.ratio is not None]
    a = meta.get("a", "nbjit")
    fig, (ax0, ax1) = plt.subplots(
        1, 2, figsize=(14, max(4.5, 0.26 * len(timed) + 1.6)), width_ratios=(1.1, 1)
    )
    y = np.arange(len(timed))
    med = np.array([r.ratio for r in timed])
    err = (med - np.array([r.ratio_p10 for r in timed]),
           np.array([r.ratio_p90 for r in timed]) - med)
    colors = ["tab:green" if m < 1 else "tab:red" for m in med]
    ax0.errorbar(med, y, xerr=err, fmt="none", ecolor="0.55", capsize=2, lw=1)
    ax0.scatter(med, y, c=colors, zorder=3, s=22)
    ax0.axvline(1.0, color="k", lw=1)
    ax0.set_xscale("log")
    ax0.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ticks = [t for t in (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8)
             if ax0.get_xlim()[0] <= t <= ax0.get_xlim()[1]]
    ax0.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax0.set_yticks(y, [r.name for r in timed], fontsize=7)
    ax0.set_ylim(len(timed) - 0.5, -0.5)
    ax0.set_xlabel(f"{a} / jax.jit per call: median of paired rounds, bar p10-p90 (< 1: faster)")
    ax0.set_title("ratio per scenario")
    ax0.grid(True, axis="x", which="both", alpha=0.3)

    impl_style = {"a": ("tab:blue", "o", a), "b": ("tab:orange", "s", "jax.jit"),
                  "floor": ("0.45", "^", "floor")}
    family_style = dict(zip(PLOT_FAMILIES, ("-", "--", ":"), strict=True))
    for fam, ls in family_style.items():
        fr = sorted((r for r in timed if r.family == fam), key=lambda r: r.n_args)
        if not fr:
            continue
        n = [r.n_args for r in fr]
        for key, (color, marker, label) in impl_style.items():
            vals = [getattr(r, f"{key}_us") for r in fr]
            if any(v is None for v in vals):
                continue
            ax1.plot(n, vals, ls=ls, marker=marker, color=color, label=f"{label}: {fam}")
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("number of arguments (leaves)")
    ax1.set_ylabel("us per call (median)")
    ax1.set_title("time against number of arguments (dispatch, no waiting)")
    ax1.grid(True, which="both", alpha=0.3)
    if ax1.lines:
        ax1.legend(fontsize=7)
    v = meta.get("versions", {})
    fig.suptitle(
        f"{a} vs jax.jit, {meta.get('date', '')}; jax {v.get('jax')}, jaxlib {v.get('jaxlib')}, "
        f"numba {v.get('numba')}, Python {v.get('python')}; "
        f"{meta.get('machine', {}).get('cpus')} CPUs (shared)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------
# nbjit.compare: the same measurement on the user's own function and inputs

#: How `compare` measures: 101 paired rounds of ~10 ms batches, at most ~3 s.
USER_SETTINGS = _measure.Settings(rounds=101, min_rounds=5, max_seconds=3.0)


class OutputsDiffer(AssertionError):
    """nbjit.jit(fun) and jax.jit(fun) returned different outputs for the same call."""


@dataclass(frozen=True)
class CompareResult:
    """nbjit.jit(fun) against jax.jit(fun) on one call, timed by `nbjit.compare`.

    ``ratio`` is the median of the per-round ratios nbjit/jax.jit (< 1: nbjit
    is faster) and ``p10``-``p90`` their spread. ``jax_us`` is jax.jit's
    median time per call and ``nbjit_us`` is ``ratio * jax_us``: the paired
    ratio is the measurement (absolute times drift between rounds on a busy
    machine), and the three numbers agree. ``floor_us`` is the executable's
    own execute + output handling called from Python (None when the call has
    no fast path), which no Python dispatcher can beat.
    """

    name: str
    ratio: float
    nbjit_us: float
    jax_us: float
    floor_us: float | None
    p10: float
    p90: float
    rounds: int
    calls_per_batch: int

    def __str__(self) -> str:
        floor = "-" if self.floor_us is None else f"{self.floor_us:.3g} us"
        return (f"{self.name}: nbjit {self.nbjit_us:.3g} us, jax.jit {self.jax_us:.3g} us, "
                f"floor {floor}; ratio {self.ratio:.3g} (p10-p90 {self.p10:.3g}-{self.p90:.3g}, "
                f"{self.rounds} paired rounds of {self.calls_per_batch} calls)")

    def _repr_html_(self) -> str:
        floor = "-" if self.floor_us is None else f"{self.floor_us:.3g}"
        cells = (self.name, f"{self.nbjit_us:.3g}", f"{self.jax_us:.3g}", floor,
                 f"{self.ratio:.3g}", f"{self.p10:.3g}-{self.p90:.3g}", str(self.rounds))
        head = ("function", "nbjit us", "jax.jit us", "floor us", "ratio", "p10-p90", "rounds")
        import html

        row = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
        return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head)
                + f"</tr></thead><tbody><tr>{row}</tr></tbody></table>"
                "<p>ratio = nbjit / jax.jit per call, median of paired rounds (&lt; 1: nbjit "
                "is faster); floor = execute + output handlers only</p>")

    def plot(self, path: str) -> None:
        """A PNG: microseconds per call of nbjit, jax.jit and the floor, with the ratio."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = ["nbjit", "jax.jit"] + ([] if self.floor_us is None else ["floor"])
        values = [self.nbjit_us, self.jax_us] + ([] if self.floor_us is None else
                                                 [self.floor_us])
        fig, ax = plt.subplots(figsize=(6, 2.6))
        ax.barh(labels, values, color=["tab:blue", "tab:orange", "0.6"][:len(values)])
        low, high = self.p10 * self.jax_us, self.p90 * self.jax_us
        ax.errorbar([self.nbjit_us], [0], xerr=[[self.nbjit_us - low], [high - self.nbjit_us]],
                    fmt="none", ecolor="k", capsize=3, lw=1)
        ax.invert_yaxis()
        ax.set_xlabel("us per call (nbjit bar: p10-p90 of the paired ratio)")
        ax.set_title(f"{self.name}: nbjit / jax.jit = {self.ratio:.3g} "
                     f"(p10-p90 {self.p10:.3g}-{self.p90:.3g})", fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def compare(fun: Callable[..., Any], *args: Any, jit_kwargs: dict[str, Any] | None = None,
            **kwargs: Any) -> CompareResult:
    """Time ``nbjit.jit(fun, **jit_kwargs)`` against ``jax.jit(fun, **jit_kwargs)`` on ``args``.

    The method of ``python -m nbjit compare``: both are called once and their
    outputs must agree (values, dtype, weak type, sharding, tree structure),
    else `OutputsDiffer` is raised; then they run in interleaved paired
    rounds with the floor, and the result holds the median ratio and its
    spread. Each call is timed until it is dispatched, not until its outputs
    are ready (as a loop that does not wait sees it). Takes about 3 s.
    """
    import nbjit
    from nbjit.dispatch import floor_call

    options = dict(jit_kwargs or {})
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or repr(fun)
    case = Case(fun, args, kwargs, options)
    diff = first_difference(nbjit.jit(fun, **options), jax_jit(fun, **options), case)
    if diff:
        raise OutputsDiffer(f"nbjit.jit({name}) and jax.jit({name}) return different outputs "
                            f"for these inputs ({diff}); nothing was timed. Please report it "
                            "with the inputs: nbjit must give jax.jit's outputs.")
    scenario = Scenario(name, len(jax.tree.leaves((args, kwargs))), "user", lambda: case,
                        block=False)
    row = run_scenario(scenario, nbjit.jit, jax_jit, USER_SETTINGS, nbjit.jit, floor_call)
    assert row.ratio is not None and row.b_us is not None
    return CompareResult(name, row.ratio, row.ratio * row.b_us, row.b_us, row.floor_us,
                         row.ratio_p10, row.ratio_p90, row.rounds, row.calls_per_batch)
