"""scripts/library_tests.sh: the conftest.py it puts above a library's tests, and a run of it.

What makes its nbjit column mean something is the conftest it writes:
`jax.jit` is nbjit's before any test module imports, and the end of the run
says what the nbjit functions did. That conftest is taken from the script as
written and run under pytest with a small test module. The script itself is
run once on a one-test tree (pytest standing in for the library), as CI
calls it: a relative OUTDIR, STRICT=1.
"""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from _env import child_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "library_tests.sh"

TEST_MODULE = textwrap.dedent("""\
    import jax
    import jax.numpy as jnp
    from jax import jit  # bound at import: must be nbjit's already

    import nbjit


    @jit
    def double(x):
        return x * 2


    inner = jit(jnp.sin)
    outer = jax.jit(lambda y: inner(y))


    def test_routed():
        assert jit is nbjit.jit and jax.jit is nbjit.jit
        x = jnp.arange(3.0)
        assert (double(x) == 2 * x).all()
        assert (double(x) == 2 * x).all()
        assert (outer(x) == jnp.sin(x)).all()
    """)


def _conftest_source() -> str:
    text = SCRIPT.read_text()
    match = re.search(r"<<'PY'\n(.*?)\nPY\n", text, re.S)
    assert match, "library_tests.sh has no conftest.py here-document"
    return match.group(1) + "\n"


def _run_pytest(tmp_path: pathlib.Path, mode: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(_conftest_source())
    (tmp_path / "test_routed.py").write_text(TEST_MODULE)
    env = child_env(NBJIT_LIBRARY_TESTS_MODE=mode)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_nbjit_mode_routes_jit_before_imports_and_reports(tmp_path: pathlib.Path) -> None:
    result = _run_pytest(tmp_path, "nbjit")
    assert result.returncode == 0, result.stdout + result.stderr
    # double: a miss then a hit; outer: one miss; inner, called while outer
    # traces: a tracer argument, staged into that trace (traced, not slow).
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("nbjit (nbjit): "))
    expected = ("nbjit (nbjit): 3 live jitted functions; calls 4, hits 1, misses 2, traced 1, "
                "raised 0, slow 0 {}")
    assert line == expected, line


def test_jax_mode_leaves_jit_alone(tmp_path: pathlib.Path) -> None:
    result = _run_pytest(tmp_path, "jax")
    assert result.returncode == 1, result.stdout + result.stderr  # `jit is nbjit.jit` fails
    assert "assert" in result.stdout and "nbjit (" not in result.stdout


@pytest.mark.skipif(not SCRIPT.exists(), reason="no script")
def test_unknown_library_is_refused() -> None:
    result = subprocess.run(["bash", str(SCRIPT), "no-such-library-xyz", "jax"],
                            capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHON=sys.executable))
    assert result.returncode == 2
    assert "no-such-library-xyz is not installed" in result.stderr


@pytest.mark.skipif(not SCRIPT.exists(), reason="no script")
def test_relative_outdir_is_from_the_callers_directory(tmp_path: pathlib.Path) -> None:
    # CI passes a relative OUTDIR; the suite runs from its own tree, so the script must
    # resolve OUTDIR first (it once wrote its logs relative to the tree and failed).
    # pytest stands in for the library: it is installed wherever these tests run.
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "tests" / "test_tiny.py").write_text(
        "import jax.numpy as jnp\n\n\ndef test_sum():\n    assert int(jnp.arange(4).sum()) == 6\n")
    env = dict(os.environ, PYTHON=sys.executable, STRICT="1", SUITE_TIMEOUT="240",
               LIBRARY_SRC=str(src))
    result = subprocess.run(["bash", str(SCRIPT), "pytest", "both", "out"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    for mode in ("jax", "nbjit"):
        log = (tmp_path / "out" / mode / "pytest.log").read_text()
        assert "1 passed" in log, log
        assert (tmp_path / "out" / mode / "pytest.xml").is_file()
    assert "nbjit (nbjit): " in (tmp_path / "out" / "nbjit" / "pytest.log").read_text()
