"""Off-chip traffic of a mapping, per tensor and group, in bytes.

This is the rule the fused executor reproduces to the byte by counting the
reads and writes it makes to off-chip (boundary) arrays; change both together.

For each fusion group G, in the mapping's order:

1. **Writes.** A tensor produced by an Einsum of G is written off chip once, its full
   ``nbytes``, iff it is a cascade output (role ``output``, or read by no Einsum), or
   some Einsum that reads it lies outside G; except that a non-output tensor is not
   written when *every* outside group that reads it lists it in its ``recompute``
   (a tensor with one outside consumer that does not recompute it is still written:
   multi-consumer tensors go off chip as soon as one consumer is outside).
2. **Reads.** The Einsums of G plus the Einsums G recomputes (its ``recompute`` list
   names tensors, hence their producers, which G re-runs on chip) read every tensor
   none of them produces: inputs, weights, initial states and tensors of earlier
   groups. Each such tensor is read once per group: ``footprint x reread`` bytes,
   where the *footprint* is the bytes of the distinct in-range elements those
   Einsums read of it (:mod:`mambalaya.cost.footprint`: a whole tensor for ordinary
   reads; only the rows of a packed weight a group uses, only the last tokens a
   final-state Einsum reads; a step before a recurrence's start reads its initial
   state) and the *reread factor* is

   - 1 when the group's loop order has no tiled rank outside every rank indexing
     the tensor, or when the tensor fits on chip: ``footprint + buffer_need(G) <=
     arch.fusion_buffer_bytes`` (``buffer_need`` from the analysis, at G's tiles);
   - otherwise the tensor is streamed once per iteration of those outer loops:
     the product of ``ceil(size(r) / tile(r))`` over the ranks r of G's
     ``loop_order`` that come before the first rank indexing the tensor, do not
     index it, and are tiled (listed in ``tiles``). A weight that does not fit is
     re-read once per token tile. With no tiles the factor is 1.
3. **Resident weights.** On an arch with ``weights_resident``, weights stay on chip
   once loaded: a group reads (factor 1) only the part of a weight's footprint that no
   earlier group has read; a weight fully loaded before costs nothing.

An Einsum's traffic (for per-Einsum memory time) is its writes plus each read
attributed to the first Einsum of G, in cascade order, that reads the tensor (a
read made for a recomputed Einsum goes to the first member that consumes a
recomputed tensor). The unfused mapping (one group per Einsum, no tiles) gives
every operator its algorithmic-minimum traffic, so every intermediate makes one
round trip per consuming Einsum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mambalaya.cost.context import CostContext
from mambalaya.errors import MappingError
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup, Mapping


@dataclass(frozen=True)
class TrafficRow:
    """One off-chip transfer stream: a tensor read or written by a group."""

    tensor: str
    group: int
    einsum: str  # the Einsum the bytes are attributed to
    direction: str  # "read" | "write"
    bytes: int  # footprint_bytes x reread
    reread: int  # passes over the footprint (1 for writes)
    footprint_bytes: int  # bytes of one pass

    def to_json(self) -> dict:
        return {
            "tensor": self.tensor,
            "group": self.group,
            "einsum": self.einsum,
            "direction": self.direction,
            "bytes": self.bytes,
            "reread": self.reread,
            "footprint_bytes": self.footprint_bytes,
        }


@dataclass(frozen=True)
class Traffic:
    """All transfers of a mapping, with totals."""

    rows: tuple[TrafficRow, ...]

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)

    @property
    def read_bytes(self) -> int:
        return sum(r.bytes for r in self.rows if r.direction == "read")

    @property
    def write_bytes(self) -> int:
        return sum(r.bytes for r in self.rows if r.direction == "write")

    def by_tensor(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.tensor] = out.get(r.tensor, 0) + r.bytes
        return out

    def by_group(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.rows:
            out[r.group] = out.get(r.group, 0) + r.bytes
        return out

    def by_einsum(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.einsum] = out.get(r.einsum, 0) + r.bytes
        return out


def reread_factor(cascade: Cascade, group: FusionGroup, ranks: frozenset[str]) -> int:
    """Passes over a tensor indexed by ``ranks``: tiled loops outside all of them multiply."""
    factor = 1
    for r in group.loop_order:
        if r in ranks:
            break
        tile = group.tiles.get(r)
        if tile:
            factor *= math.ceil(cascade.rank_size(r) / tile)
    return factor


def recomputed_einsums(cascade: Cascade, group: FusionGroup) -> tuple[str, ...]:
    """The producers a group re-runs on chip, in cascade order (checked: outside the group)."""
    out = []
    for t in group.recompute:
        if cascade.producer(t) is None:
            raise MappingError(
                f"group [{', '.join(group.einsums)}] recomputes {t}, which no Einsum produces "
                f"(inputs and weights are read, not recomputed)"
            )
        if t in group.einsums:
            raise MappingError(
                f"group [{', '.join(group.einsums)}] recomputes {t}, which it already computes"
            )
        out.append(t)
    order = {n: i for i, n in enumerate(cascade.einsum_names)}
    return tuple(sorted(out, key=order.__getitem__))


def group_traffic(
    ctx: CostContext,
    group: FusionGroup,
    index: int = 0,
    *,
    not_written: frozenset[str] = frozenset(),
    resident: dict[str, tuple[str, ...]] | None = None,
) -> list[TrafficRow]:
    """The transfers of one group by the module's rule.

    ``not_written``: tensors of this group that every outside consumer recomputes.
    ``resident``: on a ``weights_resident`` arch, weight -> Einsums that have read it so far
    (updated in place); only the part of a weight no earlier group read is transferred.
    """
    cascade = ctx.cascade
    order = {n: i for i, n in enumerate(cascade.einsum_names)}
    members = tuple(sorted(group.einsums, key=order.__getitem__))
    recomputed = recomputed_einsums(cascade, group)
    produced = set(members) | set(recomputed)
    readers: dict[str, list[str]] = {}
    for e in sorted(produced, key=order.__getitem__):
        for t in ctx.reads(e):
            if t not in produced:
                readers.setdefault(t, []).append(e)
    rows: list[TrafficRow] = []
    for t, who in readers.items():
        if ctx.arch.weights_resident and cascade.tensors[t].role == "weight" and resident is not None:
            before = resident.get(t, ())
            resident[t] = tuple(sorted({*before, *who}))
            fp = ctx.footprint_bytes(t, resident[t]) - (ctx.footprint_bytes(t, before) if before else 0)
            if fp:
                rows.append(
                    TrafficRow(t, index, _attribute(ctx, members, recomputed, who), "read", fp, 1, fp)
                )
            continue
        fp = ctx.footprint_bytes(t, tuple(who))
        ranks = frozenset().union(*(ctx.reads(e)[t].ranks for e in who))
        factor = reread_factor(cascade, group, ranks)
        if factor > 1 and fp + ctx.group_buffer_bytes(group) <= ctx.arch.fusion_buffer_bytes:
            factor = 1
        rows.append(
            TrafficRow(t, index, _attribute(ctx, members, recomputed, who), "read", fp * factor, factor, fp)
        )
    for e in members:
        outside = [c for c in cascade.consumers(e) if c not in group.einsums]
        output = cascade.tensors[e].role == "output" or not cascade.consumers(e)
        if output or (outside and e not in not_written):
            nbytes = cascade.nbytes(e)
            rows.append(TrafficRow(e, index, e, "write", nbytes, 1, nbytes))
    return rows


def _attribute(
    ctx: CostContext, members: tuple[str, ...], recomputed: tuple[str, ...], who: list[str]
) -> str:
    for e in who:
        if e in members:
            return e
    for m in members:
        if any(t in recomputed for t in ctx.reads(m)):
            return m
    return members[0]


def not_written_sets(cascade: Cascade, mapping: Mapping) -> list[frozenset[str]]:
    """Per group, its tensors whose every outside consumer group recomputes them (so no write)."""
    out = []
    for g in mapping.groups:
        skip = set()
        for e in g.einsums:
            if cascade.tensors[e].role == "output":
                continue
            outside = {mapping.group_of(c) for c in cascade.consumers(e) if c not in g.einsums}
            if outside and all(e in mapping.groups[gi].recompute for gi in outside):
                skip.add(e)
        out.append(frozenset(skip))
    return out


def check_mapping(ctx: CostContext, mapping: Mapping) -> Mapping:
    """Validate a mapping against the cascade, and against an arch that cannot fuse."""
    mapping.validate(ctx.cascade)
    if not ctx.arch.can_fuse:
        fused = [g.einsums for g in mapping.groups if len(g.einsums) > 1 or g.recompute]
        if fused:
            raise MappingError(
                f"arch {ctx.arch.name!r} cannot fuse (can_fuse: false) but the mapping fuses "
                f"[{', '.join(fused[0])}]: only the unfused mapping is admitted"
            )
    for gi, g in enumerate(mapping.groups):
        tiled = [r for r, t in g.tiles.items() if t < ctx.cascade.rank_size(r)]
        if not tiled:
            continue
        allowed = {name for name, _ in ctx.analysis.tileable(g.einsums)}
        bad = [r for r in tiled if r not in allowed]
        if bad:
            raise MappingError(
                f"group {gi} ({', '.join(g.einsums)}) tiles {', '.join(bad)}, which the analysis keeps untiled "
                f"(tileable here: {', '.join(sorted(allowed)) or 'none'}); see `mambalaya analyze`"
            )
    return mapping


def mapping_traffic(ctx: CostContext, mapping: Mapping) -> Traffic:
    """Every transfer of a mapping, group by group."""
    check_mapping(ctx, mapping)
    skip = not_written_sets(ctx.cascade, mapping)
    resident: dict[str, tuple[str, ...]] = {}
    rows: list[TrafficRow] = []
    for i, g in enumerate(mapping.groups):
        rows += group_traffic(ctx, g, i, not_written=skip[i], resident=resident)
    return Traffic(tuple(rows))


__all__ = [
    "Traffic",
    "TrafficRow",
    "check_mapping",
    "group_traffic",
    "mapping_traffic",
    "not_written_sets",
    "recomputed_einsums",
    "reread_factor",
]
