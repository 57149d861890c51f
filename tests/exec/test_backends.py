"""Every backend runs the schedule it is given: the reference's numbers, the predicted bytes, the capacity.

The cases the old executors got wrong, each tiled along the rank it reads forward (so the group's tiles
must be produced ahead of their readers): a forward halo ``A[l+1]``, a dilated window ``A[l+2k-6]`` and a
forward slice of a shorter rank ``A[h+3]``; and a group whose three weights fit the buffer one at a time but
not together (their re-reads are in the prediction, and the counted bytes match it).
"""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.arch import load_arch
from mambalaya.errors import MambalayaError
from mambalaya.exec.backend import backend_names, execute, get_backend
from mambalaya.exec.reference import random_inputs
from mambalaya.exec.verify import verify_mapping
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.mapper import optimal_mapping
from mambalaya.parse import parse_cascade_text
from mambalaya.schedule import lower_mapping

BACKENDS = ["python", "numba", "triton"]

FORWARD_HALO = """
name: forward_halo
params: {L: 12, D: 3}
ranks: {l: L, d: D}
einsums:
  - A[l,d] = exp(X[l,d]) * 0.5
  - B[l,d] = A[l+1,d] + A[l,d] * W[d]
"""

DILATED = """
name: dilated
params: {L: 14, D: 2, K: 4}
ranks: {l: L, d: D, k: K}
einsums:
  - A[l,d] = silu(X[l,d])
  - B[l,d] = W[d,k] * A[l+2*k-6,d]
"""

FORWARD_SLICE = """
name: forward_slice
params: {H: 5, G: 8}
ranks: {h: H, g: G}
tensors: {A: {shape: [G]}}
einsums:
  - A[g] = X[g] * X[g]
  - Y[h] = A[h+3] - A[h+1]
"""

#: three weights of 3x8 (96 B each): any one fits a 256 B buffer beside its tiles, all three do not
THREE_WEIGHTS = """
name: three_weights
params: {M: 8, K: 3, N: 8}
ranks: {m: M, k: K, n: N}
tensors: {W1: {role: weight}, W2: {role: weight}, W3: {role: weight}}
einsums:
  - P[m,n] = A[m,k] * W1[k,n]
  - Q[m,n] = P[m,n] * W2[k,n] * A[m,k]
  - R[m,n] = Q[m,n] + A[m,k] * W3[k,n]
"""


def _need(backend: str) -> None:
    if backend == "triton":
        pytest.importorskip("torch")
        pytest.importorskip("triton")
    why = get_backend(backend).available()
    if why:
        pytest.skip(why)


def _verify(cascade, arch, mapping, backend):
    r = verify_mapping(cascade, arch, mapping=mapping, backend=backend)
    assert r["numerics_ok"], (r["max_rel_err"], r["worst_tensor"])
    assert r["traffic_counted_by_tensor"] == r["traffic_predicted_by_tensor"]
    return r


def test_the_registry_lists_the_shipped_backends() -> None:
    assert {"python", "numba", "triton"} <= set(backend_names())
    with pytest.raises(MambalayaError, match="unknown backend 'cuda'.*numba"):
        get_backend("cuda")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("text", "rank", "tile"), [(FORWARD_HALO, "l", 5), (DILATED, "l", 4), (FORWARD_SLICE, "g", 2)])
def test_forward_reads_tiled_along_their_rank(text: str, rank: str, tile: int, backend: str) -> None:
    _need(backend)
    c = parse_cascade_text(text)
    names = c.einsum_names
    from mambalaya.analysis import analyze_group
    from mambalaya.cost.legality import plain_loop_order

    order = plain_loop_order(analyze_group(c, names).loop_order)
    m = Mapping((FusionGroup(names, order, {rank: tile}),), c.name)
    arch = load_arch("h200" if backend == "triton" else "mambalaya")
    s = lower_mapping(c, m, arch)
    g = s.groups[0]
    assert [lp.rank for lp in g.loops] == [rank]
    # the producer runs ahead of its reader, or is recomputed at the read (its input's box slides)
    assert any("ahead" in n for n in g.notes) or dict(g.inline), g.notes
    _verify(c, arch, m, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mapper_optimum_of_forward_reads_in_a_small_buffer(backend: str) -> None:
    """The mapper's own choice on a buffer that forces tiles: verified, not hand-written."""
    _need(backend)
    c = parse_cascade_text(FORWARD_HALO.replace("L: 12", "L: 40"))
    arch = load_arch("h200" if backend == "triton" else "mambalaya").with_overrides(fusion_buffer_bytes=200)
    m = optimal_mapping(c, arch).mapping
    assert any(g.tiles for g in m.groups)
    _verify(c, arch, m, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_that_do_not_fit_together_are_reread(backend: str) -> None:
    _need(backend)
    c = parse_cascade_text(THREE_WEIGHTS)
    m = Mapping((FusionGroup(("P", "Q", "R"), ("m", "n", "k"), {"m": 1, "n": 2}),), c.name)
    arch = load_arch("mambalaya")  # (on a GPU each program of the m grid loads its own: 8 x 288 B)
    roomy = _verify(c, arch, m, backend)
    tight = _verify(c, arch.with_overrides(fusion_buffer_bytes=256), m, backend)
    weights = sum(tight["traffic_counted_by_tensor"][w] for w in ("W1", "W2", "W3"))
    assert sum(roomy["traffic_counted_by_tensor"][w] for w in ("W1", "W2", "W3")) == 3 * 96
    assert weights > 3 * 96  # some weight is read again per m tile, and counted so
    assert max(tight["occupancy_bytes"]) <= 256


def test_numba_runs_in_an_arena_of_the_capacity() -> None:
    c = parse_cascade_text(THREE_WEIGHTS)
    m = Mapping((FusionGroup(("P", "Q", "R"), ("m", "n", "k"), {"m": 1, "n": 2}),), c.name)
    s = lower_mapping(c, m, load_arch("mambalaya").with_overrides(fusion_buffer_bytes=256))
    from mambalaya.exec.numba_backend import run_schedule

    with pytest.raises(MambalayaError, match="more than the arena's 128"):
        run_schedule(c, s, random_inputs(c), arena_bytes=128)


def test_float32_and_a_second_run_hits_the_kernel_cache() -> None:
    c = parse_cascade_text(FORWARD_HALO)
    s = lower_mapping(c, Mapping((FusionGroup(c.einsum_names),), c.name), "mambalaya")
    first = execute(c, s, random_inputs(c, 1), "numba", "float32")
    again = execute(c, s, random_inputs(c, 1), "numba", "float32")
    assert again.compile_s < 1.0 and first.outputs["B"].dtype == np.float32
    np.testing.assert_array_equal(first.outputs["B"], again.outputs["B"])


@pytest.mark.parametrize("backend", ["python", pytest.param("numba", marks=pytest.mark.slow)])
def test_a_tail_read_of_a_chunked_rank_runs_after_the_chunk_loop(backend: str) -> None:
    """Mamba-2's final conv state ``CSF[k] = X[seqlen-4+k]`` in a group tiled by chunks ``c`` (``l`` follows as
    their parent): CSF reads the last rows, computed by the last chunk, so it runs after the loop (it ran in
    the first chunk and read rows not yet computed: the mapper's h200 optimum of mamba2-370m was wrong)."""
    _need(backend)
    from small_cascades import small_cascade

    c = small_cascade("mamba2")
    ssd = [n for n in c.einsum_names if n not in ("Z", "YG", "NV", "YN", "OUT")]
    m = Mapping((FusionGroup(tuple(ssd), tiles={"c": 1}), *(FusionGroup((n,)) for n in ("Z", "YG", "NV", "YN", "OUT"))),
                c.name)
    arch = load_arch("h200")
    g = lower_mapping(c, m, arch, check=False).groups[0]
    from mambalaya.schedule import Compute, LoopBlock

    inside = [s.einsum for blk in g.body if isinstance(blk, LoopBlock) for s in blk.body if isinstance(s, Compute)]
    assert "XBC0" in inside and "CSF" not in inside
    _verify(c, arch.with_overrides(fusion_buffer_bytes=2**30), m, backend)


ACCUMULATED_HALO = """
name: accumulated_halo
params: {na: 4, nb: 4, nw: 2}
ranks: {i: nb, j: nb, m: na, w: nw}
einsums:
  - T1[i] = I1[j] * I2[i]
  - T2[i,m] = exp(I2[i] * T1[i] * I3[m])
  - T3[m] = sum_i(I1[j] * T2[i,m+w-1])
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_member_accumulated_over_an_outer_loop_is_stored_whole(backend: str) -> None:
    """T3 sums over the outer loop i and is computed per tile of the inner loop m: its store after the i loop
    covers every m (the Numba kernel stored only the last m tile, found by the random-schedule property)."""
    _need(backend)
    c = parse_cascade_text(ACCUMULATED_HALO)
    m = Mapping((FusionGroup(("T1",)), FusionGroup(("T2", "T3"), ("i", "m"), {"i": 2, "m": 1})), c.name)
    arch = load_arch("h200" if backend == "triton" else "mambalaya")
    _verify(c, arch, m, backend)


def test_numba_prints_a_group_once_however_often_it_runs(monkeypatch) -> None:
    """Printing a group's source costs milliseconds, more than a decode step's kernel: a schedule run again is
    not printed again (and a new schedule object is)."""
    import mambalaya.exec.numba_backend as nb

    c = parse_cascade_text(THREE_WEIGHTS)
    m = Mapping((FusionGroup(("P", "Q", "R"), ("m", "n", "k"), {"m": 1, "n": 2}),), c.name)
    printed = []
    real = nb.group_source
    monkeypatch.setattr(nb, "group_source", lambda *a: printed.append(1) or real(*a))
    s = lower_mapping(c, m, load_arch("mambalaya"))
    inputs = random_inputs(c, seed=0)
    first = execute(c, s, inputs, "numba", "float64").outputs
    again = execute(c, s, inputs, "numba", "float64").outputs
    assert len(printed) == 1 and all(np.array_equal(first[k], again[k]) for k in first)
    execute(c, lower_mapping(c, m, load_arch("mambalaya")), inputs, "numba", "float64")
    assert len(printed) == 2
