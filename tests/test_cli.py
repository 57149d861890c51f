"""The command line: what `map` prints for each mapping method."""

from __future__ import annotations

import json

import pytest

from mambalaya.cli import main


def _map(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["map", "mamba1", "--arch", "h200", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", ["cpsat", "layers"])
def test_every_listed_method_reaches_the_same_optimum(capsys: pytest.CaptureFixture[str], method: str) -> None:
    """``--method layers`` is listed and, on a chain of layers, proves the optimum the MIP proves."""
    ref = _map(capsys, "--layers", "2")
    got = _map(capsys, "--layers", "2", "--method", method)
    assert got["method"] == method and got["optimal"]
    assert got["latency_s"] == pytest.approx(ref["latency_s"], rel=1e-9)
    assert got["traffic_bytes"] == ref["traffic_bytes"]
