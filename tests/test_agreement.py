"""nbjit.multiprocess.agreement without a second process: stable signatures, the exchange.

The exchange runs here between threads that play processes over an in-memory
key-value store with the client's methods; the real two-process cases are in
test_multiprocess.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit import _jax
from nbjit._common import warn_past
from nbjit.multiprocess import agreement as _agreement
from nbjit.multiprocess import exchange as _exchange
from nbjit.multiprocess.signature import MASK64, Memo
from nbjit.multiprocess.simulate import CountingStore

ROOT = Path(__file__).resolve().parent.parent


class FakeStore(CountingStore):
    """jax.distributed's client in memory (the simulation's), with a call count."""

    @property
    def calls(self) -> int:
        return self.round_trips

    @property
    def data(self) -> dict[str, str]:
        return self._data


INFO = _exchange.FunctionInfo("f (model.py:3)", "00000000000000f1", True, "{}")


def signature(shape: str, extra: tuple = ()) -> _agreement.Signature:
    entries = [("jit options", "{}"), ("args[0]", f"float32[{shape}]"), *extra]
    from nbjit import _kernels

    return _agreement.Signature(_kernels.stable_text_hash(json.dumps(entries)), entries)


class Process:
    """One pretend process: its rank and what it published."""

    def __init__(self, store: FakeStore, rank: int, n: int = 2) -> None:
        self.store, self.rank, self.n = store, rank, n
        self.state = _exchange.ProcessState()

    def call(self, sig: _agreement.Signature) -> None:
        _exchange.agree(self.store, INFO, sig, f"model.py:{10 + self.rank}", self.rank,
                        self.n, self.state)

    def call_in_thread(self, sig: _agreement.Signature) -> dict:
        outcome: dict = {}

        def run() -> None:
            start = time.perf_counter()
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    self.call(sig)
                outcome["warnings"] = [w for w in caught
                                       if issubclass(w.category, _agreement.AgreementWarning)]
            except Exception as error:  # noqa: BLE001 (the test inspects it)
                outcome["error"] = error
            outcome["seconds"] = time.perf_counter() - start

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        outcome["thread"] = thread
        return outcome


@pytest.fixture
def timeout():
    def set_timeout(seconds: float) -> None:
        _agreement.configure(timeout_s=seconds)

    old = _agreement.configure()
    yield set_timeout
    _agreement.configure(**old)


def both(p0: Process, p1: Process, s0, s1) -> tuple[dict, dict]:
    a, b = p0.call_in_thread(s0), p1.call_in_thread(s1)
    for o in (a, b):
        o["thread"].join(60)
        assert not o["thread"].is_alive()
    return a, b


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
    env = dict(os.environ, PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
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
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    env.pop("NBJIT_CHECK_AGREEMENT", None)
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
def test_local_validation_raises_what_the_call_raises():
    def add(x, y):
        return x + y

    x = jax.device_put(jnp.arange(4.0), jax.devices()[0])
    y = jax.device_put(jnp.arange(4.0), jax.devices()[1])
    jitted = jax.jit(add)
    with pytest.raises(ValueError, match="Received incompatible devices") as called:
        jitted(x, y)
    with pytest.raises(ValueError) as lowered:
        _jax.lower_as_called(jitted, add, (x, y), {})
    assert str(lowered.value) == str(called.value)
    assert "test_local_validation_raises_what_the_call_raises.<locals>.add" in str(called.value)
    _jax.lower_as_called(jitted, add, (x, x), {})  # a valid call: nothing raised, nothing run


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


def test_a_process_that_arrives_after_the_decision_follows_it_cheaply(timeout):
    """p0 and p1 differ and raise at once; p2 calls p0's signature afterwards: nobody
    is left to tell it, so at its first poll it follows the decision stored for its
    signature (a few small gets, no directory read) and raises too, naming its own
    value, long before its timeout."""
    timeout(30)
    store = FakeStore()
    p0, p1, p2 = (Process(store, r, n=3) for r in range(3))
    a, b = both(p0, p1, signature("8"), signature("16"))
    assert isinstance(a["error"], _agreement.AgreementError)
    assert isinstance(b["error"], _agreement.AgreementError)
    reads = []
    read = store.key_value_dir_get
    store.key_value_dir_get = lambda prefix: reads.append(prefix) or read(prefix)
    start = time.perf_counter()
    with pytest.raises(_agreement.AgreementError) as raised:
        p2.call(signature("8"))
    assert time.perf_counter() - start < 10
    assert raised.value.values == {0: "float32[8]", 1: "float32[16]", 2: "float32[8]"}
    assert reads == []  # O(1) gets, not the O(N) reads of deciding
    p1.call_in_thread(signature("8"))["thread"].join(60)  # p1 retries with p0's: agreed
    p2.call(signature("8"))  # a re-miss of an agreed signature passes at once


class GatedStore(FakeStore):
    """Holds one thread's store calls from its `after`-th on until `key` is set: a
    process that publishes part of its attempt before a decision, the rest after."""

    def __init__(self, thread: str, after: int, key: str) -> None:
        super().__init__()
        self.thread, self.after, self.key, self.made = thread, after, key, 0

    def _trip(self) -> None:
        if threading.current_thread().name == self.thread:
            self.made += 1
            if self.made > self.after:
                deadline = time.monotonic() + 30
                while self.key not in self._data and time.monotonic() < deadline:
                    time.sleep(0.005)


def run_ranks(store: FakeStore, calls: dict[int, _agreement.Signature], n: int,
              late: dict[int, float] | None = None,
              processes: dict[int, Process] | None = None) -> dict[int, dict]:
    """Each rank's call in a thread named p<rank> (after `late[rank]` seconds), as
    `processes[rank]` when given (what it published and was told before)."""
    outcomes: dict[int, dict] = {q: {} for q in calls}
    processes = processes or {q: Process(store, q, n) for q in calls}

    def run(q: int) -> None:
        time.sleep((late or {}).get(q, 0.0))
        start = time.perf_counter()
        try:
            processes[q].call(calls[q])
        except Exception as error:  # noqa: BLE001 (the test inspects it)
            outcomes[q]["error"] = error
        outcomes[q]["seconds"] = time.perf_counter() - start

    threads = [threading.Thread(target=run, args=(q,), name=f"p{q}") for q in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    return outcomes


@pytest.mark.parametrize("after", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("own", ["8", "16"])
def test_every_interleaving_of_a_late_publish_with_the_decision(timeout, after, own):
    """p0 (8) and p3 (16) decide against each other while p1 and p2 (8) are still
    publishing: p2 is held after each step of its attempt (marker, latest entry,
    increment, ...) until the decision is stored. Whether it published before or
    after the decision, with the agreeing signature or the differing one, every
    process raises the same AgreementError within a poll or two, not its timeout."""
    timeout(30)
    sig8, sig16 = signature("8"), signature("16")
    key = f"{_exchange.PREFIX}/{INFO.key}/verdict/{sig8.key & MASK64:016x}"
    store = GatedStore("p2", after, key)
    calls = {0: sig8, 1: sig8, 2: signature(own), 3: sig16}
    # p2 starts after p3, so that p3 leads "16" (a leader that is held between its
    # increment and its description would make the decider wait for it)
    outcomes = run_ranks(store, calls, 4, late={1: 0.3, 2: 0.05})
    expected = {0: "float32[8]", 1: "float32[8]", 2: f"float32[{own}]", 3: "float32[16]"}
    for q, outcome in outcomes.items():
        error = outcome.get("error")
        assert isinstance(error, _agreement.AgreementError), (q, outcome)
        assert error.path == "args[0]"
        shown = {r: v for r, v in error.values.items() if v != "(not called yet)"}
        assert shown.items() <= expected.items() and {q, 3} <= set(shown), (q, error.values)
        assert outcome["seconds"] < 10, (q, outcome)


def test_a_late_process_of_the_differing_signature_follows_the_decision(timeout):
    """p0 and p1 (8) and p2 (16) decide; p3 calls 16 afterwards: it raises at once."""
    timeout(30)
    store = FakeStore()
    outcomes = run_ranks(store, {0: signature("8"), 1: signature("8"), 2: signature("16"),
                                 3: signature("16")}, 4, late={3: 1.0})
    for q, outcome in outcomes.items():
        assert isinstance(outcome.get("error"), _agreement.AgreementError), (q, outcome)
        assert outcome["seconds"] < 10
    assert outcomes[3]["error"].values == {0: "float32[8]", 1: "float32[8]", 2: "float32[16]",
                                           3: "float32[16]"}


def test_retries_after_a_decision_wait_for_each_other_and_agree(timeout):
    """After a mismatch every process retries with one signature: the stored verdict
    does not apply to the retries (each process acted on it once), so they agree."""
    timeout(30)
    store = FakeStore()
    processes = {q: Process(store, q, 3) for q in range(3)}
    first = run_ranks(store, {0: signature("8"), 1: signature("8"), 2: signature("16")}, 3,
                      processes=processes)
    assert all("error" in o for o in first.values())
    again = run_ranks(store, {q: signature("8") for q in range(3)}, 3, late={2: 0.5},
                      processes=processes)
    assert all("error" not in o for o in again.values()), again


def test_two_deciders_then_a_retry_agree_every_time(timeout):
    """Two processes, each the leader of its own signature, decide against each other at
    once (two decisions about one call); both raise, then both retry with one signature:
    the stored decisions belong to the first call, so the retry agrees. Many rounds,
    so that which decision each process reads, and when, varies."""
    timeout(30)
    for round_ in range(25):
        store = FakeStore()
        processes = {q: Process(store, q, 2) for q in range(2)}
        first = run_ranks(store, {0: signature("8"), 1: signature("16")}, 2,
                          late={1: 0.001 * (round_ % 5)}, processes=processes)
        assert all(isinstance(o.get("error"), _agreement.AgreementError)
                   for o in first.values()), (round_, first)
        again = run_ranks(store, {0: signature("8"), 1: signature("8")}, 2,
                          late={round_ % 2: 0.002 * (round_ % 7)}, processes=processes)
        assert all("error" not in o for o in again.values()), (round_, again)
        assert all(o["seconds"] < 10 for o in again.values()), (round_, again)


class ClosingGate(FakeStore):
    """Holds the thread `p1`'s store calls from its `after`-th on until another process
    closed the generation (a count past CLOSED) or `release_s` passed."""

    def __init__(self, after: int, release_s: float) -> None:
        super().__init__()
        self.after, self.release_s, self.made = after, release_s, 0

    def _trip(self) -> None:
        if threading.current_thread().name != "p1":
            return
        self.made += 1
        if self.made > self.after:
            deadline = time.monotonic() + self.release_s
            while time.monotonic() < deadline and not any(
                    "/count/" in k and int(v) >= _exchange.CLOSED
                    for k, v in list(self._data.items())):
                time.sleep(0.002)


@pytest.mark.parametrize("after", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("release_s", [0.25, 0.5])
def test_a_late_publish_and_the_timeout_give_one_outcome(timeout, after, release_s):
    """p0 gives up on p1 after 0.3 s while p1 publishes around that moment, held after
    each of its steps: the increment that completes the count and the one that
    closes the generation are ordered by the store, so both processes run (agreed)
    or both raise "did not call" (p1: "called after the others stopped waiting");
    never one running into the collectives alone. A retry then agrees."""
    timeout(0.3)
    store = ClosingGate(after, release_s)
    processes = {q: Process(store, q, 2) for q in range(2)}
    outcomes = run_ranks(store, {0: signature("8"), 1: signature("8")}, 2,
                         late={1: 0.2}, processes=processes)
    errors = {q: o.get("error") for q, o in outcomes.items()}
    if any(errors.values()):
        assert all(isinstance(e, _agreement.AgreementError) for e in errors.values()), errors
        assert errors[0].path == "call" and errors[0].values == {0: "called", 1: "not called"}
        assert errors[1].values == {0: "called", 1: "called after the others stopped waiting"}
        timeout(30)
        again = run_ranks(store, {0: signature("8"), 1: signature("8")}, 2,
                          processes=processes)
        assert all("error" not in o for o in again.values()), again


class DeciderGate(FakeStore):
    """Holds `p0` right after the directory reads of its decision until `p1` has
    counted itself in (or a second passed): p1's publication lands between p0's read
    of who published and p0's close."""

    def __init__(self) -> None:
        super().__init__()
        self.deciding = False

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        found = super().key_value_dir_get(prefix)
        if threading.current_thread().name == "p0":
            if prefix.endswith("latest/"):
                self.deciding = True
            elif self.deciding and "/seen/" in prefix:
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline and not any(
                        "/count/" in k and int(v) % _exchange.CLOSED >= 2
                        for k, v in list(self._data.items())):
                    time.sleep(0.002)
        return found


def test_a_publish_between_the_read_and_the_close_agrees_on_both(timeout):
    """p0's timeout decision read that p1 had not published; p1 then published and
    completed the count before p0 closed the generation: p0's close finds the count
    complete, so both run (p1 already does), instead of p0 raising while p1 runs."""
    timeout(0.3)
    store = DeciderGate()
    outcomes = run_ranks(store, {0: signature("8"), 1: signature("8")}, 2, late={1: 0.45})
    assert all("error" not in o for o in outcomes.values()), outcomes
    assert store.deciding


class SlowCloser(FakeStore):
    """Holds `p0` right after it closed a generation until another process closed it
    too (or 4 s passed): two processes give up on a missing one at once."""

    def key_value_increment(self, key: str, increment: int) -> int:
        count = super().key_value_increment(key, increment)
        if threading.current_thread().name == "p0" and increment == _exchange.CLOSED:
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline and int(self._data[key]) < 2 * _exchange.CLOSED:
                time.sleep(0.002)
        return count


def test_two_processes_that_give_up_at_once_make_one_decision(timeout):
    """p0 (the leader) and p1 (after its grace) both give up on p2, which never calls:
    the first close decides, the second follows it (one decision, p0's), and every
    process, p2 too when it calls later, raises "did not call"; then all agree."""
    timeout(0.3)
    store = SlowCloser()
    processes = {q: Process(store, q, 3) for q in range(3)}
    outcomes = run_ranks(store, {0: signature("8"), 1: signature("8")}, 3,
                         late={1: 0.01}, processes=processes)
    for q in (0, 1):
        error = outcomes[q].get("error")
        assert isinstance(error, _agreement.AgreementError) and error.path == "call", outcomes
        assert error.values == {0: "called", 1: "called", 2: "not called"}
    assert processes[0].state.followed == processes[1].state.followed  # one decision
    assert any("/count/" in k and int(v) > 2 * _exchange.CLOSED for k, v in store.data.items())
    timeout(30)
    with pytest.raises(_agreement.AgreementError, match="stopped waiting"):
        processes[2].call(signature("8"))
    again = run_ranks(store, {q: signature("8") for q in range(3)}, 3, processes=processes)
    assert all("error" not in o for o in again.values()), again
