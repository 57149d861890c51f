"""cuBLAS batched products at short contractions and at the SSD's own shapes, against the GPU roofline.

    python benchmarks/gpu_short_k.py OUT.json            # on the GPU (cuBLAS batched products)
    python benchmarks/gpu_short_k.py --fit IN.json       # anywhere: the fitted curve, per precision
    python benchmarks/gpu_short_k.py --fit IN.json --md benchmarks/results/gpu_short_k.md   # + the roofline

The question it answers: is the h200 roofline (tensor-core efficiency measured on in_proj, K = 1024)
wrong for the SSD's products, which contract over a chunk (K = 64..256) in thousands of small batched
tiles? It times cuBLAS (``torch.bmm``: the vendor library, not our generator) with 256 x 256 output
tiles per batch entry over K = 32..4096 (about 8.6 GFLOP each) and at the SSD's shapes at
mamba2-370m / 4K, and fits the fill-and-drain law the CGLA spec uses (``Arch.pipeline_occupancy``),

    efficiency(K) = eff_inf * K / (K + D)        (1 / eff is linear in 1 / K: least squares)

Answer on the H200 (``results/gpu_short_k.md``): no. Every one of these products is memory-bound
and runs at 1.1-1.45x its roofline (the SSD's shapes 1.2-1.3x in tf32), and the law fits badly
(worst error 165%), so no short-K term was added to the GPU specs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SWEEP_K = (32, 64, 128, 256, 512, 1024, 2048, 4096)
TILE = 256
FLOP_TARGET = 8.6e9
#: (label, batch, M, N, K): the SSD's products at mamba2-370m, seqlen 4096 (16 chunks x 32 heads),
#: and the in_proj GEMM the spec's efficiency came from.
SHAPES = (("SSD YD (q x p over s)", 512, 256, 64, 256), ("SSD ST (p x n over q)", 512, 64, 128, 256),
          ("SSD YO (q x p over n)", 512, 256, 64, 128), ("SSD CB (q x s over n)", 16, 256, 256, 128),
          ("in_proj", 1, 4096, 4384, 1024))
#: dense tensor-core peaks of the H200 (datasheet), FLOP/s
PEAK = {"tf32": 494.7e12, "bf16": 989.4e12}


def measure(out: Path, dry: bool = False) -> None:
    import torch

    dev = "cpu" if dry else "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    cases = [(f"sweep K={k}", max(1, round(FLOP_TARGET / (2 * TILE * TILE * k))), TILE, TILE, k) for k in SWEEP_K]
    cases += list(SHAPES)
    for prec, dtype in (("tf32", torch.float32), ("bf16", torch.bfloat16)):
        for label, batch, m, n, k in cases:
            if dry:
                batch, m, n, k = min(batch, 2), min(m, 16), min(n, 16), min(k, 16)
            a = torch.randn(batch, m, k, device=dev, dtype=dtype)
            b = torch.randn(batch, k, n, device=dev, dtype=dtype)
            c = torch.empty(batch, m, n, device=dev, dtype=dtype)
            fn = lambda: torch.bmm(a, b, out=c)  # noqa: E731, B023 - timed within the iteration
            seconds = _time(torch, fn, dry)
            flop = 2.0 * batch * m * n * k
            rows.append({"label": label, "precision": prec, "batch": batch, "m": m, "n": n, "k": k,
                         "seconds": seconds, "flop": flop, "tflops": flop / seconds / 1e12,
                         "efficiency": flop / seconds / PEAK[prec]})
            print(f"{prec} {label:24s} b{batch:5d} {m}x{n}x{k}: {seconds * 1e3:8.4f} ms "
                  f"{flop / seconds / 1e12:7.1f} TFLOP/s ({flop / seconds / PEAK[prec]:.2f} of peak)", flush=True)
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "gpu": "cpu (dry run)" if dry else torch.cuda.get_device_name(), "cuda": torch.version.cuda,
           "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": env, "rows": rows, "fit": fit(rows)}, indent=1) + "\n")


def _time(torch, fn, dry: bool) -> float:
    """Median seconds of ``fn``: CUDA-graph replays of 4 calls each (no launch cost), CPU wall on a dry run."""
    fn()
    if dry:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    from mambalaya.exec.triton_backend import kernel_times_s

    torch.cuda.synchronize()
    return statistics.median(kernel_times_s(torch, fn, 15))


def fit(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per precision, eff_inf and D of ``eff = eff_inf * K / (K + D)`` over the K sweep."""
    out = {}
    for prec in sorted({r["precision"] for r in rows}):
        sweep = [r for r in rows if r["precision"] == prec and r["label"].startswith("sweep")]
        if len({r["k"] for r in sweep}) < 2:  # a dry run's shapes: nothing to fit
            out[prec] = {"eff_inf": float("nan"), "depth": float("nan"), "worst_rel_err": float("nan")}
            continue
        x = np.array([1.0 / r["k"] for r in sweep])
        y = np.array([1.0 / r["efficiency"] for r in sweep])
        slope, intercept = np.polyfit(x, y, 1)
        eff_inf = 1.0 / intercept
        depth = slope * eff_inf
        pred = {r["label"]: eff_inf * r["k"] / (r["k"] + depth) for r in rows if r["precision"] == prec}
        worst = max(abs(pred[r["label"]] / r["efficiency"] - 1) for r in rows if r["precision"] == prec)
        out[prec] = {"eff_inf": float(eff_inf), "depth": float(depth), "worst_rel_err": float(worst)}
    return out


def roofline_table(data: dict, arch_name: str = "h200") -> str:
    """Measured vs the arch's roofline (each operand read once, the output written once) per shape."""
    from mambalaya.arch import load_arch

    arch = load_arch(arch_name)
    env = data["env"]
    lines = [
        f"# cuBLAS batched products on {env['gpu']} against the `{arch_name}` roofline", "",
        f"Measured {env['when']} (torch {env['torch']}, CUDA {env['cuda']}) with `python benchmarks/gpu_short_k.py "
        "OUT.json`; table: `python benchmarks/gpu_short_k.py --fit benchmarks/results/gpu_short_k.json --md "
        "benchmarks/results/gpu_short_k.md`. `torch.bmm` (cuBLAS), CUDA-graph replays, median. Predicted: "
        "`max(flop / (peak x efficiency), bytes / achievable bandwidth) + per-kernel cost` with the spec's "
        "figures; the K sweep keeps about 8.6 GFLOP per shape, so its batch shrinks as K grows.", "",
        "| precision | shape | batch x M x N x K | measured ms | TFLOP/s | of peak | compute ms | memory ms "
        "| predicted ms | measured / predicted |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        elem = 4 if r["precision"] == "tf32" else 2
        nbytes = elem * r["batch"] * (r["m"] * r["k"] + r["k"] * r["n"] + r["m"] * r["n"])
        comp = r["flop"] / (2 * arch.throughput("mac", matrix=True, precision=r["precision"]))
        mem = nbytes / arch.offchip_bandwidth
        pred = max(comp, mem) + arch.group_overhead_s
        lines.append(f"| {r['precision']} | {r['label']} | {r['batch']} x {r['m']} x {r['n']} x {r['k']} | "
                     f"{r['seconds'] * 1e3:.4f} | {r['tflops']:.1f} | {r['efficiency']:.2f} | {comp * 1e3:.4f} | "
                     f"{mem * 1e3:.4f} | {pred * 1e3:.4f} | {r['seconds'] / pred:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--fit", type=Path, help="print the fit of a measured JSON")
    ap.add_argument("--dry", action="store_true", help="tiny shapes on the CPU (tests this script)")
    ap.add_argument("--md", type=Path, help="with --fit: also write the measured-vs-roofline table here")
    a = ap.parse_args()
    if a.fit:
        data = json.loads(a.fit.read_text())
        for prec, f in fit(data["rows"]).items():
            print(f"{prec}: efficiency(K) = {f['eff_inf']:.3f} * K / (K + {f['depth']:.0f}); "
                  f"worst error over every shape {f['worst_rel_err']:.0%}")
        for r in data["rows"]:
            print(f"{r['precision']} {r['label']:24s} {r['m']}x{r['n']}x{r['k']} b{r['batch']}: "
                  f"{r['tflops']:7.1f} TFLOP/s, {r['efficiency']:.3f} of peak")
        if a.md:
            from mambalaya.fileio import write_atomic

            write_atomic(a.md, roofline_table(data))
        return
    if a.out is None:
        ap.error("give OUT.json (or --fit IN.json)")
    measure(a.out, a.dry)


if __name__ == "__main__":
    main()
