"""Shared test setup: make tests/ helpers importable and give small cascades."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Triton reads TRITON_INTERPRET when its own library functions are defined, i.e. at import time, and
# transformers (or torch) may import triton before the Triton tests run: without a GPU, choose the
# interpreter here, before any test module is imported.
if not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))


@pytest.fixture
def repo() -> Path:
    return REPO


#: Slow tests that map one cascade on one arch run in one worker (``--dist loadgroup``): the mapper keeps a cascade's
#: group searches per process (:func:`mambalaya.mapper.space.shared_coster`), so the group maps it once (the default
#: Mamba-2 on h200 takes minutes on a CI core).
SAME_MAPPING = {
    "mamba2-h200-latency": ("test_ilp_equals_exhaustive_all[latency-h200-mamba2]",
                            "test_candidates_cost_what_evaluate_says[mamba2-h200]", "test_optimum_is_priced_as_evaluated",
                            "test_matrix_full[mamba2-h200-None-numba]", "test_layers_equals_monolithic_mamba2[latency]"),
    "mamba2-h200-traffic": ("test_ilp_equals_exhaustive_all[traffic-h200-mamba2]",
                            "test_layers_equals_monolithic_mamba2[traffic]"),
    "small-mamba2-h200-2KiB": ("test_matrix_full[mamba2-h200-2048-numba]",
                               "test_shipped_cascades_optimal_mapping_respects_the_bound[h200-mamba2]"),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    group = {test: name for name, tests in SAME_MAPPING.items() for test in tests}
    for item in items:
        if item.name in group:
            item.add_marker(pytest.mark.xdist_group(group[item.name]))
