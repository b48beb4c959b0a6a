"""MPI's fault tolerance (ULFM) as hpcring meets it: is a job launched with it, is an MPI error a
failed rank, which ranks, and the revoke that carries the news to every survivor.

Under ``mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self`` (Open MPI 5), a rank that dies
turns every operation that needs it into an error (``MPI_ERR_PROC_FAILED``; a receive from any
source: ``MPI_ERR_PROC_FAILED_PENDING``) on the ranks that wait for it, at once, instead of a
hang; hpcring's duplicates return errors (``MPI_ERRORS_RETURN``), so its test loops
(`hpcring.polling`) see them as the blocking calls do. The ranks that wait for a live rank
learn of it from a revoke: the first rank that sees the error revokes hpcring's communicators
(``MPI_Comm_revoke``), and every pending and later operation on them fails with
``MPI_ERR_REVOKED`` on every rank. `rank_failed` turns any of these into
`hpcring.RankFailedError`, naming the failed ranks (``MPI_Comm_get_failed``) and the call
(from the flight recorder); `hpcring.elastic` recovers from it.

`launch_problem` says, before anything runs, why a job cannot recover from a failure: no
fault tolerance at run time, or a transport that does not detect failures here (shared
memory, ``btl sm``: the job hangs). It reads what the library runs with through MPI's tool
interface (``MPI_T`` control variables), so a setting made on the command line, in the
environment or in a parameter file counts alike.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from mpi4py import MPI

from . import topology
from .errors import RankFailedError
from .flight import facts, summary

# The line docs/elastic.md explains; every error about a launch shows it.
LAUNCH = "mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self -n N python ..."
NAMED_WITHIN = 1.0  # seconds a revoked rank waits for MPI to name the failed rank
_FAILURES = tuple(
    getattr(MPI, name)
    for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
    if hasattr(MPI, name)
)
_settings: dict[str, str | None] = {}  # MPI_T control variables read once per process


# ---- is this a failed rank? ----------------------------------------------------------------


def is_failure(error: BaseException, comm: MPI.Comm | None = None) -> bool:
    """Whether ``error`` is MPI saying that a rank failed or that a survivor revoked ``comm``.

    The failure classes say so themselves. Other errors can carry a failure too (an error in a
    status array; a non-blocking collective's schedule cut short, MPI_ERR_OTHER from Open MPI's
    libnbc): under fault tolerance, they count where ``comm`` shows a failed rank or a revoke
    within NAMED_WITHIN seconds."""
    if not isinstance(error, MPI.Exception):
        return False
    if error.Get_error_class() in _FAILURES:
        return True
    if comm is None or not enabled():
        return False
    return revoked(comm) or bool(named(comm))


def failed_ranks(comm: MPI.Comm) -> list[int]:
    """The ranks of ``comm`` that this process knows failed (``MPI_Comm_get_failed``; local)."""
    try:
        group = comm.Get_failed()
    except (NotImplementedError, MPI.Exception):
        return []
    try:
        if group.Get_size() == 0:
            return []
        mine = comm.Get_group()
        try:
            ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), mine)
        finally:
            mine.Free()
        return sorted(r for r in ranks if r != MPI.UNDEFINED)
    finally:
        group.Free()


def revoked(comm: MPI.Comm) -> bool:
    try:
        return bool(comm.Is_revoked())
    except (NotImplementedError, MPI.Exception):
        return False


def revoke(comm: MPI.Comm | None) -> None:
    """Revoke ``comm`` (every pending and later operation on it fails, on every rank); quietly
    nothing where it is gone, revoked already, or the library has no fault tolerance."""
    if comm is None or comm == MPI.COMM_NULL or MPI.Is_finalized():
        return
    with contextlib.suppress(NotImplementedError, MPI.Exception):
        if not comm.Is_revoked():
            comm.Revoke()


def revoke_state(state: Any) -> None:
    """Revoke hpcring's duplicate of one communicator (``state``: its `hpcring.comm.CommState`)
    and the node-level communicators split from it, so that every survivor waiting on any of
    them, for any rank, gets out (a rank of a two-level algorithm may wait inside its node for
    a rank that waits across nodes for the dead one)."""
    revoke(state.comm)
    topo = topology.known(state.comm)
    if topo is not None:
        revoke(topo.local)
        revoke(topo.cross)


# ---- the error a survivor raises -------------------------------------------------------------


def rank_failed(call: Any, error: BaseException, number: int, moving: bool) -> RankFailedError | None:
    """The RankFailedError for ``error`` raised inside ``call`` (an `hpcring.engine.Call`: the
    communicator's call ``number``, 0 unchecked, ``moving`` its data or still agreeing), or None
    where it is no failure. Revokes the call's communicators first, so that the other survivors'
    waits end too."""
    if not isinstance(error, MPI.Exception):
        return None
    comm = call.state.comm
    if not is_failure(error, comm):
        return None
    revoke_state(call.state)
    failed = named(comm)
    where = "the agreement"
    if moving:
        step = getattr(call.channel, "step", 0) if call.spec.stepped else 0
        where = "the data exchange" + (f" at step {step}" if step else "")
    number = f" call {number}" if number else ""
    detail = f" ({summary(facts(call))}; this rank was in {where})"
    return RankFailedError(
        failed, f"{call.what}{number} on this communicator", detail, error.Get_error_class()
    )


def named(comm: MPI.Comm) -> list[int]:
    """The failed ranks of ``comm``; a rank that learned of the failure from a revoke (or from an
    error that does not say) may hear which rank died a moment later, so it asks again for up
    to NAMED_WITHIN seconds."""
    failed = failed_ranks(comm)
    deadline = time.monotonic() + NAMED_WITHIN
    while not failed and time.monotonic() < deadline and not MPI.Is_finalized():
        time.sleep(1e-3)
        failed = failed_ranks(comm)
    return failed


def first_call_failed(comm: MPI.Comm, error: BaseException, caller: str) -> RankFailedError | None:
    """The RankFailedError of a failure during the first call on ``comm`` (its duplicate), or None."""
    if not is_failure(error, comm):
        return None
    return RankFailedError(
        named(comm),
        f"the first {caller} call on this communicator (its duplicate)",
        "",
        error.Get_error_class(),
    )


# ---- the launch ------------------------------------------------------------------------------


def setting(name: str) -> str | None:
    """An Open MPI parameter as this process runs with it (an MPI_T control variable, read once;
    else ``OMPI_MCA_<name>``); None where neither says."""
    if name not in _settings:
        value = _read_cvar(name)
        _settings[name] = os.environ.get(f"OMPI_MCA_{name}") if value is None else value
    return _settings[name]


def _read_cvar(name: str) -> str | None:
    """``name``'s value through MPI_T (Open MPI: a bool reads as an int), as text; None where the
    library has no such variable or no tool interface."""
    if not MPI.Get_library_version().startswith("Open MPI"):
        return None
    try:
        import ctypes

        lib = ctypes.CDLL(MPI.__file__)  # dlsym searches libmpi, which it links
        provided = ctypes.c_int()
        # At MPI's own thread level: Open MPI takes the tool interface's for the library's (a
        # THREAD_SINGLE here made MPI_Query_thread answer single, and stopped hpcring's threads).
        if lib.MPI_T_init_thread(MPI.Query_thread(), ctypes.byref(provided)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    try:
        index, count, handle = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
        if lib.MPI_T_cvar_get_index(name.encode(), ctypes.byref(index)) != 0:
            return None
        if lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) != 0:
            return None
        buffer = ctypes.create_string_buffer(max(count.value, 8) + 1)
        try:
            if lib.MPI_T_cvar_read(handle, buffer) != 0:
                return None
        finally:
            lib.MPI_T_cvar_handle_free(ctypes.byref(handle))
        if count.value == 1:  # a bool or an int
            return str(int.from_bytes(buffer.raw[:4], "little", signed=True))
        return buffer.value.decode(errors="replace")
    finally:
        lib.MPI_T_finalize()


def _admits(selection: str, component: str) -> bool:
    """Whether an Open MPI component selection ("tcp,self", "^usnic", "" for all) admits ``component``."""
    names = selection.strip()
    if not names:
        return True
    if names.startswith("^"):
        return component not in [n.strip() for n in names[1:].split(",")]
    return component in [n.strip() for n in names.split(",")]


def launch_problem() -> str | None:
    """Why this job cannot survive a failed rank, as a sentence that says how to launch; None
    where it can. Local (every rank of one launch reads the same settings)."""
    library = MPI.Get_library_version().split("\n")[0].strip()
    if not library.startswith("Open MPI") or not hasattr(MPI.Intracomm, "Shrink"):
        return (
            f"hpcring's elastic mode needs MPI's fault tolerance (ULFM) as Open MPI 5 provides it; this "
            f"job runs {library or 'an MPI without it'}. Install the mpi extra (pip install -e '.[mpi]') "
            f"and launch with: {LAUNCH} (docs/elastic.md)"
        )
    if setting("mpi_ft_enable") not in ("1", "true", "True", "yes"):
        return (
            "this job was not launched with MPI's fault tolerance, so a rank that dies ends or hangs "
            f"the job instead of raising hpcring.RankFailedError; launch with: {LAUNCH} (docs/elastic.md)"
        )
    btl = setting("btl") or ""
    for component in ("sm", "vader"):
        if _admits(btl, component):
            return (
                f"this job may use the shared-memory transport (btl '{btl or 'all'}'), which does not "
                "detect a failed rank here (the survivors hang); keep to TCP even on one node: "
                f"{LAUNCH} (docs/elastic.md)"
            )
    pml = setting("pml") or ""
    if pml and pml != "ob1":
        return (
            f"MPI's fault tolerance needs the ob1 messaging layer, this job runs pml '{pml}'; "
            f"launch with: {LAUNCH} (docs/elastic.md)"
        )
    return None


def enabled() -> bool:
    """Whether this job runs with MPI's fault tolerance on (a dead rank is an error, not the end)."""
    return setting("mpi_ft_enable") in ("1", "true", "True", "yes")


__all__ = [
    "LAUNCH",
    "enabled",
    "failed_ranks",
    "first_call_failed",
    "is_failure",
    "launch_problem",
    "named",
    "rank_failed",
    "revoke",
    "revoke_state",
    "revoked",
    "setting",
]
