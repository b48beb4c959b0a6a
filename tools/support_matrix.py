"""Write docs/support.md, the support matrix, from the code: what each collective, algorithm,
dtype, op and array kind accepts.

    python tools/support_matrix.py            rewrite docs/support.md
    python tools/support_matrix.py --check    exit 1 when docs/support.md and the code part

Read from: the algorithm tables (`hpcring.algorithms.table`) and each Spec's traits
(``narrowings``: wire=; ``refuses``: arrays it cannot run on; ``choose``: a chooser;
``persistent``: `hpcring.plan`'s MPI-4 persistent request), `hpcring.ops` (``DTYPES``, ``OPS``
and the dtype kinds each op applies to), `hpcring.exact` (reproducible=True) and `hpcring.wire`
(wire=), and the array kinds of `hpcring.arrays`. Nothing here imports MPI.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import SimpleNamespace

import hpcring
from hpcring import algorithms, arrays, exact, ops, wire

PAGE = Path(__file__).resolve().parent.parent / "docs" / "support.md"
YES, NO = "yes", "—"

INTRO = """# Support matrix

What each collective, algorithm, dtype, op and array kind accepts, as the code of this release
declares it. A combination outside these tables is refused with a `TypeError` or `ValueError`
naming what is accepted, before anything is sent.

This page is written from the code by `python tools/support_matrix.py`, and a test fails when
the two part.
"""


def _mark(flag: bool) -> str:
    return YES if flag else NO


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows), ""]


def _on_gpu(kind: str) -> bool:
    """Whether arrays of this kind live on a GPU (CuPy, CUDA tensors): by its name as
    `hpcring.arrays` lists it."""
    return kind.startswith("cupy") or "(CUDA)" in kind


def _accepts(spec: algorithms.Spec, kind: str) -> bool:
    """Whether ``spec`` runs on arrays of ``kind`` (its ``refuses`` asks an adapter's ``device``)."""
    return spec.refuses is None or spec.refuses(SimpleNamespace(device=_on_gpu(kind))) is None


def _default(collective: str) -> str:
    """The ``algorithm=`` default of the front end ``hpcring.<collective>``."""
    return inspect.signature(getattr(hpcring, collective)).parameters["algorithm"].default


def algorithms_section() -> list[str]:
    names: list[str] = []
    for c in algorithms.COLLECTIVES:
        names += [n for n in algorithms.table(c) if n not in names]
    lines = [
        "## Algorithms by collective",
        "",
        "The `algorithm=` each collective takes. "
        + ", ".join(f"`hpcring.{c}`'s default is `{_default(c)}`" for c in algorithms.COLLECTIVES)
        + "; `auto` chooses among the others for each call (a chooser, not an algorithm of its own).",
        "",
    ]
    rows = [[f"`{n}`", *(_mark(n in algorithms.table(c)) for c in algorithms.COLLECTIVES)] for n in names]
    lines += _table(["algorithm", *(f"`{c}`" for c in algorithms.COLLECTIVES)], rows)
    return lines


def _kinds() -> list[str]:
    """The array kinds hpcring ships, as `hpcring.arrays` names them."""
    return list(arrays.NAMES[: len(arrays.SHIPPED)])


def traits_section() -> list[str]:
    lines = ["## What each algorithm takes", ""]
    for c in algorithms.COLLECTIVES:
        lines += [f"### `{c}`", ""]
        rows = [
            [
                f"`{name}`" + (" (baseline)" if name in algorithms.BASELINES else ""),
                _mark(spec.narrowings is not None),
                _mark(spec.choose is not None),
                _mark(spec.persistent is not None),
            ]
            for name, spec in algorithms.table(c).items()
        ]
        lines += _table(["algorithm", "`wire=`", "chooser", "persistent (`hpcring.plan`)"], rows)
    lines += [
        "A baseline runs only where its library does (NCCL: CuPy arrays, one GPU per rank); it is",
        "not among what `auto` chooses from. `wire=` exists on `allreduce` only. Of the `alltoall`",
        "algorithms, "
        + ", ".join(
            f"`{name}`" for name, spec in algorithms.table(algorithms.ALLTOALL).items() if spec.equal_only
        )
        + " runs equal blocks only: uneven ones (`send_splits=`) run on "
        + ", ".join(f"`{name}`" for name in algorithms.uneven(algorithms.ALLTOALL))
        + " or `auto`.",
        "",
    ]
    return lines


def kinds_section() -> list[str]:
    kinds = _kinds()
    lines = [
        "## Array kinds",
        "",
        "Which array kinds each algorithm runs on. An array of a kind an algorithm refuses is a",
        "`TypeError` on every rank (with `check=True`, the default).",
        "",
    ]
    by_name: dict[str, dict[str, list[str]]] = {}
    for c in algorithms.COLLECTIVES:
        for name, spec in algorithms.table(c).items():
            cells = [_mark(_accepts(spec, kind)) for kind in kinds]
            by_name.setdefault(name, {}).setdefault(" ".join(cells), []).append(c)
    rows = []
    for name, variants in by_name.items():
        for cells, collectives in variants.items():
            label = f"`{name}`" if len(variants) == 1 else f"`{name}` ({', '.join(collectives)})"
            rows.append([label, *cells.split(" ")])
    lines += _table(["algorithm", *kinds], rows)
    return lines


def dtypes_section() -> list[str]:
    lines = [
        "## Dtypes and ops",
        "",
        "The ops of `allreduce` and `reduce_scatter` (`op=`, or mpi4py's `MPI.SUM`, `MPI.MAX`,",
        "`MPI.MIN`, `MPI.PROD`); `allgather`, `broadcast` and `alltoall` take no op and move every",
        "dtype below. `reproducible=True` and `wire=` are `allreduce`'s.",
        "",
    ]
    head = ["dtype", *(f"`{name}`" for name in ops.OPS), "`reproducible=True`", "`wire=`"]
    rows = []
    for dtype in ops.DTYPES:
        kind = ops.kind(dtype)
        rows.append(
            [
                f"`{dtype.name}`",
                *(_mark(kind in op.kinds) for op in ops.OPS.values()),
                _mark(dtype in exact.FORMATS),
                _mark(dtype in wire.WIDE),
            ]
        )
    lines += _table(head, rows)
    lines += [
        f"`reproducible=True` applies to the ops {', '.join(f'`{o}`' for o in exact.OPS_REPRODUCIBLE)}"
        " (max and min are exact as they are). "
        f"`wire=` takes {', '.join(f'`{w!r}`' for w in wire.WIRES)}, on host arrays only"
        f" ({', '.join(k for k in _kinds() if not _on_gpu(k))}).",
        "",
        "A torch tensor or a JAX array is reduced as the NumPy dtype of the same name (bfloat16:",
        "ml_dtypes', as JAX's own).",
        "",
    ]
    return lines


def render() -> str:
    lines = [INTRO, *algorithms_section(), *traits_section(), *kinds_section(), *dtypes_section()]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if PAGE.read_text() != text:
            print(f"{PAGE} differs from the code: run python tools/support_matrix.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
