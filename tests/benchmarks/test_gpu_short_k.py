"""The cuBLAS short-K benchmark's CPU side: the fit and the roofline table from the committed H200 run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "gpu_short_k.json"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("gpu_short_k")


def test_roofline_table_has_every_measured_shape(bench) -> None:
    data = json.loads(RESULTS.read_text())
    table = bench.roofline_table(data)
    rows = [line for line in table.splitlines() if line.startswith(("| tf32", "| bf16"))]
    assert len(rows) == len(data["rows"])
    ratios = [float(r.rstrip(" |").rsplit("|", 1)[1]) for r in rows]
    assert all(0.5 < x < 3 for x in ratios), ratios  # the roofline is within a small factor of cuBLAS


def test_fit_recovers_a_known_law(bench) -> None:
    """On rows that follow eff = 0.8 K / (K + 100) exactly, the fit returns those parameters."""
    rows = [{"precision": "tf32", "label": f"sweep K={k}", "k": k, "efficiency": 0.8 * k / (k + 100)}
            for k in bench.SWEEP_K]
    fit = bench.fit(rows)["tf32"]
    assert fit["eff_inf"] == pytest.approx(0.8) and fit["depth"] == pytest.approx(100)
    assert fit["worst_rel_err"] < 1e-9


def test_dry_run_writes_a_json(bench, tmp_path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "sk.json"
    bench.measure(out, dry=True)
    data = json.loads(out.read_text())
    assert {r["precision"] for r in data["rows"]} == {"tf32", "bf16"} and "fit" in data
