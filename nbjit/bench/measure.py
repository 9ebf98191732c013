"""Paired, interleaved timing: how every speed number of nbjit's benchmarks is made.

A speed claim here is a ratio against a reference measured in the same
process, interleaved: each round times ``k`` calls of every contender back to
back, rotating which one goes first, and the claim is the median of the
per-round ratios with its p10-p90 spread. Absolute times on shared machines
drift a lot between runs; the ratio of two things timed a few milliseconds
apart does not.

Pure Python + numpy: nothing here knows about JAX. Contenders are zero-argument
callables; an optional ``sync`` is applied to the last result of each batch,
outside the timed region (for example to wait for queued device work so that
it does not spill into the next batch).

Calls that start large asynchronous work (``sync_each``) are timed one by
one, twice: until the call returns, and until its result is ready (``sync``
done). On an accelerator the two differ by design, and differently for two
dispatchers: one that copies a host input before it returns against one
that returns once the copy is queued. The ready figure is what a step that
needs the result waits for; the return figure, how soon the caller's
Python goes on.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Timer = Callable[[], float]
SYNC_EACH_CALLS = 7


@dataclass(frozen=True)
class Fed:
    """A contender whose every call takes new arguments: ``call(*feed())``.

    Timed call by call (`time_each`), `feed` runs before the clock starts and
    its values are waited for (``sync``), so making them is never timed (a
    loader's next batch, a fresh copy of an argument the call donates).
    Called with no arguments (warm-up) it is one call with fed arguments.
    """

    call: Callable[..., Any]
    feed: Callable[[], tuple]

    def __call__(self) -> Any:
        return self.call(*self.feed())


@dataclass(frozen=True)
class Settings:
    """How long to measure. ``quick`` trades precision for wall time."""

    rounds: int = 301  # paired rounds (upper bound; see max_seconds)
    min_rounds: int = 5  # never fewer, whatever max_seconds says
    target_batch_s: float = 0.01  # calibrate k so one batch takes about this
    max_seconds: float = 10.0  # stop adding rounds after this much time
    warmup_calls: int = 3  # untimed calls of each contender before calibration

    @classmethod
    def quick(cls) -> Settings:
        return cls(rounds=41, min_rounds=3, target_batch_s=0.002, max_seconds=2.0, warmup_calls=2)


@dataclass(frozen=True)
class Interleaved:
    """Per-call seconds of each contender in each round (rows: rounds).

    With ``sync_each`` (`interleave`), ``per_call_s`` is the time until each
    call's result was ready, and ``returned_s`` the time until the call
    returned; otherwise ``returned_s`` is None.
    """

    names: tuple[str, ...]
    per_call_s: np.ndarray  # shape (rounds, contenders)
    calls_per_batch: int
    seconds: float  # wall time the measurement took, calibration included
    returned_s: np.ndarray | None = None  # same shape; sync_each only

    def _seconds(self, returned: bool) -> np.ndarray:
        if not returned:
            return self.per_call_s
        if self.returned_s is None:
            raise ValueError("no return times: measured without sync_each")
        return self.returned_s

    def median_us(self, name: str, returned: bool = False) -> float:
        """Median per-call microseconds of `name` (`returned`: until the call returned)."""
        return float(np.median(self._seconds(returned)[:, self.names.index(name)]) * 1e6)

    def ratio(self, num: str, den: str, returned: bool = False) -> Ratio:
        """Median and p10-p90 of the per-round ratios ``num / den``."""
        seconds = self._seconds(returned)
        per_round = seconds[:, self.names.index(num)] / seconds[:, self.names.index(den)]
        return Ratio.of(per_round)


@dataclass(frozen=True)
class Ratio:
    """Median and p10-p90 of per-round ratios."""

    median: float
    p10: float
    p90: float

    @classmethod
    def of(cls, per_round: np.ndarray) -> Ratio:
        p10, med, p90 = np.percentile(per_round, [10, 50, 90])
        return cls(float(med), float(p10), float(p90))


def time_batch(
    fn: Callable[[], Any],
    k: int,
    timer: Timer = time.perf_counter,
    sync_each: Callable[[Any], Any] | None = None,
) -> tuple[float, Any]:
    """Seconds for ``k`` calls of ``fn`` with the garbage collector off, and the last result.

    As ``timeit`` does, gc is disabled only while the batch runs, so that a
    collection triggered by one contender's garbage is not charged to another.
    With ``sync_each``, every call is timed alone, ``sync_each(result)`` runs
    between calls, untimed, and the batch reports ``k`` times the *median*
    call: each call starts with no queued work, and the rare call that pays
    for the machine's memory management (page faults, unmapping a large
    buffer: milliseconds on a VM) does not decide the round. For calls that
    start large asynchronous computations.
    """
    if sync_each is not None:
        returned, _, out = time_each(fn, k, sync_each, timer)
        return k * returned, out
    out = None
    loop = itertools.repeat(None, k)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = timer()
        for _ in loop:
            out = fn()
        total = timer() - t0
    finally:
        if gc_was_enabled:
            gc.enable()
    return total, out


def time_each(
    fn: Callable[[], Any],
    k: int,
    sync: Callable[[Any], Any],
    timer: Timer = time.perf_counter,
) -> tuple[float, float, Any]:
    """Median seconds until a call of ``fn`` returns, and until its result is
    ready (``sync(result)`` has returned), over ``k`` calls; and the last result.

    Each call starts with nothing queued (the previous result was synced), with
    the garbage collector off (see `time_batch`). A `Fed` contender's
    arguments are made (and synced) before each call's clock starts. Medians: the rare call that
    pays for the machine's memory management (page faults, unmapping a large
    buffer: milliseconds on a VM) does not decide the round.
    """
    out = None
    returned, ready = [], []
    fed = fn if isinstance(fn, Fed) else None
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in itertools.repeat(None, k):
            out = None  # free the previous result before the clock starts
            if fed is not None:  # the next arguments, made and ready before the clock starts
                args = fed.feed()
                sync(args)
                t0 = timer()
                out = fed.call(*args)
                del args  # (a donated argument is deleted by its call: hold nothing)
            else:
                t0 = timer()
                out = fn()
            t1 = timer()
            sync(out)
            t2 = timer()
            returned.append(t1 - t0)
            ready.append(t2 - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return float(np.median(returned)), float(np.median(ready)), out


def calibrate(
    fns: Sequence[Callable[[], Any]],
    target_s: float,
    sync: Callable[[Any], Any] | None = None,
    timer: Timer = time.perf_counter,
    max_k: int = 1 << 20,
    sync_each: bool = False,
) -> int:
    """Calls per batch so that the slowest contender's batch takes about ``target_s``.

    With ``sync_each`` (see `time_batch`) a fixed 7: the untimed waits, not the
    timed calls, dominate such a batch's wall time, and 7 gives a median.
    """
    if sync_each:
        return SYNC_EACH_CALLS
    k = 1
    while True:
        slowest = 0.0
        for fn in fns:
            dt, out = time_batch(fn, k, timer)
            if sync is not None:
                sync(out)
            slowest = max(slowest, dt)
        if slowest >= target_s or k >= max_k:
            break
        # Grow geometrically, aiming a little past the target; at most 10x a step.
        grow = target_s / slowest if slowest > 0 else 10.0
        k = min(max_k, max(k + 1, int(k * min(10.0, 1.2 * grow))))
    if slowest > target_s * 1.5 and k > 1:
        k = max(1, int(k * target_s / slowest))
    return k


def interleave(
    contenders: Sequence[tuple[str, Callable[[], Any]]],
    settings: Settings = Settings(),
    sync: Callable[[Any], Any] | None = None,
    timer: Timer = time.perf_counter,
    sync_each: bool = False,
) -> Interleaved:
    """Time the contenders in paired rounds: A B C, then B C A, then C A B, ...

    Every contender runs ``settings.warmup_calls`` untimed calls first, then the
    batch size ``k`` is calibrated once for all of them, then rounds run until
    ``settings.rounds`` are done or ``settings.max_seconds`` have passed (but
    at least ``settings.min_rounds``). ``sync`` runs on the last result of
    every batch, untimed; with ``sync_each`` it runs after every call, and
    each call is timed until it returns and until ``sync`` is done
    (`time_each`; ``per_call_s`` is then the latter).
    """
    if not contenders:
        raise ValueError("interleave needs at least one contender")
    names = tuple(name for name, _ in contenders)
    fns = [fn for _, fn in contenders]
    start = time.perf_counter()
    for fn in fns:
        for _ in range(settings.warmup_calls):
            out = fn()
        if sync is not None and settings.warmup_calls:
            sync(out)
    k = calibrate(fns, settings.target_batch_s, sync, timer, sync_each=sync_each)
    if sync_each and sync is None:
        raise ValueError("sync_each needs a sync")
    n = len(fns)
    rows: list[list[float]] = []
    returned_rows: list[list[float]] = []
    for r in range(settings.rounds):
        row, returned_row = [0.0] * n, [0.0] * n
        for j in range(n):
            i = (r + j) % n
            if sync_each and sync is not None:
                returned_row[i], row[i], _ = time_each(fns[i], k, sync, timer)
                continue
            dt, out = time_batch(fns[i], k, timer)
            if sync is not None:
                sync(out)
            row[i] = dt / k
        rows.append(row)
        returned_rows.append(returned_row)
        if r + 1 >= settings.min_rounds and time.perf_counter() - start > settings.max_seconds:
            break
    return Interleaved(names, np.asarray(rows), k, time.perf_counter() - start,
                       np.asarray(returned_rows) if sync_each else None)
