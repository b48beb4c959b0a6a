"""What the elastic mode decides without a failure: the step agreement's decoding, the launch
check's reading of Open MPI's transport selection, RankFailedError's message (serial); and, under
a launch without MPI's fault tolerance (the MPI suite's), a refusal on every rank before
anything runs, with the collectives as they were (``mpi`` marked, 1-4 ranks). The failures
themselves, with ranks killed for real: tests/test_elastic.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import everywhere
from mpi4py import MPI

import hpcring
from hpcring import elastic, ulfm

FULL = (1 << elastic.RESIDUES) - 1


def flag(*steps: int) -> int:
    """The AND of the flags of ranks that completed ``steps``."""
    agreed = FULL
    for step in steps:
        agreed &= FULL & ~(1 << (step % elastic.RESIDUES))
    return agreed


@pytest.mark.parametrize("base", [0, 1, 7, 28, 29, 30, 59, 10_000])
def test_the_lowest_step_from_the_agreed_flag(base: int) -> None:
    assert elastic.lowest(flag(base, base, base), base) == base  # every rank at one step
    both = flag(base, base + 1, base + 1)  # one rank one step behind: across the wrap too
    assert elastic.lowest(both, base) == base
    assert elastic.lowest(both, base + 1) == base


def test_ranks_two_steps_apart_are_an_error_not_a_guess() -> None:
    with pytest.raises(RuntimeError, match="more than one step apart"):
        elastic.lowest(flag(4, 6), 4)
    with pytest.raises(RuntimeError, match="more than one step apart"):
        elastic.lowest(flag(4, 5, 6), 5)


@pytest.mark.parametrize(
    ("selection", "sm"),
    [
        ("", True),
        ("^usnic", True),
        ("tcp,self", False),
        ("tcp,sm,self", True),
        ("^sm,vader", False),
        ("uct,self", False),
    ],
)
def test_which_transport_selections_admit_shared_memory(selection: str, sm: bool) -> None:
    admits = ulfm._admits(selection, "sm") or ulfm._admits(selection, "vader")
    assert admits == sm


def test_rank_failed_error_names_ranks_call_and_the_way_on() -> None:
    error = hpcring.RankFailedError([2, 5], "hpcring.allreduce(op='sum', algorithm='ring') call 7", " (ring)")
    assert error.failed == [2, 5]
    assert str(error).startswith(
        "hpcring: ranks 2, 5 failed during hpcring.allreduce(op='sum', algorithm='ring') call 7"
    )
    assert "hpcring.shrink(comm)" in str(error) and isinstance(error, RuntimeError)
    assert "another rank revoked" in str(hpcring.RankFailedError([], "x"))


@pytest.mark.mpi
def test_without_fault_tolerance_elastic_refuses_on_every_rank() -> None:
    """The MPI suite runs without --with-ft ulfm: Elastic and shrink refuse on every rank, saying
    how to launch, and a collective runs as before (a failed-rank conversion never fires)."""
    world = MPI.COMM_WORLD
    if ulfm.enabled():
        pytest.skip("this launch has MPI's fault tolerance on")
    try:
        elastic.Elastic([np.zeros(3)], comm=world)
    except RuntimeError as error:
        said = "mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self" in str(error)
    else:
        said = False
    assert everywhere(world, said)
    with pytest.raises(RuntimeError, match="launch with: mpiexec --with-ft ulfm"):
        hpcring.shrink(world)
    x = np.full(5, world.Get_rank() + 1.0)
    hpcring.allreduce(x, comm=world)
    size = world.Get_size()
    assert everywhere(world, bool((x == size * (size + 1) / 2).all()))


# ---- growing back: what is decided without a failure ---------------------------------------------


def test_the_rendezvous_invites_the_oldest_group_and_sends_the_rest_home(tmp_path: Path) -> None:
    from hpcring import growth

    place = growth.Rendezvous(tmp_path / "sub" / "job.port")
    assert place.port() == ""
    place.publish("tag#0$connentry#0A:1.2.3.4")
    assert place.port() == "tag#0$connentry#0A:1.2.3.4"
    assert not [p for p in place.path.parent.iterdir() if p.name.startswith(".")]  # no partial file left
    first = place.ticket()
    os.utime(first, (1, 1))  # older
    second = place.ticket()
    assert place.waiting() == [first, second]
    assert place.invite(first) and place.waiting() == [second]
    assert place.invited(first, 5.0)  # its invitation: taken once
    assert not first.with_suffix(".go").exists()
    second.unlink()
    assert not place.invite(second)  # withdrawn meanwhile
    late = place.ticket()
    place.close()  # the job ends: a group still waiting goes home, its ticket gone
    assert not place.invited(late, 5.0) and not late.exists() and place.port() == ""
    place.publish("again")  # a new job at the same place
    quiet = place.ticket()
    os.utime(place.path, (1, 1))  # its rank 0 said nothing for a long time: no job
    assert not place.invited(quiet, 5.0)


def test_a_replacement_runs_this_programs_own_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcring import growth

    monkeypatch.setattr(sys, "orig_argv", ["python3", "-X", "dev", "-m", "hpcring.examples.train", "--grow"])
    assert growth.command() == [sys.executable, "-X", "dev", "-m", "hpcring.examples.train", "--grow"]


def test_state_is_packed_and_unpacked_bit_for_bit() -> None:
    from hpcring import growth

    rng = np.random.default_rng(0)
    state = [rng.standard_normal((3, 5)).astype(np.float32), np.arange(7, dtype=np.int64), np.zeros(0)]
    packed = np.empty(sum(a.nbytes for a in state), dtype=np.uint8)
    growth._pack(state, packed)
    copies = [np.full_like(a, 9) for a in state]
    growth._unpack(packed, copies)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(state, copies, strict=True))
    assert growth.state_bytes(state) == packed.nbytes == 3 * 5 * 4 + 7 * 8
    assert not growth._packable(np.zeros(growth.PACK_BELOW // 8))  # large: sent in place
    assert not growth._packable(np.zeros((4, 4))[:, 1])  # not contiguous


def test_a_policy_or_sizes_that_cannot_be_are_refused() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        elastic.Elastic([np.zeros(3)], comm=MPI.COMM_SELF, policy="grow")
