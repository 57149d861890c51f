"""`mambalaya.write_random_model`: a random model of a published size in transformers' checkpoint layout.

transformers must load it as its own (no missing or unexpected tensor), and mambalaya's generate on it must
give transformers' greedy tokens: the file is a real checkpoint, not one only mambalaya reads.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
hf = pytest.importorskip("hf_reference")
transformers = pytest.importorskip("transformers")

from mambalaya.errors import WeightsError  # noqa: E402
from mambalaya.exec.generate import generate  # noqa: E402
from mambalaya.exec.random_model import random_model_config, write_random_model  # noqa: E402

#: Published models shrunk so a test runs in seconds (the fields a user would override the same way).
SMALL = {"mamba-130m": {"hidden_size": 32, "intermediate_size": 64, "time_step_rank": 2, "state_size": 8},
         "mamba2-130m": {"hidden_size": 32, "num_heads": 8, "head_dim": 8, "state_size": 8, "chunk_size": 4}}


@pytest.mark.parametrize("model", list(SMALL))
def test_transformers_loads_it_and_generates_what_mambalaya_does(model, tmp_path) -> None:
    config, weights = write_random_model(tmp_path / "m", model, layers=2, vocab_size=128, **SMALL[model])
    cfg = json.loads(config.read_text())
    cls = transformers.MambaForCausalLM if cfg["model_type"] == "mamba" else transformers.Mamba2ForCausalLM
    lm, info = cls.from_pretrained(config.parent, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    lm.eval()
    prompt = [5, 9, 17, 3]
    want, want_logits = hf.lm_generate(lm, prompt, 12)
    got = generate(config, weights, prompt, 12, keep_logits=True)
    assert got.tokens == want
    # (a realistic init's small embeddings may repeat one token: the logits say the two models agree)
    assert max(float(abs(g - w).max() / abs(w).max()) for g, w in zip(got.logits, want_logits, strict=True)) <= 1e-4


def test_the_published_size_is_the_default_and_a_seed_repeats_it(tmp_path) -> None:
    cfg = random_model_config("mamba2-370m", layers=1)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["model_type"]) == (1024, 1, "mamba2")
    a = write_random_model(tmp_path / "a", "mamba-130m", layers=1, vocab_size=64, hidden_size=16,
                           intermediate_size=32, time_step_rank=1, seed=4)[1].read_bytes()
    b = write_random_model(tmp_path / "b", "mamba-130m", layers=1, vocab_size=64, hidden_size=16,
                           intermediate_size=32, time_step_rank=1, seed=4)[1].read_bytes()
    assert a == b


def test_a_bad_model_or_field_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(WeightsError, match="unknown model 'mamba2-370'.*mamba2-370m"):
        random_model_config("mamba2-370")
    with pytest.raises(WeightsError, match="num_heads"):
        write_random_model(tmp_path / "x", "mamba2-130m", num_heads=7)
    assert not (tmp_path / "x" / "model.safetensors").exists()
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(WeightsError, match="cannot make the folder"):
        write_random_model(blocked / "sub", "mamba-130m", layers=1, vocab_size=8, hidden_size=8,
                           intermediate_size=16, time_step_rank=1)
