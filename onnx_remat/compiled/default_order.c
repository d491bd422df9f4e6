/* onnxruntime's DEFAULT execution order (ExecutionOrder::DEFAULT), on integer arrays.

   The walk of onnx_remat/ortsim/order.py's default_order, whose docstring says what onnxruntime
   does and where, step for step: the leaves pushed in index order, a depth-first walk emitting each
   node after its producers, visiting the producer with the highest index first, then each Shape or
   Size node moved right after the producer of its input. order.py's Python walk is the reference
   (tests/ortsim/test_default_order_native.py compares both). Why C: the emulated optimizer walks
   the graph in this order after each pass that changes it, four or five times per emulation, a
   third of a second each at 10^5 nodes in Python.

   walk(indices, prod_ptr, prod_ids, follow_child, follow_parent, out) -> number written to out
     indices: int32, the live node indices, in node-list order (ascending, or the order a list
     with moved leaves gives: the leaves are pushed in this order); prod_ptr: int64 [len(indices) + 1] and
     prod_ids: int32, the producers of indices[k] (with repeats, any order); follow_child /
     follow_parent: int32, the Shape/Size nodes to move and their inputs' producers, children
     ascending; out: int32 [len(indices)], the order. Only the buffer protocol is used. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void sort_ints(int32_t *a, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++) { /* insertion sort: a node has a handful of producers */
        int32_t v = a[i];
        Py_ssize_t j = i - 1;
        while (j >= 0 && a[j] > v) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = v;
    }
}

enum { A_INDICES, A_PTR, A_PRODS, A_FCHILD, A_FPARENT, A_OUT, N_ARGS };

static PyObject *walk(PyObject *self, PyObject *args) {
    (void)self;
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != N_ARGS) {
        PyErr_Format(PyExc_TypeError, "walk takes %d arrays", N_ARGS);
        return NULL;
    }
    Py_buffer buf[N_ARGS];
    int got = 0;
    for (; got < N_ARGS; got++) {
        int flags = got == A_OUT ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, got), &buf[got], flags) < 0) break;
    }
    PyObject *result = NULL;
    int32_t *pos = NULL, *stack = NULL, *scratch = NULL, *fhead = NULL, *fnext = NULL, *order = NULL;
    uint8_t *visited = NULL, *has_consumer = NULL, *placed = NULL;
    if (got < N_ARGS) goto release;

    const int32_t *indices = (const int32_t *)buf[A_INDICES].buf;
    const Py_ssize_t n = buf[A_INDICES].len / 4;
    const int64_t *ptr = (const int64_t *)buf[A_PTR].buf;
    const int32_t *prods = (const int32_t *)buf[A_PRODS].buf;
    const Py_ssize_t n_prods = buf[A_PRODS].len / 4;
    const int32_t *fchild = (const int32_t *)buf[A_FCHILD].buf;
    const int32_t *fparent = (const int32_t *)buf[A_FPARENT].buf;
    const Py_ssize_t n_follow = buf[A_FCHILD].len / 4;
    int32_t *out = (int32_t *)buf[A_OUT].buf;
    if (buf[A_PTR].len / 8 != n + 1 || buf[A_OUT].len / 4 != n || buf[A_FPARENT].len / 4 != n_follow) {
        PyErr_SetString(PyExc_ValueError, "walk: array lengths do not match");
        goto release;
    }
    Py_ssize_t size = 0; /* the largest index + 1 (the indices need not be ascending) */
    for (Py_ssize_t k = 0; k < n; k++) {
        if (indices[k] < 0) {
            PyErr_SetString(PyExc_ValueError, "walk: a negative node index");
            goto release;
        }
        if (indices[k] >= size) size = (Py_ssize_t)indices[k] + 1;
    }
    for (Py_ssize_t k = 0; k < n_prods; k++) {
        if (prods[k] < 0 || prods[k] >= size) {
            PyErr_SetString(PyExc_ValueError, "walk: a producer is not a node");
            goto release;
        }
    }

    pos = (int32_t *)malloc((size_t)(size ? size : 1) * sizeof(int32_t)); /* node index -> k */
    visited = (uint8_t *)calloc((size_t)(size ? size : 1), 1);
    has_consumer = (uint8_t *)calloc((size_t)(size ? size : 1), 1);
    stack = (int32_t *)malloc((size_t)(2 * n + n_prods + 1) * sizeof(int32_t));
    scratch = (int32_t *)malloc((size_t)(n_prods + 1) * sizeof(int32_t));
    order = (int32_t *)malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!pos || !visited || !has_consumer || !stack || !scratch || !order) {
        PyErr_NoMemory();
        goto release;
    }
    for (Py_ssize_t i = 0; i < size; i++) pos[i] = -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (pos[indices[k]] >= 0) {
            PyErr_SetString(PyExc_ValueError, "walk: a node index listed twice");
            goto release;
        }
        pos[indices[k]] = (int32_t)k;
    }
    for (Py_ssize_t k = 0; k < n_prods; k++) has_consumer[prods[k]] = 1;

    /* The leaves in index order, the last on top: encoded as v >= 0 "visit", ~v "emit". */
    Py_ssize_t top = 0, emitted = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!has_consumer[indices[k]]) stack[top++] = indices[k];
    }
    while (top) {
        const int32_t node = stack[--top];
        if (node < 0) {
            order[emitted++] = ~node;
            continue;
        }
        if (visited[node]) continue;
        visited[node] = 1;
        stack[top++] = ~node;
        const int32_t k = pos[node];
        if (k < 0) continue; /* not a live node: no producers */
        const int64_t p0 = ptr[k], p1 = ptr[k + 1];
        if (p1 - p0 == 1) { /* the common case, without a sort */
            if (!visited[prods[p0]]) stack[top++] = prods[p0];
            continue;
        }
        Py_ssize_t m = 0;
        for (int64_t p = p0; p < p1; p++) scratch[m++] = prods[p];
        sort_ints(scratch, m);
        for (Py_ssize_t i = 0; i < m; i++) {
            if (i && scratch[i] == scratch[i - 1]) continue;
            if (!visited[scratch[i]]) stack[top++] = scratch[i];
        }
    }
    /* Shape and Size nodes right after the producer of their input, several of one producer in
       index order (the children come sorted) */
    Py_ssize_t written = 0;
    if (!n_follow) {
        memcpy(out, order, (size_t)emitted * sizeof(int32_t));
        written = emitted;
    } else {
        fhead = (int32_t *)malloc((size_t)(size ? size : 1) * sizeof(int32_t));
        fnext = (int32_t *)malloc((size_t)n_follow * sizeof(int32_t));
        placed = (uint8_t *)calloc((size_t)(size ? size : 1), 1);
        int32_t *ftail = (int32_t *)malloc((size_t)(size ? size : 1) * sizeof(int32_t));
        if (!fhead || !fnext || !placed || !ftail) {
            free(ftail);
            PyErr_NoMemory();
            goto release;
        }
        for (Py_ssize_t i = 0; i < size; i++) fhead[i] = -1;
        for (Py_ssize_t f = 0; f < n_follow; f++) {
            const int32_t parent = fparent[f];
            if (parent < 0 || parent >= size || fchild[f] < 0 || fchild[f] >= size) {
                free(ftail);
                PyErr_SetString(PyExc_ValueError, "walk: a moved node or its producer is not a node");
                goto release;
            }
            fnext[f] = -1;
            if (fhead[parent] < 0) fhead[parent] = (int32_t)f; else fnext[ftail[parent]] = (int32_t)f;
            ftail[parent] = (int32_t)f;
        }
        free(ftail);
        for (Py_ssize_t e = 0; e < emitted; e++) {
            const int32_t node = order[e];
            if (placed[node]) continue;
            placed[node] = 1;
            if (written == n) break; /* (a moved node listed twice: more than the nodes) */
            out[written++] = node;
            for (int32_t f = fhead[node]; f >= 0 && written < n; f = fnext[f]) {
                out[written++] = fchild[f];
                placed[fchild[f]] = 1;
            }
        }
    }
    result = PyLong_FromSsize_t(written);

release:
    free(pos);
    free(visited);
    free(has_consumer);
    free(stack);
    free(scratch);
    free(order);
    free(fhead);
    free(fnext);
    free(placed);
    for (int k = 0; k < got; k++) PyBuffer_Release(&buf[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "onnxruntime's DEFAULT order of a graph given as arrays (see order.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "default_order", "onnxruntime 1.19's DEFAULT execution order, compiled (see order.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_default_order(void) { return PyModule_Create(&module); }
