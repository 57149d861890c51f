"""A greedy fused mapping: the baseline the exact optimiser (``mambalaya.mapper``) must beat.

Walk the cascade in order. Each Einsum tries to join the group of its latest
producer (the only group it can join while groups stay in dependency order,
and the one it shares a tensor with, as a fusion group must); it joins when

1. the analysis says the grown group is legal,
2. its buffer need at the smallest tiles fits ``arch.fusion_buffer_bytes``, and
3. the grown group, costed alone, is not slower than the old group and the
   Einsum apart (fusing can only add weight re-reads or untiled buffers);

otherwise it starts a new group. An Einsum that reads only inputs and weights
starts a new group. Each group then gets the analysis's loop order and tiles:
none when its whole intermediates fit; else the first tileable loop of the
order (the token or chunk loop) tiled to the power of two, among those whose
buffer fits, that costs the least (the largest on a tie: a weight that no
longer fits beside a big tile is re-read per tile), and the next loop when
even tile 1 does not fit. An arch that cannot fuse gets the unfused mapping.
"""

from __future__ import annotations

from dataclasses import replace

from mambalaya.arch import Arch, load_arch
from mambalaya.cost.context import CostContext
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping


def _single(cascade: Cascade, name: str) -> FusionGroup:
    return FusionGroup((name,), cascade.einsum(name).ranks)


def schedule_group(ctx: CostContext, einsums: tuple[str, ...]) -> FusionGroup | None:
    """Loop order and tiles for a group (None when no tiling fits the fusion buffer)."""
    if len(einsums) == 1:
        return _single(ctx.cascade, einsums[0])
    an = ctx.analysis
    order = an.loop_order(einsums)
    cap = ctx.arch.fusion_buffer_bytes
    if an.tiled_buffer_bytes(einsums, {}) <= cap:
        return FusionGroup(einsums, order)
    fixed: dict[str, int] = {}
    for rank, size in an.tileable(einsums):
        options = [
            t for t in _powers_of_two(size) if an.tiled_buffer_bytes(einsums, {**fixed, rank: t}) <= cap
        ]
        if options:
            groups = [FusionGroup(einsums, order, {**fixed, rank: t}) for t in options]
            return min(groups, key=lambda g: (_standalone_latency(ctx, g), -g.tiles[rank]))
        fixed[rank] = 1
    return None


def _powers_of_two(size: int) -> list[int]:
    out, t = [], 1
    while t < size:
        out.append(t)
        t *= 2
    return out


def _standalone_latency(ctx: CostContext, group: FusionGroup) -> float:
    from mambalaya.cost.model import evaluate_group

    return evaluate_group(ctx, group).latency_s


def greedy_mapping(cascade: Cascade, arch: Arch | str, *, ctx: CostContext | None = None) -> Mapping:
    """The greedy fused mapping of the module docstring."""
    arch = load_arch(arch) if isinstance(arch, str) else arch
    if not arch.can_fuse:
        return replace(unfused_mapping(cascade), arch=arch.name)
    ctx = ctx or CostContext(cascade, arch)
    cap = arch.fusion_buffer_bytes
    groups: list[FusionGroup] = []
    where: dict[str, int] = {}
    for e in cascade.einsums:
        producers = [where[t] for t in e.reads if t in where and t != e.name]
        if producers:
            gi = max(producers)
            grown = (*groups[gi].einsums, e.name)
            if ctx.analysis.legal(grown) and ctx.analysis.min_buffer_bytes(grown) <= cap:
                scheduled = schedule_group(ctx, grown)
                apart = _standalone_latency(ctx, groups[gi]) + _standalone_latency(
                    ctx, _single(cascade, e.name)
                )
                if scheduled is not None and _standalone_latency(ctx, scheduled) <= apart:
                    groups[gi] = scheduled
                    where[e.name] = gi
                    continue
        groups.append(_single(cascade, e.name))
        where[e.name] = len(groups) - 1
    return Mapping(tuple(groups), cascade.name, arch.name)


__all__ = ["greedy_mapping", "schedule_group"]
