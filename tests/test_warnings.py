"""nbjit under warnings-as-errors: what equinox's, flax's and JAX's own test
configurations do (``filterwarnings = error``). Importing nbjit and running its
paths must warn nothing on every supported jax; jax.jit's own warnings still
reach the caller as they do under jax.jit."""

import os
import subprocess
import sys

from _env import child_env

# Every path a first session touches: the import, a miss and a hit with
# jax.Arrays, numpy arrays and Python scalars, a pytree, new host values each
# call (the host-input policy arms), an explained miss, stats and a profile.
_SCRIPT = """
import logging
import jax, jax.numpy as jnp, numpy as np
import nbjit

f = nbjit.jit(lambda a, b: a * 2 + b)
x = jnp.ones(3)
for i in range(40):
    f(x, np.full(3, i, np.float32))
    f(x, x)
    f(1.0, 2)
g = nbjit.jit(lambda p, x: p["w"] @ x, static_argnames=())
g({"w": jnp.ones((2, 3))}, np.ones(3, np.float32))
logging.disable(logging.WARNING)
with nbjit.explain_misses():
    f(jnp.ones(4), jnp.ones(4))
with nbjit.profile() as prof:
    f(x, x)
str(prof); str(f.stats()); str(nbjit.ranked_misses())
print("clean", float(f(x, x)[0]))
"""


def test_import_and_calls_warn_nothing_under_W_error():
    env = child_env(JAX_PLATFORMS="cpu")
    # -W error, then (taking precedence) the warnings a TPU machine's jax gives
    # at its import (matched by their text: jax issues them from other modules
    # than cloud_tpu_init), which are not nbjit's.
    command = [sys.executable, "-W", "error", "-W", "ignore:Transparent hugepages:UserWarning",
               "-W", "ignore:cloud_tpu_init failed:UserWarning", "-c", _SCRIPT]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                         cwd=os.path.dirname(__file__))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "clean 3.0"
