"""The asv suite on commits that lack what it measures: asv skips, nothing raises.

asv runs the current checkout's benchmarks against every commit's nbjit. A
setup that finds something missing must raise NotImplementedError (asv
marks the benchmark skipped), and asv then still calls ``teardown``, which
must not raise (a teardown that fails turns a skip into a failure, a gap in
the graph). These tests call the suite's classes as asv does, against an
nbjit without ``jit`` and one without ``bench``.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def suite():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        modules = [importlib.import_module(f"benchmarks.{name}")
                   for name in ("common", "bench_dispatch", "bench_ratio", "bench_cache",
                                "bench_kernels", "bench_observe")]
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert pathlib.Path(modules[0].__file__).parent == ROOT / "benchmarks" / "benchmarks"
    return modules[1:]


def _benchmark_classes(modules):
    """(class, combination) for every benchmark class and parameter combination, as asv sees."""
    for module in modules:
        for name, cls in vars(module).items():
            if name.startswith("_") or not inspect.isclass(cls):
                continue
            if cls.__module__ != module.__name__:
                continue
            if not any(m.startswith(("time_", "track_", "peakmem_", "mem_")) for m in dir(cls)):
                continue
            params = getattr(cls, "params", [])
            if params and not isinstance(params[0], list):
                params = [params]
            for combo in itertools.product(*params) if params else [()]:
                yield cls, combo


def _as_asv(cls, combo):
    """setup, then teardown even when setup skipped; for a timed class, its first
    call's preparation (`common.Prepared.start`). Returns True if it skipped."""
    common = sys.modules["benchmarks.common"]
    bench = cls()
    skipped = False
    try:
        if hasattr(bench, "setup"):
            bench.setup(*combo)
        elif isinstance(bench, common.Prepared):
            bench.start(*combo)
    except common.SkipNotImplemented:
        skipped = True
    except NotImplementedError:
        skipped = not isinstance(bench, common.Prepared)  # asv skips only SkipNotImplemented
    if hasattr(bench, "teardown"):
        bench.teardown(*combo)
    return skipped


def test_every_teardown_survives_a_skipped_setup(suite):
    """asv calls teardown after setup raised: on a fresh instance, with no setup state."""
    seen = 0
    for cls, combo in _benchmark_classes(suite):
        if hasattr(cls, "teardown"):
            cls().teardown(*combo)
            seen += 1
    assert seen > 0


def test_no_nbjit_jit_skips_the_nbjit_side(suite, monkeypatch):
    import nbjit

    monkeypatch.delattr(nbjit, "jit")
    checked = 0
    for cls, combo in _benchmark_classes(suite):
        if cls.__name__ == "NumpyToSharding":  # nbjit.device_put: no jit needed
            continue
        if "nbjit" in combo or cls.__name__ in ("DispatchRatio", "TrainingLoop"):
            assert _as_asv(cls, combo), f"{cls.__name__}{combo} ran without nbjit.jit"
            checked += 1
    assert checked > 20


def test_no_bench_module_skips_what_needs_it(suite, monkeypatch):
    """An older commit has no nbjit.bench: every scenario and every paired track skips."""
    import nbjit

    monkeypatch.delattr(nbjit, "bench", raising=False)
    monkeypatch.setitem(sys.modules, "nbjit.bench", None)  # import raises ImportError
    checked = 0
    for cls, combo in _benchmark_classes(suite):
        if (cls.__module__.endswith(("bench_dispatch", "bench_ratio"))
                or cls.__name__ in ("StatsCost", "ProfileCost")):
            assert _as_asv(cls, combo), f"{cls.__name__}{combo} ran without nbjit.bench"
            checked += 1
    assert checked > 40


def test_unknown_scenario_skips(suite):
    common = sys.modules["benchmarks.common"]
    with pytest.raises(NotImplementedError, match="no scenario"):
        common.scenario("no_such_scenario")


def test_suite_scenarios_exist_in_the_matrix(suite):
    """Every scenario the suite names is in today's compare matrix (none silently skipped)."""
    from nbjit import bench

    names = {s.name for s in bench.scenarios()}
    bench_ratio = sys.modules["benchmarks.bench_ratio"]
    assert set(bench_ratio.SCENARIOS) <= names
    assert bench_ratio.TrainingLoop.SCENARIO in names
    dispatch = sys.modules["benchmarks.bench_dispatch"]
    assert set(dispatch._KIND_SCENARIO.values()) <= names
    assert {f"workload_{w}" for w in dispatch.Workloads.params[0]} <= names
    host = dispatch.HostArrays()
    assert {host.scenario(row, "nbjit") for row in dispatch.HostArrays.params[0]} <= names


def test_timed_classes_prepare_once_without_setup(suite):
    """asv_runner >= 0.3 reruns `setup` before every timed call: a timed class with a
    `setup` would time one call of a fresh function per sample. Only CacheMiss, whose
    timed call is a miss on a new function anyway, keeps one."""
    common = sys.modules["benchmarks.common"]
    timed = {cls for cls, _ in _benchmark_classes(suite)
             if any(m.startswith("time_") for m in dir(cls))}
    assert len(timed) >= 15
    for cls in timed:
        if cls.__name__ == "CacheMiss":
            continue
        assert issubclass(cls, common.Prepared), cls.__name__
        assert not hasattr(cls, "setup") and not hasattr(cls, "teardown"), cls.__name__
        assert cls.number >= 5 and cls.warmup_time > 0, cls.__name__
    dispatch = sys.modules["benchmarks.bench_dispatch"]
    bench = dispatch.SimpleDispatch()
    bench.time_dispatch("jax")
    run = bench.run
    assert isinstance(run, common.Call)
    bench.time_call("jax")
    assert bench.run is run  # built by the first call, kept for the process
    a, b = run.case.args
    assert float(common.block(run.dispatch())) == float(a) + float(b)


def test_a_missing_scenario_skips_from_the_timed_call(suite):
    """The first timed call of a scenario this commit lacks raises asv's skip."""
    common = sys.modules["benchmarks.common"]
    dispatch = sys.modules["benchmarks.bench_dispatch"]

    class Missing(dispatch._Timed):
        params = [common.IMPLS]

        def scenario(self, impl):
            return "no_such_scenario"

        def time_dispatch(self, impl):
            (self.run or self.start(impl)).dispatch()

    with pytest.raises(common.SkipNotImplemented, match="no scenario"):
        Missing().time_dispatch("jax")


def _asv_conf() -> tuple[str, dict]:
    import json
    import re

    text = (ROOT / "benchmarks" / "asv.conf.json").read_text()
    return text, json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))


def test_asv_conf_pins_a_supported_jax_and_states_the_readmes_range():
    """The pins lie in SUPPORTED_JAX, and the comment names that range as the README does."""
    from nbjit import _jax

    text, conf = _asv_conf()
    (low, high) = _jax.SUPPORTED_JAX
    stated = f"jax {'.'.join(map(str, low))} to {high[0]}.{high[1] - 1}.x"
    assert stated in text and stated.removeprefix("jax ") in (ROOT / "README.md").read_text()
    req = conf["matrix"]["req"]
    assert req["jax"] == req["jaxlib"]
    (pinned,) = req["jax"]
    assert low <= _jax._version_tuple(pinned) < high


def test_the_suite_says_when_this_environment_differs_from_the_pins(suite, monkeypatch):
    import importlib.metadata

    common = sys.modules["benchmarks.common"]
    versions = {"jax": "0.11.2"}
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: versions.get(name) or real(name))
    found = common.pin_mismatches()
    assert any(m.startswith("jax 0.11.2 (pinned ") for m in found)
