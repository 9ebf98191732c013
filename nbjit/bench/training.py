"""A training loop as researchers write it, timed per step and until each call returns.

An MLP with Adam's state (optax's `adam` when optax is importable, else
`hand_adam`: the same update, its state a namedtuple, so the row exists
without optax), a new numpy batch from a loader every step, and a wait for
the loss only every `BLOCK_EVERY` steps: calls return while computations
run, as with jax.jit (asynchronous dispatch). Two figures per contender:

  * **per step**: a segment of `STEPS` steps from the same starting
    parameters, waited for at its end, divided by its steps (what the loop's
    throughput is);
  * **until the call returns**: the mean time a call takes to return to the
    loop (what a loader, a logger or the next step waits for).

`time_loop` runs segments of every contender in paired rounds, rotating
which goes first (as `nbjit.bench.measure.interleave` does for calls), and
`loop_row` fills a compare `Row`: its ratio is the per-step one, and
``row.loop`` (additive in the JSON) holds the until-return figures and the
loop's shape. The losses of the first segment must be equal, bit for bit.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from nbjit.bench import measure

__all__ = ["BATCH", "BLOCK_EVERY", "LAYERS", "STEPS", "AdamState", "Loop", "LoopTiming",
           "hand_adam", "loop_row", "mlp_loop", "placed", "time_loop"]

LAYERS = (784, 128, 10)  # an MNIST-sized MLP: ~0.1M parameters, twice that in Adam's state
BATCH = 128
STEPS = 20  # steps per segment (per contender per round)
BLOCK_EVERY = 10  # the loop waits for its loss every this many steps


class AdamState(NamedTuple):
    """Adam's state as optax keeps it: the step count, first and second moments."""

    count: jax.Array  # type: ignore[assignment]  # (optax's name; shadows tuple.count)
    mu: Any
    nu: Any


def hand_adam(learning_rate: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
              ) -> tuple[Callable[[Any], AdamState], Callable[..., tuple[Any, AdamState]]]:
    """``(init, update)`` of Adam (optax's arithmetic), for a loop without optax."""
    def init(params: Any) -> AdamState:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return AdamState(jnp.zeros((), jnp.int32), zeros, zeros)

    def update(grads: Any, state: AdamState, params: Any = None) -> tuple[Any, AdamState]:
        count = state.count + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, grads)
        t = count.astype(jnp.float32)
        updates = jax.tree.map(
            lambda m, v: -learning_rate * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + eps),
            mu, nu)
        return updates, AdamState(count, mu, nu)

    return init, update


def _adam(learning_rate: float) -> tuple[Callable[[Any], Any], Callable[..., Any], str]:
    """optax's adam when optax imports, else `hand_adam`; and which, for the row's label."""
    try:
        import optax
    except ImportError:
        init, update = hand_adam(learning_rate)
        return init, update, "hand-written Adam (namedtuple state)"
    opt = optax.adam(learning_rate)
    return opt.init, opt.update, f"optax {getattr(optax, '__version__', '?')} adam"


@dataclass(frozen=True)
class Loop:
    """One training loop: ``step(params, state, x, y) -> (params, state, loss)``,
    where it starts, and the batches its loader copies from (each step gets a
    new array, as a loader makes one)."""

    step: Callable[..., Any]
    params: Any
    state: Any
    sources: tuple[tuple[np.ndarray, np.ndarray], ...]
    optimizer: str
    steps: int = STEPS
    block_every: int = BLOCK_EVERY
    offset: int = 16  # where each new array's data starts past a 64-byte boundary

    def loader(self) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
        """A new loader: every call gives a new (x, y), copies of the sources in
        turn, each in memory of its own `offset` bytes past a 64-byte boundary
        (jax.jit reads a 64-byte-aligned array in place and copies any other:
        an alignment left to chance would make the row bimodal)."""
        take = itertools.cycle(self.sources).__next__
        offset = self.offset

        def load() -> tuple[np.ndarray, np.ndarray]:
            x, y = take()
            return placed(x, offset), placed(y, offset)

        return load

    def label(self) -> str:
        return (f"MLP {'-'.join(map(str, LAYERS))}, {self.optimizer}, new numpy batch of"
                f" {BATCH} each step, waited every {self.block_every}")


def placed(x: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `x` in new memory, its data `offset` bytes past a 64-byte boundary."""
    buf = np.empty(x.nbytes + 64 + offset, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    out = buf[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


def mlp_loop(seed: int = 9, layers: Sequence[int] = LAYERS, batch: int = BATCH,
             offset: int = 16) -> Loop:
    """The loop of compare's ``workload_training_loop`` row: its batches' data
    `offset` bytes past a 64-byte boundary."""
    rng = np.random.default_rng(seed)
    params = {f"l{i}": {"w": jnp.asarray(rng.standard_normal((m, n)).astype(np.float32)
                                         * np.float32(np.sqrt(2 / m))),
                        "b": jnp.zeros(n, jnp.float32)}
              for i, (m, n) in enumerate(itertools.pairwise(layers))}
    init, update, optimizer = _adam(1e-3)
    depth = len(layers) - 1

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        h = x
        for i in range(depth):
            h = h @ p[f"l{i}"]["w"] + p[f"l{i}"]["b"]
            h = jax.nn.relu(h) if i < depth - 1 else h
        logp = jax.nn.log_softmax(h)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def step(p: Any, s: Any, x: jax.Array, y: jax.Array) -> tuple[Any, Any, jax.Array]:
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, s = update(grads, s, p)
        return jax.tree.map(lambda a, u: a + u, p, updates), s, value

    sources = tuple((placed(rng.standard_normal((batch, layers[0])).astype(np.float32), offset),
                     placed(rng.integers(0, layers[-1], batch).astype(np.int32), offset))
                    for _ in range(8))
    return Loop(step, params, init(params), sources, optimizer, offset=offset)


def run_segment(loop: Loop, jitted: Callable[..., Any], load: Callable[[], tuple]
                ) -> tuple[float, float, list[jax.Array]]:
    """One segment of `loop.steps` steps: (seconds per step, mean seconds until a
    call returned, the losses)."""
    clock = time.perf_counter
    p, s = loop.params, loop.state
    losses, returned = [], 0.0
    t0 = clock()
    for i in range(loop.steps):
        x, y = load()
        c0 = clock()
        p, s, value = jitted(p, s, x, y)
        returned += clock() - c0
        losses.append(value)
        if i % loop.block_every == loop.block_every - 1:
            value.block_until_ready()
    jax.block_until_ready((p, s))
    return (clock() - t0) / loop.steps, returned / loop.steps, losses


@dataclass(frozen=True)
class LoopTiming:
    """Per-round seconds of each contender (rows: rounds): per step and until return."""

    names: tuple[str, ...]
    per_step_s: np.ndarray  # (rounds, contenders)
    returned_s: np.ndarray  # (rounds, contenders)
    losses_equal: bool
    seconds: float

    def ratio(self, num: str, den: str, returned: bool = False) -> measure.Ratio:
        table = self.returned_s if returned else self.per_step_s
        i, j = self.names.index(num), self.names.index(den)
        return measure.Ratio.of(table[:, i] / table[:, j])

    def median_us(self, name: str, returned: bool = False) -> float:
        table = self.returned_s if returned else self.per_step_s
        return float(np.median(table[:, self.names.index(name)]) * 1e6)


def time_loop(loop: Loop, contenders: Sequence[tuple[str, Callable[..., Any]]],
              settings: measure.Settings) -> LoopTiming:
    """Segments of every contender in paired rounds, order rotating, gc off while
    one runs; first a warm-up segment each (compiles; host-input policies settle),
    whose losses are compared."""
    t0 = time.perf_counter()
    names = tuple(name for name, _ in contenders)
    first = []
    for _, jitted in contenders:
        for _ in range(2):
            losses = run_segment(loop, jitted, loop.loader())[2]
        first.append([np.asarray(v).tobytes() for v in losses])
    losses_equal = all(f == first[0] for f in first)
    per_step, returned = [], []
    n = len(contenders)
    for r in itertools.count():
        if r >= settings.rounds or (r >= settings.min_rounds
                                    and time.perf_counter() - t0 > settings.max_seconds):
            break
        step_row, return_row = [0.0] * n, [0.0] * n
        for k in range(n):
            i = (r + k) % n
            load = loop.loader()
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                step_row[i], return_row[i], _ = run_segment(loop, contenders[i][1], load)
            finally:
                if gc_was_enabled:
                    gc.enable()
        per_step.append(step_row)
        returned.append(return_row)
    return LoopTiming(names, np.array(per_step), np.array(returned), losses_equal,
                      time.perf_counter() - t0)


def loop_row(row: Any, loop: Loop, jit_a: Callable[..., Any], jit_b: Callable[..., Any],
             settings: measure.Settings, names: tuple[str, str] = ("nbjit", "jax.jit")) -> Any:
    """Fills compare's `row` (`nbjit.bench.runner.Row`) for `loop`: a = ``jit_a``,
    b = ``jit_b`` (called `names` in the note); the ratio per step, ``row.loop``
    the until-return figures."""
    timing = time_loop(loop, [("a", jit_a(loop.step)), ("b", jit_b(loop.step))], settings)
    step, back = timing.ratio("a", "b"), timing.ratio("a", "b", returned=True)
    row.a_us, row.b_us = timing.median_us("a"), timing.median_us("b")
    row.ratio, row.ratio_p10, row.ratio_p90 = step.median, step.p10, step.p90
    row.rounds = timing.per_step_s.shape[0]
    row.calls_per_batch = loop.steps
    row.seconds = timing.seconds
    row.loop = {
        "optimizer": loop.optimizer, "steps": loop.steps, "block_every": loop.block_every,
        "return_a_us": timing.median_us("a", returned=True),
        "return_b_us": timing.median_us("b", returned=True),
        "return_ratio": back.median, "return_p10": back.p10, "return_p90": back.p90,
        "losses_equal": timing.losses_equal,
    }
    a, b = names
    notes = [f"{loop.label()}; per step as the ratio; until the call returns: {a} "
             f"{row.loop['return_a_us']:.1f} us, {b} {row.loop['return_b_us']:.1f} us, "
             f"{a}/{b} {back.median:.3f} [{back.p10:.3f}-{back.p90:.3f}]"]
    if not timing.losses_equal:
        notes.insert(0, "LOSSES DIFFER")
    row.note = "; ".join(notes)
    return row
