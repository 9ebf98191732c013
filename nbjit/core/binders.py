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
stamps between the phases, its first and last taken by
`PjitFunction.__call__` as the call enters and as the binder has returned
(its binders take them as `stamps`), and times slow calls whole; "traced"
(registered by
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

from collections.abc import Callable
from typing import Any

from nbjit import _jax
from nbjit.core import flavours as _flavours
from nbjit.core.codegen import Source, run_source
from nbjit.core.flavours import Flavour
from nbjit.core.inputs.launch import LaunchRefused
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
# flavour (`nbjit.core.flavours.Flavour`) puts its own statements: the same
# hit path serves every flavour. Each part adds its statements to a
# `nbjit.core.codegen.Source`, which lays out the blocks; nothing else is
# laid out (a generated line may be as long as it is).


# The signatures and shardings of `{xs}` when they are all jax.Arrays (one
# assignment: an element that is not sets neither).
_ARRAY_SIGNATURES = ("(tuple([(x.aval, x._committed) for x in {xs}]),"
                     " [x._sharding for x in {xs}])")


def _return(src: Source, flavour: Flavour, fn: str, args: str) -> None:
    """The statement leaving for slow path `fn` with `args`, as the flavour calls it."""
    src.line(f"return {flavour.leave.format(fn=fn, args=args)}")


def _stamp(src: Source, statement: str) -> None:
    """A flavour's statement ("" for none) at this point of the hit path."""
    if statement:
        src.line(statement)


def _hit(src: Source, flavour: Flavour) -> None:
    """The hit path, once the call is keyed (`key`, `shardings`, `leaves`):
    lookup -> inputs -> execute -> outputs, with the flavour's statements."""
    stamp_lookup = flavour.stamps[1]
    src.line("context = trace_context()")
    with src.block("try:  # a static argument's __hash__ or __eq__ may raise: JAX reports it"):
        src.line("node = lookup(key)")
    with src.block("except Exception:"):
        _return(src, flavour, "self._slow", 'args, kwargs, "static_arg_error"')
    with src.block("while node is not None and (node.shardings != shardings"
                   " or node.context != context):"):
        src.line("node = node.next")
    with src.block("if node is None or (record := node.record) is None"
                   " or post_hook.value is not None:"):
        _return(src, flavour, "self._miss_or_slow",
                "args, kwargs, leaves, (key, shardings, context), node")
    src.line("node.shardings = shardings  # equal; keeping the newest makes identity checks hit")
    _stamp(src, stamp_lookup)
    with src.block("if (launch := record.launch) is not None:"
                   "  # host leaves put by jaxlib's own put (an accelerator)"):
        _inputs_then_run(src, flavour, "staged = record.stage(leaves)",
                         "launched = launch(*staged)", "LaunchRefused as refused",
                         "refused, args, kwargs", "self._launch_refused")
        src.line("node.hits += 1")
        _stamp(src, flavour.finish)
        src.line("return launched")
    _inputs_then_run(src, flavour,
                     "inputs = leaves if record.leaves_are_inputs else record.prepare(leaves)",
                     "results = record.execute(inputs)", "Exception as error",
                     "error, args, kwargs, inputs")
    src.line("outs = consume(results, record.out_handlers)")
    with src.block("if record.fence is not None:  # resident host inputs: their slot is free"
                   " once this is ready"):
        src.line("record.fence(inputs, outs)")
    src.line("node.hits += 1")
    result = "outs[0] if record.single_output else record.out_tree.unflatten(outs)"
    if not flavour.finish:
        src.line(f"return {result}")
    else:
        src.lines([f"out = {result}", flavour.finish, "return out"])


def _inputs_then_run(src: Source, flavour: Flavour, inputs: str, run: str, refused: str,
                     refused_args: str, refused_fn: str = "self._execute_failed") -> None:
    """The node marked recent and the `inputs` statement (JAX's own path
    where it raises: a transfer guard, say), then the `run` statement (the
    `refused` exception goes to `refused_fn`, by default where a refused
    execution goes), each phase stamped: a record's own inputs and execute,
    or a launch record's staged leaves and launch (`nbjit.core.inputs.launch`)."""
    _, _, stamp_inputs, stamp_execute = flavour.stamps
    with src.block("try:"):
        src.line("mark_recent(node)  # KeyError if another thread evicted it meanwhile")
        src.line(inputs)
    with src.block("except Exception:  # e.g. a transfer guard: JAX's own path says what is wrong"):
        _return(src, flavour, "self._slow", 'args, kwargs, "input_refused"')
    _stamp(src, stamp_inputs)
    with src.block("try:"):
        src.line(run)
    with src.block(f"except {refused}:"):
        _return(src, flavour, refused_fn, refused_args)
    _stamp(src, stamp_execute)


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


def _unpack(src: Source, split: Split, names: _Names, flavour: Flavour) -> None:
    """A binder's first statements: a keyword binder checks the call's names
    are exactly its own, and an unrolled one puts every argument in its local.

    `PjitFunction.__call__` finds a keyword call's binder by its positional
    count alone (``~nargs``: no tuple of names built per call); a call with
    other names goes to the binder of its full call shape (`other_keywords`).
    """
    other = ("return other_keywords(self, args, kwargs, stamps)  # other names"
             if flavour.entry_stamp else "return other_keywords(self, args, kwargs)  # other names")
    if split.names and names.unroll:  # each name read once; a missing one raises KeyError
        with src.block(f"if len(kwargs) != {len(split.names)}:"):
            src.line(other)
        with src.block("try:"):
            src.lines(f"{names.kwargs[k]} = kwargs[{k!r}]" for k in split.names)
        with src.block("except KeyError:"):
            src.line(other)
    elif split.names:
        missing = " or ".join(f"{k!r} not in kwargs" for k in split.names)
        with src.block(f"if len(kwargs) != {len(split.names)} or {missing}:"):
            src.line(other)
    if names.unroll and split.nargs:
        src.line(f"{tuple_source(names.args)[1:-1]} = args")


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


def _keyed_from_leaves(src: Source, flavour: Flavour, names: _Names) -> None:
    """Leaves no reader read (`tid` their treedef's id), keyed one by one: all
    jax.Arrays in one pass; mixed with host values by the treedef's mixed
    keyer, else leaf by leaf (`mixed_signatures`); a leaf nothing can key
    sends the call to `_unkeyable`: JAX's own path. `signatures` is None
    when this starts."""
    with src.block("if not leaves or type(leaves[-1]) is ArrayImpl:"
                   "  # else host values: skip this"):
        with src.block("try:  # one assignment: a leaf with .aval, no ._sharding (a Ref) sets"
                       " neither"):
            src.line(f"signatures, shardings = {_ARRAY_SIGNATURES.format(xs='leaves')}")
        with src.block("except AttributeError:"):
            src.line("pass")
    with src.block("if signatures is None:"):
        with src.block("if (keyer := mixed_keyers_get(tid)) is None"
                       " or (mixed := keyer(leaves)) is None:"):
            src.line("mixed = mixed_signatures(leaves)")
            with src.block("if mixed is None:"):
                _return(src, flavour, "self._unkeyable", "args, kwargs, leaves")
            with src.block("if keyer is None:"):
                src.line("learn_mixed_keyer(tid, leaves)")
        src.line("signatures, shardings = mixed")
    src.line(f"key = (LEAVES, KEY_SHAPE, {names.static_key}, tid, signatures)")


def _flattened(src: Source, split: Split, flavour: Flavour, names: _Names) -> None:
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

    def flatten() -> None:
        src.line(f"leaves, treedef = flatten({tree})")
        with src.block("try:  # node data whose __eq__ raises, met in another function's treedef"):
            src.line("tid = treedef_id(treedef)")
        with src.block("except Exception:"):
            _return(src, flavour, "self._slow", 'args, kwargs, "pytree_node_data"')

    if not names.unroll:
        flatten()
        _keyed_from_leaves(src, flavour, names)
        return
    reader_args = ", ".join(_structure_readers(split).arguments)
    with src.block("for read in READERS:"):
        with src.block(f"if (got := read({reader_args})) is not None:"):
            src.line("break")
    with src.block("else:"):
        flatten()
        src.line("read = learn_reader(tid, treedef, leaves)")
        src.line(f"got = None if read is None else read({reader_args})")
    with src.block("if got is UNKEYABLE:"):
        _return(src, flavour, "self._unkeyable", f"args, kwargs, flatten({tree})[0]")
    with src.block("if got is not None:"):
        src.line("key, shardings, leaves = got")
    with src.block("else:"):
        _keyed_from_leaves(src, flavour, names)


def _read(src: Source, split: Split, flavour: Flavour, names: _Names) -> None:
    """The statements that key the call: `key`, `shardings` and `leaves` (see
    the module docstring for the forms)."""
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
        src.lines([f"key = {tuple_source(prefix)}", "shardings = []", f"leaves = {leaves}"])
        return
    flattened = Source()
    _flattened(flattened, split, flavour, names)
    if not names.unroll:  # more dynamic arguments than UNROLL_MAX: a loop over them
        key = f"({', '.join(prefix)}, *pairs)" if marked else "pairs"
        src.lines([f"dynamic = {leaves}", "signatures = None"])
        with src.block("try:"):
            src.lines([f"pairs, shardings = {_ARRAY_SIGNATURES.format(xs='dynamic')}",
                       f"key = {key}", "leaves = dynamic"])
        with src.block("except AttributeError:"):
            src.extend(flattened)
        return
    _unrolled(src, flavour, names, prefix, leaves, flattened)


def _unrolled(src: Source, flavour: Flavour, names: _Names, prefix: list[str], leaves: str,
              flattened: Source) -> None:
    """The key of up to UNROLL_MAX dynamic arguments, each in a local: all
    jax.Arrays; all leaves (host values among them: no flatten); else
    containers (pytrees), `flattened`."""
    dynamic = names.dynamic
    items, shardings = flat_reads(dynamic)
    with src.block(f"if {' and '.join(f'type({d}) is ArrayImpl' for d in dynamic)}:"):
        src.lines([f"key = {tuple_source(prefix + items)}",
                   f"shardings = [{', '.join(shardings)}]", f"leaves = {leaves}"])
    with src.block(f"elif {' and '.join(f'type({d}) in LEAF_TYPES' for d in dynamic)}:"):
        src.lines([f"leaves = [{', '.join(dynamic)}]", "get = canonical_dtypes[x64.value].get"])
        with src.block("try:"):
            src.line(f"signatures = {tuple_source([SIGNATURE.format(x=d) for d in dynamic])}")
        with src.block("except NoSignature:"):
            _return(src, flavour, "self._unkeyable", "args, kwargs, leaves")
        src.lines(["shardings = [x._sharding for x in leaves if type(x) is ArrayImpl]",
                   f"key = (LEAVES, KEY_SHAPE, {names.static_key}, LEAVES_TREEDEF_ID,"
                   " signatures)"])
    with src.block("else:"):
        src.line("signatures = None")
        if len(dynamic) != 1:
            src.extend(flattened)
            return
        # One dynamic argument that is a list or tuple (JAX's many-args case,
        # ``f(xs)``; a tuple carry): its elements are the leaves when they are
        # all jax.Arrays, and such a container of n leaves has one treedef per
        # type and n, so the key needs no flatten. Otherwise `signatures`
        # stays None and the call is flattened.
        _sequence(src, dynamic[0], names)
        with src.block("if signatures is None:"):
            src.extend(flattened)


def _sequence(src: Source, x: str, names: _Names) -> None:
    """The key of dynamic argument `x` when it is a list or tuple of jax.Arrays."""
    with src.block(f"if (container := type({x})) is list or container is tuple:"):
        src.line(f"leaves = {x}")
        with src.block("try:  # one assignment each: a leaf that is not a jax.Array sets nothing"):
            with src.block("if (keyer := sequence_keyers_get(len(leaves))) is not None:"):
                src.line("signatures, shardings = keyer(leaves)")
            with src.block("else:"):
                src.line(f"signatures, shardings = {_ARRAY_SIGNATURES.format(xs='leaves')}")
            src.line(f"key = (SEQUENCE, KEY_SHAPE, {names.static_key}, container, signatures)")
        with src.block("except (AttributeError, ValueError):  # not all jax.Arrays;"
                       " resized meanwhile"):
            src.line("pass")


def _source(split: Split, flavour: Flavour) -> str:
    """The source of the binder of one call shape in one flavour: the call's
    arguments unpacked, keyed, then the hit path (or, keys only, the key)."""
    names = _Names(split)
    src = Source()
    # An entry-stamping flavour's binder takes `stamps`, begun as the call
    # entered `PjitFunction.__call__`; `start` begins it for a call that came
    # another way.
    with src.block("def bind(self, args, kwargs, stamps=None):" if flavour.entry_stamp
                   else "def bind(self, args, kwargs):"):
        if flavour.entry_stamp and flavour.start:
            with src.block("if stamps is None:"):
                src.line(flavour.start)
        else:
            _stamp(src, flavour.start)
        _unpack(src, split, names, flavour)
        _read(src, split, flavour, names)
        if flavour.keys_only:
            src.line("return (leaves, key, shardings)")
        else:
            _stamp(src, flavour.stamps[0])
            _hit(src, flavour)
    return src.text()


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
    binder = run_source(source, name, scope, __name__)["bind"]
    # Whether it takes the call's `stamps` (a function attribute:
    # `__defaults__` costs ~0.3 us to read once JAX has added an audit hook).
    binder.takes_entry_stamp = f.entry_stamp
    return binder


def _refuse(*_: Any) -> str:
    """What a key-only binder returns for a call it cannot key."""
    return "unkeyable"


def _hit_source(flavour: str) -> str:
    """The source of the hit path alone (`BinderTable.hit`)."""
    src = Source()
    with src.block("def hit(self, args, kwargs, leaves, key, shardings, stamps, t_key):"):
        _hit(src, _flavours.flavour(flavour))
    return src.text()


def _make_hit(env: dict[str, Any], flavour: str) -> Callable[..., Any]:
    """The hit path alone, ``hit(self, args, kwargs, leaves, key, shardings, stamps, t_key)``:
    for a call keyed elsewhere (a miss another thread compiled meanwhile,
    filter_jit's reader keys); `stamps` (the call's stamps so far, a list: see
    `Flavour.entry_stamp`) and `t_key` are the timed flavour's."""
    scope = {**env, **_flavours.flavour(flavour).scope}
    name = "hit" if flavour == "plain" else f"hit {flavour}"
    return run_source(_hit_source(flavour), name, scope, __name__)["hit"]


# ---------------------------------------------------------------------------
# One function's binders


class BinderTable(dict):
    """call shape -> binder of one function, built on first use (`__missing__`).

    A call finds its binder by one subscript, ``table[nargs]`` (a keyword
    call by ``~nargs``: the binder built for the names that came first, which
    hands other names to the binder of their full shape, `_other_keywords`).

    `env` is what the generated code reads besides its own constants and its
    flavour's names (the namespace's lookup, the LRU's mark_recent, ...);
    `flavour` is the flavour its binders are built in, "plain" unless
    switched (`nbjit.core.flavours.use_flavour`: "timed" while a profile is
    active); `hit` is the hit path alone in that flavour (see `_make_hit`);
    `stamps_entry`, whether that flavour has `PjitFunction.__call__` stamp a
    call's ends (`Flavour.entry_stamp`).
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
            "LaunchRefused": LaunchRefused,
            "other_keywords": _other_keywords,
        }
        self.spanned: dict[Any, Callable[[Any, tuple, dict], Any]] = {}  # the traced flavour's
        self.keyers: dict[Any, Callable[[Any, tuple, dict], Any]] = {}  # the key-only flavour's
        self.flavour = "plain"
        self.stamps_entry = False
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
        self.stamps_entry = _flavours.flavour(flavour).entry_stamp
        self.clear()

    def __missing__(self, shape: Any) -> Callable[..., Any]:
        """The binder of call shape `shape`, built now; for a keyword call's
        positional count (``~nargs``) not yet served, `_other_keywords`,
        which builds the binder of the call's full shape (that binder then
        serves the count)."""
        if type(shape) is int and shape < 0:
            return _other_keywords
        return self.build(shape)

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
            return self[shape]
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


def _other_keywords(jitted: Any, args: tuple, kwargs: dict, stamps: list | None = None) -> Any:
    """A keyword call whose names are not those of the binder its positional
    count found: the binder of its full call shape runs it (`stamps`: the
    call's, `Flavour.entry_stamp`)."""
    binder = info(jitted).binders[call_shape(args, kwargs)]
    if stamps is not None and binder.takes_entry_stamp:
        return binder(jitted, args, kwargs, stamps)
    return binder(jitted, args, kwargs)  # no stamps came, or built plain: switched meanwhile


_other_keywords.takes_entry_stamp = True  # type: ignore[attr-defined]  # (it takes `stamps`)


def binder_source(jitted: Any, /, *args: Any, **kwargs: Any) -> str:
    """The source of the binder a call ``jitted(*args, **kwargs)`` runs: the
    hit path of that call shape (timed while a profile is active). Calls nothing.

        f = nbjit.jit(lambda x, y: x + y)
        print(nbjit.binder_source(f, x, y))
    """
    return info(jitted).binders.source(call_shape(args, kwargs))
