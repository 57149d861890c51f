"""The analyzer: fusion class of every edge, legal fusion groups and their buffer needs.

Modules, one concept each: ``matching`` (ranks matched through a tensor, splits and
halos), ``edges`` (per-edge fusion class), ``kinds`` (Einsum kinds, iterative
ranks), ``candidates`` (connected convex groups), ``groups`` (legality, loop
order, buffer need), ``summary`` (``analyze`` and its JSON), ``table`` (terminal table).
"""

from mambalaya.analysis.candidates import EinsumDag, GroupEnumeration, candidate_groups
from mambalaya.analysis.edges import (
    FUSION_CLASSES,
    Edge,
    Iterative,
    classify_edge,
    classify_edges,
    tile_symbol,
)
from mambalaya.analysis.groups import (
    Binding,
    BufferFactor,
    BufferTerm,
    CandidateGroup,
    GroupAnalyzer,
    GroupRank,
    LoopModel,
    analyze_group,
    check_group,
)
from mambalaya.analysis.kinds import KINDS, einsum_kind, iterative_rank
from mambalaya.analysis.matching import Halo, PositionMatch, match_positions
from mambalaya.analysis.summary import DEFAULT_MAX_CANDIDATES, Analysis, analyze
from mambalaya.analysis.table import format_edge_table, format_group_table

__all__ = [
    "DEFAULT_MAX_CANDIDATES",
    "FUSION_CLASSES",
    "KINDS",
    "Analysis",
    "Binding",
    "BufferFactor",
    "BufferTerm",
    "CandidateGroup",
    "Edge",
    "EinsumDag",
    "GroupAnalyzer",
    "GroupEnumeration",
    "GroupRank",
    "LoopModel",
    "Halo",
    "Iterative",
    "PositionMatch",
    "analyze",
    "analyze_group",
    "candidate_groups",
    "check_group",
    "classify_edge",
    "classify_edges",
    "einsum_kind",
    "format_edge_table",
    "format_group_table",
    "iterative_rank",
    "match_positions",
    "tile_symbol",
]
