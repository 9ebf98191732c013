"""nbjit.jit against jax.jit in JAX multi-controller: two processes, one machine.

The module starts two worker processes (`_multiproc_worker.py`), each with 4
CPU devices, joined by `jax.distributed.initialize` into 8 global devices
(gloo collectives). Both run every check in the same order and write their
results as JSON; each check here is one test item per process. Every wait has
a hard timeout: a worker that hangs (a collective one process skipped) is
killed, and both logs are printed with the failure.

Checks marked `@separate` in the worker (processes calling with different
signatures, which nbjit's agreement must stop before gloo aborts both) run
in a pair each.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _agreement_worker import worker_env

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_multiproc_worker.py"
# The files that define checks, in the order the worker registers (and runs) them.
CHECK_FILES = (WORKER, HERE / "_multiproc_agreement.py", HERE / "_multiproc_programs.py")
TIMEOUT_S = 180  # both workers together; a pair normally finishes in ~15-30 s
PEER_GRACE_S = 20  # how long the other worker may go on once one has failed
NUM_PROCESSES = 2
AGREEMENT_TIMEOUT_S = 30  # nbjit's wait for the other process at a miss (checks may shorten it)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_env() -> dict[str, str]:
    return worker_env(4, AGREEMENT_TIMEOUT_S)


def _run_pair(tmp: Path, checks: list[str]) -> tuple[list[dict | None], list[str], list[int]]:
    """Runs both workers; returns (results or None per process, logs, exit codes)."""
    port = _free_port()
    env = _worker_env()
    procs, logs = [], []
    try:
        for i in range(NUM_PROCESSES):
            log = open(tmp / f"worker{i}.log", "w+")  # noqa: SIM115 (closed below)
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, str(WORKER), str(port), str(i), str(tmp / f"worker{i}.json"),
                 *checks], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=HERE.parent))
        deadline = time.monotonic() + TIMEOUT_S  # one deadline for the pair
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if None not in codes:
                break
            if any(code not in (None, 0) for code in codes):  # its peer may hang
                deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
            time.sleep(0.05)
    finally:
        codes = [p.returncode if p.poll() is not None else "killed (timeout)" for p in procs]
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    results = []
    for i in range(NUM_PROCESSES):
        path = tmp / f"worker{i}.json"
        results.append(json.loads(path.read_text()) if path.exists() else None)
    return results, texts, codes


def _worker_checks(decorator: str = "@check") -> list[str]:
    """The check names, read from the check files (importing them would start JAX)."""
    names = []
    for path in CHECK_FILES:
        lines = path.read_text().splitlines()
        for previous, line in zip(lines, lines[1:], strict=False):
            if previous.strip() == decorator and line.startswith("def "):
                names.append(line[4:line.index("(")])
    return names


pytestmark = pytest.mark.multiprocess
CHECKS = _worker_checks()
SEPARATE = _worker_checks("@separate")


@pytest.fixture(scope="module")
def pair_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multiprocess")
    results, logs, codes = _run_pair(tmp, CHECKS)
    return results, logs, codes


def _report(logs: list[str], codes: list) -> str:
    parts = [f"exit codes: {codes}"]
    for i, text in enumerate(logs):
        parts.append(f"----- worker {i} log (last 8000 chars) -----\n{text[-8000:]}")
    return "\n".join(parts)


def test_check_names_found():
    assert {"devices", "psum_in_shard_map", "other_process_device_pytree"} <= set(CHECKS)
    assert {"agreement_global_shapes_replicated_output",
            "agreement_skipped_call_raises"} <= set(SEPARATE)
    assert not set(CHECKS) & set(SEPARATE)


def test_both_workers_finished(pair_results):
    results, logs, codes = pair_results
    assert codes == [0] * NUM_PROCESSES and None not in results, _report(logs, codes)


@pytest.mark.parametrize("process", range(NUM_PROCESSES))
@pytest.mark.parametrize("name", CHECKS)
def test_check(pair_results, name, process):
    results, logs, codes = pair_results
    if results[process] is None or name not in results[process]:
        pytest.fail(f"worker {process} did not report {name}\n{_report(logs, codes)}")
    failure = results[process][name]
    assert failure is None, f"worker {process}, {name}:\n{failure}\n{_report(logs, codes)}"


def test_agreement_in_the_pair(pair_results):
    """Every process-spanning miss of the pair agreed: none raised, none warned."""
    results, logs, codes = pair_results
    for process, result in enumerate(results):
        if result is None:
            pytest.fail(f"worker {process} wrote no results\n{_report(logs, codes)}")
        agreement = result["_agreement"]
        assert agreement["checks"] >= 10 and agreement["at_once"] >= 1, agreement
        assert agreement["errors"] == 0 and agreement["warnings"] == 0, agreement
        assert agreement["round_trips"] >= 3 * agreement["checks"], agreement
        print(f"worker {process} agreement: {agreement}")
        print(f"worker {process} agreement cost of 10 misses: {result['_agreement_cost']}")


@pytest.mark.parametrize("name", SEPARATE)
def test_separate_pair(tmp_path, name):
    results, logs, codes = _run_pair(tmp_path, [name])
    assert codes == [0] * NUM_PROCESSES and None not in results, _report(logs, codes)
    for process, result in enumerate(results):
        assert result[name] is None, f"worker {process}, {name}:\n{result[name]}\n" + _report(
            logs, codes)
