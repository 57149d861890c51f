"""Everything a report says, computed once as plain tables, so the Markdown and HTML agree.

A :class:`Study` is one cascade on several architectures: per arch the optimal
mapping (:func:`mambalaya.mapper.optimal_mapping`), the unfused baseline, and per
fusion group what fusing it saves. Renderers only format what is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mambalaya.analysis import Edge, classify_edges, einsum_kind
from mambalaya.analysis.table import edge_modifiers
from mambalaya.arch import Arch, load_arch
from mambalaya.cost.context import CostContext
from mambalaya.cost.latency import LATENCY_PARTS
from mambalaya.cost.model import CostReport
from mambalaya.ir.cascade import Cascade
from mambalaya.mapper import MapResult, evaluate, optimal_mapping
from mambalaya.mapper.heuristics import unfused_baseline
from mambalaya.report.fmt import fmt_bytes, fmt_num, fmt_pct, fmt_rate, fmt_ratio, fmt_time

#: The per-Einsum table's columns (the ``map --json`` contract's), CSV names.
EINSUM_COLUMNS = (
    "einsum", "group", "traffic_bytes", "memory_s", "compute_s", "latency_s", "compute_util", "memory_util",
    "intensity", "bound", "flops",
)


@dataclass(frozen=True)
class Table:
    """A titled table of already-formatted cells."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...] = ()  # right-align these columns


@dataclass(frozen=True)
class ArchStudy:
    """One architecture: the optimal mapping, the unfused baseline and the per-group savings."""

    arch: Arch
    result: MapResult
    unfused: CostReport
    buffers: tuple[int, ...]  # on-chip bytes each group's schedule holds at once

    @property
    def report(self) -> CostReport:
        return self.result.report

    @property
    def speedup(self) -> float:
        return self.unfused.latency_s / self.report.latency_s if self.report.latency_s > 0 else float("nan")

    @property
    def traffic_saved(self) -> int:
        return self.unfused.traffic_bytes - self.report.traffic_bytes


@dataclass(frozen=True)
class Study:
    cascade: Cascade
    edges: tuple[Edge, ...]
    archs: tuple[ArchStudy, ...]
    objective: str


def study(cascade: Cascade, archs: list[Arch | str], objective: str = "latency") -> Study:
    """Map ``cascade`` optimally on every arch (MappingError when one has no feasible mapping)."""
    out = []
    for spec in archs:
        arch = load_arch(spec) if isinstance(spec, str) else spec
        result = optimal_mapping(cascade, arch, objective)
        ctx = CostContext(cascade, arch)
        unfused = evaluate(cascade, arch, unfused_baseline(cascade, arch, ctx=ctx), ctx=ctx)
        buffers = tuple(g.occupancy_bytes for g in result.report.schedule.groups)
        out.append(ArchStudy(arch, result, unfused, buffers))
    return Study(cascade, classify_edges(cascade), tuple(out), objective)


# ---- tables -------------------------------------------------------------------------------------


def params_table(c: Cascade) -> Table:
    return Table(("param", "value"), tuple((k, fmt_num(v, 6)) for k, v in c.params.items()), (False, True))


def ranks_table(c: Cascade) -> Table:
    sizes = c.rank_sizes
    return Table(
        ("rank", "size expression", "size"),
        tuple((r, str(expr), f"{sizes[r]:,}") for r, expr in c.rank_exprs.items()),
        (False, False, True),
    )


def tensors_table(c: Cascade) -> Table:
    rows = []
    for name, t in c.tensors.items():
        shape = "×".join(str(n) for n in c.shape(name)) or "scalar"
        rows.append((name, t.role, t.dtype, shape, fmt_bytes(c.nbytes(name))))
    return Table(("tensor", "role", "dtype", "shape", "size"), tuple(rows), (False, False, False, False, True))


def einsums_table(c: Cascade) -> Table:
    rows = tuple((f"E{i + 1}", e.name, einsum_kind(c, e), e.text) for i, e in enumerate(c.einsums))
    return Table(("#", "einsum", "kind", "text"), rows)


def edges_table(s: Study) -> Table:
    rows = []
    for e in s.edges:
        shared = " ".join(p if p == q else f"{p}~{q}" for p, q in e.shared) or "-"
        rows.append(
            (e.producer, e.consumer, e.tensor, e.fusion_class, shared, " ".join(e.private_producer) or "-",
             " ".join(e.private_consumer) or "-", edge_modifiers(e) or "-")
        )
    cols = ("producer", "consumer", "tensor", "class", "shared ranks", "private P", "private C", "modifiers")
    return Table(cols, tuple(rows))


def _on_chip(c: Cascade, members: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Intermediates a group keeps on chip, and those it still writes for later groups."""
    inside, spilled = [], []
    for e in members:
        consumers = [x for x in c.consumers(e) if x != e]
        if consumers and any(x in members for x in consumers):
            (inside if all(x in members for x in consumers) else spilled).append(e)
    return inside, spilled


def groups_table(s: Study, a: ArchStudy) -> Table:
    """Per fusion group: members, schedule, buffer need against capacity, and what fusing saves."""
    unfused = {e.name: e for e in a.unfused.einsums}
    cap = a.arch.fusion_buffer_bytes
    rows = []
    for g, cost, need in zip(a.result.mapping.groups, a.report.groups, a.buffers, strict=True):
        base_t = sum(unfused[e].traffic_bytes for e in g.einsums)
        base_l = sum(unfused[e].latency_s for e in g.einsums)
        inside, _ = _on_chip(s.cascade, g.einsums)
        tiles = ", ".join(f"{r}={t}" for r, t in g.tiles.items()) or "untiled"
        rows.append(
            (
                str(cost.index),
                " + ".join(g.einsums),
                " ".join(g.loop_order) or "-",
                tiles,
                f"{fmt_bytes(need)} ({fmt_pct(need / cap)})" if len(g.einsums) > 1 else "-",
                ", ".join(inside) or "-",
                fmt_bytes(cost.traffic_bytes),
                fmt_bytes(base_t - cost.traffic_bytes) if len(g.einsums) > 1 else "-",
                fmt_time(cost.latency_s),
                fmt_ratio(base_l / cost.latency_s) if len(g.einsums) > 1 and cost.latency_s > 0 else "-",
            )
        )
    cols = ("group", "einsums", "loop order", "tiles", "buffer (of capacity)", "kept on chip", "traffic",
            "traffic saved", "latency", "speedup vs unfused")
    return Table(cols, tuple(rows), (True, False, False, False, True, False, True, True, True, True))


def codegen_table(s: Study, a: ArchStudy) -> Table | None:
    """On a GPU arch, how ``--backend triton`` runs each group's schedule: one generated kernel (its program
    grid: the schedule's leading parallel tile loops, and its tl.dot contractions) or, where the printer
    cannot express the group, why it runs on the reference fallback. None on other archs.

    A group whose grid has fewer programs than the GPU has SMs runs on part of the chip."""
    if a.arch.kind != "gpu":
        return None
    from mambalaya.exec.triton_codegen import Unsupported, group_kernel_source

    rows = []
    units = max((b.instances for b in a.arch.buffers), default=1)  # SMs: the per-SM buffers' instances
    for g in a.report.schedule.groups:
        try:
            k = group_kernel_source(s.cascade, g, "float32")
        except Unsupported as err:
            rows.append((str(g.index), " + ".join(g.einsums), "reference fallback", "-", "-", "-", str(err)))
            continue
        grid = " ".join(f"{lp.rank}/{lp.tile}x{lp.trips}" for lp in g.loops[:g.grid]) or "one program"
        few = f" (fewer than the {units} SMs)" if k.programs < units else ""
        rows.append((str(g.index), " + ".join(g.einsums), "one Triton kernel", grid, f"{k.programs:,}{few}",
                     str(k.dots) if k.dots else "-", "-"))
    cols = ("group", "einsums", "runs as", "grid (rank/tile x tiles)", "programs", "tl.dot products",
            "why not Triton")
    return Table(cols, tuple(rows), (True, False, False, False, True, True, False))


def einsum_rows(a: ArchStudy) -> list[dict[str, Any]]:
    """The per-Einsum CSV rows (contract columns, SI units)."""
    out = []
    for e in a.report.einsums:
        j = e.to_json()
        out.append({"einsum": e.name, **{k: j[k] for k in EINSUM_COLUMNS[1:]}})
    return out


def einsum_table(a: ArchStudy) -> Table:
    rows = []
    for e in a.report.einsums:
        rows.append(
            (e.name, str(e.group), fmt_bytes(e.traffic_bytes), fmt_time(e.memory_s), fmt_time(e.compute_s),
             fmt_time(e.latency_s), fmt_pct(e.compute_util), fmt_pct(e.memory_util),
             "∞" if e.intensity is None and e.flops else fmt_num(e.intensity), e.bound)
        )
    cols = ("einsum", "group", "traffic", "memory time", "compute time", "latency", "compute util",
            "memory util", "intensity (FLOP/B)", "bound")
    return Table(cols, tuple(rows), (False, True, True, True, True, True, True, True, True, False))


def totals_table(a: ArchStudy) -> Table:
    r, u = a.report, a.unfused
    rows = (
        ("fusion groups", str(len(u.groups)), str(len(r.groups)), "-"),
        ("off-chip traffic", fmt_bytes(u.traffic_bytes), fmt_bytes(r.traffic_bytes),
         fmt_ratio(u.traffic_bytes / r.traffic_bytes) if r.traffic_bytes else "-"),
        ("latency", fmt_time(u.latency_s), fmt_time(r.latency_s), fmt_ratio(a.speedup)),
        ("compute time", fmt_time(u.compute_s), fmt_time(r.compute_s), "-"),
        ("memory time", fmt_time(u.memory_s), fmt_time(r.memory_s), "-"),
        *((f"latency: {LATENCY_PARTS[k]}", fmt_time(pu[k]), fmt_time(pr[k]), "-")  # (these add up to the latency)
          for pu, pr in [(u.parts(), r.parts())] for k in LATENCY_PARTS),
    )
    return Table(("", "unfused", "optimal", "unfused / optimal"), rows, (False, True, True, True))


def comparison_table(s: Study) -> Table:
    rows = []
    for a in s.archs:
        rows.append(
            (a.arch.name, a.arch.kind, fmt_bytes(a.arch.fusion_buffer_bytes), fmt_rate(a.arch.offchip_bandwidth),
             str(len(a.report.groups)), fmt_bytes(a.unfused.traffic_bytes), fmt_bytes(a.report.traffic_bytes),
             fmt_time(a.unfused.latency_s), fmt_time(a.report.latency_s), fmt_ratio(a.speedup),
             "yes" if a.result.optimal else f"gap {a.result.gap:.2g}")
        )
    cols = ("arch", "kind", "fusion buffer", "off-chip BW", "groups", "unfused traffic", "optimal traffic",
            "unfused latency", "optimal latency", "speedup", "proven optimal")
    return Table(cols, tuple(rows), (False, False, True, True, True, True, True, True, True, True, False))


def why(s: Study, a: ArchStudy) -> list[str]:
    """Sentences saying why this mapping: what the optimiser proved and what fusion buys."""
    r, u, res = a.report, a.unfused, a.result
    fused = [g for g in res.mapping.groups if len(g.einsums) > 1]
    proof = "proven optimal" if res.optimal else f"best found (gap {res.gap:.2g})"
    lines = [
        f"The {res.method} solver chose {len(r.groups)} groups for {len(s.cascade.einsums)} Einsums out of "
        f"{res.candidates} legal candidate groups that fit the {fmt_bytes(a.arch.fusion_buffer_bytes)} fusion buffer "
        f"(objective: {res.objective}; {proof}).",
    ]
    if not a.arch.can_fuse:
        lines.append(f"{a.arch.name} cannot fuse (an unfused baseline): every Einsum is its own group.")
    elif not fused:
        lines.append("No fused group beats running the Einsums one by one on this architecture.")
    else:
        biggest = max(a.buffers)
        lines.append(
            f"{len(fused)} group(s) fuse several Einsums; the largest on-chip need is {fmt_bytes(biggest)}, "
            f"{fmt_pct(biggest / a.arch.fusion_buffer_bytes)} of the buffer."
        )
    lines.append(
        f"Against unfused, off-chip traffic goes from {fmt_bytes(u.traffic_bytes)} to {fmt_bytes(r.traffic_bytes)} "
        f"and latency from {fmt_time(u.latency_s)} to {fmt_time(r.latency_s)}: a {a.speedup:.2f}× speedup."
    )
    return lines


__all__ = [
    "EINSUM_COLUMNS", "ArchStudy", "Study", "Table", "comparison_table", "edges_table", "einsum_rows",
    "einsum_table", "einsums_table", "groups_table", "params_table", "ranks_table", "study", "tensors_table",
    "totals_table", "why",
]
