"""The greedy mapping: legal groups, tiles that fit, unfused where the arch cannot fuse."""

from __future__ import annotations

from mambalaya.cost.context import CostContext
from mambalaya.mapper import evaluate
from mambalaya.mapper.heuristics import greedy_mapping, unfused_baseline
from mambalaya.mapper.mapreport import map_report
from mambalaya.parse import open_cascade


def test_fuses_the_gemm_chain(mlp, tiny):
    m = greedy_mapping(mlp, tiny)
    assert m.group_lists == [["T", "Y"]]
    assert evaluate(mlp, tiny, m).traffic_bytes == 336  # hand count in test_traffic


def test_unfused_when_the_arch_cannot_fuse(mlp, tiny):
    m = greedy_mapping(mlp, tiny.with_overrides(can_fuse=False))
    assert m.group_lists == [["T"], ["Y"]]


def test_every_group_is_legal_and_fits():
    c = open_cascade("mamba2", model="mamba2-370m", params={"seqlen": 1024})
    for arch in ("h200", "mambalaya", "imax3"):
        from mambalaya.arch import load_arch

        a = load_arch(arch)
        ctx = CostContext(c, a)
        m = greedy_mapping(c, a, ctx=ctx).validate(c)
        fused = evaluate(c, a, m, ctx=ctx)
        for g, sched in zip(m.groups, fused.schedule.groups, strict=True):
            if len(g.einsums) > 1:
                assert ctx.analysis.problems(g.einsums) == [], (arch, g.einsums)
            assert sched.occupancy_bytes <= a.fusion_buffer_bytes, (arch, g)
        unfused = evaluate(c, a, unfused_baseline(c, a, ctx=ctx), ctx=ctx)
        assert fused.latency_s <= unfused.latency_s * (1 + 1e-9)  # (greedy only fuses what costs no more)


def test_map_report_without_a_mapping_compares_greedy_and_unfused():
    c = open_cascade("mamba2-decode", model="mamba2-370m")
    out = map_report(c, "h200")
    assert out["method"] == "greedy" and out["optimal"] is False
    assert out["latency_s"] < out["unfused"]["latency_s"]
    assert sum(len(g) for g in out["groups"]) == len(c.einsums)
