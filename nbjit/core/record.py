"""The frozen fast-path record of one cached signature, and its input steps.

`build_record` turns the fast-path data JAX's miss path returns
(`MeshExecutableFastpathData`, as jaxlib's C++ receives it) into a
`FastPath`: everything a hit needs, fixed at creation. Input preparation is
one tuple of steps, each chosen at build time by the type of the value the
miss saw (`_STEP_BUILDERS`, a ``type -> builder`` table as JAX's
`shard_arg_handlers`):

  * a `jax.Array` already placed as the executable wants: no step;
  * a one-device `jax.Array` on another device: a C++ copy (`_Copy`);
  * a host value (numpy array or scalar, Python scalar) bound for one
    device: `HostInput` (one batched C++ transfer, with a memo);
  * a host value bound for many devices, or a big one: its `ShardingPlan`
    slices/copies on the host (`_Planned`);
  * anything else: JAX's own `shard_args`, batched into one `_ShardArgs`.

Host values are classified in one place, `host_dtype`: the keys
(`nbjit.core.keys.leaf_signature`) and the steps agree on what a host value is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit.core.codegen import run_source
from nbjit.host import plan as _sharding

__all__ = ["FastPath", "HostInput", "Unsupported", "build_record", "canonical_dtypes",
           "host_dtype"]

ArrayImpl = _jax.ArrayImpl
_device_put = _jax.batched_device_put
_copy_to_devices = _jax.copy_to_devices_unguarded
_host_transfers_unguarded = _jax.host_transfers_unguarded
# Host buffers are copied while the transfer call runs: the result never
# aliases the caller's array (jaxlib's default, zero copy, uses a 64-byte
# aligned array in place, so mutating it after the call could change a result).
_COPY_DURING_CALL = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL


class Unsupported(Exception):
    """This signature cannot take the fast path; `args[0]` says why (a slow reason)."""


# ---------------------------------------------------------------------------
# Host values


class _CanonicalDtypes(dict):
    """dtype -> canonical dtype for one x64 setting, filled on first use.

    Read with the plain (C) ``dict.get``, then `resolve` on a miss: numeric
    dtypes are stored, others (strings, objects, float0) give None each
    time, and JAX's own path handles them.
    """

    def __init__(self, x64: bool) -> None:
        super().__init__()
        self._x64 = x64

    def resolve(self, dtype: Any) -> np.dtype | None:
        try:
            if not _is_numeric(dtype):
                return None
            with _jax.enable_x64(self._x64):
                canonical = np.dtype(_jax.canonicalize_dtype(dtype))
            self[dtype] = canonical
        except TypeError:  # an unhashable or odd "dtype" of some exotic subclass
            return None
        return canonical


def _is_numeric(dtype: np.dtype) -> bool:
    """bool, integers, floats, complex, and ml_dtypes' (bfloat16, float8, ...)."""
    return dtype.kind in "biufc" or dtype.type.__module__ == "ml_dtypes"


# x64 setting -> {dtype: canonical dtype}
canonical_dtypes = {False: _CanonicalDtypes(False), True: _CanonicalDtypes(True)}
# Python scalar type -> the dtype JAX gives it before canonicalisation (weakly typed)
_PYTHON_SCALAR_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64),
                         float: np.dtype(np.float64), complex: np.dtype(np.complex128)}


_WEAK_SCALAR_TYPES = frozenset({int, float, complex})


def host_dtype(x: Any, canonical: dict) -> np.dtype | None:
    """The canonical (x64-squashed) dtype a host value enters as; None if not one.

    Host values: numpy arrays and scalars of numeric dtypes, Python bool,
    int, float and complex (as in jaxlib, an int's range is checked when it
    is converted, and JAX's own path reports an overflow).
    """
    t = type(x)
    if t is np.ndarray or isinstance(x, np.generic):
        dtype = x.dtype
    elif (dtype := _PYTHON_SCALAR_DTYPES.get(t)) is None:
        return None
    try:
        canonical_dtype = canonical.get(dtype)
    except TypeError:  # unhashable
        return None
    return canonical.resolve(dtype) if canonical_dtype is None else canonical_dtype


# ---------------------------------------------------------------------------
# Input steps


class HostInput:
    """A host value bound for one device, at `index` of the inputs.

    The value goes to `batched_device_put` as it is: jaxlib converts it to
    `aval`'s (canonical) dtype itself, which costs less per leaf than
    converting it in numpy first (docs/performance.md, "Measured constants
    behind the code"). A numpy array is copied during the call
    (never aliased: the caller may mutate it as soon as the call returns);
    a scalar cannot be aliased.

    With `memo`, the device copy of the last value is kept: the same
    immutable scalar object, or a small array with the same bytes (after
    canonicalisation), reuses it instead of transferring again. It is exact:
    bytes, not ``==``, so -0.0, NaN payloads and every dtype are told apart;
    the copy is never donated (no memo for donating functions) and never
    handed to the caller. A guarded transfer (log, disallow) always goes
    through `batched_device_put`, which applies the guard as jaxlib does.

    The array memo has a cost per call (copy out the bytes, compare, keep
    them), all of it wasted in a loop that passes new values every call.
    After `MEMO_PATIENCE` misses in a row it sleeps for `MEMO_REST` calls
    (plain transfers), then looks again: values that start repeating are
    memoised again within ``MEMO_REST + 2`` calls.
    """

    MEMO_MAX_BYTES = 1024  # a bytes compare this size costs far less than a transfer
    MEMO_PATIENCE = 8
    MEMO_REST = 56

    __slots__ = ("index", "dtype", "aval", "sharding", "devices", "memo", "last", "misses",
                 "rest", "on_fresh")

    def __init__(self, index: int, dtype: np.dtype, aval: Any, sharding: Any,
                 memo: bool) -> None:
        self.index = index
        self.dtype = dtype
        self.aval = aval
        self.sharding = sharding
        self.devices = list(sharding.device_set)
        self.memo = memo
        self.last: tuple | None = None  # (scalar object or None, array bytes or None, device array)
        self.misses = 0  # array memo misses in a row
        self.rest = 0  # calls left before the array memo looks again
        # On a memo miss (a new value) when packing is armed (nbjit.host.packing): a
        # weak method (the plan lives with the node; no cycle through the record).
        self.on_fresh: Callable[[], Callable[[], None] | None] | None = None

    def apply(self, inputs: list) -> None:
        inputs[self.index] = self.value(inputs[self.index])

    def value(self, x: Any) -> Any:
        """The device array for host value `x` (see the class docstring).

        The generated preparer (`_preparer_source`) does the plain transfer
        of a numpy array itself while the memo rests or when there is none,
        and calls this for everything else.
        """
        if type(x) is not np.ndarray:  # a scalar: immutable, the object itself is a key
            last = self.last
            if last is not None and x is last[0] and _host_transfers_unguarded():
                return last[2]
            array = _device_put(self.aval, self.sharding, [x], self.devices, False)
            if self.memo:
                self.last = (x, None, array)
            if (on_fresh := self.on_fresh) is not None and (fresh := on_fresh()) is not None:
                fresh()
            return array
        if not self.memo or self.rest > 0:  # (threads may race on `rest`: > 0, not truthy)
            if self.memo:
                self.rest -= 1
            return _device_put(self.aval, self.sharding, [x], self.devices, False, False,
                               _COPY_DURING_CALL)
        data = np.asarray(x, self.dtype).tobytes()
        last = self.last
        if last is not None and data == last[1] and _host_transfers_unguarded():
            self.misses = 0
            return last[2]
        array = _device_put(self.aval, self.sharding, [x], self.devices, False, False,
                            _COPY_DURING_CALL)
        self.last = (None, data, array)  # arrays are mutable: never kept alive or compared by id
        if (on_fresh := self.on_fresh) is not None and (fresh := on_fresh()) is not None:
            fresh()
        self.misses += 1
        if self.misses >= self.MEMO_PATIENCE:
            self.misses = 0
            self.rest = self.MEMO_REST
        return array


class _Copy:
    """A one-device jax.Array on another device: copied in C++, as jaxlib does.

    As jaxlib's IFRT CopyArrays, the copy is below the layer that applies
    device-to-device transfer guards: a hit copies under "disallow" too.
    """

    __slots__ = ("index", "device_list", "sharding")

    def __init__(self, index: int, sharding: Any) -> None:
        self.index = index
        self.device_list = _jax.device_list(sharding)
        self.sharding = sharding

    def apply(self, inputs: list) -> None:
        inputs[self.index] = self.value(inputs[self.index])

    def value(self, x: Any) -> Any:
        return _copy_to_devices([x], [self.device_list], [self.sharding])[0]


class _Planned:
    """A host value sliced/copied on the host by its `ShardingPlan`."""

    __slots__ = ("index", "dtype", "plan")

    def __init__(self, index: int, dtype: np.dtype, plan: Any) -> None:
        self.index = index
        self.dtype = dtype
        self.plan = plan

    def apply(self, inputs: list) -> None:
        inputs[self.index] = self.value(inputs[self.index])

    def value(self, x: Any) -> Any:
        return self.plan.put(np.asarray(x, self.dtype))


class _ShardArgs:
    """Inputs JAX's own `shard_args` converts (reshardings, unusual values), in one call."""

    __slots__ = ("indices", "shardings")

    def __init__(self, indices: Sequence[int], shardings: Sequence[Any]) -> None:
        self.indices = tuple(indices)
        self.shardings = list(shardings)

    def apply(self, inputs: list) -> None:
        indices = self.indices
        converted = _jax.pxla_shard_args(self.shardings, [None] * len(indices),
                                         [inputs[i] for i in indices])
        for i, value in zip(indices, converted, strict=True):
            inputs[i] = value


_SHARD_ARGS = object()  # a builder's answer: leave this input to `_ShardArgs`


def _array_step(i: int, x: Any, sharding: Any, donated: bool) -> Any:
    if _same_placement(x, sharding):
        return None
    if len(x._sharding.device_set) == 1 and len(sharding.device_set) == 1:
        # A device of another process (none addressable here): as jaxlib's
        # PrepareIfrtInputs, the array goes to the executable as it is.
        return _Copy(i, sharding) if len(_jax.device_list(sharding)) else None
    return _SHARD_ARGS


def _host_step(i: int, x: Any, sharding: Any, donated: bool) -> Any:
    dtype = host_dtype(x, canonical_dtypes[_jax.enable_x64.value])
    if dtype is None or not len(_jax.device_list(sharding)):
        return _SHARD_ARGS  # not a host value, or no device of this process: JAX's way
    nbytes = np.size(x) * dtype.itemsize
    if len(sharding.device_set) == 1 and nbytes < _sharding.SINGLE_DEVICE_PLAN_MIN_BYTES:
        memo = not donated and nbytes <= HostInput.MEMO_MAX_BYTES
        weak = type(x) in _WEAK_SCALAR_TYPES  # as JAX types Python scalars (bool is not weak)
        aval = _jax.ShapedArray(np.shape(x), dtype, weak_type=weak)
        return HostInput(i, dtype, aval, sharding, memo)
    plan = _sharding.plan_for(sharding, np.shape(x), dtype)
    return _SHARD_ARGS if plan is None else _Planned(i, dtype, plan)


_STEP_BUILDERS: dict[type, Callable[[int, Any, Any, bool], Any]] = {
    ArrayImpl: _array_step,
    np.ndarray: _host_step,
    **{t: _host_step for t in _PYTHON_SCALAR_DTYPES},
}


def _step_for(i: int, x: Any, sharding: Any, donated: bool) -> Any:
    build = _STEP_BUILDERS.get(type(x))
    if build is None:
        build = _host_step if isinstance(x, np.generic) else None
    return _SHARD_ARGS if build is None else build(i, x, sharding, donated)


def _same_placement(x: Any, sharding: Any) -> bool:
    xs = x._sharding
    if xs is sharding or xs == sharding:
        return True
    try:
        return bool(xs.is_equivalent_to(sharding, x.ndim))
    except Exception:  # different sharding types JAX cannot compare: convert
        return False


# ---------------------------------------------------------------------------
# The record


@dataclasses.dataclass(frozen=True, slots=True)
class FastPath:
    """Everything a hit needs for one signature; never changes once built.

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
    # host inputs (nbjit/_packed.py) learn from it when a slot may be reused.
    fence: Callable[[Sequence[Any], list], None] | None = None

    def inputs(self, leaves: Sequence[Any]) -> list:
        """The executable's input list: consts, kept leaves, each step applied."""
        return leaves if self.leaves_are_inputs else self.prepare(leaves)

    def step_objects(self) -> list:
        """The step objects behind `steps` (for tests and introspection)."""
        return [apply.__self__ for apply in self.steps]


# ---------------------------------------------------------------------------
# Input preparers
#
# A record's inputs are its consts, its kept leaves, and a step applied to
# some of them. For up to `PREPARE_UNROLL_MAX` inputs the record gets a
# generated function that does exactly that (each input in a local, a host
# array's plain transfer inline); more inputs, or inputs that JAX's
# `shard_args` converts together, take the generic loop over the steps.

PREPARE_UNROLL_MAX = 16

_PREPARE_TEMPLATE = """\
def prepare(leaves):
{unpack}{steps}    return [{inputs}]
"""

# A host value while its memo rests (or with no memo): a numpy array is
# transferred right here; anything else (a scalar, an awake memo) asks the step.
_HOST_RESTING = """\
    if type({x}) is ndarray and (step := H{i}).rest > 0:
        step.rest -= 1
        {x} = put(A{i}, S{i}, [{x}], D{i}, False, False, COPY_DURING_CALL)
    else:
        {x} = V{i}({x})
"""
_HOST_NO_MEMO = """\
    if type({x}) is ndarray:
        {x} = put(A{i}, S{i}, [{x}], D{i}, False, False, COPY_DURING_CALL)
    else:
        {x} = V{i}({x})
"""
_VALUE_STEP = "    {x} = V{i}({x})\n"


def _preparer_source(n_consts: int, kept: tuple[int, ...] | None, n_leaves: int,
                     steps: dict[int, Any]) -> str:
    """The source of `prepare(leaves)` for one record's structure (not its values)."""
    positions = range(n_leaves) if kept is None else kept
    # A const with a step is copied into a local first (the step rebinds it).
    names = [f"c{i}" if i in steps else f"C{i}" for i in range(n_consts)]
    names += [f"x{j}" for j in positions]
    if kept is None:
        unpack = f"    {''.join(n + ', ' for n in names[n_consts:])}= leaves\n" if n_leaves else ""
    else:
        unpack = "".join(f"    x{j} = leaves[{j}]\n" for j in kept)
    unpack += "".join(f"    c{i} = C{i}\n" for i in range(n_consts) if i in steps)
    body = []
    for i, step in sorted(steps.items()):
        if type(step) is HostInput:
            template = _HOST_RESTING if step.memo else _HOST_NO_MEMO
        else:
            template = _VALUE_STEP
        body.append(template.format(x=names[i], i=i))
    return _PREPARE_TEMPLATE.format(unpack=unpack, steps="".join(body), inputs=", ".join(names))


def _make_preparer(consts: tuple, kept: tuple[int, ...] | None, n_leaves: int,
                   steps: dict[int, Any], shard_args: Any) -> Callable[[Sequence[Any]], list]:
    """``prepare(leaves) -> inputs`` for a record: generated, or the generic loop."""
    n_inputs = len(consts) + (n_leaves if kept is None else len(kept))
    if shard_args is None and n_inputs <= PREPARE_UNROLL_MAX:
        scope: dict[str, Any] = {"ndarray": np.ndarray, "put": _device_put,
                                 "COPY_DURING_CALL": _COPY_DURING_CALL}
        scope.update((f"C{i}", c) for i, c in enumerate(consts))
        for i, step in steps.items():
            scope[f"V{i}"] = step.value
            if type(step) is HostInput:
                scope.update({f"H{i}": step, f"A{i}": step.aval, f"S{i}": step.sharding,
                              f"D{i}": step.devices})
        source = _preparer_source(len(consts), kept, n_leaves, steps)
        return run_source(source, "prepare", scope)["prepare"]
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


def build_record(fastpath: Any, leaves: Sequence[Any], donated: bool) -> FastPath:
    """Turns JAX's fast-path data into a `FastPath`; raises `Unsupported` when it cannot.

    `leaves`: the call's dynamic leaves, as the miss saw them (their types
    choose the steps). `donated`: the function donates some argument (host
    inputs then keep no memo).
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
    steps, shard_args = {}, []
    for i, (x, sharding) in enumerate(zip(inputs, in_shardings, strict=True)):
        step = _step_for(i, x, sharding, donated)
        if step is _SHARD_ARGS:
            shard_args.append(i)
        elif step is not None:
            steps[i] = step
    batched = _ShardArgs(shard_args, [in_shardings[i] for i in shard_args]) if shard_args else None
    out_tree = fastpath.out_pytree_def
    all_kept = len(kept) == len(leaves)
    return FastPath(
        executable=fastpath.xla_executable,
        execute=(_checking_deleted(fastpath.xla_executable.execute_sharded) if donated
                 else fastpath.xla_executable.execute_sharded),
        out_handlers=[
            _jax.result_handler(aval, sharding, committed)
            for aval, sharding, committed in zip(
                fastpath.out_avals, fastpath.out_shardings, fastpath.out_committed, strict=True)
        ],
        out_tree=out_tree,
        single_output=out_tree.num_nodes == 1 and out_tree.num_leaves == 1,
        consts=consts,
        kept=None if all_kept else kept,
        steps=tuple(step.apply for _, step in sorted(steps.items()))
        + ((batched.apply,) if batched else ()),
        leaves_are_inputs=not consts and not steps and not batched and all_kept,
        prepare=_make_preparer(consts, None if all_kept else kept, len(leaves), steps, batched),
    )


# ---------------------------------------------------------------------------
# Private copies for JAX's own path


# Up to this size a copy costs less than reading the array's address; above it
# only a 64-byte-aligned array is copied (jaxlib copies any other itself
# while the call runs: it never uses it in place).
PRIVATE_COPY_ALWAYS_BYTES = 64 << 10


def _private_leaf(x: Any) -> Any:
    if type(x) is not np.ndarray:
        return x
    if x.nbytes <= PRIVATE_COPY_ALWAYS_BYTES or x.__array_interface__["data"][0] % 64 == 0:
        return x.copy()
    return x


def private_host_copies(args: tuple, kwargs: dict, static_positions: Sequence[int],
                        static_names: Sequence[str]) -> tuple[tuple, dict]:
    """`args` and `kwargs` with every numpy array among the dynamic ones copied.

    JAX's own path (a miss, a slow call) uses a 64-byte-aligned numpy array
    in place on CPU, so a caller writing into it after the call could change
    the result; a private copy cannot be written by anyone. Static arguments
    are left alone (they enter keys by ``==``). Arguments with no numpy
    array in them are returned as they are (same objects).
    """
    changed_args = _private_changes(enumerate(args), static_positions)
    changed_kwargs = _private_changes(kwargs.items(), static_names)
    if changed_args:
        args = tuple(changed_args.get(i, x) for i, x in enumerate(args))
    if changed_kwargs:
        kwargs = {**kwargs, **changed_kwargs}
    return args, kwargs


def _private_changes(items: Any, static: Sequence[Any]) -> dict:
    """position or name -> private copy, for the dynamic arguments with numpy in them."""
    changed = {}
    for where, x in items:
        t = type(x)
        if t is ArrayImpl or t in _PYTHON_SCALAR_DTYPES or where in static:
            continue
        y = _private_tree(x)
        if y is not x:
            changed[where] = y
    return changed


def _private_tree(x: Any) -> Any:
    if type(x) is np.ndarray:
        return _private_leaf(x)
    leaves, treedef = _jax.flatten_for_dispatch(x)
    private = [_private_leaf(leaf) for leaf in leaves]
    if all(p is leaf for p, leaf in zip(private, leaves, strict=True)):
        return x
    return treedef.unflatten(private)
