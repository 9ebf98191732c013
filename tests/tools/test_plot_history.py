"""benchmarks/plot_history.py reads asv's results JSON: a track's series and the control row."""

from __future__ import annotations

import json
import pathlib

import pytest
from _scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
RATIO = "bench_ratio.DispatchRatio.track_ratio"


@pytest.fixture(scope="module")
def plot():
    return load_script("plot_history")


def _results(tmp_path, control=True):
    """Two commits as asv 0.6 writes them: result columns, quoted params, q25/q75."""
    columns = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a",
               "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_number", "stats_repeat"]
    machine = tmp_path / "results" / "box"
    machine.mkdir(parents=True)
    (machine / "machine.json").write_text("{}")
    for date, commit, ratio, loop in ((1, "a" * 40, [1.2, None], 12e-6),
                                      (2, "b" * 40, [1.1, 0.9], 23e-6)):
        results = {RATIO: [ratio, [["'args_1'", "'args_2'"]], "v", 0, 1, None, None,
                           [r and r - 0.01 for r in ratio], [r and r + 0.01 for r in ratio],
                           None, None]}
        if control:
            results["bench_machine.MachineSpeed.time_python_loop"] = [
                [loop], [], "v", 0, 1, None, None, [loop * 0.9], [loop * 1.1], None, None]
        (machine / f"{commit[:8]}-env.json").write_text(json.dumps(
            {"commit_hash": commit, "date": date, "result_columns": columns,
             "results": results}))
    return tmp_path / "results"


def test_series_per_parameter_and_the_control_row(plot, tmp_path):
    results = _results(tmp_path)
    series = plot.load(results, RATIO)
    assert series["args_1"] == [(1, "aaaaaaa", 1.2, pytest.approx(1.19), pytest.approx(1.21)),
                                (2, "bbbbbbb", 1.1, pytest.approx(1.09), pytest.approx(1.11))]
    assert [v for *_, v, _, _ in series["args_2"]] == [0.9]  # the failed point is left out
    control = plot.load(results, plot.CONTROL)
    assert list(control) == ["time_python_loop"]
    assert [v for *_, v, _, _ in control["time_python_loop"]] == [12e-6, 23e-6]


@pytest.mark.parametrize("control", [True, False])
def test_the_figure_is_written_with_or_without_a_control(plot, tmp_path, capsys, control):
    pytest.importorskip("matplotlib")
    out = tmp_path / "history.png"
    assert plot.main(["--results", str(_results(tmp_path, control)), "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000
    assert "2 series over 2 commits" in capsys.readouterr().out


def test_no_results_is_an_error(plot, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert plot.main(["--results", str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")]) == 1
    assert "no results" in capsys.readouterr().out
