"""The exchange: processes agree on a call's signature through jax.distributed's store.

A signature ends with its program's fingerprint (`program.py`): one exchange agrees on both.

Its cost grows with the number of processes N, not N squared: when processes
agree only small markers travel, the described entries are read only on a
mismatch, and every wait is a single-key blocking get.

Store layout, under ``nbjit/agreement/<function key>/`` (``<sig>``: a
signature key in hex; ``<g>``: its generation, see below):
  ``seen/<sig>.<g>/<rank>``: `rank` published `<sig>` in generation `g`;
  ``count/<sig>.<g>``: how many processes published it in generation `g` (an
      atomic increment by each), plus `CLOSED` once a decision that some
      process did not call closed the generation;
  ``agreed/<sig>``: set by the process whose increment reached N: every
      process published it, so every later miss of it passes at once;
  ``desc/<sig>``: its described entries, set by its *leader*, the process
      whose increment returned 1;
  ``latest/<rank>``: `rank`'s latest attempt that waited (a small JSON: its
      sequence number, signature, generation, state and call site);
  ``out/<rank>.<seq>``: the decision about `rank`'s waiting attempt `seq`, set
      by the process that decided while that attempt was waiting;
  ``verdict/<sig>``: the last decision about `<sig>`, written after the
      ``out/`` keys, for the attempts the decider did not see;
  ``closed/<sig>.<g>``: the decision that closed generation `g`;
  ``hlo/<sig>``: the HLO of the program compiled for `<sig>` (compressed), set
      when only programs differ by the first process of each program, which
      shows where it differs from another's (two texts, whatever N).

A miss of signature S: publish the marker and the latest entry, increment the
count (the leader also sets ``desc/S``); the process that completes the count
sets ``agreed/S`` and goes on. The others block on ``agreed/S`` in growing
polls (20 ms to 0.5 s) and between polls read ``verdict/S``: one small get,
which serves nothing until something is decided. The leader alone also
watches who is missing, one process per poll (its marker, then its latest
attempt): a process waiting on a signature the leader never published cannot
catch up (each waits for the other), so the leader decides at once. After
its timeout the leader decides anyway (a waiting process whose leader never
decides, say because it hits, decides a grace later).

Deciding reads ``latest/`` and ``seen/S.g/`` once (N small entries each) and
the described entries of each differing signature once. It writes the
decision for every waiting attempt it read (``out/``), then ``verdict/<sig>``
for each signature involved, then raises. Every decision has an id, and a
process acts on each decision once. Who follows a decision:
- an attempt the decider read: its ``out/`` key (it reads that key when it
  sees a verdict it has not acted on);
- an attempt the decider did not read (it published just after the read, or
  arrived later): the verdict of its signature, while the decision still
  stands, that is while the decider and the first differing process have
  made no attempt since (``latest/``). Once one of them calls again, the
  attempt is a retry and waits for the others as a new miss.
- A process that did not call within the timeout is a decision too, and an
  AgreementError: the others skip the call, so the late process must skip it
  as well. It may be publishing as the decider decides, so the decider
  closes the generation with one atomic increment of ``count/S.g`` (by
  `CLOSED`): whichever of the last publication and the close comes first
  wins, and a process whose increment finds the generation closed follows
  ``closed/S.g``. Everyone who followed that decision publishes S in the
  next generation when it calls again.

Per miss when every process agrees: N markers, latest entries and
increments, one get of ``agreed/S`` per waiting process, and the leader's
N-entry read and marker checks: at most 4N small entries served. Waiting adds
O(1) per process per poll. docs/multi-controller.md has the cost model and
the simulated table (`python -m nbjit.multiprocess.simulate`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbjit import _jax
from nbjit.multiprocess.program import COMPILED, first_differing_line, pack, unpack
from nbjit.multiprocess.signature import MASK64, Signature, first_difference, published_entries

__all__ = ["NOT_CALLER", "PREFIX", "AgreementError", "AgreementWarning",
           "Counters", "FunctionInfo", "ProcessState", "add_counts", "agree", "configure",
           "counters", "settings"]

DEFAULT_TIMEOUT_S = 60.0
PREFIX = "nbjit/agreement"
_FIRST_POLL_S = 0.02
_MAX_POLL_S = 0.5
_GRACE_S = 2.0  # a waiting process decides for itself this long after its timeout
_DESCRIPTION_WAIT_S = 5.0  # a leader sets its description right after its increment
# added to a generation's count by the decision that closes it: more than any number
# of processes, and small enough that the store's int32 counter holds one per process
CLOSED = 1 << 16
NOT_CALLER = (_jax.NBJIT_DIR + os.sep,)  # warnings point past nbjit's frames


class AgreementError(ValueError):
    """Processes called one function with different signatures (nothing ran).

    `function`: its name; `path`: the first differing argument path (or
    field); `values`: process rank -> that path's value there.
    """

    def __init__(self, message: str, function: str, path: str, values: dict[int, str]) -> None:
        super().__init__(message)
        self.function = function
        self.path = path
        self.values = values


class AgreementWarning(RuntimeWarning):
    """Agreement was skipped: the key-value store failed (the call went on unchecked)."""


def _env_timeout() -> float:
    try:
        return float(os.environ.get("NBJIT_AGREEMENT_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


# the timeout and the host-value switch (`configure` sets them)
settings: dict[str, Any] = {"timeout_s": _env_timeout(),
                            "check_host_values": os.environ.get("NBJIT_CHECK_AGREEMENT", "")
                            not in ("", "0")}


def configure(timeout_s: float | None = None, check_host_values: bool | None = None) -> dict:
    """Sets the wait for other processes and the host-value switch; returns the old ones."""
    old = dict(settings)
    if timeout_s is not None:
        settings["timeout_s"] = float(timeout_s)
    if check_host_values is not None:
        settings["check_host_values"] = bool(check_host_values)
    return old


@dataclass
class Counters:
    """What agreement did in this process (misses of process-spanning functions)."""

    checks: int = 0  # exchanges made
    at_once: int = 0  # agreed without a poll timing out
    at_once_seconds: float = 0.0  # wall time of those exchanges
    round_trips: int = 0  # key-value store calls
    describe_seconds: float = 0.0  # building the stable signatures
    seconds: float = 0.0  # wall time in exchanges, waits included
    waited_seconds: float = 0.0  # of which waiting for other processes
    max_wait_seconds: float = 0.0
    errors: int = 0  # AgreementErrors raised (not the errors JAX raised first)
    warnings: int = 0


_counters = Counters()
_counters_lock = threading.Lock()  # every write of `_counters` takes it


def counters() -> Counters:
    """A copy of what agreement did in this process so far (taken under the lock)."""
    with _counters_lock:
        return dataclasses.replace(_counters)


def add_counts(**amounts: float) -> None:
    """Adds to this process's counters (`Counters` field -> amount), under their
    lock: a bare ``+=`` from two threads reads, adds and writes back, and can
    lose the other thread's update."""
    with _counters_lock:
        for name, amount in amounts.items():
            setattr(_counters, name, getattr(_counters, name) + amount)


@dataclass(frozen=True)
class FunctionInfo:
    """A function that takes part in agreement, as the exchange names it."""

    name: str
    key: str  # hex of the name's stable hash: the store's directory for it
    options_span: bool  # explicit in/out shardings span processes
    options_text: str


class ProcessState:
    """What this process did, per function key: the signatures it published
    (and in which generation), the ones it leads, its attempt count, each
    signature's generation, the decisions it acted on, and the waiting
    attempts it raised against."""

    def __init__(self) -> None:
        self.published: dict[str, set[int]] = {}  # function -> signatures, any generation
        self.published_in: set[tuple[str, int, int]] = set()  # (function, signature, generation)
        self.leads: set[tuple[str, int, int]] = set()
        self.sequence: dict[str, int] = {}
        self.generation: dict[tuple[str, int], int] = {}
        self.followed: set[tuple[str, str]] = set()  # (function, decision id) acted on
        self.rejected: set[tuple[str, int, int]] = set()  # (function, rank, seq) raised against
        self.lock = threading.Lock()

    def publish(self, function: str, key: int) -> tuple[set[int], int, int, bool]:
        """Records an exchange: (the function's published keys, its sequence number,
        the signature's generation, whether `key` is new in that generation)."""
        with self.lock:
            published = self.published.setdefault(function, set())
            published.add(key)
            generation = self.generation.get((function, key), 0)
            first = (function, key, generation) not in self.published_in
            self.published_in.add((function, key, generation))
            seq = self.sequence[function] = self.sequence.get(function, 0) + 1
        return published, seq, generation, first

    def follow(self, function: str, verdict: dict) -> bool:
        """Records that this process acts on `verdict`; False when it already did."""
        with self.lock:
            if (function, verdict["id"]) in self.followed:
                return False
            self.followed.add((function, verdict["id"]))
            if verdict["kind"] == "not called":  # its generation is closed: the next is new
                key = (function, int(verdict["sig"], 16))
                self.generation[key] = max(self.generation.get(key, 0), verdict["gen"] + 1)
            return True


_this_process = ProcessState()


class _Store:
    """The key-value calls of one exchange, counted; absent keys read as None."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client, self.prefix, self.trips = client, prefix, 0

    def set(self, key: str, value: str) -> None:
        self.trips += 1
        _jax.kv_set(self.client, self.prefix + key, value)

    def get(self, key: str) -> str | None:
        self.trips += 1
        return _jax.kv_try_get(self.client, self.prefix + key)

    def wait(self, key: str, seconds: float) -> str | None:
        self.trips += 1
        return _jax.kv_wait(self.client, self.prefix + key, seconds * 1e3)

    def increment(self, key: str, amount: int = 1) -> int:
        self.trips += 1
        return _jax.kv_increment(self.client, self.prefix + key, amount)

    def read(self, directory: str) -> dict[str, str]:
        """Last key component -> value, of every key under `directory`."""
        self.trips += 1
        found = _jax.kv_dir_get(self.client, self.prefix + directory)
        return {key.rsplit("/", 1)[1]: value for key, value in found}


def agree(client: Any, info: FunctionInfo, signature: Signature, site: str, rank: int,
          n: int, process: ProcessState = _this_process,
          validate: Callable[[], None] | None = None,
          program_text: Callable[[], str] | None = None) -> None:
    """Publishes `signature`, then waits for the others (see the module docstring).

    Returns when every process published it; raises `AgreementError` when one
    differs or did not call within the timeout, or the error `validate` raises
    for this process's own call (JAX's, which comes first). `program_text()`:
    the call's compiled HLO, for where programs differ.
    """
    start = time.perf_counter()
    store = _Store(client, f"{PREFIX}/{info.key}/")
    attempt = _Attempt(store, info, signature, site, rank, n, process, validate, program_text)
    at_once = False
    try:
        at_once = attempt.run(start + settings["timeout_s"])
    finally:
        elapsed = time.perf_counter() - start
        with _counters_lock:
            _counters.checks += 1
            _counters.round_trips += store.trips
            _counters.seconds += elapsed
            _counters.at_once += at_once
            if at_once:
                _counters.at_once_seconds += elapsed
            else:
                _counters.waited_seconds += elapsed
                _counters.max_wait_seconds = max(_counters.max_wait_seconds, elapsed)


class _Attempt:
    """One exchange of one process: publish, wait, and decide when it must."""

    def __init__(self, store: _Store, info: FunctionInfo, signature: Signature, site: str,
                 rank: int, n: int, process: ProcessState, validate: Callable | None,
                 program_text: Callable[[], str] | None) -> None:
        self.store, self.info, self.signature, self.site = store, info, signature, site
        self.rank, self.n, self.process = rank, n, process
        self.validate, self.program_text = validate, program_text
        self.key = signature.key & MASK64
        self.me = f"{self.key:016x}"
        self.published, self.seq, self.gen, self.first = process.publish(info.key, self.key)
        self.round = f"{self.me}.{self.gen}"  # this generation's directory names
        self.leads = False
        self.missing: list[int] | None = None  # the leader's view of who has not published
        self.turn = 0
        self.passed: set[str] = set()  # decisions seen that do not cover this attempt

    def run(self, deadline: float) -> bool:
        """Returns whether the processes agreed at once (no poll timed out)."""
        if self._publish():
            return True
        store, me = self.store, self.me
        self.leads = (self.info.key, self.key, self.gen) in self.process.leads
        end = deadline if self.leads else deadline + min(settings["timeout_s"], _GRACE_S)
        poll, at_once = _FIRST_POLL_S, True
        while True:
            now = time.perf_counter()
            if now >= end:  # the leader's timeout, or no leader decided: decide here
                if self._decide(early=False) == "agreed":
                    return False
                end = now + _MAX_POLL_S  # every process published: the count settles it
            if store.wait(f"agreed/{me}", min(poll, end - now)) is not None:
                # a decision that rejected this attempt stands even if the peer it
                # turned on retried with this signature and completed it
                self._follow(store.get(self._outcome_key(self.rank, self.seq)))
                return at_once
            at_once = False
            text = store.get(f"verdict/{me}")
            if text is not None:
                self._apply(text)  # raises when the decision covers this attempt
            if self.leads and self._watch():
                return False
            poll = min(poll * 2, _MAX_POLL_S)

    def _publish(self) -> bool:
        """Publishes this attempt; returns True when every process has published
        its signature (a re-miss of an agreed one, or this process completed it)."""
        store, me = self.store, self.me
        if not self.first:
            if store.get(f"agreed/{me}") is not None:
                return True  # a re-miss of an agreed signature
            self._set_latest("waiting")
            return False
        store.set(f"seen/{self.round}/{self.rank}", str(self.seq))  # before latest: see _stuck
        self._set_latest("waiting")
        count = store.increment(f"count/{self.round}")
        if count > CLOSED:  # a process decided that some did not call: this one is late
            # (a close that found the count complete came after every increment)
            self._follow(store.wait(f"closed/{self.round}", _DESCRIPTION_WAIT_S))
            return False  # the decider died before writing it: wait as usual
        if count == 1:
            self.process.leads.add((self.info.key, self.key, self.gen))
            store.set(f"desc/{me}", json.dumps(published_entries(self.signature.entries)))
        if count < self.n:
            return False
        store.set(f"agreed/{me}", "1")
        # a process that decided while this one published may have rejected it
        self._follow(store.get(self._outcome_key(self.rank, self.seq)))
        return True

    @staticmethod
    def _outcome_key(rank: int, seq: int) -> str:
        return f"out/{rank}.{seq}"

    def _set_latest(self, state: str) -> None:
        self.store.set(f"latest/{self.rank}", json.dumps(
            {"seq": self.seq, "sig": self.me, "gen": self.gen, "state": state,
             "site": self.site}))

    def _apply(self, text: str) -> None:
        """Follows (raises) the stored decision `text` about this signature when it
        covers this attempt; returns when it does not: a decision made before this
        attempt that no longer stands, so that this attempt is a retry."""
        verdict = json.loads(text)
        decision = verdict["id"]
        if decision in self.passed or (self.info.key, decision) in self.process.followed:
            return
        # the decider wrote the outcome of every waiting attempt it read before this
        # verdict: this attempt's, if it read it
        self._follow(self.store.get(self._outcome_key(self.rank, self.seq)))
        if verdict["kind"] == "not called":
            stands = verdict["gen"] >= self.gen
        else:  # differs: while neither the decider nor the process it turned on called again
            stands = all(self._no_attempt_since(q, seq) for q, seq in verdict["check"])
        if stands:
            self._follow(text)
        self.passed.add(decision)

    def _no_attempt_since(self, q: int, seq: int) -> bool:
        if q == self.rank:
            return self.seq == seq
        text = self.store.get(f"latest/{q}")
        return text is not None and json.loads(text)["seq"] == seq

    def _watch(self) -> bool:
        """The leader's look at one missing process: decides (and returns True)
        when it waits on a signature of its own that this process never published."""
        store = self.store
        if self.missing is None:
            seen = {int(q) for q in store.read(f"seen/{self.round}/")}
            self.missing = [q for q in range(self.n) if q not in seen and q != self.rank]
        while self.missing:
            q = self.missing[self.turn % len(self.missing)]
            if store.get(f"seen/{self.round}/{q}") is None:
                break
            self.missing.remove(q)
        else:
            return False  # all published: the last one sets agreed/<sig>
        self.turn += 1
        text = store.get(f"latest/{q}")
        if text is None or not self._stuck(q, json.loads(text)):
            return False
        return self._decide(early=True) is not None

    def _stuck(self, q: int, other: dict) -> bool:
        """Whether process `q`, whose latest attempt is `other`, will not publish this
        signature soon: it waits at a miss whose signature this process never
        published, so it waits for this process, which waits for it. (One that was
        rejected may call again with ours, a retry: it is waited for.)"""
        return (other["sig"] != self.me and other["state"] == "waiting"
                and int(other["sig"], 16) not in self.published
                and (self.info.key, q, other["seq"]) not in self.process.rejected)

    def _decide(self, early: bool) -> str | None:
        """Reads who published what, once; raises and tells the waiting.

        Returns None when there is nothing to decide: no process is stuck after
        all (early), or every process has published this generation (the last
        one's increment settles it: it completes the count, or finds it
        closed); "agreed" when the count was complete when this process closed it.
        """
        store = self.store
        # latest before seen: a process shown waiting on a later miss had already
        # set its marker for ours, if it had one, so the seen read shows it.
        latest = {int(q): json.loads(v) for q, v in store.read("latest/").items()}
        seen = {int(q) for q in store.read(f"seen/{self.round}/")} | {self.rank}
        missing = [q for q in range(self.n) if q not in seen]
        if not missing:
            return None
        # Another process decided about this attempt since the last poll and may be at its
        # next call: a decision here would turn on that call, which the others then run alone.
        self._follow(store.get(self._outcome_key(self.rank, self.seq)))
        # a missing process whose latest attempt is of this signature (an earlier
        # generation's) has not called this time: it is not a difference
        differing = {q: latest[q] for q in missing if q in latest
                     and latest[q]["sig"] != self.me}
        if early and not any(self._stuck(q, e) for q, e in differing.items()):
            return None
        decision = f"{self.rank}.{self.seq}.{self.gen}"
        sites = {self.rank: self.site}
        if not differing:  # the missing have not called: close the generation
            if self._close() == "agreed":
                return "agreed"
            sites |= {q: e["site"] for q, e in latest.items() if e["sig"] == self.me}
            verdict = json.dumps({"kind": "not called", "missing": missing, "id": decision,
                                  "by": self.rank, "sig": self.me, "gen": self.gen,
                                  "timeout": settings["timeout_s"], "sites": _group(sites)})
            store.set(f"closed/{self.round}", verdict)
            verdicts = {self.me: verdict}
        else:
            signatures = {q: self.me for q in seen} | {q: e["sig"] for q, e in differing.items()}
            sites |= {q: e["site"] for q, e in latest.items() if signatures.get(q) == e["sig"]}
            first = min(differing)  # the decision stands until it or this process calls again
            check = [[self.rank, self.seq], [first, differing[first]["seq"]]]
            verdicts = _verdicts(self._entries(differing), signatures, sites, self.n, early,
                                 settings["timeout_s"], decision, check)
        for q, e in latest.items():
            if q != self.rank and e["state"] == "waiting" and e["sig"] in verdicts:
                if q in differing:
                    self.process.rejected.add((self.info.key, q, e["seq"]))
                store.set(self._outcome_key(q, e["seq"]), verdicts[e["sig"]])
        for sig, verdict in verdicts.items():  # after the outcomes: see _apply
            store.set(f"verdict/{sig}", verdict)
        self._follow(verdicts[self.me])
        return None  # not reached: following a decision raises

    def _close(self) -> str | None:
        """Closes this generation, one atomic step against the last publication.

        The first close decides: "agreed" when every process had counted itself
        in before it (it says so in ``closed/``), else None: the caller decides
        that some did not call. A later close follows the first one's decision
        (raises), or returns "agreed"; None when the first closer died
        before writing it."""
        store = self.store
        text = store.get(f"closed/{self.round}")
        if text is None:
            count = store.increment(f"count/{self.round}", CLOSED)
            if count < 2 * CLOSED:  # the first close
                if count - CLOSED < self.n:
                    return None
                store.set(f"closed/{self.round}", "agreed")
                store.set(f"agreed/{self.me}", "1")
                return "agreed"
            text = store.wait(f"closed/{self.round}", _DESCRIPTION_WAIT_S)
        if text == "agreed":
            return text
        self._follow(text)
        return None

    def _entries(self, differing: dict[int, dict]) -> dict[str, list]:
        """Signature -> its described entries: this one's and each differing one's
        (read once per signature, not per process)."""
        entries = {self.me: published_entries(self.signature.entries)}
        for sig in sorted({e["sig"] for e in differing.values()}):
            text = self.store.wait(f"desc/{sig}", _DESCRIPTION_WAIT_S)
            entries[sig] = json.loads(text) if text is not None else [["signature", sig]]
        return entries

    def _follow(self, outcome: str | None) -> None:
        """Acts on a decision: raises AgreementError, or returns when there is none."""
        if outcome is None or outcome == "agreed":
            return
        verdict = json.loads(outcome)
        self.process.follow(self.info.key, verdict)
        self._set_latest("differs")
        if self.validate is not None:
            self.validate()  # an error JAX raises for this process's call alone comes first
        add_counts(errors=1)  # AgreementErrors raised
        if verdict["kind"] == "not called":
            raise _missing_error(self.info, self.rank, self.n, verdict)
        where = self._where_programs_differ(verdict) if verdict.get("peer") else ""
        raise _error(self.info, self.rank, self.n, verdict, where)

    def _where_programs_differ(self, verdict: dict) -> str:
        """Where this program's HLO first differs from the verdict's peer program (the
        first process of each program sends its text to the other's: two texts travel)."""
        values = _expand(verdict["values"]) | {self.rank: verdict["own"]}
        (peer, peer_value), first = verdict["peer"], min(
            q for q, v in values.items() if v == verdict["own"])
        if first != self.rank or self.program_text is None:
            return "" if self.program_text is None else (
                f"Process {first}'s error shows where their HLO first differs.")
        text = self.program_text()
        self.store.set(f"hlo/{self.me}", pack(text))
        theirs = unpack(self.store.wait(f"hlo/{peer}", _DESCRIPTION_WAIT_S))
        who = min(q for q, v in values.items() if v == peer_value)
        return first_differing_line(text, theirs, f"process {who}")


# ---------------------------------------------------------------------------
# Verdicts and messages


def _verdicts(entries: dict[str, list], signatures: dict[int, str], sites: dict[int, str],
              n: int, early: bool, timeout: float, decision: str,
              check: list) -> dict[str, str]:
    """Signature -> the verdict (JSON) its callers raise with, seen from it: the
    first difference in its entry order, each process's value there (ranks
    grouped), and the call sites. `signatures`: rank -> the signature it
    published (ranks absent from it have not called)."""
    out = {}
    for sig, mine in entries.items():
        path, values = first_difference(mine, {s: e for s, e in entries.items() if s != sig})
        own = str(dict(map(tuple, mine)).get(path, "(absent)"))
        if path == "signature":  # equal as published (truncated): name the keys
            own, values = f"key {sig}", {s: f"key {s}" for s in entries}
        by_rank = {q: own if signatures.get(q) == sig
                   else values.get(signatures[q], own) if q in signatures
                   else "(not called yet)" for q in range(n)}
        # only programs differ: each program's first process shows where (its peer's HLO)
        peer = next(([s, v] for s, v in sorted(values.items()) if path == "program"
                     and v != own and own.startswith(COMPILED) and v.startswith(COMPILED)),
                    None)
        out[sig] = json.dumps({"kind": "differs", "path": path, "values": _group(by_rank),
                               "own": own, "sites": _group(sites), "early": early,
                               "timeout": timeout, "id": decision, "check": check,
                               "by": int(decision.split(".")[0]), "peer": peer})
    return out


def _group(by_rank: dict[int, str]) -> list[list]:
    """[[value, [[first rank, last rank], ...]], ...], by first rank: N ranks that
    share a few values travel as a few runs."""
    runs: dict[str, list[list[int]]] = {}
    for q in sorted(by_rank):
        ranges = runs.setdefault(by_rank[q], [])
        if ranges and ranges[-1][1] == q - 1:
            ranges[-1][1] = q
        else:
            ranges.append([q, q])
    return sorted(([v, r] for v, r in runs.items()), key=lambda vr: vr[1][0][0])


def _expand(groups: list[list]) -> dict[int, str]:
    return dict(sorted((q, v) for v, ranges in groups for a, b in ranges
                       for q in range(a, b + 1)))


def _ranks_text(ranges: list[list[int]]) -> str:
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return f"process {ranges[0][0]}"
    return "processes " + ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in ranges)


def _error(info: FunctionInfo, rank: int, n: int, verdict: dict,
           where: str = "") -> AgreementError:
    path, values = verdict["path"], _expand(verdict["values"])
    values[rank] = verdict["own"]  # this process may have called after the decision
    groups = _group(values)
    shown = ", ".join(f"{_ranks_text(r)}: {v}" for v, r in groups)
    called = ", ".join(f"{_ranks_text(r)}: {s}" for s, r in verdict["sites"])
    timeout = verdict["timeout"]
    when = ("another process waits on a signature of its own"
            if verdict["early"] else f"after waiting {timeout:g} s")
    if path == "program":
        when = when.replace("a signature", "a program")
        return AgreementError(_programs_differ(info, when, shown, where, called, timeout),
                              info.name, path, values)
    message = (
        f"processes called {info.name} with different signatures ({when}); nothing was "
        f"run. First difference, {path}: {shown}. Called at: {called}. Every "
        "process must call a function whose arrays span processes with the same global "
        "shapes, dtypes, shardings, static arguments and pytree structures, in the same "
        "order (build global arrays with the same global shape everywhere, e.g. "
        "jax.make_array_from_process_local_data). A process that is only late (still "
        f"compiling) needs a longer NBJIT_AGREEMENT_TIMEOUT (now {timeout:g} s).")
    return AgreementError(message, info.name, path, values)


def _programs_differ(info: FunctionInfo, when: str, shown: str, where: str, called: str,
                     timeout: float) -> str:
    return (
        f"processes called {info.name} with the same arguments, but their programs differ "
        f"({when}); nothing was run. The programs: {shown}. {where} Called at: {called}. "
        "The traced function must compute the same program on every process: a branch on "
        "jax.process_index() or on another value that differs between processes traces "
        "another program on some. JAX's traces of the function were dropped, so the next "
        "call traces it afresh. A process that is only late (still compiling) needs a longer "
        f"NBJIT_AGREEMENT_TIMEOUT (now {timeout:g} s).")


def _missing_error(info: FunctionInfo, rank: int, n: int, verdict: dict) -> AgreementError:
    """The error of every process when some did not call within the timeout; a
    missing process that calls afterwards raises it too (every process skips it)."""
    missing, timeout = verdict["missing"], verdict["timeout"]
    who = _ranks_text([r for _, r in _group(dict.fromkeys(missing, ""))][0])
    values = {q: "not called" if q in missing else "called" for q in range(n)}
    late = rank in missing
    if late:
        values[rank] = "called after the others stopped waiting"
    called = ", ".join(f"{_ranks_text(r)}: {s}" for s, r in verdict["sites"])
    message = (
        f"{who} did not call {info.name}, whose arrays span processes, within {timeout:g} s "
        "(NBJIT_AGREEMENT_TIMEOUT); nothing was run"
        + (" (this process called it after the others had stopped waiting)" if late else "")
        + f". Called at: {called}. Every process must make the same calls of such a "
        "function in the same order (a process that skips one leaves the others waiting "
        "in its collectives). A process that is only late (still compiling) needs a longer "
        f"NBJIT_AGREEMENT_TIMEOUT (now {timeout:g} s).")
    return AgreementError(message, info.name, "call", values)
