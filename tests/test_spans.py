"""nbjit's calls in jax.profiler traces (nbjit/observe/spans.py).

Each test takes a real trace (`jax.profiler.trace(..., create_perfetto_trace=True)`
writes the Perfetto JSON read here) and checks span names and counts against
jax.jit's: jaxlib opens two nested ``PjitFunction(<name>)`` spans per call.
"""

import collections
import functools
import gzip
import json
import pathlib
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit import _jax
from tests._diff import assert_same_outputs

PHASES = ("nbjit key", "nbjit lookup", "nbjit inputs", "nbjit execute", "nbjit outputs")


def _events(logdir: pathlib.Path) -> list[dict]:
    (path,) = logdir.rglob("perfetto_trace.json.gz")
    with gzip.open(path) as f:
        data = json.load(f)
    return [e for e in data["traceEvents"] if e.get("ph") == "X"]


def _traced(tmp_path: pathlib.Path, run, name: str = "trace") -> list[dict]:
    """The complete events of a trace taken around `run()`."""
    logdir = tmp_path / name
    with jax.profiler.trace(str(logdir), create_perfetto_trace=True):
        run()
    return _events(logdir)


def _counts(events: list[dict], prefix: str) -> collections.Counter:
    return collections.Counter(e["name"] for e in events if e["name"].startswith(prefix))


def _inside(inner: dict, outer: dict) -> bool:
    """Whether span `inner` lies within `outer` on the same thread (ts, dur in us)."""
    slack = 1e-3  # the JSON's microseconds are rounded to nanoseconds
    return (inner["tid"] == outer["tid"] and inner["ts"] >= outer["ts"] - slack
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + slack)


def _four_kinds():
    """Fresh callables of the four kinds whose span names jaxlib computes."""

    def scaled_step(x, y):
        return x * y + 1

    class Model:
        def __init__(self, k):
            self.k = k

        def apply_model(self, x):
            return x * self.k

    def with_rate(x, rate):
        return x * rate

    return {
        "scaled_step": (scaled_step, 2),
        "<lambda>": (lambda x: x - 3, 1),
        "apply_model": (Model(2.0).apply_model, 1),
        "with_rate": (functools.partial(with_rate, rate=0.5), 1),
    }


def _calls(jit, kinds, outputs: list) -> int:
    """Misses, hits, a shape change and more hits of each; returns calls per function."""
    jitted = {name: jit(fun) for name, (fun, _) in kinds.items()}
    shapes = [4, 4, 4, 4, 8, 8, 4]
    for name, (_, arity) in kinds.items():
        for n in shapes:
            outputs.append(jitted[name](*[jnp.arange(n, dtype=jnp.float32)] * arity))
    return len(shapes)


def test_pjit_function_spans_match_jax_jit_for_four_kinds_of_callable(tmp_path):
    nb_out, jax_out = [], []
    nb_events = _traced(tmp_path, lambda: _calls(nbjit.jit, _four_kinds(), nb_out), "nbjit")
    jax_events = _traced(tmp_path, lambda: _calls(jax.jit, _four_kinds(), jax_out), "jax")
    assert_same_outputs(nb_out, jax_out)
    names = [f"PjitFunction({name})" for name in _four_kinds()]
    nb_counts = _counts(nb_events, "PjitFunction(")
    jax_counts = _counts(jax_events, "PjitFunction(")
    assert [nb_counts[n] for n in names] == [jax_counts[n] for n in names] == [2 * 7] * 4


def test_hit_phases_nest_in_the_calls_span(tmp_path):
    def add_one(x):
        return x + 1

    f, x = nbjit.jit(add_one), jnp.ones(3)
    f(x)
    out = []
    events = _traced(tmp_path, lambda: out.append(f(x)))
    np.testing.assert_array_equal(out[0], np.full(3, 2.0, np.float32))
    outer, inner = sorted((e for e in events if e["name"] == "PjitFunction(add_one)"),
                          key=lambda e: (e["ts"], -e["dur"]))
    assert _inside(inner, outer)
    phases = [e for e in events if e["name"] in PHASES]
    assert sorted(e["name"] for e in phases) == sorted(PHASES)  # one each: a hit
    assert all(_inside(e, inner) for e in phases)
    starts = [e["name"] for e in sorted(phases, key=lambda e: e["ts"])]
    assert starts == list(PHASES)
    assert not any(e["name"].startswith(("nbjit miss", "nbjit slow")) for e in events)


def test_miss_span_names_what_changed_and_holds_the_compile(tmp_path):
    def double(x):
        return x * 2

    f = nbjit.jit(double)
    f(jnp.ones(4))
    events = _traced(tmp_path, lambda: f(jnp.ones(8)))
    (miss,) = [e for e in events if e["name"].startswith("nbjit miss: ")]
    assert "against the closest of 1 cached signatures" in miss["name"]
    assert "float32[4] -> float32[8]" in miss["name"], miss["name"]
    (compile_,) = [e for e in events if e["name"] == "nbjit compile"]
    assert _inside(compile_, miss)
    inner = min((e for e in events if e["name"] == "PjitFunction(double)"),
                key=lambda e: e["dur"])
    assert _inside(miss, inner)
    assert f.stats().misses == 2


def test_first_call_miss_says_so(tmp_path):
    def first(x):
        return -x

    f = nbjit.jit(first)
    events = _traced(tmp_path, lambda: f(jnp.ones(2)))
    assert _counts(events, "nbjit miss: ") == {
        "nbjit miss: no entry to compare with (the first compile of this function)": 1}
    assert _counts(events, "PjitFunction(first)")["PjitFunction(first)"] == 2


def test_slow_calls_name_their_reason_and_count_as_jax_jit(tmp_path):
    def inner_fn(x):
        return x * 3

    def run(jit):
        g = jit(inner_fn)
        outs = [jax.jit(lambda z: g(z) + 1)(jnp.ones(2)),  # g sees a tracer
                jax.grad(lambda z: jnp.sum(g(z)))(jnp.ones(2)),
                jax.vmap(g)(jnp.ones((3, 2)))]
        with jax.disable_jit():
            outs.append(g(jnp.ones(2)))
        return outs

    results = {}
    nb_events = _traced(tmp_path, lambda: results.setdefault("nb", run(nbjit.jit)), "nb")
    jax_events = _traced(tmp_path, lambda: results.setdefault("jax", run(jax.jit)), "jax")
    assert_same_outputs(results["nb"], results["jax"])
    name = "PjitFunction(inner_fn)"
    # four calls of g (8); JAX's grad (4) and vmap (2) open more of that name under both
    assert _counts(nb_events, name)[name] == _counts(jax_events, name)[name] == 14
    assert _counts(nb_events, "nbjit slow") == {"nbjit slow: disable_jit": 1}
    assert _counts(nb_events, "nbjit traced") == {"nbjit traced": 3}  # staged: not slow


def test_slow_call_through_jaxlibs_own_path_shows_both_pairs(tmp_path):
    """A deliberate difference (docs/compatibility.md): jaxlib's pair inside nbjit's."""

    def checked(x):
        return x * 2

    nb, jx = nbjit.jit(checked), jax.jit(checked)
    nb(jnp.ones(2)), jx(jnp.ones(2))  # compiled outside the traces

    def run(g):
        with jax.debug_nans(True):
            return g(jnp.ones(2))

    results = {}
    nb_events = _traced(tmp_path, lambda: results.setdefault("nb", run(nb)), "nb")
    jax_events = _traced(tmp_path, lambda: results.setdefault("jax", run(jx)), "jax")
    assert_same_outputs(results["nb"], results["jax"])
    name = "PjitFunction(checked)"
    assert (_counts(nb_events, name)[name], _counts(jax_events, name)[name]) == (4, 2)
    assert _counts(nb_events, "nbjit slow") == {"nbjit slow: debug_nans": 1}


def _shapes_step(x, n, scale=1.0, tree=None):
    out = x * n * scale
    return out if tree is None else (out, jax.tree.map(lambda t: t + n, tree))


def _call_shapes(jitted, outputs: list) -> None:
    """Traced binders of several call shapes: keywords, statics, pytrees, host values."""
    x = jnp.arange(3.0)
    for _ in range(2):  # a miss, then a hit, of each
        outputs.append(jitted(x, 2))
        outputs.append(jitted(x, 3, scale=0.5))
        outputs.append(jitted(x, 2, tree={"a": x, "b": [x, x]}))
        outputs.append(jitted(np.arange(3.0, dtype=np.float32), 2, scale=np.float32(2)))
        outputs.append(jitted(x, n=4, scale=1.5))


def test_traced_call_shapes_match_jax_jit(tmp_path):
    nb_out, jax_out = [], []
    nb = nbjit.jit(_shapes_step, static_argnames="n")
    jx = jax.jit(_shapes_step, static_argnames="n")
    nb_events = _traced(tmp_path, lambda: _call_shapes(nb, nb_out), "nb")
    jax_events = _traced(tmp_path, lambda: _call_shapes(jx, jax_out), "jax")
    assert_same_outputs(nb_out, jax_out)
    name = "PjitFunction(_shapes_step)"
    assert _counts(nb_events, name)[name] == _counts(jax_events, name)[name] == 20
    assert _counts(nb_events, "nbjit outputs")["nbjit outputs"] == 5  # the second round hits
    assert sum(_counts(nb_events, "nbjit miss").values()) == nb.stats().misses == 5


def test_a_launch_records_launcher_has_spans_of_its_own(tmp_path, monkeypatch):
    """A launch record's hit (an accelerator's; on the CPU, its strategy
    plugged in) keeps jax.jit's pair of spans per call, and the jaxlib
    launcher inside says what it is."""
    from nbjit.core.inputs import platforms

    monkeypatch.setitem(platforms._plugged, jax.devices()[0].platform, platforms.STAGED)
    nb = nbjit.jit(_shapes_step, static_argnames="n")
    jx = jax.jit(_shapes_step, static_argnames="n")
    x = np.arange(3.0, dtype=np.float32)
    nb(x, 2)
    assert nb._entry_for((x, 2), {})[0].record.launch is not None
    nb_events = _traced(tmp_path, lambda: [nb(x, 2) for _ in range(3)], "nb")
    jax_events = _traced(tmp_path, lambda: [jx(x, 2) for _ in range(3)], "jax")
    name = "PjitFunction(_shapes_step)"
    assert _counts(nb_events, name)[name] == _counts(jax_events, name)[name] == 6
    launcher = "PjitFunction(nbjit launch: _shapes_step)"
    assert _counts(nb_events, launcher)[launcher] >= 3
    calls = [e for e in nb_events if e["name"] == name]
    assert all(any(_inside(e, call) for call in calls)
               for e in nb_events if e["name"] == launcher)


def test_no_traced_binder_outside_a_session():
    f, x = nbjit.jit(lambda x: x + 1), jnp.ones(3)
    f(x)
    f(x)
    assert not _jax.traceme_enabled()
    assert f._binders.spanned == {} and "phase(" not in nbjit.binder_source(f, x)


def test_traced_binder_stays_with_the_function_and_profile_keeps_timing(tmp_path):
    def triple(x):
        return x * 3

    f, x = nbjit.jit(triple), jnp.ones(3)
    f(x)
    with nbjit.profile() as prof:
        events = _traced(tmp_path, lambda: [f(x) for _ in range(3)])
    assert prof.phases_ns(f).shape == (3, 5)  # every hit timed
    assert _counts(events, "PjitFunction(triple)")["PjitFunction(triple)"] == 6
    assert not any(e["name"] in PHASES for e in events)  # timed, not traced, then
    events = _traced(tmp_path, lambda: f(x), "again")
    assert {e["name"] for e in events if e["name"] in PHASES} == set(PHASES)
    assert list(f._binders.spanned) == [1] and f.stats().misses == 1


def test_traced_calls_raise_as_jax_jit_and_keep_the_cache(tmp_path):
    f, x = nbjit.jit(lambda x: x + 1), jnp.ones(3)
    f(x)
    raised = []

    def run():
        try:
            f(object())
        except TypeError as error:
            raised.append(error)

    events = _traced(tmp_path, run)
    assert len(raised) == 1 and f._cache_size() == 1
    assert _counts(events, "nbjit slow") == {"nbjit slow: unknown_leaf_type": 1}


CAPTURE = """
import sys
from xprof.convert import _pywrap_profiler_plugin
_pywrap_profiler_plugin.trace("localhost:" + sys.argv[1], sys.argv[2], "", True, 2000, 3, {})
"""


@pytest.mark.loopback  # the profiler server and its client talk over TCP
def test_a_capture_from_outside_the_process_sees_the_spans(tmp_path):
    """TensorBoard's capture button: a session started through jax.profiler.start_server."""
    pytest.importorskip("xprof.convert._pywrap_profiler_plugin",
                        reason="the remote capture client comes with xprof")

    def remote_span(x):
        return x - 1

    f, x = nbjit.jit(remote_span), jnp.ones(3)
    f(x)
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    jax.profiler.start_server(port)
    try:
        capture = subprocess.Popen([sys.executable, "-c", CAPTURE, str(port), str(tmp_path)])
        deadline = time.monotonic() + 60
        while not _jax.traceme_enabled() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _jax.traceme_enabled(), "the capture never started"
        calls = 0
        while _jax.traceme_enabled():  # until the capture's 2 s are over
            f(x)
            calls += 1
        assert capture.wait(timeout=60) == 0
    finally:
        jax.profiler.stop_server()
    (xspace,) = tmp_path.rglob("*.xplane.pb")
    assert calls > 0 and b"PjitFunction(remote_span)" in xspace.read_bytes()
    assert b"nbjit execute" in xspace.read_bytes()


def test_the_core_holds_the_profiler_hooks_observe_registers():
    """What a call does in a session is registered into the core by
    `set_profiler_hooks` (nbjit/core/profiler.py), not assigned into it; with
    nothing registered a miss and a slow call open no span, and a traced call
    says what is missing."""
    from nbjit.core import profiler
    from nbjit.observe import spans

    assert profiler.profiler_hooks() is spans.HOOKS
    assert spans.HOOKS.traced_call is spans.traced_call
    bare = profiler.ProfilerHooks()
    profiler.set_profiler_hooks(bare)
    try:
        assert bare.slow_call is None
        with bare.slow_span("tracer"), bare.miss_span(None, lambda after: None), \
                bare.compile_span():
            pass
        with pytest.raises(LookupError, match="no traced call registered"):
            bare.traced_call(None, (), {})
    finally:
        profiler.set_profiler_hooks(spans.HOOKS)
    assert profiler.profiler_hooks() is spans.HOOKS
