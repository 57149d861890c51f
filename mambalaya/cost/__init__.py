"""Stage ``cost``: traffic, op counts and roofline latency of a mapping's schedule.

Modules, in the order a cost is built:

- :mod:`~mambalaya.cost.ops`: operations per Einsum by kind (numeric, or sympy over params)
- :mod:`~mambalaya.cost.latency`: compute time, roofline group latency, overheads
- :mod:`~mambalaya.cost.context`: per-(cascade, arch) caches; lowering a group through them
- :mod:`~mambalaya.cost.price`: a schedule's traffic (its load and store statements) and ops
- :mod:`~mambalaya.cost.model`: ``evaluate`` -> :class:`CostReport` (rows, totals, JSON, DataFrames)
- :mod:`~mambalaya.cost.bounds`: a group's lower bound composed from its members' parts (no lowering)
- :mod:`~mambalaya.cost.tiling`: a group's best tiling on an arch
- :mod:`~mambalaya.cost.heuristics`: ``greedy_mapping`` and ``unfused_baseline``
- :mod:`~mambalaya.cost.mapreport`: ``map_report`` / ``format_map_report`` for ``mambalaya map``

Typical use::

    from mambalaya.cost import evaluate, greedy_mapping
    report = evaluate(cascade, "h200", greedy_mapping(cascade, "h200"))
    report.latency_s, report.traffic_bytes, report.to_dataframe(), report.schedule
"""

from mambalaya.cost.context import CostContext
from mambalaya.cost.heuristics import greedy_mapping, unfused_baseline
from mambalaya.cost.mapreport import format_map_report, map_report
from mambalaya.cost.model import CostReport, EinsumCost, GroupCost, evaluate, evaluate_group, roofline
from mambalaya.cost.ops import MATRIX_MAC, OpCount, cascade_ops, einsum_ops, flops, ops_by_kind
from mambalaya.cost.price import Traffic, TrafficRow
from mambalaya.cost.tiling import Tiled, Untileable, best_tiling

__all__ = [
    "MATRIX_MAC",
    "CostContext",
    "CostReport",
    "EinsumCost",
    "GroupCost",
    "OpCount",
    "Tiled",
    "Traffic",
    "TrafficRow",
    "Untileable",
    "best_tiling",
    "cascade_ops",
    "einsum_ops",
    "evaluate",
    "evaluate_group",
    "flops",
    "format_map_report",
    "greedy_mapping",
    "map_report",
    "ops_by_kind",
    "roofline",
    "unfused_baseline",
]
