"""Exact whole-model mapping: a shortest path over layer boundaries (solver ``layers``).

A chain of identical layers (``chain_layers``) is a set partition whose columns are every layer's
copy of the within-layer candidates and every boundary's copy of the crossing ones. One SCIP model
of 64 layers of Mamba-1 (69k columns) does not close its gap in minutes; this solver splits it into
one-layer subproblems, exactly:

1. **At most one crossing group per boundary.** The only Einsum edges between layer k and k+1 leave
   the *hinge* h (the producer of the fed output), or pass through the adapter a between them. A
   crossing group is connected, so it holds h_k (or a); the groups of a cover are disjoint. (With
   an adapter, exactly one: a must be covered.) :func:`chain_structure` checks all of this on the
   problem itself and declines (the monolithic MIP runs) when it does not hold.
2. **Additivity.** A cover is a choice x_k per boundary (a crossing candidate or none) plus, per
   layer k, a cover of what x_{k-1}'s head H (its members in layer k) and x_k's tail T (its members
   in layer k) leave of the layer, by within-layer candidates. Its cost is the sum.
3. **Schedulability is local.** Number the layers' levels 0, 2, 4, ... and the adapters' the odd
   ones between. Edges never go down a level; a group's levels are an interval; at most one group
   spans a cut between two levels (it holds the hinge or the adapter, by 1), and every edge across
   the cut has an endpoint in it. So a simple cycle of the groups' quotient graph has all its
   groups touching one level: else some g_a lies wholly below a cut and some g_b wholly above it;
   the way from g_b down to g_a must pass the cut's spanning group (only it holds both sides), and
   so must the way from g_a up to g_b (an edge across the cut has an endpoint in it): two visits,
   which a simple cycle cannot make. A cover is thus schedulable iff, for every layer k, the
   groups touching layer k are (an adapter's level has one group). Those are the subproblem's groups with x_{k-1} replaced by
   ``{<in>} + H`` and x_k by ``T + {<out>}``, ``<in>`` feeding the layer's input readers and the
   hinge feeding ``<out>``: edge by edge the same quotient graph, as nothing else of x_{k-1} or x_k
   touches layer k. It depends on (H, T) only.
4. **Shortest path.** Hence the optimum is a shortest path through the layers whose arc for layer
   k costs W(H(x_{k-1}), T(x_k)) + cost(x_k), W being that subproblem's optimum (the same MIP with
   lazy cycle cuts, cached: identical layers share it). Arcs start at a Lagrangian lower bound (LP
   duals of the layer-folded partition, exact for any duals); the path is recomputed and its
   unevaluated arcs solved until every arc on it is exact. It then costs no more than any other
   path's lower bound, so it is optimal.
5. **Ties.** Costs are (objective, secondary) pairs compared lexicographically (the solver module's
   tie-break): both parts add up as above, W is solved lexicographically, a lower bound ``lb`` of
   the objective is the pair ``(lb, 0)`` (secondary costs are non-negative), and the shortest path
   takes the least secondary among its least-objective choices (:func:`_lexargmin`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from mambalaya.errors import MappingError
from mambalaya.ir.chain import split_layer_name
from mambalaya.mapper.solver import Problem, Solution, register_solver, solve

IN, OUT = "<in>", "<out>"
Key = tuple[frozenset[str], frozenset[str]]  # a crossing candidate's (tail, head) in one-layer names
Cost = tuple[int, int]  # (objective, secondary)
INF = float("inf")


@dataclass
class Chain:
    """A chain problem seen as one layer: its columns, edges and boundary, with their chain indices."""

    layers: int
    einsums: tuple[str, ...]  # one layer's Einsums (base names), cascade order
    edges: tuple[tuple[str, str], ...]  # within one layer
    feeds: tuple[str, ...]  # layer Einsums reading the previous layer (or its adapter)
    hinge: str  # the layer Einsum the next layer reads
    adapter: bool  # an adapter Einsum sits between layers: every boundary needs a crossing group
    within: dict[tuple[str, ...], Cost] = field(default_factory=dict)  # members -> cost
    within_at: list[dict[tuple[str, ...], int]] = field(default_factory=list)  # per layer: members -> column
    cross: dict[Key, Cost] = field(default_factory=dict)  # (tail, head) -> least cost
    cross_at: list[dict[Key, int]] = field(default_factory=list)  # per boundary: (tail, head) -> column


def _where(name: str, bases: set[str]) -> tuple[str, int, str] | None:
    """(base, index, 'layer' or 'adapter') of a chain Einsum; an adapter belongs to the boundary before it."""
    base, k = split_layer_name(name)
    if k is None:
        return None
    return (base, k, "layer") if base in bases else (base, k - 1, "adapter")


def chain_structure(problem: Problem) -> Chain | None:
    """The problem as identical layers joined through one hinge per boundary, or None when it is not."""
    first = [split_layer_name(e) for e in problem.einsums]
    if any(k is None for _, k in first):
        return None
    bases = {b for b, k in first if k == 0}
    where = {e: _where(e, bases) for e in problem.einsums}
    layers = 1 + max(k for _, k, kind in where.values() if kind == "layer")  # type: ignore[union-attr]
    per_layer: list[list[str]] = [[] for _ in range(layers)]
    adapters: dict[int, str] = {}
    for b, k, kind in where.values():  # type: ignore[misc]
        if kind == "layer":
            per_layer[k].append(b)
        elif k in adapters or not 0 <= k < layers - 1:
            return None
        else:
            adapters[k] = b
    order = tuple(per_layer[0])
    if layers < 2 or any(tuple(p) != order for p in per_layer) or len({*adapters.values()}) > 1 \
            or adapters and len(adapters) != layers - 1:
        return None
    edges: list[set[tuple[str, str]]] = [set() for _ in range(layers)]
    hinges: set[str] = set()
    feeds: list[set[str]] = [set() for _ in range(layers)]
    for u, v in problem.edges:
        (bu, ku, tu), (bv, kv, tv) = where[u], where[v]  # type: ignore[misc]
        if tu == tv == "layer" and ku == kv:
            edges[ku].add((bu, bv))
        elif tu == "layer" and ((tv == "layer" and kv == ku + 1 and not adapters) or (tv == "adapter" and kv == ku)):
            hinges.add(bu)
        elif tu == "adapter" and tv == "layer" and kv == ku + 1:
            feeds[kv].add(bv)
        else:
            return None
        if tu == "layer" and tv == "layer" and kv == ku + 1:
            feeds[kv].add(bv)
    if len(hinges) != 1 or any(e != edges[0] for e in edges) or any(f != feeds[1] for f in feeds[1:]):
        return None
    chain = Chain(layers, order, tuple(sorted(edges[0])), tuple(b for b in order if b in feeds[1]), hinges.pop(),
                  bool(adapters))
    chain.within_at = [{} for _ in range(layers)]
    chain.cross_at = [{} for _ in range(layers - 1)]
    within_cost: list[dict[tuple[str, ...], Cost]] = [{} for _ in range(layers)]
    cross_cost: list[dict[Key, Cost]] = [{} for _ in range(layers - 1)]
    # levels: layer k is 2k, the adapter after it 2k+1
    level = {e: 2 * k + (kind == "adapter") for e, (_, k, kind) in where.items()}  # type: ignore[misc]
    base = {e: b for e, (b, _, _) in where.items()}  # type: ignore[misc]
    for i, g in enumerate(problem.groups):
        cost = (problem.costs[i], problem.second(i))
        levels = {level[e] for e in g}
        lo = min(levels)
        if len(levels) == 1 and not lo % 2:
            key = tuple(base[e] for e in g)
            table, costs = chain.within_at[lo // 2], within_cost[lo // 2]
        else:
            k = lo // 2
            tail = frozenset(base[e] for e in g if level[e] == 2 * k)
            head = frozenset(base[e] for e in g if level[e] == 2 * k + 2)
            holds = 2 * k + 1 in levels if adapters else chain.hinge in tail
            if k >= layers - 1 or not levels <= {2 * k, 2 * k + 1, 2 * k + 2} or not holds:
                return None
            key = (tail, head)
            table, costs = chain.cross_at[k], cross_cost[k]
        if key not in costs or cost < costs[key]:
            costs[key], table[key] = cost, i
    if any(c != within_cost[0] for c in within_cost) or any(c != cross_cost[0] for c in cross_cost):
        return None
    chain.within, chain.cross = within_cost[0], cross_cost[0]
    return chain


def _duals(chain: Chain) -> dict[str, float]:
    """LP duals of one layer's partition with every crossing column folded onto it (any duals give a
    valid Lagrangian bound; these make every column's reduced cost non-negative)."""
    from ortools.linear_solver import pywraplp

    lp = pywraplp.Solver.CreateSolver("GLOP")
    rows = {e: lp.Constraint(1.0, 1.0) for e in chain.einsums}
    obj = lp.Objective()
    cols = [(list(k), c) for k, c in chain.within.items()]
    cols += [([*sorted(t), *sorted(h)], c) for (t, h), c in chain.cross.items() if t or h]
    for members, c in cols:
        v = lp.NumVar(0.0, lp.infinity(), "")
        for e in members:
            rows[e].SetCoefficient(v, rows[e].GetCoefficient(v) + 1.0)
        obj.SetCoefficient(v, float(c[0]))
    obj.SetMinimization()
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        return dict.fromkeys(chain.einsums, 0.0)
    return {e: rows[e].dual_value() for e in chain.einsums}


class _Layer:
    """One layer's subproblem W(head before, tail after): its optimum, cached, and a lower bound."""

    def __init__(self, chain: Chain, method: str, lex: bool) -> None:
        self.chain, self.method, self.lex = chain, method, lex
        self.y = _duals(chain)
        self.margin = 1.0 + 1e-9 * sum(abs(v) for v in self.y.values())  # float rounding of the bound
        self.exact: dict[tuple, tuple[tuple[float, float], tuple[tuple[str, ...], ...], bool]] = {}
        self.cuts = 0

    def bounds(self, heads: list, tails: list) -> np.ndarray:
        """Lower bounds on W for every (head, tail): with y the duals and rc = cost - y(members), a cover
        of the Einsums left costs y(left) + the sum of its columns' rc, which is at least the largest,
        over the Einsums left, of the least rc of a column that covers it, plus the negative rcs."""
        names = self.chain.einsums
        keys = list(self.chain.within)
        cols = np.array([[e in k for e in names] for k in keys], dtype=bool).reshape(len(keys), len(names))
        rc = np.array([self.chain.within[k][0] - sum(self.y[e] for e in k) for k in keys])
        y = np.array([self.y[e] for e in names])
        pairs = [(h, t) for h in heads for t in tails]
        taken = np.array([[e in (h or ()) or e in (t or ()) for e in names] for h, t in pairs], dtype=bool)
        clash = (cols.astype(np.int32) @ taken.T.astype(np.int32)) > 0  # column x pair
        negative = np.where(clash, 0.0, np.minimum(rc, 0.0)[:, None]).sum(axis=0)
        forced = np.zeros(len(pairs))
        for j in range(len(names)):
            least = np.where(clash | ~cols[:, j:j + 1], np.inf, rc[:, None]).min(axis=0, initial=np.inf)
            forced = np.maximum(forced, np.where(taken[:, j], -np.inf, least))
        out = (~taken * y).sum(axis=1) + forced + negative - self.margin
        out[[bool(h and t and h & t) for h, t in pairs]] = INF
        return out.reshape(len(heads), len(tails))

    def solve(self, head: frozenset[str] | None, tail: frozenset[str] | None) -> tuple[float, float]:
        """W(head, tail): the least cost of covering the layer's other Einsums, schedulably (INF: none)."""
        key = (head, tail)
        if key not in self.exact:
            self.exact[key] = self._solve(head, tail)
        return self.exact[key][0]

    def _solve(self, head: frozenset[str] | None, tail: frozenset[str] | None):
        ch = self.chain
        if head is not None and tail is not None and head & tail:
            return (INF, INF), (), True
        taken = (head or frozenset()) | (tail or frozenset())
        einsums, edges = list(ch.einsums), list(ch.edges)
        groups: list[tuple[str, ...]] = []
        if head is not None:
            einsums.insert(0, IN)
            edges += [(IN, f) for f in ch.feeds]
            groups.append((IN, *(e for e in ch.einsums if e in head)))
        if tail is not None:
            einsums.append(OUT)
            edges.append((ch.hinge, OUT))
            groups.append((*(e for e in ch.einsums if e in tail), OUT))
        fixed = len(groups)
        costs, second = [0] * fixed, [0] * fixed
        for k, c in ch.within.items():
            if taken.isdisjoint(k):
                groups.append(k)
                costs.append(c[0])
                second.append(c[1])
        sub = Problem(tuple(einsums), tuple(edges), tuple(groups), tuple(costs), tuple(second) if self.lex else ())
        try:
            sol = solve(sub, self.method)
        except MappingError:
            return (INF, INF), (), True
        self.cuts += sol.cuts
        return ((float(sol.objective), float(sol.secondary)), tuple(groups[i] for i in sol.chosen if i >= fixed),
                sol.optimal)

    def cover(self, head: frozenset[str] | None, tail: frozenset[str] | None) -> tuple[tuple[str, ...], ...]:
        return self.exact[(head, tail)][1]


def _lexargmin(a: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """Per column (axis 0) the row of least ``a``, ties broken by least ``a2`` (objective values are
    sums of integers, exact in floats, so equal objectives compare equal)."""
    return np.where(a == a.min(axis=0), a2, INF).argmin(axis=0)


def _shortest(chain: Chain, heads: list, tails: list, arc: tuple[np.ndarray, np.ndarray],
              bcost: tuple[np.ndarray, np.ndarray]):
    """Lexicographic shortest path through the layers: per layer the (head, tail) arc taken, per
    boundary the (tail, head) crossing choice. ``arc[.][h, t]`` is a layer's cost (objective,
    secondary), ``bcost[.][t, h]`` a boundary's."""
    total, total2 = np.full(len(heads), INF), np.full(len(heads), INF)
    total[0] = total2[0] = 0.0  # heads[0] is None: nothing crosses into the first layer
    back: list[tuple[np.ndarray, np.ndarray]] = []
    cols_t, cols_h = np.arange(len(tails)), np.arange(len(heads))
    for _ in range(chain.layers - 1):
        a, a2 = total[:, None] + arc[0], total2[:, None] + arc[1]
        h_of_t = _lexargmin(a, a2)
        by_t, by_t2 = a[h_of_t, cols_t], a2[h_of_t, cols_t]
        b, b2 = by_t[:, None] + bcost[0], by_t2[:, None] + bcost[1]
        t_of_h = _lexargmin(b, b2)
        total, total2 = b[t_of_h, cols_h], b2[t_of_h, cols_h]
        back.append((h_of_t, t_of_h))
    last, last2 = total + arc[0][:, 0], total2 + arc[1][:, 0]  # tails[0] is None: nothing crosses out
    h = int(_lexargmin(last[:, None], last2[:, None])[0])
    value = float(last[h])
    arcs = [(h, 0)]
    for h_of_t, t_of_h in reversed(back):
        t = int(t_of_h[h])
        h = int(h_of_t[t])
        arcs.append((h, t))
    arcs.reverse()
    return value, arcs


@register_solver("layers")
def solve_layers(problem: Problem, time_limit_s: float | None = None, method: str = "ilp") -> Solution:
    """A chain of identical layers by a shortest path over its boundaries (module docstring); any
    other problem, or one past its time limit, goes to the monolithic ``method``."""
    start = time.perf_counter()
    chain = chain_structure(problem) if not problem.conflicts else None
    if chain is None:
        return solve(problem, method, time_limit_s)
    layer = _Layer(chain, method, bool(problem.secondary))
    tails: list = [None, *dict.fromkeys(t for t, _ in chain.cross)]
    heads: list = [None, *dict.fromkeys(h for _, h in chain.cross)]
    ti, hi = {t: i for i, t in enumerate(tails)}, {h: i for i, h in enumerate(heads)}
    bcost = (np.full((len(tails), len(heads)), INF), np.full((len(tails), len(heads)), INF))
    if not chain.adapter:
        bcost[0][0, 0] = bcost[1][0, 0] = 0.0  # no crossing group at a boundary
    for (t, h), c in chain.cross.items():
        bcost[0][ti[t], hi[h]], bcost[1][ti[t], hi[h]] = c
    lb = layer.bounds(heads, tails)
    arc = (lb, np.where(lb == INF, INF, 0.0))  # (lb, 0): a lexicographic lower bound
    known = np.zeros(lb.shape, dtype=bool)
    while True:
        value, arcs = _shortest(chain, heads, tails, arc, bcost)
        if value == INF:
            raise MappingError("no schedulable partition into legal fusion groups exists")
        todo = sorted({a for a in arcs if not known[a]})
        if not todo:
            break
        if time_limit_s is not None and time.perf_counter() - start > time_limit_s:
            return solve(problem, method, max(0.01, time_limit_s - (time.perf_counter() - start)))
        for h, t in todo:
            arc[0][h, t], arc[1][h, t] = layer.solve(heads[h], tails[t])
            known[h, t] = True
    chosen: list[int] = []
    for k, (h, t) in enumerate(arcs):
        chosen += [chain.within_at[k][g] for g in layer.cover(heads[h], tails[t])]
        if k < chain.layers - 1:
            nxt = arcs[k + 1][0]
            if tails[t] is not None:
                chosen.append(chain.cross_at[k][(tails[t], heads[nxt])])
    objective = sum(problem.costs[i] for i in chosen)
    optimal = all(layer.exact[(heads[h], tails[t])][2] for h, t in arcs)
    return Solution(tuple(chosen), objective, optimal, objective if optimal else 0, "layers", layer.cuts,
                    len(layer.exact), sum(problem.second(i) for i in chosen))
