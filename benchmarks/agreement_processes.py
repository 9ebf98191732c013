"""Agreement in a real multi-controller run: P processes x 2 CPU devices, by hand.

    python benchmarks/agreement_processes.py [--processes 4]

Starts P processes joined by jax.distributed (gloo collectives), each with 2
CPU devices, and runs the scenarios of the simulation for real: all agree
(ten misses), one process 2 s late, one with another global shape, one that
passes a locally committed array beside a global one (each process alone is
invalid: jax.jit's error must come first), one that never calls. Each process
prints one JSON line of what it saw; the parent prints them and exits 1 when
a process failed or disagreed with what is expected.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _worker(port: int, rank: int, count: int) -> None:
    import jax

    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=count,
                               process_id=rank, initialization_timeout=120)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import nbjit
    from nbjit.multiprocess import agreement as _agreement

    mesh = Mesh(np.array(jax.devices()), ("x",))
    rows = 2 * len(jax.devices())

    def global_array(n: int):
        data = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
        return jax.make_array_from_callback((n, 4), NamedSharding(mesh, P("x")),
                                            lambda i: data[i])

    seen: dict = {"rank": rank}
    x = global_array(rows)
    f = nbjit.jit(lambda x, k: jnp.sum(x) * k, static_argnums=1)
    start = time.perf_counter()
    seen["agree"] = [float(f(x, k)) for k in range(10)] == [float(jnp.sum(x)) * k
                                                          for k in range(10)]
    seen["agree_s"] = round(time.perf_counter() - start, 3)

    g = nbjit.jit(lambda x: x * 2)
    if rank == 1:
        time.sleep(2.0)
    start = time.perf_counter()
    g(x).block_until_ready()
    seen["late_wait_s"] = round(time.perf_counter() - start, 3)

    h = nbjit.jit(lambda x: jnp.sum(x))
    try:
        h(global_array(2 * rows if rank == count - 1 else rows))
        seen["shape"] = "no error"
    except _agreement.AgreementError as error:
        seen["shape"] = [error.path, error.values]
    seen["shape_then_agrees"] = float(h(x)) == float(jnp.sum(x))

    seen["local_error_as_jax"] = _local_error_as_jax(x)
    seen["never_warned"] = _never_called_warns(x, skip=rank == count - 1)
    counters = _agreement.counters()
    seen["round_trips"], seen["checks"] = counters.round_trips, counters.checks
    print("RESULT " + json.dumps(seen), flush=True)


def _local_error_as_jax(x) -> bool:
    """A locally committed array beside a global one: nbjit raises jax.jit's error."""
    import jax
    import jax.numpy as jnp

    import nbjit

    local = jax.device_put(jnp.ones(4), jax.local_devices()[0])
    errors = []
    for fn in (nbjit.jit(lambda x, y: x.sum() + y), jax.jit(lambda x, y: x.sum() + y)):
        try:
            fn(x, local)
            errors.append("no error")
        except Exception as error:  # noqa: BLE001 (compared below)
            errors.append(f"{type(error).__name__}: {error}")
    return errors[0] == errors[1] and errors[0].startswith("ValueError")


def _never_called_warns(x, skip: bool) -> int:
    """One process skips a call: the others warn after the (2 s) timeout."""
    import warnings

    import nbjit
    from nbjit.multiprocess import agreement as _agreement

    _agreement.configure(timeout_s=2)
    k = nbjit.jit(lambda x: x + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if not skip:
            k(x).block_until_ready()
    return sum(issubclass(w.category, _agreement.AgreementWarning) for w in caught)


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", NBJIT_AGREEMENT_TIMEOUT="60",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(port), str(r),
                               str(args.processes)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for r in range(args.processes)]
    results, ok = [], True
    for r, p in enumerate(procs):
        out, _ = p.communicate(timeout=600)
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if p.returncode or not lines:
            print(f"process {r} failed ({p.returncode}):\n{out[-4000:]}")
            ok = False
            continue
        results.append(json.loads(lines[-1][7:]))
    n = args.processes
    for seen in results:
        print(json.dumps(seen))
        last = n - 1
        rows = 4 * n  # 2 per device, 2 devices per process
        expected = ["args[0]", {str(q): f"float32[{2 * rows if q == last else rows},4]"
                                for q in range(n)}]
        ok &= (seen["agree"] and seen["shape"] == expected and seen["shape_then_agrees"]
               and seen["local_error_as_jax"]
               and seen["never_warned"] == (0 if seen["rank"] == last else 1))
    print("all as expected" if ok else "NOT as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(*map(int, sys.argv[2:5]))
    else:
        sys.exit(main())
