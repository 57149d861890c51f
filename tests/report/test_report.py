"""mambalaya report: folder layout, HTML structure, Markdown content, mapping.json, atomic failure modes."""

from __future__ import annotations

import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from mambalaya.cli import main
from mambalaya.ir.mapping import load_mapping
from mambalaya.parse import open_cascade

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")

ARGS = ["mamba1", "--set", "seqlen=16", "--arch", "mambalaya", "--arch", "h200"]


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.title = ""
        self.sections: list[str] = []
        self.h2: list[str] = []
        self.imgs: list[str] = []
        self.links: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "section":
            self.sections.append(a.get("id", ""))
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        if tag == "link" or (tag == "script" and a.get("src")):
            self.links.append(a.get("href") or a.get("src"))
        if tag in ("title", "h2"):
            self._in = tag

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in == "title":
            self.title += data
        elif self._in == "h2":
            self.h2.append(data.strip())


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rep") / "report"
    assert main(["report", *ARGS, "-o", str(out)]) == 0
    return out


def test_layout(report_dir):
    names = sorted(str(p.relative_to(report_dir)) for p in report_dir.rglob("*") if p.is_file())
    want = {"report.md", "report.html", "report.json", "comparison.png"}  # (each arch's mapping.json in its folder)
    for arch in ("mambalaya", "h200"):
        want |= {f"{arch}/{f}" for f in ("mapping.json", "einsums.csv", "groups.csv", "cascade.svg", "roofline.png",
                                          "utilisation.png")}
    assert set(names) == want
    assert not [p for p in report_dir.parent.iterdir() if p.name.startswith(".")]  # no temporary siblings


def test_html_structure(report_dir):
    text = (report_dir / "report.html").read_text()
    page = _Page()
    page.feed(text)
    assert page.title.startswith("Fusion report: mamba1 on mambalaya, h200")
    # the headline first (the first screen says what fusion buys on each arch), the cascade's tables last
    assert page.sections == ["headline", "arch-mambalaya", "arch-h200", "cascade", "fusion-classes"]
    assert page.tags.count("table") >= 12 and page.tags.count("svg") == 2
    assert page.imgs and all(src.startswith("data:image/png;base64,") for src in page.imgs)
    assert len(page.imgs) == 5 and not page.links  # self-contained: no external assets
    for word in ("RSb", "RSp", "RD", "Why this mapping", "Per Einsum", "speedup"):
        assert word in text


def test_markdown_and_csv(report_dir):
    md = (report_dir / "report.md").read_text()
    for heading in ("# Fusion report: mamba1", "## Cascade", "### Ranks", "## Fusion classes", "## Headline",
                    "## mambalaya", "## h200", "### Why this mapping", "### Fusion groups",
                    "### Totals against unfused", "### Per Einsum"):
        assert heading in md, heading
    headline = md[md.index("## Headline"):md.index("## mambalaya")]
    assert md.index("## Headline") < md.index("## Cascade") and "speedup" in headline and "proven optimal" in headline
    for ref in [line.split("](")[1].rstrip(")") for line in md.splitlines() if line.startswith("![")]:
        assert (report_dir / ref).is_file(), ref
    rows = pd.read_csv(report_dir / "mambalaya" / "einsums.csv")
    assert list(rows.columns[:10]) == ["einsum", "group", "traffic_bytes", "memory_s", "compute_s", "latency_s",
                                       "compute_util", "memory_util", "intensity", "bound"]
    cascade = open_cascade("mamba1", params={"seqlen": 16})
    assert list(rows["einsum"]) == list(cascade.einsum_names)


def test_mapping_json_loads_and_validates(report_dir):
    cascade = open_cascade("mamba1", params={"seqlen": 16})
    top = load_mapping(report_dir / "mambalaya" / "mapping.json").validate(cascade)
    assert top.arch == "mambalaya"
    assert load_mapping(report_dir / "h200" / "mapping.json").validate(cascade).arch == "h200"
    summary = json.loads((report_dir / "report.json").read_text())
    assert [a["arch"] for a in summary["archs"]] == ["mambalaya", "h200"]
    assert summary["archs"][0]["groups"] == top.group_lists


def test_rerun_replaces_an_earlier_report(report_dir, tmp_path):
    out = tmp_path / "r"
    assert main(["report", "mlp2", "--arch", "marca", "-o", str(out)]) == 0
    (out / "stale.txt").write_text("old")
    assert main(["report", "mlp2", "--arch", "mambalaya", "-o", str(out)]) == 0
    assert not (out / "stale.txt").exists() and (out / "mambalaya" / "mapping.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def _assert_untouched(parent: Path, before: list[str]) -> None:
    assert sorted(p.name for p in parent.iterdir()) == before


def test_infeasible_arch_is_exit_2_and_writes_nothing(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    text = (Path(__file__).resolve().parents[2] / "archs" / "mambalaya.yaml").read_text()
    spec.write_text(text)
    from mambalaya.arch import load_arch

    arch = load_arch(spec).with_overrides(fusion_buffer_bytes=1)
    from mambalaya.errors import MambalayaError
    from mambalaya.report.report import write_report

    with pytest.raises(MambalayaError, match="no mapping fits a 1 B buffer"):
        write_report(open_cascade("mlp2"), [arch], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    _assert_untouched(tmp_path, ["tiny.yaml"])


def test_unwritable_or_invalid_output(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "keep.txt").write_text("mine")
    cases = [
        (tmp_path / "file" / "out", "not a folder"),
        (tmp_path / "file", "not a folder"),
        (tmp_path / "docs", "non-empty folder that holds no report"),
    ]
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        cases.append((ro / "out", "not writable"))
    before = sorted(p.name for p in tmp_path.iterdir())
    for out, message in cases:
        assert main(["report", "mlp2", "--arch", "mambalaya", "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    _assert_untouched(tmp_path, before)
    assert (tmp_path / "docs" / "keep.txt").read_text() == "mine"


def test_missing_folders_are_made(tmp_path):
    """The README's main command writes to out/mamba2 on a fresh clone, where out/ does not exist yet."""
    out = tmp_path / "out" / "sub" / "report"
    assert main(["report", "mlp2", "--arch", "mambalaya", "-o", str(out)]) == 0
    assert (out / "report.html").is_file()
    assert [p.name for p in (tmp_path / "out" / "sub").iterdir()] == ["report"]


def test_unknown_arch_and_duplicate(tmp_path, capsys):
    assert main(["report", "mlp2", "--arch", "nope", "-o", str(tmp_path / "o")]) == 2
    assert "unknown arch" in capsys.readouterr().err
    assert main(["report", "mlp2", "--arch", "h200", "--arch", "h200", "-o", str(tmp_path / "o")]) == 2
    assert "twice" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_gpu_archs_say_how_each_group_runs_as_triton_kernels() -> None:
    """On h200 the report names each group's generated kernel (grid, programs) or why it falls back;
    other archs have no such section."""
    from dataclasses import replace

    from mambalaya.ir.mapping import FusionGroup, Mapping
    from mambalaya.mapper import evaluate
    from mambalaya.report.content import codegen_table, study

    c = open_cascade("mlp2")
    s = study(c, ["h200", "imax3"])
    gpu, cgla = s.archs
    rows = codegen_table(s, gpu).rows
    assert [r[0] for r in rows] == [str(i) for i in range(len(gpu.result.mapping.groups))]
    assert all(r[2] == "one Triton kernel" and int(r[4].split()[0].replace(",", "")) >= 1 for r in rows)
    assert codegen_table(s, cgla) is None
    # a recompute group is one kernel too (the printer reads the schedule, which holds the recomputation)
    recompute = Mapping((FusionGroup(("T",)), FusionGroup(("R", "Y"), recompute=("T",))), c.name)
    report = evaluate(c, gpu.arch, recompute)
    rows = codegen_table(s, replace(gpu, result=replace(gpu.result, mapping=recompute, report=report))).rows
    assert [r[1] for r in rows] == ["T", "R + Y"] and rows[1][2] == "one Triton kernel"


def test_report_markdown_has_the_gpu_kernel_section_for_gpu_archs_only(tmp_path) -> None:
    out = tmp_path / "r"
    assert main(["report", *ARGS, "-o", str(out)]) == 0
    md = (out / "report.md").read_text()
    h200 = md[md.index("## h200"):]
    assert "### GPU kernels (`--backend triton`)" in h200
    assert "### GPU kernels" not in md[md.index("## mambalaya"):md.index("## h200")]


def test_the_comparison_bars_read_their_ratio_from_zero():
    """The bars sat on a log axis with a non-zero floor (a 2.78x speedup looked like 8x): now each arch's unfused is
    1.0 on a linear axis from 0, the fused bar its share, the absolute figures under the arch's name."""
    import matplotlib.pyplot as plt

    from mambalaya.report.content import study
    from mambalaya.report.figures import comparison_axes

    s = study(open_cascade("mlp2"), ["cpu", "mambalaya"])
    fig = comparison_axes(s)
    try:
        for ax, key in zip(fig.axes, ("latency_s", "traffic_bytes"), strict=True):
            assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
            heights = [p.get_height() for p in ax.patches]
            want = [float(getattr(a.report, key)) / float(getattr(a.unfused, key)) for a in s.archs]
            assert heights == pytest.approx([1.0] * len(s.archs) + want)
            assert all(a.arch.name in t.get_text() for a, t in zip(s.archs, ax.get_xticklabels(), strict=True))
    finally:
        plt.close(fig)
