"""`python -m nbjit run script.py [args]` and `run -m module [args]`, in subprocesses."""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
from _env import child_env

from nbjit.routing import run as _run

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT = 180

SCRIPT = textwrap.dedent("""\
    import os, sys
    import jax, jax.numpy as jnp
    import nbjit
    from helper import VALUE  # the script's own directory is sys.path[0]

    print("name", __name__)
    print("argv", sys.argv)
    print("file", __file__ == os.path.abspath(sys.argv[0]))
    print("path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
    print("patched", jax.jit is nbjit.jit, VALUE)
    print("devices", jax.device_count())

    @jax.jit
    def step(x):
        return x * 2

    x = jnp.ones(3)
    step(x); step(x)
    print("kind", type(step).__name__, getattr(step, "miss_count", None))

    def inner():
        raise ValueError("boom from the script")

    if "--fail" in sys.argv:
        inner()
    if "--code" in sys.argv:
        sys.exit(int(sys.argv[sys.argv.index("--code") + 1]))
    """)


def _nbjit_run(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = child_env(drop=("XLA_FLAGS",))
    return subprocess.run([sys.executable, "-m", "nbjit", "run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "script.py").write_text(SCRIPT)
    (tmp_path / "app" / "helper.py").write_text("VALUE = 42\n")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "path0.py").write_text("import sys\nprint(sys.path[0])\n")
    (pkg / "tool.py").write_text(textwrap.dedent("""\
        import sys, jax, nbjit
        print("name", __name__)
        print("argv0", sys.argv[0].endswith("tool.py"), sys.argv[1:])
        print("patched", jax.jit is nbjit.jit)
        f = jax.jit(lambda x: x + 1)
        print("value", int(f(1)), int(f(2)), f.miss_count)
        sys.exit(5 if "--five" in sys.argv else 0)
        """))
    return tmp_path


def test_run_script_as_python_would(project):
    done = _nbjit_run("app/script.py", "a", "--flag", "x", cwd=project)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "name __main__"
    assert out[1] == "argv ['app/script.py', 'a', '--flag', 'x']"
    assert out[2:6] == ["file True", "path0 True", "patched True 42", "devices 1"]
    assert out[6] == "kind PjitFunction 1"


def test_run_script_exit_code_and_traceback(project):
    done = _nbjit_run("app/script.py", "--code", "7", cwd=project)
    assert done.returncode == 7, done.stderr
    done = _nbjit_run("--no-report", "app/script.py", "--fail", cwd=project)
    assert done.returncode == 1
    reported = _nbjit_run("app/script.py", "--fail", cwd=project)
    assert reported.returncode == 1 and "nbjit run: dispatch report" in reported.stderr
    plain = subprocess.run([sys.executable, "app/script.py", "--fail"], cwd=project,
                           env=child_env(),
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert plain.returncode == 1
    # The traceback starts at the script's first frame, as Python prints it.
    assert done.stderr.strip().splitlines() == plain.stderr.strip().splitlines()
    # No frame of nbjit's: its package's path (the word alone would match a
    # checkout or a venv in a folder named nbjit), nor a generated binder.
    assert str(ROOT / "nbjit") + os.sep not in done.stderr and "<binder" not in done.stderr
    assert reported.stderr.startswith(done.stderr)  # the report follows the traceback


def test_run_module(project):
    done = _nbjit_run("-m", "pkg.tool", "--opt", "v", cwd=project)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "name __main__", "argv0 True ['--opt', 'v']", "patched True", "value 2 3 1"]
    assert _nbjit_run("-m", "pkg.tool", "--five", cwd=project).returncode == 5


def test_run_missing_script_or_module(project):
    done = _nbjit_run("app/nope.py", cwd=project)
    assert done.returncode == 2 and "can't open file" in done.stderr
    assert "never imported jax" not in done.stderr  # it never ran: Python's message alone
    done = _nbjit_run("-m", "pkg.nope", cwd=project)
    assert done.returncode == 1 and "No module named pkg.nope" in done.stderr
    assert "Traceback" not in done.stderr and "never imported jax" not in done.stderr


def _console_script() -> str:
    """The `nbjit` console script installed beside this Python (pyproject's
    [project.scripts], as pip wrote it)."""
    script = shutil.which("nbjit", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("no nbjit console script installed beside this Python")
    return script


def test_the_console_script_runs_a_module_as_python_m_does(project):
    """`nbjit run -m pkg.tool` from the folder holding `pkg` (the current folder
    first on sys.path, as `python -m`), through the real entry point."""
    env = child_env(drop=("XLA_FLAGS",))
    run = subprocess.run([_console_script(), "run", "-m", "pkg.tool", "--opt", "v"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "name __main__", "argv0 True ['--opt', 'v']", "patched True", "value 2 3 1"]
    assert "nbjit run: dispatch report" in run.stderr and "never imported jax" not in run.stderr
    path0 = subprocess.run(
        [_console_script(), "run", "-m", "pkg.path0"], cwd=project, env=env,
        capture_output=True, text=True, timeout=TIMEOUT)
    plain = subprocess.run([sys.executable, "-m", "pkg.path0"], cwd=project, env=env,
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert path0.returncode == plain.returncode == 0, path0.stderr
    assert path0.stdout == plain.stdout == f"{project}\n"
    missing = subprocess.run([_console_script(), "run", "-m", "pkg.nope"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=TIMEOUT)
    assert missing.returncode == 1 and "No module named pkg.nope" in missing.stderr
    assert "never imported jax" not in missing.stderr


def test_the_console_script_runs_a_script_with_its_folder_first(project):
    env = child_env(drop=("XLA_FLAGS",))
    run = subprocess.run([_console_script(), "run", "app/script.py"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    assert "path0 True" in run.stdout.splitlines()  # the script's own folder, first


def test_run_script_in_process_calls_on_exit(project, monkeypatch):
    """The hook for an end-of-run report runs after the script, also when it fails."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    script = project / "tiny.py"
    script.write_text("import sys\nsys.exit(3 if len(sys.argv) > 1 else 0)\n")
    calls = []
    try:
        assert _run.run_script([str(script), "x"], on_exit=lambda: calls.append(1)) == 3
        assert _run.run_script([str(script)], on_exit=lambda: calls.append(2)) == 0
    finally:
        import nbjit

        nbjit.unpatch_jax()
    assert calls == [1, 2]


REPORT_SCRIPT = textwrap.dedent("""\
    import jax, jax.numpy as jnp, numpy as np

    @jax.jit
    def step(w, x):
        return w - 0.1 * jnp.tanh(x @ w).mean()

    @jax.jit
    def loss(w):
        return (w ** 2).sum()

    w = jnp.ones((4, 4))
    for i in range(6):
        w = step(w, np.full((2, 4), i, np.float32))
    step(w, jnp.ones((3, 4)))  # another signature: a miss, explained under --explain
    with jax.disable_jit():
        loss(w)  # slow: disable_jit
    print("done", float(loss(w)))
    """)


def test_report_at_exit_counts_and_times_each_function(tmp_path):
    """The end-of-run report (issue 11 item 5): per function calls, hits,
    misses, slow calls with reasons, dispatch and execute time; --json writes
    it; --explain logs the explained miss."""
    import json

    (tmp_path / "train.py").write_text(REPORT_SCRIPT)
    out = _nbjit_run("--explain", "--json", "report.json", "train.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "done" in out.stdout
    assert "nbjit run: dispatch report" in out.stderr
    assert "nbjit cache miss of step" in out.stderr and "x: shape" in out.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    rows = {row["name"]: row for row in report["functions"]}
    step, loss = rows["step (train.py:3)"], rows["loss (train.py:7)"]
    assert (step["calls"], step["hits"], step["misses"], step["slow"]) == (7, 5, 2, 0)
    assert (loss["calls"], loss["misses"], loss["slow"]) == (2, 1, 1)
    assert loss["slow_reasons"] == {"disable_jit": 1}
    assert report["profiled"] and step["dispatch_ms"] > 0 and step["execute_ms"] > 0
    assert step["miss_ms"] > 0 and loss["slow_ms"] > 0


def test_report_without_profile(tmp_path):
    (tmp_path / "train.py").write_text(REPORT_SCRIPT)
    out = _nbjit_run("--no-profile", "--json", "report.json", "train.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import json

    report = json.loads((tmp_path / "report.json").read_text())
    assert not report["profiled"]
    assert {row["name"]: row["hits"] for row in report["functions"]}["step (train.py:3)"] == 5
    assert "dispatch ms" not in out.stderr


LAMBDAS_SCRIPT = textwrap.dedent("""\
    import json, sys, jax, jax.numpy as jnp, nbjit
    x = jnp.ones(3)
    with nbjit.profile() as prof:
        f = jax.jit(lambda x: x + 1)
        g, h = jax.jit(lambda x: x * 2), jax.jit(lambda x: x - 3)
        for _ in range(10):
            f(x)
        g(x)
        h(x), h(x), h(jnp.ones(4))  # a shape change
    counts = lambda c, h, m: [c, h, m]
    json.dump({"stats": {n: counts(s.calls, s.hits, s.misses) for n, s in nbjit.stats().items()},
               "profile": {r["name"]: counts(r["calls"], r["hits"], r["misses"])
                           for r in prof.summary()}}, open(sys.argv[1], "w"))
    """)


def test_same_named_lambdas_are_named_alike_and_timed_apart(tmp_path):
    """Three `jax.jit(lambda ...)`, two on one line, one with a shape change: the
    run report, `stats()` and `profile()` give each its own name and numbers."""
    import json

    (tmp_path / "lambdas.py").write_text(LAMBDAS_SCRIPT)
    out = _nbjit_run("--json", "report.json", "lambdas.py", "mine.json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    f, g, h = "<lambda> (lambdas.py:4)", "<lambda> (lambdas.py:5)", "<lambda> (lambdas.py:5)#2"
    expected = {f: [10, 9, 1], g: [1, 0, 1], h: [3, 1, 2]}
    mine = json.loads((tmp_path / "mine.json").read_text())
    assert mine["stats"] == expected
    assert mine["profile"] == expected
    report = {row["name"]: row for row in json.loads(
        (tmp_path / "report.json").read_text())["functions"]}
    assert {n: [r["calls"], r["hits"], r["misses"]] for n, r in report.items()} == expected
    assert report[g]["dispatch_ms"] == report[g]["execute_ms"] == 0.0  # no hits of its own
    assert report[f]["dispatch_ms"] > 0 and report[h]["dispatch_ms"] > 0
    assert report[f]["dispatch_ms"] != report[h]["dispatch_ms"]
    misses = {n: report[n]["miss_ms"] for n in expected}
    assert all(ms > 0 for ms in misses.values()) and len(set(misses.values())) == 3
    for name in expected:  # the text report's rows, one per function
        assert sum(line.startswith(name + " ") for line in out.stderr.splitlines()) == 1
    assert "nbjit run: misses by the time they took" in out.stderr
    ranked = json.loads((tmp_path / "report.json").read_text())["ranked_misses"]
    shape = [r for r in ranked if r["function"] == h and r["fields"] == ["x: shape"]]
    assert len(shape) == 1 and shape[0]["count"] == 1
    assert shape[0]["site"].endswith("lambdas.py:9") and shape[0]["seconds"] > 0


def _process_report(rank: int, calls: int, seconds: float) -> dict:
    return {"process": f"process {rank} of 2", "profiled": False, "profile_overhead_us": None,
            "functions": [{"name": "step (train.py:3)", "calls": calls, "hits": calls - 1,
                           "misses": 1, "slow": 0, "slow_reasons": {}, "evictions": 0,
                           "miss_seconds": seconds}],
            "ranked_misses": [{"function": "step (train.py:3)", "site": "train.py:9",
                               "fields": ["first call"], "count": 1, "seconds": seconds,
                               "example": "no entry to compare with"}]}


def test_report_merges_the_reports_of_every_process(tmp_path, capsys):
    """`python -m nbjit report F.0 F.1`: one table, each row with its process,
    misses ranked over all processes; --json writes the merged report."""
    from nbjit import __main__ as cli
    from nbjit.observe import report as _report

    paths = []
    for rank, calls, seconds in ((0, 10, 0.5), (1, 7, 0.9)):
        path = tmp_path / f"report.json.{rank}"
        _report.write_json(str(path), _process_report(rank, calls, seconds))
        paths.append(str(path))
    out = tmp_path / "merged.json"
    assert cli.main(["report", *paths, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "merged from 2 reports: process 0 of 2, process 1 of 2" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("step")]
    assert [(r[2], r[3]) for r in rows] == [("[p0]", "10"), ("[p1]", "7")]
    merged = _report.read_json(str(out))
    assert [m["function"] for m in merged["ranked_misses"]] == [
        "step (train.py:3) [p1]", "step (train.py:3) [p0]"]  # the dearer miss first
    assert [f["process"] for f in merged["functions"]] == ["process 0 of 2", "process 1 of 2"]


IMPORTS_SCRIPT = textwrap.dedent("""\
    import os, sys
    print("before", sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "nbjit")))
    import numpy as np
    np.random.seed(0)
    os.environ["JAX_ENABLE_X64"] = "1"  # read when jax is imported
    from jax import jit  # bound at import: nbjit's under run
    import jax
    print("draws", np.random.rand(3).tolist())
    print("x64", jax.config.jax_enable_x64)
    print("jit", type(jit(lambda x: x)).__module__.split(".")[0])
    """)


def _plain(script: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    env = child_env(drop=("XLA_FLAGS",))
    return subprocess.run([sys.executable, script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT)


def test_run_leaves_the_scripts_imports_alone(tmp_path):
    """jax is imported when the script imports it (no module of jax's or
    nbjit's before its first line) and patched right then: numpy's global
    draws (importing jax draws 5 of them), the JAX_* environment the script
    sets before importing jax, and a `from jax import jit` are as under plain
    python, the jit nbjit's."""
    (tmp_path / "imports.py").write_text(IMPORTS_SCRIPT)
    plain, run = _plain("imports.py", tmp_path), _nbjit_run("imports.py", cwd=tmp_path)
    assert plain.returncode == run.returncode == 0, run.stderr
    plain_out, run_out = plain.stdout.splitlines(), run.stdout.splitlines()
    assert run_out[0] == "before []"
    assert run_out[1:3] == plain_out[1:3] and run_out[2] == "x64 True"
    assert (plain_out[3], run_out[3]) == ("jit jaxlib", "jit nbjit")


EQUINOX_SCRIPT = textwrap.dedent("""\
    import numpy as np
    np.random.seed(1)
    import equinox as eqx  # imports jax
    import jax, nbjit
    print("draw", np.random.rand())
    print("routed", jax.jit is nbjit.jit, eqx.filter_jit is nbjit.filter_jit)
    f = eqx.filter_jit(lambda x, n: x * n)
    print("value", f(jax.numpy.ones(2), 3).tolist())
    """)


def test_run_routes_equinox_when_the_script_imports_it(tmp_path):
    pytest.importorskip("equinox")
    (tmp_path / "eq.py").write_text(EQUINOX_SCRIPT)
    plain, run = _plain("eq.py", tmp_path), _nbjit_run("eq.py", cwd=tmp_path)
    assert plain.returncode == run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == plain.stdout.splitlines()[0]  # the same draw
    assert run.stdout.splitlines()[1:] == ["routed True True", "value [3.0, 3.0]"]
    assert "<lambda> (eq.py:7)" in run.stderr  # in the report


def test_run_of_a_script_that_never_imports_jax(tmp_path):
    (tmp_path / "nojax.py").write_text("import sys\nprint('jax' in sys.modules)\n")
    run = _nbjit_run("nojax.py", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout == "False\n"
    assert "no nbjit function was called (the script never imported jax)" in run.stderr


LIBRARY = textwrap.dedent("""\
    import jax, jax.numpy as jnp

    @jax.jit
    def bias_correction(m, count):  # a helper optax-style libraries jit and call in traces
        return m / (1 - 0.9 ** count)

    @jax.jit
    def public_step(x):  # a library function the user calls at top level
        return x + 1
    """)

TRACED_SCRIPT = textwrap.dedent("""\
    import jax, jax.numpy as jnp
    import fakelib

    @jax.jit
    def loss(w):
        return (w ** 2).sum()

    @jax.jit
    def step(w, count):
        return w - fakelib.bias_correction(jax.grad(loss)(w), count)

    w = jnp.ones(3)
    for i in range(1, 4):
        w = step(w, i)
    fakelib.public_step(w)
    print(float(loss(w)))
    """)


def test_report_keeps_calls_inside_other_traces_apart(tmp_path):
    """A call with tracers inside another trace is staged into it (traced), not
    a slow call; a library's function that only ran so is named on a line of
    its own, apart from the user's functions (issue 46)."""
    import json

    library = tmp_path / "lib" / "site-packages"  # where pip installs libraries
    library.mkdir(parents=True)
    (library / "fakelib.py").write_text(LIBRARY)
    (tmp_path / "train.py").write_text(TRACED_SCRIPT)
    env = child_env(library, drop=("XLA_FLAGS",))
    out = subprocess.run([sys.executable, "-m", "nbjit", "run", "--json", "report.json",
                          "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads((tmp_path / "report.json").read_text())["functions"]}
    helper = rows["fakelib.bias_correction (fakelib.py:3)"]
    assert (helper["calls"], helper["slow"], helper["traced"], helper["library"]) == (1, 0, 1, True)
    assert helper["slow_reasons"] == {}
    loss = rows["loss (train.py:4)"]  # the user's own: under grad in step's trace, then at top
    assert (loss["calls"], loss["slow"], loss["traced"], loss["library"]) == (2, 0, 1, False)
    table, after = out.stderr.split("library functions run only inside your traces", 1)
    assert "bias_correction" not in table and "fakelib.public_step" in table  # called at top
    assert after.startswith(" (staged into them, as under jax.jit): "
                            "fakelib.bias_correction (fakelib.py:3): 1 call")
    header = table.splitlines()[1].split()
    assert header[:6] == ["function", "calls", "hits", "misses", "slow", "traced"]
    loss_cells = next(line for line in table.splitlines() if line.startswith("loss")).split()
    assert loss_cells[2:7] == ["2", "0", "1", "0", "1"]  # calls hits misses slow traced
    assert "tracer " not in loss_cells and loss_cells[-1] == "-"  # no slow reason


GONE_SCRIPT = textwrap.dedent("""\
    import gc, jax, jax.numpy as jnp

    def main():
        @jax.jit
        def step(x):
            return x * 2

        for _ in range(3):
            step(jnp.ones(2))

    main()
    gc.collect()  # step is gone before exit
    """)


@pytest.mark.parametrize("profile", [[], ["--no-profile"]], ids=["profiled", "no_profile"])
def test_report_names_functions_gone_by_exit(tmp_path, profile):
    import json

    (tmp_path / "gone.py").write_text(GONE_SCRIPT)
    out = _nbjit_run(*profile, "--json", "report.json", "gone.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads((tmp_path / "report.json").read_text())["functions"]}
    step = rows["main.<locals>.step (gone.py:4)"]
    assert (step["calls"], step["hits"], step["misses"]) == (3, 2, 1)
    assert "main.<locals>.step (gone.py:4)" in out.stderr
    assert "no nbjit function was called" not in out.stderr


def test_run_of_a_script_that_imports_nbjit_first(tmp_path):
    """`import nbjit` imports jax (inside nbjit's own import): the same draws
    as plain python, and jax.jit patched once nbjit's import is whole."""
    (tmp_path / "first.py").write_text(
        "import numpy as np\nnp.random.seed(0)\nimport nbjit, jax\n"
        "print(np.random.rand(2).tolist())\nprint(jax.jit is nbjit.jit)\n")
    plain, run = _plain("first.py", tmp_path), _nbjit_run("first.py", cwd=tmp_path)
    assert plain.returncode == run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [plain.stdout.splitlines()[0], "True"]


def test_the_console_script_runs_as_python_m_nbjit(tmp_path):
    """`nbjit run x.py` (pyproject's [project.scripts], as pip writes its entry
    script) leaves the script's imports alone too."""
    (tmp_path / "imports.py").write_text(IMPORTS_SCRIPT)
    (tmp_path / "bin").mkdir()
    entry = tmp_path / "bin" / "nbjit"
    entry.write_text("import sys\nfrom nbjit.__main__ import main\nsys.exit(main())\n")
    env = child_env(drop=("XLA_FLAGS",))
    run = subprocess.run([sys.executable, str(entry), "run", "imports.py"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=TIMEOUT)
    plain = _plain("imports.py", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == "before []"
    assert run.stdout.splitlines()[1:] == [*plain.stdout.splitlines()[1:3], "jit nbjit"]
    assert run.stderr.startswith("nbjit run: ")  # the report (no function was called)


def test_a_deferred_package_loads_its_names_on_first_use():
    """While launching `run`, `import nbjit` imports no jax; a public name asked
    for then (not by the launcher) loads the package as `import nbjit` would."""
    code = ("import sys; sys.argv = ['nbjit', 'run']\n"
            "import nbjit; print('jax' in sys.modules)\n"
            "from nbjit import jit; print('jax' in sys.modules, jit is nbjit.jit,"
            " callable(nbjit.stats))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT, env=child_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False", "True True True"]


def test_run_after_jax_was_imported_gets_every_room(tmp_path):
    """jax imported before `run` launches (a sitecustomize, a wrapper): the
    deferred package loads whole when jax is patched, so host inputs get their
    input steps (a fast path, private copies for JAX's path), not JAX's path."""
    (tmp_path / "s.py").write_text(textwrap.dedent("""
        import jax, numpy as np
        f = jax.jit(lambda x: x + 0)
        for i in range(4):
            x = np.ones(1 << 16, np.float32)
            y = f(x)
            x[:] = 7  # a later write must not change y
            assert float(y[0]) == 1.0 and float(y[-1]) == 1.0
        print(type(f).__module__, f.stats().hits, f.stats().slow)
    """))
    code = ("import sys, jax; sys.argv = ['nbjit', 'run', 's.py']\n"
            "from nbjit.__main__ import main\n"
            "sys.exit(main(['run', '--no-report', 's.py']))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT, env=child_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["nbjit.core.dispatch", "3", "0"]


def test_a_deferred_package_loads_once_for_threads_that_race_to_it():
    """Eight threads ask the deferred package for public names at once: each gets
    them (none an AttributeError while another thread loads the package)."""
    code = textwrap.dedent("""
        import sys, threading; sys.argv = ['nbjit', 'run']
        import nbjit
        barrier, got = threading.Barrier(8), []
        names = ['jit', 'stats', 'filter_jit', 'device_put', 'profile', 'PjitFunction',
                 'AgreementError', 'patch_jax']
        def ask(name):
            barrier.wait()
            try:
                got.append(getattr(nbjit, name) is not None)
            except AttributeError as error:
                got.append(repr(error))
        threads = [threading.Thread(target=ask, args=(n,)) for n in names]
        for t in threads: t.start()
        for t in threads: t.join()
        print(got.count(True), [g for g in got if g is not True])
    """)
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=TIMEOUT, env=child_env())
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[0] == "8 []", done.stdout
