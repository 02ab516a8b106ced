/* The bisection solver's greedy probe and its bisection loop in C: autopipe/partition/greedy.py is
 * the pure-Python twin (_Probes.greedy, _Probes._found, _bisect: the reference and the
 * fallback) and documents the method. Built at install by setup.py (optional: without a
 * compiler autopipe runs the Python loops; autopipe/native.py loads it, and AUTOPIPE_NO_SIMCORE=1
 * forces the Python loops).
 *
 * Buffers come through the buffer protocol (C-contiguous numpy arrays: prefix sums, comm and
 * the per-stage in-flight counts and memory caps float64, in_bytes keys int64); their sizes
 * are checked here (sized: ../_native.h), their dtypes by greedy.py. The Python twin reads each
 * stage's memory reach from tables (all starts at once, vectorised); here it is found for the
 * one start a probe needs, by binary search on the same predicate. Each predicate is monotone in the end (prefix
 * sums of non-negative values: a difference with the start fixed, a sum of such, a product
 * with k >= 0), so the furthest end is one number however it is searched for; the times, the
 * largest piece and the bisection's midpoints are the twin's operations in the same order.
 * So both give the same partition to the last bit (tested). Compiled without contraction of
 * a * b + c into one fused instruction (setup.py), which would round differently. */

#define NATIVE_NAME "_probe"
#include "_native.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const double *pt, *pr, *comm, *ps, *pa, *psa, *k, *cap; /* k, cap: per stage */
    const int64_t *keys;                                     /* in_bytes (InBytes) */
    const double *cum, *row_base;
    Py_ssize_t n, S, nkeys;
    int plain_ok, rc_ok;
} Problem;

/* The largest e in [i, n] with ps[e] + k pa[e] - (ps[i] + k pa[i]) <= cap (i when none). */
static Py_ssize_t
plain_memory(const Problem *p, Py_ssize_t s, Py_ssize_t i)
{
    const double k = p->k[s], cap = p->cap[s], wi = p->ps[i] + k * p->pa[i];
    Py_ssize_t lo = i, hi = p->n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo + 1) / 2;
        if ((p->ps[mid] + k * p->pa[mid]) - wi <= cap)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* numpy's searchsorted(a[0..len), x, side="right"). */
static Py_ssize_t
right_f(const double *a, Py_ssize_t len, double x)
{
    Py_ssize_t lo = 0, hi = len;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static Py_ssize_t
right_i(const int64_t *a, Py_ssize_t len, int64_t x)
{
    Py_ssize_t lo = 0, hi = len;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Recomputed: the largest e in [i, hi] with psa[e] - psa[i] + k in_bytes(i, e) <= cap, hi the
 * end where static + activations alone pass the cap (greedy.py's vectorised search). */
static Py_ssize_t
rc_memory(const Problem *p, Py_ssize_t s, Py_ssize_t i)
{
    const double k = p->k[s], cap = p->cap[s];
    const int64_t row = (int64_t)i * (int64_t)(p->n + 2);
    Py_ssize_t lo = i, hi = right_f(p->psa, p->n + 1, p->psa[i] + cap);
    hi = hi < lo ? lo : (hi > p->n ? p->n : hi);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi + 1) / 2;
        double inb = p->cum[right_i(p->keys, p->nkeys, row + mid)] - p->row_base[i];
        if ((p->psa[mid] - p->psa[i]) + k * inb <= cap)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The largest e in [i, n] with a stage [i, e) of time <= z (plus recompute time if rc). */
static Py_ssize_t
time_reach(const Problem *p, Py_ssize_t i, double z, int rc)
{
    const double *pt = p->pt, *pr = p->pr;
    Py_ssize_t lo = i, hi = p->n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo + 1) / 2;
        double t = rc ? (pt[mid] - pt[i]) + (pr[mid] - pr[i]) : pt[mid] - pt[i];
        if (t <= z)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* _Probes.greedy then _Probes._found: 1 with starts, recompute flags and the largest piece
 * written, 0 when the greedy gets stuck. reach: scratch, one per stage. */
static int
greedy(const Problem *p, double z, int64_t *starts, unsigned char *rc, Py_ssize_t *reach,
       double *worst_out)
{
    const Py_ssize_t n = p->n, S = p->S;
    const double *pt = p->pt, *pr = p->pr, *comm = p->comm;
    Py_ssize_t i = 0;
    for (Py_ssize_t s = 0; s < S; s++) {
        Py_ssize_t e = i;
        int bound = 1;
        starts[s] = i;
        if (p->plain_ok) { /* min(memory reach, time reach), the time reach found only if below */
            e = reach[s] = plain_memory(p, s, i);
            if (pt[e] - pt[i] <= z)
                bound = e < n && pt[e + 1] - pt[i] <= z; /* memory binds */
            else {
                e = time_reach(p, i, z, 0);
                bound = 0;
            }
        }
        if (p->rc_ok && bound) { /* (else no recomputed stage reaches further) */
            Py_ssize_t r = rc_memory(p, s, i);
            if (!((pt[r] - pt[i]) + (pr[r] - pr[i]) <= z))
                r = time_reach(p, i, z, 1);
            e = e > r ? e : r;
        }
        if (s == S - 1) {
            if (e < n)
                return 0;
            break;
        }
        Py_ssize_t j = e < n - (S - 1 - s) ? e : n - (S - 1 - s);
        while (j > i && comm[j] > z) /* the furthest allowed cut */
            j--;
        if (j <= i)
            return 0;
        i = j;
    }
    double worst = 0.0;
    for (Py_ssize_t s = 0; s < S; s++) {
        Py_ssize_t a = starts[s], b = s + 1 < S ? starts[s + 1] : n;
        int plain = p->plain_ok && b <= reach[s];
        double t = pt[b] - pt[a];
        if (!plain)
            t = t + (pr[b] - pr[a]);
        rc[s] = (unsigned char)!plain;
        double c = s < S - 1 ? comm[b] : 0.0;
        if (t > worst)
            worst = t;
        if (c > worst)
            worst = c;
    }
    *worst_out = worst;
    return 1;
}

/* solve(pt, pr, comm, ps, pa, psa, keys, cum, row_base, k, cap, plain_ok, rc_ok, lower,
 *       tolerance, starts, rc) -> float | None
 *
 * greedy(inf), then _bisect(greedy, lower, that, tolerance): the best partition's largest
 * piece, its starts (S int64) and recompute flags (S bytes) written; None when greedy(inf)
 * gets stuck (starts and rc then mean nothing). pt .. psa: n + 1 each; keys: K, cum: K + 1, row_base: n + 1
 * (unused, may be empty, when rc_ok is false); k, cap: S. */
static PyObject *
pr_solve(PyObject *self, PyObject *args)
{
    Py_buffer b[13];
    int plain_ok, rc_ok;
    double lo, tolerance;
    PyObject *result = NULL;
    int64_t *cur = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*y*ppddw*w*", &b[0], &b[1], &b[2], &b[3],
                          &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &plain_ok, &rc_ok,
                          &lo, &tolerance, &b[11], &b[12]))
        return NULL;
    Problem p = {b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf, b[5].buf, b[9].buf, b[10].buf,
                 b[6].buf, b[7].buf, b[8].buf, b[0].len / 8 - 1, b[9].len / 8, b[6].len / 8,
                 plain_ok, rc_ok};
    const Py_ssize_t n = p.n, S = p.S;
    if (n < 1 || S < 1 || S > n) {
        PyErr_SetString(PyExc_ValueError, "_probe: need 1 <= stages <= blocks");
        goto done;
    }
    const char *names[] = {"pt", "pr", "comm", "ps", "pa", "psa"};
    for (int a = 0; a < 6; a++)
        if (sized(&b[a], n + 1, 8, names[a]))
            goto done;
    if (sized(&b[10], S, 8, "cap") || sized(&b[11], S, 8, "starts") || sized(&b[12], S, 1, "rc") ||
        (rc_ok && (sized(&b[7], p.nkeys + 1, 8, "cum") || sized(&b[8], n + 1, 8, "row_base"))))
        goto done;
    /* cur: the probe's starts; its reach; then the best's recompute flags and the probe's */
    cur = PyMem_Malloc((size_t)S * (2 * sizeof(int64_t) + 2));
    if (cur == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t *reach = (Py_ssize_t *)(cur + S);
    unsigned char *cur_rc = (unsigned char *)(cur + 2 * S);
    int64_t *best = b[11].buf;
    unsigned char *best_rc = b[12].buf;
    double hi;
    if (!greedy(&p, INFINITY, best, best_rc, reach, &hi)) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto done;
    }
    while (hi - lo > tolerance * hi) { /* _bisect */
        double mid = hi > 2 * lo && 2 * lo > 0 ? lo * sqrt(hi / lo)
                     : hi - lo > 1e-12 * hi   ? lo + (hi - lo) / 2
                                              : nextafter(hi, -INFINITY);
        if (!(lo < mid && mid < hi))
            break;
        double worst;
        if (greedy(&p, mid, cur, cur_rc, reach, &worst)) {
            memcpy(best, cur, (size_t)S * sizeof(int64_t));
            memcpy(best_rc, cur_rc, (size_t)S);
            hi = worst;
        } else
            lo = mid;
    }
    result = PyFloat_FromDouble(hi);
done:
    PyMem_Free(cur);
    for (int a = 0; a < 13; a++)
        PyBuffer_Release(&b[a]);
    return result;
}

/* reach(ps, pa, psa, keys, cum, row_base, k, cap, rc, out) -> None
 *
 * One kind's memory reach from every start (greedy.py's tables): out[i] (n + 1 int64) is
 * plain_memory, or rc_memory when rc, of a stage with in-flight count k and memory cap cap. */
static PyObject *
pr_reach(PyObject *self, PyObject *args)
{
    Py_buffer b[7];
    double k, cap;
    int rc;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*ddpw*", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &k,
                          &cap, &rc, &b[6]))
        return NULL;
    Problem p = {NULL, NULL, NULL, b[0].buf, b[1].buf, b[2].buf, &k, &cap, b[3].buf, b[4].buf,
                 b[5].buf, b[0].len / 8 - 1, 1, b[3].len / 8, 1, rc};
    const Py_ssize_t n = p.n;
    if (n < 1 || sized(&b[1], n + 1, 8, "pa") || sized(&b[2], n + 1, 8, "psa") ||
        sized(&b[6], n + 1, 8, "out") ||
        (rc && (sized(&b[4], p.nkeys + 1, 8, "cum") || sized(&b[5], n + 1, 8, "row_base"))))
        goto done;
    int64_t *out = b[6].buf;
    for (Py_ssize_t i = 0; i <= n; i++)
        out[i] = rc ? rc_memory(&p, 0, i) : plain_memory(&p, 0, i);
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (int a = 0; a < 7; a++)
        PyBuffer_Release(&b[a]);
    return result;
}

static PyMethodDef methods[] = {
    {"solve", pr_solve, METH_VARARGS, "Greedy probe + bisection (see greedy.py)."},
    {"reach", pr_reach, METH_VARARGS, "One kind's memory reach from every start (see greedy.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_probe", "The bisection solver's greedy probe in C (see greedy.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__probe(void)
{
    return PyModule_Create(&module);
}
