"""Traffic worked out by hand, to the byte: the sum of a schedule's load and store statements. float32: 4 B."""

from __future__ import annotations

import pytest

from mambalaya.errors import ArchError, MappingError
from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping
from mambalaya.mapper import evaluate
from mambalaya.schedule import ScheduleError


def rows(report) -> dict[tuple[int, str, str], int]:
    out: dict[tuple[int, str, str], int] = {}
    for r in report.traffic.rows:
        key = (r.group, r.tensor, r.direction)
        out[key] = out.get(key, 0) + r.bytes
    return out


def traffic(cascade, arch, groups):
    return evaluate(cascade, arch, Mapping(tuple(groups)))


# MLP: A[8,4] 128 B, W1[4,6] 96 B, T[8,6] 192 B, W2[6,2] 48 B, Y[8,2] 64 B.


def test_gemm_chain_unfused(mlp, tiny):
    t = evaluate(mlp, tiny, unfused_mapping(mlp))
    assert rows(t) == {
        (0, "A", "read"): 128,
        (0, "W1", "read"): 96,
        (0, "T", "write"): 192,
        (1, "T", "read"): 192,
        (1, "W2", "read"): 48,
        (1, "Y", "write"): 64,
    }
    assert t.traffic_bytes == 720


def test_gemm_chain_fused(mlp, tiny):
    t = traffic(mlp, tiny, [FusionGroup(("T", "Y"))])
    assert rows(t) == {(0, "A", "read"): 128, (0, "W1", "read"): 96, (0, "W2", "read"): 48, (0, "Y", "write"): 64}


def test_joint_residency_decides_rereads(mlp, tiny):
    """T = A*W1 tiled m=2, k=2: partial T [2x6] 48 B, A [2x2] 16 B, W1 [2x6] 48 B per k tile. W1's box does not
    move with m: kept across m it is [4x6] 96 B (160 B in all) and read once; when the buffers do not fit that
    together, W1 is reloaded every (m, k) tile: 4 x 96 = 384 B."""
    g = [FusionGroup(("T",), ("m", "k", "n"), {"m": 2, "k": 2}), FusionGroup(("Y",), ("m", "n", "p"), {"m": 2})]
    roomy = traffic(mlp, tiny.with_overrides(fusion_buffer_bytes=160), g)
    assert rows(roomy)[(0, "W1", "read")] == 96 and roomy.schedule.groups[0].occupancy_bytes == 160
    tight = traffic(mlp, tiny.with_overrides(fusion_buffer_bytes=159), g)
    assert rows(tight)[(0, "W1", "read")] == 384 and tight.schedule.groups[0].occupancy_bytes == 112
    assert rows(tight)[(0, "A", "read")] == 128  # A moves with both loops: read once either way
    with pytest.raises(ScheduleError, match="holds 112 B on chip at once, more than tiny's 111 B"):
        traffic(mlp, tiny.with_overrides(fusion_buffer_bytes=111), g)


# ELTWISE: every tensor [10] = 40 B. B = exp(A); C = B*B; D = B + C.


def test_elementwise_chain(eltwise, tiny):
    unfused = evaluate(eltwise, tiny, unfused_mapping(eltwise))
    # B: read A, write B; C: read B (two reads of one element: one load), write C; D: read B, C, write D
    assert unfused.traffic_bytes == (40 + 40) + (40 + 40) + (40 + 40 + 40) == 280
    assert traffic(eltwise, tiny, [FusionGroup(("B", "C", "D"))]).traffic_bytes == 40 + 40  # read A, write D


def test_multi_consumer_and_recompute(eltwise, tiny):
    # {B, C} then {D}: B has a consumer outside (D), so it is written although C reads it on chip
    assert rows(traffic(eltwise, tiny, [FusionGroup(("B", "C")), FusionGroup(("D",))])) == {
        (0, "A", "read"): 40, (0, "B", "write"): 40, (0, "C", "write"): 40,
        (1, "B", "read"): 40, (1, "C", "read"): 40, (1, "D", "write"): 40,
    }
    # D's group recomputes B: B is not written; D's group reads B's input A instead
    t = traffic(eltwise, tiny, [FusionGroup(("B", "C")), FusionGroup(("D",), recompute=("B",))])
    assert rows(t) == {
        (0, "A", "read"): 40, (0, "C", "write"): 40,
        (1, "A", "read"): 40, (1, "C", "read"): 40, (1, "D", "write"): 40,
    }


def test_recompute_must_name_an_outside_producer(eltwise, tiny):
    with pytest.raises(MappingError, match="no Einsum produces"):
        traffic(eltwise, tiny, [FusionGroup(("B", "C", "D"), recompute=("A",))])


# SCAN: A, DA, X, C, H, Z [5,3] = 60 B; H0, HF [3] = 12 B; Y [5] = 20 B.


def test_recurrence_unfused(scan, tiny):
    assert rows(evaluate(scan, tiny, unfused_mapping(scan))) == {
        (0, "A", "read"): 60, (0, "DA", "write"): 60,
        (1, "DA", "read"): 60, (1, "X", "read"): 60, (1, "H0", "read"): 12, (1, "H", "write"): 60,
        (2, "C", "read"): 60, (2, "H", "read"): 60, (2, "Y", "write"): 20,
        # Z reads H[l-1]: rows 0..3 of H (48 B) and, at l = 0, the initial state H0 (12 B)
        (3, "H", "read"): 48, (3, "H0", "read"): 12, (3, "X", "read"): 60, (3, "Z", "write"): 60,
        # HF reads only the last row of H
        (4, "H", "read"): 12, (4, "HF", "write"): 12,
    }


@pytest.mark.parametrize("tiles", [{}, {"l": 2}])
def test_recurrence_fused(scan, tiny, tiles):
    t = traffic(scan, tiny, [FusionGroup(("DA", "H", "Y", "Z", "HF"), ("l", "n"), tiles)])
    # inputs A, X, C, H0 once; outputs Y, Z, HF written; DA is inlined, H is a one-step state on chip
    assert t.traffic_bytes == 60 + 60 + 60 + 12 + 20 + 60 + 12 == 284
    g = t.schedule.groups[0]
    assert g.buffer("state_H").shape == (1, 3) and dict(g.inline) == {"DA": 1}


def test_weights_resident_is_refused(tiny):
    from cost.conftest import TINY_ARCH

    from mambalaya.arch import parse_arch

    with pytest.raises(ArchError, match="x.yaml:27: weights_resident: true is not modelled"):
        parse_arch(TINY_ARCH + "weights_resident: true\n", file="x.yaml")
    with pytest.raises(ArchError, match="cannot override 'weights_resident'"):
        tiny.with_overrides(weights_resident=True)


def test_marca_admits_only_unfused(mlp, tiny):
    with pytest.raises(MappingError, match="cannot fuse"):
        traffic(mlp, tiny.with_overrides(can_fuse=False), [FusionGroup(("T", "Y"))])
