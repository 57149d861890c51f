"""Roofline latency: compute time of op counts, and a fused group's time from its parts.

- An Einsum's compute time is ``sum(count / arch.throughput(kind, matrix))`` over its
  op counts; on a ``cgla`` arch each op that belongs to a reduction of length L is
  slowed by ``1 / arch.pipeline_occupancy(L)`` (pipeline fill and drain: IMAX's
  64-stage lane reaches half its peak at L = 64).
- Its memory time is its attributed traffic over ``arch.offchip_bandwidth``.
- A group's latency is ``max(sum of compute, group traffic / bandwidth)`` (compute
  and transfers overlap inside a fused loop nest) plus ``arch.group_overhead_s``
  (kernel launch, host coordination, reconfiguration) plus
  ``arch.transfer_overhead_s`` per off-chip transfer (one per pass of each read and
  one per write: CGLA DMA setup). A mapping's latency is the sum over its groups.
- An Einsum's latency is its share of its group's: the group latency split in
  proportion to ``max(compute, memory)`` of its Einsums (equal shares when all are 0).
"""

from __future__ import annotations

from mambalaya.arch import Arch
from mambalaya.cost.ops import OpCount


def compute_seconds(arch: Arch, counts: tuple[OpCount, ...] | list[OpCount]) -> float:
    """Time the arch's units need for these ops, at their achievable rates."""
    total = 0.0
    for c in counts:
        t = float(c.count) / arch.throughput(c.kind, matrix=c.matrix)
        if arch.kind == "cgla" and c.reduce_len > 0:
            t /= arch.pipeline_occupancy(c.reduce_len)
        total += t
    return total


def memory_seconds(arch: Arch, nbytes: int | float) -> float:
    return float(nbytes) / arch.offchip_bandwidth


def group_latency(arch: Arch, compute_s: float, traffic_bytes: int, transfers: int) -> tuple[float, float]:
    """(latency, overhead) of one group: roofline max plus per-group and per-transfer overheads."""
    overhead = arch.group_overhead_s + arch.transfer_overhead_s * transfers
    return max(compute_s, memory_seconds(arch, traffic_bytes)) + overhead, overhead


def split_latency(total: float, weights: list[float]) -> list[float]:
    """``total`` split in proportion to ``weights`` (equal shares when they are all 0)."""
    s = sum(weights)
    if s <= 0:
        return [total / len(weights)] * len(weights)
    return [total * w / s for w in weights]


__all__ = ["compute_seconds", "group_latency", "memory_seconds", "split_latency"]
