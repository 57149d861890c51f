"""The two kernel printers' output on one small schedule: each statement of the schedule is one piece of
code, in order; the counting is in the code that moves the data; the GPU grid is the schedule's."""

from __future__ import annotations

import pytest
from cost.conftest import MLP

from mambalaya.exec.numba_codegen import group_source
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.parse import parse_cascade_text
from mambalaya.schedule import lower_mapping

GEMM = Mapping((FusionGroup(("T",), ("m", "k", "n"), {"m": 2, "k": 2}), FusionGroup(("R", "Y"), ("m", "n", "p"))),
               "mlp2")


@pytest.fixture(scope="module")
def mlp():
    return parse_cascade_text(MLP.replace("- Y[m,p] = T[m,n] * W2[n,p]", "- R[m,n] = silu(T[m,n])\n  - Y[m,p] = R[m,n] * W2[n,p]")
                              .replace("name: mlp", "name: mlp2"), file="mlp2.yaml")


def _kernel(source: str) -> list[str]:
    lines = source.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("def kernel("))
    return [ln for ln in lines[start:] if ln.strip()]


def test_numba_prints_the_loop_nest_with_counted_copies(mlp) -> None:
    s = lower_mapping(mlp, GEMM, "mambalaya")
    g = s.groups[0]
    code = _kernel(group_source(mlp, g, "float64"))
    assert code[0] == "def kernel(x0, x1, x2, arena, tc):"  # A, W1 (loaded), T (stored); arena; counters
    loops = [ln.strip() for ln in code if ln.strip().startswith("for t")]
    assert loops == ["for t0 in range(4):  # m in tiles of 2 (parallel)",
                     "for t1 in range(2):  # k in tiles of 2 (reduction)"]
    counts = [ln.strip() for ln in code if ln.strip().startswith("tc[")]
    assert [c.split("]")[0] for c in counts] == ["tc[2", "tc[0", "tc[5"]  # W1 hoisted out of m, A, store T
    # T's partial sums are a slice of the arena; A's and W1's loads bind views of their tensors (a CPU's
    # caches fill from the reads: a copy into the arena would move each byte twice more), W1 whole, A per tile
    assert [ln.strip() for ln in code[1:] if " = arena[" in ln] == ["b0 = arena[0:12].reshape((2, 6,))"]
    assert "    b2 = x1" in code and "            b1 = x0[bx_4_lo:bx_4_lo + 2, bx_5_lo:bx_5_lo + 2]" in code
    assert code.index("    b2 = x1") < code.index(next(ln for ln in code if ln.strip().startswith("tc[2]")))


def test_triton_prints_the_grid_and_counts_under_count(mlp) -> None:
    from mambalaya.exec.triton_codegen import group_kernel_source

    s = lower_mapping(mlp, GEMM, "h200")
    k = group_kernel_source(mlp, s.groups[0], "float32")
    code = _kernel(k.source)
    assert code[0] == "def kernel(x0, x1, x2, arena, tc, PID0, COUNT: tl.constexpr):"
    assert k.programs == 4 and k.params == ("A", "W1", "T")
    assert "    t0 = pid % 4" in code  # the m tile of this program
    assert not any(ln.strip().startswith("for t0 ") for ln in code)  # ... not a loop inside it
    slots = [ln.split("tc + ")[1].split(",")[0] for ln in code if "tl.atomic_add" in ln]
    assert slots == ["0", "2", "5"]
    def block_of(i: int) -> str:  # the statement whose block holds line i
        ind = len(code[i]) - len(code[i].lstrip())
        return next(ln.strip() for ln in reversed(code[:i]) if len(ln) - len(ln.lstrip()) < ind)

    assert all(block_of(i) == "if COUNT:" for i, ln in enumerate(code) if "tl.atomic_add" in ln)


@pytest.mark.parametrize(("tile", "masked"), [(2, False), (3, True)])
def test_triton_masks_a_tile_range_only_where_a_tile_can_be_short(mlp, tile: int, masked: bool) -> None:
    """m in tiles of 2 (of 8) always spans 2 rows: no lane test of it (a mask Triton cannot prove uniform keeps
    the loads scalar); tiles of 3 leave a last tile of 2, whose rows are masked."""
    from mambalaya.exec.triton_codegen import group_kernel_source

    m = Mapping((FusionGroup(("T",), ("m", "k", "n"), {"m": tile}), FusionGroup(("R", "Y"), ("m", "n", "p"))), "mlp2")
    source = group_kernel_source(mlp, lower_mapping(mlp, m, "h200").groups[0], "float32").source
    assert ("(hi_m - lo_m)" in source) is masked
