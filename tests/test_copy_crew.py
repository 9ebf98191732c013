"""The streamed copy's crew: threads that help the calling thread copy a big
staged leaf (`nbjit.core.inputs.stream`, `CREW_THREADS`).

On a machine of few cores (CI's) the crew is off by default; these tests
turn it on with one thread, so its bytes, its sleep, its sharing between
calling threads and a forked child's copies are checked everywhere.
"""

from __future__ import annotations

import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _diff import assert_same_outputs

import nbjit
from nbjit.core.inputs import platforms as _platforms
from nbjit.core.inputs import stream as _stream
from nbjit.core.inputs.pools import aligned_empty


@pytest.fixture
def crew(monkeypatch):
    """The streamed copy with a crew of one thread, made for this test."""
    copy = _stream.stream_copy()
    if copy is None:
        pytest.skip("no streamed copy here (llvmlite missing)")
    monkeypatch.setattr(_stream, "CREW_THREADS", 1)
    monkeypatch.setattr(_stream, "_crew", None)
    yield copy
    made = _stream._crew
    if made is not None:
        made.stop()


def _jobs(made) -> int:
    """How many copies the crew's state has published (its ticket's generation)."""
    return int(made.state[_stream._TICKET]) >> 40


@pytest.mark.parametrize("extra", [0, 64, 64 * 3 + 17, _stream.CREW_CHUNK_BYTES * 5 + 8])
def test_the_crew_copies_every_byte(crew, extra):
    n = _stream.CREW_MIN_BYTES + extra
    src = np.random.default_rng(extra).integers(0, 255, n, dtype=np.uint8)
    dst = aligned_empty(n)
    dst[:] = 0
    crew(dst, src)
    assert np.array_equal(dst, src)
    assert _stream._crew is not None and _jobs(_stream._crew) == 1


def test_below_its_threshold_the_caller_copies_alone(crew):
    n = _stream.CREW_MIN_BYTES - 64
    src = np.arange(n, dtype=np.uint8)
    dst = aligned_empty(n)
    crew(dst, src)
    assert np.array_equal(dst, src)
    assert _stream._crew is None  # never made


def test_idle_crew_threads_sleep(crew):
    """A crew thread polls for CREW_SPIN_S after its last chunk, then blocks:
    no thread is left spinning in an idle process."""
    n = 4 * _stream.CREW_MIN_BYTES
    src = np.ones(n, np.uint8)
    dst = aligned_empty(n)
    for _ in range(20):
        crew(dst, src)
    made = _stream._crew
    deadline = time.monotonic() + 5 + 100 * _stream.CREW_SPIN_S
    while made.state[_stream._AWAKE] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert made.state[_stream._AWAKE] == 0
    assert all(go.locked() for go in made.go)  # (each thread waits on its lock)
    crew(dst, src * 2)  # woken again
    assert np.array_equal(dst, src * 2)


def test_two_calling_threads_share_one_crew(crew):
    """One copy has the crew at a time; another thread's copy meanwhile goes
    alone. Every copy's bytes are its own."""
    n = 2 * _stream.CREW_MIN_BYTES + 64 * 5
    errors = []

    def copy_many(seed: int) -> None:
        rng = np.random.default_rng(seed)
        dst = aligned_empty(n)
        for _ in range(60):
            src = rng.integers(0, 255, n, dtype=np.uint8)
            crew(dst, src)
            if not np.array_equal(dst, src):
                errors.append(seed)

    threads = [threading.Thread(target=copy_many, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert 0 < _jobs(_stream._crew) <= 180


def test_stop_ends_the_crew_threads(crew):
    crew(aligned_empty(_stream.CREW_MIN_BYTES), np.ones(_stream.CREW_MIN_BYTES, np.uint8))
    made = _stream._crew
    names = {f"nbjit copy crew {k}" for k in range(len(made.go))}
    made.stop()
    deadline = time.monotonic() + 5
    while any(t.name in names for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name in names for t in threading.enumerate())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_a_forked_child_makes_its_own_crew(crew):
    """The parent's crew threads do not exist in a forked child: the child's
    big copies make a crew of its own (waiting on the parent's would hang)."""
    n = 2 * _stream.CREW_MIN_BYTES
    src = np.arange(n, dtype=np.uint8)
    crew(aligned_empty(n), src)
    assert _stream._crew is not None
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its copy is right and its crew new
        code = 1
        try:
            assert _stream._crew is None
            dst = aligned_empty(n)
            crew(dst, src)
            code = 0 if np.array_equal(dst, src) and _stream._crew is not None else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_staged_calls_with_the_crew_give_jax_jits_bits(crew, monkeypatch):
    """A launch record's big writeable leaf, copied by the crew: jax.jit's
    outputs, and a write right after each call changes none of them."""
    monkeypatch.setitem(_platforms._plugged, jax.devices()[0].platform, _platforms.STAGED)
    n = 3 * _stream.CREW_MIN_BYTES // 4 + 3
    fn = lambda w, x: (jnp.sum(x * w), x[::1001] + 1.0)  # noqa: E731
    f, g = nbjit.jit(fn), jax.jit(fn)
    rng = np.random.default_rng(0)
    w = jnp.float32(0.5)
    x = rng.standard_normal(n).astype(np.float32)
    for _ in range(8):
        want = jax.block_until_ready(g(w, x.copy()))
        got = f(w, x)
        x[:] = rng.standard_normal(n).astype(np.float32)  # right after the call
        assert_same_outputs(got, want)
    assert _stream._crew is not None and _jobs(_stream._crew) >= 6
