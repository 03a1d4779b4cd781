/* One pass over a tensor's memory: every statistic hookdbg keeps, at once.
 *
 * torch and numpy compute min/max, sum and sum of squares in three passes and three
 * dispatches; on the small tensors of a real model the dispatch (2.5-5 us each) is
 * most of the cost, and on large ones each pass reads the tensor again from memory.
 * This reads it once: min and max over the finite values, their mean, population std
 * (ddof 0) and L2 norm as exact as a float64 two-pass computation (see ``Acc``), the
 * counts of NaN, +inf, -inf, zeros and values below 0, the mean of |x|, and the values
 * equal to the min or the max (counted in a second pass over a block that reaches them).
 *
 * summary(address, n, kind, shape, dtype) -> a summary tuple
 *
 * the whole summary tuple of hookdbg/recorder/summaries/stats.py (its fields at the positions
 * hookdbg/store/summary.py declares, looked up when this module is imported: fields.h),
 * built here rather than
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
 * hookdbg/recorder/summaries/histograms.py for why not torch.histc).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../store/fields.h"

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

/* The finite values seen so far: their range, mean, M2 (the sum of squared deviations
 * from their mean) and counts. Values are read in blocks; each block's sums of y and
 * y^2 (y = x - c, in double, where the squares of float32 values are exact) give its
 * mean and M2, and Chan's formula merges those into the totals. The shift c is 0 while
 * the mean so far is no larger than the std so far (most tensors of a model: the sums
 * then lose at most a bit to cancellation), and otherwise the mean so far (1e7 plus
 * noise: y is then as small as the noise); the first block's from its first values.
 * The mean is kept as an unevaluated sum of two
 * doubles (mean + mean_lo), so that the differences of means Chan's formula needs are
 * taken between small numbers. Float32 sums, as numpy's and torch's own reductions of
 * float32 take them, lose 1e-7 of the mean and the std; these agree with a float64
 * two-pass reference to about 1e-14 relative (adversarial data: offsets of 1e7, mixed
 * magnitudes, outliers first; tested in tests/recorder/test_engines.py), and cost one
 * pass over memory. */
typedef struct {
    double lo, hi, mean, mean_lo, m2, abs; /* abs: the sum of |x| */
    /* negs: values below 0; at_lo: values equal to lo */
    int64_t finite, nan, posinf, neginf, zeros, negs, at_lo, at_hi;
} Acc;

/* One block's finite values about a shift c: their range, counts of zeros and of
 * values below 0, the values at either end of the range, the sums of y = x - c and of
 * y^2, and of |x|. */
typedef struct {
    double lo, hi, s, q, abs;
    int64_t n, zeros, negs, at_lo, at_hi;
} Part;

/* Values a block (the merge and the lanes' sums cost about 100 cycles a block: a
 * tenth of the pass at 2048 values, a fortieth at 8192); values a block holding NaN
 * or inf is gathered from at a time (``scratch``, on the stack); lanes. */
enum { BLOCK = 8192, SCRATCH = 2048, LANES = 16 };

/* mean^2 <= CENTRED * variance: no shift (the sum of squares then cancels at most a
 * factor 1 + CENTRED against the square of the sum: a bit; at 16, a tensor whose first
 * block straddles 0 and 1e7 is off by 5e-14) */
static const double CENTRED = 1.0;

/* Chan et al.: M2 of a union = M2_a + M2_b + delta^2 * n_a * n_b / (n_a + n_b), delta
 * the difference of the two means, taken between small numbers (the block's mean less
 * c, the low part of the mean so far) where c is the mean so far. */
static void merge(Acc *a, const Part *b, double c) {
    if (b->n == 0) return;
    double nb = (double)b->n, mu = b->s / nb; /* the block's mean, less c */
    double m2 = isfinite(b->q) ? b->q - b->s * mu : b->q; /* inf: values too large */
    if (m2 < 0.0) m2 = 0.0;
    double mean = c, t = mu;
    if (a->finite == 0) {
        a->m2 = m2;
        a->lo = b->lo;
        a->hi = b->hi;
        a->at_lo = b->at_lo;
        a->at_hi = b->at_hi;
    } else {
        double na = (double)a->finite, w = nb / (na + nb);
        double delta = (c - a->mean) + (mu - a->mean_lo);
        a->m2 += m2 + delta * delta * (na * w);
        mean = a->mean;
        t = a->mean_lo + delta * w;
        if (b->lo < a->lo) {
            a->lo = b->lo;
            a->at_lo = b->at_lo;
        } else if (b->lo == a->lo) {
            a->at_lo += b->at_lo;
        }
        if (b->hi > a->hi) {
            a->hi = b->hi;
            a->at_hi = b->at_hi;
        } else if (b->hi == a->hi) {
            a->at_hi += b->at_hi;
        }
    }
    double sum = mean + t, v = sum - mean; /* TwoSum: mean + t exactly, in two parts */
    a->mean = sum;
    a->mean_lo = (mean - (sum - v)) + (t - v);
    a->finite += b->n;
    a->zeros += b->zeros;
    a->negs += b->negs;
    a->abs += b->abs;
}

/* Built for x86-64-v3 (AVX2 and FMA) as well where the toolchain can (x86-64, glibc's
 * ifuncs, GCC 12 or later; AVX2 alone with other compilers that clone): the loader
 * picks the clone the CPU runs, eight floats (four doubles) a vector instead of
 * SSE2's four (two). Elsewhere the one portable build. Every lane adds in the order
 * the source gives; fused multiply-adds (a fifth faster here) round a square and its
 * sum once instead of twice, which changes nothing where the square is exact (float32
 * values read about 0, as most are), and the last bits elsewhere. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#endif
#ifndef CLONES
#define CLONES
#endif

/* The sum of LANES lanes, pairwise: the same order in every build. */
static inline double lanes_total(double *s) {
    for (int half = LANES / 2; half > 0; half /= 2)
        for (int j = 0; j < half; j++) s[j] += s[j + half];
    return s[0];
}

/* A block's Part about ``c`` (SHIFT is ``-c``) or about 0 (SHIFT is empty: no
 * subtraction, a fifth faster), in one pass: 1, or 0 where a sum is not finite (a NaN
 * or an inf among the values: NaN and inf absorb every addition, so no test per value
 * is needed; or, for float64, squares past the largest double). The sums take LANES
 * lanes in double, range and zero count half as many in the values' own type, fed two
 * values at a time: so that every lane stays in a register of AVX2's sixteen. The last
 * n % LANES values go apart, for the same reason. */
#define MOMENTS(NAME, TYPE, SHIFT, MAG)                                             \
    CLONES static int NAME(Part *out, const TYPE *p, Py_ssize_t n, double c) { \
        enum { HALF = LANES / 2 };                                             \
        TYPE lo[HALF], hi[HALF];                                               \
        double s[LANES], q[LANES], ab[HALF];                                   \
        int32_t zeros[HALF], negs[HALF];                                       \
        (void)c;                                                               \
        for (int j = 0; j < LANES; j++) s[j] = q[j] = 0.0;                     \
        for (int j = 0; j < HALF; j++) {                                       \
            lo[j] = (TYPE)INFINITY;                                            \
            hi[j] = (TYPE)-INFINITY;                                           \
            zeros[j] = negs[j] = 0;                                            \
            ab[j] = 0.0;                                                       \
        }                                                                      \
        Py_ssize_t i = 0;                                                      \
        for (; i + LANES <= n; i += LANES) {                                   \
            for (int j = 0; j < HALF; j++) {                                   \
                TYPE a = p[i + j], b = p[i + HALF + j];                        \
                TYPE small = a < b ? a : b, large = a > b ? a : b;             \
                lo[j] = small < lo[j] ? small : lo[j];                         \
                hi[j] = large > hi[j] ? large : hi[j];                         \
                zeros[j] += (a == 0) + (b == 0);                               \
                negs[j] += (a < 0) + (b < 0);                                  \
                double ya = (double)a SHIFT, yb = (double)b SHIFT;             \
                s[j] += ya;                                                    \
                s[j + HALF] += yb;                                             \
                q[j] += ya * ya;                                               \
                q[j + HALF] += yb * yb;                                        \
                ab[j] += fabs(MAG(a, ya)) + fabs(MAG(b, yb));                  \
            }                                                                  \
        }                                                                      \
        TYPE tail_lo = lo[0], tail_hi = hi[0];                                 \
        double tail_s = 0.0, tail_q = 0.0, tail_ab = 0.0;                      \
        int64_t tail_zeros = 0, tail_negs = 0;                                 \
        for (; i < n; i++) {                                                   \
            TYPE x = p[i];                                                     \
            tail_lo = x < tail_lo ? x : tail_lo;                               \
            tail_hi = x > tail_hi ? x : tail_hi;                               \
            tail_zeros += (x == 0);                                            \
            tail_negs += (x < 0);                                              \
            double y = (double)x SHIFT;                                        \
            tail_s += y;                                                       \
            tail_q += y * y;                                                   \
            tail_ab += fabs(MAG(x, y));                                        \
        }                                                                      \
        out->s = lanes_total(s) + tail_s;                                      \
        out->q = lanes_total(q) + tail_q;                                      \
        out->abs = tail_ab;                                                    \
        out->lo = tail_lo;                                                     \
        out->hi = tail_hi;                                                     \
        out->zeros = tail_zeros;                                               \
        out->negs = tail_negs;                                                 \
        for (int j = 0; j < HALF; j++) {                                       \
            if (lo[j] < out->lo) out->lo = lo[j];                              \
            if (hi[j] > out->hi) out->hi = hi[j];                              \
            out->zeros += zeros[j];                                            \
            out->negs += negs[j];                                              \
            out->abs += ab[j];                                                 \
        }                                                                      \
        out->n = n;                                                            \
        return isfinite(out->s) && isfinite(out->q);                           \
    }

/* |x| from the value already widened where there is no shift (GCC otherwise takes
 * fabs in float and widens every value a second time: a third more instructions) */
#define UNSHIFTED(x, y) (y)
#define WIDENED(x, y) ((double)(x))
MOMENTS(f32_plain, float, , UNSHIFTED)
MOMENTS(f32_shifted, float, -c, WIDENED)
MOMENTS(f64_plain, double, , UNSHIFTED)
MOMENTS(f64_shifted, double, -c, WIDENED)

/* How many of a block's values equal its min and its max: a second pass over the block
 * while it is in the cache, taken only where the block reaches the range so far (on
 * most tensors a few blocks do; on a saturated one, a ReLU6's, every one). */
#define ENDS(NAME, TYPE)                                                       \
    CLONES static void NAME(Part *b, const TYPE *p, Py_ssize_t n) {            \
        TYPE lo = (TYPE)b->lo, hi = (TYPE)b->hi;                               \
        int32_t at_lo[LANES], at_hi[LANES];                                    \
        for (int j = 0; j < LANES; j++) at_lo[j] = at_hi[j] = 0;               \
        Py_ssize_t i = 0;                                                      \
        for (; i + LANES <= n; i += LANES)                                     \
            for (int j = 0; j < LANES; j++) {                                  \
                at_lo[j] += p[i + j] == lo;                                    \
                at_hi[j] += p[i + j] == hi;                                    \
            }                                                                  \
        for (; i < n; i++) {                                                   \
            at_lo[0] += p[i] == lo;                                            \
            at_hi[0] += p[i] == hi;                                            \
        }                                                                      \
        b->at_lo = b->at_hi = 0;                                               \
        for (int j = 0; j < LANES; j++) {                                      \
            b->at_lo += at_lo[j];                                              \
            b->at_hi += at_hi[j];                                              \
        }                                                                      \
    }

ENDS(f32_ends, float)
ENDS(f64_ends, double)

/* Whether a block's values may be at the ends of the range of all the values. */
static inline int reaches(const Acc *a, const Part *b) {
    return a->finite == 0 || b->lo <= a->lo || b->hi >= a->hi;
}

/* Whether a block's sums are about a shift too far from its mean to give its M2. */
static int off_centre(const Part *b) {
    double mu = b->s / (double)b->n, m2 = b->q - b->s * mu;
    return mu * mu * (double)b->n > CENTRED * m2;
}

/* The shift of the first block, guessed from its first LANES values: 0 where they
 * lie around 0, their mean where they do not. */
#define FIRST_SHIFT(NAME, TYPE)                                                \
    static double NAME(const TYPE *p, Py_ssize_t n) {                          \
        Py_ssize_t k = n < LANES ? n : LANES;                                  \
        double mean = 0.0, m2 = 0.0;                                           \
        for (Py_ssize_t i = 0; i < k; i++) mean += (double)p[i];               \
        mean /= (double)k;                                                     \
        for (Py_ssize_t i = 0; i < k; i++) {                                   \
            double d = (double)p[i] - mean;                                    \
            m2 += d * d;                                                       \
        }                                                                      \
        int off = isfinite(mean) && mean * mean * (double)k > CENTRED * m2;    \
        return off ? mean : 0.0;                                               \
    }

FIRST_SHIFT(f32_first_shift, float)
FIRST_SHIFT(f64_first_shift, double)

/* A block's Part, about the shift it stores in ``c``: 1, or 0 where a sum is not
 * finite (the Part is filled all the same). The others are read about 0 or the mean so
 * far; the first, which has no mean so far, about its first values' guess, and again
 * about its own mean where that guess leaves it off centre (an outlier first). */
#define BLOCK_PART(NAME, TYPE, PLAIN, SHIFTED, FIRST)                                 \
    static int NAME(const Acc *a, Part *b, const TYPE *p, Py_ssize_t n, double *c) { \
        if (a->finite == 0) {                                                         \
            *c = FIRST(p, n);                                                         \
            int finite = *c == 0.0 ? PLAIN(b, p, n, 0.0) : SHIFTED(b, p, n, *c);      \
            if (!finite || !off_centre(b)) return finite;                             \
            *c += b->s / (double)b->n;                                                \
            return SHIFTED(b, p, n, *c);                                              \
        }                                                                             \
        double var = a->m2 / (double)a->finite;                                       \
        *c = a->mean * a->mean <= CENTRED * var ? 0.0 : a->mean;                      \
        return *c == 0.0 ? PLAIN(b, p, n, 0.0) : SHIFTED(b, p, n, *c);                \
    }

BLOCK_PART(f32_part, float, f32_plain, f32_shifted, f32_first_shift)
BLOCK_PART(f64_part, double, f64_plain, f64_shifted, f64_first_shift)

/* At most SCRATCH values holding NaN or inf (or float64 values whose squares pass the
 * largest double): the non-finite ones counted, the finite ones gathered in ``finite``
 * (SCRATCH doubles; it may be ``p`` itself) and summarised. Rare. */
static void mixed_block(Acc *a, const double *p, Py_ssize_t n, double *finite) {
    Py_ssize_t m = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        double x = p[k];
        if (isnan(x))
            a->nan++;
        else if (isinf(x))
            x > 0 ? a->posinf++ : a->neginf++;
        else
            finite[m++] = x;
    }
    if (m == 0) return;
    Part part;
    double c;
    f64_part(a, &part, finite, m, &c); /* past the largest double: inf, as numpy says */
    if (reaches(a, &part))
        f64_ends(&part, finite, m);
    else
        part.at_lo = part.at_hi = 0;
    merge(a, &part, c);
}

/* One block of at most BLOCK values; ``scratch`` holds SCRATCH doubles. */
static void f32_block(Acc *a, const float *p, Py_ssize_t n, double *scratch) {
    Part part;
    double c;
    if (f32_part(a, &part, p, n, &c)) {
        if (reaches(a, &part))
            f32_ends(&part, p, n);
        else
            part.at_lo = part.at_hi = 0;
        merge(a, &part, c);
        return;
    }
    for (Py_ssize_t at = 0; at < n; at += SCRATCH) {
        Py_ssize_t size = n - at < SCRATCH ? n - at : SCRATCH;
        for (Py_ssize_t k = 0; k < size; k++) scratch[k] = (double)p[at + k];
        mixed_block(a, scratch, size, scratch);
    }
}

static void f64_block(Acc *a, const double *p, Py_ssize_t n, double *scratch) {
    Part part;
    double c;
    if (f64_part(a, &part, p, n, &c)) {
        if (reaches(a, &part))
            f64_ends(&part, p, n);
        else
            part.at_lo = part.at_hi = 0;
        merge(a, &part, c);
        return;
    }
    for (Py_ssize_t at = 0; at < n; at += SCRATCH)
        mixed_block(a, p + at, n - at < SCRATCH ? n - at : SCRATCH, scratch);
}

#define AS_DOUBLE(x) ((double)(x))

/* A block of half-precision values, widened to double in ``scratch`` and summarised
 * there (tensors of more than stats._HALF_WIDE are widened to float32 by torch first). */
#define WIDEN(CONVERT)                                                            \
    do {                                                                          \
        const uint16_t *h = (const uint16_t *)data + at;                          \
        for (Py_ssize_t k = 0; k < size; k++) scratch[k] = (double)CONVERT(h[k]); \
        f64_block(&acc, scratch, size, scratch);                                  \
    } while (0)

#define INT_LOOP(TYPE)                                         \
    do {                                                       \
        const TYPE *p = (const TYPE *)data;                    \
        TYPE lo = p[0], hi = p[0];                             \
        for (Py_ssize_t i = 0; i < n; i++) {                   \
            TYPE v = p[i];                                     \
            if (v < lo) lo = v;                                \
            if (v > hi) hi = v;                                \
            zeros += (v == 0);                                 \
            negs += (v < 0);                                   \
        }                                                      \
        ilo = (double)lo;                                      \
        ihi = (double)hi;                                      \
    } while (0)

static PyObject *cpu_name; /* "cpu", the device of every summary made here */

/* The positions of the fields a summary tuple holds (fields.h). ``summary_tuple`` fills
 * every declared field: the module does not import where one is left out (``fills``). */
static struct {
    Py_ssize_t shape, dtype, device, numel, min, max, mean, std, norm, nan, posinf, neginf,
        zero_frac, sat_frac, absmean, neg_frac;
} at;
static const SummaryField named[] = {
    {"shape", &at.shape}, {"dtype", &at.dtype},   {"device", &at.device},
    {"numel", &at.numel}, {"min", &at.min},       {"max", &at.max},
    {"mean", &at.mean},   {"std", &at.std},       {"norm", &at.norm},
    {"nan", &at.nan},     {"posinf", &at.posinf}, {"neginf", &at.neginf},
    {"zero_frac", &at.zero_frac}, {"sat_frac", &at.sat_frac}, {"absmean", &at.absmean},
    {"neg_frac", &at.neg_frac},
};
static Py_ssize_t length; /* summary.LENGTH */

/* Whether ``named`` holds every declared field once: 0, or -1 with an exception. */
static int fills(void) {
    enum { COUNT = sizeof named / sizeof *named };
    int seen[COUNT] = {0};
    for (size_t i = 0; i < COUNT && (Py_ssize_t)COUNT == length; i++) {
        if (*named[i].at >= COUNT || seen[*named[i].at]++) break;
        if (i + 1 == COUNT) return 0;
    }
    PyErr_Format(PyExc_SystemError,
                 "hookdbg.recorder._cstats fills %d fields of the %zd that "
                 "hookdbg/store/summary.py declares: fill the others in summary_tuple "
                 "and rebuild it (CONTRIBUTING.md)",
                 (int)COUNT, length);
    return -1;
}

/* Set item ``i`` of the new tuple ``t``; ``bad`` notes a failed allocation. */
#define PUT(t, i, value)                      \
    do {                                      \
        PyObject *value_ = (value);           \
        bad |= value_ == NULL;                \
        PyTuple_SET_ITEM(t, i, value_);       \
    } while (0)

/* stats.py's summary tuple. It holds no container but the shape (shared, and itself
 * untracked), so the garbage collector need not track it: summaries live as long as
 * their step, by the hundreds. */
static PyObject *summary_tuple(PyObject *shape, PyObject *dtype, Py_ssize_t n, double lo,
                               double hi, double mean, double std, double norm, long long nan,
                               long long posinf, long long neginf, double zero_frac,
                               double sat_frac, double absmean, double neg_frac) {
    PyObject *t = PyTuple_New(length);
    if (t == NULL) return NULL;
    int bad = 0;
    PUT(t, at.shape, Py_NewRef(shape));
    PUT(t, at.dtype, Py_NewRef(dtype));
    PUT(t, at.device, Py_NewRef(cpu_name));
    PUT(t, at.numel, PyLong_FromSsize_t(n));
    PUT(t, at.min, PyFloat_FromDouble(lo));
    PUT(t, at.max, PyFloat_FromDouble(hi));
    PUT(t, at.mean, PyFloat_FromDouble(mean));
    PUT(t, at.std, PyFloat_FromDouble(std));
    PUT(t, at.norm, PyFloat_FromDouble(norm));
    PUT(t, at.nan, PyLong_FromLongLong(nan));
    PUT(t, at.posinf, PyLong_FromLongLong(posinf));
    PUT(t, at.neginf, PyLong_FromLongLong(neginf));
    PUT(t, at.zero_frac, PyFloat_FromDouble(zero_frac));
    PUT(t, at.sat_frac, PyFloat_FromDouble(sat_frac));
    PUT(t, at.absmean, PyFloat_FromDouble(absmean));
    PUT(t, at.neg_frac, PyFloat_FromDouble(neg_frac));
    if (bad) { /* out of memory: the tuple's NULL items are skipped as it goes */
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
        int64_t zeros = 0, negs = 0;
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
                             (double)zeros / (double)n, NAN, NAN, (double)negs / (double)n);
    }
    if (kind > BF16) {
        PyErr_SetString(PyExc_ValueError, "summary: unknown element kind");
        return NULL;
    }

    Acc acc;
    memset(&acc, 0, sizeof acc);
    double scratch[SCRATCH];
    if (n >= 32768) released = PyEval_SaveThread();
    Py_ssize_t step = kind == F32 || kind == F64 ? BLOCK : SCRATCH;
    for (Py_ssize_t at = 0; at < n; at += step) {
        Py_ssize_t size = n - at < step ? n - at : step;
        switch (kind) {
            case F32: f32_block(&acc, (const float *)data + at, size, scratch); break;
            case F64: f64_block(&acc, (const double *)data + at, size, scratch); break;
            case F16: WIDEN(from_f16); break;
            default: WIDEN(from_bf16); break;
        }
    }
    if (released) PyEval_RestoreThread(released);

    double lo = NAN, hi = NAN, mean = NAN, std = NAN, norm = NAN, sat = NAN, absmean = NAN;
    if (acc.finite > 0) {
        double m = (double)acc.finite;
        lo = acc.lo;
        hi = acc.hi;
        mean = acc.mean + acc.mean_lo;
        std = lo == hi ? 0.0 : sqrt(acc.m2 / m); /* the population std: ddof = 0 */
        norm = sqrt(acc.m2 + m * mean * mean);  /* the sum of squares: M2 + n * mean^2 */
        /* a constant tensor's values are at both ends: counted once */
        sat = (double)(lo == hi ? acc.at_lo : acc.at_lo + acc.at_hi) / (double)n;
        absmean = acc.abs / m;
    }
    return summary_tuple(shape, dtype, n, lo, hi, mean, std, norm, (long long)acc.nan,
                         (long long)acc.posinf, (long long)acc.neginf,
                         (double)acc.zeros / (double)n, sat, absmean,
                         (double)(acc.negs + acc.neginf) / (double)n);
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
    if (summary_fields(named, sizeof named / sizeof *named, &length) < 0 || fills() < 0)
        return NULL;
    return PyModule_Create(&module);
}
