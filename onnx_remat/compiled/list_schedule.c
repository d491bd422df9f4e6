/* The list schedulers' walk (onnx_remat/scheduling/orders.py, ListScheduler.order), on the integer
   arrays of onnx_remat/ortsim/plan_arrays.py.

   Among the nodes whose producers have run, the walk runs next the one the policy ranks first: the
   DEFAULT policy the earliest in the current order; FREEING one that frees at least the bytes it
   allocates, else the earliest; GREEDY the one adding the fewest bytes. A node's bytes added are its
   outputs' bytes that need a buffer of their own (not an alias of an input) minus those of the inputs
   it is the last unrun reader of (graph inputs, initializers and graph outputs never count); they
   fall as the other readers run, and the node is queued again then. Keys are (rank, position) as
   rank * count + position, in a binary heap of integers, as orders.py does with heapq: the order
   is the Python walk's (tests/scheduling/test_list_schedule_native.py compares both). Why C: the
   memory schedule walks two or three policies per graph, and the Python walk and its set-up took
   1.4 s of the critical path at 10^5 nodes, all of it dictionary lookups on tensor names.

   walk(base, policy, in_ptr, in_ids, out_ptr, out_ids, alias, size, kept, out) -> status
     base: int32, node indices in the current order (distinct); policy: 0 default, 1 freeing,
     2 greedy; in_ptr / out_ptr: int64 [nodes + 1] and in_ids / out_ids: int32, each node index's
     inputs and outputs as tensor numbers (-1: an absent optional one; a removed node has none);
     alias: int32 per output slot, the input position it aliases (-1: none); size: int64 per tensor,
     bytes (-1: unknown, counted as 0); kept: uint8 per tensor, never freed; out: int32 [len(base)].
     Returns 0 (out holds the order), 1 (some node never gets ready: a cycle, or a producer outside
     base) or 2 (not walked: a tensor written by two nodes, or keys past 64 bits; the caller walks
     in Python). Only the buffer protocol is used. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t *keys;
    Py_ssize_t len, cap;
} Heap;

static int heap_push(Heap *h, int64_t key) {
    if (h->len == h->cap) {
        Py_ssize_t cap = h->cap ? h->cap * 2 : 1024;
        int64_t *keys = (int64_t *)realloc(h->keys, (size_t)cap * sizeof(int64_t));
        if (keys == NULL) return -1;
        h->keys = keys;
        h->cap = cap;
    }
    Py_ssize_t i = h->len++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (h->keys[parent] <= key) break;
        h->keys[i] = h->keys[parent];
        i = parent;
    }
    h->keys[i] = key;
    return 0;
}

static int64_t heap_pop(Heap *h) {
    int64_t top = h->keys[0], last = h->keys[--h->len];
    Py_ssize_t i = 0, n = h->len;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && h->keys[child + 1] < h->keys[child]) child++;
        if (h->keys[child] >= last) break;
        h->keys[i] = h->keys[child];
        i = child;
    }
    if (n) h->keys[i] = last;
    return top;
}

typedef struct {
    int policy;
    int64_t count;
    const int64_t *allocates, *freed;
} Keys;

static int64_t key_of(const Keys *k, Py_ssize_t pos) {
    if (k->policy == 0) return pos;
    int64_t delta = k->allocates[pos] - k->freed[pos];
    if (k->policy == 1) return (delta <= 0 ? 0 : k->count) + pos;
    return delta * k->count + pos;
}

enum { A_BASE, A_IN_PTR, A_IN_IDS, A_OUT_PTR, A_OUT_IDS, A_ALIAS, A_SIZE, A_KEPT, A_OUT, N_BUFS };

static PyObject *walk(PyObject *self, PyObject *args) {
    (void)self;
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != N_BUFS + 1) {
        PyErr_Format(PyExc_TypeError, "walk takes the order, the policy and %d arrays", N_BUFS - 1);
        return NULL;
    }
    int policy = (int)PyLong_AsLong(PyTuple_GET_ITEM(args, 1));
    if (policy == -1 && PyErr_Occurred()) return NULL;
    if (policy < 0 || policy > 2) {
        PyErr_SetString(PyExc_ValueError, "policy must be 0, 1 or 2");
        return NULL;
    }
    Py_buffer buf[N_BUFS];
    int got = 0;
    for (; got < N_BUFS; got++) {
        PyObject *arg = PyTuple_GET_ITEM(args, got == A_BASE ? 0 : got + 1);
        int flags = got == A_OUT ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS;
        if (PyObject_GetBuffer(arg, &buf[got], flags) < 0) break;
    }
    int status = 2;
    int64_t *ins_ptr = NULL, *allocates = NULL, *freed = NULL, *rd_ptr = NULL, *dep_ptr = NULL, *readers = NULL;
    int32_t *pos = NULL, *prod = NULL, *ins = NULL, *in_degree = NULL, *deps = NULL, *rd = NULL, *mark = NULL;
    uint8_t *done = NULL;
    Heap heap = {NULL, 0, 0};
    if (got < N_BUFS) goto release;

    const int32_t *base = (const int32_t *)buf[A_BASE].buf;
    const Py_ssize_t n = buf[A_BASE].len / 4;
    const int64_t *in_ptr = (const int64_t *)buf[A_IN_PTR].buf;
    const Py_ssize_t nodes = buf[A_IN_PTR].len / 8 - 1;
    const int32_t *in_ids = (const int32_t *)buf[A_IN_IDS].buf;
    const int64_t *out_ptr = (const int64_t *)buf[A_OUT_PTR].buf;
    const int32_t *out_ids = (const int32_t *)buf[A_OUT_IDS].buf;
    const int32_t *alias = (const int32_t *)buf[A_ALIAS].buf;
    const int64_t *size = (const int64_t *)buf[A_SIZE].buf;
    const Py_ssize_t T = buf[A_SIZE].len / 8;
    const uint8_t *kept = (const uint8_t *)buf[A_KEPT].buf;
    int32_t *out = (int32_t *)buf[A_OUT].buf;
    if (nodes < 0 || buf[A_OUT_PTR].len / 8 - 1 != nodes || buf[A_KEPT].len != T || buf[A_OUT].len / 4 < n) {
        PyErr_SetString(PyExc_ValueError, "walk: the arrays do not describe one graph");
        goto release;
    }

    pos = (int32_t *)malloc((size_t)(nodes + 1) * sizeof(int32_t));
    prod = (int32_t *)malloc((size_t)(T + 1) * sizeof(int32_t));
    mark = (int32_t *)calloc((size_t)(T + nodes + 1), sizeof(int32_t));
    readers = (int64_t *)calloc((size_t)(T + 1), sizeof(int64_t));
    ins_ptr = (int64_t *)calloc((size_t)(n + 1), sizeof(int64_t));
    allocates = (int64_t *)calloc((size_t)(n + 1), sizeof(int64_t));
    freed = (int64_t *)calloc((size_t)(n + 1), sizeof(int64_t));
    in_degree = (int32_t *)calloc((size_t)(n + 1), sizeof(int32_t));
    dep_ptr = (int64_t *)calloc((size_t)(n + 2), sizeof(int64_t));
    rd_ptr = (int64_t *)calloc((size_t)(T + 2), sizeof(int64_t));
    done = (uint8_t *)calloc((size_t)(n + 1), 1);
    const int64_t n_in = nodes ? in_ptr[nodes] : 0;
    ins = (int32_t *)malloc((size_t)(n_in + 1) * sizeof(int32_t));
    deps = (int32_t *)malloc((size_t)(n_in + 1) * sizeof(int32_t));
    rd = (int32_t *)malloc((size_t)(n_in + 1) * sizeof(int32_t));
    if (!pos || !prod || !mark || !readers || !ins_ptr || !allocates || !freed || !in_degree || !dep_ptr || !rd_ptr ||
        !done || !ins || !deps || !rd) {
        PyErr_NoMemory();
        goto release;
    }
    int32_t *tmark = mark, *nmark = mark + T; /* stamps: a tensor / a node seen for position k + 1 */

    for (Py_ssize_t i = 0; i < nodes; i++) pos[i] = -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        int32_t i = base[k];
        if (i < 0 || i >= nodes || pos[i] != -1) goto release; /* (the caller checks base first) */
        pos[i] = (int32_t)k;
    }
    /* The producer of each tensor: the node writing it (a second writer: not walked here). */
    for (Py_ssize_t t = 0; t < T; t++) prod[t] = -1;
    for (Py_ssize_t i = 0; i < nodes; i++) {
        for (int64_t s = out_ptr[i]; s < out_ptr[i + 1]; s++) {
            int32_t t = out_ids[s];
            if (t < 0) continue;
            if (t >= T || prod[t] != -1) goto release;
            prod[t] = (int32_t)i;
        }
    }
    /* Per position: its distinct inputs; its distinct producers (counted, whether in base or not:
       one outside never runs, so its readers never get ready), each in base with k as a dependent;
       the bytes its outputs allocate. */
    int64_t total = 0;
    Py_ssize_t n_ins = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int32_t i = base[k];
        ins_ptr[k] = n_ins;
        for (int64_t s = in_ptr[i]; s < in_ptr[i + 1]; s++) {
            int32_t t = in_ids[s];
            if (t < 0) continue;
            if (t >= T) goto release;
            if (tmark[t] == k + 1) continue;
            tmark[t] = (int32_t)(k + 1);
            ins[n_ins++] = t;
            readers[t]++;
            int32_t p = prod[t];
            if (p >= 0 && nmark[p] != k + 1) {
                nmark[p] = (int32_t)(k + 1);
                in_degree[k]++;
                if (pos[p] >= 0) dep_ptr[pos[p] + 1]++;
            }
        }
        int64_t bytes = 0;
        for (int64_t s = out_ptr[i]; s < out_ptr[i + 1]; s++) {
            int32_t t = out_ids[s];
            if (t >= 0 && alias[s] < 0 && size[t] > 0) bytes += size[t];
        }
        allocates[k] = bytes;
    }
    ins_ptr[n] = n_ins;
    for (Py_ssize_t t = 0; t < T; t++) {
        if (size[t] > 0) {
            if (size[t] > INT64_MAX / 4 - total) goto release;
            total += size[t];
        }
    }
    /* |allocates - freed| <= total: the greedy keys fit in 64 bits when total * (count + 1) does */
    if (n && total > (INT64_MAX / 4) / ((int64_t)n + 1)) goto release;
    for (Py_ssize_t k = 0; k < n; k++) dep_ptr[k + 1] += dep_ptr[k];
    /* Dependents, filled in position order (each producer once per reader: stamped -(k + 1) this
       time); the readers of each tensor by position, which the walk reads when one reader is left. */
    for (Py_ssize_t t = 0; t < T; t++) rd_ptr[t + 1] = rd_ptr[t] + readers[t];
    {
        int64_t *dep_fill = (int64_t *)malloc((size_t)(n + 1) * sizeof(int64_t));
        int64_t *rd_fill = (int64_t *)malloc((size_t)(T + 1) * sizeof(int64_t));
        if (!dep_fill || !rd_fill) {
            free(dep_fill);
            free(rd_fill);
            PyErr_NoMemory();
            goto release;
        }
        memcpy(dep_fill, dep_ptr, (size_t)n * sizeof(int64_t));
        memcpy(rd_fill, rd_ptr, (size_t)T * sizeof(int64_t));
        for (Py_ssize_t k = 0; k < n; k++) {
            for (int64_t s = ins_ptr[k]; s < ins_ptr[k + 1]; s++) {
                int32_t t = ins[s];
                rd[rd_fill[t]++] = (int32_t)k;
                int32_t p = prod[t];
                if (p >= 0 && pos[p] >= 0 && nmark[p] != -(k + 1)) {
                    nmark[p] = (int32_t)(-(k + 1));
                    deps[dep_fill[pos[p]]++] = (int32_t)k;
                }
            }
        }
        free(dep_fill);
        free(rd_fill);
    }
    /* freed[k]: bytes of the inputs node k is the last unrun reader of */
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t bytes = 0;
        for (int64_t s = ins_ptr[k]; s < ins_ptr[k + 1]; s++) {
            int32_t t = ins[s];
            if (readers[t] == 1 && !kept[t] && size[t] > 0) bytes += size[t];
        }
        freed[k] = bytes;
    }

    Keys keys = {policy, (int64_t)n, allocates, freed};
    for (Py_ssize_t k = 0; k < n; k++) {
        if (in_degree[k] == 0 && heap_push(&heap, key_of(&keys, k)) < 0) goto nomem;
    }
    Py_ssize_t emitted = 0;
    while (heap.len) {
        int64_t queued = heap_pop(&heap);
        int64_t k = queued % (int64_t)n;
        if (k < 0) k += n; /* Python's modulo: the position, for negative (greedy) keys too */
        if (done[k]) continue;
        int64_t now = key_of(&keys, k);
        if (now != queued) { /* its inputs lost readers since it was queued */
            if (heap_push(&heap, now) < 0) goto nomem;
            continue;
        }
        done[k] = 1;
        out[emitted++] = base[k];
        for (int64_t s = ins_ptr[k]; s < ins_ptr[k + 1]; s++) {
            int32_t t = ins[s];
            int64_t left = --readers[t];
            if (left == 1 && policy != 0) {
                for (int64_t r = rd_ptr[t]; r < rd_ptr[t + 1]; r++) {
                    int32_t c = rd[r];
                    if (done[c]) continue;
                    if (!kept[t] && size[t] > 0) freed[c] += size[t]; /* c is now the last reader of t */
                    if (in_degree[c] == 0 && heap_push(&heap, key_of(&keys, c)) < 0) goto nomem;
                }
            }
        }
        for (int64_t s = dep_ptr[k]; s < dep_ptr[k + 1]; s++) {
            int32_t c = deps[s];
            if (--in_degree[c] == 0 && heap_push(&heap, key_of(&keys, c)) < 0) goto nomem;
        }
    }
    status = emitted == n ? 0 : 1;
    goto release;
nomem:
    PyErr_NoMemory();
release:
    free(heap.keys);
    free(pos);
    free(prod);
    free(mark);
    free(readers);
    free(ins_ptr);
    free(allocates);
    free(freed);
    free(in_degree);
    free(dep_ptr);
    free(rd_ptr);
    free(done);
    free(ins);
    free(deps);
    free(rd);
    for (int b = 0; b < got; b++) PyBuffer_Release(&buf[b]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(status);
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "The list scheduler's order of one policy (see the module comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "list_schedule", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_list_schedule(void) { return PyModule_Create(&module); }
