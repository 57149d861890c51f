"""Per-(cascade, architecture) state the cost model and the mapper share.

The schedule of a group depends on the cascade, the group, the arch's lowering policy and its
capacity; op counts and compute times on the cascade and the arch. A mapper costing thousands of
candidate groups builds one :class:`CostContext` and lowers through it (the analysis of every
member set and the compiled index forms are cached by its :class:`~mambalaya.schedule.Lowerer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mambalaya.arch import Arch
from mambalaya.cost.latency import compute_seconds
from mambalaya.cost.legality import GroupAnalysis
from mambalaya.cost.ops import OpCount, einsum_ops
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup
from mambalaya.schedule import GridShape, GroupSchedule, Lowerer, check_capacity, policy_of
from mambalaya.schedule.compute import dot_plans


@dataclass
class CostContext:
    """Caches for one cascade on one architecture."""

    cascade: Cascade
    arch: Arch
    analysis: GroupAnalysis = None  # type: ignore[assignment]
    lowerer: Lowerer = None  # type: ignore[assignment]
    _ops: dict[str, tuple[OpCount, ...]] = field(default_factory=dict, repr=False)
    _compute: dict[str, float] = field(default_factory=dict, repr=False)
    _stored: dict[tuple[str, ...], frozenset[str]] = field(default_factory=dict, repr=False)
    _matrix: dict[str, float] = field(default_factory=dict, repr=False)
    _sides: dict[str, tuple] = field(default_factory=dict, repr=False)
    #: a group's tile search by (members, objective, stored): the baselines, the mapper and its report ask again
    tilings: dict[tuple, object] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.analysis is None:
            self.analysis = GroupAnalysis(self.cascade)
        if self.lowerer is None:
            self.lowerer = Lowerer(self.cascade, self.analysis)

    def ops(self, einsum: str) -> tuple[OpCount, ...]:
        got = self._ops.get(einsum)
        if got is None:
            got = self._ops[einsum] = einsum_ops(self.cascade, einsum)
        return got

    def compute_s(self, einsum: str) -> float:
        """Seconds of one Einsum's ops on the arch (once each, at the achievable rates)."""
        got = self._compute.get(einsum)
        if got is None:
            got = self._compute[einsum] = compute_seconds(self.arch, list(self.ops(einsum)))
        return got

    def matrix_s(self, einsum: str) -> float:
        """Seconds of one Einsum's matrix-unit ops, once each (no waste: :func:`~mambalaya.cost.price.member_waste`
        multiplies it)."""
        got = self._matrix.get(einsum)
        if got is None:
            got = self._matrix[einsum] = compute_seconds(self.arch, [o for o in self.ops(einsum) if o.matrix])
        return got

    def matrix_sides(self, einsum: str) -> tuple[tuple[tuple[str, ...], ...], ...]:
        """Per summed term with a matrix-unit plan (:func:`~mambalaya.schedule.compute.dot_plans`), its M, N and K
        ranks (every tiling the mapper prices asks)."""
        got = self._sides.get(einsum)
        if got is None:
            plans = dot_plans(self.cascade, self.cascade.einsum(einsum))
            got = self._sides[einsum] = tuple((p.m, p.n, p.k) for p in plans if p is not None)
        return got

    def stored_alone(self, einsums: tuple[str, ...]) -> frozenset[str]:
        """The members a group stores when nothing else in the mapping is known: outputs, and tensors any
        Einsum outside the group reads (once per group: every tiling of it asks)."""
        got = self._stored.get(einsums)
        if got is None:
            inside = set(einsums)
            out = set()
            for e in einsums:
                consumers = self.cascade.consumers(e)
                if self.cascade.tensors[e].role == "output" or not consumers or any(c not in inside for c in consumers):
                    out.add(e)
            got = self._stored[einsums] = frozenset(out)
        return got

    def occupancy(self, group: FusionGroup, stored: frozenset[str] | None = None) -> tuple[int, int]:
        """(The on-chip bytes the group's schedule needs at its tiles: whether they fit; its accumulator's bytes,
        held to ``arch.accumulator_bytes``), without its statements."""
        stored = self.stored_alone(group.einsums) if stored is None else stored
        return self.lowerer.occupancy(group, stored, policy_of(self.arch))

    def grid(self, group: FusionGroup, stored: frozenset[str] | None = None) -> GridShape:
        """What the placement of the group's tiled loops fixes of its tilings' program grid
        (:meth:`~mambalaya.schedule.Lowerer.grid`): raises ``ScheduleError`` when the schedule refuses them."""
        stored = self.stored_alone(group.einsums) if stored is None else stored
        return self.lowerer.grid(group, stored, policy_of(self.arch))

    def outside_grid(self, group: FusionGroup, stored: frozenset[str] | None = None) -> str | None:
        """Why the group's one tiled loop is in no program grid of a tiling holding it at its tile's class
        (:meth:`~mambalaya.schedule.Lowerer.outside_grid`), or None."""
        stored = self.stored_alone(group.einsums) if stored is None else stored
        return self.lowerer.outside_grid(group, stored, policy_of(self.arch))

    def lower(self, group: FusionGroup, stored: frozenset[str] | None = None, index: int = 0,
              check: bool = True) -> GroupSchedule:
        """The group's schedule on this arch (its buffers held to the capacity with ``check``)."""
        stored = self.stored_alone(group.einsums) if stored is None else stored
        sched = self.lowerer.group(group, stored, policy_of(self.arch), index, self.arch.fusion_buffer_bytes)
        if check:
            check_capacity(sched, self.arch.fusion_buffer_bytes, self.arch.name)
        return sched


__all__ = ["CostContext"]
