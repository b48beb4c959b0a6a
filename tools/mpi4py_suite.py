"""mpi4py's own tests with the communicators they test wrapped in hpcring.Intracomm.

    git clone --branch "$(python -c 'import mpi4py; print(mpi4py.__version__)')" --depth 1 \\
        https://github.com/mpi4py/mpi4py /tmp/mpi4py
    mpiexec -n 3 python tools/mpi4py_suite.py /tmp/mpi4py/test
    mpiexec -n 2 python tools/mpi4py_suite.py /tmp/mpi4py/test --algorithm ring test_cco_nb_buf

The test files of the installed mpi4py's version (the default list: the collective, the
communicator and the op tests) are imported from ``TESTS``; in each, every ``MPI.COMM_WORLD`` and
``MPI.COMM_SELF`` the tests reach (their ``COMM`` class attributes, what their ``setUp`` sets,
``MPI.COMM_WORLD`` inside a test body, and so every ``Dup``/``Split``... of them) is a
`hpcring.Intracomm` with the options given, and the tests run with unittest. Each rank prints its
counts (and every failure, in full, once); the exit status is 1 where a test failed on any rank.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types
import unittest
from pathlib import Path
from typing import Any

from mpi4py import MPI

import hpcring

SUITE = ["test_cco_buf", "test_cco_nb_buf", "test_cco_pr_buf", "test_cco_obj", "test_comm", "test_op"]


class WrappedMPI(types.ModuleType):
    """``mpi4py.MPI`` as a test module sees it: COMM_WORLD and COMM_SELF wrapped, the rest MPI's."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__("mpi4py.MPI")
        self.COMM_WORLD = hpcring.Intracomm(MPI.COMM_WORLD, **options)
        self.COMM_SELF = hpcring.Intracomm(MPI.COMM_SELF, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(MPI, name)


def wrap_module(module: types.ModuleType, mpi: WrappedMPI, options: dict[str, Any]) -> int:
    """Point ``module``'s tests at wrapped communicators; how many test classes were changed."""
    module.MPI = mpi  # type: ignore[attr-defined]
    changed = 0
    for value in vars(module).values():
        if not (isinstance(value, type) and issubclass(value, unittest.TestCase)):
            continue
        comm = value.__dict__.get("COMM")
        if (
            isinstance(comm, MPI.Intracomm)
            and comm != MPI.COMM_NULL
            and not isinstance(comm, hpcring.Intracomm)
        ):
            value.COMM = hpcring.Intracomm(value.__dict__["COMM"], **options)
            changed += 1
        if "setUp" in value.__dict__:
            value.setUp = _wrapping(value.__dict__["setUp"], options)
            changed += 1
    return changed


def _unwrapped(comm: Any) -> bool:
    """Whether ``comm`` is an intracommunicator the wrapper should take (not yet wrapped)."""
    plain = isinstance(comm, MPI.Intracomm) and not isinstance(comm, hpcring.Intracomm)
    return plain and comm != MPI.COMM_NULL


def _wrapping(setup: Any, options: dict[str, Any]) -> Any:
    def setUp(self: unittest.TestCase) -> None:
        setup(self)
        comm = getattr(self, "COMM", None)
        if _unwrapped(comm):
            self.COMM = hpcring.Intracomm(comm, **options)

    return setUp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", type=Path, help="mpi4py's test/ folder, of the installed version")
    parser.add_argument("modules", nargs="*", default=SUITE, help=f"test files (default: {' '.join(SUITE)})")
    parser.add_argument("--algorithm", default="mpi", help="hpcring.Intracomm(algorithm=...)")
    parser.add_argument("--no-check", action="store_true", help="hpcring.Intracomm(check=False)")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per test (rank 0)")
    args = parser.parse_args(argv)
    options = {"algorithm": args.algorithm, "check": not args.no_check}
    sys.path.insert(0, str(args.tests))
    mpi = WrappedMPI(options)
    world = MPI.COMM_WORLD
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for name in args.modules:
        module = importlib.import_module(name)
        wrap_module(module, mpi, options)
        suite.addTests(loader.loadTestsFromModule(module))
    stream = sys.stderr if world.rank == 0 and args.verbose else open("/dev/null", "w")  # noqa: SIM115
    result = unittest.TextTestRunner(stream=stream, verbosity=2 if args.verbose else 0).run(suite)
    lines = [
        f"rank {world.rank}/{world.size}: {result.testsRun} run, {len(result.failures)} failed, "
        f"{len(result.errors)} errors, {len(result.skipped)} skipped "
        f"(mpi4py {importlib.import_module('mpi4py').__version__}, hpcring.Intracomm({options}))"
    ]
    for test, trace in result.failures + result.errors:
        lines.append(f"--- rank {world.rank}: {test.id()}\n{trace}")
    reports = world.gather("\n".join(lines), root=0)
    if world.rank == 0:
        print("\n".join(reports), flush=True)
    bad = world.allreduce(int(not result.wasSuccessful()), op=MPI.MAX)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
