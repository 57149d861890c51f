"""A latency and its parts: the terms a report lists add up to it, and no Einsum's share of a fused group's latency
is below its own compute time (a per-Einsum utilisation over 100 % read as a bug to users)."""

from __future__ import annotations

import pytest

from mambalaya.cost.latency import group_latency, latency_parts
from mambalaya.mapper import optimal_mapping
from mambalaya.parse import open_cascade

#: fused optima with every kind of term: overheads (mambalaya), transfers and pipeline fill (imax3), grids, staging
#: and recurrence chains (h200); the mamba2-130m one split its group's latency below a member's compute time
#: (104 %) when shares were in proportion to max(compute, memory) alone
CASES = [("mamba2", "mamba2-130m", {"seqlen": 512}, "mambalaya"), ("mamba2", None, {}, "imax3"),
         ("mamba1-decode", None, {}, "h200"), ("mamba1", None, {}, "cpu")]


@pytest.mark.parametrize(("cascade", "model", "params", "arch"), CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_the_parts_add_up_and_every_share_covers_its_compute(cascade, model, params, arch) -> None:
    rep = optimal_mapping(open_cascade(cascade, model=model, params=params), arch).report
    assert any(len(g.einsums) > 1 for g in rep.groups)  # (a fused group: the split matters)
    for g in rep.groups:
        assert sum(g.parts().values()) == pytest.approx(g.latency_s, rel=1e-12)
        shares = [e for e in rep.einsums if e.group == g.index]
        assert sum(e.latency_s for e in shares) == pytest.approx(g.latency_s, rel=1e-12)
        assert all(e.latency_s >= e.compute_s * (1 - 1e-12) for e in shares), [(e.name, e.compute_util) for e in shares]
    assert sum(rep.parts().values()) == pytest.approx(rep.latency_s, rel=1e-12)


def test_each_term_is_what_it_says() -> None:
    """A grid of 33 programs on 132 slots runs its roofline 4x longer: 3 parts idle; a chain longer than that is
    waited for; staging adds to the roofline."""
    from mambalaya.arch import load_arch

    arch = load_arch("h200")
    frac = 33 / arch.program_slots
    lat, ovh = group_latency(arch, 2e-6, 0, 3, programs=33, chain_s=10e-6, staging_s=1e-6)
    parts = latency_parts(2e-6, 0.0, 1e-6, frac, 10e-6, ovh)
    assert parts["roofline_s"] == 2e-6 and parts["staging_s"] == 1e-6
    assert parts["idle_s"] == pytest.approx(9e-6) and parts["chain_wait_s"] == 0
    assert sum(parts.values()) == pytest.approx(lat)
    lat2, _ = group_latency(arch, 2e-6, 0, 3, programs=33, chain_s=20e-6, staging_s=1e-6)
    parts2 = latency_parts(2e-6, 0.0, 1e-6, frac, 20e-6, ovh)
    assert parts2["chain_wait_s"] == pytest.approx(8e-6) and sum(parts2.values()) == pytest.approx(lat2)
