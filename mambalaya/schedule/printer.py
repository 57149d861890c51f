"""A schedule as readable pseudo-code: loops with their roles, buffers, loads, computes, stores.

One block per group: its buffers with sizes and places in the arena (in elements), then the
statement tree; a GPU's grid loops read "programs of the grid". Ranges read as
``l in tile(l)`` (the loop's current tile), ``l in tile(l)+1`` (run one ahead), ``l in 256*tile(c)``
(the parent of a tiled piece) or ``c in tile(l)//256`` (a piece of a tiled rank).
"""

from __future__ import annotations

from mambalaya.schedule.ir import (
    AxisBox,
    Buffer,
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


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def format_range(r: Range, loops: tuple[Loop, ...]) -> str:
    if r.kind == "full":
        return f"{r.rank} in 0..{r.size}"
    lp = loops[r.loop].rank
    if r.kind == "tile":
        return f"{r.rank} in tile({lp})" + (f"+{r.skew}" if r.skew else "")
    if r.kind == "parent":
        return f"{r.rank} in {r.scale}*tile({lp})" + (f"+{r.offset}" if r.offset else "")
    inner = f"(tile({lp})-{r.offset})" if r.offset else f"tile({lp})"
    piece = f"{inner}//{r.divisor}" if r.divisor != 1 else inner
    return f"{r.rank} in {piece}" + (f"%{r.modulus}" if r.modulus is not None else "")


def format_box(tensor: str, box: tuple[AxisBox, ...]) -> str:
    axes = []
    for a in box:
        forms = list(dict.fromkeys(str(f) for f, _ in a.reads))
        axes.append("|".join(forms) if forms else ":")
    return f"{tensor}[{', '.join(axes)}]"


def format_buffer(b: Buffer) -> str:
    shape = "x".join(str(x) for x in b.shape) or "1"
    notes = []
    for i, a in enumerate(b.axes):
        if a.base == "window":
            notes.append(f"axis {i} slides")
        elif a.base == "state":
            notes.append(f"axis {i}: the latest step")
    extra = f" ({', '.join(notes)})" if notes else ""
    return f"{b.name}: {b.kind} of {b.tensor} [{shape}] {_bytes(b.nbytes)} at element {b.offset}{extra}"


def _statement(s: Statement, g: GroupSchedule, depth: int, lines: list[str]) -> None:
    pad = "  " * (depth + 1)
    if isinstance(s, LoopBlock):
        lp = g.loops[s.loop]
        role = lp.role + (f": {lp.why}" if lp.why else "")
        how = f"{lp.trips} programs of the grid" if s.loop < g.grid else f"{lp.trips} tiles, {role}"
        lines.append(f"{pad}for {lp.rank} in 0..{lp.extent} step {lp.tile} ({how}):")
        for x in s.body:
            _statement(x, g, depth + 1, lines)
        return
    if isinstance(s, Load):
        how = " new rows" if s.slides is not None else ""
        init = f" (state before {s.init_of}'s first step)" if s.init_of else ""
        lines.append(f"{pad}load{how} {format_box(s.tensor, s.box)} -> {s.buffer}{init}   "
                     f"# {s.elements} elements, {s.executions}x")
    elif isinstance(s, Store):
        lines.append(f"{pad}store {s.buffer} -> {format_box(s.tensor, s.box)}   # {s.elements} elements, "
                     f"{s.executions}x")
    elif isinstance(s, Compute):
        ranges = ", ".join(format_range(r, g.loops) for r in s.ranges)
        extra = []
        if s.accumulate is not None:
            extra.append(f"accumulating over {g.loops[s.accumulate].rank}")
        if s.replicas > 1:
            extra.append(f"in {s.replicas} programs")
        tail = f"  ({'; '.join(extra)})" if extra else ""
        lines.append(f"{pad}compute {s.einsum} over {ranges} -> {s.buffer}{tail}")
        for x in s.scan:
            lines.append(f"{pad}  and per step {x.einsum} -> {x.buffer}")
    elif isinstance(s, Shift):
        lines.append(f"{pad}shift {s.buffer} along axis {s.axis} (keep the rows still read)")


def format_group(g: GroupSchedule) -> str:
    lines = [f"group {g.index}: {', '.join(g.einsums)}"
             + (f" (recomputing {', '.join(x for x in g.members if x not in g.einsums)})"
                if len(g.members) > len(g.einsums) else "")
             + f" -- {len(g.loops)} tile loop(s), {_bytes(g.occupancy_bytes)} on chip"]
    if g.buffers:
        lines.append("  buffers:")
        lines += [f"    {format_buffer(b)}" for b in g.buffers]
    for s in g.body:
        _statement(s, g, 0, lines)
    if g.inline:
        lines.append("  inlined (recomputed at each read): " + ", ".join(f"{m} ({n}x)" for m, n in g.inline))
    for note in g.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def format_schedule(schedule: Schedule) -> str:
    head = (f"schedule of {schedule.cascade} on {schedule.arch} "
            f"(capacity {_bytes(schedule.capacity_bytes)}, {len(schedule.groups)} groups)")
    return "\n\n".join([head, *(format_group(g) for g in schedule.groups)])


__all__ = ["format_box", "format_buffer", "format_group", "format_range", "format_schedule"]
