"""Max abs error of the shipped Mamba cascades against transformers' PyTorch mixers.

Runs the same cases as tests/exec/test_mamba_vs_transformers.py through the
real-weights path (config.json + safetensors -> ``run_layer``) and prints a
Markdown table of the errors, for float32 and float64 execution.

    python benchmarks/accuracy_vs_transformers.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import hf_reference as hf  # noqa: E402
from exec.test_mamba_vs_transformers import MAMBA1_CASES, MAMBA2_CASES, _rng_input  # noqa: E402

from mambalaya.exec.realweights import run_layer  # noqa: E402


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (d_model, d_state, batch, seqlen) in enumerate(MAMBA1_CASES):
            mixer = hf.make_mamba1(d_model=d_model, d_state=d_state, seed=seqlen)
            rows.append(_case(mixer, Path(tmp) / f"m1-{i}", batch, seqlen, d_model,
                              f"mamba1 d_model={d_model} N={d_state} b={batch} L={seqlen}"))
        for i, (d_model, d_state, headdim, ngroups, chunk, batch, seqlen, dt_limit) in enumerate(MAMBA2_CASES):
            mixer = hf.make_mamba2(d_model=d_model, d_state=d_state, headdim=headdim, ngroups=ngroups,
                                   chunk=chunk, dt_limit=dt_limit, seed=seqlen)
            rows.append(_case(mixer, Path(tmp) / f"m2-{i}", batch, seqlen, d_model,
                              f"mamba2 d_model={d_model} N={d_state} P={headdim} G={ngroups} Q={chunk} "
                              f"b={batch} L={seqlen} dt_limit={dt_limit}"))
    print("| case | SSM/skip rms | max abs err float32 | max abs err float64 |")
    print("|---|---:|---:|---:|")
    for name, ratio, e32, e64 in rows:
        print(f"| {name} | {ratio:.0f} | {e32:.2e} | {e64:.2e} |")


def _case(mixer, folder: Path, batch: int, seqlen: int, d_model: int, name: str):
    config, weights = hf.save_mixer(mixer, None, folder)
    x = _rng_input(batch, seqlen, d_model)
    want = hf.mixer_forward(mixer, x)
    ratio = hf.ssm_vs_skip(mixer, x)["ratio"] if seqlen > 1 else float("nan")
    e32 = float(np.abs(run_layer(config, weights, x) - want).max())
    e64 = float(np.abs(run_layer(config, weights, x, dtype="float64") - want).max())
    return name, ratio, e32, e64


if __name__ == "__main__":
    main()
