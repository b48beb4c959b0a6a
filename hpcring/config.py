"""Every ``HPCRING_*`` variable the package reads: one table, one parser per kind, one snapshot.

Each attribute of `Config` below is a row of the table: the variable's name, its parser,
its default, what it means (one line, for users; docs/configuration.md is the page) and
whether every rank must use the same value. ``config.current()`` is the process's snapshot,
read from ``os.environ`` on first use and cached; ``config.reload()`` reads it again (for
tools and tests that change a variable between runs). Each communicator keeps the snapshot
in force when it was first used (``Channel.config``), so the algorithms read that one.

Lazy parsing, eager reading. A snapshot copies the raw text of every variable when it is
made, but parses a variable only when its attribute is first read, and caches the value.
A bad value therefore raises where the variable is used, as it always has (a bad
``HPCRING_CHUNK_BYTES`` in a ring call, on every rank alike, since every rank has the same
environment), and never in ``import hpcring`` or in a call that does not use it: a bad
``HPCRING_STAGING_CHUNK_BYTES`` stays harmless on a CPU-only job. A failed parse is not
cached, so every use raises the same error. `Config.digest` never raises: an unparsable
value enters it as its raw text.

Grammars are today's, exactly, and so are the error messages: the byte counts take plain
digits only (``4M`` is refused, not read through `hpcring.units.parse_size`), since
accepting more would change what the same job means.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
# A parser turns (name, raw text or None where unset) into the value, or raises ValueError.
Parser = Callable[[str, "str | None"], T]


# --- one parser per kind ---------------------------------------------------------------


def positive_integer(name: str, raw: str | None) -> int | None:
    """Digits, at least 1 (surrounding blanks ignored); None where unset or empty."""
    text = (raw or "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{name} must be a positive integer, got {text!r}")
    return int(text)


def byte_count(name: str, raw: str | None) -> int | None:
    """Digits, 0 included (a number of bytes); None where unset or empty."""
    text = (raw or "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{name} must be a number of bytes, got {text!r}")
    return int(text)


def integer(name: str, raw: str | None) -> int | None:
    """Any integer Python's ``int`` reads (a rank); None where unset or blank. The error is int's."""
    if not (raw or "").strip():
        return None
    return int(raw or "")


def integer_from(low: int, high: int, default: int) -> Parser[int]:
    """A parser of digits from ``low`` to ``high`` (blanks ignored); ``default`` where unset or empty."""

    def parse(name: str, raw: str | None) -> int:
        text = (raw or "").strip()
        if not text:
            return default
        if not text.isdigit() or not low <= int(text) <= high:
            raise ValueError(f"{name} must be an integer from {low} to {high}, got {text!r}")
        return int(text)

    return parse


def number(
    what: str,
    low: float,
    high: float | None = None,
    default: float = 0.0,
    too_low: str | None = None,
    blank_is_unset: bool = True,
) -> Parser[float]:
    """A parser of a float from ``low`` (to ``high``); ``default`` where unset (or blank).

    ``f"{name} must be {what}, got {text!r}"`` when the text is not a number, or is out of
    range and ``too_low`` is None; else ``f"{name} {too_low}, got {text!r}"`` below ``low``.
    A closed range refuses NaN (it lies in none); a lower bound alone lets it through, as
    HPCRING_TIMEOUT always has (NaN, like 0, then waits forever). ``blank_is_unset=False``
    keeps HPCRING_TIMEOUT's own grammar: the text unstripped, an empty one refused.
    """

    def parse(name: str, raw: str | None) -> float:
        if raw is None or (blank_is_unset and not raw.strip()):
            return default
        text = raw.strip() if blank_is_unset else raw
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name} must be {what}, got {text!r}") from None
        if high is not None and not low <= value <= high:
            raise ValueError(f"{name} must be {what}, got {text!r}")
        if value < low:
            raise ValueError(f"{name} {too_low or 'must be ' + what}, got {text!r}")
        return value

    return parse


def choice(values: Mapping[str, T], default: T) -> Parser[T]:
    """A parser of one of ``values``' keys (exactly, blanks ignored); ``default`` where unset or empty."""
    spelled = " or ".join(values)

    def parse(name: str, raw: str | None) -> T:
        text = (raw or "").strip()
        if not text:
            return default
        if text not in values:
            raise ValueError(f"{name} must be {spelled}, got {text!r}")
        return values[text]

    return parse


def path(name: str, raw: str | None) -> str | None:
    """A file name, blanks stripped, as given (the user expands ``~`` where it does); None where unset."""
    return (raw or "").strip() or None


def assignments(name: str, raw: str | None) -> dict[str, str]:
    """``value`` (for every key: ``{"*": value}``) or ``key=value,key=value`` (blanks ignored);
    {} where unset or empty. Which keys and values mean something is the reader's to check."""
    text = (raw or "").strip()
    if not text:
        return {}
    if "=" not in text and "," not in text:
        return {"*": text}
    found: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not (sep and key and value):
            raise ValueError(f"{name} must be NAME or KEY=NAME,KEY=NAME, got {text!r}")
        found[key] = value
    return found


def word(name: str, raw: str | None) -> str | None:
    """Free text, stripped and lowercased: only the values a reader knows mean anything; never an error."""
    return (raw or "").strip().lower() or None


# --- the table ---------------------------------------------------------------------------


class Variable(Generic[T]):
    """One row of the table, and the `Config` attribute that parses it on first read."""

    def __init__(
        self,
        name: str,
        parse: Parser[T],
        *,
        kind: str,
        default: str,
        meaning: str,
        must_agree: bool,
        canonical: Callable[[T], str] = repr,
    ) -> None:
        self.name = name
        self.parse = parse
        self.kind = kind  # the parser, in words, for the page
        self.default = default  # what holds when it is unset, as docs/configuration.md says it
        self.meaning = meaning
        self.must_agree = must_agree  # a rank with another value would hang or compute otherwise
        self.canonical = canonical  # the value's text in the digest
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    @overload
    def __get__(self, config: None, owner: type) -> Variable[T]: ...
    @overload
    def __get__(self, config: Config, owner: type) -> T: ...
    def __get__(self, config: Config | None, owner: type) -> Variable[T] | T:
        if config is None:
            return self
        try:
            return config._values[self.name]
        except KeyError:
            value = config._values[self.name] = self.parse(self.name, config._raw[self.name])
            return value

    def __set__(self, config: Config, value: Any) -> None:
        raise AttributeError(f"hpcring.config.Config is frozen: {self.attr} cannot be set")


def _set_or_not(value: object) -> str:
    return "set" if value else "unset"


class Config:
    """A frozen snapshot of every HPCRING_* variable, one attribute each (parsed on first read)."""

    chunk_bytes = Variable(
        "HPCRING_CHUNK_BYTES",
        positive_integer,
        kind="positive integer",
        default="unset",
        meaning="largest chunk (bytes) a ring streams a segment in; unset: whole ones, 60 KiB across nodes",
        must_agree=True,
    )
    staging_chunk_bytes = Variable(
        "HPCRING_STAGING_CHUNK_BYTES",
        positive_integer,
        kind="positive integer",
        default="unset",
        meaning="largest piece (bytes) of streamed host staging of device buffers; unset: whole segments",
        must_agree=True,
    )
    wait_sleep_us = Variable(
        "HPCRING_WAIT_SLEEP_US",
        number("a number of microseconds in [0, 1e6]", 0.0, 1e6),
        kind="number in [0, 1e6]",
        default="0",
        meaning="microseconds a pipelined ring naps between polls (0 spins), for ranks outnumbering cores",
        must_agree=False,
    )
    wait = Variable(
        "HPCRING_WAIT",
        choice({"auto": "auto", "spin": "spin", "share": "share"}, "auto"),
        kind="auto, spin or share",
        default="auto",
        meaning="how a waiting rank spends its core: spin; share (yield, then nap); auto: share if crowded",
        must_agree=False,
    )
    exchange_ranks = Variable(
        "HPCRING_EXCHANGE_RANKS",
        integer_from(1, 4, default=4),
        kind="integer from 1 to 4",
        default="4",
        meaning="the agreement exchanges messages up to this many ranks, else one MPI_Iallreduce",
        must_agree=True,
        canonical=str,
    )
    ranks_per_node = Variable(
        "HPCRING_RANKS_PER_NODE",
        positive_integer,
        kind="positive integer",
        default="unset",
        meaning="blocks of this many consecutive ranks are the nodes, not MPI's shared-memory split",
        must_agree=True,
    )
    hierarchical_inter = Variable(
        "HPCRING_HIERARCHICAL_INTER",
        choice({"ring": "ring", "rabenseifner": "rabenseifner"}, "ring"),
        kind="ring or rabenseifner",
        default="ring",
        meaning="the algorithm hierarchical all-reduces each shard with across nodes",
        must_agree=True,
    )
    shared_memory = Variable(
        "HPCRING_SHARED_MEMORY",
        choice({"1": True, "0": False}, True),
        kind="1 or 0",
        default="1",
        meaning="1: a plan on the ranks of one node all-reduces through shared memory; 0: by messages",
        must_agree=True,
    )
    cuda_aware = Variable(
        "HPCRING_CUDA_AWARE",
        choice({"1": True, "0": False}, None),
        kind="1 or 0",
        default="unset",
        meaning="1: device buffers go straight to MPI (verified once); 0: stage via host; unset: ask MPI",
        must_agree=True,
    )
    device = Variable(
        "HPCRING_DEVICE",
        word,
        kind="word",
        default="unset",
        meaning="cpu: leave the GPU alone (select_device; bench --device auto runs NumPy); else nothing",
        must_agree=False,
    )
    memory_limit = Variable(
        "HPCRING_MEMORY_LIMIT",
        byte_count,
        kind="number of bytes",
        default="unset",
        meaning="cap on the memory hpcring's scratch may assume free (a job sharing its node or device)",
        must_agree=False,
    )
    timeout = Variable(
        "HPCRING_TIMEOUT",
        number("a number of seconds", 0.0, default=300.0, too_low="must be >= 0", blank_is_unset=False),
        kind="number >= 0",
        default="300",
        meaning="seconds to wait for every rank before StallError (timeout= wins); 0 waits forever",
        must_agree=False,
    )
    trace = Variable(
        "HPCRING_TRACE",
        path,
        kind="path",
        default="unset",
        meaning="trace this process from import on; rank 0 writes this Chrome trace file at exit",
        must_agree=True,
        canonical=_set_or_not,  # rank 0 gathers every rank's events at exit: all trace or none
    )
    flight_recorder = Variable(
        "HPCRING_FLIGHT_RECORDER",
        path,
        kind="path",
        default="unset",
        meaning="each rank writes its flight record (last calls) to DIR/rank-<r>.json on an error or SIGUSR1",
        must_agree=False,
    )
    tuning = Variable(
        "HPCRING_TUNING",
        path,
        kind="path",
        default="~/.cache/hpcring/tuning.json",
        meaning="the tuning file auto reads (rank 0 alone) and python -m hpcring.bench --tune writes",
        must_agree=False,
    )
    model = Variable(
        "HPCRING_MODEL",
        path,
        kind="path",
        default="~/.cache/hpcring/model.json",
        meaning="the cost model's calibration file (python -m hpcring.model)",
        must_agree=False,
    )
    core = Variable(
        "HPCRING_CORE",
        choice({"c": "c", "python": "python"}, None),
        kind="c or python",
        default="unset",
        meaning="python: the pure-Python core; c: the compiled one or an error; unset: compiled where built",
        must_agree=False,  # the cores give the same bits: ranks may differ
    )
    jax = Variable(
        "HPCRING_JAX",
        choice({"ffi": "ffi", "callback": "callback"}, None),
        kind="ffi or callback",
        default="unset",
        meaning="hpcring.jax in jit: callback, io_callbacks; unset or ffi, the XLA FFI target where built",
        must_agree=False,  # both paths run the same calls in the same order
    )
    algo = Variable(
        "HPCRING_ALGO",
        assignments,
        kind="NAME or KEY=NAME,...",
        default="unset",
        meaning="hpcring.torch's process group: the algorithm of every collective, or per collective",
        must_agree=False,  # each call's algorithm is agreed on anyway
        canonical=lambda value: ",".join(f"{k}={v}" for k, v in sorted(value.items())),
    )
    elastic_join = Variable(
        "HPCRING_ELASTIC_JOIN",
        path,
        kind="path",
        default="unset",
        meaning="elastic: a process started later joins the job at this rendezvous file (set for it)",
        must_agree=False,  # only the processes that join have it
    )
    elastic_rendezvous = Variable(
        "HPCRING_ELASTIC_RENDEZVOUS",
        path,
        kind="path",
        default="unset",
        meaning="elastic replace-when-available: the rendezvous file where waiting processes are invited",
        must_agree=False,  # rank 0 of the survivors opens it
    )
    bench_corrupt = Variable(
        "HPCRING_BENCH_CORRUPT",
        integer,
        kind="integer",
        default="unset",
        meaning="bench: this rank flips one element after each reduction, to prove a wrong result fails",
        must_agree=False,
    )

    __slots__ = ("_raw", "_values")

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        """Copy every variable's raw text from ``environ`` (default ``os.environ``); parse nothing yet."""
        source = os.environ if environ is None else environ
        object.__setattr__(self, "_raw", {v.name: source.get(v.name) for v in VARIABLES})
        object.__setattr__(self, "_values", {})

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"hpcring.config.Config is frozen: {attr} cannot be set")

    def raw(self, name: str) -> str | None:
        """The text of variable ``name`` as it was when this snapshot was made (None: unset)."""
        return self._raw[name]

    def digest(self) -> int:
        """A 32-bit number, equal on every process whose must-agree values are equal.

        The CRC-32 of ``NAME=value`` lines of the must-agree variables, values in canonical
        form (so ``040`` and ``40`` agree; for HPCRING_TRACE only whether it is set). It never
        raises: an unparsable value enters as ``NAME!raw``, so it differs from any good one.
        """
        lines = [f"{name}{text}" for name, text in self.agreed().items()]
        return zlib.crc32("\n".join(lines).encode())

    def agreed(self) -> dict[str, str]:
        """The must-agree variables as the digest reads them: name -> ``=value`` in canonical
        form, or ``!raw`` for a value that does not parse (the agreement's slow path names them)."""
        values = {}
        for variable in VARIABLES:
            if not variable.must_agree:
                continue
            try:
                values[variable.name] = f"={variable.canonical(getattr(self, variable.attr))}"
            except ValueError:
                values[variable.name] = f"!{self._raw[variable.name]}"
        return values

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._raw == other._raw

    def __hash__(self) -> int:
        return hash(tuple(self._raw.items()))

    def __repr__(self) -> str:
        given = ", ".join(f"{name}={text!r}" for name, text in self._raw.items() if text is not None)
        return f"Config({given})"


VARIABLES: tuple[Variable[Any], ...] = tuple(v for v in vars(Config).values() if isinstance(v, Variable))
BY_NAME: dict[str, Variable[Any]] = {v.name: v for v in VARIABLES}

_current: Config | None = None
_lock = threading.Lock()


def current() -> Config:
    """The process's snapshot: read from os.environ on first use, then the same object."""
    global _current
    made = _current
    if made is None:
        with _lock:
            if _current is None:
                _current = Config()
            made = _current
    return made


def reload() -> Config:
    """Read os.environ again and make that the current snapshot (communicators already used keep theirs)."""
    global _current
    with _lock:
        _current = Config()
        return _current


__all__ = ["BY_NAME", "VARIABLES", "Config", "Variable", "current", "reload"]
