/* The recorder's per-call path in C: what runs on every module call, every tensor a
 * module call sees and every gradient, while hookdbg records.
 *
 * On a host-bound model (hundreds of small module calls a step, as a GPU's host thread
 * runs them) hookdbg's cost is the Python it runs per call: about a hundred Python
 * function calls, frames and attribute lookups for a call, its tensors and their
 * gradients. This file does the same work with C structs and the C API. It is an
 * accelerator in the way CPython's _pickle is one for pickle: the Python code stays
 * (hookdbg/recorder/hooks/modulehooks.py, observe.py, gradients.py, calls.py, envelope.py)
 * as the reference, used where this extension could not be built or with
 * HOOKDBG_PURE_PYTHON=1, and the parity tests (tests/recorder/test_accelerated.py)
 * record the same models both ways and require the same recordings. What is rare
 * (a module seen for the first time, a root call that starts a step, a forward run
 * again inside backward, a NaN/inf check, a tensor captured, the device path) is left
 * to the Python methods, called from here by name (cboundary.py lists them, and every
 * other name this file looks up on a Python object).
 *
 * Rows go straight into the store's row buffers (hookdbg/store/rowbuffer.h): a module
 * call's row and each tensor's row become numpy records as they are made.
 *
 * Types:
 *   Lock        the guard's reentrant lock, taken here without a Python call
 *   Guard       what every hook reads first (envelope.py): live, lock, overhead,
 *               alerts, actions
 *   Call        a recorded module call (calls.py)
 *   SeenTensor  a tensor seen in a segment (calls.py); called, it is the hook on the
 *               autograd node that made the tensor (or on the leaf tensor itself)
 *   CallPath    base of the module hooks (modulehooks.py): fast_pre, fast_post
 *   TensorPath  base of the tensor observer (observe.py): inputs, outputs, see, keep,
 *               summarise, fast_watch; the gradient hooks' bodies
 *   ParamHook   the post-accumulate-grad hook of one parameter (gradients.py)
 *
 * Each hook body runs inside the same envelope as envelope.py's ``hook``: its time
 * counts as hookdbg's (guard.overhead), it runs under the guard's lock, an Exception in
 * it stops the recording (guard.broken()) and not the training, and the NaN/inf
 * origins it found are acted on after the lock is released.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <math.h>
#include <time.h>

#include "../store/rowbuffer.h"
#include "../store/fields.h"

#if PY_VERSION_HEX >= 0x030D0000
static inline PyObject *deref(PyObject *ref) { /* a new reference, or Py_None if dead */
    PyObject *obj = NULL;
    if (PyWeakref_GetRef(ref, &obj) <= 0) Py_RETURN_NONE;
    return obj;
}
#else
static inline PyObject *deref(PyObject *ref) {
    PyObject *obj = PyWeakref_GetObject(ref);
    if (obj == NULL) return NULL;
    Py_INCREF(obj);
    return obj;
}
#endif

/* Where a summary's fields are (fields.h: looked up when this module is imported) */
static struct {
    Py_ssize_t shape, dtype, device, numel, min, norm, nan, neginf;
} summary_at;
static const SummaryField summary_named[] = {
    {"shape", &summary_at.shape}, {"dtype", &summary_at.dtype}, {"device", &summary_at.device},
    {"numel", &summary_at.numel}, {"min", &summary_at.min},     {"norm", &summary_at.norm},
    {"nan", &summary_at.nan},     {"neginf", &summary_at.neginf},
};
static Py_ssize_t summary_length; /* summary.LENGTH */

/* -- what Python hands over once (setup) ---------------------------------------------- */

static struct {
    PyObject *Tensor;         /* torch.Tensor */
    PyObject *Parameter;      /* torch.nn.Parameter */
    PyObject *ParametrizationList; /* torch.nn.utils.parametrize.ParametrizationList */
    PyObject *strided;        /* torch.strided */
    PyObject *Recompute;      /* recompute.Recompute */
    PyObject *Pending;        /* deferred.Pending */
    PyObject *MUTED, *RAISED; /* modulehooks' sentinels */
    PyObject *summarise;      /* stats.summarise (inlined below for CPU tensors) */
    PyObject *norm_summary;   /* stats.norm_summary (inlined below for CPU tensors) */
    PyObject *cpu, *nan;      /* "cpu", float("nan") */
    PyObject *one_pass;       /* _cstats.summary, or None */
    PyObject *shape_only;     /* stats.shape_only (inlined below for CPU tensors) */
    PyObject *no_stats;       /* stats._NO_STATS: a shape-only summary's statistics */
    PyObject *empty_float_stats; /* stats._EMPTY_FLOAT_STATS: an empty float tensor's */
    PyObject *transforms_active; /* stats.transforms_active */
    PyObject *c_kinds;        /* stats.C_KINDS: dtype -> (kind, name) */
    PyObject *shapes;         /* stats._SHAPES: one tuple per distinct shape */
    Py_ssize_t shapes_kept;   /* stats._SHAPES_KEPT */
    long long half_wide;      /* stats._HALF_WIDE */
    PyObject *iter_tensors;   /* tensors.iter_tensors */
    PyObject *index;          /* ("0", "1", ... "63"): positional argument paths */
    PyObject *graph_task_id;  /* torch._C._current_graph_task_id */
    PyObject *grad_enabled;   /* torch.is_grad_enabled */
    PyObject *GradHooks;      /* gradients.GradHooks */
    PyObject *hook_key;       /* gradients.HOOK_KEY */
    PyObject *compiler_dict;  /* torch.compiler.__dict__ (_is_compiling_flag) */
    PyObject *is_compiling;   /* torch.compiler.is_compiling, where that flag is missing */
    PyObject *perf_counter;   /* time.perf_counter, where clock_gettime is not it */
    int monotonic;            /* perf_counter is clock_gettime(CLOCK_MONOTONIC) */
    RowBufferAPI *rows;       /* the store's row buffers (rowbuffer.h) */
    int ready;
    long FWD, BWD, OPT, INPUT, OUTPUT, GRAD_OUTPUT, GRAD_INPUT, PARAM_GRAD;
    PyObject *fwd, *bwd, *opt, *input, *output, *grad_input, *grad_output, *param_grad; /* as ints */
} G;

/* attribute and method names, interned once: each is declared, with its owner and why,
 * in hookdbg/recorder/calls/cboundary.py (held to this list by tests/recorder/test_cboundary.py) */
#define NAMES(X)                                                                           \
    X(broken) X(ref) X(transparent) X(selected) X(id) X(capture) X(recording)              \
    X(module_calls) X(calls) X(step) X(batch) X(seg) X(memo) X(last) X(every)              \
    X(tensors) X(rows) X(lookup) X(_recompute_inner) X(_root) X(_leave_other) X(check)     \
    X(_root_ended)                                                                         \
    X(taint_parent) X(is_inference) X(_version) X(_base) X(requires_grad) X(numel)         \
    X(dtype) X(grad_fn) X(output_nr) X(register_prehook) X(register_hook) X(shape)         \
    X(is_cpu) X(is_contiguous) X(data_ptr) X(layout) X(_py_summarise) X(_check_input)      \
    X(_check_output) X(keep) X(held) X(budget) X(_sizes) X(_entries) X(nbytes)             \
    X(backward_ran) X(_check_grad) X(grad) X(_check_param_grad) X(_enclosing_calls)        \
    X(grad_finite) X(_backward_hooks) X(_register_hook_dict) X(_elsewhere) X(shard)
#define DECLARE(n) static PyObject *s_##n;
NAMES(DECLARE)
#undef DECLARE

static int intern_names(void) {
#define INTERN(n)                                            \
    if ((s_##n = PyUnicode_InternFromString(#n)) == NULL) return -1;
    NAMES(INTERN)
#undef INTERN
    return 0;
}

/* -- small helpers -------------------------------------------------------------------- */

static inline double now(void) {
#ifdef CLOCK_MONOTONIC
    if (G.monotonic) { /* exactly what time.perf_counter() returns on Linux */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec) / 1e9;
    }
#endif
    PyObject *r = PyObject_CallNoArgs(G.perf_counter);
    if (r == NULL) return -1.0;
    double v = PyFloat_AsDouble(r);
    Py_DECREF(r);
    return v;
}

static PyObject *s_flag_name; /* "_is_compiling_flag" */

/* torch.compiler.is_compiling(), as code that dynamo never traces sees it: a hook that
 * runs for real while dynamo or export compiles must do nothing. */
static int is_compiling(void) {
    PyObject *flag = PyDict_GetItemWithError(G.compiler_dict, s_flag_name);
    if (flag != NULL) return flag == Py_True;
    if (PyErr_Occurred()) return -1;
    PyObject *r = PyObject_CallNoArgs(G.is_compiling);
    if (r == NULL) return -1;
    int yes = PyObject_IsTrue(r);
    Py_DECREF(r);
    return yes;
}

static inline PyObject *call_method0(PyObject *obj, PyObject *name) {
    return PyObject_VectorcallMethod(name, &obj, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static inline PyObject *call_method1(PyObject *obj, PyObject *name, PyObject *arg) {
    PyObject *args[2] = {obj, arg};
    return PyObject_VectorcallMethod(name, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* obj.name(*args) for the Python methods the rare paths go to; None result dropped */
static int call_void(PyObject *obj, PyObject *name, PyObject *const *args, size_t n) {
    PyObject *all[8];
    all[0] = obj;
    for (size_t i = 0; i < n; i++) all[i + 1] = args[i];
    PyObject *r = PyObject_VectorcallMethod(name, all, (n + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static inline int get_bool(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int yes = PyObject_IsTrue(v);
    Py_DECREF(v);
    return yes;
}

static inline int get_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* An attribute of one of hookdbg's own classes with __slots__ (ModuleInfo, StepState,
 * Handoff, FlightRecorder) read the way CPython's member descriptor reads it, by its offset in the
 * object, without the lookup in the type that getattr makes on every call. Found once,
 * at setup, from the class's descriptor; an object of another type (a subclass), an
 * unset slot or a slot not found there go through getattr. */
typedef struct {
    PyTypeObject *type; /* NULL: not found, always getattr */
    Py_ssize_t offset;
    PyObject *name;
} SlotRef;

static void find_slot(SlotRef *s, PyObject *type, PyObject *name) {
    s->type = NULL;
    s->name = name;
    if (!PyType_Check(type)) return;
    Py_INCREF(type); /* held for the process's life, as setup's other objects are */
    PyObject *d = PyObject_GetAttr(type, name);
    if (d == NULL) {
        PyErr_Clear();
        return;
    }
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY) &&
            ((PyMemberDescrObject *)d)->d_common.d_type == (PyTypeObject *)type) {
            s->type = (PyTypeObject *)type;
            s->offset = m->offset;
        }
    }
    Py_DECREF(d);
}

static inline PyObject *slot_get(const SlotRef *s, PyObject *obj) { /* a new reference */
    if (Py_IS_TYPE(obj, s->type)) {
        PyObject *v = *(PyObject **)((char *)obj + s->offset);
        if (v != NULL) return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, s->name);
}

static inline int slot_bool(const SlotRef *s, PyObject *obj) {
    if (Py_IS_TYPE(obj, s->type)) {
        PyObject *v = *(PyObject **)((char *)obj + s->offset);
        if (v == Py_True) return 1;
        if (v == Py_False) return 0;
    }
    return get_bool(obj, s->name);
}

static inline int slot_double(const SlotRef *s, PyObject *obj, double *out) {
    PyObject *v = slot_get(s, obj);
    if (v == NULL) return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static inline int slot_ll(const SlotRef *s, PyObject *obj, long long *out) {
    PyObject *v = slot_get(s, obj);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static struct {
    SlotRef ref, transparent, selected, id, capture; /* naming.ModuleInfo */
    SlotRef memo, seg, grad_finite;                  /* calls.StepState */
    SlotRef last, every;                             /* handoff.Handoff */
    SlotRef held, budget, entries, sizes;            /* capture.FlightRecorder */
} SLOTS;

/* obj.<slot> = value, as slot_get reads it (setattr where slot_get would getattr) */
static inline int slot_set(const SlotRef *s, PyObject *obj, PyObject *value) {
    if (Py_IS_TYPE(obj, s->type)) {
        PyObject **at = (PyObject **)((char *)obj + s->offset);
        PyObject *old = *at;
        *at = Py_NewRef(value);
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(obj, s->name, value);
}

static inline int is_tensor(PyObject *obj) { return PyObject_IsInstance(obj, G.Tensor); }

/* t's version counter; -1 for an inference tensor, which has none. ``likely``: t is
 * surely not one (made with gradients on, or a gradient), so its version is asked for
 * first, and is_inference() (a slower call) only if that fails. */
static int tensor_version(PyObject *t, int likely, long long *out) {
    if (likely) {
        PyObject *v = PyObject_GetAttr(t, s__version);
        if (v != NULL) {
            *out = PyLong_AsLongLong(v);
            Py_DECREF(v);
            return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
        }
        if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) return -1;
        PyErr_Clear();
    }
    PyObject *inf = call_method0(t, s_is_inference);
    if (inf == NULL) return -1;
    int inference = inf == Py_True;
    Py_DECREF(inf);
    if (inference) {
        *out = -1;
        return 1;
    }
    return get_ll(t, s__version, out) < 0 ? -1 : 0;
}

/* stats.is_finite: no NaN, +inf or -inf counted (shape-only summaries count as finite) */
static int summary_finite(PyObject *summary) {
    if (!PyTuple_Check(summary) || PyTuple_GET_SIZE(summary) <= summary_at.neginf) {
        PyErr_SetString(PyExc_TypeError, "not a summary tuple");
        return -1;
    }
    for (Py_ssize_t i = summary_at.nan; i <= summary_at.neginf; i++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(summary, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v > 0) return 0;
    }
    return 1;
}

static inline int is_pending(PyObject *summary) {
    return (PyObject *)Py_TYPE(summary) == G.Pending;
}

/* -- Lock ------------------------------------------------------------------------------- */

/* A reentrant lock, as threading.RLock is, that the hooks here take without a Python
 * call: the guard's lock is taken twice per hook (the writer thread takes it to collect
 * the rows). Python code uses it as it would an RLock: ``with``, acquire(blocking,
 * timeout) and release(). */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock;
    unsigned long owner; /* the thread holding it (when count > 0) */
    unsigned long count;
} Lock;

static PyTypeObject LockType;

static PyObject *Lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Lock() takes no arguments");
        return NULL;
    }
    Lock *self = (Lock *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    if ((self->lock = PyThread_allocate_lock()) == NULL) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return NULL;
    }
    return (PyObject *)self;
}

static void Lock_dealloc(Lock *self) {
    if (self->lock != NULL) {
        if (self->count > 0) PyThread_release_lock(self->lock);
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1: taken, 0: not within ``timeout`` microseconds (-1: wait as long as it takes),
 * -1: a signal handler raised while waiting */
static int lock_take(Lock *self, PY_TIMEOUT_T timeout) {
    unsigned long me = PyThread_get_thread_ident();
    if (self->count > 0 && self->owner == me) {
        self->count++;
        return 1;
    }
    PyLockStatus r = PyThread_acquire_lock_timed(self->lock, 0, 0);
    while (r != PY_LOCK_ACQUIRED && timeout != 0) {
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(self->lock, timeout, 1);
        Py_END_ALLOW_THREADS
        if (r == PY_LOCK_INTR) {
            if (Py_MakePendingCalls() < 0) return -1;
            continue; /* waiting again restarts the timeout, as threading's locks allow */
        }
        break;
    }
    if (r != PY_LOCK_ACQUIRED) return 0;
    self->owner = me;
    self->count = 1;
    return 1;
}

static int lock_give(Lock *self) {
    if (self->count == 0 || self->owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    if (--self->count == 0) PyThread_release_lock(self->lock);
    return 0;
}

static PyObject *Lock_acquire(Lock *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pd", kw, &blocking, &timeout)) return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    PY_TIMEOUT_T us = !blocking ? 0 : timeout < 0 ? -1 : (PY_TIMEOUT_T)(timeout * 1e6);
    int r = lock_take(self, us);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

static PyObject *Lock_enter(Lock *self, PyObject *unused) {
    int r = lock_take(self, -1);
    if (r < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Lock_release(Lock *self, PyObject *unused) {
    if (lock_give(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Lock_exit(Lock *self, PyObject *args) {
    if (lock_give(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Lock_is_owned(Lock *self, PyObject *unused) {
    return PyBool_FromLong(self->count > 0 && self->owner == PyThread_get_thread_ident());
}

static PyMethodDef Lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))Lock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> whether it was taken (as RLock.acquire)"},
    {"release", (PyCFunction)Lock_release, METH_NOARGS, "Release it once."},
    {"_is_owned", (PyCFunction)Lock_is_owned, METH_NOARGS,
     "Whether this thread holds it (as RLock._is_owned)."},
    {"__enter__", (PyCFunction)Lock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Lock_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyTypeObject LockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hookdbg.recorder._hot.Lock",
    .tp_basicsize = sizeof(Lock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A reentrant lock that the C hooks take without a Python call.",
    .tp_new = Lock_new,
    .tp_dealloc = (destructor)Lock_dealloc,
    .tp_methods = Lock_methods,
};

/* -- Guard ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    char live;
    double overhead;   /* seconds spent inside hookdbg's hooks so far */
    PyObject *lock;    /* a Lock: the writer thread takes it to collect the rows */
    PyObject *alerts;  /* NaN/inf origins found, not acted on yet */
    PyObject *actions; /* acts on them (recorder/alerts/actions.py) */
    PyObject *stopped; /* what a stop says and records (Recorder._stopped), or None */
} Guard;

static PyTypeObject GuardType;

static PyObject *noop(PyObject *self, PyObject *unused) { Py_RETURN_NONE; }
static PyMethodDef noop_def = {"noop", noop, METH_NOARGS, NULL};

static PyObject *Guard_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Guard() takes no arguments");
        return NULL;
    }
    Guard *self = (Guard *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->lock = PyObject_CallNoArgs((PyObject *)&LockType);
    self->alerts = PyList_New(0);
    self->actions = PyCFunction_New(&noop_def, NULL);
    self->stopped = Py_NewRef(Py_None);
    if (self->lock == NULL || self->alerts == NULL || self->actions == NULL) goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static int Guard_traverse(Guard *self, visitproc visit, void *arg) {
    Py_VISIT(self->lock);
    Py_VISIT(self->alerts);
    Py_VISIT(self->actions);
    Py_VISIT(self->stopped);
    return 0;
}

static int Guard_clear(Guard *self) {
    Py_CLEAR(self->lock);
    Py_CLEAR(self->alerts);
    Py_CLEAR(self->actions);
    Py_CLEAR(self->stopped);
    return 0;
}

static void Guard_dealloc(Guard *self) {
    PyObject_GC_UnTrack(self);
    Guard_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A bug in hookdbg must never break training: stop recording, say so, go on (what the
 * recorder's ``stopped`` says and records, while the exception is being handled). */
static PyObject *Guard_broken(Guard *self, PyObject *unused) {
    self->live = 0;
    if (self->stopped != NULL && self->stopped != Py_None) return PyObject_CallNoArgs(self->stopped);
    PyObject *sys_stderr = PySys_GetObject("stderr"); /* borrowed */
    PyObject *traceback = PyImport_ImportModule("traceback");
    if (traceback == NULL) return NULL;
    if (sys_stderr != NULL && sys_stderr != Py_None) {
        PyObject *r = PyObject_CallMethod(
            sys_stderr, "write", "s",
            "hookdbg: internal error, recording stopped (training continues):\n");
        Py_XDECREF(r);
        if (r == NULL) PyErr_Clear();
    }
    PyObject *print_exc = PyObject_GetAttrString(traceback, "print_exc");
    Py_DECREF(traceback);
    if (print_exc == NULL) return NULL;
    PyObject *kw = Py_BuildValue("{sO}", "file", sys_stderr ? sys_stderr : Py_None);
    PyObject *empty = PyTuple_New(0);
    PyObject *r = (kw && empty) ? PyObject_Call(print_exc, empty, kw) : NULL;
    Py_XDECREF(kw);
    Py_XDECREF(empty);
    Py_DECREF(print_exc);
    return r;
}

/* Act on the alerts (``actions``; it may raise into the script), the time it takes
 * counted as hookdbg's (envelope.py's ``Guard.act``). */
static PyObject *Guard_act(Guard *self, PyObject *unused) {
    double t0 = now();
    PyObject *r = PyObject_CallNoArgs(self->actions);
    self->overhead += now() - t0;
    return r;
}

static PyMethodDef Guard_methods[] = {
    {"broken", (PyCFunction)Guard_broken, METH_NOARGS,
     "A bug in hookdbg must never break training: stop recording, say so, go on."},
    {"act", (PyCFunction)Guard_act, METH_NOARGS,
     "Act on the alerts, the time it takes counted as hookdbg's."},
    {NULL},
};

static PyMemberDef Guard_members[] = {
    {"live", T_BOOL, offsetof(Guard, live), 0, "whether recording is live"},
    {"overhead", T_DOUBLE, offsetof(Guard, overhead), 0,
     "seconds spent inside hookdbg's hooks so far"},
    {"lock", T_OBJECT_EX, offsetof(Guard, lock), READONLY, "the lock the writer also takes"},
    {"alerts", T_OBJECT_EX, offsetof(Guard, alerts), 0, "origins found, not acted on yet"},
    {"actions", T_OBJECT_EX, offsetof(Guard, actions), 0, "what acts on the alerts"},
    {"stopped", T_OBJECT, offsetof(Guard, stopped), 0, "what a stop says and records"},
    {NULL},
};

static PyTypeObject GuardType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hookdbg.recorder._hot.Guard",
    .tp_basicsize = sizeof(Guard),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The state every hook reads first (see hookdbg/recorder/calls/envelope.py).",
    .tp_new = Guard_new,
    .tp_traverse = (traverseproc)Guard_traverse,
    .tp_clear = (inquiry)Guard_clear,
    .tp_dealloc = (destructor)Guard_dealloc,
    .tp_methods = Guard_methods,
    .tp_members = Guard_members,
};

/* The envelope around a hook body (envelope.py's ``_guarded``): enter returns 0 to go
 * on (the lock taken, *t0 set), 1 when recording is not live, -1 on error. */
static int envelope_enter(Guard *g, double *t0) {
    *t0 = now();
    if (!g->live) return 1;
    return lock_take((Lock *)g->lock, -1) < 0 ? -1 : 0;
}

/* ``failed``: the body raised. An Exception stops the recording and is swallowed; a
 * BaseException (KeyboardInterrupt) goes on to the script. Returns Py_None or NULL. */
static PyObject *envelope_leave(Guard *g, double t0, int failed) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (failed) {
        if (PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL) PyException_SetTraceback(value, tb);
            PyObject *ot, *ov, *otb;
            PyErr_GetExcInfo(&ot, &ov, &otb);
            PyErr_SetExcInfo(type, value, tb); /* what traceback.print_exc() reports */
            PyObject *r = call_method0((PyObject *)g, s_broken);
            if (r == NULL) PyErr_Clear();
            Py_XDECREF(r);
            PyErr_SetExcInfo(ot, ov, otb);
            type = value = tb = NULL;
            failed = 0;
        } else {
            PyErr_Fetch(&type, &value, &tb);
        }
    }
    g->overhead += now() - t0;
    int released = lock_give((Lock *)g->lock);
    if (failed) {
        if (released < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    if (released < 0) return NULL;
    if (g->alerts != NULL && PyList_Check(g->alerts) && PyList_GET_SIZE(g->alerts) > 0) {
        PyObject *r = Guard_act(g, NULL);
        if (r == NULL) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

/* -- Call ------------------------------------------------------------------------------- */

static const double LATER = 1.0 / 0.0; /* calls.LATER: a time no interval begins at */

typedef struct {
    PyObject_HEAD
    long long id;
    long long bwd_task; /* the backward pass (autograd graph task) that reached it */
    int index;          /* which call of its module in the segment */
    int depth;
    double start, total, child_time;
    double bwd_self;  /* backward time attributed to it (timing.py) */
    double bwd_first; /* when the first of those intervals began (LATER: none) */
    char grad_on, nan_in, tainted, bad_grad, below_bad;
    PyObject *info, *parent, *inf_inputs, *inf_below;
    PyObject *module; /* info.id, read once it is needed (NULL until then) */
    /* backward_rows' scratch: its children's totals and their first interval */
    double child_total, child_first;
} Call;

static PyTypeObject CallType;

static Call *new_call(long long id, PyObject *info, int index, PyObject *parent, double start) {
    Call *c = PyObject_GC_New(Call, &CallType);
    if (c == NULL) return NULL;
    c->id = id;
    c->bwd_task = -1;
    c->index = index;
    c->depth = parent == Py_None ? 0 : ((Call *)parent)->depth + 1;
    c->start = start;
    c->total = c->child_time = 0.0;
    c->bwd_self = 0.0;
    c->bwd_first = LATER;
    c->grad_on = 1;
    c->nan_in = c->tainted = c->bad_grad = c->below_bad = 0;
    c->child_total = 0.0;
    c->child_first = LATER;
    Py_INCREF(info);
    c->info = info;
    Py_INCREF(parent);
    c->parent = parent;
    Py_INCREF(Py_None);
    c->inf_inputs = Py_None;
    Py_INCREF(Py_None);
    c->inf_below = Py_None;
    c->module = NULL;
    PyObject_GC_Track(c);
    return c;
}

static PyObject *Call_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"id", "info", "index", "parent", "start", NULL};
    long long id;
    int index;
    double start;
    PyObject *info, *parent;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LOiOd", kw, &id, &info, &index, &parent,
                                     &start))
        return NULL;
    if (parent != Py_None && !PyObject_TypeCheck(parent, &CallType)) {
        PyErr_SetString(PyExc_TypeError, "a Call's parent is a Call or None");
        return NULL;
    }
    return (PyObject *)new_call(id, info, index, parent, start);
}

static int Call_traverse(Call *self, visitproc visit, void *arg) {
    Py_VISIT(self->info);
    Py_VISIT(self->parent);
    Py_VISIT(self->inf_inputs);
    Py_VISIT(self->inf_below);
    return 0;
}

static int Call_clear(Call *self) {
    Py_CLEAR(self->info);
    Py_CLEAR(self->parent);
    Py_CLEAR(self->inf_inputs);
    Py_CLEAR(self->inf_below);
    Py_CLEAR(self->module);
    return 0;
}

/* The call's module id (its ModuleInfo's id, which never changes), borrowed. */
static PyObject *call_module(Call *c) {
    if (c->module == NULL) c->module = slot_get(&SLOTS.id, c->info);
    return c->module;
}

static void Call_dealloc(Call *self) {
    PyObject_GC_UnTrack(self);
    Py_TRASHCAN_BEGIN(self, Call_dealloc)
    Call_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
    Py_TRASHCAN_END
}

static PyObject *Call_get_parent(Call *self, void *unused) { return Py_NewRef(self->parent); }

static int Call_set_parent(Call *self, PyObject *value, void *unused) {
    if (value == NULL || (value != Py_None && !PyObject_TypeCheck(value, &CallType))) {
        PyErr_SetString(PyExc_TypeError, "a Call's parent is a Call or None");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->parent, value);
    return 0;
}

static PyGetSetDef Call_getset[] = {
    {"parent", (getter)Call_get_parent, (setter)Call_set_parent, "the call around it", NULL},
    {NULL},
};

static PyMemberDef Call_members[] = {
    {"id", T_LONGLONG, offsetof(Call, id), 0, NULL},
    {"info", T_OBJECT_EX, offsetof(Call, info), 0, NULL},
    {"index", T_INT, offsetof(Call, index), 0, NULL},
    {"depth", T_INT, offsetof(Call, depth), 0, NULL},
    {"start", T_DOUBLE, offsetof(Call, start), 0, NULL},
    {"total", T_DOUBLE, offsetof(Call, total), 0, NULL},
    {"child_time", T_DOUBLE, offsetof(Call, child_time), 0, NULL},
    {"grad_on", T_BOOL, offsetof(Call, grad_on), 0, NULL},
    {"bwd_task", T_LONGLONG, offsetof(Call, bwd_task), 0, NULL},
    {"bwd_self", T_DOUBLE, offsetof(Call, bwd_self), 0, NULL},
    {"bwd_first", T_DOUBLE, offsetof(Call, bwd_first), 0, NULL},
    {"nan_in", T_BOOL, offsetof(Call, nan_in), 0, NULL},
    {"inf_inputs", T_OBJECT, offsetof(Call, inf_inputs), 0, NULL},
    {"inf_below", T_OBJECT, offsetof(Call, inf_below), 0, NULL},
    {"tainted", T_BOOL, offsetof(Call, tainted), 0, NULL},
    {"bad_grad", T_BOOL, offsetof(Call, bad_grad), 0, NULL},
    {"below_bad", T_BOOL, offsetof(Call, below_bad), 0, NULL},
    {NULL},
};

static PyObject *Call_note_inf_below(Call *self, PyObject *birth) {
    PyObject *p = self->parent;
    while (p != Py_None && ((Call *)p)->inf_below == Py_None) {
        Py_INCREF(birth);
        Py_SETREF(((Call *)p)->inf_below, birth);
        p = ((Call *)p)->parent;
    }
    Py_RETURN_NONE;
}

static PyObject *Call_mark_below_bad(Call *self, PyObject *unused) {
    PyObject *p = self->parent;
    while (p != Py_None && !((Call *)p)->below_bad) {
        ((Call *)p)->below_bad = 1;
        p = ((Call *)p)->parent;
    }
    Py_RETURN_NONE;
}

static PyMethodDef Call_methods[] = {
    {"note_inf_below", (PyCFunction)Call_note_inf_below, METH_O,
     "Tell the enclosing calls where an inf made inside them was born."},
    {"mark_below_bad", (PyCFunction)Call_mark_below_bad, METH_NOARGS,
     "Tell every enclosing call that a gradient went non-finite inside it."},
    {NULL},
};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hookdbg.recorder._hot.Call",
    .tp_basicsize = sizeof(Call),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A recorded module call (see hookdbg/recorder/calls/calls.py).",
    .tp_new = Call_new,
    .tp_traverse = (traverseproc)Call_traverse,
    .tp_clear = (inquiry)Call_clear,
    .tp_dealloc = (destructor)Call_dealloc,
    .tp_members = Call_members,
    .tp_getset = Call_getset,
    .tp_methods = Call_methods,
};

/* -- SeenTensor ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    long long version, segment;
    int nr;
    char finite, alerted, hooked, timing_only;
    PyObject *ref, *summary, *producer, *grad_slots, *birth;
    PyObject *owner; /* the TensorPath whose gradient hook it is (set when hooked here) */
} SeenTensor;

static PyTypeObject SeenTensorType;

static SeenTensor *new_seen(PyObject *t, long long version, PyObject *summary, int finite,
                      long long segment) {
    PyObject *ref = PyWeakref_NewRef(t, NULL);
    if (ref == NULL) return NULL;
    PyObject *slots = PyList_New(0);
    if (slots == NULL) {
        Py_DECREF(ref);
        return NULL;
    }
    SeenTensor *s = PyObject_GC_New(SeenTensor, &SeenTensorType);
    if (s == NULL) {
        Py_DECREF(ref);
        Py_DECREF(slots);
        return NULL;
    }
    s->version = version;
    s->segment = segment;
    s->nr = 0;
    s->finite = (char)finite;
    s->alerted = s->hooked = s->timing_only = 0;
    s->ref = ref;
    Py_INCREF(summary);
    s->summary = summary;
    Py_INCREF(Py_None);
    s->producer = Py_None;
    s->grad_slots = slots;
    Py_INCREF(Py_None);
    s->birth = Py_None;
    s->owner = NULL;
    PyObject_GC_Track(s);
    return s;
}

static PyObject *SeenTensor_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"tensor", "version", "summary", "finite", "segment", NULL};
    PyObject *t, *summary;
    long long version, segment;
    int finite;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OLOpL", kw, &t, &version, &summary, &finite,
                                     &segment))
        return NULL;
    return (PyObject *)new_seen(t, version, summary, finite, segment);
}

static int SeenTensor_traverse(SeenTensor *self, visitproc visit, void *arg) {
    Py_VISIT(self->ref);
    Py_VISIT(self->summary);
    Py_VISIT(self->producer);
    Py_VISIT(self->grad_slots);
    Py_VISIT(self->birth);
    Py_VISIT(self->owner);
    return 0;
}

static int SeenTensor_clear(SeenTensor *self) {
    Py_CLEAR(self->ref);
    Py_CLEAR(self->summary);
    Py_CLEAR(self->producer);
    Py_CLEAR(self->grad_slots);
    Py_CLEAR(self->birth);
    Py_CLEAR(self->owner);
    return 0;
}

static void SeenTensor_dealloc(SeenTensor *self) {
    PyObject_GC_UnTrack(self);
    SeenTensor_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *SeenTensor_slots(SeenTensor *self, PyObject *unused) {
    PyObject *g = self->grad_slots;
    Py_ssize_t n = PyList_GET_SIZE(g) / 3;
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *triple = PyTuple_Pack(3, PyList_GET_ITEM(g, 3 * i),
                                        PyList_GET_ITEM(g, 3 * i + 1),
                                        PyList_GET_ITEM(g, 3 * i + 2));
        if (triple == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, triple);
    }
    return out;
}

static PyMethodDef SeenTensor_methods[] = {
    {"slots", (PyCFunction)SeenTensor_slots, METH_NOARGS,
     "grad_slots as (call, slot, path) triples."},
    {NULL},
};

static PyMemberDef SeenTensor_members[] = {
    {"ref", T_OBJECT_EX, offsetof(SeenTensor, ref), 0, NULL},
    {"version", T_LONGLONG, offsetof(SeenTensor, version), 0, NULL},
    {"summary", T_OBJECT, offsetof(SeenTensor, summary), 0, NULL},
    {"finite", T_BOOL, offsetof(SeenTensor, finite), 0, NULL},
    {"producer", T_OBJECT, offsetof(SeenTensor, producer), 0, NULL},
    {"grad_slots", T_OBJECT_EX, offsetof(SeenTensor, grad_slots), 0, NULL},
    {"segment", T_LONGLONG, offsetof(SeenTensor, segment), 0, NULL},
    {"alerted", T_BOOL, offsetof(SeenTensor, alerted), 0, NULL},
    {"birth", T_OBJECT, offsetof(SeenTensor, birth), 0, NULL},
    {"hooked", T_BOOL, offsetof(SeenTensor, hooked), 0, NULL},
    {"nr", T_INT, offsetof(SeenTensor, nr), 0, NULL},
    {"timing_only", T_BOOL, offsetof(SeenTensor, timing_only), 0, NULL},
    {NULL},
};

static PyObject *SeenTensor_call(SeenTensor *self, PyObject *args, PyObject *kwds);

static PyTypeObject SeenTensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hookdbg.recorder._hot.SeenTensor",
    .tp_basicsize = sizeof(SeenTensor),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A tensor (object and version) seen in a segment (see calls.py); called with "
              "a gradient, the hook that reports it.",
    .tp_new = SeenTensor_new,
    .tp_traverse = (traverseproc)SeenTensor_traverse,
    .tp_clear = (inquiry)SeenTensor_clear,
    .tp_dealloc = (destructor)SeenTensor_dealloc,
    .tp_members = SeenTensor_members,
    .tp_methods = SeenTensor_methods,
    .tp_call = (ternaryfunc)SeenTensor_call,
};

/* -- SegmentView: what the current segment's state says -------------------------------- */

/* What a segment's state (a StepState) says and never changes, read once when it is set:
 * the tensor path and the call path each keep one. */
typedef struct {
    PyObject *state;                /* the StepState */
    PyObject *calls, *module_calls; /* state.calls, state.module_calls */
    long long step, id;             /* state.step, state.id */
    char recording, deferring;      /* state.recording, state.batch is not None */
} SegmentView;

/* A ``state`` setter's body: all of ``state`` read first, then what ``v`` held replaced */
static int view_segment(SegmentView *v, PyObject *state) {
    if (state == NULL) {
        PyErr_SetString(PyExc_TypeError, "the state cannot be deleted");
        return -1;
    }
    SegmentView next = {.state = state};
    if (get_ll(state, s_step, &next.step) < 0 || get_ll(state, s_id, &next.id) < 0) return -1;
    int recording = get_bool(state, s_recording);
    if (recording < 0) return -1;
    next.recording = (char)recording;
    PyObject *batch = PyObject_GetAttr(state, s_batch);
    if (batch == NULL) return -1;
    next.deferring = batch != Py_None;
    Py_DECREF(batch);
    if ((next.calls = PyObject_GetAttr(state, s_calls)) == NULL) return -1;
    if ((next.module_calls = PyObject_GetAttr(state, s_module_calls)) == NULL ||
        !PyList_Check(next.calls) || !PyDict_Check(next.module_calls)) {
        if (next.module_calls != NULL)
            PyErr_SetString(PyExc_TypeError, "a state's calls are a list, module_calls a dict");
        Py_DECREF(next.calls);
        Py_XDECREF(next.module_calls);
        return -1;
    }
    Py_INCREF(state);
    SegmentView old = *v;
    *v = next;
    Py_XDECREF(old.state);
    Py_XDECREF(old.calls);
    Py_XDECREF(old.module_calls);
    return 0;
}

static PyObject *segment_state(SegmentView *v) {
    return Py_NewRef(v->state ? v->state : Py_None);
}

static int visit_segment(SegmentView *v, visitproc visit, void *arg) {
    Py_VISIT(v->state);
    Py_VISIT(v->calls);
    Py_VISIT(v->module_calls);
    return 0;
}

static void clear_segment(SegmentView *v) {
    Py_CLEAR(v->state);
    Py_CLEAR(v->calls);
    Py_CLEAR(v->module_calls);
}

/* -- TensorPath: the tensor observer's per-tensor path --------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *dict;
    PyObject *guard;     /* Guard */
    PyObject *rows;      /* store.rows.Rows */
    PyObject *steps;     /* steps.StepTracker */
    PyObject *flight;    /* capture.FlightRecorder or None */
    PyObject *summary;   /* how a tensor is summarised at this level, or None */
    SegmentView segment; /* the current segment's state */
    PyObject *gradients; /* gradients.GradientObserver */
    PyObject *tensor_rows; /* rows.tensors: a RowBuffer */
    long long heard; /* the segment whose backward pass the steps have heard of */
    PyObject *flight_entries, *flight_sizes; /* the flight recorder's, for flight_of */
    long long flight_of; /* the segment they are for (FlightRecorder.new_step made them) */
    PyObject *flight_last; /* the tensor last kept there (borrowed: the entries hold it) */
    char emit_tensors, check_nan, defer_all, capturing, keeping, defer_checks;
    /* where the current backward pass stands (timing.Mark) */
    double bwd_mark, bwd_attributed;
    long long bwd_mark_task;
    PyObject *bwd_current, *bwd_last; /* Calls, or NULL (None) */
    PyObject *device_mark; /* devicetime.DeviceClock.mark while timing on a GPU, or NULL */
} TensorPath;

static PyTypeObject TensorPathType;

static int TensorPath_traverse(TensorPath *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->guard);
    Py_VISIT(self->rows);
    Py_VISIT(self->steps);
    Py_VISIT(self->flight);
    Py_VISIT(self->summary);
    int r = visit_segment(&self->segment, visit, arg);
    if (r) return r;
    Py_VISIT(self->gradients);
    Py_VISIT(self->tensor_rows);
    Py_VISIT(self->flight_entries);
    Py_VISIT(self->flight_sizes);
    Py_VISIT(self->bwd_current);
    Py_VISIT(self->bwd_last);
    Py_VISIT(self->device_mark);
    return 0;
}

static int TensorPath_clear(TensorPath *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->guard);
    Py_CLEAR(self->rows);
    Py_CLEAR(self->steps);
    Py_CLEAR(self->flight);
    Py_CLEAR(self->summary);
    clear_segment(&self->segment);
    Py_CLEAR(self->gradients);
    Py_CLEAR(self->tensor_rows);
    Py_CLEAR(self->flight_entries);
    Py_CLEAR(self->flight_sizes);
    Py_CLEAR(self->bwd_current);
    Py_CLEAR(self->bwd_last);
    Py_CLEAR(self->device_mark);
    return 0;
}

static void TensorPath_dealloc(TensorPath *self) {
    PyObject_GC_UnTrack(self);
    TensorPath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ready(TensorPath *o) {
    if (!G.ready) {
        PyErr_SetString(PyExc_RuntimeError, "hookdbg.recorder._hot.setup() was not called");
        return 0;
    }
    if (o->guard == NULL || !PyObject_TypeCheck(o->guard, &GuardType) || o->segment.state == NULL ||
        o->rows == NULL || o->tensor_rows == NULL || o->steps == NULL || o->gradients == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the tensor observer is not set up");
        return 0;
    }
    return 1;
}

/* stats.shape_of: t's shape as a plain tuple, one shared object per distinct shape */
static PyObject *shape_of(PyObject *t) {
    PyObject *size = PyObject_GetAttr(t, s_shape);
    if (size == NULL) return NULL;
    PyObject *shape = PyDict_GetItemWithError(G.shapes, size);
    if (shape != NULL) {
        Py_DECREF(size);
        return Py_NewRef(shape);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(size);
        return NULL;
    }
    shape = PySequence_Tuple(size);
    Py_DECREF(size);
    if (shape == NULL) return NULL;
    if (PyDict_GET_SIZE(G.shapes) < G.shapes_kept && PyDict_SetItem(G.shapes, shape, shape) < 0) {
        Py_DECREF(shape);
        return NULL;
    }
    return shape;
}

/* A CPU tensor of a kind stats.C_KINDS names, as the summaries made here read it: its
 * (kind, name) spec (borrowed: C_KINDS never changes), its shape (a new reference,
 * stats.shape_of) and its element count from that shape (numel() without the call).
 * 1: read; 0: another tensor (another dtype or device, a symbolic size, a subclass), for
 * Python; -1: an error. A subclass is never read here: a wrapper's shape is not its
 * storage's (a DTensor's is the global one, and its data_ptr is its storage offset). */
static int host_tensor(PyObject *t, PyObject **spec, PyObject **shape, long long *n) {
    if (!Py_IS_TYPE(t, (PyTypeObject *)G.Tensor) && !Py_IS_TYPE(t, (PyTypeObject *)G.Parameter))
        return 0;
    PyObject *v = PyObject_GetAttr(t, s_dtype);
    if (v == NULL) return -1;
    *spec = PyDict_GetItemWithError(G.c_kinds, v);
    Py_DECREF(v);
    if (*spec == NULL) return PyErr_Occurred() ? -1 : 0;
    int cpu = get_bool(t, s_is_cpu);
    if (cpu <= 0) return cpu;
    if ((*shape = shape_of(t)) == NULL) return -1;
    long long count = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(*shape); i++) {
        PyObject *size = PyTuple_GET_ITEM(*shape, i);
        if (!PyLong_CheckExact(size)) { /* a symbolic size: numel() knows */
            Py_CLEAR(*shape);
            return 0;
        }
        long long d = PyLong_AsLongLong(size);
        if (d == -1 && PyErr_Occurred()) {
            Py_CLEAR(*shape);
            return -1;
        }
        count *= d;
    }
    *n = count;
    return 1;
}

/* stats.summarise for a contiguous CPU tensor of a kind the C pass reads: the pass
 * itself, without the Python around it. Anything else: stats.summarise. */
static PyObject *summarise_host(PyObject *t) {
    PyObject *spec, *shape, *v = NULL;
    long long n;
    if (G.one_pass == Py_None) goto python;
    int read = host_tensor(t, &spec, &shape, &n);
    if (read < 0) return NULL;
    if (!read) goto python;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    int contiguous = 0;
    if (n > 0 && !((kind == 2 || kind == 3) && n > G.half_wide)) {
        if ((v = call_method0(t, s_is_contiguous)) == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        contiguous = v == Py_True;
        Py_CLEAR(v);
    }
    if (!contiguous) {
        Py_DECREF(shape);
        goto python;
    }
    PyObject *address = call_method0(t, s_data_ptr);
    if (address == NULL) {
        Py_DECREF(shape);
        return NULL;
    }
    if (!PyObject_IsTrue(address)) { /* a torch.func wrapper (functionalize's): left to Python */
        Py_DECREF(address);
        Py_DECREF(shape);
        PyErr_SetString(PyExc_RuntimeError, "the tensor's values are not in its storage");
        return NULL;
    }
    PyObject *count = PyLong_FromLongLong(n);
    if (count == NULL) {
        Py_DECREF(address);
        Py_DECREF(shape);
        return NULL;
    }
    PyObject *args[5] = {address, count, PyTuple_GET_ITEM(spec, 0), shape,
                         PyTuple_GET_ITEM(spec, 1)};
    PyObject *summary = PyObject_Vectorcall(G.one_pass, args, 5, NULL);
    Py_DECREF(address);
    Py_DECREF(count);
    Py_DECREF(shape);
    return summary;
python:
    return PyObject_CallOneArg(G.summarise, t);
}

/* stats.shape_only for a CPU tensor of a dtype C_KINDS names, outside torch.func's
 * transforms; anything else: stats.shape_only. */
static PyObject *shape_only(PyObject *t) {
    PyObject *v = PyObject_CallNoArgs(G.transforms_active);
    if (v == NULL) return NULL;
    int plain = v == Py_False;
    Py_DECREF(v);
    if (!plain) goto python;
    PyObject *spec, *shape;
    long long n;
    int read = host_tensor(t, &spec, &shape, &n);
    if (read < 0) return NULL;
    if (!read) goto python;
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    PyObject *rest = kind <= 3 && n == 0 ? G.empty_float_stats : G.no_stats; /* 3: bfloat16 */
    /* the values after the head (stats.values), in the declared order */
    if (PyTuple_GET_SIZE(rest) != summary_length - summary_at.min) {
        Py_DECREF(shape);
        PyErr_SetString(PyExc_SystemError, "stats' values do not fit the declared summary");
        return NULL;
    }
    PyObject *summary = PyTuple_New(summary_length), *count = PyLong_FromLongLong(n);
    if (summary == NULL || count == NULL) {
        Py_XDECREF(summary);
        Py_XDECREF(count);
        Py_DECREF(shape);
        return NULL;
    }
    PyTuple_SET_ITEM(summary, summary_at.shape, shape);
    PyTuple_SET_ITEM(summary, summary_at.dtype, Py_NewRef(PyTuple_GET_ITEM(spec, 1)));
    PyTuple_SET_ITEM(summary, summary_at.device, Py_NewRef(G.cpu));
    PyTuple_SET_ITEM(summary, summary_at.numel, count);
    for (Py_ssize_t i = summary_at.min; i < summary_length; i++)
        PyTuple_SET_ITEM(summary, i, Py_NewRef(PyTuple_GET_ITEM(rest, i - summary_at.min)));
    if (!PyObject_GC_IsTracked(shape)) PyObject_GC_UnTrack(summary); /* as _cstats' */
    return summary;
python:
    return PyObject_CallOneArg(G.shape_only, t);
}

static PyObject *summarise_now(TensorPath *o, PyObject *t) {
    PyObject *layout = PyObject_GetAttr(t, s_layout);
    if (layout == NULL) return NULL;
    int strided = layout == G.strided;
    Py_DECREF(layout);
    if (!strided) return PyObject_CallOneArg(G.shape_only, t); /* sparse, nested: numel() */
    if (o->summary == G.shape_only) return shape_only(t);
    if (o->summary == G.summarise) return summarise_host(t);
    return PyObject_CallOneArg(o->summary, t);
}

/* TensorObserver.summarise: computed now, or (a device batch) left to Python. A tensor
 * whose values cannot be read here (a torch.func wrapper has no storage of its own) is
 * left to Python too, which unwraps it or raises the error again. */
static PyObject *summarise(TensorPath *o, PyObject *t) {
    if (o->summary == Py_None) return Py_NewRef(Py_None); /* timing: no summary */
    if (o->segment.deferring) return call_method1((PyObject *)o, s__py_summarise, t);
    PyObject *summary = summarise_now(o, t);
    if (summary == NULL && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        PyErr_Clear();
        summary = call_method1((PyObject *)o, s__py_summarise, t);
    }
    return summary;
}

static PyObject *TensorPath_summarise(TensorPath *self, PyObject *t) {
    if (!ready(self)) return NULL;
    return summarise(self, t);
}

/* FlightRecorder.keep: hold ``t`` for this step; the rare case (the budget is full: the
 * older step's tensors go first) is left to the Python method. */
static int flight_keep(TensorPath *o, Call *call, PyObject *phase, PyObject *slot,
                       PyObject *path, PyObject *t, long long version) {
    PyObject *flight = o->flight;
    if (o->flight_of != o->segment.id) { /* FlightRecorder.new_step made them for this one */
        PyObject *entries = slot_get(&SLOTS.entries, flight);
        PyObject *sizes = entries == NULL ? NULL : slot_get(&SLOTS.sizes, flight);
        if (sizes == NULL || !PyList_Check(entries) || !PyDict_Check(sizes)) {
            if (sizes != NULL) PyErr_SetString(PyExc_TypeError, "the flight recorder's step");
            Py_XDECREF(entries);
            Py_XDECREF(sizes);
            return -1;
        }
        Py_XSETREF(o->flight_entries, entries);
        Py_XSETREF(o->flight_sizes, sizes);
        o->flight_of = o->segment.id;
        o->flight_last = NULL;
    }
    PyObject *ver = PyLong_FromLongLong(version), *key = NULL, *entries = NULL;
    PyObject *sizes = Py_NewRef(o->flight_sizes);
    int rc = -1;
    if (ver == NULL) goto done;
    /* the tensor kept just before (a call's input is the output before it; a gradient
     * is kept once per slot, one after the other) is counted already */
    if (t != o->flight_last) {
        if ((key = PyLong_FromVoidPtr(t)) == NULL) goto done;
        int known = PyDict_Contains(sizes, key);
        if (known < 0) goto done;
        if (!known) {
            long long size, held, budget;
            PyObject *v = PyObject_GetAttr(t, s_layout);
            if (v == NULL) goto done;
            int strided = v == G.strided;
            Py_DECREF(v);
            if (!strided) { /* a sparse or nested tensor has no nbytes: not kept */
                rc = 0;
                goto done;
            }
            if (get_ll(t, s_nbytes, &size) < 0 || slot_ll(&SLOTS.held, flight, &held) < 0 ||
                slot_ll(&SLOTS.budget, flight, &budget) < 0)
                goto done;
            if (held + size > budget) { /* the older step goes first, or this one is full */
                o->flight_last = NULL;
                PyObject *args[6] = {(PyObject *)call, phase, slot, path, t, ver};
                rc = call_void(flight, s_keep, args, 6);
                goto done;
            }
            PyObject *bytes = PyLong_FromLongLong(size), *total = PyLong_FromLongLong(held + size);
            int bad = bytes == NULL || total == NULL || PyDict_SetItem(sizes, key, bytes) < 0 ||
                      slot_set(&SLOTS.held, flight, total) < 0;
            Py_XDECREF(bytes);
            Py_XDECREF(total);
            if (bad) goto done;
        }
    }
    entries = Py_NewRef(o->flight_entries);
    PyObject *values[6] = {(PyObject *)call, phase, slot, path, ver, t};
    for (int i = 0; i < 6; i++)
        if (PyList_Append(entries, values[i]) < 0) goto done;
    o->flight_last = t;
    rc = 0;
done:
    Py_DECREF(sizes);
    Py_XDECREF(key);
    Py_XDECREF(ver);
    Py_XDECREF(entries);
    return rc;
}

/* One row of the tensors table, (call, step, segment, module, phase, slot, path, summary)
 * as observe.py's tuples hold them: straight into its buffer, or, while its statistics
 * wait for the device, as a tuple in the step's batch until they are read back. */
static int tensor_row(TensorPath *o, long long call, PyObject *module, PyObject *phase,
                      PyObject *slot, PyObject *path, PyObject *summary) {
    if (is_pending(summary)) {
        PyObject *cid = PyLong_FromLongLong(call), *step = PyLong_FromLongLong(o->segment.step);
        PyObject *sid = PyLong_FromLongLong(o->segment.id), *row = NULL, *into = NULL;
        PyObject *batch = PyObject_GetAttr(o->segment.state, s_batch);
        int rc = -1;
        if (cid != NULL && step != NULL && sid != NULL && batch != NULL &&
            (row = PyTuple_Pack(8, cid, step, sid, module, phase, slot, path, summary)) != NULL &&
            (into = PyObject_GetAttr(batch, s_rows)) != NULL)
            rc = PyList_Append(into, row);
        Py_XDECREF(cid);
        Py_XDECREF(step);
        Py_XDECREF(sid);
        Py_XDECREF(batch);
        Py_XDECREF(row);
        Py_XDECREF(into);
        return rc;
    }
    RowValue row[8] = {
        ROW_LONG(call),        ROW_LONG(o->segment.step),    ROW_LONG(o->segment.id), ROW_OBJECT(module),
        ROW_OBJECT(phase),     ROW_OBJECT(slot),     ROW_OBJECT(path),     ROW_OBJECT(summary),
    };
    return G.rows->append(o->tensor_rows, row, 8);
}

/* TensorObserver.keep: the row, the flight-recorder entry and the capture of one tensor
 * of one call (``t`` at ``version``, -1 for an inference tensor). */
static int keep(TensorPath *o, Call *call, PyObject *phase, PyObject *slot, PyObject *path,
                PyObject *t, PyObject *summary, long long version) {
    if (!Py_IS_TYPE(t, (PyTypeObject *)G.Tensor) && !Py_IS_TYPE(t, (PyTypeObject *)G.Parameter)) {
        PyObject *args[5] = {(PyObject *)call, phase, slot, path, t}; /* a DTensor's shard */
        if (call_void((PyObject *)o, s_shard, args, 5) < 0) return -1;
    }
    if (o->emit_tensors) {
        PyObject *mid = call_module(call);
        if (mid == NULL) return -1;
        if (tensor_row(o, call->id, mid, phase, slot, path, summary) < 0) return -1;
    }
    if (o->flight != NULL && o->flight != Py_None &&
        flight_keep(o, call, phase, slot, path, t, version) < 0)
        return -1;
    if (o->capturing) {
        int chosen = slot_bool(&SLOTS.capture, call->info);
        if (chosen < 0) return -1;
        if (chosen) {
            PyObject *args[5] = {(PyObject *)call, phase, slot, path, t};
            if (call_void((PyObject *)o, s_capture, args, 5) < 0) return -1;
        }
    }
    return 0;
}

static PyObject *TensorPath_keep(TensorPath *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 7 || !PyObject_TypeCheck(args[0], &CallType)) {
        PyErr_SetString(PyExc_TypeError, "keep(call, phase, slot, path, t, summary, version)");
        return NULL;
    }
    if (!ready(self)) return NULL;
    long long version = PyLong_AsLongLong(args[6]);
    if (version == -1 && PyErr_Occurred()) return NULL;
    if (keep(self, (Call *)args[0], args[1], args[2], args[3], args[4], args[5], version) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* GradientObserver.watch_tensor's hook on a node: in a GradHooks dict as the tensor's hooks,
 * registered with the node; or, for a tensor with hooks already or of a subclass, a
 * pre-hook on the node */
static int hook_node(PyObject *node, PyObject *t, SeenTensor *seen) {
    if (Py_IS_TYPE(t, (PyTypeObject *)G.Tensor)) {
        PyObject *had = PyObject_GetAttr(t, s__backward_hooks);
        if (had == NULL) return -1;
        Py_DECREF(had);
        if (had == Py_None) {
            PyObject *hooks = PyObject_CallNoArgs(G.GradHooks);
            if (hooks == NULL) return -1;
            int rc = -1;
            if (PyDict_SetItem(hooks, G.hook_key, (PyObject *)seen) == 0 &&
                PyObject_SetAttr(t, s__backward_hooks, hooks) == 0) {
                rc = call_void(node, s__register_hook_dict, &t, 1);
                if (rc < 0) { /* not left where the script's hooks would go unheard */
                    PyObject *type, *value, *tb;
                    PyErr_Fetch(&type, &value, &tb);
                    if (PyObject_SetAttr(t, s__backward_hooks, Py_None) < 0) PyErr_Clear();
                    PyErr_Restore(type, value, tb);
                }
            }
            Py_DECREF(hooks);
            return rc;
        }
    }
    long long nr;
    if (get_ll(t, s_output_nr, &nr) < 0) return -1;
    seen->nr = (int)nr;
    return call_void(node, s_register_prehook, (PyObject *const *)&seen, 1);
}

/* GradientObserver.watch_tensor: the SeenTensor record itself is the hook */
static int watch(TensorPath *o, PyObject *t, SeenTensor *seen) {
    seen->hooked = 1;
    Py_INCREF(o);
    Py_XSETREF(seen->owner, (PyObject *)o);
    PyObject *node = PyObject_GetAttr(t, s_grad_fn);
    if (node == NULL) return -1;
    int rc = node == Py_None ? call_void(t, s_register_hook, (PyObject *const *)&seen, 1)
                             : hook_node(node, t, seen);
    Py_DECREF(node);
    return rc;
}

static PyObject *TensorPath_fast_watch(TensorPath *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2 || !PyObject_TypeCheck(args[1], &SeenTensorType)) {
        PyErr_SetString(PyExc_TypeError, "fast_watch(t, seen)");
        return NULL;
    }
    if (!ready(self) || watch(self, args[0], (SeenTensor *)args[1]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* TensorObserver.see: the segment's record of ``t`` at its current version, summarised
 * once (``likely``: see tensor_version). Returns a new reference. */
static SeenTensor *see(TensorPath *o, PyObject *t, int reuse, int likely) {
    PyObject *state = o->segment.state, *memo = NULL, *key = NULL, *summary = NULL, *base = NULL;
    SeenTensor *seen = NULL;
    long long version;
    int inference = tensor_version(t, likely, &version);
    if (inference < 0) return NULL;
    if ((memo = slot_get(&SLOTS.memo, state)) == NULL) return NULL;
    if ((key = PyLong_FromVoidPtr(t)) == NULL) goto fail;
    seen = (SeenTensor *)PyDict_GetItemWithError(memo, key); /* borrowed */
    if (seen != NULL && Py_IS_TYPE(seen, &SeenTensorType) && seen->version == version &&
        (reuse || !inference)) {
        PyObject *obj = deref(seen->ref);
        if (obj == NULL) goto fail;
        Py_DECREF(obj);
        if (obj == t) {
            Py_INCREF(seen);
            if (!seen->hooked) {
                int needs = get_bool(t, s_requires_grad);
                if (needs < 0 || (needs && watch(o, t, seen) < 0)) {
                    Py_DECREF(seen);
                    seen = NULL;
                    goto fail;
                }
            }
            Py_DECREF(memo);
            Py_DECREF(key);
            return seen;
        }
    } else if (seen == NULL && PyErr_Occurred()) {
        goto fail;
    }
    seen = NULL;
    /* a view (flatten, transpose) of a tensor seen: same numbers, its summary reshaped
     * (at --level timing there are no summaries to share) */
    if (o->summary != Py_None && (base = PyObject_GetAttr(t, s__base)) == NULL) goto fail;
    if (base != NULL && base != Py_None) {
        PyObject *bkey = PyLong_FromVoidPtr(base);
        if (bkey == NULL) goto fail;
        SeenTensor *of = (SeenTensor *)PyDict_GetItemWithError(memo, bkey);
        Py_DECREF(bkey);
        if (of == NULL && PyErr_Occurred()) goto fail;
        if (of != NULL && Py_IS_TYPE(of, &SeenTensorType) && of->summary != Py_None &&
            of->version == version && !is_pending(of->summary)) {
            PyObject *obj = deref(of->ref);
            if (obj == NULL) goto fail;
            Py_DECREF(obj);
            int same = obj == base;
            if (same) { /* as many elements as the summary (not so for a view under vmap) */
                PyObject *b = call_method0(t, s_numel);
                same = b != NULL && PyTuple_GET_SIZE(of->summary) > summary_at.numel &&
                       PyObject_RichCompareBool(PyTuple_GET_ITEM(of->summary, summary_at.numel),
                                                b, Py_EQ) == 1;
                Py_XDECREF(b);
                if (PyErr_Occurred()) goto fail;
            }
            if (same) {
                PyObject *a = PyObject_GetAttr(base, s_dtype), *b = PyObject_GetAttr(t, s_dtype);
                same = a != NULL && b != NULL && PyObject_RichCompareBool(a, b, Py_EQ) == 1;
                Py_XDECREF(a);
                Py_XDECREF(b);
                if (PyErr_Occurred()) goto fail;
            }
            if (same) { /* stats.reshaped */
                PyObject *shape = shape_of(t);
                if (shape == NULL) goto fail;
                Py_ssize_t k = PyTuple_GET_SIZE(of->summary);
                summary = PyTuple_New(k);
                if (summary == NULL) {
                    Py_DECREF(shape);
                    goto fail;
                }
                for (Py_ssize_t i = 0; i < k; i++)
                    PyTuple_SET_ITEM(summary, i,
                                     i == summary_at.shape
                                         ? shape
                                         : Py_NewRef(PyTuple_GET_ITEM(of->summary, i)));
            }
        }
    }
    if (summary == NULL && (summary = summarise(o, t)) == NULL) goto fail;
    int finite = 1;
    if (o->check_nan && summary != Py_None && !is_pending(summary)) {
        if ((finite = summary_finite(summary)) < 0) goto fail;
    }
    if ((seen = new_seen(t, version, summary, finite, o->segment.id)) == NULL) goto fail;
    if (PyDict_SetItem(memo, key, (PyObject *)seen) < 0) goto fail;
    int needs = get_bool(t, s_requires_grad);
    if (needs < 0 || (needs && watch(o, t, seen) < 0)) goto fail;
    Py_DECREF(memo);
    Py_DECREF(key);
    Py_DECREF(summary);
    Py_XDECREF(base);
    return seen;
fail:
    Py_XDECREF(memo);
    Py_XDECREF(key);
    Py_XDECREF(summary);
    Py_XDECREF(base);
    Py_XDECREF(seen);
    return NULL;
}

static PyObject *TensorPath_see(TensorPath *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"t", "reuse", NULL};
    PyObject *t;
    int reuse = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|p", kw, &t, &reuse)) return NULL;
    if (!ready(self)) return NULL;
    return (PyObject *)see(self, t, reuse, 0);
}

static int extend_slots(SeenTensor *seen, Call *call, PyObject *slot, PyObject *path) {
    PyObject *g = seen->grad_slots;
    if (PyList_Append(g, (PyObject *)call) < 0 || PyList_Append(g, slot) < 0 ||
        PyList_Append(g, path) < 0)
        return -1;
    return 0;
}

/* TensorObserver.input: a tensor the call receives */
static int input(TensorPath *o, Call *call, PyObject *path, PyObject *t, PyObject *module,
                 PyObject *args) {
    SeenTensor *seen = see(o, t, 1, call->grad_on);
    if (seen == NULL) return -1;
    int rc = -1;
    if (extend_slots(seen, call, G.grad_input, path) < 0) goto done;
    if (o->keeping &&
        keep(o, call, G.fwd, G.input, path, t, seen->summary, seen->version) < 0)
        goto done;
    if (!seen->finite || o->defer_checks) {
        PyObject *a[5] = {(PyObject *)call, path, (PyObject *)seen, module, args};
        if (call_void((PyObject *)o, s__check_input, a, 5) < 0) goto done;
    }
    rc = 0;
done:
    Py_DECREF(seen);
    return rc;
}

/* TensorObserver.output: a tensor the call returns */
static int output(TensorPath *o, Call *call, PyObject *path, PyObject *t, PyObject *module,
                  PyObject *args, PyObject *result) {
    SeenTensor *seen = see(o, t, 0, call->grad_on);
    if (seen == NULL) return -1;
    int rc = -1;
    if (seen->producer == Py_None) {
        Py_INCREF(call);
        Py_SETREF(seen->producer, (PyObject *)call);
    }
    if (extend_slots(seen, call, G.grad_output, path) < 0) goto done;
    if (o->keeping &&
        keep(o, call, G.fwd, G.output, path, t, seen->summary, seen->version) < 0)
        goto done;
    if (!seen->finite || o->defer_checks) {
        PyObject *a[6] = {(PyObject *)call, path, (PyObject *)seen, module, args, result};
        if (call_void((PyObject *)o, s__check_output, a, 6) < 0) goto done;
    }
    rc = 0;
done:
    Py_DECREF(seen);
    return rc;
}

static inline int is_scalar_or_none(PyObject *v) {
    return v == Py_None || PyLong_Check(v) || PyFloat_Check(v) || PyUnicode_Check(v);
}

/* ``fn(call, path, t, ...)`` for every tensor iter_tensors finds in ``value`` */
typedef int (*each_fn)(TensorPath *, Call *, PyObject *, PyObject *, PyObject *, PyObject *,
                       PyObject *);

static int for_each_tensor(TensorPath *o, Call *call, PyObject *value, PyObject *path,
                           PyObject *depth, int is_output, PyObject *module, PyObject *args,
                           PyObject *result) {
    PyObject *it_args[3] = {value, path, depth};
    PyObject *gen = PyObject_Vectorcall(G.iter_tensors, it_args, depth ? 3 : (path ? 2 : 1), NULL);
    if (gen == NULL) return -1;
    PyObject *item;
    while ((item = PyIter_Next(gen)) != NULL) {
        int rc;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "iter_tensors gives (path, tensor)");
            rc = -1;
        } else if (is_output) {
            rc = output(o, call, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), module,
                        args, result);
        } else {
            rc = input(o, call, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), module,
                       args);
        }
        Py_DECREF(item);
        if (rc < 0) {
            Py_DECREF(gen);
            return -1;
        }
    }
    Py_DECREF(gen);
    return PyErr_Occurred() ? -1 : 0;
}

/* TensorObserver.inputs: positional inputs, before forward runs */
static int inputs(TensorPath *o, Call *call, PyObject *module, PyObject *args) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *arg = PyTuple_GET_ITEM(args, i);
        PyObject *path = i < 64 ? Py_NewRef(PyTuple_GET_ITEM(G.index, i)) : PyUnicode_FromFormat("%zd", i);
        if (path == NULL) return -1;
        int rc = 0, tensor = is_tensor(arg);
        if (tensor < 0) {
            rc = -1;
        } else if (tensor) {
            rc = input(o, call, path, arg, module, args);
        } else if (!is_scalar_or_none(arg)) {
            PyObject *one = PyLong_FromLong(1);
            rc = one == NULL ? -1 : for_each_tensor(o, call, arg, path, one, 0, module, args, NULL);
            Py_XDECREF(one);
        }
        Py_DECREF(path);
        if (rc < 0) return -1;
    }
    return 0;
}

static PyObject *TensorPath_inputs(TensorPath *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3 || !PyObject_TypeCheck(args[0], &CallType) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "inputs(call, module, args)");
        return NULL;
    }
    if (!ready(self) || inputs(self, (Call *)args[0], args[1], args[2]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* TensorObserver.outputs: keyword inputs (only the forward hook gets them), outputs */
static int outputs(TensorPath *o, Call *call, PyObject *module, PyObject *args,
                   PyObject *kwargs, PyObject *result) {
    if (kwargs != NULL && PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) > 0) {
        PyObject *items = PyDict_Items(kwargs); /* a copy: the hooks never change it */
        if (items == NULL) return -1;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
            PyObject *kv = PyList_GET_ITEM(items, i);
            PyObject *key = PyTuple_GET_ITEM(kv, 0), *value = PyTuple_GET_ITEM(kv, 1);
            int rc = 0, tensor = is_tensor(value);
            if (tensor < 0)
                rc = -1;
            else if (tensor)
                rc = input(o, call, key, value, module, args);
            else if (!is_scalar_or_none(value))
                rc = for_each_tensor(o, call, value, key, NULL, 0, module, args, NULL);
            if (rc < 0) {
                Py_DECREF(items);
                return -1;
            }
        }
        Py_DECREF(items);
    }
    int tensor = is_tensor(result);
    if (tensor < 0) return -1;
    if (tensor) {
        PyObject *empty = PyUnicode_FromStringAndSize("", 0);
        if (empty == NULL) return -1;
        int rc = output(o, call, empty, result, module, args, result);
        Py_DECREF(empty);
        return rc;
    }
    if (result != Py_None)
        return for_each_tensor(o, call, result, NULL, NULL, 1, module, args, result);
    return 0;
}

static PyObject *TensorPath_outputs(TensorPath *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 5 || !PyObject_TypeCheck(args[0], &CallType)) {
        PyErr_SetString(PyExc_TypeError, "outputs(call, module, args, kwargs, result)");
        return NULL;
    }
    if (!ready(self) || outputs(self, (Call *)args[0], args[1], args[2], args[3], args[4]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* -- gradients ------------------------------------------------------------------------- */

#define STARTED (-2) /* timing.STARTED: the mark's pass began, its graph task not yet known */
#define NO_PASS (-3) /* timing.NO_PASS */

/* timing.attribute: an event at v of graph task ``task``; the interval since the last
 * one goes to the call whose work it was; the next will be ``then``'s (NULL: the pass's).
 * -1 where the device clock's mark raised. */
static int attribute(TensorPath *o, double v, long long task, Call *then) {
    long long held = o->bwd_mark_task;
    PyObject *receiver = Py_None; /* the call given the interval (borrowed) */
    if (held == task || held == STARTED) {
        double dt = v - o->bwd_mark;
        Call *call = (Call *)o->bwd_current;
        if (call != NULL && (PyObject *)call != Py_None) {
            receiver = (PyObject *)call;
            Py_XSETREF(o->bwd_last, Py_NewRef((PyObject *)call));
            if (dt > 0.0) {
                call->bwd_self += dt;
                o->bwd_attributed += dt;
                if (v - dt < call->bwd_first) call->bwd_first = v - dt;
            }
        }
    } else {
        Py_CLEAR(o->bwd_last); /* a pass that began without hookdbg hearing of it */
    }
    if (o->device_mark != NULL && o->device_mark != Py_None) {
        PyObject *r = PyObject_CallOneArg(o->device_mark, receiver);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    Py_XSETREF(o->bwd_current, then != NULL ? Py_NewRef((PyObject *)then) : NULL);
    o->bwd_mark = v;
    o->bwd_mark_task = task;
    return 0;
}

/* GradientObserver.grad: a gradient w.r.t. the tensor ``seen`` stands for arrived */
static int grad_body(TensorPath *o, double t0, SeenTensor *seen, PyObject *grad) {
    PyObject *summary = NULL, *r, *task_obj;
    long long task;
    int rc = -1;
    if (seen->segment != o->segment.id) return 0;
    if (o->heard != o->segment.id) {
        /* once per segment: what it sets stays set until the segment ends */
        if ((r = call_method0(o->steps, s_backward_ran)) == NULL) return -1;
        Py_DECREF(r);
        o->heard = o->segment.id;
    }
    double v = t0 - ((Guard *)o->guard)->overhead;
    if ((task_obj = PyObject_CallNoArgs(G.graph_task_id)) == NULL) return -1;
    task = PyLong_AsLongLong(task_obj);
    Py_DECREF(task_obj);
    if (task == -1 && PyErr_Occurred()) return -1;
    if ((summary = summarise(o, grad)) == NULL) return -1;
    int timing_only = seen->timing_only;
    int keeping = o->keeping && !timing_only;
    long long version = 0;
    if (o->flight != NULL && o->flight != Py_None && tensor_version(grad, 1, &version) < 0)
        goto done;
    PyObject *slots = seen->grad_slots;
    Py_INCREF(slots);
    Call *then = NULL; /* the node about to run made the tensor: the innermost producer's */
    for (Py_ssize_t i = 0; i + 2 < PyList_GET_SIZE(slots); i += 3) {
        Call *call = (Call *)PyList_GET_ITEM(slots, i);
        PyObject *slot = PyList_GET_ITEM(slots, i + 1), *path = PyList_GET_ITEM(slots, i + 2);
        if (!PyObject_TypeCheck(call, &CallType)) {
            PyErr_SetString(PyExc_TypeError, "a gradient slot's call is not a Call");
            Py_DECREF(slots);
            goto done;
        }
        call->bwd_task = task;
        if (PyLong_AsLong(slot) == G.GRAD_OUTPUT && (then == NULL || call->depth > then->depth))
            then = call;
        if (keeping) {
            Py_INCREF(call);
            Py_INCREF(slot);
            Py_INCREF(path);
            int k = keep(o, call, G.bwd, slot, path, grad, summary, version);
            Py_DECREF(call);
            Py_DECREF(slot);
            Py_DECREF(path);
            if (k < 0) {
                Py_DECREF(slots);
                goto done;
            }
        }
    }
    int marked = attribute(o, v, task, then); /* the slots list holds ``then`` */
    Py_DECREF(slots);
    if (marked < 0) goto done;
    if (!timing_only && o->check_nan && summary != Py_None) {
        int finite = is_pending(summary) ? 0 : summary_finite(summary);
        if (finite < 0) goto done;
        if (!finite) {
            PyObject *a[3] = {(PyObject *)seen, summary, grad};
            if (call_void(o->gradients, s__check_grad, a, 3) < 0) goto done;
        }
    }
    rc = 0;
done:
    Py_XDECREF(summary);
    return rc;
}

/* Called by autograd: as a tensor's hook, with its gradient (None if undefined); as a
 * node's pre-hook, with the node's output gradients (a tuple). */
static PyObject *SeenTensor_call(SeenTensor *self, PyObject *args, PyObject *kwds) {
    PyObject *grads;
    if (!PyArg_UnpackTuple(args, "SeenTensor", 1, 1, &grads)) return NULL;
    TensorPath *o = (TensorPath *)self->owner;
    if (o == NULL || !ready(o)) {
        PyErr_SetString(PyExc_RuntimeError, "this SeenTensor is no tensor path's gradient hook");
        return NULL;
    }
    int c = is_compiling();
    if (c != 0) return c < 0 ? NULL : Py_NewRef(Py_None);
    Guard *g = (Guard *)o->guard;
    double t0;
    Py_INCREF(o);
    Py_INCREF(self);
    int e = envelope_enter(g, &t0);
    PyObject *result;
    if (e != 0) {
        result = e < 0 ? NULL : Py_NewRef(Py_None);
    } else {
        PyObject *grad = grads;
        if (PyTuple_Check(grads)) {
            grad = self->nr < PyTuple_GET_SIZE(grads) ? PyTuple_GET_ITEM(grads, self->nr) : Py_None;
        }
        int failed = grad != Py_None && grad_body(o, t0, self, grad) < 0;
        result = envelope_leave(g, t0, failed);
    }
    Py_DECREF(self);
    Py_DECREF(o);
    return result;
}

/* -- ParamHook ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *tensors;   /* TensorPath */
    PyObject *gradients; /* GradientObserver */
    PyObject *info;      /* the owning module's ModuleInfo */
    PyObject *info_id;   /* its id */
    PyObject *name;      /* the parameter's name in it */
} ParamHook;

static PyTypeObject ParamHookType;

static PyObject *ParamHook_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *tensors, *gradients, *info, *name;
    if (!PyArg_ParseTuple(args, "O!OOU", &TensorPathType, &tensors, &gradients, &info, &name))
        return NULL;
    ParamHook *self = (ParamHook *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->tensors = Py_NewRef(tensors);
    self->gradients = Py_NewRef(gradients);
    self->info = Py_NewRef(info);
    self->name = Py_NewRef(name);
    if ((self->info_id = PyObject_GetAttr(info, s_id)) == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int ParamHook_traverse(ParamHook *self, visitproc visit, void *arg) {
    Py_VISIT(self->tensors);
    Py_VISIT(self->gradients);
    Py_VISIT(self->info);
    Py_VISIT(self->info_id);
    Py_VISIT(self->name);
    return 0;
}

static int ParamHook_clear(ParamHook *self) {
    Py_CLEAR(self->tensors);
    Py_CLEAR(self->gradients);
    Py_CLEAR(self->info);
    Py_CLEAR(self->info_id);
    Py_CLEAR(self->name);
    return 0;
}

static void ParamHook_dealloc(ParamHook *self) {
    PyObject_GC_UnTrack(self);
    ParamHook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* gradients._in_pass: the last of ``calls`` (a list, or NULL) that backward pass ``task``
 * reached; else the last of all (borrowed, NULL if there are none) */
static Call *in_pass(PyObject *calls, long long task) {
    Py_ssize_t n = calls == NULL ? 0 : PyList_GET_SIZE(calls);
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        Call *call = (Call *)PyList_GET_ITEM(calls, i);
        if (PyObject_TypeCheck(call, &CallType) && call->bwd_task == task) return call;
    }
    if (n == 0) return NULL;
    PyObject *last = PyList_GET_ITEM(calls, n - 1);
    return PyObject_TypeCheck(last, &CallType) ? (Call *)last : NULL;
}

/* GradientObserver._param_grad: a parameter's gradient was accumulated */
static int param_body(ParamHook *h, double t0, PyObject *param) {
    TensorPath *o = (TensorPath *)h->tensors;
    PyObject *state = o->segment.state, *grad = NULL, *calls = NULL, *info_id = NULL, *summary = NULL;
    PyObject *module_calls = NULL, *enclosing = NULL;
    Call *owner = NULL;
    int rc = -1;
    if ((grad = PyObject_GetAttr(param, s_grad)) == NULL) return -1;
    if (grad == Py_None) {
        Py_DECREF(grad);
        return 0;
    }
    double v = t0 - ((Guard *)o->guard)->overhead;
    PyObject *task_obj = PyObject_CallNoArgs(G.graph_task_id);
    if (task_obj == NULL) goto done;
    long long task = PyLong_AsLongLong(task_obj);
    Py_DECREF(task_obj);
    if (task == -1 && PyErr_Occurred()) goto done;
    info_id = Py_NewRef(h->info_id);
    module_calls = Py_NewRef(o->segment.module_calls);
    calls = PyDict_GetItemWithError(module_calls, info_id);
    if (calls == NULL && PyErr_Occurred()) goto done;
    if (calls != NULL && !PyList_Check(calls)) {
        PyErr_SetString(PyExc_TypeError, "module_calls holds lists of calls");
        goto done;
    }
    Py_XINCREF(calls);
    Py_ssize_t ncalls = calls == NULL ? 0 : PyList_GET_SIZE(calls);
    owner = in_pass(calls, task); /* the last call of the module in this backward pass */
    if (ncalls > 0) {
        if (attribute(o, v, task, owner) < 0) goto done;
    } else { /* not called itself (inside a compiled model): its work is its caller's */
        if ((enclosing = call_method1(h->gradients, s__enclosing_calls, h->info)) == NULL)
            goto done;
        if (!PyList_Check(enclosing)) {
            PyErr_SetString(PyExc_TypeError, "_enclosing_calls gives a list");
            goto done;
        }
        if (attribute(o, v, task, in_pass(enclosing, task)) < 0) goto done;
    }
    if ((summary = summarise(o, grad)) == NULL) goto done;
    if (o->keeping) {
        long long version = 0;
        if (o->flight != NULL && o->flight != Py_None && tensor_version(grad, 1, &version) < 0)
            goto done;
        if (owner != NULL) {
            if (keep(o, owner, G.bwd, G.param_grad, h->name, grad, summary, version) < 0)
                goto done;
        } else if (o->emit_tensors &&
                   tensor_row(o, -1, info_id, G.bwd, G.param_grad, h->name, summary) < 0) {
            goto done;
        }
    }
    if (summary == Py_None || !o->check_nan) {
        rc = 0;
        goto done;
    }
    int finite = 0;
    if (!o->defer_checks && (finite = summary_finite(summary)) < 0) goto done;
    if (finite) {
        PyObject *gf = slot_get(&SLOTS.grad_finite, state), *key = PyLong_FromVoidPtr(param);
        int bad = gf == NULL || key == NULL || PyObject_SetItem(gf, key, Py_True) < 0;
        Py_XDECREF(gf);
        Py_XDECREF(key);
        if (bad) goto done;
    } else {
        PyObject *list = calls != NULL ? PySequence_List(calls) : PyList_New(0);
        if (list == NULL) goto done;
        PyObject *a[6] = {h->info, list, h->name, summary, param, grad};
        int bad = call_void(h->gradients, s__check_param_grad, a, 6) < 0;
        Py_DECREF(list);
        if (bad) goto done;
    }
    rc = 0;
done:
    Py_XDECREF(grad);
    Py_XDECREF(calls);
    Py_XDECREF(info_id);
    Py_XDECREF(summary);
    Py_XDECREF(module_calls);
    Py_XDECREF(enclosing);
    return rc;
}

/* Every parameter's hook runs on every backward pass: in a step that is not recorded it
 * returns before the envelope. */
static PyObject *ParamHook_call(ParamHook *self, PyObject *args, PyObject *kwds) {
    PyObject *param;
    if (!PyArg_UnpackTuple(args, "ParamHook", 1, 1, &param)) return NULL;
    TensorPath *o = (TensorPath *)self->tensors;
    if (!ready(o)) return NULL;
    int c = is_compiling();
    if (c != 0) return c < 0 ? NULL : Py_NewRef(Py_None);
    if (!o->segment.recording) Py_RETURN_NONE;
    int selected = slot_bool(&SLOTS.selected, self->info); /* steering may deselect it */
    if (selected <= 0) return selected < 0 ? NULL : Py_NewRef(Py_None);
    Guard *g = (Guard *)o->guard;
    double t0;
    Py_INCREF(self);
    int e = envelope_enter(g, &t0);
    PyObject *result;
    if (e != 0)
        result = e < 0 ? NULL : Py_NewRef(Py_None);
    else
        result = envelope_leave(g, t0, param_body(self, t0, param) < 0);
    Py_DECREF(self);
    return result;
}

static PyMemberDef ParamHook_members[] = {
    {"info", T_OBJECT_EX, offsetof(ParamHook, info), READONLY, NULL},
    {"name", T_OBJECT_EX, offsetof(ParamHook, name), READONLY, NULL},
    {NULL},
};

static PyTypeObject ParamHookType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hookdbg.recorder._hot.ParamHook",
    .tp_basicsize = sizeof(ParamHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ParamHook(tensors, gradients, info, name): a parameter's post-accumulate-grad "
              "hook (see hookdbg/recorder/hooks/gradients.py).",
    .tp_new = ParamHook_new,
    .tp_traverse = (traverseproc)ParamHook_traverse,
    .tp_clear = (inquiry)ParamHook_clear,
    .tp_dealloc = (destructor)ParamHook_dealloc,
    .tp_call = (ternaryfunc)ParamHook_call,
    .tp_members = ParamHook_members,
};

/* stats.norm_summary: for a CPU tensor of a kind the C pass reads, without Python */
static PyObject *norm_summary(PyObject *t, PyObject *norm) {
    PyObject *spec, *shape;
    long long numel;
    int read = host_tensor(t, &spec, &shape, &numel);
    if (read <= 0) {
        if (read < 0) return NULL;
        PyObject *a[2] = {t, norm};
        return PyObject_Vectorcall(G.norm_summary, a, 2, NULL);
    }
    PyObject *count = PyLong_FromLongLong(numel), *zero = PyLong_FromLong(0), *out = NULL;
    if (count != NULL && zero != NULL && (out = PyTuple_New(summary_length)) != NULL) {
        /* stats.values(norm=norm, nan=0, posinf=0, neginf=0): NaN elsewhere */
        for (Py_ssize_t i = 0; i < summary_length; i++) {
            PyObject *v = G.nan;
            if (i == summary_at.shape) v = shape;
            else if (i == summary_at.dtype) v = PyTuple_GET_ITEM(spec, 1);
            else if (i == summary_at.device) v = G.cpu;
            else if (i == summary_at.numel) v = count;
            else if (i == summary_at.norm) v = norm;
            else if (i >= summary_at.nan && i <= summary_at.neginf) v = zero;
            PyTuple_SET_ITEM(out, i, Py_NewRef(v));
        }
    }
    Py_DECREF(shape);
    Py_XDECREF(count);
    Py_XDECREF(zero);
    return out;
}

/* TensorObserver.norm_rows: parameters' rows after an optimizer step, from their norms */
static PyObject *TensorPath_norm_rows(TensorPath *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 7 || !PyList_Check(args[2]) || !PyList_Check(args[3]) || !PyList_Check(args[4]) ||
        !PyList_Check(args[5]) || PyList_GET_SIZE(args[3]) != PyList_GET_SIZE(args[2]) ||
        PyList_GET_SIZE(args[4]) != PyList_GET_SIZE(args[2]) ||
        PyList_GET_SIZE(args[5]) != PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "norm_rows(call, slot, modules, names, tensors, norms, keep): lists "
                        "of one length");
        return NULL;
    }
    if (!ready(self)) return NULL;
    long long call = PyLong_AsLongLong(args[0]);
    int keep = PyObject_IsTrue(args[6]);
    if ((call == -1 && PyErr_Occurred()) || keep < 0) return NULL;
    PyObject *slot = args[1], *modules = args[2], *names = args[3], *tensors = args[4];
    PyObject *norms = args[5], *bad = PyList_New(0);
    if (bad == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(norms); i++) {
        PyObject *norm = PyList_GET_ITEM(norms, i), *t = PyList_GET_ITEM(tensors, i), *summary;
        double v = PyFloat_AsDouble(norm);
        if (v == -1.0 && PyErr_Occurred()) goto fail;
        if (isfinite(v)) {
            if (!keep) continue;
            if ((summary = norm_summary(t, norm)) == NULL) goto fail;
        } else {
            if ((summary = PyObject_CallOneArg(G.summarise, t)) == NULL) goto fail;
            PyObject *pair = Py_BuildValue("(nO)", i, summary);
            if (pair == NULL || PyList_Append(bad, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(summary);
                goto fail;
            }
            Py_DECREF(pair);
        }
        int rc = keep ? tensor_row(self, call, PyList_GET_ITEM(modules, i), G.opt, slot,
                                   PyList_GET_ITEM(names, i), summary)
                      : 0;
        Py_DECREF(summary);
        if (rc < 0) goto fail;
    }
    return bad;
fail:
    Py_DECREF(bad);
    return NULL;
}

/* -- TensorPath's type -------------------------------------------------------------------- */

/* A ``rows`` setter: ``rows`` (store.rows.Rows) and its ``table``, the RowBuffer the
 * hooks write that table's rows into, set together in ``*rows_at`` and ``*buffer_at``. */
static int set_rows(PyObject **rows_at, PyObject **buffer_at, PyObject *rows, PyObject *table) {
    if (!G.ready) {
        PyErr_SetString(PyExc_RuntimeError, "hookdbg.recorder._hot.setup() was not called");
        return -1;
    }
    PyObject *buf = rows == NULL ? NULL : PyObject_GetAttr(rows, table);
    if (buf == NULL) {
        if (rows == NULL) PyErr_SetString(PyExc_TypeError, "the rows cannot be deleted");
        return -1;
    }
    if (!PyObject_TypeCheck(buf, G.rows->type)) {
        PyErr_Format(PyExc_TypeError, "rows.%U is not a RowBuffer (hookdbg/store/_pack.c)", table);
        Py_DECREF(buf);
        return -1;
    }
    Py_INCREF(rows);
    Py_XSETREF(*rows_at, rows);
    Py_XSETREF(*buffer_at, buf);
    return 0;
}

static PyObject *TensorPath_get_rows(TensorPath *self, void *unused) {
    return Py_NewRef(self->rows ? self->rows : Py_None);
}

static int TensorPath_set_rows(TensorPath *self, PyObject *value, void *unused) {
    return set_rows(&self->rows, &self->tensor_rows, value, s_tensors);
}

static PyObject *TensorPath_get_state(TensorPath *self, void *unused) {
    return segment_state(&self->segment);
}

static int TensorPath_set_state(TensorPath *self, PyObject *value, void *unused) {
    if (view_segment(&self->segment, value) < 0) return -1;
    /* the flight recorder's lists are looked up again in the new segment: held here
     * longer, they would keep an old step's tensors alive through steps not recorded */
    self->flight_of = LLONG_MIN;
    self->flight_last = NULL;
    Py_CLEAR(self->flight_entries);
    Py_CLEAR(self->flight_sizes);
    return 0;
}

static PyMethodDef TensorPath_methods[] = {
    {"see", (PyCFunction)(void (*)(void))TensorPath_see, METH_VARARGS | METH_KEYWORDS,
     "The segment's record of tensor t at its current version, summarised once."},
    {"inputs", (PyCFunction)(void (*)(void))TensorPath_inputs, METH_FASTCALL,
     "Positional inputs, before forward runs."},
    {"outputs", (PyCFunction)(void (*)(void))TensorPath_outputs, METH_FASTCALL,
     "Keyword inputs and the outputs."},
    {"keep", (PyCFunction)(void (*)(void))TensorPath_keep, METH_FASTCALL,
     "The row, the capture and the flight-recorder entry of one tensor of one call."},
    {"summarise", (PyCFunction)TensorPath_summarise, METH_O,
     "The summary of t at this level."},
    {"fast_watch", (PyCFunction)(void (*)(void))TensorPath_fast_watch, METH_FASTCALL,
     "Hear of t's gradient through seen."},
    {"norm_rows", (PyCFunction)(void (*)(void))TensorPath_norm_rows, METH_FASTCALL,
     "Parameters' rows after an optimizer step, from their norms."},
    {NULL},
};

static PyMemberDef TensorPath_members[] = {
    {"guard", T_OBJECT, offsetof(TensorPath, guard), 0, NULL},
    {"steps", T_OBJECT, offsetof(TensorPath, steps), 0, NULL},
    {"flight", T_OBJECT, offsetof(TensorPath, flight), 0, NULL},
    {"summary", T_OBJECT, offsetof(TensorPath, summary), 0, NULL},
    {"gradients", T_OBJECT, offsetof(TensorPath, gradients), 0, NULL},
    {"emit_tensors", T_BOOL, offsetof(TensorPath, emit_tensors), 0, NULL},
    {"check_nan", T_BOOL, offsetof(TensorPath, check_nan), 0, NULL},
    {"defer_all", T_BOOL, offsetof(TensorPath, defer_all), 0, NULL},
    {"capturing", T_BOOL, offsetof(TensorPath, capturing), 0, NULL},
    {"keeping", T_BOOL, offsetof(TensorPath, keeping), 0, NULL},
    {"defer_checks", T_BOOL, offsetof(TensorPath, defer_checks), 0, NULL},
    {"bwd_mark", T_DOUBLE, offsetof(TensorPath, bwd_mark), 0, NULL},
    {"bwd_mark_task", T_LONGLONG, offsetof(TensorPath, bwd_mark_task), 0, NULL},
    {"bwd_attributed", T_DOUBLE, offsetof(TensorPath, bwd_attributed), 0, NULL},
    {"bwd_current", T_OBJECT, offsetof(TensorPath, bwd_current), 0, NULL},
    {"bwd_last", T_OBJECT, offsetof(TensorPath, bwd_last), 0, NULL},
    {"device_mark", T_OBJECT, offsetof(TensorPath, device_mark), 0, NULL},
    {NULL},
};

static PyGetSetDef TensorPath_getset[] = {
    {"rows", (getter)TensorPath_get_rows, (setter)TensorPath_set_rows,
     "the rows for the writer (store.rows.Rows)", NULL},
    {"state", (getter)TensorPath_get_state, (setter)TensorPath_set_state,
     "the current segment's StepState", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyObject *TensorPath_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    TensorPath *self = (TensorPath *)PyType_GenericNew(type, args, kwds);
    if (self != NULL) {
        self->heard = self->flight_of = LLONG_MIN; /* no segment yet */
        self->bwd_mark_task = NO_PASS;
    }
    return (PyObject *)self;
}

static PyTypeObject TensorPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hookdbg.recorder._hot.TensorPath",
    .tp_basicsize = sizeof(TensorPath),
    .tp_dictoffset = offsetof(TensorPath, dict),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The tensor observer's per-tensor path (see hookdbg/recorder/hooks/observe.py).",
    .tp_new = TensorPath_new,
    .tp_traverse = (traverseproc)TensorPath_traverse,
    .tp_clear = (inquiry)TensorPath_clear,
    .tp_dealloc = (destructor)TensorPath_dealloc,
    .tp_methods = TensorPath_methods,
    .tp_members = TensorPath_members,
    .tp_getset = TensorPath_getset,
};

/* -- CallPath: the module hooks' per-call path ----------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *dict;
    PyObject *guard;    /* Guard */
    PyObject *registry; /* naming.ModuleRegistry */
    PyObject *by_id;    /* its dict: id(module) -> ModuleInfo */
    PyObject *observer; /* TensorPath */
    PyObject *segments; /* segments.Segments */
    PyObject *rows;     /* store.rows.Rows */
    PyObject *handoff;  /* handoff.Handoff */
    PyObject *call_ids; /* call ids, shared with the optimizer's calls */
    SegmentView segment; /* the current segment's state */
    PyObject *call_rows; /* rows.calls: a RowBuffer */
    PyObject *stack;    /* Call, ModuleInfo (not recorded), Recompute or MUTED */
    PyObject *open;     /* the innermost open Call, or None */
    long mute;          /* depth inside a call that is not recorded */
    unsigned long tid;  /* the thread that records */
    char has_tid;
    double origin;      /* the recording's start, on its clock */
    long long calls_recorded;
    double root_time; /* top-level calls' and backward passes' time (modulehooks.py) */
} CallPath;

static PyTypeObject CallPathType;

static int CallPath_traverse(CallPath *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->guard);
    Py_VISIT(self->registry);
    Py_VISIT(self->by_id);
    Py_VISIT(self->observer);
    Py_VISIT(self->segments);
    Py_VISIT(self->rows);
    Py_VISIT(self->handoff);
    Py_VISIT(self->call_ids);
    int r = visit_segment(&self->segment, visit, arg);
    if (r) return r;
    Py_VISIT(self->call_rows);
    Py_VISIT(self->stack);
    Py_VISIT(self->open);
    return 0;
}

static int CallPath_clear(CallPath *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->guard);
    Py_CLEAR(self->registry);
    Py_CLEAR(self->by_id);
    Py_CLEAR(self->observer);
    Py_CLEAR(self->segments);
    Py_CLEAR(self->rows);
    Py_CLEAR(self->handoff);
    Py_CLEAR(self->call_ids);
    clear_segment(&self->segment);
    Py_CLEAR(self->call_rows);
    Py_CLEAR(self->stack);
    Py_CLEAR(self->open);
    return 0;
}

static void CallPath_dealloc(CallPath *self) {
    PyObject_GC_UnTrack(self);
    CallPath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int call_ready(CallPath *p) {
    if (p->guard == NULL || !PyObject_TypeCheck(p->guard, &GuardType) || p->by_id == NULL ||
        !PyDict_Check(p->by_id) || p->observer == NULL ||
        !PyObject_TypeCheck(p->observer, &TensorPathType) || p->stack == NULL ||
        !PyList_Check(p->stack) || p->segment.state == NULL || p->open == NULL || p->call_rows == NULL ||
        p->handoff == NULL || p->call_ids == NULL || p->registry == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the module hooks are not set up");
        return 0;
    }
    return ready((TensorPath *)p->observer);
}

/* ModuleHooks._pre_recorded's body */
static int pre_body(CallPath *p, double t0, PyObject *module, PyObject *args) {
    if (!p->has_tid || PyThread_get_thread_ident() != p->tid)
        return call_void((PyObject *)p, s__elsewhere, NULL, 0);
    Guard *g = (Guard *)p->guard;
    PyObject *stack = p->stack, *pinfo = Py_None, *info = NULL, *key = NULL;
    PyObject *module_calls = NULL, *calls = NULL, *mid = NULL, *id = NULL;
    Call *call = NULL;
    int rc = -1;
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    if (depth) {
        PyObject *top = PyList_GET_ITEM(stack, depth - 1);
        if ((PyObject *)Py_TYPE(top) == G.Recompute) {
            PyObject *a[3] = {top, module, args};
            return call_void((PyObject *)p, s__recompute_inner, a, 3);
        }
        pinfo = Py_IS_TYPE(top, &CallType) ? ((Call *)top)->info : top;
    } else if ((PyObject *)Py_TYPE(module) == G.ParametrizationList) {
        /* a parametrized weight read outside any call: no call of the model's */
        p->mute = 1;
        return PyList_Append(stack, G.MUTED);
    }
    Py_INCREF(pinfo);
    if ((key = PyLong_FromVoidPtr(module)) == NULL) goto done;
    info = PyDict_GetItemWithError(p->by_id, key);
    if (info == NULL && PyErr_Occurred()) goto done;
    if (info != NULL) {
        Py_INCREF(info);
        PyObject *ref = slot_get(&SLOTS.ref, info), *obj = NULL;
        if (ref == NULL) goto done;
        obj = PyObject_CallNoArgs(ref);
        Py_DECREF(ref);
        if (obj == NULL) goto done;
        Py_DECREF(obj);
        if (obj != module) Py_CLEAR(info);
    }
    if (info == NULL) {
        PyObject *a[3] = {p->registry, module, pinfo};
        info = PyObject_VectorcallMethod(s_lookup, a, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (info == NULL) goto done;
    }
    if (pinfo == Py_None) { /* a root call: maybe a new segment (Python decides) */
        PyObject *vv = PyFloat_FromDouble(t0 - g->overhead);
        if (vv == NULL) goto done;
        PyObject *a[5] = {(PyObject *)p, info, module, args, vv};
        PyObject *r = PyObject_VectorcallMethod(s__root, a, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(vv);
        if (r == NULL) goto done;
        int go_on = r == Py_True;
        Py_DECREF(r);
        if (!go_on) {
            rc = 0;
            goto done;
        }
    }
    int transparent = slot_bool(&SLOTS.transparent, info);
    if (transparent < 0) goto done;
    int selected = transparent ? 0 : slot_bool(&SLOTS.selected, info);
    if (selected < 0) goto done;
    if (transparent || !selected) {
        rc = PyList_Append(stack, info);
        goto done;
    }
    module_calls = Py_NewRef(p->segment.module_calls);
    if ((mid = slot_get(&SLOTS.id, info)) == NULL) goto done;
    calls = PyDict_GetItemWithError(module_calls, mid); /* the module's calls so far */
    if (calls == NULL && PyErr_Occurred()) goto done;
    Py_XINCREF(calls);
    if (calls != NULL && !PyList_Check(calls)) {
        PyErr_SetString(PyExc_TypeError, "module_calls holds lists of calls");
        goto done;
    }
    if ((id = PyIter_Next(p->call_ids)) == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "call ids ran out");
        goto done;
    }
    long long cid = PyLong_AsLongLong(id);
    if (cid == -1 && PyErr_Occurred()) goto done;
    int index = calls == NULL ? 0 : (int)PyList_GET_SIZE(calls);
    if ((call = new_call(cid, info, index, p->open, t0 - g->overhead)) == NULL) goto done;
    call->module = Py_NewRef(mid); /* its module id (call_module), read above */
    PyObject *on = PyObject_CallNoArgs(G.grad_enabled);
    if (on == NULL) goto done;
    call->grad_on = on == Py_True;
    Py_DECREF(on);
    int bad = PyList_Append(p->segment.calls, (PyObject *)call);
    if (bad < 0) goto done;
    if (calls == NULL) {
        PyObject *one = PyList_New(1);
        if (one == NULL) goto done;
        Py_INCREF(call);
        PyList_SET_ITEM(one, 0, (PyObject *)call);
        bad = PyDict_SetItem(module_calls, mid, one);
        Py_DECREF(one);
        if (bad < 0) goto done;
    } else if (PyList_Append(calls, (PyObject *)call) < 0) {
        goto done;
    }
    if (PyList_Append(stack, (PyObject *)call) < 0) goto done;
    Py_INCREF(call);
    Py_SETREF(p->open, (PyObject *)call);
    if (PyTuple_GET_SIZE(args) && inputs((TensorPath *)p->observer, call, module, args) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(pinfo);
    Py_XDECREF(info);
    Py_XDECREF(key);
    Py_XDECREF(module_calls);
    Py_XDECREF(calls);
    Py_XDECREF(mid);
    Py_XDECREF(id);
    Py_XDECREF(call);
    return rc;
}

/* ModuleHooks.pre once dynamo is known not to trace it: nothing while torch compiles
 * (its hooks run for real then); inside a call that is not recorded (a step --every
 * skips, an eval batch left out) a nested call only counts its depth. */
static PyObject *CallPath_fast_pre(CallPath *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "fast_pre(module, args)");
        return NULL;
    }
    int c = is_compiling();
    if (c != 0) return c < 0 ? NULL : Py_NewRef(Py_None);
    if (self->mute && self->has_tid && PyThread_get_thread_ident() == self->tid) {
        self->mute++;
        Py_RETURN_NONE;
    }
    if (!call_ready(self)) return NULL;
    Guard *g = (Guard *)self->guard;
    double t0;
    int e = envelope_enter(g, &t0);
    if (e != 0) return e < 0 ? NULL : Py_NewRef(Py_None);
    Py_INCREF(self);
    PyObject *r = envelope_leave(g, t0, pre_body(self, t0, args[0], args[1]) < 0);
    Py_DECREF(self);
    return r;

}

/* One row of the calls table (modulehooks.py's and timing.py's tuples), into ``buf``. */
static int call_row(PyObject *buf, Call *call, long phase, long long step, long long segment,
                    double start, double total, double self_time) {
    PyObject *module = call_module(call);
    if (module == NULL) return -1;
    PyObject *parent = call->parent;
    RowValue row[11] = {
        ROW_LONG(call->id),
        ROW_LONG(phase),
        ROW_LONG(step),
        ROW_LONG(segment),
        ROW_OBJECT(module),
        ROW_LONG(call->index),
        ROW_LONG(parent == Py_None ? -1 : ((Call *)parent)->id),
        ROW_LONG(call->depth),
        ROW_DOUBLE(start),
        ROW_DOUBLE(total),
        ROW_DOUBLE(self_time),
    };
    return G.rows->append(buf, row, 11);
}

/* ModuleHooks._post_recorded's body */
static int post_body(CallPath *p, double t0, PyObject *module, PyObject *args, PyObject *kwargs,
                     PyObject *result) {
    if (!p->has_tid || PyThread_get_thread_ident() != p->tid) return 0;
    PyObject *stack = p->stack;
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    if (depth == 0) return 0;
    PyObject *entry = PyList_GET_ITEM(stack, depth - 1);
    Py_INCREF(entry);
    if (PyList_SetSlice(stack, depth - 1, depth, NULL) < 0) {
        Py_DECREF(entry);
        return -1;
    }
    if (!Py_IS_TYPE(entry, &CallType)) { /* muted, not recorded, run again: Python's */
        PyObject *a[3] = {(PyObject *)p, entry, result};
        PyObject *r = PyObject_VectorcallMethod(s__leave_other, a, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(entry);
        if (r == NULL) return -1;
        Py_DECREF(r);
        return 0;
    }
    Call *call = (Call *)entry;
    Guard *g = (Guard *)p->guard;
    TensorPath *o = (TensorPath *)p->observer;
    int rc = -1;
    double total = call->total = t0 - g->overhead - call->start;
    PyObject *parent = call->parent;
    Py_INCREF(parent);
    Py_SETREF(p->open, Py_NewRef(parent));
    if (parent != Py_None)
        ((Call *)parent)->child_time += total;
    else
        p->root_time += total;
    if (result != G.RAISED && outputs(o, call, module, args, kwargs, result) < 0) goto done;
    if (parent == Py_None) { /* the sentinel's look at a top-level call's outputs */
        PyObject *a[2] = {(PyObject *)p, result};
        PyObject *r = PyObject_VectorcallMethod(s__root_ended, a, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL) goto done;
        Py_DECREF(r);
    }
    if (p->segment.deferring) {
        PyObject *taint = PyObject_GetAttr((PyObject *)o, s_taint_parent);
        if (taint == NULL) goto done;
        PyObject *a[2] = {taint, (PyObject *)call};
        int bad = call_void((PyObject *)o, s_check, a, 2);
        Py_DECREF(taint);
        if (bad < 0) goto done;
    } else if (call->tainted && parent != Py_None) {
        ((Call *)parent)->tainted = 1;
    }
    if (call_row(p->call_rows, call, G.FWD, p->segment.step, p->segment.id,
                 call->start - p->origin, total, total - call->child_time) < 0)
        goto done;
    p->calls_recorded++;
    {
        double l, e;
        if (slot_double(&SLOTS.last, p->handoff, &l) < 0 ||
            slot_double(&SLOTS.every, p->handoff, &e) < 0)
            goto done;
        if (t0 - l > e) {
            PyObject *r = PyObject_CallNoArgs(p->handoff);
            if (r == NULL) goto done;
            Py_DECREF(r);
        }
    }
    rc = 0;
done:
    Py_DECREF(entry);
    Py_DECREF(parent);
    return rc;
}

static PyObject *CallPath_fast_post(CallPath *self, PyObject *const *args, Py_ssize_t n) {
    if (n < 3 || n > 4) {
        PyErr_SetString(PyExc_TypeError, "fast_post(module, args, kwargs[, result])");
        return NULL;
    }
    int c = is_compiling();
    if (c != 0) return c < 0 ? NULL : Py_NewRef(Py_None);
    if (self->mute > 1 && self->has_tid && PyThread_get_thread_ident() == self->tid) {
        self->mute--;
        Py_RETURN_NONE;
    }
    if (!call_ready(self)) return NULL;
    PyObject *result = n == 4 ? args[3] : G.RAISED;
    Guard *g = (Guard *)self->guard;
    double t0;
    int e = envelope_enter(g, &t0);
    if (e != 0) return e < 0 ? NULL : Py_NewRef(Py_None);
    Py_INCREF(self);
    PyObject *r =
        envelope_leave(g, t0, post_body(self, t0, args[0], args[1], args[2], result) < 0);
    Py_DECREF(self);
    return r;
}

static PyObject *CallPath_get_tid(CallPath *self, void *unused) {
    if (!self->has_tid) Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(self->tid);
}

static int CallPath_set_tid(CallPath *self, PyObject *value, void *unused) {
    if (value == NULL || value == Py_None) {
        self->has_tid = 0;
        return 0;
    }
    unsigned long tid = PyLong_AsUnsignedLong(value);
    if (tid == (unsigned long)-1 && PyErr_Occurred()) return -1;
    self->tid = tid;
    self->has_tid = 1;
    return 0;
}

static PyObject *CallPath_get_open(CallPath *self, void *unused) {
    return Py_NewRef(self->open ? self->open : Py_None);
}

static int CallPath_set_open(CallPath *self, PyObject *value, void *unused) {
    if (value == NULL || (value != Py_None && !PyObject_TypeCheck(value, &CallType))) {
        PyErr_SetString(PyExc_TypeError, "the open call is a Call or None");
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(self->open, value);
    return 0;
}

static PyObject *CallPath_get_rows(CallPath *self, void *unused) {
    return Py_NewRef(self->rows ? self->rows : Py_None);
}

static int CallPath_set_rows(CallPath *self, PyObject *value, void *unused) {
    return set_rows(&self->rows, &self->call_rows, value, s_calls);
}

static PyObject *CallPath_get_state(CallPath *self, void *unused) {
    return segment_state(&self->segment);
}

static int CallPath_set_state(CallPath *self, PyObject *value, void *unused) {
    return view_segment(&self->segment, value);
}

static PyGetSetDef CallPath_getset[] = {
    {"rows", (getter)CallPath_get_rows, (setter)CallPath_set_rows,
     "the rows for the writer (store.rows.Rows)", NULL},
    {"state", (getter)CallPath_get_state, (setter)CallPath_set_state,
     "the current segment's StepState", NULL},
    {"_tid", (getter)CallPath_get_tid, (setter)CallPath_set_tid, "the thread that records", NULL},
    {"_open", (getter)CallPath_get_open, (setter)CallPath_set_open, "the innermost open call", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

static PyMemberDef CallPath_members[] = {
    {"guard", T_OBJECT, offsetof(CallPath, guard), 0, NULL},
    {"registry", T_OBJECT, offsetof(CallPath, registry), 0, NULL},
    {"_by_id", T_OBJECT, offsetof(CallPath, by_id), 0, NULL},
    {"observer", T_OBJECT, offsetof(CallPath, observer), 0, NULL},
    {"segments", T_OBJECT, offsetof(CallPath, segments), 0, NULL},
    {"handoff", T_OBJECT, offsetof(CallPath, handoff), 0, NULL},
    {"_call_ids", T_OBJECT, offsetof(CallPath, call_ids), 0, NULL},
    {"stack", T_OBJECT, offsetof(CallPath, stack), 0, NULL},
    {"_mute", T_LONG, offsetof(CallPath, mute), 0, NULL},
    {"_origin", T_DOUBLE, offsetof(CallPath, origin), 0, NULL},
    {"calls_recorded", T_LONGLONG, offsetof(CallPath, calls_recorded), 0, NULL},
    {"root_time", T_DOUBLE, offsetof(CallPath, root_time), 0, NULL},
    {NULL},
};

static PyMethodDef CallPath_methods[] = {
    {"fast_pre", (PyCFunction)(void (*)(void))CallPath_fast_pre, METH_FASTCALL,
     "The forward pre-hook's work, once dynamo is known not to be tracing it."},
    {"fast_post", (PyCFunction)(void (*)(void))CallPath_fast_post, METH_FASTCALL,
     "The forward hook's work, once dynamo is known not to be tracing it."},
    {NULL},
};

static PyTypeObject CallPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hookdbg.recorder._hot.CallPath",
    .tp_basicsize = sizeof(CallPath),
    .tp_dictoffset = offsetof(CallPath, dict),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The module hooks' per-call path (see hookdbg/recorder/hooks/modulehooks.py).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)CallPath_traverse,
    .tp_clear = (inquiry)CallPath_clear,
    .tp_dealloc = (destructor)CallPath_dealloc,
    .tp_methods = CallPath_methods,
    .tp_members = CallPath_members,
    .tp_getset = CallPath_getset,
};

/* -- backward rows ---------------------------------------------------------------------- */

/* timing.backward_rows: a backward row for each call with backward time attributed to
 * it or inside it (see its docstring), children before parents, into the calls table's
 * buffer; what timing.py keeps in two dicts by call id is kept on the calls themselves. */
static PyObject *backward_rows(PyObject *module, PyObject *const *args, Py_ssize_t n) {
    if (!G.ready) {
        PyErr_SetString(PyExc_RuntimeError, "hookdbg.recorder._hot.setup() was not called");
        return NULL;
    }
    if (n != 5 || !PyList_Check(args[0]) || !PyObject_TypeCheck(args[4], G.rows->type)) {
        PyErr_SetString(PyExc_TypeError, "backward_rows(calls, step, segment, origin, into)");
        return NULL;
    }
    PyObject *calls = args[0], *into = args[4];
    long long step = PyLong_AsLongLong(args[1]);
    if (step == -1 && PyErr_Occurred()) return NULL;
    long long segment = PyLong_AsLongLong(args[2]);
    if (segment == -1 && PyErr_Occurred()) return NULL;
    double origin = PyFloat_AsDouble(args[3]);
    if (origin == -1.0 && PyErr_Occurred()) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(calls);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *c = PyList_GET_ITEM(calls, i);
        if (!PyObject_TypeCheck(c, &CallType)) {
            PyErr_SetString(PyExc_TypeError, "backward_rows takes a list of Calls");
            return NULL;
        }
        ((Call *)c)->child_total = 0.0;
        ((Call *)c)->child_first = LATER;
    }
    Py_INCREF(calls);
    for (Py_ssize_t i = PyList_GET_SIZE(calls) - 1; i >= 0; i--) {
        Call *call = (Call *)PyList_GET_ITEM(calls, i);
        double total = call->bwd_self + call->child_total;
        double first = call->child_first < call->bwd_first ? call->child_first : call->bwd_first;
        if (total <= 0.0) continue;
        Call *parent = call->parent == Py_None ? NULL : (Call *)call->parent;
        if (parent != NULL) {
            parent->child_total += total;
            if (first < parent->child_first) parent->child_first = first;
        }
        if (call_row(into, call, G.BWD, step, segment, first - origin, total, call->bwd_self) < 0) {
            Py_DECREF(calls);
            return NULL;
        }
    }
    Py_DECREF(calls);
    Py_RETURN_NONE;
}

/* -- setup ------------------------------------------------------------------------------ */

static PyObject *setup(PyObject *module, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"Tensor", "strided", "Recompute", "Pending", "MUTED", "RAISED",
                         "summarise", "norm_summary", "one_pass", "shape_only", "c_kinds", "shapes",
                         "shapes_kept", "half_wide", "iter_tensors", "index", "graph_task_id",
                         "grad_enabled", "GradHooks", "hook_key", "compiler", "perf_counter",
                         "monotonic", "phases", "slots", "ModuleInfo", "StepState", "Handoff",
                         "no_stats", "empty_float_stats", "transforms_active", "FlightRecorder",
                         NULL};
    PyObject *compiler, *phases, *slots, *module_info, *step_state, *handoff, *flight;
    if (G.ready) Py_RETURN_NONE; /* once per process */
    if (!PyArg_ParseTupleAndKeywords(
            args, kwds, "$OOOOOOOOOOO!O!nLOO!OOO!UOOpO!O!OOOO!O!OO", kw, &G.Tensor, &G.strided,
            &G.Recompute, &G.Pending, &G.MUTED, &G.RAISED, &G.summarise, &G.norm_summary,
            &G.one_pass,
            &G.shape_only, &PyDict_Type, &G.c_kinds, &PyDict_Type, &G.shapes, &G.shapes_kept,
            &G.half_wide, &G.iter_tensors, &PyTuple_Type, &G.index, &G.graph_task_id,
            &G.grad_enabled, &PyType_Type, &G.GradHooks, &G.hook_key, &compiler,
            &G.perf_counter, &G.monotonic,
            &PyDict_Type, &phases, &PyDict_Type, &slots, &module_info, &step_state, &handoff,
            &PyTuple_Type, &G.no_stats, &PyTuple_Type, &G.empty_float_stats,
            &G.transforms_active, &flight))
        return NULL;
    struct { SlotRef *ref; PyObject *type; PyObject *name; } found[] = {
        {&SLOTS.ref, module_info, s_ref},           {&SLOTS.transparent, module_info, s_transparent},
        {&SLOTS.selected, module_info, s_selected}, {&SLOTS.id, module_info, s_id},
        {&SLOTS.capture, module_info, s_capture},   {&SLOTS.memo, step_state, s_memo},
        {&SLOTS.seg, step_state, s_seg},            {&SLOTS.grad_finite, step_state, s_grad_finite},
        {&SLOTS.last, handoff, s_last},             {&SLOTS.every, handoff, s_every},
        {&SLOTS.held, flight, s_held},              {&SLOTS.budget, flight, s_budget},
        {&SLOTS.entries, flight, s__entries},       {&SLOTS.sizes, flight, s__sizes},
    };
    for (size_t i = 0; i < sizeof found / sizeof *found; i++)
        find_slot(found[i].ref, found[i].type, found[i].name);
    if (PyTuple_GET_SIZE(G.index) < 64) {
        PyErr_SetString(PyExc_ValueError, "index holds the paths of 64 arguments");
        return NULL;
    }
    PyObject **objects[] = {&G.Tensor, &G.strided, &G.Recompute, &G.Pending, &G.MUTED,
                            &G.RAISED, &G.summarise, &G.norm_summary, &G.one_pass, &G.shape_only, &G.c_kinds,
                            &G.shapes, &G.iter_tensors, &G.index, &G.graph_task_id,
                            &G.grad_enabled, &G.GradHooks, &G.hook_key, &G.perf_counter,
                            &G.no_stats, &G.empty_float_stats, &G.transforms_active};
    for (size_t i = 0; i < sizeof objects / sizeof *objects; i++) Py_INCREF(*objects[i]);
    if ((G.cpu = PyUnicode_InternFromString("cpu")) == NULL ||
        (G.nan = PyFloat_FromDouble(Py_NAN)) == NULL)
        return NULL;
    PyObject *parameters = PyImport_ImportModule("torch.nn.parameter");
    if (parameters == NULL) return NULL;
    G.Parameter = PyObject_GetAttrString(parameters, "Parameter");
    Py_DECREF(parameters);
    if (G.Parameter == NULL) return NULL;
    PyObject *parametrize = PyImport_ImportModule("torch.nn.utils.parametrize");
    if (parametrize == NULL) return NULL;
    G.ParametrizationList = PyObject_GetAttrString(parametrize, "ParametrizationList");
    Py_DECREF(parametrize);
    if (G.ParametrizationList == NULL) return NULL;
    G.rows = PyCapsule_Import(ROWBUFFER_CAPSULE, 0);
    if (G.rows == NULL) return NULL;
    if (G.rows->version != ROWBUFFER_API_VERSION) {
        PyErr_SetString(PyExc_ImportError, "hookdbg.store._pack is of another build");
        return NULL;
    }
    G.compiler_dict = PyObject_GetAttrString(compiler, "__dict__");
    G.is_compiling = PyObject_GetAttrString(compiler, "is_compiling");
    if (G.compiler_dict == NULL || G.is_compiling == NULL) return NULL;
    struct { PyObject *from; const char *name; long *value; PyObject **obj; } consts[] = {
        {phases, "FWD", &G.FWD, &G.fwd},
        {phases, "BWD", &G.BWD, &G.bwd},
        {phases, "OPT", &G.OPT, &G.opt},
        {slots, "INPUT", &G.INPUT, &G.input},
        {slots, "OUTPUT", &G.OUTPUT, &G.output},
        {slots, "GRAD_OUTPUT", &G.GRAD_OUTPUT, &G.grad_output},
        {slots, "GRAD_INPUT", &G.GRAD_INPUT, &G.grad_input},
        {slots, "PARAM_GRAD", &G.PARAM_GRAD, &G.param_grad},
    };
    for (size_t i = 0; i < sizeof consts / sizeof *consts; i++) {
        PyObject *v = PyDict_GetItemString(consts[i].from, consts[i].name);
        if (v == NULL) {
            PyErr_Format(PyExc_KeyError, "setup: %s is missing", consts[i].name);
            return NULL;
        }
        *consts[i].value = PyLong_AsLong(v);
        if (*consts[i].value == -1 && PyErr_Occurred()) return NULL;
        if ((*consts[i].obj = PyLong_FromLong(*consts[i].value)) == NULL) return NULL;
    }
    G.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"backward_rows", (PyCFunction)(void (*)(void))backward_rows, METH_FASTCALL,
     "backward_rows(calls, step, segment, origin, into): timing.backward_rows, in C."},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "Hand over the Python objects the per-call path uses (once, from "
     "hookdbg/recorder/accelerated.py)."},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_hot", "The recorder's per-call path in C.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__hot(void) {
    if (intern_names() < 0) return NULL;
    if (summary_fields(summary_named, sizeof summary_named / sizeof *summary_named,
                       &summary_length) < 0)
        return NULL;
    if ((s_flag_name = PyUnicode_InternFromString("_is_compiling_flag")) == NULL) return NULL;
    PyTypeObject *types[] = {&LockType,       &GuardType,     &CallType,    &SeenTensorType,
                             &TensorPathType, &ParamHookType, &CallPathType};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    /* a SeenTensor is a tensor's hook: torch.save need not warn that it is not saved with it */
    if (PyDict_SetItemString(SeenTensorType.tp_dict, "__torch_unserializable__", Py_True) < 0)
        return NULL;
    PyType_Modified(&SeenTensorType);
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    const char *names[] = {"Lock",       "Guard",     "Call",    "SeenTensor",
                           "TensorPath", "ParamHook", "CallPath"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
