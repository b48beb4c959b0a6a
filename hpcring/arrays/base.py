"""What an array adapter answers: the questions the API asks about a user's array, and the
compute side the channel and the algorithms run on.

An adapter owns one kind of user array (``numpy``: `numpy.ndarray`; ``cupy``: `cupy.ndarray`).
It has two faces:

- **The user's array**, asked by `api` (validation, the agreement row) and `training`: is it
  C-contiguous and writeable (`flags`), its dtype (always a NumPy dtype, so one table of
  supported dtypes and ops serves every kind), shape, size and bytes, whether it is on the
  device this rank computes on, whether two arrays overlap or are the very same bytes, and
  `flat`: the 1-D *native* view the algorithms run on. The API never reads these from the
  array itself, so a new kind answers them its own way.
- **The compute side** (what used to be ``Backend``), used by `Channel` and the algorithms on
  native arrays (NumPy on the host, CuPy on a GPU): ``xp`` (the array module of local
  reductions and scratch), `empty`, `mpi_view` (a buffer MPI may read or write, staged
  through pinned host memory where MPI is not CUDA-aware), `staging` (the streamed pipeline;
  device adapters only), `available_bytes`, `current_device`, `synchronize`, `handoff`,
  `data_pointer`, and the flags ``device`` (the arrays live on a GPU) and ``direct`` (MPI
  reads and writes them in place). Scratch buffers belong to the `Channel` (``scratch``),
  which makes them with `empty`.

The frameworks (PyTorch: `hpcring.arrays.torch`, JAX: `hpcring.arrays.jax`; one file each,
which calls `register` at import, and its lines in `hpcring.arrays.SHIPPED`, the kinds'
fixed numbering):

- A ``torch.Tensor`` adapter answers the first face from the tensor (``is_contiguous()`` in
  `flags`, its dtype mapped to NumPy's, ``t.device``) and hands the algorithms a NumPy view
  of a CPU tensor (``t.numpy()``) or a CuPy view of a CUDA tensor (``cupy.from_dlpack``) from
  `flat`; its compute side is then the NumPy or the CuPy adapter's, inherited. A CPU and a
  CUDA tensor need different compute sides, so it registers two adapters that both decline
  the by-type lookup (``types = ()``) and tell the tensors apart in `owns`.
- A ``jax.Array`` is immutable: its adapter sets ``immutable = True``, says writeable in
  `flags` (the algorithms get a copy), makes `flat` a writable native copy (after the
  agreement and the memory check, where `allreduce` asks for it), and `result` wraps the
  reduced native buffer into a new array, which `allreduce` returns instead of ``x`` or ``out``.

NumPy's answers are bound once as C callables (``operator.attrgetter``, ``ndarray.ravel``),
so a warm call's questions cost what reading the attributes did.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from ..records import Record


class Flags(Record):
    """What `Adapter.flags` answers, for a kind whose arrays' own flags do not say both."""

    c_contiguous: bool
    writeable: bool


def ready_from_questions(adapter: Any, x: Any, out: Any) -> bool:
    """`Adapter.ready` answered from the adapter's other questions (a new kind can start here)."""
    try:
        adapter.check_device(x, "x")
        flags = adapter.flags(x)
        if out is None:
            return bool(flags.c_contiguous and flags.writeable)
        if not (flags.c_contiguous and adapter.owns(out)):
            return False
        adapter.check_device(out, "out")
    except ValueError:
        return False
    flags = adapter.flags(out)
    return bool(
        flags.c_contiguous
        and flags.writeable
        and adapter.shape(out) == adapter.shape(x)
        and adapter.dtype(out) == adapter.dtype(x)
        and not adapter.shares_memory(x, out)
    )


class Adapter(Protocol):
    """One kind of array: the questions about a user's array, then the compute side."""

    kind: str  # the registry's key ("numpy", "cupy"); the ranks' agreement compares kinds
    name: str  # the same word, as `Channel`, `topology` and the trace read it
    type_name: str  # what messages call its arrays: "numpy.ndarray"
    types: tuple[type, ...]  # exact types it owns, for the registry's by-type lookup
    by_type: bool  # `owns` depends on the type alone, so a subclass found once is cached
    # Optional: ``warm_types``, types a warm call asks this adapter about though it does not own
    # them by type alone (its `ready` says no to the others); ``contiguous_fix``, the expression
    # the message for a non-contiguous x suggests ("x.contiguous()"); ``host_view``, a function
    # giving a NumPy array over the memory of an array `ready` took (a CPU tensor's), on which its
    # warm calls run in C, and ``from_host``, the array of this kind over an ndarray they made.
    index: int  # this kind's number in the agreement row, set by `register`
    # `allreduce` returns `result(dst, x)`: its arrays cannot be written (or need a hand-back)
    immutable: bool
    fixed_memory: bool  # an array's memory never moves while it lives: a plan need not look again

    def problem(self) -> str:
        """Why this kind can't compute here ('' when it can): `available` lists those that can."""
        ...

    # -- the user's array ----------------------------------------------------------------
    def owns(self, obj: Any) -> bool:
        """Whether ``obj`` is an array of this kind."""
        ...

    def flags(self, array: Any) -> Any:
        """Two booleans in one question, asked of every array: ``c_contiguous`` (one flat run of
        memory, in row-major order) and ``writeable`` (the result may be written into it).
        NumPy's own flags object; another kind returns any object with those two attributes."""
        ...

    def dtype(self, array: Any) -> np.dtype:
        """The element type, as a NumPy dtype (ml_dtypes' bfloat16 for bfloat16)."""
        ...

    def shape(self, array: Any) -> tuple[int, ...]: ...

    def size(self, array: Any) -> int:
        """Number of elements."""
        ...

    def nbytes(self, array: Any) -> int: ...

    def check_device(self, array: Any, name: str) -> None:
        """ValueError (naming the argument ``name``) if this rank's MPI calls cannot use ``array``."""
        ...

    def shares_memory(self, a: Any, b: Any) -> bool:
        """Whether the bytes of ``a`` and ``b`` meet."""
        ...

    def same_memory(self, a: Any, b: Any) -> bool:
        """Whether ``a`` and ``b`` are the same non-empty bytes (another view of them: in place)."""
        ...

    def flat(self, array: Any) -> Any:
        """The 1-D native array (NumPy or CuPy) over ``array``'s memory that the algorithms run on."""
        ...

    def ready(self, x: Any, out: Any) -> bool:
        """The warm call's one question: True only where the full validation would pass for ``x``
        of a shape and dtype already validated (C-contiguous, on this rank's device, writeable in
        place; with ``out``: one of this kind like ``x``, C-contiguous, writeable, not meeting
        ``x``). False sends the call through the full validation, which says what is wrong."""
        ...

    def result(self, dst: Any, x: Any, shape: tuple[int, ...] | None = None) -> Any:
        """What a collective returns for an immutable kind, from its native result ``dst`` and ``x``
        (``out`` where there is one): a new array of ``shape`` (default ``x``'s; JAX), or ``x``
        itself once the work the collective queued is ordered before the user's (a CUDA tensor,
        whose stream is not CuPy's)."""
        ...

    def allocate(self, x: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
        """The output a collective makes where no ``out`` was given: (an array of ``x``'s kind,
        dtype and device, of ``shape``, or None where the kind cannot be written (JAX: `result`
        makes it), its flat native array)."""
        ...

    # -- the compute side: native arrays -------------------------------------------------
    xp: Any  # the array module of local reductions and scratch
    device: bool  # the arrays live on a GPU
    direct: bool  # MPI reads and writes these arrays in place: no staging copy

    def empty(self, count: int, dtype: np.dtype) -> Any: ...

    def data_pointer(self, array: Any) -> int:
        """The address of a native array's first byte."""
        ...

    def current_device(self) -> int | None:
        """The device new work goes to (plans holding streams are per device); None on the host."""
        ...

    def available_bytes(self) -> int | None:
        """Memory a new allocation may still take; None if unknown."""
        ...

    def synchronize(self) -> None:
        """Wait for the work queued on the device (timing needs it)."""
        ...

    def mpi_view(
        self, array: Any, *, copy_in: bool, copy_out: bool, slot: int = 0
    ) -> AbstractContextManager[Any]:
        """A buffer for one MPI call on ``array``: read by MPI (copy_in), written (copy_out)."""
        ...

    def staging(self, slot_bytes: int, marks: int) -> Any:
        """The streamed host-staging pipeline (device adapters that are not ``direct``)."""
        ...

    def handoff(self, array: Any) -> Callable[[], AbstractContextManager[None]]:
        """Called by the thread that wrote ``array``; the returned context, entered by another
        thread, makes that thread see those writes."""
        ...
