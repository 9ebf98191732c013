"""``python -m nbjit run script.py [args...]`` / ``run -m module [args...]``.

Runs a script or module as ``python script.py`` / ``python -m module`` would
(as ``python -m cProfile`` does): ``__name__ == "__main__"``, ``sys.argv`` the
script's own, ``sys.path[0]`` the script's directory (the current one for
``-m``), exit code and uncaught exceptions as the script would give them, but
with `jax.jit` routed to `nbjit.jit` (`nbjit.patch_jax()`), and
`equinox.filter_jit` to `nbjit.filter_jit` when equinox is installed, until
the process exits.

The script's imports are its own: jax is imported when the script imports
it, and patched right then, by a post-import hook (`_AfterImport`, a
``sys.meta_path`` finder whose loader runs the patch once jax's ``__init__``
has run). So whatever importing jax does happens where it does under plain
python: it reads the ``JAX_*`` environment the script may set first, and it
draws 5 numbers from numpy's global generator (jax/_src/clusters), so a
script that seeds numpy and then imports jax gets the same numbers.
equinox alike: `equinox.filter_jit` is routed when the script imports
equinox, and equinox's own import sees JAX's `jax.jit` (as it does under
`patch_jax()`, which imports equinox before patching).

``python -m nbjit`` imports the `nbjit` package before its ``__main__``:
while the process is launching ``run`` (`launching`), the package defers its
imports (of jax, ...), and `run_script` drops the launcher's modules from
``sys.modules`` before the script runs, so that a script's ``import nbjit``
is a real one, at the point where the script makes it. This module imports
nothing of jax or nbjit's at import.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import runpy
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["launching", "run_script"]


def launching() -> bool:
    """Whether this process is starting ``python -m nbjit run`` (or the console
    script's ``nbjit run``) and has not yet handed over to the script: what
    `nbjit/__init__.py` asks before importing jax."""
    argv = sys.argv
    if len(argv) < 2 or argv[1] != "run":
        return False
    if argv[0] == "-m":  # python -m X: the package X is imported while argv[0] is "-m"
        orig = list(getattr(sys, "orig_argv", []))
        return "-mnbjit" in orig or any(
            a == "-m" and b == "nbjit" for a, b in zip(orig, orig[1:], strict=False))
    return os.path.basename(argv[0]) in ("nbjit", "nbjit-compare")  # the console scripts


def run_script(argv: Sequence[str], module: bool = False,
               on_exit: Callable[[], None] | None = None, filter_jit: bool = True,
               on_jax: Callable[[], None] | None = None,
               on_start: Callable[[], None] | None = None) -> int:
    """Runs ``argv[0]`` (a path, or a module name with `module`) with ``argv[1:]``.

    Returns the exit status the script would have had (0, a `sys.exit` code,
    1 after an uncaught exception, whose traceback is printed from the
    script's first frame, as Python prints it; 2 for a missing script and 1
    for a module not found, as Python says them). A `SystemExit` with a
    non-integer code propagates, so Python reports it as it would for the
    script. `on_start`, if given, runs once the script or module was found,
    just before it runs; `on_exit` after it ran (also when it raised or
    exited): the hooks for an end-of-run report. `filter_jit=False` leaves
    `equinox.filter_jit` alone (else it is routed to `nbjit.filter_jit`).
    """
    if not argv:
        raise ValueError("run_script needs a script path or module name")
    target = argv[0]
    if not module and not os.path.exists(target):
        print(f"python -m nbjit run: can't open file {os.path.abspath(target)!r}: "
              "No such file or directory", file=sys.stderr)
        return 2
    _set_path0(os.getcwd() if module else os.path.dirname(os.path.abspath(target)))
    if module and (problem := _module_problem(target)):
        print(f"python -m nbjit run: {problem}", file=sys.stderr)  # as `python -m` says it
        return 1
    sys.argv[:] = list(argv)  # runpy sets argv[0] to the path it runs
    if on_start is not None:
        on_start()
    hook = _route_on_import(filter_jit, on_jax)
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            _run_path_as_main(os.path.abspath(target))
        return 0
    except SystemExit as error:
        if error.code is None:
            return 0
        if isinstance(error.code, int):
            return error.code
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: B036 (shown, then exit status 1, as Python does)
        _print_from_script(error)
        return 1
    finally:
        if hook in sys.meta_path:  # the script is over: later imports are no longer its
            sys.meta_path.remove(hook)
        if on_exit is not None:
            on_exit()


def _route_on_import(filter_jit: bool, on_jax: Callable[[], None] | None) -> _AfterImport:
    """Patches jax now if it is imported, else when the script imports it; routes
    equinox.filter_jit when equinox is imported (now, or when the script does)."""
    if "jax" not in sys.modules:
        _forget_launcher_modules()
    hook = _AfterImport(filter_jit, on_jax)
    hook.settle()
    if hook.waiting:
        sys.meta_path.insert(0, hook)
    return hook


def _forget_launcher_modules() -> None:
    """Drops nbjit's modules (the launcher's, jax-free: `launching`) from
    ``sys.modules``: the script's own ``import nbjit`` then imports nbjit, and
    jax with it, where plain python would. The launcher keeps running on the
    module objects it holds."""
    for name in [n for n in sys.modules if n == "nbjit" or n.startswith("nbjit.")]:
        del sys.modules[name]


class _AfterImport(importlib.abc.MetaPathFinder):
    """The post-import hook of a run: patches jax.jit once jax has been
    imported, routes equinox.filter_jit once equinox has.

    A ``sys.meta_path`` finder that answers only for the modules it watches:
    it finds their spec with the finders after it and wraps the loader
    (`_ThenLoader`), so that it hears when the module's own code starts and
    ends. The patch waits for the outermost watched import to end: jax
    imported by nbjit's own import (the script imports nbjit first) is
    patched once nbjit is whole, and while equinox's own code runs jax.jit is
    JAX's (equinox binds it at import, in helpers of its own), as under
    `patch_jax()`, which imports equinox before patching.
    """

    def __init__(self, filter_jit: bool, on_jax: Callable[[], None] | None) -> None:
        self._watched = {"jax", "nbjit", "equinox"} if filter_jit else {"jax", "nbjit"}
        self._imported: set[str] = {name for name in ("jax", "equinox") if name in sys.modules}
        self._done: set[str] = set()
        self._running: list[str] = []  # watched imports under way, outermost first
        self._settling = False
        self._on_jax = on_jax
        self._filter_jit = filter_jit
        self._finding: set[str] = set()

    @property
    def waiting(self) -> bool:
        return bool(self._watched & {"jax", "equinox"})

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self._watched or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = importlib.util.find_spec(name)  # the finders after this one
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenLoader(spec.loader, self, name)
        return spec

    def before(self, name: str) -> None:
        self._running.append(name)
        if name == "equinox" and "jax" in self._done:
            from nbjit.routing import patch

            patch.unpatch_jax()  # equinox's own import sees JAX's jax.jit

    def after(self, name: str, imported: bool) -> None:
        self._running.remove(name)
        if imported and name != "nbjit":  # nbjit only delays the patch
            self._imported.add(name)
        self.settle()

    def settle(self) -> None:
        """Patches what has been imported, once no watched import is under way."""
        if self._running or self._settling:
            return
        todo = self._imported - self._done
        if not todo:
            return
        self._settling = True
        self._watched.discard("nbjit")  # imported now, by the patch: nothing to wait for
        try:
            from nbjit.routing import patch

            # The whole package, every room registered into the core (a package
            # deferred while `run` launched loads here: jax was imported first).
            _ = importlib.import_module("nbjit").jit
            first = "jax" not in self._done
            self._done.update(todo)
            self._watched -= self._done
            # (jax.jit again too, after equinox's import: `before`)
            patch.patch_jax(filter_jit=self._filter_jit and "equinox" in self._done)
            if first and self._on_jax is not None:
                self._on_jax()
        finally:
            self._settling = False
        if not self.waiting and self in sys.meta_path:
            sys.meta_path.remove(self)


class _ThenLoader(importlib.abc.Loader):
    """`loader`, with the hook's `before` and `after` around the module's code.
    The module keeps its own loader (``__loader__``, ``__spec__.loader``)."""

    def __init__(self, loader: Any, hook: _AfterImport, name: str) -> None:
        self._loader, self._hook, self._name = loader, hook, name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._hook.before(self._name)
        imported = False
        try:
            self._loader.exec_module(module)
            imported = True
        finally:
            self._hook.after(self._name, imported)

    def __getattr__(self, name: str) -> Any:  # the rest of the loader's interface
        return getattr(self._loader, name)


def _set_path0(entry: str) -> None:
    """Makes `entry` ``sys.path[0]``, as ``python script.py`` (its directory) or
    ``python -m`` (the current directory) would: in place of the entry Python
    put there for the launcher (the current directory under ``python -m
    nbjit``, the console script's own directory under ``nbjit``), else first.
    Under ``python -P`` (no such entry) nothing changes, as Python adds none."""
    if sys.flags.safe_path:
        return
    if sys.path and sys.path[0] in _launcher_entries():
        sys.path[0] = entry
    elif entry not in sys.path[:1]:
        sys.path.insert(0, entry)


def _launcher_entries() -> set[str]:
    """What Python put first on ``sys.path`` for what launched this process:
    the current directory (``python -m``; ``""`` in an interactive start) or
    the launching script's directory (the console script, as Python resolves
    it: symlinks followed)."""
    launcher = sys.argv[0] if sys.argv else ""
    return {"", os.getcwd(), os.path.dirname(os.path.abspath(launcher)),
            os.path.dirname(os.path.realpath(launcher))}


def _module_problem(name: str) -> str | None:
    """Why `python -m name` would not start (no such module), or None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as error:
        return (f"Error while finding module specification for {name!r} "
                f"({type(error).__name__}: {error})")
    if spec is None:
        return f"No module named {name}"
    return None


def _run_path_as_main(path: str) -> None:
    """Runs the file at `path` as `python path` would: a fresh ``__main__`` module.

    As in `python script.py` (3.9+), ``__file__`` and the code's file name are
    absolute while ``sys.argv[0]`` stays as given. The module stays
    ``sys.modules["__main__"]`` afterwards, for atexit handlers and threads.
    """
    with io.open_code(path) as source:
        code = compile(source.read(), path, "exec")
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins  # type: ignore[attr-defined]  # as runpy sets it
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _print_from_script(error: BaseException) -> None:
    """Prints `error` as Python would for the script: without this runner's frames."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__,
                                                                 "<frozen runpy>"):
        tb = tb.tb_next
    sys.excepthook(type(error), error.with_traceback(tb), tb)
    sys.stderr.flush()
