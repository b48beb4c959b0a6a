"""The commands the docs show must still exist: a renamed module or a stale install line fails here.

Every fenced ``bash`` block of README.md and docs/*.md (the engineering log aside) is read line
by line: each ``python -m MODULE`` must name a module of this checkout (found, not imported, so no
MPI starts), each ``python PATH.py`` a file of it, and no line may install ``hpcring[...]`` from
PyPI, where hpcring is not published. A block preceded by ``<!-- docs-check: cluster-only -->``
is still checked this way. Running every command is left to the pages' own regeneration
(docs/make_figures.sh) and the example tests.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOG = "engineering-log.md"  # dated records, not instructions
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != LOG)]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def commands(page: Path) -> list[str]:
    """The lines of the page's bash blocks, continuation lines joined."""
    lines: list[str] = []
    for block in FENCE.findall(page.read_text()):
        lines += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return lines


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_commands_name_what_exists(page: Path) -> None:
    problems = []
    for line in commands(page):
        code = line.split(" #", 1)[0]
        for module in re.findall(r"python3? -m ([\w.]+)", code):
            if module.startswith("hpcring") and importlib.util.find_spec(module) is None:
                problems.append(f"no module {module}: {line}")
        for script in re.findall(r"python3? ((?:tools|tests|docs)/[\w/.-]+\.py)", code):
            if not (ROOT / script).exists():
                problems.append(f"no file {script}: {line}")
        if re.search(r"pip install [^#]*'hpcring\[", code):
            problems.append(f"hpcring is not on PyPI: {line}")
    assert not problems, "\n".join(problems)


def test_no_page_installs_hpcring_from_pypi() -> None:
    pypi = re.compile(r"pip install '?hpcring\[[^\]]*\]'?")
    bad = [f"{p.name}: {m}" for p in PAGES for m in pypi.findall(p.read_text())]
    assert not bad, bad
