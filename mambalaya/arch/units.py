"""A tiny, exact parser for the physical quantities written in architecture specs.

Specs are written for people ("4.8 TB/s", "228 KiB", "1.75 GHz", "5 us"), so every
dimensional field carries its unit and is converted here to SI base units (bytes,
bytes/s, Hz, s, op/s). SI prefixes are powers of 1000 (``KB`` = ``kB`` = 1000 B),
binary prefixes powers of 1024 (``KiB`` = 1024 B); the arithmetic is done on
fractions, so "4.8 TB/s" is exactly the float nearest 4.8e12 and "228 KiB" the
integer 233472.

A bare number, an unknown unit or a unit of another dimension (a size where a
bandwidth is expected) raises :class:`~mambalaya.errors.ArchError` naming the
field and the expected unit; the spec loader adds the file and line.

Dimensions: ``size`` (B), ``bandwidth`` (B/s), ``frequency`` (Hz), ``time`` (s),
``compute`` (op/s; ``FLOP/s`` and ``op/s`` are the same unit: one arithmetic
operation) and ``per_cycle`` (op/cycle, turned into op/s by the arch's clock).
"""

from __future__ import annotations

import re
from fractions import Fraction

from mambalaya.errors import ArchError

__all__ = ["DIMENSIONS", "fmt_bytes", "fmt_change", "fmt_rate", "fmt_time", "format_quantity", "parse_quantity", "unit_dimension"]

# dimension -> (base unit spellings, example shown in error messages)
DIMENSIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "size": (("B",), "228 KiB"),
    "bandwidth": (("B/s",), "2039 GB/s"),
    "frequency": (("Hz",), "1.75 GHz"),
    "time": (("s",), "5 us"),
    "compute": (("FLOP/s", "op/s", "ops/s", "OP/s", "FLOPS"), "989 TFLOP/s"),
    "per_cycle": (("op/cycle", "ops/cycle", "FLOP/cycle"), "65536 op/cycle"),
}

_SI_UP = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_SI_DOWN = {
    "m": Fraction(1, 10**3),
    "u": Fraction(1, 10**6),
    "µ": Fraction(1, 10**6),
    "μ": Fraction(1, 10**6),
    "n": Fraction(1, 10**9),
    "p": Fraction(1, 10**12),
}

_NUMBER = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$")


def _prefixes(dimension: str) -> dict[str, Fraction | int]:
    """Prefixes that make sense for a dimension (no KiHz, no millibytes)."""
    if dimension in ("size", "bandwidth"):
        return {**_SI_UP, **_BINARY}
    if dimension == "time":
        return {"": 1, **_SI_DOWN}
    if dimension == "per_cycle":
        return {"": 1, "k": 10**3, "K": 10**3}
    return dict(_SI_UP)


def _split(unit: str) -> list[tuple[str, Fraction | int, str]]:
    """All (dimension, multiplier, base) readings of a unit string."""
    readings = []
    for dim, (bases, _) in DIMENSIONS.items():
        for base in bases:
            if unit.endswith(base):
                prefix = unit[: len(unit) - len(base)]
                table = _prefixes(dim)
                if prefix in table:
                    readings.append((dim, table[prefix], base))
    return readings


def unit_dimension(unit: str) -> str | None:
    """The dimension a unit string belongs to ("GB/s" -> "bandwidth"), or None."""
    found = _split(unit.strip())
    return found[0][0] if found else None


#: The largest quantity a spec may give, in base units (1e30 B is 10^6 YB; 1e30 s outlasts the universe): past it, a
#: mapping's sums overflow a float
QUANTITY_MAX = 1e30


def parse_quantity(text: object, dimension: str, field: str = "value") -> float | int:
    """Parse ``text`` as a quantity of ``dimension``; return it in SI base units.

    Sizes come back as ``int`` (a fraction of a byte is an error); all other
    dimensions as ``float``. Raises ArchError naming ``field`` and the expected unit.
    """
    if dimension not in DIMENSIONS:
        raise ValueError(f"unknown dimension {dimension!r}")
    bases, example = DIMENSIONS[dimension]
    expect = f"expected a {dimension.replace('_', ' ')} in {bases[0]}, e.g. '{example}'"
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ArchError(f"{field}: {text!r} is not a quantity; {expect}")
    if not isinstance(text, str):
        raise ArchError(f"{field}: the number {text!r} has no unit; {expect}")
    match = _NUMBER.match(text)
    if not match:
        raise ArchError(f"{field}: cannot read {text!r} as a number and a unit; {expect}")
    number, unit = match.group(1), match.group(2)
    if not unit:
        raise ArchError(f"{field}: {text!r} has no unit; {expect}")
    readings = _split(unit)
    mine = [r for r in readings if r[0] == dimension]
    if not mine:
        if readings:
            other = readings[0][0].replace("_", " ")
            raise ArchError(f"{field}: {text!r} is a {other}, but {expect}")
        hint = ""
        if re.fullmatch(r"[kKMGTP]i?b(/s)?|bit(/s)?", unit):
            hint = " (bits are not accepted: write bytes with a capital B)"
        raise ArchError(f"{field}: unknown unit {unit!r} in {text!r}{hint}; {expect}")
    value = Fraction(number) * mine[0][1]
    if abs(value) > QUANTITY_MAX:
        raise ArchError(f"{field}: {text!r} is beyond {QUANTITY_MAX:g} {bases[0]}: out of any machine's range; {expect}")
    if dimension == "size":
        if value.denominator != 1:
            raise ArchError(f"{field}: {text!r} is not a whole number of bytes; {expect}")
        return int(value)
    return float(value)


_FORMAT_UNITS = {
    "size": "B",
    "bandwidth": "B/s",
    "frequency": "Hz",
    "time": "s",
    "compute": "op/s",
    "per_cycle": "op/cycle",
}


def fmt_change(before: float, after: float, less: str = "lower", more: str = "higher") -> str:
    """How ``after`` compares with ``before`` as a factor of at least 1 and its direction: "2.10x lower" where it
    fell, "2.08x higher" where it rose (a ratio below 1 read "0.48x lower" for traffic that doubled)."""
    if after <= 0 or before <= 0:
        return "-"
    return f"{before / after:.2f}× {less}" if after <= before else f"{after / before:.2f}× {more}"


def fmt_bytes(n: float | None) -> str:
    """A byte count as people read memory sizes: binary prefixes (KiB, MiB, GiB), three digits."""
    if n is None:
        return "-"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_time(s: float | None) -> str:
    """Seconds in s, ms, µs or ns, three digits."""
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def fmt_rate(bps: float) -> str:
    """A bandwidth in GB/s (decimal, as the datasheets give it), four digits: 4272 GB/s, 25.6 GB/s."""
    return f"{bps / 1e9:.4g} GB/s"


def format_quantity(value: float, dimension: str, digits: int = 3) -> str:
    """Human-readable form of an SI value for reports: sizes, times and bandwidths as :func:`fmt_bytes`,
    :func:`fmt_time` and :func:`fmt_rate` write them (one style everywhere), the rest with SI prefixes."""
    if dimension == "size":
        return fmt_bytes(value)
    if dimension == "time":
        return fmt_time(value)
    if dimension == "bandwidth":
        return fmt_rate(value)
    unit = _FORMAT_UNITS[dimension]
    for exp, prefix in ((15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"), (0, "")):
        if abs(value) >= 10**exp or exp == 0:
            return f"{value / 10**exp:.{digits}g} {prefix}{unit}"
    raise AssertionError("unreachable")
