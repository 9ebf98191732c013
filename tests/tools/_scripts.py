"""The scripts under benchmarks/ (not a package), loaded by path for their tests."""

from __future__ import annotations

import importlib.util
import pathlib
import types

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str) -> types.ModuleType:
    """benchmarks/<name>.py as a module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
