"""Recomputation in the search (``recompute=True``): exact against brute force, and what it returns runs.

Recompute pays where groups are small (a size cap, or a small buffer): a point-wise tensor with
several consumer groups is re-run by each of them instead of written once and read back.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mapper.test_mapper import _same, cascades
from small_cascades import small_cascade

from mambalaya.errors import MappingError
from mambalaya.exec.verify import verify_mapping
from mambalaya.mapper import evaluate, optimal_mapping
from mambalaya.mapper.recompute import recomputable
from mambalaya.parse import open_cascade, parse_cascade_text


def _consistent(c, arch, r) -> None:
    """The solver's sum is the cost model's figure for the mapping it returns (write rule included)."""
    rep = evaluate(c, arch, r.mapping)
    value = rep.latency_s if r.objective == "latency" else rep.traffic_bytes
    assert math.isclose(value, r.objective_value, rel_tol=1e-9), (value, r.objective_value, r.groups)


def test_recomputable_tensors() -> None:
    assert set(recomputable(open_cascade("mamba1"))) == {"X", "DT"}
    assert "YG" in recomputable(open_cascade("mamba2"))
    assert not recomputable(open_cascade("attention"))


@pytest.mark.parametrize("name", ["mamba1-decode", "mamba2-decode", "mamba1"])
@pytest.mark.parametrize("arch", ["imax3", "h200"])
@pytest.mark.parametrize("max_size", [1, 2])
def test_recompute_ilp_equals_exhaustive(name: str, arch: str, max_size: int) -> None:
    c = small_cascade(name, chunk=4)
    for objective in ("latency", "traffic"):
        ilp = optimal_mapping(c, arch, objective, recompute=True, max_size=max_size)
        ex = optimal_mapping(c, arch, objective, method="exhaustive", recompute=True, max_size=max_size)
        assert ilp.optimal and ex.optimal
        _same(ilp, ex)
        _same(ilp, optimal_mapping(c, arch, objective, method="cpsat", recompute=True, max_size=max_size))
        _consistent(c, arch, ilp)
        plain = optimal_mapping(c, arch, objective, max_size=max_size)
        assert ilp.objective_value <= plain.objective_value * (1 + 1e-12)  # a superset of the space


def _verified(c, arch, r) -> None:
    out = verify_mapping(c, arch, mapping=r.mapping)
    assert out["numerics_ok"], out
    assert out["traffic_counted_bytes"] == out["traffic_predicted_bytes"], (
        out["traffic_predicted_by_tensor"], out["traffic_counted_by_tensor"])


@pytest.mark.parametrize("name,arch,max_size,objective", [("mamba1-decode", "imax3", 2, "traffic"),
                                                          ("mamba2-decode", "imax3", 2, "traffic")])
def test_recompute_mapping_runs(name: str, arch: str, max_size: int, objective: str) -> None:
    """The executor re-runs the producer, computes the reference's numbers and moves the predicted bytes."""
    c = small_cascade(name, chunk=4)
    r = optimal_mapping(c, arch, objective, recompute=True, max_size=max_size)
    assert any(g.recompute for g in r.mapping.groups)
    _verified(c, arch, r)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mamba1-decode", "mamba2-decode", "mamba1", "mamba2"])
@pytest.mark.parametrize("arch", ["imax3", "h200"])
@pytest.mark.parametrize("max_size", [1, 2, 3])
@pytest.mark.parametrize("objective", ["latency"])
def test_every_recompute_mapping_runs(name: str, arch: str, max_size: int, objective: str) -> None:
    c = small_cascade(name, chunk=4)
    r = optimal_mapping(c, arch, objective, recompute=True, max_size=max_size)
    _consistent(c, arch, r)
    if any(g.recompute for g in r.mapping.groups):
        _verified(c, arch, r)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=cascades(), arch=st.sampled_from(["imax3", "h200", "mambalaya"]),
       objective=st.sampled_from(["latency", "traffic"]), max_size=st.sampled_from([1, 2, 3, None]))
def test_random_cascades_recompute_ilp_equals_exhaustive(text: str, arch: str, objective: str,
                                                         max_size: int | None) -> None:
    c = parse_cascade_text(text, file="<random>")
    ilp = optimal_mapping(c, arch, objective, recompute=True, max_size=max_size)
    ex = optimal_mapping(c, arch, objective, method="exhaustive", recompute=True, max_size=max_size)
    assert ilp.optimal
    _same(ilp, ex)
    _consistent(c, arch, ilp)


def test_recompute_maps_one_layer() -> None:
    with pytest.raises(MappingError, match="one layer"):
        optimal_mapping(open_cascade("mamba1-decode"), "imax3", recompute=True, layers=2)
