"""The rendered dataflow graph: produced, deterministic, labelled, clustered by a mapping."""

from __future__ import annotations

import re
import shutil

import pytest

from mambalaya.analysis import analyze
from mambalaya.errors import MambalayaError, MappingError
from mambalaya.fileio import resolve_shipped
from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping
from mambalaya.parse.cascade_file import load_cascade
from mambalaya.report.render import cascade_graph, render_bytes, render_cascade, short_expr

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")


@pytest.fixture(scope="module")
def mamba1():
    return load_cascade(resolve_shipped("mamba1", "cascades"))


@pytest.fixture(scope="module")
def mamba2():
    return load_cascade(resolve_shipped("mamba2", "cascades"))


def _texts(svg: bytes) -> set[str]:
    return set(re.findall(r">([^<>]+)</text>", svg.decode()))


def test_svg_has_every_einsum_tensor_and_class(tmp_path, mamba2):
    path = render_cascade(mamba2, tmp_path / "m2.svg")
    svg = path.read_bytes()
    assert svg.startswith(b"<?xml") and b"</svg>" in svg
    texts = _texts(svg)
    for name in mamba2.tensors:
        assert name in texts, name
    for i, _ in enumerate(mamba2.einsums, start=1):
        assert f" {i} " in texts
    for cls in ("RI", "RSb", "RSp", "RD"):
        assert any(t.startswith(cls) for t in texts)
    assert "legend" in texts
    assert [p.name for p in tmp_path.iterdir()] == ["m2.svg"]  # atomic: no temp file left


@pytest.mark.parametrize("fmt", ["svg", "png", "pdf"])
def test_output_is_deterministic(tmp_path, mamba1, fmt):
    a = render_cascade(mamba1, tmp_path / f"a.{fmt}", mapping=unfused_mapping(mamba1)).read_bytes()
    b = render_cascade(mamba1, tmp_path / f"b.{fmt}", mapping=unfused_mapping(mamba1)).read_bytes()
    assert a == b and len(a) > 1000
    magic = {"svg": b"<?xml", "png": b"\x89PNG", "pdf": b"%PDF"}[fmt]
    assert a.startswith(magic)


def test_mapping_groups_become_clusters(mamba1):
    mapping = Mapping((FusionGroup(("X0", "XC", "X", "DTR", "BM", "CM", "DT0", "DT", "CSF")), FusionGroup(("Z",)),
                       FusionGroup(("A", "DA", "BX", "H", "SY", "Y", "G", "OUT", "HF"))), "mamba1")
    source = cascade_graph(mamba1, mapping).source
    assert source.count("subgraph cluster_") == 3
    svg = render_bytes(mamba1, "svg", mapping=mapping).decode()
    assert len(re.findall(r'class="cluster"', svg)) == 3
    assert "G0 · legal · loop" in svg and "G2 · legal · loop l," in svg


def test_illegal_groups_are_flagged(mamba1):
    mapping = Mapping((FusionGroup(("X0", "Z")),
                       *(FusionGroup((n,)) for n in mamba1.einsum_names if n not in ("X0", "Z"))))
    assert "G0 · ILLEGAL" in render_bytes(mamba1, "svg", mapping=mapping).decode()


def test_analysis_is_reused_and_no_cluster_without_mapping(mamba1):
    source = cascade_graph(mamba1, analysis=analyze(mamba1, max_group_size=1)).source
    assert "cluster_" not in source
    assert "RD · halo l:3" in source and "RI · iter l" in source


def test_bad_suffix_and_bad_mapping(tmp_path, mamba1):
    with pytest.raises(MambalayaError, match="cannot render"):
        render_cascade(mamba1, tmp_path / "x.jpeg")
    with pytest.raises(MappingError):
        render_bytes(mamba1, "svg", mapping=Mapping((FusionGroup(("X0",)),)))
    assert not list(tmp_path.iterdir())


def test_short_expr(mamba2):
    assert short_expr(mamba2.einsum("DT").expr) == "clamp(softplus(DT0 + dtb), dt_min, …"
    assert short_expr(mamba2.einsum("ACS").expr) == "cumsum_q(DA)"
    assert short_expr(mamba2.einsum("YN").expr) == "YG * rsqrt(NV + eps) * normw"
