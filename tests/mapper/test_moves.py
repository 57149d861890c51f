"""The mapper's optimum is no worse than any mapping one move from it (two groups merged, one split in two)."""

from __future__ import annotations

import pytest
from analysis.cascades import random_cascades
from hypothesis import HealthCheck, given, settings
from small_cascades import small_cascade

from mambalaya.arch import load_arch
from mambalaya.errors import MappingError
from mambalaya.ir.mapping import unfused_mapping
from mambalaya.mapper import optimal_mapping
from mambalaya.mapper.moves import neighbours, splits
from mambalaya.parse import open_cascade
from mambalaya.parse.cascade_file import cascade_from_dict


def _no_better_neighbour(c, arch) -> None:
    r = optimal_mapping(c, arch)
    nb = neighbours(c, arch, r.mapping)
    assert nb.latency_s == pytest.approx(r.report.latency_s, rel=1e-12)
    # (the solver compares costs in integer units, each group's rounded up: within one unit per group)
    slack = r.resolution * (len(r.groups) + 2) / max(r.report.latency_s, 1e-30)
    assert not nb.better(rel=slack), [(m.kind, m.after, m.latency_s) for m in nb.better(rel=slack)]


@pytest.mark.parametrize("arch", ["mambalaya", "imax3", "cpu", "h200"])
@pytest.mark.parametrize("name", ["mlp2", "attention", "mamba1-decode", "mamba1"])
def test_shipped_optima_beat_their_neighbours(name: str, arch: str) -> None:
    _no_better_neighbour(small_cascade(name), arch)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(random_cascades(max_einsums=5))
def test_random_optima_in_a_small_buffer_beat_their_neighbours(data) -> None:
    c = cascade_from_dict(data)
    arch = load_arch("mambalaya").with_overrides(fusion_buffer_bytes=2048)
    try:
        _no_better_neighbour(c, arch)
    except MappingError:
        pass  # (nothing fits: the mapper says so, tested in test_lazy)


def test_the_unfused_mapping_has_a_better_neighbour_where_fusion_pays() -> None:
    """The check can fail: the unfused Mamba-1 on the Mambalaya accelerator is beaten by merging two of its
    groups (fusion keeps a producer's output on chip), and the moves name real groups of the cascade."""
    c = small_cascade("mamba1")
    nb = neighbours(c, "mambalaya", unfused_mapping(c))
    better = nb.better()
    assert better and all(m.kind == "merge" for m in better)
    assert all(set(m.after[0]) == set(m.before[0]) | set(m.before[1]) for m in better)
    assert nb.best().latency_s < nb.latency_s


def test_splits_are_the_downsets_of_a_group() -> None:
    """The splits of a group are exactly its proper downsets (by brute force over every subset), fewest members
    first, and ``limit`` keeps the first of them and counts the rest."""
    import itertools

    c = open_cascade("mamba1")
    members = ("DT0", "DT", "A", "DA", "BX", "H", "SY", "Y")
    parts, more = splits(c, members)
    closed = set()
    for k in range(1, len(members)):
        for sub in itertools.combinations(members, k):
            if all(t in sub for n in sub for t in c.einsum(n).reads if t in members and t != n):
                closed.add(frozenset(sub))
    assert more == 0 and {frozenset(a) for a, _ in parts} == closed and len(parts) == len(closed)
    assert all(set(a) | set(b) == set(members) and not set(a) & set(b) for a, b in parts)
    assert [len(a) for a, _ in parts] == sorted(len(a) for a, _ in parts)
    few, left = splits(c, members, limit=2)
    assert few == parts[:2] and left == len(parts) - 2
