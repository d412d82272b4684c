/* pipert._simc: the simulator's hot loops in C, against the plain Python C API (no torch).
 *
 *   longest_path  mirrors pipert/sim/timing.py:run_timing's sweep (Kahn's algorithm, stack order);
 *   walk          mirrors the common case of pipert/sim/values.py:Builder.run: plain computes
 *                 (Builder.plain_compute) and messages whose recorded one-value plan applies;
 *   message_action builds an Action as pipert/ir/action.py:message_action does (lowering's
 *                 hundreds of thousands of messages).
 *
 * The node arrays (kind, dur, lat, succ, indeg) and the walk's value maps (have, live) are C-owned
 * where this module is loaded (nodes.h, valmap.h, pipert.native.node_arrays and value_maps): the
 * loops use them directly. Everything else they read and write is
 * the Python objects the Python code uses, in the same order, with the same IEEE double
 * arithmetic, so their results are identical to the pure path's. ``walk`` stops
 * BEFORE changing anything at the first action it does not cover and returns its index; the
 * Python walk then runs that action and calls ``walk`` again from the next one. Rare paths inside
 * a covered action (a missing input, a duplicate, a new weight-gradient buffer, a mismatch, the
 * memory limit) call the Builder's own Python methods.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>

#include "nodes.h"
#include "valmap.h"

#define SHIFT 5        /* pipert/sim/keys.py */
#define MISSING (-2)
#define STOP 1         /* walk: the action is the Python walk's; nothing was changed */
#define DONE 0
#define CACHE 8        /* walk's lookups kept per call (a rank's few message and compute kinds) */

/* ------------------------------------------------------------------------------------------ */
/* longest_path(dur, lat, succ, indeg) -> (start, end0, end1, order, indeg left)               */

static PyObject *float_list(const double *v, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t j = 0; out && j < n; j++) {
        PyObject *x = PyFloat_FromDouble(v[j]);
        if (!x) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, j, x);
    }
    return out;
}

static PyObject *long_list(const long long *v, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t j = 0; out && j < n; j++) {
        PyObject *x = PyLong_FromLongLong(v[j]);
        if (!x) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, j, x);
    }
    return out;
}

/* on the node arrays (nodes.h), which it leaves as they are */
static PyObject *longest_path(PyObject *mod, PyObject *args) {
    Arr *dur_a, *lat_a, *indeg_a;
    Succ *succ;
    PyObject *res = NULL;
    if (!PyArg_ParseTuple(args, "O!O!O!O!", &Floats_Type, &dur_a, &Floats_Type, &lat_a, &Succ_Type, &succ,
                          &Ints_Type, &indeg_a))
        return NULL;
    Py_ssize_t n = dur_a->n;
    if (lat_a->n != n || succ->n != n || indeg_a->n != n) {
        PyErr_SetString(PyExc_ValueError, "longest_path: dur, lat, succ and indeg differ in length");
        return NULL;
    }
    const double *dur = dur_a->v.d, *lat = lat_a->v.d;
    size_t m = (size_t)(n ? n : 1);
    double *ready = PyMem_Calloc(m, sizeof(double)), *end0 = PyMem_Calloc(m, sizeof(double));
    double *end1 = PyMem_Calloc(m, sizeof(double));
    long long *indeg = PyMem_Malloc(m * sizeof(long long)), *stack = PyMem_Malloc(m * sizeof(long long));
    long long *order = PyMem_Malloc(m * sizeof(long long));
    if (!ready || !end0 || !end1 || !indeg || !stack || !order) { PyErr_NoMemory(); goto done; }
    Py_ssize_t top = 0, seen = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        indeg[j] = indeg_a->v.i[j];
        if (!indeg[j]) stack[top++] = j;   /* ascending, popped from the top: as the Python list */
    }
    while (top) {
        long long v = stack[--top];
        order[seen++] = v;
        double e0 = ready[v] + dur[v], e1 = e0 + lat[v];
        end0[v] = e0;
        end1[v] = e1;
        for (long long k = succ->head[v]; k >= 0; k = succ->next[k]) {
            long long x = succ->dst[k], w = x >> 1;
            if (w < 0 || w >= n) { PyErr_SetString(PyExc_IndexError, "longest_path: edge to no node"); goto done; }
            double t = (x & 1) ? e1 : e0;
            if (t > ready[w]) ready[w] = t;
            if (!--indeg[w]) stack[top++] = w;
        }
    }
    {
        PyObject *a = float_list(ready, n), *b = float_list(end0, n), *c = float_list(end1, n);
        PyObject *d = long_list(order, seen), *e = long_list(indeg, n);
        if (a && b && c && d && e) res = PyTuple_Pack(5, a, b, c, d, e);
        Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(c); Py_XDECREF(d); Py_XDECREF(e);
    }
done:
    PyMem_Free(ready); PyMem_Free(end0); PyMem_Free(end1);
    PyMem_Free(indeg); PyMem_Free(stack); PyMem_Free(order);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* walk: Builder.run's loop over one rank's actions, common case                               */

static PyObject *s_op, *s_unit, *s_mb, *s_payload, *s_peer, *s_sub, *s_tag, *s_zclass, *s_host, *s_mem,
    *s_use, *s_mark_done, *s_add_wgrad, *s_mismatch, *s_memory_error;

/* The walked rank's state: borrowed from the Builder (kept alive by it) for one call. */
typedef struct {
    PyObject *b, *r_obj;
    long r;
    PyObject *kind, *dur, *lat, *succ, *indeg, *comm_in, *tx_prod;   /* CommState's arrays */
    Arr *kinds, *durs, *lats, *indegs;   /* the node arrays (nodes.h): kind, dur, lat, indeg */
    Succ *edges;                         /* and succ */
    VMap *haves, *lives;                 /* have and live (valmap.h) */
    PyObject *have, *live, *wg, *ends, *messages, *cplans;          /* the rank's walk state */
    PyObject *q_of, *plain_ops, *send_op, *ctime;                    /* constants (walk's ctx) */
    PyObject *nodes_r, *cq;
    /* lookups of this call, by value: a dict entry is added only by the Python walk, never
     * replaced, so an entry seen once holds for the rest of the call (borrowed references) */
    struct { PyObject *payload; long long unit, peer_side; long q; PyObject *end, *one; } mcache[CACHE];
    struct { PyObject *op; long long unit; PyObject *plan; } ccache[CACHE];
    struct { PyObject *op; long q; int plain; } ocache[CACHE];   /* q_of[op], op in plain_ops */
    struct { PyObject *op, *dur; } dcache[CACHE];                  /* ctime[op] where ctime is a dict */
    int mnext, cnext, onext, dnext;
    long long host;   /* Builder.host, written back before any callback and at the end */
    double mem;       /* Builder.mem, likewise (a callback may change it: re-read after) */
    double busy;
} Walk;

/* PyLong_AsLong: 64 bits here (checked at import), and without PyLong_AsLongLong's byte-array
 * path for the many keys above 2**30 */
static long long as_ll(PyObject *x) { return PyLong_AsLong(x); }

/* Action's slots in its field order (set by bind_action) */
#define N_SLOTS 13
enum { F_OP, F_UNIT, F_MB, F_PAYLOAD, F_PEER, F_GROUP, F_ROOT, F_TAG, F_SUB, F_WAITS, F_ZCLASS, F_SIDE };
static PyTypeObject *action_type;
static PyMemberDef *slots[N_SLOTS];

/* a.<name> (new reference), field j of Action read from its slot where a is exactly an Action */
static PyObject *field(PyObject *a, int j, PyObject *name) {
    if (Py_TYPE(a) == action_type) {
        PyObject *v = *(PyObject **)((char *)a + slots[j]->offset);
        if (v) return Py_NewRef(v);
    }
    return PyObject_GetAttr(a, name);
}
#define ERR_LL(v) ((v) == -1 && PyErr_Occurred())

static int append_ll(PyObject *list, long long v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) return -1;
    int rc = PyList_Append(list, x);
    Py_DECREF(x);
    return rc;
}

/* indeg[n] += 1 */
static int bump(Walk *w, long long n) {
    w->indegs->v.i[n]++;
    return 0;
}

/* succ[p].append(n << 1 | arrival) */
static int edge(Walk *w, long long p, long long n, int arrival) {
    return succ_add(w->edges, p, n << 1 | arrival);
}

/* node(kind, dur, lat) with ``indeg`` in-edges to come: its index, or -1 */
static long long new_node(Walk *w, long long kind, double dur, double lat, long long indeg) {
    long long n = w->kinds->n;
    if (arr_push_i(w->kinds, kind) || arr_push_d(w->durs, dur) || arr_push_d(w->lats, lat) ||
        arr_push_i(w->indegs, indeg) || succ_push(w->edges) < 0)
        return -1;
    return n;
}

static int sync_out(Walk *w) {
    PyObject *h = PyLong_FromLongLong(w->host), *m = PyFloat_FromDouble(w->mem);
    int rc = (!h || !m) ? -1 : (PyObject_SetAttr(w->b, s_host, h) || PyObject_SetAttr(w->b, s_mem, m)) ? -1 : 0;
    Py_XDECREF(h); Py_XDECREF(m);
    return rc;
}

static int sync_in(Walk *w) {
    PyObject *m = PyObject_GetAttr(w->b, s_mem);
    if (!m) return -1;
    w->mem = PyFloat_AsDouble(m);
    Py_DECREF(m);
    return (w->mem == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* self.<method>(*args) with host and mem written back first and mem re-read after. */
static int callback(Walk *w, PyObject *name, PyObject *args) {
    if (!args || sync_out(w)) { Py_XDECREF(args); return -1; }
    PyObject *f = PyObject_GetAttr(w->b, name), *res = f ? PyObject_Call(f, args, NULL) : NULL;
    Py_XDECREF(f); Py_DECREF(args);
    if (!res) return -1;
    Py_DECREF(res);
    return sync_in(w);
}

/* self.use(r, i, k, n, compute) */
static int use(Walk *w, Py_ssize_t i, long long k, long long n, int compute) {
    return callback(w, s_use, Py_BuildValue("(OnLLO)", w->r_obj, i, k, n, compute ? Py_True : Py_False));
}

/* (x, y) */
static PyObject *pack_ll2(long long x, long long y) {
    PyObject *t = PyTuple_New(2), *a = PyLong_FromLongLong(x), *b = PyLong_FromLongLong(y);
    if (!t || !a || !b) { Py_XDECREF(t); Py_XDECREF(a); Py_XDECREF(b); return NULL; }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, b);
    return t;
}

/* have.get(k, MISSING) */
static long long have_get(Walk *w, long long k) {
    Py_ssize_t j = vm_find(w->haves, k);
    return j < 0 ? MISSING : w->haves->vals[j].i;
}

/* del have[k]; mem -= live.pop(k, 0.0) */
static int release(Walk *w, long long k) {
    Py_ssize_t j = vm_find(w->haves, k);
    if (j < 0) {
        PyObject *key = PyLong_FromLongLong(k);
        if (key) PyErr_SetObject(PyExc_KeyError, key);
        Py_XDECREF(key);
        return -1;
    }
    vm_remove_at(w->haves, j);
    if ((j = vm_find(w->lives, k)) >= 0) {
        w->mem -= w->lives->vals[j].d;
        vm_remove_at(w->lives, j);
    }
    return 0;
}

/* have[k] = n; a counted size (not None) joins the running sum once: live[k] = size */
static int write_value(Walk *w, long long k, long long n, PyObject *size) {
    if (vm_set_i(w->haves, k, n)) return -1;
    if (size == Py_None || vm_find(w->lives, k) >= 0) return 0;
    double x = PyFloat_AsDouble(size);
    if (x == -1.0 && PyErr_Occurred()) return -1;
    w->mem += x;
    return vm_set_d(w->lives, k, x);
}

/* Builder.plain_compute's body from its compiled plan (reads, writes, wgrads, table, d_bit). */
static int plain_compute(Walk *w, PyObject *a, Py_ssize_t i, long long n, PyObject *n_obj, PyObject *mb,
                         PyObject *u_obj, PyObject *plan) {
    PyObject *reads = PyTuple_GET_ITEM(plan, 0), *writes = PyTuple_GET_ITEM(plan, 1);
    PyObject *wgrads = PyTuple_GET_ITEM(plan, 2), *table = PyTuple_GET_ITEM(plan, 3);
    PyObject *d_bit = PyTuple_GET_ITEM(plan, 4);
    long long m = as_ll(PyTuple_GET_ITEM(mb, 0));
    if (ERR_LL(m)) return -1;
    long long mk = m << SHIFT;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(reads); j++) {   /* (key, per micro-batch, release) */
        PyObject *ref = PyTuple_GET_ITEM(reads, j);
        long long kb = as_ll(PyTuple_GET_ITEM(ref, 0)), p;
        if (ERR_LL(kb)) return -1;
        long long k = PyObject_IsTrue(PyTuple_GET_ITEM(ref, 1)) ? kb | mk : kb;
        p = have_get(w, k);
        int rc = 0;
        if (p == MISSING) {
            rc = use(w, i, k, n, 1);
        } else {
            if (p >= 0) {   /* a value from another queue: an edge, communicated input */
                int other = w->kinds->v.i[p] != 0;
                if (other) {
                    PyObject *pair = pack_ll2(n, p);
                    rc = (!pair || edge(w, p, n, 1) || bump(w, n) || PyList_Append(w->comm_in, pair)) ? -1 : 0;
                    Py_XDECREF(pair);
                }
            }
            if (!rc && PyObject_IsTrue(PyTuple_GET_ITEM(ref, 2))) rc = release(w, k);
        }
        if (rc) return -1;
    }
    if (table != Py_None) {   /* once per (unit, micro-batch): the first run's location */
        long long u = as_ll(u_obj);
        if (ERR_LL(u)) return -1;
        long long loc = (long long)w->r << 32 | i;
        if (d_bit != Py_None) {
            long long bit = as_ll(d_bit);
            if (ERR_LL(bit)) return -1;
            loc = loc << 1 | bit;
        }
        if (Py_IS_TYPE(table, &IntMap_Type)) {   /* the Builder's table as a value map (valmap.h) */
            VMap *t = (VMap *)table;
            if (vm_find(t, u << 32 | m) < 0) {
                if (vm_set_i(t, u << 32 | m, loc)) return -1;
            } else if (callback(w, s_mark_done, Py_BuildValue("(OOn)", a, w->r_obj, i))) {
                return -1;
            }
        } else {   /* a dict */
            PyObject *fk = PyLong_FromLongLong(u << 32 | m);
            if (!fk) return -1;
            int in = PyDict_Contains(table, fk), rc;
            if (in < 0) rc = -1;
            else if (in) rc = callback(w, s_mark_done, Py_BuildValue("(OOn)", a, w->r_obj, i));
            else {
                PyObject *v = PyLong_FromLongLong(loc);
                rc = (!v || PyDict_SetItem(table, fk, v)) ? -1 : 0;
                Py_XDECREF(v);
            }
            Py_DECREF(fk);
            if (rc) return -1;
        }
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(writes); j++) {   /* (key, per micro-batch, size) */
        PyObject *ref = PyTuple_GET_ITEM(writes, j);
        long long kb = as_ll(PyTuple_GET_ITEM(ref, 0));
        if (ERR_LL(kb)) return -1;
        if (write_value(w, PyObject_IsTrue(PyTuple_GET_ITEM(ref, 1)) ? kb | mk : kb, n, PyTuple_GET_ITEM(ref, 2)))
            return -1;
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(wgrads); j++) {   /* (unit, shard, slot) */
        PyObject *key = PyTuple_GET_ITEM(wgrads, j);
        PyObject *st = PyDict_GetItemWithError(w->wg, key);
        if (!st && PyErr_Occurred()) return -1;
        long long last = st ? as_ll(PyList_GET_ITEM(st, 2)) : -1;
        if (ERR_LL(last)) return -1;
        if (st && last >= 0) {   /* add_wgrad to a local accumulator that exists */
            PyObject *local = PyList_GET_ITEM(st, 0);
            if (PyList_SetSlice(local, PyList_GET_SIZE(local), PyList_GET_SIZE(local), mb)) return -1;
            Py_INCREF(n_obj);
            if (PyList_SetItem(st, 2, n_obj)) return -1;
        } else if (callback(w, s_add_wgrad, Py_BuildValue("(OOOOOO)", a, w->r_obj, n_obj, PyTuple_GET_ITEM(key, 0),
                                                          PyTuple_GET_ITEM(key, 1), PyTuple_GET_ITEM(key, 2)))) {
            return -1;
        }
    }
    return 0;
}

/* A compute-queue action: STOP unless it is a timed unit compute of one micro-batch, no sub-block,
 * whose plan compiled (Builder._compute_plans) and whose cost is a float. */
static int compute(Walk *w, PyObject *a, PyObject *op, Py_ssize_t i) {
    int rc = STOP;
    PyObject *sub = NULL, *mb = NULL, *u = NULL, *key = NULL, *d = NULL, *n_obj = NULL;
    if (!(sub = field(a, F_SUB, s_sub)) || !(mb = field(a, F_MB, s_mb)) || !(u = field(a, F_UNIT, s_unit)))
        goto fail;
    if (sub != Py_None || !PyTuple_Check(mb) || PyTuple_GET_SIZE(mb) != 1) goto out;
    if (!PyLong_CheckExact(u)) goto out;
    long long uv = as_ll(u);
    if (ERR_LL(uv)) goto fail;
    PyObject *plan = NULL;
    for (int c = 0; c < CACHE; c++)
        if (w->ccache[c].op == op && w->ccache[c].unit == uv) {
            plan = w->ccache[c].plan;
            break;
        }
    if (!plan) {   /* _compute_plans.get((op, unit, False)) */
        if (!(key = PyTuple_Pack(3, op, u, Py_False))) goto fail;
        plan = PyDict_GetItemWithError(w->cplans, key);
        if (!plan) { if (PyErr_Occurred()) goto fail; goto out; }
        if (!PyTuple_Check(plan)) goto out;   /* None: the plan does not compile */
        int c = w->cnext++ % CACHE;
        w->ccache[c].op = op, w->ccache[c].unit = uv, w->ccache[c].plan = plan;
    }
    if (PyDict_CheckExact(w->ctime)) {   /* {op: duration} (UniformCost.op_times), each op looked up once */
        for (int c = 0; c < w->dnext && !d; c++)
            if (w->dcache[c].op == op) d = w->dcache[c].dur;
        if (!d) {
            if (!(d = PyDict_GetItemWithError(w->ctime, op))) { if (PyErr_Occurred()) goto fail; goto out; }
            if (w->dnext < CACHE) w->dcache[w->dnext].op = op, w->dcache[w->dnext++].dur = d;
        }
        Py_INCREF(d);
    } else if (!(d = PyObject_CallFunctionObjArgs(w->ctime, a, w->r_obj, NULL))) {
        goto fail;
    }
    if (!PyFloat_CheckExact(d)) goto out;
    /* the compute node, chained after the rank's last compute-queue node */
    long long n = new_node(w, 0, PyFloat_AS_DOUBLE(d), 0.0, w->host >= 0);
    if (n < 0) goto fail;
    if (w->host >= 0 && edge(w, w->host, n, 0)) goto fail;
    w->host = n;
    w->busy += PyFloat_AS_DOUBLE(d);
    if (!(n_obj = PyLong_FromLongLong(n))) goto fail;
    Py_INCREF(n_obj);
    if (PyList_SetItem(w->nodes_r, i, n_obj) || PyList_Append(w->cq, n_obj)) goto fail;
    rc = plain_compute(w, a, i, n, n_obj, mb, u, plan) ? -1 : DONE;
    goto out;
fail:
    rc = -1;
out:
    Py_XDECREF(sub); Py_XDECREF(mb); Py_XDECREF(u); Py_XDECREF(key); Py_XDECREF(d); Py_XDECREF(n_obj);
    return rc;
}

/* fa.<name> != a.<name> */
static int differs(PyObject *fa, PyObject *a, int j, PyObject *name) {
    PyObject *x = field(fa, j, name), *y = x ? field(a, j, name) : NULL;
    int rc = y ? PyObject_RichCompareBool(x, y, Py_NE) : -1;
    Py_XDECREF(x); Py_XDECREF(y);
    return rc;
}

/* ck == (payload, u, nmb or 1, zc): CommState.p2p's cost key against the link's last (ck), without
 * building the tuple (1, 0, or -1 on error) */
static int same_cost_key(PyObject *ck, PyObject *payload, PyObject *u, Py_ssize_t nmb, PyObject *zc) {
    if (!PyTuple_Check(ck) || PyTuple_GET_SIZE(ck) != 4) return 0;
    PyObject *want[3] = {payload, u, zc}, *got[3] = {PyTuple_GET_ITEM(ck, 0), PyTuple_GET_ITEM(ck, 1),
                                                     PyTuple_GET_ITEM(ck, 3)};
    for (int j = 0; j < 3; j++) {
        int eq = PyObject_RichCompareBool(got[j], want[j], Py_EQ);
        if (eq <= 0) return eq;
    }
    PyObject *c = PyTuple_GET_ITEM(ck, 2);
    if (!PyLong_CheckExact(c)) return 0;
    long long cv = as_ll(c);
    return ERR_LL(cv) ? -1 : cv == (nmb ? nmb : 1);
}

/* CommState.p2p once its link end is known, for a message whose one-value plan is recorded:
 * returns the transfer node (-1 on error), or -2 (STOP) when the message would create a transfer
 * whose cost is not the link's last one. */
static long long p2p(Walk *w, PyObject *a, Py_ssize_t i, PyObject *end, PyObject *payload, PyObject *u,
                     PyObject *mb, int is_send) {
    PyObject *ls = PyTuple_GET_ITEM(end, 0);
    long long side = as_ll(PyTuple_GET_ITEM(end, 1));
    long long k = as_ll(PyList_GET_ITEM(ls, side));
    if (ERR_LL(side) || ERR_LL(k)) return -1;
    PyObject *tx = PyList_GET_ITEM(ls, 2), *firsts = PyList_GET_ITEM(ls, 3);
    Py_ssize_t ntx = PyList_GET_SIZE(tx);
    if (k >= ntx) {   /* this side creates the transfer: its cost must be the link's last one */
        PyObject *zc = field(a, F_ZCLASS, s_zclass);
        if (!zc) return -1;
        int same = same_cost_key(PyList_GET_ITEM(ls, 5), payload, u, PyTuple_GET_SIZE(mb), zc);
        Py_DECREF(zc);
        if (same < 0) return -1;
        if (!same) return -2;
    }
    PyObject *next = PyLong_FromLongLong(k + 1);
    if (!next || PyList_SetItem(ls, side, next)) return -1;
    if (k < ntx) {   /* the second side: check it against the first */
        long long n = as_ll(PyList_GET_ITEM(tx, k));
        PyObject *first = PyList_GET_ITEM(firsts, k);
        Py_INCREF(first);
        Py_INCREF(Py_None);
        if (ERR_LL(n) || PyList_SetItem(firsts, k, Py_None)) { Py_DECREF(first); return -1; }
        PyObject *fa = PyTuple_GET_ITEM(first, 0), *fp = field(fa, F_PAYLOAD, s_payload);
        int bad = fp ? fp != payload : -1;
        Py_XDECREF(fp);
        if (!bad) bad = differs(fa, a, F_UNIT, s_unit);
        if (!bad) bad = differs(fa, a, F_MB, s_mb);
        if (!bad) bad = differs(fa, a, F_TAG, s_tag);
        if (!bad) bad = differs(fa, a, F_ZCLASS, s_zclass);
        if (bad > 0)
            bad = callback(w, s_mismatch, Py_BuildValue("(OOnOLO)", a, w->r_obj, i, first, k,
                                                        is_send ? Py_True : Py_False));
        Py_DECREF(first);
        if (bad) return -1;
        if (w->host >= 0 && (edge(w, w->host, n, 0) || bump(w, n))) return -1;
        return n;
    }
    PyObject *cost = PyList_GET_ITEM(ls, 6);   /* (bytes, occupancy, latency) */
    double occ = PyFloat_AsDouble(PyTuple_GET_ITEM(cost, 1)), lat = PyFloat_AsDouble(PyTuple_GET_ITEM(cost, 2));
    if (((occ == -1.0 || lat == -1.0) && PyErr_Occurred())) return -1;
    long long n = new_node(w, 1, occ, lat, (ntx + 1 > 1) + (w->host >= 0));
    if (n < 0) return -1;
    PyObject *sent = PyNumber_Add(PyList_GET_ITEM(ls, 4), PyTuple_GET_ITEM(cost, 0));
    if (!sent || PyList_SetItem(ls, 4, sent)) return -1;
    if (ntx) {   /* link FIFO: this transfer starts after the previous one frees the link */
        long long prev = as_ll(PyList_GET_ITEM(tx, ntx - 1));
        if (ERR_LL(prev) || edge(w, prev, n, 0)) return -1;
    }
    PyObject *i_obj = PyLong_FromSsize_t(i), *where = i_obj ? PyTuple_Pack(3, a, w->r_obj, i_obj) : NULL;
    Py_XDECREF(i_obj);
    if (!where || append_ll(tx, n) || PyList_Append(firsts, where)) { Py_XDECREF(where); return -1; }
    Py_DECREF(where);
    if (w->host >= 0 && edge(w, w->host, n, 0)) return -1;
    return n;
}

/* A SEND/RECV: STOP unless its link end is known (Builder.ends) and its one-value plan recorded
 * (Builder.message_plans); then p2p and the plan inline, as Builder.run does. */
static int message(Walk *w, PyObject *a, PyObject *op, long q, Py_ssize_t i) {
    int rc = -1, is_send = op == w->send_op;
    PyObject *peer = NULL, *payload = NULL, *u = NULL, *mb = NULL, *ekey = NULL, *mkey = NULL, *n_obj = NULL;
    if (!(peer = field(a, F_PEER, s_peer)) || !(payload = field(a, F_PAYLOAD, s_payload)) ||
        !(u = field(a, F_UNIT, s_unit)) || !(mb = field(a, F_MB, s_mb)))
        goto out;
    if (!PyLong_CheckExact(peer) || !PyLong_CheckExact(u)) { rc = STOP; goto out; }
    long long pe = as_ll(peer), uv = as_ll(u);
    if (ERR_LL(pe) || ERR_LL(uv)) goto out;
    long long ps = pe << 1 | is_send;
    PyObject *end = NULL, *one = NULL;
    for (int c = 0; c < CACHE; c++)
        if (w->mcache[c].payload == payload && w->mcache[c].unit == uv && w->mcache[c].peer_side == ps &&
            w->mcache[c].q == q) {
            end = w->mcache[c].end, one = w->mcache[c].one;
            break;
        }
    if (!one) {   /* ends.get(peer << 1 | is SEND), message_plans.get((payload, unit, q)) */
        if (!(ekey = PyLong_FromLongLong(ps)) || !(mkey = Py_BuildValue("(OOl)", payload, u, q))) goto out;
        end = PyDict_GetItemWithError(w->ends, ekey);
        one = end ? PyDict_GetItemWithError(w->messages, mkey) : NULL;
        if (!one || !PyTuple_Check(mb)) { rc = PyErr_Occurred() ? -1 : STOP; goto out; }
        int c = w->mnext++ % CACHE;
        w->mcache[c].payload = payload, w->mcache[c].unit = uv, w->mcache[c].peer_side = ps, w->mcache[c].q = q;
        w->mcache[c].end = end, w->mcache[c].one = one;
    }
    long long n = p2p(w, a, i, end, payload, u, mb, is_send);
    if (n == -2) { rc = STOP; goto out; }
    if (n < 0 || !(n_obj = PyLong_FromLongLong(n))) goto out;
    Py_INCREF(n_obj);
    if (PyList_SetItem(w->nodes_r, i, n_obj)) goto out;
    int is_read = PyObject_IsTrue(PyTuple_GET_ITEM(one, 0));
    long long ku = as_ll(PyTuple_GET_ITEM(one, 1));
    if (ERR_LL(ku)) goto out;
    int rel = PyObject_IsTrue(PyTuple_GET_ITEM(one, 2));
    PyObject *size = PyTuple_GET_ITEM(one, 3);
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(mb); j++) {
        long long m = as_ll(PyTuple_GET_ITEM(mb, j)), p;
        if (ERR_LL(m)) goto out;
        long long k = ku | m << SHIFT;
        int bad = 0;
        if (!is_read) {   /* apply_writes of one per-micro-batch value */
            bad = write_value(w, k, n, size);
        } else {   /* comm_reads of one per-micro-batch value */
            p = have_get(w, k);
            if (p >= 0) {   /* tx_prod[n] = p: a value map (valmap.h) or a dict */
                bad = p != w->host && (edge(w, p, n, 1) || bump(w, n));
                if (!bad && Py_IS_TYPE(w->tx_prod, &IntMap_Type)) {
                    bad = vm_set_i((VMap *)w->tx_prod, n, p);
                } else if (!bad) {
                    PyObject *pv = PyLong_FromLongLong(p);
                    bad = !pv || PyDict_SetItem(w->tx_prod, n_obj, pv);
                    Py_XDECREF(pv);
                }
                if (!bad && rel) bad = release(w, k);
            } else if (p == MISSING) {
                bad = use(w, i, k, n, 0);
            } else if (rel) {
                bad = release(w, k);
            }
        }
        if (bad) goto out;
    }
    rc = DONE;
out:
    Py_XDECREF(peer); Py_XDECREF(payload); Py_XDECREF(u); Py_XDECREF(mb); Py_XDECREF(ekey); Py_XDECREF(mkey);
    Py_XDECREF(n_obj);
    return rc;
}

/* q_of[op] (-1: none, or an error) and whether op is in plain_ops, looked up once per op and call:
 * an Op's hash is a Python-level call, its identity is not (the members live as long as Op) */
static long op_info(Walk *w, PyObject *op, int *plain) {
    for (int c = 0; c < CACHE && c < w->onext; c++)
        if (w->ocache[c].op == op) {
            *plain = w->ocache[c].plain;
            return w->ocache[c].q;
        }
    PyObject *qo = PyDict_GetItemWithError(w->q_of, op);
    if (!qo) return -1;
    long q = PyLong_AsLong(qo);
    if (q == -1 && PyErr_Occurred()) return -1;
    int in = PySet_Contains(w->plain_ops, op);
    if (in < 0) return -1;
    *plain = in;
    if (w->onext < CACHE) {
        int c = w->onext++;
        w->ocache[c].op = op, w->ocache[c].q = q, w->ocache[c].plain = in;
    }
    return q;
}

static PyObject *attr(PyObject *b, const char *name) { return PyObject_GetAttrString(b, name); }

/* walk(builder, r, acts, i, busy, peak, over, limit, nodes_r, cq, trace, ctx) -> (next i, busy, peak, over)
 * ctx = (q_of, plain_ops, Op.SEND, cost.compute_time or its {op: duration} table). */
static PyObject *walk(PyObject *mod, PyObject *args) {
    Walk w;
    PyObject *acts, *limit, *trace, *ctx, *res = NULL;
    Py_ssize_t i;
    double peak;
    int over;
    memset(&w, 0, sizeof w);
    if (!PyArg_ParseTuple(args, "OOO!nddpOO!O!O!O!", &w.b, &w.r_obj, &PyList_Type, &acts, &i, &w.busy, &peak, &over,
                          &limit, &PyList_Type, &w.nodes_r, &PyList_Type, &w.cq, &PyList_Type, &trace, &PyTuple_Type,
                          &ctx))
        return NULL;
    if (PyTuple_GET_SIZE(ctx) != 4) { PyErr_SetString(PyExc_ValueError, "walk: ctx has 4 items"); return NULL; }
    w.r = PyLong_AsLong(w.r_obj);
    if (w.r == -1 && PyErr_Occurred()) return NULL;
    w.q_of = PyTuple_GET_ITEM(ctx, 0); w.plain_ops = PyTuple_GET_ITEM(ctx, 1);
    w.send_op = PyTuple_GET_ITEM(ctx, 2); w.ctime = PyTuple_GET_ITEM(ctx, 3);
    PyObject **own[] = {&w.kind, &w.dur, &w.lat, &w.succ, &w.indeg, &w.comm_in, &w.tx_prod, &w.have, &w.live, &w.wg,
                        &w.ends, &w.messages, &w.cplans};
    const char *names[] = {"kind", "dur", "lat", "succ", "indeg", "comm_in", "tx_prod", "have", "live", "wg", "ends",
                           "message_plans", "_compute_plans"};
    for (size_t j = 0; j < sizeof names / sizeof *names; j++)
        if (!(*own[j] = attr(w.b, names[j]))) goto out;
    if (!Py_IS_TYPE(w.kind, &Ints_Type) || !Py_IS_TYPE(w.dur, &Floats_Type) || !Py_IS_TYPE(w.lat, &Floats_Type) ||
        !Py_IS_TYPE(w.succ, &Succ_Type) || !Py_IS_TYPE(w.indeg, &Ints_Type) || !PyList_Check(w.comm_in) ||
        !(PyDict_Check(w.tx_prod) || Py_IS_TYPE(w.tx_prod, &IntMap_Type)) || !Py_IS_TYPE(w.have, &IntMap_Type) ||
        !Py_IS_TYPE(w.live, &FloatMap_Type) || !PyDict_Check(w.wg) || !PyDict_Check(w.ends) || !PyDict_Check(w.messages) ||
        !PyDict_Check(w.cplans)) {
        PyErr_SetString(PyExc_TypeError, "walk: the Builder's node arrays or value maps are not "
                        "pipert._simc's, or its state not lists and dicts");
        goto out;
    }
    w.kinds = (Arr *)w.kind, w.durs = (Arr *)w.dur, w.lats = (Arr *)w.lat, w.indegs = (Arr *)w.indeg;
    w.edges = (Succ *)w.succ;
    w.haves = (VMap *)w.have, w.lives = (VMap *)w.live;
    if (w.kinds->n != w.durs->n || w.kinds->n != w.lats->n || w.kinds->n != w.indegs->n || w.kinds->n != w.edges->n) {
        PyErr_SetString(PyExc_ValueError, "walk: the node arrays differ in length");
        goto out;
    }
    PyObject *h = attr(w.b, "host");
    if (!h) goto out;
    w.host = as_ll(h);
    Py_DECREF(h);
    if (ERR_LL(w.host) || sync_in(&w)) goto out;
    Py_ssize_t n_acts = PyList_GET_SIZE(acts);
    for (; i < n_acts; i++) {
        PyObject *a = PyList_GET_ITEM(acts, i), *op = field(a, F_OP, s_op);
        if (!op) goto out;
        int plain;
        long q = op_info(&w, op, &plain);
        int rc = (q == -1 && PyErr_Occurred()) ? -1 : q == 0 ? (plain ? compute(&w, a, op, i) : STOP) :
                 (q == 1 || q == 2) ? message(&w, a, op, q, i) : STOP;
        Py_DECREF(op);
        if (rc < 0) goto out;
        if (rc == STOP) break;
        /* the running memory after the action: its trace, the rank's peak, the limit (once) */
        PyObject *mem = PyFloat_FromDouble(w.mem);
        if (!mem || PyList_Append(trace, mem)) { Py_XDECREF(mem); goto out; }
        if (w.mem > peak) {
            peak = w.mem;
            int above = limit == Py_None || over ? 0 : PyObject_RichCompareBool(mem, limit, Py_GT);
            if (above > 0) {
                over = 1;
                above = callback(&w, s_memory_error, Py_BuildValue("(OnOOO)", w.r_obj, i, a, mem, limit));
            }
            if (above < 0) { Py_DECREF(mem); goto out; }
        }
        Py_DECREF(mem);
    }
    if (!sync_out(&w)) res = Py_BuildValue("(nddO)", i, w.busy, peak, over ? Py_True : Py_False);
out:
    for (size_t j = 0; j < sizeof own / sizeof *own; j++) Py_XDECREF(*own[j]);
    return res;
}

/* ------------------------------------------------------------------------------------------ */
/* survey: Builder.run's scans of one rank's actions before its walk                          */

/* a's field j where a is exactly an Action (borrowed), else NULL */
static PyObject *slot_of(PyObject *a, int j) {
    return Py_TYPE(a) == action_type ? *(PyObject **)((char *)a + slots[j]->offset) : NULL;
}

/* x >= bound for an int x (1, 0; -1: not an exact int); ``zero``: whether x is 0 */
static int at_least(PyObject *x, long long bound, int *zero) {
    if (!PyLong_CheckExact(x)) return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
    *zero = !overflow && v == 0;
    return overflow ? overflow > 0 : v >= bound;
}

/* survey(acts, num_units, num_microbatches, unit_payloads, qname, recompute) -> (out of range,
 * names classes, has recompute, queues), or None where an action is not exactly an Action with int
 * fields (the caller then scans in Python): values.py's _out_of_range(acts, ...),
 * _names_classes(acts), ``recompute in ops`` and ``[qname[op] for op in ops]`` in one pass. */
static PyObject *survey(PyObject *mod, PyObject *args) {
    PyObject *acts, *payloads, *qname, *recompute;
    long long U, M;
    if (!PyArg_ParseTuple(args, "O!LLO!O!O", &PyList_Type, &acts, &U, &M, &PyTuple_Type, &payloads, &PyDict_Type,
                          &qname, &recompute))
        return NULL;
    if (!action_type) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(acts);
    int bad = 0, unit_payload = 0, named = 0, has_rec = 0;
    PyObject *queues = PyList_New(n), *last_op = NULL, *last_q = NULL;
    if (!queues) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyList_GET_ITEM(acts, i), *op = slot_of(a, F_OP), *u = slot_of(a, F_UNIT);
        PyObject *mb = slot_of(a, F_MB), *payload = slot_of(a, F_PAYLOAD), *zc = slot_of(a, F_ZCLASS);
        PyObject *side = slot_of(a, F_SIDE);
        /* ops and payloads of their enums, whose members equal only themselves: compared by identity */
        if (!op || !u || !mb || !payload || !zc || !side || !PyTuple_CheckExact(mb) ||
            Py_TYPE(op) != Py_TYPE(recompute) || (payload != Py_None && PyTuple_GET_SIZE(payloads) &&
                                                  Py_TYPE(payload) != Py_TYPE(PyTuple_GET_ITEM(payloads, 0))))
            goto pure;
        if (op != last_op) {   /* qname[op]: an Op hashes as its text, looked up once per run of one op */
            if (!(last_q = PyDict_GetItemWithError(qname, op))) { if (PyErr_Occurred()) goto fail; goto pure; }
            last_op = op;
        }
        PyList_SET_ITEM(queues, i, Py_NewRef(last_q));
        has_rec |= op == recompute;
        if (u != Py_None) {   /* a unit that is not 0 (filter(None, ...)) beyond the schedule's */
            int zero, over = at_least(u, U, &zero);
            if (over < 0) goto pure;
            bad |= over && !zero;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(mb); j++) {
            int zero, over = at_least(PyTuple_GET_ITEM(mb, j), M, &zero);
            if (over < 0) goto pure;
            bad |= over;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(payloads); j++)
            unit_payload |= payload == PyTuple_GET_ITEM(payloads, j);
        named |= zc != Py_None || side != Py_None;
    }
    PyObject *res = Py_BuildValue("(OOON)", bad ? Py_True : Py_False, unit_payload && named ? Py_True : Py_False,
                                  has_rec ? Py_True : Py_False, queues);
    return res;
pure:
    Py_DECREF(queues);
    Py_RETURN_NONE;
fail:
    Py_DECREF(queues);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* message_action(op, unit, mb, payload, peer): pipert/ir/action.py:message_action in C        */

/* The values message_action gives Action's slots after op, unit, mb, payload and peer: group (),
 * root None, tag 0, sub, waits, zclass, side None, _h 0. */
static PyObject *slot_defaults[N_SLOTS];

static PyObject *bind_action(PyObject *mod, PyObject *args) {
    PyObject *cls, *names;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &cls, &PyTuple_Type, &names)) return NULL;
    if (PyTuple_GET_SIZE(names) != N_SLOTS) {
        PyErr_Format(PyExc_ValueError, "bind_action: Action has %zd fields, this module knows %d",
                     PyTuple_GET_SIZE(names), N_SLOTS);
        return NULL;
    }
    static const char *expected[N_SLOTS] = {"op", "unit", "mb", "payload", "peer", "group", "root", "tag", "sub",
                                            "waits", "zclass", "side", "_h"};
    for (int j = 0; j < N_SLOTS; j++) {
        PyObject *name = PyTuple_GET_ITEM(names, j);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, expected[j])) {
            PyErr_Format(PyExc_ValueError, "bind_action: field %zd is %R, this module expects %s", (Py_ssize_t)j,
                         name, expected[j]);
            return NULL;
        }
        PyObject *d = PyObject_GetAttr(cls, name);
        if (!d) return NULL;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type);
        if (ok) slots[j] = ((PyMemberDescrObject *)d)->d_member;   /* the type keeps its descriptors */
        Py_DECREF(d);
        /* message_action writes the slots of a new Action directly: writable object slots only */
        if (!ok || slots[j]->type != T_OBJECT_EX || (slots[j]->flags & READONLY)) {
            PyErr_SetString(PyExc_TypeError, "bind_action: a field that is not a writable object slot");
            return NULL;
        }
    }
    PyObject *tag0 = PyLong_FromLong(0), *h0 = PyLong_FromLong(0), *group = PyTuple_New(0);
    if (!tag0 || !h0 || !group) return NULL;
    PyObject *rest[N_SLOTS - 5] = {group, Py_None, tag0, Py_None, Py_None, Py_None, Py_None, h0};
    for (int j = 5; j < N_SLOTS; j++) {
        if (rest[j - 5] == Py_None) Py_INCREF(Py_None);
        Py_XSETREF(slot_defaults[j], rest[j - 5]);
    }
    Py_INCREF(cls);
    Py_XSETREF(action_type, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

static PyObject *message_action(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!action_type) { PyErr_SetString(PyExc_RuntimeError, "message_action before bind_action"); return NULL; }
    if (nargs != 5 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "message_action(op, unit, mb, payload, peer) or (op, unit, mb)");
        return NULL;
    }
    PyObject *a = action_type->tp_alloc(action_type, 0);
    if (!a) return NULL;
    for (int j = 0; j < N_SLOTS; j++)   /* PyMember_SetOne of a fresh object's T_OBJECT_EX slot */
        *(PyObject **)((char *)a + slots[j]->offset) = Py_NewRef(j < nargs ? args[j] : j < 5 ? Py_None : slot_defaults[j]);
    return a;
}

/* ------------------------------------------------------------------------------------------ */
/* lower_rank: one rank of pipert/ir/lowering.py:_programs without weight transfers, placement  */
/* by unit                                                                                     */

/* made's entries of this call, by the other rank and side: an entry is added, never replaced or
 * removed, while lower_rank runs, so one seen holds for the rest of the call (borrowed) */
typedef struct {
    struct { long long other; int side; PyObject *got; } at[CACHE];
    int n, next;
} Made;

/* made.setdefault((src, dst), ([], []))[side].append((payload, v, mbs)); ``other``: the rank
 * that is not this one (src for a receive, dst for a send) */
static int record(PyObject *made, Made *seen, long long other, PyObject *src, PyObject *dst, int side,
                  PyObject *payload, PyObject *v, PyObject *mbs) {
    PyObject *got = NULL;
    for (int c = 0; c < seen->n; c++)
        if (seen->at[c].other == other && seen->at[c].side == side) { got = seen->at[c].got; break; }
    if (!got) {
        PyObject *key = PyTuple_Pack(2, src, dst);
        if (!key) return -1;
        got = PyDict_GetItemWithError(made, key);
        if (!got) {
            PyObject *sends = PyErr_Occurred() ? NULL : PyList_New(0), *recvs = sends ? PyList_New(0) : NULL;
            got = (sends && recvs) ? PyTuple_Pack(2, sends, recvs) : NULL;
            Py_XDECREF(sends); Py_XDECREF(recvs);
            int bad = !got || PyDict_SetItem(made, key, got);
            Py_XDECREF(got);   /* made holds it */
            if (bad) got = NULL;
        }
        Py_DECREF(key);
        if (!got) return -1;
        int c = seen->n < CACHE ? seen->n++ : seen->next++ % CACHE;
        seen->at[c].other = other, seen->at[c].side = side, seen->at[c].got = got;
    }
    PyObject *msg = PyTuple_Pack(3, payload, v, mbs);
    int rc = msg ? PyList_Append(PyTuple_GET_ITEM(got, side), msg) : -1;
    Py_XDECREF(msg);
    return rc;
}

/* The message of crossing ``item`` (payload, unit, unit on the other side) as ``op`` of micro-batches
 * ``mbs``: its peer unit_rank[unit on the other side] (new reference in *peer, value in *pv) and,
 * where that peer is not rank r, the Action in *msg (else NULL). -1 on error (nothing held). */
static int crossing_message(PyObject *item, PyObject *unit_rank, PyObject *op, PyObject *mbs, long long r,
                            PyObject **peer, long long *pv, PyObject **msg) {
    *peer = *msg = NULL;
    long long cu = as_ll(PyTuple_GET_ITEM(item, 2));
    if (ERR_LL(cu) || !(*peer = PySequence_GetItem(unit_rank, cu))) return -1;   /* Python's indexing */
    *pv = as_ll(*peer);
    if (ERR_LL(*pv)) { Py_CLEAR(*peer); return -1; }
    if (*pv == r) return 0;
    PyObject *argv[5] = {op, PyTuple_GET_ITEM(item, 1), mbs, PyTuple_GET_ITEM(item, 0), *peer};
    if (!(*msg = message_action(NULL, argv, 5))) { Py_CLEAR(*peer); return -1; }
    return 0;
}

/* lower_rank(prog, acts, r, cross, unit_rank, ahead, made, crossing, RECV, SEND) -> True, or None
 * (with ahead) where a compute receives twice from one rank. ``crossing(a)`` is _crossing_of for
 * this rank: it fills ``cross`` and returns (incoming, outgoing). */
static PyObject *lower_rank(PyObject *mod, PyObject *args) {
    PyObject *prog, *acts, *r_obj, *cross, *unit_rank, *made, *crossing, *recv_op, *send_op;
    int ahead;
    if (!PyArg_ParseTuple(args, "O!O!OO!OpO!OOO", &PyList_Type, &prog, &PyList_Type, &acts, &r_obj, &PyDict_Type,
                          &cross, &unit_rank, &ahead, &PyDict_Type, &made, &crossing, &recv_op, &send_op))
        return NULL;
    long long r = as_ll(r_obj);
    if (ERR_LL(r)) return NULL;
    Py_ssize_t at = 0;   /* with ahead: where the next receive goes (just before the previous compute) */
    Made seen = {.n = 0, .next = 0};
    /* cross's entries seen in this call by (op, payload, unit, no micro-batch): borrowed, as made's;
     * the key's objects are compared by identity, so an entry is found again only through the same objects */
    struct { struct { PyObject *op, *payload, *u, *got; int no_mb; } at[CACHE]; int n, next; } seen_x = {.n = 0, .next = 0};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(acts); i++) {
        PyObject *a = PyList_GET_ITEM(acts, i);
        PyObject *u = NULL, *mbs = NULL, *sub = NULL, *op = NULL, *payload = NULL, *key = NULL, *got = NULL;
        long long *sources = NULL;   /* the ranks this compute receives from (with ahead) */
        int nsrc = 0, rc = -1;
        if (!(u = field(a, F_UNIT, s_unit)) || !(mbs = field(a, F_MB, s_mb))) goto next;
        if (u == Py_None) {
            at = PyList_GET_SIZE(prog);
            rc = PyList_Append(prog, a);
            goto next;
        }
        if (!(sub = field(a, F_SUB, s_sub)) || !(op = field(a, F_OP, s_op)) ||
            !(payload = field(a, F_PAYLOAD, s_payload)))
            goto next;
        int first_piece = 1, last_piece = 1;
        if (sub != Py_None) {
            long long j = as_ll(PyTuple_GetItem(sub, 0)), n = as_ll(PyTuple_GetItem(sub, 1));
            if (ERR_LL(j) || ERR_LL(n)) goto next;
            first_piece = j == 0, last_piece = j == n - 1;
        }
        int no_mb = PyObject_Not(mbs);
        if (no_mb < 0) goto next;
        for (int c = 0; c < seen_x.n; c++)   /* this call's lookups of cross, by identity (cross only grows) */
            if (seen_x.at[c].op == op && seen_x.at[c].payload == payload && seen_x.at[c].u == u &&
                seen_x.at[c].no_mb == no_mb) {
                got = Py_NewRef(seen_x.at[c].got);
                break;
            }
        if (!got) {
            if (!(key = PyTuple_Pack(4, op, payload, u, no_mb ? Py_True : Py_False))) goto next;
            got = PyDict_GetItemWithError(cross, key);   /* _crossing_of's cache, read without its call */
            if (got) Py_INCREF(got);
            else if (PyErr_Occurred() || !(got = PyObject_CallOneArg(crossing, a))) goto next;
            if (PyTuple_Check(got) && PyDict_GetItemWithError(cross, key) == got) {   /* held by cross */
                int c = seen_x.n < CACHE ? seen_x.n++ : seen_x.next++ % CACHE;
                seen_x.at[c].op = op, seen_x.at[c].payload = payload, seen_x.at[c].u = u, seen_x.at[c].no_mb = no_mb;
                seen_x.at[c].got = got;
            }
            if (PyErr_Occurred()) goto next;
        }
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2) {
            PyErr_SetString(PyExc_TypeError, "lower_rank: crossing() returns (incoming, outgoing)");
            goto next;
        }
        PyObject *incoming = PyTuple_GET_ITEM(got, 0), *outgoing = PyTuple_GET_ITEM(got, 1);
        if (!(sources = PyMem_Malloc((size_t)(PyTuple_GET_SIZE(incoming) + 1) * sizeof(long long)))) {
            PyErr_NoMemory();
            goto next;
        }
        for (Py_ssize_t k = 0; first_piece && k < PyTuple_GET_SIZE(incoming); k++) {
            PyObject *in = PyTuple_GET_ITEM(incoming, k), *src, *msg;   /* (payload, unit, unit of the writer) */
            long long sv;
            if (crossing_message(in, unit_rank, recv_op, mbs, r, &src, &sv, &msg)) goto next;
            if (!msg) { Py_DECREF(src); continue; }   /* from this rank */
            int bad;
            if (!ahead) {
                bad = PyList_Append(prog, msg);
            } else {
                for (int q = 0; q < nsrc; q++)
                    if (sources[q] == sv) {   /* a second receive from one rank: the two passes decide */
                        Py_DECREF(msg); Py_DECREF(src);
                        Py_XDECREF(u); Py_XDECREF(mbs); Py_XDECREF(sub); Py_XDECREF(op); Py_XDECREF(payload);
                        Py_XDECREF(key); Py_XDECREF(got); PyMem_Free(sources);
                        Py_RETURN_NONE;
                    }
                sources[nsrc++] = sv;
                bad = PyList_Insert(prog, at++, msg) ||
                      record(made, &seen, sv, src, r_obj, 1, PyTuple_GET_ITEM(in, 0), PyTuple_GET_ITEM(in, 1), mbs);
            }
            Py_XDECREF(msg);
            Py_DECREF(src);
            if (bad) goto next;
        }
        at = PyList_GET_SIZE(prog);
        if (PyList_Append(prog, a)) goto next;
        for (Py_ssize_t k = 0; last_piece && k < PyTuple_GET_SIZE(outgoing); k++) {
            PyObject *o = PyTuple_GET_ITEM(outgoing, k), *dst, *msg;   /* (payload, unit, unit of the reader) */
            long long dv;
            if (crossing_message(o, unit_rank, send_op, mbs, r, &dst, &dv, &msg)) goto next;
            int bad = msg && (PyList_Append(prog, msg) ||
                              record(made, &seen, dv, r_obj, dst, 0, PyTuple_GET_ITEM(o, 0), PyTuple_GET_ITEM(o, 1),
                                     mbs));
            Py_XDECREF(msg);
            Py_DECREF(dst);
            if (bad) goto next;
        }
        rc = 0;
    next:
        Py_XDECREF(u); Py_XDECREF(mbs); Py_XDECREF(sub); Py_XDECREF(op); Py_XDECREF(payload); Py_XDECREF(key);
        Py_XDECREF(got);
        PyMem_Free(sources);
        if (rc) return NULL;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"lower_rank", lower_rank, METH_VARARGS,
     "lower_rank(prog, acts, r, cross, unit_rank, ahead, made, crossing, RECV, SEND) -> True or None: one rank of "
     "lowering._programs without weight transfers, placement by unit"},
    {"bind_action", bind_action, METH_VARARGS,
     "bind_action(Action, field names): the class message_action builds (its slots, in field order)"},
    {"message_action", (PyCFunction)(void (*)(void))message_action, METH_FASTCALL,
     "message_action(op, unit, mb, payload, peer) -> Action: pipert.ir.action.message_action without Python; "
     "(op, unit, mb): compute_action's, payload and peer None"},
    {"longest_path", longest_path, METH_VARARGS,
     "longest_path(dur, lat, succ, indeg) -> (start, end0, end1, order, indeg left): run_timing's sweep"},
    {"survey", survey, METH_VARARGS,
     "survey(acts, num_units, num_microbatches, unit_payloads, qname, recompute) -> (out of range, names classes, "
     "has recompute, queues) or None: Builder.run's scans of one rank's actions in one pass"},
    {"walk", walk, METH_VARARGS,
     "walk(builder, r, acts, i, busy, peak, over, limit, nodes_r, cq, trace, ctx) -> (i, busy, peak, over): "
     "Builder.run's common case from action i to the first action it does not cover"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_simc", "The simulator's hot loops in C (see simc.c).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__simc(void) {
    if (sizeof(long) != sizeof(long long)) {   /* as_ll */
        PyErr_SetString(PyExc_ImportError, "pipert._simc needs a 64-bit long");
        return NULL;
    }
    PyObject **names[] = {&s_op, &s_unit, &s_mb, &s_payload, &s_peer, &s_sub, &s_tag, &s_zclass, &s_host, &s_mem,
                          &s_use, &s_mark_done, &s_add_wgrad, &s_mismatch, &s_memory_error};
    const char *text[] = {"op", "unit", "mb", "payload", "peer", "sub", "tag", "zclass", "host", "mem",
                          "use", "mark_done", "add_wgrad", "mismatch", "memory_error"};
    for (size_t j = 0; j < sizeof names / sizeof *names; j++)
        if (!(*names[j] = PyUnicode_InternFromString(text[j]))) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (nodes_add_types(m) || valmap_add_types(m))) Py_CLEAR(m);
    return m;
}
