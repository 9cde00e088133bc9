/* memplan.c: static memory planning of a bufferized step.
 *
 * Requires: the step bufferized, results as out-parameters, the in-place
 * updates planned (inplace.c).
 * Changes: every static alloc of the entry becomes a view of one arena
 * (a new last argument of the entry); the plan in cg_plan.
 *
 * After bufferization (results already out-parameters), every buffer the
 * step computes into is a memref.alloc of static shape in the entry
 * function's body.  The plan gives each one an offset in one arena:
 *  - live range: from the alloc to the last top-level op that uses it,
 *    directly or through anything that may alias it: views of it
 *    (expand/collapse_shape, subview, cast, reinterpret_cast, view) and
 *    buffer results of ops that take it (loops carrying it);
 *  - offsets: buffers placed largest first, each at the lowest offset
 *    (64-byte aligned) where it overlaps no placed buffer whose live range
 *    meets its own (first fit; peak = the highest end);
 *  - rewrite: the entry gets one more argument, memref<PEAKxi8>, the arena
 *    (the runtime allocates it once, at nova_step_open), and each alloc
 *    becomes a memref.view of it at its offset.
 * Activations live until their last use in the backward pass and
 * gradients until the optimizer consumed them, because that is where
 * their last uses are in the one train_step function.
 * Before planning, a result that bufferization computes into a buffer of
 * its own and copies into the caller's output buffer at the end is computed
 * in the output buffer directly where that is safe (forward_output_copies).
 * The plan (offset, size, live range, defining op) goes to the manifest,
 * where an independent checker can verify that no two buffers live at the
 * same time overlap.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "passes.h"

#define PLAN_ALIGN 64

typedef struct pbuf {
  MlirOperation alloc;
  int64_t bytes, offset;
  int first, last;  /* top-level op indices */
} pbuf;

static bool is_view(MlirOperation op) {
  return cg_op_is(op, "memref.expand_shape") || cg_op_is(op, "memref.collapse_shape") ||
         cg_op_is(op, "memref.subview") || cg_op_is(op, "memref.cast") || cg_op_is(op, "memref.reinterpret_cast") ||
         cg_op_is(op, "memref.view");
}

/* The op of FB's body that holds OP (OP itself at top level). */
static MlirOperation top_level(MlirOperation op, MlirOperation func) {
  for (;;) {
    MlirOperation p = mlirOperationGetParentOperation(op);
    if (mlirOperationIsNull(p) || mlirOperationEqual(p, func)) return op;
    op = p;
  }
}

/* The entry's top-level ops in order, with a hash from op to position
 * (a linear search per use made planning quadratic in the step). */
typedef struct op_index {
  MlirOperation *ops;
  int n;
  size_t cap;      /* a power of two above 2n */
  int *slot;       /* position + 1, 0 = empty */
} op_index;

static size_t op_hash(MlirOperation op, size_t cap) {
  uintptr_t x = (uintptr_t)op.ptr;
  x ^= x >> 17;
  x *= 0xed5ad4bbu;
  return (size_t)(x ^ (x >> 11)) & (cap - 1);
}

/* ops of fb into ix; -1 when out of memory */
static int index_ops(op_index *ix, MlirBlock fb) {
  int n = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op))
    n++;
  ix->cap = 16;
  while (ix->cap < 2 * (size_t)n + 2) ix->cap *= 2;
  ix->ops = nv_xcalloc((size_t)n + 1, sizeof *ix->ops);
  ix->slot = nv_xcalloc(ix->cap, sizeof *ix->slot);
  if (!ix->ops || !ix->slot) return -1;
  ix->n = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    size_t h = op_hash(op, ix->cap);
    while (ix->slot[h]) h = (h + 1) & (ix->cap - 1);
    ix->slot[h] = ix->n + 1;
    ix->ops[ix->n++] = op;
  }
  return 0;
}

static void index_free(op_index *ix) {
  free(ix->ops);
  free(ix->slot);
}

/* Position of top-level op OP, -1 if it is none. */
static int index_of(const op_index *ix, MlirOperation op) {
  for (size_t h = op_hash(op, ix->cap); ix->slot[h]; h = (h + 1) & (ix->cap - 1))
    if (mlirOperationEqual(ix->ops[ix->slot[h] - 1], op)) return ix->slot[h] - 1;
  return -1;
}

/* The last top-level index that uses V or a view of it (depth-limited). */
static int last_use(MlirValue v, MlirOperation func, const op_index *ix, int depth) {
  int last = -1;
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u)) {
    MlirOperation user = mlirOpOperandGetOwner(u);
    int i = index_of(ix, top_level(user, func));
    if (i > last) last = i;
    /* a result that is a buffer may alias V: a view of it, or a loop (or
     * any op) that takes V and returns a buffer (loops carrying it) */
    if (depth < 16)
      for (intptr_t r = 0; r < mlirOperationGetNumResults(user); r++) {
        MlirValue res = mlirOperationGetResult(user, r);
        if (!is_view(user) && !mlirTypeIsAMemRef(mlirValueGetType(res))) continue;
        int j = last_use(res, func, ix, depth + 1);
        if (j > last) last = j;
      }
  }
  return last;
}

int64_t cg_type_bytes(MlirType t) {
  int64_t n = 1;
  for (intptr_t d = 0; d < mlirShapedTypeGetRank(t); d++) n *= mlirShapedTypeGetDimSize(t, d);
  MlirType et = mlirShapedTypeGetElementType(t);
  int64_t bits = mlirTypeIsAIndex(et) ? 64 : mlirTypeIsAInteger(et) ? (int64_t)mlirIntegerTypeGetWidth(et)
                 : mlirTypeIsAF64(et) ? 64 : mlirTypeIsAF16(et) || mlirTypeIsABF16(et) ? 16 : 32;
  int64_t b = n * ((bits + 7) / 8);
  return b > 0 ? b : 1;
}

static int by_size_desc(const void *a, const void *b) {
  const pbuf *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  return x->first - y->first;
}

static int64_t align_up(int64_t v) { return (v + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN; }

/* The placed buffers by live range: a segment tree over the ranks of the
 * ranges' ends, each node listing the buffers that have it among their
 * canonical nodes (cover) and those with one further down (below).  Two
 * ranges meet iff a canonical node of one is the other's canonical node or
 * an ancestor or descendant of one, so the buffers live at the same time as
 * a new one are found in time proportional to their number (a scan of
 * every placed buffer made planning quadratic in the step). */
typedef struct ilist {
  int *v;
  int n, cap;
} ilist;

typedef struct itree {
  int leaves; /* a power of two, at least the number of ranks */
  ilist *cover, *below;
  int *ends, nends; /* the distinct range ends, sorted */
  int *seen, *node_seen, stamp;
} itree;

static void ilist_push(ilist *l, int v) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 4;
    l->v = nv_xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
  }
  l->v[l->n++] = v;
}

static int by_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static void itree_init(itree *t, const pbuf *bufs, int nb) {
  t->ends = nv_xcalloc(2 * (size_t)nb + 1, sizeof *t->ends);
  for (int i = 0; i < nb; i++) {
    t->ends[2 * i] = bufs[i].first;
    t->ends[2 * i + 1] = bufs[i].last;
  }
  qsort(t->ends, 2 * (size_t)nb, sizeof *t->ends, by_int);
  int k = 0;
  for (int i = 0; i < 2 * nb; i++)
    if (!k || t->ends[k - 1] != t->ends[i]) t->ends[k++] = t->ends[i];
  t->nends = k;
  t->leaves = 1;
  while (t->leaves < k) t->leaves *= 2;
  t->cover = nv_xcalloc(2 * (size_t)t->leaves, sizeof *t->cover);
  t->below = nv_xcalloc(2 * (size_t)t->leaves, sizeof *t->below);
  t->node_seen = nv_xcalloc(2 * (size_t)t->leaves, sizeof *t->node_seen);
  t->seen = nv_xcalloc((size_t)nb + 1, sizeof *t->seen);
  t->stamp = 0;
}

static void itree_free(itree *t) {
  for (int i = 0; t->cover && i < 2 * t->leaves; i++) {
    free(t->cover[i].v);
    free(t->below[i].v);
  }
  free(t->cover);
  free(t->below);
  free(t->node_seen);
  free(t->seen);
  free(t->ends);
}

static int itree_rank(const itree *t, int x) {
  int lo = 0, hi = t->nends - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (t->ends[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The canonical nodes of B's range into out (at most 2 per level). */
static int itree_nodes(const itree *t, const pbuf *b, int *out) {
  int n = 0;
  for (int l = itree_rank(t, b->first) + t->leaves, r = itree_rank(t, b->last) + t->leaves + 1; l < r;
       l >>= 1, r >>= 1) {
    if (l & 1) out[n++] = l++;
    if (r & 1) out[n++] = --r;
  }
  return n;
}

static void itree_add(itree *t, const pbuf *b, int id) {
  int nodes[128], n = itree_nodes(t, b, nodes);
  for (int i = 0; i < n; i++) {
    ilist_push(&t->cover[nodes[i]], id);
    for (int a = nodes[i] >> 1; a >= 1; a >>= 1) {
      ilist *l = &t->below[a];
      if (l->n && l->v[l->n - 1] == id) break; /* and so are the ones above */
      ilist_push(l, id);
    }
  }
}

static void take(itree *t, const ilist *l, pbuf *bufs, pbuf **out, int *n) {
  for (int i = 0; i < l->n; i++)
    if (t->seen[l->v[i]] != t->stamp) {
      t->seen[l->v[i]] = t->stamp;
      out[(*n)++] = &bufs[l->v[i]];
    }
}

/* The placed buffers live at the same time as B into out; their number. */
static int itree_meets(itree *t, const pbuf *b, pbuf *bufs, pbuf **out) {
  int nodes[128], n = itree_nodes(t, b, nodes), k = 0;
  t->stamp++;
  for (int i = 0; i < n; i++) {
    take(t, &t->below[nodes[i]], bufs, out, &k);
    for (int a = nodes[i]; a >= 1 && t->node_seen[a] != t->stamp; a >>= 1) {
      t->node_seen[a] = t->stamp;
      take(t, &t->cover[a], bufs, out, &k);
    }
  }
  return k;
}

static int by_offset(const void *a, const void *b) {
  const pbuf *x = *(pbuf *const *)a, *y = *(pbuf *const *)b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

/* First fit: the lowest offset for B clear of every placed buffer live at
 * the same time (live[0..n), sorted here by offset). */
static int64_t place(const pbuf *b, pbuf **live, int n) {
  qsort(live, (size_t)n, sizeof *live, by_offset);
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    const pbuf *p = live[i];
    if (off + align_up(b->bytes) <= p->offset) break; /* fits in the gap below p */
    if (p->offset + align_up(p->bytes) > off) off = p->offset + align_up(p->bytes);
  }
  return off;
}

/* Steps of more than PLAN_SWEEP_MIN buffers: in time order, each buffer in
 * the tightest gap the buffers that died left (kept sorted and merged), or
 * at the top.  The largest-first order above lists every buffer live with
 * each new one, quadratic where thousands live at once (a training chain
 * of 8,000 layers: 48,000 buffers, 5 s); this is linear in the buffers
 * times the gaps.  NOVAC_PLAN_FIRST_FIT=1: largest first always. */
#define PLAN_SWEEP_MIN 16384

typedef struct gap {
  int64_t lo, hi;
} gap;

static int by_first(const void *a, const void *b) {
  const pbuf *x = *(pbuf *const *)a, *y = *(pbuf *const *)b;
  if (x->first != y->first) return x->first - y->first;
  return (x->bytes < y->bytes) - (x->bytes > y->bytes);
}

static int by_last(const void *a, const void *b) {
  const pbuf *x = *(pbuf *const *)a, *y = *(pbuf *const *)b;
  return x->last - y->last;
}

typedef struct gaps {
  gap *v;
  int n, cap;
} gaps;

static void gap_free_range(gaps *g, int64_t lo, int64_t hi) {
  int at = 0; /* the first gap above */
  while (at < g->n && g->v[at].lo < lo) at++;
  bool below = at > 0 && g->v[at - 1].hi == lo, above = at < g->n && g->v[at].lo == hi;
  if (below && above) {
    g->v[at - 1].hi = g->v[at].hi;
    memmove(g->v + at, g->v + at + 1, (size_t)(g->n - at - 1) * sizeof *g->v);
    g->n--;
  } else if (below) {
    g->v[at - 1].hi = hi;
  } else if (above) {
    g->v[at].lo = lo;
  } else {
    if (g->n == g->cap) {
      g->cap = g->cap ? 2 * g->cap : 16;
      g->v = nv_xrealloc(g->v, (size_t)g->cap * sizeof *g->v);
    }
    memmove(g->v + at + 1, g->v + at, (size_t)(g->n - at) * sizeof *g->v);
    g->v[at] = (gap){lo, hi};
    g->n++;
  }
}

static void sweep(pbuf *bufs, int nb) {
  pbuf **byf = nv_xcalloc((size_t)nb + 1, sizeof *byf), **byl = nv_xcalloc((size_t)nb + 1, sizeof *byl);
  for (int i = 0; i < nb; i++) byf[i] = byl[i] = &bufs[i];
  qsort(byf, (size_t)nb, sizeof *byf, by_first);
  qsort(byl, (size_t)nb, sizeof *byl, by_last);
  gaps g = {0};
  int64_t top = 0;
  for (int i = 0, dead = 0; i < nb; i++) {
    pbuf *b = byf[i];
    for (; dead < nb && byl[dead]->last < b->first; dead++) /* placed: they start before b */
      gap_free_range(&g, byl[dead]->offset, byl[dead]->offset + align_up(byl[dead]->bytes));
    int64_t sz = align_up(b->bytes);
    int k = -1; /* the tightest gap that fits; else the last one if it reaches the top (grown there) */
    for (int j = 0; j < g.n; j++)
      if (g.v[j].hi - g.v[j].lo >= sz && (k < 0 || g.v[j].hi - g.v[j].lo < g.v[k].hi - g.v[k].lo)) k = j;
    if (k < 0 && g.n && g.v[g.n - 1].hi == top) k = g.n - 1;
    if (k >= 0) {
      b->offset = g.v[k].lo;
      g.v[k].lo += sz;
      if (b->offset + sz > top) top = b->offset + sz;
      if (g.v[k].lo >= g.v[k].hi) {
        memmove(g.v + k, g.v + k + 1, (size_t)(g.n - k - 1) * sizeof *g.v);
        g.n--;
      }
    } else {
      b->offset = top;
      top += sz;
    }
  }
  free(g.v);
  free(byf);
  free(byl);
}

/* The most bytes (aligned) live at once over BUFS' live ranges, and the
 * first op where they are: a bound no placement can beat.  Ranges are
 * inclusive: a buffer ends after its last op. */
typedef struct lb_event {
  int at;
  int64_t bytes;
} lb_event;

static int by_event(const void *a, const void *b) {
  const lb_event *x = a, *y = b;
  if (x->at != y->at) return (x->at > y->at) - (x->at < y->at);
  return (x->bytes > y->bytes) - (x->bytes < y->bytes); /* ends before starts at the same op */
}

static int64_t lower_bound(const pbuf *bufs, int nb, int *at) {
  lb_event *ev = nv_xcalloc(2 * (size_t)nb + 1, sizeof *ev);
  *at = -1;
  if (!ev) return 0;
  for (int i = 0; i < nb; i++) {
    ev[2 * i] = (lb_event){bufs[i].first, align_up(bufs[i].bytes)};
    ev[2 * i + 1] = (lb_event){bufs[i].last + 1, -align_up(bufs[i].bytes)};
  }
  qsort(ev, 2 * (size_t)nb, sizeof *ev, by_event);
  int64_t cur = 0, best = 0;
  for (int i = 0; i < 2 * nb; i++) {
    cur += ev[i].bytes;
    if (cur > best) best = cur, *at = ev[i].at;
  }
  free(ev);
  return best;
}

/* ---- what each buffer holds ------------------------------------------------ */

typedef struct args_use {
  MlirBlock fb;
  const bool *which; /* entry argument index -> wanted */
  intptr_t n;
  bool hit;
} args_use;

static MlirWalkResult args_use_cb(MlirOperation op, void *ud) {
  args_use *u = ud;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    if (!mlirValueIsABlockArgument(v) || !mlirBlockEqual(mlirBlockArgumentGetOwner(v), u->fb)) continue;
    intptr_t k = mlirBlockArgumentGetArgNumber(v);
    if (k < u->n && u->which[k]) {
      u->hit = true;
      return MlirWalkResultInterrupt;
    }
  }
  return MlirWalkResultAdvance;
}

/* Whether OP, or an op nested in it, uses an entry argument in WHICH. */
static bool uses_args(MlirOperation op, MlirBlock fb, const bool *which, intptr_t n) {
  args_use u = {fb, which, n, false};
  mlirOperationWalk(op, args_use_cb, &u, MlirWalkPreOrder);
  return u.hit;
}

/* Each buffer's kind (cg_buf_kind) in a training step: the forward ends
 * at the first op that uses the loss's argument (LOSS_ARG); a buffer made
 * before it and used after it is an activation, one made after it whose
 * last reader uses a parameter's or optimizer state's argument (the
 * update, in place) a gradient. */
static int classify(MlirOperation func, MlirBlock fb, MlirOperation *ops, int n, pbuf *bufs, int nb,
                    cg_buf_kind *kind, int loss_arg) {
  int end = -1;
  for (int i = 0; i < nb; i++) kind[i] = CG_BUF_WORKSPACE;
  intptr_t na = mlirBlockGetNumArguments(fb);
  if (loss_arg < 0 || loss_arg >= na) return -1;
  bool *loss = nv_xcalloc((size_t)na + 1, sizeof *loss), *state = nv_xcalloc((size_t)na + 1, sizeof *state);
  MlirAttribute aa = mlirOperationGetAttributeByName(func, nova_str("arg_attrs"));
  if (!loss || !state) goto out;
  loss[loss_arg] = true;
  for (intptr_t k = 0; !mlirAttributeIsNull(aa) && mlirAttributeIsAArray(aa) && k < mlirArrayAttrGetNumElements(aa) &&
                       k < na; k++) {
    MlirAttribute d = mlirArrayAttrGetElement(aa, k);
    MlirAttribute r = mlirAttributeIsADictionary(d) ? mlirDictionaryAttrGetElementByName(d, nova_str("nova.role"))
                                                    : mlirAttributeGetNull();
    if (mlirAttributeIsNull(r) || !mlirAttributeIsAString(r)) continue;
    MlirStringRef s = mlirStringAttrGetValue(r);
    state[k] = (s.length == 5 && !memcmp(s.data, "param", 5)) || (s.length == 9 && !memcmp(s.data, "opt_state", 9));
  }
  for (int i = 0; i < n && end < 0; i++)
    if (!mlirOperationIsNull(ops[i]) && uses_args(ops[i], fb, loss, na)) end = i;
  for (int i = 0; end >= 0 && i < nb; i++)
    if (bufs[i].first < end && bufs[i].last >= end) kind[i] = CG_BUF_ACTIVATION;
    else if (bufs[i].first > end && uses_args(ops[bufs[i].last], fb, state, na)) kind[i] = CG_BUF_GRADIENT;
out:
  free(loss);
  free(state);
  return end;
}

static void describe(MlirOperation op, char *out, size_t n) {
  nv_sbuf b = {0};
  mlirLocationPrint(mlirOperationGetLocation(op), cg_print_to_sbuf, &b);
  snprintf(out, n, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
}

/* loc("FILE":L:C) as FILE:L:C, loc("NAME":0:0) (an ONNX node) as NAME. */
static void tidy_loc(char *s) {
  size_t n = strlen(s);
  if (n < 8 || strncmp(s, "loc(\"", 5) || s[n - 1] != ')') return;
  char *q = strrchr(s, '"');
  if (!q || q < s + 5) return;
  int line = 0, col = 0;
  bool zero = sscanf(q + 1, ":%d:%d)", &line, &col) == 2 && !line && !col;
  size_t k = (size_t)(q - (s + 5));
  memmove(s, s + 5, k);
  if (zero) s[k] = 0;
  else {
    memmove(s + k, q + 1, n - 1 - (size_t)(q + 1 - s));
    s[k + n - 1 - (size_t)(q + 1 - s)] = 0;
  }
  for (char *p = s; *p; p++) /* the printer's escapes of quotes */
    if (p[0] == '\\' && p[1] == '"') memmove(p, p + 1, strlen(p));
}

/* A result computed into a buffer of the step's own and then copied into
 * the caller's output buffer (buffer-results-to-out-params leaves such
 * copies: the gradients, the logits) is computed in the output buffer
 * directly when the copy is the buffer's last use (views and loops that
 * carry it included) and nothing else uses the output buffer.  Returns the
 * number of copies removed. */
static int forward_output_copies(MlirOperation func, MlirBlock fb) {
  op_index ix = {0};
  int k = 0;
  if (index_ops(&ix, fb)) {
    index_free(&ix);
    return 0;
  }
  MlirOperation *ops = ix.ops;
  for (int i = 0; i < ix.n; i++) {
    if (mlirOperationIsNull(ops[i]) || !cg_op_is(ops[i], "memref.copy")) continue;
    MlirValue src = mlirOperationGetOperand(ops[i], 0), dst = mlirOperationGetOperand(ops[i], 1);
    if (!mlirValueIsABlockArgument(dst) || !mlirValueIsAOpResult(src) ||
        !cg_op_is(mlirOpResultGetOwner(src), "memref.alloc") || !mlirTypeEqual(mlirValueGetType(src), mlirValueGetType(dst)))
      continue;
    MlirOpOperand u = mlirValueGetFirstUse(dst);
    if (mlirOpOperandIsNull(u) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u))) continue;
    if (last_use(src, func, &ix, 0) != i) continue;
    MlirOperation alloc = mlirOpResultGetOwner(src);
    mlirOperationDestroy(ops[i]); /* the copy (it used both) */
    mlirValueReplaceAllUsesOfWith(src, dst);
    int j = index_of(&ix, alloc);
    if (j >= 0) ops[j] = (MlirOperation){NULL}; /* its slot now never matches: ops are compared by pointer */
    ops[i] = (MlirOperation){NULL};
    mlirOperationDestroy(alloc);
    k++;
  }
  index_free(&ix);
  return k;
}

int cg_memplan(nova_ctx *c, MlirModule m, cg_plan *plan) {
  free(plan->entries);
  plan->entries = NULL;
  plan->n = 0;
  plan->planned = false;
  MlirOperation func = cg_entry_func(m); /* not the called kernels (kernel_once.c) */
  if (mlirOperationIsNull(func)) return 1;
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
  plan->forwarded = forward_output_copies(func, fb);
  op_index ix = {0};
  int ixrc = index_ops(&ix, fb), n = ix.n;
  MlirOperation *ops = ix.ops;
  pbuf *bufs = nv_xcalloc((size_t)n + 1, sizeof *bufs);
  pbuf **live = nv_xcalloc((size_t)n + 1, sizeof *live);
  int nb = 0, rc = -1;
  cg_buf_kind *kinds = NULL;
  if (ixrc || !bufs || !live) goto out;
  rc = 1; /* not plannable: the caller keeps heap buffers */
  for (int i = 0; i < n; i++) {
    if (!cg_op_is(ops[i], "memref.alloc")) continue;
    MlirType t = mlirValueGetType(mlirOperationGetResult(ops[i], 0));
    if (!mlirShapedTypeHasStaticShape(t) || !mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(t)) ||
        mlirOperationGetNumOperands(ops[i]))
      goto out;
    int last = last_use(mlirOperationGetResult(ops[i], 0), func, &ix, 0);
    bufs[nb++] = (pbuf){ops[i], cg_type_bytes(t), 0, i, last < i ? i : last};
  }
  /* an alloc nested in a region (none after bufferization today) or a
   * dealloc would need more than this plan: keep the heap */
  for (int i = 0; i < n; i++)
    if (cg_op_is(ops[i], "memref.dealloc")) goto out;
  qsort(bufs, (size_t)nb, sizeof *bufs, by_size_desc);
  int64_t peak = 0, total = 0;
  if (nb > PLAN_SWEEP_MIN && !getenv("NOVAC_PLAN_FIRST_FIT")) {
    sweep(bufs, nb);
    if (getenv("NOVAC_DEBUG_PIPELINES")) fprintf(stderr, "novac: memory plan: %d buffers in time order\n", nb);
  } else {
    itree tree = {0};
    itree_init(&tree, bufs, nb);
    for (int i = 0; i < nb; i++) {
      bufs[i].offset = place(&bufs[i], live, itree_meets(&tree, &bufs[i], bufs, live));
      itree_add(&tree, &bufs[i], i);
    }
    itree_free(&tree);
  }
  for (int i = 0; i < nb; i++) {
    if (bufs[i].offset + align_up(bufs[i].bytes) > peak) peak = bufs[i].offset + align_up(bufs[i].bytes);
    total += align_up(bufs[i].bytes);
  }
  if (peak < PLAN_ALIGN) peak = PLAN_ALIGN;
  /* the bound, the op at it (the first after the allocs there: what computes), and the kinds */
  int peak_op = -1;
  int64_t lower_bound_bytes = lower_bound(bufs, nb, &peak_op);
  plan->peak_where[0] = 0;
  for (int i = peak_op; i >= 0 && i < n; i++)
    if (!mlirOperationIsNull(ops[i]) && !cg_op_is(ops[i], "memref.alloc") && !cg_op_is(ops[i], "arith.constant")) {
      describe(ops[i], plan->peak_where, sizeof plan->peak_where);
      tidy_loc(plan->peak_where);
      break;
    }
  kinds = nv_xcalloc((size_t)nb + 1, sizeof *kinds);
  if (!kinds) {
    rc = -1;
    goto out;
  }
  plan->forward_end = classify(func, fb, ops, n, bufs, nb, kinds, plan->loss_arg);
  /* the arena argument */
  MlirContext ctx = mlirOperationGetContext(func);
  MlirType i8 = mlirIntegerTypeGet(ctx, 8);
  int64_t shape[1] = {peak};
  MlirType at = mlirMemRefTypeContiguousGet(i8, 1, shape, mlirAttributeGetNull());
  MlirLocation loc = mlirOperationGetLocation(func);
  MlirValue arena = mlirBlockAddArgument(fb, at, loc);
  MlirAttribute ft = mlirOperationGetAttributeByName(func, nova_str("function_type"));
  MlirType fty = mlirTypeAttrGetValue(ft);
  intptr_t ni = mlirFunctionTypeGetNumInputs(fty), nr = mlirFunctionTypeGetNumResults(fty);
  MlirType *ins = nv_xcalloc((size_t)ni + 1, sizeof *ins), *res = nv_xcalloc((size_t)nr + 1, sizeof *res);
  if (!ins || !res) {
    free(ins);
    free(res);
    rc = -1;
    goto out;
  }
  for (intptr_t i = 0; i < ni; i++) ins[i] = mlirFunctionTypeGetInput(fty, i);
  for (intptr_t i = 0; i < nr; i++) res[i] = mlirFunctionTypeGetResult(fty, i);
  ins[ni] = at;
  mlirOperationSetAttributeByName(func, nova_str("function_type"),
                                  mlirTypeAttrGet(mlirFunctionTypeGet(ctx, ni + 1, ins, nr, res)));
  free(ins);
  free(res);
  /* argument attributes: one more (empty) dictionary when there are any */
  MlirAttribute aa = mlirOperationGetAttributeByName(func, nova_str("arg_attrs"));
  if (!mlirAttributeIsNull(aa) && mlirAttributeIsAArray(aa)) {
    intptr_t na = mlirArrayAttrGetNumElements(aa);
    MlirAttribute *el = nv_xcalloc((size_t)na + 1, sizeof *el);
    if (el) {
      for (intptr_t i = 0; i < na; i++) el[i] = mlirArrayAttrGetElement(aa, i);
      el[na] = mlirDictionaryAttrGet(ctx, 0, NULL);
      mlirOperationSetAttributeByName(func, nova_str("arg_attrs"), mlirArrayAttrGet(ctx, na + 1, el));
      free(el);
    }
  }
  plan->entries = nv_xcalloc((size_t)nb + 1, sizeof *plan->entries);
  if (!plan->entries) {
    rc = -1;
    goto out;
  }
  MlirType it = mlirIndexTypeGet(ctx);
  for (int i = 0; i < nb; i++) {
    MlirOperation a = bufs[i].alloc;
    MlirLocation al = mlirOperationGetLocation(a);
    MlirNamedAttribute cv = mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("value")),
                                                  mlirIntegerAttrGet(it, bufs[i].offset));
    MlirOperationState cs = mlirOperationStateGet(nova_str("arith.constant"), al);
    mlirOperationStateAddResults(&cs, 1, &it);
    mlirOperationStateAddAttributes(&cs, 1, &cv);
    MlirOperation off = mlirOperationCreate(&cs);
    mlirBlockInsertOwnedOperationBefore(fb, a, off);
    MlirType t = mlirValueGetType(mlirOperationGetResult(a, 0));
    MlirValue vops[2] = {arena, mlirOperationGetResult(off, 0)};
    MlirOperationState vs = mlirOperationStateGet(nova_str("memref.view"), al);
    mlirOperationStateAddOperands(&vs, 2, vops);
    mlirOperationStateAddResults(&vs, 1, &t);
    MlirOperation view = mlirOperationCreate(&vs);
    mlirBlockInsertOwnedOperationBefore(fb, a, view);
    cg_plan_entry *e = &plan->entries[i];
    e->offset = bufs[i].offset;
    e->bytes = bufs[i].bytes;
    e->first = bufs[i].first;
    e->last = bufs[i].last;
    e->kind = kinds[i];
    describe(a, e->where, sizeof e->where);
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(a, 0), mlirOperationGetResult(view, 0));
    mlirOperationDestroy(a);
  }
  plan->n = nb;
  plan->arena_bytes = peak;
  plan->total_bytes = total;
  plan->lower_bound = lower_bound_bytes;
  plan->peak_op = peak_op;
  plan->nops = n;
  plan->planned = true;
  rc = 0;
  (void)c;
out:
  index_free(&ix);
  free(bufs);
  free(live);
  free(kinds);
  return rc;
}

void cg_plan_free(cg_plan *p) {
  free(p->entries);
  free(p->inplace);
  p->inplace = NULL;
  p->entries = NULL;
  p->n = 0;
  p->planned = false;
}

const char *const cg_mem_kind_names[CG_MEM_NKINDS] = {"parameters", "optimizer_state", "inputs_outputs",
                                                       "gradients", "activations", "workspace"};

int cg_mem_kind_of(cg_buf_kind k) {
  return k == CG_BUF_ACTIVATION ? CG_MEM_ACTIVATIONS : k == CG_BUF_GRADIENT ? CG_MEM_GRADIENTS : CG_MEM_WORKSPACE;
}

void cg_mem_at(const nv_graph *g, const cg_plan *plan, int at, int64_t out[CG_MEM_NKINDS]) {
  for (int k = 0; k < CG_MEM_NKINDS; k++) out[k] = 0;
  for (int i = 0; i < g->nnodes; i++) { /* the entry's arguments */
    const nv_node *n = g->nodes[i];
    int64_t b = fe_numel(n) * (int64_t)fe_dtype_size(n->dtype);
    if (n->op == NV_OP_INPUT) out[CG_MEM_IO] += b;
    else if (n->op == NV_OP_PARAM) out[n->role == NOVA_ROLE_OPT_STATE ? CG_MEM_OPT_STATE : CG_MEM_PARAMS] += b;
  }
  for (int j = 0; j < g->noutputs; j++) { /* an update in place takes its param's memory */
    if (plan && plan->inplace && j < plan->noutputs && plan->inplace[j]) continue;
    const nv_node *n = g->outputs[j].node;
    out[g->outputs[j].role == NOVA_ROLE_GRAD ? CG_MEM_GRADIENTS : CG_MEM_IO] +=
        fe_numel(n) * (int64_t)fe_dtype_size(n->dtype);
  }
  for (int i = 0; plan && plan->planned && i < plan->n; i++)
    if (plan->entries[i].first <= at && at <= plan->entries[i].last)
      out[cg_mem_kind_of(plan->entries[i].kind)] += align_up(plan->entries[i].bytes);
}

int64_t cg_io_bytes(const nv_graph *g, const cg_plan *plan) {
  int64_t m[CG_MEM_NKINDS];
  cg_mem_at(g, plan, -1, m); /* before the first op: no intermediate is live */
  return m[CG_MEM_PARAMS] + m[CG_MEM_OPT_STATE] + m[CG_MEM_IO] + m[CG_MEM_GRADIENTS];
}
