"""The digits example with ``--reproducible`` ends with the same weights digest at 1, 2, 3 and 4
ranks; without it, the digests differ (each rank's gradient is one matmul over its share of the
batch). A serial test: the one-rank runs are in this process, the others launched, a few steps
each."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import mpiexec, run_example
from mpi4py import MPI

from hpcring.examples import train

STEPS = ["--epochs", "1", "--max-steps", "4", "--width", "32"]


def digest(ranks: int, *flags: str) -> str:
    if ranks == 1:  # the same run in this process: one launch less
        exact = "--reproducible" in flags
        result = train.train(MPI.COMM_SELF, epochs=1, max_steps=4, width=32, reproducible=exact)
        return train._digest(result.params, np)
    output = run_example("train", *STEPS, *flags, ranks=ranks, timeout=120)
    lines = [line for line in output if line.startswith("# weights digest ")]
    assert len(lines) == 1, output
    return lines[0].split()[-1]


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
def test_reproducible_training_gives_one_digest_at_any_rank_count() -> None:
    digests = {ranks: digest(ranks, "--reproducible") for ranks in (1, 2, 3, 4)}
    assert len(set(digests.values())) == 1, digests
    plain = {ranks: digest(ranks, "--digest") for ranks in (1, 2)}
    assert plain[1] != plain[2], "without --reproducible the rank count shows in the weights"
