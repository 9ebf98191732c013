"""Call keys: how a call's arguments become ``(key, shardings)``.

The binders (`nbjit.core.binders`) build keys from the pieces here: leaf
signatures, treedef ids, the markers that keep the key forms apart, and
the keyers of one list or tuple of jax.Arrays.

Keys never collide across the forms:
  * all jax.Arrays, positional, no static arguments: up to `UNROLL_MAX`
    arguments the flat tuple ``(aval, committed, aval, committed, ...)``,
    beyond it the tuple of ``(aval, committed)`` pairs (avals are interned by
    JAX and hash by identity);
  * all jax.Arrays otherwise: ``(shape marker, static items..., avals and
    committed flags or pairs...)``, the marker one object per key shape
    (`binders.shape_marker`) and each static argument two items, its exact
    type and itself;
  * a pytree a reader reads (`nbjit.core.structure`): ``(reader id, static
    items..., per-leaf items...)``, the id naming the call shape, treedef
    and leaf kinds;
  * leaves and flattened (one form: the same call keys alike either way):
    ``(LEAVES, call shape, static key, treedef id, per-leaf signatures)``;
  * one dynamic list or tuple whose elements are all jax.Arrays (read
    without a flatten; such a call never takes the flattened form):
    ``(SEQUENCE, call shape, static key, list or tuple, signatures)``, the
    signatures flat up to `UNROLL_MAX` elements, pairs beyond.
Static values enter keys with their exact type, so ``1``, ``1.0`` and
``True`` are different signatures, as in jaxlib. The shardings are compared
apart from the key (`nbjit.core.cache`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit._common import PYTHON_SCALARS
from nbjit.core.codegen import Source, run_source
from nbjit.core.inputs.values import canonical_dtypes, host_dtype

__all__ = ["LEAF_TYPES", "LEAVES", "SEQUENCE", "SEQUENCE_KEYERS", "SIGNATURE", "SIGNATURE_SCOPE",
           "UNROLL_MAX", "flat_reads", "leaf_signature", "learn_mixed_keyer", "mixed_keyers",
           "mixed_signatures", "treedef_id", "tuple_source"]

ArrayImpl = _jax.ArrayImpl
LEAVES = object()  # first item of every leaves/flattened key
SEQUENCE = object()  # first item of the key of one dynamic list or tuple of jax.Arrays
# Types that are pytree leaves themselves: arguments of these types are keyed
# without flattening.
LEAF_TYPES = frozenset({
    ArrayImpl, np.ndarray, *_jax.python_scalar_types,
    *(t for t in np.sctypeDict.values() if issubclass(t, (np.number, np.bool_))),
})
UNROLL_MAX = 16  # binders unroll the per-argument reads up to this many dynamic arguments


# ---------------------------------------------------------------------------
# Treedef ids

_treedef_ids: dict[Any, int] = {}
_treedef_counter = itertools.count()
_treedef_lock = threading.Lock()
_MAX_TREEDEF_IDS = 1 << 16


def treedef_id(treedef: Any) -> int:
    """A small int standing for `treedef` in keys: cheaper to hash and compare.

    Ids are never reused: when the table is full it starts afresh, and keys
    holding old ids simply stop matching (they age out of the LRU).
    """
    tid = _treedef_ids.get(treedef)
    if tid is None:
        with _treedef_lock:
            if len(_treedef_ids) >= _MAX_TREEDEF_IDS:
                _treedef_ids.clear()
            tid = _treedef_ids.setdefault(treedef, next(_treedef_counter))
    return tid


# ---------------------------------------------------------------------------
# Leaves


def leaf_signature(x: Any, canonical: dict) -> Any:
    """A hashable signature of one leaf, or None if JAX must handle it.

    A jax.Array gives ``(aval, committed)`` (its sharding is compared apart
    from the key). As in jaxlib, a numpy array and a numpy scalar key alike
    by (canonical dtype, shape): with x64 off, float64 and float32 inputs
    share a signature; a Python scalar keys by its type (weakly typed).
    `canonical` maps a dtype to its canonical dtype under the call's x64
    setting (which is part of the trace context).
    """
    t = type(x)
    if t is ArrayImpl:
        return (x.aval, x._committed)
    if t in PYTHON_SCALARS:
        return t
    if t is np.ndarray and (dtype := canonical.get(x.dtype)) is not None:
        return (dtype, x.shape)  # the common host leaf, its dtype seen before
    dtype = host_dtype(x, canonical)
    return None if dtype is None else (dtype, x.shape)


class _NoSignature(Exception):
    """A leaf no key can hold (raised inside a one-pass keying of leaves)."""


def _other_signature(x: Any) -> Any:
    """`leaf_signature` of a leaf the inline expression does not key; raises
    `_NoSignature` if it has none."""
    signature = leaf_signature(x, canonical_dtypes[_jax.enable_x64.value])
    if signature is None:
        raise _NoSignature
    return signature


# The signature of one leaf `{x}`, written once for `mixed_signatures` and for
# the binders that key leaves inline: the common leaves (arrays, numpy arrays
# of a dtype seen before, Python scalars) without a call, `get` being the
# canonical-dtype lookup of the call's x64 setting. Same as `leaf_signature`.
SIGNATURE = ("({x}.aval, {x}._committed) if (t := type({x})) is ArrayImpl"
             " else (dtype, {x}.shape) if t is ndarray and (dtype := get({x}.dtype)) is not None"
             " else t if t in PYTHON_SCALARS else other_signature({x})")
SIGNATURE_SCOPE = {"ArrayImpl": ArrayImpl, "ndarray": np.ndarray,
                    "PYTHON_SCALARS": PYTHON_SCALARS, "other_signature": _other_signature,
                    "NoSignature": _NoSignature, "canonical_dtypes": canonical_dtypes,
                    "x64": _jax.enable_x64}

def _mixed_signatures_source() -> str:
    src = Source()
    with src.block("def mixed_signatures(leaves):"):
        src.lines(['"""``(signatures, shardings)`` of leaves that are not all jax.Arrays (host',
                   'values, say), or None if some leaf has no signature (JAX must take it)."""',
                   "get = canonical_dtypes[x64.value].get"])
        with src.block("try:"):
            src.line(f"signatures = tuple([{SIGNATURE.format(x='x')} for x in leaves])")
        with src.block("except NoSignature:"):
            src.line("return None")
        src.line("return signatures, [x._sharding for x in leaves if type(x) is ArrayImpl]")
    return src.text()


mixed_signatures: Callable[[list], tuple[tuple, list] | None] = run_source(
    _mixed_signatures_source(), "mixed_signatures", dict(SIGNATURE_SCOPE),
    __name__)["mixed_signatures"]


# Keyers of one treedef's mixed leaves: `mixed_signatures` unrolled for the
# leaf types the treedef's first mixed call had (a dict of jax.Arrays and a
# numpy batch, say), each leaf in a local and its type checked. A call whose
# leaves have other types gets None and takes `mixed_signatures`. Only dtypes
# whose canonical dtype does not depend on x64 are checked by identity.
MIXED_KEYER_MAX_LEAVES = UNROLL_MAX
_MIXED_KEYERS_MAX = 4096


def _no_keyer(leaves: list) -> None:
    return None


def _mixed_keyer_source(leaves: list) -> tuple[str, dict] | None:
    names = [f"x{i}" for i in range(len(leaves))]
    checks, signatures, shardings, scope = [], [], [], {}
    for i, (name, x) in enumerate(zip(names, leaves, strict=True)):
        t = type(x)
        if t is ArrayImpl:
            checks.append(f"type({name}) is ArrayImpl")
            signatures.append(f"({name}.aval, {name}._committed)")
            shardings.append(f"{name}._sharding")
        elif t in PYTHON_SCALARS:
            checks.append(f"type({name}) is T{i}")
            signatures.append(f"T{i}")
            scope[f"T{i}"] = t
        elif t is np.ndarray:
            dtype = x.dtype
            canonical: dict[bool, Any] = {
                x64: canonical_dtypes[x64].get(dtype) for x64 in (False, True)}
            if canonical[False] is None or canonical[False] != canonical[True]:
                return None
            checks.append(f"type({name}) is ndarray and {name}.dtype is D{i}")
            signatures.append(f"(C{i}, {name}.shape)")
            scope[f"D{i}"], scope[f"C{i}"] = dtype, canonical[False]
        else:
            return None
    src = Source()
    with src.block("def keyer(leaves):"):
        src.line(f"{tuple_source(names)[1:-1]} = leaves")
        with src.block(f"if {' and '.join(checks)}:"):
            src.line(f"return {tuple_source(signatures)}, [{', '.join(shardings)}]")
        src.line("return None")
    return src.text(), {"ArrayImpl": ArrayImpl, "ndarray": np.ndarray, **scope}


def learn_mixed_keyer(tid: int, leaves: list) -> None:
    """Builds the keyer of treedef `tid` from one call's leaves (see above)."""
    keyer: Callable[[list], Any] = _no_keyer
    if 0 < len(leaves) <= MIXED_KEYER_MAX_LEAVES:
        for x64 in (False, True):  # the canonical dtypes of both settings, seen once
            for x in leaves:
                if type(x) is np.ndarray:
                    host_dtype(x, canonical_dtypes[x64])
        made = _mixed_keyer_source(leaves)
        if made is not None:
            keyer = run_source(made[0], f"mixed keyer {len(leaves)}", made[1], __name__)["keyer"]
    if len(mixed_keyers) >= _MIXED_KEYERS_MAX:
        mixed_keyers.clear()
    mixed_keyers[tid] = keyer


mixed_keyers: dict[int, Callable[[list], Any]] = {}  # treedef id -> keyer (ids are never reused)


# ---------------------------------------------------------------------------
# Flat reads of jax.Arrays (the binders' all-array form, and sequence keyers)


def flat_reads(names: list[str]) -> tuple[list[str], list[str]]:
    """The items of the flat signature of jax.Arrays in locals `names`,
    ``["a.aval", "a._committed", "b.aval", ...]`` (no tuple per array), and
    the items of their shardings list, ``["a._sharding", "b._sharding"]``."""
    items = [item for x in names for item in (f"{x}.aval", f"{x}._committed")]
    return items, [f"{x}._sharding" for x in names]


def tuple_source(items: list[str]) -> str:
    """``(a, b)``; ``(a,)`` for one item; ``()`` for none."""
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _sequence_keyer_source(n: int) -> str:
    """``keyer(leaves)`` for a list or tuple of exactly n jax.Arrays: the flat
    signatures and the shardings (`flat_reads`), each element in a local;
    AttributeError if one is not a jax.Array."""
    names = [f"x{i}" for i in range(n)]
    items, shardings = flat_reads(names)
    src = Source()
    with src.block("def keyer(leaves):"):
        if names:
            src.line(f"{tuple_source(names)[1:-1]} = leaves")
        src.line(f"return {tuple_source(items)}, [{', '.join(shardings)}]")
    return src.text()


# length -> keyer, for the one-list-or-tuple form; longer sequences loop (pairs).
# Flat and pair signatures never compare equal (their items differ in type).
SEQUENCE_KEYERS = {n: run_source(_sequence_keyer_source(n), f"sequence keyer {n}", {},
                                  __name__)["keyer"]
                   for n in range(UNROLL_MAX + 1)}
