"""Small shapes of the shipped Mamba cascades for the executor and mapper tests (compile in seconds)."""

from __future__ import annotations

from mambalaya.ir.cascade import Cascade
from mambalaya.parse import open_cascade

SMALL = {
    "mamba1": {"seqlen": 13, "d_model": 8, "d_state": 4, "dt_rank": 2},
    "mamba2": {"seqlen": 19, "d_model": 16, "d_state": 4, "headdim": 8, "chunk": 8},
    "mamba1-decode": {"d_model": 8, "d_state": 4, "dt_rank": 2},
    "mamba2-decode": {"d_model": 16, "d_state": 4, "headdim": 8},
    "attention": {"heads": 2, "seqlen": 12, "headdim": 8},
    "mlp2": {"M": 12, "K": 8, "N": 10, "P": 4},
}


def small_cascade(name: str, **override: int) -> Cascade:
    """``name`` at its small shape; ``override`` changes params the cascade has (others are ignored)."""
    c = open_cascade(name)
    params = {**SMALL[name], **override}
    return c.with_params(**{k: v for k, v in params.items() if k in c.params})
