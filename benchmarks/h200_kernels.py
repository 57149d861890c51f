"""Measure Mamba-relevant kernels on a CUDA GPU, and compare them with the h200 spec's roofline.

Two modes:

    python benchmarks/h200_kernels.py OUT.json            # on the GPU: measure, write JSON
    python benchmarks/h200_kernels.py --table IN.json [--md OUT.md] [--arch h200]
                                                          # anywhere: measured vs predicted table

Kernels (why each one): a device-to-device copy (the achievable HBM bandwidth); the
Mamba-2 370m in_proj GEMM at its published shape in bf16, tf32 and fp32, plus an
8192^3 bf16 GEMM (the matrix-unit ceilings); an element-wise chain
``exp(softplus(dt + bias) * A) * x`` unfused (five torch ops) and fused (one Triton
kernel, and torch.compile): the fused-vs-unfused pair; a reduction over d_state;
a sequential scan ``h = a*h + b`` over L with independent channels (Triton,
sequential and chunked, and a torch loop of L launches); and tiny-kernel launches
(the per-group overhead).

Each kernel is recorded as a list of ``parts`` (one per launch) with the bytes it
must move (each input read once, each output written once) and its operations by
kind, so the prediction is ``sum over parts of max(bytes / BW, sum_k ops_k /
throughput_k) + per-group overhead``, from :class:`mambalaya.arch.Arch`.
Timing: CUDA events around each call, warm-up first, median of many calls.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------- shapes

MAMBA2_370M = {"d_model": 1024, "d_inner": 2048, "d_state": 128, "ngroups": 1, "headdim": 64}
BATCH, SEQLEN = 64, 2048  # the Mambalaya paper's batch 64 with a 2^11 context
CHAIN_SHAPE = (16, 2048, 2048)  # [B, L, D] for the element-wise chain (268 MB per fp32 tensor)
SCAN_L, SCAN_C = 2048, 4 * 2048 * 16  # Mamba-1 style: L steps, B*D*N = 131072 independent channels


def in_proj_shape() -> tuple[int, int, int]:
    """(M, K, N) of the Mamba-2 370m in_proj: tokens x d_model -> [z, x, B, C, dt]."""
    c = MAMBA2_370M
    nheads = c["d_inner"] // c["headdim"]
    n_out = 2 * c["d_inner"] + 2 * c["ngroups"] * c["d_state"] + nheads  # 4096 + 256 + 32 = 4384
    return BATCH * SEQLEN, c["d_model"], n_out


def part(
    bytes_: float, ops: dict[str, float] | None = None, matrix: bool = False, precision: str | None = None
) -> dict[str, Any]:
    return {
        "bytes": float(bytes_),
        "ops": {k: float(v) for k, v in (ops or {}).items()},
        "matrix": matrix,
        "precision": precision,
    }


# ----------------------------------------------------------------------------- measuring


def measure(out_path: Path, quick: bool = False, dry: bool = False) -> None:
    """Run every kernel; ``dry``: tiny sizes on the CPU (Triton under TRITON_INTERPRET=1), a self-test."""
    import torch

    try:
        import triton
    except ImportError:  # measured kernels that need Triton are skipped
        triton = None

    assert dry or torch.cuda.is_available(), "this mode needs a CUDA GPU (or --dry-run)"
    dev = torch.device("cpu" if dry else "cuda")
    torch.manual_seed(0)
    results: list[dict[str, Any]] = []
    scale = 512 if dry else 8 if quick else 1

    def sync() -> None:
        if not dry:
            torch.cuda.synchronize()

    def timeit(fn: Callable[[], Any], iters: int = 30, warmup: int = 5) -> dict[str, float]:
        if dry:
            iters, warmup = 2, 1
        for _ in range(warmup):
            fn()
        sync()
        if dry:
            ts = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return {
                "median_s": statistics.median(ts),
                "min_s": min(ts),
                "p10_s": min(ts),
                "p90_s": max(ts),
                "iters": iters,
            }
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends, strict=True):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        ts = sorted(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True))
        return {
            "median_s": statistics.median(ts),
            "min_s": ts[0],
            "p10_s": ts[len(ts) // 10],
            "p90_s": ts[(9 * len(ts)) // 10],
            "iters": iters,
        }

    def record(
        name: str, description: str, parts: list[dict[str, Any]], timing: dict[str, float], **extra: Any
    ) -> None:
        total_bytes = sum(p["bytes"] for p in parts)
        flops = sum(v * (2 if k == "mac" else 1) for p in parts for k, v in p["ops"].items())
        row = {
            "name": name,
            "description": description,
            "launches": len(parts),
            "bytes": total_bytes,
            "flops": flops,
            **timing,
            "parts": parts,
            **extra,
        }
        row["achieved_bandwidth"] = total_bytes / timing["median_s"]
        row["achieved_flops"] = flops / timing["median_s"]
        results.append(row)
        print(
            f"{name:28s} {timing['median_s'] * 1e3:9.3f} ms  {row['achieved_bandwidth'] / 1e12:6.2f} TB/s  "
            f"{row['achieved_flops'] / 1e12:7.1f} TFLOP/s",
            flush=True,
        )

    def guarded(label: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - keep measuring the others; the error goes into the JSON
            print(f"{label}: FAILED {type(exc).__name__}: {exc}", flush=True)
            results.append({"name": label, "error": f"{type(exc).__name__}: {exc}"})
        sync()
        if not dry:
            torch.cuda.empty_cache()

    def rel_err(out: Any, ref: Any) -> float:
        return float((out.double() - ref.double()).norm() / ref.double().norm())

    # --- (e) device-to-device copy: the achievable HBM bandwidth -----------------------
    def copy() -> None:
        n = (1 << 29) // scale  # 2 GiB of fp32
        src = torch.randn(n, device=dev)
        dst = torch.empty_like(src)
        t = timeit(lambda: dst.copy_(src), iters=50)
        assert torch.equal(dst, src)
        record(
            "copy_2GiB",
            "device-to-device copy, 2 GiB fp32 (read + write counted)",
            [part(2 * src.numel() * 4)],
            t,
        )

    guarded("copy_2GiB", copy)

    # --- launch overhead: tiny kernels back to back -------------------------------------
    def launches() -> None:
        x = torch.randn(1024, device=dev)
        n = 1000

        def eager() -> None:
            for _ in range(n):
                x.add_(1.0)

        t = timeit(eager, iters=10, warmup=2)
        t = {k: (v / n if k.endswith("_s") else v) for k, v in t.items()}
        record(
            "launch_eager_tiny", "one tiny torch kernel (1024 floats), eager, per launch", [part(2 * 4096)], t
        )
        if dry:
            return
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                x.add_(1.0)
        t = timeit(g.replay, iters=10, warmup=2)
        t = {k: (v / n if k.endswith("_s") else v) for k, v in t.items()}
        record(
            "launch_graph_tiny", "one tiny torch kernel, CUDA-graph replay, per launch", [part(2 * 4096)], t
        )
        if triton is not None:

            def eager_triton() -> None:
                for _ in range(n):
                    _add_one_kernel[(1,)](x, 1024, BLOCK=1024)

            t = timeit(eager_triton, iters=10, warmup=2)
            t = {k: (v / n if k.endswith("_s") else v) for k, v in t.items()}
            record(
                "launch_eager_triton_tiny",
                "one tiny Triton kernel (1024 floats), eager, per launch",
                [part(2 * 4096)],
                t,
            )

    guarded("launch", launches)

    # --- (a) projection GEMMs -------------------------------------------------------------
    def gemm(precision: str) -> None:
        m, k, n = in_proj_shape()
        m //= scale
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        x = torch.randn(m, k, device=dev, dtype=dtype)
        w = torch.randn(n, k, device=dev, dtype=dtype) / math.sqrt(k)  # nn.Linear layout [out, in]
        out = torch.empty(m, n, device=dev, dtype=dtype)
        t = timeit(lambda: torch.matmul(x, w.t(), out=out), iters=10 if precision == "fp32" else 30)
        ref = x[:256].double() @ w.double().t()
        es = x.element_size()
        record(
            f"in_proj_{precision}",
            f"Mamba-2 370m in_proj GEMM {m}x{k} @ {k}x{n} ({precision})",
            [part((m * k + n * k + m * n) * es, {"mac": m * n * k}, True, precision)],
            t,
            rel_err=rel_err(out[:256], ref),
            shape=[m, k, n],
        )
        torch.backends.cuda.matmul.allow_tf32 = False

    for prec in ("bf16", "tf32", "fp32"):
        guarded(f"in_proj_{prec}", lambda p=prec: gemm(p))

    def gemm_square() -> None:
        s = 256 if dry else 8192 // (2 if quick else 1)
        a = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
        b = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
        c = torch.empty(s, s, device=dev, dtype=torch.bfloat16)
        t = timeit(lambda: torch.matmul(a, b, out=c), iters=30)
        record(
            f"gemm_{s}_bf16",
            f"{s}^3 bf16 GEMM (the tensor-core ceiling)",
            [part(3 * s * s * 2, {"mac": s**3}, True, "bf16")],
            t,
            shape=[s, s, s],
        )

    guarded("gemm_8192_bf16", gemm_square)

    # --- (b) element-wise chain: unfused vs fused ----------------------------------------
    def chain() -> None:
        b, length, d = CHAIN_SHAPE
        b = max(1, b // scale)
        n = b * length * d
        dt_raw = torch.randn(b, length, d, device=dev)
        x = torch.randn(b, length, d, device=dev)
        bias = torch.randn(d, device=dev) * 0.5
        a_neg = -torch.rand(d, device=dev) - 0.5
        eb = 4

        def unfused() -> Any:
            t1 = dt_raw + bias
            t2 = torch.nn.functional.softplus(t1)
            t3 = t2 * a_neg
            t4 = torch.exp(t3)
            return t4 * x

        ref = unfused()
        t = timeit(unfused)
        parts = [
            part(2 * n * eb, {"add": n}),
            part(2 * n * eb, {"softplus": n}),
            part(2 * n * eb, {"mul": n}),
            part(2 * n * eb, {"exp": n}),
            part(3 * n * eb, {"mul": n}),
        ]
        record(
            "chain_unfused_torch",
            f"exp(softplus(dt+bias)*A)*x over [{b},{length},{d}] fp32, 5 torch ops",
            parts,
            t,
            shape=[b, length, d],
        )
        fused_parts = [part(3 * n * eb, {"add": n, "softplus": n, "mul": 2 * n, "exp": n})]

        if triton is not None:
            out = torch.full_like(x, float("nan"))
            grid = (triton.cdiv(n, 1024),)

            def fused() -> None:
                _chain_kernel[grid](dt_raw, x, bias, a_neg, out, n, d, BLOCK=1024)

            fused()
            err = rel_err(out, ref)
            assert err < 1e-5, err
            t = timeit(fused)
            record(
                "chain_fused_triton",
                "the same chain as one Triton kernel",
                fused_parts,
                t,
                rel_err=err,
                shape=[b, length, d],
            )

        if dry:
            return
        start = time.perf_counter()
        compiled = torch.compile(unfused)
        got = compiled()
        compile_s = time.perf_counter() - start
        err = rel_err(got, ref)
        t = timeit(compiled)
        record(
            "chain_fused_compile",
            "the same chain through torch.compile (Inductor)",
            fused_parts,
            t,
            rel_err=err,
            compile_s=compile_s,
            shape=[b, length, d],
        )

    # --- (c) reductions over d_state ------------------------------------------------------
    def reductions() -> None:
        for label, shape in (
            ("reduce_dstate16", (8, 2048, 2048, 16)),
            ("reduce_dstate128", (1, 2048, 2048, 128)),
        ):
            shape = (shape[0], shape[1] // scale, *shape[2:])
            h = torch.randn(*shape, device=dev)
            out = torch.empty(shape[:-1], device=dev)
            t = timeit(lambda h=h, out=out: torch.sum(h, dim=-1, out=out))
            n_in, n_out = h.numel(), out.numel()
            parts = [part((n_in + n_out) * 4, {"add": n_in - n_out})]
            record(
                f"{label}_torch",
                f"sum over d_state of a {list(shape)} fp32 state, torch.sum",
                parts,
                t,
                shape=list(shape),
            )
            if triton is not None:
                ref = out.clone()
                out.fill_(float("nan"))
                rows, width = n_out, shape[-1]
                block = max(1, 4096 // width)

                def tri(h=h, out=out, rows=rows, width=width, block=block) -> None:
                    _rowsum_kernel[(triton.cdiv(rows, block),)](h, out, rows, N=width, BLOCK_R=block)

                tri()
                err = rel_err(out, ref)
                assert err < 1e-5, err
                t = timeit(tri)
                record(
                    f"{label}_triton",
                    "the same sum as a Triton kernel (row tiles of 4096 elements)",
                    parts,
                    t,
                    rel_err=err,
                    shape=list(shape),
                )
            del h, out
            if not dry:
                torch.cuda.empty_cache()

    guarded("reductions", reductions)

    # --- (d) sequential scan h = a*h + b ----------------------------------------------------
    def scans() -> None:
        length, c = (64 if dry else SCAN_L // (2 if quick else 1)), SCAN_C // scale
        a = torch.rand(length, c, device=dev) * 0.1 + 0.9
        bb = torch.randn(length, c, device=dev)
        n = length * c
        scan_parts = [part(3 * n * 4, {"mac": n})]
        # reference on a slice of channels, float64
        ref_cols = 64
        ref = torch.empty(length, ref_cols, device=dev, dtype=torch.float64)
        h = torch.zeros(ref_cols, device=dev, dtype=torch.float64)
        for i in range(length):
            h = a[i, :ref_cols].double() * h + bb[i, :ref_cols].double()
            ref[i] = h
        if triton is not None:
            hs = torch.full_like(a, float("nan"))
            for label, fn in (
                (
                    "scan_triton_sequential",
                    lambda: _scan_seq_kernel[(triton.cdiv(c, 256),)](a, bb, hs, length, c, BLOCK=256),
                ),
                (
                    "scan_triton_chunked",
                    lambda: _scan_chunk_kernel[(triton.cdiv(c, 128),)](a, bb, hs, length, c, T=16, BLOCK=128),
                ),
            ):
                hs.fill_(float("nan"))
                fn()
                err = rel_err(hs[:, :ref_cols], ref)
                assert not torch.isnan(hs).any() and err < 1e-5, err
                t = timeit(fn)
                record(
                    label,
                    f"h[t] = a[t]*h[t-1] + b[t], L={length}, {c} channels, fp32, one Triton kernel "
                    f"({label.rsplit('_', 1)[1]})",
                    scan_parts,
                    t,
                    rel_err=err,
                    shape=[length, c],
                )
        hs = torch.empty_like(a)
        zero = torch.zeros(c, device=dev)

        a_rows, b_rows, h_rows = (
            a.unbind(0),
            bb.unbind(0),
            hs.unbind(0),
        )  # views made once, outside the timing
        prev_rows = (zero, *h_rows[:-1])

        def loop() -> None:
            for step in zip(b_rows, a_rows, prev_rows, h_rows, strict=True):
                torch.addcmul(step[0], step[1], step[2], out=step[3])

        loop()
        err = rel_err(hs[:, :ref_cols], ref)
        t = timeit(loop, iters=10, warmup=2)
        record(
            "scan_torch_loop",
            f"the same scan as {length} torch launches (addcmul per step)",
            [part(4 * c * 4, {"mac": c}) for _ in range(length)],
            t,
            rel_err=err,
            shape=[length, c],
        )

    guarded("scans", scans)
    guarded("chain", chain)  # last: torch.compile may take a while

    props = None if dry else torch.cuda.get_device_properties(0)
    meta = {
        "gpu": "cpu (dry run)" if dry else torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count if props else None,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "total_memory_bytes": props.total_memory if props else None,
        "torch": torch.__version__,
        "triton": getattr(triton, "__version__", None) if triton is not None else None,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "nvidia_smi": None if dry else _smi(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "method": "CUDA events around each call; warm-up first; median of the timed calls; "
        "bytes = each input read once + each output written once",
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"meta": meta, "kernels": results}, indent=1))
    print(f"wrote {out_path}")


def _smi() -> str | None:
    try:
        query = (
            "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu"
        )
        return subprocess.run(
            ["nvidia-smi", query, "--format=csv"], check=False, capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


# ----------------------------------------------------------------------------- Triton kernels

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _chain_kernel(dt_ptr, x_ptr, bias_ptr, a_ptr, out_ptr, n, d, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        ch = offs % d
        dt = tl.load(dt_ptr + offs, mask=mask) + tl.load(bias_ptr + ch, mask=mask)
        sp = tl.where(dt > 20.0, dt, tl.log(1.0 + tl.exp(dt)))  # torch's softplus (threshold 20)
        y = tl.exp(sp * tl.load(a_ptr + ch, mask=mask)) * tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, y, mask=mask)

    @triton.jit
    def _scan_seq_kernel(a_ptr, b_ptr, h_ptr, length: tl.constexpr, c, BLOCK: tl.constexpr):
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < c
        h = tl.zeros([BLOCK], dtype=tl.float32)
        for t in range(length):
            off = t * c + cols
            h = tl.load(a_ptr + off, mask=mask) * h + tl.load(b_ptr + off, mask=mask)
            tl.store(h_ptr + off, h, mask=mask)

    @triton.jit
    def _add_one_kernel(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

    @triton.jit
    def _rowsum_kernel(h_ptr, out_ptr, rows, N: tl.constexpr, BLOCK_R: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = r < rows
        tile = tl.load(h_ptr + r.to(tl.int64)[:, None] * N + tl.arange(0, N)[None, :], mask=rmask[:, None])
        tl.store(out_ptr + r, tl.sum(tile, axis=1), mask=rmask)

    @triton.jit
    def _combine(a1, b1, a2, b2):
        return a1 * a2, b1 * a2 + b2

    @triton.jit
    def _scan_chunk_kernel(
        a_ptr, b_ptr, h_ptr, length: tl.constexpr, c, T: tl.constexpr, BLOCK: tl.constexpr
    ):
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        rows = tl.arange(0, T)
        cmask = cols < c
        h = tl.zeros([BLOCK], dtype=tl.float32)
        for t0 in range(0, length, T):
            off = (t0 + rows)[:, None] * c + cols[None, :]
            mask = ((t0 + rows) < length)[:, None] & cmask[None, :]
            a = tl.load(a_ptr + off, mask=mask, other=1.0)
            b = tl.load(b_ptr + off, mask=mask, other=0.0)
            acum, bcum = tl.associative_scan((a, b), 0, _combine)
            hs = acum * h[None, :] + bcum
            tl.store(h_ptr + off, hs, mask=mask)
            h = tl.sum(tl.where((rows == T - 1)[:, None], hs, 0.0), axis=0)
except ImportError:  # the table mode needs no Triton
    pass


# ----------------------------------------------------------------------------- table


def predict(arch: Any, row: dict[str, Any]) -> dict[str, float]:
    """Roofline time of a measured kernel on ``arch``: per launch max(memory, compute) + overhead."""
    total = mem_total = comp_total = 0.0
    for p in row["parts"]:
        mem = p["bytes"] / arch.offchip_bandwidth
        comp = sum(
            count / arch.throughput(kind, matrix=p["matrix"], precision=p["precision"])
            for kind, count in p["ops"].items()
        )
        total += max(mem, comp) + arch.group_overhead_s
        mem_total += mem
        comp_total += comp
    return {"predicted_s": total, "memory_s": mem_total, "compute_s": comp_total}


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s >= 1e-4 else f"{s * 1e6:.2f} us"


# What a reader of the table needs to know about the rows the roofline does not fit.
NOTES = {
    "launch_graph_tiny": "CUDA-graph replay removes the host launch cost; the spec's per-group figure is the "
    "eager one, so graph-launched groups are over-predicted",
    "launch_eager_triton_tiny": "Triton's Python launcher costs 2 to 3 times an eager torch op; an executor "
    "that launches Triton kernels from Python pays this per group",
    "in_proj_bf16": "Medians of the two runs: 1.586 and 1.737 ms (742 and 678 TFLOP/s); the spec uses "
    "their mean",
    "reduce_dstate16_torch": "torch.sum over a 16-wide innermost dimension reaches 0.65 TB/s: a library "
    "kernel, not the hardware; the Triton row below moves the same bytes at 4.37 TB/s",
    "reduce_dstate128_torch": "Likewise 2.25 TB/s with torch.sum; 4.35 TB/s with Triton",
    "scan_triton_sequential": "One time step per loop iteration: each program waits a memory round trip per "
    "step (latency-bound, 2.7 TB/s)",
    "scan_triton_chunked": "16 time steps per iteration, combined with tl.associative_scan: 3.8 TB/s",
    "scan_torch_loop": "One addcmul launch per time step: launch-bound, predicted by 2048 x the per-group "
    "overhead",
    "chain_unfused_torch": "5 kernels, 11 passes over a 268 MB tensor; fused: 3 passes (3.7x fewer bytes), "
    "4.4x faster",
}


def write_table(json_path: Path, md_path: Path | None, arch_name: str) -> str:
    """The measured-vs-predicted Markdown table (needs mambalaya importable, not a GPU)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mambalaya.arch import load_arch

    arch = load_arch(arch_name)
    data = json.loads(json_path.read_text())
    meta = data["meta"]
    bw = arch.offchip_bandwidth / 1e12
    lines = [
        f"# Measured vs predicted: {meta['gpu']} against the `{arch.name}` spec",
        "",
        f"Measured {meta['date']} with `python benchmarks/h200_kernels.py OUT.json` (torch {meta['torch']}, "
        f"triton {meta['triton']}, CUDA {meta['cuda']}; {meta['sm_count']} SMs, SM clock at "
        "1980 MHz per nvidia-smi). " + meta["method"] + ". Table: `python benchmarks/h200_kernels.py "
        "--table benchmarks/results/h200_kernels.json --md benchmarks/results/h200_kernels.md`.",
        "",
        *(
            [
                f"`{run1.name}` holds an earlier run (a separate lease of an H200) of the same kernels, "
                "before the Triton reductions and the Triton launch were added and while the torch loop "
                "still built its views inside the timed region.",
                "",
            ]
            if (run1 := json_path.with_name(json_path.stem + "_run1.json")).is_file()
            else []
        ),
        f"Prediction: per launch `max(bytes / {bw:.2f} TB/s, sum over op kinds of ops / "
        f"arch.throughput(op, matrix, precision)) + {arch.group_overhead_s * 1e6:.1f} us`, summed over "
        f"launches, with `load_arch('{arch_name}')`. The spec's achievable bandwidth, tensor-core "
        "efficiencies were set from these measurements, the per-group overhead from the generated kernels "
        "of whole layers (`gpu.md`: a real kernel in a CUDA graph; the tiny launches here are below it; see "
        "the comments in `archs/h200.yaml`). Ratio = measured / predicted; bound = the larger roofline term.",
        "",
        "| kernel | launches | bytes | FLOP | measured | achieved BW | achieved FLOP/s | predicted | bound "
        "| ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in data["kernels"]:
        if "error" in row:
            lines.append(f"| {row['name']} | | | | failed: {row['error']} | | | | | |")
            continue
        pred = predict(arch, row)
        bound = "compute" if pred["compute_s"] > pred["memory_s"] else "memory"
        if pred["predicted_s"] > 2 * max(pred["compute_s"], pred["memory_s"]):
            bound = "overhead"
        ratio = row["median_s"] / pred["predicted_s"]
        lines.append(
            f"| {row['name']} | {row['launches']} | {row['bytes'] / 1e9:.3g} GB | {row['flops'] / 1e9:.3g} G "
            f"| {_fmt_time(row['median_s'])} | {row['achieved_bandwidth'] / 1e12:.2f} TB/s "
            f"| {row['achieved_flops'] / 1e12:.1f} T | {_fmt_time(pred['predicted_s'])} | {bound} "
            f"| {ratio:.2f} |"
        )
    lines += ["", "Kernels:", ""]
    for r in data["kernels"]:
        note = NOTES.get(r["name"])
        lines.append(
            f"- `{r['name']}`: {r.get('description', r.get('error', ''))}" + (f". {note}." if note else "")
        )
    text = "\n".join(lines) + "\n"
    if md_path is not None:
        md_path.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path, help="measure on the GPU and write JSON here")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke test)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, to test this script")
    ap.add_argument("--table", type=Path, help="read measured JSON and print the measured-vs-predicted table")
    ap.add_argument("--md", type=Path, help="also write the table to this Markdown file")
    ap.add_argument("--arch", default="h200", help="spec to predict with (default h200)")
    args = ap.parse_args(argv)
    if args.table:
        print(write_table(args.table, args.md, args.arch))
        return 0
    if args.out is None:
        ap.error("give OUT.json to measure, or --table IN.json")
    measure(args.out, quick=args.quick, dry=args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
