"""The cost model's view of the analysis stage: is a group legal, its loop order, its buffer need.

A thin adapter so the cost model and the greedy heuristic depend on a few
names of :mod:`mambalaya.analysis.groups` only; the analysis owns the rules
(the fusion classes, :mod:`mambalaya.analysis`). Loop names of the analysis may carry primes (``q'``, a
second loop over a rank called ``q``); mappings name plain cascade ranks, so
:func:`plain_loop_order` strips them.
"""

from __future__ import annotations

from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup


class GroupAnalysis:
    """Cached group analyses of one cascade."""

    def __init__(self, cascade: Cascade) -> None:
        from mambalaya.analysis.groups import GroupAnalyzer

        self.cascade = cascade
        self._analyzer = GroupAnalyzer(cascade)
        self._cache: dict[tuple[str, ...], object] = {}

    def analyze(self, einsums: tuple[str, ...] | list[str], convex: bool = True):
        """The analysis's ``CandidateGroup``: ``legal``, ``reasons``, ``loop_order``, ``ranks``, buffers
        (``convex=False``: without the convexity rule, for a group that recomputes a producer)."""
        key = (*sorted(einsums), convex) if not convex else tuple(sorted(einsums))
        if key not in self._cache:
            self._cache[key] = self._analyzer.analyze(list(einsums), convex)
        return self._cache[key]

    def problems(self, einsums: tuple[str, ...] | list[str]) -> list[str]:
        """Why the Einsums cannot form one fusion group (empty: legal)."""
        return list(self.analyze(einsums).reasons)

    def legal(self, einsums: tuple[str, ...] | list[str]) -> bool:
        return bool(self.analyze(einsums).legal)

    def min_buffer_bytes(self, einsums: tuple[str, ...] | list[str]) -> int:
        """The least on-chip bytes the group can need (every tiled loop at tile 1)."""
        return int(self.analyze(einsums).buffer_min_bytes)

    def buffer_bytes(self, group: FusionGroup) -> int:
        """On-chip bytes of the group's own intermediates at its tiles (untiled loops at full extent)."""
        return self.tiled_buffer_bytes(group.einsums, group.tiles)

    def tiled_buffer_bytes(self, einsums: tuple[str, ...] | list[str], tiles: dict[str, int]) -> int:
        return int(self.analyze(einsums).buffer_bytes(dict(tiles)))

    def loop_order(self, einsums: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """The analysis's loop order (outermost first), as plain cascade rank names."""
        return plain_loop_order(self.analyze(einsums).loop_order)

    def tileable(self, einsums: tuple[str, ...] | list[str]) -> list[tuple[str, int]]:
        """(loop, size) of the fused loops that may be tiled, outer first (size-1, primed loops left out)."""
        info = self.analyze(einsums)
        ranks = getattr(info, "ranks", None) or info.loops.ranks
        by_name = {r.name: r for r in ranks}
        out = []
        for name in info.loop_order:
            r = by_name.get(name)
            if r is not None and r.tiled and r.size > 1 and not name.endswith("'"):
                out.append((name, int(r.size)))
        return out


def plain_loop_order(loop_order: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Analysis loop names as cascade rank names: primes stripped, first occurrence kept."""
    return tuple(dict.fromkeys(name.rstrip("'") for name in loop_order))


__all__ = ["GroupAnalysis", "plain_loop_order"]
