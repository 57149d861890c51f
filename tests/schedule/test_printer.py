"""The schedule's pseudo-code printer, line by line, on a GEMM small enough to check by hand."""

from __future__ import annotations

import pytest
from cost.conftest import MLP, TINY_ARCH

from mambalaya.arch import parse_arch
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.parse import parse_cascade_text
from mambalaya.schedule import Range, format_schedule, lower_mapping
from mambalaya.schedule.ir import Loop
from mambalaya.schedule.printer import format_range

GEMM = Mapping((FusionGroup(("T",), ("m", "k", "n"), {"m": 2, "k": 2}), FusionGroup(("Y",), ("m", "n", "p"), {"m": 2})),
               "mlp")


@pytest.fixture(scope="module")
def mlp():
    return parse_cascade_text(MLP, file="mlp.yaml")


def test_a_tiled_gemm_prints_its_buffers_and_statements(mlp) -> None:
    arch = parse_arch(TINY_ARCH, file="tiny.yaml").with_overrides(fusion_buffer_bytes=150)
    text = format_schedule(lower_mapping(mlp, GEMM, arch)).splitlines()
    assert text[:13] == [
        "schedule of mlp on tiny (capacity 150 B, 2 groups)",
        "",
        "group 0: T -- 2 tile loop(s), 112 B on chip",
        "  buffers:",
        "    partial_T: partial of T [2x6] 48 B at element 0",
        "    in_A: operand of A [2x2] 16 B at element 12",
        "    in_W1: operand of W1 [2x6] 48 B at element 16",
        "  for m in 0..8 step 2 (4 tiles, parallel):",
        "    for k in 0..4 step 2 (2 tiles, reduction: T accumulates partial sums across it):",
        "      load A[m, k] -> in_A   # 32 elements, 8x",
        "      load W1[k, n] -> in_W1   # 96 elements, 8x",
        "      compute T over m in tile(m), n in 0..6, k in tile(k) -> partial_T  (accumulating over k)",
        "    store partial_T -> T[m, n]   # 48 elements, 4x",
    ]
    assert "  load W2[n, p] -> in_W2   # 12 elements, 1x" in text  # hoisted out of m: read once


def test_a_gpu_grid_loop_reads_as_programs(mlp) -> None:
    text = format_schedule(lower_mapping(mlp, GEMM, "h200"))
    assert "  for m in 0..8 step 2 (4 programs of the grid):" in text
    assert "    load W2[n, p] -> in_W2   # 48 elements, 4x" in text  # each program loads its own


@pytest.mark.parametrize(("r", "text"), [
    (Range("l", 64), "l in 0..64"),
    (Range("l", 64, "tile", 0), "l in tile(l)"),
    (Range("l", 64, "tile", 0, skew=3), "l in tile(l)+3"),
    (Range("l", 64, "parent", 0, scale=16), "l in 16*tile(l)"),
    (Range("c", 4, "piece", 0, divisor=16), "c in tile(l)//16"),
    (Range("q", 16, "piece", 0, divisor=1, modulus=16), "q in tile(l)%16"),
])
def test_range_forms(r: Range, text: str) -> None:
    assert format_range(r, (Loop("l", 64, 8),)) == text
