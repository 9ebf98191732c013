"""Agreement in a real multi-controller run: P processes x 2 CPU devices, by hand.

    python benchmarks/agreement_processes.py [--processes 4]

Starts P processes joined by jax.distributed (gloo collectives), each with 2
CPU devices, and runs the scenarios of the simulation for real: all agree
(ten misses), one process 2 s late, one with another global shape, one that
passes a locally committed array beside a global one (each process alone is
invalid: jax.jit's error must come first), one that never calls (the others
raise). Each process
prints one JSON line of what it saw; the parent prints them and exits 1 when
a process failed or disagreed with what is expected.

    python benchmarks/agreement_processes.py --scenarios agree differ late after never \
        --processes 8 --repeat 3 [--linger 10]

runs instead the real-process scenarios of tests/_agreement_worker.py (1 CPU
device per process, one `jnp.sum` over a global array, every process staying up
`--linger` seconds after its outcome), `--repeat` times each with another
start-up skew, and prints per run how many processes got the expected outcome
(the same sum, or an AgreementError naming both shapes; a late process within
5 s of its call) and what the others got.
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
    seen["never_raised"] = _never_called_raises(x, skip=rank == count - 1)
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


def _never_called_raises(x, skip: bool) -> bool:
    """One process skips a call: the others raise AgreementError after the (2 s) timeout."""
    import nbjit
    from nbjit.multiprocess import agreement as _agreement

    _agreement.configure(timeout_s=2)
    k = nbjit.jit(lambda x: x + 1)
    if skip:
        return False
    try:
        k(x).block_until_ready()
    except _agreement.AgreementError:
        return True
    return False


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--scenarios", nargs="+", default=None)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--linger", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="NBJIT_AGREEMENT_TIMEOUT of the scenario runs")
    args = parser.parse_args()
    if args.scenarios:
        return _scenarios(args)
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
               and seen["never_raised"] == (seen["rank"] != last))
    print("all as expected" if ok else "NOT as expected")
    return 0 if ok else 1


def _scenarios(args) -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from _agreement_worker import run_scenario

    bad = 0
    for scenario in args.scenarios:
        for i in range(args.repeat):
            start = time.perf_counter()
            timeout = 4.0 if scenario == "never" else args.timeout
            r = run_scenario(args.processes, scenario, seed=i, timeout_s=timeout,
                             linger_s=args.linger, bound_s=timeout + args.linger + 60)
            failures = r.failures()
            bad += bool(failures)
            seconds = {q: (o or {}).get("seconds") for q, o in r.outcomes.items()}
            trips = {q: (o or {}).get("round_trips") for q, o in r.outcomes.items()}
            print(f"{scenario} N={args.processes} run {i}: "
                  f"{args.processes - len(failures)}/{args.processes} as expected "
                  f"({time.perf_counter() - start:.1f} s); seconds to outcome {seconds}; "
                  f"round trips {trips}; exit codes {r.codes}"
                  + (f"; NOT as expected: {failures}" if failures else ""), flush=True)
    print("all as expected" if not bad else f"{bad} runs NOT as expected")
    return 0 if not bad else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(*map(int, sys.argv[2:5]))
    else:
        sys.exit(main())
