"""Input steps: how one input of a cached signature reaches its device.

A record's input preparation (`nbjit.core.record`) is a tuple of steps,
each chosen when the record is built (`input_steps`) by the type of the
value the miss saw, exact types first, as jaxlib's `shard_args` does:

  * a `jax.Array` already placed as the executable wants: no step;
  * a one-device `jax.Array` on another device: a C++ copy (`_Copy`);
  * a host value (numpy array or scalar, Python scalar) bound for one
    device: `HostInput` (one batched C++ transfer, with a memo);
  * a host value bound for many devices, or a big one where the platform's
    strategy plans big leaves (`InputStrategy.plans_big_leaves`: the
    CPU's): its `ShardingPlan` slices/copies on the host (`_Planned`);
  * anything else: JAX's own `shard_args`, batched into one `ShardArgs`.

Every step of one input is an `InputStep` (its `index`, `value`, `apply`,
`inline`, and whether it puts a host value); `ShardArgs` moves many.

A step's configuration is fixed when it is built, its `on_fresh` callback
included; what changes per call is a `HostInput`'s memo (the last value's
device copy, the held copy of the last array, and their patience counters),
nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from nbjit import _jax
from nbjit._common import memcmp
from nbjit.core.codegen import Source
from nbjit.core.inputs import plans as _plan
from nbjit.core.inputs.platforms import DIRECT, HostTransfer, platform_of, strategy_for
from nbjit.core.inputs.values import (
    PYTHON_SCALAR_DTYPES,
    canonical_dtypes,
    host_dtype,
    scalar_converts_exactly,
)

__all__ = ["SHARD_ARGS", "FreshCallback", "HostInput", "InputStep", "ShardArgs", "input_step",
           "input_steps"]

ArrayImpl = _jax.ArrayImpl
_device_put = _jax.batched_device_put
_copy_to_devices = _jax.copy_to_devices_unguarded
_host_transfers_unguarded = _jax.host_transfers_unguarded
COPY_DURING_CALL = _jax.COPY_DURING_CALL
_WEAK_SCALAR_TYPES = frozenset({int, float, complex})  # as JAX types them (bool is not weak)

# What `on_fresh` is: a weak reference to a callback (`weakref.WeakMethod`),
# so a step (held by a record, held by a node) never keeps its caller alive.
FreshCallback = Callable[[], Callable[[], None] | None]


class InputStep:
    """How input `index` of a record reaches its device: `value(x)` gives
    what the executable reads for the value `x` the call brought.

    `puts_host_values`: the step puts a host value (a launch record hands
    jaxlib's put what `launch_value(x)` gives instead: `nbjit.core.inputs.launch`).
    """

    __slots__ = ("index",)
    puts_host_values = False

    def __init__(self, index: int) -> None:
        self.index = index

    @property
    def indices(self) -> tuple[int, ...]:
        """The inputs this step moves."""
        return (self.index,)

    def value(self, x: Any) -> Any:
        raise NotImplementedError

    def launch_value(self, x: Any) -> Any:
        """What a launch record hands jaxlib's put for `x` (asked of a step
        that puts host values): by default, `value`'s device array."""
        return self.value(x)

    def apply(self, inputs: list) -> None:
        """Moves its input of `inputs` in place."""
        inputs[self.index] = self.value(inputs[self.index])

    def inline(self, src: Source, x: str, i: int) -> dict[str, Any]:
        """Adds to `src` the statements that apply this step to local `x` of a
        generated preparer, as input `i`, and returns the names they read."""
        src.line(f"{x} = V{i}({x})")
        return {f"V{i}": self.value}

    def launch_inline(self, x: str, i: int) -> tuple[str, dict[str, Any]]:
        """The expression a generated launch stager gives jaxlib's put for
        local `x` (leaf `i`), and the names it reads: `launch_value`'s."""
        return f"L{i}({x})", {f"L{i}": self.launch_value}


class HostInput(InputStep):
    """A host value bound for one device, at `index` of the inputs.

    The value goes to `batched_device_put` as it is: jaxlib converts it to
    `aval`'s (canonical) dtype itself, which costs less per leaf than
    converting it in numpy first (docs/performance.md, "Measured constants
    behind the code"). A numpy array goes as its platform's `transfer` says
    (`nbjit.core.inputs.platforms`; by default copied during the call, never
    aliased: the caller may mutate it as soon as the call returns); a
    scalar cannot be aliased.

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

    With `compare` (a launch record's array bigger than a memo takes, whose
    transfer stages a private copy: an accelerator), the step keeps that
    copy of the last array (`held`) and compares the next one with it
    (`memcmp`, which stops at the first byte that differs): the same bytes
    again reuse a device array of the copy, put once, instead of a copy and
    a transfer per call. Misses rest as the memo's do.
    """

    puts_host_values = True
    MEMO_MAX_BYTES = 1024  # a bytes compare this size costs far less than a transfer
    MEMO_PATIENCE = 8
    MEMO_REST = 56

    __slots__ = ("dtype", "aval", "sharding", "devices", "memo", "last", "misses",
                 "rest", "on_fresh", "transfer", "compare", "nbytes", "held")

    def __init__(self, index: int, dtype: np.dtype, aval: Any, sharding: Any,
                 memo: bool, on_fresh: FreshCallback | None = None,
                 transfer: HostTransfer = DIRECT, compare: bool = False) -> None:
        super().__init__(index)
        self.dtype = dtype
        self.aval = aval
        self.sharding = sharding
        self.devices = list(sharding.device_set)
        self.memo = memo
        self.transfer = transfer
        # (scalar object or None, array bytes or None, device array or None: a
        # launch record's value seen once, not yet put by this step)
        self.last: tuple | None = None
        self.misses = 0  # array memo misses in a row
        self.rest = 0  # calls left before the array memo looks again
        # Told of each memo miss (a new value) when an optimisation watches this
        # leaf (the CPU's host-input policy): given here, never set afterwards.
        self.on_fresh = on_fresh
        # (see the class docstring) only where the transfer stages a private copy
        self.compare = compare and transfer.stage is not None and memcmp is not None
        self.nbytes = int(np.prod(aval.shape, dtype=np.int64)) * dtype.itemsize
        # (the private copy of the last array, its address, its device array
        # or None: not put yet) while `compare` looks; holding the copy keeps
        # its ring from writing it again
        self.held: tuple[Any, int, Any] | None = None

    def inline(self, src: Source, x: str, i: int) -> dict[str, Any]:
        """`InputStep.inline`: a numpy array's plain transfer inline (while
        the memo rests, or with no memo), anything else through `value`."""
        names = {f"H{i}": self, f"A{i}": self.aval, f"S{i}": self.sharding, f"D{i}": self.devices,
                 f"V{i}": self.value, "ndarray": np.ndarray, "put": _device_put,
                 "COPY_DURING_CALL": COPY_DURING_CALL}
        # The default transfer reads as jaxlib's own put; another one names its
        # staging function (T) and its semantics (M).
        stage, semantics = self.transfer.stage, self.transfer.semantics
        staged = x
        if stage is not None:
            staged, names[f"T{i}"] = f"T{i}({x})", stage
        semantics_name = "COPY_DURING_CALL"
        if semantics is not COPY_DURING_CALL:
            semantics_name, names[f"M{i}"] = f"M{i}", semantics
        put = f"put(A{i}, S{i}, [{staged}], D{i}, False, False, {semantics_name})"
        if self.memo:
            with src.block(f"if type({x}) is ndarray and (step := H{i}).rest > 0:"):
                src.lines(["step.rest -= 1", f"{x} = {put}"])
        else:
            with src.block(f"if type({x}) is ndarray:"):
                src.line(f"{x} = {put}")
        with src.block("else:"):
            src.line(f"{x} = V{i}({x})")
        return names

    def value(self, x: Any) -> Any:
        """The device array for host value `x` (see the class docstring).

        The generated preparer (`_preparer_source`) does the plain transfer
        of a numpy array itself while the memo rests or when there is none,
        and calls this for everything else.
        """
        if type(x) is not np.ndarray:  # a scalar: immutable, the object itself is a key
            last = self.last
            if (last is not None and x is last[0] and last[2] is not None
                    and _host_transfers_unguarded()):
                return last[2]
            array = self.value_put(x)
            if self.memo:
                self.last = (x, None, array)
            self._fresh()
            return array
        if not self.memo or self.rest > 0:  # (threads may race on `rest`: > 0, not truthy)
            if self.memo:
                self.rest -= 1
            return self.value_put(x)
        data = np.asarray(x, self.dtype).tobytes()
        last = self.last
        if (last is not None and data == last[1] and last[2] is not None
                and _host_transfers_unguarded()):
            self.misses = 0
            return last[2]
        array = self.value_put(x)
        self.last = (None, data, array)  # arrays are mutable: never kept alive or compared by id
        self._fresh()
        self._missed()
        return array

    def launch_inline(self, x: str, i: int) -> tuple[str, dict[str, Any]]:
        """`InputStep.launch_inline`: with no memo, a numpy array's private
        copy inline (what `launch_value` does for it), anything else through
        `launch_value`."""
        stage = self.transfer.stage
        if self.memo or stage is None:
            return super().launch_inline(x, i)
        names = {f"L{i}": self.launch_value, "ndarray": np.ndarray}
        # an array straight to its copy, or to the compare (which rests as it says)
        name, to = (f"C{i}", self._compared) if self.compare else (f"T{i}", stage)
        return f"({name}({x}) if type({x}) is ndarray else L{i}({x}))", {**names, name: to}

    def launch_value(self, x: Any) -> Any:
        """What a launch record hands jaxlib's own put for host value `x`
        (`nbjit.core.inputs.launch`): a private copy (the transfer's `stage`;
        `x` itself where no one can write it), or a device array of this
        step's own: the memo's, for a value seen again, or a put read during
        the call where the transfer stages nothing (a big array). A scalar
        that would not convert exactly (`scalar_converts_exactly`) goes as
        it is, for jaxlib to convert as it does for jax.jit; but a Python int
        beyond the dtype's range raises OverflowError here, so that the call
        takes JAX's own path, which raises jax.jit's error.

        The memo works as in `value`, but a new value is not put here (that
        would be a put from Python, which costs more than jaxlib's): the
        memo remembers its bytes (or the scalar object), and only a value
        seen twice in a row is put and kept.
        """
        transfer = self.transfer
        stage = transfer.stage
        if stage is None:
            return self.value(x)
        is_array = type(x) is np.ndarray
        if is_array and self.compare:
            return self._compared(x)
        if is_array and (not self.memo or self.rest > 0):
            if self.memo:
                self.rest -= 1
            return stage(x)
        if self.memo:
            data = np.asarray(x, self.dtype).tobytes() if is_array else None
            last = self.last
            if (last is not None and (data == last[1] if is_array else x is last[0])
                    and _host_transfers_unguarded()):
                self.misses = 0
                if last[2] is not None:
                    return last[2]
                array = self.value_put(x)
                self.last = (last[0], data, array)
                return array
            self.last = (None, data, None) if is_array else (x, None, None)
            if is_array:
                self._missed()
            self._fresh()
        if is_array:
            return stage(x)
        if transfer.stage_scalar is not None and scalar_converts_exactly(x, self.dtype):
            return transfer.stage_scalar(x)
        if type(x) is int:  # beyond the dtype's range: JAX's own path raises as jax.jit
            raise OverflowError(f"{x} does not fit {self.dtype}")
        return x

    def _compared(self, x: np.ndarray) -> Any:
        """`launch_value` for an array where the step compares (`compare`):
        the held copy's device array where `x` has its bytes, else `x`'s
        private copy, held for the next call."""
        stage = self.transfer.stage
        assert stage is not None  # (`compare` is only where the transfer stages)
        if self.rest > 0:  # (threads may race on `rest`: > 0, not truthy)
            self.rest -= 1
            return stage(x)
        held = self.held
        if (held is not None and x.dtype is self.dtype and x.flags.c_contiguous
                and not memcmp(held[1], x.__array_interface__["data"][0], self.nbytes)  # type: ignore[misc]
                and _host_transfers_unguarded()):
            self.misses = 0
            if held[2] is None:  # the copy's first repeat: put it once (zero copy: it is ours)
                array = _device_put(self.aval, self.sharding, [held[0]], self.devices, False, False,
                                    self.transfer.semantics)
                held = self.held = (held[0], held[1], array)
            return held[2]
        staged = stage(x)
        # (resting, it holds nothing: the copy goes back to its ring)
        self.held = None if self._missed() else (staged, staged.__array_interface__["data"][0],
                                                 None)
        self._fresh()
        return staged

    def _missed(self) -> bool:
        """Counts a miss of the memo or the compare (a new value); after
        `MEMO_PATIENCE` in a row the step rests `MEMO_REST` calls (True)."""
        self.misses += 1
        if self.misses < self.MEMO_PATIENCE:
            return False
        self.misses, self.rest = 0, self.MEMO_REST
        return True

    def _fresh(self) -> None:
        """Tells `on_fresh`'s callback, if it still lives, of a new value."""
        if (on_fresh := self.on_fresh) is not None and (fresh := on_fresh()) is not None:
            fresh()

    def value_put(self, x: Any) -> Any:
        """`x`'s device array, put by this step (staged as its transfer says)."""
        transfer = self.transfer
        if type(x) is not np.ndarray:
            return _device_put(self.aval, self.sharding, [x], self.devices, False)
        return _device_put(self.aval, self.sharding,
                           [x if transfer.stage is None else transfer.stage(x)],
                           self.devices, False, False, transfer.semantics)


class _Copy(InputStep):
    """A one-device jax.Array on another device: copied in C++, as jaxlib does.

    A launch record hands the array to jaxlib as it is: jaxlib copies it.

    As jaxlib's IFRT CopyArrays, the copy is below the layer that applies
    device-to-device transfer guards: a hit copies under "disallow" too.
    """

    __slots__ = ("device_list", "sharding")

    def __init__(self, index: int, sharding: Any) -> None:
        super().__init__(index)
        self.device_list = _jax.device_list(sharding)
        self.sharding = sharding

    def value(self, x: Any) -> Any:
        return _copy_to_devices([x], [self.device_list], [self.sharding])[0]


class _Planned(InputStep):
    """A host value sliced/copied on the host by its `ShardingPlan`."""

    __slots__ = ("dtype", "plan")
    puts_host_values = True

    def __init__(self, index: int, dtype: np.dtype, plan: Any) -> None:
        super().__init__(index)
        self.dtype = dtype
        self.plan = plan

    def value(self, x: Any) -> Any:
        return self.plan.put(np.asarray(x, self.dtype))

    launch_value = value  # (a launch record hands jaxlib the plan's device array)


class ShardArgs:
    """Inputs JAX's own `shard_args` converts (reshardings, unusual values), in one call."""

    __slots__ = ("indices", "shardings")
    puts_host_values = False

    def __init__(self, indices: Sequence[int], shardings: Sequence[Any]) -> None:
        self.indices = tuple(indices)
        self.shardings = list(shardings)

    def apply(self, inputs: list) -> None:
        indices = self.indices
        converted = _jax.pxla_shard_args(self.shardings, [None] * len(indices),
                                         [inputs[i] for i in indices])
        for i, value in zip(indices, converted, strict=True):
            inputs[i] = value


SHARD_ARGS = object()  # `input_step`'s answer: leave this input to `ShardArgs`


def _array_step(i: int, x: Any, sharding: Any) -> Any:
    if _same_placement(x, sharding):
        return None
    if len(_jax.array_sharding(x).device_set) == 1 and len(sharding.device_set) == 1:
        # A device of another process (none addressable here): as jaxlib's
        # PrepareIfrtInputs, the array goes to the executable as it is.
        return _Copy(i, sharding) if len(_jax.device_list(sharding)) else None
    return SHARD_ARGS


def _host_step(i: int, x: Any, sharding: Any, donated: bool,
               on_fresh: FreshCallback | None) -> Any:
    dtype = host_dtype(x, canonical_dtypes[_jax.enable_x64.value])
    if dtype is None or not len(_jax.device_list(sharding)):
        return SHARD_ARGS  # not a host value, or no device of this process: JAX's way
    nbytes = np.size(x) * dtype.itemsize
    if len(sharding.device_set) == 1:
        strategy = strategy_for(platform_of(sharding))
        if nbytes < _plan.SINGLE_DEVICE_PLAN_MIN_BYTES or not strategy.plans_big_leaves:
            memo = not donated and nbytes <= HostInput.MEMO_MAX_BYTES
            weak = type(x) in _WEAK_SCALAR_TYPES
            aval = _jax.ShapedArray(np.shape(x), dtype, weak_type=weak)
            transfer = strategy.host_transfer(aval, sharding)
            return HostInput(i, dtype, aval, sharding, memo, on_fresh, transfer,
                             compare=not donated and not memo)
    plan = _plan.plan_for(sharding, np.shape(x), dtype)
    return SHARD_ARGS if plan is None else _Planned(i, dtype, plan)


def input_step(i: int, x: Any, sharding: Any, donated: bool,
             on_fresh: FreshCallback | None = None) -> Any:
    """The step for input `i` (None: none needed; `SHARD_ARGS`: JAX's `shard_args`).

    `on_fresh`: given to a `HostInput`, which calls it on each value it
    transfers while its memo looks (a memo miss: a new value).
    """
    t = type(x)
    if t is ArrayImpl:
        return _array_step(i, x, sharding)
    if t is np.ndarray or t in PYTHON_SCALAR_DTYPES or isinstance(x, np.generic):
        return _host_step(i, x, sharding, donated, on_fresh)
    return SHARD_ARGS


def input_steps(inputs: Sequence[Any], shardings: Sequence[Any], donated: bool,
                on_fresh: Mapping[int, FreshCallback] | None = None
                ) -> tuple[dict[int, InputStep], ShardArgs | None]:
    """(input index -> its step, for the inputs that need one; the batched
    `shard_args` step of the rest, or None), for a record whose miss saw
    `inputs` bound for `shardings`. `on_fresh`: input index -> the callback
    its `HostInput` is built with."""
    steps, shard_args = {}, []
    for i, (x, sharding) in enumerate(zip(inputs, shardings, strict=True)):
        step = input_step(i, x, sharding, donated, None if on_fresh is None else on_fresh.get(i))
        if step is SHARD_ARGS:
            shard_args.append(i)
        elif step is not None:
            steps[i] = step
    batched = ShardArgs(shard_args, [shardings[i] for i in shard_args]) if shard_args else None
    return steps, batched


def _same_placement(x: Any, sharding: Any) -> bool:
    xs = _jax.array_sharding(x)
    if xs is sharding or xs == sharding:
        return True
    try:
        return bool(xs.is_equivalent_to(sharding, x.ndim))
    except Exception:  # different sharding types JAX cannot compare: convert
        return False
