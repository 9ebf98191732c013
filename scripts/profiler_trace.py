"""A small training loop under jax.profiler, for docs/profiler.md.

    python scripts/profiler_trace.py LOGDIR            # writes the trace
    python scripts/profiler_trace.py LOGDIR --serve 6006  # then serves it in XProf

The loop: an MLP's train step under `nbjit.jit` and its evaluation under
`jax.jit`, traced in two sessions: "last_batch" (a smaller batch: a miss,
its span named for what changed; a step under `jax.disable_jit()`: a slow
call; the evaluation) and "steady" (three steps: hits). The first session
also builds the train step's traced binder (its first call in any session
does), so the second shows hits as they run from then on.

`--serve` starts XProf (`pip install xprof`, the TensorBoard profile
plugin's standalone server) on 127.0.0.1 only; open
``http://127.0.0.1:PORT/`` and pick the Trace Viewer tool.
"""

from __future__ import annotations

import argparse
import pathlib

import jax
import jax.numpy as jnp

import nbjit


def init(key: jax.Array, sizes: tuple[int, ...]) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(key, len(sizes) - 1)
    return [{"w": jax.random.normal(k, (m, n)) / m ** 0.5, "b": jnp.zeros(n)}
            for k, m, n in zip(keys, sizes[:-1], sizes[1:], strict=True)]


def loss(params: list, x: jax.Array, y: jax.Array) -> jax.Array:
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    out = x @ params[-1]["w"] + params[-1]["b"]
    return jnp.mean((out - y) ** 2)


@nbjit.jit
def train_step(params: list, x: jax.Array, y: jax.Array) -> tuple[list, jax.Array]:
    value, grads = jax.value_and_grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value


evaluate = jax.jit(loss)  # jax.jit beside nbjit: both show PjitFunction(<name>)


def _options(session: str) -> jax.profiler.ProfileOptions:
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # host spans only: no span per Python function
    options.session_id = session  # the session's name in the viewer
    return options


def run(logdir: pathlib.Path) -> None:
    """Two sessions: "last_batch" (a miss, a slow call, jax.jit beside) and "steady" (hits)."""
    key = jax.random.key(0)
    params = init(key, (32, 64, 64, 1))
    x, y = jax.random.normal(key, (128, 32)), jnp.ones((128, 1))
    params, _ = train_step(params, x, y)  # compiled before the traces
    evaluate(params, x, y).block_until_ready()
    with jax.profiler.trace(str(logdir), create_perfetto_trace=True,
                            profiler_options=_options("last_batch")):
        train_step(params, x[:96], y[:96])  # a smaller batch: a miss
        with jax.disable_jit():
            train_step(params, x[:8], y[:8])  # a slow call
        evaluate(params, x, y).block_until_ready()
    with jax.profiler.trace(str(logdir), create_perfetto_trace=True,
                            profiler_options=_options("steady")):
        for step in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                params, value = train_step(params, x, y)
        value.block_until_ready()
    print(f"loss {float(value):.4f}; traces under {logdir}")


def serve(logdir: pathlib.Path, port: int) -> None:
    """XProf's standalone server, bound to 127.0.0.1 (its own `xprof` command binds
    every interface)."""
    from xprof import server  # deferred: the viewer is not a dependency of nbjit

    context = server.TBContext(str(logdir), server.DataProvider(str(logdir)),
                               server.TBContext.Flags(False))
    context.hide_capture_profile_button = False
    context.enable_tab_name_label = False
    context.src_prefix = None
    plugin = server.ProfilePluginLoader().load(context)
    server.run_server(plugin, "127.0.0.1", port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=pathlib.Path)
    parser.add_argument("--serve", type=int, metavar="PORT", help="serve the trace in XProf")
    args = parser.parse_args()
    run(args.logdir)
    if args.serve:
        serve(args.logdir, args.serve)


if __name__ == "__main__":
    main()
