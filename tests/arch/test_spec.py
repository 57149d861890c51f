"""Architecture specs: the shipped ones load and behave, bad ones fail with file and line, overrides work."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mambalaya.arch import (
    ARCH_KINDS,
    OP_ALIASES,
    OP_KINDS,
    Arch,
    ArchError,
    archs_dir,
    load_arch,
    parse_arch,
    shipped_archs,
)

REQUIRED = {"imax3", "mambalaya", "marca", "h100", "h200"}
H200_TEXT = (archs_dir() / "h200.yaml").read_text()


@pytest.fixture(scope="module", params=sorted(REQUIRED))
def arch(request: pytest.FixtureRequest) -> Arch:
    return load_arch(request.param)


# ----------------------------------------------------------------------------- shipped specs


def test_required_specs_are_shipped() -> None:
    assert REQUIRED <= set(shipped_archs())


def test_every_shipped_spec_is_usable(arch: Arch) -> None:
    assert arch.kind in ARCH_KINDS
    assert 0 < arch.offchip_bandwidth <= arch.offchip_peak_bandwidth
    assert arch.fusion_buffer_bytes > 0 and arch.fusion_buffer.holds_fused
    assert arch.group_overhead_s >= 0 and arch.transfer_overhead_s >= 0
    for kind in (*OP_KINDS, *OP_ALIASES):
        for matrix in (False, True):
            assert arch.throughput(kind, matrix=matrix) > 0
            assert arch.throughput(kind, matrix=matrix) <= arch.throughput(
                kind, matrix=matrix, achievable=False
            )
    json.dumps(arch.to_dict())  # reports embed it


def test_every_number_in_a_shipped_spec_says_where_it_comes_from() -> None:
    """Each line holding a figure carries a comment (source, measurement or assumption)."""
    for name in REQUIRED:
        for i, line in enumerate((archs_dir() / f"{name}.yaml").read_text().splitlines(), 1):
            body = line.split("#", 1)[0]
            key, _, value = body.partition(":")
            if any(ch.isdigit() for ch in value) and key.strip().lstrip("- ") not in ("name", "description"):
                assert "#" in line, f"{name}.yaml:{i} has a number without a source comment: {line.strip()}"


def test_shipped_name_and_path_give_the_same_arch() -> None:
    assert (
        load_arch("h200") == load_arch(archs_dir() / "h200.yaml") == load_arch(str(archs_dir() / "h200.yaml"))
    )


def test_only_the_marca_baseline_cannot_fuse() -> None:
    assert {name for name in REQUIRED if not load_arch(name).can_fuse} == {"marca"}


def test_marca_is_mambalaya_without_fusion() -> None:
    """The baseline is iso-resource, so a comparison isolates fusion."""
    marca, mambalaya = load_arch("marca"), load_arch("mambalaya")
    assert marca.with_overrides(name="mambalaya", can_fuse=True, description="") == mambalaya.with_overrides(
        description=""
    )


def test_gpu_matrix_macs_run_on_tensor_cores() -> None:
    h200 = load_arch("h200")
    assert h200.throughput("mac", matrix=True) > 5 * h200.throughput("mac", matrix=False)
    rates = [h200.throughput("mac", True, p) for p in ("bf16", "tf32", "fp32")]
    assert rates == sorted(rates, reverse=True)
    assert h200.throughput("exp") < h200.throughput("add")  # SFU vs CUDA cores
    assert h200.throughput("silu") < h200.throughput("exp")  # two SFU ops


def test_h200_differs_from_h100_in_memory_not_compute() -> None:
    h100, h200 = load_arch("h100"), load_arch("h200")
    assert h200.offchip_bandwidth / h100.offchip_bandwidth == pytest.approx(4.8 / 3.35)
    for kind in OP_KINDS:
        assert h200.throughput(kind, True) == h100.throughput(kind, True)


def test_imax_pipeline_occupancy_needs_long_reductions() -> None:
    imax = load_arch("imax3")
    assert imax.pipeline_depth == 64
    assert imax.pipeline_occupancy(64) == pytest.approx(0.5)
    assert imax.pipeline_occupancy(480) > 0.85
    occupancies = [imax.pipeline_occupancy(n) for n in (1, 16, 64, 256, 1024)]
    assert occupancies == sorted(occupancies)
    assert load_arch("h200").pipeline_occupancy(1) == 1.0


def test_imax_lanes_scale_compute_and_local_memory() -> None:
    one = load_arch("imax3")
    eight = one.with_overrides(lanes=8)
    assert eight.throughput("mac", matrix=True) == 8 * one.throughput("mac", matrix=True)
    assert eight.fusion_buffer_bytes == 8 * one.fusion_buffer_bytes == 8 * 512 * 1024
    assert eight.offchip_bandwidth == one.offchip_bandwidth  # one DMA path


def test_unknown_op_kind_suggests_a_known_one() -> None:
    with pytest.raises(ArchError, match="did you mean 'softplus'"):
        load_arch("h200").throughput("softpuls")


def test_unknown_precision_is_an_arch_error() -> None:
    with pytest.raises(ArchError, match="precision 'int8'"):
        load_arch("h200").throughput("mac", matrix=True, precision="int8")


# ----------------------------------------------------------------------------- overrides


def test_overrides_for_sweeps() -> None:
    base = load_arch("mambalaya")
    swept = base.with_overrides(fusion_buffer_bytes=64 * 1024, offchip_bandwidth=1e12, can_fuse=False)
    assert swept.fusion_buffer_bytes == 64 * 1024
    assert swept.offchip_bandwidth == 1e12
    assert not swept.can_fuse
    assert base.fusion_buffer_bytes == 32 * 2**20 and base.can_fuse  # the original is untouched
    assert base.with_overrides(fusion_buffer_bytes="64 KiB") == base.with_overrides(fusion_buffer_bytes=65536)
    assert base.with_overrides(offchip_bandwidth="1 TB/s").offchip_bandwidth == 1e12
    with pytest.raises(FrozenInstanceError):
        base.can_fuse = False  # type: ignore[misc]


def test_bandwidth_override_keeps_the_measured_efficiency() -> None:
    h200 = load_arch("h200")
    faster = h200.with_overrides(offchip_bandwidth=2 * h200.offchip_bandwidth)
    assert faster.offchip_bandwidth / faster.offchip_peak_bandwidth == pytest.approx(
        h200.offchip_bandwidth / h200.offchip_peak_bandwidth
    )


def test_clock_override_scales_per_cycle_units_only() -> None:
    h200 = load_arch("h200")
    slow = h200.with_overrides(clock_hz=h200.clock_hz / 2)
    assert slow.throughput("add") == pytest.approx(h200.throughput("add") / 2)  # op/cycle unit
    assert slow.throughput("mac", matrix=True) == h200.throughput("mac", matrix=True)  # datasheet op/s


@given(st.integers(min_value=1, max_value=2**40))
@settings(max_examples=30)
def test_any_positive_buffer_override_is_exact(size: int) -> None:
    assert load_arch("imax3").with_overrides(fusion_buffer_bytes=size).fusion_buffer_bytes == size


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"fusion_buffer_byte": 1024}, "did you mean 'fusion_buffer_bytes'"),
        ({"bandwidth": 1e12}, "overridable"),
        ({"fusion_buffer_bytes": 0}, "positive"),
        ({"fusion_buffer_bytes": -1}, "positive"),
        ({"offchip_bandwidth": "1 GB"}, "is a size"),
        ({"offchip_bandwidth": float("nan")}, "bandwidth"),
        ({"lanes": 0}, "positive int"),
        ({"can_fuse": "yes"}, "bool"),
        ({"precision": "fp33"}, "fp32"),
    ],
)
def test_bad_overrides_are_arch_errors(changes: dict[str, object], needle: str) -> None:
    with pytest.raises(ArchError) as info:
        load_arch("mambalaya").with_overrides(**changes)
    assert needle in info.value.message


# ----------------------------------------------------------------------------- bad specs


def edit(old: str, new: str) -> Callable[[str], tuple[str, int]]:
    """A mutation of the h200 spec: replace the first line containing ``old``; the line number is expected."""

    def apply(text: str) -> tuple[str, int]:
        lines = text.splitlines()
        i = next(i for i, line in enumerate(lines) if old in line)
        lines[i] = lines[i].replace(old, new)
        return "\n".join(lines) + "\n", i + 1

    return apply


def first_key_line(text: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line and not line.startswith("#"))


def drop(old: str) -> Callable[[str], tuple[str, int]]:
    """Remove the line containing ``old``; the error points at the enclosing mapping."""

    def apply(text: str) -> tuple[str, int]:
        lines = text.splitlines()
        i = next(i for i, line in enumerate(lines) if old in line)
        del lines[i]
        new = "\n".join(lines) + "\n"
        if old.startswith(" "):  # a nested key: the mapping starts on the next line that is not a comment
            return new, i  # reported at the line of the key the mapping starts with, if it was the first
        return new, first_key_line(new)

    return apply


BAD_SPECS = {
    "missing clock": (drop("clock: 1980 MHz"), ["missing required key 'clock'", "GHz"]),
    "wrong unit": (
        edit("bandwidth: 4.8 TB/s", "bandwidth: 4.8 TB"),
        ["offchip.bandwidth", "is a size", "B/s"],
    ),
    "bare number": (edit("clock: 1980 MHz", "clock: 1980"), ["clock", "no unit", "Hz"]),
    "negative size": (
        edit("capacity: 228 KiB", "capacity: -228 KiB"),
        ["shared_memory.capacity", "positive"],
    ),
    "zero size": (edit("capacity: 228 KiB", "capacity: 0 KiB"), ["shared_memory.capacity", "positive"]),
    "unknown key": (edit("  efficiency: 0.89", "  efficency: 0.89"), ["did you mean 'efficiency'"]),
    "unknown top key": (edit("pipeline_depth: 0", "pipline_depth: 0"), ["did you mean 'pipeline_depth'"]),
    "unknown unit name": (edit("exp: {unit: sfu", "exp: {unit: sfx"), ["ops.exp.unit", "did you mean 'sfu'"]),
    "bad kind": (edit("kind: gpu", "kind: gpuu"), ["gpu, accelerator, cgla", "did you mean 'gpu'"]),
    "efficiency above one": (edit("efficiency: 0.89", "efficiency: 1.89"), ["offchip.efficiency", "at most"]),
    "unknown precision": (edit("bf16: 989.4", "bf17: 989.4"), ["unknown precision 'bf17'"]),
    "alias priced": (edit("max: {unit", "min: {unit"), ["'min' is priced as 'max'"]),
    "duplicate key": (edit("fp16: 989.4 TFLOP/s", "bf16: 989.4 TFLOP/s"), ["'bf16' appears twice"]),
    "syntax error": (edit("units:", "units: [oops"), ["YAML syntax error"]),
    "mapping expected": (
        edit("add: {unit: cuda_core, cost: 1}", "add: [cuda_core, 1]"),
        ["ops.add must be a mapping"],
    ),
    "python tag": (edit("name: h200", "name: !!python/name:os.system"), ["cannot read this value"]),
    "two fused levels": (
        edit("    capacity: 60 MiB", "    holds_fused: true\n    capacity: 60 MiB"),
        ["exactly one"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_gives_file_and_line(case: str, tmp_path: Path) -> None:
    mutate, needles = BAD_SPECS[case]
    text, line = mutate(H200_TEXT)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ArchError) as info:
        load_arch(path)
    err = info.value
    assert err.file == str(path)
    assert err.line is not None
    if case not in ("two fused levels", "syntax error"):  # these point at the list / the parser's position
        assert err.line == line, f"{case}: reported line {err.line}, expected {line}: {err}"
    else:
        assert abs(err.line - line) <= 40
    assert str(err).startswith(f"{path}:{err.line}: ")
    for needle in needles:
        assert needle in err.message, f"{case}: {needle!r} not in {err.message!r}"


def test_missing_op_kind_is_named(tmp_path: Path) -> None:
    text = "\n".join(line for line in H200_TEXT.splitlines() if not line.startswith("  softplus:"))
    with pytest.raises(ArchError, match="missing operation kinds softplus"):
        parse_arch(text, file="x.yaml")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("# only a comment\n", "empty"),
        ("- a\n- b\n", "must be a mapping"),
        ("just text\n", "must be a mapping"),
        ("name: x\n---\nname: y\n", "YAML syntax error"),
    ],
)
def test_non_mapping_or_empty_yaml(text: str, needle: str) -> None:
    with pytest.raises(ArchError) as info:
        parse_arch(text, file="x.yaml")
    assert needle in info.value.message
    assert info.value.file == "x.yaml" and info.value.line is not None


def test_unknown_arch_name_suggests_a_shipped_one() -> None:
    with pytest.raises(ArchError, match="did you mean 'h200'"):
        load_arch("h20")


def test_missing_file_is_an_arch_error(tmp_path: Path) -> None:
    with pytest.raises(ArchError) as info:
        load_arch(tmp_path / "nope.yaml")
    assert info.value.file == str(tmp_path / "nope.yaml")
