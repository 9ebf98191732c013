"""Every fallback of an input strategy says why (`nbjit.core.inputs.fallbacks`).

An input strategy that fails falls back and the call goes on, with jax.jit's
result. `f.stats()` names how each signature's host inputs go
(`host_inputs`) and, for a strategy given up, why (`given_up`: the
exception's type and message, the first time); while misses are explained
the ``nbjit`` logger says it once too. Each test here forces one kind of
failure and reads it there.
"""

from __future__ import annotations

import ast
import logging
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs
from _host import CALLS, fresh_pair, is_resident, node_of, pool_of, run_fresh

import nbjit
from nbjit import _jax
from nbjit.core import dispatch as _dispatch
from nbjit.core.inputs import copying, fallbacks, platforms, stream
from nbjit.host import policy as _policy
from nbjit.host import resident as _resident
from nbjit.host import slots as _slots
from nbjit.host import waker as _waker
from nbjit.host.policy import Stage

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def logged(caplog):
    """The ``nbjit`` logger's warnings while misses are explained."""
    caplog.set_level(logging.WARNING, logger="nbjit")
    with nbjit.explain_misses():
        yield lambda: [r.getMessage() for r in caplog.records if r.name == "nbjit"]


@pytest.fixture
def fresh_process_record(monkeypatch):
    """The process's own fallbacks, empty for this test."""
    monkeypatch.setattr(fallbacks, "_process", {})


def _given_up_lines(messages, strategy):
    return [m for m in messages if f"{strategy} given up" in m]


def test_why_is_the_exceptions_type_and_message():
    assert fallbacks.why(MemoryError("no room")) == "MemoryError: no room"
    assert fallbacks.why(KeyError()) == "KeyError"
    assert fallbacks.why("said in words") == "said in words"


@pytest.mark.cpu_host_memory
def test_arming_that_raises_is_said_once(monkeypatch, logged):
    """The policy's arming after a miss raises: the per-leaf puts go on, and
    the first failure is kept and logged, once for many signatures."""
    def boom(*args, **kwargs):
        raise RuntimeError("boom while arming")

    monkeypatch.setattr(_policy, "HostPolicy", boom)
    f, g = nbjit.jit(lambda a, b: a * b), jax.jit(lambda a, b: a * b)
    for n in (3, 4, 5):
        for i in range(CALLS):
            args = (np.full(n, i, np.float32), np.full(n, 2.0, np.float32))
            assert_same_outputs(f(*args), g(*args))
    stats = f.stats()
    assert stats.given_up == {"resident slots": "RuntimeError: boom while arming"}
    assert stats.host_inputs == {"per-leaf puts": 3} and stats.resident == 0
    assert "resident slots given up: RuntimeError: boom while arming" in str(stats)
    (line,) = _given_up_lines(logged(), "resident slots")
    assert line.endswith("RuntimeError: boom while arming") and "<lambda>" in line


@pytest.mark.cpu_host_memory
def test_a_resident_record_that_raises_is_said(monkeypatch, logged):
    def boom(*args, **kwargs):
        raise MemoryError("no room for slots")

    monkeypatch.setattr(_resident, "resident_record", boom)
    f, args = run_fresh(lambda a, b: a - b, fresh_pair)
    assert not is_resident(f, *args)
    assert node_of(f, *args).host_policy.stage is Stage.GIVEN_UP
    assert f.stats().given_up == {"resident slots": "MemoryError: no room for slots"}
    assert len(_given_up_lines(logged(), "resident slots")) == 1


@pytest.mark.cpu_host_memory
def test_slots_past_the_process_bound_say_why_there_are_none(monkeypatch, logged):
    """The process's slots hold PROCESS_MAX_BYTES already: no slots, and why."""
    monkeypatch.setattr(_slots, "PROCESS_MAX_BYTES", 0)
    f, args = run_fresh(lambda a, b: a + b, fresh_pair)
    assert node_of(f, *args).host_policy.stage is Stage.GIVEN_UP
    (why,) = f.stats().given_up.values()
    assert why.startswith("NoSlots: no slot:") and "PROCESS_MAX_BYTES" in why
    assert len(_given_up_lines(logged(), "resident slots")) == 1


@pytest.mark.cpu_host_memory
def test_slots_given_up_for_deleted_fences_say_why_and_the_way_back(logged):
    """Deleted fences retire slots; after MAX_RETIRED the slots are given up:
    why, and the signature's way back to per-leaf puts, are said."""
    f = nbjit.jit(lambda a, b: (a + b, b * 2))
    for i in range(CALLS):
        f(*fresh_pair(i))
    pool = pool_of(f, *fresh_pair(0))
    assert f.stats().host_inputs == {"resident slots": 1}
    moved = [m for m in logged() if "now go by resident slots (were: per-leaf puts)" in m]
    assert len(moved) == 1
    consume = jax.jit(lambda x: x + 1, donate_argnums=0)
    for i in range(pool.MAX_RETIRED + 2):
        consume(f(*fresh_pair(i))[0])  # the fence (the smallest output) donated
    stats = f.stats()
    assert stats.host_inputs == {"per-leaf puts": 1}
    assert stats.given_up == {
        "resident slots": f"{pool.MAX_RETIRED} slots retired: their fences were deleted"}
    assert any("now go by per-leaf puts (were: resident slots)" in m for m in logged())


@pytest.mark.cpu_host_memory
def test_a_fence_deleted_by_delete_retires_its_slot():
    """`.delete()` on the fence (jaxlib 0.10.2's `is_ready` of such an array
    crashes the process: `_jax.array_ready` checks first there)."""
    f = nbjit.jit(lambda a, b: (a + b, b * 2))
    g = jax.jit(lambda a, b: (a + b, b * 2))
    for i in range(CALLS):
        f(*fresh_pair(i))
    pool = pool_of(f, *fresh_pair(0))
    for i in range(pool.MAX_RETIRED + 2):
        out = f(*fresh_pair(i))
        assert_same_outputs(out, g(*fresh_pair(i)))
        out[0].delete()
    assert pool.broken and "fences were deleted" in f.stats().given_up["resident slots"]
    deleted = jnp.ones(2) + 1
    deleted.delete()
    with pytest.raises(RuntimeError):
        _jax.array_ready(deleted)
    with pytest.raises(TypeError):  # a spare slot's fence (None): the wake skips it
        _jax.array_ready(None)


@pytest.mark.cpu_host_memory
def test_spare_slots_that_cannot_be_made_are_said(monkeypatch):
    """A signature writing 16 KiB or more a call keeps spare slots; where one
    cannot be made the slots there are do, and why is said."""
    made = _slots.ResidentSlots.new_slot

    def new_slot(self):
        if self.made:
            raise MemoryError("no spare")
        return made(self)

    monkeypatch.setattr(_slots.ResidentSlots, "new_slot", new_slot)
    f, args = run_fresh(lambda a, b: a + b,
                        lambda i: (np.full(4096, i, np.float32), np.full(4096, 1.0, np.float32)))
    assert is_resident(f, *args) and pool_of(f, *args).made == 1
    assert f.stats().given_up == {"spare slots": "MemoryError: no spare"}
    assert f.stats().host_inputs == {"resident slots": 1}


@pytest.mark.cpu_host_memory
def test_outputs_whose_addresses_cannot_be_read_give_slots_up_and_say_why(monkeypatch):
    f, args = run_fresh(lambda a, b: a * b, fresh_pair)
    pool = pool_of(f, *args)

    def unreadable(array):
        raise ValueError("no pointer")

    monkeypatch.setattr(_jax, "buffer_address", unreadable)
    slot = pool.free[0]
    assert not pool._check_outputs(slot, [jax.numpy.ones(3)])
    monkeypatch.undo()
    assert pool.broken and not is_resident(f, *args)
    assert f.stats().given_up == {
        "resident slots": "outputs' addresses unread: ValueError: no pointer"}
    assert_same_outputs(f(*args), jax.jit(lambda a, b: a * b)(*args))


def test_a_record_that_cannot_be_built_says_why(monkeypatch):
    def boom(*args, **kwargs):
        raise TypeError("odd fast-path data")

    monkeypatch.setattr(_dispatch, "build_record", boom)
    f, g = nbjit.jit(lambda x: x + 1), jax.jit(lambda x: x + 1)
    for _ in range(3):
        assert_same_outputs(f(jnp.ones(3)), g(jnp.ones(3)))
    stats = f.stats()
    assert stats.given_up == {"fast path": "TypeError: odd fast-path data"}
    assert stats.slow_reasons == {"no_fastpath": 2}


def test_a_launch_record_is_named(monkeypatch, logged):
    """On an accelerator (its strategy plugged in here) a signature's host
    inputs go by a launch record: stats and the explained miss say so."""
    monkeypatch.setitem(platforms._plugged, jax.devices()[0].platform, platforms.STAGED)
    f = nbjit.jit(lambda a: a * 2)
    f(np.ones(3, np.float32))
    f(np.ones(4, np.float32))  # a second signature: an explained (logged) miss
    assert f.stats().host_inputs == {"launch record": 2} and f.stats().given_up == {}
    assert any(m.endswith("; host inputs: launch record") for m in logged())


def test_a_worker_wake_that_cannot_be_compiled_is_said(monkeypatch, fresh_process_record,
                                                        logged):
    def boom(*args, **kwargs):
        raise RuntimeError("no wake here")

    monkeypatch.setattr(_waker, "_wakers", {})
    monkeypatch.setattr(_jax, "cpu_async_dispatch", lambda: True)
    monkeypatch.setattr(_jax, "compiled_execute", boom)
    assert _waker.waker(jax.devices()[0]) is None
    assert fallbacks.process_given_up() == {"worker wake": "RuntimeError: no wake here"}
    assert "this process: worker wake given up: RuntimeError: no wake here" in str(
        nbjit.stats())
    (line,) = _given_up_lines(logged(), "worker wake")
    assert "in this process" in line


def test_numba_kernels_that_do_not_load_are_said(monkeypatch, fresh_process_record):
    def boom():
        raise ImportError("no numba here")

    monkeypatch.setattr(copying, "_kernels", None)
    monkeypatch.setattr(copying, "_loader", None)
    monkeypatch.setattr(copying, "load_kernels", boom)
    assert copying.kernels_or_background() is None
    copying._loader.join(60)
    assert fallbacks.process_given_up() == {"numba gather": "ImportError: no numba here"}


def test_a_non_temporal_copy_that_does_not_compile_is_said(monkeypatch, fresh_process_record):
    monkeypatch.setattr(stream, "_IR", "this is not LLVM IR")
    assert stream._compile() is None
    (why,) = fallbacks.process_given_up().values()
    assert list(fallbacks.process_given_up()) == [stream.STREAM_COPY] and ": " in why


def test_a_streamed_copy_with_no_thread_to_compile_it_is_said(monkeypatch, fresh_process_record):
    """Where no thread can be started for the compile, there is no streamed
    copy (rings copy with numpy), nothing waits for one, and the process's
    fallbacks say why."""
    import threading

    class NoThread(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")

    stream.stream_copy()  # (a compile begun earlier ends before its globals are replaced)
    monkeypatch.setattr(stream, "_compiled", stream._UNTRIED)
    monkeypatch.setattr(stream, "_done", threading.Event())
    monkeypatch.setattr(stream.threading, "Thread", NoThread)
    assert stream.ready() is None and stream.stream_copy() is None
    assert fallbacks.process_given_up() == {
        stream.STREAM_COPY: "RuntimeError: can't start new thread"}


def test_the_streamed_copy_compiles_on_a_thread_of_its_own(monkeypatch):
    """`ready()` answers PENDING while the compile runs on its thread, then the
    copy, which writes the bytes numpy's copy does."""
    import threading

    release = threading.Event()
    compile_for_real = stream._compile

    def slow_compile():
        release.wait(60)
        return compile_for_real()

    stream.stream_copy()  # (a compile begun earlier ends before its globals are replaced)
    monkeypatch.setattr(stream, "_compiled", stream._UNTRIED)
    monkeypatch.setattr(stream, "_done", threading.Event())
    monkeypatch.setattr(stream, "_compile", slow_compile)
    stream.start()
    assert stream.started() and stream.ready() is stream.PENDING
    release.set()
    copy = stream.stream_copy()
    assert copy is not None and stream.ready() is copy
    src = np.arange(1 << 16, dtype=np.float32)
    dst = np.empty_like(src)
    copy(dst, src)
    assert np.array_equal(dst, src)


def _broad(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return handler.type is None or any(
        isinstance(n, ast.Name) and n.id in ("Exception", "BaseException") for n in names)


def test_broad_handlers_in_the_input_rooms_raise_or_say_why():
    """A broad ``except`` in nbjit/host/ and nbjit/core/inputs/ re-raises or
    uses what it caught (to say why); only the two predicates may do neither
    (a sharding JAX cannot compare, a shape a sharding rejects: both answer no)."""
    silent = []
    for folder in ("nbjit/host", "nbjit/core/inputs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ExceptHandler) or not _broad(node):
                    continue
                body = [n for statement in node.body for n in ast.walk(statement)]
                raises = any(isinstance(n, ast.Raise) for n in body)
                uses = node.name is not None and any(
                    isinstance(n, ast.Name) and n.id == node.name for n in body)
                if not raises and not uses:
                    silent.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert [s.split(":")[0] for s in silent] == ["nbjit/core/inputs/plans.py",
                                                 "nbjit/core/inputs/steps.py"], silent
