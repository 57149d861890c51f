"""The command line: what `map` prints for each mapping method."""

from __future__ import annotations

import json

import pytest

from mambalaya.cli import main


def _map(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["map", "mamba1-decode", "--arch", "h200", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", ["cpsat", "layers", "downsets"])
def test_every_listed_method_reaches_the_same_optimum(capsys: pytest.CaptureFixture[str], method: str) -> None:
    """``--method layers`` is listed and, on a chain of layers, solves the space the MIP solves to the same optimum
    (neither called optimal: two 9-Einsum layers pass the default cap on groups crossing the boundary)."""
    ref = _map(capsys, "--layers", "2")
    got = _map(capsys, "--layers", "2", "--method", method)
    assert got["method"] == method and got["gap"] == 0
    assert not got["optimal"] and got["left_out"] == ref["left_out"]
    assert got["latency_s"] == pytest.approx(ref["latency_s"], rel=1e-9)
    assert got["traffic_bytes"] == ref["traffic_bytes"]


@pytest.mark.parametrize(("show", "marker"), [("schedule", "group 0: T, R, Y -- "), ("numba", "def kernel("),
                                              ("triton", "@triton.jit")])
def test_map_shows_the_schedule_its_backends_run(capsys, show: str, marker: str) -> None:
    assert main(["map", "mlp2", "--arch", "h200", "--show", show]) == 0
    out = capsys.readouterr().out
    shown = out[out.index("# group 0" if show != "schedule" else "group 0: "):]
    assert marker in shown
    if show == "schedule":  # every off-chip tensor is a statement of the loop nest
        assert all(f"load {t}[" in shown for t in ("A", "W1", "W2")) and "store staging_Y -> Y[" in shown


def test_map_output_file_keeps_tiles_and_loop_order(tmp_path, capsys) -> None:
    """The written mapping is the chosen one, tiles included, so ``verify --mapping`` runs what ``map`` chose."""
    import json

    from cost.conftest import TINY_ARCH

    from mambalaya.ir.mapping import load_mapping, mapping_from_dict

    arch = tmp_path / "tiny.yaml"
    arch.write_text(TINY_ARCH.replace("capacity: 1 MiB", "capacity: 2 KiB"))
    out = tmp_path / "m.yaml"
    assert main(["map", "mlp2", "--arch", str(arch), "-o", str(out), "--json"]) == 0
    chosen = mapping_from_dict(json.loads(capsys.readouterr().out)["mapping"])
    assert any(g.tiles for g in chosen.groups)  # the 2 KiB buffer makes the mapper tile
    assert load_mapping(out).groups == chosen.groups


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"mambalaya {version('mambalaya')}"


def test_analyze_lists_the_legal_groups_and_the_sizes_it_used(capsys: pytest.CaptureFixture[str]) -> None:
    """``analyze`` prints what its help promises: the edges' classes and the legal fusion groups (the largest
    20, or every one with ``--groups``), under the sizes it analysed, the given ones marked."""
    from mambalaya.analysis import analyze
    from mambalaya.parse import open_cascade

    assert main(["analyze", "mlp2", "--set", "M=8"]) == 0
    out = capsys.readouterr().out
    legal = analyze(open_cascade("mlp2", params={"M": 8})).legal_groups
    assert out.splitlines()[0].startswith("mlp2 with ") and "M=8*" in out.splitlines()[0]
    assert f"{len(legal)} legal fusion groups of" in out and "fusion classes of mlp2" in out
    largest = max(legal, key=lambda g: len(g.einsums))
    assert " ".join(largest.einsums) in out
    assert main(["analyze", "mlp2", "--groups", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["groups_legal"] == len(legal) and {tuple(g["einsums"]) for g in got["groups"] if g["legal"]} == \
        {tuple(g.einsums) for g in legal}


def test_every_arch_help_names_every_shipped_arch(capsys: pytest.CaptureFixture[str]) -> None:
    from mambalaya.arch import shipped_archs

    for command in ("map", "report", "sweep", "render"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(a in text for a in shipped_archs()), (command, text)


def test_a_chain_of_layers_on_an_arch_that_cannot_fuse_is_unfused(capsys: pytest.CaptureFixture[str]) -> None:
    """``map --layers N`` on marca (no fusion): every Einsum of every layer alone, proven optimal (it offered groups
    crossing the layer boundary and then refused its own answer)."""
    from mambalaya.ir.chain import chain_layers
    from mambalaya.parse import open_cascade

    got = _map_on(capsys, "marca", "--layers", "3")
    chained = chain_layers(open_cascade("mamba1-decode"), 3)
    assert got["optimal"] and all(len(g) == 1 for g in got["groups"])
    assert sorted(g[0] for g in got["groups"]) == sorted(chained.einsum_names)
    assert got["latency_s"] == pytest.approx(got["unfused"]["latency_s"], rel=1e-12)


def _map_on(capsys: pytest.CaptureFixture[str], arch: str, *args: str) -> dict:
    assert main(["map", "mamba1-decode", "--arch", arch, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_output_path_that_is_a_folder_is_refused_in_one_line(tmp_path, capsys) -> None:
    """Found by the fuzzing (tests/fuzz): ``map -o FOLDER`` raised IsADirectoryError from the atomic write."""
    assert main(["map", "mlp2", "--arch", "cpu", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "it is a folder" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["--max-memory", "--timeout"])
@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_limits_must_be_positive_numbers(capsys, option: str, value: str) -> None:
    """``--max-memory nan`` was a ValueError traceback."""
    with pytest.raises(SystemExit) as exc:
        main(["verify", "mlp2", option, value])
    assert exc.value.code == 2 and "must be a positive number" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "all"])
def test_jobs_must_be_a_whole_number_of_processes(capsys, value: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["map", "mlp2", "--arch", "cpu", "--jobs", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and ("must be at least 1" in err or "is not a whole number" in err), err


def test_verify_stops_at_its_timeout(capsys) -> None:
    """``verify --timeout``: exit 2 and one line once mapping, compiling and running take longer (this small
    Mamba-2's h200 mapping alone takes minutes; its size is its own, so no earlier test's searches are reused)."""
    assert main(["verify", "mamba2", "--arch", "h200", "--set", "seqlen=92", "--timeout", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did not finish within --timeout 0.5 s" in err, err


def test_mapping_shows_a_step_on_a_terminal(capsys, monkeypatch) -> None:
    """A GPU arch's mapping takes minutes: on a terminal ``map`` shows it as a step (silent when piped)."""
    from mambalaya.exec import verify

    real = verify.Progress.__init__
    monkeypatch.setattr(verify.Progress, "__init__", lambda self, show=None: real(self, True))
    assert main(["map", "mlp2", "--arch", "cpu", "--json"]) == 0
    assert "mapping mlp2 on cpu" in capsys.readouterr().err


def test_a_time_limit_stops_the_search_and_says_what_it_proved(capsys) -> None:
    """``--time-limit`` bounded only the MIP solve: the small Mamba-2 on h200 searched groups for minutes past it.
    Now no group is searched after it; the answer is the unfused baseline, not proven optimal, with its gap to the
    last lower bound a solve proved (this size is its own: no earlier test's searches are reused)."""
    assert main(["map", "mamba2", "--arch", "h200", "--set", "seqlen=76", "--time-limit", "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["optimal"] is False and got["method"].startswith("time limit") and 0 < got["gap"] <= 1
    assert "time limit of 1 s" in got["left_out"]
    assert all(len(g["einsums"]) == 1 for g in got["mapping"]["groups"])
    assert main(["map", "mlp2", "--arch", "cpu", "--time-limit", "600", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["optimal"] is True


def test_a_deadline_whose_first_alarm_is_lost_in_a_finalizer_still_stops_the_block() -> None:
    """An alarm that fires while a finalizer runs (a generator the collector closes) is lost there, and the verify
    ran on for minutes: the alarm repeats until one stops the block, and a lost one prints nothing."""
    import io
    import sys
    import time

    from mambalaya.cli import _deadline
    from mambalaya.errors import MambalayaError

    class Closes:
        def __del__(self) -> None:
            for _ in range(200):  # (the first alarm raises in here, where it cannot get out)
                time.sleep(0.01)

    err, lost = io.StringIO(), []
    real = sys.stderr
    sys.stderr = err
    try:
        with pytest.raises(MambalayaError, match="did not finish within --timeout 0.1 s"):
            with _deadline(0.1, "the block"):
                del_me = Closes()
                del del_me  # (the finalizer runs here, until the first alarm ends it)
                lost.append(True)
                for _ in range(200):
                    time.sleep(0.01)
    finally:
        sys.stderr = real
    assert lost == [True] and err.getvalue() == ""


def test_map_json_carries_a_certificate_of_what_it_proved(capsys) -> None:
    """``map --json``'s certificate: the optimum's value is the chosen groups' cost, the solver's lower bound is
    no more than it (equal when proven with no gap), every candidate is accounted for as searched, costed by a
    bound alone or pruned, and a chain whose crossing groups were capped says it is not proven over every group."""
    got = _map(capsys)
    cert = got["certificate"]
    assert cert["proven"] is got["optimal"] is True and cert["over"] == "every legal fusion group"
    assert cert["value"] == pytest.approx(got["latency_s"], rel=1e-9)
    assert cert["value"] - got["resolution"] * len(got["groups"]) <= cert["lower_bound"] <= cert["value"] * (1 + 1e-12)
    assert cert["searched"] + cert["pruned"]["costed_by_bound"] >= cert["candidates"] - sum(
        v for k, v in cert["pruned"].items() if k != "costed_by_bound")
    chain = _map(capsys, "--layers", "2")["certificate"]
    assert chain["proven"] is False and "more than 8 Einsums" in chain["over"]
    assert chain["searched"] >= cert["searched"] > 0  # (a chain's: its layer's searches and the crossing groups')
    assert main(["map", "mamba1-decode", "--arch", "h200"]) == 0
    assert "proven optimal over every legal fusion group" in capsys.readouterr().out


def test_map_check_moves_prices_every_neighbour_of_the_optimum(capsys) -> None:
    """``map --check-moves``: every mapping one move from the optimum built and priced, none better (the optimum's
    own check a user can run); a chain is refused with one line and exit 2."""
    got = _map(capsys, "--check-moves")["neighbours"]
    assert got["built"] > 0 and 0 < got["priced"] <= got["built"] and got["better"] == []
    assert got["best"]["ratio"] >= 1 - 1e-9 and got["best"]["kind"] in ("merge", "split")
    assert main(["map", "mamba1-decode", "--arch", "mambalaya", "--check-moves"]) == 0
    assert "mappings one move away" in capsys.readouterr().out
    assert main(["map", "mamba1-decode", "--arch", "mambalaya", "--check-moves", "--layers", "2"]) == 2
    assert "--check-moves checks one layer" in capsys.readouterr().err
