"""The reference interpreter: runs a cascade Einsum by Einsum with numpy.

It is the oracle for every other executor, so it favours the obvious over the
fast: each node evaluates to a numpy array with one axis per rank it varies
over; index expressions are evaluated exactly on integer grids; reads outside
a tensor give zero (padding); a recurrence runs its iterative rank as a
Python loop. The one concession to size is that a summed product goes through
``np.einsum`` instead of materialising the whole iteration space.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from mambalaya.errors import MambalayaError
from mambalaya.ir.cascade import Cascade, Einsum
from mambalaya.ir.expr import (
    Access,
    BinOp,
    Call,
    Compare,
    Const,
    Node,
    ParamRef,
    Reduce,
    accesses,
    multiplicative_factors,
)
from mambalaya.ir.functions import FUNCTIONS
from mambalaya.ir.indexing import eval_index


@dataclass
class Value:
    """An array whose axes are the listed ranks, in order."""

    array: np.ndarray
    ranks: tuple[str, ...]

    def aligned(self, ranks: tuple[str, ...]) -> np.ndarray:
        """The array with axes in ``ranks`` order; absent ranks become length-1 axes."""
        order = [self.ranks.index(r) for r in ranks if r in self.ranks]
        arr = np.transpose(self.array, order) if order != list(range(len(order))) else self.array
        shape = list(arr.shape)
        full = []
        it = iter(shape)
        for r in ranks:
            full.append(next(it) if r in self.ranks else 1)
        return arr.reshape(full)


def _union(*ranks: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(r for rs in ranks for r in rs))


# ---- the evaluator -------------------------------------------------------


class Evaluator:
    def __init__(self, cascade: Cascade, env: dict[str, np.ndarray], dtype: np.dtype) -> None:
        self.cascade = cascade
        self.env = env
        self.dtype = dtype
        self.sizes = cascade.rank_sizes
        self.values = cascade.values
        #: ranks evaluated over part of their extent, ``[lo, hi)`` (one step of a recurrence; a schedule's tile)
        self.limits: dict[str, tuple[int, int]] = {}
        self.self_state: tuple[str, np.ndarray, tuple[str, ...]] | None = None

    def rank_len(self, r: str) -> int:
        if r in self.limits:
            lo, hi = self.limits[r]
            return hi - lo
        return self.sizes[r]

    def grids(self, ranks: tuple[str, ...]) -> dict[str, np.ndarray]:
        out = {}
        for i, r in enumerate(ranks):
            shape = [1] * len(ranks)
            shape[i] = self.rank_len(r)
            base = np.arange(*self.limits[r]) if r in self.limits else np.arange(self.sizes[r])
            out[r] = base.reshape(shape)
        return out

    def padded(self, name: str) -> tuple[np.ndarray, int | None]:
        """A tensor's array, with its initial state prepended when it has one."""
        arr = self.env[name]
        e = self.cascade.einsum(name) if self.cascade.producer(name) else None
        if e is None or e.recurrence is None or e.recurrence.init is None:
            return arr, None
        pos = e.recurrence.position
        init = np.expand_dims(self.env[e.recurrence.init], pos)
        return np.concatenate([init, arr], axis=pos), pos

    def access(self, acc: Access) -> Value:
        ranks = tuple(sorted(acc.ranks()))
        if self.self_state is not None and acc.tensor == self.self_state[0]:
            _, state, state_ranks = self.self_state
            return Value(state, state_ranks)
        arr, shifted = self.padded(acc.tensor)
        grids = self.grids(ranks)
        full = tuple(self.rank_len(r) for r in ranks)
        index, valid = [], np.ones(full, dtype=bool)
        for pos, ix in enumerate(acc.indices):
            num, den = eval_index(ix, grids, self.values)
            if den != 1:
                raise MambalayaError(f"index {ix} of {acc.tensor} is fractional")
            if pos == shifted:
                num = num + 1
            num = np.broadcast_to(num, full)
            valid &= (num >= 0) & (num < arr.shape[pos])
            index.append(np.clip(num, 0, arr.shape[pos] - 1))
        if len(acc.indices) != arr.ndim:
            raise MambalayaError(f"{acc.tensor} has {arr.ndim} axes but is read with {len(acc.indices)} indices")
        gathered = arr[tuple(index)] if index else arr
        return Value(np.where(valid, gathered, 0).astype(self.dtype, copy=False), ranks)

    def node(self, node: Node) -> Value:
        if isinstance(node, Access):
            return self.access(node)
        if isinstance(node, Const):
            return Value(np.asarray(node.value, dtype=self.dtype), ())
        if isinstance(node, ParamRef):
            return Value(np.asarray(self.values[node.name], dtype=self.dtype), ())
        if isinstance(node, Call):
            args = [self.node(a) for a in node.args]
            ranks = _union(*(a.ranks for a in args))
            with np.errstate(all="ignore"):
                out = FUNCTIONS[node.fn].numpy(*(a.aligned(ranks) for a in args))
            return Value(np.asarray(out, dtype=self.dtype), ranks)
        if isinstance(node, BinOp):
            lhs, rhs = self.node(node.lhs), self.node(node.rhs)
            ranks = _union(lhs.ranks, rhs.ranks)
            a, b = lhs.aligned(ranks), rhs.aligned(ranks)
            with np.errstate(all="ignore"):
                out = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[node.op](a, b)
            return Value(np.asarray(out, dtype=self.dtype), ranks)
        if isinstance(node, Reduce):
            return self.reduce(node.op, node.rank, node.arg, None)
        raise TypeError(node)

    def reduce(self, op: str, rank: str, arg: Node, mask: Value | None) -> Value:
        if op == "sum":
            return self.summed(arg, (rank,), mask)
        val = self.node(arg)
        if mask is not None:
            val = _masked(val, mask)
        axis = val.ranks.index(rank)
        if op == "cumsum":
            return Value(np.cumsum(val.array, axis=axis, dtype=self.dtype), val.ranks)
        fn = {"max": np.max, "min": np.min, "mean": np.mean}[op]
        rest = tuple(r for r in val.ranks if r != rank)
        return Value(np.asarray(fn(val.array, axis=axis), dtype=self.dtype), rest)

    def summed(self, node: Node, over: tuple[str, ...], mask: Value | None) -> Value:
        """Sum ``node`` over ranks ``over``; a product goes through np.einsum."""
        factors = multiplicative_factors(node)
        if factors is None:
            val = self.node(node)
            if mask is not None:
                val = _masked(val, mask)
            axes = tuple(val.ranks.index(r) for r in over)
            keep = tuple(r for r in val.ranks if r not in over)
            return Value(np.asarray(val.array.sum(axis=axes), dtype=self.dtype), keep)
        vals = [self.node(f) for f in factors]
        if mask is not None:
            vals.append(Value(mask.array.astype(self.dtype), mask.ranks))
        ranks = _union(*(v.ranks for v in vals))
        letters = {r: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26) for i, r in enumerate(ranks)}
        keep = tuple(r for r in ranks if r not in over)
        spec = ",".join("".join(letters[r] for r in v.ranks) for v in vals) + "->" + "".join(letters[r] for r in keep)
        arrays = [np.broadcast_to(v.array, v.array.shape) for v in vals]
        return Value(np.asarray(np.einsum(spec, *arrays, optimize=True), dtype=self.dtype), keep)

    def mask(self, where: tuple[Compare, ...]) -> Value | None:
        if not where:
            return None
        ranks = tuple(sorted({r for c in where for r in c.ranks()}))
        grids = self.grids(ranks)
        full = tuple(self.rank_len(r) for r in ranks)
        ok = np.ones(full, dtype=bool)
        for c in where:
            ln, ld = eval_index(c.lhs, grids, self.values)
            rn, rd = eval_index(c.rhs, grids, self.values)
            a, b = ln * rd, rn * ld
            ok &= {"<=": a <= b, "<": a < b, ">=": a >= b, ">": a > b, "==": a == b, "!=": a != b}[c.op]
        return Value(ok, ranks)

    def einsum(self, e: Einsum, limits: dict[str, tuple[int, int]] | None = None,
               before: np.ndarray | None = None) -> np.ndarray:
        """The output of one Einsum, whole or over ``limits`` (rank -> ``[lo, hi)``: a sub-range of its ranks;
        the output's axes span only those). A recurrence is stepped here, from its initial state, or from
        ``before`` (its step ``lo - 1``, the output's shape with one step) when its rank starts later."""
        saved = self.limits
        self.limits = dict(limits or {})
        try:
            shape = tuple(self.rank_len(r) for r in e.out_ranks)
            rec = e.recurrence
            if rec is None:
                return self.body(e, shape)
            lo, hi = self.limits.get(rec.rank, (0, self.sizes[rec.rank]))
            out = np.zeros(shape, dtype=self.dtype)
            one = shape[: rec.position] + (1,) + shape[rec.position + 1 :]
            if before is not None and lo > 0:
                state = np.asarray(before, dtype=self.dtype).reshape(one)
            elif rec.init is not None:
                state = np.expand_dims(self._init_slice(e).astype(self.dtype), rec.position)
            else:
                state = np.zeros(one, dtype=self.dtype)
            for t in range(lo, hi):
                self.limits[rec.rank] = (t, t + 1)
                self.self_state = (e.name, state, e.out_ranks)
                step = self.body(e, one)
                out[(slice(None),) * rec.position + (slice(t - lo, t - lo + 1),)] = step
                state = step
            return out
        finally:
            self.limits, self.self_state = saved, None

    def _init_slice(self, e: Einsum) -> np.ndarray:
        """The initial state restricted to the limited ranges of the recurrence's other positions."""
        rec = e.recurrence
        assert rec is not None and rec.init is not None
        init = self.env[rec.init]
        index = []
        for r in (x for p, x in enumerate(e.out_ranks) if p != rec.position):
            index.append(slice(*self.limits[r]) if r in self.limits else slice(None))
        return init[tuple(index)]

    def body(self, e: Einsum, shape: tuple[int, ...]) -> np.ndarray:
        """One evaluation of the right-hand side: signed terms, each summed over its own ranks."""
        mask = self.mask(e.where)
        inner_mask = mask if mask is not None and not set(mask.ranks) <= set(e.out_ranks) else None
        total = np.zeros(shape, dtype=self.dtype)
        for sign, term, summed in e.terms():
            over = tuple(r for r in e.ranks if r in summed)
            val = self.summed(term, over, inner_mask) if over else self.node(term)
            arr = val.aligned(e.out_ranks)
            total = total + arr if sign > 0 else total - arr
        if mask is not None and inner_mask is None:
            total = np.where(mask.aligned(e.out_ranks), total, 0)
        return np.ascontiguousarray(np.broadcast_to(total, shape), dtype=self.dtype)


def _masked(val: Value, mask: Value) -> Value:
    ranks = _union(val.ranks, mask.ranks)
    return Value(np.where(mask.aligned(ranks), val.aligned(ranks), 0), ranks)


# ---- public API ----------------------------------------------------------


def prepare_inputs(cascade: Cascade, inputs: dict[str, np.ndarray], dtype: np.dtype,
                   given: Iterable[str] = ()) -> dict[str, np.ndarray]:
    """Every input and weight as a contiguous array of ``dtype``, shapes checked; initial states default to 0.
    Those named in ``given`` the caller has already (a device's tensors) are left out."""
    env: dict[str, np.ndarray] = {}
    inits = {e.recurrence.init for e in cascade.einsums if e.recurrence and e.recurrence.init}
    skip = set(given)
    for name in cascade.inputs():
        if name in skip:
            continue
        expected = cascade.shape(name)
        if name not in inputs:
            if name in inits:
                env[name] = np.zeros(expected, dtype=dtype)
                continue
            raise MambalayaError(f"input tensor {name} (shape {expected}) is missing")
        arr = np.asarray(inputs[name])
        if arr.shape != expected:
            raise MambalayaError(f"input tensor {name} has shape {arr.shape}, the cascade expects {expected}")
        env[name] = np.ascontiguousarray(arr, dtype=dtype)
    return env


def run_reference(
    cascade: Cascade,
    inputs: dict[str, np.ndarray],
    dtype: str | np.dtype = "float64",
    keep: str = "all",
) -> dict[str, np.ndarray]:
    """Execute ``cascade`` on ``inputs``; return every tensor (``keep="all"``) or the outputs.

    Missing initial states default to zeros; any other missing input is an error.
    """
    dtype = np.dtype(dtype)
    env = prepare_inputs(cascade, inputs, dtype)
    ev = Evaluator(cascade, env, dtype)
    for e in cascade.einsums:
        env[e.name] = ev.einsum(e)
    if keep == "outputs":
        return {n: env[n] for n in cascade.outputs()}
    return env


def execution_bytes(cascade: Cascade, dtype: str | np.dtype = "float64", reference: bool = True) -> int:
    """What running ``cascade`` (``reference``: and its reference beside it) allocates at most, about: every
    tensor in ``dtype`` (the backend's) and in float64 (the reference keeps them all), and two float64 temporaries
    of the largest tensor (an element-wise term's operands; products go through ``np.einsum``, never the whole
    iteration space). Checked before anything is allocated."""
    sizes = [cascade.size(n) for n in cascade.tensors]
    return sum(sizes) * ((8 if reference else 0) + np.dtype(dtype).itemsize) + 2 * 8 * max(sizes, default=0)


def check_memory(cascade: Cascade, dtype: str | np.dtype, limit_bytes: int | None = None,
                 reference: bool = True) -> None:
    """Refuse, with the figure, a run that would allocate more than ``limit_bytes`` (default: 80% of this
    machine's memory): a rank of 10^12 is a MemoryError of terabytes otherwise. Every executor asks it first."""
    need = execution_bytes(cascade, dtype, reference)
    limit = limit_bytes if limit_bytes is not None else int(0.8 * physical_memory_bytes())
    if need > limit:
        largest = sorted(cascade.rank_sizes.items(), key=lambda rn: -rn[1])[:3]
        raise MambalayaError(f"running {cascade.name} at these sizes needs about {need / 2**30:.3g} GiB "
                             f"(largest ranks: {', '.join(f'{r}={n}' for r, n in largest)}); "
                             f"the limit is {limit / 2**30:.3g} GiB: use smaller sizes (--set) or raise it "
                             f"(--max-memory GIB)")


def physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not a POSIX system
        return 16 * 2**30


def fan_in(cascade: Cascade, tensor: str) -> int:
    """The most elements of ``tensor`` one output element of a consumer sums over: the product of the sizes of
    the reduced ranks its index uses, largest over its consumers (1 where none sums over it)."""
    most = 1
    for name in cascade.consumers(tensor):
        e = cascade.einsum(name)
        reduced = set(e.reduced_ranks)
        for acc in accesses(e.expr):
            if acc.tensor == tensor:
                most = max(most, math.prod(cascade.rank_size(r) for r in acc.ranks() & reduced))
    return most


def random_inputs(cascade: Cascade, seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Normal float64 inputs for every input and weight (a verification workload) scaled as a trained layer's:
    activations standard normal, each weight by ``1 / sqrt(fan_in)`` (:func:`fan_in`, the scale of PyTorch's and
    Xavier's initialisations), so a product keeps its inputs' magnitude. Standard-normal weights made Mamba-2's
    outputs reach 1e11, where a float64 check's absolute error is 1e-4 and compares nothing small."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in cascade.inputs():
        w = scale / math.sqrt(fan_in(cascade, n)) if cascade.tensors[n].role == "weight" else scale
        out[n] = rng.standard_normal(cascade.shape(n)) * w
    return out
