/* A join's state, as hpcring/growth.py's send_state moves it on its first try: rank 0 packs the
 * header and the small arrays into one message for each newcomer, and each newcomer takes the next
 * message from rank 0, whatever its size, and unpacks it where it holds what this rank expects.
 * The protocol and its checks are growth.py's (its Python path is the reference); here are only
 * the packing, the messages and the bounded waits, so that a small state costs about what one
 * message does, not the Python between the calls. Included by core.c after its waits. */

/* The C-contiguous buffers of the tuple ``parts`` (writable where asked), their total bytes in
 * ``*total``; NULL with an error set. Release with release_parts. */
static Py_buffer *take_parts(PyObject *parts, int writable, Py_ssize_t *total) {
    if (!PyTuple_Check(parts)) {
        PyErr_SetString(PyExc_TypeError, "parts: a tuple of arrays");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(parts);
    Py_buffer *views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    if (views == NULL) return (Py_buffer *)PyErr_NoMemory();
    *total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(parts, k), &views[k],
                               PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
            for (Py_ssize_t j = 0; j < k; j++) PyBuffer_Release(&views[j]);
            PyMem_Free(views);
            return NULL;
        }
        *total += views[k].len;
    }
    return views;
}

static void release_parts(Py_buffer *views, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
}

/* Python's bounded wait (hpcring.growth._until), GIL released: test for 5 ms, then nap 200 us
 * between tests, up to ``seconds`` (0: no limit). 1 done, 0 timed out; an MPI error in *rc. */
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

/* The three int64 words of a preamble tuple into ``words``; -1 with an error set. */
static int preamble_words(PyObject *preamble, int64_t *words) {
    if (!PyTuple_Check(preamble) || PyTuple_GET_SIZE(preamble) != 3) {
        PyErr_SetString(PyExc_TypeError, "preamble: a tuple of 3 ints");
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        words[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(preamble, k));
        if (words[k] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

PyDoc_STRVAR(send_state_doc,
             "send_state(comm, newcomers, tag, header, preamble, small, nbytes, apart, seconds) -> bool\n\n"
             "Send each rank of ``newcomers`` (a tuple) one message: ``header``'s bytes, the 3 int64 words "
             "of ``preamble``, then the arrays of ``small`` end to end, zero-padded to ``nbytes``; then "
             "each array of ``apart`` in its own; all under ``tag``. Wait for them up to ``seconds`` (0: no "
             "limit). False when the time ran out (the caller says so; what was posted is left to "
             "finish), NotImplemented for messages past 2 GiB; MPI.Exception on an MPI error.");

static PyObject *send_state(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 9) {
        PyErr_SetString(PyExc_TypeError, "send_state takes 9 arguments");
        return NULL;
    }
    MPI_Comm *comm = PyMPIComm_Get(argv[0]);
    if (comm == NULL) return NULL;
    PyObject *dests = argv[1];
    int tag = (int)PyLong_AsLong(argv[2]);
    Py_ssize_t nbytes = PyLong_AsSsize_t(argv[6]);
    double seconds = PyFloat_AsDouble(argv[8]);
    int64_t preamble[3];
    if (PyErr_Occurred() || preamble_words(argv[4], preamble) < 0) return NULL;
    if (!PyTuple_Check(dests) || !PyTuple_Check(argv[5]) || !PyTuple_Check(argv[7])) {
        PyErr_SetString(PyExc_TypeError, "send_state: newcomers, small and apart are tuples");
        return NULL;
    }
    Py_buffer header;
    if (PyObject_GetBuffer(argv[3], &header, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t npacked = PyTuple_GET_SIZE(argv[5]), napart = PyTuple_GET_SIZE(argv[7]), total = 0, apart_total = 0;
    Py_buffer *packed = take_parts(argv[5], 0, &total);
    if (packed == NULL) return PyBuffer_Release(&header), NULL;
    Py_buffer *apart = take_parts(argv[7], 0, &apart_total);
    if (apart == NULL) return PyBuffer_Release(&header), release_parts(packed, npacked), NULL;
    Py_ssize_t lead = header.len + (Py_ssize_t)sizeof preamble;
    int fits = lead + total <= nbytes && nbytes <= INT32_MAX;
    for (Py_ssize_t k = 0; k < napart; k++) fits &= apart[k].len <= INT32_MAX;
    Py_ssize_t ndests = PyTuple_GET_SIZE(dests), nreq = ndests * (1 + napart);
    char *buf = NULL;
    MPI_Request *req = NULL;
    PyObject *result = NULL;
    if (!fits) {
        result = Py_NewRef(Py_NotImplemented); /* mpi4py's large-count calls take it */
        goto done;
    }
    /* Kept for good where a send may still read them (a timeout, an error): the job is ending. */
    buf = malloc(nbytes ? (size_t)nbytes : 1);
    req = malloc((nreq ? (size_t)nreq : 1) * sizeof(MPI_Request));
    if (buf == NULL || req == NULL) {
        free(buf);
        free(req);
        result = PyErr_NoMemory();
        goto done;
    }
    memcpy(buf, header.buf, (size_t)header.len);
    memcpy(buf + header.len, preamble, sizeof preamble);
    Py_ssize_t at = lead;
    for (Py_ssize_t k = 0; k < npacked; k++) {
        memcpy(buf + at, packed[k].buf, (size_t)packed[k].len);
        at += packed[k].len;
    }
    memset(buf + at, 0, (size_t)(nbytes - at));
    int rc = MPI_SUCCESS;
    Py_ssize_t posted = 0;
    for (Py_ssize_t d = 0; d < ndests && rc == MPI_SUCCESS; d++) {
        int dest = (int)PyLong_AsLong(PyTuple_GET_ITEM(dests, d));
        if (PyErr_Occurred()) break;
        rc = MPI_Isend(buf, (int)nbytes, MPI_BYTE, dest, tag, *comm, &req[posted++]);
        for (Py_ssize_t k = 0; k < napart && rc == MPI_SUCCESS; k++)
            rc = MPI_Isend(apart[k].buf, (int)apart[k].len, MPI_BYTE, dest, tag, *comm, &req[posted++]);
    }
    if (PyErr_Occurred()) goto done; /* a rank that is not an int: buf and req are kept (above) */
    if (rc != MPI_SUCCESS) {
        mpi_error(rc);
        goto done;
    }
    int sent = state_wait((int)posted, req, seconds, &rc);
    if (rc != MPI_SUCCESS) {
        mpi_error(rc);
        goto done;
    }
    if (sent) {
        free(buf);
        free(req);
    }
    result = PyBool_FromLong(sent);
done:
    PyBuffer_Release(&header);
    release_parts(packed, npacked);
    release_parts(apart, napart);
    return result;
}

PyDoc_STRVAR(recv_state_doc,
             "recv_state(comm, source, tag, header, preamble, small, nbytes, seconds) -> True, bytes or None\n\n"
             "Take the next message from ``source`` under ``tag`` (MPI_Improbe, whatever its size) within "
             "``seconds`` (0: no limit) for the probe and again for the receive. Where it holds ``nbytes`` "
             "with ``preamble``'s 3 int64 words after the header, unpack it into ``header`` and the arrays "
             "of ``small`` end to end and return True; else return the message as bytes, every array left "
             "as it was. None when the time ran out; MPI.Exception on an MPI error.");

static PyObject *recv_state(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 8) {
        PyErr_SetString(PyExc_TypeError, "recv_state takes 8 arguments");
        return NULL;
    }
    MPI_Comm *comm = PyMPIComm_Get(argv[0]);
    if (comm == NULL) return NULL;
    int source = (int)PyLong_AsLong(argv[1]), tag = (int)PyLong_AsLong(argv[2]);
    Py_ssize_t nbytes = PyLong_AsSsize_t(argv[6]);
    double seconds = PyFloat_AsDouble(argv[7]);
    int64_t preamble[3];
    if (PyErr_Occurred() || preamble_words(argv[4], preamble) < 0) return NULL;
    if (!PyTuple_Check(argv[5])) {
        PyErr_SetString(PyExc_TypeError, "recv_state: small is a tuple");
        return NULL;
    }
    Py_buffer header;
    if (PyObject_GetBuffer(argv[3], &header, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    Py_ssize_t npacked = PyTuple_GET_SIZE(argv[5]), total = 0;
    Py_buffer *packed = take_parts(argv[5], 1, &total);
    if (packed == NULL) return PyBuffer_Release(&header), NULL;
    Py_ssize_t lead = header.len + (Py_ssize_t)sizeof preamble;
    PyObject *result = NULL;
    if (lead + total > nbytes) {
        PyErr_SetString(PyExc_ValueError, "recv_state: nbytes is less than the header, preamble and arrays");
        goto done;
    }
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    int rc = MPI_SUCCESS, flag = 0, count = 0;
    Py_BEGIN_ALLOW_THREADS
    double began = now();
    for (;;) {
        if ((rc = MPI_Improbe(source, tag, *comm, &flag, &message, &status)) != MPI_SUCCESS || flag) break;
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
    if (rc != MPI_SUCCESS) {
        mpi_error(rc);
        goto done;
    }
    if (!flag) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* The message as it came: where it has this layout's length, a scratch buffer unpacked once
     * its preamble is checked; else the bytes returned. Kept for good where the receive may still
     * write it (a timeout, an error). */
    PyObject *raw = NULL;
    char *buf;
    if (count == nbytes) {
        buf = malloc(count ? (size_t)count : 1);
        if (buf == NULL) {
            result = PyErr_NoMemory();
            goto done;
        }
    } else {
        raw = PyBytes_FromStringAndSize(NULL, count);
        if (raw == NULL) goto done;
        buf = PyBytes_AS_STRING(raw);
    }
    MPI_Request req;
    rc = MPI_Imrecv(buf, count, MPI_BYTE, &message, &req);
    int got = rc == MPI_SUCCESS ? state_wait(1, &req, seconds, &rc) : 0;
    if (rc != MPI_SUCCESS || !got) { /* buf (raw's too) kept for good: the receive may still write it */
        result = rc != MPI_SUCCESS ? mpi_error(rc) : Py_NewRef(Py_None);
        goto done;
    }
    if (raw != NULL) {
        result = raw;
        goto done;
    }
    if (memcmp(buf + header.len, preamble, sizeof preamble) != 0) { /* another layout, or not direct */
        result = PyBytes_FromStringAndSize(buf, count);
        free(buf);
        goto done;
    }
    memcpy(header.buf, buf, (size_t)header.len);
    Py_ssize_t at = lead;
    for (Py_ssize_t k = 0; k < npacked; k++) {
        memcpy(packed[k].buf, buf + at, (size_t)packed[k].len);
        at += packed[k].len;
    }
    free(buf);
    result = Py_NewRef(Py_True);
done:
    PyBuffer_Release(&header);
    release_parts(packed, npacked);
    return result;
}
