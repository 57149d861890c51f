"""The Triton backend against the reference interpreter.

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set here before triton
is imported, on CPU torch tensors) on the shipped cascades' small default shapes: every cascade with the
unfused mapping, the greedy fused mapping for h200 and the whole cascade as one group. Tests marked
``gpu`` run the same kernels compiled for a CUDA device and are skipped without one.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from mambalaya.cost import greedy_mapping  # noqa: E402
from mambalaya.exec.reference import random_inputs, run_reference  # noqa: E402
from mambalaya.exec.triton_backend import (  # noqa: E402
    DOT_CONFIGS,
    POINT_CONFIGS,
    SCAN_CONFIGS,
    DotConfig,
    ScanConfig,
    compare,
    run_triton,
    triton_available,
    verify_triton,
)
from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping  # noqa: E402
from mambalaya.parse import open_cascade  # noqa: E402

SHIPPED = ["mlp2", "attention", "mamba1-decode", "mamba2-decode", "mamba1", "mamba2"]
#: Interpreter-sized shapes (the interpreter runs each program in Python); the defaults run in slow tests.
SMALL = {
    "mamba1": {"seqlen": 24, "d_model": 32, "batch": 2},
    "mamba2": {"seqlen": 40, "chunk": 16, "d_model": 32, "headdim": 16, "batch": 2},
    "attention": {"seqlen": 32},
}


def _small(name: str):
    return open_cascade(name, params=SMALL.get(name))
ON_GPU = torch.cuda.is_available()

if not triton_available()[0]:
    pytest.skip(f"Triton cannot run here: {triton_available()[1]}", allow_module_level=True)


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAMBALAYA_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kernels"))
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # exp overflow inside silu is expected


def _one_group(cascade) -> Mapping:
    return Mapping((FusionGroup(cascade.einsum_names),), cascade.name)


def _check(cascade, mapping: Mapping, dtype: str = "float32", precision: str = "fp32") -> dict:
    res = verify_triton(cascade, mapping, seed=0, dtype=dtype, matmul_precision=precision)
    assert res["fallbacks"] == [], res["fallbacks"]
    assert res["ok"], f"{cascade.name}: rel err {res['max_rel_err']:.3g} > {res['tolerance']} in {res['worst_tensor']}"
    return res


@pytest.mark.parametrize("name", SHIPPED)
def test_unfused_matches_reference(name: str) -> None:
    _check(_small(name), unfused_mapping(_small(name)))


@pytest.mark.parametrize("name", SHIPPED)
def test_greedy_fused_matches_reference(name: str) -> None:
    cascade = _small(name)
    mapping = greedy_mapping(cascade, "h200")
    assert any(len(g.einsums) > 1 for g in mapping.groups)
    _check(cascade, mapping)


@pytest.mark.parametrize("name", SHIPPED)
def test_whole_cascade_as_one_kernel(name: str) -> None:
    """The most aggressive fusion: every Einsum in one kernel (phases, inlining, scratch, barriers)."""
    _check(_small(name), _one_group(_small(name)))


@pytest.mark.parametrize("name", ["mamba2", "mamba1-decode"])
def test_float64_is_exact(name: str) -> None:
    res = _check(_small(name), _one_group(_small(name)), dtype="float64")
    assert res["max_rel_err"] < 1e-9


@pytest.mark.parametrize(
    "point", [pytest.param(p, marks=[] if p == POINT_CONFIGS[-1] else pytest.mark.slow) for p in POINT_CONFIGS])
@pytest.mark.parametrize("name", ["mamba1", "mamba2"])
def test_every_block_choice_matches_reference(name: str, point: tuple[int, int]) -> None:
    """The GPU autotuner picks among these block sizes per group: each must compute the same thing."""
    _matches_reference(name, point=point)


def _matches_reference(name: str, **choice):
    cascade = _small(name)
    mapping = greedy_mapping(cascade, "h200")
    inputs = random_inputs(cascade, seed=1)
    ref = run_reference(cascade, inputs)
    got = run_triton(cascade, mapping, inputs, **choice)
    assert got.fallbacks == []
    _, rel, worst = compare({n: ref[n] for n in got.outputs}, got.outputs)
    assert rel < 1e-4, f"{name} with {choice}: {rel:.3g} in {worst}"
    return got


@pytest.mark.parametrize(
    "config", [pytest.param(c, marks=[] if c == DOT_CONFIGS[-1] else pytest.mark.slow) for c in DOT_CONFIGS[1:]])
def test_every_tile_choice_matches_reference(config: DotConfig) -> None:
    """Each tl.dot tile choice, swapped operands (out^T = B^T A^T) included, computes the same thing."""
    got = _matches_reference("mamba2", config=config)
    dots = [g for g in got.groups if g.dot_einsums and not g.scan]
    assert dots and all(g.variant["swapped"] == config.swap for g in dots)


def test_swapped_product_keeps_the_causal_k_bound() -> None:
    """The SSD's causal K-loop bound follows the query rank to tl.dot's N side when operands swap."""
    from mambalaya.exec.triton_codegen import group_plan, group_source

    cascade = _small("mamba2")
    rest = [n for n in cascade.einsum_names if n not in ("LM", "YD")]
    mapping = Mapping((FusionGroup(tuple(rest)), FusionGroup(("LM", "YD"))), cascade.name)
    sources = []
    for swap in (False, True):
        plan = group_plan(cascade, mapping, 1, dot_swap=swap)
        sources.append(group_source(cascade, mapping, plan, "float32", "tf32", interpret=False))
    plain, swapped = sources
    assert "tl.dot(" in plain and "tl.dot(" in swapped and plain != swapped
    for src in sources:  # the loop stops at the tile's last query (the GPU form; the interpreter runs it all)
        assert "tl.minimum(16, tl.max(" in src, src


def test_mn_major_operands_are_staged_k_major_ones_feed_tl_dot_directly() -> None:
    """A loaded tf32 operand whose contiguous axis is not a K rank goes through registers (the K mask);
    the in_proj GEMM's K-major operands and every bf16 operand (converted in registers anyway) do not."""
    from mambalaya.exec.triton_codegen import group_plan, group_source

    cascade = _small("mamba2")
    groups = [("Z",), ("DS", "ST")]
    rest = tuple(n for n in cascade.einsum_names if n not in ("Z", "DS", "ST"))
    mapping = Mapping(tuple(FusionGroup(g) for g in (*groups, rest)), cascade.name)

    def operands(gi: int, precision: str) -> list[str]:
        src = group_source(cascade, mapping, group_plan(cascade, mapping, gi), "float32", precision)
        return [line.strip() for line in src.splitlines() if "tl.broadcast_to(" in line]

    assert not any("tl.where(lane_k" in x for x in operands(0, "tf32")), operands(0, "tf32")
    staged = [x for x in operands(1, "tf32") if "tl.where(lane_k" in x]
    assert len(staged) == 1, operands(1, "tf32")  # XBC's B columns: n is contiguous, q is the K rank
    assert not any("tl.where(lane_k" in x for x in operands(1, "bf16"))


@pytest.mark.parametrize(
    "scan", [pytest.param(s, marks=[] if s == SCAN_CONFIGS[-1] else pytest.mark.slow) for s in SCAN_CONFIGS])
def test_every_scan_chunking_matches_reference(scan: ScanConfig) -> None:
    """The autotuner's chunk lengths and rows per program for a fused scan compute the same thing."""
    got = _matches_reference("mamba1", scan=scan)
    scans = [g for g in got.groups if g.scan]
    assert scans and all(g.variant["scan_steps"] == scan[0] for g in scans)


@pytest.mark.parametrize("name", [pytest.param("mamba1", marks=pytest.mark.slow), "mamba2"])
def test_autotuner_tries_every_choice_and_keeps_a_correct_one(name: str) -> None:
    """The GPU autotuner's loop, run under the interpreter (wall-clock timings): every group tries its
    whole menu, none fails, and what it keeps computes the reference's result."""
    cascade = _small(name)
    mapping = greedy_mapping(cascade, "h200")
    inputs = random_inputs(cascade, seed=2)
    got = run_triton(cascade, mapping, inputs, autotune=True)
    assert got.fallbacks == []
    for g in got.groups:
        menu = SCAN_CONFIGS if g.scan else DOT_CONFIGS if g.dot_einsums else POINT_CONFIGS
        assert [tuple(c) for c, _ in g.tuned] == [tuple(c) for c in menu], g.einsums
        assert all(t is not None for _, t in g.tuned), g.tuned
    ref = run_reference(cascade, inputs)
    _, rel, worst = compare({n: ref[n] for n in got.outputs}, got.outputs)
    assert rel < 1e-4, f"{name}: {rel:.3g} in {worst}"


def test_seqlen_not_multiple_of_chunk_with_tiles() -> None:
    """mamba2 with seqlen % chunk != 0 and a mapping tile that does not divide the grid rank."""
    cascade = open_cascade("mamba2", params={"seqlen": 21, "chunk": 8, "d_model": 32, "headdim": 16})
    groups = [FusionGroup((n,), cascade.einsum(n).ranks, {"l": 7} if "l" in cascade.einsum(n).out_ranks else {})
              for n in cascade.einsum_names]
    _check(cascade, Mapping(tuple(groups), cascade.name))


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_reduced_precision_matmuls(precision: str) -> None:
    cascade = open_cascade("mlp2")
    res = _check(cascade, unfused_mapping(cascade), precision=precision)
    assert any(g["dot"] for g in res["groups"]), "mlp2's GEMMs should use tl.dot"


def test_unsupported_group_falls_back_loudly() -> None:
    """A group the generator cannot lower runs on the labelled fallback path and says why."""
    cascade = open_cascade("mlp2")
    mapping = Mapping((FusionGroup(("T",)), FusionGroup(("R", "Y"), recompute=("T",))), cascade.name)
    inputs = random_inputs(cascade, 1)
    res = run_triton(cascade, mapping, inputs)
    assert [i for i, _ in res.fallbacks] == [1]
    assert "recompute" in res.fallbacks[0][1]
    assert res.groups[1].backend == "fallback-reference"
    _, rel, _ = compare(run_reference(cascade, inputs, "float32", keep="outputs"), res.outputs)
    assert rel < 1e-4


def test_generated_source_is_a_cached_file() -> None:
    cascade = open_cascade("mlp2")
    res = run_triton(cascade, unfused_mapping(cascade), random_inputs(cascade, 0))
    assert all(g.backend == "triton" for g in res.groups)
    assert all(len(g.times_s) == 1 and g.time_s > 0 for g in res.groups)
    assert res.groups[0].source_path.endswith(".py")
    assert "@triton.jit" in open(res.groups[0].source_path).read()


def test_outputs_are_numpy_with_cascade_shapes() -> None:
    cascade = open_cascade("mamba2-decode")
    res = run_triton(cascade, unfused_mapping(cascade), random_inputs(cascade, 0))
    for name in cascade.outputs():
        assert isinstance(res.outputs[name], np.ndarray)
        assert res.outputs[name].shape == cascade.shape(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mamba1", "mamba2", "attention"])
def test_mapper_mapping_matches_reference(name: str) -> None:
    """The exact mapper's h200 mapping (tiles of 1 make many programs: slow under the interpreter)."""
    from mambalaya.mapper import optimal_mapping

    cascade = open_cascade(name)
    _check(cascade, optimal_mapping(cascade, "h200").mapping)


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_default_shapes_match_reference(name: str) -> None:
    cascade = open_cascade(name)
    for mapping in (unfused_mapping(cascade), greedy_mapping(cascade, "h200"), _one_group(cascade)):
        _check(cascade, mapping)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_gpu_kernels_match_reference(name: str, precision: str) -> None:
    cascade = open_cascade(name)
    for mapping in (unfused_mapping(cascade), greedy_mapping(cascade, "h200"), _one_group(cascade)):
        res = verify_triton(cascade, mapping, seed=0, matmul_precision=precision, device="cuda")
        assert res["ok"] and not res["fallbacks"], res


def test_causal_contraction_stops_at_the_tile_diagonal() -> None:
    """SSD's intra-chunk product reads LM[..q, s..] where s <= q: the GPU kernel's K loop stops at the
    tile's last query (the interpreter runs it whole, masked; the GPU tests check the bounded one)."""
    from mambalaya.exec.triton_codegen import group_plan, group_source

    cascade = _small("mamba2")
    groups = [("LM", "YD") if n == "YD" else (n,) for n in cascade.einsum_names if n != "LM"]
    mapping = Mapping(tuple(FusionGroup(g) for g in groups), cascade.name).validate(cascade)
    plan = group_plan(cascade, mapping, groups.index(("LM", "YD")))
    gpu = group_source(cascade, mapping, plan, "float32", "tf32", interpret=False)
    loops = [ln.strip() for ln in gpu.splitlines() if ln.strip().startswith("for k0")]
    assert loops and all("tl.minimum(" in ln and "tl.max(i_q" in ln for ln in loops), loops
    cpu = group_source(cascade, mapping, plan, "float32", "tf32", interpret=True)
    assert "tl.max(i_q" not in cpu
