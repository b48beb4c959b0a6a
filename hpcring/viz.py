"""Step-by-step pictures of an all-reduce, drawn from a real trace (``HPCRING_TRACE``).

    python -m hpcring.viz TRACE.json --out DIR [--algorithms ring naive ps]

For each traced algorithm (its first call in the file) it replays the trace symbolically:
every element of every rank's memory holds the set of ranks whose contributions are summed
in it (rank r's buffer starts as {r}). Sends carry the sender's sets, receives overwrite,
reductions take the union, copies copy. One picture per MPI step shows, per rank, the
user's buffer cut into G segments a, b, c, ... labelled with what they hold (``b0+b1``: the
sum of segment b of ranks 0 and 1) and, as arrows, which segment each rank sent to whom.
Whole-buffer scratch (naive's copies, the parameter server's gather rows) is drawn under
the buffer. Nothing here is drawn by hand: change the algorithm and the pictures follow.
"""

from __future__ import annotations

import argparse
import functools
import json
import operator
import string
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import algorithms
from .partition import segment_bounds
from .tracing import MPI_CALLS

Key = tuple[str, int]


@dataclass
class Step:
    """One MPI call per rank (the k-th on each), and every rank's memory after its local work."""

    sends: list[tuple[int, int, dict[str, Any], int]]  # (rank, peer, buffer desc, payload mask)
    receives: list[tuple[int, int, dict[str, Any]]]  # (rank, peer, buffer desc)
    collective: str | None
    state: list[dict[Key, int]]


@dataclass
class Replay:
    algorithm: str
    size: int
    count: int
    itemsize: int
    steps: list[Step] = field(default_factory=list)


def load(path: str | Path) -> list[dict[str, Any]]:
    """The trace's complete ("X") events, in each rank's recording order."""
    with open(path) as stream:
        data = json.load(stream)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [event for event in events if event.get("ph") == "X"]


def calls(events: list[dict[str, Any]]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Per algorithm, each rank's events of the first traced call of that algorithm."""
    first: dict[tuple[str, int], int] = {}
    for event in events:
        args = event["args"]
        if "algorithm" in args and "call" in args:
            key = (args["algorithm"], event["pid"])
            first[key] = min(first.get(key, args["call"]), args["call"])
    chosen: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for event in events:
        args = event["args"]
        key = (args.get("algorithm", ""), event["pid"])
        if "call" in args and first.get(key) == args["call"] and event["cat"] != "call":  # not the span
            chosen[key[0]][args["rank"]].append(event)
    return chosen


def _keys(desc: dict[str, Any], itemsize: int) -> list[Key]:
    """The elements a buffer description covers, as (memory, index) keys."""
    if not desc:
        return []
    n = desc["bytes"] // itemsize
    if desc["buffer"] == "scratch":
        return [("scratch", desc["address"] + i * itemsize) for i in range(n)]
    start = desc["offset"] // itemsize
    return [(desc["buffer"], start + i) for i in range(n)]


def replay(algorithm: str, per_rank: dict[int, list[dict[str, Any]]]) -> Replay:
    """Run the traced call symbolically; one `Step` per MPI call index."""
    size = next(iter(per_rank.values()))[0]["args"]["size"]
    count = next(iter(per_rank.values()))[0]["args"]["count"]
    itemsize = next(iter(per_rank.values()))[0]["args"]["itemsize"]
    user = "buf" if next(iter(per_rank.values()))[0]["args"]["in_place"] else "src"
    state = [{(user, i): 1 << rank for i in range(count)} for rank in range(size)]

    # Group each rank's events into MPI calls (send/recv halves of one call share a start).
    def split(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        groups: list[list[dict[str, Any]]] = [[]]
        last_ts = None
        for event in events:
            mpi = event["cat"] == MPI_CALLS and event["name"] in ("send", "recv", "MPI_Allreduce")
            if mpi and (last_ts != event["ts"] or not groups[-1]):
                groups.append([])
            if mpi:
                last_ts = event["ts"]
            groups[-1].append(event)
        return groups

    grouped = {rank: split(per_rank.get(rank, [])) for rank in range(size)}
    total = max(len(groups) for groups in grouped.values())
    result = Replay(algorithm, size, count, itemsize)
    messages: dict[tuple[int, int, str], list[list[int]]] = defaultdict(list)
    taken: dict[tuple[int, int, str], int] = defaultdict(int)
    pending: dict[int, list[tuple[int, int, str, list[Key]]]] = defaultdict(list)  # posted irecvs
    payloads: dict[int, int] = {}  # id(send event) -> what it carried, when it was sent

    def channel(event: dict[str, Any]) -> str:
        return event["args"].get("collective") or "p2p"

    def run(rank: int, event: dict[str, Any]) -> bool:
        """Apply one event to ``rank``'s memory; False when its message has not been sent yet."""
        args, here = event["args"], state[rank]
        if event["name"] == "send":
            masks = [here.get(k, 0) for k in _keys(args, itemsize)]
            messages[(rank, args["peer"], channel(event))].append(masks)
            payloads[id(event)] = functools.reduce(operator.or_, masks, 0)
        elif event["name"] == "recv":
            link = (args["peer"], rank, channel(event))
            if args.get("nonblocking"):
                pending[rank].append((args["peer"], taken[link], link[2], _keys(args, itemsize)))
                taken[link] += 1
                return True
            if len(messages[link]) <= taken[link]:
                return False
            for key, mask in zip(_keys(args, itemsize), messages[link][taken[link]], strict=False):
                here[key] = mask
            taken[link] += 1
        elif event["name"] == "wait":  # the receives it completes land now (the first match each)
            for request in args["requests"]:
                if request.get("kind") != "recv":
                    continue
                wanted = (request["peer"], _keys(request, itemsize))
                entry = next((p for p in pending[rank] if (p[0], p[3]) == wanted), None)
                if entry is None:
                    continue  # completed by an earlier try of this same wait
                peer, index, kind, keys = entry
                link = (peer, rank, kind)
                if len(messages[link]) <= index:
                    return False
                for key, mask in zip(keys, messages[link][index], strict=False):
                    here[key] = mask
                pending[rank].remove(entry)
        elif event["name"] == "reduce":
            left, right = _keys(args["left"], itemsize), _keys(args["right"], itemsize)
            masks = [here.get(a, 0) | here.get(b, 0) for a, b in zip(left, right, strict=False)]
            for key, mask in zip(_keys(args["out"], itemsize), masks, strict=False):
                here[key] = mask
        elif event["name"] == "copy":
            masks = [here.get(k, 0) for k in _keys(args["src"], itemsize)]
            for key, mask in zip(_keys(args["dst"], itemsize), masks, strict=False):
                here[key] = mask
        elif event["name"] == "MPI_Allreduce":
            for key in _keys(args, itemsize):
                here[key] = (1 << size) - 1
        return True

    # Each rank runs as far as its messages allow (non-blocking receives complete at their
    # wait, possibly a call later than the sender's), and its memory is copied at the end of
    # each of its own MPI calls: step k shows every rank after its k-th call and local work.
    snapshots: list[list[dict[Key, int]]] = [[] for _ in range(size)]
    cursor = {rank: (0, 0) for rank in range(size)}  # (group, event within it)
    while any(cursor[rank][0] < len(grouped[rank]) for rank in range(size)):
        progress = False
        for rank in range(size):
            group, at = cursor[rank]
            while group < len(grouped[rank]):
                if at == len(grouped[rank][group]):
                    snapshots[rank].append(dict(state[rank]))
                    group, at = group + 1, 0
                    continue
                if not run(rank, grouped[rank][group][at]):
                    break
                at, progress = at + 1, True
            cursor[rank] = (group, at)
        if not progress and any(cursor[rank][0] < len(grouped[rank]) for rank in range(size)):
            raise ValueError(f"{algorithm}: the trace does not replay (a receive has no matching send)")
    for index in range(total):
        memory = [snapshots[rank][min(index, len(snapshots[rank]) - 1)] for rank in range(size)]
        if index == 0:
            result.steps.append(Step([], [], None, memory))
            continue
        sends, receives, collective = [], [], None
        for rank in range(size):
            if index < len(grouped[rank]):
                for event in grouped[rank][index]:
                    args = event["args"]
                    collective = collective or args.get("collective")
                    if event["name"] == "send":
                        sends.append((rank, args["peer"], args, payloads[id(event)]))
                    elif event["name"] == "recv":
                        receives.append((rank, args["peer"], args))
        result.steps.append(Step(sends, receives, collective, memory))
    return result


# --- drawing -------------------------------------------------------------------------------


def _label(letter: str, mask: int, size: int) -> str:
    ranks = [r for r in range(size) if mask >> r & 1]
    if not ranks:
        return "?"
    if len(ranks) == size > 2:  # complete: the sum over every rank
        return f"$\\Sigma {letter}$"
    return "$" + "{+}".join(f"{letter}_{{{r}}}" for r in ranks) + "$"


def _segment_mask(memory: dict[Key, int], name: str, start: int, stop: int) -> int | None:
    masks = {memory.get((name, i), 0) for i in range(start, stop)}
    return masks.pop() if len(masks) == 1 else None


def _user(replay_: Replay, memory: dict[Key, int]) -> str:
    """Which user buffer holds the result: dst out of place, buf in place."""
    return "buf" if any(k[0] == "buf" for k in memory) and not any(k[0] == "dst" for k in memory) else "dst"


def _scratch_rows(replay_: Replay, memory: dict[Key, int]) -> list[int]:
    """Start addresses of whole-buffer scratch rows that hold something (naive's copies, ps's stack)."""
    addresses = sorted(k[1] for k in memory if k[0] == "scratch" and memory[k])
    rows, span = [], replay_.count * replay_.itemsize
    for address in addresses:
        if not rows or address >= rows[-1] + span:
            rows.append(address)
    return [
        row
        for row in rows
        if all(memory.get(("scratch", row + i * replay_.itemsize)) for i in range(replay_.count))
    ]


def describe(replay_: Replay, index: int) -> str:
    """A title for step ``index`` (0 is the state before any message): the algorithm's own
    picture of it where its Spec draws one (`Spec.picture`), else what the trace shows."""
    name, size, steps = replay_.algorithm, replay_.size, len(replay_.steps) - 1
    if index == 0:
        last = size - 1
        return f"{name}, before: rank r holds its own a_r, b_r, ... (green: Σa = a_0+...+a_{last})"
    step = replay_.steps[index]
    spec = algorithms.table(algorithms.ALLREDUCE).get(name)
    title = spec.picture(index, steps, size) if spec is not None and spec.picture else None
    if title is not None:
        return title
    if step.collective:
        return f"{name} step {index}/{steps}: {step.collective}" + (
            " (then the root sums the rows)" if step.collective == "gather" else ""
        )
    return f"{name} step {index}/{steps}"


def _scratch_depth(replay_: Replay) -> int:
    """The most scratch rows any rank shows at any step (the panel grows to hold them)."""
    return max(
        (
            len(_scratch_rows(replay_, step.state[rank]))
            for step in replay_.steps
            for rank in range(replay_.size)
        ),
        default=0,
    )


def draw(ax: Any, replay_: Replay, index: int) -> None:
    """Draw step ``index`` of ``replay_`` into matplotlib axes ``ax``."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    size, count, itemsize = replay_.size, replay_.count, replay_.itemsize
    step = replay_.steps[index]
    bounds = segment_bounds(count, size)
    letters = string.ascii_lowercase
    width, height, gap = 3.0, 0.7, 2.4
    full = (1 << size) - 1
    scratch = {rank: _scratch_rows(replay_, step.state[rank]) for rank in range(size)}
    deepest = max((len(rows) for rows in scratch.values()), default=0)
    sent = [
        (rank, desc["offset"] // itemsize, (desc["offset"] + desc["bytes"]) // itemsize)
        for rank, _, desc, _ in step.sends
        if desc.get("buffer") in ("buf", "src", "dst")
    ]

    def colour(mask: int | None) -> str:
        if mask is None or mask == 0:
            return "#eeeeee"
        if mask == full:
            return "#8fd18f"
        share = bin(mask).count("1") / size
        return (0.75 - 0.35 * share, 0.85 - 0.25 * share, 1.0)  # type: ignore[return-value]

    def box_y(desc: dict[str, Any], rank: int) -> float:
        if desc.get("buffer") == "scratch":
            rows = scratch[rank]
            for row_index, row in enumerate(rows):
                if row <= desc["address"] < row + count * itemsize:
                    return -(size + 0.6 + row_index) * height - height / 2
            return -size * height / 2
        offset, n = desc.get("offset", 0) // itemsize, desc.get("bytes", 0) // itemsize
        if n >= count or count == 0:
            return -size * height / 2
        segment = next((s for s, (lo, hi) in enumerate(bounds) if lo <= offset < hi), 0)
        return -segment * height - height / 2

    for rank in range(size):
        x0 = rank * (width + gap)
        memory = step.state[rank]
        user = _user(replay_, memory)
        ax.text(x0 + width / 2, 0.25, f"rank {rank}", ha="center", va="bottom", fontsize=10, weight="bold")
        for segment, (lo, hi) in enumerate(bounds):
            mask = _segment_mask(memory, user, lo, hi) if index else 1 << rank
            if index and user == "dst" and not mask:
                mask = _segment_mask(memory, "src", lo, hi)  # out of place: dst empty until written
            y = -(segment + 1) * height
            hot = any(r == rank and a < hi and lo < b for r, a, b in sent)  # this segment went out
            ax.add_patch(
                Rectangle(
                    (x0, y),
                    width,
                    height,
                    facecolor=colour(mask),
                    edgecolor="#d9480f" if hot else "#555",
                    linewidth=2.5 if hot else 0.8,
                )
            )
            text = _label(letters[segment], mask, size) if mask is not None else "mixed"
            ax.text(x0 + width / 2, y + height / 2, text, ha="center", va="center", fontsize=8)
        for row_index, row in enumerate(scratch[rank]):
            y = -(size + 1.6 + row_index) * height
            cell = width / size
            for segment, (lo, _) in enumerate(bounds):
                mask = memory.get(("scratch", row + lo * itemsize), 0)
                ax.add_patch(
                    Rectangle(
                        (x0 + segment * cell, y),
                        cell,
                        height,
                        facecolor=colour(mask),
                        edgecolor="#999",
                        linewidth=0.5,
                    )
                )
                ax.text(
                    x0 + (segment + 0.5) * cell,
                    y + height / 2,
                    _label(letters[segment], mask, size),
                    ha="center",
                    va="center",
                    fontsize=7,
                )
        if scratch[rank]:
            ax.text(x0, -(size + 0.4) * height, "copies held:", fontsize=7, va="center")

    bow, top, bottom = 0.12, 0.75, -(size + 0.15 + (deepest + 1.2) * bool(deepest)) * height
    reach_up = reach_down = 0.0
    for rank, peer, desc, payload in step.sends:
        receive = next((d for r, p, d in step.receives if r == peer and p == rank), {})
        hops = peer - rank
        if hops == 1:  # the neighbour: straight across, segment to segment
            start = (rank * (width + gap) + width, box_y(desc, rank))
            end = (peer * (width + gap), box_y(receive, peer) if receive else -size * height / 2)
            rad = 0.0
        else:  # farther right: a bow over the columns; leftwards (the ring's wrap): under them
            y = top if hops > 0 else bottom
            start, end = (rank * (width + gap) + width / 2, y), (peer * (width + gap) + width / 2, y)
            rad = -bow
        dx, dy = end[0] - start[0], end[1] - start[1]
        middle = ((start[0] + end[0]) / 2 + rad * dy / 2, (start[1] + end[1]) / 2 - rad * dx / 2)
        if hops == 1:  # above a straight arrow, not on it
            middle = (middle[0], max(start[1], end[1]) + 0.22)
        if hops > 1:
            reach_up = max(reach_up, bow * dx / 2)
        elif hops < 0:
            reach_down = max(reach_down, -bow * dx / 2)
        ax.add_patch(
            FancyArrowPatch(
                start,
                end,
                arrowstyle="-|>",
                mutation_scale=14,
                color="#d9480f",
                linewidth=1.4,
                connectionstyle=f"arc3,rad={rad}",
            )
        )
        n = desc.get("bytes", 0) // itemsize
        offset = desc.get("offset", 0) // itemsize
        covered = [s for s, (lo, hi) in enumerate(bounds) if hi > lo and offset <= lo and hi <= offset + n]
        covered = covered or [next((s for s, (lo, hi) in enumerate(bounds) if lo <= offset < hi), 0)]
        first, last = _label(letters[covered[0]], payload, size), _label(letters[covered[-1]], payload, size)
        what = first if len(covered) == 1 else f"{first}..{last}"  # a range of segments: its ends
        ax.text(
            middle[0],
            middle[1],
            what,
            ha="center",
            va="center",
            fontsize=8,
            color="#d9480f",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
        )
    ax.set_title(describe(replay_, index), fontsize=10, loc="left")
    ax.set_xlim(-0.3, size * (width + gap) - gap + 0.3)
    ax.set_ylim(bottom - reach_down - 0.5, top + reach_up + 0.4)
    ax.set_aspect("equal")
    ax.axis("off")


def render(trace_path: str | Path, out: str | Path, algorithms: list[str] | None = None) -> list[Path]:
    """Write ``<algorithm>-step<k>.png`` per step and ``<algorithm>.png`` (all steps) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for algorithm, per_rank in sorted(calls(load(trace_path)).items()):
        if algorithms and algorithm not in algorithms:
            continue
        result = replay(algorithm, per_rank)
        panel = (1.0 + 1.25 * result.size, 0.9 + 0.45 * result.size)
        extra = 0.35 * _scratch_depth(result)
        for index in range(len(result.steps)):
            fig, ax = plt.subplots(figsize=(panel[0], panel[1] + extra))
            draw(ax, result, index)
            path = out / f"{algorithm}-step{index}.png"
            fig.savefig(path, dpi=110, bbox_inches="tight")
            plt.close(fig)
            written.append(path)
        rows = len(result.steps)
        fig, axes = plt.subplots(rows, 1, figsize=(panel[0], rows * (panel[1] + extra)))
        for index, ax in enumerate(axes if rows > 1 else [axes]):
            draw(ax, result, index)
        path = out / f"{algorithm}.png"
        fig.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcring.viz", description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="a trace written with HPCRING_TRACE=... or hpcring.trace(...)")
    parser.add_argument("--out", default=".", help="directory for the PNG files")
    parser.add_argument("--algorithms", nargs="*", help="only these algorithms (default: all traced)")
    args = parser.parse_args(argv)
    for path in render(args.trace, args.out, args.algorithms):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
