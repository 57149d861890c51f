"""`mambalaya generate`: whole Mamba models from checkpoint to tokens, against transformers' greedy generate.

The models are random-initialised ``MambaForCausalLM`` / ``Mamba2ForCausalLM`` written by
``save_pretrained`` (a real checkpoint: config.json, model.safetensors, a tied head left out); every mixer
runs the mapper's cpu schedule on the Numba backend; transformers runs its pure-PyTorch path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hf = pytest.importorskip("hf_reference")

from mambalaya.checkpoint import load_hf_config, model_config  # noqa: E402
from mambalaya.cli import main  # noqa: E402
from mambalaya.errors import WeightsError  # noqa: E402
from mambalaya.exec.generate import (  # noqa: E402
    generate,
    load_generator,
    model_cascades,
    predict_generation,
    read_prompt_ids,
)
from mambalaya.mapper import evaluate  # noqa: E402

#: Small mixers of each family (Mamba-2: two groups, chunks of 4 so a prompt spans several).
SMALL = {"mamba1": {"d_model": 32, "d_state": 8}, "mamba2": {"d_model": 32, "d_state": 8, "headdim": 8, "ngroups": 2,
                                                             "chunk": 4}}
PROMPTS = {"one token": [7], "tens of tokens": list(range(3, 40))}
NEW = 32


def _max_rel(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, want, strict=True))


@pytest.fixture(scope="module", params=["mamba1", "mamba2"])
def checkpoint(request, tmp_path_factory):
    """(model, config path, weights path) of a 3-layer model, the head tied for Mamba-1 and not for Mamba-2
    (each family's transformers default)."""
    family = request.param
    model = hf.make_lm(family, layers=3, vocab=256, seed=3, **SMALL[family])
    config, weights = hf.save_lm(model, tmp_path_factory.mktemp(family))
    return model, config, weights


@pytest.mark.parametrize("prompt", list(PROMPTS), ids=list(PROMPTS))
def test_tokens_and_logits_match_transformers_generate(checkpoint, prompt) -> None:
    model, config, weights = checkpoint
    want, want_logits = hf.lm_generate(model, PROMPTS[prompt], NEW)
    got = generate(config, weights, PROMPTS[prompt], NEW, keep_logits=True)
    assert got.tokens == want
    assert len(set(want)) > 3  # the model does not just repeat one token: the check can tell models apart
    assert _max_rel(got.logits, want_logits) <= 1e-4
    assert len(got.decode_s) == NEW - 1 and got.tokens_per_s > 0 and not got.interrupted


def test_head_untied_from_embeddings_is_read_from_the_file(tmp_path) -> None:
    """A Mamba-1 model with its own lm_head.weight: using the embeddings instead would pick other tokens."""
    model = hf.make_lm("mamba1", layers=2, vocab=128, seed=5, tie=False, **SMALL["mamba1"])
    config, weights = hf.save_lm(model, tmp_path)
    want, _ = hf.lm_generate(model, [1, 2, 3], 8)
    assert generate(config, weights, [1, 2, 3], 8).tokens == want


def test_bf16_checkpoint_generates_what_transformers_does_from_it(tmp_path) -> None:
    model = hf.make_lm("mamba2", layers=2, vocab=128, seed=6, **SMALL["mamba2"])
    config, weights = hf.save_lm(model, tmp_path, dtype=torch.bfloat16)
    ref = type(model).from_pretrained(tmp_path, dtype=torch.float32).eval()  # the same bf16-rounded weights
    want, want_logits = hf.lm_generate(ref, [9, 8, 7, 6, 5], 16)
    got = generate(config, weights, [9, 8, 7, 6, 5], 16, keep_logits=True)
    assert got.tokens == want and _max_rel(got.logits, want_logits) <= 1e-4


def test_generation_stops_at_the_configs_end_of_sequence_id(checkpoint, tmp_path) -> None:
    model, config, weights = checkpoint
    free, _ = hf.lm_generate(model, [7], 12)
    eos = free[5]
    cfg = json.loads(config.read_text())
    cfg["eos_token_id"] = eos
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = generate(tmp_path / "config.json", weights, [7], 12)
    assert got.stopped_at_eos and got.tokens == free[: free.index(eos) + 1]
    assert generate(tmp_path / "config.json", weights, [7], 12, stop_at_eos=False).tokens == free


def test_interrupt_keeps_the_tokens_finished(checkpoint) -> None:
    _, config, weights = checkpoint

    def stop_after_three(done: int, total: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    got = generate(config, weights, [7], 10, on_token=stop_after_three)
    full = generate(config, weights, [7], 10)
    assert got.interrupted and got.tokens == full.tokens[:3] and len(got.decode_s) == 2


def test_prediction_is_the_generators_own_schedules_priced(checkpoint) -> None:
    """Per token: layers x the decode mapping's latency + the head's, each the cost model's figure for the
    schedule that ran."""
    _, config, weights = checkpoint
    gen = load_generator(config, weights)
    pred = gen.prediction(5)
    cfg = load_hf_config(config)
    cascades, layers = model_cascades(cfg, 5), model_config(cfg).layers
    decode = evaluate(cascades["decode"], "cpu", gen.stage("decode").report.mapping).latency_s
    head = evaluate(cascades["head"], "cpu", gen.stage("head").report.mapping).latency_s
    assert pred.token_s == pytest.approx(layers * decode + head)
    assert pred.prefill_s == pytest.approx(layers * gen.stage("prefill", 5).latency_s + head)
    shares = [s for _, s in pred.dominant]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    assert predict_generation(config, "cpu", 5).token_s == pytest.approx(pred.token_s)


def test_predicted_lm_head_grows_with_the_vocabulary() -> None:
    small, big = ({"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 2, "vocab_size": v}
                  for v in (1024, 50280))
    a, b = predict_generation(small, "marca"), predict_generation(big, "marca")
    assert b.lm_head_s > 10 * a.lm_head_s and b.decode_layer_s == pytest.approx(a.decode_layer_s)


# ---- bad input: one clear error, nothing written ------------------------------------------------------


def test_prompt_outside_the_vocabulary_is_refused(checkpoint) -> None:
    _, config, weights = checkpoint
    with pytest.raises(WeightsError, match="outside the vocabulary"):
        generate(config, weights, [3, 256], 4)


def test_untied_config_without_a_head_names_what_is_missing(tmp_path) -> None:
    model = hf.make_lm("mamba1", layers=1, vocab=64, seed=1, **SMALL["mamba1"])
    config, weights = hf.save_lm(model, tmp_path)  # tied: the file has no lm_head.weight
    cfg = json.loads(config.read_text())
    cfg["tie_word_embeddings"] = False
    config.write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match="LM head"):
        load_generator(config, weights)


def test_config_with_more_layers_than_the_file(checkpoint, tmp_path) -> None:
    _, config, weights = checkpoint
    cfg = json.loads(config.read_text())
    cfg["num_hidden_layers"] = 5
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match="layer 3's block norm is missing.*0-2"):
        load_generator(tmp_path / "config.json", weights)


def test_projection_biases_are_refused(tmp_path) -> None:
    model = hf.make_lm("mamba1", layers=1, vocab=64, seed=1, use_bias=True, **SMALL["mamba1"])
    config, weights = hf.save_lm(model, tmp_path)
    with pytest.raises(WeightsError, match="in_proj.bias"):
        load_generator(config, weights)


def test_prompt_ids_from_text_and_files(tmp_path) -> None:
    assert read_prompt_ids("1, 2,3") == [1, 2, 3]
    np.save(tmp_path / "ids.npy", np.array([[4, 5, 6]]))
    assert read_prompt_ids(path=tmp_path / "ids.npy") == [4, 5, 6]
    (tmp_path / "ids.txt").write_text("7 8\n9\n")
    assert read_prompt_ids(path=tmp_path / "ids.txt") == [7, 8, 9]
    np.save(tmp_path / "bad.npy", np.zeros(3))
    for kwargs, match in [({"text": "1,x"}, "'x' is not a token id"), ({"path": tmp_path / "bad.npy"}, "integer"),
                          ({}, "one of them"), ({"path": tmp_path / "none.npy"}, "not found")]:
        with pytest.raises(WeightsError, match=match):
            read_prompt_ids(**kwargs)


# ---- the command line --------------------------------------------------------------------------------


def test_cli_generate_json_and_output_file(checkpoint, tmp_path, capsys) -> None:
    model, config, weights = checkpoint
    want, _ = hf.lm_generate(model, [1, 2, 3], 6)
    out = tmp_path / "ids.npy"
    rc = main(["generate", "--config", str(config), "--weights", str(weights), "--prompt-ids", "1,2,3",
               "--max-new-tokens", "6", "-o", str(out), "--json"])
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["prompt"] == [1, 2, 3] and obj["tokens"] == want and obj["tokens_per_s"] > 0
    assert obj["predicted"]["arch"] == "cpu" and obj["predicted"]["tokens_per_s"] > 0
    assert np.load(out).tolist() == want


def test_cli_generate_prints_ids_and_the_time_split(checkpoint, capsys) -> None:
    model, config, weights = checkpoint
    want, _ = hf.lm_generate(model, [5], 4)
    assert main(["generate", "--config", str(config), "--weights", str(weights), "--prompt-ids", "5",
                 "--max-new-tokens", "4"]) == 0
    cap = capsys.readouterr()
    assert cap.out.strip() == ",".join(map(str, want))
    assert "tokens/s" in cap.err and "decode" in cap.err and "predicted on cpu" in cap.err


def test_cli_generate_bad_input_exits_2_with_one_line(checkpoint, tmp_path, capsys) -> None:
    _, config, weights = checkpoint
    rc = main(["generate", "--config", str(config), "--weights", str(tmp_path / "missing.safetensors"),
               "--prompt-ids", "1", "--max-new-tokens", "3", "-o", str(tmp_path / "ids.txt")])
    err = capsys.readouterr().err
    assert rc == 2 and "weights file not found" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "ids.txt").exists()


def test_mamba_ssm_checkpoint_layout_generates_the_same_tokens(tmp_path) -> None:
    """A state-spaces/mamba-* style checkpoint: mamba_ssm's config (d_model, n_layer, ssm_cfg, a vocabulary
    padded up to a multiple of 8) and its names (``backbone.embedding.weight``, the head tied)."""
    model = hf.make_lm("mamba1", layers=2, vocab=248, seed=8, **SMALL["mamba1"])
    want, _ = hf.lm_generate(model, [4, 5, 6], 10)
    tensors = {k.replace("backbone.embeddings.", "backbone.embedding."): v.numpy()
               for k, v in model.state_dict().items() if k != "lm_head.weight"}
    np.savez(tmp_path / "model.npz", **tensors)
    (tmp_path / "config.json").write_text(json.dumps({
        "d_model": 32, "n_layer": 2, "vocab_size": 241, "pad_vocab_size_multiple": 8, "tie_embeddings": True,
        "ssm_cfg": {"d_state": 8}, "rms_norm": True, "residual_in_fp32": True}))
    got = generate(tmp_path / "config.json", tmp_path / "model.npz", [4, 5, 6], 10)
    assert got.tokens == want


def test_predict_generation_shows_each_mapping_as_a_step(capsys) -> None:
    """A GPU arch's three mappings took minutes with nothing on screen: each is now a step on stderr."""
    from mambalaya.exec.generate import predict_generation
    from mambalaya.exec.random_model import random_model_config

    cfg = random_model_config("mamba-130m", 1, vocab_size=64, hidden_size=16, intermediate_size=32,
                              time_step_rank=2, state_size=4)
    predict_generation(cfg, "cpu", prompt_len=8, progress=True)
    err = capsys.readouterr().err
    assert all(f"mapping the {stage} cascade" in err for stage in ("prefill", "decode", "head")), err
    predict_generation(cfg, "cpu", prompt_len=8, progress=False)
    assert capsys.readouterr().err == ""
