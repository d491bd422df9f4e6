/* onnxruntime 1.19's memory plan for one order of one graph, on integer arrays.

   The same three steps as the Python planner (onnx_remat/ortsim/planner.py, whose docstring says
   what onnxruntime does and where): the reuse walk, the release plan and the memory pattern, step
   for step, with tensors and nodes numbered by onnx_remat/ortsim/plan_arrays.py. The Python planner
   is the reference: tests/ortsim/test_plan_arrays.py compares every field of both plans.

   Why C: a plan is one sequential walk over every input and output of every node, and the memory
   schedule plans several orders of a 10^5-node graph per command (0.65 s each in Python, most of
   it dictionary lookups); here it is a few milliseconds. Only the buffer protocol is used (no numpy
   C API): the arrays are made, typed and sized by plan_arrays.py, which checks them first.

   walk(...) -> (planned_once, n_planned, n_unknown, n_dynamic, planned_peak, peak_live,
                 peak_live_step, block_peak_step)
   planned_once is 0 where some tensor is planned twice or read before it is planned (an order or a
   graph onnxruntime would reject): the outputs are then not the plan, and the caller plans it in
   Python, which handles that case. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { K_NONE = 0, K_CALLER = 1, K_OUTPUT = 3, K_ALIAS = 4, K_INPLACE = 5, K_REUSE = 6, K_ALLOCATE = 7 };

typedef struct {
    int32_t *data;
    Py_ssize_t len, cap;
} Stack;

static int stack_push(Stack *s, int32_t v) {
    if (s->len == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 8;
        int32_t *d = (int32_t *)realloc(s->data, (size_t)cap * sizeof(int32_t));
        if (!d) return -1;
        s->data = d;
        s->cap = cap;
    }
    s->data[s->len++] = v;
    return 0;
}

/* The best-fit block (planner._Block): live blocks by offset, free gaps by (size, offset). */
typedef struct {
    int64_t *off, *osz; /* live blocks, sorted by offset */
    Py_ssize_t n;
    int64_t *gsz, *goff; /* gaps, sorted by (size, offset) */
    Py_ssize_t ng;
    int64_t buffer_size, live;
} Block;

/* first i with off[i] >= x (bisect_left) */
static Py_ssize_t off_left(const Block *b, int64_t x) {
    Py_ssize_t lo = 0, hi = b->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (b->off[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* first i with off[i] > x (bisect_right: insort's place) */
static Py_ssize_t off_right(const Block *b, int64_t x) {
    Py_ssize_t lo = 0, hi = b->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < b->off[mid]) hi = mid; else lo = mid + 1;
    }
    return lo;
}

static int pair_less(int64_t s1, int64_t o1, int64_t s2, int64_t o2) {
    return s1 < s2 || (s1 == s2 && o1 < o2);
}

/* first i with gap[i] >= (s, o) */
static Py_ssize_t gap_left(const Block *b, int64_t s, int64_t o) {
    Py_ssize_t lo = 0, hi = b->ng;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (pair_less(b->gsz[mid], b->goff[mid], s, o)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* first i with gap[i] > (s, o) */
static Py_ssize_t gap_right(const Block *b, int64_t s, int64_t o) {
    Py_ssize_t lo = 0, hi = b->ng;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (pair_less(s, o, b->gsz[mid], b->goff[mid])) hi = mid; else lo = mid + 1;
    }
    return lo;
}

static void gap_insert(Block *b, int64_t s, int64_t o) {
    Py_ssize_t k = gap_right(b, s, o);
    memmove(b->gsz + k + 1, b->gsz + k, (size_t)(b->ng - k) * sizeof(int64_t));
    memmove(b->goff + k + 1, b->goff + k, (size_t)(b->ng - k) * sizeof(int64_t));
    b->gsz[k] = s;
    b->goff[k] = o;
    b->ng++;
}

static void gap_delete(Block *b, Py_ssize_t k) {
    memmove(b->gsz + k, b->gsz + k + 1, (size_t)(b->ng - k - 1) * sizeof(int64_t));
    memmove(b->goff + k, b->goff + k + 1, (size_t)(b->ng - k - 1) * sizeof(int64_t));
    b->ng--;
}

static void gap_drop(Block *b, int64_t s, int64_t o) {
    Py_ssize_t k = gap_left(b, s, o);
    if (k < b->ng && b->gsz[k] == s && b->goff[k] == o) gap_delete(b, k);
}

static int64_t block_allocate(Block *b, int64_t size) {
    int64_t end = b->n ? b->off[b->n - 1] + b->osz[b->n - 1] : 0;
    Py_ssize_t k = gap_left(b, size, -1);
    int64_t offset;
    int64_t tail = b->buffer_size - end;
    if (k < b->ng && !(tail >= size && tail - size < b->gsz[k] - size)) {
        int64_t gs = b->gsz[k], go = b->goff[k];
        gap_delete(b, k);
        if (gs > size) gap_insert(b, gs - size, go + size);
        offset = go;
    } else {
        offset = end;
    }
    Py_ssize_t i = off_right(b, offset);
    memmove(b->off + i + 1, b->off + i, (size_t)(b->n - i) * sizeof(int64_t));
    memmove(b->osz + i + 1, b->osz + i, (size_t)(b->n - i) * sizeof(int64_t));
    b->off[i] = offset;
    b->osz[i] = size;
    b->n++;
    if (offset + size > b->buffer_size) b->buffer_size = offset + size;
    b->live += size;
    return offset;
}

static void block_free(Block *b, int64_t offset) {
    Py_ssize_t i = off_left(b, offset);
    int64_t size = b->osz[i];
    b->live -= size;
    memmove(b->off + i, b->off + i + 1, (size_t)(b->n - i - 1) * sizeof(int64_t));
    memmove(b->osz + i, b->osz + i + 1, (size_t)(b->n - i - 1) * sizeof(int64_t));
    b->n--;
    int64_t prev_end = 0;
    if (i > 0) prev_end = b->off[i - 1] + b->osz[i - 1];
    if (prev_end < offset) gap_drop(b, offset - prev_end, prev_end);
    if (i < b->n) {
        int64_t nxt = b->off[i];
        if (nxt > offset + size) gap_drop(b, nxt - offset - size, offset + size);
        gap_insert(b, nxt - prev_end, prev_end);
    }
}

#define ALIGNMENT 256

/* The arguments, in the order plan_arrays.walk passes them. */
enum {
    A_ORDER, A_USE, A_KEY, A_REUSABLE, A_SIZE, A_DECLARED, A_IS_OUTPUT, A_CALLER,
    A_IN_PTR, A_IN_IDS, A_OUT_PTR, A_OUT_IDS, A_MAY_SHARE, A_ALIAS, A_INPL_PTR, A_INPL_POS,
    /* outputs */
    A_KIND, A_BUFFER, A_ALLOC, A_RELEASE, A_PLANNED, A_OFFSET, A_SEQ,
    A_LIVE, A_BLOCK, A_DYNAMIC, A_UNKNOWN, A_DYN_IDS,
    N_ARGS
};

static const char *const arg_names[N_ARGS] = {
    "order", "use", "key", "reusable", "size", "declared", "is_output", "caller",
    "in_ptr", "in_ids", "out_ptr", "out_ids", "may_share", "alias", "inpl_ptr", "inpl_pos",
    "kind", "buffer", "alloc_step", "release_step", "planned", "offset", "seq",
    "live_bytes", "block_bytes", "dynamic_bytes", "unknown", "dynamic",
};

static PyObject *walk(PyObject *self, PyObject *args) {
    (void)self;
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != N_ARGS) {
        PyErr_Format(PyExc_TypeError, "walk takes %d arrays", N_ARGS);
        return NULL;
    }
    Py_buffer buf[N_ARGS];
    int got = 0;
    for (; got < N_ARGS; got++) {
        int flags = got >= A_KIND ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, got), &buf[got], flags) < 0) {
            PyErr_Format(PyExc_TypeError, "walk: %s is not a contiguous array", arg_names[got]);
            break;
        }
    }
    PyObject *result = NULL;
    if (got < N_ARGS) goto release;

    const int32_t *order = (const int32_t *)buf[A_ORDER].buf;
    const Py_ssize_t steps = buf[A_ORDER].len / 4;
    const Py_ssize_t T = buf[A_USE].len / 8;
    const int64_t *use0 = (const int64_t *)buf[A_USE].buf;
    const int32_t *key = (const int32_t *)buf[A_KEY].buf;
    const uint8_t *reusable = (const uint8_t *)buf[A_REUSABLE].buf;
    const Py_ssize_t K = buf[A_REUSABLE].len;
    const int64_t *size = (const int64_t *)buf[A_SIZE].buf;
    const uint8_t *declared = (const uint8_t *)buf[A_DECLARED].buf;
    const uint8_t *is_output = (const uint8_t *)buf[A_IS_OUTPUT].buf;
    const uint8_t *caller = (const uint8_t *)buf[A_CALLER].buf;
    const int64_t *in_ptr = (const int64_t *)buf[A_IN_PTR].buf;
    const int32_t *in_ids = (const int32_t *)buf[A_IN_IDS].buf;
    const int64_t *out_ptr = (const int64_t *)buf[A_OUT_PTR].buf;
    const int32_t *out_ids = (const int32_t *)buf[A_OUT_IDS].buf;
    const uint8_t *may_share = (const uint8_t *)buf[A_MAY_SHARE].buf;
    const int32_t *alias = (const int32_t *)buf[A_ALIAS].buf;
    const int64_t *inpl_ptr = (const int64_t *)buf[A_INPL_PTR].buf;
    const int32_t *inpl_pos = (const int32_t *)buf[A_INPL_POS].buf;

    int8_t *kind = (int8_t *)buf[A_KIND].buf;
    int32_t *buffer = (int32_t *)buf[A_BUFFER].buf;
    int32_t *alloc_step = (int32_t *)buf[A_ALLOC].buf;
    int32_t *release_step = (int32_t *)buf[A_RELEASE].buf;
    uint8_t *planned = (uint8_t *)buf[A_PLANNED].buf;
    int64_t *offset = (int64_t *)buf[A_OFFSET].buf;
    int32_t *seq = (int32_t *)buf[A_SEQ].buf;
    int64_t *live_bytes = (int64_t *)buf[A_LIVE].buf;
    int64_t *block_bytes = (int64_t *)buf[A_BLOCK].buf;
    int64_t *dynamic_bytes = (int64_t *)buf[A_DYNAMIC].buf;
    int32_t *unknown = (int32_t *)buf[A_UNKNOWN].buf;
    int32_t *dyn_ids = (int32_t *)buf[A_DYN_IDS].buf;

    /* Work arrays: use counts (counted down), first read (position among the buffers read, -1
       none), last read step, the per-step allocation and release lists (linked, in order). */
    int64_t *use = (int64_t *)malloc((size_t)(T ? T : 1) * sizeof(int64_t));
    int32_t *first_read = (int32_t *)malloc((size_t)(T ? T : 1) * sizeof(int32_t));
    int32_t *read_order = (int32_t *)malloc((size_t)(T ? T : 1) * sizeof(int32_t));
    int32_t *last_read = (int32_t *)malloc((size_t)(T ? T : 1) * sizeof(int32_t));
    int32_t *next_alloc = (int32_t *)malloc((size_t)(T ? T : 1) * sizeof(int32_t));
    int32_t *next_release = (int32_t *)malloc((size_t)(T ? T : 1) * sizeof(int32_t));
    int32_t *alloc_head = (int32_t *)malloc((size_t)(steps ? steps : 1) * sizeof(int32_t));
    int32_t *alloc_tail = (int32_t *)malloc((size_t)(steps ? steps : 1) * sizeof(int32_t));
    int32_t *rel_head = (int32_t *)malloc((size_t)(steps ? steps : 1) * sizeof(int32_t));
    int32_t *rel_tail = (int32_t *)malloc((size_t)(steps ? steps : 1) * sizeof(int32_t));
    int64_t *dyn_release = (int64_t *)calloc((size_t)(steps ? steps : 1), sizeof(int64_t));
    Stack *free_lists = (Stack *)calloc((size_t)(K ? K : 1), sizeof(Stack));
    Block block = {0};
    block.off = (int64_t *)malloc((size_t)(T + 1) * sizeof(int64_t));
    block.osz = (int64_t *)malloc((size_t)(T + 1) * sizeof(int64_t));
    block.gsz = (int64_t *)malloc((size_t)(T + 1) * sizeof(int64_t));
    block.goff = (int64_t *)malloc((size_t)(T + 1) * sizeof(int64_t));
    if (!use || !first_read || !read_order || !last_read || !next_alloc || !next_release || !alloc_head ||
        !alloc_tail || !rel_head || !rel_tail || !dyn_release || !free_lists || !block.off || !block.osz ||
        !block.gsz || !block.goff) {
        PyErr_NoMemory();
        goto done;
    }

    memcpy(use, use0, (size_t)T * sizeof(int64_t));
    for (Py_ssize_t t = 0; t < T; t++) {
        kind[t] = caller[t] ? K_CALLER : K_NONE;
        buffer[t] = (int32_t)t;
        alloc_step[t] = -1;
        release_step[t] = -1;
        planned[t] = 0;
        offset[t] = -1;
        first_read[t] = -1;
    }
    for (Py_ssize_t s = 0; s < steps; s++) alloc_head[s] = rel_head[s] = -1;

    int planned_once = 1;
    Py_ssize_t n_planned = 0, n_read = 0, n_unknown = 0, n_dynamic = 0;
    int oom = 0;

    /* 1. the reuse walk (planner._reuse_plan) */
    for (Py_ssize_t step = 0; step < steps; step++) {
        const int32_t node = order[step];
        const int64_t o0 = out_ptr[node], o1 = out_ptr[node + 1];
        const int64_t i0 = in_ptr[node], i1 = in_ptr[node + 1];
        for (int64_t slot = o0; slot < o1; slot++) {
            const int32_t o = out_ids[slot];
            if (o < 0) continue;
            if (kind[o] != K_NONE || first_read[o] >= 0) {
                planned_once = 0;
                buffer[o] = o; /* planned again: where it lived before no longer counts */
            }
            if (kind[o] == K_NONE) seq[n_planned++] = o;
            if (is_output[o]) {
                kind[o] = K_OUTPUT;
                buffer[o] = o;
                alloc_step[o] = (int32_t)step;
                continue;
            }
            int32_t src = -1;
            int8_t how = K_ALLOCATE;
            if (may_share[node]) {
                const int32_t a = alias[slot];
                if (a >= 0 && in_ids[i0 + a] >= 0) {
                    src = in_ids[i0 + a];
                    how = K_ALIAS;
                } else {
                    for (int64_t p = inpl_ptr[slot]; p < inpl_ptr[slot + 1]; p++) {
                        const int32_t x = in_ids[i0 + inpl_pos[p]];
                        if (x >= 0 && use[buffer[x]] == 1 && key[x] != 0 && key[x] == key[o]) {
                            src = x;
                            how = K_INPLACE;
                            break;
                        }
                    }
                }
            }
            if (src < 0 && use[o] > 1 && reusable[key[o]]) {
                Stack *st = &free_lists[key[o]];
                if (st->len) { /* the most recently freed buffer of o's exact shape */
                    src = st->data[--st->len];
                    how = K_REUSE;
                }
            }
            alloc_step[o] = (int32_t)step;
            if (src >= 0) {
                const int32_t b = buffer[src];
                kind[o] = how;
                buffer[o] = b;
                use[b] += use[o];
            } else {
                kind[o] = K_ALLOCATE;
                buffer[o] = o;
                next_alloc[o] = -1;
                if (alloc_head[step] < 0) alloc_head[step] = o; else next_alloc[alloc_tail[step]] = o;
                alloc_tail[step] = o;
            }
        }
        /* one use of each input's and output's buffer is spent; a buffer with none left is free */
        for (int64_t slot = i0; slot < i1; slot++) {
            const int32_t t = in_ids[slot];
            if (t < 0) continue;
            const int32_t b = buffer[t];
            if (first_read[b] < 0) {
                first_read[b] = (int32_t)n_read;
                read_order[n_read++] = b;
            }
            last_read[b] = (int32_t)step;
            if (--use[b] == 0 && reusable[key[b]] && stack_push(&free_lists[key[b]], b) < 0) oom = 1;
        }
        for (int64_t slot = o0; slot < o1; slot++) {
            const int32_t t = out_ids[slot];
            if (t < 0) continue;
            const int32_t b = buffer[t];
            if (--use[b] == 0 && reusable[key[b]] && stack_push(&free_lists[key[b]], b) < 0) oom = 1;
        }
        if (oom) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (!planned_once) {
        result = Py_BuildValue("(innnLLnn)", 0, n_planned, (Py_ssize_t)0, (Py_ssize_t)0, 0LL, 0LL, (Py_ssize_t)0,
                               (Py_ssize_t)0);
        goto done;
    }

    /* 2. the release plan (planner._release_plan): buffers in the order first read */
    for (Py_ssize_t r = 0; r < n_read; r++) {
        const int32_t b = read_order[r];
        if (kind[b] != K_ALLOCATE) continue;
        const int32_t s = last_read[b];
        release_step[b] = s;
        next_release[b] = -1;
        if (rel_head[s] < 0) rel_head[s] = b; else next_release[rel_tail[s]] = b;
        rel_tail[s] = b;
    }

    /* 3. the memory pattern (planner._memory_pattern) */
    int64_t dyn_live = 0, peak_live = -1;
    Py_ssize_t peak_live_step = 0, block_peak_step = 0;
    for (Py_ssize_t step = 0; step < steps; step++) {
        for (int32_t o = alloc_head[step]; o >= 0; o = next_alloc[o]) {
            const int64_t sz = size[o];
            if (sz < 0) {
                unknown[n_unknown++] = o;
            } else if (declared[o]) {
                if (sz == 0) continue;
                const int64_t before = block.buffer_size;
                offset[o] = block_allocate(&block, (sz + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT);
                planned[o] = 1;
                if (block.buffer_size > before) block_peak_step = step;
            } else {
                dyn_ids[n_dynamic++] = o;
                dyn_live += sz;
                if (release_step[o] >= 0) dyn_release[release_step[o]] += sz;
            }
        }
        live_bytes[step] = block.live;
        block_bytes[step] = block.buffer_size;
        dynamic_bytes[step] = dyn_live;
        if (block.live > peak_live) {
            peak_live = block.live;
            peak_live_step = step;
        }
        for (int32_t b = rel_head[step]; b >= 0; b = next_release[b]) {
            if (planned[b] && offset[b] >= 0) block_free(&block, offset[b]);
        }
        dyn_live -= dyn_release[step];
    }
    result = Py_BuildValue("(innnLLnn)", 1, n_planned, n_unknown, n_dynamic, (long long)block.buffer_size,
                           (long long)(peak_live > 0 ? peak_live : 0), peak_live_step, block_peak_step);

done:
    free(use);
    free(first_read);
    free(read_order);
    free(last_read);
    free(next_alloc);
    free(next_release);
    free(alloc_head);
    free(alloc_tail);
    free(rel_head);
    free(rel_tail);
    free(dyn_release);
    if (free_lists) {
        for (Py_ssize_t k = 0; k < K; k++) free(free_lists[k].data);
        free(free_lists);
    }
    free(block.off);
    free(block.osz);
    free(block.gsz);
    free(block.goff);
release:
    for (int k = 0; k < got; k++) PyBuffer_Release(&buf[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "onnxruntime's memory plan of one order, on the arrays of plan_arrays.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "plan_walk", "onnxruntime 1.19's memory plan, compiled (see plan_arrays.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_plan_walk(void) { return PyModule_Create(&module); }
