"""Evaluate a mapping: traffic, compute and roofline latency per Einsum, per group, in total.

``evaluate(cascade, arch, mapping)`` lowers the mapping to its schedule
(:func:`mambalaya.schedule.lower_mapping`: each group's buffers held to the arch's capacity) and
prices it (:mod:`mambalaya.cost.price`: the statements' bytes, the members' ops, the roofline of
:mod:`mambalaya.cost.latency`). ``evaluate_group`` costs one group on its own (what the mapper
needs for each candidate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mambalaya.arch import Arch, load_arch
from mambalaya.cost.context import CostContext
from mambalaya.cost.latency import (
    chain_seconds,
    compute_seconds,
    group_latency,
    latency_parts,
    memory_seconds,
    parallel_fraction,
    split_latency,
    staging_seconds,
)
from mambalaya.cost.ops import flops, ops_by_kind
from mambalaya.cost.price import (
    Traffic,
    TrafficRow,
    chain_statements,
    chain_steps,
    member_ops,
    sector_bytes,
    staged_bytes,
    traffic_rows,
)
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.schedule import GroupSchedule, Schedule, lower_mapping


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
    occupancy_bytes: int = 0  # every buffer of its schedule, held at once (one program's, on a GPU)
    programs: int = 1  # programs of its grid (1: one loop nest)
    parallel_fraction: float = 1.0  # of the chip its grid keeps busy (waves against the arch's program slots)
    chain_s: float = 0.0  # its recurrences' dependency chain (a floor under its latency)
    staging_s: float = 0.0  # moving what it stages through its programs' scratch (added to the roofline)

    def parts(self) -> dict[str, float]:
        """Its latency as terms that add up to it (:func:`~mambalaya.cost.latency.latency_parts`)."""
        return latency_parts(self.compute_s, self.memory_s, self.staging_s, self.parallel_fraction, self.chain_s,
                             self.overhead_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "einsums": list(self.einsums),
            "occupancy_bytes": self.occupancy_bytes,
            "programs": self.programs,
            "parallel_fraction": self.parallel_fraction,
            "chain_s": self.chain_s,
            "staging_s": self.staging_s,
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
            "latency_parts": self.parts(),
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
    schedule: Schedule | None = field(default=None, compare=False)

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

    def parts(self) -> dict[str, float]:
        """The latency as terms that add up to it, summed over the groups (:meth:`GroupCost.parts`)."""
        out: dict[str, float] = {}
        for g in self.groups:
            for k, v in g.parts().items():
                out[k] = out.get(k, 0.0) + v
        return out

    def summary(self) -> dict[str, Any]:
        """The headline figures (what ``map --json`` reports for each mapping)."""
        return {
            "groups": self.mapping.group_lists,
            "traffic_bytes": self.traffic_bytes,
            "latency_s": self.latency_s,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "overhead_s": self.overhead_s,
            "latency_parts": self.parts(),
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


def group_costs(ctx: CostContext, sched: GroupSchedule) -> tuple[GroupCost, list[EinsumCost], list[TrafficRow]]:
    """A group's schedule priced: its row, its Einsums' rows, its traffic rows."""
    arch = ctx.arch
    rows = traffic_rows(ctx, sched)
    counts = member_ops(ctx, sched)
    members = list(counts)
    charged = {e: [m for m in sched.members if m not in sched.einsums
                   and next((x for x in members if m in ctx.cascade.einsum(x).reads), members[0]) == e]
               for e in members}
    traffic = {e: 0 for e in members}
    for row in rows:
        traffic[row.einsum] += row.bytes
    compute = {e: compute_seconds(arch, counts[e]) for e in members}
    memory = {e: memory_seconds(arch, traffic[e]) for e in members}
    total_bytes = sum(r.bytes for r in rows)
    transfers = sum(r.transfers for r in rows)
    programs = sched.programs if sched.grid else 1
    chain = chain_seconds(arch, programs, chain_steps(ctx, sched) if arch.recurrence_step_s > 0 else 0,
                          sched.occupancy_bytes, chain_statements(ctx, sched) if arch.recurrence_statement_s > 0 else 0)
    staging = staging_seconds(arch, staged_bytes(ctx, sched))
    moved = sector_bytes(ctx, sched) if arch.sector_bytes else total_bytes  # (whole sectors: what the transfers take)
    latency, overhead = group_latency(arch, sum(compute.values()), moved, transfers, programs, chain, staging,
                                      sched.executions if arch.statement_overhead_s > 0 else 0)
    frac, _ = parallel_fraction(arch, programs)
    shares = split_latency(latency, [max(compute[e], memory[e]) for e in members], [compute[e] for e in members])
    einsums = []
    for e, share in zip(members, shares, strict=True):
        ops = {k: int(v) for k, v in ops_by_kind(counts[e]).items()}
        einsums.append(EinsumCost(e, sched.index, traffic[e], memory[e], compute[e], share, ops, int(flops(ops)),
                                  tuple(charged[e])))
    g = GroupCost(sched.index, tuple(members), total_bytes, memory_seconds(arch, moved), sum(compute.values()),
                  overhead, latency, sum(e.flops for e in einsums), transfers, sched.occupancy_bytes, programs, frac,
                  chain, staging)
    return g, einsums, rows


def evaluate_group(ctx: CostContext, group: FusionGroup, index: int = 0,
                   stored: frozenset[str] | None = None) -> GroupCost:
    """One group on its own: it stores what any Einsum outside it reads (raises ScheduleError when its buffers
    do not fit the arch's capacity)."""
    return group_costs(ctx, ctx.lower(group, stored, index))[0]


def evaluate(
    cascade: Cascade,
    arch: Arch | str,
    mapping: Mapping,
    *,
    ctx: CostContext | None = None,
) -> CostReport:
    """The cost of ``mapping`` of ``cascade`` on ``arch`` (:func:`mambalaya.mapper.evaluate` defaults it to the
    unfused baseline, whose tiles are searched)."""
    arch = load_arch(arch) if isinstance(arch, str) else arch
    ctx = ctx or CostContext(cascade, arch)
    check_fusable(arch, mapping)
    sched = lower_mapping(cascade, mapping, arch, lowerer=ctx.lowerer)
    groups, einsums, rows = [], [], []
    for g in sched.groups:
        gc, ecs, rs = group_costs(ctx, g)
        groups.append(gc)
        einsums += ecs
        rows += rs
    order = {n: i for i, n in enumerate(cascade.einsum_names)}
    einsums.sort(key=lambda e: order[e.name])
    return CostReport(cascade.name, arch.name, mapping, tuple(einsums), tuple(groups), Traffic(tuple(rows)),
                      dict(cascade.params), sched)


def check_fusable(arch: Arch, mapping: Mapping) -> None:
    """An arch that cannot fuse admits only one Einsum per group."""
    from mambalaya.errors import MappingError

    if not arch.can_fuse:
        fused = [g.einsums for g in mapping.groups if len(g.einsums) > 1 or g.recompute]
        if fused:
            raise MappingError(f"arch {arch.name!r} cannot fuse (can_fuse: false) but the mapping fuses "
                               f"[{', '.join(fused[0])}]: only one Einsum per group is admitted")


def roofline(arch: Arch) -> dict[str, float]:
    """The roofs: peak FLOP/s of the matrix unit and of element-wise MACs, and off-chip B/s."""
    return {
        "matrix_flops": 2 * arch.throughput("mac", matrix=True),
        "vector_flops": 2 * arch.throughput("mac"),
        "bandwidth": arch.offchip_bandwidth,
        "ridge_matrix": 2 * arch.throughput("mac", matrix=True) / arch.offchip_bandwidth,
    }


__all__ = ["CostReport", "EinsumCost", "GroupCost", "check_fusable", "evaluate", "evaluate_group", "group_costs", "roofline"]
