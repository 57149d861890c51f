"""``run_layer(..., arch=A)``: the fused schedule the mapper picks for A, on real checkpoints, against
transformers' pure-PyTorch mixers (float32, max abs error <= 1e-4)."""

from __future__ import annotations

import numpy as np
import pytest

hf = pytest.importorskip("hf_reference")

from mambalaya.arch import load_arch  # noqa: E402
from mambalaya.exec.realweights import run_layer  # noqa: E402

TOL = 1e-4


def _x(batch: int, seqlen: int, d_model: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((batch, seqlen, d_model)).astype(np.float32)


@pytest.mark.parametrize(("arch", "batch", "seqlen"), [("imax3", 2, 37), pytest.param("h100", 1, 64, marks=pytest.mark.slow)])
def test_mamba1_fused_matches_transformers(tmp_path, arch: str, batch: int, seqlen: int) -> None:
    mixer = hf.make_mamba1(d_model=16, d_state=16, seed=seqlen)
    config, weights = hf.save_mixer(mixer, None, tmp_path)
    x = _x(batch, seqlen, 16)
    got = run_layer(config, weights, x, arch=arch)
    assert got.dtype == np.float32
    assert np.abs(got - hf.mixer_forward(mixer, x)).max() <= TOL


@pytest.mark.parametrize(("arch", "batch", "seqlen"), [pytest.param("imax3", 2, 37, marks=pytest.mark.slow),
                                                      pytest.param("mambalaya", 1, 70, marks=pytest.mark.slow)])
def test_mamba2_fused_matches_transformers(tmp_path, arch: str, batch: int, seqlen: int) -> None:
    mixer = hf.make_mamba2(d_model=32, d_state=64, headdim=16, ngroups=1, chunk=16, seed=seqlen)
    config, weights = hf.save_mixer(mixer, None, tmp_path)
    x = _x(batch, seqlen, 32)
    got = run_layer(config, weights, x, arch=arch)
    assert np.abs(got - hf.mixer_forward(mixer, x)).max() <= TOL


@pytest.mark.slow
def test_tiled_schedule_matches_transformers(tmp_path) -> None:
    """A buffer small enough that the mapper tiles the token loop."""
    mixer = hf.make_mamba1(d_model=16, d_state=16, seed=5)
    config, weights = hf.save_mixer(mixer, None, tmp_path)
    x = _x(1, 29, 16)
    arch = load_arch("imax3").with_overrides(fusion_buffer_bytes=8192)
    got = run_layer(config, weights, x, arch=arch)
    assert np.abs(got - hf.mixer_forward(mixer, x)).max() <= TOL


def test_blocked_scan_matches_transformers() -> None:
    """The scan group with its channels in tiles (d_inner 80 in tiles of 32: two full and a partial one),
    float32, on the Numba backend."""
    from mambalaya.exec.backend import execute
    from mambalaya.exec.realweights import bind_weights
    from mambalaya.ir.mapping import FusionGroup, Mapping
    from mambalaya.parse import open_cascade
    from mambalaya.schedule import lower_mapping

    mixer = hf.make_mamba1(d_model=40, d_state=16, seed=3)
    x = _x(2, 23, 40)
    c = open_cascade("mamba1").with_params(d_model=40, d_state=16, dt_rank=mixer.time_step_rank, batch=2, seqlen=23)
    inputs = {**bind_weights(c, hf.mixer_arrays(mixer)), "U": x}
    groups = [["X0"], ["Z"], ["XC", "X"], ["DTR"], ["BM"], ["CM"], ["DT0", "DT"], ["A"], ["DA", "BX", "H", "SY", "HF"],
              ["Y", "G", "OUT"], ["CSF"]]
    m = Mapping(tuple(FusionGroup(tuple(g), tiles={"d": 32} if "H" in g else {}) for g in groups), c.name)
    sched = lower_mapping(c, m, "imax3", check=False)
    scan = sched.groups[8]
    assert [(lp.rank, lp.tile, lp.trips) for lp in scan.loops] == [("d", 32, 3)]
    got = execute(c, sched, inputs, "numba", "float32").outputs["OUT"]
    assert np.abs(got - hf.mixer_forward(mixer, x)).max() <= TOL
