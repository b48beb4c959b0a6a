/* hpcring._core: the MPI-linked part of the compiled core.
 *
 * Built with the MPI compiler wrapper (setup.py says which), against the mpi.h of that MPI, and
 * reaching mpi4py's communicators through its C API (PyMPIComm_Get). Today it holds what the
 * import needs to prove it may run here (the ABI facts hpcring/core.py compares with mpi4py's),
 * and one bare call, `allreduce`, the shortest path from Python to MPI_Allreduce: the yardstick
 * the warm call and the schedules' step loops, to come here, are measured against.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <mpi.h>
#include <mpi4py/mpi4py.h>

#include "reduce.h"

/* Which MPI's header this was compiled against, in MPI_Get_library_version's first words. */
#if defined(OMPI_MAJOR_VERSION)
#define HR_MPI_VENDOR "Open MPI"
#elif defined(I_MPI_VERSION)
#define HR_MPI_VENDOR "Intel(R) MPI"
#elif defined(MVAPICH2_VERSION) || defined(MVAPICH_VERSION)
#define HR_MPI_VENDOR "MVAPICH"
#elif defined(MPICH_VERSION)
#define HR_MPI_VENDOR "MPICH"
#else
#define HR_MPI_VENDOR "unknown"
#endif

static MPI_Datatype mpi_type(int dtype) {
    switch (dtype) {
    case HR_F32: return MPI_FLOAT;
    case HR_F64: return MPI_DOUBLE;
    case HR_I32: return MPI_INT32_T;
    case HR_I64: return MPI_INT64_T;
    case HR_C64: return MPI_C_FLOAT_COMPLEX;
    case HR_C128: return MPI_C_DOUBLE_COMPLEX;
    case HR_U8: return MPI_UINT8_T;
    case HR_U16: return MPI_UINT16_T;
    default: return MPI_DATATYPE_NULL; /* float16, bfloat16: no MPI type */
    }
}

static MPI_Op mpi_op(int op) {
    switch (op) {
    case HR_SUM: return MPI_SUM;
    case HR_MAX: return MPI_MAX;
    case HR_MIN: return MPI_MIN;
    case HR_PROD: return MPI_PROD;
    default: return MPI_OP_NULL;
    }
}

PyDoc_STRVAR(comm_world_doc, "comm_world() -> int\n\nMPI_COMM_WORLD's handle as this build sees it (an address in "
                             "Open MPI, a constant in MPICH): equal to mpi4py's where both use one library.");

static PyObject *comm_world(PyObject *self, PyObject *unused) {
    if (sizeof(MPI_Comm) == sizeof(void *)) {
        void *h;
        MPI_Comm c = MPI_COMM_WORLD;
        memcpy(&h, &c, sizeof h);
        return PyLong_FromVoidPtr(h);
    }
    int h;
    MPI_Comm c = MPI_COMM_WORLD;
    memcpy(&h, &c, sizeof h);
    return PyLong_FromLong(h);
}

PyDoc_STRVAR(library_version_doc, "library_version() -> str\n\nMPI_Get_library_version of the library this "
                                  "extension runs against (callable before MPI_Init).");

static PyObject *library_version(PyObject *self, PyObject *unused) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) Py_RETURN_NONE;
    return PyUnicode_DecodeLatin1(text, len, "replace");
}

PyDoc_STRVAR(allreduce_doc, "allreduce(comm, send, recv, dtype, op) -> int\n\n"
                            "MPI_Allreduce(send, recv) on mpi4py's ``comm``; ``dtype`` and ``op`` the kernels' "
                            "codes (hpcring.kernels.DTYPE_CODES, OP_CODES). Returns MPI's error code.");

static PyObject *allreduce(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 5) {
        PyErr_SetString(PyExc_TypeError, "allreduce(comm, send, recv, dtype, op) takes 5 arguments");
        return NULL;
    }
    MPI_Comm *comm = PyMPIComm_Get(argv[0]);
    if (comm == NULL) return NULL;
    int dtype = (int)PyLong_AsLong(argv[3]), op = (int)PyLong_AsLong(argv[4]);
    if (PyErr_Occurred()) return NULL;
    if (dtype < 0 || dtype >= HR_NDTYPES || mpi_type(dtype) == MPI_DATATYPE_NULL || mpi_op(op) == MPI_OP_NULL) {
        PyErr_SetString(PyExc_ValueError, "allreduce: no MPI datatype or op for these codes");
        return NULL;
    }
    Py_buffer send, recv;
    if (PyObject_GetBuffer(argv[1], &send, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(argv[2], &recv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&send);
        return NULL;
    }
    int rc = MPI_ERR_COUNT;
    Py_ssize_t count = recv.len / hr_itemsize[dtype];
    if (send.len == recv.len && count <= INT32_MAX) {
        const void *sbuf = send.buf == recv.buf ? MPI_IN_PLACE : send.buf;
        Py_BEGIN_ALLOW_THREADS /* as mpi4py's own calls do */
        rc = MPI_Allreduce(sbuf, recv.buf, (int)count, mpi_type(dtype), mpi_op(op), *comm);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&send);
    PyBuffer_Release(&recv);
    return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
    {"comm_world", comm_world, METH_NOARGS, comm_world_doc},
    {"library_version", library_version, METH_NOARGS, library_version_doc},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL, allreduce_doc},
    {NULL, NULL, 0, NULL},
};

/* The module is named after the MPI family it is built against (setup.py defines HR_CORE_NAME:
   _core_openmpi or _core_mpich), so that builds for both stand side by side in one tree. */
#ifndef HR_CORE_NAME
#define HR_CORE_NAME _core
#endif
#define HR_STR2(x) #x
#define HR_STR(x) HR_STR2(x)
#define HR_CAT2(a, b) a##b
#define HR_CAT(a, b) HR_CAT2(a, b)

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hpcring." HR_STR(HR_CORE_NAME),
    "hpcring's MPI-linked core: ABI facts and the bare call to MPI (see hpcring/core.py).", -1, methods,
};

PyMODINIT_FUNC HR_CAT(PyInit_, HR_CORE_NAME)(void) {
    if (import_mpi4py() < 0) return NULL; /* mpi4py.MPI, and with it libmpi, is loaded first */
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "MPI_VENDOR", HR_MPI_VENDOR) < 0 ||
        PyModule_AddIntConstant(m, "COMM_SIZEOF", (long)sizeof(MPI_Comm)) < 0 ||
        PyModule_AddIntConstant(m, "MPI_VERSION", MPI_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "MPI_SUBVERSION", MPI_SUBVERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
