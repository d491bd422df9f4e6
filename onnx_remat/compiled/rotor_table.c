/* The budget solver's two inner loops (onnx_remat/remat/solve.py): a rotor table of one group
   (_Tables._table: per headroom H, the least cost over the group's splits, and the first split
   reaching it), and a step of the dynamic programme over the units (relax, below).

   A split s of group a..b recomputes forward to the boundary of s, holds it (o quanta) while
   s+1..b run, then runs a..s: its cost at headroom H is (right[H - o] + f) + left[H], where it is
   feasible (H >= lo). The Python walk keeps a running minimum over the splits' rows, taking a row
   where it is strictly lower: so the first split of least cost wins, and a level no split reaches
   keeps INF and -1. This is that walk, level by level, with the same additions in the same order
   (tests/remat/test_solve.py compares both on every table of random problems). Why C: a
   3,850-layer budget makes 16,600 tables of ~2,000 levels, about nine splits each, and the six
   numpy calls per split were a third of each solve; its 57,000 relaxation steps, five numpy
   calls each, another fifth.

   table(splits, val, split) -> None
     splits: a sequence of (f, lo, o, right, left): the split's forward cost (float), the least
     headroom it is feasible at (0 <= o <= lo <= len(val) - 1), and the costs of the two tables it
     combines (float64, at least len(val) levels each); val: float64 and split: int32, one entry per
     level, filled in (val INF and split -1 on entry). Only the buffer protocol is used. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *table(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *splits, *val_obj, *split_obj;
    if (!PyArg_ParseTuple(args, "OOO", &splits, &val_obj, &split_obj)) return NULL;
    PyObject *seq = PySequence_Fast(splits, "table: splits must be a sequence");
    if (seq == NULL) return NULL;
    Py_buffer vb, sb;
    if (PyObject_GetBuffer(val_obj, &vb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    if (PyObject_GetBuffer(split_obj, &sb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&vb);
        Py_DECREF(seq);
        return NULL;
    }
    double *val = (double *)vb.buf;
    int32_t *split = (int32_t *)sb.buf;
    const Py_ssize_t levels = vb.len / (Py_ssize_t)sizeof(double);
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int ok = sb.len / (Py_ssize_t)sizeof(int32_t) == levels;
    if (!ok) PyErr_SetString(PyExc_ValueError, "table: val and split differ in length");
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 5) {
            PyErr_SetString(PyExc_ValueError, "table: each split is (f, lo, o, right, left)");
            ok = 0;
            break;
        }
        double f = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 0));
        Py_ssize_t lo = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
        Py_ssize_t o = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
        if (PyErr_Occurred()) {
            ok = 0;
            break;
        }
        if (o < 0 || lo < o || lo >= levels) {
            PyErr_SetString(PyExc_ValueError, "table: a split needs 0 <= o <= lo < levels");
            ok = 0;
            break;
        }
        Py_buffer rb, lb;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 3), &rb, PyBUF_C_CONTIGUOUS) < 0) {
            ok = 0;
            break;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 4), &lb, PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&rb);
            ok = 0;
            break;
        }
        if (rb.len / (Py_ssize_t)sizeof(double) < levels || lb.len / (Py_ssize_t)sizeof(double) < levels) {
            PyErr_SetString(PyExc_ValueError, "table: a split's tables are shorter than the table");
            ok = 0;
        } else {
            const double *right = (const double *)rb.buf, *left = (const double *)lb.buf;
            const int32_t at = (int32_t)i;
            for (Py_ssize_t h = lo; h < levels; h++) {
                double cost = right[h - o] + f; /* (as numpy adds them: right + f, then left) */
                cost += left[h];
                if (cost < val[h]) {
                    val[h] = cost;
                    split[h] = at;
                }
            }
        }
        PyBuffer_Release(&rb);
        PyBuffer_Release(&lb);
    }
    PyBuffer_Release(&vb);
    PyBuffer_Release(&sb);
    Py_DECREF(seq);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* relax(best, code, prev, K, k_to, k_from, add, lim, c, cost, top) -> None: one step of the
   solver's dynamic programme (solve.py, _solve's relax): for 0 <= S <= min(lim, K - add),
   best[k_to][S + add] <- best[k_from][S] + cost(S) where that is strictly less, with code c and
   prev S recorded; a negative add counts as 0. best: float64, code and prev: int64, each
   [rows][K + 1]; cost: a float, or a float64 rotor table read at clip(top - S, 0, len - 1). */
static PyObject *relax(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *best_o, *code_o, *prev_o, *cost_o;
    Py_ssize_t K, k_to, k_from, add, lim, top;
    long long c;
    if (!PyArg_ParseTuple(args, "OOOnnnnnLOn", &best_o, &code_o, &prev_o, &K, &k_to, &k_from, &add, &lim, &c, &cost_o,
                          &top))
        return NULL;
    if (add < 0) add = 0;
    Py_ssize_t hi = lim < K - add ? lim : K - add;
    if (hi < 0) Py_RETURN_NONE;
    double scalar = 0.0;
    int is_scalar = PyFloat_Check(cost_o);
    if (is_scalar) scalar = PyFloat_AS_DOUBLE(cost_o);
    Py_buffer buf[4];
    int got = 0;
    PyObject *objs[4] = {best_o, code_o, prev_o, cost_o};
    for (; got < (is_scalar ? 3 : 4); got++) {
        int flags = got < 3 ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS;
        if (PyObject_GetBuffer(objs[got], &buf[got], flags) < 0) break;
    }
    int ok = got == (is_scalar ? 3 : 4);
    const Py_ssize_t width = K + 1;
    if (ok) {
        Py_ssize_t rows = buf[0].len / (Py_ssize_t)sizeof(double) / width;
        Py_ssize_t tlen = is_scalar ? 1 : buf[3].len / (Py_ssize_t)sizeof(double);
        if (K < 0 || k_to < 0 || k_from < 0 || k_to >= rows || k_from >= rows || tlen < 1 ||
            buf[1].len != buf[0].len || buf[2].len != buf[0].len) {
            PyErr_SetString(PyExc_ValueError, "relax: rows or tables out of range");
            ok = 0;
        } else {
            double *dst = (double *)buf[0].buf + k_to * width + add;
            const double *src = (const double *)buf[0].buf + k_from * width;
            int64_t *dcode = (int64_t *)buf[1].buf + k_to * width + add;
            int64_t *dprev = (int64_t *)buf[2].buf + k_to * width + add;
            const double *table = is_scalar ? NULL : (const double *)buf[3].buf;
            for (Py_ssize_t S = 0; S <= hi; S++) {
                double cost = scalar;
                if (table != NULL) {
                    Py_ssize_t h = top - S;
                    cost = table[h < 0 ? 0 : (h >= tlen ? tlen - 1 : h)];
                }
                double cand = src[S] + cost;
                if (cand < dst[S]) {
                    dst[S] = cand;
                    dcode[S] = (int64_t)c;
                    dprev[S] = (int64_t)S;
                }
            }
        }
    }
    for (int b = 0; b < got; b++) PyBuffer_Release(&buf[b]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"table", table, METH_VARARGS, "One rotor table's least cost and first split per level (see the module comment)."},
    {"relax", relax, METH_VARARGS, "One step of the solver's dynamic programme (see relax's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "rotor_table", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_rotor_table(void) { return PyModule_Create(&module); }
