/* The walk's value state owned by C (pipert/sim/values.py describes what it holds):
 *   IntMap    have   value key -> node that produced it (int64 -> int64)
 *   FloatMap  live   counted value key -> its size (int64 -> double)
 *   IntMap    fwd, bwd, wdone   (unit, micro-batch) -> where its F, B/D, W ran (the Builder's tables)
 *   IntMap    tx_prod           transfer node -> node that produced the value it sends (Graph.tx_prod)
 * Each reads and changes like the dict the pure path uses (len, [k], [k] = x, del [k], k in m,
 * get, pop, ==, pickling), so the Builder's Python code and a Graph's readers run on either; ``walk`` (simc.c) uses them directly,
 * without an int object per key. Iteration and values() go in key order, not insertion order.
 * Open addressing, linear probing, at most half full, deletion by backward shift (no tombstones). */
#ifndef PIPERT_SIMC_VALMAP_H
#define PIPERT_SIMC_VALMAP_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef union { long long i; double d; } VVal;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n, cap;   /* cap: 0 or a power of two */
    int bits, is_float;
    long long *keys;
    VVal *vals;
    unsigned char *used;
} VMap;

extern PyTypeObject IntMap_Type, FloatMap_Type;

int vm_grow(VMap *m);
void vm_remove_at(VMap *m, Py_ssize_t j);
int valmap_add_types(PyObject *module);

static inline Py_ssize_t vm_home(const VMap *m, long long k) {
    return (Py_ssize_t)(((uint64_t)k * 0x9E3779B97F4A7C15ull) >> (64 - m->bits));
}

/* the slot of key k, or -1 */
static inline Py_ssize_t vm_find(const VMap *m, long long k) {
    if (!m->cap) return -1;
    Py_ssize_t mask = m->cap - 1;
    for (Py_ssize_t j = vm_home(m, k);; j = (j + 1) & mask) {
        if (!m->used[j]) return -1;
        if (m->keys[j] == k) return j;
    }
}

/* the slot of key k, made (value unset) where it is absent; -1 on error */
static inline Py_ssize_t vm_slot(VMap *m, long long k) {
    if ((m->n + 1) * 2 > m->cap && vm_grow(m)) return -1;
    Py_ssize_t mask = m->cap - 1, j = vm_home(m, k);
    for (; m->used[j]; j = (j + 1) & mask)
        if (m->keys[j] == k) return j;
    m->used[j] = 1;
    m->keys[j] = k;
    m->n++;
    return j;
}

/* m[k] = v; 0, or -1 on error */
static inline int vm_set_i(VMap *m, long long k, long long v) {
    Py_ssize_t j = vm_slot(m, k);
    if (j < 0) return -1;
    m->vals[j].i = v;
    return 0;
}

static inline int vm_set_d(VMap *m, long long k, double v) {
    Py_ssize_t j = vm_slot(m, k);
    if (j < 0) return -1;
    m->vals[j].d = v;
    return 0;
}
#endif
