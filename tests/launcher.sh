# Sourced by the test scripts and tools: MPIEXEC, this MPI's launcher as a command that may start
# more ranks than there are cores, and MPI_FLAVOUR (openmpi or mpich). Open MPI's mpiexec needs
# --oversubscribe for that, and as root the two OMPI_ALLOW_RUN_AS_ROOT* variables; MPICH's Hydra
# oversubscribes and runs as root as it is, and rejects --oversubscribe (and -x, --mca, --prtemca).
if mpiexec --version 2>/dev/null | grep -q "Open MPI"; then
  MPI_FLAVOUR=openmpi
  MPIEXEC=(mpiexec --oversubscribe)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
else
  MPI_FLAVOUR=mpich
  MPIEXEC=(mpiexec)
fi
