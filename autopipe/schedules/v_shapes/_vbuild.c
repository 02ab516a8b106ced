/* V-Half / V-Min building in C: v_block.build's steps (autopipe/schedules/v_shapes/v_block.py is
 * the Python twin and documents them; the same integer operations in the same order, so the
 * same lists). Built at install by setup.py (optional: without a compiler v_block runs its Python
 * steps; autopipe/native.py loads it and switches it off). The buffers' sizes are checked here
 * (sized: ../../_native.h), their dtypes by v_block.py.
 *
 * Slots: (S, 6, m) int64, per device d at d * 6m: its F down, F up, B up, B down slots (m each,
 * micro-batch order), then its W list: one list of 2m (a W per B of either chunk, in B order)
 * while reordering, or the up-leg and the down-leg Ws (m each) at the end. A pass's index in
 * this array is its flat id. */

#define NATIVE_NAME "_vbuild"
#include "_native.h"
#include <stdlib.h>
#include <string.h>

/* build's work arrays, kept between calls (the GIL is held throughout; as _simcore.c keeps its
 * order table): fresh pages for every build cost more than the build itself (2-3x at 64
 * devices). Each array has its own entry; one only grows. */
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
        PyErr_SetString(PyExc_ValueError, "_vbuild.build: a slot past the scratch table");
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
                PyErr_SetString(PyExc_ValueError, "_vbuild.build: a slot past its device's last");
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
                PyErr_SetString(PyExc_ValueError, "_vbuild.build: a W before its B");
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

/* build(pattern, S, m, out) -> None
 *
 * pattern: (S, 4) int64, per device micro-batch 0's slots of F down, F up, B up, B down;
 * out: (S, 6, m) int64, written with v_block.build's slots: per device its F down, F up, B up,
 * B down, up-leg W and down-leg W slots, each in micro-batch order. */
static PyObject *
vb_build(PyObject *self, PyObject *args)
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
            PyErr_SetString(PyExc_ValueError, "_vbuild.build: a pattern slot out of range");
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
        PyErr_SetString(PyExc_ValueError, "_vbuild.build: bad sizes");
    return result;
}

static PyMethodDef methods[] = {
    {"build", vb_build, METH_VARARGS, "V-Half / V-Min slots of a building block (see v_block.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_vbuild", "V-Half / V-Min building in C (see v_block.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__vbuild(void)
{
    return PyModule_Create(&module);
}
