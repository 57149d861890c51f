"""One fused group's generated Triton kernel at several tilings: measured on the GPU next to the h200 model.

    python benchmarks/gpu_tiles.py OUT.json                          # on the GPU
    python benchmarks/gpu_tiles.py --table OUT.json [--repredict] --md benchmarks/results/gpu_tiles.md   # anywhere
    TRITON_INTERPRET=1 python benchmarks/gpu_tiles.py /tmp/t.json --dry                      # CPU self-test

The question it answers: where the cost model and the generated kernels disagree, which kind of kernel
misses and how (the evidence the h200 spec's numbers and the model's terms are checked against). Each
case is one group of Mamba-2 (mamba2-370m, batch 1, seqlen 4096) at one tiling: the mapper's choice and
its neighbours (a GEMM's accumulator and K tile, the SSD's batched products, the chunk recurrence). A
case's kernel is printed from the same schedule the model prices (``CostContext.lower``), run on random
operands (its values do not change its time) as a CUDA-graph replay of 4 launches (median of 10), and
priced with ``group_costs``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: family -> (model, batch, seqlen)
POINTS = {"mamba2": ("mamba2-370m", 1, 4096), "mamba1": ("mamba-370m", 1, 4096)}
POINT = POINTS["mamba2"]
#: Mamba-1's cases: its fused scan group at several tiles (a recurrence's tile loop: its steps' latency), and
#: the scan alone
MAMBA1_CASES: tuple[tuple[str, dict[str, int]], ...] = (
    ("DT,A,DA,BX,H,SY,Y,G,HF", {"d": 2, "l": 1}), ("DT,A,DA,BX,H,SY,Y,G,HF", {"d": 16, "l": 1}),
    ("DT,A,DA,BX,H,SY,Y,G,HF", {"d": 2, "l": 8}), ("DT,A,DA,BX,H,SY,Y,G,HF", {"d": 16, "l": 16}),
    ("H", {"d": 16}), ("H", {"d": 16, "l": 16}), ("DA,BX,H,SY", {"d": 16, "l": 1}),
)
#: (group, tiles): what each Mamba-2 case runs
CASES: tuple[tuple[str, dict[str, int]], ...] = (
    ("Z", {"e": 8, "l": 256, "d": 128}), ("Z", {"e": 64, "l": 256, "d": 128}), ("Z", {"e": 32, "l": 128, "d": 128}),
    ("Z", {"e": 64, "l": 128, "d": 128}), ("Z", {"e": 32, "l": 128, "d": 64}), ("Z", {"e": 32, "l": 64, "d": 128}),
    ("XBC0", {"e": 4, "l": 32, "x": 1024}), ("XBC0", {"e": 16, "l": 256, "x": 96}),
    ("XBC0", {"e": 32, "l": 128, "x": 128}), ("XBC0", {"e": 64, "l": 128, "x": 128}),
    ("XBC0", {"e": 32, "l": 128, "x": 64}),
    ("OUT", {"d": 16, "l": 256, "e": 128}), ("OUT", {"d": 64, "l": 256, "e": 128}),
    ("OUT", {"d": 32, "l": 128, "e": 128}), ("OUT", {"d": 64, "l": 128, "e": 64}),
    ("YO", {"n": 8, "p": 2, "c": 2}), ("YO", {"n": 32, "c": 1, "h": 2}), ("YO", {"c": 1, "h": 1, "q": 128}),
    ("YO", {"c": 1, "h": 2, "q": 64}), ("YO", {"c": 1, "h": 1, "q": 64}),
    ("CB", {"n": 4, "c": 1, "q": 32}), ("CB", {"c": 1, "q": 32}), ("CB", {"c": 1, "q": 64, "s": 64}),
    ("XDT,LM,YD,DS,ST", {"s": 16, "c": 1, "h": 2}), ("XDT,LM,YD,DS,ST", {"c": 1, "h": 1, "s": 64}),
    ("XDT,LM,YD,DS,ST", {"c": 1, "h": 1, "p": 32, "s": 32}),
    ("S,SF", {"c": 1, "h": 1, "p": 8}), ("S,SF", {"c": 1, "h": 1, "p": 16}),
    ("Y,YG,NV,YN", {"p": 1, "l": 4}), ("Y,YG,NV,YN", {"l": 8}), ("Y,YG,NV,YN", {"l": 2}),
    ("XBC1,XBC", {"l": 2048, "x": 9}), ("XBC1,XBC", {"l": 64, "x": 256}), ("XBC1,XBC", {"l": 256, "x": 8}),
    ("XDT", {"l": 1, "h": 4}), ("XDT", {"l": 16, "h": 8}), ("LM,YD", {"h": 1, "c": 1, "q": 128}),
    ("LM,YD", {"h": 1, "c": 1, "q": 64}), ("ST", {"c": 1, "h": 2, "q": 128}), ("ST", {"c": 1, "h": 1}),
    ("DT,A,DA,ACS,DS", {"h": 4, "c": 1}), ("DT0", {"e": 256, "l": 32}), ("DT0", {"l": 64}),
)


def _context(dry: bool, family: str = "mamba2"):
    from mambalaya.arch import load_arch
    from mambalaya.cost.context import CostContext
    from mambalaya.parse import open_cascade

    model, batch, seqlen = POINTS[family]
    cascade = open_cascade(family, model=model, params={"batch": batch, "seqlen": 256 if dry else seqlen})
    return cascade, CostContext(cascade, load_arch("h200"))


def measure(out: Path, dry: bool = False, precision: str = "tf32") -> None:
    import torch

    from mambalaya.cost.model import group_costs
    from mambalaya.exec.triton_backend import compile_group, kernel_times_s
    from mambalaya.exec.triton_codegen import TritonOptions
    from mambalaya.ir.mapping import FusionGroup
    from mambalaya.mapper.tiling import search_order

    contexts = {f: _context(dry, f) for f in POINTS}
    dev = "cpu" if dry else "cuda"
    opts = TritonOptions(precision=precision, interpret=dry)
    rows = []
    for family, names, tiles in [("mamba2", *c) for c in CASES] + [("mamba1", *c) for c in MAMBA1_CASES]:
        cascade, ctx = contexts[family]
        einsums = tuple(names.split(","))
        order = search_order(ctx, einsums)  # (the tile search's: a recurrence's loop innermost)
        tiles = {r: t for r, t in tiles.items() if t < cascade.rank_size(r)}
        row: dict = {"family": family, "model": POINTS[family][0], "group": names, "tiles": tiles}
        try:
            sched = ctx.lower(FusionGroup(einsums, order, tiles), None, check=False)
        except Exception as err:  # noqa: BLE001 - a tiling the schedule refuses is a row, not a stop
            rows.append({**row, "error": f"{type(err).__name__}: {err}"})
            continue
        cost = group_costs(ctx, sched)[0]
        row.update(predicted_s=cost.latency_s, compute_s=cost.compute_s, memory_s=cost.memory_s,
                   traffic_bytes=cost.traffic_bytes, occupancy_bytes=sched.occupancy_bytes,
                   accumulator_bytes=sched.accumulator_bytes, programs=cost.programs)
        t0 = time.perf_counter()
        gk = compile_group(cascade, sched, "float32", opts)
        if gk.kernel is None:
            rows.append({**row, "error": gk.reason})
            continue
        pk = gk.printed
        gen = torch.Generator(device="cpu").manual_seed(0)
        args = [torch.randn(cascade.shape(t), generator=gen).to(dev) * 0.1 for t in pk.params]
        arena = torch.zeros(pk.programs * pk.arena, device=dev)
        tc = torch.zeros(2 * len(pk.params), dtype=torch.int64, device=dev)
        kw = {} if dry else {"num_warps": pk.num_warps}

        def launch(kernel=gk.kernel, args=args, arena=arena, tc=tc, n=pk.programs, kw=kw) -> None:
            kernel[(n,)](*args, arena, tc, 0, COUNT=False, **kw)

        try:
            launch()
            if dry:
                ts = [0.0]
            else:
                torch.cuda.synchronize()
                ts = kernel_times_s(torch, launch, 10)
        except Exception as err:  # noqa: BLE001 - a kernel that fails to compile is a row
            rows.append({**row, "error": f"{type(err).__name__}: {str(err)[:300]}"})
            continue
        row.update(measured_s=statistics.median(ts), compile_s=time.perf_counter() - t0, arena_elements=pk.arena,
                   num_warps=pk.num_warps, dots=pk.dots, in_registers=list(pk.in_registers))
        rows.append(row)
        print(f"{names:18s} {json.dumps(tiles):40s} measured {row['measured_s'] * 1e3:8.3f} ms  predicted "
              f"{row['predicted_s'] * 1e3:7.3f} ms  programs {row['programs']}", flush=True)
        out.write_text(json.dumps(_doc(rows, precision), indent=1))
    out.write_text(json.dumps(_doc(rows, precision), indent=1))


def _doc(rows: list[dict], precision: str) -> dict:
    env: dict = {"python": platform.python_version(), "precision": precision,
                 "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    try:
        import torch
        import triton

        env.update(torch=torch.__version__, triton=triton.__version__,
                   device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    except ImportError:
        pass
    return {"point": list(POINT), "points": {f: list(p) for f, p in POINTS.items()}, "env": env, "rows": rows}


def repredict(doc: dict) -> None:
    """Each row's prediction again, with the specs as they are now (the measured times stay)."""
    from mambalaya.cost.model import group_costs
    from mambalaya.ir.mapping import FusionGroup
    from mambalaya.mapper.tiling import search_order

    contexts = {f: _context(False, f) for f in POINTS}
    for r in doc["rows"]:
        if "measured_s" not in r:
            continue
        cascade, ctx = contexts[r.get("family", "mamba2")]
        einsums = tuple(r["group"].split(","))
        sched = ctx.lower(FusionGroup(einsums, search_order(ctx, einsums), r["tiles"]), None, check=False)
        r["predicted_at_run_s"] = r["predicted_s"]
        r["predicted_s"] = group_costs(ctx, sched)[0].latency_s
    doc["repredicted"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def table(doc: dict) -> str:
    env = doc["env"]
    lines = ["# One group's generated kernel at several tilings, measured vs the h200 model\n",
             f"Measured {env['when']} on {env.get('device')} (torch {env.get('torch')}, triton {env.get('triton')}), "
             f"{env['precision']} products, with `python benchmarks/gpu_tiles.py OUT.json`; table: "
             f"`python benchmarks/gpu_tiles.py --table OUT.json --md benchmarks/results/gpu_tiles.md`. "
             "Points: " + ", ".join(f"{m} batch {b} seqlen {n}" for m, b, n in doc.get("points", {"mamba2": doc["point"]})
                                    .values()) + ". A time is the median CUDA-graph replay of 4 launches / 4."
             + (f" Predicted with the specs as of {doc['repredicted']} (`--repredict`; the fits in archs/h200.yaml "
                "were made on these rows, so this is in-sample)." if doc.get("repredicted") else "") + "\n",
             "| model | group | tiles | programs | on chip KiB | accumulator KiB | in registers | measured ms | predicted ms "
             "| ratio |", "|---|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in doc["rows"]:
        tiles = " ".join(f"{k}{v}" for k, v in r["tiles"].items()) or "untiled"
        if "measured_s" not in r:
            lines.append(f"| {r.get('model', doc['point'][0])} | {r['group']} | {tiles} | | | | | "
                         f"{r.get('error', '')[:80]} | | |")
            continue
        regs = ", ".join(r["in_registers"]) or "-"
        lines.append(f"| {r.get('model', doc['point'][0])} | {r['group']} | {tiles} | {r['programs']} | {r['occupancy_bytes'] / 1024:.0f} | "
                     f"{r['accumulator_bytes'] / 1024:.0f} | {regs} | {r['measured_s'] * 1e3:.3f} | "
                     f"{r['predicted_s'] * 1e3:.3f} | {r['measured_s'] / r['predicted_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--dry", action="store_true", help="CPU self-test under TRITON_INTERPRET=1 at a short seqlen")
    ap.add_argument("--precision", default="tf32", choices=("fp32", "tf32", "bf16"))
    ap.add_argument("--table", type=Path, help="print the table of a measured OUT.json")
    ap.add_argument("--md", type=Path, help="with --table: write it here")
    ap.add_argument("--repredict", action="store_true", help="with --table: price every row with today's specs")
    a = ap.parse_args()
    if a.table:
        doc = json.loads(a.table.read_text())
        if a.repredict:
            repredict(doc)
        text = table(doc)
        if a.md:
            a.md.write_text(text)
        print(text)
        return
    if a.out is None:
        ap.error("give OUT.json (or --table)")
    measure(a.out, a.dry, a.precision)


if __name__ == "__main__":
    main()
