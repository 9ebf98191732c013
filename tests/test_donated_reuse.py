"""Reusing a donated array: the RuntimeError jax.jit raises, and nothing on stderr.

The runtime logs an error line ("ExecutePrepareWithOomRetries failed ...
Buffer has been deleted or donated") when a deleted buffer reaches execute;
jaxlib never gets there (its signature computation finds the deleted array
first). A donating function's hit checks its inputs before executing.

Before jaxlib 0.11.2 jax.jit's hit hands a donated array to the runtime,
which logs that line and rejects it (ValueError, INVALID_ARGUMENT); nbjit
does the same there (`nbjit._jax.RUNTIME_REJECTS_DONATED_INPUTS`).
"""

import subprocess
import sys
import textwrap

import pytest
from _env import child_env

from nbjit import _jax

SCRIPT = textwrap.dedent("""\
    import sys, jax, jax.numpy as jnp
    import nbjit
    jit = {"jax": jax.jit, "nbjit": nbjit.jit}[sys.argv[1]]
    f = jit(lambda x, y: (x * 2, y["w"] + 1), donate_argnums=(0, 1))
    a, tree = jnp.ones(3), {"w": jnp.ones(2)}
    f(jnp.ones(3), {"w": jnp.ones(2)})
    f(jnp.ones(3), {"w": jnp.ones(2)})  # a hit
    f(a, tree)  # donates a and tree["w"]
    for args in [(a, {"w": jnp.ones(2)}), (jnp.ones(3), tree)]:  # at the top, in a pytree
        try:
            f(*args)
        except Exception as error:
            print(type(error).__name__, str(error).splitlines()[0])
        else:
            print("no error")
    g = jit(lambda x, y: x + y, donate_argnums=0)  # the deleted array at a kept position
    g(jnp.ones(3), jnp.ones(3))
    g(jnp.ones(3), jnp.ones(3))
    try:
        g(jnp.ones(3), a)
    except Exception as error:
        print(type(error).__name__, str(error).splitlines()[0])
    print("calls", sum(s.slow for s in nbjit.stats().values()))
    """)


def _run(jit: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, jit], capture_output=True, text=True,
                          timeout=120, env=child_env())


@pytest.mark.parametrize("jit", ["jax", "nbjit"])
def test_reusing_a_donated_array_raises_as_jax_jit_and_prints_nothing(jit):
    out = _run(jit)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    if _jax.RUNTIME_REJECTS_DONATED_INPUTS:  # jaxlib < 0.11.2: the runtime's error, logged
        rejected = ("ValueError INVALID_ARGUMENT: Invalid buffer passed to Execute() as "
                    "argument {} to replica 0: INVALID_ARGUMENT: Buffer has been deleted or "
                    "donated.")
        assert lines[:3] == [rejected.format(0), rejected.format(1), rejected.format(1)]
        if jit == "nbjit":
            assert lines[3] == "calls 0"  # raised from the hit, as jaxlib's fast path
        assert out.stderr.count("ExecutePrepareWithOomRetries failed") == 3, out.stderr
        return
    assert lines[:3] == ["RuntimeError Array has been deleted with shape=float32[3].",
                         "RuntimeError Array has been deleted with shape=float32[2].",
                         "RuntimeError Array has been deleted with shape=float32[3]."]
    if jit == "nbjit":
        assert lines[3] == "calls 3"  # three slow calls, "deleted_or_donated"
    assert "deleted or donated" not in out.stderr and "ExecutePrepare" not in out.stderr, \
        out.stderr
