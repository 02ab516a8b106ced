/* The simulator's two hot loops in C: autopipe/simulate/simcore.py is the pure-Python twin
 * (the reference and the fallback) and documents the arrays. Built at install by setup.py
 * (optional: without a compiler autopipe runs the Python loops; autopipe/native.py loads it and
 * switches it off). Buffers come through the buffer protocol (numpy arrays, C-contiguous: the
 * schedule's rows int64, per-action indices int32, times and bytes float64; split is one byte
 * per action); their sizes are checked here (sized: ../_native.h), their dtypes by simcore.py.
 * Floating-point operations are the Python loops', in the same order, so both give the same
 * numbers to the last bit. */

#define NATIVE_NAME "_simcore"
#include "_native.h"
#include <stdlib.h>

/* offsets (sized ranks + 1) start at 0 and never decrease; rows hold 3 * offsets[ranks] int64 */
static int
laid_out(const Py_buffer *offsets, const Py_buffer *rows, Py_ssize_t ranks)
{
    const int64_t *off = offsets->buf;
    if (off[0] != 0 || sized(rows, 3 * (Py_ssize_t)off[ranks], 8, "rows"))
        return -1;
    for (Py_ssize_t r = 0; r < ranks; r++)
        if (off[r + 1] < off[r]) {
            PyErr_SetString(PyExc_ValueError, "_simcore: offsets must not decrease");
            return -1;
        }
    return 0;
}

/* order(rows, offsets, home, ranks, n, m, has_w, rank, stage, kind, dep, hop, pos, dur, split)
 *   -> placed
 *
 * rows: (N, 3) int64 (stage, kind, micro-batch) of every rank's list, rank after rank;
 * offsets: (ranks + 1) int64, rank r's rows are offsets[r] .. offsets[r+1]-1; home: (n) int64.
 * Writes, per action in a dependency order (each rank's list in order, each action once its
 * dependencies are placed, ranks visited round-robin): rank, stage, kind, dep (2 per action:
 * positions of its dependencies, -1 none), hop (2 per action: the comm_s index that dependency
 * pays, -1 none), dur (stage * 8 + 0 F, 1 B, 2 B input-grad, 3 W: the column of its time in
 * the planner's cost table) and split (one byte: a B with a W); and pos[i] = the position of
 * rows[i]. Returns the number of actions placed
 * (fewer than N: deadlock), or -1 when a row is out of range, misplaced or repeated.
 * pos_of_key[(stage * 3 + kind) * m + micro-batch]: -1 absent, -2 not placed yet, else the
 * position. */
/* order's table of positions by key, kept between calls (the GIL is held throughout): fresh
 * pages for every schedule cost more than the loop itself. */
static int64_t *scratch = NULL;
static int64_t scratch_keys = 0;

static PyObject *
sc_order(PyObject *self, PyObject *args)
{
    Py_buffer rows, offsets, home, o_rank, o_stage, o_kind, o_dep, o_hop, o_pos, o_dur, o_split;
    Py_ssize_t ranks, n, m;
    int has_w;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*nnnpw*w*w*w*w*w*w*w*", &rows, &offsets, &home, &ranks, &n,
                          &m, &has_w, &o_rank, &o_stage, &o_kind, &o_dep, &o_hop, &o_pos, &o_dur,
                          &o_split))
        return NULL;
    int64_t *pos_of_key = NULL, *ptr = NULL;
    if (ranks < 1 || n < 1 || m < 1 || sized(&offsets, ranks + 1, 8, "offsets") ||
        sized(&home, n, 8, "home"))
        goto done;
    const int64_t *off = offsets.buf, *hm = home.buf, *rw = rows.buf;
    Py_ssize_t total = (Py_ssize_t)off[ranks];
    if (laid_out(&offsets, &rows, ranks) || sized(&o_rank, total, 4, "rank") ||
        sized(&o_stage, total, 4, "stage") || sized(&o_kind, total, 4, "kind") ||
        sized(&o_dep, 2 * total, 4, "dep") || sized(&o_hop, 2 * total, 4, "hop") ||
        sized(&o_pos, total, 4, "pos") || sized(&o_dur, total, 4, "dur") ||
        sized(&o_split, total, 1, "split"))
        goto done;
    if (total > INT32_MAX / 2 || (int64_t)n * 8 > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_simcore.order: over 2**30 actions");
        goto done;
    }
    int32_t *rank = o_rank.buf, *stage = o_stage.buf, *kind = o_kind.buf;
    int32_t *dep = o_dep.buf, *hop = o_hop.buf, *pos = o_pos.buf, *dur = o_dur.buf;
    unsigned char *split = o_split.buf;
    const int64_t per_stage = 3 * (int64_t)m, keys = per_stage * (int64_t)n;
    if (keys > scratch_keys) {
        free(scratch);
        scratch = malloc(sizeof(int64_t) * (size_t)keys);
        scratch_keys = scratch == NULL ? 0 : keys;
    }
    pos_of_key = scratch;
    ptr = malloc(sizeof(int64_t) * (size_t)ranks);
    if (pos_of_key == NULL || ptr == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int64_t k = 0; k < keys; k++)
        pos_of_key[k] = -1;
    for (Py_ssize_t r = 0; r < ranks; r++) {
        ptr[r] = off[r];
        for (int64_t i = off[r]; i < off[r + 1]; i++) {
            int64_t s = rw[3 * i], k = rw[3 * i + 1], mb = rw[3 * i + 2];
            if (s < 0 || s >= n || k < 0 || k > (has_w ? 2 : 1) || mb < 0 || mb >= m ||
                hm[s] != r || pos_of_key[(s * 3 + k) * m + mb] != -1) {
                result = PyLong_FromLong(-1);
                goto done;
            }
            pos_of_key[(s * 3 + k) * m + mb] = -2; /* present, not placed yet */
        }
    }
    int64_t placed = 0;
    int progress = 1;
    while (progress) {
        progress = 0;
        for (Py_ssize_t r = 0; r < ranks; r++) {
            int64_t i = ptr[r], end = off[r + 1];
            while (i < end) {
                int64_t s = rw[3 * i], k = rw[3 * i + 1];
                int64_t key = (s * 3 + k) * m + rw[3 * i + 2];
                int64_t d0 = -1, d1 = -1, h0 = -1, h1 = -1;
                if (k == 0) { /* F(j) needs F(j-1) */
                    if (s > 0) {
                        d0 = pos_of_key[key - per_stage];
                        if (d0 < 0)
                            break;
                        h0 = hm[s - 1] != hm[s] ? s - 1 : -1;
                    }
                } else { /* B(j) needs F(j) and B(j+1); W(j) needs B(j) */
                    d0 = pos_of_key[key - m];
                    if (d0 < 0)
                        break;
                    if (k == 1 && s + 1 < n) {
                        d1 = pos_of_key[key + per_stage];
                        if (d1 < 0)
                            break;
                        h1 = hm[s + 1] != hm[s] ? s : -1;
                    }
                }
                pos_of_key[key] = placed;
                rank[placed] = (int32_t)r;
                stage[placed] = (int32_t)s;
                kind[placed] = (int32_t)k;
                dep[2 * placed] = (int32_t)d0;
                dep[2 * placed + 1] = (int32_t)d1;
                hop[2 * placed] = (int32_t)h0;
                hop[2 * placed + 1] = (int32_t)h1;
                pos[i] = (int32_t)placed;
                dur[placed] = (int32_t)(s * 8 + (k == 0 ? 0 : k == 2 ? 3 : has_w ? 2 : 1));
                split[placed] = k == 1 && has_w;
                placed++;
                i++;
                progress = 1;
            }
            ptr[r] = i;
        }
    }
    result = PyLong_FromLongLong(placed);
done:
    free(ptr);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&home);
    PyBuffer_Release(&o_rank);
    PyBuffer_Release(&o_stage);
    PyBuffer_Release(&o_kind);
    PyBuffer_Release(&o_dep);
    PyBuffer_Release(&o_hop);
    PyBuffer_Release(&o_pos);
    PyBuffer_Release(&o_dur);
    PyBuffer_Release(&o_split);
    if (result == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "_simcore.order: bad sizes");
    return result;
}

/* run(rank, dur, dep, hop, durations, comm, ranks, candidates, start, end, busy, iteration)
 *
 * For each of K candidates: durations (K, D) float64 indexed by dur[i]; comm (K, C) float64
 * indexed by hop. Each action starts when its rank is free and its dependencies have ended
 * (plus the hop's comm) and runs its duration. Writes busy (K, ranks) and iteration (K) (the
 * latest end); start and end (N) hold the last candidate's times. */
static PyObject *
sc_run(PyObject *self, PyObject *args)
{
    Py_buffer b_rank, b_dur, b_dep, b_hop, b_durs, b_comm, b_start, b_end, b_busy, b_iter;
    Py_ssize_t ranks, cands;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*nnw*w*w*w*", &b_rank, &b_dur, &b_dep, &b_hop, &b_durs,
                          &b_comm, &ranks, &cands, &b_start, &b_end, &b_busy, &b_iter))
        return NULL;
    double *free_at = NULL;
    Py_ssize_t total = b_rank.len / 4;
    if (ranks < 1 || cands < 1 || total < 1 || b_durs.len % (8 * cands) || b_comm.len % (8 * cands) ||
        sized(&b_rank, total, 4, "rank") || sized(&b_dur, total, 4, "dur") ||
        sized(&b_dep, 2 * total, 4, "dep") || sized(&b_hop, 2 * total, 4, "hop") ||
        sized(&b_start, total, 8, "start") || sized(&b_end, total, 8, "end") ||
        sized(&b_busy, cands * ranks, 8, "busy") || sized(&b_iter, cands, 8, "iteration"))
        goto done;
    const int32_t *rank = b_rank.buf, *dur = b_dur.buf, *dep = b_dep.buf, *hop = b_hop.buf;
    const Py_ssize_t nd = b_durs.len / (8 * cands), nc = b_comm.len / (8 * cands);
    for (Py_ssize_t i = 0; i < total; i++)
        if (rank[i] < 0 || rank[i] >= ranks || dur[i] < 0 || dur[i] >= nd || dep[2 * i] >= i ||
            dep[2 * i + 1] >= i || hop[2 * i] >= nc || hop[2 * i + 1] >= nc) {
            PyErr_SetString(PyExc_ValueError, "_simcore.run: an index is out of range");
            goto done;
        }
    free_at = malloc(sizeof(double) * (size_t)ranks);
    if (free_at == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    double *start = b_start.buf, *end = b_end.buf;
    for (Py_ssize_t c = 0; c < cands; c++) {
        const double *durs = (const double *)b_durs.buf + c * nd;
        const double *comm = (const double *)b_comm.buf + c * nc;
        double *busy = (double *)b_busy.buf + c * ranks;
        for (Py_ssize_t r = 0; r < ranks; r++)
            free_at[r] = busy[r] = 0.0;
        double latest = 0.0;
        for (Py_ssize_t i = 0; i < total; i++) {
            int32_t r = rank[i];
            double st = free_at[r];
            for (int q = 0; q < 2; q++) {
                int32_t d = dep[2 * i + q];
                if (d < 0)
                    continue;
                int32_t h = hop[2 * i + q];
                double t = h < 0 ? end[d] : end[d] + comm[h];
                if (t > st)
                    st = t;
            }
            double du = durs[dur[i]];
            double e = st + du;
            start[i] = st;
            end[i] = e;
            free_at[r] = e;
            busy[r] += du;
            if (i == 0 || e > latest)
                latest = e;
        }
        ((double *)b_iter.buf)[c] = latest;
    }
    result = Py_NewRef(Py_None);
done:
    free(free_at);
    PyBuffer_Release(&b_rank);
    PyBuffer_Release(&b_dur);
    PyBuffer_Release(&b_dep);
    PyBuffer_Release(&b_hop);
    PyBuffer_Release(&b_durs);
    PyBuffer_Release(&b_comm);
    PyBuffer_Release(&b_start);
    PyBuffer_Release(&b_end);
    PyBuffer_Release(&b_busy);
    PyBuffer_Release(&b_iter);
    if (result == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "_simcore.run: bad sizes");
    return result;
}

/* memory(rows, offsets, home, has_w, costs, ranks, candidates, peak)
 *
 * Per candidate and rank, in the rank's own order (rows, offsets as for order): held bytes start
 * at the static bytes of the rank's stages (home) and move with each action, F + activation,
 * B - (activation - weight_grad if the backward is split), W - weight_grad; the peak also sees
 * held + transient while a B or a W runs. costs is (K, n, 8) float64, per stage StageCost's fields in
 * order (forward, backward, backward_input, backward_weight, activation, weight_grad, transient,
 * static); peak is (K, ranks). */
static PyObject *
sc_memory(PyObject *self, PyObject *args)
{
    Py_buffer rows, offsets, home, b_costs, b_peak;
    Py_ssize_t ranks, cands;
    int has_w;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*py*nnw*", &rows, &offsets, &home, &has_w, &b_costs, &ranks,
                          &cands, &b_peak))
        return NULL;
    Py_ssize_t n = home.len / 8;
    if (ranks < 1 || cands < 1 || n < 1 || sized(&offsets, ranks + 1, 8, "offsets") ||
        sized(&b_costs, cands * n * 8, 8, "costs") || sized(&b_peak, cands * ranks, 8, "peak"))
        goto done;
    const int64_t *off = offsets.buf, *hm = home.buf, *rw = rows.buf;
    if (laid_out(&offsets, &rows, ranks))
        goto done;
    for (int64_t i = 0; i < off[ranks]; i++)
        if (rw[3 * i] < 0 || rw[3 * i] >= n) {
            PyErr_SetString(PyExc_ValueError, "_simcore.memory: a stage is out of range");
            goto done;
        }
    for (Py_ssize_t c = 0; c < cands; c++) {
        const double *x = (const double *)b_costs.buf + c * n * 8;
        double *peak = (double *)b_peak.buf + c * ranks;
        for (Py_ssize_t r = 0; r < ranks; r++) {
            double held = 0.0;
            for (Py_ssize_t j = 0; j < n; j++)
                if (hm[j] == r)
                    held += x[8 * j + 7];
            double top = held;
            for (int64_t i = off[r]; i < off[r + 1]; i++) {
                const double *st = x + 8 * rw[3 * i];
                int64_t k = rw[3 * i + 1];
                if (k == 0) {
                    held += st[4];
                } else if (k == 1) {
                    if (held + st[6] > top)
                        top = held + st[6];
                    held -= st[4] - (has_w ? st[5] : 0.0);
                } else {
                    if (held + st[6] > top)
                        top = held + st[6];
                    held -= st[5];
                }
                if (held > top)
                    top = held;
            }
            peak[r] = top;
        }
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&rows);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&home);
    PyBuffer_Release(&b_costs);
    PyBuffer_Release(&b_peak);
    if (result == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "_simcore.memory: bad sizes");
    return result;
}

static PyMethodDef methods[] = {
    {"order", sc_order, METH_VARARGS, "Dependency order of the ranks' lists (see simcore.py)."},
    {"run", sc_run, METH_VARARGS, "Start and end of every action, busy time, iteration time."},
    {"memory", sc_memory, METH_VARARGS, "Peak bytes per rank."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_simcore", "The simulator's hot loops in C (see simcore.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__simcore(void)
{
    return PyModule_Create(&module);
}
