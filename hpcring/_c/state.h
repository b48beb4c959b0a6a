/* A join's first try at sending the state (hpcring/growth.py's send_state), whole, in one call per
 * rank: the plan of the state (which arrays travel packed, which apart, and the layout's
 * checksum), rank 0's messages to the newcomers, a newcomer's receive and unpacking where the
 * message is its own layout's. The protocol, the checksum and the checks are growth.py's, whose
 * Python path is the reference; here they run without the Python between the calls, which cost a
 * small state as much again as its message. Included by core.c after its waits. */

/* The state's plan: ``direct`` where every array is a C-contiguous NumPy array (else nothing
 * is taken and the state goes by growth.transfer), their buffers (format and shape), the
 * checksum of the layout (growth._layout: FNV-1a 64 over each array's format, a NUL, and its
 * itemsize, ndim and shape as little-endian int64), the packed arrays' bytes and the count of
 * those sent apart (PACK_BELOW bytes and more). */
typedef struct {
    Py_buffer *views;
    Py_ssize_t n, packed, apart, below;
    int direct;
    int64_t layout;
} hr_plan;

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fnv(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t k = 0; k < len; k++) h = (h ^ p[k]) * FNV_PRIME;
    return h;
}

static uint64_t fnv_word(uint64_t h, int64_t word) {
    unsigned char le[8];
    for (int k = 0; k < 8; k++) le[k] = (unsigned char)((uint64_t)word >> (8 * k));
    return fnv(h, le, 8);
}

static void plan_release(hr_plan *p) {
    for (Py_ssize_t k = 0; k < p->n; k++) PyBuffer_Release(&p->views[k]);
    PyMem_Free(p->views);
    p->views = NULL;
    p->n = 0;
}

/* 0, or -1 with an error set (not a sequence, no memory). */
static int plan_state(PyObject *state, Py_ssize_t below, hr_plan *p) {
    PyObject *seq = PySequence_Fast(state, "the state: a sequence of arrays");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    *p = (hr_plan){NULL, 0, 0, 0, below, 1, 0};
    if ((p->views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer))) == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    uint64_t h = FNV_OFFSET;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *a = PySequence_Fast_GET_ITEM(seq, k);
        Py_buffer *v = &p->views[k];
        if (Py_TYPE(a) != ndarray_type || PyObject_GetBuffer(a, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear(); /* another type, a strided array, a dtype without a buffer format */
            p->direct = 0;
            break;
        }
        p->n = k + 1;
        const char *format = v->format != NULL ? v->format : "B";
        h = fnv(h, format, strlen(format) + 1);
        h = fnv_word(fnv_word(h, v->itemsize), v->ndim);
        for (int d = 0; d < v->ndim; d++) h = fnv_word(h, v->shape[d]);
        if (v->len < below)
            p->packed += v->len;
        else
            p->apart++;
    }
    Py_DECREF(seq);
    if (!p->direct) {
        plan_release(p);
        *p = (hr_plan){NULL, 0, 0, 0, below, 0, 0};
    }
    p->layout = p->direct ? (int64_t)h : 0;
    return 0;
}

/* Python's bounded wait (growth._until), GIL released: test for 5 ms, then nap 200 us between
 * tests, up to ``seconds`` (0: no limit). 1 done, 0 timed out; an MPI error in *rc. */
static int state_wait(int n, MPI_Request *req, double seconds, int *rc) {
    int done = 0;
    *rc = MPI_SUCCESS;
    Py_BEGIN_ALLOW_THREADS
    double end = now() + seconds;
    done = spin_n(n, req, 0.005, 0, rc);
    while (!done && *rc == MPI_SUCCESS && (seconds <= 0 || now() < end)) done = spin_n(n, req, 0.05, 200000L, rc);
    Py_END_ALLOW_THREADS
    return done;
}

/* Rank 0: the first message (the header, the preamble, the packed arrays, zero-padded to
 * ``nbytes``) and then each array sent apart, to each rank in [first, stop). True sent, False
 * timed out, NotImplemented past 2 GiB (mpi4py's large-count calls take it); NULL raised. */
static PyObject *state_send(MPI_Comm comm, const Py_buffer *header, const int64_t *preamble, hr_plan *p,
                            Py_ssize_t nbytes, int first, int stop, int tag, double seconds) {
    for (Py_ssize_t k = 0; k < p->n; k++) /* the first message's own size: first_try checked it */
        if (p->views[k].len > INT32_MAX) return Py_NewRef(Py_NotImplemented);
    int ndests = stop > first ? stop - first : 0;
    size_t nreq = (size_t)ndests * (size_t)(1 + p->apart);
    /* Kept for good where a send may still read them (a timeout, an error): the job is ending. */
    char *buf = malloc(nbytes ? (size_t)nbytes : 1);
    MPI_Request *req = malloc((nreq ? nreq : 1) * sizeof(MPI_Request));
    if (buf == NULL || req == NULL) {
        free(buf);
        free(req);
        return PyErr_NoMemory();
    }
    memcpy(buf, header->buf, (size_t)header->len);
    memcpy(buf + header->len, preamble, 3 * sizeof(int64_t));
    Py_ssize_t at = header->len + 3 * (Py_ssize_t)sizeof(int64_t);
    for (Py_ssize_t k = 0; k < p->n; k++) {
        if (p->views[k].len >= p->below) continue;
        memcpy(buf + at, p->views[k].buf, (size_t)p->views[k].len);
        at += p->views[k].len;
    }
    memset(buf + at, 0, (size_t)(nbytes - at));
    int rc = MPI_SUCCESS, posted = 0;
    for (int dest = first; dest < stop && rc == MPI_SUCCESS; dest++) {
        rc = MPI_Isend(buf, (int)nbytes, MPI_BYTE, dest, tag, comm, &req[posted++]);
        for (Py_ssize_t k = 0; k < p->n && rc == MPI_SUCCESS; k++)
            if (p->views[k].len >= p->below)
                rc = MPI_Isend(p->views[k].buf, (int)p->views[k].len, MPI_BYTE, dest, tag, comm, &req[posted++]);
    }
    int sent = rc == MPI_SUCCESS ? state_wait(posted, req, seconds, &rc) : 0;
    if (rc != MPI_SUCCESS) return mpi_error(rc);
    if (sent) {
        free(buf);
        free(req);
    }
    return PyBool_FromLong(sent);
}

/* A newcomer: the next message from rank 0 under ``tag``, whatever its size, within ``seconds``
 * for the probe and again for the receive. Where it holds ``nbytes`` and ``preamble`` after the
 * header, the header and the packed arrays are unpacked into ``header`` and the state, and the
 * arrays sent apart are returned (a tuple, for the caller to receive); else the message as bytes,
 * every array as it was. None timed out; NULL raised. */
static PyObject *state_receive(MPI_Comm comm, PyObject *state, Py_buffer *header, const int64_t *preamble,
                               hr_plan *p, Py_ssize_t nbytes, int tag, double seconds) {
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    int rc = MPI_SUCCESS, flag = 0, count = 0;
    Py_BEGIN_ALLOW_THREADS
    double began = now();
    for (;;) {
        if ((rc = MPI_Improbe(0, tag, comm, &flag, &message, &status)) != MPI_SUCCESS || flag) break;
        double waited = now() - began;
        if (seconds > 0 && waited > seconds) break;
        if (waited > 0.005) {
            struct timespec t = {0, 200000L};
            nanosleep(&t, NULL);
        } else if (sharing) {
            sched_yield();
        }
    }
    if (rc == MPI_SUCCESS && flag) rc = MPI_Get_count(&status, MPI_BYTE, &count);
    Py_END_ALLOW_THREADS
    if (rc != MPI_SUCCESS) return mpi_error(rc);
    if (!flag) return Py_NewRef(Py_None);
    if (count == MPI_UNDEFINED || count < 0) { /* past 2 GiB, where this rank's own is not (first_try) */
        PyErr_SetString(PyExc_ValueError, "hpcring.elastic: rank 0's first message holds more than 2 GiB, "
                                          "this newcomer's state less: the states differ");
        return NULL;
    }
    /* Where it has this layout's length, a scratch buffer unpacked once its preamble is checked;
     * else the bytes returned. Kept for good where the receive may still write it. */
    PyObject *raw = NULL;
    char *buf;
    if (count == nbytes) {
        if ((buf = malloc(count ? (size_t)count : 1)) == NULL) return PyErr_NoMemory();
    } else {
        if ((raw = PyBytes_FromStringAndSize(NULL, count)) == NULL) return NULL;
        buf = PyBytes_AS_STRING(raw);
    }
    MPI_Request req;
    rc = MPI_Imrecv(buf, count, MPI_BYTE, &message, &req);
    int got = rc == MPI_SUCCESS ? state_wait(1, &req, seconds, &rc) : 0;
    if (rc != MPI_SUCCESS) return mpi_error(rc);
    if (!got) return Py_NewRef(Py_None);
    if (raw != NULL) return raw;
    if (!p->direct || memcmp(buf + header->len, preamble, 3 * sizeof(int64_t)) != 0) {
        raw = PyBytes_FromStringAndSize(buf, count); /* another layout, or rank 0's is not direct */
        free(buf);
        return raw;
    }
    for (Py_ssize_t k = 0; k < p->n; k++) {
        if (p->views[k].readonly) {
            free(buf);
            PyErr_SetString(PyExc_ValueError, "hpcring.elastic: a newcomer's state holds a read-only array");
            return NULL;
        }
    }
    PyObject *apart = PyTuple_New(p->apart), *seq = PySequence_Fast(state, "the state");
    if (apart == NULL || seq == NULL) {
        Py_XDECREF(apart);
        Py_XDECREF(seq);
        free(buf);
        return NULL;
    }
    memcpy(header->buf, buf, (size_t)header->len);
    Py_ssize_t at = header->len + 3 * (Py_ssize_t)sizeof(int64_t), j = 0;
    for (Py_ssize_t k = 0; k < p->n; k++) {
        if (p->views[k].len >= p->below) {
            PyTuple_SET_ITEM(apart, j++, Py_NewRef(PySequence_Fast_GET_ITEM(seq, k)));
            continue;
        }
        memcpy(p->views[k].buf, buf + at, (size_t)p->views[k].len);
        at += p->views[k].len;
    }
    Py_DECREF(seq);
    free(buf);
    return apart;
}

PyDoc_STRVAR(first_try_doc,
             "first_try(comm, state, header, first, stop, below, tag, seconds)\n\n"
             "growth.send_state's first message on this rank of ``comm`` (hpcring's duplicate), the "
             "newcomers being ranks [first, stop), arrays of ``below`` bytes and more sent apart, within "
             "``seconds`` (0: no limit) per wait. Rank 0 sends, and returns whether its state went "
             "directly (False: it said it goes by growth.transfer); a newcomer returns the arrays to "
             "receive apart (a tuple: the header and the packed arrays are rank 0's now), the message as "
             "bytes where it is not its layout's (every array as it was); any other rank returns whether "
             "its state would go directly. None: the time ran out. NotImplemented: past 2 GiB, or an "
             "argument this path does not take (the Python path runs). MPI.Exception on an MPI error.");

static PyObject *first_try(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 8) {
        PyErr_SetString(PyExc_TypeError, "first_try takes 8 arguments");
        return NULL;
    }
    MPI_Comm *comm = PyMPIComm_Get(argv[0]);
    if (comm == NULL) return NULL;
    int first = (int)PyLong_AsLong(argv[3]), stop = (int)PyLong_AsLong(argv[4]), tag = (int)PyLong_AsLong(argv[6]);
    Py_ssize_t below = PyLong_AsSsize_t(argv[5]);
    double seconds = PyFloat_AsDouble(argv[7]);
    if (PyErr_Occurred()) return NULL;
    int rank, rc = MPI_Comm_rank(*comm, &rank);
    if (rc != MPI_SUCCESS) return mpi_error(rc);
    hr_plan p;
    if (plan_state(argv[1], below, &p) < 0) return NULL;
    int newcomer = rank >= first && rank < stop;
    if (rank != 0 && !newcomer) {
        plan_release(&p);
        return PyBool_FromLong(p.direct);
    }
    Py_buffer header;
    if (PyObject_GetBuffer(argv[2], &header, PyBUF_C_CONTIGUOUS | (newcomer ? PyBUF_WRITABLE : 0)) < 0) {
        plan_release(&p);
        return NULL;
    }
    PyObject *result;
    Py_ssize_t nbytes = header.len + 3 * (Py_ssize_t)sizeof(int64_t) + (p.packed + 7) / 8 * 8;
    if (header.len % 8 || nbytes > INT32_MAX) { /* mpi4py's large-count calls, on both sides alike */
        result = Py_NewRef(Py_NotImplemented);
    } else {
        if (rank == 0) {
            int64_t preamble[3] = {p.direct, p.layout, p.apart};
            result = state_send(*comm, &header, preamble, &p, nbytes, first, stop, tag, seconds);
            if (result == Py_True && !p.direct) Py_SETREF(result, Py_NewRef(Py_False));
        } else {
            int64_t preamble[3] = {1, p.layout, p.apart}; /* what a direct send of this layout says */
            result = state_receive(*comm, argv[1], &header, preamble, &p, nbytes, tag, seconds);
        }
    }
    PyBuffer_Release(&header);
    plan_release(&p);
    return result;
}
