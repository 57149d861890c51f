"""The cost stage's hand-checkable cascades and round-number arch, for the baselines' tests."""

from cost.conftest import mlp, tiny  # noqa: F401 (fixtures)
