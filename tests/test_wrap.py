"""hpcring.Intracomm, the drop-in communicator, and mpi4py's ops in hpcring.allreduce.

Written once, valid at any rank count. With algorithm ``mpi`` underneath, every routed call must
give the bits `MPI.COMM_WORLD.Allreduce` gives on the same data (where the data rides in the
agreement's exchange on 3-4 ranks, the bits of the exchange's grouping, computed from every
rank's data: `helpers.exchange_grouping`); the other algorithms get small
integers, exact in any order, checked against the exact reduction. A spy on the wrapper's road
(`hpcring.wrap.route`) tells the calls hpcring took from the ones passed to MPI.
"""

from __future__ import annotations

import array
from typing import Any

import numpy as np
import pytest
from helpers import everywhere, exchange_grouping, identical_everywhere, open_mpi, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring import wrap

pytestmark = pytest.mark.mpi

OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}
UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
DTYPES = [np.float64, np.float32, np.int32, np.int64, np.complex128]


def wrapped(algorithm: str = "mpi") -> wrap.Intracomm:
    return hpcring.Intracomm(MPI.COMM_WORLD, algorithm=algorithm)


def random_input(n: int, dtype: Any, op: str) -> np.ndarray:
    """Inexact data (floats that round differently in each order), different on each rank."""
    rng = np.random.default_rng(1 + MPI.COMM_WORLD.rank)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        values = rng.integers(1, 4, n) if op == "prod" else rng.integers(-1000, 1000, n)
        return values.astype(dtype)
    values = rng.uniform(0.5, 1.5, n) if op == "prod" else rng.standard_normal(n)
    if dtype.kind == "c":
        values = values + 1j * rng.standard_normal(n)
    return values.astype(dtype)


def small_input(rank: int, n: int, dtype: Any, op: str) -> np.ndarray:
    """Small integers, exact in every dtype and every order of reduction."""
    i = np.arange(n)
    if op == "prod":
        values = 1 + (i + rank) % 2
    elif op in ("max", "min"):
        values = (7 * i + 3 * rank) % 11 - 5
    else:
        values = i % 5 + rank + 1
    return np.asarray(values, dtype=dtype)


def exact(n: int, dtype: Any, op: str) -> np.ndarray:
    size = MPI.COMM_WORLD.size
    if op == "sum":  # the closed form
        return np.asarray(size * (np.arange(n) % 5) + size * (size + 1) // 2, dtype=dtype)
    total = small_input(0, n, dtype, op)
    for rank in range(1, size):
        total = UFUNCS[op](total, small_input(rank, n, dtype, op))
    return total


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def applies(op: str, dtype: Any) -> bool:
    return not (op in ("max", "min") and np.dtype(dtype).kind == "c")


# --- every op, bitwise against MPI with algorithm mpi --------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_every_op_gives_mpis_bits(routed: list[str], op: str, dtype: Any, n: int) -> None:
    if not applies(op, dtype):
        pytest.skip("MPI has no order on complex numbers")
    comm, world = wrapped(), MPI.COMM_WORLD
    send = random_input(n, dtype, op)
    ours, theirs = np.full_like(send, 7), np.full_like(send, 7)
    comm.Allreduce(send, ours, op=OPS[op])
    world.Allreduce(send, theirs, op=OPS[op])
    in_place, reference = send.copy(), send.copy()
    comm.Allreduce(MPI.IN_PLACE, in_place, op=OPS[op])
    world.Allreduce(MPI.IN_PLACE, reference, op=OPS[op])
    grouped = exchange_grouping(world, send, op)
    if grouped is not None:  # it rode in the agreement's exchange (3-4 ranks): grouped as that groups it
        theirs = reference = grouped
    assert everywhere(world, same_bits(ours, theirs) and same_bits(in_place, reference))
    assert everywhere(world, routed == [op, op])
    assert identical_everywhere(world, ours)


@pytest.mark.parametrize("algorithm", [a for a in hpcring.ALGORITHMS if a != "mpi"])
@pytest.mark.parametrize("op", OPS)
def test_other_algorithms_exact(routed: list[str], algorithm: str, op: str) -> None:
    comm, world = wrapped(algorithm), MPI.COMM_WORLD
    for dtype in (np.int32, np.int64, np.float64):
        for n in (0, 1, world.size + 1, 1000):
            send = small_input(world.rank, n, dtype, op)
            out = np.empty_like(send)
            comm.Allreduce(send, out, op=OPS[op])
            inplace = send.copy()
            comm.Allreduce(MPI.IN_PLACE, inplace, op=OPS[op])
            want = exact(n, dtype, op)
            assert everywhere(world, same_bits(out, want) and same_bits(inplace, want)), (dtype, n)
    assert everywhere(world, len(routed) == 24)


# --- buffer specs ----------------------------------------------------------------------------------


def specs(buf: np.ndarray) -> dict[str, Any]:
    """One double buffer in each of the forms mpi4py takes (the receive side, in place)."""
    return {
        "array": buf,
        "[buf, type]": [buf, MPI.DOUBLE],
        "[buf, count, type]": [buf, 5, MPI.DOUBLE],
        "(buf, count, type)": (buf, 5, MPI.DOUBLE),
        "[buf, count]": [buf, 6],
        "[buf, (count, displ), type]": [buf, (4, 3), MPI.DOUBLE],
        "[buf, count, displ, type]": [buf, 4, 2, MPI.DOUBLE],
        "[buf, typecode]": [buf, "d"],
        "[buf, MPI.DOUBLE_PRECISION]": [buf, MPI.DOUBLE_PRECISION],
    }


@pytest.mark.parametrize("name", list(specs(np.empty(0))))
def test_buffer_specs(routed: list[str], name: str) -> None:
    world = MPI.COMM_WORLD
    send = random_input(10, np.float64, "sum")
    ours, theirs = send.copy(), send.copy()
    wrapped().Allreduce(MPI.IN_PLACE, specs(ours)[name], op=MPI.SUM)
    world.Allreduce(MPI.IN_PLACE, specs(theirs)[name], op=MPI.SUM)
    assert everywhere(world, same_bits(ours, theirs))  # elements outside count untouched as well
    assert everywhere(world, routed == ["sum"])


def test_out_of_place_specs_and_layouts(routed: list[str]) -> None:
    world, comm = MPI.COMM_WORLD, wrapped()
    send = random_input(12, np.float64, "sum")
    cases = {
        "2-D C": (send.reshape(3, 4), lambda: np.zeros((3, 4))),
        "2-D Fortran": (np.asfortranarray(send.reshape(3, 4)), lambda: np.zeros((3, 4), order="F")),
        "typed spec": ([send, 12, MPI.DOUBLE], lambda: np.zeros(12)),
        "array.array": (array.array("d", send.tolist()), lambda: array.array("d", [0.0] * 12)),
        "bytearray as doubles": ([bytearray(send.tobytes()), MPI.DOUBLE], lambda: np.zeros(12)),
        "read-only send": (np.frombuffer(send.tobytes(), dtype=np.float64), lambda: np.zeros(12)),
        "floats seen as ints": ([send.view(np.int32), MPI.INT], lambda: np.zeros(24, np.int32)),
    }
    for name, (sendbuf, make) in cases.items():
        ours, theirs = make(), make()
        comm.Allreduce(sendbuf, ours, op=MPI.SUM)
        world.Allreduce(sendbuf, theirs, op=MPI.SUM)
        assert everywhere(world, bytes(memoryview(ours)) == bytes(memoryview(theirs))), name
    assert everywhere(world, len(routed) == len(cases))


def outcome(call: Any, buf: np.ndarray) -> tuple[str, bytes]:
    """What a call did: its exception's type, or the bytes it left in ``buf``."""
    try:
        call()
    except Exception as error:
        return type(error).__name__, b""
    return "", buf.tobytes()


def test_aliased_buffers_do_what_mpi_does(routed: list[str]) -> None:
    """Send and receive buffers that overlap: MPI's business (an error, or in place in newer mpi4py).

    Shift 0 (counts 9 and 8) is mpi4py's error on any MPI. Shift 1 (the same count, one element
    apart) Open MPI reduces, so its bytes are compared here; MPICH asserts and aborts the job,
    which tests/test_wrap_aliased.py checks in jobs of their own."""
    world = MPI.COMM_WORLD
    for shift in (0, 1) if open_mpi() else (0,):
        ours = random_input(9, np.float64, "sum")
        theirs = ours.copy()
        got = outcome(lambda: wrapped().Allreduce(ours[shift:], ours[:8], op=MPI.SUM), ours)  # noqa: B023
        want = outcome(lambda: world.Allreduce(theirs[shift:], theirs[:8], op=MPI.SUM), theirs)  # noqa: B023
        assert everywhere(world, got == want), shift
    assert everywhere(world, routed == [])


# --- what goes to MPI unchanged ---------------------------------------------------------------------


def test_other_ops_go_to_mpi(routed: list[str]) -> None:
    world, comm = MPI.COMM_WORLD, wrapped()
    flags = np.array([True, world.rank % 2 == 0, False])
    land_ours, land_theirs = flags.copy(), flags.copy()
    comm.Allreduce(MPI.IN_PLACE, [land_ours, MPI.BOOL], op=MPI.LAND)
    world.Allreduce(MPI.IN_PLACE, [land_theirs, MPI.BOOL], op=MPI.LAND)

    ints = np.arange(6, dtype=np.int32) * (world.rank + 1)
    band_ours, band_theirs = np.empty_like(ints), np.empty_like(ints)
    comm.Allreduce(ints, band_ours, op=MPI.BAND)
    world.Allreduce(ints, band_theirs, op=MPI.BAND)

    def absmax(a: Any, b: Any, datatype: Any) -> None:
        x, y = np.frombuffer(a, dtype=np.float64), np.frombuffer(b, dtype=np.float64)
        y[:] = np.maximum(np.abs(x), np.abs(y))

    user = MPI.Op.Create(absmax, commute=True)
    try:
        values = random_input(5, np.float64, "sum")
        user_ours, user_theirs = values.copy(), values.copy()
        comm.Allreduce(MPI.IN_PLACE, [user_ours, MPI.DOUBLE], op=user)
        world.Allreduce(MPI.IN_PLACE, [user_theirs, MPI.DOUBLE], op=user)
    finally:
        user.Free()

    pairs = np.array([[(world.rank * 7) % 5, world.rank], [world.rank, world.rank]], dtype=np.int32)
    loc_ours, loc_theirs = np.empty_like(pairs), np.empty_like(pairs)
    comm.Allreduce([pairs, MPI.TWOINT], [loc_ours, MPI.TWOINT], op=MPI.MINLOC)
    world.Allreduce([pairs, MPI.TWOINT], [loc_theirs, MPI.TWOINT], op=MPI.MINLOC)

    ok = (
        same_bits(land_ours, land_theirs)
        and same_bits(band_ours, band_theirs)
        and same_bits(user_ours, user_theirs)
        and same_bits(loc_ours, loc_theirs)
    )
    assert everywhere(world, ok and routed == [])


def test_buffers_hpcring_cannot_take_go_to_mpi(routed: list[str]) -> None:
    world, comm = MPI.COMM_WORLD, wrapped()
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    try:
        cases = {
            "uint32 (no such hpcring dtype)": lambda b: b,
            "int16": lambda b: b,
            "derived datatype": lambda b: [b, 3, pair],
        }
        dtypes = {
            "uint32 (no such hpcring dtype)": np.uint32,
            "int16": np.int16,
            "derived datatype": np.float64,
        }
        for name, spec in cases.items():
            send = np.arange(6, dtype=dtypes[name]) * (world.rank + 1)
            ours, theirs = np.zeros_like(send), np.zeros_like(send)
            got = outcome(lambda: comm.Allreduce(spec(send), spec(ours), op=MPI.SUM), ours)  # noqa: B023
            want = outcome(lambda: world.Allreduce(spec(send), spec(theirs), op=MPI.SUM), theirs)  # noqa: B023
            assert everywhere(world, got == want), name  # MPI's answer, or MPI's error
    finally:
        pair.Free()
    assert everywhere(world, routed == [])


def test_what_mpi4py_refuses_it_still_refuses(routed: list[str]) -> None:
    """A non-contiguous buffer or a mismatched spec: mpi4py's own error, raised where mpi4py raises it."""
    comm = wrapped()
    for sendbuf, recvbuf in [
        (MPI.IN_PLACE, np.zeros(8)[::2]),
        (np.zeros(4), np.zeros(5)),
        (np.zeros(4), np.zeros(4, np.float32)),
        (MPI.IN_PLACE, np.frombuffer(bytes(32), dtype=np.float64)),
    ]:
        with pytest.raises((BufferError, ValueError)) as mpi4py_says:
            MPI.COMM_WORLD.Allreduce(sendbuf, recvbuf, op=MPI.SUM)
        with pytest.raises(mpi4py_says.type) as wrapper_says:
            comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)
        assert str(wrapper_says.value) == str(mpi4py_says.value)
    assert routed == []


# --- the rest of the communicator is the communicator's ---------------------------------------------


def test_everything_else_is_the_communicators() -> None:
    world = MPI.COMM_WORLD
    comm = wrapped("ring")
    assert isinstance(comm, MPI.Intracomm) and comm == world
    assert (comm.Get_rank(), comm.Get_size(), comm.rank, comm.size) == (world.rank, world.size) * 2
    assert comm.Get_name() == world.Get_name()
    data = np.arange(4.0) if world.rank == 0 else np.zeros(4)
    comm.Bcast(data, root=0)
    assert everywhere(world, np.array_equal(data, np.arange(4.0)))
    assert comm.bcast("hello" if world.rank == 0 else None) == "hello"
    assert comm.allgather(world.rank) == list(range(world.size))
    half = comm.Split(world.rank % 2, world.rank)
    assert half.Get_size() == (world.size + 1 - world.rank % 2) // 2
    half.Free()
    dup = comm.Dup()
    assert isinstance(dup, hpcring.Intracomm) and dup._hpcring_algorithm == "ring"
    x = np.full(3, float(world.rank))
    dup.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    assert everywhere(world, (x == world.size * (world.size - 1) / 2).all())
    dup.Free()
    cart = world.Create_cart([world.size])
    wrapped_cart = hpcring.Intracomm(cart)
    assert isinstance(wrapped_cart, MPI.Cartcomm) and wrapped_cart.Get_coords(world.rank) == [world.rank]
    cart.Free()
    comm.Barrier()


def test_hpcring_calls_take_the_wrapper_as_comm() -> None:
    """hpcring's own calls on a wrapper use MPI underneath (no loop back through the wrapper)."""
    world = MPI.COMM_WORLD
    comm = wrapped()
    x = np.full(4, world.rank, dtype=np.int64)
    hpcring.allreduce(x, comm=comm, algorithm="mpi")
    request = hpcring.iallreduce(np.ones(2), comm=comm)
    assert everywhere(world, (x == world.size * (world.size - 1) // 2).all())
    assert everywhere(world, (request.wait() == world.size).all())


def test_constructor_refuses_what_is_not_an_intracomm() -> None:
    with pytest.raises(TypeError, match="intracommunicator"):
        hpcring.Intracomm("world")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="intracommunicator"):
        hpcring.Intracomm(MPI.COMM_NULL)
    with pytest.raises(ValueError, match="unknown algorithm 'fast'"):
        hpcring.Intracomm(MPI.COMM_WORLD, algorithm="fast")


# --- Iallreduce and the pickle-based allreduce -------------------------------------------------------


def test_iallreduce_wait_and_test(routed: list[str]) -> None:
    world, comm = MPI.COMM_WORLD, wrapped()
    send = random_input(100, np.float64, "sum")
    ours, theirs = np.empty_like(send), np.empty_like(send)
    request = comm.Iallreduce(send, ours, op=MPI.SUM)
    world.Allreduce(send, theirs, op=MPI.SUM)
    assert request.Wait() is True and not request
    assert request.Test()
    in_place = send.copy()
    request = comm.Iallreduce(MPI.IN_PLACE, in_place, op=MPI.MAX)
    while not request.Test():
        pass
    maxed = send.copy()
    world.Allreduce(MPI.IN_PLACE, maxed, op=MPI.MAX)
    flags = np.array([world.rank == 0])
    passed = comm.Iallreduce(MPI.IN_PLACE, [flags, MPI.BOOL], op=MPI.LOR)
    assert isinstance(passed, MPI.Request)
    passed.Wait()
    ok = same_bits(ours, theirs) and same_bits(in_place, maxed) and bool(flags[0])
    assert everywhere(world, ok and routed == ["sum", "max"])


def test_pickle_allreduce(routed: list[str]) -> None:
    world, comm = MPI.COMM_WORLD, wrapped()
    rank, size = world.rank, world.size
    total = size * (size - 1) // 2
    array_sum = comm.allreduce(np.arange(4.0) * rank, op=MPI.SUM)
    assert type(array_sum) is np.ndarray and np.array_equal(array_sum, np.arange(4.0) * total)
    as_float = comm.allreduce(float(rank), op=MPI.SUM)
    assert type(as_float) is float and as_float == total
    as_scalar = comm.allreduce(np.float32(rank), op=MPI.MAX)
    assert type(as_scalar) is np.float32 and as_scalar == size - 1
    as_complex = comm.allreduce(complex(rank, 1), op=MPI.SUM)
    assert type(as_complex) is complex and as_complex == complex(total, size)
    assert everywhere(world, len(routed) == 4)
    big = comm.allreduce(2**70 + rank, op=MPI.SUM)  # a Python int is no int64: mpi4py's
    assert big == size * 2**70 + total
    mixed = comm.allreduce(0 if rank == 0 else np.ones(2), op=MPI.SUM)  # 0 on one rank: mpi4py's
    assert np.array_equal(np.asarray(mixed) * np.ones(2), np.full(2, size - 1))
    words = comm.allreduce([rank], op=MPI.SUM)
    assert words == list(range(size))
    assert comm.allreduce(rank, op=lambda a, b: a + b) == total
    assert everywhere(world, len(routed) == 4)


# --- mpi4py's ops in hpcring.allreduce itself ----------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_mpi_ops_in_hpcring_allreduce(op: str) -> None:
    world = MPI.COMM_WORLD
    x = small_input(world.rank, 10, np.int64, op)
    by_name = hpcring.allreduce(x.copy(), op=op)
    by_mpi = hpcring.allreduce(x.copy(), op=OPS[op])
    mixed = hpcring.allreduce(x.copy(), op=OPS[op] if world.rank == 0 else op)  # names agree
    later = hpcring.iallreduce(x.copy(), op=OPS[op]).wait()
    want = exact(10, np.int64, op)
    ok = all(same_bits(r, want) for r in (by_name, by_mpi, mixed, later))
    assert everywhere(world, ok)


def test_gradient_sync_takes_mpi_sum() -> None:
    world = MPI.COMM_WORLD
    sync = hpcring.GradientSync(
        [np.zeros(3)], op=MPI.SUM if world.rank == 0 else "sum", algorithm="mpi", comm=wrapped()
    )
    assert sync.op == "sum"
    sync.grads[0][:] = world.rank
    sync.ready_all()
    sync.wait()
    assert everywhere(world, (sync.grads[0] == world.size * (world.size - 1) / 2).all())


@pytest.mark.parametrize("name", ["LAND", "MINLOC", "BXOR", "REPLACE"])
def test_unsupported_mpi_op_raises_everywhere(name: str) -> None:
    x = np.ones(4)
    op = getattr(MPI, name)
    raises_everywhere(ValueError, f"MPI.{name} is not a supported op", lambda: hpcring.allreduce(x, op=op))
    assert everywhere(MPI.COMM_WORLD, (x == 1).all())  # the buffer as it was


def test_unsupported_op_on_one_rank_raises_everywhere() -> None:
    world = MPI.COMM_WORLD
    user = MPI.Op.Create(lambda a, b, t: None, commute=True)
    try:
        op = user if world.rank == world.size - 1 else "sum"
        raises_everywhere(
            ValueError,
            "a user-defined MPI.Op is not a supported op",
            lambda: hpcring.allreduce(np.ones(2), op=op),
        )
        raises_everywhere(
            ValueError,
            "MPI.LAND is not a supported op",
            lambda: hpcring.allreduce(np.ones(2), op=MPI.LAND, check=False),
        )
        raises_everywhere(
            ValueError,
            "MPI.LAND is not a supported op; use one of MPI.SUM, MPI.MAX, MPI.MIN, MPI.PROD or 'sum'",
            lambda: hpcring.GradientSync([np.zeros(2)], op=MPI.LAND if world.rank == 0 else "sum"),
        )
    finally:
        user.Free()
