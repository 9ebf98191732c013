"""Host CPU devices for multi-device work on one machine: one helper, no jax import.

XLA's CPU backend reads ``--xla_force_host_platform_device_count`` from
``XLA_FLAGS`` once, when it starts (the first use of a device, not
``import jax``). Everything in nbjit that wants 8 host devices (the compare
command, the asv suite, the test session, benchmarks/sharding_speed.py) asks
here, before anything touches a device. This module must never import jax.
"""

from __future__ import annotations

import os

HOST_DEVICES = 8
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def request_host_devices(n: int = HOST_DEVICES) -> None:
    """Append ``--xla_force_host_platform_device_count=n`` to XLA_FLAGS unless one is set.

    A count the user already set wins. Too late once JAX's backend has
    started; callers that need the devices check ``len(jax.devices())``.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DEVICE_FLAG}={n}".strip()
