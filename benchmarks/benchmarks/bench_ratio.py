"""The dashboard's headline: nbjit.jit / jax.jit per call, measured in one process.

Absolute times drift by 2x between runs on shared machines; the ratio of two
dispatchers timed interleaved, a few milliseconds apart, does not. Each track
runs one scenario of `python -m nbjit compare` (paired rounds, median ratio).

One measurement is noisy on a busy machine (another job on one of two cores
moved a ratio by 10%), so `track_ratio` makes several: ``BLOCKS`` (5)
independent measurements per process, each of ~0.5 s (it calibrates its own
batch size, ~2 ms, and runs up to 101 paired rounds: short batches, so a
round that another process interrupts is one of many and the median passes
it by), returned to asv as samples. asv adds the
samples of every process of the run (``asv run -a rounds=3`` gives three
processes) and reports their median with its spread, so the dashboard and
``asv compare`` show how sure a value is. Values are rounded to 3
significant digits.
"""

import math

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
    "numpy_args_2_new_values",
    "workload_env_step",
    "host_array_same_64k",
    "host_array_same_1m_aligned",
    "host_array_fresh_1m",
]
# Not here: workload_train_step. Its calls queue real work (matmuls) that runs
# while the next calls dispatch, and its ratio moved +-11% between processes
# on the shared 2-core machine; it is in bench_dispatch.Workloads and compare.

BLOCKS = 5  # independent measurements per process (odd: the median is one of them)


def three_digits(x):
    return float(f"{x:.3g}") if math.isfinite(x) else x


class DispatchRatio:
    """Median of paired rounds of nbjit.jit / jax.jit (< 1: nbjit is faster)."""

    params = [SCENARIOS]
    param_names = ["scenario"]
    timeout = 180

    def setup(self, scenario):
        import dataclasses

        self.jit = common.get_jit("nbjit")
        self.bench = common.bench_module()
        self.scenario = common.scenario(scenario)
        self.settings = dataclasses.replace(self.bench.Settings(), rounds=101,
                                            min_rounds=9, target_batch_s=0.002, max_seconds=0.5)

    def track_ratio(self, scenario):
        import jax

        samples = []
        for _ in range(BLOCKS):
            row = self.bench.run_scenario(self.scenario, self.jit, jax.jit, self.settings)
            if row.ratio is None:
                raise NotImplementedError(row.note)
            samples.append(three_digits(row.ratio))
        # A dict with samples and number: asv computes the median and its spread.
        return {"samples": samples, "number": 1}

    track_ratio.unit = "nbjit/jax.jit"


class TrainingLoop:
    """compare's ``workload_training_loop``: an MLP with Adam's state (optax's,
    else a hand-written one with a namedtuple state), a new numpy batch each
    step, waited for every 10 steps (asynchronous dispatch, as people write
    it). nbjit.jit and jax.jit run paired segments of steps in one process;
    two figures: per step (the loop's throughput) and until each call
    returns (what the loop waits for before its next step). ``track_ratio``
    is nbjit / jax.jit, ``track_nbjit_us`` and ``track_jax_us`` each side's
    median in microseconds (measured in the same paired segments)."""

    params = [["per_step", "until_return"]]
    param_names = ["figure"]
    timeout = 300
    SCENARIO = "workload_training_loop"

    def setup(self, figure):
        import dataclasses

        self.jit = common.get_jit("nbjit")
        self.bench = common.bench_module()
        self.scenario = common.scenario(self.SCENARIO)
        self.settings = dataclasses.replace(self.bench.Settings(), rounds=41, min_rounds=9,
                                            max_seconds=2.0)

    def _rows(self):
        import jax

        rows = []
        for _ in range(BLOCKS):
            row = self.bench.run_scenario(self.scenario, self.jit, jax.jit, self.settings)
            if row.ratio is None or getattr(row, "loop", None) is None:
                raise NotImplementedError(row.note or "no training loop timing")
            rows.append(row)
        return rows

    def track_ratio(self, figure):
        key = "ratio" if figure == "per_step" else "return_ratio"
        samples = [three_digits(r.ratio if key == "ratio" else r.loop[key]) for r in self._rows()]
        return {"samples": samples, "number": 1}

    track_ratio.unit = "nbjit/jax.jit"

    def track_nbjit_us(self, figure):
        return {"samples": [three_digits(r.a_us if figure == "per_step" else
                                         r.loop["return_a_us"]) for r in self._rows()],
                "number": 1}

    track_nbjit_us.unit = "us"

    def track_jax_us(self, figure):
        return {"samples": [three_digits(r.b_us if figure == "per_step" else
                                         r.loop["return_b_us"]) for r in self._rows()],
                "number": 1}

    track_jax_us.unit = "us"
