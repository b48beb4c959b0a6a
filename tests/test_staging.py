"""The GPU path's pieces that need no GPU: the staged ring's schedule, its piece size, the
CUDA-aware probe's supervisor, and NCCL's refusals; then the same path on a real GPU.

The schedule is checked by playing it for G ranks in one process (every rank's k-th send
meets its right neighbour's k-th receive), so every (G, count, pieces) can be covered here.
"""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere, needs_gpu, raises_everywhere
from mpi4py import MPI

import hpcring
from hpcring import config
from hpcring.algorithms import nccl, ring, ring_staged
from hpcring.arrays.numpy import NumpyAdapter
from hpcring.channel import Channel
from hpcring.gpu import verify_cuda_aware
from hpcring.ops import OPS


def play(size: int, count: int, pieces: int, in_place: bool) -> list[np.ndarray]:
    """Run every rank's staged schedule in lock step; return each rank's result."""
    inputs = [np.arange(count, dtype=np.int64) * 10 + r + 1 for r in range(size)]
    outputs = [x if in_place else np.full(count, -1, dtype=np.int64) for x in inputs]
    schedules = [ring_staged.staged_items(size, r, count, pieces) for r in range(size)]
    lengths = {len(s) for s in schedules}
    assert lengths == {2 * (size - 1) * pieces}
    for i in range(lengths.pop()):
        sent = []
        for r in range(size):
            item = schedules[r][i]
            if item.after >= 0:  # it sends what that earlier item wrote
                assert schedules[r][item.after].into == item.out
            else:
                assert item.from_src
            sent.append((inputs[r] if item.from_src else outputs[r])[item.out].copy())
        for r in range(size):
            item, message = schedules[r][i], sent[(r - 1) % size]
            assert message.size == item.into.stop - item.into.start
            if item.reduce:
                outputs[r][item.into] = inputs[r][item.into] + message
            else:
                outputs[r][item.into] = message
    return outputs


@pytest.mark.parametrize("size", [2, 3, 4, 5])
@pytest.mark.parametrize("count", [1, 2, 4, 7, 10, 101])
@pytest.mark.parametrize("pieces", [1, 2, 3, 8])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out-of-place"])
def test_staged_schedule_reduces(size: int, count: int, pieces: int, in_place: bool) -> None:
    want = sum(np.arange(count, dtype=np.int64) * 10 + r + 1 for r in range(size))
    for result in play(size, count, pieces, in_place):
        assert np.array_equal(result, want)


def test_staged_schedule_sends_the_formula() -> None:
    for size, count, pieces in [(2, 10, 3), (3, 10, 2), (4, 1001, 5)]:
        for rank in range(size):
            items = ring_staged.staged_items(size, rank, count, pieces)
            sent = sum(item.out.stop - item.out.start for item in items)
            assert sent * 4 == ring.bytes_sent(count, 4, size, rank)


def test_staging_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCRING_STAGING_CHUNK_BYTES", raising=False)
    config.reload()
    assert ring_staged.pieces(4000, 2, 4) is None  # off until measured on a GPU
    limit = 1000
    monkeypatch.setenv("HPCRING_STAGING_CHUNK_BYTES", str(limit))
    config.reload()
    assert ring_staged.pieces(0, 2, 4) == 1
    assert ring_staged.pieces(2 * limit // 4, 2, 4) == 1  # one segment is exactly one piece
    assert ring_staged.pieces(2 * limit // 4 + 2, 2, 4) == 2
    assert ring_staged.pieces(4000, 2, 4) == 8
    for bad in ("0", "-5", "4M"):
        monkeypatch.setenv("HPCRING_STAGING_CHUNK_BYTES", bad)
        config.reload()
        with pytest.raises(ValueError, match="HPCRING_STAGING_CHUNK_BYTES"):
            ring_staged.pieces(4000, 2, 4)


def test_probe_supervisor_survives_a_crash() -> None:
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    assert verify_cuda_aware(crash) == "crashed (signal SIGSEGV)"
    fail = [sys.executable, "-c", "import sys; sys.exit('the device buffer arrived wrong')"]
    assert verify_cuda_aware(fail) == "failed (exit 1: the device buffer arrived wrong)"
    assert verify_cuda_aware([sys.executable, "-c", "pass"]) is None
    assert verify_cuda_aware([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.5) == (
        "did not finish in 0.5 s"
    )


def test_probe_child_is_not_part_of_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("PMIX_RANK", "3")
    check = "import os, sys; sys.exit(any(k.startswith(('OMPI_', 'PMIX_')) for k in os.environ))"
    assert verify_cuda_aware([sys.executable, "-c", check]) is None


def test_nccl_is_a_baseline_not_an_algorithm() -> None:
    assert "nccl" not in hpcring.ALGORITHMS
    with pytest.raises(TypeError, match="'nccl' needs CuPy arrays"):
        hpcring.allreduce(np.ones(4), algorithm="nccl", comm=MPI.COMM_SELF)


@pytest.mark.mpi
def test_nccl_refuses_numpy_on_every_rank() -> None:
    x = np.ones(6)
    raises_everywhere(TypeError, "'nccl' needs CuPy arrays", lambda: hpcring.allreduce(x, algorithm="nccl"))
    assert everywhere(MPI.COMM_WORLD, (x == 1).all())


# --- on a real GPU ------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
def test_pinned_copy_bandwidth_is_measured() -> None:
    from hpcring.gpu import pinned_d2h_bandwidth

    assert pinned_d2h_bandwidth(8 << 20, repeats=3) > 1e8  # any real link moves > 0.1 GB/s


@pytest.mark.gpu
@needs_gpu
def test_forced_cuda_aware_is_verified() -> None:
    """HPCRING_CUDA_AWARE=1 on this MPI: verified, or a warning and host staging; never a crash."""
    import subprocess

    code = "from hpcring.gpu import cuda_aware; print(cuda_aware())"
    env = {**os.environ, "HPCRING_CUDA_AWARE": "1"}
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    if done.stdout.startswith("(True"):
        assert "verified by a device-buffer exchange" in done.stdout
    else:
        assert "host staging" in done.stdout and "RuntimeWarning" in done.stderr, (done.stdout, done.stderr)


@pytest.mark.mpi
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("chunk", ["64", "4096", ""], ids=["64B", "4KiB", "unstreamed"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_staged_ring_on_gpu(
    chunk: str, dtype: str, monkeypatch: pytest.MonkeyPatch, fresh_world: MPI.Intracomm
) -> None:
    import cupy

    hpcring.select_device()
    if chunk:
        monkeypatch.setenv("HPCRING_STAGING_CHUNK_BYTES", chunk)
        config.reload()
    comm = MPI.COMM_WORLD
    g = comm.size
    # Tiny pieces make thousands of messages at large n: keep those to small n.
    for n in sorted({1, g - 1, g + 1, 1000} | ({4099} if chunk == "64" else {4099, 100_003})):
        want = np.asarray(g * (np.arange(n) % 5) + g * (g + 1) // 2, dtype=dtype)
        host = np.asarray(np.arange(n) % 5 + comm.rank + 1, dtype=dtype)
        for in_place in (True, False):
            x = cupy.asarray(host)
            out = None if in_place else cupy.full(n, 99, dtype=dtype)
            got = hpcring.allreduce(x, algorithm="ring", out=out, comm=fresh_world).get()
            where = f"n={n} in_place={in_place} chunk={chunk}"
            assert everywhere(comm, np.array_equal(got, want)), where
            assert everywhere(comm, identical_everywhere(comm, got)), where
            assert everywhere(comm, in_place or np.array_equal(x.get(), host)), where


@pytest.mark.mpi
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", ["numpy-elsewhere", "non-contiguous"])
def test_bad_cupy_input_on_one_rank(case: str) -> None:
    """CuPy on rank 0 and NumPy elsewhere, or one rank's CuPy array a strided view: every rank
    raises the same ValueError, and no rank's data changes."""
    import cupy

    comm = MPI.COMM_WORLD
    if case == "numpy-elsewhere" and comm.size == 1:
        pytest.skip("one rank cannot disagree with itself")
    hpcring.select_device()
    base = cupy.ones((10, 2), dtype=cupy.float32)
    if case == "numpy-elsewhere":
        x, match = (
            (base[:, 0].copy() if comm.rank == 0 else np.ones(10, np.float32)),
            "cupy.ndarray on rank 0",
        )
    else:
        x, match = (base[:, 0] if comm.rank == comm.size - 1 else base[:, 0].copy()), "C-contiguous"
    raises_everywhere(ValueError, match, lambda: hpcring.allreduce(x))
    assert everywhere(comm, bool((base == 1).all()) and bool((x == 1).all()))


@pytest.mark.mpi
@pytest.mark.gpu
@needs_gpu
def test_cupy_out_on_x_bytes() -> None:
    """On CuPy as on NumPy: another view of x's bytes is in place; an overlap, x's bytes as
    another dtype, or a strided view are refused on every rank, and x is left as it was."""
    import cupy

    hpcring.select_device()
    comm = MPI.COMM_WORLD
    x = cupy.ones((2, 4), dtype=cupy.float32)
    result = hpcring.allreduce(x, out=x.reshape(8))
    ok = result is x and bool((x == comm.size).all())
    buf = cupy.ones(16, dtype=cupy.float32)
    raises_everywhere(ValueError, "overlaps", lambda: hpcring.allreduce(buf[:8], out=buf[4:12]))
    raises_everywhere(ValueError, "dtype", lambda: hpcring.allreduce(buf[:8], out=buf[:8].view(cupy.int32)))
    raises_everywhere(ValueError, "C-contiguous", lambda: hpcring.allreduce(buf[:8], out=buf[::2]))
    assert everywhere(comm, ok and bool((buf == 1).all()))


@pytest.mark.mpi
@pytest.mark.gpu
@needs_gpu
def test_cupy_array_on_another_device() -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs: an array on a device other than the rank's")
    hpcring.select_device()
    other = (cupy.cuda.Device().id + 1) % cupy.cuda.runtime.getDeviceCount()
    with cupy.cuda.Device(other):
        x = cupy.ones(10, dtype=cupy.float32)
    raises_everywhere(ValueError, "current device", lambda: hpcring.allreduce(x))
    hpcring.allreduce(cupy.ones(10, dtype=cupy.float32), algorithm="ring")  # scratch on this GPU
    with cupy.cuda.Device(other):  # made current, that GPU is fine, with scratch of its own
        hpcring.allreduce(x, algorithm="ring")
    assert everywhere(MPI.COMM_WORLD, bool((x == MPI.COMM_WORLD.size).all()))


@pytest.mark.mpi
@pytest.mark.gpu
@needs_gpu
def test_nccl_where_ranks_share_a_gpu() -> None:
    """Sharing a GPU: NCCL is unavailable, said the same way on every rank, and refused cleanly."""
    import cupy

    comm = MPI.COMM_WORLD
    hpcring.select_device()
    reason = nccl.unavailable(comm)
    if comm.size <= cupy.cuda.runtime.getDeviceCount() or reason is None or "share GPU" not in reason:
        pytest.skip(f"ranks do not share a GPU here ({reason})")
    assert everywhere(comm, len(set(comm.allgather(reason))) == 1)
    x = cupy.ones(8, dtype=cupy.float32)
    raises_everywhere(RuntimeError, "share GPU", lambda: hpcring.allreduce(x, algorithm="nccl"))


@pytest.mark.mpi
@pytest.mark.gpu
@needs_gpu
def test_nccl_runs_on_its_own_gpu() -> None:
    """One rank per GPU: NCCL bootstraps over MPI and reduces (on COMM_SELF where GPUs are shared)."""
    import cupy

    from hpcring.arrays import adapter_for
    from hpcring.comm import channel_for
    from hpcring.ops import OPS

    hpcring.select_device()
    comm = MPI.COMM_WORLD
    own = comm if nccl.unavailable(comm) is None else MPI.COMM_SELF
    reason = nccl.unavailable(own)
    if reason is not None:
        pytest.skip(reason)
    x = cupy.arange(1000, dtype=cupy.float32) + own.rank
    ch = channel_for(own, adapter_for(x))
    out = cupy.empty_like(x)
    nccl.allreduce(ch, x, out, OPS["sum"])
    g = own.size
    want = np.arange(1000, dtype=np.float32) * g + g * (g - 1) // 2
    ok = np.array_equal(out.get(), want)
    mean = hpcring.allreduce(x, algorithm="nccl", op="mean", comm=own)  # a sum to NCCL, then / g
    ok = ok and mean is x and np.array_equal(x.get(), want / g)
    assert everywhere(comm, ok)


class _HostStaging:
    """The `Staging` interface with synchronous host copies: runs `ring_staged.run`'s loop (slots,
    items, `after` marks) over real MPI without a GPU. It checks what CUDA events would
    enforce: a piece is copied out only after the item that wrote it was marked."""

    def __init__(self, slot_bytes: int, marks: int) -> None:
        self.compute = contextlib.nullcontext()
        self._send = [np.empty(max(slot_bytes, 1), np.uint8) for _ in range(2)]
        self._recv = [np.empty(max(slot_bytes, 1), np.uint8) for _ in range(2)]
        self._marks = [-1] * marks
        self.begun = 0

    def begin(self) -> None:
        self.begun += 1

    def to_host(self, item: int, piece: np.ndarray, after: int = -1) -> None:
        assert after < 0 or self._marks[after % len(self._marks)] == after, (item, after)
        self._send[item % 2][: piece.nbytes] = piece.view(np.uint8)

    def sent(self, item: int, nbytes: int) -> np.ndarray:
        return self._send[item % 2][:nbytes]

    def received(self, item: int, nbytes: int) -> np.ndarray:
        return self._recv[item % 2][:nbytes]

    def to_device(self, item: int, piece: np.ndarray) -> None:
        piece.view(np.uint8)[:] = self._recv[item % 2][: piece.nbytes]

    def mark(self, item: int) -> None:
        self._marks[item % len(self._marks)] = item

    def finish(self) -> None:
        pass


class _HostStagedBackend(NumpyAdapter):
    name, device, direct = "host-staged", True, False

    def staging(self, slot_bytes: int, marks: int) -> _HostStaging:
        return _HostStaging(slot_bytes, marks)


@pytest.mark.mpi
@pytest.mark.parametrize("chunk", ["4", "12", "4096"])
@pytest.mark.parametrize("dtype", ["float16", "int64"])
def test_staged_loop_over_mpi(chunk: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The staged ring's loop on the CPU, through a real MPI: the GPU test runs it with CUDA."""
    monkeypatch.setenv("HPCRING_STAGING_CHUNK_BYTES", chunk)
    config.reload()
    comm = MPI.COMM_WORLD.Dup()
    try:
        ch = Channel(comm, _HostStagedBackend())
        g = comm.size
        for n in (1, g + 1, 7, 1001):
            want = np.asarray(g * (np.arange(n) % 5) + g * (g + 1) // 2, dtype=dtype)
            for in_place in (True, False):
                x = np.asarray(np.arange(n) % 5 + comm.rank + 1, dtype=dtype)
                before = x.copy()
                out = x if in_place else np.full(n, 99, dtype=dtype)
                if g > 1:
                    ring.allreduce(ch, x, out, OPS["sum"])
                where = f"n={n} in_place={in_place}"
                assert everywhere(MPI.COMM_WORLD, g == 1 or np.array_equal(out, want)), where
                assert everywhere(MPI.COMM_WORLD, in_place or np.array_equal(x, before)), where
        plans = [p for key, p in ch._schedules.items() if key[0] == "ring-staged"]
        ran_once = len(plans) == 8 and all(p.staging.begun == 1 for p in plans)  # 4 sizes x in/out
        assert everywhere(MPI.COMM_WORLD, g == 1 or ran_once)
    finally:
        comm.Free()


def test_gpu_check_scripts_parse() -> None:
    """The device check only runs where a GPU is; here at least it must be valid bash."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for script in (root / "tests" / "gpu" / "check.sh", root / "tools" / "lent_gpu.sh"):
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, (script, done.stderr)
