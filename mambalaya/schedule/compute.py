"""How a group's members compute: what is recomputed at its reads, what is a contraction, what is a scan.

Decided once, here, for every backend (each prints these decisions; none re-derives them):

* **Inlined members** (:func:`choose_inline`): a point-wise intermediate (a causal ``where`` mask over
  its own ranks allowed) that no other group reads is recomputed at each of its reads instead of
  buffered, when that costs few evaluations per element (:data:`RECOMPUTE_MAX`, one for a member that
  calls a function): every read of it, times the ranks its reader sweeps that the read does not index,
  times how often the reader is evaluated when inlined itself; a contraction evaluates each operand
  factor once per operand element. Mamba-1's ``DA = exp(dt*A)`` and ``BX = dt*B*x`` feed the scan
  without ever existing as tensors.
* **Effective reads** (:func:`effective_reads`): a member's reads with inlined producers expanded, each
  index composed through them, so boxes, halos and streams see what is really read.
* **Contractions** (:func:`contraction`): a summed product split into two operand groups sharing the
  summed ranks (batch, M, N, K): a GEMM for BLAS or ``tl.dot``; ``vector`` admits matrix-vector shapes.
* **Scans** (:func:`scan_consumers`): a recurrence whose group readers all read it at its current or
  previous step at the same point (a readout summed over its extra ranks, a gate) computes them step by
  step with its state on chip: the recurrence's tensor is never buffered beyond one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy

from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import (
    Access,
    Call,
    Node,
    Reduce,
    accesses,
    free_ranks,
    multiplicative_factors,
    rank_symbol,
    walk,
)

#: Smallest M, N and K of a contraction (below it, a loop nest is as fast as a GEMM call).
GEMM_MIN = 8
#: Smallest N x K (M x K) of a matrix-vector contraction (``vector=True``).
GEMV_MIN = 1 << 12
#: Most evaluations per element of an inlined point-wise member (one if it calls a function).
RECOMPUTE_MAX = 4


@dataclass(frozen=True)
class Contraction:
    """A summed product as a GEMM: ``a`` and ``b`` factors; ranks batch (both, kept), m (a only), n (b only),
    k (summed, both)."""

    a: tuple[Node, ...]
    b: tuple[Node, ...]
    batch: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]


def contraction(c: Cascade, e: Einsum, term: Node, summed: frozenset[str], vector: bool = False) -> Contraction | None:
    """The best split of a summed product term into two GEMM operands, or None when it is not worth one."""
    if e.where or e.recurrence is not None or not summed:
        return None
    key = (id(c), e.name, id(term), vector)
    got = _CONTRACTIONS.get(key)
    if got is not None and got[0] is c and got[1] is term:
        return got[2]
    best = _contraction(c, e, term, summed, vector)
    if len(_CONTRACTIONS) > 4096:
        _CONTRACTIONS.clear()
    _CONTRACTIONS[key] = (c, term, best)
    return best


#: contraction plans by (cascade, Einsum, term, vector), the objects kept to tell a reused id apart
_CONTRACTIONS: dict[tuple, tuple] = {}


def _contraction(c: Cascade, e: Einsum, term: Node, summed: frozenset[str], vector: bool) -> Contraction | None:
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
        batch = tuple(r for r in e.ranks if r in (ra & rb) - summed)
        m = tuple(r for r in e.ranks if r in ra - rb)
        n = tuple(r for r in e.ranks if r in rb - ra)
        k = tuple(r for r in e.ranks if r in summed)
        ms, ns, ks = (math.prod(size[r] for r in g) for g in (m, n, k))
        if min(ms, ns, ks) < GEMM_MIN:
            if not vector or ks < GEMM_MIN or max(ms, ns) * ks < GEMV_MIN:
                continue
        score = min(ms, ns) * ks if min(ms, ns) >= GEMM_MIN else max(ms, ns) * ks // GEMV_MIN
        if score > best_score:
            best_score = score
            best = Contraction(tuple(factors[i] for i in ga), tuple(factors[i] for i in gb), batch, m, n, k)
    return best


def dot_plans(c: Cascade, e: Einsum) -> list[Contraction | None]:
    """Per summed term of ``e`` (:meth:`Einsum.terms`), its matrix-unit plan, or None where the term runs
    element-wise (no worthwhile split, or a factor that is itself a reduction)."""
    plans = [contraction(c, e, t, s, vector=True) for _, t, s in e.terms()]
    return [p if p is not None and not any(isinstance(n, Reduce) for f in (*p.a, *p.b) for n in walk(f)) else None
            for p in plans]


def pointwise(e: Einsum, masked: bool = True) -> bool:
    """No reduction, recurrence or repeated output rank (a ``where`` over its own output ranks allowed when
    ``masked``: its value is zero outside the mask)."""
    if e.recurrence is not None or e.reduced_ranks or len(set(e.out_ranks)) != len(e.out_ranks):
        return False
    if any(isinstance(n, Reduce) for n in walk(e.expr)):
        return False
    if e.where:
        return masked and {r for cmp in e.where for r in cmp.ranks()} <= set(e.out_ranks)
    return True


def choose_inline(cascade: Cascade, members: list[str], candidates: list[str]) -> dict[str, int]:
    """The candidates recomputed at their reads (module docstring), with their evaluations per element."""
    c = cascade
    evals: dict[str, int] = {}
    for t in reversed([x for x in members if x in set(candidates)]):  # readers come later: decided first
        if not pointwise(c.einsum(t)):
            continue
        count = 0
        for m in members:
            e = c.einsum(m)
            if t not in e.reads or m == t:
                continue
            for _, term, summed in e.terms():
                accs = [a for a in accesses(term) if a.tensor == t]
                if not accs:
                    continue
                gp = contraction(c, e, term, summed, vector=True)
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
    return evals


@dataclass(frozen=True)
class EffectiveRead:
    """A read a member really makes: of ``tensor`` at ``indices`` (over the member's ranks), reached through
    the member's access ``path[0]`` and then the inlined producers ``via`` (their accesses ``path[1:]``)."""

    tensor: str
    indices: tuple[sympy.Expr, ...]
    path: tuple[int, ...]
    via: tuple[str, ...] = ()


def distinct_accesses(e: Einsum) -> tuple[Access, ...]:
    """An Einsum's distinct reads, in reading order (a recurrence's read of itself included)."""
    return tuple(dict.fromkeys(accesses(e.expr)))


def effective_reads(cascade: Cascade, name: str, inline: frozenset[str] | set[str]) -> tuple[EffectiveRead, ...]:
    """``name``'s reads with its inlined producers expanded (their indices composed through the read)."""
    e = cascade.einsum(name)
    out = []
    for k, acc in enumerate(distinct_accesses(e)):
        if acc.tensor in inline and acc.tensor != name:
            p = cascade.einsum(acc.tensor)
            bind = dict(zip((rank_symbol(r) for r in p.out_ranks), acc.indices,
                            strict=True))
            for sub in effective_reads(cascade, acc.tensor, inline):
                out.append(EffectiveRead(sub.tensor, tuple(ix.xreplace(bind) for ix in sub.indices),
                                         (k, *sub.path), (acc.tensor, *sub.via)))
        else:
            out.append(EffectiveRead(acc.tensor, acc.indices, (k,)))
    return tuple(out)


def _step_of(ix: sympy.Expr, t: str, values: dict) -> int | None:
    """The offset ``k`` of an index ``t + k`` (None when it is not one)."""
    syms = {str(s): s for s in ix.free_symbols if s.is_integer}
    if set(syms) != {t}:
        return None
    subs = {s: sympy.Integer(int(values[str(s)])) for s in ix.free_symbols if not s.is_integer and str(s) in values}
    d = sympy.expand(ix.xreplace(subs) - syms[t])
    return int(d) if d.is_Integer else None


def scan_consumers(cascade: Cascade, rec: str, readers: list[str], inline: frozenset[str]) -> list[str] | None:
    """The readers a recurrence can compute step by step (module docstring), or None when one cannot be:
    each reads it only at its own point, at the current or previous step, iterates only the recurrence's
    ranks (its iterative rank among them, in the recurrence's order), and has no mask, recurrence or prefix
    sum; a reader of the last step alone (a final state) is not a consumer (it runs after, on the state)."""
    c = cascade
    r = c.einsum(rec)
    it = r.recurrence
    assert it is not None
    outs, t = r.out_ranks, it.rank
    if r.where or len(set(outs)) != len(outs) or any(s for _, _, s in r.terms()):
        return None
    if any(isinstance(n, Reduce) for n in walk(r.expr)):
        return None
    for acc in accesses(r.expr):  # its own reads of itself: the previous step at its own point
        if acc.tensor == rec and _plain_step(acc, outs, it.position, t, c.values) != -1:
            return None
    out = []
    for name in readers:
        e = c.einsum(name)
        reads = [a for a in accesses(e.expr) if a.tensor == rec]
        if _final(e, reads, outs, it.position, c.rank_size(t), c.values):
            continue
        if e.where or e.recurrence is not None or any(isinstance(n, Reduce) and n.op == "cumsum" for n in walk(e.expr)):
            return None
        if name in inline:
            return None
        steps = {_plain_step(a, outs, it.position, t, c.values) for a in reads}
        if len(steps) != 1 or steps - {0, -1}:
            return None
        if not set(e.ranks) <= set(outs) or t not in e.out_ranks or len(set(e.out_ranks)) != len(e.out_ranks):
            return None
        if e.out_ranks != tuple(x for x in outs if x in e.out_ranks):
            return None
        out.append(name)
    return out


def scan_shape(c: Cascade, rec: str, consumers: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...],
                                                                          tuple[str, ...], tuple[str, ...]]:
    """How a scan lays out its state: (outer ranks: the recurrence's other ranks every consumer writes; inner
    ranks: the rest; the consumers reading the step before each update; those reading it after)."""
    e = c.einsum(rec)
    it = e.recurrence
    assert it is not None
    rest = [r for r in e.out_ranks if r != it.rank]
    outs = [set(c.einsum(x).out_ranks) for x in consumers]
    outer = tuple(r for r in rest if all(r in o for o in outs))
    inner = tuple(r for r in rest if r not in outer)
    before, after = [], []
    for x in consumers:
        read = next(a for a in accesses(c.einsum(x).expr) if a.tensor == rec)
        (before if _step_of(read.indices[it.position], it.rank, c.values) == -1 else after).append(x)
    return outer, inner, tuple(before), tuple(after)


def _plain_step(acc: Access, outs: tuple[str, ...], position: int, t: str, values: dict) -> int | None:
    for p, (ix, r) in enumerate(zip(acc.indices, outs, strict=True)):
        if p != position and not (ix.is_Symbol and str(ix) == r):
            return None
    return _step_of(acc.indices[position], t, values)


def _final(e: Einsum, reads: list[Access], outs: tuple[str, ...], position: int, steps: int, values: dict) -> bool:
    """``e`` copies the recurrence's last step (``SF[b,h,p,n] = S[b,C-1,h,p,n]``)."""
    if not isinstance(e.expr, Access) or len(reads) != 1:
        return False
    ix = e.expr.indices[position]
    if any(s.is_integer for s in ix.free_symbols):
        return False
    subs = {s: sympy.Integer(int(values[str(s)])) for s in ix.free_symbols if str(s) in values}
    last = ix.xreplace(subs)
    return bool(last.is_Integer and int(last) == steps - 1)


__all__ = ["GEMM_MIN", "GEMV_MIN", "RECOMPUTE_MAX", "Contraction", "EffectiveRead", "choose_inline", "contraction",
           "distinct_accesses", "dot_plans", "effective_reads", "pointwise", "scan_consumers", "scan_shape"]
