"""Call keys and binders: how a call becomes ``(key, shardings, trace context)``.

A *call shape* is the count of positional arguments and the keyword names in
order: ``n`` for a positional call, ``(n, *names)`` with keywords. Each
function builds, once per call shape, a *binder* (as Triton's
`JITFunction` does): a small generated function that reads exactly the
attributes that shape needs, builds the key, finds the node and runs it.
A binder expects every dynamic argument to be a `jax.Array` (the common
case); anything else (pytrees, host values, tracers, objects) goes to the
function's one general path, which keys flattened leaves.

Keys never collide across paths:
  * positional, no static arguments: the bare tuple of ``(aval, committed)``
    pairs (avals are interned by JAX and hash by identity);
  * any other binder: ``(shape marker, static items..., pairs...)``;
  * the general path: ``(_LEAVES, call shape, static key, treedef id,
    per-leaf signatures)``.
Static values enter keys with their exact type, so ``1``, ``1.0`` and
``True`` are different signatures, as in jaxlib.
"""

from __future__ import annotations

import itertools
import linecache
import os
import threading
from collections.abc import Callable
from typing import Any

from nbjit import _jax
from nbjit._record import host_dtype

__all__ = ["Split", "leaf_signature", "make_binder", "treedef_id",
           "LEAVES", "UNROLL_MAX"]

ArrayImpl = _jax.ArrayImpl
LEAVES = object()  # first item of every general-path key
_BINDER_DIR = os.path.dirname(os.path.abspath(__file__))
UNROLL_MAX = 8  # binders unroll the per-argument reads up to this many dynamic arguments


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
                flat_treedef_ids.clear()
            tid = _treedef_ids.setdefault(treedef, next(_treedef_counter))
    return tid


class _FlatTreedefIds(dict):
    """n -> the treedef id of an n-tuple of leaves (what flattening `args` gives)."""

    def __missing__(self, n: int) -> int:
        tid = self[n] = treedef_id(_jax.flatten_for_dispatch((0,) * n)[1])
        return tid


flat_treedef_ids = _FlatTreedefIds()


# ---------------------------------------------------------------------------
# Leaves (general path)


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
    dtype = host_dtype(x, canonical)
    if dtype is None:
        return None
    return t if t in _jax.python_scalar_types else (dtype, x.shape)


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
                 "dynamic_positions", "static_names", "dynamic_names")

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

    @property
    def has_static(self) -> bool:
        return bool(self.static_positions or self.static_names)

    def apply(self, args: tuple, kwargs: dict) -> tuple[tuple, tuple, dict]:
        """(static key, dynamic positional args, dynamic keyword args)."""
        static_key = tuple([(type(args[i]), args[i]) for i in self.static_positions])
        if self.static_positions:
            args = tuple([args[i] for i in self.dynamic_positions])
        if self.static_names:
            static_key += tuple([(k, type(kwargs[k]), kwargs[k]) for k in self.static_names])
            kwargs = {k: kwargs[k] for k in self.dynamic_names}
        return static_key, args, kwargs


# ---------------------------------------------------------------------------
# Binders

_BINDER_TEMPLATE = """\
def bind(self, args, kwargs):
{unpack}{read}
    return {finish}
"""

_READ_UNROLLED = """\
    if {checks}:
        key = {key}
        shardings = [{shardings}]
    else:
        return self.{general}(args, kwargs)
"""

_READ_LOOP = """\
    dynamic = {dynamic}
    try:
        pairs = tuple([(x.aval, x._committed) for x in dynamic])
        shardings = [x._sharding for x in dynamic]
    except AttributeError:
        return self.{general}(args, kwargs)
    key = {key}
"""


def binder_source(split: Split, probe: bool = False) -> str:
    """The source of the binder for one call shape (see `make_binder`).

    With `probe`, the binder returns ``(leaves, key, shardings)`` instead of
    running the call (the general path's twin is ``_general_signature``).
    """
    arg_names = [f"a{i}" for i in range(split.nargs)]
    kw_names = {k: f"k{j}" for j, k in enumerate(split.names)}
    unpack = ""
    if arg_names:
        unpack += f"    {', '.join(arg_names)}, = args\n"
    if kw_names:
        unpack += f"    {', '.join(kw_names.values())}, = kwargs.values()\n"
    dynamic = ([arg_names[i] for i in split.dynamic_positions]
               + [kw_names[k] for k in split.dynamic_names])
    statics = ([f"type({arg_names[i]}), {arg_names[i]}" for i in split.static_positions]
               + [f"{k!r}, type({kw_names[k]}), {kw_names[k]}" for k in split.static_names])
    marked = bool(split.names or statics)  # a plain positional call keys as bare pairs
    prefix = "shape, " + "".join(s + ", " for s in statics) if marked else ""
    leaves = f"[{', '.join(dynamic)}]" if (marked or not dynamic) else "args"
    general = "_general_signature" if probe else "_general"
    if len(dynamic) <= UNROLL_MAX:
        pairs = [f"({d}.aval, {d}._committed)" for d in dynamic]
        read = _READ_UNROLLED.format(
            checks=" and ".join(f"type({d}) is ArrayImpl" for d in dynamic) or "True",
            key=f"({prefix}{''.join(p + ', ' for p in pairs)})", general=general,
            shardings=", ".join(f"{d}._sharding" for d in dynamic))
    else:
        read = _READ_LOOP.format(dynamic=leaves, general=general,
                                 key=f"({prefix}*pairs)" if marked else "pairs")
    finish = (f"({leaves}, key, shardings)" if probe
              else f"self._hit(args, kwargs, {leaves}, key, shardings)")
    return _BINDER_TEMPLATE.format(unpack=unpack, read=read.rstrip("\n"), finish=finish)


def make_binder(split: Split, probe: bool = False) -> Callable[[Any, tuple, dict], Any]:
    """Compiles the binder of `split`: ``bind(pjit_function, args, kwargs)``.

    It builds the key of a call whose dynamic arguments are all jax.Arrays
    and hands it to the function's `_hit`; any other call goes to its
    `_general`. The binder holds no reference to the function.
    """
    scope = {"ArrayImpl": ArrayImpl, "shape": (LEAVES, split.key_shape)}
    source = binder_source(split, probe)
    # A file name under nbjit's directory: JAX's error messages skip its frames
    # (source_info_util), and linecache shows the source in tracebacks.
    filename = f"{_BINDER_DIR}/<binder {split.shape!r}{' probe' if probe else ''}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), scope)
    return scope["bind"]
