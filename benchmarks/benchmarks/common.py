"""Shared setup for the asv suite: 8 host devices, the implementations, the scenarios.

This module must import on any commit and must not start JAX's backend at
import: asv imports every benchmark module in one process and forks it for
each benchmark, and XLA_FLAGS is read when the backend starts. It does not
import nbjit at import time either: asv installs each commit's nbjit, and a
commit whose nbjit is missing something must skip benchmarks, not hide the
suite (setups raise NotImplementedError, which asv reports as skipped).

The scenarios are `nbjit.bench.scenarios()`, the matrix of
``python -m nbjit compare``, taken from the commit under test; `nbjit.bench`
(the benchmark lab's documented module) also gives the timing harness. A
commit without `nbjit.bench` skips every benchmark that needs it.
"""

import importlib.util
import itertools
import pathlib
import sys


def _request_host_devices():
    """nbjit/routing/devices.py of this checkout, loaded by path (it imports no nbjit, no jax)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "nbjit" / "routing" / "devices.py"
    spec = importlib.util.spec_from_file_location("_nbjit_devices_for_asv", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.request_host_devices(8)


_request_host_devices()

import jax  # noqa: E402
import numpy as np  # noqa: E402


def pin_mismatches():
    """The packages whose installed version differs from asv.conf.json's pins
    (``matrix.req``), as "name installed (pinned X)": asv files a ``--python=same``
    run under the pins, whatever this environment holds."""
    import importlib.metadata
    import json
    import re

    conf = pathlib.Path(__file__).resolve().parents[1] / "asv.conf.json"
    text = re.sub(r"^\s*//.*$", "", conf.read_text(), flags=re.M)  # asv allows // comments
    pins = json.loads(text).get("matrix", {}).get("req", {})
    found = []
    for name, versions in pins.items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = "missing"
        if versions and have not in versions:
            found.append(f"{name} {have} (pinned {', '.join(versions)})")
    return found


if _mismatches := pin_mismatches():
    print("nbjit asv suite: this environment differs from asv.conf.json's pins: "
          + "; ".join(_mismatches) + ". asv files a --python=same run under the pins: "
          "its results would be labelled with versions that did not run.", file=sys.stderr)

# The `impl` parameter of every dispatch benchmark.
IMPLS = ["nbjit", "jax"]


def get_jit(impl):
    """``nbjit.jit`` or ``jax.jit``; NotImplementedError (asv: skipped) where it is missing."""
    if impl == "jax":
        return jax.jit
    try:
        import nbjit
    except ImportError as exc:  # a commit whose nbjit does not import
        raise NotImplementedError(f"nbjit does not import: {exc}") from exc
    jit = getattr(nbjit, "jit", None)
    if jit is None:
        raise NotImplementedError("this commit has no nbjit.jit")
    return jit


def bench_module():
    """This commit's ``nbjit.bench``; NotImplementedError (asv: skipped) where it is missing."""
    try:
        from nbjit import bench
    except ImportError as exc:
        raise NotImplementedError(f"this commit has no nbjit.bench: {exc}") from exc
    return bench


def scenario(name):
    """The scenario ``name`` of this commit's compare matrix (skipped where it has none)."""
    matching = [s for s in bench_module().scenarios() if s.name == name]
    if not matching:
        raise NotImplementedError(f"this commit has no scenario {name!r}")
    require_devices(getattr(matching[0], "min_devices", 1))
    return matching[0]


def require_devices(n):
    if len(jax.devices()) < n:
        raise NotImplementedError(f"needs {n} devices, have {len(jax.devices())}")


class Call:
    """One scenario's function, jitted by ``impl``, with zero-argument callers.

    ``dispatch()`` returns once the call is dispatched; ``call()`` waits for
    its outputs. A case with an argument pool passes the next tuple on every
    call, as `nbjit.bench.run` does.
    """

    def __init__(self, name, impl):
        self.case = case = scenario(name).build()
        self.jit = get_jit(impl)
        self.jitted = jitted = self.jit(case.fun, **case.jit_options)
        args, kwargs = case.args, case.kwargs
        pool = getattr(case, "arg_pool", ())
        if pool:
            take = itertools.cycle(pool).__next__
            self.dispatch = lambda: jitted(*take(), **kwargs)
        else:
            self.dispatch = lambda: jitted(*args, **kwargs)
        dispatch = self.dispatch
        self.call = lambda: jax.block_until_ready(dispatch())
        for _ in range(max(2, len(pool))):  # compile, and every pooled value once
            self.call()


try:  # asv's skip from inside a timed call (a NotImplementedError)
    from asv_runner.benchmarks.mark import SkipNotImplemented
except ImportError:  # the suite imported without asv (tests)
    class SkipNotImplemented(NotImplementedError):
        pass


class Prepared:
    """Base of the timed classes: their state is built once per process.

    asv_runner >= 0.3 runs a class's ``setup`` (and ``teardown``) again
    before every timed call (asv#966; asv#1613 asks for an opt-out), so with
    a ``setup`` each sample is one call right after a fresh one: a new jitted
    function, new inputs, an idle device. Such numbers measure a first call
    (up to 6x the steady cost) and moved 10-30% between runs. These classes
    have no ``setup``: a timed method reads ``(self.run or self.start(*params))``,
    and ``start`` keeps what ``prepare(*params)`` builds. The first call
    happens in asv's warm-up, which is never sampled (``warmup_time`` > 0); a
    commit that lacks what ``prepare`` needs raises ``SkipNotImplemented``
    there (asv: skipped). ``number`` (calls per sample) is fixed per class:
    asv's own calibration would time that first call and settle on one.
    """

    run = None
    warmup_time = 0.3

    def prepare(self, *params):
        raise NotImplementedError(f"{type(self).__name__} has no prepare")

    def start(self, *params):
        try:
            self.run = self.prepare(*params)
        except NotImplementedError as exc:
            raise SkipNotImplemented(str(exc)) from exc
        return self.run


def rng(seed=0):
    return np.random.default_rng(seed)


def block(out):
    return jax.block_until_ready(out)


def plus_one(x):
    return x + 1
