"""What a GPU printer keeps out of its programs' scratch: contractions summed in registers, loads read in place.

A reduction loop whose only work is one contraction of two loaded operands, its sums stored after the
loop, needs no scratch: the accumulator stays in registers across the loop and each operand tile goes
from its tensor straight to registers (:class:`RegisterGemm`). The Triton printer prints these loops so;
the cost model charges no on-chip staging for them (the rest of a group stages every element it loads or
computes through the program's scratch). A load whose one reader reads each element once through a plain
access is read in place by that reader (:func:`direct_loads`). The data movement (the schedule's loads and
stores) is the same either way.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import sympy

from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import Access, Reduce, walk
from mambalaya.schedule.compute import Contraction, contraction, distinct_accesses
from mambalaya.schedule.extent import range_length
from mambalaya.schedule.ir import Compute, GroupSchedule, Load, LoopBlock, Store

#: Most elements of a contraction's accumulator kept in registers across its reduction loop: a [128, 128]
#: fp32 tile (64 KiB over 8 warps, 64 registers a thread). Measured on an H200 (benchmarks/results/
#: gpu_tiles.md): a [128, 128] accumulator ran at 0.8-1.0x the roofline, [256, 128] and [32, 1024] at 2.1x
#: and 5.3x (spilled registers).
REGISTER_ACCUMULATOR = 16384
#: Most elements of its two operand tiles per reduction step: Triton stages them in shared memory, 3 deep;
#: (256 + 128) x 64 needed 288 KiB of the 227 KiB a program may hold and did not compile, (128 + 128) x 64
#: (192 KiB) did.
REGISTER_OPERANDS = 16384


@dataclass(frozen=True)
class RegisterGemm:
    """A reduction loop whose only work is one contraction of two loaded operands, its partial sums stored
    after the loop: printed as one accumulator in registers across the loop, each operand tile loaded from
    its tensor straight into registers (the schedule's loads, counted as they run), the sums stored from
    registers (the schedule's store). The data movement is the schedule's; only its buffers live in
    registers instead of the program's scratch."""

    compute: Compute
    store: Store
    plan: Contraction
    sign: int
    direct: tuple[tuple[str, str], ...]  # (buffer, tensor) of each operand load
    bm: int
    bn: int
    bk: int


def plain_access(acc: Access, e: Einsum) -> bool:
    """Each index one of the Einsum's ranks plus a constant, no rank twice: one element read per point."""
    return _plain(acc, tuple(e.ranks))


@functools.lru_cache(maxsize=1 << 14)
def _plain(acc: Access, ranks: tuple[str, ...]) -> bool:  # (the tile search asks it of every tiling it prices)
    seen: set[str] = set()
    for ix in acc.indices:
        ranks_in = [x for x in ix.free_symbols if str(x) in ranks]
        if len(ranks_in) != 1 or str(ranks_in[0]) in seen or sympy.diff(ix, ranks_in[0]) != 1:
            return False
        seen.add(str(ranks_in[0]))
    return True


def gemm_plan(c: Cascade, e: Einsum) -> tuple[int, Contraction] | None:
    """(sign, plan) when ``e`` is one contraction of two plainly read operands (no recurrence, mask or second
    term): what :func:`register_gemm` asks of the Einsum itself, which no tiling changes."""
    if e.recurrence is not None or e.where or len(e.terms()) != 1:
        return None
    sign, term, summed = e.terms()[0]
    plan = contraction(c, e, term, summed, vector=True)
    if plan is None or len(plan.a) != 1 or len(plan.b) != 1:
        return None
    if not all(isinstance(f, Access) and plain_access(f, e) for f in (*plan.a, *plan.b)):
        return None
    return sign, plan


def may_run_in_registers(c: Cascade, e: Einsum, members: frozenset[str]) -> bool:
    """Whether some tiling of a group of ``members`` could print ``e`` as a :class:`RegisterGemm`: it is a
    :func:`gemm_plan` whose operands are both loaded, not computed in the group (a member's output is read from
    its buffer, never loaded)."""
    got = gemm_plan(c, e)
    return got is not None and all(f.tensor not in members for f in (*got[1].a, *got[1].b))


def register_gemm(c: Cascade, g: GroupSchedule, loop: LoopBlock, after: object) -> RegisterGemm | None:
    """The :class:`RegisterGemm` form of ``loop`` (a block of ``g``) followed by statement ``after``, or None."""
    inline = {m for m, _ in g.inline}
    computes = [x for x in loop.body if isinstance(x, Compute)]
    loads = [x for x in loop.body if isinstance(x, Load)]
    if not isinstance(after, Store) or after.guard or len(computes) != 1 or len(loads) + 1 != len(loop.body):
        return None
    s = computes[0]
    e = c.einsum(s.einsum)
    if s.accumulate != loop.loop or s.scan or s.inits or after.buffer != s.buffer or after.tensor != e.name:
        return None
    got = gemm_plan(c, e)
    if got is None:
        return None
    sign, plan = got
    reads, accs = dict(s.reads), distinct_accesses(e)
    direct: dict[str, str] = {}
    for f in (*plan.a, *plan.b):
        if f.tensor in inline or f not in accs:
            return None
        buf = reads.get((accs.index(f),))
        load = next((x for x in loads if x.buffer == buf), None)
        if load is None or load.slides is not None or load.first_of is not None or load.init_of is not None:
            return None
        direct[buf] = load.tensor
    if len(direct) != 2 or len(loads) != 2 or len(reads) != 2:
        return None
    mine = [s, after, *loads]
    for x, _ in g.statements():  # nothing else touches these buffers
        if any(x is y for y in mine) or isinstance(x, LoopBlock):
            continue
        touched = x.buffers if isinstance(x, Compute) else {x.buffer}
        if touched & {*direct, s.buffer}:
            return None
    rng = dict(zip(e.ranks, g.ranges[s.einsum], strict=True))
    if any(rng[r].loop == loop.loop for r in (*plan.batch, *plan.m, *plan.n)):
        return None

    def span(ranks: tuple[str, ...]) -> int:
        return math.prod(range_length(rng[r], g.loops) for r in ranks)

    if span(plan.batch) != 1:
        return None
    bm, bn, bk = (max(16, 1 << max(0, span(x) - 1).bit_length()) for x in (plan.m, plan.n, plan.k))
    if bm * bn > REGISTER_ACCUMULATOR or (bm + bn) * bk > REGISTER_OPERANDS:
        return None
    return RegisterGemm(s, after, plan, sign, tuple(direct.items()), bm, bn, bk)


def _touched(g: GroupSchedule) -> dict[str, int]:
    """How many statements of ``g`` touch each buffer."""
    touched: dict[str, int] = {}
    for x, _ in g.statements():
        if isinstance(x, LoopBlock):
            continue
        for b in (x.buffers if isinstance(x, Compute) else {x.buffer}):
            touched[b] = touched.get(b, 0) + 1
    return touched


#: :func:`_reads_in_place` by the Einsum's identity (the Einsum kept with it, so an id is never reused)
_IN_PLACE: dict[int, tuple[Einsum, tuple[bool, ...]]] = {}


def _reads_in_place(e: Einsum) -> tuple[bool, ...]:
    """Per distinct read of ``e``: whether a direct load could serve it, as far as the Einsum alone decides (no
    reduction in it: a prefix sum or max reads each element again; a plain access read once per point). The tile
    search prices thousands of schedules of the same Einsums."""
    got = _IN_PLACE.get(id(e))
    if got is not None and got[0] is e:
        return got[1]
    nodes = list(walk(e.expr))
    reduces = any(isinstance(n, Reduce) for n in nodes)
    out = tuple(not reduces and plain_access(acc, e) and sum(1 for n in nodes if n == acc) == 1
                for acc in distinct_accesses(e))
    if len(_IN_PLACE) >= 4096:
        _IN_PLACE.clear()
    _IN_PLACE[id(e)] = (e, out)
    return out


def may_read_in_place(e: Einsum, k: int) -> bool:
    """Whether some schedule could read ``e``'s distinct access ``k`` straight from its tensor (:func:`direct_loads`),
    as far as the Einsum alone decides: no recurrence or mask, and :func:`_reads_in_place`."""
    return e.recurrence is None and not e.where and _reads_in_place(e)[k]


def direct_loads(cascade: Cascade, g: GroupSchedule, body: tuple,
                 touched: dict[str, int] | None = None) -> dict[str, str]:
    """Loads of ``body`` whose one reader, a compute beside them, reads them straight from the tensor instead
    (buffer -> tensor): a plain load (no window, no first-tile or initial state), its buffer touched by that
    compute alone, through one plain access of its own (one element per point: a rank plus a constant per
    index), of a tensor the group does not write. The copy into scratch is skipped; the reader counts each
    element at its first read, so what is counted is still what the load moves. (``touched``: :func:`_touched`
    of ``g``, when the caller asks of several bodies.)"""
    if touched is None:
        touched = _touched(g)
    out: dict[str, str] = {}
    for ld in body:
        if (not isinstance(ld, Load) or ld.slides is not None or ld.first_of is not None or ld.init_of is not None
                or ld.tensor in g.writes or touched.get(ld.buffer) != 2):
            continue
        readers = [x for x in body if isinstance(x, Compute) and ld.buffer in x.buffers]
        if len(readers) != 1:
            continue
        s = readers[0]
        e = cascade.einsum(s.einsum)
        paths = [p for p, b in s.reads if b == ld.buffer]
        if s.scan or s.inits or s.buffer == ld.buffer or len(paths) != 1 or len(paths[0]) != 1:
            continue
        if may_read_in_place(e, paths[0][0]):
            out[ld.buffer] = ld.tensor
    return out


def read_in_place(c: Cascade, g: GroupSchedule) -> set[str]:
    """The buffers of every body of ``g``'s program (inside its grid) whose load its reader does in place
    (:func:`direct_loads`)."""
    out: set[str] = set()
    touched = _touched(g)

    def walk(body: tuple, inside: int) -> None:
        if inside >= g.grid:
            out.update(direct_loads(c, g, body, touched))
        for s in body:
            if isinstance(s, LoopBlock):
                walk(s.body, inside + (s.loop < g.grid))

    walk(g.body, 0)
    return out


def register_loops(c: Cascade, g: GroupSchedule) -> list[RegisterGemm]:
    """Every loop of ``g`` inside its program grid that is a :class:`RegisterGemm` (with the store after it)."""
    out: list[RegisterGemm] = []

    def walk(body: tuple) -> None:
        for i, s in enumerate(body):
            if isinstance(s, LoopBlock):
                rg = register_gemm(c, g, s, body[i + 1] if i + 1 < len(body) else None) if s.loop >= g.grid else None
                if rg is not None:
                    out.append(rg)
                else:
                    walk(s.body)

    walk(g.body)
    return out


__all__ = ["REGISTER_ACCUMULATOR", "REGISTER_OPERANDS", "RegisterGemm", "direct_loads", "gemm_plan", "may_read_in_place", "may_run_in_registers",
           "plain_access", "read_in_place", "register_gemm",
           "register_loops"]
