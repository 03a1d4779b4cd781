/* Where a tensor summary's fields are, for the C extensions: their positions, looked up
 * by name in hookdbg/store/summary.py (``FIELDS``, the one declaration) once, when the
 * extension is imported. A field declared there needs no edit here and nothing is
 * generated at build time; an extension names only the fields it fills or reads.
 *
 *     static struct { Py_ssize_t min, nan; } at;
 *     static const SummaryField named[] = {{"min", &at.min}, {"nan", &at.nan}};
 *     Py_ssize_t length;
 *     if (summary_fields(named, 2, &length) < 0) return NULL;   (in PyInit_...)
 */

#ifndef HOOKDBG_FIELDS_H
#define HOOKDBG_FIELDS_H

#include <Python.h>

typedef struct {
    const char *name; /* a field of summary.FIELDS */
    Py_ssize_t *at;   /* receives its position in a summary tuple */
} SummaryField;

/* Fill each field's position and ``*length`` (summary.LENGTH): 0, or -1 with an
 * exception where the declaration cannot be read or lacks a name. */
static int summary_fields(const SummaryField *fields, size_t count, Py_ssize_t *length) {
    PyObject *module = PyImport_ImportModule("hookdbg.store.summary");
    if (module == NULL) return -1;
    PyObject *at = PyObject_GetAttrString(module, "at");
    PyObject *total = PyObject_GetAttrString(module, "LENGTH");
    Py_DECREF(module);
    int ok = at != NULL && total != NULL;
    if (ok) *length = PyLong_AsSsize_t(total);
    ok = ok && !PyErr_Occurred();
    for (size_t i = 0; ok && i < count; i++) {
        PyObject *position = PyObject_CallFunction(at, "s", fields[i].name);
        ok = position != NULL;
        if (ok) *fields[i].at = PyLong_AsSsize_t(position);
        Py_XDECREF(position);
        ok = ok && !PyErr_Occurred();
    }
    Py_XDECREF(at);
    Py_XDECREF(total);
    return ok ? 0 : -1;
}

#endif
