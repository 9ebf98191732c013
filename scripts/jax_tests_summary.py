"""Summarise scripts/jax_tests.sh: counts per file and mode, and the regressions.

    python scripts/jax_tests_summary.py OUTDIR

Reads OUTDIR/{jax,nbjit}/*.xml (pytest JUnit) and prints passed/failed/skipped
per file and mode, then every test that passes under jax.jit and does not
under nbjit, with the first line of its failure.
"""

from __future__ import annotations

import pathlib
import sys
import xml.etree.ElementTree as ET


def outcomes(path: pathlib.Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, first line of the message)."""
    result = {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                message = (child.get("message") or child.text or "").strip().splitlines()
                message = message[0][:200] if message else ""
                break
            if child.tag == "skipped":
                outcome = "skipped"
        result[name] = (outcome, message)
    return result


def main(out: str) -> int:
    root = pathlib.Path(out)
    modes = [m for m in ("jax", "nbjit") if (root / m).is_dir()]
    files = sorted({p.stem for m in modes for p in (root / m).glob("*.xml")})
    data = {(m, f): outcomes(root / m / f"{f}.xml")
            for m in modes for f in files if (root / m / f"{f}.xml").exists()}
    print(f"{'file':18} {'mode':6} {'passed':>7} {'failed':>7} {'skipped':>8} {'total':>6}")
    for f in files:
        for m in modes:
            if (m, f) not in data:
                print(f"{f:18} {m:6} (no result: timed out or crashed, see {m}/{f}.log)")
                continue
            counts = {"passed": 0, "failed": 0, "skipped": 0}
            for outcome, _ in data[m, f].values():
                counts[outcome] += 1
            print(f"{f:18} {m:6} {counts['passed']:7} {counts['failed']:7} "
                  f"{counts['skipped']:8} {sum(counts.values()):6}")
    if len(modes) == 2:
        for f in files:
            jax_run, nb_run = data.get(("jax", f)), data.get(("nbjit", f))
            if not jax_run or not nb_run:
                continue
            lost = [(name, nb_run.get(name, ("missing", ""))) for name, (o, _) in jax_run.items()
                    if o == "passed" and nb_run.get(name, ("missing", ""))[0] != "passed"]
            print(f"\n{f}: {len(lost)} pass under jax.jit and not under nbjit.jit")
            for name, (outcome, message) in sorted(lost):
                print(f"  {name} [{outcome}] {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "jax_tests_out"))
