"""Load a script of ``benchmarks/`` as a module (they are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def load_benchmark() -> Iterator[Callable[[str], ModuleType]]:
    """``load_benchmark("bench_accelforge")``: the script imported under its own name for the module's tests."""
    loaded: list[str] = []

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses in the script resolve their module by name
        spec.loader.exec_module(module)
        loaded.append(name)
        return module

    yield load
    for name in loaded:
        sys.modules.pop(name, None)
