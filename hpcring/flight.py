"""The flight recorder: each communicator's last calls on this rank, how far each got, and why it stopped.

A hang or a StallError on 1000 ranks asks one question: where was every rank? Each
communicator's state (`hpcring.comm.CommState.flight`) keeps a `Recorder`: the last
``SLOTS`` calls in a ring of slot objects allocated once, written by `hpcring.engine` with a
few attribute stores and two clock reads per call (no dict, no tuple, no list grows). A
slot holds the call's `_Call` (op, dtype, count, algorithm, `auto`'s choice and placement
are fixed for a kind of call, so one reference records them all), the agreement's call
number, the start and end times and the phase: agreement, moving, done, negated where the
call raised. The step inside an algorithm (`Channel.step`, counted by the ring and
Rabenseifner, one int per exchange) is read only when a slot is described.

Three readers: `stall_detail` composes the part of a StallError's message that says, for
each missing rank, the last call it is known to have reached (a waiting rank knows it from
its own record: call k's agreement completing means every rank reached call k) and what
the waiting ranks wait for; with ``HPCRING_FLIGHT_RECORDER=DIR`` each rank writes every
record it holds to ``DIR/rank-<r>.json`` when an hpcring error is raised and on SIGUSR1;
``python -m hpcring.flight DIR`` prints the ranks side by side and names the first rank
that diverged. The anchors are PyTorch's Flight Recorder (NCCL only, a separate analyzer)
and Horovod's stall inspector; here the diagnosis is in the exception itself, on any MPI.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any

from . import config
from .units import format_bytes

SLOTS = 64  # calls kept per communicator (a power of two: the slot is seq & MASK)
MASK = SLOTS - 1
AGREEMENT, MOVING, DONE = 1, 2, 3  # a slot's phase; negated where the call raised in it
PHASES = {AGREEMENT: "agreement", MOVING: "moving", DONE: "done"}
clock = time.perf_counter


class Where(IntEnum):
    """Where a rank stopped waiting: the last word of its stall notice ([rank, call, peer, where])."""

    AGREEMENT = 0
    FIRST_CALL = 1
    ALGORITHM = 2
    SETUP = 3

    @property
    def words(self) -> str:
        return ("the agreement", "the first call's duplicate", "the data exchange", "a setup step")[self]


class Slot:
    """One recorded call; reused every SLOTS calls."""

    __slots__ = ("call", "end", "error", "number", "phase", "start", "step")

    def __init__(self) -> None:
        self.call: Any = None  # hpcring.engine.Call: what was called (None: an empty slot)
        self.number = 0  # the agreement's call number (checked calls on this communicator); 0: unchecked
        self.start = 0.0  # clock() seconds
        self.end = 0.0  # valid once the phase is DONE or negative
        self.phase = 0
        self.step = 0  # exchanges begun inside the algorithm, where the call raised
        self.error = ""  # the exception, where the call raised (phase < 0)


_recorders: list[weakref.ref[Recorder]] = []  # every live recorder of this process, oldest first
_made = 0  # recorders made so far in this process: a communicator's id in the dump
_lock = threading.Lock()


class Recorder:
    """One communicator's last SLOTS calls on this rank."""

    __slots__ = ("__weakref__", "created", "ident", "rank", "seq", "size", "slots", "wall")

    def __init__(self, rank: int, size: int) -> None:
        global _made
        self.rank, self.size = rank, size
        self.slots = [Slot() for _ in range(SLOTS)]
        self.seq = 0  # calls begun on this communicator, checked or not: slot seq & MASK is the last
        self.created, self.wall = clock(), time.time()  # to turn clock() readings into wall time
        with _lock:
            _made += 1
            self.ident = _made  # the n-th communicator hpcring set up here: the same on every rank in SPMD
            _recorders[:] = [ref for ref in _recorders if ref() is not None]
            _recorders.append(weakref.ref(self))
        _install_handler()

    def failed(self, slot: Slot, error: BaseException) -> None:
        """The call in ``slot`` raised ``error``: keep where it was, and dump where asked to."""
        slot.end = clock()
        if slot.phase > 0:
            slot.phase = -slot.phase
        call = slot.call
        slot.step = getattr(getattr(call, "channel", None), "step", 0) if slot.phase == -MOVING else 0
        slot.error = f"{type(error).__name__}: {error}"
        if isinstance(error, Exception):
            dump_on_error(error)

    def recorded(self) -> list[tuple[int, Slot]]:
        """(seq, slot) of every recorded call, oldest first."""
        last = self.seq
        return [(seq, self.slots[seq & MASK]) for seq in range(max(1, last - SLOTS + 1), last + 1)]

    def find(self, number: int) -> Slot | None:
        """The latest checked call with agreement number ``number``, if still recorded."""
        for _, slot in reversed(self.recorded()):
            if slot.number == number and slot.call is not None:
                return slot
        return None

    def current(self) -> Slot | None:
        """The latest call's slot (None before the first)."""
        return self.slots[self.seq & MASK] if self.seq else None

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data (the JSON dump's one communicator)."""
        return {
            "id": self.ident,
            "rank": self.rank,
            "size": self.size,
            "calls_total": self.seq,
            "calls": [self.entry(seq, slot) for seq, slot in self.recorded()],
        }

    def wall_time(self, reading: float) -> float:
        return round(self.wall + (reading - self.created), 6)

    def entry(self, seq: int, slot: Slot) -> dict[str, Any]:
        """One slot as plain data: what was called, when, and how far it got."""
        phase = _phase(slot)
        step = slot.step
        if phase == MOVING:  # still running (a dump from SIGUSR1): the step it is in now
            step = getattr(slot.call.channel, "step", 0)
        if abs(phase) != MOVING or not slot.call.spec.stepped:  # else the channel's step is stale
            step = 0
        entry = {
            "seq": seq,
            "call": slot.number or None,
            **facts(slot.call),
            "phase": PHASES.get(abs(phase), "?"),
            "failed": phase < 0,
            "step": step,
            "start": self.wall_time(slot.start),
            "end": self.wall_time(slot.end) if phase == DONE or phase < 0 else None,
        }
        if phase < 0:
            entry["error"] = slot.error
        return entry


def _phase(slot: Slot) -> int:
    """A slot's phase, DONE included: api stores no phase at the end, only the end time."""
    phase = slot.phase
    if phase == MOVING and slot.end >= slot.start:
        return DONE
    return phase


def facts(call: Any) -> dict[str, Any]:
    """What a recorded call (`hpcring.engine.Call`) was: collective, op, dtype, count, bytes,
    algorithm (and what ran: auto's choice), placement, array kind."""
    row = call.row  # hpcring.agreement.Row: what the ranks agreed on
    count, dtype = row.count, row.dtype
    return {
        "collective": row.collective,
        "op": row.op,
        "dtype": dtype.name if dtype is not None else None,
        "count": count,
        "bytes": count * dtype.itemsize if dtype is not None and count is not None else None,
        "algorithm": row.algorithm,
        "ran": call.ran,
        "placement": {True: "in place", False: "out of place"}.get(row.placement),
        "array": row.array,
    }


def summary(entry: Mapping[str, Any]) -> str:
    """A recorded call in a few words: ``allreduce sum float64 x 1000 (7.8 KiB), ring``."""
    if entry.get("count") is None:
        what = "a call this rank refused"
    else:
        what = f"{entry['dtype']} x {entry['count']} ({format_bytes(entry['bytes'])})"
    algorithm = entry.get("algorithm")
    if entry.get("ran") and entry["ran"] != algorithm:
        algorithm = f"{algorithm} -> {entry['ran']}"
    collective = entry.get("collective", "allreduce")
    op = f" {entry['op']}" if entry.get("op") else ""
    return f"{collective}{op} {what}, {algorithm}"


def stall_detail(
    recorder: Recorder | None,
    missing: Sequence[int],
    call: int,
    waiting: Mapping[int, Sequence[int]] | None = None,
) -> str:
    """The lines a StallError at call ``call`` adds: each missing rank's last known call, and
    what the waiting ranks wait for.

    ``waiting`` (rank -> its stall notice [rank, call, peer waited for, where-code]) says what
    each heard rank waited for; where it is empty only this rank's own record speaks. The
    missing ranks all completed the agreement of the last call every rank agreed on: call
    ``call - 1`` where this rank waits in call ``call``'s agreement, ``call`` itself where it
    waits inside the data exchange (the agreement of ``call`` completed)."""
    if recorder is None:
        return ""
    here = recorder.current()
    moving = here is not None and abs(_phase(here)) == MOVING and here.number == call
    reached = call if moving else call - 1
    lines = []
    ranks = ", ".join(map(str, missing))
    plural = "s" if len(missing) != 1 else ""
    if reached < 1:
        lines.append(
            f"rank{plural} {ranks}: no earlier call on this communicator (this is its first checked call)"
        )
    else:
        slot = recorder.find(reached)
        known = "no longer in this rank's record" if slot is None else summary(facts(slot.call))
        how = "its agreement completed, its data exchange did not" if moving else "every rank agreed on it"
        lines.append(f"rank{plural} {ranks}: last known at call {reached} ({known}; {how})")
    in_flight = here is not None and abs(_phase(here)) in (AGREEMENT, MOVING)
    mine = here if in_flight else recorder.find(call)
    what = f"call {call}" + (f" ({summary(facts(mine.call))})" if mine is not None else "")
    if waiting:
        for rank in sorted(waiting):
            notice = list(waiting[rank])
            at = f"call {notice[1]}" if len(notice) > 1 else what
            peer = f"rank {notice[2]}" if len(notice) > 2 and notice[2] >= 0 else "every rank"
            known = len(notice) > 3 and notice[3] in tuple(Where)
            where = Where(notice[3]).words if known else f"where-code {notice[3] if len(notice) > 3 else '?'}"
            lines.append(f"rank {rank}: waits in {at}, in {where}, for {peer}")
    if not waiting or recorder.rank not in waiting:
        phase = "the data exchange" if moving else "the agreement"
        step = getattr(here.call.channel, "step", 0) if moving and here is not None else 0
        at = f" at step {step}" if step else ""
        lines.append(f"rank {recorder.rank} (this one): waits in {what}, in {phase}{at}")
        others = sorted(set(range(recorder.size)) - set(missing) - {recorder.rank} - set(waiting or ()))
        if others and not waiting:
            lines.append(
                f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}: stopped waiting too"
            )
    return "\n  " + "\n  ".join(lines)


# --- the dump ------------------------------------------------------------------------------


def live() -> list[Recorder]:
    """Every live recorder of this process, oldest first."""
    with _lock:
        found = [ref() for ref in _recorders]
    return [recorder for recorder in found if recorder is not None]


def records() -> list[dict[str, Any]]:
    """Every live recorder of this process, as plain data."""
    return [recorder.as_dict() for recorder in live()]


def dump(directory: str | os.PathLike[str], reason: str) -> Path:
    """Write this rank's records to ``directory/rank-<r>.json`` (r: the rank in COMM_WORLD); the path."""
    import json  # here, as socket: a process that never dumps never loads them
    import socket

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = (world.Get_rank(), world.Get_size()) if MPI.Is_initialized() else (0, 1)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    data = {
        "rank": rank,
        "size": size,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": round(time.time(), 6),
        "reason": reason,
        "communicators": records(),
    }
    path = folder / f"rank-{rank}.json"
    part = folder / f".rank-{rank}.json.{os.getpid()}"
    part.write_text(json.dumps(data, indent=1, default=repr))  # a value JSON lacks: its repr, not no record
    os.replace(part, path)  # a reader never sees half a file
    return path


def dump_on_error(error: BaseException) -> None:
    """With HPCRING_FLIGHT_RECORDER set, write the record for ``error`` (never raises itself)."""
    _dump_quietly(f"{type(error).__name__}: {error}")


def _dump_quietly(reason: str) -> None:
    """`dump` where HPCRING_FLIGHT_RECORDER asks, saying on stderr why not where it fails: the
    user's error (or signal) matters more than the record's."""
    directory = config.current().flight_recorder
    if directory:
        try:
            dump(directory, reason)
        except Exception as failure:
            sys.stderr.write(f"hpcring: could not write the flight record to {directory}: {failure}\n")


_installed = False
_previous: Any = None


def _install_handler() -> None:
    """With HPCRING_FLIGHT_RECORDER set, dump on SIGUSR1 (once, from the main thread; a previous
    handler still runs after the dump)."""
    global _installed, _previous
    if _installed or threading.current_thread() is not threading.main_thread():  # only the main thread may
        return
    if not config.current().flight_recorder:
        return
    import signal  # here: most processes never set HPCRING_FLIGHT_RECORDER

    if not hasattr(signal, "SIGUSR1"):
        return
    _installed = True
    _previous = signal.signal(signal.SIGUSR1, _on_signal)


def _on_signal(signum: int, frame: Any) -> None:
    _dump_quietly("SIGUSR1")
    if callable(_previous):
        _previous(signum, frame)


# --- the reader: python -m hpcring.flight DIR -----------------------------------------------


def load(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every rank's dump in ``directory``, by rank."""
    import json

    found = sorted(Path(directory).glob("rank-*.json"))
    dumps = [json.loads(path.read_text()) for path in found]
    return sorted(dumps, key=lambda d: d["rank"])


def _position(entry: Mapping[str, Any] | None) -> tuple[int, int, int]:
    """How far a rank got on a communicator, comparable across ranks: (seq, phase, step)."""
    if entry is None:
        return (0, 0, 0)
    order = {"agreement": AGREEMENT, "moving": MOVING, "done": DONE}.get(entry["phase"], 0)
    return (entry["seq"], order, entry.get("step") or 0)


def table(dumps: list[dict[str, Any]], rows: int = 8) -> str:
    """The ranks side by side, one table per communicator: call rows x rank columns, and the
    first rank that diverged (the one that got least far: lowest call, then earliest phase,
    then lowest step)."""
    if not dumps:
        return "no flight records (rank-*.json) found"
    ranks = [d["rank"] for d in dumps]
    out = []
    for d in dumps:
        reason = d["reason"].split(":")[0]  # the exception's name (its message follows the table)
        out.append(f"rank {d['rank']}: {d['host']} pid {d['pid']}, written for {reason}")
    silent = sorted(set(range(max(d["size"] for d in dumps))) - set(ranks))
    if silent:  # a rank writes only when hpcring raises on it or it gets SIGUSR1
        out.append(
            f"no dump from {_ranks(silent)}: where {'it is' if len(silent) == 1 else 'they are'} is "
            "unknown; send SIGUSR1 to every rank (kill -USR1, scancel --signal=USR1) for every record"
        )
    idents = sorted({c["id"] for d in dumps for c in d["communicators"]})
    for ident in idents:
        per_rank = {d["rank"]: next((c for c in d["communicators"] if c["id"] == ident), None) for d in dumps}
        present = [c for c in per_rank.values() if c is not None]
        size = present[0]["size"]
        by_seq: dict[int, dict[int, dict[str, Any]]] = {}
        for rank, comm in per_rank.items():
            for entry in comm["calls"] if comm else []:
                by_seq.setdefault(entry["seq"], {})[rank] = entry
        out.append("")
        out.append(f"communicator {ident} ({size} ranks); # counts every call on it on each rank")
        width = 22
        head = "     #  " + "".join(f"rank {r}".ljust(width) for r in ranks) + "call"
        out.append(head)
        for seq in sorted(by_seq)[-rows:]:
            cells, what = [], set()
            for rank in ranks:
                entry = by_seq[seq].get(rank)
                if entry is None:
                    cells.append("-".ljust(width))
                    continue
                text = entry["phase"] + (f" step {entry['step']}" if entry["step"] else "")
                text += " FAILED" if entry["failed"] else ""
                cells.append(text[: width - 1].ljust(width))
                what.add(summary(entry))
            call = " | ".join(sorted(what)) + ("   <- ranks differ" if len(what) > 1 else "")
            out.append(f"{seq:>6}  " + "".join(cells) + call)
        last = {r: c["calls"][-1] if c and c["calls"] else None for r, c in per_rank.items()}
        lowest = min(_position(e) for e in last.values())
        behind = [rank for rank, e in last.items() if _position(e) == lowest]
        unseen = size - len(present)  # ranks of this communicator whose record is not here
        if len(behind) == len(last) and not unseen:
            out.append(f"every rank got as far: {_where(last[behind[0]])}")
        elif len(behind) == len(last):
            out.append(
                f"every rank with a dump got as far: {_where(last[behind[0]])}; {unseen} of its "
                f"{size} ranks left no dump, so the one that diverged may be among them"
            )
        else:
            out.append(
                f"first to diverge: {_ranks(behind)}, stopped at {_where(last[behind[0]])}"
                + (f" ({unseen} of its {size} ranks left no dump)" if unseen else "")
            )
        for rank, entry in last.items():
            if entry is not None and entry.get("error"):
                out.append(f"rank {rank} raised: {entry['error'].splitlines()[0]}")
    return "\n".join(out)


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _where(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "no call on this communicator"
    step = f" step {entry['step']}" if entry.get("step") else ""
    return f"# {entry['seq']} ({summary(entry)}), {entry['phase']}{step}"


def main(argv: list[str] | None = None) -> int:
    """``python -m hpcring.flight DIR``: print the table of the dumps in DIR."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m hpcring.flight DIR  (the HPCRING_FLIGHT_RECORDER directory)")
        return 0 if args and args[0] in ("-h", "--help") else 2
    dumps = load(args[0])
    print(table(dumps))
    return 0 if dumps else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Recorder", "Slot", "dump", "load", "main", "stall_detail", "table"]
