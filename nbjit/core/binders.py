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

Flavours: "plain" is the hit path; "timed" (while a `nbjit.profile()` is
active) adds clock stamps between the phases and times slow calls whole;
"traced" (calls made while a profiler session collects,
`nbjit.observe.spans`) opens a profiler span per phase; "key_only" keys a
call and returns ``(leaves, key, shardings)``, running nothing.
`binder_source(f, *args, **kwargs)` shows the source a call runs.

`BinderTable` is a function's shape -> binder dict: the dispatcher reads it
with a plain subscript (a `__missing__` hook would make every lookup slower).
A keyword call is looked up by its positional count alone, ``~nargs`` (no
tuple of names built per call); the binder found checks the names first.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable
from typing import Any

from nbjit import _jax
from nbjit.core.codegen import LINE_LENGTH, condition, fill, listed, run_source
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
from nbjit.observe import profile as _profile
from nbjit.observe import spans as _spans
from nbjit.observe import stats as _stats

__all__ = ["BinderTable", "Split", "binder_source", "call_shape", "make_binder"]

MAX_CALL_SHAPES = 256  # binders kept per function; the table starts afresh when full


# ---------------------------------------------------------------------------
# Templates
#
# `{via_slow}` and the like call a slow path: directly in the plain flavour,
# through `timed_call(self, t0, fn, ...)` in the timed one (which times it whole),
# through `leave_phase(span, fn, ...)` in the traced one (which closes the phase's span).

_HIT_TEMPLATE = """\
    context = trace_context()
    try:  # a static argument's __hash__ or __eq__ may raise: JAX reports it
        node = lookup(key)
    except Exception:
        return {via_slow}args, kwargs, "static_arg_error")
    while node is not None and (node.shardings != shardings or node.context != context):
        node = node.next
    if node is None or (record := node.record) is None or post_hook.value is not None:
        return {miss_call}
    node.shardings = shardings  # equal; keeping the newest makes identity checks hit
{stamp_lookup}    try:
        mark_recent(node)  # KeyError if another thread evicted it meanwhile
        inputs = leaves if record.leaves_are_inputs else record.prepare(leaves)
    except Exception:  # e.g. a transfer guard: JAX's own path says what is wrong
        return {via_slow}args, kwargs, "input_refused")
{stamp_inputs}    try:
        results = record.execute(inputs)
    except Exception as error:
        return {via_failed}error, args, kwargs, inputs)
{stamp_execute}    outs = consume(results, record.out_handlers)
    if record.fence is not None:  # resident host inputs: their slot is free once this is ready
        record.fence(inputs, outs)
    node.hits += 1
{finish}"""

_PLAIN_FINISH = "    return outs[0] if record.single_output else record.out_tree.unflatten(outs)\n"
_TIMED_FINISH = """\
    out = outs[0] if record.single_output else record.out_tree.unflatten(outs)
    record_hit(self, t0, t_key, t_lookup, t_inputs, t_execute, clock())
    return out
"""
_TRACED_FINISH = """\
    out = outs[0] if record.single_output else record.out_tree.unflatten(outs)
    span.__exit__(None, None, None)
    return out
"""
_FINISHES = {"plain": _PLAIN_FINISH, "timed": _TIMED_FINISH, "traced": _TRACED_FINISH}

# What a flavour runs first, and after each phase: key, lookup, inputs, execute.
_STARTS = {"timed": "    t0 = clock()\n", "traced": f"    span = phase({_spans.KEY!r})\n"}
_STAMPS = {
    "timed": tuple(f"    {t} = clock()\n" for t in ("t_key", "t_lookup", "t_inputs", "t_execute")),
    "traced": tuple(f"    span = next_phase(span, {name!r})\n" for name in (
        _spans.LOOKUP, _spans.INPUTS, _spans.EXECUTE, _spans.OUTPUTS)),
}
_NO_STAMPS = ("",) * 4

_BINDER_TEMPLATE = """\
def bind(self, args, kwargs):
{start}{unpack}{read}
{stamp_key}{tail}"""

# Up to UNROLL_MAX dynamic arguments, each in a local: all jax.Arrays; all
# leaves (host values among them: no flatten); else containers (pytrees).
_READ_UNROLLED = """\
    if {checks}:
        key = {key}
        shardings = {shardings}
        leaves = {leaves}
    elif {leaf_checks}:
        leaves = [{dynamic}]
        get = canonical_dtypes[x64.value].get
        try:
            signatures = ({signatures})
        except NoSignature:
            return {via_unkeyable}args, kwargs, leaves)
        shardings = [x._sharding for x in leaves if type(x) is ArrayImpl]
        key = {leaves_key}
    else:
        signatures = None
{sequence_read}{flattened}"""

# One dynamic argument that is a list or tuple (JAX's many-args case,
# ``f(xs)``; a tuple carry): its elements are the leaves when they are all
# jax.Arrays, and such a container of n leaves has one treedef per type and
# n, so the key needs no flatten. Otherwise `signatures` stays None and the
# call is flattened.
_READ_SEQUENCE = """\
        if (container := type({arg})) is list or container is tuple:
            leaves = {arg}
            try:  # one assignment each: a leaf that is not a jax.Array sets nothing
                if (keyer := sequence_keyers_get(len(leaves))) is not None:
                    signatures, shardings = keyer(leaves)
                else:
                    signatures, shardings = (tuple([(x.aval, x._committed) for x in leaves]),
                                             [x._sharding for x in leaves])
                key = {sequence_key}
            except (AttributeError, ValueError):  # not all jax.Arrays; resized meanwhile
                pass
"""

# More dynamic arguments than UNROLL_MAX: a loop over them.
_READ_LOOP = """\
    dynamic = {dynamic}
    signatures = None
    try:
        pairs, shardings = (tuple([(x.aval, x._committed) for x in dynamic]),
                            [x._sharding for x in dynamic])
        key = {key}
        leaves = dynamic
    except AttributeError:
{flattened}"""

# Dynamic arguments that are not all jax.Arrays (pytrees, host values), with
# `signatures` None: flatten them as JAX does and key the leaves. Leaves that
# are not all jax.Arrays are keyed one by one (`mixed_signatures`); a leaf
# nothing can key sends the call to `_unkeyable`: JAX's own path.
_READ_FLATTENED = """\
        if signatures is None:
            leaves, treedef = flatten({tree})
            try:  # node data whose __eq__ raises, met in another function's treedef
                tid = treedef_id(treedef)
            except Exception:
                return {via_slow}args, kwargs, "pytree_node_data")
{keyed_from_leaves}"""

# The general path of the unrolled form: the readers of the structures this
# call shape has seen first (`nbjit.core.structure`: exact-type guards, direct
# reads, no flatten), each returning ``(key, shardings, leaves)`` or None;
# if none reads the call, a flatten, and the reader of that structure is
# learned (or found) and keys it, so a structure is keyed by its reader
# whichever way the call came. A structure no reader reads (a leaf of
# another type: a tracer) is keyed from its leaves.
_READ_STRUCTURED = """\
        if signatures is None:
            for read in READERS:
                if (got := read({reader_args})) is not None:
                    break
            else:
                leaves, treedef = flatten({tree})
                try:  # node data whose __eq__ raises, met in another function's treedef
                    tid = treedef_id(treedef)
                except Exception:
                    return {via_slow}args, kwargs, "pytree_node_data")
                read = learn_reader(tid, treedef, leaves)
                got = None if read is None else read({reader_args})
            if got is UNKEYABLE:
                return {unkeyable_call}
            if got is not None:
                key, shardings, leaves = got
            else:
{keyed_from_leaves}"""

# Leaves no reader read, keyed one by one: all jax.Arrays in one pass; mixed
# with host values by the treedef's mixed keyer, else leaf by leaf
# (`mixed_signatures`); a leaf nothing can key sends the call to `_unkeyable`.
_KEYED_FROM_LEAVES = """\
            if not leaves or type(leaves[-1]) is ArrayImpl:  # else host values: skip this
                try:  # one assignment: a leaf with .aval, no ._sharding (a Ref) sets neither
                    signatures, shardings = (tuple([(x.aval, x._committed) for x in leaves]),
                                             [x._sharding for x in leaves])
                except AttributeError:
                    pass
            if signatures is None:
                if (keyer := mixed_keyers_get(tid)) is None or (mixed := keyer(leaves)) is None:
                    mixed = mixed_signatures(leaves)
                    if mixed is None:
                        return {via_unkeyable}args, kwargs, leaves)
                    if keyer is None:
                        learn_mixed_keyer(tid, leaves)
                signatures, shardings = mixed
            key = {leaves_key}
"""

_KEY_ONLY_FINISH = "    return (leaves, key, shardings)\n"


def _via(fn: str, flavour: str) -> str:
    """How generated code calls slow path `fn` (the prefix, up to its first argument)."""
    if flavour == "key_only":  # keys only: a call it cannot key runs nothing
        return "refuse(" if fn in ("self._unkeyable", "self._slow") else f"{fn}("
    if flavour == "traced":
        return f"leave_phase(span, {fn}, "
    return f"timed_call(self, t0, {fn}, " if flavour == "timed" else f"{fn}("


def _call(via: str, arguments: str, start: int, indent: int) -> str:
    """A slow path's call from column `start`, its arguments on a line of
    their own (at `indent`) if its first line would not fit."""
    if start + len(via) + len(arguments.split("\n", 1)[0]) <= LINE_LENGTH:
        return via + arguments
    return f"{via.rstrip()}\n{' ' * indent}{arguments}"


def _hit_source(flavour: str) -> str:
    _, stamp_lookup, stamp_inputs, stamp_execute = _STAMPS.get(flavour, _NO_STAMPS)
    return _HIT_TEMPLATE.format(
        via_slow=_via("self._slow", flavour), miss_call=_call(_via("self._miss_or_slow", flavour),
                        "args, kwargs, leaves, (key, shardings, context), node)", 15, 12),
        via_failed=_via("self._execute_failed", flavour),
        stamp_lookup=stamp_lookup, stamp_inputs=stamp_inputs, stamp_execute=stamp_execute,
        finish=_FINISHES[flavour])


def _names_guard(split: Split) -> str:
    """A keyword binder's first lines: the call's keywords are exactly its names.

    `PjitFunction.__call__` finds a keyword call's binder by its positional
    count alone (``~nargs``: no tuple of names built per call); a call with
    other names goes to the binder of its full call shape (`_other_keywords`).
    """
    if not split.names:
        return ""
    other_names = condition([f"len(kwargs) != {len(split.names)}",
                             *(f"{k!r} not in kwargs" for k in split.names)], " or", 7, " " * 8)
    return (f"    if {other_names}:\n"
            "        return other_keywords(self, args, kwargs)  # other names\n")


def _argument_names(split: Split, unroll: bool) -> tuple[list[str], dict[str, str], str]:
    """How a binder's source names each argument, and the lines that unpack them
    (after the keyword names' guard)."""
    guard = _names_guard(split)
    if not unroll:  # many arguments: index the few static ones, loop over the rest
        return ([f"args[{i}]" for i in range(split.nargs)],
                {k: f"kwargs[{k!r}]" for k in split.names}, guard)
    arg_names = [f"a{i}" for i in range(split.nargs)]  # every argument in a local of its own
    kw_names = {k: f"k{j}" for j, k in enumerate(split.names)}
    unpack = guard + (_unpack(arg_names, "args") if arg_names else "")
    if kw_names:  # by name: the guard passed, so each is there (in any order)
        reads = listed([f"kwargs[{k!r}]" for k in kw_names], "(", ")", True)
        targets = tuple_source(list(kw_names.values()))[1:-1]
        unpack += "    " + fill([f"{targets} = {reads[0]}", *reads[1:]], 4, " " * 8) + "\n"
    return arg_names, kw_names, unpack


def _unpack(names: list[str], source: str) -> str:
    """``    a0, a1 = source``; in parentheses over several lines if too long."""
    assigned = tuple_source(names)[1:-1]
    if 4 + len(assigned) + 3 + len(source) > LINE_LENGTH:
        assigned = fill(listed(names, "(", ")"), 4, " " * 8, reserve=3 + len(source))
    return f"    {assigned} = {source}\n"


def _dynamic_tree(split: Split, unroll: bool, arg_names: list[str],
                  kw_names: dict[str, str]) -> str:
    """The expression of the dynamic arguments as JAX flattens them:
    ``(positional, {name: value})``, or the positional tuple alone."""
    if unroll:  # filled to fit where the templates use it (flatten(...) from column 42)
        pieces = listed([arg_names[i] for i in split.dynamic_positions], "(", ")", True)
        if split.dynamic_names:
            named = listed([f"{k!r}: {kw_names[k]}" for k in split.dynamic_names], "{", "})")
            pieces = [*pieces[:-1], pieces[-1] + ",", *named]
            pieces[0] = "(" + pieces[0]
        return fill(pieces, 42, " " * 24, reserve=5)
    positional = ("tuple([args[i] for i in DYNAMIC_POSITIONS])" if split.static_positions
                  else "args")
    looped = "k: kwargs[k] for k in DYNAMIC_NAMES"
    return f"({positional}, {{{looped}}})" if split.dynamic_names else positional


def _source(split: Split, flavour: str = "plain") -> str:
    """The source of the binder for one call shape, in one flavour (see the
    module docstring)."""
    unroll = len(split.dynamic_positions) + len(split.dynamic_names) <= UNROLL_MAX
    arg_names, kw_names, unpack = _argument_names(split, unroll)
    dynamic = ([arg_names[i] for i in split.dynamic_positions]
               + [kw_names[k] for k in split.dynamic_names])
    statics = ([f"type({arg_names[i]}), {arg_names[i]}" for i in split.static_positions]
               + [f"{k!r}, type({kw_names[k]}), {kw_names[k]}" for k in split.static_names])
    marked = bool(split.names or statics)  # a plain positional call keys as bare pairs
    # The marker names the key shape, so the static items need no names: each
    # static argument is its exact type and itself (jax.jit's type + ==).
    prefix = (["SHAPE", *(f"type({x}), {x}" for x in _static_locals(split, arg_names, kw_names))]
              if marked else [])
    if not (marked or not dynamic):
        leaves = "args"
    elif unroll:
        leaves = f"[{', '.join(dynamic)}]"
    else:  # built once, from the static split
        leaves = ("[args[i] for i in DYNAMIC_POSITIONS]"
                  + (" + [kwargs[k] for k in DYNAMIC_NAMES]" if split.dynamic_names else ""))
    via_unkeyable = _via("self._unkeyable", flavour)
    tree = _dynamic_tree(split, unroll, arg_names, kw_names)
    keyed = _KEYED_FROM_LEAVES.format(  # indented by 4 below when unrolled
        leaves_key=_key("LEAVES", statics, "tid", 18, LINE_LENGTH - 4),
        via_unkeyable=via_unkeyable)
    if unroll:
        readers = _structure_readers(split)
        flattened = _READ_STRUCTURED.format(
            tree=tree, unkeyable_call=_call(via_unkeyable, f"args, kwargs, flatten({tree})[0])",
                                            23, 20),
            reader_args=fill(listed(readers.arguments, "", ""), 53, " " * 24, reserve=14),
            via_slow=_via("self._slow", flavour),
            keyed_from_leaves=textwrap.indent(keyed, "    "))
    else:
        flattened = _READ_FLATTENED.format(tree=tree, keyed_from_leaves=keyed,
                                           via_slow=_via("self._slow", flavour))
    if not dynamic:  # nothing to key but the static arguments
        key = fill(listed(prefix, "(", ")", True), 14, " " * 15)
        read = f"    key = {key}\n    shardings = []\n    leaves = {leaves}\n"
    elif unroll:
        read = _unrolled_read(dynamic, prefix, statics, leaves, via_unkeyable, flattened)
    else:
        key = fill(listed([*prefix, "*pairs"], "(", ")"), 14, " " * 15) if marked else "pairs"
        read = _READ_LOOP.format(dynamic=leaves, flattened=flattened, key=key)
    tail = _KEY_ONLY_FINISH if flavour == "key_only" else _hit_source(flavour)
    return _BINDER_TEMPLATE.format(
        start=_STARTS.get(flavour, ""), unpack=unpack, read=read.rstrip("\n"),
        stamp_key=_STAMPS.get(flavour, _NO_STAMPS)[0], tail=tail)


def _key(kind: str, statics: list[str], last: str, start: int, width: int = LINE_LENGTH
         ) -> str:
    """``(kind, KEY_SHAPE, (statics...), last, signatures)``, filled from column `start`."""
    static_key = listed([f"({s})" for s in statics], "(", "),", True)
    return fill([f"({kind},", "KEY_SHAPE,", *static_key, f"{last},", "signatures)"],
                start, " " * (start + 1), width=width)


def _unrolled_read(dynamic: list[str], prefix: list[str], statics: list[str], leaves: str,
                   via_unkeyable: str, flattened: str) -> str:
    """The key of up to UNROLL_MAX dynamic arguments in locals (`_READ_UNROLLED`)."""
    items, shardings = flat_reads(dynamic)
    sequence_read = "" if len(dynamic) != 1 else _READ_SEQUENCE.format(
        arg=dynamic[0], sequence_key=_key("SEQUENCE", statics, "container", 22))
    return _READ_UNROLLED.format(
        checks=condition([f"type({d}) is ArrayImpl" for d in dynamic], " and", 7, " " * 8),
        key=fill(listed(prefix + items, "(", ")", True), 14, " " * 15),
        shardings=fill(listed(shardings, "[", "]"), 20, " " * 21), leaves=leaves,
        leaf_checks=condition([f"type({d}) in LEAF_TYPES" for d in dynamic], " and", 9,
                              " " * 8),
        dynamic=", ".join(dynamic), leaves_key=_key("LEAVES", statics, "LEAVES_TREEDEF_ID", 14),
        via_unkeyable=via_unkeyable,
        signatures="".join(f"\n                {SIGNATURE.format(x=d, pad=' ' * 16)},"
                           for d in dynamic),
        sequence_read=sequence_read, flattened=flattened)


def _static_locals(split: Split, arg_names: list[str], kw_names: dict[str, str]) -> list[str]:
    """How a binder's source names the static arguments, positional then by name (sorted)."""
    return ([arg_names[i] for i in split.static_positions]
            + [kw_names[k] for k in split.static_names])


def _structure_readers(split: Split) -> Readers:
    """The pytree readers of an unrolled call shape (shared by its flavours):
    they read the dynamic arguments' locals and key the static ones first."""
    if split.readers is None:
        arg_names, kw_names, _ = _argument_names(split, True)
        statics = _static_locals(split, arg_names, kw_names)
        split.readers = Readers(
            [arg_names[i] for i in split.dynamic_positions]
            + [kw_names[k] for k in split.dynamic_names],
            form=split.key_shape, extra=statics,
            prefix=[item for x in statics for item in (f"type({x})", x)])
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
    source = _source(split, flavour)  # builds the call shape's readers when it reads pytrees
    scope = {**env, **SIGNATURE_SCOPE, "SHAPE": shape_marker(split.key_shape),
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


def _make_hit(env: dict[str, Any], timed: bool) -> Callable[..., Any]:
    """The hit path alone, ``hit(self, args, kwargs, leaves, key, shardings, t0, t_key)``:
    for a call keyed elsewhere (a miss another thread compiled meanwhile)."""
    source = ("def hit(self, args, kwargs, leaves, key, shardings, t0, t_key):\n"
              + _hit_source("timed" if timed else "plain"))
    return run_source(source, f"hit{' timed' if timed else ''}", dict(env))["hit"]


# ---------------------------------------------------------------------------
# One function's binders


class BinderTable(dict):
    """call shape -> binder of one function, built on first use (`build`).

    `env` is what the generated code reads besides its own constants (the
    namespace's lookup, the LRU's mark_recent, ...); `flavour` is "plain" or
    "timed"; `hit` is the hit path alone (see `_make_hit`).
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
            "timed_call": _timed_call, "clock": time.perf_counter_ns, "record_hit": _profile.record,
            "phase": _spans.phase, "next_phase": _spans.next_phase,
            "leave_phase": _spans.leave_phase, "other_keywords": _other_keywords,
        }
        self.spanned: dict[Any, Callable[[Any, tuple, dict], Any]] = {}  # the traced flavour's
        self.flavour = "plain"
        self.hit = _make_hit(self.env, False)
        if _profile.active():
            self.set_flavour("timed")

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
        self.flavour = flavour
        self.hit = _make_hit(self.env, flavour == "timed")
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
        traced flavour (a span per phase), or the timed one while a
        `nbjit.profile()` needs every hit's clock stamps."""
        if self.flavour == "timed":
            return self.get(shape) or self.build(shape)
        binder = self.spanned.get(shape)
        if binder is None:
            binder = make_binder(self.split(shape), self.env, "traced")
            if len(self.spanned) >= MAX_CALL_SHAPES:
                self.spanned.clear()
            self.spanned[shape] = binder
        return binder

    def key_only(self, shape: Any) -> Callable[[Any, tuple, dict], Any]:
        """A binder that keys a call and returns ``(leaves, key, shardings)``."""
        return make_binder(self.split(shape), self.env, "key_only")

    def source(self, shape: Any, flavour: str | None = None) -> str:
        return _source(self.split(shape), flavour or self.flavour)


def _other_keywords(jitted: Any, args: tuple, kwargs: dict) -> Any:
    """A keyword call whose names are not those of the binder its positional
    count found: the binder of its full call shape runs it."""
    shape = call_shape(args, kwargs)
    binders = jitted._binders
    binder = binders.get(shape) or binders.build(shape)
    return binder(jitted, args, kwargs)


def binder_source(jitted: Any, /, *args: Any, **kwargs: Any) -> str:
    """The source of the binder a call ``jitted(*args, **kwargs)`` runs: the
    hit path of that call shape (timed while a profile is active). Calls nothing.

        f = nbjit.jit(lambda x, y: x + y)
        print(nbjit.binder_source(f, x, y))
    """
    return jitted._binders.source(call_shape(args, kwargs))


# ---------------------------------------------------------------------------
# The timed flavour (while a `nbjit.profile()` is active; nbjit/_profile.py)


def _timed_call(jitted: Any, t0: int, fn: Callable, /, *args: Any) -> Any:
    """A slow or miss call under a profile: run it, record it whole."""
    misses = jitted._counters.misses
    try:
        return fn(*args)
    finally:
        kind = "miss" if jitted._counters.misses != misses else "slow"
        _profile.record_whole(jitted, kind, time.perf_counter_ns() - t0)


def _set_timed(on: bool) -> None:
    """Every live function's binders become the timed flavour (on) or plain again (off).

    Called when the first profile starts and the last ends: outside a
    profile the hit path has no clock reads.
    """
    for jitted in _stats.live_functions():
        jitted._binders.set_flavour("timed" if on else "plain")


_profile.on_switch(_set_timed)
