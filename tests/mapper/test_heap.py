"""The collector within a mapping: long-lived objects frozen out of its scans, cycles still freed."""

from __future__ import annotations

import gc
import weakref

import pytest

from mambalaya.mapper import heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture
def clean_collector():
    gc.collect()
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_the_scope_freezes_the_heap_turns_full_collections_off_and_undoes_both(clean_collector) -> None:
    threshold = gc.get_threshold()
    gc.unfreeze()
    with heap.frozen_heap():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[2] == heap.NO_FULL_COLLECTIONS
        assert gc.get_threshold()[:2] == threshold[:2]
        with heap.frozen_heap():  # (a scope inside another changes nothing)
            assert gc.get_threshold()[2] == heap.NO_FULL_COLLECTIONS
        assert gc.get_threshold()[2] == heap.NO_FULL_COLLECTIONS
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == 0


def test_settle_frees_cycles_and_freezes_what_survives(clean_collector, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "SETTLE_EVERY_S", 0.0)
    with heap.frozen_heap():
        frozen = gc.get_freeze_count()
        dropped, kept = _Node(), [_Node() for _ in range(100)]
        gone = weakref.ref(dropped)
        del dropped
        heap.settle()
        assert gone() is None  # the cycle no one holds was collected
        assert gc.get_freeze_count() >= frozen + len(kept)  # what lives on is out of later scans
    assert gc.get_freeze_count() == 0


def test_settle_waits_its_period_and_does_nothing_outside_a_scope(clean_collector, monkeypatch: pytest.MonkeyPatch) -> None:
    heap.settle()  # (no scope: nothing frozen)
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(heap, "SETTLE_EVERY_S", 3600.0)
    with heap.frozen_heap():
        frozen = gc.get_freeze_count()
        kept = [_Node() for _ in range(100)]
        heap.settle()  # (within its period: no collection, nothing more frozen; a frozen object may still die)
        assert gc.get_freeze_count() <= frozen
        assert len(kept) == 100


def test_scopes_overlapping_in_two_threads_share_one_and_the_last_out_restores(clean_collector) -> None:
    """Mappings in a dask worker's threads: the first out must not thaw the heap under the other, nor the last
    leave full collections off."""
    import threading

    threshold = gc.get_threshold()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def first() -> None:
        with heap.frozen_heap():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def second() -> None:
        a_in.wait(5)
        with heap.frozen_heap():
            b_in.set()
            a_out.wait(5)
            seen["inside after the first left"] = gc.get_threshold()[2]
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["inside after the first left"] == heap.NO_FULL_COLLECTIONS
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == 0
