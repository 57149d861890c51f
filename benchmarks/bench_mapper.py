"""Time-to-optimal of the exact mapper: Einsums and layers (1, 8, 64) x archs x sequence lengths.

Writes ``benchmarks/results/mapper.md`` (and ``mapper.json``): per run the Einsum count,
candidates, space-construction and total solve time, whether optimality was proven, the
modelled speedup over unfused, the groups fused and the peak process RSS (getrusage). Targets: one layer < 1 s per arch, 64 layers < 30 s, < 1 GiB.

    PYTHONPATH=. python benchmarks/bench_mapper.py [--layers 1 8 64] [--seqlens 2048 16384 131072 1048576]
    PYTHONPATH=. python benchmarks/bench_mapper.py --optimum          # groups per arch, seqlen 4096
    PYTHONPATH=. python benchmarks/bench_mapper.py --render a.json b.json   # merge runs into mapper.md

The committed results (``benchmarks/results/mapper.md``) come from:

    PYTHONPATH=. python benchmarks/bench_mapper.py --cascades mamba2 mamba1 --seqlens 2048 1048576 --layers 1 --json-out /tmp/one.json
    PYTHONPATH=. python benchmarks/bench_mapper.py --cascades mamba2 mamba1 --archs h200 --seqlens 2048 --layers 1 8 64 --cold-only --json-out /tmp/layers.json
    PYTHONPATH=. python benchmarks/bench_mapper.py --optimum --json-out /tmp/opt.json
    PYTHONPATH=. python benchmarks/bench_mapper.py --render /tmp/one.json /tmp/layers.json /tmp/opt.json

Each run is timed cold (the arch-independent analysis cache emptied) and, unless ``--cold-only``, warm.
``--render`` keeps the hand-written ``## Notes`` section of the existing ``mapper.md``.

Peer (AccelForge) comparison, timed side by side in one run: ``benchmarks/bench_accelforge.py``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from mambalaya.arch import load_arch, shipped_archs
from mambalaya.ir.chain import chain_layers
from mambalaya.mapper import evaluate, optimal_mapping
from mambalaya.mapper.space import clear_shared
from mambalaya.parse import open_cascade

OUT = Path(__file__).resolve().parent / "results"
LAYERS = {"mamba1": "mamba-370m", "mamba2": "mamba2-370m", "mamba1-decode": "mamba-370m",
          "mamba2-decode": "mamba2-370m"}


def _groups(groups: list[list[str]]) -> str:
    fused = [g for g in groups if len(g) > 1]
    return " ".join("[" + ",".join(g) + "]" for g in fused) or "none"


def run_one(name: str, arch: str, seqlen: int | None, layers: int, batch: int, max_size: int | None,
            time_limit: float | None = None, warm_too: bool = True) -> dict:
    """One mapping, timed cold (the arch-independent analysis cache emptied first) and warm (again,
    the analysis shared, as every arch after the first of a cascade gets it)."""
    params = {"batch": batch} | ({"seqlen": seqlen} if seqlen else {})
    c = open_cascade(name, model=LAYERS[name], params=params)
    a = load_arch(arch)
    clear_shared()
    t0 = time.perf_counter()  # timed without tracemalloc (it slows Python 2-3x); memory is the RSS peak
    r = optimal_mapping(c, a, max_size=max_size, layers=layers, time_limit_s=time_limit)
    wall = time.perf_counter() - t0
    warm = float("nan")
    if warm_too:
        t0 = time.perf_counter()
        optimal_mapping(c, a, max_size=max_size, layers=layers, time_limit_s=time_limit)
        warm = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    unfused = evaluate(chain_layers(c, layers) if layers > 1 else c, a)
    return {"cascade": name, "arch": arch, "seqlen": seqlen, "batch": batch, "layers": layers,
            "einsums": len(c.einsums), "candidates": r.candidates, "space_s": r.space_s, "total_s": wall,
            "warm_s": warm,
            "optimal": r.optimal, "gap": r.gap, "latency_s": r.report.latency_s,
            "unfused_latency_s": unfused.latency_s, "speedup": unfused.latency_s / r.report.latency_s,
            "traffic_bytes": r.report.traffic_bytes, "unfused_traffic_bytes": unfused.traffic_bytes,
            "groups": len(r.groups), "fused": _groups(r.groups), "peak_mib": peak / 2**20, "method": r.method,
            "subproblems": r.nodes,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2**11, 2**14, 2**17, 2**20])
    ap.add_argument("--optimum", action="store_true", help="prefill at seqlen 4096 and decode, 1 layer, all archs")
    ap.add_argument("--json-out", default=None, help="write the rows here and skip the Markdown")
    ap.add_argument("--render", nargs="+", default=None, help="JSON row files to merge into --out")
    ap.add_argument("--archs", nargs="+", default=shipped_archs())
    ap.add_argument("--cascades", nargs="+", default=list(LAYERS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-size", type=int, default=None, help="cap on Einsums per group (default: the mapper's)")
    ap.add_argument("--out", default=str(OUT / "mapper.md"))
    ap.add_argument("--time-limit", type=float, default=None, help="solver time limit per run (s)")
    ap.add_argument("--cold-only", action="store_true", help="skip the warm (second) run")
    args = ap.parse_args(argv)
    from ortools.linear_solver import pywraplp  # noqa: F401  (import cost, once per process, not timed)
    if args.render:
        rows = [r for f in args.render for r in json.loads(Path(f).read_text())]
        return _render(rows, args)
    if args.optimum:
        args.seqlens, args.layers = [4096], [1]
    rows = []
    for name in args.cascades:
        seqlens = [None] if name.endswith("decode") else args.seqlens
        for arch in args.archs:
            for seqlen in seqlens:
                for layers in args.layers:
                    if layers > 1 and seqlen not in (None, args.seqlens[0]):
                        continue  # whole-model runs at the first sequence length only
                    row = run_one(name, arch, seqlen, layers, args.batch, args.max_size, args.time_limit,
                                  not args.cold_only)
                    row["optimum"] = args.optimum
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "fused"}), file=sys.stderr, flush=True)
                    if args.json_out:  # written after every run, so a killed run keeps what it finished
                        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    return _render(rows, args)


def _secs(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.2f}"


def _render(rows: list[dict], args) -> int:
    head = ("| cascade | arch | seqlen | layers | Einsums | candidates | space s (cold) | cold s | warm s | optimal "
            "| gap | speedup vs unfused | traffic cut | peak MiB | fused groups (1 layer) |")
    lines = ["# Mapper benchmark", "", f"batch {args.batch}; models mamba-370m / mamba2-370m; "
             "wall times (space construction + solve, Python, one process, OR-Tools imported "
             "beforehand). cold: the arch-independent group analysis built from scratch (the first arch "
             "of a cascade); warm: the same run again with it shared (every later arch). Peak MiB is "
             "the process's peak RSS so far (it only grows). Targets: one layer < 1 s per arch, "
             "64 layers < 30 s, < 1 GiB.", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r.get("optimum"):
            continue
        cut = r["unfused_traffic_bytes"] / r["traffic_bytes"] if r["traffic_bytes"] else float("nan")
        fused = r["fused"] if r["layers"] == 1 else f"{r['groups']} groups"
        lines.append(f"| {r['cascade']} | {r['arch']} | {r['seqlen'] or 1} | {r['layers']} | {r['einsums']} | "
                     f"{r['candidates']} | {r['space_s']:.2f} | {r['total_s']:.2f} | "
                     f"{_secs(r.get('warm_s'))} | {r['optimal']} | {r.get('gap') or 0:.2g} | "
                     f"{r['speedup']:.2f}x | {cut:.2f}x | {r['peak_mib']:.0f} | {fused} |")
    opt = [r for r in rows if r.get("optimum")]
    if opt:
        lines += ["", "## What the optimum says (1 layer, batch 64, prefill seqlen 4096; decode one token)", "",
                  "| cascade | arch | speedup over unfused | traffic cut | groups | fused groups |", "|---|---|---|---|---|---|"]
        for r in opt:
            cut = r["unfused_traffic_bytes"] / r["traffic_bytes"] if r["traffic_bytes"] else float("nan")
            lines.append(f"| {r['cascade']} | {r['arch']} | {r['speedup']:.2f}x | {cut:.2f}x | {r['groups']} | "
                         f"{r['fused']} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    notes = out.read_text().partition("\n## Notes")[2] if out.exists() else ""
    out.write_text("\n".join(lines) + "\n" + (f"\n## Notes{notes}" if notes else ""))  # hand-written notes kept
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
