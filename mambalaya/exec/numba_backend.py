"""The ``numba`` backend: one compiled CPU kernel per group of a schedule, buffers in one fixed arena.

:func:`run_schedule` prints each group (:mod:`mambalaya.exec.numba_codegen`), compiles it, and runs
the groups in order on whole off-chip arrays and one arena of the schedule's capacity: every
buffer of every group is a fixed slice of it, so a schedule that claims more on chip than the
capacity cannot run (it is refused before it starts), and what a compute reads is what the
group's statements put on chip. The bytes counted are the elements each load and store copied,
times the tensor's declared element size.

Kernels are cached twice: in memory (by the source), and on disk, because the source is written to
a module file named by its hash under the kernel cache directory (``$MAMBALAYA_KERNEL_CACHE``,
default ``~/.cache/mambalaya/kernels``) and compiled with ``cache=True``: Numba reuses the machine
code across processes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
import warnings
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
from numba.core.errors import NumbaPerformanceWarning

from mambalaya.errors import MambalayaError
from mambalaya.exec import numba_codegen
from mambalaya.exec.backend import RunResult, register
from mambalaya.exec.numba_codegen import group_source
from mambalaya.exec.reference import prepare_inputs
from mambalaya.fileio import write_atomic
from mambalaya.ir.cascade import Cascade
from mambalaya.schedule import GroupSchedule, Schedule

_MODULES: dict[str, Any] = {}
#: (cascade, group, dtype) -> (its weak references, kernel, source): the printed source of a group object
_BY_GROUP: OrderedDict[tuple[int, int, str], tuple[Any, Any, Any, str]] = OrderedDict()
_BY_GROUP_MAX = 512


def kernel_cache_dir() -> Path:
    root = os.environ.get("MAMBALAYA_KERNEL_CACHE") or str(Path.home() / ".cache" / "mambalaya" / "kernels")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_module(source: str, stem: str = "mambalaya_kernel") -> Any:
    """Import generated source from a file named by its hash (Numba's and Triton's jit need a real file)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    name = f"{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    path = kernel_cache_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        write_atomic(path, source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _openblas_threads() -> tuple[Any, Any] | None:
    """(set, get) of the thread count of the OpenBLAS that numba's np.dot calls (scipy's), or None."""
    import ctypes
    import glob

    try:
        import scipy

        libs = glob.glob(os.path.join(os.path.dirname(scipy.__file__), "..", "scipy.libs", "*openblas*"))
        for path in libs:
            lib = ctypes.CDLL(path)
            for prefix in ("scipy_openblas", "openblas"):
                if hasattr(lib, f"{prefix}_set_num_threads") and hasattr(lib, f"{prefix}_get_num_threads"):
                    return getattr(lib, f"{prefix}_set_num_threads"), getattr(lib, f"{prefix}_get_num_threads")
    except (ImportError, OSError):
        pass
    return None


_BLAS = _openblas_threads()
if _BLAS is None:  # cannot keep BLAS single-threaded inside the kernels' OpenMP loops: products run serially
    numba_codegen.BLAS_IN_PRANGE = False


class blas_single_thread:
    """While kernels run, BLAS runs on one thread: the kernels' ``prange`` loops parallelise the products
    (OpenBLAS's own thread pool inside an OpenMP loop may hang, and outside one it fights the spinning
    OpenMP workers for the cores)."""

    def __enter__(self) -> None:
        self.saved = None
        if _BLAS is not None:
            self.saved = int(_BLAS[1]())
            _BLAS[0](1)

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None and _BLAS is not None:
            _BLAS[0](self.saved)


def group_kernel(cascade: Cascade, g: GroupSchedule, dtype: str) -> tuple[Any, str]:
    """(kernel, source) of one group, generated and imported once per source, and printed once per group
    object (printing is milliseconds: a decode step that runs in less would pay it at every token)."""
    key = (id(cascade), id(g), dtype)
    hit = _BY_GROUP.get(key)
    if hit is not None and hit[0]() is cascade and hit[1]() is g:  # (ids of live objects are not reused)
        _BY_GROUP.move_to_end(key)
        return hit[2], hit[3]
    source = group_source(cascade, g, dtype)
    mod = _MODULES.get(source)
    if mod is None:
        mod = _MODULES[source] = load_module(source)
    _BY_GROUP[key] = (weakref.ref(cascade), weakref.ref(g), mod.kernel, source)
    while len(_BY_GROUP) > _BY_GROUP_MAX:
        _BY_GROUP.popitem(last=False)
    return mod.kernel, source


def arena_elements(cascade: Cascade, capacity_bytes: int) -> int:
    """Elements of the arena that holds a schedule's buffers: the capacity in the smallest element size."""
    eb = min((t.element_bytes for t in cascade.tensors.values()), default=4)
    return max(1, capacity_bytes // eb)


def run_schedule(cascade: Cascade, schedule: Schedule, inputs: dict[str, np.ndarray], dtype: str = "float64",
                 arena_bytes: int | None = None) -> RunResult:
    """Run every group of ``schedule`` on ``inputs``: outputs, bytes moved per tensor, seconds per group.

    ``arena_bytes`` is the on-chip capacity the arena has (default: the schedule's, the arch's); a group
    whose buffers do not fit it is refused."""
    if dtype not in ("float64", "float32"):
        raise MambalayaError(f"the numba backend runs float64 or float32, not {dtype}")
    np_dtype = np.dtype(dtype)
    env = dict(prepare_inputs(cascade, inputs, np_dtype))
    cap = schedule.capacity_bytes if arena_bytes is None else arena_bytes
    need = max((g.arena_elements for g in schedule.groups), default=0)
    elements = arena_elements(cascade, cap)
    if need > elements:
        worst = max(schedule.groups, key=lambda g: g.arena_elements)
        raise MambalayaError(f"group {worst.index} [{', '.join(worst.einsums)}] needs {worst.occupancy_bytes} bytes "
                             f"on chip, more than the arena's {cap}: it cannot run")
    arena = np.empty(elements, dtype=np_dtype)
    moved: dict[str, dict[str, int]] = {}
    times, compile_s = [], 0.0
    for g in schedule.groups:
        t0 = time.perf_counter()
        kernel, _ = group_kernel(cascade, g, dtype)
        params = g.params
        for t in g.writes:
            if t not in env:
                env[t] = np.empty(cascade.shape(t), dtype=np_dtype)
        args = [env[t] for t in params]
        tc = np.zeros(2 * len(params), dtype=np.int64)
        call = (*args, arena, tc)
        if not kernel.signatures:  # the first call compiles (or loads Numba's disk cache)
            with warnings.catch_warnings():  # np.dot on strided views: numba copies them, by design
                warnings.simplefilter("ignore", NumbaPerformanceWarning)
                kernel.compile(tuple(kernel.typeof_pyval(a) for a in call))
        t1 = time.perf_counter()
        compile_s += t1 - t0
        with blas_single_thread():
            kernel(*call)
        times.append(time.perf_counter() - t1)
        for i, t in enumerate(params):
            eb = cascade.tensors[t].element_bytes
            slot = moved.setdefault(t, {"read": 0, "write": 0})
            slot["read"] += int(tc[2 * i]) * eb
            slot["write"] += int(tc[2 * i + 1]) * eb
    return RunResult({n: env[n] for n in cascade.outputs()}, moved, times, compile_s)


class NumbaBackend:
    name = "numba"
    description = "CPU: one compiled Numba kernel per group, buffers in an arena of the arch's capacity"

    def available(self) -> str | None:
        return None

    def supports(self, cascade: Cascade, group: GroupSchedule) -> str | None:
        return None

    def compile(self, cascade: Cascade, schedule: Schedule, dtype: str, **options: Any) -> Any:
        for g in schedule.groups:
            group_kernel(cascade, g, dtype)
        return cascade, schedule, dtype, options.get("arena_bytes")

    def run(self, program: Any, inputs: dict[str, np.ndarray], *, count: bool = True) -> RunResult:
        cascade, schedule, dtype, arena = program  # (counting is a few additions in its loops: always on)
        return run_schedule(cascade, schedule, inputs, dtype, arena)


register(NumbaBackend())

__all__ = ["NumbaBackend", "blas_single_thread", "group_kernel", "kernel_cache_dir", "load_module", "run_schedule"]
