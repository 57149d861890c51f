"""Every mapping the tool produces runs and verifies: numerics against the reference, counted
traffic against the cost model to the byte (cascade x arch: optimal, greedy, unfused).

Buffers are shrunk so that the mapper and the greedy heuristic pick tiles smaller than the
extents (tiled loop nests, halos across tiles, recurrences carried across tiles, re-read passes).
"""

from __future__ import annotations

import pytest
from analysis.cascades import motif_cascades, random_tiled_mappings
from hypothesis import HealthCheck, given, settings
from small_cascades import SMALL, small_cascade

from mambalaya.analysis import analyze_group
from mambalaya.arch import load_arch
from mambalaya.cost.legality import plain_loop_order
from mambalaya.errors import MambalayaError
from mambalaya.exec.verify import verify_mapping
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.mapper import optimal_mapping
from mambalaya.mapper.heuristics import greedy_mapping, unfused_baseline
from mambalaya.parse import open_cascade

ARCHS = ("imax3", "mambalaya", "marca", "h100", "h200")
BACKENDS = ("numba", "python", "triton")


def _small(name: str):
    return small_cascade(name)


def _check(cascade, arch, mapping, backend: str = "numba") -> dict:
    if backend == "triton":
        pytest.importorskip("triton")
        pytest.importorskip("torch")
    r = verify_mapping(cascade, arch, mapping=mapping, backend=backend)
    assert r["numerics_ok"], r
    assert r["traffic_counted_bytes"] == r["traffic_predicted_bytes"], (
        r["traffic_predicted_by_tensor"], r["traffic_counted_by_tensor"])
    return r


def _mappings(cascade, arch, kinds=("optimal", "greedy", "unfused")):
    if "optimal" in kinds:
        yield "optimal", optimal_mapping(cascade, arch).mapping
    if "greedy" in kinds:
        yield "greedy", greedy_mapping(cascade, arch)
    if "unfused" in kinds:
        yield "unfused", unfused_baseline(cascade, arch)


#: the default suite's subset (numba compiles each group's kernel, triton interprets it: keep it small)
#: (the slow step's matrix, FULL, runs every kind of mapping of every small cascade on every arch, Triton included)
FAST = [("mamba1", "imax3", 2048, ("optimal",), "numba"), ("mlp2", "h100", 512, ("optimal", "greedy", "unfused"), "numba"),
        ("mamba1", "mambalaya", 2048, ("optimal",), "python")]


@pytest.mark.parametrize(("name", "arch_name", "buffer", "kinds", "backend"), FAST)
def test_matrix_fast(name: str, arch_name: str, buffer: int, kinds: tuple[str, ...], backend: str) -> None:
    c = _small(name)
    arch = load_arch(arch_name).with_overrides(fusion_buffer_bytes=buffer)
    tiled = 0
    for _, m in _mappings(c, arch, kinds):
        _check(c, arch, m, backend)
        tiled += sum(1 for g in m.groups if g.tiles)
    assert tiled, "the shrunken buffer should force some tiling"


#: the slow step's matrix: every small cascade on every arch in a 2 KiB buffer (tiles, halos across tiles,
#: re-reads) on Numba, on h200 in Triton (interpreted without a GPU), and the default shapes whole
#: on h200 (one Numba kernel per group, ~1-2 min for Mamba-2's three mappings)
FULL = [(n, a, 2048, "numba") for n in sorted(SMALL) for a in ARCHS] + \
    [(n, "h200", 2048, "triton") for n in sorted(SMALL)] + \
    [(n, "h200", None, "numba") for n in sorted(SMALL) if n != "mamba2"]  # (mamba2: test_space's default-mamba2 test)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "arch_name", "shrink", "backend"), FULL)
def test_matrix_full(name: str, arch_name: str, shrink: int | None, backend: str) -> None:
    c = _small(name) if shrink or backend == "triton" else open_cascade(name)
    arch = load_arch(arch_name)
    if shrink:
        arch = arch.with_overrides(fusion_buffer_bytes=shrink)
    if backend == "triton":  # the interpreter runs each program in Python: a grid for 8 slots, not 132 (mamba2's
        arch = arch.with_overrides(program_slots=8)  # optimum verifies in 49 s instead of 331; still a grid of tiles)
    try:
        maps = list(_mappings(c, arch))
    except MambalayaError:
        pytest.skip("no mapping fits the shrunken buffer")
    for _, m in maps:
        _check(c, arch, m, backend)


@pytest.mark.slow
def test_hand_tiled_group_with_halo_recurrence_and_rereads() -> None:
    """One whole Mamba-1 layer tiled along tokens (l): every intermediate on chip, the conv halo and the scan state carried across tiles."""
    c = _small("mamba1")
    arch = load_arch("imax3").with_overrides(fusion_buffer_bytes=8192)  # the weights and the tiles, together
    names = c.einsum_names
    order = plain_loop_order(analyze_group(c, names).loop_order)
    for tiles in ({"l": 4}, {"l": 1}):
        m = Mapping((FusionGroup(names, order, tiles),), c.name)
        r = _check(c, arch, m)
        assert r["traffic_counted_bytes"] > 0


def test_recompute_reruns_the_producer() -> None:
    c = _small("mamba1")
    names = list(c.einsum_names)
    groups = [FusionGroup((n,)) for n in names]
    i = names.index("DT")  # DT is read by DA and BX-side consumers; every consumer group recomputes it
    consumers = {names.index(x) for x in c.consumers("DT")}
    groups = [FusionGroup(g.einsums, recompute=("DT",)) if k in consumers else g for k, g in enumerate(groups)]
    m = Mapping(tuple(groups), c.name)
    r = _check(c, load_arch("mambalaya"), m)
    assert "DT" not in r["traffic_counted_by_tensor"]  # never written, never read
    assert i >= 0


# ---- random cascades x random legal mappings --------------------------------


def cascade_and_mapping():
    return random_tiled_mappings(max_einsums=5, buffers=(64, 256, 1 << 20))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cascade_and_mapping())
def test_random_cascades_random_legal_mappings(case, backend: str) -> None:
    c, m, buffer = case
    arch = load_arch("h200" if backend == "triton" else "mambalaya").with_overrides(fusion_buffer_bytes=buffer)
    try:
        from mambalaya.schedule import lower_mapping

        lower_mapping(c, m, arch)
    except MambalayaError:
        return  # the tiles do not fit the buffer: refused, with the reason
    _check(c, arch, m, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cascade_and_mapping())
def test_random_cascades_random_legal_mappings_many(case, backend: str) -> None:
    test_random_cascades_random_legal_mappings.hypothesis.inner_test(case, backend)


# ---- the forms a researcher writes next x random legal mappings under tiny buffers --------------------------


def motifs_and_mapping():
    return random_tiled_mappings(max_einsums=0, buffers=(48, 96, 256, 1 << 20), cascades=motif_cascades())


def _check_motif(case, backend: str) -> None:
    """Verifies, or is refused with a reason (the tiles do not fit, or the schedule cannot run them): never a
    crash, never a wrong number (float64: within 1e-12 of the scale), counted traffic equal to predicted."""
    c, m, buffer = case
    arch = load_arch("h200" if backend == "triton" else "mambalaya").with_overrides(fusion_buffer_bytes=buffer)
    try:
        from mambalaya.schedule import lower_mapping

        lower_mapping(c, m, arch)
    except MambalayaError as err:
        assert str(err), "a refusal names its cause"
        return
    r = _check(c, arch, m, backend)
    assert r["max_rel_err"] <= 1e-12, r


@pytest.mark.parametrize("backend", BACKENDS[:2])
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=motifs_and_mapping())
def test_motif_cascades_random_legal_mappings(case, backend: str) -> None:
    _check_motif(case, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=motifs_and_mapping())
def test_motif_cascades_random_legal_mappings_many(case, backend: str) -> None:
    _check_motif(case, backend)
