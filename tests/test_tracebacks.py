"""Tracebacks as clean as upstream's, in every JAX_TRACEBACK_FILTERING mode.

jaxlib's dispatch is C++, so an exception raised inside a `jax.jit` function
shows no dispatcher frames. nbjit's `__call__` filters its own frames where
an exception leaves it (never on a hit), and its `lower` / `trace` /
`eval_shape` are JAX api boundaries. Each case here raises under both jits
from the same caller and compares the frames shown: all of them in the
remove modes; those not marked ``__tracebackhide__`` in "tracebackhide" (the
frames IPython and pytest show).
"""

import itertools
import json
import os
import re
import subprocess
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import chain_of, nbjit_frames
from _env import child_env

import nbjit

MODES = ["remove_frames", "quiet_remove_frames", "tracebackhide", "auto"]  # auto: the default


@pytest.fixture(params=MODES)
def mode(request):
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", request.param)
    yield "quiet_remove_frames" if request.param == "auto" else request.param  # not IPython
    jax.config.update("jax_traceback_filtering", before)


def body(x, n=1):
    raise ValueError("raised inside the jitted function")


def identity(y):
    return y


def first(y, n):
    return y


def _catch(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("no exception")


def _shown(error, mode):
    """(function, file) of each frame a user sees, innermost last."""
    frames = []
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if mode == "tracebackhide" and frame.f_locals.get("__tracebackhide__"):
            continue
        frames.append((frame.f_code.co_name, os.path.basename(frame.f_code.co_filename)))
    return frames


def _summary(error, mode):
    return (type(error), str(error), _shown(error, mode), chain_of(error),
            getattr(error, "__notes__", None))


CASES = {
    "positional arrays": lambda jit, x: (jit(body), (x,), {}),
    "keyword": lambda jit, x: (jit(body), (), {"x": x}),
    "static argument": lambda jit, x: (jit(body, static_argnames="n"), (x,), {"n": 3}),
    "python scalar": lambda jit, x: (jit(body), (1.0,), {}),
    "numpy": lambda jit, x: (jit(body), (np.ones(3),), {}),
    "lower": lambda jit, x: (jit(body).lower, (x,), {}),
    "trace": lambda jit, x: (jit(body).trace, (x,), {}),
    "eval_shape": lambda jit, x: (jit(body).eval_shape, (x,), {}),
    "jax.eval_shape": lambda jit, x: (jax.eval_shape, (jit(body), x), {}),
    "under grad": lambda jit, x: (jax.grad(jit(body)), (1.0,), {}),
    "inside jax.jit": lambda jit, x: (jax.jit(lambda y: jit(body)(y)), (x,), {}),
    "bad argument type": lambda jit, x: (jit(identity), ("a string",), {}),
    "unhashable static": lambda jit, x: (jit(first, static_argnums=1), (x, [1]), {}),
}


@pytest.mark.parametrize("case", CASES)
def test_frames_shown_as_under_jax_jit(mode, case):
    x = jnp.arange(3.0)
    got = {}
    for name, jit in (("jax", jax.jit), ("nbjit", nbjit.jit)):
        fn, args, kwargs = CASES[case](jit, x)
        got[name] = _summary(_catch(fn, *args, **kwargs), mode)
    assert got["nbjit"] == got["jax"]
    assert not any(file == "dispatch.py" for _, file in got["nbjit"][2])


def test_error_after_hits_shows_no_dispatcher_frames(mode):
    """A hit, then a call that raises on nbjit's slow path (a deleted input)."""
    got = {}
    for name, jit in (("jax", jax.jit), ("nbjit", nbjit.jit)):
        f = jit(identity)
        x = jnp.arange(4.0)
        f(x), f(x)
        x.delete()
        got[name] = _summary(_catch(f, x), mode)
    assert got["nbjit"] == got["jax"]


def test_off_mode_keeps_every_frame():
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")
    try:
        error = _catch(nbjit.jit(body), jnp.arange(2.0))
    finally:
        jax.config.update("jax_traceback_filtering", before)
    files = [os.path.basename(f.filename) for f in traceback.extract_tb(error.__traceback__)]
    assert "dispatch.py" in files and "pjit.py" in files


def test_hits_pay_nothing_for_filtering():
    """The filter runs only when an exception leaves __call__."""
    calls = []
    real = nbjit._jax.filter_dispatch_frames
    nbjit._jax.filter_dispatch_frames = lambda e: calls.append(e)
    try:
        f = nbjit.jit(lambda y: y + 1)
        x = jnp.arange(3.0)
        for _ in range(5):
            f(x)
        assert calls == []
        _catch(f, "a string")
        assert len(calls) == 1
    finally:
        nbjit._jax.filter_dispatch_frames = real


CONSTRUCTION_ERRORS = {
    "static_argnums out of range": {"static_argnums": 2},
    "static_argnums not an int": {"static_argnums": "x"},
}


@pytest.mark.parametrize("options", CONSTRUCTION_ERRORS.values(), ids=CONSTRUCTION_ERRORS)
def test_construction_errors_show_no_nbjit_frames(mode, options):
    """`nbjit.jit(f, static_argnums=2)` raises as jax.jit does, from the caller's
    line, with no frame of nbjit's (`jit`, `PjitFunction.__init__`), also as
    a decorator factory (where jax.jit shows frames of its own)."""
    got = {name: _summary(_catch(jit, first, **options), mode)
           for name, jit in (("jax", jax.jit), ("nbjit", nbjit.jit))}
    assert got["nbjit"] == got["jax"]
    assert got["nbjit"][2] == [("_catch", "test_tracebacks.py")]
    factory = _summary(_catch(lambda: nbjit.jit(**options)(first)), mode)
    assert factory[0] is got["jax"][0] and factory[1] == got["jax"][1]
    assert not any(file == "dispatch.py" for _, file in factory[2]), factory[2]


# ---------------------------------------------------------------------------
# Mistakes a user makes: jax.jit's error, chained as jax.jit chains it (no
# exception nbjit caught on its way to JAX's path), with no frame of nbjit's;
# in every mode, "off" included for the chain (there nbjit's frames show).


class _EqRaises:
    """Equal hashes, comparing raises. A salt per pair: JAX's trace cache is the
    process's, so one pair's instance must never meet another's. Some caches
    (jax 0.10.2's in-sharding cache, keyed by a tree whose hash leaves node data
    out) do compare instances of different pairs: those are simply unequal."""

    def __init__(self, salt):
        self.salt = salt

    def __hash__(self):
        return self.salt

    def __eq__(self, other):
        if isinstance(other, _EqRaises) and other.salt != self.salt:
            return False
        raise ValueError("no comparing me")


_salts = itertools.count(1000)


def _mistakes(jit):
    """name -> a call that raises, each on a function called before (its hit path)."""
    x = jnp.arange(4.0)
    calls = {}

    donating = jit(lambda a: a + 1, donate_argnums=0)
    donated = jnp.arange(4.0)
    donating(jnp.ones(4)), donating(donated)  # the second call donates `donated`
    calls["donated array used again"] = lambda: donating(donated)

    fresh = jit(lambda a: a * 2, donate_argnums=0)
    gone = jnp.arange(5.0)
    fresh(gone)
    calls["donated array used again, new signature"] = lambda: fresh(gone)

    static = jit(lambda a, n: a * len(n), static_argnums=1)
    static(x, (1, 2))
    calls["unhashable static argument (a dict)"] = lambda: static(x, {"a": 1})
    compared = jit(lambda a, s: a, static_argnums=1)
    salt = next(_salts)
    compared(x, _EqRaises(salt))
    calls["static argument whose __eq__ raises"] = lambda: compared(x, _EqRaises(salt))

    keywords = jit(lambda a, b=0, c=0: a + b + c)
    keywords(x, b=1)
    calls["other keyword names, a bad value"] = lambda: keywords(x, c="s")

    many = jit(lambda *xs: sum(xs))
    many(*[x] * 20)
    calls["many arguments, one a string"] = lambda: many(*[x] * 19, "s")

    deleted = jit(lambda a, b: a + b)
    deleted(x, x)
    dead = jnp.arange(4.0)
    dead.delete()
    calls["deleted input"] = lambda: deleted(x, dead)

    host = jit(lambda a: a * 2)
    host(np.ones(3)), host(np.ones(3))

    def guarded():
        with jax.transfer_guard("disallow"):
            host(np.ones(3))

    calls["host input under a transfer guard"] = guarded

    def inside_handler():  # jax.jit's error has the caller's exception as context
        try:
            raise KeyError("the caller's own")
        except KeyError:
            static(x, {"a": 1})

    calls["while the caller handles its own exception"] = inside_handler
    return calls


MISTAKES = list(_mistakes(jax.jit))


def _no_addresses(text):
    return re.sub(r"0x[0-9a-f]+", "0x?", text)


@pytest.mark.parametrize("case", MISTAKES)
@pytest.mark.parametrize("filtering", [*MODES, "off"])
def test_mistakes_raise_and_chain_as_under_jax_jit(filtering, case):
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", filtering)
    try:
        errors = {name: _catch(_mistakes(jit)[case])
                  for name, jit in (("jax", jax.jit), ("nbjit", nbjit.jit))}
    finally:
        jax.config.update("jax_traceback_filtering", before)
    nb, jx = errors["nbjit"], errors["jax"]
    assert type(nb) is type(jx)
    # jax.jit raises that one from its C++ cache (its own message, no JAX api
    # boundary: no UnfilteredStackTrace in "remove_frames"), nbjit from JAX's
    # trace cache: a difference of its own, not a chained exception.
    cpp_cache = case == "static argument whose __eq__ raises"
    if not cpp_cache:
        assert _no_addresses(str(nb)) == _no_addresses(str(jx))
    if not (cpp_cache and filtering == "remove_frames"):
        assert chain_of(nb) == chain_of(jx), "".join(traceback.format_exception(nb))
    if filtering != "off":  # "off" shows nbjit's frames, as documented
        shown = "quiet_remove_frames" if filtering == "auto" else filtering
        assert _shown(nb, shown) == _shown(jx, shown)
        assert nbjit_frames(nb) == []


# The same mistakes printed: a script's uncaught exception, and IPython's
# own traceback formatting, each in a fresh process.

_SCRIPT = """\
import sys
import jax, jax.numpy as jnp
import nbjit
jit = jax.jit if sys.argv[1] == "jax" else nbjit.jit
x = jnp.arange(4.0)
step = jit(lambda a: a + 1, donate_argnums=0)
scale = jit(lambda a, n: a * len(n), static_argnums=1)
step(jnp.ones(4)), step(x), scale(x, (1, 2))
if sys.argv[2] == "donated":
    step(x)
else:
    scale(jnp.ones(4), {"a": 1})
"""


def _printed(text):
    """A printed traceback without addresses, line numbers, and counts of the
    frames IPython hides (nbjit's are among them)."""
    text = re.sub(r"skipping hidden \d+ frame", "skipping hidden ? frame", text)
    return re.sub(r"line \d+", "line ?", _no_addresses(text))


def _run(script, *args):
    run = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                         timeout=300, env=child_env(PYTHONWARNINGS="ignore"))
    return run


@pytest.fixture(scope="module")
def nbjit_dirs(tmp_path_factory):
    """nbjit's package directory as a traceback prints it: the one this process
    imports and the one a script's process does (from a clone with a plain
    install these differ: the checkout, and the venv's site-packages), each
    absolute, real, and under ``~`` as IPython shortens paths. Paths, not the
    word "nbjit": a clone named nbjit holds JAX's own files below it."""
    probe = tmp_path_factory.mktemp("probe") / "where_is_nbjit.py"
    probe.write_text("import os, nbjit; print(os.path.dirname(nbjit.__file__))\n")
    run = _run(probe)
    assert run.returncode == 0, run.stderr
    home = os.path.expanduser("~")
    found = set()
    for directory in (os.path.dirname(nbjit.__file__), run.stdout.strip()):
        for path in (os.path.abspath(directory), os.path.realpath(directory)):
            found.add(path + os.sep)
            if home != "~" and path.startswith(home + os.sep):
                found.add("~" + path[len(home):] + os.sep)
    return sorted(found)


def _assert_clean(printed, nbjit_dirs):
    shown = [d for d in nbjit_dirs if d in printed]
    assert not shown and "<binder" not in printed, (shown, printed)
    assert "During handling of the above exception" not in printed, printed


@pytest.mark.parametrize("mistake", ["donated", "unhashable static"])
def test_uncaught_in_a_script_prints_jax_jits_traceback(tmp_path, mistake, nbjit_dirs):
    script = tmp_path / "mistake.py"
    script.write_text(_SCRIPT)
    printed = {}
    for which in ("jax", "nbjit"):
        run = _run(script, which, mistake)
        assert run.returncode == 1, run.stderr
        printed[which] = run.stderr
    _assert_clean(printed["nbjit"], nbjit_dirs)
    assert _printed(printed["nbjit"]) == _printed(printed["jax"])


_IPYTHON = """\
import contextlib, io, json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance(colors="nocolor")
shell.run_cell(
    "import jax, jax.numpy as jnp, nbjit\\n"
    "def make(jit):\\n"
    "    return (jit(lambda a: a + 1, donate_argnums=0),\\n"
    "            jit(lambda a, n: a * len(n), static_argnums=1))\\n")
cells = {}
for jit in ("jax.jit", "nbjit.jit"):
    for name, call in (("donated", "step(x)"), ("unhashable static", "scale(x, {'a': 1})")):
        warm = shell.run_cell(f"x = jnp.arange(4.0); step, scale = make({jit}); "
                              "step(jnp.ones(4)), scale(x, (1, 2)), step(x)")
        assert warm.error_in_exec is None, warm.error_in_exec
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            result = shell.run_cell(call.replace("x,", "jnp.ones(4),"))
        assert result.error_in_exec is not None, name
        cells[f"{jit} {name}"] = out.getvalue()
with open(sys.argv[1], "w") as f:
    json.dump(cells, f)
"""


def test_ipython_formats_jax_jits_traceback(tmp_path, nbjit_dirs):
    """Through IPython's own traceback formatting (`InteractiveShell.run_cell`,
    ultratb), where JAX's default mode hides frames rather than removing them."""
    pytest.importorskip("IPython")
    script = tmp_path / "cells.py"
    script.write_text(_IPYTHON)
    run = _run(script, str(tmp_path / "cells.json"))
    assert run.returncode == 0, run.stderr
    cells = json.loads((tmp_path / "cells.json").read_text())
    for name in ("donated", "unhashable static"):
        nb, jx = cells[f"nbjit.jit {name}"], cells[f"jax.jit {name}"]
        _assert_clean(nb, nbjit_dirs)
        assert _printed(nb) == _printed(jx)


def _own_frames(error, package_dir):
    """Every frame of a package's code in `error`'s traceback, hidden or not."""
    return [frame.f_code.co_name for frame, _ in traceback.walk_tb(error.__traceback__)
            if frame.f_code.co_filename.startswith(package_dir)]


def fails_when_long(x):
    if x.shape[0] > 3:
        raise ValueError("raised inside the jitted function")
    return x * 2


@pytest.mark.parametrize("called", ["first call", "after hits"])
def test_filter_jit_carries_no_more_frames_of_its_own_than_equinox(mode, called):
    """equinox.filter_jit's traceback carries two frames of equinox's own (its
    `__call__` and `_call`, marked hidden); nbjit.filter_jit's, two of nbjit's
    (it carried a third, its keyed call's)."""
    eqx = pytest.importorskip("equinox")
    dirs = {"nbjit": os.path.dirname(nbjit.__file__) + os.sep,
            "equinox": os.path.dirname(eqx.__file__) + os.sep}
    got = {}
    for name, jit in (("nbjit", nbjit.filter_jit), ("equinox", eqx.filter_jit)):
        f = jit(fails_when_long)
        if called == "after hits":
            f(jnp.arange(3.0)), f(jnp.arange(3.0))
        error = _catch(f, jnp.arange(5.0))
        got[name] = _own_frames(error, dirs[name])
    # (under tracebackhide equinox shows its fun_wrapped too)
    assert len(got["nbjit"]) == 2 <= len(got["equinox"]), got
