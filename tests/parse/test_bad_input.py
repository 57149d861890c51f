"""The parser's bad-input catalogue: each malformed cascade is one clear line, exit 2.

Every case goes through the real command line (``mambalaya analyze FILE``), and
the message must name the file, the line and the problem.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from mambalaya.cli import main

GOOD_HEAD = """\
name: bad
params: {M: 8, K: 4, N: 6}
ranks: {m: M, k: K, n: N}
"""

# (id, cascade text, expected line, words the message must contain)
CASES = [
    ("unknown-rank", GOOD_HEAD + "einsums:\n  - Y[m,n] = A[m,z] * B[z,n]\n", 5, "unknown rank 'z'"),
    ("rank-two-sizes", GOOD_HEAD + "einsums:\n  - T[m,k] = A[m,k] * 2\n  - Y[m,n] = T[m,n] * B[n]\n", 6,
     "two sizes"),
    ("syntax", GOOD_HEAD + "einsums:\n  - Y[m,n] = A[m,k] * * B[k,n]\n", 5, "expected a tensor"),
    ("unclosed-bracket", GOOD_HEAD + "einsums:\n  - Y[m,n] = A[m,n\n", 5, "expected ']'"),
    ("unknown-function", GOOD_HEAD + "einsums:\n  - Y[m,n] = gelu(A[m,n])\n", 5, "unknown function 'gelu'"),
    ("cycle", GOOD_HEAD + "einsums:\n  - T[m,n] = Y[m,n] + A[m,n]\n  - Y[m,n] = T[m,n] * 2\n", 5,
     "not a recurrence"),
    ("code-in-size", "name: bad\nparams: {M: 8}\nranks: {m: \"__import__('os').system('true')\"}\n"
     "einsums:\n  - Y[m] = A[m]\n", 3, "unexpected character '_'"),
    ("missing-param", "name: bad\nparams: {M: 8}\nranks: {m: M, n: Q}\neinsums:\n  - Y[m,n] = A[m,n]\n", 3,
     "unknown name 'Q'"),
    ("zero-size", "name: bad\nparams: {M: 0}\nranks: {m: M}\neinsums:\n  - Y[m] = A[m] * 2\n", None,
     "must be positive"),
    ("negative-size", "name: bad\nparams: {M: 4}\nranks: {m: M - 9}\neinsums:\n  - Y[m] = A[m] * 2\n", None,
     "must be positive"),
    ("written-twice", GOOD_HEAD + "einsums:\n  - Y[m,n] = A[m,n]\n  - Y[m,n] = B[m,n]\n", 6, "written twice"),
    ("output-rank-missing", GOOD_HEAD + "einsums:\n  - Y[m,n] = A[m,k]\n", 5, "index no operand"),
    ("bad-recurrence", GOOD_HEAD + "einsums:\n  - H[m,n] = H[m-2,n] * A[m,n]\n", 5, "one step back"),
    ("yaml-syntax", "name: bad\nparams: {M: 8\nranks: {m: M}\neinsums: []\n", None, "YAML syntax error"),
    ("duplicate-key", "name: bad\nparams: {M: 8}\nranks: {m: M}\nranks: {m: M}\neinsums:\n  - Y[m] = A[m]\n", 4,
     "appears twice"),
    ("unknown-top-key", GOOD_HEAD + "einsum:\n  - Y[m] = A[m]\n", 4, "did you mean 'einsums'"),
    ("fractional-index", GOOD_HEAD + "tensors:\n  A: {shape: [M]}\neinsums:\n  - Y[m] = A[m/2]\n", 7,
     "not a whole number"),
    ("read-before-write", GOOD_HEAD + "einsums:\n  - Y[m,n] = T[m,n] * 2\n  - T[m,n] = A[m,n] + 1\n", 5,
     "before the Einsum that writes it"),
    ("reduce-absent-rank", GOOD_HEAD + "einsums:\n  - Y[m] = sum_n(A[m,k])\n", 5, "does not index its argument"),
    ("param-not-number", "name: bad\nparams: {M: eight}\nranks: {m: M}\neinsums:\n  - Y[m] = A[m]\n", 2,
     "must be a number"),
    ("unknown-dtype", GOOD_HEAD + "tensors:\n  A: {dtype: float8}\neinsums:\n  - Y[m] = A[m] * 2\n", 5,
     "unknown dtype"),
    ("not-a-mapping", "- just\n- a list\n", 1, "YAML mapping"),
    ("init-not-recurrence", GOOD_HEAD + "tensors:\n  Y: {init: Y0}\neinsums:\n  - Y[m] = A[m] * 2\n", 5,
     "not a recurrence"),
    ("output-index-expression", GOOD_HEAD + "einsums:\n  - Y[m+1] = A[m]\n", 5, "plain rank variables"),
    ("mistyped-role", GOOD_HEAD + "tensors:\n  A: {role: wieght}\neinsums:\n  - Y[m] = A[m] * 2\n", 5,
     "unknown role 'wieght' (did you mean 'weight'?)"),
    ("alias-bomb", "name: bad\n" + "".join(  # nine aliases of nine, nine deep: 9^9 values once expanded
        f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}" if i else "x"] * 9) + "]\n"
        for i in range(9)) + "params: {M: 8}\nranks: {m: M}\neinsums:\n  - Y[m] = A[m]\n", 1,
     "expands to more than 100000 values"),
    ("alias-cycle", "name: bad\na: &a [*a]\nparams: {M: 8}\nranks: {m: M}\neinsums:\n  - Y[m] = A[m]\n", 1,
     "an alias inside its own anchor"),
    # a generated file gone wrong: a 1 MB statement (it took 7 s and a traceback), brackets a thousand deep and a
    # sum of a thousand terms (each was a RecursionError), each refused at once with its line
    ("megabyte-line", GOOD_HEAD + "einsums:\n  - Y[m,n] = A[m,n]" + " + A[m,n]" * 120_000 + "\n", 5,
     "characters (at most 10000): split it"),
    ("deep-brackets", GOOD_HEAD + "einsums:\n  - Y[m,n] = " + "(" * 1000 + "A[m,n]" + ")" * 1000 + "\n", 5,
     "brackets nest more than 64 deep"),
    ("long-chain", GOOD_HEAD + "einsums:\n  - Y[m,n] = A[m,n]" + " + A[m,n]" * 1000 + "\n", 5,
     "1001 operations deep (at most 256"),
]


@pytest.mark.timeout(60)  # (an alias bomb hung the parser: expanded, it has 387 million values)
@pytest.mark.parametrize("case_id,text,line,words", CASES, ids=[c[0] for c in CASES])
def test_bad_cascade_is_one_clear_line(tmp_path, capsys, case_id, text, line, words):
    path = tmp_path / f"{case_id}.yaml"
    path.write_text(text)
    code = main(["analyze", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert str(path) in err
    if line is not None:
        assert f"{path}:{line}:" in err, err
    assert words in err, err


def test_catalogue_has_fifteen_distinct_problems():
    assert len({c[0] for c in CASES}) >= 15


def test_no_traceback_from_the_real_command(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD_HEAD + "einsums:\n  - Y[m,n] = softmaxx(A[m,n])\n")
    proc = subprocess.run([sys.executable, "-m", "mambalaya.cli", "analyze", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "unknown function 'softmaxx'" in proc.stderr


def test_set_of_unknown_param_is_exit_2(capsys):
    assert main(["analyze", "mamba2", "--set", "seqlenn=5"]) == 2
    assert "unknown param(s) seqlenn" in capsys.readouterr().err


def test_sizes_never_evaluate_code(tmp_path, capsys):
    marker = tmp_path / "pwned"
    text = textwrap.dedent(f"""\
        name: bad
        params: {{M: 8}}
        derived: {{Q: "open('{marker}', 'w')"}}
        ranks: {{m: M}}
        einsums:
          - Y[m] = A[m]
        """)
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["analyze", str(path)]) == 2
    assert not marker.exists()


@pytest.mark.parametrize("command", [["analyze", "{path}"], ["map", "mlp2", "--arch", "{path}"],
                                     ["verify", "mlp2", "--arch", "imax3", "--mapping", "{path}"]])
def test_a_file_that_is_not_utf8_text_is_one_line(tmp_path, capsys, command):
    """A cascade, an arch spec or a mapping in another encoding (or binary): exit 2, the byte named."""
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: café\n".encode("latin-1"))
    assert main([a.format(path=path) for a in command]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}:" in err and "not UTF-8 text (byte 0xe9" in err, err


@pytest.mark.timeout(60)
def test_an_alias_bomb_in_an_arch_spec_is_refused(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text("".join(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}" if i else "1"] * 9)
                            + "]\n" for i in range(9)) + "name: x\n")
    assert main(["map", "mlp2", "--arch", str(path)]) == 2
    assert "expands to more than" in capsys.readouterr().err


@pytest.mark.parametrize("written", ["1e-5", "-2.5E+3", "3e2", ".5"])
def test_a_number_yaml_reads_as_text_is_a_number(written):
    """YAML 1.1 reads ``1e-5`` (no dot) as a string: a param written so is the number a person means."""
    from mambalaya.parse import parse_cascade_text

    c = parse_cascade_text(f"name: n\nparams: {{M: 8, eps: {written}}}\nranks: {{m: M}}\neinsums:\n  - Y[m] = A[m]\n")
    assert c.params["eps"] == float(written)


def test_a_mistyped_cascade_name_offers_the_closest(capsys):
    assert main(["analyze", "mamba3"]) == 2
    err = capsys.readouterr().err
    assert "unknown cascade 'mamba3' (did you mean 'mamba2'?)" in err and "mlp2" in err


@pytest.mark.parametrize("value", ["-5", "0", "2.5"])
def test_a_bad_size_override_names_the_param_set(capsys, value):
    """``--set seqlen=-5`` is about seqlen, not the chunk count derived from it."""
    assert main(["analyze", "mamba2", "--set", f"seqlen={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"param seqlen={value}" in err and "positive whole number" in err and "derived" not in err, err


@pytest.mark.parametrize("text, line, what", [
    ("name: n\n[ranks]: {m: 4}\neinsums:\n  - Y[m] = A[m]\n", 2, "a key is a list or a map"),
    ("name: n\nparams: {M: !vocab: 4}\nranks: {m: M}\neinsums:\n  - Y[m] = A[m]\n", 2, "cannot read this value"),
])
def test_a_key_that_is_a_list_or_an_unknown_tag_names_its_line(tmp_path, capsys, text, line, what):
    """Found by the fuzzing (tests/fuzz): ``[ranks]: ...`` raised ``TypeError: unhashable type: 'list'`` and a tag
    safe YAML cannot construct (``!vocab:``) a ConstructorError traceback."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and what in err and f"{path}:{line}" in err, err


@pytest.mark.timeout(120)
def test_a_rank_of_a_trillion_maps(capsys):
    """Found by the fuzzing: tile options were the rank's divisors by trial division up to the rank, hours at 10^12
    (the mapper's tile search hung where analyze and the reference's memory check answer at once)."""
    assert main(["map", "mlp2", "--arch", "cpu", "--set", "M=1000000000000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["optimal"] is True
