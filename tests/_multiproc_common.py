"""What both halves of the two-process checks share: the meshes, this process's
rank, the check registry, and the comparison of nbjit.jit with jax.jit.

Imported by `_multiproc_worker.py` after `jax.distributed.initialize` (never
alone: the meshes span both processes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from _diff import assert_same_outputs, outcome
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import nbjit
from nbjit.multiprocess import agreement as _agreement

MESH = Mesh(np.array(jax.devices()), ("x",))  # 8 devices, 4 per process
MESH2 = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
OTHER = next(d for d in jax.devices() if d.process_index != jax.process_index())
RANK = jax.process_index()
AGREEMENT_TIMEOUT_S = _agreement.configure()["timeout_s"]  # the parent's setting
CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__] = fn
    return fn


separate = check  # the parent reads the decorator's name from the check files


# -- comparing ----------------------------------------------------------------


def same_leaf(path: str, a: Any, b: Any) -> None:
    assert type(a) is type(b), f"{path}: type {type(a)!r} != {type(b)!r}"
    if not isinstance(b, jax.Array):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=path, strict=True)
        return
    for name in ("dtype", "shape", "weak_type", "sharding", "_committed",
                 "is_fully_addressable"):
        va, vb = getattr(a, name), getattr(b, name)
        assert va == vb, f"{path}: {name.lstrip('_')} {va} != {vb}"
    assert a.is_deleted() == b.is_deleted(), f"{path}: only one deleted"
    if b.is_deleted():
        return
    shards_a = sorted(a.addressable_shards, key=lambda s: s.device.id)
    shards_b = sorted(b.addressable_shards, key=lambda s: s.device.id)
    assert len(shards_a) == len(shards_b), f"{path}: addressable shards differ"
    for sa, sb in zip(shards_a, shards_b, strict=True):
        assert (sa.device, sa.index) == (sb.device, sb.index), f"{path}: shard placement"
        np.testing.assert_array_equal(np.asarray(sa.data), np.asarray(sb.data),
                                      err_msg=f"{path} shard on {sa.device}", strict=True)


def same_outputs(a: Any, b: Any) -> None:
    assert_same_outputs(a, b, same_leaf)  # tests/_diff.py, with shard-wise leaves


def same_call(nb: Callable, jx: Callable, *args: Any, **kwargs: Any) -> Any:
    """Both return equal outputs, or both raise the same exception type."""
    nb_ok, r_nb = outcome(nb, args, kwargs)
    jx_ok, r_jx = outcome(jx, args, kwargs)
    if not jx_ok:
        assert not nb_ok, f"nbjit returned; jax.jit raised {type(r_jx).__name__}: {r_jx}"
        assert type(r_nb) is type(r_jx), (
            f"nbjit raised {type(r_nb).__name__}: {r_nb}\n"
            f"jax.jit raised {type(r_jx).__name__}: {r_jx}")
        return r_nb
    assert nb_ok, f"nbjit raised {type(r_nb).__name__}: {r_nb}; jax.jit returned"
    same_outputs(r_nb, r_jx)
    return r_nb


def pair(make: Callable[[], Callable], **options) -> tuple[Any, Any]:
    """(nbjit.jit, jax.jit) of two fresh copies of one function."""
    return nbjit.jit(make(), **options), jax.jit(make(), **options)


def calls_hit(nb: Any, jx: Any, *args: Any, times: int = 3, **kwargs: Any) -> None:
    """A miss then fast-path hits, each returning what jax.jit returns."""
    for _ in range(times):
        jx_ok, r_jx = outcome(jx, args, kwargs)
        assert jx_ok, f"jax.jit raised {type(r_jx).__name__}: {r_jx}"
        same_call(nb, jx, *args, **kwargs)
    assert nb.miss_count == 1, f"nbjit missed {nb.miss_count} times in {times} calls"
    assert nb.slow_count == 0, f"{nb.slow_count} of {times} calls took JAX's path"


def global_array(shape: tuple[int, ...], spec: P, mesh: Mesh = MESH) -> jax.Array:
    """A global array over both processes; each process feeds its own rows."""
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), lambda idx: data[idx])
