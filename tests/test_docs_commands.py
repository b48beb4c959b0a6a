"""The commands the docs show must exist and run: a renamed module, a removed flag or a stale
install line fails here, naming the page and line.

Every fenced ``bash`` block of README.md and docs/*.md (the engineering log aside) is read line
by line (continuation lines joined, ``&&`` chains split into their commands). Two checks:

- *exists*: each ``python -m MODULE`` names a module of this checkout (found, not imported), each
  ``python PATH.py`` a file of it, and no line installs ``hpcring[...]`` from PyPI, where
  hpcring is not published. Every line, cluster-only ones included.
- *runs*: each command that can run on one machine runs, page by page in order, in a temporary
  folder of its own (HOME too, so the tuning and calibration files land there), with this
  checkout on PYTHONPATH and a timeout each. Not run: a line ending in ``# on a cluster`` or
  ``# your script`` (the page shows a fragment of the reader's own program), a block after
  ``<!-- docs-check: cluster-only -->``, and by rule (`NOT_RUN`) what installs, needs SLURM,
  root network namespaces or a GPU, or runs the tests or the linter on a clone. A file the
  command runs (``python first.py``) is written from the page's python block that opens with
  the comment ``# first.py``.

Sizes are cut to fit CI (2 shared cores, about two minutes for all pages), each cut said in
`small`: ``mpiexec`` at 2 ranks, with ``--oversubscribe`` under Open MPI and without it under
MPICH (Hydra rejects it); the bench at 8 B to 4 KiB in steps of 8, 3 iterations (its flags kept,
so each one is still exercised); the model's ``--calibrate`` and ``--validate`` with ``--quick``;
the examples with few steps. A command shown on two pages runs once.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import launcher_env, mpiexec, open_mpi

from hpcring import ALGORITHMS
from hpcring.units import format_size, parse_size

ROOT = Path(__file__).resolve().parent.parent
LOG = "engineering-log.md"  # dated records, not instructions
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != LOG)]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
CLUSTER_BLOCK = "<!-- docs-check: cluster-only -->"
# How a command starts more ranks than cores with this MPI: Open MPI's mpiexec needs the flag the
# pages show, MPICH's Hydra rejects it (and oversubscribes as it is).
LAUNCH = "mpiexec --oversubscribe" if open_mpi() else "mpiexec"
NOT_HERE = ("# on a cluster", "# your script")  # the trailing comments that mark a line not run


@dataclass
class Command:
    """One command of a page: where it is, its text, and whether the check runs it."""

    page: str
    line: int
    text: str  # the line as shown, continuation lines joined, its comment kept
    runnable: bool  # False: inside a cluster-only block, or marked by a trailing comment

    @property
    def code(self) -> str:
        """The command without its trailing comment."""
        return re.sub(r"(^|\s)#.*$", "", self.text).strip()

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def page_commands(page: Path) -> list[Command]:
    """The commands of the page's bash blocks with their line numbers, ``&&`` chains split."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        start = text.count("\n", 0, match.start(1)) + 1
        cluster = text[: match.start()].rstrip().endswith(CLUSTER_BLOCK)
        raw = match.group(1).splitlines()
        i = 0
        while i < len(raw):
            first, parts = i, [raw[i]]
            while parts[-1].rstrip().endswith("\\") and i + 1 < len(raw):  # a continuation line
                parts[-1] = parts[-1].rstrip()[:-1]
                i += 1
                parts.append(raw[i])
            i += 1
            line = " ".join(part.strip() for part in parts).strip()
            if not line:
                continue
            marked = cluster or any(mark in line for mark in NOT_HERE)
            chain = line.split(" #", 1)[0].split(" && ") if " && " in line else [line]
            found += [Command(page.name, start + first, part.strip(), not marked) for part in chain]
    return found


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


# ---------------------------------------------------------------------------------------
# The commands run.

# Never run here, by rule: (pattern in the command, why).
NOT_RUN = (
    (r"\bpip install\b", "installs packages"),
    (r"python3? -m venv\b", "makes a virtual environment"),
    (r"^\. \S*activate$", "activates one"),
    (r"^cd ", "enters the reader's clone"),
    (r"\b(sbatch|srun|salloc)\b|jobs/scaling\.sh", "needs SLURM"),
    (r"^module ", "needs a cluster's environment modules"),
    (r"^export HPCRING_(VENV|MODULES)\b", "sets a SLURM job's environment"),
    (r"tests/multinode/cluster\.sh", "needs root network namespaces (tests/multinode, CI's own job)"),
    (r"tests/gpu/", "needs a GPU"),
    (r"^bash tests/run\.sh$", "the whole test suite, which CI runs as it is"),
    (r"python3? -m pytest\b", "runs tests of the reader's clone, which CI runs as they are"),
    (r"^ruff ", "lints the reader's clone, which CI does"),
    (r"^ompi_info\b", "Open MPI's tool, absent from the mpi4py wheel's Open MPI"),
)
if not open_mpi():  # MPI's fault tolerance (ULFM) is Open MPI's
    NOT_RUN += ((r"--with-ft\b", "an Open MPI fault-tolerant launch; MPICH's Hydra has none"),)
if importlib.util.find_spec("jax") is None:  # CI's MPICH leg has no JAX
    NOT_RUN += ((r"--framework jax\b", "needs JAX, not installed here"),)
if importlib.util.find_spec("torch") is None:  # nor PyTorch
    NOT_RUN += ((r"--framework torch\b", "needs PyTorch, not installed here"),)
BENCH_TOP = 4 << 10  # the bench's largest size here: all its rows to 4 KiB, a few seconds at 2 ranks
TIMEOUT = 120  # s, per command; the slowest takes about 15 s on 2 shared cores
STEPS = {  # the examples' step knobs, so a training run is seconds
    "hpcring.examples.train": "--max-steps 5",
    "hpcring.examples.torch_ddp": "--steps 3",
    "hpcring.examples.jax_step": "--steps 3",
    "hpcring.examples.jax_train": "--steps 3",
    "hpcring.examples.nbody": "--steps 20",
}


# The examples' own tests run them under mpiexec with these flags and more (a torch or JAX start
# is 5-25 s of the 2 cores; running each again here would double CI's cost). A documented
# example with a flag its test file does not name is run here all the same.
EXAMPLE_TESTS = {
    "train": (
        "test_exact_example.py",
        "test_elastic.py",
        "test_elastic_grow.py",
    ),  # --reproducible at 1-4 ranks; --elastic, ranks killed; --grow and --policy, ranks replaced
    "torch_ddp": "test_framework_examples.py",  # the hook and --gloo
    "jax_step": "test_framework_examples.py",
    "jax_train": "test_framework_examples.py",  # float64 against the NumPy example and mpi4jax
    "torch_fsdp": "test_framework_examples.py",  # DDP and FSDP2 on hpcring and on gloo
    "zero": "test_zero.py",  # with and without --reproducible, at 1-4 ranks
    "cg": "test_wrap_examples.py",  # with and without --hpcring
    "nbody": "test_wrap_examples.py",
    "torch_pipeline": "test_strategy_examples.py",  # each matching gloo, in-process under mpiexec
    "torch_tensor": "test_strategy_examples.py",
    "torch_moe": "test_strategy_examples.py",
    "torch_2d": "test_strategy_examples.py",
}


def not_run(command: Command) -> str | None:
    """Why the check does not run ``command`` (None: it does)."""
    if not command.runnable:
        return "marked cluster-only or the reader's own script"
    if not command.code:
        return "a comment"
    rule = next((why for pattern, why in NOT_RUN if re.search(pattern, command.code)), None)
    return rule or run_by_example_test(command.code)


def run_by_example_test(code: str) -> str | None:
    """The example test that runs this example command with its flags, if one does."""
    example = re.search(r"-m hpcring\.examples\.(\w+)((?: --?[\w-]+)*)", code)
    if not example or example.group(1) not in EXAMPLE_TESTS or re.match(r"\w+=", code):
        return None  # not there, or under a setting of the page's own (HPCRING_TRACE=...)
    tests = EXAMPLE_TESTS[example.group(1)]
    tests = (tests,) if isinstance(tests, str) else tests
    text = "".join((ROOT / "tests" / test).read_text() for test in tests)
    flags = example.group(2).split()
    names = " and ".join(f"tests/{test}" for test in tests)
    return f"run by {names}" if all(f'"{flag}"' in text for flag in flags) else None


def small(code: str) -> str:
    """``code`` cut to CI's size: 2 ranks, the bench to 4 KiB, the model's quick calibration,
    the examples' few steps (flags appended: the last one given wins in argparse)."""
    code = re.sub(r"\bmpiexec(?: --oversubscribe)?", LAUNCH, code)  # the pages show Open MPI's
    code = re.sub(rf"({LAUNCH} -n) \d+", r"\1 2", code)
    code = re.sub(r"\bfor g in [\d ]+;", "for g in 1 2;", code)  # rank counts of a loop: 1 and 2
    if "hpcring.bench" in code:
        sizes = {flag: parse_size(value) for flag, value in re.findall(r"(-[be]) (\w+)", code)}
        top = min(sizes.get("-e", 16 << 20), BENCH_TOP)
        low = format_size(min(sizes.get("-b", 8), top))
        code += f" -b {low} -e {format_size(top)} -f 8 -n 3 -w 1"  # 8, 64, 512, 4K: 4 sizes
    if re.search(r"hpcring\.model --(calibrate|validate)", code):
        code += " --quick"
    for module, flags in STEPS.items():
        code = re.sub(rf"({re.escape(module)}\b[^|;]*?)(\s*)(?=[|;]|$)", rf"\1 {flags}\2", code)
    return code


def snippet(page: Path, name: str) -> str | None:
    """The page's python block whose first line is the comment ``# NAME``."""
    for block in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M):
        if block.splitlines()[0].strip() == f"# {name}":
            return block
    return None


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HOME of every command run: the tuning and calibration files go there, not to the user's."""
    return tmp_path_factory.mktemp("docs-home")


RAN: dict[str, str] = {}  # command as run -> where it ran first: a command on two pages runs once


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_commands_run(page: Path, home: Path) -> None:
    """Each runnable command of the page exits 0, in order, in a folder of the page's own."""
    env = launcher_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    env.pop("HPCRING_TUNING", None)
    env.pop("HPCRING_MODEL", None)
    env["PATH"] = os.pathsep.join((str(Path(mpiexec()).parent), env["PATH"]))  # the venv's python too
    failures, timings = [], []
    env["HOME"] = env["MPLCONFIGDIR"] = str(home)  # one for all pages: what --calibrate wrote, the next reads
    with tempfile.TemporaryDirectory(prefix=f"docs-{page.stem}-") as folder:
        for command in page_commands(page):
            if not_run(command):
                continue
            code = small(command.code)
            key = re.sub(r"^(OMPI_\w+=\S+ )+", "", code)  # run as root in any case
            if key in RAN and not re.search(r"--(json|plot|out|tune) |HPCRING_TRACE=", code):
                continue  # no file of its own in this page's folder: the first run's HOME serves
            RAN[key] = command.where()
            for script in re.findall(r"python3? ([\w.-]+\.py)\b", code):
                if not (Path(folder) / script).exists() and (body := snippet(page, script)):
                    (Path(folder) / script).write_text(body)
            for output in re.findall(r"--(?:json|plot|out) (\S+)", code):  # the folders they name
                (Path(folder) / output).parent.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            try:
                done = subprocess.run(
                    ["bash", "-c", f"set -o pipefail; {code}"],
                    cwd=folder,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=TIMEOUT,
                )
                status, output = done.returncode, (done.stdout + done.stderr)[-1500:]
            except subprocess.TimeoutExpired:
                status, output = "timeout", f"still running after {TIMEOUT} s"
            timings.append(f"{time.monotonic() - start:6.1f} s  {command.where()}  {code}")
            if status != 0:
                failures.append(f"{command.where()}: exit {status}: {command.text}\n  ran: {code}\n{output}")
    print("\n".join(timings))  # pytest -s shows what each command cost
    assert not failures, "\n\n".join(failures)


def test_every_command_is_run_or_said_why_not() -> None:
    """The split itself: each line of every page is run or skipped for a reason the test names,
    and the cuts keep what the page shows (its flags) while bounding the size."""
    for page in PAGES:
        for command in page_commands(page):
            assert command.code or not_run(command), command.where()
    cut = small("mpiexec -n 8 python -m hpcring.bench -b 1M -e 1G -a ring,mpi --json out.json")
    assert cut.startswith(f"{LAUNCH} -n 2 ") and "-a ring,mpi --json out.json" in cut
    assert small("mpiexec --oversubscribe -n 4 python x.py") == f"{LAUNCH} -n 2 python x.py"
    assert cut.endswith("-b 4K -e 4K -f 8 -n 3 -w 1")
    assert (
        small("python -m hpcring.model --ranks 8 --bytes 1G")
        == "python -m hpcring.model --ranks 8 --bytes 1G"
    )
    skipped = [c for p in PAGES for c in page_commands(p) if not_run(c)]
    assert any("sbatch" in c.code for c in skipped) and any("pip install" in c.code for c in skipped)


def test_descriptions_name_every_algorithm() -> None:
    """pyproject's and the site's one-line descriptions list the algorithms there are (they once
    listed three)."""
    words = {"ps": "parameter server", "mpi": "MPI_Allreduce", "rabenseifner": "Rabenseifner", "nccl": "NCCL"}
    for path, key in (("pyproject.toml", "description = "), ("mkdocs.yml", "site_description: ")):
        line = next(line for line in (ROOT / path).read_text().splitlines() if line.startswith(key))
        missing = [a for a in ALGORITHMS if a != "auto" and words.get(a, a) not in line]
        assert not missing, f"{path}: the description omits {missing}"
