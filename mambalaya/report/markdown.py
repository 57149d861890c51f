"""``report.md``: the study as GitHub-flavoured Markdown, figures referenced as files beside it."""

from __future__ import annotations

from mambalaya.report.content import (
    Study,
    Table,
    codegen_table,
    comparison_table,
    edges_table,
    einsum_table,
    einsums_table,
    groups_table,
    params_table,
    ranks_table,
    tensors_table,
    totals_table,
    why,
)


def md_table(t: Table) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    align = [("---:" if t.numeric and t.numeric[i] else "---") for i in range(len(t.columns))]
    lines = ["| " + " | ".join(cell(c) for c in t.columns) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def render_markdown(s: Study, files: dict[str, list[str]]) -> str:
    """The whole report; ``files`` maps each arch to the files written for it (relative paths)."""
    c = s.cascade
    archs = ", ".join(a.arch.name for a in s.archs)
    out = [
        f"# Fusion report: {c.name} on {archs}",
        "",
        f"{c.meta.get('description', '')}. Objective: **{s.objective}**. "
        f"{len(c.einsums)} Einsums, {len(s.edges)} producer→consumer edges.",
        "",
        "## Headline",  # (first: what a reader opened the report for; the cascade's tables come last)
        "",
        md_table(comparison_table(s)),
        "",
        *(["![comparison](comparison.png)", ""] if len(s.archs) > 1 else []),
    ]
    for a in s.archs:
        n = a.arch.name
        out += [
            f"## {n}",
            "",
            f"{a.arch.description}".strip(),
            "",
            "### Why this mapping",
            "",
            *[f"- {line}" for line in why(s, a)],
            "",
            "### Fusion groups",
            "",
            md_table(groups_table(s, a)),
            "",
            "### Totals against unfused",
            "",
            md_table(totals_table(a)),
            "",
            *(["### GPU kernels (`--backend triton`)", "", md_table(gpu), ""]
              if (gpu := codegen_table(s, a)) is not None else []),
            "### Per Einsum",
            "",
            md_table(einsum_table(a)),
            "",
            f"### Figures ({n})",
            "",
            f"![{n} cascade with fusion groups]({n}/cascade.svg)",
            "",
            f"![{n} roofline]({n}/roofline.png)",
            "",
            f"![{n} utilisation over time]({n}/utilisation.png)",
            "",
            "Files: " + ", ".join(f"[{f}]({f})" for f in files[n]),
            "",
        ]
    out += ["## Cascade", ""]
    for title, table in (("Parameters", params_table), ("Ranks", ranks_table), ("Einsums", einsums_table),
                         ("Tensors", tensors_table)):
        out += [f"### {title}", "", md_table(table(c)), ""]
    out += [
        "## Fusion classes",
        "",
        "RI rank-isomorphic, RSb only the producer has private ranks, RSp only the consumer has, "
        "RD both have.",
        "",
        md_table(edges_table(s)),
        "",
    ]
    return "\n".join(out)


__all__ = ["md_table", "render_markdown"]
