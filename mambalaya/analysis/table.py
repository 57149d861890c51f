"""Terminal tables of an analysis: one row per edge, or per candidate group (rich, rendered to text)."""

from __future__ import annotations

from io import StringIO

from rich import box
from rich.console import Console
from rich.table import Table

from mambalaya.analysis.edges import Edge
from mambalaya.analysis.summary import Analysis


def _pairs(edge: Edge) -> str:
    return " ".join(p if p == c else f"{p}~{c}" for p, c in edge.shared) or "-"


def edge_modifiers(edge: Edge) -> str:
    """Iterative rank, halos, pinned reads, partial sums and other consumers, in a few words."""
    out = []
    if edge.iterative:
        kind = "rec" if edge.iterative.kind == "recurrence" else "prefix"
        out.append(f"iter {edge.iterative.rank} ({kind} {edge.iterative.einsum})")
    for h in edge.halos:
        arrow = {"backward": "<-", "forward": "->", "both": "<->"}[h.direction]
        out.append(f"halo {h.rank} {arrow} {h.window}")
    for m in edge.positions:
        if m.pinned:
            out.append(f"pinned {m.producer_rank}={','.join(m.pinned)}")
        if m.cross:
            out.append(f"cross {m.producer_rank}: {' & '.join(m.indices)}")
        if m.kind in ("split", "merge", "coarsen", "fine", "stride", "slice") and m.shared:
            out.append(f"{m.kind} {m.producer_rank}: {m.indices[0]}")
    if edge.partial_sums:
        out.append(f"partial sums over {','.join(edge.partial_sums)}")
    if edge.multi_consumer:
        out.append(f"also read by {','.join(edge.multi_consumer)}")
    return "; ".join(out)


def _render(table: Table, width: int) -> str:
    buf = StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False).print(table)
    return buf.getvalue()


def format_edge_table(analysis: Analysis, width: int = 200) -> str:
    """One row per producer -> tensor -> consumer edge: class, shared/private ranks, modifiers, buffer."""
    c = analysis.cascade
    index = {n: i + 1 for i, n in enumerate(c.einsum_names)}
    table = Table(title=f"fusion classes of {c.name} ({len(analysis.edges)} edges)", box=box.SIMPLE_HEAD,
                  title_justify="left")
    for col in ("producer", "consumer", "tensor", "class", "shared", "private P", "private C", "modifiers",
                "buffer (tiles)", "full"):
        table.add_column(col, overflow="fold")
    for e in analysis.edges:
        table.add_row(f"E{index[e.producer]} {e.producer}", f"E{index[e.consumer]} {e.consumer}", e.tensor,
                      e.fusion_class, _pairs(e), " ".join(e.private_producer) or "-",
                      " ".join(e.private_consumer) or "-", edge_modifiers(e) or "-", str(e.buffer),
                      str(e.buffer_full_elems))
    return _render(table, width)


def format_group_table(analysis: Analysis, legal_only: bool = True, limit: int | None = 40,
                       width: int = 200) -> str:
    """The candidate groups, largest first: legality (or why not), loop order, buffer need."""
    groups = [g for g in analysis.groups if g.legal or not legal_only]
    groups.sort(key=lambda g: (-len(g.einsums), g.einsums))
    shown = groups[:limit] if limit is not None else groups
    c = analysis.cascade
    title = (f"fusion groups of {c.name}: {len(analysis.legal_groups)} legal of {len(analysis.groups)} "
             f"candidates (showing {len(shown)})")
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("einsums", "legal", "loop order", "buffer (tiles)", "full bytes", "off-chip reads", "writes"):
        table.add_column(col, overflow="fold")
    for g in shown:
        legal = "yes" if g.legal else "no: " + "; ".join(g.reasons)
        table.add_row(" ".join(g.einsums), legal, " ".join(g.loop_order), str(g.buffer), str(g.buffer_full_bytes),
                      " ".join(g.reads), " ".join(g.writes))
    return _render(table, width)
