"""Figures are written, deterministic and of the expected kind."""

from __future__ import annotations

from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.mapper import evaluate
from mambalaya.report.plots import figure_bytes, plot_roofline, plot_utilisation, roofline_figure


def test_roofline_and_utilisation_pngs(tmp_path, scan, tiny):
    unfused = evaluate(scan, tiny)
    fused = evaluate(scan, tiny, Mapping((FusionGroup(("DA", "H", "Y", "Z", "HF")),)))
    reports = [("unfused", unfused), ("fused", fused)]
    for plot, name in ((plot_roofline, "roof.png"), (plot_utilisation, "util.png")):
        path = plot(reports, tiny, tmp_path / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["roof.png", "util.png"]  # no temp debris
    a = figure_bytes(roofline_figure(reports, tiny), "svg")
    b = figure_bytes(roofline_figure(reports, tiny), "svg")
    assert a == b
