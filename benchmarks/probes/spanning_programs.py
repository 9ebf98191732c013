"""What a process-spanning program keeps of its source locations, and what
compiling it ahead costs a miss (docs/multi-controller.md, "One program").

    python benchmarks/probes/spanning_programs.py [--part locations cost] [--misses 40]

`locations`: a few programs (an MLP training step whose layers are helper
functions, a transformer-like block, `jnp.sum` jitted as it is, a shard_map
with a psum), each traced from five frames of a caller's, lowered once as
JAX lowers by default and once as nbjit lowers a process-spanning call
(`nbjit.multiprocess.program.compile_ahead`). Read from each compiled HLO's
stack-frame tables, per located instruction: the frames it keeps, whether its
innermost frame is the same in both, whether that is a line of the traced
function's file (its own or its helpers'), and how many instructions stand at
nbjit's boundary (no frame of the user's inside the function).

`cost`: `--misses` fresh small functions, each compiled by JAX's miss alone,
and each compiled ahead then run by JAX's miss (what a process-spanning miss
does besides the exchange), interleaved; the median per miss of both.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from nbjit import _jax  # noqa: E402
from nbjit.multiprocess import boundary, program  # noqa: E402

HERE = os.path.abspath(__file__)


def _dense(w, b, x):
    return jnp.tanh(x @ w + b)


def _mlp_loss(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = _dense(w, b, h)
    w, b = params[-1]
    return jnp.mean((h @ w + b - y) ** 2)


def _sgd_step(params, x, y):
    grads = jax.grad(_mlp_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


def _attention(q, k, v):
    scores = q @ k.T / np.sqrt(q.shape[-1])
    return jax.nn.softmax(scores, axis=-1) @ v


def _block(x, wq, wk, wv, wo):
    h = _attention(x @ wq, x @ wk, x @ wv) @ wo
    return jax.nn.relu(h + x)


def _programs() -> dict:
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    rng = np.random.default_rng(0)
    f32 = functools.partial(rng.standard_normal, dtype=np.float32)
    params = [(f32((16, 32)), f32(32)), (f32((32, 32)), f32(32)), (f32((32, 4)), f32(4))]
    return {
        "MLP SGD step (helpers)": (jax.jit(_sgd_step), (params, f32((8, 16)), f32((8, 4)))),
        "transformer-like block": (jax.jit(_block), (f32((8, 16)), *(f32((16, 16)),) * 4)),
        "jnp.sum as it is": (jax.jit(functools.partial(jnp.sum)), (f32((8, 4)),)),
        "shard_map psum": (jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh,
                                                 in_specs=P("x"), out_specs=P())),
                           (jax.device_put(f32((8, 4)), NamedSharding(mesh, P("x"))),)),
    }


def _deep(depth: int, call):
    """`call()` from `depth` frames of a caller's (a training script's loop, say)."""
    return call() if depth == 0 else _deep(depth - 1, call)


def _stacks(text: str) -> list[list[tuple[str, int]]]:
    """Per located instruction of an HLO text: its stack, innermost first, as
    (file, line) from the module's FileNames/FileLocations/StackFrames tables."""
    def table(name: str) -> dict[int, str]:
        block = re.search(rf"^{name}\n((?:\d+ .*\n)+)", text, re.MULTILINE)
        rows = block.group(1).splitlines() if block else []
        return {int(r.split(" ", 1)[0]): r.split(" ", 1)[1] for r in rows}

    files = {i: v.strip('"') for i, v in table("FileNames").items()}
    locations = {i: (files[int(re.search(r"file_name_id=(\d+)", v).group(1))],
                     int(re.search(r" line=(\d+)", v).group(1)))
                 for i, v in table("FileLocations").items()}
    # a frame's parent_frame_id is printed one past the parent's id (0: none)
    frames = {i: (int(re.search(r"file_location_id=(\d+)", v).group(1)),
                  int(re.search(r"parent_frame_id=(\d+)", v).group(1)) - 1)
              for i, v in table("StackFrames").items()}
    out = []
    for frame_id in map(int, re.findall(r"stack_frame_id=(\d+)", text)):
        stack, seen = [], set()
        while frame_id in frames and frame_id not in seen:
            seen.add(frame_id)
            location, parent = frames[frame_id]
            stack.append(locations[location])
            frame_id = parent
        out.append(stack)
    return out


def locations() -> None:
    boundary_file = boundary.run.__code__.co_filename
    print(f"{'program':24} {'instr':>5} {'frames/instr default':>21} {'nbjit':>6} "
          f"{'same innermost':>14} {'own file':>9} {'at boundary':>11}")
    for name, (jitted, args) in _programs().items():
        _jax.evict_traces(jitted)
        default = _deep(5, lambda: jitted.lower(*args).compile())  # noqa: B023
        default_text = _jax.executable_text(default._executable)
        _jax.evict_traces(jitted)
        ahead, _ = _deep(5, lambda: program.compile_ahead(jitted, args, {}))  # noqa: B023
        assert ahead is not None and ahead.compiled is not None
        ours, theirs = _stacks(ahead.hlo()), _stacks(default_text)
        same = sum(a[:1] == b[:1] for a, b in zip(ours, theirs, strict=False))
        own = sum(bool(s) and s[0][0] == HERE for s in ours)
        at_boundary = sum(bool(s) and s[0][0] == boundary_file for s in ours)
        depth = [len(s) for s in theirs] or [0]
        print(f"{name:24} {len(ours):5} {statistics.mean(depth):13.1f} (max {max(depth):2}) "
              f"{statistics.mean([len(s) for s in ours] or [0]):6.1f} "
              f"{same:>9}/{len(ours):<4} {own:>5}/{len(ours):<3} {at_boundary:>7}/{len(ours)}")


def cost(misses: int) -> None:
    plain, ahead = [], []
    x = jnp.ones((8, 4))
    for i in range(misses):
        for way, times in (("plain", plain), ("ahead", ahead))[:: 1 if i % 2 else -1]:
            jitted = jax.jit(lambda v, i=i: jnp.sum(jnp.tanh(v) * i))
            start = time.perf_counter()
            if way == "plain":
                jitted._cache_miss(x)
            else:
                compiled, _ = program.compile_ahead(jitted, (x,), {})
                assert compiled is not None
                compiled.run(functools.partial(jitted._cache_miss, x))
            times.append(time.perf_counter() - start)
    print(f"{misses} misses, median ms per miss: JAX's miss {1e3 * statistics.median(plain):.2f}, "
          f"compiled ahead then run {1e3 * statistics.median(ahead):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["locations", "cost"],
                        choices=["locations", "cost"])
    parser.add_argument("--misses", type=int, default=40)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, jaxlib {_jax.JAXLIB_VERSION}")
    if "locations" in args.part:
        locations()
    if "cost" in args.part:
        cost(args.misses)


if __name__ == "__main__":
    main()
