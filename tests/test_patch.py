"""`jax.jit = nbjit.jit` and the supported switch (`patch_jax`, `unpatch_jax`, `patched_jax`)."""

import importlib
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit.routing import patch as _patch

JAX_JIT = jax._src.api.jit  # upstream's, wherever jax.jit points


@pytest.fixture(autouse=True)
def restore_jax_jit():
    """Every test leaves jax.jit and the patch state as it found them."""
    before = jax.jit
    assert before is JAX_JIT
    try:
        yield
    finally:
        with _patch._lock:
            _patch._switch = False
            _patch._open_blocks = 0
            _patch._saved.clear()
        jax.jit = before


@pytest.fixture
def rebound():
    """The way users try a drop-in: rebind the public name."""
    jax.jit = nbjit.jit
    yield


def test_rebinding_jits_and_hits(rebound):
    f = jax.jit(lambda x, y: x * y + 1)
    assert isinstance(f, nbjit.PjitFunction)
    x = jnp.arange(4.0)
    np.testing.assert_array_equal(f(x, x), x * x + 1)
    np.testing.assert_array_equal(f(x, x), x * x + 1)
    assert f.miss_count == 1 and f._cache_size() == 1


def test_rebinding_static_args(rebound):
    @jax.jit
    def _unused(x):
        return x

    f = jax.jit(lambda x, n: x * n, static_argnums=1)
    g = jax.jit(lambda x, *, mode: x + (1 if mode == "a" else 2), static_argnames="mode")
    x = jnp.ones(3)
    for _ in range(2):
        np.testing.assert_array_equal(f(x, 3), x * 3)
        np.testing.assert_array_equal(g(x, mode="a"), x + 1)
        np.testing.assert_array_equal(g(x, mode="b"), x + 2)
    assert f.miss_count == 1 and g.miss_count == 2


def test_rebinding_donation_as_upstream(rebound):
    results = {}
    for name, jit in (("nbjit", jax.jit), ("jax", JAX_JIT)):
        f = jit(lambda x: x + 1, donate_argnums=0)
        x = jnp.arange(8.0)
        y = f(x)
        z = f(y)
        results[name] = (x.is_deleted(), y.is_deleted(), np.asarray(z).tolist())
    assert results["nbjit"] == results["jax"]


def test_rebinding_library_calling_jax_jit_late(rebound):
    """A library that looks up jax.jit at call time gets nbjit; jax.numpy stays JAX's."""
    def library_step(fun):
        return jax.jit(fun)

    f = library_step(lambda x: jnp.sum(jnp.sin(x)))
    assert isinstance(f, nbjit.PjitFunction)
    x = jnp.linspace(0, 1, 5)
    assert float(f(x)) == pytest.approx(float(jnp.sum(jnp.sin(x))))
    assert jax.grad(f)(x).shape == (5,)
    assert float(jnp.add(1, 2)) == 3  # jax.numpy's own jits are JAX's


def test_patch_and_unpatch_restore_exactly():
    nbjit.patch_jax()
    assert jax.jit is nbjit.jit and _patch.is_jax_patched()
    nbjit.patch_jax()  # idempotent
    assert jax.jit is nbjit.jit
    nbjit.unpatch_jax()
    assert jax.jit is JAX_JIT and not _patch.is_jax_patched()
    nbjit.unpatch_jax()  # idempotent
    assert jax.jit is JAX_JIT


def test_patch_restores_a_foreign_rebinding():
    def someone_elses_jit(*args, **kwargs):
        return JAX_JIT(*args, **kwargs)

    jax.jit = someone_elses_jit
    nbjit.patch_jax()
    assert jax.jit is nbjit.jit
    nbjit.unpatch_jax()
    assert jax.jit is someone_elses_jit
    with nbjit.patched_jax():
        assert jax.jit is nbjit.jit
    assert jax.jit is someone_elses_jit


def test_rebinding_while_patched_is_left_alone():
    def later(*args, **kwargs):
        return JAX_JIT(*args, **kwargs)

    nbjit.patch_jax()
    jax.jit = later
    with pytest.warns(RuntimeWarning, match="rebound"):
        nbjit.unpatch_jax()
    assert jax.jit is later


def test_patched_jax_nests_and_composes_with_the_switch():
    with nbjit.patched_jax():
        assert jax.jit is nbjit.jit
        with nbjit.patched_jax():
            assert jax.jit is nbjit.jit
        assert jax.jit is nbjit.jit  # the outer block is still open
    assert jax.jit is JAX_JIT
    with nbjit.patched_jax():
        nbjit.patch_jax()  # the switch outlives the block
    assert jax.jit is nbjit.jit
    nbjit.unpatch_jax()
    assert jax.jit is JAX_JIT
    nbjit.patch_jax()
    with nbjit.patched_jax():
        nbjit.unpatch_jax()  # the block still holds the patch
        assert jax.jit is nbjit.jit
    assert jax.jit is JAX_JIT


def test_patched_jax_restores_on_exception():
    with pytest.raises(KeyError), nbjit.patched_jax():
        raise KeyError("x")
    assert jax.jit is JAX_JIT


def test_patched_jax_across_threads():
    """Blocks open in many threads at once: patched until the last one closes."""
    n = 8
    inside = threading.Barrier(n + 1)
    leave = threading.Event()
    seen, errors = [], []

    def worker():
        try:
            with nbjit.patched_jax():
                inside.wait(timeout=30)
                seen.append(jax.jit is nbjit.jit)
                leave.wait(timeout=30)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    inside.wait(timeout=30)
    assert jax.jit is nbjit.jit
    leave.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors and seen == [True] * n
    assert jax.jit is JAX_JIT and _patch._open_blocks == 0


def test_patch_unpatch_race_ends_consistent():
    def flip():
        for _ in range(200):
            nbjit.patch_jax()
            nbjit.unpatch_jax()
            with nbjit.patched_jax():
                pass

    threads = [threading.Thread(target=flip) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert jax.jit is JAX_JIT and not _patch._saved


def test_names_bound_before_patching_keep_jax_jit(tmp_path, monkeypatch):
    """`from jax import jit` binds at import: patch before importing model code."""
    (tmp_path / "model_early.py").write_text(
        "from jax import jit\n@jit\ndef step(x):\n    return x + 1\n")
    (tmp_path / "model_late.py").write_text(
        "import jax\nfrom jax import jit\n"
        "@jit\ndef step(x):\n    return x + 1\n"
        "@jax.jit\ndef step2(x):\n    return x + 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    early = importlib.import_module("model_early")
    with nbjit.patched_jax():
        late = importlib.import_module("model_late")
    try:
        assert not isinstance(early.step, nbjit.PjitFunction)
        assert isinstance(late.step, nbjit.PjitFunction)
        assert isinstance(late.step2, nbjit.PjitFunction)
        assert float(late.step(jnp.float32(1))) == 2.0
    finally:
        sys.modules.pop("model_early", None)
        sys.modules.pop("model_late", None)
