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
import gzip
import itertools
import json
import pathlib
import sys
import tempfile
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
from _diff import assert_same_outputs, outcome  # noqa: E402
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import nbjit  # noqa: E402
from nbjit import _jax  # noqa: E402
from nbjit.multiprocess import agreement as _agreement  # noqa: E402

MESH = Mesh(np.array(jax.devices()), ("x",))  # 8 devices, 4 per process
MESH2 = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
OTHER = next(d for d in jax.devices() if d.process_index != jax.process_index())
RANK = jax.process_index()
AGREEMENT_TIMEOUT_S = _agreement.configure()["timeout_s"]  # the parent's setting
CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


separate = check  # the parent reads the decorator's name from this file


# -- comparing ----------------------------------------------------------------


def same_leaf(path: str, a: Any, b: Any) -> None:
    assert type(a) is type(b), f"{path}: type {type(a)!r} != {type(b)!r}"
    if not isinstance(b, jax.Array):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path, strict=True)
        return
    for name in ("dtype", "shape", "weak_type", "sharding", "_committed",
                 "is_fully_addressable"):
        va, vb = getattr(a, name), getattr(b, name)
        assert va == vb, f"{path}: {name.lstrip('_')} {va} != {vb}"
    assert a.is_deleted() == b.is_deleted(), f"{path}: only one deleted"
    if b.is_deleted():
        return
    shards_a = sorted(a.addressable_shards, key=lambda s: s.device.id)
    shards_b = sorted(b.addressable_shards, key=lambda s: s.device.id)
    assert len(shards_a) == len(shards_b), f"{path}: addressable shards differ"
    for sa, sb in zip(shards_a, shards_b, strict=True):
        assert (sa.device, sa.index) == (sb.device, sb.index), f"{path}: shard placement"
        np.testing.assert_array_equal(np.asarray(sa.data), np.asarray(sb.data),
                                      err_msg=f"{path} shard on {sa.device}", strict=True)


def same_outputs(a: Any, b: Any) -> None:
    assert_same_outputs(a, b, same_leaf)  # tests/_diff.py, with shard-wise leaves


def same_call(nb: Callable, jx: Callable, *args: Any, **kwargs: Any) -> Any:
    """Both return equal outputs, or both raise the same exception type."""
    nb_ok, r_nb = outcome(nb, args, kwargs)
    jx_ok, r_jx = outcome(jx, args, kwargs)
    if not jx_ok:
        assert not nb_ok, f"nbjit returned; jax.jit raised {type(r_jx).__name__}: {r_jx}"
        assert type(r_nb) is type(r_jx), (
            f"nbjit raised {type(r_nb).__name__}: {r_nb}\n"
            f"jax.jit raised {type(r_jx).__name__}: {r_jx}")
        return r_nb
    assert nb_ok, f"nbjit raised {type(r_nb).__name__}: {r_nb}; jax.jit returned"
    same_outputs(r_nb, r_jx)
    return r_nb


def pair(make: Callable[[], Callable], **options) -> tuple[Any, Any]:
    """(nbjit.jit, jax.jit) of two fresh copies of one function."""
    return nbjit.jit(make(), **options), jax.jit(make(), **options)


def calls_hit(nb: Any, jx: Any, *args: Any, times: int = 3, **kwargs: Any) -> None:
    """A miss then fast-path hits, each returning what jax.jit returns."""
    for _ in range(times):
        jx_ok, r_jx = outcome(jx, args, kwargs)
        assert jx_ok, f"jax.jit raised {type(r_jx).__name__}: {r_jx}"
        same_call(nb, jx, *args, **kwargs)
    assert nb.miss_count == 1, f"nbjit missed {nb.miss_count} times in {times} calls"
    assert nb.slow_count == 0, f"{nb.slow_count} of {times} calls took JAX's path"


def global_array(shape: tuple[int, ...], spec: P, mesh: Mesh = MESH) -> jax.Array:
    """A global array over both processes; each process feeds its own rows."""
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), lambda idx: data[idx])


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
    nb, jx = pair(lambda: lambda v: unwrap(v) + 1, in_shardings=SingleDeviceSharding(OTHER))
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
    nb, jx = pair(lambda: lambda v: v * 2, in_shardings=SingleDeviceSharding(OTHER))
    x = jax.device_put(jnp.arange(4.0), jax.local_devices()[1])
    same_call(nb, jx, x)
    for _ in range(2):
        e = same_error_on_a_hit_without_local_computation(nb, jx, x)
        assert isinstance(e, ValueError), e


@check
def other_process_device_host_input() -> None:
    nb, jx = pair(lambda: lambda v: v * 2, in_shardings=SingleDeviceSharding(OTHER))
    for _ in range(3):
        out = same_call(nb, jx, np.arange(4.0, dtype=np.float32))
        assert not out.addressable_shards


# -- multi-controller agreement (nbjit/_agreement.py) ----------------------------


def per_process(*values: Any) -> Any:
    return values[RANK]


def disagrees(call: Callable[[], Any], nb: Any, path: str, values: tuple[str, str]) -> str:
    """`call` raises AgreementError naming `path` and both processes' values, with
    nothing compiled; returns the message."""
    try:
        call()
    except _agreement.AgreementError as raised:
        error, message = raised, str(raised)
    else:
        raise AssertionError("no AgreementError")
    assert error.path == path, (error.path, message)
    assert error.values == {0: values[0], 1: values[1]}, (error.values, message)
    assert f"{path}: process 0: {values[0]}, process 1: {values[1]}" in message, message
    assert "lambda" in error.function and "_multiproc_worker.py:" in error.function, message
    assert "nothing was compiled or run" in message, message
    print(f"[{RANK}] {message}", flush=True)
    assert nb._cache_size() == 0 and nb.miss_count == 0, (nb._cache_size(), nb.miss_count)
    return message


_EXCHANGES = itertools.count()


def on_each_process(value: str) -> list[str]:
    """`value` as each process gave it (the distributed key-value store)."""
    client, key = _jax.distributed_client(), f"tests/exchange/{next(_EXCHANGES)}"
    client.key_value_set(f"{key}/{RANK}", value)
    return [client.blocking_key_value_get(f"{key}/{r}", 30_000) for r in range(2)]


def then_agrees(nb: Any, jx: Any, *args: Any, **kwargs: Any) -> None:
    """After a disagreement both processes go on: a call that agrees runs as jax.jit's,
    with the same program on both (a trace cached by the disagreeing call's local
    validation would carry that call's traceback in its metadata: another
    fingerprint, whose launch ids pair with nothing from jaxlib 0.12.1)."""
    same_call(nb, jx, *args, **kwargs)
    same_call(nb, jx, *args, **kwargs)
    assert nb.miss_count == 1 and nb._cache_size() == 1
    node, = nb._namespace.entries.values()
    fingerprints = on_each_process(node.record.executable.fingerprint.hex())
    assert fingerprints[0] == fingerprints[1], fingerprints


@check
def agreement_re_miss_after_clear_cache_on_one_process() -> None:
    """A one-sided miss of an agreed signature passes at once (no wait for the hitter).

    The program has no cross-process collective: from jaxlib 0.12.1 a program with
    one that a single process traced again, here from another call (whose traceback
    goes into the program's metadata: another fingerprint, so other launch ids), no
    longer pairs with the others' executions, and jax.jit's call hangs there as
    nbjit's does (docs/multi-controller.md)."""
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x: x * 2 + 1)
    calls_hit(nb, jx, x)
    if RANK == 1:
        nb.clear_cache()
    before = _agreement.counters().at_once
    start = time.perf_counter()
    same_call(nb, jx, x)  # process 1 misses, process 0 hits
    assert time.perf_counter() - start < 5
    assert nb.miss_count == per_process(1, 2)
    assert _agreement.counters().at_once == before + per_process(0, 1)


@check
def agreement_re_miss_after_an_eviction_on_one_process() -> None:
    """nbjit's own entries dropped on one process (as its LRU evicts): the re-miss gets
    JAX's executable back, so a program with a cross-process collective still pairs
    with the hitter's executions (a fresh executable would not, from jaxlib 0.12.1)."""
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x: jnp.sum(x) + x)
    calls_hit(nb, jx, x)
    if RANK == 1:
        nb._clear_cache()  # nbjit's entries only; JAX's caches keep the executable
    for _ in range(2):
        same_call(nb, jx, x)  # process 1 misses once, process 0 hits
    assert nb.miss_count == per_process(1, 2)


@check
def agreement_process_local_function_does_not_wait() -> None:
    """Only this process's devices: no exchange, even when only one process calls it,
    with a shape of its own."""
    checks = _agreement.counters().checks
    start = time.perf_counter()
    if RANK == 0:
        calls_hit(*pair(lambda: lambda x: x * 2), jnp.arange(5.0))
    committed = jax.device_put(jnp.ones((4, 1 + RANK)), jax.local_devices()[1])
    calls_hit(*pair(lambda: lambda x: x * 2), committed)
    assert _agreement.counters().checks == checks
    assert time.perf_counter() - start < AGREEMENT_TIMEOUT_S


@check
def agreement_run_report_names_the_process() -> None:
    from nbjit.observe import report as _report

    nb = nbjit.jit(lambda x: x + 2)
    nb(global_array((8, 4), P("x")))
    report = _report.build(None)
    assert report["process"] == f"process {RANK} of 2", report["process"]
    assert _report.format_text(report).splitlines()[0] == (
        f"nbjit run: dispatch report (process {RANK} of 2)")
    assert str(nbjit.stats()).splitlines()[0] == f"(process {RANK} of 2)"
    from nbjit.observe import explain as _explain
    from nbjit.observe.descriptions import describe_call

    description = describe_call((np.ones(2),), {}, (), (), ())
    message = _explain.explain(description, _explain.MissContext("f", []))
    assert message.startswith(f"nbjit cache miss of f (process {RANK} of 2) at "), message


@check
def agreement_span_in_a_profiler_trace() -> None:
    """In a profiler trace a miss's exchange shows as `nbjit agreement` inside the miss's
    span (nbjit/observe/spans.py)."""
    x = global_array((8, 4), P("x"))
    nb = nbjit.jit(lambda x: x + 1)
    logdir = pathlib.Path(tempfile.mkdtemp())
    with jax.profiler.trace(str(logdir), create_perfetto_trace=True):
        nb(x)
    (path,) = logdir.rglob("perfetto_trace.json.gz")
    with gzip.open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    (exchange,) = [e for e in events if e["name"] == "nbjit agreement"]
    (miss,) = [e for e in events if e["name"].startswith("nbjit miss: ")]
    assert miss["ts"] <= exchange["ts"], (miss, exchange)
    assert exchange["ts"] + exchange["dur"] <= miss["ts"] + miss["dur"] + 1e-3, (miss, exchange)


@check
def agreement_local_error_comes_first() -> None:
    """Each process passes an array committed to one of its own devices beside a global
    array: the signatures differ, but jax.jit's error for each process alone (incompatible
    devices) is what nbjit raises too, type and message, on every call."""
    x = global_array((8, 4), P("x"))
    local = jax.device_put(jnp.ones(4), jax.local_devices()[0])
    nb, jx = pair(lambda: lambda x, y: x.sum() + y)
    for _ in range(2):
        e = same_call(nb, jx, x, local)
        r_jx = outcome(jx, (x, local), {})[1]
        assert type(e) is ValueError and "Received incompatible devices" in str(e), repr(e)
        assert str(e) == str(r_jx), f"nbjit: {e}\njax.jit: {r_jx}"
    assert nb.miss_count == 0 and nb._cache_size() == 0
    then_agrees(nb, jx, x, global_array((4,), P()))


COST: dict[str, float] = {}  # what agreement added to misses (results["_agreement_cost"])


@check
def agreement_cost_of_a_miss() -> None:
    """Ten misses of a process-spanning function (one per static value), each agreed."""
    x = global_array((8, 4), P("x"))
    nb = nbjit.jit(lambda x, n: x * n, static_argnums=1)
    nb(x, 0)  # imports and first compiles out of the way
    before = dataclasses.replace(_agreement.counters())
    start = time.perf_counter()
    for n in range(1, 11):
        nb(x, n)
    total = time.perf_counter() - start
    after = _agreement.counters()
    assert after.checks - before.checks == 10 and after.errors == before.errors
    COST.update({"misses": 10, "miss_wall_s": total, "compile_s": nb.stats().miss_seconds})
    for name in ("seconds", "describe_seconds", "at_once", "at_once_seconds", "round_trips",
                 "waited_seconds"):
        COST[name] = getattr(after, name) - getattr(before, name)


@check
def agreement_host_values_differ_switch_off() -> None:
    """Off by default: each process computes with its own copy, as jax.jit does."""
    nb, jx = pair(lambda: lambda x: x * 2, in_shardings=NamedSharding(MESH, P()))
    calls_hit(nb, jx, np.full(8, RANK, np.float32))


@separate
def agreement_global_shapes_elementwise() -> None:
    nb, jx = pair(lambda: lambda x: jnp.sin(x) * 2)
    x = global_array(per_process((8, 4), (16, 4)), P("x"))
    disagrees(lambda: nb(x), nb, "x", ("float32[8,4]", "float32[16,4]"))
    then_agrees(nb, jx, global_array((8, 4), P("x")))


@separate
def agreement_global_shapes_all_reduce() -> None:
    """Equal-size all-reduce: without agreement both would return a number."""
    nb, jx = pair(lambda: lambda x: jnp.sum(x))
    x = global_array(per_process((8, 4), (16, 4)), P("x"))
    disagrees(lambda: nb(x), nb, "x", ("float32[8,4]", "float32[16,4]"))
    then_agrees(nb, jx, global_array((8, 4), P("x")))


@separate
def agreement_global_shapes_replicated_output() -> None:
    """Without agreement both processes abort in gloo (collective size mismatch)."""
    nb, jx = pair(lambda: lambda x: x * 3, out_shardings=NamedSharding(MESH, P()))
    x = global_array(per_process((8, 4), (16, 4)), P("x"))
    disagrees(lambda: nb(x), nb, "x", ("float32[8,4]", "float32[16,4]"))
    then_agrees(nb, jx, global_array((8, 4), P("x")))


@separate
def agreement_dtypes_static_values_pytrees() -> None:
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x: jnp.sum(x * 2))
    y = x.astype(per_process(jnp.float32, jnp.int32))
    disagrees(lambda: nb(y), nb, "x", ("float32[8,4]", "int32[8,4]"))
    then_agrees(nb, jx, x)
    nb, jx = pair(lambda: lambda x, n: jnp.sum(x) * n, static_argnums=1)
    disagrees(lambda: nb(x, per_process(2, 3)), nb, "n (static)", ("2", "3"))
    then_agrees(nb, jx, x, 2)
    nb, jx = pair(lambda: lambda t: jnp.sum(jax.tree.leaves(t)[0]))
    tree = per_process({"a": x, "b": x}, {"a": x, "c": x})
    disagrees(lambda: nb(tree), nb, "t (pytree)",
              ("PyTreeDef({'a': *, 'b': *})", "PyTreeDef({'a': *, 'c': *})"))
    then_agrees(nb, jx, {"a": x, "b": x})


@separate
def agreement_host_values_differ_switch_on() -> None:
    """A replicated numpy input with other bytes on each process: named with the switch on."""
    _agreement.configure(check_host_values=True)
    nb, jx = pair(lambda: lambda x, s: x * s, in_shardings=NamedSharding(MESH, P()))
    data = np.full(8, RANK, np.float32)
    try:
        nb(data, 2.0)
    except _agreement.AgreementError as error:
        assert error.path == "x value", str(error)
        assert error.values[0] != error.values[1], str(error)
        assert all(v.startswith("bytes hash ") for v in error.values.values()), str(error)
    else:
        raise AssertionError("no AgreementError")
    then_agrees(nb, jx, np.ones(8, np.float32), 2.0)
    nb, jx = pair(lambda: lambda x, s: x * s, in_shardings=NamedSharding(MESH, P()))
    disagrees(lambda: nb(np.ones(8, np.float32), per_process(2.0, 2.5)), nb, "s value",
              ("2.0", "2.5"))


@separate
def agreement_skipped_call_raises() -> None:
    """Only process 0 calls an elementwise function over a global array: it raises
    AgreementError naming process 1 after the timeout (no hang, nothing compiled);
    process 1 never waits. Then both call it: process 1, arriving after process 0
    stopped waiting, raises too (both skipped that call), and the next call agrees."""
    _agreement.configure(timeout_s=2)
    x = global_array((8, 4), P("x"))
    nb, jx = pair(lambda: lambda x: x + 1)
    if RANK == 0:
        start = time.perf_counter()
        try:
            nb(x)
        except _agreement.AgreementError as error:
            assert error.values == {0: "called", 1: "not called"}, str(error)
            assert "process 1 did not call" in str(error), str(error)
        else:
            raise AssertionError("no AgreementError")
        waited = time.perf_counter() - start
        assert 2 <= waited < 15, waited
        assert nb.miss_count == 0
    time.sleep(5 if RANK == 1 else 0)  # process 0 has decided (after 2 s)
    _agreement.configure(timeout_s=AGREEMENT_TIMEOUT_S)
    if RANK == 1:
        start = time.perf_counter()
        try:
            nb(x)
        except _agreement.AgreementError as error:
            assert error.values[1] == "called after the others stopped waiting", str(error)
        else:
            raise AssertionError("no AgreementError")
        assert time.perf_counter() - start < 10
    then_agrees(nb, jx, x)


@separate
def agreement_one_sided_miss_of_another_signature() -> None:
    """Process 0 clears its cache and calls with a shape process 1 never publishes (it
    hits on the agreed one): process 0 names the difference after the timeout."""
    _agreement.configure(timeout_s=2)
    nb, jx = pair(lambda: lambda x: x - 1)
    calls_hit(nb, jx, global_array((8, 4), P("x")))
    if RANK == 0:
        nb.clear_cache()
        start = time.perf_counter()
        disagrees_after = global_array((16, 4), P("x"))
        try:
            nb(disagrees_after)
        except _agreement.AgreementError as error:
            assert error.values == {0: "float32[16,4]", 1: "float32[8,4]"}, str(error)
            assert "after waiting 2 s" in str(error), str(error)
        else:
            raise AssertionError("no AgreementError")
        assert 2 <= time.perf_counter() - start < 15
    else:
        calls_hit(nb, jx, global_array((8, 4), P("x")), times=1)


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
    results["_agreement_cost"] = COST
    with open(OUT, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
