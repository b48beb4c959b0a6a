"""hpcring.config: the table against its page and the code, each parser, the snapshot, the digest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from hpcring import config
from hpcring.algorithms import ring, ring_staged
from hpcring.arrays import adapter_for
from hpcring.channel import Channel
from hpcring.config import BY_NAME, VARIABLES, Config
from hpcring.ops import OPS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"


def page_rows() -> dict[str, tuple[str, str]]:
    """{variable: (default, must agree)} from the page's first table (the package's variables)."""
    table = PAGE.read_text().split("\n## ")[0]
    rows = {}
    for line in table.splitlines():
        match = re.match(r"\| `(HPCRING_[A-Z_]+)` \| ([^|]*) \| ([^|]*) \|", line)
        if match:
            rows[match[1]] = (match[2].strip(), match[3].strip())
    return rows


def test_page_lists_every_variable_with_the_tables_default_and_must_agree() -> None:
    rows = page_rows()
    assert list(rows) == [v.name for v in VARIABLES], "names (and order) differ from hpcring/config.py"
    for variable in VARIABLES:
        default, agree = rows[variable.name]
        assert default == variable.default, (variable.name, default, variable.default)
        assert agree.split()[0] == ("yes" if variable.must_agree else "no"), (variable.name, agree)


def test_page_is_in_the_site() -> None:
    assert "configuration.md" in (ROOT / "mkdocs.yml").read_text()
    assert "(configuration.md)" in (ROOT / "docs" / "index.md").read_text()


def test_code_reads_no_variable_outside_the_table() -> None:
    """Every string literal in hpcring/ that is an HPCRING_ name (what os.environ is asked for)."""
    literal = re.compile(r"""(["'])(HPCRING_[A-Z][A-Z0-9_]*)\1""")
    found: dict[str, list[str]] = {}
    for source in sorted((ROOT / "hpcring").rglob("*.py")):
        for match in literal.finditer(source.read_text()):
            found.setdefault(match[2], []).append(str(source.relative_to(ROOT)))
    assert "HPCRING_CUDA_AWARE" in found, "the pattern finds nothing: has the code moved?"
    unknown = {name: where for name, where in found.items() if name not in BY_NAME}
    assert not unknown, f"not in hpcring/config.py's table: {unknown}"


def test_every_row_is_complete() -> None:
    attrs = [v.attr for v in VARIABLES]
    assert len(set(attrs)) == len(attrs) == len(BY_NAME)
    for v in VARIABLES:
        assert v.name.startswith("HPCRING_") and v.kind and v.default and v.meaning
        assert "\n" not in v.meaning and len(v.meaning) < 100, v.name
        assert getattr(Config, v.attr) is v


def parsed(name: str, raw: str | None) -> object:
    return getattr(Config({} if raw is None else {name: raw}), BY_NAME[name].attr)


POSITIVE = ["HPCRING_CHUNK_BYTES", "HPCRING_STAGING_CHUNK_BYTES", "HPCRING_RANKS_PER_NODE"]


@pytest.mark.parametrize("name", POSITIVE)
def test_positive_integers(name: str) -> None:
    assert parsed(name, None) is None and parsed(name, "") is None and parsed(name, "  ") is None
    assert parsed(name, "8") == 8 and parsed(name, " 040 ") == 40
    for bad in ("0", "-5", "4M", "1.5", "x", "+3"):
        with pytest.raises(ValueError) as error:
            parsed(name, bad)
        assert str(error.value) == f"{name} must be a positive integer, got {bad!r}"


def test_memory_limit_is_a_plain_byte_count() -> None:
    name = "HPCRING_MEMORY_LIMIT"
    assert parsed(name, None) is None and parsed(name, "") is None
    assert parsed(name, "0") == 0 and parsed(name, " 65536 ") == 65536
    for bad in ("64K", "-1", "1e6"):
        with pytest.raises(ValueError) as error:
            parsed(name, bad)
        assert str(error.value) == f"HPCRING_MEMORY_LIMIT must be a number of bytes, got {bad!r}"


def test_wait_sleep_is_microseconds_in_range() -> None:
    name = "HPCRING_WAIT_SLEEP_US"
    assert parsed(name, None) == 0.0 and parsed(name, "") == 0.0
    assert parsed(name, "20") == 20.0 and parsed(name, "0") == 0.0 and parsed(name, "1e6") == 1e6
    for bad in ("-1", "soon", "nan", "1e9", "inf"):
        with pytest.raises(ValueError) as error:
            parsed(name, bad)
        want = f"HPCRING_WAIT_SLEEP_US must be a number of microseconds in [0, 1e6], got {bad!r}"
        assert str(error.value) == want
    assert ring.wait_nap(Config({name: "50"})) == pytest.approx(50e-6)


def test_exchange_ranks_only_lowers_the_exchanges_limit() -> None:
    from hpcring.agreement import EXCHANGE_RANKS

    name = "HPCRING_EXCHANGE_RANKS"
    assert parsed(name, None) == EXCHANGE_RANKS == 4 and parsed(name, " ") == 4
    assert parsed(name, "1") == 1 and parsed(name, " 02 ") == 2 and parsed(name, "4") == 4
    for bad in ("0", "5", "-1", "2.0", "two"):
        with pytest.raises(ValueError) as error:
            parsed(name, bad)
        assert str(error.value) == f"{name} must be an integer from 1 to 4, got {bad!r}"
    assert Config({name: "2"}).digest() == Config({name: "02"}).digest() != Config({}).digest()
    assert Config({name: "4"}).digest() == Config({}).digest()


def test_timeout_keeps_its_own_grammar() -> None:
    name = "HPCRING_TIMEOUT"
    assert parsed(name, None) == 300.0
    assert parsed(name, "7.5") == 7.5 and parsed(name, "0") == 0.0 and parsed(name, " 5 ") == 5.0
    for bad in ("soon", ""):  # set but empty is refused, as it always was
        with pytest.raises(ValueError) as error:
            parsed(name, bad)
        assert str(error.value) == f"HPCRING_TIMEOUT must be a number of seconds, got {bad!r}"
    with pytest.raises(ValueError) as error:
        parsed(name, "-1")
    assert str(error.value) == "HPCRING_TIMEOUT must be >= 0, got '-1'"


def test_choices() -> None:
    inter = "HPCRING_HIERARCHICAL_INTER"
    assert parsed(inter, None) == "ring" and parsed(inter, " ") == "ring"
    assert parsed(inter, " rabenseifner ") == "rabenseifner"
    with pytest.raises(ValueError) as error:
        parsed(inter, "tree")
    assert str(error.value) == "HPCRING_HIERARCHICAL_INTER must be ring or rabenseifner, got 'tree'"
    aware = "HPCRING_CUDA_AWARE"
    assert parsed(aware, None) is None and parsed(aware, "") is None
    assert parsed(aware, "1") is True and parsed(aware, " 0 ") is False
    with pytest.raises(ValueError) as error:
        parsed(aware, "yes")
    assert str(error.value) == "HPCRING_CUDA_AWARE must be 1 or 0, got 'yes'"


def test_words_paths_and_the_corrupt_rank() -> None:
    assert parsed("HPCRING_DEVICE", " CPU ") == "cpu" and parsed("HPCRING_DEVICE", "gpu") == "gpu"
    assert parsed("HPCRING_DEVICE", "") is None
    for name in ("HPCRING_TRACE", "HPCRING_TUNING", "HPCRING_MODEL"):
        assert parsed(name, " ~/t.json ") == "~/t.json"  # ~ expanded, or not, where it is used
        assert parsed(name, "") is None and parsed(name, None) is None
    assert parsed("HPCRING_BENCH_CORRUPT", "1") == 1 and parsed("HPCRING_BENCH_CORRUPT", " 2 ") == 2
    assert parsed("HPCRING_BENCH_CORRUPT", "") is None
    with pytest.raises(ValueError, match="invalid literal for int"):
        parsed("HPCRING_BENCH_CORRUPT", "x")


def test_a_bad_value_raises_only_where_it_is_read_and_every_time() -> None:
    settings = Config({"HPCRING_CHUNK_BYTES": "4M", "HPCRING_TIMEOUT": "9"})
    assert settings.timeout == 9.0 and settings.trace is None
    assert isinstance(settings.digest(), int)
    for _ in range(2):
        with pytest.raises(ValueError, match="HPCRING_CHUNK_BYTES must be a positive integer, got '4M'"):
            _ = settings.chunk_bytes


def test_snapshot_is_frozen_and_copied() -> None:
    environ = {"HPCRING_CHUNK_BYTES": "64"}
    settings = Config(environ)
    environ["HPCRING_CHUNK_BYTES"] = "128"
    assert settings.chunk_bytes == 64 and settings.raw("HPCRING_CHUNK_BYTES") == "64"
    with pytest.raises(AttributeError):
        settings.chunk_bytes = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        settings.anything = 1  # type: ignore[attr-defined]
    assert Config({"HPCRING_CHUNK_BYTES": "64"}) == settings != Config({})
    assert "HPCRING_CHUNK_BYTES='64'" in repr(settings)


def test_current_is_cached_until_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    first = config.current()
    assert config.current() is first
    monkeypatch.setenv("HPCRING_CHUNK_BYTES", "4096")
    assert config.current() is first and first.raw("HPCRING_CHUNK_BYTES") != "4096"
    again = config.reload()
    assert config.current() is again is not first and again.chunk_bytes == 4096


def test_digest() -> None:
    base = Config({})
    assert base.digest() == Config({}).digest()
    assert Config({"HPCRING_CHUNK_BYTES": "040"}).digest() == Config({"HPCRING_CHUNK_BYTES": "40"}).digest()
    assert Config({"HPCRING_CHUNK_BYTES": "40"}).digest() != base.digest()
    # need not agree: no part of the digest
    assert Config({"HPCRING_TIMEOUT": "5", "HPCRING_TUNING": "t.json"}).digest() == base.digest()
    # the trace file: only whether every rank traces
    traced = Config({"HPCRING_TRACE": "a.json"}).digest()
    assert traced == Config({"HPCRING_TRACE": "b.json"}).digest() != base.digest()
    bad = Config({"HPCRING_CHUNK_BYTES": "4M"}).digest()
    assert bad != base.digest() and bad != Config({"HPCRING_CHUNK_BYTES": "4"}).digest()
    assert 0 <= base.digest() < 1 << 32


def test_digest_is_the_same_in_every_process() -> None:
    """No hash randomisation in it: another interpreter with another PYTHONHASHSEED agrees."""
    env = {"HPCRING_CHUNK_BYTES": "4096", "HPCRING_HIERARCHICAL_INTER": "rabenseifner"}
    code = "from hpcring.config import Config; import os; print(Config(os.environ).digest())"
    child = {**os.environ, **env, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    for key in ("PMIX_RANK", "OMPI_COMM_WORLD_RANK"):  # hpcring.config needs no MPI at all
        child.pop(key, None)
    out = subprocess.run([sys.executable, "-c", code], env=child, capture_output=True, text=True, check=True)
    assert int(out.stdout) == Config(env).digest()


def test_ring_reads_its_channels_snapshot_not_the_environment() -> None:
    """The snapshot a channel holds is the one in force: a bad value there is refused, on any path."""
    ch = Channel(MPI.COMM_SELF, adapter_for(np.empty(0)))
    assert ch.config is config.current()
    x = np.ones(10)
    ring.allreduce(ch, x, x, OPS["sum"])  # the environment's (empty) config: fine
    ch.config = Config({"HPCRING_WAIT_SLEEP_US": "soon"})
    with pytest.raises(ValueError, match="HPCRING_WAIT_SLEEP_US"):
        ring.allreduce(ch, x, x, OPS["sum"])
    assert ring.chunk_elements(4, settings=Config({"HPCRING_CHUNK_BYTES": "4096"})) == 1024
    assert ring_staged.pieces(4000, 2, 4, Config({"HPCRING_STAGING_CHUNK_BYTES": "1000"})) == 8
