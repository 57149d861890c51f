"""Human units for report cells (one place, so Markdown and HTML agree); sizes, times and rates are the ones
:mod:`mambalaya.arch.units` writes for every output (the CLI's tables too)."""

from __future__ import annotations

import math

from mambalaya.arch.units import fmt_bytes, fmt_change, fmt_rate, fmt_time


def fmt_num(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-" if x is None else str(x)
    if isinstance(x, int) or float(x).is_integer() and abs(x) < 1e6:
        return f"{int(x):,}"
    return f"{x:.{digits}g}"


def fmt_pct(x: float | None) -> str:
    if x is None:
        return "-"
    return "<1 %" if 0 < x < 0.005 else f"{100 * x:.0f} %"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}×"


__all__ = ["fmt_bytes", "fmt_change", "fmt_num", "fmt_pct", "fmt_rate", "fmt_ratio", "fmt_time"]
