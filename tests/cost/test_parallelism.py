"""The latency model's parallel extent, recurrence chains and matrix-unit waste, and the tile search using them."""

from __future__ import annotations

import pytest

from mambalaya.arch import load_arch, parse_arch
from mambalaya.cost.context import CostContext
from mambalaya.cost.latency import chain_seconds, parallel_fraction
from mambalaya.cost.model import group_costs
from mambalaya.cost.price import chain_statements
from mambalaya.errors import ArchError
from mambalaya.ir.mapping import FusionGroup
from mambalaya.mapper.tiling import Tiled, best_tiling
from mambalaya.parse import open_cascade


def test_a_grid_short_of_the_sms_or_a_partial_wave_leaves_the_chip_idle() -> None:
    h = load_arch("h200")
    assert h.program_slots == 132
    assert parallel_fraction(h, 1) == (pytest.approx(1 / 132), 1)
    assert parallel_fraction(h, 132) == (1.0, 1)
    assert parallel_fraction(h, 133) == (pytest.approx(133 / 264), 2)
    assert parallel_fraction(load_arch("mambalaya"), 1) == (1.0, 1)  # no slots: a group has the whole array


def test_resident_programs_overlap_their_chains_only_when_their_buffers_fit_together() -> None:
    h = load_arch("h200")
    cap = h.fusion_buffer_bytes
    one = chain_seconds(h, 132, 100, cap)  # one program per SM: a round of the chain
    assert one == pytest.approx(100 * h.recurrence_step_s)
    assert chain_seconds(h, 132 * 16, 100, cap // 16) == pytest.approx(one)  # 16 resident per SM: still one round
    assert chain_seconds(h, 132 * 16, 100, cap) == pytest.approx(16 * one)  # each fills an SM: 16 rounds


def test_a_gpu_program_holds_one_sms_shared_memory() -> None:
    h = load_arch("h200")
    assert h.fusion_buffer_bytes == 228 * 1024
    assert h.with_overrides(fusion_buffer_bytes=4096).fusion_buffer_bytes == 4096
    assert load_arch("mambalaya").fusion_buffer_bytes == 32 * 2**20  # one buffer, the whole level


@pytest.fixture(scope="module")
def mamba1_4096():
    return open_cascade("mamba1", model="mamba-370m", params={"batch": 1, "seqlen": 4096})


def test_one_program_is_predicted_the_sm_count_slower_than_the_spread_tiling(mamba1_4096) -> None:
    """The wave-1 h200 optimum ran groups of one program 29-270x slower than predicted: the model now knows."""
    ctx = CostContext(mamba1_4096, load_arch("h200"))
    one = group_costs(ctx, ctx.lower(FusionGroup(("Z",), ctx.analysis.loop_order(("Z",))), check=False))[0]
    assert one.programs == 1 and one.parallel_fraction == pytest.approx(1 / 132)
    best = best_tiling(ctx, ("Z",))
    assert isinstance(best, Tiled) and best.cost.programs >= 128 and best.cost.parallel_fraction > 0.9
    assert one.latency_s > 50 * best.cost.latency_s


def test_the_scan_runs_its_recurrence_innermost_and_pays_its_chain(mamba1_4096) -> None:
    ctx = CostContext(mamba1_4096, load_arch("h200"))
    scan = ("A", "DA", "BX", "H", "SY", "Y", "G", "HF")
    best = best_tiling(ctx, scan)
    assert isinstance(best, Tiled)
    assert best.group.loop_order[-1] == "l"  # the grid comes from d (and n), the recurrence inside a program
    steps = 4096  # one 1024-wide block per step per program
    assert best.cost.chain_s >= steps * ctx.arch.recurrence_step_s
    assert best.cost.latency_s >= best.cost.chain_s


def test_a_reduction_tile_below_the_tensor_cores_k_wastes_the_rest(mamba1_4096) -> None:
    ctx = CostContext(mamba1_4096, load_arch("h200"))
    order = ctx.analysis.loop_order(("Z",))

    def compute(e: int) -> float:
        tiles = {"l": 256, "d": 128, "e": e}
        return group_costs(ctx, ctx.lower(FusionGroup(("Z",), order, tiles), check=False))[0].compute_s

    assert compute(1) == pytest.approx(16 * compute(16))
    assert compute(32) == pytest.approx(compute(16))


@pytest.mark.slow
def test_the_mappers_h200_groups_fill_the_chip_or_are_launch_bound(mamba1_4096) -> None:
    from mambalaya.mapper import optimal_mapping

    r = optimal_mapping(mamba1_4096, "h200")
    for g in r.report.groups:
        short = g.parallel_fraction < 0.9
        # a grid short of the SMs only where the model says why: the chain (a scan) or the launch dominates
        assert not short or g.chain_s >= 0.5 * g.latency_s or g.overhead_s >= 0.5 * g.latency_s, g


def test_parallelism_keys_are_checked() -> None:
    text = open(load_arch("h200").source).read()
    bad = text.replace("  resident: 16", "  residents: 16")
    with pytest.raises(ArchError, match="unknown key 'residents'"):
        parse_arch(bad, "x.yaml")



def test_each_statement_of_a_recurrences_tile_loop_lengthens_its_chain(mamba1_4096) -> None:
    """A scan tiled by one step runs its loop body's every load, compute and store per step: each adds to the
    chain; the same group tiled by 16 steps runs them a sixteenth as often."""
    ctx = CostContext(mamba1_4096, load_arch("h200"))
    group = ("DT", "A", "DA", "BX", "H", "SY", "Y", "G", "HF")
    order = ctx.analysis.loop_order(group)
    order = tuple(r for r in order if r != "l") + ("l",)

    def chain(tiles: dict[str, int]) -> tuple[float, int]:
        sched = ctx.lower(FusionGroup(group, order, tiles), check=False)
        return group_costs(ctx, sched)[0].chain_s, chain_statements(ctx, sched)

    by_one, n_one = chain({"d": 16, "l": 1})
    by_16, n_16 = chain({"d": 16, "l": 16})
    assert n_one >= 4 * 4096 and n_16 * 16 == pytest.approx(n_one, rel=0.01)
    steps = 4096 * ctx.arch.recurrence_step_s
    assert by_one == pytest.approx(steps + n_one * ctx.arch.recurrence_statement_s)
    assert steps < by_16 < by_one


def test_a_cpu_pays_each_executed_statement_so_its_tile_search_keeps_tiles_large() -> None:
    """The CPU executor's loop bodies cost time beyond their arithmetic (``overheads.per_statement``): a tiling
    executing more statements is predicted that much slower, and the search prefers tiles that execute few."""
    c = open_cascade("mamba1", model="mamba-130m", params={"batch": 1, "seqlen": 512})
    cpu = load_arch("cpu")
    free = cpu.with_overrides(statement_overhead_s=0.0)
    group = ("DT0", "DT")
    order = CostContext(c, cpu).analysis.loop_order(group)
    for tiles in ({"l": 128}, {"l": 8}):
        sched = CostContext(c, cpu).lower(FusionGroup(group, order, tiles))
        paid, plain = (group_costs(CostContext(c, a), sched)[0] for a in (cpu, free))
        assert sched.executions > 0
        assert paid.latency_s - plain.latency_s == pytest.approx(sched.executions * cpu.statement_overhead_s)
    best, unpaid = (best_tiling(CostContext(c, a), group) for a in (cpu, free))
    assert isinstance(best, Tiled) and isinstance(unpaid, Tiled)
    executions = {a: CostContext(c, cpu).lower(t.group).executions for a, t in (("paid", best), ("free", unpaid))}
    assert executions["paid"] <= executions["free"]
