"""The file text of a random ``[m, n]`` cascade, shared by the hypothesis strategies of the mapper tests."""

from __future__ import annotations


def cascade_text(lines: list[str], weights: list[str], size: int) -> str:
    """A cascade named ``rnd`` over ranks m (``size``), n and k (32) with these Einsum lines."""
    tensors = "\n".join(f"  {w}: {{role: weight}}" for w in weights) or "  A: {role: input}"
    body = "\n".join(f"  - {line}" for line in lines)
    return (f"name: rnd\nparams: {{M: {size}, N: 32}}\nranks: {{m: M, n: N, k: N}}\ntensors:\n{tensors}\n"
            f"einsums:\n{body}\n")
