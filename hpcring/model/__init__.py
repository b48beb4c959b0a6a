"""The alpha-beta-gamma cost model of every algorithm here, its calibration, and predictions to 1000+ ranks.

A message of n bytes costs alpha + n*beta on a link; reducing n bytes locally costs n*gamma
(Hockney's model as used by Thakur, Rabenseifner & Gropp 2005). Each algorithm is written
once, as the list of `Phase`s it really performs, so the same description gives the flat
closed forms below, the per-link cost on a machine of nodes (`Nodes`), and the table and plot.

For n bytes on p ranks (p' = 2^floor(log2 p); every cost is 0 at p = 1):

- ring:         2(p-1)a + 2(p-1)/p n b + (p-1)/p n g
- rabenseifner: 2 log2(p) a + 2(p-1)/p n b + (p-1)/p n g                      (p a power of two)
                (2 log2(p') + 2) a + (2(p'-1)/p' + 2) n b + ((p'-1)/p' + 1) n g   (otherwise:
                the first 2(p-p') ranks pair up, the even one sends its whole buffer to the
                odd one, which reduces it and sends the whole result back at the end: the
                simple fold of Thakur et al. 2005, sec. 4.4, which is what runs here)
- naive:        (p-1)(a + n b) + (p+1) n g      (p-1 shifted exchanges, then p-1 reductions
                and 2 copies of the buffer, a copy costing what a reduction does)
- ps:           gather (p-1)(a + n b) + (p+1) n g at the root (reductions, 2 copies) + Bcast, which is
                ceil(log2 p)(a + n b) with ``bcast="binomial"`` (default: what Open MPI and
                MPICH do, a binomial tree) or (p-1)(a + n b) with ``bcast="linear"`` (the
                textbook server that sends to every worker over its one link)
- mpi:          the library's own choice; modelled as the cheaper of ring and rabenseifner
- hierarchical: ring reduce-scatter inside each node of L ranks, ring all-reduce of n/L bytes
                across the H nodes on each local rank at once (the L flows share one NIC
                unless each GPU has its own), ring all-gather inside the node.

busbw = algbw * 2(p-1)/p (nccl-tests), algbw = n / time.

hpcring's software on top of the network (`costs.Software`; a is an MPI latency): s per message
step of hpcring's own algorithms (the ring 2(p-1) s, rabenseifner (2 log2 p' + 2) s, or
2 log2 p s at a power of two, naive (p-1) s, hierarchical (2(L-1) + 2(H-1)) s; mpi and ps
none, their messages move inside the library), and once per call c plus the agreement
(check=True): an MPI all-reduce of AGREEMENT_BYTES priced as mpi, in which an mpi all-reduce
of up to RIDES_UP_TO bytes rides (it then costs c and the agreement alone); from 2 to
EXCHANGE_RANKS ranks one of up to EXCHANGE_RIDES_UP_TO bytes rides (`rides_up_to`), and costs
its bytes in each of the exchange's log2 p steps (`exchange_phases`: recursive doubling).

The other collectives (``predict(..., collective=...)``, ``--collective``), n each rank's input
(an all-gather's: one rank's row; p' and the fold as above):

- reduce-scatter: ring (p-1)(a + n/p b) + (p-1)/p n g; naive the same messages at once, then
  p-1 additions and 2 copies of a part; rabenseifner log2(p) a + (p-1)/p n (b + g) (p a power of
  two; otherwise the whole buffer folded in and the folded rank's part sent back); mpi the
  cheaper of ring and rabenseifner.
- all-gather: ring and naive (p-1)(a + n b); rabenseifner log2(p) a + (p-1) n b (p a power of
  two; otherwise the folded rank's row in and the whole output back); mpi the cheaper.
- broadcast: naive (p-1)(a + n b) at the root; binomial ceil(log2 p)(a + n b); ring, a chain
  pipelined in k = n / 512 KiB chunks, (p-2+k)(a + n/k b); mpi the cheaper of binomial and ring.

Their busbw factors are nccl-tests': (p-1)/p for the reduce-scatter and the all-gather, 1 for
the broadcast, with algbw = size / time where the size is the whole buffer (an all-gather's
output, p inputs).

The package, one concern a module:

- `hpcring.model.costs`: the formulas above, pure (no MPI, no NumPy): `predict`, `Params`, `Software`,
  `Link`, `Nodes`, `ModelError`;
- `hpcring.model.params`: the calibration file (`load_params`, `save_params`, `default_path`);
- `hpcring.model.calibrate`: calibration and validation, under mpiexec;
- `hpcring.model.cli`: the command line (``python -m hpcring.model``).

Used by other modules (the bench's ``predicted (us)`` column, ``auto``)::

    from hpcring.model.costs import predict
    from hpcring.model.params import load_params
    params = load_params()                  # path: $HPCRING_MODEL, else ~/.cache/hpcring/model.json
    seconds = predict("ring", nbytes, ranks, params)

`load_params` raises `ModelError` (a ValueError) for a missing or corrupt file; `predict`
raises it for an unknown algorithm or a non-positive size or rank count. With calibrated
`Params`, steps in which every rank works are slowed by ranks/cores when the ranks outnumber
the calibrated cores (`oversubscription`), unless the calibration measured them with that many
ranks busy at once (`Busy`, one entry per rank count calibrated; `Params.partial` for the
phases some ranks sit out, waiting). A call adds `Busy.call` (the agreement) and, from
COLD_FROM bytes, `Busy.cold` (its fixed costs paid again with cold caches). Elsewhere (other
rank counts, a `Link` or `Nodes`) the software is `predict(..., software=)`: by default the
calibration's (`Busy.step`, `Busy.overhead`: `Params.software`), else `DEFAULT_SOFTWARE`;
`NO_SOFTWARE` gives the network alone. `Link` and `Nodes` assume a core or GPU per rank.

Command line (only rank 0 prints; user errors exit 2 with one line, no traceback)::

    mpiexec -n 2 python -m hpcring.model --calibrate [--output FILE] [--quick]   # again at -n 3, 4...
    mpiexec -n 4 python -m hpcring.model --validate [--params FILE] [--sizes 1M,4M,16M]
    python -m hpcring.model --ranks 8,64,512,1000 --bytes 100M,1G [--link ndr400] [--plot t.png] \
        [--software auto|default|none|STEP_US[,CALL_US]]
    python -m hpcring.model --ranks 64,1000 --bytes 1G --gpus-per-node 8 --intra nvlink4 --link ndr400
    python -m hpcring.model --collective allgather --ranks 8,1000 --bytes 1G --link ndr400
"""
