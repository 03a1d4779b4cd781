/* Row buffers (hookdbg/store/_pack.c) as another extension writes into them.
 *
 * A RowBuffer holds one table's rows column by column, as the file stores them,
 * appended one at a time: the recorder's per-call path (hookdbg/recorder/_hot.c)
 * writes each row straight into it, with no tuple per row for the garbage collector
 * to count and for the writer thread to convert. Its Python methods (append, extend, take) serve
 * everyone else; these functions serve C, through the capsule ROWBUFFER_CAPSULE:
 *
 *     RowBufferAPI *api = PyCapsule_Import(ROWBUFFER_CAPSULE, 0);
 *     Py_ssize_t row = api->reserve(buffer);        (a zeroed record at the end, or -1)
 *     api->put_long(buffer, row, 0, call_id)        (column 0 of the row tuple)
 *     api->put(buffer, row, 7, summary)             (a tuple fills its inner fields)
 *     ...; on an error: api->unreserve(buffer)      (the half-written record goes)
 *
 * Columns are numbered as in the table's row tuples (hookdbg/store/rows.py). Rows are
 * named by their index, which stays valid until the buffer's next take.
 */

#ifndef HOOKDBG_ROWBUFFER_H
#define HOOKDBG_ROWBUFFER_H

#include <Python.h>

#define ROWBUFFER_CAPSULE "hookdbg.store._pack._C_API"
#define ROWBUFFER_API_VERSION 1

typedef struct {
    int version;        /* ROWBUFFER_API_VERSION */
    PyTypeObject *type; /* RowBuffer */
    Py_ssize_t (*reserve)(PyObject *buffer);
    void (*unreserve)(PyObject *buffer);
    int (*put)(PyObject *buffer, Py_ssize_t row, Py_ssize_t column, PyObject *value);
    int (*put_long)(PyObject *buffer, Py_ssize_t row, Py_ssize_t column, long long value);
    int (*put_double)(PyObject *buffer, Py_ssize_t row, Py_ssize_t column, double value);
} RowBufferAPI;

#endif
