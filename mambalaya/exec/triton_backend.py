"""The GPU backend: one generated Triton kernel per fusion group, timed per group.

``run_triton`` lowers every group of a mapping with
:mod:`mambalaya.exec.triton_codegen`, writes each kernel's source to a
hash-named module in the kernel cache directory (Triton's ``@jit`` reads real
source), imports it and launches it on torch tensors: CUDA when available,
else Triton's interpreter (``TRITON_INTERPRET=1`` must be set before triton is
first imported) on CPU tensors, which is how the tests run without a GPU.

A group the code generator cannot express is never skipped silently: it runs
through the **fallback path** (the reference interpreter's evaluation of the
group's Einsums, on the host, with the boundary tensors copied over), and the
result lists it under ``fallbacks`` with the reason. ``verify_triton`` compares
with :func:`mambalaya.exec.reference.run_reference` at a tolerance stated per
precision (:data:`TOLERANCES`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mambalaya.errors import MambalayaError
from mambalaya.exec.fused import _prepare_inputs, kernel_cache_dir
from mambalaya.exec.reference import _Evaluator, random_inputs, run_reference
from mambalaya.exec.triton_codegen import PRECISIONS, TritonGroupPlan, Unsupported, group_plan, group_source
from mambalaya.fileio import write_atomic
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import Mapping

#: Max relative error (to each output's largest magnitude) that ``verify_triton`` accepts, per
#: (dtype, matmul precision): fp32 summation order differs from numpy's; tf32 keeps 10 mantissa
#: bits and bf16 7 in the matrix products (fp32 accumulation in both).
TOLERANCES = {
    ("float64", "fp32"): 1e-9,
    ("float32", "fp32"): 1e-4,
    ("float32", "tf32"): 2e-2,
    ("float32", "bf16"): 6e-2,
}


@dataclass
class GroupRun:
    """What happened to one group: Triton kernel or fallback, and its time."""

    index: int
    einsums: tuple[str, ...]
    backend: str  # "triton" or "fallback-reference"
    reason: str = ""  # why it fell back
    grid: tuple[tuple[str, int, int], ...] = ()
    programs: int = 1
    dot_einsums: tuple[str, ...] = ()
    inline: tuple[str, ...] = ()
    scratch: tuple[str, ...] = ()
    source_path: str = ""
    time_s: float = 0.0  # median over ``repeat`` launches (CUDA events on a GPU)
    times_s: list[float] = field(default_factory=list)


@dataclass
class TritonResult:
    outputs: dict[str, np.ndarray]
    groups: list[GroupRun]
    device: str
    compile_s: float = 0.0

    @property
    def per_group_s(self) -> list[float]:
        return [g.time_s for g in self.groups]

    @property
    def total_s(self) -> float:
        return sum(self.per_group_s)

    @property
    def fallbacks(self) -> list[tuple[int, str]]:
        return [(g.index, g.reason) for g in self.groups if g.backend != "triton"]


def source_path(source: str) -> Path:
    """Where generated source lives: the kernel cache directory, named by the source's hash."""
    return kernel_cache_dir() / f"mambalaya_triton_{hashlib.sha256(source.encode()).hexdigest()[:24]}.py"


def _import_source(source: str) -> Any:
    """Import generated source from a hash-named file (Triton's jit needs the real source text)."""
    path = source_path(source)
    name = path.stem
    if name in sys.modules:
        return sys.modules[name]
    if not path.exists() or path.read_text() != source:
        write_atomic(path, source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def triton_available() -> tuple[bool, str]:
    """Whether triton imports and can run here (a CUDA GPU, or the interpreter on CPU)."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as err:
        return False, f"triton/torch not importable: {err}"
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return True, ""
    return False, "no CUDA GPU and TRITON_INTERPRET=1 not set before importing triton"


def compile_group(cascade: Cascade, mapping: Mapping, gi: int, dtype: str = "float32",
                  matmul_precision: str = "fp32") -> tuple[TritonGroupPlan, Any | None, str]:
    """(plan, kernel or None, fallback reason) of one group."""
    plan = group_plan(cascade, mapping, gi)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    try:
        plan.source = group_source(cascade, mapping, plan, dtype, matmul_precision, interpret)
    except Unsupported as err:
        return plan, None, f"not expressible in the Triton generator: {err}"
    return plan, _import_source(plan.source).kernel, ""


def _fallback(cascade: Cascade, names: tuple[str, ...], env: dict[str, Any], np_dtype: np.dtype) -> dict:
    """The labelled fallback: the reference interpreter evaluates the group's Einsums on the host."""
    host = {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else v) for k, v in env.items()}
    ev = _Evaluator(cascade, host, np_dtype)
    return {n: host.setdefault(n, ev.einsum(cascade.einsum(n))) for n in names}


def run_triton(
    cascade: Cascade,
    mapping: Mapping,
    inputs: dict[str, np.ndarray],
    dtype: str = "float32",
    matmul_precision: str = "fp32",
    device: str | None = None,
    repeat: int = 1,
    warmup: int = 0,
) -> TritonResult:
    """Run ``mapping`` with one Triton kernel per group; outputs as numpy, per-group times, fallbacks.

    ``repeat``/``warmup``: launches per group for timing (the median is kept); the outputs are those
    of the last launch (every kernel is idempotent: it overwrites what it writes).
    """
    ok, why = triton_available()
    if not ok:
        raise MambalayaError(f"the Triton backend cannot run: {why}")
    import torch

    if dtype not in ("float32", "float64"):
        raise MambalayaError(f"the Triton backend runs float32 or float64, not {dtype}")
    if matmul_precision not in PRECISIONS:
        raise MambalayaError(f"matmul_precision must be one of {', '.join(PRECISIONS)}")
    mapping.validate(cascade)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    np_dtype = np.dtype(dtype)
    tdt = torch.float64 if dtype == "float64" else torch.float32
    env: dict[str, Any] = {k: torch.from_numpy(v).to(dev) for k, v in _prepare_inputs(cascade, inputs, np_dtype).items()}
    runs: list[GroupRun] = []
    compile_s = 0.0
    for gi in range(len(mapping.groups)):
        t0 = time.perf_counter()
        plan, kernel, reason = compile_group(cascade, mapping, gi, dtype, matmul_precision)
        run = GroupRun(gi, plan.einsums, "triton" if kernel else "fallback-reference", reason, plan.grid,
                       plan.programs, plan.dot_einsums, plan.inline, plan.scratch)
        if kernel is None:
            t1 = time.perf_counter()
            for name, arr in _fallback(cascade, plan.einsums, env, np_dtype).items():
                env[name] = torch.from_numpy(np.array(arr, copy=True)).to(dev)
            run.time_s = time.perf_counter() - t1
            run.times_s = [run.time_s]
            compile_s += t1 - t0
            runs.append(run)
            continue
        run.source_path = str(source_path(plan.source))
        for t in (*plan.writes, *plan.scratch):
            env[t] = torch.empty(cascade.shape(t), dtype=tdt, device=dev)
        args = [env[t] for t in plan.params]
        grid = (plan.programs,)
        kernel[grid](*args)  # first launch compiles
        if cuda:
            torch.cuda.synchronize()
        compile_s += time.perf_counter() - t0
        for _ in range(warmup):
            kernel[grid](*args)
        times = []
        for _ in range(max(1, repeat)):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                kernel[grid](*args)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t1 = time.perf_counter()
                kernel[grid](*args)
                times.append(time.perf_counter() - t1)
        run.times_s = times
        run.time_s = statistics.median(times)
        for t in plan.scratch:
            del env[t]
        runs.append(run)
    outputs = {n: env[n].detach().cpu().numpy() for n in cascade.outputs()}
    return TritonResult(outputs, runs, str(dev), compile_s)


def compare(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> tuple[float, float, str | None]:
    """(max abs error, max error relative to each tensor's largest finite magnitude, worst tensor)."""
    max_abs = max_rel = 0.0
    worst = None
    for name, want in ref.items():
        want = np.asarray(want, dtype=np.float64)
        have = np.asarray(got[name], dtype=np.float64)
        same = (have == want) | (np.isnan(have) & np.isnan(want))
        with np.errstate(invalid="ignore"):
            diff = np.where(same, 0.0, np.abs(have - want))
        if not diff.size:
            continue
        err = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)))
        scale = max(float(np.max(np.abs(np.where(np.isfinite(want), want, 0.0)))), 1.0)
        max_abs = max(max_abs, err)
        if err / scale > max_rel:
            max_rel, worst = err / scale, name
    return max_abs, max_rel, worst


def verify_triton(
    cascade: Cascade,
    mapping: Mapping,
    seed: int = 0,
    dtype: str = "float32",
    matmul_precision: str = "fp32",
    device: str | None = None,
) -> dict[str, Any]:
    """Run ``mapping`` through Triton and the reference (same dtype) on random inputs; compare outputs."""
    inputs = random_inputs(cascade, seed)
    ref = run_reference(cascade, inputs, dtype, keep="outputs")
    res = run_triton(cascade, mapping, inputs, dtype, matmul_precision, device)
    max_abs, max_rel, worst = compare(ref, res.outputs)
    tol = TOLERANCES[(dtype, matmul_precision)] if (dtype, matmul_precision) in TOLERANCES else 1e-4
    return {
        "ok": bool(max_rel <= tol),
        "max_abs_err": max_abs,
        "max_rel_err": max_rel,
        "tolerance": tol,
        "worst_tensor": worst,
        "device": res.device,
        "fallbacks": [{"group": i, "reason": r} for i, r in res.fallbacks],
        "groups": [{"einsums": list(g.einsums), "backend": g.backend, "grid": [list(x) for x in g.grid],
                    "dot": list(g.dot_einsums), "time_s": g.time_s} for g in res.groups],
        "compile_s": res.compile_s,
    }


__all__ = ["TOLERANCES", "GroupRun", "TritonResult", "compare", "compile_group", "run_triton", "triton_available",
           "verify_triton"]
