"""``verify``: run a mapping's schedule on a backend and hold it to the reference and the cost model.

The mapping (a file, the arch's optimum, or the unfused baseline) is priced by the cost model, whose
report carries the lowered schedule; the backend prints and runs that same schedule. The reference
and the backend run on the same random inputs; the outputs must agree relative to each output's
scale (float64 to 1e-10, float32 to the backend's tolerance), and the bytes the backend's load and
store statements counted as they ran must equal the prediction, tensor by tensor.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mambalaya.arch import Arch, load_arch
from mambalaya.cost.model import CostReport
from mambalaya.exec.backend import RunResult, get_backend
from mambalaya.exec.reference import check_memory, random_inputs, run_reference
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import Mapping, load_mapping
from mambalaya.mapper import evaluate
from mambalaya.mapper.heuristics import unfused_baseline

#: The architecture whose buffer decides residency when none is named.
DEFAULT_ARCH = "mambalaya"
#: Largest error relative to an output's largest magnitude that passes, per dtype.
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}


def choose_mapping(cascade: Cascade, arch: Arch, mapping_file: str | Path | None,
                   optimal: bool) -> tuple[Mapping, str, CostReport | None]:
    """The mapping to run, where it came from (a file, the arch's optimum, or the unfused baseline) and, for
    the optimum, the mapper's own report of it (its schedule is the one that runs)."""
    if mapping_file is not None:
        return load_mapping(mapping_file).validate(cascade), f"file {mapping_file}", None
    if optimal:
        from mambalaya.mapper import optimal_mapping

        res = optimal_mapping(cascade, arch)
        return res.mapping, f"optimal for {arch.name}", res.report
    return unfused_baseline(cascade, arch), f"unfused baseline for {arch.name}", None


def compare(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> tuple[float, float, str | None]:
    """(max abs error, max error relative to each tensor's largest finite magnitude, worst tensor)."""
    max_abs = max_rel = 0.0
    worst = None
    for name, want in ref.items():
        want = np.asarray(want, dtype=np.float64)
        have = np.asarray(got[name], dtype=np.float64)
        same = (have == want) | (np.isnan(have) & np.isnan(want))  # equal infinities and NaNs agree
        with np.errstate(invalid="ignore"):
            diff = np.where(same, 0.0, np.abs(have - want))
        if not diff.size:
            continue
        err = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff)))
        scale = max(float(np.max(np.abs(np.where(np.isfinite(want), want, 0.0)))), 1.0)
        max_abs = max(max_abs, err)
        if err / scale > max_rel or worst is None:
            max_rel, worst = max(max_rel, err / scale), name
    return max_abs, max_rel, worst


class Progress:
    """One line per step on a terminal's stderr (a spinner while it runs); silent when not a terminal."""

    def __init__(self, show: bool | None = None) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.show = self.console.is_terminal if show is None else show
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        if self.show:
            with self.console.status(f"{what} ..."):
                yield
        else:
            yield
        dt = self.seconds[what] = time.perf_counter() - t0
        if self.show:
            self.console.print(f"[dim]{what}: {dt:.1f} s[/dim]")


def verify_mapping(
    cascade: Cascade,
    arch: Arch | str | None = None,
    mapping_file: str | Path | None = None,
    mapping: Mapping | None = None,
    backend: str = "numba",
    dtype: str = "float64",
    seed: int = 0,
    optimal: bool | None = None,
    progress: bool | None = None,
    max_memory_bytes: int | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The ``verify --json`` object: ``ok``, errors, predicted and counted traffic (total and per tensor).

    With ``arch`` and neither a mapping nor a file, the arch's optimal mapping runs (``optimal=False``: its
    unfused baseline); with neither, the unfused baseline on :data:`DEFAULT_ARCH`. ``options`` go to the
    backend (Triton: ``matmul_precision``). A run that would allocate more than ``max_memory_bytes``
    (:func:`~mambalaya.exec.reference.check_memory`) is refused before anything is mapped or allocated."""
    check_memory(cascade, dtype, max_memory_bytes)
    steps = Progress(progress)
    arch_obj = load_arch(arch) if isinstance(arch, str) else arch
    if mapping is not None:
        source = "given"
    if arch_obj is None:
        named = mapping.arch if mapping is not None and mapping.arch else None
        if named is None and mapping_file is not None:
            named = load_mapping(mapping_file).arch or None
        arch_obj = load_arch(named or DEFAULT_ARCH)
        optimal = bool(optimal)
    engine = get_backend(backend)
    why = engine.available()
    if why is not None:
        from mambalaya.errors import MambalayaError

        raise MambalayaError(f"the {backend} backend cannot run here: {why}")
    predicted = None
    if mapping is None:
        with steps.step(f"mapping for {arch_obj.name}"):
            mapping, source, predicted = choose_mapping(cascade, arch_obj, mapping_file, optimal is not False)
    if predicted is None:
        with steps.step("lowering and pricing"):
            predicted = evaluate(cascade, arch_obj, mapping)
    inputs = random_inputs(cascade, seed)
    with steps.step("reference"):
        ref = run_reference(cascade, inputs, dtype, keep="outputs")
    with steps.step(f"compiling ({backend})"):
        program = engine.compile(cascade, predicted.schedule, dtype, **options)
    with steps.step(f"running ({backend})"):
        run: RunResult = engine.run(program, inputs)
    max_abs, max_rel, worst = compare(ref, run.outputs)
    tol = getattr(engine, "tolerance", lambda d, **o: TOLERANCE[d])(dtype, **options)
    numerics_ok = max_rel <= tol
    want = _by_tensor(predicted)
    got = {t: v["read"] + v["write"] for t, v in run.moved.items() if v["read"] + v["write"]}
    traffic_ok = want == got
    return {
        "ok": bool(numerics_ok and traffic_ok),
        "numerics_ok": bool(numerics_ok),
        "traffic_ok": bool(traffic_ok),
        "max_abs_err": max_abs,
        "max_rel_err": max_rel,
        "tolerance": tol,
        "worst_tensor": worst,
        "dtype": dtype,
        "backend": backend,
        "arch": arch_obj.name,
        "mapping_source": source,
        "groups": mapping.group_lists,
        "mapping": mapping.to_dict(),  # (tiles included: ``verify --mapping`` of this reruns it)
        "traffic_predicted_bytes": predicted.traffic_bytes,
        "traffic_counted_bytes": run.traffic_bytes,
        "traffic_predicted_by_tensor": want,
        "traffic_counted_by_tensor": got,
        "occupancy_bytes": [g.occupancy_bytes for g in predicted.schedule.groups],
        "capacity_bytes": arch_obj.fusion_buffer_bytes,
        "fallbacks": [{"group": i, "reason": r} for i, r in run.fallbacks],
        "compile_s": run.compile_s + steps.seconds[f"compiling ({backend})"],
        "run_s": run.run_s,
        "group_s": run.group_s,
        "steps_s": steps.seconds,
    }


def _by_tensor(report) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in report.traffic.rows:
        out[row.tensor] = out.get(row.tensor, 0) + row.bytes
    return {t: b for t, b in out.items() if b}


__all__ = ["DEFAULT_ARCH", "TOLERANCE", "Progress", "choose_mapping", "compare", "verify_mapping"]
