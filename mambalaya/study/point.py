"""Evaluate one design point: the optimal mapping and the unfused baseline, as one flat row.

A point whose mapping cannot fit (the mapper's MappingError) is a row with
``feasible`` False and the mapper's explanation, so one tiny buffer in a sweep
does not throw away the rest of the grid.
"""

from __future__ import annotations

from typing import Any

from mambalaya.errors import MambalayaError
from mambalaya.mapper import evaluate, optimal_mapping
from mambalaya.study.grid import Point

#: Result columns, after a point's label columns (cascade, swept params, arch, overrides).
COLUMNS = (
    "feasible", "reason", "groups", "mapping", "traffic_bytes", "latency_s", "compute_s", "memory_s",
    "unfused_traffic_bytes", "unfused_latency_s", "speedup", "traffic_reduction", "optimal", "solve_s",
    "fusion_buffer_bytes", "offchip_bandwidth",
)


def mapping_text(groups: list[list[str]]) -> str:
    """Groups as one short cell: ``Z+XBC0 | DT0 | ...``."""
    return " | ".join("+".join(g) for g in groups)


def evaluate_point(point: Point, objective: str = "latency") -> dict[str, Any]:
    """The row of one point (never raises for an infeasible mapping)."""
    cascade, arch = point.cascade, point.arch
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(point.labels)
    row.update(fusion_buffer_bytes=arch.fusion_buffer_bytes, offchip_bandwidth=arch.offchip_bandwidth)
    try:
        unfused = evaluate(cascade, arch)
        row.update(unfused_traffic_bytes=unfused.traffic_bytes, unfused_latency_s=unfused.latency_s)
        res = optimal_mapping(cascade, arch, objective)
    except MambalayaError as err:
        row.update(feasible=False, reason=err.message)
        return row
    rep = res.report
    row.update(
        feasible=True,
        reason="",
        groups=len(rep.groups),
        mapping=mapping_text(res.groups),
        traffic_bytes=rep.traffic_bytes,
        latency_s=rep.latency_s,
        compute_s=rep.compute_s,
        memory_s=rep.memory_s,
        speedup=unfused.latency_s / rep.latency_s if rep.latency_s > 0 else None,
        traffic_reduction=unfused.traffic_bytes / rep.traffic_bytes if rep.traffic_bytes else None,
        optimal=res.optimal,
        solve_s=res.solve_s,
    )
    return row


def evaluate_chunk(points: list[Point], objective: str) -> list[dict[str, Any]]:
    """A worker's batch (one pickle round trip for many cheap points)."""
    return [evaluate_point(p, objective) for p in points]


__all__ = ["COLUMNS", "evaluate_chunk", "evaluate_point", "mapping_text"]
