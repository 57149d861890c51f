"""Roofline and utilisation-over-time figures, unfused next to fused (matplotlib, Agg).

Both take cost reports (:class:`mambalaya.cost.model.CostReport`) and the arch
they were costed on, and compare mappings side by side, as the Mambalaya paper's
figures do. Output is deterministic (no timestamps, fixed hash salt) and written
atomically, so a figure only changes when the numbers do.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from mambalaya.arch import Arch  # noqa: E402
from mambalaya.arch.units import fmt_rate  # noqa: E402
from mambalaya.cost.model import CostReport, roofline  # noqa: E402
from mambalaya.fileio import write_atomic  # noqa: E402

_COMPUTE = "#1f77b4"
_MEMORY = "#ff7f0e"
_GROUP_COLOURS = plt.get_cmap("tab20").colors


def _panels(n: int, height: float) -> tuple[Figure, list]:
    fig, axes = plt.subplots(1, n, figsize=(5.6 * n, height), squeeze=False, layout="constrained")
    return fig, list(axes[0])


def roofline_figure(reports: list[tuple[str, CostReport]], arch: Arch) -> Figure:
    """One log-log panel per mapping: Einsums (small) and groups (large) under the arch's roofs.

    x is operational intensity (FLOP per off-chip byte). A group's y is its achieved
    FLOP/s (FLOP over its latency, overheads included); an Einsum's y is FLOP over
    ``max(compute_s, memory_s)``, where it sits on its own roofline (inside a fused group
    Einsums overlap, so a share of the group's time is no measure of one). An Einsum
    that moves no off-chip bytes has infinite intensity: a triangle at the right edge.
    """
    roofs = roofline(arch)
    points = [
        (r.intensity, r.flops / r.latency_s)
        for _, rep in reports
        for r in rep.groups
        if r.flops > 0 and r.latency_s > 0 and r.intensity
    ]
    points += [
        (e.intensity, _einsum_rate(e))
        for _, rep in reports
        for e in rep.einsums
        if e.flops > 0 and e.intensity
    ]
    xs = [p[0] for p in points] + [roofs["ridge_matrix"]]
    ys = [p[1] for p in points] + [roofs["matrix_flops"]]
    xmin, xmax = 10 ** math.floor(math.log10(min(xs) / 2)), 10 ** math.ceil(math.log10(max(xs) * 4))
    ymin, ymax = (
        10 ** math.floor(math.log10(min(ys) / 2)),
        10 ** math.ceil(math.log10(roofs["matrix_flops"] * 2)),
    )
    fig, axes = _panels(len(reports), 4.6)
    for ax, (title, rep) in zip(axes, reports, strict=True):
        grid = [xmin * (xmax / xmin) ** (i / 200) for i in range(201)]
        ax.plot(
            grid,
            [min(roofs["matrix_flops"], roofs["bandwidth"] * x) for x in grid],
            color="black",
            lw=1.4,
            label=f"matrix roof {roofs['matrix_flops'] / 1e12:.3g} TFLOP/s",
        )
        ax.plot(
            grid,
            [min(roofs["vector_flops"], roofs["bandwidth"] * x) for x in grid],
            color="grey",
            lw=1.0,
            ls="--",
            label=f"element-wise roof {roofs['vector_flops'] / 1e12:.3g} TFLOP/s",
        )
        colour = {g.index: _GROUP_COLOURS[g.index % len(_GROUP_COLOURS)] for g in rep.groups}
        inf_drawn = False
        for e in rep.einsums:
            if e.flops <= 0:
                continue
            y = _einsum_rate(e)
            if e.intensity:
                ax.scatter(e.intensity, y, s=16, color=colour[e.group], edgecolor="none", zorder=3)
            else:
                ax.scatter(
                    xmax / 1.6,
                    y,
                    s=22,
                    marker=">",
                    color=colour[e.group],
                    edgecolor="none",
                    zorder=3,
                    label=None if inf_drawn else "Einsum with no off-chip traffic",
                )
                inf_drawn = True
        top = sorted((g for g in rep.groups if g.flops > 0 and g.intensity), key=lambda g: -g.latency_s)[:6]
        labels: dict[tuple[int, int], tuple[float, float, list[str]]] = {}
        for g in rep.groups:
            if g.flops <= 0 or not g.intensity:
                continue
            y = g.flops / g.latency_s
            ax.scatter(
                g.intensity,
                y,
                s=70,
                marker="o",
                facecolor="none",
                edgecolor=colour[g.index],
                lw=1.6,
                zorder=4,
            )
            if g in top:  # groups that land on one spot share a label
                key = (round(math.log10(g.intensity) * 8), round(math.log10(y) * 8))
                name = g.einsums[0] if len(g.einsums) == 1 else f"{g.einsums[0]}..{g.einsums[-1]}"
                labels.setdefault(key, (g.intensity, y, []))[2].append(name)
        for i, (x, y, names) in enumerate(
            sorted(labels.values())
        ):  # alternate sides so neighbours don't collide
            ax.annotate(
                ", ".join(names),
                (x, y),
                xytext=(7, -12) if i % 2 == 0 else (7, 7),
                textcoords="offset points",
                fontsize=7,
            )
        ax.scatter([], [], s=16, color="dimgrey", label="Einsum")
        ax.scatter([], [], s=70, facecolor="none", edgecolor="dimgrey", lw=1.6, label="fusion group")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(xmin, xmax)
        ax.set_ylim(ymin, ymax)
        ax.set_xlabel("operational intensity (FLOP / off-chip byte)")
        ax.set_ylabel("achieved FLOP/s")
        ax.set_title(
            f"{title}: {len(rep.groups)} groups, {rep.traffic_bytes / 1e6:.4g} MB, "
            f"{_fmt_time(rep.latency_s)}",
            fontsize=10,
        )
        ax.grid(True, which="major", lw=0.3, alpha=0.6)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"{reports[0][1].cascade} on {arch.name}: roofline ({fmt_rate(roofs['bandwidth'])} off chip)",
        fontsize=11,
    )
    return fig


def _einsum_rate(e) -> float:
    return e.flops / max(e.compute_s, e.memory_s)


def utilisation_figure(reports: list[tuple[str, CostReport]], arch: Arch) -> Figure:
    """Compute and memory utilisation per Einsum, laid end to end by latency; group boundaries dashed.

    Utilisation is ``compute_s / latency_s`` and ``memory_s / latency_s`` of each
    Einsum's share of its group's latency, clipped at 100 % (inside a fused group an
    Einsum's work overlaps its neighbours'; the group's own level is the thin line).
    Compute is the solid fill; memory the light fill and its outline.
    """
    span = max(rep.latency_s for _, rep in reports)
    unit, scale = _time_unit(span)
    fig, axes = plt.subplots(
        len(reports),
        1,
        figsize=(11, 2.6 * len(reports) + 0.6),
        sharex=True,
        squeeze=False,
        layout="constrained",
    )
    for ax, (title, rep) in zip(axes[:, 0], reports, strict=True):
        t = 0.0
        edges, compute, memory = [0.0], [], []
        for g in rep.groups:
            members = [e for e in rep.einsums if e.group == g.index]
            g_start = t
            for e in members:
                w = e.latency_s * scale
                compute.append(min(e.compute_util, 1.0) * 100)
                memory.append(min(e.memory_util, 1.0) * 100)
                if w > 0.035 * span * scale:
                    ax.text(t + w / 2, 103, e.name, ha="center", va="bottom", fontsize=7)
                t += w
                edges.append(t)
            if len(members) > 1:
                ax.hlines([min(g.compute_util, 1) * 100], g_start, t, colors="navy", lw=0.9, ls=(0, (1, 1)))
                ax.hlines(
                    [min(g.memory_util, 1) * 100], g_start, t, colors="saddlebrown", lw=0.9, ls=(0, (1, 1))
                )
            ax.axvline(t, color="black", lw=0.6, ls=(0, (3, 3)), alpha=0.7, zorder=4)
        ax.stairs(memory, edges, fill=True, color=_MEMORY, alpha=0.3, lw=0, zorder=1)
        ax.stairs(compute, edges, fill=True, color=_COMPUTE, alpha=0.9, lw=0, zorder=2)
        ax.stairs(memory, edges, color=_MEMORY, lw=1.3, zorder=3)
        ax.set_ylim(0, 118)
        ax.set_xlim(0, span * scale * 1.01)
        ax.set_ylabel("utilisation (%)")
        ax.set_title(
            f"{title}: {len(rep.groups)} groups, {_fmt_time(rep.latency_s)}, "
            f"{rep.traffic_bytes / 1e6:.4g} MB off chip",
            fontsize=10,
            loc="left",
        )
        ax.grid(True, axis="y", lw=0.3, alpha=0.6)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=_COMPUTE, alpha=0.9),
        plt.Rectangle((0, 0), 1, 1, facecolor=(1.0, 0.5, 0.05, 0.3), edgecolor=_MEMORY, lw=1.3),
        plt.Line2D([], [], color="navy", lw=0.9, ls=(0, (1, 1))),
        plt.Line2D([], [], color="black", lw=0.6, ls=(0, (3, 3))),
    ]
    axes[0, 0].legend(
        handles,
        ["compute", "memory (off-chip bandwidth)", "fused group's level", "group boundary"],
        fontsize=7,
        loc="lower right",
        ncols=4,
        bbox_to_anchor=(1.0, 1.08),
    )
    axes[-1, 0].set_xlabel(f"time ({unit})")
    fig.suptitle(f"{reports[0][1].cascade} on {arch.name}: utilisation over time", fontsize=11)
    return fig


def _time_unit(seconds: float) -> tuple[str, float]:
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("us", 1e6)):
        if seconds * scale >= 1:
            return unit, scale
    return "ns", 1e9


def _fmt_time(seconds: float) -> str:
    unit, scale = _time_unit(seconds)
    return f"{seconds * scale:.3g} {unit}"


def figure_bytes(fig: Figure, fmt: str) -> bytes:
    """Render deterministically: no dates or software stamps, a fixed SVG hash salt."""
    metadata = {
        "png": {"Software": None},
        "svg": {"Date": None, "Creator": None},
        "pdf": {"CreationDate": None, "ModDate": None, "Creator": None, "Producer": None},
    }.get(fmt)
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "mambalaya", "svg.fonttype": "path"}):
        fig.savefig(buf, format=fmt, dpi=150, metadata=metadata)
    plt.close(fig)
    return buf.getvalue()


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write a figure atomically; the format is the file's suffix (png, svg, pdf)."""
    path = Path(path)
    write_atomic(path, figure_bytes(fig, path.suffix.lstrip(".").lower() or "png"))
    return path


def comparison_figures(
    cascade, arch: Arch, out_dir: str | Path, stem: str | None = None, mapping=None
) -> list[Path]:
    """Roofline and utilisation PNGs of unfused vs fused (``mapping``, else the greedy one)."""
    from mambalaya.cost import CostContext
    from mambalaya.mapper import evaluate, greedy_mapping

    ctx = CostContext(cascade, arch)
    unfused = evaluate(cascade, arch, ctx=ctx)
    fused = evaluate(cascade, arch, mapping or greedy_mapping(cascade, arch, ctx=ctx), ctx=ctx)
    reports = [("unfused", unfused), ("fused" if mapping else "fused (greedy)", fused)]
    out, stem = Path(out_dir), stem or f"{cascade.name}_{arch.name}"
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_roofline(reports, arch, out / f"{stem}_roofline.png"),
        plot_utilisation(reports, arch, out / f"{stem}_utilisation.png"),
    ]


def plot_roofline(reports: list[tuple[str, CostReport]], arch: Arch, path: str | Path) -> Path:
    return save_figure(roofline_figure(reports, arch), path)


def plot_utilisation(reports: list[tuple[str, CostReport]], arch: Arch, path: str | Path) -> Path:
    return save_figure(utilisation_figure(reports, arch), path)


__all__ = [
    "comparison_figures",
    "figure_bytes",
    "plot_roofline",
    "plot_utilisation",
    "roofline_figure",
    "save_figure",
    "utilisation_figure",
]
