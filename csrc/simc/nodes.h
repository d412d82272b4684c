/* The engine's node arrays owned by C (pipert/sim/graph.py describes what they hold):
 *   Ints    kind, indeg      typed int64 arrays
 *   Floats  dur, lat         typed double arrays
 *   Succ    succ             out-edges per node, ``dst << 1 | uses_end1``, in insertion order
 * Each reads and grows like the Python list the pure path uses (len, [i], [i] = x, append,
 * iteration, count, == against lists), so one Builder and every consumer run on either; ``walk``
 * and ``longest_path`` (simc.c) use the arrays directly. Succ keeps one edge pool: node n's edges
 * are the chain head[n] -> next[...] -> -1, appended at tail[n]. */
#ifndef PIPERT_SIMC_NODES_H
#define PIPERT_SIMC_NODES_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject_HEAD
    Py_ssize_t n, cap;
    int is_float;
    union { double *d; long long *i; } v;
} Arr;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n, cap, ne, ecap;
    long long *head, *tail, *cnt;   /* per node */
    long long *dst, *next;          /* per edge */
} Succ;

extern PyTypeObject Ints_Type, Floats_Type, Succ_Type;

int arr_grow(Arr *a);
int succ_grow_nodes(Succ *s);
int succ_grow_edges(Succ *s);
int nodes_add_types(PyObject *module);

static inline int arr_push_i(Arr *a, long long x) {
    if (a->n == a->cap && arr_grow(a)) return -1;
    a->v.i[a->n++] = x;
    return 0;
}

static inline int arr_push_d(Arr *a, double x) {
    if (a->n == a->cap && arr_grow(a)) return -1;
    a->v.d[a->n++] = x;
    return 0;
}

/* a new node without edges; its index, or -1 */
static inline Py_ssize_t succ_push(Succ *s) {
    if (s->n == s->cap && succ_grow_nodes(s)) return -1;
    s->head[s->n] = s->tail[s->n] = -1;
    s->cnt[s->n] = 0;
    return s->n++;
}

/* succ[p].append(e) for a node p < s->n */
static inline int succ_add(Succ *s, Py_ssize_t p, long long e) {
    if (s->ne == s->ecap && succ_grow_edges(s)) return -1;
    Py_ssize_t k = s->ne++;
    s->dst[k] = e;
    s->next[k] = -1;
    if (s->tail[p] < 0) s->head[p] = k; else s->next[s->tail[p]] = k;
    s->tail[p] = k;
    s->cnt[p]++;
    return 0;
}
#endif
