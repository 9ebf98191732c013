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

Identity and hashing. A function is named by `_names.function_name`
(qualified name, definition site, ordinal), equal in every process running
the same program. A signature is a list of described entries (jit options,
argument layout, static values, pytree structures, per leaf its aval and its
sharding with mesh shape and device ids; with host-value checks on, a hash of
each host input's bytes) and a 64-bit key over them
(`_kernels.stable_signature_key`): every word comes from a fixed encoding of
the value, never from Python's salted `hash()`, `id()` or process-local ids.

Agreement. Process p agrees with process q when q has published p's key for
this function at any time (one marker per key): a re-miss of an agreed
signature, say after an eviction or `clear_cache` on one side, passes at once
even when q has since published others. Otherwise p waits, up to the timeout,
for q to catch up (q may lag, still compiling something else). p stops
waiting early when q cannot catch up: q's latest entry is a miss of its own
that p never published (both processes wait on each other), or q raised
against p's waiting call (it leaves a rejection for that call, so p raises
too even if q retries with p's signature). After the timeout p raises
`AgreementError` when q published a differing signature, and warns
(`AgreementWarning`) and goes on when q never called the function. A process
that hits never publishes, so only the missing side can be told.

Store layout, under ``nbjit/agreement/<function key>/``:
  ``seen/<signature key>/<rank>``: "1" once `rank` published that signature;
  ``latest/<rank>``: JSON of `rank`'s latest signature, its state ("waiting",
  "differs", "alone"), call site and described entries.
A check that agrees at once costs three round trips (two sets, one read).

Configuration: ``NBJIT_AGREEMENT_TIMEOUT`` (seconds, default
`DEFAULT_TIMEOUT_S`) and ``NBJIT_CHECK_AGREEMENT=1`` (host-value hashes; off
by default, on under ``python -m nbjit run --check-agreement``), or
`configure`. Host values are compared at misses only: the first call of each
signature.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax import tree_util

from nbjit import _jax
from nbjit.core.view import JitView
from nbjit.observe.names import aval_text, call_site, function_name, process_label

__all__ = ["AgreementError", "AgreementWarning", "check", "configure", "counters",
           "describe_signature", "process_label"]

DEFAULT_TIMEOUT_S = 60.0
_PREFIX = "nbjit/agreement"
_MAX_ENTRIES = 512  # described entries published per signature; the rest fold into one
_MAX_TEXT = 240  # characters per described value
_FIRST_POLL_S = 0.02
_MAX_POLL_S = 0.5
_MASK64 = (1 << 64) - 1
_NOT_CALLER = (_jax.NBJIT_DIR + os.sep,)  # warnings point past nbjit's frames


class AgreementError(ValueError):
    """Processes called one function with different signatures (nothing ran).

    `function`: its name; `path`: the first differing argument path (or
    field); `values`: process rank -> that path's value there.
    """

    def __init__(self, message: str, function: str, path: str, values: dict[int, str]) -> None:
        super().__init__(message)
        self.function = function
        self.path = path
        self.values = values


class AgreementWarning(RuntimeWarning):
    """A process did not call a function that spans processes within the timeout."""


# ---------------------------------------------------------------------------
# Configuration and counters


def _env_timeout() -> float:
    try:
        return float(os.environ.get("NBJIT_AGREEMENT_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


_config: dict[str, Any] = {"timeout_s": _env_timeout(),
           "check_host_values": os.environ.get("NBJIT_CHECK_AGREEMENT", "") not in ("", "0")}


def configure(timeout_s: float | None = None, check_host_values: bool | None = None) -> dict:
    """Sets the wait for other processes and the host-value switch; returns the old ones."""
    old = dict(_config)
    if timeout_s is not None:
        _config["timeout_s"] = float(timeout_s)
    if check_host_values is not None:
        _config["check_host_values"] = bool(check_host_values)
    return old


@dataclass
class Counters:
    """What agreement did in this process (misses of process-spanning functions)."""

    checks: int = 0  # exchanges made
    at_once: int = 0  # agreed in the first read (the others had published already)
    at_once_seconds: float = 0.0  # wall time of those exchanges (three round trips each)
    round_trips: int = 0  # key-value store calls
    describe_seconds: float = 0.0  # building the stable signatures
    seconds: float = 0.0  # wall time in exchanges, waits included
    waited_seconds: float = 0.0  # of which waiting for other processes
    max_wait_seconds: float = 0.0
    errors: int = 0
    warnings: int = 0


_counters = Counters()


def counters() -> Counters:
    return _counters


# ---------------------------------------------------------------------------
# Which functions take part


class _Memo(dict):
    """key -> compute(key), computed once; starts afresh when full (misses see few keys)."""

    def __init__(self, compute: Any, capacity: int) -> None:
        super().__init__()
        self.compute, self.capacity = compute, capacity

    def __call__(self, key: Any) -> Any:
        try:
            return self[key]
        except KeyError:
            pass
        except TypeError:  # unhashable
            return self.compute(key)
        value = self.compute(key)
        if len(self) >= self.capacity:
            self.clear()
        self[key] = value
        return value


# sharding -> whether its devices span processes
_sharding_spans = _Memo(lambda sharding: _jax.sharding_process_count(sharding) > 1, 4096)


@dataclass(frozen=True)
class _Function:
    name: str
    key: str  # hex of the name's stable hash: the store's directory for it
    options_span: bool  # explicit in/out shardings span processes
    options_text: str


_functions: weakref.WeakKeyDictionary[Any, _Function] = weakref.WeakKeyDictionary()
_options_span: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _function(jitted: JitView) -> _Function:
    """The function's name and store key (named only once it takes part)."""
    info = _functions.get(jitted)
    if info is None:
        from nbjit._kernels import stable_text_hash  # deferred: importing numba is slow

        name = function_name(jitted._fun)
        info = _Function(name, f"{stable_text_hash(name) & _MASK64:016x}",
                         _options_spans(jitted), _encode(jitted._options))
        _functions[jitted] = info
    return info


def _options_spans(jitted: JitView) -> bool:
    spans = _options_span.get(jitted)
    if spans is None:
        spans = _options_span[jitted] = any(
            _sharding_spans(s) for s in tree_util.tree_leaves(jitted._options)
            if isinstance(s, _jax.Sharding))
    return spans


class _Process:
    """What this process published: function key -> signature keys, and exchanges made."""

    def __init__(self) -> None:
        self.published: dict[str, set[int]] = {}
        self.sequence: dict[str, int] = {}
        self.rejected: set[tuple[str, int, int]] = set()  # (function, rank, seq) raised against
        self.lock = threading.Lock()

    def publish(self, function: str, key: int) -> tuple[set[int], int]:
        """Records an exchange; returns (the function's published keys, its sequence number)."""
        with self.lock:
            published = self.published.setdefault(function, set())
            published.add(key)
            seq = self.sequence[function] = self.sequence.get(function, 0) + 1
        return published, seq


_this_process = _Process()


def _spans_processes(jitted: JitView, leaves: Sequence) -> bool:
    for x in leaves:
        if type(x) is _jax.ArrayImpl and _sharding_spans(x.sharding):
            return True
    return _options_spans(jitted)


# ---------------------------------------------------------------------------
# Stable descriptions


def _describe_sharding(sharding: Any) -> str:
    """A sharding as text with nothing process-local: mesh shape, device ids, spec."""
    memory = getattr(sharding, "memory_kind", None)
    suffix = f", memory {memory}" if memory not in (None, "device") else ""
    if isinstance(sharding, _jax.NamedSharding):
        mesh: Any = sharding.mesh
        axes = ",".join(f"{n}={s}" for n, s in mesh.shape.items())
        ids = [d.id for d in mesh.devices.flat]
        return f"NamedSharding(mesh {axes} devices {_ids_text(ids)}, {sharding.spec}{suffix})"
    if isinstance(sharding, _jax.SingleDeviceSharding):
        device: Any = next(iter(sharding.device_set))  # (jax's stubs: Device has no id)
        return f"SingleDeviceSharding(device {device.id}{suffix})"
    ids = [d.id for d in sharding._device_assignment]
    return f"{type(sharding).__name__}(devices {_ids_text(ids)}{suffix})"


def _ids_text(ids: Sequence[int]) -> str:
    if len(ids) > 1 and list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return "[" + ",".join(map(str, ids)) + "]"


def _encode(value: Any) -> str:
    """A stable text for an option or static value (no addresses, no salted hashes)."""
    if isinstance(value, _jax.Sharding):
        return _sharding_text(value)
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        return "{" + ", ".join(f"{k!r}: {_encode(v)}" for k, v in items) + "}"
    if isinstance(value, tuple | list):
        inner = ", ".join(_encode(v) for v in value)
        return f"{type(value).__name__}({inner})"
    if isinstance(value, frozenset | set):
        return "{" + ", ".join(sorted(_encode(v) for v in value)) + "}"
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return repr(value)
    if hasattr(value, "id") and hasattr(value, "platform"):  # a Device
        return f"device {value.id}"
    text = repr(value)
    if " at 0x" in text:  # a default object repr: only its type is stable
        text = type(value).__qualname__
    return f"{type(value).__qualname__} {text}"


def _stable_text_hash(text: str) -> int:
    from nbjit._kernels import stable_text_hash  # deferred: importing numba is slow

    return stable_text_hash(text)


_text_hash = _Memo(_stable_text_hash, 16384)  # avals, shardings and paths repeat
_sharding_text = _Memo(_describe_sharding, 4096)


@dataclass(frozen=True)
class Signature:
    key: int  # stable int64 over every entry
    entries: list[tuple[str, str]]  # (path or field, value), in a fixed order


def describe_signature(name: str, options_text: str, description: Any,
                       args: tuple = (), kwargs: dict | None = None,
                       host_values: bool = False) -> Signature:
    """The stable signature of one call (`description`: `_explain.describe_call`'s).

    With `host_values`, the bytes of every host leaf (numpy arrays and
    scalars, Python scalars) of `args` and `kwargs` enter it too.
    """
    from nbjit import _kernels  # deferred: importing numba is slow

    text_hash = _text_hash
    entries = [("jit options", options_text),
               ("arguments", f"{len(description.leaves)} leaves, keywords "
                             f"{list(description.keyword_names)}")]
    entries += [(f"{path} (static)", _encode(value)) for path, _, value in description.statics]
    entries += [(f"{path} (pytree)", treedef) for path, treedef in description.structure]
    header = [text_hash(name)] + [text_hash(f"{p}\0{v}") for p, v in entries]
    packed = []
    for leaf in description.leaves:
        aval = aval_text(leaf, kind=True, weak=True)
        entries.append((leaf.path, aval))
        sharding = ""
        if leaf.sharding is not None:
            # An uncommitted array sits on its process's default device, which JAX
            # may move it from: its placement is process-local, not part of the call.
            sharding = (f"{_sharding_text(leaf.sharding)} committed" if leaf.committed
                        else "uncommitted")
            entries.append((f"{leaf.path} sharding", sharding))
        packed.append((text_hash(aval), bool(leaf.weak_type), bool(leaf.committed),
                       text_hash(sharding), text_hash(leaf.path), tuple(leaf.shape or ())))
    if host_values:
        values = dict(_host_leaves(args, kwargs, description))
        for leaf in description.leaves:
            if leaf.path in values:
                value = _host_value_text(values[leaf.path])
                entries.append((f"{leaf.path} value", value))
                header.append(text_hash(f"{leaf.path}\0{value}"))
    return Signature(_kernels.stable_signature_key(header, packed), entries)


def _host_leaves(args: tuple, kwargs: dict | None, description: Any) -> list[tuple[str, Any]]:
    """(path, value) of the host leaves of a call, with `describe_call`'s paths."""
    static = {path for path, _, _ in description.statics}
    kwargs = kwargs or {}
    arguments = [(f"args[{i}]", v) for i, v in enumerate(args)]
    arguments += [(f"kwargs[{k!r}]", kwargs[k]) for k in sorted(kwargs)]
    out = []
    for path, value in arguments:
        if path in static:
            continue
        for key_path, leaf in tree_util.tree_flatten_with_path(value)[0]:
            if isinstance(leaf, np.ndarray | np.generic) or type(leaf) in (
                    int, float, complex, bool):
                out.append((path + tree_util.keystr(key_path), leaf))
    return out


def _host_value_text(x: Any) -> str:
    if isinstance(x, np.ndarray | np.generic):
        from nbjit._kernels import hash_bytes  # deferred: importing numba is slow

        data = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
        return f"bytes hash {int(hash_bytes(data)) & _MASK64:016x}"
    return repr(x)


def _published_entries(entries: list[tuple[str, str]]) -> list[list[str]]:
    out = [[p, v if len(v) <= _MAX_TEXT else v[:_MAX_TEXT - 3] + "..."] for p, v in entries]
    if len(out) > _MAX_ENTRIES:
        from nbjit._kernels import stable_text_hash  # deferred: importing numba is slow

        rest = stable_text_hash(json.dumps(out[_MAX_ENTRIES - 1:]))
        out[_MAX_ENTRIES - 1:] = [[f"(entries from {_MAX_ENTRIES} on)",
                                   f"hash {rest & _MASK64:016x}"]]
    return out


# ---------------------------------------------------------------------------
# The check (the miss path calls it before JAX traces anything)


def check(jitted: JitView, args: tuple, kwargs: dict, leaves: Sequence, description: Any) -> None:
    """Returns when every process agrees on this call's signature (or is
    missing, after a warning); raises `AgreementError` when one differs.

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
                                   _config["check_host_values"])
    _counters.describe_seconds += time.perf_counter() - start
    try:
        _exchange(client, info, signature, call_site(), _jax.process_index(),
                  _jax.process_count())
    except _jax.JaxRuntimeError as error:  # the store itself failed: never break the call
        warnings.warn(f"nbjit: multi-process agreement of {info.name} skipped: {error}",
                      AgreementWarning, skip_file_prefixes=_NOT_CALLER)


class _Store:
    """The key-value calls of one exchange, counted."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client, self.prefix, self.trips = client, prefix, 0

    def set(self, key: str, value: str) -> None:
        self.trips += 1
        _jax.kv_set(self.client, self.prefix + key, value)

    def read(self, directory: str) -> dict[str, str]:
        """Last key component -> value, of every key under `directory`."""
        self.trips += 1
        found = _jax.kv_dir_get(self.client, self.prefix + directory)
        return {key.rsplit("/", 1)[1]: value for key, value in found}

    def wait(self, key: str, seconds: float) -> None:
        self.trips += 1
        _jax.kv_wait(self.client, self.prefix + key, seconds * 1e3)


def _exchange(client: Any, info: _Function, signature: Signature, site: str, rank: int,
              n: int, process: _Process = _this_process) -> None:
    """Publishes `signature`, then waits for the others (see the module docstring).

    Under ``seen/<signature>/``: ``<rank>`` once a process published it, and
    ``x<rank>.<seq>.<by>`` (the rejecter's entry) when process `by` raised
    against attempt `seq` of `rank` while that one waited: the waiting side
    raises too, even if `by` publishes the same signature afterwards (a
    retry), so both sides make the same calls after an error.
    """
    start = time.perf_counter()
    me = f"{signature.key & _MASK64:016x}"
    published, seq = process.publish(info.key, signature.key & _MASK64)
    store = _Store(client, f"{_PREFIX}/{info.key}/")
    entry = {"rank": rank, "seq": seq, "signature": me, "state": "waiting",
             "function": info.name, "site": site,
             "entries": _published_entries(signature.entries)}
    timeout = _config["timeout_s"]
    deadline = start + timeout
    mine = f"x{rank}.{seq}."

    def read_seen() -> tuple[set[int], dict[int, dict]]:
        names = store.read(f"seen/{me}/")
        rejected = {int(k[len(mine):]): json.loads(v) for k, v in names.items()
                    if k.startswith(mine)}
        return {int(k) for k in names if k.isdigit()}, rejected

    try:
        store.set(f"seen/{me}/{rank}", str(seq))  # the marker first: see _cannot_catch_up
        store.set(f"latest/{rank}", json.dumps(entry))
        seen, rejected = read_seen()
        missing = set(range(n)) - {rank} - seen
        latest: dict[int, Any] = {}
        at_once, poll = not (missing or rejected), _FIRST_POLL_S
        while missing or rejected:
            now = time.perf_counter()
            stuck = [q for q in missing if q in latest
                     and (info.key, q, latest[q]["seq"]) not in process.rejected
                     and _cannot_catch_up(latest[q], me, published)]
            if rejected or stuck or now >= deadline:
                differing = {q: latest[q] for q in missing if q in latest}
                differing.update(rejected)
                if differing:
                    entry["state"] = "differs"
                    store.set(f"latest/{rank}", json.dumps(entry))
                    text = json.dumps(entry)
                    for q, other in differing.items():
                        if q not in rejected and other["state"] == "waiting":
                            # it will raise too, and may call again: not stuck then
                            process.rejected.add((info.key, q, other["seq"]))
                            store.set(f"seen/{other['signature']}/x{q}.{other['seq']}.{rank}",
                                      text)
                    _counters.errors += 1
                    early = bool(rejected or stuck)
                    raise _error(info, rank, n, entry, differing, missing, timeout, early)
                entry["state"] = "alone"
                store.set(f"latest/{rank}", json.dumps(entry))
                _counters.warnings += 1
                warnings.warn(_missing_message(info, rank, sorted(missing), timeout),
                              AgreementWarning, skip_file_prefixes=_NOT_CALLER)
                return
            store.wait(f"seen/{me}/{min(missing)}", min(poll, deadline - now))
            poll = min(poll * 2, _MAX_POLL_S)
            # latest before seen: a peer shown waiting on a later miss had already
            # set its marker for ours, if it had one, so the seen read shows it.
            latest = {int(q): json.loads(v) for q, v in store.read("latest/").items()}
            seen, rejected = read_seen()
            missing -= seen
    finally:
        elapsed = time.perf_counter() - start
        _counters.checks += 1
        _counters.round_trips += store.trips
        _counters.seconds += elapsed
    _counters.at_once += at_once
    if at_once:
        _counters.at_once_seconds += elapsed
    else:
        _counters.waited_seconds += elapsed
        _counters.max_wait_seconds = max(_counters.max_wait_seconds, elapsed)


def _cannot_catch_up(other: dict, me: str, published: set[int]) -> bool:
    """Whether a process whose latest entry is `other` will not publish `me` soon:
    it waits at a miss whose signature this process never published, so it waits
    for this process, which waits for it. (One that raised may call again with
    `me`, a retry: it is waited for.)"""
    return (other["signature"] != me and other["state"] == "waiting"
            and int(other["signature"], 16) not in published)


# ---------------------------------------------------------------------------
# Messages


def _first_difference(mine: list, others: dict[int, list]) -> tuple[str, dict[int, str]]:
    """(first path whose value differs in some process, rank -> value there)."""
    tables = {q: dict(map(tuple, entries)) for q, entries in others.items()}
    own = dict(map(tuple, mine))
    paths = [p for p, _ in mine]
    for q in sorted(tables):
        paths += [p for p, _ in others[q] if p not in own]
    for path in paths:
        values = {q: table.get(path, "(absent)") for q, table in tables.items()}
        if any(v != own.get(path, "(absent)") for v in values.values()):
            return path, values
    return "signature", {}


def _error(info: _Function, rank: int, n: int, entry: dict, differing: dict[int, dict],
           missing: set[int], timeout: float, early: bool) -> AgreementError:
    others = {q: differing[q]["entries"] for q in sorted(differing)}
    path, values = _first_difference(entry["entries"], others)
    own = dict(map(tuple, entry["entries"])).get(path, "(absent)")
    values = {rank: own, **values}
    for q in range(n):
        values.setdefault(q, "(not called yet)" if q in missing else own)
    values = dict(sorted(values.items()))
    shown = ", ".join(f"process {q}: {v}" for q, v in values.items())
    sites = {rank: entry["site"], **{q: differing[q].get("site", "?") for q in differing}}
    when = ("another process waits on a signature of its own"
            if early else f"after waiting {timeout:g} s")
    message = (
        f"processes called {info.name} with different signatures ({when}); nothing was "
        f"compiled or run. First difference, {path}: {shown}. Called at: "
        + ", ".join(f"process {q}: {s}" for q, s in sorted(sites.items()))
        + ". Every process must call a function whose arrays span processes with the same "
        "global shapes, dtypes, shardings, static arguments and pytree structures, in the "
        "same order (build global arrays with the same global shape everywhere, e.g. "
        "jax.make_array_from_process_local_data). A process that is only late (still "
        f"compiling) needs a longer NBJIT_AGREEMENT_TIMEOUT (now {timeout:g} s).")
    return AgreementError(message, info.name, path, values)


def _missing_message(info: _Function, rank: int, missing: list[int], timeout: float) -> str:
    who = ", ".join(f"process {q}" for q in missing)
    return (f"nbjit: process {rank} called {info.name}, whose arrays span processes, and "
            f"{who} did not call it within {timeout:g} s (NBJIT_AGREEMENT_TIMEOUT); going on. "
            "If that function runs collectives, this process will wait in them: every "
            "process must make the same calls in the same order.")
