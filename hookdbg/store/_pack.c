/* Rows of Python values into numpy records, without a tuple per row where it can.
 *
 * pack(rows, out, fields) -> None
 *
 * ``rows`` is a list of tuples; ``out`` a writable C-contiguous buffer of len(rows)
 * records; ``fields`` a tuple of (outer, inner, offset, code): the value is
 * rows[i][outer] (inner < 0) or rows[i][outer][inner], stored at byte ``offset`` of
 * record i as code 0: int64, 1: int32, 2: int16, 3: uint8, 4: float64, 5: float32.
 * numpy's own conversion of a list of tuples builds and inspects every row again
 * (about 1.3 us per tensor row of 20 columns); this reads each value where it lies.
 *
 * A text field is (outer, inner, offset, 6, width, cache, make): its value's encoded
 * bytes are ``cache[value]``, or ``make(value)`` the first time (which fills the
 * cache), stored zero-padded in ``width`` bytes as numpy stores a fixed-width bytes
 * field. Texts repeat (a module path, a shape, a dtype), so the encoding happens
 * once per distinct value and each row costs a dictionary lookup and a copy.
 *
 * A raw field is (outer, inner, offset, 7, width): a bytes value copied as it is (a
 * histogram's int64 counts), or zeros where the value is None or missing (a summary
 * tuple that ends before it).
 *
 * RowBuffer(dtype, itemsize, fields): one table's rows, appended one at a time
 * (``append(row)``, ``extend(rows)``; other extensions write into it through
 * rowbuffer.h), kept column by column and handed over, one Column per field, in the
 * memory they were gathered in (``take()``: read as bytes are, not copied). The
 * recorder's rows wait there for the writer thread: no tuple per row for the garbage
 * collector to count while they wait, and nothing left for the writer to convert or
 * gather. ``join(parts)`` puts several hand-overs' fields together, one block per
 * field, copied with the GIL released.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "rowbuffer.h"

typedef struct {
    Py_ssize_t outer, inner, offset, width;
    int code;
    Py_ssize_t bytes;       /* what one value takes in its column */
    PyObject *cache, *make; /* text fields only (borrowed from ``fields``) */
} Field;

enum { TEXT = 6, RAW = 7 };

static const Py_ssize_t WIDTH[] = {8, 4, 2, 1, 8, 4};

/* ``spec`` (a tuple of field tuples) as Fields that lie inside ``itemsize`` bytes
 * (itemsize < 0: not known yet); PyMem_Free the result. */
static Field *parse_fields(PyObject *spec, Py_ssize_t itemsize) {
    Py_ssize_t n = PyTuple_GET_SIZE(spec);
    Field *fields = PyMem_Malloc(sizeof(Field) * (size_t)(n ? n : 1));
    if (fields == NULL) return (Field *)PyErr_NoMemory();
    for (Py_ssize_t j = 0; j < n; j++) {
        Field *f = &fields[j];
        f->width = 0;
        f->cache = f->make = NULL;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(spec, j), "nnni|nO!O", &f->outer, &f->inner,
                              &f->offset, &f->code, &f->width, &PyDict_Type, &f->cache,
                              &f->make))
            goto fail;
        if (f->code == TEXT && (f->cache == NULL || f->make == NULL || f->width <= 0)) {
            PyErr_SetString(PyExc_ValueError, "pack: a text field needs width, cache, make");
            goto fail;
        }
        if (f->code == RAW && f->width <= 0) {
            PyErr_SetString(PyExc_ValueError, "pack: a raw field needs its width");
            goto fail;
        }
        int known = f->code >= 0 && f->code <= RAW;
        Py_ssize_t width = !known ? 0 : f->code >= TEXT ? f->width : WIDTH[f->code];
        f->bytes = width;
        if (!known || f->outer < 0 || f->offset < 0 ||
            (itemsize >= 0 && f->offset + width > itemsize)) {
            PyErr_SetString(PyExc_ValueError, "pack: a field lies outside its record");
            goto fail;
        }
    }
    return fields;
fail:
    PyMem_Free(fields);
    return NULL;
}

/* A text's encoded bytes at ``at``, cut to the field's width or zero-padded to it, as
 * numpy stores a fixed-width bytes field. */
static void put_text(char *at, const Field *f, PyObject *data) {
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n > f->width) n = f->width;
    memcpy(at, PyBytes_AS_STRING(data), (size_t)n);
    memset(at + n, 0, (size_t)(f->width - n));
}

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
    put_text(at, f, data);
    Py_XDECREF(made);
    return 0;
}

static int store_raw(char *at, const Field *f, PyObject *value) {
    if (value == NULL || value == Py_None) {
        memset(at, 0, (size_t)f->width);
        return 0;
    }
    if (!PyBytes_Check(value) || PyBytes_GET_SIZE(value) != f->width) {
        PyErr_Format(PyExc_ValueError, "pack: a raw field holds %zd bytes", f->width);
        return -1;
    }
    memcpy(at, PyBytes_AS_STRING(value), (size_t)f->width);
    return 0;
}

static void store_long(char *at, int code, long long v) {
    switch (code) {
        case 0: { int64_t x = (int64_t)v; memcpy(at, &x, 8); break; }
        case 1: { int32_t x = (int32_t)v; memcpy(at, &x, 4); break; }
        case 2: { int16_t x = (int16_t)v; memcpy(at, &x, 2); break; }
        case 3: { uint8_t x = (uint8_t)v; memcpy(at, &x, 1); break; }
        case 4: { double x = (double)v; memcpy(at, &x, 8); break; }
        default: { float x = (float)v; memcpy(at, &x, 4); break; }
    }
}

static void store_double(char *at, int code, double d) {
    if (code == 4) {
        memcpy(at, &d, 8);
    } else if (code == 5) {
        float f = (float)d;
        memcpy(at, &f, 4);
    } else {
        store_long(at, code, (long long)d);
    }
}

static int store(char *at, int code, PyObject *value) {
    if (code >= 4) {
        double d = PyFloat_AsDouble(value);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        store_double(at, code, d);
        return 0;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    store_long(at, code, v);
    return 0;
}

static PyObject *item(PyObject *seq, Py_ssize_t k) {
    if (PyTuple_Check(seq) && k >= 0 && k < PyTuple_GET_SIZE(seq)) return PyTuple_GET_ITEM(seq, k);
    PyErr_SetString(PyExc_ValueError, "pack: a row is not a tuple holding its fields");
    return NULL;
}

/* One field, at ``at``, from its column's value (the inner one, for inner >= 0). */
static int store_field(char *at, const Field *f, PyObject *value) {
    if (f->inner >= 0) {
        if (f->code == RAW && (value == Py_None ||
                               (PyTuple_Check(value) && f->inner >= PyTuple_GET_SIZE(value))))
            return store_raw(at, f, NULL);
        if ((value = item(value, f->inner)) == NULL) return -1;
    }
    switch (f->code) {
        case TEXT: return store_text(at, f, value);
        case RAW: return store_raw(at, f, value);
        default: return store(at, f->code, value);
    }
}

static PyObject *pack(PyObject *self, PyObject *args) {
    PyObject *rows, *out, *spec;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyList_Type, &rows, &out, &PyTuple_Type, &spec))
        return NULL;
    Py_ssize_t nfields = PyTuple_GET_SIZE(spec), nrows = PyList_GET_SIZE(rows);
    Field *fields = parse_fields(spec, -1);
    if (fields == NULL) return NULL;
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
        if (f->offset + f->bytes > stride) {
            PyErr_SetString(PyExc_ValueError, "pack: a field lies outside its record");
            failed = 1;
        }
    }
    for (Py_ssize_t i = 0; i < nrows && !failed; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        char *record = (char *)view.buf + i * stride;
        for (Py_ssize_t j = 0; j < nfields; j++) {
            PyObject *value = item(row, fields[j].outer);
            if (value == NULL || store_field(record + fields[j].offset, &fields[j], value) < 0) {
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

/* -- RowBuffer ------------------------------------------------------------------------ */

/* Column by column: each field's values lie together, as the file stores them (one
 * dataset per column), so the writer appends each one as it is, without first
 * gathering it out of records (which holds the GIL). */
/* The last encodings of a text field, by the identity of the value (held, so that its
 * address is not another value's): a module path, a shape, a dtype repeat row after
 * row, and a pointer compare is cheaper than hashing them for the cache dict. */
#define TEXT_SLOTS 64
typedef struct {
    PyObject *value, *data;
} TextSlot;

typedef struct {
    PyObject_HEAD
    PyObject *dtype; /* what take()'s columns are (kept for the caller) */
    PyObject *spec;  /* the fields tuple: owns the text fields' caches and encoders */
    Field *fields;
    Py_ssize_t nfields, ncolumns;
    Py_ssize_t *first; /* fields sorted by column: column c's are order[first[c]:first[c+1]] */
    Py_ssize_t *order;
    char **data;       /* per field: its values, Field.bytes each */
    Py_ssize_t n, cap; /* rows held, and room for */
    Py_ssize_t hint;   /* rows the last take() handed over: the room to start with */
    TextSlot *slots;   /* TEXT_SLOTS per field (used by text fields) */
    Py_ssize_t *at;    /* per field: where it lies in a staged row (see append_values) */
    Py_ssize_t width;  /* a staged row's bytes: every field's width */
} RowBuffer;

static PyTypeObject RowBufferType;

static int RowBuffer_init(RowBuffer *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"dtype", "itemsize", "fields", NULL};
    PyObject *dtype, *spec;
    Py_ssize_t itemsize;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnO!", kw, &dtype, &itemsize, &PyTuple_Type,
                                     &spec))
        return -1;
    if (self->fields != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "RowBuffer: already made");
        return -1;
    }
    if (itemsize <= 0) {
        PyErr_SetString(PyExc_ValueError, "RowBuffer: a record holds at least one byte");
        return -1;
    }
    Field *fields = parse_fields(spec, itemsize);
    if (fields == NULL) return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(spec), columns = 0;
    for (Py_ssize_t j = 0; j < n; j++)
        if (fields[j].outer + 1 > columns) columns = fields[j].outer + 1;
    Py_ssize_t *first = PyMem_Calloc((size_t)columns + 1, sizeof(Py_ssize_t));
    Py_ssize_t *order = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    Py_ssize_t *next = PyMem_Calloc((size_t)columns + 1, sizeof(Py_ssize_t));
    char **data = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    TextSlot *slots = PyMem_Calloc((size_t)(n + 1) * TEXT_SLOTS, sizeof(TextSlot));
    Py_ssize_t *at = PyMem_Calloc((size_t)n + 1, sizeof(Py_ssize_t));
    if (first == NULL || order == NULL || next == NULL || data == NULL || slots == NULL ||
        at == NULL) {
        PyMem_Free(fields);
        PyMem_Free(first);
        PyMem_Free(order);
        PyMem_Free(next);
        PyMem_Free(data);
        PyMem_Free(slots);
        PyMem_Free(at);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) first[fields[j].outer + 1]++;
    for (Py_ssize_t c = 0; c < columns; c++) first[c + 1] += first[c];
    memcpy(next, first, sizeof(Py_ssize_t) * (size_t)columns);
    for (Py_ssize_t j = 0; j < n; j++) order[next[fields[j].outer]++] = j;
    PyMem_Free(next);
    Py_INCREF(dtype);
    Py_INCREF(spec);
    self->dtype = dtype;
    self->spec = spec;
    self->fields = fields;
    self->nfields = n;
    self->ncolumns = columns;
    self->first = first;
    self->order = order;
    self->data = data;
    self->slots = slots;
    self->at = at;
    self->width = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        at[j] = self->width;
        self->width += fields[j].bytes;
    }
    return 0;
}

static int RowBuffer_traverse(RowBuffer *self, visitproc visit, void *arg) {
    Py_VISIT(self->dtype);
    Py_VISIT(self->spec);
    for (Py_ssize_t k = 0; self->slots != NULL && k < self->nfields * TEXT_SLOTS; k++) {
        Py_VISIT(self->slots[k].value);
        Py_VISIT(self->slots[k].data);
    }
    return 0;
}

static int RowBuffer_clear(RowBuffer *self) {
    for (Py_ssize_t k = 0; self->slots != NULL && k < self->nfields * TEXT_SLOTS; k++) {
        Py_CLEAR(self->slots[k].value);
        Py_CLEAR(self->slots[k].data);
    }
    PyMem_Free(self->fields); /* they borrow from spec: the buffer is unusable now */
    self->fields = NULL;
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->spec);
    return 0;
}

static void free_columns(RowBuffer *b) {
    for (Py_ssize_t j = 0; b->data != NULL && j < b->nfields; j++) {
        PyMem_Free(b->data[j]);
        b->data[j] = NULL;
    }
    b->cap = 0;
}

static void RowBuffer_dealloc(RowBuffer *self) {
    PyObject_GC_UnTrack(self);
    RowBuffer_clear(self);
    free_columns(self);
    PyMem_Free(self->data);
    PyMem_Free(self->slots);
    PyMem_Free(self->at);
    PyMem_Free(self->fields);
    PyMem_Free(self->first);
    PyMem_Free(self->order);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int made(RowBuffer *b) {
    if (b->fields != NULL) return 1;
    PyErr_SetString(PyExc_RuntimeError, "RowBuffer: __init__ was not called");
    return 0;
}

/* Room for one more row (n stays as it is). */
static int grow(RowBuffer *b) {
    if (b->n < b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap * 2 : (b->hint > 256 ? b->hint : 256);
    for (Py_ssize_t j = 0; j < b->nfields; j++) {
        Py_ssize_t width = b->fields[j].bytes;
        char *column =
            cap > PY_SSIZE_T_MAX / width ? NULL : PyMem_Realloc(b->data[j], (size_t)(cap * width));
        if (column == NULL) { /* the columns grown so far keep their new room */
            PyErr_NoMemory();
            return -1;
        }
        b->data[j] = column;
    }
    b->cap = cap;
    return 0;
}

/* The slot of text field ``j`` where ``value``'s encoding is remembered (TextSlot). */
static inline TextSlot *text_slot(RowBuffer *b, Py_ssize_t j, PyObject *value) {
    return &b->slots[j * TEXT_SLOTS + (Py_ssize_t)(((uintptr_t)value >> 4) % TEXT_SLOTS)];
}

/* The encoding of text field ``j``'s ``value`` (borrowed from its slot, see TextSlot),
 * made the first time by the field's cache or encoder. */
static PyObject *encoded(RowBuffer *b, Py_ssize_t j, PyObject *value) {
    const Field *f = &b->fields[j];
    TextSlot *slot = text_slot(b, j, value);
    if (slot->value != value) {
        PyObject *data = PyDict_GetItemWithError(f->cache, value); /* borrowed */
        if (data != NULL) {
            Py_INCREF(data);
        } else if (PyErr_Occurred() || (data = PyObject_CallOneArg(f->make, value)) == NULL) {
            return NULL;
        }
        if (!PyBytes_Check(data)) {
            Py_DECREF(data);
            PyErr_SetString(PyExc_TypeError, "pack: a text field's encoding is not bytes");
            return NULL;
        }
        PyObject *old_value = slot->value, *old_data = slot->data; /* both replaced first */
        slot->value = Py_NewRef(value);
        slot->data = data;
        Py_XDECREF(old_value);
        Py_XDECREF(old_data);
    }
    return slot->data;
}

/* Field ``j`` of a row, from its column's value, at ``at`` (a staged row). */
static int stage_field(RowBuffer *b, Py_ssize_t j, char *at, const RowValue *value) {
    const Field *f = &b->fields[j];
    if (value->kind == 'L' || value->kind == 'D') {
        if (f->inner >= 0 || f->code >= TEXT) {
            PyErr_SetString(PyExc_TypeError, "RowBuffer: the column is not one number");
            return -1;
        }
        if (value->kind == 'L')
            store_long(at, f->code, value->long_);
        else
            store_double(at, f->code, value->double_);
        return 0;
    }
    PyObject *v = value->object;
    if (value->kind != 'O' || v == NULL) {
        PyErr_SetString(PyExc_TypeError, "RowBuffer: a value is an object, a long or a double");
        return -1;
    }
    if (f->code != TEXT) return store_field(at, f, v);
    if (f->inner >= 0 && (v = item(v, f->inner)) == NULL) return -1;
    PyObject *data = encoded(b, j, v);
    if (data == NULL) return -1;
    put_text(at, f, data);
    return 0;
}

/* One row straight into the columns, when each value is what the hooks give: a C
 * number, an exact int or float, bytes, or a text whose encoding the field's slot holds
 * (the same object as the last time). Nothing here runs Python code, so nothing can
 * take or change the buffer meanwhile, and the row counts only once every field is
 * written. 1: added; 0: not added, a value needs the staged way below; -1: an error
 * (an int too large for its field), nothing added. */
static int append_direct(RowBuffer *b, const RowValue *row) {
    if (grow(b) < 0) return -1;
    const Py_ssize_t n = b->n;
    for (Py_ssize_t j = 0; j < b->nfields; j++) {
        const Field *f = &b->fields[j];
        const RowValue *value = &row[f->outer];
        char *at = b->data[j] + n * f->bytes;
        if (value->kind == 'L' || value->kind == 'D') {
            if (f->inner >= 0 || f->code >= TEXT) return 0;
            if (value->kind == 'L')
                store_long(at, f->code, value->long_);
            else
                store_double(at, f->code, value->double_);
            continue;
        }
        PyObject *v = value->object;
        if (value->kind != 'O' || v == NULL) return 0;
        if (f->inner >= 0) {
            if (!PyTuple_Check(v)) return 0;
            if (f->inner >= PyTuple_GET_SIZE(v)) {
                if (f->code != RAW) return 0;
                memset(at, 0, (size_t)f->bytes); /* a summary without its histogram */
                continue;
            }
            v = PyTuple_GET_ITEM(v, f->inner);
        }
        if (f->code == TEXT) {
            const TextSlot *slot = text_slot(b, j, v);
            if (slot->value != v) return 0; /* its encoding is looked up the staged way */
            put_text(at, f, slot->data);
        } else if (f->code == RAW) {
            if (v != Py_None && !(PyBytes_Check(v) && PyBytes_GET_SIZE(v) == f->width)) return 0;
            if (store_raw(at, f, v) < 0) return -1;
        } else if (PyFloat_CheckExact(v) && f->code >= 4) { /* into a float field only */
            store_double(at, f->code, PyFloat_AS_DOUBLE(v));
        } else if (PyLong_CheckExact(v)) {
            if (store(at, f->code, v) < 0) return -1;
        } else {
            return 0; /* converting it may run Python code */
        }
    }
    b->n++;
    return 1;
}

/* One row, a value per column. What the hooks give goes straight into the columns
 * (append_direct); anything else is converted into a staged row first (that may run
 * Python code, which may append to or take this buffer: a text's first encoding, a
 * number of another type), then added with no Python code in between. Either way a
 * row goes in whole or not at all. */
static int append_values(RowBuffer *b, const RowValue *row, Py_ssize_t columns) {
    if (!made(b)) return -1;
    if (columns != b->ncolumns) {
        PyErr_Format(PyExc_ValueError, "RowBuffer: a row of %zd columns, not %zd", columns,
                     b->ncolumns);
        return -1;
    }
    int direct = append_direct(b, row);
    if (direct != 0) return direct < 0 ? -1 : 0;
    char small[1024], *staged = b->width <= (Py_ssize_t)sizeof small ? small : PyMem_Malloc((size_t)b->width);
    if (staged == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = -1;
    for (Py_ssize_t j = 0; j < b->nfields; j++)
        if (stage_field(b, j, staged + b->at[j], &row[b->fields[j].outer]) < 0) goto done;
    if (!made(b) || grow(b) < 0) goto done; /* made(): Python code may have cleared it */
    for (Py_ssize_t j = 0; j < b->nfields; j++) {
        Py_ssize_t width = b->fields[j].bytes;
        memcpy(b->data[j] + b->n * width, staged + b->at[j], (size_t)width);
    }
    b->n++;
    rc = 0;
done:
    if (staged != small) PyMem_Free(staged);
    return rc;
}

static int rb_append(PyObject *buffer, const RowValue *row, Py_ssize_t columns) {
    if (!PyObject_TypeCheck(buffer, &RowBufferType)) {
        PyErr_SetString(PyExc_TypeError, "not a RowBuffer");
        return -1;
    }
    return append_values((RowBuffer *)buffer, row, columns);
}

static int append_row(RowBuffer *b, PyObject *row) {
    if (!made(b)) return -1;
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < b->ncolumns) {
        PyErr_SetString(PyExc_ValueError, "pack: a row is not a tuple holding its fields");
        return -1;
    }
    RowValue small[32], *values = b->ncolumns <= 32 ? small : PyMem_Calloc((size_t)b->ncolumns, sizeof(RowValue));
    if (values == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t c = 0; c < b->ncolumns; c++) values[c] = ROW_OBJECT(PyTuple_GET_ITEM(row, c));
    Py_INCREF(row); /* its items stay alive while Python code runs */
    int rc = append_values(b, values, b->ncolumns);
    Py_DECREF(row);
    if (values != small) PyMem_Free(values);
    return rc;
}

static PyObject *RowBuffer_append(RowBuffer *self, PyObject *row) {
    if (append_row(self, row) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *RowBuffer_extend(RowBuffer *self, PyObject *rows) {
    PyObject *it = PyObject_GetIter(rows), *row;
    if (it == NULL) return NULL;
    while ((row = PyIter_Next(it)) != NULL) {
        int bad = append_row(self, row);
        Py_DECREF(row);
        if (bad < 0) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* -- Column: a field's values as taken, in the memory they were gathered in ---------- */

/* take() hands each field's memory over as it is, instead of copying it into a bytes
 * object: the rows of a hand-over (megabytes at --level stats) are not copied on the
 * training thread. A Column reads as bytes do (the buffer protocol, len) and frees the
 * memory when the writer is done with it. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t size;
} Column;

static int Column_getbuffer(Column *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 1, flags);
}

static void Column_dealloc(Column *self) {
    PyMem_Free(self->data); /* a view holds a reference to it: none is left */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t Column_len(Column *self) { return self->size; }

static PyObject *Column_bytes(Column *self, PyObject *unused) {
    return PyBytes_FromStringAndSize(self->data, self->size);
}

static PyBufferProcs Column_as_buffer = {(getbufferproc)Column_getbuffer, NULL};
static PySequenceMethods Column_as_sequence = {.sq_length = (lenfunc)Column_len};
static PyMethodDef Column_methods[] = {
    {"__bytes__", (PyCFunction)Column_bytes, METH_NOARGS, "A copy, as bytes."},
    {NULL},
};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hookdbg.store._pack.Column",
    .tp_basicsize = sizeof(Column),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One field's values as RowBuffer.take() hands them over (read as bytes are).",
    .tp_dealloc = (destructor)Column_dealloc,
    .tp_as_buffer = &Column_as_buffer,
    .tp_as_sequence = &Column_as_sequence,
    .tp_methods = Column_methods,
};

/* An empty Column: no memory yet. */
static Column *new_column(void) {
    Column *c = PyObject_New(Column, &ColumnType);
    if (c != NULL) {
        c->data = NULL;
        c->size = 0;
    }
    return c;
}

/* The rows gathered so far: one Column per field, in the fields' order, holding the
 * memory they were gathered in; the buffer starts afresh, with room for as many rows
 * as it handed over (within reason), so that a steady run allocates each field once
 * per hand-over and never grows it. */
static PyObject *RowBuffer_take(RowBuffer *self, PyObject *unused) {
    if (!made(self)) return NULL;
    PyObject *out = PyTuple_New(self->nfields);
    if (out == NULL) return NULL;
    Column **columns = PyMem_Calloc((size_t)self->nfields + 1, sizeof(Column *));
    if (columns == NULL) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t j = 0; j < self->nfields; j++) { /* all made before any memory moves */
        if ((columns[j] = new_column()) == NULL) {
            for (Py_ssize_t k = 0; k < j; k++) Py_DECREF(columns[k]);
            PyMem_Free(columns);
            Py_DECREF(out);
            return NULL;
        }
    }
    for (Py_ssize_t j = 0; j < self->nfields; j++) {
        Column *c = columns[j];
        c->size = self->n * self->fields[j].bytes;
        if (self->n) {
            /* no more memory than it holds rows for: the writer's bound counts that */
            char *fit = self->n < self->cap ? PyMem_Realloc(self->data[j], (size_t)c->size)
                                            : NULL;
            c->data = fit != NULL ? fit : self->data[j];
            self->data[j] = NULL;
        }
        PyTuple_SET_ITEM(out, j, (PyObject *)c);
    }
    PyMem_Free(columns);
    if (self->n) {
        self->hint = self->n < 65536 ? self->n : 65536;
        self->cap = 0;
    }
    self->n = 0;
    return out;
}

/* join(parts) -> one Column per field: the fields of several take()s (a list of tuples
 * of bytes-like objects, the same number in each), each field's pieces copied into one
 * block, with the GIL released while they are copied. The writer joins a table's
 * hand-overs this way before it appends them: one copy, and no numpy array per piece. */
static PyObject *join(PyObject *self, PyObject *parts) {
    if (!PyList_Check(parts) || PyList_GET_SIZE(parts) == 0 ||
        !PyTuple_Check(PyList_GET_ITEM(parts, 0))) {
        PyErr_SetString(PyExc_TypeError, "join: a non-empty list of tuples of fields");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(parts), nfields = PyTuple_GET_SIZE(PyList_GET_ITEM(parts, 0));
    Py_buffer *views = PyMem_Calloc((size_t)(count * nfields) + 1, sizeof(Py_buffer));
    PyObject *out = PyTuple_New(nfields);
    Py_ssize_t got = 0;
    if (views == NULL || out == NULL) {
        PyMem_Free(views);
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t j = 0; j < nfields; j++) {
        Column *c = new_column();
        if (c == NULL) goto fail;
        PyTuple_SET_ITEM(out, j, (PyObject *)c);
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *part = PyList_GET_ITEM(parts, i);
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != nfields) {
            PyErr_SetString(PyExc_ValueError, "join: every part holds the same fields");
            goto fail;
        }
        for (Py_ssize_t j = 0; j < nfields; j++, got++) {
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(part, j), &views[got], PyBUF_SIMPLE) < 0)
                goto fail;
            ((Column *)PyTuple_GET_ITEM(out, j))->size += views[got].len;
        }
    }
    for (Py_ssize_t j = 0; j < nfields; j++) {
        Column *c = (Column *)PyTuple_GET_ITEM(out, j);
        if (c->size && (c->data = PyMem_Malloc((size_t)c->size)) == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS /* the views hold every piece, and out is not shared yet */
    for (Py_ssize_t j = 0; j < nfields; j++) {
        char *at = ((Column *)PyTuple_GET_ITEM(out, j))->data;
        for (Py_ssize_t i = 0; i < count; i++) {
            const Py_buffer *v = &views[i * nfields + j];
            if (v->len) memcpy(at, v->buf, (size_t)v->len);
            at += v->len;
        }
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    return out;
fail:
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    Py_DECREF(out);
    return NULL;
}

static Py_ssize_t RowBuffer_len(RowBuffer *self) { return self->n; }

static PyMethodDef RowBuffer_methods[] = {
    {"append", (PyCFunction)RowBuffer_append, METH_O, "Store one row tuple."},
    {"extend", (PyCFunction)RowBuffer_extend, METH_O, "Store each row tuple of an iterable."},
    {"take", (PyCFunction)RowBuffer_take, METH_NOARGS,
     "The rows gathered so far, one Column (read as bytes) per field; the buffer starts "
     "afresh."},
    {NULL},
};

static PyMemberDef RowBuffer_members[] = {
    {"dtype", T_OBJECT, offsetof(RowBuffer, dtype), READONLY, "what the rows are"},
    {NULL},
};

static PySequenceMethods RowBuffer_as_sequence = {.sq_length = (lenfunc)RowBuffer_len};

static PyTypeObject RowBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hookdbg.store._pack.RowBuffer",
    .tp_basicsize = sizeof(RowBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "RowBuffer(dtype, itemsize, fields): one table's rows, column by column.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RowBuffer_init,
    .tp_traverse = (traverseproc)RowBuffer_traverse,
    .tp_clear = (inquiry)RowBuffer_clear,
    .tp_dealloc = (destructor)RowBuffer_dealloc,
    .tp_methods = RowBuffer_methods,
    .tp_members = RowBuffer_members,
    .tp_as_sequence = &RowBuffer_as_sequence,
};

static RowBufferAPI api = {ROWBUFFER_API_VERSION, &RowBufferType, rb_append};

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS, "pack(rows, out, fields) -> None"},
    {"join", join, METH_O, "join(parts) -> one Column per field, each field's pieces joined"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pack", "Row tuples into numpy records; row buffers.", -1, methods,
};

PyMODINIT_FUNC PyInit__pack(void) {
    if (PyType_Ready(&RowBufferType) < 0 || PyType_Ready(&ColumnType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *capsule = PyCapsule_New(&api, ROWBUFFER_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&RowBufferType);
    if (PyModule_AddObject(m, "RowBuffer", (PyObject *)&RowBufferType) < 0) {
        Py_DECREF(&RowBufferType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
