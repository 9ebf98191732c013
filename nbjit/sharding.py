"""The public module path of host-sliced puts: `device_put` and the plans and staging behind it.

`device_put` is `jax.device_put` with host-side slicing for multi-device
shardings (numpy arrays and scalars onto any sharding); the rest manages the
plans and staging buffers behind it. The implementation lives in the core's
input path: `nbjit.core.inputs.plans` (plans), `nbjit.core.inputs.copying`
(the copy into staging) and `nbjit.core.inputs.pools` (the pools of staging
buffers).
"""

from nbjit.core.inputs.plans import (
    SINGLE_DEVICE_PLAN_MIN_BYTES,
    ShardingPlan,
    addressable_index_domains,
    clear_plans,
    device_put,
    plan_cache_size,
    plan_for,
    warm_kernels,
)
from nbjit.core.inputs.pools import clear_staging_pool, staging_pool_size

__all__ = [
    "SINGLE_DEVICE_PLAN_MIN_BYTES", "ShardingPlan", "addressable_index_domains", "clear_plans",
    "clear_staging_pool", "device_put", "plan_cache_size", "plan_for",
    "staging_pool_size", "warm_kernels",
]
