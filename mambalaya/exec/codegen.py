"""Cascade IR -> Python source of one Numba loop nest per fusion group.

The generated source is built only from the parsed IR (tensor names become
``a_<index>`` parameters, ranks ``i_<rank>`` loop variables, params are baked in
as numeric literals), so no user text is ever evaluated. Each group becomes one
``kernel(*arrays, tc)`` function: its parameters are the boundary arrays (inputs
and weights of the group, initial states, then the produced tensors that leave
the group) and ``tc``, an int64 traffic counter with one read and one write slot
per boundary tensor (see :mod:`mambalaya.exec.traffic_counter`).

Semantics mirror :mod:`mambalaya.exec.reference` exactly: index expressions are
evaluated in exact integer arithmetic (floor division, remainder, rational
coefficients scaled to a common denominator), reads outside a tensor give zero,
a tensor with an initial state reads that state at index -1 of its iterative
position, a recurrence reads its own previous step, ``where`` masks zero the
output (or the summed terms when the mask involves summed ranks), every
additive term is summed over its own ranks, and ``cumsum`` is a prefix sum.

Two loop-nest shapes are generated per Einsum: a point-wise nest (one scalar
per output element, reductions as inner loops) and, for a summed product of
factors that splits into two operand groups sharing the summed ranks, a
gather + ``np.dot`` (BLAS) + scatter nest, because a naive triple loop is an
order of magnitude slower than BLAS on the projections.

Element-wise math is written to vectorise: ``exp`` (and the sigmoid and
softplus built on it) is the prelude's own polynomial, not a libm call, which
LLVM cannot vectorise without SVML (and this llvmlite is not built with SVML);
it is within a few ulp of numpy's, except that results below the smallest
normal number are 0. A float32 kernel computes element-wise in float32, as the
reference does; its reductions still sum in float64.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import sympy

from mambalaya.errors import MambalayaError
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
    multiplicative_factors,
    walk,
)
from mambalaya.ir.indexing import index_within
from mambalaya.ir.mapping import FusionGroup, Mapping

#: Work (elements x inner trip count) above which a loop nest gets ``prange``.
PARALLEL_WORK = 1 << 18
#: Smallest M, N and K for which the gather + BLAS path beats the point-wise loop.
GEMM_MIN = 8
#: Smallest N x K (M x K) for which a matrix-vector product (M or N small) goes to BLAS.
GEMV_MIN = 1 << 12
#: Run the batch points (or row blocks) of a BLAS product in ``prange``; the executor turns it off
#: where it cannot make BLAS single-threaded (see :func:`mambalaya.exec.fused.blas_single_thread`).
BLAS_IN_PRANGE = True
#: Fewest rows of a row block of a BLAS product split across threads.
GEMM_ROWS_MIN = 64


def _threads() -> int:
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


#: Channels of the innermost parallel rank a fused scan advances together per step.
SCAN_BLOCK = 32

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


@njit(cache=True, error_model="numpy", inline="always")
def _sigmoid(x):
    return 1.0 / (1.0 + _exp(-x))


@njit(cache=True, error_model="numpy", inline="always")
def _softplus(x):
    # np.logaddexp(0, x) = max(x, 0) + log1p(exp(-|x|)), as numpy computes it (NaN stays NaN)
    return (x if x > 0.0 else 0.0) + _log1p_unit(_exp(-abs(x)))


@njit(cache=True, error_model="numpy", inline="always")
def _maximum(a, b):
    if a != a or b != b:
        return a + b
    return a if a >= b else b


@njit(cache=True, error_model="numpy", inline="always")
def _minimum(a, b):
    if a != a or b != b:
        return a + b
    return a if a <= b else b

'''

_UNARY = {
    "exp": "_exp({0})",
    "log": "np.log({0})",
    "softplus": "_softplus({0})",
    "silu": "({0} * _sigmoid({0}))",
    "sigmoid": "_sigmoid({0})",
    "rsqrt": "(1.0 / np.sqrt({0}))",
    "sqrt": "np.sqrt({0})",
    "neg": "(-{0})",
    "abs": "abs({0})",
    "relu": "_maximum({0}, 0.0)",
}
#: float32 kernels: exp in float32 (the reference's float32 numpy computes it in float32 too).
_UNARY32 = {**_UNARY, "exp": "_exp32(np.float32({0}))"}


def _literal(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        return "np.nan"
    if math.isinf(v):
        return "np.inf" if v > 0 else "(-np.inf)"
    return repr(v)


@dataclass
class _Ctx:
    """What the emitter of one group knows: arrays, rank variables, statements."""

    cascade: Cascade
    arrays: dict[str, str]  # tensor -> array variable (param or local buffer)
    dtype: str = "float64"  # what the kernel computes in
    lines: list[str] = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)
    self_rec: tuple[str, str] | None = None  # (tensor, out array) of the recurrence being emitted
    inline: frozenset[str] = frozenset()  # on-chip point-wise tensors recomputed at each read
    bounds: dict[str, tuple[str, str]] = field(default_factory=dict)  # tiled rank -> (lo, hi) of this tile
    marks: dict[str, tuple[str, int]] = field(default_factory=dict)  # boundary tensor -> (bitmap, counter slot)
    #: (recurrence tensor, state array, state ranks) of a fused scan: its reads come from the local state
    state: tuple[str, str, tuple[str, ...], dict[str, str]] | None = None
    #: (tensor, index variables) -> local element: a blocked scan's step-invariant reads, staged per block
    staged: dict[tuple[str, tuple[str, ...]], str] = field(default_factory=dict)

    @property
    def zero(self) -> str:
        """The initial value of an element-wise accumulator: float32 zero in a float32 kernel, so float32
        operands are not promoted to float64 (which halves the SIMD lanes). Reductions keep float64 sums."""
        return "np.float32(0.0)" if self.dtype == "float32" else "0.0"

    def tmp(self, stem: str = "v") -> str:
        return f"{stem}{next(self.counter)}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)


def _add(ctx: _Ctx, depth: int, var: str, sign: int, code: str, first: bool) -> None:
    """``var += code`` (``-=`` for a negative term); the first term of a sum assigns: ``x``, not
    ``0.0 + x``, which LLVM may not fold (it differs for -0.0) and which costs an add per element."""
    if first and sign > 0:
        ctx.emit(depth, f"{var} = {code}")
        return
    if first:
        ctx.emit(depth, f"{var} = {ctx.zero}")
    ctx.emit(depth, f"{var} {'+=' if sign > 0 else '-='} {code}")


# ---- index expressions -------------------------------------------------


def _python_power(n: str, e: int) -> str:
    return f"({n} ** {e})"


@dataclass(frozen=True)
class IndexDialect:
    """How a target language spells the index operations whose rounding matters.

    Python and Numba floor (``//``, ``%``); Triton's integer division truncates toward zero, so its
    kernels call floor helpers (``_fdiv``, ``_fmod`` in their prelude)."""

    floordiv: str = "({n} // {d})"
    ceildiv: str = "(-((-{n}) // {d}))"
    mod: str = "({n} % {m})"
    power: Callable[[str, int], str] = _python_power
    error: type[Exception] = MambalayaError
    constant_modulus: bool = False  # remainders only by a positive whole constant


NUMBA_INDEX = IndexDialect()


def _index_code(expr: sympy.Expr, rv: dict[str, str], values: dict,
                dialect: IndexDialect = NUMBA_INDEX) -> tuple[str, int]:
    """Integer code for an index expression as (numerator code, denominator): exact, like the reference."""
    def sub(x: sympy.Expr) -> tuple[str, int]:
        return _index_code(x, rv, values, dialect)

    if expr.is_Integer:
        return str(int(expr)), 1
    if expr.is_Rational:
        return str(int(expr.p)), int(expr.q)
    if expr.is_Symbol:
        name = str(expr)
        if name in rv:
            return rv[name], 1
        value = values[name]
        if float(value) != int(value):
            raise MambalayaError(f"param {name} = {value} used in an index is not a whole number")
        return str(int(value)), 1
    if expr.is_Add:
        parts = [sub(a) for a in expr.args]
        den = 1
        for _, d in parts:
            den = den * d // math.gcd(den, d)
        return "(" + " + ".join(f"{n} * {den // d}" if den // d != 1 else n for n, d in parts) + ")", den
    if expr.is_Mul:
        parts = [sub(a) for a in expr.args]
        return "(" + " * ".join(n for n, _ in parts) + ")", math.prod(d for _, d in parts)
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        n, d = sub(expr.base)
        e = int(expr.exp)
        return dialect.power(n, e), d**e
    if isinstance(expr, sympy.floor):
        n, d = sub(expr.args[0])
        return (dialect.floordiv.format(n=n, d=d) if d != 1 else n), 1
    if isinstance(expr, sympy.ceiling):
        n, d = sub(expr.args[0])
        return (dialect.ceildiv.format(n=n, d=d) if d != 1 else n), 1
    if isinstance(expr, sympy.Mod):
        n, d = sub(expr.args[0])
        m, md = sub(expr.args[1])
        if d != 1 or md != 1 or (dialect.constant_modulus
                                 and not (expr.args[1].is_Integer and int(expr.args[1]) > 0)):
            raise dialect.error(f"remainder of a fraction or by a non-constant in index {expr}")
        return dialect.mod.format(n=n, m=m), 1
    raise dialect.error(f"cannot generate code for index expression {expr}")


def _bind(expr: sympy.Expr, rv: dict[str, str], values: dict) -> sympy.Expr:
    """Substitute the (whole-number) params of an index expression, leaving rank symbols."""
    subs = {}
    for sym in expr.free_symbols:
        name = str(sym)
        if name in rv:
            continue
        value = values[name]
        if float(value) != int(value):
            raise MambalayaError(f"param {name} = {value} used in an index is not a whole number")
        subs[sym] = sympy.Integer(int(value))
    return expr.xreplace(subs) if subs else expr


def _int_index(expr: sympy.Expr, rv: dict[str, str], values: dict, what: str) -> str:
    n, d = _index_code(_bind(expr, rv, values), rv, values)
    if d != 1:
        raise MambalayaError(f"index {expr} of {what} is fractional")
    return n


# ---- scalar expressions ------------------------------------------------


def _access(ctx: _Ctx, acc: Access, rv: dict[str, str], depth: int) -> str:
    """Emit a padded read; return the variable holding the value."""
    c = ctx.cascade
    if ctx.state is not None and acc.tensor == ctx.state[0]:
        # a fused scan's state (validated by scan_plan: the same point, this step or the one before)
        e = c.einsum(acc.tensor)
        pos = {r: p for p, r in enumerate(e.out_ranks)}
        lo = ctx.state[3]
        idx = [rv[str(acc.indices[pos[r]])] + (f" - {lo[r]}" if r in lo else "") for r in ctx.state[2]] or ["0"]
        out = ctx.tmp()
        ctx.emit(depth, f"{out} = {ctx.state[1]}[{', '.join(idx)}]")
        return out
    if ctx.self_rec is not None and acc.tensor == ctx.self_rec[0]:
        return _self_read(ctx, acc, rv, depth)
    shape = c.shape(acc.tensor)
    if len(acc.indices) != len(shape):
        raise MambalayaError(f"{acc.tensor} has {len(shape)} axes but is read with {len(acc.indices)} indices")
    if acc.tensor in ctx.inline:
        return _inlined(ctx, acc, rv, depth)
    arr = ctx.arrays[acc.tensor]
    prod = c._by_name.get(acc.tensor)
    rec = prod.recurrence if prod is not None and prod.recurrence is not None and prod.recurrence.init else None
    idx, conds = [], []
    for pos, ix in enumerate(acc.indices):
        code = _int_index(ix, rv, c.values, acc.tensor)
        # a plain rank no longer than the axis never leaves the tensor: no bounds check
        plain = bool(ix.is_Symbol) and str(ix) in c.rank_sizes and c.rank_sizes[str(ix)] <= shape[pos]
        if code.isidentifier() or code.lstrip("-").isdigit():
            var = code
        else:
            var = ctx.tmp("j")
            ctx.emit(depth, f"{var} = {code}")
        idx.append(var)
        if not plain:
            conds.append((pos, var))
    out = ctx.tmp()
    staged = ctx.staged.get((acc.tensor, tuple(idx)))
    if staged is not None:
        ctx.emit(depth, f"{out} = {staged}")
        return out
    if not conds:
        ctx.emit(depth, f"{out} = {arr}[{', '.join(idx)}]")
        return out
    inside = " and ".join(f"0 <= {v} < {shape[p]}" for p, v in conds)
    ctx.emit(depth, f"if {inside}:")
    ctx.emit(depth + 1, f"{out} = {arr}[{', '.join(idx)}]")
    if rec is not None and any(p == rec.position for p, _ in conds):
        pos = rec.position
        other = [f"0 <= {v} < {shape[p]}" for p, v in conds if p != pos]
        init_idx = ", ".join(v for p, v in enumerate(idx) if p != pos) or "()"
        ctx.emit(depth, f"elif {' and '.join([f'{idx[pos]} == -1', *other])}:")
        ctx.emit(depth + 1, f"{out} = {ctx.arrays[rec.init]}[{init_idx}]")
    ctx.emit(depth, "else:")
    ctx.emit(depth + 1, f"{out} = {ctx.zero}")
    return out


def inlinable(e: Einsum) -> bool:
    """A point-wise Einsum (no reduction, mask or recurrence): its value can be recomputed in registers."""
    if e.where or e.recurrence is not None or e.reduced_ranks:
        return False
    return not any(isinstance(n, Reduce) for n in walk(e.expr)) and len(set(e.out_ranks)) == len(e.out_ranks)


def _inlinable_masked(e: Einsum) -> bool:
    """Point-wise like :func:`inlinable`, or point-wise under a ``where`` mask over its own output ranks
    (the value is zero outside the mask): a causal decay mask is built per tile at its read."""
    if inlinable(e):
        return True
    if not e.where or e.recurrence is not None or e.reduced_ranks:
        return False
    if any(isinstance(n, Reduce) for n in walk(e.expr)) or len(set(e.out_ranks)) != len(e.out_ranks):
        return False
    return {r for cmp in e.where for r in cmp.ranks()} <= set(e.out_ranks)


#: Most evaluations per element of an inlined element-wise producer (one if it calls a function).
RECOMPUTE_MAX = 4


def inline_set(cascade: Cascade, plan: GroupPlan) -> frozenset[str]:
    """The on-chip element-wise tensors recomputed at each read (the rest of the locals get buffers).

    Counts how often each element would be evaluated: every read of it in the group, times the ranks
    the reader's loop nest iterates that the read does not index (a projection reading an activation
    for every output column), times how often the reader itself is evaluated when it is inlined too;
    a BLAS gather evaluates its operand factors once per operand element. A producer is inlined when
    that is at most ``RECOMPUTE_MAX``, or once for one that calls a function (exp, silu, ...): Mamba-2's
    gate ``YG = Y * silu(Z)``, read twice by the RMS norm and once more through the normalised output,
    costs three sigmoids per element inlined and one buffered.
    """
    c = cascade
    cands = [t for t in plan.local if _inlinable_masked(c.einsum(t))]
    evals: dict[str, int] = {}  # inlined tensor -> evaluations per element
    for t in reversed(cands):  # readers come after their producers: decided first
        count = 0
        for m in plan.members:
            e = c.einsum(m)
            if t not in e.reads or m == t:
                continue
            for _, term, summed in e.terms():
                accs = [a for a in accesses(term) if a.tensor == t]
                if not accs:
                    continue
                gp = _np_gemm_plan(c, e, term, summed)
                for a in accs:
                    if gp is not None:
                        side = gp.a if any(x is a or a in accesses(x) for x in gp.a) else gp.b
                        ranks = frozenset().union(*(free_ranks(x) for x in side))
                    else:
                        ranks = frozenset(e.ranks)
                    count += math.prod(c.rank_sizes[r] for r in ranks - a.ranks()) * evals.get(m, 1)
        calls = any(isinstance(n, Call) for n in walk(c.einsum(t).expr))
        if count <= (1 if calls else RECOMPUTE_MAX):
            evals[t] = max(count, 1)
    return frozenset(evals)


def _inlined(ctx: _Ctx, acc: Access, rv: dict[str, str], depth: int) -> str:
    """An on-chip element-wise producer fused into its consumer (RI): computed at the read, never stored."""
    c = ctx.cascade
    e = c.einsum(acc.tensor)
    shape = c.shape(acc.tensor)
    inner: dict[str, str] = {}
    conds = []
    for pos, (r, ix) in enumerate(zip(e.out_ranks, acc.indices, strict=True)):
        code = _int_index(ix, rv, c.values, acc.tensor)
        if code.isidentifier():  # a rank variable: the producer reads it as is (and staged reads still match)
            var = code
        else:
            var = ctx.tmp("j")
            ctx.emit(depth, f"{var} = {code}")
        inner[r] = var
        plain = bool(ix.is_Symbol) and str(ix) in c.rank_sizes and c.rank_sizes[str(ix)] <= shape[pos]
        if not plain:
            conds.append(f"0 <= {var} < {shape[pos]}")
    out = ctx.tmp()
    d = depth
    if e.where:  # a masked producer: zero outside its mask (mask ranks are its output ranks)
        conds.append(f"({_mask_code(e, inner, c.values)})")
    if conds:
        ctx.emit(d, f"{out} = {ctx.zero}")
        ctx.emit(d, f"if {' and '.join(conds)}:")
        d += 1
    for i, (sign, term, _) in enumerate(e.terms()):
        _add(ctx, d, out, sign, _node(ctx, term, inner, d), first=i == 0 and not conds)
    return out


def _self_read(ctx: _Ctx, acc: Access, rv: dict[str, str], depth: int) -> str:
    """A recurrence's read of its previous step (the reference ignores the written indices)."""
    c = ctx.cascade
    e = c.einsum(acc.tensor)
    rec = e.recurrence
    assert rec is not None
    arr = ctx.self_rec[1] if ctx.self_rec else ""
    idx = [rv[r] for r in e.out_ranks]
    t = idx[rec.position]
    idx[rec.position] = f"{t} - 1"
    out = ctx.tmp()
    ctx.emit(depth, f"if {t} > 0:")
    ctx.emit(depth + 1, f"{out} = {arr}[{', '.join(idx)}]")
    ctx.emit(depth, "else:")
    if rec.init is not None:
        init_idx = ", ".join(v for p, v in enumerate(idx) if p != rec.position) or "()"
        ctx.emit(depth + 1, f"{out} = {ctx.arrays[rec.init]}[{init_idx}]")
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
    if isinstance(node, Call):
        args = [_node(ctx, a, rv, depth) for a in node.args]
        if node.fn in _UNARY:
            if len(args) != 1:
                raise MambalayaError(f"{node.fn} takes one argument, got {len(args)}")
            var = ctx.tmp()
            ctx.emit(depth, f"{var} = {args[0]}")
            return (_UNARY32 if ctx.dtype == "float32" else _UNARY)[node.fn].format(var)
        if node.fn == "clamp":
            return f"_minimum(_maximum({args[0]}, {args[1]}), {args[2]})"
        if node.fn in ("maximum", "minimum"):
            return f"_{node.fn}({args[0]}, {args[1]})"
        raise MambalayaError(f"the fused executor has no implementation of function '{node.fn}'")
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
        # value at rank position i is the sum of arg over 0..i (np.cumsum along the rank)
        var = ctx.tmp(f"i_{node.rank}_")
        ctx.emit(depth, f"{acc} = 0.0")
        ctx.emit(depth, f"for {var} in range({rv[node.rank]} + 1):")
        val = _node(ctx, node.arg, {**rv, node.rank: var}, depth + 1)
        ctx.emit(depth + 1, f"{acc} += {val}")
        return acc
    var = f"i_{node.rank}"
    inner = {**rv, node.rank: var}
    if node.op in ("sum", "mean"):
        ctx.emit(depth, f"{acc} = 0.0")
        ctx.emit(depth, f"for {var} in range({size}):")
        val = _node(ctx, node.arg, inner, depth + 1)
        ctx.emit(depth + 1, f"{acc} += {val}")
        return f"({acc} / {size})" if node.op == "mean" else acc
    if node.op in ("max", "min"):
        ctx.emit(depth, f"{acc} = {'-np.inf' if node.op == 'max' else 'np.inf'}")
        ctx.emit(depth, f"for {var} in range({size}):")
        val = _node(ctx, node.arg, inner, depth + 1)
        ctx.emit(depth + 1, f"{acc} = _{'maximum' if node.op == 'max' else 'minimum'}({acc}, {val})")
        return acc
    raise MambalayaError(f"unknown reduction {node.op}")


def _mask_code(e: Einsum, rv: dict[str, str], values: dict) -> str:
    parts = []
    for cmp in e.where:
        ln, ld = _index_code(_bind(cmp.lhs, rv, values), rv, values)
        rn, rd = _index_code(_bind(cmp.rhs, rv, values), rv, values)
        parts.append(f"({ln} * {rd} {cmp.op} {rn} * {ld})")
    return " and ".join(parts)


# ---- one Einsum --------------------------------------------------------


def _rv(ranks: tuple[str, ...] | list[str]) -> dict[str, str]:
    return {r: f"i_{r}" for r in ranks}


def _loop(ctx: _Ctx, depth: int, rank: str, size: int, par: bool, tiled: bool = False) -> int:
    """A loop over a rank: the current tile's range when ``tiled`` and the rank is a tiled loop."""
    rng = f"{ctx.bounds[rank][0]}, {ctx.bounds[rank][1]}" if tiled and rank in ctx.bounds else str(size)
    ctx.emit(depth, f"for i_{rank} in {'prange' if par else 'range'}({rng}):")
    return depth + 1


def _extent(ctx: _Ctx, rank: str, tiled: bool) -> str:
    if tiled and rank in ctx.bounds:
        lo, hi = ctx.bounds[rank]
        return f"({hi} - {lo})"
    return str(ctx.cascade.rank_sizes[rank])


def _offset(ctx: _Ctx, rank: str, tiled: bool) -> str:
    return f"(i_{rank} - {ctx.bounds[rank][0]})" if tiled and rank in ctx.bounds else f"i_{rank}"


def _out_order(e: Einsum, order: tuple[str, ...]) -> list[str]:
    ranks = [r for r in order if r in e.out_ranks]
    return ranks + [r for r in e.out_ranks if r not in ranks]


def _pick_parallel(ctx: _Ctx, ranks: list[str], work: int, avoid: str | None = None) -> str | None:
    if work < PARALLEL_WORK:
        return None
    for r in ranks:
        if r != avoid and ctx.cascade.rank_sizes[r] >= 2:
            return r
    return None


def _work(c: Cascade, e: Einsum) -> int:
    return math.prod(c.rank_sizes[r] for r in e.ranks)


def _emit_pointwise(
    ctx: _Ctx, e: Einsum, out: str, order: tuple[str, ...], depth: int, terms: list, accumulate: bool = False
) -> None:
    """Point-wise nest: one scalar per output element (of this tile), summed ranks as inner loops."""
    c = ctx.cascade
    ranks = _out_order(e, order)
    rec = e.recurrence
    if rec is not None:
        # any order works as long as the iterative rank runs ascending (each step reads only its own
        # predecessor at the same other indices); keeping it outer streams the state contiguously
        ctx.self_rec = (e.name, out)
    par = _pick_parallel(ctx, ranks, _work(c, e), rec.rank if rec else None)
    for r in ranks:
        depth = _loop(ctx, depth, r, c.rank_sizes[r], r == par, tiled=True)
    rv = _rv(e.ranks)
    mask_ranks = {r for cmp in e.where for r in cmp.ranks()}
    outer_mask = bool(e.where) and mask_ranks <= set(e.out_ranks)
    store = f"{out}[{', '.join(rv[r] for r in e.out_ranks)}]"
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


@dataclass(frozen=True)
class _Gemm:
    a: tuple[Node, ...]
    b: tuple[Node, ...]
    batch: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]


def _gemm_plan(c: Cascade, e: Einsum, term: Node, summed: frozenset[str], vector: bool = False) -> _Gemm | None:
    """Split a summed product into two operand groups for BLAS, or None when it is not worth it.

    ``vector``: a matrix-vector product (M or N below ``GEMM_MIN``, as a decode step's projections at
    batch 1) qualifies too when the other two sizes are large; the Triton backend keeps the default.
    """
    if e.where or e.recurrence is not None or not summed:
        return None
    factors = multiplicative_factors(term)
    if not factors or len(factors) > 6:
        return None
    fr = [free_ranks(f) for f in factors]
    size = c.rank_sizes
    best, best_score = None, 0
    for mask in range(1, 2 ** len(factors) - 1):
        ga = [i for i in range(len(factors)) if mask >> i & 1]
        gb = [i for i in range(len(factors)) if not mask >> i & 1]
        ra = frozenset().union(*(fr[i] for i in ga))
        rb = frozenset().union(*(fr[i] for i in gb))
        # (a summed rank of size 1 may index one side only: the decode step's token rank)
        shared = summed if not vector else frozenset(r for r in summed if size[r] != 1)
        if not shared <= (ra & rb) or set(e.out_ranks) - (ra | rb):
            continue
        ordered = [r for r in e.ranks]
        batch = tuple(r for r in ordered if r in (ra & rb) - summed)
        m = tuple(r for r in ordered if r in ra - rb)
        n = tuple(r for r in ordered if r in rb - ra)
        k = tuple(r for r in ordered if r in summed)
        ms, ns, ks = (math.prod(size[r] for r in g) for g in (m, n, k))
        if min(ms, ns, ks) < GEMM_MIN:
            if not vector or ks < GEMM_MIN or max(ms, ns) * ks < GEMV_MIN:
                continue
        score = min(ms, ns) * ks if min(ms, ns) >= GEMM_MIN else max(ms, ns) * ks // GEMV_MIN
        if score > best_score:
            best_score = score
            best = _Gemm(tuple(factors[i] for i in ga), tuple(factors[i] for i in gb), batch, m, n, k)
    return best


def _flat(ctx: _Ctx, ranks: tuple[str, ...], tiled: bool) -> str:
    """Row-major flat index of ``ranks`` within this tile's extents."""
    if not ranks:
        return "0"
    code = _offset(ctx, ranks[0], tiled)
    for r in ranks[1:]:
        code = f"({code} * {_extent(ctx, r, tiled)} + {_offset(ctx, r, tiled)})"
    return code


def _np_gemm_plan(c: Cascade, e: Einsum, term: Node, summed: frozenset[str]) -> _Gemm | None:
    """The Numba executor's split: matrix-vector products (decode at batch 1) go to BLAS too."""
    return _gemm_plan(c, e, term, summed, vector=True)


def _view_code(arr: str, parts: list[str]) -> str:
    """``arr[parts]`` without trailing full slices: numba then keeps a contiguous block typed contiguous
    (``W[a:b]`` is C, ``W[a:b, :]`` is not), so np.dot reads it in place instead of copying it."""
    while parts and parts[-1] == ":":
        parts = parts[:-1]
    return f"{arr}[{', '.join(parts)}]" if parts else arr


def _matrix_view(ctx: _Ctx, e: Einsum, factors: tuple[Node, ...], outer: tuple[str, ...],
                 inner: tuple[str, ...], t_outer: bool, t_inner: bool) -> tuple[str, int] | None:
    """A direct view of a one-read operand as the [outer, inner] matrix (code, 2), or as the vector over
    its one non-empty side (code, 1): an array slice after fixing the other ranks, so BLAS reads it in
    place (numba copies a strided slice to a contiguous one, a vectorised memcpy). None: gather it."""
    c = ctx.cascade
    if len(factors) != 1 or not isinstance(factors[0], Access) or (not outer and not inner):
        return None
    acc = factors[0]
    t = acc.tensor
    if (t in ctx.inline or t not in ctx.arrays or (ctx.state is not None and ctx.state[0] == t)
            or (ctx.self_rec is not None and ctx.self_rec[0] == t)):
        return None
    shape = c.shape(t)
    if len(acc.indices) != len(shape):
        return None
    size = c.rank_sizes
    mat = (*outer, *inner)
    rv = _rv(e.ranks)
    fixed = set(e.ranks) - set(mat)  # batch ranks and size-1 ranks: scalars here
    parts, axes, whole = [], [], True
    for pos, ix in enumerate(acc.indices):
        b = _bind(ix, rv, c.values)
        syms = {str(x): x for x in b.free_symbols}
        here = [r for r in mat if r in syms]
        if len(here) > 1 or set(syms) - fixed - set(here):
            return None
        if not here:
            if not index_within(b, c.rank_sizes, shape[pos]):
                return None
            parts.append(_int_index(b, rv, c.values, t))
            whole = False
            continue
        r = here[0]
        rest = sympy.expand(b - syms[r])
        if syms[r] in rest.free_symbols or not index_within(rest, c.rank_sizes, shape[pos], 0, size[r] - 1):
            return None
        tiled = r in ctx.bounds and ((r in outer and t_outer) or (r in inner and t_inner))
        axes.append(r)
        if rest == 0 and not tiled and size[r] == shape[pos]:
            parts.append(":")
            continue
        whole = False
        start = _int_index(rest, rv, c.values, t) if rest != 0 else "0"
        if tiled:
            lo, hi = ctx.bounds[r]
            parts.append(f"{start} + {lo}:{start} + {hi}")
        else:
            parts.append(f"{start}:{start} + {size[r]}")
    arr = ctx.arrays[t]
    if len(outer) <= 1 and len(inner) <= 1:
        view = _view_code(arr, parts)
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
        return f"{arr}.reshape(({mo}, {ki}))", 2
    if tuple(axes) == (*inner, *outer):
        return f"{arr}.reshape(({ki}, {mo})).T", 2
    return None


def _hoist_factors(ctx: _Ctx, factors: tuple[Node, ...], outer: tuple[str, ...], inner: tuple[str, ...],
                   t_out: bool, t_in: bool, rv: dict[str, str], out: str, depth: int) -> dict[int, str]:
    """Evaluate a gathered operand's costly factors (a function call, or an inlined producer) that vary over
    only some of the matrix's ranks once per value, into a small array: Mamba-2's state-to-output operand
    ``C[q,n] * exp(ACS[q])`` takes one exp per token, not one per token and state element.

    Returns factor position -> the code reading its value inside the gather loops.
    """
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
        tiled = {r: t_out if r in outer else t_in for r in ranks}
        name = ctx.tmp("h")
        ctx.emit(depth, f"{name} = np.empty(({', '.join(_extent(ctx, r, tiled[r]) for r in ranks) or '1'},), "
                        f"dtype={out}.dtype)")
        d = depth
        for r in ranks:
            d = _loop(ctx, d, r, c.rank_sizes[r], False, tiled=tiled[r])
        cell = f"{name}[{', '.join(_offset(ctx, r, tiled[r]) for r in ranks) or '0'}]"
        ctx.emit(d, f"{cell} = {_node(ctx, f, rv, d)}")
        found[i] = cell
    return found


def _emit_gemm(ctx: _Ctx, e: Einsum, out: str, depth: int, sign: int, plan: _Gemm, assign: bool = False) -> None:
    """One BLAS product per batch point of this tile: each operand a direct array view where its layout
    allows (see :func:`_matrix_view`), else gathered into a contiguous matrix; the result is stored
    through a view of the output, or scattered. ``assign``: the output tile was not zeroed (the
    Einsum's only term), so the product is stored, not added. Batch points run in sequence.
    """
    c = ctx.cascade
    size = c.rank_sizes
    one = [r for r in (*plan.batch, *plan.m, *plan.n, *plan.k) if size[r] == 1]
    batch = tuple(r for r in plan.batch if r not in one)
    gm = tuple(r for r in plan.m if r not in one)
    gn = tuple(r for r in plan.n if r not in one)
    gk = tuple(r for r in plan.k if r not in one)
    for r in one:
        ctx.emit(depth, f"i_{r} = 0")
    ms = " * ".join(_extent(ctx, r, True) for r in gm) or "1"
    ns = " * ".join(_extent(ctx, r, True) for r in gn) or "1"
    ks = " * ".join(_extent(ctx, r, False) for r in gk) or "1"
    nb = math.prod(size[r] for r in batch)
    # the kernel's threads run the products (the executor keeps BLAS single-threaded while kernels run:
    # a pthreads OpenBLAS inside an OpenMP loop may hang), over the batch points or else over row blocks
    par = BLAS_IN_PRANGE and _work(c, e) >= PARALLEL_WORK
    rows = gm[0] if len(gm) == 1 and gm[0] not in ctx.bounds else None
    nblk = min(_threads(), size[rows] // GEMM_ROWS_MIN) if rows else 0
    blocked = None
    if par and batch and nb >= 2 and not any(r in ctx.bounds for r in batch):
        ctx.emit(depth, f"for fb in prange({nb}):")
        depth += 1
        for i, r in enumerate(batch):
            stride = math.prod(size[x] for x in batch[i + 1:])
            ctx.emit(depth, f"i_{r} = (fb // {stride}) % {size[r]}" if stride != 1 else f"i_{r} = fb % {size[r]}")
    elif par and nblk >= 2 and not batch:
        blocked = rows
        step = -(-size[rows] // nblk)
        ctx.emit(depth, f"for fb in prange({nblk}):")
        depth += 1
        ctx.emit(depth, f"lo_{rows} = fb * {step}")
        ctx.emit(depth, f"hi_{rows} = min(lo_{rows} + {step}, {size[rows]})")
        ctx.bounds[rows] = (f"lo_{rows}", f"hi_{rows}")
        ms = _extent(ctx, rows, True)
    else:
        for r in batch:
            depth = _loop(ctx, depth, r, size[r], False, tiled=True)
    rv = _rv(e.ranks)
    va = _matrix_view(ctx, e, plan.a, gm, gk, True, False)
    vb = _matrix_view(ctx, e, plan.b, gk, gn, False, True)
    if va is not None and vb is not None and va[1] == 1 and vb[1] == 1:
        vb = None
    sides = []
    for view, mat_ranks, factors, t_out, t_in, shape in (
        (va, (gm, gk), plan.a, True, False, (ms, ks)),
        (vb, (gk, gn), plan.b, False, True, (ks, ns)),
    ):
        if view is not None:
            sides.append(view)
            continue
        mat = ctx.tmp("g")
        ctx.emit(depth, f"{mat} = np.empty(({shape[0]}, {shape[1]}), dtype={out}.dtype)")
        ranks_outer, ranks_inner = mat_ranks
        hoisted = _hoist_factors(ctx, factors, ranks_outer, ranks_inner, t_out, t_in, rv, out, depth)
        d = depth
        for r in ranks_outer:
            d = _loop(ctx, d, r, size[r], False, tiled=t_out)
        for r in ranks_inner:
            d = _loop(ctx, d, r, size[r], False, tiled=t_in)
        vals = [hoisted[i] if i in hoisted else _node(ctx, f, rv, d) for i, f in enumerate(factors)]
        ctx.emit(d, f"{mat}[{_flat(ctx, ranks_outer, t_out)}, {_flat(ctx, ranks_inner, t_in)}] = "
                    f"{' * '.join(vals)}")
        sides.append((mat, 2))
    (ca, da), (cb, db) = sides
    gc = ctx.tmp("gc")
    ctx.emit(depth, f"{gc} = np.dot({ca}, {cb})")
    kind = "mn" if da == db == 2 else ("n" if da == 1 else "m")
    op = "=" if assign else ("+=" if sign > 0 else "-=")
    # the result through a view of the output (its m and n ranks sliced, the others fixed)
    if len(gm) <= 1 and len(gn) <= 1:
        parts, axes = [], []
        for r in e.out_ranks:
            if r in gm or r in gn:
                axes.append(r)
                parts.append(f"{ctx.bounds[r][0]}:{ctx.bounds[r][1]}" if r in ctx.bounds else ":")
            else:
                parts.append(f"i_{r}")
        if kind == "mn":
            if len(axes) == 2:
                rhs = gc if axes == [*gm, *gn] else f"{gc}.T"
            elif gn:
                rhs = f"{gc}[0]"
            elif gm:
                rhs = f"{gc}[:, 0]"
            else:
                rhs = None
        else:
            rhs = gc if len(axes) == 1 else None
        if rhs is not None:
            view = _view_code(out, parts)
            if view == out:  # the whole output: store into it, do not rebind the name
                view = f"{out}[:]"
            if assign:
                ctx.emit(depth, f"{view} = {rhs}")
            else:
                ov = ctx.tmp("ov")
                ctx.emit(depth, f"{ov} = {view}")
                ctx.emit(depth, f"{ov} {op} {rhs}")
            if blocked:
                ctx.bounds.pop(blocked)
            return
    d = depth
    for r in (*gm, *gn):
        d = _loop(ctx, d, r, size[r], False, tiled=True)
    fm, fn = _flat(ctx, gm, True), _flat(ctx, gn, True)
    cell = {"mn": f"{gc}[{fm}, {fn}]", "n": f"{gc}[{fn}]", "m": f"{gc}[{fm}]"}[kind]
    ctx.emit(d, f"{out}[{', '.join(rv[r] for r in e.out_ranks)}] {op} {cell}")
    if blocked:
        ctx.bounds.pop(blocked)


def emit_einsum(ctx: _Ctx, e: Einsum, order: tuple[str, ...], depth: int) -> None:
    """Compute the full output of ``e`` into its array (a boundary array or an on-chip buffer)."""
    c = ctx.cascade
    out = ctx.arrays[e.name]
    terms = e.terms()
    plans = [_np_gemm_plan(c, e, t, s) for _, t, s in terms]
    ctx.emit(depth, f"# {e.text}")
    if not any(plans):
        _emit_pointwise(ctx, e, out, order, depth, terms)
        return
    if len(terms) == 1 and terms[0][0] > 0:  # one product: stored straight, no zeroing pass
        _emit_gemm(ctx, e, out, depth, 1, plans[0], assign=True)
        return
    d = depth  # zero this tile of the output, then accumulate the GEMM terms and the rest
    for r in e.out_ranks:
        d = _loop(ctx, d, r, c.rank_sizes[r], False, tiled=True)
    ctx.emit(d, f"{out}[{', '.join(f'i_{r}' for r in e.out_ranks)}] = 0.0")
    rest = [t for t, p in zip(terms, plans, strict=True) if p is None]
    for (sign, _, _), plan in zip(terms, plans, strict=True):
        if plan is not None:
            _emit_gemm(ctx, e, out, depth, sign, plan)
    if rest:
        _emit_pointwise(ctx, e, out, order, depth, rest, accumulate=True)


# ---- traffic marks ----------------------------------------------------


def _mark(ctx: _Ctx, depth: int, bitmap: str, slot: int, idx: list[str]) -> None:
    """Count an element the first time this pass moves it (a per-pass touched bitmap)."""
    cell = f"{bitmap}[{', '.join(idx) or '()'}]"
    ctx.emit(depth, f"if {cell} == 0:")
    ctx.emit(depth + 1, f"{cell} = 1")
    ctx.emit(depth + 1, f"tc[{slot}] += 1")


def _emit_load_marks(ctx: _Ctx, e: Einsum, depth: int) -> None:
    """The loads of this tile: every in-range element ``e``'s reads of boundary tensors touch.

    The region is enumerated over the ranks indexing each access (the tile's range for ``e``'s
    tiled output ranks, the full extent otherwise), whatever ``where`` masks later skip, like a
    DMA of the tile's operands; a read one step before a recurrence's start loads its initial state.
    """
    c = ctx.cascade
    for acc in accesses(e.expr):
        if acc.tensor == e.name:
            continue
        prod = c._by_name.get(acc.tensor)
        rec = prod.recurrence if prod is not None and prod.recurrence is not None else None
        init = rec.init if rec is not None and rec.init and not acc.indices[rec.position].is_Symbol else None
        own = ctx.marks.get(acc.tensor)
        via = ctx.marks.get(init) if init else None
        if own is None and via is None:
            continue
        shape = c.shape(acc.tensor)
        ranks = [r for r in e.ranks if r in acc.ranks()]
        d = depth
        for r in ranks:
            d = _loop(ctx, d, r, c.rank_sizes[r], False, tiled=r in e.out_ranks)
        rv = _rv(ranks)
        idx = []
        for ix in acc.indices:
            var = ctx.tmp("j")
            ctx.emit(d, f"{var} = {_int_index(ix, rv, c.values, acc.tensor)}")
            idx.append(var)
        inside = " and ".join(f"0 <= {v} < {n}" for v, n in zip(idx, shape, strict=True)) or "True"
        if own is not None:
            ctx.emit(d, f"if {inside}:")
            _mark(ctx, d + 1, own[0], own[1], idx)
        if via is not None and rec is not None:
            pos = rec.position
            cond = [f"{idx[pos]} == -1"] + [f"0 <= {v} < {n}" for p, (v, n) in enumerate(zip(idx, shape,
                                                                                          strict=True)) if p != pos]
            ctx.emit(d, f"if {' and '.join(cond)}:")
            _mark(ctx, d + 1, via[0], via[1], [v for p, v in enumerate(idx) if p != pos])
    rec = e.recurrence
    if rec is not None and rec.init and rec.init in ctx.marks:  # the state a recurrence starts from
        d = depth
        rest = [r for p, r in enumerate(e.out_ranks) if p != rec.position]
        for r in rest:
            d = _loop(ctx, d, r, c.rank_sizes[r], False, tiled=True)
        bitmap, slot = ctx.marks[rec.init]
        _mark(ctx, d, bitmap, slot, [f"i_{r}" for r in rest])


def _emit_store_marks(ctx: _Ctx, e: Einsum, depth: int) -> None:
    """The stores of this tile of ``e``'s output (an element written back once, however often recomputed)."""
    bitmap, slot = ctx.marks[e.name]
    d = depth
    for r in e.out_ranks:
        d = _loop(ctx, d, r, ctx.cascade.rank_sizes[r], False, tiled=True)
    _mark(ctx, d, bitmap, slot, [f"i_{r}" for r in e.out_ranks])


# ---- one group ---------------------------------------------------------


@dataclass(frozen=True)
class GroupPlan:
    """The boundary of one fusion group, as the kernel sees it."""

    index: int
    einsums: tuple[str, ...]
    reads: tuple[str, ...]  # boundary tensors read: inputs, weights, initial states, earlier groups' tensors
    writes: tuple[str, ...]  # produced tensors that leave the group (cascade outputs or read by other groups)
    local: tuple[str, ...]  # produced tensors that stay on chip (recomputed ones included)
    #: initial states a consumer reads as index -1 of a recurrence tensor produced elsewhere (YO reads S0 at
    #: c = 0 through S[b,c-1,...])
    aux: tuple[str, ...] = ()
    #: every Einsum the kernel runs, in cascade order: the group's and those it recomputes
    members: tuple[str, ...] = ()

    @property
    def params(self) -> tuple[str, ...]:
        return (*self.reads, *self.writes, *self.aux)


def plan_group(cascade: Cascade, groups: list[tuple[str, ...]], gi: int, mapping: Mapping | None = None) -> GroupPlan:
    """Which tensors group ``gi`` loads, stores and keeps on chip (``mapping`` supplies ``recompute``)."""
    names = groups[gi]
    recompute = tuple(mapping.groups[gi].recompute) if mapping is not None else ()
    order = {n: i for i, n in enumerate(cascade.einsum_names)}
    members = tuple(sorted({*names, *recompute}, key=order.__getitem__))
    produced = set(members)
    reads: list[str] = []
    for n in members:
        for t in cascade.einsum(n).reads:
            if t not in produced and t not in reads:
                reads.append(t)
    aux: list[str] = []
    for n in members:
        for acc in accesses(cascade.einsum(n).expr):
            prod = cascade._by_name.get(acc.tensor)
            if prod is None or acc.tensor in produced or prod.recurrence is None or not prod.recurrence.init:
                continue
            init = prod.recurrence.init
            if not acc.indices[prod.recurrence.position].is_Symbol and init not in reads and init not in aux:
                aux.append(init)
    outputs = set(cascade.outputs())
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    writes, local = [], []
    for n in members:
        outside = {group_of[cons] for cons in cascade.consumers(n) if cons not in names}
        recomputed_by_all = mapping is not None and bool(outside) and all(
            n in mapping.groups[g].recompute for g in outside)
        leaves = n in outputs or (bool(outside) and not recomputed_by_all)
        (writes if n in names and leaves else local).append(n)
    return GroupPlan(gi, tuple(names), tuple(reads), tuple(writes), tuple(local), tuple(aux), members)


# ---- fused scans -------------------------------------------------------


@dataclass(frozen=True)
class ScanPlan:
    """An untiled group fused around one recurrence: one loop nest, the state in a small local array.

    ``kernel`` loops over the ``outer`` ranks (flattened, ``prange``), then the iterative rank; per
    step the element-wise producers are recomputed in registers, the consumers reading the state
    before the update (``before``) run, the state over the ``inner`` ranks is updated in place, and
    the consumers reading it after the update (``after``) run; ``finals`` copy the last state out.
    The recurrence's full tensor exists only when it leaves the group.
    """

    rec: str
    outer: tuple[str, ...]
    inner: tuple[str, ...]
    before: tuple[str, ...]
    after: tuple[str, ...]
    finals: tuple[str, ...]


def _step_of(ix: sympy.Expr, t: str, values: dict) -> int | None:
    """The offset ``k`` of an index ``t + k`` (None when it is not one)."""
    syms = {str(s): s for s in ix.free_symbols if s.is_integer}
    if set(syms) != {t}:
        return None
    d = sympy.simplify(_bind(ix, {t: t}, values) - syms[t])
    return int(d) if d.is_Integer else None


def scan_plan(cascade: Cascade, group: FusionGroup, plan: GroupPlan, inline: frozenset[str]) -> ScanPlan | None:
    """The fused-scan shape of the group, or None when it does not have it (the general nest runs)."""
    if tiled_loops(cascade, group):
        return None
    c = cascade
    nonin = [m for m in plan.members if m not in inline]
    recs = [m for m in nonin if c.einsum(m).recurrence is not None]
    if len(recs) != 1:
        return None
    r_name = recs[0]
    re_ = c.einsum(r_name)
    rec = re_.recurrence
    t = rec.rank
    outs = re_.out_ranks
    if re_.where or len(set(outs)) != len(outs) or any(s for _, _, s in re_.terms()):
        return None
    if any(isinstance(n, Reduce) for n in walk(re_.expr)):
        return None
    if any(c.shape(r_name)[p] != c.rank_sizes[r] for p, r in enumerate(outs)):
        return None
    produced = set(plan.members)
    for m in inline:  # recomputed producers may read boundary tensors and each other only
        if set(c.einsum(m).reads) & (produced - inline):
            return None

    def plain_at(acc: Access) -> int | None:
        """The step offset of a read of the recurrence at its own point (None: another shape)."""
        for p, (ix, r) in enumerate(zip(acc.indices, outs, strict=True)):
            if p != rec.position and not (ix.is_Symbol and str(ix) == r):
                return None
        return _step_of(acc.indices[rec.position], t, c.values)

    for acc in accesses(re_.expr):
        if acc.tensor == r_name and plain_at(acc) != -1:
            return None
        if acc.tensor in produced and acc.tensor != r_name and acc.tensor not in inline:
            return None
    before, after, finals, consumer_outs = [], [], [], []
    size_t = c.rank_sizes[t]
    for m in nonin:
        if m == r_name:
            continue
        e = c.einsum(m)
        if e.where or e.recurrence is not None or any(isinstance(n, Reduce) and n.op == "cumsum"
                                                          for n in walk(e.expr)):
            return None
        reads_r = [a for a in accesses(e.expr) if a.tensor == r_name]
        if not reads_r:
            return None
        if any(a.tensor in produced and a.tensor not in inline and a.tensor != r_name for a in accesses(e.expr)):
            return None
        if isinstance(e.expr, Access) and e.expr.tensor == r_name:  # a final-state copy
            ix = e.expr.indices[rec.position]
            last = None if any(s.is_integer for s in ix.free_symbols) else _bind(ix, {}, c.values)
            others = [str(x) for p, x in enumerate(e.expr.indices) if p != rec.position]
            if (last is not None and last.is_Integer and int(last) == size_t - 1
                    and all(x.is_Symbol for p, x in enumerate(e.expr.indices) if p != rec.position)
                    and sorted(others) == sorted(e.out_ranks) and len(set(others)) == len(others)
                    and all(o == r for o, r in zip((str(x) for x in e.expr.indices), outs, strict=True)
                            if o in others)):
                finals.append(m)
                continue
            return None
        steps = {plain_at(a) for a in reads_r}
        if len(steps) != 1 or steps - {0, -1}:
            return None
        if not set(e.ranks) <= set(outs) or t not in e.out_ranks or len(set(e.out_ranks)) != len(e.out_ranks):
            return None
        if e.out_ranks != tuple(r for r in outs if r in e.out_ranks):
            return None  # stored in the recurrence's rank order (keeps the point loop simple)
        (before if steps == {-1} else after).append(m)
        consumer_outs.append(set(e.out_ranks))
    rest = [r for r in outs if r != t]
    outer = tuple(r for r in rest if all(r in o for o in consumer_outs))
    inner = tuple(r for r in rest if r not in outer)
    return ScanPlan(r_name, outer, inner, tuple(before), tuple(after), tuple(finals))


def _staged_reads(ctx: _Ctx, sp: ScanPlan, plan: GroupPlan, keep: set[str], blocked: str) -> list[tuple[str, ...]]:
    """A blocked scan's boundary reads that no step changes but that stride the blocked rank: (tensor, rank of
    each axis), as ``A[d,n]`` in ``exp(DT[b,l,d] * A[d,n])`` while the step runs ``d`` innermost.

    Read in place they would be a gather per element; staged once per block in the state's layout, they are
    contiguous loads. Reads through inlined producers count (that is where ``A`` is read).
    """
    c = ctx.cascade
    found: list[tuple[str, ...]] = []

    def visit(e: Einsum, ren: dict[str, str]) -> None:
        for acc in accesses(e.expr):
            if acc.tensor == sp.rec:
                continue
            ranks = [ren.get(str(ix)) if ix.is_Symbol else None for ix in acc.indices]
            if acc.tensor in ctx.inline:
                if None not in ranks:
                    visit(c.einsum(acc.tensor), dict(zip(c.einsum(acc.tensor).out_ranks, ranks, strict=True)))
                continue
            if acc.tensor not in plan.params or None in ranks or len(set(ranks)) != len(ranks):
                continue
            if not set(ranks) <= keep or blocked not in ranks or ranks[-1] == blocked:
                continue
            shape = c.shape(acc.tensor)
            if all(c.rank_sizes[r] <= n for r, n in zip(ranks, shape, strict=True)):  # plain: never padded
                key = (acc.tensor, *ranks)
                if key not in found:
                    found.append(key)

    for name in (*sp.before, sp.rec, *sp.after):
        visit(c.einsum(name), {r: r for r in c.einsum(name).ranks})
    return found


def _emit_scan(ctx: _Ctx, sp: ScanPlan, plan: GroupPlan, dtype: str, depth: int) -> None:
    """The fused scan's loop nest (see :class:`ScanPlan`).

    When the innermost outer rank is long it runs in blocks of ``SCAN_BLOCK`` inside the step loop, and is
    the state's innermost axis: every per-step loop then runs it innermost over contiguous rows, so LLVM
    vectorises the update (and ``_exp``) across channels, and a readout summing over the state's other
    ranks accumulates whole rows (a vertical sum in the same order, not a strict-order horizontal one,
    which cannot vectorise without reassociation). Step-invariant strided reads are staged per block.
    """
    c = ctx.cascade
    re_ = c.einsum(sp.rec)
    rec = re_.recurrence
    t = rec.rank
    size = c.rank_sizes
    work = math.prod(size[r] for r in (*sp.outer, t, *sp.inner))
    # the innermost outer rank runs in blocks inside the step loop: each step streams a contiguous
    # row of the boundary tensors instead of one strided element per channel
    blocked = sp.outer[-1] if sp.outer and size[sp.outer[-1]] >= 2 * SCAN_BLOCK else None
    nblk = -(-size[blocked] // SCAN_BLOCK) if blocked else 1
    outer = sp.outer[:-1] if blocked else sp.outer
    n_outer = math.prod(size[r] for r in outer) * nblk
    state_ranks = sp.inner + ((blocked,) if blocked else ())
    ctx.emit(depth, f"# fused scan of {sp.rec} over {t}: outer {', '.join(sp.outer) or '-'}, "
                    f"state {', '.join(sp.inner) or '-'}")
    loop = "prange" if work >= PARALLEL_WORK and n_outer >= 2 else "range"
    ctx.emit(depth, f"for fo in {loop}({n_outer}):")
    depth += 1
    rem = "fo"
    for k, r in enumerate(outer):
        stride = math.prod(size[x] for x in outer[k + 1:]) * nblk
        ctx.emit(depth, f"i_{r} = ({rem}) // {stride}" if stride != 1 else f"i_{r} = {rem}")
        if stride != 1:
            ctx.emit(depth, f"fo_{k} = ({rem}) % {stride}")
            rem = f"fo_{k}"
    lo: dict[str, str] = {}
    if blocked:
        lo[blocked] = f"lo_{blocked}"
        # max(.., 0): LLVM then knows the indices are not negative, folds numba's wraparound select
        # and loads the rows contiguously (a third faster)
        ctx.emit(depth, f"lo_{blocked} = max(({rem}) * {SCAN_BLOCK}, 0)")
        ctx.emit(depth, f"hi_{blocked} = min(lo_{blocked} + {SCAN_BLOCK}, {size[blocked]})")
        ctx.bounds[blocked] = (f"lo_{blocked}", f"hi_{blocked}")
    st = "st"
    shape = ", ".join(str(SCAN_BLOCK if r == blocked else size[r]) for r in state_ranks) or "1"
    ctx.emit(depth, f"{st} = np.empty(({shape},), dtype=np.{dtype})")
    sidx = ", ".join(f"i_{r}" + (f" - {lo[r]}" if r in lo else "") for r in state_ranks) or "0"
    d = depth
    for r in state_ranks:
        d = _loop(ctx, d, r, size[r], False, tiled=True)
    if rec.init is not None:
        init_idx = ", ".join(f"i_{r}" for p, r in enumerate(re_.out_ranks) if p != rec.position) or "()"
        ctx.emit(d, f"{st}[{sidx}] = {ctx.arrays[rec.init]}[{init_idx}]")
    else:
        ctx.emit(d, f"{st}[{sidx}] = 0.0")
    ctx.state = (sp.rec, st, state_ranks, lo)
    if blocked:
        for k, (tensor, *ranks) in enumerate(_staged_reads(ctx, sp, plan, {*state_ranks, *outer}, blocked)):
            axes = [r for r in state_ranks if r in ranks]
            name = f"stg{k}"
            ctx.emit(depth, f"# {tensor}[{', '.join(ranks)}] does not change over {t}: staged in the state's layout")
            ctx.emit(depth, f"{name} = np.empty(({', '.join(str(SCAN_BLOCK if r == blocked else size[r]) for r in axes)},),"
                            f" dtype=np.{dtype})")
            d = depth
            for r in axes:
                d = _loop(ctx, d, r, size[r], False, tiled=True)
            cell = f"{name}[{', '.join(f'i_{r}' + (f' - {lo[r]}' if r in lo else '') for r in axes)}]"
            ctx.emit(d, f"{cell} = {ctx.arrays[tensor]}[{', '.join(f'i_{r}' for r in ranks)}]")
            ctx.staged[(tensor, tuple(f"i_{r}" for r in ranks))] = cell
    ctx.emit(depth, f"for i_{t} in range({size[t]}):")
    body = depth + 1

    def consumer(name: str) -> None:
        e = c.einsum(name)
        ctx.emit(body, f"# {e.text}")
        d = body
        for r in e.out_ranks:
            if r in state_ranks:
                d = _loop(ctx, d, r, size[r], False, tiled=True)
        rv = _rv(e.ranks)
        store = f"{ctx.arrays[name]}[{', '.join(rv[r] for r in e.out_ranks)}]"
        rows = []  # terms summed over state ranks only, added row by row below (blocked rank innermost)
        total = ctx.tmp("tot")
        first = True
        for sign, term, summed in e.terms():
            op = "+=" if sign > 0 else "-="
            over = [r for r in e.ranks if r in summed]
            arg = term
            while isinstance(arg, Reduce) and arg.op == "sum" and arg.rank not in over:  # sum_n(...) written out
                over.append(arg.rank)
                arg = arg.arg
            if blocked in e.out_ranks and over and set(over) <= set(sp.inner):
                rows.append((op, arg, over))
                continue
            if not over or arg is not term:
                _add(ctx, d, total, sign, _node(ctx, term, rv, d), first)
                first = False
                continue
            acc = ctx.tmp("acc")
            ctx.emit(d, f"{acc} = 0.0")
            dd = d
            for r in over:
                dd = _loop(ctx, dd, r, size[r], False)
            ctx.emit(dd, f"{acc} += {_node(ctx, term, rv, dd)}")
            _add(ctx, d, total, sign, acc, first)
            first = False
        if first:
            ctx.emit(d, f"{total} = {ctx.zero}")
        ctx.emit(d, f"{store} = {total}")
        for op, term, over in rows:
            d = body
            for r in state_ranks:
                if r in over or r in e.out_ranks:
                    d = _loop(ctx, d, r, size[r], False, tiled=True)
            ctx.emit(d, f"{store} {op} {_node(ctx, term, rv, d)}")

    for name in sp.before:
        consumer(name)
    ctx.emit(body, f"# {re_.text}")
    d = body
    for r in state_ranks:
        d = _loop(ctx, d, r, size[r], False, tiled=True)
    rv = _rv(re_.ranks)
    total = ctx.tmp("tot")
    for i, (sign, term, _) in enumerate(re_.terms()):
        _add(ctx, d, total, sign, _node(ctx, term, rv, d), first=i == 0)
    ctx.emit(d, f"{st}[{sidx}] = {total}")
    if sp.rec in plan.writes:
        ctx.emit(d, f"{ctx.arrays[sp.rec]}[{', '.join(rv[r] for r in re_.out_ranks)}] = {total}")
    for name in sp.after:
        consumer(name)
    for name in sp.finals:
        e = c.einsum(name)
        ctx.emit(depth, f"# {e.text}")
        d = depth
        for r in state_ranks:
            d = _loop(ctx, d, r, size[r], False, tiled=True)
        idx = ", ".join(f"i_{r}" for r in e.out_ranks)
        ctx.emit(d, f"{ctx.arrays[name]}[{idx}] = {st}[{sidx}]")
    ctx.state = None
    ctx.staged = {}
    ctx.bounds.pop(blocked, None)


def tiled_loops(cascade: Cascade, group: FusionGroup) -> tuple[tuple[str, int], ...]:
    """(rank, tile) of the group's tile loops, outer to inner: loop-order ranks tiled below their extent."""
    order = list(group.loop_order) + [r for r in group.tiles if r not in group.loop_order]
    return tuple((r, group.tiles[r]) for r in order
                 if r in group.tiles and 0 < group.tiles[r] < cascade.rank_size(r))


def group_source(cascade: Cascade, group: FusionGroup, plan: GroupPlan, dtype: str) -> str:
    """The Python source of the kernel of one fusion group (module text, one ``kernel``).

    ``kernel(*params, *bitmaps, clr, tc, count)``: the tile loops follow the group's loop order;
    inside the innermost, every member Einsum (cascade order) computes its output over the tile
    of each tiled rank it iterates and the full extent of the others (an Einsum without a tiled
    rank is recomputed per tile of it, as the loop nest re-runs it; on-chip buffers hold the
    whole tensor, so halos and recurrence states carry across tiles). With ``count``, each Einsum
    first marks the tile's loads, and after it its stores, in per-parameter bitmaps; the bitmap
    of parameter ``i`` is cleared at the top of tile loop ``clr[i]`` (a new pass over a tensor
    that does not stay on chip; -1: never).
    """
    params = plan.params
    arrays = {t: f"a{i}" for i, t in enumerate(params)}
    for t in plan.local:
        arrays[t] = f"buf_{t}"
    inline = inline_set(cascade, plan)
    ctx = _Ctx(cascade, arrays, dtype=dtype, inline=inline)
    nr = len(plan.reads)
    for i, t in enumerate(params):
        write = nr <= i < nr + len(plan.writes)
        ctx.marks[t] = (f"m{i}", 2 * i + 1 if write else 2 * i)
    loops = tiled_loops(cascade, group)
    ctx.emit(0, f"# group {plan.index}: {', '.join(plan.einsums)}")
    ctx.emit(0, '@njit(cache=True, error_model="numpy", parallel=PARALLEL)')
    sig = [arrays[t] for t in params] + [f"m{i}" for i in range(len(params))]
    ctx.emit(0, f"def kernel({', '.join(sig)}, clr, tc, count):")
    sp = scan_plan(cascade, group, plan, inline)
    for t in plan.local:
        if t not in inline and not (sp is not None and t == sp.rec):
            ctx.emit(1, f"{arrays[t]} = np.empty({cascade.shape(t)}, dtype=np.{dtype})")
    if sp is not None:  # one loop nest: every count mark first (untiled: no pass ends), then the scan
        ctx.emit(1, "if count:")
        ctx.lines.append("        pass")
        for n in plan.members:
            _emit_load_marks(ctx, cascade.einsum(n), 2)
            if n in plan.writes:
                _emit_store_marks(ctx, cascade.einsum(n), 2)
        _emit_scan(ctx, sp, plan, dtype, 1)
        ctx.emit(1, "return 0")
        body = "\n".join(ctx.lines) + "\n"
        return PRELUDE + f"PARALLEL = {'prange(' in body}\n\n\n" + body
    depth = 1
    for level, (r, tile) in enumerate(loops):
        size = cascade.rank_size(r)
        ctx.emit(depth, f"for tt_{r} in range({-(-size // tile)}):")
        depth += 1
        ctx.emit(depth, f"lo_{r} = tt_{r} * {tile}")
        ctx.emit(depth, f"hi_{r} = min(lo_{r} + {tile}, {size})")
        ctx.bounds[r] = (f"lo_{r}", f"hi_{r}")
        ctx.emit(depth, "if count:")
        for i in range(len(params)):
            ctx.emit(depth + 1, f"if clr[{i}] == {level}:")
            ctx.emit(depth + 2, f"m{i}.fill(0)")
    for n in plan.members:
        e = cascade.einsum(n)
        ctx.emit(depth, "if count:")
        ctx.lines.append("    " * (depth + 1) + "pass")
        _emit_load_marks(ctx, e, depth + 1)
        if n not in inline:
            emit_einsum(ctx, e, group.loop_order, depth)
        if n in plan.writes:
            ctx.emit(depth, "if count:")
            _emit_store_marks(ctx, e, depth + 1)
    ctx.emit(1, "return 0")
    body = "\n".join(ctx.lines) + "\n"
    parallel = "prange(" in body
    return PRELUDE + f"PARALLEL = {parallel}\n\n\n" + body
