"""A group's schedule printed as one Triton kernel (the ``triton`` backend compiles it).

The kernel is the schedule, statement for statement, as the Numba printer's is, in Triton's block
form:

* **Programs.** The schedule's grid loops (its leading parallel loops on a GPU) are the program grid:
  program ``pid`` runs one iteration of each (``t{j}`` from ``pid``); the other tile loops are loops
  inside the program. Every program has its own slice of one scratch arena (the group's buffers, at
  the schedule's offsets), so programs never share on-chip data, as the schedule assumes.
* **Loads and stores** copy a box between a tensor and a buffer in flat blocks (masked); with
  ``COUNT`` each adds the elements it moved to its counter (``tc``), as it runs.
* **Computes** run over flat blocks of the member's output range: one rank's index vector per axis,
  padding and masks as load masks; a summed term adds a block axis for its summed ranks (and an
  explicit reduction one more), summed with ``tl.sum``; a contraction (the schedule's GEMM split) is
  ``tl.dot`` on ``[BM, BK] x [BK, BN]`` operand tiles; a recurrence steps through its rank with its
  state in registers (``[outer, inner]`` ranks), its fused readers computed per step. Inlined members
  are evaluated at each read. A barrier separates statements (they share the program's buffers).

Every loop has a static trip count (the most the schedule's ranges and boxes can span), masked to
the current extent, so the same source runs under ``TRITON_INTERPRET=1``. Element-wise functions come
from :data:`mambalaya.ir.functions.FUNCTIONS`. A construct it cannot print raises :class:`Unsupported`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import sympy

from mambalaya.exec.index_code import IndexDialect, LoopNames, bind, index_code, int_index
from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import Access, BinOp, Call, Const, Node, ParamRef, Reduce, walk
from mambalaya.ir.functions import FUNCTIONS, constant_value
from mambalaya.schedule import Buffer, Compute, GroupSchedule, Load, LoopBlock, Range, Shift, Store
from mambalaya.schedule.compute import Contraction, distinct_accesses, dot_plans, scan_shape
from mambalaya.schedule.extent import range_is_uniform, range_length
from mambalaya.schedule.registers import RegisterGemm, direct_loads, register_gemm

#: tl.dot operand precisions (fp32 accumulation in all three).
PRECISIONS = ("fp32", "tf32", "bf16")


class Unsupported(Exception):
    """A construct this printer cannot express in Triton (the group runs on the labelled fallback)."""


@dataclass(frozen=True)
class TritonOptions:
    """The printer's choices inside a program (the backend may autotune them)."""

    precision: str = "fp32"  # tl.dot operands: fp32 (ieee), tf32 or bf16
    block: int = 1024  # elements of one block of a point-wise or reduction compute, of a copy
    dot_m: int = 64
    dot_n: int = 64
    dot_k: int = 32
    interpret: bool = False  # the source runs under Triton's interpreter (its bf16 dot differs)


PRELUDE = '''\
import triton
import triton.language as tl


@triton.jit
def _fdiv(n, d):
    # floor division, right whether the target truncates (GPU) or floors (the interpreter's numpy)
    return tl.where(n >= 0, n // d, -((d - 1 - n) // d))


@triton.jit
def _fmod(n, d):
    return n - d * _fdiv(n, d)


@triton.jit
def _softplus(x):
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))

'''


def _power(n: str, e: int) -> str:
    return "(" + " * ".join([n] * e) + ")" if e else "1"


TRITON_INDEX = IndexDialect(
    floordiv="_fdiv({n}, {d})",
    ceildiv="(-_fdiv(-({n}), {d}))",
    mod="_fmod({n}, {m})",
    power=_power,
    error=Unsupported,
    minimum="tl.minimum({a}, {b})",
    maximum="tl.maximum({a}, {b})",
    ternary="tl.where({cond}, {a}, {b})",
    int_const="tl.full([], {v}, tl.int32)",
)


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _literal(v: float, dtype: str) -> str:
    """A constant as the kernel's dtype: Triton types a bare Python float as fp32, so in a float64 kernel a value
    that fp32 cannot hold exactly (``0.05``) is a float64 scalar."""
    v = float(v)
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    if dtype == "float64" and float(np.float32(v)) != v:
        return f"tl.full([], {v!r}, tl.float64)"
    return repr(v)


@dataclass
class _Block:
    """The block a value is computed over: rank -> (index code, block axis or None for a scalar), the lane
    mask of each axis (None: the scalar lanes), and the axes' sizes."""

    rv: dict[str, str] = field(default_factory=dict)
    axis: dict[str, int | None] = field(default_factory=dict)
    lanes: dict[int | None, list[str]] = field(default_factory=dict)
    shape: tuple[int, ...] = ()
    start: str = ""  # the first index of the flat block loop that binds it (empty: no loop)

    def lane(self, axes: set[int | None] | None = None) -> str:
        """The lanes of the given axes (all: None) and the scalar lanes, as one mask (``True``: none)."""
        parts = [m for a, ms in self.lanes.items() if a is None or axes is None or a in axes for m in ms]
        return " & ".join(f"({m})" for m in parts) if parts else "True"

    def expanded(self, new: int) -> _Block:
        """This block with one more trailing axis of ``new`` elements (every vector gets a unit axis)."""
        d = len(self.shape)
        rv = {r: (f"tl.expand_dims({c}, {d})" if self.axis[r] is not None else c) for r, c in self.rv.items()}
        lanes = {a: [(f"tl.expand_dims({m}, {d})" if a is not None else m) for m in ms] for a, ms in self.lanes.items()}
        return _Block(rv, dict(self.axis), lanes, (*self.shape, new))


@dataclass
class _Ctx:
    """What the printer of one group knows: its schedule, the code so far, the member being printed."""

    cascade: Cascade
    sched: GroupSchedule
    dtype: str
    opts: TritonOptions
    lines: list[str] = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)
    bufvar: dict[str, str] = field(default_factory=dict)
    spec: dict[str, Buffer] = field(default_factory=dict)
    ranges: dict[str, dict[str, Range]] = field(default_factory=dict)
    inline: frozenset[str] = frozenset()
    names: LoopNames = field(default_factory=lambda: LoopNames(TRITON_INDEX))
    params: dict[str, str] = field(default_factory=dict)
    slot: dict[str, int] = field(default_factory=dict)
    direct: dict[str, str] = field(default_factory=dict)  # buffers read straight from their tensor: -> tensor
    count_first: str = ""  # where an operand being printed is read the first time (a dot's first block across it)
    warps: int = 4
    in_registers: list[str] = field(default_factory=list)
    # the member being printed
    bounds: dict[str, tuple[str, str]] = field(default_factory=dict)
    base: dict[str, list[str | None]] = field(default_factory=dict)
    read_buf: dict[tuple[int, ...], str] = field(default_factory=dict)
    init_buf: dict[tuple[int, ...], str] = field(default_factory=dict)
    cur: list[str] = field(default_factory=list)
    path: tuple[int, ...] = ()
    state: tuple[str, str] | None = None  # (recurrence, its state's variable) inside a scan's step
    out: str = ""
    dots: int = 0

    @property
    def dt(self) -> str:
        return "tl.float64" if self.dtype == "float64" else "tl.float32"

    def tmp(self, stem: str = "v") -> str:
        """A fresh name: ``stem_N`` never meets a buffer ``bN``, a parameter ``xN`` or a tile loop's ``tN``."""
        return f"{stem}_{next(self.counter)}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def var(self, depth: int, code: str, stem: str = "v") -> str:
        if code.isidentifier():
            return code
        v = self.tmp(stem)
        self.emit(depth, f"{v} = {code}")
        return v


def _int(ctx: _Ctx, expr: sympy.Expr, rv: dict[str, str], what: str) -> str:
    return int_index(expr, rv, ctx.cascade.values, what, TRITON_INDEX)


def _axes_of(expr: sympy.Expr, blk: _Block) -> set[int | None]:
    return {blk.axis.get(str(s)) for s in expr.free_symbols if str(s) in blk.axis}


# ---- buffers ---------------------------------------------------------------------------------


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, n = [], 1
    for s in reversed(shape):
        out.append(n)
        n *= s
    return out[::-1]


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


def _offset(idx: list[str], bases: list[str | None], shape: tuple[int, ...]) -> str:
    """Flat offset into a buffer of ``shape`` of the global indices ``idx`` (each minus its axis's base)."""
    parts = []
    for i, z, s in zip(idx, bases, _strides(shape), strict=True):
        local = (i if i.isidentifier() or i.isdigit() else f"({i})") if z is None else f"({i} - {z})"
        parts.append(local if s == 1 else f"{local} * {s}")
    return " + ".join(parts) or "0"


def _resolve(ctx: _Ctx, acc: Access) -> tuple[str, tuple[int, ...]]:
    """(buffer, path) holding what this access of the current Einsum reads."""
    k = distinct_accesses(ctx.cascade.einsum(ctx.cur[-1])).index(acc)
    path = (*ctx.path, k)
    return ctx.read_buf[path], path


def _load(ctx: _Ctx, buf: str, idx: list[str], mask: str, depth: int, shape: list[int] | None = None,
          block: list[int] | None = None, count: str | None = None) -> str:
    """A masked read of a buffer at global indices (``shape``: the pointer broadcast to the mask's block); a
    buffer read straight from its tensor (``ctx.direct``: its load folded into its one reader) is read there,
    the lanes of ``count`` (each element's first read) counted over ``block``."""
    out = ctx.tmp()
    if buf in ctx.direct:
        t = ctx.direct[buf]
        ctx.emit(depth, f"{out} = tl.load({_global_ptr(ctx, t, idx)}, mask={mask}, other=0.0)")
        _count(ctx, count or mask, block or [], ctx.slot[t], depth)
        return out
    b = ctx.spec[buf]
    ptr = f"{ctx.bufvar[buf]} + {_offset(idx, ctx.base[buf], b.shape)}"
    if shape:
        ptr += f" + tl.zeros({shape}, tl.int32)"
    ctx.emit(depth, f"{out} = tl.load({ptr}, mask={mask}, other=0.0)" if mask != "True" else f"{out} = tl.load({ptr})")
    return out


# ---- block expressions ---------------------------------------------------------------------


def _access(ctx: _Ctx, acc: Access, blk: _Block, depth: int) -> str:
    """A padded read from the buffer that holds it (a scan's state, an inlined member evaluated in place)."""
    c = ctx.cascade
    if ctx.state is not None and acc.tensor == ctx.state[0]:
        return ctx.state[1]  # the schedule fused this read into the scan: the state, at its own point
    shape = c.shape(acc.tensor)
    if len(acc.indices) != len(shape):
        raise Unsupported(f"{acc.tensor} has {len(shape)} axes but is read with {len(acc.indices)} indices")
    if acc.tensor in ctx.inline:
        return _inlined(ctx, acc, blk, depth)
    buf, path = _resolve(ctx, acc)
    init = ctx.init_buf.get((-1,) if acc.tensor == ctx.cur[-1] else path)  # a recurrence's own earlier steps
    prod = c.einsum(acc.tensor) if c.producer(acc.tensor) else None
    rec = prod.recurrence if prod is not None and init is not None else None
    idx, conds, axes = [], [], set()
    for pos, ix in enumerate(acc.indices):
        bx = bind(ix, blk.rv, c.values)
        axes |= _axes_of(bx, blk)
        v = ctx.var(depth, _int(ctx, ix, blk.rv, acc.tensor), "j")
        idx.append(v)
        plain = bool(ix.is_Symbol) and str(ix) in c.rank_sizes and c.rank_sizes[str(ix)] <= shape[pos]
        if not plain:
            conds.append((pos, v))
    inside = [f"({v} >= 0) & ({v} < {shape[p]})" for p, v in conds]
    lane = blk.lane(axes)
    count = None
    if buf in ctx.direct:  # counted at each element's first read: the ranks it does not vary along at their first
        e, mine = c.einsum(ctx.cur[-1]), {str(x) for ix in acc.indices for x in ix.free_symbols}
        first = [f"({blk.rv[r]} == {_bound(ctx, r)[0]})" for r in e.ranks if r not in mine and r in blk.rv]
        count = " & ".join([blk.lane(None), *inside, *first, *([ctx.count_first] if ctx.count_first else [])])
    val = _load(ctx, buf, idx, " & ".join([lane, *inside]) if inside else lane, depth, block=list(blk.shape),
                count=count)
    if rec is not None and any(p == rec.position for p, _ in conds):
        pos = rec.position
        other = [f"({v} >= 0) & ({v} < {shape[p]})" for p, v in conds if p != pos]
        rest = [v for p, v in enumerate(idx) if p != pos]
        first = _load(ctx, init, rest, " & ".join([lane, f"({idx[pos]} == -1)", *other]), depth)
        out = ctx.tmp()
        ctx.emit(depth, f"{out} = {val} + {first}")
        return out
    return val


def _inlined(ctx: _Ctx, acc: Access, blk: _Block, depth: int) -> str:
    """An inlined point-wise member evaluated at the read (never stored)."""
    c = ctx.cascade
    e = c.einsum(acc.tensor)
    shape = c.shape(acc.tensor)
    k = distinct_accesses(c.einsum(ctx.cur[-1])).index(acc)
    inner = _Block({}, {}, blk.lanes, blk.shape)
    conds = []
    for pos, (r, ix) in enumerate(zip(e.out_ranks, acc.indices, strict=True)):
        v = ctx.var(depth, _int(ctx, ix, blk.rv, acc.tensor), "j")
        inner.rv[r] = v
        axes = _axes_of(bind(ix, blk.rv, c.values), blk)
        inner.axis[r] = max((a for a in axes if a is not None), default=None)
        plain = bool(ix.is_Symbol) and str(ix) in c.rank_sizes and c.rank_sizes[str(ix)] <= shape[pos]
        if not plain:
            conds.append(f"({v} >= 0) & ({v} < {shape[pos]})")
    if e.where:
        conds.append(_mask_code(ctx, e, inner.rv))
    saved = ctx.path
    ctx.path, ctx.cur = (*saved, k), [*ctx.cur, acc.tensor]
    try:
        val = _terms(ctx, e, inner, depth)
    finally:
        ctx.path, ctx.cur = saved, ctx.cur[:-1]
    if conds:
        out = ctx.tmp()
        ctx.emit(depth, f"{out} = tl.where({' & '.join(f'({x})' for x in conds)}, {val}, 0.0)")
        return out
    return val


def _terms(ctx: _Ctx, e: Einsum, blk: _Block, depth: int) -> str:
    """The signed sum of a point-wise Einsum's terms at the block."""
    return _terms_of(ctx, e.terms(), blk, depth)


def _terms_of(ctx: _Ctx, terms, blk: _Block, depth: int) -> str:
    code = ""
    for i, (sign, term, _) in enumerate(terms):
        v = _node(ctx, term, blk, depth)
        code = (v if sign > 0 else f"(-{v})") if i == 0 else f"{code} {'+' if sign > 0 else '-'} {v}"
    return ctx.var(depth, f"({code})" if code else "0.0")


def _node(ctx: _Ctx, node: Node, blk: _Block, depth: int) -> str:
    """Emit statements computing ``node`` over the block; return its code (a variable or an expression)."""
    c = ctx.cascade
    if isinstance(node, Access):
        return _access(ctx, node, blk, depth)
    if isinstance(node, Const):
        return _literal(node.value, ctx.dtype)
    if isinstance(node, ParamRef):
        return _literal(c.values[node.name], ctx.dtype)
    if isinstance(node, (Call, BinOp)) and (value := constant_value(node, c.values)) is not None:
        return _literal(value, ctx.dtype)
    if isinstance(node, Call):
        args = [ctx.var(depth, _node(ctx, a, blk, depth)) for a in node.args]
        fn = FUNCTIONS.get(node.fn)
        if fn is None or len(args) != fn.arity:
            raise Unsupported(f"no Triton implementation of {node.fn} with {len(args)} argument(s)")
        return ctx.var(depth, fn.triton_code(args, ctx.dtype == "float64"))
    if isinstance(node, BinOp):
        return f"({_node(ctx, node.lhs, blk, depth)} {node.op} {_node(ctx, node.rhs, blk, depth)})"
    if isinstance(node, Reduce):
        return _reduce(ctx, node, blk, depth)
    raise TypeError(node)


def _reduce(ctx: _Ctx, node: Reduce, blk: _Block, depth: int) -> str:
    """An explicit reduction: one more block axis over its rank, summed (or maxed) along it."""
    c = ctx.cascade
    size = c.rank_sizes[node.rank]
    top = ctx.cur[-1] == ctx.cur[0]
    lo, hi = ctx.bounds.get(node.rank, ("0", str(size))) if top and node.op != "cumsum" else ("0", str(size))
    nmax = range_length(ctx.ranges[ctx.cur[0]][node.rank], ctx.sched.loops) if lo != "0" else size
    bk = min(_pow2(nmax), max(1, ctx.opts.block // max(1, math.prod(blk.shape))), 64)
    d = len(blk.shape)
    acc = ctx.tmp("acc")
    init = {"max": 'float("-inf")', "min": 'float("inf")'}.get(node.op, "0.0")
    ctx.emit(depth, f"{acc} = tl.full({list(blk.shape) or []}, {init}, {ctx.dt})" if blk.shape
             else f"{acc} = {init}")
    s0, kk = ctx.tmp("s"), ctx.tmp("k")
    ctx.emit(depth, f"for {s0} in range(0, {nmax}, {bk}):")
    d1 = depth + 1
    inner = blk.expanded(bk)
    vec = f"({lo} + {s0} + tl.arange(0, {bk}))"
    shape = ["1"] * d + [str(bk)]
    ctx.emit(d1, f"{kk} = tl.reshape({vec}, [{', '.join(shape)}])" if d else f"{kk} = {vec}")
    own = inner.rv.get(node.rank)
    inner.rv[node.rank] = kk
    inner.axis[node.rank] = d
    inner.lanes[d] = [f"{kk} < {hi}"]
    if node.op == "cumsum":  # the prefix up to the rank's own index
        if own is None:
            raise Unsupported(f"cumsum over {node.rank} outside its own rank's loop")
        inner.lanes[d].append(f"{kk} <= {own}")
    val = _node(ctx, node.arg, inner, d1)
    lane = inner.lane()
    if node.op in ("sum", "mean", "cumsum"):
        ctx.emit(d1, f"{acc} += tl.sum(tl.where({lane}, {val}, 0.0), axis={d})")
    elif node.op in ("max", "min"):
        fill = 'float("-inf")' if node.op == "max" else 'float("inf")'
        fn = "tl.maximum" if node.op == "max" else "tl.minimum"
        red = "tl.max" if node.op == "max" else "tl.min"
        ctx.emit(d1, f"{acc} = {fn}({acc}, {red}(tl.where({lane}, {val}, {fill}), axis={d}))")
    else:
        raise Unsupported(f"reduction {node.op}")
    return f"({acc} / {size})" if node.op == "mean" else acc


def _mask_code(ctx: _Ctx, e: Einsum, rv: dict[str, str]) -> str:
    parts = []
    for cmp in e.where:
        ln, ld = index_code(bind(cmp.lhs, rv, ctx.cascade.values), rv, ctx.cascade.values, TRITON_INDEX)
        rn, rd = index_code(bind(cmp.rhs, rv, ctx.cascade.values), rv, ctx.cascade.values, TRITON_INDEX)
        parts.append(f"({ln} * {rd} {cmp.op} {rn} * {ld})")
    return " & ".join(parts)


# ---- one compute ------------------------------------------------------------------------------


def _bound(ctx: _Ctx, rank: str) -> tuple[str, str, int]:
    """(lo, hi, the most elements the range ever spans) of one rank of the member being printed."""
    lo, hi = ctx.bounds.get(rank, ("0", str(ctx.cascade.rank_sizes[rank])))
    return lo, hi, range_length(ctx.ranges[ctx.cur[0]][rank], ctx.sched.loops)


def _bind_flat(ctx: _Ctx, ext: list[tuple[str, str, str, int]], flat: str, depth: int, blk: _Block,
               axis: int | None, scalar: bool, nblk: int | None = None) -> str:
    """Bind each rank of ``ext`` ((rank, lo, hi, most elements its range spans) each) from the flat index ``flat``
    (the last rank fastest) in ``blk`` on ``axis``; return the lane mask. The flat index walks the ranks' static
    spans (constant divisors: shifts or a multiply, not a division), each rank masked to its range this
    execution. One rank of a block is its vector itself (Triton sees the index contiguous and vectorises)."""
    if not ext:
        lane = f"{flat} < 1"
        blk.lanes.setdefault(axis, []).append(lane)
        return lane
    # (a lane test that always holds is left out: a mask Triton cannot prove uniform keeps loads scalar)
    whole = math.prod(n for *_, n in ext)
    parts = [] if nblk == whole else [f"({flat} < {whole})"]
    rem = flat
    for i, (r, lo, hi, n) in enumerate(reversed(ext)):
        span = f"({hi} - {lo})" if lo != "0" else hi
        # (a vector gets a fresh name: a rank bound again in an inner loop at another block shape would make
        # one loop-carried variable change its type, which Triton refuses)
        v = f"i_{r}" if scalar else ctx.tmp(f"i_{r}")
        if len(ext) == 1:
            local = rem
        elif n > 1:
            local = ctx.var(depth, f"{rem} % {n}", "a")
        else:  # (one element: a vector of zeros keeps the index a block where the flat index is one)
            local = "0" if scalar else ctx.var(depth, f"{rem} * 0", "a")
        ctx.emit(depth, f"{v} = {lo} + {local}" if lo != "0" else f"{v} = {local}")
        if not _uniform(ctx, r, n):
            parts.append(f"({local} < {span})" if local != "0" else f"({span} > 0)")
        if len(ext) > 1 and i < len(ext) - 1 and n > 1:
            rem = ctx.var(depth, f"{rem} // {n}", "q")
        blk.rv[r] = v
        blk.axis[r] = axis
    if not parts:
        blk.lanes.setdefault(axis, [])
        return "True"
    lane = " & ".join(parts)
    blk.lanes.setdefault(axis, []).append(lane)
    return lane


def _uniform(ctx: _Ctx, rank: str, n: int) -> bool:
    """Whether the rank's range this execution always spans its static ``n`` indices (no lane test needed)."""
    x = ctx.ranges[ctx.cur[0]][rank]
    return range_is_uniform(x, ctx.sched.loops) and range_length(x, ctx.sched.loops) == n


def _extents(ctx: _Ctx, ranks: tuple[str, ...]) -> tuple[list[tuple[str, str, str, int]], int]:
    """((rank, lo, hi, most elements its range spans) per rank, the most elements they ever span together)."""
    ext, nmax = [], 1
    for r in ranks:
        lo, hi, n = _bound(ctx, r)
        ext.append((r, lo, hi, max(1, n)))
        nmax *= max(1, n)
    return ext, nmax


def _flat_block(ctx: _Ctx, ranks: tuple[str, ...], nblk: int, depth: int, blk: _Block, axis: int | None,
                stem: str) -> tuple[str, int]:
    """Open a static loop over flat blocks of ``ranks``' current ranges (nblk elements each, or a scalar loop
    for ``axis`` None); bind each rank's index in ``blk``; return (the loop's lane mask, the loop's depth)."""
    ext, nmax = _extents(ctx, ranks)
    s = ctx.tmp(stem)
    if axis is None:
        ctx.emit(depth, f"for {s} in range({nmax}):")
        flat = s
    else:
        ctx.emit(depth, f"for {s}s in range(0, {nmax}, {nblk}):")
        flat = f"{s}v"
        blk.start = f"{s}s"
        ctx.emit(depth + 1, f"{flat} = {s}s + tl.arange(0, {nblk})")
    lane = _bind_flat(ctx, ext, flat, depth + 1, blk, axis, axis is None)
    return lane, depth + 1


def _one_block(ctx: _Ctx, ranks: tuple[str, ...], nblk: int, depth: int, blk: _Block, stem: str) -> None:
    """Bind ``ranks``' current ranges as one block of ``nblk`` elements on axis 0 (no loop: it covers them)."""
    ext, _ = _extents(ctx, ranks)
    flat = ctx.tmp(stem)
    ctx.emit(depth, f"{flat} = tl.arange(0, {nblk})")
    _bind_flat(ctx, ext, flat, depth, blk, 0, False, nblk)


def _place(blk: _Block, ranks: tuple[str, ...], axis: int, ndim: int) -> None:
    """Put 1-D index vectors of ``ranks`` (bound on ``axis``) and that axis's lanes into an ``ndim``-D block."""
    if ndim == 1:
        return
    shape = ["1"] * ndim
    shape[axis] = ":"
    sub = "[" + ", ".join(":" if x == ":" else "None" for x in shape) + "]"
    for r in ranks:
        blk.rv[r] = f"{blk.rv[r]}{sub}"
    blk.lanes[axis] = [f"({m}){sub}" for m in blk.lanes[axis]]


def _store_out(ctx: _Ctx, e: Einsum, blk: _Block, val: str, depth: int, accumulate: bool, extra: str = "") -> None:
    """The value into the member's output buffer at the block's output ranks (added to it: ``accumulate``)."""
    b = ctx.spec[ctx.out]
    full = list(blk.shape)
    ptr = f"{ctx.bufvar[ctx.out]} + {_offset([blk.rv[r] for r in e.out_ranks], ctx.base[ctx.out], b.shape)}"
    if full:  # every lane stores (lanes off the output's own axes store the same value again)
        ptr += f" + tl.zeros({full}, tl.int32)"
    mask = blk.lane() + (f" & ({extra})" if extra else "")
    value = f"({val}) + tl.zeros({full}, {ctx.dt})" if full else val
    if accumulate:
        old = ctx.tmp("o")
        ctx.emit(depth, f"{old} = tl.load({ptr}, mask={mask}, other=0.0)")
        value = f"{old} + {value}"
    ctx.emit(depth, f"tl.store({ptr}, {value}, mask={mask})")


def _emit_pointwise(ctx: _Ctx, e: Einsum, depth: int, terms: list, accumulate: bool,
                    fixed: dict[str, tuple[str, str]] | None = None) -> None:
    """Flat blocks of the output range; a summed term's summed ranks one more block axis. ``fixed``: output
    ranks bound to a scalar index instead (rank -> (code, its lane))."""
    fixed = fixed or {}
    outs = tuple(r for r in e.out_ranks if r not in fixed)
    reducing = [t for t in terms if t[2]]
    nout = math.prod(_bound(ctx, r)[2] for r in outs)
    nred = max((math.prod(_bound(ctx, r)[2] for r in e.ranks if r in s) for _, _, s in reducing), default=1)
    bk = min(_pow2(nred), 64) if reducing else 1
    bo = max(1, min(_pow2(nout), ctx.opts.block // bk))
    blk = _Block()
    for r, (code, lane) in fixed.items():
        blk.rv[r], blk.axis[r] = code, None
        blk.lanes.setdefault(None, []).append(lane)
    _, d = _flat_block(ctx, outs, bo, depth, blk, 0, "o")
    blk.shape = (bo,)
    mask_ranks = {r for cmp in e.where for r in cmp.ranks()}
    outer_mask = bool(e.where) and mask_ranks <= set(outs)
    total = ""
    for sign, term, summed in terms:
        over = tuple(r for r in e.ranks if r in summed)
        if not over:
            v = _node(ctx, term, blk, d)
        else:
            acc = ctx.tmp("acc")
            ctx.emit(d, f"{acc} = tl.zeros([{bo}], {ctx.dt})")
            inner = _Block(dict(blk.rv), dict(blk.axis), {a: list(m) for a, m in blk.lanes.items()}, (bo,))
            _place(inner, outs, 0, 2)
            _, d2 = _flat_block(ctx, over, bk, d, inner, 1, "r")
            _place(inner, over, 1, 2)
            inner.shape = (bo, bk)
            val = _node(ctx, term, inner, d2)
            if e.where and not outer_mask:
                val = f"tl.where({_mask_code(ctx, e, inner.rv)}, {val}, 0.0)"
            ctx.emit(d2, f"{acc} += tl.sum(tl.where({inner.lane()}, {val}, 0.0), axis=1)")
            v = acc
        total = (v if sign > 0 else f"(-{v})") if not total else f"{total} {'+' if sign > 0 else '-'} {v}"
    val = ctx.var(d, f"({total})" if total else "0.0")
    if outer_mask:
        val = ctx.var(d, f"tl.where({_mask_code(ctx, e, blk.rv)}, {val}, 0.0)")
    _store_out(ctx, e, blk, val, d, accumulate)


def _dot_operand(ctx: _Ctx, factors: tuple[Node, ...], blk: _Block, depth: int) -> str:
    vals = [_node(ctx, f, blk, depth) for f in factors]
    v = ctx.tmp("op")
    shape = list(blk.shape)
    ctx.emit(depth, f"{v} = tl.where({blk.lane()}, {' * '.join(vals)}, 0.0) + tl.zeros({shape}, {ctx.dt})")
    return v


def _tile(bat: _Block, rows: tuple[_Block, tuple[str, ...]], cols: tuple[_Block, tuple[str, ...]],
          shape: tuple[int, int]) -> _Block:
    """A 2-D block of a contraction: the scalar batch point, ``rows``' ranks on axis 0, ``cols``' on axis 1."""
    out = _Block(dict(bat.rv), dict(bat.axis), {None: list(bat.lanes.get(None, []))}, shape)
    for axis, (src, ranks) in enumerate((rows, cols)):
        for r in ranks:
            out.rv[r], out.axis[r] = src.rv[r], axis
        out.lanes[axis] = list(src.lanes[0])
        _place(out, ranks, axis, 2)
    return out


def _dot_code(ctx: _Ctx, a: str, b: str) -> str:
    """``tl.dot`` of two operand tiles at the printer's precision (fp32 accumulation)."""
    o = ctx.opts
    if ctx.dtype == "float64":
        return f"tl.dot({a}, {b}, input_precision=\"ieee\", out_dtype=tl.float64)"
    if o.precision == "bf16" and o.interpret:
        # the interpreter's bf16 dot is not exact; bf16 operands with fp32 products and sums are, in fp32
        return (f"tl.dot({a}.to(tl.bfloat16).to(tl.float32), {b}.to(tl.bfloat16).to(tl.float32), "
                f"input_precision=\"ieee\")")
    if o.precision == "bf16":
        return f"tl.dot({a}.to(tl.bfloat16), {b}.to(tl.bfloat16), out_dtype=tl.float32)"
    return f"tl.dot({a}, {b}, input_precision=\"{'ieee' if o.precision == 'fp32' else 'tf32'}\")"


def _emit_dot(ctx: _Ctx, e: Einsum, depth: int, sign: int, plan: Contraction, accumulate: bool) -> None:
    """Per batch point, (M, N) tiles of the output, each the tl.dot sum over K tiles of two operand tiles."""
    o = ctx.opts

    def side(ranks: tuple[str, ...], cap: int) -> int:
        return min(max(16, _pow2(math.prod(_bound(ctx, r)[2] for r in ranks))), cap)

    bm, bn, bk = side(plan.m, o.dot_m), side(plan.n, o.dot_n), side(plan.k, o.dot_k)
    bat, mb, nb, kb = _Block(), _Block(), _Block(), _Block()
    _, d = _flat_block(ctx, plan.batch, 1, depth, bat, None, "b")
    _, d = _flat_block(ctx, plan.m, bm, d, mb, 0, "m")
    _, d = _flat_block(ctx, plan.n, bn, d, nb, 0, "n")
    acc = ctx.tmp("acc")
    ctx.emit(d, f"{acc} = tl.zeros([{bm}, {bn}], {ctx.dt})")
    _, d2 = _flat_block(ctx, plan.k, bk, d, kb, 0, "k")
    ctx.count_first = f"({nb.start} == 0)"  # (an operand is read again at every block of the other side)
    a = _dot_operand(ctx, plan.a, _tile(bat, (mb, plan.m), (kb, plan.k), (bm, bk)), d2)
    ctx.count_first = f"({mb.start} == 0)"
    b = _dot_operand(ctx, plan.b, _tile(bat, (kb, plan.k), (nb, plan.n), (bk, bn)), d2)
    ctx.count_first = ""
    ctx.emit(d2, f"{acc} += {_dot_code(ctx, a, b)}")
    out = _tile(bat, (mb, plan.m), (nb, plan.n), (bm, bn))
    _store_out(ctx, e, out, acc if sign > 0 else f"(-{acc})", d, accumulate)
    ctx.dots += 1


# ---- a contraction accumulated in registers (:mod:`mambalaya.schedule.registers` finds them) ----------


def _count(ctx: _Ctx, mask: str, shape: list[int], slot: int, depth: int) -> None:
    """With COUNT, add the lanes of ``mask`` (broadcast to ``shape``) to counter ``slot``."""
    n = ctx.tmp("nc")
    ctx.emit(depth, "if COUNT:")
    ctx.emit(depth + 1, f"{n} = (({mask}) & (tl.zeros({shape}, tl.int32) == 0)).to(tl.int64)")
    for _ in shape:
        ctx.emit(depth + 1, f"{n} = tl.sum({n}, axis=0)")
    ctx.emit(depth + 1, f"tl.atomic_add(tc + {slot}, {n})")


def _global_ptr(ctx: _Ctx, tensor: str, idx: list[str]) -> str:
    """Pointer code of ``tensor`` at global indices (int64 offsets for a tensor of 2**31 elements or more)."""
    shape = ctx.cascade.shape(tensor)
    wide = math.prod(shape) >= 2**31
    gl = " + ".join((f"({i}).to(tl.int64) * {st}" if wide else f"({i}) * {st}")
                    for i, st in zip(idx, _strides(shape), strict=True)) or "0"
    return f"{ctx.params[tensor]} + {gl}"


def _print_register_gemm(ctx: _Ctx, rg: RegisterGemm, loop: LoopBlock, depth: int) -> None:
    g, c = ctx.sched, ctx.cascade
    s, plan, j = rg.compute, rg.plan, loop.loop
    e = c.einsum(s.einsum)
    lp = g.loops[j]
    ctx.emit(depth, f"# {e.text}: summed over {lp.rank} in registers, its operands loaded into registers")
    ctx.cur, ctx.path, ctx.out = [s.einsum], (), s.buffer
    ctx.read_buf, ctx.init_buf, ctx.base, ctx.bounds = dict(s.reads), {}, {}, {}
    saved, ctx.direct = ctx.direct, {**ctx.direct, **dict(rg.direct)}
    rng = ctx.ranges[s.einsum]

    def bounds(inner: bool, d: int) -> None:
        for r in e.ranks:
            x = rng[r]
            if x.loop is not None and (x.loop == j) == inner:
                lo, hi = ctx.names.range_code(x)
                ctx.emit(d, f"lo_{r} = {lo}")
                ctx.emit(d, f"hi_{r} = {hi}")
                ctx.bounds[r] = (f"lo_{r}", f"hi_{r}")

    bounds(False, depth)
    bat, mb, nb, kb = _Block(), _Block(), _Block(), _Block()
    point = {r for r in (*plan.batch, *plan.m, *plan.n, *plan.k) if range_length(rng[r], g.loops) == 1}
    for r in e.ranks:  # a rank of one index per execution (the batch: register_gemm checked) is a scalar
        if r in point and rng[r].loop != j:
            lo, hi, _ = _bound(ctx, r)
            bat.rv[r], bat.axis[r] = lo, None
            bat.lanes.setdefault(None, []).append(f"{lo} < {hi}")
    m, n, k = (tuple(r for r in x if r not in point) for x in (plan.m, plan.n, plan.k))
    k1 = tuple(r for r in plan.k if r in point)
    _one_block(ctx, m, rg.bm, depth, mb, "m")
    _one_block(ctx, n, rg.bn, depth, nb, "n")
    acc = ctx.tmp("acc")
    ctx.emit(depth, f"{acc} = tl.zeros([{rg.bm}, {rg.bn}], {ctx.dt})")
    d = _open_tile_loop(ctx, j, depth)
    bounds(True, d)
    for r in k1:
        lo, hi, _ = _bound(ctx, r)
        bat.rv[r], bat.axis[r] = lo, None
        bat.lanes.setdefault(None, []).append(f"{lo} < {hi}")
    _one_block(ctx, k, rg.bk, d, kb, "k")
    a = _dot_operand(ctx, plan.a, _tile(bat, (mb, m), (kb, k), (rg.bm, rg.bk)), d)
    b = _dot_operand(ctx, plan.b, _tile(bat, (kb, k), (nb, n), (rg.bk, rg.bn)), d)
    ctx.emit(d, f"{acc} += {_dot_code(ctx, a, b)}")
    for r in k1:  # (a scalar of the loop: not a lane of the store)
        bat.lanes[None].remove(f"{_bound(ctx, r)[0]} < {_bound(ctx, r)[1]}")
    out = _tile(bat, (mb, m), (nb, n), (rg.bm, rg.bn))
    ptr = _global_ptr(ctx, e.name, [out.rv[r] for r in e.out_ranks]) + f" + tl.zeros([{rg.bm}, {rg.bn}], tl.int32)"
    mask = out.lane()
    ctx.emit(depth, f"tl.store({ptr}, {acc if rg.sign > 0 else f'(-{acc})'}, mask={mask})")
    _count(ctx, mask, [rg.bm, rg.bn], ctx.slot[e.name] + 1, depth)
    ctx.direct = saved
    ctx.dots += 1


def _emit_einsum(ctx: _Ctx, e: Einsum, depth: int, accumulate: bool) -> None:
    terms = e.terms()
    plans = dot_plans(ctx.cascade, e)
    ctx.emit(depth, f"# {e.text}")
    if not any(plans):
        _emit_pointwise(ctx, e, depth, terms, accumulate)
        return
    if not accumulate and (len(terms) > 1 or terms[0][0] < 0):  # zero the range, then accumulate every term
        _emit_pointwise(ctx, e, depth, [], False)
        ctx.emit(depth, "tl.debug_barrier()")
        accumulate = True
    for (sign, _, _), plan in zip(terms, plans, strict=True):
        if plan is not None:
            _emit_dot(ctx, e, depth, sign, plan, accumulate)
            ctx.emit(depth, "tl.debug_barrier()")
            accumulate = True
    rest = [t for t, p in zip(terms, plans, strict=True) if p is None]
    if rest:
        _emit_pointwise(ctx, e, depth, rest, accumulate)


def _own_step(e: Einsum, acc: Access, values: dict) -> bool:
    """The recurrence reads itself at its own point, one step back."""
    rec = e.recurrence
    assert rec is not None
    for p, (ix, r) in enumerate(zip(acc.indices, e.out_ranks, strict=True)):
        t = sympy.Symbol(r, integer=True, nonnegative=True)
        want = t - 1 if p == rec.position else t
        if sympy.expand(bind(ix, {r: r for r in e.ranks}, values) - want) != 0:
            return False
    return True


def _emit_scan(ctx: _Ctx, s: Compute, depth: int) -> None:
    """A recurrence stepping through its rank, its state an ``[outer, inner]`` register tile per block of the
    outer ranks (read from its buffer, or the initial state, before the first step; written back after the
    last); its fused readers computed per step, before or after the update as they read it; a recurrence
    whose buffer keeps its steps stores each."""
    c = ctx.cascade
    e = c.einsum(s.einsum)
    rec = e.recurrence
    assert rec is not None
    t = rec.rank
    if not s.scan and ctx.spec[s.buffer].axes[rec.position].base != "state" and (
            any(summed for _, _, summed in e.terms()) or any(isinstance(n, Reduce) for n in walk(e.expr))
            or not all(_own_step(e, a, c.values) for a in distinct_accesses(e) if a.tensor == e.name)):
        _emit_stepwise(ctx, e, depth)
        return
    consumers = {x.einsum: x for x in s.scan}
    outer, inner, before, after = scan_shape(c, s.einsum, tuple(consumers))
    ni = math.prod(_bound(ctx, r)[2] for r in inner)
    bi = _pow2(ni)
    no = math.prod(_bound(ctx, r)[2] for r in outer)
    bo = max(1, min(_pow2(no), ctx.opts.block // bi))
    ctx.emit(depth, f"# scan of {e.name} over {t}: state [{', '.join(outer) or '-'}] x [{', '.join(inner) or '-'}]; "
                    f"per step {', '.join(consumers) or '-'}")
    blk = _Block()
    _, d = _flat_block(ctx, outer, bo, depth, blk, 0, "o")
    iv = ctx.tmp("iv")
    ctx.emit(d, f"{iv} = tl.arange(0, {bi})")
    rem = iv
    for r in reversed(inner):
        lo, hi, _ = _bound(ctx, r)
        n = f"({hi} - {lo})" if lo != "0" else hi
        v = ctx.tmp(f"i_{r}")
        ctx.emit(d, f"{v} = {lo} + {rem} % tl.maximum({n}, 1)" if lo != "0" else f"{v} = {rem} % tl.maximum({n}, 1)")
        q = ctx.tmp("q")
        ctx.emit(d, f"{q} = {rem} // tl.maximum({n}, 1)")
        rem = q
        blk.rv[r], blk.axis[r] = v, 1
    blk.lanes[1] = [f"{iv} < {' * '.join(f'({h} - {l0})' for l0, h, _ in (_bound(ctx, r) for r in inner)) or '1'}"]
    _place(blk, outer, 0, 2)
    _place(blk, inner, 1, 2)
    blk.shape = (bo, bi)
    own = ctx.spec[s.buffer]
    tlo, thi, tmax = _bound(ctx, t)
    pos = rec.position
    state_row = own.axes[pos].base == "state"
    st = ctx.tmp("st")
    lane = blk.lane({0, 1})

    def own_idx(step: str) -> list[str]:
        return [(step if r == t else blk.rv[r]) for r in e.out_ranks]

    bases = list(ctx.base[s.buffer])
    prev = "0" if state_row else f"{tlo} - 1"
    if state_row:
        bases[pos] = None
    saved_base = ctx.base[s.buffer]
    ctx.base[s.buffer] = bases
    first = _load(ctx, s.buffer, own_idx(prev), f"{lane} & ({tlo} > 0)", d, [bo, bi])
    init = ctx.init_buf.get((-1,))
    if init is not None:
        rest = [blk.rv[r] for r in e.out_ranks if r != t]
        start = _load(ctx, init, rest, f"{lane} & ({tlo} == 0)", d, [bo, bi])
        ctx.emit(d, f"{st} = {first} + {start} + tl.zeros([{bo}, {bi}], {ctx.dt})")
    else:
        ctx.emit(d, f"{st} = {first} + tl.zeros([{bo}, {bi}], {ctx.dt})")
    it = ctx.tmp("t")
    ctx.emit(d, f"for {it} in range({tmax}):")
    body = d + 1
    ctx.emit(body, f"i_{t} = {tlo} + {it}")
    step = _Block(dict(blk.rv), dict(blk.axis), {a: list(m) for a, m in blk.lanes.items()}, blk.shape)
    step.rv[t], step.axis[t] = f"i_{t}", None
    step.lanes[None] = [f"i_{t} < {thi}"]

    def consumer(name: str) -> None:
        x = consumers[name]
        ce = c.einsum(name)
        keep = (ctx.read_buf, ctx.init_buf, ctx.cur, ctx.out)
        ctx.read_buf, ctx.init_buf, ctx.cur, ctx.out = dict(x.reads), dict(x.inits), [name], x.buffer
        ctx.emit(body, f"# {ce.text}")
        terms = []
        for sign, term, summed in ce.terms():
            while isinstance(term, Reduce) and term.op == "sum":  # an explicit sum: as the implicit one
                summed, term = summed | {term.rank}, term.arg
            if any(isinstance(n, Reduce) for n in walk(term)):
                raise Unsupported(f"scan reader {name} with a nested reduction")
            terms.append((sign, term, summed))
        if not any(sm for _, _, sm in terms):
            _store_out(ctx, ce, step, _terms_of(ctx, terms, step, body), body, x.accumulate is not None)
        else:
            if set(inner) & set(ce.out_ranks) or any(sm and sm != set(inner) for _, _, sm in terms):
                raise Unsupported(f"scan reader {name} sums part of the state's inner ranks")
            total = ""
            for sign, term, summed in terms:
                v = _node(ctx, term, step, body)
                pick = step.lane({0, 1}) if summed else f"{step.lane({0, 1})} & (({iv}) == 0)[None, :]"
                red = ctx.var(body, f"tl.sum(tl.where({pick}, {v}, 0.0), axis=1)", "y")
                total = (red if sign > 0 else f"(-{red})") if not total else f"{total} {'+' if sign > 0 else '-'} {red}"
            one = _Block({r: v for r, v in step.rv.items()}, dict(step.axis),
                         {None: step.lanes[None], 0: [f"tl.reshape({m}, [{bo}])" for m in step.lanes[0]]}, (bo,))
            for r in outer:
                one.rv[r] = f"tl.reshape({step.rv[r]}, [{bo}])"
            _store_out(ctx, ce, one, ctx.var(body, total), body, x.accumulate is not None)
        ctx.read_buf, ctx.init_buf, ctx.cur, ctx.out = keep

    ctx.state = (e.name, st)
    for name in before:
        consumer(name)
    ctx.emit(body, f"# {e.text}")
    new = _terms(ctx, e, step, body)
    if e.where:
        new = ctx.var(body, f"tl.where({_mask_code(ctx, e, step.rv)}, {new}, 0.0)")
    ctx.emit(body, f"{st} = tl.where(i_{t} < {thi}, {new}, {st})")
    if not state_row:  # the buffer keeps the steps: this one too
        ctx.base[s.buffer] = saved_base
        ptr = f"{ctx.bufvar[s.buffer]} + {_offset(own_idx(f'i_{t}'), saved_base, own.shape)} + tl.zeros([{bo}, {bi}], tl.int32)"
        ctx.emit(body, f"tl.store({ptr}, {st}, mask={step.lane({0, 1})})")
    for name in after:
        consumer(name)
    ctx.state = None
    if state_row:  # the last step back to its buffer: the next tile starts from it, a final state reads it
        ptr = f"{ctx.bufvar[s.buffer]} + {_offset(own_idx('0'), bases, own.shape)} + tl.zeros([{bo}, {bi}], tl.int32)"
        ctx.emit(d, f"tl.store({ptr}, {st}, mask={lane} & ({thi} > {tlo}))")
    ctx.base[s.buffer] = saved_base


def _emit_stepwise(ctx: _Ctx, e: Einsum, depth: int) -> None:
    """A recurrence one step at a time, each step a point-wise block over its other ranks reading the earlier
    steps from its buffer (the initial state before step 0); a barrier between steps."""
    rec = e.recurrence
    assert rec is not None
    t = rec.rank
    tlo, thi, tmax = _bound(ctx, t)
    it = ctx.tmp("t")
    ctx.emit(depth, f"# {e.text}: step by step over {t}")
    ctx.emit(depth, f"for {it} in range({tmax}):")
    ctx.emit(depth + 1, f"i_{t} = {tlo} + {it}")
    _emit_pointwise(ctx, e, depth + 1, e.terms(), False, {t: (f"i_{t}", f"i_{t} < {thi}")})
    ctx.emit(depth + 1, "tl.debug_barrier()")


def _compute(ctx: _Ctx, s: Compute, depth: int) -> None:
    c = ctx.cascade
    e = c.einsum(s.einsum)
    ctx.cur, ctx.path, ctx.out = [s.einsum], (), s.buffer
    ctx.read_buf, ctx.init_buf = dict(s.reads), dict(s.inits)
    ctx.bounds = {}
    for r, x in ctx.ranges[s.einsum].items():
        if x.loop is not None:
            lo, hi = ctx.names.range_code(x)
            ctx.emit(depth, f"lo_{r} = {lo}")
            ctx.emit(depth, f"hi_{r} = {hi}")
            ctx.bounds[r] = (f"lo_{r}", f"hi_{r}")
    ctx.base = {b: _base_code(ctx, ctx.spec[b], depth) for b in sorted(s.buffers)}
    for x in (s, *s.scan):  # partial sums: zeroed on the reduction loop's first tile
        if x.accumulate is not None:
            ctx.out, ctx.cur = x.buffer, [x.einsum]
            ctx.emit(depth, f"if {ctx.names.first(x.accumulate)}:")
            _emit_pointwise(ctx, c.einsum(x.einsum), depth + 1, [], False)
            ctx.emit(depth, "tl.debug_barrier()")
    ctx.out, ctx.cur = s.buffer, [s.einsum]
    if e.recurrence is not None:
        _emit_scan(ctx, s, depth)
        return
    _emit_einsum(ctx, e, depth, s.accumulate is not None)


# ---- data movement ----------------------------------------------------------------------------


def _copy(ctx: _Ctx, stmt: Load | Store, depth: int) -> None:
    """A box between an off-chip tensor and a buffer in flat blocks; with COUNT, the elements it moved."""
    c = ctx.cascade
    b = ctx.spec[stmt.buffer]
    names = []
    for ax in stmt.box:
        name = ctx.tmp("q")
        for line in ctx.names.box_code(ax, ctx.ranges, name):
            ctx.emit(depth, line)
        names.append(name)
    if isinstance(stmt, Load) and stmt.slides is not None:
        q = names[stmt.slides]
        prev = f"ld_{ctx.bufvar[stmt.buffer]}"
        ctx.emit(depth, f"{q}_lo = tl.where({ctx.names.first(stmt.slide_loop)}, {q}_lo, tl.maximum({q}_lo, {prev} + 1))")
        ctx.emit(depth, f"{prev} = {q}_hi")
    bases = _base_code(ctx, b, depth)
    ns = [ctx.var(depth, f"tl.maximum({q}_hi - {q}_lo + 1, 0)", "n") for q in names]
    blk = min(_pow2(b.elements), ctx.opts.block)
    f0, fv, moved = ctx.tmp("c"), ctx.tmp("cv"), ctx.tmp("mv")
    ctx.emit(depth, f"{moved} = tl.full([], 0, tl.int64)")
    ctx.emit(depth, f"for {f0} in range(0, {b.elements}, {blk}):")
    d = depth + 1
    ctx.emit(d, f"{fv} = {f0} + tl.arange(0, {blk})")
    # the flat index walks the buffer's static shape (constant divisors: shifts for powers of two, a multiply
    # otherwise), each axis masked to the box's extent this execution
    rem, offs, inside = fv, [], []
    for i, (q, n) in enumerate(zip(reversed(names), reversed(ns), strict=True)):
        ext = b.shape[len(names) - 1 - i]
        a = ctx.var(d, f"{rem} % {ext}", "a") if ext > 1 else "0"
        offs.append(f"{q}_lo + {a}" if a != "0" else f"{q}_lo")
        inside.append(f"({a} < {n})" if a != "0" else f"({n} > 0)")
        if i < len(names) - 1:
            rem = ctx.var(d, f"{rem} // {ext}", "r") if ext > 1 else rem
    offs = offs[::-1]
    lane = ctx.var(d, " & ".join([f"({fv} < {b.elements})", *inside]), "m")
    shape = c.shape(stmt.tensor)
    wide = math.prod(shape) >= 2**31
    gl = " + ".join((f"({o}).to(tl.int64) * {st}" if wide else f"({o}) * {st}") for o, st in zip(offs, _strides(shape),
                                                                                              strict=True)) or "0"
    src = f"{ctx.params[stmt.tensor]} + {gl}"
    dst = f"{ctx.bufvar[stmt.buffer]} + {_offset([f'({o})' for o in offs], bases, b.shape)}"
    if all(x <= 1 for x in b.shape):  # (one element: the pointers are scalars, the mask a block)
        src, dst = (f"{x} + tl.zeros([{blk}], tl.int32)" for x in (src, dst))
    if isinstance(stmt, Load):
        ctx.emit(d, f"tl.store({dst}, tl.load({src}, mask={lane}), mask={lane})")
    else:
        ctx.emit(d, f"tl.store({src}, tl.load({dst}, mask={lane}), mask={lane})")
    ctx.emit(d, "if COUNT:")
    ctx.emit(d + 1, f"{moved} += tl.sum({lane}.to(tl.int64), axis=0)")
    ctx.emit(depth, "if COUNT:")
    ctx.emit(depth + 1, f"tl.atomic_add(tc + {ctx.slot[stmt.tensor] + (1 if isinstance(stmt, Store) else 0)}, {moved})")


def _shift(ctx: _Ctx, s: Shift, depth: int) -> None:
    """A window's kept rows moved to its front at a new tile (ascending blocks: a row is read before any
    write reaches it); its first tile starts afresh."""
    b = ctx.spec[s.buffer]
    ax = b.axes[s.axis]
    name = ctx.tmp("w")
    for line in ctx.names.box_code(ax.box, ctx.ranges, name):
        ctx.emit(depth, line)
    wb = f"wb_{ctx.bufvar[b.name]}_{s.axis}"
    ctx.emit(depth, f"{name} = tl.where({name}_lo <= {name}_hi, tl.maximum({name}_hi + 1 - {ax.extent}, 0), {wb})")
    ctx.emit(depth, f"if not {ctx.names.first(s.loop)}:")  # (an empty box leaves the window where it is)
    d = depth + 1
    dist = ctx.var(d, f"{name} - {wb}", "dd")
    stride = _strides(b.shape)[s.axis]
    blk = min(_pow2(b.elements), ctx.opts.block)
    f0, fv = ctx.tmp("c"), ctx.tmp("cv")
    ctx.emit(d, f"for {f0} in range(0, {b.elements}, {blk}):")
    ctx.emit(d + 1, f"{fv} = {f0} + tl.arange(0, {blk})")
    row = f"({fv} // {stride}) % {ax.extent}"
    mask = ctx.var(d + 1, f"({fv} < {b.elements}) & ({row} + {dist} < {ax.extent})", "m")
    v = ctx.tmp()
    ctx.emit(d + 1, f"{v} = tl.load({ctx.bufvar[b.name]} + {fv} + {dist} * {stride}, mask={mask})")
    ctx.emit(d + 1, "tl.debug_barrier()")
    ctx.emit(d + 1, f"tl.store({ctx.bufvar[b.name]} + {fv}, {v}, mask={mask})")
    ctx.emit(d + 1, "tl.debug_barrier()")
    ctx.emit(depth, f"{wb} = {name}")


def _tile_bounds(ctx: _Ctx, j: int, depth: int) -> None:
    """Bind loop ``j``'s current tile (``lo``, ``hi``, whether it is the first) from its index ``t{j}``."""
    lp = ctx.sched.loops[j]
    ctx.emit(depth, f"lo{j} = t{j} * {lp.tile}")
    ctx.emit(depth, f"hi{j} = tl.minimum(lo{j} + {lp.tile}, {lp.extent})")
    ctx.emit(depth, f"f{j} = t{j} == 0")


def _open_tile_loop(ctx: _Ctx, j: int, depth: int) -> int:
    """Open tile loop ``j`` inside a program; return its body's depth. Its bounds live on after it at their last
    tile (a statement after the loop reads them), as loop-carried values: on a GPU a name first bound inside a
    loop does not exist after it."""
    lp = ctx.sched.loops[j]
    ctx.emit(depth, f"lo{j} = tl.full([], {(lp.trips - 1) * lp.tile}, tl.int32)")
    ctx.emit(depth, f"hi{j} = tl.full([], {lp.extent}, tl.int32)")
    ctx.emit(depth, f"f{j} = lo{j} == 0")
    ctx.emit(depth, f"for t{j} in range({lp.trips}):  # {lp.rank} in tiles of {lp.tile} ({lp.role})")
    _tile_bounds(ctx, j, depth + 1)
    return depth + 1


def _statements(ctx: _Ctx, body, depth: int, inside: int = 0) -> None:
    """Print statements; ``inside``: how many of the grid loops enclose them."""
    g = ctx.sched
    skip = False
    direct = direct_loads(ctx.cascade, g, body) if inside >= g.grid else {}
    saved, ctx.direct = ctx.direct, {**ctx.direct, **direct}
    for i, s in enumerate(body):
        if skip:  # the store a register GEMM printed
            skip = False
            continue
        if isinstance(s, Load) and s.buffer in direct:  # read where it is used
            continue
        if isinstance(s, LoopBlock):
            lp = g.loops[s.loop]
            j = s.loop
            rg = register_gemm(ctx.cascade, g, s, body[i + 1] if i + 1 < len(body) else None) if j >= g.grid else None
            if rg is not None:
                _print_register_gemm(ctx, rg, s, depth)
                if rg.bm * rg.bn >= 8192:
                    ctx.warps = 8
                ctx.in_registers.append(rg.compute.einsum)
                ctx.emit(depth, "tl.debug_barrier()")
                skip = True
                continue
            if j < g.grid:  # a program of the grid: t{j} set from the program id
                ctx.emit(depth, f"# {lp.rank} in tiles of {lp.tile}: the program grid")
                d = depth
                _tile_bounds(ctx, j, depth)
            else:
                d = _open_tile_loop(ctx, j, depth)
            _statements(ctx, s.body, d, inside + (j < g.grid))
            continue
        if inside < g.grid:
            raise Unsupported("a statement outside the program grid")
        if isinstance(s, Load):
            if s.first_of is not None:
                ctx.emit(depth, f"if {ctx.names.first(s.first_of)}:")
                _copy(ctx, s, depth + 1)
            else:
                _copy(ctx, s, depth)
        elif isinstance(s, Store):
            if s.guard:
                ctx.emit(depth, f"if {' & '.join(f'({ctx.names.first(j)})' for j in s.guard)}:")
                _copy(ctx, s, depth + 1)
            else:
                _copy(ctx, s, depth)
        elif isinstance(s, Shift):
            _shift(ctx, s, depth)
        elif isinstance(s, Compute):
            _compute(ctx, s, depth)
        ctx.emit(depth, "tl.debug_barrier()")
    ctx.direct = saved


@dataclass(frozen=True)
class TritonKernel:
    """One group's kernel source and what launching it needs."""

    source: str
    params: tuple[str, ...]
    programs: int
    arena: int  # elements of one program's slice of the scratch arena
    dots: int  # contractions printed as tl.dot
    num_warps: int = 4  # 8 for a kernel holding a large accumulator in registers
    in_registers: tuple[str, ...] = ()  # members printed as a RegisterGemm


def group_kernel_source(cascade: Cascade, g: GroupSchedule, dtype: str, opts: TritonOptions = TritonOptions()
                        ) -> TritonKernel:
    """The module text of one group's kernel: ``kernel(*tensors, arena, tc, PID0, COUNT)``.

    Program ``PID0 + program_id`` runs; its buffers are the slice ``program_id`` of ``arena`` (a launch
    may cover part of the grid, reusing the arena). ``tc`` (int64) counts the elements each load
    (slot ``2*i``) and store (``2*i + 1``) of parameter ``i`` moved, when ``COUNT``."""
    if opts.precision not in PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {PRECISIONS}, got {opts.precision!r}")
    if dtype not in ("float32", "float64"):
        raise Unsupported(f"dtype {dtype}")
    params = g.params
    ctx = _Ctx(cascade, g, dtype, opts)
    ctx.params = {t: f"x{i}" for i, t in enumerate(params)}
    ctx.slot = {t: 2 * i for i, t in enumerate(params)}
    ctx.spec = {b.name: b for b in g.buffers}
    ctx.bufvar = {b.name: f"b{i}" for i, b in enumerate(g.buffers)}
    ctx.ranges = {n: dict(zip(cascade.einsum(n).ranks, rs, strict=True)) for n, rs in g.ranges.items()}
    ctx.inline = frozenset(m for m, _ in g.inline)
    arena = max(1, g.arena_elements)
    ctx.emit(0, f"# group {g.index}: {', '.join(g.einsums)}")
    ctx.emit(0, "@triton.jit")
    ctx.emit(0, f"def kernel({', '.join([*ctx.params.values(), 'arena', 'tc', 'PID0', 'COUNT: tl.constexpr'])}):")
    ctx.emit(1, "pid = PID0 + tl.program_id(0)")
    ctx.emit(1, f"ab = arena + tl.program_id(0).to(tl.int64) * {arena}")
    rest = "pid"
    for j in reversed(range(g.grid)):
        lp = g.loops[j]
        ctx.emit(1, f"t{j} = {rest} % {lp.trips}")
        ctx.emit(1, f"g{j} = {rest} // {lp.trips}")
        rest = f"g{j}"
    for b in g.buffers:
        ctx.emit(1, f"{ctx.bufvar[b.name]} = ab + {b.offset}")
        for i, ax in enumerate(b.axes):
            if ax.base == "window":
                ctx.emit(1, f"wb_{ctx.bufvar[b.name]}_{i} = tl.full([], 0, tl.int32)")
    for s, _ in g.statements():
        if isinstance(s, Load) and s.slides is not None:
            ctx.emit(1, f"ld_{ctx.bufvar[s.buffer]} = tl.full([], -1, tl.int32)")
    _statements(ctx, g.body, 1)
    return TritonKernel(PRELUDE + "\n" + "\n".join(ctx.lines) + "\n", params, g.programs, arena, ctx.dots,
                        ctx.warps, tuple(ctx.in_registers))


__all__ = ["PRECISIONS", "TRITON_INDEX", "TritonKernel", "TritonOptions", "Unsupported", "group_kernel_source"]
