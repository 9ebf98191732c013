"""The rooms' layering, read from the code: which room may import which (every
import, at module level or inside a function), no two rooms importing each
other, no private name imported across modules, a node's record assigned in
the cache alone, and few reads of another object's private fields.

docs/design.md's room graph is generated from `MAY_IMPORT` and the imports
found here (scripts/doc_tables.py), so the rules and the docs cannot drift.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nbjit"
MODULES = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
           for p in sorted(PACKAGE.rglob("*.py"))}

# The package's face (`import nbjit`, the CLI, the old module paths) may import
# every room; no room imports it (the lab reaches jit and filter_jit in their rooms).
FACE = {"nbjit", "nbjit.__main__", "nbjit.dispatch", "nbjit.sharding"}
BASE = {"_common", "_domains", "_jax", "_kernels"}

# room -> the rooms it may import. The core is at the bottom (above the base
# modules) and runs a call by itself, inputs onto devices included; the rooms
# built on it plug in what is optional (nbjit/core/hooks.py, nbjit/core/flavours.py,
# nbjit/core/profiler.py, nbjit/core/live.py, the CPU's input strategy in
# nbjit/core/inputs/platforms.py).
MAY_IMPORT: dict[str, set[str]] = {
    "_common": set(),
    "_jax": {"_common"},
    "_domains": set(),  # numpy only: the kernels' plain twins that plans use
    "_kernels": {"_domains"},  # numba only: no jax
    "core": {"_common", "_domains", "_jax", "_kernels"},
    "host": {"_common", "_domains", "_jax", "_kernels", "core"},
    "observe": {"_common", "_domains", "_jax", "_kernels", "core"},
    "multiprocess": {"_common", "_domains", "_jax", "_kernels", "core", "observe"},
    "filter": {"_common", "_domains", "_jax", "_kernels", "core", "observe"},
    "routing": {"_common", "_domains", "_jax", "_kernels", "core", "filter"},
    "bench": {"_common", "_domains", "_jax", "_kernels", "core", "host", "observe", "filter"},
    "face": {"_common", "_domains", "_jax", "_kernels", "core", "host", "observe", "multiprocess",
             "filter", "routing", "bench"},
}

PENDING: set[tuple[str, str]] = set()


def room_of(module: str) -> str:
    if module in FACE:
        return "face"
    return module.split(".")[1]


def imports_of(path: pathlib.Path) -> list[tuple[str, int, str | None]]:
    """(nbjit module imported, line, the name imported from it or None), for
    every import in `path`, at module level and inside functions alike.
    ``from pkg import mod`` imports pkg.mod."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, None) for a in node.names
                      if a.name.split(".")[0] == "nbjit"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module.split(".")[0] == "nbjit"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((sub, node.lineno, None) if sub in MODULES
                             else (node.module, node.lineno, alias.name))
    return found


def edges() -> dict[tuple[str, str], int]:
    """(importing module, imported module) -> the first line."""
    found: dict[tuple[str, str], int] = {}
    for name, path in MODULES.items():
        for target, line, _ in imports_of(path):
            if target != name and target in MODULES:
                found.setdefault((name, target), line)
    return found


def room_graph() -> dict[str, set[str]]:
    """room -> the rooms it imports (read from the code)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges():
        ra, rb = room_of(a), room_of(b)
        if ra != rb:
            graph.setdefault(ra, set()).add(rb)
    return graph


def test_every_module_is_in_a_known_room():
    assert {room_of(m) for m in MODULES} <= set(MAY_IMPORT)


def test_rooms_import_only_what_they_may():
    bad = [f"{MODULES[a].relative_to(ROOT)}:{line}: {a} imports {b}"
           for (a, b), line in sorted(edges().items())
           if room_of(a) != room_of(b) and room_of(b) not in MAY_IMPORT[room_of(a)]
           and (a, b) not in PENDING]
    assert not bad, "\n".join(bad)


def test_pending_exceptions_are_only_core_to_observe_and_still_needed():
    found = set(edges())
    assert all(room_of(a) == "core" and room_of(b) == "observe" for a, b in PENDING)
    stale = PENDING - found
    assert not stale, f"no longer imported: remove from PENDING: {sorted(stale)}"


def test_the_core_imports_no_room_built_on_it():
    above = {"host", "observe", "multiprocess", "filter", "routing", "bench", "face"}
    found = [(a, b) for a, b in edges() if room_of(a) == "core" and room_of(b) in above]
    assert set(found) <= PENDING, sorted(set(found) - PENDING)


def test_no_two_rooms_import_each_other():
    graph = room_graph()
    graph.get("bench", set()).discard("face")  # the lab imports `nbjit`, which loads it lazily
    pairs = {tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())}
    pending_rooms = {(room_of(a), room_of(b)) for a, b in PENDING}
    pairs -= {tuple(sorted(p)) for p in pending_rooms}
    assert not pairs, sorted(pairs)


def test_no_private_name_imported_across_modules():
    bad = [f"{MODULES[name].relative_to(ROOT)}:{line}: from {target} import {imported}"
           for name, path in MODULES.items()
           for target, line, imported in imports_of(path)
           if imported and imported.startswith("_") and not imported.startswith("__")]
    assert not bad, "\n".join(bad)


def test_only_the_cache_assigns_a_nodes_record():
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign)
                       else [])
            hit = any(isinstance(t, ast.Attribute) and t.attr == "record"
                      for target in targets for t in ast.walk(target))
            assert not hit or name == "nbjit.core.cache", (
                f"{path.relative_to(ROOT)}:{node.lineno}: assigns .record")


def private_field_reads() -> list[str]:
    """Reads of another object's private field (``obj._field``, obj a plain
    name that is not self, cls, a module or a class), outside nbjit/_jax.py
    (JAX's gate), where the module does not define `_field` itself (a class
    reading its own kind's fields, as ``other._hash`` in ``__eq__``)."""
    found = []
    for name, path in MODULES.items():
        if name == "nbjit._jax":
            continue
        tree = ast.parse(path.read_text())
        modules = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                   if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
        own = {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign)
               for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
               for t in ast.walk(target) if isinstance(t, ast.Attribute)}
        own |= {n.name for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        own |= {elt.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name) and t.id == "__slots__"
                for elt in ast.walk(n.value) if isinstance(elt, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                    and node.value.id not in ("self", "cls") and node.value.id not in modules
                    and not node.value.id[:1].isupper() and node.attr not in own):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


# The reads left: the JAX array field a hit reads, as jaxlib's C++ does
# (`x._committed` in nbjit.core.keys.leaf_signature and nbjit.observe.explain;
# the generated keyers and binders read it in their source text), and a
# namedtuple's `_fields` (public API, named so as not to clash with fields) in
# nbjit.observe.names. A new one must go through a method or nbjit/_jax.py.
PRIVATE_READS_MAX = 3


def test_few_reads_of_other_objects_private_fields():
    reads = private_field_reads()
    assert len(reads) <= PRIVATE_READS_MAX, "\n".join(reads)
