"""The Triton backend against the reference, with the cost model's bytes counted by the kernels themselves.

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, chosen by the test
conftest before triton is imported) on small shapes. Tests marked ``gpu`` compile the same kernels for a
CUDA device and are skipped without one.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from small_cascades import small_cascade  # noqa: E402
from triton_scope import unbound_reads  # noqa: E402

from mambalaya.arch import load_arch  # noqa: E402
from mambalaya.exec.backend import execute  # noqa: E402
from mambalaya.exec.reference import random_inputs  # noqa: E402
from mambalaya.exec.triton_backend import TOLERANCES, triton_available  # noqa: E402
from mambalaya.exec.triton_codegen import TritonOptions, group_kernel_source  # noqa: E402
from mambalaya.exec.verify import verify_mapping  # noqa: E402
from mambalaya.ir.mapping import FusionGroup, Mapping  # noqa: E402
from mambalaya.mapper import optimal_mapping  # noqa: E402
from mambalaya.mapper.heuristics import unfused_baseline  # noqa: E402
from mambalaya.parse import open_cascade  # noqa: E402
from mambalaya.schedule import lower_mapping  # noqa: E402

ON_GPU = torch.cuda.is_available()
SHIPPED = ["mlp2", "attention", "mamba1-decode", "mamba2-decode", "mamba1", "mamba2"]

if not triton_available()[0]:
    pytest.skip(f"Triton cannot run here: {triton_available()[1]}", allow_module_level=True)


@pytest.fixture(autouse=True)
def _quiet(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAMBALAYA_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kernels"))
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # exp overflow inside silu is expected


def _check(cascade, mapping, dtype: str = "float32", precision: str = "fp32", arch: str = "h200") -> dict:
    r = verify_mapping(cascade, arch, mapping=mapping, backend="triton", dtype=dtype, matmul_precision=precision)
    assert r["fallbacks"] == [], r["fallbacks"]
    assert r["numerics_ok"], f"{cascade.name}: rel err {r['max_rel_err']:.3g} > {r['tolerance']} in {r['worst_tensor']}"
    assert r["traffic_counted_by_tensor"] == r["traffic_predicted_by_tensor"]
    return r


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "mamba2" else n for n in SHIPPED])
def test_mapper_optimum_and_unfused_baseline(name: str) -> None:
    c = small_cascade(name)
    a = load_arch("h200")
    for m in (optimal_mapping(c, a).mapping, unfused_baseline(c, a)):
        _check(c, m)


def test_the_scope_check_finds_a_name_bound_only_inside_a_loop() -> None:
    src = "@triton.jit\ndef kernel(x):\n    for t in range(4):\n        lo = t\n    y = lo + x\n"
    assert unbound_reads(src) == ["lo (line 5)"]
    assert unbound_reads(src.replace("    for t", "    lo = 0\n    for t")) == []


@pytest.mark.parametrize("name", SHIPPED)
def test_kernels_bind_every_name_they_read_in_scope(name: str) -> None:
    """Every kernel of the h200 optimum, and of a scan whose recurrence loop is tiled innermost with a member
    after it (the final state: Mamba-1's shape on a GPU), reads only names bound in scope on a GPU."""
    c = small_cascade(name)
    mappings = [optimal_mapping(c, "h200").mapping]
    if name == "mamba1":
        scan = ("A", "DA", "BX", "H", "SY", "Y", "G", "HF")
        names = c.einsum_names
        before = [FusionGroup((e,)) for e in names[:names.index("A")]]
        after = [FusionGroup((e,)) for e in names[names.index("A"):] if e not in scan]
        mappings.append(Mapping((*before, FusionGroup(scan, ("d", "n", "b", "l"), {"l": 1, "d": 4}), *after),
                                c.name).validate(c))
    for m in mappings:
        for g in lower_mapping(c, m, load_arch("h200")).groups:
            src = group_kernel_source(c, g, "float32", TritonOptions()).source
            assert unbound_reads(src) == [], f"{' '.join(g.einsums)}"


@pytest.mark.parametrize("name", ["mamba1", "mamba2-decode", pytest.param("mamba2", marks=pytest.mark.slow)])
def test_whole_cascade_as_one_kernel(name: str) -> None:
    """The most aggressive fusion: every Einsum in one kernel (inlining, scans, scratch, barriers)."""
    c = small_cascade(name)
    _check(c, Mapping((FusionGroup(c.einsum_names),), c.name))


def test_a_program_grid_from_the_schedule() -> None:
    """A GEMM tiled along its rows runs one program per tile: each loads its own rows of the weight."""
    c = small_cascade("mlp2")
    m = Mapping((FusionGroup(("T",), ("m", "n", "k"), {"m": 4}), FusionGroup(("R", "Y"), ("m", "p", "n"), {"m": 4})),
                c.name)
    s = lower_mapping(c, m, "h200")
    assert [g.programs for g in s.groups] == [3, 3] and all(g.grid == 1 for g in s.groups)
    r = _check(c, m)
    assert r["traffic_counted_by_tensor"]["W1"] == 3 * c.nbytes("W1")  # every program reads W1


def test_a_contraction_summed_across_a_loop_accumulates_in_registers() -> None:
    """T tiled along its summed rank k: its partial sums stay in registers across the k loop and its operand
    tiles load straight into registers; the numbers and the counted moves are still the schedule's."""
    from mambalaya.exec.triton_codegen import group_kernel_source

    c = open_cascade("mlp2")
    m = Mapping((FusionGroup(("T",), ("m", "n", "k"), {"m": 16, "n": 16, "k": 8}),
                 FusionGroup(("R", "Y"), ("m", "p", "n"), {"m": 16})), c.name)
    s = lower_mapping(c, m, "h200")
    assert [group_kernel_source(c, g, "float32").in_registers for g in s.groups] == [("T",), ()]
    r = _check(c, m)
    assert r["traffic_counted_by_tensor"]["A"] == 3 * c.nbytes("A")  # A read once per n tile


def test_float64_is_exact() -> None:
    c = small_cascade("mamba2-decode")
    r = _check(c, Mapping((FusionGroup(c.einsum_names),), c.name), dtype="float64")
    assert r["max_rel_err"] < 1e-9


@pytest.mark.parametrize("precision", ["tf32", pytest.param("bf16", marks=pytest.mark.slow)])
def test_reduced_precision_matmuls(precision: str) -> None:
    c = open_cascade("mlp2")
    r = _check(c, unfused_baseline(c, "h200"), precision=precision)
    assert r["tolerance"] == TOLERANCES[("float32", precision)]
    from mambalaya.exec.triton_codegen import group_kernel_source

    s = lower_mapping(c, unfused_baseline(c, "h200"), "h200")
    assert [group_kernel_source(c, g, "float32").dots for g in s.groups] == [1, 0, 1]  # the GEMMs on tl.dot


def test_an_unprintable_group_falls_back_loudly_and_fails_the_traffic_check(monkeypatch) -> None:
    """A group the printer cannot express runs on the labelled fallback: right numbers, nothing counted, so
    verify says the traffic did not match."""
    import mambalaya.exec.triton_backend as tb

    real = tb.group_kernel_source

    def refuse_group_one(cascade, g, dtype, options=None):
        if g.index == 1:
            raise tb.Unsupported("refused for the test")
        return real(cascade, g, dtype, options) if options else real(cascade, g, dtype)

    monkeypatch.setattr(tb, "group_kernel_source", refuse_group_one)
    c = small_cascade("mlp2")
    r = verify_mapping(c, "h200", mapping=unfused_baseline(c, "h200"), backend="triton")
    assert r["fallbacks"] == [{"group": 1, "reason": "not expressible in Triton: refused for the test"}]
    assert r["numerics_ok"] and not r["traffic_ok"] and not r["ok"]


def test_kernels_are_cached_files_and_outputs_are_numpy() -> None:
    c = small_cascade("mamba2-decode")
    s = lower_mapping(c, unfused_baseline(c, "h200"), "h200")
    res = execute(c, s, random_inputs(c, 0), "triton", "float32")
    paths = [g["source_path"] for g in res.extra["groups"]]
    assert all(p.endswith(".py") and "@triton.jit" in open(p).read() for p in paths)
    for name in c.outputs():
        assert isinstance(res.outputs[name], np.ndarray) and res.outputs[name].shape == c.shape(name)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_gpu_kernels_match_reference(name: str, precision: str) -> None:
    c = open_cascade(name)
    for m in (optimal_mapping(c, "h200").mapping, unfused_baseline(c, "h200")):
        _check(c, m, precision=precision)


def test_weights_given_again_stay_on_the_device_and_new_ones_are_sent() -> None:
    """A program keeps a weight array it was given on the device and reuses it when the same array comes again (a
    generator's every token); a new array is sent, so a changed weight is never read stale."""
    from mambalaya.exec.backend import get_backend
    from mambalaya.exec.reference import run_reference

    c = small_cascade("mamba2-decode")
    s = lower_mapping(c, unfused_baseline(c, "h200"), "h200")
    engine = get_backend("triton")
    program = engine.compile(c, s, "float32")
    inputs = {k: v.astype(np.float32) for k, v in random_inputs(c, 0).items()}
    weights = {n for n in inputs if c.tensors[n].role == "weight"}
    first = engine.run(program, inputs).outputs
    held = {k: t for k, (_, t) in program.resident.items()}
    assert len(held) == len(weights) > 0
    again = engine.run(program, dict(inputs)).outputs
    now = {k: t for k, (_, t) in program.resident.items()}
    assert now.keys() == held.keys() and all(now[k] is t for k, t in held.items())  # the same tensors, none sent again
    for n in c.outputs():
        np.testing.assert_array_equal(first[n], again[n])
    w = next(iter(sorted(weights)))
    changed = {**inputs, w: inputs[w] * np.float32(2)}
    out = engine.run(program, changed).outputs
    want = run_reference(c, {k: v.astype(np.float64) for k, v in changed.items()})
    for n in c.outputs():
        np.testing.assert_allclose(out[n], want[n], rtol=1e-4, atol=1e-4)
    assert len(program.resident) == len(weights) + 1


def test_an_uncounted_run_computes_the_same_and_reuses_its_scratch() -> None:
    """``count=False`` (generation's every token after its warm-up) gives the counted run's outputs, reports no
    moves, and allocates each group's scratch once: a second run launches into the same arena."""
    from mambalaya.exec.backend import get_backend

    c = small_cascade("mamba2-decode")
    s = lower_mapping(c, optimal_mapping(c, "h200").mapping, "h200")
    engine = get_backend("triton")
    program = engine.compile(c, s, "float32")
    inputs = {k: v.astype(np.float32) for k, v in random_inputs(c, 0).items()}
    counted = engine.run(program, inputs)
    assert counted.moved and not program.scratch  # (a counted run keeps no scratch: each starts from NaN)
    first = engine.run(program, inputs, count=False)
    assert first.moved == {}
    arenas = {k: a.data_ptr() for k, (a, _) in program.scratch.items()}
    assert len(arenas) == sum(gk.kernel is not None for gk in program.groups) > 0
    second = engine.run(program, {**inputs}, count=False)
    assert {k: a.data_ptr() for k, (a, _) in program.scratch.items()} == arenas
    for n in c.outputs():
        np.testing.assert_array_equal(first.outputs[n], counted.outputs[n])
        np.testing.assert_array_equal(second.outputs[n], counted.outputs[n])
