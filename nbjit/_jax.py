"""Every import of JAX internals in nbjit lives here, behind a version check.

The rest of nbjit talks to JAX through the names this module exports (and
its public API). When a new jax release moves something, this is the one
file to mend, except for the private attributes of JAX objects that other
modules read directly, all of them listed here (docs/design.md, "Where JAX
is touched"):
  * ``x._committed`` and ``x._sharding`` of a `jax.Array`, for speed, as
    jaxlib's C++ reads the same fields: in the generated binders and keyers
    (`nbjit.core.binders`, `nbjit.core.keys`; their source text) and in
    `nbjit.core.keys.leaf_signature` and `nbjit.observe.explain`; off the
    hit path, through `array_sharding` here (`nbjit.core.inputs.steps`).
A sharding's device order is read here (`device_assignment`,
`addressable_device_assignment`, `gspmd_parts`).
"""

from __future__ import annotations

import contextlib
import sys
import types
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jaxlib

from nbjit._common import drop_internal_links, traceback_without

# [lowest, first unsupported). 0.10.2 is what the TPU machines ship (jaxlib's
# last wheels for Python 3.11); where 0.10.x's internals or its fast path
# differ from 0.11.2+, the names below say so (JAXLIB_VERSION checks).
SUPPORTED_JAX = ((0, 10, 2), (0, 13, 0))


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in piece if c.isdigit()) or 0)
                 for piece in version.split(".")[:3])


JAX_VERSION = _version_tuple(jax.__version__)
JAXLIB_VERSION = _version_tuple(jaxlib.__version__)
if not (SUPPORTED_JAX[0] <= JAX_VERSION < SUPPORTED_JAX[1]):
    raise ImportError(f"nbjit supports jax >= 0.10.2, < 0.13 (found jax {jax.__version__}); "
                      "install a supported version, e.g. pip install 'jax>=0.10.2,<0.13'")

# ruff: noqa: E402
from jax._src import api as _api
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dtypes as _dtypes
from jax._src import sharding_impls as _sharding_impls
from jax._src import source_info_util as _source_info_util
from jax._src import traceback_util as _traceback_util
from jax._src import tree_util as _tree_util
from jax._src import util as _util
from jax._src import xla_bridge as _xla_bridge
from jax._src.interpreters import pxla as _pxla
from jax._src.lib import _jax as _jaxlib_ext
from jax._src.lib import _profiler as _jaxlib_profiler

NBJIT_DIR = __file__.rsplit("/", 1)[0]
_NBJIT_PREFIX = NBJIT_DIR + "/"  # a frame of nbjit's code: a module's or a generated binder's

# JAX's own jit, where JAX defines it: the public `jax.jit` may be rebound to
# `nbjit.jit` (`nbjit.patch_jax()`), and nbjit must still reach upstream's.
jax_jit = _api.jit

# Errors that name the caller's source location skip nbjit's frames, as they
# skip jax's own; so do tracebacks filtered at a JAX api boundary.
_source_info_util.register_exclusion(NBJIT_DIR)
_traceback_util.register_exclusion(NBJIT_DIR)

ArrayImpl = _jaxlib_ext.ArrayImpl
JaxRuntimeError = jax.errors.JaxRuntimeError
ExecuteResults = _jaxlib_ext.ExecuteResults
# A hit given an array donated to an earlier call: from jaxlib 0.11.2 on, the
# fast path finds it while computing the call's signature and JAX's path raises
# RuntimeError ("Array has been deleted"). Before 0.11.2 only arrays deleted by
# `.delete()` are found there; a donated one reaches the runtime, which rejects
# it (INVALID_ARGUMENT, a line on stderr), raised as ValueError.
RUNTIME_REJECTS_DONATED_INPUTS = JAXLIB_VERSION < (0, 11, 2)


def _ready_unless_deleted(x: Any) -> bool:
    """`ArrayImpl.is_ready(x)`, where a deleted `x` raises RuntimeError first:
    jaxlib 0.10.2's `is_ready` of an array deleted by `.delete()` crashes the
    process (a donated one raises, as in 0.12). Anything else raises TypeError."""
    if type(x) is ArrayImpl and x.is_deleted():
        raise JaxRuntimeError("Array has been deleted.")
    return ArrayImpl.is_ready(x)


# Whether an output is ready (a resident slot's fence, `nbjit.host`): a deleted
# one raises RuntimeError. Checked first below 0.12 (the newest leg is checked
# not to need it: tests/test_resident.py).
array_ready = ArrayImpl.is_ready if JAXLIB_VERSION >= (0, 12) else _ready_unless_deleted


def donated_input_rejected(error: BaseException, inputs: Sequence[Any]) -> bool:
    """Whether `error`, raised by running an executable on `inputs`, is the
    runtime rejecting an array donated to an earlier call, which jaxlib before
    0.11.2 raises as ValueError from its fast path: some input was donated and
    none deleted by `.delete()` (that one jaxlib finds first: RuntimeError)."""
    if not RUNTIME_REJECTS_DONATED_INPUTS or not isinstance(error, JaxRuntimeError):
        return False
    deleted = [x for x in inputs if type(x) is ArrayImpl and x.is_deleted()]
    return bool(deleted) and not any(map(_deleted_by_delete, deleted))


def _deleted_by_delete(x: Any) -> bool:  # by `.delete()`, not donation (that keeps it)
    try:
        x.on_device_size_in_bytes()
    except Exception:
        return True
    return False


# Frees what was dropped off the GIL, as jaxlib's PjitFunction does per call.
collect_garbage = _jaxlib_ext.collect_garbage
# From sharding_impls, where it is defined: jax 0.12.1 deprecates the public
# name, and a project whose tests turn warnings into errors must load nbjit.
SingleDeviceSharding = _sharding_impls.SingleDeviceSharding
NamedSharding = jax.sharding.NamedSharding

# The C++ tuple of every config value that enters a jit key (one C++ call).
trace_context = _config.trace_context
enable_x64 = _config.enable_x64
disable_jit = _config.disable_jit
debug_nans = _config.debug_nans
dispatch_registry = _tree_util.dispatch_registry  # the registry jit flattens with
flatten_for_dispatch = dispatch_registry.flatten
# The types registered as pytree nodes through jax.tree_util's public functions
# (each records its type here too): a type absent from it is a node only as
# JAX's built-ins are (a namedtuple). Live: later registrations show.
pytree_registrations: dict = _tree_util._registry

python_scalar_types = frozenset(_dtypes.python_scalar_types)
REUSE_INPUT = _jaxlib_ext.ArrayCopySemantics.REUSE_INPUT
HostBufferSemantics = _jaxlib_ext.HostBufferSemantics
canonicalize_dtype = _dtypes.canonicalize_dtype
ShapedArray = _core.ShapedArray
Tracer = _core.Tracer
Ref = _core.Ref  # jax.new_ref's mutable array (also flax nnx ref-mode variables)
block_until_ready = jax.block_until_ready
batched_device_put = _jaxlib_ext.batched_device_put
batched_copy_array_to_devices_with_sharding = (
    _jaxlib_ext.batched_copy_array_to_devices_with_sharding)


def device_list(sharding):
    """The jaxlib DeviceList a sharding's addressable shards live on."""
    return sharding._internal_device_list.addressable_device_list


def result_handler(aval, sharding, committed: bool):
    """The handler that wraps one raw output buffer into a jax.Array."""
    return _pxla.global_aval_to_result_handler(aval, sharding, committed)


def jaxlib_launcher(name: str, fun, cache_miss, cache):
    """A jaxlib `PjitFunction` over a call's flat leaves: no static arguments,
    `cache_miss(*leaves)` returning ``(outputs, fast-path data, False)`` as
    JAX's own miss does, `fun(*leaves)` run where jaxlib runs Python (under
    `disable_jit`). What `jax._src.pjit._pjit_call_impl` itself makes; its
    hits are jaxlib's C++ fast path: key, put host leaves, run, outputs.
    One `fun` object per launcher: jaxlib keys its cache by it."""
    return _jaxlib_ext.pjit(name, fun, cache_miss, [], [], "nbjit-launch", dispatch_registry,
                            _pxla.cc_shard_arg, cache)


def jaxlib_launcher_cache(capacity: int):
    """A jaxlib cache of launchers' entries (`jaxlib_launcher`), shared by them."""
    return _jaxlib_ext.PjitFunctionCache(capacity=capacity)


def pxla_shard_args(shardings, layouts, args):
    """JAX's own (Python) argument sharding, used off the fast path."""
    return _pxla.shard_args(shardings, layouts, [REUSE_INPUT] * len(args), args)


def is_top_level_trace() -> bool:
    return _core.trace_ctx.is_top_level()


def jit_info(jitted):
    """The validated options record (PjitInfo) of a `jax.jit` object."""
    return jitted._jit_info


def jit_global_cache_key(info):
    """The hashable record of jit options that are not part of a call key (as
    `pjit._cpp_pjit`: two jits of one function with equal options share executables)."""
    return _pxla.JitGlobalCppCacheKeys(
        donate_argnums=info.donate_argnums,
        donate_argnames=info.donate_argnames,
        device=info.device,
        backend=info.backend,
        in_shardings_treedef=info.in_shardings_treedef,
        in_shardings_leaves=info.in_shardings_leaves,
        out_shardings_treedef=info.out_shardings_treedef,
        out_shardings_leaves=info.out_shardings_leaves,
        in_layouts_treedef=info.in_layouts_treedef,
        in_layouts_leaves=info.in_layouts_leaves,
        out_layouts_treedef=info.out_layouts_treedef,
        out_layouts_leaves=info.out_layouts_leaves,
        compiler_options_kvs=info.compiler_options_kvs,
    )


def cache_miss_of(jitted):
    """JAX's own trace/lower/compile for one call: `(*args, **kwargs) -> (outputs,
    fastpath_or_None, rebuild_with_fdo)`, exactly what jaxlib's C++ `PjitFunction` gets."""
    return jitted._cache_miss


def live_executables(backend=None) -> list:
    """The client's live loaded executables (for leak checks)."""
    return _xla_bridge.get_backend(backend).live_executables()


def addressable_device_assignment(sharding):
    return sharding._addressable_device_assignment


def device_assignment(sharding):
    """The devices of `sharding` in its own order (every process's, not only this one's)."""
    return sharding._device_assignment


def array_sharding(x):
    """A jax.Array's sharding, read as jaxlib does (off the hit path)."""
    return x._sharding


def gspmd_parts(sharding) -> tuple:
    """(HloSharding, device assignment list) of a GSPMDSharding."""
    return sharding._hlo_sharding, list(sharding._device_assignment)


# --- shardings: device lists, replication, avals ---
try:
    from jax._src.sharding_impls import GSPMDSharding
except ImportError:  # removed in some later jax; nbjit.core.inputs.plans then skips it
    GSPMDSharding = None  # type: ignore[misc, assignment]
from jax._src.lib import xla_client as _xla_client  # noqa: E402

OP_SHARDING_REPLICATED = _xla_client.OpSharding.Type.REPLICATED


def hlo_is_replicated(hlo_sharding) -> bool:
    """As `op_shardings.is_hlo_sharding_replicated` (one device counts as replicated)."""
    return hlo_sharding.num_devices() == 1 or hlo_sharding.is_replicated()


def aval_with_sharding(aval, sharding):
    """The aval a jax.Array with `sharding` carries (mesh axes for NamedSharding)."""
    return _core.update_aval_with_sharding(aval, sharding)


# Transfer guards as jaxlib's C++ reads them: a thread-local level, else the global one.
_guard_global = _config.guard_lib.global_state()
_guard_thread_local = _config.guard_lib.thread_local_state
_GUARD_ALLOW = _config.guard_lib.TransferGuardLevel.ALLOW


def host_transfers_unguarded() -> bool:
    """True when a host-to-device transfer now would neither log nor raise."""
    level = _guard_thread_local().host_to_device
    if level is None:
        level = _guard_global.host_to_device
    return level is None or level == _GUARD_ALLOW


# Marks the transfers inside as explicit (jax.device_put's), for transfer guards.
explicit_device_put_scope = _config.explicit_device_put_scope


# Set while jax_debug_nans/infs is on (thread-local or global): jaxlib's C++
# fast path then hands every call's outputs to it; nbjit sends such calls to
# JAX's own path, which checks them.
post_hook_state = _api._post_hook_state


def copy_to_devices_unguarded(arrays, device_lists, shardings):
    """`batched_copy_array_to_devices_with_sharding` that no d2d transfer guard sees.

    jaxlib's fast path moves a one-device input to the executable's device
    with IFRT CopyArrays, below the layer that applies transfer guards, so a
    hit copies even under `transfer_guard_device_to_device("disallow")` (and
    logs nothing under "log"); the Python binding would apply the guard.
    The thread-local level is set to allow for the copy and then restored.
    """
    state = _guard_thread_local()
    old = state.device_to_device
    state.device_to_device = _GUARD_ALLOW
    try:
        return batched_copy_array_to_devices_with_sharding(
            arrays, device_lists, shardings, [REUSE_INPUT] * len(arrays))
    finally:
        state.device_to_device = old


# --- profiler spans: jaxlib's TraceMe ---

# A span on the profiler's host timeline: ``with TraceMe(name):``. The same
# C++ TraceMe jaxlib's PjitFunction opens around every call; building one
# costs a few hundred ns even when no profiler session is collecting.
TraceMe = _jaxlib_profiler.TraceMe
# True while any profiler session collects host spans: `jax.profiler.trace`,
# `start_trace`, or a capture requested from outside the process through
# `jax.profiler.start_server` (TensorBoard's capture button). One C++ read.
traceme_enabled = TraceMe.is_enabled

# --- the jit object's surface: names, config caches, tracebacks ---

# The name jaxlib's PjitFunction records (`__getstate__()["function_name"]`):
# `__name__`, else that of the function a functools.partial wraps.
fun_name = _util.fun_name

# `with jax.config.jax_jit_cpp_cache_obj(cache):` makes jit objects created
# inside use `cache` (a jaxlib PjitFunctionCache) instead of the global one.
jit_cpp_cache_obj = _config.jax_jit_cpp_cache_obj

# `jax.clear_caches()` calls `cache_clear()` on every cache registered here
# (held by weak reference).
register_cache = _util.register_cache

# Tracebacks: `api_boundary` filters JAX's (and nbjit's) frames out of an
# exception's traceback, as every JAX transformation does.
api_boundary = _traceback_util.api_boundary


def filter_dispatch_frames(error: BaseException) -> None:
    """Removes nbjit's and JAX's frames from `error`'s traceback, as jaxlib shows none.

    Called where an exception leaves a jitted function's `__call__` (never on
    a hit). Follows JAX's `JAX_TRACEBACK_FILTERING` mode as `api_boundary`
    does: "off" keeps everything; under an outer api boundary the outer one
    filters; "tracebackhide" marks JAX's frames for IPython/pytest to hide
    and drops nbjit's; the remove modes drop both. JAX's own boundary below
    (the miss path) has already filtered its part and added its note or
    unfiltered cause, so nothing is added here. In every mode, "off" too,
    the exceptions nbjit caught on its way to JAX's path leave the chain
    (`nbjit._common.drop_internal_links`).
    """
    # the frame of the call that failed
    drop_internal_links(error, sys._getframe(1), _NBJIT_PREFIX)
    mode = _traceback_util._filtering_mode()
    tb = error.__traceback__
    if mode == "off" or tb is None:
        return
    frame = tb.tb_frame.f_back
    while frame is not None:
        if _traceback_util._is_reraiser_frame(frame):
            return  # an outer api boundary filters the whole traceback
        frame = frame.f_back
    if mode == "tracebackhide":
        # JAX's frames marked, as its api boundary marks them; nbjit's removed:
        # IPython shows the innermost frame even when marked, and with jaxlib's
        # C++ raising (an unhashable static argument) that would be nbjit's.
        _traceback_util._add_tracebackhide_to_hidden_frames(tb)
        error.with_traceback(traceback_without(tb, _NBJIT_PREFIX))
    else:
        error.with_traceback(_traceback_util.filter_traceback(tb))


def drop_frames_of(error: BaseException, code: types.CodeType) -> None:
    """Unlinks the frames running `code` from `error`'s traceback (but the first, the
    catcher's), unless JAX_TRACEBACK_FILTERING is "off" (every frame shown)."""
    kept = error.__traceback__
    while kept is not None and _traceback_util._filtering_mode() != "off" and (
            tb := kept.tb_next) is not None:
        if tb.tb_frame.f_code is code:
            kept.tb_next = tb.tb_next
        else:
            kept = tb


# --- observability: config names, JAX's own cache counters ---
from jax._src import pjit as _pjit  # noqa: E402

# The config option each position of `trace_context()` stands for (jax 0.11.2
# and 0.12 both expose it; the tuples line up).
trace_context_names = _config.trace_context_names
explain_cache_misses = _config.explain_cache_misses


def jax_cache_misses() -> tuple[int, int]:
    """(tracing misses, compile misses) of JAX's own in-memory caches so far.

    Read before and after nbjit's miss: unchanged numbers mean JAX traced
    and compiled nothing new for it.
    """
    return (_pjit._infer_params_cached.cache_info().misses,
            _pxla._cached_compilation.cache_info().misses)


def jaxpr_has_effects(jitted, args, kwargs) -> bool:
    """Whether the traced function has effects (JAX's tracing cache answers)."""
    return bool(jitted.trace(*args, **kwargs).jaxpr.effects)


# --- multi-controller: process ranks and the distributed key-value store ---
from jax._src import distributed as _distributed  # noqa: E402

process_count = jax.process_count
Sharding = jax.sharding.Sharding
process_index = jax.process_index


def distributed_client():
    """The `jax.distributed` client (its key-value store), or None without one."""
    return getattr(_distributed.global_state, "client", None)


def sharding_process_count(sharding) -> int:
    """How many processes own devices of `sharding`."""
    return len({d.process_index for d in sharding.device_set})


def kv_set(client, key: str, value: str) -> None:
    client.key_value_set(key, value, allow_overwrite=True)


def kv_dir_get(client, prefix: str) -> list[tuple[str, str]]:
    """Every (key, value) under `prefix` (a "dir/" ending in a slash)."""
    return client.key_value_dir_get(prefix)


def kv_try_get(client, key: str) -> str | None:
    """The value of `key`, or None when it is not set (one round trip, no wait)."""
    try_get = getattr(client, "key_value_try_get", None)
    if try_get is None:  # a client without it: a wait of one millisecond
        return kv_wait(client, key, 1)
    try:
        return try_get(key)
    except JaxRuntimeError as error:
        if "NOT_FOUND" in str(error):
            return None
        raise


def kv_increment(client, key: str, amount: int = 1) -> int:
    """Adds `amount` to the counter at `key` (atomically, in the store); returns the new count."""
    increment = getattr(client, "key_value_increment", None)
    if increment is None:  # the caller treats it as a store that failed: skipped, with a warning
        raise JaxRuntimeError(f"UNIMPLEMENTED: {type(client).__name__} has no "
                              "key_value_increment")
    return int(increment(key, amount))


from jax._src import stages as _stages  # noqa: E402
from jax._src.interpreters import mlir as _mlir  # noqa: E402
from jax._src.interpreters import partial_eval as _pe  # noqa: E402

# --- multi-controller: one program on every process ---


def evict_traces(jitted) -> None:
    """Drops JAX's traces of `jitted`'s function, so that it is traced afresh: as
    `jit(f).clear_cache()`, but neither other functions' traces nor executables."""
    _pe.trace_to_jaxpr.evict_weakref(jitted._fun)
    _pjit._infer_params_cached.evict_weakref(jitted._fun)


@contextlib.contextmanager
def locations_without_callers(stop: types.CodeType) -> Iterator[None]:
    """A context where JAX lowers an operation's location to its innermost frame of
    the user's code alone, not the stack that traced it (default: 100 frames; off
    stays off), `stop`'s file counting as the user's: an operation with no frame
    of its own below `stop` is located there. Messages JAX words while tracing
    are left to name the caller: `stop` is the user's only inside."""
    limit = _config.traceback_in_locations_limit.value
    with _config.traceback_in_locations_limit(0 if limit == 0 else 1):
        _set_user_code(_source_info_util._include_paths.append, stop.co_filename)
        try:
            yield
        finally:
            _set_user_code(_source_info_util._include_paths.remove, stop.co_filename)


def _set_user_code(change: Any, path: str) -> None:  # as register_inclusion, undoable
    change(path)
    _source_info_util._include_path_regex.cache_clear()
    _source_info_util.is_user_filename.cache_clear()


def compile_as_called(jitted, args: tuple, kwargs: dict, stop: types.CodeType) -> Any:
    """Traces, lowers and compiles a call of `jitted` (JAX's jit) as the call
    itself would, running nothing: the call then finds this executable in
    JAX's caches. None where the call takes another route (an outer trace,
    PGLE, key-reuse checks, hijax types). Raises what the call raises while
    tracing or lowering, with the call's message.

    It is lowered under `locations_without_callers(stop)`; a lowering JAX
    cached from elsewhere (`.lower()`, a jax.jit of the function) holds its
    caller's frames, so the function is traced and lowered again.
    """
    if (not _core.trace_state_clean() or _config.debug_key_reuse.value
            or (_config.enable_pgle.value and _config.pgle_profiling_runs.value > 0)):
        return None
    fun, info = jitted._fun, jitted._jit_info
    for _ in range(2):
        p, args_flat = _pjit._infer_params(fun, info, args, kwargs)
        jaxpr = p.params["jaxpr"]
        if getattr(getattr(jaxpr, "jaxpr", jaxpr), "is_high", False) or any(
                getattr(a, "is_high", False) for a in (*jaxpr.in_avals, *jaxpr.out_avals)):
            return None
        arg_types = [_pjit.convert_to_metaty(_core.full_lower(x)) for x in args_flat]
        misses = _pjit._pjit_lower.cache_info().misses
        try:
            with locations_without_callers(stop):
                computation = _pjit._resolve_and_lower(
                    arg_types, **p.params, lowering_platforms=None,
                    lowering_parameters=_mlir.LoweringParameters(), pgle_profiler=None)
        except _stages.DeviceAssignmentMismatchError as error:  # as pjit's call words it
            fails, = error.args
            name = getattr(fun, "__qualname__", getattr(fun, "__name__", str(fun)))
            raise ValueError(_stages._device_assignment_mismatch_error(
                name, fails, arg_types, "jit", p.arg_names)) from None
        if _pjit._pjit_lower.cache_info().misses > misses:  # lowered just now, here
            _lowered_without_callers.add(computation)
        if computation in _lowered_without_callers:
            break
        evict_traces(jitted)  # a new trace is lowered afresh
    return computation.compile()


# JAX's lowerings made by `compile_as_called` (JAX's cache holds them weakly too)
_lowered_without_callers: weakref.WeakSet = weakref.WeakSet()


def executable_fingerprint(compiled) -> bytes | None:
    """What jaxlib (from 0.12.1) derives the launch ids of its executions from, or None."""
    return compiled.xla_executable.fingerprint


def executable_text(compiled) -> str:
    """The compiled program's HLO, its metadata and source locations included."""
    return "\n".join(m.to_string() for m in compiled.xla_executable.hlo_modules())


def kv_wait(client, key: str, timeout_ms: float) -> str | None:
    """The value of `key` once it is set, or None after `timeout_ms`."""
    try:
        return client.blocking_key_value_get(key, max(1, int(timeout_ms)))
    except JaxRuntimeError as error:
        if "DEADLINE_EXCEEDED" in str(error):
            return None
        raise


# --- host buffers: zero-copy puts, reads during the call ---
ZERO_COPY = _jaxlib_ext.HostBufferSemantics.ZERO_COPY  # a host buffer used in place


def buffer_address(x: Any) -> int:
    """A one-device array's buffer address, asked of a throwaway wrapper: asked of
    `x`, jaxlib keeps `x._arrays`, a second array `jax.live_arrays()` lists, with `x`."""
    return x._rewrap_with_aval_and_sharding(x.aval, x.sharding).unsafe_buffer_pointer()

# Host memory is read while the transfer call runs, by contract (on an
# accelerator the call waits for the transfer): the result never aliases the
# caller's array, and a write after the call cannot change it.
COPY_DURING_CALL = _jaxlib_ext.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
_reads_during_call: list[bool] = []  # computed once, at the first question


def default_platform() -> str:
    """The platform of JAX's default backend ("cpu", "tpu", "gpu", ...)."""
    return jax.default_backend()


# Whether JAX's backends are up (asking `default_platform` otherwise starts them).
backends_initialized = _xla_bridge.backends_are_initialized


def jax_path_reads_host_arrays_during_call() -> bool:
    """Whether JAX's own path (jax.jit's miss, `device_put`) has read a numpy array
    it does not use in place (not 64-byte aligned) when the call returns, so a
    write after the call cannot change the result: on the CPU from jaxlib
    0.11.2 on (before, writes right after changed results at 256 KiB to 32
    MiB); never on an accelerator. The default backend is read once."""
    if not _reads_during_call:
        _reads_during_call.append(JAXLIB_VERSION >= (0, 11, 2)
                                  and jax.default_backend() == "cpu")
    return _reads_during_call[0]


# The config state behind the host-to-device transfer guard: None while no one
# set a level (the common case, a cheap read); else `host_transfers_unguarded`
# reads the level jaxlib applies.
transfer_guard_host_to_device = _config.transfer_guard_host_to_device
# Host callbacks in the computation being traced (nbjit.filter: a computation
# that can raise from a callback, as `equinox.error_if` does, is waited on).
_CALLBACK_PRIMITIVES = frozenset({"pure_callback", "io_callback"})


def _eqns_call_back(eqns, seen: set) -> bool:
    for eqn in eqns:
        if type(eqn) is not _core.JaxprEqn and callable(eqn):  # a weakref (auto-DCE)
            eqn = eqn()
            if eqn is None:
                continue
        if eqn.primitive.name in _CALLBACK_PRIMITIVES:
            return True
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                jaxpr = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if isinstance(jaxpr, _core.Jaxpr) and id(jaxpr) not in seen:
                    seen.add(id(jaxpr))
                    if _eqns_call_back(jaxpr.eqns, seen):
                        return True
    return False


def traced_callbacks() -> bool:
    """Whether the jaxpr being traced now holds a host callback (in nested
    jaxprs too). True when the trace cannot be read (be conservative: a
    caller then waits where it need not); False outside a jaxpr trace."""
    trace = _core.trace_ctx.trace
    frame = getattr(trace, "frame", None)
    if frame is None:
        return not isinstance(trace, _core.EvalTrace)
    eqns = getattr(frame, "tracing_eqns", None)
    if eqns is None:
        eqns = getattr(frame, "eqns", None)
    if eqns is None:
        return True
    try:
        return _eqns_call_back(list(eqns), set())
    except Exception:
        return True


def compiled_execute(compiled):
    """The runtime's ``execute_sharded`` of an ahead-of-time compiled
    function (``jax.jit(f).lower(...).compile()``): a call with a list of
    device arrays dispatches it, nothing else."""
    return compiled._executable.xla_executable.execute_sharded


def cpu_async_dispatch() -> bool:
    """Whether the CPU runtime runs computations on its worker threads
    (``jax_cpu_enable_async_dispatch``, read when the client was made);
    False: every computation runs on the calling thread."""
    flag = getattr(_xla_bridge, "_CPU_ENABLE_ASYNC_DISPATCH", None)
    return True if flag is None else bool(flag.value)
