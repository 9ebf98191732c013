"""`filter_jit`: equinox.filter_jit's behaviour on nbjit's dispatcher.

The wrapper is an equinox Module with equinox's fields (so a clone made by
flatten/unflatten shares the jitted function, its cache and its trace
count). A call: bind the arguments as equinox does (skipped for positional
calls the signature accepts as they are), flatten ``(args, kwargs)`` once,
split the leaves into arrays and static leaves, and call the function's
`PjitFunction` (`nbjit.filter.inner.filter_pjit`: nbjit's jit composed with
an extension, through its public surface): nbjit keys the arrays and the
static key in its binder, and a hit runs without entering JAX's Python.

Deliberate difference from equinox: a call waits for its outputs only when
the computation holds a host callback (an `eqx.error_if` check can raise
from one); equinox waits on every call. See docs/filter-jit.md.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import types
import weakref
from collections.abc import Callable
from typing import Any

import jax

from nbjit import _jax
from nbjit.core.dispatch import PjitFunction
from nbjit.core.structure import PARTITION, UNKEYABLE, Readers
from nbjit.filter import _equinox as _eqx
from nbjit.filter.inner import filter_pjit, finish, make_inner, split_inner_args
from nbjit.filter.leaves import array_kinds, is_array, split_leaves
from nbjit.filter.static import FunStatic, partition_fun, static_key
from nbjit.observe import names as _names

__all__ = ["filter_jit"]

_flatten = jax.tree_util.tree_flatten
_call_ids = itertools.count(1)  # next() is atomic under the GIL
_Tracer = _jax.Tracer
_callback_logger = logging.getLogger("jax._src.callback")
MAX_KEYED = 1024  # reader keys remembered per wrapped function; the table starts afresh when full


class _HideCallbackFailure:
    """Hides "jax.pure_callback failed" while a call runs, as equinox's filter.
    One per call (cheap: no state), so a nested call removes only its own."""

    __slots__ = ()
    filter = _eqx.callback_filter


_DONATE = {  # donate= -> (filter_warning, donate_first, donate_rest), as equinox's
    "all": (True, True, True),
    "all-except-first": (True, False, True),
    "warn": (False, True, True),
    "warn-except-first": (False, False, True),
    "none": (False, False, False),
}


class CallPlan:
    """What a call of one wrapped function needs, worked out once: its
    `PjitFunction`, the argument layout, and when binding can be skipped.

    Keyed calls (`_keyed`): `readers` per positional count read a call in one
    pass (`nbjit.core.structure`, equinox's partition); `keys` maps a reader's
    key to the key nbjit's binder gave the same call (`learn`)."""

    __slots__ = ("pjit", "signature", "min_args", "max_args", "layout", "readers", "keys",
                 "__weakref__")

    def __init__(self, pjit: PjitFunction, signature: inspect.Signature,
                 layout: str) -> None:
        self.pjit = pjit
        self.signature = signature
        self.layout = layout  # nbjit.filter.inner.make_inner's
        self.min_args, self.max_args = _positional_range(signature)
        self.readers: dict[int, Readers] = {}
        self.keys: dict[Any, Any] = {}

    def readers_for(self, nargs: int) -> Readers:
        """The readers of calls with `nargs` positional arguments: they read the
        function's arrays, its static part, then the arguments."""
        readers = self.readers.get(nargs)
        if readers is None:
            params = ["fun_arrays", "fun_static", *(f"a{i}" for i in range(nargs))]
            readers = self.readers[nargs] = Readers(params, ("filter_jit", nargs),
                                                    policy=PARTITION)
        return readers

    def learn(self, key: Any, values: tuple, inner_args: tuple) -> None:
        """Remembers which binder key a reader's key stands for (after the call ran).

        Only where the reader's registry (jit's) and equinox's (the default one,
        which `_prepare` flattens with) see the same leaves in `values`: a node
        registered in one of them alone would be a leaf to the reader, keyed by
        its ``==``, and its arrays would never reach the key."""
        ours, theirs = _jax.flatten_for_dispatch(values)[0], _flatten(values)[0]
        if len(ours) != len(theirs) or any(a is not b for a, b in zip(ours, theirs,
                                                                          strict=True)):
            return
        keyed = self.pjit.key_of(inner_args)
        if keyed is None:  # nothing keys it: the general path, always
            return
        if len(self.keys) >= MAX_KEYED:
            self.keys.clear()
        self.keys[key] = keyed[1]


def _positional_range(signature: inspect.Signature) -> tuple[int, int]:
    """(fewest, most) positional arguments that `signature.bind(*args)` returns
    unchanged, with no keywords; (1, 0) (never) when a keyword is required."""
    low = high = 0
    for p in signature.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            high += 1
            if p.default is p.empty:
                low = high
        elif p.kind is p.VAR_POSITIONAL:
            high = 1 << 30
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            return 1, 0
    return low, high


class _JitWrapper(_eqx.Module):
    fn: str  # this attribute exists solely to give a nice repr (as equinox's)
    _signature: inspect.Signature = _eqx.field(static=True, repr=False)
    _dynamic_fun: Any = _eqx.field(repr=False)  # the function's arrays
    _static_fun: Any = _eqx.field(static=True, repr=False)  # FunStatic
    _cached: Any = _eqx.field(static=True, repr=False)  # CallPlan
    filter_warning: bool = _eqx.field(static=True)
    donate_first: bool = _eqx.field(static=True)
    donate_rest: bool = _eqx.field(static=True)

    @property
    def __wrapped__(self) -> Any:
        return self._static_fun.rebuild(list(self._dynamic_fun))

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        try:
            return _call(self, args, kwargs)
        except _eqx.EquinoxRuntimeError as e:  # as equinox: no frames above the call site
            e.__traceback__ = None
            raise

    def lower(self, /, *args: Any, **kwargs: Any) -> Lowered:
        plan, inner_args = _prepare(self, args, kwargs)
        return Lowered(plan.pjit.lower(*inner_args), self)

    def stats(self) -> Any:
        """nbjit's statistics of this wrapped function (`nbjit.DispatchStats`)."""
        return self._cached.pjit.stats()

    def __get__(self, instance: Any, owner: Any) -> Any:
        del owner
        if instance is None:
            return self
        return _eqx.Partial(self, instance)


def _prepare(wrapper: _JitWrapper, args: tuple, kwargs: dict) -> tuple[CallPlan, tuple]:
    """(the plan, the inner function's arguments) for one call."""
    state = object.__getattribute__(wrapper, "__dict__")  # Module.__getattribute__ is slow
    plan = state["_cached"]
    if kwargs or not plan.min_args <= len(args) <= plan.max_args:
        bound = plan.signature.bind(*args, **kwargs)
        args, kwargs = bound.args, bound.kwargs
    fun_static = state["_static_fun"]
    if plan.layout == "except_first":
        return plan, _except_first_args(state["_dynamic_fun"], fun_static, args, kwargs)
    leaves, treedef = _flatten((args, kwargs))
    kinds = array_kinds
    try:
        arrays = [x for x in leaves if kinds[type(x)]]
        statics = tuple([None if kinds[type(x)] else x for x in leaves])
    except KeyError:  # a leaf type not learnt yet, or a tracer
        arrays, statics = split_leaves(leaves)
    static = static_key(fun_static.key, treedef, statics)
    if plan.layout == "spread":
        return plan, (static, *state["_dynamic_fun"], *arrays)
    fun_arrays = state["_dynamic_fun"]
    if fun_arrays:
        arrays = [*fun_arrays, *arrays]
    return plan, (arrays, static)


def _except_first_args(fun_arrays: tuple, fun_static: FunStatic, args: tuple,
                       kwargs: dict) -> tuple:
    """``(donated, kept, static)``: the first argument's arrays are kept."""
    leaves, treedef = _flatten((args, kwargs))
    first = _flatten(args[0])[0] if args else []
    arrays, statics = split_leaves(leaves)
    count = sum(1 for x in first if is_array(x))
    return ([*fun_arrays, *arrays[count:]], arrays[:count],
            static_key(fun_static.key, treedef, statics, count))


def _keyed(wrapper: _JitWrapper, args: tuple, kwargs: dict) -> Any:
    """The inner function's outputs for one call.

    A positional call under the default layout is read in one pass by the
    reader of its structure (no flatten, no lists of leaves, no static key
    built), and a reader key seen before runs the binder's hit path with the
    binder key it stands for: the same node, hits and misses as the general
    path, which everything else takes (keywords, donation, a profile or a
    profiler trace, a tracer among the leaves, a static leaf that cannot be
    hashed or compared).
    """
    state = object.__getattribute__(wrapper, "__dict__")  # Module.__getattribute__ is slow
    plan = state["_cached"]
    pjit = plan.pjit
    if kwargs or plan.layout != "spread" or not plan.min_args <= len(args) <= plan.max_args:
        return pjit(*_prepare(wrapper, args, kwargs)[1])
    readers = plan.readers.get(len(args)) or plan.readers_for(len(args))
    values = (state["_dynamic_fun"], state["_static_fun"].key, *args)
    got = readers.read(*values)
    if got is None or got is UNKEYABLE:
        return pjit(*_prepare(wrapper, args, kwargs)[1])
    key, shardings, leaves = got
    try:  # a static leaf's __hash__ or __eq__ may raise: the general path reports it
        binder_key = plan.keys.get(key)
    except Exception:
        binder_key = None
    if binder_key is None:
        inner_args = _prepare(wrapper, args, kwargs)[1]
        out = pjit(*inner_args)
        try:
            plan.learn(key, values, inner_args)
        except Exception:  # the call ran; learning is best effort
            pass
        return out
    return pjit.call_keyed(leaves, binder_key, shardings,
                           lambda: _prepare(wrapper, args, kwargs)[1])


def _call(wrapper: _JitWrapper, args: tuple, kwargs: dict) -> Any:
    __tracebackhide__ = True
    # eqx.error_if records this frame's id when it traces; bytes unique per call
    # (equinox draws os.urandom(16); a counter is unique in the process and cheaper)
    __equinox_jit_id__ = next(_call_ids).to_bytes(16, "little")
    hide = _HideCallbackFailure()
    _callback_logger.addFilter(hide)
    try:
        out, marker = finish(*_keyed(wrapper, args, kwargs))
        # a marker: the computation can raise at run time (eqx.error_if); wait, as equinox
        if marker is not None and not isinstance(marker, _Tracer) and isinstance(
                marker, jax.Array):
            marker.block_until_ready()
    except (_jax.JaxRuntimeError, ValueError) as e:
        _reraise_runtime_error(e, __equinox_jit_id__)
        _jax.drop_frames_of(e, _keyed.__code__)
        raise
    except BaseException as e:  # equinox shows two frames of its own (__call__, _call): so here
        _jax.drop_frames_of(e, _keyed.__code__)
        raise
    finally:
        _callback_logger.removeFilter(hide)
    return out


def _reraise_runtime_error(error: Exception, jit_id: bytes) -> None:
    """An `eqx.error_if` failure becomes EquinoxRuntimeError with equinox's message."""
    info = _eqx.last_error_info()
    if info is None or "_EquinoxRuntimeError: " not in str(error):
        return
    last_msg, last_stack = info
    pieces: list[str] = []
    for id_or_str in last_stack:
        if type(id_or_str) is str:
            pieces.append(id_or_str)
        elif id_or_str == jit_id:
            break
    raise _eqx.EquinoxRuntimeError(
        _eqx.error_message.format(msg=last_msg, stack="".join(reversed(pieces)))
    ) from None


class Lowered:
    """`wrapper.lower(...)`: `as_text()`, and `compile()` to a callable `Compiled`."""

    def __init__(self, lowered: Any, wrapper: _JitWrapper) -> None:
        self.lowered = lowered
        self._wrapper = wrapper

    def as_text(self) -> str:
        return self.lowered.as_text()

    def compile(self, /, compiler_options: dict[str, str | bool] | None = None) -> Compiled:
        return Compiled(self.lowered.compile(compiler_options=compiler_options), self._wrapper)


class Compiled:
    """A compiled `filter_jit` call: takes the wrapped function's arguments."""

    def __init__(self, compiled: Any, wrapper: _JitWrapper) -> None:
        self.compiled = compiled
        self._wrapper = wrapper

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plan, inner_args = _prepare(self._wrapper, args, kwargs)
        out, marker = finish(*self.compiled(*split_inner_args(plan.layout, inner_args)[0]))
        if marker is not None:
            marker.block_until_ready()
        return out


# ---------------------------------------------------------------------------
# One CallPlan (its inner PjitFunction) per wrapped function (weakly keyed
# when it is a function, else by its names, as equinox's compile cache), per
# options.

_plans_by_function: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_plans_by_name: dict[tuple, CallPlan] = {}


def _plan_for(fun: Callable, signature: inspect.Signature, jitkwargs: dict,
              donate: str) -> CallPlan:
    filter_warning, donate_first, donate_rest = _DONATE[donate]
    except_first = donate_rest and not donate_first
    names = _eqx.get_fn_names(fun)
    try:
        options_key = (tuple(sorted(jitkwargs.items())), filter_warning, donate_rest,
                       except_first)
        hash(options_key)
    except TypeError:  # unhashable jit options: a plan of its own
        options_key = None
    if type(fun) is types.FunctionType:
        table = _plans_by_function.setdefault(fun, {})
        key: Any = options_key
    else:
        table, key = _plans_by_name, (names, options_key)
    plan = table.get(key) if options_key is not None else None
    if plan is None or plan.signature != signature:
        layout = "except_first" if except_first else "list" if donate_rest else "spread"
        argnums = {"spread": 0, "list": 1, "except_first": 2}
        options = dict(jitkwargs, static_argnums=argnums[layout])
        if donate_rest:
            options["donate_argnums"] = 0
        inner = make_inner((*names, getattr(fun, "__module__", None) or __name__), layout, fun)
        pjit = filter_pjit(inner, options, filter_warning, layout, signature)
        _names.name_like(inner, fun)  # stats and misses name the wrapped function
        plan = CallPlan(pjit, signature, layout)
        if options_key is not None:
            table[key] = plan
    return plan


def clear_caches() -> None:
    """`eqx.clear_caches()`: later wrappers trace afresh."""
    _plans_by_function.clear()
    _plans_by_name.clear()


_eqx.cache_clears.append(clear_caches)


def filter_jit(fun: Any = _eqx.sentinel, *, donate: str = "none", **jitkwargs: Any) -> Any:
    """equinox.filter_jit on nbjit's dispatcher: arrays (jax and numpy) are traced,
    every other leaf is static; see docs/filter-jit.md for the differences."""
    if fun is _eqx.sentinel:
        return functools.partial(filter_jit, donate=donate, **jitkwargs)
    for name in ("default", "fn", "args", "kwargs", "out"):
        _eqx.deprecated_0_10(jitkwargs, name)
    if any(x in jitkwargs for x in ("static_argnums", "static_argnames", "donate_argnums",
                                    "in_shardings", "out_shardings")):
        raise ValueError(
            "`jitkwargs` cannot contain 'static_argnums', 'static_argnames', "
            "'donate_argnums', 'in_shardings', or 'out_shardings'.")
    signature = inspect.signature(fun)
    if donate not in _DONATE:
        raise ValueError(
            "`filter_jit(..., donate=...)` must be one of 'all', 'all-except-first', "
            "'warn', 'warn-except-first', or 'none'.")
    filter_warning, donate_first, donate_rest = _DONATE[donate]
    _, name = _eqx.get_fn_names(fun)
    dynamic_fun, static_fun = partition_fun(fun)
    wrapper = _JitWrapper(
        fn=name, _signature=signature, _dynamic_fun=dynamic_fun, _static_fun=static_fun,
        _cached=_plan_for(fun, signature, jitkwargs, donate),
        filter_warning=filter_warning, donate_first=donate_first, donate_rest=donate_rest)
    return _eqx.module_update_wrapper(wrapper)
