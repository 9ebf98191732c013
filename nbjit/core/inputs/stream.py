"""A host copy with non-temporal stores, for the private copies an accelerator's transfers read.

A launch record copies each new writeable host array into a private staging
buffer (`nbjit.core.inputs.staging.StagingRing`) that only the runtime's
transfer reads next. While it copies, the transfers of earlier calls read
host memory too; a copy whose stores skip the caches (LLVM's
``!nontemporal``: ``movnt`` on x86-64, ``stnp`` on arm64) does not read its
destination's lines first, and measured steadier than numpy's copy there
(docs/host-inputs.md, "Accelerators").

The loop is a few lines of LLVM IR compiled once per process through
llvmlite (numba's backend, installed with it) and called through ctypes,
which releases the GIL: importing numba itself costs a process about a
second, llvmlite's binding a tenth of that, and the compile milliseconds.
`start()` compiles it on a thread of its own, begun by ``import nbjit``
where an accelerator is expected (`platforms.at_import`), else as the first
miss on a platform whose strategy launches begins (`platforms.before_miss`:
JAX's compile leaves the GIL free meanwhile), else by the first staging ring
of `STREAM_MIN_BYTES` or more; `ready()` hands it over once it is done.
Until then a ring copies with numpy, so no call waits for the compile
(either copy writes the same bytes); `stream_copy()` waits for it. Where
llvmlite is missing or the compile fails there is none: numpy's copy is
used, and the process's fallbacks say why (`nbjit.core.inputs.fallbacks`).
A process forked while the compile runs has no such thread: it starts its
own when next asked.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from nbjit.core.inputs.fallbacks import gave_up

__all__ = ["PENDING", "STREAM_COPY", "STREAM_MIN_BYTES", "ready", "start", "started",
           "stream_copy"]

STREAM_COPY = "non-temporal copy"  # the strategy's name, where it is given up

# From this size a staged leaf is copied with non-temporal stores (below it a
# copy is short enough that the call into the loop and the fence cost more
# than the caches save).
STREAM_MIN_BYTES = 256 << 10

_BLOCK = 64  # bytes a loop iteration copies: two 32-byte stores

_IR = r"""
define void @nbjit_stream_copy(i8* %dst, i8* %src, i64 %blocks) {
entry:
  %none = icmp eq i64 %blocks, 0
  br i1 %none, label %exit, label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %at0 = mul i64 %i, 64
  %at1 = add i64 %at0, 32
  %s0 = getelementptr i8, i8* %src, i64 %at0
  %s1 = getelementptr i8, i8* %src, i64 %at1
  %d0 = getelementptr i8, i8* %dst, i64 %at0
  %d1 = getelementptr i8, i8* %dst, i64 %at1
  %cs0 = bitcast i8* %s0 to <4 x i64>*
  %cs1 = bitcast i8* %s1 to <4 x i64>*
  %cd0 = bitcast i8* %d0 to <4 x i64>*
  %cd1 = bitcast i8* %d1 to <4 x i64>*
  %v0 = load <4 x i64>, <4 x i64>* %cs0, align 1
  %v1 = load <4 x i64>, <4 x i64>* %cs1, align 1
  store <4 x i64> %v0, <4 x i64>* %cd0, align 32, !nontemporal !0
  store <4 x i64> %v1, <4 x i64>* %cd1, align 32, !nontemporal !0
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %blocks
  br i1 %done, label %exit, label %loop
exit:
  fence seq_cst
  ret void
}
!0 = !{i32 1}
"""

_lock = threading.Lock()
_UNTRIED = object()
PENDING = object()  # what `ready()` answers while the compile runs
_compiled: Any = _UNTRIED  # PENDING, then the copy (its engine kept alive with it) or None
_done = threading.Event()


def start() -> None:
    """Begins the compile on a daemon thread, once per process (no wait)."""
    global _compiled
    if _compiled is _UNTRIED:
        with _lock:
            if _compiled is not _UNTRIED:
                return
            _compiled = PENDING
        try:
            threading.Thread(target=_compile_then_publish, name="nbjit stream copy compile",
                             daemon=True).start()
        except RuntimeError as error:  # no thread to be had: numpy's copy, and why
            gave_up(STREAM_COPY, error)
            _compiled = None
            _done.set()


def started() -> bool:
    """Whether the compile was begun (it may be done)."""
    return _compiled is not _UNTRIED


def ready() -> Any:
    """The compiled copy, None where there is none, or `PENDING` while it
    compiles (and where `start()` was not called yet: it is called now)."""
    if _compiled is _UNTRIED:
        start()
    return _compiled


def stream_copy() -> Callable[[np.ndarray, np.ndarray], None] | None:
    """``copy(dst, src)``: `src`'s bytes into `dst` with non-temporal stores,
    for two C-contiguous arrays of one size (the caller checks); a `dst` not
    64-byte aligned (a streamed store there faults) and the last partial
    64 bytes are copied by numpy. None where it cannot be compiled here.
    Waits for the compile (`start()`s it where no one did)."""
    start()
    _done.wait()
    return _compiled


def _forget_a_compile_in_flight() -> None:
    """In a forked child: a compile the parent had running has no thread here."""
    global _compiled, _done
    if _compiled is PENDING:
        _compiled = _UNTRIED
        _done = threading.Event()


os.register_at_fork(after_in_child=_forget_a_compile_in_flight)


def _compile_then_publish() -> None:
    global _compiled
    try:
        copy = _compile()
    except Exception as error:  # (on its own thread: nothing else would say why)
        gave_up(STREAM_COPY, error)
        copy = None
    _compiled = copy
    _done.set()


def _compile() -> Callable[[np.ndarray, np.ndarray], None] | None:
    try:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        module = llvm.parse_assembly(_IR)
        module.verify()
        machine = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
            opt=2)
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        address = engine.get_function_address("nbjit_stream_copy")
    except Exception as error:  # no llvmlite, or no native target: numpy's copy, and why
        gave_up(STREAM_COPY, error)
        return None
    loop = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)

    def copy(dst: np.ndarray, src: np.ndarray) -> None:
        d = dst.reshape(-1).view(np.uint8)
        s = src.reshape(-1).view(np.uint8)
        if d.ctypes.data % _BLOCK:
            np.copyto(d, s)
            return
        blocks = s.shape[0] // _BLOCK
        loop(d.ctypes.data, s.ctypes.data, blocks)
        if blocks * _BLOCK < s.shape[0]:
            d[blocks * _BLOCK:] = s[blocks * _BLOCK:]

    copy.engine = engine  # type: ignore[attr-defined]  # the machine code lives as long as it
    raw = np.zeros(4 * _BLOCK, np.uint8)
    skip = -raw.ctypes.data % _BLOCK
    probe, source = raw[skip:skip + 2 * _BLOCK], np.arange(2 * _BLOCK, dtype=np.uint8)
    copy(probe, source)  # (aligned: the loop itself runs)
    if probe.tobytes() != source.tobytes():
        gave_up(STREAM_COPY, "its trial copy wrote other bytes")
        return None
    return copy
