"""`python -m hpcring.cudaprobe DEVICE`: can this MPI library read and write GPU memory?

Run by `hpcring.gpu.cuda_aware` in a child process when ``HPCRING_CUDA_AWARE=1`` is set
(the probe's supervisor, `verify_cuda_aware`, and every other GPU fact live in
hpcring/gpu.py; this module stays apart because it is a ``python -m`` entry): a library that
is not CUDA-aware dereferences device pointers as host memory and crashes, and a crash in a
child is a verdict, where in the rank itself it would end the job. The child is an MPI
singleton (the parent clears the launcher's environment): it sends a small device array to
itself and checks what arrived. Exit 0 means it works.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Exchange 1024 float32 on GPU ``argv[0]`` through MPI_Sendrecv on COMM_SELF; 0 if exact."""
    args = sys.argv[1:] if argv is None else argv
    import cupy
    from mpi4py import MPI

    cupy.cuda.Device(int(args[0]) if args else 0).use()
    sent = cupy.arange(1024, dtype=cupy.float32)
    received = cupy.zeros_like(sent)
    cupy.cuda.get_current_stream().synchronize()
    MPI.COMM_SELF.Sendrecv(sent, 0, 7, received, 0, 7)
    if not bool((received == sent).all()):
        print("hpcring.cudaprobe: the device buffer arrived wrong", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
