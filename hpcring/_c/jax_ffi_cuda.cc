/* hpcring._jax_ffi_cuda: jax_ffi.cc's CUDA handler, built where the CUDA runtime is (setup.py). A
 * file of its own so that its object never stands in for the CPU module's. */
#define HR_JAX_CUDA 1
#include "jax_ffi.cc"
