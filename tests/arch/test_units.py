"""The quantity parser: exact SI and binary prefixes, and errors that name the field and the unit."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mambalaya.arch import ArchError, format_quantity, parse_quantity
from mambalaya.arch.units import unit_dimension

SI = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


@pytest.mark.parametrize(
    ("text", "dimension", "expected"),
    [
        ("4.8 TB/s", "bandwidth", 4.8e12),
        ("2039 GB/s", "bandwidth", 2039e9),
        ("1 GiB/s", "bandwidth", float(2**30)),
        ("228 KiB", "size", 228 * 1024),
        ("50 MB", "size", 50 * 10**6),
        ("8 KB", "size", 8000),
        ("1.5 KiB", "size", 1536),
        ("1.75 GHz", "frequency", 1.75e9),
        ("145 MHz", "frequency", 145e6),
        ("5 us", "time", 5e-6),
        ("5 µs", "time", 5e-6),
        ("570 ns", "time", 570e-9),
        ("0 s", "time", 0.0),
        ("989 TFLOP/s", "compute", 989e12),
        ("11.2 Gop/s", "compute", 11.2e9),
        ("65536 op/cycle", "per_cycle", 65536.0),
        ("  2e3 GB/s ", "bandwidth", 2e12),
    ],
)
def test_parses_exactly(text: str, dimension: str, expected: float) -> None:
    value = parse_quantity(text, dimension, "f")
    assert value == expected
    assert type(value) is (int if dimension == "size" else float)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted({**SI, **BINARY})))
def test_integer_sizes_are_exact(n: int, prefix: str) -> None:
    assert parse_quantity(f"{n} {prefix}B", "size", "f") == n * {**SI, **BINARY}[prefix]


@given(
    st.decimals(min_value=0, max_value=10**5, places=3, allow_nan=False),
    st.sampled_from(["k", "M", "G", "T"]),
)
def test_decimal_bandwidths_round_once(d: object, prefix: str) -> None:
    """The text "4.8 TB/s" is the float nearest to 4.8e12, not 4.8 * 1e12 with two roundings."""
    exact = Fraction(str(d)) * SI[prefix]
    assert parse_quantity(f"{d} {prefix}B/s", "bandwidth", "f") == float(exact)


def test_si_and_binary_prefixes_differ() -> None:
    assert parse_quantity("1 KiB", "size", "f") - parse_quantity("1 KB", "size", "f") == 24
    assert parse_quantity("1 MiB", "size", "f") == 1024 * 1024


@pytest.mark.parametrize(
    ("text", "dimension", "needles"),
    [
        ("50 GB", "bandwidth", ["offchip.bandwidth", "is a size", "B/s"]),
        ("4.8 TB/s", "size", ["offchip.bandwidth", "is a bandwidth", "B,"]),
        ("2039", "bandwidth", ["offchip.bandwidth", "no unit", "GB/s"]),
        ("10 Gb/s", "bandwidth", ["offchip.bandwidth", "bits", "B/s"]),
        ("3 parsecs", "time", ["offchip.bandwidth", "unknown unit", "us"]),
        ("fast", "bandwidth", ["offchip.bandwidth", "cannot read"]),
        ("0.5 B", "size", ["offchip.bandwidth", "whole number of bytes"]),
        ("1 GiHz", "frequency", ["offchip.bandwidth", "Hz"]),
        ("1 ms", "bandwidth", ["offchip.bandwidth", "is a time"]),
    ],
)
def test_wrong_units_name_field_and_expected_unit(text: str, dimension: str, needles: list[str]) -> None:
    with pytest.raises(ArchError) as info:
        parse_quantity(text, dimension, "offchip.bandwidth")
    for needle in needles:
        assert needle in info.value.message


@pytest.mark.parametrize("value", [2039, 4.8, True, None, ["1 GB/s"]])
def test_non_strings_are_refused(value: object) -> None:
    with pytest.raises(ArchError, match="clock"):
        parse_quantity(value, "frequency", "clock")


def test_unit_dimension() -> None:
    assert unit_dimension("GB/s") == "bandwidth"
    assert unit_dimension("KiB") == "size"
    assert unit_dimension("ns") == "time"
    assert unit_dimension("furlongs") is None


@pytest.mark.parametrize(
    ("value", "dimension"),
    [(4.28e12, "bandwidth"), (233472, "size"), (7e-6, "time"), (1.75e9, "frequency"), (989.4e12, "compute")],
)
def test_format_round_trips_to_three_digits(value: float, dimension: str) -> None:
    text = format_quantity(value, dimension)
    assert parse_quantity(text, dimension, "f") == pytest.approx(value, rel=5e-3)


def test_every_output_writes_sizes_times_and_rates_one_way(capsys) -> None:
    """The CLI's tables, the report's cells, the plots and a sweep's legend share one style: binary sizes (KiB,
    MiB), µs, GB/s (they mixed MB and MiB, "us" and µs, TB/s and GB/s)."""
    import re

    from mambalaya.arch.units import fmt_bytes, fmt_rate, fmt_time
    from mambalaya.cli import main
    from mambalaya.study.output import _legend

    assert (fmt_bytes(3 * 2**20), fmt_time(7e-6), fmt_rate(4.8e12)) == ("3 MiB", "7 µs", "4800 GB/s")
    assert format_quantity(3 * 2**20, "size") == "3 MiB" and format_quantity(7e-6, "time") == "7 µs"
    assert format_quantity(4.8e12, "bandwidth") == "4800 GB/s"
    assert _legend("fusion_buffer_bytes", 2**20) == "fusion_buffer 1 MiB"
    assert main(["map", "mamba2", "--arch", "mambalaya"]) == 0
    out = capsys.readouterr().out
    assert "µs" in out and "KiB" in out
    assert not re.search(r"\d (us|kB|MB|GB|TB/s)\b", out), out


@pytest.mark.parametrize("text", ["1e400 us", "1e308 s", "1e31 B", "-1e40 GB/s"])
def test_a_quantity_past_any_machine_is_refused(text: str) -> None:
    """Found by the fuzzing (tests/fuzz): ``1e400 us`` overflowed a float (a traceback) and ``per_transfer: 1e308 s``
    priced a group at inf s, which the solver rounded into NaN."""
    with pytest.raises(ArchError, match="out of any machine's range"):
        parse_quantity(text, unit_dimension(text.split()[1]), "overheads.per_group")


def test_a_change_reads_as_a_factor_of_at_least_one_with_its_direction() -> None:
    """``map`` printed "traffic 0.48x lower" where fused traffic was 2.1x higher."""
    from mambalaya.arch.units import fmt_change

    assert fmt_change(2.1, 1.0) == "2.10× lower"
    assert fmt_change(1.0, 2.1) == "2.10× higher"
    assert fmt_change(0.48, 1.0, "less", "more") == "2.08× more"
    assert fmt_change(0.0, 1.0) == "-"
