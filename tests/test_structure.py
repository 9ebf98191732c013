"""The package's structure: rooms without circles, seams without reach-ins,
sizes a reader can hold, and docs/design.md naming every module."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nbjit"
MODULES = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
           for p in sorted(PACKAGE.rglob("*.py"))}

# Modules allowed over the size limits while being split (none now).
OVERSIZED_ELSEWHERE: set[str] = set()


def _imports(path: pathlib.Path) -> set[str]:
    """The nbjit modules `path` imports, at the top or deferred. ``from pkg
    import mod`` is an import of pkg.mod (the package's __init__ re-exports
    are not edges back into it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module in MODULES:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(MODULES)
            found |= subs or {node.module}
    return found - {"nbjit"}  # `import nbjit` from the lab and the CLI: the public API


def test_no_import_circle():
    graph = {name: _imports(path) - {name} for name, path in MODULES.items()}
    state: dict[str, int] = {}

    def visit(name, trail):
        if state.get(name) == 1:
            raise AssertionError("import circle: " + " -> ".join([*trail, name]))
        if state.get(name) == 2:
            return
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            visit(dep, [*trail, name])
        state[name] = 2

    for name in graph:
        visit(name, [])


def test_no_module_outside_the_cache_reaches_into_it():
    private = re.compile(r"\.(_lock|_lru|_namespaces|_all_namespaces|_capacity|_insert)\b")
    for name, path in MODULES.items():
        if name == "nbjit.core.cache":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if private.search(code) and "cache" in code:
                raise AssertionError(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")


def test_files_and_functions_fit_a_reader():
    for path in MODULES.values():
        relative = str(path.relative_to(ROOT))
        if relative in OVERSIZED_ELSEWHERE:
            continue
        text = path.read_text()
        assert len(text.splitlines()) <= 650, relative
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                assert lines <= 65, f"{relative}: {node.name} has {lines} lines"


def test_design_md_names_every_module():
    design = (ROOT / "docs" / "design.md").read_text()
    missing = [str(p.relative_to(ROOT)) for p in MODULES.values()
               if f"`{p.relative_to(ROOT)}`" not in design]
    assert not missing, missing


def test_record_replaced_only_by_the_cache():
    """A node's record is set when the node is made and replaced by the cache's
    compare-and-swap (`Namespace.replace_record`), nowhere else (docs/design.md)."""
    allowed = {"nbjit.core.cache"}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign)
                       else [])
            flat = [t for target in targets for t in ast.walk(target)]
            if name not in allowed and any(
                    isinstance(t, ast.Attribute) and t.attr == "record" for t in flat):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno}: assigns .record")
