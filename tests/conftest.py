"""Test session setup: 8 host CPU devices, so multi-device dispatch is tested.

XLA_FLAGS must be set before the CPU backend starts; jax reads it when the
first device is used, so setting it here (before any test touches jax) works.
"""

import os

from nbjit.routing.devices import request_host_devices

# NBJIT_TEST_HOST_DEVICES=1 runs the suite with one host device, which shows
# the tests that need eight (they must carry the `cpu_devices` marker).
HOST_DEVICES = int(os.environ.get("NBJIT_TEST_HOST_DEVICES", "8"))
request_host_devices(HOST_DEVICES)

# Why `cpu_host_memory` tests cannot run on an accelerator's device.
HOST_MEMORY_ELSEWHERE = (
    "an accelerator's memory is not host memory, so no device array aliases a slot; its "
    "host inputs go to jaxlib's own put (launch records: tests/test_staged_inputs.py, and "
    "tests/test_fresh_host_values.py's launch mode)")

# NBJIT_TEST_STRATEGY=staged: the CPU's devices take an accelerator's input
# strategy (`STAGED`: launch records, private copies from staging rings), so
# that the paths a TPU or GPU run takes are tested where there is none.
STAGED_ON_CPU = os.environ.get("NBJIT_TEST_STRATEGY") == "staged"

import jax  # noqa: E402
import pytest  # noqa: E402

from nbjit._jax import JAX_VERSION  # noqa: E402


@pytest.fixture
def x64():
    """Runs a test with jax_enable_x64 on, restoring the previous value."""
    with jax.enable_x64(True) if hasattr(jax, "enable_x64") else _x64_ctx():
        yield


@pytest.fixture
def isolated_jax_caches():
    """For tests of static leaves whose `__eq__` raises.

    jax 0.10's treedef hash leaves static metadata out, so its process-wide
    caches compare a static leaf with those of unrelated calls of the same
    structure: such an object raises wherever an earlier call left one alike
    (the other side of a differential test, say), and stays there to raise in
    later tests. There JAX's caches are emptied before the test, after it, and
    whenever it calls what this yields (between nbjit's side and the
    reference's); from jax 0.11 on, nothing is cleared.
    """
    def clear() -> None:
        if JAX_VERSION < (0, 11):
            jax.clear_caches()

    clear()
    yield clear
    clear()


class _x64_ctx:
    def __enter__(self):
        self._old = jax.config.jax_enable_x64
        jax.config.update("jax_enable_x64", True)

    def __exit__(self, *exc):
        jax.config.update("jax_enable_x64", self._old)


def pytest_configure(config):
    # scripts/test.sh (the README's command) installs the equinox extra: there, a
    # missing equinox is an error, never a quiet skip of filter_jit's tests.
    if os.environ.get("NBJIT_REQUIRE_EQUINOX") == "1":
        import importlib.util

        if importlib.util.find_spec("equinox") is None:
            raise pytest.UsageError("NBJIT_REQUIRE_EQUINOX=1 but equinox is not installed "
                                    '(pip install -e ".[equinox]"; scripts/bootstrap.sh does)')
    config.addinivalue_line(
        "markers",
        "cpu_devices(why): assumes the 8 host CPU devices set up here (devices()[1..7], meshes "
        "of 8); `why` says what for (\"an input on a second device\"); skipped with it when "
        "JAX's default backend is not CPU (a GPU or TPU run: scripts/accel_check.sh) or has "
        "fewer devices (NBJIT_TEST_HOST_DEVICES). Tests that need some devices, not 8, use "
        "those there are (tests/_devices.py)")
    config.addinivalue_line(
        "markers",
        "loopback: opens TCP sockets on 127.0.0.1 (like `multiprocess`); both skip with the "
        "reason where the machine refuses them")
    config.addinivalue_line(
        "markers",
        "cpu_host_memory: tests the CPU's host-memory strategy for fresh host values (resident "
        "slots that device arrays alias through zero-copy puts); skipped with the reason on "
        "other backends "
        f"({HOST_MEMORY_ELSEWHERE})")
    # scripts/accel_check.sh names the accelerator its parts run on: a part that
    # found JAX on another backend (a plugin that did not load) stops at once.
    expected = os.environ.get("NBJIT_EXPECT_BACKEND")
    if expected and jax.default_backend() != expected:
        raise pytest.UsageError(
            f"NBJIT_EXPECT_BACKEND={expected} but JAX's default backend is "
            f"{jax.default_backend()} ({jax.devices()}): its plugin did not load")
    # One program at a time may hold a TPU chip (another one fails on libtpu's
    # lock file), and an accelerator's memory is this session's: the Python
    # processes tests start run JAX on the CPU, like CI's. Set once this
    # process's backend has started (it keeps the accelerator; JAX read
    # JAX_PLATFORMS at import).
    if os.environ.get("JAX_PLATFORMS") != "cpu" and jax.default_backend() != "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    if STAGED_ON_CPU:
        from nbjit.core.inputs import platforms

        platforms.plug_in("cpu", platforms.STAGED)


def pytest_report_header(config):
    """Where the session runs: JAX's backend and devices, and the versions."""
    import platform

    import jaxlib
    import numba

    devices = jax.devices()
    kinds = sorted({d.device_kind for d in devices})
    return [f"nbjit tests: backend {jax.default_backend()}, {len(devices)} device(s) "
            f"({', '.join(kinds)}), host {platform.node()}; jax {jax.__version__}, "
            f"jaxlib {jaxlib.__version__}, numba {numba.__version__}"]


def _loopback_refused() -> str | None:
    """Why a TCP socket on 127.0.0.1 cannot be opened here (None: it can).
    jax.distributed's coordinator needs one; some sandboxes (the TPU machines
    lent to this project) allow no internet socket at all."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None


def pytest_collection_modifyitems(config, items):
    networked = [item for item in items
                 if item.get_closest_marker("multiprocess") or item.get_closest_marker("loopback")]
    refused = _loopback_refused() if networked else None
    if refused:
        skip = pytest.mark.skip(reason="needs TCP sockets on the loopback (jax.distributed's "
                                       f"coordinator, a profiler server); refused here: {refused}")
        for item in networked:
            item.add_marker(skip)
    host_memory = [item for item in items if item.get_closest_marker("cpu_host_memory")]
    if host_memory and (jax.default_backend() != "cpu" or STAGED_ON_CPU):
        where = ("the CPU's devices take an accelerator's strategy here "
                 "(NBJIT_TEST_STRATEGY=staged)" if STAGED_ON_CPU
                 else f"JAX's default backend here is {jax.default_backend()}")
        skip = pytest.mark.skip(
            reason="tests the CPU's host-memory strategy (resident slots alias host memory "
                   f"through zero-copy puts); {where}: {HOST_MEMORY_ELSEWHERE}")
        for item in host_memory:
            item.add_marker(skip)
    marked = [item for item in items if item.get_closest_marker("cpu_devices")]
    if not marked:
        return
    backend, count = jax.default_backend(), len(jax.devices())
    if backend == "cpu" and count >= 8:
        return
    here = f"JAX's default backend here is {backend} with {count} device(s)"
    for item in marked:
        why = item.get_closest_marker("cpu_devices").args
        reason = (f"needs {why[0]}: assumes the 8 host CPU devices; {here}" if why
                  else f"assumes the 8 host CPU devices; {here}")
        item.add_marker(pytest.mark.skip(reason=reason))
