"""The Mambalaya paper's headline comparison: the Mambalaya-style accelerator's optimum over the MARCA baseline.

48-layer Mamba-1 (mamba-1.4b), batch 64: prefill at several context lengths and one generation (decode) step.
Every layer is the same cascade, so a layer's ratio is the model's. Latency objective, each arch's proven optimum::

    PYTHONPATH=. python benchmarks/paper_ratios.py --md benchmarks/results/paper_ratios.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(model: str, batch: int, seqlens: list[int]) -> list[dict]:
    from mambalaya.mapper import optimal_mapping
    from mambalaya.parse import open_cascade

    points = [("prefill", "mamba1", {"batch": batch, "seqlen": n}) for n in seqlens]
    points.append(("generation", "mamba1-decode", {"batch": batch}))
    rows = []
    for phase, cascade, params in points:
        c = open_cascade(cascade, model=model, params=params)
        row: dict = {"phase": phase, "seqlen": params.get("seqlen", "-")}
        for arch in ("marca", "mambalaya"):
            t = time.perf_counter()
            r = optimal_mapping(c, arch)
            row[f"{arch}_ms"] = r.report.latency_s * 1e3
            row[f"{arch}_groups"] = len(r.groups)
            row[f"{arch}_map_s"] = round(time.perf_counter() - t, 1)
        row["speedup"] = row["marca_ms"] / row["mambalaya_ms"]
        print(row, flush=True)
        rows.append(row)
    return rows


def markdown(rows: list[dict], model: str, batch: int, argv: list[str]) -> str:
    out = [f"# Mambalaya accelerator over MARCA: {model} (48 layers), batch {batch}", "",
           f"`PYTHONPATH=. python benchmarks/paper_ratios.py {' '.join(argv)}`. Latency per layer of each arch's "
           "optimum (MARCA: unfused, its optimum is the unfused mapping); the model's ratio is the layer's.", "",
           "| phase | seqlen | MARCA ms | Mambalaya ms | speedup | Mambalaya groups | mapped in s |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {r['phase']} | {r['seqlen']} | {r['marca_ms']:.4g} | {r['mambalaya_ms']:.4g} | {r['speedup']:.2f}x | "
            f"{r['mambalaya_groups']} | {r['mambalaya_map_s']} |" for r in rows]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mamba-1.4b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seqlen", type=int, action="append", help="prefill tokens (default 2^11, 2^14, 2^17, 2^20)")
    ap.add_argument("--md", type=Path)
    a = ap.parse_args()
    rows = measure(a.model, a.batch, a.seqlen or [2048, 16384, 131072, 1048576])
    if a.md:
        from mambalaya.fileio import write_atomic

        write_atomic(a.md, markdown(rows, a.model, a.batch, sys.argv[1:]))


if __name__ == "__main__":
    main()
