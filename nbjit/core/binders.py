"""The hit path: one generated *binder* per call shape of a function.

A call goes ``PjitFunction.__call__`` -> the binder of its call shape. A
*call shape* is the count of positional arguments and the keyword names in
order: ``n`` for a positional call, ``(n, *names)`` with keywords. Each
function builds, once per call shape, a binder (as Triton's `JITFunction`
does): a small generated function that reads exactly the attributes that
shape needs, keys the call (`nbjit.core.keys`), finds the node and runs it:

    key -> lookup -> inputs -> execute -> outputs

A binder keys a call one of four ways, chosen by the dynamic arguments'
types on each call: all `jax.Array`s (the common case): read one by one;
all leaves with host values among them (numpy arrays and scalars, Python
scalars): keyed as they are; one list or tuple of `jax.Array`s (``f(xs)``):
its elements read one by one; anything else (pytrees): by the *reader* of
its structure (`nbjit.core.structure`: exact-type guards, direct reads, one
key tuple; learned on a structure's first call), and only where no reader
reads it (a tracer leaf, more than UNROLL_MAX dynamic arguments) flattened
as JAX does, then the leaves keyed. A leaf nothing can key (a tracer, a
jax.Ref, an object) sends the call to the function's `_unkeyable` (JAX's
own path); a miss or a signature without a fast path to its `_miss_or_slow`.

Flavours (`nbjit.core.flavours`: this module imports nothing of the rooms
that register them): "plain" is the hit path; "timed" (registered by
`nbjit.observe.profile`, while a `nbjit.profile()` is active) adds clock
stamps between the phases and times slow calls whole; "traced" (registered by
`nbjit.observe.spans`, for calls made while a profiler session collects)
opens a profiler span per phase; "key_only" keys a call and returns
``(leaves, key, shardings)``, running nothing. One emitter (`_source`) writes
every flavour: a flavour only adds its lines at the hit path's phases.
`binder_source(f, *args, **kwargs)` shows the source a call runs.

`BinderTable` is a function's shape -> binder dict: the dispatcher reads it
with a plain subscript (a `__missing__` hook would make every lookup slower).
A keyword call is looked up by its positional count alone, ``~nargs`` (no
tuple of names built per call); the binder found checks the names first.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from nbjit import _jax
from nbjit.core import flavours as _flavours
from nbjit.core.codegen import run_source
from nbjit.core.flavours import Flavour
from nbjit.core.keys import (
    LEAF_TYPES,
    LEAVES,
    SEQUENCE,
    SEQUENCE_KEYERS,
    SIGNATURE,
    SIGNATURE_SCOPE,
    UNROLL_MAX,
    flat_reads,
    learn_mixed_keyer,
    mixed_keyers,
    mixed_signatures,
    treedef_id,
    tuple_source,
)
from nbjit.core.shapes import Split, call_shape, shape_marker
from nbjit.core.structure import UNKEYABLE, Readers
from nbjit.core.view import info

__all__ = ["BinderTable", "Split", "binder_source", "call_shape", "make_binder"]

MAX_CALL_SHAPES = 256  # binders kept per function; the table starts afresh when full


# ---------------------------------------------------------------------------
# The emitter: one call shape and one flavour -> the binder's source
#
# `_source` is the one place a call shape becomes source. It writes the
# keying of the call (`_read`) and then the hit path (`_hit`), into which the
# flavour (`nbjit.core.flavours.Flavour`) puts its own lines: the same hit
# path serves every flavour. Nested blocks are indented with `_indent`;
# nothing else is laid out (a generated line may be as long as it is).


# The signatures and shardings of `{xs}` when they are all jax.Arrays (one
# assignment: an element that is not sets neither).
_ARRAY_SIGNATURES = ("(tuple([(x.aval, x._committed) for x in {xs}]),"
                     " [x._sharding for x in {xs}])")


def _indent(block: str, depth: int = 1) -> str:
    return textwrap.indent(block, "    " * depth)


def _leave(flavour: Flavour, fn: str, args: str) -> str:
    """How the flavour's code calls slow path `fn` with `args` (source)."""
    return flavour.leave.format(fn=fn, args=args)


def _hit(flavour: Flavour) -> str:
    """The hit path, once the call is keyed (`key`, `shardings`, `leaves`):
    lookup -> inputs -> execute -> outputs, with the flavour's lines."""
    _, stamp_lookup, stamp_inputs, stamp_execute = flavour.stamps
    result = "outs[0] if record.single_output else record.out_tree.unflatten(outs)"
    finish = (f"    return {result}\n" if not flavour.finish
              else f"    out = {result}\n{flavour.finish}    return out\n")
    miss = "args, kwargs, leaves, (key, shardings, context), node"
    return f"""\
    context = trace_context()
    try:  # a static argument's __hash__ or __eq__ may raise: JAX reports it
        node = lookup(key)
    except Exception:
        return {_leave(flavour, "self._slow", 'args, kwargs, "static_arg_error"')}
    while node is not None and (node.shardings != shardings or node.context != context):
        node = node.next
    if node is None or (record := node.record) is None or post_hook.value is not None:
        return {_leave(flavour, "self._miss_or_slow", miss)}
    node.shardings = shardings  # equal; keeping the newest makes identity checks hit
{stamp_lookup}    try:
        mark_recent(node)  # KeyError if another thread evicted it meanwhile
        inputs = leaves if record.leaves_are_inputs else record.prepare(leaves)
    except Exception:  # e.g. a transfer guard: JAX's own path says what is wrong
        return {_leave(flavour, "self._slow", 'args, kwargs, "input_refused"')}
{stamp_inputs}    try:
        results = record.execute(inputs)
    except Exception as error:
        return {_leave(flavour, "self._execute_failed", "error, args, kwargs, inputs")}
{stamp_execute}    outs = consume(results, record.out_handlers)
    if record.fence is not None:  # resident host inputs: their slot is free once this is ready
        record.fence(inputs, outs)
    node.hits += 1
{finish}"""


class _Names:
    """How one call shape's source names its arguments: every argument in a
    local of its own when unrolled (``a0``, ``k0``), else read from `args`
    and `kwargs` (many arguments: the dynamic ones are looped over)."""

    def __init__(self, split: Split) -> None:
        self.unroll = len(split.dynamic_positions) + len(split.dynamic_names) <= UNROLL_MAX
        if self.unroll:
            self.args = [f"a{i}" for i in range(split.nargs)]
            self.kwargs = {k: f"k{j}" for j, k in enumerate(split.names)}
        else:
            self.args = [f"args[{i}]" for i in range(split.nargs)]
            self.kwargs = {k: f"kwargs[{k!r}]" for k in split.names}
        self.dynamic = ([self.args[i] for i in split.dynamic_positions]
                        + [self.kwargs[k] for k in split.dynamic_names])
        self.statics = ([self.args[i] for i in split.static_positions]
                        + [self.kwargs[k] for k in split.static_names])
        # The static part of the leaves and sequence keys: each static
        # argument its exact type and itself (jax.jit's type + ==), by name
        # when it is a keyword.
        self.static_key = tuple_source(
            [f"(type({self.args[i]}), {self.args[i]})" for i in split.static_positions]
            + [f"({k!r}, type({self.kwargs[k]}), {self.kwargs[k]})" for k in split.static_names])


def _unpack(split: Split, names: _Names) -> str:
    """A binder's first lines: a keyword binder checks the call's names are
    exactly its own, and an unrolled one puts every argument in its local.

    `PjitFunction.__call__` finds a keyword call's binder by its positional
    count alone (``~nargs``: no tuple of names built per call); a call with
    other names goes to the binder of its full call shape (`other_keywords`).
    """
    other = "        return other_keywords(self, args, kwargs)  # other names\n"
    lines = ""
    if split.names and names.unroll:  # each name read once; a missing one raises KeyError
        reads = "".join(f"        {names.kwargs[k]} = kwargs[{k!r}]\n" for k in split.names)
        lines += (f"    if len(kwargs) != {len(split.names)}:\n{other}"
                  f"    try:\n{reads}    except KeyError:\n{other}")
    elif split.names:
        missing = " or ".join(f"{k!r} not in kwargs" for k in split.names)
        lines += f"    if len(kwargs) != {len(split.names)} or {missing}:\n{other}"
    if names.unroll and split.nargs:
        lines += f"    {tuple_source(names.args)[1:-1]} = args\n"
    return lines


def _tree(split: Split, names: _Names) -> str:
    """The dynamic arguments as JAX flattens them: ``(positional, {name:
    value})``, or the positional tuple alone."""
    if names.unroll:
        positional = tuple_source([names.args[i] for i in split.dynamic_positions])
        named = ", ".join(f"{k!r}: {names.kwargs[k]}" for k in split.dynamic_names)
    else:
        positional = ("tuple([args[i] for i in DYNAMIC_POSITIONS])" if split.static_positions
                      else "args")
        named = "k: kwargs[k] for k in DYNAMIC_NAMES"
    return f"({positional}, {{{named}}})" if split.dynamic_names else positional


def _keyed_from_leaves(flavour: Flavour, names: _Names) -> str:
    """Leaves no reader read (`tid` their treedef's id), keyed one by one: all
    jax.Arrays in one pass; mixed with host values by the treedef's mixed
    keyer, else leaf by leaf (`mixed_signatures`); a leaf nothing can key
    sends the call to `_unkeyable`: JAX's own path."""
    unkeyable = _leave(flavour, "self._unkeyable", "args, kwargs, leaves")
    return f"""\
if not leaves or type(leaves[-1]) is ArrayImpl:  # else host values: skip this
    try:  # one assignment: a leaf with .aval, no ._sharding (a Ref) sets neither
        signatures, shardings = {_ARRAY_SIGNATURES.format(xs="leaves")}
    except AttributeError:
        pass
if signatures is None:
    if (keyer := mixed_keyers_get(tid)) is None or (mixed := keyer(leaves)) is None:
        mixed = mixed_signatures(leaves)
        if mixed is None:
            return {unkeyable}
        if keyer is None:
            learn_mixed_keyer(tid, leaves)
    signatures, shardings = mixed
key = (LEAVES, KEY_SHAPE, {names.static_key}, tid, signatures)
"""


def _flattened(split: Split, flavour: Flavour, names: _Names) -> str:
    """Dynamic arguments with no signatures yet (pytrees, host values).

    Unrolled: the readers of the structures this call shape has seen first
    (`nbjit.core.structure`: exact-type guards, direct reads, no flatten),
    each returning ``(key, shardings, leaves)`` or None; if none reads the
    call, a flatten, and the reader of that structure is learned (or found)
    and keys it, so a structure is keyed by its reader whichever way the call
    came. A structure no reader reads (a leaf of another type: a tracer) and
    a call with more than UNROLL_MAX dynamic arguments are flattened as JAX
    does and keyed from their leaves."""
    tree = _tree(split, names)
    pytree_node_data = _leave(flavour, "self._slow", 'args, kwargs, "pytree_node_data"')
    flatten = f"""\
leaves, treedef = flatten({tree})
try:  # node data whose __eq__ raises, met in another function's treedef
    tid = treedef_id(treedef)
except Exception:
    return {pytree_node_data}
"""
    if not names.unroll:
        return flatten + _keyed_from_leaves(flavour, names)
    reader_args = ", ".join(_structure_readers(split).arguments)
    unkeyable = _leave(flavour, "self._unkeyable", f"args, kwargs, flatten({tree})[0]")
    return f"""\
for read in READERS:
    if (got := read({reader_args})) is not None:
        break
else:
{_indent(flatten)}    read = learn_reader(tid, treedef, leaves)
    got = None if read is None else read({reader_args})
if got is UNKEYABLE:
    return {unkeyable}
if got is not None:
    key, shardings, leaves = got
else:
{_indent(_keyed_from_leaves(flavour, names))}"""


def _read(split: Split, flavour: Flavour, names: _Names) -> str:
    """The lines that key the call: `key`, `shardings` and `leaves` (see the
    module docstring for the forms)."""
    dynamic = names.dynamic
    # A plain positional call keys as bare signatures; any other starts with
    # the key shape's marker, which names the shape, so the static items need
    # no names: each static argument is its exact type and itself.
    marked = bool(split.names or names.statics)
    prefix = (["SHAPE", *(f"type({x}), {x}" for x in names.statics)] if marked else [])
    if not (marked or not dynamic):
        leaves = "args"
    elif names.unroll:
        leaves = f"[{', '.join(dynamic)}]"
    else:  # built once, from the static split
        leaves = ("[args[i] for i in DYNAMIC_POSITIONS]"
                  + (" + [kwargs[k] for k in DYNAMIC_NAMES]" if split.dynamic_names else ""))
    if not dynamic:  # nothing to key but the static arguments
        return f"    key = {tuple_source(prefix)}\n    shardings = []\n    leaves = {leaves}\n"
    flattened = _flattened(split, flavour, names)
    if not names.unroll:  # more dynamic arguments than UNROLL_MAX: a loop over them
        key = f"({', '.join(prefix)}, *pairs)" if marked else "pairs"
        return f"""\
    dynamic = {leaves}
    signatures = None
    try:
        pairs, shardings = {_ARRAY_SIGNATURES.format(xs="dynamic")}
        key = {key}
        leaves = dynamic
    except AttributeError:
{_indent(flattened, 2)}"""
    return _unrolled(split, flavour, names, prefix, leaves, flattened)


def _unrolled(split: Split, flavour: Flavour, names: _Names, prefix: list[str], leaves: str,
              flattened: str) -> str:
    """The key of up to UNROLL_MAX dynamic arguments, each in a local: all
    jax.Arrays; all leaves (host values among them: no flatten); else
    containers (pytrees), `flattened`."""
    dynamic = names.dynamic
    items, shardings = flat_reads(dynamic)
    signatures = tuple_source([SIGNATURE.format(x=d) for d in dynamic])
    unkeyable = _leave(flavour, "self._unkeyable", "args, kwargs, leaves")
    read = f"""\
    if {" and ".join(f"type({d}) is ArrayImpl" for d in dynamic)}:
        key = {tuple_source(prefix + items)}
        shardings = [{", ".join(shardings)}]
        leaves = {leaves}
    elif {" and ".join(f"type({d}) in LEAF_TYPES" for d in dynamic)}:
        leaves = [{", ".join(dynamic)}]
        get = canonical_dtypes[x64.value].get
        try:
            signatures = {signatures}
        except NoSignature:
            return {unkeyable}
        shardings = [x._sharding for x in leaves if type(x) is ArrayImpl]
        key = (LEAVES, KEY_SHAPE, {names.static_key}, LEAVES_TREEDEF_ID, signatures)
    else:
        signatures = None
"""
    if len(dynamic) == 1:
        # One dynamic argument that is a list or tuple (JAX's many-args case,
        # ``f(xs)``; a tuple carry): its elements are the leaves when they are
        # all jax.Arrays, and such a container of n leaves has one treedef per
        # type and n, so the key needs no flatten. Otherwise `signatures`
        # stays None and the call is flattened.
        read += f"""\
        if (container := type({dynamic[0]})) is list or container is tuple:
            leaves = {dynamic[0]}
            try:  # one assignment each: a leaf that is not a jax.Array sets nothing
                if (keyer := sequence_keyers_get(len(leaves))) is not None:
                    signatures, shardings = keyer(leaves)
                else:
                    signatures, shardings = {_ARRAY_SIGNATURES.format(xs="leaves")}
                key = (SEQUENCE, KEY_SHAPE, {names.static_key}, container, signatures)
            except (AttributeError, ValueError):  # not all jax.Arrays; resized meanwhile
                pass
"""
    return read + f"        if signatures is None:\n{_indent(flattened, 3)}"


def _source(split: Split, flavour: Flavour) -> str:
    """The source of the binder of one call shape in one flavour: the call's
    arguments unpacked, keyed, then the hit path (or, keys only, the key)."""
    names = _Names(split)
    tail = ("    return (leaves, key, shardings)\n" if flavour.keys_only
            else flavour.stamps[0] + _hit(flavour))
    return (f"def bind(self, args, kwargs):\n{flavour.start}{_unpack(split, names)}"
            f"{_read(split, flavour, names)}{tail}")


def _structure_readers(split: Split) -> Readers:
    """The pytree readers of an unrolled call shape (shared by its flavours):
    they read the dynamic arguments' locals and key the static ones first."""
    if split.readers is None:
        names = _Names(split)
        split.readers = Readers(
            names.dynamic, form=split.key_shape, extra=names.statics,
            prefix=[item for x in names.statics for item in (f"type({x})", x)])
    return split.readers


def _param_trees(treedef: Any, named: bool) -> list[Any]:
    """The treedefs of each dynamic argument in a binder's flattened tree,
    ``(positional, {name: value})`` when `named`, else the positional tuple."""
    if not named:
        return treedef.children()
    positional, by_name = treedef.children()
    return positional.children() + by_name.children()


def make_binder(split: Split, env: dict[str, Any], flavour: str = "plain"
                ) -> Callable[[Any, tuple, dict], Any]:
    """Compiles the binder of `split`: ``bind(pjit_function, args, kwargs)``.

    `env` holds the names the source reads (`BinderTable.env`); the binder
    holds no reference to the function itself.
    """
    f = _flavours.flavour(flavour)
    source = _source(split, f)  # builds the call shape's readers when it reads pytrees
    scope = {**env, **f.scope, **SIGNATURE_SCOPE, "SHAPE": shape_marker(split.key_shape),
             "DYNAMIC_POSITIONS": split.dynamic_positions, "DYNAMIC_NAMES": split.dynamic_names,
             "LEAVES": LEAVES, "SEQUENCE": SEQUENCE, "KEY_SHAPE": split.key_shape,
             "flatten": _jax.flatten_for_dispatch,
             "treedef_id": treedef_id,
             "mixed_signatures": mixed_signatures, "LEAF_TYPES": LEAF_TYPES,
             "mixed_keyers_get": mixed_keyers.get, "learn_mixed_keyer": learn_mixed_keyer,
             "sequence_keyers_get": SEQUENCE_KEYERS.get,
             "LEAVES_TREEDEF_ID": split.leaves_treedef_id(), "refuse": _refuse,
             "UNKEYABLE": UNKEYABLE}
    if split.readers is not None:
        readers, named = split.readers, bool(split.dynamic_names)
        scope["READERS"] = readers.tried
        scope["learn_reader"] = lambda tid, treedef, leaves: readers.learn(
            tid, _param_trees(treedef, named), leaves)
    name = f"binder {split.shape!r}{'' if flavour == 'plain' else ' ' + flavour}"
    return run_source(source, name, scope)["bind"]


def _refuse(*_: Any) -> str:
    """What a key-only binder returns for a call it cannot key."""
    return "unkeyable"


def _hit_source(flavour: str) -> str:
    """The source of the hit path alone (`BinderTable.hit`)."""
    return ("def hit(self, args, kwargs, leaves, key, shardings, t0, t_key):\n"
            + _hit(_flavours.flavour(flavour)))


def _make_hit(env: dict[str, Any], flavour: str) -> Callable[..., Any]:
    """The hit path alone, ``hit(self, args, kwargs, leaves, key, shardings, t0, t_key)``:
    for a call keyed elsewhere (a miss another thread compiled meanwhile,
    filter_jit's reader keys); `t0` and `t_key` are the timed flavour's first
    stamps."""
    scope = {**env, **_flavours.flavour(flavour).scope}
    name = "hit" if flavour == "plain" else f"hit {flavour}"
    return run_source(_hit_source(flavour), name, scope)["hit"]


# ---------------------------------------------------------------------------
# One function's binders


class BinderTable(dict):
    """call shape -> binder of one function, built on first use (`build`).

    `env` is what the generated code reads besides its own constants and its
    flavour's names (the namespace's lookup, the LRU's mark_recent, ...);
    `flavour` is the flavour its binders are built in, "plain" unless
    switched (`nbjit.core.flavours.use_flavour`: "timed" while a profile is
    active); `hit` is the hit path alone in that flavour (see `_make_hit`).
    """

    def __init__(self, namespace: Any, static_argnums: tuple[int, ...],
                 static_argnames: frozenset[str]) -> None:
        super().__init__()
        self.static_argnums = static_argnums
        self.static_argnames = static_argnames
        self.splits: dict[Any, Split] = {}
        self.env = {
            "lookup": namespace.entries.get,  # the dict is never replaced
            "mark_recent": namespace.cache.mark_recent,
            "trace_context": _jax.trace_context, "post_hook": _jax.post_hook_state,
            "consume": _jax.ExecuteResults.consume_with_handlers,
            "other_keywords": _other_keywords,
        }
        self.spanned: dict[Any, Callable[[Any, tuple, dict], Any]] = {}  # the traced flavour's
        self.keyers: dict[Any, Callable[[Any, tuple, dict], Any]] = {}  # the key-only flavour's
        self.flavour = "plain"
        self.hit = _make_hit(self.env, "plain")
        flavour = _flavours.watch_table(self)
        if flavour != "plain":
            self.set_flavour(flavour)

    def split(self, shape: Any) -> Split:
        split = self.splits.get(shape)
        if split is None:
            split = Split(shape, self.static_argnums, self.static_argnames)
            if len(self.splits) >= MAX_CALL_SHAPES:
                self.splits.clear()
            self.splits[shape] = split
        return split

    def set_flavour(self, flavour: str) -> None:
        """"plain" or "timed" (profiling): binders are rebuilt in that flavour on next use."""
        self.hit = _make_hit(self.env, flavour)
        self.flavour = flavour
        self.clear()

    def build(self, shape: Any) -> Callable[[Any, tuple, dict], Any]:
        """The binder of call shape `shape`; a keyword shape's binder also
        serves its positional count (``~nargs``, `PjitFunction.__call__`'s
        lookup) unless another set of names got there first."""
        binder = make_binder(self.split(shape), self.env, self.flavour)
        if len(self) + 2 > MAX_CALL_SHAPES:  # room for the shape and its positional count
            self.clear()
        self[shape] = binder
        if type(shape) is tuple:
            self.setdefault(~shape[0], binder)
        return binder

    def traced(self, shape: Any) -> Callable[[Any, tuple, dict], Any]:
        """The binder for a call made while a profiler session collects: the
        traced flavour (a span per phase), or the table's own flavour while
        it is not plain (a `nbjit.profile()` needs every hit's clock stamps)."""
        if self.flavour != "plain":
            return self.get(shape) or self.build(shape)
        return self._kept(self.spanned, shape, "traced")

    def key_only(self, shape: Any) -> Callable[[Any, tuple, dict], Any]:
        """A binder that keys a call and returns ``(leaves, key, shardings)``
        (made once per call shape: building a binder's source costs far more
        than running it)."""
        return self._kept(self.keyers, shape, "key_only")

    def _kept(self, kept: dict, shape: Any, flavour: str) -> Callable[[Any, tuple, dict], Any]:
        """The binder of `shape` in `flavour`, made once and kept in `kept`."""
        binder = kept.get(shape)
        if binder is None:
            binder = make_binder(self.split(shape), self.env, flavour)
            if len(kept) >= MAX_CALL_SHAPES:
                kept.clear()
            kept[shape] = binder
        return binder

    def source(self, shape: Any, flavour: str | None = None) -> str:
        return _source(self.split(shape), _flavours.flavour(flavour or self.flavour))


def _other_keywords(jitted: Any, args: tuple, kwargs: dict) -> Any:
    """A keyword call whose names are not those of the binder its positional
    count found: the binder of its full call shape runs it."""
    shape = call_shape(args, kwargs)
    binders = info(jitted).binders
    binder = binders.get(shape) or binders.build(shape)
    return binder(jitted, args, kwargs)


def binder_source(jitted: Any, /, *args: Any, **kwargs: Any) -> str:
    """The source of the binder a call ``jitted(*args, **kwargs)`` runs: the
    hit path of that call shape (timed while a profile is active). Calls nothing.

        f = nbjit.jit(lambda x, y: x + y)
        print(nbjit.binder_source(f, x, y))
    """
    return info(jitted).binders.source(call_shape(args, kwargs))
