"""Data-parallel training of an MLP on scikit-learn's digits, with hpcring underneath.

    mpiexec -n 4 python -m hpcring.examples.train [--epochs 20] [--algorithm auto] ...

Everything is written out in NumPy (or CuPy with ``--device gpu``): forward, backward,
SGD or Adam. Every rank starts from the same seeded weights and walks the same global
batches; each rank takes its slice of every global batch. Each rank's gradient is the
gradient of its share of the *global* mean loss (its samples' loss summed, divided by
the global batch size), so an all-reduce with op="sum" gives exactly the single-process
gradient, even when the ranks do not divide the global batch evenly.

Backward runs last layer first and hands each gradient to `GradientSync.ready`, so the
last layers' buckets are reduced while the first layers' gradients are still computed;
``--no-overlap`` marks them all ready only after the whole backward pass.

``--reproducible`` makes the weights independent of the rank count: every global batch is cut
into the same ``--microbatches`` pieces (12: 1, 2, 3, 4 and 6 ranks divide them) whatever G is,
each rank computes the gradients of its pieces one by one, adds each to an `hpcring.ExactSum`,
and all-reduces that: the sum depends only on the multiset of microbatch gradients, so
``mpiexec -n G`` prints the same weights digest for every G. That also needs the same BLAS, one
BLAS thread per rank (``--threads 1``, the default) and the same CPU kind on every run: a
microbatch's gradient must itself come out with the same bits wherever it is computed.
Without the flag each rank's gradient is one matmul over its share of the batch, so the digest
changes with G (``--digest`` prints it).

``--elastic`` survives lost ranks (`hpcring.elastic`, docs/elastic.md): launched under MPI's fault
tolerance (``mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self``), a rank that dies makes
the survivors shrink to a smaller communicator, agree on the last step completed on all of them,
undo a step only some applied, and go on with the global batch split over fewer ranks. The
lowest surviving rank prints ``step S/T ranks G`` after each step. With ``--reproducible`` the
run ends with the weights digest of the run that lost nothing, at any rank count.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

import hpcring
from hpcring import growth, ulfm
from hpcring.gpu import gpu_problem_anywhere
from hpcring.training import GradientSync

TEST_SIZE = 297  # 1500 training images, 297 held out; the split is fixed (seed 0), not the run's seed


def array_module(device: str, comm: MPI.Intracomm) -> Any:
    """NumPy for ``cpu``; for ``gpu``, CuPy on this rank's GPU (`hpcring.select_device`).

    Collective with ``gpu``. Where CuPy or a GPU is missing on any rank, every rank exits with
    a sentence saying which rank lacks what, instead of a CUDA traceback (or a hang).
    """
    if device != "gpu":
        return np
    problem = gpu_problem_anywhere(comm)  # agreed: no rank goes on alone into the training
    if problem:
        raise SystemExit(f"--device gpu: {problem}")
    hpcring.select_device(comm)
    import cupy

    return cupy


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits data set as ``sklearn.datasets.load_digits`` gives it: (1797, 64) pixels from 0
    to 16 and their labels. Read from the CSV file scikit-learn bundles (no download) without
    importing scikit-learn, whose import takes about a second of every rank's start; ImportError
    without scikit-learn."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if spec is None or spec.origin is None:
        raise ImportError("No module named 'sklearn'", name="sklearn")
    bundled = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if not bundled.is_file():  # another layout than scikit-learn's to date: ask it
        from sklearn.datasets import load_digits

        data = load_digits()
        return data.data, data.target
    table = np.loadtxt(bundled, delimiter=",")  # 64 pixels, then the label, per row
    return table[:, :-1], table[:, -1].astype(np.int64)


def load_digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits (8x8 images, 10 classes) scaled to [0, 1], split into train and test."""
    try:
        pixels, labels = digits()
    except ImportError:
        raise SystemExit(
            "hpcring.examples.train needs scikit-learn for the digits data set (bundled with it, no "
            "download): pip install -e '.[train]' in hpcring's clone"
        ) from None
    x = pixels.astype(np.float64) / 16.0
    y = labels.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    test, train = order[:TEST_SIZE], order[TEST_SIZE:]
    return x[train], y[train], x[test], y[test]


def init_params(sizes: list[int], seed: int, dtype: np.dtype, xp: Any) -> list[Any]:
    """He-initialised weights and zero biases, [W1, b1, W2, b2, ...]: the same on every rank."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        params += [xp.asarray(w.astype(dtype)), xp.zeros(fan_out, dtype=dtype)]
    return params


def forward(params: list[Any], x: Any, xp: Any) -> list[Any]:
    """Activations of every layer, input first, logits last (ReLU between layers)."""
    acts = [x]
    layers = len(params) // 2
    for layer in range(layers):
        z = acts[-1] @ params[2 * layer] + params[2 * layer + 1]
        acts.append(xp.maximum(z, 0) if layer < layers - 1 else z)
    return acts


def loss_and_backward(
    params: list[Any],
    grads: list[Any],
    x: Any,
    y: Any,
    scale: float,
    xp: Any,
    ready: Callable[[int], None],
) -> float:
    """Cross-entropy summed over the local samples times ``scale``; gradients written into ``grads``.

    ``ready(i)`` is called the moment gradient ``i`` is final, last layer first.
    """
    acts = forward(params, x, xp)
    logits = acts[-1]
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = xp.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    rows = xp.arange(len(y))
    loss = float((xp.log(total[:, 0]) - shifted[rows, y]).sum()) * scale
    delta = exp / total
    delta[rows, y] -= 1
    delta *= scale
    for layer in reversed(range(len(params) // 2)):
        xp.matmul(acts[layer].T, delta, out=grads[2 * layer])
        ready(2 * layer)
        delta.sum(axis=0, out=grads[2 * layer + 1])
        ready(2 * layer + 1)
        if layer:
            delta = delta @ params[2 * layer].T
            delta *= acts[layer] > 0
    return loss


class Optimizer:
    """SGD (with momentum) or Adam, element-wise and deterministic: same gradients, same weights."""

    def __init__(self, kind: str, params: list[Any], lr: float, xp: Any) -> None:
        self.kind, self.params, self.lr, self.xp, self.t = kind, params, lr, xp, 0
        self.m = [xp.zeros_like(p) for p in params]
        self.v = [xp.zeros_like(p) for p in params] if kind == "adam" else []

    def step(self, grads: list[Any]) -> None:
        self.t += 1
        if self.kind == "sgd":
            for p, g, m in zip(self.params, grads, self.m, strict=True):
                m *= 0.9
                m += g
                p -= self.lr * m
            return
        b1, b2, eps = 0.9, 0.999, 1e-8
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            p -= (self.lr / c1) * m / (self.xp.sqrt(v / c2) + eps)


@dataclass
class Result:
    """What a run produced: per-step global losses (if recorded), per-epoch summaries, timings."""

    losses: list[float] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)  # hash of the weights after each step (if recorded)
    epochs: list[dict[str, float]] = field(default_factory=list)
    steps: list[dict[str, float]] = field(default_factory=list)  # seconds per step on this rank
    params: list[Any] = field(default_factory=list)
    buckets: list[tuple[str, int]] = field(default_factory=list)  # (dtype, bytes) in launch order
    recoveries: list[Any] = field(default_factory=list)  # --elastic: `hpcring.elastic.Recovery`s
    comm: Any = None  # --elastic: the survivors' communicator at the end


def train(
    comm: MPI.Intracomm,
    *,
    epochs: int = 20,
    batch: int = 64,
    width: int = 128,
    depth: int = 2,
    optimizer: str = "adam",
    lr: float = 1e-3,
    algorithm: str = "auto",
    bucket_mb: float = 25.0,
    overlap: bool = True,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    max_steps: int | None = None,
    record_losses: bool = False,
    report: Callable[[dict[str, float]], None] | None = None,
    reproducible: bool = False,
    microbatches: int = 12,
    wire: str | None = None,
    error_feedback: bool = False,
) -> Result:
    """Train on ``comm``; every rank returns the same weights (bitwise) and the same losses."""
    xp = array_module(device, comm)
    size, rank = comm.Get_size(), comm.Get_rank()
    np_dtype = np.dtype(dtype)
    x_train, y_train, x_test, y_test = load_digits_split()
    sizes = [x_train.shape[1], *[width] * depth, 10]
    params = init_params(sizes, seed, np_dtype, xp)
    sync = GradientSync(
        [xp.zeros_like(p) for p in params],
        comm=comm,
        bucket_bytes=max(int(bucket_mb * (1 << 20)), 1),
        algorithm=algorithm,
        op="sum",  # each rank's gradient is already its share of the global mean
        wire=wire,
        error_feedback=error_feedback,
    )
    grads = sync.grads
    if reproducible:  # the microbatch gradients go to an ExactSum, not to the buckets
        flat = xp.zeros(sum(int(p.size) for p in params), dtype=np_dtype)
        bounds = list(itertools.accumulate((int(p.size) for p in params), initial=0))
        grads = [flat[a:b].reshape(p.shape) for a, b, p in zip(bounds[:-1], bounds[1:], params, strict=True)]
        acc = hpcring.ExactSum(like=flat)
    opt = Optimizer(optimizer, params, lr, xp)
    x_test_dev, y_test_dev = xp.asarray(x_test.astype(np_dtype)), xp.asarray(y_test)
    result = Result(buckets=[(b.dtype.name, b.nbytes) for b in sync.buckets])
    ready = sync.ready if overlap else (lambda i: None)
    order_rng = np.random.default_rng(seed + 1)
    step = 0
    for epoch in range(epochs):
        order = order_rng.permutation(len(y_train))
        local_loss, epoch_steps = 0.0, 0
        for start in range(0, len(order) - batch + 1, batch):  # fixed global batch: drop the tail
            if max_steps is not None and step >= max_steps:
                break
            if reproducible:
                began = time.perf_counter()
                loss, waited = _exact_step(
                    params, grads, flat, acc, order[start : start + batch], microbatches, size, rank,
                    (x_train, y_train, np_dtype, batch, xp, comm, algorithm),
                )  # fmt: skip
                opt.step(grads)
                stats = {"communication": waited, "exposed": waited, "hidden": 0.0}
            else:
                mine = np.array_split(order[start : start + batch], size)[rank]
                xb = xp.asarray(x_train[mine].astype(np_dtype))
                yb = xp.asarray(y_train[mine])
                began = time.perf_counter()
                loss = loss_and_backward(params, grads, xb, yb, 1.0 / batch, xp, ready)
                if not overlap:
                    sync.ready_all()
                sync.wait()
                opt.step(grads)
                stats = {
                    "communication": sync.stats.communication,
                    "exposed": sync.stats.exposed,
                    "hidden": sync.stats.hidden,
                }
            if xp is not np:
                xp.cuda.get_current_stream().synchronize()
            elapsed = time.perf_counter() - began
            result.steps.append(
                {
                    "step": elapsed,
                    "compute": elapsed - stats["exposed"],
                    **stats,
                }
            )
            if record_losses:
                result.losses.append(comm.allreduce(loss, op=MPI.SUM))
                result.digests.append(_digest(params, xp))
            local_loss += loss
            epoch_steps += 1
            step += 1
        if epoch_steps == 0:
            break
        predicted = forward(params, x_test_dev, xp)[-1].argmax(axis=1)
        accuracy = float((predicted == y_test_dev).mean())
        recent = result.steps[-epoch_steps:]
        summary = {
            "epoch": epoch + 1,
            "loss": comm.allreduce(local_loss, op=MPI.SUM) / epoch_steps,
            "accuracy": accuracy,
            **{key: statistics.median(s[key] for s in recent) for key in recent[0]},
        }
        result.epochs.append(summary)
        if report is not None:
            report(summary)
    result.params = params
    return result


def train_elastic(
    comm: MPI.Intracomm,
    *,
    epochs: int = 20,
    batch: int = 64,
    width: int = 128,
    depth: int = 2,
    optimizer: str = "adam",
    lr: float = 1e-3,
    algorithm: str = "auto",
    bucket_mb: float = 25.0,
    overlap: bool = True,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    max_steps: int | None = None,
    reproducible: bool = False,
    microbatches: int = 12,
    wire: str | None = None,
    error_feedback: bool = False,
    progress: Callable[[int, int, MPI.Intracomm], None] | None = None,
    on_failure: Callable[[BaseException | None], None] | None = None,
    on_recovery: Callable[[Any], None] | None = None,
    on_phase: Callable[[str, MPI.Intracomm, int], None] | None = None,
    policy: str = "shrink",
    min_size: int = 1,
    max_size: int | None = None,
    rendezvous: str | None = None,
) -> Result:
    """`train` on `hpcring.elastic.Elastic`: the same steps, batches and optimizer, each step's
    global batch split over the ranks alive at that step. ``progress(step, total, comm)`` after
    each step (``comm``: the ranks' communicator now); ``on_failure``, ``on_recovery``,
    ``on_phase``: the loop's hooks; ``policy``, ``min_size``, ``max_size``, ``rendezvous``: its
    settings (a replacement rank runs this same function: it joins the job there). Returns the
    weights, a `Result` with the step times and recoveries."""
    from hpcring.elastic import Elastic

    xp = array_module(device, comm)
    np_dtype = np.dtype(dtype)
    x_train, y_train, x_test, y_test = load_digits_split()
    sizes = [x_train.shape[1], *[width] * depth, 10]
    params = init_params(sizes, seed, np_dtype, xp)
    opt = Optimizer(optimizer, params, lr, xp)
    per_epoch = len(y_train) // batch  # fixed global batches; the tail of an epoch is dropped
    total = epochs * per_epoch if max_steps is None else min(max_steps, epochs * per_epoch)
    order_rng = np.random.default_rng(seed + 1)  # the epochs' orders, as `train` draws them
    orders = [order_rng.permutation(len(y_train)) for _ in range(-(-total // per_epoch))]
    flat = xp.zeros(sum(int(p.size) for p in params), dtype=np_dtype)
    bounds = list(itertools.accumulate((int(p.size) for p in params), initial=0))
    grads = [flat[a:b].reshape(p.shape) for a, b, p in zip(bounds[:-1], bounds[1:], params, strict=True)]
    acc = hpcring.ExactSum(like=flat) if reproducible else None
    syncs: dict[int, GradientSync] = {}  # per communicator: GradientSync is bound to one
    result = Result()
    began = [0.0]

    def compute(comm: MPI.Intracomm, t: int) -> list[Any]:
        """Step t's gradient, summed over the ranks alive now (collective: a failure stops it)."""
        began[0] = time.perf_counter()
        epoch, k = divmod(t, per_epoch)
        samples = orders[epoch][k * batch : (k + 1) * batch]
        size, rank = comm.Get_size(), comm.Get_rank()
        if acc is not None:
            _exact_step(
                params, grads, flat, acc, samples, microbatches, size, rank,
                (x_train, y_train, np_dtype, batch, xp, comm, algorithm),
            )  # fmt: skip
            return grads
        sync = syncs.get(id(comm))
        if sync is None:  # a new communicator (the survivors'): a GradientSync of its own
            syncs.clear()
            sync = syncs[id(comm)] = GradientSync(
                [xp.zeros_like(p) for p in params],
                comm=comm,
                bucket_bytes=max(int(bucket_mb * (1 << 20)), 1),
                algorithm=algorithm,
                op="sum",
                wire=wire,
                error_feedback=error_feedback,
            )
        mine = np.array_split(samples, size)[rank]
        xb, yb = xp.asarray(x_train[mine].astype(np_dtype)), xp.asarray(y_train[mine])
        loss_and_backward(
            params, sync.grads, xb, yb, 1.0 / batch, xp, sync.ready if overlap else lambda i: None
        )
        if not overlap:
            sync.ready_all()
        sync.wait()
        return sync.grads

    def apply(t: int, gradients: list[Any]) -> None:
        """Local: the optimizer's step t (its step count follows t, so a step done again is the same)."""
        opt.t = t
        opt.step(gradients)
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()
        result.steps.append({"step": time.perf_counter() - began[0]})
        if progress is not None:
            progress(t + 1, total, loop.comm)

    loop = Elastic(
        [*params, *opt.m, *opt.v],
        comm=comm,
        on_failure=on_failure,
        on_recovery=on_recovery,
        on_phase=on_phase,
        policy=policy,
        min_size=min_size,
        max_size=max_size,
        rendezvous=rendezvous,
    )
    loop.run(compute, apply, total)
    predicted = forward(params, xp.asarray(x_test.astype(np_dtype)), xp)[-1].argmax(axis=1)
    result.epochs.append({"accuracy": float((predicted == xp.asarray(y_test)).mean())})
    result.params = params
    result.recoveries = loop.recoveries
    result.comm = loop.comm
    return result


def _exact_step(
    params: list[Any],
    grads: list[Any],
    flat: Any,
    acc: Any,
    samples: np.ndarray,
    microbatches: int,
    size: int,
    rank: int,
    data: tuple[Any, ...],
) -> tuple[float, float]:
    """One step's gradient as the reproducible sum of every microbatch's: (local loss, seconds
    in the all-reduce). The microbatches are the same for every rank count; this rank takes its
    share of them, in order."""
    x_train, y_train, np_dtype, batch, xp, comm, algorithm = data
    pieces = np.array_split(samples, microbatches)
    loss = 0.0
    acc.clear()
    for piece in np.array_split(np.arange(microbatches), size)[rank]:
        xb = xp.asarray(x_train[pieces[piece]].astype(np_dtype))
        yb = xp.asarray(y_train[pieces[piece]])
        loss += loss_and_backward(params, grads, xb, yb, 1.0 / batch, xp, lambda i: None)
        acc.add(flat)
    began = time.perf_counter()
    acc.allreduce(comm=comm, algorithm=algorithm, out=flat)
    return loss, time.perf_counter() - began


def _digest(params: list[Any], xp: Any) -> str:
    """A hash of every weight's bytes: equal hashes on all ranks mean bitwise-identical models."""
    sha = hashlib.sha256()
    for p in params:
        sha.update((p if xp is np else xp.asnumpy(p)).tobytes())
    return sha.hexdigest()


def _cupy() -> Any:
    import cupy

    return cupy


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m hpcring.examples.train", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--algorithm", default="auto", choices=hpcring.ALGORITHMS)
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="bucket size limit in MiB (default 25)")
    parser.add_argument("--no-overlap", action="store_true", help="all-reduce only after the whole backward")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--batch", type=int, default=64, help="global batch size, split over the ranks")
    parser.add_argument("--width", type=int, default=128, help="hidden layer width (large: comms matter)")
    parser.add_argument("--depth", type=int, default=2, help="number of hidden layers")
    parser.add_argument("--optimizer", default="adam", choices=("adam", "sgd"))
    parser.add_argument("--lr", type=float, default=None, help="learning rate (adam 1e-3, sgd 0.05)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in all")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per rank (default 1)")
    parser.add_argument(
        "--reproducible",
        action="store_true",
        help="the same weights for any rank count: microbatch gradients summed by hpcring.ExactSum",
    )
    parser.add_argument("--microbatches", type=int, default=12, help="per global batch, with --reproducible")
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="survive lost ranks (launch: mpiexec --with-ft ulfm --mca pml ob1 --mca btl tcp,self; "
        "docs/elastic.md)",
    )
    parser.add_argument(
        "--grow",
        action="store_true",
        help="with --elastic: spawn replacements for lost ranks at once (policy 'replace')",
    )
    parser.add_argument(
        "--policy",
        choices=("shrink", "replace", "replace-when-available"),
        help="with --elastic: what follows a lost rank (default shrink; --grow: replace)",
    )
    parser.add_argument("--min-ranks", type=int, default=1, help="with --elastic: stop below this many")
    parser.add_argument("--max-ranks", type=int, help="with --elastic: grow back to this many (default: G)")
    parser.add_argument(
        "--rendezvous",
        help="with --policy replace-when-available: the file where rank 0 publishes the job's port "
        "(ranks started later join with HPCRING_ELASTIC_JOIN=<this file>)",
    )
    parser.add_argument(
        "--spares",
        type=int,
        default=0,
        help="with --policy replace-when-available: the last N ranks of the launch wait at the "
        "rendezvous, apart from the job, and join it when it has lost ranks",
    )
    parser.add_argument("--digest", action="store_true", help="print the final weights' SHA-256")
    parser.add_argument(
        "--wire", choices=("bfloat16", "float16"), help="send gradients narrowed (docs/compression.md)"
    )
    parser.add_argument(
        "--error-feedback", action="store_true", help="with --wire: keep each rank's rounding residual"
    )
    return parser.parse_args(argv)


def limit_threads(threads: int) -> Any:
    """Cap BLAS threads per rank (ranks share the cores); threadpoolctl comes with scikit-learn."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=threads)


@hpcring.aborting
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if args.elastic:  # before anything runs, on every rank: how to launch, where this launch cannot
        problem = ulfm.launch_problem()
        if problem is not None:
            raise SystemExit(f"hpcring.examples.train --elastic: {problem}")
    limit_threads(args.threads)
    joining = args.elastic and growth.joining() is not None  # a replacement rank: the job printed it
    say = print if rank == 0 and not joining else (lambda *a, **k: None)
    lr = args.lr if args.lr is not None else (1e-3 if args.optimizer == "adam" else 0.05)
    width, depth = args.width, args.depth
    count = 64 * width + width + (depth - 1) * (width * width + width) + width * 10 + 10
    info = hpcring.info()
    apart = f" (+{args.spares} waiting apart)" if args.spares else ""
    say(
        f"# hpcring {info['hpcring']} | {size - args.spares} ranks{apart} | "
        f"MLP 64-{'-'.join([str(width)] * depth)}-10, "
        f"{count:,} parameters, {args.dtype} on {args.device} | global batch {args.batch} | "
        f"{args.optimizer} lr {lr:g} | algorithm {args.algorithm} | "
        f"wire {args.wire or 'off'}{' + error feedback' if args.error_feedback else ''} | "
        f"overlap {'off' if args.no_overlap else 'on'} "
        f"| progress {info['iallreduce_progress']} (MPI thread level {info['thread_level']})"
    )

    def report(e: dict[str, float]) -> None:
        ms = {k: 1e3 * e[k] for k in ("step", "compute", "communication", "exposed", "hidden")}
        share = 100 * ms["hidden"] / ms["communication"] if ms["communication"] > 0 else 0.0
        say(
            f"epoch {int(e['epoch']):3d}  loss {e['loss']:.4f}  test acc {100 * e['accuracy']:5.1f}%  "
            f"step {ms['step']:7.2f} ms = compute {ms['compute']:7.2f} + waiting {ms['exposed']:6.2f} | "
            f"comm {ms['communication']:6.2f} ms, hidden {ms['hidden']:6.2f} ms ({share:3.0f}%)",
            flush=True,
        )

    if args.elastic:
        return run_elastic(args, comm, lr, report)
    result = train(
        comm,
        epochs=args.epochs,
        batch=args.batch,
        width=width,
        depth=depth,
        optimizer=args.optimizer,
        lr=lr,
        algorithm=args.algorithm,
        bucket_mb=args.bucket_mb,
        overlap=not args.no_overlap,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        max_steps=args.max_steps,
        report=report,
        reproducible=args.reproducible,
        microbatches=args.microbatches,
        wire=args.wire,
        error_feedback=args.error_feedback,
    )
    buckets = ", ".join(f"{nbytes / 1024:.0f} KiB {name}" for name, nbytes in result.buckets)
    say(f"# {len(result.buckets)} buckets in launch order: {buckets}")
    if result.steps:
        warm = result.steps[min(5, len(result.steps) - 1) :]
        med = {k: 1e3 * statistics.median(s[k] for s in warm) for k in warm[0]}
        say(
            f"# median per step (rank 0, after 5 warm-up steps): step {med['step']:.2f} ms, compute "
            f"{med['compute']:.2f} ms, communication {med['communication']:.2f} ms of which hidden "
            f"{med['hidden']:.2f} ms and exposed {med['exposed']:.2f} ms"
        )
    if result.epochs:
        say(f"# final test accuracy {100 * result.epochs[-1]['accuracy']:.1f}%")
    if args.reproducible or args.digest:
        say(f"# weights digest {_digest(result.params, np if args.device != 'gpu' else _cupy())}")
    return 0


def run_elastic(args: argparse.Namespace, comm: MPI.Intracomm, lr: float, report: Any) -> int:
    """``--elastic``: the loop of `train_elastic`, its progress printed by the lowest rank. Where
    fewer ranks remain than ``--min-ranks``, every survivor says so and exits with status 3."""
    from hpcring.elastic import JoinError, NotNeededError, TooFewRanksError

    def progress(step: int, total: int, now: MPI.Intracomm) -> None:
        if now.Get_rank() == 0:
            print(f"step {step}/{total} ranks {now.Get_size()}", flush=True)

    def on_recovery(made: Any) -> None:
        if made.rank != 0:  # the lowest rank says it
            return
        if made.lost:
            lost = ", ".join(map(str, made.lost))
            print(
                f"# lost rank{'s' if len(made.lost) != 1 else ''} {lost} (of {made.before}): "
                f"{made.before} -> {made.shrunk} ranks, shrunk and agreed in {1e3 * made.seconds:.1f} ms; "
                f"going on after step {made.step}",
                flush=True,
            )
        if made.joined:
            way = "spawn" if "spawn" in made.phases else "connect"
            print(
                f"# grown: {made.shrunk} -> {made.after} ranks ({made.joined} joined), {way} "
                f"{1e3 * made.phases[way]:.1f} ms, state {1e3 * made.phases['transfer']:.1f} ms "
                f"({made.state_bytes} bytes); topology {made.layout}; failure caught at {made.at:.6f}",
                flush=True,
            )
        elif made.grow_error:
            print(f"# no replacement started: {made.grow_error}", flush=True)

    policy = args.policy or ("replace" if args.grow else "shrink")
    if args.spares:  # the last ranks wait apart, at the rendezvous, as ranks started later would
        if policy != "replace-when-available" or not args.rendezvous or args.spares >= comm.Get_size():
            raise SystemExit(
                "--spares needs --policy replace-when-available, --rendezvous FILE, and fewer spares "
                "than ranks"
            )
        spare = comm.Get_rank() >= comm.Get_size() - args.spares
        active = comm.Split(MPI.UNDEFINED if spare else 0, comm.Get_rank())
        if spare:
            os.environ[growth.JOIN_ENV] = args.rendezvous
            comm = MPI.COMM_SELF
        else:
            comm = active
    try:
        result = train_elastic(
            comm,
            epochs=args.epochs,
            batch=args.batch,
            width=args.width,
            depth=args.depth,
            optimizer=args.optimizer,
            lr=lr,
            algorithm=args.algorithm,
            bucket_mb=args.bucket_mb,
            overlap=not args.no_overlap,
            device=args.device,
            dtype=args.dtype,
            seed=args.seed,
            max_steps=args.max_steps,
            reproducible=args.reproducible,
            microbatches=args.microbatches,
            wire=args.wire,
            error_feedback=args.error_feedback,
            progress=progress,
            on_recovery=on_recovery,
            policy=policy,
            min_size=args.min_ranks,
            max_size=args.max_ranks,
            rendezvous=args.rendezvous,
        )
    except TooFewRanksError as error:
        sys.stderr.write(f"hpcring.examples.train --elastic: {error}\n")
        print(f"# stopped: {error}", flush=True)
        return 3
    except NotNeededError:  # a spare the job never needed
        return 0
    except JoinError as error:  # a replacement that came too late: the job goes on without it
        sys.stderr.write(f"hpcring.examples.train --elastic: {error}\n")
        return 4
    if result.comm.Get_rank() == 0:
        warm = result.steps[min(5, len(result.steps) - 1) :]
        if warm:
            median = 1e3 * statistics.median(s["step"] for s in warm)
            print(f"# median per step (lowest rank, after 5 warm-up steps): {median:.2f} ms")
        print(f"# final test accuracy {100 * result.epochs[-1]['accuracy']:.1f}%")
        print(
            f"# weights digest {_digest(result.params, np if args.device != 'gpu' else _cupy())}", flush=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
