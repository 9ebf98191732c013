"""Draw a track's history from asv's results JSON, without the HTML page.

Run from benchmarks/:  python plot_history.py [--bench NAME] [--out FILE.png]

asv's published page loads its scripts from CDNs and is blank without
internet; this reads the same results (``.asv/results/<machine>/*.json``)
and plots, per parameter, the value asv reports (the median of the samples)
with the interquartile range it stores (q_25-q_75) as error bars, one point
per commit, commits in date order. Below it, the control row
(``bench_machine.MachineSpeed.time_python_loop``, the machine's speed while
each commit ran) where the results have it: a step in both is the machine.
"""

from __future__ import annotations

import argparse
import json
import pathlib


def load(results_dir: pathlib.Path, bench: str):
    """{param: [(date, commit, value, q25, q75)]} over every results file that has ``bench``."""
    series: dict[str, list] = {}
    for path in sorted(results_dir.glob("*/*.json")):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text())
        row = data.get("results", {}).get(bench)
        if row is None:
            continue
        cols = dict(zip(data["result_columns"], row, strict=False))
        values = cols.get("result") or []
        params = cols.get("params") or [[]]
        names = params[0] if params and params[0] else [bench.rsplit(".", 1)[-1]]
        q25 = cols.get("stats_q_25") or [None] * len(values)
        q75 = cols.get("stats_q_75") or [None] * len(values)
        for name, v, lo, hi in zip(names, values, q25, q75, strict=False):
            if v is None or v != v:  # failed or skipped
                continue
            series.setdefault(str(name).strip("'"), []).append(
                (data["date"], data["commit_hash"][:7], v, lo if lo is not None else v,
                 hi if hi is not None else v))
    return series


CONTROL = "bench_machine.MachineSpeed.time_python_loop"


def _draw(ax, series, index, scale=1.0):
    for name, pts in sorted(series.items()):
        pts.sort()
        x = [index[c] for _, c, *_ in pts]
        y = [v * scale for *_, v, _, _ in pts]
        err = ([(v - lo) * scale for *_, v, lo, _ in pts],
               [(hi - v) * scale for *_, v, _, hi in pts])
        ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, lw=1, label=name)
    ax.grid(True, alpha=0.3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", default="bench_ratio.DispatchRatio.track_ratio")
    p.add_argument("--results", default=".asv/results")
    p.add_argument("--out", default="../docs/asv_track_ratio.png")
    p.add_argument("--control", default=CONTROL,
                   help="a time_* row drawn below, in us ('' for none)")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    series = load(pathlib.Path(args.results), args.bench)
    if not series:
        print(f"no results for {args.bench} under {args.results}")
        return 1
    control = load(pathlib.Path(args.results), args.control) if args.control else {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    commits = sorted({(d, c) for pts in series.values() for d, c, *_ in pts})
    index = {c: i for i, (_, c) in enumerate(commits)}
    if control:
        fig, (ax, low) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    else:
        fig, ax = plt.subplots(figsize=(11, 5.5))
    _draw(ax, series, index)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("nbjit / jax.jit per call (< 1: nbjit faster)")
    ax.set_title(args.title or f"{args.bench}: median of samples, bars q25-q75 "
                 "(from asv's results JSON)", fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1))
    bottom = ax
    if control:
        shown = {name: [pt for pt in pts if pt[1] in index] for name, pts in control.items()}
        _draw(low, shown, index, scale=1e6)
        low.set_ylabel("control, us per loop")
        low.set_ylim(bottom=0)
        bottom = low
    bottom.set_xticks(range(len(commits)), [c for _, c in commits], rotation=45, fontsize=8)
    bottom.set_xlabel("commit (oldest left)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}: {len(series)} series over {len(commits)} commits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
