"""Time-to-optimal of the exact mapper: Einsums and layers (1, 8, 64) x archs x sequence lengths.

Writes ``benchmarks/results/mapper.md`` (and ``mapper.json``): per run the Einsum count,
candidates, space-construction and total solve time, whether optimality was proven, the
modelled speedup over unfused, the groups fused and the peak Python memory (tracemalloc)
and process RSS (getrusage). Targets: one layer < 1 s per arch, 64 layers < 30 s, < 1 GiB.

    PYTHONPATH=. python benchmarks/bench_mapper.py [--quick] [--layers 1 8 64] [--seqlens 2048 1048576]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path

from mambalaya.arch import load_arch, shipped_archs
from mambalaya.cost import evaluate
from mambalaya.ir.chain import chain_layers
from mambalaya.mapper import optimal_mapping
from mambalaya.parse import open_cascade

OUT = Path(__file__).resolve().parent / "results"
LAYERS = {"mamba1": "mamba-370m", "mamba2": "mamba2-370m", "mamba1-decode": "mamba-370m",
          "mamba2-decode": "mamba2-370m"}


def _groups(groups: list[list[str]]) -> str:
    fused = [g for g in groups if len(g) > 1]
    return " ".join("[" + ",".join(g) + "]" for g in fused) or "none"


def run_one(name: str, arch: str, seqlen: int | None, layers: int, batch: int, max_size: int | None) -> dict:
    params = {"batch": batch} | ({"seqlen": seqlen} if seqlen else {})
    c = open_cascade(name, model=LAYERS[name], params=params)
    a = load_arch(arch)
    tracemalloc.start()
    t0 = time.perf_counter()
    r = optimal_mapping(c, a, max_size=max_size, layers=layers)
    wall = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    unfused = evaluate(chain_layers(c, layers) if layers > 1 else c, a)
    return {"cascade": name, "arch": arch, "seqlen": seqlen, "batch": batch, "layers": layers,
            "einsums": len(c.einsums), "candidates": r.candidates, "space_s": r.space_s, "total_s": wall,
            "optimal": r.optimal, "gap": r.gap, "latency_s": r.report.latency_s,
            "unfused_latency_s": unfused.latency_s, "speedup": unfused.latency_s / r.report.latency_s,
            "traffic_bytes": r.report.traffic_bytes, "unfused_traffic_bytes": unfused.traffic_bytes,
            "groups": len(r.groups), "fused": _groups(r.groups), "peak_mib": peak / 2**20,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2**11, 2**16, 2**20])
    ap.add_argument("--archs", nargs="+", default=shipped_archs())
    ap.add_argument("--cascades", nargs="+", default=list(LAYERS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-size", type=int, default=None, help="cap on Einsums per group (default: the mapper's)")
    ap.add_argument("--out", default=str(OUT / "mapper.md"))
    args = ap.parse_args(argv)
    rows = []
    for name in args.cascades:
        seqlens = [None] if name.endswith("decode") else args.seqlens
        for arch in args.archs:
            for seqlen in seqlens:
                for layers in args.layers:
                    if layers > 1 and seqlen not in (None, args.seqlens[0]):
                        continue  # whole-model runs at the first sequence length only
                    row = run_one(name, arch, seqlen, layers, args.batch, args.max_size)
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "fused"}), file=sys.stderr, flush=True)
    head = ("| cascade | arch | seqlen | layers | Einsums | candidates | space s | total s | optimal | speedup | "
            "traffic cut | peak MiB | fused groups (1 layer) |")
    lines = ["# Mapper benchmark", "", f"batch {args.batch}; models mamba-370m / mamba2-370m; "
             "times on this machine (Python, one process; CP-SAT 8 workers).", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cut = r["unfused_traffic_bytes"] / r["traffic_bytes"] if r["traffic_bytes"] else float("nan")
        fused = r["fused"] if r["layers"] == 1 else f"{r['groups']} groups"
        lines.append(f"| {r['cascade']} | {r['arch']} | {r['seqlen'] or 1} | {r['layers']} | {r['einsums']} | "
                     f"{r['candidates']} | {r['space_s']:.2f} | {r['total_s']:.2f} | {r['optimal']} | "
                     f"{r['speedup']:.2f}x | {cut:.2f}x | {r['peak_mib']:.0f} | {fused} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
