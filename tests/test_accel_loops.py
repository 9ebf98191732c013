"""Training loops as users run them, nbjit.jit against jax.jit, bit for bit.

A pool of 8 numpy batches, a new one each step, no block per step; the
batches writeable for half the run and read-only (as a loader that hands
out frozen arrays) for the other half, in both orders, so that how host
inputs reach the device changes within one run. Every step's loss and the
final parameters must equal jax.jit's exactly: the program is jax.jit's own
executable, whatever the host inputs' way (resident slots on the CPU,
jaxlib's own put of private copies or of the read-only arrays themselves on
an accelerator). Three models: an MLP (hidden width 4096 on an
accelerator), a small conv net and a transformer block with int32 tokens.

Sized for the backend: thousands of steps at full size on an accelerator
(`scripts/accel_check.sh` runs it there), a few dozen small ones on the CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit.core.inputs import platforms as _platforms

ACCEL = jax.default_backend() != "cpu"
STEPS = 2000 if ACCEL else 48  # per run: half writeable, half read-only


def _mlp(width: int | None = None, batch: int | None = None):
    width = width or (4096 if ACCEL else 64)
    batch = batch or (1024 if ACCEL else 32)
    sizes = (784, width, width, 10)
    keys = jax.random.split(jax.random.PRNGKey(0), len(sizes))
    params = [(jax.random.normal(k, (m, n)) * np.sqrt(2 / m), jnp.zeros(n))
              for k, m, n in zip(keys, sizes[:-1], sizes[1:], strict=False)]

    def loss(p, x, y):
        h = x
        for w, b in p[:-1]:
            h = jax.nn.relu(h @ w + b)
        logits = h @ p[-1][0] + p[-1][1]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    def make(rng):
        return (rng.standard_normal((batch, 784), np.float32),
                rng.integers(0, 10, batch).astype(np.int32))

    return params, loss, make


def _cnn(batch: int | None = None):
    batch = batch or (256 if ACCEL else 8)
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    params = {"c1": jax.random.normal(k[0], (3, 3, 1, 16)) * 0.3,
              "c2": jax.random.normal(k[1], (3, 3, 16, 32)) * 0.1,
              "d": jax.random.normal(k[2], (7 * 7 * 32, 10)) * 0.02}

    def loss(p, x, y):
        dn = ("NHWC", "HWIO", "NHWC")
        h = jax.nn.relu(jax.lax.conv_general_dilated(x, p["c1"], (2, 2), "SAME",
                                                     dimension_numbers=dn))
        h = jax.nn.relu(jax.lax.conv_general_dilated(h, p["c2"], (2, 2), "SAME",
                                                     dimension_numbers=dn))
        logits = h.reshape(h.shape[0], -1) @ p["d"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    def make(rng):
        return (rng.standard_normal((batch, 28, 28, 1), np.float32),
                rng.integers(0, 10, batch).astype(np.int32))

    return params, loss, make


def _transformer(sizes: tuple[int, int, int, int] | None = None):
    seqs, length, vocab, dim = sizes or ((32, 128, 1000, 128) if ACCEL else (4, 16, 50, 16))
    k = jax.random.split(jax.random.PRNGKey(2), 6)
    params = {"emb": jax.random.normal(k[0], (vocab, dim)) * 0.1,
              "q": jax.random.normal(k[1], (dim, dim)) * dim ** -0.5,
              "k": jax.random.normal(k[2], (dim, dim)) * dim ** -0.5,
              "v": jax.random.normal(k[3], (dim, dim)) * dim ** -0.5,
              "up": jax.random.normal(k[4], (dim, 4 * dim)) * dim ** -0.5,
              "out": jax.random.normal(k[5], (dim, vocab)) * dim ** -0.5}

    def loss(p, tokens, targets):
        h = p["emb"][tokens]
        q, kk, v = h @ p["q"], h @ p["k"], h @ p["v"]
        mask = jnp.tril(jnp.ones((tokens.shape[1], tokens.shape[1]), bool))
        att = jnp.where(mask, q @ kk.transpose(0, 2, 1) / np.sqrt(q.shape[-1]), -1e9)
        h = h + jax.nn.softmax(att, axis=-1) @ v
        h = h + jax.nn.gelu(h @ p["up"]) @ p["up"].T
        logp = jax.nn.log_softmax(h @ p["out"])
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))

    def make(rng):
        return (rng.integers(0, vocab, (seqs, length)).astype(np.int32),
                rng.integers(0, vocab, (seqs, length)).astype(np.int32))

    return params, loss, make


MODELS = {"mlp": _mlp, "cnn": _cnn, "transformer": _transformer}


def _frozen(x: np.ndarray) -> np.ndarray:
    y = x.copy()
    y.flags.writeable = False
    return y


@pytest.fixture(params=["the backend's own"] + ([] if ACCEL else ["launch"]))
def way(request, monkeypatch):
    """The backend's own way for host inputs; on the CPU also an
    accelerator's (launch records, plugged in for the CPU)."""
    if request.param == "launch":
        monkeypatch.setitem(_platforms._plugged, "cpu", _platforms.STAGED)
    return request.param


@pytest.mark.parametrize("order", ["writeable first", "read-only first"])
@pytest.mark.parametrize("model", list(MODELS))
def test_losses_and_params_equal_jax_jits_bit_for_bit(model, order, way):
    params, loss, make_batch = MODELS[model]()

    def step(p, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        return jax.tree.map(lambda w, g: w - 0.01 * g, p, grads), value

    rng = np.random.default_rng(3)
    pool = [make_batch(rng) for _ in range(8)]
    frozen = [tuple(_frozen(a) for a in b) for b in pool]
    kinds = [pool, frozen] if order == "writeable first" else [frozen, pool]

    def run(f):
        p, losses = params, []
        for i in range(STEPS):
            x, y = kinds[i * 2 // STEPS][i % 8]
            p, value = f(p, x, y)
            losses.append(value)
        return jax.device_get((p, losses))

    want_params, want = run(jax.jit(step))
    f = nbjit.jit(step)
    got_params, got = run(f)
    differing = [i for i, (a, b) in enumerate(zip(got, want, strict=True))
                 if np.asarray(a).tobytes() != np.asarray(b).tobytes()]
    assert not differing, f"{len(differing)} of {STEPS} losses differ, first at step {differing[0]}"
    for a, b in zip(jax.tree.leaves(got_params), jax.tree.leaves(want_params), strict=True):
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert f.stats().misses == 1 and f.stats().slow == 0
    if ACCEL or way == "launch":
        node, _ = f._entry_for((params, *pool[0]), {})
        assert node.record.launch is not None
