"""The element-wise functions of the language: one registry, every fact about each in one row.

A row gives a function's name and arity, the operation kind the cost model charges for it (an
``exp`` may run on a special unit; ``neg`` is an add), its reference implementation (numpy,
float64-exact as far as numpy is), and its code in each kernel generator: a template over its
arguments' code (``{0}``, ``{1}``) for Numba (float64 and, where it differs, float32) and for
Triton (float32 and, where it differs, float64). Templates may call the helpers of a generator's prelude (``_exp``, ``_sigmoid`` ...).
Adding a function is adding a row here: the parser, the cost model, the reference interpreter
and both generators read this table, and a test checks that every row is complete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class Function:
    """One element-wise function (module docstring)."""

    name: str
    arity: int
    op_kind: str  # the arch op kind one evaluation costs
    doc: str
    numpy: Callable[..., np.ndarray]
    numba: str  # template over the arguments' code (float64 kernels)
    triton: str
    numba32: str | None = None  # the float32 kernels' template, where it differs
    triton64: str | None = None  # the float64 kernels' template, where it differs

    def numba_code(self, args: list[str], float32: bool = False) -> str:
        return (self.numba32 if float32 and self.numba32 else self.numba).format(*args)

    def triton_code(self, args: list[str], float64: bool = False) -> str:
        return (self.triton64 if float64 and self.triton64 else self.triton).format(*args)


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        Function("exp", 1, "exp", "e**x", np.exp, "_exp({0})", "tl.exp({0})", "_exp32(np.float32({0}))"),
        Function("log", 1, "log", "natural logarithm", np.log, "np.log({0})", "tl.log({0})"),
        Function("softplus", 1, "softplus", "log(1 + e**x)", lambda x: np.logaddexp(0.0, x), "_softplus({0})",
                 "_softplus({0})"),
        Function("silu", 1, "silu", "x * sigmoid(x)", lambda x: x * _sigmoid(x), "({0} * _sigmoid({0}))",
                 "({0} * _sigmoid({0}))"),
        Function("sigmoid", 1, "sigmoid", "1 / (1 + e**-x)", _sigmoid, "_sigmoid({0})", "_sigmoid({0})"),
        Function("rsqrt", 1, "rsqrt", "1 / sqrt(x)", lambda x: 1.0 / np.sqrt(x), "(1.0 / np.sqrt({0}))",
                 "(1.0 / tl.sqrt_rn({0}))",
                 triton64="(1.0 / tl.sqrt({0}))"),
        Function("sqrt", 1, "sqrt", "square root", np.sqrt, "np.sqrt({0})", "tl.sqrt_rn({0})",
                 triton64="tl.sqrt({0})"),
        Function("neg", 1, "add", "-x", np.negative, "(-{0})", "(-{0})"),
        Function("abs", 1, "max", "|x|", np.abs, "abs({0})", "tl.abs({0})"),
        Function("relu", 1, "max", "max(x, 0)", lambda x: np.maximum(x, 0.0), "_maximum({0}, 0.0)",
                 "tl.maximum({0}, 0.0)"),
        Function("clamp", 3, "max", "clamp(x, lo, hi): min(max(x, lo), hi)",
                 lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), "_minimum(_maximum({0}, {1}), {2})",
                 "tl.minimum(tl.maximum({0}, {1}), {2})"),
        Function("maximum", 2, "max", "element-wise maximum of two values", np.maximum, "_maximum({0}, {1})",
                 "tl.maximum({0}, {1})"),
        Function("minimum", 2, "max", "element-wise minimum of two values", np.minimum, "_minimum({0}, {1})",
                 "tl.minimum({0}, {1})"),
    )
}

#: Operation kind of each binary operator.
BINOP_KINDS = {"+": "add", "-": "add", "*": "mul", "/": "div"}

#: Operation kind of each reduction (one op per reduced element).
REDUCE_KINDS = {"sum": "add", "mean": "add", "cumsum": "add", "max": "max", "min": "max"}

_BINOPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}


def constant_value(node, values: dict[str, float]) -> float | None:
    """The float64 value of an expression of constants and params alone (``rsqrt(headdim)``), else None: kernel
    printers emit it as one literal, so a float64 kernel never evaluates it in a float32 scalar."""
    from mambalaya.ir.expr import BinOp, Call, Const, ParamRef

    if isinstance(node, Const):
        return float(node.value)
    if isinstance(node, ParamRef):
        return float(values[node.name])
    if isinstance(node, Call) and node.fn in FUNCTIONS:
        args = [constant_value(a, values) for a in node.args]
        if any(a is None for a in args):
            return None
        with np.errstate(all="ignore"):
            return float(FUNCTIONS[node.fn].numpy(*(np.float64(a) for a in args)))
    if isinstance(node, BinOp):
        lhs, rhs = constant_value(node.lhs, values), constant_value(node.rhs, values)
        if lhs is None or rhs is None:
            return None
        with np.errstate(all="ignore"):
            return float(_BINOPS[node.op](np.float64(lhs), np.float64(rhs)))
    return None


__all__ = ["BINOP_KINDS", "FUNCTIONS", "REDUCE_KINDS", "Function", "constant_value"]
