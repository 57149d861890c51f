"""The Numba executor on the mapper's schedule vs the reference interpreter vs transformers' PyTorch mixers.

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
#: The architecture whose optimum (and capacity: the arena) the CPU executor runs: the CPU's own spec.
ARCH = "cpu"

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

#: Hand-picked untiled fusion groups: element-wise producers fuse into their readers (computed in registers).
FUSED = {  # (siblings that only share an input, X0 and Z, are not a legal group: they run apart)
    "mamba1": [["X0"], ["Z"], ["XC", "X"], ["DTR"], ["BM"], ["CM"], ["DT0", "DT"], ["A"], ["DA", "BX", "H", "SY", "HF"],
               ["Y", "G", "OUT"], ["CSF"]],
    "mamba2": [["Z"], ["XBC0"], ["DT0"], ["XBC1", "XBC", "DT", "A", "DA", "XDT", "ACS"], ["LM", "CB", "YD"],
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


def _run(cascade, schedule, inputs):
    from mambalaya.exec.backend import execute

    return execute(cascade, schedule, inputs, "numba", "float32")


def bench(model: str, seqlen: int, repeat: int, reference: bool, unfused: bool, arch: str = ARCH) -> dict:
    """One prefill row: ``repeat`` rounds, each a torch run then each schedule's run (best of each kept).

    ``mapper``: the mapper's optimum for ``arch``, run as its schedule (the arena the arch's capacity): what
    ``mambalaya run --arch`` gives a user. ``hand``: the hand-picked untiled groups (a comparison row; their
    whole-tensor buffers need an arena of the layer's size)."""
    from hf_reference import mixer_arrays

    from mambalaya.arch import load_arch
    from mambalaya.exec.realweights import bind_weights
    from mambalaya.exec.reference import run_reference
    from mambalaya.ir.mapping import FusionGroup, Mapping
    from mambalaya.mapper import optimal_mapping
    from mambalaya.mapper.heuristics import unfused_baseline
    from mambalaya.parse import open_cascade
    from mambalaya.schedule import lower_mapping

    family = "mamba2" if model.startswith("mamba2") else "mamba1"
    cascade = open_cascade(family, model=model, params={"seqlen": seqlen, "batch": 1})
    v = cascade.values
    values = {k: v[k] for k in MIXER_PARAMS if k in v}
    row: dict = {"model": model, "seqlen": seqlen, "threads": int(THREADS), "arch": arch, "load_before": _load()}
    mixer = _mixer(family, values)
    inputs = bind_weights(cascade, mixer_arrays(mixer))
    inputs["U"] = _input(seqlen, v["d_model"])
    a = load_arch(arch)
    t0 = time.perf_counter()
    mapper = optimal_mapping(cascade, a).mapping
    row["map_s"] = round(time.perf_counter() - t0, 2)
    big = a.with_overrides(fusion_buffer_bytes=1 << 34)  # room for the hand mapping's whole-tensor buffers
    hand = Mapping(tuple(FusionGroup(tuple(g)) for g in FUSED[family]), cascade.name)
    schedules = {"mapper": lower_mapping(cascade, mapper, a), "hand": lower_mapping(cascade, hand, big)}
    if unfused:
        schedules["unfused"] = lower_mapping(cascade, unfused_baseline(cascade, a), a)
    with tempfile.TemporaryDirectory() as tmp, TorchWorker() as torch_proc:
        out = str(Path(tmp) / "torch_out.npy")
        torch_proc.ask({"family": family, "values": values, "seqlen": seqlen, "out": out})
        want = np.load(out)
        for label, sched in schedules.items():
            first = _run(cascade, sched, inputs)  # warm-up: compiles (or loads the disk cache)
            row[f"{label}_compile_s"] = round(first.compile_s, 2)
            row[f"{label}_traffic_MB"] = round(first.traffic_bytes / 1e6, 2)
            row[f"{label}_groups"] = len(sched.groups)
            got = first.outputs["OUT"]
            row[f"{label}_max_rel_err_vs_torch"] = float(np.abs(got - want).max() / np.abs(want).max())
        best = {label: float("inf") for label in ["torch", *schedules]}
        groups = None
        for _ in range(repeat):
            best["torch"] = min(best["torch"], torch_proc.time())
            for label, sched in schedules.items():
                r = _run(cascade, sched, inputs)
                best[label] = min(best[label], r.run_s)
                if label == "mapper":
                    groups = r.group_s if groups is None else [min(x, y) for x, y in zip(groups, r.group_s, strict=True)]
    for label, seconds in best.items():
        row[f"{label}_s"] = seconds
    row["mapper_group_ms"] = {"+".join(g.einsums): round(t * 1e3, 1)
                              for g, t in zip(schedules["mapper"].groups, groups or [], strict=True)}
    if reference:
        t = time.perf_counter()
        run_reference(cascade, inputs, "float32", keep="outputs")
        row["reference_s"] = time.perf_counter() - t
    row["torch_over_mapper"] = row["torch_s"] / row["mapper_s"]
    row["torch_over_hand"] = row["torch_s"] / row["hand_s"]
    if reference:
        row["reference_over_mapper"] = row["reference_s"] / row["mapper_s"]
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

    from mambalaya.exec.realweights import bind_weights
    from mambalaya.mapper import optimal_mapping
    from mambalaya.parse import open_cascade
    from mambalaya.schedule import lower_mapping

    family = "mamba2" if model.startswith("mamba2") else "mamba1"
    cascade = open_cascade(f"{family}-decode", model=model, params={"batch": 1})
    v = cascade.values
    full = open_cascade(family, model=model).values
    values = {k: full[k] for k in MIXER_PARAMS if k in full}
    row: dict = {"model": model, "layers": layers, "load_before": _load()}
    mixer = _mixer(family, values)
    weights = bind_weights(cascade, mixer_arrays(mixer))
    schedule = lower_mapping(cascade, optimal_mapping(cascade, ARCH).mapping, ARCH)
    s_in, s_out = ("H0", "H1") if family == "mamba1" else ("S0", "S1")
    rng = np.random.default_rng(0)
    states = [{"CS0": np.zeros(cascade.shape("CS0"), np.float32), s_in: np.zeros(cascade.shape(s_in), np.float32)}
              for _ in range(layers)]

    def token() -> float:
        h = rng.standard_normal((1, 1, v["d_model"])).astype(np.float32)
        compile_s = 0.0
        for st in states:
            x = h / np.sqrt(np.mean(h * h) + np.float32(1e-5))
            r = _run(cascade, schedule, {**weights, "U": x, **st})
            compile_s += r.compile_s
            st["CS0"], st[s_in] = r.outputs["CS1"], r.outputs[s_out]
            h = h + r.outputs["OUT"].reshape(1, 1, -1)
        return compile_s

    row["decode_compile_s"] = round(token(), 2)
    best_torch = best = float("inf")
    with TorchWorker() as torch_proc:
        torch_proc.ask({"family": family, "values": values, "layers": layers})
        for _ in range(tokens):
            best_torch = min(best_torch, torch_proc.time())
            t = time.perf_counter()
            token()
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
    cols = ["model", "seqlen", "torch_s", "mapper_s", "hand_s", "reference_s", "torch_over_mapper", "torch_over_hand",
            "reference_over_mapper", "map_s", "mapper_groups", "mapper_compile_s", "mapper_traffic_MB",
            "mapper_max_rel_err_vs_torch", "load_before", "load_after"]
    if unfused:
        cols.insert(5, "unfused_s")
    lines = [f"# Numba executor vs reference vs transformers (batch 1, {THREADS} threads)", "", "```",
             "PYTHONPATH=. .venv/bin/python " + " ".join(argv), "```", "",
             f"Times in seconds, best of the warm runs (compile excluded: `*_compile_s` is the first run's compile "
             f"or disk-cache load). `mapper`: the mapper's optimum for `{ARCH}`, run as its schedule in an arena of "
             f"that arch's capacity (what `mambalaya run --arch {ARCH}` runs); `hand`: hand-picked untiled fusion "
             "groups (a comparison row, their buffers whole tensors). `torch_over_*` > 1 means the executor is "
             "faster. PyTorch (transformers' `MambaMixer` / `Mamba2Mixer` on their pure-PyTorch paths) runs in a "
             "process of its own with the same thread count, its runs alternating with the executor's (the "
             "reference runs once). `load_before` / `load_after`: the 1-minute load average around the row (the "
             f"machine has {os.cpu_count()} cores; a load above {THREADS} means others were running too).", "",
             *_table(rows, cols)]
    for r in rows:  # where the mapper's layer spends its time
        groups = r.get("mapper_group_ms", {})
        lines += ["", f"Groups of the mapper's schedule, {r['model']} at seqlen {r['seqlen']} (ms, best run):", "",
                  *_table([{"group": g, "ms": ms} for g, ms in groups.items()], ["group", "ms"])]
    if drows:
        dcols = ["model", "layers", "torch_ms_per_token", "ms_per_token", "torch_tokens_per_s", "tokens_per_s",
                 "fused_over_torch_tokens_per_s", "decode_compile_s", "load_before", "load_after"]
        lines += ["", f"Decode: {layers} decode steps in sequence per token, batch 1, the best token of the rounds "
                  f"(the mapper's {ARCH} schedule of each layer's decode cascade; torch: the mixer's single-token "
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
    ap.add_argument("--arch", default=ARCH, help=f"whose optimum the mapper row runs (default {ARCH})")
    args = ap.parse_args()
    models = args.model or ["mamba-130m", "mamba2-130m"]
    rows = []
    for m in models:
        for s in args.seqlen or [2048, 4096]:
            rows.append(bench(m, s, args.repeat, s <= args.reference_max_seqlen, args.unfused, args.arch))
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
