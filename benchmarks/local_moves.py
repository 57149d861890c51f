"""The mapper's optimum against every mapping one move from it, at published sizes.

Each point is mapped (``optimal_mapping``, the latency objective), then every neighbour is built and priced
(:func:`mambalaya.mapper.moves.neighbours`: two groups merged, or one split in two at any of its downsets, each new
group tiled by a full tile search): an optimum some neighbour beats is not optimal. Also a comparison row: the
hand Mamba-1 grouping of ``bench_gpu.py`` (``mamba1_gpu_mapping``), tiled by the tool, on the same arch::

    PYTHONPATH=. python benchmarks/local_moves.py --md benchmarks/results/local_moves.md [--archs A ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POINTS = [
    ("mamba1", "mamba-1.4b", {"batch": 64, "seqlen": 2048}),
    ("mamba2", "mamba2-370m", {"seqlen": 4096}),
    ("mamba1", "mamba-370m", {"seqlen": 4096}),
]


def check(cascade_name: str, model: str, params: dict, arch: str) -> dict:
    from mambalaya.mapper import evaluate, optimal_mapping
    from mambalaya.mapper.moves import neighbours
    from mambalaya.mapper.space import search_jobs
    from mambalaya.parse import open_cascade

    c = open_cascade(cascade_name, model=model, params=params)
    t = time.perf_counter()
    with search_jobs(1):
        r = optimal_mapping(c, arch)
        mapped = time.perf_counter() - t
        t = time.perf_counter()
        nb = neighbours(c, arch, r.mapping)
    row = {"cascade": cascade_name, "model": model, "params": params, "arch": arch, "optimal": r.optimal,
           "latency_s": r.report.latency_s, "groups": r.groups, "map_s": mapped,
           "neighbours_s": time.perf_counter() - t, "moves": len(nb.moves),
           "priced": sum(1 for m in nb.moves if m.reason == ""), "untried": sum(nb.untried.values()),
           "better": [{"kind": m.kind, "after": m.after, "latency_s": m.latency_s} for m in nb.better()]}
    best = nb.best()
    if best is not None:
        row["best_neighbour"] = {"kind": best.kind, "after": best.after, "latency_s": best.latency_s}
    if cascade_name == "mamba1" and _arch(arch).can_fuse:
        from benchmarks.bench_gpu import mamba1_gpu_mapping
        from mambalaya.ir.mapping import Mapping
        from mambalaya.mapper.space import shared_coster
        from mambalaya.mapper.tiling import Tiled, best_tiling

        ctx = shared_coster(c, _arch(arch), "latency").ctx
        hand = []
        for g in mamba1_gpu_mapping(c).groups:
            got = best_tiling(ctx, g.einsums)
            hand.extend([got.group] if isinstance(got, Tiled) else [best_tiling(ctx, (e,)).group for e in g.einsums])
        row["hand_latency_s"] = evaluate(c, arch, Mapping(tuple(hand), c.name, arch), ctx=ctx).latency_s
    return row


def _arch(name: str):
    from mambalaya.arch import load_arch

    return load_arch(name)


def render(rows: list[dict]) -> str:
    out = ["# The mapper's optimum against its neighbours", "",
           "`PYTHONPATH=. python benchmarks/local_moves.py --md benchmarks/results/local_moves.md`. Each point's "
           "optimum (latency objective) against every mapping one move from it: two of its groups merged, or one "
           "split in two at any downset of its members, each new group tiled by a full tile search and the whole "
           "mapping priced. \"better\" counts the neighbours that beat the optimum (0: none does). \"hand\": the "
           "hand Mamba-1 grouping of `bench_gpu.py`, tiled by the tool, as a comparison row.", "",
           "| point | arch | optimal | latency (ms) | groups | moves priced / built | better | best neighbour / optimum "
           "| hand / optimum | map s | moves s |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        point = f"{r['cascade']} {r['model']} " + ",".join(f"{k}={v}" for k, v in r["params"].items())
        best = r.get("best_neighbour")
        best = "-" if best is None else f"{best['latency_s'] / r['latency_s']:.4f}"
        hand = r.get("hand_latency_s")
        hand = "-" if hand is None else f"{hand / r['latency_s']:.3f}"
        out.append(f"| {point} | {r['arch']} | {r['optimal']} | {r['latency_s'] * 1e3:.4g} | {len(r['groups'])} | "
                   f"{r['priced']} / {r['moves']} | {len(r['better'])} | {best} | {hand} | {r['map_s']:.1f} | "
                   f"{r['neighbours_s']:.1f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from mambalaya.arch import shipped_archs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", nargs="+", default=shipped_archs())
    ap.add_argument("--md", default=None, help="write the table here (and the rows next to it as .json)")
    args = ap.parse_args(argv)
    rows = []
    for cascade, model, params in POINTS:
        for arch in args.archs:
            row = check(cascade, model, params, arch)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "groups"}), flush=True)
    text = render(rows)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
        Path(args.md).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 1 if any(r["better"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
