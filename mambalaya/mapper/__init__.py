"""Stage ``mapper``: the exact fusion mapper.

``optimal_mapping(cascade, arch)`` enumerates legal candidate groups with their
best tiling (:mod:`.space`), then picks the exact cover of the Einsums that
minimises the summed group cost (:mod:`.solver`: by default a shortest path over the cascade's downsets,
SCIP where that does not apply, CP-SAT on request, exhaustive search as the cross-check). A chain of layers (``layers > 1``) is first tried as the
one-layer optimum repeated (:func:`_by_layers`, proven by a bound), else solved exactly as a
shortest path over its layer boundaries (:mod:`.layers`). ``map_command_result`` is the CLI's ``map --json``.

Objective costs are made integers for CP-SAT at a stated resolution
(:func:`_resolution`): 1 ps or 1 byte, coarsened only when an upper bound on the
optimum (a known cover's cost) would pass 2^40 units; the reported figures are re-evaluated in
floating point by the cost model, so rounding can only affect ties closer than
``resolution * groups``.

The objective is lexicographic: least latency, then least traffic among the latency-optimal
mappings (``traffic``: the reverse), so a compute-bound layer, whose latency does not see its
traffic, does not come back with an arbitrary one of its ties (:mod:`.solver` says how each backend
does it). For ties to survive rounding, latency is made integer part by part (:func:`_units`): each
Einsum's compute time is rounded on its own, so two mappings whose compute-bound groups cover the
same Einsums tie exactly in integers, whatever their grouping.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mambalaya.arch import Arch, load_arch
from mambalaya.cost.latency import memory_seconds
from mambalaya.cost.model import CostReport
from mambalaya.errors import MappingError
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.chain import chain_layers
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.mapper.chain_space import DEFAULT_MAX_CROSS, build_chain_space
from mambalaya.mapper.heap import frozen_heap
from mambalaya.mapper.heuristics import evaluate, greedy_mapping, unfused_baseline
from mambalaya.mapper.layers import solve_layers
from mambalaya.mapper.recompute import conflicts as recompute_conflicts
from mambalaya.mapper.recompute import variants as recompute_variants
from mambalaya.mapper.solver import (
    SOLVERS,
    Problem,
    Solution,
    SolveTimeout,
    cheapest_covers,
    register_solver,
    schedule,
    solve,
)
from mambalaya.mapper.space import (
    OBJECTIVES,
    SEARCH_DEADLINE,
    Candidate,
    OutOfTime,
    Space,
    bound_candidates,
    build_space,
    refine,
    search_jobs,
    shared_coster,
)
from mambalaya.mapper.tiling import Tiled, Untileable, best_tiling

#: Groups of more Einsums than this are not enumerated for big cascades (chained layers).
DEFAULT_MAX_SIZE = 24
#: Cascades up to this many Einsums get every group size.
UNBOUNDED_UP_TO = 30
#: A lazy space that has searched this many more groups no tiling fits than it has pruned (unsearched or cut
#: short, :func:`prune_by_covers`) is built eagerly instead (an exact space too, less what was pruned): where most
#: groups of several Einsums fit nowhere, the eager enumeration, which never grows from one, searches far fewer
#: (mamba2-370m L4096 on h200: 2,781 of the first 2,840 groups the lazy loop searched fit nowhere, 307 pruned, 47 s;
#: eager 469 searches, 7.7 s). The default Mamba-2 on h200 prunes 2,839 for 878 searched and stays lazy (14 s; 50
#: s eager, where the old rule, searches against pruning, sent it). On an arch with program slots, a group whose
#: search stops on its bound before trying a tiling counts as one no tiling fits, not as pruned (most of them fit
#: nowhere either: the bound is looked at first; counted as pruned, mamba2-370m stayed lazy on h200: 1,273
#: searches, 22.7 s in one process, 13.5 s now). Elsewhere, as pruned (counted as misfits there, mamba2-2.7b L16384
#: on cpu went eager: 48 -> 66 s).
LAZY_SEARCH_BASE = 100
#: Most rounds a chain's lazy space searches the groups whose bounds keep the layer decomposition from its proof
#: (:func:`_by_layers`) before it builds its layer's eager space
LAZY_CHAIN_ROUNDS = 8


@dataclass(frozen=True)
class MapResult:
    """An optimised mapping, its cost report and what the solver proved."""

    mapping: Mapping
    report: CostReport
    optimal: bool  # True only when the solver proved optimality (within the model and candidate space)
    gap: float  # relative gap between the objective and the proven bound (0 when optimal)
    solve_s: float  # wall time: space construction plus the solve
    candidates: int  # legal candidate groups the solver chose among
    method: str
    objective: str
    objective_value: float  # sum of the chosen candidates' costs (s or bytes)
    resolution: float  # integer unit of the solver's objective (s or bytes)
    space_s: float = 0.0
    nodes: int = 0
    cuts: int = 0
    left_out: str | None = None  # what a size cap left out of the space (``optimal`` is false unless the caller chose it)
    #: candidates left out unsearched, by the proof that left them out, the group searches run, and the candidates
    #: the solver weighed at a lower bound alone (a lazy space's: never picked, so never searched)
    pruned: dict[str, int] = field(default_factory=dict)
    bound: float = 0.0  # the solver's proven lower bound on the objective over the candidates (s or bytes)

    def certificate(self) -> dict:
        """What ``optimal`` rests on, for a reader to check: the optimum and the lower bound the solver proved,
        the space it is proven over, and how its candidates were costed, searched or left out unsearched."""
        return {
            "objective": self.objective,
            "value": self.objective_value,
            "lower_bound": min(self.bound, self.objective_value),  # (the solver's, in its integer units rounded up)
            "resolution": self.resolution,  # its integer unit: each group's cost is compared to within one
            "proven": self.optimal,
            "over": "every legal fusion group" if self.left_out is None else
                    f"the legal fusion groups, less {self.left_out}",
            "tilings": "each group at the best tiling its tile search found (a local search over the tiles the "
                       "schedule admits: the cover is proven optimal over those costs, not over every tiling)",
            "candidates": self.candidates,
            "searched": self.pruned.get("searched", 0),
            "pruned": {k: v for k, v in self.pruned.items() if k != "searched"},
        }

    @property
    def groups(self) -> list[list[str]]:
        return self.mapping.group_lists


def upper_bound(space: Space, objective: str) -> float:
    """The cost of some cover, an upper bound on the optimum: all-unfused when every singleton is a
    candidate, else the sum over Einsums of the dearest candidate covering it (candidates are disjoint)."""
    single = {c.einsums[0]: c.cost(objective) for c in space.candidates if len(c.einsums) == 1}
    if len(single) == len(space.cascade.einsums):
        return sum(single.values())
    dearest: dict[str, float] = {}
    for c in space.candidates:
        for e in c.einsums:
            dearest[e] = max(dearest.get(e, 0.0), c.cost(objective))
    return sum(dearest.values())


def _resolution(bound: float, objective: str) -> float:
    """The integer unit of the solver's objective: 1 ps (1 byte), coarsened only when the optimum's
    upper bound would pass 2^40 units, so rounding moves the optimum by at most ``groups/2^41`` of it.

    Bug fixed here: the unit used to be scaled by the *dearest candidate* (a tile-1 group re-reading
    its weights per token costs hours), which at published sizes made the unit larger than the
    differences between mappings (mamba2 on h200: 0.4 ms against a 6.7 ms optimum), so whole-model
    optima came out all-unfused while flagged optimal. Only the optimum's bound matters: candidates
    dearer than that bound can never be chosen and are dropped before the solve.
    """
    base = 1e-12 if objective == "latency" else 1.0
    return max(base, bound / 2**40)


def _units(c: Candidate, objective: str, res: float, arch: Arch) -> int:
    """A candidate's cost in integer units of ``res``. Latency is rounded part by part, as the roofline
    adds it up: ``max(sum of members' compute, memory) + overheads``, each member's compute rounded
    alone, so compute-bound groups add up exactly and equal latencies stay equal in integers."""
    if not (math.isfinite(c.latency_s) and math.isfinite(float(c.traffic_bytes))):
        raise MappingError(f"[{', '.join(c.einsums)}] costs {c.latency_s} s on {arch.name}: the arch's figures are "
                           "out of range (an overhead or a rate near the float limit); give it finite ones")
    if objective != "latency":
        return round(c.traffic_bytes / res)
    if not c.compute_s:
        return round(c.latency_s / res)
    compute = sum(round(x / res) for x in c.compute_s)
    memory = round(memory_seconds(arch, c.traffic_bytes) / res)
    overhead = arch.group_overhead_s + arch.transfer_overhead_s * c.transfers
    plain = max(sum(c.compute_s), memory_seconds(arch, c.traffic_bytes))
    roof = max(compute, memory)
    if plain > 0 and abs(c.latency_s - plain - overhead) > 1e-9 * (plain + overhead):
        # a grid short of the chip (or a recurrence's chain): rounded whole (its parts rounded, then scaled as the
        # model scales them, erred by up to half a unit times the scale: 7.9 ps over mamba1-decode's two groups on
        # h200, past the certificate's unit a group)
        roof = round((c.latency_s - overhead) / res)
    return roof + round(arch.group_overhead_s / res) + round(arch.transfer_overhead_s / res) * c.transfers


def _other(objective: str) -> str:
    return "traffic" if objective == "latency" else "latency"


def _secondary_resolution(cands: list[Candidate], objective: str) -> float:
    """The tie-break's unit: 1 ps (1 byte) unless a bound on any cover's secondary cost (per Einsum the
    dearest candidate covering it, summed) passes 2^40 units; so its sums stay exact in SCIP's doubles."""
    dearest: dict[str, float] = {}
    for c in cands:
        v = c.cost(objective)
        for e in c.einsums:
            dearest[e] = max(dearest.get(e, 0.0), v)
    return _resolution(sum(dearest.values()), objective)


def build_problem(space: Space, extra: list[Candidate] | None = None
                  ) -> tuple[Problem, list[Candidate], tuple[float, float]]:
    """The solver's integer instance of ``space`` (plus ``extra``, recompute variants, with their
    rows): its candidates (those dearer than a whole cover of the space's own dropped: costs are
    non-negative), their units and the two resolutions (objective, tie-break)."""
    objective, other = space.objective, _other(space.objective)
    bound = upper_bound(space, objective)
    cands = [c for c in [*space.candidates, *(extra or ())] if c.cost(objective) <= bound * (1 + 1e-9)]
    res, res2 = _resolution(bound, objective), _secondary_resolution(cands, other)
    cascade, arch = space.cascade, space.arch
    rows = recompute_conflicts(cascade, cands) if extra else ()
    problem = Problem(cascade.einsum_names, tuple(cascade.einsum_graph.edges), tuple(c.einsums for c in cands),
                      tuple(_units(c, objective, res, arch) for c in cands),
                      tuple(_units(c, other, res2, arch) for c in cands), conflicts=rows)
    return problem, cands, (res, res2)


def explain_infeasible(space: Space) -> MappingError:
    """Why no mapping fits: the Einsums no legal, fitting candidate covers, with their smallest need."""
    covered = {e for c in space.candidates for e in c.einsums}
    missing = [e for e in space.cascade.einsum_names if e not in covered]
    cap = space.arch.fusion_buffer_bytes
    parts = []
    for e in missing:
        rej = space.rejected_singletons.get(e)
        if rej is not None and rej.need_bytes is not None:
            parts.append(f"Einsum {e} alone needs at least {_fmt(rej.need_bytes)} ({rej.reason}), "
                         f"{_fmt(rej.need_bytes - cap)} more than the buffer")
        elif rej is not None:
            parts.append(f"Einsum {e} cannot be mapped: {rej.reason}")
        else:
            parts.append(f"Einsum {e} is in no legal group")
    return MappingError(f"no mapping fits a {_fmt(cap)} buffer on {space.arch.name}: " + "; ".join(parts))


def _fmt(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


@frozen_heap()  # (the collector's full scans of the long-lived heap were up to two fifths of a mapping)
def optimal_mapping(cascade: Cascade, arch: Arch | str, objective: str = "latency", method: str = "ilp",
                    time_limit_s: float | None = None, *, max_size: int | None = None, layers: int = 1,
                    max_cross: int | None = None, recompute: bool = False, lazy: bool | None = None) -> MapResult:
    """:func:`_optimal_mapping` under ``time_limit_s`` (seconds of the whole mapping, searches included): once it
    passes, no further group is searched and the result is the best mapping known to fit, the unfused baseline
    (each Einsum at its best tiling), with ``optimal`` false and the gap to the last lower bound a solve proved
    (1 when none had been: the limit passed before the first solve)."""
    arch = load_arch(arch) if isinstance(arch, str) else arch
    if time_limit_s is None:
        return _optimal_mapping(cascade, arch, objective, method, None, max_size=max_size, layers=layers,
                                max_cross=max_cross, recompute=recompute, lazy=lazy)
    start = time.perf_counter()
    known: dict[str, float] = {}  # the last lower bound a solve proved (objective units), filled by the search
    token = SEARCH_DEADLINE.set(start + time_limit_s)
    try:
        return _optimal_mapping(cascade, arch, objective, method, time_limit_s, max_size=max_size, layers=layers,
                                max_cross=max_cross, recompute=recompute, lazy=lazy, known=known)
    except OutOfTime:
        pass
    finally:
        SEARCH_DEADLINE.reset(token)
    chained = chain_layers(cascade, layers) if layers > 1 else cascade
    ctx = shared_coster(chained, arch, objective).ctx
    mapping = unfused_baseline(chained, arch, ctx=ctx)
    report = evaluate(chained, arch, mapping, ctx=ctx)
    value = report.latency_s if objective == "latency" else float(report.traffic_bytes)
    bound = known.get("bound")
    gap = 1.0 if bound is None or value <= 0 else max(0.0, (value - bound) / value)
    searched = shared_coster(chained, arch, objective).searched
    return MapResult(mapping, report, False, gap, time.perf_counter() - start, 0, "time limit: unfused baseline",
                     objective, value, 0.0, left_out=f"every group not searched within the time limit of "
                     f"{time_limit_s:g} s (the unfused baseline is the best mapping known to fit)",
                     pruned={"searched": searched})


def _optimal_mapping(cascade: Cascade, arch: Arch, objective: str = "latency", method: str = "ilp",
                     time_limit_s: float | None = None, *, max_size: int | None = None, layers: int = 1,
                     max_cross: int | None = None, recompute: bool = False, lazy: bool | None = None,
                     known: dict[str, float] | None = None, spaces: list[Space] | None = None) -> MapResult:
    """The minimum-``objective`` mapping of ``cascade`` on ``arch`` (``latency`` or ``traffic``).

    ``method``: a registered solver (``ilp``, the default: the downset shortest path, else SCIP; ``mip``; ``downsets``;
    ``cpsat``; ``exhaustive``; ``layers``); with ``ilp`` a chain of layers is solved exactly by :func:`_by_layers` or, when a group
    crossing layers pays, by the ``layers`` shortest path (:mod:`.layers`). ``max_size`` caps the
    Einsums per group (default: no cap up to 30 Einsums, else 24). ``layers > 1`` maps
    ``chain_layers(cascade, layers)`` with a space linear in layers (:func:`build_chain_space`: groups
    crossing a layer boundary up to ``max_cross`` Einsums, :data:`DEFAULT_MAX_CROSS` unless given). A cap the
    caller gives (``max_size``, ``max_cross``) defines the space ``optimal`` is proven over; one the mapper chose
    that left a group out makes ``optimal`` false, and ``left_out`` says what. ``recompute`` also searches recomputing
    cheap multi-consumer tensors (:mod:`.recompute`; one layer only). ``lazy`` (the default for one layer): cost
    groups of several Einsums by a lower bound and tile-search only those a solve picks, solving again until it picks only
    searched ones (:func:`~.space.build_space`; the same optimum), each round first dropping the candidates no
    optimal cover can hold (:func:`prune_by_covers`), and searching the picks only as far as some optimal cover
    could still hold them (the limits it returns: a search that proves a group dearer stops and prunes it); once
    it finds groups no tiling fits faster than it prunes (:data:`LAZY_SEARCH_BASE`) the space is built eagerly. ``lazy=False``
    builds the eager space at once (every group searched, less those a split dominates). ``pruned`` in the
    result counts what was left out unsearched or cut short, by which proof.
    Raises MappingError when nothing fits.
    """
    if objective not in OBJECTIVES:
        raise MappingError(f"unknown objective '{objective}': use one of {', '.join(OBJECTIVES)}")
    if recompute and layers > 1:
        raise MappingError("recompute search maps one layer (layers=1)")
    caller_capped = max_size is not None or (layers > 1 and max_cross is not None)
    if max_size is None and len(cascade.einsums) > UNBOUNDED_UP_TO:
        max_size = DEFAULT_MAX_SIZE
    max_cross = DEFAULT_MAX_CROSS if max_cross is None else max_cross
    start = time.perf_counter()
    by_layers = layers > 1 and method in ("ilp", "mip", "scip")
    # a chain tries its layer's lazy space first: its bounds may prove the layer's optimum repeated (_by_layers)
    lazy_chain = by_layers and lazy is not False and arch.can_fuse
    lazy = (True if lazy is None else lazy) and layers == 1 and not recompute
    layer = cascade
    if layers > 1:
        one: list[Space] = []
        if lazy_chain:
            _optimal_mapping(layer, arch, objective, method, time_limit_s, lazy=True, known=known, spaces=one)
            # (a group in no optimal cover of one layer may be in one of the chain: the pruned are back, at bounds)
            one[0].candidates += bound_candidates(one[0], sorted(one[0].pruned))
            one[0].pruned = set()
            if layers > 2:
                _searched_for_two_layers(layer, arch, objective, method, max_cross, one[0])
        cascade, space = build_chain_space(layer, layers, arch, objective, max_cross=max_cross,
                                           one=one[0] if one else None)
    else:
        space = build_space(cascade, arch, objective, max_size=max_size, lazy=lazy)
    space_s = time.perf_counter() - start
    extra = recompute_variants(space) if recompute and arch.can_fuse else None
    chain_rounds = 0
    try:
        while True:  # a lazy space: solve on bounds, search what the solve picked, again until it picks only exact costs
            if {e for c in space.candidates for e in c.einsums} != set(cascade.einsum_names):
                raise explain_infeasible(space)  # (also once a refinement drops the last group a bound said fits)
            problem, cands, (res, res2) = build_problem(space, extra)
            remaining = None if time_limit_s is None else max(0.01, time_limit_s - (time.perf_counter() - start))
            try:
                want: set[tuple[str, ...]] = set()
                sol = _by_layers(space, problem, (res, res2), method, layers, cands, want) if by_layers else None
                if sol is None and layers > 1 and space.lazy:
                    # the bounds proved nothing yet: search those in the way and try again, else the eager layer space
                    if want and chain_rounds < LAZY_CHAIN_ROUNDS:
                        chain_rounds += 1
                        one_space = space.layer_space  # type: ignore[attr-defined]
                        refine(one_space, [c for c in one_space.candidates if c.einsums in want], batch=0)
                        one_space.coster.close()
                        cascade, space = build_chain_space(layer, layers, arch, objective, max_cross=max_cross,
                                                           one=one_space)
                    else:
                        cascade, space = build_chain_space(layer, layers, arch, objective, max_cross=max_cross)
                    space_s = time.perf_counter() - start
                    continue
                if sol is None:  # a chain whose optimum crosses layers: the exact shortest path over its boundaries
                    sol = solve_layers(problem, remaining) if by_layers else solve(problem, method, remaining)
            except SolveTimeout:
                if known is None:
                    raise
                raise OutOfTime from None  # (the mapping's own time limit: its best known mapping instead)
            picked = [cands[i] for i in sol.chosen]
            if all(c.exact for c in picked):
                break
            if known is not None and sol.optimal:  # (on bounds: the optimum over the space costs at least this)
                known["bound"] = max(known.get("bound", 0.0), sol.bound * res)
            refine(space, picked, limits=prune_by_covers(space, problem, cands, res))
            if space.lazy and layers == 1 and \
                    space.misfits > len(space.pruned) - space.bound_pruned + LAZY_SEARCH_BASE:
                # it finds groups that fit nowhere faster than it prunes: the eager space (less what the covers
                # have proven out), which never grows from such a group
                space.coster.close()  # type: ignore[attr-defined]
                space = build_space(cascade, arch, objective, max_size=max_size, coster=space.coster,
                                    exclude=frozenset(space.pruned))
    finally:  # (the search processes a refinement forked)
        if space.coster is not None:
            space.coster.close()
    solve_s = time.perf_counter() - start
    if spaces is not None:
        spaces.append(space)
    chosen: list[Candidate] = [cands[i] for i in schedule(problem, sol.chosen)]
    mapping = Mapping(tuple(c.group for c in chosen), cascade.name, arch.name)
    mapping.validate(cascade)
    report = evaluate(cascade, arch, mapping, ctx=space.ctx)
    proven = sol.optimal and (space.left_out is None or caller_capped)
    return MapResult(mapping, report, proven, sol.gap, solve_s, len(cands),
                     sol.method, objective, sum(c.cost(objective) for c in chosen), res, space_s, sol.nodes, sol.cuts,
                     space.left_out, {"by_cover_bound": len(space.pruned), "dominated_by_split": space.dominated,
                                      "searched": space.coster.searched if space.coster is not None else
                                      space.searches,
                                      "costed_by_bound": sum(1 for c in cands if not c.exact)},
                     sol.bound * res)


def prune_by_covers(space: Space, problem: Problem, cands: list[Candidate],
                    res: float = 1.0) -> dict[tuple[str, ...], float]:
    """Drop from a lazy space the candidates (still lower bounds) that no optimal cover holds, unsearched: the
    cheapest cover holding one, at the bounds (:func:`~.solver.cheapest_covers`), costs more than a cover of
    searched candidates alone, whose cost is real. Exact: a bound is at most its group's cost at any tiling.
    Returns, per candidate kept at a bound, cheapest cover first, the most its objective may be (``res`` a unit) for
    some optimal cover to hold it: its bound plus what its cheapest cover leaves below the real one (none where the
    problem is not for the downset walk: conflict rows, too many downsets)."""
    try:  # (the least cover of searched candidates alone: a real cost)
        real, through = cheapest_covers(replace(problem, secondary=()), [i for i, c in enumerate(cands) if c.exact])
    except MappingError:  # (too many downsets, rows)
        return {}
    if real is None:
        return {}
    # units are rounded part by part (:func:`_units`): a bound may pass its group's real figure by a few units
    slack = 4 * len(problem.einsums)
    gone = {cands[i].einsums for i, t in enumerate(through)
            if not cands[i].exact and (t is None or t > real + slack)}
    space.candidates = [c for c in space.candidates if c.exact or c.einsums not in gone]
    space.pruned |= gone
    obj = space.objective
    kept = sorted((t, i) for i, t in enumerate(through) if t is not None and not cands[i].exact
                  and cands[i].einsums not in gone)
    return {cands[i].einsums: cands[i].cost(obj) + (real + slack - t) * res * (1 + 1e-9) for t, i in kept}


def _searched_for_two_layers(layer: Cascade, arch: Arch, objective: str, method: str, max_cross: int,
                             one: Space) -> None:
    """Search the groups of a lazy layer space ``one`` that keep the layer decomposition's proof from holding on a
    chain of two layers (:func:`_by_layers`, at most :data:`LAZY_CHAIN_ROUNDS` rounds). Its periodic LP folds every
    chain onto one layer, so the columns in its way are those of any chain; two layers are cheap to build again
    after each round, where 64 are not. Only decides what is searched: the longer chain's own proof still decides."""
    for _ in range(LAZY_CHAIN_ROUNDS):
        _, two = build_chain_space(layer, 2, arch, objective, max_cross=max_cross, one=one)
        if not two.lazy:
            return
        problem, cands, res = build_problem(two)
        want: set[tuple[str, ...]] = set()
        if _by_layers(two, problem, res, method, 2, cands, want) is not None or not want:
            return
        refine(one, [c for c in one.candidates if c.einsums in want], batch=0)
        one.coster.close()  # type: ignore[attr-defined]


def _by_layers(space: Space, problem: Problem, res: tuple[float, float], method: str,
               layers: int, cands: list[Candidate] | None = None, search: set | None = None) -> Solution | None:
    """The chain's optimum as the one-layer optimum in every layer, when a bound proves it; else None.

    Proof (exact): with LP duals ``y`` of the one layer's set partition (GLOP), the Lagrangian bound
    ``sum_e y_e + sum_c min(0, cost_c - y(c))`` over *every* chain candidate (each layer's copies
    and the groups crossing a boundary, ``y`` repeated per layer) is a lower bound on the chain's
    optimum (the acyclicity constraints only raise it). When it reaches ``layers x`` the one-layer
    optimum, the replicated one-layer optimum (schedulable: layers only feed forward) is optimal.
    Otherwise a cross-layer group may pay and the caller solves the whole chain.

    A lazy chain space (its layer's unsearched groups at their lower bounds, ``cands`` the problem's candidates)
    proves the same way, the bounds standing for their costs (each no more); when it does not, ``search`` gets the
    one-layer groups whose bounds stand in the way: the one-layer optimum's unsearched picks, else every unsearched
    column the periodic LP uses or would gain from (reduced cost below half a unit: searched, its cost may lift the
    duals or its own term).

    Ties (lexicographic): a column of reduced cost ``rc`` is in no cover cheaper than
    ``bound + max(rc, 0)``, so the optimal covers use only the *tight* columns, where that reaches
    the optimum. The same Lagrangian bound on the secondary costs over the tight columns, when it
    reaches ``layers x`` the one-layer secondary, proves the replicated one-layer lexicographic
    optimum is the chain's.
    """
    from mambalaya.ir.chain import layer_name, split_layer_name

    one = getattr(space, "layer_space", None)
    if one is None or len(problem.einsums) != layers * len(one.cascade.einsums):
        return None  # adapter Einsums between layers: not a plain copy
    arch, other = space.arch, _other(space.objective)
    p1 = Problem(one.cascade.einsum_names, tuple(one.cascade.einsum_graph.edges),
                 tuple(c.einsums for c in one.candidates),
                 tuple(_units(c, space.objective, res[0], arch) for c in one.candidates),
                 tuple(_units(c, other, res[1], arch) for c in one.candidates))
    sol1 = solve(p1, method)
    unsearched = [one.candidates[i].einsums for i in sol1.chosen if not one.candidates[i].exact]
    if unsearched:  # (not the layer's optimum yet: its picks searched may cost more)
        if search is not None:
            search.update(unsearched)
        return None
    base = {e: split_layer_name(e)[0] for e in problem.einsums}
    everything = list(range(len(problem.groups)))

    def in_the_way(rcs: list[float], columns: list[int]) -> None:
        if search is not None and cands is not None:
            search.update(tuple(base[e] for e in problem.groups[i]) for i in columns
                          if rcs[i] < 0.5 and not cands[i].exact)  # (the LP's own columns: rc 0, to a half unit)

    got = _periodic_bound(problem, everything, problem.costs, base, p1.einsums, layers)
    target = layers * sol1.objective
    # integer objective: optimum >= ceil(bound); proven to SCIP's own tolerance (1e-9 of the objective)
    slack = max(0.5, 1e-9 * target)
    if got is None or got[0] < target - slack or not sol1.optimal:
        if got is not None:
            in_the_way(got[1], everything)
        return None
    bound, rcs = got
    if problem.secondary:
        # float error of bound and rcs (sums of up to ~1e5 terms): about 1e-11 of the objective
        tight = [i for i in everything if bound + max(rcs[i], 0.0) <= target + max(1e-6, 1e-11 * target)]
        got2 = _periodic_bound(problem, tight, problem.secondary, base, p1.einsums, layers)
        target2 = layers * sol1.secondary
        if got2 is None or got2[0] < target2 - max(0.5, 1e-9 * target2):
            if got2 is not None:
                in_the_way(got2[1], tight)
            return None
    index = {g: i for i, g in enumerate(problem.groups)}
    chosen = tuple(index[tuple(layer_name(split_layer_name(e)[0], k) for e in p1.groups[i])]
                   for k in range(layers) for i in sol1.chosen)
    value = sum(problem.costs[i] for i in chosen)
    return Solution(chosen, value, True, min(value, math.ceil(bound - 1e-6)), "mip", sol1.cuts, sol1.nodes,
                    sum(problem.second(i) for i in chosen))


def _periodic_bound(problem: Problem, columns: list[int], costs: tuple[int, ...], base: dict[str, str],
                    einsums1: tuple[str, ...], layers: int) -> tuple[float, list[float]] | None:
    """A Lagrangian lower bound on the least ``costs`` of a chain cover by ``columns``, and per column
    (all of them) its reduced cost. The duals y come from the periodic LP: every column folded onto one
    layer's Einsums (a group crossing a boundary covers its members' one-layer names), so they are
    feasible for every layer's copy; the bound ``layers y(all) + sum min(0, rc)`` is exact for any y."""
    from ortools.linear_solver import pywraplp

    folded: dict[tuple[str, ...], int] = {}
    for i in columns:
        key, c = tuple(sorted(base[e] for e in problem.groups[i])), costs[i]
        if c < folded.get(key, c + 1):
            folded[key] = c
    lp = pywraplp.Solver.CreateSolver("GLOP")
    if lp is None:  # pragma: no cover
        return None
    rows = {e: lp.Constraint(1.0, 1.0) for e in einsums1}
    obj = lp.Objective()
    for key, c in folded.items():
        v = lp.NumVar(0.0, lp.infinity(), "")
        for e in key:
            rows[e].SetCoefficient(v, rows[e].GetCoefficient(v) + 1.0)
        obj.SetCoefficient(v, float(c))
    obj.SetMinimization()
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    y1 = {e: rows[e].dual_value() for e in einsums1}
    rcs = [c - sum(y1[base[e]] for e in g) for g, c in zip(problem.groups, costs, strict=True)]
    return layers * sum(y1.values()) + sum(rcs[i] for i in columns if rcs[i] < 0), rcs


def map_command_result(cascade: Cascade, arch: Arch | str, objective: str = "latency", method: str = "ilp",
                       layers: int = 1, mapping_file: str | Path | None = None,
                       time_limit_s: float | None = None, recompute: bool = False) -> dict[str, Any]:
    """The ``mambalaya map --json`` object (the command-line contract), built on the cost package's report.

    With ``mapping_file`` the file's mapping is evaluated instead of optimised (``optimal`` false).
    """
    from mambalaya.ir.mapping import load_mapping
    from mambalaya.mapper.mapreport import map_report  # (it builds on this module's optimal_mapping)

    arch = load_arch(arch) if isinstance(arch, str) else arch
    if mapping_file is not None:
        if layers > 1:
            cascade = chain_layers(cascade, layers)
        mapping = load_mapping(mapping_file).validate(cascade)
        out = map_report(cascade, arch, mapping, objective=objective, method="file")
    else:
        res = optimal_mapping(cascade, arch, objective, method, time_limit_s, layers=layers, recompute=recompute)
        # (one layer: the report's baselines reuse the searches the mapper made)
        ctx = shared_coster(cascade, arch, objective).ctx if layers == 1 and not recompute else None
        cascade = chain_layers(cascade, layers) if layers > 1 else cascade
        out = map_report(cascade, arch, res.mapping, objective=objective, optimal=res.optimal,
                         solve_s=res.solve_s, method=res.method, ctx=ctx)
        out.update({"gap": res.gap, "candidates": res.candidates, "resolution": res.resolution,
                    "pruned": res.pruned, "certificate": res.certificate()})
        if res.left_out:
            out["left_out"] = res.left_out
    out["layers"] = layers
    return out


__all__ = [
    "DEFAULT_MAX_CROSS",
    "OBJECTIVES",
    "SOLVERS",
    "Candidate",
    "FusionGroup",
    "MapResult",
    "Problem",
    "Solution",
    "Space",
    "Tiled",
    "Untileable",
    "best_tiling",
    "build_chain_space",
    "build_problem",
    "build_space",
    "chain_layers",
    "evaluate",
    "explain_infeasible",
    "greedy_mapping",
    "map_command_result",
    "optimal_mapping",
    "prune_by_covers",
    "register_solver",
    "search_jobs",
    "solve",
    "solve_layers",
    "unfused_baseline",
]
