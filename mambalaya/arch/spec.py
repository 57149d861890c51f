"""Architecture specs: typed, frozen data loaded from ``archs/*.yaml``.

The YAML is plain data a person can check against a datasheet (see any shipped
spec for the layout); this module validates it with line-accurate errors and
resolves it into an :class:`Arch` whose numbers are all in SI base units, so the
mapper and the cost model never see a unit string. See the package docstring of
:mod:`mambalaya.arch` for the API the later stages rely on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from mambalaya.arch.units import parse_quantity
from mambalaya.errors import ArchError, did_you_mean
from mambalaya.fileio import compose_yaml, read_text, shipped_dir, shipped_names

__all__ = [
    "ARCH_KINDS",
    "OP_ALIASES",
    "OP_KINDS",
    "OVERRIDABLE",
    "PRECISIONS",
    "Arch",
    "BufferLevel",
    "ComputeUnit",
    "OpCost",
    "UnitRate",
    "archs_dir",
    "load_arch",
    "parse_arch",
    "shipped_archs",
]

ARCH_KINDS = ("gpu", "accelerator", "cgla")
# Operation kinds every spec must price (the cascades' Einsums are counted in these).
OP_KINDS = ("mac", "add", "mul", "div", "max", "exp", "log", "sqrt", "rsqrt", "sigmoid", "silu", "softplus")
# Other spellings of operation kinds, priced as the kind they run as (an element-wise function's kind is in
# mambalaya.ir.functions, the one table of functions).
OP_ALIASES = {
    "sub": "add",
    "sum": "add",
    "mean": "add",
    "cumsum": "add",
    "min": "max",
    "fma": "mac",
    "recip": "div",
    "reciprocal": "div",
}
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
ANY = "any"  # a rate that applies to every precision


def archs_dir() -> Path:
    """The folder where the shipped specs live (the repo's ``archs/``, or installed package data)."""
    return shipped_dir("archs")


def shipped_archs() -> list[str]:
    """Names of the shipped specs (``h200``, ``imax3``, ...), sorted."""
    return shipped_names("archs")


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class UnitRate:
    """Peak rate of a compute unit at one precision (``any``: all precisions)."""

    precision: str
    value: float  # op/s, or op/cycle when per_cycle
    per_cycle: bool
    efficiency: float  # achievable fraction of the peak (measured or assumed)


@dataclass(frozen=True)
class ComputeUnit:
    """A kind of functional unit (tensor cores, CUDA cores, SFUs, a CGLA lane, ...)."""

    name: str
    rates: tuple[UnitRate, ...]
    per_lane: bool = False  # its rate is per CGLA lane and scales with Arch.lanes
    description: str = ""

    def rate(self, precision: str) -> UnitRate | None:
        """The rate entry for ``precision``, else the unit's ``any`` entry, else None."""
        for wanted in (precision, ANY):
            for r in self.rates:
                if r.precision == wanted:
                    return r
        return None


@dataclass(frozen=True)
class OpCost:
    """Where one operation kind runs: the unit, and unit-ops consumed per operation.

    ``matrix_unit``/``matrix_cost`` apply to the operation when it is part of a
    contraction mapped to a matrix unit (a GEMM's MACs); None means it never is.
    """

    kind: str
    unit: str
    cost: float
    matrix_unit: str | None = None
    matrix_cost: float | None = None


@dataclass(frozen=True)
class BufferLevel:
    """One on-chip storage level; ``holds_fused`` marks where fused intermediates live."""

    name: str
    instance_bytes: int  # capacity of one instance (one SM's shared memory, one PE's LMM)
    instances: int  # instances in one lane / on the chip
    bandwidth: float  # aggregate over all instances of one lane / the chip, B/s
    holds_fused: bool = False
    per_lane: bool = False  # instances repeat per CGLA lane
    description: str = ""


@dataclass(frozen=True)
class Arch:
    """A resolved architecture: every number in SI base units (bytes, B/s, s, Hz, op/s)."""

    name: str
    kind: str
    can_fuse: bool
    clock_hz: float
    units: tuple[ComputeUnit, ...]
    ops: tuple[OpCost, ...]
    buffers: tuple[BufferLevel, ...]
    offchip_bandwidth: float  # achievable off-chip bandwidth, B/s (what the roofline uses)
    offchip_peak_bandwidth: float  # datasheet / assumed peak, B/s
    group_overhead_s: float  # fixed cost per fusion group (kernel launch, host coordination, reconfiguration)
    transfer_overhead_s: float = 0.0  # per off-chip transfer of a group (CGLA DMA setup); 0 on a GPU
    #: per execution of any statement of a group's loop nest (a load, store or compute run once per tile: what a
    #: CPU executor's loop body costs beyond its arithmetic); 0 where hardware sequences the loops
    statement_overhead_s: float = 0.0
    pipeline_depth: int = 0  # stages to fill and drain per pipelined reduction; 0 where not meaningful
    precision: str = "fp32"  # arithmetic precision used when a caller names none
    element_bytes: int = 4  # default bytes per element
    lanes: int = 1  # CGLA lanes; scales per_lane units and buffers
    weights_resident: bool = False  # always false: each group loads the weights it reads (true is refused)
    offchip_capacity_bytes: int | None = None
    description: str = ""
    source: str | None = field(default=None, compare=False)
    #: programs that run at once (a GPU's SMs): a group whose grid has fewer, or a last partial wave, leaves
    #: units idle; 0: a group's work is spread over the whole chip (an accelerator's array, one loop nest)
    program_slots: int = 0
    #: the matrix unit's smallest reduction per product (a tensor core's K): shorter ones waste the rest
    matrix_min: int = 1
    #: programs one slot holds at once (their recurrence chains overlap), when their buffers fit it together
    resident_programs: int = 1
    #: elements one program (or the whole chip, without slots) advances per dependent step of a recurrence
    step_width: int = 1
    #: latency of one dependent step of a recurrence (load of its inputs, the update, the state kept on chip)
    recurrence_step_s: float = 0.0
    #: Seconds each further statement of a recurrence's tile loop adds to a step (a load, compute or store
    #: with its barrier: one more dependent round trip per step). 0: none
    recurrence_statement_s: float = 0.0
    #: bytes of partial sums one program keeps in registers across a reduction loop (a GPU's ``tl.dot``
    #: accumulator, each axis padded to a power of two); a tiling needing more is not searched. 0: no limit
    accumulator_bytes: int = 0
    #: Bytes per second a program's scratch (a GPU printer's per-program arena in global memory, cached in L1
    #: and L2) moves: what each element a group loads or computes outside registers costs on its way through
    #: it (:func:`~mambalaya.cost.price.staged_bytes`). 0: staging is free (on-chip buffers the roofline covers)
    staging_bandwidth: float = 0.0
    #: Smallest piece of off-chip memory one access moves (a GPU's 32-byte sector): a load or store whose
    #: contiguous runs are shorter moves whole sectors (:func:`~mambalaya.cost.price.sector_bytes`). 0: exact
    sector_bytes: int = 0

    # --- compute -------------------------------------------------------------------

    def op_cost(self, op_kind: str) -> OpCost:
        """The pricing of an operation kind (aliases such as ``sub`` resolve to ``add``)."""
        kind = OP_ALIASES.get(op_kind, op_kind)
        for op in self.ops:
            if op.kind == kind:
                return op
        known = [op.kind for op in self.ops] + list(OP_ALIASES)
        raise ArchError(
            f"arch {self.name!r} has no price for operation kind {op_kind!r}{did_you_mean(op_kind, known)}"
            f"; known kinds: {', '.join(op.kind for op in self.ops)}",
            file=self.source,
        )

    def unit(self, name: str) -> ComputeUnit:
        """The compute unit called ``name``."""
        for u in self.units:
            if u.name == name:
                return u
        raise ArchError(
            f"arch {self.name!r} has no compute unit {name!r}"
            f"{did_you_mean(name, [u.name for u in self.units])}",
            file=self.source,
        )

    def unit_rate(self, name: str, precision: str | None = None, *, achievable: bool = True) -> float:
        """Unit-ops per second of a whole unit kind (all SMs / PEs / lanes), op/s."""
        unit = self.unit(name)
        prec = precision or self.precision
        entry = unit.rate(prec)
        if entry is None:
            listed = ", ".join(r.precision for r in unit.rates)
            raise ArchError(
                f"compute unit {name!r} of arch {self.name!r} has no rate for precision {prec!r} "
                f"(it lists {listed}); add one under units.{name}.peak",
                file=self.source,
            )
        value = entry.value * (self.clock_hz if entry.per_cycle else 1.0)
        if unit.per_lane:
            value *= self.lanes
        return value * (entry.efficiency if achievable else 1.0)

    def throughput(
        self, op_kind: str, matrix: bool = False, precision: str | None = None, *, achievable: bool = True
    ) -> float:
        """Operations of ``op_kind`` per second (a ``mac`` counts once, not as 2 FLOP).

        ``matrix=True`` prices the op as part of a contraction on the matrix unit
        where the op kind has one (a GEMM's MACs on tensor cores or the 2D array);
        otherwise, and for kinds with no matrix unit, the element-wise unit is used.
        ``achievable=False`` gives the peak, without the efficiency terms.
        """
        op = self.op_cost(op_kind)
        if matrix and op.matrix_unit is not None:
            unit, cost = op.matrix_unit, op.matrix_cost if op.matrix_cost is not None else op.cost
        else:
            unit, cost = op.unit, op.cost
        return self.unit_rate(unit, precision, achievable=achievable) / cost

    def pipeline_occupancy(self, length: int) -> float:
        """Fraction of peak a pipelined reduction of ``length`` steps reaches (fill and drain).

        ``length / (length + pipeline_depth)``: on IMAX's 64-stage lane, 0.5 at 64
        and 0.88 at 480; 1.0 on archs with no pipeline depth.
        """
        if self.pipeline_depth <= 0:
            return 1.0
        if length <= 0:
            return 0.0
        return length / (length + self.pipeline_depth)

    # --- storage -------------------------------------------------------------------

    def buffer(self, name: str) -> BufferLevel:
        """The buffer level called ``name``."""
        for b in self.buffers:
            if b.name == name:
                return b
        raise ArchError(
            f"arch {self.name!r} has no buffer level {name!r}"
            f"{did_you_mean(name, [b.name for b in self.buffers])}",
            file=self.source,
        )

    def buffer_bytes(self, name: str) -> int:
        """Total capacity of a level: instances x per-instance bytes (x lanes where per lane)."""
        b = self.buffer(name)
        return b.instance_bytes * b.instances * (self.lanes if b.per_lane else 1)

    def buffer_bandwidth(self, name: str) -> float:
        """Aggregate bandwidth of a level, B/s (x lanes where per lane)."""
        b = self.buffer(name)
        return b.bandwidth * (self.lanes if b.per_lane else 1)

    @property
    def fusion_buffer(self) -> BufferLevel:
        """The level that holds a fusion group's intermediates."""
        return next(b for b in self.buffers if b.holds_fused)

    @property
    def fusion_buffer_bytes(self) -> int:
        """Capacity a fusion group's on-chip buffers must fit in, bytes: on an arch with program slots (a GPU),
        one instance of the level (a program's buffers live in one SM's shared memory), else the whole level."""
        if self.program_slots:
            return self.fusion_buffer.instance_bytes
        return self.buffer_bytes(self.fusion_buffer.name)

    # --- sweeps and reports ------------------------------------------------------------

    def with_overrides(self, **changes: Any) -> Arch:
        """A copy with some figures changed, for design-space sweeps.

        Keys are those of :data:`OVERRIDABLE`; values are numbers in SI base units
        or quantity strings ("64 KiB", "1 TB/s"). ``offchip_bandwidth`` scales the
        peak too (the measured efficiency is kept); ``fusion_buffer_bytes`` sets the
        fusion level's total capacity (one instance of that size).
        """
        new = self
        for key, raw in changes.items():
            if key not in OVERRIDABLE:
                raise ArchError(
                    f"cannot override {key!r} of arch {self.name!r}{did_you_mean(key, list(OVERRIDABLE))}"
                    f"; overridable: {', '.join(OVERRIDABLE)}",
                    file=self.source,
                )
            value = _check_override(key, raw)
            if key == "fusion_buffer_bytes":
                level = replace(new.fusion_buffer, instance_bytes=value, instances=1, per_lane=False)
                new = replace(new, buffers=tuple(level if b.holds_fused else b for b in new.buffers))
            elif key == "offchip_bandwidth":
                scale = value / new.offchip_bandwidth
                new = replace(
                    new, offchip_bandwidth=value, offchip_peak_bandwidth=new.offchip_peak_bandwidth * scale
                )
            else:
                new = replace(new, **{key: value})
        return new

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: the resolved figures, and every op kind's throughput."""

        def op_row(op: OpCost) -> dict[str, Any]:
            row: dict[str, Any] = {"unit": op.unit, "cost": op.cost, "throughput": self.throughput(op.kind)}
            if op.matrix_unit is not None:
                row.update(
                    matrix_unit=op.matrix_unit,
                    matrix_cost=op.matrix_cost,
                    matrix_throughput=self.throughput(op.kind, matrix=True),
                )
            return row

        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "source": self.source,
            "can_fuse": self.can_fuse,
            "clock_hz": self.clock_hz,
            "precision": self.precision,
            "element_bytes": self.element_bytes,
            "lanes": self.lanes,
            "offchip_bandwidth": self.offchip_bandwidth,
            "offchip_peak_bandwidth": self.offchip_peak_bandwidth,
            "offchip_capacity_bytes": self.offchip_capacity_bytes,
            "fusion_buffer": self.fusion_buffer.name,
            "fusion_buffer_bytes": self.fusion_buffer_bytes,
            "group_overhead_s": self.group_overhead_s,
            "transfer_overhead_s": self.transfer_overhead_s,
            "statement_overhead_s": self.statement_overhead_s,
            "pipeline_depth": self.pipeline_depth,
            "program_slots": self.program_slots,
            "resident_programs": self.resident_programs,
            "matrix_min": self.matrix_min,
            "step_width": self.step_width,
            "recurrence_step_s": self.recurrence_step_s,
            "recurrence_statement_s": self.recurrence_statement_s,
            "accumulator_bytes": self.accumulator_bytes,
            "staging_bandwidth": self.staging_bandwidth,
            "sector_bytes": self.sector_bytes,
            "weights_resident": self.weights_resident,
            "buffers": [
                {
                    "name": b.name,
                    "bytes": self.buffer_bytes(b.name),
                    "instance_bytes": b.instance_bytes,
                    "instances": b.instances * (self.lanes if b.per_lane else 1),
                    "bandwidth": self.buffer_bandwidth(b.name),
                    "holds_fused": b.holds_fused,
                }
                for b in self.buffers
            ],
            "units": [
                {
                    "name": u.name,
                    "description": u.description,
                    "peak": {
                        r.precision: self.unit_rate(
                            u.name, r.precision if r.precision != ANY else None, achievable=False
                        )
                        for r in u.rates
                    },
                    "efficiency": {r.precision: r.efficiency for r in u.rates},
                }
                for u in self.units
            ],
            "ops": {op.kind: op_row(op) for op in self.ops},
        }


# Figures a sweep may change, with the check each value must pass.
OVERRIDABLE: dict[str, str] = {
    "name": "text",
    "description": "text",
    "can_fuse": "bool",
    "clock_hz": "frequency",
    "precision": "precision",
    "element_bytes": "positive int",
    "lanes": "positive int",
    "offchip_bandwidth": "bandwidth",
    "fusion_buffer_bytes": "size",
    "group_overhead_s": "time",
    "transfer_overhead_s": "time",
    "statement_overhead_s": "time",
    "pipeline_depth": "non-negative int",
    "program_slots": "non-negative int",
    "resident_programs": "positive int",
    "matrix_min": "positive int",
    "step_width": "positive int",
    "recurrence_step_s": "time",
    "recurrence_statement_s": "time",
    "accumulator_bytes": "size",
    "staging_bandwidth": "bandwidth",
    "sector_bytes": "size",
}


def _check_override(key: str, raw: Any) -> Any:
    """Validate one override value (numbers in SI units, or quantity strings)."""
    check = OVERRIDABLE[key]
    bad = ArchError(f"override {key}={raw!r}: expected a {check}")
    if check == "text":
        if not isinstance(raw, str):
            raise bad
        return raw
    if check == "bool":
        if not isinstance(raw, bool):
            raise bad
        return raw
    if check == "precision":
        if raw not in PRECISIONS:
            raise ArchError(f"override {key}={raw!r}: expected one of {', '.join(PRECISIONS)}")
        return raw
    if check.endswith("int"):
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < (0 if check.startswith("non") else 1):
            raise bad
        return raw
    value = parse_quantity(raw, check, key) if isinstance(raw, str) else raw
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad
    if value < 0 or (value == 0 and check != "time"):
        raise ArchError(
            f"override {key}={raw!r}: must be {'non-negative' if check == 'time' else 'positive'}"
        )
    if check == "size":
        if int(value) != value:
            raise ArchError(f"override {key}={raw!r}: not a whole number of bytes")
        return int(value)
    return float(value)


# ----------------------------------------------------------------------------- loading


def load_arch(name_or_path: str | Path) -> Arch:
    """Load a shipped spec by name (``h200``) or any spec file by path."""
    text_name = str(name_or_path)
    path = Path(name_or_path)
    looks_like_path = (
        isinstance(name_or_path, Path) or text_name.endswith((".yaml", ".yml")) or "/" in text_name
    )
    if not looks_like_path and not path.is_file():
        candidate = archs_dir() / f"{text_name}.yaml"
        if not candidate.is_file():
            names = shipped_archs()
            raise ArchError(
                f"unknown architecture {text_name!r}{did_you_mean(text_name, names)}; "
                f"shipped: {', '.join(names) or 'none'}, or give a path to a .yaml spec"
            )
        path = candidate
    return parse_arch(read_text(path, ArchError, "architecture spec"), file=str(path))


def parse_arch(text: str, file: str = "<string>") -> Arch:
    """Parse and validate the YAML text of a spec (``file`` is used in error messages)."""
    root = compose_yaml(text, file, ArchError)
    if root is None:
        raise ArchError(
            "the spec is empty; it must be a mapping with name, kind, clock, units, ops, buffers, "
            "offchip and overheads (see archs/h200.yaml)",
            file=file,
            line=1,
        )
    return _Reader(file).arch(root)


_TOP_REQUIRED = ("name", "kind", "can_fuse", "clock", "units", "ops", "buffers", "offchip", "overheads")
_TOP_OPTIONAL = ("description", "precision", "element_bytes", "lanes", "pipeline_depth", "weights_resident",
                 "parallelism")
_PARALLELISM_KEYS = ("programs", "resident", "step_width", "recurrence_step", "recurrence_statement", "matrix_min", "accumulator", "staging", "sector",
                     "description")
_UNIT_KEYS = ("peak", "efficiency", "per_lane", "description")
_OP_KEYS = ("unit", "cost", "matrix_unit", "matrix_cost", "note")
_BUFFER_KEYS = ("name", "capacity", "instances", "bandwidth", "holds_fused", "per_lane", "description")
_OFFCHIP_KEYS = ("bandwidth", "efficiency", "capacity", "description")
_OVERHEAD_KEYS = ("per_group", "per_transfer", "per_statement", "description")

_EXAMPLES = {
    "name": "name: my_accel",
    "kind": "kind: accelerator",
    "can_fuse": "can_fuse: true",
    "clock": "clock: 1.75 GHz",
    "bandwidth": "bandwidth: 2039 GB/s",
    "capacity": "capacity: 8 KiB",
    "per_group": "per_group: 5 us",
    "peak": "peak: 989 TFLOP/s",
    "unit": "unit: cuda_core",
}

_Pairs = dict[str, tuple[yaml.Node, yaml.Node]]


class _Reader:
    """Walks the composed YAML node tree, so every error can carry a line number."""

    def __init__(self, file: str) -> None:
        self.file = file
        self._constructor = yaml.SafeLoader("")

    def error(self, message: str, node: yaml.Node | None) -> ArchError:
        line = node.start_mark.line + 1 if node is not None else None
        return ArchError(message, file=self.file, line=line)

    # --- generic node readers ---------------------------------------------------------

    def mapping(
        self, node: yaml.Node, where: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()
    ) -> _Pairs:
        """Keys of a mapping node, checked against the allowed and required keys."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(f"{where} must be a mapping of keys to values, not {_node_kind(node)}", node)
        pairs: _Pairs = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node)
            if not isinstance(key, str):
                raise self.error(f"{where}: key {key!r} must be a name", key_node)
            if key in pairs:
                raise self.error(f"{where}: key {key!r} appears twice; keep one", key_node)
            if allowed and key not in allowed:
                raise self.error(
                    f"{where}: unknown key {key!r}{did_you_mean(key, list(allowed))}; "
                    f"allowed keys: {', '.join(allowed)}",
                    key_node,
                )
            pairs[key] = (key_node, value_node)
        for key in required:
            if key not in pairs:
                example = _EXAMPLES.get(key)
                hint = f", e.g. `{example}`" if example else ""
                raise self.error(
                    f"{where}: missing required key {key!r}; add it{hint} (see archs/h200.yaml)", node
                )
        return pairs

    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return node
        try:
            return self._constructor.construct_object(node)
        except yaml.YAMLError as exc:  # e.g. a !!python tag: SafeLoader refuses it
            problem = getattr(exc, "problem", None) or exc
            raise self.error(
                f"cannot read this value: {problem}; write plain text or a number", node
            ) from None

    def string(self, node: yaml.Node, where: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str) or not value.strip():
            raise self.error(f"{where} must be a non-empty text, not {_node_kind(node)}", node)
        return value

    def boolean(self, node: yaml.Node, where: str) -> bool:
        value = self.scalar(node)
        if not isinstance(value, bool):
            raise self.error(f"{where} must be true or false, not {_node_kind(node)}", node)
        return value

    def weights_resident(self, node: yaml.Node) -> bool:
        if self.boolean(node, "weights_resident"):
            raise self.error("weights_resident: true is not modelled: a schedule keeps a weight on chip within "
                             "its fusion group only (each group loads what it reads); remove the key or set it "
                             "false", node)
        return False

    def integer(self, node: yaml.Node, where: str, minimum: int) -> int:
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"{where} must be a whole number, not {_node_kind(node)}", node)
        if value < minimum:
            raise self.error(f"{where} must be at least {minimum}, not {value}", node)
        return value

    def number(
        self, node: yaml.Node, where: str, *, positive: bool = True, at_most: float | None = None
    ) -> float:
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(f"{where} must be a plain number, not {_node_kind(node)}", node)
        if positive and value <= 0:
            raise self.error(f"{where} must be positive, not {value}", node)
        if at_most is not None and value > at_most:
            raise self.error(f"{where} must be at most {at_most}, not {value}", node)
        return float(value)

    def quantity(self, node: yaml.Node, dimension: str, where: str, *, allow_zero: bool = False) -> float:
        value = self.scalar(node)
        try:
            parsed = parse_quantity(
                value if isinstance(value, (str, int, float)) else _node_kind(node), dimension, where
            )
        except ArchError as exc:
            raise exc.located(self.file, node.start_mark.line + 1) from None
        if parsed < 0 or (parsed == 0 and not allow_zero):
            raise self.error(
                f"{where}: {value!r} must be {'non-negative' if allow_zero else 'positive'}", node
            )
        return parsed

    # --- the spec ----------------------------------------------------------------------

    def arch(self, root: yaml.Node) -> Arch:
        top = self.mapping(root, "the spec", _TOP_REQUIRED + _TOP_OPTIONAL, _TOP_REQUIRED)
        name = self.string(top["name"][1], "name")
        kind_node = top["kind"][1]
        kind = self.string(kind_node, "kind")
        if kind not in ARCH_KINDS:
            raise self.error(
                f"kind {kind!r} is not one of {', '.join(ARCH_KINDS)}{did_you_mean(kind, list(ARCH_KINDS))}",
                kind_node,
            )
        opt = {k: v for k, (_, v) in top.items()}
        precision = "fp32"
        if "precision" in opt:
            precision = self.precision(opt["precision"], "precision")
        units = self.units(top["units"][1])
        unit_names = {u.name for u in units}
        ops = self.ops(top["ops"][1], unit_names)
        buffers = self.buffers(top["buffers"][1])
        off = self.mapping(top["offchip"][1], "offchip", _OFFCHIP_KEYS, ("bandwidth",))
        peak_bw = self.quantity(off["bandwidth"][1], "bandwidth", "offchip.bandwidth")
        bw_eff = (
            self.number(off["efficiency"][1], "offchip.efficiency", at_most=1.0)
            if "efficiency" in off
            else 1.0
        )
        capacity = (
            int(self.quantity(off["capacity"][1], "size", "offchip.capacity")) if "capacity" in off else None
        )
        over = self.mapping(top["overheads"][1], "overheads", _OVERHEAD_KEYS, ("per_group",))
        per_group = self.quantity(over["per_group"][1], "time", "overheads.per_group", allow_zero=True)
        per_transfer = 0.0
        if "per_transfer" in over:
            per_transfer = self.quantity(
                over["per_transfer"][1], "time", "overheads.per_transfer", allow_zero=True
            )
        per_execution = 0.0
        if "per_statement" in over:
            per_execution = self.quantity(
                over["per_statement"][1], "time", "overheads.per_statement", allow_zero=True
            )
        slots, resident, width, step, matrix_min, accumulator, staging, sector = 0, 1, 1, 0.0, 1, 0, 0.0, 0
        per_statement = 0.0
        if "parallelism" in opt:
            par = self.mapping(opt["parallelism"], "parallelism", _PARALLELISM_KEYS, ())
            if "programs" in par:
                slots = self.integer(par["programs"][1], "parallelism.programs", 1)
            if "matrix_min" in par:
                matrix_min = self.integer(par["matrix_min"][1], "parallelism.matrix_min", 1)
            if "resident" in par:
                resident = self.integer(par["resident"][1], "parallelism.resident", 1)
            if "step_width" in par:
                width = self.integer(par["step_width"][1], "parallelism.step_width", 1)
            if "accumulator" in par:
                accumulator = int(self.quantity(par["accumulator"][1], "size", "parallelism.accumulator"))
            if "sector" in par:
                sector = int(self.quantity(par["sector"][1], "size", "parallelism.sector"))
            if "staging" in par:
                staging = self.quantity(par["staging"][1], "bandwidth", "parallelism.staging")
            if "recurrence_statement" in par:
                per_statement = self.quantity(par["recurrence_statement"][1], "time",
                                              "parallelism.recurrence_statement", allow_zero=True)
            if "recurrence_step" in par:
                step = self.quantity(par["recurrence_step"][1], "time", "parallelism.recurrence_step",
                                     allow_zero=True)
        arch = Arch(
            name=name,
            kind=kind,
            description=self.string(opt["description"], "description") if "description" in opt else "",
            can_fuse=self.boolean(top["can_fuse"][1], "can_fuse"),
            clock_hz=self.quantity(top["clock"][1], "frequency", "clock"),
            units=units,
            ops=ops,
            buffers=buffers,
            offchip_bandwidth=peak_bw * bw_eff,
            offchip_peak_bandwidth=peak_bw,
            offchip_capacity_bytes=capacity,
            group_overhead_s=per_group,
            transfer_overhead_s=per_transfer,
            statement_overhead_s=per_execution,
            pipeline_depth=self.integer(opt["pipeline_depth"], "pipeline_depth", 0)
            if "pipeline_depth" in opt
            else 0,
            precision=precision,
            element_bytes=self.integer(opt["element_bytes"], "element_bytes", 1)
            if "element_bytes" in opt
            else 4,
            lanes=self.integer(opt["lanes"], "lanes", 1) if "lanes" in opt else 1,
            weights_resident=self.weights_resident(opt["weights_resident"]) if "weights_resident" in opt else False,
            source=self.file,
            program_slots=slots,
            resident_programs=resident,
            matrix_min=matrix_min,
            step_width=width,
            recurrence_step_s=step,
            recurrence_statement_s=per_statement,
            accumulator_bytes=accumulator,
            staging_bandwidth=staging,
            sector_bytes=sector,
        )
        self.check_precisions(arch, top)
        return arch

    def precision(self, node: yaml.Node, where: str) -> str:
        value = self.string(node, where)
        if value not in PRECISIONS and value != ANY:
            raise self.error(
                f"{where}: unknown precision {value!r}{did_you_mean(value, list(PRECISIONS))}; "
                f"use one of {', '.join(PRECISIONS)}",
                node,
            )
        return value

    def units(self, node: yaml.Node) -> tuple[ComputeUnit, ...]:
        pairs = self.mapping(node, "units", ())
        if not pairs:
            raise self.error("units must name at least one compute unit", node)
        out = []
        for name, (_, unit_node) in pairs.items():
            where = f"units.{name}"
            spec = self.mapping(unit_node, where, _UNIT_KEYS, ("peak",))
            peak_node = spec["peak"][1]
            peaks: dict[str, tuple[float, bool, yaml.Node]] = {}
            if isinstance(peak_node, yaml.MappingNode):
                for prec, (key_node, rate_node) in self.mapping(peak_node, f"{where}.peak", ()).items():
                    if prec not in PRECISIONS and prec != ANY:
                        raise self.error(
                            f"{where}.peak: unknown precision {prec!r}"
                            f"{did_you_mean(prec, list(PRECISIONS))}; use one of "
                            f"{', '.join(PRECISIONS)} or {ANY}",
                            key_node,
                        )
                    peaks[prec] = (*self.rate(rate_node, f"{where}.peak.{prec}"), rate_node)
                if not peaks:
                    raise self.error(f"{where}.peak must give at least one rate", peak_node)
            else:
                peaks[ANY] = (*self.rate(peak_node, f"{where}.peak"), peak_node)
            effs: dict[str, float] = {}
            if "efficiency" in spec:
                eff_node = spec["efficiency"][1]
                if isinstance(eff_node, yaml.MappingNode):
                    for prec, (key_node, value_node) in self.mapping(
                        eff_node, f"{where}.efficiency", ()
                    ).items():
                        if prec not in peaks:
                            raise self.error(
                                f"{where}.efficiency: no peak is given for precision {prec!r}; "
                                f"give efficiencies only for {', '.join(peaks)}",
                                key_node,
                            )
                        effs[prec] = self.number(value_node, f"{where}.efficiency.{prec}", at_most=1.0)
                else:
                    value = self.number(eff_node, f"{where}.efficiency", at_most=1.0)
                    effs = {prec: value for prec in peaks}
            rates = tuple(
                UnitRate(prec, value, per_cycle, effs.get(prec, 1.0))
                for prec, (value, per_cycle, _) in peaks.items()
            )
            per_lane = self.boolean(spec["per_lane"][1], f"{where}.per_lane") if "per_lane" in spec else False
            desc = (
                self.string(spec["description"][1], f"{where}.description") if "description" in spec else ""
            )
            out.append(ComputeUnit(name, rates, per_lane, desc))
        return tuple(out)

    def rate(self, node: yaml.Node, where: str) -> tuple[float, bool]:
        """A unit's peak: op/s, or op/cycle (scaled by the clock later)."""
        value = self.scalar(node)
        if isinstance(value, str) and value.strip().endswith("/cycle"):
            return self.quantity(node, "per_cycle", where), True
        return self.quantity(node, "compute", where), False

    def ops(self, node: yaml.Node, unit_names: set[str]) -> tuple[OpCost, ...]:
        pairs = self.mapping(node, "ops", ())
        out = []
        for kind, (key_node, op_node) in pairs.items():
            where = f"ops.{kind}"
            if kind in OP_ALIASES:
                raise self.error(
                    f"{where}: {kind!r} is priced as {OP_ALIASES[kind]!r}; remove this entry", key_node
                )
            spec = self.mapping(op_node, where, _OP_KEYS, ("unit",))
            unit = self.unit_ref(spec["unit"][1], f"{where}.unit", unit_names)
            cost = self.number(spec["cost"][1], f"{where}.cost") if "cost" in spec else 1.0
            matrix_unit = matrix_cost = None
            if "matrix_unit" in spec:
                matrix_unit = self.unit_ref(spec["matrix_unit"][1], f"{where}.matrix_unit", unit_names)
                matrix_cost = (
                    self.number(spec["matrix_cost"][1], f"{where}.matrix_cost")
                    if "matrix_cost" in spec
                    else cost
                )
            elif "matrix_cost" in spec:
                raise self.error(
                    f"{where}: matrix_cost needs a matrix_unit; add one or remove matrix_cost",
                    spec["matrix_cost"][0],
                )
            if "note" in spec:
                self.string(spec["note"][1], f"{where}.note")
            out.append(OpCost(kind, unit, cost, matrix_unit, matrix_cost))
        missing = [k for k in OP_KINDS if k not in pairs]
        if missing:
            raise self.error(
                f"ops: missing operation kinds {', '.join(missing)}; every spec must price "
                f"{', '.join(OP_KINDS)}",
                node,
            )
        return tuple(out)

    def unit_ref(self, node: yaml.Node, where: str, unit_names: set[str]) -> str:
        name = self.string(node, where)
        if name not in unit_names:
            raise self.error(
                f"{where}: no compute unit {name!r}{did_you_mean(name, sorted(unit_names))}; "
                f"units defined: {', '.join(sorted(unit_names))}",
                node,
            )
        return name

    def buffers(self, node: yaml.Node) -> tuple[BufferLevel, ...]:
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.error(f"buffers must be a non-empty list of levels, not {_node_kind(node)}", node)
        out: list[BufferLevel] = []
        for i, level_node in enumerate(node.value):
            spec = self.mapping(level_node, f"buffers[{i}]", _BUFFER_KEYS, ("name", "capacity", "bandwidth"))
            name = self.string(spec["name"][1], f"buffers[{i}].name")
            where = f"buffers.{name}"
            if any(b.name == name for b in out):
                raise self.error(
                    f"{where}: a second level named {name!r}; names must differ", spec["name"][1]
                )
            out.append(
                BufferLevel(
                    name=name,
                    instance_bytes=int(self.quantity(spec["capacity"][1], "size", f"{where}.capacity")),
                    instances=self.integer(spec["instances"][1], f"{where}.instances", 1)
                    if "instances" in spec
                    else 1,
                    bandwidth=self.quantity(spec["bandwidth"][1], "bandwidth", f"{where}.bandwidth"),
                    holds_fused=self.boolean(spec["holds_fused"][1], f"{where}.holds_fused")
                    if "holds_fused" in spec
                    else False,
                    per_lane=self.boolean(spec["per_lane"][1], f"{where}.per_lane")
                    if "per_lane" in spec
                    else False,
                    description=self.string(spec["description"][1], f"{where}.description")
                    if "description" in spec
                    else "",
                )
            )
        fused = [b.name for b in out if b.holds_fused]
        if len(fused) != 1:
            raise self.error(
                f"buffers: exactly one level must say holds_fused: true (the one that holds fused "
                f"intermediates); found {len(fused)}{': ' + ', '.join(fused) if fused else ''}",
                node,
            )
        return tuple(out)

    def check_precisions(self, arch: Arch, top: _Pairs) -> None:
        """The default precision must be priced for every op's units (a spec is usable as loaded)."""
        for op in arch.ops:
            for unit in (op.unit, op.matrix_unit):
                if unit is not None and arch.unit(unit).rate(arch.precision) is None:
                    node = top["precision"][1] if "precision" in top else top["units"][1]
                    raise self.error(
                        f"unit {unit!r} (used by ops.{op.kind}) has no rate for the default precision "
                        f"{arch.precision!r}; add one under units.{unit}.peak",
                        node,
                    )


def _node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag.endswith(":null"):
        return "an empty value"
    return repr(node.value)
