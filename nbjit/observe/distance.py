"""The distance between call descriptions, in plain Python (explained misses).

The Python twin of `nbjit._kernels.description_distances` (tested to agree,
tests/test_explain.py), in a module that imports neither numba nor jax: a
miss with few cached entries finds its closest entry without loading numba
(whose first import is slow).

A call description packs into one int64 row (`nbjit.observe.descriptions.pack_row`):
  header: [n_leaves, structure_id, keyword_names_id, context_id]
  then per leaf, fixed width:
  [path_id, kind_id, dtype_id, weak_type, committed, sharding_id, ndim, shape_id]
Words are the fields' hashes, so equal fields pack to equal words; a leaf
with no dtype packs 0 there, with no shape -1 as its ndim. Each static
argument (or, under filter_jit, each non-array leaf) is a leaf too: its
exact type as its kind, its value's hash in place of the shape.
The distance of two rows counts the fields `nbjit.observe.explain.differences`
would name: each differing header word (not the leaf count), and per leaf
of the new row the fields of the cached leaf with the same path: dtype,
weak type, committedness, sharding, and ndim and shape together; a kind
change is one field, plus the dtype and the shape where both leaves have one
and it changed too. A leaf whose path the other row lacks adds nothing: the
structure, keyword or argument-count word that differs already counts it.
Leaves are matched by path, first at the same position (the common case),
else by a scan. The structure and context words count one however many of
their fields differ (`nbjit.observe.explain` counts those when it matters).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DESCRIPTION_HEADER_WORDS", "DESCRIPTION_LEAF_WORDS", "closest_python",
           "description_distance_python"]

DESCRIPTION_HEADER_WORDS = 4
DESCRIPTION_LEAF_WORDS = 8


def _leaf_distance_python(a: Sequence[int], i: int, b: Sequence[int], j: int) -> int:
    if a[i + 1] != b[j + 1]:  # another kind, and a dtype or shape both have that changed
        return (1 + (a[i + 2] != 0 and b[j + 2] != 0 and a[i + 2] != b[j + 2])
                + (a[i + 6] >= 0 and b[j + 6] >= 0
                   and (a[i + 6] != b[j + 6] or a[i + 7] != b[j + 7])))
    return ((a[i + 2] != b[j + 2]) + (a[i + 3] != b[j + 3]) + (a[i + 4] != b[j + 4])
            + (a[i + 5] != b[j + 5]) + (a[i + 6] != b[j + 6] or a[i + 7] != b[j + 7]))


def description_distance_python(a: Sequence[int], b: Sequence[int]) -> int:
    """Plain-Python twin of one `description_distances` element (`a` the new row)."""
    d = 0
    for i in range(1, DESCRIPTION_HEADER_WORDS):
        d += a[i] != b[i]
    paths: dict[int, int] | None = None
    for i in range(DESCRIPTION_HEADER_WORDS, len(a), DESCRIPTION_LEAF_WORDS):
        j = i
        if j >= len(b) or b[j] != a[i]:
            if paths is None:  # first occurrence of each path, as the kernel's scan
                paths = {}
                for k in range(DESCRIPTION_HEADER_WORDS, len(b), DESCRIPTION_LEAF_WORDS):
                    paths.setdefault(b[k], k)
            j = paths.get(a[i], -1)
        if j >= 0:
            d += _leaf_distance_python(a, i, b, j)
    return d


def closest_python(row: Sequence[int], rows: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(index, distance) of the row in `rows` closest to `row`; on ties the last
    (rows come oldest first: the most recent wins)."""
    best, best_d = -1, -1
    for i in range(len(rows) - 1, -1, -1):
        d = description_distance_python(row, rows[i])
        if best < 0 or d < best_d:
            best, best_d = i, d
            if d == 0:
                break
    return best, best_d
