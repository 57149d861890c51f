"""Design-space studies: ``explore(cascade, archs, sweep=..., arch_overrides=...)`` -> DataFrame.

Modules: ``grid`` (validate and expand the sweep), ``point`` (one point's row),
``run`` (``explore``: local processes or Dask), ``output`` (CSV/Parquet files and
the sweep plot behind ``mambalaya sweep``). ``mambalaya.explore`` is this
package's ``explore``.
"""

from __future__ import annotations

from mambalaya.study.grid import MODEL_KEY, Point, build_grid
from mambalaya.study.point import COLUMNS, evaluate_point
from mambalaya.study.run import explore

__all__ = ["COLUMNS", "MODEL_KEY", "Point", "build_grid", "evaluate_point", "explore"]
