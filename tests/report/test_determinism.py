"""Same input, same bytes out: a report written twice is identical file for file (a diff under version control
shows what changed in the cascade or the tool, not the clock)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mambalaya.parse import open_cascade
from mambalaya.report.report import write_report

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_report_written_twice_is_byte_identical(tmp_path):
    c = open_cascade("mlp2")
    one = _files(write_report(c, ["mambalaya", "h200"], tmp_path / "one"))
    two = _files(write_report(c, ["mambalaya", "h200"], tmp_path / "two"))
    assert {n.rsplit(".", 1)[1] for n in one} >= {"json", "csv", "svg", "md", "html", "png"}
    assert sorted(one) == sorted(two)
    assert [n for n in one if one[n] != two[n]] == []
