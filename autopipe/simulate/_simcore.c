/* The simulator's two hot loops in C: autopipe/simulate/simcore.py is the pure-Python twin
 * (the reference and the fallback) and documents the arrays. A last, separate section builds
 * V-Half / V-Min (v_build; its twin is autopipe/schedules/v_shapes/v_block.py). Built at install by setup.py
 * (optional: without a compiler autopipe runs the Python loops). Buffers come through the
 * buffer protocol (numpy arrays, C-contiguous: the schedule's rows int64, per-action indices
 * int32, times and bytes float64; split is one byte per action);
 * their sizes are checked here, their dtypes by simcore.py. Floating-point operations are the
 * Python loops', in the same order, so both give the same numbers to the last bit. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int
sized(const Py_buffer *b, Py_ssize_t count, Py_ssize_t item, const char *name)
{
    if (b->len != count * item) {
        PyErr_Format(PyExc_ValueError, "_simcore: %s has %zd bytes, expected %zd", name, b->len,
                     count * item);
        return -1;
    }
    return 0;
}

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
 * held + transient while a B runs. costs is (K, n, 8) float64, per stage StageCost's fields in
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

/* ------------------------------------------------------------------------------------------
 * V-Half / V-Min building: v_block.build's steps (autopipe/schedules/v_shapes/v_block.py is the Python
 * twin and documents them; the same integer operations in the same order, so the same lists).
 *
 * Slots: (S, 6, m) int64, per device d at d * 6m: its F down, F up, B up, B down slots (m each,
 * micro-batch order), then its W list: one list of 2m (a W per B of either chunk, in B order)
 * while reordering, or the up-leg and the down-leg Ws (m each) at the end. A pass's index in
 * this array is its flat id. */

/* v_build's work arrays, kept between calls (the GIL is held throughout), as order's table is:
 * fresh pages for every build cost more than the build itself (2-3x at 64 devices). Each array
 * has its own entry; one only grows. */
enum { VB_FIRST, VB_ORDER, VB_PRED, VB_START, VB_LAST, VB_FRESH, VB_SIZE, VB_BASE, VB_ROWS,
       VB_CNT, VB_CODE, VB_HELD, VB_RISE, VB_X, VB_TAKEN, VB_BACKS, VB_NB, VB_W, VB_BUFS };
static void *vb_kept[VB_BUFS];
static size_t vb_room[VB_BUFS];

/* Entry `which`, at least `bytes` long (zeroed when `zero`); NULL when out of memory. */
static void *
vb_buf(int which, size_t bytes, int zero)
{
    if (bytes > vb_room[which]) {
        free(vb_kept[which]);
        vb_kept[which] = malloc(bytes);
        vb_room[which] = vb_kept[which] ? bytes : 0;
        if (!vb_kept[which])
            return NULL;
    }
    if (zero)
        memset(vb_kept[which], 0, bytes);
    return vb_kept[which];
}

/* v_block._with_w: each B's W in the first free slot with a B waiting (up-leg first when
 * split), the rest after the device's last pass. code: room for the device's slots. */
static int
vb_with_w(int64_t *dev, int64_t m, int split, int64_t *code, int64_t room)
{
    int64_t end = 0;
    for (int64_t i = 0; i < 4 * m; i++)
        if (dev[i] + 1 > end)
            end = dev[i] + 1;
    if (end > room) {
        PyErr_SetString(PyExc_ValueError, "_simcore.v_build: a slot past the scratch table");
        return -1;
    }
    for (int64_t i = 0; i < end; i++)
        code[i] = -1;
    for (int64_t i = 0; i < 4 * m; i++)
        code[dev[i]] = i / m;
    int64_t pend[2] = {0, 0}, nw[2] = {0, 0};
    int64_t *ws[2] = {dev + 4 * m, dev + 5 * m};
    for (int64_t i = 0; i < end; i++) {
        int64_t c = code[i];
        if (c >= 2) {
            pend[split ? c - 2 : 0]++;
        } else if (c == -1 && (pend[0] || pend[1])) {
            int w = pend[0] ? 0 : 1;
            ws[w][nw[w]++] = i;
            pend[w]--;
        }
    }
    for (int64_t j = 0; j < pend[0]; j++)
        ws[0][nw[0]++] = end + j;
    for (int64_t j = 0; j < pend[1]; j++)
        ws[1][nw[1]++] = end + pend[0] + j;
    return 0;
}

/* Largest slot in the (S, 6, m) array plus one (W lists included). */
static int64_t
vb_span(const int64_t *sl, int64_t total)
{
    int64_t top = 0;
    for (int64_t i = 0; i < total; i++)
        if (sl[i] + 1 > top)
            top = sl[i] + 1;
    return top;
}

/* v_block._squeeze on the 5-list form: each pass one slot after the latest of what it waits
 * for (the one before it in its list, the pass type before it, the neighbour's, the one before
 * it on its device), all passes of one slot at once. Rewrites sl. */
static int
vb_squeeze(int64_t *sl, int64_t S, int64_t m)
{
    const int64_t per = 6 * m, total = S * per, span = vb_span(sl, total);
    int64_t *first = vb_buf(VB_FIRST, ((size_t)span + 1) * sizeof(int64_t), 1);
    int64_t *order = vb_buf(VB_ORDER, (size_t)total * sizeof(int64_t), 0);
    int64_t *pred = vb_buf(VB_PRED, (size_t)total * 4 * sizeof(int64_t), 0);
    int64_t *start = vb_buf(VB_START, (size_t)(total + 1) * sizeof(int64_t), 0);
    int64_t *last = vb_buf(VB_LAST, (size_t)S * sizeof(int64_t), 0);
    int64_t *fresh = vb_buf(VB_FRESH, (size_t)total * sizeof(int64_t), 0);
    int ok = first && order && pred && start && last && fresh;
    if (ok) {
        for (int64_t i = 0; i < total; i++) /* counting sort by slot, stable in id */
            first[sl[i] + 1]++;
        for (int64_t v = 0; v < span; v++)
            first[v + 1] += first[v];
        for (int64_t i = 0; i < total; i++)
            order[first[sl[i]]++] = i;
        for (int64_t v = span; v > 0; v--) /* back to group starts */
            first[v] = first[v - 1];
        first[0] = 0;
        for (int64_t d = 0; d < S; d++)
            last[d] = total;
        for (int64_t d = 0; d < S; d++)
            for (int64_t t = 0; t < 5; t++) {
                int64_t near = (t == 0 || t == 2) ? d - 1 : (t == 1 || t == 3) ? d + 1 : -1;
                int64_t id = d * per + t * m, other = near * per + t * m;
                int has_near = near >= 0 && near < S;
                for (int64_t k = 0; k < (t < 4 ? m : 2 * m); k++, id++) {
                    int64_t *q = pred + 4 * id;
                    q[0] = k ? id - 1 : total;
                    q[1] = (t > 0 && t < 4) ? id - m : total;
                    q[2] = has_near ? other + k : total;
                }
            }
        for (int64_t j = 0; j < total; j++) { /* the one before on its device, by slot */
            int64_t id = order[j], d = id / per;
            pred[4 * id + 3] = last[d];
            last[d] = id;
        }
        for (int64_t i = 0; i <= total; i++)
            start[i] = -1;
        for (int64_t v = 0; v < span; v++) {
            int64_t a = first[v], b = first[v + 1];
            for (int64_t j = a; j < b; j++) {
                const int64_t *q = pred + 4 * order[j];
                int64_t top = start[q[0]];
                for (int c = 1; c < 4; c++)
                    if (start[q[c]] > top)
                        top = start[q[c]];
                fresh[j] = top + 1;
            }
            for (int64_t j = a; j < b; j++)
                start[order[j]] = fresh[j];
        }
        for (int64_t i = 0; i < total; i++)
            sl[i] = start[i];
    }
    return ok ? 0 : -1;
}

/* v_block._fits on one device's implicit state (held, rise; n slots). */
static int
vb_fits(const int64_t *held, const int64_t *rise, int64_t n, int64_t t, int64_t p, int64_t s,
        int64_t most)
{
    int64_t v = p ? rise[p - 1] : 0, lo = 0, hi = n;
    while (lo < hi) { /* bisect_right */
        int64_t mid = (lo + hi) / 2;
        if (v < rise[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    int64_t grows = lo < s ? lo : s;
    if (t <= 1) {
        for (int64_t i = p; i < s; i++)
            if (held[i] >= most)
                return 0;
        for (int64_t i = p; i < grows; i++)
            if (held[i] + 2 > most)
                return 0;
        return 1;
    }
    for (int64_t i = p; i < grows; i++)
        if (held[i] >= most)
            return 0;
    return 1;
}

/* v_block._move on one device's implicit state (held, rise, x; n slots). */
static void
vb_move(int64_t *held, int64_t *rise, int64_t *x, int64_t n, int64_t t, int64_t p, int64_t s)
{
    int64_t fe = t <= 1 ? 2 : 1, dx = t <= 1 ? 1 : 2, low = p ? -rise[p - 1] : 0;
    for (int64_t i = p; i < s; i++) {
        x[i] += dx;
        if (x[i] < low)
            low = x[i];
        held[i] += fe - rise[i] - low;
        rise[i] = -low;
    }
    for (int64_t i = s; i < n; i++) {
        if (x[i] < low)
            low = x[i];
        if (low == -rise[i])
            break;
        held[i] -= rise[i] + low;
        rise[i] = -low;
    }
}

/* v_block._reorder: one reorder step on sl (with_w: the first, Ws placed), then squeezed. */
static int
vb_reorder(int64_t *sl, int64_t S, int64_t m, int with_w, int64_t *scratch, int64_t room)
{
    const int64_t per = 6 * m, lists = with_w ? 6 * m : 4 * m;
    if (with_w)
        for (int64_t d = 0; d < S; d++)
            if (vb_with_w(sl + d * per, m, 0, scratch, room) < 0)
                return -1;
    int64_t *size = vb_buf(VB_SIZE, (size_t)S * sizeof(int64_t), 0);
    int64_t *base = vb_buf(VB_BASE, (size_t)(S + 1) * sizeof(int64_t), 0);
    const int64_t n = S * lists;
    int64_t *rows = vb_buf(VB_ROWS, (size_t)n * 4 * sizeof(int64_t), 0), *cnt = NULL, *code = NULL, *held = NULL;
    int64_t *rise = NULL, *x = NULL, *backs = NULL, *nb = NULL;
    unsigned char *taken = NULL;
    int ok = 0;
    if (!size || !base || !rows)
        goto out;
    base[0] = 0;
    for (int64_t d = 0; d < S; d++) {
        size[d] = sl[d * per + lists - 1] + 1;
        base[d + 1] = base[d] + size[d];
    }
    const int64_t all = base[S];
    code = vb_buf(VB_CODE, (size_t)all * sizeof(int64_t), 0);
    held = vb_buf(VB_HELD, (size_t)all * sizeof(int64_t), 0);
    rise = vb_buf(VB_RISE, (size_t)all * sizeof(int64_t), 0);
    x = vb_buf(VB_X, (size_t)all * sizeof(int64_t), 0);
    taken = vb_buf(VB_TAKEN, (size_t)all, 1);
    backs = vb_buf(VB_BACKS, (size_t)S * 2 * m * sizeof(int64_t), 0);
    nb = vb_buf(VB_NB, (size_t)S * sizeof(int64_t), 1);
    int64_t span = 0;
    for (int64_t d = 0; d < S; d++)
        if (size[d] > span)
            span = size[d];
    cnt = vb_buf(VB_CNT, ((size_t)span + 1) * sizeof(int64_t), 1);
    if (!code || !held || !rise || !x || !taken || !backs || !nb || !cnt)
        goto out;
    for (int64_t i = 0; i < all; i++)
        code[i] = -1;
    for (int64_t d = 0; d < S; d++)
        for (int64_t i = 0; i < lists; i++) {
            int64_t s = sl[d * per + i];
            if (s < 0 || s >= size[d]) {
                PyErr_SetString(PyExc_ValueError, "_simcore.v_build: a slot past its device's last");
                goto out;
            }
            code[base[d] + s] = i < 4 * m ? i / m : 4;
        }
    int64_t most = 0;
    for (int64_t d = 0; d < S; d++) { /* held (with_w: F to W; else implicit), rise, x */
        int64_t fw = 0, back = 0, idle = 0, low = 0, w = 0;
        for (int64_t i = base[d]; i < base[d + 1]; i++) {
            int64_t c = code[i];
            fw += (c == 0 || c == 1);
            back += c >= 2 && c <= 3;
            idle += c == -1;
            w += c == 4;
            if (with_w) {
                held[i] = fw - w;
            } else {
                x[i] = back - idle;
                if (x[i] < low)
                    low = x[i];
                rise[i] = -low;
                held[i] = fw - idle - low;
            }
            if (held[i] > most)
                most = held[i];
        }
    }
    for (int64_t d = 0; d < S; d++) /* every pass as (slot, device, type, k), in slot order */
        for (int64_t i = 0; i < lists; i++)
            cnt[sl[d * per + i] + 1]++;
    for (int64_t v = 0; v < span; v++)
        cnt[v + 1] += cnt[v];
    for (int64_t d = 0; d < S; d++)
        for (int64_t i = 0; i < lists; i++) {
            int64_t s = sl[d * per + i], *r = rows + 4 * cnt[s]++;
            r[0] = s;
            r[1] = d;
            r[2] = i < 4 * m ? i / m : 4;
            r[3] = i < 4 * m ? i % m : i - 4 * m;
        }
    int64_t turn = n, last = n - 1;
    for (int64_t j = 0; j < n; j++)
        if (rows[4 * j + 2] == 3 && rows[4 * j + 1] == 0) {
            turn = j;
            break;
        }
    for (int64_t j = turn; j < n; j++)
        if (rows[4 * j + 2] == 0 && rows[4 * j + 3] == m - 1) {
            last = j;
            break;
        }
    for (int64_t j = with_w ? turn : 0; j <= last; j++)
        taken[base[rows[4 * j + 1]] + rows[4 * j]] = 1;
    const int64_t warm = with_w ? turn : 0, moved = warm + (n - last - 1);
    for (int64_t i = 0; i < moved; i++) {
        const int64_t *r = rows + 4 * (i < warm ? i : last + 1 + i - warm);
        const int64_t s = r[0], d = r[1], t = r[2], k = r[3];
        if (with_w && i == turn) /* the kept Bs, after those of the warm-up */
            for (int64_t j = turn; j <= last; j++)
                if (rows[4 * j + 2] == 2 || rows[4 * j + 2] == 3) {
                    int64_t d2 = rows[4 * j + 1];
                    backs[d2 * 2 * m + nb[d2]++] = rows[4 * j];
                }
        int64_t *mine = sl + d * per, first = 0;
        if ((t == 0 || t == 2) && d > 0)
            first = sl[(d - 1) * per + t * m + k] + 1;
        else if ((t == 1 || t == 3) && d + 1 < S)
            first = sl[(d + 1) * per + t * m + k] + 1;
        if (t > 0 && t < 4 && mine[(t - 1) * m + k] >= first)
            first = mine[(t - 1) * m + k] + 1;
        if (k && mine[t * m + k - 1] >= first)
            first = mine[t * m + k - 1] + 1;
        if (t == 4) {
            if (k >= nb[d]) {
                PyErr_SetString(PyExc_ValueError, "_simcore.v_build: a W before its B");
                goto out;
            }
            if (backs[d * 2 * m + k] >= first)
                first = backs[d * 2 * m + k] + 1;
        }
        unsigned char *free_ = taken + base[d];
        int64_t *hd = held + base[d], to = s, p = -1;
        if (with_w) {
            if (t <= 1)
                for (int64_t j = s - 1; j >= first; j--)
                    if (hd[j] >= most) {
                        first = j + 1;
                        break;
                    }
            for (int64_t j = first; j < s; j++)
                if (!free_[j]) {
                    p = j;
                    break;
                }
            if (p >= 0) {
                to = p;
                if (t <= 1 || t == 4)
                    for (int64_t j = to; j < s; j++)
                        hd[j] += t <= 1 ? 1 : -1;
            }
        } else {
            for (int64_t j = first; j < s; j++)
                if (!free_[j]) {
                    p = j;
                    break;
                }
            while (p >= 0) {
                if (vb_fits(hd, rise + base[d], size[d], t, p, s, most)) {
                    to = p;
                    vb_move(hd, rise + base[d], x + base[d], size[d], t, p, s);
                    break;
                }
                int64_t q = -1;
                for (int64_t j = p + 1; j < s; j++)
                    if (!free_[j]) {
                        q = j;
                        break;
                    }
                p = q;
            }
        }
        mine[t < 4 ? t * m + k : 4 * m + k] = to;
        free_[to] = 1;
        if (with_w && (t == 2 || t == 3)) { /* bisect.insort (right) */
            int64_t *b = backs + d * 2 * m, lo = 0, hi = nb[d];
            while (lo < hi) {
                int64_t mid = (lo + hi) / 2;
                if (to < b[mid])
                    hi = mid;
                else
                    lo = mid + 1;
            }
            for (int64_t j = nb[d]; j > lo; j--)
                b[j] = b[j - 1];
            b[lo] = to;
            nb[d]++;
        }
    }
    ok = 1;
out:
    if (!ok) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    if (!with_w)
        for (int64_t d = 0; d < S; d++)
            if (vb_with_w(sl + d * per, m, 0, scratch, room) < 0)
                return -1;
    if (vb_squeeze(sl, S, m) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* v_build(pattern, S, m, out) -> None
 *
 * pattern: (S, 4) int64, per device micro-batch 0's slots of F down, F up, B up, B down;
 * out: (S, 6, m) int64, written with v_block.build's slots: per device its F down, F up, B up,
 * B down, up-leg W and down-leg W slots, each in micro-batch order. */
static PyObject *
sc_v_build(PyObject *self, PyObject *args)
{
    Py_buffer b_pat, b_out;
    Py_ssize_t S, m;
    PyObject *result = NULL;
    int64_t *scratch_w = NULL;
    if (!PyArg_ParseTuple(args, "y*nnw*", &b_pat, &S, &m, &b_out))
        return NULL;
    if (S < 1 || m < 1 || (int64_t)S * 6 * m > INT32_MAX || sized(&b_pat, 4 * S, 8, "pattern") ||
        sized(&b_out, 6 * S * m, 8, "out"))
        goto done;
    const int64_t *pat = b_pat.buf;
    int64_t *sl = b_out.buf, top = 0;
    for (Py_ssize_t i = 0; i < 4 * S; i++) {
        if (pat[i] < 0 || pat[i] > INT32_MAX / 8) {
            PyErr_SetString(PyExc_ValueError, "_simcore.v_build: a pattern slot out of range");
            goto done;
        }
        if (pat[i] > top)
            top = pat[i];
    }
    for (Py_ssize_t d = 0; d < S; d++)
        for (Py_ssize_t t = 0; t < 4; t++)
            for (Py_ssize_t k = 0; k < m; k++)
                sl[(d * 6 + t) * m + k] = pat[4 * d + t] + 6 * k;
    /* a pass never moves later than where the repeat put it (the reorder and the squeeze only
     * move passes earlier): the scratch covers every slot of an F or a B */
    const int64_t room = top + 6 * (int64_t)m + 1;
    scratch_w = vb_buf(VB_W, (size_t)room * sizeof(int64_t), 0);
    if (!scratch_w) {
        PyErr_NoMemory();
        goto done;
    }
    if (vb_reorder(sl, S, m, 1, scratch_w, room) < 0 || vb_reorder(sl, S, m, 0, scratch_w, room) < 0)
        goto done;
    for (Py_ssize_t d = 0; d < S; d++)
        if (vb_with_w(sl + d * 6 * m, m, 1, scratch_w, room) < 0)
            goto done;
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&b_pat);
    PyBuffer_Release(&b_out);
    if (result == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "_simcore.v_build: bad sizes");
    return result;
}

static PyMethodDef methods[] = {
    {"order", sc_order, METH_VARARGS, "Dependency order of the ranks' lists (see simcore.py)."},
    {"run", sc_run, METH_VARARGS, "Start and end of every action, busy time, iteration time."},
    {"memory", sc_memory, METH_VARARGS, "Peak bytes per rank."},
    {"v_build", sc_v_build, METH_VARARGS, "V-Half / V-Min slots of a building block (see v_block.py)."},
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
