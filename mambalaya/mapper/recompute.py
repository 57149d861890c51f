"""Optional recomputation of cheap multi-consumer tensors (``optimal_mapping(..., recompute=True)``).

A tensor T is *recomputable* when its producer is point-wise (no reduction, mask or recurrence:
cheap to re-run), it is not a cascade output, it has several consumers, and none of its produced
inputs is recomputable itself (so their writes follow the plain rule). Per-group additivity breaks
on T: T is written unless *every* outside consumer group recomputes it. The cover stays exact and
linear with two kinds of extra columns and at-most-one rows (:attr:`Problem.conflicts`):

- a *recompute* variant of an untiled candidate G holding a consumer of T but not T: G re-runs T's
  producer (``FusionGroup.recompute``), reading T's inputs instead of T, with the producer's ops;
- an *unwritten* variant of a candidate H holding T with consumers outside: H without T's write.

Rows: an unwritten variant excludes every column that reads T from memory (holds a consumer of T,
not T, and does not recompute it): the binary "T is written" of the formulation is the choice of
H's plain column. A recompute variant excludes every column that keeps one of T's produced inputs
on chip (holds it and all its consumers): what it re-reads must have been written. Both are
written per consumer k of T, as one row over the unwritten (or hiding) columns, which all cover T
(or the input), and the columns on the other side holding k, which all cover k: at most one of
each side is chosen anyway, so "at most one of the row" is exactly "not both sides".

Kept off by default: the variants add space construction time, and the layer decomposition
(``layers``) does not carry the rows, so it maps one layer only.
"""

from __future__ import annotations

from dataclasses import replace

from mambalaya.cost.context import CostContext
from mambalaya.cost.model import group_costs
from mambalaya.errors import MambalayaError
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.expr import Reduce, walk
from mambalaya.ir.mapping import FusionGroup
from mambalaya.mapper.space import Candidate, Space


def _pointwise(cascade: Cascade, name: str) -> bool:
    e = cascade.einsum(name)
    if e.where or e.recurrence is not None or e.reduced_ranks:
        return False
    return not any(isinstance(n, Reduce) for n in walk(e.expr)) and len(set(e.out_ranks)) == len(e.out_ranks)


def recomputable(cascade: Cascade) -> dict[str, tuple[str, ...]]:
    """Recomputable tensors (module docstring) -> their produced inputs."""
    first = {e.name for e in cascade.einsums if _pointwise(cascade, e.name)
             and cascade.tensors[e.name].role != "output" and len(cascade.consumers(e.name)) >= 2}
    out = {}
    for t in sorted(first, key=cascade.einsum_names.index):
        ins = tuple(u for u in cascade.einsum(t).reads if u != t and cascade.producer(u) is not None)
        if not any(u in first for u in ins):
            out[t] = ins
    return out


def variants(space: Space) -> list[Candidate]:
    """The recompute and unwritten variants of the space's candidates (module docstring), each lowered and
    priced like any candidate (a variant whose schedule does not fit is left out). A recompute variant that
    holds another target's owner also comes unwritten: when every outside consumer re-runs that target too,
    the cover must be able to drop its write in the group that re-runs the first."""
    cascade, ctx = space.cascade, space.ctx
    targets = recomputable(cascade)
    out: list[Candidate] = []
    for c in space.candidates:
        members = set(c.einsums)
        owned = [t for t in targets if t in members and set(cascade.consumers(t)) - members]
        for t in owned:  # owner: the variant without T's write
            got = _priced(ctx, c.group, ctx.stored_alone(c.einsums) - {t})
            if got is not None:
                out.append(replace(got, unwritten=(t,)))
        for t in targets:
            if t in members or not set(cascade.consumers(t)) & members:
                continue
            g = FusionGroup(c.einsums, c.group.loop_order, dict(c.group.tiles), recompute=(t,))
            got = _priced(ctx, g, None)
            if got is not None:
                out.append(got)
            for u in owned:
                got = _priced(ctx, g, ctx.stored_alone(c.einsums) - {u})
                if got is not None:
                    out.append(replace(got, unwritten=(u,)))
    return out


def _priced(ctx: CostContext, group: FusionGroup, stored: frozenset[str] | None) -> Candidate | None:
    try:
        cost, rows, _ = group_costs(ctx, ctx.lower(group, stored))
    except MambalayaError:  # the variant's schedule does not fit (or cannot be lowered)
        return None
    return Candidate(group.einsums, group, cost.traffic_bytes, cost.latency_s, cost.occupancy_bytes,
                     tuple(r.compute_s for r in rows), cost.transfers)


def conflicts(cascade: Cascade, cands: list[Candidate]) -> tuple[tuple[int, ...], ...]:
    """The at-most-one rows over ``cands`` (module docstring)."""
    rows: list[tuple[int, ...]] = []
    for t, ins in recomputable(cascade).items():
        unwritten = [i for i, c in enumerate(cands) if t in c.unwritten]
        hiders = {u: [i for i, c in enumerate(cands) if u in c.einsums and cascade.tensors[u].role != "output"
                      and set(cascade.consumers(u)) <= set(c.einsums)] for u in ins}
        for k in cascade.consumers(t):
            holding = [i for i, c in enumerate(cands) if k in c.einsums and t not in c.einsums]
            readers = [i for i in holding if t not in cands[i].group.recompute]
            redoers = [i for i in holding if t in cands[i].group.recompute]
            if unwritten and readers:
                rows.append((*readers, *unwritten))
            rows += [(*redoers, *hiders[u]) for u in ins if redoers and hiders[u]]
    return tuple(rows)
