"""Lowering refuses tilings that would leave indices of a rank uncomputed; a placement shared by tilings lowers
what a fresh lowering does."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.parse import open_cascade
from mambalaya.schedule import Lowerer, Policy, ScheduleError, lower_mapping
from mambalaya.schedule.lower import _Lowering

FRONT = ("XBC0", "DT0", "XBC1", "XBC", "DT", "A", "DA", "XDT", "CSF")


def test_a_rank_longer_than_its_loop_reaches_is_refused() -> None:
    """Mamba-2's XBC channels x follow the heads h (x = headdim*h + p for the x part), but the B and C channels
    lie past the last head: tiling h left them uncomputed (NaN; the mapper's mambalaya optimum of mamba2-130m
    chose it and computed wrong numbers). Tiling p instead is fine."""
    c = open_cascade("mamba2")
    rest = tuple(n for n in c.einsum_names if n not in FRONT)
    for tiles, ok in (({"h": 4}, False), ({"p": 1}, True)):
        m = Mapping((FusionGroup(FRONT, tiles=tiles), FusionGroup(rest)), c.name)
        if ok:
            assert lower_mapping(c, m, "mambalaya", check=False).groups[0].loops[0].rank == "p"
        else:
            with pytest.raises(ScheduleError, match=r"XBC0's rank x \(160\) is longer than the tiles of h reach"):
                lower_mapping(c, m, "mambalaya", check=False)


GROUPED = {"seqlen": 8, "d_model": 32, "d_state": 8, "headdim": 8, "ngroups": 2, "chunk": 4}


def _with_group(c, group: tuple[str, ...], tiles: dict[str, int]) -> Mapping:
    """``group`` fused (placed at its first member), every other Einsum alone."""
    groups = [FusionGroup(group, tiles=tiles) if n == group[0] else FusionGroup((n,))
              for n in c.einsum_names if n == group[0] or n not in group]
    return Mapping(tuple(groups), c.name)


def test_tilings_that_would_leave_rows_uncomputed_are_refused() -> None:
    """Two wrong schedules the mapper chose for a 2-group Mamba-2 on h200 (NaN outputs; ``generate --backend
    triton`` picked other tokens), both refused now:

    - CB reads the B and C channels of x as D + g*d_state + n and D + GN + g*d_state + n: a tile of g reached
      channels from D + GN on only, so the x part and B were never computed;
    - under tiles of chunks c, the conv XBC1 reads XBC0 three tokens back, in the previous chunk, which no
      buffer kept.

    Untiled, or tiled along a loop that neither follows, the group computes the reference."""
    import numpy as np

    from mambalaya.exec.backend import execute
    from mambalaya.exec.reference import random_inputs, run_reference

    c = open_cascade("mamba2", params=GROUPED)
    group = ("XBC0", "XBC1", "XBC", "CB")
    for tiles, why in (({"g": 1}, r"XBC0's rank x follows the tiles of g from 80 on"),
                       ({"c": 1}, r"XBC1 reads XBC0 at -3 \+ k \+ l, past the tile of l that follows c")):
        with pytest.raises(ScheduleError, match=why):
            lower_mapping(c, _with_group(c, group, tiles), "h200")
    inputs = random_inputs(c, seed=0)
    want = run_reference(c, inputs, dtype="float64")
    for tiles in ({}, {"n": 4}):
        got = execute(c, lower_mapping(c, _with_group(c, group, tiles), "h200"), inputs, "python", "float64").outputs
        for name in got:
            assert np.allclose(got[name], want[name], rtol=1e-12, atol=1e-12), (tiles, name)


PLACED = {name: open_cascade(name) for name in ("mamba2", "mamba1", "attention")}
# (heads in 2 groups: a tile of h below 4 runs the per-group members outside its loop, a tile of 4 as its pieces)
PLACED["grouped"] = open_cascade("mamba2", params={**GROUPED, "seqlen": 16})
WARM = {name: Lowerer(c) for name, c in PLACED.items()}  # placements kept across examples


def admitted(size: int) -> list[int]:
    return sorted({d for d in range(1, size) if size % d == 0} | {1 << k for k in range(size.bit_length()) if 1 << k < size})


@st.composite
def tiled_groups(draw):
    """A legal run of a shipped cascade's Einsums, some of its tileable loops tiled at any size."""
    name = draw(st.sampled_from(sorted(PLACED)))
    c, an = PLACED[name], WARM[name].analysis
    names = c.einsum_names
    start = draw(st.integers(0, len(names) - 1))
    members = tuple(names[start:start + draw(st.integers(1, 8))])
    cg = an.analyze(list(members))
    assume(cg.legal)
    tileable = [r.name for r in cg.loops.ranks if r.tiled and c.rank_size(r.name) > 1]
    tiled = draw(st.lists(st.sampled_from(tileable), unique=True, max_size=4)) if tileable else []
    # (mostly the sizes a mapper admits, divisors and powers of two, which align with a rank's pieces)
    sizes = [{r: draw(st.one_of(st.sampled_from(admitted(c.rank_size(r))), st.integers(1, c.rank_size(r) - 1)))
              for r in tiled} for _ in range(2)]
    stored = frozenset(draw(st.lists(st.sampled_from(members), unique=True, min_size=1)))
    return name, FusionGroup(members, tiles=sizes[0]), FusionGroup(members, tiles=sizes[1]), stored


@settings(max_examples=150, deadline=None)
@given(case=tiled_groups(), gpu=st.booleans(), capacity=st.sampled_from([None, 512, 1 << 16]))
def test_a_placement_shared_by_tilings_lowers_what_a_fresh_lowering_does(case, gpu, capacity) -> None:
    """A group's placement (steps 1-3 of the lowering) is kept per set of tiled loops and reused at every other
    size of their tiles: what it lowers must equal a lowering from nothing (a fresh :class:`Lowerer`)."""
    name, group, before, stored = case
    policy = Policy(gpu=gpu)

    def lowered(lw: Lowerer, g: FusionGroup):
        try:
            return lw.group(g, stored, policy, 0, capacity), lw.occupancy(g, stored, policy)
        except ScheduleError as err:
            return str(err)

    lowered(WARM[name], before)  # (the same loops at other tiles, placed first)
    assert lowered(WARM[name], group) == lowered(Lowerer(PLACED[name]), group)


@settings(max_examples=150, deadline=None)
@given(case=tiled_groups(), gpu=st.booleans())
def test_a_placement_refused_for_a_part_of_its_loops_is_refused_whole(case, gpu) -> None:
    """A placement is refused unplaced when one or two of its tiled loops alone are (at the same tile classes):
    the refusals of step 1 only grow with the tiled loops. Whatever the parts say, a group lowers (or is refused)
    exactly as when every placement is worked out in full."""
    name, group, before, stored = case
    policy = Policy(gpu=gpu)

    def lowered(lw: Lowerer, g: FusionGroup):
        try:
            return lw.group(g, stored, policy, 0, None)
        except ScheduleError:
            return "refused"

    lowered(WARM[name], before)  # (parts judged at other tiles first)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Lowering, "_refused_part", lambda self, loops: None)
        whole = lowered(Lowerer(PLACED[name]), group)
    assert lowered(WARM[name], group) == whole


def test_a_placement_is_not_shared_with_a_tile_its_pieces_refuse() -> None:
    """Under tiles of heads h, the members indexed by the head's group ``g = h // 4`` follow h as its pieces: a
    tile of 4 aligns with them, 3 does not (refused), 2 runs them outside the loop, once. One placement per
    outcome, whatever was lowered before."""
    c = PLACED["grouped"]
    members = ("DT", "A", "DA", "XDT", "ACS", "LM", "CB", "YD")
    lw = Lowerer(c)

    def lower(t: int):
        return lw.group(FusionGroup(members, tiles={"h": t}), frozenset(members), Policy(), 0, None)

    four = lower(4)
    with pytest.raises(ScheduleError, match="does not align"):
        lower(3)
    assert lower(2).members == four.members
    assert lower(4) == four


@settings(max_examples=40, deadline=None, database=None)
@given(st.data())
def test_the_occupancy_probe_is_the_built_schedules_before_hoisting(data) -> None:
    """The fit test (:func:`group_occupancy`: the placement's :class:`~mambalaya.schedule.lower.OccupancyForm` at the
    tiles) holds exactly what the built schedule holds when nothing is hoisted (no capacity to hoist into): every
    buffer, and the same largest partial-sum block, on
    random groups and tiles of random cascades and of the default Mamba-2, sequential and GPU."""
    from analysis.cascades import random_cascades

    from mambalaya.cost.context import CostContext
    from mambalaya.mapper.tiling import tile_options
    from mambalaya.parse.cascade_file import cascade_from_dict
    from mambalaya.schedule import group_occupancy, lower_group

    c = cascade_from_dict(data.draw(random_cascades(max_einsums=5))) if data.draw(st.booleans()) else \
        open_cascade("mamba2")
    an = CostContext(c, "cpu").analysis
    names = c.einsum_names
    i = data.draw(st.integers(0, len(names) - 1))
    members = tuple(names[i:i + data.draw(st.integers(1, 6))])
    assume(an.legal(members))
    lw = Lowerer(c, an)
    loops = [r for r, _ in an.tileable(members) if tile_options(c.rank_size(r))]
    tiled = data.draw(st.sets(st.sampled_from(loops), max_size=3)) if loops else set()
    tiles = {r: data.draw(st.sampled_from(tile_options(c.rank_size(r)))) for r in tiled}
    group = FusionGroup(members, an.loop_order(members), tiles)
    stored = CostContext(c, "cpu").stored_alone(members)
    for policy in (Policy(), Policy(gpu=True)):
        try:
            sched = lower_group(c, group, lw.model(members), lw.forms, stored, policy)
        except ScheduleError:
            continue
        if policy.gpu and sched.grid:
            continue  # (a grid's schedule is placed again with its grid loops: the probe sizes the first placement)
        assert group_occupancy(c, group, lw.model(members), lw.forms, stored, policy) == \
            (sched.occupancy_bytes, sched.accumulator_bytes)


def test_a_grid_ends_before_a_loop_a_member_reads_whole() -> None:
    """``n`` reads the last row of ``X``, which follows the chunk loop ``c`` as a parent, without iterating ``c``.
    Placed without a grid, ``X`` and ``n`` run whole before ``b`` and nothing seems to cross ``c``; placing the grid
    ``(b, c)`` put them back inside it, and each program's ``n`` read rows of ``X`` only another program computes
    (the python backend's provenance read them as NaN: ``verify`` failed). The grid now ends before ``c``, and the
    schedule computes the reference's numbers."""
    from mambalaya.exec.verify import verify_mapping
    from mambalaya.parse.cascade_file import cascade_from_dict

    c = cascade_from_dict({
        "name": "piece", "params": {"L": 16, "D": 4, "Bn": 4, "Q": 4, "C": 4},
        "ranks": {"l": "L", "d": "D", "b": "Bn", "c": "C", "j": "Q"},
        "einsums": ["X[l,d] = A[l,d] * W[d]", "n[d] = X[L-1,d]", "q[b,c,j,d] = B[b,c,j,d] * X[c*Q+j,d]",
                    "p[b,c,j,d] = q[b,c,j,d] * Cc[b,c,j,d]"]})
    group = FusionGroup(tuple(c.einsum_names), ("d", "b", "c", "j"), {"b": 2, "c": 2})
    sched = lower_mapping(c, Mapping((group,), c.name, "h200"), "h200").groups[0]
    assert [lp.rank for lp in sched.loops[:sched.grid]] == ["b"]
    assert verify_mapping(c, "h200", mapping=Mapping((group,), c.name, "h200"), backend="python")["ok"]
