"""PyTorch's own distributed tests, run with backend="hpcring": 35 bodies of
``torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase`` (point to
point, the rooted collectives, the all-to-alls, and control rows hpcring ran before), in this
process, under mpiexec, at 2 ranks and more (tests/run.sh runs the MPI tests at 1 to 4).

This is how PyTorch ran its MPI backend (test_distributed_fork.py) and how torch_ucc ran its
plugin: ``BACKEND`` and ``WORLD_SIZE`` set before the module is imported, the backend's name
added to ``DistTestCases.backend_feature["plugin"]``, the default group initialised once, and
the bodies called on a ``common_utils.TestCase`` that mixes in ``_DistTestBase``, whose file
barrier finds ``TEMP_DIR/barrier`` (made empty by rank 0, before any rank uses it). Bodies that
PyTorch gates by backend name alone (the CPU all-to-alls run only for "mpi", the batch
point-to-point ones only for "gloo") are called through their helpers, as those backends run
them; a body that skips by ``sys.exit`` (``skip_if_small_worldsize`` and friends) is a skip.
After each body the ranks agree on its verdict, so a failure on one rank fails it on all and
none hangs in the next.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import everywhere
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install -e '.[torch]' in hpcring's clone")
import torch.distributed as dist  # noqa: E402

import hpcring.torch  # noqa: E402
from hpcring.torch.backend import NAME  # noqa: E402

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD

POINT_TO_POINT = [
    "send_recv",
    "send_recv_with_tag",
    "isend",
    "irecv",
    "send_recv_any_source",
    "batch_isend_irecv_gloo",
    "batch_isend_irecv_gloo_tags",
]
ROOTED = [
    "gather",
    "gather_checks",
    "gather_full_group",
    "scatter",
    "scatter_checks",
    "scatter_complex",
    "scatter_full_group",
    "reduce_sum",
    "reduce_product",
    "reduce_min",
    "reduce_max",
    "reduce_full_group_sum",
    "reduce_sum_twice",
]
ALL_TO_ALL = [
    "all_to_all",
    "all_to_all_complex",
    "all_to_all_full_group",
    "all_to_all_single_equal_split",
    "all_to_all_single_unequal_split",
    "all_to_all_single_equal_split_complex",
    "all_to_all_single_unequal_split_complex",
    "all_to_all_single_equal_split_full_group",
]
CONTROL = [
    "barrier",
    "barrier_full_group",
    "broadcast",
    "all_reduce_sum",
    "all_reduce_max",
    "all_gather",
    "all_gather_full_group",
]
BODIES = POINT_TO_POINT + ROOTED + ALL_TO_ALL + CONTROL


def _gated() -> dict[str, Callable[[Any], None]]:
    """The bodies PyTorch runs only for another backend's name, called as those backends run them:
    the all-to-alls through their helpers (the "mpi" rows), the batch ones as they are (their
    only gate is the name, an attribute unittest reads: calling the body runs it)."""
    cfloat = torch.cfloat

    def run(helper: str, init: str, **kwargs: Any) -> Callable[[Any], None]:
        return lambda case: getattr(case, helper)(*getattr(case, init)(), **kwargs)

    return {
        "all_to_all": run("_test_all_to_all_helper", "_init_global_test"),
        "all_to_all_complex": run("_test_all_to_all_helper", "_init_global_test", dtype=cfloat),
        "all_to_all_full_group": run("_test_all_to_all_helper", "_init_full_group_test"),
        "all_to_all_single_equal_split": run(
            "_test_all_to_all_single_equal_split_helper", "_init_global_test"
        ),
        "all_to_all_single_unequal_split": run(
            "_test_all_to_all_single_unequal_split_helper", "_init_global_test"
        ),
        "all_to_all_single_equal_split_complex": run(
            "_test_all_to_all_single_equal_split_helper", "_init_global_test", dtype=cfloat
        ),
        "all_to_all_single_unequal_split_complex": run(
            "_test_all_to_all_single_unequal_split_helper", "_init_global_test", dtype=cfloat
        ),
        "all_to_all_single_equal_split_full_group": run(
            "_test_all_to_all_single_equal_split_helper", "_init_full_group_test"
        ),
        "batch_isend_irecv_gloo": lambda case: case.test_batch_isend_irecv_gloo(),
        "batch_isend_irecv_gloo_tags": lambda case: case.test_batch_isend_irecv_gloo_tags(),
    }


@pytest.fixture(scope="module")
def suite() -> Iterator[tuple[type, dict[str, Callable[[Any], None]], dict[int, str]]]:
    """The TestCase class of the bodies, the gated ones' wrappers, and the skip exit codes; the
    default group is hpcring's for the module's whole run."""
    if WORLD.size == 1:
        pytest.skip("PyTorch's distributed bodies run on 2 ranks or more")
    temp = WORLD.bcast(tempfile.mkdtemp(prefix="hpcring-torch-suite-") if WORLD.rank == 0 else None)
    if WORLD.rank == 0:
        os.makedirs(os.path.join(temp, "barrier"))
    WORLD.Barrier()  # the barrier folder exists, empty, before any rank writes to it
    saved = {key: os.environ.get(key) for key in ("BACKEND", "WORLD_SIZE", "TEMP_DIR")}
    os.environ.update(BACKEND=NAME, WORLD_SIZE=str(WORLD.size), TEMP_DIR=temp)
    from torch.testing._internal.common_distributed import TEST_SKIPS, DistTestCases

    DistTestCases.backend_feature["plugin"].add(NAME)
    from torch.testing._internal.common_utils import TestCase
    from torch.testing._internal.distributed import distributed_test

    class Bodies(TestCase, distributed_test.DistributedTest._DistTestBase):  # type: ignore[misc, name-defined]
        """PyTorch's bodies on the default group, hpcring's."""

    hpcring.torch.init_process_group("hpcring", timeout=60)
    distributed_test.Barrier.barrier_id = 0
    skips = {skip.exit_code: skip.message for skip in TEST_SKIPS.values()}
    yield Bodies, _gated(), skips
    dist.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    WORLD.Barrier()
    if WORLD.rank == 0:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("body", BODIES)
def test_pytorch_body(
    suite: tuple[type, dict[str, Callable[[Any], None]], dict[int, str]], body: str
) -> None:
    bodies, gated, skips = suite
    case = bodies(f"test_{body}")
    method = getattr(case, f"test_{body}")
    skipped = None
    error: BaseException | None = None
    case.setUp()
    try:
        if body in gated:
            gated[body](case)
        elif getattr(method, "__unittest_skip__", False):
            skipped = f"PyTorch skips it for {dist.get_backend()}: {method.__unittest_skip_why__}"
        else:
            method()
    except SystemExit as exit:  # skip_if_small_worldsize and friends
        skipped = skips.get(exit.code, f"exit {exit.code}")  # type: ignore[arg-type]
    except BaseException as failed:
        error = failed
    finally:
        case.tearDown()
    passed = everywhere(WORLD, error is None)
    if error is not None:
        raise error
    assert passed, "the body failed on another rank"
    if skipped is not None:
        pytest.skip(skipped)
