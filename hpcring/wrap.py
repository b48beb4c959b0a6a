"""`hpcring.Intracomm`: an existing mpi4py code sends its all-reduces through hpcring by changing one line.

    comm = hpcring.Intracomm(MPI.COMM_WORLD)
    comm.Allreduce(MPI.IN_PLACE, force, op=MPI.SUM)   # hpcring
    comm.Bcast(x, root=0)                              # MPI, as before

Like `mpi4py.util.pkl5.Intracomm`, the wrapper is an `MPI.Intracomm` on the very same handle (no
duplicate): every method it does not override is the communicator's own, and it goes wherever
mpi4py takes a communicator (``MPI.File.Open``, ``MPI.Win.Create``, petsc4py...). A Cartesian or
graph communicator stays one. ``Dup`` and ``Clone`` give a wrapper with the same options;
``Split``, ``Create``... give plain communicators, as they do for pkl5's.

`Allreduce`, `Iallreduce` and `allreduce` go through `hpcring.allreduce` where hpcring does what
MPI would: op ``MPI.SUM``, ``MAX``, ``MIN`` or ``PROD``, on a contiguous buffer of float32/64,
int32/64 or complex64/128 (a NumPy or CuPy array or any writable Python buffer, alone or as
``[buf, datatype]``, ``[buf, count]``, ``[buf, count, datatype]``, ``[buf, (count, displ),
datatype]``, with ``MPI.IN_PLACE`` or a send buffer). Everything else -- another op (LAND, BAND,
MINLOC, a user's ``MPI.Op.Create``), a derived or unsupported datatype, a non-contiguous or
read-only buffer, send and receive buffers that overlap, a spec mpi4py would refuse --
goes to the wrapped communicator's call unchanged, which does what it always did (errors
included).

The choice is made on each rank from what that rank passed, as MPI asks every rank to pass the
same op, count and datatype. A program that is legal MPI but would be routed differently on
different ranks -- a derived datatype on one rank where another passes ``MPI.DOUBLE``, a CuPy
array on one and a NumPy array on another -- would have ranks waiting in different calls: pass
the same kind of buffer everywhere. The pickle-based `allreduce`, whose objects may differ in
type from rank to rank, first agrees on the route with one small all-reduce.
"""

from __future__ import annotations

import operator
from typing import Any, Literal

import numpy as np
from mpi4py import MPI

from . import algorithms, nonblocking
from .collectives import allreduce
from .ops import OPS, mpi_op_name

# What gives MPI's speed today: the library's own all-reduce behind hpcring's checks. The latency
# work makes "auto" that, and then this default.
ALGORITHM = "mpi"
CHECK = True

# The dtypes both hpcring and MPI reduce (MPI has neither float16 nor bfloat16 for SUM).
ROUTABLE = frozenset(
    np.dtype(name) for name in ("float32", "float64", "int32", "int64", "complex64", "complex128")
)
_DTYPE_OF: dict[int, np.dtype | None] = {}  # predefined MPI datatype handle -> its routable dtype


def _dtype_of(datatype: Any) -> np.dtype | None:
    """The NumPy dtype hpcring reduces for a predefined MPI datatype, else None (derived types
    and types hpcring lacks go to MPI). Predefined handles live as long as MPI: cached."""
    if isinstance(datatype, str):  # mpi4py takes a typecode too ("d", "i4"...)
        datatype = MPI.Datatype.fromcode(datatype)
    if not datatype.is_predefined:
        return None
    handle = MPI._handleof(datatype)
    if handle not in _DTYPE_OF:
        try:
            dtype = np.dtype(datatype.tocode())
        except (TypeError, ValueError):  # MPI.DOUBLE_INT, MPI.PACKED...: no NumPy twin
            dtype = None
        if dtype is not None and (dtype not in ROUTABLE or dtype.itemsize != datatype.Get_size()):
            dtype = None
        _DTYPE_OF[handle] = dtype
    return _DTYPE_OF[handle]


def _array(buf: Any, writable: bool) -> Any:
    """``buf`` as a 1-D C-contiguous array over its memory (in memory order), or None."""
    if type(buf) is np.ndarray or hasattr(buf, "__cuda_array_interface__"):  # NumPy, CuPy
        array = buf
    elif isinstance(buf, np.ndarray):  # np.matrix, a masked array: MPI sees only their memory
        array = np.asarray(buf)
    else:  # bytearray, array.array, memoryview...: NumPy views the same memory
        array = np.asarray(memoryview(buf))
    flags = array.flags
    if writable and not getattr(flags, "writeable", True):
        return None  # mpi4py refuses a read-only receive buffer: let it say so
    if flags.c_contiguous:
        return array if array.ndim == 1 else array.reshape(-1)
    if flags.f_contiguous:  # mpi4py takes either contiguity; the transpose is C-ordered
        return array.T.reshape(-1)
    return None


def _typed(msg: Any, writable: bool) -> tuple[Any, Any] | None:
    """A buffer spec as mpi4py reads one, as (1-D array of exactly the elements MPI would touch,
    the MPI datatype given or None where mpi4py infers it); None where hpcring cannot take it."""
    count = displ = datatype = None
    if isinstance(msg, (list, tuple)):  # the forms of mpi4py's message_simple
        if len(msg) == 2:
            buf, count = msg
            if isinstance(count, (MPI.Datatype, str)):
                count, datatype = None, count
            elif isinstance(count, (list, tuple)):
                count, displ = count
        elif len(msg) == 3:
            buf, count, datatype = msg
            if isinstance(count, (list, tuple)):
                count, displ = count
        elif len(msg) == 4:
            buf, count, displ, datatype = msg
        else:
            return None
    else:
        buf = msg
    if buf is None or buf is MPI.BOTTOM:
        return None
    flat = _array(buf, writable)
    if flat is None:
        return None
    if datatype is None and count is None and displ is None:  # the common case: a plain array
        return (flat, None) if flat.dtype in ROUTABLE else None
    dtype = flat.dtype if datatype is None else _dtype_of(datatype)
    if dtype is None or dtype not in ROUTABLE:
        return None
    raw = flat if flat.dtype == np.uint8 else flat.view(np.uint8)
    start = 0 if displ is None else operator.index(displ) * dtype.itemsize
    available = raw.size - start
    if start < 0 or available < 0:
        return None
    if count is None:
        if available % dtype.itemsize:
            return None  # mpi4py cannot infer a count: its error, not ours
        count = available // dtype.itemsize
    count = operator.index(count)
    if count < 0 or count * dtype.itemsize > available:
        return None  # past the end of the buffer: what MPI does then is MPI's business
    return raw[start : start + count * dtype.itemsize].view(dtype), datatype


def _same_type(send: tuple[Any, Any], recv: tuple[Any, Any]) -> bool:
    """mpi4py's own test: the send and receive MPI datatypes are the same handle."""
    (s, stype), (r, rtype) = send, recv
    if stype is None and rtype is None:
        return s.dtype.char == r.dtype.char
    if isinstance(stype, str):
        stype = MPI.Datatype.fromcode(stype)
    if isinstance(rtype, str):
        rtype = MPI.Datatype.fromcode(rtype)
    if stype is None:
        stype = MPI.Datatype.fromcode(s.dtype.char)
    if rtype is None:
        rtype = MPI.Datatype.fromcode(r.dtype.char)
    return bool(stype == rtype)


def _overlap(a: Any, b: Any) -> bool:
    """Whether two 1-D contiguous arrays share a byte (their bounds are their bytes)."""
    if isinstance(a, np.ndarray):
        return bool(np.may_share_memory(a, b))
    return a.data.ptr < b.data.ptr + b.nbytes and b.data.ptr < a.data.ptr + a.nbytes  # CuPy


def _route(sendbuf: Any, recvbuf: Any, op: Any) -> tuple[Any, Any, str] | None:
    """(x, out or None for in place, op name) for hpcring, or None: the call is MPI's."""
    name = mpi_op_name(op)
    if name is None:
        return None
    try:
        recv = _typed(recvbuf, writable=True)
        if recv is None:
            return None
        out = recv[0]
        if sendbuf is None or sendbuf is MPI.IN_PLACE:
            x, out = out, None
        else:
            send = _typed(sendbuf, writable=False)
            if send is None or type(send[0]) is not type(out) or send[0].size != out.size:
                return None
            if not _same_type(send, recv):
                return None
            x = send[0]
            if _overlap(x, out):  # aliased buffers: MPI's error (newer mpi4py: in place), not ours
                return None
    except Exception:  # anything mpi4py's parser would object to: it reports it, in its words
        return None
    if x.dtype.kind not in OPS[name].kinds:  # MAX on complex: MPI's error (no bfloat16 here)
        return None
    return x, out, name


# The pickle-based allreduce: what kind of object each rank passed, agreed before routing.
_PASS, _ARRAY, _SCALAR, _FLOAT, _COMPLEX = range(5)
_ROUTABLE_LIST = sorted(ROUTABLE, key=str)
_OP_LIST = list(OPS)


def _object_row(obj: Any, name: str | None) -> tuple[list[int], Any]:
    """(what must agree across ranks, the array hpcring would reduce) for one object."""
    if name is None:
        return [_PASS, 0, 0, 0, 0], None
    if type(obj) is np.ndarray and obj.dtype in ROUTABLE and obj.flags.c_contiguous:
        what, array = _ARRAY, obj  # exact type: a subclass (masked arrays...) adds meaning of its own
    elif isinstance(obj, np.generic) and obj.dtype in ROUTABLE:
        what, array = _SCALAR, np.asarray(obj)
    elif type(obj) is float:  # a Python int is arbitrary precision: not an int64
        what, array = _FLOAT, np.asarray(obj, dtype=np.float64)
    elif type(obj) is complex:
        what, array = _COMPLEX, np.asarray(obj, dtype=np.complex128)
    else:
        return [_PASS, 0, 0, 0, 0], None
    row = [what, _ROUTABLE_LIST.index(array.dtype), array.size, hash(array.shape), _OP_LIST.index(name)]
    return row, array


class Request:
    """What `Intracomm.Iallreduce` returns when hpcring runs the call: an `MPI.Request`'s
    ``Wait``/``Test`` (and ``wait``/``test``), raising what the all-reduce raised.

    It is not an `MPI.Request`: ``MPI.Request.Waitall`` cannot take it; wait on each.
    """

    __slots__ = ("_request", "_waited")

    def __init__(self, request: nonblocking.Request) -> None:
        self._request = request
        self._waited = False

    def Wait(self, status: MPI.Status | None = None) -> Literal[True]:
        """Block until the all-reduce is done; raise what it raised."""
        self._request.wait()
        self._waited = True
        return True

    def Test(self, status: MPI.Status | None = None) -> bool:
        """True once done (then as `Wait`); never blocks."""
        if not self._request.test():
            return False
        return self.Wait(status)

    def Get_status(self, status: MPI.Status | None = None) -> bool:
        """Done or not, without completing the request."""
        return self._request.test()

    def wait(self, status: MPI.Status | None = None) -> None:
        """mpi4py's lowercase form: the received object, None for a buffer call."""
        self.Wait(status)

    def test(self, status: MPI.Status | None = None) -> tuple[bool, None]:
        """mpi4py's lowercase form: (done, None)."""
        return self.Test(status), None

    def Free(self) -> None:
        """The all-reduce still runs to its end; only this handle is dropped."""
        self._waited = True

    def __bool__(self) -> bool:
        """True until waited on, as an `MPI.Request` is until it becomes MPI.REQUEST_NULL."""
        return not self._waited


_TOPOLOGIES: dict[type, type] = {}


class Intracomm(MPI.Intracomm):
    """``comm`` with `Allreduce`, `Iallreduce` and `allreduce` through hpcring (module docstring).

    ``algorithm``: one of `hpcring.ALGORITHMS` (default ``"mpi"``: MPI's own all-reduce behind
    hpcring's checks). ``check`` and ``timeout`` as in `hpcring.allreduce`.
    """

    _hpcring_algorithm: str = ALGORITHM
    _hpcring_check: bool = CHECK
    _hpcring_timeout: float | None = None

    def __new__(
        cls,
        comm: MPI.Intracomm | None = None,
        *,
        algorithm: str = ALGORITHM,
        check: bool = CHECK,
        timeout: float | None = None,
    ) -> Intracomm:
        if comm is None:  # how mpi4py makes the result of Dup: a null handle, filled in afterwards
            return MPI.Intracomm.__new__(cls)
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"hpcring.Intracomm: comm must be an mpi4py intracommunicator, got {comm!r}")
        try:
            algorithms.spec(algorithms.ALLREDUCE, algorithm)
        except ValueError as error:
            raise ValueError(f"hpcring.Intracomm: {error}") from None
        for topology in (MPI.Cartcomm, MPI.Graphcomm, MPI.Distgraphcomm):
            if isinstance(comm, topology) and not issubclass(cls, topology):  # keep Get_coords & co.
                if (cls, topology) not in _TOPOLOGIES:
                    _TOPOLOGIES[cls, topology] = type(topology.__name__, (cls, topology), {})
                cls = _TOPOLOGIES[cls, topology]
        self = MPI.Intracomm.__new__(cls, comm)
        self._hpcring_algorithm, self._hpcring_check, self._hpcring_timeout = algorithm, check, timeout
        return self

    @property
    def _hpcring_plain(self) -> MPI.Intracomm:
        """This handle as a plain `MPI.Intracomm`: what hpcring is given, so that its own duplicate
        (and the messages on it) is MPI's and nothing it sends comes back through this wrapper."""
        return MPI.Intracomm(self)

    def _adopt(self, comm: Any) -> Any:
        if isinstance(comm, Intracomm):
            comm._hpcring_algorithm = self._hpcring_algorithm
            comm._hpcring_check = self._hpcring_check
            comm._hpcring_timeout = self._hpcring_timeout
        return comm

    def Dup(self, info: MPI.Info | None = None) -> Intracomm:
        """A duplicate, wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Dup(self, info))

    def Clone(self) -> Intracomm:
        """A duplicate, wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Clone(self))

    def Dup_with_info(self, info: MPI.Info) -> Intracomm:
        """A duplicate, wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Dup_with_info(self, info))

    def Idup(self, info: MPI.Info | None = None) -> tuple[Intracomm, MPI.Request]:
        """A duplicate (when the request completes), wrapped with the same options."""
        comm, request = MPI.Intracomm.Idup(self, info)
        return self._adopt(comm), request

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: MPI.Op = MPI.SUM) -> None:
        """MPI_Allreduce through hpcring where it can (module docstring), else MPI's."""
        route = _route(sendbuf, recvbuf, op)
        if route is None:
            return MPI.Intracomm.Allreduce(self, sendbuf, recvbuf, op)
        x, out, name = route
        allreduce(
            x,
            op=name,
            algorithm=self._hpcring_algorithm,
            comm=MPI.Intracomm(self),
            out=out,
            check=self._hpcring_check,
            timeout=self._hpcring_timeout,
        )
        return None

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: MPI.Op = MPI.SUM) -> MPI.Request | Request:
        """MPI_Iallreduce through `hpcring.iallreduce` where it can, else MPI's own request."""
        route = _route(sendbuf, recvbuf, op)
        if route is None:
            return MPI.Intracomm.Iallreduce(self, sendbuf, recvbuf, op)
        x, out, name = route
        request = nonblocking.iallreduce(
            x,
            op=name,
            algorithm=self._hpcring_algorithm,
            comm=MPI.Intracomm(self),
            out=out,
            check=self._hpcring_check,
            timeout=self._hpcring_timeout,
        )
        return Request(request)

    def allreduce(self, sendobj: Any, op: Any = MPI.SUM) -> Any:
        """mpi4py's pickle-based allreduce; through hpcring for NumPy arrays and numbers.

        hpcring takes the call when every rank passed the same kind of object (a C-contiguous
        ``numpy.ndarray``, a NumPy scalar, a float or a complex) of the same dtype and shape, and
        one of the four ops: one small all-reduce agrees on that first, because the objects may
        differ from rank to rank (0 on one, an array on another) and every rank must take the same
        road. The result has the type mpi4py gives (a new array, a NumPy scalar, a float...);
        integers (arbitrary precision in Python) and everything else go to mpi4py.
        """
        name = mpi_op_name(op)
        if name is None:  # every rank passes the same op (MPI's rule): no need to ask the others
            return MPI.Intracomm.allreduce(self, sendobj, op)
        row, array = _object_row(sendobj, name)
        both = np.array(row + [-v for v in row], dtype=np.int64)  # equal everywhere iff max == -min
        MPI.Intracomm.Allreduce(self, MPI.IN_PLACE, both, op=MPI.MAX)
        if row[0] == _PASS or not np.array_equal(both[:5], -both[5:]):
            return MPI.Intracomm.allreduce(self, sendobj, op)
        out = np.empty_like(array)
        # check=False: the row above has just compared count, dtype, shape and op on every rank.
        allreduce(
            array, op=name, algorithm=self._hpcring_algorithm, comm=MPI.Intracomm(self), out=out, check=False
        )
        if row[0] == _ARRAY:
            return out
        scalar = out[()]
        return float(scalar) if row[0] == _FLOAT else complex(scalar) if row[0] == _COMPLEX else scalar


__all__ = ["ALGORITHM", "CHECK", "Intracomm", "Request"]
