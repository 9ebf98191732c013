"""Numba kernels for the array-shaped parts of dispatch. No jax import here.

Four families, one section each, each with the plain-Python twin it needs
beside it:

- signature keys: per-leaf (dtype code, weak type, committed, sharding id,
  layout id, shape) packed into one int64 buffer and hashed to one int64.
  `python_signature_key` computes the same key in plain Python (it wins for
  few leaves; the asv benchmark `bench_kernels.SignatureKey` shows the
  crossover). Their user is multi-controller agreement's stable key
  (`stable_signature_key`, with `hash_bytes` for host values); the
  dispatcher's own key does not pack leaves (docs/performance.md).
- call descriptions: the distance of a missed call to every cached one
  (explained misses); the Python twin is `nbjit.observe.distance`.
- index domains: the [start, stop) per dimension of every device's shard of
  a global array, from a mesh description; `group_replicas` numbers the
  distinct domains. Their twins, `nbjit._domains`, are what plans use
  (a few devices' domains cost microseconds in numpy, numba's import
  hundreds of milliseconds); the kernels stay for many-device meshes and
  as the twins' reference in the tests.
- strided gather: one pass that copies every distinct shard of a
  (possibly non-contiguous, negative-stride) array into one contiguous
  staging buffer.

Every kernel is `cache=True`: the first call in a fresh environment compiles
(cold), later processes load the machine code from `__pycache__` (warm).
Importing this module imports numba (slow to import); nbjit imports it lazily.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from nbjit import _domains

# ---------------------------------------------------------------------------
# Signature keys
# ---------------------------------------------------------------------------

# Packed layout of one leaf, in int64 words:
#   [dtype_code, flags, sharding_id, layout_id, ndim, dim_0, ..., dim_{ndim-1}]
# flags = weak_type | committed << 1. The buffer is the concatenation over
# leaves; ndim delimits leaves, so two different leaf lists never pack alike.
LEAF_HEADER_WORDS = 5

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MIX_1 = 0xFF51AFD7ED558CCD
_MIX_2 = 0xC4CEB9FE1A85EC53
_MASK64 = (1 << 64) - 1


@njit(cache=True, nogil=True)
def pack_leaf_signatures(dtype_codes, weak_types, committed, sharding_ids, layout_ids,
                         ndims, dims):
    """Packs per-leaf signature fields into one int64 buffer.

    All inputs are int64 arrays of one entry per leaf, except `dims`: the
    leaves' shapes concatenated (sum(ndims) entries).
    """
    n = dtype_codes.shape[0]
    total = n * LEAF_HEADER_WORDS + dims.shape[0]
    buf = np.empty(total, dtype=np.int64)
    pos = 0
    d = 0
    for i in range(n):
        buf[pos] = dtype_codes[i]
        flags = 0
        if weak_types[i] != 0:
            flags |= 1
        if committed[i] != 0:
            flags |= 2
        buf[pos + 1] = flags
        buf[pos + 2] = sharding_ids[i]
        buf[pos + 3] = layout_ids[i]
        buf[pos + 4] = ndims[i]
        pos += LEAF_HEADER_WORDS
        for _ in range(ndims[i]):
            buf[pos] = dims[d]
            pos += 1
            d += 1
    return buf


@njit(cache=True, nogil=True)
def _finalise(h):
    """murmur3's 64-bit finaliser, as int64."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(_MIX_1)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_MIX_2)
    h ^= h >> np.uint64(33)
    return np.int64(h)


@njit(cache=True, nogil=True)
def hash_signature(buf):
    """64-bit hash of an int64 buffer: FNV-1a over words, murmur3 finaliser."""
    h = np.uint64(_FNV_OFFSET)
    prime = np.uint64(_FNV_PRIME)
    for i in range(buf.shape[0]):
        h = (h ^ np.uint64(buf[i])) * prime
    return _finalise(h)


@njit(cache=True, nogil=True)
def _signature_key_kernel(dtype_codes, weak_types, committed, sharding_ids, layout_ids,
                          ndims, dims):
    buf = pack_leaf_signatures(dtype_codes, weak_types, committed, sharding_ids,
                               layout_ids, ndims, dims)
    return hash_signature(buf), buf


Leaf = tuple[int, bool, bool, int, int, Sequence[int]]
"""(dtype_code, weak_type, committed, sharding_id, layout_id, shape)."""


def pack_signature_python(leaves: Sequence[Leaf]) -> list[int]:
    """Plain-Python twin of `pack_leaf_signatures` (same words, same order)."""
    buf: list[int] = []
    for dtype_code, weak, committed, sharding_id, layout_id, shape in leaves:
        buf += (dtype_code, int(bool(weak)) | (int(bool(committed)) << 1), sharding_id,
                layout_id, len(shape))
        buf += shape
    return buf


def hash_signature_python(buf: Sequence[int]) -> int:
    """Plain-Python twin of `hash_signature`."""
    h = _FNV_OFFSET
    for word in buf:
        h = ((h ^ (word & _MASK64)) * _FNV_PRIME) & _MASK64
    h ^= h >> 33
    h = (h * _MIX_1) & _MASK64
    h ^= h >> 33
    h = (h * _MIX_2) & _MASK64
    h ^= h >> 33
    return h - (1 << 64) if h >= 1 << 63 else h


def python_signature_key(leaves: Sequence[Leaf]) -> int:
    """The int64 signature key of `leaves`, computed in plain Python."""
    return hash_signature_python(pack_signature_python(leaves))


def numba_signature_key(leaves: Sequence[Leaf]) -> tuple[int, np.ndarray]:
    """The same key as `python_signature_key`, via the Numba kernels.

    Returns `(key, packed_buffer)`. Extracting the fields into arrays is
    part of the cost: this is the function the crossover benchmark times.
    """
    n = len(leaves)
    dtype_codes = np.empty(n, np.int64)
    weak = np.empty(n, np.int64)
    committed = np.empty(n, np.int64)
    sharding_ids = np.empty(n, np.int64)
    layout_ids = np.empty(n, np.int64)
    ndims = np.empty(n, np.int64)
    dims: list[int] = []
    for i, (code, w, c, sid, lid, shape) in enumerate(leaves):
        dtype_codes[i] = code
        weak[i] = w
        committed[i] = c
        sharding_ids[i] = sid
        layout_ids[i] = lid
        ndims[i] = len(shape)
        dims += shape
    key, buf = _signature_key_kernel(dtype_codes, weak, committed, sharding_ids, layout_ids,
                                     ndims, np.array(dims, dtype=np.int64))
    return int(key), buf


# The crossover: the plain-Python key wins for few leaves (the Numba call's
# fixed cost dominates), the Numba one from this many on. Measured by
# benchmarks/benchmarks/bench_kernels.py SignatureKey; the numbers are in
# docs/performance.md#measured-constants-behind-the-code.
NUMBA_KEY_MIN_LEAVES = 4


# Stable keys: equal in every process (multi-controller agreement). The words
# fed to the hash are built from values with a fixed encoding (text as UTF-8,
# little-endian 8-byte words), never from Python's salted `hash()` or ids.


def stable_signature_key(header: Sequence[int], leaves: Sequence[Leaf]) -> int:
    """`hash_signature` of `header` words followed by the packed `leaves`.

    Plain Python below `NUMBA_KEY_MIN_LEAVES` leaves, the Numba kernels from
    there on; both give the same key (tests/test_kernels.py).
    """
    if len(leaves) < NUMBA_KEY_MIN_LEAVES:
        return hash_signature_python([*header, *pack_signature_python(leaves)])
    _, buf = numba_signature_key(leaves)
    return int(hash_signature(np.concatenate([np.array(header, np.int64), buf])))


@njit(cache=True, nogil=True)
def hash_bytes(data):
    """64-bit hash of a uint8 buffer: `hash_signature` of [length, little-endian words].

    The last word holds the remaining bytes (zero-padded).
    """
    n = data.shape[0]
    h = np.uint64(_FNV_OFFSET)
    prime = np.uint64(_FNV_PRIME)
    h = (h ^ np.uint64(n)) * prime
    full = n // 8
    for w in range(full):
        word = np.uint64(0)
        for j in range(8):
            word |= np.uint64(data[8 * w + j]) << np.uint64(8 * j)
        h = (h ^ word) * prime
    if n % 8:
        word = np.uint64(0)
        for j in range(n - 8 * full):
            word |= np.uint64(data[8 * full + j]) << np.uint64(8 * j)
        h = (h ^ word) * prime
    return _finalise(h)


def hash_bytes_python(data: bytes) -> int:
    """Plain-Python twin of `hash_bytes`."""
    words = [len(data)]
    words += (int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8))
    return hash_signature_python(words)


def stable_text_hash(text: str) -> int:
    """The int64 `hash_bytes` of `text` as UTF-8 (the same in every process)."""
    return hash_bytes_python(text.encode("utf-8", "surrogatepass"))


# ---------------------------------------------------------------------------
# Call descriptions: the closest cached signature (explained misses)
# ---------------------------------------------------------------------------

# The packed layout of a call description and the distance counted over it
# are described in nbjit/observe/distance.py, which holds the plain-Python twin
# (numba-free, so that small caches never load numba; re-exported here).
# The widths are literals here: a cached kernel is recompiled when this file
# changes, not when that one does (tests/test_explain.py checks they agree).
DESCRIPTION_HEADER_WORDS = 4
DESCRIPTION_LEAF_WORDS = 8


@njit(cache=True, nogil=True)
def _leaf_distance(row, i, rows, j):
    """Differing fields of the leaf at word `i` of `row` and at word `j` of `rows`."""
    if row[i + 1] != rows[j + 1]:  # another kind: a dtype or shape both have may differ too
        d = 1
        if row[i + 2] != 0 and rows[j + 2] != 0 and row[i + 2] != rows[j + 2]:
            d += 1
        if row[i + 6] >= 0 and rows[j + 6] >= 0 and (
                row[i + 6] != rows[j + 6] or row[i + 7] != rows[j + 7]):
            d += 1
        return d
    d = 0
    if row[i + 2] != rows[j + 2]:
        d += 1
    if row[i + 3] != rows[j + 3]:
        d += 1
    if row[i + 4] != rows[j + 4]:
        d += 1
    if row[i + 5] != rows[j + 5]:
        d += 1
    if row[i + 6] != rows[j + 6] or row[i + 7] != rows[j + 7]:
        d += 1
    return d


@njit(cache=True, nogil=True)
def description_distances(row, rows, offsets):
    """Fields of `row` that differ from every row packed in `rows` (see above).

    rows: int64[sum of lengths], the cached rows concatenated; offsets:
    int64[m + 1], row i is rows[offsets[i]:offsets[i + 1]]. Returns int64[m].
    """
    m = offsets.shape[0] - 1
    out = np.empty(m, dtype=np.int64)
    n = row.shape[0]
    for r in range(m):
        start = offsets[r]
        stop = offsets[r + 1]
        d = 0
        for i in range(1, DESCRIPTION_HEADER_WORDS):
            if row[i] != rows[start + i]:
                d += 1
        for i in range(DESCRIPTION_HEADER_WORDS, n, DESCRIPTION_LEAF_WORDS):
            j = start + i
            if j >= stop or rows[j] != row[i]:
                j = -1
                for k in range(start + DESCRIPTION_HEADER_WORDS, stop, DESCRIPTION_LEAF_WORDS):
                    if rows[k] == row[i]:
                        j = k
                        break
            if j >= 0:
                d += _leaf_distance(row, i, rows, j)
        out[r] = d
    return out


def closest_numba(row: np.ndarray, rows: Sequence[np.ndarray]) -> tuple[int, int]:
    """As `closest_python`, from int64 arrays, with one kernel call over all rows.

    Concatenating the rows is part of the cost (the crossover benchmark
    `bench_observe.ClosestEntry` times this function).
    """
    lengths = np.fromiter((r.shape[0] for r in rows), np.int64, len(rows))
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    distances = description_distances(row, np.concatenate(rows), offsets)
    best = len(rows) - 1 - int(np.argmin(distances[::-1]))  # the last of the closest
    return best, int(distances[best])


# ---------------------------------------------------------------------------
# Index domains and replicas
# ---------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def index_domains(global_shape, mesh_shape, dim_axes, device_coords):
    """[start, stop) per dimension of each device's shard.

    global_shape: int64[ndim]. mesh_shape: int64[n_axes].
    dim_axes: int64[ndim, k], the mesh axes that shard each array dimension,
      major to minor, padded with -1 (a PartitionSpec entry ('x', 'y') is
      [ix, iy]; None is all -1).
    device_coords: int64[n_dev, n_axes], each device's coordinate in the mesh.
    Returns int64[n_dev, ndim, 2]. The caller has checked that every
    dimension divides by its number of shards (as JAX requires).
    """
    n_dev = device_coords.shape[0]
    ndim = global_shape.shape[0]
    out = np.empty((n_dev, ndim, 2), dtype=np.int64)
    for dev in range(n_dev):
        for d in range(ndim):
            n_shards = 1
            index = 0
            for j in range(dim_axes.shape[1]):
                axis = dim_axes[d, j]
                if axis >= 0:
                    n_shards *= mesh_shape[axis]
                    index = index * mesh_shape[axis] + device_coords[dev, axis]
            block = global_shape[d] // n_shards
            out[dev, d, 0] = index * block
            out[dev, d, 1] = index * block + block
    return out


@njit(cache=True, nogil=True)
def group_replicas(domains):
    """Numbers the distinct domains in order of first appearance.

    Returns (group_of_device int64[n_dev], first_device_of_group int64[n_groups]).
    """
    n_dev = domains.shape[0]
    group = np.empty(n_dev, dtype=np.int64)
    first = np.empty(n_dev, dtype=np.int64)
    n_groups = 0
    for dev in range(n_dev):
        found = -1
        for g in range(n_groups):
            other = first[g]
            same = True
            for d in range(domains.shape[1]):
                if (domains[dev, d, 0] != domains[other, d, 0]
                        or domains[dev, d, 1] != domains[other, d, 1]):
                    same = False
                    break
            if same:
                found = g
                break
        if found < 0:
            first[n_groups] = dev
            found = n_groups
            n_groups += 1
        group[dev] = found
    return group, first[:n_groups].copy()


# ---------------------------------------------------------------------------
# Strided gather
# ---------------------------------------------------------------------------

# The gather's rank and view dtypes live with the plain twins (no numba), so
# that a plan is built without importing numba.
GATHER_RANK = _domains.GATHER_RANK
gather_view_dtype = _domains.gather_view_dtype


# Compiled lazily, one specialisation per item size (and source layout) that is
# used: explicit signatures would compile all of them at import (seconds, cold).
@njit(cache=True, nogil=True)
def _gather_shards(src, starts, stops, offsets, out):
    """Any strides: element by element through 4-D indexing."""
    for s in range(starts.shape[0]):
        pos = offsets[s]
        for i in range(starts[s, 0], stops[s, 0]):
            for j in range(starts[s, 1], stops[s, 1]):
                for k in range(starts[s, 2], stops[s, 2]):
                    for m in range(starts[s, 3], stops[s, 3]):
                        out[pos] = src[i, j, k, m]
                        pos += 1


@njit(cache=True, nogil=True)
def _gather_dense_shards(src, strides, starts, stops, offsets, out):
    """Source memory dense (C or F order), given flat with element strides:
    rows along a unit-stride last axis are copied as slices (faster than
    element by element; bench_kernels.Gather)."""
    s0, s1, s2, s3 = strides[0], strides[1], strides[2], strides[3]
    for s in range(starts.shape[0]):
        pos = offsets[s]
        a3 = starts[s, 3]
        n3 = stops[s, 3] - a3
        for i in range(starts[s, 0], stops[s, 0]):
            for j in range(starts[s, 1], stops[s, 1]):
                for k in range(starts[s, 2], stops[s, 2]):
                    row = i * s0 + j * s1 + k * s2 + a3 * s3
                    if s3 == 1:
                        out[pos:pos + n3] = src[row:row + n3]
                    else:
                        for m in range(n3):
                            out[pos + m] = src[row + m * s3]
                    pos += n3


def gather_strided(src: np.ndarray, starts: np.ndarray, stops: np.ndarray,
                   offsets: np.ndarray, out: np.ndarray) -> None:
    """Copies shards `src[starts[s]:stops[s]]` into `out`, row-major, at `offsets[s]`.

    src: any strides (negative included), rank <= GATHER_RANK, itemsize 1, 2,
      4 or 8 (bfloat16, bool and complex64 are moved as same-size integers).
    starts, stops: int64[n_shards, GATHER_RANK] (pad leading dims with 0, 1).
    offsets: int64[n_shards], in elements of `out`.
    out: 1-D contiguous, same itemsize as src.
    """
    itemsize = src.dtype.itemsize
    view = _domains.UINT_OF_ITEMSIZE[itemsize]
    pad = GATHER_RANK - src.ndim
    flags = src.flags
    if flags.c_contiguous or flags.f_contiguous:
        strides = np.zeros(GATHER_RANK, np.int64)
        strides[pad:] = src.strides
        strides //= itemsize
        flat = src.reshape(-1, order="C" if flags.c_contiguous else "F").view(view)
        _gather_dense_shards(flat, strides, starts, stops, offsets, out.view(view))
    else:
        src4 = src.view(view).reshape((1,) * pad + src.shape)
        _gather_shards(src4, starts, stops, offsets, out.view(view))
