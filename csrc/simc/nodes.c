/* pipert._simc's node arrays: Ints, Floats and Succ (see nodes.h). */
#include "nodes.h"

static int grow(void **p, Py_ssize_t *cap, size_t item, Py_ssize_t want) {
    Py_ssize_t c = *cap < 16 ? 16 : *cap;
    while (c < want) c *= 2;
    void *q = PyMem_Realloc(*p, (size_t)c * item);
    if (!q) { PyErr_NoMemory(); return -1; }
    *p = q;
    *cap = c;
    return 0;
}

int arr_grow(Arr *a) {
    Py_ssize_t c = a->cap;
    return grow((void **)&a->v.i, &c, 8, a->cap * 2 > 16 ? a->cap * 2 : 16) ? -1 : (a->cap = c, 0);
}

int succ_grow_nodes(Succ *s) {
    Py_ssize_t want = s->cap * 2 > 16 ? s->cap * 2 : 16, c;
    c = s->cap;
    if (grow((void **)&s->head, &c, sizeof(long long), want)) return -1;
    c = s->cap;
    if (grow((void **)&s->tail, &c, sizeof(long long), want)) return -1;
    c = s->cap;
    if (grow((void **)&s->cnt, &c, sizeof(long long), want)) return -1;
    s->cap = c;
    return 0;
}

int succ_grow_edges(Succ *s) {
    Py_ssize_t want = s->ecap * 2 > 16 ? s->ecap * 2 : 16, c = s->ecap;
    if (grow((void **)&s->dst, &c, sizeof(long long), want)) return -1;
    c = s->ecap;
    if (grow((void **)&s->next, &c, sizeof(long long), want)) return -1;
    s->ecap = c;
    return 0;
}

/* --- Ints and Floats ------------------------------------------------------------------------ */

static PyObject *arr_new(PyTypeObject *t, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_Format(PyExc_TypeError, "%s() takes no arguments (an empty array)", t->tp_name);
        return NULL;
    }
    Arr *a = (Arr *)t->tp_alloc(t, 0);
    if (a) a->is_float = t == &Floats_Type;
    return (PyObject *)a;
}

static void arr_dealloc(Arr *a) {
    PyMem_Free(a->v.i);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

static Py_ssize_t arr_len(Arr *a) { return a->n; }

static PyObject *arr_item(Arr *a, Py_ssize_t j) {
    if (j < 0 || j >= a->n) { PyErr_SetString(PyExc_IndexError, "node index out of range"); return NULL; }
    return a->is_float ? PyFloat_FromDouble(a->v.d[j]) : PyLong_FromLongLong(a->v.i[j]);
}

/* x as the array's item type: -1 with an error set for a value it cannot hold */
static int arr_value(Arr *a, PyObject *x, double *d, long long *i) {
    if (a->is_float) {
        *d = PyFloat_AsDouble(x);
        return *d == -1.0 && PyErr_Occurred() ? -1 : 0;
    }
    *i = PyLong_AsLongLong(x);
    return *i == -1 && PyErr_Occurred() ? -1 : 0;
}

static int arr_ass_item(Arr *a, Py_ssize_t j, PyObject *x) {
    double d = 0.0;
    long long i = 0;
    if (!x) { PyErr_SetString(PyExc_TypeError, "node arrays do not delete items"); return -1; }
    if (j < 0 || j >= a->n) { PyErr_SetString(PyExc_IndexError, "node index out of range"); return -1; }
    if (arr_value(a, x, &d, &i)) return -1;
    if (a->is_float) a->v.d[j] = d; else a->v.i[j] = i;
    return 0;
}

static PyObject *arr_append(Arr *a, PyObject *x) {
    double d = 0.0;
    long long i = 0;
    if (arr_value(a, x, &d, &i) || (a->is_float ? arr_push_d(a, d) : arr_push_i(a, i))) return NULL;
    Py_RETURN_NONE;
}

/* [item(self, 0), ..., item(self, n - 1)] */
static PyObject *list_of(PyObject *self, Py_ssize_t n, PyObject *(*item)(PyObject *, Py_ssize_t)) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t j = 0; out && j < n; j++) {
        PyObject *x = item(self, j);
        if (!x) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, j, x);
    }
    return out;
}

static PyObject *arr_tolist(Arr *a, PyObject *unused) {
    return list_of((PyObject *)a, a->n, (PyObject *(*)(PyObject *, Py_ssize_t))arr_item);
}

static PyObject *arr_count(Arr *a, PyObject *x) {
    double d = 0.0;
    long long i = 0;
    Py_ssize_t c = 0;
    if (arr_value(a, x, &d, &i)) return NULL;
    for (Py_ssize_t j = 0; j < a->n; j++) c += a->is_float ? a->v.d[j] == d : a->v.i[j] == i;
    return PyLong_FromSsize_t(c);
}

/* Ints, Floats, Succ and Edges compare (== and !=, against lists or their own type) and print as
 * the lists their ``tolist`` gives */
static PyObject *s_tolist;

static PyObject *as_list(PyObject *self) { return PyObject_CallMethodNoArgs(self, s_tolist); }

static PyObject *list_richcompare(PyObject *self, PyObject *other, int op) {
    if ((op != Py_EQ && op != Py_NE) || !(PyList_Check(other) || Py_TYPE(other) == Py_TYPE(self)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *x = as_list(self), *y = PyList_Check(other) ? Py_NewRef(other) : as_list(other), *res = NULL;
    if (x && y) res = PyObject_RichCompare(x, y, op);
    Py_XDECREF(x); Py_XDECREF(y);
    return res;
}

/* pickling and copying: an empty array of the type, then its items appended (Succ: one list of
 * edges per node); an Edges view as the plain list it reads as */
static PyObject *list_reduce(PyObject *self, PyObject *unused) {
    PyObject *l = as_list(self), *it = l ? PyObject_GetIter(l) : NULL, *res = NULL;
    if (it) res = Py_BuildValue("(O()OO)", (PyObject *)Py_TYPE(self), Py_None, it);
    Py_XDECREF(l); Py_XDECREF(it);
    return res;
}

static PyObject *list_repr(PyObject *self) {
    PyObject *l = as_list(self), *r = l ? PyObject_Repr(l) : NULL;
    Py_XDECREF(l);
    return r;
}

static PyMethodDef arr_methods[] = {
    {"append", (PyCFunction)arr_append, METH_O, "append(x): one more node's value"},
    {"count", (PyCFunction)arr_count, METH_O, "count(x): how many nodes hold x"},
    {"tolist", (PyCFunction)arr_tolist, METH_NOARGS, "the values as a list"},
    {"__reduce__", list_reduce, METH_NOARGS, "pickled as its values"},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods arr_seq = {.sq_length = (lenfunc)arr_len, .sq_item = (ssizeargfunc)arr_item,
                                    .sq_ass_item = (ssizeobjargproc)arr_ass_item};

#define ARR_TYPE(NAME, DOC) {PyVarObject_HEAD_INIT(NULL, 0) .tp_name = "pipert._simc." NAME, \
    .tp_basicsize = sizeof(Arr), .tp_flags = Py_TPFLAGS_DEFAULT, .tp_doc = DOC, .tp_new = arr_new, \
    .tp_dealloc = (destructor)arr_dealloc, .tp_as_sequence = &arr_seq, .tp_methods = arr_methods, \
    .tp_richcompare = list_richcompare, .tp_repr = list_repr, .tp_hash = PyObject_HashNotImplemented}
PyTypeObject Ints_Type = ARR_TYPE("Ints", "A growable int64 array per node (kind, indeg), read as a list.");
PyTypeObject Floats_Type = ARR_TYPE("Floats", "A growable double array per node (dur, lat), read as a list.");

/* --- Succ and its per-node view Edges ------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Succ *s;
    Py_ssize_t node;
} Edges;

static PyTypeObject Edges_Type;

static PyObject *succ_new(PyTypeObject *t, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Succ() takes no arguments (no nodes)");
        return NULL;
    }
    return t->tp_alloc(t, 0);
}

static void succ_dealloc(Succ *s) {
    PyMem_Free(s->head); PyMem_Free(s->tail); PyMem_Free(s->cnt); PyMem_Free(s->dst); PyMem_Free(s->next);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static Py_ssize_t succ_len(Succ *s) { return s->n; }

static PyObject *succ_item(Succ *s, Py_ssize_t j) {
    if (j < 0 || j >= s->n) { PyErr_SetString(PyExc_IndexError, "node index out of range"); return NULL; }
    Edges *e = PyObject_New(Edges, &Edges_Type);
    if (!e) return NULL;
    Py_INCREF(s);
    e->s = s, e->node = j;
    return (PyObject *)e;
}

static PyObject *edges_list(Succ *s, Py_ssize_t p) {
    PyObject *out = PyList_New(s->cnt[p]);
    Py_ssize_t j = 0;
    for (long long k = s->head[p]; out && k >= 0; k = s->next[k]) {
        PyObject *x = PyLong_FromLongLong(s->dst[k]);
        if (!x) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, j++, x);
    }
    return out;
}

/* succ.append(edges): a new node with these out-edges (the walk appends an empty list) */
static PyObject *succ_append(Succ *s, PyObject *edges) {
    PyObject *seq = PySequence_Fast(edges, "Succ.append takes a list of edges");
    if (!seq) return NULL;
    Py_ssize_t p = succ_push(s);
    for (Py_ssize_t j = 0; p >= 0 && j < PySequence_Fast_GET_SIZE(seq); j++) {
        long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, j));
        if ((x == -1 && PyErr_Occurred()) || succ_add(s, p, x)) p = -1;
    }
    Py_DECREF(seq);
    if (p < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *succ_tolist(Succ *s, PyObject *unused) {
    return list_of((PyObject *)s, s->n, (PyObject *(*)(PyObject *, Py_ssize_t))edges_list);
}

static PyMethodDef succ_methods[] = {
    {"append", (PyCFunction)succ_append, METH_O, "append(edges): one more node with these out-edges"},
    {"tolist", (PyCFunction)succ_tolist, METH_NOARGS, "the out-edges as a list of lists"},
    {"__reduce__", list_reduce, METH_NOARGS, "pickled as its nodes' out-edges"},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods succ_seq = {.sq_length = (lenfunc)succ_len, .sq_item = (ssizeargfunc)succ_item};

PyTypeObject Succ_Type = {PyVarObject_HEAD_INIT(NULL, 0) .tp_name = "pipert._simc.Succ", .tp_basicsize = sizeof(Succ),
    .tp_flags = Py_TPFLAGS_DEFAULT, .tp_doc = "Out-edges per node (dst << 1 | uses_end1), read as a list of lists.",
    .tp_new = succ_new, .tp_dealloc = (destructor)succ_dealloc, .tp_as_sequence = &succ_seq,
    .tp_methods = succ_methods, .tp_richcompare = list_richcompare, .tp_repr = list_repr,
    .tp_hash = PyObject_HashNotImplemented};

static void edges_dealloc(Edges *e) {
    Py_DECREF(e->s);
    PyObject_Free(e);
}

static Py_ssize_t edges_len(Edges *e) { return e->s->cnt[e->node]; }

static PyObject *edges_item(Edges *e, Py_ssize_t j) {
    if (j < 0 || j >= e->s->cnt[e->node]) { PyErr_SetString(PyExc_IndexError, "edge index out of range"); return NULL; }
    long long k = e->s->head[e->node];
    while (j--) k = e->s->next[k];
    return PyLong_FromLongLong(e->s->dst[k]);
}

static PyObject *edges_iter(Edges *e) {
    PyObject *l = edges_list(e->s, e->node), *it = l ? PyObject_GetIter(l) : NULL;
    Py_XDECREF(l);
    return it;
}

static PyObject *edges_append(Edges *e, PyObject *x) {
    long long v = PyLong_AsLongLong(x);
    if ((v == -1 && PyErr_Occurred()) || succ_add(e->s, e->node, v)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *edges_tolist(Edges *e, PyObject *unused) { return edges_list(e->s, e->node); }

static PyObject *edges_reduce(Edges *e, PyObject *unused) {
    PyObject *l = edges_list(e->s, e->node), *res = l ? Py_BuildValue("(O(O))", (PyObject *)&PyList_Type, l) : NULL;
    Py_XDECREF(l);
    return res;
}

static PyMethodDef edges_methods[] = {
    {"append", (PyCFunction)edges_append, METH_O, "append(edge): one more out-edge of this node"},
    {"tolist", (PyCFunction)edges_tolist, METH_NOARGS, "the out-edges as a list"},
    {"__reduce__", (PyCFunction)edges_reduce, METH_NOARGS, "pickled as the list it reads as"},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods edges_seq = {.sq_length = (lenfunc)edges_len, .sq_item = (ssizeargfunc)edges_item};

static PyTypeObject Edges_Type = {PyVarObject_HEAD_INIT(NULL, 0) .tp_name = "pipert._simc.Edges",
    .tp_basicsize = sizeof(Edges), .tp_flags = Py_TPFLAGS_DEFAULT, .tp_doc = "One node's out-edges in a Succ.",
    .tp_dealloc = (destructor)edges_dealloc, .tp_as_sequence = &edges_seq, .tp_iter = (getiterfunc)edges_iter,
    .tp_methods = edges_methods, .tp_richcompare = list_richcompare, .tp_repr = list_repr,
    .tp_hash = PyObject_HashNotImplemented};

int nodes_add_types(PyObject *m) {
    if (!s_tolist && !(s_tolist = PyUnicode_InternFromString("tolist"))) return -1;
    PyTypeObject *types[] = {&Ints_Type, &Floats_Type, &Succ_Type, &Edges_Type};
    const char *names[] = {"Ints", "Floats", "Succ", "Edges"};
    for (int j = 0; j < 4; j++) {
        if (PyType_Ready(types[j])) return -1;
        Py_INCREF(types[j]);
        if (PyModule_AddObject(m, names[j], (PyObject *)types[j])) { Py_DECREF(types[j]); return -1; }
    }
    return 0;
}
