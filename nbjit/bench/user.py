"""`nbjit.compare(f, *args)`: the compare command's measurement on a user's own call.

Both dispatchers are called once and must agree on the outputs; then they
run in interleaved paired rounds with the floor, as every scenario of
``python -m nbjit compare`` does, and a `CompareResult` holds the ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax

from nbjit._jax import jax_jit
from nbjit.bench import measure
from nbjit.bench.matrix import Case, Scenario
from nbjit.bench.runner import first_difference, run_scenario
from nbjit.observe.table import Table

#: How `compare` measures: 101 paired rounds of ~10 ms batches, at most ~3 s.
USER_SETTINGS = measure.Settings(rounds=101, min_rounds=5, max_seconds=3.0)


class OutputsDiffer(AssertionError):
    """nbjit.jit(fun) and jax.jit(fun) returned different outputs for the same call."""


@dataclass(frozen=True)
class CompareResult:
    """nbjit.jit(fun) against jax.jit(fun) on one call, timed by `nbjit.compare`.

    ``ratio`` is the median of the per-round ratios nbjit/jax.jit (< 1: nbjit
    is faster) and ``p10``-``p90`` their spread. ``jax_us`` is jax.jit's
    median time per call and ``nbjit_us`` is ``ratio * jax_us``: the paired
    ratio is the measurement (absolute times drift between rounds on a busy
    machine), and the three numbers agree. ``floor_us`` is the executable's
    own execute + output handling called from Python (None when the call has
    no fast path), which no Python dispatcher can beat.
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
    #: jax.jit against itself on the same call, measured the same way
    #: (``compare(..., self_check=True)``): (ratio, p10, p90), or None. How far
    #: it sits from 1 is how far this machine lets a ratio be trusted.
    self_check: tuple[float | None, float | None, float | None] | None = None

    def __str__(self) -> str:
        floor = "-" if self.floor_us is None else f"{self.floor_us:.3g} us"
        text = (f"{self.name}: nbjit {self.nbjit_us:.3g} us, jax.jit {self.jax_us:.3g} us, "
                f"floor {floor}; ratio {self.ratio:.3g} (p10-p90 {self.p10:.3g}-{self.p90:.3g}, "
                f"{self.rounds} paired rounds of {self.calls_per_batch} calls)")
        if self.self_check is not None:
            ratio, p10, p90 = self.self_check
            text += f"; self-check jax.jit/jax.jit {ratio:.3g} (p10-p90 {p10:.3g}-{p90:.3g})"
        return text

    def _repr_html_(self) -> str:
        floor = "-" if self.floor_us is None else f"{self.floor_us:.3g}"
        cells = (self.name, f"{self.nbjit_us:.3g}", f"{self.jax_us:.3g}", floor,
                 f"{self.ratio:.3g}", f"{self.p10:.3g}-{self.p90:.3g}", str(self.rounds))
        head = ("function", "nbjit us", "jax.jit us", "floor us", "ratio", "p10-p90", "rounds")
        return Table(head, [cells]).html([
            "ratio = nbjit / jax.jit per call, median of paired rounds (< 1: nbjit is faster); "
            "floor = execute + output handlers only"])

    def plot(self, path: str) -> None:
        """A PNG: microseconds per call of nbjit, jax.jit and the floor, with the ratio."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = ["nbjit", "jax.jit"] + ([] if self.floor_us is None else ["floor"])
        values = [self.nbjit_us, self.jax_us] + ([] if self.floor_us is None else
                                                 [self.floor_us])
        fig, ax = plt.subplots(figsize=(6, 2.6))
        ax.barh(labels, values, color=["tab:blue", "tab:orange", "0.6"][:len(values)])
        low, high = self.p10 * self.jax_us, self.p90 * self.jax_us
        ax.errorbar([self.nbjit_us], [0], xerr=[[self.nbjit_us - low], [high - self.nbjit_us]],
                    fmt="none", ecolor="k", capsize=3, lw=1)
        ax.invert_yaxis()
        ax.set_xlabel("us per call (nbjit bar: p10-p90 of the paired ratio)")
        ax.set_title(f"{self.name}: nbjit / jax.jit = {self.ratio:.3g} "
                     f"(p10-p90 {self.p10:.3g}-{self.p90:.3g})", fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def compare(fun: Callable[..., Any], *args: Any, jit_kwargs: dict[str, Any] | None = None,
            self_check: bool = False, **kwargs: Any) -> CompareResult:
    """Time ``nbjit.jit(fun, **jit_kwargs)`` against ``jax.jit(fun, **jit_kwargs)`` on ``args``.

    The method of ``python -m nbjit compare``: both are called once and their
    outputs must agree (values, dtype, weak type, sharding, tree structure),
    else `OutputsDiffer` is raised; then they run in interleaved paired
    rounds with the floor, and the result holds the median ratio and its
    spread. Each call is timed until it is dispatched, not until its outputs
    are ready (as a loop that does not wait sees it). Takes about 3 s;
    `self_check` also times jax.jit against itself on the same call (3 s more)
    and keeps that ratio beside the result, to judge the machine's noise by.
    """
    from nbjit.bench.floor import floor_call
    from nbjit.core.dispatch import jit as nbjit_jit

    options = dict(jit_kwargs or {})
    name = getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None) or repr(fun)
    case = Case(fun, args, kwargs, options)
    diff = first_difference(nbjit_jit(fun, **options), jax_jit(fun, **options), case)
    if diff:
        raise OutputsDiffer(f"nbjit.jit({name}) and jax.jit({name}) return different outputs "
                            f"for these inputs ({diff}); nothing was timed. Please report it "
                            "with the inputs: nbjit must give jax.jit's outputs.")
    scenario = Scenario(name, len(jax.tree.leaves((args, kwargs))), "user", lambda: case,
                        block=False)
    row = run_scenario(scenario, nbjit_jit, jax_jit, USER_SETTINGS, nbjit_jit, floor_call)
    assert row.ratio is not None and row.b_us is not None
    assert row.ratio_p10 is not None and row.ratio_p90 is not None
    check = None
    if self_check:
        own = run_scenario(scenario, jax_jit, jax_jit, USER_SETTINGS, self_check=True)
        check = (own.ratio, own.ratio_p10, own.ratio_p90)
    return CompareResult(name, row.ratio, row.ratio * row.b_us, row.b_us, row.floor_us,
                         row.ratio_p10, row.ratio_p90, row.rounds, row.calls_per_batch, check)
