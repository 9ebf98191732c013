"""Does this machine run at one speed? Trace a pure-Python loop and see what asv can hold.

Run: python benchmarks/machine_speed.py [--seconds 60]

Times ``bench_machine.yardstick`` (interpreter work, no JAX) in blocks of
about 1 ms for ``--seconds``, then prints:

  * the median of each second of the trace, in us per loop;
  * the fast speed (10th percentile of the blocks), the median, and the
    share of seconds slower than 1.25x the fast speed;
  * for asv designs (processes x seconds sampled per process), how often
    the medians of two runs (asv's statistic for ``time_*``) agree within
    +-10%: each run is that many windows of the trace, drawn at random.

On a machine that runs at one speed every design agrees nearly always. Where
the CPU alternates between speeds for seconds at a time (a shared VM), no
number of samples per process helps: a run's median is decided by how much
of its time fell in slow stretches. Then read ratios measured interleaved
(``bench_ratio.track_ratio``, ``python -m nbjit compare``), not absolute
times. In one trace a jax.jit call slowed about 15% more than the yardstick
in the slow stretches, so the agreement printed is, if anything, optimistic.
"""

from __future__ import annotations

import argparse
import bisect
import pathlib
import random
import statistics
import sys
import time
from collections.abc import Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from benchmarks.bench_machine import yardstick  # noqa: E402

Trace = list[tuple[float, float]]  # (seconds since the start, us per loop)

DESIGNS = ((2, 4.0), (4, 2.0), (8, 1.0), (16, 0.5))  # processes x seconds; the suite: 2 x 4


def trace(seconds: float, block_s: float = 0.001) -> Trace:
    """Per-block time of one `yardstick` call, for ``seconds``."""
    clock = time.perf_counter
    start = clock()
    n = 1
    while True:  # calls per block
        t = clock()
        for _ in range(n):
            yardstick()
        if clock() - t >= block_s:
            break
        n *= 2
    out: Trace = []
    while (now := clock()) - start < seconds:
        for _ in range(n):
            yardstick()
        out.append((now - start, (clock() - now) / n * 1e6))
    return out


def per_second(rows: Trace) -> list[float]:
    seconds: dict[int, list[float]] = {}
    for t, us in rows:
        seconds.setdefault(int(t), []).append(us)
    return [statistics.median(seconds[s]) for s in sorted(seconds)]


def agreement(rows: Trace, processes: int, window_s: float, pairs: int = 400,
              band: float = 0.10, seed: int = 0) -> float:
    """Share of pairs of simulated runs whose medians agree within ``band``.

    A run is ``processes`` windows of ``window_s`` seconds of the trace at
    random places; its value is the median of the blocks in them.
    """
    rng = random.Random(seed)
    end = rows[-1][0]
    if end <= window_s:
        raise ValueError(f"a trace of {end:.1f} s is too short for {window_s} s windows")
    times = [t for t, _ in rows]

    def run() -> float:
        values: list[float] = []
        for _ in range(processes):
            a = rng.uniform(0.0, end - window_s)
            lo = bisect.bisect_left(times, a)
            hi = bisect.bisect_left(times, a + window_s)
            values.extend(us for _, us in rows[lo:hi])
        return statistics.median(values)

    agree = sum(abs(run() / run() - 1.0) <= band for _ in range(pairs))
    return agree / pairs


def report(rows: Trace, designs: Sequence[tuple[int, float]] = DESIGNS) -> str:
    blocks = sorted(us for _, us in rows)
    fast = blocks[len(blocks) // 10]
    seconds = per_second(rows)
    slow = sum(s > 1.25 * fast for s in seconds)
    lines = [
        "per-second median, us per loop: " + " ".join(f"{s:.1f}" for s in seconds),
        f"fast {fast:.2f} us (p10 of {len(blocks)} blocks), median {statistics.median(blocks):.2f},"
        f" slowest second {max(seconds):.2f} ({max(seconds) / fast:.2f}x);"
        f" {slow} of {len(seconds)} seconds slower than 1.25x fast",
        "asv design (processes x s)  two runs' medians within +-10%",
    ]
    end = rows[-1][0]
    for processes, window_s in designs:
        if end > 2 * window_s:
            share = agreement(rows, processes, window_s)
            lines.append(f"{processes:>2} x {window_s:<4}                  {share:.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to trace (60)")
    args = parser.parse_args(argv)
    print(report(trace(args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
