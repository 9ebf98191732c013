"""Routing `equinox.filter_jit` to `nbjit.filter_jit`: patch_jax, patched_jax, run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from _env import child_env

eqx = pytest.importorskip("equinox", reason="routing filter_jit needs equinox (nbjit[equinox])")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import nbjit  # noqa: E402

EQUINOX_FILTER_JIT = eqx.filter_jit


def test_patched_jax_routes_filter_jit_and_restores_it():
    from equinox import filter_jit as bound_before  # bound before patching: stays equinox's

    with nbjit.patched_jax():
        assert eqx.filter_jit is nbjit.filter_jit
        assert jax.jit is nbjit.jit
        f = eqx.filter_jit(lambda x: x + 1)
        assert float(f(jnp.ones(()))) == 2.0
        assert f._cached.pjit.stats().misses == 1  # nbjit's dispatcher ran it
        assert bound_before is EQUINOX_FILTER_JIT
    assert eqx.filter_jit is EQUINOX_FILTER_JIT


def test_switch_leaves_filter_jit_alone():
    with nbjit.patched_jax(filter_jit=False):
        assert jax.jit is nbjit.jit
        assert eqx.filter_jit is EQUINOX_FILTER_JIT
    nbjit.patch_jax()
    try:
        assert eqx.filter_jit is nbjit.filter_jit
    finally:
        nbjit.unpatch_jax()
    assert eqx.filter_jit is EQUINOX_FILTER_JIT


SCRIPT = textwrap.dedent("""\
    import equinox as eqx
    import jax.numpy as jnp

    @eqx.filter_jit
    def step(x, n):
        return x * n

    for n in (2, 2, 2, 3):
        step(jnp.ones(3), n)
    print("ran", type(step).__module__)
    """)


@pytest.mark.parametrize("switch", [[], ["--no-filter-jit"]], ids=["routed", "left"])
def test_run_reports_filter_jit_functions(tmp_path, switch):
    (tmp_path / "train.py").write_text(SCRIPT)
    env = child_env(drop=("XLA_FLAGS",))
    out = subprocess.run([sys.executable, "-m", "nbjit", "run", *switch, "--json", "r.json",
                          "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    rows = {row["name"]: row for row in json.loads((tmp_path / "r.json").read_text())["functions"]}
    if switch:
        assert "ran equinox._jit" in out.stdout
        assert "step (train.py:4)" not in rows
    else:
        assert "ran nbjit.filter.jit" in out.stdout
        step = rows["step (train.py:4)"]
        assert (step["calls"], step["hits"], step["misses"]) == (4, 2, 2)


def test_an_unsupported_equinox_keeps_its_own_filter_jit():
    """Routing must not break a user's equinox: outside the versions filter_jit
    supports, patching warns and leaves equinox.filter_jit as it is."""
    code = textwrap.dedent("""
        import warnings
        import equinox as eqx
        eqx.__version__ = "0.13.7"  # below the supported range
        own = eqx.filter_jit
        import nbjit
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            nbjit.patch_jax()
        print(eqx.filter_jit is own, float(eqx.filter_jit(lambda x: x + 1)(1.0)),
              any("equinox.filter_jit left as it is" in str(w.message) for w in caught))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=child_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "2.0", "True"]
