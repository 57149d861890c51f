"""Render a cascade as a dataflow graph (Graphviz ``dot``): SVG, PDF or PNG.

In the spirit of the Mambalaya paper's cascade figure: every tensor is a
rounded box labelled with its name, ranks and bound shape; a tensor an Einsum
writes carries the Einsum's number (cascade order) and a short form of its
right-hand side, and is coloured by the Einsum's kind (GEMM with a weight,
recurrence, reduction, element-wise, unary nonlinear); inputs and weights have
their own colours. Edges between Einsums are labelled with their fusion class
(and iterative / halo modifiers). Given a mapping, each fusion group is a
cluster (``cluster_<i>``). Output is deterministic: everything is emitted in
cascade order, and the PDF creation date is pinned.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import graphviz

from mambalaya.analysis import KINDS, Analysis, Edge, GroupAnalyzer, classify_edges, einsum_kind
from mambalaya.errors import MambalayaError
from mambalaya.fileio import write_atomic
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.expr import Access, BinOp, Call, Const, Node, ParamRef, Reduce
from mambalaya.ir.mapping import Mapping

FORMATS = ("svg", "pdf", "png")
FONT = "DejaVu Sans"

#: Fill colours by Einsum kind, and by role for tensors no Einsum writes.
KIND_COLOURS = {
    "gemm": "#f6c89f",
    "recurrent": "#ec9a9a",
    "reduction": "#f5e3a0",
    "elementwise": "#c9e5bf",
    "unary": "#dac8ee",
}
ROLE_COLOURS = {"input": "#cfe2f3", "weight": "#e6e6e6"}
CLASS_COLOURS = {"RI": "#222222", "RSb": "#1f5fa8", "RSp": "#2e7d32", "RD": "#b3261e"}
CLASS_TEXT = {
    "RI": "RI rank-isomorphic",
    "RSb": "RSb producer has private ranks",
    "RSp": "RSp consumer has private ranks",
    "RD": "RD both have private ranks",
}
GROUP_COLOURS = ("#4a6fa5", "#a5574a", "#4a9a6f", "#8a5aa5", "#a58a4a", "#4a94a5")
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def short_expr(node: Node, limit: int = 36) -> str:
    """A compact right-hand side: tensors by name, no indices (``softplus(DT0 + dtb)``)."""
    text = _short(node)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short(node: Node, parent: int = 0) -> str:
    if isinstance(node, Access):
        return node.tensor
    if isinstance(node, Const):
        v = node.value
        return str(int(v)) if float(v).is_integer() else f"{v:g}"
    if isinstance(node, ParamRef):
        return node.name
    if isinstance(node, Call):
        return f"{node.fn}({', '.join(_short(a) for a in node.args)})"
    if isinstance(node, Reduce):
        return f"{node.op}_{node.rank}({_short(node.arg)})"
    if isinstance(node, BinOp):
        prec = _PREC[node.op]
        text = f"{_short(node.lhs, prec)} {node.op} {_short(node.rhs, prec + (node.op in '-/'))}"
        return f"({text})" if prec < parent else text
    return str(node)


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "×".join(str(s) for s in shape) if shape else "scalar"


def _tensor_ranks(cascade: Cascade, name: str) -> str:
    spec = cascade.tensors[name]
    parts = [r if r else str(s).replace(" ", "") for r, s in zip(spec.rank_names, spec.shape, strict=True)]
    return "[" + ",".join(parts) + "]"


def _node_id(tensor: str) -> str:
    return f"t_{tensor}"


def _edge_label(edge: Edge) -> str:
    parts = [edge.fusion_class]
    if edge.iterative is not None:
        parts.append(f"iter {edge.iterative.rank}")
    for h in edge.halos:
        parts.append(f"halo {h.rank}:{h.size}")
    return " · ".join(parts)


def _legend(cascade: Cascade, used_kinds: list[str], used_classes: list[str]) -> str:
    rows = ['<TR><TD COLSPAN="2" ALIGN="LEFT"><B>legend</B></TD></TR>']
    for role in ("input", "weight"):
        rows.append(f'<TR><TD BGCOLOR="{ROLE_COLOURS[role]}" WIDTH="18"> </TD>'
                    f'<TD ALIGN="LEFT">{role}</TD></TR>')
    for kind in used_kinds:
        rows.append(f'<TR><TD BGCOLOR="{KIND_COLOURS[kind]}" WIDTH="18"> </TD>'
                    f'<TD ALIGN="LEFT">{_esc(KINDS[kind])}</TD></TR>')
    for cls in used_classes:
        rows.append(f'<TR><TD><FONT COLOR="{CLASS_COLOURS[cls]}"><B>—</B></FONT></TD>'
                    f'<TD ALIGN="LEFT"><FONT COLOR="{CLASS_COLOURS[cls]}">{_esc(CLASS_TEXT[cls])}</FONT></TD></TR>')
    rows.append('<TR><TD BGCOLOR="#333333"><FONT COLOR="white"><B>n</B></FONT></TD>'
                '<TD ALIGN="LEFT">Einsum number (cascade order)</TD></TR>')
    return ('<<TABLE BORDER="1" COLOR="#999999" CELLBORDER="0" CELLSPACING="2" CELLPADDING="2">'
            + "".join(rows) + "</TABLE>>")


def cascade_graph(cascade: Cascade, mapping: Mapping | None = None, analysis: Analysis | None = None,
                  show_weights: bool = True, rankdir: str = "TB") -> graphviz.Digraph:
    """The dataflow graph of a cascade (tensors as nodes), clustered by the mapping's fusion groups."""
    edges = analysis.edges if analysis is not None else classify_edges(cascade)
    if mapping is not None:
        mapping.validate(cascade)
    title = f"{cascade.name}: " + ", ".join(f"{k}={v}" for k, v in sorted(cascade.params.items()))
    g = graphviz.Digraph(name=cascade.name, engine="dot")
    g.attr(rankdir=rankdir, fontname=FONT, fontsize="16", label=_esc(title), labelloc="t", nodesep="0.25",
           ranksep="0.45", newrank="true", bgcolor="white", pad="0.2")
    g.attr("node", fontname=FONT, fontsize="11", shape="box", style="rounded,filled", margin="0.06,0.03",
           penwidth="1.0")
    g.attr("edge", fontname=FONT, fontsize="9", arrowsize="0.6", penwidth="1.0")

    index = {e.name: i + 1 for i, e in enumerate(cascade.einsums)}
    kinds = {e.name: einsum_kind(cascade, e) for e in cascade.einsums}
    sources = [t for e in cascade.einsums for t in e.reads if cascade.producer(t) is None]
    sources = list(dict.fromkeys(sources))
    if not show_weights:
        sources = [t for t in sources if cascade.tensors[t].role != "weight"]

    def source_node(target: graphviz.Digraph, t: str) -> None:
        spec = cascade.tensors[t]
        label = (f'<<B>{_esc(t)}</B>{_esc(_tensor_ranks(cascade, t))}<BR/>'
                 f'<FONT POINT-SIZE="9" COLOR="#555555">{_esc(spec.role)} {_shape_text(cascade.shape(t))}</FONT>>')
        target.node(_node_id(t), label=label, fillcolor=ROLE_COLOURS.get(spec.role, "#ffffff"),
                    fontsize="10", tooltip=_esc(f"{t}: {spec.role}"))

    def einsum_node(target: graphviz.Digraph, name: str) -> None:
        e = cascade.einsum(name)
        spec = cascade.tensors[name]
        rhs = short_expr(e.expr) + (" where …" if e.where else "")
        label = ('<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">'
                 f'<TR><TD ROWSPAN="3" BGCOLOR="#333333"><FONT COLOR="white"><B> {index[name]} </B></FONT></TD>'
                 f'<TD ALIGN="LEFT"> <B>{_esc(name)}</B>{_esc(_tensor_ranks(cascade, name))}</TD></TR>'
                 f'<TR><TD ALIGN="LEFT"><FONT POINT-SIZE="9"> = {_esc(rhs)}</FONT></TD></TR>'
                 f'<TR><TD ALIGN="LEFT"><FONT POINT-SIZE="8" COLOR="#555555"> '
                 f'{_shape_text(cascade.shape(name))}{" · output" if spec.role == "output" else ""}'
                 '</FONT></TD></TR></TABLE>>')
        target.node(_node_id(name), label=label, fillcolor=KIND_COLOURS[kinds[name]],
                    penwidth="2.0" if spec.role == "output" else "1.0", tooltip=_esc(e.text))

    for t in sources:
        source_node(g, t)
    if mapping is None:
        for e in cascade.einsums:
            einsum_node(g, e.name)
    else:
        analyzer = GroupAnalyzer(cascade, edges)
        for i, group in enumerate(mapping.groups):
            cand = analyzer.analyze(group.einsums)
            status = "legal" if cand.legal else "ILLEGAL"
            order = ",".join(group.loop_order or cand.loop_order)
            label = f"G{i} · {status}" + (f" · loop {order}" if order and len(group.einsums) > 1 else "")
            colour = GROUP_COLOURS[i % len(GROUP_COLOURS)] if cand.legal else "#d00000"
            with g.subgraph(name=f"cluster_{i}") as sub:
                sub.attr(label=_esc(label), style="rounded,dashed", color=colour, fontcolor=colour,
                         fontsize="10", labeljust="l", penwidth="1.6", margin="10")
                for name in group.einsums:
                    einsum_node(sub, name)

    shown = set(sources)
    for e in cascade.einsums:
        for t in e.reads:
            if t in shown and cascade.producer(t) is None:
                style = "dashed" if e.recurrence is not None and t == e.recurrence.init else "solid"
                g.edge(_node_id(t), _node_id(e.name), color="#9a9a9a", style=style)
    for edge in edges:
        colour = CLASS_COLOURS[edge.fusion_class]
        g.edge(_node_id(edge.producer), _node_id(edge.consumer), label=_esc(_edge_label(edge)), color=colour,
               fontcolor=colour, penwidth="1.4")
    for e in cascade.einsums:
        if e.recurrence is not None:
            g.edge(_node_id(e.name), _node_id(e.name), label=_esc(f"{e.recurrence.rank}-1"), color="#b04040",
                   fontcolor="#903030", penwidth="1.4")

    used_kinds = [k for k in KINDS if k in kinds.values()]
    used_classes = [c for c in CLASS_COLOURS if any(e.fusion_class == c for e in edges)]
    g.node("legend", label=_legend(cascade, used_kinds, used_classes), shape="plaintext", style="",
           fontsize="10")
    return g


def render_bytes(cascade: Cascade, fmt: str, mapping: Mapping | None = None, analysis: Analysis | None = None,
                 **options) -> bytes:
    """The rendered graph in ``svg``, ``pdf`` or ``png``, deterministic for the same input."""
    if fmt not in FORMATS:
        raise MambalayaError(f"cannot render to '.{fmt}': use one of {', '.join('.' + f for f in FORMATS)}")
    graph = cascade_graph(cascade, mapping, analysis, **options)
    data = graph.pipe(format=fmt, engine="dot", **({"renderer": "cairo"} if fmt == "png" else {}))
    if fmt == "pdf":  # cairo stamps the creation time: pin it (same length, so offsets stay valid)
        data = re.sub(rb"/CreationDate \(D:\d{14}", b"/CreationDate (D:20000101000000", data)
    return data


def render_cascade(cascade: Cascade, path: str | Path, mapping: Mapping | None = None,
                   analysis: Analysis | None = None, **options) -> Path:
    """Write the cascade's dataflow graph to ``path`` (format from the suffix: .svg, .pdf or .png)."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    data = render_bytes(cascade, fmt, mapping, analysis, **options)
    write_atomic(path, data)
    return path
