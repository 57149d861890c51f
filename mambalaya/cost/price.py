"""Pricing a group's schedule: its traffic is its statements, its compute its members' ops.

The one traffic rule: a group moves, off chip and back, exactly the elements of its
:class:`~mambalaya.schedule.Load` and :class:`~mambalaya.schedule.Store` statements over every
execution (:mod:`mambalaya.schedule.extent` counts them), in bytes of each tensor's declared
element size; each execution of a load or store is one transfer (what a per-transfer DMA setup
charges). The backends count the same statements as they run them, so ``verify`` holds the
count to this prediction. Compute is each member's op count (:mod:`.ops`) once per element it
computes, times the programs a GPU replicates it in. Latency is the roofline of
:mod:`.latency`.

Bytes are attributed to Einsums for the per-Einsum table: a load to the first member (cascade
order) that reads its buffer, a store to the member it stores; a recomputed producer's ops to the
first member reading it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mambalaya.cost.context import CostContext
from mambalaya.cost.ops import OpCount
from mambalaya.schedule import Compute, GroupSchedule, Load, Store, extent
from mambalaya.schedule.registers import may_read_in_place, may_run_in_registers, read_in_place, register_loops


@dataclass(frozen=True)
class TrafficRow:
    """One load or store statement of a group: its tensor, direction, bytes and transfers."""

    tensor: str
    group: int
    einsum: str  # the Einsum the bytes are attributed to
    direction: str  # "read" | "write"
    bytes: int
    transfers: int  # executions of the statement

    def to_json(self) -> dict:
        return {"tensor": self.tensor, "group": self.group, "einsum": self.einsum, "direction": self.direction,
                "bytes": self.bytes, "transfers": self.transfers}


@dataclass(frozen=True)
class Traffic:
    """Every transfer statement of a mapping, with totals."""

    rows: tuple[TrafficRow, ...]

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.rows)

    @property
    def read_bytes(self) -> int:
        return sum(r.bytes for r in self.rows if r.direction == "read")

    @property
    def write_bytes(self) -> int:
        return sum(r.bytes for r in self.rows if r.direction == "write")

    def by_tensor(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.tensor] = out.get(r.tensor, 0) + r.bytes
        return out

    def by_direction(self) -> dict[str, dict[str, int]]:
        """tensor -> {"read": bytes, "write": bytes} (what the backends count)."""
        out: dict[str, dict[str, int]] = {}
        for r in self.rows:
            out.setdefault(r.tensor, {"read": 0, "write": 0})[r.direction] += r.bytes
        return out

    def by_group(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.rows:
            out[r.group] = out.get(r.group, 0) + r.bytes
        return out

    def by_einsum(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.einsum] = out.get(r.einsum, 0) + r.bytes
        return out


def traffic_rows(ctx: CostContext, sched: GroupSchedule) -> list[TrafficRow]:
    """The group's load and store statements as rows (module docstring)."""
    cascade = ctx.cascade
    reader: dict[str, str] = {}
    for s, _ in sched.statements():
        if isinstance(s, Compute):
            for _, b in (*s.reads, *s.inits):
                reader.setdefault(b, s.einsum)
    own = [e for e in sched.members if e in sched.einsums]
    rows = []
    for s, _ in sched.statements():
        if isinstance(s, Load):
            who = reader.get(s.buffer, own[0])
            if who not in sched.einsums:  # read for a recomputed producer
                who = next((m for m in own if who in cascade.einsum(m).reads), own[0])
            rows.append(TrafficRow(s.tensor, sched.index, who, "read",
                                   s.elements * cascade.tensors[s.tensor].element_bytes, s.executions))
        elif isinstance(s, Store):
            rows.append(TrafficRow(s.tensor, sched.index, s.tensor, "write",
                                   s.elements * cascade.tensors[s.tensor].element_bytes, s.executions))
    return rows


def matrix_waste(ctx: CostContext, sched: GroupSchedule) -> dict[str, float]:
    """Per member: how much more its matrix-unit ops cost because each execution's product is smaller than the
    unit's smallest tile (``arch.matrix_min``: tl.dot's least M, N and K): a side of length ``x < need`` is
    padded to ``need``, so the unit does ``need / x`` times the work on it, per side (M, N and K of the
    member's contraction plan, :func:`~mambalaya.schedule.compute.dot_plans`, at this schedule's ranges); 1
    where no side is short. A member with several summed terms takes its worst plan's."""
    out: dict[str, float] = {}
    if ctx.arch.matrix_min <= 1:
        return out
    for s, _ in sched.statements():
        if not isinstance(s, Compute):
            continue
        worst = member_waste(ctx, s.einsum, {r.rank: extent.range_length(r, sched.loops) for r in s.ranges})
        if worst > 1:
            out[s.einsum] = worst
    return out


def member_waste(ctx: CostContext, einsum: str, length: dict[str, int]) -> float:
    """:func:`matrix_waste` of one member whose ranges span ``length`` indices per rank an execution."""
    need = ctx.arch.matrix_min
    worst = 1.0
    for sides in ctx.matrix_sides(einsum):
        w = 1.0
        for side in sides:
            x = math.prod(length.get(r, 1) for r in side)
            if 0 < x < need:
                w *= need / x
        worst = max(worst, w)
    return worst


def sector_bytes(ctx: CostContext, sched: GroupSchedule) -> int:
    """Bytes the group's loads and stores occupy the memory system with, at ``arch.sector_bytes`` granularity:
    each statement's bytes times ``ceil(run / sector) * sector / run``, ``run`` the bytes of the contiguous
    stretch one execution covers (the trailing axes its buffer spans whole, times the first it does not).
    Equal to the traffic where every run is a multiple of the sector (or the arch has none): what moves is
    still the statements' bytes (:func:`traffic_rows`); this is what their transfers take."""
    sector = ctx.arch.sector_bytes
    bufs = {b.name: b for b in sched.buffers}
    total = 0
    for s, _ in sched.statements():
        if not isinstance(s, Load | Store):
            continue
        eb = ctx.cascade.tensors[s.tensor].element_bytes
        nbytes = s.elements * eb
        buf = bufs.get(s.buffer)
        if sector <= 0 or buf is None or nbytes == 0:
            total += nbytes
            continue
        shape = ctx.cascade.shape(s.tensor)
        run = eb
        for ax, dim in zip(reversed(buf.axes), reversed(shape), strict=False):
            run *= min(ax.extent, dim)
            if ax.extent < dim:
                break
        total += int(nbytes * (-(-run // sector) * sector) / run) if run % sector else nbytes
    return total


def staged_bytes(ctx: CostContext, sched: GroupSchedule) -> int:
    """Bytes a group moves through its programs' scratch (priced at ``arch.staging_bandwidth``; 0 without one):
    each loaded element written to it and read back (2 accesses), each computed element written and read by
    its consumer or its store (2; 3 for a partial sum: read, added to, written), per execution. A loop the GPU
    printers keep in registers (:func:`~mambalaya.schedule.registers.register_loops`) stages nothing, nor does a
    load its reader does in place (:func:`~mambalaya.schedule.registers.read_in_place`). A rule
    of thumb fitted to measured kernels (benchmarks/results/gpu_tiles.md), not a count of the accesses the
    printed code makes."""
    if ctx.arch.staging_bandwidth <= 0:
        return 0
    unstaged = read_in_place(ctx.cascade, sched)  # buffers of loads that never reach scratch
    skip: set[int] = set()  # the computes and stores the printers keep in registers
    for rg in register_loops(ctx.cascade, sched):
        unstaged |= {b for b, _ in rg.direct}
        skip |= {id(rg.compute), id(rg.store)}
    n = 0
    for s, _ in sched.statements():
        if id(s) in skip or (isinstance(s, Load) and s.buffer in unstaged):
            continue
        if isinstance(s, Load):
            n += 2 * s.elements * ctx.cascade.tensors[s.tensor].element_bytes
        elif isinstance(s, Compute):
            n += _compute_staged(ctx, s, sched)
    return n


def _compute_staged(ctx: CostContext, s: Compute, sched: GroupSchedule) -> int:
    """What one compute statement of ``sched`` writes to scratch and reads back over its executions: 2 accesses
    an element, 3 for a partial sum (read, added to, written)."""
    e = ctx.cascade.einsum(s.einsum)
    points = math.prod(extent.range_length(r, sched.loops) for r in s.ranges if r.rank in e.out_ranks)
    return (3 if s.accumulate is not None else 2) * points * s.executions * ctx.cascade.tensors[e.name].element_bytes


def least_staged_bytes(ctx: CostContext, untiled: GroupSchedule) -> int:
    """A lower bound on :func:`staged_bytes` at every tiling of the group ``untiled`` is the untiled schedule of:
    what its computes write and read back (2 accesses an element), but for members some tiling may keep in
    registers (:func:`~mambalaya.schedule.registers.may_run_in_registers`), and what its loads that no tiling
    reads in place write and read back (:func:`_least_staged_loads`). Tiles only add executions (each computes no
    fewer points in all than the untiled schedule's one), and the point-wise members inlined into their readers
    are the same at every tiling."""
    computes, loads = least_staged_parts(ctx, untiled)
    return sum(computes.values()) + sum(loads.values())


def least_staged_parts(ctx: CostContext, untiled: GroupSchedule) -> tuple[dict[str, int], dict[str, int]]:
    """:func:`least_staged_bytes` by part: per member, what its compute stages at least (each program that runs
    it whole stages that again), and per loaded tensor, what its loads stage at least (each program that loads
    it whole, again)."""
    if ctx.arch.staging_bandwidth <= 0:
        return {}, {}
    members = frozenset(untiled.members)  # (untiled, nothing accumulates across a loop: 2 accesses an element)
    computes: dict[str, int] = {}
    for s, _ in untiled.statements():
        if isinstance(s, Compute) and not may_run_in_registers(ctx.cascade, ctx.cascade.einsum(s.einsum), members):
            computes[s.einsum] = computes.get(s.einsum, 0) + _compute_staged(ctx, s, untiled)
    return computes, _least_staged_loads(ctx, untiled)


def _least_staged_loads(ctx: CostContext, untiled: GroupSchedule) -> dict[str, int]:
    """What every tiling's loads stage at least, per tensor the group loads: 2 accesses an element of the largest
    footprint of its reads that no tiling reads in place. Such a read goes through an inlined producer, or its
    member's own test refuses a direct load (:func:`~mambalaya.schedule.registers.may_read_in_place`: a reduction,
    a recurrence, a mask, an access read more than once or not plainly), and the member can never be a register
    GEMM whose operands load straight to registers. Whatever streams a tiling loads such a read in, their boxes
    cover every element it reads at least once, and every stream it is in is staged; a read whose footprint may
    have gaps (:func:`~mambalaya.schedule.extent.dense_read`) counts nothing."""
    c, forms = ctx.cascade, ctx.lowerer.forms
    members = frozenset(untiled.members)
    inline = frozenset(m for m, _ in untiled.inline)
    least: dict[str, int] = {}
    for m in untiled.members:
        if m in inline:
            continue
        e = c.einsum(m)
        if may_run_in_registers(c, e, members):
            continue
        sizes = {r: c.rank_size(r) for r in e.ranks}
        for er, fs in forms.effective(m, inline):
            if er.tensor in members or er.tensor == m:
                continue
            if len(er.path) == 1 and may_read_in_place(e, er.path[0]):
                continue
            if not extent.dense_read(fs, sizes):
                continue
            n = 1
            for f, dim in zip(fs, c.shape(er.tensor), strict=True):
                lo, hi = f.interval({r: (0, sizes[r] - 1) for r in f.ranks})
                n *= max(0, min(hi, dim - 1) - max(lo, 0) + 1)
            least[er.tensor] = max(least.get(er.tensor, 0), n)
    return {t: 2 * n * c.tensors[t].element_bytes for t, n in least.items()}


def member_ops(ctx: CostContext, sched: GroupSchedule) -> dict[str, list[OpCount]]:
    """Ops charged to each of the group's own Einsums: its own, times the programs it runs in (and the matrix
    unit's waste on short reductions, :func:`matrix_waste`), and those of the recomputed producers it is the
    first to read."""
    cascade = ctx.cascade
    replicas = {**dict(sched.inline), **{s.einsum: s.replicas for s, _ in sched.statements() if isinstance(s, Compute)}}
    waste = matrix_waste(ctx, sched)
    own = [e for e in sched.members if e in sched.einsums]
    out: dict[str, list[OpCount]] = {e: [] for e in own}
    for m in sched.members:
        k = replicas.get(m, 1)
        w = waste.get(m, 1.0)
        ops = [OpCount(o.kind, o.count * k * (w if o.matrix else 1), o.matrix, o.reduce_len) for o in ctx.ops(m)]
        who = m if m in out else next((x for x in own if m in cascade.einsum(x).reads), own[0])
        out[who] += ops
    return out


def chain_steps(ctx: CostContext, sched: GroupSchedule) -> int:
    """Dependent recurrence steps one program walks (the whole chip's, without a grid): per recurrence it computes,
    the steps of its rank times ``ceil(its other elements / arch.step_width)`` blocks, times the iterations of the
    tile loops around it that are not the program grid (those run one after another inside a program)."""
    total = 0
    for s, loops in sched.statements():
        if not isinstance(s, Compute):
            continue
        rec = ctx.cascade.einsum(s.einsum).recurrence
        if rec is None:
            continue
        steps, rest = 1, 1
        for r in s.ranges:
            n = extent.range_length(r, sched.loops)
            if r.rank == rec.rank:
                steps = n
            else:
                rest *= n
        inner = 1
        for j in loops:
            if j >= sched.grid:
                inner *= sched.loops[j].trips
        total += inner * steps * -(-rest // ctx.arch.step_width)
    return total


def chain_statements(ctx: CostContext, sched: GroupSchedule) -> int:
    """Statements one program runs inside its recurrences' tile loops, besides the recurrences' own computes
    (priced by :func:`chain_steps`): each is one more dependent round trip per step of the chain (its loads,
    its barrier), executions per program summed."""
    programs = max(1, sched.programs if sched.grid else 1)
    seq = {j for j, lp in enumerate(sched.loops) if lp.role == "recurrence" and j >= sched.grid}
    total = 0
    for s, loops in sched.statements():
        if not isinstance(s, Load | Store | Compute) or not seq & set(loops):  # (a window's shift: no count kept)
            continue
        if isinstance(s, Compute) and ctx.cascade.einsum(s.einsum).recurrence is not None:
            continue
        total += -(-s.executions // programs)
    return total


__all__ = ["Traffic", "TrafficRow", "chain_statements", "chain_steps", "least_staged_bytes", "least_staged_parts",
           "matrix_waste", "member_ops", "member_waste",
           "sector_bytes", "staged_bytes", "traffic_rows"]
