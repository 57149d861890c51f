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

# The suite runs on every core already (pytest-xdist): the mapper searches in each test's own process.
os.environ["MAMBALAYA_JOBS"] = "1"

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))


@pytest.fixture
def repo() -> Path:
    return REPO

