"""Running generated source: the binders (`nbjit._keys`) and input preparers
(`nbjit._record`) are small functions compiled from templates.

Compiled code is shared by every scope that runs the same source (compiling
costs ~50 us, running it into a scope ~2): generated names stand for values
the scope supplies, so the source depends only on a call's structure.
"""

from __future__ import annotations

import linecache
import os
from typing import Any

__all__ = ["run_source"]

_DIR = os.path.dirname(os.path.abspath(__file__))
_code_objects: dict[tuple[str, str], Any] = {}  # (source, name) -> compiled module code
_MAX_CODE_OBJECTS = 1024


def run_source(source: str, name: str, scope: dict[str, Any]) -> dict[str, Any]:
    """Runs `source` (module-level definitions) in `scope` and returns `scope`."""
    code = _code_objects.get((source, name))
    if code is None:
        # A file name under nbjit's directory: JAX's error messages skip its
        # frames (source_info_util), and linecache shows the source in tracebacks.
        filename = f"{_DIR}/<{name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        code = compile(source, filename, "exec")
        if len(_code_objects) >= _MAX_CODE_OBJECTS:
            _code_objects.clear()
        _code_objects[(source, name)] = code
    exec(code, scope)
    return scope
