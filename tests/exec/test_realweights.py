"""`mambalaya run --backend triton`: a real checkpoint through generated Triton kernels (under Triton's
interpreter without a GPU) against transformers' pure-PyTorch mixer."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
hf = pytest.importorskip("hf_reference")

from mambalaya.cli import main  # noqa: E402
from mambalaya.errors import MambalayaError  # noqa: E402
from mambalaya.exec.realweights import run_layer  # noqa: E402
from mambalaya.exec.triton_backend import triton_available  # noqa: E402

if not triton_available()[0]:
    pytest.skip(f"Triton cannot run here: {triton_available()[1]}", allow_module_level=True)


def _x(batch: int, seqlen: int, d_model: int) -> np.ndarray:
    return np.random.default_rng(4).standard_normal((batch, seqlen, d_model)).astype(np.float32)


def test_run_cli_triton_backend_matches_transformers(tmp_path, capsys) -> None:
    """The CLI path a user takes: h200's optimal schedule as Triton kernels, fp32, <= 1e-4."""
    mixer = hf.make_mamba1(d_model=16, d_state=16, seed=11)
    config, weights = hf.save_mixer(mixer, None, tmp_path)
    x = _x(1, 12, 16)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npy"
    rc = main(["run", "--config", str(config), "--weights", str(weights), "--input", str(tmp_path / "x.npy"),
               "-o", str(out), "--backend", "triton"])
    assert rc == 0
    assert "reference fallback" not in capsys.readouterr().err
    y = np.load(out)
    assert np.abs(y - hf.mixer_forward(mixer, x)).max() <= 1e-4


@pytest.mark.parametrize("arch", ["imax3"])
def test_mamba2_triton_backend_matches_transformers(tmp_path, arch: str) -> None:
    """Another arch's schedule (imax3 splits the layer differently) runs through the same generator. (A GPU arch's
    schedules of every small cascade run through it in test_verify_matrix's Triton cases: an h100 case here took
    250 s of the slow step for that coverage again.)"""
    mixer = hf.make_mamba2(d_model=32, d_state=64, headdim=16, ngroups=1, chunk=16, seed=7)
    config, weights = hf.save_mixer(mixer, None, tmp_path)
    x = _x(1, 20, 32)
    notes: list[str] = []
    got = run_layer(config, weights, x, arch=arch, backend="triton", notes=notes)
    assert notes == []
    assert np.abs(got - hf.mixer_forward(mixer, x)).max() <= 1e-4


def test_unknown_backend_is_a_user_error(tmp_path) -> None:
    mixer = hf.make_mamba1(d_model=16, d_state=16, seed=1)
    config, weights = hf.save_mixer(mixer, None, tmp_path)
    with pytest.raises(MambalayaError, match="unknown backend 'cuda': use one of"):
        run_layer(config, weights, _x(1, 4, 16), backend="cuda")
