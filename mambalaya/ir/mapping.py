"""The mapping format: how a cascade is cut into fusion groups and scheduled.

A :class:`Mapping` lists fusion groups in execution order; each group names
its Einsums, a loop order over the group's ranks (outermost first), tile
sizes for the tiled ranks (a rank not listed is untiled: its tile is its full
extent), and which tensors it recomputes instead of reading them from off
chip. Files are YAML or JSON with the same keys::

    cascade: mamba2
    arch: mambalaya            # optional: what it was chosen for
    groups:
      - einsums: [Z, XBC0, DT0]
        loop_order: [b, l, e]
        tiles: {l: 256}
      - einsums: [XBC1, XBC]
        recompute: []
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mambalaya.errors import MappingError
from mambalaya.fileio import load_yaml, read_text, write_atomic
from mambalaya.ir.cascade import Cascade


@dataclass(frozen=True)
class FusionGroup:
    """Einsums executed as one fused loop nest."""

    einsums: tuple[str, ...]
    loop_order: tuple[str, ...] = ()
    tiles: dict[str, int] = field(default_factory=dict)
    recompute: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"einsums": list(self.einsums)}
        if self.loop_order:
            out["loop_order"] = list(self.loop_order)
        if self.tiles:
            out["tiles"] = dict(self.tiles)
        if self.recompute:
            out["recompute"] = list(self.recompute)
        return out


@dataclass(frozen=True)
class Mapping:
    """A partition of a cascade's Einsums into ordered fusion groups."""

    groups: tuple[FusionGroup, ...]
    cascade: str | None = None
    arch: str | None = None

    @property
    def group_lists(self) -> list[list[str]]:
        return [list(g.einsums) for g in self.groups]

    def group_of(self, einsum: str) -> int:
        for i, g in enumerate(self.groups):
            if einsum in g.einsums:
                return i
        raise KeyError(einsum)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cascade:
            out["cascade"] = self.cascade
        if self.arch:
            out["arch"] = self.arch
        out["groups"] = [g.to_dict() for g in self.groups]
        return out

    def validate(self, cascade: Cascade) -> Mapping:
        """Check the mapping covers the cascade once, in a dependency-respecting order."""
        names = cascade.einsum_names
        seen: dict[str, int] = {}
        for gi, g in enumerate(self.groups):
            if not g.einsums:
                raise MappingError(f"group {gi} is empty")
            for e in g.einsums:
                if e not in names:
                    raise MappingError(f"group {gi} names unknown Einsum '{e}' (cascade {cascade.name} has: "
                                       f"{', '.join(names)})")
                if e in seen:
                    raise MappingError(f"Einsum '{e}' is in groups {seen[e]} and {gi}: each Einsum belongs to "
                                       f"one group")
                seen[e] = gi
            for r in (*g.loop_order, *g.tiles):
                if r not in cascade.rank_exprs:
                    raise MappingError(f"group {gi} names unknown rank '{r}'")
            for r, t in g.tiles.items():
                if not isinstance(t, int) or t <= 0:
                    raise MappingError(f"group {gi}: tile of rank {r} must be a positive integer, got {t!r}")
            for t in g.recompute:
                if t not in cascade.tensors:
                    raise MappingError(f"group {gi} recomputes unknown tensor '{t}'")
                if cascade.producer(t) is None:
                    raise MappingError(f"group [{', '.join(g.einsums)}] recomputes {t}, which no Einsum produces "
                                       f"(inputs and weights are read, not recomputed)")
                if t in g.einsums:
                    raise MappingError(f"group [{', '.join(g.einsums)}] recomputes {t}, which it already computes")
        missing = [n for n in names if n not in seen]
        if missing:
            raise MappingError(f"the mapping leaves Einsum(s) {', '.join(missing)} out of every group")
        for e in cascade.einsums:
            for t in e.reads:
                if t in seen and t != e.name and seen[t] > seen[e.name]:
                    raise MappingError(f"group {seen[e.name]} runs {e.name} before group {seen[t]} writes "
                                       f"{t}: order groups so producers come first")
        return self


def unfused_mapping(cascade: Cascade) -> Mapping:
    """One group per Einsum, in cascade order: the no-fusion baseline."""
    return Mapping(tuple(FusionGroup((e.name,), e.ranks) for e in cascade.einsums), cascade.name)


def mapping_from_dict(data: Any, file: str | None = None) -> Mapping:
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
        raise MappingError("a mapping is a mapping with a 'groups' list", file=file)
    unknown = set(data) - {"cascade", "arch", "groups", "objective", "optimal"}
    if unknown:
        raise MappingError(f"unknown mapping key(s): {', '.join(sorted(unknown))}", file=file)
    groups = []
    for gi, g in enumerate(data["groups"]):
        if isinstance(g, list):
            g = {"einsums": g}
        if not isinstance(g, dict) or not isinstance(g.get("einsums"), list):
            raise MappingError(f"group {gi} must have an 'einsums' list", file=file)
        extra = set(g) - {"einsums", "loop_order", "tiles", "recompute"}
        if extra:
            raise MappingError(f"group {gi}: unknown key(s) {', '.join(sorted(extra))}", file=file)
        tiles = g.get("tiles") or {}
        if not isinstance(tiles, dict):
            raise MappingError(f"group {gi}: 'tiles' must map rank -> tile size", file=file)
        groups.append(
            FusionGroup(
                tuple(str(e) for e in g["einsums"]),
                tuple(str(r) for r in g.get("loop_order") or ()),
                {str(k): v for k, v in tiles.items()},
                tuple(str(t) for t in g.get("recompute") or ()),
            )
        )
    return Mapping(tuple(groups), data.get("cascade"), data.get("arch"))


def load_mapping(path: str | Path) -> Mapping:
    """Read a YAML or JSON mapping file (safe loader)."""
    path = Path(path)
    text = read_text(path, MappingError, "mapping")
    if path.suffix != ".json":
        data = load_yaml(text, str(path), MappingError)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise MappingError(f"not valid JSON: {err}".splitlines()[0], file=str(path)) from None
    try:
        return mapping_from_dict(data, str(path))
    except MappingError as err:
        raise err.located(str(path)) from None


def save_mapping(mapping: Mapping, path: str | Path) -> None:
    data = mapping.to_dict()
    text = json.dumps(data, indent=2) + "\n" if Path(path).suffix == ".json" else yaml.safe_dump(data, sort_keys=False)
    write_atomic(path, text)
