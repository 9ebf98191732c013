"""nbjit.filter_jit per step: against the ideal and against equinox.filter_jit.

Each track runs one filter_jit row of `python -m nbjit compare` (paired,
interleaved rounds; see bench_ratio.py for why ratios and why several
blocks): nbjit.filter_jit / the ideal (jax.jit on arrays partitioned
beforehand) and nbjit.filter_jit / equinox.filter_jit. Skipped (asv:
NotImplementedError in setup) where equinox is not installed or the commit
has no such row.
"""

import importlib.util

from . import common  # first: 8 host devices before jax starts
from .bench_ratio import BLOCKS, three_digits

SCENARIOS = [
    "filter_jit_mlp_step_depth_2",
    "filter_jit_mlp_step_depth_8",
    "filter_jit_static_fields_step",
    "filter_jit_fresh_numpy_batch",
    "filter_jit_error_if_step",
]


class FilterJitRatio:
    """Median of paired rounds: nbjit.filter_jit / the ideal, and / equinox.filter_jit."""

    params = [SCENARIOS]
    param_names = ["scenario"]
    timeout = 240

    def setup(self, scenario):
        import dataclasses

        if importlib.util.find_spec("equinox") is None:
            raise NotImplementedError("equinox is not installed (pip install nbjit[equinox])")
        self.bench = common.bench_module()
        self.scenario = common.scenario(scenario)
        self.settings = dataclasses.replace(self.bench.Settings(), rounds=101,
                                            min_rounds=9, target_batch_s=0.002, max_seconds=0.5)

    def _samples(self, side):
        samples = []
        for _ in range(BLOCKS):
            row = self.bench.run_scenario(self.scenario, None, None, self.settings)
            if row.ratio is None:
                raise NotImplementedError(row.note)
            value = row.ratio if side == "ideal" else (row.other_ratios or {}).get(side)
            if value is None:
                raise NotImplementedError(f"no {side} contender in this commit's row")
            samples.append(three_digits(value))
        return {"samples": samples, "number": 1}

    def track_vs_ideal(self, scenario):
        return self._samples("ideal")

    track_vs_ideal.unit = "filter_jit/ideal"

    def track_vs_equinox(self, scenario):
        return self._samples("equinox")

    track_vs_equinox.unit = "nbjit/equinox filter_jit"
