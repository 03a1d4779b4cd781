/* Row buffers (hookdbg/store/_pack.c) as another extension writes into them.
 *
 * A RowBuffer holds one table's rows column by column, as the file stores them,
 * appended one at a time: the recorder's per-call path (hookdbg/recorder/_hot.c)
 * writes each row straight into it, with no tuple per row for the garbage collector
 * to count and for the writer thread to convert. Its Python methods (append, extend,
 * take) serve everyone else; ``append`` serves C, through the capsule
 * ROWBUFFER_CAPSULE:
 *
 *     RowBufferAPI *api = PyCapsule_Import(ROWBUFFER_CAPSULE, 0);
 *     RowValue row[11] = {ROW_LONG(call_id), ROW_OBJECT(phase), ROW_DOUBLE(start), ...};
 *     api->append(buffer, row, 11);
 *
 * One value per column, numbered as in the table's row tuples (hookdbg/store/rows.py):
 * a number given as a C number makes no Python object; a tuple (a summary) fills the
 * fields inside it. A row goes in whole or not at all: C numbers, exact ints and floats
 * and texts the buffer has just encoded go straight into the columns; anything else is
 * converted first (which may run Python code: a text's first encoding), then added.
 */

#ifndef HOOKDBG_ROWBUFFER_H
#define HOOKDBG_ROWBUFFER_H

#include <Python.h>

#define ROWBUFFER_CAPSULE "hookdbg.store._pack._C_API"
#define ROWBUFFER_API_VERSION 2

typedef struct {
    char kind; /* 'O': object, 'L': long_, 'D': double_ */
    PyObject *object;
    long long long_;
    double double_;
} RowValue;

#define ROW_OBJECT(o) ((RowValue){.kind = 'O', .object = (o)})
#define ROW_LONG(v) ((RowValue){.kind = 'L', .long_ = (v)})
#define ROW_DOUBLE(v) ((RowValue){.kind = 'D', .double_ = (v)})

typedef struct {
    int version;        /* ROWBUFFER_API_VERSION */
    PyTypeObject *type; /* RowBuffer */
    int (*append)(PyObject *buffer, const RowValue *row, Py_ssize_t columns);
} RowBufferAPI;

#endif
