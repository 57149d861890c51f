"""Per-Einsum cost tables of a layer on every shipped architecture (unfused and optimal).

    python benchmarks/per_einsum_tables.py --model mamba2-370m --set seqlen=4096 > benchmarks/results/mamba2_per_einsum.md
    python benchmarks/per_einsum_tables.py --cascade mamba2-decode --model mamba2-370m > ...

Rows are the paper's columns: Einsum, fusion group, off-chip traffic, memory time, compute time,
final latency (the Einsum's share of its group's roofline latency), and which roof binds.
"""

from __future__ import annotations

import argparse

from mambalaya.arch import load_arch, shipped_archs
from mambalaya.mapper import evaluate, optimal_mapping
from mambalaya.parse import open_cascade, parse_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cascade", default="mamba2")
    ap.add_argument("--model", default="mamba2-370m")
    ap.add_argument("--set", action="append")
    args = ap.parse_args()
    cascade = open_cascade(args.cascade, model=args.model, params=parse_set(args.set))
    sizes = ", ".join(f"{k}={v}" for k, v in cascade.params.items())
    print(f"# {cascade.name} ({args.model}): per-Einsum costs\n\n{sizes}\n")
    for name in shipped_archs():
        arch = load_arch(name)
        unfused = evaluate(cascade, arch)
        best = optimal_mapping(cascade, arch)
        fused = best.report
        print(f"## {name}: unfused {unfused.latency_s * 1e6:,.1f} us, {unfused.traffic_bytes / 1e6:,.1f} MB -> "
              f"optimal {fused.latency_s * 1e6:,.1f} us, {fused.traffic_bytes / 1e6:,.1f} MB "
              f"({unfused.latency_s / fused.latency_s:.2f}x; {len(best.mapping.groups)} groups, "
              f"optimal={best.optimal})\n")
        print("| einsum | unfused MB | mem us | compute us | latency us | bound | fused group | fused latency us |")
        print("|---|---:|---:|---:|---:|---|---:|---:|")
        fused_rows = {e.name: e for e in fused.einsums}
        for e in unfused.einsums:
            f = fused_rows[e.name]
            bound = "memory" if e.memory_s >= e.compute_s else "compute"
            print(f"| {e.name} | {e.traffic_bytes / 1e6:,.2f} | {e.memory_s * 1e6:,.2f} | {e.compute_s * 1e6:,.2f} | "
                  f"{e.latency_s * 1e6:,.2f} | {bound} | {f.group} | {f.latency_s * 1e6:,.2f} |")
        print()


if __name__ == "__main__":
    main()
