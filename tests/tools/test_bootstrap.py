"""scripts/bootstrap.sh reinstalls only when what it installs from changed.

The venv is a stand-in whose ``python`` logs each ``-m pip`` call instead of
running it (and runs everything else with this interpreter), so the test counts
installs without touching the network.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest
from _env import child_env, python_path

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _fake_venv(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    # bootstrap.sh ends by importing what it installed, equinox too, which some
    # machines lack (the TPU machines): a stand-in, after the real one on the path.
    stand_ins = tmp_path / "stand-ins"
    stand_ins.mkdir()
    (stand_ins / "equinox.py").write_text('__version__ = "stand-in"\n')
    python = venv / "bin" / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = -m ] && [ "$2" = pip ]; then\n'
        f'  shift 2; echo "$*" >> {log}; exit 0\n'
        "fi\n"
        f"export PYTHONPATH={shlex.quote(python_path() + os.pathsep + str(stand_ins))}\n"
        f"exec {shlex.quote(sys.executable)} \"$@\"\n"
    )
    python.chmod(0o755)
    return venv, log


def _bootstrap(venv: pathlib.Path, *extras: str) -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh"), str(venv), *extras],
                          capture_output=True, text=True, timeout=300, env=child_env())
    assert done.returncode == 0, done.stderr
    return done.stderr


def _installs(log: pathlib.Path) -> list[str]:
    if not log.exists():
        return []
    return [line for line in log.read_text().splitlines() if line.startswith("install") and
            "-e" in line.split()]


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils' sha256sum")
def test_bootstrap_installs_once_then_again_when_the_extras_change(tmp_path):
    venv, log = _fake_venv(tmp_path)
    first = _bootstrap(venv)
    assert len(_installs(log)) == 1
    assert "not reinstalling" not in first
    second = _bootstrap(venv)
    assert len(_installs(log)) == 1  # nothing changed: no pip install -e
    assert "not reinstalling" in second
    _bootstrap(venv, "jax==0.11.2")  # other extras: installs again, with them
    installs = _installs(log)
    assert len(installs) == 2 and installs[-1].endswith("jax==0.11.2")
    _bootstrap(venv, "jax==0.11.2")
    assert len(_installs(log)) == 2


def test_a_failed_install_is_retried(tmp_path):
    venv, log = _fake_venv(tmp_path)
    _bootstrap(venv)
    assert (venv / ".nbjit-bootstrap-hash").exists()
    python = venv / "bin" / "python"
    working = python.read_text()
    python.write_text(working.replace("exit 0", "exit 1"))  # pip fails
    done = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap.sh"), str(venv), "numba"],
                          capture_output=True, text=True, timeout=300, env=child_env())
    assert done.returncode != 0
    assert not (venv / ".nbjit-bootstrap-hash").exists()
    python.write_text(working)
    assert "not reinstalling" not in _bootstrap(venv)  # even with the old inputs: installs


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils' sha256sum")
def test_bootstrap_installs_the_equinox_extra(tmp_path):
    """The README's two commands run every test and compare row: filter_jit's
    need equinox, so the setup installs it (and scripts/test.sh makes its
    absence an error, tests/conftest.py)."""
    venv, log = _fake_venv(tmp_path)
    _bootstrap(venv)
    (install,) = _installs(log)
    extras = install.split('.[', 1)[1].split("]", 1)[0].split(",")
    assert set(extras) >= {"test", "bench", "equinox"}
    assert "NBJIT_REQUIRE_EQUINOX=1" in (ROOT / "scripts" / "test.sh").read_text()


def test_the_console_script_is_the_whole_command_line():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["nbjit"] == scripts["nbjit-compare"] == "nbjit.__main__:main"


def _setuptools_for_editable_installs() -> bool:
    """Whether this environment can build nbjit's editable install offline
    (`pip install --no-build-isolation`): setuptools as new as pyproject.toml's
    build-system asks (the test extra installs it)."""
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77


@pytest.mark.skipif(not _setuptools_for_editable_installs(),
                    reason="needs setuptools >= 77 here (nbjit's test extra installs it)")
def test_import_from_the_folder_that_holds_the_clone(tmp_path):
    """A clone named nbjit, installed editable as bootstrap.sh installs it, then a
    script run from the clone's parent folder: `import nbjit` is the package,
    not the clone's folder taken for a namespace package (setuptools' default
    editable hook comes after Python's path search, which finds that folder
    first in the working directory)."""
    parent = tmp_path / "parent"
    clone = parent / "nbjit"
    clone.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, clone / name)
    shutil.copytree(ROOT / "nbjit", clone / "nbjit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # This process's import path (pip, setuptools, jax, numba: a .venv inside the
    # checkout too) but any folder holding an nbjit package, as plain path
    # entries after the new venv's own (.pth files there are not read: an nbjit
    # installed in this environment stays out of sight).
    here = [p for p in sys.path if p and os.path.isdir(p)
            and not (pathlib.Path(p) / "nbjit" / "__init__.py").exists()]
    (pathlib.Path(purelib) / "zz_outer.pth").write_text("\n".join(here) + "\n")
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and pathlib.Path(p).resolve() != ROOT]
    if kept:  # (jax's companions on a PYTHONPATH of their own: the TPU machines)
        env["PYTHONPATH"] = os.pathsep.join(kept)
    # bootstrap.sh's own install line, run offline against the copy.
    fake, log = _fake_venv(tmp_path / "fake")
    _bootstrap(fake)
    (install,) = _installs(log)
    args = [a for a in shlex.split(install)[1:] if not a.startswith(".[") and a != "-q"]
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--no-build-isolation", *args, str(clone)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    (parent / "script.py").write_text(
        "import nbjit\n"
        "print(nbjit.__file__)\n"
        "print(int(nbjit.jit(lambda x: x + 1)(41)))\n")
    ran = subprocess.run([str(python), "script.py"], cwd=parent, capture_output=True, text=True,
                         timeout=300, env=env)
    assert ran.returncode == 0, ran.stderr
    where, answer = ran.stdout.split()
    assert pathlib.Path(where) == clone / "nbjit" / "__init__.py" and answer == "42"
