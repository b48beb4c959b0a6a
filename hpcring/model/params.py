"""The calibration file: where it lives, its format, reading it strictly and writing it atomically.

Reading is pure (no MPI), so the bench and ``auto`` load it on any rank; every defect of the
file is a `ModelError` that names the file and the key.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from .. import config
from .costs import Busy, ModelError, Params

# 2: busy entries may hold hpcring's software apart (``step``, ``overhead``); files of version 1,
# without them, read as before.
FORMAT_VERSION = 2


def default_path() -> Path:
    """$HPCRING_MODEL, else ~/.cache/hpcring/model.json."""
    given = config.current().model
    return Path(given).expanduser() if given else Path.home() / ".cache" / "hpcring" / "model.json"


def load_params(path: str | os.PathLike[str] | None = None) -> Params:
    """The calibrated parameters at ``path`` (default: `default_path`); ModelError if missing or bad."""
    where = Path(path).expanduser() if path is not None else default_path()
    try:
        data = json.loads(where.read_text())
    except FileNotFoundError:
        raise ModelError(
            f"no calibration file at {where}: run `mpiexec -n 2 python -m hpcring.model --calibrate`"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelError(f"corrupt calibration file {where}: {error}") from None
    if not isinstance(data, dict):
        raise ModelError(f"corrupt calibration file {where}: not a JSON object")
    values = {}
    for key in ("alpha", "beta", "gamma"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ModelError(
                f"corrupt calibration file {where}: {key} must be a positive number, got {value!r}"
            )
        values[key] = float(value)
    cores = data.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores <= 0):
        raise ModelError(f"corrupt calibration file {where}: cores must be a positive integer, got {cores!r}")
    for key in ("inter_alpha", "inter_beta"):  # optional: calibrated across two nodes
        value = data.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf
        ):
            raise ModelError(
                f"corrupt calibration file {where}: {key} must be a positive number, got {value!r}"
            )
        values[key] = None if value is None else float(value)
    busy = _load_busy(data.get("busy", {}), where)
    partial = _load_busy(data.get("partial", {}), where, "partial")
    meta = {k: v for k, v in data.items() if k not in values and k not in ("cores", "busy", "partial")}
    meta["path"] = str(where)
    return Params(**values, cores=cores, meta=meta, busy=busy, partial=partial)


def _load_busy(table: Any, where: Path, name: str = "busy") -> dict[int, Busy]:
    """The ``busy`` (or ``partial``) table of a calibration file:
    {"p": {"alpha": ..., "beta": ..., "gamma": ..., "call": ..., "cold": ..., "step": ...,
    "overhead": ...}}; call and cold are 0 where absent, step and overhead None."""
    if not isinstance(table, dict):
        raise ModelError(f"corrupt calibration file {where}: {name} must be an object")
    busy = {}
    for key, entry in table.items():
        ok = str(key).isdigit() and int(key) > 1 and isinstance(entry, dict)
        values = [entry.get(k) for k in ("alpha", "beta", "gamma")] if ok else []
        if not ok or not all(
            not isinstance(v, bool) and isinstance(v, int | float) and 0 < v < math.inf for v in values
        ):
            raise ModelError(
                f"corrupt calibration file {where}: {name}[{key!r}] must hold positive alpha, beta, gamma"
            )
        extra = {k: entry.get(k, 0.0) for k in ("call", "cold")}
        for k, v in extra.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ModelError(
                    f"corrupt calibration file {where}: {name}[{key!r}] {k} must be a number >= 0"
                )
        software = {k: entry.get(k) for k in ("step", "overhead")}  # absent before version 2
        for k, v in software.items():
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf
            ):
                raise ModelError(
                    f"corrupt calibration file {where}: {name}[{key!r}] {k} must be a number >= 0"
                )
        busy[int(key)] = Busy(
            *map(float, values),
            **{k: float(v) for k, v in extra.items()},
            **{k: None if v is None else float(v) for k, v in software.items()},
        )
    return busy


def save_params(params: Params, path: Path) -> None:
    """Write ``params`` atomically (a reader never sees half a file)."""
    record = {
        "version": FORMAT_VERSION,
        "alpha": params.alpha,
        "beta": params.beta,
        "gamma": params.gamma,
        "cores": params.cores,
        "busy": {str(p): _entry(b) for p, b in sorted(params.busy.items())},
        "partial": {str(p): _entry(b) for p, b in sorted(params.partial.items())},
        "inter_alpha": params.inter_alpha,
        "inter_beta": params.inter_beta,
    }
    record.update({k: v for k, v in params.meta.items() if k != "path"})
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(path)
    except OSError as error:
        raise ModelError(f"cannot write the calibration file {path}: {error.strerror or error}") from None


def _entry(busy: Busy) -> dict[str, float]:
    """One busy (or partial) entry as the file holds it: the figures not measured left out."""
    return {k: v for k, v in vars(busy).items() if v is not None}


def keep_busy(params: Params, path: Path) -> Params:
    """``params`` plus the busy figures for other rank counts already in ``path`` from this host:
    calibrating at 2, 3 and 4 ranks one after another builds one file."""
    try:
        old = load_params(path)
    except ModelError:
        return params
    if old.meta.get("host") != params.meta.get("host"):
        return params
    return dataclasses.replace(
        params, busy={**old.busy, **params.busy}, partial={**old.partial, **params.partial}
    )
