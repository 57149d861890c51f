"""Whole-model greedy generation: ``mambalaya generate`` (the mapper's cpu schedules on Numba) vs transformers.

The 24-layer 130m shapes of both families (random-initialised ``MambaForCausalLM`` / ``Mamba2ForCausalLM``
with the published sizes and vocabularies, head tied as the released checkpoints have it, written with
``save_pretrained``), a prompt of ``--prompt`` random ids, ``--new`` new tokens, batch 1, the same thread
count for both::

    PYTHONPATH=. .venv/bin/python benchmarks/bench_generate.py --md benchmarks/results/generate.md

transformers (its pure-PyTorch path, ``generate(do_sample=False)``) runs in a process of its own, its
rounds alternating with ours (see ``bench_executor.py`` for why). Both sides' token ids are compared.
Then the prediction: tokens/s for every shipped architecture from the mapper's own prefill, decode and
head schedules, and the Einsums that dominate a token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

THREADS = os.environ.setdefault("NUMBA_NUM_THREADS", "2")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

#: The published 130m shapes (the released configs: state-spaces/mamba-130m-hf, state-spaces/mamba2-130m).
MODELS = {
    "mamba-130m": ("mamba1", {"d_model": 768, "d_state": 16, "expand": 2, "d_conv": 4}, 50280),
    "mamba2-130m": ("mamba2", {"d_model": 768, "d_state": 128, "expand": 2, "d_conv": 4, "headdim": 64,
                               "ngroups": 1, "chunk": 256}, 50288),
}
ARCHS = ("cpu", "imax3", "mambalaya", "marca", "h100", "h200")


def torch_worker() -> None:
    """transformers' side: ``{"dir"}`` loads a checkpoint; ``{"prompt", "new"}`` runs one timed generate and
    answers its seconds, its new ids and (``"prefill"``: a 1-token generate) the prompt's time."""
    import torch
    from hf_reference import assert_torch_path
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(int(THREADS))
    model = None
    for line in sys.stdin:
        req = json.loads(line)
        if "dir" in req:
            device = req.get("device", "cpu")
            if device == "cpu":  # (on a GPU without mamba_ssm, transformers runs the same torch path)
                assert_torch_path()
            model = AutoModelForCausalLM.from_pretrained(req["dir"], dtype=torch.float32).eval().to(device)
            answer: dict[str, Any] = {"ready": True}
        else:
            assert model is not None
            ids = torch.tensor([req["prompt"]], device=model.device)
            t = time.perf_counter()
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=req["new"], min_new_tokens=req["new"], do_sample=False,
                                     pad_token_id=0)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            answer = {"s": time.perf_counter() - t, "tokens": out[0, len(req["prompt"]):].tolist()}
        print(json.dumps(answer), flush=True)


class TorchWorker:
    def __init__(self, quiet: bool = True) -> None:
        self.quiet = quiet

    def __enter__(self) -> TorchWorker:
        env = {**os.environ, "OMP_NUM_THREADS": THREADS, "MKL_NUM_THREADS": THREADS, "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen([sys.executable, __file__, "--torch-worker"], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL if self.quiet else None)
        return self

    def ask(self, req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        time.sleep(0.05)  # our OpenMP workers stop spinning first
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the torch worker died (exit {self.proc.wait()})")
        return json.loads(line)

    def __exit__(self, *exc: object) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=120)


def _checkpoint(name: str, layers: int, directory: Path) -> tuple[Path, Path]:
    import hf_reference as hf

    family, sizes, vocab = MODELS[name]
    model = hf.make_lm(family, layers=layers, vocab=vocab, seed=0, tie=True, **sizes)
    return hf.save_lm(model, directory)


def bench(name: str, layers: int, prompt_len: int, new: int, rounds: int, backend: str = "numba") -> dict[str, Any]:
    """One model: ``rounds`` of (transformers' generate, ours), the best of each kept, and the time split.
    ``backend="triton"``: ours on the GPU (h200's schedules), transformers on the GPU too."""
    from mambalaya.exec.generate import load_generator

    prompt = np.random.default_rng(1).integers(0, MODELS[name][2], prompt_len).tolist()
    row: dict[str, Any] = {"model": name, "layers": layers, "prompt": prompt_len, "new": new, "backend": backend,
                           "threads": int(THREADS), "load_before": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as tmp, TorchWorker(quiet=backend == "numba") as torch_proc:
        config, weights = _checkpoint(name, layers, Path(tmp))
        torch_proc.ask({"dir": tmp, "device": "cuda" if backend == "triton" else "cpu"})
        t = time.perf_counter()
        gen = load_generator(config, weights, backend=backend)
        for kind in ("prefill", "decode", "head"):
            gen.stage(kind, prompt_len)
        row["setup_s"] = round(time.perf_counter() - t, 1)  # load, map and compile (Numba's disk cache after once)
        best_torch, best = float("inf"), None
        torch_tokens: list[int] = []
        for _ in range(rounds):
            r = torch_proc.ask({"prompt": prompt, "new": new})
            best_torch, torch_tokens = min(best_torch, r["s"]), r["tokens"]
            g = gen.generate(prompt, new, stop_at_eos=False)
            if best is None or g.total_s < best.total_s:
                best = g
    assert best is not None
    row.update(
        torch_s=best_torch, torch_tokens_per_s=new / best_torch,
        mambalaya_s=best.total_s, mambalaya_tokens_per_s=best.tokens_per_s,
        speedup=best_torch / best.total_s,
        prefill_ms=best.prefill_s * 1e3, decode_ms_per_token=sum(best.decode_s) / len(best.decode_s) * 1e3,
        lm_head_ms_per_token=best.lm_head_s / len(best.tokens) * 1e3,
        decode_tokens_per_s=best.decode_tokens_per_s,
        predicted_tokens_per_s=best.predicted.tokens_per_s if best.predicted else None,
        tokens_equal=best.tokens == torch_tokens,
        first_difference=next((i for i, (a, b) in enumerate(zip(best.tokens, torch_tokens, strict=False)) if a != b), None),
        load_after=round(os.getloadavg()[0], 2),
    )
    return row


def predictions(name: str, layers: int, prompt_len: int, archs: tuple[str, ...]) -> list[dict[str, Any]]:
    """Predicted tokens/s per arch from the mapper's schedules of the model's config (no weights needed)."""
    from mambalaya.exec.generate import model_cascades, predict_generation

    family, sizes, vocab = MODELS[name]
    config = {"model_type": "mamba" if family == "mamba1" else "mamba2", "hidden_size": sizes["d_model"],
              "state_size": sizes["d_state"], "num_hidden_layers": layers, "vocab_size": vocab,
              "tie_word_embeddings": True, "conv_kernel": sizes["d_conv"], "expand": sizes["expand"]}
    if family == "mamba2":
        config.update(head_dim=sizes["headdim"], num_heads=sizes["expand"] * sizes["d_model"] // sizes["headdim"],
                      n_groups=sizes["ngroups"], chunk_size=sizes["chunk"])
    cascades = model_cascades(config, prompt_len)
    # the projections: Einsums contracting a weight matrix (in_proj, x_proj, dt_proj, out_proj, the LM head)
    gemv = {f"{c.name}:{e.name}" for c in (cascades["decode"], cascades["head"]) for e in c.einsums
            if e.reduced_ranks and any(c.tensors[t].role == "weight" and len(c.shape(t)) == 2 for t in e.reads)}
    rows = []
    for arch in archs:
        t = time.perf_counter()
        p = predict_generation(config, arch, prompt_len)
        head_share = p.lm_head_s / p.token_s
        rows.append({"model": name, "arch": arch, "tokens_per_s": p.tokens_per_s, "ms_per_token": p.token_s * 1e3,
                     "decode_layer_us": p.decode_layer_s * 1e6, "lm_head_us": p.lm_head_s * 1e6,
                     "lm_head_share": head_share, "prefill_ms": p.prefill_s * 1e3,
                     "projection_share": sum(sh for e, sh in p.dominant if e in gemv),
                     "dominant": ", ".join(f"{e} {s:.0%}" for e, s in p.dominant[:3]),
                     "map_s": round(time.perf_counter() - t, 1)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _table(rows: list[dict], cols: list[str]) -> list[str]:
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
            *("| " + " | ".join(_fmt(r.get(k, "")) for k in cols) + " |" for r in rows)]


def markdown(rows: list[dict], preds: list[dict], argv: list[str]) -> str:
    cols = ["model", "layers", "prompt", "new", "torch_s", "mambalaya_s", "speedup", "torch_tokens_per_s",
            "mambalaya_tokens_per_s", "prefill_ms", "decode_ms_per_token", "lm_head_ms_per_token",
            "decode_tokens_per_s", "predicted_tokens_per_s", "tokens_equal", "setup_s", "load_before",
            "load_after"]
    pcols = ["model", "arch", "tokens_per_s", "ms_per_token", "decode_layer_us", "lm_head_us", "lm_head_share",
             "projection_share", "prefill_ms", "dominant", "map_s"]
    return "\n".join([
        f"# Whole-model generation: mambalaya generate vs transformers (batch 1, {THREADS} CPU threads)", "", "```",
        "PYTHONPATH=. .venv/bin/python " + " ".join(argv), "```", "",
        "Measured: the best of the rounds of each side, seconds for the whole generation (prompt and new tokens; "
        "`setup_s`, loading, mapping and compiling, apart). `speedup` > 1: mambalaya is faster. Ours: every mixer "
        "through the mapper's schedule (`cpu`'s on the Numba backend; `h200`'s on Triton, on the GPU), the final "
        "norm and head through the `lm-head` cascade's; transformers: `generate(do_sample=False)` on its "
        "pure-PyTorch path (on the GPU with the Triton rows), in a process of its own.",
        "", *_table(rows, cols), "",
        "Predicted from the mapper's own schedules of the same config on each architecture (`predict_generation`): "
        "a token is `layers` decode mixers and one head; `dominant`: the Einsums with the largest share of a "
        "token (`cascade:Einsum`); `projection_share`: the share of the Einsums that contract a weight matrix "
        "(in_proj, x_proj, dt_proj, out_proj and the LM head: GEMVs at batch 1).", "", *_table(preds, pcols), ""])


def main() -> None:
    if sys.argv[1:] == ["--torch-worker"]:
        torch_worker()
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", choices=list(MODELS))
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", action="append", help=f"predicted archs (default {', '.join(ARCHS)})")
    ap.add_argument("--no-measure", action="store_true", help="predictions only")
    ap.add_argument("--backend", default="numba", choices=["numba", "triton"],
                    help="ours: numba (cpu's schedules) or triton (h200's, on the GPU; transformers on the GPU too)")
    ap.add_argument("--md", help="write the results as Markdown here")
    args = ap.parse_args()
    models = args.model or list(MODELS)
    rows = []
    for m in models if not args.no_measure else []:
        rows.append(bench(m, args.layers, args.prompt, args.new, args.rounds, args.backend))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    preds = [p for m in models for p in predictions(m, args.layers, args.prompt, tuple(args.arch or ARCHS))]
    if args.md:
        Path(args.md).write_text(markdown(rows, preds, sys.argv))
    print(json.dumps({"measured": rows, "predicted": preds}, indent=2))


if __name__ == "__main__":
    main()
