"""hpcring.jax: the collectives inside jax.jit, through the XLA FFI target (hpcring._jax_ffi) and
through the io_callback fallback: bitwise what the same call outside jit gives, in an order every
rank shares (no deadlock across scopes and queued calls), jax.grad and jax.vmap through them, a
mismatch raised on every rank, a stall named. Skipped where JAX is not installed (pip install -e
'.[jax]' in hpcring's clone); the FFI cases skip where the target did not build."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from helpers import everywhere, identical_everywhere
from mpi4py import MPI

import hpcring
from hpcring import config

jax = pytest.importorskip("jax", reason="needs JAX: pip install -e '.[jax]' in hpcring's clone")
jnp = pytest.importorskip("jax.numpy")
import hpcring.jax as hj  # noqa: E402  (after the skip: it imports jax)
from hpcring import jax_ffi  # noqa: E402

jax.config.update("jax_enable_x64", True)
WORLD = MPI.COMM_WORLD
G, RANK = WORLD.size, WORLD.rank
N = 37  # odd: uneven reduce-scatter parts
FFI = jax_ffi.target()[0] is not None
needs_ffi = pytest.mark.skipif(not FFI, reason=f"the FFI target is not there: {jax_ffi.target()[1]}")
# What JAX raises for a failed execution: its runtime error, or ValueError from its C++ fast path
# (a compiled function called again).
FAILED = (jax.errors.JaxRuntimeError, ValueError)


@pytest.fixture(params=["ffi", "callback"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each path in turn: the FFI target (where built), then the io_callback fallback."""
    if request.param == "ffi" and not FFI:
        pytest.skip(f"the FFI target is not there: {jax_ffi.target()[1]}")
    saved = list(jax_ffi._STATE)
    if request.param == "callback":
        jax_ffi._STATE[:] = [None, "the test asks for the callback path", []]
    yield request.param
    jax_ffi._STATE[:] = saved


def values(rank: int, dtype: str, n: int = N) -> np.ndarray:
    """Every rank's input: small integers plus, for floats, a rank-dependent fraction (sums round)."""
    base = (np.arange(n) + 2 * rank) % 3 + 1
    kind = np.dtype(jnp.dtype(dtype)).kind
    return (base + 0.1 * (rank + 1) if kind in "fV" else base).astype(jnp.dtype(dtype))


def outside(x: np.ndarray, **kwargs: object) -> np.ndarray:
    return hpcring.allreduce(np.array(x), **kwargs)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "mpi", "auto"])
def test_allreduce_inside_jit_is_the_call_outside(path: str, algorithm: str) -> None:
    """Every dtype hpcring reduces with sum, and with the ring every other op on a float, bfloat16
    and an integer type: the same bits."""
    floats = ("float32", "float64", "bfloat16", "float16")
    cases = [(d, "sum") for d in (*floats, "int32", "int64")]
    if algorithm == "ring":
        cases += [(d, op) for d in ("float32", "bfloat16") for op in ("mean", "max", "min", "prod")]
        cases += [("int32", op) for op in ("max", "min", "prod")]
    if path == "callback":
        cases = cases[:2]  # the fallback: the same engine, a few cases
    failures = []
    for dtype, op in cases:
        if algorithm == "mpi" and dtype in ("bfloat16", "float16"):
            continue  # no MPI datatype: the engine refuses them, inside jit as outside
        x = jnp.asarray(values(RANK, dtype))
        inside = np.asarray(jax.jit(lambda a, op=op: hj.allreduce(a, op=op, algorithm=algorithm))(x))
        want = outside(values(RANK, dtype), op=op, algorithm=algorithm)
        same = inside.dtype == want.dtype and np.array_equal(inside, want)
        if not (same and identical_everywhere(WORLD, inside)):
            failures.append((dtype, op))
    assert everywhere(WORLD, not failures), failures


@pytest.mark.mpi
@needs_ffi
def test_algorithm_mpi_is_mpi4jax_bitwise() -> None:
    """mpi4jax is a yardstick, not a dependency: where it is installed, algorithm="mpi" gives its bits."""
    mpi4jax = pytest.importorskip("mpi4jax")
    for dtype in ("float32", "float64"):
        x = jnp.asarray(values(RANK, dtype))
        ours = np.asarray(jax.jit(lambda a: hj.allreduce(a, algorithm="mpi"))(x))
        theirs = np.asarray(jax.jit(lambda a: mpi4jax.allreduce(a, op=MPI.SUM, comm=WORLD))(x))
        assert everywhere(WORLD, np.array_equal(ours, theirs))


@pytest.mark.mpi
def test_the_other_collectives_inside_jit(path: str) -> None:
    x = jnp.asarray(values(RANK, "float64"))
    part = jax.jit(hj.reduce_scatter)(x)
    assert everywhere(WORLD, np.array_equal(np.asarray(part), hpcring.reduce_scatter(np.array(x))))
    rows = jax.jit(hj.allgather)(x)
    want = np.stack([values(r, "float64") for r in range(G)])
    assert everywhere(WORLD, rows.shape == (G, N) and np.array_equal(np.asarray(rows), want))
    for root in range(G):
        got = jax.jit(lambda a, root=root: hj.broadcast(a, root=root))(x)
        same = np.array_equal(np.asarray(got), values(root, "float64"))
        assert everywhere(WORLD, same and np.array_equal(np.asarray(x), values(RANK, "float64")))


@pytest.mark.mpi
@needs_ffi
def test_order_across_scopes_and_queued_calls() -> None:
    """Collectives at the top, in a scan body, a nested jit and a cond, their data independent of
    each other (XLA may schedule them in any order), the program dispatched ten times before any
    result is waited for: every rank meets every call (no deadlock) and every result is right."""
    inner = jax.jit(lambda a: hj.allreduce(a * 3) + hj.allgather(a)[0])

    @jax.jit
    def program(a: jax.Array, b: jax.Array) -> tuple[jax.Array, ...]:
        total = hj.allreduce(a)
        first = hj.broadcast(b, root=G - 1)
        nested = inner(b)

        def body(carry: jax.Array, _: None) -> tuple[jax.Array, None]:
            return hj.allreduce(carry, op="max"), None

        looped, _ = jax.lax.scan(body, b * 2, None, length=2)
        chosen = jax.lax.cond(a[0] > -1, lambda v: hj.allreduce(v * 5), lambda v: v, b)
        return total, first, nested, looped, chosen

    a, b = jnp.asarray(values(RANK, "float64")), jnp.asarray(values(RANK, "float64", 8))
    results = [program(a, b) for _ in range(10)]  # queued: none waited for yet
    everyone = [values(r, "float64", 8) for r in range(G)]
    want = (
        outside(values(RANK, "float64")),
        everyone[G - 1],
        outside(3 * everyone[RANK]) + everyone[0],
        np.max(2 * np.stack(everyone), axis=0),
        outside(5 * everyone[RANK]),
    )
    ok = all(np.array_equal(np.asarray(g), w) for r in results for g, w in zip(r, want, strict=True))
    assert everywhere(WORLD, ok)


@pytest.mark.mpi
def test_grad_is_what_the_math_says(path: str) -> None:
    """The objective is the sum of every rank's loss L_r = sum(w_r * f(x_r, ...)), w_r = r + 1."""
    x = jnp.asarray(values(RANK, "float64", 8))
    w = float(RANK + 1)
    weights = sum(range(1, G + 1))  # sum over ranks of w_r
    # y = sum_r x_r on every rank: d/dx_r sum_r' w_r' sum(y) = sum_r' w_r'
    grad = jax.jit(jax.grad(lambda a: w * jnp.sum(hj.allreduce(a))))(x)
    assert everywhere(WORLD, np.allclose(np.asarray(grad), weights))
    mean = jax.grad(lambda a: w * jnp.sum(hj.allreduce(a, op="mean")))(x)
    assert everywhere(WORLD, np.allclose(np.asarray(mean), weights / G))
    # rows[k] = x_k: d/dx_k sum_r' w_r' (k + 1) sum(rows[k]) = (k + 1) sum_r' w_r'
    scale = jnp.arange(1.0, G + 1)[:, None]
    gathered = jax.grad(lambda a: w * jnp.sum(hj.allgather(a) * scale))(x)
    assert everywhere(WORLD, np.allclose(np.asarray(gathered), (RANK + 1) * weights))
    # part_r = (sum_k x_k)[part r]: d/dx_k sum_r' w_r' sum(part_r') = w_r' on part r'
    even = jnp.asarray(values(RANK, "float64", 4 * G))
    scattered = jax.grad(lambda a: w * jnp.sum(hj.reduce_scatter(a)))(even)
    assert everywhere(WORLD, np.allclose(np.asarray(scattered), np.repeat(np.arange(1.0, G + 1), 4)))
    # y_r = x_root: d/dx_root = sum_r' w_r', 0 elsewhere
    broadcast = jax.grad(lambda a: w * jnp.sum(hj.broadcast(a, root=0)))(x)
    assert everywhere(WORLD, np.allclose(np.asarray(broadcast), weights if RANK == 0 else 0.0))
    with pytest.raises(NotImplementedError, match=r"jax\.grad goes through op 'sum' and 'mean'"):
        jax.grad(lambda a: jnp.sum(hj.allreduce(a, op="max")))(x)


@pytest.mark.mpi
@needs_ffi
def test_vmap_is_one_call_per_batch() -> None:
    """A batch of 5 is one call of the handler, and each element's result is its own call's
    (small integers: exact in any order, since a batched buffer is cut into other segments than
    one element's, and from 3 ranks on the ring adds a segment's contributions in another order)."""
    from hpcring import _jax_ffi

    whole = ((np.arange(N) + RANK) % 5 + 1).astype(np.float32)
    batch = jnp.stack([jnp.asarray(whole) * (k + 1) for k in range(5)])
    for collective in (hj.allreduce, hj.reduce_scatter, hj.allgather, hj.broadcast):
        batched = jax.jit(jax.vmap(collective))
        jax.block_until_ready(batched(batch))  # compiled
        before = _jax_ffi.calls()
        got = np.asarray(batched(batch))
        calls = _jax_ffi.calls() - before
        single = jax.jit(collective)
        want = np.stack([np.asarray(single(row)) for row in batch])
        assert everywhere(WORLD, calls == 1 and np.array_equal(got, want)), collective.__name__


@pytest.mark.mpi
@needs_ffi
def test_a_mismatch_inside_jit_raises_on_every_rank() -> None:
    """One rank's array one element longer: every rank raises, each with hpcring's exception type
    and message inside XLA's runtime error, before any data moves."""
    if G == 1:
        pytest.skip("needs a second rank to differ")
    call = jax.jit(lambda a: hj.allreduce(a))
    same = jnp.asarray(values(RANK, "float32"))
    want = outside(values(RANK, "float32"))
    assert everywhere(WORLD, np.array_equal(np.asarray(call(same)), want))  # compiled: the fast path
    x = jnp.asarray(values(RANK, "float32", N + (RANK == G - 1)))
    start, ok = time.monotonic(), False
    try:
        jax.block_until_ready(call(x))
    except FAILED as error:
        ok = "ValueError: hpcring.allreduce" in str(error)
    assert everywhere(WORLD, ok and time.monotonic() - start < 10)
    assert everywhere(WORLD, np.array_equal(np.asarray(call(same)), want))  # and the communicator goes on


@pytest.mark.mpi
@needs_ffi
def test_a_stall_inside_jit_names_the_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last rank skips a warm call: every other raises hpcring's StallError (inside XLA's
    error) naming it, within HPCRING_TIMEOUT. At 2 ranks only: what is tested is the error's way
    out of XLA (test_stall.py has the stall itself at every rank count), and each run waits 3 s."""
    if G != 2:
        pytest.skip("runs at 2 ranks")
    monkeypatch.setenv("HPCRING_TIMEOUT", "2")
    config.reload()
    comm = WORLD.Dup()  # takes the 2 s at its first use
    call = jax.jit(lambda a: hj.allreduce(a, comm=comm))
    x = jnp.ones(64)
    jax.block_until_ready(call(x))  # warm, on every rank
    ok = True
    if RANK != G - 1:
        start = time.monotonic()
        try:
            jax.block_until_ready(call(x))
            ok = False
        except FAILED as error:
            text, elapsed = str(error), time.monotonic() - start
            ok = "hpcring.errors.StallError" in text and f"rank {G - 1} did not arrive" in text
            ok &= 1.9 <= elapsed <= 4.0
    assert everywhere(WORLD, ok)
    comm.Free()


@pytest.mark.mpi
@needs_ffi
def test_the_first_call_on_a_fresh_communicator() -> None:
    """A jitted call is the first hpcring call a communicator sees: its duplicate is made while
    tracing, the first call's path (validation, agreement, auto's choice) runs inside XLA's
    call, and the result is right, twice."""
    comm = WORLD.Dup()
    call = jax.jit(lambda a: hj.allreduce(a, op="mean", comm=comm))
    x = jnp.asarray(values(RANK, "float64"))
    results = [np.asarray(call(x)) for _ in range(2)]
    want = outside(values(RANK, "float64"), op="mean")
    assert everywhere(WORLD, all(np.array_equal(r, want) for r in results))
    comm.Free()


@needs_ffi
def test_a_donated_operand_is_written_in_place() -> None:
    """donate_argnums: the result is the donated buffer (no copy); an argument not donated is
    left as it was, the result in a buffer of its own."""
    self_ = MPI.COMM_SELF
    x = jnp.arange(1024.0)
    address = x.unsafe_buffer_pointer()
    donated = jax.jit(lambda a: hj.allreduce(a, comm=self_), donate_argnums=0)(x)
    assert donated.unsafe_buffer_pointer() == address and x.is_deleted()
    y = jnp.arange(1024.0)
    kept = jax.jit(lambda a: hj.allreduce(a, comm=self_))(y)
    assert kept.unsafe_buffer_pointer() != y.unsafe_buffer_pointer()
    assert np.array_equal(np.asarray(y), np.arange(1024.0)) and np.array_equal(
        np.asarray(kept), np.asarray(y)
    )


@pytest.mark.mpi
def test_the_bench_times_the_jitted_step() -> None:
    """python -m hpcring.bench --framework jax: a row per size, each result checked, exit 0."""
    from hpcring.bench import main

    assert main(["--framework", "jax", "-b", "1K", "-e", "4K", "-f", "4", "-n", "3", "-w", "1"]) == 0


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--collective", "broadcast"], "--framework jax: the all-reduce with op sum only"),
        (["-d", "int32"], "--framework jax: a float dtype, not int32"),
        (["--tune", "--no-agree"], "--framework jax: --tune, --no-agree apply to the sweep"),
    ],
)
def test_the_bench_refuses_what_the_jitted_step_has_no_use_for(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpcring.bench import main

    assert main(["--framework", "jax", *argv]) == 2
    assert said in capsys.readouterr().err


def test_info_says_which_path_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """hpcring.info()["jax"]: "ffi" where the target built, "callback" and why otherwise. CI sets
    HPCRING_REQUIRE_CORE=1: there the target must have built (JAX is installed)."""
    import os

    from hpcring.jax_ffi import describe

    if os.environ.get("HPCRING_REQUIRE_CORE") == "1":
        assert FFI, f"HPCRING_REQUIRE_CORE=1, but hpcring.jax has no FFI target: {jax_ffi.target()[1]}"

    monkeypatch.setattr(jax_ffi, "_STATE", [])
    monkeypatch.setenv("HPCRING_JAX", "callback")
    config.reload()
    assert describe() == ("callback", "HPCRING_JAX=callback")
    monkeypatch.delenv("HPCRING_JAX")
    config.reload()
    path, why = describe()
    assert (path == "ffi") == FFI, why


@needs_ffi
def test_the_cuda_handler_skips_cleanly_without_a_device() -> None:
    """Built where CUDA is (here, without a GPU): importable, and registered only where JAX has a
    CUDA backend and a device is there; the reason says which."""
    cuda = pytest.importorskip("hpcring._jax_ffi_cuda", reason="the CUDA handler is built where CUDA is")
    why = jax_ffi.target()[1]
    if cuda.devices() == 0:
        assert "the CUDA handler is built, no CUDA device here" in why
    else:
        assert "CUDA" in why
