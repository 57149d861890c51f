"""An independent check of the traffic model: the predicted traffic is never below what an optimal cache needs.

The python backend records the element accesses of every compute of a schedule, in the order it makes them
(a recurrence step by step). Replayed through Belady's optimal replacement (with bypass: an element whose
next use is farther than everything cached is not kept) in a cache of the architecture's capacity, the reads
it misses, plus every output element written once, bound from below the off-chip bytes of *any* execution
of that computation order in that capacity, the schedule's included: its buffers never hold more than the
capacity together, so its loads are a cache policy no better than the optimal one. A traffic rule that
claimed residency the capacity cannot give (operands kept across tiles although they do not fit together)
predicts less than the bound: the test at the end breaks the rule on purpose and shows it caught.
"""

from __future__ import annotations

import heapq

import pytest
from analysis.cascades import random_tiled_mappings
from hypothesis import HealthCheck, given, settings
from small_cascades import small_cascade

from mambalaya.arch import load_arch
from mambalaya.exec.backend import execute
from mambalaya.exec.reference import random_inputs
from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping
from mambalaya.schedule import Schedule, ScheduleError, lower_mapping


def optimal_misses(trace: list, capacity: int) -> int:
    """Reads Belady's replacement (with bypass) misses in a cache of ``capacity`` elements; a write puts the
    element in the cache (it is made on chip), a read of an element not cached costs one miss."""
    seq = [((tensor, int(e)), kind == "w") for tensor, flat, kind in trace for e in flat]
    never = len(seq)
    nxt, last = [never] * len(seq), {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = last.get(seq[i][0], never)
        last[seq[i][0]] = i
    cache: dict = {}
    heap: list = []  # (-next use, key), stale entries skipped
    misses = 0
    for i, (key, write) in enumerate(seq):
        if key in cache:
            cache[key] = nxt[i]
            heapq.heappush(heap, (-nxt[i], key))
            continue
        if not write:
            misses += 1
        if nxt[i] == never or capacity == 0:
            continue
        if len(cache) < capacity:
            cache[key] = nxt[i]
            heapq.heappush(heap, (-nxt[i], key))
            continue
        while -heap[0][0] != cache.get(heap[0][1]):
            heapq.heappop(heap)
        far, victim = -heap[0][0], heap[0][1]
        if far > nxt[i]:  # the farthest-used element makes room; else this one is not kept
            heapq.heappop(heap)
            del cache[victim]
            cache[key] = nxt[i]
            heapq.heappush(heap, (-nxt[i], key))
    return misses


def lower_bound(cascade, schedule: Schedule) -> int:
    """The optimal cache's bytes for the schedule's computation order at its capacity."""
    sizes = {t.element_bytes for t in cascade.tensors.values()}
    assert len(sizes) == 1, "the bound assumes one element size"
    eb = sizes.pop()
    run = execute(cascade, schedule, random_inputs(cascade, 0), "python", "float64", trace=True)
    misses = optimal_misses(run.extra["trace"], schedule.capacity_bytes // eb)
    return misses * eb + sum(cascade.nbytes(o) for o in cascade.outputs())


def predicted(schedule: Schedule, cascade) -> int:
    return sum(s.elements * cascade.tensors[s.tensor].element_bytes for g in schedule.groups
               for s, _ in g.statements() if s.kind in ("load", "store"))


def test_the_cache_model_on_a_hand_example() -> None:
    # a b a c b with 2 places: a, b kept; c bypassed (used never again); 3 misses
    trace = [("X", [0], "r"), ("X", [1], "r"), ("X", [0], "r"), ("X", [2], "r"), ("X", [1], "r")]
    assert optimal_misses(trace, 2) == 3 and optimal_misses(trace, 1) == 4 and optimal_misses(trace, 3) == 3
    assert optimal_misses([("T", [0], "w"), ("T", [0], "r")], 1) == 0  # made on chip, read back: no miss


def test_prediction_is_never_below_the_optimal_cache() -> None:
    """Random tiled mappings at small and large capacities; then, that most examples were schedules that fit (small
    capacities among them): the property ran on real schedules (one test, so it holds wherever xdist puts it)."""
    checked: list[int] = []

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(random_tiled_mappings(max_einsums=4, buffers=(128, 512, 1 << 20)))
    def prediction_at_least_the_optimal_cache(case) -> None:
        c, m, cap = case
        arch = load_arch("mambalaya").with_overrides(fusion_buffer_bytes=cap)
        try:
            s = lower_mapping(c, m, arch)  # only schedules whose buffers fit the capacity together
        except ScheduleError:
            return
        assert predicted(s, c) >= lower_bound(c, s)
        checked.append(cap)

    prediction_at_least_the_optimal_cache()
    assert len(checked) >= 20 and min(checked) <= 512


@pytest.mark.parametrize("name", [pytest.param("mamba1", marks=pytest.mark.slow), pytest.param("mamba2", marks=pytest.mark.slow),
                                  "attention", "mamba1-decode", "mamba2-decode", "mlp2"])
@pytest.mark.parametrize("arch", ["mambalaya", "h200"])
def test_shipped_cascades_optimal_mapping_respects_the_bound(name: str, arch: str) -> None:
    from mambalaya.mapper import optimal_mapping

    c = small_cascade(name)
    a = load_arch(arch)
    a = a.with_overrides(fusion_buffer_bytes=2048)  # small enough that the tiles and residency matter
    checked = 0
    for m in (optimal_mapping(c, a).mapping, unfused_mapping(c)):
        try:
            s = lower_mapping(c, m, a)
        except ScheduleError:  # (the untiled unfused mapping may not fit)
            continue
        assert predicted(s, c) >= lower_bound(c, s), (name, arch, m.group_lists)
        checked += 1
    assert checked


def test_a_broken_residency_rule_is_caught(monkeypatch) -> None:
    """Keep every re-read operand resident across tiles whatever the capacity (the rule the old cost model
    had: each operand checked against the buffer alone). The bound catches the traffic it claims: a GEMM
    tiled m=2, k=2 in 128 B must hold its partial sums (48 B) while W1 (96 B) is read again per m tile."""
    from cost.conftest import TINY_ARCH

    import mambalaya.schedule.lower as lower
    from mambalaya.arch import parse_arch
    from mambalaya.parse import parse_cascade_text

    gemm = parse_cascade_text("name: gemm\nparams: {M: 8, K: 4, N: 6}\nranks: {m: M, k: K, n: N}\n"
                              "tensors: {W1: {role: weight}}\neinsums:\n  - T[m,n] = A[m,k] * W1[k,n]\n", file="g.yaml")
    arch = parse_arch(TINY_ARCH, file="tiny.yaml").with_overrides(fusion_buffer_bytes=128)
    m = Mapping((FusionGroup(("T",), ("m", "k", "n"), {"m": 2, "k": 2}),), gemm.name)
    honest = lower_mapping(gemm, m, arch)
    assert predicted(honest, gemm) == 128 + 4 * 96 + 192 >= lower_bound(gemm, honest)

    real = lower._Builder.hoist

    def hoist_ignoring_capacity(self) -> None:
        saved, self.lw.capacity = self.lw.capacity, 1 << 40
        try:
            real(self)
        finally:
            self.lw.capacity = saved

    monkeypatch.setattr(lower._Builder, "hoist", hoist_ignoring_capacity)
    broken = lower_mapping(gemm, m, arch, check=False)
    assert predicted(broken, gemm) == 128 + 96 + 192  # W1 claimed read once...
    assert predicted(broken, gemm) < lower_bound(gemm, broken)  # ... which no cache of 128 B can do
