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
from collections.abc import Sequence
from typing import Any

__all__ = ["LINE_LENGTH", "condition", "fill", "listed", "run_source", "source_filename"]

_DIR = os.path.dirname(os.path.abspath(__file__))
_code_objects: dict[str, Any] = {}  # file name (names the source's text) -> compiled code
_MAX_CODE_OBJECTS = 1024

# Generated code is linted like written code (tests/test_generated_code.py):
# the project's line length (pyproject.toml), kept by the generators below.
LINE_LENGTH = 100


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


# ---------------------------------------------------------------------------
# Layout: an expression that would not fit on its line is filled over several,
# its continuation lines at `indent` (inside brackets, where Python ignores
# indentation). What fits stays the one line it always was.


def listed(items: Sequence[str], open_: str, close: str, one_tuple: bool = False) -> list[str]:
    """The pieces of ``open_ + ", ".join(items) + close`` for `fill`, each item
    with its comma; `one_tuple`: a lone item keeps its comma (``(a,)``)."""
    if not items:
        return [open_ + close]
    pieces = [f"{x}," for x in items[:-1]]
    pieces.append(items[-1] + ("," if one_tuple and len(items) == 1 else "") + close)
    pieces[0] = open_ + pieces[0]
    return pieces


def fill(pieces: Sequence[str], start: int, indent: str, reserve: int = 0,
         width: int = LINE_LENGTH) -> str:
    """`pieces` joined by spaces, on one line if it fits between column
    `start` and `width` less `reserve` (what follows on the last line), else
    broken between pieces (so only inside brackets), each further line at
    `indent`; a `width` under the line length leaves room for indenting the
    text later (`textwrap.indent`)."""
    lines, line, column = [], "", start
    for i, piece in enumerate(pieces):
        tail = reserve if i == len(pieces) - 1 else 0
        if line and column + 1 + len(piece) + tail > width:
            lines.append(line)
            line, column = indent + piece, len(indent) + len(piece)
        else:
            column += len(piece) + (1 if line else 0)
            line += (" " if line else "") + piece
    lines.append(line)
    return "\n".join(lines)


def condition(terms: Sequence[str], joiner: str, start: int, indent: str, reserve: int = 1
              ) -> str:
    """``terms`` joined by `joiner` (" and"), in parentheses if it takes
    more than one line (they change nothing of the compiled code)."""
    pieces = [f"{t}{joiner}" for t in terms[:-1]] + [terms[-1]]
    one_line = fill(pieces, start, indent, reserve)
    if "\n" not in one_line:
        return one_line
    return fill(["(" + pieces[0], *pieces[1:-1], pieces[-1] + ")"] if len(pieces) > 1
                else ["(" + pieces[0] + ")"], start, indent, reserve)
