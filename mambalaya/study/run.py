"""``explore``: the optimal mapping over a grid of cascade params x arch overrides, as a DataFrame.

Points are independent, so they run on all local cores (a process pool: the
mapper is CPU-bound Python and OR-Tools) or on a Dask cluster; results are put
back in grid order, so the same sweep always gives the same rows in the same order.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

import pandas as pd

from mambalaya.arch import Arch
from mambalaya.errors import MambalayaError
from mambalaya.ir.cascade import Cascade
from mambalaya.mapper import OBJECTIVES
from mambalaya.study.grid import Point, build_grid
from mambalaya.study.point import COLUMNS, evaluate_chunk

#: Sweeps of fewer points run in this process (a pool's start-up would cost more than it saves).
SERIAL_BELOW = 8
#: Show a progress bar from this many points on.
PROGRESS_FROM = 16

Rows = list[dict[str, Any]]


def _chunks(points: list[Point], parts: int) -> list[list[Point]]:
    size = max(1, math.ceil(len(points) / parts))
    return [points[i : i + size] for i in range(0, len(points), size)]


def _progress(total: int, enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        disable=not enabled or total < PROGRESS_FROM, transient=True,
    )


def _run_serial(points: list[Point], objective: str, bar: Any) -> Rows:
    rows = []
    with bar as progress:
        task = progress.add_task("sweep", total=len(points))
        for p in points:
            rows += evaluate_chunk([p], objective)
            progress.advance(task, 1)
    return rows


def _pool_context() -> Any:
    """fork on Linux: workers start in milliseconds and scripts need no ``__main__`` guard.

    The pool forks all its workers at the first submit, before the progress bar's thread
    starts, so no lock of ours can be held across the fork.
    """
    if sys.platform == "linux":
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _run_pool(points: list[Point], objective: str, workers: int, bar: Any) -> Rows:
    chunks = _chunks(points, workers * 4)
    out: list[Rows | None] = [None] * len(chunks)
    with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context()) as pool:
        futures = {pool.submit(evaluate_chunk, c, objective): i for i, c in enumerate(chunks)}
        with bar as progress:
            task = progress.add_task("sweep", total=len(points))
            for fut in as_completed(futures):
                out[futures[fut]] = fut.result()
                progress.advance(task, len(chunks[futures[fut]]))
    return [row for rows in out for row in rows or []]


def _run_dask(points: list[Point], objective: str, client: Any, bar: Any) -> Rows:
    from distributed import as_completed as dask_completed

    workers = max(1, len(client.scheduler_info().get("workers", {})))
    chunks = _chunks(points, workers * 4)
    futures = client.map(evaluate_chunk, chunks, objective=objective, pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    out: list[Rows | None] = [None] * len(chunks)
    with bar as progress:
        task = progress.add_task("sweep", total=len(points))
        for fut in dask_completed(futures):
            i = index[fut.key]
            out[i] = fut.result()
            progress.advance(task, len(chunks[i]))
    return [row for rows in out for row in rows or []]


def explore(
    cascade: Cascade | str,
    archs: Arch | str | Sequence[Arch | str],
    sweep: Mapping[str, Any] | None = None,
    arch_overrides: Mapping[str, Any] | None = None,
    objective: str = "latency",
    workers: int | None = None,
    client: Any = None,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per design point: the optimal mapping's figures next to unfused, and the speedup.

    ``sweep`` maps cascade params (``seqlen``, ``batch``, ...) and ``model`` (a published size) to
    values; ``arch_overrides`` maps :data:`mambalaya.arch.OVERRIDABLE` keys to values (numbers in SI
    units or strings like ``"64 KiB"``). Rows run params outermost, then arch, then overrides, in the
    order given. ``workers``: processes (default all cores; 1 runs here); ``client``: a
    ``dask.distributed.Client`` to run on instead. Points where no mapping fits have ``feasible``
    False and the mapper's ``reason``. Bad keys or values raise MambalayaError before any work.
    """
    if objective not in OBJECTIVES:
        raise MambalayaError(f"unknown objective '{objective}': use one of {', '.join(OBJECTIVES)}")
    if workers is not None and workers < 1:
        raise MambalayaError(f"workers must be at least 1, got {workers}")
    points = build_grid(cascade, archs, sweep, arch_overrides)
    workers = min(workers or os.cpu_count() or 1, len(points))
    bar = _progress(len(points), progress)
    if client is not None:
        rows = _run_dask(points, objective, client, bar)
    elif workers <= 1 or len(points) < SERIAL_BELOW:
        rows = _run_serial(points, objective, bar)
    else:
        rows = _run_pool(points, objective, workers, bar)
    labels = list(points[0].labels) if points else []
    columns = labels + [c for c in COLUMNS if c not in labels]
    return pd.DataFrame(rows, columns=columns)


__all__ = ["explore"]
