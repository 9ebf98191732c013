"""What seeing into dispatch costs (issue 11).

- ClosestEntry: the closest cached call description to a new one (explained
  misses), plain-Python loop vs one Numba kernel call over all packed rows,
  by number of cached entries and leaves per entry (the crossover
  `nbjit.observe.explain.NUMBA_CLOSEST_MIN_WORDS` comes from here).
- StatsCost: the hit path with its hit counter / the same hit path without
  it, on args_1 (`f(x)`, one jax.Array), paired and interleaved.
- ProfileCost: a hit inside `nbjit.profile()` / a hit outside, on args_1,
  paired and interleaved; and the overhead the profile states.
"""

import functools
import inspect

from . import common  # first: 8 host devices before jax starts


def _nbjit_module(name):
    try:
        import importlib

        return importlib.import_module(name)
    except ImportError as exc:
        raise NotImplementedError(f"this commit has no {name}: {exc}") from exc


def _rows(entries, leaves, seed=0):
    """`entries` packed description rows of `leaves` leaves (header + 8 words a leaf)."""
    r = common.rng(seed)
    kernels = _nbjit_module("nbjit._kernels")
    if not hasattr(kernels, "description_distances"):
        raise NotImplementedError("this commit has no description_distances kernel")
    width = kernels.DESCRIPTION_HEADER_WORDS + kernels.DESCRIPTION_LEAF_WORDS * leaves
    rows = r.integers(0, 4, size=(entries, width)).astype("int64")
    rows[:, 0] = leaves
    new = rows[r.integers(0, entries)].copy()
    new[-1] += 1  # one field differs from the closest row
    return kernels, new, list(rows)


class ClosestEntry(common.Prepared):
    """Closest of `entries` cached rows of `leaves` leaves each: Python loop vs Numba kernel."""

    params = [["python", "numba"], [1, 10, 100, 1000, 10000], [1, 10, 100]]
    param_names = ["impl", "entries", "leaves"]
    timeout = 120
    number = 20  # ~1 us to ~100 ms a call

    def prepare(self, impl, entries, leaves):
        if impl == "python" and entries * leaves > 100_000:
            raise NotImplementedError("the Python loop takes seconds here")
        kernels, new, rows = _rows(entries, leaves)
        if impl == "python":
            new, rows = tuple(new.tolist()), [tuple(r.tolist()) for r in rows]
            # the Python twin: nbjit.observe.distance (re-exported by _kernels on older commits)
            closest = getattr(kernels, "closest_python", None) or _nbjit_module(
                "nbjit.observe.distance").closest_python
        else:
            closest = kernels.closest_numba
        closest(new, rows)  # compile / load from cache
        return functools.partial(closest, new, rows)

    def time_closest(self, impl, entries, leaves):
        (self.run or self.start(impl, entries, leaves))()


def _args_1():
    import jax.numpy as jnp

    nbjit = _nbjit_module("nbjit")
    if not hasattr(nbjit, "profile"):
        raise NotImplementedError("this commit has no nbjit.profile")

    def f(x):
        return x

    jitted = nbjit.jit(f)
    x = jnp.ones(())
    jitted(x)
    return nbjit, jitted, x


def _without_hit_counter(jitted, *args):
    """Rebuilds `jitted`'s binder for `args` from the hit path minus its counter line."""
    try:  # the hit path's module: nbjit.core.binders, nbjit.core.keys on older commits
        keys = _nbjit_module("nbjit.core.binders")
    except NotImplementedError:
        keys = _nbjit_module("nbjit.core.keys")
    counter = "    node.hits += 1\n"
    if callable(getattr(keys, "_hit", None)):  # the hit path emitted by one function
        name, original = "_hit", keys._hit
        edited = lambda *a, **k: original(*a, **k).replace(counter, "")  # noqa: E731
        if counter not in inspect.getsource(original):
            raise NotImplementedError("this commit's hit path has no hit counter line")
    else:  # earlier commits: one template string
        name, original = "_HIT_TEMPLATE", getattr(keys, "_HIT_TEMPLATE", "")
        if counter not in original:
            raise NotImplementedError("this commit's hit path has no hit counter line")
        edited = original.replace(counter, "")
    setattr(keys, name, edited)
    try:
        jitted._binders.clear()
        jitted(*args)  # builds the binder of this call shape from the edited hit path
    finally:
        setattr(keys, name, original)


class StatsCost:
    """args_1 hit with the hit counter / without it (1.0 = free)."""

    timeout = 120

    def setup(self):
        bench = common.bench_module()
        self.nbjit, counted, x = _args_1()
        uncounted = self.nbjit.jit(counted.__wrapped__)
        _without_hit_counter(uncounted, x)
        before = uncounted.stats().hits
        uncounted(x)
        if uncounted.stats().hits != before:
            raise NotImplementedError("the binder still counts hits")
        self.contenders = [("stats", lambda: counted(x)), ("no_stats", lambda: uncounted(x))]
        self.settings = bench.Settings(rounds=101, min_rounds=5, max_seconds=5.0)
        self.interleave = bench.interleave

    def track_ratio(self):
        result = self.interleave(self.contenders, self.settings)
        return result.ratio("stats", "no_stats").median

    track_ratio.unit = "with/without"


class ProfileCost:
    """args_1 hit inside an active `nbjit.profile()` / outside (the same function twice)."""

    timeout = 120

    def setup(self):
        bench = common.bench_module()
        self.nbjit, plain, x = _args_1()
        profiled = self.nbjit.jit(plain.__wrapped__)
        profiled(x)
        self.profile = self.nbjit.profile().__enter__()
        if not hasattr(plain._binders, "set_flavour"):
            raise NotImplementedError("this commit's binders have no flavours")
        plain._binders.set_flavour("plain")  # only `profiled` records
        plain(x), profiled(x)  # build both binders outside the timing
        self.contenders = [("profiled", lambda: profiled(x)), ("plain", lambda: plain(x))]
        self.settings = bench.Settings(rounds=101, min_rounds=5, max_seconds=5.0)
        self.interleave = bench.interleave

    def teardown(self):
        profile = getattr(self, "profile", None)  # None when setup was skipped
        if profile is not None:
            profile.__exit__(None, None, None)

    def track_ratio(self):
        result = self.interleave(self.contenders, self.settings)
        return result.ratio("profiled", "plain").median

    track_ratio.unit = "profiled/plain"

    def track_stated_overhead_ns(self):
        return self.profile.overhead_ns

    track_stated_overhead_ns.unit = "ns"
