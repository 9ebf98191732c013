"""Stable signatures of a call, equal in every process that makes the same call.

A signature is a list of described entries (jit options, argument layout,
static values, pytree structures, per leaf its aval and its sharding with mesh
shape and device ids; with host-value checks on, a hash of each host input's
bytes; last, the fingerprint of the program compiled for it) and a 64-bit
key over them (`_kernels.stable_signature_key`): every
word comes from a fixed encoding of the value, never from Python's salted
`hash()`, `id()` or process-local ids. `first_difference` names the first
entry in which signatures differ, for the error message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax import tree_util

from nbjit import _jax
from nbjit._common import PYTHON_SCALARS
from nbjit.observe.names import aval_text

__all__ = ["MASK64", "Memo", "Signature", "describe_signature", "encode", "first_difference",
           "published_entries", "with_program"]

_MAX_ENTRIES = 512  # described entries published per signature; the rest fold into one
_MAX_TEXT = 240  # characters per described value
MASK64 = (1 << 64) - 1


class Memo(dict):
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
    ids = [d.id for d in _jax.device_assignment(sharding)]
    return f"{type(sharding).__name__}(devices {_ids_text(ids)}{suffix})"


def _ids_text(ids: Sequence[int]) -> str:
    if len(ids) > 1 and list(ids) == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return "[" + ",".join(map(str, ids)) + "]"


def encode(value: Any) -> str:
    """A stable text for an option or static value (no addresses, no salted hashes)."""
    if isinstance(value, _jax.Sharding):
        return _sharding_text(value)
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        return "{" + ", ".join(f"{k!r}: {encode(v)}" for k, v in items) + "}"
    if isinstance(value, tuple | list):
        inner = ", ".join(encode(v) for v in value)
        return f"{type(value).__name__}({inner})"
    if isinstance(value, frozenset | set):
        return "{" + ", ".join(sorted(encode(v) for v in value)) + "}"
    if value is None or type(value) in PYTHON_SCALARS or type(value) in (str, bytes):
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


_text_hash = Memo(_stable_text_hash, 16384)  # avals, shardings and paths repeat
_sharding_text = Memo(_describe_sharding, 4096)


@dataclass(frozen=True)
class Signature:
    key: int  # stable int64 over every entry
    entries: list[tuple[str, str]]  # (path or field, value), in a fixed order


def describe_signature(name: str, options_text: str, description: Any,
                       args: tuple = (), kwargs: dict | None = None,
                       host_values: bool = False) -> Signature:
    """The stable signature of one call (`description`: what
    `nbjit.observe.descriptions.describe_call` gives).

    With `host_values`, the bytes of every host leaf (numpy arrays and
    scalars, Python scalars) of `args` and `kwargs` enter it too.
    """
    from nbjit import _kernels  # deferred: importing numba is slow

    text_hash = _text_hash
    entries = [("jit options", options_text),
               ("arguments", f"{len(description.leaves)} leaves, keywords "
                             f"{list(description.keyword_names)}")]
    entries += [(f"{path} (static)", encode(value)) for path, _, value in description.statics]
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


def with_program(signature: Signature, program: str) -> Signature:
    """`signature` with the program compiled for the call (`program.Program.text`)
    as its last entry: a differing argument is named before the program."""
    key = _text_hash(f"{signature.key & MASK64:016x}\0program\0{program}")
    return Signature(key, [*signature.entries, ("program", program)])


def _host_leaves(args: tuple, kwargs: dict | None, description: Any) -> list[tuple[str, Any]]:
    """(path, value) of the host leaves of a call, with `describe_call`'s paths."""
    static = {path for path, _, _ in description.statics}
    kwargs = kwargs or {}
    values = [*args, *(kwargs[k] for k in sorted(kwargs))]
    if len(values) != len(description.arguments):  # another call's description
        return []
    out = []
    for path, value in zip(description.arguments, values, strict=True):
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
        return f"bytes hash {int(hash_bytes(data)) & MASK64:016x}"
    return repr(x)


def published_entries(entries: list[tuple[str, str]]) -> list[list[str]]:
    out = [[p, v if len(v) <= _MAX_TEXT else v[:_MAX_TEXT - 3] + "..."] for p, v in entries]
    if len(out) > _MAX_ENTRIES:
        from nbjit._kernels import stable_text_hash  # deferred: importing numba is slow

        rest = stable_text_hash(json.dumps(out[_MAX_ENTRIES - 1:]))
        out[_MAX_ENTRIES - 1:] = [[f"(entries from {_MAX_ENTRIES} on)",
                                   f"hash {rest & MASK64:016x}"]]
    return out


def first_difference(mine: list, others: dict[Any, list]) -> tuple[str, dict[Any, str]]:
    """(first path whose value differs in some other signature, key -> value there):
    this signature's paths in its order first, then the others' own paths."""
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
