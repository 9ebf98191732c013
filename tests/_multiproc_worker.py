"""One process of the two-process checks in test_multiprocess.py.

    python tests/_multiproc_worker.py PORT PROCESS_ID OUT.json [CHECK ...]

Each process has 4 CPU devices (the parent sets XLA_FLAGS and
JAX_PLATFORMS=cpu); `jax.distributed.initialize` joins them into 8 global
devices, gloo carrying the collectives. Every check runs in both processes
in the same order (a collective that one process skips hangs the other: the
parent's timeout ends that) and compares nbjit.jit with jax.jit on two fresh
copies of one function: outputs (type, dtype, shape, weak type, sharding,
committedness, and each addressable shard's device, index and values) or the
exception type. Results go to OUT.json as {check: null or the failure}.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

PORT, PROCESS_ID, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

import jax  # noqa: E402

jax.distributed.initialize(
    coordinator_address=f"localhost:{PORT}", num_processes=2, process_id=PROCESS_ID,
    initialization_timeout=60, heartbeat_timeout_seconds=15, shutdown_timeout_seconds=15)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _diff import outcome  # noqa: E402
from _multiproc_common import (  # noqa: E402
    CHECKS,
    MESH,
    MESH2,
    OTHER,
    calls_hit,
    check,
    global_array,
    pair,
    same_call,
    same_outputs,
)
from jax.sharding import NamedSharding, make_single_device_sharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from nbjit import _jax  # noqa: E402
from nbjit.multiprocess import agreement as _agreement  # noqa: E402

# -- the checks ---------------------------------------------------------------


@check
def devices() -> None:
    assert jax.process_count() == 2 and len(jax.devices()) == 8
    assert len(jax.local_devices()) == 4


@check
def global_array_from_process_local_data() -> None:
    sharding = NamedSharding(MESH, P("x"))
    local = np.arange(16, dtype=np.float32).reshape(4, 4) + 100 * jax.process_index()
    x = jax.make_array_from_process_local_data(sharding, local)
    assert x.shape == (8, 4) and not x.is_fully_addressable
    nb, jx = pair(lambda: lambda x: jnp.sin(x) * 2 + 1)
    calls_hit(nb, jx, x)


@check
def global_array_from_callback_2d_mesh() -> None:
    x = global_array((8, 8), P("a", "b"), MESH2)
    nb, jx = pair(lambda: lambda x, y: (x @ y.T, x.sum(axis=0)))
    calls_hit(nb, jx, x, x)


@check
def psum_in_shard_map() -> None:
    x = global_array((8, 4), P("x"))
    make = lambda: jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=MESH,  # noqa: E731
                                 in_specs=P("x"), out_specs=P())
    nb, jx = pair(make)
    calls_hit(nb, jx, x)


@check
def all_gather_in_shard_map() -> None:
    x = global_array((8, 2), P("x"))
    make = lambda: jax.shard_map(  # noqa: E731
        lambda v: jax.lax.all_gather(v, "x", tiled=True), mesh=MESH,
        in_specs=P("x"), out_specs=P(), check_vma=False)
    nb, jx = pair(make)
    calls_hit(nb, jx, x)


@check
def all_gather_via_out_shardings() -> None:
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x: x * 3, out_shardings=NamedSharding(MESH, P()))
    calls_hit(nb, jx, x)
    out = nb(x)
    assert out.is_fully_addressable is False and out.sharding.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(out.addressable_data(0)),
                                  np.arange(32, dtype=np.float32).reshape(8, 4) * 3)


@check
def in_and_out_shardings() -> None:
    x = global_array((8, 8), P("a", "b"), MESH2)
    nb, jx = pair(lambda: lambda x: x.T + 1,
                  in_shardings=NamedSharding(MESH2, P("a", "b")),
                  out_shardings=NamedSharding(MESH2, P("b", "a")))
    calls_hit(nb, jx, x)


@check
def resharding_a_committed_input_is_an_error() -> None:
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x: x + 1, in_shardings=NamedSharding(MESH, P(None, "x")))
    for _ in range(2):
        e = same_call(nb, jx, x)
        assert isinstance(e, ValueError), e


@check
def donation() -> None:
    nb, jx = pair(lambda: lambda x, y: (x + y, y * 2), donate_argnums=0)
    y = global_array((8, 4), P("x"))
    for _ in range(3):
        xa, xb = global_array((8, 4), P("x")), global_array((8, 4), P("x"))
        same_outputs(nb(xa, y), jx(xb, y))
        assert xa.is_deleted() == xb.is_deleted()
    assert nb.miss_count == 1 and nb.slow_count == 0


@check
def static_args() -> None:
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x, n, *, axis: jnp.roll(x, n, axis=axis) * n,
                  static_argnums=1, static_argnames="axis")
    for n, axis in [(1, 0), (2, 0), (1, 0), (1, 1), (2, 0)]:
        same_call(nb, jx, x, n, axis=axis)
    assert nb.miss_count == 3 and nb.slow_count == 0


@check
def host_inputs_with_a_global_array() -> None:
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x, a, b, c: x * a + b + c.sum())
    calls_hit(nb, jx, x, 2.0, np.float32(3), np.arange(4, dtype=np.float32))


@check
def host_inputs_only() -> None:
    nb, jx = pair(lambda: lambda a, b: a * b + 1)
    calls_hit(nb, jx, np.arange(6.0).reshape(2, 3), 3)


@check
def numpy_input_to_a_replicated_global_sharding() -> None:
    """Every process passes the same full value; each keeps its own copies."""
    data = np.arange(64, dtype=np.float32).reshape(8, 8)
    for sharding in (NamedSharding(MESH, P()), NamedSharding(MESH2, P())):
        nb, jx = pair(lambda: lambda x: x * 2, in_shardings=sharding)
        calls_hit(nb, jx, data)


@check
def numpy_input_to_a_split_global_sharding_is_an_error() -> None:
    """Multi-controller JAX refuses host inputs for non-replicated shardings."""
    data = np.arange(64, dtype=np.float32).reshape(8, 8)
    for sharding in (NamedSharding(MESH, P("x")), NamedSharding(MESH2, P("a", "b"))):
        nb, jx = pair(lambda: lambda x: x * 2, in_shardings=sharding)
        for _ in range(2):
            e = same_call(nb, jx, data)
            assert isinstance(e, ValueError), e


@check
def pytree_of_global_arrays() -> None:
    x = global_array((8, 4), P("x"))
    y = global_array((8, 8), P("a", "b"), MESH2)
    nb, jx = pair(lambda: lambda d, *, k: {"s": d["x"].sum() + k, "t": d["y"] * k})
    calls_hit(nb, jx, {"x": x, "y": y}, k=jnp.float32(2))


@check
def bad_inputs() -> None:
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x: x + 1)
    same_call(nb, jx, x)
    for bad in ("a string", object(), [x, "nested"]):
        e = same_call(nb, jx, bad)
        assert isinstance(e, TypeError), e
    nb2, jx2 = pair(lambda: lambda x, y: x + y)
    e = same_call(nb2, jx2, x, global_array((8, 8), P("a", "b"), MESH2))  # shapes
    assert isinstance(e, TypeError), e
    same_call(nb, jx, x)


@check
def deleted_global_array() -> None:
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x: x + 1)
    same_call(nb, jx, x)
    x.delete()
    e = same_call(nb, jx, x)
    assert isinstance(e, RuntimeError), e


# jaxlib before 0.11 crashes the process (SIGSEGV) at a jax.jit hit of an
# executable with no computation on this process's devices, where later ones
# raise ValueError: there nbjit's hit is checked alone, for that ValueError.
JAX_HIT_WITHOUT_LOCAL_COMPUTATION_CRASHES = _jax.JAXLIB_VERSION < (0, 11)


def same_error_on_a_hit_without_local_computation(nb: Callable, jx: Callable,
                                                  *args: Any) -> Any:
    """`same_call` for a hit that runs nothing on this process (jax.jit raises)."""
    if JAX_HIT_WITHOUT_LOCAL_COMPUTATION_CRASHES:
        nb_ok, r_nb = outcome(nb, args, {})
        assert not nb_ok, "nbjit returned; jaxlib >= 0.11 raises ValueError"
        return r_nb
    return same_call(nb, jx, *args)


def _other_process_device_calls(wrap: Callable, unwrap: Callable) -> None:
    """SingleDeviceSharding on the other process's device, uncommitted local input.

    jaxlib hands the input over as it is: the miss (JAX's Python) returns an
    array with no addressable shard here; every hit raises ValueError (the
    executable has no computation on this process's devices).
    """
    nb, jx = pair(lambda: lambda v: unwrap(v) + 1, in_shardings=make_single_device_sharding(OTHER))
    x = jnp.arange(4.0)
    assert not x._committed
    out = same_call(nb, jx, wrap(x))
    assert not out.is_fully_addressable and not out.addressable_shards
    for _ in range(2):
        e = same_error_on_a_hit_without_local_computation(nb, jx, wrap(x))
        assert isinstance(e, ValueError), e


@check
def other_process_device_flat() -> None:
    _other_process_device_calls(lambda x: x, lambda v: v)


@check
def other_process_device_pytree() -> None:
    _other_process_device_calls(lambda x: {"a": x}, lambda v: v["a"])


@check
def other_process_device_committed_local_input() -> None:
    nb, jx = pair(lambda: lambda v: v * 2, in_shardings=make_single_device_sharding(OTHER))
    x = jax.device_put(jnp.arange(4.0), jax.local_devices()[1])
    same_call(nb, jx, x)
    for _ in range(2):
        e = same_error_on_a_hit_without_local_computation(nb, jx, x)
        assert isinstance(e, ValueError), e


@check
def other_process_device_host_input() -> None:
    nb, jx = pair(lambda: lambda v: v * 2, in_shardings=make_single_device_sharding(OTHER))
    for _ in range(3):
        out = same_call(nb, jx, np.arange(4.0, dtype=np.float32))
        assert not out.addressable_shards


import _multiproc_agreement  # noqa: E402  (its checks run after these)
import _multiproc_programs  # noqa: E402, F401  (and these after those)


def main() -> None:
    names = sys.argv[4:] or list(CHECKS)
    results: dict[str, str | None] = {}
    for name in names:
        start = time.perf_counter()
        try:
            CHECKS[name]()
            results[name] = None
        except Exception:  # noqa: BLE001  (reported to the parent)
            results[name] = traceback.format_exc()
        status = "ok" if results[name] is None else "FAILED\n" + results[name]
        print(f"[{PROCESS_ID}] {name}: {status} ({time.perf_counter() - start:.2f} s)",
              flush=True)
    results["_agreement"] = dataclasses.asdict(_agreement.counters())
    results["_agreement_cost"] = _multiproc_agreement.COST
    with open(OUT, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
