"""The fast-path record of one cached signature.

`build_record` turns the fast-path data JAX's miss path returns
(`MeshExecutableFastpathData`, as jaxlib's C++ receives it) into a
`FastPath`: everything a hit needs, fixed at creation. Input preparation is
one tuple of steps (chosen by the type of each value the miss saw:
`nbjit.core.inputs.steps`) and a `prepare(leaves)` generated for the
record's structure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nbjit import _jax
from nbjit.core.codegen import Source, run_source
from nbjit.core.inputs.launch import launch_for
from nbjit.core.inputs.platforms import platform_of, strategy_for
from nbjit.core.inputs.steps import FreshCallback, HostInput, InputStep, ShardArgs, input_steps

__all__ = ["LAUNCH_RECORD", "PER_LEAF_PUTS", "FastPath", "Unsupported", "build_record"]

ArrayImpl = _jax.ArrayImpl


# How a record's host leaves reach their device (`FastPath.host_path`, what
# `f.stats().host_inputs` counts per signature); a room above the core may
# name its own (the host room's resident slots).
LAUNCH_RECORD = "launch record"  # jaxlib's own puts, of private copies (an accelerator)
PER_LEAF_PUTS = "per-leaf puts"  # a put per host leaf from Python (or a plan's)


class Unsupported(Exception):
    """This signature cannot take the fast path; `args[0]` says why (a slow reason)."""


# ---------------------------------------------------------------------------
# The record


@dataclasses.dataclass(frozen=True, slots=True)
class FastPath:
    """Everything a hit needs for one signature; its fields never change.

    A node's record is replaced whole (by the host-input policy's swap,
    `nbjit.host.policy`), never edited. What does change inside, per call:
    the `HostInput` steps' memos (the last value's device copy), a resident
    record's slots, a launch record's staging rings and its launcher's
    jaxlib entries; nothing a key or an executable depends on.

    `kept` is None when every leaf is an input, in order; `steps` are the
    input steps' bound `apply` methods; `leaves_are_inputs` says the leaves
    go to the executable as they are (no consts, pruning or steps); else
    `prepare(leaves)` gives the executable's inputs (see `_make_preparer`).
    """

    executable: Any
    execute: Callable[[Sequence[Any]], Any]
    out_handlers: list
    out_tree: Any
    single_output: bool
    consts: tuple
    kept: tuple[int, ...] | None
    steps: tuple[Callable[[list], None], ...]
    leaves_are_inputs: bool
    prepare: Callable[[Sequence[Any]], list]
    # ``fence(inputs, outs)`` after a hit's outputs are made, or None: resident
    # host inputs (`nbjit.host.resident`) learn from it when a slot may be reused.
    fence: Callable[[Sequence[Any], list], None] | None = None
    # A launch record's (`nbjit.core.inputs.launch`): a hit is
    # ``launch(*stage(leaves))``, jaxlib's own puts into this executable.
    launch: Callable[..., Any] | None = None
    stage: Callable[[Sequence[Any]], Sequence[Any]] | None = None
    # How its host leaves reach their device (LAUNCH_RECORD, PER_LEAF_PUTS, or
    # a room's own); None: it has none.
    host_path: str | None = None

    def inputs(self, leaves: Sequence[Any]) -> Sequence[Any]:
        """The executable's input list: consts, kept leaves, each step applied."""
        return leaves if self.leaves_are_inputs else self.prepare(leaves)

    def step_objects(self) -> list:
        """The step objects behind `steps` (for tests and introspection)."""
        return [apply.__self__ for apply in self.steps]  # type: ignore[attr-defined]

    # What the rooms above the core ask of a record (`nbjit.host`): where a
    # leaf goes and what moves it, in leaves, never in consts and kept.

    def input_of(self, leaf: int) -> int | None:
        """Which input of the executable leaf `leaf` is (None: pruned)."""
        if self.kept is None:
            return len(self.consts) + leaf
        try:
            return len(self.consts) + self.kept.index(leaf)
        except ValueError:
            return None

    def step_of(self, leaf: int) -> Any:
        """The step that moves leaf `leaf` before the executable reads it (a
        `HostInput`, a copy, a plan, JAX's batched `shard_args`), or None: the
        leaf goes in as it is, or is pruned."""
        i = self.input_of(leaf)
        if i is None:
            return None
        for step in self.step_objects():
            if i in step.indices:
                return step
        return None

    def host_inputs(self) -> dict[int, HostInput]:
        """Leaf -> its `HostInput` step, for each leaf put by one, in leaf order."""
        n_consts = len(self.consts)
        return {i - n_consts if self.kept is None else self.kept[i - n_consts]: step
                for step in self.step_objects()
                if type(step) is HostInput and (i := step.index) >= n_consts}

    def uses_shard_args(self) -> bool:
        """Whether some inputs go through JAX's own batched `shard_args`."""
        return any(type(step) is ShardArgs for step in self.step_objects())

    def replaced(self, *, prepare: Callable[[Sequence[Any]], list] | None = None,
                 fence: Callable[[Sequence[Any], list], None] | None = None,
                 execute: Callable[[Sequence[Any]], Any] | None = None,
                 host_path: str | None = None) -> FastPath:
        """A copy with another `prepare` (which then always runs: the leaves
        are no longer the inputs), `fence`, `execute` or `host_path`; every
        other field is this record's, whatever fields it has."""
        changes: dict[str, Any] = {} if host_path is None else {"host_path": host_path}
        if prepare is not None:
            changes.update(prepare=prepare, leaves_are_inputs=False)
        if fence is not None:
            changes["fence"] = fence
        if execute is not None:
            changes["execute"] = execute
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------
# Input preparers
#
# A record's inputs are its consts, its kept leaves, and a step applied to
# some of them. For up to `PREPARE_UNROLL_MAX` inputs the record gets a
# generated function that does exactly that (each input in a local, a host
# array's plain transfer inline); more inputs, or inputs that JAX's
# `shard_args` converts together, take the generic loop over the steps.

PREPARE_UNROLL_MAX = 16

def _preparer_source(n_consts: int, kept: tuple[int, ...] | None, n_leaves: int,
                     steps: dict[int, InputStep]) -> tuple[str, dict[str, Any]]:
    """The source of `prepare(leaves)` for one record's structure (not its
    values), and the names its inline steps read."""
    positions = range(n_leaves) if kept is None else kept
    # A const with a step is copied into a local first (the step rebinds it).
    names = [f"c{i}" if i in steps else f"C{i}" for i in range(n_consts)]
    names += [f"x{j}" for j in positions]
    read: dict[str, Any] = {}
    src = Source()
    with src.block("def prepare(leaves):"):
        if kept is None:
            if n_leaves:
                src.line(f"{''.join(n + ', ' for n in names[n_consts:])}= leaves")
        else:
            src.lines(f"x{j} = leaves[{j}]" for j in kept)
        src.lines(f"c{i} = C{i}" for i in range(n_consts) if i in steps)
        for i, step in sorted(steps.items()):
            read.update(step.inline(src, names[i], i))
        src.line(f"return [{', '.join(names)}]")
    return src.text(), read


def _make_preparer(consts: tuple, kept: tuple[int, ...] | None, n_leaves: int,
                   steps: dict[int, InputStep], shard_args: ShardArgs | None
                   ) -> Callable[[Sequence[Any]], list]:
    """``prepare(leaves) -> inputs`` for a record: generated, or the generic loop."""
    n_inputs = len(consts) + (n_leaves if kept is None else len(kept))
    if shard_args is None and n_inputs <= PREPARE_UNROLL_MAX:
        scope: dict[str, Any] = {f"C{i}": c for i, c in enumerate(consts)}
        source, read = _preparer_source(len(consts), kept, n_leaves, steps)
        return run_source(source, "prepare", {**scope, **read}, __name__)["prepare"]
    applies = tuple(step.apply for _, step in sorted(steps.items()))
    if shard_args is not None:
        applies += (shard_args.apply,)

    def prepare(leaves: Sequence[Any]) -> list:
        inputs = [*consts, *(leaves if kept is None else [leaves[i] for i in kept])]
        for apply in applies:
            apply(inputs)
        return inputs

    return prepare


class DeletedInput(Exception):
    """An input array was deleted (donated) before the call: JAX's path raises."""


def _checking_deleted(execute: Callable[[Sequence[Any]], Any]) -> Callable[[Sequence[Any]], Any]:
    """`execute` for a donating function: a deleted input raises `DeletedInput`
    before the runtime sees it (the runtime logs an error line to stderr for a
    deleted buffer; jaxlib finds it earlier, while it computes the signature).
    Donating functions are where donated arrays are reused (``step(params)``
    twice); other functions skip the check, which costs a call per leaf. An
    input that is no jax.Array raises TypeError here, as `execute` would."""
    is_deleted = ArrayImpl.is_deleted

    def execute_checked(inputs: Sequence[Any]) -> Any:
        if any(map(is_deleted, inputs)):
            raise DeletedInput
        return execute(inputs)

    return execute_checked


def build_record(fastpath: Any, leaves: Sequence[Any], donated: bool,
                 on_fresh: Mapping[int, FreshCallback] | None = None,
                 name: str = "jit") -> FastPath:
    """Turns JAX's fast-path data into a `FastPath`; raises `Unsupported` when it cannot.

    `leaves`: the call's dynamic leaves, as the miss saw them (their types
    choose the steps). `donated`: the function donates some argument (host
    inputs then keep no memo). `on_fresh`: leaf -> the callback its
    `HostInput` step is built with (the host-input policy watching it).
    Where the platform's strategy launches (`InputStrategy.launches`) and
    host leaves go to the executable's one device, the record is a launch
    record (`nbjit.core.inputs.launch`; `name` names its launcher).
    """
    if fastpath is None:
        raise Unsupported("no_fastpath")
    if any(layout is not None for layout in fastpath.in_device_local_layouts):
        raise Unsupported("layout")
    const_args = list(fastpath.const_args)
    kept_bits = list(fastpath.kept_var_bitvec)
    n_const = len(const_args)
    if len(kept_bits) != n_const + len(leaves):
        raise Unsupported("no_fastpath")
    in_shardings = list(fastpath.in_shardings)
    consts = tuple(c for c, keep in zip(const_args, kept_bits[:n_const], strict=True) if keep)
    kept = tuple(i for i, keep in enumerate(kept_bits[n_const:]) if keep)
    if len(consts) + len(kept) != len(in_shardings):
        raise Unsupported("no_fastpath")
    inputs = [*consts, *[leaves[i] for i in kept]]
    if on_fresh is not None:  # (by input index, as the steps count)
        on_fresh = {len(consts) + i: on_fresh[j] for i, j in enumerate(kept) if j in on_fresh}
    steps, batched = input_steps(inputs, in_shardings, donated, on_fresh)
    out_tree = fastpath.out_pytree_def
    all_kept = len(kept) == len(leaves)
    execute = (_checking_deleted(fastpath.xla_executable.execute_sharded)
               if donated and not _jax.RUNTIME_REJECTS_DONATED_INPUTS
               else fastpath.xla_executable.execute_sharded)
    out_handlers = [
        _jax.result_handler(aval, sharding, committed)
        for aval, sharding, committed in zip(
            fastpath.out_avals, fastpath.out_shardings, fastpath.out_committed, strict=True)
    ]
    single_output = out_tree.num_nodes == 1 and out_tree.num_leaves == 1
    stage = launch = None
    if batched is None and _launches(fastpath, steps, len(consts)):
        stage, launch = launch_for(name, fastpath, consts, None if all_kept else kept,
                                   len(leaves), steps, execute, out_handlers, single_output)
    return FastPath(
        executable=fastpath.xla_executable,
        execute=execute,
        out_handlers=out_handlers,
        out_tree=out_tree,
        single_output=single_output,
        consts=consts,
        kept=None if all_kept else kept,
        steps=tuple(step.apply for _, step in sorted(steps.items()))
        + ((batched.apply,) if batched else ()),
        leaves_are_inputs=not consts and not steps and not batched and all_kept,
        prepare=_make_preparer(consts, None if all_kept else kept, len(leaves), steps, batched),
        launch=launch,
        stage=stage,
        host_path=(LAUNCH_RECORD if launch is not None
                   else PER_LEAF_PUTS if _puts_host_values(steps, len(consts)) else None),
    )


def _launches(fastpath: Any, steps: dict[int, InputStep], n_consts: int) -> bool:
    """Whether a record hands its host leaves to jaxlib's put (a launch record):
    some leaf is put from the host, every input and output lives on one and the
    same device (jaxlib puts host leaves itself only there), and that device's
    strategy launches."""
    if not _puts_host_values(steps, n_consts):
        return False
    shardings = [*fastpath.in_shardings, *fastpath.out_shardings]
    devices = {d for s in shardings for d in s.device_set}
    return (len(devices) == 1 and all(len(s.device_set) == 1 for s in shardings)
            and strategy_for(platform_of(shardings[0])).launches)


def _puts_host_values(steps: dict[int, InputStep], n_consts: int) -> bool:
    """Whether some leaf's step puts a host value (consts are never host leaves)."""
    return any(i >= n_consts and step.puts_host_values for i, step in steps.items())
