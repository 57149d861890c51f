"""Generated Triton kernels on a GPU: measured time per group and per layer next to the h200 cost model.

    python benchmarks/bench_gpu.py --map-only MAPS_DIR [--quick] [--first N]     # on a CPU: the mapper's schedules
    python benchmarks/bench_gpu.py OUT_DIR --mappings MAPS_DIR [--quick] [--start-at I] [--first N] [--mamba-ssm SRC_DIR]
    python benchmarks/bench_gpu.py --table OUT_DIR/gpu.json [--repredict] --md benchmarks/results/gpu.md
    TRITON_INTERPRET=1 python benchmarks/bench_gpu.py /tmp/x --dry     # CPU self-test, tiny shapes

Per point (model size, batch, seqlen) it runs, in one process:

* the Mamba-2 layer through the Triton backend with a GPU-shaped fused mapping
  (:func:`mamba2_gpu_mapping`: in_proj GEMMs, conv+SiLU, dt chain, chunk cumsum,
  intra-chunk (LM+YD), chunk states (DS+ST), state recurrence over chunks, state
  output, gate+RMSNorm, out_proj) and, at the first point of each model, the
  all-unfused mapping; per group the median of CUDA-graph replays and the cost
  model's ``evaluate(cascade, 'h200', mapping)`` latency of that group;
* the same layer as plain PyTorch ops (the unfused eager path: the
  ``ssd_minimal_discrete`` algorithm), checked against the generated outputs;
* the SSD core three ways: generated kernels (ACS, CB, LM YD, DS ST, S, SF, YO: what
  mamba_chunk_scan_combined computes, but for its skip term D*x, which the generated layer adds in
  its gate group), plain torch, and
  ``mamba_ssm``'s ``mamba_chunk_scan_combined`` (its Triton kernels), when
  ``--mamba-ssm`` points at an unpacked mamba_ssm source tree (imported without
  its CUDA extensions, which the SSD path does not need).

Mamba-1 runs through the generated kernels only (unfused and fused), against the model.
Results go to OUT_DIR/gpu.json after every point, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MAMBA2_POINTS = [
    ("mamba2-370m", 1, 4096),
    ("mamba2-370m", 1, 16384),
    ("mamba2-370m", 8, 4096),
    ("mamba2-370m", 1, 65536),
    ("mamba2-2.7b", 1, 4096),
    ("mamba2-2.7b", 1, 16384),
]
MAMBA1_POINTS = [("mamba-370m", 1, 4096)]
SSD_GROUPS = ("ACS", "LM", "YD", "CB", "DS", "ST", "S", "SF", "YO")


def mamba2_gpu_mapping(cascade: Any) -> Any:
    """A fused Mamba-2 mapping shaped for a GPU (every group keeps thousands of independent programs)."""
    from mambalaya.ir.mapping import FusionGroup, Mapping

    groups = [["Z"], ["XBC0"], ["DT0"], ["XBC1", "XBC"], ["DT", "A", "DA", "XDT"], ["ACS"], ["CB"],
              ["LM", "YD"], ["DS", "ST"], ["S"], ["SF"], ["YO"], ["Y", "YG", "NV", "YN"], ["OUT"], ["CSF"]]
    return Mapping(tuple(FusionGroup(tuple(g), cascade.einsum(g[0]).ranks) for g in groups), cascade.name).validate(
        cascade)


def mamba1_gpu_mapping(cascade: Any) -> Any:
    """A fused Mamba-1 mapping: the dt chain, discretisation, scan, readout and gate in one kernel."""
    from mambalaya.ir.mapping import FusionGroup, Mapping

    groups = [["X0"], ["Z"], ["XC", "X"], ["DTR"], ["BM"], ["CM"],
              ["DT0", "DT", "A", "DA", "BX", "H", "SY", "Y", "G", "HF"], ["OUT"], ["CSF"]]
    return Mapping(tuple(FusionGroup(tuple(g), cascade.einsum(g[0]).ranks) for g in groups), cascade.name).validate(
        cascade)


def tiled(cascade: Any, mapping: Any) -> Any:
    """A hand mapping's groups at the tiles the cost model's tile search gives each (the hand choice is the
    grouping; the tiles, hence the program grid, are the tool's)."""
    from mambalaya.arch import load_arch
    from mambalaya.cost.context import CostContext
    from mambalaya.ir.mapping import Mapping
    from mambalaya.mapper.tiling import Tiled, best_tiling

    ctx = CostContext(cascade, load_arch("h200"))
    groups = []
    for g in mapping.groups:
        got = best_tiling(ctx, g.einsums)
        if isinstance(got, Tiled):
            groups.append(got.group)
            continue
        print(f"  hand group {' '.join(g.einsums)}: no tiling fits ({got.reason}); its Einsums run alone", flush=True)
        for e in g.einsums:
            one = best_tiling(ctx, (e,))
            if not isinstance(one, Tiled):
                raise ValueError(f"{e} has no tiling on h200: {one.reason}")
            groups.append(one.group)
    return Mapping(tuple(groups), cascade.name).validate(cascade)


def point_name(model: str, batch: int, seqlen: int) -> str:
    return f"{model}_b{batch}_L{seqlen}"


def point_mappings(cascade: Any, family: str) -> dict[str, Any]:
    """The mappings a point runs: the mapper's h200 optimum (what the tool gives a user), the hand grouping at
    the tool's tiles (a comparison row), the unfused baseline."""
    from mambalaya.mapper import optimal_mapping
    from mambalaya.mapper.heuristics import unfused_baseline

    hand = mamba2_gpu_mapping(cascade) if family == "mamba2" else mamba1_gpu_mapping(cascade)
    return {"mapper": optimal_mapping(cascade, "h200").mapping, "hand": tiled(cascade, hand),
            "unfused": unfused_baseline(cascade, "h200")}


def map_points(maps: Path, points: list[tuple[str, int, int]]) -> None:
    """:func:`point_mappings` of each point, computed where the mapper runs (a CPU), saved as mapping files."""
    from mambalaya.ir.mapping import save_mapping
    from mambalaya.parse import open_cascade

    maps.mkdir(parents=True, exist_ok=True)
    for model, batch, seqlen in points:
        family = "mamba2" if model.startswith("mamba2") else "mamba1"
        cascade = open_cascade(family, model=model, params={"batch": batch, "seqlen": seqlen})
        t0 = time.perf_counter()
        made = point_mappings(cascade, family)
        for label, m in made.items():
            save_mapping(m, maps / f"{point_name(model, batch, seqlen)}_{label}.json")
        print(f"{model} b{batch} L{seqlen}: mapped in {time.perf_counter() - t0:.1f} s, "
              f"{len(made['mapper'].groups)} groups", flush=True)


def _variants(cascade: Any, maps: Path | None, name: str, family: str, first: bool) -> list[tuple[str, Any]]:
    """The mappings a point runs (:func:`point_mappings`; from ``maps`` when given), the unfused one at a model's
    first point only."""
    from mambalaya.ir.mapping import load_mapping

    labels = ["mapper", "hand"] + (["unfused"] if first else [])
    if maps is None:
        made = point_mappings(cascade, family)
        return [(k, made[k]) for k in labels]
    return [(k, load_mapping(maps / f"{name}_{k}.json").validate(cascade)) for k in labels]


def layer_inputs(cascade: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs with weight scales like a trained layer's (so nothing overflows in fp32)."""
    from mambalaya.exec.reference import random_inputs

    rng = np.random.default_rng(seed)
    x = {k: v.astype(np.float32) for k, v in random_inputs(cascade, seed).items()}
    v = cascade.values
    fan = {"Win": v["d_model"], "Wout": v["D"], "Wx": v["D"], "Wdt": v.get("dt_rank", 1), "Wconv": v["d_conv"]}
    for name, f in fan.items():
        if name in x:
            x[name] = x[name] / np.float32(math.sqrt(f))
    for name in ("S0", "H0"):  # start from a zero state, as the torch and mamba_ssm paths do
        if name in x:
            x[name] = np.zeros_like(x[name])
    if "Alog" in x:
        x["Alog"] = np.log(rng.uniform(1, 16, x["Alog"].shape)).astype(np.float32)
    for name in ("dtb", "bdt"):
        if name in x:
            x[name] = np.log(np.expm1(rng.uniform(1e-3, 0.1, x[name].shape))).astype(np.float32)
    return x


# ----------------------------------------------------------------------------- torch paths


def _segsum(x: Any) -> Any:
    import torch

    t = x.size(-1)
    x = x[..., None].expand(*x.shape, t)
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=-1)
    x = x.masked_fill(~mask, 0)
    s = torch.cumsum(x, dim=-2)
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=0)
    return s.masked_fill(~mask, -torch.inf)


def ssd_torch(x: Any, dt: Any, a: Any, b: Any, c: Any, q: int, dskip: Any) -> Any:
    """Chunked SSD in plain torch ops (mamba_ssm's ssd_minimal_discrete, padded to a multiple of q)."""
    import torch
    import torch.nn.functional as F

    bsz, seqlen, h, p = x.shape
    g = b.shape[2]
    b = b.repeat_interleave(h // g, dim=2)
    c = c.repeat_interleave(h // g, dim=2)
    pad = (-seqlen) % q
    xd = F.pad(x * dt[..., None], (0, 0, 0, 0, 0, pad))
    adt = F.pad(dt * a, (0, 0, 0, pad))
    b, c = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (b, c))
    nc = (seqlen + pad) // q
    xd, b, c = (t.reshape(bsz, nc, q, *t.shape[2:]) for t in (xd, b, c))
    adt = adt.reshape(bsz, nc, q, h).permute(0, 3, 1, 2)  # b h c q
    acs = torch.cumsum(adt, dim=-1)
    lm = torch.exp(_segsum(adt))
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", c, b, lm, xd)
    decay = torch.exp(acs[..., -1:] - acs)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, decay, xd)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(_segsum(F.pad(acs[..., -1], (1, 0))))
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", c, states, torch.exp(acs))
    y = (y_diag + y_off).reshape(bsz, nc * q, h, p)[:, :seqlen]
    return y + dskip[:, None] * x


def torch_mamba2(cascade: Any, w: dict[str, Any], ssd: Any) -> tuple[Any, Any]:
    """The whole Mamba-2 layer as eager torch ops; ``ssd`` computes y from (x, dt, A, B, C, chunk, D)."""
    import torch
    import torch.nn.functional as F

    v = cascade.values
    bsz, seqlen, _ = w["U"].shape
    d, gn, h, k, q = int(v["D"]), int(v["GN"]), int(v["H"]), int(v["d_conv"]), int(v["chunk"])
    g, n, p = int(v["ngroups"]), int(v["d_state"]), int(v["headdim"])
    zxbcdt = w["U"] @ w["Win"].T
    z, xbc, dt = torch.split(zxbcdt, [d, d + 2 * gn, h], dim=-1)
    xbc = F.conv1d(xbc.transpose(1, 2), w["Wconv"][:, None, :], w["bconv"], padding=k - 1, groups=d + 2 * gn)
    xbc = F.silu(xbc[..., :seqlen].transpose(1, 2))
    x, b, c = torch.split(xbc, [d, gn, gn], dim=-1)
    dt = torch.clamp(F.softplus(dt + w["dtb"]), float(v["dt_min"]), float(v["dt_max"]))
    a = -torch.exp(w["Alog"])
    y = ssd(x.reshape(bsz, seqlen, h, p), dt, a, b.reshape(bsz, seqlen, g, n), c.reshape(bsz, seqlen, g, n), q,
            w["Dskip"])
    yg = y.reshape(bsz, seqlen, d) * F.silu(z)
    yv = yg.reshape(bsz, seqlen, g, d // g)
    yn = (yv * torch.rsqrt(yv.pow(2).mean(-1, keepdim=True) + float(v["eps"]))).reshape(bsz, seqlen, d) * w["normw"]
    return yn @ w["Wout"].T, y


def load_mamba_ssm(src: str | None) -> Any:
    """mamba_chunk_scan_combined from an unpacked mamba_ssm source tree, without its CUDA extensions."""
    if not src:
        return None
    root = Path(src)
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [str(root / "mamba_ssm")]  # skip mamba_ssm/__init__.py: it imports the CUDA extensions
    sys.modules["mamba_ssm"] = pkg
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return mamba_chunk_scan_combined


def mamba_ssm_kernels(timeit: Any, args: tuple, repeat: int) -> dict[str, float]:
    """Seconds of each of mamba_ssm's five SSD kernels, each timed alone on its real inputs.

    Their counterparts among the generated groups: chunk_cumsum ~ ACS, chunk_state ~ DS ST,
    state_passing ~ S, bmm_chunk ~ CB, chunk_scan ~ LM YD + YO (+ the skip term of Y)."""
    import torch
    from einops import rearrange
    from mamba_ssm.ops.triton import ssd_combined as sc

    x, dt, a, b4, c4, q, dskip = args  # B and C: (batch, seqlen, ngroups, dstate)
    da_cs, dt_c = sc._chunk_cumsum_fwd(dt, a, q)
    states = sc._chunk_state_fwd(b4, x, dt_c, da_cs, states_in_fp32=True)
    flat = rearrange(states, "... p n -> ... (p n)")
    passed, _ = sc._state_passing_fwd(flat, da_cs[:, :, :, -1], chunk_size=q, out_dtype=c4.dtype)
    passed = rearrange(passed, "... (p n) -> ... p n", n=states.shape[-1])
    cb = sc._bmm_chunk_fwd(c4, b4, q, output_dtype=torch.float32)
    steps = {
        "chunk_cumsum": lambda: sc._chunk_cumsum_fwd(dt, a, q),
        "chunk_state": lambda: sc._chunk_state_fwd(b4, x, dt_c, da_cs, states_in_fp32=True),
        "state_passing": lambda: sc._state_passing_fwd(flat, da_cs[:, :, :, -1], chunk_size=q, out_dtype=c4.dtype),
        "bmm_chunk": lambda: sc._bmm_chunk_fwd(c4, b4, q, output_dtype=torch.float32),
        "chunk_scan": lambda: sc._chunk_scan_fwd(cb, x, dt_c, da_cs, c4, passed, D=dskip),
    }
    return {name: timeit(fn, iters=repeat) for name, fn in steps.items()}


# ----------------------------------------------------------------------------- measuring


def _timer(dry: bool):
    import torch

    def timeit(fn: Any, iters: int = 10, warmup: int = 2) -> float:
        """Median seconds of ``fn()``: replayed as a CUDA graph, as the generated layer is timed (an eager
        sequence of Python launches would be host-bound), or from CUDA events when capture fails."""
        for _ in range(warmup):
            fn()
        if dry:
            ts = []
            for _ in range(2):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts)
        from mambalaya.exec.triton_backend import cuda_median_s, graph_median_s

        torch.cuda.synchronize()
        try:
            return graph_median_s(torch, fn, iters)
        except Exception as exc:  # noqa: BLE001 - a path that cannot be captured is timed eagerly, and said so
            print(f"  (CUDA graph capture failed: {type(exc).__name__}; timed eagerly)", flush=True)
            torch.cuda.synchronize()
            return cuda_median_s(torch, fn, iters)

    return timeit


def _generated(cascade: Any, mapping: Any, inputs: dict, label: str, repeat: int) -> dict[str, Any]:
    """One mapping's schedule through the Triton backend: per group the measured time next to the cost model's."""
    from mambalaya.exec.backend import get_backend
    from mambalaya.mapper import evaluate

    t0 = time.perf_counter()
    report = evaluate(cascade, "h200", mapping)
    engine = get_backend("triton")
    program = engine.compile(cascade, report.schedule, "float32", matmul_precision="tf32")
    compile_s = time.perf_counter() - t0
    print(f"  {label}: {len(report.schedule.groups)} groups printed in {compile_s:.1f} s; running", flush=True)
    res = engine.run(program, inputs, repeat=repeat, warmup=2,
                     layer_repeat=0 if os.environ.get("TRITON_INTERPRET") == "1" else 2 * repeat)
    wall = time.perf_counter() - t0
    groups = []
    for g, run, t, pc in zip(report.schedule.groups, res.extra["groups"], res.group_s, report.groups, strict=True):
        groups.append({"einsums": list(g.einsums), "backend": run["backend"], "reason": run.get("reason", ""),
                       "programs": g.programs, "grid": [[lp.rank, lp.tile, lp.trips] for lp in g.loops[:g.grid]],
                       "dots": run.get("dots", 0), "occupancy_bytes": g.occupancy_bytes,
                       "measured_s": t, "predicted_s": pc.latency_s, "predicted_memory_s": pc.memory_s,
                       "predicted_compute_s": pc.compute_s, "traffic_bytes": pc.traffic_bytes})
    counted = res.traffic_bytes
    return {"mapping": label, "measured_s": res.run_s, "predicted_s": report.latency_s,
            "layer_eager_s": res.extra.get("layer_eager_s"), "layer_graph_s": res.extra.get("layer_graph_s"),
            "traffic_bytes": report.traffic_bytes, "traffic_counted_bytes": counted, "compile_s": compile_s,
            "wall_s": wall, "fallbacks": res.fallbacks, "groups": groups, "outputs": res.outputs}


def bench_points(quick: bool, first: int | None, start_at: int) -> list[tuple[str, int, int]]:
    points = [MAMBA2_POINTS[0], *MAMBA1_POINTS, *MAMBA2_POINTS[1:]]
    if quick:
        points = points[:3] + [points[5]]
    return points[start_at:first]


def measure(out_dir: Path, quick: bool, budget_s: float, mamba_ssm_src: str | None, dry: bool,
            first: int | None = None, start_at: int = 0, maps: Path | None = None) -> None:
    import torch
    import triton

    from mambalaya.exec.verify import compare
    from mambalaya.parse import open_cascade

    warnings.filterwarnings("ignore", category=RuntimeWarning)
    start = time.perf_counter()
    dev = "cpu" if dry else "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True  # the torch paths use tf32 like the generated kernels
    scan_combined = None
    try:
        scan_combined = load_mamba_ssm(mamba_ssm_src)
    except Exception as exc:  # noqa: BLE001 - the comparison is optional; say why it is missing
        print(f"mamba_ssm not loaded: {type(exc).__name__}: {exc}", flush=True)
    timeit = _timer(dry)
    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "gpu": "cpu (interpreter)" if dry else torch.cuda.get_device_name(),
           "mamba_ssm": bool(scan_combined), "matmul_precision": "tf32", "dtype": "float32"}
    out: dict[str, Any] = {"env": env, "points": [], "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if not dry:
        out["launch_overhead"] = launch_overhead()
        print(f"launch overhead: {out['launch_overhead']}", flush=True)
    points = bench_points(quick, first, start_at)
    if dry:
        points = [("mamba2-370m", 1, 64), ("mamba-370m", 1, 16)]
    seen: set[str] = set()
    for model, batch, seqlen in points:
        if time.perf_counter() - start > budget_s:
            print(f"budget reached: skipping {model} b{batch} L{seqlen}", flush=True)
            continue
        family = "mamba2" if model.startswith("mamba2") else "mamba1"
        extra = {"d_model": 64, "headdim": 16, "d_state": 16, "chunk": 16} if dry and family == "mamba2" else {}
        params = {"batch": batch, "seqlen": seqlen, **extra}
        cascade = open_cascade(family, model=None if dry else model, params=params)
        inputs = layer_inputs(cascade)
        repeat = 3 if dry else (5 if seqlen * batch >= 32768 else 10)
        point: dict[str, Any] = {"model": model, "batch": batch, "seqlen": seqlen, "runs": []}
        print(f"== {model} batch {batch} seqlen {seqlen}", flush=True)
        variants = _variants(cascade, None if dry else maps, point_name(model, batch, seqlen), family,
                             first=model not in seen)
        seen.add(model)
        fused_out = None
        for label, m in variants:
            try:
                run = _generated(cascade, m, inputs, label, repeat)
            except Exception as exc:  # noqa: BLE001 - record and go on
                print(f"  generated {label}: FAILED {type(exc).__name__}: {exc}", flush=True)
                point["runs"].append({"mapping": label, "error": f"{type(exc).__name__}: {exc}"})
                continue
            outputs = run.pop("outputs")
            fused_out = fused_out or outputs
            ssd = sum(g["measured_s"] for g in run["groups"] if set(g["einsums"]) & set(SSD_GROUPS))
            run["ssd_measured_s"] = ssd
            print(f"  generated {label:8s} {run['measured_s'] * 1e3:9.3f} ms (predicted {run['predicted_s'] * 1e3:8.3f} ms,"
                  f" eager seq {_ms(run['layer_eager_s'])}, graph {_ms(run['layer_graph_s'])},"
                  f" compile {run['compile_s']:.1f} s, fallbacks {run['fallbacks']})", flush=True)
            for g in run["groups"]:
                print(f"    {' '.join(g['einsums']):28s} {g['measured_s'] * 1e3:8.3f} / {g['predicted_s'] * 1e3:7.3f} ms"
                      f" {g['programs']} programs", flush=True)
            point["runs"].append(run)
        if family == "mamba2":
            w = {k: torch.from_numpy(v).to(dev) for k, v in inputs.items()}
            with torch.no_grad():
                try:
                    t = timeit(lambda: torch_mamba2(cascade, w, ssd_torch), iters=repeat)  # noqa: B023 - called within the iteration
                    y_out, _ = torch_mamba2(cascade, w, ssd_torch)
                    err = compare({"OUT": y_out.cpu().numpy()}, {"OUT": fused_out["OUT"]})[1] if fused_out else None
                    point["torch_layer_s"], point["torch_vs_generated_rel_err"] = t, err
                    print(f"  torch eager layer {t * 1e3:9.3f} ms (generated vs torch rel err {err})", flush=True)
                    args = _ssd_args(cascade, w)
                    point["torch_ssd_s"] = timeit(lambda: ssd_torch(*args), iters=repeat)  # noqa: B023 - called within the iteration
                    print(f"  torch eager SSD   {point['torch_ssd_s'] * 1e3:9.3f} ms", flush=True)
                except Exception as exc:  # noqa: BLE001
                    point["torch_error"] = f"{type(exc).__name__}: {exc}"
                    print(f"  torch: FAILED {point['torch_error']}", flush=True)
                if scan_combined is not None:
                    try:
                        x, dt, a, b, c, q, dskip = _ssd_args(cascade, w)
                        fn = lambda: scan_combined(x, dt, a, b, c, q, D=dskip)  # noqa: E731, B023
                        point["mamba_ssm_ssd_s"] = timeit(fn, iters=repeat)
                        ref = ssd_torch(x, dt, a, b, c, q, dskip)
                        point["mamba_ssm_vs_torch_rel_err"] = float((fn() - ref).abs().max() / ref.abs().max())
                        layer = lambda: torch_mamba2(  # noqa: E731
                            cascade, w, lambda *s: scan_combined(*s[:6], D=s[6]))  # noqa: B023 - called within the iteration
                        point["torch_layer_mamba_ssm_s"] = timeit(layer, iters=repeat)
                        print(f"  mamba_ssm SSD     {point['mamba_ssm_ssd_s'] * 1e3:9.3f} ms; torch layer with it "
                              f"{point['torch_layer_mamba_ssm_s'] * 1e3:9.3f} ms", flush=True)
                        point["mamba_ssm_kernels_s"] = mamba_ssm_kernels(timeit, (x, dt, a, b, c, q, dskip), repeat)
                        print(f"  mamba_ssm kernels {point['mamba_ssm_kernels_s']}", flush=True)
                    except Exception as exc:  # noqa: BLE001
                        point["mamba_ssm_error"] = f"{type(exc).__name__}: {exc}"
                        print(f"  mamba_ssm: FAILED {point['mamba_ssm_error']}", flush=True)
            del w
        out["points"].append(point)
        out["elapsed_s"] = time.perf_counter() - start
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gpu.json").write_text(json.dumps(out, indent=1, default=float) + "\n")
        if not dry:
            torch.cuda.empty_cache()


def launch_overhead(n: int = 200) -> dict[str, float]:
    """Per-launch cost of a one-program Triton kernel like the generated ones (pointer args, launched from
    Python as the backend does), back to back: eager, and replayed from a CUDA graph; plus torch's own."""
    import torch
    import triton
    import triton.language as tl

    from mambalaya.exec.triton_backend import cuda_median_s, sequence_times

    @triton.jit
    def tiny(p, q, r, s):  # four pointer arguments, one program, one element
        tl.store(p, tl.load(q) + tl.load(r) + tl.load(s))

    bufs = [torch.zeros(1, device="cuda") for _ in range(4)]

    def seq() -> None:
        for _ in range(n):
            tiny[(1,)](*bufs)

    eager, graph = (t / n for t in sequence_times(torch, seq, 5))
    x = bufs[0]
    torch_eager = cuda_median_s(torch, lambda: [x.add_(1.0) for _ in range(n)], 5) / n
    return {"triton_eager_s": eager, "triton_graph_s": graph, "torch_eager_s": torch_eager}


def _ssd_args(cascade: Any, w: dict[str, Any]) -> tuple:
    """The SSD core's inputs (x, dt, A, B, C, chunk, D) from the layer's weights, as torch computes them."""
    import torch
    import torch.nn.functional as F

    v = cascade.values
    bsz, seqlen, _ = w["U"].shape
    d, gn, h, k = int(v["D"]), int(v["GN"]), int(v["H"]), int(v["d_conv"])
    g, n, p = int(v["ngroups"]), int(v["d_state"]), int(v["headdim"])
    z_xbc_dt = w["U"] @ w["Win"].T
    _, xbc, dt = torch.split(z_xbc_dt, [d, d + 2 * gn, h], dim=-1)
    xbc = F.conv1d(xbc.transpose(1, 2), w["Wconv"][:, None, :], w["bconv"], padding=k - 1, groups=d + 2 * gn)
    xbc = F.silu(xbc[..., :seqlen].transpose(1, 2))
    x, b, c = torch.split(xbc, [d, gn, gn], dim=-1)
    dt = torch.clamp(F.softplus(dt + w["dtb"]), float(v["dt_min"]), float(v["dt_max"]))
    a = -torch.exp(w["Alog"])
    return (x.reshape(bsz, seqlen, h, p).contiguous(), dt.contiguous(), a, b.reshape(bsz, seqlen, g, n).contiguous(),
            c.reshape(bsz, seqlen, g, n).contiguous(), int(v["chunk"]), w["Dskip"])


# ----------------------------------------------------------------------------- table


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def repredict(data: dict, maps: Path | None = None) -> None:
    """Replace every prediction in ``data`` by the cost model's with the specs as they are now (the
    measurements stay): a spec corrected after a run is judged against the same measured times. ``maps``: the
    mapping files the run ran (without: mapped again, which may not be what ran)."""
    from mambalaya.mapper import evaluate
    from mambalaya.parse import open_cascade

    for p in data["points"]:
        family = "mamba2" if p["model"].startswith("mamba2") else "mamba1"
        cascade = open_cascade(family, model=p["model"], params={"batch": p["batch"], "seqlen": p["seqlen"]})
        mappings = dict(_variants(cascade, maps, point_name(p["model"], p["batch"], p["seqlen"]), family, first=True))
        for r in p["runs"]:
            if "error" in r or r["mapping"] not in mappings:
                continue
            report = evaluate(cascade, "h200", mappings[r["mapping"]])
            r["predicted_s"] = report.latency_s
            for g, pc in zip(r["groups"], report.groups, strict=True):
                g.update(predicted_s=pc.latency_s, predicted_memory_s=pc.memory_s, predicted_compute_s=pc.compute_s)
    data["repredicted"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _mamba_ssm_rows(data: dict) -> list[str]:
    """The SSD kernel by kernel: the generated groups next to their mamba_ssm counterparts."""
    pairs = [("chunk_cumsum", {"ACS"}), ("bmm_chunk", {"CB"}), ("chunk_state", {"DS", "ST"}),
             ("state_passing", {"S", "SF"}), ("chunk_scan", {"LM", "YD", "YO"})]
    lines = ["", "## The SSD kernel by kernel: generated (the mapper's schedule) vs mamba_ssm", "",
             "| model | batch | seqlen | " + " | ".join(f"{m} vs {' '.join(sorted(g))}" for m, g in pairs)
             + " | SSD total |", "|---|---:|---:|" + "---:|" * (len(pairs) + 1)]
    for p in data["points"]:
        ks = p.get("mamba_ssm_kernels_s")
        run = next((r for r in p["runs"] if r.get("mapping") == "mapper" and "error" not in r), None)
        if not ks or not run:
            continue
        ours = {m: 0.0 for m, _ in pairs}
        for g in run["groups"]:  # a group's time goes to the kernel holding most of its SSD Einsums
            hits = [(len(set(g["einsums"]) & members), m) for m, members in pairs]
            n, m = max(hits)
            if n:
                ours[m] += g["measured_s"]
        cells = [f"{ks[m] * 1e3:.3f} / {ours[m] * 1e3:.3f}" for m, _ in pairs]
        tot = run.get("ssd_measured_s")
        cells.append(f"{p['mamba_ssm_ssd_s'] * 1e3:.3f} / {tot * 1e3:.3f} ({tot / p['mamba_ssm_ssd_s']:.2f}x)")
        lines.append(f"| {p['model']} | {p['batch']} | {p['seqlen']} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: mamba_ssm ms / generated ms (the generated groups whose SSD Einsums are mostly that "
              "kernel's; a group also computing non-SSD Einsums counts whole). mamba_ssm's chunk_scan also adds the "
              "skip term D*x, which the generated layer computes in its gate group (not counted here)."]
    return lines


def table(path: Path, repredicted: bool = False, maps: Path | None = None) -> str:
    data = json.loads(path.read_text())
    if repredicted:
        repredict(data, maps)
    env = data["env"]
    lines = [
        "# The mapper's h200 schedule on the GPU vs the h200 cost model",
        "",
        f"Measured {', '.join(data.get('runs') or [data['started']])} (points merged from these runs, each measured "
        f"with the code of that time) on {env['gpu']} (torch {env['torch']}, triton {env['triton']}, CUDA "
        f"{env['cuda']}, Python {env['python']}) with `python benchmarks/bench_gpu.py OUT --mappings MAPS "
        "--mamba-ssm SRC` (MAPS from `python benchmarks/bench_gpu.py --map-only MAPS` on a CPU: the mapper's "
        "`optimal_mapping(cascade, 'h200')`, the hand grouping at the tool's tiles, the unfused baseline); table: "
        "`python benchmarks/bench_gpu.py --table OUT/gpu.json --md benchmarks/results/gpu_mapper.md`. "
        f"fp32 data, {env['matmul_precision']} matrix products (generated kernels and torch alike). A layer's time "
        "is a CUDA-graph replay of all its kernels, a group's the median replay of 4 launches in one graph; the "
        "torch and mamba_ssm paths are CUDA graphs too. Predicted: `evaluate(cascade, 'h200', mapping)`"
        + (f" with the specs as of {data['repredicted']} (`--repredict`)." if data.get("repredicted") else "."),
        "",
        "## Layers",
        "",
        "| model | batch | seqlen | schedule | groups | measured (graph) | predicted | measured / predicted "
        "| traffic predicted = counted |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for p in data["points"]:
        for r in p["runs"]:
            if "error" in r:
                lines.append(f"| {p['model']} | {p['batch']} | {p['seqlen']} | {r['mapping']} | | "
                             f"{r['error'][:60]} | | | |")
                continue
            meas = r.get("layer_graph_s") or r["measured_s"]
            same = r.get("traffic_counted_bytes") == r.get("traffic_bytes")
            lines.append(f"| {p['model']} | {p['batch']} | {p['seqlen']} | {r['mapping']} | {len(r['groups'])} | "
                         f"{_ms(meas)} | {_ms(r['predicted_s'])} | {meas / r['predicted_s']:.2f} | "
                         f"{'yes' if same else 'no'} ({r['traffic_bytes'] / 1e6:.0f} MB) |")
        for label, key in (("torch eager layer", "torch_layer_s"), ("torch layer + mamba_ssm SSD", "torch_layer_mamba_ssm_s")):
            if p.get(key):
                lines.append(f"| {p['model']} | {p['batch']} | {p['seqlen']} | {label} | | {_ms(p[key])} | | | |")
    lo = data.get("launch_overhead")
    if lo:
        lines += ["", f"Launch cost per kernel (one-program Triton kernel, 200 back to back): eager from Python "
                      f"{lo['triton_eager_s'] * 1e6:.1f} us, CUDA-graph replay {lo['triton_graph_s'] * 1e6:.2f} us; "
                      f"a torch eager op {lo['torch_eager_s'] * 1e6:.1f} us."]
    lines += _mamba_ssm_rows(data)
    errs = [f"{p['model']} b{p['batch']} L{p['seqlen']}: generated vs torch {p['torch_vs_generated_rel_err']:.2g}"
            for p in data["points"] if "torch_vs_generated_rel_err" in p]
    if errs:
        lines += ["", "Times in ms. Largest relative error: " + "; ".join(errs) + "."]
    for p in data["points"]:
        for r in p["runs"]:
            if "error" in r:
                continue
            lines += ["", f"## Per group: {p['model']} batch {p['batch']} seqlen {p['seqlen']}, {r['mapping']}", "",
                      "| group | grid (rank/block x blocks) | programs | tl.dot | on chip KiB | measured ms "
                      "| predicted ms | ratio | traffic MB |",
                      "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
            for g in r["groups"]:
                grid = " ".join(f"{a}/{b}x{c}" for a, b, c in g.get("grid", [])) or "1"
                rt = f"{g['measured_s'] / g['predicted_s']:.2f}" if g.get("predicted_s") else "-"
                lines.append(f"| {' '.join(g['einsums'])} | {grid} | {g.get('programs', '')} | {g.get('dots', '')} | "
                             f"{g.get('occupancy_bytes', 0) / 1024:.0f} | {_ms(g['measured_s'])} | "
                             f"{_ms(g.get('predicted_s'))} | {rt} | {g['traffic_bytes'] / 1e6:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dry", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new points after this long")
    ap.add_argument("--first", type=int, default=None, help="measure only the first N points")
    ap.add_argument("--start-at", type=int, default=0, help="skip the points before this index")
    ap.add_argument("--map-only", type=Path, default=None, help="only map the points, into mapping files here")
    ap.add_argument("--mappings", type=Path, default=None, help="run the mapping files --map-only wrote")
    ap.add_argument("--mamba-ssm", default=None, help="unpacked mamba_ssm source tree (for the SSD comparison)")
    ap.add_argument("--table", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--repredict", action="store_true", help="with --table: predictions from the specs as they are now")
    a = ap.parse_args()
    if a.table:
        text = table(a.table, a.repredict, a.mappings)
        if a.md:
            a.md.write_text(text)
        print(text)
        return
    if a.map_only:
        map_points(a.map_only, bench_points(a.quick, a.first, a.start_at))
        return
    if a.dry:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    measure(a.out, a.quick, a.budget_s, a.mamba_ssm, a.dry, a.first, a.start_at, a.mappings)


if __name__ == "__main__":
    main()
