"""The space of a whole model (``chain_layers``) from one- and two-layer spaces, in time linear in layers.

Within-layer groups cost the same in every layer (the traffic rule sees the same roles and
consumers), so the one-layer space is built once and copied per layer; groups that cross a layer
boundary (out_proj of one layer with the in_proj of the next, the decode adapter) are enumerated
once on a two-layer chain, up to ``max_cross`` Einsums, and copied per boundary. The chain's cost
context answers group analyses from those two spaces too (:class:`_Relative`: their loop models under
the chain's names), so lowering the chosen mapping never analyses the whole chain (64 layers: 1669
edges through sympy).
"""

from __future__ import annotations

from dataclasses import dataclass

from mambalaya.analysis.candidates import GroupEnumeration
from mambalaya.analysis.groups import LoopModel
from mambalaya.arch import Arch
from mambalaya.cost.context import CostContext
from mambalaya.cost.legality import GroupAnalysis
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.chain import chain_layers, layer_name, split_layer_name
from mambalaya.ir.expr import accesses
from mambalaya.ir.mapping import FusionGroup
from mambalaya.mapper.space import (
    Candidate,
    Choice,
    Coster,
    Dominated,
    Rejected,
    Space,
    bound_candidates,
    build_space,
    shared_coster,
)
from mambalaya.mapper.tiling import score

#: Most Einsums of a group crossing a layer boundary in a chain's space (``max_cross``) unless the caller says.
DEFAULT_MAX_CROSS = 8


def _rename(members: tuple[str, ...], shift: int) -> tuple[str, ...]:
    out = []
    for m in members:
        base, k = split_layer_name(m)
        out.append(layer_name(base, (k or 0) + shift))
    return tuple(out)


class _Relative:
    """Maps a chained group to the one- or two-layer coster it was costed with, and its names there."""

    def __init__(self, layer: Cascade, chained: Cascade, one: Coster, two: Coster | None) -> None:
        self.within, self.one, self.two = set(layer.einsum_names), one, two
        self.chained = chained

    def tensors(self, rel: tuple[str, ...], members: tuple[str, ...]) -> dict[str, str]:
        """Relative tensor name -> chained one, for every tensor the relative members read or write."""
        coster = self(members)
        assert coster is not None
        rc, cc = coster[0].cascade, self.chained
        out: dict[str, str] = {}
        for r, m in zip(rel, members, strict=True):
            for acc_r, acc_m in zip(accesses(rc.einsum(r).expr), accesses(cc.einsum(m).expr), strict=True):
                out[acc_r.tensor] = acc_m.tensor
            er, em = rc.einsum(r).recurrence, cc.einsum(m).recurrence
            if er is not None and er.init and em is not None and em.init:
                out[er.init] = em.init
        return out

    def __call__(self, members: tuple[str, ...]) -> tuple[Coster, tuple[str, ...]] | None:
        """None for a group no space produced (it spans more than two layers)."""
        split = [split_layer_name(m) for m in members]
        if any(k is None for _, k in split):
            return None
        # an adapter (a name outside the layer) named after layer k sits between layers k-1 and k
        at = [(b, k, b in self.within) for b, k in split]
        lo = min(k if inside else k - 1 for _, k, inside in at)  # type: ignore[operator]
        if all(inside and k == lo for _, k, inside in at):
            return self.one, tuple(b for b, _, _ in at)
        rel = [(b, k - lo) for b, k, _ in at]  # type: ignore[operator]
        if self.two is None or any(k not in (0, 1) for _, k in rel):
            return None
        return self.two, tuple(layer_name(b, k) for b, k in rel)


@dataclass(frozen=True)
class _Renamed:
    """A one- or two-layer group's analysis seen under the chain's names."""

    einsums: tuple[str, ...]
    legal: bool
    reasons: tuple[str, ...]
    loop_order: tuple[str, ...]
    loops: LoopModel


class _ChainAnalysis(GroupAnalysis):
    """The chain's group analyses, read off the one- and two-layer ones (groups are renamed copies:
    same loops, ranks and buffers); a group spanning more layers gets the whole chain's analysis."""

    def __init__(self, chained: Cascade, relative: _Relative) -> None:  # no analyzer of the whole chain
        self.cascade, self._relative, self._cache = chained, relative, {}
        self._full: GroupAnalysis | None = None

    def analyze(self, einsums: tuple[str, ...] | list[str], convex: bool = True):
        key = tuple(sorted(einsums))
        got = self._cache.get(key)
        if got is not None:
            return got
        members = tuple(sorted(einsums, key=self.cascade.einsum_names.index))
        rel = self._relative(members)
        if rel is None:
            if self._full is None:
                self._full = GroupAnalysis(self.cascade)
            got = self._full.analyze(einsums)
        else:
            cg = rel[0].analyse(rel[1])
            names = dict(zip(rel[1], members, strict=True))
            names.update(self._relative.tensors(rel[1], members))
            got = _Renamed(members, cg.legal, cg.reasons, cg.loop_order, cg.loops.renamed(names))
        self._cache[key] = got
        return got


def build_chain_space(layer: Cascade, layers: int, arch: Arch, objective: str = "latency", *,
                      max_cross: int = DEFAULT_MAX_CROSS, chained: Cascade | None = None,
                      one: Space | None = None) -> tuple[Cascade, Space]:
    """The space of ``chain_layers(layer, layers)`` (or of ``chained``, a chain of ``layer``).

    Exact over that space: the only groups left out cross a boundary with more than ``max_cross`` (the space's
    ``left_out`` says so when a group at that size could have grown). ``one``: the layer's space when it is a
    lazy one already solved (its unsearched groups, and those it pruned, enter at their lower bounds: the chain's
    space is then lazy too, enough for :func:`~mambalaya.mapper._by_layers` to prove the layer's optimum repeated);
    else the layer's eager space is built.
    """
    chained = chained or chain_layers(layer, layers)
    one = build_space(layer, arch, objective) if one is None else one
    inf = float("inf")
    known = dict(one.best)  # (real covers' costs only: a lazy space's bounds are no cover)
    for c in one.candidates:
        if c.exact:
            known[c.einsums] = min(known.get(c.einsums, (inf, inf)), score(c, objective))  # type: ignore[arg-type]
    layer_cands = [*one.candidates, *bound_candidates(one, sorted(one.pruned))]
    cands: list[Candidate] = []
    for k in range(layers):
        ren = {m: layer_name(m, k) for m in layer.einsum_names}
        for c in layer_cands:
            names = tuple(ren[m] for m in c.einsums)
            g = FusionGroup(names, c.group.loop_order, dict(c.group.tiles))
            cands.append(Candidate(names, g, c.traffic_bytes, c.latency_s, c.buffer_bytes, c.compute_s, c.transfers,
                                   exact=c.exact))
    enumerated, evaluations = one.enumerated, one.evaluations
    rejected = {layer_name(e, k): r for e, r in one.rejected_singletons.items() for k in range(layers)}
    coster, crossing = None, None
    if not arch.can_fuse:  # (no group crosses a layer either: only the boundary's own Einsums, alone)
        max_cross = 1
    if layers > 1:
        two = chain_layers(layer, 2, feed=tuple(chained.meta["feed"]))  # type: ignore[arg-type]
        within = set(layer.einsum_names)
        coster = shared_coster(two, arch, objective)  # (a chain mapped again, or with more layers, reuses it)
        kept: dict[tuple[str, ...], Choice | Rejected | Dominated] = {}

        def base(members: tuple[str, ...]) -> tuple[str, ...] | None:
            """The one-layer names of a group within one layer of the two (None: it crosses)."""
            split = [split_layer_name(m) for m in members]
            if len({k for _, k in split}) == 1 and all(b in within for b, _ in split):
                return tuple(b for b, _ in split)
            return None

        def best_elsewhere(members: tuple[str, ...]) -> tuple[float, float] | None:
            b = base(members)
            return None if b is None else known.get(b)

        coster.best_elsewhere = best_elsewhere

        def keep(members: tuple[str, ...]) -> bool:
            b = base(members)
            if b is not None:  # within a layer: decided (and costed) by the one-layer space
                return b in one.grown
            ch = kept.get(members)
            if ch is None:  # (the loop below has usually chosen it already)
                ch = kept[members] = coster.choose(members)
            return not isinstance(ch, Rejected)

        crossing = GroupEnumeration(two, max_cross, keep=keep, dag=coster.dag)
        for members in crossing:
            enumerated += 1
            if members not in kept and base(members) is None:
                kept[members] = coster.choose(members)
        for members, ch in kept.items():
            if not isinstance(ch, Choice):
                if len(members) == 1:
                    rejected.update({_rename(members, k)[0]: ch for k in range(layers - 1)})
                continue
            for k in range(layers - 1):
                names = _rename(members, k)
                g = FusionGroup(names, ch.loop_order, dict(ch.tiles))
                cands.append(Candidate(names, g, ch.traffic_bytes, ch.latency_s, ch.buffer_bytes, ch.compute_s,
                                       ch.transfers))
        evaluations += coster.evaluations
    relative = _Relative(layer, chained, one.coster, coster)  # type: ignore[arg-type]
    analysis = _ChainAnalysis(chained, relative)
    ctx = CostContext(chained, arch, analysis)
    space = Space(chained, arch, objective, cands, rejected, enumerated, evaluations, max_cross, ctx)
    space.layer_space = one  # type: ignore[attr-defined]  (the layer-decomposition proof reads it)
    space.lazy = any(not c.exact for c in cands)
    space.searches = one.coster.searched + (coster.searched if coster is not None else 0)  # type: ignore[attr-defined]
    space.dominated = one.dominated + (sum(isinstance(ch, Dominated) for ch in kept.values()) if coster else 0)
    cut = [one.left_out] if one.left_out else []
    if crossing is not None and crossing.truncated and arch.can_fuse:
        cut.append(f"groups crossing a layer boundary with more than {max_cross} Einsums (max_cross; some groups "
                   f"at it could grow)")
    space.left_out = "; ".join(cut) or None
    return chained, space
