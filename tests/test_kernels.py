"""nbjit._kernels: signature keys, index domains, replicas, strided gather."""

import itertools
import subprocess
import sys
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from _env import child_env
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from nbjit import _domains, _jax, _kernels
from nbjit.core.inputs.plans import addressable_index_domains

needs_8_devices = pytest.mark.skipif(
    len(jax.devices()) < 8, reason="needs 8 devices (XLA_FLAGS host device count)")


def test_kernels_module_does_not_import_jax(tmp_path):
    # A copy outside the package (with the numba-free module it imports, in a
    # package of their own): importing it must not pull in jax, and neither
    # may compiling and running its kernels.
    package = tmp_path / "nbjit"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module in ("_kernels.py", "_domains.py"):
        (package / module).write_text((Path(_kernels.__file__).parent / module).read_text())
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import nbjit._kernels as k\n"
        "assert k.__file__.startswith(sys.path[0])\n"
        "k.numba_signature_key([(1, True, False, 2, 0, (3, 4))])\n"
        "print(sorted(n for n in sys.modules if n == 'jax' or n.startswith('jax.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=child_env())
    assert out.stdout.strip() == "[]"


def test_importing_nbjit_sharding_does_not_import_numba():
    code = "import sys, nbjit.sharding; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=child_env())
    assert out.stdout.strip() == "False"


# --- signature keys --------------------------------------------------------

_int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_leaf = st.tuples(
    st.integers(min_value=0, max_value=40),                       # dtype code
    st.booleans(),                                                # weak type
    st.booleans(),                                                # committed
    _int64,                                                       # sharding id
    st.integers(min_value=-1, max_value=2**31),                   # layout id
    st.lists(st.integers(min_value=0, max_value=2**40), max_size=6).map(tuple),  # shape
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_leaf, max_size=12))
def test_numba_and_python_signature_keys_agree(leaves):
    key, buf = _kernels.numba_signature_key(leaves)
    packed = _kernels.pack_signature_python(leaves)
    assert buf.tolist() == packed
    assert key == _kernels.python_signature_key(leaves)
    assert -(2**63) <= key < 2**63


@settings(max_examples=200, deadline=None)
@given(st.lists(_leaf, max_size=6), st.lists(_leaf, max_size=6))
def test_different_leaves_pack_differently(a, b):
    pa, pb = _kernels.pack_signature_python(a), _kernels.pack_signature_python(b)
    norm = lambda leaves: [(c, bool(w), bool(m), s, ly, tuple(sh))
                           for c, w, m, s, ly, sh in leaves]
    assert (pa == pb) == (norm(a) == norm(b))


def test_signature_key_separates_each_field():
    base = (3, False, True, 11, 0, (4, 5))
    keys = {_kernels.python_signature_key([base])}
    for i, changed in enumerate([4, True, False, 12, 1, (5, 4)]):
        leaf = list(base)
        leaf[i] = changed
        keys.add(_kernels.python_signature_key([tuple(leaf)]))
    keys.add(_kernels.python_signature_key([(3, False, True, 11, 0, (4,)), (5, 0, 0, 0, 0, ())]))
    assert len(keys) == 8


@settings(max_examples=200, deadline=None)
@given(st.lists(_int64, max_size=8), st.lists(_leaf, max_size=10))
def test_stable_signature_key_python_and_numba_agree(header, leaves):
    key = _kernels.stable_signature_key(header, leaves)
    expected = _kernels.hash_signature_python([*header, *_kernels.pack_signature_python(leaves)])
    assert key == expected
    _, buf = _kernels.numba_signature_key(leaves)  # the Numba path at every size
    full = np.concatenate([np.array(header, np.int64), buf])
    assert int(_kernels.hash_signature(full)) == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_hash_bytes_python_and_numba_agree(data):
    key = int(_kernels.hash_bytes(np.frombuffer(data, np.uint8)))
    assert key == _kernels.hash_bytes_python(data)
    assert -(2**63) <= key < 2**63


def test_hash_bytes_separates_lengths_and_padding():
    data = [b"", b"\0", b"\0\0", b"\0" * 8, b"\0" * 9, b"a", b"a\0"]
    keys = {_kernels.hash_bytes_python(b) for b in data}
    assert len(keys) == 7
    assert _kernels.stable_text_hash("float32") == _kernels.hash_bytes_python(b"float32")


# --- index domains ---------------------------------------------------------

def _normalise(index, shape):
    out = []
    for sl, dim in zip(index, shape, strict=True):
        start, stop, step = sl.indices(dim)
        assert step == 1
        out.append([start, stop])
    return out


def _expected_domains(sharding, shape, devices):
    indices = sharding.addressable_devices_indices_map(shape)
    return [_normalise(indices[d], shape) for d in devices]


MESHES = {"8": ((8,), ("x",)), "4x2": ((4, 2), ("x", "y")), "2x2x2": ((2, 2, 2), ("x", "y", "z"))}
SPECS = {"x": P("x"), "x_y": P("x", "y"), "none_y": P(None, "y"), "xy": P(("x", "y")),
         "replicated": P(), "yx_z": P(("y", "x"), None, "z"), "z_x": P("z", "x")}


def _mesh(name, reverse=False):
    shape, names = MESHES[name]
    devices = np.array(jax.devices()[:8])
    if reverse:
        devices = devices[::-1]
    return jax.sharding.Mesh(devices.reshape(shape), names)


def _spec_axes(spec):
    return {a for e in spec if e is not None for a in (e if isinstance(e, tuple) else (e,))}


MESH_SPEC_PAIRS = [(m, s) for m in MESHES for s in SPECS
                   if _spec_axes(SPECS[s]) <= set(MESHES[m][1])]


@needs_8_devices
@pytest.mark.parametrize("reverse", [False, True], ids=["iota", "reversed"])
@pytest.mark.parametrize("mesh_name,spec_name", MESH_SPEC_PAIRS)
def test_index_domains_equal_jax(mesh_name, spec_name, reverse):
    mesh = _mesh(mesh_name, reverse)
    spec = SPECS[spec_name]
    for shape in [(16,), (16, 8), (8, 4, 6), (8, 8, 4, 2)]:
        if len(spec) > len(shape):
            continue
        sharding = NamedSharding(mesh, spec)
        devices, domains = addressable_index_domains(sharding, shape)
        assert devices == list(sharding._addressable_device_assignment)
        assert domains.tolist() == _expected_domains(sharding, shape, devices)
        for gspmd in [_jax.GSPMDSharding(tuple(mesh.devices.flat),
                                         sharding._to_xla_hlo_sharding(len(shape)))]:
            g_devices, g_domains = addressable_index_domains(gspmd, shape)
            assert g_domains.tolist() == _expected_domains(gspmd, shape, g_devices)


@needs_8_devices
def test_index_domains_single_device_and_rank_zero():
    device = jax.devices()[3]
    sharding = jax.sharding.make_single_device_sharding(device)
    devices, domains = addressable_index_domains(sharding, (5, 7))
    assert devices == [device]
    assert domains.tolist() == [[[0, 5], [0, 7]]]
    devices, domains = addressable_index_domains(NamedSharding(_mesh("4x2"), P()), ())
    assert domains.shape == (8, 0, 2)


@needs_8_devices
@pytest.mark.parametrize("spec", [P("x"), P("x", "y"), P(None, "y"), P(("x", "y")), P()],
                         ids=str)
def test_group_replicas_matches_distinct_domains(spec):
    sharding = NamedSharding(_mesh("4x2"), spec)
    shape = (16, 8)
    devices, domains = addressable_index_domains(sharding, shape)
    group, first = _kernels.group_replicas(domains)
    indices = sharding.addressable_devices_indices_map(shape)
    distinct = {tuple(map(tuple, _normalise(indices[d], shape))) for d in devices}
    assert len(first) == len(distinct)
    for i, j in itertools.combinations(range(len(devices)), 2):
        same = domains[i].tolist() == domains[j].tolist()
        assert (group[i] == group[j]) == same
    assert [group[f] for f in first] == list(range(len(first)))


@st.composite
def _mesh_descriptions(draw):
    n_axes = draw(st.integers(min_value=1, max_value=3))
    mesh_shape = [draw(st.integers(min_value=1, max_value=3)) for _ in range(n_axes)]
    ndim = draw(st.integers(min_value=0, max_value=3))
    width = draw(st.integers(min_value=1, max_value=2))
    axes = list(range(n_axes))
    dim_axes = np.full((ndim, width), -1, np.int64)
    for d in range(ndim):
        chosen = draw(st.lists(st.sampled_from(axes), max_size=width, unique=True)) if axes else []
        axes = [a for a in axes if a not in chosen]
        dim_axes[d, :len(chosen)] = chosen
    shape = [int(np.prod([mesh_shape[a] for a in dim_axes[d] if a >= 0], dtype=np.int64))
             * draw(st.integers(min_value=0, max_value=3)) for d in range(ndim)]
    coords = np.stack(np.unravel_index(np.arange(int(np.prod(mesh_shape))), mesh_shape),
                      axis=1).astype(np.int64)
    if draw(st.booleans()):
        coords = coords[::-1].copy()
    return (np.array(shape, np.int64), np.array(mesh_shape, np.int64), dim_axes, coords)


@settings(max_examples=150, deadline=None)
@given(_mesh_descriptions())
def test_the_plain_twins_equal_the_kernels(description):
    """Plans use `nbjit._domains` (no numba): the same as the kernels."""
    domains = _domains.index_domains(*description)
    assert domains.dtype == np.int64
    assert domains.tolist() == _kernels.index_domains(*description).tolist()
    group, first = _domains.group_replicas(domains)
    k_group, k_first = _kernels.group_replicas(domains)
    assert group.tolist() == k_group.tolist() and first.tolist() == k_first.tolist()


def test_a_first_sharded_put_loads_no_numba():
    """A fresh process builds plans and puts row-major arrays without numba;
    a column-major source loads it on a thread and is copied by numpy meanwhile."""
    code = (
        "import sys, numpy as np, jax\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "import nbjit\n"
        "mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ('x', 'y'))\n"
        "s = NamedSharding(mesh, P('x', 'y'))\n"
        "x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)\n"
        "f = nbjit.jit(lambda a: a * 2, in_shardings=s)\n"
        "assert np.array_equal(np.asarray(f(x)), x * 2)\n"
        "assert np.array_equal(np.asarray(nbjit.device_put(x, s)), x)\n"
        "assert 'numba' not in sys.modules, 'numba loaded'\n"
        "y = np.asfortranarray(x)\n"
        "assert np.array_equal(np.asarray(nbjit.device_put(y, s)), x)\n"
        "import time\n"
        "from nbjit.core.inputs.copying import kernels_or_background\n"
        "deadline = time.monotonic() + 120\n"
        "while kernels_or_background() is None and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "assert np.array_equal(np.asarray(nbjit.device_put(y, s)), x)\n"
        "print('numba' in sys.modules)\n")
    env = child_env(XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


# --- strided gather --------------------------------------------------------

GATHER_DTYPES = [np.float32, ml_dtypes.bfloat16, np.int8, np.bool_, np.complex64, np.float64]


@st.composite
def _strided_arrays(draw):
    rank = draw(st.integers(min_value=0, max_value=4))
    shape = tuple(draw(st.integers(min_value=0, max_value=5)) for _ in range(rank))
    steps = tuple(draw(st.sampled_from([1, 2, -1, -2])) for _ in range(rank))
    dtype = draw(st.sampled_from(GATHER_DTYPES))
    base_shape = tuple(n * abs(s) for n, s in zip(shape, steps, strict=True))
    base = (np.arange(int(np.prod(base_shape)), dtype=np.int64) % 113).reshape(base_shape)
    base = base.astype(np.float32).astype(dtype)
    if draw(st.booleans()):
        base = np.array(base, order="F")
    x = base[tuple(slice(None, None, s) for s in steps) + (Ellipsis,)]
    starts, stops = [], []
    for n in shape:
        a = draw(st.integers(min_value=0, max_value=n))
        b = draw(st.integers(min_value=a, max_value=n))
        starts.append(a)
        stops.append(b)
    return x, starts, stops


@settings(max_examples=200, deadline=None)
@given(_strided_arrays(), st.integers(min_value=0, max_value=3))
def test_gather_strided_equals_numpy_slicing(case, offset):
    x, starts, stops = case
    before = x.copy()
    region = x[tuple(slice(a, b) for a, b in zip(starts, stops, strict=True)) + (Ellipsis,)]
    pad = _kernels.GATHER_RANK - x.ndim
    s = np.array([[0] * pad + starts, [0] * pad + [0] * x.ndim], np.int64)
    e = np.array([[1] * pad + stops, [1] * pad + list(x.shape)], np.int64)
    n0 = region.size
    offsets = np.array([offset, offset + n0], np.int64)
    out = np.zeros(offset + n0 + x.size, x.dtype)
    _kernels.gather_strided(x, s, e, offsets, out)
    bits = lambda a: np.ascontiguousarray(a).view(_kernels.gather_view_dtype(a.dtype))
    assert np.array_equal(bits(out[offset:offset + n0]), bits(region).ravel())
    assert np.array_equal(bits(out[offset + n0:]), bits(x).ravel())
    assert np.array_equal(bits(x), bits(before))


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=5000), st.integers(min_value=0, max_value=63),
       st.integers(min_value=0, max_value=63),
       st.sampled_from([np.uint8, np.int16, np.float32, np.float64, np.complex64]))
def test_stream_copy_equals_numpys_copy(n, src_offset, dst_offset, dtype):
    """The non-temporal copy (nbjit.core.inputs.stream: LLVM IR, compiled by
    llvmlite) against its twin, np.copyto: any length (a partial last 64
    bytes), any source alignment; a destination not 64-byte aligned is copied
    by numpy (a streamed store there would fault)."""
    from nbjit.core.inputs.stream import stream_copy

    copy = stream_copy()
    assert copy is not None  # llvmlite comes with numba, a dependency
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(n).integers(0, 256, n * dtype.itemsize + 64, dtype=np.uint8)
    src = raw[src_offset:src_offset + n * dtype.itemsize].view(dtype)
    dst_raw = np.zeros(n * dtype.itemsize + 128, np.uint8)
    start = (-dst_raw.ctypes.data + dst_offset) % 64
    dst = dst_raw[start:start + n * dtype.itemsize].view(dtype)
    copy(dst, src)
    assert dst.tobytes() == src.tobytes()
    assert not dst_raw[:start].any() and not dst_raw[start + dst.nbytes:].any()
