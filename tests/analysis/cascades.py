"""Cascades for the tests: layer chains, and hypothesis strategies of random cascades and of random legal
tiled mappings of them."""

from __future__ import annotations

import re
from typing import Any

import yaml
from hypothesis import strategies as st

from mambalaya.analysis import analyze_group, check_group
from mambalaya.cost.legality import plain_loop_order
from mambalaya.fileio import resolve_shipped
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.parse.cascade_file import cascade_from_dict, load_cascade


def chain_layers(name: str, layers: int, **params: int | float) -> Cascade:
    """``layers`` copies of a shipped layer as one cascade: layer i's OUT is layer i+1's input U."""
    path = resolve_shipped(name, "cascades")
    if layers == 1:
        return load_cascade(path, **params)
    data = yaml.safe_load(path.read_text())
    tensors = list(load_cascade(path).tensors)
    out: dict[str, Any] = {k: v for k, v in data.items() if k not in ("einsums", "tensors", "name")}
    out["name"] = f"{name}x{layers}"
    out["einsums"], out["tensors"] = [], {}
    for i in range(1, layers + 1):
        rename = {t: f"{t}L{i}" for t in tensors}
        if i > 1:
            rename["U"] = f"OUTL{i - 1}"

        def sub(text: str, rename=rename) -> str:
            return re.sub(r"\b([A-Za-z][A-Za-z0-9_]*)\[", lambda m: rename.get(m.group(1), m.group(1)) + "[", text)

        out["einsums"] += [sub(e) for e in data["einsums"]]
        for t, meta in (data.get("tensors") or {}).items():
            if i > 1 and t == "U":
                continue
            meta = dict(meta or {})
            meta.pop("source", None)
            if "init" in meta:
                meta["init"] = rename[meta["init"]]
            out["tensors"][rename[t]] = meta
    return cascade_from_dict(out, **params)


RANKS = ("i", "j", "k", "m")
UNARY = ("exp", "silu", "softplus", "sigmoid")


@st.composite
def random_cascades(draw, max_einsums: int = 6) -> dict[str, Any]:
    """A random valid cascade as a dict for ``cascade_from_dict``.

    Ranks with small sizes (some equal, so a consumer may index a producer's position with a
    different rank of the same size: private same-named ranks, RD pairs); Einsums that read 1-3
    earlier tensors element-wise, as a broadcast, a unary map, an (implicit or explicit) reduction,
    occasionally through an offset (``i-1``, ``i+1``), a halo window (``i+w-1``, ``i+w``) or a pinned index, and
    occasionally a recurrence or a prefix sum.
    """
    nranks = draw(st.integers(2, len(RANKS)))
    ranks = list(RANKS[:nranks])
    pool = {"na": draw(st.integers(1, 4)), "nb": draw(st.integers(1, 4)), "nw": 2}
    rank_map = {r: draw(st.sampled_from(["na", "nb"])) for r in ranks}  # one size symbol per pair of ranks
    rank_map["w"] = "nw"
    sizes = {r: rank_map[r] for r in ranks}  # compared symbolically, as the parser does
    params = pool
    # tensor -> its ranks (as written); inputs read with exactly these ranks
    known: dict[str, list[str]] = {}
    for t in range(draw(st.integers(1, 2))):
        known[f"I{t}"] = draw(st.lists(st.sampled_from(ranks), min_size=1, max_size=3, unique=True))
    inputs = set(known)
    einsums: list[str] = []
    n = draw(st.integers(1, max_einsums))
    for e in range(n):
        name = f"T{e}"
        out = draw(st.lists(st.sampled_from(ranks), min_size=1, max_size=3, unique=True))
        sources = draw(st.lists(st.sampled_from(sorted(known)), min_size=1, max_size=3))
        reads = []
        used: set[str] = set()
        for src in sources:
            idx = []
            for pos_rank in known[src]:
                if src in inputs:
                    idx.append(pos_rank)
                    used.add(pos_rank)
                    continue
                same = [r for r in ranks if sizes[r] == sizes[pos_rank]]
                r = draw(st.sampled_from(same))
                form = draw(st.sampled_from(["plain"] * 8 + ["offset", "halo", "pinned", "ahead", "window"]))
                if form == "offset":
                    idx.append(f"{r}-1")
                elif form == "ahead":  # a forward read: the producer must run ahead
                    idx.append(f"{r}+1")
                elif form == "halo":
                    idx.append(f"{r}+w-1")
                    used.add("w")
                elif form == "window":  # a forward window
                    idx.append(f"{r}+w")
                    used.add("w")
                elif form == "pinned":
                    idx.append(f"{rank_map[pos_rank]}-1")
                    continue
                else:
                    idx.append(r)
                used.add(r)
            reads.append(f"{src}[{','.join(idx)}]")
        missing = [r for r in out if r not in used]
        if missing:  # a broadcast needs some operand indexed by every output rank: add an input
            inp = f"I{len(inputs)}"
            known[inp] = missing
            inputs.add(inp)
            reads.append(f"{inp}[{','.join(missing)}]")
        body = " * ".join(reads)
        form = draw(st.sampled_from(["map"] * 4 + ["unary", "reduce", "recurrence", "cumsum"]))
        reducible = sorted((used - set(out)) - {"w"})
        if form == "unary":
            body = f"{draw(st.sampled_from(UNARY))}({body})"
        elif form == "reduce" and reducible:
            body = f"sum_{reducible[0]}({body})"
        elif form == "cumsum":
            body = f"cumsum_{out[0]}({body})"
        elif form == "recurrence":
            r = draw(st.sampled_from(out))
            prev = ",".join(f"{x}-1" if x == r else x for x in out)
            body = f"{body} + 0.5 * {name}[{prev}]"
        einsums.append(f"{name}[{','.join(out)}] = {body}")
        known[name] = out
    used_ranks = {r for text in einsums for r in re.findall(r"[a-z]", text.split("=", 1)[1])} | set(ranks)
    return {
        "name": "random",
        "params": params,
        "ranks": {r: rank_map[r] for r in [*ranks, "w"] if r in used_ranks},
        "einsums": einsums,
    }


@st.composite
def motif_cascades(draw) -> dict[str, Any]:
    """A cascade of one of the forms a researcher writes next, at random sizes: a grouped norm read through a
    floor and a remainder of the channel (an index composed through an inlined producer, ``(g*CG + m)//CG``); a
    relative-position (Toeplitz) read with a negative coefficient and a strided read; masks against a param; a
    nested reduction (a max of a max, a sum of a max); constants that float32 cannot hold."""
    kind = draw(st.sampled_from(["groups", "toeplitz", "mask", "nested", "constants"]))
    if kind == "groups":
        g, cg, n = draw(st.integers(1, 3)), draw(st.integers(2, 4)), draw(st.integers(2, 6))
        return {"name": "groups", "params": {"L": n, "G": g, "CG": cg}, "derived": {"CC": "G*CG"},
                "ranks": {"l": "L", "g": "G", "m": "CG", "c": "CC"},
                "tensors": {"X": {"role": "input", "shape": ["L", "CC"]}, "S": {"role": "weight", "shape": ["CG"]}},
                "einsums": ["MU[g] = mean_l(X[l,g*CG])",
                            "XC[l,c] = X[l,c] * MU[c//CG] + S[c%CG]",
                            "VR[l,g] = sum_m(XC[l,g*CG+m] * XC[l,g*CG+m])"]}
    if kind == "toeplitz":
        p, q = draw(st.integers(2, 7)), draw(st.integers(2, 7))
        return {"name": "toeplitz", "params": {"P": p, "Q": q}, "derived": {"PQ": "P+Q-1", "SQ": "2*P+Q"},
                "ranks": {"p": "P", "q": "Q"},
                "tensors": {"V": {"role": "input", "shape": ["Q"]}, "W": {"role": "weight", "shape": ["PQ"]},
                            "W2": {"role": "weight", "shape": ["SQ"]}},
                "einsums": ["T[q] = V[q] * 0.5",
                            "Y[p] = sum_q(W[p-q+Q-1] * T[q])",
                            "Y2[p] = sum_q(W2[2*p+q] * T[q])"]}
    if kind == "mask":
        n, m = draw(st.integers(2, 9)), draw(st.integers(2, 6))
        kv = draw(st.integers(0, n + m))
        return {"name": "mask", "params": {"N": n, "M": m, "kvlen": kv}, "ranks": {"n": "N", "q": "M"},
                "tensors": {"X": {"role": "input", "shape": ["N"]}, "V": {"role": "input", "shape": ["M"]}},
                "einsums": ["E[n] = exp(X[n] * 0.25) where n < kvlen",
                            "Z[n,q] = E[n] * V[q] where n + q <= kvlen",
                            "R[q] = sum_n(Z[n,q])"]}
    if kind == "nested":
        b, n, c = draw(st.integers(1, 3)), draw(st.integers(2, 6)), draw(st.integers(2, 6))
        return {"name": "nested", "params": {"B": b, "L": n, "C": c}, "ranks": {"b": "B", "l": "L", "c": "C"},
                "tensors": {"X": {"role": "input", "shape": ["B", "L", "C"]}},
                "einsums": ["MX[b] = max_l(max_c(X[b,l,c]))",
                            "SM[b] = sum_l(max_c(X[b,l,c]))",
                            "D[b,l] = max_c(X[b,l,c]) - MX[b]"]}
    n = draw(st.integers(2, 12))
    lo, hi = draw(st.sampled_from([(0.05, 1.5), (0.1, 0.3), (-0.7, 0.9)]))
    return {"name": "constants", "params": {"N": n, "lo": lo, "hi": hi}, "ranks": {"n": "N"},
            "tensors": {"X": {"role": "input", "shape": ["N"]}},
            "einsums": ["C1[n] = clamp(X[n] * 0.7, lo, hi) * 1.1 + 0.3",
                        "C2[n] = C1[n] * 0.1 - softplus(C1[n] + 0.2)"]}


@st.composite
def random_tiled_mappings(draw, max_einsums: int, buffers: tuple[int, ...], cascades=None):
    """(cascade, a legal mapping of it with random groups in cascade order and random tiles on the loops the
    analysis lets a mapping tile, a buffer size drawn from ``buffers``); cascades from ``cascades`` (a strategy of
    cascade dicts) or :func:`random_cascades`."""
    c = cascade_from_dict(draw(cascades if cascades is not None else random_cascades(max_einsums=max_einsums)))
    names = list(c.einsum_names)
    groups, i = [], 0
    while i < len(names):
        size = draw(st.integers(1, len(names) - i))
        chunk = tuple(names[i:i + size])
        if size > 1 and check_group(c, chunk):  # (an illegal group: its first Einsum alone)
            chunk = (names[i],)
        cg = analyze_group(c, chunk)
        order = plain_loop_order(cg.loop_order)
        tiles = {r.name: draw(st.integers(1, r.size - 1)) for r in cg.loops.ranks
                 if r.tiled and r.size > 1 and r.name in order and draw(st.booleans())}
        groups.append(FusionGroup(chunk, order, tiles))
        i += len(chunk)
    return c, Mapping(tuple(groups), c.name), draw(st.sampled_from(buffers))
