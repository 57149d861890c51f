"""The tiling search's shortcuts find what a brute-force search finds, on every group of real spaces."""

from __future__ import annotations

import pytest

from mambalaya.arch import load_arch
from mambalaya.mapper import optimal_mapping
from mambalaya.mapper.space import Rejected, _largest_fit, _Need, _tile_options, build_space
from mambalaya.parse import open_cascade


def _spaces():
    published = {"model": "mamba2-370m", "params": {"batch": 64, "seqlen": 2048}}
    for name, arch, sizes in [("mamba2", "h200", {}), ("mamba1", "imax3", {}), ("attention", "mambalaya", {}),
                              ("mamba2", "h200", published)]:
        space = build_space(open_cascade(name, **sizes), load_arch(arch))
        yield space, space.coster


@pytest.mark.parametrize("scale", [1 / 64, 1 / 4, 1.0])
def test_pair_staircase_and_steps_equal_brute_force(scale: float) -> None:
    checked = 0
    for space, coster in _spaces():
        cap = int(space.arch.fusion_buffer_bytes * scale)
        for key in list(coster._needs)[:300]:
            cg = coster.analyse(key)
            size = {r.name: r.size for r in cg.loops.ranks}
            tiled = [r.name for r in cg.loops.ranks if r.tiled and r.size > 1 and r.name in coster.cascade.rank_exprs]
            if len(tiled) < 2:
                continue
            fresh = _Need(cg)  # no memo shared with the space
            r0, r1, rest = tiled[0], tiled[1], {r: size[r] for r in tiled[2:]}
            o0, o1 = _tile_options(size[r0]), _tile_options(size[r1])
            for i, j in enumerate(fresh.pair(rest, r0, o0, r1, o1).largest(cap)):
                fits = [fresh({**rest, r0: o0[i], r1: t1}) <= cap for t1 in o1]
                assert j == (fits.index(True) if any(fits) else None)
            for step in fresh.steps(tuple(tiled), size):
                fits = [fresh({**step.tiles, step.rank: t}) <= cap for t in step.options]
                assert _largest_fit(step, cap) == (step.options[fits.index(True)] if any(fits) else None)
            checked += 1
    assert checked > 50


def test_cheap_rejections_are_rejections() -> None:
    """A group rejected by the loop model's lower bound needs more than the buffer at tile 1 indeed."""
    checked = 0
    for space, coster in _spaces():
        cheap = [k[0] for k, ch in coster.shapes.items() if isinstance(ch, Rejected) and ch.reason.startswith("needs at")]
        for members in cheap:
            assert coster.analyse(members).buffer_min_bytes > space.arch.fusion_buffer_bytes
        checked += len(cheap)
    assert checked > 100


def test_gc_is_restored() -> None:
    """The mapper pauses the cyclic collector while it runs, and leaves it as it found it."""
    import gc

    assert gc.isenabled()
    optimal_mapping(open_cascade("mamba1-decode"), "imax3")
    assert gc.isenabled()
    gc.disable()
    try:
        optimal_mapping(open_cascade("mamba1-decode"), "imax3")
        assert not gc.isenabled()
    finally:
        gc.enable()
