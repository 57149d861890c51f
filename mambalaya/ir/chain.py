"""Whole models as one cascade: ``chain_layers`` concatenates copies of a layer.

A pure IR transform (no stage beyond ``ir`` is touched): layer ``k``'s tensors
are renamed ``NAME_L{k}`` so every layer has its own weights, inputs and
states, and layer ``k``'s main output feeds layer ``k+1``'s main input. The
chained cascade is an ordinary :class:`Cascade`, so cross-layer fusion (the
out_proj of one layer with the in_proj of the next) is in the mapper's space.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from mambalaya.errors import CascadeError
from mambalaya.ir.cascade import Cascade, Einsum, TensorSpec
from mambalaya.ir.expr import Access, BinOp, Call, Node, Reduce, rank_symbol

SEP = "_L"


def layer_name(tensor: str, layer: int) -> str:
    """The chained name of a layer's tensor (``X0`` of layer 3 is ``X0_L3``)."""
    return f"{tensor}{SEP}{layer}"


def split_layer_name(name: str) -> tuple[str, int | None]:
    """``X0_L3`` -> ``("X0", 3)``; a name without a layer suffix -> ``(name, None)``."""
    base, sep, k = name.rpartition(SEP)
    return (base, int(k)) if sep and k.isdigit() else (name, None)


def main_feed(cascade: Cascade) -> tuple[str, str]:
    """The (output, input) pair that chains a layer into the next.

    The pair whose sizes agree (an activation of the same shape, size-1 ranks
    aside); recurrence initial states never count as the main input. Ambiguity
    falls back to the Mamba convention ``OUT -> U`` or asks for ``feed=``.
    """
    inits = {e.recurrence.init for e in cascade.einsums if e.recurrence and e.recurrence.init}
    ins = [n for n, t in cascade.tensors.items() if t.role == "input" and n not in inits]
    outs = cascade.outputs()
    pairs = [(o, i) for o in outs for i in ins if _squeezed(cascade, o) == _squeezed(cascade, i)]
    if len(pairs) == 1:
        return pairs[0]
    if ("OUT", "U") in pairs:
        return ("OUT", "U")
    raise CascadeError(f"cannot tell which output of '{cascade.name}' feeds the next layer's input "
                       f"(candidates: {pairs or 'none'}): pass feed=(output, input)")


def _squeezed(cascade: Cascade, tensor: str) -> tuple[int, ...]:
    return tuple(s for s in cascade.shape(tensor) if s != 1)


def _rename_node(node: Node, ren: dict[str, str]) -> Node:
    if isinstance(node, Access):
        return Access(ren.get(node.tensor, node.tensor), node.indices)
    if isinstance(node, Call):
        return Call(node.fn, tuple(_rename_node(a, ren) for a in node.args))
    if isinstance(node, BinOp):
        return BinOp(node.op, _rename_node(node.lhs, ren), _rename_node(node.rhs, ren))
    if isinstance(node, Reduce):
        return Reduce(node.op, node.rank, _rename_node(node.arg, ren))
    return node


def _rename_einsum(e: Einsum, ren: dict[str, str]) -> Einsum:
    rec = e.recurrence
    if rec is not None and rec.init:
        rec = replace(rec, init=ren.get(rec.init, rec.init))
    text = f"{Access(ren[e.name], e.output.indices)} = {_rename_node(e.expr, ren)}"
    if e.where:
        text += " where " + " and ".join(map(str, e.where))
    return Einsum(Access(ren[e.name], e.output.indices), _rename_node(e.expr, ren), e.where, text, e.line, rec)


def _adapter(cascade: Cascade, out: str, inp: str, k: int) -> Einsum | None:
    """An Einsum copying layer k-1's output into layer k's input when their shapes differ by size-1 ranks."""
    if cascade.shape(out) == cascade.shape(inp):
        return None
    spec_in = cascade.tensors[inp]
    ranks = [r or f"z{i}" for i, r in enumerate(spec_in.rank_names)]
    if len(set(ranks)) != len(ranks) or any(r not in cascade.rank_exprs for r in ranks):
        raise CascadeError(f"cannot adapt {out}{list(cascade.shape(out))} to {inp}{list(cascade.shape(inp))}")
    keep = iter([rank_symbol(r) for r, s in zip(ranks, cascade.shape(inp), strict=True) if s != 1])
    lhs = Access(layer_name(inp, k), tuple(rank_symbol(r) for r in ranks))
    rhs = Access(layer_name(out, k - 1), tuple(sympy.Integer(0) if s == 1 else next(keep)
                                                for s in cascade.shape(out)))
    return Einsum(lhs, rhs, (), f"{lhs} = {rhs}")


def chain_layers(cascade: Cascade, n: int, feed: tuple[str, str] | None = None) -> Cascade:
    """``n`` copies of a layer cascade, layer k's ``feed[0]`` feeding layer k+1's ``feed[1]``."""
    if n < 1:
        raise CascadeError(f"chain_layers needs at least one layer, got {n}")
    out, inp = feed or main_feed(cascade)
    for t, role in ((out, "output"), (inp, "input")):
        if t not in cascade.tensors or cascade.tensors[t].role != role:
            raise CascadeError(f"feed tensor '{t}' is not an {role} of cascade '{cascade.name}'")
    if _squeezed(cascade, out) != _squeezed(cascade, inp):
        raise CascadeError(f"feed {out}{list(cascade.shape(out))} -> {inp}{list(cascade.shape(inp))}: shapes differ")
    direct = cascade.shape(out) == cascade.shape(inp)
    tensors: dict[str, TensorSpec] = {}
    einsums: list[Einsum] = []
    for k in range(n):
        ren = {t: layer_name(t, k) for t in cascade.tensors}
        if k > 0 and direct:
            ren[inp] = layer_name(out, k - 1)
        for t, spec in cascade.tensors.items():
            if ren[t] != layer_name(t, k):
                continue  # the fed input is the previous layer's output
            role = spec.role
            if k > 0 and t == inp:
                role = "intermediate"  # written by the adapter Einsum
            if k < n - 1 and t == out:
                role = "intermediate"
            tensors[ren[t]] = replace(spec, name=ren[t], role=role)
        if k > 0 and not direct:
            ad = _adapter(cascade, out, inp, k)
            assert ad is not None
            einsums.append(ad)
        einsums.extend(_rename_einsum(e, ren) for e in cascade.einsums)
    meta = {**cascade.meta, "layers": n, "layer_cascade": cascade.name, "feed": [out, inp]}
    return replace(cascade, name=f"{cascade.name}x{n}", tensors=tensors, einsums=tuple(einsums), meta=meta)
