/* hpcring._jax_ffi: hpcring's collectives as an XLA FFI target, so that a jitted program calls them
 * in place, with no trip through JAX's Python callback machinery.
 *
 * Built by setup.py where JAX is installed (the FFI headers come from jax.ffi.include_dir(), C++17);
 * hpcring/jax_ffi.py registers the handler with XLA and lowers hpcring.jax's primitives to it.
 *
 * The handler is narrow on purpose: it wraps XLA's buffers as NumPy arrays (no copy) and calls
 * hpcring.engine.call, the entry every front end uses. A warm NumPy all-reduce, broadcast,
 * reduce-scatter or all-gather then runs in the compiled core (hpcring/_c/core.c) from the
 * arguments to the result; everything else (first calls, the agreement's slow paths, StallError,
 * the other collectives) runs where it always does. An exception becomes an ffi::Error whose message begins with hpcring's exception
 * type and carries its text, and XLA raises it on the host.
 *
 * Each call site is one int64 attribute, "site": an index into the table of engine.call argument
 * tuples that hpcring/jax_ffi.py fills while lowering, in this process (a program lowered
 * elsewhere names sites this table does not have: refused, never misread).
 *
 * Built with HR_JAX_CUDA (jax_ffi_cuda.cc: the extension hpcring._jax_ffi_cuda, where CUDA is), this is the
 * CUDA handler instead: it stages the operand through host memory on the call's stream and runs
 * the CPU module's call on the host copy (hr_jax_run, reached through a capsule).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

/* What one collective on host memory returns: 0 done, else an XLA_FFI_Error_Code with text. */
struct hr_jax_status {
    int code;
    std::string message;
};

/* hr_jax_run(site, dtype, rank, dims, x, y, y_rank, y_dims): the collective of table entry
 * ``site`` on host arrays x (read) and y (written; may be x itself). */
typedef hr_jax_status (*hr_jax_run_fn)(int64_t, int, int, const int64_t *, void *, void *, int, const int64_t *);

#ifndef HR_JAX_CUDA
/* ============================================================================================ */
/* The CPU module                                                                                */
/* ============================================================================================ */
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

enum { K_ALLREDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST, K_KINDS };
#define HR_ARGS 11   /* engine.call(collective, x, out, op, algorithm, comm, check, timeout, root, reproducible, wire) */
#define HR_XLA_TYPES 64

static PyObject *engine_call;                /* hpcring.engine.call */
static PyObject *describe;                   /* exception -> (XLA_FFI_Error_Code, text) */
static PyObject *sites;                      /* list of (kind, args tuple) */
static PyArray_Descr *descrs[HR_XLA_TYPES];  /* NumPy's dtype for each XLA type hpcring takes */
static std::atomic<long long> ncalls;        /* handler calls, for tests (vmap: one per batch) */
static char empty_data[64];                  /* where a zero-size array points */

/* The GIL for a thread XLA runs the handler on. A thread Python never saw (XLA's pool) keeps its
 * Python thread state for good, so that each call does not build and tear one down. */
struct Gil {
    PyGILState_STATE state;
    Gil() {
        static thread_local bool kept = false;
        if (!kept) {
            kept = true;
            if (PyGILState_Ensure() == PyGILState_UNLOCKED) PyEval_SaveThread(); /* held once more, for good */
        }
        state = PyGILState_Ensure();
    }
    ~Gil() { PyGILState_Release(state); }
};

static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return !Py_IsInitialized() || Py_IsFinalizing();
#else
    return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

/* A NumPy array over XLA's memory (no copy); NULL with an exception set. */
static PyObject *view(int dtype, int rank, const int64_t *dims, void *data, bool writable) {
    PyArray_Descr *descr = dtype >= 0 && dtype < HR_XLA_TYPES ? descrs[dtype] : NULL;
    if (descr == NULL) {
        PyErr_Format(PyExc_TypeError, "hpcring.jax: XLA element type %d is not one hpcring reduces", dtype);
        return NULL;
    }
    if (rank > NPY_MAXDIMS) {
        PyErr_SetString(PyExc_ValueError, "hpcring.jax: too many dimensions");
        return NULL;
    }
    npy_intp shape[NPY_MAXDIMS];
    npy_intp count = 1;
    for (int d = 0; d < rank; d++) count *= (shape[d] = (npy_intp)dims[d]);
    if (count == 0 || data == NULL) data = empty_data;
    Py_INCREF(descr); /* PyArray_NewFromDescr steals it */
    int flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | (writable ? NPY_ARRAY_WRITEABLE : 0);
    return PyArray_NewFromDescr(&PyArray_Type, descr, rank, shape, NULL, data, flags, NULL);
}

/* The pending exception as a status (describe() says which code and what text), cleared. */
static hr_jax_status raised() {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    hr_jax_status status{XLA_FFI_Error_Code_INTERNAL, "hpcring.jax: an error without a description"};
    PyObject *said = describe && value ? PyObject_CallOneArg(describe, value) : NULL;
    int code;
    const char *text;
    if (said != NULL && PyArg_ParseTuple(said, "is", &code, &text)) {
        status.code = code;
        status.message = text;
    } else {
        PyErr_Clear();
        PyObject *s = value ? PyObject_Str(value) : NULL;
        const char *t = s ? PyUnicode_AsUTF8(s) : NULL;
        if (t) status.message = t;
        Py_XDECREF(s);
        PyErr_Clear();
    }
    Py_XDECREF(said);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return status;
}

/* One collective on host memory (the GIL is taken here). */
static hr_jax_status hr_jax_run(int64_t site, int dtype, int rank, const int64_t *dims, void *x, void *y, int y_rank,
                                const int64_t *y_dims) {
    if (finalizing()) return {XLA_FFI_Error_Code_FAILED_PRECONDITION, "hpcring.jax: Python is shutting down"};
    Gil gil;
    ncalls.fetch_add(1, std::memory_order_relaxed);
    if (engine_call == NULL || sites == NULL)
        return {XLA_FFI_Error_Code_FAILED_PRECONDITION, "hpcring.jax: the FFI target was not set up"};
    if (site < 0 || site >= PyList_GET_SIZE(sites))
        return {XLA_FFI_Error_Code_NOT_FOUND,
                "hpcring.jax: call site " + std::to_string(site) +
                    " was not lowered in this process (a program compiled or exported elsewhere)"};
    PyObject *entry = PyList_GET_ITEM(sites, site);
    int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
    PyObject *templ = PyTuple_GET_ITEM(entry, 1);
    bool aliased = x == y;
    PyObject *xa = NULL, *out = NULL;
    switch (kind) {
    case K_ALLREDUCE:
        if (aliased) {
            xa = view(dtype, rank, dims, x, true);
        } else {
            xa = view(dtype, rank, dims, x, false);
            out = xa ? view(dtype, y_rank, y_dims, y, true) : NULL;
        }
        break;
    case K_REDUCE_SCATTER:
    case K_ALLGATHER:
        xa = view(dtype, rank, dims, x, false);
        out = xa ? view(dtype, y_rank, y_dims, y, true) : NULL;
        break;
    case K_BROADCAST: /* in place on the result, the operand copied there first */
        xa = view(dtype, y_rank, y_dims, y, true);
        if (xa && !aliased && PyArray_NBYTES((PyArrayObject *)xa) > 0)
            memcpy(y, x, (size_t)PyArray_NBYTES((PyArrayObject *)xa));
        break;
    default:
        PyErr_SetString(PyExc_ValueError, "hpcring.jax: unknown collective kind");
    }
    hr_jax_status status{0, ""};
    if (xa == NULL || (out == NULL && PyErr_Occurred())) {
        status = raised();
    } else {
        PyObject *args[HR_ARGS];
        for (int k = 0; k < HR_ARGS; k++) args[k] = PyTuple_GET_ITEM(templ, k);
        args[1] = xa;
        args[2] = out ? out : Py_None;
        PyObject *result = PyObject_Vectorcall(engine_call, args, HR_ARGS, NULL);
        if (result == NULL) status = raised();
        Py_XDECREF(result);
    }
    Py_XDECREF(xa);
    Py_XDECREF(out);
    return status;
}

static ffi::Error to_error(const hr_jax_status &s) {
    if (s.code == 0) return ffi::Error::Success();
    return ffi::Error(static_cast<XLA_FFI_Error_Code>(s.code), s.message);
}

static ffi::Error collective_cpu(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Token>,
                                 int64_t site) {
    auto xd = x.dimensions();
    auto yd = y->dimensions();
    return to_error(hr_jax_run(site, (int)x.element_type(), (int)xd.size(), xd.begin(), x.untyped_data(),
                               y->untyped_data(), (int)yd.size(), yd.begin()));
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(hr_collective_cpu, collective_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("site"));

/* ---- the Python module ------------------------------------------------------------------------ */

PyDoc_STRVAR(setup_doc, "setup(call, describe, dtypes)\n\n"
                        "hpcring.engine.call, the function that turns an exception into (XLA_FFI_Error_Code, "
                        "text), and the NumPy dtype of each XLA element type code hpcring takes ({code: dtype}).");

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *call, *desc, *dtypes;
    if (!PyArg_ParseTuple(args, "OOO!", &call, &desc, &PyDict_Type, &dtypes)) return NULL;
    if (!PyCallable_Check(call) || !PyCallable_Check(desc)) {
        PyErr_SetString(PyExc_TypeError, "setup: call and describe must be callable");
        return NULL;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(dtypes, &pos, &key, &value)) {
        long code = PyLong_AsLong(key);
        if (code == -1 && PyErr_Occurred()) return NULL;
        if (code < 0 || code >= HR_XLA_TYPES || !PyArray_DescrCheck(value)) {
            PyErr_SetString(PyExc_ValueError, "setup: dtypes maps XLA type codes to numpy dtypes");
            return NULL;
        }
        Py_INCREF(value);
        Py_XSETREF(descrs[code], (PyArray_Descr *)value);
    }
    Py_INCREF(call);
    Py_XSETREF(engine_call, call);
    Py_INCREF(desc);
    Py_XSETREF(describe, desc);
    if (sites == NULL && (sites = PyList_New(0)) == NULL) return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(site_doc, "site(kind, args) -> int\n\n"
                       "List a call site: kind 0 all-reduce, 1 reduce-scatter, 2 all-gather, 3 broadcast; args the "
                       "11 arguments of hpcring.engine.call (x and out are filled in at each call). Returns the "
                       "number the lowered custom call carries.");

static PyObject *site(PyObject *self, PyObject *args) {
    int kind;
    PyObject *templ;
    if (!PyArg_ParseTuple(args, "iO!", &kind, &PyTuple_Type, &templ)) return NULL;
    if (kind < 0 || kind >= K_KINDS || PyTuple_GET_SIZE(templ) != HR_ARGS) {
        PyErr_SetString(PyExc_ValueError, "site: a kind of 0-3 and a tuple of 11 arguments");
        return NULL;
    }
    if (sites == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "site: setup() first");
        return NULL;
    }
    PyObject *entry = Py_BuildValue("(iO)", kind, templ);
    if (entry == NULL || PyList_Append(sites, entry) < 0) {
        Py_XDECREF(entry);
        return NULL;
    }
    Py_DECREF(entry);
    return PyLong_FromSsize_t(PyList_GET_SIZE(sites) - 1);
}

static PyObject *calls(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(ncalls.load(std::memory_order_relaxed));
}

static PyObject *handler(PyObject *self, PyObject *unused) {
    return PyCapsule_New(reinterpret_cast<void *>(hr_collective_cpu), NULL, NULL);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, setup_doc},
    {"site", site, METH_VARARGS, site_doc},
    {"calls", calls, METH_NOARGS, "calls() -> int\n\nHow many times XLA called the handler in this process."},
    {"handler", handler, METH_NOARGS, "handler() -> capsule\n\nThe CPU handler, for jax.ffi.register_ffi_target."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hpcring._jax_ffi",
    "hpcring's collectives as an XLA FFI target (see hpcring/jax_ffi.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__jax_ffi(void) {
    import_array1(NULL);
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *types = Py_BuildValue("{sisisisisisisisi}", "float16", XLA_FFI_DataType_F16, "bfloat16",
                                    XLA_FFI_DataType_BF16, "float32", XLA_FFI_DataType_F32, "float64",
                                    XLA_FFI_DataType_F64, "int32", XLA_FFI_DataType_S32, "int64", XLA_FFI_DataType_S64,
                                    "complex64", XLA_FFI_DataType_C64, "complex128", XLA_FFI_DataType_C128);
    PyObject *codes = Py_BuildValue(
        "{sisisisisisi}", "INVALID_ARGUMENT", XLA_FFI_Error_Code_INVALID_ARGUMENT, "DEADLINE_EXCEEDED",
        XLA_FFI_Error_Code_DEADLINE_EXCEEDED, "RESOURCE_EXHAUSTED", XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "ABORTED",
        XLA_FFI_Error_Code_ABORTED, "UNIMPLEMENTED", XLA_FFI_Error_Code_UNIMPLEMENTED, "INTERNAL",
        XLA_FFI_Error_Code_INTERNAL);
    PyObject *api = PyCapsule_New(reinterpret_cast<void *>(&hr_jax_run), "hpcring._jax_ffi.run", NULL);
    int bad = types == NULL || codes == NULL || api == NULL || PyModule_AddObjectRef(m, "XLA_TYPES", types) < 0 ||
              PyModule_AddObjectRef(m, "ERROR_CODES", codes) < 0 || PyModule_AddObjectRef(m, "RUN", api) < 0;
    Py_XDECREF(types);
    Py_XDECREF(codes);
    Py_XDECREF(api);
    if (bad) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

#else
/* ============================================================================================ */
/* The CUDA module: stage through host memory, run the CPU module's call there                 */
/* ============================================================================================ */
#include <cuda_runtime_api.h>

#include <mutex>

static hr_jax_run_fn run_on_host;
static std::mutex staging_lock; /* one call at a time through the staging buffers */

/* Pinned host memory for one call's staging, kept and grown (one buffer pair per process). */
struct Staging {
    void *x = nullptr, *y = nullptr;
    size_t xn = 0, yn = 0;
};

static bool grow(void **buf, size_t *have, size_t need) {
    if (need <= *have) return true;
    if (*buf) cudaFreeHost(*buf);
    *buf = nullptr;
    *have = 0;
    if (cudaMallocHost(buf, need ? need : 1) != cudaSuccess) return false;
    *have = need;
    return true;
}

static ffi::Error cuda_failed(const char *what, cudaError_t rc) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("hpcring.jax (CUDA): ") + what + ": " + cudaGetErrorString(rc));
}

static ffi::Error collective_cuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                                  ffi::Result<ffi::Token>, int64_t site) {
    static Staging staging;
    std::lock_guard<std::mutex> hold(staging_lock);
    if (run_on_host == nullptr) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, "hpcring.jax (CUDA): not set up");
    size_t xn = x.size_bytes(), yn = y->size_bytes();
    bool aliased = x.untyped_data() == y->untyped_data();
    if (!grow(&staging.x, &staging.xn, xn) || (!aliased && !grow(&staging.y, &staging.yn, yn)))
        return ffi::Error(ffi::ErrorCode::kResourceExhausted, "hpcring.jax (CUDA): no pinned host memory for staging");
    cudaError_t rc = cudaMemcpyAsync(staging.x, x.untyped_data(), xn, cudaMemcpyDeviceToHost, stream);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream);
    if (rc != cudaSuccess) return cuda_failed("copying the operand to the host", rc);
    void *host_y = aliased ? staging.x : staging.y;
    auto xd = x.dimensions();
    auto yd = y->dimensions();
    hr_jax_status s = run_on_host(site, (int)x.element_type(), (int)xd.size(), xd.begin(), staging.x, host_y,
                                  (int)yd.size(), yd.begin());
    if (s.code != 0) return ffi::Error(static_cast<XLA_FFI_Error_Code>(s.code), s.message);
    rc = cudaMemcpyAsync(y->untyped_data(), host_y, yn, cudaMemcpyHostToDevice, stream);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream); /* the staging buffer is reused next call */
    if (rc != cudaSuccess) return cuda_failed("copying the result to the device", rc);
    return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(hr_collective_cuda, collective_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("site"));

static PyObject *handler(PyObject *self, PyObject *unused) {
    return PyCapsule_New(reinterpret_cast<void *>(hr_collective_cuda), NULL, NULL);
}

static PyObject *setup(PyObject *self, PyObject *capsule) {
    void *fn = PyCapsule_GetPointer(capsule, "hpcring._jax_ffi.run");
    if (fn == NULL) return NULL;
    run_on_host = reinterpret_cast<hr_jax_run_fn>(fn);
    Py_RETURN_NONE;
}

static PyObject *devices(PyObject *self, PyObject *unused) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    return PyLong_FromLong(n);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_O, "setup(run)\n\nThe CPU module's host call (hpcring._jax_ffi.RUN)."},
    {"handler", handler, METH_NOARGS, "handler() -> capsule\n\nThe CUDA handler, for jax.ffi.register_ffi_target."},
    {"devices", devices, METH_NOARGS, "devices() -> int\n\nCUDA devices this process sees (0 without a driver)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hpcring._jax_ffi_cuda",
    "hpcring's collectives as an XLA FFI target for CUDA buffers, staged through host memory.", -1, methods,
};

PyMODINIT_FUNC PyInit__jax_ffi_cuda(void) { return PyModule_Create(&module); }
#endif
