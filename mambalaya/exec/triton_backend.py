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
from typing import Any, NamedTuple

import numpy as np

from mambalaya.errors import MambalayaError
from mambalaya.exec.fused import kernel_cache_dir
from mambalaya.exec.reference import _Evaluator, prepare_inputs, random_inputs, run_reference
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
    launch: dict = field(default_factory=dict)  # the tile configuration kept (autotuned on a GPU)
    scan: tuple[str, ...] = ()
    inline: tuple[str, ...] = ()
    scratch: tuple[str, ...] = ()
    variant: dict = field(default_factory=dict)  # generator choices kept: operands swapped, scan chunk
    tuned: list = field(default_factory=list)  # every choice the autotuner tried: (config, seconds or None)
    source_path: str = ""
    time_s: float = 0.0  # median over ``repeat`` launches (CUDA events on a GPU)
    times_s: list[float] = field(default_factory=list)


@dataclass
class TritonResult:
    outputs: dict[str, np.ndarray]
    groups: list[GroupRun]
    device: str
    compile_s: float = 0.0
    #: whole layer on a GPU: every group's kernel launched back to back from Python (eager), and the same
    #: sequence captured once in a CUDA graph and replayed (what a deployed fused layer does); medians
    layer_eager_s: float | None = None
    layer_graph_s: float | None = None

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


class DotConfig(NamedTuple):
    """A tl.dot group's tiles and launch, one point of the GPU autotuner's space."""

    cap: int  # M/N block cap
    bk: int  # K step
    warps: int
    stages: int  # the kernel's num_stages: pipelines the loads that feed tl.dot
    swap: bool = False  # out^T = B^T A^T: the operands' roles exchanged


class PointConfig(NamedTuple):
    """An element-wise or reduction group's block: outputs per program, and warps."""

    elems: int
    warps: int


class ScanConfig(NamedTuple):
    """A chunked scan: steps scanned at once, steps x state elements per program, warps."""

    steps: int
    elems: int
    warps: int


#: tl.dot tile configurations tried per group on a GPU. The first is the interpreter's (and the default
#: without autotuning). Which way round suits Hopper's tf32 wgmma (operands K-major in shared memory)
#: depends on which operand is loaded and which computed in registers, so both are timed.
DOT_CONFIGS = (DotConfig(64, 32, 4, 3), DotConfig(128, 32, 8, 3), DotConfig(128, 64, 8, 3), DotConfig(64, 64, 4, 4),
               DotConfig(64, 32, 4, 3, swap=True), DotConfig(128, 32, 8, 3, swap=True),
               DotConfig(128, 64, 8, 3, swap=True))
#: Element-wise, reduction and scan groups: outputs per program tried on a GPU (with num_warps). Fewer
#: outputs per program means more programs: a group with a short grid (a per-chunk cumsum, a scan over
#: channels) needs them to fill 132 SMs, a wide streaming group is best with large blocks.
POINT_CONFIGS = (PointConfig(4096, 4), PointConfig(1024, 4), PointConfig(256, 4), PointConfig(64, 2))
#: Chunked-scan groups. Each program walks the whole sequence; longer chunks mean fewer dependent steps
#: of the carried state, fewer state elements per program more programs (channels are all the
#: parallelism a scan has), one warp keeps the scanned axis inside each thread (no shared-memory steps).
SCAN_CONFIGS = (ScanConfig(16, 2048, 4), ScanConfig(16, 256, 1), ScanConfig(8, 128, 1), ScanConfig(32, 512, 1))


def compile_group(cascade: Cascade, mapping: Mapping, gi: int, dtype: str = "float32",
                  matmul_precision: str = "fp32", config: DotConfig = DOT_CONFIGS[0],
                  point: PointConfig | None = None,
                  scan: ScanConfig | None = None) -> tuple[TritonGroupPlan, Any | None, str]:
    """(plan, kernel or None, fallback reason) of one group with one tile configuration.

    ``config`` sets the tl.dot tiles and launch of a group with contractions; ``point`` the blocks of a
    group without, ``scan`` a chunked scan's (default: the generator's own choice)."""
    if scan is not None:
        scan = ScanConfig(*scan)
        plan = group_plan(cascade, mapping, gi, scan_steps=scan.steps, scan_elems=scan.elems)
        plan.launch = {"num_warps": scan.warps}
    elif point is None:
        config = DotConfig(*config)
        plan = group_plan(cascade, mapping, gi, dot_cap=config.cap, dot_bk=config.bk, dot_swap=config.swap)
        plan.launch = {"num_warps": config.warps, "num_stages": config.stages}
    else:
        point = PointConfig(*point)
        plan = group_plan(cascade, mapping, gi, elems=point.elems)
        plan.launch = {"num_warps": point.warps}
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


# exp overflowing to inf (silu, softplus of large arguments) is IEEE arithmetic the GPU does silently; under
# the interpreter numpy would warn about it on every launch
@np.errstate(over="ignore", under="ignore")
def run_triton(
    cascade: Cascade,
    mapping: Mapping,
    inputs: dict[str, np.ndarray],
    dtype: str = "float32",
    matmul_precision: str = "fp32",
    device: str | None = None,
    repeat: int = 1,
    warmup: int = 0,
    autotune: bool | None = None,
    layer_repeat: int = 0,
    point: PointConfig | None = None,
    config: DotConfig | None = None,
    scan: ScanConfig | None = None,
) -> TritonResult:
    """Run ``mapping`` with one Triton kernel per group; outputs as numpy, per-group times, fallbacks.

    ``repeat``/``warmup``: launches per group for timing (the median is kept); the outputs are those
    of the last launch (every kernel is idempotent: it overwrites what it writes). ``autotune`` (default:
    on a GPU) compiles each group in every choice of its menu (:data:`SCAN_CONFIGS` for a fused scan,
    :data:`DOT_CONFIGS` with tl.dot, :data:`POINT_CONFIGS` otherwise), keeps the fastest and records
    every timing in ``GroupRun.tuned``. ``layer_repeat`` > 0 on a GPU also
    times the whole layer eager and as a CUDA graph. Instead of autotuning, ``config`` fixes the tiles
    of groups with contractions (one of :data:`DOT_CONFIGS`), ``scan`` the chunking of scan groups (one
    of :data:`SCAN_CONFIGS`), ``point`` the blocks of the other groups and of scans without ``scan``
    (one of :data:`POINT_CONFIGS`).
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
    env: dict[str, Any] = {k: torch.from_numpy(v).to(dev) for k, v in prepare_inputs(cascade, inputs, np_dtype).items()}
    runs: list[GroupRun] = []
    launches: list[tuple[Any, tuple, list, dict]] = []
    compile_s = 0.0
    tune = cuda if autotune is None else autotune  # explicit under the interpreter too (wall-clock times)

    def timings(kernel: Any, grid: tuple, args: list, kw: dict, repeat: int) -> list[float]:
        """Seconds of each of ``repeat`` launches: GPU time from CUDA-graph replays, else wall time."""
        if cuda:
            return kernel_times_s(torch, lambda: kernel[grid](*args, **kw), repeat)
        ts = []
        for _ in range(repeat):
            t1 = time.perf_counter()
            kernel[grid](*args, **kw)
            ts.append(time.perf_counter() - t1)
        return ts

    for gi in range(len(mapping.groups)):
        t0 = time.perf_counter()
        plan, kernel, reason = compile_group(cascade, mapping, gi, dtype, matmul_precision, config or DOT_CONFIGS[0])
        fixed: dict[str, Any] = {}
        tried: list[tuple[tuple, float | None]] = []  # (configuration, seconds or None: failed) per choice
        if kernel is not None:
            if plan.scan and scan:
                fixed = {"scan": scan}
            elif _has_dot(plan) and not plan.scan:
                fixed = {"config": config} if config else {}
            elif point:
                fixed = {"point": point}
        if fixed:
            plan, kernel, reason = compile_group(cascade, mapping, gi, dtype, matmul_precision, **fixed)
        elif kernel is not None and tune:
            best = None
            # a scan's chunking matters more than its tl.dot tiles
            kind, menu = (("scan", SCAN_CONFIGS) if plan.scan else ("config", DOT_CONFIGS) if _has_dot(plan)
                          else ("point", POINT_CONFIGS))
            for cfg in menu:
                p2, k2, _ = compile_group(cascade, mapping, gi, dtype, matmul_precision, **{kind: cfg})
                for t in (*p2.writes, *p2.scratch):
                    if t not in env or tuple(env[t].shape) != cascade.shape(t):
                        env[t] = torch.empty(cascade.shape(t), dtype=tdt, device=dev)
                a2 = [env[t] for t in p2.params]
                kw2 = p2.launch if cuda else {}
                try:
                    k2[(p2.programs,)](*a2, **kw2)
                    if cuda:
                        torch.cuda.synchronize()
                    tt = statistics.median(timings(k2, (p2.programs,), a2, kw2, 3))
                except Exception:  # noqa: BLE001 - a configuration that does not fit (shared memory) is skipped
                    tried.append((cfg, None))
                    continue
                tried.append((cfg, tt))
                if best is None or tt < best[0]:
                    best = (tt, p2, k2)
            if best is not None:
                plan, kernel = best[1], best[2]
        run = GroupRun(gi, plan.einsums, "triton" if kernel else "fallback-reference", reason, plan.grid,
                       plan.programs, plan.dot_einsums, plan.launch, plan.scan, plan.inline, plan.scratch,
                       variant=_variant(plan), tuned=tried)
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
        kw = dict(plan.launch) if cuda else {}
        kernel[grid](*args, **kw)  # first launch compiles
        if cuda:
            torch.cuda.synchronize()
        compile_s += time.perf_counter() - t0
        for _ in range(warmup):
            kernel[grid](*args, **kw)
        times = timings(kernel, grid, args, kw, max(1, repeat))
        run.times_s = times
        run.time_s = statistics.median(times)
        launches.append((kernel, grid, args, kw))
        for t in plan.scratch:
            del env[t]
        runs.append(run)
    outputs = {n: env[n].detach().cpu().numpy() for n in cascade.outputs()}
    res = TritonResult(outputs, runs, str(dev), compile_s)
    if cuda and layer_repeat > 0 and not res.fallbacks:
        res.layer_eager_s, res.layer_graph_s = _layer_times(torch, launches, layer_repeat)
    return res


def _variant(plan: TritonGroupPlan) -> dict:
    """The generator's choices for this kernel beyond its launch options (what the autotuner kept)."""
    out: dict[str, Any] = {"swapped": plan.dot_swap} if plan.dot_einsums else {}
    if plan.scan:
        out.update(scan_steps=plan.scan_steps, scan_elems=plan.scan_elems)
    return out


def _has_dot(plan: TritonGroupPlan) -> bool:
    return "tl.dot(" in plan.source


def _layer_times(torch: Any, launches: list, repeat: int) -> tuple[float, float]:
    """Medians of the whole kernel sequence: launched from Python back to back, and replayed as a CUDA graph."""
    def seq() -> None:
        for kernel, grid, args, kw in launches:
            kernel[grid](*args, **kw)

    return sequence_times(torch, seq, repeat)


def cuda_times_s(torch: Any, fn: Any, repeat: int) -> list[float]:
    """Seconds of each of ``repeat`` calls of ``fn()``, timed with CUDA events."""
    ts = []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return ts


def cuda_median_s(torch: Any, fn: Any, repeat: int) -> float:
    """Median seconds of ``fn()`` over ``repeat`` calls, timed with CUDA events."""
    return statistics.median(cuda_times_s(torch, fn, repeat))


def capture_graph(torch: Any, seq: Any) -> Any:
    """``seq()`` captured once as a CUDA graph (warmed up on a side stream, as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        seq()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seq()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def graph_median_s(torch: Any, seq: Any, repeat: int) -> float:
    """Median seconds of one replay of ``seq()`` captured as a CUDA graph: GPU time, no Python launch cost."""
    return cuda_median_s(torch, capture_graph(torch, seq).replay, repeat)


def kernel_times_s(torch: Any, launch: Any, repeat: int, per: int = 4) -> list[float]:
    """Seconds of one ``launch()``, ``repeat`` times: ``per`` launches captured in one CUDA graph, each
    replay timed and divided by ``per`` (an event pair around one eager launch would add the ~20 us
    Python launch cost to every kernel, however small)."""
    graph = capture_graph(torch, lambda: [launch() for _ in range(per)])
    return [t / per for t in cuda_times_s(torch, graph.replay, repeat)]


def sequence_times(torch: Any, seq: Any, repeat: int) -> tuple[float, float]:
    """Median seconds of a launch sequence ``seq()``: eager from Python, and replayed as a captured CUDA graph."""
    seq()
    torch.cuda.synchronize()
    return cuda_median_s(torch, seq, repeat), graph_median_s(torch, seq, repeat)


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
