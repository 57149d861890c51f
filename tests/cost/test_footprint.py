"""Exact read footprints: slices, halos, split indices, initial states, unions."""

from __future__ import annotations

from mambalaya.cost.footprint import access_boxes, union_size
from mambalaya.ir.expr import accesses
from mambalaya.parse import open_cascade, parse_cascade_text


def boxes(cascade, einsum, tensor):
    e = cascade.einsum(einsum)
    return [b for a in accesses(e.expr) for b in access_boxes(cascade, a) if b.tensor == tensor]


def test_packed_weight_rows_and_unions():
    c = open_cascade(
        "mamba2", params={"seqlen": 100}
    )  # d_model 64, D 128, CD 160, H 8: Win is [2D + 2*16 + H, 64] = [296, 64]
    assert union_size(boxes(c, "Z", "Win")) == 128 * 64
    assert union_size(boxes(c, "DT0", "Win")) == 8 * 64
    everyone = [b for e in ("Z", "XBC0", "DT0") for b in boxes(c, e, "Win")]
    assert union_size(everyone) == 296 * 64
    # CB reads the C part and the B part of XBC (16 channels each) over all 100 tokens
    assert union_size(boxes(c, "CB", "XBC")) == 100 * 32
    xbc = [b for e in ("CB", "XDT") for b in boxes(c, e, "XBC")]
    assert union_size(xbc) == 100 * 160


def test_last_rows_only_and_padding():
    c = open_cascade("mamba2", params={"seqlen": 100})
    assert union_size(boxes(c, "CSF", "XBC0")) == 4 * 160  # the last d_conv tokens
    # YD reads XDT at c*chunk+s over 4 chunks of 32 = 128 > 100 tokens: the tail is padding
    assert union_size(boxes(c, "YD", "XDT")) == 100 * 8 * 16


def test_reading_one_step_back_reaches_the_initial_state():
    c = parse_cascade_text("""
name: r
params: {L: 6, N: 2}
ranks: {l: L, n: N}
tensors: {H: {init: H0}, H0: {role: input}}
einsums:
  - H[l,n] = H[l-1,n] + X[l,n]
  - P[l,n] = H[l-1,n] * 2
  - Q[l,n] = H[l-2,n] * 2
""")
    assert union_size(boxes(c, "P", "H")) == 5 * 2 and union_size(boxes(c, "P", "H0")) == 2
    # H[l-2]: rows 0..3 of H, H0 at l = 1 (index -1), and zero padding at l = 0 (index -2)
    assert union_size(boxes(c, "Q", "H")) == 4 * 2 and union_size(boxes(c, "Q", "H0")) == 2


def _brute_force(cascade, acc):
    """Distinct in-range elements (and initial-state elements) by visiting every point, via sympy."""
    import itertools

    import sympy

    ranks = sorted(acc.ranks())
    syms = [sympy.Symbol(r, integer=True, nonnegative=True) for r in ranks]
    values = {sympy.Symbol(k, positive=True): v for k, v in cascade.values.items() if float(v).is_integer()}
    fns = [sympy.lambdify(syms, ix.xreplace(values), modules="math") for ix in acc.indices]
    dims = cascade.shape(acc.tensor)
    producer = cascade.einsum(acc.tensor) if cascade.producer(acc.tensor) else None
    rec = (
        producer.recurrence
        if producer is not None and producer.recurrence and producer.recurrence.init
        else None
    )
    seen, init = set(), set()
    for point in itertools.product(*(range(cascade.rank_size(r)) for r in ranks)):
        ix = tuple(int(f(*point)) for f in fns)
        if all(0 <= v < d for v, d in zip(ix, dims, strict=True)):
            seen.add(ix)
        elif rec is not None and ix[rec.position] == -1:
            rest = tuple(v for k, v in enumerate(ix) if k != rec.position)
            if all(
                0 <= v < d
                for v, d in zip(rest, (d for k, d in enumerate(dims) if k != rec.position), strict=True)
            ):
                init.add(rest)
    return len(seen), len(init)


def test_every_access_of_the_shipped_cascades_matches_brute_force():
    small = {"d_model": 16, "headdim": 8, "d_state": 4}
    for name, params in (
        ("mamba2", {**small, "seqlen": 21, "chunk": 8}),
        ("mamba1", {"d_model": 8, "seqlen": 9, "d_state": 4, "dt_rank": 2}),
    ):
        c = open_cascade(name, params=params)
        for e in c.einsums:
            for acc in accesses(e.expr):
                if acc.tensor == e.name:
                    continue
                got = {b.tensor: b.size for b in access_boxes(c, acc)}
                main, init = _brute_force(c, acc)
                assert got.get(acc.tensor, 0) == main, (name, e.name, str(acc))
                assert sum(v for t, v in got.items() if t != acc.tensor) == init, (name, e.name, str(acc))
