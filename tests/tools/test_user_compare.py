"""`nbjit.compare(f, *args)`: the compare command's measurement on a user's own
call (nbjit/bench/user.py), as the user meets it: pytrees and statics, new
arguments each call, donation, the verdict and the self-check wherever the
result is shown (no speed is asserted here)."""

from __future__ import annotations

import dataclasses
import importlib.util
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit import bench
from nbjit._jax import jax_jit
from nbjit.bench import user

TINY = bench.Settings(rounds=3, min_rounds=2, target_batch_s=0.0005, max_seconds=0.2,
                      warmup_calls=1)


def _user_step(params, batch, *, scale, mode):
    out = jax.tree.map(lambda p: p * scale, params)
    return (out["w"] @ batch + out["b"]) if mode == "affine" else out["w"].sum() * batch


def test_user_compare_pytree_args_and_static_kwarg(monkeypatch):

    monkeypatch.setattr(user, "USER_SETTINGS", TINY)
    params = {"w": jax.numpy.ones((3, 4)), "b": jax.numpy.zeros(3)}
    result = nbjit.compare(_user_step, params, np.ones(4, np.float32), scale=2.0,
                           mode="affine", jit_kwargs={"static_argnames": ("mode",)})
    assert isinstance(result, nbjit.CompareResult)
    assert result.nbjit_us > 0 and result.jax_us > 0 and result.rounds >= 2
    assert result.ratio == pytest.approx(result.nbjit_us / result.jax_us, rel=1e-9)
    assert result.p10 <= result.ratio <= result.p90
    assert result.floor_us is None or result.floor_us > 0
    text = str(result)
    assert "_user_step" in text and "ratio" in text and "p10-p90" in text
    assert "<table>" in result._repr_html_()
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.ratio = 1.0


def test_user_compare_plot(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")

    monkeypatch.setattr(user, "USER_SETTINGS", TINY)
    result = nbjit.compare(operator.mul, jax.numpy.ones(3), 2.0)
    path = tmp_path / "c.png"
    result.plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _sgd(w, x):
    return w - 0.01 * (x.T @ (x @ w)), jnp.sum(x)


def test_user_compare_times_until_ready_and_until_return(monkeypatch):

    monkeypatch.setattr(user, "USER_SETTINGS", TINY)
    result = nbjit.compare(_sgd, jnp.ones((8, 8)), np.ones((4, 8), np.float32))
    assert result.return_ratio is not None and result.return_ratio > 0
    assert result.return_p10 <= result.return_ratio <= result.return_p90
    assert result.nbjit_return_us == pytest.approx(result.return_ratio * result.jax_return_us)
    assert result.calls_per_batch == bench.measure.SYNC_EACH_CALLS  # each call timed alone
    text = str(result)
    assert "results ready" in text and "call returned" in text


def test_user_compare_with_donation_gives_a_ratio(monkeypatch):
    """Each call gets fresh copies of its jax.Arrays (a donated one is deleted by
    the call that takes it); before, the second call raised 'Array has been deleted'."""

    monkeypatch.setattr(user, "USER_SETTINGS", TINY)
    w = jnp.ones((8, 8))
    result = nbjit.compare(_sgd, w, np.ones((4, 8), np.float32),
                           jit_kwargs={"donate_argnums": (0,)})
    assert result.ratio > 0 and result.return_ratio > 0
    assert "donation" in result.arguments and "donation" in str(result)
    assert not w.is_deleted()  # the caller's own array is never the one donated
    by_name = nbjit.compare(lambda w, x: _sgd(w, x), w=w, x=np.ones((4, 8), np.float32),
                            jit_kwargs={"donate_argnames": "w"})
    assert by_name.ratio > 0 and not w.is_deleted()


def test_user_compare_new_arguments_every_call(monkeypatch):
    """args_from: a callable gives each call its own arguments, made off the clock."""

    monkeypatch.setattr(user, "USER_SETTINGS", TINY)
    made = []

    def batch():
        made.append(np.full((4, 8), len(made), np.float32))
        return jnp.ones((8, 8)), made[-1]

    result = nbjit.compare(_sgd, args_from=batch)
    timed = 2 * result.rounds * result.calls_per_batch  # nbjit's and jax.jit's timed calls
    assert len(made) > timed and len({id(x) for x in made}) == len(made)
    assert "new arguments every call" in str(result)
    assert result.floor_us is None  # the floor runs prepared inputs: not with new values


def test_user_compare_walks_a_list_and_says_when_an_iterator_runs_out(monkeypatch):

    monkeypatch.setattr(user, "USER_SETTINGS", TINY)
    batches = [np.full((4, 8), i, np.float32) for i in range(3)]
    result = nbjit.compare(lambda x: x * 2, args_from=batches)  # one argument: not a tuple
    assert result.ratio > 0
    with pytest.raises(ValueError, match="args_from ran out after 5 calls.*itertools.cycle"):
        nbjit.compare(lambda x: x * 2, args_from=iter(batches + batches[:2]))
    with pytest.raises(TypeError, match="either positionally"):
        nbjit.compare(lambda x: x * 2, batches[0], args_from=batches)


def _result(ratio, p10, p90, check=((1.0, 0.97, 1.03), (1.0, 0.97, 1.03))):
    return user.CompareResult("step", ratio, ratio * 10.0, 10.0, 8.0, p10, p90, 5, 7, check,
                              ratio, p10, p90, ratio * 5.0, 5.0)


def test_user_compare_verdict_and_self_check_wherever_it_is_shown(tmp_path):
    faster, slower, unclear = _result(0.9, 0.85, 0.95), _result(1.2, 1.1, 1.3), _result(1, .9, 1.1)
    assert faster.verdict.startswith("nbjit is faster until the results are ready")
    assert slower.verdict.startswith("nbjit is slower")
    assert unclear.verdict.startswith("no clear difference") and "spans 1" in unclear.verdict
    noisy = _result(0.9, 0.85, 0.95, ((1.0, 0.9, 1.1), (1.3, 0.8, 2.0)))
    assert noisy.noisy and noisy.verdict.startswith("too noisy, run again")
    for r in (faster, noisy):
        text = str(r)
        assert repr(r) == text and "ratio=" not in text  # the report, not the raw dataclass
        assert f"verdict: {r.verdict}" in text and "self-check (jax.jit against itself)" in text
        page = r._repr_html_()
        assert "<table>" in page and "self-check" in page and "verdict" in page
    assert "no self-check" in _result(0.9, 0.85, 0.95, None).verdict
    if importlib.util.find_spec("matplotlib") is not None:
        noisy.plot(str(tmp_path / "n.png"))
        assert (tmp_path / "n.png").read_bytes()[:4] == b"\x89PNG"


def _plus_two(x):
    return x + 2


def test_user_compare_refuses_different_outputs(monkeypatch):

    monkeypatch.setattr(user, "USER_SETTINGS", TINY)

    def off_by_one_jit(fun, **options):  # a dispatcher bug, simulated
        return jax_jit(lambda *a, **k: fun(*a, **k) + 1, **options)

    monkeypatch.setattr(nbjit.core.dispatch, "jit", off_by_one_jit)  # what nbjit.compare times
    with pytest.raises(bench.OutputsDiffer, match="values differ.*nothing was timed"):
        nbjit.compare(_plus_two, jax.numpy.ones(2))
