"""Test session setup: 8 host CPU devices, so multi-device dispatch is tested.

XLA_FLAGS must be set before the CPU backend starts; jax reads it when the
first device is used, so setting it here (before any test touches jax) works.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

try:  # belt and braces for jax versions that take the device count from config
    jax.config.update("jax_num_cpu_devices", 8)
except Exception:  # the backend may already be initialised; XLA_FLAGS covers it
    pass


@pytest.fixture
def x64():
    """Runs a test with jax_enable_x64 on, restoring the previous value."""
    with jax.enable_x64(True) if hasattr(jax, "enable_x64") else _x64_ctx():
        yield


class _x64_ctx:
    def __enter__(self):
        self._old = jax.config.jax_enable_x64
        jax.config.update("jax_enable_x64", True)

    def __exit__(self, *exc):
        jax.config.update("jax_enable_x64", self._old)
