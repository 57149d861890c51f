"""explore(): grid order, rows equal to single optimal_mapping calls, infeasible rows, bad input, sweep CLI."""

from __future__ import annotations

import os
import time

import pandas as pd
import pytest

from mambalaya.arch import load_arch
from mambalaya.cli import main
from mambalaya.errors import MambalayaError
from mambalaya.mapper import evaluate, optimal_mapping
from mambalaya.parse import open_cascade
from mambalaya.study import explore
from mambalaya.study.output import parse_ranges

SWEEP = {"M": [32, 64, 128, 256, 512], "N": [16, 32, 64, 128, 256]}
OVERRIDES = {"fusion_buffer_bytes": ["1 KiB", "64 KiB"], "offchip_bandwidth": [1e11, 1e12]}


def _check_rows_match_single_calls(df: pd.DataFrame, picks: list[int]) -> None:
    base = open_cascade("mlp2")
    for i in picks:
        row = df.iloc[i]
        cascade = base.with_params(M=int(row["M"]), N=int(row["N"]))
        arch = load_arch(row["arch"]).with_overrides(
            fusion_buffer_bytes=int(row["fusion_buffer_bytes"]), offchip_bandwidth=float(row["offchip_bandwidth"])
        )
        res = optimal_mapping(cascade, arch)
        unfused = evaluate(cascade, arch)
        assert row["feasible"]
        assert row["traffic_bytes"] == res.report.traffic_bytes
        assert row["latency_s"] == pytest.approx(res.report.latency_s, rel=1e-12)
        assert row["unfused_latency_s"] == pytest.approx(unfused.latency_s, rel=1e-12)
        assert row["speedup"] == pytest.approx(unfused.latency_s / res.report.latency_s, rel=1e-12)
        assert row["groups"] == len(res.groups)


def test_grid_order_and_columns():
    df = explore("mlp2", ["mambalaya", "h200"], sweep={"M": [64, 128]},
                 arch_overrides={"fusion_buffer_bytes": ["1 KiB", 65536]}, workers=1, progress=False)
    assert list(df[["M", "arch", "fusion_buffer_bytes"]].itertuples(index=False, name=None)) == [
        (64, "mambalaya", 1024), (64, "mambalaya", 65536), (64, "h200", 1024), (64, "h200", 65536),
        (128, "mambalaya", 1024), (128, "mambalaya", 65536), (128, "h200", 1024), (128, "h200", 65536),
    ]
    for col in ("feasible", "reason", "traffic_bytes", "latency_s", "unfused_traffic_bytes", "unfused_latency_s",
                "speedup", "optimal", "mapping"):
        assert col in df.columns
    assert df["feasible"].all() and (df["speedup"] > 0).all()


def test_parallel_sweep_matches_serial_and_single_calls():
    kw = {"sweep": {"M": [32, 64, 128], "N": [16, 64]}, "arch_overrides": {"fusion_buffer_bytes": ["1 KiB", "64 KiB"]}}
    par = explore("mlp2", ["mambalaya", "h200"], workers=2, progress=False, **kw)
    ser = explore("mlp2", ["mambalaya", "h200"], workers=1, progress=False, **kw)
    assert len(par) == 24
    pd.testing.assert_frame_equal(par.drop(columns="solve_s"), ser.drop(columns="solve_s"))
    par["offchip_bandwidth"] = par["offchip_bandwidth"].astype(float)
    _check_rows_match_single_calls(par, [0, 7, 23])


@pytest.mark.slow
def test_200_point_sweep():
    start = time.perf_counter()
    df = explore("mlp2", ["mambalaya", "h200"], sweep=SWEEP, arch_overrides=OVERRIDES, progress=False)
    elapsed = time.perf_counter() - start
    assert len(df) == 200 and df["feasible"].all()
    _check_rows_match_single_calls(df, [0, 57, 133, 199])
    assert elapsed < 120, elapsed


def test_model_sweep_sets_model_params():
    df = explore("mamba1", "marca", sweep={"model": ["mamba-130m", "mamba-370m"], "seqlen": [8]}, workers=1,
                 progress=False)
    assert list(df["model"]) == ["mamba-130m", "mamba-370m"]
    assert df["unfused_traffic_bytes"].iloc[1] > df["unfused_traffic_bytes"].iloc[0]


def test_infeasible_points_are_rows_not_crashes():
    df = explore("mlp2", "mambalaya", arch_overrides={"fusion_buffer_bytes": [1, "64 KiB"]}, workers=1,
                 progress=False)
    assert list(df["feasible"]) == [False, True]
    # not even the unfused baseline fits one byte: the row says so, with the bytes it would need
    assert "fits mambalaya" in df["reason"].iloc[0] and "needs at least" in df["reason"].iloc[0]
    assert pd.isna(df["latency_s"].iloc[0]) and pd.isna(df["unfused_latency_s"].iloc[0])
    assert df["unfused_latency_s"].iloc[1] > df["latency_s"].iloc[1] > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sweep": {"seqlenn": [1]}}, "unknown sweep param 'seqlenn'"),
        ({"arch_overrides": {"fusion_buffer": [1]}}, "unknown arch override 'fusion_buffer'"),
        ({"arch_overrides": {"fusion_buffer_bytes": ["lots"]}}, "fusion_buffer_bytes"),
        ({"sweep": {"model": ["mamba-9b"]}}, "unknown model"),
        ({"sweep": {"seqlen": []}}, "no values"),
        ({"objective": "energy"}, "unknown objective"),
    ],
)
def test_bad_input_fails_before_work(kwargs, message):
    start = time.perf_counter()
    with pytest.raises(MambalayaError, match=message):
        explore("mamba1", "mambalaya", progress=False, **kwargs)
    assert time.perf_counter() - start < 5


def test_parse_ranges():
    assert parse_ranges(["seqlen=2048, 4096", "fusion_buffer_bytes=1MiB"], "--x") == {
        "seqlen": [2048, 4096], "fusion_buffer_bytes": ["1MiB"]}
    with pytest.raises(MambalayaError, match="given twice"):
        parse_ranges(["a=1", "a=2"], "--x")
    with pytest.raises(MambalayaError, match="name=value"):
        parse_ranges(["a="], "--x")


def test_sweep_cli_csv_and_plot(tmp_path, capsys):
    out, plot = tmp_path / "s.csv", tmp_path / "s.png"
    rc = main(["sweep", "mlp2", "--arch", "mambalaya", "--set-range", "M=64,128,256", "--override",
               "fusion_buffer_bytes=1,1KiB", "--workers", "1", "-o", str(out), "--plot", str(plot)])
    assert rc == 0
    df = pd.read_csv(out)
    assert len(df) == 6 and list(df["feasible"]) == [False, True] * 3
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert sorted(os.listdir(tmp_path)) == ["s.csv", "s.png"]  # no temporary debris


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set-range", "nope=1"], "unknown sweep param 'nope'"),
        (["--override", "bandwidth=1"], "unknown arch override 'bandwidth'"),
        (["-o", "{tmp}/x.xlsx"], "use a .csv or .parquet"),
        (["-o", "{tmp}/missing/x.csv"], "does not exist"),
    ],
)
def test_sweep_cli_bad_input(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "-o" not in argv:
        argv += ["-o", str(tmp_path / "x.csv")]
    rc = main(["sweep", "mlp2", "--arch", "mambalaya", *argv])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_parquet_needs_pyarrow(tmp_path, capsys):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        rc = main(["sweep", "mlp2", "--arch", "mambalaya", "-o", str(tmp_path / "x.parquet")])
        assert rc == 2 and "pyarrow" in capsys.readouterr().err
    else:
        rc = main(["sweep", "mlp2", "--arch", "mambalaya", "--set-range", "M=64,128", "-o",
                   str(tmp_path / "x.parquet")])
        assert rc == 0 and len(pd.read_parquet(tmp_path / "x.parquet")) == 2


def test_dask_cluster_gives_the_same_rows():
    distributed = pytest.importorskip("distributed")
    kw = {"sweep": {"M": [32, 64, 128]}, "arch_overrides": {"fusion_buffer_bytes": [1, "64 KiB"]}, "progress": False}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl, \
            distributed.Client(cl) as client:
        got = explore("mlp2", "mambalaya", client=client, **kw)
    want = explore("mlp2", "mambalaya", workers=1, **kw)
    pd.testing.assert_frame_equal(got.drop(columns="solve_s"), want.drop(columns="solve_s"))
