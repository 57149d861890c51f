"""Mambalaya: an Einsum-cascade fusion explorer and compiler.

The flow, one stage per subpackage, each importing only earlier ones::

    ir -> parse -> analysis -> arch -> schedule -> cost -> mapper -> exec -> report -> study

The names below are the Python API; they load their stage on first use, so
``import mambalaya`` stays quick (Numba and OR-Tools load only when needed).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    # parse
    "open_cascade": "mambalaya.parse",
    "load_cascade": "mambalaya.parse",
    "parse_cascade_text": "mambalaya.parse",
    "cascade_from_dict": "mambalaya.parse",
    "MODELS": "mambalaya.parse",
    # ir
    "Cascade": "mambalaya.ir.cascade",
    "Einsum": "mambalaya.ir.cascade",
    "Mapping": "mambalaya.ir.mapping",
    "FusionGroup": "mambalaya.ir.mapping",
    "unfused_mapping": "mambalaya.ir.mapping",
    "load_mapping": "mambalaya.ir.mapping",
    "save_mapping": "mambalaya.ir.mapping",
    # analysis
    "analyze": "mambalaya.analysis",
    # arch
    "load_arch": "mambalaya.arch",
    # mapper
    "optimal_mapping": "mambalaya.mapper",
    "chain_layers": "mambalaya.ir.chain",
    "evaluate": "mambalaya.mapper",  # (a mapping's cost; without one, the unfused baseline's)
    # exec
    "verify_mapping": "mambalaya.exec.verify",
    "run_reference": "mambalaya.exec.reference",
    "random_inputs": "mambalaya.exec.reference",
    "run_layer": "mambalaya.exec.realweights",
    "write_random_model": "mambalaya.exec.random_model",
    "generate": "mambalaya.exec.generate",
    "load_generator": "mambalaya.exec.generate",
    "predict_generation": "mambalaya.exec.generate",
    # study
    "explore": "mambalaya.study",
    # errors
    "MambalayaError": "mambalaya.errors",
    "CascadeError": "mambalaya.errors",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'mambalaya' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
