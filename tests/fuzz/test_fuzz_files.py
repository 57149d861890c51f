"""Fuzzing the file readers: mutated shipped cascades and arch specs through the real commands.

Each case writes one mutated file (tokens, sizes, YAML structure or raw bytes changed) and runs a quick command
on it in-process; :func:`fuzz.fuzzing.check` holds it to the CLI's contract (0/1, or 2 with one error line, within
the budget), and a failed command must leave its output folder empty.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from fuzz.fuzzing import ARCHS, CASCADES, FUZZ, NUMBERS, SMALL_CASCADES, check, listing, mutated_file, run_cli
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

#: --set overrides: a shipped cascade's param names (and one it lacks), valid and invalid values
SET_ITEMS = st.builds(lambda k, v: f"{k}={v}",
                      st.sampled_from(["M", "K", "N", "seqlen", "batch", "d_model", "vocab", "heads", "nope", ""]),
                      st.sampled_from(["1", "2", "4", *NUMBERS]))


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / f"{name}.yaml"
    path.write_bytes(data)
    return path


@FUZZ
@given(case=mutated_file(CASCADES), as_json=st.booleans(), sets=st.lists(SET_ITEMS, max_size=1))
def test_a_mutated_cascade_is_analysed_or_refused_in_one_line(case, as_json, sets) -> None:
    """analyze reads any bytes as a cascade: a table (or JSON), or one line naming what is wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), *case)
        opts = [f"--set={s}" for s in sets] + (["--json"] if as_json else [])
        check(run_cli(["analyze", str(path), *opts]))


@FUZZ
@given(case=mutated_file(CASCADES), suffix=st.sampled_from([".svg", ".png"]))
def test_a_mutated_cascade_is_rendered_or_refused_writing_nothing(case, suffix) -> None:
    """render writes its drawing only on success: a refused cascade leaves the output folder empty."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        path = _write(Path(tmp), *case)
        o = check(run_cli(["render", str(path), "-o", str(out / f"drawing{suffix}")]), allowed=(0, 2))
        assert listing(out) == ([f"drawing{suffix}"] if o.code == 0 else []), (o.argv, o.err)


@FUZZ
@given(case=mutated_file(SMALL_CASCADES), objective=st.sampled_from(["latency", "traffic"]), save=st.booleans())
def test_a_mutated_small_cascade_is_mapped_or_refused_writing_nothing(case, objective, save) -> None:
    """map on the cpu arch: a mapping report, or one line; ``-o`` is written on success only."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        path = _write(Path(tmp), *case)
        opts = ["-o", str(out / "mapping.yaml")] if save else []
        o = check(run_cli(["map", str(path), "--arch", "cpu", "--objective", objective, *opts]), allowed=(0, 2))
        assert listing(out) == (["mapping.yaml"] if o.code == 0 and save else []), (o.argv, o.err)


@FUZZ
@given(case=mutated_file(ARCHS), cascade=st.sampled_from(["mlp2", "lm-head"]), as_json=st.booleans())
def test_a_mutated_arch_spec_maps_or_is_refused_in_one_line(case, cascade, as_json) -> None:
    """A mutated spec either loads into an arch the mapper can price, or is refused naming its file and line."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        path = _write(Path(tmp), *case)
        opts = ["--json"] if as_json else []
        o = check(run_cli(["map", cascade, "--arch", str(path), "-o", str(out / "m.json"), *opts]), allowed=(0, 2))
        assert listing(out) == (["m.json"] if o.code == 0 else []), (o.argv, o.err)
        if o.code == 2:
            assert str(path) in o.err or "--arch" in o.err, f"the error does not name the spec: {o.err!r}"


def test_the_shipped_files_pass_unmutated() -> None:
    """The harness itself: every shipped file is accepted, so a refusal in the fuzz cases is the mutation's."""
    for path in CASCADES:
        assert check(run_cli(["analyze", str(path)])).code == 0
    for path in ARCHS:
        assert check(run_cli(["map", "mlp2", "--arch", str(path)])).code == 0
