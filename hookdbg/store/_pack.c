/* Rows of Python numbers into a numpy structured array, without a tuple per row.
 *
 * The writer thread turns the recorder's row tuples into numpy rows. numpy's own
 * conversion of a list of tuples builds and inspects every row again (about 1.3 us per
 * tensor row of 20 columns); this reads each number where it lies and stores it at its
 * column's offset, holding the GIL for a fraction of that time.
 *
 * pack(rows, out, fields) -> None
 *
 * ``rows`` is a list of tuples; ``out`` a writable C-contiguous buffer of len(rows)
 * records; ``fields`` a tuple of (outer, inner, offset, code): the value is
 * rows[i][outer] (inner < 0) or rows[i][outer][inner], stored at byte ``offset`` of
 * record i as code 0: int64, 1: int32, 2: int16, 3: uint8, 4: float64, 5: float32.
 *
 * A text field is (outer, inner, offset, 6, width, cache, make): its value's encoded
 * bytes are ``cache[value]``, or ``make(value)`` the first time (which fills the
 * cache), stored zero-padded in ``width`` bytes as numpy stores a fixed-width bytes
 * field. Texts repeat (a module path, a shape, a dtype), so the encoding happens
 * once per distinct value and each row costs a dictionary lookup and a copy.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Py_ssize_t outer, inner, offset, width;
    int code;
    PyObject *cache, *make; /* text fields only (borrowed from ``fields``) */
} Field;

enum { TEXT = 6 };

static int store_text(char *at, const Field *f, PyObject *value) {
    PyObject *data = PyDict_GetItemWithError(f->cache, value); /* borrowed */
    PyObject *made = NULL;
    if (data == NULL) {
        if (PyErr_Occurred()) return -1;
        data = made = PyObject_CallOneArg(f->make, value);
        if (made == NULL) return -1;
    }
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "pack: a text field's encoding is not bytes");
        Py_XDECREF(made);
        return -1;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n > f->width) n = f->width;
    memcpy(at, PyBytes_AS_STRING(data), (size_t)n);
    memset(at + n, 0, (size_t)(f->width - n));
    Py_XDECREF(made);
    return 0;
}

static int store(char *at, int code, PyObject *value) {
    if (code >= 4) {
        double d = PyFloat_AsDouble(value);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        if (code == 4) {
            memcpy(at, &d, 8);
        } else {
            float f = (float)d;
            memcpy(at, &f, 4);
        }
        return 0;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    switch (code) {
        case 0: { int64_t x = (int64_t)v; memcpy(at, &x, 8); break; }
        case 1: { int32_t x = (int32_t)v; memcpy(at, &x, 4); break; }
        case 2: { int16_t x = (int16_t)v; memcpy(at, &x, 2); break; }
        default: { uint8_t x = (uint8_t)v; memcpy(at, &x, 1); break; }
    }
    return 0;
}

static const Py_ssize_t WIDTH[] = {8, 4, 2, 1, 8, 4};

static PyObject *item(PyObject *seq, Py_ssize_t k) {
    if (PyTuple_Check(seq) && k >= 0 && k < PyTuple_GET_SIZE(seq)) return PyTuple_GET_ITEM(seq, k);
    PyErr_SetString(PyExc_ValueError, "pack: a row is not a tuple holding its fields");
    return NULL;
}

static PyObject *pack(PyObject *self, PyObject *args) {
    PyObject *rows, *out, *spec;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyList_Type, &rows, &out, &PyTuple_Type, &spec))
        return NULL;
    Py_ssize_t nfields = PyTuple_GET_SIZE(spec), nrows = PyList_GET_SIZE(rows);
    Field *fields = PyMem_Malloc(sizeof(Field) * (size_t)(nfields ? nfields : 1));
    if (fields == NULL) return PyErr_NoMemory();
    for (Py_ssize_t j = 0; j < nfields; j++) {
        Field *f = &fields[j];
        f->width = 0;
        f->cache = f->make = NULL;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(spec, j), "nnni|nO!O", &f->outer, &f->inner,
                              &f->offset, &f->code, &f->width, &PyDict_Type, &f->cache,
                              &f->make)) {
            PyMem_Free(fields);
            return NULL;
        }
        if (f->code == TEXT && (f->cache == NULL || f->make == NULL || f->width <= 0)) {
            PyErr_SetString(PyExc_ValueError, "pack: a text field needs width, cache, make");
            PyMem_Free(fields);
            return NULL;
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyMem_Free(fields);
        return NULL;
    }
    Py_ssize_t stride = nrows ? view.len / nrows : 0;
    int failed = 0;
    if (nrows && view.len != stride * nrows) {
        PyErr_SetString(PyExc_ValueError, "pack: the buffer does not hold len(rows) records");
        failed = 1;
    }
    for (Py_ssize_t j = 0; j < nfields && !failed && nrows; j++) {
        Field *f = &fields[j];
        int known = f->code >= 0 && f->code <= TEXT;
        Py_ssize_t width = !known ? 0 : f->code == TEXT ? f->width : WIDTH[f->code];
        if (!known || f->offset < 0 || f->offset + width > stride) {
            PyErr_SetString(PyExc_ValueError, "pack: a field lies outside its record");
            failed = 1;
        }
    }
    for (Py_ssize_t i = 0; i < nrows && !failed; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        char *record = (char *)view.buf + i * stride;
        for (Py_ssize_t j = 0; j < nfields; j++) {
            Field *f = &fields[j];
            PyObject *value = item(row, f->outer);
            if (value != NULL && f->inner >= 0) value = item(value, f->inner);
            if (value == NULL ||
                (f->code == TEXT ? store_text(record + f->offset, f, value)
                                 : store(record + f->offset, f->code, value)) < 0) {
                failed = 1;
                break;
            }
        }
    }
    PyBuffer_Release(&view);
    PyMem_Free(fields);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS, "pack(rows, out, fields) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pack", "Row tuples into numpy records.", -1, methods,
};

PyMODINIT_FUNC PyInit__pack(void) { return PyModule_Create(&module); }
