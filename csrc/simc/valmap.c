/* pipert._simc's value maps: IntMap and FloatMap (see valmap.h). */
#include "valmap.h"

int vm_grow(VMap *m) {
    Py_ssize_t cap = m->cap ? m->cap * 2 : 16;
    int bits = 0;
    while (((Py_ssize_t)1 << bits) < cap) bits++;
    long long *keys = PyMem_Malloc((size_t)cap * sizeof *keys);
    VVal *vals = PyMem_Malloc((size_t)cap * sizeof *vals);
    unsigned char *used = PyMem_Calloc((size_t)cap, 1);
    if (!keys || !vals || !used) {
        PyMem_Free(keys); PyMem_Free(vals); PyMem_Free(used);
        PyErr_NoMemory();
        return -1;
    }
    VMap old = *m;
    m->keys = keys, m->vals = vals, m->used = used, m->cap = cap, m->bits = bits, m->n = 0;
    for (Py_ssize_t j = 0; j < old.cap; j++)
        if (old.used[j]) {
            Py_ssize_t s = vm_slot(m, old.keys[j]);   /* cannot fail: the new table has room */
            m->vals[s] = old.vals[j];
        }
    PyMem_Free(old.keys); PyMem_Free(old.vals); PyMem_Free(old.used);
    return 0;
}

/* Empties slot j, moving later entries of its probe run back (an entry at slot i may fill the
 * hole h unless its home lies cyclically in (h, i]). */
void vm_remove_at(VMap *m, Py_ssize_t j) {
    Py_ssize_t mask = m->cap - 1, hole = j;
    for (Py_ssize_t i = (j + 1) & mask; m->used[i]; i = (i + 1) & mask) {
        Py_ssize_t home = vm_home(m, m->keys[i]);
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            m->keys[hole] = m->keys[i];
            m->vals[hole] = m->vals[i];
            hole = i;
        }
    }
    m->used[hole] = 0;
    m->n--;
}

static PyObject *vm_new(PyTypeObject *t, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_Format(PyExc_TypeError, "%s() takes no arguments (an empty map)", t->tp_name);
        return NULL;
    }
    VMap *m = (VMap *)t->tp_alloc(t, 0);
    if (m) m->is_float = t == &FloatMap_Type;
    return (PyObject *)m;
}

static void vm_dealloc(VMap *m) {
    PyMem_Free(m->keys); PyMem_Free(m->vals); PyMem_Free(m->used);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

/* key as int64: 0; 1 for an int beyond int64 (absent from every map); -1 on error (not an int) */
static int as_key(PyObject *key, long long *k) {
    if (!PyLong_Check(key)) {
        PyErr_Format(PyExc_TypeError, "value maps take int keys, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    int overflow;
    *k = PyLong_AsLongLongAndOverflow(key, &overflow);
    if (*k == -1 && PyErr_Occurred()) return -1;
    return overflow ? 1 : 0;
}

/* slot of key (-1 absent, -2 error) */
static Py_ssize_t lookup(VMap *m, PyObject *key) {
    long long k;
    int rc = as_key(key, &k);
    return rc < 0 ? -2 : rc ? -1 : vm_find(m, k);
}

static PyObject *value_at(VMap *m, Py_ssize_t j) {
    return m->is_float ? PyFloat_FromDouble(m->vals[j].d) : PyLong_FromLongLong(m->vals[j].i);
}

static Py_ssize_t vm_len(VMap *m) { return m->n; }

static PyObject *vm_getitem(VMap *m, PyObject *key) {
    Py_ssize_t j = lookup(m, key);
    if (j == -1) PyErr_SetObject(PyExc_KeyError, key);
    return j < 0 ? NULL : value_at(m, j);
}

static int vm_setitem(VMap *m, PyObject *key, PyObject *x) {
    if (!x) {   /* del m[key] */
        Py_ssize_t j = lookup(m, key);
        if (j == -1) PyErr_SetObject(PyExc_KeyError, key);
        if (j < 0) return -1;
        vm_remove_at(m, j);
        return 0;
    }
    long long k;
    int rc = as_key(key, &k);
    if (rc) {
        if (rc > 0) PyErr_SetString(PyExc_OverflowError, "value map key beyond int64");
        return -1;
    }
    if (m->is_float) {
        double d = PyFloat_AsDouble(x);
        return d == -1.0 && PyErr_Occurred() ? -1 : vm_set_d(m, k, d);
    }
    long long v = PyLong_AsLongLong(x);
    return v == -1 && PyErr_Occurred() ? -1 : vm_set_i(m, k, v);
}

static int vm_contains(VMap *m, PyObject *key) {
    Py_ssize_t j = lookup(m, key);
    return j == -2 ? -1 : j >= 0;
}

/* get(key, default=None) */
static PyObject *vm_get(VMap *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) { PyErr_SetString(PyExc_TypeError, "get(key, default=None)"); return NULL; }
    Py_ssize_t j = lookup(m, args[0]);
    if (j == -2) return NULL;
    if (j < 0) return Py_NewRef(nargs == 2 ? args[1] : Py_None);
    return value_at(m, j);
}

/* pop(key[, default]) */
static PyObject *vm_pop(VMap *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) { PyErr_SetString(PyExc_TypeError, "pop(key[, default])"); return NULL; }
    Py_ssize_t j = lookup(m, args[0]);
    if (j == -2) return NULL;
    if (j < 0) {
        if (nargs == 2) return Py_NewRef(args[1]);
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    PyObject *v = value_at(m, j);
    if (v) vm_remove_at(m, j);
    return v;
}

/* {key: value} in key order */
static PyObject *vm_todict(VMap *m, PyObject *unused) {
    PyObject *keys = PyList_New(0), *out = PyDict_New();
    for (Py_ssize_t j = 0; keys && out && j < m->cap; j++) {
        if (!m->used[j]) continue;
        PyObject *k = PyLong_FromLongLong(m->keys[j]);
        if (!k || PyList_Append(keys, k)) Py_CLEAR(out);
        Py_XDECREF(k);
    }
    if (keys && out && PyList_Sort(keys)) Py_CLEAR(out);
    for (Py_ssize_t j = 0; keys && out && j < PyList_GET_SIZE(keys); j++) {
        PyObject *k = PyList_GET_ITEM(keys, j), *v = vm_getitem(m, k);
        if (!v || PyDict_SetItem(out, k, v)) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    if (!keys) Py_CLEAR(out);
    Py_XDECREF(keys);
    return out;
}

/* [key, ...] in key order (iteration order, so that values() follows it) */
static PyObject *sorted_keys(VMap *m) {
    PyObject *keys = PyList_New(0);
    for (Py_ssize_t j = 0; keys && j < m->cap; j++) {
        if (!m->used[j]) continue;
        PyObject *k = PyLong_FromLongLong(m->keys[j]);
        if (!k || PyList_Append(keys, k)) Py_CLEAR(keys);
        Py_XDECREF(k);
    }
    if (keys && PyList_Sort(keys)) Py_CLEAR(keys);
    return keys;
}

static PyObject *vm_iter(VMap *m) {
    PyObject *keys = sorted_keys(m), *it = keys ? PyObject_GetIter(keys) : NULL;
    Py_XDECREF(keys);
    return it;
}

static PyObject *vm_values(VMap *m, PyObject *unused) {
    PyObject *keys = sorted_keys(m), *out = keys ? PyList_New(PyList_GET_SIZE(keys)) : NULL;
    for (Py_ssize_t j = 0; out && j < PyList_GET_SIZE(keys); j++) {
        PyObject *v = vm_getitem(m, PyList_GET_ITEM(keys, j));
        if (!v) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, j, v);
    }
    Py_XDECREF(keys);
    return out;
}

/* == and != against a value map or a dict: as dicts (todict) */
static PyObject *vm_richcompare(PyObject *self, PyObject *other, int op) {
    int mine = Py_IS_TYPE(other, &IntMap_Type) || Py_IS_TYPE(other, &FloatMap_Type);
    if ((op != Py_EQ && op != Py_NE) || !(mine || PyDict_Check(other))) Py_RETURN_NOTIMPLEMENTED;
    PyObject *x = vm_todict((VMap *)self, NULL), *y = mine ? vm_todict((VMap *)other, NULL) : Py_NewRef(other);
    PyObject *res = x && y ? PyObject_RichCompare(x, y, op) : NULL;
    Py_XDECREF(x); Py_XDECREF(y);
    return res;
}

/* pickled and copied as an empty map of its type, then its items set (as a dict's subclass is) */
static PyObject *vm_reduce(VMap *m, PyObject *unused) {
    PyObject *d = vm_todict(m, NULL), *items = d ? PyObject_CallMethod(d, "items", NULL) : NULL;
    PyObject *it = items ? PyObject_GetIter(items) : NULL, *res = NULL;
    if (it) res = Py_BuildValue("(O()OOO)", (PyObject *)Py_TYPE(m), Py_None, Py_None, it);
    Py_XDECREF(d); Py_XDECREF(items); Py_XDECREF(it);
    return res;
}

static PyObject *vm_repr(VMap *m) {
    PyObject *d = vm_todict(m, NULL), *r = d ? PyUnicode_FromFormat("%s(%R)", Py_TYPE(m)->tp_name, d) : NULL;
    Py_XDECREF(d);
    return r;
}

static PyMethodDef vm_methods[] = {
    {"get", (PyCFunction)(void (*)(void))vm_get, METH_FASTCALL, "get(key, default=None)"},
    {"pop", (PyCFunction)(void (*)(void))vm_pop, METH_FASTCALL, "pop(key[, default]): the value, removed"},
    {"todict", (PyCFunction)vm_todict, METH_NOARGS, "the entries as a dict, in key order"},
    {"values", (PyCFunction)vm_values, METH_NOARGS, "the values as a list, in key order (as iteration)"},
    {"__reduce__", (PyCFunction)vm_reduce, METH_NOARGS, "pickled as its items"},
    {NULL, NULL, 0, NULL}};

static PyMappingMethods vm_mapping = {.mp_length = (lenfunc)vm_len, .mp_subscript = (binaryfunc)vm_getitem,
                                      .mp_ass_subscript = (objobjargproc)vm_setitem};
static PySequenceMethods vm_seq = {.sq_contains = (objobjproc)vm_contains};

#define VM_TYPE(NAME, DOC) {PyVarObject_HEAD_INIT(NULL, 0) .tp_name = "pipert._simc." NAME, \
    .tp_basicsize = sizeof(VMap), .tp_flags = Py_TPFLAGS_DEFAULT, .tp_doc = DOC, .tp_new = vm_new, \
    .tp_dealloc = (destructor)vm_dealloc, .tp_as_mapping = &vm_mapping, .tp_as_sequence = &vm_seq, \
    .tp_methods = vm_methods, .tp_repr = (reprfunc)vm_repr, .tp_hash = PyObject_HashNotImplemented, \
    .tp_iter = (getiterfunc)vm_iter, .tp_richcompare = vm_richcompare}
PyTypeObject IntMap_Type = VM_TYPE("IntMap", "int64 key -> int64, read and changed as a dict (the walk's have).");
PyTypeObject FloatMap_Type = VM_TYPE("FloatMap", "int64 key -> double, read and changed as a dict (the walk's live).");

int valmap_add_types(PyObject *m) {
    PyTypeObject *types[] = {&IntMap_Type, &FloatMap_Type};
    const char *names[] = {"IntMap", "FloatMap"};
    for (int j = 0; j < 2; j++) {
        if (PyType_Ready(types[j])) return -1;
        Py_INCREF(types[j]);
        if (PyModule_AddObject(m, names[j], (PyObject *)types[j])) { Py_DECREF(types[j]); return -1; }
    }
    return 0;
}
