"""The collector during a mapping: what lives long is frozen out of its scans, once every few seconds.

A mapping allocates millions of objects, most gone within one group's search, but what the caches and the
analyses keep grows to millions too (the default Mamba-2 on h200: 2.9 million tracked objects at the end). The
cyclic collector's full collections re-scan all of it, and it runs one whenever a quarter as many objects again
reached its oldest generation since the last, which churn alone keeps doing: 44 full collections took 67 s of a
200 s mapping. So within :func:`frozen_heap`, automatic full collections are off, and :func:`settle` (called
between two group searches) collects everything once every :data:`SETTLE_EVERY_S` and freezes what survives
(``gc.freeze``): each long-lived object is then scanned about once. Young collections keep running, so the
lowering's short-lived reference cycles are freed as before; an object frozen and later dropped is freed by
its reference count, or, in a cycle, when the scope ends (``gc.unfreeze`` returns the frozen to the collector).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: Seconds between two collect-and-freeze steps of :func:`settle`. The default Mamba-2 on h200 mapped in 140 s
#: settling every 2 s, 129-132 s every 5 s, 125 s every 10 s (what dies within the period is never scanned old)
SETTLE_EVERY_S = 10.0
#: The oldest generation's threshold within the scope (collections of the middle one between two full
#: collections): high enough that :func:`settle` does them all
NO_FULL_COLLECTIONS = 1 << 30


class _Scope:
    """The collector is the process's: mappings in several threads (a dask worker's) share one scope, which the
    first to enter opens and the last to leave closes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.thresholds: tuple[int, int, int] | None = None
        self.last = 0.0


_scope = _Scope()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """The heap as it is frozen, automatic full collections off, until the scope ends (then both undone). A
    scope inside another (or in another thread meanwhile) shares it; with the collector disabled, nothing."""
    with _scope.lock:
        opened = _scope.depth == 0 and gc.isenabled()
        if opened:
            _scope.thresholds = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(_scope.thresholds[0], _scope.thresholds[1], NO_FULL_COLLECTIONS)
            _scope.last = time.perf_counter()
        if opened or _scope.depth:
            _scope.depth += 1
        entered = opened or _scope.depth > 1
    try:
        yield
    finally:
        if entered:
            with _scope.lock:
                _scope.depth -= 1
                if _scope.depth == 0 and _scope.thresholds is not None:
                    gc.set_threshold(*_scope.thresholds)
                    _scope.thresholds = None
                    gc.unfreeze()


def settle() -> None:
    """Within :func:`frozen_heap`, once every :data:`SETTLE_EVERY_S`: collect, then freeze what survives."""
    if not _scope.depth or time.perf_counter() - _scope.last < SETTLE_EVERY_S:
        return
    with _scope.lock:
        if not _scope.depth or time.perf_counter() - _scope.last < SETTLE_EVERY_S:
            return
        gc.collect()
        gc.freeze()
        _scope.last = time.perf_counter()


__all__ = ["NO_FULL_COLLECTIONS", "SETTLE_EVERY_S", "frozen_heap", "settle"]
