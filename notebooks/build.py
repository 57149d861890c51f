"""Write the example notebooks (run from the repo root: ``python notebooks/build.py``).

The notebooks are generated, so their code stays reviewable here as plain Python;
``tests/report/test_notebooks.py`` executes each one so they never rot.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """import mambalaya
from mambalaya.study import explore
import matplotlib.pyplot as plt
%matplotlib inline"""

NOTEBOOKS = {
    "01_mamba2_fusion_vs_seqlen.ipynb": [
        "# Mamba-2: fusion across sequence lengths\n\nThe optimal fused mapping of a Mamba-2 layer "
        "(mamba2-130m) on the Mambalaya-style accelerator, against the unfused MARCA-style baseline, as the "
        "sequence grows. `explore` returns one row per design point.",
        SETUP,
        """df = explore("mamba2", ["mambalaya", "marca"], sweep={"model": ["mamba2-130m"], "seqlen": [512, 2048]},
             progress=False)
df[["seqlen", "arch", "groups", "traffic_bytes", "unfused_traffic_bytes", "latency_s", "unfused_latency_s",
    "speedup"]]""",
        """fig, ax = plt.subplots(figsize=(6, 3.5))
for arch, part in df.groupby("arch"):
    ax.plot(part["seqlen"], part["latency_s"] * 1e6, marker="o", label=f"{arch} (optimal)")
base = df[df.arch == "marca"]
ax.set_xscale("log", base=2); ax.set_xlabel("seqlen"); ax.set_ylabel("latency (µs)"); ax.legend()
ax.set_title("Mamba-2 layer: fused accelerator vs unfused baseline")""",
        """ratio = (df[df.arch == "marca"]["latency_s"].values / df[df.arch == "mambalaya"]["latency_s"].values)
assert (ratio > 1).all(), ratio  # fusion on the Mambalaya-style accelerator beats the unfused baseline
dict(zip(df[df.arch == "mambalaya"]["seqlen"], ratio.round(2)))""",
    ],
    "02_imax_vs_h200.ipynb": [
        "# The same Mamba-2 layer on IMAX3 and H200\n\nA CGLA (IMAX3) and a GPU (H200) map the same layer "
        "very differently; compare the optimal mappings and their rooflines.",
        SETUP + "\nfrom mambalaya.mapper import optimal_mapping\nfrom mambalaya.mapper import evaluate\n"
        "from mambalaya.report.plots import roofline_figure",
        """cascade = mambalaya.open_cascade("mamba2", model="mamba2-130m", params={"seqlen": 256})
results = {a: optimal_mapping(cascade, a) for a in ("imax3", "h200")}
{a: {"groups": len(r.groups), "latency_s": r.report.latency_s, "traffic_MB": r.report.traffic_bytes / 1e6,
     "speedup_vs_unfused": evaluate(cascade, a).latency_s / r.report.latency_s} for a, r in results.items()}""",
        """arch = mambalaya.load_arch("h200")
roofline_figure([("unfused", evaluate(cascade, arch)), ("optimal", results["h200"].report)], arch)""",
        """assert results["h200"].report.latency_s < results["imax3"].report.latency_s
results["imax3"].report.groups_dataframe()[["einsums", "latency_s", "bound"]]""",
    ],
    "03_buffer_sweep.ipynb": [
        "# Where fusion stops paying: a buffer-size sweep\n\nShrink the Mambalaya accelerator's fusion buffer "
        "and watch the optimal mapping fall back towards unfused. Points where nothing fits are rows with "
        "`feasible == False`, not errors.",
        SETUP,
        """sizes = ["1 B", "64 KiB", "2 MiB", "32 MiB"]
df = explore("mamba2", "mambalaya", sweep={"model": ["mamba2-130m"], "seqlen": [256]},
             arch_overrides={"fusion_buffer_bytes": sizes}, progress=False)
df[["fusion_buffer_bytes", "feasible", "groups", "traffic_bytes", "speedup", "reason"]]""",
        """ok = df[df.feasible]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(ok["fusion_buffer_bytes"], ok["speedup"], marker="o")
ax.axhline(1, color="grey", ls="--"); ax.set_xscale("log", base=2)
ax.set_xlabel("fusion buffer (bytes)"); ax.set_ylabel("speedup over unfused"); ax.set_title("Fusion vs buffer size")""",
        """assert not df.feasible.iloc[0] and df.feasible.iloc[1:].all()
assert ok["speedup"].is_monotonic_increasing  # more buffer never hurts the optimal mapping""",
    ],
}


def build() -> list[Path]:
    paths = []
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook(cells=[new_markdown_cell(cells[0]), *(new_code_cell(c) for c in cells[1:])])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        path = HERE / name
        nbformat.write(nb, str(path))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build():
        print(p)
