"""Traffic worked out by hand, to the byte (rule: mambalaya/cost/traffic.py docstring). float32: 4 B."""

from __future__ import annotations

import pytest

from mambalaya.cost.context import CostContext
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.errors import MappingError
from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping


def traffic(cascade, arch, groups, need=100):
    ctx = CostContext(cascade, arch, buffer_need=lambda g: need)
    return mapping_traffic(ctx, Mapping(tuple(groups)))


def rows(t):
    return {(r.group, r.tensor, r.direction): r.bytes for r in t.rows}


# MLP: A[8,4] 128 B, W1[4,6] 96 B, T[8,6] 192 B, W2[6,2] 48 B, Y[8,2] 64 B.


def test_gemm_chain_unfused(mlp, tiny):
    t = mapping_traffic(CostContext(mlp, tiny), unfused_mapping(mlp))
    # group 0: read A 128 + W1 96, write T 192; group 1: read T 192 + W2 48, write Y 64
    assert rows(t) == {
        (0, "A", "read"): 128,
        (0, "W1", "read"): 96,
        (0, "T", "write"): 192,
        (1, "T", "read"): 192,
        (1, "W2", "read"): 48,
        (1, "Y", "write"): 64,
    }
    assert t.total_bytes == 128 + 96 + 192 + 192 + 48 + 64 == 720


def test_gemm_chain_fused(mlp, tiny):
    t = traffic(mlp, tiny, [FusionGroup(("T", "Y"))])
    assert t.total_bytes == 128 + 96 + 48 + 64 == 336  # T never leaves the chip


def test_capacity_forces_weight_rereads(mlp, tiny):
    group = FusionGroup(("T", "Y"), loop_order=("m", "n", "k", "p"), tiles={"m": 2})
    # 1 MiB buffer: everything fits, no re-reads
    assert traffic(mlp, tiny, [group]).total_bytes == 336
    # 150 B buffer with a 100 B group need: W1 (96 + 100 > 150) is streamed once per m tile,
    # ceil(8/2) = 4 passes = 384 B; W2 (48 + 100 <= 150) still fits; A is indexed by the outer m: 1 pass.
    small = tiny.with_overrides(fusion_buffer_bytes=150)
    t = traffic(mlp, small, [group])
    assert rows(t)[(0, "W1", "read")] == 4 * 96
    assert rows(t)[(0, "W2", "read")] == 48
    assert rows(t)[(0, "A", "read")] == 128
    assert t.total_bytes == 128 + 384 + 48 + 64 == 624
    # 100 B buffer: W2 (48 + 100 > 100) is re-read too: 4 x 48
    assert (
        traffic(mlp, tiny.with_overrides(fusion_buffer_bytes=100), [group]).total_bytes
        == 128 + 384 + 192 + 64
    )
    # untiled, nothing is re-read however small the buffer
    assert traffic(mlp, small, [FusionGroup(("T", "Y"), ("m", "n", "k", "p"))]).total_bytes == 336


# ELTWISE: every tensor [10] = 40 B. B = exp(A); C = B*B; D = B + C.


def test_elementwise_chain(eltwise, tiny):
    unfused = mapping_traffic(CostContext(eltwise, tiny), unfused_mapping(eltwise))
    # B: read A, write B; C: read B (two reads, one footprint), write C; D: read B, C, write D
    assert unfused.total_bytes == (40 + 40) + (40 + 40) + (40 + 40 + 40) == 280
    assert traffic(eltwise, tiny, [FusionGroup(("B", "C", "D"))]).total_bytes == 40 + 40  # read A, write D


def test_multi_consumer_and_recompute(eltwise, tiny):
    # {B, C} then {D}: B has a consumer outside (D), so it is written although C reads it on chip
    t = traffic(eltwise, tiny, [FusionGroup(("B", "C")), FusionGroup(("D",))])
    assert rows(t) == {
        (0, "A", "read"): 40,
        (0, "B", "write"): 40,
        (0, "C", "write"): 40,
        (1, "B", "read"): 40,
        (1, "C", "read"): 40,
        (1, "D", "write"): 40,
    }
    # D's group recomputes B: B is not written; D's group reads B's input A instead
    t = traffic(eltwise, tiny, [FusionGroup(("B", "C")), FusionGroup(("D",), recompute=("B",))])
    assert rows(t) == {
        (0, "A", "read"): 40,
        (0, "C", "write"): 40,
        (1, "C", "read"): 40,
        (1, "A", "read"): 40,
        (1, "D", "write"): 40,
    }
    assert t.total_bytes == 200


def test_recompute_must_name_an_outside_producer(eltwise, tiny):
    with pytest.raises(MappingError, match="no Einsum produces"):
        traffic(eltwise, tiny, [FusionGroup(("B", "C", "D"), recompute=("A",))])


# SCAN: A, DA, X, C, H, Z [5,3] = 60 B; H0, HF [3] = 12 B; Y [5] = 20 B.


def test_recurrence_unfused(scan, tiny):
    t = mapping_traffic(CostContext(scan, tiny), unfused_mapping(scan))
    assert rows(t) == {
        (0, "A", "read"): 60,
        (0, "DA", "write"): 60,
        (1, "DA", "read"): 60,
        (1, "X", "read"): 60,
        (1, "H0", "read"): 12,
        (1, "H", "write"): 60,
        (2, "C", "read"): 60,
        (2, "H", "read"): 60,
        (2, "Y", "write"): 20,
        # Z reads H[l-1]: rows 0..3 of H (48 B) and, at l = 0, the initial state H0 (12 B)
        (3, "H", "read"): 48,
        (3, "H0", "read"): 12,
        (3, "X", "read"): 60,
        (3, "Z", "write"): 60,
        # HF reads only the last row of H
        (4, "H", "read"): 12,
        (4, "HF", "write"): 12,
    }
    assert t.total_bytes == 120 + 192 + 140 + 180 + 24 == 656


def test_recurrence_fused(scan, tiny):
    t = traffic(scan, tiny, [FusionGroup(("DA", "H", "Y", "Z", "HF"))])
    # inputs A, X, C, H0 once; outputs Y, Z, HF written; DA and H stay on chip
    assert t.total_bytes == 60 + 60 + 60 + 12 + 20 + 60 + 12 == 284


def test_weights_resident(tiny):
    from mambalaya.parse import parse_cascade_text

    c = parse_cascade_text("""
name: packed
params: {M: 2, K: 3, N: 4}
ranks: {m: M, k: K, j: 2*K, n: N}
tensors: {W: {role: weight, shape: [2*K, N]}}
einsums:
  - P[m,n] = A[m,k] * W[k,n]
  - Q[m,n] = A[m,k] * W[K+k,n]
  - R[m,n] = B[m,j] * W[j,n]
""")
    # W is [6,4] = 96 B; P reads rows 0..2 (48 B), Q rows 3..5 (48 B), R all rows (96 B)
    plain = rows(mapping_traffic(CostContext(c, tiny), unfused_mapping(c)))
    assert [plain[(g, "W", "read")] for g in range(3)] == [48, 48, 96]
    resident = rows(
        mapping_traffic(CostContext(c, tiny.with_overrides(weights_resident=True)), unfused_mapping(c))
    )
    assert [resident.get((g, "W", "read")) for g in range(3)] == [48, 48, None]  # R finds all of W on chip
    assert sum(resident.values()) == sum(plain.values()) - 96


def test_marca_admits_only_unfused(mlp, tiny):
    with pytest.raises(MappingError, match="cannot fuse"):
        traffic(mlp, tiny.with_overrides(can_fuse=False), [FusionGroup(("T", "Y"))])
