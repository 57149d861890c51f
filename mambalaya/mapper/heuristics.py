"""Baseline mappings the exact optimiser (``mambalaya.mapper``) is held against.

- :func:`unfused_baseline`: one group per Einsum, each at its best tiling (:mod:`.tiling`): the
  unfused accelerator of a MARCA-style baseline, every operator streaming its operands through the
  buffer. An untiled Einsum of a published layer rarely fits a buffer whole, so the baseline tiles.
- :func:`greedy_mapping`: walk the cascade in order; each Einsum joins the group of its latest
  producer (the only group it can join while groups stay in dependency order) when the grown group
  is legal, some tiling of it fits, and it costs no more than the old group and the Einsum apart;
  otherwise it starts a new group. An arch that cannot fuse gets the unfused baseline.
"""

from __future__ import annotations

from mambalaya.arch import Arch, load_arch
from mambalaya.cost.context import CostContext
from mambalaya.cost.model import CostReport
from mambalaya.cost.model import evaluate as evaluate_mapping
from mambalaya.errors import MappingError
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.chain import split_layer_name
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.mapper.tiling import Tiled, best_tiling


def evaluate(cascade: Cascade, arch: Arch | str, mapping: Mapping | None = None, *,
             ctx: CostContext | None = None) -> CostReport:
    """The cost of ``mapping`` of ``cascade`` on ``arch`` (:func:`mambalaya.cost.evaluate`); without one, of the
    unfused baseline (:func:`unfused_baseline`: every Einsum alone at its best tiling, since an untiled Einsum of a
    published layer rarely fits a buffer whole)."""
    arch = load_arch(arch) if isinstance(arch, str) else arch
    ctx = ctx or CostContext(cascade, arch)
    return evaluate_mapping(cascade, arch, unfused_baseline(cascade, arch, ctx=ctx) if mapping is None else mapping,
                            ctx=ctx)


def _tiled(ctx: CostContext, einsums: tuple[str, ...]) -> Tiled:
    got = best_tiling(ctx, einsums)
    if not isinstance(got, Tiled):
        need = f" (it needs at least {got.need_bytes} bytes on chip)" if got.need_bytes else ""
        raise MappingError(f"no tiling of [{', '.join(einsums)}] fits {ctx.arch.name}: {got.reason}{need}")
    return got


def unfused_baseline(cascade: Cascade, arch: Arch | str, *, ctx: CostContext | None = None) -> Mapping:
    """Every Einsum alone, at its best tiling on the arch. In a chain of layers each layer's copy of an Einsum is
    the same computation on tensors of the same shapes, so its tiles are searched once (64 layers: 64x fewer)."""
    arch = load_arch(arch) if isinstance(arch, str) else arch
    ctx = ctx or CostContext(cascade, arch)
    first: dict[str, FusionGroup] = {}  # a chained Einsum's base name -> its first copy's tiling
    groups = []
    for e in cascade.einsums:
        base, layer = split_layer_name(e.name) if "layers" in cascade.meta else (e.name, None)
        got = first.get(base) if layer is not None else None
        if got is None:
            got = _tiled(ctx, (e.name,)).group
            if layer is not None:
                first[base] = got
            groups.append(got)
        else:
            groups.append(FusionGroup((e.name,), got.loop_order, dict(got.tiles)))
    return Mapping(tuple(groups), cascade.name, arch.name)


def greedy_mapping(cascade: Cascade, arch: Arch | str, *, ctx: CostContext | None = None) -> Mapping:
    """The greedy fused mapping of the module docstring."""
    arch = load_arch(arch) if isinstance(arch, str) else arch
    ctx = ctx or CostContext(cascade, arch)
    if not arch.can_fuse:
        return unfused_baseline(cascade, arch, ctx=ctx)
    groups: list[Tiled] = []
    where: dict[str, int] = {}
    for e in cascade.einsums:
        producers = [where[t] for t in e.reads if t in where and t != e.name]
        if producers:
            gi = max(producers)
            grown = (*groups[gi].group.einsums, e.name)
            if ctx.analysis.legal(grown):
                fused = best_tiling(ctx, grown)
                alone = _tiled(ctx, (e.name,))
                if isinstance(fused, Tiled) and fused.cost.latency_s <= groups[gi].cost.latency_s + alone.cost.latency_s:
                    groups[gi] = fused
                    where[e.name] = gi
                    continue
        groups.append(_tiled(ctx, (e.name,)))
        where[e.name] = len(groups) - 1
    return Mapping(tuple(g.group for g in groups), cascade.name, arch.name)


__all__ = ["greedy_mapping", "unfused_baseline"]
