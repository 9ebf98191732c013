"""The compare machinery runs and reports (no speed is asserted here)."""

from __future__ import annotations

import io
import json
import operator
import time

import jax
import numpy as np
import pytest

from nbjit import __main__ as cli
from nbjit import _compare, _measure

TINY = _measure.Settings(rounds=3, min_rounds=2, target_batch_s=0.0005, max_seconds=0.2,
                         warmup_calls=1)


def _tiny_matrix() -> list[_compare.Scenario]:
    def simple() -> _compare.Case:
        return _compare.Case(operator.add, (jax.device_put(1), jax.device_put(2)))

    return [
        _compare.Scenario("tiny_dispatch", 2, "jax.Array", simple, block=False, family="tiny"),
        _compare.Scenario("tiny_call", 2, "jax.Array", simple, block=True),
        _compare.Scenario("tiny_miss", 1, "new function", _compare._cache_miss, block=True),
        _compare.Scenario("tiny_many_devices", 1, "x", simple, block=False, min_devices=10_000),
    ]


def test_interleave_pairs_and_ratios():
    calls = []
    fast = lambda: calls.append("a")
    slow = lambda: (calls.append("b"), time.sleep(0.0002))
    result = _measure.interleave([("a", fast), ("b", slow)], TINY)
    assert result.per_call_s.shape[1] == 2 and result.per_call_s.shape[0] >= 2
    assert (result.per_call_s > 0).all()
    ratio = result.ratio("a", "b")
    assert ratio.p10 <= ratio.median <= ratio.p90
    assert 0 < ratio.median < 1  # the sleeper is slower, whatever the machine
    assert set(calls) == {"a", "b"}


def test_time_batch_sync_each_reports_median():
    synced = []
    dt, out = _measure.time_batch(lambda: 7, 5, sync_each=synced.append)
    assert out == 7 and synced == [7] * 5 and dt >= 0


def test_select_glob_and_substring():
    names = [s.name for s in _compare.select(_compare.scenarios(), "jit_simple_*_10")]
    assert names == ["jit_simple_many_args_10", "jit_simple_pruned_args_10"]
    assert all("pjit" in s.name for s in _compare.select(_compare.scenarios(), "pjit"))
    assert _compare.select(_compare.scenarios(), "no-such-scenario") == []


def test_matrix_covers_the_issue():
    names = {s.name for s in _compare.scenarios()}
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
    rows, meta = _compare.run(_tiny_matrix(), TINY, self_check=self_check, stream=err)
    assert "4/4" in err.getvalue()  # the progress bar reached the end
    timed = [r for r in rows if r.ratio is not None]
    assert [r.name for r in timed] == ["tiny_dispatch", "tiny_call", "tiny_miss"]
    for r in timed:
        assert r.a_us > 0 and r.b_us > 0 and r.ratio > 0
        assert r.ratio_p10 <= r.ratio <= r.ratio_p90
        assert "DIFFER" not in r.note
    skipped = rows[-1]
    assert skipped.ratio is None and "skipped" in skipped.note

    table = _compare.format_table(rows, meta)
    for column in ("scenario", "jax.jit us", "floor us", "ratio", "p10-p90"):
        assert column in table
    assert ("A us" if self_check or meta["a"] != "nbjit" else "nbjit us") in table
    assert meta["versions"]["jax"] == jax.__version__

    path = tmp_path / "compare.json"
    _compare.write_json(str(path), rows, meta)
    data = json.loads(path.read_text())
    assert data["meta"]["self_check"] is self_check
    again, _ = _compare.read_json(str(path))
    assert again == rows
    assert isinstance(_compare.self_check_failures(rows), list)


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    rows, meta = _compare.run(_tiny_matrix()[:2], TINY, progress=False)
    path = tmp_path / "compare.png"
    _compare.plot(str(path), rows, meta)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_self_check_and_list(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_compare, "scenarios", _tiny_matrix)
    monkeypatch.setattr(_measure.Settings, "quick", classmethod(lambda cls: TINY))
    out_json = tmp_path / "c.json"
    rc = cli.main(["compare", "--quick", "--self-check", "--only", "tiny_d*", "--no-progress",
                   "--json", str(out_json)])
    printed = capsys.readouterr().out
    assert "tiny_dispatch" in printed and "self-check" in printed
    assert rc in (0, 1)  # a speed verdict on a noisy machine is not this test's business
    assert json.loads(out_json.read_text())["rows"][0]["name"] == "tiny_dispatch"
    assert cli.main(["compare", "--list"]) == 0
    assert cli.main(["compare", "--only", "nothing-matches"]) == 2


def test_outputs_compared():
    assert _compare.output_difference({"a": np.ones(2)}, {"a": np.ones(2)}) is None
    assert "values" in _compare.output_difference((np.ones(2),), (np.zeros(2),))
    assert "dtype" in _compare.output_difference(np.ones(2), np.ones(2, np.int32))
    assert "structure" in _compare.output_difference((1,), [1])
    assert "weak_type" in _compare.output_difference(jax.numpy.asarray(1.0), jax.device_put(
        np.float32(1.0)))


def test_request_host_devices_appends_once(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    cli.request_host_devices(8)
    cli.request_host_devices(8)
    assert cli._DEVICE_FLAG + "=8" in cli.os.environ["XLA_FLAGS"]
    assert cli.os.environ["XLA_FLAGS"].count(cli._DEVICE_FLAG) == 1
    assert cli.os.environ["XLA_FLAGS"].startswith("--xla_cpu_enable_fast_math=false ")
    monkeypatch.setenv("XLA_FLAGS", f"{cli._DEVICE_FLAG}=4")
    cli.request_host_devices(8)  # the user's own count wins
    assert cli.os.environ["XLA_FLAGS"] == f"{cli._DEVICE_FLAG}=4"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="host devices are a CPU thing")
def test_python_m_nbjit_gets_8_devices(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-m", "nbjit", "compare", "--quick", "--only", "numpy_sharded",
         "--no-progress", "--rounds", "2", "--json", str(tmp_path / "c.json")],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["meta"]["machine"]["devices"] == 8
    assert data["rows"][0]["ratio"] is not None  # not skipped for lack of devices
