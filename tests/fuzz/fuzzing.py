"""Mutation strategies over the shipped cascades and arch specs, and the harness every fuzz target shares.

A fuzz case is a mutated file (or a random argument list) run through ``mambalaya.cli.main`` in-process, under
a wall-clock budget. Whatever the input, the command must end in success (0, or 1 for a verify MISMATCH) or in
exit 2 with exactly one line on stderr, never a traceback or a hang, and write nothing when it fails.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from mambalaya.cli import main

REPO = Path(__file__).resolve().parents[2]
CASCADES = sorted((REPO / "cascades").glob("*.yaml"))
ARCHS = sorted((REPO / "archs").glob("*.yaml"))
#: cascades whose mapping takes well under a second on the cpu arch (the rest are analysed and rendered only)
SMALL_CASCADES = [p for p in CASCADES if p.stem in ("mlp2", "attention", "lm-head")]
TEXTS = {p: p.read_text(encoding="utf-8") for p in (*CASCADES, *ARCHS)}
#: the same files without their comments (the specs are mostly comments: a mutation there tests nothing)
BARE = {p: "\n".join(line for line in (re.sub(r"(^|\s)#.*", "", x).rstrip() for x in t.splitlines()) if line) + "\n"
        for p, t in TEXTS.items()}

#: examples per target: a few hundred keep the suite within minutes on 2 cores; raise it to search longer
EXAMPLES = int(os.environ.get("MAMBALAYA_FUZZ_EXAMPLES", "150"))
#: seconds one case may take: a hang detector, not a speed test (an alias bomb ran > 60 s, a rank of 10^12 hours in
#: the tile search); the slowest valid case takes under 5 s alone and up to 17 s on two cores busy with the rest of
#: the suite, so the budget sits far above any load
BUDGET_S = float(os.environ.get("MAMBALAYA_FUZZ_BUDGET_S", "120"))

FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,  # the same cases on every run, so CI is reproducible
    database=None,
    deadline=None,  # the per-case budget below is the limit; the first case also pays for imports
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
    # no explain phase: its line tracer slows PyYAML's scanner on deep nesting 30-fold, past the case budget
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)

# ---- the harness ------------------------------------------------------------------------------------------


class CaseTimeout(BaseException):
    """Raised by the alarm in a case past its budget (a BaseException, so no ``except Exception`` eats it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block after ``seconds`` of wall time; an alarm already set (pytest-timeout's) is restored."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only; the elapsed time is still checked by the caller
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"the case ran past its {seconds} s budget")

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay:
            left = max(old_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)


@dataclass
class Outcome:
    argv: list[str]
    code: int
    out: str
    err: str
    seconds: float


def run_cli(argv: Sequence[str], budget_s: float = BUDGET_S) -> Outcome:
    """``mambalaya ARGV`` in-process, its stdout and stderr captured, under the wall-clock budget."""
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), time_limit(budget_s):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse: usage errors and --help
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    seconds = time.monotonic() - start
    assert seconds < budget_s, f"{argv}: took {seconds:.1f} s (budget {budget_s} s)"
    return Outcome(list(argv), code, out.getvalue(), err.getvalue(), seconds)


def check(outcome: Outcome, allowed: tuple[int, ...] = (0, 1, 2)) -> Outcome:
    """The contract every command keeps on any input: 0/1, or 2 with one error line; never a traceback."""
    o = outcome
    assert o.code in allowed, f"{o.argv}: exit {o.code}\n{o.err}"
    assert "Traceback" not in o.err, f"{o.argv}: a traceback on stderr\n{o.err}"
    if o.code == 2:
        lines = o.err.rstrip("\n").split("\n")
        assert len(lines) == 1 and lines[0].strip(), f"{o.argv}: exit 2 needs one error line, got {o.err!r}"
        assert lines[0].startswith("mambalaya"), f"{o.argv}: the error does not name the command: {o.err!r}"
    return o


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ---- mutations of text ------------------------------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\S", re.S)
_NUMBER = re.compile(r"\d")
_IDENT = re.compile(r"[A-Za-z_]")

#: what a mutated number becomes: huge, negative, zero, fractional, out of float range, not a number
NUMBERS = ["0", "-1", "-64", "1", "2", "3", "7", "0.5", "1.5", "0.0", "-0", "1e3", "2.5e-3", "1e30", "1e308",
           "1e400", "1e-400", "1e999999999", "1e-999999999", "123456789012345678901234567890",
           "18446744073709551617", "4294967296", "2147483648", "nan", ".nan", ".inf", "-.inf", "inf", "0x10",
           "0o17", "1_000", "1,000", "10**40", "2^70", "abc", "", "~", "null", "true", "\u0661\u0662"]
#: stray tokens: YAML syntax, tags, anchors, quotes, code
STRAYS = ["[", "]", "{", "}", ":", ",", "-", "*", "&a", "*a", "!!python/object/apply:os.system ['true']",
          "!!binary", "!!int", "!!float", "!!map", "!!set", "!!omap", "<<", "'", '"', "#", "|", ">", "%", "@",
          "`", "\t", "\n", "...", "---", "?", "__import__('os')", "lambda", "where", "and", "sum_m", "max_k",
          "exp", "silu", "=", "==", "<=", "**", "//", "(", ")", "ceil(", "min(1,", "\\", "\u00e9", "\U0001f600"]


def tokens(text: str) -> list[re.Match[str]]:
    return list(_TOKEN.finditer(text))


def splice(text: str, tok: re.Match[str], new: str) -> str:
    return text[: tok.start()] + new + text[tok.end():]


@st.composite
def token_mutation(draw: st.DrawFn, text: str) -> str:
    """Replace, delete or duplicate one token, swap two identifiers, change a number or an index letter."""
    toks = tokens(text)
    if not toks:
        return text
    op = draw(st.sampled_from(["replace", "delete", "duplicate", "swap", "number", "index", "stray"]))
    if op == "number":
        nums = [t for t in toks if _NUMBER.match(t.group())]
        if nums:
            tok = draw(st.sampled_from(nums))
            return splice(text, tok, draw(st.sampled_from(NUMBERS)))
        op = "replace"
    if op == "index":
        letters = [t for t in toks if len(t.group()) == 1 and t.group().isalpha()]
        if letters:
            tok = draw(st.sampled_from(letters))
            return splice(text, tok, draw(st.sampled_from("abcdefghijklmnopqrstuvwxyzABMNKz_")))
        op = "swap"
    if op == "swap":
        idents = sorted({t.group() for t in toks if _IDENT.match(t.group())})
        if len(idents) >= 2:
            i = draw(st.integers(0, len(idents) - 1))
            a, b = idents[i], idents[(i + draw(st.integers(1, len(idents) - 1))) % len(idents)]
            if draw(st.booleans()):  # every occurrence: a consistent rename of two names into each other
                return re.sub(rf"\b({re.escape(a)}|{re.escape(b)})\b", lambda m: b if m.group() == a else a, text)
            ta = draw(st.sampled_from([t for t in toks if t.group() == a]))
            tb = draw(st.sampled_from([t for t in toks if t.group() == b]))
            first, second = sorted((ta, tb), key=lambda t: t.start())
            return (text[: first.start()] + second.group() + text[first.end(): second.start()] + first.group()
                    + text[second.end():])
        op = "replace"
    tok = draw(st.sampled_from(toks))
    if op == "delete":
        return splice(text, tok, "")
    if op == "duplicate":
        return splice(text, tok, tok.group() * draw(st.integers(2, 3)))
    if op == "stray":
        return splice(text, tok, draw(st.sampled_from(STRAYS)))
    pool = sorted({t.group() for t in toks})  # replace: by another token of the same file, or a stray one
    return splice(text, tok, draw(st.sampled_from(pool + STRAYS + NUMBERS)))


@st.composite
def nesting_mutation(draw: st.DrawFn, text: str) -> str:
    """Replace one token with a value nested hundreds or thousands deep (flow lists or maps)."""
    toks = tokens(text)
    if not toks:
        return text
    tok = draw(st.sampled_from(toks))
    depth = draw(st.sampled_from([2, 10, 100, 500, 2000, 20000]))
    opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}"), ("[{a: ", "}]")]))
    return splice(text, tok, opener * depth + tok.group() + closer * depth)


# ---- mutations of the YAML structure ----------------------------------------------------------------------

WRONG_TYPES: list[Any] = [None, True, False, 0, -1, 1.5, 10**30, "", "x", "1 GB/s", [], {}, [1, 2], {"a": 1},
                          [[]], {"a": {"b": None}}, ["Y[m] = A[m]"], float("nan"), float("inf")]


def _paths(root: Any, most: int = 2000) -> list[tuple]:
    """Paths to the values of a loaded document (each container once: an alias cycle is not walked round)."""
    out: list[tuple] = []
    seen: set[int] = set()
    stack: list[tuple[Any, tuple]] = [(root, ())]
    while stack and len(out) < most:
        node, prefix = stack.pop()
        out.append(prefix)
        if isinstance(node, (dict, list)) and id(node) not in seen:
            seen.add(id(node))
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((v, (*prefix, k)) for k, v in items)
    return out


def _get(root: Any, path: tuple) -> Any:
    for step in path:
        root = root[step]
    return root


@st.composite
def structure_mutation(draw: st.DrawFn, text: str) -> str:
    """Drop a key, give a value the wrong type, or share a value by an anchor and aliases (a cycle too)."""
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError):
        return text
    paths = [p for p in _paths(data) if p]
    if not paths:
        return text
    op = draw(st.sampled_from(["drop", "wrong-type", "alias", "cycle", "size"]))
    path = draw(st.sampled_from(paths))
    parent, key = _get(data, path[:-1]), path[-1]
    if op == "drop":
        del parent[key]
    elif op == "wrong-type":
        value = parent[key]
        options = list(WRONG_TYPES)
        if isinstance(value, dict):
            options += [list(value.values()), list(value.items()), list(value)]
        elif isinstance(value, list):
            options += [dict(enumerate(value)), {str(v): v for v in value if not isinstance(v, (list, dict))}]
        else:
            options += [[value], {value if not isinstance(value, (list, dict)) else "k": value}]
        parent[key] = draw(st.sampled_from(options))
    elif op == "alias":  # the same object in two places: the dumper writes &id001 ... *id001
        parent[key] = _get(data, draw(st.sampled_from(paths)))
    elif op == "cycle":  # a container holding itself: &id001 [*id001]
        holder: list[Any] = [parent[key]]
        holder.append(holder)
        parent[key] = holder
    else:  # size: a param (or any number) set to a bad or extreme value
        numbers = [p for p in paths if isinstance(_get(data, p), (int, float)) and not isinstance(_get(data, p), bool)]
        if numbers:
            path = draw(st.sampled_from(numbers))
            parent, key = _get(data, path[:-1]), path[-1]
        parent[key] = draw(st.sampled_from([0, -1, -(2**63), 1, 3, 10**6, 2**31, 2**40, 10**12, 10**30, 2**64 + 1,
                                            10**400, 0.5, 1e-9, 1e300, float("inf"), float("nan"), "12", "x", None]))
    try:
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=draw(st.sampled_from([False, None, True])),
                              allow_unicode=True)
    except (yaml.YAMLError, RecursionError, ValueError):
        return text


# ---- mutations of the bytes -------------------------------------------------------------------------------

BAD_BYTES = [b"\x00", b"\xff", b"\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82",
             b"\xef\xbb\xbf", b"\r", b"\x1b[2J", b"\x85", b"\xc2\xa0"]


@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    """Flip a bit, insert random or invalid-UTF-8 bytes or NULs, delete a run, truncate, or re-encode."""
    op = draw(st.sampled_from(["flip", "insert", "bad", "nul", "delete", "truncate", "encoding"]))
    if op == "encoding":
        return data.decode("utf-8", "replace").encode(draw(st.sampled_from(["utf-16", "utf-32", "latin-1"])),
                                                       "replace")
    if not data:
        return draw(st.binary(max_size=8))
    i = draw(st.integers(0, len(data) - 1))
    if op == "flip":
        return data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1:]
    if op == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
    if op == "bad":
        return data[:i] + draw(st.sampled_from(BAD_BYTES)) + data[i:]
    if op == "nul":
        return data[:i] + b"\x00" * draw(st.integers(1, 4)) + data[i:]
    if op == "delete":
        return data[:i] + data[i + draw(st.integers(1, 64)):]
    return data[:i]


@st.composite
def mutated_file(draw: st.DrawFn, files: Sequence[Path]) -> tuple[str, bytes]:
    """A shipped file, one to three mutations of its text and maybe some of its bytes: (its name, the bytes)."""
    path = draw(st.sampled_from(list(files)))
    text = draw(st.sampled_from([BARE[path], BARE[path], TEXTS[path]]))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from([token_mutation, token_mutation, structure_mutation, nesting_mutation]))
        if kind is structure_mutation:
            try:
                yaml.safe_load(text)
            except (yaml.YAMLError, RecursionError):
                kind = token_mutation  # the text is already no YAML: keep mutating tokens
        text = draw(kind(text))
    data = text.encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0 if text not in (TEXTS[path], BARE[path]) else 1, 2))):
        data = draw(byte_mutation(data))
    return path.stem, data
