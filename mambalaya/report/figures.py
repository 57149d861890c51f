"""The report's figures as bytes (nothing touches disk here, so the report can write them atomically)."""

from __future__ import annotations

import re

from mambalaya.report.content import ArchStudy, Study
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
    """Latency and traffic, unfused next to optimal, one pair of bars per arch (log scale: archs differ 1000×)."""
    import matplotlib.pyplot as plt

    names = [a.arch.name for a in s.archs]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    xs = range(len(names))
    most = max(a.unfused.latency_s for a in s.archs)  # (the axis in the unit its largest bar reads in: s, ms, µs)
    unit, per = next(((u, f) for u, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)) if most >= f), ("ns", 1e-9))
    for ax, key, label, scale in ((axes[0], "latency_s", f"latency ({unit})", 1 / per),
                                  (axes[1], "traffic_bytes", "off-chip traffic (MiB)", 2.0**-20)):
        un = [getattr(a.unfused, key) * scale for a in s.archs]
        op = [getattr(a.report, key) * scale for a in s.archs]
        ax.bar([x - 0.2 for x in xs], un, 0.4, label="unfused", color="#b0b7c3")
        ax.bar([x + 0.2 for x in xs], op, 0.4, label="optimal fused", color="#2f6db5")
        for x, u, o in zip(xs, un, op, strict=True):
            if o > 0:
                ax.annotate(f"{u / o:.2f}×", (x + 0.2, o), xytext=(0, 3), textcoords="offset points",
                            ha="center", fontsize=8)
        ax.set_xticks(list(xs), names)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(True, axis="y", which="major", lw=0.3, alpha=0.6)
        ax.legend(fontsize=8)
    fig.suptitle(f"{s.cascade.name}: optimal fusion vs unfused, per architecture", fontsize=11)
    return figure_bytes(fig, "png")


def inline_svg(svg: bytes) -> str:
    """Graphviz SVG ready to sit inside HTML: no XML prolog or DOCTYPE, scaled to the page width."""
    text = svg.decode()
    text = re.sub(r"<\?xml[^>]*\?>\s*", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)
    text = re.sub(r"<!--.*?-->\s*", "", text, flags=re.S)
    return re.sub(r'<svg width="[^"]*" height="[^"]*"', '<svg class="graph"', text, count=1)


__all__ = ["arch_figures", "comparison_figure", "inline_svg"]
