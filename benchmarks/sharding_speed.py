"""nbjit vs upstream for numpy inputs on multi-device shardings, side by side.

Run: python benchmarks/sharding_speed.py [--rounds N] [--quick]

One process, 8 host CPU devices. Each case is timed as every nbjit number is
(`nbjit.bench.interleave`): paired rounds, the order rotating per round,
each round a batch of calls per side; the table reports the median of the
per-round ratios nbjit/upstream with its spread (p10-p90), next to the
issue's bar.

Parts: `device_put` (nbjit.device_put vs jax.device_put) and `jit`
(nbjit.jit vs jax.jit with numpy inputs, in_shardings set).
"""

from __future__ import annotations

from nbjit.routing.devices import request_host_devices

request_host_devices(8)  # before anything starts jax's backend

import argparse  # noqa: E402
import dataclasses  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, make_single_device_sharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import nbjit  # noqa: E402
from nbjit import bench  # noqa: E402

nb_device_put = nbjit.device_put


def _blocked(fn, *args):
    return lambda: jax.block_until_ready(fn(*args))


def cases():
    """(part, name, bar, nbjit_fn, jax_fn, floor_fn or None) for every measured case.

    The floor of a jit case is jax.jit called with the input already placed
    (a jax.Array with the target sharding): execution plus C++ dispatch, what
    no host-to-device path can beat.
    """
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    rng = np.random.default_rng(0)
    small = rng.standard_normal((64, 64)).astype(np.float32)
    big = rng.standard_normal((2048, 2048)).astype(np.float32)
    multi = [("64x64 f32 P('x','y') mesh 4x2", small, P("x", "y"), 0.25)]
    multi += [(f"2048x2048 f32 {spec} mesh 4x2", big, spec, 0.5)
              for spec in (P("x", None), P(None, "y"), P())]
    # The SPEC's worst upstream case (~0.6 s per jit call); no bar.
    multi.append(("64 MiB f32 P() mesh 4x2", rng.standard_normal((4096, 4096), np.float32),
                  P(), None))
    out = []
    for name, x, spec, _bar in multi:
        s = NamedSharding(mesh, spec)
        out.append(("device_put", name, None, _blocked(nb_device_put, x, s),
                    _blocked(jax.device_put, x, s), None))
    one = make_single_device_sharding(jax.devices()[0])
    image = rng.standard_normal((128, 224, 224)).astype(np.float32)
    out.append(("device_put", "128x224x224 f32 one device", None,
                _blocked(nb_device_put, image, one), _blocked(jax.device_put, image, one),
                None))

    def double(a):
        return a * 2

    for name, x, spec, bar in multi:
        s = NamedSharding(mesh, spec)
        ours = nbjit.jit(double, in_shardings=s)
        theirs = jax.jit(double, in_shardings=s)
        placed = jax.device_put(x, s)
        out.append(("jit", name, bar, _blocked(ours, x), _blocked(theirs, x),
                    _blocked(theirs, placed)))

    def add(a, b):
        return a + b

    a2, b2 = np.float32(1.5), np.ones((4,), np.float32)
    add_jax = jax.jit(add)
    out.append(("jit", "2 small numpy args, one device", 1.0,
                _blocked(nbjit.jit(add), a2, b2), _blocked(add_jax, a2, b2),
                _blocked(add_jax, *jax.device_put((a2, b2)))))
    # The same, each call with new values: the host-input memo (one device,
    # equal bytes reuse the last device copy) never hits. No bar: quoted.
    values = [(np.float32(i), np.full((4,), i, np.float32)) for i in range(64)]
    turn = iter(range(1 << 62))

    def rotating(fn):
        def call():
            return jax.block_until_ready(fn(*values[next(turn) % 64]))
        return call

    out.append(("jit", "2 small numpy args, new values each call", None,
                rotating(nbjit.jit(add)), rotating(add_jax), None))
    double_jax = jax.jit(double)
    out.append(("jit", "128x224x224 f32 numpy, one device", 1.0,
                _blocked(nbjit.jit(double), image), _blocked(double_jax, image),
                _blocked(double_jax, jax.device_put(image))))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="5 rounds, short batches")
    args = parser.parse_args(argv)
    settings = bench.Settings(rounds=args.rounds, min_rounds=args.rounds,
                              target_batch_s=0.02, max_seconds=float("inf"), warmup_calls=2)
    if args.quick:
        settings = dataclasses.replace(settings, rounds=5, min_rounds=5, target_batch_s=0.005)
    print(f"jax {jax.__version__}, {len(jax.devices())} devices, {settings.rounds} rounds; "
          "ratio = nbjit / upstream per call (median, p10-p90)")
    header = (f"{'part':10} {'case':38} {'nbjit us':>10} {'jax us':>10} {'ratio':>7} "
              f"{'p10-p90':>13} {'bar':>5} {'':4} {'floor':>6}")
    print(header)
    print("-" * len(header))
    failed = False
    for part, name, bar, ours, theirs, floor in cases():
        sides = [("nbjit", ours), ("jax", theirs)] + ([("floor", floor)] if floor else [])
        timed = bench.interleave(sides, settings)
        ratio = timed.ratio("nbjit", "jax")
        verdict = "" if bar is None else ("ok" if ratio.median <= bar else "MISS")
        failed |= verdict == "MISS"
        bar_text = "" if bar is None else f"{bar:.2f}"
        floor_text = "" if floor is None else f"{timed.ratio('floor', 'jax').median:6.3f}"
        print(f"{part:10} {name:38} {timed.median_us('nbjit'):10.1f} "
              f"{timed.median_us('jax'):10.1f} {ratio.median:7.3f} "
              f"{ratio.p10:6.3f}-{ratio.p90:<6.3f} {bar_text:>5} {verdict:4} {floor_text:>6}",
              flush=True)
    print("floor = jax.jit on the input already placed, / upstream with the numpy input: "
          "the best ratio any host-to-device path can reach here")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
