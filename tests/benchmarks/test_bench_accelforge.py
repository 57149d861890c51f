"""The AccelForge side-by-side benchmark: its TPU v4i arch file and our side of the script, without AccelForge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mambalaya.arch import load_arch
from mambalaya.mapper import optimal_mapping
from mambalaya.parse import open_cascade

REPO = Path(__file__).resolve().parents[2]
ARCH = REPO / "benchmarks" / "archs" / "tpu_v4i.yaml"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_accelforge")


def test_tpu_v4i_loads_with_accelforges_figures() -> None:
    a = load_arch(ARCH)
    assert a.name == "tpu_v4i" and a.can_fuse
    assert a.clock_hz == pytest.approx(1.05e9)
    assert a.throughput("mac", matrix=True) == pytest.approx(4 * 128 * 128 * 1.05e9)  # 4 MXUs of 128 x 128
    assert a.throughput("add") == pytest.approx(128 * 1.05e9)  # AccelForge's ScalarUnit
    assert a.offchip_bandwidth == pytest.approx(614e9)
    assert a.fusion_buffer_bytes == 128 * 2**20
    assert a.element_bytes == 1 and a.group_overhead_s == 0


def test_decode_cascade_maps_proven_optimal_on_tpu_v4i() -> None:
    c = open_cascade("mamba1-decode", model="mamba-1.4b", params={"d_state": 128, "batch": 1})
    r = optimal_mapping(c, load_arch(ARCH))
    assert r.optimal
    assert sorted(e for g in r.groups for e in g) == sorted(c.einsum_names)


def test_byte_scaling_is_the_8_bit_problem(bench, tmp_path: Path) -> None:
    c = bench.open_workload("af-mamba", tmp_path)
    assert len(c.einsums) == 12 and bench.byte_scale(c, load_arch(ARCH)) == 4
    a4 = bench.equivalent_arch(ARCH, 4)
    assert a4.offchip_bandwidth == pytest.approx(4 * 614e9)
    assert a4.fusion_buffer_bytes == 4 * 128 * 2**20
    assert a4.throughput("mac", matrix=True) == load_arch(ARCH).throughput("mac", matrix=True)
    from_file = load_arch(bench.equivalent_arch_file(ARCH, 4, tmp_path))  # the CLI's copy
    assert from_file.offchip_bandwidth == pytest.approx(a4.offchip_bandwidth)
    assert from_file.fusion_buffer_bytes == a4.fusion_buffer_bytes


def test_our_side_runs_without_accelforge(bench, tmp_path: Path) -> None:
    assert bench.accelforge_available(None) is not None
    assert "does not exist" in bench.accelforge_available(str(tmp_path / "no-python"))
    for key in bench.DECODE:
        row = bench.ours_inprocess(key, tmp_path, repeats=1)
        assert row["optimal"] and row["byte_scale"] == 4
        assert row["traffic_bytes"] <= row["unfused_traffic_bytes"]
        assert row["latency_s"] <= row["unfused_latency_s"] * (1 + 1e-9)
        json.dumps(row)  # JSON-ready
