"""Fused Numba executor vs the reference interpreter vs transformers' pure-PyTorch mixers.

One Mamba layer at batch 1, same thread count for everyone (torch.set_num_threads,
NUMBA_NUM_THREADS), random-init layers from ``tests/hf_reference.py`` so the
numbers are real activations (not random-normal inputs whose exp overflows)::

    PYTHONPATH=. python benchmarks/bench_executor.py --md benchmarks/results/executor.md

PyTorch is timed in a process of its own (``--torch-worker``), with the same thread count:
timed in the process that had run the Numba kernels, the mamba-130m layer at seqlen 2048 took
16 s instead of 0.55 s on two cores. Its sequential scan runs thousands of small parallel
regions, so any other work on the cores (Numba's spinning OpenMP workers, other processes)
slows it many times over. Its runs alternate with the fused executor's (one torch run, one
fused run, ``--repeat`` rounds), so both see the same machine load; the 1-minute load average
is recorded with each row, since other work on the machine inflates every column.

Times are the best of the ``--repeat`` warm runs (compile excluded and reported apart);
the reference runs once (it is slow). Prints a table and, with ``--json``, one JSON object.
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

#: Hand-picked untiled fusion groups: element-wise producers fuse into their readers (computed in registers).
FUSED = {
    "mamba1": [["X0", "Z"], ["XC", "X"], ["DTR", "BM", "CM"], ["DT0", "DT"], ["A"], ["DA", "BX", "H", "SY", "HF"],
               ["Y", "G", "OUT"], ["CSF"]],
    "mamba2": [["Z", "XBC0", "DT0"], ["XBC1", "XBC", "DT", "A", "DA", "XDT", "ACS"], ["LM", "CB", "YD"],
               ["DS", "ST", "S"], ["YO", "Y", "YG", "NV", "YN", "OUT"], ["SF"], ["CSF"]],
}
#: The cascade params the torch worker needs to build the same layer.
MIXER_PARAMS = ("d_model", "d_state", "d_conv", "expand", "dt_rank", "headdim", "ngroups", "chunk", "eps")


def _mixer(family: str, v: dict):
    from hf_reference import make_mamba1, make_mamba2

    if family == "mamba1":
        return make_mamba1(d_model=v["d_model"], d_state=v["d_state"], d_conv=v["d_conv"], expand=v["expand"],
                           dt_rank=v["dt_rank"])
    return make_mamba2(d_model=v["d_model"], d_state=v["d_state"], d_conv=v["d_conv"], expand=v["expand"],
                       headdim=v["headdim"], ngroups=v["ngroups"], chunk=v["chunk"], eps=v["eps"])


def _input(seqlen: int, d_model: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, seqlen, d_model)).astype(np.float32)


def _load() -> float:
    """The 1-minute load average (other processes on the machine slow every column)."""
    return round(os.getloadavg()[0], 2)


def torch_worker() -> None:
    """PyTorch's side, in a process of its own (see :class:`TorchWorker`): one JSON request per stdin line.

    ``{"family", "values", "seqlen", "out"}`` builds the layer, runs it once and saves its output to ``out``;
    ``{"family", "values", "layers"}`` sets up ``layers`` single-token decode steps; ``"time"`` then runs one
    prefill (or one decode token through all the layers) and answers its seconds.
    """
    import torch
    from hf_reference import assert_torch_path, mixer_forward
    from transformers import DynamicCache

    torch.set_num_threads(int(THREADS))
    assert_torch_path()
    rng = np.random.default_rng(0)
    run = None
    for line in sys.stdin:
        req = json.loads(line)
        if req == "time":
            t = time.perf_counter()
            run()
            answer: dict[str, Any] = {"s": time.perf_counter() - t}
        else:
            mixer = _mixer(req["family"], req["values"])
            d_model = req["values"]["d_model"]
            if "layers" in req:
                cache = DynamicCache(config=mixer.hf_config)
                with torch.no_grad():
                    mixer(torch.from_numpy(_input(1, d_model)), cache=cache)  # fills the cache

                def run(mixer=mixer, cache=cache, layers=req["layers"], d_model=d_model) -> None:
                    h = torch.from_numpy(rng.standard_normal((1, 1, d_model)).astype(np.float32))
                    with torch.no_grad():
                        for _ in range(layers):  # one layer's weights and cache stand in for each layer
                            h = h + mixer(h * torch.rsqrt(h.pow(2).mean() + 1e-5), cache=cache)

                run()
            else:
                x = _input(req["seqlen"], d_model)
                np.save(req["out"], mixer_forward(mixer, x))

                def run(mixer=mixer, x=x) -> None:
                    mixer_forward(mixer, x)
            answer = {"ready": True}
        print(json.dumps(answer), flush=True)


class TorchWorker:
    """A :func:`torch_worker` process with the same thread count, asked for one timed run at a time, so that
    its runs alternate with the fused executor's and both see the same machine load."""

    def __enter__(self) -> TorchWorker:
        env = {**os.environ, "OMP_NUM_THREADS": THREADS, "MKL_NUM_THREADS": THREADS, "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen([sys.executable, __file__, "--torch-worker"], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return self

    def ask(self, req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the torch worker died (exit {self.proc.wait()})")
        return json.loads(line)

    def time(self) -> float:
        time.sleep(0.05)  # the fused run's OpenMP workers stop spinning first
        return float(self.ask("time")["s"])

    def __exit__(self, *exc: object) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def bench(model: str, seqlen: int, repeat: int, reference: bool, unfused: bool) -> dict:
    """One prefill row: ``repeat`` rounds, each a torch run then a fused run (best of each kept)."""
    from hf_reference import mixer_arrays

    from mambalaya.exec.fused import run_fused
    from mambalaya.exec.realweights import bind_weights
    from mambalaya.exec.reference import run_reference
    from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping
    from mambalaya.parse import open_cascade

    family = "mamba2" if model.startswith("mamba2") else "mamba1"
    cascade = open_cascade(family, model=model, params={"seqlen": seqlen, "batch": 1})
    v = cascade.values
    values = {k: v[k] for k in MIXER_PARAMS if k in v}
    row: dict = {"model": model, "seqlen": seqlen, "threads": int(THREADS), "load_before": _load()}
    mixer = _mixer(family, values)
    inputs = bind_weights(cascade, mixer_arrays(mixer))
    inputs["U"] = _input(seqlen, v["d_model"])
    mappings = {"fused": Mapping(tuple(FusionGroup(tuple(g)) for g in FUSED[family]), cascade.name)}
    if unfused:
        mappings["unfused"] = unfused_mapping(cascade)
    with tempfile.TemporaryDirectory() as tmp, TorchWorker() as torch_proc:
        out = str(Path(tmp) / "torch_out.npy")
        torch_proc.ask({"family": family, "values": values, "seqlen": seqlen, "out": out})
        want = np.load(out)
        first = {}
        for label, mapping in mappings.items():
            first[label] = run_fused(cascade, mapping, inputs, "float32")  # warm-up: compiles (or loads the cache)
            row[f"{label}_compile_s"] = round(first[label].compile_s, 2)
            row[f"{label}_traffic_MB"] = round(first[label].traffic_bytes / 1e6, 2)
            got = first[label].outputs["OUT"]
            row[f"{label}_max_rel_err_vs_torch"] = float(np.abs(got - want).max() / np.abs(want).max())
        best = {label: float("inf") for label in ["torch", *mappings]}
        groups = None
        for _ in range(repeat):
            best["torch"] = min(best["torch"], torch_proc.time())
            for label, mapping in mappings.items():
                # timed without the traffic marks (count=False): the bytes come from the first, counted run
                r = run_fused(cascade, mapping, inputs, "float32", count=False)
                best[label] = min(best[label], r.run_s)
                if label == "fused":
                    groups = r.per_group_s if groups is None else [min(a, b) for a, b in zip(groups, r.per_group_s,
                                                                                              strict=True)]
    for label, seconds in best.items():
        row[f"{label}_s"] = seconds
    row["fused_group_ms"] = {"+".join(g.einsums): round(t * 1e3, 1)
                             for g, t in zip(mappings["fused"].groups, groups or [], strict=True)}
    if reference:
        t = time.perf_counter()
        run_reference(cascade, inputs, "float32", keep="outputs")
        row["reference_s"] = time.perf_counter() - t
    row["torch_over_fused"] = row["torch_s"] / row["fused_s"]
    if reference:
        row["reference_over_fused"] = row["reference_s"] / row["fused_s"]
    row["load_after"] = _load()
    return row


def bench_decode(model: str, layers: int, tokens: int) -> dict:
    """Tokens per second of ``layers`` decode-step cascades in sequence (one fused group each), batch 1,
    beside transformers' single-token path for the same ``layers`` mixer steps: ``tokens`` rounds of one
    torch token then one fused token, each side's best token kept.

    Each layer adds its output to a residual stream and reads it RMS-normalised, as the model's blocks
    do: a bare chain of mixers shrinks the activations to subnormal numbers within a few layers, and
    subnormal arithmetic (a microcode assist per operation) would be timed instead of the layers.
    """
    from hf_reference import mixer_arrays

    from mambalaya.exec.fused import run_fused
    from mambalaya.exec.realweights import bind_weights
    from mambalaya.ir.mapping import FusionGroup, Mapping
    from mambalaya.parse import open_cascade

    family = "mamba2" if model.startswith("mamba2") else "mamba1"
    cascade = open_cascade(f"{family}-decode", model=model, params={"batch": 1})
    v = cascade.values
    full = open_cascade(family, model=model).values
    values = {k: full[k] for k in MIXER_PARAMS if k in full}
    row: dict = {"model": model, "layers": layers, "load_before": _load()}
    mixer = _mixer(family, values)
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
            x = h / np.sqrt(np.mean(h * h) + np.float32(1e-5))
            r = run_fused(cascade, mapping, {**weights, "U": x, **st}, "float32", count=count)
            compile_s += r.compile_s
            st["CS0"], st[s_in] = r.outputs["CS1"], r.outputs[s_out]
            h = h + r.outputs["OUT"].reshape(1, 1, -1)
        return compile_s

    row["decode_compile_s"] = round(token(True), 2)
    best_torch = best = float("inf")
    with TorchWorker() as torch_proc:
        torch_proc.ask({"family": family, "values": values, "layers": layers})
        for _ in range(tokens):
            best_torch = min(best_torch, torch_proc.time())
            t = time.perf_counter()
            token(False)
            best = min(best, time.perf_counter() - t)
    row.update(torch_ms_per_token=best_torch * 1e3, torch_tokens_per_s=1.0 / best_torch, ms_per_token=best * 1e3,
               tokens_per_s=1.0 / best, load_after=_load())
    row["fused_over_torch_tokens_per_s"] = row["tokens_per_s"] / row["torch_tokens_per_s"]
    return row


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _table(rows: list[dict], cols: list[str]) -> list[str]:
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
            *("| " + " | ".join(_fmt(r.get(k, "")) for k in cols) + " |" for r in rows)]


def markdown(rows: list[dict], drows: list[dict], argv: list[str], unfused: bool, layers: int) -> str:
    """The results file: prefill table, per-group fused times, decode table."""
    cols = ["model", "seqlen", "torch_s", "fused_s", "reference_s", "torch_over_fused", "reference_over_fused",
            "fused_compile_s", "fused_traffic_MB", "fused_max_rel_err_vs_torch", "load_before", "load_after"]
    if unfused:
        cols.insert(4, "unfused_s")
    lines = [f"# Fused executor vs reference vs transformers (batch 1, {THREADS} threads)", "", "```",
             "PYTHONPATH=. .venv/bin/python " + " ".join(argv), "```", "",
             "Times in seconds, best of the warm runs (compile excluded: `fused_compile_s` is the first run's "
             "compile or disk-cache load). `torch_over_fused` and `reference_over_fused` > 1 mean the fused "
             "executor is faster. PyTorch (transformers' `MambaMixer` / `Mamba2Mixer` on their pure-PyTorch "
             "paths) runs in a process of its own with the same thread count, its runs alternating with the "
             "fused executor's (the reference runs once). `load_before` / `load_after`: "
             "the machine's 1-minute load average around the row (the machine has "
             f"{os.cpu_count()} cores; a load above {THREADS} means others were running too).", "",
             *_table(rows, cols)]
    for r in rows:  # where a fused layer spends its time: each model's rows, one table per seqlen
        groups = r.get("fused_group_ms", {})
        lines += ["", f"Fused groups of {r['model']} at seqlen {r['seqlen']} (ms, the best run of each group):", "",
                  *_table([{"group": g, "ms": ms} for g, ms in groups.items()], ["group", "ms"])]
    if drows:
        dcols = ["model", "layers", "torch_ms_per_token", "ms_per_token", "torch_tokens_per_s", "tokens_per_s",
                 "fused_over_torch_tokens_per_s", "decode_compile_s", "load_before", "load_after"]
        lines += ["", f"Decode: {layers} decode steps in sequence per token, batch 1, the best token of the rounds "
                  "(fused: one group per layer's decode cascade, count=False; torch: the mixer's single-token "
                  "cache path); each layer reads the RMS-normalised residual stream and adds its output to it, "
                  "as the model's blocks do.", "",
                  *_table(drows, dcols)]
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:] == ["--torch-worker"]:
        torch_worker()
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="mamba-130m, mamba2-130m, ... (repeatable)")
    ap.add_argument("--seqlen", type=int, action="append", help="tokens (repeatable; default 2048 and 4096)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of one torch run and one fused run (best kept)")
    ap.add_argument("--reference-max-seqlen", type=int, default=2048,
                    help="run the (slow, once) reference interpreter up to this seqlen (0: never)")
    ap.add_argument("--unfused", action="store_true", help="also time the all-unfused mapping")
    ap.add_argument("--decode-tokens", type=int, default=20,
                    help="decode rounds per model, one torch token and one fused token each (0: skip)")
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
    drows = []
    for m in models if args.decode_tokens else []:
        drows.append(bench_decode(m, args.layers, args.decode_tokens))
        print(json.dumps(drows[-1]), file=sys.stderr, flush=True)
    if args.md:
        Path(args.md).write_text(markdown(rows, drows, sys.argv, args.unfused, args.layers))
    if args.json:
        print(json.dumps({"prefill": rows, "decode": drows}, indent=2))
        return
    for r in [*rows, *drows]:
        print(" ".join(f"{k}={_fmt(v)}" for k, v in r.items() if not isinstance(v, dict)))


if __name__ == "__main__":
    main()
