/* hpcring._core_<family>: the MPI-linked part of the compiled core.
 *
 * Built with the MPI compiler wrapper (setup.py says which), against the mpi.h of that MPI, and
 * reaching mpi4py's communicators through its C API (PyMPIComm_Get). It holds:
 *
 * - the ABI facts hpcring/core.py compares with mpi4py's before anything here is used;
 * - `Program`: a call's step table (hpcring/program.py records it from the algorithm) executed
 *   row by row with the GIL released: MPI_Isend/Irecv, waits that test against the deadline,
 *   the reductions of reduce.h, the wire's narrowing and widening, library collectives. A wait
 *   that lasts longer than SPIN_SECONDS goes back to Python's bounded wait (the channel's), so
 *   stall notices, naps and the StallError that names ranks stay where they are;
 * - `Warm` and `Table`: the warm call of a NumPy all-reduce, broadcast, reduce-scatter or
 *   all-gather, from the arguments to the result: the key and flags check (a reduce-scatter's or
 *   an all-gather's out= as the engine's _output takes it, auto's choice still the channel's), the
 *   exclusion, the flight record's stores, the agreement (MPI_Iallreduce of the row, tested
 *   against the deadline) and the program. Every slow path (a mismatch, a long wait, an error)
 *   calls back into the engine's Python, so every rank raises what the pure-Python core raises;
 * - `caller`: hpcring.engine.call as the front ends call it: a warm call found in a `Table` runs
 *   here, anything else goes on to the Python function;
 * - `Shared` (shared.h): a plan's all-reduce through a shared-memory segment, run by its `Warm`.
 *
 * The pure-Python core is the reference: both give the same bits (tests/test_core_mpi.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <mpi.h>
#include <mpi4py/mpi4py.h>
#include <sched.h>
#include <time.h>

#include "agree.h"
#include "exact.h"
#include "reduce.h"
#include "wire.h"

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

/* hpcring/program.py's row layout and kinds. */
#define HR_WIDTH 12
enum {
    R_SEND = 1, R_RECV, R_WAIT, R_COMBINE, R_COPY, R_NARROW, R_WIDEN, R_ROUND, R_STEP, R_COLLECTIVE,
    R_CODES, R_ENCODE, R_DECODE, R_WIDEN_ADD, R_GATHER
};
enum { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BCAST, C_IGATHER, C_IBCAST, C_ALLTOALL };
enum { B_SRC, B_DST, B_SCRATCH };

/* A wait tests this long with the GIL released before Python's bounded wait takes over (which
 * looks for stall notices every millisecond: hpcring/polling.py NOTICE_EVERY). */
#define SPIN_SECONDS 1e-3
/* The agreement tests this long holding the GIL (ranks in step: a few microseconds), then
 * releases it for the rest of SPIN_SECONDS. */
#define HELD_SECONDS 20e-6
#define TABLES 64  /* communicators with warm calls in C */
#define ENTRIES 64 /* warm calls per communicator (MRU first) */

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

/* ---- what setup() hands over ------------------------------------------------------------- */

static hr_quirks quirks;
static unsigned char combine_off[HR_NDTYPES][HR_NOPS];
static PyObject *mpi_exception;       /* mpi4py.MPI.Exception */
static PyTypeObject *ndarray_type;    /* numpy.ndarray */
static PyTypeObject *intracomm_type;  /* mpi4py.MPI.Intracomm */
static PyTypeObject *null_tracer_type; /* hpcring.tracing.NullTracer: tracing is off */
static PyObject *tracing_globals;     /* hpcring.tracing's namespace: TRACER */
static PyObject *fallback;            /* the Python hpcring.engine.call */
static PyObject *abandoned;           /* what a failed program's requests may still use: kept for good */
static int enabled;                   /* HPCRING_CORE allows it (hpcring.kernels.select) */
static int struct_ok;                 /* ndarray fields read directly (checked at setup) */
static unsigned long main_thread;
/* The agreement's collective (agree.h): its header width (int64 words per half), its payload
 * slot in bytes, and the datatype and op every rank's agreement uses (`agreement` makes them). */
static int agree_width;
static Py_ssize_t agree_slot;
static Py_ssize_t agree_pair_slot; /* exchanging ranks (agree.h's hr_steps): the slot this large */
static MPI_Datatype agree_type = MPI_DATATYPE_NULL;
static MPI_Op agree_op = MPI_OP_NULL;

static PyObject *s_timeout, *s_step, *s_traffic, *s_sent, *s_unknown, *s_calls, *s_finish, *s_wait, *s_seq,
    *s_call, *s_phase, *s_start, *s_number, *s_end, *s_scratch, *s_tracer, *s_on, *s_stalled, *s_disagreed,
    *s_failed, *s_divide, *s_resolve, *s_plan_waited;

static double now(void) { /* time.monotonic and time.perf_counter on Linux: CLOCK_MONOTONIC */
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- NumPy arrays, read as NumPy lays them out (PyArrayObject_fields, ABI-stable) ------------- */

typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} hr_ndarray;

#define NPY_C_CONTIGUOUS 0x0001
#define NPY_WRITEABLE 0x0400

/* The data pointer and byte length of a C-contiguous array (``writable`` asked), or -1 (no error set). */
static int array_bytes(PyObject *obj, int writable, char **data, Py_ssize_t *nbytes) {
    if (Py_TYPE(obj) != ndarray_type) return -1;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return -1;
    }
    *data = view.buf;
    *nbytes = view.len;
    PyBuffer_Release(&view);
    return 0;
}

/* An exception taken aside while a handler runs (Python 3.11's PyErr_Fetch, normalized). */
typedef struct {
    PyObject *type, *value, *tb;
} hr_exc;

static hr_exc exc_take(void) {
    hr_exc e = {NULL, NULL, NULL};
    PyErr_Fetch(&e.type, &e.value, &e.tb);
    if (e.type != NULL) {
        PyErr_NormalizeException(&e.type, &e.value, &e.tb);
        if (e.tb != NULL) PyException_SetTraceback(e.value, e.tb);
    }
    return e;
}

static void exc_put(hr_exc e) { PyErr_Restore(e.type, e.value, e.tb); }

static void exc_drop(hr_exc e) {
    Py_XDECREF(e.type);
    Py_XDECREF(e.value);
    Py_XDECREF(e.tb);
}

/* ---- the agreement's collective (agree.h) --------------------------------------------------- */

/* MPI_User_function of the agreement: the header's maxima, and the payloads reduced where both
 * sides are uniform and equal (whole elements: the datatype is one contiguous element). */
/* b <- a (op) b for one contribution whose slot holds ``slot`` bytes (hpcring.agreement.combine). */
static void agree_combine(const int64_t *a, int64_t *b, Py_ssize_t slot) {
    int w = agree_width;
    int carry = hr_agreed(a, w) && hr_agreed(b, w) && hr_carried(a, w) && hr_carried(b, w);
    for (int k = 0; k < w && carry; k++) carry = a[k] == b[k];
    for (int k = 0; k < 2 * w; k++)
        if (a[k] > b[k]) b[k] = a[k];
    int64_t dtype = b[w - 4], op = b[w - 3], count = b[w - 2];
    if (carry && dtype >= 0 && dtype < HR_NDTYPES && count > 0 && count * hr_itemsize[dtype] <= slot)
        hr_payload_combine((int)dtype, (int)op, a + 2 * w, b + 2 * w, (size_t)count, &quirks);
}

static void agree_reduce(void *in, void *inout, int *len, MPI_Datatype *type) {
    size_t bytes = 16 * (size_t)agree_width + (size_t)agree_slot;
    for (int e = 0; e < *len; e++)
        agree_combine((const int64_t *)((char *)in + e * bytes), (int64_t *)((char *)inout + e * bytes), agree_slot);
}

PyDoc_STRVAR(agreement_doc, "agreement(width, slot, pair_slot, pair_inline) -> (datatype, op)\n\nThe agreement's collective for "
                            "a header of ``width`` words per half and a payload slot of ``slot`` bytes: its datatype "
                            "(one element) and its op (agree.h) as mpi4py objects, made once; ranks that exchange their "
                            "contributions instead (hpcring.agreement.exchanges: the Agreement's ``exchanging``) do so with a slot of ``pair_slot`` bytes (``pair_inline`` of them in the header's "
                            "message).");

static PyObject *agreement(PyObject *self, PyObject *args) {
    int width;
    Py_ssize_t slot, pair_slot, pair_inline;
    if (!PyArg_ParseTuple(args, "innn", &width, &slot, &pair_slot, &pair_inline)) return NULL;
    if (width < 5 || slot < 0 || slot % 16 || pair_slot < HR_PAIR_INLINE || pair_slot % 16 ||
        pair_inline != HR_PAIR_INLINE) {
        PyErr_SetString(PyExc_ValueError, "agreement: width >= 5, slots multiples of 16, pair_slot >= pair_inline, "
                                          "pair_inline as built (HR_PAIR_INLINE)");
        return NULL;
    }
    if (agree_op == MPI_OP_NULL) {
        agree_width = width;
        agree_slot = slot;
        agree_pair_slot = pair_slot;
        if (MPI_Type_contiguous((int)(16 * width + slot), MPI_BYTE, &agree_type) != MPI_SUCCESS ||
            MPI_Type_commit(&agree_type) != MPI_SUCCESS || MPI_Op_create(agree_reduce, 1, &agree_op) != MPI_SUCCESS) {
            PyErr_SetString(PyExc_RuntimeError, "agreement: MPI could not make its datatype or op");
            return NULL;
        }
    } else if (width != agree_width || slot != agree_slot || pair_slot != agree_pair_slot) {
        PyErr_SetString(PyExc_ValueError, "agreement: made already with another shape");
        return NULL;
    }
    return Py_BuildValue("(NN)", PyMPIDatatype_New(agree_type), PyMPIOp_New(agree_op));
}

PyDoc_STRVAR(combine_payload_doc, "combine_payload(dtype, op, a, b)\n\nb <- a (op) b as the agreement's op reduces "
                                  "payloads (agree.h), on contiguous NumPy arrays of the kernels' dtype code: for tests.");

static PyObject *combine_payload(PyObject *self, PyObject *args) {
    int dtype, op;
    PyObject *a_obj, *b_obj;
    if (!PyArg_ParseTuple(args, "iiOO", &dtype, &op, &a_obj, &b_obj)) return NULL;
    char *a, *b;
    Py_ssize_t na, nb;
    if (dtype < 0 || dtype >= HR_NDTYPES || array_bytes(a_obj, 0, &a, &na) < 0 || array_bytes(b_obj, 1, &b, &nb) < 0 ||
        na != nb || na % hr_itemsize[dtype]) {
        PyErr_SetString(PyExc_ValueError, "combine_payload: two C-contiguous arrays of one size and that dtype");
        return NULL;
    }
    if (hr_payload_combine(dtype, op, a, b, (size_t)(na / hr_itemsize[dtype]), &quirks) < 0) {
        PyErr_SetString(PyExc_ValueError, "combine_payload: no payload of that dtype and op");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- waiting ------------------------------------------------------------------------------ */

/* How a wait spends its core. Spinning on MPI_Test answers fastest, but where ranks outnumber
 * cores it keeps the rank being waited for off the core it needs: there (`sharing`, set from
 * hpcring/polling.py: HPCRING_WAIT, or the launcher's count of ranks against the cores) a wait
 * yields its core between tests. Where every rank has a core and another process preempts this
 * one, a yield hands the core to that process for its whole time slice (measured: 2 ranks on 2
 * cores beside one spinning process, 2.2 ms a step against MPI's 0.6 ms), so preemption alone
 * does not make a wait share. */
static int sharing;
#define SHARED_TESTS 64 /* tests before a wait yields the core */

/* Test ``*req`` until it completes (1) or ``seconds`` pass (0); napping ``nap`` ns between tests
 * where asked (HPCRING_WAIT_SLEEP_US), yielding the core between tests where it is shared (above).
 * Called with or without the GIL: it touches no Python. */
static inline int test_n(int n, MPI_Request *req, int *flag) {
    return n == 1 ? MPI_Test(req, flag, MPI_STATUS_IGNORE) : MPI_Testall(n, req, flag, MPI_STATUSES_IGNORE);
}

/* As `spin`, for ``n`` requests all done. */
static int spin_n(int n, MPI_Request *req, double seconds, long nap, int *rc) {
    int flag = 0;
    if (!nap) {
        for (int i = 0; i < SHARED_TESTS; i++) {
            if ((*rc = test_n(n, req, &flag)) != MPI_SUCCESS || flag) return flag;
        }
    }
    int share = sharing;
    double end = now() + seconds;
    for (;;) {
        for (int i = 0; i < (nap || share ? 1 : 16); i++) {
            if ((*rc = test_n(n, req, &flag)) != MPI_SUCCESS || flag) break;
        }
        if (*rc != MPI_SUCCESS || flag) break;
        if (nap) {
            struct timespec t = {nap / 1000000000L, nap % 1000000000L};
            nanosleep(&t, NULL);
        } else if (share) {
            sched_yield();
        }
        if (now() > end) break;
    }
    return flag;
}

static int spin(MPI_Request *req, double seconds, long nap, int *rc) { return spin_n(1, req, seconds, nap, rc); }

/* As `spin_n`, without naps and with the GIL released: the second stage of a wait, before
 * Python's bounded one. Called with the GIL held. */
static int spin_released(int n, MPI_Request *req, double seconds, int *rc) {
    int done;
    Py_BEGIN_ALLOW_THREADS
    done = spin_n(n, req, seconds, 0, rc);
    Py_END_ALLOW_THREADS
    return done;
}

PyDoc_STRVAR(waiting_doc, "waiting(share)\n\nWhether waits yield their core between tests from the start "
                          "(hpcring.polling.share).");

static PyObject *waiting(PyObject *self, PyObject *on) {
    int share = PyObject_IsTrue(on);
    if (share < 0) return NULL;
    sharing = share;
    Py_RETURN_NONE;
}

static PyObject *mpi_error(int rc) {
    PyObject *code = PyLong_FromLong(rc);
    if (code != NULL) {
        PyErr_SetObject(mpi_exception, code);
        Py_DECREF(code);
    }
    return NULL;
}

#include "shared.h" /* a plan's all-reduce through shared memory: after the waits, which it shares */
#include "state.h"  /* a join's state to its newcomers (hpcring/growth.py): after the waits too */

/* ---- Program: a step table (hpcring/program.py) ------------------------------------------- */

typedef struct {
    int kind, comm;
    PyObject *name;   /* scratch: its name in the channel */
    Py_ssize_t nbytes; /* scratch: bytes the rows use */
    PyObject *held;   /* scratch: the array it lives in now */
    char *data;
} hr_buffer;

typedef struct {
    PyObject_HEAD
    Py_ssize_t nrows;
    int64_t *rows;
    int nbuf;
    hr_buffer *bufs;
    int ncomm;
    PyObject *channels;  /* tuple: the real channels, by comm number */
    MPI_Comm *comms;
    PyObject **tables;   /* per comm: the channel's scratch table (dict) */
    int *counts;
    Py_ssize_t ncounts;
    MPI_Request *req;
    long long sent;
    int unknown;
    Py_ssize_t src_nbytes, dst_nbytes; /* what buffers 0 and 1 must hold */
    int align;                         /* their data pointers' alignment, bytes */
    int size;
    int busy;                          /* running: never re-entered (one collective per communicator) */
} Program;

/* A program holds its channels (and their scratch tables), which hold it in turn (the channel's
 * "compiled-programs"): the garbage collector sees that cycle through these. */
static int program_traverse(Program *p, visitproc visit, void *arg) {
    for (int b = 0; b < p->nbuf && p->bufs; b++) {
        Py_VISIT(p->bufs[b].name);
        Py_VISIT(p->bufs[b].held);
    }
    for (int c = 0; c < p->ncomm && p->tables; c++) Py_VISIT(p->tables[c]);
    Py_VISIT(p->channels);
    return 0;
}

static int program_clear(Program *p) {
    for (int b = 0; b < p->nbuf && p->bufs; b++) {
        Py_CLEAR(p->bufs[b].name);
        Py_CLEAR(p->bufs[b].held);
    }
    for (int c = 0; c < p->ncomm && p->tables; c++) Py_CLEAR(p->tables[c]);
    Py_CLEAR(p->channels);
    return 0;
}

static void program_dealloc(Program *p) {
    PyObject_GC_UnTrack(p);
    for (int b = 0; b < p->nbuf; b++) {
        Py_XDECREF(p->bufs[b].name);
        Py_XDECREF(p->bufs[b].held);
    }
    for (int c = 0; c < p->ncomm; c++) Py_XDECREF(p->tables ? p->tables[c] : NULL);
    Py_XDECREF(p->channels);
    PyMem_Free(p->rows);
    PyMem_Free(p->bufs);
    PyMem_Free(p->comms);
    PyMem_Free(p->tables);
    PyMem_Free(p->counts);
    PyMem_Free(p->req);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int row_check(Program *p, const int64_t *r, Py_ssize_t i) {
#define BUF_OK(b) ((b) >= 0 && (b) < p->nbuf)
#define COMM_OK(c) ((c) >= 0 && (c) < p->ncomm)
#define FLOAT_OK(d) ((d) == HR_F16 || (d) == HR_BF16 || (d) == HR_F32 || (d) == HR_F64)
    switch (r[0]) {
    case R_SEND:
    case R_RECV:
        return COMM_OK(r[1]) && BUF_OK(r[4]) && r[6] >= 0 && r[6] <= INT32_MAX && r[5] >= 0;
    case R_WAIT:
        return r[1] >= 0 && r[1] < i && COMM_OK(r[5]) && r[4] >= 0;
    case R_COMBINE:
        return r[2] >= 0 && r[2] < HR_NDTYPES && r[1] >= 0 && r[1] < HR_NOPS && !combine_off[r[2]][r[1]] &&
               BUF_OK(r[3]) && BUF_OK(r[5]) && BUF_OK(r[7]) && r[9] >= 0 &&
               !((r[2] == HR_C64 || r[2] == HR_C128) && (r[1] == HR_MAX || r[1] == HR_MIN));
    case R_COPY:
        return BUF_OK(r[1]) && BUF_OK(r[3]) && r[5] >= 0;
    case R_NARROW:
        return BUF_OK(r[1]) && BUF_OK(r[3]) && (r[6] == HR_F32 || r[6] == HR_F64) &&
               (r[7] == HR_BF16 || r[7] == HR_F16);
    case R_WIDEN:
        return BUF_OK(r[1]) && BUF_OK(r[3]) && (r[7] == HR_F32 || r[7] == HR_F64) &&
               (r[6] == HR_BF16 || r[6] == HR_F16);
    case R_ROUND:
        return BUF_OK(r[1]) && (r[4] == HR_F32 || r[4] == HR_F64) && (r[5] == HR_BF16 || r[5] == HR_F16) &&
               (r[6] < 0 || BUF_OK(r[6]));
    case R_STEP:
        return 1;
    case R_CODES:
        return BUF_OK(r[1]) && (r[3] < 0 || BUF_OK(r[3])) && BUF_OK(r[5]) && r[7] >= 0 && FLOAT_OK(r[8]);
    case R_ENCODE:
        return BUF_OK(r[1]) && BUF_OK(r[3]) && (r[5] < 0 || BUF_OK(r[5])) && BUF_OK(r[7]) && r[9] >= 0 &&
               FLOAT_OK(r[10]) && (r[11] == 0 || r[11] == 1);
    case R_DECODE:
        return BUF_OK(r[1]) && (r[3] < 0 || BUF_OK(r[3])) && BUF_OK(r[5]) && BUF_OK(r[7]) && r[9] >= 0 &&
               FLOAT_OK(r[10] & 0xff) && r[11] >= 1 && r[11] <= ((int64_t)1 << 53);
    case R_GATHER: {
        hr_format f;
        return BUF_OK(r[1]) && BUF_OK(r[3]) && BUF_OK(r[7]) && r[9] >= 0 && r[5] >= r[9] && r[6] >= 1 &&
               r[6] < HR_GATHER_MOST && FLOAT_OK(r[10]) && hr_format_of((int)r[10], &f) == 0 &&
               r[11] >= 1 && r[11] <= ((int64_t)1 << 53);
    }
    case R_WIDEN_ADD: {
        int64_t wire = r[8] & 0xff, wide = r[8] >> 8;
        return BUF_OK(r[1]) && BUF_OK(r[3]) && BUF_OK(r[5]) && r[7] >= 0 && (wire == HR_BF16 || wire == HR_F16) &&
               (wide == HR_F32 || wide == HR_F64) && r[9] >= 0 && r[9] <= 15 && (r[10] < 0 || BUF_OK(r[10])) &&
               (!(r[9] & (HR_WIDE_NARROW | HR_WIDE_ONLY)) || r[10] >= 0);
    }
    case R_COLLECTIVE: {
        int which = (int)r[1];
        if (!COMM_OK(r[2]) || r[8] < 0 || r[8] > INT32_MAX || r[9] < 0 || r[9] >= HR_NDTYPES) return 0;
        if (r[4] >= 0 && !BUF_OK(r[4])) return 0;
        if (r[6] >= 0 && !BUF_OK(r[6])) return 0;
        if ((which == C_ALLREDUCE || which == C_REDUCE_SCATTER) &&
            (mpi_type((int)r[9]) == MPI_DATATYPE_NULL || r[10] < 0 || r[10] >= HR_NOPS))
            return 0;
        if (which == C_REDUCE_SCATTER && (r[11] < 0 || r[11] >= p->ncounts)) return 0;
        if (which == C_ALLTOALL && (r[4] < 0 || r[6] < 0)) return 0; /* no MPI_IN_PLACE here */
        return which >= C_ALLREDUCE && which <= C_ALLTOALL;
    }
    default:
        return 0;
    }
#undef BUF_OK
#undef COMM_OK
#undef FLOAT_OK
}

PyDoc_STRVAR(program_doc, "Program(rows, buffers, channels, counts, sent, unknown, src_nbytes, dst_nbytes, align)\n\n"
                          "A step table (hpcring/program.py) to run on a call's buffers: rows an (n, 12) int64 array; "
                          "buffers (kind, comm, name, nbytes) each (kind 0 the input, 1 the output, 2 scratch); "
                          "channels the real channels by comm number; counts int32 (reduce-scatter counts); sent "
                          "the bytes one run hands to MPI; align: the alignment buffers 0 and 1 need.");

/* A C-contiguous buffer of ``obj`` whose items are ``itemsize`` bytes, copied into memory of
 * its own (*dst, freed with PyMem_Free), its length a multiple of ``unit`` bytes; *n the number
 * of units. 0 with an exception set (``refused`` the ValueError's text) where it is not. */
static int copy_buffer(PyObject *obj, Py_ssize_t itemsize, Py_ssize_t unit, const char *refused, void **dst,
                       Py_ssize_t *n) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return 0;
    int ok = view.itemsize == itemsize && view.len % unit == 0;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "Program: %s", refused);
    } else if ((*dst = PyMem_Malloc(view.len ? view.len : itemsize)) == NULL) {
        PyErr_NoMemory();
        ok = 0;
    } else {
        memcpy(*dst, view.buf, view.len);
        *n = view.len / unit;
    }
    PyBuffer_Release(&view);
    return ok;
}

static PyObject *program_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *rows, *buffers, *channels, *counts;
    long long sent;
    int unknown, align;
    Py_ssize_t src_nbytes, dst_nbytes;
    if (!PyArg_ParseTuple(args, "OO!O!OLpnni", &rows, &PyList_Type, &buffers, &PyTuple_Type, &channels, &counts,
                          &sent, &unknown, &src_nbytes, &dst_nbytes, &align))
        return NULL;
    Program *p = (Program *)type->tp_alloc(type, 0);
    if (p == NULL) return NULL;
    if (!copy_buffer(rows, 8, 8 * HR_WIDTH, "rows must be an (n, 12) int64 array", (void **)&p->rows, &p->nrows))
        goto fail;
    if (!copy_buffer(counts, 4, 4, "counts must be int32", (void **)&p->counts, &p->ncounts)) goto fail;

    p->ncomm = (int)PyTuple_GET_SIZE(channels);
    Py_INCREF(channels);
    p->channels = channels;
    p->comms = PyMem_Calloc(p->ncomm ? p->ncomm : 1, sizeof(MPI_Comm));
    p->tables = PyMem_Calloc(p->ncomm ? p->ncomm : 1, sizeof(PyObject *));
    p->req = PyMem_Malloc((p->nrows ? p->nrows : 1) * sizeof(MPI_Request));
    if (!p->comms || !p->tables || !p->req) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < p->nrows; i++) p->req[i] = MPI_REQUEST_NULL;
    for (int c = 0; c < p->ncomm; c++) {
        PyObject *ch = PyTuple_GET_ITEM(channels, c);
        PyObject *comm = PyObject_GetAttrString(ch, "comm");
        if (comm == NULL) goto fail;
        MPI_Comm *handle = PyMPIComm_Get(comm);
        Py_DECREF(comm);
        if (handle == NULL) goto fail;
        p->comms[c] = *handle;
        p->tables[c] = PyObject_CallMethod(ch, "scratch_table", NULL);
        if (p->tables[c] == NULL) goto fail;
        if (!PyDict_Check(p->tables[c])) {
            PyErr_SetString(PyExc_TypeError, "Program: a channel's scratch_table() must be a dict");
            goto fail;
        }
    }
    if (MPI_Comm_size(p->comms[0], &p->size) != MPI_SUCCESS) {
        PyErr_SetString(PyExc_RuntimeError, "Program: MPI_Comm_size failed");
        goto fail;
    }
    p->nbuf = (int)PyList_GET_SIZE(buffers);
    p->bufs = PyMem_Calloc(p->nbuf ? p->nbuf : 1, sizeof(hr_buffer));
    if (p->bufs == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (int b = 0; b < p->nbuf; b++) {
        hr_buffer *buf = &p->bufs[b];
        PyObject *name;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(buffers, b), "iiUn", &buf->kind, &buf->comm, &name, &buf->nbytes))
            goto fail;
        Py_INCREF(name);
        buf->name = name;
        if (buf->kind < B_SRC || buf->kind > B_SCRATCH || buf->comm < 0 || buf->comm >= p->ncomm || buf->nbytes < 0) {
            PyErr_SetString(PyExc_ValueError, "Program: a buffer's kind, comm or size is out of range");
            goto fail;
        }
    }
    p->sent = sent;
    p->unknown = unknown;
    p->src_nbytes = src_nbytes;
    p->dst_nbytes = dst_nbytes;
    p->align = align < 1 ? 1 : align;
    for (Py_ssize_t i = 0; i < p->nrows; i++) {
        if (!row_check(p, p->rows + i * HR_WIDTH, i)) {
            PyErr_Format(PyExc_ValueError, "Program: row %zd (kind %lld) is not one this core runs", i,
                         (long long)p->rows[i * HR_WIDTH]);
            goto fail;
        }
    }
    return (PyObject *)p;
fail:
    Py_DECREF(p);
    return NULL;
}

/* The scratch buffers' memory now (a channel may have grown one since): 0, or -1 with an error. */
static int resolve(Program *p) {
    for (int b = 0; b < p->nbuf; b++) {
        hr_buffer *buf = &p->bufs[b];
        if (buf->kind != B_SCRATCH) continue;
        PyObject *table = p->tables[buf->comm];
        PyObject *now_held = PyDict_GetItemWithError(table, buf->name);
        if (now_held == NULL && PyErr_Occurred()) return -1;
        if (now_held != NULL && now_held == buf->held) continue;
        /* first run, or grown or dropped since: the channel makes (or returns) it, at least this big */
        PyObject *ch = PyTuple_GET_ITEM(p->channels, buf->comm);
        PyObject *u8 = PyUnicode_FromString("uint8");
        if (u8 == NULL) return -1;
        PyObject *dtype = NULL, *np = PyImport_ImportModule("numpy");
        if (np != NULL) dtype = PyObject_CallMethod(np, "dtype", "O", u8);
        Py_XDECREF(np);
        Py_DECREF(u8);
        if (dtype == NULL) return -1;
        PyObject *made = PyObject_CallMethod(ch, "scratch", "OnO", buf->name, buf->nbytes, dtype);
        Py_DECREF(dtype);
        if (made == NULL) return -1;
        Py_DECREF(made);
        now_held = PyDict_GetItemWithError(table, buf->name);
        if (now_held == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "Program: the channel kept no scratch");
            return -1;
        }
        char *data;
        Py_ssize_t nbytes;
        if (array_bytes(now_held, 1, &data, &nbytes) < 0 || nbytes < buf->nbytes) {
            PyErr_SetString(PyExc_RuntimeError, "Program: a scratch buffer is not a writable host array");
            return -1;
        }
        Py_INCREF(now_held);
        Py_XSETREF(buf->held, now_held);
        buf->data = data;
    }
    return 0;
}

/* ``obj`` kept for good (hpcring.polling.abandon's reason: MPI may still use it after a stall); the
 * pending exception stays as it is. */
static void keep(PyObject *obj) {
    hr_exc exc = exc_take();
    if (abandoned != NULL) PyList_Append(abandoned, obj);
    PyErr_Clear();
    exc_put(exc);
}

/* Keep what a failed run's requests may still read or write, for good (hpcring.polling.abandon's
 * reason: MPI may still use a buffer after a stall), and forget the requests themselves. */
static void program_abandon(Program *p, PyObject *src, PyObject *dst) {
    int pending = 0;
    for (Py_ssize_t i = 0; i < p->nrows; i++) {
        if (p->req[i] != MPI_REQUEST_NULL) pending = 1;
        p->req[i] = MPI_REQUEST_NULL;
    }
    if (!pending || abandoned == NULL) return;
    hr_exc exc = exc_take();
    if (src) PyList_Append(abandoned, src);
    if (dst) PyList_Append(abandoned, dst);
    for (int b = 0; b < p->nbuf; b++)
        if (p->bufs[b].held) PyList_Append(abandoned, p->bufs[b].held);
    PyErr_Clear();
    exc_put(exc);
}

static int set_attr(PyObject *obj, PyObject *name, PyObject *value) { return PyObject_SetAttr(obj, name, value); }

/* A wait past SPIN_SECONDS: Python's bounded wait on the channel (GIL held). 0 done, -1 raised. */
static int slow_wait(Program *p, const int64_t *r, int step, PyObject *timeout) {
    PyObject *ch = PyTuple_GET_ITEM(p->channels, r[5]);
    PyObject *main = PyTuple_GET_ITEM(p->channels, 0);
    PyObject *stepped = PyLong_FromLong(step);
    if (stepped == NULL || set_attr(main, s_step, stepped) < 0 || set_attr(ch, s_timeout, timeout) < 0) {
        Py_XDECREF(stepped);
        return -1;
    }
    Py_DECREF(stepped);
    PyObject *request = PyMPIRequest_New(p->req[r[1]]);
    if (request == NULL) return -1;
    PyObject *done;
    if (r[4] > 0) {
        done = PyObject_CallMethod(ch, "wait", "Od", request, 1e-9 * (double)r[4]);
    } else {
        done = PyObject_CallMethod(ch, "finish", "OlO", request, (long)r[2], r[3] ? Py_True : Py_False);
    }
    if (done == NULL) {
        keep(request); /* its twin here may still be pending */
        Py_DECREF(request);
        return -1;
    }
    Py_DECREF(done);
    Py_DECREF(request);
    p->req[r[1]] = MPI_REQUEST_NULL; /* its Python twin completed it */
    return 0;
}

static int collective(Program *p, const int64_t *r, char **base, MPI_Request *req) {
    MPI_Comm comm = p->comms[r[2]];
    int root = (int)r[3], count = (int)r[8], dtype = (int)r[9];
    void *send = r[4] < 0 ? MPI_IN_PLACE : base[r[4]] + r[5];
    void *recv = r[6] < 0 ? NULL : base[r[6]] + r[7];
    int bytes = count * hr_itemsize[dtype];
    switch (r[1]) {
    case C_ALLREDUCE: return MPI_Allreduce(send, recv, count, mpi_type(dtype), mpi_op((int)r[10]), comm);
    case C_REDUCE_SCATTER:
        return MPI_Reduce_scatter(send, recv, p->counts + r[11], mpi_type(dtype), mpi_op((int)r[10]), comm);
    case C_ALLGATHER: return MPI_Allgather(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, comm);
    case C_BCAST: return MPI_Bcast(recv, bytes, MPI_BYTE, root, comm);
    case C_IGATHER:
        if (r[4] < 0) return MPI_Igather(MPI_IN_PLACE, 0, MPI_BYTE, recv, bytes, MPI_BYTE, root, comm, req);
        return MPI_Igather(send, bytes, MPI_BYTE, NULL, 0, MPI_BYTE, root, comm, req);
    case C_IBCAST: return MPI_Ibcast(recv, bytes, MPI_BYTE, root, comm, req);
    case C_ALLTOALL: return MPI_Alltoall(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, comm);
    }
    return MPI_ERR_OTHER;
}

/* Add to a __slots__ or plain attribute holding an int (the channel's traffic counter). */
static int add_to(PyObject *obj, PyObject *name, long long value) {
    PyObject *old = PyObject_GetAttr(obj, name);
    if (old == NULL) return -1;
    PyObject *add = PyLong_FromLongLong(value);
    PyObject *sum = add ? PyNumber_Add(old, add) : NULL;
    Py_DECREF(old);
    Py_XDECREF(add);
    if (sum == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return rc;
}

#define AT(b, o) ((b) < 0 ? NULL : base[b] + (o))

/* The rows that convert (hpcring/exact.py's codes, encode, decode) and the wire's widening sum. */
static void exact_row(const int64_t *r, char **base) {
    hr_format f;
    switch (r[0]) {
    case R_CODES:
        hr_format_of((int)r[8], &f);
        hr_codes((int)r[8], &f, AT(r[1], r[2]), AT(r[3], r[4]), AT(r[5], r[6]), (size_t)r[7]);
        break;
    case R_ENCODE:
        hr_format_of((int)r[10], &f);
        hr_encode((int)r[10], &f, AT(r[1], r[2]), AT(r[3], r[4]), (const int64_t *)AT(r[5], r[6]),
                  (int64_t *)AT(r[7], r[8]), (size_t)r[9], (int)r[11]);
        break;
    case R_DECODE: {
        int dtype = (int)(r[10] & 0xff), floats = (int)(r[10] >> 8 & 1);
        int64_t terms = (r[10] >> 16) - 1;
        const int64_t *words = (const int64_t *)AT(r[1], r[2]);
        const void *mine = AT(r[3], r[4]);
        hr_format_of(dtype, &f);
        int mode = hr_decode_mode(&f, mine ? NULL : words, (size_t)r[9], terms, floats);
        hr_decode(dtype, &f, words, mine, AT(r[5], r[6]), AT(r[7], r[8]), (size_t)r[9], r[11], mode);
        break;
    }
    case R_GATHER:
        hr_format_of((int)r[10], &f);
        hr_gather((int)r[10], &f, AT(r[1], r[2]), AT(r[3], r[4]), (size_t)r[5], (int)r[6], AT(r[7], r[8]),
                  (size_t)r[9], r[11]);
        break;
    case R_WIDEN_ADD:
        hr_widen_add((int)(r[8] & 0xff), (int)(r[8] >> 8), AT(r[1], r[2]), AT(r[3], r[4]), AT(r[5], r[6]), (size_t)r[7],
                     (int)r[9], (uint16_t *)AT(r[10], r[11]));
        break;
    }
}

#undef AT

/* Run the rows on buffers 0 and 1 at ``src`` and ``dst``: 1 done, -1 raised (GIL held on entry
 * and exit). ``timeout`` is what the channels' bounded waits take (None: no limit). */
static int program_exec(Program *p, char *src, char *dst, PyObject *src_obj, PyObject *dst_obj, PyObject *timeout) {
    if (p->busy) {
        PyErr_SetString(PyExc_RuntimeError, "hpcring: a compiled program was re-entered");
        return -1;
    }
    if (resolve(p) < 0) return -1;
    char *stack_base[16];
    char **base = p->nbuf <= 16 ? stack_base : PyMem_Malloc(p->nbuf * sizeof(char *));
    if (base == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int b = 0; b < p->nbuf; b++)
        base[b] = p->bufs[b].kind == B_SRC ? src : p->bufs[b].kind == B_DST ? dst : p->bufs[b].data;
    p->busy = 1;
    int rc = MPI_SUCCESS, step = 0, failed = 0;
    PyThreadState *ts = PyEval_SaveThread();
    for (Py_ssize_t i = 0; i < p->nrows && rc == MPI_SUCCESS; i++) {
        const int64_t *r = p->rows + i * HR_WIDTH;
        switch (r[0]) {
        case R_SEND:
            rc = MPI_Isend(base[r[4]] + r[5], (int)r[6], MPI_BYTE, (int)r[2], (int)r[3], p->comms[r[1]], &p->req[i]);
            break;
        case R_RECV:
            rc = MPI_Irecv(base[r[4]] + r[5], (int)r[6], MPI_BYTE, (int)r[2], (int)r[3], p->comms[r[1]], &p->req[i]);
            break;
        case R_WAIT:
            if (!spin(&p->req[r[1]], SPIN_SECONDS, (long)r[4], &rc) && rc == MPI_SUCCESS) {
                PyEval_RestoreThread(ts);
                failed = slow_wait(p, r, step, timeout) < 0;
                ts = PyEval_SaveThread();
                if (failed) i = p->nrows; /* leave the loop */
            }
            break;
        case R_COMBINE:
            hr_combine((int)r[2], (int)r[1], base[r[3]] + r[4], base[r[5]] + r[6], base[r[7]] + r[8], (size_t)r[9],
                       &quirks);
            break;
        case R_COPY:
            memmove(base[r[1]] + r[2], base[r[3]] + r[4], (size_t)r[5]);
            break;
        case R_NARROW:
            hr_narrow((int)r[6], (int)r[7], base[r[1]] + r[2], base[r[3]] + r[4], (size_t)r[5], 0);
            break;
        case R_WIDEN:
            hr_widen((int)r[6], (int)r[7], base[r[1]] + r[2], base[r[3]] + r[4], (size_t)r[5]);
            break;
        case R_ROUND:
            if (r[6] < 0) hr_round_trip((int)r[4], (int)r[5], base[r[1]] + r[2], (size_t)r[3]);
            else hr_round_into((int)r[4], (int)r[5], base[r[1]] + r[2], (uint16_t *)(base[r[6]] + r[7]), (size_t)r[3]);
            break;
        case R_STEP:
            step = (int)r[1];
            break;
        case R_COLLECTIVE:
            rc = collective(p, r, base, &p->req[i]);
            break;
        default:
            exact_row(r, base);
            break;
        }
    }
    PyEval_RestoreThread(ts);
    p->busy = 0;
    if (base != stack_base) PyMem_Free(base);
    if (!failed && rc != MPI_SUCCESS) {
        mpi_error(rc);
        failed = 1;
    }
    if (failed) {
        hr_exc exc = exc_take();
        PyObject *stepped = PyLong_FromLong(step);
        if (stepped) {
            if (set_attr(PyTuple_GET_ITEM(p->channels, 0), s_step, stepped) < 0) PyErr_Clear();
            Py_DECREF(stepped);
        }
        PyErr_Clear();
        exc_put(exc);
        program_abandon(p, src_obj, dst_obj);
        return -1;
    }
    PyObject *traffic = PyObject_GetAttr(PyTuple_GET_ITEM(p->channels, 0), s_traffic);
    if (traffic == NULL) return -1;
    int bad = p->sent && add_to(traffic, s_sent, p->sent) < 0;
    if (!bad && p->unknown) bad = PyObject_SetAttr(traffic, s_unknown, Py_True) < 0;
    Py_DECREF(traffic);
    return bad ? -1 : 1;
}

/* Buffers 0 and 1 from the arrays a run is given: 0, or 1 where they are not this program's case. */
static int program_buffers(Program *p, PyObject *src, PyObject *dst, char **s, char **d) {
    Py_ssize_t sn, dn;
    if (array_bytes(src, 0, s, &sn) < 0 || array_bytes(dst, 1, d, &dn) < 0) return 1;
    if (sn != p->src_nbytes || (dst != src && dn != p->dst_nbytes)) return 1;
    if ((uintptr_t)*s % p->align || (uintptr_t)*d % p->align) return 1; /* misaligned: NumPy's */
    return 0;
}

PyDoc_STRVAR(run_doc, "run(src, dst, timeout) -> bool\n\nRun the rows on these flat host arrays (dst may be src); "
                      "False where they are not this program's case (then nothing ran). ``timeout``: seconds "
                      "each wait may take (None: no limit), as Channel.timeout.");

static PyObject *program_run(Program *p, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "run(src, dst, timeout) takes 3 arguments");
        return NULL;
    }
    char *s, *d;
    if (program_buffers(p, argv[0], argv[1], &s, &d)) Py_RETURN_FALSE;
    if (program_exec(p, s, d, argv[0], argv[1], argv[2]) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *program_get_rows(Program *p, void *closure) { return PyLong_FromSsize_t(p->nrows); }

static PyMethodDef program_methods[] = {
    {"run", (PyCFunction)(void (*)(void))program_run, METH_FASTCALL, run_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef program_getset[] = {
    {"rows", (getter)program_get_rows, NULL, "number of rows", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring._core.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = program_doc,
    .tp_new = program_new,
    .tp_dealloc = (destructor)program_dealloc,
    .tp_traverse = (traverseproc)program_traverse,
    .tp_clear = (inquiry)program_clear,
    .tp_methods = program_methods,
    .tp_getset = program_getset,
};

/* ---- Warm: one kind of NumPy call, run from the arguments to the result ------------------- */

typedef struct {
    PyObject *descr;
    descrsetfunc set;
    descrgetfunc get;
} hr_member; /* a __slots__ attribute, stored through its descriptor */

static hr_member m_seq, m_call, m_phase, m_start, m_number, m_end;

static int member(hr_member *m, PyObject *type, PyObject *name) {
    PyObject *d = PyObject_GetAttr(type, name);
    if (d == NULL) return -1;
    if (Py_TYPE(d)->tp_descr_set == NULL || Py_TYPE(d)->tp_descr_get == NULL) {
        Py_DECREF(d);
        PyErr_SetString(PyExc_TypeError, "setup: a flight record field is not a slot");
        return -1;
    }
    Py_XSETREF(m->descr, d);
    m->set = Py_TYPE(d)->tp_descr_set;
    m->get = Py_TYPE(d)->tp_descr_get;
    return 0;
}

static inline int store(hr_member *m, PyObject *obj, PyObject *value) { return m->set(m->descr, obj, value); }

static inline int store_float(hr_member *m, PyObject *obj, double value) {
    PyObject *v = PyFloat_FromDouble(value);
    if (v == NULL) return -1;
    int rc = m->set(m->descr, obj, v);
    Py_DECREF(v);
    return rc;
}

static inline int store_long(hr_member *m, PyObject *obj, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int rc = m->set(m->descr, obj, v);
    Py_DECREF(v);
    return rc;
}

typedef struct {
    PyObject_HEAD
    /* the key: what engine.call's warm lookup compares */
    PyObject *collective, *op, *algorithm, *root, *reproducible, *wire, *dtype;
    int out_none, ndim;
    Py_ssize_t shape[8];
    Py_ssize_t itemsize;
    /* what a run needs */
    PyObject *call;     /* the engine's Call: the flight slot's call, and the slow paths' methods */
    PyObject *state;    /* CommState: its calls counter */
    PyObject *flight;   /* flight.Recorder */
    PyObject *slots;    /* its slots (a list of SLOTS) */
    Py_ssize_t mask;
    PyObject *acquire, *release; /* the communicator's exclusion (bound methods) */
    PyObject *channel;  /* the call's channel: its timeout, as the watchdog reads it */
    PyObject *timeout;  /* the communicator's HPCRING_TIMEOUT (None: read it in Python) */
    MPI_Comm agree_comm;
    int64_t *words;     /* the row (Row.words()) */
    int nwords;
    int64_t *agree;     /* the agreement's buffer: the header and the slot */
    int64_t *agree_in;  /* exchanging ranks: the other's contribution, in ``inbox``'s memory */
    char *agree_work;   /* exchanging ranks past two: the payload combined so far (``nbytes``) */
    PyObject *inbox;    /* that buffer: the communicator's (hpcring.agreement.Agreement.inbox), shared */
    int size, rank;
    int single;         /* MPI allows the main thread only */
    int returns_x;
    int blocking;       /* the program is one blocking library call: the watchdog reads the channel's timeout */
    int mean;           /* op mean: the dtype code to divide (float32, float64), else -1 */
    int fused;          /* a checked call's data rides with the agreement (agree.h) */
    int exch;           /* its ranks exchange messages (the communicator's Agreement.exchanging) */
    int64_t payload[3]; /* its dtype, op and count (the kernels' codes) */
    Py_ssize_t nbytes;  /* the array's bytes */
    Program *program;   /* the data movement; NULL where a persistent request moves it (a plan) */
    PyObject *prequest; /* that request (mpi4py's Prequest, on the plan's buffers), or a pair's or steps' tuple */
    char *pair_scratch; /* a two-rank plan: where the other's input comes (``prequest`` is the tuple) */
    int pair_halves;    /* ... that exchanges halves, then the results (hpcring.persistent.Pair's halves) */
    PyObject *pair_second; /* ... whose second exchange is this (receive, send) tuple, for plan_waited */
    int stepped;        /* a plan of 3 or 4 ranks (hpcring.persistent.Steps): the exchange's steps, no header;
                           ``pair_scratch`` is where each step's contribution comes */
    int steps_tag;      /* ... and the tag of its messages */
    PyObject *allocate; /* an all-to-all's (hpcring.exchange): numpy.empty_like, the output where no
                           out= is given; NULL for every other collective */
    int ahead;          /* an all-to-all's blocks leave ahead of the agreement (hpcring.exchange.send_ahead) */
    int nahead;         /* this call's sends of them, outstanding in ``ahead_req`` */
    MPI_Request *ahead_req; /* those sends, then the blocks' receives (2 (size - 1)) */
    /* a reduce-scatter's or an all-gather's (``layout``): its result is not x's shape */
    int form;              /* F_SAME (the result has x's shape), F_REDUCE_SCATTER, F_ALLGATHER */
    int in_place;          /* its call ran in place: out is x's own part, or x is out's row */
    Py_ssize_t out_nbytes; /* the result's bytes (x's, for F_SAME) */
    Py_ssize_t part;       /* where x's own part starts in x (reduce-scatter), x's row in out (all-gather) */
    PyObject *schedules;   /* auto: its channel's schedules (engine._chosen reads them), else NULL */
    PyObject *choice_key;  /* auto's key there for this call's size */
    PyObject *choice;      /* what this call runs: it is warm while the channel still holds that choice */
    PyObject *touch;       /* schedules.move_to_end: a look-up is a use of it, as Channel.cached makes it */
} Warm;

enum { F_SAME, F_REDUCE_SCATTER, F_ALLGATHER };

/* The objects a Warm holds, for the garbage collector: a Warm and its engine Call hold each other
 * (Call.fast, Call.agreers; Warm's ``call``), and that cycle, with the channel and the flight record
 * it reaches, must go when the communicator does. */
#define WARM_OBJECTS(X)                                                                                     \
    X(collective) X(op) X(algorithm) X(root) X(reproducible) X(wire) X(dtype) X(call) X(state) X(flight)     \
        X(slots) X(acquire) X(release) X(channel) X(timeout) X(prequest) X(pair_second) X(allocate) X(inbox) \
            X(schedules) X(choice_key) X(choice) X(touch)

static int warm_traverse(Warm *w, visitproc visit, void *arg) {
#define VISIT(f) Py_VISIT(w->f);
    WARM_OBJECTS(VISIT)
#undef VISIT
    Py_VISIT((PyObject *)w->program);
    return 0;
}

static int warm_clear(Warm *w) {
#define CLEAR(f) Py_CLEAR(w->f);
    WARM_OBJECTS(CLEAR)
#undef CLEAR
    Py_CLEAR(w->program);
    return 0;
}

static void warm_dealloc(Warm *w) {
    PyObject_GC_UnTrack(w);
    Py_XDECREF(w->collective);
    Py_XDECREF(w->op);
    Py_XDECREF(w->algorithm);
    Py_XDECREF(w->root);
    Py_XDECREF(w->reproducible);
    Py_XDECREF(w->wire);
    Py_XDECREF(w->dtype);
    Py_XDECREF(w->call);
    Py_XDECREF(w->state);
    Py_XDECREF(w->flight);
    Py_XDECREF(w->slots);
    Py_XDECREF(w->acquire);
    Py_XDECREF(w->release);
    Py_XDECREF(w->channel);
    Py_XDECREF(w->timeout);
    Py_XDECREF((PyObject *)w->program);
    Py_XDECREF(w->prequest);
    Py_XDECREF(w->pair_second);
    Py_XDECREF(w->allocate);
    PyMem_Free(w->words);
    PyMem_Free(w->agree);
    PyMem_Free(w->agree_work);
    PyMem_Free(w->ahead_req);
    Py_XDECREF(w->inbox);
    Py_XDECREF(w->schedules);
    Py_XDECREF(w->choice_key);
    Py_XDECREF(w->choice);
    Py_XDECREF(w->touch);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

PyDoc_STRVAR(warm_doc, "Warm(call, key, shape, itemsize, state, flight, busy, channel, timeout, comm, words, single, "
                       "returns_x, blocking, mean, payload, program[, allocate[, ahead[, layout]]])\n\n"
                       "A reduce-scatter's or an all-gather's has ``layout``: (form (1 reduce-scatter, 2 all-gather), "
                       "the result's bytes, x's own part's byte offset in x or x's row's in out, in place, auto's "
                       "(schedules, key, choice) or None), and ``allocate`` where no out= is given: called with x, it "
                       "makes the result.\n\nAn all-to-all's "
                       "(hpcring.exchange, found by `exchange_caller`) has ``allocate``: numpy.empty_like, called where "
                       "no out= is given (its x is only read), and ``ahead``: its blocks leave ahead of the agreement "
                       "(hpcring.exchange.send_ahead).\n\nA plan's run has a persistent request instead "
                       "of a program (program=mpi4py's Prequest on the plan's buffers: started, then waited for).\n\n"
                       "One kind of NumPy call, run in C: ``key`` (collective, op, algorithm, root, reproducible, "
                       "wire, out is None, dtype) and ``shape`` what engine.call's warm key compares; the rest what a "
                       "run stores, takes and calls (hpcring.engine.Call.compiled_warm builds it).");

/* A halved two-rank plan's part of this rank, in bytes (hpcring.persistent.Pair.parts): rank 0
 * the first half of the elements, rank 1 the rest. */
static void pair_half(const Warm *w, Py_ssize_t *at, Py_ssize_t *bytes) {
    Py_ssize_t item = hr_itemsize[w->payload[0]], half = w->nbytes / item / 2 * item;
    *at = w->rank == 0 ? 0 : half;
    *bytes = w->rank == 0 ? half : w->nbytes - half;
}

static PyObject *warm_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *call, *key, *shape, *state, *flight, *busy, *channel, *timeout, *comm, *words, *program;
    PyObject *allocate = NULL, *layout = NULL;
    Py_ssize_t itemsize;
    int single, returns_x, blocking, mean, ahead = 0;
    long long pdtype, pop, pcount;
    if (!PyArg_ParseTuple(args, "OO!O!nOOOOOOO!pppi(LLL)O|OpO", &call, &PyTuple_Type, &key, &PyTuple_Type, &shape,
                          &itemsize, &state, &flight, &busy, &channel, &timeout, &comm, &PyTuple_Type, &words, &single,
                          &returns_x, &blocking, &mean, &pdtype, &pop, &pcount, &program, &allocate, &ahead, &layout))
        return NULL;
    if (allocate == Py_None) allocate = NULL;
    if (layout == Py_None) layout = NULL;
    /* a reduce-scatter's or an all-gather's result: (form, bytes, part, in place, auto's choice or None) */
    int form = F_SAME, in_place = 0;
    Py_ssize_t out_nbytes = 0, part = 0;
    PyObject *chosen = Py_None;
    if (layout != NULL) {
        if (!PyArg_ParseTuple(layout, "innpO", &form, &out_nbytes, &part, &in_place, &chosen)) return NULL;
        if ((form != F_REDUCE_SCATTER && form != F_ALLGATHER) || out_nbytes < 0 || part < 0 || returns_x ||
            pdtype >= 0 || ahead || Py_TYPE(program) != &ProgramType || (mean >= 0 && form != F_REDUCE_SCATTER) ||
            (in_place && allocate != NULL) ||
            (chosen != Py_None && (!PyTuple_Check(chosen) || PyTuple_GET_SIZE(chosen) != 3 ||
                                   !PyDict_Check(PyTuple_GET_ITEM(chosen, 0))))) {
            PyErr_SetString(PyExc_ValueError, "Warm: a layout is a reduce-scatter's or an all-gather's: out of place "
                                              "or in place as it says, no payload, a program, a mean only where "
                                              "it reduces, auto's choice as (schedules, key, choice)");
            return NULL;
        }
    }
    if (ahead && (allocate == NULL || layout != NULL)) {
        PyErr_SetString(PyExc_ValueError, "Warm: ahead is an all-to-all's");
        return NULL;
    }
    if (allocate != NULL &&
        (!PyCallable_Check(allocate) || returns_x || (mean >= 0 && layout == NULL) || pdtype >= 0)) {
        PyErr_SetString(PyExc_ValueError, "Warm: allocate is an all-to-all's, a reduce-scatter's or an all-gather's: "
                                          "a callable, out of place, no payload");
        return NULL;
    }
    /* the agreement alone (the Python path's calls: its ``agree``), no data movement */
    int agree_only = program == Py_None;
    if (agree_only && (allocate != NULL || layout != NULL || ahead || mean >= 0 || returns_x)) {
        PyErr_SetString(PyExc_ValueError, "Warm: an agreement alone has no allocate, layout, ahead, mean or result");
        return NULL;
    }
    int persistent = !agree_only && Py_TYPE(program) != &ProgramType;
    /* a two-rank plan (hpcring.persistent.Pair): (receive, send, scratch), the op applied here;
     * halved, then the results' (receive, send) */
    int paired = PyTuple_Check(program) && (PyTuple_GET_SIZE(program) == 3 || PyTuple_GET_SIZE(program) == 5);
    int halves = paired && PyTuple_GET_SIZE(program) == 5;
    char *pair_scratch = NULL;
    Py_ssize_t pair_bytes = 0;
    if (paired && (!PyObject_TypeCheck(PyTuple_GET_ITEM(program, 0), &PyMPIRequest_Type) ||
                   !PyObject_TypeCheck(PyTuple_GET_ITEM(program, 1), &PyMPIRequest_Type) ||
                   (halves && (!PyObject_TypeCheck(PyTuple_GET_ITEM(program, 3), &PyMPIRequest_Type) ||
                               !PyObject_TypeCheck(PyTuple_GET_ITEM(program, 4), &PyMPIRequest_Type))) ||
                   array_bytes(PyTuple_GET_ITEM(program, 2), 1, &pair_scratch, &pair_bytes) < 0 || pdtype < 0)) {
        PyErr_SetString(PyExc_TypeError,
                        "Warm: a pair's program is (receive, send, scratch[, receive, send]) of a payload's call");
        return NULL;
    }
    /* a plan of 3 or 4 ranks (hpcring.persistent.Steps): (scratch, tag), the op applied here */
    int stepped = PyTuple_Check(program) && PyTuple_GET_SIZE(program) == 2;
    char *steps_scratch = NULL;
    Py_ssize_t steps_bytes = 0;
    long steps_tag = -1;
    if (stepped && (array_bytes(PyTuple_GET_ITEM(program, 0), 1, &steps_scratch, &steps_bytes) < 0 ||
                    (steps_tag = PyLong_AsLong(PyTuple_GET_ITEM(program, 1))) < 0 || steps_tag > INT_MAX ||
                    pdtype < 0)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "Warm: a stepped plan's program is (scratch, tag) of a payload's call");
        return NULL;
    }
    int shared = Py_TYPE(program) == &SharedType; /* a plan through shared memory (shared.h) */
    if (persistent && !paired && !stepped && !agree_only && !shared &&
        (!PyObject_TypeCheck(program, &PyMPIRequest_Type) || PyMPIRequest_Get(program) == NULL)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "Warm: program must be a Program, a persistent MPI request or a Shared");
        return NULL;
    }
    int fused = pdtype >= 0;
    if (agree_op == MPI_OP_NULL || PyTuple_GET_SIZE(words) + 2 + HR_PAYLOAD_COLUMNS != agree_width) {
        PyErr_SetString(PyExc_ValueError, "Warm: the agreement's collective is not made for rows of this width");
        return NULL;
    }
    if (mean >= 0 && mean != HR_F32 && mean != HR_F64) {
        PyErr_SetString(PyExc_ValueError, "Warm: mean divides float32 and float64 only");
        return NULL;
    }
    if (PyTuple_GET_SIZE(key) != 8 || PyTuple_GET_SIZE(shape) > 8) {
        PyErr_SetString(PyExc_ValueError, "Warm: key of 8, shape of at most 8");
        return NULL;
    }
    Warm *w = (Warm *)type->tp_alloc(type, 0);
    if (w == NULL) return NULL;
    PyObject **fields[] = {&w->collective, &w->op, &w->algorithm, &w->root, &w->reproducible, &w->wire};
    for (int k = 0; k < 6; k++) {
        *fields[k] = PyTuple_GET_ITEM(key, k);
        Py_INCREF(*fields[k]);
    }
    w->out_none = PyObject_IsTrue(PyTuple_GET_ITEM(key, 6));
    w->dtype = PyTuple_GET_ITEM(key, 7);
    Py_INCREF(w->dtype);
    w->ndim = (int)PyTuple_GET_SIZE(shape);
    for (int d = 0; d < w->ndim; d++) {
        w->shape[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (w->shape[d] == -1 && PyErr_Occurred()) goto fail;
    }
    w->itemsize = itemsize;
    w->nbytes = itemsize;
    for (int d = 0; d < w->ndim; d++) w->nbytes *= w->shape[d];
    w->fused = fused;
    w->payload[0] = pdtype;
    w->payload[1] = pop;
    w->payload[2] = pcount;
    Py_INCREF(call);
    w->call = call;
    Py_INCREF(state);
    w->state = state;
    Py_INCREF(flight);
    w->flight = flight;
    Py_INCREF(channel);
    w->channel = channel;
    Py_INCREF(timeout);
    w->timeout = timeout;
    w->slots = PyObject_GetAttrString(flight, "slots");
    if (w->slots == NULL) goto fail;
    if (!PyList_Check(w->slots) || PyList_GET_SIZE(w->slots) < 1 ||
        (PyList_GET_SIZE(w->slots) & (PyList_GET_SIZE(w->slots) - 1))) {
        PyErr_SetString(PyExc_ValueError, "Warm: the flight record's slots must be a list of 2^k");
        goto fail;
    }
    w->mask = PyList_GET_SIZE(w->slots) - 1;
    w->acquire = PyObject_GetAttrString(busy, "acquire");
    w->release = PyObject_GetAttrString(busy, "release");
    if (w->acquire == NULL || w->release == NULL) goto fail;
    MPI_Comm *handle = PyMPIComm_Get(comm);
    if (handle == NULL) goto fail;
    w->agree_comm = *handle;
    if (MPI_Comm_size(w->agree_comm, &w->size) != MPI_SUCCESS || MPI_Comm_rank(w->agree_comm, &w->rank) != MPI_SUCCESS) {
        PyErr_SetString(PyExc_RuntimeError, "Warm: MPI_Comm_size or MPI_Comm_rank failed");
        goto fail;
    }
    PyObject *agreement = PyObject_GetAttrString(state, "agreement"); /* the communicator's road, as it took it */
    PyObject *exchanging = agreement ? PyObject_GetAttrString(agreement, "exchanging") : NULL;
    Py_XDECREF(agreement);
    if (exchanging == NULL) goto fail;
    w->exch = PyObject_IsTrue(exchanging);
    Py_DECREF(exchanging);
    if (w->exch < 0) goto fail;
    if (fused && (w->nbytes > (w->exch ? agree_pair_slot : agree_slot) || pcount * itemsize != w->nbytes ||
                  !hr_payload_ok((int)pdtype, (int)pop))) {
        PyErr_SetString(PyExc_ValueError, "Warm: a fused call's data must fit the agreement's slot");
        goto fail;
    }
    w->nwords = (int)PyTuple_GET_SIZE(words);
    w->words = PyMem_Malloc((w->nwords + 1) * sizeof(int64_t));
    if (w->words == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (int k = 0; k < w->nwords; k++) {
        w->words[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(words, k));
        if (w->words[k] == -1 && PyErr_Occurred()) goto fail;
    }
    w->single = single;
    w->returns_x = returns_x;
    w->blocking = blocking;
    w->mean = mean;
    if (!agree_only) {
        Py_INCREF(program);
        if (persistent) w->prequest = program;
        else w->program = (Program *)program;
    }
    Py_XINCREF(allocate);
    w->allocate = allocate;
    if (ahead && !w->exch) {
        PyErr_SetString(PyExc_ValueError, "Warm: blocks leave ahead only where the agreement exchanges messages");
        goto fail;
    }
    w->ahead = ahead;
    w->form = form;
    w->in_place = in_place;
    w->out_nbytes = layout != NULL ? out_nbytes : w->nbytes;
    w->part = part;
    /* the part (x's own part, x's row) lies inside the whole (x, out), and the program moves these bytes */
    Py_ssize_t whole = form == F_ALLGATHER ? out_nbytes : w->nbytes;
    Py_ssize_t piece = form == F_ALLGATHER ? w->nbytes : out_nbytes;
    if (layout != NULL && (w->program->src_nbytes != w->nbytes || w->program->dst_nbytes != out_nbytes ||
                           out_nbytes % (itemsize ? itemsize : 1) || part + piece > whole ||
                           (form == F_ALLGATHER && out_nbytes != w->nbytes * w->size))) {
        PyErr_SetString(PyExc_ValueError, "Warm: the layout's bytes are not its program's");
        goto fail;
    }
    if (chosen != Py_None) {
        w->schedules = Py_NewRef(PyTuple_GET_ITEM(chosen, 0));
        w->choice_key = Py_NewRef(PyTuple_GET_ITEM(chosen, 1));
        w->choice = Py_NewRef(PyTuple_GET_ITEM(chosen, 2));
        w->touch = PyObject_GetAttrString(w->schedules, "move_to_end");
        if (w->touch == NULL) goto fail;
    }
    Py_ssize_t half_at = 0, half_bytes = 0;
    if (paired && w->fused) pair_half(w, &half_at, &half_bytes);
    if (paired && (!w->fused || (halves ? !returns_x || pair_bytes != half_bytes : pair_bytes != w->nbytes))) {
        PyErr_SetString(PyExc_ValueError, "Warm: a pair's scratch must hold the call's bytes (halved: in place, "
                                          "this rank's half)");
        goto fail;
    }
    if (stepped && (!w->fused || steps_bytes != w->nbytes)) {
        PyErr_SetString(PyExc_ValueError, "Warm: a stepped plan's scratch must hold the call's bytes");
        goto fail;
    }
    w->pair_scratch = paired ? pair_scratch : stepped ? steps_scratch : NULL;
    w->stepped = stepped;
    w->steps_tag = (int)steps_tag;
    w->pair_halves = halves;
    if (halves && (w->pair_second = PyTuple_GetSlice(program, 3, 5)) == NULL) goto fail;
    return (PyObject *)w;
fail:
    Py_DECREF(w);
    return NULL;
}

static PyTypeObject WarmType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring._core.Warm",
    .tp_basicsize = sizeof(Warm),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = warm_doc,
    .tp_new = warm_new,
    .tp_dealloc = (destructor)warm_dealloc,
    .tp_traverse = (traverseproc)warm_traverse,
    .tp_clear = (inquiry)warm_clear,
    /* .tp_methods: warm_methods, set at module init (they come after the warm call) */
};

/* ---- Table: the warm calls of one user communicator --------------------------------------- */

typedef struct {
    PyObject_HEAD
    MPI_Comm comm; /* the user's communicator: what a call passes */
    int live;
    int n;
    Warm *entries[ENTRIES];
} Table;

static Table *tables[TABLES];
static int ntables;

static void table_clear_entries(Table *t) {
    for (int k = 0; k < t->n; k++) Py_CLEAR(t->entries[k]);
    t->n = 0;
}

static void table_unlist(Table *t) {
    for (int k = 0; k < ntables; k++) {
        if (tables[k] == t) {
            tables[k] = tables[--ntables];
            tables[ntables] = NULL;
            Py_DECREF(t);
            return;
        }
    }
}

static void table_dealloc(Table *t) {
    table_clear_entries(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *comm;
    if (!PyArg_ParseTuple(args, "O", &comm)) return NULL;
    MPI_Comm *handle = PyMPIComm_Get(comm);
    if (handle == NULL) return NULL;
    Table *t = (Table *)type->tp_alloc(type, 0);
    if (t == NULL) return NULL;
    t->comm = *handle;
    if (ntables < TABLES) { /* beyond that many communicators, their calls take the Python path */
        for (int k = 0; k < ntables; k++) /* a handle freed and made again: the old table goes */
            if (tables[k]->comm == t->comm) {
                tables[k]->live = 0;
                table_clear_entries(tables[k]);
                table_unlist(tables[k]);
                break;
            }
        Py_INCREF(t);
        tables[ntables++] = t;
        t->live = 1;
    }
    return (PyObject *)t;
}

PyDoc_STRVAR(add_doc, "add(warm)\n\nList a warm call (the newest is looked at first).");

static PyObject *table_add(Table *t, PyObject *warm) {
    if (Py_TYPE(warm) != &WarmType) {
        PyErr_SetString(PyExc_TypeError, "Table.add takes a Warm");
        return NULL;
    }
    if (t->n == ENTRIES) Py_CLEAR(t->entries[--t->n]);
    memmove(t->entries + 1, t->entries, t->n * sizeof(Warm *));
    Py_INCREF(warm);
    t->entries[0] = (Warm *)warm;
    t->n++;
    Py_RETURN_NONE;
}

static PyObject *table_clear(Table *t, PyObject *unused) {
    table_clear_entries(t);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(close_doc, "close()\n\nForget the communicator's warm calls (it is being freed).");

static PyObject *table_close(Table *t, PyObject *unused) {
    table_clear_entries(t);
    if (t->live) {
        t->live = 0;
        table_unlist(t);
    }
    Py_RETURN_NONE;
}

static PyObject *table_len(Table *t, PyObject *unused) { return PyLong_FromLong(t->n); }

static PyMethodDef table_methods[] = {
    {"add", (PyCFunction)table_add, METH_O, add_doc},
    {"clear", (PyCFunction)table_clear, METH_NOARGS, "clear()\n\nForget every warm call."},
    {"close", (PyCFunction)table_close, METH_NOARGS, close_doc},
    {"count", (PyCFunction)table_len, METH_NOARGS, "count() -> int\n\nWarm calls listed."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring._core.Table",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Table(comm)\n\nThe warm calls of one user communicator, found by its handle.",
    .tp_new = table_new,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_methods = table_methods,
};

/* ---- the warm call ------------------------------------------------------------------------ */

static inline int same(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b)) return PyUnicode_Compare(a, b) == 0;
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) return PyObject_RichCompareBool(a, b, Py_EQ) == 1;
    return 0;
}

/* Whether ``arr`` has the shape and dtype of ``w``'s key, and out= is given or not as its key says. */
static inline int matches(const Warm *w, const hr_ndarray *arr, int out_none) {
    if (w->dtype != arr->descr || w->ndim != arr->nd || w->out_none != out_none) return 0;
    for (int d = 0; d < w->ndim; d++)
        if (w->shape[d] != arr->dimensions[d]) return 0;
    return 1;
}

/* The warm call for these arguments, or NULL (no error set): engine.call's key, in C. */
static Warm *lookup(PyObject *const *a, hr_ndarray **xo) {
    PyObject *x = a[1], *comm = a[5];
    if (Py_TYPE(x) != ndarray_type || !struct_ok) return NULL;
    MPI_Comm handle;
    if (comm == Py_None) {
        handle = MPI_COMM_WORLD;
    } else {
        if (Py_TYPE(comm) != intracomm_type) return NULL;
        MPI_Comm *h = PyMPIComm_Get(comm);
        if (h == NULL) {
            PyErr_Clear();
            return NULL;
        }
        handle = *h;
    }
    Table *t = NULL;
    for (int k = 0; k < ntables; k++)
        if (tables[k]->comm == handle) {
            t = tables[k];
            break;
        }
    if (t == NULL) return NULL;
    hr_ndarray *arr = (hr_ndarray *)x;
    int out_none = a[2] == Py_None;
    for (int k = 0; k < t->n; k++) {
        Warm *w = t->entries[k];
        if (!matches(w, arr, out_none)) continue;
        if (!same(w->collective, a[0]) || !same(w->op, a[3]) || !same(w->algorithm, a[4]) || !same(w->root, a[8]) ||
            !same(w->reproducible, a[9]) || !same(w->wire, a[10]))
            continue;
        if (k) { /* most recently used first */
            memmove(t->entries + 1, t->entries, k * sizeof(Warm *));
            t->entries[0] = w;
        }
        *xo = arr;
        return w;
    }
    return NULL;
}

/* engine._ready_gathered in C, out given (or made by ``allocate``): x C-contiguous, and out the
 * result's size and x's dtype (an all-gather's: shape (G, *x.shape)), C-contiguous, writable, and
 * placed as the call was: apart from x, or (in place) x's own part of a writable x (reduce-scatter)
 * or x its row (all-gather), as engine._output tells them; aligned as the program needs. 0 ready,
 * 1 not: the Python path asks again, and its full path says what is wrong. */
static int ready_part(Warm *w, hr_ndarray *x, PyObject *out, char **src, char **dst) {
    if (!(x->flags & NPY_C_CONTIGUOUS) || Py_TYPE(out) != ndarray_type) return 1;
    hr_ndarray *o = (hr_ndarray *)out;
    if (!(o->flags & NPY_C_CONTIGUOUS) || !(o->flags & NPY_WRITEABLE) || o->descr != x->descr) return 1;
    if (w->form == F_ALLGATHER) { /* (G, *x.shape) */
        if (o->nd != w->ndim + 1 || o->dimensions[0] != w->size) return 1;
        for (int d = 0; d < w->ndim; d++)
            if (o->dimensions[d + 1] != w->shape[d]) return 1;
    } else { /* this rank's part's elements, any shape */
        Py_ssize_t count = 1;
        for (int d = 0; d < o->nd; d++) count *= o->dimensions[d];
        if (count * w->itemsize != w->out_nbytes) return 1;
    }
    char *xs = x->data, *os = o->data;
    Py_ssize_t xn = w->nbytes, on = w->out_nbytes;
    int in_place = 0;
    if (xn && on && os < xs + xn && xs < os + on) { /* they overlap (both contiguous: np.shares_memory) */
        if (w->form == F_REDUCE_SCATTER && os == xs + w->part && (x->flags & NPY_WRITEABLE)) in_place = 1;
        else if (w->form == F_ALLGATHER && xs == os + w->part) in_place = 1;
        else return 1; /* any other overlap: the full path refuses it */
    }
    if (in_place != w->in_place) return 1; /* the other placement: another call */
    int align = w->program->align;
    if ((uintptr_t)xs % align || (uintptr_t)os % align) return 1;
    *src = xs;
    *dst = os;
    return 0;
}

/* auto's reduce-scatter or all-gather: whether the channel still holds the choice this warm call
 * runs (engine._chosen's look-up, a use of it as Channel.cached makes it); one dropped is chosen
 * again on the full path. 1 yes (or not auto), 0 no (no error set). */
static int still_chosen(Warm *w) {
    if (w->schedules == NULL) return 1;
    PyObject *made = PyDict_GetItemWithError(w->schedules, w->choice_key); /* borrowed */
    if (made == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_INCREF(made);
    PyObject *r = PyObject_CallOneArg(w->touch, w->choice_key);
    int ok = r != NULL && same(made, w->choice);
    Py_XDECREF(r);
    Py_DECREF(made);
    if (!ok) PyErr_Clear();
    return ok;
}

/* NumPyAdapter.ready in C: x (and out) as a warm call of this kind may take them; ``src``,
 * ``dst``: their data. 0 ready, 1 not (the Python path then asks again and says why). */
static int ready(Warm *w, hr_ndarray *x, PyObject *out, char **src, char **dst) {
    if (w->form != F_SAME) return out == Py_None ? 1 : ready_part(w, x, out, src, dst);
    Py_ssize_t nbytes = w->itemsize;
    for (int d = 0; d < w->ndim; d++) nbytes *= w->shape[d];
    if (!(x->flags & NPY_C_CONTIGUOUS)) return 1;
    *src = x->data;
    if (out == Py_None) {
        if (!(x->flags & NPY_WRITEABLE)) return 1;
        *dst = x->data;
        return 0;
    }
    if (Py_TYPE(out) != ndarray_type) return 1;
    hr_ndarray *o = (hr_ndarray *)out;
    if (!(o->flags & NPY_C_CONTIGUOUS) || !(o->flags & NPY_WRITEABLE) || o->descr != x->descr || o->nd != x->nd)
        return 1;
    for (int d = 0; d < x->nd; d++)
        if (o->dimensions[d] != x->dimensions[d]) return 1;
    if (o->data < x->data + nbytes && x->data < o->data + nbytes) return 1; /* np.may_share_memory */
    *dst = o->data;
    return 0;
}

/* The slow path of a failure after the flight slot was taken: the engine records it (the flight
 * record, the dump, the requests a StallError leaves), then the error goes up. */
static void failed(Warm *w, PyObject *slot, int check) {
    hr_exc exc = exc_take();
    PyObject *r = PyObject_CallMethodObjArgs(w->call, s_failed, slot, exc.value ? exc.value : Py_None,
                                             check ? Py_True : Py_False, NULL);
    if (r != NULL) {
        Py_DECREF(r);
        exc_put(exc);
    } else {
        exc_drop(exc); /* the handler raised its own: that one goes up */
    }
}

/* buf /= size, as NumPy's true_divide by a Python int does for float32 and float64 (the mean). */
static void divide(int dtype, char *buf, Py_ssize_t nbytes, int size) {
    Py_ssize_t n = nbytes / hr_itemsize[dtype];
    if (dtype == HR_F32) {
        float *d = (float *)buf, g = (float)size;
        for (Py_ssize_t k = 0; k < n; k++) d[k] = d[k] / g;
    } else {
        double *d = (double *)buf, g = (double)size;
        for (Py_ssize_t k = 0; k < n; k++) d[k] = d[k] / g;
    }
}

/* What a failed agreement leaves in flight (a stall, or an MPI error: a failed rank under ULFM,
 * where the requests of the step that failed, and of the others, may still be pending): the
 * requests still active of ``req[0..n)`` and, once only, the agreement's buffers are kept for good
 * (hpcring.polling.abandon's reason: MPI may still read or write them, and freeing or reusing them,
 * at the next call or when the Warm goes, corrupts the heap); the next call makes new ones. The
 * pending exception stays as it is. */
static void agree_abandon(Warm *w, int n, MPI_Request *req) {
    hr_exc exc = exc_take();
    for (int k = 0; k < n; k++) {
        if (req[k] == MPI_REQUEST_NULL) continue;
        PyObject *one = abandoned ? PyMPIRequest_New(req[k]) : NULL;
        if (one != NULL) {
            PyList_Append(abandoned, one);
            Py_DECREF(one);
        }
        req[k] = MPI_REQUEST_NULL; /* kept there (or, failing that, left to MPI): not ours to wait for */
    }
    w->agree = w->agree_in = NULL; /* left to MPI: never freed */
    w->agree_work = NULL;
    if (w->inbox != NULL) {
        PyObject *agreement = PyObject_GetAttrString(w->state, "agreement");
        if (agreement == NULL || PyObject_SetAttrString(agreement, "incoming", Py_None) < 0) PyErr_Clear();
        Py_XDECREF(agreement);
        if (abandoned) PyList_Append(abandoned, w->inbox);
        Py_CLEAR(w->inbox);
    }
    PyErr_Clear();
    exc_put(exc);
}

#define WHERE_AGREEMENT 0 /* hpcring.flight.Where: what a stall notice says a rank waited in */
#define WHERE_ALGORITHM 2

/* Wait for the agreement's ``n`` requests: spinning, then Python's bounded wait until ``deadline``
 * (CLOCK_MONOTONIC, as time.monotonic; 0: within the timeout from then), stall notices and
 * StallError (a late rank; ``where`` the notices say this rank waited in). 0 done, -1 raised: a
 * stall and an MPI error alike leave the requests and buffers to MPI (`agree_abandon`). */
static int agree_wait_at(Warm *w, int n, MPI_Request *req, long long number, PyObject *timeout, double deadline,
                         int where) {
    int rc;
    int done = spin_n(n, req, HELD_SECONDS, 0, &rc);
    if (!done && rc == MPI_SUCCESS) done = spin_released(n, req, SPIN_SECONDS, &rc);
    if (rc != MPI_SUCCESS) {
        mpi_error(rc);
        agree_abandon(w, n, req);
        return -1;
    }
    if (done) return 0;
    PyObject *requests = PyTuple_New(n);
    int made = requests != NULL;
    for (int k = 0; made && k < n; k++) {
        PyObject *one = PyMPIRequest_New(req[k]);
        if (one == NULL) made = 0;
        else PyTuple_SET_ITEM(requests, k, one);
    }
    PyObject *request = !made ? NULL : n > 1 ? Py_NewRef(requests) : Py_NewRef(PyTuple_GET_ITEM(requests, 0));
    PyObject *num = PyLong_FromLongLong(number);
    PyObject *until = deadline > 0 ? PyFloat_FromDouble(deadline) : Py_NewRef(Py_None);
    PyObject *at = PyLong_FromLong(where);
    PyObject *r = request && num && until && at
                      ? PyObject_CallMethodObjArgs(w->call, s_stalled, request, num, timeout, until, at, NULL)
                      : NULL;
    Py_XDECREF(num);
    Py_XDECREF(until);
    Py_XDECREF(at);
    if (r == NULL) {
        hr_exc exc = exc_take();
        for (int k = 0; made && abandoned && k < n; k++) PyList_Append(abandoned, PyTuple_GET_ITEM(requests, k));
        if (made)
            for (int k = 0; k < n; k++) req[k] = MPI_REQUEST_NULL; /* their Python twins are kept */
        PyErr_Clear();
        exc_put(exc);
        Py_XDECREF(request);
        Py_XDECREF(requests);
        agree_abandon(w, n, req);
        return -1;
    }
    Py_DECREF(r);
    Py_DECREF(request);
    Py_DECREF(requests);
    for (int k = 0; k < n; k++) req[k] = MPI_REQUEST_NULL; /* completed in Python */
    return 0;
}

/* `agree_wait_at` for the agreement itself. */
static int agree_wait(Warm *w, int n, MPI_Request *req, long long number, PyObject *timeout, double deadline) {
    return agree_wait_at(w, n, req, number, timeout, deadline, WHERE_AGREEMENT);
}

/* An exchange (hpcring.agreement.Agreement._exchange; agree.h's hr_steps): recursive doubling,
 * each step a message each way of the contribution so far (the maxima of the header ``b`` and its
 * flags, hr_uniform, from which the other rebuilds the rest, hr_unpack; then the first
 * HR_PAIR_INLINE bytes of payload, the rest of a larger one apart, straight from where it is), each side
 * combining the two itself: the header's maxima, and the payloads where both ride. The last
 * combination of a payload is written to ``dst`` (the header is then final: it agreed); a rank
 * that gets the result from another copies it there. ``*rode`` where ``dst`` holds it. One
 * deadline for every wait. 0, or -1 raised. */
static int exchange(Warm *w, long long number, PyObject *timeout, double deadline, const char *src, char *dst,
                    int *rode) {
    int width = w->nwords + 2 + HR_PAYLOAD_COLUMNS;
    size_t head = 16 * (size_t)width, slot = (size_t)agree_pair_slot, lead = 8 * ((size_t)width + 1);
    int kinds[40], peers[40];
    int n = hr_steps(w->rank, w->size, kinds, peers), last = -1;
    for (int s = 0; s < n; s++)
        if (kinds[s] == HR_TAKE || kinds[s] == HR_SWAP) last = s;
    int64_t *b = w->agree, *theirs = w->agree_in;
    char *wire = (char *)b + head; /* the message: the header's maxima, its flags, the first payload bytes */
    const char *mine = w->fused ? src : NULL; /* the payload so far */
    const char *result = NULL;
    int rc = MPI_SUCCESS;
    for (int s = 0; s < n; s++) {
        int kind = kinds[s], peer = peers[s];
        MPI_Request req[4] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        if (kind != HR_GIVE)
            rc = MPI_Irecv((char *)theirs + head - lead, (int)(lead + HR_PAIR_INLINE), MPI_BYTE, peer, HR_TAG_AGREE,
                           w->agree_comm, &req[0]);
        if (rc == MPI_SUCCESS && (kind == HR_GIVE || kind == HR_SWAP)) {
            size_t m = mine ? hr_riding(b, width, slot) : 0, k = m < HR_PAIR_INLINE ? m : HR_PAIR_INLINE;
            memcpy(wire, b, (size_t)width * sizeof(int64_t));
            ((int64_t *)wire)[width] = hr_uniform(b, width);
            if (k) memcpy(wire + lead, mine, k);
            rc = MPI_Isend(wire, (int)(lead + k), MPI_BYTE, peer, HR_TAG_AGREE, w->agree_comm, &req[1]);
            if (rc == MPI_SUCCESS && m > k)
                rc = MPI_Isend(mine + k, (int)(m - k), MPI_BYTE, peer, HR_TAG_AGREE_DATA, w->agree_comm, &req[2]);
        }
        if (rc != MPI_SUCCESS) return mpi_error(rc), agree_abandon(w, 4, req), -1;
        if (kind != HR_GIVE) {
            if (agree_wait(w, 1, req, number, timeout, deadline) < 0) return agree_abandon(w, 4, req), -1;
            hr_unpack(theirs, width);
            size_t apart = hr_riding(theirs, width, slot); /* the other's payload beyond the header */
            if (apart > HR_PAIR_INLINE) {
                rc = MPI_Irecv((char *)theirs + head + HR_PAIR_INLINE, (int)(apart - HR_PAIR_INLINE), MPI_BYTE, peer,
                               HR_TAG_AGREE_DATA, w->agree_comm, &req[3]);
                if (rc != MPI_SUCCESS) return mpi_error(rc), agree_abandon(w, 4, req), -1;
            }
        }
        if (agree_wait(w, 4, req, number, timeout, deadline) < 0) return -1;
        if (kind == HR_RESULT) { /* the result, as the rank that held this one's share has it */
            memcpy(b, theirs, head);
            result = (const char *)theirs + head;
        } else if (kind != HR_GIVE) {
            int carry = mine && hr_riding(b, width, slot) && hr_riding(theirs, width, slot) &&
                        !memcmp(b, theirs, (size_t)width * sizeof(int64_t));
            for (int k = 0; k < 2 * width; k++)
                if (theirs[k] > b[k]) b[k] = theirs[k];
            if (carry) {
                char *into = dst;
                if (s != last) {
                    if (w->agree_work == NULL && (w->agree_work = PyMem_Malloc((size_t)w->nbytes)) == NULL) {
                        PyErr_NoMemory();
                        return -1;
                    }
                    into = w->agree_work;
                }
                hr_payload_combine3((int)w->payload[0], (int)w->payload[1], (const char *)theirs + head, mine, into,
                                    (size_t)w->payload[2], &quirks);
                mine = into;
            }
            result = carry ? mine : NULL;
        }
    }
    *rode = result != NULL && hr_riding(b, width, slot) == (size_t)w->nbytes;
    if (*rode && result != dst) memcpy(dst, result, (size_t)w->nbytes);
    return 0;
}

/* The agreement, as hpcring.agreement.Agreement runs it (agree.h): [number, row, present, dtype,
 * op, count, verdict], its negation and the payload slot, in one MPI_Iallreduce; where the call
 * is fused, its data (``src``) rides in the slot. Where the ranks exchange (``w->exch``) they exchange their
 * contributions instead (`exchange`). 1 when every rank agreed and every rank's data rode along
 * (``dst`` then holds the result), 0 when they agreed and the data is yet to move, -1 raised (a
 * stall, a mismatch, an MPI error). */
static int agree(Warm *w, long long number, PyObject *timeout, const char *src, char *dst) {
    int width = w->nwords + 2 + HR_PAYLOAD_COLUMNS; /* number, row, payload columns, verdict */
    int exch = w->exch;
    size_t head = 16 * (size_t)width;
    size_t bytes = head + (size_t)(exch ? 8 * (width + 1) + HR_PAIR_INLINE : agree_slot);
    if (w->agree == NULL && (w->agree = PyMem_Calloc(1, bytes)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (exch && w->inbox == NULL) { /* the communicator's receive buffer, shared with the Python path */
        PyObject *agreement = PyObject_GetAttrString(w->state, "agreement");
        PyObject *inbox = agreement ? PyObject_CallMethod(agreement, "inbox", NULL) : NULL;
        Py_XDECREF(agreement);
        char *data;
        Py_ssize_t size;
        if (inbox == NULL) return -1;
        if (array_bytes(inbox, 1, &data, &size) < 0 || (size_t)size < head + (size_t)agree_pair_slot) {
            Py_DECREF(inbox);
            PyErr_SetString(PyExc_ValueError, "agreement: the inbox is not a writable array of the exchange's size");
            return -1;
        }
        w->inbox = inbox;
        w->agree_in = (int64_t *)data;
    }
    int64_t *b = w->agree;
    b[0] = number;
    for (int k = 0; k < w->nwords; k++) b[1 + k] = w->words[k];
    int64_t *payload = b + 1 + w->nwords;
    payload[0] = w->fused != 0;
    payload[1] = w->fused ? w->payload[0] : -1;
    payload[2] = w->fused ? w->payload[1] : -1;
    payload[3] = w->fused ? w->payload[2] : 0;
    for (int k = 0; k < width - 1; k++) b[width + k] = -b[k];
    b[width - 1] = b[2 * width - 1] = 0;
    size_t nbytes = w->fused ? (size_t)w->nbytes : 0;
    int rode = 0;
    if (exch) {
        double seconds = PyFloat_AsDouble(timeout);
        if (seconds == -1.0 && PyErr_Occurred()) return -1;
        if (exchange(w, number, timeout, seconds > 0 ? now() + seconds : 0, src, dst, &rode) < 0) return -1;
    } else {
        if (w->fused) memcpy(b + 2 * width, src, nbytes);
        MPI_Request req = MPI_REQUEST_NULL;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, b, 1, agree_type, agree_op, w->agree_comm, &req);
        if (rc != MPI_SUCCESS) return mpi_error(rc), agree_abandon(w, 1, &req), -1;
        if (agree_wait(w, 1, &req, number, timeout, 0) < 0) return -1;
    }
    if (!hr_agreed(b, width)) { /* every rank takes the slow path: the rows gathered, the same error everywhere */
        PyObject *n = PyLong_FromLongLong(number), *sends = NULL, *r = NULL;
        if (n != NULL && w->nahead) { /* an all-to-all's blocks sent ahead: their sends, done in Python */
            sends = PyTuple_New(w->nahead);
            for (int k = 0; sends != NULL && k < w->nahead; k++) {
                PyObject *one = PyMPIRequest_New(w->ahead_req[k]);
                if (one == NULL) Py_CLEAR(sends);
                else PyTuple_SET_ITEM(sends, k, one);
            }
            w->nahead = 0;
            if (sends != NULL) r = PyObject_CallMethodObjArgs(w->call, s_disagreed, n, sends, NULL);
            Py_XDECREF(sends);
        } else if (n != NULL) {
            r = PyObject_CallMethodObjArgs(w->call, s_disagreed, n, NULL);
        }
        Py_XDECREF(n);
        if (r != NULL) {
            Py_DECREF(r);
            PyErr_SetString(PyExc_AssertionError, "hpcring: the ranks disagreed, yet nothing was raised");
        }
        return -1;
    }
    if (!w->fused || !hr_carried(b, width)) return 0;
    if (!exch) memcpy(dst, b + 2 * width, nbytes);
    else if (!rode) { /* every rank carried, yet the payload did not come through: cannot be */
        PyErr_SetString(PyExc_AssertionError, "hpcring: the agreement's payload went missing");
        return -1;
    }
    return 1;
}

/* An all-to-all's blocks of ``src`` sent to every other rank ahead of the agreement
 * (hpcring.exchange.send_ahead): their requests in ``ahead_req``. 0, or -1 raised. */
static int send_ahead(Warm *w, const char *src) {
    int size = w->size, me = w->rank, rc = MPI_SUCCESS;
    if (w->ahead_req == NULL && (w->ahead_req = PyMem_Malloc(2 * (size_t)size * sizeof(MPI_Request))) == NULL)
        return PyErr_NoMemory(), -1;
    size_t block = (size_t)w->nbytes / (size_t)size;
    w->nahead = 0;
    for (int q = 0; q < size && rc == MPI_SUCCESS; q++)
        if (q != me)
            rc = MPI_Isend(src + q * block, (int)block, MPI_BYTE, q, HR_TAG_AHEAD, w->agree_comm,
                           &w->ahead_req[w->nahead++]);
    if (rc != MPI_SUCCESS) return mpi_error(rc), -1;
    /* what left ahead counts in the channel's traffic, as a program's sends do (`Program.sent`) */
    PyObject *traffic = PyObject_GetAttr(w->channel, s_traffic);
    if (traffic == NULL) return -1;
    int bad = add_to(traffic, s_sent, (long long)block * w->nahead) < 0;
    Py_DECREF(traffic);
    return bad ? -1 : 0;
}

/* The blocks sent ahead, received into ``dst`` (``out``'s memory) once every rank agreed
 * (hpcring.exchange.receive), this rank's own copied; then the sends done. 0, or -1 raised: the
 * requests are then left to MPI, and ``out``, which MPI may still write, kept for good with them
 * (polling.abandon's reason; an output this call made would otherwise be freed under them). */
static int receive_ahead(Warm *w, long long number, PyObject *timeout, const char *src, char *dst, PyObject *out,
                         int data) {
    int size = w->size, me = w->rank, rc = MPI_SUCCESS, n = w->nahead;
    size_t block = (size_t)w->nbytes / (size_t)size;
    MPI_Request *req = w->ahead_req;
    for (int q = 0; q < size && rc == MPI_SUCCESS; q++)
        if (q != me) rc = MPI_Irecv(dst + q * block, (int)block, MPI_BYTE, q, HR_TAG_AHEAD, w->agree_comm, &req[n++]);
    if (rc != MPI_SUCCESS) return mpi_error(rc), -1;
    if (block >= (1 << 16)) {
        Py_BEGIN_ALLOW_THREADS
        memcpy(dst + me * block, src + me * block, block);
        Py_END_ALLOW_THREADS
    } else {
        memcpy(dst + me * block, src + me * block, block);
    }
    w->nahead = 0;
    if (agree_wait_at(w, n, req, number, timeout, 0, data ? WHERE_ALGORITHM : WHERE_AGREEMENT) < 0) {
        w->ahead_req = NULL; /* MPI may still use them: left to it */
        keep(out);
        return -1;
    }
    return 0;
}

static PyObject *warm_run(Warm *w, PyObject *x, PyObject *out, PyObject *check_obj, PyObject *timeout_obj,
                          char *src, char *dst);

/* A plan's requests tested until done (HELD_SECONDS holding the GIL, then released), then, past
 * SPIN_SECONDS, waited for in Python within the timeout (``requests``: what plan_waited takes;
 * NULL: a tuple of mpi4py requests made of ``req`` then, for requests of a run's own, as a
 * stepped plan's). 0, or -1 raised. */
static int plan_wait(Warm *w, int n, MPI_Request *req, PyObject *requests, PyObject *timeout) {
    int rc = MPI_SUCCESS, done = spin_n(n, req, HELD_SECONDS, 0, &rc);
    if (!done && rc == MPI_SUCCESS) done = spin_released(n, req, SPIN_SECONDS, &rc);
    if (rc != MPI_SUCCESS) {
        mpi_error(rc);
        return -1;
    }
    if (done) return 0;
    PyObject *made = NULL;
    if (requests == NULL) {
        if ((made = requests = PyTuple_New(n)) == NULL) return -1;
        for (int k = 0; k < n; k++) {
            PyObject *one = PyMPIRequest_New(req[k]);
            if (one == NULL) return Py_DECREF(made), -1;
            PyTuple_SET_ITEM(made, k, one);
        }
    }
    PyObject *r = PyObject_CallMethodObjArgs(w->call, s_plan_waited, requests, timeout, NULL);
    Py_XDECREF(made);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* A plan through shared memory (shared.h): its input into its slot, then every rank's awaited as
 * a plan's requests are (holding the GIL a few microseconds, then released, then Python's
 * bounded wait on Test, which makes the result). 1 done, -1 raised. */
static int run_shared(Warm *w, Shared *s, PyObject *timeout) {
    if (shared_begin(s) < 0) return -1;
    int done = shared_spin(s, HELD_SECONDS);
    if (!done) {
        Py_BEGIN_ALLOW_THREADS
        done = shared_spin(s, SPIN_SECONDS);
        Py_END_ALLOW_THREADS
    }
    if (done) {
        shared_finish(s);
        return 1;
    }
    PyObject *r = PyObject_CallMethodObjArgs(w->call, s_plan_waited, (PyObject *)s, timeout, NULL);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 1;
}

/* A halved two-rank plan (hpcring.persistent.Pair.parts): each sends the other's half, combines
 * its own with what came (the same op and order as a whole pair's), then they swap results. */
static int run_halves(Warm *w, PyObject *timeout, char *dst) {
    MPI_Request req[2];
    Py_ssize_t at, bytes;
    pair_half(w, &at, &bytes);
    for (int phase = 0; phase < 2; phase++) {
        PyObject *requests = phase ? w->pair_second : w->prequest;
        MPI_Request *recv = PyMPIRequest_Get(PyTuple_GET_ITEM(requests, 0));
        MPI_Request *send = PyMPIRequest_Get(PyTuple_GET_ITEM(requests, 1));
        if (recv == NULL || send == NULL) return -1;
        req[0] = *recv;
        req[1] = *send;
        int rc = MPI_Startall(2, req);
        if (rc != MPI_SUCCESS) return mpi_error(rc), -1;
        if (plan_wait(w, 2, req, requests, timeout) < 0) return -1;
        if (phase == 0) /* this rank's half: the other's input (op) this one's, as a whole pair combines */
            hr_payload_combine3((int)w->payload[0], (int)w->payload[1], w->pair_scratch, dst + at, dst + at,
                                (size_t)(bytes / hr_itemsize[w->payload[0]]), &quirks);
    }
    return 1;
}

/* A plan of 3 or 4 ranks (hpcring.persistent.Steps): the exchange's steps (agree.h's hr_steps)
 * with the payload alone, each step's receive and send posted afresh (MPI's persistent
 * point-to-point requests and persistent all-reduce cost more per run here), each combination
 * (what came, op, this rank's so far) written to ``dst``. 1 done, -1 raised. */
static int run_steps(Warm *w, PyObject *timeout, const char *src, char *dst) {
    int kinds[40], peers[40];
    int n = hr_steps(w->rank, w->size, kinds, peers);
    const char *cur = src;
    for (int s = 0; s < n; s++) {
        int kind = kinds[s], peer = peers[s], rc = MPI_SUCCESS;
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        if (kind != HR_GIVE)
            rc = MPI_Irecv(kind == HR_RESULT ? dst : w->pair_scratch, (int)w->nbytes, MPI_BYTE, peer, w->steps_tag,
                           w->agree_comm, &req[0]);
        if (rc == MPI_SUCCESS && (kind == HR_GIVE || kind == HR_SWAP))
            rc = MPI_Isend(cur, (int)w->nbytes, MPI_BYTE, peer, w->steps_tag, w->agree_comm, &req[1]);
        if (rc != MPI_SUCCESS) return mpi_error(rc), -1;
        if (plan_wait(w, 2, req, NULL, timeout) < 0) return -1; /* either request may be null */
        if (kind == HR_TAKE || kind == HR_SWAP) {
            hr_payload_combine3((int)w->payload[0], (int)w->payload[1], w->pair_scratch, cur, dst,
                                (size_t)w->payload[2], &quirks);
            cur = dst;
        }
    }
    return 1;
}

/* A plan's run: its persistent request started, and tested until done (HELD_SECONDS holding the
 * GIL, then released: a two-rank plan of 8 B cost 1.04-1.10x the bare call so, 1.12-1.14x
 * releasing it at once), then, past SPIN_SECONDS, waited for in Python within the timeout
 * (hpcring.engine.Call.plan_waited: a StallError naming the ranks that never started theirs).
 * 1 done, -1 raised. */
static int run_persistent(Warm *w, PyObject *timeout, const char *src, char *dst) {
    MPI_Request pair[2], *req;
    int n = 1;
    if (Py_TYPE(w->prequest) == &SharedType) return run_shared(w, (Shared *)w->prequest, timeout);
    if (w->stepped) return run_steps(w, timeout, src, dst);
    if (w->pair_halves) return run_halves(w, timeout, dst);
    if (w->pair_scratch != NULL) { /* a two-rank plan: its receive and send (persistent handles stay put) */
        MPI_Request *recv = PyMPIRequest_Get(PyTuple_GET_ITEM(w->prequest, 0));
        MPI_Request *send = PyMPIRequest_Get(PyTuple_GET_ITEM(w->prequest, 1));
        if (recv == NULL || send == NULL) return -1;
        pair[0] = *recv;
        pair[1] = *send;
        req = pair;
        n = 2;
    } else if ((req = PyMPIRequest_Get(w->prequest)) == NULL) {
        return -1;
    }
    int rc = n == 1 ? MPI_Start(req) : MPI_Startall(n, req);
    if (rc != MPI_SUCCESS) return mpi_error(rc), -1;
    /* as the agreement waits: a few microseconds holding the GIL (ranks in step), then released */
    if (plan_wait(w, n, req, w->prequest, timeout) < 0) return -1;
    if (w->pair_scratch != NULL) { /* this rank's input (op) the other's: the same bits on both */
        hr_payload_combine3((int)w->payload[0], (int)w->payload[1], w->pair_scratch, src, dst, (size_t)w->payload[2],
                            &quirks);
    }
    return 1;
}

PyDoc_STRVAR(run_warm_doc, "run(x, out, timeout)\n\nThis warm call on these arrays without the agreement, as a plan "
                           "runs it; the result (x in place, else out).");

static PyObject *warm_run_method(Warm *w, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "run(x, out, timeout)");
        return NULL;
    }
    char *src, *dst;
    if (Py_TYPE(argv[0]) != ndarray_type || !struct_ok || ready(w, (hr_ndarray *)argv[0], argv[1], &src, &dst)) {
        PyErr_SetString(PyExc_ValueError, "run: arrays of another kind than this warm call's");
        return NULL;
    }
    PyObject *result = warm_run(w, argv[0], argv[1], Py_False, argv[2], src, dst);
    if (result == Py_NotImplemented) {
        Py_DECREF(result);
        PyErr_SetString(PyExc_RuntimeError, "hpcring.plan: another thread is running a collective on this "
                                            "communicator; give each thread its own communicator (comm.Dup())");
        return NULL;
    }
    return result;
}

static inline int tracing_off(void);

PyDoc_STRVAR(call_warm_doc, "call(x, out, check, timeout)\n\nThis warm call, checked as ``check`` says, on NumPy views of "
                            "arrays of another kind (a CPU tensor's memory) whose Python look-up found it: the result (x "
                            "in place, else out, or the output made), or NotImplemented where the Python path must take "
                            "it (arrays this warm call cannot take as they are, tracing on, the compiled core off, "
                            "another thread).");

/* ``w`` run on ``x`` and ``out``, its output (an all-to-all's, a reduce-scatter's or an
 * all-gather's, where no out= is given) made by its ``allocate``: the result, NotImplemented where
 * `ready` says no (the Python path then asks again and says why), or NULL raised (the
 * allocation's error too). */
static PyObject *run_found(Warm *w, hr_ndarray *x, PyObject *out, PyObject *check, PyObject *timeout) {
    PyObject *made = NULL, *result;
    if (w->allocate != NULL && out == Py_None &&
        (out = made = PyObject_CallOneArg(w->allocate, (PyObject *)x)) == NULL)
        return NULL;
    char *src, *dst;
    if (ready(w, x, out, &src, &dst)) {
        result = Py_NewRef(Py_NotImplemented);
    } else {
        Py_INCREF(w);
        result = warm_run(w, (PyObject *)x, out, check, timeout, src, dst);
        Py_DECREF(w);
    }
    Py_XDECREF(made);
    return result;
}

/* The front door for a kind of array that is not an ndarray but has an ndarray view of its memory
 * (hpcring.engine.call's torch CPU tensors): the Python look-up found this warm call by the
 * tensor's key, so the row says the tensor's kind; here only the views' shape, dtype and
 * placement are checked again, as `lookup` and `ready` check an ndarray's. An output this call
 * makes (an all-to-all's, a reduce-scatter's or an all-gather's, where no out= is given) is made
 * here by its ``allocate``: an ndarray, which the caller wraps. */
static PyObject *warm_call_method(Warm *w, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "call(x, out, check, timeout)");
        return NULL;
    }
    PyObject *x = argv[0], *out = argv[1];
    if (!enabled || !struct_ok || Py_TYPE(x) != ndarray_type || !tracing_off())
        return Py_NewRef(Py_NotImplemented);
    if (w->form != F_SAME && !still_chosen(w)) return Py_NewRef(Py_NotImplemented); /* as `caller` asks */
    hr_ndarray *arr = (hr_ndarray *)x;
    if (!matches(w, arr, out == Py_None) || (w->allocate != NULL && !(arr->flags & NPY_C_CONTIGUOUS)))
        return Py_NewRef(Py_NotImplemented);
    return run_found(w, arr, out, argv[2], argv[3]);
}

PyDoc_STRVAR(agree_warm_doc, "agree(number, src, dst, timeout) -> bool\n\nThe agreement of call ``number`` of the Python "
                             "path (hpcring.engine.Call._agree), as hpcring.agreement.Agreement runs it, in C: where "
                             "the Warm carries a payload, ``src`` rides along and ``dst`` gets the result (both "
                             "C-contiguous arrays of the payload's bytes; else None). True where it rode on every "
                             "rank; raises what the Python agreement raises (a mismatch, a stall, an MPI error).");

static PyObject *warm_agree_method(Warm *w, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "agree(number, src, dst, timeout)");
        return NULL;
    }
    long long number = PyLong_AsLongLong(argv[0]);
    if (number == -1 && PyErr_Occurred()) return NULL;
    char *src = NULL, *dst = NULL;
    Py_ssize_t ns = 0, nd = 0;
    if (w->fused && (array_bytes(argv[1], 0, &src, &ns) < 0 || array_bytes(argv[2], 1, &dst, &nd) < 0 ||
                     ns != w->nbytes || nd != w->nbytes)) {
        PyErr_SetString(PyExc_ValueError, "agree: src and dst C-contiguous arrays of the payload's bytes, dst writable");
        return NULL;
    }
    int r = agree(w, number, argv[3], src, dst);
    if (r < 0) return NULL;
    return PyBool_FromLong(r == 1);
}

static PyMethodDef warm_methods[] = {
    {"agree", (PyCFunction)(void (*)(void))warm_agree_method, METH_FASTCALL, agree_warm_doc},
    {"run", (PyCFunction)(void (*)(void))warm_run_method, METH_FASTCALL, run_warm_doc},
    {"call", (PyCFunction)(void (*)(void))warm_call_method, METH_FASTCALL, call_warm_doc},
    {NULL, NULL, 0, NULL},
};

/* One warm call: the result (x or out), NULL raised, or NotImplemented where the Python path
 * must take it (another thread, the exclusion taken: it raises saying why). */
static PyObject *warm_run(Warm *w, PyObject *x, PyObject *out, PyObject *check_obj, PyObject *timeout_obj,
                          char *src, char *dst) {
    int check = PyObject_IsTrue(check_obj);
    if (check < 0) return NULL;
    if (w->program == NULL && w->prequest == NULL) return Py_NewRef(Py_NotImplemented); /* an agreement alone */
    if (w->single && PyThread_get_thread_ident() != main_thread) return Py_NewRef(Py_NotImplemented);
    /* the timeout: the argument, else HPCRING_TIMEOUT as the communicator took it, else Python's */
    PyObject *timeout = timeout_obj != Py_None ? timeout_obj : w->timeout;
    PyObject *resolved = NULL;
    if (timeout == Py_None) {
        resolved = PyObject_CallMethodObjArgs(w->call, s_resolve, Py_None, NULL);
        if (resolved == NULL) return NULL; /* a bad HPCRING_TIMEOUT raises, on every rank alike */
        timeout = resolved;
    }
    double seconds = PyFloat_AsDouble(timeout);
    if (seconds == -1.0 && PyErr_Occurred()) {
        Py_XDECREF(resolved);
        return NULL;
    }
    PyObject *wait_for = seconds > 0 ? timeout : Py_None; /* as Channel.timeout holds it: None, no limit */
    /* the exclusion: one collective at a time per communicator */
    PyObject *got = PyObject_CallOneArg(w->acquire, Py_False);
    if (got == NULL) {
        Py_XDECREF(resolved);
        return NULL;
    }
    int mine = got == Py_True;
    Py_DECREF(got);
    if (!mine) {
        Py_XDECREF(resolved);
        return Py_NewRef(Py_NotImplemented);
    }
    PyObject *result = NULL, *slot = NULL;
    long long number = 0;
    int carried = 0;
    /* the flight record: seq, and the slot's call, phase and start */
    PyObject *seq_obj = m_seq.get(m_seq.descr, w->flight, NULL);
    if (seq_obj == NULL) goto leave;
    long long seq = PyLong_AsLongLong(seq_obj) + 1;
    Py_DECREF(seq_obj);
    if (store_long(&m_seq, w->flight, seq) < 0) goto leave;
    slot = Py_NewRef(PyList_GET_ITEM(w->slots, seq & w->mask));
    if (store(&m_call, slot, w->call) < 0 || store_long(&m_phase, slot, 1) < 0 || store_float(&m_start, slot, now()) < 0)
        goto fail;
    if (w->blocking && PyObject_SetAttr(w->channel, s_timeout, wait_for) < 0) goto fail;
    if (check) {
        PyObject *calls = PyObject_GetAttr(w->state, s_calls);
        if (calls == NULL) goto fail;
        number = PyLong_AsLongLong(calls) + (w->size > 1);
        Py_DECREF(calls);
        if (PyErr_Occurred()) goto fail;
    }
    if (check && w->size > 1) { /* one rank has nothing to agree on (the Python path's _agree) */
        PyObject *n = PyLong_FromLongLong(number);
        int bad = n == NULL || PyObject_SetAttr(w->state, s_calls, n) < 0;
        Py_XDECREF(n);
        if (bad || (w->ahead && send_ahead(w, src) < 0)) goto fail;
        carried = agree(w, number, timeout, src, dst);
        if (carried < 0 && w->nahead) { /* a stall or an MPI error: MPI may still use the sends, left to it */
            w->ahead_req = NULL;
            w->nahead = 0;
        }
        if (carried < 0) goto fail;
        if (w->ahead && (carried = receive_ahead(w, number, timeout, src, dst, out, 0) < 0 ? -1 : 1) < 0) goto fail;
    }
    if (store_long(&m_number, slot, number) < 0 || store_long(&m_phase, slot, 2) < 0) goto fail;
    /* the data, where it did not ride with the agreement */
    if (!carried) {
        int moved;
        if (w->ahead) /* check=False: the checked call's pattern, every block at once, no agreement before it */
            moved = send_ahead(w, src) < 0 || receive_ahead(w, number, timeout, src, dst, out, 1) < 0 ? -1 : 1;
        else
            moved = w->prequest ? run_persistent(w, wait_for, src, dst)
                                : program_exec(w->program, src, dst, x, w->returns_x ? x : out, wait_for);
        if (moved < 0) goto fail;
    }
    if (w->mean >= 0 && w->size > 1) { /* one rank: the mean is the sum */
        Py_ssize_t nbytes = w->out_nbytes;
        if (nbytes >= (1 << 16)) {
            Py_BEGIN_ALLOW_THREADS
            divide(w->mean, dst, nbytes, w->size);
            Py_END_ALLOW_THREADS
        } else {
            divide(w->mean, dst, nbytes, w->size);
        }
    }
    if (store_float(&m_end, slot, now()) < 0) goto fail;
    result = Py_NewRef(w->returns_x ? x : out);
    goto leave;
fail:
    if (number && !check) number = 0;
    failed(w, slot, check);
leave:;
    hr_exc exc = exc_take();
    PyObject *r = PyObject_CallNoArgs(w->release);
    if (r != NULL) {
        Py_DECREF(r);
        exc_put(exc);
    } else if (exc.type != NULL) {
        PyErr_Clear();
        exc_put(exc);
    } else {
        Py_CLEAR(result);
    }
    Py_XDECREF(slot);
    Py_XDECREF(resolved);
    return result;
}

static inline int tracing_off(void) {
    PyObject *tracer = PyDict_GetItemWithError(tracing_globals, s_tracer);
    return tracer != NULL && Py_TYPE(tracer) == null_tracer_type;
}

static PyObject *s_allreduce;

/* engine.call(collective, x, out, op, algorithm, comm, check, timeout, root, reproducible, wire[, parts]) */
static PyObject *caller(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "hpcring: the compiled engine.call has no Python call behind it");
        return NULL;
    }
    PyObject *in_place[12]; /* the arguments with out=None, where out=x (lives until the return) */
    if (enabled && kwnames == NULL && (nargs == 11 || (nargs == 12 && args[11] == Py_None)) && tracing_off()) {
        if (args[2] == args[1] && same(args[0], s_allreduce)) { /* out=x: in place, as out=None (engine.call) */
            memcpy(in_place, args, (size_t)nargs * sizeof(PyObject *));
            in_place[2] = Py_None;
            args = in_place;
            nargsf = (size_t)nargs; /* no slot before args[0] to lend the callee */
        }
        hr_ndarray *x = NULL;
        Warm *w = lookup(args, &x);
        char *src, *dst;
        PyObject *out = args[2], *made = NULL, *result = NULL;
        Py_XINCREF(w); /* Python runs below (auto's look-up, the allocation): the table may change */
        /* a reduce-scatter or an all-gather: auto's choice still held, and its result made here where
         * no out= is given (where that fails, the Python path makes it again and raises there) */
        int go = w != NULL && (w->form == F_SAME || still_chosen(w));
        if (go && w->form != F_SAME && out == Py_None && w->allocate != NULL) {
            out = made = PyObject_CallOneArg(w->allocate, args[1]);
            if (made == NULL) {
                PyErr_Clear();
                go = 0;
            }
        }
        if (go && !ready(w, x, out, &src, &dst)) result = warm_run(w, args[1], out, args[6], args[7], src, dst);
        Py_XDECREF(w);
        Py_XDECREF(made);
        if (result != Py_NotImplemented && (result != NULL || PyErr_Occurred())) return result;
        Py_XDECREF(result);
    }
    return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
}

static PyMethodDef caller_def = {"call", (PyCFunction)(void (*)(void))caller, METH_FASTCALL | METH_KEYWORDS,
                                 "hpcring.engine.call, with its warm NumPy calls run in C."};

/* ---- Front: a public collective's own front door (hpcring.allreduce, ...) ------------------ */

/* The public functions only hand their arguments on to engine.call, and that Python frame cost a
 * warm call at 8 B 0.15 us, a sixth of MPI_Allreduce's time on two ranks. A Front takes the
 * function's place: a call of x and keywords sets engine.call's arguments by name (the function's
 * defaults, and what it passes for what it does not take, made once by hpcring.core.front) and
 * enters `caller` above; anything else (no x, more positional arguments, a keyword the function
 * does not take) is the function's own call, which runs the same or says what is wrong. Its
 * __dict__ holds what help() and inspect read (__doc__, __wrapped__), and it binds as a
 * function does. */
#define FRONT_ARGS 11 /* engine.call's arguments but ``parts`` */

typedef struct {
    PyObject_HEAD vectorcallfunc vectorcall;
    PyObject *function; /* the Python function */
    PyObject *dict;
    PyObject *args[FRONT_ARGS]; /* engine.call's arguments when only x is given ([1]: None) */
    PyObject *names[FRONT_ARGS]; /* the keywords the function takes, interned */
    int where[FRONT_ARGS];       /* names[k] is engine.call's argument where[k] */
    int nnames;
} Front;

static PyObject *front_vectorcall(Front *f, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs == 1) {
        PyObject *a[FRONT_ARGS];
        memcpy(a, f->args, sizeof a);
        a[1] = args[0];
        Py_ssize_t i = 0;
        for (; i < nkw; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            int k = 0;
            while (k < f->nnames && f->names[k] != name) k++; /* interned alike: the usual case */
            for (int j = 0; k == f->nnames && j < f->nnames; j++)
                if (PyUnicode_Compare(f->names[j], name) == 0) k = j;
            if (k == f->nnames) break;
            a[f->where[k]] = args[nargs + i];
        }
        if (i == nkw) return caller(NULL, a, FRONT_ARGS, NULL);
    }
    return PyObject_Vectorcall(f->function, args, nargsf, kwnames);
}

PyDoc_STRVAR(front_doc, "Front(function, arguments, keywords)\n\n``function``, a public collective that hands "
                        "its arguments on to engine.call, called without its Python frame: ``arguments`` are "
                        "engine.call's 11 when only x is given, ``keywords`` (name, place) pairs.");

static PyObject *front_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *function, *arguments, *keywords;
    if (!PyArg_ParseTuple(args, "OO!O!:Front", &function, &PyTuple_Type, &arguments, &PyTuple_Type, &keywords))
        return NULL;
    if (!PyCallable_Check(function) || PyTuple_GET_SIZE(arguments) != FRONT_ARGS ||
        PyTuple_GET_SIZE(keywords) > FRONT_ARGS) {
        PyErr_SetString(PyExc_ValueError, "Front: a callable, engine.call's 11 arguments, at most 11 keywords");
        return NULL;
    }
    Front *f = (Front *)type->tp_alloc(type, 0);
    if (f == NULL) return NULL;
    f->vectorcall = (vectorcallfunc)front_vectorcall;
    f->function = Py_NewRef(function);
    for (int k = 0; k < FRONT_ARGS; k++) f->args[k] = Py_NewRef(PyTuple_GET_ITEM(arguments, k));
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keywords); k++) {
        PyObject *name;
        int where;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(keywords, k), "Ui", &name, &where) || where < 2 || where >= FRONT_ARGS) {
            PyErr_SetString(PyExc_ValueError, "Front: each keyword a (name, place) pair, place 2 to 10");
            Py_DECREF(f);
            return NULL;
        }
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        f->names[f->nnames] = name;
        f->where[f->nnames++] = where;
    }
    return (PyObject *)f;
}

static int front_traverse(Front *f, visitproc visit, void *arg) {
    Py_VISIT(f->function);
    Py_VISIT(f->dict);
    for (int k = 0; k < FRONT_ARGS; k++) Py_VISIT(f->args[k]);
    return 0;
}

static int front_clear(Front *f) {
    Py_CLEAR(f->function);
    Py_CLEAR(f->dict);
    for (int k = 0; k < FRONT_ARGS; k++) Py_CLEAR(f->args[k]);
    for (int k = 0; k < f->nnames; k++) Py_CLEAR(f->names[k]);
    f->nnames = 0;
    return 0;
}

static void front_dealloc(Front *f) {
    PyObject_GC_UnTrack(f);
    front_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *front_get(PyObject *f, PyObject *obj, PyObject *type) { /* binds as a function does */
    return obj == NULL || obj == Py_None ? Py_NewRef(f) : PyMethod_New(f, obj);
}

static PyObject *front_reduce(Front *f, PyObject *unused) { /* pickled by name, as a function is */
    return PyObject_GetAttrString((PyObject *)f, "__name__");
}

static PyMethodDef front_methods[] = {
    {"__reduce__", (PyCFunction)front_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef front_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FrontType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring._core.Front",
    .tp_basicsize = sizeof(Front),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = front_doc,
    .tp_new = front_new,
    .tp_dealloc = (destructor)front_dealloc,
    .tp_traverse = (traverseproc)front_traverse,
    .tp_clear = (inquiry)front_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Front, vectorcall),
    .tp_dictoffset = offsetof(Front, dict),
    .tp_descr_get = front_get,
    .tp_methods = front_methods,
    .tp_getset = front_getset,
};

/* ---- the all-to-all's warm call (hpcring.exchange) ------------------------------------------ */

static PyObject *s_alltoall, *zero;

/* exchange.run(x, out, algorithm, comm, check, timeout, send_splits, recv_splits): an all-to-all of
 * equal blocks (no splits) on NumPy arrays whose kind has a warm call here runs it, the output
 * made by its ``allocate`` where no out= is given; anything else is ``fallback``'s, exchange's
 * Python run. Its Warm is listed in the communicator's table beside the all-reduce's, under
 * engine.call's key with the all-to-all's constants (no op, root 0, no wire, not reproducible). */
static PyObject *exchange_call(PyObject *fallback, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (enabled && kwnames == NULL && nargs == 8 && args[6] == Py_None && args[7] == Py_None && tracing_off()) {
        PyObject *key[11] = {s_alltoall, args[0], args[1], Py_None, args[2], args[3],
                             args[4],    args[5], zero,    Py_False, Py_None};
        hr_ndarray *x = NULL;
        Warm *w = lookup(key, &x);
        if (w != NULL && w->allocate != NULL && (x->flags & NPY_C_CONTIGUOUS)) {
            PyObject *result = run_found(w, x, args[1], args[4], args[5]);
            if (result != Py_NotImplemented) return result;
            Py_DECREF(result);
        }
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_Vectorcall(fallback, args, nargsf, kwnames);
}

static PyMethodDef exchange_def = {"run", (PyCFunction)(void (*)(void))exchange_call, METH_FASTCALL | METH_KEYWORDS,
                                   "hpcring.exchange.run, with its warm NumPy all-to-alls of equal blocks run in C."};

PyDoc_STRVAR(exchange_caller_doc, "exchange_caller(run) -> run\n\nhpcring.exchange's ``run`` with its warm NumPy "
                                  "all-to-alls of equal blocks run in C in front of it (Warm's ``allocate``).");

static PyObject *exchange_caller(PyObject *self, PyObject *run) {
    if (!PyCallable_Check(run)) {
        PyErr_SetString(PyExc_TypeError, "exchange_caller takes the Python run");
        return NULL;
    }
    return PyCFunction_New(&exchange_def, run);
}

/* ---- module functions ---------------------------------------------------------------------- */

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

PyDoc_STRVAR(clock_doc, "clock() -> float\n\nThe clock the flight record's times are read from here "
                        "(CLOCK_MONOTONIC: time.perf_counter's and time.monotonic's on Linux).");

static PyObject *clock_(PyObject *self, PyObject *unused) { return PyFloat_FromDouble(now()); }

PyDoc_STRVAR(set_fallback_doc, "set_fallback(call)\n\nThe Python hpcring.engine.call that every call not "
                               "warm here goes on to.");

static PyObject *set_fallback(PyObject *self, PyObject *call) {
    if (!PyCallable_Check(call)) {
        PyErr_SetString(PyExc_TypeError, "set_fallback takes a callable");
        return NULL;
    }
    Py_INCREF(call);
    Py_XSETREF(fallback, call);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(enable_doc, "enable(on)\n\nWhether warm calls and programs run here (HPCRING_CORE; "
                         "hpcring.kernels.using switches it in tests).");

static PyObject *enable(PyObject *self, PyObject *on) {
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    enabled = v;
    Py_RETURN_NONE;
}

/* Whether this build reads ndarray fields as this NumPy lays them out: each sample is
 * (array, data address, shape, c_contiguous, writeable). */
static int check_arrays(PyObject *samples) {
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(samples); k++) {
        PyObject *a, *shape;
        unsigned long long address;
        int c_contiguous, writeable;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(samples, k), "OKO!pp", &a, &address, &PyTuple_Type, &shape,
                              &c_contiguous, &writeable))
            return -1;
        if (Py_TYPE(a) != ndarray_type) return 0;
        hr_ndarray *x = (hr_ndarray *)a;
        if ((unsigned long long)(uintptr_t)x->data != address || x->nd != PyTuple_GET_SIZE(shape)) return 0;
        for (int d = 0; d < x->nd; d++)
            if (x->dimensions[d] != PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d))) return 0;
        if (((x->flags & NPY_C_CONTIGUOUS) != 0) != c_contiguous || ((x->flags & NPY_WRITEABLE) != 0) != writeable)
            return 0;
        PyObject *dtype = PyObject_GetAttrString(a, "dtype");
        if (dtype == NULL) return -1;
        int same_descr = dtype == x->descr;
        Py_DECREF(dtype);
        if (!same_descr) return 0;
    }
    return 1;
}

PyDoc_STRVAR(setup_doc, "setup(half_nan_right, bf16_nan_right, complex_fused, combine_off, ndarray, samples, "
                        "intracomm, exception, tracing, null_tracer, slot_type, recorder_type, fallback, main_thread)"
                        "\n\nWhat the kernels measured of NumPy (hpcring.kernels), the types and objects a warm call "
                        "compares with, and the Python engine.call behind it. Returns (caller, arrays_ok).");

/* quirks and combine_off from (half_nan_right, bf16_nan_right, complex_fused, combine_off): 0, or -1 raised */
static int take_quirks(PyObject *const *argv) {
    if (!PyTuple_Check(argv[3])) {
        PyErr_SetString(PyExc_TypeError, "combine_off must be a tuple of (dtype, op) codes");
        return -1;
    }
    int flags[3];
    for (int k = 0; k < 3; k++)
        if ((flags[k] = PyObject_IsTrue(argv[k])) < 0) return -1;
    unsigned char off[HR_NDTYPES][HR_NOPS] = {{0}};
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(argv[3]); k++) {
        int dtype, op;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(argv[3], k), "ii", &dtype, &op)) return -1;
        if (dtype >= 0 && dtype < HR_NDTYPES && op >= 0 && op < HR_NOPS) off[dtype][op] = 1;
    }
    quirks.half_nan_right = flags[0];
    quirks.bf16_nan_right = flags[1];
    quirks.complex_fused = flags[2];
    memcpy(combine_off, off, sizeof off);
    return 0;
}

PyDoc_STRVAR(quirks_doc, "quirks(half_nan_right, bf16_nan_right, complex_fused, combine_off)\n\nWhat the kernels "
                         "measured of NumPy and ml_dtypes, again (bfloat16 is measured when a call first needs it).");

static PyObject *quirks_(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "quirks(half_nan_right, bf16_nan_right, complex_fused, combine_off)");
        return NULL;
    }
    if (take_quirks(argv) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *setup(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 14 || !PyTuple_Check(argv[3]) || !PyType_Check(argv[4]) || !PyList_Check(argv[5]) ||
        !PyType_Check(argv[6]) || !PyModule_Check(argv[8]) || !PyType_Check(argv[9]) || !PyType_Check(argv[10]) ||
        !PyType_Check(argv[11])) {
        PyErr_SetString(PyExc_TypeError, "setup: see its docstring");
        return NULL;
    }
    if (take_quirks(argv) < 0) return NULL;
    Py_INCREF(argv[4]);
    Py_XSETREF(ndarray_type, (PyTypeObject *)argv[4]);
    int ok = check_arrays(argv[5]);
    if (ok < 0) return NULL;
    struct_ok = ok;
    Py_INCREF(argv[6]);
    Py_XSETREF(intracomm_type, (PyTypeObject *)argv[6]);
    Py_INCREF(argv[7]);
    Py_XSETREF(mpi_exception, argv[7]);
    PyObject *globals = PyModule_GetDict(argv[8]);
    Py_INCREF(globals);
    Py_XSETREF(tracing_globals, globals);
    Py_INCREF(argv[9]);
    Py_XSETREF(null_tracer_type, (PyTypeObject *)argv[9]);
    if (member(&m_call, argv[10], s_call) < 0 || member(&m_phase, argv[10], s_phase) < 0 ||
        member(&m_start, argv[10], s_start) < 0 || member(&m_number, argv[10], s_number) < 0 ||
        member(&m_end, argv[10], s_end) < 0 || member(&m_seq, argv[11], s_seq) < 0)
        return NULL;
    Py_INCREF(argv[12]);
    Py_XSETREF(fallback, argv[12]);
    main_thread = PyLong_AsUnsignedLong(argv[13]);
    if (PyErr_Occurred()) return NULL;
    if (abandoned == NULL && (abandoned = PyList_New(0)) == NULL) return NULL;
    PyObject *call = PyCFunction_New(&caller_def, NULL);
    if (call == NULL) return NULL;
    enabled = 1;
    return Py_BuildValue("(NO)", call, struct_ok ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, setup_doc},
    {"quirks", (PyCFunction)(void (*)(void))quirks_, METH_FASTCALL, quirks_doc},
    {"agreement", agreement, METH_VARARGS, agreement_doc},
    {"waiting", waiting, METH_O, waiting_doc},
    {"combine_payload", combine_payload, METH_VARARGS, combine_payload_doc},
    {"enable", enable, METH_O, enable_doc},
    {"set_fallback", set_fallback, METH_O, set_fallback_doc},
    {"exchange_caller", exchange_caller, METH_O, exchange_caller_doc},
    {"clock", clock_, METH_NOARGS, clock_doc},
    {"comm_world", comm_world, METH_NOARGS, comm_world_doc},
    {"library_version", library_version, METH_NOARGS, library_version_doc},
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL, allreduce_doc},
    {"first_try", (PyCFunction)(void (*)(void))first_try, METH_FASTCALL, first_try_doc},
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
    "hpcring's MPI-linked core: ABI facts, step tables run in C, and warm calls (see hpcring/core.py).", -1, methods,
};

static int intern(PyObject **slot, const char *text) { return (*slot = PyUnicode_InternFromString(text)) ? 0 : -1; }

PyMODINIT_FUNC HR_CAT(PyInit_, HR_CORE_NAME)(void) {
    if (import_mpi4py() < 0) return NULL; /* mpi4py.MPI, and with it libmpi, is loaded first */
    if (intern(&s_timeout, "timeout") || intern(&s_step, "step") || intern(&s_traffic, "traffic") ||
        intern(&s_sent, "sent") || intern(&s_unknown, "unknown") || intern(&s_calls, "calls") ||
        intern(&s_finish, "finish") || intern(&s_wait, "wait") || intern(&s_seq, "seq") || intern(&s_call, "call") ||
        intern(&s_phase, "phase") || intern(&s_start, "start") || intern(&s_number, "number") ||
        intern(&s_end, "end") || intern(&s_scratch, "scratch") || intern(&s_tracer, "TRACER") ||
        intern(&s_on, "on") || intern(&s_stalled, "compiled_stalled") || intern(&s_disagreed, "compiled_disagreed") ||
        intern(&s_failed, "compiled_failed") || intern(&s_divide, "divide") || intern(&s_resolve, "resolve_timeout") ||
        intern(&s_plan_waited, "plan_waited") || intern(&s_alltoall, "alltoall") ||
        intern(&s_allreduce, "allreduce"))
        return NULL;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL) return NULL;
    WarmType.tp_methods = warm_methods;
    if (PyType_Ready(&ProgramType) < 0 || PyType_Ready(&WarmType) < 0 || PyType_Ready(&TableType) < 0 ||
        PyType_Ready(&SharedType) < 0 || PyType_Ready(&FrontType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
#ifndef HR_SOURCES_DIGEST /* what it was built from (setup.py; hpcring.stamp compares) */
#define HR_SOURCES_DIGEST ""
#endif
    if (PyModule_AddStringConstant(m, "MPI_VENDOR", HR_MPI_VENDOR) < 0 ||
        PyModule_AddStringConstant(m, "SOURCES_DIGEST", HR_SOURCES_DIGEST) < 0 ||
        PyModule_AddIntConstant(m, "COMM_SIZEOF", (long)sizeof(MPI_Comm)) < 0 ||
        PyModule_AddIntConstant(m, "MPI_VERSION", MPI_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "MPI_SUBVERSION", MPI_SUBVERSION) < 0 ||
        PyModule_AddIntConstant(m, "WIDTH", HR_WIDTH) < 0 ||
        PyModule_AddObjectRef(m, "Program", (PyObject *)&ProgramType) < 0 ||
        PyModule_AddObjectRef(m, "Warm", (PyObject *)&WarmType) < 0 ||
        PyModule_AddObjectRef(m, "Table", (PyObject *)&TableType) < 0 ||
        PyModule_AddObjectRef(m, "Shared", (PyObject *)&SharedType) < 0 ||
        PyModule_AddObjectRef(m, "Front", (PyObject *)&FrontType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
