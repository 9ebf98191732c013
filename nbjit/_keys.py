"""Call keys and binders: how a call becomes ``(key, shardings, trace context)``.

A *call shape* is the count of positional arguments and the keyword names in
order: ``n`` for a positional call, ``(n, *names)`` with keywords. Each
function builds, once per call shape, a *binder* (as Triton's
`JITFunction` does): a small generated function that reads exactly the
attributes that shape needs, builds the key, finds the node and runs it.
A binder keys a call one of four ways, chosen by the dynamic arguments'
types on each call: all `jax.Array`s (the common case): read one by one;
all leaves with host values among them (numpy arrays and scalars, Python
scalars): keyed as they are; one list or tuple of `jax.Array`s (``f(xs)``):
its elements read one by one; anything else (pytrees): flattened as JAX
does, then the leaves keyed. A leaf nothing can key (a tracer, an object)
sends the call to JAX's own path.

Keys never collide across the forms:
  * all jax.Arrays, positional, no static arguments: up to `UNROLL_MAX`
    arguments the flat tuple ``(aval, committed, aval, committed, ...)``,
    beyond it the tuple of ``(aval, committed)`` pairs (avals are interned by
    JAX and hash by identity);
  * all jax.Arrays otherwise: ``(shape marker, static items..., avals and
    committed flags or pairs...)``;
  * leaves and flattened (one form: the same call keys alike either way):
    ``(LEAVES, call shape, static key, treedef id, per-leaf signatures)``;
  * one dynamic list or tuple whose elements are all jax.Arrays (read
    without a flatten; such a call never takes the flattened form):
    ``(SEQUENCE, call shape, static key, list or tuple, signatures)``, the
    signatures flat up to `UNROLL_MAX` elements, pairs beyond.
Static values enter keys with their exact type, so ``1``, ``1.0`` and
``True`` are different signatures, as in jaxlib.
"""

from __future__ import annotations

import itertools
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit._codegen import run_source
from nbjit._record import canonical_dtypes, host_dtype

__all__ = ["Split", "leaf_signature", "make_binder", "mixed_signatures", "treedef_id",
           "LEAVES", "UNROLL_MAX"]

ArrayImpl = _jax.ArrayImpl
LEAVES = object()  # first item of every leaves/flattened key
SEQUENCE = object()  # first item of the key of one dynamic list or tuple of jax.Arrays
_PYTHON_SCALARS = frozenset({bool, int, float, complex})  # not JAX's shape-polymorphic dims
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
    if t in _PYTHON_SCALARS:
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
_SIGNATURE = ("({x}.aval, {x}._committed) if (t := type({x})) is ArrayImpl"
              " else (dtype, {x}.shape) if t is ndarray and (dtype := get({x}.dtype)) is not None"
              " else t if t in PYTHON_SCALARS else other_signature({x})")
_SIGNATURE_SCOPE = {"ArrayImpl": ArrayImpl, "ndarray": np.ndarray,
                    "PYTHON_SCALARS": _PYTHON_SCALARS, "other_signature": _other_signature,
                    "NoSignature": _NoSignature, "canonical_dtypes": canonical_dtypes,
                    "x64": _jax.enable_x64}

_MIXED_SIGNATURES = f"""\
def mixed_signatures(leaves):
    \"""``(signatures, shardings)`` of leaves that are not all jax.Arrays (host
    values, say), or None if some leaf has no signature (JAX must take it).\"""
    get = canonical_dtypes[x64.value].get
    try:
        signatures = tuple([{_SIGNATURE.format(x="x")} for x in leaves])
    except NoSignature:
        return None
    return signatures, [x._sharding for x in leaves if type(x) is ArrayImpl]
"""
mixed_signatures: Callable[[list], tuple[tuple, list] | None] = run_source(
    _MIXED_SIGNATURES, "mixed_signatures", dict(_SIGNATURE_SCOPE))["mixed_signatures"]


# ---------------------------------------------------------------------------
# Static / dynamic split per call shape


class Split:
    """Which arguments of one call shape are static, worked out once.

    `static_positions` and `dynamic_positions` index the positional
    arguments; `static_names` and `dynamic_names` (both sorted, the order in
    which JAX flattens keyword arguments) the keywords. `key_shape` is the
    shape with sorted names: keyword order never changes a signature.
    """

    __slots__ = ("shape", "key_shape", "nargs", "names", "static_positions",
                 "dynamic_positions", "static_names", "dynamic_names", "has_static")

    def __init__(self, shape: Any, static_argnums: tuple[int, ...],
                 static_argnames: frozenset[str]) -> None:
        nargs, names = (shape, ()) if type(shape) is int else (shape[0], shape[1:])
        static = sorted({i if i >= 0 else i + nargs for i in static_argnums})
        self.shape = shape
        self.key_shape = (nargs, *sorted(names)) if names else nargs
        self.nargs = nargs
        self.names = names
        self.static_positions = tuple(i for i in static if 0 <= i < nargs)
        self.dynamic_positions = tuple(i for i in range(nargs) if i not in self.static_positions)
        self.static_names = tuple(sorted(static_argnames.intersection(names)))
        self.dynamic_names = tuple(sorted(k for k in names if k not in static_argnames))
        self.has_static = bool(self.static_positions or self.static_names)

    def leaves_treedef_id(self) -> int:
        """The treedef id of this shape's dynamic arguments when each is a leaf."""
        tree: Any = (0,) * len(self.dynamic_positions)
        if self.dynamic_names:
            tree = (tree, dict.fromkeys(self.dynamic_names, 0))
        return treedef_id(_jax.flatten_for_dispatch(tree)[1])


# ---------------------------------------------------------------------------
# Binders and the hit path
#
# One template holds the hit path (lookup -> inputs -> execute -> outputs).
# Binders inline it after building their key; `make_hit` compiles it alone
# for a miss that another thread compiled meanwhile. The *timed* flavour
# (while a `nbjit.profile()` is active) adds clock stamps between the
# phases; the plain one pays nothing for it. Slow and miss calls go through
# `whole(self, t0, fn, *args)`, which the timed flavour uses to time them whole.

_HIT_TEMPLATE = """\
    context = trace_context()
    try:  # a static argument's __hash__ or __eq__ may raise: JAX reports it
        node = lookup(key)
    except Exception:
        return whole(self, {t0}, self._slow, args, kwargs, "static_arg_error")
    while node is not None and (node.shardings != shardings or node.context != context):
        node = node.next
    if node is None or (record := node.record) is None or post_hook.value is not None:
        return whole(self, {t0}, self._miss_or_slow, args, kwargs, {leaves},
                     (key, shardings, context), node)
    node.shardings = shardings  # equal; keeping the newest makes identity checks hit
{stamp_lookup}    try:
        touch(node)  # KeyError if another thread evicted it meanwhile
        inputs = {leaves} if record.leaves_are_inputs else record.prepare({leaves})
    except Exception:  # e.g. a transfer guard: JAX's own path says what is wrong
        return whole(self, {t0}, self._slow, args, kwargs, "input_refused")
{stamp_inputs}    try:
        results = record.execute(inputs)
    except Exception as error:
        return whole(self, {t0}, self._execute_failed, error, args, kwargs, inputs)
{stamp_execute}    outs = consume(results, record.out_handlers)
    node.hits += 1
{finish}"""

_PLAIN_FINISH = "    return outs[0] if record.single_output else record.out_tree.unflatten(outs)\n"
_TIMED_FINISH = """\
    out = outs[0] if record.single_output else record.out_tree.unflatten(outs)
    record_hit(self, t0, t_key, t_lookup, t_inputs, t_execute, clock())
    return out
"""

_BINDER_TEMPLATE = """\
def bind(self, args, kwargs):
{start}{unpack}{read}
{stamp_key}{tail}"""

_READ_UNROLLED = """\
    if {checks}:
        key = {key}
        shardings = [{shardings}]
        leaves = {leaves}
    elif {leaf_checks}:  # leaves already (host values among them): no flatten
        leaves = [{dynamic}]
        get = canonical_dtypes[x64.value].get
        try:
            signatures = ({signatures})
        except NoSignature:
            {unkeyable}
        shardings = [x._sharding for x in leaves if type(x) is ArrayImpl]
        key = (LEAVES, KEY_SHAPE, {static_key}, LEAVES_TREEDEF_ID, signatures)
{sequence_read}    else:
{flattened}"""

# One dynamic argument that is a list or tuple (JAX's many-args case,
# ``f(xs)``; a tuple carry): its elements are the leaves when they are all
# jax.Arrays, and such a container of n leaves has one treedef per type and
# n, so the key needs no flatten.
_READ_SEQUENCE = """\
    elif (container := type({arg})) is list or container is tuple:
        leaves = {arg}
        try:
            if (keyer := sequence_keyers_get(len(leaves))) is not None:
                signatures, shardings = keyer(leaves)
            else:
                signatures, shardings = (tuple([(x.aval, x._committed) for x in leaves]),
                                         [x._sharding for x in leaves])
            key = (SEQUENCE, KEY_SHAPE, {static_key}, container, signatures)
        except (AttributeError, ValueError):  # not all jax.Arrays; resized meanwhile
{flattened}"""


def _flat_reads(names: list[str]) -> tuple[str, str]:
    """The source of the flat signatures of jax.Arrays in locals `names`,
    ``"a.aval, a._committed, b.aval, ..., "`` (no tuple per array), and of
    their shardings, ``"a._sharding, b._sharding"``."""
    return ("".join(f"{x}.aval, {x}._committed, " for x in names),
            ", ".join(f"{x}._sharding" for x in names))


def _sequence_keyer_source(n: int) -> str:
    """``keyer(leaves)`` for a list or tuple of exactly n jax.Arrays: the flat
    signatures and the shardings (`_flat_reads`), each element in a local;
    AttributeError if one is not a jax.Array."""
    names = [f"x{i}" for i in range(n)]
    unpack = f"    {', '.join(names)}, = leaves\n" if names else ""
    signatures, shardings = _flat_reads(names)
    return f"def keyer(leaves):\n{unpack}    return ({signatures}), [{shardings}]\n"


# length -> keyer, for the one-list-or-tuple form; longer sequences loop (pairs).
# Flat and pair signatures never compare equal (their items differ in type).
_SEQUENCE_KEYERS = {n: run_source(_sequence_keyer_source(n), f"sequence keyer {n}", {})["keyer"]
                    for n in range(UNROLL_MAX + 1)}

_READ_LOOP = """\
    dynamic = {dynamic}
    try:
        pairs, shardings = (tuple([(x.aval, x._committed) for x in dynamic]),
                            [x._sharding for x in dynamic])
        key = {key}
        leaves = dynamic
    except AttributeError:
{flattened}"""

# Dynamic arguments that are not all jax.Arrays (pytrees, host values): flatten
# them as JAX does and key the leaves. Leaves that are not all jax.Arrays are
# keyed one by one (`mixed_signatures`); a leaf nothing can key (a tracer, an
# object) sends the call to `_unkeyable`: JAX's own path.
_READ_FLATTENED = """\
        leaves, treedef = flatten({tree})
        tid = treedef_ids_get(treedef)
        if tid is None:
            tid = treedef_id(treedef)
        signatures = None
        if not leaves or type(leaves[-1]) is ArrayImpl:  # else host values: no array attempt
            try:  # one assignment: a leaf with .aval but no ._sharding (a jax.Ref) sets neither
                signatures, shardings = (tuple([(x.aval, x._committed) for x in leaves]),
                                         [x._sharding for x in leaves])
            except AttributeError:
                pass
        if signatures is None:
            mixed = mixed_signatures(leaves)
            if mixed is None:
                {unkeyable}
            signatures, shardings = mixed
        key = (LEAVES, KEY_SHAPE, {static_key}, tid, signatures)
"""

_PROBE_READ_FINISH = "    return (leaves, key, shardings)\n"


def _hit_source(leaves: str, timed: bool) -> str:
    stamp = "    {} = clock()\n".format
    return _HIT_TEMPLATE.format(
        t0="t0" if timed else "0", leaves=leaves,
        stamp_lookup=stamp("t_lookup") if timed else "",
        stamp_inputs=stamp("t_inputs") if timed else "",
        stamp_execute=stamp("t_execute") if timed else "",
        finish=_TIMED_FINISH if timed else _PLAIN_FINISH)


def _argument_names(split: Split, unroll: bool) -> tuple[list[str], dict[str, str], str]:
    """How a binder's source names each argument, and the lines that unpack them."""
    if not unroll:  # many arguments: index the few static ones, loop over the rest
        return ([f"args[{i}]" for i in range(split.nargs)],
                {k: f"kwargs[{k!r}]" for k in split.names}, "")
    arg_names = [f"a{i}" for i in range(split.nargs)]  # every argument in a local of its own
    kw_names = {k: f"k{j}" for j, k in enumerate(split.names)}
    unpack = f"    {', '.join(arg_names)}, = args\n" if arg_names else ""
    if kw_names:
        unpack += f"    {', '.join(kw_names.values())}, = kwargs.values()\n"
    return arg_names, kw_names, unpack


def _dynamic_tree(split: Split, unroll: bool, arg_names: list[str],
                  kw_names: dict[str, str]) -> str:
    """The expression of the dynamic arguments as JAX flattens them:
    ``(positional, {name: value})``, or the positional tuple alone."""
    if unroll:
        positional = "(" + "".join(arg_names[i] + ", " for i in split.dynamic_positions) + ")"
        named = ", ".join(f"{k!r}: {kw_names[k]}" for k in split.dynamic_names)
    else:
        positional = ("tuple([args[i] for i in DYNAMIC_POSITIONS])" if split.static_positions
                      else "args")
        named = "k: kwargs[k] for k in DYNAMIC_NAMES"
    return f"({positional}, {{{named}}})" if split.dynamic_names else positional


def binder_source(split: Split, flavour: str = "plain") -> str:
    """The source of the binder for one call shape (see `make_binder`).

    `flavour`: "plain" (the hit path), "timed" (the same, with phase stamps)
    or "probe" (returns ``(leaves, key, shardings)``, or a string if a leaf
    cannot be keyed, and runs nothing).
    """
    timed = flavour == "timed"
    unroll = len(split.dynamic_positions) + len(split.dynamic_names) <= UNROLL_MAX
    arg_names, kw_names, unpack = _argument_names(split, unroll)
    dynamic = ([arg_names[i] for i in split.dynamic_positions]
               + [kw_names[k] for k in split.dynamic_names])
    statics = ([f"type({arg_names[i]}), {arg_names[i]}" for i in split.static_positions]
               + [f"{k!r}, type({kw_names[k]}), {kw_names[k]}" for k in split.static_names])
    marked = bool(split.names or statics)  # a plain positional call keys as bare pairs
    prefix = "shape, " + "".join(s + ", " for s in statics) if marked else ""
    if not (marked or not dynamic):
        leaves = "args"
    elif unroll:
        leaves = f"[{', '.join(dynamic)}]"
    else:  # built once, from the static split
        leaves = ("[args[i] for i in DYNAMIC_POSITIONS]"
                  + (" + [kwargs[k] for k in DYNAMIC_NAMES]" if split.dynamic_names else ""))
    t0_arg = ", t0" if timed else ""
    static_key = ("(" + "".join(f"({s}), " for s in statics) + ")") if statics else "()"
    unkeyable = ('return "unkeyable"' if flavour == "probe"
                 else f"return self._unkeyable(args, kwargs, leaves{t0_arg})")
    flattened = _READ_FLATTENED.format(tree=_dynamic_tree(split, unroll, arg_names, kw_names),
                                       static_key=static_key, unkeyable=unkeyable)
    if not dynamic:  # nothing to key but the static arguments
        read = f"    key = ({prefix})\n    shardings = []\n    leaves = {leaves}\n"
    elif unroll:
        flat_key, flat_shardings = _flat_reads(dynamic)
        sequence_read = "" if len(dynamic) != 1 else _READ_SEQUENCE.format(
            arg=dynamic[0], static_key=static_key,
            flattened=textwrap.indent(flattened, "    "))
        read = _READ_UNROLLED.format(
            checks=" and ".join(f"type({d}) is ArrayImpl" for d in dynamic) or "True",
            key=f"({prefix}{flat_key})", leaves=leaves, shardings=flat_shardings,
            flattened=flattened,
            leaf_checks=" and ".join(f"type({d}) in LEAF_TYPES" for d in dynamic),
            dynamic=", ".join(dynamic), static_key=static_key, unkeyable=unkeyable,
            signatures="".join(f"\n                {_SIGNATURE.format(x=d)}," for d in dynamic),
            sequence_read=sequence_read)
    else:
        read = _READ_LOOP.format(dynamic=leaves, flattened=flattened,
                                 key=f"({prefix}*pairs)" if marked else "pairs")
    tail = _PROBE_READ_FINISH if flavour == "probe" else _hit_source("leaves", timed)
    return _BINDER_TEMPLATE.format(
        start="    t0 = clock()\n" if timed else "", unpack=unpack, read=read.rstrip("\n"),
        stamp_key="    t_key = clock()\n" if timed else "", tail=tail)


def make_binder(split: Split, env: dict[str, Any], flavour: str = "plain"
                ) -> Callable[[Any, tuple, dict], Any]:
    """Compiles the binder of `split`: ``bind(pjit_function, args, kwargs)``.

    It keys the call (see the module docstring) and runs the hit path on it;
    a call it cannot key goes to the function's `_unkeyable`. `env` holds the
    names the source reads (see `_Binders`); the binder holds no reference to
    the function itself.
    """
    scope = {**env, **_SIGNATURE_SCOPE, "shape": (LEAVES, split.key_shape),
             "DYNAMIC_POSITIONS": split.dynamic_positions, "DYNAMIC_NAMES": split.dynamic_names,
             "LEAVES": LEAVES, "SEQUENCE": SEQUENCE, "KEY_SHAPE": split.key_shape,
             "flatten": _jax.flatten_for_dispatch,
             "treedef_ids_get": _treedef_ids.get, "treedef_id": treedef_id,
             "mixed_signatures": mixed_signatures, "LEAF_TYPES": LEAF_TYPES,
             "sequence_keyers_get": _SEQUENCE_KEYERS.get,
             "LEAVES_TREEDEF_ID": split.leaves_treedef_id()}
    name = f"binder {split.shape!r}{'' if flavour == 'plain' else ' ' + flavour}"
    return run_source(binder_source(split, flavour), name, scope)["bind"]


def make_hit(env: dict[str, Any], timed: bool = False) -> Callable[..., Any]:
    """The hit path alone, ``hit(self, args, kwargs, leaves, key, shardings, t0, t_key)``:
    for a call keyed elsewhere (a miss another thread compiled meanwhile)."""
    source = ("def hit(self, args, kwargs, leaves, key, shardings, t0, t_key):\n"
              + _hit_source("leaves", timed))
    return run_source(source, f"hit{' timed' if timed else ''}", dict(env))["hit"]
