"""benchmarks/machine_speed.py and the suite's control row, bench_machine.MachineSpeed."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from _scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def speed():
    return load_script("machine_speed")


def _steady(seconds=40.0, us=10.0, step=0.01):
    return [(i * step, us) for i in range(int(seconds / step))]


def _two_speeds(seconds=40.0, stretch=5.0, step=0.01):
    """1x and 2x in alternating stretches, as the shared VM runs."""
    return [(i * step, 10.0 if int(i * step / stretch) % 2 == 0 else 20.0)
            for i in range(int(seconds / step))]


def test_a_steady_machine_agrees_in_every_design(speed):
    rows = _steady()
    for processes, window in speed.DESIGNS:
        assert speed.agreement(rows, processes, window) == 1.0


def test_stretches_at_two_speeds_break_the_suites_design(speed):
    rows = _two_speeds()
    share = speed.agreement(rows, 2, 4.0)
    assert 0.1 < share < 0.9  # a run's median is whichever stretches its windows fell in
    assert speed.agreement(rows, 2, 4.0, band=1.5) == 1.0  # and never outside the two speeds


def test_report_names_the_speeds_and_the_designs(speed):
    text = speed.report(_two_speeds(seconds=20.0))
    lines = text.splitlines()
    assert lines[0].split(":")[1].split()[:6] == ["10.0"] * 5 + ["20.0"]
    assert "fast 10.00 us" in lines[1] and "(2.00x)" in lines[1]
    assert "10 of 20 seconds slower than 1.25x fast" in lines[1]
    assert [line.split()[:3] for line in lines[3:]] == [["2", "x", "4.0"], ["4", "x", "2.0"],
                                                         ["8", "x", "1.0"], ["16", "x", "0.5"]]


def test_too_short_a_trace_is_refused(speed):
    with pytest.raises(ValueError, match="too short"):
        speed.agreement(_steady(seconds=1.0), 2, 4.0)


def test_the_command_traces_this_machine():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "machine_speed.py"),
                          "--seconds", "1.5"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    first, second = out.splitlines()[:2]
    assert len(first.split(":")[1].split()) == 2  # seconds 0 and 1
    assert second.startswith("fast ") and "blocks" in second


def test_the_control_row_is_sampled_as_the_dispatch_rows(speed):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from benchmarks import bench_dispatch, bench_machine
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert bench_machine.yardstick() == 8
    assert speed.yardstick is bench_machine.yardstick
    for setting in ("warmup_time", "repeat", "rounds"):
        assert getattr(bench_machine.MachineSpeed, setting) == getattr(bench_dispatch._Timed,
                                                                       setting), setting
    assert not {"jax", "nbjit", "common"} & set(vars(bench_machine))  # runs on any commit
