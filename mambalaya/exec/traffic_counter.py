"""Traffic accounting of the fused executor: counter layout and the rule it implements.

Every fused kernel receives ``tc``, an int64 array with two slots per boundary
array it takes (slot ``2*i`` counts elements loaded from parameter ``i``, slot
``2*i+1`` elements stored to it). The generated code increments a slot at the
point where its loop nest moves data between the full ("off-chip") arrays and
the group's on-chip buffers:

* a **load** of a boundary input (an input, weight, initial state, or a tensor
  an earlier group wrote) happens once per group when the group is a single
  tile: the tensor is brought on chip whole and every reuse inside the group is
  served from there, so it costs its full element count once;
* a **store** of a produced tensor happens once, with its full element count,
  iff it is a cascade output or some Einsum outside the group reads it;
  tensors produced and consumed inside the group live in on-chip buffers and
  cost nothing.

Bytes are elements times the tensor's declared element size in the cascade
(``TensorSpec.element_bytes``), whatever dtype the executor computes in, so the
count is comparable with the cost model's ``Cascade.nbytes`` to the byte.
This is exactly the cost model's rule for an untiled group: per group, each
tensor read but not produced is read once (full nbytes), each produced tensor
is written once iff it leaves the group. Tiled groups (where a tensor that does
not fit the buffer is re-read once per iteration of the tiled ranks outer to
it) are rejected by the code generator for now, so ``buffer_bytes`` cannot
change a count yet; it is accepted and checked for consistency.
"""

from __future__ import annotations

import numpy as np

from mambalaya.ir.cascade import Cascade


def new_counter(n_params: int) -> np.ndarray:
    """A zeroed counter for a kernel taking ``n_params`` boundary arrays."""
    return np.zeros(2 * n_params, dtype=np.int64)


def counted_bytes(
    cascade: Cascade, params: tuple[str, ...], counter: np.ndarray, into: dict[str, dict[str, int]]
) -> int:
    """Fold one kernel's counter into per-tensor ``{"read": bytes, "write": bytes}``; return its total."""
    total = 0
    for i, t in enumerate(params):
        eb = cascade.tensors[t].element_bytes
        r, w = int(counter[2 * i]) * eb, int(counter[2 * i + 1]) * eb
        slot = into.setdefault(t, {"read": 0, "write": 0})
        slot["read"] += r
        slot["write"] += w
        total += r + w
    return total


def unfused_rule_bytes(cascade: Cascade) -> int:
    """The hand rule for the all-unfused mapping: every Einsum reads each operand once, writes its output once."""
    total = 0
    for e in cascade.einsums:
        total += sum(cascade.nbytes(t) for t in e.reads if t != e.name)
        total += cascade.nbytes(e.name)
    return total
