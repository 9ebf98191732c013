"""Command line: ``python -m nbjit compare|run|report`` (or ``nbjit ...``).

``compare [--quick] [--only PAT] [--plot F.png] [--json F]`` times nbjit.jit
against jax.jit; ``run script.py`` runs a script with jax.jit routed to
nbjit.jit and reports its dispatch; ``report F.0 F.1 ...`` merges the
per-process reports of a multi-controller ``run``. The console script
``nbjit`` (``nbjit-compare``, its old name, too) is this command line.

Nothing here imports jax at import: ``run`` leaves that to the script
(nbjit/routing/run.py), and ``compare`` asks for 8 host devices before it
imports jax (JAX reads ``XLA_FLAGS`` when its CPU backend starts, at the first
use of a device); `compare` checks that it was in time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

from nbjit.routing import run as _run
from nbjit.routing.devices import HOST_DEVICES, request_host_devices


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nbjit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser(
        "compare",
        help="time nbjit.jit against jax.jit side by side",
        description="Time nbjit.jit against jax.jit in one process, interleaved, and report "
        "the median per-call time, the floor, and the median ratio with its p10-p90 spread.",
    )
    c.add_argument("--quick", action="store_true", help="fewer, shorter rounds (<= 2 minutes)")
    c.add_argument("--only", metavar="PATTERN",
                   help="scenarios whose name matches: a regular expression searched in the "
                   "name ('a|b', 'args_1$'; a plain word is a substring), or a glob of the "
                   "whole name when written with * or ? alone ('jit_simple_*_10')")
    c.add_argument("--plot", metavar="FILE.png", help="write a PNG plot (needs matplotlib)")
    c.add_argument("--json", metavar="FILE", help="write rows and metadata as JSON")
    c.add_argument("--markdown", metavar="FILE", help="write the table as a Markdown file")
    c.add_argument("--self-check", action="store_true",
                   help="jax.jit against itself; fails unless every ratio is within 0.9-1.1")
    c.add_argument("--rounds", type=int, help="paired rounds per scenario (default 301, quick 41)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c.add_argument("--list", action="store_true", help="list the scenarios and exit")
    r = sub.add_parser(
        "run", help="run a script or module with jax.jit routed to nbjit.jit",
        description="Run a script (or -m module) as python would, with nbjit.patch_jax() "
        "applied when the script imports jax (equinox.filter_jit routed when it imports "
        "equinox); the report at exit names every nbjit function that ran.")
    r.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m")
    r.add_argument("--json", metavar="FILE", help="also write the end-of-run report as JSON")
    r.add_argument("--explain", action="store_true",
                   help="log every explained cache miss (nbjit.explain_misses) while it runs")
    r.add_argument("--no-profile", action="store_true",
                   help="no per-phase timing (the report then has counts only)")
    r.add_argument("--no-report", action="store_true", help="print no report at exit")
    r.add_argument("--no-filter-jit", action="store_true",
                   help="leave equinox.filter_jit alone (else routed to nbjit.filter_jit)")
    r.add_argument("--check-agreement", action="store_true",
                   help="multi-controller: processes also compare the bytes of host inputs "
                   "at each miss (docs/multi-controller.md)")
    r.add_argument("target", help="script path, or module name with -m")
    r.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    m = sub.add_parser(
        "report", help="merge the per-process reports of a multi-controller run",
        description="Print one dispatch report from the JSON reports that "
        "`python -m nbjit run --json FILE` wrote in each process (FILE.0, FILE.1, ...).")
    m.add_argument("reports", nargs="+", metavar="FILE", help="per-process JSON reports")
    m.add_argument("--json", metavar="FILE", help="also write the merged report as JSON")
    return p


def compare(args: argparse.Namespace) -> int:
    request_host_devices()
    import jax

    from nbjit import bench

    try:
        matrix = bench.select(bench.scenarios(), args.only)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if args.list:
        for s in matrix:
            print(f"{s.name:36} n={s.n_args:<5} {s.kind}")
        return 0
    if not matrix:
        print(f"no scenario matches {args.only!r}", file=sys.stderr)
        return 2
    n_dev = len(jax.devices())
    if n_dev < HOST_DEVICES and jax.devices()[0].platform == "cpu":
        print(f"warning: {n_dev} CPU devices (jax's backend started before XLA_FLAGS was set); "
              "multi-device scenarios will be skipped", file=sys.stderr)
    settings = bench.Settings.quick() if args.quick else bench.Settings()
    if args.rounds:
        settings = dataclasses.replace(settings, rounds=args.rounds,
                                       min_rounds=min(settings.min_rounds, args.rounds))
    rows, meta = bench.run(matrix, settings, self_check=args.self_check,
                           progress=not args.no_progress)
    table = bench.format_table(rows, meta)
    print(table)
    if not args.self_check and bench.writes_into_docs([args.json, args.plot, args.markdown]):
        if not _self_check_for_docs(matrix, settings, meta, progress=not args.no_progress):
            return 1
    if args.json:
        bench.write_json(args.json, rows, meta)
        _wrote(args.json, "rows and metadata (JSON)")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(bench.format_markdown(rows, meta))
        _wrote(args.markdown, "the table (Markdown)")
    if args.plot:
        try:
            bench.plot(args.plot, rows, meta)
        except ImportError:
            print("--plot needs matplotlib: pip install matplotlib", file=sys.stderr)
            return 1
        _wrote(args.plot, "the plot")
    print(f"({meta['seconds']:.0f} s)", file=sys.stderr)
    if args.self_check:
        bad = bench.self_check_failures(rows)
        lo, hi = bench.SELF_CHECK_BAND
        if bad:
            print(too_noisy(bad, sum(r.ratio is not None for r in rows)))
            return 1
        print(f"self-check passed: every ratio within {lo}-{hi}: the machine was quiet enough "
              "for this run's ratios")
    return 0


def too_noisy(outside: Sequence[Any], timed: int) -> str:
    """What a failed self-check means, and what to do: jax.jit against itself has no
    difference to find, so ratios outside the band are the machine's noise."""
    from nbjit import bench

    lo, hi = bench.SELF_CHECK_BAND
    names = ", ".join(f"{r.name} ({r.ratio:.2f})" for r in outside[:8])
    more = f" and {len(outside) - 8} more" if len(outside) > 8 else ""
    load = ""
    if hasattr(os, "getloadavg"):
        load = f" ({os.getloadavg()[0]:.1f} runnable on {os.cpu_count()} CPUs over the last minute)"
    return (f"self-check: too noisy, run again. jax.jit against itself, which has no "
            f"difference to find, put {len(outside)} of {timed} rows outside {lo}-{hi}: "
            f"{names}{more}. The machine was too busy{load} for a ratio to mean anything; "
            "run it again when it is quieter (nothing else running), or with more --rounds.")


def _wrote(path: str, what: str) -> None:
    print(f"wrote {what} to {os.path.abspath(path)}", file=sys.stderr)


def _self_check_for_docs(matrix: Sequence[Any], settings: Any, meta: dict[str, Any],
                         progress: bool) -> bool:
    """Published numbers (outputs into docs/): jax.jit against itself right after
    the run says whether the machine was quiet enough. Records the check in
    `meta` (``self_check_after``, which scripts/doc_tables.py states); False
    when it failed, and then nothing is written into docs/."""
    from nbjit import bench

    check, _ = bench.run(matrix, settings, self_check=True, progress=progress)
    meta["self_check_after"] = record = bench.self_check_record(check, bench.SELF_CHECK_BAND)
    lo, hi = record["band"]
    if not record["passed"]:
        names = ", ".join(f"{name} ({ratio:.2f})" for name, ratio in record["outside"])
        print(f"not writing into docs/: the self-check right after this run put "
              f"{len(record['outside'])} of {record['rows']} rows outside {lo}-{hi} ({names}); "
              "the machine was too noisy for published numbers: run again when it is quieter",
              file=sys.stderr)
        return False
    print(f"self-check after the run passed: {record['rows']} rows within {lo}-{hi}",
          file=sys.stderr)
    return True


def run(args: argparse.Namespace) -> int:
    """Runs the script with jax.jit routed to nbjit.jit; prints the dispatch report at exit.

    Imports nothing of jax's until the script imports jax (`_run.run_script`):
    the run's observers start then (`on_jax`).
    """
    stack = contextlib.ExitStack()
    started: list[Any] = []  # [the profile or None] once jax was imported
    ran: list[bool] = []  # [True] once the script or module was found and started

    def on_jax() -> None:  # jax has just been imported (by the script) and patched
        from nbjit.multiprocess import agreement
        from nbjit.observe import explain, stats
        from nbjit.observe import profile as _profile

        stats.keep_retired()  # the report names functions gone by exit too
        if args.check_agreement:
            agreement.configure(check_host_values=True)
        if args.explain:
            stack.enter_context(explain.explain_misses())
        profile = None if args.no_profile else stack.enter_context(_profile.Profile())
        started.append(profile)

    try:
        return _run.run_script([args.target, *args.args], module=args.module,
                               filter_jit=not args.no_filter_jit, on_jax=on_jax,
                               on_start=lambda: ran.append(True))
    finally:
        stack.close()
        _run_report(args, started, bool(ran))


def _run_report(args: argparse.Namespace, started: list[Any], ran: bool) -> None:
    """The end-of-run report (stderr, and --json), of a run whose script imported jax.

    A script that ran without importing jax gets one line saying so; one that
    was not found (Python's own message said why) gets nothing."""
    if not started:  # the script never imported jax: nothing of nbjit's ran
        if ran and not args.no_report:
            print("nbjit run: no nbjit function was called (the script never imported jax)",
                  file=sys.stderr)
        return
    from nbjit.observe import report as _report

    report = _report.build(started[0])
    if not args.no_report:
        print(_report.format_text(report), file=sys.stderr)
    if args.json:  # one file per process in a multi-controller run
        label = report["process"]
        _report.write_json(args.json + (f".{label.split()[1]}" if label else ""), report)


def merge_reports(args: argparse.Namespace) -> int:
    """Prints (and with --json writes) one report from per-process JSON reports."""
    from nbjit.observe import report as _report

    merged = _report.merge([_report.read_json(path) for path in args.reports])
    print(_report.format_text(merged))
    if args.json:
        _report.write_json(args.json, merged)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        return run(args)
    if args.command == "report":
        return merge_reports(args)
    if args.command == "compare":
        return compare(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
