"""Reporting on rank 0: the header, one table row per measurement, the footer, the plot, JSON.

The table has nccl-tests' shape (size, count, type, redop, algorithm, time, algbw,
busbw, ...), with the bytes sent measured beside their formula and the cost model's
prediction; the footer names the fastest row per size and each one's busbw relative to the
bare library call (the bare row: ``MPI_Allreduce``, `BARE`, for the all-reduce, the header's
``baseline`` for every collective, straight through mpi4py).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any

from ..algorithms import ALLREDUCE as MODEL_DEFAULT  # python -m hpcring.model's collective
from ..units import format_size
from .collectives import kind_of
from .measure import BARE, Row
from .startup import describe as describe_startup

_COLUMNS = (
    ("size", ">12", "(B)"),
    ("count", ">11", "(elements)"),
    ("type", ">10", ""),
    ("redop", ">6", ""),
    ("algorithm", ">17", ""),  # widened where the bare row's name is longer (`algorithm_width`)
    ("time", ">10", "(us)"),
    ("predicted", ">10", "(us)"),
    ("algbw", ">8", "(GB/s)"),
    ("busbw", ">8", "(GB/s)"),
    ("sent/rank", ">11", "measured"),
    ("sent/rank", ">11", "formula"),
    ("#wrong", ">7", ""),
)


ALGORITHM_WIDTH = 17


def algorithm_width(h: dict[str, Any]) -> int:
    """The algorithm column's width: 17, or the bare row's name where longer (MPI_Reduce_scatter)."""
    return max(ALGORITHM_WIDTH, len(h["baseline"]))


def _columns(width: int) -> tuple[tuple[str, str, str], ...]:
    return tuple((name, f">{width}" if name == "algorithm" else spec, unit) for name, spec, unit in _COLUMNS)


def format_header(h: dict[str, Any]) -> str:
    """The lines above the table: what ran where, how it was timed, and the column names."""
    aware = "yes" if h["cuda_aware"] else "no"
    kind = kind_of(h["collective"], h.get("uneven", False))
    columns = _columns(algorithm_width(h))
    root = f"  root {h['root']}" if h.get("root") is not None else ""
    lines = [
        f"# hpcring {h['hpcring']} {kind.title} benchmark  ({h['mpi_library']}, mpi4py {h['mpi4py']})",
        f"# ranks {h['ranks']}  hosts {h['hosts']}  ranks/host {h['ranks_per_host']}  "
        f"device {h['device']}  CUDA-aware {aware} ({h['cuda_aware_reason']})",
        f"# topology: {h['topology']['describe']}, two-level {'yes' if h['topology']['two_level'] else 'no'}"
        f", ring in {h['topology']['ring_order']}",
        *([f"# core: {h['core']} ({h['core_reason']})"] if "core" in h else []),
        *([describe_startup(h["startup"])] if h.get("startup") else []),
        *_gpu_header(h),
        *(f"# {name}: not run: {why}" for name, why in h.get("not_run", {}).items()),
        *_guidance(h),
        f"# {h['baseline']}: the bare library call, mpi4py's {kind.mpi4py} on the same buffers "
        f"({h['baseline_call']}), nothing of hpcring between: the footer's yardstick "
        f"(mpi: the same call through hpcring.{kind.name})",
        f"# dtype {h['dtype']}  op {h['op']}{root}  iters {h['iters']} "
        f"(fewer past {h['max_time_s']:g} s/row)  "
        f"warmup {h['warmup']}  passes {h['passes']}{'  interleaved' if h.get('interleaved') else ''}  "
        f"check {int(h['check'])}  agree {int(h['agree'])}  "
        f"{h['placement']}",
        *([f"# size: {h['size_is']};  count: elements of each rank's input"] if h.get("size_is") else []),
        f"# time: {h['time']};  busbw = algbw * {h['busbw_formula']} = algbw * {h['busbw_factor']:.4g};  "
        "sent/rank: bytes handed to MPI per call, max over ranks",
        "#",
        "# " + " ".join(f"{name:{spec}}" for name, spec, _ in columns)[2:],
        "# " + " ".join(f"{unit:{spec}}" for _, spec, unit in columns)[2:],
    ]
    return "\n".join(lines)


def _home(text: str) -> str:
    """``text`` with paths under the user's home written from ``~``, as the defaults are documented
    (the JSON keeps them whole)."""
    home = os.path.expanduser("~")
    return text if home in ("~", os.sep) else text.replace(home + os.sep, "~" + os.sep)


def _guidance(h: dict[str, Any]) -> list[str]:
    """Where `auto`'s choices and the `predicted` column come from, and how to change that: the
    two things a first run leaves unexplained (a dict without these facts says nothing)."""
    lines = []
    tuning = h.get("auto")
    if tuning and "auto" in h["algorithms"]:
        table = ", ".join(
            f"{name} above" if limit is None else f"{name} up to {format_size(limit)}"
            for limit, name in tuning["table"]
        )
        if h.get("size_is"):  # auto chooses by what each rank passes in, not by a row's size
            table += " (bytes of each rank's input)"
        if "ahead" in tuning:  # the all-to-all on 2-4 ranks: decided before the table
            upto = tuning["ahead"]
            which = "of any size" if upto is None else f"up to {format_size(upto)} per rank"
            lines.append(
                f"# auto: equal NumPy blocks {which} leave ahead of the check and run pairwise"
                " (auto:pairwise); the table below is for the rest"
            )
        if tuning["tuned"]:
            lines.append(f"# auto: tuned here, table {tuning['key']} of {_home(tuning['path'])}: {table}")
        else:
            lines += [
                f"# auto: untuned built-in defaults ({_home(tuning['why'])}): {table}",
                "#   --tune measures this machine's crossovers and writes them for auto",
            ]
    if "model_path" in h:
        if h.get("model"):
            lines.append(
                f"# predicted: the cost model calibrated in {_home(h['model'])} (python -m hpcring.model)"
            )
        else:
            lines += [
                f"# predicted: empty (-), no calibrated cost model at {_home(h['model_path'])}",
                "#   calibrate: mpiexec --oversubscribe -n 2 python -m hpcring.model --calibrate;  a preset "
                f"link instead: python -m hpcring.model --ranks {h['ranks']} --bytes 1M --link ndr400"
                + ("" if h["collective"] == MODEL_DEFAULT else f" --collective {h['collective']}"),
            ]
    return lines


def _gpu_header(h: dict[str, Any]) -> list[str]:
    if h["device"] != "gpu":
        return []
    piece = h["staging_chunk_bytes"]
    piece = f"pieces of {format_size(piece)}B" if piece else "whole segments"
    staging = "" if h["cuda_aware"] else f"  host staging: {piece}"
    lines = [
        f"# GPU {h['gpu']}: {h['gpus']} for {h['ranks']} ranks  pinned device-to-host "
        f"{h['pinned_d2h_GBps']:.1f} GB/s (one rank alone){staging}"
    ]
    return lines


def format_row(row: Row, width: int = ALGORITHM_WIDTH) -> str:
    """One table line, aligned under `format_header`'s columns (``!``: bytes off the formula;
    ``width``: the algorithm column's, `algorithm_width`)."""

    def num(value: int | None) -> str:
        return "-" if value is None else str(value)

    measured = num(row.bytes_sent) + ("" if row.bytes_match else "!")
    cells = (
        row.size,
        row.count,
        row.dtype,
        row.op,
        row.label,
        f"{row.time_us:.1f}",
        "-" if row.predicted_us is None else f"{row.predicted_us:.1f}",
        f"{row.algbw:.3f}",
        f"{row.busbw:.3f}",
        measured,
        num(row.bytes_expected),
        "N/A" if row.wrong is None else row.wrong,
    )
    return " ".join(f"{cell:{spec}}" for cell, (_, spec, _) in zip(cells, _columns(width), strict=True))


def summarize(rows: list[Row], bare: str = BARE) -> list[dict[str, Any]]:
    """Per size: the fastest row (the bare call, the row named ``bare``, included) and each row's
    busbw relative to the bare call's (= the bare time / the row's time, which holds at one rank
    too, where busbw is 0)."""
    summary = []
    for nbytes in dict.fromkeys(r.size for r in rows):
        cells = [r for r in rows if r.size == nbytes]
        best = min(cells, key=lambda r: r.time_us)
        base = next((r for r in cells if r.algorithm == bare), None)
        relative = {
            r.algorithm: (base.time_us / r.time_us if base and r.time_us > 0 else None) for r in cells
        }
        summary.append(
            {"size": nbytes, "best": best.algorithm, "baseline": bare, "busbw_vs_baseline": relative}
        )
    return summary


# A row is too noisy to compare (`noisy`) where its median iteration took more than SPREAD times
# its fastest one (the machine was busy for most of the row), or where the same algorithm ran a
# size at least this much larger more than OUT_OF_ORDER times faster (time does not fall with
# size: something else held the cores for the whole row). The footer prints `~` for its ratios.
SPREAD = 4.0
OUT_OF_ORDER = 3.0


def noisy(rows: list[Row]) -> set[tuple[int, str]]:
    """(size, algorithm) of the rows whose timing says more about the machine's load than about
    the algorithm."""
    found = set()
    for row in rows:
        spread = row.time_us_min > 0 and row.time_us > SPREAD * row.time_us_min
        larger = (r.time_us for r in rows if r.algorithm == row.algorithm and r.size > row.size)
        if spread or any(0 < t * OUT_OF_ORDER < row.time_us for t in larger):
            found.add((row.size, row.algorithm))
    return found


def format_footer(rows: list[Row], summary: list[dict[str, Any]], bare: str = BARE) -> str:
    """The lines below the table: best per size against the bare call (the row named ``bare``),
    then the verdicts, as nccl-tests ends."""
    names = list(dict.fromkeys(r.algorithm for r in rows))
    width = max(12, len(bare))  # `best` may be the bare call
    lines = [
        "#",
        f"# best per size, and busbw relative to {bare} (>1: faster than the bare library call)",
        "# " + f"{'size':>8} {'best':>{width}}  " + " ".join(f"{n:>{max(7, len(n))}}" for n in names),
    ]
    shaky = noisy(rows)
    for entry in summary:
        rel, size = entry["busbw_vs_baseline"], entry["size"]
        cells = " ".join(
            f"{_ratio(rel.get(n), {(size, n), (size, entry['baseline'])} & shaky):>{max(7, len(n))}}"
            for n in names
        )
        lines.append(f"# {format_size(entry['size']):>8} {entry['best']:>{width}}  {cells}")
    if shaky:
        lines.append(
            f"# ~: {len(shaky)} of {len(rows)} rows too noisy to compare (median over {SPREAD:g}x the "
            f"fastest iteration, or over {OUT_OF_ORDER:g}x a larger size's time): the machine was busy; "
            "rerun on a quiet one, with --passes 3"
        )
    checked = [r.wrong for r in rows if r.wrong is not None]
    wrong = sum(checked)
    mismatched = sum(not r.bytes_match for r in rows)
    verdict = f"{wrong} wrong element{'s' if wrong != 1 else ''}" if checked else "results not checked"
    avg = statistics.mean(r.busbw for r in rows)
    lines += [
        f"# out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}  ({verdict})",
        f"# bytes sent vs formula: {len(rows) - mismatched}/{len(rows)} rows agree"
        + ("" if not mismatched else "  (! marks rows that do not: a bug)"),
        f"# avg bus bandwidth    : {avg:.4f} GB/s",
    ]
    return "\n".join(lines)


def _ratio(value: float | None, shaky: set[tuple[int, str]]) -> str:
    return "-" if value is None else "~" if shaky else format(value, ".2f")


def ceiling_line(header: dict[str, Any], rows: list[Row]) -> str:
    """The ring's busbw at the largest size against what bounds it on this device: the pinned
    copy bandwidth of host staging on a GPU, one process's np.copyto on the CPU."""
    ring = [r for r in rows if r.algorithm == "ring"]  # by name: this line reports the ring itself
    if not ring:
        return "# ring not run: no figure against the copy bandwidth"
    top = max(ring, key=lambda r: r.size)
    name = header.get("baseline", BARE)
    bare = next((r for r in rows if r.algorithm == name and r.size == top.size), None)
    versus = f", {bare.time_us / top.time_us:.2f}x {name}" if bare and top.time_us > 0 else ""
    if header["device"] == "gpu":
        ceiling, what = header["pinned_d2h_GBps"], "pinned device-to-host"
    else:
        ceiling = header["copyto_GBps"]
        what = f"np.copyto ({ceiling:.2f} GB/s, one process, {format_size(top.size)}B, same run)"
    ring_at = f"# ring at {format_size(top.size)}B: busbw {top.busbw:.2f} GB/s"
    return f"{ring_at} = {top.busbw / ceiling:.3f} x {what}{versus}"


class Progress:
    """Progress of the sweep on rank 0's stderr: a bar on a terminal, plain lines otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.tty = enabled and sys.stderr.isatty()
        self.start = self.last = time.monotonic()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        if self.tty:
            filled = 30 * self.done // self.total
            bar = "#" * filled + "." * (30 - filled)
            sys.stderr.write(f"\r[{bar}] {self.done}/{self.total} {label:<22} {elapsed:6.1f} s")
        elif time.monotonic() - self.last >= 2.0 or self.done == self.total:  # a log, not a flood
            self.last = time.monotonic()
            sys.stderr.write(
                f"hpcring.bench: {self.done}/{self.total} rows, last {label} ({elapsed:.1f} s)\n"
            )
        sys.stderr.flush()

    def clear(self) -> None:
        """Erase the bar, so the table lines on the same terminal stay clean."""
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


# One (marker, line style) per algorithm: seven or more lines share ten colours and cross each
# other, so each also differs in shape; the bare library call is the black dashed yardstick.
_MARKERS = "osD^vP*Xh<>p"
_STYLES = ("-", "--", "-.", ":")


def line_styles(names: list[str], bare: str = BARE) -> dict[str, dict[str, Any]]:
    """matplotlib keywords per algorithm: no two lines alike in marker and style (12 x 4 apart);
    the bare call (the line named ``bare``) black and dashed."""
    styles, others = {}, [n for n in names if n != bare]
    for i, name in enumerate(others):
        styles[name] = {"marker": _MARKERS[i % len(_MARKERS)], "linestyle": _STYLES[i % len(_STYLES)]}
    if bare in names:
        styles[bare] = {"marker": "x", "linestyle": "--", "color": "black", "linewidth": 2}
    return styles


def size_ticks(sizes: list[int], most: int = 12) -> tuple[list[int], list[str]]:
    """x ticks at the measured sizes, labelled 8, 1K, 64K, 1M (`format_size`), every k-th one
    where there are more than ``most``, so that the labels do not overlap; the ones kept are
    in step with 1K, 1M, 1G where the sweep measured those, the sizes a reader looks for."""
    sizes = sorted(set(sizes))
    step = max(1, -(-len(sizes) // most))
    round_sizes = [
        i for i, n in enumerate(sizes) if n >= 1024 and n & (n - 1) == 0 and n.bit_length() % 10 == 1
    ]
    chosen = sizes[(round_sizes[0] if round_sizes else 0) % step :: step]
    return chosen, [format_size(n) for n in chosen]


def plot(path: str, header: dict[str, Any], rows: list[Row]) -> None:
    """busbw against size, one line per algorithm (matplotlib imported here only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    names = list(dict.fromkeys(r.algorithm for r in rows))
    styles = line_styles(names, header["baseline"])
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in names:
        mine = [r for r in rows if r.algorithm == name]
        ax.plot(
            [r.size for r in mine],
            [r.busbw for r in mine],
            markersize=5,
            fillstyle="none",
            label=name,
            **styles[name],
        )
    ax.set_xscale("log", base=2)
    ticks, labels = size_ticks([r.size for r in rows])
    ax.set_xticks(ticks, labels)
    ax.xaxis.set_minor_locator(NullLocator())
    if all(r.busbw > 0 for r in rows):  # one rank has busbw 0 (factor 0): keep that linear
        ax.set_yscale("log")
    what = "the whole buffer, " if header.get("size_is") else ""
    ax.set_xlabel(f"message size ({what}bytes; K, M, G = 1024^1, 1024^2, 1024^3)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(
        f"hpcring {kind_of(header['collective']).title}, {header['ranks']} ranks on {header['hosts']} "
        f"host{'s' if header['hosts'] > 1 else ''}, {header['device']}, "
        f"{header['dtype']}" + ("" if header["op"] == "none" else f" {header['op']}")
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small", ncols=2 if len(names) > 6 else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(
    path: str, header: dict[str, Any], rows: list[Row], summary: list[dict[str, Any]], passes: list[list[Row]]
) -> None:
    """Header, the rows reported, the summary, and every pass when there were several."""
    with open(path, "w") as stream:
        report = {"header": header, "rows": [asdict(r) for r in rows], "summary": summary}
        if len(passes) > 1:
            report["passes"] = [[asdict(r) for r in one] for one in passes]
        json.dump(report, stream, indent=1)
