"""Generated source: the binders (`nbjit.core.binders`) and input preparers
(`nbjit.core.record`, `nbjit.host`) are small functions compiled from source.

`Source` is the one emitter: a generator writes statements (`line`) and
nested blocks (`block`), and only `Source` lays out indentation, so no
generator types it by hand.

Compiled code is shared by every scope that runs the same source (compiling
costs far more than running the compiled code into a scope): generated names
stand for values the scope supplies, so the source depends only on a call's
structure. A source is named in its emitter's folder (`run_source`'s
`emitter`: a binder under ``nbjit/core/``, a resident prepare under
``nbjit/host/``).
"""

from __future__ import annotations

import contextlib
import hashlib
import linecache
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["Source", "generated_source", "run_source", "source_filename"]

_DIR = os.path.dirname(os.path.abspath(__file__))
_folders: dict[str, str] = {}  # emitter module -> its folder
# file name (names the source's text) -> (compiled code, the source)
_code_objects: dict[str, tuple[Any, str]] = {}
_MAX_CODE_OBJECTS = 1024


class Source:
    """Source built from structure: statements at a depth, each block one
    level deeper than its header.

        src = Source()
        with src.block("def f(x):"):
            with src.block("if x:"):
                src.line("return 1")
            src.line("return 0")
        src.text()  # "def f(x):\\n    if x:\\n        return 1\\n    return 0\\n"

    A statement is one line without its indentation (it may carry a trailing
    comment); `extend` nests another `Source`'s statements at this depth.
    """

    __slots__ = ("_lines", "_depth")

    INDENT = "    "

    def __init__(self) -> None:
        self._lines: list[tuple[int, str]] = []  # (depth, statement)
        self._depth = 0

    def line(self, statement: str) -> Source:
        """Adds one statement at the current depth."""
        self._lines.append((self._depth, statement))
        return self

    def lines(self, statements: Iterable[str]) -> Source:
        """Adds statements at the current depth, in order."""
        for statement in statements:
            self.line(statement)
        return self

    @contextlib.contextmanager
    def block(self, header: str) -> Iterator[Source]:
        """Adds `header` (``if ...:``, ``try:``, ``def ...:``); what is added
        inside the ``with`` goes one level deeper."""
        self.line(header)
        self._depth += 1
        try:
            yield self
        finally:
            self._depth -= 1

    def extend(self, other: Source) -> Source:
        """Adds `other`'s statements, nested at the current depth."""
        self._lines.extend((self._depth + depth, statement) for depth, statement in other._lines)
        return self

    def __bool__(self) -> bool:
        return bool(self._lines)

    def text(self) -> str:
        """The source: every statement on its own line, indented by its depth."""
        indent = self.INDENT
        return "".join(f"{indent * depth}{statement}\n" for depth, statement in self._lines)


def source_filename(source: str, name: str, emitter: str) -> str:
    """The file name generated `source` is compiled under: `name` and a hash of
    the text, so two different sources never share a name (tracebacks and
    `inspect.getsource` show the code that ran) and the same source always
    gets the same one (its compiled code is shared), in the folder of module
    `emitter` (the one that wrote it). nbjit's own are under nbjit's
    directory: JAX's error messages skip their frames (source_info_util)."""
    digest = hashlib.blake2b(source.encode(), digest_size=6).hexdigest()
    return f"{_folder(emitter)}/<{name} {digest}>"


def _folder(emitter: str) -> str:
    folder = _folders.get(emitter)
    if folder is None:
        file = getattr(sys.modules.get(emitter), "__file__", None)
        folder = _folders[emitter] = os.path.dirname(os.path.abspath(file)) if file else _DIR
    return folder


def run_source(source: str, name: str, scope: dict[str, Any], emitter: str) -> dict[str, Any]:
    """Runs `source` (module-level definitions) in `scope` and returns `scope`;
    `emitter` is the module that wrote it (`__name__`: see `source_filename`)."""
    filename = source_filename(source, name, emitter)
    entry = _code_objects.get(filename)
    if entry is None:
        if len(_code_objects) >= _MAX_CODE_OBJECTS:  # linecache keeps what it holds
            for old in _code_objects:
                linecache.cache.pop(old, None)
            _code_objects.clear()
        entry = _code_objects[filename] = (compile(source, filename, "exec"), source)
    if filename not in linecache.cache:  # new, or dropped by a linecache.clearcache()
        _show(filename, source)
    exec(entry[0], scope)
    return scope


def generated_source(filename: str) -> str | None:
    """The text of a generated source still cached (None: unknown or
    evicted), put back into linecache if something cleared it there."""
    entry = _code_objects.get(filename)
    if entry is None:
        return None
    if filename not in linecache.cache:
        _show(filename, entry[1])
    return entry[1]


def _show(filename: str, source: str) -> None:
    """Puts `source` where tracebacks and `inspect.getsource` read it."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
