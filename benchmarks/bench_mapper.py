"""Time-to-optimal of the exact mapper: Einsums and layers (1, 8, 64) x archs x sequence lengths.

Writes ``benchmarks/results/mapper.md`` (and ``mapper.json``): per run the Einsum count,
candidates, space-construction and total solve time, whether optimality was proven, the
modelled speedup over unfused, the groups fused and the peak process RSS (getrusage). Targets: one layer < 1 s per arch, 64 layers < 30 s, < 1 GiB.

    PYTHONPATH=. python benchmarks/bench_mapper.py [--layers 1 8 64] [--seqlens 2048 16384 131072 1048576]
    PYTHONPATH=. python benchmarks/bench_mapper.py --optimum          # groups per arch, seqlen 4096
    PYTHONPATH=. python benchmarks/bench_mapper.py --render a.json b.json   # merge runs into mapper.md
    PYTHONPATH=. python benchmarks/bench_mapper.py --published [--archs A ...]   # the user's view, below

``--published`` times what a user runs: ``mambalaya map ... --json``, one fresh process per point (nothing
cached, OR-Tools and the cascade loaded inside the wall time), at the shipped cascades' default sizes and at
published sizes (mamba2-370m and mamba-370m at seqlen 4096, mamba-1.4b at batch 64 seqlen 2048, mamba2-2.7b at
seqlen 16384; 64 layers of the 370m models at seqlen 2048), on every arch: the CLI's wall time, the mapping time
it reports (``solve_s``: space construction and solve), the optimum and the process's peak RSS. Writes
``benchmarks/results/mapper_published.md`` (and ``.json``).

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
import os
import resource
import subprocess
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


#: (cascade, model or None for the default sizes, --set params, layers, archs or None for all): ``--published``
PUBLISHED = [("mamba2", None, {}, 1, None), ("mamba1", None, {}, 1, None), ("mamba2-decode", None, {}, 1, None),
             ("mamba1-decode", None, {}, 1, None),
             ("mamba2", "mamba2-370m", {"seqlen": 4096}, 1, None), ("mamba1", "mamba-370m", {"seqlen": 4096}, 1, None),
             ("mamba1", "mamba-1.4b", {"batch": 64, "seqlen": 2048}, 1, None),
             ("mamba2", "mamba2-2.7b", {"seqlen": 16384}, 1, None),
             ("mamba2", "mamba2-370m", {"seqlen": 2048}, 64, ("mambalaya", "marca")),
             ("mamba1", "mamba-370m", {"seqlen": 2048}, 64, ("mambalaya", "marca"))]


def cli_point(name: str, model: str | None, params: dict, layers: int, arch: str, timeout: float) -> dict:
    """One ``mambalaya map --json`` in a fresh process: its wall time, the mapping time it reports, its peak RSS."""
    cmd = [sys.executable, "-m", "mambalaya.cli", "map", name, "--arch", arch, "--json"]
    cmd += ["--model", model] if model else []
    cmd += [x for k, v in params.items() for x in ("--set", f"{k}={v}")]
    cmd += ["--layers", str(layers)] if layers > 1 else []
    row = {"cascade": name, "model": model or "default", "params": params, "layers": layers, "arch": arch}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return row | {"wall_s": time.perf_counter() - t0, "error": f"over {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # (the largest child so far)
    if proc.returncode:
        return row | {"wall_s": wall, "error": (err.strip().splitlines() or ["exit " + str(proc.returncode)])[-1]}
    got = json.loads(out)
    return row | {"wall_s": wall, "map_s": got["solve_s"], "peak_mib_so_far": rss, "optimal": got["optimal"],
                  "latency_s": got["latency_s"], "speedup": got["speedup"], "candidates": got["candidates"],
                  "pruned": got.get("pruned"), "groups": len(got["groups"])}


def _pruned(p: dict | None) -> str:
    return "-" if not p else f"{p.get('by_cover_bound', 0)} / {p.get('dominated_by_split', 0)} / {p.get('searched', 0)}"


def published(archs: list[str], timeout: float, out: Path) -> int:
    rows = []
    for name, model, params, layers, only in PUBLISHED:
        for arch in [a for a in archs if only is None or a in only]:
            row = cli_point(name, model, params, layers, arch, timeout)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")  # (a killed run keeps its rows)
    head = "| cascade | model | sizes | layers | arch | map s | CLI wall s | optimal | latency | groups | candidates | pruned: by bound / by split / searched |"
    lines = ["# The mapper as a user runs it", "",
             f"`mambalaya map CASCADE [--model M] [--set k=v] [--layers N] --arch A --json`, one fresh process a point, "
             f"on {os.cpu_count()} cores ({time.strftime('%Y-%m-%d')}): `map s` is the mapping time the CLI reports "
             "(`solve_s`: space construction and solve), `CLI wall s` the whole process (Python start, imports, "
             "parsing, report). Command: `PYTHONPATH=. python benchmarks/bench_mapper.py --published`. "
             f"Peak RSS of the largest process: {max((r.get('peak_mib_so_far', 0) for r in rows), default=0):.0f} MiB.",
             "", head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        sizes = ", ".join(f"{k}={v}" for k, v in r["params"].items()) or "-"
        if "error" in r:
            lines.append(f"| {r['cascade']} | {r['model']} | {sizes} | {r['layers']} | {r['arch']} | - | "
                         f"{r['wall_s']:.1f} | {r['error']} | | | | |")
            continue
        lines.append(f"| {r['cascade']} | {r['model']} | {sizes} | {r['layers']} | {r['arch']} | {r['map_s']:.2f} | "
                     f"{r['wall_s']:.2f} | {r['optimal']} | {r['latency_s'] * 1e3:.4g} ms | {r['groups']} | "
                     f"{r['candidates']} | {_pruned(r['pruned'])} |")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


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
    ap.add_argument("--published", action="store_true", help="the CLI at default and published sizes (docstring)")
    ap.add_argument("--timeout", type=float, default=600.0, help="--published: seconds a point may take")
    args = ap.parse_args(argv)
    if args.published:
        return published(args.archs, args.timeout, OUT / "mapper_published.md")
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
