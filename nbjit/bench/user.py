"""`nbjit.compare(f, *args)`: the compare command's measurement on a user's own call.

Both dispatchers are called once and must agree on the outputs; then every
call of each is timed alone, in interleaved paired rounds with the floor
(`nbjit.bench.measure.interleave`, call by call), twice: until it returns
(what a loop that does not wait sees) and until its results are ready (what
a step that needs them waits for). jax.jit is then timed against itself
the same way (the self-check): how far that sits from 1 says whether the
machine was quiet enough for the ratio to mean anything. A `CompareResult`
holds both ratios, the self-check and a verdict, and shows all of them
wherever it is shown (print, the REPL, a notebook, `plot`).

Arguments are the same on every call (``compare(f, *args)``) or new on
every call (``args_from``: a callable that returns the next call's
positional arguments, or an iterable of them), made before each call's
clock starts. Under donation (``jit_kwargs={"donate_argnums": ...}``) each
call gets fresh copies of its jax.Array arguments, made off the clock too:
a donated array is deleted by the call that takes it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from nbjit._jax import jax_jit
from nbjit.bench import measure
from nbjit.bench.report import SELF_CHECK_BAND
from nbjit.bench.runner import output_difference, settle
from nbjit.observe.table import Table

#: How `compare` measures: up to 101 paired rounds of 7 calls each, at most ~3 s
#: (and as long again for the self-check).
USER_SETTINGS = measure.Settings(rounds=101, min_rounds=5, max_seconds=3.0)

Figures = tuple[float, float, float]  # a ratio's median, p10, p90


class OutputsDiffer(AssertionError):
    """nbjit.jit(fun) and jax.jit(fun) returned different outputs for the same call."""


def _said(ratio: float, p10: float, p90: float, until: str) -> str:
    """One figure in words: faster, slower, or no clear difference (the spread spans 1)."""
    spread = f"{ratio:.3g}x jax.jit's time, p10-p90 {p10:.3g}-{p90:.3g}"
    if p90 < 1:
        return f"nbjit is faster {until} ({spread})"
    if p10 > 1:
        return f"nbjit is slower {until} ({spread})"
    return f"no clear difference {until} ({spread}: the spread spans 1)"


@dataclass(frozen=True, repr=False)
class CompareResult:
    """nbjit.jit(fun) against jax.jit(fun) on a user's calls, timed by `nbjit.compare`.

    ``ratio`` is the median of the per-round ratios nbjit/jax.jit of the time
    until a call's results are ready (< 1: nbjit is faster), ``p10``-``p90``
    their spread; ``return_ratio`` (``return_p10``-``return_p90``) the same
    until the call returns. ``jax_us`` is jax.jit's median time per call until
    ready and ``nbjit_us`` is ``ratio * jax_us`` (``*_return_us`` until the
    return): the paired ratio is the measurement (absolute times drift
    between rounds on a busy machine). ``floor_us`` is the executable's own
    execute + output handling called from Python, until ready (None with new
    arguments each call, donation, or no fast path): no Python dispatcher
    beats it. ``self_check``: jax.jit against itself, measured the same way,
    ((ratio, p10, p90) until ready, the same until the call returns), or
    None (``self_check=False``). `verdict` says it in a sentence.
    """

    name: str
    ratio: float
    nbjit_us: float
    jax_us: float
    floor_us: float | None
    p10: float
    p90: float
    rounds: int
    calls_per_batch: int
    self_check: tuple[Figures, Figures] | None = None
    return_ratio: float | None = None
    return_p10: float | None = None
    return_p90: float | None = None
    nbjit_return_us: float | None = None
    jax_return_us: float | None = None
    arguments: str = "the same arguments every call"

    @property
    def noisy(self) -> bool:
        """Whether the self-check put jax.jit against itself outside
        `SELF_CHECK_BAND` (0.9-1.1): then no ratio of this run can be trusted."""
        if self.self_check is None:
            return False
        lo, hi = SELF_CHECK_BAND
        return any(not lo <= figures[0] <= hi for figures in self.self_check)

    @property
    def verdict(self) -> str:
        """The answer in a sentence: faster, slower or no clear difference, until
        the results are ready and until the call returns; or "too noisy, run
        again" when the self-check says the machine was too busy to tell."""
        if self.noisy:
            assert self.self_check is not None
            (ready, _, _), (back, _, _) = self.self_check
            lo, hi = SELF_CHECK_BAND
            return (f"too noisy, run again: jax.jit against itself read {ready:.3g} until ready "
                    f"and {back:.3g} until the call returns, outside {lo}-{hi}, so this machine "
                    "was too busy for these ratios to say anything (run it again when it is "
                    "quieter)")
        text = _said(self.ratio, self.p10, self.p90, "until the results are ready")
        if self.return_ratio is not None and self.return_p10 is not None \
                and self.return_p90 is not None:
            text += "; " + _said(self.return_ratio, self.return_p10, self.return_p90,
                                 "until the call returns")
        if self.self_check is None:
            text += " (no self-check: compare(..., self_check=True) says whether the machine " \
                    "was quiet enough)"
        return text

    def self_check_text(self) -> str:
        """The self-check in words (jax.jit against itself, the same way)."""
        if self.self_check is None:
            return "self-check: not run (self_check=False)"
        (ready, r10, r90), (back, b10, b90) = self.self_check
        lo, hi = SELF_CHECK_BAND
        state = "too noisy" if self.noisy else "quiet enough"
        return (f"self-check (jax.jit against itself): {ready:.3g} (p10-p90 {r10:.3g}-{r90:.3g}) "
                f"until ready, {back:.3g} ({b10:.3g}-{b90:.3g}) until the call returns: {state} "
                f"(both within {lo}-{hi} is quiet enough)")

    def _figures(self) -> list[tuple[str, str, str, str, str]]:
        """(until, nbjit us, jax.jit us, ratio, p10-p90) per timed figure."""
        rows = [("results ready", f"{self.nbjit_us:.3g}", f"{self.jax_us:.3g}",
                 f"{self.ratio:.3g}", f"{self.p10:.3g}-{self.p90:.3g}")]
        if self.return_ratio is not None:
            rows.append(("call returned", f"{self.nbjit_return_us:.3g}",
                         f"{self.jax_return_us:.3g}", f"{self.return_ratio:.3g}",
                         f"{self.return_p10:.3g}-{self.return_p90:.3g}"))
        return rows

    def _head(self) -> str:
        floor = "" if self.floor_us is None else f"; floor {self.floor_us:.3g} us until ready"
        return (f"{self.name}: nbjit.jit against jax.jit, {self.rounds} paired rounds of "
                f"{self.calls_per_batch} calls each timed alone, {self.arguments}{floor}")

    def __str__(self) -> str:
        table = Table(("until", "nbjit us", "jax.jit us", "ratio", "p10-p90"), self._figures(),
                      right=frozenset({1, 2, 3, 4}))
        return "\n".join([self._head(), *table.lines(), self.self_check_text(),
                          f"verdict: {self.verdict}"])

    __repr__ = __str__  # a REPL shows what print does, not the raw fields

    def _repr_html_(self) -> str:
        table = Table(("until", "nbjit us", "jax.jit us", "ratio", "p10-p90"), self._figures(),
                      right=frozenset({1, 2, 3, 4}))
        return table.html([self._head(), "ratio = nbjit / jax.jit per call, median of paired "
                           "rounds (< 1: nbjit is faster)", self.self_check_text(),
                           f"verdict: {self.verdict}"])

    def plot(self, path: str) -> None:
        """A PNG: microseconds per call of nbjit and jax.jit (and the floor) until the
        results are ready and until the call returns, with the self-check and the verdict."""
        import textwrap

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        groups: list[tuple[str, float, float, float | None, float | None]] = [
            ("until ready", self.nbjit_us, self.jax_us, self.p10, self.p90)]
        if self.return_ratio is not None and self.nbjit_return_us is not None \
                and self.jax_return_us is not None:
            groups.append(("until return", self.nbjit_return_us, self.jax_return_us,
                           self.return_p10, self.return_p90))
        fig, ax = plt.subplots(figsize=(7, 3.6))
        labels, values, colors = [], [], []
        for until, nb, jx, _, _ in groups:
            labels += [f"nbjit, {until}", f"jax.jit, {until}"]
            values += [nb, jx]
            colors += ["tab:blue", "tab:orange"]
        if self.floor_us is not None:
            labels.append("floor, until ready")
            values.append(self.floor_us)
            colors.append("0.6")
        ax.barh(labels, values, color=colors)
        for i, (_, nb, jx, p10, p90) in enumerate(groups):
            if p10 is None or p90 is None:
                continue
            ax.errorbar([nb], [2 * i], xerr=[[nb - p10 * jx], [p90 * jx - nb]], fmt="none",
                        ecolor="k", capsize=3, lw=1)
        ax.invert_yaxis()
        ax.set_xlabel("us per call (nbjit bars: p10-p90 of the paired ratio)")
        ax.set_title(f"{self.name}: nbjit / jax.jit = {self.ratio:.3g} until ready"
                     + (f", {self.return_ratio:.3g} until return"
                        if self.return_ratio is not None else ""), fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
        notes = "\n".join(textwrap.fill(line, 110) for line in
                          (self.self_check_text(), f"verdict: {self.verdict}"))
        fig.text(0.01, 0.01, notes, fontsize=7, va="bottom", ha="left")
        fig.tight_layout(rect=(0, 0.08 + 0.035 * notes.count("\n"), 1, 1))
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _donates(options: dict[str, Any]) -> bool:
    return any(options.get(k) not in (None, (), []) for k in ("donate_argnums",
                                                               "donate_argnames"))


def _copies(values: Any) -> Any:
    """`values` with every jax.Array replaced by a copy (same sharding, committedness)."""
    return jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, values)


def _as_args(value: Any) -> tuple:
    """One call's positional arguments: a tuple as is, anything else as the only one."""
    return value if type(value) is tuple else (value,)


def _feeds(args: tuple, args_from: Any) -> Callable[[], Callable[[], tuple]]:
    """Makes the feeds of the contenders, one each: fixed `args`; or `args_from`
    called each time; or a sequence of them, which each contender walks in turn
    from its start (the same values in the same order for both); or an
    iterator, which they share."""
    if args_from is None:
        return lambda: (lambda: args)
    if callable(args_from):
        return lambda: (lambda: _as_args(args_from()))
    if isinstance(args_from, Sequence) and not isinstance(args_from, (str, bytes)):
        if not args_from:
            raise ValueError("nbjit.compare: args_from is empty; give it the arguments of "
                             "at least one call")
        pool = [_as_args(a) for a in args_from]
        return lambda: itertools.cycle(pool).__next__
    if not isinstance(args_from, Iterable):
        raise TypeError(f"nbjit.compare: args_from must be a callable that returns a call's "
                        f"arguments, or an iterable of them; got {type(args_from).__name__}")
    shared = iter(args_from)
    drawn = itertools.count(1)

    def draw() -> tuple:
        try:
            value = next(shared)
        except StopIteration:
            raise ValueError(
                f"nbjit.compare: args_from ran out after {next(drawn) - 1} calls; compare "
                "makes a few thousand: give a callable, a list (walked in turn, again and "
                "again) or an endless iterator (itertools.cycle)") from None
        next(drawn)
        return _as_args(value)

    return lambda: draw


def compare(fun: Callable[..., Any], *args: Any, jit_kwargs: dict[str, Any] | None = None,
            self_check: bool = True, args_from: Any = None, **kwargs: Any) -> CompareResult:
    """Time ``nbjit.jit(fun, **jit_kwargs)`` against ``jax.jit(fun, **jit_kwargs)``.

    On ``fun(*args, **kwargs)``, or, with `args_from`, on new positional
    arguments every call: `args_from` is a callable that returns the next
    call's (a tuple; anything else is the only argument), or an iterable of
    them (a list is walked in turn, again and again; an iterator must not run
    out). Making them is not timed. Keyword arguments stay the same.

    Both are called once and their outputs must agree (values, dtype, weak
    type, sharding, tree structure), else `OutputsDiffer`; then each call is
    timed alone, until it returns and until its results are ready, in
    interleaved paired rounds with the floor (about 3 s). `self_check` (the
    default) then times jax.jit against itself the same way (3 s more): the
    result's `verdict` says "too noisy, run again" when that sits outside
    0.9-1.1. Under donation (``jit_kwargs={"donate_argnums": (0,)}``) every call
    gets fresh copies of the jax.Array arguments, made before its clock starts.
    """
    from nbjit.bench.floor import floor_call
    from nbjit.core.dispatch import jit as nbjit_jit

    if args and args_from is not None:
        raise TypeError("nbjit.compare: give the arguments either positionally (the same every "
                        "call) or as args_from (new every call), not both")
    options = dict(jit_kwargs or {})
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or repr(fun)
    donates = _donates(options)
    make_feed = _feeds(args, args_from)

    contender = _contender_maker(make_feed, donates, kwargs)
    f_a, f_b = nbjit_jit(fun, **options), jax_jit(fun, **options)
    probe = make_feed()()  # one call's arguments, for both (copies of them under donation)
    outs = [f(*(_copies(probe) if donates else probe),
              **(_copies(kwargs) if donates else kwargs)) for f in (f_a, f_b)]
    diff = output_difference(*outs)
    if diff:
        raise OutputsDiffer(f"nbjit.jit({name}) and jax.jit({name}) return different outputs "
                            f"for these inputs ({diff}); nothing was timed. Please report it "
                            "with the inputs: nbjit must give jax.jit's outputs.")
    call_a, call_b = contender(f_a), contender(f_b)
    contenders: list[tuple[str, Callable[[], Any]]] = [("a", call_a), ("b", call_b)]
    if args_from is None and not donates:
        try:
            contenders.append(("floor", floor_call(f_a, *args, **kwargs)))
        except Exception:  # the floor is best effort (no fast path: JAX's own path each call)
            pass
    for _, call in contenders[:2]:
        settle(call)
    timed = measure.interleave(contenders, USER_SETTINGS, sync=jax.block_until_ready,
                               sync_each=True)
    check = None
    if self_check:
        own = measure.interleave([("a", contender(jax_jit(fun, **options))), ("b", call_b)],
                                 USER_SETTINGS, sync=jax.block_until_ready, sync_each=True)
        check = (_figures(own, False), _figures(own, True))
    arguments = ("the same arguments every call" if args_from is None
                 else "new arguments every call (args_from)")
    if donates:
        arguments += ", fresh copies of its jax.Arrays each call (donation)"
    return _result(name, timed, check, arguments)


def _result(name: str, timed: measure.Interleaved, check: tuple[Figures, Figures] | None,
            arguments: str) -> CompareResult:
    ready, back = _figures(timed, False), _figures(timed, True)
    jax_us, jax_return_us = timed.median_us("b"), timed.median_us("b", returned=True)
    return CompareResult(
        name, ready[0], ready[0] * jax_us, jax_us,
        timed.median_us("floor") if "floor" in timed.names else None, ready[1], ready[2],
        timed.per_call_s.shape[0], timed.calls_per_batch, check, back[0], back[1], back[2],
        back[0] * jax_return_us, jax_return_us, arguments)


def _contender_maker(make_feed: Callable[[], Callable[[], tuple]], donates: bool,
                     kwargs: dict[str, Any]) -> Callable[[Callable[..., Any]], measure.Fed]:
    """``contender(jitted)``: a `measure.Fed` calling `jitted` with its own feed's
    arguments and `kwargs` (fresh copies of their jax.Arrays each call under donation:
    a donated array is deleted by its call)."""
    def contender(jitted: Callable[..., Any]) -> measure.Fed:
        feed = make_feed()
        if donates:
            if kwargs:
                return measure.Fed(lambda *a: jitted(*a[:-1], **a[-1]),
                                   lambda: (*_copies(feed()), _copies(kwargs)))
            return measure.Fed(jitted, lambda: _copies(feed()))
        if kwargs:
            return measure.Fed(lambda *a: jitted(*a, **kwargs), feed)
        return measure.Fed(jitted, feed)

    return contender


def _figures(timed: measure.Interleaved, returned: bool) -> Figures:
    ratio = timed.ratio("a", "b", returned=returned)
    return ratio.median, ratio.p10, ratio.p90
