"""The supported jax range: `import nbjit` refuses a jax outside it
(nbjit/_jax.py), and the range is written alike wherever it is stated."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from nbjit import _jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _import_with_jax_version(version):
    """`import nbjit` in a fresh process whose jax reports `version`."""
    code = f"import jax\njax.__version__ = {version!r}\nimport nbjit\nprint('imported')\n"
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize("version", ["0.13.0", "0.13.0.dev20270101", "0.10.1", "0.9.0"])
def test_import_raises_for_a_jax_outside_the_range(version):
    run = _import_with_jax_version(version)
    assert run.returncode == 1 and "imported" not in run.stdout
    last = run.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: nbjit supports jax >= 0.10.2, < 0.13 (found jax {version}); "
                    "install a supported version, e.g. pip install 'jax>=0.10.2,<0.13'"), last


def test_the_range_is_stated_alike_everywhere():
    """pyproject.toml's pins, nbjit/_jax.py's check and scripts/accel_check.sh's
    bounds name one range."""
    low, high = (".".join(map(str, v)).removesuffix(".0") for v in _jax.SUPPORTED_JAX)
    pyproject = (ROOT / "pyproject.toml").read_text()
    for package in ("jax", "jaxlib"):
        assert f'"{package}>={low},<{high}"' in pyproject
    accel = (ROOT / "scripts" / "accel_check.sh").read_text()
    assert re.search(rf"^lowest={re.escape(low)}$", accel, re.M)
    assert re.search(rf"^first_unsupported={re.escape(high)}$", accel, re.M)
