"""The schedule IR: each fusion group of a mapping as one typed loop nest.

One :class:`GroupSchedule` per group is what every later stage reads: the cost model sums
its statements, the mapper searches over its tiles, the Numba and Triton backends print it,
the trace interpreter replays it. Its parts:

* :class:`Loop`: a tile loop (outer to inner): a rank swept in tiles, with its *role*
  (``parallel``: iterations independent; ``recurrence``: a recurrence's state carries across
  iterations; ``reduction``: a member accumulates partial sums across it; ``sequential``: a
  sliding window or a prefix carries across it).
* :class:`Range`: the indices of one rank a member computes per execution: the whole rank,
  the current tile of a loop (run ahead by a *skew* when a consumer reads it forward), the
  tile of a loop scaled up (the parent ``l`` of pieces ``c*chunk+q`` follows ``c``'s tile) or
  narrowed down (a piece ``l//chunk`` of a tiled ``l``).
* :class:`Buffer`: an on-chip allocation with a fixed size (the most it holds at once) and a
  place in the group's arena: the tile (or sliding window) of an intermediate, a recurrence's
  window, a loaded operand, a staging area for a store, partial sums.
* Statements, nested in :class:`LoopBlock` s: :class:`Load` (a box of an off-chip tensor into a
  buffer; a sliding load brings only the rows new since the previous iteration), :class:`Compute`
  (one member over its ranges, reading buffers), :class:`Store` (a box of a buffer to off-chip).

Every box is an :class:`AxisBox` per tensor axis: the hull of some reads' intervals
(:mod:`~mambalaya.schedule.intervals`) clipped to the axis. Sizes here are numbers under the
cascade's bound params and the mapping's tiles; traffic totals are precomputed per statement
(:attr:`Load.elements`, :attr:`Store.elements`) by the one rule of
:mod:`~mambalaya.schedule.extent`, which the executors' counts must equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mambalaya.schedule.intervals import IndexForm

LOOP_ROLES = ("parallel", "sequential", "recurrence", "reduction")
BUFFER_KINDS = ("operand", "tile", "window", "state", "staging", "partial")


@dataclass(frozen=True)
class Loop:
    """A tile loop: ``rank`` swept from 0 to ``extent`` in steps of ``tile``."""

    rank: str  # the loop's name: a cascade rank, the key of the mapping's tile
    extent: int
    tile: int
    role: str = "parallel"
    why: str = ""  # what carries across iterations (when not parallel)

    @property
    def trips(self) -> int:
        return -(-self.extent // self.tile)


@dataclass(frozen=True)
class Range:
    """The indices ``[lo, hi)`` of one rank a member computes per execution, clipped to ``[0, size)``.

    ``kind``: ``full`` (the whole rank), ``tile`` (loop ``loop``'s current tile ``[L0, L1)``, run ahead
    by ``skew``; the first tile starts at 0), ``parent`` (``[L0*scale + offset, L1*scale + offset)``: the
    rank whose outer piece the loop is), ``piece`` (``((x - offset) // divisor) % modulus`` over ``x`` in the
    loop's tile: a piece of the loop's rank)."""

    rank: str
    size: int
    kind: str = "full"
    loop: int | None = None
    skew: int = 0
    scale: int = 1
    offset: int = 0
    divisor: int = 1
    modulus: int | None = None

    def bounds(self, lo: int, hi: int, first: bool) -> tuple[int, int]:
        """``[lo, hi)`` of the rank for the loop's tile ``[lo, hi)`` (``first``: the loop's first tile)."""
        if self.kind == "full":
            return 0, self.size
        if self.kind == "tile":
            a = 0 if first else lo + self.skew
            return max(a, 0), min(hi + self.skew, self.size)
        if self.kind == "parent":
            return max(lo * self.scale + self.offset, 0), min(hi * self.scale + self.offset, self.size)
        a, b = (lo - self.offset) // self.divisor, (hi - 1 - self.offset) // self.divisor
        if self.modulus is not None:
            m = self.modulus
            a, b = (a % m, b % m) if a // m == b // m else (0, m - 1)
        return max(a, 0), min(b + 1, self.size)


@dataclass(frozen=True)
class AxisBox:
    """One axis of a box: the hull of the intervals of ``reads`` (an index form and the member whose
    ranges it is evaluated over) clipped to ``[0, size)``; ``pinned`` reads need no loop."""

    size: int
    reads: tuple[tuple[IndexForm, str], ...]
    loops: frozenset[int] = frozenset()  # the tile loops the interval moves with

    def __hash__(self) -> int:  # (kept: boxes are dictionary keys looked up millions of times)
        got = self.__dict__.get("_hash")
        if got is None:
            got = hash((self.size, self.reads, self.loops))
            object.__setattr__(self, "_hash", got)
        return got

    def __getstate__(self) -> dict:  # (a string's hash differs between processes: never pickle one)
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True)
class BufferAxis:
    """One axis of a buffer: ``extent`` elements, starting at global index ``base``: 0, the lower end of
    ``box`` (``"box"``), or, for a sliding window along loop ``loop``, the ``extent`` rows ending at the
    upper end of ``box`` (``"window"``: the most recent rows stay, moved to the front at each new tile; a
    tile whose box is empty leaves it where it was), or
    one row, the last its member computed (``"state"``: a scanned recurrence's state, the upper end of
    ``box`` once its statement has run; read at the start of the next, written at its end)."""

    extent: int
    base: str = "zero"
    box: AxisBox | None = None
    loop: int | None = None


@dataclass(frozen=True)
class Buffer:
    """An on-chip allocation of ``shape`` elements (the most it ever holds), at ``offset`` in the arena."""

    name: str
    tensor: str
    kind: str
    axes: tuple[BufferAxis, ...]
    element_bytes: int
    offset: int = 0  # elements into the group's arena

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.extent for a in self.axes)

    @property
    def elements(self) -> int:
        n = 1
        for a in self.axes:
            n *= a.extent
        return n

    @property
    def nbytes(self) -> int:
        return self.elements * self.element_bytes


def accumulator_bytes(buffers) -> int:
    """The largest partial-sum buffer, each axis padded to a power of two: what a GPU program holds in registers
    across a reduction loop (a ``tl.dot`` accumulator's block); 0 without partial sums."""
    return max((register_block_bytes(b.element_bytes, (a.extent for a in b.axes)) for b in buffers
                if b.kind == "partial"), default=0)


def register_block_bytes(element_bytes: int, extents) -> int:
    """The bytes of a partial-sum buffer of these axis ``extents`` held as a register block: each axis padded to a
    power of two."""
    n = element_bytes
    for x in extents:
        n *= 1 << max(0, (x - 1).bit_length())
    return n


@dataclass(frozen=True)
class Load:
    """Copy a box of off-chip ``tensor`` into ``buffer`` (only the rows new since the last iteration of
    loop ``slide_loop`` along axis ``slides``, for a sliding load). ``init_of``: the tensor is the initial
    state of recurrence ``init_of`` and the box is that recurrence's box one step before its start."""

    tensor: str
    buffer: str
    box: tuple[AxisBox, ...]
    slides: int | None = None
    slide_loop: int | None = None
    init_of: str | None = None
    init_axis: int | None = None  # the recurrence's axis whose index -1 this load stands for
    first_of: int | None = None  # runs only on the first tile of this loop
    elements: int = 0  # elements moved over the whole group (every execution)
    executions: int = 0  # times the statement runs (DMA transfers)

    @property
    def kind(self) -> str:
        return "load"


@dataclass(frozen=True)
class Store:
    """Copy a box of ``buffer`` (the member's current output) to off-chip ``tensor``."""

    tensor: str
    buffer: str
    box: tuple[AxisBox, ...]
    guard: tuple[int, ...] = ()  # loops on whose later iterations it is skipped (a replicated member's output)
    elements: int = 0
    executions: int = 0

    @property
    def kind(self) -> str:
        return "store"


@dataclass(frozen=True)
class Compute:
    """One member over its :class:`Range` s, reading buffers (and inlined producers), writing ``buffer``.

    ``scan``: the members fused per step into this recurrence (each step's readout computed while the
    state is on chip), ``accumulate``: the member's buffer holds partial sums across a reduction loop
    (zeroed on the loop's first iteration). ``replicas``: executions of the same values (a statement
    that a parallel loop does not index runs in every one of its programs on a GPU)."""

    einsum: str
    buffer: str
    ranges: tuple[Range, ...]
    #: (path, buffer) per effective read: the access (``path[0]``, among the Einsum's distinct reads in reading
    #: order) and, through inlined producers, their accesses (``path[1:]``); the buffer holding what it reads
    reads: tuple[tuple[tuple[int, ...], str], ...] = ()
    #: (path, buffer of the initial state read there at index -1); path ``(-1,)``: the recurrence's own
    inits: tuple[tuple[tuple[int, ...], str], ...] = ()
    scan: tuple[Compute, ...] = ()  # readers of this recurrence computed with it, step by step
    accumulate: int | None = None  # the reduction loop it accumulates over
    replicas: int = 1
    executions: int = 0

    @property
    def kind(self) -> str:
        return "compute"

    @property
    def buffers(self) -> frozenset[str]:
        """Every buffer the statement touches: its own and its scan members' outputs, reads and initial states."""
        out = {self.buffer, *(b for _, b in self.reads), *(b for _, b in self.inits)}
        for x in self.scan:
            out |= x.buffers
        return frozenset(out)


@dataclass(frozen=True)
class Shift:
    """At each iteration of ``loop`` after its first: move the rows of ``buffer`` still needed along
    ``axis`` to its front (a sliding window)."""

    buffer: str
    axis: int
    loop: int

    @property
    def kind(self) -> str:
        return "shift"


@dataclass(frozen=True)
class LoopBlock:
    """Tile loop ``loop`` with the statements run at each of its iterations."""

    loop: int
    body: tuple[Statement, ...]

    @property
    def kind(self) -> str:
        return "loop"


Statement = Load | Store | Compute | Shift | LoopBlock


@dataclass(frozen=True)
class GroupSchedule:
    """One fusion group lowered: tile loops, buffers, and the statement tree."""

    index: int
    einsums: tuple[str, ...]  # the group's own members, cascade order
    members: tuple[str, ...]  # every Einsum it runs: its own and those it recomputes, cascade order
    loops: tuple[Loop, ...]
    buffers: tuple[Buffer, ...]
    body: tuple[Statement, ...]
    reads: tuple[str, ...]  # off-chip tensors it loads
    writes: tuple[str, ...]  # off-chip tensors it stores
    inline: tuple[tuple[str, int], ...] = ()  # point-wise members recomputed at each read, with evaluations per element
    ranges: dict[str, tuple[Range, ...]] = field(default_factory=dict)  # per member (inlined too)
    notes: tuple[str, ...] = ()
    grid: int = 0  # leading loops that are a GPU's program grid (each iteration one independent program)

    @property
    def params(self) -> tuple[str, ...]:
        """The off-chip tensors a group's kernel takes, in order: what it loads, then what it stores."""
        return tuple(dict.fromkeys((*self.reads, *self.writes)))

    @property
    def programs(self) -> int:
        n = 1
        for lp in self.loops[:self.grid]:
            n *= lp.trips
        return n

    @property
    def arena_elements(self) -> int:
        return sum(b.elements for b in self.buffers)

    @property
    def occupancy_bytes(self) -> int:
        """On-chip bytes held at once: every buffer (they are live together)."""
        return sum(b.nbytes for b in self.buffers)

    @property
    def accumulator_bytes(self) -> int:
        """Its largest partial-sum buffer padded to powers of two (:func:`accumulator_bytes`)."""
        return accumulator_bytes(self.buffers)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def statements(self):
        """Every statement, depth first, with the loops enclosing it (outer first); a scan's fused readers
        right after it."""

        def walk(body, loops):
            for s in body:
                yield s, loops
                if isinstance(s, LoopBlock):
                    yield from walk(s.body, (*loops, s.loop))
                elif isinstance(s, Compute):
                    for x in s.scan:
                        yield x, loops

        yield from walk(self.body, ())

    @property
    def load_elements(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s, _ in self.statements():
            if isinstance(s, Load):
                out[s.tensor] = out.get(s.tensor, 0) + s.elements
        return out

    @property
    def store_elements(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s, _ in self.statements():
            if isinstance(s, Store):
                out[s.tensor] = out.get(s.tensor, 0) + s.elements
        return out

    @property
    def transfers(self) -> int:
        """Load and store executions (one DMA transfer each)."""
        return sum(s.executions for s, _ in self.statements() if isinstance(s, (Load, Store)))

    @property
    def executions(self) -> int:
        """Executions of every load, store and compute statement (a scan's fused readers run in its steps)."""
        return sum(s.executions for s, _ in self.statements() if isinstance(s, (Load, Store, Compute)))


@dataclass(frozen=True)
class Schedule:
    """A whole mapping lowered: its groups in execution order, on one architecture's capacity."""

    cascade: str
    arch: str
    capacity_bytes: int
    groups: tuple[GroupSchedule, ...]


__all__ = [
    "BUFFER_KINDS",
    "LOOP_ROLES",
    "AxisBox",
    "Buffer",
    "BufferAxis",
    "Compute",
    "GroupSchedule",
    "Load",
    "Loop",
    "LoopBlock",
    "Range",
    "Schedule",
    "Shift",
    "Statement",
    "Store",
]
