"""``verify``: run a mapping for real and hold it to the reference and the cost model.

The fused executor and the reference interpreter run on the same random
inputs; the outputs must agree (float64 to ~1e-10, float32 to ~1e-4, relative
to each output's scale) and the bytes the executor counted moving between its
off-chip arrays and its on-chip buffers must equal the cost model's
prediction for that mapping on that architecture, to the byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mambalaya.arch import Arch, load_arch
from mambalaya.cost.model import evaluate
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import Mapping, load_mapping, unfused_mapping

#: The architecture whose buffer decides residency when none is named.
DEFAULT_ARCH = "mambalaya"


def choose_mapping(cascade: Cascade, arch: Arch | None, mapping_file: str | Path | None) -> tuple[Mapping, str]:
    """The mapping to run and where it came from: a file, an arch's optimum, or unfused."""
    if mapping_file is not None:
        return load_mapping(mapping_file).validate(cascade), f"file {mapping_file}"
    if arch is not None:
        from mambalaya.mapper import optimal_mapping

        return optimal_mapping(cascade, arch).mapping, f"optimal for {arch.name}"
    return unfused_mapping(cascade), "unfused"


def verify_mapping(
    cascade: Cascade,
    arch: Arch | str | None = None,
    mapping_file: str | Path | None = None,
    mapping: Mapping | None = None,
    backend: str = "numba",
    dtype: str = "float64",
    seed: int = 0,
    matmul_precision: str = "fp32",
) -> dict[str, Any]:
    """The ``verify --json`` object: ``ok``, ``max_abs_err``, predicted and counted traffic.

    ``matmul_precision`` (fp32, tf32, bf16) is the Triton backend's tl.dot operand precision; its
    tolerance follows it (``triton_backend.TOLERANCES``)."""
    arch_obj = load_arch(arch) if isinstance(arch, str) else arch
    if mapping is None:
        mapping, source = choose_mapping(cascade, arch_obj, mapping_file)
    else:
        source = "given"
    if arch_obj is None:
        named = mapping.arch if mapping.arch else DEFAULT_ARCH
        arch_obj = load_arch(named)
    predicted = evaluate(cascade, arch_obj, mapping)
    if backend == "triton":
        from mambalaya.exec.triton_backend import verify_triton

        run = verify_triton(cascade, mapping, seed=seed, dtype=dtype, matmul_precision=matmul_precision)
    else:
        from mambalaya.exec.fused import verify

        run = verify(cascade, mapping, seed=seed, dtype=dtype, buffer_bytes=arch_obj.fusion_buffer_bytes,
                     weights_resident=arch_obj.weights_resident)
    counted = run.get("traffic_counted_bytes")
    traffic_ok = counted is None or counted == predicted.traffic_bytes
    return {
        "ok": bool(run["ok"] and traffic_ok),
        "numerics_ok": bool(run["ok"]),
        "traffic_ok": bool(traffic_ok),
        "max_abs_err": run["max_abs_err"],
        "max_rel_err": run.get("max_rel_err"),
        "dtype": dtype,
        "backend": backend,
        "arch": arch_obj.name,
        "mapping_source": source,
        "groups": mapping.group_lists,
        "traffic_predicted_bytes": predicted.traffic_bytes,
        "traffic_counted_bytes": counted,
        "traffic_predicted_by_tensor": _by_tensor(predicted),
        "traffic_counted_by_tensor": run.get("traffic_by_tensor"),
        **({"matmul_precision": matmul_precision, "tolerance": run.get("tolerance"),
            "fallbacks": run.get("fallbacks", [])} if backend == "triton" else {}),
    }


def _by_tensor(report) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in report.traffic.rows:
        out[row.tensor] = out.get(row.tensor, 0) + row.bytes
    return out
