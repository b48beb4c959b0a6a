"""`python -m hpcring.bench`: the nccl-tests-style benchmark of every algorithm side by side.

One driver owns arguments, warm-up, timing, checking and the table (as nccl-tests'
``common.cu`` does); what is specific to a collective (``--collective``: all-reduce,
reduce-scatter, all-gather, broadcast) is its small description in `collectives`, and what is
specific to an algorithm is its own formula (`expected_bytes_sent` asks its Spec). Time is
taken per iteration on every rank, the max over ranks of each iteration is what a synchronous
training step would wait for, and a row reports the median of those maxima. Bytes sent are
*measured* by the Channel (what hpcring hands to MPI) and printed beside the textbook formula,
so a disagreement is visible. With ``-c 1`` (the default) inputs are small integers whose
reduction is exact in every dtype and summation order, so every element can be compared
exactly; any wrong element makes the exit status 1, so a batch job fails loudly. Every size
also has a row for the bare library call (``MPI_Allreduce``: mpi4py's ``comm.Allreduce`` on the
same buffers, nothing of hpcring between; ``MPI_Reduce_scatter``, ``MPI_Allgather``,
``MPI_Bcast`` for the other collectives), the yardstick the footer reads every row against.

The parts, one concern each:

- `cli`: the flags, usage errors agreed by every rank, and `main`, the driver;
- `startup`: the first call's cost, measured before the rest is imported;
- `steploop`: a step loop of small all-reduces, one rank late per step, quiet and beside busy
  processes (``--step-loop``);
- `collectives`: per collective, its data and exact result, its buffers, the front end timed
  and the bare library call (nccl-tests' small contract per collective);
- `data`: the sizes swept, the verifiable inputs, their exact results and bytes sent;
- `measure`: the device (NumPy or CuPy), one row's timing (the bare call's too), the run's facts, the
  yardsticks (copy bandwidths) and the cost model's column;
- `report`: header, table rows, footer, the ceiling line, progress, plot and JSON.

The tuning file that ``--tune`` writes is `hpcring.algorithms.tuning`, beside its reader.
"""

from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None, **kwargs: Any) -> int:
    """`hpcring.bench.cli.main` (imported now: ``python -m hpcring.bench`` measures the first
    call before anything of hpcring's engine is loaded)."""
    from .cli import main as run

    return run(argv, **kwargs)
