"""The ``triton`` backend: one generated Triton kernel per group of a schedule, counted as it runs.

Each group is printed by :mod:`mambalaya.exec.triton_codegen`, written to a module named by its
source's hash in the kernel cache directory (Triton's ``@jit`` reads real source) and launched on
torch tensors: on a CUDA GPU, or under Triton's interpreter (``TRITON_INTERPRET=1`` set before triton
is first imported) on CPU tensors, which is how the tests run without a GPU. A group's grid is its
schedule's program grid; its buffers live in a scratch arena, one slice per program (launched in
waves when the whole grid's slices would not fit :data:`SCRATCH_BYTES`).

Every run makes one counting launch per group (``COUNT``: each load and store adds the elements it
moved), so the bytes reported are what the kernels moved; timed launches (``repeat``) do not count.
A group the printer cannot express runs on the labelled **fallback** (the reference interpreter
evaluates its Einsums on the host) and counts nothing, so its traffic cannot match the prediction.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mambalaya.errors import MambalayaError
from mambalaya.exec.backend import RunResult, register
from mambalaya.exec.numba_backend import load_module
from mambalaya.exec.reference import Evaluator, prepare_inputs
from mambalaya.exec.triton_codegen import PRECISIONS, TritonKernel, TritonOptions, Unsupported, group_kernel_source
from mambalaya.ir.cascade import Cascade
from mambalaya.schedule import GroupSchedule, Schedule

#: Max relative error (to each output's largest magnitude) that verify accepts, per (dtype, matmul
#: precision): fp32 summation order differs from numpy's; tf32 keeps 10 mantissa bits and bf16 7 in the
#: matrix products (fp32 accumulation in both).
TOLERANCES = {
    ("float64", "fp32"): 1e-9,
    ("float32", "fp32"): 1e-4,
    ("float32", "tf32"): 2e-2,
    ("float32", "bf16"): 6e-2,
}
#: Most bytes of scratch arena one launch gets (a larger grid runs in waves that reuse it).
SCRATCH_BYTES = 1 << 30
#: Most bytes of weights a program keeps on the device between runs (:func:`device_inputs`); the least recently
#: used go first. A generator runs each layer's cascade once a token with the same weight arrays (a 130m model's
#: 24 layers and LM head: about 0.5 GB a token over PCIe if sent again).
RESIDENT_BYTES = 8 << 30


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


@dataclass
class GroupKernel:
    """One group compiled: its kernel (None: it runs on the fallback, for ``reason``) and launch facts."""

    group: GroupSchedule
    kernel: Any = None
    printed: TritonKernel | None = None
    reason: str = ""
    source_path: str = ""


@dataclass
class TritonProgram:
    cascade: Cascade
    schedule: Schedule
    dtype: str
    options: TritonOptions
    groups: list[GroupKernel] = field(default_factory=list)
    #: weights kept on the device: id of the array given -> (that array, its device tensor), most recent last
    resident: OrderedDict = field(default_factory=OrderedDict, repr=False)
    #: uncounted runs' scratch per (group, device): (arena, counters), allocated once and reused
    scratch: dict = field(default_factory=dict, repr=False)


def compile_group(cascade: Cascade, g: GroupSchedule, dtype: str, options: TritonOptions) -> GroupKernel:
    """Print and import one group's kernel (or record why it falls back)."""
    try:
        printed = group_kernel_source(cascade, g, dtype, options)
    except Unsupported as err:
        return GroupKernel(g, reason=f"not expressible in Triton: {err}")
    mod = load_module(printed.source, "mambalaya_triton")
    return GroupKernel(g, mod.kernel, printed, source_path=str(mod.__file__))


def _fallback(cascade: Cascade, g: GroupSchedule, env: dict[str, Any], np_dtype: np.dtype) -> dict[str, np.ndarray]:
    """The labelled fallback: the reference interpreter evaluates the group's Einsums on the host."""
    host = {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else v) for k, v in env.items()}
    ev = Evaluator(cascade, host, np_dtype)
    for n in g.members:
        host[n] = ev.einsum(cascade.einsum(n))
    return {n: host[n] for n in g.writes}


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
    """Seconds of one ``launch()``, ``repeat`` times: ``per`` launches captured in one CUDA graph, each replay
    timed and divided by ``per`` (an event pair around one eager launch adds the Python launch cost)."""
    graph = capture_graph(torch, lambda: [launch() for _ in range(per)])
    return [t / per for t in cuda_times_s(torch, graph.replay, repeat)]


def sequence_times(torch: Any, seq: Any, repeat: int) -> tuple[float, float]:
    """Median seconds of a launch sequence ``seq()``: eager from Python, and replayed as a captured CUDA graph."""
    seq()
    torch.cuda.synchronize()
    return cuda_median_s(torch, seq, repeat), graph_median_s(torch, seq, repeat)


def device_of(device: str | None = None) -> Any:
    """The torch device a run uses: ``device``, else the current CUDA device, else the CPU (the interpreter)."""
    import torch

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None:
        # (a tensor on it says cuda:N, and torch.device("cuda") != torch.device("cuda:0"): unindexed, no resident
        # weight ever matched and every run sent them all again, the LM head's 154 MB at every token)
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def device_inputs(program: TritonProgram, inputs: dict[str, Any], dev: Any) -> dict[str, Any]:
    """Every input as a tensor on ``dev``; a weight given as the very array of an earlier run is not sent again
    (weights are read-only: an array changed in place between runs must be passed as a new array), and a tensor
    already on ``dev`` (of the cascade's shape and the program's dtype) is used as it is, not copied: a decode
    loop keeps its states there, and a CUDA graph of its launches reads them at fixed addresses."""
    import torch

    c = program.cascade
    out: dict[str, Any] = {}
    tdt = torch.float64 if program.dtype == "float64" else torch.float32
    for name, t in inputs.items():
        if isinstance(t, torch.Tensor):
            if t.device != dev or t.dtype != tdt or tuple(t.shape) != c.shape(name) or not t.is_contiguous():
                raise MambalayaError(f"input tensor {name}: a {tuple(t.shape)} {t.dtype} tensor on {t.device}, the "
                                     f"program needs a contiguous {c.shape(name)} {tdt} tensor on {dev}")
            out[name] = t
    host = {k: v for k, v in inputs.items() if k not in out}
    for name, arr in prepare_inputs(c, host, np.dtype(program.dtype), given=out.keys()).items():
        given = inputs.get(name)
        if given is None or c.tensors[name].role != "weight":
            out[name] = torch.from_numpy(arr).to(dev)
            continue
        held = program.resident.get(id(given))
        if held is not None and held[0] is given and held[1].device == dev:
            program.resident.move_to_end(id(given))
            out[name] = held[1]
            continue
        out[name] = torch.from_numpy(arr).to(dev)
        program.resident[id(given)] = (given, out[name])
        total = sum(t.numel() * t.element_size() for _, t in program.resident.values())
        while total > RESIDENT_BYTES and len(program.resident) > 1:
            _, (_, old) = program.resident.popitem(last=False)
            total -= old.numel() * old.element_size()
    return out


# exp overflowing to inf (silu, softplus of large arguments) is IEEE arithmetic the GPU does silently; under
# the interpreter numpy would warn about it on every launch
@np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore")
def run_program(program: TritonProgram, inputs: dict[str, Any], repeat: int = 0, warmup: int = 0,
                layer_repeat: int = 0, device: str | None = None, count: bool = True, to_host: bool = True) -> RunResult:
    """Run every group once counting its moves; ``repeat`` > 0 also times each group's uncounted launches
    (median, CUDA graph replays on a GPU), ``layer_repeat`` > 0 the whole layer eager and as a CUDA graph.
    ``inputs`` are arrays, or tensors already on the device (:func:`device_inputs`); with ``to_host`` False the
    outputs stay there as tensors (no copy, no wait: a decode loop's launches can then be captured).

    ``count=False`` runs the kernels without counting (no moves in the result): no atomics, no wait for the
    counters after each group, and each group's scratch arena is allocated once per program and reused (a
    counted run starts from a fresh arena of NaN, so a read of what no statement wrote shows). Generation runs
    this way after its counted warm-up: a token must not wait on the device once per group."""
    import torch

    c, dtype = program.cascade, program.dtype
    dev = device_of(device)
    cuda = dev.type == "cuda"
    np_dtype = np.dtype(dtype)
    tdt = torch.float64 if dtype == "float64" else torch.float32
    env: dict[str, Any] = device_inputs(program, inputs, dev)
    moved: dict[str, dict[str, int]] = {}
    times: list[float] = []
    runs: list[dict] = []
    launches = []
    for gk in program.groups:
        g = gk.group
        if gk.kernel is None:
            t0 = time.perf_counter()
            for name, arr in _fallback(c, g, env, np_dtype).items():
                env[name] = torch.from_numpy(np.array(arr, copy=True)).to(dev)
            times.append(time.perf_counter() - t0)
            runs.append({"group": g.index, "backend": "fallback-reference", "reason": gk.reason})
            continue
        for t in g.writes:
            if t not in env:
                env[t] = torch.empty(c.shape(t), dtype=tdt, device=dev)
        pk = gk.printed
        assert pk is not None
        per = max(1, SCRATCH_BYTES // (pk.arena * np_dtype.itemsize))
        wave = min(pk.programs, per)
        held = None if count else program.scratch.get((g.index, str(dev)))
        if held is None:
            # NaN until a statement writes it: a compute reading what no statement put on chip shows in the outputs
            held = (torch.full((wave * pk.arena,), float("nan"), dtype=tdt, device=dev),
                    torch.zeros(2 * len(pk.params), dtype=torch.int64, device=dev))
            if not count:
                program.scratch[(g.index, str(dev))] = held
        arena, tc = held
        args = [env[t] for t in pk.params]
        kw = {"num_warps": pk.num_warps} if cuda else {}

        def launch(count: bool, kernel=gk.kernel, args=args, arena=arena, tc=tc, wave=wave, n=pk.programs, kw=kw):
            for p0 in range(0, n, wave):
                kernel[(min(wave, n - p0),)](*args, arena, tc, p0, COUNT=count, **kw)

        launch(count)
        if count:
            counts = tc.cpu().numpy()
            for i, t in enumerate(pk.params):
                eb = c.tensors[t].element_bytes
                slot = moved.setdefault(t, {"read": 0, "write": 0})
                slot["read"] += int(counts[2 * i]) * eb
                slot["write"] += int(counts[2 * i + 1]) * eb
        run = {"group": g.index, "backend": "triton", "programs": pk.programs, "waves": -(-pk.programs // wave),
               "arena_elements": pk.arena, "dots": pk.dots, "source_path": gk.source_path}
        if repeat > 0:
            for _ in range(warmup):
                launch(False)
            if cuda:
                launch(False)
                ts = kernel_times_s(torch, lambda launch=launch: launch(False), repeat)
            else:
                ts = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    launch(False)
                    ts.append(time.perf_counter() - t0)
            run["times_s"] = ts
            times.append(statistics.median(ts))
        else:
            times.append(0.0)
        launches.append(launch)
        runs.append(run)
    extra: dict[str, Any] = {"device": str(dev), "groups": runs}
    if cuda and layer_repeat > 0 and all(gk.kernel is not None for gk in program.groups):
        def seq() -> None:
            for launch in launches:
                launch(False)

        extra["layer_eager_s"], extra["layer_graph_s"] = sequence_times(torch, seq, layer_repeat)
    outputs = {n: env[n].detach().cpu().numpy() if to_host else env[n] for n in c.outputs()}
    fallbacks = [(gk.group.index, gk.reason) for gk in program.groups if gk.kernel is None]
    return RunResult(outputs, moved, times, 0.0, fallbacks, extra)


class TritonBackend:
    name = "triton"
    description = "GPU: one generated Triton kernel per group (TRITON_INTERPRET=1 runs it on the CPU)"

    def available(self) -> str | None:
        ok, why = triton_available()
        return None if ok else why

    def supports(self, cascade: Cascade, group: GroupSchedule) -> str | None:
        try:
            group_kernel_source(cascade, group, "float32")
        except Unsupported as err:
            return str(err)
        return None

    def tolerance(self, dtype: str, matmul_precision: str = "fp32", **_: Any) -> float:
        return TOLERANCES.get((dtype, matmul_precision), 1e-4)

    def compile(self, cascade: Cascade, schedule: Schedule, dtype: str, matmul_precision: str = "fp32",
                **options: Any) -> TritonProgram:
        if dtype not in ("float32", "float64"):
            raise MambalayaError(f"the triton backend runs float32 or float64, not {dtype}")
        if matmul_precision not in PRECISIONS:
            raise MambalayaError(f"matmul_precision must be one of {', '.join(PRECISIONS)}")
        opts = TritonOptions(precision=matmul_precision, interpret=os.environ.get("TRITON_INTERPRET") == "1",
                             **options)
        program = TritonProgram(cascade, schedule, dtype, opts)
        program.groups = [compile_group(cascade, g, dtype, opts) for g in schedule.groups]
        return program

    def run(self, program: TritonProgram, inputs: dict[str, np.ndarray], *, count: bool = True,
            **options: Any) -> RunResult:
        return run_program(program, inputs, count=count, **options)


register(TritonBackend())

__all__ = ["RESIDENT_BYTES", "SCRATCH_BYTES", "TOLERANCES", "GroupKernel", "TritonBackend", "TritonProgram", "capture_graph",
           "compile_group", "cuda_median_s", "cuda_times_s", "device_inputs", "device_of", "graph_median_s", "kernel_times_s", "run_program",
           "sequence_times", "triton_available"]
