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
  one per write: CGLA DMA setup), and ``arch.statement_overhead_s`` per execution of any statement of
  its loop nest (a CPU executor's per-tile loop body: a load, a store, a compute run once per tile). A
  mapping's latency is the sum over its groups.
- **Parallel extent** (archs with ``program_slots``, a GPU's SMs): a group's ``P`` programs run in
  ``waves = ceil(P / slots)`` waves, so only ``P / (waves * slots)`` of the chip works: the roofline
  time is divided by that fraction (one program of a 132-SM chip runs 132x longer than the chip would).
- **Sequential depth**: a recurrence's steps depend on each other. Each program (the whole chip, without
  slots) walks its recurrences' steps one after another, ``ceil(state / step_width)`` blocks per step,
  each ``recurrence_step_s``, and each further statement of a recurrence's tile loop (a load, a compute,
  a store: one more dependent round trip a step) ``recurrence_statement_s``. Programs resident on one slot at once (``resident_programs``, as many as
  fit its buffer capacity together) overlap their chains: the group takes at least
  ``ceil(P / (slots x resident)) x`` that chain.
- **Staging** (archs with ``staging_bandwidth``: a GPU printer's per-program scratch): what a group moves
  through scratch outside registers (:func:`~mambalaya.cost.price.staged_bytes`) at that bandwidth, added to
  the roofline (the same instructions do it); measured kernels fit it (benchmarks/results/gpu_tiles.md).
- An Einsum's latency is its share of its group's: its own compute time plus the rest of the group latency
  split in proportion to ``max(compute, memory)`` of its Einsums (equal shares when all are 0), so no Einsum's
  share is below its compute time.
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


def parallel_fraction(arch: Arch, programs: int) -> tuple[float, int]:
    """(fraction of the chip a grid of ``programs`` keeps busy, waves it runs in); (1, 1) without slots."""
    slots = arch.program_slots
    if slots <= 0 or programs <= 0:
        return 1.0, 1
    waves = -(-programs // slots)
    return programs / (waves * slots), waves


def chain_seconds(arch: Arch, programs: int, chain_steps: int, occupancy_bytes: int, statements: int = 0) -> float:
    """The dependency chain's floor: each program's steps (and the further statements of its recurrences' tile
    loops, ``arch.recurrence_statement_s`` each), in as many rounds as its programs need of the slots' resident
    places (module docstring)."""
    if chain_steps <= 0 or arch.recurrence_step_s <= 0:
        return 0.0
    rounds = 1
    if arch.program_slots > 0:
        fit = max(1, arch.fusion_buffer_bytes // max(1, occupancy_bytes))
        places = arch.program_slots * min(arch.resident_programs, fit)
        rounds = -(-max(1, programs) // places)
    return rounds * (chain_steps * arch.recurrence_step_s + statements * arch.recurrence_statement_s)


def staging_seconds(arch: Arch, nbytes: int | float) -> float:
    """Time the programs' scratch takes to move ``nbytes`` (0 on an arch without a staging bandwidth)."""
    return float(nbytes) / arch.staging_bandwidth if arch.staging_bandwidth > 0 else 0.0


def group_latency(arch: Arch, compute_s: float, traffic_bytes: int, transfers: int, programs: int = 0,
                  chain_s: float = 0.0, staging_s: float = 0.0, executions: int = 0) -> tuple[float, float]:
    """(latency, overhead) of one group: the roofline over the part of the chip its grid occupies plus its
    staging through scratch (the same programs' instructions: it does not overlap), at least its recurrences'
    dependency chain (:func:`chain_seconds`), plus per-group, per-transfer and per-statement-execution overheads."""
    overhead = arch.group_overhead_s + arch.transfer_overhead_s * transfers + arch.statement_overhead_s * executions
    frac, _ = parallel_fraction(arch, programs)
    return max((max(compute_s, memory_seconds(arch, traffic_bytes)) + staging_s) / frac, chain_s) + overhead, overhead


def split_latency(total: float, weights: list[float], floors: list[float] | None = None) -> list[float]:
    """``total`` split in proportion to ``weights`` (equal shares when they are all 0); with ``floors`` (each
    member's compute time, which a group's latency always covers), each share is its floor plus its part of the
    rest, so no member's share is below its own compute time (its utilisation never reads over 100 %)."""
    if floors is not None:
        base = sum(floors)
        if base <= total:
            return [f + r for f, r in zip(floors, split_latency(total - base, weights), strict=True)]
    s = sum(weights)
    if s <= 0:
        return [total / len(weights)] * len(weights)
    return [total * w / s for w in weights]


#: The terms of :func:`latency_parts`, as reports name them (in the order they add up).
LATENCY_PARTS = {"roofline_s": "roofline (compute and memory overlapped)", "staging_s": "staging through scratch",
                 "idle_s": "chip idle (grids smaller than its program slots)",
                 "chain_wait_s": "waiting on recurrence chains", "overhead_s": "overheads"}


def latency_parts(compute_s: float, memory_s: float, staging_s: float, parallel_fraction: float, chain_s: float,
                  overhead_s: float) -> dict[str, float]:
    """A group's latency (:func:`group_latency`) as terms that add up to it: the roofline (compute and memory
    overlapped), staging, the chip left idle by a grid smaller than its program slots (the roofline stretched
    by ``1 / parallel_fraction``), the wait for a recurrence chain longer than all that, and overheads."""
    busy = max(compute_s, memory_s) + staging_s
    spread = busy / parallel_fraction if parallel_fraction > 0 else busy
    return {"roofline_s": max(compute_s, memory_s), "staging_s": staging_s, "idle_s": spread - busy,
            "chain_wait_s": max(0.0, chain_s - spread), "overhead_s": overhead_s}


__all__ = ["LATENCY_PARTS", "chain_seconds", "compute_seconds", "group_latency", "latency_parts", "memory_seconds",
           "parallel_fraction", "split_latency",
           "staging_seconds"]
