"""``mambalaya report``: a folder with report.md, a self-contained report.html, mapping.json, CSVs, figures.

The folder appears whole or not at all: everything is computed first (a mapping
error leaves nothing behind), written into a temporary sibling folder, and renamed
into place. An existing folder is replaced only when it is empty or a previous
report, so ``-o .`` can never wipe a user's files.

Layout (per architecture ``A``)::

    DIR/report.md  report.html  report.json  mapping.json (one arch)  comparison.png (2+ archs)
    DIR/A/mapping.json  einsums.csv  groups.csv  cascade.svg  roofline.png  utilisation.png
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from mambalaya.arch import Arch
from mambalaya.errors import MambalayaError
from mambalaya.ir.cascade import Cascade
from mambalaya.report.content import ArchStudy, Study, einsum_rows, study
from mambalaya.report.figures import arch_figures, comparison_figure
from mambalaya.report.html import render_html
from mambalaya.report.markdown import render_markdown

#: Files whose presence marks a folder as an earlier report (safe to replace).
MARKERS = ("report.md", "report.html")


def check_output_dir(out_dir: str | Path) -> Path:
    """Fail early (before any solving) if the report could not be put at ``out_dir``."""
    out = Path(out_dir).absolute()
    parent = out.parent
    while not parent.exists():  # missing folders are made once the report is built, as mkdir -p would
        parent = parent.parent
    if not parent.is_dir():
        raise MambalayaError(f"cannot write report to {out_dir}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MambalayaError(f"cannot write report to {out_dir}: folder {parent} is not writable")
    if out.exists():
        if not out.is_dir():
            raise MambalayaError(f"cannot write report to {out_dir}: it exists and is not a folder")
        entries = list(out.iterdir())
        if entries and not any((out / m).exists() for m in MARKERS):
            raise MambalayaError(f"refusing to replace {out_dir}: it is a non-empty folder that holds no report")
    return out


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def mapping_json(a: ArchStudy, objective: str) -> str:
    """The chosen mapping in the mapping-file format (``load_mapping`` reads it back)."""
    data = {**a.result.mapping.to_dict(), "objective": objective, "optimal": a.result.optimal}
    return json.dumps(data, indent=2) + "\n"


def summary_json(s: Study) -> str:
    """Machine-readable headline figures per arch (what a script would diff between runs: no wall times, so the
    same input writes the same bytes; ``map --json`` says how long a mapping took)."""
    archs = []
    for a in s.archs:
        archs.append({
            "arch": a.arch.name,
            **a.report.summary(),
            "unfused": a.unfused.summary(),
            "speedup": a.speedup,
            "optimal": a.result.optimal,
            "buffer_bytes": list(a.buffers),
            "fusion_buffer_bytes": a.arch.fusion_buffer_bytes,
            "einsums": einsum_rows(a),
        })
    data = {"cascade": s.cascade.name, "params": dict(s.cascade.params), "objective": s.objective, "archs": archs}
    return json.dumps(_json_safe(data), indent=2) + "\n"


def report_files(s: Study) -> dict[str, bytes | str]:
    """Every file of the report, by relative path, built in memory."""
    from mambalaya import __version__

    files: dict[str, bytes | str] = {}
    figures: dict[str, dict[str, bytes]] = {}
    listing: dict[str, list[str]] = {}
    for a in s.archs:
        n = a.arch.name
        figures[n] = arch_figures(s, a)
        groups = a.report.groups_dataframe()
        per_arch = {
            "mapping.json": mapping_json(a, s.objective),
            "einsums.csv": pd.DataFrame(einsum_rows(a)).to_csv(index=False),
            "groups.csv": groups.assign(buffer_bytes=list(a.buffers)).to_csv(index=False),
            **figures[n],
        }
        files.update({f"{n}/{k}": v for k, v in per_arch.items()})
        listing[n] = [f"{n}/{k}" for k in per_arch]
    comparison = comparison_figure(s) if len(s.archs) > 1 else None
    if comparison is not None:
        files["comparison.png"] = comparison
    if len(s.archs) == 1:  # (with several, each arch's is in its folder: a top-level one would name one of them)
        files["mapping.json"] = mapping_json(s.archs[0], s.objective)
    files["report.json"] = summary_json(s)
    files["report.md"] = render_markdown(s, listing)
    files["report.html"] = render_html(s, figures, comparison, __version__)
    return files


def _install(tmp: Path, out: Path) -> None:
    """Rename the finished folder into place, swapping out an earlier report if there is one."""
    if not out.exists():
        os.rename(tmp, out)
        return
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old."))
    os.rename(out, old / "report")
    try:
        os.rename(tmp, out)
    except OSError:
        os.rename(old / "report", out)  # put the earlier report back
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def write_report(cascade: Cascade, archs: list[Arch | str], out_dir: str | Path, objective: str = "latency") -> Path:
    """Map ``cascade`` on each arch and write the report folder atomically; returns its path."""
    if not archs:
        raise MambalayaError("a report needs at least one --arch")
    names = [a if isinstance(a, str) else a.name for a in archs]
    if len(set(names)) != len(names):
        raise MambalayaError(f"--arch given twice: {', '.join(names)}")
    out = check_output_dir(out_dir)
    files = report_files(study(cascade, archs, objective))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp."))
    except OSError as err:
        raise MambalayaError(f"cannot write report to {out_dir}: {err.strerror}") from None
    try:
        for rel, data in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, str):
                path.write_text(data, encoding="utf-8")
            else:
                path.write_bytes(data)
        os.chmod(tmp, 0o777 & ~_umask())
        _install(tmp, out)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise MambalayaError(f"cannot write report to {out_dir}: {err.strerror or err}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


__all__ = ["MARKERS", "check_output_dir", "report_files", "write_report"]
