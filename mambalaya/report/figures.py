"""The report's figures as bytes (nothing touches disk here, so the report can write them atomically)."""

from __future__ import annotations

import re

from mambalaya.report.content import ArchStudy, Study
from mambalaya.report.fmt import fmt_bytes, fmt_change, fmt_time
from mambalaya.report.plots import figure_bytes, roofline_figure, utilisation_figure
from mambalaya.report.render import render_bytes


def arch_figures(s: Study, a: ArchStudy) -> dict[str, bytes]:
    """``cascade.svg`` (fusion groups as clusters), ``roofline.png``, ``utilisation.png`` for one arch."""
    reports = [("unfused", a.unfused), ("optimal", a.report)]
    return {
        "cascade.svg": render_bytes(s.cascade, "svg", mapping=a.result.mapping),
        "roofline.png": figure_bytes(roofline_figure(reports, a.arch), "png"),
        "utilisation.png": figure_bytes(utilisation_figure(reports, a.arch), "png"),
    }


def comparison_figure(s: Study) -> bytes:
    """:func:`comparison_axes` as PNG."""
    return figure_bytes(comparison_axes(s), "png")


def comparison_axes(s: Study):
    """Latency and traffic of the optimal fusion as a share of each arch's unfused (1.0), one pair of bars per arch
    on a linear axis from zero, so a bar's length is the ratio it reads (archs differ 1000x in absolute terms:
    those figures are under each arch's name, not in the bars)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    xs = range(len(s.archs))
    for ax, key, label, fmt in ((axes[0], "latency_s", "latency", fmt_time),
                                (axes[1], "traffic_bytes", "off-chip traffic", fmt_bytes)):
        un = [float(getattr(a.unfused, key)) for a in s.archs]
        op = [float(getattr(a.report, key)) for a in s.archs]
        share = [o / u if u > 0 else 0.0 for u, o in zip(un, op, strict=True)]
        ax.bar([x - 0.2 for x in xs], [1.0] * len(share), 0.4, label="unfused", color="#b0b7c3")
        ax.bar([x + 0.2 for x in xs], share, 0.4, label="optimal fused", color="#2f6db5")
        for x, u, o, f in zip(xs, un, op, share, strict=True):
            if o > 0:
                ax.annotate(fmt_change(u, o, "less", "more"), (x + 0.2, f), xytext=(0, 3),
                            textcoords="offset points", ha="center", fontsize=8)
        ax.set_xticks(list(xs), [f"{a.arch.name}\n{fmt(u)} → {fmt(o)}" for a, u, o in zip(s.archs, un, op,
                                                                                          strict=True)], fontsize=8)
        ax.set_ylim(0, max(1.0, *share) * 1.15)
        ax.set_ylabel(f"{label}, share of unfused")
        ax.grid(True, axis="y", lw=0.3, alpha=0.6)
        ax.legend(fontsize=8)
    fig.suptitle(f"{s.cascade.name}: optimal fusion vs unfused, per architecture", fontsize=11)
    return fig


def inline_svg(svg: bytes) -> str:
    """Graphviz SVG ready to sit inside HTML: no XML prolog or DOCTYPE, scaled to the page width."""
    text = svg.decode()
    text = re.sub(r"<\?xml[^>]*\?>\s*", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)
    text = re.sub(r"<!--.*?-->\s*", "", text, flags=re.S)
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg class="graph"', text, count=1)


__all__ = ["arch_figures", "comparison_axes", "comparison_figure", "inline_svg"]
