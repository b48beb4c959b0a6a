"""Whether a compiled module was built from the C sources beside it: a checkout pulled or edited
without rebuilding is refused, and its Python path runs, instead of a module that no longer
matches the Python that calls it (one of an older core.c hung at its first warm call).

setup.py writes each module's `digest` of its sources into it (``SOURCES_DIGEST``) and loads this
file by path to do so (it cannot import hpcring). Installed wheels carry no sources: nothing to
compare there. Where the sources are no newer than the module (a fresh build), a few stat calls
decide; only a newer source is read and hashed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_c")


def sources(main: str, folder: str = SOURCES) -> list[str]:
    """The files a module is built from: its C file and every header, sorted by name."""
    headers = [name for name in os.listdir(folder) if name.endswith(".h")]
    return sorted([main, *headers])


def digest(names: Sequence[str], folder: str = SOURCES) -> str:
    """SHA-256 of the files ``names`` in ``folder``: each name, a NUL, its bytes."""
    import hashlib  # here: a fresh build never hashes, and the import costs a first call 1-2 ms

    sha = hashlib.sha256()
    for name in names:
        sha.update(name.encode() + b"\0")
        with open(os.path.join(folder, name), "rb") as file:
            sha.update(file.read())
    return sha.hexdigest()


def stale(module: Any, main: str, folder: str = SOURCES) -> str | None:
    """Why ``module`` (built from ``main`` and the headers in ``folder``) must not run, in words:
    its sources changed since it was built; None where they did not, or are not here."""
    built = getattr(module, "__file__", None)
    if not built or not os.path.isfile(os.path.join(folder, main)):
        return None  # an installed wheel: no sources beside it
    names = sources(main, folder)
    when = os.stat(built).st_mtime
    if all(os.stat(os.path.join(folder, name)).st_mtime <= when for name in names):
        return None
    if getattr(module, "SOURCES_DIGEST", "") == digest(names, folder):
        return None  # touched, not changed
    return (
        f"{module.__name__} was built from other sources than {folder} holds now; rebuild it "
        "(pip install -e . in the clone, or python setup.py build_ext --inplace)"
    )
