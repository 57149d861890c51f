"""Stage ``cost``: off-chip traffic, op counts and roofline latency of a mapping (DESIGN.md section 4).

Modules, in the order a cost is built:

- :mod:`~mambalaya.cost.ops`: operations per Einsum by kind (numeric, or sympy over params)
- :mod:`~mambalaya.cost.footprint`: exact read footprints of index expressions
- :mod:`~mambalaya.cost.traffic`: bytes per tensor and group (the rule the executor reproduces)
- :mod:`~mambalaya.cost.latency`: compute time, roofline group latency, overheads
- :mod:`~mambalaya.cost.model`: ``evaluate`` -> :class:`CostReport` (rows, totals, JSON, DataFrames)
- :mod:`~mambalaya.cost.heuristics`: ``greedy_mapping``, the baseline fused mapping
- :mod:`~mambalaya.cost.mapreport`: ``map_report`` / ``format_map_report`` for ``mambalaya map``

Typical use::

    from mambalaya.cost import evaluate, greedy_mapping
    report = evaluate(cascade, "h200", greedy_mapping(cascade, "h200"))
    report.latency_s, report.traffic_bytes, report.to_dataframe()
"""

from mambalaya.cost.context import CostContext
from mambalaya.cost.heuristics import greedy_mapping, schedule_group
from mambalaya.cost.mapreport import format_map_report, map_report
from mambalaya.cost.model import CostReport, EinsumCost, GroupCost, evaluate, evaluate_group, roofline
from mambalaya.cost.ops import MATRIX_MAC, OpCount, cascade_ops, einsum_ops, flops, ops_by_kind
from mambalaya.cost.traffic import Traffic, TrafficRow, group_traffic, mapping_traffic, reread_factor

__all__ = [
    "MATRIX_MAC",
    "CostContext",
    "CostReport",
    "EinsumCost",
    "GroupCost",
    "OpCount",
    "Traffic",
    "TrafficRow",
    "cascade_ops",
    "einsum_ops",
    "evaluate",
    "evaluate_group",
    "flops",
    "format_map_report",
    "greedy_mapping",
    "group_traffic",
    "map_report",
    "mapping_traffic",
    "ops_by_kind",
    "reread_factor",
    "roofline",
    "schedule_group",
]
