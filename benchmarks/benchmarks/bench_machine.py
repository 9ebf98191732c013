"""A control row: the machine's own speed, a pure-Python loop with no JAX in it.

On shared machines the CPU itself changes speed for seconds at a time: on
the 2-core development VM (2026-12-01, ``python benchmarks/machine_speed.py``)
`yardstick` took 11.7-12.6 us in most seconds of a minute and 19.8-23.8 us
in others, with no steal time and nothing else of ours running. Every absolute
``time_*`` row moves with it. Read this row beside them: a ``time_*`` step
that comes with a step here is the machine, not the commit. It is sampled
as ``bench_dispatch``'s rows are (same warm-up, samples, processes), and it
imports neither jax nor nbjit, so it runs on every commit.
"""


def yardstick(n: int = 64) -> int:
    """Interpreter work of the kind a dispatcher does: tuples, hashing, dict reads and writes."""
    table: dict = {}
    get = table.get
    for i in range(n):
        key = (i & 7, "leaf", None)
        table[key] = get(key, 0) + 1
    return len(table)


class MachineSpeed:
    """One call of `yardstick` (~12 us); the settings are `bench_dispatch._Timed`'s."""

    number = 500  # calls per sample: ~6 ms
    warmup_time = 1.0
    repeat = (20, 40, 4.0)
    rounds = 2

    def time_python_loop(self):
        yardstick()
