"""Backends behind one protocol: each prints a :class:`~mambalaya.schedule.Schedule` and runs it.

A backend (``python``: the schedule walked with numpy; ``numba``: one compiled CPU kernel per group
on an arena of the arch's capacity; ``triton``: one GPU kernel per group) answers

- ``available()``: None, or why it cannot run here (no GPU, no triton);
- ``supports(cascade, group)``: None, or why it cannot print this group (it then runs on the
  reference fallback, labelled);
- ``compile(cascade, schedule, dtype, **options)`` -> a program;
- ``run(program, inputs)`` -> :class:`RunResult`: the cascade's outputs, the bytes its load and store
  statements moved per tensor (counted as they ran), per-group seconds.

Backends register themselves with :func:`register`; the CLI's ``--backend`` choices are
:func:`backend_names`. Importing this module registers the shipped ones lazily (their heavy
imports happen on first use).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from mambalaya.errors import MambalayaError
from mambalaya.ir.cascade import Cascade
from mambalaya.schedule import GroupSchedule, Schedule


@dataclass
class RunResult:
    """What one run of a schedule produced and moved."""

    outputs: dict[str, np.ndarray]
    moved: dict[str, dict[str, int]]  # tensor -> {"read": bytes, "write": bytes}, counted by the statements
    group_s: list[float] = field(default_factory=list)
    compile_s: float = 0.0
    fallbacks: list[tuple[int, str]] = field(default_factory=list)  # (group, why it ran on the reference)
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific (the Triton per-group runs, traces)

    @property
    def traffic_bytes(self) -> int:
        return sum(v["read"] + v["write"] for v in self.moved.values())

    @property
    def run_s(self) -> float:
        return sum(self.group_s)


class Backend(Protocol):
    name: str
    description: str

    def available(self) -> str | None: ...

    def supports(self, cascade: Cascade, group: GroupSchedule) -> str | None: ...

    def compile(self, cascade: Cascade, schedule: Schedule, dtype: str, **options: Any) -> Any: ...

    def run(self, program: Any, inputs: dict[str, np.ndarray], *, count: bool = True) -> RunResult:
        """Run ``program``; ``count=False`` lets a backend skip counting its moves where counting costs time
        (the result's moves may then be empty)."""
        ...


_REGISTRY: dict[str, Backend] = {}
#: shipped backends, imported on first use: name -> (module, one-line description)
_SHIPPED = {
    "numba": ("mambalaya.exec.numba_backend", "CPU: one compiled Numba kernel per group, buffers in an arena of "
                                              "the arch's capacity"),
    "triton": ("mambalaya.exec.triton_backend", "GPU: one generated Triton kernel per group (TRITON_INTERPRET=1 "
                                                "runs it on the CPU)"),
    "python": ("mambalaya.exec.interpret", "the schedule walked in Python with numpy (slow; the backends' oracle)"),
}


def register(backend: Backend) -> Backend:
    """Add a backend to the registry (a plugin calls this); returns it."""
    _REGISTRY[backend.name] = backend
    return backend


def backend_names() -> list[str]:
    return sorted({*_SHIPPED, *_REGISTRY})


def describe_backends() -> dict[str, str]:
    return {n: (_REGISTRY[n].description if n in _REGISTRY else _SHIPPED[n][1]) for n in backend_names()}


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (importing a shipped one on first use)."""
    if name not in _REGISTRY and name in _SHIPPED:
        importlib.import_module(_SHIPPED[name][0])
    if name not in _REGISTRY:
        raise MambalayaError(f"unknown backend {name!r}: use one of {', '.join(backend_names())}")
    return _REGISTRY[name]


def execute(cascade: Cascade, schedule: Schedule, inputs: dict[str, np.ndarray], backend: str = "numba",
            dtype: str = "float64", **options: Any) -> RunResult:
    """Compile ``schedule`` on the named backend and run it on ``inputs`` (the one dispatch every caller uses)."""
    engine = get_backend(backend)
    why = engine.available()
    if why is not None:
        raise MambalayaError(f"the {backend} backend cannot run here: {why}")
    t0 = time.perf_counter()
    program = engine.compile(cascade, schedule, dtype, **options)
    compile_s = time.perf_counter() - t0
    res = engine.run(program, inputs)
    res.compile_s += compile_s
    return res


def counted_bytes(cascade: Cascade, elements: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per-tensor element counts in bytes (each tensor's declared element size)."""
    return {t: {k: v * cascade.tensors[t].element_bytes for k, v in d.items()} for t, d in elements.items()}


__all__ = ["Backend", "RunResult", "backend_names", "counted_bytes", "describe_backends", "execute", "get_backend", "register"]
