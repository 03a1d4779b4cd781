/* One pass over a tensor's memory: every statistic hookdbg keeps, at once.
 *
 * torch and numpy compute min/max, sum and sum of squares in three passes and three
 * dispatches; on the small tensors of a real model the dispatch (2.5-5 us each) is
 * most of the cost, and on large ones each pass reads the tensor again from memory.
 * This reads it once: min and max over the finite values, their sum and sum of squares
 * (in double, shifted by the first finite value so that a tensor whose spread is tiny
 * next to its mean keeps its digits), and the counts of NaN, +inf, -inf and zeros.
 *
 * summary(address, n, kind, shape, dtype)
 *     -> (shape, dtype, "cpu", n, min, max, mean, std, norm, nan, posinf, neginf, zero_frac)
 *
 * the whole summary tuple of hookdbg/recorder/stats.py, built here rather than
 * unpacked and packed again in Python (it runs for every new tensor). ``address`` is
 * the first element of ``n`` contiguous elements of type ``kind`` (the caller keeps
 * the tensor alive and checks it is contiguous and on the CPU); ``shape`` and
 * ``dtype`` are passed through. Integer kinds give min, max and the zero fraction;
 * their other statistics are NaN and their non-finite counts 0.
 *
 * norms(tensors, kinds) -> a list: each tensor's L2 norm, or None
 *
 * The norms of a model's parameters after each optimizer step, for every parameter
 * that is a contiguous CPU tensor of a floating kind (``kinds`` maps its dtype to
 * (kind, name), as stats.C_KINDS does): its squares summed in double, so that no
 * float16 norm overflows and NaN and inf come through as they are. None for any other
 * tensor (the caller asks torch for those). torch._foreach_norm costs about 1 us per
 * small tensor on the CPU, its dispatch most of it; this costs the attribute reads.
 *
 * histogram(address, n, kind, lo, hi, bins) -> bytes of ``bins`` int64 counts
 *
 * The finite values of a floating tensor in ``bins`` equal bins from ``lo`` to ``hi``
 * (its finite min and max), exactly as numpy.histogram(values.astype(float64), bins,
 * (lo, hi)) counts them: the same float64 edges, the last bin closed (see
 * hookdbg/recorder/histograms.py for why not torch.histc).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { F32 = 0, F64 = 1, F16 = 2, BF16 = 3, I64 = 4, I32 = 5, U8 = 6, I8 = 7, I16 = 8 };

static inline float from_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13); /* inf or NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign; /* zero */
    } else { /* subnormal: normalise */
        exp = 113;
        while (!(mant & 0x400)) {
            mant <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

typedef struct {
    double lo, hi, shift, s1, s2;
    int64_t finite, nan, posinf, neginf, zeros;
} Acc;

static inline void add(Acc *a, double x) {
    if (isnan(x)) {
        a->nan++;
        return;
    }
    if (isinf(x)) {
        if (x > 0)
            a->posinf++;
        else
            a->neginf++;
        return;
    }
    if (a->finite == 0) {
        a->lo = a->hi = a->shift = x;
    }
    a->zeros += (x == 0.0);
    if (x < a->lo) a->lo = x;
    if (x > a->hi) a->hi = x;
    double d = x - a->shift;
    a->s1 += d;
    a->s2 += d * d;
    a->finite++;
}

#define LOOP(TYPE, CONVERT)                                    \
    do {                                                       \
        const TYPE *p = (const TYPE *)data;                    \
        for (Py_ssize_t i = 0; i < n; i++) add(&acc, CONVERT(p[i])); \
    } while (0)

/* float32, the common case: blocks of 16 independent lanes the compiler turns into SIMD
 * instructions, summed into the double accumulators per block; a block that holds a
 * non-finite value (or whose float sums overflow) is redone element by element. A NaN or
 * an inf makes its lane's sum non-finite for good (NaN and inf absorb every addition), so
 * the sums' check at the block's end finds it: no separate test per value, which would
 * cost the loop a seventh of its speed (it is bound by vector instructions, eight a vector). */
enum { BLOCK = 2048, LANES = 16 };

/* Built for AVX2 as well where the toolchain can (x86-64, glibc's ifuncs, a compiler
 * with target_clones): the loader picks the clone the CPU runs, eight lanes a vector
 * instead of SSE2's four. Elsewhere the one portable build. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef CLONES
#define CLONES
#endif

CLONES static void f32_block(Acc *a, const float *p, Py_ssize_t n) {
    if (a->finite == 0) { /* the shift: the first finite value */
        for (Py_ssize_t i = 0; i < n; i++) {
            if (isfinite(p[i])) {
                a->lo = a->hi = a->shift = p[i];
                break;
            }
        }
    }
    const float k = (float)a->shift;
    float lo[LANES], hi[LANES], s1[LANES], s2[LANES];
    int32_t zeros[LANES];
    for (int j = 0; j < LANES; j++) {
        lo[j] = hi[j] = k;
        s1[j] = s2[j] = 0.0f;
        zeros[j] = 0;
    }
    Py_ssize_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) {
            float x = p[i + j];
            lo[j] = x < lo[j] ? x : lo[j];
            hi[j] = x > hi[j] ? x : hi[j];
            float d = x - k;
            s1[j] += d;
            s2[j] += d * d;
            zeros[j] += (x == 0.0f);
        }
    }
    float t1 = 0.0f, t2 = 0.0f;
    for (int j = 0; j < LANES; j++) {
        t1 += s1[j];
        t2 += s2[j];
    }
    if (!isfinite(t1) || !isfinite(t2)) { /* rare: the exact way */
        for (Py_ssize_t m = 0; m < n; m++) add(a, p[m]);
        return;
    }
    for (int j = 0; j < LANES; j++) {
        if (lo[j] < a->lo) a->lo = lo[j];
        if (hi[j] > a->hi) a->hi = hi[j];
        a->zeros += zeros[j];
    }
    double d1 = 0.0, d2 = 0.0;
    for (int j = 0; j < LANES; j++) {
        d1 += s1[j];
        d2 += s2[j];
    }
    a->s1 += d1;
    a->s2 += d2;
    a->finite += i;
    for (; i < n; i++) add(a, p[i]);
}

#define AS_DOUBLE(x) ((double)(x))

#define INT_LOOP(TYPE)                                         \
    do {                                                       \
        const TYPE *p = (const TYPE *)data;                    \
        TYPE lo = p[0], hi = p[0];                             \
        for (Py_ssize_t i = 0; i < n; i++) {                   \
            TYPE v = p[i];                                     \
            if (v < lo) lo = v;                                \
            if (v > hi) hi = v;                                \
            zeros += (v == 0);                                 \
        }                                                      \
        ilo = (double)lo;                                      \
        ihi = (double)hi;                                      \
    } while (0)

static PyObject *cpu_name; /* "cpu", the device of every summary made here */

/* stats.py's summary tuple. It holds no container but the shape (shared, and itself
 * untracked), so the garbage collector need not track it: summaries live as long as
 * their step, by the hundreds. */
static PyObject *summary_tuple(PyObject *shape, PyObject *dtype, Py_ssize_t n, double lo,
                               double hi, double mean, double std, double norm, long long nan,
                               long long posinf, long long neginf, double zero_frac) {
    PyObject *t = PyTuple_New(13);
    if (t == NULL) return NULL;
    PyObject *cells[13] = {
        Py_NewRef(shape),
        Py_NewRef(dtype),
        Py_NewRef(cpu_name),
        PyLong_FromSsize_t(n),
        PyFloat_FromDouble(lo),
        PyFloat_FromDouble(hi),
        PyFloat_FromDouble(mean),
        PyFloat_FromDouble(std),
        PyFloat_FromDouble(norm),
        PyLong_FromLongLong(nan),
        PyLong_FromLongLong(posinf),
        PyLong_FromLongLong(neginf),
        PyFloat_FromDouble(zero_frac),
    };
    int bad = 0;
    for (int i = 0; i < 13; i++) {
        if (cells[i] == NULL) bad = 1;
        PyTuple_SET_ITEM(t, i, cells[i] != NULL ? cells[i] : Py_NewRef(Py_None));
    }
    if (bad) {
        Py_DECREF(t);
        return NULL;
    }
    if (!PyObject_GC_IsTracked(shape)) PyObject_GC_UnTrack(t);
    return t;
}

static PyObject *summary(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "summary(address, n, kind, shape, dtype)");
        return NULL;
    }
    unsigned long long address = PyLong_AsUnsignedLongLong(args[0]);
    if (address == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    long kind_number = PyLong_AsLong(args[2]);
    if (kind_number == -1 && PyErr_Occurred()) return NULL;
    if (kind_number < F32 || kind_number > I16) {
        PyErr_SetString(PyExc_ValueError, "summary: unknown element kind");
        return NULL;
    }
    int kind = (int)kind_number;
    PyObject *shape = args[3], *dtype = args[4];
    if (n <= 0 || address == 0) {
        PyErr_SetString(PyExc_ValueError, "summary: no elements");
        return NULL;
    }
    const void *data = (const void *)(uintptr_t)address;
    /* large tensors take long enough for other threads (hookdbg's writer) to run */
    PyThreadState *released = NULL;

    if (kind >= I64) {
        double ilo = 0, ihi = 0;
        int64_t zeros = 0;
        if (n >= 32768) released = PyEval_SaveThread();
        switch (kind) {
            case I64: INT_LOOP(int64_t); break;
            case I32: INT_LOOP(int32_t); break;
            case U8: INT_LOOP(uint8_t); break;
            case I8: INT_LOOP(int8_t); break;
            default: INT_LOOP(int16_t); break;
        }
        if (released) PyEval_RestoreThread(released);
        return summary_tuple(shape, dtype, n, ilo, ihi, NAN, NAN, NAN, 0, 0, 0,
                             (double)zeros / (double)n);
    }
    if (kind > BF16) {
        PyErr_SetString(PyExc_ValueError, "summary: unknown element kind");
        return NULL;
    }

    Acc acc;
    memset(&acc, 0, sizeof acc);
    if (n >= 32768) released = PyEval_SaveThread();
    switch (kind) {
        case F32:
            for (Py_ssize_t at = 0; at < n; at += BLOCK)
                f32_block(&acc, (const float *)data + at, n - at < BLOCK ? n - at : BLOCK);
            break;
        case F64: LOOP(double, AS_DOUBLE); break;
        case F16: LOOP(uint16_t, from_f16); break;
        default: LOOP(uint16_t, from_bf16); break;
    }
    if (released) PyEval_RestoreThread(released);

    double lo = NAN, hi = NAN, mean = NAN, std = NAN, norm = NAN;
    if (acc.finite > 0) {
        double m = (double)acc.finite;
        double dm = acc.s1 / m;
        double var = acc.s2 / m - dm * dm;
        lo = acc.lo;
        hi = acc.hi;
        mean = acc.shift + dm;
        std = (lo == hi || var <= 0) ? 0.0 : sqrt(var);
        /* sum of squares of the values, from the shifted sums */
        double sq = acc.s2 + 2.0 * acc.shift * acc.s1 + m * acc.shift * acc.shift;
        norm = sqrt(sq > 0 ? sq : 0.0);
    }
    return summary_tuple(shape, dtype, n, lo, hi, mean, std, norm, (long long)acc.nan,
                         (long long)acc.posinf, (long long)acc.neginf,
                         (double)acc.zeros / (double)n);
}


/* The sum of squares of ``n`` float32 values, in double: sixteen independent lanes the
 * compiler vectorises (the AVX2 clone: four doubles a vector, four vectors, enough to
 * hide the additions' latency; eight lanes ran at four fifths of the speed). */
enum { SQUARE_LANES = 16 };

CLONES static double f32_squares(const float *p, Py_ssize_t n) {
    double s[SQUARE_LANES] = {0};
    Py_ssize_t i = 0;
    for (; i + SQUARE_LANES <= n; i += SQUARE_LANES)
        for (int j = 0; j < SQUARE_LANES; j++) s[j] += (double)p[i + j] * (double)p[i + j];
    for (int half = SQUARE_LANES / 2; half > 0; half /= 2) /* pairwise, the same in every build */
        for (int j = 0; j < half; j++) s[j] += s[j + half];
    double total = s[0];
    for (; i < n; i++) total += (double)p[i] * (double)p[i];
    return total;
}

#define SQUARES_LOOP(TYPE, CONVERT)                                \
    do {                                                           \
        const TYPE *p = (const TYPE *)data;                        \
        for (Py_ssize_t i = 0; i < n; i++) {                       \
            double x = CONVERT(p[i]);                              \
            total += x * x;                                        \
        }                                                          \
    } while (0)

static double squares(const void *data, Py_ssize_t n, int kind) {
    double total = 0.0;
    switch (kind) {
        case F32: return f32_squares((const float *)data, n);
        case F64: SQUARES_LOOP(double, AS_DOUBLE); break;
        case F16: SQUARES_LOOP(uint16_t, from_f16); break;
        default: SQUARES_LOOP(uint16_t, from_bf16); break;
    }
    return total;
}

static PyObject *s_dtype, *s_is_cpu, *s_is_contiguous, *s_data_ptr, *s_shape;

/* Where ``t``'s values lie, if norms() reads them itself: 1 with *data, *n and *kind
 * set; 0 to leave the tensor to the caller; -1 on an error. */
static int readable(PyObject *t, PyObject *kinds, const void **data, Py_ssize_t *n, int *kind) {
    PyObject *v = PyObject_GetAttr(t, s_dtype);
    if (v == NULL) return -1;
    PyObject *spec = PyDict_GetItemWithError(kinds, v); /* borrowed */
    Py_DECREF(v);
    if (spec == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1) {
        PyErr_SetString(PyExc_TypeError, "norms: kinds maps a dtype to (kind, name)");
        return -1;
    }
    long k = PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    if (k == -1 && PyErr_Occurred()) return -1;
    if (k < F32 || k > BF16) return 0;
    if ((v = PyObject_GetAttr(t, s_is_cpu)) == NULL) return -1;
    int cpu = v == Py_True;
    Py_DECREF(v);
    if (!cpu) return 0;
    if ((v = PyObject_CallMethodNoArgs(t, s_is_contiguous)) == NULL) return -1;
    int contiguous = v == Py_True;
    Py_DECREF(v);
    if (!contiguous) return 0;
    if ((v = PyObject_GetAttr(t, s_shape)) == NULL) return -1;
    if (!PyTuple_Check(v)) { /* torch.Size is a tuple */
        Py_DECREF(v);
        return 0;
    }
    Py_ssize_t count = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v) && count > 0; i++) {
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(v, i))) { /* a symbolic size: torch's */
            Py_DECREF(v);
            return 0;
        }
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(v, i));
        if (size == -1 && PyErr_Occurred()) {
            Py_DECREF(v);
            return -1;
        }
        count *= size;
    }
    Py_DECREF(v);
    if (count <= 0) return 0;
    if ((v = PyObject_CallMethodNoArgs(t, s_data_ptr)) == NULL) return -1;
    void *address = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    if (address == NULL) return PyErr_Occurred() ? -1 : 0; /* a wrapper: values elsewhere */
    *data = address;
    *n = count;
    *kind = (int)k;
    return 1;
}

static PyObject *norms(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "norms(tensors: list, kinds: dict)");
        return NULL;
    }
    /* a copy: reading a tensor's attributes may run Python code that changes the list */
    PyObject *tensors = PyList_AsTuple(args[0]), *kinds = args[1];
    if (tensors == NULL) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(tensors);
    PyObject *out = PyList_New(count);
    if (out == NULL) {
        Py_DECREF(tensors);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyTuple_GET_ITEM(tensors, i);
        Py_INCREF(t);
        const void *data = NULL;
        Py_ssize_t n = 0;
        int kind = 0, ok = readable(t, kinds, &data, &n, &kind);
        PyObject *norm = NULL;
        if (ok > 0) {
            PyThreadState *released = n >= 32768 ? PyEval_SaveThread() : NULL;
            double total = squares(data, n, kind);
            if (released) PyEval_RestoreThread(released);
            norm = PyFloat_FromDouble(sqrt(total));
        } else if (ok == 0) {
            norm = Py_NewRef(Py_None);
        }
        Py_DECREF(t);
        if (norm == NULL) {
            Py_DECREF(tensors);
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, norm);
    }
    Py_DECREF(tensors);
    return out;
}

/* The bin of ``x`` (lo <= x <= hi), as numpy finds it: an estimate, then moved across
 * at most an edge or two so that edges[i] <= x < edges[i + 1] (the last bin closed). */
static inline Py_ssize_t bin_of(double x, double lo, double scale, Py_ssize_t bins,
                                const double *edges) {
    double f = (x - lo) * scale; /* scale = bins / (hi - lo): an estimate is all it is */
    Py_ssize_t i = f >= (double)bins ? bins - 1 : (f > 0 ? (Py_ssize_t)f : 0);
    while (i > 0 && x < edges[i]) i--;
    while (i < bins - 1 && x >= edges[i + 1]) i++;
    return i;
}

#define HIST_LOOP(TYPE, CONVERT)                                             \
    do {                                                                     \
        const TYPE *p = (const TYPE *)data;                                  \
        for (Py_ssize_t k = 0; k < n; k++) {                                 \
            double x = CONVERT(p[k]);                                        \
            if (isfinite(x) && x >= lo && x <= hi)                           \
                counts[bin_of(x, lo, scale, bins, edges)]++;                 \
        }                                                                    \
    } while (0)

static PyObject *histogram(PyObject *self, PyObject *args) {
    unsigned long long address;
    Py_ssize_t n, bins;
    int kind;
    double lo, hi;
    if (!PyArg_ParseTuple(args, "Kniddn", &address, &n, &kind, &lo, &hi, &bins)) return NULL;
    if (n <= 0 || address == 0 || bins <= 0 || kind > BF16 || !(lo < hi) || !isfinite(lo) ||
        !isfinite(hi)) {
        PyErr_SetString(PyExc_ValueError, "histogram: bad arguments");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, bins * (Py_ssize_t)sizeof(int64_t));
    double *edges = PyMem_Malloc((bins + 1) * sizeof(double));
    if (out == NULL || edges == NULL) {
        Py_XDECREF(out);
        PyMem_Free(edges);
        return PyErr_NoMemory();
    }
    int64_t *counts = (int64_t *)PyBytes_AS_STRING(out);
    memset(counts, 0, bins * sizeof(int64_t));
    /* numpy.linspace's edges: i * step + lo, rounded twice (never fused into one
     * multiply-add, which rounds once), and hi itself last */
    double width = hi - lo, step = width / (double)bins;
    for (Py_ssize_t i = 0; i < bins; i++) {
        volatile double scaled = (double)i * step;
        edges[i] = scaled + lo;
    }
    edges[bins] = hi;
    double scale = (double)bins / width;
    if (!isfinite(scale)) scale = 0.0; /* a subnormal width: the edges do all the work */
    const void *data = (const void *)(uintptr_t)address;
    PyThreadState *released = n >= 32768 ? PyEval_SaveThread() : NULL;
    switch (kind) {
        case F32: HIST_LOOP(float, AS_DOUBLE); break;
        case F64: HIST_LOOP(double, AS_DOUBLE); break;
        case F16: HIST_LOOP(uint16_t, from_f16); break;
        default: HIST_LOOP(uint16_t, from_bf16); break;
    }
    if (released) PyEval_RestoreThread(released);
    PyMem_Free(edges);
    return out;
}

static PyMethodDef methods[] = {
    {"summary", (PyCFunction)(void (*)(void))summary, METH_FASTCALL,
     "summary(address, n, kind, shape, dtype) -> the summary tuple of hookdbg's stats.py"},
    {"norms", (PyCFunction)(void (*)(void))norms, METH_FASTCALL,
     "norms(tensors, kinds) -> each tensor's L2 norm, or None where torch must compute it"},
    {"histogram", histogram, METH_VARARGS,
     "histogram(address, n, kind, lo, hi, bins) -> bytes of bins int64 counts"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cstats", "One-pass tensor statistics.", -1, methods,
};

PyMODINIT_FUNC PyInit__cstats(void) {
    cpu_name = PyUnicode_InternFromString("cpu");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_is_cpu = PyUnicode_InternFromString("is_cpu");
    s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_shape = PyUnicode_InternFromString("shape");
    if (cpu_name == NULL || s_dtype == NULL || s_is_cpu == NULL || s_is_contiguous == NULL ||
        s_data_ptr == NULL || s_shape == NULL)
        return NULL;
    return PyModule_Create(&module);
}
