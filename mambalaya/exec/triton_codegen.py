"""Cascade IR -> Triton source: one ``@triton.jit`` kernel per fusion group.

The same mapping the Numba executor runs is lowered here, with the same
semantics as :mod:`mambalaya.exec.reference` (zero padding outside a tensor,
exact floor division and remainder in index expressions, ``where`` masks, an
initial state read at index -1, per-term Einstein summation, ``cumsum`` as a
prefix sum). How a group becomes a kernel:

* **Program grid.** The *grid ranks* of a group are the ranks every
  materialised Einsum of the group writes and through which every intra-group
  read is a plain index: programs along them are independent. Each grid rank is
  split into program blocks: the mapping's tile where it tiles that rank, else a
  block the backend picks (about 4K output elements per program). Every other
  rank is swept whole inside a program.
* **Phases.** Inside a program the group's Einsums run in order, each over its
  slice, as a loop over flattened blocks of its output; implicit and explicit
  reductions are 2D ``[out, reduced]`` tiles summed along axis 1; a
  ``tl.debug_barrier()`` separates phases. Point-wise Einsums whose every
  reader is in the group are recomputed in registers at each read (never
  stored, as in the Numba executor); other group-local tensors go to a scratch
  array that only this program touches (L2-resident when small).
* **Contractions.** A summed product that splits into two operand groups
  (the Numba executor's GEMM plan) becomes ``tl.dot`` on ``[BM, BK] x [BK, BN]``
  tiles when M, N and K are each at least 16 in the slice: fp32 (``ieee``),
  tf32, or bf16 operands with fp32 accumulation.
* **Recurrences.** The iterative rank is a sequential loop inside the program;
  the state stays in registers across steps (each step reads its own
  predecessor at the same other indices) and each step is stored.

What cannot be lowered raises :class:`Unsupported`; the backend then runs the
group through the labelled fallback path and reports why.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import sympy

from mambalaya.exec.codegen import _gemm_plan, inlinable, plan_group
from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import Access, BinOp, Call, Const, Node, ParamRef, Reduce, multiplicative_factors, walk
from mambalaya.ir.mapping import Mapping

#: Output elements per program the block heuristic aims at for untiled grid ranks.
GRID_TARGET = 4096
#: Largest block given to one untiled grid rank (keeps tl.dot tiles square-ish).
GRID_CAP = 64
#: Elements of a 1D phase block and of a 2D reduction tile.
BLOCK_1D = 1024
BLOCK_2D = 4096
#: Smallest M, N, K extent for the tl.dot path (tl.dot needs tiles of at least 16).
DOT_MIN = 16
INT32_LIMIT = 2**31 - 1

PRELUDE = '''\
import triton
import triton.language as tl


@triton.jit
def _fdiv(n, d):
    # floor division that is right whether the target truncates (GPU) or floors (numpy)
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

_UNARY = {
    "exp": "tl.exp({0})",
    "log": "tl.log({0})",
    "softplus": "_softplus({0})",
    "silu": "({0} * _sigmoid({0}))",
    "sigmoid": "_sigmoid({0})",
    "rsqrt": "(1.0 / tl.sqrt_rn({0}))",
    "sqrt": "tl.sqrt_rn({0})",
    "neg": "(-{0})",
    "abs": "tl.abs({0})",
    "relu": "tl.maximum({0}, 0.0)",
}

PRECISIONS = ("fp32", "tf32", "bf16")


class Unsupported(Exception):
    """A construct this backend cannot lower to Triton (the group falls back, with this reason)."""


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _floor_pow2(n: int) -> int:
    return 1 << max(0, int(n).bit_length() - 1)


def _literal(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        raise Unsupported("a NaN literal")
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(v)


@dataclass
class TritonGroupPlan:
    """How one fusion group is laid out as a Triton kernel (what the report and the launcher need)."""

    index: int
    einsums: tuple[str, ...]
    reads: tuple[str, ...]  # boundary tensors read (inputs, weights, initial states, earlier groups' tensors)
    writes: tuple[str, ...]  # tensors leaving the group (stored to full arrays)
    scratch: tuple[str, ...]  # group-local tensors materialised per program
    inline: tuple[str, ...]  # group-local point-wise tensors recomputed in registers
    aux: tuple[str, ...]  # initial states read through a recurrence tensor produced elsewhere
    grid: tuple[tuple[str, int, int], ...]  # (rank, block, number of blocks), innermost first
    dot_einsums: tuple[str, ...] = ()
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def params(self) -> tuple[str, ...]:
        return (*self.reads, *self.writes, *self.scratch, *self.aux)

    @property
    def programs(self) -> int:
        return math.prod(n for _, _, n in self.grid) if self.grid else 1


def _fold(fn: str, args: list[str]) -> str | None:
    """A call on literals evaluated here in float64 (Triton would round a literal's function to fp32)."""
    try:
        vals = [float(a) for a in args]
    except ValueError:
        return None
    import numpy as np

    from mambalaya.exec.reference import FUNCTION_IMPLS

    with np.errstate(all="ignore"):
        return _literal(float(FUNCTION_IMPLS[fn](*(np.float64(v) for v in vals))))


# ---- index expressions -------------------------------------------------------------


def _bind(expr: sympy.Expr, rv: dict[str, str], values: dict) -> sympy.Expr:
    subs = {}
    for sym in expr.free_symbols:
        name = str(sym)
        if name in rv:
            continue
        value = values[name]
        if float(value) != int(value):
            raise Unsupported(f"param {name} = {value} used in an index is not a whole number")
        subs[sym] = sympy.Integer(int(value))
    return expr.xreplace(subs) if subs else expr


def _ix(expr: sympy.Expr, rv: dict[str, str]) -> tuple[str, int]:
    """Code for a bound index expression as (numerator code, denominator), floor/mod via helpers."""
    if expr.is_Integer:
        return str(int(expr)), 1
    if expr.is_Rational:
        return str(int(expr.p)), int(expr.q)
    if expr.is_Symbol:
        return rv[str(expr)], 1
    if expr.is_Add:
        parts = [_ix(a, rv) for a in expr.args]
        den = 1
        for _, d in parts:
            den = den * d // math.gcd(den, d)
        return "(" + " + ".join(f"{n} * {den // d}" if den // d != 1 else n for n, d in parts) + ")", den
    if expr.is_Mul:
        parts = [_ix(a, rv) for a in expr.args]
        return "(" + " * ".join(n for n, _ in parts) + ")", math.prod(d for _, d in parts)
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        n, d = _ix(expr.base, rv)
        return "(" + " * ".join([n] * int(expr.exp)) + ")" if int(expr.exp) else "1", d ** int(expr.exp)
    if isinstance(expr, sympy.floor):
        n, d = _ix(expr.args[0], rv)
        return (f"_fdiv({n}, {d})" if d != 1 else n), 1
    if isinstance(expr, sympy.ceiling):
        n, d = _ix(expr.args[0], rv)
        return (f"(-_fdiv(-{n}, {d}))" if d != 1 else n), 1
    if isinstance(expr, sympy.Mod):
        n, d = _ix(expr.args[0], rv)
        m, md = _ix(expr.args[1], rv)
        if d != 1 or md != 1 or not expr.args[1].is_Integer or int(expr.args[1]) <= 0:
            raise Unsupported(f"remainder by a non-constant or fraction in index {expr}")
        return f"_fmod({n}, {m})", 1
    raise Unsupported(f"index expression {expr}")


def _is_const(expr: sympy.Expr) -> bool:
    return not any(s.is_integer for s in expr.free_symbols)


# ---- the emitter -------------------------------------------------------------------


@dataclass
class _Emitter:
    cascade: Cascade
    ptr: dict[str, str]  # tensor -> pointer parameter
    inline: frozenset[str]
    dt: str  # "tl.float32" / "tl.float64"
    precision: str
    lines: list[str] = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)
    state: tuple[str, str] | None = None  # (recurrence tensor, register variable of its previous step)
    dim: int = 1  # 1: [BLOCK] context, 2: [BLOCK, RBLOCK] (no nested reductions there)
    block: int = 1  # BLOCK of the phase being emitted
    interpret: bool = False  # generating for Triton's interpreter (CPU)

    def tmp(self, stem: str = "v") -> str:
        return f"{stem}{next(self.counter)}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    # -- reads --
    def index(self, ix: sympy.Expr, rv: dict[str, str], depth: int) -> str:
        c = self.cascade
        bound = _bind(ix, rv, c.values)
        if _is_const(bound):
            return str(int(bound))
        n, d = _ix(bound, rv)
        if d != 1:
            raise Unsupported(f"fractional index {ix}")
        if n.isidentifier():
            return n
        var = self.tmp("j")
        self.emit(depth, f"{var} = {n}")
        return var

    def offset(self, tensor: str, idx: list[str]) -> str:
        shape = self.cascade.shape(tensor)
        big = math.prod(shape) > INT32_LIMIT
        parts, stride = [], 1
        for pos in range(len(shape) - 1, -1, -1):
            j = idx[pos]
            if j.lstrip("-").isdigit():
                if int(j) * stride:
                    parts.append(str(int(j) * stride))
            else:
                jj = f"{j}.to(tl.int64)" if big else j
                parts.append(jj if stride == 1 else f"{jj} * {stride}")
            stride *= shape[pos]
        return " + ".join(reversed(parts)) or "0"

    def access(self, acc: Access, rv: dict[str, str], depth: int) -> str:
        c = self.cascade
        if self.state is not None and acc.tensor == self.state[0]:
            if self.dim != 1:
                raise Unsupported(f"recurrence {acc.tensor} read inside a summed term")
            return self.state[1]
        shape = c.shape(acc.tensor)
        if len(acc.indices) != len(shape):
            raise Unsupported(f"{acc.tensor} has {len(shape)} axes but is read with {len(acc.indices)} indices")
        idx, conds = [], []
        for pos, ix in enumerate(acc.indices):
            j = self.index(ix, rv, depth)
            idx.append(j)
            plain = bool(ix.is_Symbol) and str(ix) in rv and c.rank_sizes.get(str(ix), 0) <= shape[pos]
            if j.lstrip("-").isdigit():
                if not 0 <= int(j) < shape[pos]:
                    conds.append((pos, j))
            elif not plain:
                conds.append((pos, j))
        if acc.tensor in self.inline:
            return self.inlined(acc.tensor, idx, conds, depth)
        prod = c._by_name.get(acc.tensor)
        rec = prod.recurrence if prod is not None and prod.recurrence is not None and prod.recurrence.init else None
        out = self.tmp()
        mask = " & ".join(f"({j} >= 0) & ({j} < {shape[p]})" for p, j in conds)
        ptr = f"{self.ptr[acc.tensor]} + {self.offset(acc.tensor, idx)}"
        if mask:
            self.emit(depth, f"{out} = tl.load({ptr}, mask={mask}, other=0.0).to({self.dt})")
        else:
            self.emit(depth, f"{out} = tl.load({ptr}).to({self.dt})")
        if rec is not None and any(p == rec.position for p, _ in conds):
            pos = rec.position
            jpos = idx[pos]
            others = [f"({j} >= 0) & ({j} < {shape[p]})" for p, j in conds if p != pos]
            init_idx = [j for p, j in enumerate(idx) if p != pos]
            at_init = " & ".join([f"({jpos} == -1)", *others])
            init_ptr = f"{self.ptr[rec.init]} + {self.offset(rec.init, init_idx)}"
            self.emit(depth, f"{out} = tl.where({at_init}, tl.load({init_ptr}, mask={at_init}, other=0.0)"
                             f".to({self.dt}), {out})")
        return out

    def inlined(self, tensor: str, idx: list[str], conds: list[tuple[int, str]], depth: int) -> str:
        """A point-wise producer recomputed at the read (its indices clamped, the value masked)."""
        c = self.cascade
        e = c.einsum(tensor)
        shape = c.shape(tensor)
        inner: dict[str, str] = {}
        for pos, (r, j) in enumerate(zip(e.out_ranks, idx, strict=True)):
            if any(p == pos for p, _ in conds):
                var = self.tmp("jc")
                self.emit(depth, f"{var} = tl.minimum(tl.maximum({j}, 0), {shape[pos] - 1})")
                inner[r] = var
            else:
                inner[r] = j
        total = self.terms_value(e, inner, depth)
        if conds:
            mask = " & ".join(f"({j} >= 0) & ({j} < {shape[p]})" for p, j in conds)
            out = self.tmp()
            self.emit(depth, f"{out} = tl.where({mask}, {total}, 0.0)")
            return out
        return total

    def terms_value(self, e: Einsum, rv: dict[str, str], depth: int) -> str:
        """Value of a reduction-free right-hand side (signed terms) at the bound ranks."""
        parts = []
        for sign, term, summed in e.terms():
            if summed:
                raise Unsupported(f"inlined {e.name} sums over {', '.join(sorted(summed))}")
            v = self.node(term, rv, depth)
            parts.append(("+ " if sign > 0 else "- ") + v)
        out = self.tmp()
        self.emit(depth, f"{out} = 0.0 {' '.join(parts)}")
        return out

    # -- values --
    def node(self, node: Node, rv: dict[str, str], depth: int) -> str:
        c = self.cascade
        if isinstance(node, Access):
            return self.access(node, rv, depth)
        if isinstance(node, Const):
            return _literal(node.value)
        if isinstance(node, ParamRef):
            return _literal(c.values[node.name])
        if isinstance(node, Call):
            if node.fn == "clamp":
                x, lo, hi = (self.node(a, rv, depth) for a in node.args)
                out = x if lo == 'float("-inf")' else f"tl.maximum({x}, {lo})"
                return out if hi == 'float("inf")' else f"tl.minimum({out}, {hi})"
            args = [self.node(a, rv, depth) for a in node.args]
            folded = _fold(node.fn, args)
            if folded is not None:
                return folded
            if node.fn in ("maximum", "minimum"):
                return f"tl.{node.fn}({args[0]}, {args[1]})"
            if node.fn not in _UNARY or len(args) != 1:
                raise Unsupported(f"function '{node.fn}'")
            var = self.tmp()
            self.emit(depth, f"{var} = {args[0]}")
            code = _UNARY[node.fn].format(var)
            # sqrt_rn (correctly rounded) is fp32-only; fp64 sqrt is correctly rounded anyway
            return code.replace("tl.sqrt_rn(", "tl.sqrt(") if self.dt == "tl.float64" else code
        if isinstance(node, BinOp):
            return f"({self.node(node.lhs, rv, depth)} {node.op} {self.node(node.rhs, rv, depth)})"
        if isinstance(node, Reduce):
            return self.reduce(node, rv, depth)
        raise Unsupported(f"node {node!r}")

    def reduce(self, node: Reduce, rv: dict[str, str], depth: int) -> str:
        """An explicit reduction (or prefix sum) as a loop of 2D tiles summed along axis 1."""
        if self.dim != 1:
            raise Unsupported(f"{node.op}_{node.rank} nested inside a summed term")
        size = self.cascade.rank_sizes[node.rank]
        rb = min(_pow2(size), 64)
        acc, k0, k = self.tmp("acc"), self.tmp("k0_"), self.tmp("k")
        neutral = {"sum": "0.0", "mean": "0.0", "cumsum": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}
        if node.op not in neutral:
            raise Unsupported(f"reduction {node.op}")
        self.emit(depth, f"{acc} = tl.full([{self.block}], {neutral[node.op]}, {self.dt})")
        self.emit(depth, f"for {k0} in range(0, {size}, {rb}):")
        d = depth + 1
        self.emit(d, f"{k} = {k0} + tl.arange(0, {rb})")
        self.emit(d, f"{k}c = tl.minimum({k}, {size - 1})")
        inner = {r: f"{v}[:, None]" for r, v in rv.items()}
        inner[node.rank] = f"{k}c[None, :]"
        valid = f"({k} < {size})[None, :]"
        if node.op == "cumsum":
            valid = f"{valid} & ({k}[None, :] <= {rv[node.rank]}[:, None])"
        self.dim = 2
        try:
            v = self.node(node.arg, inner, d)
        finally:
            self.dim = 1
        if node.op in ("sum", "mean", "cumsum"):
            self.emit(d, f"{acc} += tl.sum(tl.where({valid}, {v}, 0.0), axis=1)")
        else:
            fn = "max" if node.op == "max" else "min"
            self.emit(d, f"{acc} = tl.{fn}imum({acc}, tl.{fn}(tl.where({valid}, {v}, {neutral[node.op]}), axis=1))")
        return f"({acc} / {size})" if node.op == "mean" else acc

    def mask(self, e: Einsum, rv: dict[str, str]) -> str:
        parts = []
        for cmp in e.where:
            ln, ld = _ix(_bind(cmp.lhs, rv, self.cascade.values), rv)
            rn, rd = _ix(_bind(cmp.rhs, rv, self.cascade.values), rv)
            parts.append(f"({ln} * {rd} {cmp.op} {rn} * {ld})")
        return " & ".join(parts)


# ---- one phase (one Einsum over the program's slice) -------------------------------


def _slice(c: Cascade, e: Einsum, grid: dict[str, int], skip: str | None = None) -> list[tuple[str, int]]:
    """(rank, extent) of the program's slice of ``e``'s output, innermost last."""
    return [(r, grid.get(r, c.rank_sizes[r])) for r in e.out_ranks if r != skip]


def _decompose(em: _Emitter, ranks: list[tuple[str, int]], flat: str, grid: dict[str, int], depth: int,
               lane: str, scalar: bool = False) -> dict[str, str]:
    """Rank indices of a flat position inside the slice; grid ranks offset by their base and clamped."""
    c = em.cascade
    rv: dict[str, str] = {}
    stride = 1
    for r, ext in reversed(ranks):
        local = f"({flat} // {stride}) % {ext}" if stride > 1 else f"{flat} % {ext}"
        if ext == 1:
            local = "0" if scalar else f"({flat} * 0)"
        var = f"i_{r}"
        if r in grid:
            em.emit(depth, f"{var}_raw = base_{r} + {local}")
            em.emit(depth, f"{lane} = {lane} & ({var}_raw < {c.rank_sizes[r]})")
            em.emit(depth, f"{var} = tl.minimum({var}_raw, {c.rank_sizes[r] - 1})")
        else:
            em.emit(depth, f"{var} = {local}")
        rv[r] = var
        stride *= ext
    return rv


def _store_offset(em: _Emitter, e: Einsum, rv: dict[str, str]) -> str:
    return em.offset(e.name, [rv[r] for r in e.out_ranks])


def _body_1d(em: _Emitter, e: Einsum, rv: dict[str, str], depth: int) -> str:
    """The Einsum's value at the [BLOCK] positions bound in ``rv`` (terms, reductions, masks)."""
    c = em.cascade
    mask_ranks = {r for cmp in e.where for r in cmp.ranks()}
    outer_mask = bool(e.where) and mask_ranks <= set(e.out_ranks)
    tot = em.tmp("tot")
    em.emit(depth, f"{tot} = tl.zeros([{em.block}], {em.dt})")
    for sign, term, summed in e.terms():
        op = "+=" if sign > 0 else "-="
        over = [r for r in e.ranks if r in summed]
        if not over:
            v = em.node(term, rv, depth)
            em.emit(depth, f"{tot} {op} {v}")
            continue
        sizes = [c.rank_sizes[r] for r in over]
        total = math.prod(sizes)
        rb = min(_pow2(total), 64)
        acc, g0, g = em.tmp("acc"), em.tmp("g0_"), em.tmp("g")
        em.emit(depth, f"{acc} = tl.zeros([{em.block}], {em.dt})")
        em.emit(depth, f"for {g0} in range(0, {total}, {rb}):")
        d = depth + 1
        em.emit(d, f"{g} = {g0} + tl.arange(0, {rb})")
        inner = {r: f"{v}[:, None]" for r, v in rv.items()}
        stride = 1
        for r, s in reversed(list(zip(over, sizes, strict=True))):
            var = em.tmp(f"k_{r}_")
            em.emit(d, f"{var} = (({g} // {stride}) % {s})[None, :]")
            inner[r] = var
            stride *= s
        em.dim = 2
        try:
            v = em.node(term, inner, d)
            valid = f"({g} < {total})[None, :]"
            if e.where and not outer_mask:
                valid = f"{valid} & {em.mask(e, inner)}"
        finally:
            em.dim = 1
        em.emit(d, f"{acc} += tl.sum(tl.where({valid}, {v}, 0.0), axis=1)")
        em.emit(depth, f"{tot} {op} {acc}")
    if outer_mask:
        em.emit(depth, f"{tot} = tl.where({em.mask(e, rv)}, {tot}, 0.0)")
    return tot


def _block_for(c: Cascade, e: Einsum) -> int:
    """1D block of a phase: smaller when its terms need 2D reduction tiles."""
    widest = 1
    for _, term, summed in e.terms():
        if summed:
            widest = max(widest, min(_pow2(math.prod(c.rank_sizes[r] for r in summed)), 64))
        for n in walk(term):
            if isinstance(n, Reduce):
                widest = max(widest, min(_pow2(c.rank_sizes[n.rank]), 64))
    return BLOCK_1D if widest == 1 else max(16, BLOCK_2D // widest)


def _emit_pointwise(em: _Emitter, e: Einsum, grid: dict[str, int], depth: int) -> None:
    c = em.cascade
    ranks = _slice(c, e, grid)
    total = math.prod(ext for _, ext in ranks)
    block = min(_pow2(total), _block_for(c, e))
    em.block = block
    em.emit(depth, f"for f0 in range(0, {total}, {block}):")
    d = depth + 1
    em.emit(d, f"f = f0 + tl.arange(0, {block})")
    em.emit(d, f"lane = f < {total}")
    rv = _decompose(em, ranks, "f", grid, d, "lane")
    tot = _body_1d(em, e, rv, d)
    em.emit(d, f"tl.store({em.ptr[e.name]} + {_store_offset(em, e, rv)}, {tot}, mask=lane)")


def _emit_recurrence(em: _Emitter, e: Einsum, grid: dict[str, int], depth: int) -> None:
    """Sequential loop over the iterative rank, the state in registers (one block of the other ranks at a time)."""
    c = em.cascade
    rec = e.recurrence
    assert rec is not None
    if rec.rank in grid:
        raise Unsupported(f"iterative rank {rec.rank} of {e.name} cannot be a grid rank")
    ranks = _slice(c, e, grid, skip=rec.rank)
    total = math.prod(ext for _, ext in ranks) if ranks else 1
    block = min(_pow2(total), _block_for(c, e))
    steps = c.rank_sizes[rec.rank]
    em.block = block
    em.emit(depth, f"for f0 in range(0, {total}, {block}):")
    d = depth + 1
    em.emit(d, f"f = f0 + tl.arange(0, {block})")
    em.emit(d, f"lane = f < {total}")
    rv = _decompose(em, ranks, "f", grid, d, "lane")
    state = em.tmp("state")
    if rec.init is not None:
        init_idx = [rv[r] for r in e.out_ranks if r != rec.rank]
        em.emit(d, f"{state} = tl.load({em.ptr[rec.init]} + {em.offset(rec.init, init_idx)}, mask=lane, "
                   f"other=0.0).to({em.dt})")
    else:
        em.emit(d, f"{state} = tl.zeros([{block}], {em.dt})")
    em.emit(d, f"for t_{rec.rank} in range({steps}):")
    d2 = d + 1
    em.emit(d2, f"i_{rec.rank} = t_{rec.rank} + f * 0")
    rv = {**rv, rec.rank: f"i_{rec.rank}"}
    em.state = (e.name, state)
    try:
        tot = _body_1d(em, e, rv, d2)
    finally:
        em.state = None
    em.emit(d2, f"tl.store({em.ptr[e.name]} + {_store_offset(em, e, rv)}, {tot}, mask=lane)")
    em.emit(d2, f"{state} = {tot}")


def _dot_plans(c: Cascade, e: Einsum, grid: dict[str, int], dtype: str) -> list | None:
    """Per term: a GEMM plan usable with tl.dot in this slice, or None for every term when it does not apply."""
    if dtype != "float32" or e.where or e.recurrence is not None:
        return None
    terms = e.terms()
    plans = [_gemm_plan(c, e, t, s) for _, t, s in terms]
    if not any(plans):
        return None
    ext = {r: grid.get(r, c.rank_sizes[r]) for r in e.ranks}
    first = next(p for p in plans if p is not None)
    for (_, term, summed), p in zip(terms, plans, strict=True):
        if any(isinstance(n, Reduce) for n in walk(term)):
            return None
        if p is None:
            if summed:
                return None
            continue
        if (p.m, p.n, p.batch) != (first.m, first.n, first.batch):
            return None
        if min(math.prod(ext[r] for r in g) for g in (p.m, p.n, p.k)) < DOT_MIN:
            return None
    return plans


def _emit_dot(em: _Emitter, e: Einsum, grid: dict[str, int], plans: list, depth: int) -> None:
    """Tiles of the output over (M, N) per batch point; each contraction term accumulated by tl.dot."""
    c = em.cascade
    first = next(p for p in plans if p is not None)
    ext = {r: grid.get(r, c.rank_sizes[r]) for r in e.ranks}
    nb = math.prod(ext[r] for r in first.batch)
    ms, ns = (math.prod(ext[r] for r in g) for g in (first.m, first.n))
    bm, bn = min(_pow2(ms), 64), min(_pow2(ns), 64)
    em.emit(depth, f"for bi in range({nb}):")
    d = depth + 1
    em.emit(d, "lane_b = bi < " + str(nb))
    rv_b = _decompose(em, [(r, ext[r]) for r in first.batch], "bi", grid, d, "lane_b", scalar=True)
    em.emit(d, f"for m0 in range(0, {ms}, {bm}):")
    em.emit(d + 1, f"for n0 in range(0, {ns}, {bn}):")
    d += 2
    em.emit(d, f"mi = m0 + tl.arange(0, {bm})")
    em.emit(d, f"ni = n0 + tl.arange(0, {bn})")
    em.emit(d, f"lane_m = mi < {ms}")
    em.emit(d, f"lane_n = ni < {ns}")
    rv_m = _decompose(em, [(r, ext[r]) for r in first.m], "mi", grid, d, "lane_m")
    rv_n = _decompose(em, [(r, ext[r]) for r in first.n], "ni", grid, d, "lane_n")
    out_rv = {**rv_b, **{r: f"{v}[:, None]" for r, v in rv_m.items()}, **{r: f"{v}[None, :]" for r, v in rv_n.items()}}
    em.emit(d, f"acc = tl.zeros([{bm}, {bn}], tl.float32)")
    for (sign, term, _), p in zip(e.terms(), plans, strict=True):
        if p is None:
            em.dim = 2
            try:
                v = em.node(term, out_rv, d)
            finally:
                em.dim = 1
            em.emit(d, f"acc {'+=' if sign > 0 else '-='} {v}")
            continue
        ks = math.prod(ext[r] for r in p.k)
        bk = min(_pow2(ks), 32)
        k0, kk = em.tmp("k0_"), em.tmp("kk")
        em.emit(d, f"for {k0} in range(0, {ks}, {bk}):")
        d2 = d + 1
        em.emit(d2, f"{kk} = {k0} + tl.arange(0, {bk})")
        em.emit(d2, f"lane_k = {kk} < {ks}")
        rv_k = _decompose(em, [(r, ext[r]) for r in p.k], kk, {}, d2, "lane_k")
        em.dim = 2
        try:
            a_rv = {**rv_b, **{r: f"{v}[:, None]" for r, v in rv_m.items()}, **{r: f"{v}[None, :]" for r, v in rv_k.items()}}
            b_rv = {**rv_b, **{r: f"{v}[:, None]" for r, v in rv_k.items()}, **{r: f"{v}[None, :]" for r, v in rv_n.items()}}
            av = [em.node(f, a_rv, d2) for f in p.a]
            bv = [em.node(f, b_rv, d2) for f in p.b]
        finally:
            em.dim = 1
        a, b = em.tmp("a"), em.tmp("b")
        em.emit(d2, f"{a} = tl.where(lane_k[None, :], {' * '.join(av)}, 0.0) + tl.zeros([{bm}, {bk}], tl.float32)")
        em.emit(d2, f"{b} = tl.where(lane_k[:, None], {' * '.join(bv)}, 0.0) + tl.zeros([{bk}, {bn}], tl.float32)")
        if em.precision == "bf16" and em.interpret:
            # the interpreter's native bf16 dot is wrong; bf16 operands with fp32 products and sums are exact
            # in fp32, so rounding the operands and running an ieee dot computes the same thing
            dot = (f'tl.dot({a}.to(tl.bfloat16).to(tl.float32), {b}.to(tl.bfloat16).to(tl.float32), '
                   f'input_precision="ieee")')
        elif em.precision == "bf16":
            dot = f"tl.dot({a}.to(tl.bfloat16), {b}.to(tl.bfloat16), out_dtype=tl.float32)"
        else:
            prec = "ieee" if em.precision == "fp32" else "tf32"
            dot = f'tl.dot({a}, {b}, input_precision="{prec}")'
        em.emit(d2, f"acc {'+=' if sign > 0 else '-='} {dot}")
    lane = "lane_b & lane_m[:, None] & lane_n[None, :]"
    em.emit(d, f"tl.store({em.ptr[e.name]} + {_store_offset(em, e, out_rv)}, acc, mask={lane})")


# ---- one group ---------------------------------------------------------------------


def _grid_ranks(c: Cascade, names: tuple[str, ...], inline: frozenset[str]) -> list[str]:
    """Ranks along which programs of this group are independent (see the module docstring)."""
    phases = [c.einsum(n) for n in names if n not in inline]
    if not phases:
        return []
    produced = set(names)
    cand = [r for r in phases[0].out_ranks if all(r in e.out_ranks for e in phases)]
    bad: set[str] = set()
    for e in phases:
        if e.recurrence is not None:
            bad.add(e.recurrence.rank)
        for n in walk(e.expr):
            if isinstance(n, Reduce):
                bad.add(n.rank)
    # every intra-group read must index a grid rank plainly, at the position where its producer writes it
    readers = [c.einsum(n) for n in names]
    for e in readers:
        for n in walk(e.expr):
            if not isinstance(n, Access) or n.tensor not in produced or n.tensor == e.name:
                continue
            prod_ranks = c.einsum(n.tensor).out_ranks
            if n.tensor in inline:
                # an inlined producer is evaluated at the reader's indices: it constrains nothing itself,
                # but its own reads happen at the reader's positions, so check them through the binding
                continue
            for r in cand:
                if r not in prod_ranks:
                    bad.add(r)
                    continue
                pos = prod_ranks.index(r)
                if not (n.indices[pos].is_Symbol and str(n.indices[pos]) == r):
                    bad.add(r)
    # reads through inlined producers: the producer's read of a materialised group tensor must be plain too
    for name in inline:
        e = c.einsum(name)
        for n in walk(e.expr):
            if isinstance(n, Access) and n.tensor in produced and n.tensor not in inline:
                prod_ranks = c.einsum(n.tensor).out_ranks
                for r in cand:
                    pos = prod_ranks.index(r) if r in prod_ranks else None
                    ok = pos is not None and n.indices[pos].is_Symbol and str(n.indices[pos]) == r
                    # the inlined producer's rank r must be bound to the reader's r: require same names
                    if not ok or r not in e.out_ranks:
                        bad.add(r)
    # and the inlined producers must themselves be read with the grid rank plain (checked above for phases)
    for e in readers:
        for n in walk(e.expr):
            if isinstance(n, Access) and n.tensor in inline:
                pr = c.einsum(n.tensor).out_ranks
                for r in cand:
                    if r in pr:
                        pos = pr.index(r)
                        if not (n.indices[pos].is_Symbol and str(n.indices[pos]) == r):
                            bad.add(r)
    return [r for r in cand if r not in bad]


def _blocks(c: Cascade, names: tuple[str, ...], inline: frozenset[str], grid: list[str],
            tiles: dict[str, int]) -> dict[str, int]:
    phases = [c.einsum(n) for n in names if n not in inline]
    # elements a program holds at once per phase: a recurrence's iterative rank is stepped, not held
    rest = max((math.prod(c.rank_sizes[r] for r in e.out_ranks
                          if r not in grid and not (e.recurrence and r == e.recurrence.rank)) for e in phases),
               default=1)
    budget = max(1, GRID_TARGET // rest)
    out: dict[str, int] = {}
    # contractions want their M and N ranks blocked (tl.dot tiles), batch ranks one at a time
    first: list[str] = []
    for e in phases:
        for _, t, summed in e.terms():
            p = _gemm_plan(c, e, t, summed)
            if p is not None:
                first += [r for r in (*reversed(p.n), *reversed(p.m)) if r in grid and r not in first]
    for r in [*first, *(r for r in reversed(grid) if r not in first)]:
        size = c.rank_sizes[r]
        if r in tiles and tiles[r] < size:
            out[r] = tiles[r]
            continue
        b = min(size, GRID_CAP, _floor_pow2(budget))
        out[r] = b
        budget = max(1, budget // b)
    return out


def group_plan(cascade: Cascade, mapping: Mapping, gi: int) -> TritonGroupPlan:
    base = plan_group(cascade, [tuple(g.einsums) for g in mapping.groups], gi)
    inline = frozenset(t for t in base.local if inlinable(cascade.einsum(t)))
    scratch = tuple(t for t in base.local if t not in inline)
    names = base.einsums
    grid = _grid_ranks(cascade, names, inline)
    blocks = _blocks(cascade, names, inline, grid, mapping.groups[gi].tiles)
    order = [r for r in reversed(grid)]
    spec = tuple((r, blocks[r], -(-cascade.rank_sizes[r] // blocks[r])) for r in order)
    return TritonGroupPlan(gi, names, base.reads, base.writes, scratch, tuple(sorted(inline)), base.aux, spec)


def group_source(cascade: Cascade, mapping: Mapping, plan: TritonGroupPlan, dtype: str,
                 precision: str, interpret: bool = False) -> str:
    """Module text with one ``kernel`` for the group; raises Unsupported when it cannot be lowered."""
    if precision not in PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {PRECISIONS}, got {precision!r}")
    if mapping.groups[plan.index].recompute:
        raise Unsupported(f"recompute of {', '.join(mapping.groups[plan.index].recompute)}")
    c = cascade
    ptr = {t: f"p_{t}" for t in plan.params}
    em = _Emitter(c, ptr, frozenset(plan.inline), "tl.float64" if dtype == "float64" else "tl.float32", precision,
                  interpret=interpret)
    grid = {r: b for r, b, _ in plan.grid}
    em.emit(0, f"# group {plan.index}: {', '.join(plan.einsums)}")
    em.emit(0, f"# grid: {', '.join(f'{r}/{b}' for r, b, _ in plan.grid) or 'one program'}; "
               f"inlined: {', '.join(plan.inline) or '-'}; scratch: {', '.join(plan.scratch) or '-'}")
    em.emit(0, "@triton.jit")
    em.emit(0, f"def kernel({', '.join(ptr[t] for t in plan.params)}):")
    em.emit(1, "pid = tl.program_id(0)")
    for r, b, n in plan.grid:
        em.emit(1, f"base_{r} = (pid % {n}) * {b}")
        em.emit(1, f"pid = pid // {n}")
    dots = []
    phases = [n for n in plan.einsums if n not in plan.inline]
    for k, name in enumerate(phases):
        e = c.einsum(name)
        em.emit(1, f"# {e.text}")
        plans = _dot_plans(c, e, grid, dtype)
        if e.recurrence is not None:
            _emit_recurrence(em, e, grid, 1)
        elif plans is not None:
            _emit_dot(em, e, grid, plans, 1)
            dots.append(name)
        else:
            _emit_pointwise(em, e, grid, 1)
        if k + 1 < len(phases):
            em.emit(1, "tl.debug_barrier()")
    plan.dot_einsums = tuple(dots)
    return PRELUDE + "\n" + "\n".join(em.lines) + "\n"


__all__ = ["PRECISIONS", "TritonGroupPlan", "Unsupported", "group_plan", "group_source", "multiplicative_factors"]
