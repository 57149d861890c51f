"""Shared test setup: make tests/ helpers importable and give small cascades."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))


@pytest.fixture
def repo() -> Path:
    return REPO
