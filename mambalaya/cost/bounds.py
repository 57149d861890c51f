"""A group's lower bound composed from its members' parts, with no lowering: the mapper's first tier.

Every tiling of a group (every schedule :mod:`mambalaya.schedule` can give it) costs at least:

- **compute**: the sum of its members' own compute times (:meth:`CostContext.compute_s`): a schedule charges each
  member's ops times its replicas, its inlined evaluations and the matrix unit's waste, all at least 1;
- **traffic**: its stored outputs whole (what :meth:`CostContext.stored_alone` says leaves it) and, per tensor
  loaded from off chip, the union of the boxes its members read densely (:func:`~mambalaya.schedule.extent.
  dense_read`): each element of such a box is read, so some load brings it on chip. Reads by a member the
  schedule may inline into its readers (point-wise, not stored) count nothing: a reader may need only part of it;
- **chain**: each recurrence walks every step of its rank in some program, one after another;
- **overheads**: the group's own, and one transfer and one statement execution per load stream (at least one per
  tensor loaded) and per store, and a statement per member that is not inlined.

It is within a few percent of the untiled schedule's figures (:meth:`~mambalaya.mapper.tiling._Search.bound`) on the
shipped cascades at published sizes, at 0.06 ms a group instead of a lowering and an occupancy probe (4-6 ms); on an
arch with program slots it assumes the whole chip busy (pricing the widest grid and the least staging here made a
chain of two mamba1-decode layers on h200 cost less than twice its one-layer optimum: some group was cut by it;
not found in the time left). The lazy space (:mod:`mambalaya.mapper.space`) costs every
group of several Einsums by it, and prunes and proves dominance with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mambalaya.cost.context import CostContext
from mambalaya.cost.latency import memory_seconds
from mambalaya.cost.model import GroupCost
from mambalaya.schedule import extent
from mambalaya.schedule.compute import pointwise

Box = tuple[tuple[int, int], ...]  # inclusive (lo, hi) per axis


@dataclass(frozen=True)
class _Reads:
    """What one Einsum reads of other tensors over its whole iteration space: per tensor, its dense boxes."""

    dense: tuple[tuple[str, Box], ...]
    tensors: frozenset[str]  # every tensor it reads with a non-empty box (dense or not)


@dataclass
class ComposedBounds:
    """Per-Einsum parts of the composed bound, computed once per cascade and arch (module docstring)."""

    ctx: CostContext
    _reads: dict[str, _Reads] = field(default_factory=dict)

    def reads(self, einsum: str) -> _Reads:
        got = self._reads.get(einsum)
        if got is None:
            forms, cascade = self.ctx.lowerer.forms, self.ctx.cascade
            sizes = cascade.rank_sizes
            dense, tensors = [], set()
            for k, acc in enumerate(forms.accesses(einsum)):
                if acc.tensor == einsum:  # a recurrence's read of its previous step
                    continue
                fs = forms.of(einsum, k)
                box = tuple(forms.whole_box(einsum, k, fs, acc.tensor))
                if any(lo > hi for lo, hi in box):
                    continue
                tensors.add(acc.tensor)
                if extent.dense_read(fs, sizes):
                    dense.append((acc.tensor, box))
            got = self._reads[einsum] = _Reads(tuple(dense), frozenset(tensors))
        return got

    def bound(self, einsums: tuple[str, ...]) -> GroupCost:
        """A lower bound on the group's cost at every tiling (module docstring)."""
        ctx, cascade, arch = self.ctx, self.ctx.cascade, self.ctx.arch
        inside = set(einsums)
        stored = ctx.stored_alone(einsums)
        boxes: dict[str, set[Box]] = {}
        loaded: set[str] = set()
        live = 0
        for e in einsums:
            if e not in stored and pointwise(cascade.einsum(e)):
                continue  # (it may be inlined: what its readers need of it is all that is read)
            live += 1
            got = self.reads(e)
            loaded |= {t for t in got.tensors if t not in inside}
            for t, box in got.dense:
                if t not in inside:
                    boxes.setdefault(t, set()).add(box)
        traffic = sum(math.prod(cascade.shape(e)) * cascade.tensors[e].element_bytes for e in stored)
        traffic += sum(union_volume(list(bs)) * cascade.tensors[t].element_bytes for t, bs in boxes.items())
        compute = sum(ctx.compute_s(e) for e in einsums)
        chain = arch.recurrence_step_s * sum(cascade.rank_size(rec.rank) for e in einsums
                                             if (rec := cascade.einsum(e).recurrence) is not None)
        moves = len(loaded) + len(stored)
        overhead = arch.group_overhead_s + arch.transfer_overhead_s * moves + arch.statement_overhead_s * (moves + live)
        memory = memory_seconds(arch, traffic)
        return GroupCost(0, tuple(einsums), traffic, memory, compute, overhead,
                         max(compute, memory, chain) + overhead, 0, moves, chain_s=chain)


def grid_breakers(ctx: CostContext, einsums: tuple[str, ...]) -> frozenset[str]:
    """The loops never in a GPU program grid in a (legal) group of ``einsums``: those a rank some member reduces
    over (its partial sums accumulate across the loop) or scans along (its state carries across it) follows, as
    its own loop or as the loop of one of its coarse pieces (``OUT`` summing ``d`` read as ``h*P + p`` accumulates
    across a tile of ``h``: the analysis's bindings, :class:`~mambalaya.analysis.groups.Binding`; a remainder piece
    such as ``p`` is not followed, as step 1 of the lowering follows none)."""
    model = ctx.lowerer.model(tuple(einsums))
    out: set[str] = set()
    for n in einsums:
        e = ctx.cascade.einsum(n)
        ranks = set(e.reduced_ranks) | ({e.recurrence.rank} if e.recurrence is not None else set())
        out |= ranks
        for r in ranks:
            b = model.bindings.get((n, r))
            if b is not None:
                out.update(x for x in (b.loop, *(child for child, (_, _, mod) in b.pieces if mod is None))
                           if x is not None)
    return frozenset(out)


def union_volume(boxes: list[Box]) -> int:
    """Elements in the union of inclusive integer boxes of one rank (a sweep along each axis in turn)."""
    if not boxes:
        return 0
    if len(boxes) == 1:
        return math.prod(hi - lo + 1 for lo, hi in boxes[0])
    if not boxes[0]:
        return 1
    cuts = sorted({b[0][0] for b in boxes} | {b[0][1] + 1 for b in boxes})
    total = 0
    for lo, nxt in zip(cuts, cuts[1:], strict=False):
        active = [b[1:] for b in boxes if b[0][0] <= lo and nxt - 1 <= b[0][1]]
        if active:
            total += (nxt - lo) * union_volume(active)
    return total


__all__ = ["ComposedBounds", "grid_breakers", "union_volume"]
