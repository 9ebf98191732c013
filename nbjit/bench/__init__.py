"""nbjit's benchmark lab: the scenario matrix, the timing harness, the runner, the floor.

This is the module that the asv suite (``benchmarks/benchmarks/``), the
scripts under ``benchmarks/`` and ``python -m nbjit compare`` import; the
dispatcher never imports it, and ``import nbjit`` does not either
(``nbjit.compare`` loads it on first use).

    from nbjit import bench

    settings = bench.Settings(rounds=61)
    rows, meta = bench.run(bench.select(bench.scenarios(), "args_1$"), settings)
    print(bench.format_table(rows, meta))

What it holds, by module:

- `nbjit.bench.measure`: paired, interleaved timing (`Settings`,
  `interleave`, `Interleaved`, `Ratio`, `time_batch`, `time_each`, `Fed`: a
  contender whose arguments are made off the clock): a ratio against a
  reference timed in the same process, rounds alternating.
- `nbjit.bench.matrix`: the matrix (`Scenario`, `Case`, `scenarios`,
  `select`, `scenario`): api_benchmark's jit cases, argument counts, host
  inputs, workloads with new values on every call.
- `nbjit.bench.floor`: `floor_call`, a call's executable run from Python
  with no dispatcher in front.
- `nbjit.bench.runner`: `run_scenario` and `run` (one `Row` per scenario),
  `output_difference`, `fresh_copy`; `writes_into_docs` and
  `self_check_record`: published numbers come with a passing self-check.
- `nbjit.bench.report`: `format_table` (ending in the `Summary` line),
  `format_markdown`, `write_json`/`read_json`, `plot` (its PNG names the run:
  `run_description`), `self_check_failures`.
- `nbjit.bench.user`: `compare` and `CompareResult`, public as
  `nbjit.compare`.
"""

from nbjit.bench.floor import floor_call
from nbjit.bench.matrix import HOST_OFFSET, POOL, Case, Scenario, scenario, scenarios, select
from nbjit.bench.measure import (
    Fed,
    Interleaved,
    Ratio,
    Settings,
    interleave,
    time_batch,
    time_each,
)
from nbjit.bench.report import (
    SELF_CHECK_BAND,
    Summary,
    format_markdown,
    format_table,
    plot,
    read_json,
    run_description,
    self_check_failures,
    verdict,
    write_json,
)
from nbjit.bench.runner import (
    Row,
    first_difference,
    fresh_copy,
    output_difference,
    run,
    run_scenario,
    self_check_record,
    writes_into_docs,
)
from nbjit.bench.user import CompareResult, OutputsDiffer, compare

__all__ = [
    "HOST_OFFSET", "POOL", "SELF_CHECK_BAND", "Case", "CompareResult", "Fed",
    "Interleaved", "OutputsDiffer", "Ratio", "Row", "Scenario", "Settings", "Summary",
    "compare", "first_difference", "floor_call", "fresh_copy", "format_markdown",
    "format_table", "interleave", "output_difference", "plot", "read_json", "run",
    "run_description", "run_scenario", "scenario", "scenarios",
    "select", "self_check_failures", "self_check_record", "time_batch", "time_each", "verdict",
    "write_json", "writes_into_docs",
]
