"""The README's code runs as written: its Python blocks execute, its command lines parse, its synopsis
names only options the CLI has, and (slow) the newcomer's main job writes a report."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mambalaya.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```$", README, flags=re.M | re.S)


def _blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCKS if kind == lang]


def _mambalaya_commands() -> list[list[str]]:
    """Every ``mambalaya ...`` command in a bash or plain block, as argv (without the program); a synopsis line
    (``[--opt]``, ``a|b``, ``...``) is not a command."""
    out = []
    for kind, body in BLOCKS:
        if kind not in ("bash", ""):
            continue
        for line in body.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words and words[0].endswith("mambalaya") and not any(c in w for w in words for c in "|[") \
                        and "..." not in part:
                    out.append(words[1:])
    return out


def test_readme_has_the_blocks_it_promises() -> None:
    assert len(_blocks("python")) >= 1 and len(_mambalaya_commands()) >= 3


@pytest.mark.parametrize("argv", _mambalaya_commands(), ids=" ".join)
def test_readme_command_parses(argv: list[str]) -> None:
    """A command a reader copies is accepted by the parser (options, choices, required values)."""
    try:
        build_parser().parse_args(argv)
    except SystemExit as done:  # (``--version`` prints and leaves; a bad command exits 2)
        assert done.code == 0 and argv == ["--version"], argv


def test_synopsis_names_real_options() -> None:
    """The usage synopsis lists only options the subcommand really has."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    synopsis = next(body for kind, body in BLOCKS if "mambalaya analyze CASCADE" in body)
    for line in synopsis.splitlines():
        name = line.split()[1]
        if name.startswith("-"):  # (``mambalaya --version``: the program's own option)
            assert name in {o for a in parser._actions for o in a.option_strings}, line
            continue
        known = {o for a in sub.choices[name]._actions for o in a.option_strings}
        for opt in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", line):
            assert opt in known, f"README synopsis of {name} names {opt}, which the CLI does not have"


@pytest.mark.slow
def test_python_api_block_runs(tmp_path: Path) -> None:
    """The API example, in a fresh process in an empty folder (it writes demo-model/ there)."""
    (code,) = _blocks("python")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "demo-model" / "model.safetensors").is_file() and "speedup" in done.stdout
    assert "True" in done.stdout.splitlines()[0]  # the mapping it printed is proven optimal


@pytest.mark.slow
def test_main_job_writes_a_report(tmp_path: Path) -> None:
    """The README's first command (after the set-up), as a newcomer runs it."""
    first = next(body for kind, body in BLOCKS if kind == "bash")
    cmd = first.split("&&", 1)[1].strip()
    argv = shlex.split(cmd)
    argv[0] = str(Path(sys.executable).with_name("mambalaya"))
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / argv[argv.index("-o") + 1]
    assert (out / "report.html").stat().st_size > 10_000 and (out / "report.md").is_file()
