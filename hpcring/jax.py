"""hpcring's collectives inside ``jax.jit``: `allreduce`, `reduce_scatter`, `allgather`, `broadcast`.

    import hpcring.jax
    step = jax.jit(lambda g: hpcring.jax.allreduce(g, op="mean"))   # inside jit, and outside

Each is a JAX primitive that XLA lowers to hpcring's FFI target (`hpcring.jax_ffi`): the compiled
program calls hpcring's engine in place, on XLA's own buffers, with no copy and no trip through
JAX's callback machinery, and the collective runs as `hpcring.allreduce` runs it outside ``jit``
(its agreement, timeouts and `StallError`, every algorithm and dtype), giving the same bits. A
jitted function holding them stays on JAX's fast C++ dispatch path (no JAX effect: the ranks'
order comes from XLA tokens, `hpcring.jax_ffi` says how). Where the target did not build
(it builds where JAX is installed) or ``HPCRING_JAX=callback``, the same functions run as ordered
``io_callback``\\ s (`hpcring.jax_callback`), with the same results; ``hpcring.info()["jax"]`` says
which path runs and why.

``jax.grad`` goes through them, as the math of data parallelism says, taking the objective to
be the sum of every rank's loss: the cotangent of a sum all-reduce is the sum all-reduce of the
cotangents (a mean's: their mean), an all-gather's is the reduce-scatter of its cotangent, a
reduce-scatter's the all-gather of its cotangent (equal parts only), and a broadcast's is the
sum of the cotangents on the root and zero elsewhere. max, min and prod have no rule: grad
through them raises. ``jax.vmap`` makes one call of the whole batch, not one per element.

An all-reduce whose operand is an intermediate value of the program writes its result over it
(gradients, mostly: no second buffer and no copy; where the program still uses the operand
afterwards, XLA copies it first). One whose operand is an argument of the jitted function
writes a new buffer, without a copy; donate the argument (``donate_argnums``) and the result is
written over it.

CPU arrays (and CUDA arrays, staged through host memory, where the CUDA handler is built);
``comm`` defaults to COMM_WORLD.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir, xla
from mpi4py import MPI

from . import jax_callback, jax_ffi
from .algorithms import ALLGATHER, ALLREDUCE, BROADCAST, REDUCE_SCATTER, table
from .comm import intracomm, known_state, state_of
from .ops import op_name
from .partition import segment

LINEAR = ("sum", "mean")  # the ops jax.grad goes through


class _Comm:
    """A communicator as a primitive's parameter (hashable, by its handle); None: COMM_WORLD."""

    __slots__ = ("comm",)

    def __init__(self, comm: MPI.Intracomm | None) -> None:
        self.comm = comm

    def __hash__(self) -> int:
        return hash(None if self.comm is None else self.comm.handle)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Comm):
            return NotImplemented
        if self.comm is None or other.comm is None:
            return self.comm is other.comm
        return self.comm.handle == other.comm.handle

    def __repr__(self) -> str:
        return "COMM_WORLD" if self.comm is None else repr(self.comm)

    def sized(self, caller: str) -> tuple[int, int]:
        comm = intracomm(self.comm, caller)
        return comm.Get_size(), comm.Get_rank()


def _ffi() -> bool:
    return jax_ffi.target()[0] is not None


# -- the primitives ---------------------------------------------------------------------------------


def _primitive(name: str) -> Primitive:
    made = Primitive(f"hpcring_{name}")
    made.def_impl(partial(xla.apply_primitive, made))
    return made


allreduce_p = _primitive(ALLREDUCE)
reduce_scatter_p = _primitive(REDUCE_SCATTER)
allgather_p = _primitive(ALLGATHER)
broadcast_p = _primitive(BROADCAST)


def _shape_of(collective: str, shape: tuple[int, ...], comm: _Comm) -> tuple[int, ...]:
    """The result's shape on this rank."""
    if collective == REDUCE_SCATTER:
        size, rank = comm.sized("hpcring.jax.reduce_scatter")
        start, stop = segment(int(np.prod(shape, dtype=np.int64)), size, rank)
        return (stop - start,)
    if collective == ALLGATHER:
        return (comm.sized("hpcring.jax.allgather")[0], *shape)
    return tuple(shape)


def _abstract(collective: str) -> Any:
    def rule(x: Any, *, comm: _Comm, **_: Any) -> Any:
        return jax.core.ShapedArray(_shape_of(collective, x.shape, comm), x.dtype)

    return rule


PRIMITIVES = {
    ALLREDUCE: allreduce_p,
    REDUCE_SCATTER: reduce_scatter_p,
    ALLGATHER: allgather_p,
    BROADCAST: broadcast_p,
}
for _collective, _made in PRIMITIVES.items():
    _made.def_abstract_eval(_abstract(_collective))


def _site_args(collective: str, params: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """engine.call's arguments for a call site (x and out left None), and a hashable key of them."""
    comm: _Comm = params["comm"]
    op = params.get("op")
    root = params.get("root", 0)
    reproducible = params.get("reproducible", False)
    args = (collective, None, None, op, params["algorithm"], comm.comm, True, None, root, reproducible, None)
    key = (collective, op, params["algorithm"], comm, root, reproducible)
    return args, key


def _lowering(collective: str) -> Any:
    def rule(ctx: Any, x: Any, **params: Any) -> list[Any]:
        module, why = jax_ffi.target()
        if module is None:
            raise RuntimeError(f"hpcring.jax: the FFI target is not there ({why})")
        args, key = _site_args(collective, params)
        number = jax_ffi.site(module, collective, args, key)
        # over its operand where that costs no copy
        alias = collective in (ALLREDUCE, BROADCAST) and jax_ffi.reusable(x)
        return jax_ffi.lower(ctx, x, number=number, alias=alias)

    return rule


_LOWERED: set[tuple[str, str]] = set()


def _register_lowerings() -> None:
    """The primitives' lowerings, for the platforms the FFI target was registered for."""
    for collective, made in PRIMITIVES.items():
        for platform in jax_ffi.platforms():
            if (made.name, platform) not in _LOWERED:
                # Not cacheable: a cached lowering is built in a function of its own and then
                # inlined, where its token could not join the chain of the block it lands in.
                mlir.register_lowering(made, _lowering(collective), platform=platform, cacheable=False)
                _LOWERED.add((made.name, platform))


# -- jax.grad: the math of data parallelism ------------------------------------------------------------


def _linear_only(collective: str, op: str) -> None:
    if op not in LINEAR:
        raise NotImplementedError(
            f"hpcring.jax.{collective}: jax.grad goes through op 'sum' and 'mean', not {op!r}"
        )


def _jvp(made: Primitive, collective: str) -> Any:
    """A linear collective's tangent is the collective of the tangent."""

    def rule(primals: Any, tangents: Any, **params: Any) -> tuple[Any, Any]:
        (x,), (t,) = primals, tangents
        y = made.bind(x, **params)
        if type(t) is ad.Zero:
            return y, ad.Zero(jax.core.ShapedArray(y.shape, y.dtype).to_tangent_aval())
        if "op" in params:
            _linear_only(collective, params["op"])
        return y, made.bind(t, **params)

    return rule


def _allreduce_transpose(ct: Any, x: Any, **params: Any) -> list[Any]:
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    _linear_only(ALLREDUCE, params["op"])
    return [allreduce_p.bind(ct, **params)]


def _reduce_scatter_transpose(ct: Any, x: Any, *, op: str, algorithm: str, comm: _Comm) -> list[Any]:
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    shape = x.aval.shape
    size, _ = comm.sized("hpcring.jax.reduce_scatter")
    if op not in LINEAR or int(np.prod(shape, dtype=np.int64)) % size:
        raise NotImplementedError(
            "hpcring.jax.reduce_scatter: jax.grad goes through op 'sum' and 'mean' with equal parts "
            f"(a size divisible by {size}), not op {op!r} over {shape}"
        )
    gathered = allgather_p.bind(ct, algorithm=_named(ALLGATHER, algorithm), comm=comm)
    return [(gathered / size if op == "mean" else gathered).reshape(shape)]


def _allgather_transpose(ct: Any, x: Any, *, algorithm: str, comm: _Comm) -> list[Any]:
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    part = reduce_scatter_p.bind(ct, op="sum", algorithm=_named(REDUCE_SCATTER, algorithm), comm=comm)
    return [part.reshape(x.aval.shape)]  # row r of every rank's cotangent, summed


def _broadcast_transpose(ct: Any, x: Any, *, root: int, algorithm: str, comm: _Comm) -> list[Any]:
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    total = allreduce_p.bind(
        ct, op="sum", algorithm=_named(ALLREDUCE, algorithm), comm=comm, reproducible=False
    )
    _, rank = comm.sized("hpcring.jax.broadcast")
    return [total if rank == root else jnp.zeros_like(total)]


def _named(collective: str, algorithm: str, otherwise: str = "ring") -> str:
    """``algorithm`` where ``collective`` has one of that name (auto included), else ``otherwise``."""
    return algorithm if algorithm in table(collective) else otherwise


ad.primitive_jvps[allreduce_p] = _jvp(allreduce_p, ALLREDUCE)
ad.primitive_jvps[reduce_scatter_p] = _jvp(reduce_scatter_p, REDUCE_SCATTER)
ad.primitive_jvps[allgather_p] = _jvp(allgather_p, ALLGATHER)
ad.primitive_jvps[broadcast_p] = _jvp(broadcast_p, BROADCAST)
ad.primitive_transposes[allreduce_p] = _allreduce_transpose
ad.primitive_transposes[reduce_scatter_p] = _reduce_scatter_transpose
ad.primitive_transposes[allgather_p] = _allgather_transpose
ad.primitive_transposes[broadcast_p] = _broadcast_transpose


# -- jax.vmap: one call of the whole batch --------------------------------------------------------------


def _elementwise_batch(made: Primitive) -> Any:
    """All-reduce and broadcast act element by element: the batch goes through as it is."""

    def rule(args: Any, dims: Any, **params: Any) -> tuple[Any, int]:
        return made.bind(args[0], **params), dims[0]

    return rule


def _allgather_batch(args: Any, dims: Any, **params: Any) -> tuple[Any, int]:
    (x,), (d,) = args, dims
    return allgather_p.bind(x, **params), d + 1  # every rank's batch, stacked in front


def _reduce_scatter_batch(args: Any, dims: Any, *, op: str, algorithm: str, comm: _Comm) -> tuple[Any, int]:
    """Each element's parts laid out part by part, so that this rank's part of the whole is its
    part of every element: (G, B, L) where L is the longest part, shorter parts padded."""
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)
    batch, n = x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64))
    size, rank = comm.sized("hpcring.jax.reduce_scatter")
    flat = x.reshape(batch, n)
    bounds = [segment(n, size, r) for r in range(size)]
    longest = max(stop - start for start, stop in bounds)
    # part r's elements, then repeats of an element of x where part r is shorter (sliced off below)
    index = np.clip(np.array([start for start, _ in bounds])[:, None] + np.arange(longest), 0, max(n - 1, 0))
    laid = jnp.moveaxis(flat[:, index], 1, 0) if n else jnp.zeros((size, batch, longest), x.dtype)
    part = reduce_scatter_p.bind(laid.reshape(-1), op=op, algorithm=algorithm, comm=comm)
    start, stop = bounds[rank]
    return part.reshape(batch, longest)[:, : stop - start], 0


batching.primitive_batchers[allreduce_p] = _elementwise_batch(allreduce_p)
batching.primitive_batchers[broadcast_p] = _elementwise_batch(broadcast_p)
batching.primitive_batchers[allgather_p] = _allgather_batch
batching.primitive_batchers[reduce_scatter_p] = _reduce_scatter_batch


# -- the public functions ---------------------------------------------------------------------------------


def _bind(made: Primitive, x: Any, **params: Any) -> jax.Array:
    """Bind a primitive, after making hpcring's duplicate of the communicator now, while tracing:
    in program order, on the thread that traces, as a first call outside jit makes it, so that
    no compiled program ever runs a collective on the user's communicator (a first call from
    inside one would, on XLA's thread, beside the user's own calls)."""
    _register_lowerings()
    comm = params.pop("comm")
    plain = intracomm(comm, f"hpcring.jax.{made.name.removeprefix('hpcring_')}")
    if known_state(plain) is None:
        state_of(plain)
    return made.bind(jnp.asarray(x), comm=_Comm(comm), **params)


def allreduce(
    x: Any,
    *,
    op: str = "sum",
    algorithm: str = "ring",
    comm: MPI.Intracomm | None = None,
    reproducible: bool = False,
) -> jax.Array:
    """`hpcring.allreduce` of ``x`` over ``comm``, inside ``jit`` or outside: a new array."""
    if not _ffi():
        return jax_callback.allreduce(x, op=op, algorithm=algorithm, comm=comm, reproducible=reproducible)
    return _bind(allreduce_p, x, op=_op(op), algorithm=algorithm, comm=comm, reproducible=bool(reproducible))


def reduce_scatter(
    x: Any, *, op: str = "sum", algorithm: str = "ring", comm: MPI.Intracomm | None = None
) -> jax.Array:
    """`hpcring.reduce_scatter`: this rank's part (numpy.array_split's) of the reduction of ``x``."""
    if not _ffi():
        return jax_callback.reduce_scatter(x, op=op, algorithm=algorithm, comm=comm)
    return _bind(reduce_scatter_p, x, op=_op(op), algorithm=algorithm, comm=comm)


def allgather(x: Any, *, algorithm: str = "ring", comm: MPI.Intracomm | None = None) -> jax.Array:
    """`hpcring.allgather`: every rank's ``x``, stacked in rank order, shape ``(G, *x.shape)``."""
    if not _ffi():
        return jax_callback.allgather(x, algorithm=algorithm, comm=comm)
    return _bind(allgather_p, x, algorithm=algorithm, comm=comm)


def broadcast(
    x: Any, *, root: int = 0, algorithm: str = "ring", comm: MPI.Intracomm | None = None
) -> jax.Array:
    """`hpcring.broadcast`: the root's ``x`` on every rank (a new array)."""
    if not _ffi():
        return jax_callback.broadcast(x, root=root, algorithm=algorithm, comm=comm)
    return _bind(broadcast_p, x, root=root, algorithm=algorithm, comm=comm)


def _op(op: Any) -> Any:
    """mpi4py's MPI.SUM... as their names (a primitive's parameters must hash); anything else as
    it is, for the engine's validation to name on every rank."""
    try:
        return op_name(op)
    except (TypeError, ValueError):
        return op if isinstance(op, str) else repr(op)


__all__ = ["allgather", "allreduce", "broadcast", "reduce_scatter"]
