"""The ``cpu`` arch's model against the Numba executor, group by group: the evidence for ``archs/cpu.yaml``.

Maps each layer with the mapper's ``cpu`` optimum (and, for contrast, the ``mambalaya`` accelerator's optimum, whose
small tiles a CPU pays for), runs every group through the Numba backend (2 threads, float32, best of ``--repeat``)
and writes per group: measured ms, the roofline part of the prediction (compute, memory; no per-statement
overhead), the statements it executes, and the prediction with ``overheads.per_statement``. ``--fit`` prints the
least-squares fit of the element-wise rate and the per-statement time.

    PYTHONPATH=. python benchmarks/cpu_groups.py --json-out benchmarks/results/cpu_groups.json --md benchmarks/results/cpu_groups.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

POINTS = [("mamba2", "mamba2-130m", 2048), ("mamba1", "mamba-130m", 2048)]


def measure(repeat: int, archs: list[str]) -> list[dict]:
    from bench_executor import MIXER_PARAMS, _input, _mixer
    from hf_reference import mixer_arrays

    from mambalaya.arch import load_arch
    from mambalaya.cost.context import CostContext
    from mambalaya.cost.model import group_costs
    from mambalaya.exec.backend import execute
    from mambalaya.exec.realweights import bind_weights
    from mambalaya.mapper import optimal_mapping
    from mambalaya.parse import open_cascade
    from mambalaya.schedule import lower_mapping

    rows = []
    for family, model, seqlen in POINTS:
        cascade = open_cascade(family, model=model, params={"batch": 1, "seqlen": seqlen})
        v = cascade.values  # transformers' own initialisation (random weights decay to subnormals: slow, not typical)
        inputs = bind_weights(cascade, mixer_arrays(_mixer(family, {k: v[k] for k in MIXER_PARAMS if k in v})))
        inputs["U"] = _input(seqlen, v["d_model"])
        for label in archs:
            name, _, rest = label.partition(":")
            changes = dict(kv.split("=", 1) for kv in rest.split(",")) if rest else {}
            arch = load_arch(name).with_overrides(**changes)
            cpu = load_arch("cpu").with_overrides(**changes)  # what runs it: this CPU (with the same overrides)
            free = cpu.with_overrides(statement_overhead_s=0.0)
            t0 = time.perf_counter()
            mapping = optimal_mapping(cascade, arch).mapping
            map_s = time.perf_counter() - t0
            sched = lower_mapping(cascade, mapping, arch)
            best = None
            for _ in range(repeat + 1):  # (the first compiles)
                r = execute(cascade, sched, inputs, "numba", "float32")
                best = r.group_s if best is None else [min(a, b) for a, b in zip(best, r.group_s, strict=True)]
            ctx_cpu, ctx_free = CostContext(cascade, cpu), CostContext(cascade, free)
            for g, t in zip(sched.groups, best, strict=True):
                paid, plain = group_costs(ctx_cpu, g)[0], group_costs(ctx_free, g)[0]
                rows.append({"model": model, "seqlen": seqlen, "mapped_for": label, "map_s": round(map_s, 1),
                             "group": "+".join(g.einsums), "measured_ms": t * 1e3, "roofline_ms": plain.latency_s * 1e3,
                             "compute_ms": plain.compute_s * 1e3, "memory_ms": plain.memory_s * 1e3,
                             "executions": g.executions, "predicted_ms": paid.latency_s * 1e3})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def fit(rows: list[dict]) -> tuple[float, float]:
    """(k, t): least squares of measured = k x the spec's compute time + t x executions over the groups of the cpu
    optimum (the element-wise rate the printed loops reach is the spec's over k; t the time per statement)."""
    rows = [r for r in rows if r["mapped_for"].partition(":")[0] == "cpu"]
    a = np.array([[r["compute_ms"], r["executions"]] for r in rows], float)
    y = np.array([r["measured_ms"] for r in rows])
    (k, t), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(k), float(max(0.0, t)) * 1e-3


def markdown(rows: list[dict], argv: list[str]) -> str:
    out = ["# The cpu arch's model against the Numba executor, per group", "",
           f"`PYTHONPATH=. python benchmarks/cpu_groups.py {' '.join(argv)}` (2 threads, float32, best run per group). "
           "`roofline`: the prediction without the per-statement overhead; `predicted`: with it "
           "(`archs/cpu.yaml` as committed).", "",
           "| model | mapped for | group | executions | measured ms | roofline ms | predicted ms | measured / predicted |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['model']} L{r['seqlen']} | {r['mapped_for']} | {r['group']} | {r['executions']} | "
                   f"{r['measured_ms']:.2f} | {r['roofline_ms']:.2f} | {r['predicted_ms']:.2f} | "
                   f"{r['measured_ms'] / r['predicted_ms']:.2f} |")
    tot: dict[tuple, list[float]] = {}
    for r in rows:
        t = tot.setdefault((r["model"], r["mapped_for"]), [0.0, 0.0])
        t[0] += r["measured_ms"]
        t[1] += r["predicted_ms"]
    out += ["", "| model | mapped for | layer measured ms | predicted ms | measured / predicted |", "|---|---|---:|---:|---:|"]
    out += [f"| {m} | {a} | {v[0]:.1f} | {v[1]:.1f} | {v[0] / v[1]:.2f} |" for (m, a), v in tot.items()]
    k, t = fit(rows)
    out += ["", f"Least squares over the groups of every cpu optimum above: measured = {k:.2f} x the spec's compute time + "
            f"{t * 1e6:.1f} us per executed statement."]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--arch", action="append", help="whose optimum to run, NAME or NAME:key=value,... with arch overrides "
                    "(default: cpu, cpu with its 4 MiB L2 as the buffer, and mambalaya)")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--from-json", type=Path, help="only re-render this file's rows")
    a = ap.parse_args()
    rows = json.loads(a.from_json.read_text()) if a.from_json else measure(a.repeat, a.arch or ["cpu", "cpu:fusion_buffer_bytes=4MiB", "mambalaya"])
    if a.json_out:
        a.json_out.write_text(json.dumps(rows, indent=1))
    k, t = fit(rows)
    print(f"least squares: measured = {k:.2f} x compute + {t * 1e6:.1f} us per statement")
    if a.md:
        a.md.write_text(markdown(rows, sys.argv[1:]))


if __name__ == "__main__":
    main()
