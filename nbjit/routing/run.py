"""``python -m nbjit run script.py [args...]`` / ``run -m module [args...]``.

Runs a script or module as ``python script.py`` / ``python -m module`` would
(as ``python -m cProfile`` does): ``__name__ == "__main__"``, ``sys.argv`` the
script's own, ``sys.path[0]`` the script's directory (the current one for
``-m``), exit code and uncaught exceptions as the script would give them, but
with `jax.jit` routed to `nbjit.jit` (`nbjit.patch_jax()`), and
`equinox.filter_jit` to `nbjit.filter_jit` when equinox is installed, from
before the script's first line until the process exits.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import os
import runpy
import sys
import types
from collections.abc import Callable, Sequence

from nbjit.routing import patch as _patch

__all__ = ["run_script"]


def run_script(argv: Sequence[str], module: bool = False,
               on_exit: Callable[[], None] | None = None, filter_jit: bool = True) -> int:
    """Runs ``argv[0]`` (a path, or a module name with `module`) with ``argv[1:]``.

    Returns the exit status the script would have had (0, a `sys.exit` code,
    1 after an uncaught exception, whose traceback is printed from the
    script's first frame, as Python prints it). A `SystemExit` with a
    non-integer code propagates, so Python reports it as it would for the
    script. `on_exit`, if given, runs after the script (also when it raised
    or exited): the hook for an end-of-run report. `filter_jit=False` leaves
    `equinox.filter_jit` alone (else it is routed to `nbjit.filter_jit`).
    """
    if not argv:
        raise ValueError("run_script needs a script path or module name")
    target = argv[0]
    if not module and not os.path.exists(target):
        print(f"python -m nbjit run: can't open file {os.path.abspath(target)!r}: "
              "No such file or directory", file=sys.stderr)
        return 2
    if module and (problem := _module_problem(target)):
        print(f"python -m nbjit run: {problem}", file=sys.stderr)  # as `python -m` says it
        return 1
    sys.argv[:] = list(argv)  # runpy sets argv[0] to the path it runs
    if not module:
        script_dir = os.path.dirname(os.path.abspath(target))
        if sys.path and sys.path[0] in ("", os.getcwd()):
            sys.path[0] = script_dir  # what `python script.py` puts there
        else:
            sys.path.insert(0, script_dir)
    _patch.patch_jax(filter_jit=filter_jit)
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
        if on_exit is not None:
            on_exit()


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
