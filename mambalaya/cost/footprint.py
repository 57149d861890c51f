"""Read footprints: which elements of a tensor a set of accesses touches, counted exactly.

A group that reads ``Win[D+x, e]`` reads only the x rows of the packed in_proj
weight, and ``CSF[b,x,k] = XBC0[b,seqlen-d_conv+k,x]`` reads only the last
``d_conv`` tokens, so traffic counts the *distinct in-range elements* read, not
the tensor's size. An access is decomposed into clusters of index positions that
share rank variables (``YD[b, l//Q, l%Q, h, p]`` has clusters {b}, {l//Q, l%Q},
{h}, {p}); each cluster's reachable in-range index tuples are enumerated exactly
(integer arithmetic, as the reference interpreter evaluates indices), and since
clusters use disjoint ranks the access's footprint is their Cartesian product (a
*box*). Several accesses are combined by inclusion-exclusion over box
intersections. Reads outside a tensor are zero padding and touch nothing, except
one step before a recurrence's start, which reads its initial-state tensor
(``S[b,c-1,...]`` at ``c = 0`` reads ``S0``). ``where`` masks do not shrink
footprints (the masked-out elements are still read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import sympy

from mambalaya.errors import MambalayaError
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.expr import Access
from mambalaya.ir.indexing import eval_index
from mambalaya.ir.sizes import substitute

_ENUM_LIMIT = 50_000_000  # largest cluster space enumerated (elements)
#: Clusters of more points than this are first tried as one interval (:func:`_interval`): the conv
#: read of a million-token layer has four million points to enumerate.
_INTERVAL_FROM = 1 << 16
_MAX_BOXES = 12  # inclusion-exclusion beyond this falls back to a bitmap


@dataclass(frozen=True, eq=False)
class Box:
    """A footprint as a product over position clusters; ``codes`` None means the whole cluster."""

    tensor: str
    dims: tuple[int, ...]
    clusters: tuple[tuple[tuple[int, ...], np.ndarray | None], ...]  # (positions, sorted unique flat codes)

    def cluster_size(self, i: int) -> int:
        positions, codes = self.clusters[i]
        return math.prod(self.dims[p] for p in positions) if codes is None else len(codes)

    @property
    def size(self) -> int:
        return math.prod(self.cluster_size(i) for i in range(len(self.clusters)))

    def key(self) -> tuple:
        return tuple((pos, None if c is None else c.tobytes()) for pos, c in self.clusters)


def full_box(tensor: str, dims: tuple[int, ...]) -> Box:
    """Every element of a tensor."""
    return Box(tensor, dims, tuple(((p,), None) for p in range(len(dims))))


# ---- exact index evaluation ------------------------------------------------------------


def _ranks_of(ix: sympy.Expr) -> frozenset[str]:
    return frozenset(str(s) for s in ix.free_symbols if s.is_integer)


def _clusters(indices: tuple[sympy.Expr, ...]) -> list[tuple[tuple[int, ...], frozenset[str]]]:
    """Positions grouped so that no two groups share a rank variable."""
    groups: list[tuple[set[int], set[str]]] = []
    for pos, ix in enumerate(indices):
        ranks = set(_ranks_of(ix))
        merged = ({pos}, ranks)
        for g in [g for g in groups if g[1] & ranks]:
            merged[0].update(g[0])
            merged[1].update(g[1])
            groups.remove(g)
        groups.append(merged)
    return sorted(((tuple(sorted(p)), frozenset(r)) for p, r in groups), key=lambda g: g[0])


def access_boxes(cascade: Cascade, acc: Access) -> list[Box]:
    """The footprint of one read: a box of ``acc.tensor``, plus one of its initial state if it reaches it."""
    dims = cascade.shape(acc.tensor)
    if len(dims) != len(acc.indices):
        raise MambalayaError(f"{acc.tensor} has {len(dims)} axes but is read with {len(acc.indices)} indices")
    producer = cascade.einsum(acc.tensor) if cascade.producer(acc.tensor) else None
    rec = producer.recurrence if producer is not None else None
    init_pos = rec.position if rec is not None and rec.init is not None else None
    main: list[tuple[tuple[int, ...], np.ndarray | None]] = []
    init: list[tuple[tuple[int, ...], np.ndarray | None]] | None = [] if init_pos is not None else None
    for positions, ranks in _clusters(acc.indices):
        sub = tuple(dims[p] for p in positions)
        if _covers(cascade, acc, positions, sub):  # a plain rank over the whole axis: no enumeration
            main.append((positions, None))
            if init is not None:
                init = None if init_pos in positions else [*init, (positions, None)]
            continue
        if (init is None or init_pos not in positions) and _points(cascade, ranks) > _INTERVAL_FROM:
            codes = _interval(cascade, acc, positions, ranks, sub)
            if codes is None:
                codes = _merged(cascade, acc, positions, ranks, sub)
            if codes is not None:  # what enumerating gives, without the arrays
                main.append((positions, codes))
                if init is not None:
                    init.append((positions, codes))
                continue
        coords = _enumerate(cascade, acc, positions, ranks)
        inside = np.ones(coords[0].shape, dtype=bool)
        for k, p in enumerate(positions):
            inside &= (coords[k] >= 0) & (coords[k] < dims[p])
        main.append((positions, _codes(coords, inside, sub)))
        if init is not None:
            if init_pos in positions:
                k0 = positions.index(init_pos)
                before = coords[k0] == -1
                for k, p in enumerate(positions):
                    if p != init_pos:
                        before &= (coords[k] >= 0) & (coords[k] < dims[p])
                rest = tuple(p for p in positions if p != init_pos)
                keep = [coords[k] for k, p in enumerate(positions) if p != init_pos]
                if not before.any():
                    init = None
                elif rest:
                    init.append((rest, _codes(keep, before, tuple(dims[p] for p in rest))))
            else:
                init.append((positions, main[-1][1]))
    boxes = [_normalise(Box(acc.tensor, dims, tuple(main)))]
    if init is not None and rec is not None and rec.init is not None:
        idims = tuple(d for p, d in enumerate(dims) if p != init_pos)
        renumber = {p: (p if p < init_pos else p - 1) for p in range(len(dims)) if p != init_pos}
        clusters = tuple((tuple(renumber[p] for p in pos), c) for pos, c in init)
        boxes.append(_normalise(Box(rec.init, idims, clusters)))
    return [b for b in boxes if b.size > 0]


def _points(cascade: Cascade, ranks: frozenset[str]) -> int:
    return math.prod(cascade.rank_size(r) for r in ranks)


def _interval(cascade: Cascade, acc: Access, positions: tuple[int, ...], ranks: frozenset[str],
              sub: tuple[int, ...]) -> np.ndarray | None:
    """The sorted in-range values of a one-position affine index, when its values are one run of
    integers, else None (then enumerate). Sorted by |coefficient|, each coefficient at most one more
    than the span of the smaller ones makes every integer between the extremes a value (a negative
    coefficient is a positive one on the reversed rank): ``l+k-3``, ``c*chunk+q``, ``D+d_state*g+n``."""
    if len(positions) != 1 or _points(cascade, ranks) > _ENUM_LIMIT:
        return None  # (enumerating says why it cannot)
    ix = acc.indices[positions[0]]
    syms = sorted((s for s in ix.free_symbols if str(s) in ranks), key=str)
    if not syms or not ix.is_polynomial(*syms):
        return None
    poly = sympy.Poly(ix, *syms)
    if poly.total_degree() > 1:
        return None
    where = f"index {ix} of {acc.tensor}"
    const = substitute(poly.coeff_monomial(1), cascade.values, where)
    if not const.is_Integer:
        return None
    lo = hi = int(const)
    steps = []
    for sym in syms:
        a = substitute(poly.coeff_monomial(sym), cascade.values, where)
        if not a.is_Integer:
            return None
        a, n = int(a), cascade.rank_size(str(sym))
        lo, hi = (lo, hi + a * (n - 1)) if a > 0 else (lo + a * (n - 1), hi)
        steps.append((abs(a), n))
    span = 0
    for a, n in sorted(steps):
        if n > 1 and a > span + 1:
            return None  # a gap between values
        span += a * (n - 1)
    lo, hi = max(lo, 0), min(hi, sub[0] - 1)
    return np.arange(lo, hi + 1, dtype=np.int64) if lo <= hi else np.zeros(0, dtype=np.int64)


def _merged(cascade: Cascade, acc: Access, positions: tuple[int, ...], ranks: frozenset[str],
            sub: tuple[int, ...]) -> np.ndarray | None:
    """``(l // a, l % a)`` read into two axes of sizes ``(d, a)`` (a chunked sequence merged back): its
    flat index is ``l`` itself, inside while ``l < d * a``; else None (then enumerate)."""
    if len(positions) != 2 or len(ranks) != 1 or _points(cascade, ranks) > _ENUM_LIMIT:
        return None
    f, m = (acc.indices[p] for p in positions)
    if m.func != sympy.Mod or f.func != sympy.floor or not m.args[0].is_Symbol or str(m.args[0]) not in ranks:
        return None
    sym, div = m.args
    if f.args[0] != sym / div:
        return None
    a = substitute(div, cascade.values, f"index {m} of {acc.tensor}")
    if not a.is_Integer or int(a) != sub[1] or int(a) <= 0:
        return None
    return np.arange(min(cascade.rank_size(str(sym)), sub[0] * sub[1]), dtype=np.int64)


def _enumerate(
    cascade: Cascade, acc: Access, positions: tuple[int, ...], ranks: frozenset[str]
) -> list[np.ndarray]:
    """Index values at ``positions`` for every point of the cluster's ranks (flattened)."""
    order = sorted(ranks)
    sizes = [cascade.rank_size(r) for r in order]
    total = math.prod(sizes)
    if total > _ENUM_LIMIT:
        raise MambalayaError(
            f"footprint of {acc}: {total} index points in one cluster is too many to enumerate"
        )
    grids = {}
    for i, r in enumerate(order):
        shape = [1] * len(order)
        shape[i] = sizes[i]
        grids[r] = np.arange(sizes[i], dtype=np.int64).reshape(shape)
    full = tuple(sizes)
    out = []
    for p in positions:
        num, den = eval_index(acc.indices[p], grids, cascade.values)
        if den != 1:
            raise MambalayaError(f"index {acc.indices[p]} of {acc.tensor} is fractional")
        out.append(np.broadcast_to(num, full).reshape(-1))
    return out


def _covers(cascade: Cascade, acc: Access, positions: tuple[int, ...], sub: tuple[int, ...]) -> bool:
    if len(positions) != 1:
        return False
    ix = acc.indices[positions[0]]
    return bool(ix.is_Symbol and ix.is_integer and cascade.rank_size(str(ix)) == sub[0])


def _codes(coords: list[np.ndarray], keep: np.ndarray, sub: tuple[int, ...]) -> np.ndarray:
    """Sorted distinct flat indices of the kept coordinates (a bitmap when the subspace is small)."""
    if not coords:
        return np.zeros(1 if keep.all() else 0, dtype=np.int64)
    kept = [c[keep] for c in coords]
    if not kept[0].size:
        return np.zeros(0, dtype=np.int64)
    flat = np.ravel_multi_index(kept, sub)
    space = math.prod(sub)
    if space <= max(4 * flat.size, 1 << 20):
        seen = np.zeros(space, dtype=bool)
        seen[flat] = True
        return np.flatnonzero(seen).astype(np.int64)
    return np.unique(flat)


def _normalise(box: Box) -> Box:
    """Mark clusters that cover their whole subspace as full (None)."""
    clusters = []
    for positions, codes in box.clusters:
        whole = math.prod(box.dims[p] for p in positions)
        clusters.append((positions, None if codes is not None and len(codes) == whole else codes))
    return Box(box.tensor, box.dims, tuple(clusters))


# ---- unions --------------------------------------------------------------------------


def _coarsen(box: Box, partition: list[tuple[int, ...]]) -> list[np.ndarray | None]:
    """The box's codes on a coarser partition of its positions (outer products of sub-clusters)."""
    out: list[np.ndarray | None] = []
    for target in partition:
        subs = [(pos, codes) for pos, codes in box.clusters if set(pos) <= set(target)]
        if all(codes is None for _, codes in subs):
            out.append(None)
            continue
        if len(subs) == 1:
            out.append(subs[0][1])
            continue
        sizes = [math.prod(box.dims[p] for p in pos) if codes is None else len(codes) for pos, codes in subs]
        if math.prod(sizes) > _ENUM_LIMIT:
            raise OverflowError
        coords: dict[int, np.ndarray] = {}
        grids = np.meshgrid(*[np.arange(n) for n in sizes], indexing="ij")
        for (pos, codes), g in zip(subs, grids, strict=True):
            flat = g.reshape(-1)
            vals = flat if codes is None else codes[flat]
            for p, c in zip(pos, np.unravel_index(vals, tuple(box.dims[p] for p in pos)), strict=True):
                coords[p] = c
        out.append(
            np.unique(np.ravel_multi_index([coords[p] for p in target], tuple(box.dims[p] for p in target)))
        )
    return out


def _join(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    groups: list[set[int]] = []
    for pos in [*a, *b]:
        merged = set(pos)
        for g in [g for g in groups if g & merged]:
            merged |= g
            groups.remove(g)
        groups.append(merged)
    return sorted((tuple(sorted(g)) for g in groups), key=lambda g: g[0])


def _intersect(a: Box, b: Box) -> Box | None:
    part_a = [pos for pos, _ in a.clusters]
    part_b = [pos for pos, _ in b.clusters]
    partition = part_a if part_a == part_b else _join(part_a, part_b)
    ca = [c for _, c in a.clusters] if partition == part_a else _coarsen(a, partition)
    cb = [c for _, c in b.clusters] if partition == part_b else _coarsen(b, partition)
    clusters = []
    for pos, x, y in zip(partition, ca, cb, strict=True):
        codes = y if x is None else x if y is None else np.intersect1d(x, y, assume_unique=True)
        if codes is not None and len(codes) == 0:
            return None
        clusters.append((pos, codes))
    return Box(a.tensor, a.dims, tuple(clusters))


def union_size(boxes: list[Box]) -> int:
    """Distinct elements covered by the boxes (all of one tensor)."""
    unique = list({b.key(): b for b in boxes if b.size}.values())
    if not unique:
        return 0
    total = math.prod(unique[0].dims)
    if any(b.size == total for b in unique):
        return total
    if len(unique) == 1:
        return unique[0].size
    if len(unique) <= _MAX_BOXES:
        try:
            return _inclusion_exclusion(unique)
        except OverflowError:
            pass
    return _bitmap(unique, total)


def _inclusion_exclusion(boxes: list[Box]) -> int:
    total = 0

    def grow(start: int, current: Box, depth: int) -> None:
        nonlocal total
        total += (1 if depth % 2 else -1) * current.size
        for j in range(start, len(boxes)):
            nxt = _intersect(current, boxes[j])
            if nxt is not None:
                grow(j + 1, nxt, depth + 1)

    for i, b in enumerate(boxes):
        grow(i + 1, b, 1)
    return total


def _bitmap(boxes: list[Box], total: int) -> int:
    if total > 400_000_000:
        return min(total, sum(b.size for b in boxes))  # upper bound; never reached by the shipped cascades
    seen = np.zeros(boxes[0].dims, dtype=bool)
    for b in boxes:
        index: list[np.ndarray] = [np.empty(0)] * len(b.dims)
        codes_per = [
            np.arange(math.prod(b.dims[p] for p in pos)) if c is None else c for pos, c in b.clusters
        ]
        for k, ((pos, _), codes) in enumerate(zip(b.clusters, codes_per, strict=True)):
            shape = [1] * len(b.clusters)
            shape[k] = len(codes)
            for p, c in zip(pos, np.unravel_index(codes, tuple(b.dims[p] for p in pos)), strict=True):
                index[p] = c.reshape(shape)
        seen[tuple(index)] = True
    return int(seen.sum())


def footprint_elements(cascade: Cascade, tensor: str, accesses: list[Access], full: bool = False) -> int:
    """Distinct elements of ``tensor`` read by ``accesses`` (``full``: the whole tensor is read too)."""
    if full:
        return cascade.size(tensor)
    boxes = [b for acc in accesses for b in access_boxes(cascade, acc) if b.tensor == tensor]
    return union_size(boxes)


__all__ = ["Box", "access_boxes", "footprint_elements", "full_box", "union_size"]
