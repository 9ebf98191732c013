"""nbjit.sharding.device_put against jax.device_put, shard by shard.

Meshes span the devices there are (tests/_devices.py): the session's 8 host
CPU devices, or one accelerator device, where every put goes through a plan
of one shard (dtypes, layouts, staging, the caller's array never read after
the call). Tests that need replicas or a shape a mesh cannot divide skip on
one device and say so; those of the CPU's zero-copy puts skip elsewhere.
"""

import jax
import ml_dtypes
import numpy as np
import pytest
from _devices import AXES, DEVICES, mesh, mesh_shape
from jax.sharding import NamedSharding, make_single_device_sharding
from jax.sharding import PartitionSpec as P

from nbjit import _jax
from nbjit.core.inputs import copying, pools
from nbjit.core.inputs import plans as sharding

# The meshes by shape ("8", "4x2", "2x2x2" on 8 devices; "1", "1x1", "1x1x1" on one): their rank.
MESHES = {"x".join(map(str, mesh_shape(rank))): rank for rank in (1, 2, 3)}
ROWS, COLS = mesh_shape(2)
CPU_ZERO_COPY = (
    "the CPU's zero-copy put: a device array there uses the staging buffer in place, which "
    "this test finds by buffer pointer; an accelerator's put copies staging into device memory "
    "and lets go of it when the transfer is done")
SPECS = {"x": P("x"), "x_y": P("x", "y"), "none_y": P(None, "y"), "xy": P(("x", "y")),
         "replicated": P()}
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "int8": np.int8,
          "bool": np.bool_, "complex64": np.complex64}
SHAPES = {0: (), 1: (16,), 2: (16, 4), 3: (8, 4, 3)}
LAYOUTS = ["C", "F", "transposed", "strided", "negative"]


def _axes(spec):
    return {a for e in spec if e is not None for a in (e if isinstance(e, tuple) else (e,))}


def _values(shape, dtype, seed=0):
    return np.asarray(_random(shape, dtype, seed))


def _random(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype == np.int8:
        return rng.integers(-128, 128, shape).astype(np.int8)
    if dtype == np.complex64:
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _in_layout(values, layout):
    """`values` (C-ordered) re-laid out in memory; same logical contents."""
    if layout == "C":
        return values.copy()
    if layout == "F":
        return np.array(values, order="F")
    if layout == "transposed":
        return np.ascontiguousarray(values.T).T
    step = 2 if layout == "strided" else -2
    big = np.zeros(tuple(2 * n for n in values.shape), values.dtype)
    big[(slice(None, None, 2),) * values.ndim] = values
    view = big[(slice(None, None, 2),) * values.ndim]
    if step < 0:
        big = np.zeros_like(big)
        big[(slice(None, None, -2),) * values.ndim] = values
        view = big[(slice(None, None, -2),) * values.ndim]
    assert np.array_equal(view, values)
    return view


def _bits(a):
    """Bitwise view for exact comparison (NaN-safe, bfloat16 included)."""
    a = np.ascontiguousarray(np.asarray(a))
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same_array(ours, theirs, requested):
    assert type(ours) is type(theirs)
    assert ours.sharding == requested == theirs.sharding
    assert ours.dtype == theirs.dtype
    assert ours.shape == theirs.shape
    assert ours.weak_type == theirs.weak_type
    assert ours.committed == theirs.committed
    assert ours.aval == theirs.aval
    ours_shards = sorted(ours.addressable_shards, key=lambda s: s.device.id)
    theirs_shards = sorted(theirs.addressable_shards, key=lambda s: s.device.id)
    assert len(ours_shards) == len(theirs_shards)
    for a, b in zip(ours_shards, theirs_shards, strict=True):
        assert a.device == b.device
        assert a.index == b.index
        assert a.replica_id == b.replica_id
        assert a.data.dtype == b.data.dtype
        assert np.array_equal(_bits(a.data), _bits(b.data))


MATRIX = [(m, s, r) for m in MESHES for s in SPECS for r in SHAPES
          if _axes(SPECS[s]) <= set(AXES[:MESHES[m]]) and len(SPECS[s]) <= r]


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("mesh_name,spec_name,rank", MATRIX)
def test_device_put_matches_jax(mesh_name, spec_name, rank, dtype_name):
    requested = NamedSharding(mesh(MESHES[mesh_name]), SPECS[spec_name])
    values = _values(SHAPES[rank], DTYPES[dtype_name])
    assert sharding.plan_for(requested, values.shape, values.dtype) is not None, "not sliced here"
    for layout in LAYOUTS if rank else ["C"]:
        x = _in_layout(values, layout)
        before = x.copy()
        ours = sharding.device_put(x, requested)
        theirs = jax.device_put(x, requested)
        assert np.array_equal(_bits(x), _bits(before)), "input changed"
        assert_same_array(ours, theirs, requested)
        assert np.array_equal(_bits(ours), _bits(values))
        if x.size:
            x[...] = ~values if values.dtype == np.bool_ else values + 1
            assert np.array_equal(_bits(ours), _bits(before)), "result aliases the input"


def test_plan_is_cached_per_sharding_shape_dtype():
    sharding.clear_plans()
    requested = NamedSharding(mesh(2), P("x", "y"))
    x = _values((16, 4), np.float32)
    sharding.device_put(x, requested)
    sharding.device_put(x.T.copy().T, requested)
    assert sharding.plan_cache_size() == 1
    plan = sharding.plan_for(requested, (16, 4), np.dtype(np.float32))
    assert plan is sharding.plan_for(requested, (16, 4), np.dtype(np.float32))
    assert len(set(plan.group_of_device)) == len(DEVICES)
    sharding.device_put(x.astype(np.int8), requested)
    sharding.device_put(x[:8], requested)
    assert sharding.plan_cache_size() == 3


@pytest.mark.skipif(len(DEVICES) < 2, reason="replicas of a shard need a second device")
def test_replicas_share_one_staging_shard():
    replicated = NamedSharding(mesh(2), P(None, "y"))
    plan = sharding.plan_for(replicated, (16, 4), np.dtype(np.float32))
    assert sorted(set(plan.group_of_device)) == list(range(COLS))
    out = plan.put(_values((16, 4), np.float32))
    # One staging buffer per distinct domain: replicas hold equal data.
    by_index = {}
    for shard in out.addressable_shards:
        by_index.setdefault(str(shard.index), []).append(np.asarray(shard.data))
    assert len(by_index) == COLS
    for arrays in by_index.values():
        assert len(arrays) == ROWS and all(np.array_equal(a, arrays[0]) for a in arrays)


@pytest.mark.parametrize("value", [3.5, 7, True, 2 + 1j, np.float32(1.5), np.int8(-3),
                                   np.bool_(False), np.complex64(1j), np.float64(2.25),
                                   np.int64(5)], ids=repr)
@pytest.mark.parametrize("where", ["mesh", "single"])
def test_scalars_match_jax(value, where):
    requested = (NamedSharding(mesh(2), P()) if where == "mesh"
                 else make_single_device_sharding(DEVICES[-1]))
    ours = sharding.device_put(value, requested)
    theirs = jax.device_put(value, requested)
    assert_same_array(ours, theirs, requested)


def test_64_bit_inputs_are_canonicalised_like_jax():
    requested = NamedSharding(mesh(1), P("x"))
    for x in [np.arange(16, dtype=np.int64), np.linspace(0, 1, 16), np.arange(16, dtype=np.uint64)]:
        assert_same_array(sharding.device_put(x, requested), jax.device_put(x, requested),
                          requested)


def test_64_bit_inputs_under_x64(x64):
    tiled = NamedSharding(mesh(2), P("x", "y"))
    replicated = NamedSharding(mesh(2), P())
    for x, requested in [(np.arange(64, dtype=np.int64).reshape(16, 4), tiled),
                         (np.linspace(0, 1, 64).reshape(16, 4), tiled),
                         (np.float64(3.0), replicated), (2**40, replicated)]:
        ours = sharding.device_put(x, requested)
        assert ours.dtype.itemsize == 8
        assert_same_array(ours, jax.device_put(x, requested), requested)


def test_gspmd_and_single_device_shardings():
    cube = mesh(3)
    named = NamedSharding(cube, P(("x", "z"), None, "y"))
    gspmd = _jax.GSPMDSharding(tuple(cube.devices.flat), named._to_xla_hlo_sharding(3))
    x = _in_layout(_values((8, 3, 4), np.float32), "negative")
    for requested in [gspmd, make_single_device_sharding(DEVICES[-1])]:
        assert_same_array(sharding.device_put(x, requested), jax.device_put(x, requested),
                          requested)
    assert sharding.plan_for(gspmd, (8, 3, 4), np.dtype(np.float32)) is not None


def test_non_numpy_inputs_go_to_jax():
    requested = NamedSharding(mesh(2), P("x"))
    x = jax.numpy.arange(16.0)
    assert_same_array(sharding.device_put(x, requested), jax.device_put(x, requested),
                      requested)
    tree = {"a": np.ones(8, np.float32)}
    out = sharding.device_put(tree, requested)
    assert out["a"].sharding == requested


BAD_INPUTS = {
    "indivisible": (lambda: np.zeros((10, 4), np.float32), P("x", "y")),  # 10 rows over ROWS
    "indivisible_second_dim": (lambda: np.zeros((16, 3), np.float32), P("x", "y")),  # 3 over COLS
    "rank_below_spec": (lambda: np.zeros((16,), np.float32), P("x", "y")),
    "scalar_below_spec": (lambda: np.float32(1), P("x")),
    "object": (lambda: np.array([object()] * 8), P("x")),
    "string": (lambda: np.array(["ab"] * 8), P("x")),
    "datetime": (lambda: np.zeros(8, "datetime64[s]"), P("x")),
    "int_overflow": (lambda: 2**40, P()),
    "big_endian": (lambda: np.arange(8, dtype=">f4"), P("x")),
    "float128": (lambda: np.ones(8, np.longdouble), P("x")),
    "structured": (lambda: np.zeros(8, [("a", "f4")]), P("x")),
}


def _divides(name: str) -> bool:
    """Whether the mesh divides the shape that should not divide (one device divides all)."""
    return {"indivisible": 10 % ROWS == 0, "indivisible_second_dim": 3 % COLS == 0}.get(name, False)


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.skipif(
        _divides(name), reason=f"a {ROWS}x{COLS} mesh divides this shape (an axis of one device "
                               "divides every size)")) for name in BAD_INPUTS])
def test_bad_inputs_raise_like_jax_and_cache_nothing(name):
    make, spec = BAD_INPUTS[name]
    requested = NamedSharding(mesh(2), spec)
    with pytest.raises(Exception) as upstream:
        jax.device_put(make(), requested)
    sharding.clear_plans()
    with pytest.raises(type(upstream.value)):
        sharding.device_put(make(), requested)
    assert sharding.plan_cache_size() == 0


@pytest.mark.parametrize("level", ["allow", "disallow", "disallow_explicit"])
def test_transfer_guard_sees_an_explicit_transfer_like_jax(level):
    requested = NamedSharding(mesh(2), P("x", "y"))
    x = _values((16, 4), np.float32)
    sharding.plan_for(requested, x.shape, x.dtype)
    with jax.transfer_guard_host_to_device(level):
        try:
            theirs = jax.device_put(x, requested)
        except Exception as exc:
            with pytest.raises(type(exc)):
                sharding.device_put(x, requested)
        else:
            assert_same_array(sharding.device_put(x, requested), theirs, requested)


def test_plan_put_is_an_implicit_transfer_like_jit():
    """The dispatcher's transfers are implicit: `disallow` stops them, as jax.jit's."""
    requested = NamedSharding(mesh(2), P("x", "y"))
    x = _values((16, 4), np.float32)
    plan = sharding.plan_for(requested, x.shape, x.dtype)
    f = jax.jit(lambda a: a * 2, in_shardings=requested)
    f(x)
    with jax.transfer_guard_host_to_device("disallow"):
        with pytest.raises(Exception) as upstream:
            f(x)
        with pytest.raises(type(upstream.value)):
            plan.put(x)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason=CPU_ZERO_COPY)
def test_staging_is_aligned_and_used_in_place_on_cpu():
    """One 64-byte-aligned staging shard per distinct domain, used without a copy:
    on CPU every replica of a domain points at the same host memory."""
    requested = NamedSharding(mesh(2), P(None, "y"))
    out = sharding.device_put(_values((16, 8), np.float32), requested)
    pointers = {}
    for shard in out.addressable_shards:
        pointers.setdefault(str(shard.index), set()).add(shard.data.unsafe_buffer_pointer())
    assert len(pointers) == COLS
    assert all(len(p) == 1 for p in pointers.values())
    assert all(p % 64 == 0 for ps in pointers.values() for p in ps)


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_donating_a_replicated_input_leaves_other_replicas_intact():
    """Replicas share one staging buffer; donation must not write through it."""
    requested = NamedSharding(mesh(2), P())
    f = jax.jit(lambda a: a + 1, in_shardings=requested, out_shardings=requested,
                donate_argnums=0)
    for _ in range(10):
        out = f(sharding.device_put(np.zeros((128, 128), np.float32), requested))
        assert ([float(np.asarray(s.data).max()) for s in out.addressable_shards]
                == [1.0] * len(DEVICES))


@pytest.mark.parametrize("layout", ["C", "F", "negative"])
def test_rank_above_the_kernel_rank(layout):
    requested = NamedSharding(mesh(3), P("x", None, ("y", "z"), None, None))
    x = _in_layout(_values((4, 3, 8, 1, 2), np.float32), layout)
    assert sharding.plan_for(requested, x.shape, x.dtype) is not None
    assert_same_array(sharding.device_put(x, requested), jax.device_put(x, requested), requested)


def test_keyword_options_and_devices_go_to_jax():
    x = _values((16,), np.float32)
    requested = NamedSharding(mesh(1), P("x"))
    ours = sharding.device_put(x, device=requested, may_alias=False)
    assert_same_array(ours, jax.device_put(x, requested, may_alias=False), requested)
    device = DEVICES[-1]
    ours, theirs = sharding.device_put(x, device), jax.device_put(x, device)
    assert ours.devices() == theirs.devices() == {device}
    assert ours.committed == theirs.committed
    ours, theirs = sharding.device_put(x), jax.device_put(x)
    assert ours.devices() == theirs.devices() and ours.committed == theirs.committed


@pytest.mark.parametrize("axis_types", ["Auto,Auto", "Explicit,Auto", "Auto,Explicit"])
@pytest.mark.parametrize("spec", [P("x", "y"), P(("y", "x")), P(None, "x")], ids=str)
def test_mesh_axis_types(axis_types, spec):
    types = tuple(getattr(jax.sharding.AxisType, t) for t in axis_types.split(","))
    requested = NamedSharding(mesh(2, axis_types=types), spec)
    x = _in_layout(_values((16, 8), np.float32), "F")
    assert_same_array(sharding.device_put(x, requested), jax.device_put(x, requested), requested)


@pytest.fixture
def small_big_thresholds(monkeypatch):
    """Parallel copy and staging pool from 1 KiB, so small arrays take the big-array path."""
    monkeypatch.setattr(copying, "PARALLEL_COPY_MIN_BYTES", 1024)
    monkeypatch.setattr(pools, "STAGING_POOL_MIN_BYTES", 1024)
    monkeypatch.setattr(copying, "_COPY_CHUNK_BYTES", 256)
    monkeypatch.setattr(copying, "COPY_THREADS", 3)
    sharding.clear_plans()
    yield
    sharding.clear_plans()


@pytest.mark.parametrize("layout", ["C", "F", "transposed"])
@pytest.mark.parametrize("spec", [P(), P("x"), P(None, "y"), P("y", "x"), P(("x", "y"))], ids=str)
@pytest.mark.parametrize("shape", [(64, 32), (8, 1, 16, 8), (1024,), (1, 1, 64, 16)], ids=str)
def test_parallel_put_matches_jax(small_big_thresholds, layout, spec, shape):
    requested = NamedSharding(mesh(2), spec)
    x = _in_layout(_values(shape, np.float32), layout)
    plan = sharding.plan_for(requested, x.shape, x.dtype)
    if plan is None:  # the sharding does not divide this shape: upstream's error, no plan
        with pytest.raises(Exception) as ours:
            sharding.device_put(x, requested)
        with pytest.raises(type(ours.value)):
            jax.device_put(x, requested)
        assert sharding.plan_cache_size() == 0
        return
    assert plan.parallel
    before = x.copy()
    ours = sharding.device_put(x, requested)
    assert_same_array(ours, jax.device_put(x, requested), requested)
    x[...] = -1  # the caller's array is not aliased
    assert np.array_equal(_bits(ours), _bits(before))


def test_parallel_put_of_one_device_matches_jax(small_big_thresholds):
    requested = make_single_device_sharding(DEVICES[-1])
    x = _values((128, 33), np.float32)
    plan = sharding.plan_for(requested, x.shape, x.dtype)
    assert plan.parallel and len(plan._parts) > 2
    assert_same_array(plan.put(x), jax.device_put(x, requested), requested)


def test_split_copy_covers_every_shard_byte_once():
    lows = np.array([[0, 0], [0, 5], [3, 0]])
    highs = np.array([[3, 5], [3, 9], [4, 9]])
    offsets = [0, 64, 128]
    parts = copying.split_copy(lows, highs, offsets, 4, 4, None)
    assert 2 <= len(parts) <= 4
    covered = [(off, off + 4 * int(np.prod(shape)))
               for part in parts for _, shape, off in part.pieces]
    expected = [(0, 60), (64, 112), (128, 164)]
    merged = []
    for a, b in sorted(covered):
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    assert merged == expected


def test_big_plans_take_the_parallel_path_and_small_ones_do_not():
    requested = NamedSharding(mesh(2), P("x", None))
    big = sharding.plan_for(requested, (2048, 2048), np.dtype(np.float32))
    small = sharding.plan_for(requested, (64, 64), np.dtype(np.float32))
    assert big.parallel == (copying.COPY_THREADS > 1)
    assert not small.parallel
    x = _values((2048, 2048), np.float32)
    assert_same_array(big.put(x), jax.device_put(x, requested), requested)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason=CPU_ZERO_COPY)
def test_staging_pool_never_hands_out_a_buffer_a_live_array_uses(small_big_thresholds):
    requested = NamedSharding(mesh(2), P("x"))
    plan = sharding.plan_for(requested, (256, 8), np.dtype(np.float32))
    first_values, second_values = _values((256, 8), np.float32, 1), _values((256, 8), np.float32, 2)
    first = plan.put(first_values)
    second = plan.put(second_values)
    assert pools.staging_pool_size() == 2
    pointers = {s.data.unsafe_buffer_pointer() for s in first.addressable_shards}
    assert not pointers & {s.data.unsafe_buffer_pointer() for s in second.addressable_shards}
    third = plan.put(_values((256, 8), np.float32, 3))  # both pooled buffers busy: a fresh one
    assert pools.staging_pool_size() == 2
    assert np.array_equal(_bits(first), _bits(first_values))
    assert np.array_equal(_bits(second), _bits(second_values))
    del third
    again = plan.put(second_values * 2)
    assert np.array_equal(_bits(first), _bits(first_values))
    assert np.array_equal(_bits(second), _bits(second_values))
    del first
    # The runtime lets go of the last dropped array's staging by the next put:
    # within a few puts the first array's buffer comes back.
    reused = []
    for k in range(3, 7):
        out = plan.put(second_values * k)
        reused.append({s.data.unsafe_buffer_pointer() for s in out.addressable_shards})
        assert np.array_equal(_bits(out), _bits(second_values * k))
        assert np.array_equal(_bits(second), _bits(second_values))
        assert np.array_equal(_bits(again), _bits(second_values * 2))
    assert pointers in reused
    assert pools.staging_pool_size() == 2


def test_staging_pool_keeps_buffers_a_donated_result_uses(small_big_thresholds):
    requested = make_single_device_sharding(jax.devices()[0])
    plan = sharding.plan_for(requested, (64, 64), np.dtype(np.float32))
    x = _values((64, 64), np.float32)
    out = jax.jit(lambda a: a + 1, donate_argnums=0)(plan.put(x))
    others = [plan.put(x * k) for k in (2, 3, 4)]
    assert np.array_equal(_bits(out), _bits(x + 1))
    for k, other in zip((2, 3, 4), others, strict=True):
        assert np.array_equal(_bits(other), _bits(x * k))


def test_single_device_plan_min_bytes_is_an_int():
    assert isinstance(sharding.SINGLE_DEVICE_PLAN_MIN_BYTES, int)
    assert sharding.SINGLE_DEVICE_PLAN_MIN_BYTES >= copying.PARALLEL_COPY_MIN_BYTES
