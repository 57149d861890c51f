"""The fused executor: one compiled Numba loop nest per fusion group, with traffic counting.

``run_fused`` generates (see :mod:`mambalaya.exec.codegen`) and compiles one
kernel per group of a mapping, runs the groups in order on full arrays for the
tensors that cross group boundaries, and sums the bytes every kernel counted
(see :mod:`mambalaya.exec.traffic_counter` for the rule). ``verify`` checks a
mapping against the reference interpreter on random inputs.

Kernels are cached twice: in memory, keyed by (cascade fingerprint: Einsum
texts, tensor specs and bound values; the group; the dtype), so a second run in
the same process neither regenerates nor recompiles; and on disk, because the
generated source is written to a module file named by its hash under the kernel
cache directory (``$MAMBALAYA_KERNEL_CACHE``, default ``~/.cache/mambalaya/kernels``)
and compiled with ``cache=True``, so Numba reuses the machine code across processes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numba.core.errors import NumbaPerformanceWarning

from mambalaya.errors import MambalayaError
from mambalaya.exec import codegen
from mambalaya.exec.codegen import GroupPlan, group_source, plan_group, tiled_loops
from mambalaya.exec.reference import prepare_inputs, random_inputs, run_reference
from mambalaya.exec.traffic_counter import counted_bytes, new_counter
from mambalaya.fileio import write_atomic
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup, Mapping

_KERNELS: dict[tuple, tuple[GroupPlan, Any]] = {}


@dataclass
class FusedResult:
    """What one fused run produced and moved."""

    outputs: dict[str, np.ndarray]
    traffic_bytes: int
    traffic_by_tensor: dict[str, dict[str, int]] = field(default_factory=dict)
    compile_s: float = 0.0
    run_s: float = 0.0
    per_group_bytes: list[int] = field(default_factory=list)
    per_group_s: list[float] = field(default_factory=list)


def kernel_cache_dir() -> Path:
    root = os.environ.get("MAMBALAYA_KERNEL_CACHE") or str(Path.home() / ".cache" / "mambalaya" / "kernels")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    codegen.BLAS_IN_PRANGE = False


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


_FINGERPRINTS: dict[int, tuple[Cascade, str]] = {}
_VALID: dict[tuple[int, int], tuple[Cascade, Mapping]] = {}


def _fingerprint(cascade: Cascade) -> str:
    hit = _FINGERPRINTS.get(id(cascade))
    if hit is not None and hit[0] is cascade:
        return hit[1]
    fp = _fingerprint_text(cascade)
    if len(_FINGERPRINTS) > 256:
        _FINGERPRINTS.clear()
    _FINGERPRINTS[id(cascade)] = (cascade, fp)
    return fp


def _fingerprint_text(cascade: Cascade) -> str:
    parts = [cascade.name]
    parts += [e.text for e in cascade.einsums]
    parts += [f"{n}:{t.role}:{t.dtype}:{cascade.shape(n)}" for n, t in sorted(cascade.tensors.items())]
    parts += [f"{k}={v!r}" for k, v in sorted(cascade.values.items())]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _load_module(source: str) -> Any:
    """Import generated source from a file named by its hash (Numba's on-disk cache needs a real file)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    name = f"mambalaya_kernel_{digest}"
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


def group_kernel(cascade: Cascade, mapping: Mapping, gi: int, dtype: str) -> tuple[GroupPlan, Any, str]:
    """The (plan, compiled-on-first-call kernel, source) of group ``gi``; generated once per process."""
    group = mapping.groups[gi]
    key = (_fingerprint(cascade), _group_key(mapping, gi), dtype)
    hit = _KERNELS.get(key)
    if hit is not None:
        return hit[0], hit[1], ""
    order = [tuple(g.einsums) for g in mapping.groups]
    plan = plan_group(cascade, order, gi, mapping)
    source = group_source(cascade, group, plan, dtype)
    kernel = _load_module(source).kernel
    _KERNELS[key] = (plan, kernel)
    return plan, kernel, source


def _group_key(mapping: Mapping, gi: int) -> tuple:
    g: FusionGroup = mapping.groups[gi]
    # who reads a tensor outside, and whether it recomputes it, decides its store
    others = tuple((tuple(x.einsums), tuple(x.recompute)) for x in mapping.groups)
    return (tuple(g.einsums), tuple(g.loop_order), tuple(sorted(g.tiles.items())), tuple(g.recompute), others)


def clear_levels(
    cascade: Cascade,
    group: FusionGroup,
    plan: GroupPlan,
    buffer_bytes: int | None,
    weights_resident: bool = False,
) -> np.ndarray:
    """Per kernel parameter, the tile loop at whose every iteration its loads start a new pass (-1: never).

    The residency policy shared with the cost model (:mod:`mambalaya.cost.traffic`): a boundary
    input stays on chip for the whole group (one pass) when its footprint plus the group's buffer
    need (from the analysis) fits ``buffer_bytes``; otherwise it is re-loaded at each iteration of
    the tile loops outside the first loop-order rank that indexes it. Weights on a
    ``weights_resident`` arch stay on chip across groups. The bytes themselves are counted by the kernel.
    """
    from mambalaya.cost.context import CostContext  # footprint and buffer need: the shared policy inputs

    loops = [r for r, _ in tiled_loops(cascade, group)]
    out = np.full(len(plan.params), -1, dtype=np.int64)
    if not loops:
        return out
    ctx = CostContext(cascade, None)  # type: ignore[arg-type]  # footprints and buffers need no arch
    need = ctx.group_buffer_bytes(group)
    for i, t in enumerate(plan.params):
        if t in plan.writes:
            continue
        readers = tuple(e for e in plan.members if t in ctx.reads(e))
        if not readers:
            continue
        if weights_resident and cascade.tensors[t].role == "weight":
            continue
        if buffer_bytes is None or ctx.footprint_bytes(t, readers) + need <= buffer_bytes:
            continue
        ranks = frozenset().union(*(ctx.reads(e)[t].ranks for e in readers))
        level = -1
        for r in group.loop_order:
            if r in ranks:
                break
            if r in loops:
                level = loops.index(r)
        out[i] = level
    return out


def run_fused(
    cascade: Cascade,
    mapping: Mapping,
    inputs: dict[str, np.ndarray],
    dtype: str = "float64",
    buffer_bytes: int | None = None,
    weights_resident: bool = False,
    count: bool = True,
) -> FusedResult:
    """Run ``mapping`` on ``inputs``; return the cascade outputs and the bytes the kernels counted.

    ``buffer_bytes`` is the on-chip capacity (None: unbounded), deciding which boundary inputs of a
    tiled group stay resident (see :func:`clear_levels`). ``count=False`` skips the load/store
    marking (timing runs); the traffic is then reported as 0.
    """
    if dtype not in ("float64", "float32"):
        raise MambalayaError(f"the fused executor runs float64 or float32, not {dtype}")
    if buffer_bytes is not None and buffer_bytes <= 0:
        raise MambalayaError(f"buffer_bytes must be positive, got {buffer_bytes}")
    vkey = (id(cascade), id(mapping))
    seen = _VALID.get(vkey)
    if seen is None or seen[0] is not cascade or seen[1] is not mapping:  # validated once per pair
        mapping.validate(cascade)
        if len(_VALID) > 256:
            _VALID.clear()
        _VALID[vkey] = (cascade, mapping)
    np_dtype = np.dtype(dtype)
    env = prepare_inputs(cascade, inputs, np_dtype)
    compile_s = run_s = 0.0
    by_tensor: dict[str, dict[str, int]] = {}
    per_group: list[int] = []
    per_group_s: list[float] = []
    shared: dict[str, np.ndarray] = {}  # weights' bitmaps on a weights_resident arch: loaded once per run
    for gi in range(len(mapping.groups)):
        t0 = time.perf_counter()
        plan, kernel, _ = group_kernel(cascade, mapping, gi, dtype)
        args = [env[t] for t in plan.reads]
        for t in plan.writes:
            env[t] = np.empty(cascade.shape(t), dtype=np_dtype)
            args.append(env[t])
        args += [env[t] for t in plan.aux]
        marks = []
        for t in plan.params:
            if count and weights_resident and cascade.tensors[t].role == "weight":
                marks.append(shared.setdefault(t, np.zeros(cascade.shape(t), dtype=np.uint8)))
            else:
                marks.append(np.zeros(cascade.shape(t) if count else (1,) * len(cascade.shape(t)), dtype=np.uint8))
        if count and buffer_bytes is not None:
            clr = clear_levels(cascade, mapping.groups[gi], plan, buffer_bytes, weights_resident)
        else:  # unbounded: every input stays on chip; uncounted: the levels are never read
            clr = np.full(len(plan.params), -1, dtype=np.int64)
        tc = new_counter(len(plan.params))
        call = (*args, *marks, clr, tc, count)
        fresh = not kernel.signatures
        t1 = time.perf_counter()
        if fresh:  # first call compiles (or loads Numba's disk cache): time it as compile, then rerun
            with warnings.catch_warnings():  # np.dot on strided views: numba copies them, by design
                warnings.simplefilter("ignore", NumbaPerformanceWarning)
                kernel.compile(tuple(kernel.typeof_pyval(a) for a in call))
            t2 = time.perf_counter()
            compile_s += t2 - t0
            t1 = t2
        else:
            compile_s += t1 - t0
        with blas_single_thread():
            kernel(*call)
        per_group_s.append(time.perf_counter() - t1)
        run_s += per_group_s[-1]
        per_group.append(counted_bytes(cascade, plan.params, tc, by_tensor))
    outputs = {n: env[n] for n in cascade.outputs()}
    return FusedResult(outputs, sum(per_group), by_tensor, compile_s, run_s, per_group, per_group_s)


def verify(
    cascade: Cascade,
    mapping: Mapping,
    seed: int = 0,
    dtype: str = "float64",
    buffer_bytes: int | None = None,
    weights_resident: bool = False,
) -> dict[str, Any]:
    """Run ``mapping`` and the reference on the same random inputs; compare every cascade output."""
    inputs = random_inputs(cascade, seed)
    ref = run_reference(cascade, inputs, dtype, keep="outputs")
    res = run_fused(cascade, mapping, inputs, dtype, buffer_bytes, weights_resident)
    rtol = 1e-10 if dtype == "float64" else 1e-4
    max_abs = max_rel = 0.0
    worst = None
    for name, want in ref.items():
        got = res.outputs[name]
        want = np.asarray(want, dtype=np.float64)
        got = np.asarray(got, dtype=np.float64)
        same = (got == want) | (np.isnan(got) & np.isnan(want))  # equal infinities and NaNs agree
        with np.errstate(invalid="ignore"):
            diff = np.where(same, 0.0, np.abs(got - want))
        if diff.size:
            err = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)))
            scale = max(float(np.max(np.abs(np.where(np.isfinite(want), want, 0.0)))), 1.0)
            if err > max_abs:
                max_abs = err
            if err / scale > max_rel:
                max_rel, worst = err / scale, name
    return {
        "ok": bool(max_rel <= rtol),
        "max_abs_err": max_abs,
        "max_rel_err": max_rel,
        "worst_tensor": worst,
        "traffic_counted_bytes": res.traffic_bytes,
        "traffic_by_tensor": res.traffic_by_tensor,
        "compile_s": res.compile_s,
        "run_s": res.run_s,
    }
