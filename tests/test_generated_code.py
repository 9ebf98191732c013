"""Generated code is held to the standard of written code: ruff passes on it,
with all of the project's rules (line length included: the generators fill
long expressions over lines, `nbjit.core.codegen.fill`).

Every function nbjit compiles from a template (binders in each flavour, the
hit path, keyers, input preparers, packed and resident preparers, fences)
goes through `nbjit.core.codegen.run_source`. This test makes calls of many
shapes (positional, keywords, statics, pytrees, host leaves, mixed leaf
kinds, many arguments), under a profile (the timed flavour) and keyed only
(`_entry_for`), with fresh host values until their inputs are packed and
resident; it records each source that runs and the names its scope
supplies, and runs ruff, with the project's configuration, over each source
preceded by those names (so an undefined name still fails).
"""

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
from nbjit.host import packing as _packed
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
    """Fresh host values each call, past the point where they are packed or resident."""
    for resident in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_policy, "RESIDENT", resident)
            f = nbjit.jit(lambda a, b: a + b)  # a new function: a node of its own
            for i in range(3 * _policy.PACK_AFTER):
                f(np.full(8, i, np.float32), np.full(8, 1, np.float32))
                if i == _policy.PACK_AFTER + 2:
                    assert _packed.wait(120)
            assert _packed.wait(120)
            assert f(np.ones(8, np.float32), np.ones(8, np.float32)).tolist() == [2.0] * 8


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """filename -> names its scope supplies, of every generated source run by
    calls of every shape and flavour (see the module docstring)."""
    seen = {}

    def recording_exec(code, scope):
        seen[code.co_filename] = set(scope)
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
        _fresh_host_calls()
    names = [filename.rsplit("<", 1)[1] for filename in seen]
    for kind in ("binder", "timed", "key_only", "traced", "hit ", "hit timed", "reader",
                 "prepare ",
                 "packed prepare", "resident prepare", "resident fence"):
        assert any(name.startswith(kind) or f" {kind}" in name for name in names), (kind, names)
    # Compiled at import, before a test can record their scopes (the keyers of
    # nbjit.core.keys): their undefined names are not checked.
    at_import = {f: None for f in codegen._code_objects if f not in seen}
    return seen, at_import


def test_generated_sources_pass_ruff(generated, tmp_path):
    run, at_import = generated
    _ruff(run.items(), tmp_path / "run")
    _ruff(at_import.items(), tmp_path / "import", "--extend-ignore", "F821")


def test_generated_lines_fit_the_line_length(generated, tmp_path):
    """Checked on its own too, so a long line names itself."""
    run, at_import = generated
    _ruff([*run.items(), *at_import.items()], tmp_path / "all", "--select", "E501")


def _ruff(sources, directory, *options) -> None:
    """Runs ruff with the project's configuration over each generated source,
    preceded by the names its scope supplies (None: not known)."""
    directory.mkdir()
    paths = []
    for i, (filename, names) in enumerate(sorted(sources)):
        source = "".join(linecache.getlines(filename))
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
