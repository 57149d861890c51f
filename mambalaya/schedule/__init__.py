"""Stage ``schedule``: every fusion group of a mapping lowered once to a typed loop nest.

What the cost model prices, the mapper searches and both backends print:
``lower_mapping(cascade, mapping, arch)`` gives a :class:`Schedule` whose groups are
:class:`GroupSchedule` s (tile loops with roles, buffers with sizes and arena offsets, and the
statement tree of loads, computes, stores and window shifts). The modules, in lowering order:

- :mod:`.intervals`: index expressions compiled to forms, their intervals over rank ranges
- :mod:`.ir`: the typed IR
- :mod:`.lower`: a group to its schedule (ranges, placement, skews, buffers, statements)
- :mod:`.extent`: the sizes rule: box lengths, buffer extents, elements moved per statement
- :mod:`.printer`: the schedule as readable pseudo-code
- :mod:`.trace`: the element accesses a schedule's computes make, in order (for cache bounds)

Typical use::

    from mambalaya.schedule import lower_mapping, format_schedule
    sched = lower_mapping(cascade, mapping, "h200")
    print(format_schedule(sched))
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from mambalaya.arch import Arch, load_arch
from mambalaya.ir.cascade import Cascade
from mambalaya.ir.mapping import FusionGroup, Mapping
from mambalaya.schedule.ir import (
    AxisBox,
    Buffer,
    BufferAxis,
    Compute,
    GroupSchedule,
    Load,
    Loop,
    LoopBlock,
    Range,
    Schedule,
    Shift,
    Statement,
    Store,
)
from mambalaya.schedule.lower import (
    SEQUENTIAL,
    Forms,
    GridShape,
    Policy,
    ScheduleError,
    group_grid,
    group_occupancy,
    lower_group,
    outside_grid,
    piece_class,
    pieces_of,
)

#: Most lowered schedules a :class:`Lowerer` keeps (least recently used go first): a mapper's tile searches lower
#: tens of thousands of tilings (42,248 for the small Mamba-2 on h200), each costed once (its search remembers
#: the cost: 1 hit in 3,285 lowerings of mamba1 on h200), so only the chosen groups' schedules, which the report,
#: the verify and the executors lower again, are worth keeping; kept, the rest were a long-lived heap the collector
#: re-scanned.
LOWERED_MAX = 64


class Lowerer:
    """Lowers groups of one cascade (the analysis of each member set and the compiled index forms are
    cached): the mapper builds one and lowers thousands of candidates with it."""

    def __init__(self, cascade: Cascade, analysis=None) -> None:
        from mambalaya.analysis.groups import GroupAnalyzer

        self.cascade = cascade
        self.analysis = analysis if analysis is not None else GroupAnalyzer(cascade)
        self.forms = Forms(cascade)
        self._models: dict[tuple, object] = {}
        self._lowered: OrderedDict[tuple, GroupSchedule | ScheduleError] = OrderedDict()

    def model(self, members: tuple[str, ...], convex: bool = True):
        key = (*sorted(members), convex)
        got = self._models.get(key)
        if got is None:
            cg = self.analysis.analyze(list(members), convex) if not convex else self.analysis.analyze(list(members))
            if not cg.legal:
                raise ScheduleError(f"[{', '.join(members)}] is not a legal fusion group: {'; '.join(cg.reasons)}")
            got = self._models[key] = cg.loops
        return got

    def group(self, group: FusionGroup, stored: frozenset[str], policy: Policy = SEQUENTIAL, index: int = 0,
              capacity: int | None = None) -> GroupSchedule:
        """The group's schedule (cached: every arch of one policy and capacity shares it; an untiled group's
        does not depend on the capacity)."""
        tiled = any(0 < t < self.cascade.rank_size(r) for r, t in group.tiles.items())
        key = (group.einsums, group.loop_order, tuple(sorted(group.tiles.items())), group.recompute, stored,
               policy if tiled else None, capacity if tiled else None)
        got = self._lowered.get(key)
        if got is None:
            members = self._members(group)
            try:
                got = lower_group(self.cascade, group, self.model(members, not group.recompute), self.forms, stored,
                                  policy, 0, capacity)
            except ScheduleError as err:
                got = ScheduleError(str(err))  # (not the raised one: its traceback holds the lowering's frames)
            self._lowered[key] = got
            if len(self._lowered) > LOWERED_MAX:
                self._lowered.popitem(last=False)
        else:
            self._lowered.move_to_end(key)
        if isinstance(got, ScheduleError):
            raise ScheduleError(str(got))
        return got if index == got.index else replace(got, index=index)


    def grid(self, group: FusionGroup, stored: frozenset[str], policy: Policy = SEQUENTIAL) -> GridShape:
        """What the placement of the group's tiled loops fixes of the program grid of its tilings
        (:func:`~.lower.group_grid`); raises :class:`ScheduleError` when that placement is refused."""
        return group_grid(self.cascade, group, self.model(self._members(group), not group.recompute), self.forms,
                          stored, policy)

    def outside_grid(self, group: FusionGroup, stored: frozenset[str], policy: Policy = SEQUENTIAL) -> str | None:
        """Why the group's one tiled loop is in no program grid at its tile's class (:func:`~.lower.outside_grid`),
        or None."""
        return outside_grid(self.cascade, group, self.model(self._members(group), not group.recompute), self.forms,
                            stored, policy)

    def pieces(self, einsums: tuple[str, ...], rank: str) -> tuple[tuple[int, int | None], ...]:
        """The pieces of loop ``rank``'s rank a group of ``einsums`` reads (:func:`~.lower.pieces_of`): with a tile,
        they decide its :func:`piece_class`; kept in the lowering's own cache (:class:`~.lower.Forms`)."""
        key = (tuple(einsums), (), rank)
        got = self.forms.pieces.get(key)
        if got is None:
            got = self.forms.pieces[key] = pieces_of(self.model(self._members(FusionGroup(tuple(einsums), ()))), rank)
        return got

    def _members(self, group: FusionGroup) -> tuple[str, ...]:
        return tuple(sorted({*group.einsums, *group.recompute}, key=self.cascade.einsum_names.index))

    def occupancy(self, group: FusionGroup, stored: frozenset[str], policy: Policy = SEQUENTIAL) -> tuple[int, int]:
        """(What :meth:`group`'s schedule holds on chip before hoisting: the fit test; its accumulator's bytes),
        without its statements."""
        return group_occupancy(self.cascade, group, self.model(self._members(group), not group.recompute), self.forms,
                               stored, policy)


def policy_of(arch: Arch) -> Policy:
    """The lowering policy an architecture implies (GPU programs are independent)."""
    return Policy(gpu=arch.kind == "gpu")


def stored_tensors(cascade: Cascade, mapping: Mapping) -> list[frozenset[str]]:
    """Per group, the members whose output leaves it: cascade outputs, and tensors read by another group that
    does not recompute them."""
    out = []
    for g in mapping.groups:
        inside = set(g.einsums)
        keep = set()
        for e in g.einsums:
            if cascade.tensors[e].role == "output" or not cascade.consumers(e):
                keep.add(e)
                continue
            outside = {mapping.group_of(c) for c in cascade.consumers(e) if c not in inside}
            if any(e not in mapping.groups[gi].recompute for gi in outside):
                keep.add(e)
        out.append(frozenset(keep))
    return out


def check_capacity(sched: GroupSchedule, capacity: int, arch: str) -> None:
    """A group's buffers, all live at once, must fit the arch's on-chip capacity."""
    need = sched.occupancy_bytes
    if need > capacity:
        parts = sorted(sched.buffers, key=lambda b: -b.nbytes)[:4]
        what = ", ".join(f"{b.tensor} {b.kind} {_fmt(b.nbytes)}" for b in parts)
        raise ScheduleError(f"group {sched.index} [{', '.join(sched.einsums)}] holds {_fmt(need)} on chip at once, "
                            f"more than {arch}'s {_fmt(capacity)} ({what}, ...): tile it smaller")


def _fmt(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def lower_mapping(cascade: Cascade, mapping: Mapping, arch: Arch | str, *, lowerer: Lowerer | None = None,
                  check: bool = True) -> Schedule:
    """Every group of ``mapping`` lowered for ``arch``; with ``check``, each group's buffers are held to the
    arch's capacity (``ScheduleError`` names the group and its largest buffers)."""
    arch = load_arch(arch) if isinstance(arch, str) else arch
    mapping.validate(cascade)
    lw = lowerer or Lowerer(cascade)
    policy = policy_of(arch)
    stored = stored_tensors(cascade, mapping)
    groups = []
    for i, g in enumerate(mapping.groups):
        s = lw.group(g, stored[i], policy, i, arch.fusion_buffer_bytes)
        if check:
            check_capacity(s, arch.fusion_buffer_bytes, arch.name)
        groups.append(s)
    return Schedule(cascade.name, arch.name, arch.fusion_buffer_bytes, tuple(groups))


def format_schedule(schedule: Schedule | GroupSchedule) -> str:
    """The schedule (or one group) as pseudo-code (see :mod:`.printer`)."""
    from mambalaya.schedule.printer import format_group
    from mambalaya.schedule.printer import format_schedule as fmt

    return format_group(schedule) if isinstance(schedule, GroupSchedule) else fmt(schedule)


__all__ = [
    "AxisBox",
    "Buffer",
    "BufferAxis",
    "Compute",
    "Forms",
    "GridShape",
    "GroupSchedule",
    "Load",
    "Loop",
    "LoopBlock",
    "Lowerer",
    "Policy",
    "Range",
    "Schedule",
    "ScheduleError",
    "Shift",
    "Statement",
    "Store",
    "check_capacity",
    "format_schedule",
    "group_grid",
    "outside_grid",
    "group_occupancy",
    "lower_group",
    "lower_mapping",
    "piece_class",
    "pieces_of",
    "policy_of",
    "stored_tensors",
]
