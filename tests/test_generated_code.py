"""Generated code is held to the standard of written code where it matters:
every name it reads is defined (by the source, or by the scope it runs in,
or a builtin), every name it assigns is read, and ruff passes on it with the
project's rules. Its line length does not matter: nothing lays it out
(`nbjit.core.binders` writes each expression on one line).

Every function nbjit compiles from a template (binders in each flavour, the
hit path, keyers, input preparers, resident preparers, fences)
goes through `nbjit.core.codegen.run_source`. This test makes calls of many
shapes (positional, keywords, statics, pytrees, host leaves, mixed leaf
kinds, many arguments), under a profile (the timed flavour), in a profiler
trace (the traced flavour) and keyed only (`_entry_for`), with fresh host
values until their inputs are resident; it records each source
that runs and the names its scope supplies, then checks the names of each
source (`_name_faults`) and runs ruff over each one preceded by those names
(so an undefined name still fails there too).
"""

import ast
import builtins
import linecache
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nbjit
from nbjit.core import codegen
from nbjit.core.keys import UNROLL_MAX
from nbjit.host import policy as _policy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUFF = os.path.join(os.path.dirname(sys.executable), "ruff")


def _positional(a, b):
    return a + b


def _keywords(a, *, scale=1.0, shift=0.0):
    return a * scale + shift


def _static(a, n, *, mode="add"):
    return a + n if mode == "add" else a * n


def _tree(params, x):
    return params["w"] * x + params["b"][0], [x, x]


def _many(*xs):
    return sum(xs)


def _many_named(a, b, *, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13,
                n0=0, n1=0, n2=0, n3=0):
    return a + b + c0 + c13 + n0 + n3


def _calls():
    x, y = jnp.arange(4.0), jnp.ones(4)
    params = {"w": jnp.ones(4), "b": [jnp.zeros(4), jnp.zeros(4)]}
    return [
        (nbjit.jit(_positional), (x, y), {}),
        (nbjit.jit(_positional), (np.arange(4.0), 2.0), {}),  # host leaves
        (nbjit.jit(_positional), (x, np.float32(2)), {}),  # mixed leaf kinds
        (nbjit.jit(_keywords), (x,), {"scale": y}),
        (nbjit.jit(_keywords), (np.ones(4, np.float32),), {"scale": 2.0, "shift": y}),
        (nbjit.jit(_static, static_argnums=1, static_argnames="mode"), (x, 3), {"mode": "mul"}),
        (nbjit.jit(_tree), (params, x), {}),
        (nbjit.jit(_tree), ({"w": np.ones(4, np.float32), "b": [y, 1.0]}, x), {}),  # mixed
        (nbjit.jit(_many), tuple(jnp.full(2, i) for i in range(12)), {}),
        (nbjit.jit(_many), tuple(np.full(2, i, np.float32) for i in range(12)), {}),
        # the widest unrolled forms: UNROLL_MAX dynamic arguments, named ones, many statics
        (nbjit.jit(_many), tuple(jnp.full(2, i) for i in range(UNROLL_MAX)), {}),
        (nbjit.jit(_many), tuple(np.full(2, i, np.float32) for i in range(UNROLL_MAX)), {}),
        (nbjit.jit(_many_named, static_argnames=("n0", "n1", "n2", "n3")), (x, y),
         {f"c{i}": (x if i % 2 else np.ones(4, np.float32)) for i in range(14)}
         | {"n0": 1, "n1": 2, "n2": 3, "n3": 4}),
        (nbjit.jit(_many_named, static_argnames=("n0", "n1", "n2", "n3")), (params["w"], y),
         {f"c{i}": [x] if i == 3 else x for i in range(14)} | {"n0": 1, "n3": 4}),
    ]


def _fresh_host_calls():
    """Fresh host values each call, past the point where they are resident."""
    f = nbjit.jit(lambda a, b: a + b)  # a new function: a node of its own
    for i in range(3 * _policy.ARM_AFTER):
        f(np.full(8, i, np.float32), np.full(8, 1, np.float32))
    assert f(np.ones(8, np.float32), np.ones(8, np.float32)).tolist() == [2.0] * 8


_SOURCES: dict[str, str] = {}  # filename -> text, recorded as the fixture ran it


def _source(filename: str) -> str:
    return (_SOURCES.get(filename) or codegen.generated_source(filename)
            or "".join(linecache.getlines(filename)))


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """filename -> names its scope supplies, of every generated source run by
    calls of every shape and flavour (see the module docstring)."""
    seen = {}

    def recording_exec(code, scope):
        seen[code.co_filename] = set(scope)
        # Its text as run: codegen's bounded cache may drop it from linecache
        # later in a long session (every older source goes at its limit).
        _SOURCES[code.co_filename] = "".join(linecache.getlines(code.co_filename))
        return builtins.exec(code, scope)

    with pytest.MonkeyPatch.context() as patch:
        # run_source calls `exec` by name: a module global shadows the builtin.
        patch.setattr(codegen, "exec", recording_exec, raising=False)
        for f, args, kwargs in _calls():
            for _ in range(2):  # the miss, then the hit
                f(*args, **kwargs)
            f._entry_for(args, kwargs)  # the key-only flavour
            with nbjit.profile():  # the timed flavour
                f(*args, **kwargs)
        with jax.profiler.trace(str(tmp_path_factory.mktemp("trace"))):  # the traced flavour
            for f, args, kwargs in _calls():
                f(*args, **kwargs)
        # The CPU's host-memory strategy (`cpu_host_memory`, tests/conftest.py):
        # where the default device's strategy launches (an accelerator's, or
        # the CPU's under NBJIT_TEST_STRATEGY=staged) fresh host values take
        # their own path.
        from nbjit.core.inputs import platforms

        host_memory = not platforms.strategy_for(jax.default_backend()).launches
        if host_memory:
            _fresh_host_calls()
    names = [filename.rsplit("<", 1)[1] for filename in seen]
    kinds = ("binder", "timed", "key_only", "traced", "hit ", "hit timed", "reader", "prepare ")
    if host_memory:
        kinds += ("resident prepare", "resident fence")
    for kind in kinds:
        assert any(name.startswith(kind) or f" {kind}" in name for name in names), (kind, names)
    # Compiled at import, before a test can record their scopes (the keyers of
    # nbjit.core.keys): their undefined names are not checked.
    at_import = {f: None for f in codegen._code_objects if f not in seen}
    return seen, at_import


@pytest.mark.skipif(not os.path.exists(RUFF), reason="needs ruff beside this Python "
                    "(the test extra: pip install -e '.[test]')")
def test_generated_sources_pass_ruff(generated, tmp_path):
    run, at_import = generated
    _ruff(run.items(), tmp_path / "run", "--extend-ignore", "E501")
    _ruff(at_import.items(), tmp_path / "import", "--extend-ignore", "E501,F821")


def test_generated_sources_define_and_use_every_name(generated):
    """No generated function reads a name that neither it, its scope nor the
    builtins define, or assigns a name it never reads (parameters aside: the
    hit path alone takes the timed flavour's first stamps in every flavour)."""
    run, at_import = generated
    faults = {}
    for filename, names in [*run.items(), *at_import.items()]:
        source = _source(filename)
        found = _name_faults(source, names)
        if found:
            faults[filename.rsplit("<", 1)[1]] = found
    assert not faults, faults
    assert len(run) + len(at_import) > 40  # every shape and flavour above ran


def test_name_faults_finds_undefined_and_unused_names():
    source = ("def f(a, b):\n    c = a + missing\n    try:\n        pass\n"
              "    except Exception as error:\n        pass\n    return [x for x in b]\n")
    assert _name_faults(source, set()) == {"undefined": ["missing"], "unused": ["c", "error"]}
    assert _name_faults(source, {"missing"}) == {"unused": ["c", "error"]}
    assert _name_faults("def f(a):\n    return a, len\n", None) == {}


def _name_faults(source: str, supplied: set | None) -> dict[str, list[str]]:
    """The names each function of `source` reads without a definition
    (`supplied`: what its scope holds, None: unknown, not checked) and the
    names it assigns but never reads."""
    tree = ast.parse(source)
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    undefined, unused = set(), set()
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs,
                                  *(x for x in (fn.args.vararg, fn.args.kwarg) if x))}
        stored, loaded = set(), set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Name):
                (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                stored.add(node.name)
        unused |= stored - loaded - params
        if supplied is not None:
            undefined |= loaded - stored - params - defined - set(supplied) - set(dir(builtins))
    faults = {"undefined": sorted(undefined), "unused": sorted(unused)}
    return {k: v for k, v in faults.items() if v}


def _ruff(sources, directory, *options) -> None:
    """Runs ruff with the project's configuration over each generated source,
    preceded by the names its scope supplies (None: not known)."""
    directory.mkdir()
    paths = []
    for i, (filename, names) in enumerate(sorted(sources)):
        source = _source(filename)
        assert source, filename
        supplied = sorted(n for n in names or () if n.isidentifier() and n != "__builtins__")
        header = "".join(f"{n} = None\n" for n in supplied)
        path = directory / f"generated_{i}.py"
        path.write_text(f"# {filename}  # noqa: E501\n{header}{source}")  # names can be long
        paths.append(str(path))
    assert paths
    result = subprocess.run(
        [RUFF, "check", "--no-cache", "--config", os.path.join(ROOT, "pyproject.toml"),
         *options, *paths], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
