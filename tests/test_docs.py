"""The README's and docs' examples run, their links resolve, their tables are generated.

Every ```python block of README.md and docs/*.md is executed, the blocks of
one file in order in one namespace, in this process (so with the 8 host
devices of tests/conftest.py), from a scratch directory. A block with a line
``# doctest: skip (REASON)`` is not run; the reason must say GPU or
multi-process: those examples run in their own harness (scripts/accel_check.sh,
tests/test_multiprocess.py). Every relative link (and ``#anchor``) must
resolve; a link to a ``.py`` file whose text names ``file.py::name`` must
point at a file that defines ``name``. The generated blocks (headline table,
full compare table, slow reasons, binder source) must equal what
scripts/doc_tables.py writes.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import pathlib
import re
import types

import jax
import pytest

import nbjit

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
_SKIP = re.compile(r"\s*#\s*doctest:\s*skip\b(.*)", re.I)  # a comment line of its own
_LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


# ---------------------------------------------------------------------------
# Reading markdown

def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, line number of the first code line, dedented code) per fence."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, ticks, language = opened.groups()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^\s*{ticks}\s*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append((language, i + 2, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def prose(text: str) -> list[str]:
    """The lines outside fenced code, HTML comments blanked (line numbers kept)."""
    text = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    out, fence = [], None
    for line in text.splitlines():
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(2)
            out.append("")
        elif fence is not None:
            if re.match(rf"^\s*{fence}\s*$", line):
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in prose(path.read_text()):
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            seen.setdefault(f"{base}-{n}" if n else base, 1)
    return set(seen)


# ---------------------------------------------------------------------------
# Checking

def run_examples(path: pathlib.Path) -> int:
    """Executes `path`'s python blocks in order in one namespace; returns how many ran.

    A failing block raises its own exception, its traceback pointing at the
    markdown file and line (the code is compiled under that file name).
    """
    namespace: dict = {"__name__": f"docs_example_{path.stem.replace('-', '_')}"}
    ran = 0
    for language, line, code in fenced_blocks(path.read_text()):
        if language != "python":
            continue
        skip = next((m for m in map(_SKIP.match, code.splitlines()) if m), None)
        if skip:
            reason = skip.group(1)
            if not re.search(r"gpu|process", reason, re.I):
                raise ValueError(f"{path}:{line}: '# doctest: skip' needs a reason naming a GPU "
                                 f"or multi-process example (got {reason.strip()!r})")
            continue
        exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)
        ran += 1
    return ran


def broken_links(path: pathlib.Path) -> list[str]:
    """Every relative link of `path` that does not resolve, as 'line: target (why)'."""
    problems = []
    for number, line in enumerate(prose(path.read_text()), 1):
        for text, target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            where = (path.parent / file_part).resolve() if file_part else path
            if not where.exists():
                problems.append(f"{number}: {target} (no such file)")
                continue
            if anchor and where.suffix == ".md" and anchor not in anchors(where):
                problems.append(f"{number}: {target} (no heading #{anchor})")
            named = re.search(r"::(\w+)", text)
            if named and where.suffix == ".py" and not re.search(
                    rf"^\s*(def|class)\s+{named.group(1)}\b", where.read_text(), re.M):
                problems.append(f"{number}: {target} (defines no {named.group(1)})")
    return problems


def _doc_tables() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "scripts" / "doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """Examples run from an empty directory, with global state restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    jit = jax.jit
    yield tmp_path
    nbjit.unpatch_jax()
    root.handlers[:], root.level = handlers, level
    assert jax.jit is jit, "an example left jax.jit patched"


# ---------------------------------------------------------------------------
# The pages

@pytest.mark.parametrize("path", PAGES, ids=_ids(PAGES))
def test_examples_run(path, scratch):
    if "import equinox" in path.read_text() and importlib.util.find_spec("equinox") is None:
        pytest.skip("the page's examples use equinox (nbjit[equinox]), not installed")
    if ".plot(" in path.read_text() and importlib.util.find_spec("matplotlib") is None:
        pytest.skip("the page's examples plot with matplotlib (nbjit[bench]), not installed")
    run_examples(path)


@pytest.mark.parametrize("path", PAGES, ids=_ids(PAGES))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_generated_blocks_are_current():
    tables = _doc_tables()
    assert tables.stale(tables.targets()) == [], "run: python scripts/doc_tables.py"
    assert tables.stale_files() == [], "run: python scripts/doc_tables.py"


def _run_named(text: str) -> tuple[str, ...]:
    """(commit, rows, geomean) that a text names, as far as it names them."""
    found = [re.search(pattern, text) for pattern in (
        r"nbjit ([0-9a-f]{7,})\b", r"(\d+) (?:rows|ratios)", r"geomean ratio (\d\.\d{3})|"
        r"\*\*(\d\.\d{3})\*\*")]
    return tuple(next(g for g in m.groups() if g) if m else None for m in found)


def test_every_published_figure_comes_from_one_run():
    """docs/compare.json, docs/compare.md, docs/compare.png, performance.md's
    table and summary and the README's headline name one run: the same
    commit, row count and geomean (scripts/doc_tables.py writes them all)."""
    tables = _doc_tables()
    data = json.loads((ROOT / "docs" / "compare.json").read_text())
    want = (data["meta"]["versions"]["nbjit_commit"], str(data["summary"]["rows"]),
            f"{data['summary']['geomean']:.3f}")
    performance = (ROOT / "docs" / "performance.md").read_text()
    block = {name: re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text,
                             re.S).group(1)
             for name, text in (("compare", performance), ("summary", performance),
                                ("headline", (ROOT / "README.md").read_text()))}
    md = (ROOT / "docs" / "compare.md").read_text()
    png = tables.png_text(ROOT / "docs" / "compare.png").get("Description", "")
    assert _run_named(md) == want, md[:400]
    assert _run_named(png) == want, png
    assert _run_named(block["summary"]) == want, block["summary"]
    assert _run_named(block["compare"])[0] == want[0]
    assert block["compare"].count("\n| `") == data["summary"]["rows"]
    assert _run_named(block["headline"])[0] == want[0]
    assert "39 rows" not in performance


def test_a_compare_md_or_png_from_another_run_is_stale(tmp_path):
    pytest.importorskip("matplotlib", reason="it draws compare.png (nbjit[bench])")
    tables = _doc_tables()
    (tmp_path / "docs").mkdir()
    for name in ("compare.md", "compare.png", "compare.json"):
        (tmp_path / "docs" / name).write_bytes((ROOT / "docs" / name).read_bytes())
    assert tables.stale_files(tmp_path / "docs" / "compare.json", tmp_path) == []
    data = json.loads((ROOT / "docs" / "compare.json").read_text())
    data["meta"]["versions"]["nbjit_commit"] = "0000000"
    (tmp_path / "docs" / "compare.json").write_text(json.dumps(data))
    assert tables.stale_files(tmp_path / "docs" / "compare.json", tmp_path) == [
        tmp_path / "docs" / "compare.md", tmp_path / "docs" / "compare.png"]
    tables.write_files(tmp_path / "docs" / "compare.json", tmp_path)
    assert tables.stale_files(tmp_path / "docs" / "compare.json", tmp_path) == []
    assert "nbjit 0000000" in (tmp_path / "docs" / "compare.md").read_text()


def test_readme_is_short_with_install_and_numbers_up_front():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    first = "\n".join(lines[:80])
    assert "pip install" in first
    assert "<!-- headline:begin -->" in first and "<!-- headline:end -->" in first


def test_readme_runs_examples_and_names_real_slow_reasons():
    readme = ROOT / "README.md"
    assert sum(lang == "python" for lang, _, _ in fenced_blocks(readme.read_text())) >= 4
    from nbjit.observe.stats import SLOW_REASONS

    block = re.search(r"<!-- slow-reasons:begin -->\n(.*?)\n<!-- slow-reasons:end -->",
                      readme.read_text(), re.S).group(1)
    assert re.findall(r"`(\w+)`", block) == list(SLOW_REASONS)


# ---------------------------------------------------------------------------
# The checks themselves can fail

def test_a_broken_example_fails_and_points_at_its_line(tmp_path, scratch):
    page = tmp_path / "page.md"
    page.write_text("# t\n\n```python\nx = 2\n```\n\ntext\n\n```python\ny = x + 1\n"
                    "assert y == 4, 'wrong'\n```\n")
    with pytest.raises(AssertionError, match="wrong") as info:
        run_examples(page)
    frame = info.traceback[-1]
    assert str(frame.path) == str(page) and frame.lineno + 1 == 11  # 0-based in pytest


def test_examples_share_a_namespace_and_skip_only_with_a_reason(tmp_path, scratch):
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n```python\n# doctest: skip (multi-process)\n"
                    "raise SystemExit\n```\n```bash\nexit 1\n```\n```python\nassert x == 1\n```\n"
                    "- a list:\n\n  ```python\n  assert x == 1\n  ```\n")
    assert run_examples(page) == 3
    page.write_text("```python\n# train.py\n# doctest: skip (slow)\nraise SystemExit\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        run_examples(page)


def test_broken_links_are_reported(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with `code`\n\n## Twice\n\n## Twice\n")
    (tmp_path / "code.py").write_text("def present():\n    pass\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-with-code) [ok](there.md#twice-1)\n"
        "[ok](https://example.com/x) [ok](#local) ![ok](there.md)\n"
        "[gone](missing.md) [bad anchor](there.md#nowhere)\n"
        "[code.py::present](code.py) [code.py::absent](code.py)\n"
        "```\n[in code](also-missing.md)\n```\n<!-- [in a comment](missing-too.md) -->\n"
        "## Local\n")
    assert broken_links(page) == [
        "3: missing.md (no such file)", "3: there.md#nowhere (no heading #nowhere)",
        "4: code.py (defines no absent)"]


def test_doc_tables_replaces_only_its_block_and_knows_its_rows():
    tables = _doc_tables()
    text = "a\n<!-- t:begin -->\nold\n<!-- t:end -->\nb\n"
    assert tables.replace_block(text, "t", "new\nrows") == (
        "a\n<!-- t:begin -->\nnew\nrows\n<!-- t:end -->\nb\n")
    with pytest.raises(ValueError):
        tables.replace_block("no markers", "t", "x")
    row = {"name": "args_1", "n_args": 1, "kind": "jax.Array", "a_us": 7.44, "b_us": 6.1,
           "floor_us": None, "ratio": 1.2249, "ratio_p10": 1.151, "ratio_p90": 1.28, "note": ""}
    meta = {"date": "D", "versions": {"nbjit_commit": "c0ffee", "jax": "J", "jaxlib": "J",
                                      "numba": "N", "python": "P"},
            "machine": {"backend": "cpu", "devices": 8, "cpus": 2}, "settings": {"rounds": 3}}
    assert "| `args_1` | 1 | jax.Array | 7.4 | 6.1 | - | 1.22 | 1.15-1.28 |" in (
        tables.compare_block({"meta": meta, "rows": [row]}))
    with pytest.raises(SystemExit, match="args_2"):
        tables.headline_block({"meta": meta, "rows": [row]})


def test_a_figure_that_differs_from_the_json_is_stale(tmp_path):
    tables = _doc_tables()
    for name in ("README.md", "docs/performance.md", "docs/design.md", "docs/host-inputs.md",
                 "docs/filter-jit.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    data = json.loads((ROOT / "docs" / "compare.json").read_text())
    assert tables.stale(tables.targets(ROOT / "docs" / "compare.json", tmp_path)) == []
    next(row for row in data["rows"] if row["name"] == "args_1")["ratio"] += 0.5
    (tmp_path / "compare.json").write_text(json.dumps(data))
    assert tables.stale(tables.targets(tmp_path / "compare.json", tmp_path)) == [
        f"{tmp_path / 'README.md'}: headline", f"{tmp_path / 'README.md'}: costs",
        f"{tmp_path / 'docs' / 'performance.md'}: compare"]
    assert tables.main(["--check"]) == 0  # the committed pages, from the committed JSON


def test_the_readme_states_costs_and_the_self_check_from_the_numbers():
    """One statement of what small calls and new host values cost, and what the
    run's self-check said, each written from the compare JSON."""
    tables = _doc_tables()
    data = json.loads((ROOT / "docs" / "compare.json").read_text())
    for row in data["rows"]:
        row.update(ratio=0.8, ratio_p10=0.7, ratio_p90=0.9)
    text = tables.costs_block(data)
    assert "Do not use it" not in text and "- **Small calls.** A call with one or two " \
        "`jax.Array`s took 0.80-0.80 (" in text
    assert f"Faster in {len(tables.FRESH_HOST)} (p90 below 1). Slower in 0 (p10 above 1)." \
        in text
    for row in data["rows"]:
        row.update(ratio=1.2, ratio_p10=1.1, ratio_p90=1.3)
    text = tables.costs_block(data)
    assert text.startswith("Do not use it when the last microsecond of small calls matters.")
    assert "- **Small calls cost more.**" in text
    assert f"Faster in 0 (p90 below 1). Slower in {len(tables.FRESH_HOST)} (p10 above 1)." in text
    # short sentences: no sentence of the three facts runs past 40 words
    for fact in text.splitlines():
        for sentence in re.split(r"(?<=\.)\s+(?=[A-Z0-9*])", fact.removeprefix("- ")):
            assert len(re.sub(r"\(p10-p90 spans 1\.0: [^)]*\)", "", sentence).split()) <= 40, \
                sentence
    meta = {}
    assert "no self-check record" in tables.self_check_line(meta)
    meta["self_check_after"] = {"passed": True, "band": [0.9, 1.1], "rows": 40, "outside": []}
    assert "put all 40 rows within 0.9-1.1" in tables.self_check_line(meta)
    meta["self_check_after"] = {"passed": False, "band": [0.9, 1.1], "rows": 40,
                                "outside": [["args_1", 1.15]]}
    assert "failed** (`args_1` 1.15 outside 0.9-1.1)" in tables.self_check_line(meta)


# Dotted names the docs quote from another checkout, on purpose.
HISTORICAL_NAMES = {"nbjit._agreement"}  # docs/multi-controller.md: the exchange at 742c2e5


def _resolve(dotted: str) -> object:
    """The object a dotted name stands for: its longest importable module, then attributes."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


def test_every_dotted_nbjit_name_in_the_docs_exists():
    """README.md and docs/ (pages and notebooks) name only what is there."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "docs").glob("*.ipynb"))]
    names: dict[str, str] = {}
    for page in pages:
        for name in re.findall(r"\bnbjit(?:\.[A-Za-z_]\w*)+", page.read_text()):
            names.setdefault(name, page.name)
    assert len(names) > 20
    missing = []
    for name, page in sorted(names.items()):
        if name in HISTORICAL_NAMES:
            continue
        try:
            _resolve(name)
        except (ImportError, AttributeError) as error:
            missing.append(f"{page}: {name} ({error!r})")
    assert missing == []


def test_the_asv_history_command_finds_python_past_pyenv_shims(tmp_path):
    """docs/benchmarks.md's history commands run asv, which creates its
    virtualenvs with the first `python3.12` on the PATH. A pyenv shim there
    fails when pyenv's selected version is another one (as on the machines
    these docs were written on): the documented PATH line puts the real
    interpreter first. Checked with a shim that always fails, and asv's own
    lookup (`asv.util.which`)."""
    import subprocess
    import sys

    pytest.importorskip("asv")
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("export PATH=")]
    assert "../.venv/bin/python" in line
    line = line.replace("../.venv/bin/python", sys.executable)
    shims = tmp_path / "shims"
    shims.mkdir()
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    shim = shims / f"python{version}"
    shim.write_text(f"#!/bin/sh\necho 'pyenv: python{version}: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    lookup = f"from asv import util; print(util.which('python{version}'))"
    script = f'export PATH="{shims}:$PATH"\n{line}\n"{sys.executable}" -c "{lookup}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=ROOT / "benchmarks")
    assert done.returncode == 0, done.stderr
    found = done.stdout.strip()
    assert found != str(shim)
    check = subprocess.run([found, "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True, timeout=60)
    assert check.stdout.strip() == str(sys.version_info[:2])
    assert "~/.asv-machine.json" in text  # what asv writes outside the repository, said


# ---------------------------------------------------------------------------
# Every figure of the published run comes from it (issue 46)

_GENERATED = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.S)
_FIGURE = re.compile(r"(?<![\w.])[0-2]\.\d{2}(?![\d.])")  # a ratio or a time: 0.36, 1.89


def _prose(text: str) -> str:
    """`text` without its generated blocks, code blocks and version numbers."""
    text = re.sub(r"```.*?```", "", _GENERATED.sub("", text), flags=re.S)
    text = re.sub(r"^\| (?:Python|jax / jaxlib|numba) \|.*$", "", text, flags=re.M)  # versions
    text = re.sub(r"[<>]=? ?\d+(?:\.\d+)+", "", text)  # version bounds: < 0.13
    return re.sub(r"\b(?:numba|[Pp]ython|jax|jaxlib|equinox) \d+(?:\.\d+)+", "", text)


def test_the_readme_quotes_no_figure_outside_its_generated_blocks():
    """README's figures (ratios, host-array ranges) are written from the
    published run by scripts/doc_tables.py; none is typed into its prose."""
    found = _FIGURE.findall(_prose((ROOT / "README.md").read_text()))
    assert found == [], found


def test_no_page_quotes_the_published_run_outside_a_generated_block():
    """A sentence that cites the published run (or a row of compare's) with a
    figure would not follow a new run: such figures live in generated blocks."""
    cites = re.compile(r"published (?:full )?(?:compare|run)|compare\.json|compare's `\w+` row|"
                       r"headline run", re.I)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.name == "compare.md":  # the run's own table, whole
            continue
        text = " ".join(_prose(page.read_text()).split())
        for sentence in re.split(r"(?<=[.!?:])\s+(?=[A-Z*(|`])", text):
            assert not (cites.search(sentence) and _FIGURE.search(sentence)), (
                f"{page.name}: {sentence}")


def test_the_fresh_host_summary_counts_every_loop_with_new_host_values():
    tables = _doc_tables()
    data = json.loads((ROOT / "docs" / "compare.json").read_text())
    assert "workload_mnist_train_step" in tables.FRESH_HOST
    named = {row["name"] for row in data["rows"]}
    assert set(tables.FRESH_HOST) <= named
    new_values = {n for n in named if n.endswith("_new_values") or (
        n.startswith("workload_") and n != "workload_optimizer_update")}
    assert new_values <= set(tables.FRESH_HOST), new_values - set(tables.FRESH_HOST)


def test_rows_whose_spread_spans_one_are_said_to_swing():
    tables = _doc_tables()
    data = json.loads((ROOT / "docs" / "compare.json").read_text())
    for row in data["rows"]:
        row.update(ratio=0.8, ratio_p10=0.7, ratio_p90=0.9)
    assert "Slower in 0 (p10 above 1). 0 swing across 1.0" in tables.costs_block(data)
    assert ") swings |" not in tables.host_arrays_table(data)
    mnist = next(r for r in data["rows"] if r["name"] == "workload_mnist_train_step")
    fresh_1m = next(r for r in data["rows"] if r["name"] == "host_array_fresh_1m")
    for row in (mnist, fresh_1m):
        row.update(ratio=1.02, ratio_p10=0.9, ratio_p90=1.2)
    text = tables.costs_block(data)
    assert "1 swing across 1.0 between runs (p10-p90 spans 1.0: " \
           "`workload_mnist_train_step`)" in text
    assert "Here 1 of the 12 swing across 1.0 between runs (p10-p90 spans 1.0: " \
           "`host_array_fresh_1m`)" in text
    assert "| 1.02 (0.90-1.20) swings |" in tables.host_arrays_table(data)


def test_the_tpu_blocks_name_the_committed_tpu_runs():
    """README's `tpu` block, performance.md's `tpu-compare` and host-inputs.md's
    `tpu-loop` are written from docs/compare-tpu.json and
    docs/training-loop-tpu.json, one commit, with the self-check's record."""
    data = json.loads((ROOT / "docs" / "compare-tpu.json").read_text())
    loop = json.loads((ROOT / "docs" / "training-loop-tpu.json").read_text())
    commit = data["meta"]["versions"]["nbjit_commit"]
    assert data["meta"]["machine"]["backend"] == "tpu" and loop["commit"]
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- tpu:begin -->\n(.*?)<!-- tpu:end -->", readme, re.S).group(1)
    assert f"nbjit {commit}" in block and "self-check" in block
    record = data["meta"].get("self_check_after")
    if record is None:  # a run without one says so where its numbers are shown
        assert "This run has no self-check record" in block
    else:
        assert record["rows"] == data["summary"]["rows"]
    if loop["commit"] != commit:  # two runs: each named by its commit
        assert f"run at nbjit {loop['commit']}" in block
    for r in loop["loops"]:
        width = f", hidden width {r['width']}" if r.get("width", 512) != 512 else ""
        assert f"batch {r['batch']}{width}: {r['step_ratio']:.2f} a step" in block
    host_inputs = (ROOT / "docs" / "host-inputs.md").read_text()
    assert f"nbjit {loop['commit']}, jax" in host_inputs
    performance = (ROOT / "docs" / "performance.md").read_text()
    table = re.search(r"<!-- tpu-compare:begin -->\n(.*?)<!-- tpu-compare:end -->",
                      performance, re.S).group(1)
    assert table.count("\n| `") == len(data["rows"])  # (skipped ones with their reason)
    assert sum(r["ratio"] is not None for r in data["rows"]) == data["summary"]["rows"]


def test_rows_that_move_with_the_machines_memory_say_so_where_quoted():
    """The host-array rows and the 25 MB transfer read 0.2 on one machine and
    1.0 on another: every page that quotes them says so, and the README's
    headline holds calls with jax.Arrays only (dispatch itself)."""
    tables = _doc_tables()
    data = json.loads((ROOT / "docs" / "compare.json").read_text())
    assert all("numpy" not in label and "scalar" not in label and not tables.memory_bound(name)
               for name, label in tables.HEADLINE)
    compare = tables.compare_block(data).splitlines()
    marked = [r["name"] for r in data["rows"] if tables.memory_bound(r["name"])]
    assert len(marked) == 13
    for name in marked:
        (line,) = [line for line in compare if line.startswith(f"| `{name}`")]
        assert "(machine-dependent: memory)" in line, line
    assert "Every row is machine-dependent" in tables.host_arrays_table(data)
    assert "- **Host arrays depend on the machine.**" in tables.costs_block(data)


def test_readme_says_how_long_its_two_commands_take():
    readme = (ROOT / "README.md").read_text()
    for command in ("compare", "test"):
        assert re.search(rf"^bash scripts/{command}\.sh +# ~[\d.]+ min", readme, re.M), command
    measured = re.search(r"`test\.sh` (\d+) min \d+ s .*`compare\.sh` (\d+) min \d+ s", readme,
                         re.S)
    assert measured and all(int(m) > 0 for m in measured.groups())
