"""Regenerate the cascade figures in this folder (deterministic: same inputs, same bytes).

Run from the repository root: ``PYTHONPATH=. python docs/figures/generate.py``.
"""

from __future__ import annotations

from pathlib import Path

from mambalaya.fileio import resolve_shipped
from mambalaya.ir.mapping import load_mapping, unfused_mapping
from mambalaya.parse.cascade_file import load_cascade
from mambalaya.report.render import render_cascade

HERE = Path(__file__).resolve().parent


def main() -> None:
    for name in ("mamba1", "mamba2"):
        cascade = load_cascade(resolve_shipped(name, "cascades"))
        fused = load_mapping(HERE / f"{name}-fused.mapping.yaml")
        for suffix in ("svg", "png"):
            render_cascade(cascade, HERE / f"{name}.{suffix}")
            render_cascade(cascade, HERE / f"{name}-fused.{suffix}", mapping=fused)
            if name == "mamba1":
                render_cascade(cascade, HERE / f"{name}-unfused.{suffix}", mapping=unfused_mapping(cascade))


if __name__ == "__main__":
    main()
