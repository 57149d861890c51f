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

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import sympy

from mambalaya.exec.codegen import IndexDialect, _bind, _gemm_plan, _index_code, plan_group
from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import Access, BinOp, Call, Const, Node, ParamRef, Reduce, multiplicative_factors, walk
from mambalaya.ir.indexing import index_within
from mambalaya.ir.mapping import Mapping

#: Output elements per program the block heuristic aims at for untiled grid ranks.
GRID_TARGET = 4096
#: Largest block given to one untiled grid rank (keeps tl.dot tiles square-ish).
GRID_CAP = 64
#: Elements of a 1D phase block and of a 2D reduction tile.
BLOCK_1D = 1024
BLOCK_2D = 4096
#: Chunked scans: steps of a linear recurrence scanned at once, and state elements x steps per program.
SCAN_STEPS = 16
SCAN_ELEMS = 2048
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


@triton.jit
def _lin_combine(a1, b1, a2, b2):
    # (h -> a1*h + b1) then (h -> a2*h + b2): the associative step of a linear recurrence
    return a1 * a2, b1 * a2 + b2

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
    #: tl.dot tile choice: block cap of M/N grid ranks, K step, and launch options (num_warps, num_stages)
    dot_cap: int = 64
    dot_bk: int = 32
    #: compute each contraction transposed (operands swapped: the N-side factors become tl.dot's A): a
    #: product contracted over its operands' strided axis feeds Hopper's tf32 wgmma better one way round
    dot_swap: bool = False
    launch: dict = field(default_factory=dict)
    scan: tuple[str, ...] = ()  # (recurrence, reduction consumer, epilogue phases...) fused as a chunked scan
    #: chunked scan: steps scanned at once, and steps x state elements held per program
    scan_steps: int = SCAN_STEPS
    scan_elems: int = SCAN_ELEMS

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


def _product_power(n: str, e: int) -> str:
    return f"({' * '.join([n] * e)})" if e else "1"


#: Triton's integer division truncates: floors and remainders go through the prelude's helpers.
TRITON_INDEX = IndexDialect(floordiv="_fdiv({n}, {d})", ceildiv="(-_fdiv(-{n}, {d}))", mod="_fmod({n}, {m})",
                            power=_product_power, error=Unsupported, constant_modulus=True)


def _ix(expr: sympy.Expr, rv: dict[str, str]) -> tuple[str, int]:
    """Code for a bound index expression as (numerator code, denominator), floor/mod via helpers."""
    return _index_code(expr, rv, {}, TRITON_INDEX)


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
    regs: dict[str, str] = field(default_factory=dict)  # tensor -> register value at the current indices
    dot_cap: int = 64
    dot_bk: int = 32
    dot_swap: bool = False
    scan_steps: int = SCAN_STEPS
    scan_elems: int = SCAN_ELEMS
    #: values already emitted: (tensor, indices, rank bindings, context) -> (variable, depth it lives at)
    memo: dict[tuple, tuple[str, int]] = field(default_factory=dict)

    def tmp(self, stem: str = "v") -> str:
        return f"{stem}{next(self.counter)}"

    def emit(self, depth: int, line: str) -> None:
        # a line at a shallower depth closes the blocks a remembered value lived in; a store or a
        # barrier may change what a remembered load read
        if line.startswith(("tl.store", "tl.debug_barrier")):
            self.memo.clear()
        elif self.memo:
            self.memo = {k: v for k, v in self.memo.items() if v[1] <= depth}
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
        """A tensor's value at ``rv``: a load, or an inlined producer's value, emitted once per scope
        (RMSNorm's ``YG * YG`` and a scan's twice-read ``softplus(DT0)`` load and compute once)."""
        if acc.tensor in self.regs:  # computed in registers at these very indices (checked by _scan_fusion)
            return self.regs[acc.tensor]
        if self.state is not None and acc.tensor == self.state[0]:
            if self.dim == 2:
                raise Unsupported(f"recurrence {acc.tensor} read inside a summed term")
            return self.state[1]
        key = (acc.tensor, tuple(map(str, acc.indices)), tuple(sorted(rv.items())), self.dim, self.state,
               tuple(sorted(self.regs.items())))
        hit = self.memo.get(key)
        if hit is not None and hit[1] <= depth:
            return hit[0]
        var = self._access(acc, rv, depth)
        self.memo[key] = (var, depth)
        return var

    def _access(self, acc: Access, rv: dict[str, str], depth: int) -> str:
        c = self.cascade
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
            elif not plain and not index_within(_bind(ix, rv, c.values), c.rank_sizes, shape[pos]):
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
        if e.where:  # a masked point-wise producer (e.g. SSD's causal decay mask): zero outside its mask
            masked = self.tmp()
            self.emit(depth, f"{masked} = tl.where({self.mask(e, inner)}, {total}, 0.0)")
            total = masked
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
        # the [block, rb] tile takes up to BLOCK_2D elements: a program with few rows (RMSNorm's mean over a
        # 2048-wide row, two rows per program) loads whole rows at once instead of 64 columns at a time
        rb = min(_pow2(size), max(64, BLOCK_2D // max(1, self.block)))
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
               lane: str, scalar: bool = False, exact: bool = False) -> dict[str, str]:
    """Rank indices of a flat position inside the slice; grid ranks offset by their base and clamped.

    ``exact``: the flat position never reaches the slice's size, so the outermost rank needs no
    remainder; a grid rank whose block divides its size needs no clamp. Both keep the compiler's
    contiguity facts (vectorised loads and stores) intact."""
    c = em.cascade
    rv: dict[str, str] = {}
    stride = 1
    for k, (r, ext) in enumerate(reversed(ranks)):
        outer = k == len(ranks) - 1
        if exact and outer:
            local = f"({flat} // {stride})" if stride > 1 else flat
        else:
            local = f"({flat} // {stride}) % {ext}" if stride > 1 else f"{flat} % {ext}"
        if ext == 1:
            local = "0" if scalar else f"({flat} * 0)"
        var = f"i_{r}"
        if r in grid and c.rank_sizes[r] % grid[r] == 0 and ext == grid[r]:
            em.emit(depth, f"{var} = base_{r} + {local}")
        elif r in grid:
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


def _prefix_sum(e: Einsum) -> Reduce | None:
    """The cumsum when the Einsum is one (unmasked) prefix sum along one of its output ranks."""
    terms = e.terms()
    if len(terms) != 1 or e.where:
        return None
    sign, term, summed = terms[0]
    if sign > 0 and not summed and isinstance(term, Reduce) and term.op == "cumsum" and term.rank in e.out_ranks:
        return term
    return None


def _emit_prefix(em: _Emitter, e: Einsum, node: Reduce, grid: dict[str, int], depth: int) -> None:
    """A prefix sum as ``tl.cumsum`` over [rows, whole rank] tiles: linear work, where the generic
    reduction would sum a masked [q, q] tile per output (quadratic in the rank's size)."""
    c = em.cascade
    size = c.rank_sizes[node.rank]
    rb = _pow2(size)
    rows = [(r, x) for r, x in _slice(c, e, grid) if r != node.rank]
    nrow = math.prod(x for _, x in rows) if rows else 1
    br = max(1, min(_pow2(nrow), BLOCK_2D // rb))
    em.emit(depth, f"for r0 in range(0, {nrow}, {br}):")
    d = depth + 1
    em.emit(d, f"fr = r0 + tl.arange(0, {br})")
    em.emit(d, f"lane_r = fr < {nrow}")
    rv_r = _decompose(em, rows, "fr", grid, d, "lane_r", exact=nrow % br == 0)
    em.emit(d, f"kq = tl.arange(0, {rb})")
    em.emit(d, f"kqc = tl.minimum(kq, {size - 1})")
    lane = f"(lane_r[:, None] & (kq < {size})[None, :])"
    rv2 = {**{r: f"{v}[:, None]" for r, v in rv_r.items()}, node.rank: "kqc[None, :]"}
    em.dim = 2
    try:
        v = em.node(node.arg, rv2, d)
    finally:
        em.dim = 1
    cum = em.tmp("cum")
    em.emit(d, f"{cum} = tl.cumsum(tl.where({lane}, {v}, 0.0), axis=1)")
    em.emit(d, f"tl.store({em.ptr[e.name]} + {_store_offset(em, e, rv2)}, {cum}, mask={lane})")


def _emit_pointwise(em: _Emitter, e: Einsum, grid: dict[str, int], depth: int) -> None:
    c = em.cascade
    prefix = _prefix_sum(e)
    if prefix is not None:
        _emit_prefix(em, e, prefix, grid, depth)
        return
    ranks = _slice(c, e, grid)
    total = math.prod(ext for _, ext in ranks)
    block = min(_pow2(total), _block_for(c, e))
    em.block = block
    em.emit(depth, f"for f0 in range(0, {total}, {block}):")
    d = depth + 1
    em.emit(d, f"f = f0 + tl.arange(0, {block})")
    em.emit(d, f"lane = f < {total}")
    rv = _decompose(em, ranks, "f", grid, d, "lane", exact=total % block == 0)
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


def _emit_scan(em: _Emitter, plan: TritonGroupPlan, grid: dict[str, int], finals: list[str], depth: int) -> None:
    """A linear recurrence E, its reduction F and F's point-wise epilogue, SCAN_STEPS steps at a time.

    Per block of F's non-iterative ranks (rows) x E's reduced ranks (cols) the state lives in registers;
    each chunk loads the steps' coefficients ``a`` and ``b`` as [T, rows, cols] tiles, scans them with
    tl.associative_scan (``_lin_combine``), applies the carried state, reduces F over axis 2 and evaluates
    the epilogue on [T, rows]; only tensors leaving the group (or read by later phases) are stored.
    Final-state readers (E at the last step) are evaluated from the carried state after the last chunk.
    """
    c = em.cascade
    en, fn, *epi = plan.scan
    e, f = c.einsum(en), c.einsum(fn)
    rec = e.recurrence
    a_terms, b_terms = _linear_split(c, e)
    it = rec.rank
    steps = c.rank_sizes[it]
    rows = _slice(c, f, grid, skip=it)
    cols = [(r, c.rank_sizes[r]) for r in e.out_ranks if r not in f.out_ranks]
    nrow = math.prod(x for _, x in rows) if rows else 1
    ncol = math.prod(x for _, x in cols) if cols else 1
    bc = _pow2(ncol)
    t = min(em.scan_steps, _pow2(steps))
    br = min(_pow2(nrow), max(1, _floor_pow2(max(1, em.scan_elems // (t * bc)))))
    # tensors kept in registers only: local, and read by nothing outside the fused phases
    fused = {fn, *epi}
    readers = {n for n in plan.einsums if n not in fused and n not in plan.inline}
    keep = set()
    for x in fused:
        if x in plan.writes or any(x in _reads_through(c, c.einsum(r), frozenset(plan.inline)) for r in readers):
            keep.add(x)
    em.emit(depth, f"for r0 in range(0, {nrow}, {br}):")
    d = depth + 1
    em.emit(d, f"fr = r0 + tl.arange(0, {br})")
    em.emit(d, "lane_r = fr < " + str(nrow))
    rv_r = _decompose(em, rows, "fr", grid, d, "lane_r", exact=nrow % br == 0)
    em.emit(d, f"fc = tl.arange(0, {bc})")
    em.emit(d, f"lane_c = fc < {ncol}")
    rv_c = _decompose(em, cols, "fc", {}, d, "lane_c")
    rv2 = {**{r: f"{v}[:, None]" for r, v in rv_r.items()}, **{r: f"{v}[None, :]" for r, v in rv_c.items()}}
    lane2 = "(lane_r[:, None] & lane_c[None, :])"
    state = em.tmp("state")
    if rec.init is not None:
        idx = [rv2[r] for r in e.out_ranks if r != it]
        em.emit(d, f"{state} = tl.load({em.ptr[rec.init]} + {em.offset(rec.init, idx)}, mask={lane2}, "
                   f"other=0.0).to({em.dt})")
    else:
        em.emit(d, f"{state} = tl.zeros([{br}, {bc}], {em.dt})")
    em.emit(d, f"for t0 in range(0, {steps}, {t}):")
    d2 = d + 1
    em.emit(d2, f"tr = t0 + tl.arange(0, {t})")
    em.emit(d2, f"lane_t = tr < {steps}")
    em.emit(d2, f"tc = tl.minimum(tr, {steps - 1})")
    rv3 = {**{r: f"{v}[None, :, None]" for r, v in rv_r.items()}, **{r: f"{v}[None, None, :]" for r, v in rv_c.items()},
           it: "tc[:, None, None]"}
    lane3 = "(lane_t[:, None, None] & lane_r[None, :, None] & lane_c[None, None, :])"
    zero3 = f"tl.zeros([{t}, {br}, {bc}], {em.dt})"
    em.dim = 3
    try:
        av, bv = em.tmp("ca"), em.tmp("cb")
        em.emit(d2, f"{av} = {zero3}")
        for sign, facs in a_terms:
            vals = [em.node(x, rv3, d2) for x in facs] or ["1.0"]
            em.emit(d2, f"{av} {'+=' if sign > 0 else '-='} {' * '.join(vals)}")
        em.emit(d2, f"{bv} = {zero3}")
        for sign, term in b_terms:
            em.emit(d2, f"{bv} {'+=' if sign > 0 else '-='} {em.node(term, rv3, d2)}")
        em.emit(d2, f"{av} = tl.where({lane3}, {av}, 1.0)")
        em.emit(d2, f"{bv} = tl.where({lane3}, {bv}, 0.0)")
        em.emit(d2, f"{av}, {bv} = tl.associative_scan(({av}, {bv}), 0, _lin_combine)")
        hv = em.tmp("h")
        em.emit(d2, f"{hv} = {av} * {state}[None, :, :] + {bv}")
        em.emit(d2, f"{state} = tl.sum(tl.where((tl.arange(0, {t}) == {t - 1})[:, None, None], {hv}, 0.0), axis=0)")
        if en in plan.writes:
            em.emit(d2, f"tl.store({em.ptr[en]} + {_store_offset(em, e, rv3)}, {hv}, mask={lane3})")
        # F: the reduction over the state's extra ranks
        em.regs[en] = hv
        fv = em.tmp("fv")
        em.emit(d2, f"{fv} = tl.zeros([{t}, {br}], {em.dt})")
        for sign, term, _ in f.terms():
            arg = term.arg if isinstance(term, Reduce) else term
            v = em.node(arg, rv3, d2)
            em.emit(d2, f"{fv} {'+=' if sign > 0 else '-='} tl.sum(tl.where({lane3}, {v}, 0.0), axis=2)")
        del em.regs[en]
    finally:
        em.dim = 1
    rvf = {**{r: f"{v}[None, :]" for r, v in rv_r.items()}, it: "tc[:, None]"}
    lanef = "(lane_t[:, None] & lane_r[None, :])"
    em.regs[fn] = fv
    if fn in keep:
        em.emit(d2, f"tl.store({em.ptr[fn]} + {_store_offset(em, f, rvf)}, {fv}, mask={lanef})")
    em.dim = 3
    try:
        for name in epi:
            g = c.einsum(name)
            gv = em.tmp("gv")
            em.emit(d2, f"{gv} = tl.zeros([{t}, {br}], {em.dt})")
            for sign, term, _ in g.terms():
                em.emit(d2, f"{gv} {'+=' if sign > 0 else '-='} {em.node(term, rvf, d2)}")
            em.regs[name] = gv
            if name in keep:
                em.emit(d2, f"tl.store({em.ptr[name]} + {_store_offset(em, g, rvf)}, {gv}, mask={lanef})")
    finally:
        em.dim = 1
        for name in (fn, *epi):
            em.regs.pop(name, None)
    # final-state readers, from the carried state
    em.state = (en, state)
    em.dim = 3
    try:
        for name in finals:
            g = c.einsum(name)
            gv = em.tmp("gv")
            rvg = {r: rv2[r] for r in g.out_ranks}
            em.emit(d, f"{gv} = tl.zeros([{br}, {bc}], {em.dt})")
            for sign, term, _ in g.terms():
                em.emit(d, f"{gv} {'+=' if sign > 0 else '-='} {em.node(term, rvg, d)}")
            em.emit(d, f"tl.store({em.ptr[name]} + {_store_offset(em, g, rvg)}, {gv}, mask={lane2})")
    finally:
        em.state = None
        em.dim = 1


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


def _mn_major(c: Cascade, factors: tuple[Node, ...], k: tuple[str, ...], inline: frozenset[str]) -> bool:
    """True when a tl.dot operand is one loaded tensor whose contiguous (innermost non-unit) axis is
    not indexed by a K rank: the tile lies M- or N-major in memory."""
    if len(factors) != 1 or not isinstance(factors[0], Access) or factors[0].tensor in inline:
        return False
    acc = factors[0]
    for size, ix in reversed(list(zip(c.shape(acc.tensor), acc.indices, strict=True))):
        if size > 1:
            return not {str(s) for s in ix.free_symbols} & set(k)
    return False


def _causal_k_rank(c: Cascade, p: Any, inline: frozenset[str]) -> str | None:
    """The M or N rank ``q`` when an inlined factor is masked ``k <= q`` (or ``k < q``) on the only K rank.

    The SSD's intra-chunk product reads the decay mask ``LM[.., q, s, ..] where s <= q``: for a tile of
    queries no key past its last query contributes, so the K loop can stop there (about half the work)."""
    if len(p.k) != 1:
        return None
    k = p.k[0]
    for f in (*p.a, *p.b):
        if not isinstance(f, Access) or f.tensor not in inline:
            continue
        prod = c.einsum(f.tensor)
        bind = {r: ix for r, ix in zip(prod.out_ranks, f.indices, strict=True)}
        for cmp in prod.where:
            if cmp.op not in ("<=", "<") or not (cmp.lhs.is_Symbol and cmp.rhs.is_Symbol):
                continue
            lhs, rhs = bind.get(str(cmp.lhs)), bind.get(str(cmp.rhs))
            if lhs is not None and rhs is not None and lhs.is_Symbol and rhs.is_Symbol \
                    and str(lhs) == k and str(rhs) in (*p.m, *p.n):
                return str(rhs)
    return None


def _emit_dot(em: _Emitter, e: Einsum, grid: dict[str, int], plans: list, depth: int) -> None:
    """Tiles of the output over (M, N) per batch point; each contraction term accumulated by tl.dot."""
    c = em.cascade
    if em.dot_swap:  # out^T = B^T A^T: the same tiles, the operands' roles exchanged
        plans = [p and dataclasses.replace(p, a=p.b, b=p.a, m=p.n, n=p.m) for p in plans]
    first = next(p for p in plans if p is not None)
    ext = {r: grid.get(r, c.rank_sizes[r]) for r in e.ranks}
    nb = math.prod(ext[r] for r in first.batch)
    ms, ns = (math.prod(ext[r] for r in g) for g in (first.m, first.n))
    bm, bn = min(_pow2(ms), em.dot_cap), min(_pow2(ns), em.dot_cap)
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
    rv_m = _decompose(em, [(r, ext[r]) for r in first.m], "mi", grid, d, "lane_m", exact=ms % bm == 0)
    rv_n = _decompose(em, [(r, ext[r]) for r in first.n], "ni", grid, d, "lane_n", exact=ns % bn == 0)
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
        bk = min(_pow2(ks), em.dot_bk)
        k0, kk = em.tmp("k0_"), em.tmp("kk")
        upper = _causal_k_rank(c, p, em.inline)
        # the summand is zero past the tile's last M index: stop the K loop there (the interpreter's
        # range takes no tensor bound; it runs the whole loop, masked, to the same result)
        if upper is not None and not em.interpret:
            last = rv_m.get(upper) or rv_n[upper]
            em.emit(d, f"for {k0} in range(0, tl.minimum({ks}, tl.max({last}, axis=0) + 1), {bk}):")
        else:
            em.emit(d, f"for {k0} in range(0, {ks}, {bk}):")
        d2 = d + 1
        em.emit(d2, f"{kk} = {k0} + tl.arange(0, {bk})")
        em.emit(d2, f"lane_k = {kk} < {ks}")
        rv_k = _decompose(em, [(r, ext[r]) for r in p.k], kk, {}, d2, "lane_k", exact=ks % bk == 0)
        em.dim = 2
        try:
            a_rv = {**rv_b, **{r: f"{v}[:, None]" for r, v in rv_m.items()}, **{r: f"{v}[None, :]" for r, v in rv_k.items()}}
            b_rv = {**rv_b, **{r: f"{v}[:, None]" for r, v in rv_k.items()}, **{r: f"{v}[None, :]" for r, v in rv_n.items()}}
            av = [em.node(f, a_rv, d2) for f in p.a]
            bv = [em.node(f, b_rv, d2) for f in p.b]
        finally:
            em.dim = 1
        a, b = em.tmp("a"), em.tmp("b")
        # broadcast_to is free when the operand already has the tile's shape: a loaded tile then feeds
        # tl.dot directly, which lets Triton pipeline the loads into shared memory (async copies / TMA).
        # A loaded 32-bit operand whose K axis is not its contiguous one is staged through registers
        # (the K mask is the register op): Hopper's tf32 wgmma reads shared memory only K-major, and a
        # tile copied there as it lies in memory is re-laid per step (the SSD's products: 1.3-2x faster).
        stage = em.precision != "bf16"
        mask_a = ks % bk or (stage and _mn_major(c, p.a, p.k, em.inline))
        mask_b = ks % bk or (stage and _mn_major(c, p.b, p.k, em.inline))
        va, vb = " * ".join(av), " * ".join(bv)
        if mask_a:
            va = f"tl.where(lane_k[None, :], {va}, 0.0)"
        if mask_b:
            vb = f"tl.where(lane_k[:, None], {vb}, 0.0)"
        em.emit(d2, f"{a} = tl.broadcast_to({va}, [{bm}, {bk}])")
        em.emit(d2, f"{b} = tl.broadcast_to({vb}, [{bk}, {bn}])")
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
            tiles: dict[str, int], cap: int = GRID_CAP, scan: tuple[str, ...] = (),
            elems: int = GRID_TARGET) -> dict[str, int]:
    """Program block per grid rank: about ``elems`` outputs per program (the launcher tunes ``elems``)."""
    phases = [c.einsum(n) for n in names if n not in inline]
    # elements a program holds at once per phase: a recurrence's iterative rank is stepped, not held; in a
    # group with a recurrence the recurrence sets the block (the other phases loop over their slices)
    recs = [e for e in phases if e.recurrence is not None]
    rest = max((math.prod(c.rank_sizes[r] for r in e.out_ranks
                          if r not in grid and not (e.recurrence and r == e.recurrence.rank)) for e in recs or phases),
               default=1)
    budget = max(1, elems // rest)
    out: dict[str, int] = {}
    # contractions want their M and N ranks blocked (tl.dot tiles), batch ranks one at a time
    first: list[str] = []
    for e in phases:
        for _, t, summed in e.terms():
            p = _gemm_plan(c, e, t, summed)
            if p is not None:
                first += [r for r in (*reversed(p.n), *reversed(p.m)) if r in grid and r not in first]
    if first and not scan:  # tl.dot tiles: up to cap x cap outputs per program, batch ranks one at a time
        budget = max(budget, cap * cap // rest)
    for r in [*first, *(r for r in reversed(grid) if r not in first)]:
        size = c.rank_sizes[r]
        if r in tiles and tiles[r] < size:
            out[r] = tiles[r]
            continue
        if first and not scan and r not in first:
            budget = 1
        b = min(size, cap, _floor_pow2(budget))
        out[r] = b
        budget = max(1, budget // b)
    return out


def _inlinable(e: Einsum) -> bool:
    """Point-wise (a mask allowed: the value is zero outside it): recomputed in registers at each read."""
    if e.recurrence is not None or e.reduced_ranks or any(isinstance(n, Reduce) for n in walk(e.expr)):
        return False
    return len(set(e.out_ranks)) == len(e.out_ranks)


def _plain(acc: Access, ranks: tuple[str, ...] | list[str]) -> bool:
    return len(acc.indices) == len(ranks) and all(ix.is_Symbol and str(ix) == r for ix, r in zip(acc.indices, ranks, strict=False))


def _scan_fusion(c: Cascade, names: tuple[str, ...], inline: frozenset[str], local: tuple[str, ...]
                 ) -> tuple[str, ...]:
    """(E, F, epilogue...) when recurrence E is linear in its state (``E = a * E[i-1] + b``) and read in the
    group only by a reduction F over E's ranks absent from F (read plainly), by point-wise phases right after
    F over F's ranks (the epilogue), and by final-state phases (E at the last step): then E's steps are scanned
    a chunk at a time in registers (tl.associative_scan), F and the epilogue computed per chunk, E stored
    only if it leaves the group. Else ()."""
    phases = [n for n in names if n not in inline]
    for k, en in enumerate(phases):
        e = c.einsum(en)
        rec = e.recurrence
        if rec is None or _linear_split(c, e) is None or k + 1 >= len(phases):
            continue
        f = c.einsum(phases[k + 1])
        if f.recurrence is not None or f.where or rec.rank not in f.out_ranks:
            continue
        if not set(f.out_ranks) <= set(e.out_ranks) or len(set(f.out_ranks)) != len(f.out_ranks):
            continue
        red = set(e.out_ranks) - set(f.out_ranks)
        if not _reduction_terms(f, red, e.name) or not all(
                _plain(a, e.out_ranks) for a in walk(f.expr) if isinstance(a, Access) and a.tensor == e.name):
            continue
        epi = []
        for n2 in phases[k + 2:]:
            g = c.einsum(n2)
            if (g.recurrence is not None or g.where or g.reduced_ranks or tuple(g.out_ranks) != tuple(f.out_ranks)
                    or any(isinstance(x, Reduce) for x in walk(g.expr)) or e.name in _reads_through(c, g, inline)):
                break
            ok = all(_plain(a, g.out_ranks) for a in _accesses_through(c, g, inline)
                     if a.tensor in (f.name, *epi))
            if not ok:
                break
            epi.append(n2)
        # every other in-group reader of E: final-state phases only; nothing inline reads E
        fine = True
        for n2 in names:
            if n2 in (en, f.name):
                continue
            g = c.einsum(n2)
            accs = [a for a in walk(g.expr) if isinstance(a, Access) and a.tensor == e.name]
            if not accs:
                continue
            if n2 in inline or n2 in epi or not _final_reader(c, e, g, accs):
                fine = False
        # readers of F / epilogue outside (F, epilogue) must read memory: fine, F is stored when not local-only
        if fine:
            return (e.name, f.name, *epi)
    return ()


def _accesses_through(c: Cascade, e: Einsum, inline: frozenset[str]) -> list[Access]:
    out, seen, todo = [], set(), [e]
    while todo:
        x = todo.pop()
        for a in walk(x.expr):
            if isinstance(a, Access):
                out.append(a)
                if a.tensor in inline and a.tensor not in seen:
                    seen.add(a.tensor)
                    todo.append(c.einsum(a.tensor))
    return out


def _reads_through(c: Cascade, e: Einsum, inline: frozenset[str]) -> set[str]:
    return {a.tensor for a in _accesses_through(c, e, inline)}


def _final_reader(c: Cascade, e: Einsum, g: Einsum, accs: list[Access]) -> bool:
    rec = e.recurrence
    others = [r for r in e.out_ranks if r != rec.rank]
    if g.recurrence is not None or g.where or g.reduced_ranks or sorted(g.out_ranks) != sorted(others):
        return False
    if any(isinstance(x, Reduce) for x in walk(g.expr)):
        return False
    last = c.rank_sizes[rec.rank] - 1
    for a in accs:
        for pos, (ix, r) in enumerate(zip(a.indices, e.out_ranks, strict=False)):
            if pos == rec.position:
                b = _bind(ix, {}, c.values)
                if not (_is_const(b) and int(b) == last):
                    return False
            elif not (ix.is_Symbol and str(ix) == r):
                return False
    return True


def _linear_split(c: Cascade, e: Einsum) -> tuple[list, list] | None:
    """([(sign, factors without the state)], [(sign, term)]) of ``E = sum a * E[i-1] + sum b``; None otherwise."""
    rec = e.recurrence
    a_terms, b_terms = [], []
    for sign, term, summed in e.terms():
        if summed or any(isinstance(n, Reduce) for n in walk(term)):
            return None
        selfs = [n for n in walk(term) if isinstance(n, Access) and n.tensor == e.name]
        if not selfs:
            b_terms.append((sign, term))
            continue
        facs = multiplicative_factors(term) or [term]
        own = [f for f in facs if isinstance(f, Access) and f.tensor == e.name]
        if len(selfs) != 1 or len(own) != 1:
            return None
        acc = own[0]
        for pos, (ix, r) in enumerate(zip(acc.indices, e.out_ranks, strict=False)):
            if pos == rec.position:
                syms = [x for x in ix.free_symbols if str(x) == r]
                if len(ix.free_symbols) != 1 or not syms or sympy.expand(ix - syms[0]) != -1:
                    return None
            elif not (ix.is_Symbol and str(ix) == r):
                return None
        a_terms.append((sign, [f for f in facs if f is not acc]))
    if not a_terms:
        return None
    return a_terms, b_terms


def _reduction_terms(f: Einsum, red: set[str], state: str) -> bool:
    """Every term of F sums over exactly ``red`` (implicitly or as one top-level sum_r)."""
    for _, term, summed in f.terms():
        if isinstance(term, Reduce):
            if term.op != "sum" or {term.rank, *summed} != red or len(red) != len(summed) + 1:
                return False
            if any(isinstance(n, Reduce) for n in walk(term.arg)):
                return False
        elif set(summed) != red or any(isinstance(n, Reduce) for n in walk(term)):
            return False
    return True


def group_plan(cascade: Cascade, mapping: Mapping, gi: int, dot_cap: int = GRID_CAP, dot_bk: int = 32,
               elems: int = GRID_TARGET, dot_swap: bool = False, scan_steps: int = SCAN_STEPS,
               scan_elems: int = SCAN_ELEMS) -> TritonGroupPlan:
    base = plan_group(cascade, [tuple(g.einsums) for g in mapping.groups], gi)
    inline = frozenset(t for t in base.local if _inlinable(cascade.einsum(t)))
    scratch = tuple(t for t in base.local if t not in inline)
    names = base.einsums
    grid = _grid_ranks(cascade, names, inline)
    scan = _scan_fusion(cascade, names, inline, base.local)
    # a chunked scan holds scan_steps steps of its state at once: its rows per program scale down alike
    target = max(1, elems * scan_elems // (GRID_TARGET * scan_steps)) if scan else elems
    blocks = _blocks(cascade, names, inline, grid, mapping.groups[gi].tiles, dot_cap, scan, target)
    order = [r for r in reversed(grid)]
    spec = tuple((r, blocks[r], -(-cascade.rank_sizes[r] // blocks[r])) for r in order)
    return TritonGroupPlan(gi, names, base.reads, base.writes, scratch, tuple(sorted(inline)), base.aux, spec,
                           dot_cap=dot_cap, dot_bk=dot_bk, dot_swap=dot_swap, scan=scan, scan_steps=scan_steps,
                           scan_elems=scan_elems)


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
    em.dot_cap, em.dot_bk, em.dot_swap = plan.dot_cap, plan.dot_bk, plan.dot_swap
    em.scan_steps, em.scan_elems = plan.scan_steps, plan.scan_elems
    dots = []
    phases = [n for n in plan.einsums if n not in plan.inline]
    finals: list[str] = []
    if plan.scan:
        en = plan.scan[0]
        finals = [n for n in phases if n not in plan.scan and any(
            isinstance(a, Access) and a.tensor == en for a in walk(c.einsum(n).expr))]
        phases = [n for n in phases if n not in finals and n not in plan.scan[1:]]
    for k, name in enumerate(phases):
        e = c.einsum(name)
        em.emit(1, f"# {e.text}")
        plans = _dot_plans(c, e, grid, dtype)
        if plan.scan and name == plan.scan[0]:
            for x in plan.scan[1:] + tuple(finals):
                em.emit(1, f"# {c.einsum(x).text}")
            _emit_scan(em, plan, grid, finals, 1)
        elif e.recurrence is not None:
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
