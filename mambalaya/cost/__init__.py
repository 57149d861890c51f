"""Stage ``cost``: traffic, op counts and roofline latency of a mapping's schedule.

Modules, in the order a cost is built:

- :mod:`~mambalaya.cost.ops`: operations per Einsum by kind (numeric, or sympy over params)
- :mod:`~mambalaya.cost.latency`: compute time, roofline group latency, overheads
- :mod:`~mambalaya.cost.context`: per-(cascade, arch) caches; lowering a group through them
- :mod:`~mambalaya.cost.price`: a schedule's traffic (its load and store statements) and ops
- :mod:`~mambalaya.cost.model`: ``evaluate`` -> :class:`CostReport` (rows, totals, JSON, DataFrames)
- :mod:`~mambalaya.cost.bounds`: a group's lower bound composed from its members' parts (no lowering)

A group's tile search, the baselines and the ``map`` report search, so they live in :mod:`mambalaya.mapper`
(``best_tiling``, ``unfused_baseline``, ``greedy_mapping``, and ``evaluate`` defaulting to the unfused baseline).

Typical use::

    from mambalaya.cost import evaluate
    from mambalaya.mapper import greedy_mapping
    report = evaluate(cascade, "h200", greedy_mapping(cascade, "h200"))
    report.latency_s, report.traffic_bytes, report.to_dataframe(), report.schedule
"""

from mambalaya.cost.context import CostContext
from mambalaya.cost.model import CostReport, EinsumCost, GroupCost, evaluate, evaluate_group, roofline
from mambalaya.cost.ops import MATRIX_MAC, OpCount, cascade_ops, einsum_ops, flops, ops_by_kind
from mambalaya.cost.price import Traffic, TrafficRow

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
    "ops_by_kind",
    "roofline",
]
