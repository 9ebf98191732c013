"""One program on every process (nbjit/multiprocess/program.py), in one process.

A process-spanning miss is compiled ahead with its source locations cut at
nbjit's boundary frame, then run as JAX's miss, which finds that program in
JAX's caches. Checked here: the program compiled ahead is the one the call
runs (one compile); its fingerprint does not depend on the stack that traced
it, where JAX's default lowering's does (from jaxlib 0.12.1 that difference
hangs a multi-process program); the function's own lines stay in it; a
lowering JAX cached from elsewhere is made again; programs that differ are named by
the first differing HLO line, through the exchange (threads play processes);
an agreeing miss makes as many store round trips as before. Real processes:
tests/_multiproc_programs.py.
"""

from __future__ import annotations

import functools
import re
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _agreement_threads import INFO, FakeStore, Process, agreement_timeout, signature
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from nbjit import _jax
from nbjit.multiprocess import exchange as _exchange
from nbjit.multiprocess import program as _program
from nbjit.multiprocess.signature import first_difference, with_program

HERE = __file__


@pytest.fixture
def timeout():
    yield from agreement_timeout()


def _helper(x):
    return jnp.tanh(x) * 3.0  # a line of the user's, one call below the traced function


def _model(x, y):
    return jnp.sum(_helper(x) * 2.0) + y


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]), ("x",))


def _functions() -> dict:
    """Functions whose programs have operations with no line of the user's own (a
    constant, `jnp.sum` jitted as it is, shard_map's and jit's own) beside ones with."""
    mesh = _mesh()
    return {
        "lines of its own": (jax.jit(_model), (jnp.ones((8, 4)), np.float32(3))),
        "jnp.sum as it is": (jax.jit(jnp.sum), (jnp.ones((8, 4)),)),
        "shard_map with a psum": (
            jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh,
                                  in_specs=P("x"), out_specs=P())),
            (jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("x"))),)),
        "out_shardings": (jax.jit(lambda x: x * 2, out_shardings=NamedSharding(mesh, P())),
                          (jnp.ones((8, 4)),)),
    }


def _compiled(program: _program.Program | None, seconds: float) -> _program.Program:
    assert program is not None and program.failure is None and seconds > 0
    return program


def _ahead(jitted, args) -> _program.Program:
    return _compiled(*_program.compile_ahead(jitted, args, {}))


def _ahead_from_another_frame(jitted, args) -> _program.Program:
    """As `_ahead`, called from other lines (the user's frames nearest to the call differ)."""
    def warm_up():
        return (lambda: _program.compile_ahead(jitted, args, {}))()

    return _compiled(*warm_up())


def _default_fingerprint(jitted, args) -> bytes:
    """What JAX's own lowering compiles (its traces evicted first, so it traces here)."""
    _jax.evict_traces(jitted)
    return _jax.executable_fingerprint(jitted.lower(*args).compile()._executable)


@pytest.mark.parametrize("name", list(_functions()))
def test_the_program_does_not_depend_on_the_stack_that_traced_it(name):
    jitted, args = _functions()[name]
    first = _ahead(jitted, args)
    _jax.evict_traces(jitted)
    again = _ahead_from_another_frame(jitted, args)
    assert again.compiled is not first.compiled  # traced and compiled afresh
    assert again.text == first.text and again.text.startswith("fingerprint ")


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="the CPU's executable fingerprint hashes the HLO with its source "
                           "locations; the TPU's (jax 0.10.2, libtpu) gave one for both")
def test_jax_default_lowering_depends_on_the_stack():
    """The hazard itself: JAX's default locations hold the caller's frames, so the
    same call traced from two places compiles two fingerprints."""
    jitted, args = _functions()["lines of its own"]

    def warm_up():
        return _default_fingerprint(jitted, args)

    assert _default_fingerprint(jitted, args) != warm_up()


def test_the_program_compiled_ahead_is_the_one_the_call_runs():
    jitted = jax.jit(lambda x, y, *, n: jnp.sum(x * n) + y, static_argnames="n")
    args, kwargs = (jnp.ones((8, 4)), np.arange(3, dtype=np.float32)), {"n": 2}
    compiles = _jax.jax_cache_misses()[1]
    program, _ = _program.compile_ahead(jitted, args, kwargs)
    assert program is not None
    outs, fastpath, _ = _program.run(functools.partial(jitted._cache_miss, *args, **kwargs))
    assert fastpath.xla_executable is program.compiled.xla_executable
    assert _jax.jax_cache_misses()[1] == compiles + 1  # compiled once, ahead
    np.testing.assert_array_equal(outs, jax.jit(lambda x, y: jnp.sum(x * 2) + y)(*args))


def _lines_of(text: str, path: str) -> set[int]:
    """The lines of `path` among an HLO text's source locations (its FileNames and
    FileLocations tables)."""
    ids = re.findall(rf'^(\d+) "{re.escape(path)}"$', text, re.MULTILINE)
    return {int(line) for i in ids
            for line in re.findall(rf"{{file_name_id={i} \S+ line=(\d+)", text)}


def test_the_functions_own_lines_stay_in_the_program():
    jitted, args = _functions()["lines of its own"]
    _jax.evict_traces(jitted)
    text = _ahead_from_another_frame(jitted, args).hlo()
    lines = _lines_of(text, HERE)
    helper = _helper.__code__.co_firstlineno + 1
    model = _model.__code__.co_firstlineno + 1
    assert {helper, model} <= lines, sorted(lines)  # tanh at the helper's, sum at the model's
    # the callers' lines are not: the frames above the traced function
    warm_up = _ahead_from_another_frame.__code__.co_firstlineno
    assert not {n for n in lines if warm_up <= n <= warm_up + 4}, sorted(lines)


def test_a_lowering_cached_from_elsewhere_is_made_again():
    """`.lower()` (or a jax.jit of the same function) lowered the call from another
    stack first, and JAX's cache holds that lowering: compiling ahead traces and
    lowers it again at the boundary."""
    jitted, args = _functions()["jnp.sum as it is"]
    clean = _ahead(jitted, args).text

    def elsewhere():
        _jax.evict_traces(jitted)
        return jitted.lower(*args)  # JAX caches this lowering, made from here

    elsewhere()
    assert _ahead(jitted, args).text == clean


def test_an_error_of_the_call_is_kept_not_raised():
    def bad(x):
        raise TypeError("not here")

    program, _ = _program.compile_ahead(jax.jit(bad), (jnp.ones(3),), {})
    assert program is not None and program.compiled is None
    assert program.text == "none: JAX raised TypeError here"
    with pytest.raises(TypeError, match="not here"):
        program.raise_failure()


@pytest.mark.cpu_devices("a mesh of 8 whose in_shardings do not match its input's")
def test_an_error_of_the_call_names_the_callers_line():
    """JAX's message names where the call was made, as jax.jit's does: the boundary
    counts as the user's code while lowering only."""
    mesh = _mesh()
    x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("x")))
    jitted = jax.jit(lambda x: x + 1, in_shardings=NamedSharding(mesh, P(None, "x")))
    line = sys._getframe().f_lineno + 1
    program, _ = _program.compile_ahead(jitted, (x,), {})
    assert program is not None and program.failure is not None
    with pytest.raises(type(program.failure)) as called:
        jitted(x)
    message = str(program.failure)
    if "This error occurs at source" in str(called.value):  # jax 0.12's words (0.10's: none)
        assert f"This error occurs at source:  {HERE}:{line}:" in message, message

    def located_anywhere(text: str) -> str:
        return re.sub(r"source:  \S+:\d+:\d+", "source: (somewhere)", text)

    assert located_anywhere(message) == located_anywhere(str(called.value))


# ---------------------------------------------------------------------------
# Signatures with programs, and where programs differ


def test_the_program_is_the_signatures_last_entry():
    a8, a16 = signature("8,4"), signature("16,4")
    p1, p2 = with_program(a8, "fingerprint 1"), with_program(a8, "fingerprint 2")
    assert p1.key != p2.key and p1.key == with_program(a8, "fingerprint 1").key
    assert p1.key != a8.key and p1.entries[-1] == ("program", "fingerprint 1")
    assert first_difference(p1.entries, {1: p2.entries}) == ("program", {1: "fingerprint 2"})
    # another shape is named before another program
    other = with_program(a16, "fingerprint 2").entries
    assert first_difference(p1.entries, {1: other}) == ("args[0]", {1: "float32[16,4]"})


def test_where_two_hlo_texts_differ():
    mine = "HloModule m\n  %c = f32[] constant(2), metadata={source_line=7}\n  ROOT %r"
    theirs = mine.replace("constant(2)", "constant(3)")
    said = _program.first_differing_line(mine, theirs, "process 1")
    assert said == ("Their HLO first differs at line 2: here `%c = f32[] constant(2), "
                    "metadata={source_line=7}`, process 1: `%c = f32[] constant(3), "
                    "metadata={source_line=7}`.")
    long_line = "x" * 500
    said = _program.first_differing_line(long_line + "a", long_line + "b", "process 1")
    assert "`...xxx" in said and "xxa`" in said and "xxb`" in said and len(said) < 300
    assert "where one ends" in _program.first_differing_line(mine, mine + "\nmore", "p")
    assert "did not arrive" in _program.first_differing_line(mine, None, "process 1")
    assert _program.unpack(_program.pack(mine)) == mine
    assert _program.pack(np.random.default_rng(0).bytes(2 << 20).hex()) == ""  # too large
    assert _program.unpack("") is None and _program.unpack("not base64!") is None


def _program_signature(text: str):
    return with_program(signature("8,4"), f"fingerprint {text}")


def test_programs_that_differ_raise_on_both_naming_the_first_differing_line(timeout):
    timeout(30)
    store = FakeStore()
    texts = {0: "HloModule m\n%c = constant(2)\n", 1: "HloModule m\n%c = constant(3)\n"}
    outcomes: dict = {}

    def run(rank: int) -> None:
        try:
            _exchange.agree(store, INFO, _program_signature(str(rank)), "model.py:1", rank, 2,
                            _exchange.ProcessState(), program_text=lambda: texts[rank])
        except Exception as error:  # noqa: BLE001 (the test inspects it)
            outcomes[rank] = error

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for rank, error in outcomes.items():
        assert isinstance(error, _exchange.AgreementError), error
        assert error.path == "program" and error.values == {0: "fingerprint 0",
                                                              1: "fingerprint 1"}
        message = str(error)
        assert "their programs differ (another process waits on a program" in message
        assert "nothing was run" in message and "jax.process_index()" in message
        assert (f"first differs at line 2: here `%c = constant({2 + rank})`, process "
                f"{1 - rank}: `%c = constant({3 - rank})`") in message, message
    assert set(outcomes) == {0, 1}


def test_an_agreeing_miss_with_its_program_makes_the_same_round_trips(timeout):
    """The program rides on the signature: no store call is added."""
    timeout(30)
    trips = []
    for sig in (signature("8,4"), _program_signature("1")):
        store = FakeStore()
        p0, p1 = Process(store, 0), Process(store, 1)
        t = threading.Thread(target=p0.call, args=(sig,))
        t.start()
        p1.call(sig)
        t.join(30)
        trips.append(store.calls)
    assert trips[0] == trips[1], trips


def test_a_jitted_helper_traced_elsewhere_first_changes_nothing():
    """A jitted function called inside the process-spanning one, traced and lowered
    first from elsewhere on some process: its trace holds its own frames only, and
    the outer lowering lowers it afresh, so the program is the same."""
    inner = jax.jit(lambda v: jnp.tanh(v) * 3)
    inner_sum = jax.jit(functools.partial(jnp.sum))
    outer = jax.jit(lambda v: inner_sum(inner(v)) + 1)
    x = jnp.ones((8, 4))
    first = _ahead(outer, (x,))
    for f in (outer, inner, inner_sum):
        _jax.evict_traces(f)

    def elsewhere():
        return inner(x), inner_sum(x), inner.lower(x), inner_sum.lower(x)

    elsewhere()
    _jax.evict_traces(outer)
    assert _ahead_from_another_frame(outer, (x,)).text == first.text
