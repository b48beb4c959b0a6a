"""PyTorch tensors through hpcring.allreduce, the DDP communication hook, and GradientSync over
``p.grad``. Skipped where PyTorch is not installed (pip install -e '.[torch]' in hpcring's clone).

The matrix is reduced (every algorithm, every op, float32/float64/bfloat16, in and out of
place, one odd size): each result is bitwise the same on every rank and bitwise the NumPy
array's result through the same algorithm. CUDA tensors are marked gpu.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring.algorithms import PORTABLE
from hpcring.arrays import adapter_for, available

torch = pytest.importorskip("torch", reason="needs PyTorch: pip install -e '.[torch]' in hpcring's clone")
import hpcring.torch  # noqa: E402  (after the skip: it imports torch)

WORLD = MPI.COMM_WORLD
ALGORITHMS = list(PORTABLE)
OPS = ["sum", "mean", "max", "min", "prod"]
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
N = 37  # odd, more than the ranks: uneven ring chunks


def values(rank: int, n: int = N) -> np.ndarray:
    """Small integers (1..3): exact in bfloat16 in every order, even as a product over 4 ranks."""
    return ((np.arange(n) + 2 * rank) % 3 + 1).astype(np.float64)


def tensor(rank: int, dtype: torch.dtype, shape: tuple[int, ...] = (N,)) -> torch.Tensor:
    return torch.from_numpy(values(rank, int(np.prod(shape))).reshape(shape)).to(dtype)


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return adapter_for(t).flat(t).copy()


# -- serial: the adapter itself ------------------------------------------------------------------


def test_cpu_tensors_are_zero_copy_numpy_views() -> None:
    for dtype in (*DTYPES.values(), torch.float16, torch.int32, torch.int64, torch.complex64):
        t = torch.zeros((3, 4), dtype=dtype)
        adapter = adapter_for(t)
        flat = adapter.flat(t)
        assert adapter.kind == "torch" and isinstance(flat, np.ndarray) and flat.shape == (12,)
        assert adapter.data_pointer(flat) == t.data_ptr()
        assert adapter.dtype(t).itemsize == t.element_size()
    assert adapter_for(torch.zeros(2, dtype=torch.bfloat16)).dtype(
        torch.zeros(2, dtype=torch.bfloat16)
    ).name == ("bfloat16")
    assert "torch" in available()


def test_in_place_and_out_on_one_rank() -> None:
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert hpcring.allreduce(x, comm=MPI.COMM_SELF) is x
    out = torch.empty_like(x)
    assert hpcring.allreduce(x, out=out, op="mean", comm=MPI.COMM_SELF) is out
    assert torch.equal(out, x)
    view = x.view(-1)  # another view of x's bytes: in place
    assert hpcring.allreduce(x, out=view, comm=MPI.COMM_SELF) is x  # as for NumPy: in place returns x


# -- the matrix --------------------------------------------------------------------------------


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matrix_bitwise_numpy(algorithm: str) -> None:
    failures = []
    for name, dtype in DTYPES.items():
        for op in OPS:
            for in_place in (True, False):
                x = tensor(WORLD.rank, dtype)
                reference = as_numpy(x)
                hpcring.allreduce(reference, op=op, algorithm=algorithm)
                before = x.clone()
                out = None if in_place else torch.full_like(x, -7)
                result = hpcring.allreduce(x, op=op, algorithm=algorithm, out=out)
                got = x if in_place else out
                ok = result is got and np.array_equal(as_numpy(got), reference)
                if not in_place:
                    ok = ok and torch.equal(x, before)
                if not (ok and identical_everywhere(WORLD, as_numpy(got))):
                    failures.append((name, op, in_place))
    assert everywhere(WORLD, not failures), failures


@pytest.mark.mpi
def test_iallreduce_and_a_parameters_grad() -> None:
    net = torch.nn.Linear(5, 3)
    net(torch.ones(2, 5) * (WORLD.rank + 1)).sum().backward()
    grad = net.weight.grad
    expected = grad.clone() * 0
    for r in range(WORLD.size):
        expected += torch.ones(3, 5) * 2 * (r + 1)
    request = hpcring.iallreduce(grad, op="sum")
    assert request.wait() is grad
    assert everywhere(WORLD, torch.allclose(grad, expected))


# -- every refusal, on every rank ----------------------------------------------------------------

CPU_MISTAKES = {
    "requires grad": (lambda: torch.ones(8, requires_grad=True), "x requires grad"),
    "non-contiguous": (lambda: torch.ones(4, 4).t(), "C-contiguous (pass x.contiguous()"),
    "conjugate view": (lambda: torch.ones(8, dtype=torch.complex64).conj(), "lazy conjugate view"),
    "negative view": (lambda: torch._neg_view(torch.ones(8)), "lazy negative view"),
    "sparse": (lambda: torch.ones(8).to_sparse(), "sparse_coo tensor cannot be reduced"),
    "meta device": (lambda: torch.ones(8, device="meta"), "x is on meta"),
    "dtype": (lambda: torch.ones(8, dtype=torch.int8), "dtype int8 is not supported"),
    "float8": (lambda: torch.ones(8, dtype=torch.float8_e4m3fn), "dtype float8_e4m3fn is not supported"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("mistake", CPU_MISTAKES)
def test_a_bad_tensor_on_one_rank_fails_everywhere(mistake: str) -> None:
    make, match = CPU_MISTAKES[mistake]
    error = TypeError if mistake in ("dtype", "float8") else ValueError
    good = torch.ones(8)
    x = make() if WORLD.rank == WORLD.size - 1 else good
    raises_everywhere(error, match, lambda: hpcring.allreduce(x))  # the bad rank's words, everywhere
    raises_everywhere(error, match, lambda: hpcring.allreduce(make()))  # every rank: the message itself
    assert everywhere(WORLD, torch.equal(good, torch.ones(8)))


@pytest.mark.mpi
def test_bad_out_tensors_fail_everywhere() -> None:
    x = torch.ones(8)
    raises_everywhere(
        ValueError,
        "out is on meta but x is on the CPU",
        lambda: hpcring.allreduce(x, out=torch.ones(8, device="meta")),
    )
    raises_everywhere(
        ValueError, "out requires grad", lambda: hpcring.allreduce(x, out=torch.ones(8, requires_grad=True))
    )
    raises_everywhere(ValueError, "out must have x's shape", lambda: hpcring.allreduce(x, out=torch.ones(9)))
    raises_everywhere(
        TypeError, "out must be a torch.Tensor", lambda: hpcring.allreduce(x, out=np.ones(8, np.float32))
    )
    buf = torch.ones(12)
    raises_everywhere(ValueError, "overlaps", lambda: hpcring.allreduce(buf[:8], out=buf[4:]))
    # A float32 tensor on some ranks and a NumPy array on the others: the kinds disagree.
    if WORLD.size > 1:
        mixed = x if WORLD.rank else np.ones(8, np.float32)
        raises_everywhere(ValueError, "torch.Tensor (CPU)", lambda: hpcring.allreduce(mixed))
    assert everywhere(WORLD, torch.equal(x, torch.ones(8)))


@pytest.mark.mpi
def test_warm_tensor_calls_skip_the_full_path_yet_refuse_a_bad_tensor(monkeypatch) -> None:
    """A CPU tensor's repeated call is a warm one (the full path runs once per kind of call), and
    a tensor of the same shape and dtype that the full path would refuse is still refused."""
    from hpcring import engine

    full: list[int] = []
    prepare = engine.prepare
    monkeypatch.setattr(engine, "prepare", lambda *a, **k: full.append(1) or prepare(*a, **k))
    comm = WORLD.Dup()
    x, out = tensor(WORLD.rank, torch.float64, (4, 4)), torch.empty(4, 4, dtype=torch.float64)
    expected = np.max([values(r, 16) for r in range(WORLD.size)], axis=0).reshape(4, 4)
    for _ in range(3):
        hpcring.allreduce(x, op="max", comm=comm, out=out)
        hpcring.allreduce(x, op="max", comm=comm)
    assert everywhere(WORLD, full == [1, 1] and np.array_equal(x.numpy(), expected))
    assert everywhere(WORLD, np.array_equal(out.numpy(), expected))
    last = WORLD.rank == WORLD.size - 1
    bad = {
        "requires grad": torch.ones(4, 4, dtype=torch.float64, requires_grad=True),
        "C-contiguous": torch.ones(4, 4, dtype=torch.float64).t(),
        "is on meta": torch.ones(4, 4, dtype=torch.float64, device="meta"),
    }
    for match, t in bad.items():
        y = t if last else x
        raises_everywhere(ValueError, match, lambda y=y: hpcring.allreduce(y, op="max", comm=comm))
    buf = torch.zeros(32, dtype=torch.float64)
    y, overlapping = buf[:16].view(4, 4), buf[4:20].view(4, 4)
    raises_everywhere(
        ValueError, "overlaps", lambda: hpcring.allreduce(y, op="max", comm=comm, out=overlapping)
    )
    assert everywhere(WORLD, not buf.any())
    comm.Free()


@pytest.mark.mpi
def test_warm_tensor_calls_run_in_c_and_still_agree(python_runs: list[int]) -> None:
    """A CPU tensor's warm all-reduce and broadcast run in the compiled core on NumPy views of its
    memory (the engine's Python call is not entered again), with the same results as the Python
    path, and its agreement still says torch: a NumPy array, or another shape, on one rank after
    the warm calls raises on every rank, the tensors untouched."""
    import types

    from hpcring import core, engine

    in_c = core.active() and not isinstance(engine.call, types.FunctionType)
    equal = lambda t, a: np.array_equal(t.numpy(), a)  # noqa: E731
    comm, g, rank = WORLD.Dup(), WORLD.size, WORLD.rank
    total = sum(values(r, 16) for r in range(g)).reshape(4, 4)
    for dtype in (torch.float32, torch.float64, torch.int32):
        expected = total.astype(torch.zeros(0, dtype=dtype).numpy().dtype)
        x, out = tensor(rank, dtype, (4, 4)), torch.zeros(4, 4, dtype=dtype)
        for _ in range(5):
            x.copy_(tensor(rank, dtype, (4, 4)))
            assert hpcring.allreduce(x, comm=comm, algorithm="auto") is x
            assert hpcring.allreduce(tensor(rank, dtype, (4, 4)), out=out, comm=comm, algorithm="auto") is out
            assert everywhere(WORLD, equal(x, expected) and equal(out, expected))
        before = len(python_runs)
        x.copy_(tensor(rank, dtype, (4, 4)))
        hpcring.allreduce(x, comm=comm, algorithm="auto")
        hpcring.allreduce(tensor(rank, dtype, (4, 4)), out=out, comm=comm, algorithm="auto")
        assert everywhere(WORLD, equal(x, expected) and equal(out, expected))
        if in_c and g > 1:  # (one rank moves nothing: no program, so no warm call in C)
            assert everywhere(WORLD, len(python_runs) == before)
    mean = torch.from_numpy(values(rank, 8)).to(torch.float64)
    for _ in range(4):
        y = mean.clone()
        hpcring.allreduce(y, op="mean", comm=comm)
        assert everywhere(WORLD, np.array_equal(y.numpy(), sum(values(r, 8) for r in range(g)) / g))
        b = torch.full((6,), float(rank))
        assert hpcring.broadcast(b, root=g - 1, comm=comm) is b
        assert everywhere(WORLD, np.array_equal(b.numpy(), np.full(6, g - 1, np.float32)))
    if g > 1:
        last = rank == g - 1
        good = tensor(rank, torch.float32, (4, 4))
        for other, match in ((np.ones((4, 4), np.float32), "torch.Tensor (CPU)"), (torch.ones(17), "count")):
            mine = good.clone()
            run = lambda m=mine, o=other: hpcring.allreduce(o if last else m, comm=comm, algorithm="auto")  # noqa: E731
            raises_everywhere(ValueError, match, run)
            assert everywhere(WORLD, torch.equal(mine, good))
    comm.Free()


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.skipif("torch_cuda" not in available(), reason="needs CuPy, a GPU and a CUDA build of PyTorch")
def test_cuda_tensors_on_a_side_stream() -> None:
    """A CUDA tensor written on a side stream: the event orders the algorithms after it, and the
    tensor's stream after the result (no device-wide synchronize)."""
    device = torch.device("cuda", hpcring.select_device())
    torch.cuda.set_device(device)
    stream = torch.cuda.Stream(device)
    for algorithm in ALGORITHMS:
        with torch.cuda.stream(stream):
            x = torch.full((1 << 20,), float(WORLD.rank + 1), device=device)
            x.mul_(2)  # queued on the side stream
            result = hpcring.allreduce(x, algorithm=algorithm, op="mean")
            total = float(result.sum())  # on the side stream: after the reduction
        assert result is x
        expected = sum(2.0 * (r + 1) for r in range(WORLD.size)) / WORLD.size * (1 << 20)
        assert everywhere(WORLD, total == expected), algorithm
    raises_everywhere(ValueError, "bfloat16 CUDA tensor", lambda: hpcring.allreduce(x.bfloat16()))


# -- the DDP hook and GradientSync ---------------------------------------------------------------


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    hpcring.torch.init_process_group("gloo")
    hpcring.torch.init_process_group("gloo")  # a second call does nothing
    yield
    torch.distributed.destroy_process_group()


def train(
    hook: hpcring.torch.HookState | None, steps: int = 3, bucket_mb: float = 0.001
) -> list[torch.Tensor]:
    """A few DDP steps on rank-dependent data; the final parameters (with the hook, or DDP's gloo)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_mb)  # several buckets
    if hook is not None:
        model.register_comm_hook(hook, hpcring.torch.allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(WORLD.rank)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(5, 6, generator=generator)).square().mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "auto"])
def test_ddp_hook_matches_ddp_gloo(group: None, algorithm: str) -> None:
    ours = train(hpcring.torch.HookState(algorithm=algorithm))
    theirs = train(None)
    same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(ours, theirs, strict=True))
    assert everywhere(WORLD, same)
    for p in ours:
        assert identical_everywhere(WORLD, p.numpy())


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_ddp_hook_error_fails_backward_everywhere(group: None) -> None:
    if WORLD.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    algorithm = "ps" if WORLD.rank == 0 else "ring"
    raises_everywhere(
        Exception, "disagree on algorithm", lambda: train(hpcring.torch.HookState(algorithm=algorithm), 1)
    )


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [True, False])
def test_gradient_sync_on_p_grad(overlap: bool) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    alone = copy.deepcopy(net)  # this rank's own gradients: the synced ones reduce during backward
    sync = hpcring.torch.ModuleGradientSync(net, bucket_bytes=64, first_bucket_bytes=32, overlap=overlap)
    assert len(sync.sync.buckets) > 1
    data = torch.randn(3, 4, generator=torch.Generator().manual_seed(WORLD.rank))
    for set_to_none in (False, True):
        net.zero_grad(set_to_none=set_to_none)
        alone.zero_grad()
        net(data).sum().backward()
        alone(data).sum().backward()
        mine = [p.grad for p in alone.parameters()]
        sync.wait()
        for p, g in zip(net.parameters(), mine, strict=True):
            total = np.asarray(WORLD.allreduce(g.numpy().astype(np.float64)))
            assert everywhere(WORLD, np.allclose(p.grad.numpy(), total / WORLD.size, rtol=1e-6, atol=1e-7))
            assert identical_everywhere(WORLD, p.grad.numpy())
    sync.remove()


def test_the_old_name_still_works_and_says_the_new_one() -> None:
    net = torch.nn.Linear(3, 2)
    with pytest.warns(FutureWarning, match="now hpcring.torch.ModuleGradientSync"):
        sync = hpcring.torch.GradientSync(net, comm=MPI.COMM_SELF)
    assert isinstance(sync, hpcring.torch.ModuleGradientSync)
    sync.remove()


@pytest.mark.mpi
def test_module_sync_passes_reproducible_wire_and_error_feedback() -> None:
    """reproducible=: p.grad is bitwise the reproducible mean of the ranks' gradients; wire= and
    error_feedback=: what travels is narrowed and each rank keeps its residual."""
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 4)
    data = torch.randn(3, 5, generator=torch.Generator().manual_seed(WORLD.rank))
    alone = copy.deepcopy(net)
    alone(data).sum().backward()
    mine = [p.grad.numpy().copy() for p in alone.parameters()]
    sync = hpcring.torch.ModuleGradientSync(net, overlap=False, reproducible=True)
    net(data).sum().backward()
    sync.wait()
    for p, g in zip(net.parameters(), mine, strict=True):
        expected = hpcring.allreduce(g, op="mean", reproducible=True)
        assert everywhere(WORLD, np.array_equal(p.grad.numpy(), expected))
    sync.remove()
    narrow = hpcring.torch.ModuleGradientSync(net, overlap=False, wire="bfloat16", error_feedback=True)
    assert narrow.sync.wire == "bfloat16" and narrow.sync.error_feedback and narrow.sync.residuals
    net.zero_grad()
    net(data).sum().backward()
    narrow.wait()
    for p, g in zip(net.parameters(), mine, strict=True):
        total = np.asarray(WORLD.allreduce(g.astype(np.float64))) / WORLD.size
        assert everywhere(WORLD, np.allclose(p.grad.numpy(), total, rtol=2e-2, atol=2e-2))
        assert identical_everywhere(WORLD, p.grad.numpy())
    assert everywhere(WORLD, any(float(np.abs(r).max()) > 0 for r in narrow.sync.residuals))
    narrow.remove()


@pytest.mark.mpi
def test_warm_tensor_alltoalls_run_in_c(python_runs: list[int]) -> None:
    """A CPU tensor's warm all-to-all of equal blocks runs in the compiled core on NumPy views, its
    output a tensor (made there, or out=), each block where MPI_Alltoall puts it."""
    import types

    from hpcring import core, engine

    in_c = core.active() and not isinstance(engine.call, types.FunctionType)
    comm, g, rank = WORLD.Dup(), WORLD.size, WORLD.rank
    # block j of rank r holds 100 r + j; rank r receives block r of every rank, in rank order
    x = torch.from_numpy(np.repeat(100.0 * rank + np.arange(g), 3).reshape(g, 3))
    want = np.repeat(100.0 * np.arange(g) + rank, 3).reshape(g, 3)
    out = torch.zeros(g, 3, dtype=torch.float64)
    for i in range(6):
        before = len(python_runs)
        got = hpcring.alltoall(x, comm=comm)
        assert hpcring.alltoall(x, comm=comm, out=out) is out
        ok = isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), want)
        assert everywhere(WORLD, ok and np.array_equal(out.numpy(), want))
        if in_c and g > 1 and i >= 3:
            assert everywhere(WORLD, len(python_runs) == before)
    if g > 1:
        last = rank == g - 1
        run = lambda: hpcring.alltoall(x.numpy() if last else x, comm=comm)  # noqa: E731
        raises_everywhere(ValueError, "torch.Tensor (CPU)", run)
    comm.Free()


@pytest.mark.mpi
def test_warm_tensor_reduce_scatters_and_allgathers_run_in_c(python_runs: list[int]) -> None:
    """A CPU tensor's warm reduce-scatter and all-gather run in the compiled core on NumPy views,
    their output a tensor (made there, or out=, or in place), with the closed form."""
    import types

    from hpcring import core, engine
    from hpcring.partition import segment

    in_c = core.active() and not isinstance(engine.call, types.FunctionType)
    comm, placed, g, rank = WORLD.Dup(), WORLD.Dup(), WORLD.size, WORLD.rank
    x = torch.from_numpy(values(rank, 10))
    total = sum(values(r, 10) for r in range(g))
    start, stop = segment(10, g, rank)
    gathered = np.stack([values(r, 10) for r in range(g)])
    part, rows = torch.zeros(stop - start, dtype=torch.float64), torch.zeros(g, 10, dtype=torch.float64)
    for i in range(6):
        before = len(python_runs)
        got = hpcring.reduce_scatter(x, comm=comm, algorithm="auto")
        ok = isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), total[start:stop])
        ok &= hpcring.reduce_scatter(x, out=part, comm=comm, algorithm="auto") is part
        ok &= np.array_equal(part.numpy(), total[start:stop])
        got = hpcring.allgather(x, comm=comm, algorithm="auto")
        ok &= isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), gathered)
        ok &= hpcring.allgather(x, out=rows, comm=comm, algorithm="auto") is rows
        ok &= np.array_equal(rows.numpy(), gathered)
        # in place, on a communicator of its own (a warm call is kept per placement of a kind)
        y = torch.from_numpy(values(rank, 10))  # out is y's own part
        ok &= hpcring.reduce_scatter(y, out=y[start:stop], comm=placed, algorithm="auto") is not None
        ok &= np.array_equal(y[start:stop].numpy(), total[start:stop])
        mine = torch.zeros(g, 10, dtype=torch.float64)  # x is out's row
        mine[rank] = x
        hpcring.allgather(mine[rank], out=mine, comm=placed, algorithm="auto")
        ok &= np.array_equal(mine.numpy(), gathered)
        assert everywhere(WORLD, ok)
        if in_c and g > 1 and i >= 3:
            assert everywhere(WORLD, len(python_runs) == before)
    comm.Free()
    placed.Free()
