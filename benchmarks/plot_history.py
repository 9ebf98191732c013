"""Draw a track's history from asv's results JSON, without the HTML page.

Run from benchmarks/:  python plot_history.py [--bench NAME] [--out FILE.png]

asv's published page loads its scripts from CDNs and is blank without
internet; this reads the same results (``.asv/results/<machine>/*.json``)
and plots, per parameter, the value asv reports (the median of the samples)
with the interquartile range it stores (q_25-q_75) as error bars, one point
per commit, commits in date order.
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
        names = params[0] if params else []
        q25 = cols.get("stats_q_25") or [None] * len(values)
        q75 = cols.get("stats_q_75") or [None] * len(values)
        for name, v, lo, hi in zip(names, values, q25, q75, strict=False):
            if v is None or v != v:  # failed or skipped
                continue
            series.setdefault(name.strip("'"), []).append(
                (data["date"], data["commit_hash"][:7], v, lo if lo is not None else v,
                 hi if hi is not None else v))
    return series


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", default="bench_ratio.DispatchRatio.track_ratio")
    p.add_argument("--results", default=".asv/results")
    p.add_argument("--out", default="../docs/asv_track_ratio.png")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    series = load(pathlib.Path(args.results), args.bench)
    if not series:
        print(f"no results for {args.bench} under {args.results}")
        return 1
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    commits = sorted({(d, c) for pts in series.values() for d, c, *_ in pts})
    index = {c: i for i, (_, c) in enumerate(commits)}
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for name, pts in sorted(series.items()):
        pts.sort()
        x = [index[c] for _, c, *_ in pts]
        y = [v for *_, v, _, _ in pts]
        err = ([v - lo for *_, v, lo, _ in pts], [hi - v for *_, v, _, hi in pts])
        ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, lw=1, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(commits)), [c for _, c in commits], rotation=45, fontsize=8)
    ax.set_xlabel("commit (oldest left)")
    ax.set_ylabel("nbjit / jax.jit per call (< 1: nbjit faster)")
    ax.set_title(args.title or f"{args.bench}: median of samples, bars q25-q75 "
                 "(from asv's results JSON)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}: {len(series)} series over {len(commits)} commits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
