"""The sharded (ZeRO) example: the ring's two phases with Adam on each rank's shard between them.
Serial tests that launch the example as a user does (skipped without scikit-learn)."""

from __future__ import annotations

import re

import pytest
from helpers import mpiexec, run_example

pytestmark = [
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec"),
    pytest.mark.timeout(600),
]


@pytest.fixture(autouse=True)
def _needs_sklearn() -> None:
    pytest.importorskip("sklearn", reason="needs scikit-learn: pip install -e '.[train]' in hpcring's clone")


def test_digits_accuracy_with_a_half_of_the_optimizer_state_per_rank() -> None:
    lines = run_example("zero", "--epochs", "6", ranks=2)
    state = next(line for line in lines if line.startswith("# optimizer state per rank"))
    held, full = (int(n.replace(",", "")) for n in re.findall(r"([\d,]+) (?:bytes|for)", state))
    assert held * 2 == full, state  # 1/G of the all-reduce version's Adam moments, G = 2
    accuracy = float(re.search(r"final test accuracy ([\d.]+)%", "\n".join(lines))[1])
    assert accuracy >= 95.0, lines


def test_reproducible_weights_at_one_to_four_ranks() -> None:
    digests = set()
    for ranks in (1, 2, 3, 4):
        lines = run_example("zero", "--reproducible", "--max-steps", "6", ranks=ranks)
        digests |= {line for line in lines if line.startswith("# weights digest")}
    assert len(digests) == 1, digests
