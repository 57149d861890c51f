"""The solver facade: pick an exact cover of the Einsums by candidate groups, cheapest first.

Every backend has one signature, ``fn(problem, time_limit_s) -> Solution``, and
registers under a name (like opt_einsum's path registry), so a new method (a MIP
solver, a DP over layers) plugs in without touching the mapper:

- ``mip`` (alias ``scip``): SCIP through OR-Tools, same model and cuts
  (see :func:`solve_mip` for why it is the default).
- ``cpsat``: OR-Tools CP-SAT. Why CP-SAT: the model is a
  pure set partition (one boolean per candidate, one ``sum == 1`` per Einsum) with a
  linear integer objective; CP-SAT's LP relaxation plus clause learning proves
  optimality on such models quickly, and under a time limit it returns the best
  solution found with a proven lower bound (hence a gap). Schedulability (the
  quotient graph of the chosen groups must be acyclic) is added lazily: each cycle
  found in a solution becomes a no-good cut ``sum(x_c for c on the cycle) <= k - 1``
  and the model is re-solved; convex candidates rarely form cycles, so this beats an
  order encoding with one integer position per Einsum.
- ``layers`` (:mod:`.layers`): a chain of identical layers as an exact shortest path over its layer
  boundaries, one small ``mip`` per distinct layer subproblem; anything else goes to ``mip``.
- ``downsets``: a shortest path over the cascade's downsets (sets of Einsums closed under their producers):
  every schedulable cover, its groups in execution order, is a path from the empty set to all Einsums that adds
  one group at a time, and every such path is one (:func:`solve_downsets`). Exact with no cuts and no LP; the
  one-layer space's solver when its downsets are few (a Mamba-2 layer has 386) and the problem has no extra rows.
- ``ilp`` (the default name): ``downsets`` where it applies, else ``mip``.
- ``exhaustive``: depth-first enumeration of every partition into candidates (with a
  cost-bound prune, exact because costs are non-negative), for small cascades only;
  the cross-check of ``cpsat``.

Costs arrive already scaled to non-negative integers (the caller states the resolution).

**Ties** (:attr:`Problem.secondary`): every backend minimises lexicographically, the objective
first, then the secondary costs (traffic when minimising latency, and vice versa) among the
covers of least objective. ``mip`` and ``cpsat`` solve twice (:func:`lexicographic`); ``exhaustive``
compares pairs; ``layers`` runs its shortest path on pairs. A weighted single objective was
rejected: objective units reach 2^40, so weighting them above any secondary sum needs about 2^80,
past both SCIP's doubles (exact to 2^53) and CP-SAT's int64.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np

from mambalaya.errors import MappingError

#: CP-SAT search workers: its portfolio wants several, but more than the machine's cores only time-slice.
WORKERS = max(1, min(8, os.cpu_count() or 1))
#: The most downsets :func:`solve_downsets` walks; a problem with more goes to ``mip`` under ``ilp``.
DOWNSETS_MAX = 100_000
#: The largest cascade (in Einsums) ``exhaustive`` accepts.
EXHAUSTIVE_MAX_EINSUMS = 40


@dataclass(frozen=True)
class Problem:
    """An exact-cover instance: Einsums, their dependence edges, candidate groups with integer costs."""

    einsums: tuple[str, ...]  # in a topological (cascade) order
    edges: tuple[tuple[str, str], ...]
    groups: tuple[tuple[str, ...], ...]
    costs: tuple[int, ...]
    secondary: tuple[int, ...] = ()  # tie-breaking costs (non-negative; empty: none)
    budget: tuple[tuple[int, ...], int] | None = None  # (coefficients, rhs): sum(coef_c x_c) <= rhs
    conflicts: tuple[tuple[int, ...], ...] = ()  # sets of columns of which at most one is chosen

    def second(self, i: int) -> int:
        return self.secondary[i] if self.secondary else 0


class SolveTimeout(MappingError):
    """A method without an incumbent to return ran past its time limit."""


@dataclass(frozen=True)
class Solution:
    """Chosen candidate indices (any order), the integer objective, and what was proven."""

    chosen: tuple[int, ...]
    objective: int
    optimal: bool  # proven lexicographically optimal (objective, then secondary)
    bound: int  # proven lower bound on the objective
    method: str
    cuts: int = 0
    nodes: int = 0  # search nodes (exhaustive) or solver calls (cpsat)
    secondary: int = 0  # the chosen candidates' secondary costs

    @property
    def gap(self) -> float:
        return 0.0 if self.objective <= 0 else max(0.0, (self.objective - self.bound) / self.objective)


Backend = Callable[[Problem, float | None], Solution]
SOLVERS: dict[str, Backend] = {}
ALIASES = {"scip": "mip", "cp-sat": "cpsat", "brute": "exhaustive"}


def register_solver(name: str) -> Callable[[Backend], Backend]:
    """Decorator: make ``fn`` available as ``method=name``."""

    def deco(fn: Backend) -> Backend:
        SOLVERS[name] = fn
        return fn

    return deco


def solve(problem: Problem, method: str = "cpsat", time_limit_s: float | None = None) -> Solution:
    """Run the named backend on ``problem``."""
    key = ALIASES.get(method, method)
    if key not in SOLVERS:
        raise MappingError(f"unknown mapping method '{method}' (known: {', '.join(sorted([*SOLVERS, *ALIASES]))})")
    return SOLVERS[key](problem, time_limit_s)


def quotient_cycle(problem: Problem, chosen: tuple[int, ...]) -> list[int] | None:
    """Candidates on a cycle of the chosen groups' quotient graph, or None when it is schedulable."""
    owner = {e: c for c in chosen for e in problem.groups[c]}
    q = nx.DiGraph()
    q.add_nodes_from(chosen)
    q.add_edges_from((owner[u], owner[v]) for u, v in problem.edges if owner[u] != owner[v])
    try:
        cyc = nx.find_cycle(q)
    except nx.NetworkXNoCycle:
        return None
    return sorted({u for u, _ in cyc})


def schedule(problem: Problem, chosen: tuple[int, ...]) -> list[int]:
    """The chosen candidates in an execution order (producers first; cascade order breaks ties)."""
    owner = {e: c for c in chosen for e in problem.groups[c]}
    pos = {e: i for i, e in enumerate(problem.einsums)}
    q = nx.DiGraph()
    q.add_nodes_from(chosen)
    q.add_edges_from((owner[u], owner[v]) for u, v in problem.edges if owner[u] != owner[v])
    first = {c: min(pos[e] for e in problem.groups[c]) for c in chosen}
    return list(nx.lexicographical_topological_sort(q, key=first.__getitem__))


def _integer_duals(problem: Problem) -> dict[str, int]:
    """LP duals of the set partition (GLOP), rounded down to integers (zeros when the LP fails)."""
    from ortools.linear_solver import pywraplp

    lp = pywraplp.Solver.CreateSolver("GLOP")
    if lp is None:  # pragma: no cover
        return dict.fromkeys(problem.einsums, 0)
    rows = {e: lp.Constraint(1.0, 1.0) for e in problem.einsums}
    obj = lp.Objective()
    for g, c in zip(problem.groups, problem.costs, strict=True):
        v = lp.NumVar(0.0, lp.infinity(), "")
        for e in g:
            rows[e].SetCoefficient(v, 1.0)
        obj.SetCoefficient(v, float(c))
    obj.SetMinimization()
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        return dict.fromkeys(problem.einsums, 0)
    return {e: math.floor(r.dual_value()) for e, r in rows.items()}


def lexicographic(problem: Problem, once: Backend, time_limit_s: float | None, method: str) -> Solution:
    """Least objective, then least secondary among the covers of least objective: two solves.

    Exact, in integers: with any integers y_e and reduced costs ``rc_c = cost_c - y(c)`` every cover
    costs ``y(all) + sum(rc_c x_c)``, so "objective <= optimum P" is ``sum(rc_c x_c) <= P - y(all)``.
    With y the floored LP duals that right-hand side is the integrality gap plus rounding (usually a
    few units), so SCIP's relative feasibility tolerance (1e-6 of the row) cannot let a worse
    objective through as it could on ``sum(cost_c x_c) <= P`` with P near 2^40; and a column with
    ``rc_c + sum(min(0, rc)) > P - y(all)`` is in no optimal cover and is dropped (most of them: the
    second solve is small). The result's objective is re-checked in integers; should it ever miss P,
    the first solution is returned, not marked optimal.
    """
    if problem.secondary and problem.budget is not None:
        raise MappingError("a problem with secondary costs cannot carry a budget (the second solve sets it)")
    start = time.perf_counter()
    first = once(replace(problem, secondary=()), time_limit_s)
    if not problem.secondary:
        return first
    first = replace(first, secondary=sum(problem.secondary[i] for i in first.chosen))
    y = _integer_duals(problem)
    rc = [c - sum(y[e] for e in g) for g, c in zip(problem.groups, problem.costs, strict=True)]
    gap = first.objective - sum(y.values())
    neg = sum(r for r in rc if r < 0)
    keep = [i for i, r in enumerate(rc) if r < 0 or r + neg <= gap]
    vacuous = all(rc[i] == 0 for i in keep) and gap >= 0
    at = {i: k for k, i in enumerate(keep)}
    rows = tuple(r for r in (tuple(at[i] for i in row if i in at) for row in problem.conflicts) if len(r) > 1)
    sub = Problem(problem.einsums, problem.edges, tuple(problem.groups[i] for i in keep),
                  tuple(problem.secondary[i] for i in keep),
                  budget=None if vacuous else (tuple(rc[i] for i in keep), gap), conflicts=rows)
    second = _second_solve(sub, once, start, time_limit_s, time.perf_counter() - start)
    if second is None:
        return replace(first, optimal=False)
    chosen = tuple(keep[i] for i in second.chosen)
    if sum(problem.costs[i] for i in chosen) != first.objective:
        return replace(first, optimal=False)
    return Solution(chosen, first.objective, first.optimal and second.optimal, first.bound, method,
                    first.cuts + second.cuts, first.nodes + second.nodes, second.objective)


#: the second solve's own limit, in multiples of the first's time (at least SECOND_SOLVE_MIN_S): SCIP can
#: stall on the budget row (a knapsack with coefficients up to 2^24 over a few hundred columns) that CP-SAT,
#: searching on integers, settles in under a second
SECOND_SOLVE_FACTOR, SECOND_SOLVE_MIN_S = 20.0, 2.0


def _second_solve(sub: Problem, once: Backend, start: float, time_limit_s: float | None,
                  first_s: float) -> Solution | None:
    """The least-secondary cover within the budget: ``once`` under its own limit, then CP-SAT with what is left."""
    def left() -> float | None:
        return None if time_limit_s is None else max(0.01, time_limit_s - (time.perf_counter() - start))

    cap = max(SECOND_SOLVE_MIN_S, SECOND_SOLVE_FACTOR * first_s)
    own = left()
    found = None
    try:
        found = once(sub, cap if own is None else min(cap, own))
    except MappingError:
        pass
    if once is _cpsat_once or (found is not None and found.optimal):
        return found
    try:
        other = _cpsat_once(sub, left())
    except MappingError:
        return found
    return other if other.optimal or found is None else found


@register_solver("cpsat")
def solve_cpsat(problem: Problem, time_limit_s: float | None = None) -> Solution:
    """Set partition on CP-SAT with lazy acyclicity cuts (see the module docstring), lexicographic."""
    return lexicographic(problem, _cpsat_once, time_limit_s, "cpsat")


def _cpsat_once(problem: Problem, time_limit_s: float | None = None) -> Solution:
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    x = [model.NewBoolVar(f"g{i}") for i in range(len(problem.groups))]
    covering: dict[str, list[int]] = {e: [] for e in problem.einsums}
    for i, g in enumerate(problem.groups):
        for e in g:
            covering[e].append(i)
    for e, cs in covering.items():
        if not cs:
            raise MappingError(f"no candidate group contains Einsum {e}")
        model.AddExactlyOne(x[i] for i in cs)
    if problem.budget is not None:
        terms = [a * v for a, v in zip(problem.budget[0], x, strict=True) if a]
        if terms:
            model.Add(sum(terms) <= problem.budget[1])
        elif problem.budget[1] < 0:
            raise MappingError("no partition within the budget exists")
    for row in problem.conflicts:
        model.AddAtMostOne(x[i] for i in row)
    model.Minimize(sum(c * v for c, v in zip(problem.costs, x, strict=True)))
    start = time.perf_counter()
    cuts = calls = 0
    while True:
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = WORKERS
        if time_limit_s is not None:
            solver.parameters.max_time_in_seconds = max(0.01, time_limit_s - (time.perf_counter() - start))
        status = solver.Solve(model)
        calls += 1
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise MappingError("no schedulable partition into legal fusion groups exists"
                               if status == cp_model.INFEASIBLE else
                               f"CP-SAT found no mapping within {time_limit_s} s (status {solver.StatusName(status)})")
        chosen = tuple(i for i, v in enumerate(x) if solver.BooleanValue(v))
        cycle = quotient_cycle(problem, chosen)
        bound = int(round(solver.BestObjectiveBound()))
        if cycle is None:
            obj = int(round(solver.ObjectiveValue()))
            return Solution(chosen, obj, status == cp_model.OPTIMAL, bound if status != cp_model.OPTIMAL else obj,
                            "cpsat", cuts, calls)
        if time_limit_s is not None and time.perf_counter() - start >= time_limit_s:
            raise MappingError(f"CP-SAT ran out of time ({time_limit_s} s) while removing cyclic schedules")
        model.Add(sum(x[i] for i in cycle) <= len(cycle) - 1)
        cuts += 1
        # warm start: the same solution minus one group of the cycle is usually close
        model.ClearHints()
        for i, v in enumerate(x):
            model.AddHint(v, i in chosen and i not in cycle)


@register_solver("mip")
def solve_mip(problem: Problem, time_limit_s: float | None = None) -> Solution:
    """Set partition on SCIP (:func:`_mip_once`), lexicographic (:func:`lexicographic`)."""
    return lexicographic(problem, _mip_once, time_limit_s, "mip")


def _mip_once(problem: Problem, time_limit_s: float | None = None) -> Solution:
    """Set partition on SCIP (OR-Tools' MIP backend) with the same lazy acyclicity cuts as ``cpsat``.

    The default: a chain of layers is a set partition with a near-integral LP relaxation, which
    SCIP's LP-based branch and bound proves at the root (8 mamba2 layers: 14k columns, about 1 s),
    while CP-SAT's search on two cores did not prove it in minutes once costs had 1 ps resolution.
    SCIP runs with a zero relative and absolute gap, so ``optimal`` means proven (to its tolerances,
    about 1e-9 of the objective).
    """
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("SCIP")
    if solver is None:  # pragma: no cover - OR-Tools built without SCIP
        return _cpsat_once(problem, time_limit_s)
    x = [solver.BoolVar(f"g{i}") for i in range(len(problem.groups))]
    covering: dict[str, list[int]] = {e: [] for e in problem.einsums}
    for i, g in enumerate(problem.groups):
        for e in g:
            covering[e].append(i)
    for e, cs in covering.items():
        if not cs:
            raise MappingError(f"no candidate group contains Einsum {e}")
        row = solver.Constraint(1.0, 1.0)  # sum == 1 (the coefficient API: the natural one is slow in Python)
        for i in cs:
            row.SetCoefficient(x[i], 1.0)
    if problem.budget is not None:
        row = solver.Constraint(-solver.infinity(), float(problem.budget[1]))
        for a, v in zip(problem.budget[0], x, strict=True):
            if a:
                row.SetCoefficient(v, float(a))
    for rowset in problem.conflicts:
        row = solver.Constraint(-solver.infinity(), 1.0)
        for i in rowset:
            row.SetCoefficient(x[i], 1.0)
    obj = solver.Objective()
    for c, v in zip(problem.costs, x, strict=True):
        obj.SetCoefficient(v, float(c))
    obj.SetMinimization()
    solver.SetSolverSpecificParametersAsString("limits/gap = 0\nlimits/absgap = 0\n")
    start = time.perf_counter()
    cuts = calls = 0
    while True:
        if time_limit_s is not None:
            solver.SetTimeLimit(int(max(10.0, 1000 * (time_limit_s - (time.perf_counter() - start)))))
        status = solver.Solve()
        calls += 1
        if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            raise MappingError("no schedulable partition into legal fusion groups exists"
                               if status == pywraplp.Solver.INFEASIBLE else
                               f"SCIP found no mapping within {time_limit_s} s (status {status})")
        chosen = tuple(i for i, v in enumerate(x) if v.solution_value() > 0.5)
        cycle = quotient_cycle(problem, chosen)
        if cycle is None:
            value = sum(problem.costs[i] for i in chosen)
            optimal = status == pywraplp.Solver.OPTIMAL
            bound = value if optimal else min(value, int(obj.BestBound()))
            return Solution(chosen, value, optimal, bound, "mip", cuts, calls)
        if time_limit_s is not None and time.perf_counter() - start >= time_limit_s:
            raise MappingError(f"SCIP ran out of time ({time_limit_s} s) while removing cyclic schedules")
        cut = solver.Constraint(-solver.infinity(), float(len(cycle) - 1))
        for i in cycle:
            cut.SetCoefficient(x[i], 1.0)
        cuts += 1


@register_solver("exhaustive")
def solve_exhaustive(problem: Problem, time_limit_s: float | None = None) -> Solution:
    """Every partition into candidates, depth first in cascade order; the cross-check of ``cpsat``.

    Lexicographic directly: a partial cover's (objective, secondary) pair only grows, so it is pruned
    once it is no better than the best complete one; a column sharing a conflict row with a chosen one
    is skipped; the budget (if any) is checked on complete covers.
    """
    n = len(problem.einsums)
    if n > EXHAUSTIVE_MAX_EINSUMS:
        raise MappingError(f"method 'exhaustive' handles at most {EXHAUSTIVE_MAX_EINSUMS} Einsums; this cascade "
                           f"has {n}: use method 'ilp'")
    by_first: dict[str, list[int]] = {e: [] for e in problem.einsums}
    pos = {e: i for i, e in enumerate(problem.einsums)}
    for i, g in enumerate(problem.groups):
        by_first[min(g, key=pos.__getitem__)].append(i)
    for lst in by_first.values():
        lst.sort(key=lambda i: (problem.costs[i], problem.second(i)))
    best: list = [None, None]  # (objective, secondary), chosen
    stats = {"nodes": 0}
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s

    def within_budget(chosen: tuple[int, ...]) -> bool:
        return problem.budget is None or sum(problem.budget[0][i] for i in chosen) <= problem.budget[1]

    rows_of: dict[int, list[frozenset[int]]] = {}
    for row in map(frozenset, problem.conflicts):
        for i in row:
            rows_of.setdefault(i, []).append(row)

    def clashes(chosen: tuple[int, ...], i: int) -> bool:
        """Whether column i shares an at-most-one row with a chosen column."""
        return any(j in row for row in rows_of.get(i, ()) for j in chosen)

    def rec(k: int, covered: frozenset[str], chosen: tuple[int, ...], cost: tuple[int, int]) -> None:
        stats["nodes"] += 1
        if best[0] is not None and cost >= best[0]:
            return
        while k < n and problem.einsums[k] in covered:
            k += 1
        if k == n:
            if within_budget(chosen) and quotient_cycle(problem, chosen) is None:
                best[0], best[1] = cost, chosen
            return
        if deadline is not None and stats["nodes"] % 4096 == 0 and time.perf_counter() > deadline:
            raise SolveTimeout(f"exhaustive search exceeded its {time_limit_s} s limit")
        for i in by_first[problem.einsums[k]]:
            g = problem.groups[i]
            if covered.isdisjoint(g) and not clashes(chosen, i):
                rec(k + 1, covered | set(g), (*chosen, i), (cost[0] + problem.costs[i], cost[1] + problem.second(i)))

    rec(0, frozenset(), (), (0, 0))
    if best[1] is None:
        raise MappingError("no schedulable partition into legal fusion groups exists")
    (obj, sec), chosen = best
    return Solution(chosen, obj, True, obj, "exhaustive", 0, stats["nodes"], sec)


class TooManyDownsets(MappingError):
    """The problem has more downsets than :data:`DOWNSETS_MAX` (``ilp`` then solves it with ``mip``)."""


def _walkable(problem: Problem) -> None:
    """Refuse a problem the downset walk cannot solve (extra rows)."""
    if problem.budget is not None or problem.conflicts:
        raise MappingError("method 'downsets' takes no budget or conflict rows: use 'mip'")


class _Downsets:
    """A problem's candidates as bit masks over its Einsums, and its downsets walked by size (each reached
    before any step leaves it: a step adds at least one Einsum)."""

    def __init__(self, problem: Problem) -> None:
        _walkable(problem)
        self.problem = problem
        pos = {e: i for i, e in enumerate(problem.einsums)}
        pred = [0] * len(pos)
        for u, v in problem.edges:
            pred[pos[v]] |= 1 << pos[u]
        self.masks, self.outside = [], []
        covered = 0
        for g in problem.groups:
            m = p = 0
            for e in g:
                m |= 1 << pos[e]
                p |= pred[pos[e]]
            self.masks.append(m)
            self.outside.append(p & ~m)  # its producers outside it: the downset must hold them
            covered |= m
        self.n, self.full = len(pos), (1 << len(pos)) - 1
        # (up to 64 Einsums the steps from a downset are found for every candidate at once)
        self.vector = (np.array(self.masks, dtype=np.uint64), np.array(self.outside, dtype=np.uint64)) \
            if self.n <= 64 else None
        if covered != self.full:
            missing = next(e for e, i in pos.items() if not covered >> i & 1)
            raise MappingError(f"no candidate group contains Einsum {missing}")
        self.visited = 0

    def walk(self, time_limit_s: float | None = None):
        """Yield ``(downset, step)`` for every step from every downset, smaller downsets first; a downset's steps
        come after every step into it. Raises :class:`TooManyDownsets` past :data:`DOWNSETS_MAX`."""
        deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
        by_size: list[list[int]] = [[] for _ in range(self.n + 1)]
        by_size[0].append(0)
        seen = {0}
        masks, outside = self.masks, self.outside
        for size in range(self.n):
            for d in by_size[size]:
                self.visited += 1
                if self.visited > DOWNSETS_MAX:
                    raise TooManyDownsets(f"more than {DOWNSETS_MAX} downsets: use method 'mip'")
                if deadline is not None and self.visited % 256 == 0 and time.perf_counter() > deadline:
                    raise SolveTimeout(f"method 'downsets' exceeded its {time_limit_s} s limit")
                free = ~d
                if self.vector is not None:
                    steps = np.flatnonzero(((self.vector[0] & np.uint64(d)) == 0)
                                           & ((self.vector[1] & np.uint64(self.full & free)) == 0)).tolist()
                else:
                    steps = [i for i, m in enumerate(masks) if not (m & d or outside[i] & free)]
                for i in steps:
                    m = masks[i]
                    nd = d | m
                    if nd not in seen:
                        seen.add(nd)
                        by_size[nd.bit_count()].append(nd)
                    yield d, i


#: the last walk (:func:`_walked`): (einsums, edges, groups) of its problem, its downsets, its steps
_LAST_WALK: list[tuple[tuple, _Downsets, list[tuple[int, int]]]] = []


def _walked(problem: Problem, time_limit_s: float | None = None) -> tuple[_Downsets, list[tuple[int, int]]]:
    """A problem's downsets and every step of their walk (:meth:`_Downsets.walk`), kept for the next problem over
    the same candidates (the lazy loop solves a problem, then prunes by its cheapest covers: costs differ, the walk
    does not)."""
    _walkable(problem)
    key = (problem.einsums, problem.edges, problem.groups)
    if _LAST_WALK and all(a is b for a, b in zip(_LAST_WALK[0][0], key, strict=True)):
        ds = _LAST_WALK[0][1]
        if ds.visited > DOWNSETS_MAX:  # (the limit holds as if it were walked again)
            raise TooManyDownsets(f"more than {DOWNSETS_MAX} downsets: use method 'mip'")
        return ds, _LAST_WALK[0][2]
    ds = _Downsets(problem)
    steps = list(ds.walk(time_limit_s))
    _LAST_WALK[:] = [(key, ds, steps)]
    return ds, steps


@register_solver("downsets")
def solve_downsets(problem: Problem, time_limit_s: float | None = None) -> Solution:
    """The lexicographic optimum as a shortest path over downsets, exact.

    A downset is a set of Einsums that holds every producer of its members. A candidate ``g`` extends a downset
    ``D`` when it is disjoint from it and every producer of a member of ``g`` outside ``g`` is in ``D``; then
    ``D | g`` is a downset. A cover whose quotient graph is acyclic, its groups in a topological order, is a path
    from the empty set to all Einsums by such steps (each group's outside producers are in earlier groups); and the
    groups of any such path form a schedulable cover (an edge between two of them runs from the earlier one). So the
    least (objective, secondary) path is the optimum over exactly the covers ``mip`` and ``exhaustive`` search;
    costs are non-negative integers, compared as pairs. Problems with a budget or conflict rows are not for it.
    """
    ds, steps = _walked(problem, time_limit_s)
    # best[D] = ((objective, secondary), last candidate, previous downset)
    best: dict[int, tuple[tuple[int, int], int, int]] = {0: ((0, 0), -1, -1)}
    for d, i in steps:
        (c0, c1), _, _ = best[d]
        nd = d | ds.masks[i]
        cost = (c0 + problem.costs[i], c1 + problem.second(i))
        got = best.get(nd)
        if got is None or cost < got[0]:
            best[nd] = (cost, i, d)
    if ds.full not in best:
        raise MappingError("no schedulable partition into legal fusion groups exists")
    (obj, sec), _, _ = best[ds.full]
    chosen, d = [], ds.full
    while d:
        _, i, d = best[d]
        chosen.append(i)
    return Solution(tuple(reversed(chosen)), obj, True, obj, "downsets", 0, ds.visited, sec)


def cheapest_covers(problem: Problem, within: Collection[int] | None = None) -> tuple[int | None, list[int | None]]:
    """The least objective of any schedulable cover (of the candidates ``within`` alone, when given; None: none
    is), and per candidate the least objective of any cover that holds it (None: none does). With lower bounds
    for some costs, a candidate whose figure passes a cover's true cost is in no optimal cover (what the lazy space
    prunes with; its true costs are ``within``). Forward and backward shortest paths over the downsets
    (:func:`solve_downsets`), one walk for both."""
    ds, steps = _walked(problem)
    fwd = {0: 0}
    only = None if within is None else set(within)
    fwd_only = {0: 0}
    for d, i in steps:
        c = fwd[d] + problem.costs[i]
        nd = d | ds.masks[i]
        if c < fwd.get(nd, c + 1):
            fwd[nd] = c
        if only is not None and i in only and d in fwd_only:
            c = fwd_only[d] + problem.costs[i]
            if c < fwd_only.get(nd, c + 1):
                fwd_only[nd] = c
    back = {ds.full: 0}
    for d, i in reversed(steps):  # (a downset's steps come after every step into it: reversed, after every step out)
        rest = back.get(d | ds.masks[i])
        if rest is not None and problem.costs[i] + rest < back.get(d, problem.costs[i] + rest + 1):
            back[d] = problem.costs[i] + rest
    through: list[int | None] = [None] * len(problem.groups)
    for d, i in steps:
        rest = back.get(d | ds.masks[i])
        if rest is not None:
            t = fwd[d] + problem.costs[i] + rest
            if through[i] is None or t < through[i]:
                through[i] = t
    return (back.get(0) if only is None else fwd_only.get(ds.full)), through


@register_solver("ilp")
def solve_ilp(problem: Problem, time_limit_s: float | None = None) -> Solution:
    """The exact optimiser: :func:`solve_downsets` when the problem has no extra rows and few enough downsets,
    else :func:`solve_mip`."""
    if problem.budget is None and not problem.conflicts:
        try:
            return solve_downsets(problem, time_limit_s)
        except TooManyDownsets:
            pass
    return solve_mip(problem, time_limit_s)

