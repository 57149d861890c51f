"""A group's schedule printed as the Python source of one Numba kernel (the ``numba`` backend compiles it).

The kernel is the schedule, statement for statement: its tile loops (``for t{j}``, the tile
``[lo{j}, hi{j})`` and its first-tile flag ``f{j}``), a copy per load and store (boxes of
:mod:`mambalaya.exec.index_code`, only the new rows of a sliding load; each counted into ``tc``), a
row move per window shift, and per compute a loop nest that reads only buffers: every buffer is a
fixed slice of one arena, indexed at global index minus its base, and an element outside a tensor
reads zero (padding), one step before a recurrence's start its initial state.

A compute prints as a point-wise nest (one scalar per output element of the member's range, summed
ranks as inner loops), or, for a contraction (the schedule's GEMM split), a BLAS product per batch
point on direct views of the buffers where their layout allows (else gathered, costly factors
hoisted), or, for a scanned recurrence, a channel-blocked step loop with its readers fused (the
state a small local array, saved to its buffer at the end). Inlined members are evaluated at each
read. Element-wise math comes from :data:`mambalaya.ir.functions.FUNCTIONS`; ``exp`` (and
sigmoid, softplus on it) is the prelude's own vectorisable polynomial (this llvmlite has no SVML),
within a few ulp of numpy's except that results below the smallest normal number are 0. A float32
kernel computes element-wise in float32; its reductions sum in float64.

Generated source is built only from the parsed IR and the schedule (tensors become ``x<i>``
parameters, buffers ``b<i>``, ranks ``i_<rank>``); no user text is evaluated.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import sympy

from mambalaya.errors import MambalayaError
from mambalaya.exec.index_code import LoopNames, bind, index_code, int_index
from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import (
    Access,
    BinOp,
    Call,
    Const,
    Node,
    ParamRef,
    Reduce,
    accesses,
    free_ranks,
    walk,
)
from mambalaya.ir.functions import FUNCTIONS, constant_value
from mambalaya.ir.indexing import index_within
from mambalaya.schedule import Buffer, Compute, GroupSchedule, Load, LoopBlock, Range, Shift, Store
from mambalaya.schedule.compute import Contraction, contraction, distinct_accesses, scan_shape

#: Work (elements x inner trip count) above which a loop nest gets ``prange``.
PARALLEL_WORK = 1 << 18
#: Run the batch points (or row blocks) of a BLAS product in ``prange``; the backend turns it off where it
#: cannot make BLAS single-threaded (see :func:`mambalaya.exec.numba_backend.blas_single_thread`).
BLAS_IN_PRANGE = True
#: Fewest rows of a row block of a BLAS product split across threads.
GEMM_ROWS_MIN = 64
#: Channels of the innermost outer rank a scan advances together per step.
SCAN_BLOCK = 32


def _threads() -> int:
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


PRELUDE = '''\
import math
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic


@intrinsic
def _f64_from_bits(typingctx, bits):
    # the float64 whose bit pattern is the int64 bits: 2**n without a libm call
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return types.float64(types.int64), codegen


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _exp(x):
    # exp in float64 with no libm call, so loops over it vectorise (this Numba has no SVML):
    # x = n ln2 + r, |r| <= ln2/2 (Cody-Waite), Taylor to r**13 (error < 1e-17), times 2**n as two
    # normal powers of two (overflow to inf as np.exp); within 2 ulp of np.exp. A result below the
    # smallest normal number is 0: a subnormal operand costs every later multiply-add (BLAS's too)
    # a microcode assist, and Mamba-2's long decays make a few percent of its decay factors subnormal,
    # which made its chunk-state products 2-3x slower
    xc = min(max(x, -746.0), 710.0)
    n = np.floor(xc * 1.4426950408889634 + 0.5)
    r = (xc - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    k = np.int64(n)
    h = k >> 1
    y = p * _f64_from_bits((h + 1023) << 52) * _f64_from_bits((k - h + 1023) << 52)
    y = y if y >= 2.2250738585072014e-308 else 0.0
    return y if x == x else x + 0.0


@intrinsic
def _f32_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return types.float32(types.int32), codegen


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _exp32(x):
    # _exp for float32 kernels, in float32 (twice the SIMD lanes): Taylor to r**7 (error < 1e-8),
    # within 4 ulp of np.exp in float32; subnormal results are 0, as in _exp
    xc = min(max(x, np.float32(-104.0)), np.float32(89.0))
    n = np.floor(xc * np.float32(1.4426950408889634) + np.float32(0.5))
    r = (xc - n * np.float32(0.693145751953125)) - n * np.float32(1.428606765330187e-06)
    p = np.float32(1.0 / 5040.0)
    p = p * r + np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    k = np.int32(n)
    h = k >> np.int32(1)
    one = np.int32(127)
    y = p * _f32_from_bits((h + one) << np.int32(23)) * _f32_from_bits((k - h + one) << np.int32(23))
    y = y if y >= np.float32(1.1754943508222875e-38) else np.float32(0.0)
    return y if x == x else x


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _log1p_unit(y):
    # log1p for y in [0, 1] (the softplus tail), branch-free: u = 1 + y = 2**k m with m in
    # [1/sqrt2, sqrt2], log m = 2 atanh(s) with s = (m-1)/(m+1) (series to s**23, |s| <= 0.172),
    # plus the rounding of 1 + y as c/u; within a few ulp of np.log1p
    u = 1.0 + y
    c = y - (u - 1.0)
    big = u > 1.4142135623730951
    m = u * 0.5 if big else u
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    p = 2.0 / 23.0
    p = p * z + 2.0 / 21.0
    p = p * z + 2.0 / 19.0
    p = p * z + 2.0 / 17.0
    p = p * z + 2.0 / 15.0
    p = p * z + 2.0 / 13.0
    p = p * z + 2.0 / 11.0
    p = p * z + 2.0 / 9.0
    p = p * z + 2.0 / 7.0
    p = p * z + 2.0 / 5.0
    p = p * z + 2.0 / 3.0
    k = 0.6931471805599453 if big else 0.0
    return (k + s * (2.0 + z * p)) + c / u


@njit(cache=True, error_model="numpy")
def _sigmoid(x):
    return 1.0 / (1.0 + _exp(-x))


@njit(cache=True, error_model="numpy")
def _softplus(x):
    # np.logaddexp(0, x) = max(x, 0) + log1p(exp(-|x|)), as numpy computes it (NaN stays NaN)
    return (x if x > 0.0 else 0.0) + _log1p_unit(_exp(-abs(x)))


@njit(cache=True, error_model="numpy")
def _maximum(a, b):
    if a != a or b != b:
        return a + b
    return a if a >= b else b


@njit(cache=True, error_model="numpy")
def _minimum(a, b):
    if a != a or b != b:
        return a + b
    return a if a <= b else b

'''


def _literal(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        return "np.nan"
    if math.isinf(v):
        return "np.inf" if v > 0 else "(-np.inf)"
    return repr(v)


@dataclass
class _Ctx:
    """What the printer of one group knows: its schedule, the code so far, the member being printed."""

    cascade: Cascade
    sched: GroupSchedule
    dtype: str
    lines: list[str] = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)
    bufvar: dict[str, str] = field(default_factory=dict)  # buffer -> its variable
    spec: dict[str, Buffer] = field(default_factory=dict)
    ranges: dict[str, dict[str, Range]] = field(default_factory=dict)  # member -> rank -> range
    inline: frozenset[str] = frozenset()
    viewed: set[str] = field(default_factory=set)  # buffers whose load is a view of the tensor
    # the member being printed
    bounds: dict[str, tuple[str, str]] = field(default_factory=dict)  # rank -> (lo, hi) code of its range
    base: dict[str, list[str | None]] = field(default_factory=dict)  # buffer -> base code per axis (None: 0)
    read_buf: dict[tuple[int, ...], str] = field(default_factory=dict)  # access path -> buffer
    init_buf: dict[tuple[int, ...], str] = field(default_factory=dict)  # access path -> initial-state buffer
    cur: list[str] = field(default_factory=list)  # the Einsum whose expression is printed (inlined: nested)
    path: tuple[int, ...] = ()
    self_rec: tuple[str, str] | None = None  # (recurrence, its buffer) while its own statement is printed
    #: a fused scan's state: (recurrence, state array, state ranks, rank -> block start)
    state: tuple[str, str, tuple[str, ...], dict[str, str]] | None = None
    staged: dict[tuple[str, tuple[str, ...]], str] = field(default_factory=dict)
    names: LoopNames = field(default_factory=LoopNames)
    out: str = ""  # the member's output buffer
    params: dict[str, str] = field(default_factory=dict)  # off-chip tensor -> its kernel parameter
    slot: dict[str, int] = field(default_factory=dict)  # off-chip tensor -> its read counter (write: + 1)
    parallel: bool = False  # a prange was printed (the kernel is compiled parallel)

    @property
    def zero(self) -> str:
        """An element-wise accumulator's initial value: float32 zero in a float32 kernel (no promotion)."""
        return "np.float32(0.0)" if self.dtype == "float32" else "0.0"

    def tmp(self, stem: str = "v") -> str:
        """A fresh name: ``stem_N`` never meets a buffer ``bN``, a parameter ``xN`` or a tile loop's ``tN``."""
        return f"{stem}_{next(self.counter)}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)


def _add(ctx: _Ctx, depth: int, var: str, sign: int, code: str, first: bool) -> None:
    """``var += code``; the first term of a sum assigns (``x``, not ``0.0 + x``)."""
    if first and sign > 0:
        ctx.emit(depth, f"{var} = {code}")
        return
    if first:
        ctx.emit(depth, f"{var} = {ctx.zero}")
    ctx.emit(depth, f"{var} {'+=' if sign > 0 else '-='} {code}")


def _int(ctx: _Ctx, expr: sympy.Expr, rv: dict[str, str], what: str) -> str:
    return int_index(expr, rv, ctx.cascade.values, what)


# ---- buffers ---------------------------------------------------------------------------------


def _base_code(ctx: _Ctx, b: Buffer, depth: int) -> list[str | None]:
    """Each axis's global index of the buffer's first element, as code valid where it is emitted."""
    out: list[str | None] = []
    for i, ax in enumerate(b.axes):
        if ax.base == "zero":
            out.append(None)
        elif ax.base == "window":
            out.append(f"wb_{ctx.bufvar[b.name]}_{i}")
        else:
            name = ctx.tmp("bx")
            for line in ctx.names.box_code(ax.box, ctx.ranges, name):
                ctx.emit(depth, line)
            out.append(f"{name}_lo" if ax.base == "box" else f"{name}_hi")
    return out


def _local(idx: list[str], bases: list[str | None]) -> list[str]:
    return [i if z is None else f"{i} - {z}" for i, z in zip(idx, bases, strict=True)]


def _resolve(ctx: _Ctx, acc: Access) -> tuple[str, list[str | None], tuple[int, ...]]:
    """(variable, base codes, path) of the buffer holding what this access of the current Einsum reads."""
    k = distinct_accesses(ctx.cascade.einsum(ctx.cur[-1])).index(acc)
    path = (*ctx.path, k)
    b = ctx.read_buf[path]
    return ctx.bufvar[b], ctx.base[b], path


# ---- scalar expressions --------------------------------------------------------------------


def _access(ctx: _Ctx, acc: Access, rv: dict[str, str], depth: int) -> str:
    """Emit a padded read from the buffer that holds it; return the variable holding the value."""
    c = ctx.cascade
    if ctx.state is not None and acc.tensor == ctx.state[0]:
        # a fused scan's state (validated by the schedule: the same point, this step or the one before)
        e = c.einsum(acc.tensor)
        pos = {r: p for p, r in enumerate(e.out_ranks)}
        lo = ctx.state[3]
        idx = [rv[str(acc.indices[pos[r]])] + (f" - {lo[r]}" if r in lo else "") for r in ctx.state[2]] or ["0"]
        out = ctx.tmp()
        ctx.emit(depth, f"{out} = {ctx.state[1]}[{', '.join(idx)}]")
        return out
    if ctx.self_rec is not None and acc.tensor == ctx.self_rec[0] and ctx.cur[-1] == ctx.self_rec[0]:
        return _self_read(ctx, acc, rv, depth)
    shape = c.shape(acc.tensor)
    if len(acc.indices) != len(shape):
        raise MambalayaError(f"{acc.tensor} has {len(shape)} axes but is read with {len(acc.indices)} indices")
    if acc.tensor in ctx.inline:
        return _inlined(ctx, acc, rv, depth)
    var, bases, path = _resolve(ctx, acc)
    init = ctx.init_buf.get(path)
    prod = c.einsum(acc.tensor) if c.producer(acc.tensor) else None
    rec = prod.recurrence if prod is not None and init is not None else None
    idx, conds = [], []
    for pos, ix in enumerate(acc.indices):
        code = _int(ctx, ix, rv, acc.tensor)
        plain = bool(ix.is_Symbol) and str(ix) in c.rank_sizes and c.rank_sizes[str(ix)] <= shape[pos]
        if code.isidentifier() or code.lstrip("-").isdigit():
            v = code
        else:
            v = ctx.tmp("j")
            ctx.emit(depth, f"{v} = {code}")
        idx.append(v)
        if not plain:
            conds.append((pos, v))
    out = ctx.tmp()
    staged = ctx.staged.get((acc.tensor, tuple(idx)))
    if staged is not None:
        ctx.emit(depth, f"{out} = {staged}")
        return out
    cell = f"{var}[{', '.join(_local(idx, bases)) or '0'}]"
    if not conds:
        ctx.emit(depth, f"{out} = {cell}")
        return out
    ctx.emit(depth, f"if {' and '.join(f'0 <= {v} < {shape[p]}' for p, v in conds)}:")
    ctx.emit(depth + 1, f"{out} = {cell}")
    if rec is not None and any(p == rec.position for p, _ in conds):
        pos = rec.position
        other = [f"0 <= {v} < {shape[p]}" for p, v in conds if p != pos]
        rest = [v for p, v in enumerate(idx) if p != pos]
        ctx.emit(depth, f"elif {' and '.join([f'{idx[pos]} == -1', *other])}:")
        ctx.emit(depth + 1, f"{out} = {ctx.bufvar[init]}[{', '.join(_local(rest, ctx.base[init])) or '0'}]")
    ctx.emit(depth, "else:")
    ctx.emit(depth + 1, f"{out} = {ctx.zero}")
    return out


def _inlined(ctx: _Ctx, acc: Access, rv: dict[str, str], depth: int) -> str:
    """An inlined point-wise member evaluated at the read (never stored)."""
    c = ctx.cascade
    e = c.einsum(acc.tensor)
    shape = c.shape(acc.tensor)
    k = distinct_accesses(c.einsum(ctx.cur[-1])).index(acc)
    inner: dict[str, str] = {}
    conds = []
    for pos, (r, ix) in enumerate(zip(e.out_ranks, acc.indices, strict=True)):
        code = _int(ctx, ix, rv, acc.tensor)
        if code.isidentifier():
            v = code
        else:
            v = ctx.tmp("j")
            ctx.emit(depth, f"{v} = {code}")
        inner[r] = v
        plain = bool(ix.is_Symbol) and str(ix) in c.rank_sizes and c.rank_sizes[str(ix)] <= shape[pos]
        if not plain:
            conds.append(f"0 <= {v} < {shape[pos]}")
    out = ctx.tmp()
    d = depth
    if e.where:
        conds.append(f"({_mask_code(e, inner, c.values)})")
    if conds:
        ctx.emit(d, f"{out} = {ctx.zero}")
        ctx.emit(d, f"if {' and '.join(conds)}:")
        d += 1
    saved = ctx.path
    ctx.path, ctx.cur = (*saved, k), [*ctx.cur, acc.tensor]
    try:
        for i, (sign, term, _) in enumerate(e.terms()):
            _add(ctx, d, out, sign, _node(ctx, term, inner, d), first=i == 0 and not conds)
    finally:
        ctx.path, ctx.cur = saved, ctx.cur[:-1]
    return out


def _self_read(ctx: _Ctx, acc: Access, rv: dict[str, str], depth: int) -> str:
    """A recurrence's read of its previous step: its own buffer, its initial state before step 0."""
    c = ctx.cascade
    e = c.einsum(acc.tensor)
    rec = e.recurrence
    assert rec is not None and ctx.self_rec is not None
    b = ctx.self_rec[1]
    idx = [rv[r] for r in e.out_ranks]
    t = idx[rec.position]
    idx[rec.position] = f"{t} - 1"
    out = ctx.tmp()
    ctx.emit(depth, f"if {t} > 0:")
    ctx.emit(depth + 1, f"{out} = {ctx.bufvar[b]}[{', '.join(_local(idx, ctx.base[b]))}]")
    ctx.emit(depth, "else:")
    init = ctx.init_buf.get((-1,))
    if init is not None:
        rest = [v for p, v in enumerate(idx) if p != rec.position]
        ctx.emit(depth + 1, f"{out} = {ctx.bufvar[init]}[{', '.join(_local(rest, ctx.base[init])) or '0'}]")
    else:
        ctx.emit(depth + 1, f"{out} = {ctx.zero}")
    return out


def _node(ctx: _Ctx, node: Node, rv: dict[str, str], depth: int) -> str:
    """Emit statements computing ``node`` at the bound ranks; return a code expression."""
    c = ctx.cascade
    if isinstance(node, Access):
        return _access(ctx, node, rv, depth)
    if isinstance(node, Const):
        return _literal(node.value)
    if isinstance(node, ParamRef):
        return _literal(c.values[node.name])
    if isinstance(node, (Call, BinOp)) and (value := constant_value(node, c.values)) is not None:
        return _literal(value)
    if isinstance(node, Call):
        args = [_node(ctx, a, rv, depth) for a in node.args]
        fn = FUNCTIONS.get(node.fn)
        if fn is None or len(args) != fn.arity:
            raise MambalayaError(f"the Numba printer has no implementation of {node.fn} with {len(args)} argument(s)")
        if fn.arity == 1:  # the argument once in a variable (templates may use it twice)
            v = ctx.tmp()
            ctx.emit(depth, f"{v} = {args[0]}")
            args = [v]
        return fn.numba_code(args, ctx.dtype == "float32")
    if isinstance(node, BinOp):
        lhs = _node(ctx, node.lhs, rv, depth)
        rhs = _node(ctx, node.rhs, rv, depth)
        return f"({lhs} {node.op} {rhs})"
    if isinstance(node, Reduce):
        return _reduce(ctx, node, rv, depth)
    raise TypeError(node)


def _reduce(ctx: _Ctx, node: Reduce, rv: dict[str, str], depth: int) -> str:
    c = ctx.cascade
    size = c.rank_sizes[node.rank]
    acc = ctx.tmp("acc")
    if node.op == "cumsum":
        v = ctx.tmp(f"i_{node.rank}_")
        ctx.emit(depth, f"{acc} = 0.0")
        ctx.emit(depth, f"for {v} in range({rv[node.rank]} + 1):")
        val = _node(ctx, node.arg, {**rv, node.rank: v}, depth + 1)
        ctx.emit(depth + 1, f"{acc} += {val}")
        return acc
    v = f"i_{node.rank}"
    inner = {**rv, node.rank: v}
    lo, hi = ctx.bounds.get(node.rank, ("0", str(size))) if ctx.cur[-1] == ctx.cur[0] else ("0", str(size))
    if node.op in ("sum", "mean"):
        ctx.emit(depth, f"{acc} = 0.0")
        ctx.emit(depth, f"for {v} in range({lo}, {hi}):")
        val = _node(ctx, node.arg, inner, depth + 1)
        ctx.emit(depth + 1, f"{acc} += {val}")
        return f"({acc} / {size})" if node.op == "mean" else acc
    if node.op in ("max", "min"):
        ctx.emit(depth, f"{acc} = {'-np.inf' if node.op == 'max' else 'np.inf'}")
        ctx.emit(depth, f"for {v} in range({size}):")
        val = _node(ctx, node.arg, inner, depth + 1)
        ctx.emit(depth + 1, f"{acc} = _{'maximum' if node.op == 'max' else 'minimum'}({acc}, {val})")
        return acc
    raise MambalayaError(f"unknown reduction {node.op}")


def _mask_code(e: Einsum, rv: dict[str, str], values: dict) -> str:
    parts = []
    for cmp in e.where:
        ln, ld = index_code(bind(cmp.lhs, rv, values), rv, values)
        rn, rd = index_code(bind(cmp.rhs, rv, values), rv, values)
        parts.append(f"({ln} * {rd} {cmp.op} {rn} * {ld})")
    return " and ".join(parts)


# ---- one Einsum ------------------------------------------------------------------------------


def _rv(ranks: tuple[str, ...] | list[str]) -> dict[str, str]:
    return {r: f"i_{r}" for r in ranks}


def _loop(ctx: _Ctx, depth: int, rank: str, size: int, par: bool) -> int:
    """A loop over a rank of the member: its range's current bounds where it follows a tile loop."""
    rng = f"{ctx.bounds[rank][0]}, {ctx.bounds[rank][1]}" if rank in ctx.bounds else str(size)
    ctx.parallel |= par
    ctx.emit(depth, f"for i_{rank} in {'prange' if par else 'range'}({rng}):")
    return depth + 1


def _extent(ctx: _Ctx, rank: str) -> str:
    if rank in ctx.bounds:
        lo, hi = ctx.bounds[rank]
        return f"({hi} - {lo})"
    return str(ctx.cascade.rank_sizes[rank])


def _offset(ctx: _Ctx, rank: str) -> str:
    return f"(i_{rank} - {ctx.bounds[rank][0]})" if rank in ctx.bounds else f"i_{rank}"


def _pick_parallel(ctx: _Ctx, ranks: list[str], work: int, avoid: str | None = None) -> str | None:
    if work < PARALLEL_WORK:
        return None
    for r in ranks:
        if r != avoid and ctx.cascade.rank_sizes[r] >= 2:
            return r
    return None


def _work(ctx: _Ctx, e: Einsum) -> int:
    return math.prod(ctx.cascade.rank_sizes[r] for r in e.ranks)


def _out_cell(ctx: _Ctx, e: Einsum, rv: dict[str, str]) -> str:
    b = ctx.out
    return f"{ctx.bufvar[b]}[{', '.join(_local([rv[r] for r in e.out_ranks], ctx.base[b])) or '0'}]"


def _emit_pointwise(ctx: _Ctx, e: Einsum, depth: int, terms: list, accumulate: bool = False) -> None:
    """Point-wise nest: one scalar per output element of the member's range, summed ranks as inner loops."""
    c = ctx.cascade
    rec = e.recurrence
    ranks = list(e.out_ranks)
    if rec is not None:  # the iterative rank ascending, outermost: each step reads only its predecessor
        ranks = [rec.rank, *[r for r in ranks if r != rec.rank]]
        ctx.self_rec = (e.name, ctx.out)
    par = _pick_parallel(ctx, ranks, _work(ctx, e), rec.rank if rec else None)
    for r in ranks:
        depth = _loop(ctx, depth, r, c.rank_sizes[r], r == par)
    rv = _rv(e.ranks)
    mask_ranks = {r for cmp in e.where for r in cmp.ranks()}
    outer_mask = bool(e.where) and mask_ranks <= set(e.out_ranks)
    store = _out_cell(ctx, e, rv)
    if outer_mask:
        ctx.emit(depth, f"if not ({_mask_code(e, rv, c.values)}):")
        if not accumulate:
            ctx.emit(depth + 1, f"{store} = 0.0")
        ctx.emit(depth + 1, "continue")
    total = ctx.tmp("tot")
    first = True
    for sign, term, summed in terms:
        over = [r for r in e.ranks if r in summed]
        if not over:
            _add(ctx, depth, total, sign, _node(ctx, term, rv, depth), first)
            first = False
            continue
        acc = ctx.tmp("acc")
        ctx.emit(depth, f"{acc} = 0.0")
        d = depth
        for r in over:
            d = _loop(ctx, d, r, c.rank_sizes[r], False)
        if e.where and not outer_mask:
            ctx.emit(d, f"if not ({_mask_code(e, rv, c.values)}):")
            ctx.emit(d + 1, "continue")
        val = _node(ctx, term, rv, d)
        ctx.emit(d, f"{acc} += {val}")
        _add(ctx, depth, total, sign, acc, first)
        first = False
    if first:
        ctx.emit(depth, f"{total} = {ctx.zero}")
    ctx.emit(depth, f"{store} {'+=' if accumulate else '='} {total}")
    ctx.self_rec = None


def _flat(ctx: _Ctx, ranks: tuple[str, ...]) -> str:
    """Row-major flat index of ``ranks`` within the range's extents."""
    if not ranks:
        return "0"
    code = _offset(ctx, ranks[0])
    for r in ranks[1:]:
        code = f"({code} * {_extent(ctx, r)} + {_offset(ctx, r)})"
    return code


def _view_code(arr: str, parts: list[str]) -> str:
    """``arr[parts]`` without trailing full slices (numba keeps a contiguous block typed contiguous)."""
    while parts and parts[-1] == ":":
        parts = parts[:-1]
    return f"{arr}[{', '.join(parts)}]" if parts else arr


def _matrix_view(ctx: _Ctx, e: Einsum, factors: tuple[Node, ...], outer: tuple[str, ...],
                 inner: tuple[str, ...]) -> tuple[str, int] | None:
    """A direct view of a one-read operand's buffer as the [outer, inner] matrix (code, 2), or as the vector
    over its one non-empty side (code, 1), so BLAS reads it in place. None: gather it."""
    c = ctx.cascade
    if len(factors) != 1 or not isinstance(factors[0], Access) or (not outer and not inner):
        return None
    acc = factors[0]
    t = acc.tensor
    if t in ctx.inline or (ctx.state is not None and ctx.state[0] == t) or (ctx.self_rec is not None
                                                                          and ctx.self_rec[0] == t):
        return None
    shape = c.shape(t)
    if len(acc.indices) != len(shape):
        return None
    var, bases, _ = _resolve(ctx, acc)
    b = ctx.spec[ctx.read_buf[(*ctx.path, distinct_accesses(c.einsum(ctx.cur[-1])).index(acc))]]
    size = c.rank_sizes
    mat = (*outer, *inner)
    rv = _rv(e.ranks)
    fixed = set(e.ranks) - set(mat)
    parts, axes, whole = [], [], True
    for pos, ix in enumerate(acc.indices):
        bx = bind(ix, rv, c.values)
        syms = {str(x): x for x in bx.free_symbols}
        here = [r for r in mat if r in syms]
        if len(here) > 1 or set(syms) - fixed - set(here):
            return None
        z = bases[pos]
        if not here:
            if not index_within(bx, c.rank_sizes, shape[pos]):
                return None
            code = _int(ctx, bx, rv, t)
            parts.append(code if z is None else f"{code} - {z}")
            whole = False
            continue
        r = here[0]
        rest = sympy.expand(bx - syms[r])
        if syms[r] in rest.free_symbols or not index_within(rest, c.rank_sizes, shape[pos], 0, size[r] - 1):
            return None
        axes.append(r)
        lo, hi = ctx.bounds.get(r, ("0", str(size[r])))
        start = _int(ctx, rest, rv, t) if rest != 0 else "0"
        if z is not None:
            start = f"{start} - {z}"
        if rest == 0 and z is None and r not in ctx.bounds and size[r] == shape[pos] == b.shape[pos]:
            parts.append(":")
            continue
        whole = False
        parts.append(f"{start} + {lo}:{start} + {hi}")
    if len(outer) <= 1 and len(inner) <= 1:
        view = _view_code(var, parts)
        if not outer or not inner:
            return view, 1
        if axes == [outer[0], inner[0]]:
            return view, 2
        return f"{view}.T", 2
    if not whole or not outer or not inner:
        return None
    mo = math.prod(size[r] for r in outer)
    ki = math.prod(size[r] for r in inner)
    if tuple(axes) == mat:
        return f"{var}.reshape(({mo}, {ki}))", 2
    if tuple(axes) == (*inner, *outer):
        return f"{var}.reshape(({ki}, {mo})).T", 2
    return None


def _hoist_factors(ctx: _Ctx, factors: tuple[Node, ...], outer: tuple[str, ...], inner: tuple[str, ...],
                   rv: dict[str, str], depth: int) -> dict[int, str]:
    """A gathered operand's costly factors (a call, or an inlined member) that vary over only some of the
    matrix's ranks, evaluated once per value into a small array; returns factor -> the code reading it."""
    c = ctx.cascade
    mat = (*outer, *inner)
    found: dict[int, str] = {}
    if len(factors) < 2:
        return found
    for i, f in enumerate(factors):
        costly = any(isinstance(n, Call) for n in walk(f)) or any(a.tensor in ctx.inline for a in accesses(f))
        ranks = [r for r in mat if r in free_ranks(f)]
        if not costly or len(ranks) == len(mat):
            continue
        name = ctx.tmp("h")
        ctx.emit(depth, f"{name} = np.empty(({', '.join(_extent(ctx, r) for r in ranks) or '1'},), "
                        f"dtype=np.{ctx.dtype})")
        d = depth
        for r in ranks:
            d = _loop(ctx, d, r, c.rank_sizes[r], False)
        cell = f"{name}[{', '.join(_offset(ctx, r) for r in ranks) or '0'}]"
        ctx.emit(d, f"{cell} = {_node(ctx, f, rv, d)}")
        found[i] = cell
    return found


def _emit_gemm(ctx: _Ctx, e: Einsum, depth: int, sign: int, plan: Contraction, assign: bool = False) -> None:
    """One BLAS product per batch point of the range: each operand a direct view of its buffer where its
    layout allows, else gathered; the result scattered into the member's buffer element by element."""
    c = ctx.cascade
    size = c.rank_sizes
    one = [r for r in (*plan.batch, *plan.m, *plan.n, *plan.k) if size[r] == 1]
    batch = tuple(r for r in plan.batch if r not in one)
    gm = tuple(r for r in plan.m if r not in one)
    gn = tuple(r for r in plan.n if r not in one)
    gk = tuple(r for r in plan.k if r not in one)
    for r in one:
        ctx.emit(depth, f"i_{r} = {ctx.bounds[r][0] if r in ctx.bounds else 0}")
    ms = " * ".join(_extent(ctx, r) for r in gm) or "1"
    ns = " * ".join(_extent(ctx, r) for r in gn) or "1"
    ks = " * ".join(_extent(ctx, r) for r in gk) or "1"
    nb = math.prod(size[r] for r in batch)
    par = BLAS_IN_PRANGE and _work(ctx, e) >= PARALLEL_WORK
    rows = gm[0] if len(gm) == 1 and gm[0] not in ctx.bounds else None
    nblk = min(_threads(), size[rows] // GEMM_ROWS_MIN) if rows else 0
    blocked = None
    if par and batch and nb >= 2 and not any(r in ctx.bounds for r in batch):
        ctx.parallel = True
        ctx.emit(depth, f"for fb in prange({nb}):")
        depth += 1
        for i, r in enumerate(batch):
            stride = math.prod(size[x] for x in batch[i + 1:])
            ctx.emit(depth, f"i_{r} = (fb // {stride}) % {size[r]}" if stride != 1 else f"i_{r} = fb % {size[r]}")
    elif par and nblk >= 2 and not batch:
        blocked = rows
        step = -(-size[rows] // nblk)
        ctx.parallel = True
        ctx.emit(depth, f"for fb in prange({nblk}):")
        depth += 1
        ctx.emit(depth, f"lo_{rows} = fb * {step}")
        ctx.emit(depth, f"hi_{rows} = min(lo_{rows} + {step}, {size[rows]})")
        ctx.bounds[rows] = (f"lo_{rows}", f"hi_{rows}")
        ms = _extent(ctx, rows)
    else:
        for r in batch:
            depth = _loop(ctx, depth, r, size[r], False)
    rv = _rv(e.ranks)
    va = _matrix_view(ctx, e, plan.a, gm, gk)
    vb = _matrix_view(ctx, e, plan.b, gk, gn)
    if va is not None and vb is not None and va[1] == 1 and vb[1] == 1:
        vb = None
    sides = []
    for view, (ranks_outer, ranks_inner), factors, shape in (
        (va, (gm, gk), plan.a, (ms, ks)),
        (vb, (gk, gn), plan.b, (ks, ns)),
    ):
        if view is not None:
            sides.append(view)
            continue
        mat = ctx.tmp("g")
        ctx.emit(depth, f"{mat} = np.empty(({shape[0]}, {shape[1]}), dtype=np.{ctx.dtype})")
        hoisted = _hoist_factors(ctx, factors, ranks_outer, ranks_inner, rv, depth)
        d = depth
        for r in (*ranks_outer, *ranks_inner):
            d = _loop(ctx, d, r, size[r], False)
        vals = [hoisted[i] if i in hoisted else _node(ctx, f, rv, d) for i, f in enumerate(factors)]
        ctx.emit(d, f"{mat}[{_flat(ctx, ranks_outer)}, {_flat(ctx, ranks_inner)}] = {' * '.join(vals)}")
        sides.append((mat, 2))
    (ca, da), (cb, db) = sides
    gc = ctx.tmp("gc")
    ctx.emit(depth, f"{gc} = np.dot({ca}, {cb})")
    kind = "mn" if da == db == 2 else ("n" if da == 1 else "m")
    op = "=" if assign else ("+=" if sign > 0 else "-=")
    # the product back element by element (a slice assignment costs Numba seconds of compile: see _copy)
    d = depth
    for r in (*gm, *gn):
        d = _loop(ctx, d, r, size[r], False)
    fm, fn = _flat(ctx, gm), _flat(ctx, gn)
    cell = {"mn": f"{gc}[{fm}, {fn}]", "n": f"{gc}[{fn}]", "m": f"{gc}[{fm}]"}[kind]
    ctx.emit(d, f"{_out_cell(ctx, e, rv)} {op} {cell}")
    if blocked:
        ctx.bounds.pop(blocked)


def _emit_einsum(ctx: _Ctx, e: Einsum, depth: int, accumulate: bool) -> None:
    """The member's output over its ranges into its buffer (``accumulate``: added to partial sums)."""
    c = ctx.cascade
    terms = e.terms()
    plans = [contraction(c, e, t, s, vector=True) for _, t, s in terms]
    ctx.emit(depth, f"# {e.text}")
    if not any(plans):
        _emit_pointwise(ctx, e, depth, terms, accumulate)
        return
    if len(terms) == 1 and terms[0][0] > 0 and not accumulate:  # one product: stored straight
        _emit_gemm(ctx, e, depth, 1, plans[0], assign=True)
        return
    if not accumulate:  # zero the range, then accumulate the products and the rest
        d = depth
        for r in e.out_ranks:
            d = _loop(ctx, d, r, c.rank_sizes[r], False)
        ctx.emit(d, f"{_out_cell(ctx, e, _rv(e.ranks))} = 0.0")
    rest = [t for t, p in zip(terms, plans, strict=True) if p is None]
    for (sign, _, _), plan in zip(terms, plans, strict=True):
        if plan is not None:
            _emit_gemm(ctx, e, depth, sign, plan)
    if rest:
        _emit_pointwise(ctx, e, depth, rest, accumulate=True)


# ---- fused scans -----------------------------------------------------------------------------


def _staged_reads(ctx: _Ctx, names: list[str], rec: str, keep: set[str], blocked: str) -> list[tuple[str, ...]]:
    """A blocked scan's step-invariant reads of operand buffers that stride the blocked rank (``A[d,n]`` while the
    step runs ``d`` innermost): staged once per block in the state's layout, they are contiguous loads."""
    c = ctx.cascade
    found: list[tuple[str, ...]] = []

    def visit(e: Einsum, ren: dict[str, str]) -> None:
        for acc in accesses(e.expr):
            if acc.tensor == rec:
                continue
            ranks = [ren.get(str(ix)) if ix.is_Symbol else None for ix in acc.indices]
            if acc.tensor in ctx.inline:
                if None not in ranks:
                    visit(c.einsum(acc.tensor), dict(zip(c.einsum(acc.tensor).out_ranks, ranks, strict=True)))
                continue
            if c.producer(acc.tensor) is not None or None in ranks or len(set(ranks)) != len(ranks):
                continue
            if not set(ranks) <= keep or blocked not in ranks or ranks[-1] == blocked:
                continue
            shape = c.shape(acc.tensor)
            if all(c.rank_sizes[r] <= n for r, n in zip(ranks, shape, strict=True)):
                key = (acc.tensor, *ranks)
                if key not in found:
                    found.append(key)

    for name in names:
        visit(c.einsum(name), {r: r for r in c.einsum(name).ranks})
    return found


def _emit_scan(ctx: _Ctx, s: Compute, depth: int) -> None:
    """A recurrence and its readers, step by step (the schedule's scan): per block of the outer ranks the state
    is a small local array, read from the state buffer (or the initial state on the first tile), updated per
    step in place, written back at the end; consumers reading it before or after each update write their
    buffers. The innermost outer rank runs in blocks of ``SCAN_BLOCK`` inside the step loop, the state's
    innermost axis: every per-step loop then runs contiguous rows (vectorised update and ``_exp``)."""
    c = ctx.cascade
    e = c.einsum(s.einsum)
    rec = e.recurrence
    assert rec is not None
    t = rec.rank
    size = c.rank_sizes
    outer, inner, first, then = scan_shape(c, s.einsum, tuple(x.einsum for x in s.scan))
    before = [x for x in s.scan if x.einsum in first]
    after = [x for x in s.scan if x.einsum in then]
    work = math.prod(size[r] for r in e.out_ranks)
    blocked = outer[-1] if outer and size[outer[-1]] >= 2 * SCAN_BLOCK else None
    flat = outer[:-1] if blocked else outer
    ext = {r: _extent(ctx, r) for r in (*outer, *inner)}
    lo0 = {r: ctx.bounds[r][0] if r in ctx.bounds else "0" for r in (*outer, *inner)}
    nblk = f"(-(-{ext[blocked]} // {SCAN_BLOCK}))" if blocked else "1"
    n_outer = " * ".join([*(ext[r] for r in flat), nblk]) or "1"
    state_ranks = inner + ((blocked,) if blocked else ())
    ctx.emit(depth, f"# scan of {s.einsum} over {t}: outer {', '.join(outer) or '-'}, state "
                    f"{', '.join(inner) or '-'}; per step {', '.join(x.einsum for x in s.scan) or '-'}")
    ctx.parallel |= work >= PARALLEL_WORK
    ctx.emit(depth, f"for fo in {'prange' if work >= PARALLEL_WORK else 'range'}({n_outer}):")
    depth += 1
    rem = "fo"
    for k, r in enumerate(flat):
        stride = " * ".join([*(ext[x] for x in flat[k + 1:]), nblk])
        ctx.emit(depth, f"i_{r} = {lo0[r]} + ({rem}) // ({stride})")
        ctx.emit(depth, f"fo_{k} = ({rem}) % ({stride})")
        rem = f"fo_{k}"
    lo: dict[str, str] = {}
    saved = dict(ctx.bounds)
    if blocked:
        lo[blocked] = "sb_lo"
        hi_b = ctx.bounds[blocked][1] if blocked in ctx.bounds else str(size[blocked])
        # max(.., 0): LLVM then knows the indices are not negative and loads the rows contiguously
        ctx.emit(depth, f"sb_lo = max({lo0[blocked]} + ({rem}) * {SCAN_BLOCK}, 0)")
        ctx.emit(depth, f"sb_hi = min(sb_lo + {SCAN_BLOCK}, {hi_b})")
        ctx.bounds[blocked] = ("sb_lo", "sb_hi")
    for r in inner:
        if r in ctx.bounds:
            lo[r] = ctx.bounds[r][0]
    st = "st"
    shape = ", ".join(str(SCAN_BLOCK) if r == blocked else ext[r] for r in state_ranks) or "1"
    ctx.emit(depth, f"{st} = np.empty(({shape},), dtype=np.{ctx.dtype})")
    sidx = ", ".join(f"i_{r}" + (f" - {lo[r]}" if r in lo else "") for r in state_ranks) or "0"
    tlo, thi = ctx.bounds.get(t, ("0", str(size[t])))
    own_idx = _local([("0" if r == t else f"i_{r}") for r in e.out_ranks], ctx.base[s.buffer])
    own_idx = ["0" if r == t else x for r, x in zip(e.out_ranks, own_idx, strict=True)]
    d = depth
    for r in state_ranks:
        d = _loop(ctx, d, r, size[r], False)
    init = ctx.init_buf.get((-1,))
    ctx.emit(d, f"if {tlo} > 0:")
    ctx.emit(d + 1, f"{st}[{sidx}] = {ctx.bufvar[s.buffer]}[{', '.join(own_idx)}]")
    ctx.emit(d, "else:")
    if init is not None:
        rest = [f"i_{r}" for r in e.out_ranks if r != t]
        ctx.emit(d + 1, f"{st}[{sidx}] = {ctx.bufvar[init]}[{', '.join(_local(rest, ctx.base[init])) or '0'}]")
    else:
        ctx.emit(d + 1, f"{st}[{sidx}] = 0.0")
    ctx.state = (s.einsum, st, state_ranks, lo)
    if blocked:
        names = [x.einsum for x in (*before, *after)] + [s.einsum]
        for k, (tensor, *ranks) in enumerate(_staged_reads(ctx, names, s.einsum, {*state_ranks, *flat}, blocked)):
            axes = [r for r in state_ranks if r in ranks]
            name = f"stg{k}"
            who = next(n for n in names if any(a.tensor == tensor for a in _all_reads(c, n, ctx.inline)))
            comp = s if who == s.einsum else next(x for x in s.scan if x.einsum == who)
            bname = next(b for p, b in comp.reads if ctx.spec[b].tensor == tensor)
            ctx.emit(depth, f"# {tensor}[{', '.join(ranks)}] does not change over {t}: staged in the state's layout")
            ctx.emit(depth, f"{name} = np.empty(({', '.join(str(SCAN_BLOCK) if r == blocked else ext[r] for r in axes)},),"
                            f" dtype=np.{ctx.dtype})")
            dd = depth
            for r in axes:
                dd = _loop(ctx, dd, r, size[r], False)
            cell = f"{name}[{', '.join(f'i_{r}' + (f' - {lo[r]}' if r in lo else '') for r in axes)}]"
            src = _local([f"i_{r}" for r in ranks], ctx.base[bname])
            ctx.emit(dd, f"{cell} = {ctx.bufvar[bname]}[{', '.join(src)}]")
            ctx.staged[(tensor, tuple(f"i_{r}" for r in ranks))] = cell
    ctx.emit(depth, f"for i_{t} in range({tlo}, {thi}):")
    body = depth + 1

    def consumer(x: Compute) -> None:
        ce = c.einsum(x.einsum)
        keep = (ctx.read_buf, ctx.init_buf, ctx.cur, ctx.out)
        ctx.read_buf, ctx.init_buf, ctx.cur, ctx.out = dict(x.reads), dict(x.inits), [x.einsum], x.buffer
        ctx.emit(body, f"# {ce.text}")
        dd = body
        for r in ce.out_ranks:
            if r in state_ranks:
                dd = _loop(ctx, dd, r, size[r], False)
        rv = _rv(ce.ranks)
        store = _out_cell(ctx, ce, rv)
        rows = []
        total = ctx.tmp("tot")
        first = True
        for sign, term, summed in ce.terms():
            op = "+=" if sign > 0 else "-="
            over = [r for r in ce.ranks if r in summed]
            arg = term
            while isinstance(arg, Reduce) and arg.op == "sum" and arg.rank not in over:
                over.append(arg.rank)
                arg = arg.arg
            if blocked in ce.out_ranks and over and set(over) <= set(inner):
                rows.append((op, arg, over))
                continue
            if not over or arg is not term:
                _add(ctx, dd, total, sign, _node(ctx, term, rv, dd), first)
                first = False
                continue
            acc = ctx.tmp("acc")
            ctx.emit(dd, f"{acc} = 0.0")
            d3 = dd
            for r in over:
                d3 = _loop(ctx, d3, r, size[r], False)
            ctx.emit(d3, f"{acc} += {_node(ctx, term, rv, d3)}")
            _add(ctx, dd, total, sign, acc, first)
            first = False
        if first:
            ctx.emit(dd, f"{total} = {ctx.zero}")
        ctx.emit(dd, f"{store} {'+=' if x.accumulate is not None else '='} {total}")
        for op, term, over in rows:
            dd = body
            for r in state_ranks:
                if r in over or r in ce.out_ranks:
                    dd = _loop(ctx, dd, r, size[r], False)
            ctx.emit(dd, f"{store} {op} {_node(ctx, term, rv, dd)}")
        ctx.read_buf, ctx.init_buf, ctx.cur, ctx.out = keep

    for x in before:
        consumer(x)
    ctx.emit(body, f"# {e.text}")
    d = body
    for r in state_ranks:
        d = _loop(ctx, d, r, size[r], False)
    rv = _rv(e.ranks)
    total = ctx.tmp("tot")
    for i, (sign, term, _) in enumerate(e.terms()):
        _add(ctx, d, total, sign, _node(ctx, term, rv, d), first=i == 0)
    ctx.emit(d, f"{st}[{sidx}] = {total}")
    for x in after:
        consumer(x)
    d = depth  # the state back to its buffer: the next tile starts from it, a final state reads it
    for r in state_ranks:
        d = _loop(ctx, d, r, size[r], False)
    ctx.emit(d, f"{ctx.bufvar[s.buffer]}[{', '.join(own_idx)}] = {st}[{sidx}]")
    ctx.state = None
    ctx.staged = {}
    ctx.bounds = saved


def _all_reads(c: Cascade, name: str, inline: frozenset[str]) -> list[Access]:
    out = []
    for a in accesses(c.einsum(name).expr):
        out.append(a)
        if a.tensor in inline:
            out += _all_reads(c, a.tensor, inline)
    return out


# ---- statements and the kernel ------------------------------------------------------------------


def _compute(ctx: _Ctx, s: Compute, depth: int) -> None:
    c = ctx.cascade
    e = c.einsum(s.einsum)
    ctx.cur, ctx.path, ctx.out = [s.einsum], (), s.buffer
    ctx.read_buf, ctx.init_buf = dict(s.reads), dict(s.inits)
    ctx.bounds = {}
    for r, x in ctx.ranges[s.einsum].items():
        if x.loop is not None:
            lo, hi = ctx.names.range_code(x)
            ctx.emit(depth, f"lo_{r}, hi_{r} = {lo}, {hi}")
            ctx.bounds[r] = (f"lo_{r}", f"hi_{r}")
    ctx.base = {b: _base_code(ctx, ctx.spec[b], depth) for b in sorted(s.buffers)}
    accumulate = s.accumulate is not None
    for x in (s, *s.scan):  # partial sums: their range zeroed on the reduction loop's first tile
        if x.accumulate is not None:
            xe = c.einsum(x.einsum)
            ctx.out = x.buffer
            ctx.emit(depth, f"if {ctx.names.first(x.accumulate)}:")
            d = depth + 1
            for r in xe.out_ranks:
                d = _loop(ctx, d, r, c.rank_sizes[r], False)
            ctx.emit(d, f"{_out_cell(ctx, xe, _rv(xe.ranks))} = 0.0")
    ctx.out = s.buffer
    if s.scan or (e.recurrence is not None and ctx.spec[s.buffer].axes[e.recurrence.position].base == "state"):
        _emit_scan(ctx, s, depth)
    else:
        _emit_einsum(ctx, e, depth, accumulate)


def viewed_loads(cascade: Cascade, g: GroupSchedule) -> set[str]:
    """Buffers whose load binds a view of the tensor instead of copying its box into the arena.

    A CPU's caches fill from the reads themselves: copying a box into the arena first moves every byte
    twice more (a write and a re-read), which for a decode step's weights was most of its time. A view
    reads the same elements: a plain load (not sliding, not a first-tile or initial-state load) is the only
    statement that fills its buffer, every axis starts at 0 or at the box's lower end (so the view's index
    is the buffer's), and the group does not write the tensor. The arena still reserves the buffer (the
    capacity the schedule was checked against) and the load still counts the box's elements."""
    fills: dict[str, int] = {}
    for x, _ in g.statements():
        if isinstance(x, (Load, Shift)):
            fills[x.buffer] = fills.get(x.buffer, 0) + 1
        elif isinstance(x, Compute):
            for b in (x.buffer, *(y.buffer for y in x.scan)):
                fills[b] = fills.get(b, 0) + 2  # (never viewed)
    spec = {b.name: b for b in g.buffers}
    out: set[str] = set()
    for x, _ in g.statements():
        if (isinstance(x, Load) and x.slides is None and x.first_of is None and x.init_of is None
                and x.tensor not in g.writes and fills.get(x.buffer) == 1 and spec[x.buffer].axes
                and len(spec[x.buffer].axes) == len(cascade.shape(x.tensor))
                and all(a.base in ("zero", "box") for a in spec[x.buffer].axes)):
            out.add(x.buffer)
    return out


def _box_names(ctx: _Ctx, stmt: Load | Store, depth: int) -> list[str]:
    """Each axis of the statement's box as ``q_N_lo``/``q_N_hi`` variables emitted here; their stems."""
    names = []
    for ax in stmt.box:
        name = ctx.tmp("q")
        for line in ctx.names.box_code(ax, ctx.ranges, name):
            ctx.emit(depth, line)
        names.append(name)
    return names


def _view(ctx: _Ctx, stmt: Load, depth: int) -> None:
    """A load the kernel reads in place (:func:`viewed_loads`): its buffer bound to the tensor's view from
    the buffer's base, its box's elements counted."""
    b = ctx.spec[stmt.buffer]
    names = _box_names(ctx, stmt, depth)
    shape = ctx.cascade.shape(stmt.tensor)
    parts = []
    for z, ax, n in zip(_base_code(ctx, b, depth), b.axes, shape, strict=True):
        if z is None:
            parts.append(":" if ax.extent >= n else f"0:{ax.extent}")
        else:
            parts.append(f"{z}:{z} + {ax.extent}")
    ctx.emit(depth, f"{ctx.bufvar[stmt.buffer]} = {_view_code(ctx.params[stmt.tensor], parts)}")
    n = " * ".join(f"max(0, {q}_hi - {q}_lo + 1)" for q in names) or "1"
    ctx.emit(depth, f"tc[{ctx.slot[stmt.tensor]}] += {n}")


def _copy(ctx: _Ctx, stmt: Load | Store, depth: int) -> None:
    """A box between an off-chip array and a buffer, counted (elements) as it is copied."""
    if isinstance(stmt, Load) and stmt.buffer in ctx.viewed:
        _view(ctx, stmt, depth)
        return
    b = ctx.spec[stmt.buffer]
    names = _box_names(ctx, stmt, depth)
    if isinstance(stmt, Load) and stmt.slides is not None:
        q = names[stmt.slides]
        prev = f"ld_{ctx.bufvar[stmt.buffer]}"
        ctx.emit(depth, f"if not {ctx.names.first(stmt.slide_loop)}:")
        ctx.emit(depth + 1, f"{q}_lo = max({q}_lo, {prev} + 1)")
        ctx.emit(depth, f"{prev} = {q}_hi")
    bases = _base_code(ctx, b, depth)
    n = " * ".join(f"max(0, {q}_hi - {q}_lo + 1)" for q in names) or "1"
    cnt = ctx.tmp("n")
    ctx.emit(depth, f"{cnt} = {n}")
    # element loops, not slice assignment: Numba compiles a shape check per slice assignment (seconds each)
    d = depth
    for q in names:
        ctx.emit(d, f"for {q}_i in range({q}_lo, {q}_hi + 1):")
        d += 1
    glob = [f"{q}_i" for q in names]
    local = [f"{q}_i" if z is None else f"{q}_i - {z}" for q, z in zip(names, bases, strict=True)]
    arr = ctx.params[stmt.tensor]
    buf = ctx.bufvar[stmt.buffer]
    src, dst = (f"{arr}[{', '.join(glob) or '0'}]", f"{buf}[{', '.join(local) or '0'}]")
    if isinstance(stmt, Store):
        src, dst = dst, src
    ctx.emit(d, f"{dst} = {src}")
    ctx.emit(depth, f"tc[{ctx.slot[stmt.tensor] + (1 if isinstance(stmt, Store) else 0)}] += {cnt}")


def _shift(ctx: _Ctx, s: Shift, depth: int) -> None:
    """A window's kept rows moved to its front at a new tile (its first tile starts afresh)."""
    b = ctx.spec[s.buffer]
    ax = b.axes[s.axis]
    name = ctx.tmp("w")
    for line in ctx.names.box_code(ax.box, ctx.ranges, name):
        ctx.emit(depth, line)
    wb = f"wb_{ctx.bufvar[b.name]}_{s.axis}"
    ctx.emit(depth, f"if {name}_lo <= {name}_hi:  # (an empty box leaves the window where it is)")
    depth += 1
    ctx.emit(depth, f"{name} = max(0, {name}_hi + 1 - {ax.extent})")
    ctx.emit(depth, f"if not {ctx.names.first(s.loop)}:")
    ctx.emit(depth + 1, f"{name}_d = {name} - {wb}")
    ctx.emit(depth + 1, f"for {name}_i in range(max(0, {ax.extent} - {name}_d)):")
    d = depth + 2
    idx = []
    for i, n in enumerate(b.shape):  # element loops (see _copy)
        if i == s.axis:
            idx.append(f"{name}_i")
            continue
        ctx.emit(d, f"for {name}_a{i} in range({n}):")
        idx.append(f"{name}_a{i}")
        d += 1
    src = [f"{x} + {name}_d" if i == s.axis else x for i, x in enumerate(idx)]
    ctx.emit(d, f"{ctx.bufvar[b.name]}[{', '.join(idx)}] = {ctx.bufvar[b.name]}[{', '.join(src)}]")
    ctx.emit(depth, f"{wb} = {name}")


def _statements(ctx: _Ctx, body, depth: int) -> None:
    g = ctx.sched
    for s in body:
        if isinstance(s, LoopBlock):
            lp = g.loops[s.loop]
            j = s.loop
            ctx.emit(depth, f"for t{j} in range({lp.trips}):  # {lp.rank} in tiles of {lp.tile} ({lp.role})")
            ctx.emit(depth + 1, f"lo{j} = t{j} * {lp.tile}")
            ctx.emit(depth + 1, f"hi{j} = min(lo{j} + {lp.tile}, {lp.extent})")
            ctx.emit(depth + 1, f"f{j} = t{j} == 0")
            _statements(ctx, s.body, depth + 1)
        elif isinstance(s, Load):
            if s.first_of is not None:
                ctx.emit(depth, f"if {ctx.names.first(s.first_of)}:")
                _copy(ctx, s, depth + 1)
            else:
                _copy(ctx, s, depth)
        elif isinstance(s, Store):
            if s.guard:
                ctx.emit(depth, f"if {' and '.join(ctx.names.first(j) for j in s.guard)}:")
                _copy(ctx, s, depth + 1)
            else:
                _copy(ctx, s, depth)
        elif isinstance(s, Shift):
            _shift(ctx, s, depth)
        elif isinstance(s, Compute):
            _compute(ctx, s, depth)


def group_source(cascade: Cascade, g: GroupSchedule, dtype: str) -> str:
    """The Python source of one group's kernel: ``kernel(*off-chip arrays, arena, tc)``.

    The arena is one 1-D array; every buffer is a fixed slice of it (the schedule's offsets), so what a
    compute reads is what a load, a shift or another compute put there. ``tc`` counts the elements every
    load (slot ``2*i``) and store (``2*i + 1``) statement copies, per off-chip parameter ``i``."""
    params = g.params
    ctx = _Ctx(cascade, g, dtype)
    ctx.params = {t: f"x{i}" for i, t in enumerate(params)}
    ctx.slot = {t: 2 * i for i, t in enumerate(params)}
    ctx.spec = {b.name: b for b in g.buffers}
    ctx.bufvar = {b.name: f"b{i}" for i, b in enumerate(g.buffers)}
    ctx.ranges = {n: dict(zip(cascade.einsum(n).ranks, rs, strict=True)) for n, rs in g.ranges.items()}
    ctx.inline = frozenset(m for m, _ in g.inline)
    ctx.viewed = viewed_loads(cascade, g)
    ctx.emit(0, f"# group {g.index}: {', '.join(g.einsums)}")
    ctx.emit(0, '@njit(cache=True, error_model="numpy", parallel=PARALLEL)')
    ctx.emit(0, f"def kernel({', '.join([*ctx.params.values(), 'arena', 'tc'])}):")
    for b in g.buffers:
        v = ctx.bufvar[b.name]
        if b.name in ctx.viewed:  # (bound where its load runs)
            continue
        shape = ", ".join(str(n) for n in b.shape)
        view = f"arena[{b.offset}:{b.offset + b.elements}]"
        ctx.emit(1, f"{v} = {view}.reshape(({shape},))" if len(b.shape) > 1 else f"{v} = {view}")
        for i, ax in enumerate(b.axes):
            if ax.base == "window":
                ctx.emit(1, f"wb_{v}_{i} = 0")
    for s, _ in g.statements():
        if isinstance(s, Load) and s.slides is not None:
            ctx.emit(1, f"ld_{ctx.bufvar[s.buffer]} = -1")
    _statements(ctx, g.body, 1)
    ctx.emit(1, "return 0")
    return PRELUDE + f"PARALLEL = {ctx.parallel}\n\n\n" + "\n".join(ctx.lines) + "\n"


__all__ = ["BLAS_IN_PRANGE", "PARALLEL_WORK", "PRELUDE", "SCAN_BLOCK", "group_source", "viewed_loads"]
