"""The generated kernels' own exp / softplus / sigmoid (vectorisable, no libm call) match numpy's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mambalaya.exec.numba_codegen import PRELUDE

F64_EPS = float(np.finfo(np.float64).eps)
F32_EPS = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def fns() -> dict[str, Any]:
    """The prelude's helpers, each wrapped in an element loop (the shape the kernels vectorise)."""
    from numba import njit

    ns: dict[str, Any] = {}
    exec(compile(PRELUDE.replace("cache=True", "cache=False"), "<prelude>", "exec"), ns)  # noqa: S102
    loops = {}
    for name in ("_exp", "_exp32", "_softplus", "_sigmoid"):
        f = ns[name]

        def loop(a: np.ndarray, out: np.ndarray, f: Any = f) -> None:
            for i in range(a.size):
                out[i] = f(a[i])

        loops[name] = njit(loop)
    return loops


def _specials(dtype: type) -> np.ndarray:
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30], dtype=dtype)


def _check(got: np.ndarray, want: np.ndarray, rel: float, tiny: float) -> None:
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    assert np.array_equal(got[np.isinf(want)], want[np.isinf(want)])
    fin = np.isfinite(want)
    normal = fin & (np.abs(want) >= tiny)
    err = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert err.max() <= rel, float(err.max())
    sub = fin & ~normal  # below the normal range: the kernels' exp flushes to 0, the rest is within a few steps
    if sub.any():
        assert np.abs(got[sub] - want[sub]).max() <= tiny


def test_exp_float64_within_two_ulp(fns: dict[str, Any]) -> None:
    """2 ulp of np.exp over its whole range; results below the normal range are 0 (no subnormal operands)."""
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.uniform(-760, 720, 200_000), rng.uniform(-40, 40, 200_000),
                        rng.uniform(-1e-3, 1e-3, 10_000), [709.78, 709.79, -708.4, -745.1, -745.2, -746.0],
                        _specials(np.float64)])
    out = np.empty_like(a)
    fns["_exp"](a, out)
    with np.errstate(over="ignore"):
        want = np.exp(a)
    _check(out, want, 2 * F64_EPS, float(np.finfo(np.float64).tiny))
    assert not np.any((out != 0) & (np.abs(out) < np.finfo(np.float64).tiny))


def test_exp_float32_within_four_ulp(fns: dict[str, Any]) -> None:
    rng = np.random.default_rng(1)
    a = np.concatenate([rng.uniform(-110, 95, 200_000), rng.uniform(-20, 20, 200_000),
                        [88.7, 88.73, -87.3, -103.9, -104.0], _specials(np.float32)]).astype(np.float32)
    out = np.empty_like(a)
    fns["_exp32"](a, out)
    with np.errstate(over="ignore"):
        want = np.exp(a)
    _check(out, want, 4 * F32_EPS, float(np.finfo(np.float32).tiny))
    assert not np.any((out != 0) & (np.abs(out) < np.finfo(np.float32).tiny))


def test_softplus_and_sigmoid_float64(fns: dict[str, Any]) -> None:
    rng = np.random.default_rng(2)
    a = np.concatenate([rng.uniform(-800, 800, 100_000), rng.uniform(-30, 30, 200_000),
                        rng.uniform(-1e-6, 1e-6, 10_000), [36.0, 37.0, -37.0, 709.0, -709.0], _specials(np.float64)])
    out = np.empty_like(a)
    fns["_softplus"](a, out)
    with np.errstate(invalid="ignore"):
        want = np.logaddexp(0.0, a)
    _check(out, want, 4 * F64_EPS, float(np.finfo(np.float64).tiny))
    fns["_sigmoid"](a, out)
    with np.errstate(over="ignore"):
        want = 1.0 / (1.0 + np.exp(-a))
    _check(out, want, 4 * F64_EPS, float(np.finfo(np.float64).tiny))
