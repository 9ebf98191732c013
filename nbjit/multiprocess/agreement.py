"""Multi-controller agreement: every process calls a function with one signature.

In multi-controller JAX every process runs the same program and calls each
jitted function over global arrays. A process that passes another global
shape, dtype, sharding, static value or pytree structure than the others gets
a hang, an abort inside the collectives library, or a silently wrong result.
On every miss (never on a hit) of a function whose arguments or explicit
shardings span devices of more than one process, `check` publishes this
process's signature of the call through `jax.distributed`'s key-value store
and compares it with what the other processes published, before anything is
traced, compiled or executed. Process-local functions return at once.

Identity. A function is named by `_names.function_name` (qualified name,
definition site, ordinal), equal in every process running the same program;
its signature (`signature.py`) is equal in every process making the same call.

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
that are valid on each process. `AgreementWarning` means the store itself
failed: that call's agreement was skipped.

Configuration: ``NBJIT_AGREEMENT_TIMEOUT`` (seconds, default
`DEFAULT_TIMEOUT_S`) and ``NBJIT_CHECK_AGREEMENT=1`` (host-value hashes; off
by default, on under ``python -m nbjit run --check-agreement``), or
`configure`. Host values are compared at misses only: the first call of each
signature.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from jax import tree_util

from nbjit import _jax
from nbjit._common import warn_past
from nbjit.core import view as _view
from nbjit.core.view import JitView
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
# The check (the miss path calls it before JAX traces anything)


def check(jitted: JitView, args: tuple, kwargs: dict, leaves: Sequence,
          description: Any) -> None:
    """Returns when every process agrees on this call's signature; raises
    `AgreementError` when one differs or did not call within the timeout (or
    the error JAX raises for this process's call on its own).

    Returns at once for a single process and for process-local functions.
    """
    if _jax.process_count() == 1 or description is None:
        return
    if not _spans_processes(jitted, leaves):
        return
    client = _jax.distributed_client()
    if client is None:
        return
    info = _function(jitted)
    start = time.perf_counter()
    signature = describe_signature(info.name, info.options_text, description, args, kwargs,
                                   settings["check_host_values"])
    add_counts(describe_seconds=time.perf_counter() - start)
    try:
        with _spans.span(_spans.AGREEMENT):  # in a profiler trace
            agree(client, info, signature, call_site(), _jax.process_index(),
                  _jax.process_count(), validate=_local_validation(jitted, args, kwargs))
    except _jax.JaxRuntimeError as error:  # the store itself failed: never break the call
        add_counts(warnings=1)
        warn_past(NOT_CALLER, f"nbjit: multi-process agreement of {info.name} skipped: "
                  f"{error}", AgreementWarning)


def _local_validation(jitted: JitView, args: tuple, kwargs: dict) -> Callable[[], None]:
    """Raises what JAX's path raises for this call on this process alone, if anything.

    Run only when the processes disagree (lowering traces the function): JAX
    lowers locally, with no collective, and checks there what one process can
    get wrong on its own (incompatible devices, bad types) with JAX's message.
    Its trace is then evicted from JAX's caches: a later agreed call of this
    signature must trace afresh, from its own call, as every other process
    does. A cached trace would carry this call's traceback into the program's
    metadata, so the program would differ from the other processes' (another
    fingerprint), and from jaxlib 0.12.1 its collectives then pair with
    nothing (launch ids derive from the fingerprint).
    """
    def validate() -> None:
        facts = _view.info(jitted)
        # as the dispatcher makes it (Any: jax's stubs lack its clear_cache)
        upstream: Any = _jax.jax_jit(facts.fun, **facts.options)
        try:
            _jax.lower_as_called(upstream, facts.fun, args, kwargs)
        finally:
            upstream.clear_cache()  # JAX's traces of `fun` (public: jit(f).clear_cache())

    return validate
