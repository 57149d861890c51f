"""Evaluate a mapping: traffic, compute and roofline latency per Einsum, per group, in total.

``evaluate(cascade, arch, mapping)`` returns a :class:`CostReport`; the rules are
in :mod:`mambalaya.cost.traffic` (bytes), :mod:`mambalaya.cost.ops` (op counts)
and :mod:`mambalaya.cost.latency` (time). ``evaluate_group`` costs one group on
its own (its traffic depends only on which Einsums are inside it), which is
what the mapper needs for each candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mambalaya.arch import Arch, load_arch
from mambalaya.cost.context import BufferNeed, CostContext
from mambalaya.cost.latency import compute_seconds, group_latency, memory_seconds, split_latency
from mambalaya.cost.ops import OpCount, flops, ops_by_kind
from mambalaya.cost.traffic import Traffic, TrafficRow, group_traffic, mapping_traffic, recomputed_einsums
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


class _RooflineFigures:
    """Derived figures shared by Einsum rows and group rows (they carry the same five fields)."""

    flops: int
    traffic_bytes: int
    compute_s: float
    memory_s: float
    latency_s: float

    @property
    def intensity(self) -> float | None:
        """Operational intensity, FLOP per off-chip byte (None with no traffic)."""
        return _ratio(self.flops, self.traffic_bytes)

    @property
    def compute_util(self) -> float:
        """Compute time over the latency (an Einsum's share in a fused group may exceed 1: overlap)."""
        return _ratio(self.compute_s, self.latency_s) or 0.0

    @property
    def memory_util(self) -> float:
        return _ratio(self.memory_s, self.latency_s) or 0.0

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s > self.compute_s else "compute"


@dataclass(frozen=True)
class EinsumCost(_RooflineFigures):
    """One Einsum's row: its traffic, times, share of its group's latency and its ops."""

    name: str
    group: int
    traffic_bytes: int
    memory_s: float
    compute_s: float
    latency_s: float
    ops: dict[str, int]
    flops: int
    recomputes: tuple[str, ...] = ()  # producers this Einsum's group re-runs, charged to this row

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "traffic_bytes": self.traffic_bytes,
            "memory_s": self.memory_s,
            "compute_s": self.compute_s,
            "latency_s": self.latency_s,
            "ops": dict(self.ops),
            "flops": self.flops,
            "intensity": self.intensity,
            "compute_util": self.compute_util,
            "memory_util": self.memory_util,
            "bound": self.bound,
            **({"recomputes": list(self.recomputes)} if self.recomputes else {}),
        }


@dataclass(frozen=True)
class GroupCost(_RooflineFigures):
    """One fusion group: roofline latency = max(compute, memory) + overheads."""

    index: int
    einsums: tuple[str, ...]
    traffic_bytes: int
    memory_s: float
    compute_s: float
    overhead_s: float
    latency_s: float
    flops: int
    transfers: int

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "einsums": list(self.einsums),
            "traffic_bytes": self.traffic_bytes,
            "memory_s": self.memory_s,
            "compute_s": self.compute_s,
            "overhead_s": self.overhead_s,
            "latency_s": self.latency_s,
            "flops": self.flops,
            "transfers": self.transfers,
            "intensity": self.intensity,
            "compute_util": self.compute_util,
            "memory_util": self.memory_util,
            "bound": self.bound,
        }


@dataclass(frozen=True)
class CostReport:
    """The cost of one mapping of a cascade on an architecture."""

    cascade: str
    arch: str
    mapping: Mapping
    einsums: tuple[EinsumCost, ...]
    groups: tuple[GroupCost, ...]
    traffic: Traffic
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def traffic_bytes(self) -> int:
        return self.traffic.total_bytes

    @property
    def latency_s(self) -> float:
        return sum(g.latency_s for g in self.groups)

    @property
    def compute_s(self) -> float:
        return sum(g.compute_s for g in self.groups)

    @property
    def memory_s(self) -> float:
        return sum(g.memory_s for g in self.groups)

    @property
    def overhead_s(self) -> float:
        return sum(g.overhead_s for g in self.groups)

    @property
    def flops(self) -> int:
        return sum(g.flops for g in self.groups)

    def summary(self) -> dict[str, Any]:
        """The headline figures (what ``map --json`` reports for each mapping)."""
        return {
            "groups": self.mapping.group_lists,
            "traffic_bytes": self.traffic_bytes,
            "latency_s": self.latency_s,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "overhead_s": self.overhead_s,
            "flops": self.flops,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "cascade": self.cascade,
            "arch": self.arch,
            **self.summary(),
            "mapping": self.mapping.to_dict(),
            "einsums": [e.to_json() for e in self.einsums],
            "group_costs": [g.to_json() for g in self.groups],
            "traffic": [r.to_json() for r in self.traffic.rows],
        }

    def to_dataframe(self):
        """Per-Einsum rows (the paper's table), ops flattened into ``ops_<kind>`` columns."""
        import pandas as pd

        kinds = sorted({k for e in self.einsums for k in e.ops})
        rows = []
        for e in self.einsums:
            row = {k: v for k, v in e.to_json().items() if k not in ("ops", "recomputes")}
            row.update({f"ops_{k}": e.ops.get(k, 0) for k in kinds})
            rows.append(row)
        return pd.DataFrame(rows)

    def groups_dataframe(self):
        import pandas as pd

        return pd.DataFrame([{**g.to_json(), "einsums": " ".join(g.einsums)} for g in self.groups])

    def traffic_dataframe(self):
        import pandas as pd

        return pd.DataFrame([r.to_json() for r in self.traffic.rows])


def _merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return dict(sorted({k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}}.items()))


def _group_costs(
    ctx: CostContext, group: FusionGroup, index: int, rows: list[TrafficRow]
) -> tuple[GroupCost, list[EinsumCost]]:
    cascade, arch = ctx.cascade, ctx.arch
    order = {n: i for i, n in enumerate(cascade.einsum_names)}
    members = sorted(group.einsums, key=order.__getitem__)
    recomputed = recomputed_einsums(cascade, group)
    counts: dict[str, list[OpCount]] = {e: list(ctx.ops(e)) for e in members}
    charged: dict[str, list[str]] = {e: [] for e in members}
    for r in recomputed:  # re-running a producer is charged to the first member that consumes recomputed data
        who = next((m for m in members if any(t in recomputed for t in ctx.reads(m))), members[0])
        counts[who] += list(ctx.ops(r))
        charged[who].append(r)
    traffic = {e: 0 for e in members}
    for row in rows:
        traffic[row.einsum] += row.bytes
    compute = {e: compute_seconds(arch, counts[e]) for e in members}
    memory = {e: memory_seconds(arch, traffic[e]) for e in members}
    total_bytes = sum(r.bytes for r in rows)
    transfers = sum(r.reread for r in rows)
    latency, overhead = group_latency(arch, sum(compute.values()), total_bytes, transfers)
    shares = split_latency(latency, [max(compute[e], memory[e]) for e in members])
    einsums = []
    for e, share in zip(members, shares, strict=True):
        ops = {k: int(v) for k, v in ops_by_kind(counts[e]).items()}
        einsums.append(
            EinsumCost(
                e, index, traffic[e], memory[e], compute[e], share, ops, int(flops(ops)), tuple(charged[e])
            )
        )
    g = GroupCost(
        index,
        tuple(members),
        total_bytes,
        memory_seconds(arch, total_bytes),
        sum(compute.values()),
        overhead,
        latency,
        sum(e.flops for e in einsums),
        transfers,
    )
    return g, einsums


def evaluate_group(ctx: CostContext, group: FusionGroup, index: int = 0) -> GroupCost:
    """One group on its own (no recompute by other groups, no resident weights from earlier ones)."""
    rows = group_traffic(ctx, group, index)
    return _group_costs(ctx, group, index, rows)[0]


def evaluate(
    cascade: Cascade,
    arch: Arch | str,
    mapping: Mapping | None = None,
    *,
    ctx: CostContext | None = None,
    buffer_need: BufferNeed | None = None,
) -> CostReport:
    """The cost of ``mapping`` (default: the unfused one) of ``cascade`` on ``arch``."""
    arch = load_arch(arch) if isinstance(arch, str) else arch
    ctx = ctx or CostContext(cascade, arch, buffer_need)
    mapping = mapping or unfused_mapping(cascade)
    traffic = mapping_traffic(ctx, mapping)
    groups, einsums = [], []
    for i, g in enumerate(mapping.groups):
        gc, ecs = _group_costs(ctx, g, i, [r for r in traffic.rows if r.group == i])
        groups.append(gc)
        einsums += ecs
    order = {n: i for i, n in enumerate(cascade.einsum_names)}
    einsums.sort(key=lambda e: order[e.name])
    return CostReport(
        cascade.name, arch.name, mapping, tuple(einsums), tuple(groups), traffic, dict(cascade.params)
    )


def roofline(arch: Arch) -> dict[str, float]:
    """The roofs: peak FLOP/s of the matrix unit and of element-wise MACs, and off-chip B/s."""
    return {
        "matrix_flops": 2 * arch.throughput("mac", matrix=True),
        "vector_flops": 2 * arch.throughput("mac"),
        "bandwidth": arch.offchip_bandwidth,
        "ridge_matrix": 2 * arch.throughput("mac", matrix=True) / arch.offchip_bandwidth,
    }


__all__ = ["CostReport", "EinsumCost", "GroupCost", "evaluate", "evaluate_group", "roofline"]
