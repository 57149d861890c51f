"""Decode kept on the device (the triton backend's generation): the same tokens as transformers, its states resident.

Without a GPU the Triton kernels run under the interpreter on CPU tensors, eagerly; on a GPU the token's launches
are one CUDA graph (checked by the last test, which skips here).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
hf = pytest.importorskip("hf_reference")

from mambalaya.errors import MambalayaError  # noqa: E402
from mambalaya.exec.device_decode import DeviceDecoder, rms_norm  # noqa: E402
from mambalaya.exec.generate import load_generator  # noqa: E402

SMALL = {"mamba1": {"d_model": 32, "d_state": 8}, "mamba2": {"d_model": 32, "d_state": 8, "headdim": 8, "ngroups": 2,
                                                             "chunk": 4}}


@pytest.fixture(scope="module", params=["mamba1", pytest.param("mamba2", marks=pytest.mark.slow)])
def tiny(request, tmp_path_factory):
    family = request.param
    model = hf.make_lm(family, layers=2, vocab=64, seed=3, **SMALL[family])
    return (model, *hf.save_lm(model, tmp_path_factory.mktemp(family)))


def _numba(config, weights, prompt, new):
    return load_generator(config, weights, "cpu", backend="numba").generate(prompt, new, keep_logits=True)


def test_device_decode_generates_what_transformers_does(tiny) -> None:
    """Greedy tokens and every step's logits as transformers' ``generate`` (and the Numba host loop, itself held to
    transformers in test_generate.py); the states live on the device from the first step (the host loop's arrays
    are not what advances)."""
    model, config, weights = tiny
    prompt, new = [3, 5, 7], 8
    want, want_logits = hf.lm_generate(model, prompt, new)
    host = _numba(config, weights, prompt, new)
    gen = load_generator(config, weights, "h200", backend="triton")
    got = gen.generate(prompt, new, keep_logits=True)
    assert got.tokens == host.tokens and len(set(host.tokens)) > 2
    assert max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got.logits, host.logits, strict=True)) \
        <= 1e-4
    if not torch.cuda.is_available():  # (the GPU machines' own transformers, another version, differs for 2 groups)
        assert got.tokens == want and max(float(np.abs(g - w).max() / np.abs(w).max())
                                          for g, w in zip(got.logits, want_logits, strict=True)) <= 1e-4
    states, dec = gen._device
    assert isinstance(dec, DeviceDecoder) and all(isinstance(t, torch.Tensor) for st in dec.states for t in st.values())
    again = gen.generate(prompt, new)  # (a new prompt's states: a new decoder, the same tokens)
    assert again.tokens == host.tokens and gen._device[0] is not states


def test_rms_norm_is_one_rule_for_arrays_and_tensors() -> None:
    rng = np.random.default_rng(0)
    h, w = rng.standard_normal((1, 3, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    want = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + 1e-5) * w
    assert np.allclose(rms_norm(h, w, 1e-5), want, rtol=1e-6)
    assert np.allclose(rms_norm(torch.from_numpy(h), torch.from_numpy(w), 1e-5).numpy(), want, rtol=1e-6)


def test_a_device_tensor_of_another_shape_is_refused_by_name(tiny) -> None:
    from mambalaya.exec.triton_backend import device_of, run_program

    _, config, weights = tiny
    gen = load_generator(config, weights, "h200", backend="triton")
    stage = gen.stage("head")
    (bound,) = gen._layer_inputs("head", stage)
    bad = torch.zeros((2, 5), dtype=torch.float32, device=device_of())
    with pytest.raises(MambalayaError, match=r"input tensor U: a \(2, 5\)"):
        run_program(stage.program, {**bound, "U": bad}, count=False, to_host=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_on_a_gpu_a_token_is_one_graph_replay(tiny) -> None:
    _, config, weights = tiny
    gen = load_generator(config, weights, "h200", backend="triton")
    assert gen.generate([3, 5, 7], 8).tokens == _numba(config, weights, [3, 5, 7], 8).tokens
    assert gen._device[1].graphs is not None
