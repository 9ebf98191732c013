"""First use in fresh processes: `import nbjit`, first calls, against jax.jit.

A notebook's first cells: each measurement runs in a process of its own
(nothing cached in memory; numba's on-disk cache as it is), and each number
is the median over ``--processes`` processes, nbjit's and jax.jit's
processes alternating:

  * ``import nbjit`` after ``import jax`` (milliseconds);
  * the first call of a new function (`f(x)`, x a jax.Array), to its result;
  * the first call with a numpy input sharded over 8 host devices
    (``in_shardings=NamedSharding(mesh, P('x', 'y'))``), to its result;
  * the first calls of 40 new functions, together.

    python benchmarks/first_use.py [--processes N]

Run it against another checkout of nbjit by putting that first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CASES = {
    "import": """
t0 = time.perf_counter()
if JIT == "nbjit":
    import nbjit
out = time.perf_counter() - t0
""",
    "first call": """
jit = get_jit()
x = jnp.arange(1024.0)
f = jit(lambda a: jnp.tanh(a) * 2 + 1)
t0 = time.perf_counter()
jax.block_until_ready(f(x))
out = time.perf_counter() - t0
""",
    "first sharded numpy call": """
jit = get_jit()
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
x = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
f = jit(lambda a: jnp.sum(a * 2, axis=0), in_shardings=NamedSharding(mesh, P("x", "y")))
t0 = time.perf_counter()
jax.block_until_ready(f(x))
out = time.perf_counter() - t0
""",
    "40 new functions": """
jit = get_jit()
x = jnp.arange(64.0)
fs = [jit(lambda a, i=i: a * i + jnp.sin(a)) for i in range(40)]
t0 = time.perf_counter()
for f in fs:
    jax.block_until_ready(f(x))
out = time.perf_counter() - t0
""",
}

_PRELUDE = """
import os, sys, time, json
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
import numpy as np
import jax
import jax.numpy as jnp
JIT = sys.argv[1]
sys.path.insert(0, sys.argv[2])  # the nbjit the parent imported, whatever the cwd

def get_jit():
    if JIT == "nbjit":
        import nbjit
        return nbjit.jit
    return jax.jit
"""


def _one(case: str, jit: str, root: str) -> float:
    code = _PRELUDE + _CASES[case] + "\nprint(json.dumps(out))\n"
    done = subprocess.run([sys.executable, "-c", code, jit, root], capture_output=True,
                          text=True, check=False, env=os.environ.copy())
    if done.returncode:
        raise RuntimeError(f"{case} ({jit}) failed:\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--only", default="", help="cases whose name contains this")
    args = parser.parse_args(argv)
    import nbjit

    root = os.path.dirname(os.path.dirname(os.path.abspath(nbjit.__file__)))
    print(f"nbjit {os.path.dirname(nbjit.__file__)}, {args.processes} processes each, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'case':<26} {'nbjit ms':>9} {'jax.jit ms':>10} {'diff ms':>8} {'ratio':>6}  "
          "nbjit range")
    for case in _CASES:
        if args.only not in case:
            continue
        times: dict[str, list[float]] = {"nbjit": [], "jax": []}
        for i in range(args.processes):
            for jit in (("nbjit", "jax") if i % 2 == 0 else ("jax", "nbjit")):
                times[jit].append(_one(case, jit, root) * 1e3)
        a, b = statistics.median(times["nbjit"]), statistics.median(times["jax"])
        ratio = f"{a / b:6.2f}" if b > 0.5 else "     -"
        print(f"{case:<26} {a:9.1f} {b:10.1f} {a - b:8.1f} {ratio}  "
              f"{min(times['nbjit']):.1f}-{max(times['nbjit']):.1f}", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
