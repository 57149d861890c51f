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
