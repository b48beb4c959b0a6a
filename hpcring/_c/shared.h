/* A plan's all-reduce through memory the ranks of one node share (hpcring.persistent.shared_plan
 * says when a plan takes it).
 *
 * A plan runs the same all-reduce on the same buffers again and again, its call agreed once. On
 * one node, the ranks need no messages for it: each writes its input into its own slot of a
 * POSIX shared-memory segment and then the run's number beside it (a release store); each reads
 * every rank's slot once every number is there (acquire loads) and reduces them in rank order,
 * so every rank gets the same bits. Two slots per rank, used by odd and even runs: a rank writes
 * run k + 2 only after its run k + 1 is complete, which every other rank started after its run k
 * was complete, reads included; so no slot is written while it is read. A rank's own input is
 * read back from its slot too: in place, the result may overwrite the input while it is reduced.
 *
 * Included by core.c (after its waiting helpers): the wait spins as the MPI waits do, then goes
 * back to Python's bounded wait (Test), which names the ranks that never started their run.
 */
#ifndef HPCRING_SHARED_H
#define HPCRING_SHARED_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HR_LINE 64 /* a slot's run number has a cache line to itself; the data starts on the next */

typedef struct {
    PyObject_HEAD
    char *base; /* the mapping (NULL once freed) */
    size_t length;
    int rank, size;
    Py_ssize_t nbytes, stride; /* the input's bytes; a slot's (its line, then the data, whole lines) */
    uint64_t run;              /* this rank's runs started */
    int started;               /* a run started and not complete */
    int freed;                 /* Free() came while a run was started: unmapped once it completes */
    int dtype, op;
    Py_ssize_t count;
    PyObject *src_obj, *dst_obj; /* the plan's arrays (kept alive: the pointers below are theirs) */
    char *src, *dst;
    PyObject *name;
} Shared;

static inline char *shared_slot(Shared *s, int rank, uint64_t run) {
    return s->base + ((size_t)rank * 2 + (size_t)(run & 1)) * (size_t)s->stride;
}

/* Run k started: this rank's input in its slot, then k beside it. */
static void shared_start(Shared *s) {
    uint64_t k = ++s->run;
    char *slot = shared_slot(s, s->rank, k);
    memcpy(slot + HR_LINE, s->src, (size_t)s->nbytes);
    __atomic_store_n((uint64_t *)slot, k, __ATOMIC_RELEASE);
    s->started = 1;
}

/* 1 where every rank's input of this run is in its slot. */
static inline int shared_ready(Shared *s) {
    for (int r = 0; r < s->size; r++)
        if (__atomic_load_n((uint64_t *)shared_slot(s, r, s->run), __ATOMIC_ACQUIRE) != s->run) return 0;
    return 1;
}

static void shared_unmap(Shared *s) {
    if (s->base != NULL) munmap(s->base, s->length);
    s->base = NULL;
}

/* The result: rank 0's input (op) rank 1's (op) ..., from the slots, into dst. */
static void shared_finish(Shared *s) {
    size_t n = (size_t)s->count;
    const char *first = shared_slot(s, 0, s->run) + HR_LINE;
    for (int r = 1; r < s->size; r++)
        hr_payload_combine3(s->dtype, s->op, r == 1 ? first : s->dst, shared_slot(s, r, s->run) + HR_LINE, s->dst, n,
                            &quirks);
    s->started = 0;
    if (s->freed) shared_unmap(s);
}

static inline void shared_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spin until the run is ready (1) or ``seconds`` pass (0), yielding the core between looks
 * where ranks outnumber cores (`sharing`, as the MPI waits do). Touches no Python. */
static int shared_spin(Shared *s, double seconds) {
    for (int i = 0; i < SHARED_TESTS; i++) {
        if (shared_ready(s)) return 1;
        shared_pause();
    }
    int share = sharing;
    double end = now() + seconds;
    for (;;) {
        for (int i = 0; i < (share ? 1 : 256); i++) {
            if (shared_ready(s)) return 1;
            shared_pause();
        }
        if (share) sched_yield();
        if (now() > end) return 0;
    }
}

static void shared_dealloc(Shared *s) {
    shared_unmap(s);
    Py_XDECREF(s->src_obj);
    Py_XDECREF(s->dst_obj);
    Py_XDECREF(s->name);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static unsigned long shared_made; /* segments this process made: part of the next name */

PyDoc_STRVAR(shared_doc,
             "Shared(name, create, size, rank, src, dst, dtype, op, count)\n\n"
             "A plan's all-reduce through a POSIX shared-memory segment (hpcring/_c/shared.h): ``create`` "
             "makes a new one (name None: a fresh name, read back from ``name``) that the others open by "
             "its name; the creator unlinks it once every rank has it open (`unlink`). ``src``, ``dst``: "
             "the plan's arrays (the same in place); ``dtype``, ``op``, ``count``: its payload "
             "descriptor (hpcring.agreement.payload_descriptor). OSError where the segment cannot be "
             "made, opened or mapped.");

static PyObject *shared_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *name_obj, *src_obj, *dst_obj;
    int create, size, rank, dtype, op;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OpiiOOiin", &name_obj, &create, &size, &rank, &src_obj, &dst_obj, &dtype, &op,
                          &count))
        return NULL;
    char *src, *dst;
    Py_ssize_t nsrc, ndst;
    if (size < 1 || rank < 0 || rank >= size || dtype < 0 || dtype >= HR_NDTYPES || count <= 0 ||
        !hr_payload_ok(dtype, op) || array_bytes(src_obj, 0, &src, &nsrc) < 0 ||
        array_bytes(dst_obj, 1, &dst, &ndst) < 0 || nsrc != ndst || nsrc != count * hr_itemsize[dtype] ||
        (name_obj != Py_None && !PyUnicode_Check(name_obj)) || (!create && name_obj == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "Shared: two C-contiguous NumPy arrays of the descriptor's bytes (dst "
                                          "writable), a payload's dtype and op, a rank of the size, a name to open");
        return NULL;
    }
    Py_ssize_t stride = HR_LINE + (nsrc + HR_LINE - 1) / HR_LINE * HR_LINE;
    size_t length = (size_t)stride * 2 * (size_t)size;
    char given[64];
    const char *name;
    if (name_obj == Py_None) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        snprintf(given, sizeof given, "/hpcring-%ld-%lu-%lx", (long)getpid(), ++shared_made,
                 (unsigned long)t.tv_nsec ^ ((unsigned long)t.tv_sec << 20));
        name = given;
    } else if ((name = PyUnicode_AsUTF8(name_obj)) == NULL) {
        return NULL;
    }
    int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
    if (fd < 0) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, name);
    struct stat st;
    int bad = create ? ftruncate(fd, (off_t)length) : fstat(fd, &st);
    if (!bad && !create && (size_t)st.st_size != length) { /* another plan's segment: not this one */
        close(fd);
        PyErr_Format(PyExc_OSError, "Shared: %s holds %zu bytes, not %zu", name, (size_t)st.st_size, length);
        return NULL;
    }
    char *base = bad ? MAP_FAILED : mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (base == MAP_FAILED) {
        if (create) shm_unlink(name);
        errno = err;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, name);
    }
    Shared *s = (Shared *)type->tp_alloc(type, 0);
    if (s == NULL) {
        munmap(base, length);
        if (create) shm_unlink(name);
        return NULL;
    }
    s->base = base, s->length = length, s->rank = rank, s->size = size, s->nbytes = nsrc, s->stride = stride;
    s->dtype = dtype, s->op = op, s->count = count, s->src = src, s->dst = dst;
    s->src_obj = Py_NewRef(src_obj);
    s->dst_obj = Py_NewRef(dst_obj);
    if ((s->name = PyUnicode_FromString(name)) == NULL) {
        if (create) shm_unlink(name);
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

static int shared_usable(Shared *s) {
    if (s->base != NULL && !s->freed) return 1;
    PyErr_SetString(PyExc_RuntimeError, "hpcring.plan: this plan was freed");
    return 0;
}

/* A run started (`shared_start`) where the plan is neither freed nor started already: 0, or -1
 * raised. What `Start` and the compiled run (core.c's run_shared) both begin with. */
static int shared_begin(Shared *s) {
    if (!shared_usable(s)) return -1;
    if (s->started) {
        PyErr_SetString(PyExc_RuntimeError, "hpcring.plan: started twice without a wait in between");
        return -1;
    }
    shared_start(s);
    return 0;
}

/* MPI.Prequest's names, which the plan and its bounded wait call (hpcring.persistent.Plan). */
static PyObject *shared_start_method(Shared *s, PyObject *unused) {
    if (shared_begin(s) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *shared_test_method(Shared *s, PyObject *unused) {
    if (!shared_usable(s)) return NULL;
    if (s->started && !shared_ready(s)) Py_RETURN_FALSE;
    if (s->started) shared_finish(s);
    Py_RETURN_TRUE;
}

static PyObject *shared_free_method(Shared *s, PyObject *unused) {
    s->freed = 1;
    if (!s->started) shared_unmap(s); /* else a run may be reading it (another thread): at its end */
    Py_RETURN_NONE;
}

static PyObject *shared_unlink_method(Shared *s, PyObject *unused) {
    const char *name = PyUnicode_AsUTF8(s->name);
    if (name == NULL) return NULL;
    if (shm_unlink(name) < 0 && errno != ENOENT) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, name);
    Py_RETURN_NONE;
}

static PyObject *shared_get_name(Shared *s, void *unused) { return Py_NewRef(s->name); }

static PyObject *shared_get_self(Shared *s, void *unused) { return Py_NewRef((PyObject *)s); }

static PyObject *shared_get_descriptor(Shared *s, void *unused) {
    return Py_BuildValue("(iin)", -1, -1, (Py_ssize_t)0); /* its data rides with no agreement */
}

static PyMethodDef shared_methods[] = {
    {"Start", (PyCFunction)shared_start_method, METH_NOARGS, "Start a run: this rank's input into its slot."},
    {"Test", (PyCFunction)shared_test_method, METH_NOARGS,
     "Whether the run is complete: where every rank's input is there, the result is made now."},
    {"Free", (PyCFunction)shared_free_method, METH_NOARGS, "Unmap the segment (this rank's; no collective)."},
    {"unlink", (PyCFunction)shared_unlink_method, METH_NOARGS,
     "Remove the segment's name (its creator, once every rank has it open)."},
    {NULL},
};

static PyGetSetDef shared_getset[] = {
    {"name", (getter)shared_get_name, NULL, "the segment's name", NULL},
    {"program", (getter)shared_get_self, NULL, "what the compiled plan runs: itself", NULL},
    {"descriptor", (getter)shared_get_descriptor, NULL, "no payload rides with an agreement", NULL},
    {NULL},
};

static PyTypeObject SharedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcring._core.Shared",
    .tp_basicsize = sizeof(Shared),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = shared_doc,
    .tp_new = shared_new,
    .tp_dealloc = (destructor)shared_dealloc,
    .tp_methods = shared_methods,
    .tp_getset = shared_getset,
};

#endif
