"""Traffic accounting of the fused executor: counter layout and what the kernels measure.

Every fused kernel receives ``tc``, an int64 array with two slots per boundary
array (slot ``2*i``: elements loaded from parameter ``i``; ``2*i+1``: elements
stored to it), and one uint8 *touched bitmap* per boundary array. Before each
member Einsum runs on a tile, the kernel enumerates the in-range elements that
Einsum's reads of boundary tensors touch over the tile (masks do not shrink a
load; a read one step before a recurrence's start loads the initial state) and
counts each element the first time the current *pass* touches it; after it, the
elements of the tile it stores (an output element is written back once). A pass
ends, and the bitmap is cleared, at the top of the tile loop ``clr[i]``: the
innermost tiled loop outside the first loop-order rank indexing the tensor, for
a tensor that does not stay on chip (:func:`mambalaya.exec.fused.clear_levels`
decides residency by the cost model's capacity rule). A weight on a
``weights_resident`` arch shares one bitmap across the groups of a run.

So a group's count is, per boundary input, distinct elements loaded per pass x
passes, and per exported tensor its size: the rule of :mod:`mambalaya.cost.traffic`,
measured rather than computed. Bytes are elements times the tensor's declared
element size (``TensorSpec.element_bytes``), whatever dtype the executor computes in.
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
    """An upper bound for the all-unfused mapping: every Einsum reads each operand whole, writes its output once."""
    total = 0
    for e in cascade.einsums:
        total += sum(cascade.nbytes(t) for t in e.reads if t != e.name)
        total += cascade.nbytes(e.name)
    return total
