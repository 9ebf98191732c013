"""nbjit.multiprocess.agreement without a second process: stable signatures, the exchange.

The exchange runs here between threads that play processes over an in-memory
key-value store with the client's methods (tests/_agreement_threads.py); a
process that comes late to a decision is test_agreement_late.py's; the real
two-process cases are in test_multiprocess.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _agreement_threads import INFO, FakeStore, Process, agreement_timeout, both, signature
from _env import child_env

import nbjit
from nbjit import _jax
from nbjit._common import warn_past
from nbjit.multiprocess import agreement as _agreement
from nbjit.multiprocess import exchange as _exchange
from nbjit.multiprocess import program as _program
from nbjit.multiprocess.signature import MASK64, Memo
from nbjit.multiprocess.simulate import CountingStore


@pytest.fixture
def timeout():
    yield from agreement_timeout()


def test_equal_signatures_agree(timeout):
    timeout(30)
    store = FakeStore()
    a, b = both(Process(store, 0), Process(store, 1), signature("8,4"), signature("8,4"))
    assert "error" not in a and "error" not in b
    assert a["warnings"] == b["warnings"] == []


def test_differing_signatures_raise_on_both_before_the_timeout(timeout):
    timeout(30)
    store = FakeStore()
    a, b = both(Process(store, 0), Process(store, 1), signature("8,4"), signature("16,4"))
    for outcome in (a, b):
        error = outcome["error"]
        assert isinstance(error, _agreement.AgreementError) and isinstance(error, ValueError)
        assert error.path == "args[0]" and error.function == INFO.name
        assert error.values == {0: "float32[8,4]", 1: "float32[16,4]"}
        assert "args[0]: process 0: float32[8,4], process 1: float32[16,4]" in str(error)
        assert "model.py:10" in str(error) and "model.py:11" in str(error)
        assert outcome["seconds"] < 10  # each waits on the other: no need for the timeout


def test_a_lagging_process_that_catches_up_raises_nothing(timeout):
    timeout(30)
    store = FakeStore()
    p0, p1 = Process(store, 0), Process(store, 1)
    both(p0, p1, signature("2"), signature("2"))  # an agreed earlier call
    a = p0.call_in_thread(signature("3"))  # p1's latest entry is still "2"
    time.sleep(0.5)
    p1.call(signature("3"))
    a["thread"].join(60)
    assert "error" not in a and a["warnings"] == []


def test_a_one_sided_re_miss_of_an_agreed_signature_passes_at_once(timeout):
    timeout(30)
    store = FakeStore()
    p0, p1 = Process(store, 0), Process(store, 1)
    both(p0, p1, signature("2"), signature("2"))
    both(p0, p1, signature("3"), signature("3"))  # p1's latest is now "3"
    before, calls = _agreement.counters().at_once, store.calls
    start = time.perf_counter()
    p0.call(signature("2"))  # p0 cleared its cache; p1 hits and publishes nothing
    assert time.perf_counter() - start < 5
    assert _agreement.counters().at_once == before + 1
    assert store.calls - calls == 1  # one get: agreed/<signature> is set


def test_a_one_sided_miss_of_another_signature_raises_after_the_timeout(timeout):
    timeout(0.5)
    store = FakeStore()
    p0, p1 = Process(store, 0), Process(store, 1)
    both(p0, p1, signature("2"), signature("2"))
    start = time.perf_counter()
    with pytest.raises(_agreement.AgreementError, match="after waiting 0.5 s") as info:
        p0.call(signature("5"))  # p1 hits on "2" and never publishes again
    assert time.perf_counter() - start >= 0.5
    assert info.value.values == {0: "float32[5]", 1: "float32[2]"}


def test_a_process_that_never_calls_is_an_error_after_the_timeout(timeout):
    """A skipped call would leave the callers waiting in its collectives: they raise
    (nothing compiled), naming the missing process; it raises too if it calls later."""
    timeout(0.3)
    store = FakeStore()
    with pytest.raises(_agreement.AgreementError, match="process 1 did not call f") as raised:
        Process(store, 0).call(signature("2"))
    assert raised.value.path == "call" and raised.value.values == {0: "called", 1: "not called"}
    assert "within 0.3 s" in str(raised.value) and "model.py:10" in str(raised.value)
    timeout(30)
    start = time.perf_counter()
    with pytest.raises(_agreement.AgreementError, match="process 1 did not call f") as late:
        Process(store, 1).call(signature("2"))
    assert time.perf_counter() - start < 10  # told by the stored decision, not its timeout
    assert late.value.values == {0: "called", 1: "called after the others stopped waiting"}


def test_a_rejected_attempt_raises_even_when_the_peer_retries_with_it(timeout):
    """p1 raised against p0's waiting call, then called again with p0's signature:
    p0 still raises, so both processes skip the same call."""
    timeout(30)
    store = FakeStore()
    p0, p1 = Process(store, 0), Process(store, 1)
    a = p0.call_in_thread(signature("8"))
    time.sleep(0.3)
    with pytest.raises(_agreement.AgreementError):
        p1.call(signature("16"))
    p1.call(signature("8"))  # its retry agrees with p0's key at once
    a["thread"].join(60)
    assert isinstance(a.get("error"), _agreement.AgreementError)
    assert a["error"].values == {0: "float32[8]", 1: "float32[16]"}


def pretend_waiting(store: FakeStore, function: str, rank: int, sig: str, entries: list,
                    site: str) -> None:
    """What a process that published `sig` (its first attempt) and waits leaves in the store."""
    prefix = f"{_exchange.PREFIX}/{function}/"
    store.key_value_set(f"{prefix}seen/{sig}.0/{rank}", "1")
    store.key_value_set(f"{prefix}latest/{rank}", json.dumps(
        {"seq": 1, "sig": sig, "gen": 0, "state": "waiting", "site": site}))
    if store.key_value_increment(f"{prefix}count/{sig}.0", 1) == 1:
        store.key_value_set(f"{prefix}desc/{sig}", json.dumps([list(e) for e in entries]))


def test_a_retry_does_not_take_a_rejected_call_for_a_stuck_one(timeout):
    """p0 raised against p1's waiting call before p1 noticed; p0's retry waits for p1
    (which raises, then retries) instead of raising at once on p1's stale entry."""
    timeout(30)
    store = FakeStore()
    p0, p1 = Process(store, 0), Process(store, 1)
    b = signature("16")
    p1.state.publish(INFO.key, b.key & MASK64)  # p1 waits on "16", asleep
    pretend_waiting(store, INFO.key, 1, f"{b.key & MASK64:016x}", b.entries,
                    "model.py:11")
    with pytest.raises(_agreement.AgreementError, match="waits on a signature of its own"):
        p0.call(signature("8"))
    rejection = json.loads(store.data[f"{_exchange.PREFIX}/{INFO.key}/out/1.1"])
    assert rejection["kind"] == "differs" and rejection["by"] == 0  # p1's call is rejected
    a = p0.call_in_thread(signature("8"))  # the retry
    time.sleep(0.5)
    assert a["thread"].is_alive()
    p1.state.followed.add((INFO.key, rejection["id"]))  # p1 woke and raised (rejected)
    p1.call(signature("8"))  # and retried
    a["thread"].join(60)
    assert "error" not in a and a["warnings"] == []


def test_first_difference_prefers_this_process_order():
    mine = [["a", "1"], ["b", "2"], ["c", "3"]]
    assert _agreement.first_difference(mine, {1: [["a", "1"], ["b", "2"], ["c", "3"]]}) == (
        "signature", {})
    assert _agreement.first_difference(mine, {1: [["a", "1"], ["c", "4"]]}) == (
        "b", {1: "(absent)"})
    assert _agreement.first_difference(mine, {1: [*mine, ["d", "5"]]}) == ("d", {1: "5"})


# ---------------------------------------------------------------------------
# Stable signatures


_SIGNATURE_SCRIPT = """
import json, sys
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import nbjit
from nbjit.multiprocess import agreement as _agreement
from nbjit.multiprocess import exchange as _exchange
from nbjit.multiprocess.simulate import CountingStore
from nbjit.observe.descriptions import describe_call

mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("a", "b")))
rows = int(sys.argv[1])
f = nbjit.jit(lambda d, n, s: d, static_argnums=(1, 2),
              out_shardings=NamedSharding(mesh, P()))
args = ({"x": x[:rows], "y": [np.arange(3, dtype=np.int16), 2.0], "z": jax.numpy.ones(2)},
        ("tuple", 3, None, frozenset({"b", "a"})), "static text")
d = describe_call(args, {}, (1, 2), (), ())
info = _agreement._function(f)
sig = _agreement.describe_signature(info.name, info.options_text, d, args, {}, True)
print(json.dumps([info.name, info.key, sig.key, sig.entries]))
"""


def _signature_in_subprocess(seed: str, rows: int = 8) -> list:
    env = child_env(PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu",
                    XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, "-c", _SIGNATURE_SCRIPT, str(rows)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_signature_is_the_same_in_fresh_processes_with_other_hash_seeds():
    first, second = _signature_in_subprocess("1"), _signature_in_subprocess("2")
    assert first == second
    name, key, sig, entries = first
    assert name.startswith("<lambda> (<string>:")
    entries = dict(entries)
    assert entries["args[0]['x']"] == "float32[8,4]"
    assert entries["args[0]['x'] sharding"] == (
        "NamedSharding(mesh a=2,b=4 devices 0..7, P('a', 'b')) committed")
    assert entries["args[0]['z'] sharding"] == "uncommitted"  # placement is process-local
    assert entries["args[0]['y'][0]"] == "numpy int16[3]"
    assert entries["args[0]['y'][1]"] == "float"
    assert entries["args[0]['y'][1] value"] == "2.0"
    assert entries["args[0]['y'][0] value"].startswith("bytes hash ")
    assert entries["args[1] (static)"] == "tuple('tuple', 3, None, {'a', 'b'})"
    assert entries["args[2] (static)"] == "'static text'"
    assert "out_shardings" in entries["jit options"] and " at 0x" not in entries["jit options"]
    assert entries["args[0] (pytree)"].startswith("PyTreeDef({'x': *, 'y': [*, *], 'z': *})")
    third = _signature_in_subprocess("3", rows=4)
    assert third[2] != sig and dict(third[3])["args[0]['x']"] == "float32[4,4]"


# ---------------------------------------------------------------------------
# Through the dispatcher, in one process


def test_a_single_process_never_describes_or_exchanges(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("agreement ran in a single process")

    monkeypatch.setattr(_agreement, "describe_signature", fail)
    monkeypatch.setattr(_jax, "distributed_client", fail)
    f = nbjit.jit(lambda x: x + 1)
    np.testing.assert_array_equal(f(jnp.arange(3.0)), [1.0, 2.0, 3.0])


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 devices")
def test_spanning_functions_exchange_on_misses_only(monkeypatch, timeout):
    """Pretend devices 1.. belong to process 1: a function over them exchanges on its
    miss (and warns: process 1 never calls), never on a hit; a local one never."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    store = FakeStore()
    timeout(0.2)
    monkeypatch.setattr(_jax, "process_count", lambda: 2)
    monkeypatch.setattr(_jax, "process_index", lambda: 0)
    monkeypatch.setattr(_jax, "distributed_client", lambda: store)
    monkeypatch.setattr(_jax, "sharding_process_count",
                        lambda s: len({min(d.id, 1) for d in s.device_set}))
    monkeypatch.setattr(_agreement, "_sharding_spans", Memo(
        lambda s: _jax.sharding_process_count(s) > 1, 16))
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))
    f = nbjit.jit(lambda x: x * 2)
    with pytest.raises(_agreement.AgreementError, match="process 1 did not call"):
        f(x)
    assert f.miss_count == 0
    (count,) = [k for k in store.data if "/count/" in k]  # "process 1" publishes it too
    store.key_value_set(count.replace("/count/", "/agreed/").rsplit(".", 1)[0], "1")
    out = f(x)
    np.testing.assert_array_equal(out, np.arange(8.0) * 2)
    calls = store.calls
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            f(x)
        g = nbjit.jit(lambda x: x * 3)
        g(jax.device_put(jnp.arange(8.0), jax.devices()[0]))  # one process's device
    assert store.calls == calls and f.miss_count == 1
    assert any(k.endswith("/latest/0") for k in store.data)

    # "Process 1" waits at a miss of h with another shape: h raises, compiling nothing.
    h = nbjit.jit(lambda x: x * 4)
    pretend_waiting(store, _agreement._function(h).key, 1, "0000000000000001",
                    [["jit options", "{}"], ["arguments", "1 leaves, keywords []"],
                     ["x", "float32[16]"]], "other.py:1")
    with pytest.raises(_agreement.AgreementError, match=r"x: process 0: float32\[8\], "
                       r"process 1: float32\[16\]") as raised:
        h(x)
    assert raised.value.function == _agreement.function_name(h._fun)
    assert h.miss_count == 0 and h._cache_size() == 0


def test_run_check_agreement_switches_host_values_on(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("from nbjit.multiprocess import agreement as _agreement\n"
                      "from nbjit.observe import report as _report\n"
                      "print(_agreement.configure()['check_host_values'])\n"
                      "print(_report.build(None)['process'])\n")
    env = child_env(drop=("NBJIT_CHECK_AGREEMENT",))
    outputs = []
    for flags in ([], ["--check-agreement"]):
        out = subprocess.run([sys.executable, "-m", "nbjit", "run", "--no-report", *flags,
                              str(script)], env=env, capture_output=True, text=True,
                             timeout=120, check=True)
        outputs.append(out.stdout.split())
    assert outputs == [["False", "None"], ["True", "None"]]


# ---------------------------------------------------------------------------
# An error JAX raises for one process's call alone comes before agreement


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 devices")
def test_compiling_ahead_raises_what_the_call_raises():
    def add(x, y):
        return x + y

    x = jax.device_put(jnp.arange(4.0), jax.devices()[0])
    y = jax.device_put(jnp.arange(4.0), jax.devices()[1])
    jitted = jax.jit(add)
    with pytest.raises(ValueError, match="Received incompatible devices") as called:
        jitted(x, y)
    with pytest.raises(ValueError) as compiled:
        _jax.compile_as_called(jitted, (x, y), {}, _program.boundary.run.__code__)
    assert str(compiled.value) == str(called.value)
    assert "test_compiling_ahead_raises_what_the_call_raises.<locals>.add" in str(called.value)


def test_a_mismatch_raises_the_local_error_first(timeout):
    """Both processes' calls are invalid on their own: each raises that error, not
    AgreementError, on both sides of the mismatch."""
    timeout(30)
    store = FakeStore()
    outcomes: dict = {}

    def run(rank: int, sig: _agreement.Signature) -> None:
        def validate() -> None:
            raise ValueError(f"invalid on process {rank}")

        try:
            _exchange.agree(store, INFO, sig, "model.py:1", rank, 2, _exchange.ProcessState(),
                            validate)
        except Exception as error:  # noqa: BLE001 (the test inspects it)
            outcomes[rank] = error

    threads = [threading.Thread(target=run, args=(r, signature(s)))
               for r, s in ((0, "8"), (1, "16"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert {r: (type(e), str(e)) for r, e in outcomes.items()} == {
        0: (ValueError, "invalid on process 0"), 1: (ValueError, "invalid on process 1")}


def test_the_skipped_agreement_warning_names_the_callers_line():
    """`warn_past` (the warning when the store fails) points past the frames of the
    files it is given: Python 3.12's `skip_file_prefixes`, walked by hand on 3.11."""
    def as_if_nbjit():  # this file stands for nbjit's own frames
        warn_past((__file__,), "skipped", _agreement.AgreementWarning)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_past((_jax.NBJIT_DIR + os.sep,), "skipped", _agreement.AgreementWarning)
        line = sys._getframe().f_lineno - 1
        as_if_nbjit()
    first, second = caught
    assert first.category is _agreement.AgreementWarning
    assert (first.filename, first.lineno) == (__file__, line)
    assert second.filename != __file__  # the first frame outside: pytest's, calling this test


def test_a_client_without_try_get_or_increment():
    """try_get falls back to a 1 ms wait; a missing increment is a store failure, which
    check() turns into a warning (agreement skipped), never a broken call."""

    class Minimal:
        def __init__(self) -> None:
            self.store = CountingStore()

        def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
            return self.store.blocking_key_value_get(key, timeout_in_ms)

    client = Minimal()
    assert _jax.kv_try_get(client, "a") is None
    client.store.key_value_set("a", "1")
    assert _jax.kv_try_get(client, "a") == "1"
    with pytest.raises(_jax.JaxRuntimeError, match="UNIMPLEMENTED"):
        _jax.kv_increment(client, "n")
    assert _jax.kv_increment(client.store, "n") == 1 and _jax.kv_increment(client.store, "n") == 2
