"""The compare machinery runs and reports (no speed is asserted here)."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import operator
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _env import child_env

from nbjit import __main__ as cli
from nbjit import bench
from nbjit._jax import jax_jit
from nbjit.bench import matrix
from nbjit.routing import devices as _devices

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = bench.Settings(rounds=3, min_rounds=2, target_batch_s=0.0005, max_seconds=0.2,
                         warmup_calls=1)


def _tiny_matrix() -> list[bench.Scenario]:
    def simple() -> bench.Case:
        return bench.Case(operator.add, (jax.device_put(1), jax.device_put(2)))

    return [
        bench.Scenario("tiny_dispatch", 2, "jax.Array", simple, block=False, family="tiny"),
        bench.Scenario("tiny_call", 2, "jax.Array", simple, block=True),
        bench.Scenario("tiny_miss", 1, "new function", matrix._cache_miss, block=True),
        bench.Scenario("tiny_many_devices", 1, "x", simple, block=False, min_devices=10_000),
    ]


def test_interleave_pairs_and_ratios():
    calls = []
    fast = lambda: calls.append("a")
    slow = lambda: (calls.append("b"), time.sleep(0.0002))
    result = bench.interleave([("a", fast), ("b", slow)], TINY)
    assert result.per_call_s.shape[1] == 2 and result.per_call_s.shape[0] >= 2
    assert (result.per_call_s > 0).all()
    ratio = result.ratio("a", "b")
    assert ratio.p10 <= ratio.median <= ratio.p90
    assert 0 < ratio.median < 1  # the sleeper is slower, whatever the machine
    assert set(calls) == {"a", "b"}


def test_time_batch_sync_each_reports_median():
    synced = []
    dt, out = bench.time_batch(lambda: 7, 5, sync_each=synced.append)
    assert out == 7 and synced == [7] * 5 and dt >= 0


def test_select_any_regex_a_plain_word_a_substring():
    """`--only 'a|b'`: either (issue 46: an unanchored alternation matched nothing)."""
    names = [s.name for s in bench.select(bench.scenarios(), "host_array_fresh|workload_mnist")]
    assert "workload_mnist_train_step" in names and len(names) > 1
    assert all(n.startswith("host_array_fresh") or "workload_mnist" in n for n in names)
    assert [s.name for s in bench.select(bench.scenarios(), "args_1$|jit_trivial$")] == [
        "jit_trivial", "args_1"]
    assert [s.name for s in bench.select(bench.scenarios(), "(static_args_k)")] == [
        "static_args_kwargs"]
    word = [s.name for s in bench.select(bench.scenarios(), "mnist")]
    assert word == [s.name for s in bench.scenarios() if "mnist" in s.name] and word
    with pytest.raises(ValueError, match="not a regular expression"):
        bench.select(bench.scenarios(), "args_(")


def test_cli_only_takes_a_regex(capsys):
    assert cli.main(["compare", "--list", "--only", "args_1$|workload_mnist"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["args_1", "workload_mnist_train_step"]
    assert cli.main(["compare", "--list", "--only", "args_("]) == 2
    assert "not a regular expression" in capsys.readouterr().err


def test_time_each_times_the_return_and_the_result():
    """Work that goes on after the call returns counts in the ready figure only."""
    returned, ready, out = bench.time_each(lambda: 0.002, 3, time.sleep)
    assert out == 0.002 and 0 <= returned < 0.002 <= ready


def test_interleave_sync_each_keeps_both_figures():
    """a returns at once and its work runs on (an enqueued transfer); b does its
    work before it returns (a copy made in the call): a returns first, b is
    ready first."""
    def a():
        return 0.003

    def b():
        time.sleep(0.001)
        return 0.0

    result = bench.interleave([("a", a), ("b", b)], TINY, sync=time.sleep, sync_each=True)
    assert result.returned_s is not None and result.returned_s.shape == result.per_call_s.shape
    assert result.ratio("a", "b", returned=True).median < 1 < result.ratio("a", "b").median
    assert result.median_us("a", returned=True) < result.median_us("a")
    plain = bench.interleave([("a", a), ("b", b)], TINY)
    assert plain.returned_s is None
    with pytest.raises(ValueError, match="sync_each"):
        plain.ratio("a", "b", returned=True)


def test_a_row_of_asynchronous_work_has_both_figures(tmp_path):
    """A `sync_each` row: a_us / b_us / ratio until the result is ready, and the
    figures until the call returned beside them (in the JSON and the note)."""
    def build() -> bench.Case:
        return bench.Case(operator.add, (jnp.ones(1000), np.ones(1000, np.float32)))

    scenario = bench.Scenario("tiny_transfer", 1, "numpy", build, block=False, sync_each=True)
    row = bench.run_scenario(scenario, jax_jit, jax_jit, TINY)
    assert row.a_us is not None and row.a_return_us is not None
    assert row.return_ratio is not None and row.return_ratio_p10 <= row.return_ratio_p90
    assert row.a_return_us <= row.a_us and row.b_return_us <= row.b_us
    assert row.note.startswith("timed until the result is ready; the call returned after")
    path = str(tmp_path / "c.json")
    bench.write_json(path, [row], {})
    assert bench.read_json(path)[0][0] == row
    plain = bench.run_scenario(dataclasses.replace(scenario, sync_each=False), jax_jit,
                               jax_jit, TINY)
    assert plain.a_return_us is None and plain.return_ratio is None


def test_select_glob_and_substring():
    names = [s.name for s in bench.select(bench.scenarios(), "jit_simple_*_10")]
    assert names == ["jit_simple_many_args_10", "jit_simple_pruned_args_10"]
    assert all("pjit" in s.name for s in bench.select(bench.scenarios(), "pjit"))
    assert bench.select(bench.scenarios(), "no-such-scenario") == []


def test_matrix_covers_the_issue():
    names = {s.name for s in bench.scenarios()}
    for n in (1, 2, 10, 100, 1000):
        assert f"args_{n}" in names
    for n in (10, 100, 1000):
        assert f"jit_simple_many_args_{n}_dispatch" in names
        assert f"jit_simple_pruned_args_{n}" in names
    for n in (1, 10, 100):
        assert f"pjit_simple_4_devices_{n}_args" in names
    assert {"numpy_args_2", "python_scalars_2", "static_args_kwargs", "dict_100_leaves",
            "numpy_sharded_8_devices", "cache_miss", "jit_dispatch_with_transfer",
            "jit_dispatch_without_transfer"} <= names


@pytest.mark.parametrize("self_check", [False, True])
def test_run_reports_rows_table_json(tmp_path, self_check):
    err = io.StringIO()
    rows, meta = bench.run(_tiny_matrix(), TINY, self_check=self_check, stream=err)
    assert "4/4" in err.getvalue()  # the progress bar reached the end
    timed = [r for r in rows if r.ratio is not None]
    assert [r.name for r in timed] == ["tiny_dispatch", "tiny_call", "tiny_miss"]
    for r in timed:
        assert r.a_us > 0 and r.b_us > 0 and r.ratio > 0
        assert r.ratio_p10 <= r.ratio <= r.ratio_p90
        assert "DIFFER" not in r.note
    skipped = rows[-1]
    assert skipped.ratio is None and "skipped" in skipped.note

    table = bench.format_table(rows, meta)
    for column in ("scenario", "jax.jit us", "floor us", "ratio", "p10-p90"):
        assert column in table
    assert ("A us" if self_check or meta["a"] != "nbjit" else "nbjit us") in table
    assert meta["versions"]["jax"] == jax.__version__

    path = tmp_path / "compare.json"
    bench.write_json(str(path), rows, meta)
    data = json.loads(path.read_text())
    assert data["meta"]["self_check"] is self_check
    again, _ = bench.read_json(str(path))
    assert again == rows
    assert isinstance(bench.self_check_failures(rows), list)


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    rows, meta = bench.run(_tiny_matrix()[:2], TINY, progress=False)
    path = tmp_path / "compare.png"
    bench.plot(str(path), rows, meta)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("n_rows", [2, 62])  # a short run, and as many rows as docs/compare.png
def test_the_plots_title_clears_its_panels_titles(n_rows):
    pytest.importorskip("matplotlib")
    from nbjit.bench import report

    rows, meta = bench.read_json(str(ROOT / "docs" / "compare.json"))
    fig = report.figure(rows[:n_rows], meta)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    for ax in fig.axes:
        panel = ax.title.get_window_extent(renderer)
        assert panel.y1 < title.y0, (ax.get_title(), panel, title)  # (pixels from the bottom)


def test_cli_self_check_and_list(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "scenarios", _tiny_matrix)
    monkeypatch.setattr(bench.Settings, "quick", classmethod(lambda cls: TINY))
    out_json, out_md = tmp_path / "c.json", tmp_path / "c.md"
    rc = cli.main(["compare", "--quick", "--self-check", "--only", "tiny_d*", "--no-progress",
                   "--json", str(out_json), "--markdown", str(out_md)])
    printed = capsys.readouterr().out
    assert "tiny_dispatch" in printed and "self-check" in printed
    assert "summary: 1 row, geomean ratio" in printed
    assert "summary: 1 row, geomean ratio" in out_md.read_text()
    assert rc in (0, 1)  # a speed verdict on a noisy machine is not this test's business
    if rc == 1:
        assert "too noisy, run again" in printed
    assert json.loads(out_json.read_text())["rows"][0]["name"] == "tiny_dispatch"
    assert cli.main(["compare", "--list"]) == 0
    assert cli.main(["compare", "--only", "nothing-matches"]) == 2


def test_a_failed_self_check_says_too_noisy_run_again(capsys, monkeypatch):
    """jax.jit against itself outside 0.9-1.1 is the machine's noise: said so, with what to do."""
    monkeypatch.setattr(bench, "scenarios", _tiny_matrix)
    monkeypatch.setattr(bench.Settings, "quick", classmethod(lambda cls: TINY))
    real_run = bench.run

    def noisy_run(*args, **kwargs):
        rows, meta = real_run(*args, **kwargs)
        return [dataclasses.replace(r, ratio=1.4) for r in rows], meta

    monkeypatch.setattr(bench, "run", noisy_run)
    rc = cli.main(["compare", "--quick", "--self-check", "--only", "tiny_d*", "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 1
    assert "self-check: too noisy, run again" in printed and "tiny_dispatch (1.40)" in printed
    assert "FAILED" not in printed


def test_outputs_compared():
    assert bench.output_difference({"a": np.ones(2)}, {"a": np.ones(2)}) is None
    assert "values" in bench.output_difference((np.ones(2),), (np.zeros(2),))
    assert "dtype" in bench.output_difference(np.ones(2), np.ones(2, np.int32))
    assert "structure" in bench.output_difference((1,), [1])
    assert "weak_type" in bench.output_difference(jax.numpy.asarray(1.0), jax.device_put(
        np.float32(1.0)))


def test_request_host_devices_appends_once(monkeypatch):
    flag = _devices.DEVICE_FLAG
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    _devices.request_host_devices(8)
    _devices.request_host_devices(8)
    assert flag + "=8" in os.environ["XLA_FLAGS"]
    assert os.environ["XLA_FLAGS"].count(flag) == 1
    assert os.environ["XLA_FLAGS"].startswith("--xla_cpu_enable_fast_math=false ")
    monkeypatch.setenv("XLA_FLAGS", f"{flag}=4")
    _devices.request_host_devices(8)  # the user's own count wins
    assert os.environ["XLA_FLAGS"] == f"{flag}=4"


def test_devices_helper_never_imports_jax():
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location("
            f"'d', {_devices.__file__!r}); m = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(m); m.request_host_devices(); "
            "assert 'jax' not in sys.modules and 'numpy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_workload_rows_take_new_values_each_call():
    rows = {s.name: s for s in bench.scenarios()}
    for name in ("numpy_args_2_new_values", "python_scalars_2_new_values",
                 "workload_train_step", "workload_optimizer_update", "workload_env_step",
                 "workload_static_config", "workload_data_parallel_8_devices"):
        case = rows[name].build()
        pool = case.arg_pool
        assert len(pool) == bench.POOL and case.args is pool[0], name
        # Consecutive calls never pass the same host values (the memo cannot hit).
        host = [[leaf.tobytes() if isinstance(leaf, np.ndarray) else leaf
                 for leaf in jax.tree.leaves(args) if not isinstance(leaf, jax.Array)]
                for args in pool]
        assert all(host[i] != host[i - 1] for i in range(len(host))), name
    train = rows["workload_train_step"].build()
    params, batch, labels = train.args
    assert len(params) == 6 and batch.shape == (32, 16) and batch.dtype == np.float32
    assert labels.shape == (32,) and labels.dtype == np.int32
    env = rows["workload_env_step"].build()
    state, action, noise = env.args
    assert len(state) == 3 and type(action) is int and type(noise) is float
    config = rows["workload_static_config"].build()
    assert config.jit_options == {"static_argnums": (2,), "static_argnames": ("activation",)}
    hash(config.args[2])  # a hashable static config


def test_numpy_inputs_sit_at_one_alignment():
    # jaxlib uses a 64-byte aligned numpy input in place (faster): by-chance
    # alignment made rows bimodal, so every scenario fixes it.
    # The host_array_*_aligned rows sit on a 64-byte boundary on purpose.
    offsets, aligned = set(), set()
    for scenario in bench.scenarios():
        if scenario.name.startswith("jit_dispatch_with"):
            continue  # 25 MB: covered by the helper's own check below
        if scenario.needs and importlib.util.find_spec(scenario.needs) is None:
            continue  # an optional dependency (equinox) missing: the runner skips the row
        case = scenario.build()
        found = aligned if scenario.name.endswith("_aligned") else offsets
        for args in case.arg_pool or (case.args,):
            found |= {leaf.ctypes.data % 64 for leaf in jax.tree.leaves(args)
                      if isinstance(leaf, np.ndarray)}
    assert offsets == {bench.HOST_OFFSET} and aligned == {0}
    x = np.arange(12, dtype=np.int16).reshape(3, 4)
    y = matrix._host(x)
    assert y.ctypes.data % 64 == bench.HOST_OFFSET
    assert y.dtype == x.dtype and y.shape == x.shape and np.array_equal(x, y)


def test_new_values_rows_agree_and_time():
    chosen = bench.select(bench.scenarios(), "workload_env_step")
    chosen += bench.select(bench.scenarios(), "workload_data_parallel*")
    rows, _ = bench.run(chosen, TINY, progress=False)
    for row in rows:
        assert row.ratio is not None and "DIFFER" not in row.note, (row.name, row.note)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="host devices are a CPU thing")
def test_python_m_nbjit_gets_8_devices(tmp_path):
    env = child_env(drop=("XLA_FLAGS",))
    out = subprocess.run(
        [sys.executable, "-m", "nbjit", "compare", "--quick", "--only", "numpy_sharded",
         "--no-progress", "--rounds", "2", "--json", str(tmp_path / "c.json")],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["meta"]["machine"]["devices"] == 8
    assert data["rows"][0]["ratio"] is not None  # not skipped for lack of devices


def _row(name: str, ratio: float | None, p10: float | None = None, p90: float | None = None,
         family: str | None = None, n_args: int = 2) -> bench.Row:
    timed = ratio is not None
    return bench.Row(name, n_args, "jax.Array", False, family, "nbjit",
                     a_us=ratio * 10 if timed else None, b_us=10.0 if timed else None,
                     floor_us=5.0 if timed else None, ratio=ratio, ratio_p10=p10, ratio_p90=p90,
                     note="" if timed else "skipped: needs 8 devices, have 1")


def test_verdict_is_read_from_each_rows_band():
    assert bench.verdict(_row("f", 0.8, 0.7, 0.95)) == "faster"
    assert bench.verdict(_row("s", 1.3, 1.05, 1.5)) == "slower"
    assert bench.verdict(_row("n1", 0.9, 0.8, 1.02)) == "within noise"
    assert bench.verdict(_row("n2", 1.1, 0.99, 1.3)) == "within noise"
    assert bench.verdict(_row("skipped", None)) is None


def test_summary_geomean_and_counts():
    rows = [_row("f", 0.5, 0.4, 0.6), _row("s", 2.0, 1.5, 2.5), _row("n", 1.0, 0.9, 1.1),
            _row("f2", 0.8, 0.7, 0.9), _row("skipped", None)]
    summary = bench.Summary.of(rows)
    assert summary.rows == 4  # the skipped row is not counted
    assert summary.geomean == pytest.approx((0.5 * 2.0 * 1.0 * 0.8) ** 0.25, rel=1e-12)
    assert (summary.faster, summary.slower, summary.within_noise) == (2, 1, 1)
    assert bench.Summary.of([_row("skipped", None)]).geomean is None


def test_table_ends_with_the_summary_line(tmp_path):
    rows = [_row("f", 0.5, 0.4, 0.6), _row("s", 2.0, 1.5, 2.5), _row("n", 1.0, 0.9, 1.1),
            _row("skipped", None)]
    meta = {"a": "nbjit", "notes": ["a run note"]}
    last = bench.format_table(rows, meta).splitlines()[-1]
    assert last == ("summary: 3 rows, geomean ratio 1.000; nbjit faster in 1 (p90 < 1), "
                    "slower in 1 (p10 > 1), within noise in 1 (p10-p90 spans 1)")
    path = tmp_path / "c.json"
    bench.write_json(str(path), rows, meta)
    assert json.loads(path.read_text())["summary"] == {
        "rows": 3, "geomean": pytest.approx(1.0), "faster": 1, "slower": 1, "within_noise": 1}
    again, _ = bench.read_json(str(path))
    assert again == rows


def test_plot_legends_name_dot_colours_and_families(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.colors
    import matplotlib.legend
    import matplotlib.pyplot as plt

    from nbjit.bench import report

    rows = [_row("f", 0.5, 0.4, 0.6), _row("s", 2.0, 1.5, 2.5), _row("n", 1.0, 0.9, 1.1)]
    families = list(report.FAMILY_STYLES)
    for fam in families:
        rows += [_row(f"{fam}_{n}", 1.0, 0.9, 1.1, family=fam, n_args=n) for n in (10, 100)]
    fig, (ax0, ax1) = plt.subplots(1, 2)
    report._plot_ratios(ax0, rows, "nbjit")
    report._plot_families(ax1, rows, "nbjit")

    # Left: one legend entry per dot colour, with its count, in the colour of its dots.
    legend = ax0.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["nbjit faster (p90 < 1): 1", "nbjit slower (p10 > 1): 1",
                     f"within noise (p10-p90 spans 1): {1 + 2 * len(families)}"]
    dots = ax0.collections[-1].get_facecolors()
    legend_colours = [matplotlib.colors.to_rgba(h.get_color()) for h in legend.legend_handles]
    assert {tuple(c) for c in dots} == {tuple(c) for c in legend_colours}
    assert len(set(map(tuple, legend_colours))) == 3

    # Right: a colour legend (implementations) and a family legend (line style + marker).
    legends = [a for a in ax1.get_children() if isinstance(a, matplotlib.legend.Legend)]
    assert len(legends) == 2
    by_title = {lg.get_title().get_text(): [t.get_text() for t in lg.get_texts()]
                for lg in legends}
    assert by_title["colour"] == ["nbjit", "jax.jit", "floor"]
    assert by_title["line: scenario family"] == [f.removesuffix(" dispatch") for f in families]
    # Every family's series differ in line style and marker from every other family's.
    looks = {(line.get_linestyle(), line.get_marker(), line.get_markerfacecolor() == "white")
             for line in ax1.lines}
    assert len(looks) == len(families)
    assert len({(ls, m) for ls, m, _ in looks}) == len(families)
    assert len({m for _, m, _ in looks}) == len(families)  # markers alone tell them apart
    fig.savefig(tmp_path / "p.png")
    plt.close(fig)


def test_select_regex_anchors():
    assert [s.name for s in bench.select(bench.scenarios(), "args_1$")] == ["args_1"]
    assert [s.name for s in bench.select(bench.scenarios(), "args_2$")] == ["args_2",
                                                                             "numpy_args_2"]
    assert [s.name for s in bench.select(bench.scenarios(), "^args_[12]$")] == ["args_1",
                                                                                "args_2"]
    assert bench.scenario("args_2").n_args == 2
    with pytest.raises(KeyError, match="no scenario"):
        bench.scenario("no_such_scenario")


DISPATCHER = ("dispatch", "_keys", "_record", "_cache", "sharding", "_kernels", "_explain",
              "_profile", "_stats", "_jax", "_binders")


def test_the_dispatcher_never_imports_the_bench_package():
    """bench -> dispatcher only: no dispatcher module names nbjit.bench, and a program that
    jits, calls, profiles and reads stats never loads it (nbjit.compare loads it on use)."""
    import ast
    import pathlib

    package = pathlib.Path(bench.__file__).resolve().parents[1]
    for name in DISPATCHER:
        path = package / f"{name}.py"
        if not path.exists():  # a module another change has not made yet
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n.startswith("nbjit.bench") for n in names), (name, names)
    code = ("import sys, jax.numpy as jnp, nbjit\n"
            "f = nbjit.jit(lambda x: x + 1)\n"
            "with nbjit.profile(), nbjit.explain_misses():\n"
            "    f(jnp.ones(3)); f(jnp.ones(4))\n"
            "nbjit.stats()\n"
            "assert 'nbjit.bench' not in sys.modules, 'loaded by the dispatcher'\n"
            "assert 'matplotlib' not in sys.modules\n"
            "assert nbjit.compare.__module__ == 'nbjit.bench.user'\n"
            "assert nbjit.CompareResult.__module__ == 'nbjit.bench.user'\n"
            "assert 'nbjit.bench' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=child_env())


def test_settle_brings_fresh_host_inputs_to_their_steady_state():
    """Before timing, each contender runs long enough for nbjit to make fresh
    host inputs resident (the CPU; an accelerator's launch records need no
    settling): a quick run measured the per-leaf path otherwise."""
    import nbjit
    from nbjit.bench import runner

    f = nbjit.jit(lambda a, b: a + b)
    rng = np.random.default_rng(0)
    runner.settle(lambda: f(rng.standard_normal(8).astype(np.float32),
                             rng.standard_normal(8).astype(np.float32)))
    node, _ = f._entry_for((np.ones(8, np.float32), np.ones(8, np.float32)), {})
    if node.record.launch is None:  # the CPU: resident
        assert f.stats().resident == 1 and node.record.fence is not None


@pytest.mark.parametrize("check_ratio", [1.0, 1.3], ids=["passes", "fails"])
def test_compare_into_docs_needs_a_passing_self_check(tmp_path, capsys, monkeypatch, check_ratio):
    """Outputs into docs/ run the self-check after the run; a failed one writes nothing
    there, a passed one is recorded in the JSON (doc_tables.py states it)."""
    from nbjit.bench import runner

    docs = tmp_path / "docs"
    docs.mkdir()
    monkeypatch.setattr(runner, "DOCS_DIR", docs)
    monkeypatch.setattr(bench, "scenarios", _tiny_matrix)
    monkeypatch.setattr(bench.Settings, "quick", classmethod(lambda cls: TINY))
    real_run, self_checks = bench.run, []

    def run(matrix, settings, self_check=False, progress=True):
        rows, meta = real_run(matrix, settings, self_check=self_check, progress=False)
        if self_check:  # the machine's noise, chosen
            self_checks.append(meta)
            rows = [dataclasses.replace(r, ratio=check_ratio) for r in rows]
        return rows, meta

    monkeypatch.setattr(bench, "run", run)
    args = ["compare", "--quick", "--only", "tiny_d*", "--no-progress"]
    assert cli.main([*args, "--json", str(tmp_path / "elsewhere.json")]) == 0
    assert self_checks == []  # not into docs/: no self-check
    rc = cli.main([*args, "--json", str(docs / "compare.json"), "--markdown",
                   str(docs / "compare.md")])
    err = capsys.readouterr().err
    assert len(self_checks) == 1
    if check_ratio == 1.0:
        assert rc == 0 and "self-check after the run passed: 1 rows within 0.9-1.1" in err
        meta = json.loads((docs / "compare.json").read_text())["meta"]
        assert meta["self_check_after"] == {"passed": True, "band": [0.9, 1.1], "rows": 1,
                                            "outside": []}
    else:
        assert rc == 1 and "not writing into docs/" in err and "tiny_dispatch (1.30)" in err
        assert list(docs.iterdir()) == []


def _sides_scenario() -> bench.Scenario:
    """A row with contenders of its own (as filter_jit's): a, the ideal b, and a third."""
    x = jax.device_put(np.arange(4.0))
    pool = ((x,),)

    def build() -> bench.Case:
        return bench.Case(jnp.sin, (x,), sides=(("a", jax.jit(jnp.sin), pool),
                                                ("b", jax.jit(jnp.sin), pool),
                                                ("third", jax.jit(jnp.sin), pool)))

    return bench.Scenario("tiny_sides", 1, "jax.Array", build, block=False)


@pytest.mark.parametrize("jits", ["none", "given"])
def test_sides_row_times_its_own_contenders(jits):
    # asv's filter_jit track passes no jits (None, None); it once read that as the
    # self-check and timed the ideal against itself, with no third contender.
    jit_a, jit_b = (None, None) if jits == "none" else (jax.jit, jax.jit)
    row = bench.run_scenario(_sides_scenario(), jit_a, jit_b, TINY)
    assert row.ratio is not None and set(row.other_ratios or {}) == {"third"}
    assert "third " in row.note and "a/third" in row.note


def test_sides_row_self_check_times_the_ideal_against_itself():
    row = bench.run_scenario(_sides_scenario(), jax.jit, jax.jit, TINY, self_check=True)
    assert row.ratio is not None and row.other_ratios == {}


def test_training_loop_row_times_steps_and_returns():
    """The training loop row: per step as the ratio, until-return figures in
    `row.loop`, equal losses; the loader makes new arrays at the row's alignment."""
    import nbjit
    from nbjit.bench import training

    loop = training.mlp_loop(layers=(16, 8, 4), batch=4)
    scenario = bench.Scenario("loop", 15, "MLP + Adam", lambda: bench.Case(
        loop.step, (loop.params, loop.state, *loop.sources[0]), loop=loop), block=False)
    row = bench.run_scenario(scenario, nbjit.jit, jax_jit, TINY)
    assert row.ratio is not None and row.a_us > 0 and row.b_us > 0
    assert row.ratio_p10 <= row.ratio <= row.ratio_p90
    assert row.loop["losses_equal"] and "DIFFER" not in row.note
    assert row.loop["return_a_us"] > 0 and row.loop["return_b_us"] > 0
    assert row.loop["return_p10"] <= row.loop["return_ratio"] <= row.loop["return_p90"]
    assert "until the call returns" in row.note and loop.optimizer in row.note
    load = loop.loader()
    x1, y1 = load()
    x2, _ = load()
    assert x1 is not loop.sources[0][0] and x1.ctypes.data != x2.ctypes.data  # new arrays
    assert x1.ctypes.data % 64 == loop.offset and np.array_equal(x1, loop.sources[0][0])
    assert y1.dtype == np.int32 and y1.shape == (4,)


def test_hand_written_adam_matches_optax():
    """Without optax the row's optimizer is `hand_adam`: optax's adam, bit for bit
    close, its state a namedtuple (read by the structure readers)."""
    optax = pytest.importorskip("optax")
    from nbjit.bench import training

    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    init, update = training.hand_adam(1e-2)
    opt = optax.adam(1e-2)
    s_hand, s_optax = init(params), opt.init(params)
    assert isinstance(s_hand, training.AdamState)
    for i in range(3):
        grads = jax.tree.map(lambda p, i=i: jnp.sin(p + i), params)
        u_hand, s_hand = update(grads, s_hand, params)
        u_optax, s_optax = opt.update(grads, s_optax, params)
        for a, b in zip(jax.tree.leaves(u_hand), jax.tree.leaves(u_optax), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)


def test_training_loop_without_optax_uses_the_hand_written_adam(monkeypatch):
    from nbjit.bench import training

    monkeypatch.setitem(sys.modules, "optax", None)  # import raises ImportError
    loop = training.mlp_loop(layers=(8, 4), batch=2)
    assert "hand-written" in loop.optimizer and isinstance(loop.state, training.AdamState)
    p, s, value = jax.jit(loop.step)(loop.params, loop.state, *loop.loader()())
    assert int(s.count) == 1 and np.isfinite(float(value))
