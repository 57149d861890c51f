"""The fused Numba executor equals the reference interpreter and counts the cost model's bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_cascades import SMALL, small_cascade

from mambalaya.cost.model import evaluate
from mambalaya.errors import MambalayaError
from mambalaya.exec.fused import run_fused, verify
from mambalaya.exec.reference import random_inputs, run_reference
from mambalaya.exec.traffic_counter import unfused_rule_bytes
from mambalaya.ir.mapping import FusionGroup, Mapping, unfused_mapping
from mambalaya.parse import open_cascade, parse_cascade_text


def _predicted(cascade, mapping: Mapping) -> int:
    """The cost model's traffic for the mapping (untiled groups: the buffer size does not matter)."""
    return evaluate(cascade, "mambalaya", mapping).traffic_bytes


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("mamba2", "mamba2-decode") else n
                                  for n in sorted(SMALL)])
def test_unfused_matches_reference_and_cost_model(name: str) -> None:
    c = small_cascade(name)
    m = unfused_mapping(c)
    r = verify(c, m)
    assert r["ok"], r
    assert r["traffic_counted_bytes"] == _predicted(c, m)
    # footprints: never more than every operand whole once per Einsum
    assert r["traffic_counted_bytes"] <= unfused_rule_bytes(c)


@pytest.mark.parametrize("name", ["mamba1", pytest.param("mamba2", marks=pytest.mark.slow)])
def test_fused_groups_match_reference_and_cost_model(name: str) -> None:
    c = small_cascade(name)
    names = c.einsum_names
    m = Mapping((FusionGroup(names),), c.name)
    r = verify(c, m)
    assert r["ok"], r
    assert r["traffic_counted_bytes"] == _predicted(c, m)


def test_count_off_runs_the_same_numbers() -> None:
    c = small_cascade("mamba1")
    m = unfused_mapping(c)
    inputs = random_inputs(c)
    on, off = run_fused(c, m, inputs), run_fused(c, m, inputs, count=False)
    assert off.traffic_bytes == 0 < on.traffic_bytes
    for k in on.outputs:
        np.testing.assert_array_equal(on.outputs[k], off.outputs[k])


def test_float32_and_second_run_hits_cache() -> None:
    c = small_cascade("mamba1")
    m = Mapping((FusionGroup(c.einsum_names),), c.name)  # one kernel to compile
    assert verify(c, m, dtype="float32")["ok"]
    again = run_fused(c, m, random_inputs(c, 1), "float32")
    assert again.compile_s < 1.0
    ref = run_reference(c, random_inputs(c, 1), "float32", keep="outputs")
    for k, v in ref.items():
        np.testing.assert_allclose(again.outputs[k], v, rtol=1e-3, atol=1e-3 * max(1.0, np.abs(v).max()))


# ---- random small cascades -------------------------------------------------

RANKS = {"a": 4, "b": 3, "c": 5}
FNS = ["exp", "silu", "sigmoid", "softplus", "neg", "abs", "relu", "sqrt", "log", "rsqrt"]


@st.composite
def cascades(draw: st.DrawFn) -> str:
    pool: dict[str, tuple[str, ...]] = {"X": ("a", "b"), "Y": ("b", "c"), "W": ("a", "c")}
    lines = []
    for i in range(draw(st.integers(1, 4))):
        name = f"T{i}"
        src = draw(st.sampled_from(sorted(pool)))
        ranks = pool[src]
        shift = draw(st.sampled_from(["", "-1", "+1", "+2"]))
        idx = [ranks[0] + shift, *ranks[1:]]
        read = f"{src}[{','.join(idx)}]"
        kind = draw(st.sampled_from(["map", "binop", "contract", "reduce", "mask", "recur", "split"]))
        if kind == "map":
            out, rhs = ranks, f"{draw(st.sampled_from(FNS))}({read}) * 0.5 + 1.5"
        elif kind in ("binop", "contract"):
            other = draw(st.sampled_from(sorted(pool)))
            oranks = pool[other]
            union = tuple(dict.fromkeys(ranks + oranks))
            shared = [r for r in ranks if r in oranks]
            out = union if kind == "binop" or not shared else tuple(r for r in union if r != shared[0])
            op = draw(st.sampled_from(["+", "-", "*"])) if kind == "binop" else "*"
            rhs = f"{read} {op} {other}[{','.join(oranks)}]"
        elif kind == "reduce":
            op = draw(st.sampled_from(["sum", "max", "min", "mean", "cumsum"]))
            r = ranks[-1]
            out = ranks if op == "cumsum" else tuple(x for x in ranks if x != r)
            rhs = f"{op}_{r}({read}) + 1.0"
        elif kind == "mask":
            out = ("a", "b", "c")
            rhs = f"{read} * W[a,c] where b <= {draw(st.sampled_from(['a', 'c', 'a-1']))}"
        elif kind == "split":
            out = ("a", "b")
            rhs = "X[a,(a*3+b)//4] + X[a,(a*3+b)%3]"
        else:
            out = ranks
            rest = ",".join(ranks[1:])
            rhs = f"0.5 * {name}[{ranks[0]}-1,{rest}] + {read}"
        if not out:
            continue
        lines.append(f"  - {name}[{','.join(out)}] = {rhs}")
        pool[name] = out
    body = "\n".join(lines)
    return f"name: rnd\nparams: {{A: 4, B: 3, C: 5}}\nranks: {{a: A, b: B, c: C}}\neinsums:\n{body}\n"


def _check_random(text: str) -> None:
    try:
        c = parse_cascade_text(text)
    except MambalayaError:
        return  # the generator may write something the parser rightly refuses
    m = unfused_mapping(c)
    r = verify(c, m)
    assert r["ok"], (text, r)
    assert r["traffic_counted_bytes"] == _predicted(c, m)
    whole = Mapping((FusionGroup(c.einsum_names),), c.name)
    assert verify(c, whole)["ok"], text


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(cascades())
def test_random_cascades_unfused(text: str) -> None:
    _check_random(text)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(cascades())
def test_random_cascades_exhaustive(text: str) -> None:
    _check_random(text)


# ---- the blocked fused scan ----------------------------------------------

#: Mamba-1's scan fused with its element-wise producers and readout (the benchmark's grouping).
MAMBA1_SCAN_GROUPS = [["X0", "Z"], ["XC", "X"], ["DTR", "BM", "CM"], ["DT0", "DT"], ["A"],
                      ["DA", "BX", "H", "SY", "HF"], ["Y", "G", "OUT"], ["CSF"]]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_blocked_scan_matches_reference_and_cost_model(dtype: str) -> None:
    """Enough channels that the scan runs them in blocks (two full, one partial), blocks innermost:
    the state in the blocked layout, A staged per block, the readout summed row by row."""
    from mambalaya.exec.codegen import SCAN_BLOCK, group_source, plan_group

    c = open_cascade("mamba1").with_params(seqlen=11, d_model=40, d_state=4, dt_rank=3, batch=2)
    assert 2 * SCAN_BLOCK < c.values["D"] < 3 * SCAN_BLOCK
    m = Mapping(tuple(FusionGroup(tuple(g)) for g in MAMBA1_SCAN_GROUPS), c.name)
    gi = [g.einsums for g in m.groups].index(("DA", "BX", "H", "SY", "HF"))
    source = group_source(c, m.groups[gi], plan_group(c, [tuple(g.einsums) for g in m.groups], gi, m), dtype)
    assert "staged in the state's layout" in source and "lo_d = max(" in source
    r = verify(c, m, dtype=dtype)
    assert r["ok"], r
    assert r["traffic_counted_bytes"] == _predicted(c, m)
