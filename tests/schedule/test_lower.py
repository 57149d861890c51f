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
