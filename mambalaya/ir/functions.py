"""The map functions of the language: name, arity and operation kind.

The operation kind is what the cost model charges (an ``exp`` may run on a
special unit); the executors bind each name to their own implementation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    op_kind: str
    doc: str


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        Function("exp", 1, "exp", "e**x"),
        Function("log", 1, "log", "natural logarithm"),
        Function("softplus", 1, "softplus", "log(1 + e**x)"),
        Function("silu", 1, "silu", "x * sigmoid(x)"),
        Function("sigmoid", 1, "sigmoid", "1 / (1 + e**-x)"),
        Function("rsqrt", 1, "rsqrt", "1 / sqrt(x)"),
        Function("sqrt", 1, "sqrt", "square root"),
        Function("neg", 1, "add", "-x"),
        Function("abs", 1, "max", "|x|"),
        Function("relu", 1, "max", "max(x, 0)"),
        Function("clamp", 3, "max", "clamp(x, lo, hi): min(max(x, lo), hi)"),
        Function("maximum", 2, "max", "element-wise maximum of two values"),
        Function("minimum", 2, "max", "element-wise minimum of two values"),
    )
}

#: Operation kind of each binary operator.
BINOP_KINDS = {"+": "add", "-": "add", "*": "mul", "/": "div"}

#: Operation kind of each reduction (one op per reduced element).
REDUCE_KINDS = {"sum": "add", "mean": "add", "cumsum": "add", "max": "max", "min": "max"}
