"""Where host inputs are put, per platform (nbjit/core/inputs/platforms.py):
the table, the core's own path with no strategy plugged in, and a
strategy's two hooks: how a `HostInput` step puts a numpy array (its
`HostTransfer`), and what it does after a miss. The calls run on the CPU
device whatever JAX's default backend is: the tests plug strategies in for
the "cpu" platform."""

import contextlib
import inspect
import os

import jax
import numpy as np
import pytest
from _diff import assert_same_outputs, steps_of

import nbjit
from nbjit import _jax, host
from nbjit.core.inputs import platforms
from nbjit.host import policy as _policy

FRESH_CALLS = 3 * _policy.ARM_AFTER  # enough new values for the CPU's policy to arm

# The table as `import nbjit` leaves it (not where the session plugged an
# accelerator's strategy into the CPU: tests/conftest.py).
as_imported = pytest.mark.skipif(
    os.environ.get("NBJIT_TEST_STRATEGY") == "staged",
    reason="reads the strategy table as `import nbjit` leaves it; NBJIT_TEST_STRATEGY=staged "
           "plugged an accelerator's strategy into the CPU's devices")


@pytest.fixture(autouse=True)
def on_the_cpu_device():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@contextlib.contextmanager
def plugged(platform, strategy):
    """`strategy` for `platform` inside the block (None: the default), the table as before after."""
    before = platforms._plugged.get(platform)
    platforms.plug_in(platform, strategy)
    try:
        yield strategy
    finally:
        platforms.plug_in(platform, before)


class Staging(platforms.InputStrategy):
    """Puts a private copy of each numpy array, zero copy, and counts what it did."""

    name = "test staging"

    def __init__(self):
        self.staged = 0
        self.misses = []

    def host_transfer(self, aval, sharding):
        def stage(x):
            self.staged += 1
            return np.array(x, copy=True)

        return platforms.HostTransfer(_jax.ZERO_COPY, stage)

    def on_miss(self, outcome):
        self.misses.append(outcome.node)


def _f(x, y, s):
    return x * 2 + y.sum() + s


def _new_f():
    """A function of its own (jit objects over one function share its entries)."""
    return lambda x, y, s: _f(x, y, s)


def _fresh_args(k):
    return np.full(4, k, np.float32), np.full(1024, k, np.float32), float(k)


@as_imported
def test_the_cpu_takes_the_host_memory_strategy_and_accelerators_staging():
    assert platforms.strategy_for("cpu") is host.HOST_MEMORY
    for platform in ("tpu", "gpu"):  # the core's own: launch records
        assert platforms.strategy_for(platform) is platforms.STAGED
        assert platforms.strategy_for(platform).launches
    assert platforms.strategy_for("a_platform_yet_to_come") is platforms.STAGED
    with plugged("cpu", None):
        assert platforms.strategy_for("cpu") is platforms.DEFAULT
    with plugged("tpu", None):
        assert platforms.strategy_for("tpu") is platforms.STAGED
    assert platforms.DEFAULT.host_transfer(None, None) is platforms.DIRECT
    aval = _jax.ShapedArray((3,), np.float32)
    staged = platforms.STAGED.host_transfer(aval, jax.sharding.make_single_device_sharding(
        jax.devices("cpu")[0]))
    assert staged.semantics is _jax.ZERO_COPY and staged.stage is not None
    cpu0 = jax.sharding.make_single_device_sharding(jax.devices("cpu")[0])
    assert platforms.platform_of(cpu0) == "cpu"


@as_imported
def test_the_core_puts_host_inputs_by_itself():
    """No strategy for the CPU: every host leaf is put by its `HostInput`
    step with the default transfer, results are jax.jit's, and nothing arms
    however many new values come (with the CPU's strategy, the policy does)."""
    g = jax.jit(_f)
    with plugged("cpu", None):
        f = nbjit.jit(_new_f())
        for k in range(FRESH_CALLS):
            assert_same_outputs(f(*_fresh_args(k)), g(*_fresh_args(k)))
        node, _ = f._entry_for(_fresh_args(0), {})
        assert node.host_policy is None
        steps = steps_of(f, *_fresh_args(0))["HostInput"]
        assert len(steps) == 3 and all(s.transfer is platforms.DIRECT for s in steps)
    armed = nbjit.jit(_new_f())
    for k in range(FRESH_CALLS):
        armed(*_fresh_args(k))
    node, _ = armed._entry_for(_fresh_args(0), {})
    assert node.host_policy is not None


def test_a_strategy_stages_every_numpy_put_and_hears_each_miss():
    """A strategy's transfer is what every put of a numpy array reads: inline
    in the generated preparer (the big leaf, no memo; the small one while its
    memo rests) and through the step (the small leaf's memo misses); scalars
    need no staging. Its `on_miss`
    hears each miss that installed a node, once."""
    g = jax.jit(_f)
    with plugged("cpu", Staging()) as staging:
        f = nbjit.jit(_new_f())
        for k in range(FRESH_CALLS):
            x, y, s = _fresh_args(k)
            out = f(x, y, s)
            x[:], y[:] = -1, -1  # the caller writes right after the call: no result changes
            assert_same_outputs(out, g(*_fresh_args(k)))
        assert staging.staged == 2 * (FRESH_CALLS - 1)  # the first call: JAX's path (a miss)
        node, _ = f._entry_for(_fresh_args(0), {})
        assert staging.misses == [node]
        assert node.host_policy is None  # the CPU's policy is not this strategy's
        source = inspect.getsource(node.record.prepare)
        assert "[T0(x0)], D0, False, False, M0)" in source, source  # while its memo rests
        assert "[T1(x1)], D1, False, False, M1)" in source, source
        f(*_fresh_args(0))
        assert staging.misses == [node]  # a hit tells no one


def test_the_default_transfer_reads_as_jaxlibs_own_put():
    """The preparer of the core's default transfer puts the caller's array,
    copied during the call: no staging name, no semantics name of its own
    (the CPU's policy is left out: it would replace the miss's record)."""
    with plugged("cpu", None):
        f = nbjit.jit(_new_f())
        f(*_fresh_args(0))
        node, _ = f._entry_for(_fresh_args(0), {})
        source = inspect.getsource(node.record.prepare)
    assert "put(A1, S1, [x1], D1, False, False, COPY_DURING_CALL)" in source, source
    assert "T1" not in source and "M1" not in source
