"""The report objects and the ``map`` JSON contract."""

from __future__ import annotations

import json

from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping
from mambalaya.mapper import evaluate
from mambalaya.mapper.mapreport import format_map_report, map_report

CONTRACT = {
    "arch",
    "objective",
    "groups",
    "traffic_bytes",
    "latency_s",
    "optimal",
    "solve_s",
    "unfused",
    "einsums",
}
ROW = {"name", "group", "traffic_bytes", "compute_s", "memory_s", "latency_s", "ops"}


def test_map_report_with_a_mapping_has_the_contract_keys(mlp, tiny):
    fused = Mapping((FusionGroup(("T", "Y")),))
    out = map_report(mlp, tiny, fused)
    assert CONTRACT <= set(out)
    assert out["groups"] == [["T", "Y"]]
    assert out["optimal"] is False
    assert out["traffic_bytes"] == 336 and out["unfused"]["traffic_bytes"] == 720
    assert {"groups", "traffic_bytes", "latency_s"} <= set(out["unfused"])
    assert [r["name"] for r in out["einsums"]] == ["T", "Y"]
    assert all(ROW <= set(r) for r in out["einsums"])
    json.dumps(out)  # plain JSON types only
    text = format_map_report(out)
    assert "unfused" in text and "T" in text


def test_map_report_on_an_arch_that_cannot_fuse(mlp, tiny):
    out = map_report(mlp, tiny.with_overrides(can_fuse=False))
    assert out["method"] == "unfused" and out["groups"] == [["T"], ["Y"]]
    assert out["traffic_bytes"] == out["unfused"]["traffic_bytes"] == 720


def test_report_tables(scan, tiny):
    r = evaluate(scan, tiny, unfused_mapping(scan))
    df = r.to_dataframe()
    assert list(df["name"]) == list(scan.einsum_names)
    assert {"compute_util", "memory_util", "intensity", "bound", "ops_exp"} <= set(df.columns)
    assert int(df["traffic_bytes"].sum()) == r.traffic_bytes == 656
    assert len(r.groups_dataframe()) == 5
    assert int(r.traffic_dataframe()["bytes"].sum()) == 656
    j = r.to_json()
    assert j["traffic_bytes"] == 656 and len(j["traffic"]) == len(r.traffic.rows)
