"""The element-wise function registry: every row parses, is priced on every shipped arch, and computes the
same numbers in the reference (numpy), the Numba backend and the Triton backend (interpreted on a CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.arch import load_arch
from mambalaya.arch.spec import shipped_archs
from mambalaya.exec.backend import execute
from mambalaya.exec.reference import run_reference
from mambalaya.exec.triton_backend import triton_available
from mambalaya.ir.functions import FUNCTIONS
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.mapper import evaluate
from mambalaya.parse import parse_cascade_text
from mambalaya.schedule import lower_mapping

#: arguments per arity: positive inputs (log, sqrt, rsqrt), a second tensor, clamp's bounds
ARGS = {1: "P[n]", 2: "P[n], Q[n]", 3: "P[n], lo, hi"}


def _cascade(fn: str):
    f = FUNCTIONS[fn]
    return parse_cascade_text(f"""
name: fn_{fn}
params: {{N: 37, lo: 0.7, hi: 1.9}}
ranks: {{n: N}}
einsums:
  - P[n] = A[n] * A[n] + 0.5
  - Y[n] = {fn}({ARGS[f.arity]}) * A[n]
""", file=f"{fn}.yaml")


def _inputs(c) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {t: rng.standard_normal(c.shape(t)) for t in ("A", "Q") if t in c.tensors}


def _expected(fn: str, x: dict[str, np.ndarray]) -> np.ndarray:
    f = FUNCTIONS[fn]
    p = x["A"] ** 2 + 0.5
    args = {1: (p,), 2: (p, x.get("Q")), 3: (p, 0.7, 1.9)}[f.arity]
    return f.numpy(*args) * x["A"]


@pytest.mark.parametrize("fn", sorted(FUNCTIONS))
def test_every_function_is_priced_on_every_arch(fn: str) -> None:
    c = _cascade(fn)
    kind = FUNCTIONS[fn].op_kind
    for name in shipped_archs():
        a = load_arch(name)
        assert a.throughput(kind) > 0, (fn, name)
        rep = evaluate(c, a)
        y = next(e for e in rep.einsums if e.name == "Y")
        assert y.ops.get(kind, 0) >= c.rank_size("n"), (fn, name, y.ops)  # one evaluation per element


def test_every_function_computes_the_same_everywhere() -> None:
    """All functions in one fused group (one kernel per backend): P inlined, n in tiles with a partial last one."""
    names = sorted(FUNCTIONS)
    lines = "\n".join(f"  - Y_{fn}[n] = {fn}({ARGS[FUNCTIONS[fn].arity]}) * A[n]" for fn in names)
    c = parse_cascade_text(f"""
name: functions
params: {{N: 37, lo: 0.7, hi: 1.9}}
ranks: {{n: N}}
einsums:
  - P[n] = A[n] * A[n] + 0.5
{lines}
""", file="functions.yaml")
    x = _inputs(c)
    ref = run_reference(c, x)
    sched = lower_mapping(c, Mapping((FusionGroup(c.einsum_names, tiles={"n": 16}),), c.name), "h200")
    outs = {"numba": execute(c, sched, x, "numba", "float64").outputs}
    if triton_available()[0]:
        outs["triton"] = execute(c, sched, x, "triton", "float32").outputs
    for fn in names:
        want = _expected(fn, x)
        np.testing.assert_allclose(ref[f"Y_{fn}"], want, rtol=1e-12, atol=1e-12, err_msg=f"{fn} reference")
        for backend, out in outs.items():
            tol = 1e-12 if backend == "numba" else 1e-5
            np.testing.assert_allclose(out[f"Y_{fn}"], want, rtol=tol, atol=tol, err_msg=f"{fn} on {backend}")


def test_constant_subexpressions_are_one_float64_literal() -> None:
    """``rsqrt(headdim)`` is folded to one literal in both printers: Triton evaluated it in a float32 scalar
    even in float64 kernels (attention's softmax scale was off by 1.5e-8 of the output's scale)."""
    from mambalaya.exec.numba_codegen import group_source
    from mambalaya.exec.triton_codegen import group_kernel_source
    from mambalaya.ir.expr import BinOp, Call, Const, ParamRef
    from mambalaya.ir.functions import constant_value

    assert constant_value(Call("rsqrt", (ParamRef("d"),)), {"d": 8.0}) == 1.0 / np.sqrt(8.0)
    assert constant_value(BinOp("/", Const(1.0), ParamRef("d")), {"d": 4.0}) == 0.25
    c = parse_cascade_text("""
name: scale
params: {N: 9, d: 8}
ranks: {n: N}
einsums:
  - Y[n] = A[n] * rsqrt(d)
""", file="scale.yaml")
    g = lower_mapping(c, Mapping((FusionGroup(("Y",)),), c.name), "h200").groups[0]
    scale = repr(float(1.0 / np.sqrt(8.0)))
    assert scale in group_source(c, g, "float64")
    assert scale in group_kernel_source(c, g, "float64").source
    if triton_available()[0]:
        x = {"A": np.random.default_rng(0).standard_normal(9)}
        got = execute(c, lower_mapping(c, Mapping((FusionGroup(("Y",)),), c.name), "h200"), x, "triton", "float64")
        np.testing.assert_allclose(got.outputs["Y"], x["A"] / np.sqrt(8.0), rtol=1e-15)
