"""The solver facade: pick an exact cover of the Einsums by candidate groups, cheapest first.

Every backend has one signature, ``fn(problem, time_limit_s) -> Solution``, and
registers under a name (like opt_einsum's path registry), so a new method (a MIP
solver, a DP over layers) plugs in without touching the mapper:

- ``mip`` (aliases ``ilp``, ``scip``; the default): SCIP through OR-Tools, same model and cuts
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
- ``exhaustive``: depth-first enumeration of every partition into candidates (with a
  cost-bound prune, exact because costs are non-negative), for small cascades only;
  the cross-check of ``cpsat``.

Costs arrive already scaled to non-negative integers (the caller states the resolution).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from mambalaya.errors import MappingError

#: CP-SAT search workers: its portfolio wants several, but more than the machine's cores only time-slice.
WORKERS = max(1, min(8, os.cpu_count() or 1))
#: The largest cascade (in Einsums) ``exhaustive`` accepts.
EXHAUSTIVE_MAX_EINSUMS = 40


@dataclass(frozen=True)
class Problem:
    """An exact-cover instance: Einsums, their dependence edges, candidate groups with integer costs."""

    einsums: tuple[str, ...]  # in a topological (cascade) order
    edges: tuple[tuple[str, str], ...]
    groups: tuple[tuple[str, ...], ...]
    costs: tuple[int, ...]


@dataclass(frozen=True)
class Solution:
    """Chosen candidate indices (any order), the integer objective, and what was proven."""

    chosen: tuple[int, ...]
    objective: int
    optimal: bool
    bound: int  # proven lower bound on the objective
    method: str
    cuts: int = 0
    nodes: int = 0  # search nodes (exhaustive) or solver calls (cpsat)

    @property
    def gap(self) -> float:
        return 0.0 if self.objective <= 0 else max(0.0, (self.objective - self.bound) / self.objective)


Backend = Callable[[Problem, float | None], Solution]
SOLVERS: dict[str, Backend] = {}
ALIASES = {"ilp": "mip", "scip": "mip", "cp-sat": "cpsat", "brute": "exhaustive"}


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


@register_solver("cpsat")
def solve_cpsat(problem: Problem, time_limit_s: float | None = None) -> Solution:
    """Set partition on CP-SAT with lazy acyclicity cuts (see the module docstring)."""
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
        return solve_cpsat(problem, time_limit_s)
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
    """Every partition into candidates, depth first in cascade order; the cross-check of ``cpsat``."""
    n = len(problem.einsums)
    if n > EXHAUSTIVE_MAX_EINSUMS:
        raise MappingError(f"method 'exhaustive' handles at most {EXHAUSTIVE_MAX_EINSUMS} Einsums; this cascade "
                           f"has {n}: use method 'ilp'")
    by_first: dict[str, list[int]] = {e: [] for e in problem.einsums}
    pos = {e: i for i, e in enumerate(problem.einsums)}
    for i, g in enumerate(problem.groups):
        by_first[min(g, key=pos.__getitem__)].append(i)
    for lst in by_first.values():
        lst.sort(key=problem.costs.__getitem__)
    best: list = [None, None]  # objective, chosen
    stats = {"nodes": 0}
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s

    def rec(k: int, covered: frozenset[str], chosen: tuple[int, ...], cost: int) -> None:
        stats["nodes"] += 1
        if best[0] is not None and cost >= best[0]:
            return
        while k < n and problem.einsums[k] in covered:
            k += 1
        if k == n:
            if quotient_cycle(problem, chosen) is None:
                best[0], best[1] = cost, chosen
            return
        if deadline is not None and stats["nodes"] % 4096 == 0 and time.perf_counter() > deadline:
            raise MappingError(f"exhaustive search exceeded its {time_limit_s} s limit")
        for i in by_first[problem.einsums[k]]:
            g = problem.groups[i]
            if covered.isdisjoint(g):
                rec(k + 1, covered | set(g), (*chosen, i), cost + problem.costs[i])

    rec(0, frozenset(), (), 0)
    if best[1] is None:
        raise MappingError("no schedulable partition into legal fusion groups exists")
    return Solution(best[1], best[0], True, best[0], "exhaustive", 0, stats["nodes"])
