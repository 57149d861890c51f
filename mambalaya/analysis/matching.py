"""Matching ranks through a tensor: how a consumer indexes each position its producer writes.

The fusion classes match ranks *by position in the tensor*: the producer writes
``T`` with plain ranks (its output indices), so position ``j`` of ``T`` is the
producer's rank ``p_j``; the consumer indexes the same position with an index
expression. The rules, per position and per read of ``T``:

* ``r`` (a plain rank): ``p_j`` and ``r`` are **shared** (kind ``same``).
* ``r + o`` (a constant offset ``o``): shared; when ``r`` and ``p_j`` have the same
  size the offset is a **halo** of ``|o|`` rows (``offset``, e.g. ``l-1``); when
  the sizes differ the consumer reads a sub-range (``slice``, e.g.
  ``seqlen-d_conv+k``), no halo.
* several ranks with mixed-radix coefficients (``c*chunk+q``, ``h*headdim+p``,
  ``g*d_state+n``; each coefficient at least the span of the lower terms): a
  **split** of ``p_j``; every rank of the expression is shared with ``p_j`` ("shared
  after re-tiling"), each is one *piece* of ``p_j``.
* several ranks that overlap (``l+k-d_conv+1``): the rank that also indexes the
  consumer's output (coefficient 1 first) is shared, the others are private to
  the consumer and give a **halo** window of their span (``window``).
* ``r // a`` and ``r % a`` (``l//chunk``, ``l%chunk``, ``d//headdim``): the consumer's
  rank ``r`` is shared with each producer rank it is split into (``merge`` when
  both appear, ``coarsen`` / ``fine`` for one alone): the mirror of a split.
* no rank (``seqlen-1``, ``chunk-1``): the position is **pinned**; ``p_j`` is not
  shared by this read, and the consumer needs it complete.
* anything else: the ranks of the index that also index the consumer's output
  are shared (``other``); with none, ``p_j`` is ``unmatched`` (private, needed whole).

When several reads index one position with different ranks (``LM`` reads
``ACS[..,q,..]`` and ``ACS[..,s,..]``) the first read gives the *primary* match; the
other ranks are shared too, as ``cross`` ranks: the consumer needs the position
beyond one tile, so it counts as needed complete.

A piece is identified by a *signature* ``(offset, divisor, modulus)``: the piece is
``((x - offset) // divisor) % modulus`` of the producer rank ``x`` (modulus ``None`` for
the outermost piece), so ``c`` in ``c*chunk+q`` and ``l//chunk`` have one signature and
the fusion-group analysis can tell that they are the same loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import Access, accesses
from mambalaya.ir.sizes import substitute

#: Kinds whose shared rank is the same loop as the producer's rank (the group analysis unions them).
SAME_LOOP_KINDS = ("same", "offset", "slice", "window")
#: Kinds where the producer's rank is split into several consumer ranks (pieces).
SPLIT_KINDS = ("split", "stride")
#: Kinds where the consumer's rank is split into several producer ranks (pieces).
MERGE_KINDS = ("merge", "coarsen", "fine")

Signature = tuple[int, int, int | None]


@dataclass(frozen=True)
class Halo:
    """A window of extra rows the consumer reads around one tile of a shared rank."""

    rank: str  # the consumer's shared rank the window slides along
    producer_rank: str
    window: sympy.Expr  # extra rows beyond one tile (d_conv - 1 for the causal conv)
    size: int  # the window under the bound params
    direction: str  # "backward" (earlier rows), "forward" or "both"
    ranks: tuple[str, ...] = ()  # private consumer ranks spanning the window (k); empty for a plain offset

    def to_dict(self) -> dict:
        return {"rank": self.rank, "producer_rank": self.producer_rank, "window": str(self.window),
                "size": self.size, "direction": self.direction, "ranks": list(self.ranks)}


@dataclass(frozen=True)
class PositionMatch:
    """How a consumer reads one position of a tensor (all its reads of the tensor together)."""

    position: int
    producer_rank: str
    kind: str  # kind of the primary match (see the module docstring)
    shared: tuple[str, ...]  # consumer ranks of the primary match (outer piece first for a split)
    signatures: tuple[Signature | None, ...]  # per shared rank: its piece of producer_rank (splits, merges)
    cross: tuple[str, ...] = ()  # further consumer ranks reading this position in other reads
    cross_signatures: tuple[Signature | None, ...] = ()  # their pieces of producer_rank
    private: tuple[str, ...] = ()  # consumer ranks of a halo window (private to the consumer)
    halo: Halo | None = None
    pinned: tuple[str, ...] = ()  # constant indices read at this position (text)
    indices: tuple[str, ...] = ()  # the consumer's index expression at this position, per read

    @property
    def needs_complete(self) -> bool:
        """The consumer needs this position beyond one tile of it: pinned, crossed or unmatched.

        A split crossed only within one of its pieces (``c*chunk+q`` and ``c*chunk+s``) needs that
        piece whole (see :attr:`crossed`), not the whole producer rank.
        """
        if self.kind in SPLIT_KINDS and self.cross:
            return bool(self.pinned) or len(self.crossed) < len(set(self.cross_signatures))
        return bool(self.pinned or self.cross) or self.kind == "unmatched"

    @property
    def shared_ranks(self) -> tuple[str, ...]:
        return self.shared + self.cross

    @property
    def crossed(self) -> tuple[str, ...]:
        """Primary ranks whose piece another read also sweeps (the whole piece is needed per tile)."""
        if self.kind in SPLIT_KINDS:
            sigs = set(self.cross_signatures)
            return tuple(r for r, sig in zip(self.shared, self.signatures, strict=True) if sig in sigs)
        return self.shared if self.cross else ()


@dataclass(frozen=True)
class _Read:
    """One read's match at one position (before reads are combined)."""

    kind: str
    shared: tuple[str, ...] = ()
    signatures: tuple[Signature | None, ...] = ()
    private: tuple[str, ...] = ()
    halo: Halo | None = None
    pinned: str | None = None


def _rank_syms(ix: sympy.Expr) -> list[sympy.Symbol]:
    return sorted((s for s in ix.free_symbols if s.is_integer), key=str)


class _Matcher:
    """Per-edge matcher: knows the bound params to evaluate coefficients and sizes."""

    def __init__(self, cascade: Cascade, producer: Einsum, consumer: Einsum) -> None:
        self.cascade = cascade
        self.producer = producer
        self.consumer = consumer
        self.consumer_out = consumer.out_ranks  # (printed from sympy on every access: once here)

    def num(self, expr: sympy.Expr) -> float:
        value = substitute(sympy.sympify(expr), self.cascade.values, f"index coefficient {expr}")
        return float(value)

    def size(self, rank: str) -> int:
        return self.cascade.rank_size(rank)

    def size_expr(self, rank: str) -> sympy.Expr:
        return self.cascade.rank_exprs[rank]

    # ---- one index expression -------------------------------------------
    def read(self, ix: sympy.Expr, prank: str, merges: dict[str, tuple[int, int]], pos: int) -> _Read:
        syms = _rank_syms(ix)
        if not syms:
            return _Read("pinned", pinned=str(ix).replace(" ", ""))
        if ix.is_Symbol:
            return _Read("same", (str(ix),), (None,))
        if ix.is_polynomial(*syms) and sympy.Poly(ix, *syms).total_degree() <= 1:
            return self.affine(ix, syms, prank)
        return self.nonaffine(ix, syms, prank, merges, pos)

    def affine(self, ix: sympy.Expr, syms: list[sympy.Symbol], prank: str) -> _Read:
        coefs = {str(s): sympy.expand(ix).coeff(s) for s in syms}
        const = sympy.expand(ix).subs({s: 0 for s in syms})
        out = self.consumer_out
        if len(syms) == 1:
            (r,) = coefs
            a = self.num(coefs[r])
            if a != 1:
                sig = (int(self.num(const)), int(a), None)
                return _Read("stride", (r,), (sig,))
            if self.size(r) != self.size(prank):
                return _Read("slice", (r,), (None,))
            offset = self.num(const)
            if not offset:
                return _Read("same", (r,), (None,))
            halo = Halo(r, prank, -const if offset < 0 else const, abs(int(offset)),
                        "backward" if offset < 0 else "forward")
            return _Read("offset", (r,), (None,), halo=halo)
        numeric = {r: self.num(a) for r, a in coefs.items()}
        split = self.split_order(numeric)
        if split is not None:
            offset = int(self.num(const))
            sigs: list[Signature] = []
            for i, r in enumerate(split):
                upper = int(numeric[split[i - 1]] // numeric[r]) if i else None
                sigs.append((offset, int(numeric[r]), upper))
            return _Read("split", tuple(split), tuple(sigs))
        in_out = [r for r in out if r in coefs]
        if not in_out:
            return _Read("unmatched", private=tuple(coefs))
        ones = [r for r in in_out if numeric[r] == 1]
        r = (ones or in_out)[0]
        others = [s for s in coefs if s != r]
        if numeric[r] != 1:
            return _Read("other", (r,), (None,), private=tuple(others))
        return _Read("window", (r,), (None,), private=tuple(others), halo=self.window(r, prank, coefs, const))

    def split_order(self, numeric: dict[str, float]) -> list[str] | None:
        """Ranks outer to inner when the coefficients tile without overlap (mixed radix), else None."""
        order = sorted(numeric, key=lambda r: (-numeric[r], r))
        if any(numeric[r] <= 0 for r in order):
            return None
        span = 0.0
        for r in reversed(order):
            if numeric[r] < span + 1 or numeric[r] != int(numeric[r]):
                return None
            span += numeric[r] * (self.size(r) - 1)
        return order

    def window(self, r: str, prank: str, coefs: dict[str, sympy.Expr], const: sympy.Expr) -> Halo | None:
        lo, hi = const, const
        for s, a in coefs.items():
            if s == r:
                continue
            extent = a * (self.size_expr(s) - 1)
            if self.num(extent) < 0:
                lo += extent
            else:
                hi += extent
        lo_n, hi_n = self.num(lo), self.num(hi)
        window = sympy.Integer(0)
        if lo_n < 0:
            window += -lo
        if hi_n > 0:
            window += hi
        size = int(round(max(0.0, -lo_n) + max(0.0, hi_n)))
        if size == 0:
            return None
        direction = "both" if lo_n < 0 < hi_n else ("backward" if lo_n < 0 else "forward")
        privates = tuple(s for s in coefs if s != r)
        return Halo(r, prank, _simplify(window), size, direction, privates)

    def nonaffine(self, ix: sympy.Expr, syms, prank: str, merges: dict[str, tuple[int, int]], pos: int) -> _Read:
        names = [str(s) for s in syms]
        if len(names) == 1:
            (r,) = names
            piece = _piece(ix, syms[0], self.num)
            if piece is not None:
                kind = "merge" if r in merges else ("coarsen" if piece[2] is None else "fine")
                return _Read(kind, (r,), (piece,))
        shared = tuple(r for r in self.consumer_out if r in names)
        private = tuple(r for r in names if r not in shared)
        if not shared:
            return _Read("unmatched", private=private)
        return _Read("other", shared, (None,) * len(shared), private=private)


def _simplify(expr: sympy.Expr) -> sympy.Expr:
    """``sympy.simplify``, skipped on a number, a symbol or ``+-symbol + integer`` (a conv window such
    as ``d_conv - 1``), which it returns unchanged: its first call imports sympy.physics (0.3 s)."""
    if expr.is_Number or expr.is_Symbol:
        return expr
    if expr.is_Add and len(expr.args) == 2:
        num, rest = expr.args
        if num.is_Integer and (rest.is_Symbol or rest.is_Mul and rest.args[0] == -1 and len(rest.args) == 2
                               and rest.args[1].is_Symbol):
            return expr
    return sympy.simplify(expr)


def _piece(ix: sympy.Expr, sym: sympy.Symbol, num) -> Signature | None:
    """The signature of ``r // a`` or ``r % a`` (a piece of the consumer's rank ``r``), else None."""
    if ix.func == sympy.floor:
        arg = sympy.expand(ix.args[0])
        if arg.is_polynomial(sym) and sympy.Poly(arg, sym).total_degree() == 1 and arg.subs(sym, 0) == 0:
            inv = num(arg.coeff(sym))
            if inv > 0 and abs(1 / inv - round(1 / inv)) < 1e-9:
                return (0, int(round(1 / inv)), None)
    if ix.func == sympy.Mod and ix.args[0] == sym:
        return (0, 1, int(num(ix.args[1])))
    return None


def _merged_ranks(acc: Access) -> dict[str, tuple[int, int]]:
    """Consumer ranks read as both ``r // a`` and ``r % a`` in one access: rank -> (floor pos, mod pos)."""
    floors: dict[str, int] = {}
    mods: dict[str, int] = {}
    for pos, ix in enumerate(acc.indices):
        syms = _rank_syms(ix)
        if len(syms) == 1:
            if ix.func == sympy.floor:
                floors[str(syms[0])] = pos
            elif ix.func == sympy.Mod:
                mods[str(syms[0])] = pos
    return {r: (floors[r], mods[r]) for r in floors if r in mods}


def reads_of(consumer: Einsum, tensor: str) -> list[Access]:
    """The consumer's distinct reads of ``tensor`` (its recurrence's self-read excluded)."""
    out: list[Access] = []
    for acc in accesses(consumer.expr):
        if acc.tensor == tensor and acc not in out:
            out.append(acc)
    return out


def match_positions(cascade: Cascade, producer: Einsum, consumer: Einsum,
                    reads: Sequence[Access] | None = None) -> tuple[PositionMatch, ...]:
    """Match the consumer's reads of the producer's output, position by position."""
    tensor = producer.name
    reads = list(reads) if reads is not None else reads_of(consumer, tensor)
    if not reads and consumer.recurrence and consumer.recurrence.init == tensor:
        return _init_matches(producer, consumer)
    m = _Matcher(cascade, producer, consumer)
    out = producer.out_ranks
    per_pos: list[list[tuple[_Read, str]]] = [[] for _ in out]
    for acc in reads:
        merges = _merged_ranks(acc)
        for pos, ix in enumerate(acc.indices):
            per_pos[pos].append((m.read(ix, out[pos], merges, pos), str(ix).replace(" ", "")))
    return tuple(_combine(pos, out[pos], found) for pos, found in enumerate(per_pos))


def _combine(pos: int, prank: str, found: list[tuple[_Read, str]]) -> PositionMatch:
    primary = next((r for r, _ in found if r.shared), None)
    pinned = tuple(dict.fromkeys(r.pinned for r, _ in found if r.pinned is not None))
    private = tuple(dict.fromkeys(p for r, _ in found for p in r.private))
    indices = tuple(dict.fromkeys(ix for _, ix in found))
    if primary is None:
        kind = "pinned" if pinned and not private else "unmatched"
        return PositionMatch(pos, prank, kind, (), (), (), (), private, None, pinned, indices)
    cross = dict.fromkeys((s, sig) for r, _ in found for s, sig in zip(r.shared, r.signatures, strict=True)
                          if s not in primary.shared)
    halos = [r.halo for r, _ in found if r.halo is not None]
    halo = max(halos, key=lambda h: h.size) if halos else None
    return PositionMatch(pos, prank, primary.kind, primary.shared, primary.signatures, tuple(s for s, _ in cross),
                         tuple(sig for _, sig in cross), private, halo, pinned, indices)


def _init_matches(producer: Einsum, consumer: Einsum) -> tuple[PositionMatch, ...]:
    """An intermediate tensor used as a recurrence's initial state: its positions are the state's."""
    rec = consumer.recurrence
    assert rec is not None
    kept = [r for i, r in enumerate(consumer.out_ranks) if i != rec.position]
    return tuple(PositionMatch(pos, prank, "same", (kept[pos],), (None,), indices=(kept[pos],))
                 for pos, prank in enumerate(producer.out_ranks) if pos < len(kept))
