"""`hpcring.Intracomm`: an existing mpi4py code sends its all-reduces through hpcring by changing one line.

    comm = hpcring.Intracomm(MPI.COMM_WORLD)
    comm.Allreduce(MPI.IN_PLACE, force, op=MPI.SUM)   # hpcring
    comm.Bcast(x, root=0)                              # MPI, as before

Like `mpi4py.util.pkl5.Intracomm`, the wrapper is an `MPI.Intracomm` on the very same handle (no
duplicate): every method it does not override is the communicator's own, and it goes wherever
mpi4py takes a communicator (``MPI.File.Open``, ``MPI.Win.Create``, petsc4py...). A Cartesian or
graph communicator stays one. Every communicator derived from it (``Dup``, ``Split``,
``Create_cart``...) is a wrapper with the same options; a pickled one keeps them.

Which calls hpcring takes depends only on what MPI requires every rank to pass alike: the op
(``MPI.SUM``, ``MAX``, ``MIN``, ``PROD``) and the datatype, given or as mpi4py infers it from the
buffer (float32/64, int32/64, complex64/128; ``MAX``/``MIN`` not on complex), never on the kind of
Python object that holds the buffer: a NumPy array on one rank and any other buffer mpi4py takes
(``array.array``, ``bytearray`` typed, a DLPack-only object...) on another take one road. A spec
mpi4py refuses, another op (LAND, MINLOC, a user's ``MPI.Op.Create``) or datatype (derived,
unsigned, bool...) goes to the wrapped communicator's call unchanged, which does what it always
did (errors included). Working out the road costs a few dictionary reads for a spec seen before.

`Allreduce` and `allreduce` run through hpcring's engine on its own duplicate. `Iallreduce` hands
back a real MPI request, never blocking: with the ``mpi`` algorithm (the default), and with any
algorithm below MPI_THREAD_MULTIPLE, it is MPI_Iallreduce itself on this communicator (an
`hpcring.wrap.Request`); under MPI_THREAD_MULTIPLE hpcring's agreement travels beside it, on
hpcring's own communicator, and its `Wait` raises a disagreement on every rank. Other algorithms
under MPI_THREAD_MULTIPLE run on hpcring's progress thread behind an MPI generalized request (an
`hpcring.wrap.GeneralRequest`) that the thread completes. Either one mixes with the code's own
requests in ``MPI.Request.Waitall``, ``Waitany``, ``Testall``, ``Testsome``... (docs/embedding.md).
"""

from __future__ import annotations

import ctypes
import operator
import weakref
from typing import Any, Literal

import numpy as np
from mpi4py import MPI

from . import algorithms, engine, nonblocking
from .agreement import Row
from .algorithms import ALLREDUCE
from .arrays import NUMPY
from .comm import CommState, known_state, state_of
from .engine import call, resolve_timeout
from .errors import StallError
from .ops import OPS, mpi_op_name
from .polling import ABANDONED

# What gives MPI's speed today: the library's own all-reduce behind hpcring's checks. The latency
# work makes "auto" that, and then this default.
ALGORITHM = "mpi"
CHECK = True

# The dtypes both hpcring and MPI reduce (MPI has neither float16 nor bfloat16 for SUM).
ROUTABLE = frozenset(
    np.dtype(name) for name in ("float32", "float64", "int32", "int64", "complex64", "complex128")
)
_KINDS = {name: OPS[name].kinds for name in ("sum", "max", "min", "prod")}

# ---- the road: from what MPI requires to match, cached ------------------------------------------

_OPS: dict[int, tuple[Any, str | None]] = {}  # id(op) -> (the op, hpcring's name or None)
_DATATYPES: dict[int, tuple[Any, np.dtype | None]] = {}  # id(datatype) -> (it, its routable dtype)
_INFERRED: dict[np.dtype, np.dtype | None] = {}  # a buffer's dtype -> the routable dtype mpi4py infers


def _op_name(op: Any) -> str | None:
    """hpcring's name for ``op`` (MPI.SUM, MAX, MIN, PROD), else None; by identity once seen."""
    seen = _OPS.get(id(op))
    if seen is not None and seen[0] is op:
        return seen[1]
    name = mpi_op_name(op)
    if len(_OPS) < 64:  # a handful of op objects: the predefined ones, kept alive by mpi4py
        _OPS[id(op)] = (op, name)
    return name


def _dtype_of(datatype: Any) -> np.dtype | None:
    """The NumPy dtype hpcring reduces for an MPI datatype given in a spec (a Datatype or a
    typecode), else None: derived types and types hpcring lacks go to MPI. Seen once, then by
    identity (the predefined datatypes live as long as MPI)."""
    seen = _DATATYPES.get(id(datatype))
    if seen is not None and seen[0] is datatype:
        return seen[1]
    named = MPI.Datatype.fromcode(datatype) if isinstance(datatype, str) else datatype
    dtype = None
    if isinstance(named, MPI.Datatype) and named.is_predefined:
        try:
            dtype = np.dtype(named.tocode())
        except (TypeError, ValueError):  # MPI.DOUBLE_INT, MPI.PACKED...: no NumPy twin
            dtype = None
        if dtype is not None and (dtype not in ROUTABLE or dtype.itemsize != named.Get_size()):
            dtype = None
    predefined = isinstance(datatype, str) or (isinstance(named, MPI.Datatype) and named.is_predefined)
    if predefined and len(_DATATYPES) < 256:  # a derived one may be freed, and its id reused
        _DATATYPES[id(datatype)] = (datatype, dtype)
    return dtype


def _inferred(dtype: np.dtype) -> np.dtype | None:
    """The routable dtype of the datatype mpi4py infers for a buffer of ``dtype`` (its format's
    typecode), else None."""
    made = _INFERRED.get(dtype, False)
    if made is False:
        made = None
        if dtype in ROUTABLE:
            try:
                made = dtype if _dtype_of(MPI.Datatype.fromcode(dtype.char)) == dtype else None
            except (KeyError, ValueError):
                made = None
        _INFERRED[dtype] = made
    return made


class _Refused(Exception):
    """mpi4py would refuse this spec: its own error, from its own call."""


class _Hidden:
    """Memory mpi4py reads and hpcring cannot view (device memory without CuPy): its element type,
    where the object says (``None``: it does not)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: np.dtype | None) -> None:
        self.dtype = dtype


def _view(buf: Any) -> Any:
    """``buf``'s memory as an array hpcring takes (NumPy for host memory, CuPy for a device's), a
    `_Hidden` where mpi4py can take it and hpcring cannot view it (device memory without CuPy), or
    _Refused where mpi4py cannot take it either."""
    if isinstance(buf, np.ndarray):
        return buf if type(buf) is np.ndarray else np.asarray(buf)  # a subclass: MPI sees its memory
    interface = getattr(buf, "__cuda_array_interface__", None)
    if interface is not None:  # CuPy, or a device tensor: CuPy views it
        try:
            import cupy

            return buf if isinstance(buf, cupy.ndarray) else cupy.asarray(buf)
        except Exception:
            try:
                return _Hidden(np.dtype(interface["typestr"]))
            except (KeyError, TypeError):
                return _Hidden(None)
    try:  # the buffer protocol: bytearray, array.array, memoryview...
        return np.asarray(memoryview(buf))
    except (TypeError, ValueError):
        pass
    if hasattr(buf, "__dlpack__"):  # a DLPack-only object (mpi4py 4 takes those too)
        return _from_dlpack(buf)
    raise _Refused


# DLPack's C structures, as far as hpcring reads them (dlpack.h): the dtype and the device.
class _DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class _DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class _DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
    )


# Where the DLTensor sits in a capsule's managed tensor: first in DLPack 0.x's, after the version
# (two uint32), the manager context, the deleter and the flags (uint64) in 1.x's.
_CAPSULES = ((b"dltensor", 0), (b"dltensor_versioned", 8 + 2 * ctypes.sizeof(ctypes.c_void_p) + 8))
_DL_KINDS = {0: "int", 1: "uint", 2: "float", 5: "complex"}  # kDLInt, kDLUInt, kDLFloat, kDLComplex
_DL_HOST = {1, 3, 11}  # kDLCPU, kDLCUDAHost, kDLROCMHost: memory the host reads


def _from_dlpack(buf: Any) -> Any:
    """A DLPack-only object's memory as a NumPy array (host memory), else a `_Hidden`. The dtype is
    read from the capsule the object hands out, dropped unconsumed (its destructor releases it),
    and the memory taken through mpi4py's own DLPack reading (`MPI.buffer`), as MPI will take it:
    NumPy's ``from_dlpack`` keeps the capsule's tensor past the capsule, which some producers free
    with it."""
    try:
        capsule = buf.__dlpack__()
    except Exception:
        return _Hidden(None)
    api = ctypes.pythonapi
    api.PyCapsule_IsValid.restype = ctypes.c_int
    api.PyCapsule_IsValid.argtypes = (ctypes.py_object, ctypes.c_char_p)
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = (ctypes.py_object, ctypes.c_char_p)
    dtype, host = None, False
    for name, offset in _CAPSULES:
        if api.PyCapsule_IsValid(capsule, name):
            tensor = _DLTensor.from_address(api.PyCapsule_GetPointer(capsule, name) + offset)
            kind, bits = _DL_KINDS.get(tensor.dtype.code), tensor.dtype.bits
            if kind and tensor.dtype.lanes == 1:
                dtype = np.dtype(f"{kind}{bits}")
            host = tensor.device.device_type in _DL_HOST
            break
    del capsule
    if dtype is None or not host:
        return _Hidden(dtype)
    try:
        return np.frombuffer(MPI.buffer(buf), dtype=dtype)
    except Exception:
        return _Hidden(dtype)


def _flat(array: Any, writable: bool) -> Any:
    """``array`` as a 1-D C-contiguous array over its memory, in memory order; _Refused where
    mpi4py would refuse it (non-contiguous; read-only for receiving)."""
    flags = array.flags
    if writable and not getattr(flags, "writeable", True):
        raise _Refused
    if flags.c_contiguous:
        return array if array.ndim == 1 else array.reshape(-1)
    if flags.f_contiguous:  # mpi4py takes either contiguity; the transpose is C-ordered
        return array.T.reshape(-1)
    raise _Refused


class _Unviewable:
    """A buffer mpi4py takes and hpcring cannot view (device memory without CuPy): its element
    count, for the agreement; MPI's own all-reduce moves it, on hpcring's duplicate."""

    __slots__ = ("count", "obj")

    def __init__(self, obj: Any, count: int) -> None:
        self.obj, self.count = obj, count

    @property
    def size(self) -> int:
        return self.count


def _typed(msg: Any, writable: bool) -> tuple[Any, np.dtype, Any] | None:
    """A buffer spec as mpi4py reads one: (1-D array of exactly the elements MPI would touch, or an
    `_Unviewable`; its dtype; the MPI datatype given, or None where mpi4py infers it), or None where
    the datatype is not one hpcring reduces. _Refused where mpi4py would refuse the spec."""
    kind = type(msg)
    if kind is np.ndarray:  # the common case first: a plain array
        dtype = _inferred(msg.dtype)
        return None if dtype is None else (_flat(msg, writable), dtype, None)
    if (kind is list or kind is tuple) and len(msg) == 2:  # [array, its datatype], seen before
        buf, datatype = msg
        seen = _DATATYPES.get(id(datatype))
        if seen is not None and seen[0] is datatype and type(buf) is np.ndarray and buf.dtype == seen[1]:
            return _flat(buf, writable), seen[1], datatype
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
            raise _Refused
    else:
        buf = msg
    if buf is None or buf is MPI.BOTTOM:
        raise _Refused
    if datatype is not None:
        dtype = _dtype_of(datatype)
        if dtype is None:
            return None
        if count is None and displ is None and type(buf) is np.ndarray and buf.dtype == dtype:
            return _flat(buf, writable), dtype, datatype  # [array, its own datatype]: as the array
    view = _view(buf)
    if isinstance(view, _Hidden):  # mpi4py takes it, hpcring cannot view it: counted as mpi4py reads it
        if datatype is None:
            dtype = None if view.dtype is None else _inferred(view.dtype)
            if dtype is None:
                return None
        nbytes = MPI.buffer(buf).nbytes
        start = 0 if displ is None else operator.index(displ) * dtype.itemsize
        n = (nbytes - start) // dtype.itemsize if count is None else operator.index(count)
        return _Unviewable(buf, n), dtype, datatype
    flat = _flat(view, writable)
    if datatype is None:
        dtype = _inferred(flat.dtype)
        if dtype is None:
            return None
        if count is None and displ is None:
            return flat, dtype, None
    raw = flat if flat.dtype == np.uint8 else flat.view(np.uint8)
    start = 0 if displ is None else operator.index(displ) * dtype.itemsize
    available = raw.size - start
    if start < 0 or available < 0:
        raise _Refused
    if count is None:
        if available % dtype.itemsize:
            raise _Refused  # mpi4py cannot infer a count
        count = available // dtype.itemsize
    count = operator.index(count)
    if count < 0 or count * dtype.itemsize > available:
        raise _Refused  # past the end of the buffer
    return raw[start : start + count * dtype.itemsize].view(dtype), dtype, datatype


def _same_type(send: tuple[Any, np.dtype, Any], recv: tuple[Any, np.dtype, Any]) -> bool:
    """mpi4py's own test: the send and receive MPI datatypes are the same handle."""
    (_, sdtype, stype), (_, rdtype, rtype) = send, recv
    if stype is rtype:  # both inferred, or the same Datatype object given twice ([buf, MPI.DOUBLE])
        return stype is not None or sdtype == rdtype
    return bool(_datatype(stype, sdtype) == _datatype(rtype, rdtype))


def _datatype(given: Any, dtype: np.dtype) -> MPI.Datatype:
    """The MPI datatype of one side of a call: the one given (a Datatype or a typecode), else the
    one mpi4py infers for the buffer's dtype."""
    if isinstance(given, MPI.Datatype):
        return given
    return MPI.Datatype.fromcode(dtype.char if given is None else given)


def _overlap(a: Any, b: Any) -> bool:
    """Whether two 1-D contiguous arrays share a byte (their bounds are their bytes)."""
    if isinstance(a, np.ndarray):
        return bool(np.may_share_memory(a, b))
    return a.data.ptr < b.data.ptr + b.nbytes and b.data.ptr < a.data.ptr + a.nbytes  # CuPy


def route(sendbuf: Any, recvbuf: Any, op: Any) -> tuple[Any, Any, str, np.dtype] | None:
    """(x, out or None for in place, op name, dtype) where hpcring takes the call, else None: MPI's.

    x is an `_Unviewable` where mpi4py takes the buffer and hpcring cannot view it: hpcring's road
    still (the others take it): MPI's own all-reduce moves it on hpcring's duplicate, behind
    hpcring's agreement (a rank whose array runs another algorithm disagrees, on every rank)."""
    name = _op_name(op)
    if name is None:
        return None
    try:
        recv = _typed(recvbuf, writable=True)
        if recv is None:
            return None
        out, dtype = recv[0], recv[1]
        if dtype.kind not in _KINDS[name]:  # MAX on complex: MPI's error (no bfloat16 here)
            return None
        if sendbuf is MPI.IN_PLACE or sendbuf is None:
            return out, None, name, dtype
        send = _typed(sendbuf, writable=False)
        if send is None or send[1] != dtype:
            return None
        x = send[0]
        if isinstance(x, _Unviewable) or isinstance(out, _Unviewable):
            return x, out, name, dtype  # hpcring's road: MPI's all-reduce, behind the agreement
        if type(x) is not type(out) or x.size != out.size or not _same_type(send, recv):
            return None  # mpi4py's error for mismatched specs, in its words
        if _overlap(x, out):  # aliased buffers: MPI's error (newer mpi4py: in place), not ours
            return None
    except _Refused:  # anything mpi4py's parser objects to: it reports it, in its words
        return None
    except Exception:  # a spec so odd that reading it failed: mpi4py says what it thinks of it
        return None
    return x, out, name, dtype


# ---- the requests ------------------------------------------------------------------------------


class _Checked:
    """What both requests add to MPI's: ``Wait``/``Test`` raise what hpcring's part raised (on every
    rank alike), and the lowercase forms follow."""

    __slots__ = ()
    _job: nonblocking.Request | None
    _reported: bool

    def _raise(self) -> None:
        job = self._job
        if job is not None and job.error is not None and not self._reported:
            self._reported = True
            raise job.error

    def wait(self, status: MPI.Status | None = None) -> None:
        """mpi4py's lowercase form: the received object, None for a buffer call."""
        self.Wait(status)

    def test(self, status: MPI.Status | None = None) -> tuple[bool, None]:
        """mpi4py's lowercase form: (done, None)."""
        return self.Test(status), None

    @property
    def error(self) -> BaseException | None:
        """What hpcring's part raised (a disagreement, a StallError), once it finished."""
        return None if self._job is None else self._job.error


class Request(_Checked, MPI.Request):
    """`Intracomm.Iallreduce`'s request on MPI's own road: MPI_Iallreduce's request itself, on the
    wrapped communicator (``MPI.Request.Waitall`` and the rest complete it as any other).

    Under MPI_THREAD_MULTIPLE, with ``check=True``, hpcring's agreement on the call travels beside
    it on hpcring's own communicator: `Wait` waits for it too (a rank that never arrives becomes a
    StallError naming it; a disagreement raises on every rank), and `Test` is True once both are
    done. Completed through ``MPI.Request.Waitall``, an error of the agreement is raised by the
    wrapper's next call."""

    __slots__ = ("_buffers", "_job", "_reported")

    def Wait(self, status: MPI.Status | None = None) -> Literal[True]:
        """Wait for the agreement (bounded: its own timeout), then for the data, as MPI_Wait."""
        job = self._job
        if job is not None:
            job.join()
            if isinstance(job.error, StallError) and self:  # MPI keeps the buffers: so does this
                ABANDONED.append(self)
            self._raise()
        MPI.Request.Wait(self, status)
        return True

    def Test(self, status: MPI.Status | None = None) -> bool:
        """True once the data and the agreement are done (then as `Wait`); never blocks."""
        if self and not MPI.Request.Test(self, status):
            return False
        job = self._job
        if job is not None:
            if not job.test():
                return False
            self._raise()
        return True

    def Get_status(self, status: MPI.Status | None = None) -> bool:
        """Done or not, without completing the request."""
        done = MPI.Request.Get_status(self, status)
        return done and (self._job is None or self._job.test())


class GeneralRequest(_Checked, MPI.Grequest):
    """`Intracomm.Iallreduce`'s request where hpcring's progress thread runs the call (an algorithm
    other than ``mpi``, under MPI_THREAD_MULTIPLE): an MPI generalized request that the thread
    completes when the call has finished, so MPI's own ``Waitall`` and the rest wait for it."""

    __slots__ = ("_job", "_reported")

    def Wait(self, status: MPI.Status | None = None) -> Literal[True]:
        """Wait until the call has finished (bounded: its own timeout); raise what it raised."""
        MPI.Grequest.Wait(self, status)
        self._raise()
        return True

    def Test(self, status: MPI.Status | None = None) -> bool:
        """True once the call has finished (then as `Wait`); never blocks."""
        if self and not MPI.Grequest.Test(self, status):
            return False
        self._raise()
        return True


_TOPOLOGIES: dict[type, type] = {}
# Wrappers of the predefined communicators, by (name, options): a pickled one comes back as itself.
_NAMED: weakref.WeakValueDictionary[tuple[Any, ...], Intracomm] = weakref.WeakValueDictionary()


def _restore(name: str, algorithm: str, check: bool, timeout: float | None) -> Intracomm:
    """Unpickle a wrapper of ``MPI.<name>``: the live one with these options, else a new one."""
    made = _NAMED.get((name, algorithm, check, timeout))
    if made is None:
        made = Intracomm(getattr(MPI, name), algorithm=algorithm, check=check, timeout=timeout)
    return made


class Intracomm(MPI.Intracomm):
    """``comm`` with `Allreduce`, `Iallreduce` and `allreduce` through hpcring (module docstring).

    ``algorithm``: one of `hpcring.ALGORITHMS` (default ``"mpi"``: MPI's own all-reduce behind
    hpcring's checks). ``check`` and ``timeout`` as in `hpcring.allreduce`. Every rank passes the
    same options, as it passes the same op and datatype.
    """

    _hpcring_algorithm: str = ALGORITHM
    _hpcring_check: bool = CHECK
    _hpcring_timeout: float | None = None
    _hpcring_failed: list[Any] = []  # noqa: RUF012 (a shared empty default; each wrapper makes its own)

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
            algorithms.spec(ALLREDUCE, algorithm)
        except ValueError as error:
            raise ValueError(f"hpcring.Intracomm: {error}") from None
        for topology in (MPI.Cartcomm, MPI.Graphcomm, MPI.Distgraphcomm):
            if isinstance(comm, topology) and not issubclass(cls, topology):  # keep Get_coords & co.
                if (cls, topology) not in _TOPOLOGIES:
                    extra = {"Sub": _sub} if topology is MPI.Cartcomm else {}
                    _TOPOLOGIES[cls, topology] = type(topology.__name__, (cls, topology), extra)
                cls = _TOPOLOGIES[cls, topology]
        self = MPI.Intracomm.__new__(cls, comm)
        self._hpcring_algorithm, self._hpcring_check, self._hpcring_timeout = algorithm, check, timeout
        for name in ("COMM_WORLD", "COMM_SELF"):
            if self == getattr(MPI, name):
                _NAMED.setdefault((name, algorithm, check, timeout), self)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        """A wrapper of COMM_WORLD or COMM_SELF pickles with its options (and unpickles, in the same
        process, as the very same object); any other communicator cannot be pickled, as in mpi4py."""
        for name in ("COMM_WORLD", "COMM_SELF"):
            if self == getattr(MPI, name):
                return _restore, (name, self._hpcring_algorithm, self._hpcring_check, self._hpcring_timeout)
        return MPI.Intracomm.__reduce__(self)  # mpi4py's ValueError: "cannot serialize ..."

    @property
    def _hpcring_plain(self) -> MPI.Intracomm:
        """This handle as a plain `MPI.Intracomm`: what hpcring is given, so that its own duplicate
        (and the messages on it) is MPI's and nothing it sends comes back through this wrapper.
        Made once (a wrapper's handle is set when it is made, and stays)."""
        plain = self.__dict__.get("_plain")
        if plain is None or plain != self:
            plain = self.__dict__["_plain"] = MPI.Intracomm(self)
        return plain

    def _adopt(self, comm: Any) -> Any:
        """``comm`` (made from this one) with this wrapper's options: wrapped, where it is not."""
        if comm == MPI.COMM_NULL:
            return comm
        options = {
            "algorithm": self._hpcring_algorithm,
            "check": self._hpcring_check,
            "timeout": self._hpcring_timeout,
        }
        if isinstance(comm, Intracomm):
            comm._hpcring_algorithm, comm._hpcring_check, comm._hpcring_timeout = options.values()
            return comm
        if isinstance(comm, MPI.Intracomm):
            return Intracomm(comm, **options)
        if isinstance(comm, MPI.Intercomm):
            return Intercomm._carrying(comm, options)
        return comm

    # -- communicators made from this one: wrapped, with the same options --

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

    def Idup_with_info(self, info: MPI.Info) -> tuple[Intracomm, MPI.Request]:
        """A duplicate (when the request completes), wrapped with the same options."""
        comm, request = MPI.Intracomm.Idup_with_info(self, info)
        return self._adopt(comm), request

    def Split(self, *args: Any, **kwargs: Any) -> Intracomm:
        """MPI's split, wrapped with the same options (MPI.COMM_NULL stays itself)."""
        return self._adopt(MPI.Intracomm.Split(self, *args, **kwargs))

    def Split_type(self, *args: Any, **kwargs: Any) -> Intracomm:
        """MPI's split by type, wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Split_type(self, *args, **kwargs))

    def Create(self, *args: Any, **kwargs: Any) -> Intracomm:
        """MPI_Comm_create, wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Create(self, *args, **kwargs))

    def Create_group(self, *args: Any, **kwargs: Any) -> Intracomm:
        """MPI_Comm_create_group, wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Create_group(self, *args, **kwargs))

    def Create_cart(self, *args: Any, **kwargs: Any) -> Intracomm:
        """A Cartesian communicator (still one: ``Get_coords``...), wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Create_cart(self, *args, **kwargs))

    def Create_graph(self, *args: Any, **kwargs: Any) -> Intracomm:
        """A graph communicator, wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Create_graph(self, *args, **kwargs))

    def Create_dist_graph(self, *args: Any, **kwargs: Any) -> Intracomm:
        """A distributed graph communicator, wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Create_dist_graph(self, *args, **kwargs))

    def Create_dist_graph_adjacent(self, *args: Any, **kwargs: Any) -> Intracomm:
        """A distributed graph communicator, wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Create_dist_graph_adjacent(self, *args, **kwargs))

    def Create_intercomm(self, *args: Any, **kwargs: Any) -> MPI.Intercomm:
        """An intercommunicator (MPI's in every call) that hands these options to its ``Merge``."""
        return self._adopt(MPI.Intracomm.Create_intercomm(self, *args, **kwargs))

    def Shrink(self) -> Intracomm:
        """ULFM's shrink (the survivors), wrapped with the same options."""
        return self._adopt(MPI.Intracomm.Shrink(self))

    # -- the all-reduces --

    def _reraise(self) -> None:
        """Raise the error of a request of this wrapper that finished with one and was completed
        through MPI's own calls (``MPI.Request.Waitall``...), which cannot raise it."""
        failed = self._hpcring_failed
        for held in list(failed):
            request = held()
            if request is None or request._reported:  # dropped: its error went nowhere else
                failed.remove(held)
                if request is None:
                    continue
            elif not request:  # MPI completed it: nobody saw its error
                failed.remove(held)
                request._reported = True
                raise request._job.error
        return None

    def _failing(self, request: _Checked) -> None:
        """Keep ``request``'s error for `_reraise` once its job finished with one."""
        if "_hpcring_failed" not in self.__dict__:
            self._hpcring_failed = []
        failed, held = self._hpcring_failed, weakref.ref(request)

        def finished(job: nonblocking.Request) -> None:
            if job.error is not None:
                failed.append(held)

        request._job.then(finished)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: MPI.Op = MPI.SUM) -> None:
        """MPI_Allreduce through hpcring where it can (module docstring), else MPI's."""
        if self._hpcring_failed:
            self._reraise()
        taken = route(sendbuf, recvbuf, op)
        if taken is None:
            return MPI.Intracomm.Allreduce(self, sendbuf, recvbuf, op)
        x, out, name, dtype = taken
        if isinstance(x, _Unviewable) or isinstance(out, _Unviewable):
            return self._hidden(sendbuf, recvbuf, op, x.size, dtype, name, out is None)
        call(
            ALLREDUCE,
            x,
            out,
            name,
            self._hpcring_algorithm,
            self._hpcring_plain,
            self._hpcring_check,
            self._hpcring_timeout,
            0,  # root, reproducible, wire: all eleven arguments, as the compiled core's warm call takes them
            False,
            None,
        )
        return None

    def Iallreduce(
        self, sendbuf: Any, recvbuf: Any, op: MPI.Op = MPI.SUM
    ) -> MPI.Request | Request | GeneralRequest:
        """MPI_Iallreduce (module docstring): a request at once, never blocking; MPI's own request
        where hpcring does not take the call."""
        if self._hpcring_failed:
            self._reraise()
        taken = route(sendbuf, recvbuf, op)
        if taken is None:
            return MPI.Intracomm.Iallreduce(self, sendbuf, recvbuf, op)
        x, out, name, dtype = taken
        plain = self._hpcring_plain
        if known_state(plain) is None:  # hpcring has no communicator here yet: MPI's call, as it is
            return _unchecked(MPI.Intracomm.Iallreduce(self, sendbuf, recvbuf, op), sendbuf, recvbuf)
        threaded = nonblocking.progress_mode() == "thread"
        # by name: MPI_Iallreduce is the mpi algorithm's own non-blocking form
        if threaded and self._hpcring_algorithm != "mpi":  # by name: (above)
            if isinstance(x, _Unviewable) or isinstance(out, _Unviewable):
                job = self._hidden_job(sendbuf, recvbuf, op, x.size, dtype, name, out is None)
            else:
                job = nonblocking.iallreduce(
                    x,
                    op=name,
                    algorithm=self._hpcring_algorithm,
                    comm=self._hpcring_plain,
                    out=out,
                    check=self._hpcring_check,
                    timeout=self._hpcring_timeout,
                )
            general = GeneralRequest(MPI.Grequest.Start())
            general._job, general._reported = job, False
            self._failing(general)  # first: an error is kept before MPI can see the request done
            job.then(lambda _: general.Complete())
            return general
        request = _unchecked(MPI.Intracomm.Iallreduce(self, sendbuf, recvbuf, op), sendbuf, recvbuf)
        if threaded and self._hpcring_check:
            progress = nonblocking.progress_for(plain, "hpcring.Intracomm.Iallreduce")  # made: no wait
            state, row = progress.state, (x.size, dtype, name, out is None, None)

            def agree() -> None:
                self._agree(state, *row, "Iallreduce")

            request._job = progress.defer(agree)
            self._failing(request)
        return request

    def _hidden(
        self, sendbuf: Any, recvbuf: Any, op: Any, count: int, dtype: np.dtype, name: str, in_place: bool
    ) -> None:
        """Allreduce of a buffer hpcring cannot view (device memory without CuPy): MPI_Allreduce on
        hpcring's duplicate, with the buffers as given, behind the agreement. With the ``mpi``
        algorithm it is what the engine runs for a NumPy array (so a rank with one agrees with it);
        with another, ranks whose arrays run it would not: they disagree, on every rank."""
        state = state_of(self._hpcring_plain, self._hpcring_timeout)
        if not state.busy.acquire(False):
            raise RuntimeError(
                "hpcring.Intracomm.Allreduce: another thread is running a collective on this "
                "communicator; give each thread its own communicator (comm.Dup())"
            )
        try:
            if self._hpcring_check:
                # by name: the mpi algorithm's engine call is MPI_Allreduce on this duplicate too
                kind = NUMPY.type_name if self._hpcring_algorithm == "mpi" else None  # by name: (above)
                self._agree(state, count, dtype, name, in_place, kind, "Allreduce")
            state.comm.Allreduce(sendbuf, recvbuf, op)
        finally:
            state.busy.release()

    def _hidden_job(
        self, sendbuf: Any, recvbuf: Any, op: Any, count: int, dtype: np.dtype, name: str, in_place: bool
    ) -> nonblocking.Request:
        """`_hidden` as an Iallreduce job on the progress thread: the agreement (the others' arrays
        run hpcring's algorithm there: they disagree, on every rank, and nothing is left posted),
        then MPI_Allreduce on the progress engine's duplicate."""
        progress = nonblocking.progress_for(self._hpcring_plain, "hpcring.Intracomm.Iallreduce")
        state, check = progress.state, self._hpcring_check

        def run() -> None:
            if check:
                self._agree(state, count, dtype, name, in_place, None, "Iallreduce")
            state.comm.Allreduce(sendbuf, recvbuf, op)

        return progress.defer(run)

    def _agree(
        self,
        state: CommState,
        count: int,
        dtype: np.dtype,
        op: str,
        in_place: bool,
        array: str | None,
        method: str,
    ) -> None:
        """hpcring's agreement on a call whose data MPI's own collective moves: the row of
        `hpcring.agreement` (count, dtype, op, algorithm, placement, settings; ``array``: the kind
        the ranks must agree on, None where MPI reads any buffer), on ``state``'s communicator,
        numbered with the engine's calls there."""
        if state.comm.Get_size() == 1:
            return
        agreement = state.agreement
        if agreement.settings is None:
            agreement.settings = state.settings
        algorithm = self._hpcring_algorithm
        row = Row(
            collective=ALLREDUCE,
            count=count,
            dtype=dtype,
            op=op,
            algorithm=algorithm,
            array=array,
            placement=in_place,
            root=0,
            settings=state.settings.digest(),
            wire=None,
        )
        state.calls = number = state.calls + 1
        what = f"hpcring.Intracomm.{method}(op={op!r}, algorithm={algorithm!r})"
        limit = resolve_timeout(state, self._hpcring_timeout)
        agreement([number, *row.words()], row, None, timeout=limit, what=what, caller=what)

    def allreduce(self, sendobj: Any, op: Any = MPI.SUM) -> Any:
        """mpi4py's pickle-based allreduce; through hpcring for NumPy arrays and numbers.

        hpcring takes the call when every rank passed the same kind of object (a C-contiguous
        ``numpy.ndarray``, a NumPy scalar, a float or a complex) of the same dtype and shape, and
        one of the four ops: one small all-reduce on hpcring's own communicator agrees on that
        first, because the objects may differ from rank to rank (0 on one, an array on another) and
        every rank must take the same road. The result has the type mpi4py gives (a new array, a
        NumPy scalar, a float...); integers (arbitrary precision in Python) and everything else go
        to mpi4py.
        """
        if self._hpcring_failed:
            self._reraise()
        name = _op_name(op)
        if name is None:  # every rank passes the same op (MPI's rule): no need to ask the others
            return MPI.Intracomm.allreduce(self, sendobj, op)
        row, array = _object_row(sendobj, name)
        both = np.array(row + [-v for v in row], dtype=np.int64)  # equal everywhere iff max == -min
        plain = self._hpcring_plain
        engine.call(ALLREDUCE, both, None, "max", "mpi", plain, False, self._hpcring_timeout)
        agreed = row[0] != _PASS and np.array_equal(both[:5], -both[5:])
        out = np.empty_like(array) if agreed else None
        taken = route(array, out, op) if agreed else None  # the same on every rank: same dtype, shape
        if taken is None:
            return MPI.Intracomm.allreduce(self, sendobj, op)
        # check=False: the row above has just compared count, dtype, shape and op on every rank.
        x, flat, _, _ = taken
        call(ALLREDUCE, x, flat, name, self._hpcring_algorithm, plain, False, self._hpcring_timeout)
        if row[0] == _ARRAY:
            return out
        scalar = out[()]
        return float(scalar) if row[0] == _FLOAT else complex(scalar) if row[0] == _COMPLEX else scalar


def _unchecked(native: MPI.Request, *buffers: Any) -> Request:
    """MPI's own request as a `Request`, nothing of hpcring's beside it (yet). It holds the
    call's buffers as mpi4py's request does (a copy of the handle does not), so a temporary
    send buffer lives until MPI is done with it."""
    request = Request(native)
    request._job, request._reported, request._buffers = None, False, buffers
    return request


def _sub(self: Intracomm, remain_dims: Any) -> Intracomm:
    """A Cartesian sub-grid (`MPI.Cartcomm.Sub`), wrapped with the same options."""
    return self._adopt(MPI.Cartcomm.Sub(self, remain_dims))


class Intercomm(MPI.Intercomm):
    """An intercommunicator made from an `Intracomm` (``Create_intercomm``): MPI's in every call, as
    hpcring reduces within one group only; it carries the wrapper's options to what is made from
    it (``Merge`` gives an `Intracomm`, ``Dup``... another carrier)."""

    _hpcring_options: dict[str, Any] = {}  # noqa: RUF012 (set per carrier by _carrying)

    @classmethod
    def _carrying(cls, comm: MPI.Intercomm, options: dict[str, Any]) -> Intercomm:
        made = cls(comm)
        made._hpcring_options = dict(options)
        return made

    def _adopt(self, comm: Any) -> Any:
        if comm == MPI.COMM_NULL:
            return comm
        if isinstance(comm, MPI.Intracomm):
            return Intracomm(comm, **self._hpcring_options)
        if isinstance(comm, MPI.Intercomm):
            return Intercomm._carrying(MPI.Intercomm(comm), self._hpcring_options)
        return comm

    def Merge(self, high: bool = False) -> Intracomm:
        """The union of both groups, an `Intracomm` with the carried options."""
        return self._adopt(MPI.Intercomm.Merge(self, high))

    def Dup(self, info: MPI.Info | None = None) -> Intercomm:
        return self._adopt(MPI.Intercomm.Dup(self, info))

    def Split(self, *args: Any, **kwargs: Any) -> Intercomm:
        return self._adopt(MPI.Intercomm.Split(self, *args, **kwargs))

    def Create(self, *args: Any, **kwargs: Any) -> Intercomm:
        return self._adopt(MPI.Intercomm.Create(self, *args, **kwargs))


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
    if array.dtype.kind not in _KINDS[name]:  # MAX on complex: mpi4py's (its error)
        return [_PASS, 0, 0, 0, 0], None
    row = [what, _ROUTABLE_LIST.index(array.dtype), array.size, hash(array.shape), _OP_LIST.index(name)]
    return row, array


__all__ = ["ALGORITHM", "CHECK", "GeneralRequest", "Intercomm", "Intracomm", "Request", "route"]
