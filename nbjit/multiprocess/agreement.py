"""Multi-controller agreement: every process calls a function with one signature
and runs one program for it.

In multi-controller JAX every process runs the same program and calls each
jitted function over global arrays. A process that passes another global
shape, dtype, sharding, static value or pytree structure than the others gets
a hang, an abort inside the collectives library, or a silently wrong result;
so does one that traces another program for the same call (a branch on
`jax.process_index()`), and, from jaxlib 0.12.1, one whose program differs
only in the source locations of the stack that traced it. On every miss
(never on a hit) of a function whose arguments or explicit shardings span
devices of more than one process, `check` compiles the call ahead, lowered
without its callers' frames (`program.py`), publishes this process's
signature of the call with the compiled program's fingerprint through
`jax.distributed`'s key-value store, and compares it with what the other
processes published, before anything runs. JAX's miss then runs that
program (`Checked.run`). Process-local functions return at once.

Identity. A function is named by `_names.function_name` (qualified name,
definition site, ordinal), equal in every process running the same program;
its signature (`signature.py`) is equal in every process making the same call,
and its program's fingerprint in every process tracing the same program.

Agreement (`exchange.py` has the store protocol). A signature is agreed once
every process has published it: a re-miss of an agreed signature, say after
an eviction or `clear_cache` on one side, passes at once even when the others
have since published others. Otherwise p waits, up to the timeout, for q to
catch up (q may lag, still compiling something else). The wait ends early
when q cannot catch up: q waits at a miss of its own that p never published
(both processes wait on each other), or q raised against p's waiting call (p
raises too even if q retries with p's signature). After the timeout p raises
`AgreementError` when q published a differing signature, and also when q
never called the function (a skipped call would leave p in its collectives;
q raises too if it calls afterwards). A decision reaches every process
waiting on that call, including those that publish after it is made. A
process that hits never publishes, so only the missing side can be told. An
error JAX raises for p's call on its own (say, committed arrays on
incompatible devices) comes before `AgreementError`: agreement is for calls
that are valid on each process. Processes whose programs differ evict JAX's
traces of the function, so that their next call traces afresh.
`AgreementWarning` means the store itself failed: that call's agreement was
skipped.

Configuration: ``NBJIT_AGREEMENT_TIMEOUT`` (seconds, default
`DEFAULT_TIMEOUT_S`) and ``NBJIT_CHECK_AGREEMENT=1`` (host-value hashes; off
by default, on under ``python -m nbjit run --check-agreement``), or
`configure`. Host values are compared at misses only: the first call of each
signature.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

from jax import tree_util

from nbjit import _jax
from nbjit._common import warn_past
from nbjit.core import view as _view
from nbjit.core.hooks import Checked
from nbjit.core.view import JitView
from nbjit.multiprocess import program as _program
from nbjit.multiprocess.exchange import (
    NOT_CALLER,
    AgreementError,
    AgreementWarning,
    Counters,
    FunctionInfo,
    add_counts,
    agree,
    configure,
    counters,
    settings,
)
from nbjit.multiprocess.signature import (
    MASK64,
    Memo,
    Signature,
    describe_signature,
    encode,
    first_difference,
    with_program,
)
from nbjit.observe import spans as _spans
from nbjit.observe.names import call_site, function_name, process_label

__all__ = ["AgreementError", "AgreementWarning", "Counters", "Signature",
           "check", "configure", "counters", "describe_signature", "first_difference",
           "process_label"]


# ---------------------------------------------------------------------------
# Which functions take part


# sharding -> whether its devices span processes
_sharding_spans = Memo(lambda sharding: _jax.sharding_process_count(sharding) > 1, 4096)
_functions: weakref.WeakKeyDictionary[Any, FunctionInfo] = weakref.WeakKeyDictionary()
_options_span: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _function(jitted: JitView) -> FunctionInfo:
    """The function's name and store key (named only once it takes part)."""
    info = _functions.get(jitted)
    if info is None:
        from nbjit._kernels import stable_text_hash  # deferred: importing numba is slow

        facts = _view.info(jitted)
        name = function_name(facts.fun)
        info = FunctionInfo(name, f"{stable_text_hash(name) & MASK64:016x}",
                            _options_spans(jitted), encode(facts.options))
        _functions[jitted] = info
    return info


def _options_spans(jitted: JitView) -> bool:
    spans = _options_span.get(jitted)
    if spans is None:
        spans = _options_span[jitted] = any(
            _sharding_spans(s) for s in tree_util.tree_leaves(_view.info(jitted).options)
            if isinstance(s, _jax.Sharding))
    return spans


def _spans_processes(jitted: JitView, leaves: Sequence) -> bool:
    for x in leaves:
        if type(x) is _jax.ArrayImpl and _sharding_spans(x.sharding):
            return True
    return _options_spans(jitted)


# ---------------------------------------------------------------------------
# The check (the miss path calls it before JAX's miss runs)


def check(jitted: JitView, args: tuple, kwargs: dict, leaves: Sequence,
          description: Any) -> Checked | None:
    """Returns how JAX's miss must run once every process agrees on this call's
    signature and program; raises `AgreementError` when one differs or did not
    call within the timeout (or the error JAX raises for this process's call on
    its own).

    Returns None at once for a single process and for process-local functions.
    """
    if _jax.process_count() == 1 or not _spans_processes(jitted, leaves):
        return None
    client = _jax.distributed_client()
    if client is None or description is None:  # nothing to agree through, or on:
        return Checked(_program.run, 0.0)  # lowered alike on every process all the same
    info = _function(jitted)
    start = time.perf_counter()
    signature = describe_signature(info.name, info.options_text, description, args, kwargs,
                                   settings["check_host_values"])
    add_counts(describe_seconds=time.perf_counter() - start)
    jax_jitted = _view.info(jitted).jax_jitted
    program, seconds = _program.compile_ahead(jax_jitted, args, kwargs)
    if program is not None:
        signature = with_program(signature, program.text)
    try:
        with _spans.span(_spans.AGREEMENT):  # in a profiler trace
            agree(client, info, signature, call_site(), _jax.process_index(),
                  _jax.process_count(),
                  validate=None if program is None else program.raise_failure,
                  program_text=None if program is None else program.hlo)
    except AgreementError as error:
        if error.path == "program":  # a trace or lowering cached elsewhere may be why
            _jax.evict_traces(jax_jitted)
        raise
    except _jax.JaxRuntimeError as error:  # the store itself failed: never break the call
        add_counts(warnings=1)
        warn_past(NOT_CALLER, f"nbjit: multi-process agreement of {info.name} skipped: "
                  f"{error}", AgreementWarning)
    return Checked(_program.run if program is None else program.run, seconds)
