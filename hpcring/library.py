"""The MPI library this process runs on, named one way wherever a report names it (`hpcring.info`,
the bench header, the calibration, a job's environment record)."""

from __future__ import annotations

from mpi4py import MPI


def mpi_library() -> str:
    """The MPI library's name and version, from the first line of its version string: "Open MPI
    v5.0.11" as Open MPI writes it, "MPICH 5.0.2" for MPICH's "MPICH Version:      5.0.2"."""
    first = MPI.Get_library_version().strip("\x00 \n").splitlines()[0].split(",")[0]
    return " ".join(first.replace("Version:", " ").split())


__all__ = ["mpi_library"]
