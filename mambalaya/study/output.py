"""What ``mambalaya sweep`` writes: the table (CSV or Parquet) and a speedup plot, each atomically.

Also the parsing of its ``--set-range k=v1,v2`` and ``--override k=v1,v2`` options.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pandas as pd

from mambalaya.arch.units import fmt_bytes, fmt_rate
from mambalaya.errors import MambalayaError
from mambalaya.fileio import write_atomic

TABLE_FORMATS = (".csv", ".parquet")
#: Columns a sweep reports that are not its axes.
_RESULT = {"cascade", "arch", "feasible", "reason"}


def _scalar(raw: str) -> int | float | bool | str:
    """``4096`` -> int, ``1e12`` -> float, ``true`` -> bool, ``1 MiB`` stays a string (no eval)."""
    text = raw.strip()
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_ranges(items: list[str] | None, option: str) -> dict[str, list[Any]]:
    """``["seqlen=2048,4096"]`` -> ``{"seqlen": [2048, 4096]}``; a key given twice is an error."""
    out: dict[str, list[Any]] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        values = [v for v in (x.strip() for x in raw.split(",")) if v]
        if not sep or not key or not values:
            raise MambalayaError(f"{option} expects name=value[,value...], got '{item}'")
        if key in out:
            raise MambalayaError(f"{option} {key} is given twice: list all its values in one option")
        out[key] = [_scalar(v) for v in values]
    return out


def check_table_path(path: str | Path) -> Path:
    """The output table's format from its suffix; Parquet only when pyarrow is installed."""
    path = Path(path)
    if path.suffix.lower() not in TABLE_FORMATS:
        raise MambalayaError(f"cannot write '{path.name}': use a .csv or .parquet file")
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise MambalayaError("writing .parquet needs pyarrow (pip install pyarrow); or write a .csv") from None
    if not path.parent.is_dir():
        raise MambalayaError(f"cannot write {path}: folder {path.parent} does not exist")
    return path


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """CSV or Parquet by suffix, written atomically."""
    path = check_table_path(path)
    if path.suffix.lower() == ".csv":
        write_atomic(path, df.to_csv(index=False))
    else:
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        write_atomic(path, buf.getvalue())
    return path


def sweep_axes(df: pd.DataFrame) -> list[str]:
    """Label columns that vary across the rows (the x axis is the first)."""
    labels = list(df.columns[: list(df.columns).index("feasible")])
    return [c for c in labels if c not in _RESULT and df[c].nunique() > 1]


def plot_sweep(df: pd.DataFrame, path: str | Path) -> Path:
    """Speedup over unfused against the first varying axis, one line per arch and other axes' values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mambalaya.report.plots import save_figure

    axes = sweep_axes(df)
    if not axes:
        raise MambalayaError("nothing to plot: the sweep has one point per arch (give a range to sweep)")
    x, series = axes[0], ["arch", *axes[1:]]
    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    ok = df[df["feasible"]]
    for key, part in ok.groupby(series, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(_legend(k, v) for k, v in zip(series, key, strict=True))
        part = part.sort_values(x)
        ax.plot(part[x], part["speedup"], marker="o", label=label)
    bad = df[~df["feasible"]]
    if len(bad) and pd.api.types.is_numeric_dtype(df[x]):
        ax.scatter(bad[x], [1.0] * len(bad), marker="x", color="crimson", label="no mapping fits", zorder=5)
    if pd.api.types.is_numeric_dtype(df[x]) and df[x].min() > 0 and df[x].max() / df[x].min() >= 8:
        ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(x)
    ax.set_ylabel("speedup over unfused (latency)")
    ax.set_title(f"{df['cascade'].iloc[0]}: optimal fusion vs unfused", fontsize=11)
    ax.grid(True, lw=0.3, alpha=0.6)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _legend(column: str, value: Any) -> str:
    """A sweep series' name in the units people write: ``fusion_buffer 1 MiB``, not ``fusion_buffer_bytes=1048576``."""
    if column == "arch":
        return str(value)
    if column.endswith("_bytes"):
        return f"{column.removesuffix('_bytes')} {fmt_bytes(value)}"
    if column.endswith("_bandwidth"):
        return f"{column} {fmt_rate(value)}"
    return f"{column}={value}"


__all__ = ["check_table_path", "parse_ranges", "plot_sweep", "sweep_axes", "write_table"]
