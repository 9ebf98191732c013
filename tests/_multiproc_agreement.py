"""The multi-controller agreement checks of test_multiprocess.py (nbjit/multiprocess/):
processes that call with the same or with different signatures.

Imported by `_multiproc_worker.py` after its own checks, so these run after
them, in this file's order (the parent reads the names from both files).
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import pathlib
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _diff import outcome
from _multiproc_common import (
    AGREEMENT_TIMEOUT_S,
    MESH,
    RANK,
    calls_hit,
    check,
    global_array,
    pair,
    same_call,
    separate,
)
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import nbjit
from nbjit import _jax
from nbjit.multiprocess import agreement as _agreement

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
    assert "lambda" in error.function and "_multiproc_agreement.py:" in error.function, message
    assert "nothing was run" in message, message
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
