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

import atexit
import ctypes
import os
import threading
import time
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


define internal i64 @field(i64* %state, i64 %i) alwaysinline {
  %p = getelementptr i64, i64* %state, i64 %i
  %v = load i64, i64* %p, align 8
  ret i64 %v
}

; Claims chunks of the current job one at a time and copies each, until none is left.
define internal void @drain(i64* %state) {
entry:
  br label %claim
claim:
  %t = load atomic i64, i64* %state acquire, align 8
  %idx = and i64 %t, 1048575
  %hi = lshr i64 %t, 20
  %n = and i64 %hi, 1048575
  %left = icmp ult i64 %idx, %n
  br i1 %left, label %take, label %exit
take:
  %t1 = add i64 %t, 1
  %r = cmpxchg i64* %state, i64 %t, i64 %t1 acq_rel acquire
  %ok = extractvalue { i64, i1 } %r, 1
  br i1 %ok, label %copy, label %claim
copy:
  %dst = call i64 @field(i64* %state, i64 16)
  %src = call i64 @field(i64* %state, i64 17)
  %chunk = call i64 @field(i64* %state, i64 18)
  %total = call i64 @field(i64* %state, i64 19)
  %first = mul i64 %idx, %chunk
  %rest = sub i64 %total, %first
  %small = icmp ult i64 %rest, %chunk
  %count = select i1 %small, i64 %rest, i64 %chunk
  %at = mul i64 %first, 64
  %d = add i64 %dst, %at
  %s = add i64 %src, %at
  %dp = inttoptr i64 %d to i8*
  %sp = inttoptr i64 %s to i8*
  call void @nbjit_stream_copy(i8* %dp, i8* %sp, i64 %count)
  %donep = getelementptr i64, i64* %state, i64 8
  %old = atomicrmw add i64* %donep, i64 1 release
  br label %claim
exit:
  ret void
}

; A crew thread's turn: copies chunks of any job published while it spins;
; returns after `spins` idle polls in a row (or when told to quit).
define void @nbjit_crew_work(i64* %state, i64 %spins) {
entry:
  %awakep = getelementptr i64, i64* %state, i64 32
  %quitp = getelementptr i64, i64* %state, i64 24
  %a0 = atomicrmw add i64* %awakep, i64 1 monotonic
  br label %reset
reset:
  br label %poll
poll:
  %k = phi i64 [0, %reset], [%k1, %pause]
  %t = load atomic i64, i64* %state acquire, align 8
  %idx = and i64 %t, 1048575
  %hi = lshr i64 %t, 20
  %n = and i64 %hi, 1048575
  %left = icmp ult i64 %idx, %n
  br i1 %left, label %work, label %idle
work:
  call void @drain(i64* %state)
  br label %reset
idle:
  %q = load atomic i64, i64* %quitp monotonic, align 8
  %quit = icmp ne i64 %q, 0
  %k1 = add i64 %k, 1
  %spent = icmp uge i64 %k1, %spins
  %stop = or i1 %quit, %spent
  br i1 %stop, label %exit, label %pause
pause:
  PAUSE
  br label %poll
exit:
  %a1 = atomicrmw sub i64* %awakep, i64 1 monotonic
  ret void
}

; The caller's share: publishes a job of `blocks` 64-byte blocks in chunks of
; `chunk`, copies chunks until none is left, then waits for the crew's.
define void @nbjit_crew_copy(i64* %state, i8* %dst, i8* %src, i64 %blocks, i64 %chunk) {
entry:
  %c1 = sub i64 %chunk, 1
  %b1 = add i64 %blocks, %c1
  %n = udiv i64 %b1, %chunk
  %t = load atomic i64, i64* %state monotonic, align 8
  %g = lshr i64 %t, 40
  %g1 = add i64 %g, 1
  %gen = and i64 %g1, 16777215
  %dsti = ptrtoint i8* %dst to i64
  %srci = ptrtoint i8* %src to i64
  %p16 = getelementptr i64, i64* %state, i64 16
  store i64 %dsti, i64* %p16, align 8
  %p17 = getelementptr i64, i64* %state, i64 17
  store i64 %srci, i64* %p17, align 8
  %p18 = getelementptr i64, i64* %state, i64 18
  store i64 %chunk, i64* %p18, align 8
  %p19 = getelementptr i64, i64* %state, i64 19
  store i64 %blocks, i64* %p19, align 8
  %donep = getelementptr i64, i64* %state, i64 8
  store atomic i64 0, i64* %donep monotonic, align 8
  %gs = shl i64 %gen, 40
  %ns = shl i64 %n, 20
  %ticket = or i64 %gs, %ns
  store atomic i64 %ticket, i64* %state release, align 8
  call void @drain(i64* %state)
  br label %wait
wait:
  %d = load atomic i64, i64* %donep acquire, align 8
  %all = icmp eq i64 %d, %n
  br i1 %all, label %exit, label %pause
pause:
  PAUSE
  br label %wait
exit:
  fence seq_cst
  ret void
}
"""

# The state a crew shares (`_Crew.state`), int64 fields, each group on a line
# of its own: the ticket (generation << 40 | chunks << 20 | next chunk), the
# chunks done, the job (destination, source, chunk and total 64-byte blocks),
# the quit flag and how many crew threads are polling.
_TICKET, _DONE, _JOB, _QUIT, _AWAKE = 0, 8, 16, 24, 32

# From this size a copy is split into chunks of CREW_CHUNK_BYTES that the
# calling thread and up to CREW_THREADS crew threads claim. A crew thread
# polls for work for CREW_SPIN_S after its last chunk, then blocks until a
# copy wakes it (OpenMP's spin-then-sleep): a loop that copies every step
# keeps its crew polling, and none waits for a blocked thread to wake, while
# an idle process's crew sleeps. Only where cores are many (a quarter of them,
# at most 3: the polling threads take cores from everything else meanwhile).
CREW_MIN_BYTES = 512 << 10
CREW_CHUNK_BYTES = 64 << 10
CREW_SPIN_S = 0.002
CREW_THREADS = min(3, len(os.sched_getaffinity(0)) // 4 if hasattr(os, "sched_getaffinity")
                   else (os.cpu_count() or 1) // 4)

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
    """In a forked child: a compile the parent had running, and the crew's
    threads, have no thread here."""
    global _compiled, _done, _crew
    if _compiled is PENDING:
        _compiled = _UNTRIED
        _done = threading.Event()
    _crew = None


os.register_at_fork(after_in_child=_forget_a_compile_in_flight)


_crew_parts: tuple | None = None  # (work, crew_copy, engine, poll seconds), once compiled
_crew: Any = None  # this process's `_Crew`, made at its first copy (None: not yet, or no threads)
_crew_lock = threading.Lock()


class _Crew:
    """Threads that help the calling thread copy: each blocks on a lock of its
    own (`go`) between turns, and a turn polls the shared `state` for chunks
    until CREW_SPIN_S pass without one (`nbjit_crew_work`, without the GIL).
    `copy` releases every thread's lock that is held, so a thread that is
    polling takes one more turn and a blocked one wakes; the copy itself
    never waits for a wake (chunks go to whoever claims them first, the
    calling thread included). `busy`: one copy at a time (another thread's
    copy meanwhile goes alone)."""

    def __init__(self, threads: int, work: Callable[[int, int], None],
                 crew_copy: Callable[..., None], engine: Any, poll_s: float) -> None:
        self.state = _aligned_state()
        self.address = self.state.ctypes.data
        self.crew_copy, self.engine = crew_copy, engine  # (the engine holds the machine code)
        self.chunk_blocks = max(1, CREW_CHUNK_BYTES // _BLOCK)
        self.busy = threading.Lock()
        self.go = [threading.Lock() for _ in range(threads)]
        polls = max(1, int(CREW_SPIN_S / poll_s))
        for k, go in enumerate(self.go):
            go.acquire()
            threading.Thread(target=self._turns, args=(go, work, polls), daemon=True,
                             name=f"nbjit copy crew {k}").start()

    def _turns(self, go: Any, work: Callable[[int, int], None], polls: int) -> None:
        state, address = self.state, self.address
        while True:
            go.acquire()
            if state[_QUIT]:
                return
            work(address, polls)

    def copy(self, dst: int, src: int, blocks: int) -> bool:
        """Copies `blocks` 64-byte blocks with the crew; False where another
        thread's copy has it (the caller copies alone)."""
        if not self.busy.acquire(blocking=False):
            return False
        try:
            for go in self.go:
                if go.locked():
                    go.release()
            self.crew_copy(self.address, dst, src, blocks, self.chunk_blocks)
        finally:
            self.busy.release()
        return True

    def stop(self) -> None:
        """Tells the threads to end (at exit: none is left polling)."""
        self.state[_QUIT] = 1
        for go in self.go:
            if go.locked():
                go.release()


def _aligned_state() -> np.ndarray:
    """A zeroed crew state: 64 int64 fields from a 64-byte boundary."""
    raw = np.zeros(64 + 8, np.int64)
    skip = (-raw.ctypes.data % _BLOCK) // 8
    return raw[skip:skip + 64]


def _crew_copy(dst: int, src: int, blocks: int) -> bool:
    """`blocks` 64-byte blocks copied by this thread and the crew; False where
    there is no crew here (CREW_THREADS 0, no thread to be had) or it is busy."""
    crew = _crew
    if crew is None:
        crew = _make_crew()
        if crew is None:
            return False
    return crew.copy(dst, src, blocks)


def _make_crew() -> Any:
    global _crew
    if CREW_THREADS < 1 or _crew_parts is None:
        return None
    with _crew_lock:
        if _crew is None:
            try:
                _crew = _Crew(CREW_THREADS, *_crew_parts)
            except RuntimeError as error:  # no thread to be had: one thread copies
                gave_up("copy crew", error)
                return None
            atexit.register(_crew.stop)
    return _crew


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
        triple = llvm.get_process_triple()
        module = llvm.parse_assembly(_ir_for(triple))
        module.verify()
        machine = llvm.Target.from_triple(triple).create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
            opt=2)
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        address = engine.get_function_address("nbjit_stream_copy")
        work = _WORK(engine.get_function_address("nbjit_crew_work"))
        crew_copy = _CREW_COPY(engine.get_function_address("nbjit_crew_copy"))
    except Exception as error:  # no llvmlite, or no native target: numpy's copy, and why
        gave_up(STREAM_COPY, error)
        return None
    loop = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(address)
    crew_min_blocks = CREW_MIN_BYTES // _BLOCK

    def copy(dst: np.ndarray, src: np.ndarray) -> None:
        d = dst.reshape(-1).view(np.uint8)
        s = src.reshape(-1).view(np.uint8)
        if d.ctypes.data % _BLOCK:
            np.copyto(d, s)
            return
        blocks = s.shape[0] // _BLOCK
        if blocks < crew_min_blocks or not _crew_copy(d.ctypes.data, s.ctypes.data, blocks):
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
    global _crew_parts
    _crew_parts = (work, crew_copy, engine, _poll_seconds(work))
    return copy


def _ir_for(triple: str) -> str:
    """The module's IR for this machine: a spin-wait hint where it has one."""
    if triple.startswith(("x86_64", "i686", "i386")):
        return _IR.replace("  PAUSE\n", "  call void @llvm.x86.sse2.pause()\n") + (
            "declare void @llvm.x86.sse2.pause()\n")
    return _IR.replace("  PAUSE\n", "")


_WORK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
_CREW_COPY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_int64, ctypes.c_int64)


def _poll_seconds(work: Callable[[int, int], None]) -> float:
    """Seconds one idle poll of a crew thread takes here (timed once, on a
    state with no job: the spin hint's latency differs between CPUs)."""
    state = _aligned_state()
    polls = 20_000
    begin = time.perf_counter()
    work(state.ctypes.data, polls)
    return max(1e-9, (time.perf_counter() - begin) / polls)
