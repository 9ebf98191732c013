"""Test session setup: 8 host CPU devices, so multi-device dispatch is tested.

XLA_FLAGS must be set before the CPU backend starts; jax reads it when the
first device is used, so setting it here (before any test touches jax) works.
"""

from nbjit._devices import request_host_devices

request_host_devices(8)

import jax  # noqa: E402
import pytest  # noqa: E402


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
