"""Probe: whole training runs, warm-up included, nbjit.jit against jax.jit (run
on a TPU or GPU; the CPU only to try it).

    python benchmarks/probes/accel_runs.py [--steps N] [--repeats R] [--models NAME ...]
                                           [--json FILE]

Three models a user trains (tests/test_accel_loops.py's shapes): an MLP
784-2048-2048-10 at batch 512 (1.6 MB of input a step), a conv net at batch
256 (0.8 MB), a transformer block on 32x128 int32 tokens and targets (32 KB).
A pool of 8 numpy batches, a new one each step, no block per step; each run
makes a new jitted function (the program itself is compiled once, before the
first run: JAX's caches hold it), so its first calls are in the run. Runs
alternate between the two jits. Per model and batch kind (writeable,
read-only) it prints the whole run's time ratio nbjit / jax.jit (median of
the repeats), and nbjit's pace over its first 100 steps against its last 100
(call-return times: in a no-block loop the calls are paced by the device),
with jax.jit's own pace beside it (its first run pays its own first calls);
per nbjit run, that pace, the milliseconds of its first call (the miss),
steps 2-10, 11-100 and the last 100, and how many buffers each staging ring
made (a fresh buffer's first writes fault its pages in; a small leaf's
copies are new arrays, no ring). Per run of either jit (`runs`, in the
order they ran): the milliseconds of each tenth of its calls, and the
garbage collector's passes per generation, with the oldest's milliseconds
(where in a run its extra lies). `--models`: the models whose name starts
with one of these words (mlp, cnn, transformer; default all three).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import jax
import numpy as np

import nbjit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
import test_accel_loops as models  # noqa: E402  (the test's models, sized for the backend)


def build(name):
    """(params, step, make a batch) at the sizes the module's docstring names."""
    if name == "mlp 2048 b512":
        params, loss, make = models._mlp(2048, 512)
    elif name == "cnn b256":
        params, loss, make = models._cnn(256)
    else:
        params, loss, make = models._transformer((32, 128, 1000, 128))

    def step(p, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), value

    return params, step, make


class GcWatch:
    """The garbage collector's passes during a run: how many of each
    generation, and the milliseconds the oldest generation's took."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.full_ms = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            generation = info["generation"]
            self.counts[generation] += 1
            if generation == 2:
                self.full_ms += (time.perf_counter() - self._began) * 1e3


def run(f, params, pool, steps):
    """(seconds, each call's return time, the collector's passes) of one run."""
    watch = GcWatch()
    gc.callbacks.append(watch)
    try:
        p, marks = params, [time.perf_counter()]
        for i in range(steps):
            x, y = pool[i % 8]
            p, loss = f(p, x, y)
            marks.append(time.perf_counter())
        jax.block_until_ready((p, loss))
        end = time.perf_counter()
    finally:
        gc.callbacks.remove(watch)
    return end - marks[0], marks, watch


def tenths(marks) -> list[float]:
    """Milliseconds of each tenth of a run's calls."""
    n = len(marks) - 1
    cuts = [round(n * k / 10) for k in range(11)]
    return [round((marks[b] - marks[a]) * 1e3, 1) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def ring_buffers(f, params, x, y) -> list[int]:
    """How many buffers each staging ring of `f`'s record made (kept), after a run."""
    node, _ = f._entry_for((params, x, y), {})
    if node is None or node.record is None:
        return []
    return [stage.__self__.pool.kept.count for step in node.record.step_objects()
            if (stage := getattr(getattr(step, "transfer", None), "stage", None)) is not None
            and hasattr(getattr(stage, "__self__", None), "pool")]


def main() -> None:
    args = sys.argv[1:]
    opts = {"--steps": 3000, "--repeats": 3}
    path = None
    for flag in list(opts):
        if flag in args:
            i = args.index(flag)
            opts[flag] = int(args[i + 1])
            del args[i:i + 2]
    if "--json" in args:
        path = args[args.index("--json") + 1]
    models = ("mlp 2048 b512", "cnn b256", "transformer 32x128")
    if "--models" in args:
        wanted = [w for w in args[args.index("--models") + 1:] if not w.startswith("--")]
        models = tuple(m for m in models if m.split()[0] in wanted)
    steps, repeats = opts["--steps"], opts["--repeats"]
    dev = jax.devices()[0]
    out = {"jax": jax.__version__, "device": f"{dev.platform} {dev.device_kind}", "steps": steps,
           "rows": []}
    print(f"accel_runs: {out['device']}, jax {jax.__version__}, {steps} steps a run", flush=True)
    for name in models:
        params, step, make = build(name)
        rng = np.random.default_rng(0)
        pool = [make(rng) for _ in range(8)]
        frozen = []
        for batch in pool:
            kept = []
            for a in batch:
                b = a.copy()
                b.flags.writeable = False
                kept.append(b)
            frozen.append(tuple(kept))
        jax.block_until_ready(jax.jit(step)(params, *pool[0]))  # the compile, once
        for kind, data in (("writeable", pool), ("read-only", frozen)):
            totals = {"jax.jit": [], "nbjit": []}
            pace, jax_pace, buffers, first_ms = [], [], [], []
            parts = {"jax.jit": [], "nbjit": []}  # per run: its tenths, the collector's passes
            for r in range(repeats):
                order = ("jax.jit", "nbjit") if r % 2 == 0 else ("nbjit", "jax.jit")
                for which in order:
                    f = jax.jit(step) if which == "jax.jit" else nbjit.jit(step)
                    total, marks, watch = run(f, params, data, steps)
                    totals[which].append(total)
                    parts[which].append({"tenths_ms": tenths(marks), "gc": watch.counts,
                                         "gc_full_ms": round(watch.full_ms, 1)})
                    if which == "jax.jit":
                        jax_pace.append((marks[100] - marks[0]) / (marks[-1] - marks[-101]))
                    else:
                        pace.append((marks[100] - marks[0]) / (marks[-1] - marks[-101]))
                        buffers.append(ring_buffers(f, params, *data[0]))
                        # the first call (nbjit's miss), steps 2-10, 11-100, the last 100 (ms)
                        first_ms.append([round((b - a) * 1e3, 2) for a, b in (
                            (marks[0], marks[1]), (marks[1], marks[10]), (marks[10], marks[100]),
                            (marks[-101], marks[-1]))])
            ratio = float(np.median(np.array(totals["nbjit"]) / np.array(totals["jax.jit"])))
            row = {"model": name, "batch": kind, "input_bytes": int(sum(a.nbytes for a in pool[0])),
                   "jax_run_s": round(float(np.median(totals["jax.jit"])), 4),
                   "nbjit_run_s": round(float(np.median(totals["nbjit"])), 4),
                   "ratio": round(ratio, 3),
                   "ratios": [round(a / b, 3) for a, b in
                              zip(totals["nbjit"], totals["jax.jit"], strict=True)],
                   "nbjit_first100_over_last100": round(float(np.median(pace)), 3),
                   "nbjit_paces": [round(v, 3) for v in pace],
                   "jax_first100_over_last100": round(float(np.median(jax_pace)), 3),
                   "jax_paces": [round(v, 3) for v in jax_pace],
                   "nbjit_ms_miss_2to10_11to100_last100": first_ms,
                   "nbjit_ring_buffers": buffers,
                   "runs": parts}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    if path:
        with open(path, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
