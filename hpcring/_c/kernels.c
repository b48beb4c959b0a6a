/* hpcring._kernels: the element kernels, compiled, with no MPI in them (so no MPI ABI to match).
 *
 * Every entry point takes NumPy arrays and returns True when it did the work, False when the
 * arrays are not its case (another type, dtype, layout, a partial overlap...): the caller then
 * runs its NumPy code, the reference these kernels match bit for bit. Arrays are read through
 * the buffer protocol, so building this needs no NumPy headers; `setup` hands over numpy.ndarray
 * and the dtype objects once. Large arrays are converted with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "exact.h"
#include "reduce.h"
#include "wire.h"

#define HR_NOGIL_BYTES (1 << 16) /* below this, taking the GIL back costs more than it frees */

static PyTypeObject *ndarray_type;        /* numpy.ndarray, from setup() */
static PyObject *dtypes[HR_NDTYPES];      /* the dtype objects, in enum hr_dtype's order */
static hr_quirks quirks;
static unsigned char combine_off[HR_NDTYPES][HR_NOPS]; /* failed the self-test at load: NumPy's */
static PyObject *str_dtype, *str_add, *str_maximum, *str_minimum, *str_multiply;

typedef struct {
    int held;
    int dtype;
    size_t n;
    Py_buffer view;
} arg;

static void release(arg *a) {
    if (a->held) PyBuffer_Release(&a->view);
    a->held = 0;
}

static int dtype_code(PyObject *dt) {
    for (int k = 0; k < HR_NDTYPES; k++)
        if (dt == dtypes[k]) return k;
    for (int k = 0; k < HR_NDTYPES; k++) { /* an equal dtype that is not the singleton */
        int eq = PyObject_RichCompareBool(dt, dtypes[k], Py_EQ);
        if (eq < 0) PyErr_Clear();
        if (eq > 0) return k;
    }
    return -1;
}

/* 1: ``obj`` is an aligned C-contiguous numpy.ndarray of a known dtype (writable where asked), held in
 * ``a``; 0: it is not (no error set). */
static int take(PyObject *obj, int writable, arg *a) {
    a->held = 0;
    if (ndarray_type == NULL || Py_TYPE(obj) != ndarray_type) return 0;
    PyObject *dt = PyObject_GetAttr(obj, str_dtype);
    if (dt == NULL) { PyErr_Clear(); return 0; }
    a->dtype = dtype_code(dt);
    Py_DECREF(dt);
    if (a->dtype < 0) return 0;
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return 0;
    }
    a->held = 1;
    /* a misaligned array (a view at an odd byte offset) is NumPy's: C loads assume alignment */
    size_t align = hr_itemsize[a->dtype] < 8 ? (size_t)hr_itemsize[a->dtype] : 8;
    if (a->view.itemsize != hr_itemsize[a->dtype] || (uintptr_t)a->view.buf % align != 0) {
        release(a);
        return 0;
    }
    a->n = (size_t)(a->view.len / a->view.itemsize);
    return 1;
}

static int same_shape(const arg *x, const arg *y) {
    if (x->view.ndim != y->view.ndim) return 0;
    for (int d = 0; d < x->view.ndim; d++)
        if (x->view.shape[d] != y->view.shape[d]) return 0;
    return 1;
}

/* ``out`` is ``in`` or lies apart from it: an element-wise loop then reads each input element
 * before it writes there. (NumPy copies a partially overlapping input first: not our case.) */
static int apart_or_same(const arg *out, const arg *in) {
    const char *o = out->view.buf, *i = in->view.buf;
    if (o == i && out->view.len == in->view.len) return 1;
    return o + out->view.len <= i || i + in->view.len <= o || out->view.len == 0 || in->view.len == 0;
}

#define NOGIL_IF(bytes, statement)                                                                \
    do {                                                                                          \
        if ((bytes) >= HR_NOGIL_BYTES) {                                                          \
            Py_BEGIN_ALLOW_THREADS statement; Py_END_ALLOW_THREADS                                \
        } else {                                                                                  \
            statement;                                                                            \
        }                                                                                         \
    } while (0)

static PyObject *done(int ok, arg *args, int count) {
    for (int k = 0; k < count; k++) release(&args[k]);
    if (ok) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static int op_code(PyObject *name) {
    if (name == str_add) return HR_SUM;
    if (name == str_maximum) return HR_MAX;
    if (name == str_minimum) return HR_MIN;
    if (name == str_multiply) return HR_PROD;
    if (!PyUnicode_Check(name)) return -1;
    if (PyUnicode_Compare(name, str_add) == 0) return HR_SUM;
    if (PyUnicode_Compare(name, str_maximum) == 0) return HR_MAX;
    if (PyUnicode_Compare(name, str_minimum) == 0) return HR_MIN;
    if (PyUnicode_Compare(name, str_multiply) == 0) return HR_PROD;
    return -1;
}

PyDoc_STRVAR(combine_doc, "combine(ufunc, left, right, out) -> bool\n\n"
                          "out <- ufunc(left, right) (add, maximum, minimum, multiply), bitwise NumPy's.");

static PyObject *combine(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "combine(ufunc, left, right, out) takes 4 arguments");
        return NULL;
    }
    arg a[3] = {{0}};
    int op = op_code(argv[0]);
    if (op < 0 || !take(argv[1], 0, &a[0]) || !take(argv[2], 0, &a[1]) || !take(argv[3], 1, &a[2]))
        return done(0, a, 3);
    int dtype = a[0].dtype;
    if (a[1].dtype != dtype || a[2].dtype != dtype || !same_shape(&a[0], &a[1]) || !same_shape(&a[0], &a[2]) ||
        !apart_or_same(&a[2], &a[0]) || !apart_or_same(&a[2], &a[1]))
        return done(0, a, 3);
    if (dtype == HR_U8 || dtype == HR_U16 || ((dtype == HR_C64 || dtype == HR_C128) && (op == HR_MAX || op == HR_MIN)) ||
        combine_off[dtype][op])
        return done(0, a, 3); /* NumPy's business: unsigned words, an ordering of complex numbers */
    const void *l = a[0].view.buf, *r = a[1].view.buf;
    void *o = a[2].view.buf;
    size_t n = a[0].n;
    NOGIL_IF(a[0].view.len, hr_combine(dtype, op, l, r, o, n, &quirks));
    return done(1, a, 3);
}

PyDoc_STRVAR(narrow_doc, "narrow(src, out, on_grid) -> bool\n\nout (bfloat16/float16) <- src (float32/float64), rounded "
                         "as wire.narrow rounds.");

static PyObject *narrow(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "narrow(src, out, on_grid) takes 3 arguments");
        return NULL;
    }
    arg a[2] = {{0}};
    int on_grid = PyObject_IsTrue(argv[2]);
    if (on_grid < 0) return NULL;
    if (!take(argv[0], 0, &a[0]) || !take(argv[1], 1, &a[1]) || a[0].n != a[1].n || !apart_or_same(&a[1], &a[0]) ||
        a[0].view.buf == a[1].view.buf)
        return done(0, a, 2);
    int from = a[0].dtype, to = a[1].dtype, rc = 0;
    const void *s = a[0].view.buf;
    void *o = a[1].view.buf;
    size_t n = a[0].n;
    if (!((from == HR_F32 || from == HR_F64) && (to == HR_BF16 || to == HR_F16))) return done(0, a, 2);
    NOGIL_IF(a[0].view.len, rc = hr_narrow(from, to, s, o, n, on_grid));
    return done(rc == 0, a, 2);
}

PyDoc_STRVAR(widen_doc, "widen(src, out) -> bool\n\nout (float32/float64) <- src (bfloat16/float16), exactly.");

static PyObject *widen(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 2) {
        PyErr_SetString(PyExc_TypeError, "widen(src, out) takes 2 arguments");
        return NULL;
    }
    arg a[2] = {{0}};
    if (!take(argv[0], 0, &a[0]) || !take(argv[1], 1, &a[1]) || a[0].n != a[1].n || !apart_or_same(&a[1], &a[0]) ||
        a[0].view.buf == a[1].view.buf)
        return done(0, a, 2);
    int from = a[0].dtype, to = a[1].dtype, rc = 0;
    const void *s = a[0].view.buf;
    void *o = a[1].view.buf;
    size_t n = a[0].n;
    if (!((from == HR_BF16 || from == HR_F16) && (to == HR_F32 || to == HR_F64))) return done(0, a, 2);
    NOGIL_IF(a[1].view.len, rc = hr_widen(from, to, s, o, n));
    return done(rc == 0, a, 2);
}

PyDoc_STRVAR(round_trip_doc, "round_trip(array, scratch) -> bool\n\narray <- widen(narrow(array)) in place, to scratch's "
                             "dtype and back (scratch itself untouched).");

static PyObject *round_trip(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 2) {
        PyErr_SetString(PyExc_TypeError, "round_trip(array, scratch) takes 2 arguments");
        return NULL;
    }
    arg a = {0, 0, 0, {0}};
    if (ndarray_type == NULL || Py_TYPE(argv[1]) != ndarray_type) Py_RETURN_FALSE;
    PyObject *dt = PyObject_GetAttr(argv[1], str_dtype);
    if (dt == NULL) { PyErr_Clear(); Py_RETURN_FALSE; }
    int wire = dtype_code(dt);
    Py_DECREF(dt);
    if ((wire != HR_BF16 && wire != HR_F16) || !take(argv[0], 1, &a)) return done(0, &a, 1);
    int dtype = a.dtype, rc = 0;
    void *p = a.view.buf;
    size_t n = a.n;
    if (dtype != HR_F32 && dtype != HR_F64) return done(0, &a, 1);
    NOGIL_IF(a.view.len, rc = hr_round_trip(dtype, wire, p, n));
    return done(rc == 0, &a, 1);
}

/* The reproducible sum's arrays: x (a float format), its codes (uint8; uint16 for float64). */
static int exact_format(const arg *x, const arg *code, hr_format *f) {
    if (hr_format_of(x->dtype, f) < 0) return 0;
    return code->dtype == (f->words == 1 ? HR_U8 : HR_U16) && code->n == x->n;
}

/* Words for ``n`` elements of format ``f``: int64 (or float64: the same 8 bytes) arrays of n x words,
 * apart from the arrays in ``others`` (count of them). */
static int words_of(const arg *w, const hr_format *f, size_t n, const arg *others, int count) {
    if ((w->dtype != HR_I64 && w->dtype != HR_F64) || w->n != (size_t)f->words * n) return 0;
    for (int k = 0; k < count; k++)
        if (!apart_or_same(w, &others[k]) || (w->view.buf == others[k].view.buf && w->view.len && others[k].view.len))
            return 0;
    return 1;
}

PyDoc_STRVAR(codes_doc, "codes(x, into, out) -> bool\n\nout <- exact.codes of x (max with ``into`` where not None).");

static PyObject *codes(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "codes(x, into, out) takes 3 arguments");
        return NULL;
    }
    arg a[3] = {{0}};
    hr_format f;
    int into = argv[1] != Py_None;
    if (!take(argv[0], 0, &a[0]) || !take(argv[2], 1, &a[2]) || !exact_format(&a[0], &a[2], &f) ||
        !apart_or_same(&a[2], &a[0]) || a[0].view.buf == a[2].view.buf)
        return done(0, a, 3);
    if (into && (!take(argv[1], 0, &a[1]) || a[1].dtype != a[2].dtype || a[1].n != a[2].n ||
                 !apart_or_same(&a[2], &a[1])))
        return done(0, a, 3);
    int dtype = a[0].dtype;
    const void *x = a[0].view.buf, *in = into ? a[1].view.buf : NULL;
    void *o = a[2].view.buf;
    size_t n = a[0].n;
    NOGIL_IF(a[0].view.len, hr_codes(dtype, &f, x, in, o, n));
    return done(1, a, 3);
}

PyDoc_STRVAR(encode_doc, "encode(x, code, into, words, floats) -> bool\n\nexact.encode: words (n x fmt.words 8-byte "
                         "words) <- x's fixed point on code's grid, plus ``into``'s words where not None.");

static PyObject *encode(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 5) {
        PyErr_SetString(PyExc_TypeError, "encode(x, code, into, words, floats) takes 5 arguments");
        return NULL;
    }
    arg a[4] = {{0}};
    hr_format f;
    int floats = PyObject_IsTrue(argv[4]), into = argv[2] != Py_None;
    if (floats < 0) return NULL;
    if (!take(argv[0], 0, &a[0]) || !take(argv[1], 0, &a[1]) || !take(argv[3], 1, &a[3]) ||
        !exact_format(&a[0], &a[1], &f) || !words_of(&a[3], &f, a[0].n, a, 2))
        return done(0, a, 4);
    if (into && (!take(argv[2], 0, &a[2]) || !words_of(&a[2], &f, a[0].n, a, 2) || !apart_or_same(&a[3], &a[2])))
        return done(0, a, 4);
    int dtype = a[0].dtype;
    const void *x = a[0].view.buf, *c = a[1].view.buf;
    const int64_t *in = into ? a[2].view.buf : NULL;
    int64_t *w = a[3].view.buf;
    size_t n = a[0].n;
    NOGIL_IF(a[3].view.len, hr_encode(dtype, &f, x, c, in, w, n, floats));
    return done(1, a, 4);
}

PyDoc_STRVAR(decode_doc, "decode(words, x, code, out, divisor, terms, floats) -> bool\n\nexact.decode (terms: None or "
                         "an int): out <- the words (plus x's fixed point, where x is not None) rounded once; the "
                         "words are only read.");

static PyObject *decode(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 7) {
        PyErr_SetString(PyExc_TypeError, "decode(words, x, code, out, divisor, terms, floats) takes 7 arguments");
        return NULL;
    }
    arg a[4] = {{0}};
    hr_format f;
    int floats = PyObject_IsTrue(argv[6]), mine = argv[1] != Py_None;
    if (floats < 0) return NULL;
    int overflow = 0;
    long long divisor = PyLong_Check(argv[4]) ? PyLong_AsLongLongAndOverflow(argv[4], &overflow) : 0;
    if (divisor == -1 && PyErr_Occurred()) return NULL;
    long long terms = -1;
    if (argv[5] != Py_None) {
        terms = PyLong_Check(argv[5]) ? PyLong_AsLongLongAndOverflow(argv[5], &overflow) : -1;
        if (terms == -1 && PyErr_Occurred()) return NULL;
        if (terms < 0) Py_RETURN_FALSE;
    }
    if (overflow || divisor < 1 || divisor > ((long long)1 << 53)) Py_RETURN_FALSE;
    if (!take(argv[0], 0, &a[0]) || !take(argv[2], 0, &a[2]) || !take(argv[3], 1, &a[3]) ||
        !exact_format(&a[3], &a[2], &f) || !words_of(&a[0], &f, a[3].n, a + 2, 2))
        return done(0, a, 4);
    if (mine && (!take(argv[1], 0, &a[1]) || a[1].dtype != a[3].dtype || a[1].n != a[3].n ||
                 !apart_or_same(&a[3], &a[1])))
        return done(0, a, 4);
    if (!apart_or_same(&a[3], &a[2]) || a[3].view.buf == a[2].view.buf) return done(0, a, 4);
    int dtype = a[3].dtype;
    const int64_t *w = a[0].view.buf;
    const void *x = mine ? a[1].view.buf : NULL, *c = a[2].view.buf;
    void *o = a[3].view.buf;
    size_t n = a[3].n;
    int mode = hr_decode_mode(&f, mine ? NULL : w, n, (int64_t)terms, floats);
    NOGIL_IF(a[0].view.len, hr_decode(dtype, &f, w, x, c, o, n, divisor, mode));
    return done(1, a, 4);
}

PyDoc_STRVAR(gather_doc, "gather(own, rows, stride, others, out, divisor) -> bool\n\nout <- the reproducible sum "
                         "(mean: divided by divisor) of own and ``others`` rows of ``rows`` (row k from k x stride "
                         "elements on), float words: exact.py's codes, encode and decode in turn.");

static PyObject *gather(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 6) {
        PyErr_SetString(PyExc_TypeError, "gather(own, rows, stride, others, out, divisor) takes 6 arguments");
        return NULL;
    }
    arg a[3] = {{0}};
    hr_format f;
    long long stride = PyLong_Check(argv[2]) ? PyLong_AsLongLong(argv[2]) : -1;
    long long others = PyLong_Check(argv[3]) ? PyLong_AsLongLong(argv[3]) : -1;
    long long divisor = PyLong_Check(argv[5]) ? PyLong_AsLongLong(argv[5]) : -1;
    if ((stride == -1 || others == -1 || divisor == -1) && PyErr_Occurred()) return NULL;
    if (divisor < 1 || divisor > ((long long)1 << 53) || others < 1 || others >= HR_GATHER_MOST) Py_RETURN_FALSE;
    if (!take(argv[0], 0, &a[0]) || !take(argv[1], 0, &a[1]) || !take(argv[4], 1, &a[2]) ||
        a[0].dtype != a[2].dtype || a[1].dtype != a[2].dtype || a[0].n != a[2].n || hr_format_of(a[2].dtype, &f) < 0 ||
        !apart_or_same(&a[2], &a[0]) || !apart_or_same(&a[2], &a[1]) || a[2].view.buf == a[1].view.buf)
        return done(0, a, 3);
    size_t n = a[2].n;
    if (stride < (long long)n || (long long)a[1].n < (others - 1) * stride + (long long)n) return done(0, a, 3);
    int rc = 0, dtype = a[2].dtype;
    NOGIL_IF(a[1].view.len, rc = hr_gather(dtype, &f, a[0].view.buf, a[1].view.buf, (size_t)stride, (int)others,
                                           a[2].view.buf, n, divisor));
    return done(rc == 0, a, 3);
}

PyDoc_STRVAR(widen_add_doc, "widen_add(wire, other, out, wire_left) -> bool\n\nout <- widen(wire) + other (wire_left) "
                            "or other + widen(wire), bitwise wire.widen then the sum.");

static PyObject *widen_add(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "widen_add(wire, other, out, wire_left) takes 4 arguments");
        return NULL;
    }
    arg a[3] = {{0}};
    int left = PyObject_IsTrue(argv[3]), rc = 0;
    if (left < 0) return NULL;
    if (!take(argv[0], 0, &a[0]) || !take(argv[1], 0, &a[1]) || !take(argv[2], 1, &a[2]) || a[0].n != a[2].n ||
        a[1].n != a[2].n || a[1].dtype != a[2].dtype || !apart_or_same(&a[2], &a[1]) || !apart_or_same(&a[2], &a[0]) ||
        a[2].view.buf == a[0].view.buf)
        return done(0, a, 3);
    int from = a[0].dtype, to = a[2].dtype;
    if (!((from == HR_BF16 || from == HR_F16) && (to == HR_F32 || to == HR_F64))) return done(0, a, 3);
    const void *s = a[0].view.buf, *other = a[1].view.buf;
    void *o = a[2].view.buf;
    size_t n = a[2].n;
    NOGIL_IF(a[2].view.len, rc = hr_widen_add(from, to, s, other, o, n, left ? HR_WIDE_LEFT : 0, NULL));
    return done(rc == 0, a, 3);
}

PyDoc_STRVAR(setup_doc, "setup(ndarray, dtypes, half_nan_right, bf16_nan_right, complex_fused, combine_off)\n\n"
                        "numpy.ndarray, the dtypes in the kernels' order, what the installed NumPy and "
                        "ml_dtypes do where IEEE leaves a choice, and the (dtype, op) pairs combine leaves "
                        "to NumPy.");

static PyObject *setup(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 6 || !PyType_Check(argv[0]) || !PyTuple_Check(argv[1]) || PyTuple_GET_SIZE(argv[1]) != HR_NDTYPES ||
        !PyTuple_Check(argv[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup(ndarray, dtypes, half_nan_right, bf16_nan_right, complex_fused, combine_off)");
        return NULL;
    }
    unsigned char off[HR_NDTYPES][HR_NOPS] = {{0}};
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(argv[5]); k++) {
        int dtype, op;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(argv[5], k), "ii", &dtype, &op)) return NULL;
        if (dtype < 0 || dtype >= HR_NDTYPES || op < 0 || op >= HR_NOPS) {
            PyErr_SetString(PyExc_ValueError, "setup: combine_off holds (dtype, op) codes");
            return NULL;
        }
        off[dtype][op] = 1;
    }
    memcpy(combine_off, off, sizeof off);
    int flags[3];
    for (int k = 0; k < 3; k++)
        if ((flags[k] = PyObject_IsTrue(argv[2 + k])) < 0) return NULL;
    Py_INCREF(argv[0]);
    Py_XSETREF(ndarray_type, (PyTypeObject *)argv[0]);
    for (int k = 0; k < HR_NDTYPES; k++) {
        PyObject *dt = PyTuple_GET_ITEM(argv[1], k);
        Py_INCREF(dt);
        Py_XSETREF(dtypes[k], dt);
    }
    quirks.half_nan_right = flags[0];
    quirks.bf16_nan_right = flags[1];
    quirks.complex_fused = flags[2];
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, setup_doc},
    {"combine", (PyCFunction)(void (*)(void))combine, METH_FASTCALL, combine_doc},
    {"narrow", (PyCFunction)(void (*)(void))narrow, METH_FASTCALL, narrow_doc},
    {"widen", (PyCFunction)(void (*)(void))widen, METH_FASTCALL, widen_doc},
    {"round_trip", (PyCFunction)(void (*)(void))round_trip, METH_FASTCALL, round_trip_doc},
    {"codes", (PyCFunction)(void (*)(void))codes, METH_FASTCALL, codes_doc},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL, gather_doc},
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL, encode_doc},
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL, decode_doc},
    {"widen_add", (PyCFunction)(void (*)(void))widen_add, METH_FASTCALL, widen_add_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hpcring._kernels",
    "hpcring's element kernels in C (reductions, wire conversions, reproducible-sum conversions); "
    "see hpcring/kernels.py.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    str_dtype = PyUnicode_InternFromString("dtype");
    str_add = PyUnicode_InternFromString("add");
    str_maximum = PyUnicode_InternFromString("maximum");
    str_minimum = PyUnicode_InternFromString("minimum");
    str_multiply = PyUnicode_InternFromString("multiply");
    if (!str_dtype || !str_add || !str_maximum || !str_minimum || !str_multiply) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* How it was built, for hpcring.info()["core_reason"] (HR_COMPILER and HR_CFLAGS: setup.py). */
#ifndef HR_CFLAGS
#define HR_CFLAGS "?"
#endif
#if defined(__clang__)
    const char *compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
    const char *compiler = "gcc " __VERSION__;
#else
    const char *compiler = "cc";
#endif
#ifndef HR_SOURCES_DIGEST /* what it was built from (setup.py; hpcring.stamp compares) */
#define HR_SOURCES_DIGEST ""
#endif
    if (PyModule_AddStringConstant(m, "COMPILER", compiler) < 0 ||
        PyModule_AddStringConstant(m, "CFLAGS", HR_CFLAGS) < 0 ||
        PyModule_AddStringConstant(m, "SOURCES_DIGEST", HR_SOURCES_DIGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
