"""The python backend's provenance check: a buffer cell read as one element while a load put another there.

The bytes a run counts follow the schedule's own boxes, so a wrong window moves exactly the bytes predicted;
what shows it is that a cell holds another element than its base says (a row a load skipped): it reads as NaN."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from mambalaya.arch import load_arch
from mambalaya.exec.backend import execute
from mambalaya.exec.reference import random_inputs, run_reference
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.parse import parse_cascade_text
from mambalaya.schedule import Load, LoopBlock, lower_mapping

TOEPLITZ = """
name: toeplitz
params: {P: 5, Q: 6}
derived: {PQ: P+Q-1}
ranks: {p: P, q: Q}
tensors:
  V: {role: input, shape: [Q]}
  W: {role: weight, shape: [PQ]}
einsums:
  - Y[p] = sum_q(W[p-q+Q-1] * V[q])
"""


def _slid(body, tensor: str, loop: int):
    """The statement tree with ``tensor``'s load made to slide along ``loop`` (only rows past the last tile's)."""
    out = []
    for s in body:
        if isinstance(s, LoopBlock):
            s = replace(s, body=_slid(s.body, tensor, loop))
        elif isinstance(s, Load) and s.tensor == tensor:
            s = replace(s, slides=0, slide_loop=loop)
        out.append(s)
    return tuple(out)


def test_a_window_sliding_the_wrong_way_fails_even_where_stale_values_agree() -> None:
    c = parse_cascade_text(TOEPLITZ)
    m = Mapping((FusionGroup(("Y",), ("p", "q"), {"q": 2}),), c.name)
    s = lower_mapping(c, m, load_arch("mambalaya"))
    g = s.groups[0]
    q = next(j for j, lp in enumerate(g.loops) if lp.rank == "q")
    inputs = {**random_inputs(c, 0), "W": np.ones(c.shape("W"))}  # (a stale row of W holds the right value)
    want = run_reference(c, inputs)["Y"]
    honest = execute(c, s, inputs, "python", "float64")
    assert np.allclose(honest.outputs["Y"], want, rtol=1e-12)
    # W's index falls as q rises: a load keeping only rows past the last tile's skips the rows this tile needs
    broken = replace(s, groups=(replace(g, body=_slid(g.body, "W", q)),))
    got = execute(c, broken, inputs, "python", "float64")
    assert got.traffic_bytes < honest.traffic_bytes  # (what it skipped: counted as the boxes say)
    assert np.isnan(got.outputs["Y"]).any()
