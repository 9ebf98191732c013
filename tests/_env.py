"""The environment of the Python processes tests start (`child_env`).

A child must import the nbjit under test and the jax this session runs:
this checkout goes first on PYTHONPATH and the PYTHONPATH there was stays
after it (the TPU machines keep jax's companions, numba among them, in a
folder on PYTHONPATH; `scripts/accel_check.sh --python` puts the checkout
first the same way). JAX_PLATFORMS is the session's: on an accelerator
tests/conftest.py sets it to cpu once the session holds the device, so
children run JAX on the CPU.
"""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_path(*paths: str | os.PathLike) -> str:
    """This checkout, then `paths`, then the PYTHONPATH of this process."""
    kept = os.environ.get("PYTHONPATH", "")
    parts = [str(ROOT), *(str(p) for p in paths), *kept.split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


def child_env(*paths: str | os.PathLike, drop: tuple[str, ...] = (),
              **variables: str) -> dict[str, str]:
    """os.environ for a child process: PYTHONPATH from `python_path(*paths)`,
    the names in `drop` removed, `variables` set."""
    env = dict(os.environ)
    for name in drop:
        env.pop(name, None)
    env["PYTHONPATH"] = python_path(*paths)
    # A TPU machine's jax warns at import (cloud_tpu_init: transparent hugepages)
    # on stderr, before anything nbjit prints there: the tests read nbjit's.
    quiet = "ignore::UserWarning:jax._src.cloud_tpu_init"
    env["PYTHONWARNINGS"] = ",".join(w for w in (env.get("PYTHONWARNINGS"), quiet) if w)
    env.update(variables)
    return env
