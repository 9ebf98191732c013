"""A training loop with a new numpy batch each step: nbjit.jit against jax.jit.

    python benchmarks/training_loop.py [--batches 128 1024] [--rounds 9] [--steps 100]
                                       [--widths 512] [--json FILE]

An MLP 784-W-W-10 (W: each of --widths, 512 by default) with plain SGD; each
step takes a new (x, y) numpy batch from a pool of 8 (as a loader hands them
out) and nothing blocks until the end of a round. Three contenders run in
rotating rounds in one process: nbjit.jit, jax.jit, and jax.jit on copies the
loop makes of each batch before the call (``f(p, x.copy(), y.copy())``: what
a jax.jit user writes so that a loader reusing its buffers cannot change a
result, the guarantee nbjit gives). Per batch size it prints the per-step
ratio nbjit / jax.jit (median and p10-p90 of the rounds), the ratio of the
time until each call returns, nbjit against jax.jit on copies, whether the
losses are equal, and the host-inputs line of nbjit's stats.

Then the write-right-after-the-call check: a numpy input (8 KiB to 25 MiB)
is overwritten right after each call while a slow computation keeps the
device busy; it counts, for each function, the results that changed (60
calls each). jax.jit reads the caller's array after the call returns on an
accelerator (and uses it in place on the CPU when it is 64-byte aligned);
nbjit never does.

Runs on any backend (the TPU figures in docs/host-inputs.md and
docs/performance.md come from it).
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import nbjit
from nbjit.bench.runner import git_commit

COPIES = "jax.jit, copies"  # jax.jit on copies the loop makes of each batch before the call


def init(key, sizes):
    params = []
    for m, n in zip(sizes[:-1], sizes[1:], strict=True):
        key, k = jax.random.split(key)
        params.append((jax.random.normal(k, (m, n)) * np.sqrt(2 / m), jnp.zeros(n)))
    return params


def loss_fn(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    w, b = params[-1]
    logits = h @ w + b
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


def step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss


def loop(batch: int, rounds: int, steps: int, width: int = 512) -> dict:
    rng = np.random.default_rng(0)
    pool = [(rng.standard_normal((batch, 784), np.float32),
             rng.integers(0, 10, batch).astype(np.int32)) for _ in range(8)]
    params0 = init(jax.random.PRNGKey(0), (784, width, width, 10))
    jitted = jax.jit(step)
    fs = {"jax.jit": jitted, "nbjit": nbjit.jit(step),
          COPIES: lambda p, x, y: jitted(p, x.copy(), y.copy())}

    def run(f, n):
        p, losses, calls = params0, [], 0.0
        t0 = time.perf_counter()
        for i in range(n):
            x, y = pool[i % len(pool)]
            c0 = time.perf_counter()
            p, loss = f(p, x, y)
            calls += time.perf_counter() - c0
            losses.append(loss)
        jax.block_until_ready((p, losses))
        return (time.perf_counter() - t0) / n, calls / n, [float(v) for v in losses]

    for f in fs.values():  # compile, and let nbjit's host inputs settle
        run(f, 40)
    same = run(fs["jax.jit"], steps)[2] == run(fs["nbjit"], steps)[2]
    per: dict = {k: [] for k in fs}
    ret: dict = {k: [] for k in fs}
    gc.disable()
    try:
        names = list(fs)
        for r in range(rounds):
            for k in names[r % 3:] + names[:r % 3]:
                s, c, _ = run(fs[k], steps)
                per[k].append(s)
                ret[k].append(c)
    finally:
        gc.enable()
    ratio = np.array(per["nbjit"]) / np.array(per["jax.jit"])
    call_ratio = np.array(ret["nbjit"]) / np.array(ret["jax.jit"])
    over_copies = np.array(per["nbjit"]) / np.array(per[COPIES])
    host_line = [line for line in str(fs["nbjit"].stats()).splitlines()
                 if line.startswith("host inputs")]
    return {
        "batch": batch,
        "width": width,
        "jax_step_us": round(float(np.median(per["jax.jit"])) * 1e6, 1),
        "nbjit_step_us": round(float(np.median(per["nbjit"])) * 1e6, 1),
        "step_ratio": round(float(np.median(ratio)), 3),
        "step_p10_p90": [round(float(v), 3) for v in np.percentile(ratio, [10, 90])],
        "jax_call_us": round(float(np.median(ret["jax.jit"])) * 1e6, 1),
        "nbjit_call_us": round(float(np.median(ret["nbjit"])) * 1e6, 1),
        "call_ratio": round(float(np.median(call_ratio)), 3),
        "copies_step_us": round(float(np.median(per[COPIES])) * 1e6, 1),
        "over_copies": round(float(np.median(over_copies)), 3),
        "over_copies_p10_p90": [round(float(v), 3) for v in np.percentile(over_copies, [10, 90])],
        "losses_equal": same,
        "host_inputs": host_line[0] if host_line else None,
    }


def writes_after_the_call(calls_per_size: int = 12) -> dict:
    fn = lambda a: jnp.sum(jnp.sin(a) * 2.0)  # noqa: E731
    fs = {"jax.jit": jax.jit(fn), "nbjit": nbjit.jit(fn)}
    busy = jax.jit(lambda a: jnp.linalg.matrix_power(a, 40))
    big = jnp.eye(1024) * 1.0001
    changed = dict.fromkeys(fs, 0)
    calls = 0
    for n in (2048, 16384, 262144, 1 << 20, 25 << 18):  # 8 KiB .. 25 MiB of float32
        want = float(fs["jax.jit"](np.full(n, 1.0, np.float32)))
        for _ in range(calls_per_size):
            for name, f in fs.items():
                x = np.full(n, 1.0, np.float32)
                pending = busy(big)
                out = f(x)
                x[:] = 5.0
                jax.block_until_ready(pending)
                changed[name] += float(out) != want
            calls += 1
    return {"calls": calls, "changed": changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--widths", type=int, nargs="+", default=[512],
                        help="hidden widths (4096 makes the step device-bound on a TPU v5e)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    device = jax.devices()[0]
    out = {"jax": jax.__version__, "device": f"{device.platform} {device.device_kind}",
           "loops": [], "writes_after_the_call": None, "commit": git_commit() or "?",
           "command": shlex.join(["python3", "benchmarks/training_loop.py", *sys.argv[1:]])}
    for width in args.widths:
        for batch in args.batches:
            row = loop(batch, args.rounds, args.steps, width)
            out["loops"].append(row)
            print(json.dumps(row), flush=True)
    out["writes_after_the_call"] = writes_after_the_call()
    print(json.dumps(out["writes_after_the_call"]), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
