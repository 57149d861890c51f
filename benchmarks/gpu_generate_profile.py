"""Where a GPU token goes: ``generate`` on the Triton backend, each stage's run split into its kernels and the rest.

For a random-initialised 130m model of each family (the published shapes, ``--layers`` blocks), the mapper's
``--arch`` schedules compiled for Triton: one generation timed as ``generate`` runs it, then per stage (decode,
head) the wall time of one ``run`` against the sum of its kernels' times (CUDA events, median of ``--repeat``
launches each), so what is host work (inputs sent, outputs fetched, per-group set-up and synchronisation) and
what is the kernels shows::

    python3 benchmarks/gpu_generate_profile.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from mambalaya.exec.generate import load_generator  # noqa: E402
from mambalaya.exec.random_model import write_random_model  # noqa: E402


def stage_split(gen, kind: str, inputs: dict[str, np.ndarray], repeat: int) -> dict:
    """One stage's run: its wall seconds (median of ``repeat``) counted and not, and each group's kernel
    seconds."""
    stage = gen.stage(kind)
    walls: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeat):
        for count in (True, False):
            t = time.perf_counter()
            gen.engine.run(stage.program, inputs, count=count)
            walls[count].append(time.perf_counter() - t)
    timed = gen.engine.run(stage.program, inputs, repeat=repeat)
    kernels = [statistics.median(g["times_s"]) for g in timed.extra["groups"] if "times_s" in g]
    return {"run_counted_s": statistics.median(walls[True]), "run_s": statistics.median(walls[False]),
            "kernels_s": sum(kernels), "groups": len(kernels),
            "per_group_us": [round(k * 1e6, 1) for k in kernels],
            "programs": [g.get("programs") for g in timed.extra["groups"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", choices=["mamba-130m", "mamba2-130m"])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--arch", default="h200")
    ap.add_argument("--vocab", type=int, help="a smaller vocabulary than the published (a smoke run)")
    ap.add_argument("--json")
    args = ap.parse_args()
    out = []
    for model in args.model or ["mamba-130m", "mamba2-130m"]:
        with tempfile.TemporaryDirectory() as tmp:
            cfg, weights = write_random_model(tmp, model, layers=args.layers,
                                             **({"vocab_size": args.vocab} if args.vocab else {}))
            gen = load_generator(cfg, weights, args.arch, backend="triton")
            prompt = [int(i) for i in np.random.default_rng(0).integers(5, min(1000, gen.model.vocab), args.prompt)]
            gen.generate(prompt, 2, stop_at_eos=False)  # stages mapped, compiled and warmed
            t = time.perf_counter()
            g = gen.generate(prompt, args.new, stop_at_eos=False)
            wall = time.perf_counter() - t
            decode = gen.stage("decode")
            bound = gen._layer_inputs("decode", decode)[0]
            d = decode.cascade
            acts = {n: np.random.default_rng(1).standard_normal(d.shape(n)).astype(np.float32)
                    for n, x in d.tensors.items() if x.role == "input" and x.source is None}
            head = gen.stage("head")
            (hb,) = gen._layer_inputs("head", head)
            hin = {"U": np.random.default_rng(2).standard_normal(head.cascade.shape("U")).astype(np.float32)}
            row = {"model": model, "layers": args.layers, "arch": args.arch,
                   "tokens_per_s": len(g.tokens) / wall, "prefill_s": g.prefill_s,
                   "decode_ms_per_token": 1e3 * statistics.median(g.decode_s) if g.decode_s else None,
                   "lm_head_ms_per_token": 1e3 * g.lm_head_s / max(1, len(g.tokens)),
                   "decode_layer": stage_split(gen, "decode", {**bound, **acts}, args.repeat),
                   "head": stage_split(gen, "head", {**hb, **hin}, args.repeat)}
            print(json.dumps(row), flush=True)
            out.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
