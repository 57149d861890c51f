"""``analyze(cascade)``: every edge's fusion class and every candidate group, as one object.

This is what ``mambalaya analyze`` prints and what the mapper consumes. Groups
are enumerated with :func:`mambalaya.analysis.candidates.candidate_groups`
(connected, convex, at most ``max_group_size`` Einsums, smallest first) and
each is checked by :class:`mambalaya.analysis.groups.GroupAnalyzer`;
``to_json`` gives the contract (``analyze --json``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from mambalaya.analysis.candidates import GroupEnumeration
from mambalaya.analysis.edges import Edge, classify_edges
from mambalaya.analysis.groups import CandidateGroup, GroupAnalyzer
from mambalaya.analysis.kinds import einsum_kind, iterative_rank
from mambalaya.ir.cascade import Cascade

#: Default budget of candidate groups: a whole Mamba layer (861 / 3171 candidates) is enumerated
#: completely; on a chain of layers enumeration stops after the group size where the budget ran out
#: (every smaller group is still there). Pass ``max_candidates=None`` and a ``max_group_size`` instead.
DEFAULT_MAX_CANDIDATES = 10_000


@dataclass(frozen=True)
class Analysis:
    """The analyzer's result for one cascade (with its params bound)."""

    cascade: Cascade
    edges: tuple[Edge, ...]
    groups: tuple[CandidateGroup, ...]  # every candidate, legal or not, smallest first
    max_group_size: int | None
    capacity_bytes: int | None
    enumeration_s: float  # wall time to enumerate and check the candidates
    complete_size: int  # every candidate of up to this many Einsums is in groups
    truncated: bool  # a cap (size, budget) left larger candidates out

    @property
    def legal_groups(self) -> tuple[CandidateGroup, ...]:
        return tuple(g for g in self.groups if g.legal)

    def edge(self, producer: str, consumer: str) -> Edge:
        for e in self.edges:
            if e.producer == producer and e.consumer == consumer:
                return e
        raise KeyError(f"no edge {producer} -> {consumer}")

    def group(self, einsums) -> CandidateGroup | None:
        key = set(einsums)
        return next((g for g in self.groups if set(g.einsums) == key), None)

    def to_json(self, include_groups: bool = False) -> dict:
        """The ``analyze --json`` object, plus candidate counts and timing."""
        c = self.cascade
        out = {
            "cascade": c.name,
            "params": {k: v if math.isfinite(v) else str(v) for k, v in c.params.items()},  # strict JSON
            "einsums": [
                {
                    "name": e.name,
                    "text": e.text,
                    "ranks": list(e.ranks),
                    "reads": list(e.reads),
                    "writes": [e.name],
                    "kind": einsum_kind(c, e),
                    "iterative": iterative_rank(e)[0] if iterative_rank(e) else None,
                }
                for e in c.einsums
            ],
            "tensors": {
                name: {"role": t.role, "shape": list(c.shape(name)), "dtype": t.dtype,
                       "ranks": [r for r in t.rank_names]}
                for name, t in c.tensors.items()
            },
            "edges": [e.to_dict() for e in self.edges],
            "groups_legal": len(self.legal_groups),
            "groups_candidates": len(self.groups),
            "groups_complete_size": self.complete_size,
            "groups_truncated": self.truncated,
            "max_group_size": self.max_group_size,
            "capacity_bytes": self.capacity_bytes,
            "enumeration_s": round(self.enumeration_s, 4),
        }
        if include_groups:
            out["groups"] = [g.to_dict() for g in self.groups]
        return out


def analyze(cascade: Cascade, max_group_size: int | None = None,
            max_candidates: int | None = DEFAULT_MAX_CANDIDATES, capacity_bytes: int | None = None) -> Analysis:
    """Classify every edge, then enumerate and check the candidate fusion groups.

    ``max_group_size`` caps the Einsums per group; ``max_candidates`` caps the candidates (whole
    group sizes at a time, smallest first); ``None`` lifts a cap. ``capacity_bytes`` marks groups
    whose smallest-tile buffer does not fit as illegal and stops growing groups from them.
    """
    edges = classify_edges(cascade)
    analyzer = GroupAnalyzer(cascade, edges, capacity_bytes)
    start = time.perf_counter()
    checked: dict[tuple[str, ...], CandidateGroup] = {}

    def keep(group: tuple[str, ...]) -> bool:
        return checked[group].fault != "capacity"

    enumeration = GroupEnumeration(cascade, max_group_size, max_candidates,
                                   keep if capacity_bytes is not None else None, analyzer.dag)
    groups = []
    for group in enumeration:
        cand = analyzer.analyze(group)
        checked[group] = cand
        groups.append(cand)
    elapsed = time.perf_counter() - start
    return Analysis(cascade, edges, tuple(groups), max_group_size, capacity_bytes, elapsed,
                    enumeration.complete_size, enumeration.truncated)
