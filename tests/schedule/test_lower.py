"""Lowering refuses tilings that would leave indices of a rank uncomputed."""

from __future__ import annotations

import pytest

from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.parse import open_cascade
from mambalaya.schedule import ScheduleError, lower_mapping

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
