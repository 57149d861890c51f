"""A run too large for the machine is refused with its figure before anything is allocated."""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.cli import main
from mambalaya.errors import MambalayaError
from mambalaya.exec.reference import check_memory, execution_bytes, random_inputs, run_reference
from mambalaya.parse import open_cascade


@pytest.mark.timeout(60)
def test_a_rank_of_a_trillion_is_refused_with_the_figure(capsys):
    """Before: a 7.3 TiB MemoryError traceback from the reference's inputs."""
    assert main(["verify", "mlp2", "--set", "M=1000000000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs about" in err and "m=1000000000000" in err and "--max-memory" in err


def test_the_limit_can_be_lowered_and_raised(capsys):
    assert main(["verify", "mlp2", "--max-memory", "0.00001"]) == 2
    assert "the limit is" in capsys.readouterr().err
    assert main(["verify", "mlp2", "--max-memory", "1"]) == 0


def test_the_estimate_covers_what_the_reference_keeps():
    """Every tensor the reference returns (it keeps them all, in float64) is inside the estimate."""
    c = open_cascade("mamba2")
    env = run_reference(c, random_inputs(c), "float64")
    kept = sum(a.nbytes for a in env.values() if isinstance(a, np.ndarray))
    assert kept <= execution_bytes(c, "float64")
    with pytest.raises(MambalayaError, match="needs about"):
        check_memory(c, "float64", kept - 1)


def test_every_executor_checks_memory_before_it_allocates(tmp_path, monkeypatch):
    """``run`` and ``generate`` size their cascades from the input and the prompt: hidden states of a billion
    tokens (a zero-stride view: nothing allocated yet), or a prompt on a machine of 1 MiB, are refused with their
    figure before a buffer or a weight is touched (the backends' estimate: no reference beside them)."""
    import mambalaya.exec.reference as reference
    from mambalaya.exec.generate import load_generator
    from mambalaya.exec.random_model import write_random_model
    from mambalaya.exec.realweights import run_layer

    config, weights = write_random_model(tmp_path, "mamba-130m", layers=1, vocab_size=64, hidden_size=16,
                                         intermediate_size=32, time_step_rank=2, state_size=4)
    with pytest.raises(MambalayaError, match="needs about"):
        run_layer(config, weights, np.broadcast_to(np.zeros(16, np.float32), (1, 10**9, 16)), layer=0)
    gen = load_generator(config, weights, "cpu", "numba")
    monkeypatch.setattr(reference, "physical_memory_bytes", lambda: 2**20)
    with pytest.raises(MambalayaError, match="needs about"):
        gen.stage("prefill", 4096)
    c = open_cascade("mlp2")
    assert execution_bytes(c, "float32", reference=False) < execution_bytes(c, "float32")


def test_weights_are_scaled_by_their_fan_in_so_outputs_stay_near_one():
    """Standard-normal weights sent a mamba-130m layer's output to 1.3e16 (float64 verify then compared absolute
    errors of 1e-4 and nothing small); scaled like a trained layer's they stay within a hundred."""
    from mambalaya.exec.reference import fan_in

    c = open_cascade("mlp2")
    ins = random_inputs(c, seed=3)
    for w in ("W1", "W2"):
        reduced = [r for r in c.einsum(c.consumers(w)[0]).reduced_ranks]
        assert fan_in(c, w) == int(np.prod([c.rank_size(r) for r in reduced]))
        assert abs(ins[w].std() * np.sqrt(fan_in(c, w)) - 1) < 0.2
    c = open_cascade("mamba1", model="mamba-130m", params={"seqlen": 64})
    out = run_reference(c, random_inputs(c), keep="outputs")
    assert max(float(np.max(np.abs(v))) for v in out.values()) < 100
