"""Writes the generated blocks of README.md and docs/*.md; no figure is copied by hand.

    python scripts/doc_tables.py                # rewrite the blocks in place
    python scripts/doc_tables.py --check        # exit 1 (and name them) if any block is stale
    python scripts/doc_tables.py --json FILE    # tables from another compare run's JSON

A block is the text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``:

- ``headline`` in README.md: a few rows of the committed compare run
  (docs/compare.json, written by ``python -m nbjit compare --json``), with
  what its self-check said (``compare`` runs one when it writes into docs/
  and writes nothing there when it fails): calls with jax.Arrays only,
  which compare dispatch itself; rows that bring host values move with the
  machine's memory and are said in ``costs``;
- ``costs`` in README.md: what small calls, loops with new host values and
  host arrays cost in that run, three facts in short sentences, from its
  rows (so the README says it once);
- ``host-arrays`` in docs/host-inputs.md: the host-array rows of that run
  as a table (the README's ``costs`` says them in one sentence);
- ``filter`` in README.md: what `nbjit.filter_jit`'s rows read in that run;
  ``filter-rows`` in docs/filter-jit.md: those rows as a table;
- ``compare`` in docs/performance.md: every row of that run, and ``summary``
  there: its geomean and verdicts in one sentence;
- ``slow-reasons`` in README.md: the names of `nbjit.observe.stats.SLOW_REASONS`;
- ``binder`` in docs/design.md: the binder nbjit generates for
  ``f(x, y)`` with two jax.Arrays;
- ``modules`` in docs/design.md: every module of nbjit/, room by room, with
  the first sentence of its docstring;
- ``rooms`` in docs/design.md: which room imports which, read from the code,
  and which it may (tests/test_layers.py's `MAY_IMPORT`);
- ``tpu`` in README.md, ``tpu-compare`` in docs/performance.md and
  ``tpu-loop`` in docs/host-inputs.md: the committed run on a TPU
  (docs/compare-tpu.json, ``compare --quick`` there, its self-check in its
  metadata; docs/training-loop-tpu.json, ``benchmarks/training_loop.py``
  there).

Whole files, from the same JSON: docs/compare.md (the table as ``compare``
prints it) and docs/compare.png (the plot; its PNG metadata names the run,
and it is redrawn only when that differs).

The last two blocks and the whole files import nbjit (and so jax) from this
checkout.

After a new compare run (``python -m nbjit compare --json docs/compare.json``,
which runs its self-check before writing into docs/), run this script: every
figure the docs quote then comes from that one run. tests/test_docs.py checks
that every block and file equals what this script writes, and that all of
them name one run (commit, rows, geomean). A row whose p10-p90 spans 1.0
is said to swing across 1.0 between runs, wherever a block names rows.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's nbjit, installed or not
    sys.path.insert(0, str(ROOT))
COMPARE_JSON = ROOT / "docs" / "compare.json"
TPU_COMPARE_JSON = ROOT / "docs" / "compare-tpu.json"
TPU_LOOP_JSON = ROOT / "docs" / "training-loop-tpu.json"

# The README's rows: (scenario name, what the call passes). Each must be in
# the JSON; a renamed scenario fails loudly here rather than vanishing. Calls
# with jax.Arrays only: what they compare is dispatch (nbjit's Python against
# jaxlib's C++), not how the machine copies host memory.
HEADLINE: list[tuple[str, str]] = [
    ("args_1", "1 jax.Array"),
    ("args_2", "2 jax.Arrays"),
    ("args_10", "10 jax.Arrays"),
    ("args_100", "100 jax.Arrays"),
    ("args_1000", "1000 jax.Arrays"),
    ("dict_100_leaves", "a dict of 100 jax.Arrays"),
    ("static_args_kwargs", "static argument + keywords"),
    ("params_dict_step_32", "SGD step: a params dict of 32 jax.Arrays + batch"),
]


# The rows behind the README's sentences (`costs_block`): calls with one or two
# jax.Arrays, and every row whose call brings new host values.
SMALL_CALLS = ["args_1", "args_2"]
FRESH_HOST = ["numpy_args_2_new_values", "python_scalars_2_new_values", "workload_train_step",
              "workload_masked_train_step", "workload_optimizer_update", "workload_env_step",
              "workload_static_config", "workload_data_parallel_8_devices",
              "workload_mnist_train_step", "workload_training_loop"]

# Rows whose ratio moves with the machine's memory behaviour (whether
# jax.jit's put reads the caller's array in place or copies it, what page
# faults in fresh buffers cost): the host-array rows and the 25 MB transfer.
# Another machine read `host_array_same_64k` near 1 where the published run
# read a fifth of that: wherever they are quoted, they say so.
MEMORY_NOTE = ("machine-dependent: the ratio moves with the machine's memory behaviour "
               "(whether jax.jit's put reads the array in place or copies it, what page "
               "faults cost)")


def memory_bound(name: str) -> bool:
    return name.startswith("host_array_") or name == "jit_dispatch_with_transfer"


# The host-array rows (`f(params, x)`, x a float32 numpy array): (name suffix,
# size as the docs say it), and (name infix, what the caller passes).
HOST_SIZES = [("8k", "8 KiB"), ("64k", "64 KiB"), ("1m", "1 MiB")]
HOST_KINDS = [("same", "", "the same array every call"),
              ("same", "_aligned", "the same array, 64-byte aligned"),
              ("fresh", "", "new values every call (one of 4 arrays in turn)"),
              ("fresh", "_aligned", "new values, 64-byte aligned arrays (read in place by "
                                    "jax.jit)")]


def _rows(data: dict[str, Any], names: Sequence[str]) -> list[dict[str, Any]]:
    rows = {row["name"]: row for row in data["rows"]}
    missing = [name for name in names if name not in rows]
    if missing:
        raise SystemExit(f"doc_tables.py: scenarios {missing} are not in the compare JSON; "
                         "update scripts/doc_tables.py")
    return [rows[name] for name in names]


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _ratio(row: dict[str, Any]) -> tuple[str, str]:
    if row.get("ratio") is None:
        return "-", "-"
    return f"{row['ratio']:.2f}", f"{row['ratio_p10']:.2f}-{row['ratio_p90']:.2f}"


def swings(row: dict[str, Any]) -> bool:
    """The row's p10-p90 spans 1.0: between runs it lands on either side."""
    return row["ratio_p10"] <= 1 <= row["ratio_p90"]


def _run_line(meta: dict[str, Any]) -> str:
    v, m = meta["versions"], meta["machine"]
    commit = v.get("nbjit_commit") or v.get("nbjit", "?")
    rounds = meta.get("settings", {}).get("rounds")
    return (f"Run of {meta['date']}: nbjit {commit}, jax {v['jax']}, jaxlib {v['jaxlib']}, "
            f"numba {v['numba']}, Python {v['python']}; {m['backend']} x{m['devices']} "
            f"devices on {m['cpus']} CPUs; {rounds} paired rounds per row.")


def self_check_line(meta: dict[str, Any]) -> str:
    """What the run's self-check (jax.jit against itself, right after) said."""
    record = meta.get("self_check_after")
    if record is None:
        return ("This run has no self-check record (jax.jit against itself right after it, "
                "which `python -m nbjit compare` runs when it writes into docs/): nothing "
                "says how much of its spread was the machine.")
    lo, hi = record["band"]
    if record["passed"]:
        return (f"The self-check right after it (jax.jit against itself) put all "
                f"{record['rows']} rows within {lo}-{hi}.")
    outside = ", ".join(f"`{name}` {ratio:.2f}" for name, ratio in record["outside"])
    return (f"**The self-check right after it failed** ({outside} outside {lo}-{hi}): "
            "the machine was noisy; read these numbers as such.")


def headline_block(data: dict[str, Any]) -> str:
    """The README's table: ratio = nbjit / jax.jit per call, a few rows."""
    rows = _rows(data, [name for name, _ in HEADLINE])
    lines = ["| a call with | nbjit us | jax.jit us | nbjit / jax.jit | p10-p90 |",
             "|---|---:|---:|---:|---:|"]
    for (name, label), row in zip(HEADLINE, rows, strict=True):
        ratio, spread = _ratio(row)
        lines.append(f"| {label} (`{name}`) | {_us(row['a_us'])} | {_us(row['b_us'])} "
                     f"| **{ratio}** | {spread} |")
    lines += ["", _run_line(data["meta"]) + " Below 1: nbjit is faster. "
              + self_check_line(data["meta"]) + " Calls that bring host values (numpy "
              "arrays, Python scalars) are left out here: their ratio moves with the "
              "machine's memory ([above](#when-to-use-it-and-when-not)). Every row: "
              "[docs/performance.md](docs/performance.md)."]
    return "\n".join(lines)


def costs_block(data: dict[str, Any]) -> str:
    """The README's one statement of what small calls, new host values and host
    arrays cost: three facts, each in short sentences."""
    small = _rows(data, SMALL_CALLS)
    ratios = [r["ratio"] for r in small]
    names = ", ".join(f"`{r['name']}` {r['ratio']:.2f}" for r in small)
    lead = "What it cost in the run below, in times jax.jit's time (below 1: nbjit is faster):"
    first = (f"- **Small calls{' cost more' if min(ratios) > 1 else ''}.** A call with one or "
             f"two `jax.Array`s took {min(ratios):.2f}-{max(ratios):.2f} ({names}).")
    if min(ratios) > 1:
        lead = "Do not use it when the last microsecond of small calls matters. " + lead
        first += " That is nbjit's Python against jaxlib's C++."
    fresh = [r for r in _rows(data, FRESH_HOST) if r.get("ratio") is not None]
    faster = sum(r["ratio_p90"] < 1 for r in fresh)
    slower = sum(r["ratio_p10"] > 1 for r in fresh)
    lo, hi = min(r["ratio"] for r in fresh), max(r["ratio"] for r in fresh)
    swinging = [r for r in fresh if swings(r)]
    return "\n".join([
        lead,
        first,
        f"- **Loops with new host values.** {len(fresh)} rows pass a fresh batch or action "
        f"each call (the training loop: per step). They took {lo:.2f}-{hi:.2f}. "
        f"Faster in {faster} (p90 below 1). Slower in {slower} (p10 above 1). "
        f"{len(swinging)} swing across 1.0 between runs{_swing_list(swinging)}. "
        "They copy host memory too, so they move with the machine. On the CPU nbjit writes "
        "such values into memory that device arrays alias: no transfer "
        "([docs/host-inputs.md](docs/host-inputs.md)).",
        host_arrays_block(data)])


def _swing_list(rows: Sequence[dict[str, Any]]) -> str:
    """`` (p10-p90 spans 1.0: `a`, `b`)`` for rows that swing, or ""."""
    if not rows:
        return ""
    return " (p10-p90 spans 1.0: " + ", ".join(f"`{r['name']}`" for r in rows) + ")"


def _host_rows(data: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(what the caller passes, its rows by size) for each kind of host-array row."""
    return [(label, _rows(data, [f"host_array_{kind}_{size}{suffix}" for size, _ in HOST_SIZES]))
            for kind, suffix, label in HOST_KINDS]


def host_arrays_block(data: dict[str, Any]) -> str:
    """The README's fact on host arrays: the `host_array_*` rows of the run."""
    rows = [r for _, kind_rows in _host_rows(data) for r in kind_rows]
    lo, hi = min(r["ratio"] for r in rows), max(r["ratio"] for r in rows)
    swinging = [r for r in rows if swings(r)]
    text = (f"- **Host arrays depend on the machine.** A call `f(params, x)` with a numpy `x` "
            f"of {HOST_SIZES[0][1]} to {HOST_SIZES[-1][1]} took {lo:.2f}-{hi:.2f} (the "
            f"{len(rows)} `host_array_*` rows). The ratio moves with the machine's memory: "
            "whether jax.jit's put reads `x` in place or copies it, and what page faults "
            "cost. On another machine a row can land on the other side of 1.0.")
    if swinging:
        text += (f" Here {len(swinging)} of the {len(rows)} swing across 1.0 between runs"
                 f"{_swing_list(swinging)}.")
    return text + (" Every row, and why: [docs/host-inputs.md](docs/host-inputs.md"
                   "#where-the-ratios-stand-and-their-floor).")


def host_arrays_table(data: dict[str, Any]) -> str:
    """docs/host-inputs.md's table of the host-array rows: ratio and p10-p90."""
    lines = ["| x | " + " | ".join(size for _, size in HOST_SIZES) + " |",
             "|---|" + "---:|" * len(HOST_SIZES)]
    for label, rows in _host_rows(data):
        cells = [f"{r['ratio']:.2f} ({r['ratio_p10']:.2f}-{r['ratio_p90']:.2f})"
                 + (" swings" if swings(r) else "") for r in rows]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", "nbjit / jax.jit per call, median (p10-p90) of paired "
                       "rounds; \"swings\": the p10-p90 spans 1.0, so between runs the row "
                       f"lands on either side. Every row is {MEMORY_NOTE}: on another machine "
                       "a row can land on the other side of 1.0. " + _run_line(data["meta"])
                       + " " + self_check_line(data["meta"])])


FILTER_JIT = ["filter_jit_mlp_step_depth_2", "filter_jit_mlp_step_depth_8",
              "filter_jit_static_fields_step", "filter_jit_fresh_numpy_batch",
              "filter_jit_error_if_step"]


def filter_block(data: dict[str, Any]) -> str:
    """The README's sentence on nbjit.filter_jit: its rows time it against the
    ideal (jax.jit on arrays split out beforehand) and equinox.filter_jit."""
    rows = [r for r in _rows(data, FILTER_JIT) if r.get("ratio") is not None]
    if not rows:
        return "(equinox was not installed for the headline run: no filter_jit rows.)"
    ideal = [r["ratio"] for r in rows]
    eqx = [r["other_ratios"]["equinox"] for r in rows if (r.get("other_ratios") or {}).get(
        "equinox") is not None]
    text = (f"In the headline run ([how fast](#how-fast)) its {len(rows)} equinox steps took "
            f"{min(ideal):.2f}-{max(ideal):.2f} times that ideal")
    swinging = sum(swings(r) for r in rows)
    if swinging:
        text += f" ({swinging} of them swing across 1.0 between runs)"
    if eqx:
        text += f" and {min(eqx):.2f}-{max(eqx):.2f} times `equinox.filter_jit`'s time"
    return text + " ([docs/performance.md](docs/performance.md), `filter_jit_*` rows)."


def filter_table(data: dict[str, Any]) -> str:
    """docs/filter-jit.md's table: each filter_jit row against the ideal and equinox."""
    lines = ["| row | nbjit.filter_jit / ideal (p10-p90) | "
             "nbjit.filter_jit / equinox.filter_jit (p10-p90) |", "|---|---|---|"]
    for r in _rows(data, FILTER_JIT):
        if r.get("ratio") is None:
            continue
        eqx = (r.get("other_ratios") or {}).get("equinox")
        # its spread is in the row's note: "a/equinox 0.553 [0.371-0.650]"
        spread = re.search(r"a/equinox [\d.]+ \[([\d.]+)-([\d.]+)\]", r.get("note") or "")
        eqx_text = "-" if eqx is None else f"{eqx:.2f}" + (
            f" ({float(spread[1]):.2f}-{float(spread[2]):.2f})" if spread else "")
        lines.append(f"| `{r['name']}` | {r['ratio']:.2f} ({r['ratio_p10']:.2f}-"
                     f"{r['ratio_p90']:.2f}){' swings' if swings(r) else ''} | {eqx_text} |")
    return "\n".join([_run_line(data["meta"]), "", *lines])


def summary_block(data: dict[str, Any]) -> str:
    """docs/performance.md's sentence on the whole run: geomean and verdicts."""
    s, meta = data["summary"], data["meta"]
    commit = meta["versions"].get("nbjit_commit") or "?"
    return (f"The same run as the command prints it: [compare.md](compare.md) (nbjit {commit}, "
            f"{meta['date']}). Geometric mean of its {s['rows']} ratios: "
            f"**{s['geomean']:.3f}**, with nbjit faster in {s['faster']} rows (p90 < 1), "
            f"slower in {s['slower']} (p10 > 1), and {s['within_noise']} swinging across 1.0 "
            "between runs (p10-p90 spans 1.0). "
            + self_check_line(meta))


def compare_block(data: dict[str, Any]) -> str:
    """docs/performance.md's table: every row of the run."""
    lines = [_run_line(data["meta"]) + f" Rows marked machine-dependent: {MEMORY_NOTE}.", "",
             "| scenario | n | inputs | nbjit us | jax.jit us | floor us | ratio | p10-p90 |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for row in data["rows"]:
        ratio, spread = _ratio(row)
        note = f" ({row['note']})" if row.get("note") else ""
        if memory_bound(row["name"]):
            note += " (machine-dependent: memory)"
        lines.append(f"| `{row['name']}`{note} | {row['n_args']} | {row['kind']} "
                     f"| {_us(row['a_us'])} | {_us(row['b_us'])} | {_us(row['floor_us'])} "
                     f"| {ratio} | {spread} |")
    return "\n".join(lines)


# The README's TPU sentence: (row, what it is), the rows a TPU user meets most.
TPU_ROWS: list[tuple[str, str]] = [
    ("python_scalars_2_new_values", "two new Python scalars"),
    ("numpy_args_2", "two numpy arrays"),
    ("workload_mnist_train_step", "an MNIST step with a new numpy batch"),
    ("host_array_same_1m", "the same 1 MiB numpy array each call"),
    ("host_array_fresh_1m", "one of four 1 MiB numpy arrays in turn"),
    ("workload_static_config", "a static config and a new numpy batch"),
    ("jit_dispatch_with_transfer", "one 25 MB numpy array"),
    ("args_1", "one jax.Array"),
    ("args_100", "100 jax.Arrays"),
]


def _ready_ratio(row: dict[str, Any]) -> str:
    """The row's ratio (until the result is ready for a row of asynchronous
    work, with the ratio until the call returned beside it)."""
    ratio, spread = _ratio(row)
    if row.get("return_ratio") is not None:
        return f"{ratio} ({spread}) until ready, {row['return_ratio']:.2f} until the call returns"
    return f"{ratio} ({spread})"


def _width(row: dict[str, Any]) -> str:
    """", hidden width W" where the loop's MLP is not the default 784-512-512-10."""
    return f", hidden width {row['width']}" if row.get("width", 512) != 512 else ""


def _loop_sentence(loop: dict[str, Any]) -> str:
    parts = [f"batch {r['batch']}{_width(r)}: {r['step_ratio']:.2f} a step "
             f"({r['step_p10_p90'][0]:.2f}-{r['step_p10_p90'][1]:.2f}), calls returning at "
             f"{r['call_ratio']:.2f}{_over_copies(r)}, losses "
             f"{'equal' if r['losses_equal'] else 'NOT equal'}"
             for r in loop["loops"]]
    w = loop["writes_after_the_call"]
    return ("; ".join(parts) + f". A write to the numpy input right after the call changed "
            f"{w['changed']['jax.jit']} of {w['calls']} of jax.jit's results and "
            f"{w['changed']['nbjit']} of nbjit's.")


def _over_copies(row: dict[str, Any]) -> str:
    """", against jax.jit on copies the loop makes R" where the run measured it."""
    if row.get("over_copies") is None:
        return ""
    return f", against jax.jit on copies the loop makes {row['over_copies']:.2f}"


def _loop_commit(data: dict[str, Any], loop: dict[str, Any]) -> str:
    """", run at nbjit C" where the loop's run is of another commit than the compare's."""
    commit = loop.get("commit")
    same = commit == data["meta"]["versions"].get("nbjit_commit")
    return "" if same or not commit else f"; run at nbjit {commit}"


def tpu_block(data: dict[str, Any], loop: dict[str, Any]) -> str:
    """The README's statement of what a TPU user gets, from the TPU runs."""
    meta = data["meta"]
    v = meta["versions"]
    rows = _rows(data, [name for name, _ in TPU_ROWS])
    cells = "; ".join(f"{label} {_ready_ratio(row)}"
                      for (_, label), row in zip(TPU_ROWS, rows, strict=True))
    return (f"On a TPU v5e ({meta['date']}, nbjit {v.get('nbjit_commit') or '?'}, jax "
            f"{v['jax']}, Python {v['python']}; nbjit / jax.jit, below 1 nbjit is faster): "
            f"{cells}. The training loop of `benchmarks/training_loop.py` (an MLP, a new "
            f"numpy batch each step, no block per step{_loop_commit(data, loop)}): "
            f"{_loop_sentence(loop)} "
            + self_check_line(meta) + "".join(f" Note: {note}." for note in loop.get("notes", []))
            + " Every row: [docs/performance.md](docs/performance.md#on-a-tpu).")


def tpu_compare_block(data: dict[str, Any]) -> str:
    """docs/performance.md's TPU table: every row of the TPU run, and its summary."""
    s, meta = data["summary"], data["meta"]
    body = compare_block(data)
    notes = "".join(f"\n\nNote: {note}." for note in meta.get("notes", []))
    return (body + notes + f"\n\nGeometric mean of its {s['rows']} ratios: **{s['geomean']:.3f}**, "
            f"with nbjit faster in {s['faster']} rows (p90 < 1), slower in {s['slower']} "
            f"(p10 > 1), and {s['within_noise']} swinging across 1.0 (p10-p90 spans 1.0). "
            + self_check_line(meta))


def tpu_loop_block(loop: dict[str, Any]) -> str:
    """docs/host-inputs.md's table of the training loop on the TPU."""
    lines = [f"nbjit {loop.get('commit', '?')}, jax {loop['jax']}, {loop['device']}; nbjit / "
             "jax.jit, median (p10-p90) of interleaved rounds:", "",
             "| batch | hidden width | jax.jit us a step | nbjit us a step | a step "
             "| until each call returns | jax.jit on copies the loop makes: us a step, nbjit / it "
             "| losses | host inputs |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in loop["loops"]:
        copies = ("-" if r.get("over_copies") is None else
                  f"{r['copies_step_us']:.0f}, {r['over_copies']:.2f} "
                  f"({r['over_copies_p10_p90'][0]:.2f}-{r['over_copies_p10_p90'][1]:.2f})")
        lines.append(f"| {r['batch']} | {r.get('width', 512)} | {r['jax_step_us']:.0f} "
                     f"| {r['nbjit_step_us']:.0f} "
                     f"| {r['step_ratio']:.2f} ({r['step_p10_p90'][0]:.2f}-"
                     f"{r['step_p10_p90'][1]:.2f}) | {r['call_ratio']:.2f} | {copies} "
                     f"| {'equal' if r['losses_equal'] else 'NOT equal'} "
                     f"| {r['host_inputs'] or '-'} |")
    w = loop["writes_after_the_call"]
    lines += ["", f"A write to the numpy input right after the call (8 KiB to 25 MiB, "
              f"{w['calls']} calls each): jax.jit's result changed {w['changed']['jax.jit']} "
              f"times, nbjit's {w['changed']['nbjit']}."]
    return "\n".join(lines)


def slow_reasons_block() -> str:
    """The slow reasons' names, as the dispatcher counts them."""
    from nbjit.observe.stats import SLOW_REASONS

    return ", ".join(f"`{name}`" for name in SLOW_REASONS)


def binder_block() -> str:
    """The source nbjit generates for a two-argument positional call."""
    import jax.numpy as jnp

    import nbjit

    f = nbjit.jit(lambda x, y: x + y)
    source = nbjit.binder_source(f, jnp.ones(2), jnp.ones(2))
    return "```python\n" + source.rstrip("\n") + "\n```"


def _layers() -> Any:
    """tests/test_layers.py: the rooms, their rules and the imports it reads."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("test_layers", ROOT / "tests" / "test_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The rooms in the order the docs show them: the face, the base, then bottom up.
ROOM_ORDER = ["face", "_common", "_domains", "_jax", "_kernels", "core", "host", "observe",
              "multiprocess", "filter", "routing", "bench"]


def _first_sentence(path: pathlib.Path) -> str:
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?\.)(\s|$)", paragraph)
    text = (match.group(1) if match else paragraph).rstrip(".")
    return text.replace("|", "\\|")


def modules_block() -> str:
    """design.md's module table: every module, room by room (read from nbjit/)."""
    layers = _layers()
    lines = ["| file | what it holds (its docstring's first sentence) |", "|---|---|"]
    for room in ROOM_ORDER:
        names = sorted(m for m in layers.MODULES if layers.room_of(m) == room)
        package = layers.MODULES.get(f"nbjit.{room}")
        if package is not None and package.name == "__init__.py":  # a folder: its docstring
            lines.append(f"| **`nbjit/{room}/`** | **{_first_sentence(package)}** |")
        for name in names:
            path = layers.MODULES[name]
            what = ("the room's docstring (the heading above)"
                    if path == package and path.name == "__init__.py" else _first_sentence(path))
            lines.append(f"| `{path.relative_to(ROOT)}` | {what} |")
    return "\n".join(lines)


def rooms_block() -> str:
    """design.md's room graph: what each room imports (read from the code) and may import."""
    layers = _layers()
    graph = layers.room_graph()
    lines = ["| room | imports (read from the code) | may import (tests/test_layers.py) |",
             "|---|---|---|"]
    for room in ROOM_ORDER:
        found = [r for r in ROOM_ORDER if r in graph.get(room, set())]
        allowed = [r for r in ROOM_ORDER if r in layers.MAY_IMPORT[room]]
        lines.append(f"| `{room}` | {', '.join(f'`{r}`' for r in found) or '-'} "
                     f"| {', '.join(f'`{r}`' for r in allowed) or '-'} |")
    if layers.PENDING:
        pending = ", ".join(f"`{a}` -> `{b}`" for a, b in sorted(layers.PENDING))
        lines += ["", f"Imports still to move out of the core (pending): {pending}."]
    return "\n".join(lines)


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the block NAME's content replaced by `body` (markers kept)."""
    pattern = re.compile(rf"(<!-- {name}:begin -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"no '<!-- {name}:begin -->' ... '<!-- {name}:end -->' block")
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text,
                       count=1)


def targets(compare_json: pathlib.Path = COMPARE_JSON,
            root: pathlib.Path = ROOT) -> list[tuple[pathlib.Path, str, Callable[[], str]]]:
    """(file, block name, body maker) for every generated block."""
    data = json.loads(compare_json.read_text())
    tpu = json.loads(TPU_COMPARE_JSON.read_text())
    loop = json.loads(TPU_LOOP_JSON.read_text())
    return [
        (root / "README.md", "tpu", lambda: tpu_block(tpu, loop)),
        (root / "docs" / "performance.md", "tpu-compare", lambda: tpu_compare_block(tpu)),
        (root / "docs" / "host-inputs.md", "tpu-loop", lambda: tpu_loop_block(loop)),
        (root / "README.md", "headline", lambda: headline_block(data)),
        (root / "README.md", "costs", lambda: costs_block(data)),
        (root / "README.md", "filter", lambda: filter_block(data)),
        (root / "docs" / "host-inputs.md", "host-arrays", lambda: host_arrays_table(data)),
        (root / "docs" / "filter-jit.md", "filter-rows", lambda: filter_table(data)),
        (root / "README.md", "slow-reasons", slow_reasons_block),
        (root / "docs" / "performance.md", "compare", lambda: compare_block(data)),
        (root / "docs" / "performance.md", "summary", lambda: summary_block(data)),
        (root / "docs" / "design.md", "binder", binder_block),
        (root / "docs" / "design.md", "modules", modules_block),
        (root / "docs" / "design.md", "rooms", rooms_block),
    ]


def _shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def stale(blocks: Sequence[tuple[pathlib.Path, str, Callable[[], str]]]) -> list[str]:
    """The blocks whose text differs from what this script writes."""
    out = []
    for path, name, make in blocks:
        text = path.read_text()
        if replace_block(text, name, make()) != text:
            out.append(f"{_shown(path)}: {name}")
    return out


def compare_md(compare_json: pathlib.Path = COMPARE_JSON) -> str:
    """docs/compare.md: the run's table, as ``compare --markdown`` writes it."""
    from nbjit import bench

    return bench.format_markdown(*bench.read_json(str(compare_json)))


def png_text(path: pathlib.Path) -> dict[str, str]:
    """The tEXt entries of a PNG file (matplotlib writes its metadata there)."""
    import struct
    import zlib

    data, out, at = path.read_bytes(), {}, 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        at += 12 + length
    return out


def compare_png_stale(compare_json: pathlib.Path = COMPARE_JSON,
                      png: pathlib.Path = ROOT / "docs" / "compare.png") -> bool:
    """Whether docs/compare.png was drawn from another run than the JSON's."""
    from nbjit import bench

    want = bench.run_description(*bench.read_json(str(compare_json)))
    return not png.exists() or png_text(png).get("Description") != want


def stale_files(compare_json: pathlib.Path = COMPARE_JSON, root: pathlib.Path = ROOT
                ) -> list[pathlib.Path]:
    """The generated whole files (compare.md, compare.png) that differ from the JSON's run."""
    out = []
    md = root / "docs" / "compare.md"
    if not md.exists() or md.read_text() != compare_md(compare_json):
        out.append(md)
    if compare_png_stale(compare_json, root / "docs" / "compare.png"):
        out.append(root / "docs" / "compare.png")
    return out


def write_files(compare_json: pathlib.Path = COMPARE_JSON, root: pathlib.Path = ROOT) -> None:
    """Writes the whole files that `stale_files` names."""
    from nbjit import bench

    for path in stale_files(compare_json, root):
        if path.suffix == ".md":
            path.write_text(compare_md(compare_json))
        else:
            bench.plot(str(path), *bench.read_json(str(compare_json)))
        print(f"wrote {_shown(path)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks")
    parser.add_argument("--json", type=pathlib.Path, default=COMPARE_JSON,
                        help="compare run JSON (default docs/compare.json)")
    args = parser.parse_args(argv)
    blocks = targets(args.json)
    if args.check:
        found = stale(blocks) + [f"{_shown(p)} (the whole file)" for p in stale_files(args.json)]
        for item in found:
            print(f"stale: {item} (run python scripts/doc_tables.py)")
        return 1 if found else 0
    for path, name, make in blocks:
        text = path.read_text()
        new = replace_block(text, name, make())
        if new != text:
            path.write_text(new)
            print(f"wrote {_shown(path)}: {name}")
    write_files(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
