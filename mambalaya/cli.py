"""The ``mambalaya`` command line (the interface contract: every command, its options, its JSON).

Every subcommand turns user mistakes (a :class:`MambalayaError`) into one line
on stderr and exit code 2; a failed check exits 1; success exits 0. ``--json``
prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mambalaya.errors import MambalayaError
from mambalaya.fileio import shipped_names, write_atomic

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


@functools.cache
def _shipped(kind: str) -> str:
    """The shipped names of a kind, for a help text (read from the folder once: never out of date)."""
    return ", ".join(shipped_names(kind))


def _cascade_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("cascade", help=f"a shipped cascade ({_shipped('cascades')}) or a cascade file path")
    p.add_argument("--model", help="published model size (mamba-130m ... mamba2-2.7b)")
    p.add_argument("--set", action="append", metavar="K=V", help="override a param (repeatable)")


def _open(args: argparse.Namespace):
    from mambalaya.parse import open_cascade, parse_set

    return open_cascade(args.cascade, model=args.model, params=parse_set(args.set))


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


# ---- subcommands ---------------------------------------------------------


def cmd_analyze(args: argparse.Namespace) -> int:
    cascade = _open(args)
    from mambalaya.analysis import analyze, format_edge_table, format_group_table

    result = analyze(cascade)
    if args.json:
        _emit_json(result.to_json(include_groups=args.groups))
        return EXIT_OK
    sys.stdout.write(_params_line(cascade, args) + "\n\n" + format_edge_table(result) + "\n")
    sys.stdout.write(format_group_table(result, limit=None if args.groups else 20) + "\n")
    whole = f", enumerated completely up to {result.complete_size} Einsums a group" if result.truncated else ""
    print(f"{len(result.legal_groups)} legal fusion groups of {len(result.groups)} candidates{whole}"
          f"{'' if args.groups else ' (the largest 20 above; all of them: --groups)'}")
    return EXIT_OK


def _params_line(cascade, args: argparse.Namespace) -> str:
    """The sizes an analysis used, the given ones marked: a file's defaults are often a toy size."""
    from mambalaya.parse import parse_set

    given = set(parse_set(args.set))
    shown = [f"{k}={v:g}{'*' if k in given else ''}" for k, v in cascade.params.items()]
    origin = f"--model {args.model} and the file" if args.model else "the file's defaults"
    return (f"{cascade.name} with {' '.join(shown)} ({'* given, the rest ' if given else ''}from {origin}; "
            "change them with --model or --set K=V)")


def cmd_render(args: argparse.Namespace) -> int:
    from mambalaya.report.render import render_cascade

    cascade = _open(args)
    mapping = None
    if args.mapping:
        from mambalaya.ir.mapping import load_mapping

        mapping = load_mapping(args.mapping).validate(cascade)
    elif args.arch:
        from mambalaya.mapper import optimal_mapping

        mapping = optimal_mapping(cascade, args.arch).mapping
    render_cascade(cascade, args.output, mapping=mapping)
    print(f"wrote {args.output}", file=sys.stderr)
    return EXIT_OK


def cmd_map(args: argparse.Namespace) -> int:
    from mambalaya.arch import load_arch
    from mambalaya.exec.verify import Progress
    from mambalaya.mapper import map_command_result
    from mambalaya.mapper.mapreport import format_map_report

    cascade = _open(args)
    arch = load_arch(args.arch)
    if args.layers < 1:
        raise MambalayaError(f"--layers must be at least 1, got {args.layers}")
    if args.check_moves and args.layers > 1:
        raise MambalayaError("--check-moves checks one layer's mapping: drop --layers or --check-moves")
    with Progress().step(f"mapping {cascade.name} on {arch.name}"):  # (a spinner on a terminal: a GPU takes minutes)
        result = map_command_result(cascade, arch, args.objective, args.method, args.layers, args.mapping,
                                    args.time_limit, recompute=args.recompute)
    if args.check_moves:
        with Progress().step("building and pricing every mapping one move away"):
            result["neighbours"] = _neighbours(cascade, arch, result)
    if args.output:
        from mambalaya.ir.mapping import mapping_from_dict, save_mapping

        save_mapping(mapping_from_dict({"cascade": cascade.name, "arch": arch.name, **result["mapping"]}),
                     args.output)
    if args.json:
        _emit_json(result)
    else:
        sys.stdout.write(format_map_report(result) + "\n")
    if args.show:
        sys.stdout.write(_shown(cascade, arch, result["mapping"], args.show) + "\n")
    return EXIT_OK


def _neighbours(cascade, arch, result: dict) -> dict:
    """``map --check-moves``: the chosen mapping against every mapping one move from it
    (:func:`mambalaya.mapper.moves.neighbours`), as the JSON's ``neighbours``."""
    from mambalaya.ir.mapping import mapping_from_dict
    from mambalaya.mapper.moves import neighbours

    mapping = mapping_from_dict({"cascade": cascade.name, "arch": arch.name, **result["mapping"]})
    nb = neighbours(cascade, arch, mapping, result["objective"])
    best = nb.best()

    def move(m) -> dict:
        return {"kind": m.kind, "before": [list(g) for g in m.before], "after": [list(g) for g in m.after],
                "latency_s": m.latency_s, "traffic_bytes": m.traffic_bytes}

    return {"built": len(nb.moves), "priced": sum(1 for m in nb.moves if m.score(nb.objective) is not None),
            "untried": sum(nb.untried.values()), "better": [move(m) for m in nb.better()],
            "best": None if best is None else {**move(best), "ratio": best.score(nb.objective)[0] / nb.value if nb.value else None}}


def _shown(cascade, arch, mapping: dict, what: str) -> str:
    """The mapping's schedule as ``map --show`` prints it."""
    from mambalaya.ir.mapping import mapping_from_dict
    from mambalaya.schedule import lower_mapping
    from mambalaya.schedule.printer import format_schedule

    sched = lower_mapping(cascade, mapping_from_dict({"cascade": cascade.name, "arch": arch.name, **mapping}), arch)
    if what == "schedule":
        return format_schedule(sched)
    if what == "numba":
        from mambalaya.exec.numba_codegen import group_source

        return "\n\n".join(f"# group {g.index}: {', '.join(g.einsums)}\n{group_source(cascade, g, 'float32')}"
                             for g in sched.groups)
    from mambalaya.exec.triton_codegen import Unsupported, group_kernel_source

    out = []
    for g in sched.groups:
        try:
            out.append(f"# group {g.index}: {', '.join(g.einsums)}\n{group_kernel_source(cascade, g, 'float32').source}")
        except Unsupported as err:
            out.append(f"# group {g.index}: {', '.join(g.einsums)}: not printable in Triton ({err})")
    return "\n\n".join(out)


def default_jobs() -> int:
    """The mapper's processes unless ``--jobs`` says (each size's group searches at once: ``search_jobs``): the
    environment's ``MAMBALAYA_JOBS``, else this machine's cores, at most 8 (a test suite already on every core
    sets 1)."""
    got = os.environ.get("MAMBALAYA_JOBS", "")
    return int(got) if got.isdigit() and int(got) > 0 else max(1, min(8, os.cpu_count() or 1))


def _jobs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=_count, default=default_jobs(), metavar="N",
                   help=f"processes the mapper searches groups in (default {default_jobs()}: MAMBALAYA_JOBS, else "
                        "this machine's cores, at most 8; 1: this process alone); the mapping does not depend on it")


def _count(text: str) -> int:
    """An option's positive whole number."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _positive(text: str) -> float:
    """An option's positive, finite number (``nan``, ``inf`` and ``-1`` are refused by argparse)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


class _Timeout(BaseException):
    """:func:`_deadline`'s alarm."""


#: Seconds between :func:`_deadline`'s alarms once it is due: one that fires while a finalizer runs (a generator
#: closed by the collector) is lost inside it, so it fires again until one stops the block
ALARM_AGAIN_S = 0.05


@contextlib.contextmanager
def _deadline(seconds: float | None, what: str) -> Iterator[None]:
    """Stop the block with a :class:`MambalayaError` after ``seconds`` of wall time (the CLI's main thread only;
    a compiled kernel already running finishes its call first)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise _Timeout  # (not an Exception: the mapper's handlers of refused groups must not swallow it)

    def unraisable(u: Any) -> None:  # an alarm raised inside a finalizer is lost there: the next one stops the block
        if not isinstance(u.exc_value, _Timeout):
            old_hook(u)

    start = time.monotonic()
    old = signal.signal(signal.SIGALRM, on_alarm)
    old_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds, ALARM_AGAIN_S)
    try:
        yield
    except _Timeout:
        raise MambalayaError(f"{what} did not finish within --timeout {seconds:g} s: raise it, or try smaller "
                             "sizes") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sys.unraisablehook = old_hook
        if old_delay:  # (an alarm set before, a test runner's: it still fires when it was due)
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - start), 1e-3), old_interval)


def cmd_verify(args: argparse.Namespace) -> int:
    from mambalaya.exec.verify import verify_mapping

    cascade = _open(args)
    options = {"matmul_precision": args.matmul_precision} if args.backend == "triton" else {}
    limit = None if args.max_memory is None else int(args.max_memory * 2**30)
    with _deadline(args.timeout, f"verify of {cascade.name}"):
        result = verify_mapping(cascade, arch=args.arch, mapping_file=args.mapping, backend=args.backend,
                                dtype=args.dtype, seed=args.seed, optimal=not args.unfused, max_memory_bytes=limit,
                                **options)
    if args.json:
        _emit_json(result)
    else:
        status = "ok" if result["ok"] else "MISMATCH"
        print(f"{status}: max error {result['max_rel_err']:.3g} of each output's scale (tolerance "
              f"{result['tolerance']:.0e}; max abs error {result['max_abs_err']:.3g}, {args.dtype}); traffic predicted "
              f"{result['traffic_predicted_bytes']} B, counted {result['traffic_counted_bytes']} B "
              f"({len(result['groups'])} groups, mapping: {result['mapping_source']}, backend {args.backend})")
        if not result["traffic_ok"]:
            want, got = result["traffic_predicted_by_tensor"], result["traffic_counted_by_tensor"]
            for t in sorted({*want, *got}):
                if want.get(t, 0) != got.get(t, 0):
                    print(f"  {t}: predicted {want.get(t, 0)} B, counted {got.get(t, 0)} B", file=sys.stderr)
        for fb in result.get("fallbacks", []):
            print(f"note: group {fb['group']} ran on the reference fallback: {fb['reason']}", file=sys.stderr)
    return EXIT_OK if result["ok"] else EXIT_CHECK_FAILED


def cmd_run(args: argparse.Namespace) -> int:
    from mambalaya.exec.realweights import run_layer

    try:
        x = np.load(args.input, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise MambalayaError(f"cannot read input array: {err}", file=args.input) from None
    notes: list[str] = []
    y = run_layer(args.config, args.weights, x, layer=args.layer, cascade=args.cascade, arch=args.arch,
                  backend=args.backend, matmul_precision=args.matmul_precision, notes=notes)
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    from io import BytesIO

    buf = BytesIO()
    np.save(buf, y)
    write_atomic(args.output, buf.getvalue())
    print(f"wrote {args.output}: output {y.shape} {y.dtype} from input {x.shape}", file=sys.stderr)
    return EXIT_OK


def cmd_generate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from mambalaya.exec.generate import load_generator, read_prompt_ids

    prompt = read_prompt_ids(args.prompt_ids, args.prompt_file)
    if args.max_new_tokens < 1:
        raise MambalayaError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.output and Path(args.output).parent and not Path(args.output).parent.is_dir():
        raise MambalayaError(f"cannot write {args.output}: its folder does not exist")
    options = {"matmul_precision": args.matmul_precision} if args.backend == "triton" else {}
    generator = load_generator(args.config, args.weights, args.arch, args.backend, **options)
    bar = Progress(TextColumn("generate"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   console=Console(stderr=True), disable=args.json or not sys.stderr.isatty(), transient=True)
    with bar:
        task = bar.add_task("generate", total=args.max_new_tokens)
        result = generator.generate(prompt, args.max_new_tokens, stop_at_eos=not args.ignore_eos,
                                    on_token=lambda done, _total: bar.update(task, completed=done))
    if args.output:
        from io import BytesIO

        if args.output.endswith(".npy"):
            buf = BytesIO()
            np.save(buf, np.asarray(result.tokens, dtype=np.int64))
            write_atomic(args.output, buf.getvalue())
        else:
            write_atomic(args.output, (",".join(map(str, result.tokens)) + "\n").encode())
    if args.json:
        _emit_json(result.to_json())
    else:
        print(",".join(map(str, result.tokens)))
        t = result.to_json()["time_s"]
        pred = result.predicted
        print(f"{len(result.tokens)} new tokens at {result.tokens_per_s:.1f} tokens/s on {result.backend} "
              f"({result.arch}'s schedules): prefill {t['prefill'] * 1e3:.1f} ms for {len(prompt)} tokens, decode "
              f"{t['decode_per_token'] * 1e3:.2f} ms per token, LM head {t['lm_head'] * 1e3:.1f} ms in all "
              f"(mapping {t['map']:.1f} s and compiling {t['compile']:.1f} s before)", file=sys.stderr)
        if pred is not None:
            top = ", ".join(f"{e} {s:.0%}" for e, s in pred.dominant[:3])
            print(f"predicted on {pred.arch}: {pred.tokens_per_s:.1f} tokens/s decode ({pred.token_s * 1e3:.2f} ms "
                  f"per token; most of it: {top})", file=sys.stderr)
    if result.interrupted:
        print(f"interrupted: kept the {len(result.tokens)} tokens finished", file=sys.stderr)
        return 130
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from mambalaya.exec.verify import Progress
    from mambalaya.report.report import check_output_dir, write_report

    check_output_dir(args.output)  # before any solving: a bad folder costs nothing
    cascade = _open(args)
    start = time.perf_counter()
    with Progress().step(f"mapping {cascade.name} on {', '.join(args.arch)} and writing the report"):
        out = write_report(cascade, args.arch, args.output, args.objective)
    print(f"wrote {out}/report.html and report.md ({', '.join(args.arch)}) in {time.perf_counter() - start:.1f} s",
          file=sys.stderr)
    return EXIT_OK


def cmd_sweep(args: argparse.Namespace) -> int:
    from mambalaya.study import explore
    from mambalaya.study.output import check_table_path, parse_ranges, plot_sweep, write_table

    check_table_path(args.output)
    if args.plot and not Path(args.plot).parent.is_dir():
        raise MambalayaError(f"cannot write {args.plot}: its folder does not exist")
    cascade = _open(args)
    df = explore(cascade, args.arch, sweep=parse_ranges(args.set_range, "--set-range"),
                 arch_overrides=parse_ranges(args.override, "--override"), objective=args.objective,
                 workers=args.workers, progress=sys.stderr.isatty())
    write_table(df, args.output)
    if args.plot:
        plot_sweep(df, args.plot)
    bad = int((~df["feasible"]).sum())
    print(f"wrote {args.output}: {len(df)} design points ({bad} infeasible)", file=sys.stderr)
    return EXIT_OK


# ---- wiring --------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from mambalaya import __version__
    from mambalaya.exec.backend import backend_names, describe_backends

    parser = _ArgumentParser(prog="mambalaya", description="Einsum-cascade fusion explorer and compiler")
    parser.add_argument("--version", action="version", version=f"mambalaya {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)

    p = sub.add_parser("analyze", help="fusion class of every edge and the legal fusion groups")
    _cascade_args(p)
    p.add_argument("--groups", action="store_true", help="list every candidate group (default: the largest 20 "
                   "legal ones; with --json: every candidate, legal or not, with why)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("render", help="draw the cascade (SVG, PDF or PNG by the file suffix)")
    _cascade_args(p)
    p.add_argument("--arch", help="draw the fusion groups of this architecture's optimal mapping "
                                  f"({_shipped('archs')}, or a spec file)")
    p.add_argument("--mapping", help="draw the fusion groups of this mapping file")
    p.add_argument("-o", "--output", required=True, help="output file: .svg, .pdf or .png")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("map", help="the optimal fused mapping on an architecture, with its cost")
    _cascade_args(p)
    p.add_argument("--arch", required=True, help=f"a shipped architecture ({_shipped('archs')}) or a spec file")
    p.add_argument("--objective", default="latency", choices=["latency", "traffic"],
                   help="minimised first; ties go to the least of the other (latency: least traffic)")
    p.add_argument("--recompute", action="store_true",
                   help="also search re-running cheap multi-consumer point-wise tensors instead of writing them "
                        "(one layer)")
    p.add_argument("--method", default="ilp", choices=["ilp", "mip", "downsets", "cpsat", "exhaustive", "layers"],
                   help="ilp: the exact cover, proven optimal: a shortest path over the cascade's downsets (sets of "
                        "Einsums holding their producers), or a MIP (OR-Tools SCIP) where that does not apply; a "
                        "chain of --layers goes to the layers solver by itself; mip, downsets: either alone; cpsat: the same model in OR-Tools CP-SAT; exhaustive: "
                        "brute force, for small cascades; layers: a chain of identical layers as a shortest path "
                        "over its boundaries (anything else falls back to ilp)")
    p.add_argument("--layers", type=int, default=1, help="chain N layers so cross-layer fusion is searched")
    p.add_argument("--mapping", help="evaluate this mapping file instead of optimising")
    p.add_argument("--time-limit", type=_positive, help="seconds; the best mapping found so far and its gap")
    _jobs_arg(p)
    p.add_argument("-o", "--output", help="also write the chosen mapping (YAML or JSON by suffix)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--show", choices=["schedule", "numba", "triton"],
                   help="also print the chosen mapping's schedule: as loop-nest pseudo-code, or as the Numba or "
                        "Triton source its backend runs")
    p.add_argument("--check-moves", action="store_true",
                   help="also build and price every mapping one move from the chosen one (two groups merged, one "
                        "split in two), each new group tiled by a full search, and say whether any is better")
    p.set_defaults(func=cmd_map)

    p = sub.add_parser("verify", help="run a mapping's schedule and the reference; compare numbers and traffic")
    _cascade_args(p)
    p.add_argument("--arch", help="verify the optimal mapping for this architecture (with --mapping: run that "
                                  "mapping under this architecture's capacity)")
    p.add_argument("--mapping", help="verify this mapping file")
    p.add_argument("--unfused", action="store_true", help="verify the arch's unfused baseline instead of its optimum")
    p.add_argument("--backend", default="numba", choices=backend_names(),
                   help="; ".join(f"{k}: {v}" for k, v in describe_backends().items()))
    p.add_argument("--matmul-precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                   help="tl.dot operand precision of the triton backend (its tolerance follows)")
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-memory", type=_positive, metavar="GIB",
                   help="refuse a run that would allocate more than this (default: 80%% of this machine's memory)")
    p.add_argument("--timeout", type=_positive, metavar="SECONDS",
                   help="stop (exit 2) when mapping, compiling and running take longer than this")
    _jobs_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("run", help="run a Mamba layer on real weights")
    p.add_argument("cascade", nargs="?", default=None,
                   help="cascade to run (default: mamba1 or mamba2, from the config)")
    p.add_argument("--config", required=True, help="Hugging Face config.json")
    p.add_argument("--weights", required=True, help=".safetensors or .npz with transformers/mamba_ssm names")
    p.add_argument("--layer", type=int, help="layer N of a whole-model checkpoint")
    p.add_argument("--input", required=True, help="hidden states .npy, shape (batch, seqlen, d_model)")
    p.add_argument("-o", "--output", required=True, help="output .npy")
    p.add_argument("--arch", help="run the fused schedule chosen for this architecture")
    p.add_argument("--backend", default="numba", choices=["numba", "triton"],
                   help="numba: the CPU executor (the reference interpreter without --arch); triton: one "
                        "generated Triton kernel per fusion group of --arch's schedule (default h200), on a "
                        "CUDA GPU or under TRITON_INTERPRET=1")
    p.add_argument("--matmul-precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                   help="tl.dot operand precision of the triton backend (fp32 accumulation in all three)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("generate", help="greedy token generation with a whole Mamba model, every mixer through "
                                        "the mapper's fused schedule")
    p.add_argument("--config", required=True, help="Hugging Face config.json (MambaConfig or Mamba2Config)")
    p.add_argument("--weights", required=True, help="the whole model's .safetensors or .npz (a CausalLM checkpoint)")
    p.add_argument("--prompt-ids", help="prompt token ids, e.g. 1,2,3")
    p.add_argument("--prompt-file", help="prompt token ids: an integer .npy, or text of ids")
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--arch", help="whose schedules run, and whose predicted speed is shown (default: cpu with "
                                  "numba, h200 with triton)")
    p.add_argument("--backend", default="numba", choices=["numba", "triton"],
                   help="numba: compiled CPU kernels; triton: generated GPU kernels (a CUDA GPU, or TRITON_INTERPRET=1)")
    p.add_argument("--matmul-precision", default="fp32", choices=["fp32", "tf32", "bf16"],
                   help="tl.dot operand precision of the triton backend")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the config's end-of-sequence id")
    _jobs_arg(p)
    p.add_argument("-o", "--output", help="also write the new ids: .npy (int64) or text (comma-separated)")
    p.add_argument("--json", action="store_true", help='print one JSON object: {"prompt", "tokens", "tokens_per_s", ...}')
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("report", help="Markdown + self-contained HTML fusion report with figures and mapping.json")
    _cascade_args(p)
    p.add_argument("--arch", action="append", required=True,
                   help=f"architecture ({_shipped('archs')}, or a spec file; repeat for a side-by-side "
                        "comparison)")
    p.add_argument("--objective", default="latency", choices=["latency", "traffic"])
    p.add_argument("-o", "--output", required=True, help="output folder (written atomically)")
    _jobs_arg(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("sweep", help="optimal mapping over a grid of params x arch overrides -> CSV/Parquet")
    _cascade_args(p)
    p.add_argument("--arch", action="append", required=True,
                   help=f"architecture ({_shipped('archs')}, or a spec file; repeatable)")
    p.add_argument("--set-range", action="append", metavar="K=V1,V2,...",
                   help="sweep a cascade param or 'model' over values (repeatable)")
    p.add_argument("--override", action="append", metavar="K=V1,V2,...",
                   help="sweep an arch figure, e.g. fusion_buffer_bytes=1MiB,4MiB (repeatable)")
    p.add_argument("--objective", default="latency", choices=["latency", "traffic"])
    p.add_argument("--workers", type=int, help="processes (default: all cores)")
    p.add_argument("-o", "--output", required=True, help="output table: .csv or .parquet")
    p.add_argument("--plot", help="also plot speedup over the first swept axis (.png/.svg/.pdf)")
    p.set_defaults(func=cmd_sweep)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        if getattr(args, "jobs", None) is None:
            return func(args)
        from mambalaya.mapper.space import search_jobs

        with search_jobs(args.jobs):
            return func(args)
    except MambalayaError as err:
        print(f"mambalaya {args.command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK


def entry() -> None:
    """The console script: :func:`main`, then out of the process without tearing its heap down object by object
    (a mapped layer leaves millions of small objects in the analysis caches: freeing them took 5 of the 19 s of
    ``map mamba2 --arch cpu``). Every file a command writes is closed by then (atomic writes); the standard
    streams are flushed here."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass
    os._exit(code)


if __name__ == "__main__":
    entry()
