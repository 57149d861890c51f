"""Human units for report cells (one place, so Markdown and HTML agree)."""

from __future__ import annotations

import math


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


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


def fmt_rate(bps: float) -> str:
    return f"{bps / 1e9:.4g} GB/s"


__all__ = ["fmt_bytes", "fmt_num", "fmt_pct", "fmt_rate", "fmt_ratio", "fmt_time"]
