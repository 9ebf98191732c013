"""The dashboard's headline: nbjit.jit / jax.jit per call, measured in one process.

Absolute times drift by 2x between runs on shared machines; the ratio of two
dispatchers timed interleaved, a few milliseconds apart, does not. Each track
runs one scenario of `python -m nbjit compare` (paired rounds, median ratio).
"""

from . import common  # first: 8 host devices before jax starts

SCENARIOS = [
    "jit_simple_dispatch",
    "jit_simple",
    "jit_simple_many_args_100_dispatch",
    "jit_simple_pruned_args_100_dispatch",
    "args_1000",
    "numpy_args_2",
    "python_scalars_2",
    "static_args_kwargs",
    "dict_100_leaves",
    "pjit_simple_4_devices_10_args",
    "numpy_sharded_8_devices",
]


class DispatchRatio:
    """Median of paired rounds of nbjit.jit / jax.jit (< 1: nbjit is faster)."""

    params = [SCENARIOS]
    param_names = ["scenario"]
    timeout = 180

    def setup(self, scenario):
        try:
            from nbjit import _compare, _measure
        except ImportError as exc:
            raise NotImplementedError(f"this commit has no nbjit._compare: {exc}") from exc
        jit = _compare.nbjit_jit()
        if jit is None:
            raise NotImplementedError("this commit has no nbjit.jit")
        matching = [s for s in _compare.scenarios() if s.name == scenario]
        if not matching:
            raise NotImplementedError(f"this commit has no scenario {scenario!r}")
        common.require_devices(matching[0].min_devices)
        self.compare, self.jit, self.scenario = _compare, jit, matching[0]
        self.settings = _measure.Settings(rounds=21, min_rounds=5, max_seconds=3.0)

    def track_ratio(self, scenario):
        import jax

        row = self.compare.run_scenario(self.scenario, self.jit, jax.jit, self.settings)
        if row.ratio is None:
            raise NotImplementedError(row.note)
        return row.ratio

    track_ratio.unit = "nbjit/jax.jit"
