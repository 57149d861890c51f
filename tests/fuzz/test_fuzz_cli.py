"""Fuzzing the command line: random argument lists for every subcommand, run in-process through ``main``.

Options are drawn from the right subcommand and from the wrong ones, with valid, mutated or missing values; the
positional is a small shipped cascade, a mistyped name or a bad path. Valid combinations stay tiny (mlp2,
lm-head and attention at their shipped sizes, one worker), so a case that runs long is a hang, not work.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from fuzz.fuzzing import FUZZ, NUMBERS, check, listing, run_cli
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

CASCADES = ["mlp2", "lm-head", "attention", "mlp3", "MLP2", "mamba3", "", "-", "--", "mlp2.yaml", "cascades/mlp2.yaml"]
ARCH_NAMES = ["cpu", "marca", "mambalaya", "h2000", "CPU", "", "cpu.yaml", "archs/cpu.yaml", "../archs/cpu", "-"]
NUMS = ["0", "1", "2", "-1", "3.5", "1e3", "nan", "inf", "-inf", "x", "", "99999999999999999999", "1e999999999"]
SETS = ["M=2", "K=4", "N=3", "P=1", "seqlen=8", "heads=1", "vocab=16", "d_model=4", *(f"M={v}" for v in NUMBERS),
        "M", "=4", "M=", "M==4", "M=4=5", " M = 4 ", "nope=4", "M=__import__('os')", "M=2**70", "M=1e-400"]
RANGES = ["M=8,16", "M=8", "M=", "M", "M=a,b", "M=8,,16", "model=mamba-130m", "fusion_buffer_bytes=1MiB,4MiB",
          "clock_hz=1e9", "lanes=0", "nope=1,2", "M=1e999999999", "M=-1,0"]
#: each subcommand's options and the values drawn for them (None: a flag); "INPUT"/"OUTPUT" become paths
OPTIONS: dict[str, dict[str, list[str] | None]] = {
    "analyze": {"--json": None, "--model": ["mamba-130m", "mamba2-130m", "mamba-7b", ""], "--set": SETS},
    "render": {"--arch": ARCH_NAMES, "--mapping": ["INPUT"], "-o": ["OUTPUT"], "--model": ["mamba-130m"],
               "--set": SETS},
    "map": {"--arch": ARCH_NAMES, "--objective": ["latency", "traffic", "speed"], "--recompute": None,
            "--method": ["ilp", "cpsat", "exhaustive", "layers", "greedy"], "--layers": ["1", "2", *NUMS],
            "--mapping": ["INPUT"], "--time-limit": ["5", *NUMS], "-o": ["OUTPUT"], "--json": None,
            "--show": ["schedule", "numba", "triton", "cuda"], "--set": SETS},
    "verify": {"--arch": ARCH_NAMES, "--mapping": ["INPUT"], "--unfused": None,
               "--backend": ["numba", "python", "fortran"], "--matmul-precision": ["fp32", "bf16", "fp4"],
               "--dtype": ["float64", "float32", "int8"], "--seed": ["0", "7", "-1", "x"],
               "--max-memory": ["1", "0.0000001", *NUMS], "--timeout": ["30", *NUMS], "--json": None, "--set": SETS},
    "run": {"--config": ["INPUT"], "--weights": ["INPUT"], "--layer": NUMS, "--input": ["INPUT"], "-o": ["OUTPUT"],
            "--arch": ARCH_NAMES, "--backend": ["numba", "triton", "x"], "--matmul-precision": ["fp32", "x"]},
    "generate": {"--config": ["INPUT"], "--weights": ["INPUT"], "--prompt-ids": ["1,2,3", "", "a", "-1", "1,,2"],
                 "--prompt-file": ["INPUT"], "--max-new-tokens": ["1", *NUMS], "--arch": ARCH_NAMES,
                 "--backend": ["numba", "x"], "--ignore-eos": None, "-o": ["OUTPUT"], "--json": None},
    "report": {"--arch": ARCH_NAMES, "--objective": ["latency", "x"], "-o": ["OUTPUT"], "--set": SETS},
    "sweep": {"--arch": ARCH_NAMES, "--set-range": RANGES, "--override": RANGES,
              "--objective": ["latency", "traffic", "x"], "--workers": ["1", "0", "-2", "x", "1.5"],
              "-o": ["OUTPUT"], "--plot": ["OUTPUT"], "--set": SETS},
}
STRAY_ARGS = ["--frobnicate", "-x", "--json=1", "--help", "-h", "--arch=", "--set", "--", "-", "-o", "--ver",
              "--a", "\x00", "\udcff", "é", " ", "--set=M=4", "--arch=cpu"]
#: inputs: missing, a folder, empty, not UTF-8, a garbage YAML, a cascade where something else is wanted
INPUT_FILES = {"empty.yaml": b"", "binary.npy": b"\x93NUMPY\xff\x00garbage", "bad.yaml": b"{[: nope",
               "list.json": b"[1, 2", "ids.txt": b"1,2,x", "latin1.yaml": b"name: caf\xe9\n",
               "mapping.yaml": b"cascade: mlp2\ngroups: [[T, R], [Y]]\n"}
OUTPUT_NAMES = ["out.svg", "out.png", "out.pdf", "out.txt", "out.csv", "out.parquet", "out.yaml", "out.json",
                "out.npy", "report", "missing/out.svg", "", ".", "out.svg/"]


#: what a tidy case adds so that the command can succeed: its required options
REQUIRED = {"render": ["-o", "OUTPUT"], "map": ["--arch", "cpu"], "report": ["--arch", "cpu", "-o", "OUTPUT"],
            "sweep": ["--arch", "cpu", "-o", "OUTPUT"]}


@st.composite
def argv(draw: st.DrawFn, inputs: Path, outputs: Path) -> list[str]:
    """A subcommand (or none, or a wrong one), a positional, and up to five options with drawn values.

    Half the cases are tidy (a small shipped cascade, the command's own options, each with a value, and the
    required ones), so the valid paths run too; the rest mix in other commands' options, strays, missing values
    and shuffles."""
    tidy = draw(st.booleans())
    commands = [c for c in OPTIONS if c not in ("run", "generate")] if tidy else \
        [*OPTIONS, *OPTIONS, "analyse", "", "--help", "help"]
    command = draw(st.sampled_from(commands))
    args = [command] if command else []
    if command in OPTIONS and command not in ("run", "generate") and (tidy or draw(st.integers(0, 5))):
        args.append(draw(st.sampled_from(["mlp2", "lm-head", "attention"] if tidy else CASCADES + ["INPUT"])))
    own = OPTIONS.get(command, {})
    every = {k: v for opts in OPTIONS.values() for k, v in opts.items()}
    for _ in range(draw(st.integers(0, 3 if tidy else 5))):
        source = own if own and (tidy or draw(st.integers(0, 4))) else every
        name = draw(st.sampled_from(sorted(source)))
        if not tidy and not draw(st.integers(0, 12)):
            args.append(draw(st.sampled_from(STRAY_ARGS)))
            continue
        args.append(name)
        values = source[name]
        if values is not None and (tidy or draw(st.integers(0, 9))):  # (sometimes the value is missing)
            args.append(draw(st.sampled_from(values)))
    if tidy:
        args += REQUIRED.get(command, [])
    elif draw(st.integers(0, 4)) == 0 and len(args) > 1:
        args = draw(st.permutations(args))
    paths = {"INPUT": lambda: str(inputs / draw(st.sampled_from([*INPUT_FILES, "absent.yaml", "", "."]))),
             "OUTPUT": lambda: str(outputs / draw(st.sampled_from(OUTPUT_NAMES)))}
    return [paths[a]() if a in paths else a for a in args]


@FUZZ
@given(data=st.data())
def test_any_argument_list_succeeds_or_fails_in_one_line_writing_nothing(data) -> None:
    """Every argument list: success, a verify mismatch, or one error line; a failure writes no output."""
    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = Path(tmp) / "in", Path(tmp) / "out"
        inputs.mkdir()
        outputs.mkdir()
        for name, content in INPUT_FILES.items():
            (inputs / name).write_bytes(content)
        o = check(run_cli(data.draw(argv(inputs, outputs), label="argv")))
        if o.code == 2:
            assert listing(outputs) == [], (o.argv, o.err, listing(outputs))
        assert sorted(p.name for p in inputs.iterdir()) == sorted(INPUT_FILES), "an input was changed"


@FUZZ
@given(args=st.lists(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12), max_size=6))
def test_random_text_arguments_never_crash(args) -> None:
    """Arbitrary strings as arguments (no subcommand or a garbled one): a usage line, never a traceback."""
    check(run_cli(args), allowed=(0, 2))
