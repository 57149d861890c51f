"""What ``mambalaya map`` prints: a mapping's cost next to the unfused baseline.

``map_report`` returns the ``map --json`` object (``arch``,
``objective``, ``groups``, ``traffic_bytes``, ``latency_s``, ``optimal``,
``solve_s``, ``unfused``, ``einsums``); ``format_map_report`` renders the same
dict as rich tables for a terminal.
"""

from __future__ import annotations

import io
import time
from typing import Any

from mambalaya.arch import Arch, load_arch
from mambalaya.arch.units import fmt_bytes, fmt_change, fmt_time
from mambalaya.cost.context import CostContext
from mambalaya.cost.latency import LATENCY_PARTS
from mambalaya.cost.model import CostReport, evaluate
from mambalaya.errors import MambalayaError
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import Mapping
from mambalaya.mapper.heuristics import greedy_mapping, unfused_baseline
from mambalaya.mapper.space import OBJECTIVES


def _score(report: CostReport, objective: str) -> tuple[float, float]:
    return (
        (report.latency_s, report.traffic_bytes)
        if objective == "latency"
        else (report.traffic_bytes, report.latency_s)
    )


def map_report(
    cascade: Cascade,
    arch: Arch | str,
    mapping: Mapping | None = None,
    *,
    objective: str = "latency",
    optimal: bool = False,
    solve_s: float | None = None,
    method: str | None = None,
    ctx: CostContext | None = None,
) -> dict[str, Any]:
    """The ``map`` JSON: ``mapping`` evaluated, or (without one) the better of greedy and unfused. The
    unfused figures are every Einsum alone at its best tiling (:func:`unfused_baseline`).

    ``optimal``/``solve_s``/``method`` let an optimiser that found ``mapping`` say so.
    """
    if objective not in OBJECTIVES:
        raise MambalayaError(f"unknown objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    arch = load_arch(arch) if isinstance(arch, str) else arch
    start = time.perf_counter()
    ctx = ctx or CostContext(cascade, arch)
    unfused = evaluate(cascade, arch, unfused_baseline(cascade, arch, ctx=ctx), ctx=ctx)
    if mapping is not None:
        chosen, how = evaluate(cascade, arch, mapping, ctx=ctx), method or "file"
    elif not arch.can_fuse:
        chosen, how = unfused, "unfused"
    else:
        greedy = evaluate(cascade, arch, greedy_mapping(cascade, arch, ctx=ctx), ctx=ctx)
        chosen, how = (
            (greedy, "greedy")
            if _score(greedy, objective) <= _score(unfused, objective)
            else (unfused, "unfused")
        )
    elapsed = time.perf_counter() - start
    return {
        "cascade": cascade.name,
        "arch": arch.name,
        "objective": objective,
        "method": how,
        "optimal": optimal,
        "solve_s": elapsed if solve_s is None else solve_s,
        **chosen.summary(),
        "mapping": chosen.mapping.to_dict(),
        "unfused": unfused.summary(),
        "speedup": unfused.latency_s / chosen.latency_s if chosen.latency_s > 0 else None,
        "traffic_reduction": unfused.traffic_bytes / chosen.traffic_bytes if chosen.traffic_bytes else None,
        "einsums": [e.to_json() for e in chosen.einsums],
        "group_costs": [g.to_json() for g in chosen.groups],
        "params": dict(cascade.params),
    }


def _value(v: float, objective: str) -> str:
    return fmt_time(v) if objective == "latency" else fmt_bytes(v)


def _count(n: float) -> str:
    return f"{n:.2g}".replace("e+0", "e").replace("e+", "e")


def format_map_report(result: dict[str, Any], width: int = 120) -> str:
    """Rich tables for a terminal: the headline next to unfused, then one row per Einsum."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=width, record=True, file=io.StringIO(), force_terminal=False, color_system=None)
    head = Table(
        title=f"{result['cascade']} on {result['arch']} ({result['method']}, objective "
        f"{result['objective']}{', optimal' if result['optimal'] else ''})"
    )
    for col in ("mapping", "groups", "traffic", "latency", "compute", "memory", "overhead"):
        head.add_column(col, justify="left" if col == "mapping" else "right")
    for name, fig in (("chosen", result), ("unfused", result["unfused"])):
        head.add_row(
            name,
            str(len(fig["groups"])),
            fmt_bytes(fig["traffic_bytes"]),
            fmt_time(fig["latency_s"]),
            fmt_time(fig["compute_s"]),
            fmt_time(fig["memory_s"]),
            fmt_time(fig["overhead_s"]),
        )
    console.print(head)
    if "latency_parts" in result:  # (the columns overlap: this is how the latency adds up)
        console.print(f"chosen latency {fmt_time(result['latency_s'])} = " + " + ".join(
            f"{LATENCY_PARTS[k]} {fmt_time(v)}" for k, v in result["latency_parts"].items() if v > 0 or k == "roofline_s"))
    if result.get("left_out"):
        console.print(f"not proven optimal: the search left out {result['left_out']}")
    if cert := result.get("certificate"):
        pruned = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in cert["pruned"].items() if v)
        console.print(f"{'proven optimal' if cert['proven'] else 'not proven optimal'} over {cert['over']}: "
                      f"{cert['candidates']} candidates, {cert['searched']} group searches"
                      f"{f', {pruned}' if pruned else ''}; lower bound {_value(cert['lower_bound'], cert['objective'])}"
                      f" for {_value(cert['value'], cert['objective'])}; {cert['tilings']}")
    if nb := result.get("neighbours"):
        best, better = nb["best"], nb["better"]
        untried = f", {nb['untried']} splits untried" if nb["untried"] else ""
        if better:
            said = f"{len(better)} better: " + "; ".join(
                f"{m['kind']} -> {' | '.join(', '.join(g) for g in m['after'])} {fmt_time(m['latency_s'])}"
                for m in better[:3])
        else:
            said = "none better" + (f"; the best {best['ratio']:.4f}x the chosen one" if best and best["ratio"] else "")
        console.print(f"neighbours: {nb['built']} mappings one move away, {nb['priced']} priced{untried}: {said}")
    if result.get("speedup"):
        console.print(
            f"speedup over unfused {result['speedup']:.2f}x, traffic "
            f"{fmt_change(result['traffic_reduction'] or 0.0, 1.0)}; solved in {result['solve_s']:.2f} s"
        )
    rows = Table(title="per Einsum")
    for col in ("einsum", "group", "traffic", "memory", "compute", "latency", "FLOP/B", "bound", "ops"):
        rows.add_column(col, justify="left" if col in ("einsum", "bound", "ops") else "right")
    for e in result["einsums"]:
        ops = ", ".join(f"{k} {_count(v)}" for k, v in sorted(e["ops"].items(), key=lambda kv: -kv[1])[:2])
        oi = e["intensity"]
        rows.add_row(
            e["name"],
            str(e["group"]),
            fmt_bytes(e["traffic_bytes"]),
            fmt_time(e["memory_s"]),
            fmt_time(e["compute_s"]),
            fmt_time(e["latency_s"]),
            "-" if oi is None else f"{oi:.3g}",
            e["bound"],
            ops,
        )
    console.print(rows)
    return console.export_text()


__all__ = ["OBJECTIVES", "format_map_report", "map_report"]
