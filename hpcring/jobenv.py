"""`python -m hpcring.jobenv`: a job's pre-flight check and the record of what it ran with.

Run it through the same launcher as the real work (the SLURM templates do). Every rank
selects its GPU the way the benchmark does; rank 0 writes one JSON file with
`hpcring.info()`, the full MPI library version, the node list, each rank's host,
node-local rank and device, and the environment variables that change how MPI, UCX,
CUDA and SLURM behave, so a run can be compared with another one later.

With ``--expect N`` it fails (exit 1, on every rank) unless the world has N ranks: a
launcher without the right MPI plugin (``srun --mpi=pmi2`` with Open MPI 5, or srun with
none) exits 0 while starting N separate worlds of size 1, and an hour-long job should not
find that out at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

from mpi4py import MPI

import hpcring
from hpcring.gpu import node_local_rank, select_device

# Variables that decide transports, placement and devices: worth keeping with every result.
_PREFIXES = (
    "HPCRING_",
    "SLURM_",
    "OMPI_",
    "PRTE_",
    "PMIX_",
    "UCX_",
    "FI_",
    "MPICH_",
    "MPIR_CVAR_",
    "HYDRA_",
    "I_MPI_",
    "CUDA_",
    "NCCL_",
)
_NOISE = ("SLURM_JOB_CPUS", "SLURM_CPU_BIND", "PMIX_SERVER_URI", "PMIX_SECURITY")


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in ("numpy", "cupy", "matplotlib"):
        try:
            found[name] = __import__(name).__version__
        except Exception:  # absent, or a CUDA library that fails to load
            continue
    return found


def record(comm: MPI.Intracomm, expect: int | None) -> tuple[dict[str, Any] | None, str | None]:
    """Collective. Rank 0 gets (the record, a problem or None); other ranks get (None, problem)."""
    device = select_device(comm)
    me = {
        "rank": comm.Get_rank(),
        "host": MPI.Get_processor_name(),
        "local_rank": node_local_rank(comm),
        "device": "cpu" if device is None else f"gpu {device}",
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "slurm_localid": os.environ.get("SLURM_LOCALID"),
    }
    ranks = comm.gather(me)
    size = comm.Get_size()
    problem = None
    if expect is not None and size != expect:
        problem = (
            f"hpcring.jobenv: the launcher started a world of {size} rank(s), expected {expect}; "
            "1 means separate singletons: launch with srun --mpi=pmix (or mpirun) and an MPI "
            "built with PMIx support"
        )
    if comm.Get_rank() != 0:
        return None, problem
    env = {
        k: v for k, v in sorted(os.environ.items()) if k.startswith(_PREFIXES) and not k.startswith(_NOISE)
    }
    return {
        "world_size": size,
        "expected_ranks": expect,
        "hosts": sorted({r["host"] for r in ranks}),
        "nodelist": os.environ.get("SLURM_JOB_NODELIST"),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "info": hpcring.info(),
        "mpi_library_version": MPI.Get_library_version().strip("\x00 \n"),
        "versions": _versions(),
        "ranks": ranks,
        "environment": env,
    }, problem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcring.jobenv", description=__doc__.splitlines()[0])
    parser.add_argument("--expect", type=int, metavar="N", help="fail unless the world has N ranks")
    parser.add_argument("--json", metavar="FILE", help="where rank 0 writes the record")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    facts, problem = record(comm, args.expect)
    if facts is not None:
        if args.json:
            with open(args.json, "w") as stream:
                json.dump(facts, stream, indent=1)
        devices = sorted({r["device"] for r in facts["ranks"]})
        print(
            f"hpcring.jobenv: {facts['world_size']} rank(s) on {len(facts['hosts'])} host(s) "
            f"[{facts['nodelist'] or ', '.join(facts['hosts'])}]; devices {', '.join(devices)}; "
            f"{facts['info']['mpi_library']}; CUDA-aware {facts['info']['cuda_aware']}",
            flush=True,
        )
    if problem:
        if comm.Get_rank() == 0:
            print(problem, file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
