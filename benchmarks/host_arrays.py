"""Host numpy arrays of 512 B to 1 MiB: nbjit.jit against jax.jit, interleaved.

`f(params, x)` with x a float32 numpy array, off or on a 64-byte boundary
(jax.jit uses an aligned array in place, no copy): the same array every
call, or one of four arrays in turn (new values each call). Each call is timed to
its result (block_until_ready), paired rounds with rotating order, median of
the per-round ratios and its p10-p90 (`nbjit.bench.measure`). The results are
checked equal first.

A third contender, `floor`, is jax.jit called with the same values already
device arrays (no put, no copy, no compare): the executable and its output
alone. `floor/jax` is the lowest ratio any dispatcher that runs this
executable can reach; where it is above a row's target, no host-input
design meets that target in this process. jax.jit's put of a misaligned
array costs its copy plus an allocation, and what the allocation costs
depends on the C library's state: glibc reuses freed heap for 1 MiB
buffers after its first free (cheap), but with
``MALLOC_MMAP_THRESHOLD_=131072`` in the environment every such buffer is
a new mapping whose pages fault in (docs/host-inputs.md, "Where the ratios
stand").

With ``--gap US`` every call is preceded by US microseconds of busy Python
(the same for every contender), as in a loop that does other work between
steps. The runtime's worker thread waits a few microseconds for new work
after its last task and then sleeps, and waking it costs tens of
microseconds on these VMs: a tight loop (no gap) rewards whoever dispatches
within that window, a loop with a gap pays the wake in every contender
(docs/host-inputs.md). Times are then shown less the gap, and the ratio is
of those medians.

    python benchmarks/host_arrays.py [--fn sum|linear] [--seconds S] [--only TEXT] [--gap US]

Run it against another checkout of nbjit by putting that first on PYTHONPATH
(before/after of one change, on the same load).
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
from nbjit.bench import measure  # noqa: E402

SIZES = {"512B": 512, "8KiB": 8 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20}
KINDS = ("same", "same aligned", "fresh", "fresh aligned")


def _placed(nbytes: int, offset: int, rng: np.random.Generator) -> np.ndarray:
    """A float32 array of `nbytes` whose data sits `offset` bytes past a 64-byte boundary."""
    raw = np.empty(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    x = raw[start:start + nbytes].view(np.float32)
    x[...] = rng.standard_normal(x.size)
    return x


def _sum(params, x):
    return jnp.sum(x) * params["w"] + params["b"]


def _linear(params, x):
    return jnp.sum(x.reshape(-1, 128) * params["w"], axis=1) + params["b"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fn", choices=("sum", "linear"), default="sum")
    parser.add_argument("--seconds", type=float, default=4.0, help="per row")
    parser.add_argument("--only", default="", help="rows whose name contains this")
    parser.add_argument("--gap", type=float, default=0.0,
                        help="microseconds of busy Python before every call")
    args = parser.parse_args(argv)
    fn = _sum if args.fn == "sum" else _linear
    rng = np.random.default_rng(0)
    params = {"w": jnp.ones(() if args.fn == "sum" else 128, jnp.float32),
              "b": jnp.zeros((), jnp.float32)}
    settings = measure.Settings(rounds=301, min_rounds=9, target_batch_s=0.004,
                                max_seconds=args.seconds, warmup_calls=20)
    print(f"nbjit {os.path.dirname(nbjit.__file__)}, f = {args.fn}, gap {args.gap:g} us, "
          f"load {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    print(f"{'row':<24} {'nbjit us':>9} {'jax.jit us':>10} {'floor us':>9} {'ratio':>6}  p10-p90"
          f"   {'floor/jax':>9}")
    for size, nbytes in SIZES.items():
        for kind in KINDS:
            name = f"{kind} {size}"
            if args.only not in name:
                continue
            offset = 0 if kind.endswith("aligned") else 16
            xs = [_placed(nbytes, offset, rng) for _ in range(4 if kind.startswith("fresh") else 1)]
            f, g = nbjit.jit(fn), jax.jit(fn)
            on_device = [jax.device_put(x) for x in xs]

            def caller(h, xs=xs, gap_s=args.gap * 1e-6):
                state = [0]

                def call():
                    state[0] = i = (state[0] + 1) % len(xs)
                    return jax.block_until_ready(h(params, xs[i]))

                def call_after_gap():
                    end = time.perf_counter() + gap_s
                    while time.perf_counter() < end:
                        pass
                    return call()

                return call_after_gap if gap_s else call

            for x in xs:
                if not np.array_equal(np.asarray(f(params, x)), np.asarray(g(params, x))):
                    print(f"{name}: OUTPUTS DIFFER")
                    return 1
            result = measure.interleave([("a", caller(f)), ("b", caller(g)),
                                         ("floor", caller(g, on_device))], settings)
            r, floor = result.ratio("a", "b"), result.ratio("floor", "b")
            a, b, fl = (result.median_us(n) - args.gap for n in ("a", "b", "floor"))
            if args.gap:  # (medians less the gap; their ratio, no spread)
                print(f"{name:<24} {a:9.1f} {b:10.1f} {fl:9.1f} {a / b:6.2f}  -        "
                      f"   {fl / b:9.2f}", flush=True)
                continue
            print(f"{name:<24} {a:9.1f} {b:10.1f} {fl:9.1f} {r.median:6.2f}  "
                  f"{r.p10:.2f}-{r.p90:.2f}   {floor.median:9.2f}", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
