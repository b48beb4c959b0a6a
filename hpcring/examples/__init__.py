"""Runnable examples: `mpiexec -n 4 python -m hpcring.examples.train`."""
