"""The ``python`` backend: a schedule walked statement by statement with numpy.

Slow and plain on purpose: it is the other backends' oracle for what a schedule means. Off-chip
tensors are whole arrays; every buffer is an array of its fixed shape, filled with NaN until a
statement writes it. A load copies its box (only the new rows of a sliding window) from
off-chip into the buffer, a store copies back, a shift moves a window's kept rows to the front;
a compute builds, for each tensor it reads, an array that holds exactly what its buffer holds
(NaN everywhere else) and evaluates the member with the reference interpreter over its ranges.
So a schedule that does not bring some element on chip before it is read computes NaN there
and fails ``verify``; and the bytes counted are those the loads and stores copied. Each iteration
of a grid loop (a GPU program) starts with every buffer NaN again: programs share nothing on chip.

Every loaded cell also records which element of its tensor it holds (its provenance: loads set it,
shifts move it). A compute reads a buffer through the schedule's own idea of where it starts (its
base); a loaded cell holding another element than the one that base says (a stale row a wrong
window skipped reloading) reads as NaN, like a row never loaded: so a wrong window fails ``verify``
even where the stale values happen to agree, and the counted bytes, which follow the same boxes,
cannot hide it.

With ``trace=True`` the run also records, per compute, the elements it reads of each tensor and
those it writes, in order: the access sequence the cache bound of the tests replays.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np

from mambalaya.exec.backend import RunResult, counted_bytes, register
from mambalaya.exec.reference import Evaluator, prepare_inputs
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.indexing import eval_index
from mambalaya.schedule import (
    Buffer,
    Compute,
    Forms,
    GroupSchedule,
    Load,
    LoopBlock,
    Schedule,
    Shift,
    Store,
    extent,
)
from mambalaya.schedule.compute import effective_reads


@functools.cache
def _flat(shape: tuple[int, ...]) -> np.ndarray:
    """Each element's flat index in an array of ``shape`` (read-only: shared)."""
    out = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    out.flags.writeable = False
    return out


class _Group:
    """One group's buffers and walk."""

    def __init__(self, cascade: Cascade, g: GroupSchedule, offchip: dict[str, np.ndarray], dtype: np.dtype,
                 moved: dict[str, dict[str, int]], trace: list | None, forms: Forms) -> None:
        self.c, self.g, self.offchip, self.dtype, self.forms = cascade, g, offchip, dtype, forms
        self.moved, self.trace = moved, trace
        self.ranges = {n: dict(zip(cascade.einsum(n).ranks, rs, strict=True)) for n, rs in g.ranges.items()}
        self.buf = {b.name: np.full(b.shape, np.nan, dtype=dtype) for b in g.buffers}
        #: per buffer cell, the flat index in its tensor of the element a load put there (-1: none, or computed)
        self.prov = {b.name: np.full(b.shape, -1, dtype=np.int64) for b in g.buffers}
        self.spec = {b.name: b for b in g.buffers}
        self.window_base: dict[tuple[str, int], int] = {}
        self.inline = frozenset(m for m, _ in g.inline)

    # -- where a buffer starts --
    def base(self, b: Buffer, state: extent.State) -> list[int]:
        out = []
        for ax in b.axes:
            if ax.base == "zero":
                out.append(0)
            elif ax.base == "box":
                out.append(extent.axis_interval(ax.box, self.ranges, state)[0])
            elif ax.base == "state":  # the last step its member computed
                out.append(extent.axis_interval(ax.box, self.ranges, state)[1])
            else:  # a window: where the last shift put it
                out.append(self.window_base.get((b.name, len(out)), 0))
        return out

    def held(self, b: Buffer, state: extent.State, size: tuple[int, ...]) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
        """(global slices, buffer slices) of what the buffer holds now, clipped to the tensor."""
        base = self.base(b, state)
        glob, local = [], []
        for lo, ext, n in zip(base, b.shape, size, strict=True):
            a, z = max(lo, 0), min(lo + ext, n)
            glob.append(slice(a, max(a, z)))
            local.append(slice(a - lo, a - lo + max(0, z - a)))
        return tuple(glob), tuple(local)

    def box(self, axes, state) -> list[tuple[int, int]]:
        return [extent.axis_interval(a, self.ranges, state) for a in axes]

    # -- statements --
    def walk(self, body, state: dict) -> None:
        for s in body:
            if isinstance(s, LoopBlock):
                lp = self.g.loops[s.loop]
                for t in range(lp.trips):
                    if s.loop < self.g.grid:  # a new program of a GPU's grid: nothing on chip from the last
                        for arr in self.buf.values():
                            arr[...] = np.nan
                        for held in self.prov.values():
                            held[...] = -1
                        self.window_base.clear()
                    self.walk(s.body, {**state, s.loop: extent.tile_of(lp, t)})
            elif isinstance(s, Load):
                self.load(s, state)
            elif isinstance(s, Store):
                self.store(s, state)
            elif isinstance(s, Shift):
                self.shift(s, state)
            elif isinstance(s, Compute):
                self.compute(s, state)

    def load(self, s: Load, state) -> None:
        if s.first_of is not None and not state[s.first_of][2]:
            return
        b = self.spec[s.buffer]
        box = self.box(s.box, state)
        if s.slides is not None and not state[s.slide_loop][2]:
            t = state[s.slide_loop][0] // self.g.loops[s.slide_loop].tile
            before = {**state, s.slide_loop: extent.tile_of(self.g.loops[s.slide_loop], t - 1)}
            prev = extent.axis_interval(s.box[s.slides], self.ranges, before)[1]
            lo, hi = box[s.slides]
            box[s.slides] = (max(lo, prev + 1), hi)
        if any(lo > hi for lo, hi in box):
            return
        base = self.base(b, state)
        src = tuple(slice(lo, hi + 1) for lo, hi in box)
        dst = tuple(slice(lo - z, hi + 1 - z) for (lo, hi), z in zip(box, base, strict=True))
        self.buf[s.buffer][dst] = self.offchip[s.tensor][src]
        own = s.init_of is None and b.tensor == s.tensor  # (an initial state's rows stand for no element of it)
        self.prov[s.buffer][dst] = _flat(self.offchip[s.tensor].shape)[src] if own else -1
        n = int(np.prod([hi - lo + 1 for lo, hi in box]))
        self.moved.setdefault(s.tensor, {"read": 0, "write": 0})["read"] += n

    def store(self, s: Store, state) -> None:
        if any(not state[j][2] for j in s.guard if j in state):
            return
        b = self.spec[s.buffer]
        box = self.box(s.box, state)
        if any(lo > hi for lo, hi in box):
            return
        base = self.base(b, state)
        dst = tuple(slice(lo, hi + 1) for lo, hi in box)
        src = tuple(slice(lo - z, hi + 1 - z) for (lo, hi), z in zip(box, base, strict=True))
        if s.tensor not in self.offchip:
            self.offchip[s.tensor] = np.full(self.c.shape(s.tensor), np.nan, dtype=self.dtype)
        self.offchip[s.tensor][dst] = self.buf[s.buffer][src]
        n = int(np.prod([hi - lo + 1 for lo, hi in box]))
        self.moved.setdefault(s.tensor, {"read": 0, "write": 0})["write"] += n

    def shift(self, s: Shift, state) -> None:
        b = self.spec[s.buffer]
        ax = b.axes[s.axis]
        lo, hi = extent.axis_interval(ax.box, self.ranges, state)
        if lo > hi:  # nothing in the box this tile: the window stays where it is
            return
        new = max(0, hi + 1 - ax.extent)
        key = (s.buffer, s.axis)
        arr = self.buf[s.buffer]
        if state[s.loop][2] or key not in self.window_base:  # the loop's first tile: a fresh window
            arr[...] = np.nan
            self.prov[s.buffer][...] = -1
        else:
            d = new - self.window_base[key]
            if d:
                keep = ax.extent - d
                src = [slice(None)] * arr.ndim
                dst = [slice(None)] * arr.ndim
                src[s.axis], dst[s.axis] = slice(d, d + max(keep, 0)), slice(0, max(keep, 0))
                for cells, empty in ((self.buf, np.nan), (self.prov, -1)):
                    moved = np.full_like(cells[s.buffer], empty)
                    if keep > 0:
                        moved[tuple(dst)] = cells[s.buffer][tuple(src)]
                    cells[s.buffer] = moved
        self.window_base[key] = new

    def _limits(self, name: str, state) -> dict[str, tuple[int, int]]:
        out = {}
        for r, x in self.ranges[name].items():
            if x.loop is not None and x.loop in state:
                out[r] = x.bounds(*state[x.loop])
        return out

    def _env(self, s: Compute, state, extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """What the member can read: each tensor as a whole array holding what its buffers hold (NaN elsewhere),
        inlined producers evaluated from those."""
        c = self.c
        env: dict[str, np.ndarray] = dict(extra or {})
        paths = dict(s.reads)
        needed: set[str] = set()
        for er in effective_reads(c, s.einsum, self.inline):
            needed.update(er.via)
            if er.tensor == s.einsum or er.tensor in (extra or {}):
                continue
            self._fill(env, er.tensor, paths[er.path], state)
        for _, bname in s.inits:
            self._fill(env, self.spec[bname].tensor, bname, state)
        for t in list(env):  # a recurrence's tensor is read with its initial state in front: unknown unless loaded
            prod = c.einsum(t) if c.producer(t) else None
            if prod is not None and prod.recurrence is not None and prod.recurrence.init is not None:
                env.setdefault(prod.recurrence.init, np.full(c.shape(prod.recurrence.init), np.nan, dtype=self.dtype))
        ev = Evaluator(c, env, self.dtype)
        with np.errstate(all="ignore"):
            for p in sorted(needed, key=c.einsum_names.index):  # producers before their readers
                env[p] = ev.einsum(c.einsum(p))
        return env

    def compute(self, s: Compute, state) -> None:
        c = self.c
        e = c.einsum(s.einsum)
        limits = self._limits(s.einsum, state)
        if any(lo >= hi for lo, hi in limits.values()):
            return
        env = self._env(s, state)
        before = None
        rec = e.recurrence
        if rec is not None and rec.rank in limits and limits[rec.rank][0] > 0:
            b = self.spec[s.buffer]
            if b.axes[rec.position].base == "state":  # its only row is the step before
                before = self.buf[s.buffer][tuple(slice(0, 1) if p == rec.position else self._span(b, p, r, limits, state)
                                                  for p, r in enumerate(e.out_ranks))]
            else:
                own = self._view(s.buffer, e.name, state)
                before = own[tuple(slice(limits[r][0] - 1, limits[r][0]) if p == rec.position else
                                   slice(*limits.get(r, (0, c.rank_size(r)))) for p, r in enumerate(e.out_ranks))]
        if self.trace is not None:
            self._trace_compute(s, limits, state)
        ev = Evaluator(c, env, self.dtype)
        with np.errstate(all="ignore"):
            val = ev.einsum(e, limits, before)
        self._write(s, e, limits, val, state)
        if s.scan:  # its readers, step by step with it: they see this execution's steps and the one before
            full = np.full(c.shape(e.name), np.nan, dtype=self.dtype)
            rows = tuple(slice(*limits.get(r, (0, c.rank_size(r)))) for r in e.out_ranks)
            full[rows] = val
            if before is not None:
                lo = limits[rec.rank][0]
                full[tuple(slice(lo - 1, lo) if p == rec.position else rows[p] for p in range(len(rows)))] = before
            for x in s.scan:
                xl = self._limits(x.einsum, state)
                xv = Evaluator(c, self._env(x, state, {e.name: full}), self.dtype)
                with np.errstate(all="ignore"):
                    self._write(x, c.einsum(x.einsum), xl, xv.einsum(c.einsum(x.einsum), xl), state)

    def _span(self, b: Buffer, pos: int, rank: str, limits, state) -> slice:
        lo, hi = limits.get(rank, (0, self.c.rank_size(rank)))
        z = self.base(b, state)[pos]
        return slice(max(lo, z) - z, min(hi, z + b.shape[pos]) - z)

    def _write(self, s: Compute, e, limits, val: np.ndarray, state) -> None:
        """The computed region into the member's buffer, where the buffer holds it (a state keeps the last step)."""
        b = self.spec[s.buffer]
        base = self.base(b, state)
        src, dst = [], []
        for r, z, ext in zip(e.out_ranks, base, b.shape, strict=True):
            lo, hi = limits.get(r, (0, self.c.rank_size(r)))
            a, w = max(lo, z), min(hi, z + ext)
            if a >= w:
                return
            src.append(slice(a - lo, w - lo))
            dst.append(slice(a - z, w - z))
        tgt = self.buf[s.buffer]
        if s.accumulate is not None and not state[s.accumulate][2]:
            tgt[tuple(dst)] += val[tuple(src)]
        else:
            tgt[tuple(dst)] = val[tuple(src)]
        self.prov[s.buffer][tuple(dst)] = -1  # (computed here: no loaded element)

    def _view(self, bname: str, tensor: str, state) -> np.ndarray:
        """A whole-tensor array holding what buffer ``bname`` holds now (NaN elsewhere)."""
        shape = self.c.shape(tensor)
        out = np.full(shape, np.nan, dtype=self.dtype)
        glob, local = self.held(self.spec[bname], state, shape)
        out[glob] = self.buf[bname][local]
        held = self.prov[bname][local]
        stale = (held >= 0) & (held != _flat(shape)[glob])
        out[glob][stale] = np.nan  # (not the element its base says: as if never loaded; glob's slices give a view)
        return out

    def _fill(self, env: dict, tensor: str, bname: str, state) -> None:
        view = self._view(bname, tensor, state)
        if tensor in env:  # read through two buffers: what either holds
            env[tensor] = np.where(np.isnan(env[tensor]), view, env[tensor])
        else:
            env[tensor] = view

    def _trace_compute(self, s: Compute, limits, state) -> None:
        """A compute's accesses in the order it makes them: a recurrence (and the readers fused into its scan)
        one step at a time, each step's reads before its writes; any other compute reads all (its own partial
        sums too, after the first tile of its reduction loop), then writes."""
        rec = self.c.einsum(s.einsum).recurrence
        if rec is None:
            self._trace(s.einsum, limits, s.accumulate is not None and not state[s.accumulate][2])
            return
        lo, hi = limits.get(rec.rank, (0, self.c.rank_size(rec.rank)))
        readers = [(x.einsum, self._limits(x.einsum, state)) for x in s.scan]
        for t in range(lo, hi):
            self._trace(s.einsum, {**limits, rec.rank: (t, t + 1)})
            for name, xl in readers:
                self._trace(name, {**xl, rec.rank: (t, t + 1)})

    def _trace(self, name: str, limits, partial: bool = False) -> None:
        """The elements one member reads of every tensor over ``limits`` (its effective reads; ``partial``: its
        own output, the sums so far), then those it writes."""
        c = self.c
        e = c.einsum(name)
        ranks = e.ranks
        span = {r: limits.get(r, (0, c.rank_size(r))) for r in ranks}
        grids = {}
        for i, r in enumerate(ranks):
            shape = [1] * len(ranks)
            shape[i] = span[r][1] - span[r][0]
            grids[r] = np.arange(*span[r]).reshape(shape)
        full = tuple(hi - lo for lo, hi in span.values())
        for er in effective_reads(c, name, self.inline):
            shape = c.shape(er.tensor)
            idx, ok = [], np.ones(full, dtype=bool)
            for pos, ix in enumerate(er.indices):
                num, den = eval_index(ix, grids, c.values)
                num = np.broadcast_to(num // den, full)
                ok &= (num >= 0) & (num < shape[pos])
                idx.append(np.clip(num, 0, shape[pos] - 1))
            flat = np.unique(np.ravel_multi_index(tuple(i[ok] for i in idx), shape)) if idx else np.zeros(1, int)
            self.trace.append((er.tensor, flat, "r"))
        out_shape = c.shape(e.name)
        og = [np.arange(*span[r]) for r in e.out_ranks]
        mesh = np.meshgrid(*og, indexing="ij") if og else []
        flat = np.ravel_multi_index(tuple(m.ravel() for m in mesh), out_shape) if og else np.zeros(1, int)
        if partial:
            self.trace.append((e.name, flat, "r"))
        self.trace.append((e.name, flat, "w"))


def interpret(cascade: Cascade, schedule: Schedule, inputs: dict[str, np.ndarray], dtype: str = "float64",
              trace: bool = False) -> RunResult:
    """Run ``schedule`` on ``inputs``: outputs, bytes moved per tensor, and (``trace``) the access sequence."""
    np_dtype = np.dtype(dtype)
    offchip: dict[str, np.ndarray] = dict(prepare_inputs(cascade, inputs, np_dtype))
    moved: dict[str, dict[str, int]] = {}
    seq: list | None = [] if trace else None
    times = []
    forms = Forms(cascade)
    for g in schedule.groups:
        t0 = time.perf_counter()
        _Group(cascade, g, offchip, np_dtype, moved, seq, forms).walk(g.body, {})
        times.append(time.perf_counter() - t0)
    outputs = {n: offchip[n] for n in cascade.outputs()}
    res = RunResult(outputs, counted_bytes(cascade, moved), times)
    if seq is not None:
        res.extra["trace"] = seq
    return res


class PythonBackend:
    name = "python"
    description = "the schedule walked in Python with numpy (slow; the backends' oracle)"

    def available(self) -> str | None:
        return None

    def supports(self, cascade: Cascade, group: GroupSchedule) -> str | None:
        return None

    def compile(self, cascade: Cascade, schedule: Schedule, dtype: str, **options: Any) -> Any:
        return cascade, schedule, dtype, bool(options.get("trace", False))

    def run(self, program: Any, inputs: dict[str, np.ndarray]) -> RunResult:
        cascade, schedule, dtype, trace = program
        return interpret(cascade, schedule, inputs, dtype, trace)


register(PythonBackend())

__all__ = ["PythonBackend", "interpret"]
