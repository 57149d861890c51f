"""Fused Numba executor vs the reference interpreter vs transformers' pure-PyTorch mixers.

One Mamba layer at batch 1, same thread count for everyone (torch.set_num_threads,
NUMBA_NUM_THREADS), random-init layers from ``tests/hf_reference.py`` so the
numbers are real activations (not random-normal inputs whose exp overflows)::

    PYTHONPATH=. python benchmarks/bench_executor.py --md benchmarks/results/executor.md

Times are the best of ``--repeat`` warm runs (compile excluded and reported apart);
the reference runs once (it is slow). Prints a table and, with ``--json``, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

THREADS = os.environ.setdefault("NUMBA_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from hf_reference import make_mamba1, make_mamba2, mixer_arrays, mixer_forward  # noqa: E402

from mambalaya.exec.fused import run_fused  # noqa: E402
from mambalaya.exec.realweights import bind_weights  # noqa: E402
from mambalaya.exec.reference import run_reference  # noqa: E402
from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping  # noqa: E402
from mambalaya.parse import open_cascade  # noqa: E402

#: Hand-picked untiled fusion groups: element-wise producers fuse into their readers (computed in registers).
FUSED = {
    "mamba1": [["X0", "Z"], ["XC", "X"], ["DTR", "BM", "CM"], ["DT0", "DT"], ["A"], ["DA", "BX", "H", "SY", "HF"],
               ["Y", "G", "OUT"], ["CSF"]],
    "mamba2": [["Z", "XBC0", "DT0"], ["XBC1", "XBC", "DT", "A", "DA", "XDT", "ACS"], ["LM", "CB", "YD"],
               ["DS", "ST", "S"], ["YO", "Y", "YG", "NV", "YN", "OUT"], ["SF"], ["CSF"]],
}


def _mixer(family: str, v: dict):
    if family == "mamba1":
        return make_mamba1(d_model=v["d_model"], d_state=v["d_state"], d_conv=v["d_conv"], expand=v["expand"],
                           dt_rank=v["dt_rank"])
    return make_mamba2(d_model=v["d_model"], d_state=v["d_state"], d_conv=v["d_conv"], expand=v["expand"],
                       headdim=v["headdim"], ngroups=v["ngroups"], chunk=v["chunk"], eps=v["eps"])


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bench(model: str, seqlen: int, repeat: int, reference: bool, unfused: bool) -> dict:
    family = "mamba2" if model.startswith("mamba2") else "mamba1"
    cascade = open_cascade(family, model=model, params={"seqlen": seqlen, "batch": 1})
    v = cascade.values
    mixer = _mixer(family, v)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, seqlen, v["d_model"])).astype(np.float32)
    inputs = bind_weights(cascade, mixer_arrays(mixer))
    inputs["U"] = x
    row: dict = {"model": model, "seqlen": seqlen, "threads": int(THREADS)}

    torch.set_num_threads(int(THREADS))
    want = mixer_forward(mixer, x)
    row["torch_s"] = _best(lambda: mixer_forward(mixer, x), repeat)

    mappings = {"fused": Mapping(tuple(FusionGroup(tuple(g)) for g in FUSED[family]), cascade.name)}
    if unfused:
        mappings["unfused"] = unfused_mapping(cascade)
    for label, mapping in mappings.items():
        first = run_fused(cascade, mapping, inputs, "float32")  # warm-up: compiles (or loads the disk cache)
        got = first.outputs["OUT"]
        row[f"{label}_compile_s"] = round(first.compile_s, 2)
        # timed without the traffic marks (count=False): the bytes come from the first, counted run
        row[f"{label}_s"] = _best(lambda m=mapping: run_fused(cascade, m, inputs, "float32", count=False), repeat)
        row[f"{label}_traffic_MB"] = round(first.traffic_bytes / 1e6, 2)
        row[f"{label}_max_rel_err_vs_torch"] = float(np.abs(got - want).max() / np.abs(want).max())
    if reference:
        t = time.perf_counter()
        run_reference(cascade, inputs, "float32", keep="outputs")
        row["reference_s"] = time.perf_counter() - t
    row["torch_over_fused"] = row["torch_s"] / row["fused_s"]
    if reference:
        row["reference_over_fused"] = row["reference_s"] / row["fused_s"]
    return row


def bench_decode(model: str, layers: int, tokens: int) -> dict:
    """Tokens per second of ``layers`` decode-step cascades in sequence (one fused group each), batch 1."""
    family = "mamba2" if model.startswith("mamba2") else "mamba1"
    cascade = open_cascade(f"{family}-decode", model=model, params={"batch": 1})
    v = cascade.values
    mixer = _mixer(family, {**open_cascade(family, model=model).values})
    weights = bind_weights(cascade, mixer_arrays(mixer))
    mapping = Mapping((FusionGroup(cascade.einsum_names),), cascade.name)
    s_in, s_out = ("H0", "H1") if family == "mamba1" else ("S0", "S1")
    rng = np.random.default_rng(0)
    states = [{"CS0": np.zeros(cascade.shape("CS0"), np.float32), s_in: np.zeros(cascade.shape(s_in), np.float32)}
              for _ in range(layers)]

    def token(count: bool) -> float:
        h = rng.standard_normal((1, 1, v["d_model"])).astype(np.float32)
        compile_s = 0.0
        for st in states:
            r = run_fused(cascade, mapping, {**weights, "U": h, **st}, "float32", count=count)
            compile_s += r.compile_s
            st["CS0"], st[s_in] = r.outputs["CS1"], r.outputs[s_out]
            h = r.outputs["OUT"].reshape(1, 1, -1)
        return compile_s

    compile_s = token(True)
    t = time.perf_counter()
    for _ in range(tokens):
        token(False)
    per = (time.perf_counter() - t) / tokens
    return {"model": model, "layers": layers, "decode_compile_s": round(compile_s, 2), "ms_per_token": per * 1e3,
            "tokens_per_s": 1.0 / per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="mamba-130m, mamba2-130m, ... (repeatable)")
    ap.add_argument("--seqlen", type=int, action="append", help="tokens (repeatable; default 2048 and 4096)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reference-max-seqlen", type=int, default=2048,
                    help="run the (slow, once) reference interpreter up to this seqlen (0: never)")
    ap.add_argument("--unfused", action="store_true", help="also time the all-unfused mapping")
    ap.add_argument("--decode-tokens", type=int, default=20, help="decode tokens timed per model (0: skip)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--md", help="also write a Markdown table to this file")
    args = ap.parse_args()
    models = args.model or ["mamba-130m", "mamba2-130m"]
    rows = []
    for m in models:
        for s in args.seqlen or [2048, 4096]:
            rows.append(bench(m, s, args.repeat, s <= args.reference_max_seqlen, args.unfused))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    drows = [bench_decode(m, args.layers, args.decode_tokens) for m in models] if args.decode_tokens else []
    if args.md:
        cols = ["model", "seqlen", "torch_s", "fused_s", "reference_s", "torch_over_fused",
                "reference_over_fused", "fused_compile_s", "fused_traffic_MB", "fused_max_rel_err_vs_torch"]
        if args.unfused:
            cols.insert(4, "unfused_s")
        lines = ["# Fused executor vs reference vs transformers (batch 1, "
                 f"{THREADS} threads)", "", "```", "PYTHONPATH=. python " + " ".join(sys.argv), "```", "",
                 "Times in seconds, best of the warm runs (compile excluded: `fused_compile_s` is the first run's "
                 "compile or disk-cache load); `torch_over_fused` > 1 means the fused executor is faster.", "",
                 "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in rows:
            lines.append("| " + " | ".join(f"{r.get(k, ''):.4g}" if isinstance(r.get(k), float)
                                           else str(r.get(k, "")) for k in cols) + " |")
        if drows:
            dcols = ["model", "layers", "ms_per_token", "tokens_per_s", "decode_compile_s"]
            lines += ["", f"Decode: {args.layers} decode-step cascades in sequence per token (fused, one group "
                      "per layer, count=False).", "", "| " + " | ".join(dcols) + " |", "|" + "---|" * len(dcols)]
            for r in drows:
                lines.append("| " + " | ".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k])
                                               for k in dcols) + " |")
        Path(args.md).write_text("\n".join(lines) + "\n")
    if args.json:
        print(json.dumps({"prefill": rows, "decode": drows}, indent=2))
        return
    for r in [*rows, *drows]:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
