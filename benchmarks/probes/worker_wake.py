"""Probe: the resident slots' wake on the CPU, with and without it, against
jax.jit, in one process (a loop that waits for every call).

    python benchmarks/probes/worker_wake.py [--fn sum|linear] [--kib N ...]
                                            [--gap US ...] [--rounds R] [--calls C]

`f(params, x)` with x a float32 numpy array of N KiB, one of 4 in turn (new
values every call: each call writes its slot) or the same one every call,
each call waited for; `--gap` puts US microseconds of busy Python before
every call (a loop doing other work between steps; times are shown less
the gap). Contenders, in alternating order (`_rounds.interleaved`, the
garbage collector off), `--calls` calls a round: jax.jit;
nbjit as it is (its idle calls wake the worker: `WAKE_AFTER_IDLE`); nbjit
whose wake is a no-op (the same prepare and idle checks, no computation
dispatched); nbjit with no wake in its prepare at all (built with
`WAKE_MIN_BYTES` out of reach). Each row makes its own functions. Per row:
jax.jit's median us a call, then each nbjit's ratio to it (median and
p10-p90 of the rounds). docs/host-inputs.md ("The wake in a loop that
calls again at once") has what it read.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import nbjit  # noqa: E402
from nbjit.host import resident as _resident  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rounds import interleaved  # noqa: E402


def _no_wake() -> None:
    """Stands for a record's wake: dispatches nothing."""


def _function(fn: str):
    if fn == "sum":
        def f(p, x):
            return jnp.sum(x) * p["w"] + p["b"]
    else:
        def f(p, x):
            return jnp.sum(x.reshape(-1, 128) * p["w"], axis=1) + p["b"]
    return f


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fn", choices=("sum", "linear"), default="sum")
    parser.add_argument("--kib", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--gap", type=float, nargs="+", default=[0.0, 50.0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=600)
    args = parser.parse_args()
    params = {"w": jnp.ones(() if args.fn == "sum" else 128, jnp.float32),
              "b": jnp.zeros((), jnp.float32)}
    print(f"worker_wake: jax {jax.__version__}, fn {args.fn}, {args.rounds} rounds of "
          f"{args.calls} calls", flush=True)
    for kib in args.kib:
        n = kib * 256
        same = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        pool = [np.random.default_rng(i).standard_normal(n).astype(np.float32) for i in range(4)]
        for kind in ("fresh", "same"):
            def arg(i, kind=kind, same=same, pool=pool):
                return same if kind == "same" else pool[i % 4]

            for gap_us in args.gap:
                gap = gap_us * 1e-6
                fs = {"jax.jit": jax.jit(_function(args.fn))}
                for name in ("nbjit", "wake a no-op"):
                    fs[name] = nbjit.jit(_function(args.fn))
                saved = _resident.WAKE_MIN_BYTES
                _resident.WAKE_MIN_BYTES = 1 << 60
                try:
                    fs["no wake"] = nbjit.jit(_function(args.fn))
                    jax.block_until_ready([fs["no wake"](params, arg(i)) for i in range(3)])
                finally:
                    _resident.WAKE_MIN_BYTES = saved
                for name, f in fs.items():
                    for i in range(3):
                        jax.block_until_ready(f(params, arg(i)))
                    if name == "wake a no-op":
                        node, _ = f._entry_for((params, arg(0)), {})
                        scope = node.record.prepare.__globals__
                        if "wake" in scope:
                            scope["wake"] = _no_wake

                def loop(f, calls, gap=gap):
                    begin = time.perf_counter()
                    for i in range(calls):
                        if gap:
                            until = time.perf_counter() + gap
                            while time.perf_counter() < until:
                                pass
                        f(params, arg(i)).block_until_ready()
                    return (time.perf_counter() - begin) / calls * 1e6 - gap * 1e6

                for f in fs.values():
                    loop(f, 200)
                times = interleaved(fs, lambda f: loop(f, args.calls), args.rounds)
                base = np.array(times["jax.jit"])
                cells = []
                for name in list(fs)[1:]:
                    ratio = np.array(times[name]) / base
                    cells.append(f"{name} {np.median(ratio):.2f} "
                                 f"({np.percentile(ratio, 10):.2f}-{np.percentile(ratio, 90):.2f})")
                print(f"{kib:>4} KiB {kind:5} gap {gap_us:>3.0f} us: jax.jit "
                      f"{np.median(base):6.1f} us; " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
