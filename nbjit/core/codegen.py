"""Running generated source: the binders (`nbjit.core.binders`) and input preparers
(`nbjit.core.record`) are small functions compiled from templates.

Compiled code is shared by every scope that runs the same source (compiling
costs far more than running the compiled code into a scope): generated names
stand for values the scope supplies, so the source depends only on a call's
structure.
"""

from __future__ import annotations

import hashlib
import linecache
import os
from typing import Any

__all__ = ["run_source", "source_filename"]

_DIR = os.path.dirname(os.path.abspath(__file__))
_code_objects: dict[str, Any] = {}  # file name (names the source's text) -> compiled code
_MAX_CODE_OBJECTS = 1024


def source_filename(source: str, name: str) -> str:
    """The file name generated `source` is compiled under: `name` and a hash of
    the text, so two different sources never share a name (tracebacks and
    `inspect.getsource` show the code that ran) and the same source always
    gets the same one (its compiled code is shared). Under nbjit's directory:
    JAX's error messages skip its frames (source_info_util)."""
    digest = hashlib.blake2b(source.encode(), digest_size=6).hexdigest()
    return f"{_DIR}/<{name} {digest}>"


def run_source(source: str, name: str, scope: dict[str, Any]) -> dict[str, Any]:
    """Runs `source` (module-level definitions) in `scope` and returns `scope`."""
    filename = source_filename(source, name)
    code = _code_objects.get(filename)
    if code is None:
        if len(_code_objects) >= _MAX_CODE_OBJECTS:  # linecache keeps what it holds
            for old in _code_objects:
                linecache.cache.pop(old, None)
            _code_objects.clear()
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        code = compile(source, filename, "exec")
        _code_objects[filename] = code
    exec(code, scope)
    return scope
