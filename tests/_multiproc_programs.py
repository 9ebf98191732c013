"""The two-process checks of one program on every process (nbjit/multiprocess/program.py):
a call traced from other frames on one process runs, a traced branch on the
process index is an AgreementError on every process, and calls after any
disagreement run.

Imported by `_multiproc_worker.py` after the agreement checks, so these run
after them, in this file's order (the parent reads the names from the files).
Every program here has a cross-process collective: from jaxlib 0.12.1 one
whose programs differ between the processes hangs both, under jax.jit too.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from _multiproc_common import (
    MESH,
    RANK,
    calls_hit,
    check,
    global_array,
    pair,
    same_call,
    same_outputs,
    separate,
)
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import nbjit
from nbjit.multiprocess import agreement as _agreement


def _collectives() -> dict[str, Callable[[], Callable]]:
    """Makers of functions over a global (8, 4) array with a cross-process collective:
    lines of their own; `jnp.sum` as it is (no line of the user's in its program; a
    new object each time, or nbjit.jit and jax.jit of it would share entries); a
    shard_map's psum; a replicated output (an all-gather)."""
    return {
        "lines of its own": lambda: lambda x: jnp.sum(x * 2.0) + x,
        "jnp.sum as it is": lambda: functools.partial(jnp.sum),
        "shard_map psum": lambda: jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=MESH,
                                                in_specs=P("x"), out_specs=P()),
        "replicated output": lambda: lambda x: jnp.cumsum(x, axis=0),
    }


def _options(name: str) -> dict[str, Any]:
    return {"out_shardings": NamedSharding(MESH, P())} if name == "replicated output" else {}


def _warm_up(f: Callable, x: Any) -> Any:  # a rank's own first call: another frame
    return f(x)


@check
def program_first_call_through_another_frame() -> None:
    """Process 0 makes the first call through a helper, process 1 from the loop: every
    call runs (jax.jit's hangs from jaxlib 0.12.1) and returns jax.jit's values of the
    plain case (every call from one line)."""
    x = global_array((8, 4), P("x"))
    shared = functools.partial(jnp.sum)  # jax.jit's trace of it, JAX's cache holds first
    makers = {**_collectives(), "traced by jax.jit first": lambda: shared}
    for name, make in makers.items():
        nb, jx = pair(make, **_options(name))
        expected = jx(x)  # the plain case, on every process from this line
        for i in range(3):
            got = _warm_up(nb, x) if i == 0 and RANK == 0 else nb(x)
            same_outputs(got, expected)
        assert nb.miss_count == 1 and nb.slow_count == 0, (name, nb.miss_count)


@check
def program_clear_cache_on_one_process() -> None:
    """Process 1 drops its entries and JAX's traces and calls again from another line:
    its program is the one process 0 still runs."""
    x = global_array((8, 4), P("x"))
    for name, make in _collectives().items():
        nb, jx = pair(make, **_options(name))
        calls_hit(nb, jx, x)
        if RANK == 1:
            nb.clear_cache()
        same_outputs(_warm_up(nb, x) if RANK == 1 else nb(x), jx(x))
        same_call(nb, jx, x)
        assert nb.miss_count == (1, 2)[RANK], (name, nb.miss_count)


def _branch(x: jax.Array) -> jax.Array:
    return jnp.sum(x) * (2.0 if jax.process_index() == 0 else 3.0)


def _programs_differ(nb: Any, x: Any) -> None:
    try:
        nb(x)
    except _agreement.AgreementError as raised:
        error, message = raised, str(raised)
    else:
        raise AssertionError("no AgreementError")
    print(f"[{RANK}] {message}", flush=True)
    assert error.path == "program", message
    assert all(v.startswith("fingerprint ") for v in error.values.values()), message
    assert error.values[0] != error.values[1], message
    # decided as soon as each saw the other wait with its own program: not after the
    # agreement timeout (30 s), which the message would name
    assert "their programs differ (another process waits on a program of its own)" in message
    assert "nothing was run" in message, message
    here, there = (r"constant\(2\)", r"constant\(3\)")[::1 - 2 * RANK]
    assert re.search(rf"first differs at line \d+: here `[^`]*{here}[^`]*`, "
                     rf"process {1 - RANK}: `[^`]*{there}", message), message
    assert nb.miss_count == 0 and nb._cache_size() == 0


def _calls_run(x: Any) -> None:
    """Process-spanning calls with collectives, each as jax.jit's."""
    for name, make in _collectives().items():
        nb, jx = pair(make, **_options(name))
        calls_hit(nb, jx, x)


@separate
def program_branch_on_process_index_then_calls_run() -> None:
    """A traced branch on jax.process_index(): AgreementError on both processes,
    naming the first differing HLO line (jax.jit hangs); the next calls run, the
    branching one raises again, and calls after it still run."""
    x = global_array((8, 4), P("x"))
    nb = nbjit.jit(_branch)
    _programs_differ(nb, x)
    _calls_run(x)
    _programs_differ(nb, x)
    _calls_run(x)


@separate
def program_calls_run_after_a_signature_disagreement() -> None:
    """Global shapes that differ: AgreementError on both; then new process-spanning
    functions run, and the same function with agreeing shapes."""
    nb, jx = pair(lambda: lambda x: jnp.sum(x) + 1)
    try:
        nb(global_array(((8, 4), (16, 4))[RANK], P("x")))
    except _agreement.AgreementError as error:
        assert error.path == "x" and "nothing was run" in str(error), str(error)
    else:
        raise AssertionError("no AgreementError")
    x = global_array((8, 4), P("x"))
    _calls_run(x)
    calls_hit(nb, jx, x)
