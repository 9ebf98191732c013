"""Probe: a small host leaf's private copy on an accelerator, a new array each
call or a buffer of a staging ring (`StagingRing`, nbjit's way), against
jax.jit (run on a TPU or GPU; the CPU only to try it).

    python benchmarks/probes/small_copies.py [--calls N] [--rounds R] [--steps S]
        [--ways nbjit,nbjit streamed,...] [--json FILE]

Variants, each a jit of its own function object (two nbjit jits of one
function share a record): jax.jit on the caller's arrays (racy); nbjit
(every staged leaf copied into its ring); nbjit with each staged leaf's copy
a new array (`FreshCopies` below, patched into the strategy while the
record is built), and the same into 64-byte-aligned arrays (a ring's
alignment); nbjit with every ring's copies streamed (non-temporal stores,
`STREAM_MIN_BYTES` 0 while the record is built); nbjit on read-only arrays.
Cases: two float32[8] added
(compare's new-value rows), one float32 leaf of 16, 64, 128 and 256 KiB
summed with a device parameter, each call a new value from a pool, no block
until a round ends, rounds interleaved; us a call and the median ratio to
jax.jit. Then whole no-block runs of the transformer block of
`tests/test_accel_loops.py` (32x128 int32 tokens and targets, 32 KB a
step), warm-up excluded, ratio to jax.jit, losses compared.
"""

# ruff: noqa: B023  (each variant's lambda runs within its own case's iteration)

from __future__ import annotations

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import nbjit
from nbjit import _jax
from nbjit.core.inputs import platforms, staging, stream
from nbjit.core.inputs.pools import aligned_empty
from nbjit.core.inputs.staging import immutable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
import test_accel_loops as models  # noqa: E402  (the test's models, sized for the backend)
from _rounds import interleaved  # noqa: E402


class FreshCopies:
    """A new array each call for a leaf's private copy (`aligned`: 64-byte
    aligned, as a ring's buffers are)."""

    def __init__(self, dtype, aligned):
        self.dtype, self.aligned = np.dtype(dtype), aligned

    def stage(self, x):
        if x.dtype == self.dtype and not x.flags.writeable and immutable(x):
            return x
        if not self.aligned:
            return x.copy() if x.dtype == self.dtype else x.astype(self.dtype, order="C")
        buffer = aligned_empty(x.size * self.dtype.itemsize).view(self.dtype).reshape(x.shape)
        np.copyto(buffer, x, casting="unsafe")
        return buffer

    def stage_scalar(self, x):
        return np.array(x, self.dtype)


def fresh_transfer(aligned):
    """`Staged.host_transfer` with a new array for each private copy."""
    def host_transfer(self, aval, sharding):
        dtype = np.dtype(aval.dtype)
        if aval.size * dtype.itemsize >= self.DIRECT_MIN_BYTES:
            return platforms.DIRECT
        copies = FreshCopies(dtype, aligned)
        return platforms.HostTransfer(_jax.ZERO_COPY, copies.stage,
                                      copies.stage_scalar if not aval.shape else None)
    return host_transfer


# variant -> (the strategy's host_transfer, the size streamed copies start
# at) while its record is built (None: nbjit's own)
WAYS = {"nbjit": (None, None), "nbjit fresh": (fresh_transfer(False), None),
        "nbjit fresh aligned": (fresh_transfer(True), None), "nbjit streamed": (None, 0)}


def log(*a) -> None:
    print(*a, flush=True)


def readonly(x: np.ndarray) -> np.ndarray:
    y = x.copy()
    y.flags.writeable = False
    return y


def warm(f, way, args):
    """`f`'s first call (its record built) with `way`'s host_transfer and
    streamed-copy threshold."""
    transfer, stream_min = way
    saved = platforms.Staged.host_transfer, staging.STREAM_MIN_BYTES
    if transfer is not None:
        platforms.Staged.host_transfer = transfer
    if stream_min is not None:
        staging.STREAM_MIN_BYTES = stream_min
    try:
        return jax.block_until_ready(f(*args))
    finally:
        platforms.Staged.host_transfer, staging.STREAM_MIN_BYTES = saved


def calls(cases, n: int, rounds: int) -> list[dict]:
    out = []
    for label, (make_fn, consts, pool) in cases.items():
        ro_pool = [tuple(readonly(a) for a in xy) for xy in pool]
        k = len(pool)
        jf = jax.jit(make_fn())
        variants = {"jax.jit": lambda i, jf=jf: jf(*consts, *pool[i % k])}
        for name, way in WAYS.items():
            nf = nbjit.jit(make_fn())
            warm(nf, way, (*consts, *pool[0]))
            variants[name] = lambda i, nf=nf: nf(*consts, *pool[i % k])
        nro = nbjit.jit(make_fn())
        warm(nro, WAYS["nbjit"], (*consts, *ro_pool[0]))
        variants["nbjit read-only"] = lambda i: nro(*consts, *ro_pool[i % k])
        want = np.asarray(jf(*consts, *pool[3]))
        for name, f in variants.items():
            for i in range(64):
                f(i)
            if not np.array_equal(np.asarray(f(3)), want):
                log(label, name, "DIFFERS from jax.jit")
        def measure(f):
            t0 = time.perf_counter()
            for i in range(n):
                res = f(i)
            jax.block_until_ready(res)
            return (time.perf_counter() - t0) / n

        per = interleaved(variants, measure, rounds)
        base = np.array(per["jax.jit"])
        row = {"case": label, "variants": {
            name: {"call_us": round(float(np.median(v)) * 1e6, 1),
                   "ratio": round(float(np.median(np.array(v) / base)), 3)}
            for name, v in per.items()}}
        out.append(row)
        log(f"{label:>16}: " + "  ".join(f"{name} {v['call_us']:.1f} us ({v['ratio']:.3f})"
                                         for name, v in row["variants"].items()))
    return out


def transformer_runs(steps: int, repeats: int) -> dict:
    params, loss, make = models._transformer((32, 128, 1000, 128))
    rng = np.random.default_rng(0)
    pool = [make(rng) for _ in range(8)]

    def make_step():
        def step(p, x, y):
            value, grads = jax.value_and_grad(loss)(p, x, y)
            return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), value
        return step

    def run(f):
        p, losses = params, []
        t0 = time.perf_counter()
        for i in range(steps):
            p, value = f(p, *pool[i % 8])
            losses.append(value)
        jax.block_until_ready(p)
        return time.perf_counter() - t0, [float(v) for v in losses]

    sides = {"jax.jit": jax.jit(make_step())}
    for name, way in WAYS.items():  # the compile and first call, outside the runs
        sides[name] = nbjit.jit(make_step())
        warm(sides[name], way, (params, *pool[0]))
    jax.block_until_ready(sides["jax.jit"](params, *pool[0]))
    times: dict[str, list[float]] = {name: [] for name in sides}
    losses = {}
    names = list(sides)
    for r in range(repeats):
        for name in (names if r % 2 else names[::-1]):
            took, values = run(sides[name])
            times[name].append(took)
            losses[name] = values
    out = {name: {"run_s": round(float(np.median(v)), 4),
                  "ratio": round(float(np.median(np.array(v) / np.array(times["jax.jit"]))), 3),
                  "losses_equal": losses[name] == losses["jax.jit"]}
           for name, v in times.items()}
    log(f"transformer 32x128, {steps} steps: " + "  ".join(
        f"{name} {v['ratio']:.3f}{'' if v['losses_equal'] else ' LOSSES DIFFER'}"
        for name, v in out.items()))
    return out


def main() -> None:
    args = sys.argv[1:]
    opts = {"--calls": 2000, "--rounds": 5, "--steps": 2000}
    path = None
    for flag in list(opts):
        if flag in args:
            opts[flag] = int(args[args.index(flag) + 1])
    if "--json" in args:
        path = args[args.index("--json") + 1]
    log(f"backend {jax.default_backend()}, jax {jax.__version__}, nbjit "
        f"{os.environ.get('NBJIT_COMMIT', '?')}")
    if jax.default_backend() == "cpu":  # to try it here: the accelerator's strategy
        platforms.plug_in("cpu", platforms.STAGED)
    if "--ways" in args:  # a comma-separated choice of WAYS
        chosen = args[args.index("--ways") + 1].split(",")
        for name in list(WAYS):
            if name not in chosen:
                del WAYS[name]
    log(f"streamed copy: {'ready' if stream.stream_copy() else 'none'}")
    rng = np.random.default_rng(1)
    w = jax.device_put(np.float32(0.5))
    cases = {"add 2x f32[8]": (lambda: (lambda a, b: a + b), (), [
        (rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32))
        for _ in range(64)])}
    for kib in (16, 64, 128, 256):
        cases[f"f32 {kib} KiB"] = (lambda: (lambda w, x: jnp.sum(x) * w), (w,), [
            (rng.standard_normal(kib * 256).astype(np.float32),) for _ in range(8)])
    result = {"calls": calls(cases, opts["--calls"], opts["--rounds"]),
              "transformer": transformer_runs(opts["--steps"], 2)}
    if path:
        with open(path, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
