"""docs/support.md is the support matrix as the code declares it: a new algorithm, dtype, op, array
kind or trait changes the page, and this fails until `python tools/support_matrix.py` rewrites it.
Serial, no MPI."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_tool():
    spec = importlib.util.spec_from_file_location("support_matrix", ROOT / "tools" / "support_matrix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_support_page_matches_the_code() -> None:
    tool = load_tool()
    assert (ROOT / "docs" / "support.md").read_text() == tool.render(), (
        "docs/support.md and the code part: run python tools/support_matrix.py"
    )


def test_support_page_lists_every_algorithm_and_dtype() -> None:
    from hpcring import algorithms, ops

    page = (ROOT / "docs" / "support.md").read_text()
    for collective in algorithms.COLLECTIVES:
        assert f"### `{collective}`" in page
        for name in algorithms.table(collective):
            assert f"| `{name}`" in page
    for dtype in ops.DTYPES:
        assert f"| `{dtype.name}` |" in page
