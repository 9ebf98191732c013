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
        "cpu_devices: assumes the 8 host CPU devices set up here (devices()[1..7], meshes of "
        "8); skipped with the reason when JAX's default backend is not CPU (a GPU run: "
        "scripts/gpu_check.sh) or has fewer devices (NBJIT_TEST_HOST_DEVICES)")


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("cpu_devices")]
    if not marked:
        return
    backend, count = jax.default_backend(), len(jax.devices())
    if backend == "cpu" and count >= 8:
        return
    reason = (f"assumes 8 host CPU devices; JAX's default backend here is {backend} "
              f"with {count} device(s)")
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))
