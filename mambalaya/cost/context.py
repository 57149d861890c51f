"""Per-(cascade, architecture) caches the cost model and the mapper share.

Op counts, read footprints and group buffer needs depend only on the cascade
(and the group), not on the mapping, so a mapper costing thousands of candidate
groups computes each once. Build one :class:`CostContext` per cascade and arch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mambalaya.arch import Arch
from mambalaya.cost.footprint import Box, access_boxes, full_box, union_size
from mambalaya.cost.legality import GroupAnalysis
from mambalaya.cost.ops import OpCount, einsum_ops
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.expr import accesses
from mambalaya.ir.mapping import FusionGroup

#: ``buffer_need(group) -> bytes``: the on-chip bytes a group's own intermediates need under its tiles.
BufferNeed = Callable[[FusionGroup], int]


@dataclass(frozen=True)
class Read:
    """What one Einsum reads of one tensor: its footprint boxes and the ranks indexing it."""

    tensor: str
    boxes: tuple[Box, ...]
    ranks: frozenset[str]


@dataclass
class CostContext:
    """Caches for one cascade on one architecture.

    ``buffer_need`` overrides the analysis stage's buffer need of a group (tests use a constant).
    """

    cascade: Cascade
    arch: Arch
    buffer_need: BufferNeed | None = None
    _ops: dict[str, tuple[OpCount, ...]] = field(default_factory=dict, repr=False)
    _reads: dict[str, dict[str, Read]] = field(default_factory=dict, repr=False)
    _footprints: dict[tuple[str, tuple[str, ...]], int] = field(default_factory=dict, repr=False)
    _buffers: dict[tuple, int] = field(default_factory=dict, repr=False)
    _analysis: GroupAnalysis | None = field(default=None, repr=False)

    @property
    def analysis(self) -> GroupAnalysis:
        """The analysis stage's view of this cascade's groups (built on first use)."""
        if self._analysis is None:
            self._analysis = GroupAnalysis(self.cascade)
        return self._analysis

    def ops(self, einsum: str) -> tuple[OpCount, ...]:
        if einsum not in self._ops:
            self._ops[einsum] = einsum_ops(self.cascade, einsum)
        return self._ops[einsum]

    def reads(self, einsum: str) -> dict[str, Read]:
        """Tensors an Einsum reads from outside itself (its recurrence's own state excluded)."""
        if einsum not in self._reads:
            e = self.cascade.einsum(einsum)
            boxes: dict[str, list[Box]] = {}
            ranks: dict[str, set[str]] = {}
            for acc in accesses(e.expr):
                if acc.tensor == e.name:
                    continue
                for box in access_boxes(self.cascade, acc):
                    boxes.setdefault(box.tensor, []).append(box)
                    ranks.setdefault(box.tensor, set()).update(acc.ranks())
            rec = e.recurrence
            if rec is not None and rec.init is not None:  # the initial state, read whole at the first step
                boxes.setdefault(rec.init, []).append(full_box(rec.init, self.cascade.shape(rec.init)))
                ranks.setdefault(rec.init, set()).update(r for r in e.out_ranks if r != rec.rank)
            self._reads[einsum] = {t: Read(t, tuple(b), frozenset(ranks[t])) for t, b in boxes.items()}
        return self._reads[einsum]

    def footprint_bytes(self, tensor: str, readers: tuple[str, ...]) -> int:
        """Bytes of the distinct elements of ``tensor`` that the Einsums ``readers`` read."""
        key = (tensor, tuple(sorted(readers)))
        if key not in self._footprints:
            boxes = [b for r in key[1] for b in self.reads(r)[tensor].boxes]
            self._footprints[key] = union_size(boxes) * self.cascade.tensors[tensor].element_bytes
        return self._footprints[key]

    def group_buffer_bytes(self, group: FusionGroup) -> int:
        """On-chip bytes the group's own intermediates need (0 for a single Einsum with no tiles)."""
        key = (group.einsums, group.loop_order, tuple(sorted(group.tiles.items())), group.recompute)
        if key not in self._buffers:
            need = self.buffer_need or self.analysis.buffer_bytes
            self._buffers[key] = int(need(group))
        return self._buffers[key]


__all__ = ["BufferNeed", "CostContext", "Read"]
