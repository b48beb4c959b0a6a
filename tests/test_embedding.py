"""Embedding: a code that calls hpcring on NumPy arrays pays for no optional dependency.

``import hpcring`` and its calls load ml_dtypes (bfloat16), torch, jax, cupy and matplotlib only
where an argument needs them: ml_dtypes 0.7's extension module alone takes about half a second
to load, which a simulation code that never touches bfloat16 would pay at its first call.
Each case runs in a fresh interpreter (a singleton MPI process), since this one has loaded them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

OPTIONAL = ("ml_dtypes", "torch", "jax", "cupy", "matplotlib")

CALLS = {
    "allreduce": "hpcring.allreduce(numpy.ones(4))",
    "every collective": (
        "x = numpy.ones(6); hpcring.allreduce(x, op='max', algorithm='ring'); hpcring.reduce_scatter(x);"
        " hpcring.allgather(x); hpcring.broadcast(x); hpcring.iallreduce(x).wait(); hpcring.alltoall(x)"
    ),
    "plan": "p = hpcring.plan(numpy.ones(4, numpy.float32)); p(); p()",
    "drop-in": (
        "from mpi4py import MPI; c = hpcring.Intracomm(MPI.COMM_WORLD); y = numpy.ones(3);"
        " c.Allreduce(MPI.IN_PLACE, y, op=MPI.SUM); c.allreduce(2.0)"
    ),
    "reproducible and ExactSum": (
        "x = numpy.ones(5); hpcring.allreduce(x, reproducible=True);"
        " a = hpcring.ExactSum(like=x); a.add(x); a.allreduce()"
    ),
    "info": "hpcring.info()",
    # what the training example loads for --elastic (growth's state transfer took ml_dtypes once)
    "elastic": "import hpcring.elastic, hpcring.growth",
    # the entry points users launch on every rank: each loaded ml_dtypes or CuPy at import once
    "bench and examples": (
        "import hpcring.bench.cli, hpcring.examples.train, hpcring.examples.zero, hpcring.jobenv"
    ),
}


def loaded_after(code: str, names: tuple[str, ...] = OPTIONAL) -> list[str]:
    """The modules of ``names`` in sys.modules after ``code`` ran in a fresh interpreter."""
    listed = f"print(' '.join(m for m in {names!r} if m in sys.modules))"
    script = f"import sys, numpy, hpcring\n{code}\n{listed}\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_"))}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


@pytest.mark.parametrize("name", list(CALLS))
def test_numpy_calls_load_no_optional_dependency(name: str) -> None:
    expected: list[str] = []
    if name == "info" and importlib.util.find_spec("cupy") is not None:
        expected = loaded_after("import cupy")  # info() reports the GPU: CuPy, and what it loads itself
    assert loaded_after(CALLS[name]) == expected


def test_bfloat16_loads_ml_dtypes_when_it_is_needed() -> None:
    """The other side of the same rule: wire= and a bfloat16 array load it (and work)."""
    wire = "hpcring.allreduce(numpy.ones(8, numpy.float32), algorithm='ring', wire='bfloat16')"
    assert loaded_after(wire) == ["ml_dtypes"]
    array = "import ml_dtypes; x = numpy.ones(4, ml_dtypes.bfloat16); hpcring.allreduce(x); assert x[0] == 1"
    assert loaded_after(array) == ["ml_dtypes"]


# hpcring's own modules that only some calls need: a plain all-reduce loads none of them
ONLY_WHERE_NEEDED = (
    "hpcring.wire",  # wire=
    "hpcring.exact",  # reproducible=True
    "hpcring.exchange",  # the all-to-all
    "hpcring.persistent",  # hpcring.plan
    "hpcring.nonblocking",  # hpcring.iallreduce and friends
    "hpcring.bench",
    "hpcring.model",
)


def test_a_plain_all_reduce_loads_only_what_it_runs() -> None:
    assert loaded_after("hpcring.allreduce(numpy.ones(4))", ONLY_WHERE_NEEDED) == []
