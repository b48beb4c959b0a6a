"""`GradientSync`: many gradients fused into a few flat buckets, each all-reduced as soon as it is complete.

One all-reduce per gradient pays the latency (and the agreement step) once per array;
a model with hundreds of small arrays spends its step waiting. Here the gradients live
in a few flat buffers ("buckets", one dtype each, at most ``bucket_bytes``) and
`GradientSync.grads` are views into them, so backprop writes straight into what gets
sent: no copy in, no copy out. Buckets follow reverse layer order, the order backprop
produces gradients in, and the first one is small, so the first all-reduce starts
after the last layer's backward instead of after most of the model's.

A step:

    for i in reversed(range(len(params))):   # backward, last layer first
        compute into sync.grads[i]            # e.g. np.matmul(a.T, d, out=sync.grads[i])
        sync.ready(i)                         # launches a bucket when its last gradient is in
    sync.wait()                               # all buckets reduced; sync.grads hold the result
    optimizer step from sync.grads

Buckets launch in bucket order whatever order `ready` is called in, so every rank
submits the same sequence of all-reduces.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mpi4py import MPI

from . import config
from . import wire as wire_dtypes
from .agreement import by_value
from .arrays import NUMPY, Adapter, adapter_for
from .comm import state_of
from .nonblocking import Progress, iallreduce, progress_for
from .ops import op_name, supported
from .persistent import plan
from .polling import arrive

MiB = 1 << 20


@dataclass
class Bucket:
    """One flat buffer and the gradients (indices into the user's list) that live in it."""

    dtype: np.dtype
    members: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # element offsets, parallel to members
    count: int = 0
    buffer: Any = None
    pending: int = 0  # members not yet marked ready this step
    request: Any = None  # this step's: a `Request`, or a started plan (`_Started`)
    plan: Any = None  # an `hpcring.plan` whose runs proceed while backprop goes on, where one exists
    planned: bool | None = None  # whether this bucket runs its plan (None: not decided yet)

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


def plan_buckets(
    shapes: Sequence[tuple[int, ...]],
    dtypes: Sequence[np.dtype],
    bucket_bytes: int,
    first_bucket_bytes: int,
) -> list[Bucket]:
    """Group gradients into buckets: reverse order, one dtype each, the first one smaller.

    Pure (no arrays, no MPI). One open bucket per dtype; a gradient that would overflow its
    bucket closes it. A gradient larger than the limit gets a bucket of its own.
    """
    buckets: list[Bucket] = []
    open_for: dict[np.dtype, Bucket] = {}
    for index in reversed(range(len(shapes))):
        dtype = np.dtype(dtypes[index])
        count = int(np.prod(shapes[index], dtype=np.int64))
        bucket = open_for.get(dtype)
        first = bucket is not None and bucket is buckets[0]
        limit = min(first_bucket_bytes, bucket_bytes) if first else bucket_bytes
        if bucket is not None and bucket.count > 0 and (bucket.count + count) * dtype.itemsize > limit:
            bucket = None
        if bucket is None:
            bucket = open_for[dtype] = Bucket(dtype)
            buckets.append(bucket)
        bucket.members.append(index)
        bucket.offsets.append(bucket.count)
        bucket.count += count
    return buckets


@dataclass
class StepStats:
    """Where the last step's communication time went (seconds)."""

    communication: float = 0.0  # time the worker spent all-reducing this step's buckets
    exposed: float = 0.0  # time the caller was blocked in wait()

    @property
    def hidden(self) -> float:
        """Communication that ran while the caller computed."""
        return max(self.communication - self.exposed, 0.0)


class GradientSync:
    """Bucketed, overlapped gradient all-reduce over ``comm`` (collective construction).

    ``grads``: the gradient arrays (NumPy or CuPy, one backend), in layer order. They serve
    as templates: shape, dtype and initial values are copied into the buckets, and from then
    on ``sync.grads[i]`` (a view into a bucket) is gradient ``i``. Every rank must pass the
    same list (count, shapes, dtypes) and arguments; otherwise every rank raises ValueError here.

    ``wire="bfloat16"`` (float32/float64 gradients) sends every bucket narrowed, half the bytes
    (`hpcring.allreduce`'s wire=, docs/compression.md). ``error_feedback=True`` keeps, per rank,
    what narrowing its own gradient lost (``sync.residuals``) and adds it to the next step's
    gradient, so no part of a gradient is lost for good (error feedback, as in EF-SGD).
    """

    def __init__(
        self,
        grads: Sequence[Any],
        *,
        comm: MPI.Intracomm | None = None,
        bucket_bytes: int = 25 * MiB,
        first_bucket_bytes: int = 1 * MiB,
        algorithm: str = "auto",
        op: str | MPI.Op = "mean",
        check: bool = True,
        reproducible: bool = False,
        wire: str | None = None,
        error_feedback: bool = False,
    ) -> None:
        comm = MPI.COMM_WORLD if comm is None else comm
        self.engine: Progress = progress_for(
            comm, "hpcring.GradientSync"
        )  # collective: every rank reaches it
        self.comm = comm
        self.op, self.algorithm, self.check = op, algorithm, check
        self.reproducible = reproducible  # hpcring.allreduce(reproducible=...) for every bucket
        self.wire = wire  # hpcring.allreduce(wire=...) for every bucket
        self.error_feedback = bool(error_feedback)
        try:  # any mistake here is still a verdict for the allgather: no rank may skip it
            self.op = op = op_name(op, "hpcring.GradientSync")  # MPI.SUM -> "sum": ranks compare names
            problem = self._local_problem(grads, bucket_bytes, first_bucket_bytes)
            if problem is None:
                problem = self._wire_problem(grads, wire, error_feedback, reproducible)
            layout = None
            if problem is None:  # every gradient is an array of one kind
                adapter = adapter_for(grads[0]) if grads else NUMPY
                layout = [(tuple(adapter.shape(g)), str(adapter.dtype(g))) for g in grads]
            mine = (
                problem,
                layout,
                # "reproducible" only where set: the settings of a plain sync read as before
                (
                    op,
                    algorithm,
                    int(bucket_bytes),
                    int(first_bucket_bytes),
                    *(["reproducible"] if reproducible else []),
                    *([f"wire={wire}"] if wire is not None else []),
                    *(["error_feedback"] if error_feedback else []),
                ),
            )
        except (TypeError, ValueError) as error:  # bucket_bytes=None, grads not a list, ...
            mine = (f"bad argument ({type(error).__name__}: {error})", None, None)
        # Every rank is known to be here before the allgather (a bounded barrier), so a rank that
        # never builds its GradientSync is a StallError on the others, not a hang.
        waiter = state_of(self.engine.comm).agreement.waiter
        arrive(waiter, config.current().timeout, "GradientSync's bucket agreement")
        _agree(comm.allgather(mine))
        # The user's arrays are asked through their adapter; the buckets are its native arrays.
        self.backend: Adapter = adapter_for(grads[0]) if grads else NUMPY
        self.shapes = [tuple(self.backend.shape(g)) for g in grads]
        dtypes = [self.backend.dtype(g) for g in grads]
        self.buckets = plan_buckets(self.shapes, dtypes, bucket_bytes, first_bucket_bytes)
        self._where: dict[int, tuple[int, int]] = {}  # gradient -> (bucket, position in bucket)
        self.grads: list[Any] = [None] * len(grads)
        for b, bucket in enumerate(self.buckets):
            bucket.buffer = self.backend.empty(bucket.count, bucket.dtype)
            for position, (index, offset) in enumerate(zip(bucket.members, bucket.offsets, strict=True)):
                size = int(self.backend.size(grads[index]))
                view = bucket.buffer[offset : offset + size].reshape(self.shapes[index])
                view[...] = grads[index]
                self.grads[index] = view
                self._where[index] = (b, position)
        self._pointers = [self._pointer(v) for v in self.grads]
        # Error feedback: per bucket, what this rank's own narrowing lost last step (added to the
        # next step's gradient before it is narrowed again), and a wire buffer to narrow into.
        self.residuals: list[Any] = []
        self._narrowed: list[Any] = []
        if self.error_feedback:
            narrow = wire_dtypes.wire_dtype(wire)
            for bucket in self.buckets:
                self.residuals.append(self.backend.empty(bucket.count, bucket.dtype))
                self.residuals[-1].fill(0)
                self._narrowed.append(self.backend.empty(bucket.count, narrow))
        self.stats = StepStats()
        self._reset()

    @staticmethod
    def _local_problem(grads: Sequence[Any], bucket_bytes: int, first_bucket_bytes: int) -> str | None:
        """What is wrong with this rank's arguments, as a message (None: nothing)."""
        if bucket_bytes <= 0 or first_bucket_bytes <= 0:
            return f"bucket sizes must be > 0, got {bucket_bytes} and {first_bucket_bytes}"
        kinds = set()
        for i, g in enumerate(grads):
            try:
                adapter = adapter_for(g)
            except TypeError:
                return f"gradient {i} is a {type(g).__name__}, not a NumPy or CuPy array"
            kinds.add(adapter.kind)
            dtype = adapter.dtype(g)
            if not supported(dtype):
                return f"gradient {i} has dtype {dtype}, which hpcring cannot reduce"
        if len(kinds) > 1:
            return "gradients mix NumPy and CuPy arrays; keep them on one device"
        return None

    @staticmethod
    def _wire_problem(grads: Sequence[Any], wire: Any, error_feedback: Any, reproducible: bool) -> str | None:
        """What is wrong with ``wire`` and ``error_feedback`` here, as a message (None: nothing)."""
        if wire is None:
            return "error_feedback=True needs a wire= (nothing is narrowed)" if error_feedback else None
        if not isinstance(wire, str) or wire not in wire_dtypes.WIRE_NAMES:
            return f"unknown wire {wire!r}; choose one of {', '.join(wire_dtypes.WIRE_NAMES)} or None"
        if reproducible:
            return "reproducible=True and wire= cannot be combined"
        for i, g in enumerate(grads):
            dtype = adapter_for(g).dtype(g)
            if dtype not in wire_dtypes.WIDE:
                return f"gradient {i} has dtype {dtype}; wire= applies to float32 and float64"
        return None

    def _feed_back(self, b: int) -> None:
        """Error feedback (EF-SGD, 1-bit Adam): the bucket becomes g + e rounded to the wire, and
        e becomes what that rounding lost. This rank's own contribution then travels exactly,
        and what it could not send is sent in a later step instead of being dropped."""
        buffer, residual = self.buckets[b].buffer, self.residuals[b]
        buffer += residual
        residual[...] = buffer
        wire_dtypes.round_trip(buffer, self._narrowed[b])
        residual -= buffer

    # -- one step ------------------------------------------------------------------------------

    def _reset(self) -> None:
        self._ready = [False] * len(self.grads)
        for bucket in self.buckets:
            bucket.pending = len(bucket.members)
            bucket.request = None
        self._next = 0  # the next bucket to launch: buckets launch in order
        self._step_start: float | None = None

    def _pointer(self, array: Any) -> int:
        return self.backend.data_pointer(array) if array.size else -1

    def _check_view(self, index: int) -> None:
        view = self.grads[index]
        if view.shape != self.shapes[index] or self._pointer(view) != self._pointers[index]:
            raise ValueError(
                f"hpcring.GradientSync: gradient {index} changed after construction (shape "
                f"{self.shapes[index]} -> {view.shape}); build a new GradientSync for a new model"
            )

    def ready(self, index: int, grad: Any = None) -> None:
        """Gradient ``index`` is computed: launch its bucket if that completes it (and all before it).

        With ``grad`` (an array of the registered shape and dtype that is not already
        ``sync.grads[index]``), it is copied into the bucket first: for loops that produce
        fresh gradient arrays.
        """
        if not 0 <= index < len(self.grads):
            raise IndexError(
                f"hpcring.GradientSync.ready: gradient {index} out of range 0..{len(self.grads) - 1}"
            )
        b, _ = self._where[index]
        if self._ready[index]:
            raise RuntimeError(
                f"hpcring.GradientSync.ready: gradient {index} is already marked ready this step, so "
                f"bucket {b} would launch twice; call wait() to finish the step first"
            )
        self._check_view(index)
        if grad is not None and grad is not self.grads[index]:
            shape, dtype = tuple(self.backend.shape(grad)), self.backend.dtype(grad)
            if shape != self.shapes[index] or dtype != self.grads[index].dtype:
                raise ValueError(
                    f"hpcring.GradientSync.ready: gradient {index} has shape {shape} and "
                    f"dtype {dtype}, but was registered as {self.shapes[index]} "
                    f"{self.grads[index].dtype}"
                )
            self.grads[index][...] = grad
        if self._step_start is None:
            self._step_start = time.perf_counter()
        self._ready[index] = True
        self.buckets[b].pending -= 1
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            self._launch(self._next)

    def _launch(self, b: int) -> None:
        bucket = self.buckets[b]
        if self.error_feedback:
            self._feed_back(b)
        if bucket.planned is None:  # its first launch: collective, and buckets launch in order
            bucket.planned = self._plan(bucket)
        if bucket.planned:
            bucket.request = _Started(bucket.plan)
            self._next = b + 1
            return
        bucket.request = iallreduce(
            bucket.buffer,
            op=self.op,
            algorithm=self.algorithm,
            comm=self.comm,
            check=self.check,
            reproducible=self.reproducible,
            wire=self.wire,
        )
        self._next = b + 1

    def _plan(self, bucket: Bucket) -> bool:
        """Give ``bucket`` a plan where its runs proceed on their own (MPI-4's persistent
        all-reduce: `mpi`, or `auto` where it chooses `mpi`), agreed once; elsewhere the bucket
        goes through `iallreduce`, whose worker thread gives the overlap."""
        if self.reproducible or self.wire is not None:
            return False
        made = plan(bucket.buffer, op=self.op, algorithm=self.algorithm, comm=self.comm)
        if made.persistent:
            bucket.plan = made
            return True
        made.free()
        return False

    def ready_all(self) -> None:
        """Mark every gradient not yet marked ready (no overlap: the whole model is computed)."""
        for index in range(len(self.grads)):
            if not self._ready[index]:
                self.ready(index)

    def wait(self) -> list[Any]:
        """Block until every bucket is reduced; return ``self.grads`` and start a new step.

        Every gradient must have been marked ready; the first error of a bucket's
        all-reduce (raised on every rank) comes out here.
        """
        if self._next == 0 and self.buckets:
            raise RuntimeError(
                "hpcring.GradientSync.wait: no bucket was launched this step; call ready(i) for each "
                "gradient as backprop produces it (or ready_all()) before wait()"
            )
        missing = [i for i, done in enumerate(self._ready) if not done]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            raise RuntimeError(
                f"hpcring.GradientSync.wait: gradients {shown} were never marked ready this step; "
                "the other ranks' buckets cannot complete without them"
            )
        blocked = time.perf_counter()
        try:
            for bucket in self.buckets:
                assert bucket.request is not None
                bucket.request.wait()
        finally:
            done = time.perf_counter()
            self.stats = StepStats(
                communication=sum(b.request.seconds for b in self.buckets if b.request is not None),
                exposed=done - blocked,
            )
            self._reset()
        return self.grads

    def zero(self) -> None:
        """Set every gradient to zero (one fill per bucket), for loops that accumulate."""
        for bucket in self.buckets:
            bucket.buffer.fill(0)

    def __len__(self) -> int:
        return len(self.grads)


class _Started:
    """A bucket's started plan, waited for as a `Request` is."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self.started = time.perf_counter()
        self.finished: float | None = None
        plan.start()

    def wait(self) -> Any:
        try:
            return self.plan.wait()
        finally:
            self.finished = time.perf_counter()

    @property
    def seconds(self) -> float:
        return 0.0 if self.finished is None else self.finished - self.started


def _agree(rows: list[Any]) -> None:
    """Raise the same ValueError on every rank when ranks' arguments or gradient lists differ."""
    failed = [(r, row[0]) for r, row in enumerate(rows) if row[0] is not None]
    if failed:
        r, message = failed[0]
        raise ValueError(f"hpcring.GradientSync: rank {r}: {message}")
    settings = [row[2] for row in rows]
    if any(s != settings[0] for s in settings):
        detail = "; ".join(f"rank {r}: op, algorithm, bucket sizes = {s}" for r, s in enumerate(settings))
        raise ValueError(f"hpcring.GradientSync: ranks disagree on arguments: {detail}")
    lists = [row[1] for row in rows]
    counts = [len(grads) for grads in lists]
    if any(c != counts[0] for c in counts):
        detail = ", ".join(f"rank {r}: {c}" for r, c in enumerate(counts))
        raise ValueError(f"hpcring.GradientSync: ranks pass different numbers of gradients ({detail})")
    for index in range(counts[0]):
        entries = [grads[index] for grads in lists]
        if any(e != entries[0] for e in entries):
            detail = by_value(entries, lambda entry: f"shape {entry[0]} dtype {entry[1]}")
            raise ValueError(f"hpcring.GradientSync: gradient {index} differs between ranks: {detail}")
