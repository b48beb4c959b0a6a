"""Expert parallelism on the "hpcring" backend, side by side with gloo: a mixture-of-experts layer.

    mpiexec -n 2 python -m hpcring.examples.torch_moe [--steps 5] [--tokens 48]

Each rank holds one expert (a small MLP) and its own tokens. A router (a Linear, the same on
every rank) sends each token to its top-1 expert: the tokens are sorted by expert, each rank
learns how many it will receive from each rank (``all_to_all_single`` of the counts), and the
tokens travel to their experts with ``torch.distributed.nn.functional.all_to_all_single``,
uneven splits, whose backward is the same exchange the other way; the experts' outputs come back
the same way, are put back in token order and weighted by the router's probability. Loss
backward runs through both exchanges, so each expert's gradient holds every rank's tokens; the
router's gradient is all-reduced. Rank 0 prints the median time per step and the largest
difference between the weights the hpcring and gloo runs end with; every rank prints the digest
of the whole model's final weights per run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from .sidebyside import digest, need_torch, table, timed_step


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.torch_moe", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="steps not timed")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per rank")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--backends", default="hpcring,gloo", help="comma-separated: hpcring, gloo")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch = need_torch("torch_moe")
    import warnings

    import torch.distributed as dist
    import torch.distributed.nn.functional as collectives
    from mpi4py import MPI

    import hpcring.torch

    # nn.functional's all_to_all_single is the public autograd Function this example shows; torch
    # 2.13 marks it deprecated in favour of the private torch.distributed._functional_collectives
    warnings.filterwarnings("ignore", "torch.distributed.nn.functional.all_to_all_single is deprecated")
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    backends = [b for b in args.backends.split(",") if b]
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    hpcring.torch.init_process_group()  # the default group: hpcring's
    groups = {"hpcring": dist.group.WORLD}
    if "gloo" in backends:
        groups["gloo"] = dist.new_group(backend="gloo")
    generator = torch.Generator().manual_seed(args.seed + rank)  # each rank its own tokens
    tokens = torch.randn(args.tokens, args.width, generator=generator, dtype=dtype)
    targets = torch.tanh(tokens.flip(1))

    def run(group: Any) -> tuple[np.ndarray, list[float], list[int]]:
        torch.manual_seed(args.seed)
        router = torch.nn.Linear(args.width, size).to(dtype)  # the same on every rank
        experts = [  # every rank builds all of them alike, and keeps its own
            torch.nn.Sequential(
                torch.nn.Linear(args.width, args.hidden),
                torch.nn.Tanh(),
                torch.nn.Linear(args.hidden, args.width),
            ).to(dtype)
            for _ in range(size)
        ]
        expert = experts[rank]
        params = [*router.parameters(), *expert.parameters()]
        optimizer = torch.optim.SGD(params, lr=args.lr)
        times: list[float] = []
        received: list[int] = []

        def step() -> None:
            optimizer.zero_grad()
            probs = torch.softmax(router(tokens), dim=1)
            gate, choice = probs.max(dim=1)  # top-1: each token's expert, and its weight
            order = torch.argsort(choice, stable=True)
            sends = torch.bincount(choice, minlength=size)
            recvs = torch.empty_like(sends)
            dist.all_to_all_single(recvs, sends, group=group)  # how many tokens come from each rank
            send_splits, recv_splits = sends.tolist(), recvs.tolist()
            arrived = collectives.all_to_all_single(
                tokens.new_empty(sum(recv_splits), args.width), tokens[order], recv_splits, send_splits, group
            )
            done = expert(arrived)
            back = collectives.all_to_all_single(
                tokens.new_empty(args.tokens, args.width), done, send_splits, recv_splits, group
            )
            output = torch.empty_like(back).index_copy(0, order, back)  # token order again
            mixed = tokens + gate.unsqueeze(1) * output
            torch.nn.functional.mse_loss(mixed, targets).backward()
            for p in router.parameters():  # the router is replicated: its gradient is every rank's
                dist.all_reduce(p.grad, group=group)
            optimizer.step()
            received[:] = recv_splits

        for number in range(args.warmup + args.steps):
            elapsed = timed_step(comm, step)
            if number >= args.warmup:
                times.append(elapsed)
        mine = torch.cat([p.detach().reshape(-1) for p in expert.parameters()]).numpy()
        routed = torch.cat([p.detach().reshape(-1) for p in router.parameters()]).numpy()
        whole = np.concatenate([routed, *comm.allgather(mine)])  # the router, then every expert
        return whole, times, received

    runs = {}
    for backend in backends:
        weights, times, received = run(groups[backend])
        runs[backend] = weights, times
        steps = args.warmup + args.steps
        print(f"torch_moe: experts on {backend}: weights {digest(weights)} after {steps} steps")
        print(f"torch_moe: rank {rank} received {received} tokens from the ranks in the last step")
    sys.stdout.flush()
    comm.Barrier()
    heading = (
        f"# {size} ranks, one expert each, {args.dtype}, {args.tokens} tokens of width {args.width} "
        f"per rank, experts {args.width}-{args.hidden}-{args.width}, top-1 routing, {args.steps} timed "
        f"steps after {args.warmup} (ms per step: median of the slowest rank's)"
    )
    table(comm, heading, backends, {"MoE": runs})
    hpcring.torch.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
