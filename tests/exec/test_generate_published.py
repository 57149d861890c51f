"""`generate` at the published 130m shapes (d_model 768, the real vocabularies, Mamba-2's 128-state heads
and 256-token chunks) with 2 layers instead of 24: token ids and logits against transformers, float32 and
bf16 checkpoints, a 1-token and a 24-token prompt. Slow (mapping and compiling the 768-wide cascades)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf = pytest.importorskip("hf_reference")

from mambalaya.exec.generate import load_generator  # noqa: E402

pytestmark = pytest.mark.slow

SHAPES = {
    "mamba-130m": ("mamba1", {"d_model": 768, "d_state": 16}, 50280),
    "mamba2-130m": ("mamba2", {"d_model": 768, "d_state": 128, "headdim": 64, "ngroups": 1, "chunk": 256}, 50288),
}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_published_shapes_generate_transformers_tokens(name, dtype, tmp_path) -> None:
    family, sizes, vocab = SHAPES[name]
    model = hf.make_lm(family, layers=2, vocab=vocab, seed=7, tie=True, **sizes)
    config, weights = hf.save_lm(model, tmp_path, dtype=dtype)
    ref = type(model).from_pretrained(tmp_path, dtype=torch.float32).eval() if dtype is not None else model
    gen = load_generator(config, weights)
    for prompt in ([11], list(range(1000, 1024))):
        want, want_logits = hf.lm_generate(ref, prompt, 32)
        got = gen.generate(prompt, 32, keep_logits=True)
        assert got.tokens == want, (prompt[:2], got.tokens, want)
        err = max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got.logits, want_logits, strict=True))
        assert err <= 1e-4
