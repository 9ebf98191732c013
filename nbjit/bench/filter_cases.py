"""`filter_jit` rows of the compare matrix: three contenders per step.

Each builder returns the `Case.sides` of one row (the matrix makes the Case):
the same equinox training step timed three ways:
``a`` nbjit.filter_jit(step)(model, x, y); ``b`` the ideal: jax.jit on
arrays partitioned beforehand (``eqx.partition`` outside the loop, the
static part closed over, ``eqx.combine`` inside), what a hand-tuned loop
pays; ``equinox`` equinox.filter_jit(step)(model, x, y). The row's ratio is
a / b; the note gives a / equinox. Rows need equinox: the runner skips them
where it is missing (`Scenario.needs`), and this module imports it only
when a case is built (equinox is an optional dependency).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from nbjit._jax import jax_jit  # upstream's own jit, as the rest of the lab

__all__ = ["error_if_step", "fresh_batch_step", "mlp_step", "static_fields_step"]

POOL = 16  # fresh batches per pool: no call repeats the previous call's values


def _eqx() -> Any:
    import equinox  # deferred: an optional dependency (the runner checks it first)

    return equinox


def _sgd(model: Any, x: Any, y: Any, check: bool = False) -> tuple[Any, Any]:
    eqx = _eqx()

    def loss(m: Any) -> Any:
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    if check:
        value = eqx.error_if(value, ~jnp.isfinite(value), "the loss is not finite")
    model = eqx.apply_updates(model, jax.tree_util.tree_map(lambda g: -0.01 * g, grads))
    return model, value


def _sides(step: Callable, model: Any, pool: list[tuple[Any, Any]]) -> tuple:
    """(name, callable, argument pool) of the three contenders on `step`."""
    from nbjit.filter import filter_jit

    eqx = _eqx()
    params, static = eqx.partition(model, eqx.is_array)

    def ideal_step(p: Any, x: Any, y: Any) -> tuple[Any, Any]:
        new_model, value = step(eqx.combine(p, static), x, y)
        return eqx.filter(new_model, eqx.is_array), value

    with_model = tuple((model, x, y) for x, y in pool)
    with_params = tuple((params, x, y) for x, y in pool)
    return (("a", filter_jit(step), with_model),
            ("b", jax_jit(ideal_step), with_params),
            ("equinox", eqx.filter_jit(step), with_model))


def _batches(numpy: bool, rows: int = 16, features: int = 8, out: int = 4) -> list:
    rng = np.random.default_rng(0)
    pool = [(rng.normal(size=(rows, features)).astype(np.float32),
             rng.normal(size=(rows, out)).astype(np.float32)) for _ in range(POOL)]
    if numpy:
        return pool
    return [(jnp.asarray(x), jnp.asarray(y)) for x, y in pool[:1]]


def mlp_step(depth: int) -> tuple:
    """An eqx.nn.MLP(8 -> 4, width 32, `depth`) SGD step on one batch of jax Arrays."""
    model = _eqx().nn.MLP(8, 4, 32, depth, key=jax.random.PRNGKey(0))
    return _sides(_sgd, model, _batches(False))


def fresh_batch_step() -> tuple:
    """The depth-2 MLP step with a new numpy batch each call."""
    model = _eqx().nn.MLP(8, 4, 32, 2, key=jax.random.PRNGKey(0))
    return _sides(_sgd, model, _batches(True))


def static_fields_step() -> tuple:
    """A Module with static fields (sizes, a name, activation functions) and a step."""
    eqx: Any = _eqx()

    class Block(eqx.Module):
        linear: Any
        activation: Callable = eqx.field(static=True)
        name: str = eqx.field(static=True)
        width: int = eqx.field(static=True)
        scale: float = 1.0  # a Python float field: a static leaf

        def __call__(self, x: Any) -> Any:
            return self.activation(self.linear(x)) * self.scale

    class Net(eqx.Module):
        blocks: tuple
        head: Any
        final: Callable

        def __call__(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return self.final(self.head(x))

    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    acts = (jax.nn.relu, jax.nn.tanh, jax.nn.gelu, jax.nn.silu)
    blocks = tuple(Block(eqx.nn.Linear(8, 8, key=k), act, f"block{i}", 8)
                   for i, (k, act) in enumerate(zip(keys[:4], acts, strict=True)))
    model = Net(blocks, eqx.nn.Linear(8, 4, key=keys[4]), jax.nn.sigmoid)
    return _sides(_sgd, model, _batches(False))


def _checked_sgd(model: Any, x: Any, y: Any) -> tuple[Any, Any]:
    return _sgd(model, x, y, check=True)


def error_if_step() -> tuple:
    """The depth-2 MLP step with an eqx.error_if check on the loss (every contender
    waits for its outputs: equinox and nbjit.filter_jit do for such a step)."""
    model = _eqx().nn.MLP(8, 4, 32, 2, key=jax.random.PRNGKey(0))
    return _sides(_checked_sgd, model, _batches(False))
