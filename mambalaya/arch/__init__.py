"""Stage ``arch``: architecture specs (``archs/*.yaml``) loaded into typed, frozen data.

The mapper and the cost model see an architecture only through :class:`Arch`;
every figure is in SI base units (bytes, bytes/s, seconds, Hz, operations/s).

Loading::

    load_arch("h200")                    # a shipped spec (archs/h200.yaml), or
    load_arch("path/to/my_accel.yaml")   # any spec file
    shipped_archs()                      # ['h100', 'h200', 'imax3', 'mambalaya', 'marca']
    parse_arch(text, file="x.yaml")      # from a string

:class:`Arch` fields:

- ``name``, ``kind`` (``gpu`` | ``accelerator`` | ``cgla``), ``description``, ``source`` (file)
- ``can_fuse``: False for the unfused baseline (``marca``): every Einsum is its own group
- ``clock_hz``; ``precision`` (default arithmetic precision: fp32, tf32, bf16, ...);
  ``element_bytes`` (default bytes per element); ``lanes`` (CGLA lanes)
- ``offchip_bandwidth``: achievable off-chip bandwidth, B/s (peak x measured or assumed
  efficiency; the roofline uses this); ``offchip_peak_bandwidth``; ``offchip_capacity_bytes``
- ``fusion_buffer_bytes`` (property): capacity a fusion group's on-chip intermediates
  must fit in; ``fusion_buffer`` is that :class:`BufferLevel`; ``buffers`` lists all levels
- ``group_overhead_s``: fixed time per fusion group (GPU kernel launch; CGLA host
  coordination and kernel start; accelerator reconfiguration)
- ``transfer_overhead_s``: per off-chip transfer a group makes (CGLA DMA setup; 0 on GPUs)
- ``pipeline_depth``: stages to fill and drain per pipelined reduction (0 where not meaningful)
- ``weights_resident``: must be false (each fusion group loads the weights it reads; true is refused)
- ``units`` (:class:`ComputeUnit`) and ``ops`` (:class:`OpCost`): which unit each op kind runs on

Methods:

- ``throughput(op_kind, matrix=False, precision=None) -> float``: operations of that
  kind per second (one ``mac`` counts once; it is 2 FLOP). ``matrix=True`` prices the
  op as part of a contraction on the matrix unit (tensor cores, the 2D PE array) where
  the kind has one; element-wise work uses the vector / 1D / special-function unit.
  Op kinds: ``mac add mul div max exp log sqrt rsqrt sigmoid silu softplus`` (every
  spec prices all of them) plus aliases (``sub``->add, ``min``->max, ...); an element-wise function is
  priced as the kind its row in :mod:`mambalaya.ir.functions` gives (``neg`` is an add).
  ``achievable=False`` gives the peak without efficiency terms.
- ``pipeline_occupancy(length)``: ``length / (length + pipeline_depth)``, the fraction of
  peak a pipelined reduction of that length reaches (IMAX: 0.5 at 64, 0.88 at 480).
- ``unit_rate(unit, precision)``, ``buffer(name)``, ``buffer_bytes(name)``, ``op_cost(kind)``
- ``with_overrides(**changes) -> Arch``: a copy for sweeps, e.g.
  ``fusion_buffer_bytes=64 * 1024`` or ``"64 KiB"``, ``offchip_bandwidth=1e12``,
  ``lanes=8``, ``can_fuse=False``, ``precision="bf16"`` (keys: :data:`OVERRIDABLE`;
  an unknown key raises ArchError with a did-you-mean)
- ``to_dict()``: JSON-ready figures for reports.

Every problem in a spec (YAML syntax, not a mapping, missing or unknown key, wrong
unit, zero or negative size, unknown unit name) raises
:class:`mambalaya.errors.ArchError` with the file and line.
"""

from mambalaya.arch.spec import (
    ARCH_KINDS,
    OP_ALIASES,
    OP_KINDS,
    OVERRIDABLE,
    PRECISIONS,
    Arch,
    BufferLevel,
    ComputeUnit,
    OpCost,
    UnitRate,
    archs_dir,
    load_arch,
    parse_arch,
    shipped_archs,
)
from mambalaya.arch.units import format_quantity, parse_quantity
from mambalaya.errors import ArchError

__all__ = [
    "ARCH_KINDS",
    "OP_ALIASES",
    "OP_KINDS",
    "OVERRIDABLE",
    "PRECISIONS",
    "Arch",
    "ArchError",
    "BufferLevel",
    "ComputeUnit",
    "OpCost",
    "UnitRate",
    "archs_dir",
    "format_quantity",
    "load_arch",
    "parse_arch",
    "parse_quantity",
    "shipped_archs",
]
