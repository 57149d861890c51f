"""Roofline latency on the tiny arch: max(compute, memory) + overhead, worked out by hand."""

from __future__ import annotations

import pytest

from mambalaya.cost.latency import compute_seconds, split_latency
from mambalaya.cost.ops import einsum_ops
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.mapper import evaluate


def test_memory_bound_unfused(mlp, tiny):
    r = evaluate(mlp, tiny)
    g0, g1 = r.groups
    # group T: 192 MACs / 1e12 = 0.192 ns; 416 B / 1e9 B/s = 416 ns; + 1 us launch
    assert g0.compute_s == pytest.approx(192e-12)
    assert g0.memory_s == pytest.approx(416e-9)
    assert g0.latency_s == pytest.approx(416e-9 + 1e-6)
    # group Y: 96 MACs; 192 + 48 + 64 = 304 B
    assert g1.latency_s == pytest.approx(304e-9 + 1e-6)
    assert r.latency_s == pytest.approx(720e-9 + 2e-6)
    assert r.traffic_bytes == 720


def test_compute_bound_when_bandwidth_is_plentiful(mlp, tiny):
    fast = tiny.with_overrides(offchip_bandwidth=1e18)
    r = evaluate(mlp, fast, Mapping((FusionGroup(("T", "Y")),)))
    (g,) = r.groups
    assert g.compute_s == pytest.approx((192 + 96) / 1e12)
    assert g.latency_s == pytest.approx(g.compute_s + 1e-6)
    assert g.bound == "compute"


def test_einsum_shares_sum_to_the_group(scan, tiny):
    r = evaluate(scan, tiny, Mapping((FusionGroup(("DA", "H", "Y", "Z", "HF")),)))
    (g,) = r.groups
    assert sum(e.latency_s for e in r.einsums) == pytest.approx(g.latency_s)
    assert sum(e.traffic_bytes for e in r.einsums) == g.traffic_bytes == 284
    # DA: 15 exps on the 1e10/s special-function unit
    assert r.einsums[0].compute_s == pytest.approx(15 / 1e10)


def test_cgla_pipeline_fill_slows_short_reductions(mlp, tiny):
    cgla = tiny.with_overrides(pipeline_depth=4)
    counts = einsum_ops(mlp, "T")  # reduction over k, length 4: occupancy 4 / (4 + 4) = 0.5
    assert compute_seconds(cgla, counts) == pytest.approx(compute_seconds(tiny, counts))  # not a cgla kind
    from dataclasses import replace

    assert compute_seconds(replace(cgla, kind="cgla"), counts) == pytest.approx(2 * 192 / 1e12)


def test_transfer_overhead_per_transfer(mlp, tiny):
    arch = tiny.with_overrides(transfer_overhead_s=1e-6)
    r = evaluate(mlp, arch)
    assert [g.transfers for g in r.groups] == [3, 3]  # two reads and a write each
    assert r.latency_s == pytest.approx(720e-9 + 2e-6 + 6e-6)


def test_split_latency():
    assert split_latency(6.0, [1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    assert split_latency(2.0, [0.0, 0.0]) == [1.0, 1.0]
