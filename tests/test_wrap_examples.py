"""The cg and nbody examples at 2 ranks, with and without ``--hpcring``: the same result line, bit
for bit (algorithm mpi underneath), a time line and a first-call line each. A serial test: it
launches the jobs itself (as the bench's command-line tests do)."""

from __future__ import annotations

import pytest
from helpers import mpiexec, run_example

EXAMPLES = {
    "cg": ["--rows", "50", "--repeat", "1"],
    "nbody": ["--steps", "200"],
}


def run(example: str, *flags: str) -> list[str]:
    return run_example(example, *EXAMPLES[example], *flags, timeout=120)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_prints_the_same_result_with_and_without_hpcring(example: str) -> None:
    plain, wrapped = run(example), run(example, "--hpcring")
    assert len(plain) == len(wrapped) == 3, (plain, wrapped)
    assert plain[0].startswith(f"{example}: ") and " on 2 ranks" in plain[0]
    assert plain[0] == wrapped[0]
    assert plain[1].startswith("time: ") and plain[1].endswith("via MPI")
    assert wrapped[1].startswith("time: ") and wrapped[1].endswith("via hpcring.Intracomm (algorithm mpi)")
    assert plain[2].startswith("first call: ") and plain[2].endswith("(MPI's first Allreduce)")
    assert wrapped[2].startswith("first call: ") and "hpcring.Intracomm" in wrapped[2]
