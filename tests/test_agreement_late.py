"""nbjit.multiprocess.agreement: processes that come late to a decision.

A process that publishes after the others decided, in part before and in
part after, or while the deciders give up at their timeout: every
interleaving must end in one outcome on every process. The processes are
threads over an in-memory store (tests/_agreement_threads.py).
"""

from __future__ import annotations

import threading
import time

import pytest
from _agreement_threads import INFO, FakeStore, Process, agreement_timeout, both, signature

from nbjit.multiprocess import agreement as _agreement
from nbjit.multiprocess import exchange as _exchange
from nbjit.multiprocess.signature import MASK64


@pytest.fixture
def timeout():
    yield from agreement_timeout()


# ---------------------------------------------------------------------------
# Late processes and the decision


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


class SweepingStore(FakeStore):
    """p1 starts deciding about the first call (it reads `latest/`) before p0 does;
    p0 decides, raises, and publishes its next call while p1 is held in that read,
    which returns once p0's entry there shows the next call."""

    def __init__(self, next_sig: str) -> None:
        super().__init__()
        self.next_sig, self.deciding = next_sig, threading.Event()

    def key_value_dir_get(self, prefix: str) -> list:
        if prefix.endswith("/latest/"):
            if threading.current_thread().name == "p1":
                self.deciding.set()
                latest = f"{_exchange.PREFIX}/{INFO.key}/latest/0"
                deadline = time.monotonic() + 30
                while self.next_sig not in self._data.get(latest, "") and (
                        time.monotonic() < deadline):
                    time.sleep(0.005)
            else:
                self.deciding.wait(30)
        return super().key_value_dir_get(prefix)


def test_a_decision_about_one_call_does_not_take_in_the_next(timeout):
    """p0 and p1 differ at a call and both decide; p0 decides first, raises and
    makes its next call (one both make alike) while p1 is still deciding. p1
    follows p0's decision instead of making its own, which would turn on p0's next
    attempt: p0 would raise there while p1, arriving with the same signature,
    agrees and runs alone (a hang in its collectives, then every later one)."""
    timeout(30)
    sig8, sig16, sig4 = signature("8"), signature("16"), signature("4")
    store = SweepingStore(f"{sig4.key & MASK64:016x}")
    p0, p1 = Process(store, 0), Process(store, 1)
    outcomes: dict[int, list] = {0: [], 1: []}

    def calls(process: Process, sigs: list) -> None:
        for sig in sigs:
            try:
                process.call(sig)
                outcomes[process.rank].append("agreed")
            except _agreement.AgreementError as error:
                outcomes[process.rank].append(error.values[process.rank])

    threads = [threading.Thread(target=calls, args=(p, sigs), name=f"p{p.rank}")
               for p, sigs in ((p0, [sig8, sig4]), (p1, [sig16, sig4]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert outcomes == {0: ["float32[8]", "agreed"], 1: ["float32[16]", "agreed"]}
