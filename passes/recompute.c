/* recompute.c: what the backward pass reads of the forward, chosen by a
 * minimum cut (ad_recompute).
 *
 * Requires: a training graph from ad_train (g->nforward: the forward's
 * nodes come first, in topological order, like every node).
 * Changes: backward nodes that read a cheap forward value (elementwise
 * arithmetic, casts, broadcasts, reshapes, transposes, slices, concats)
 * read a copy of it made in the backward, just before its first reader
 * there, from the values the backward keeps; the forward value then dies
 * in the forward.  Node ids are renumbered (the order stays topological);
 * g->recompute holds the counts for the manifest.
 *
 * Every forward value the backward reads lives from the forward to its
 * backward use: the activations of the step, most of its memory.  Many are
 * cheap functions of others the backward keeps anyway: the four pieces of
 * an exported erf-GELU (x / sqrt 2, erf of it, 1 + that, x times that) are
 * functions of x, which the backward keeps for the matmul that made it; a
 * residual sum of two kept values; a bf16 copy of a weight.  As in
 * AOTAutograd's partitioner, the choice of what to keep is a minimum cut:
 *
 *   source -> v_in     (inf)    v is no cheap op (a matmul, a reduction, a
 *                               norm, a leaf): it exists only as the
 *                               forward computed it
 *   v_in -> v_out      (bytes)  keeping v costs its bytes (0 for params,
 *                               inputs, constants and the step's outputs:
 *                               they are alive anyway)
 *   u_out -> v_in      (inf)    u is an operand of the cheap op v: v can be
 *                               recomputed only where u is available
 *   v_out -> sink      (inf)    a backward node reads v
 *
 * over the forward nodes the backward reads and their cheap ancestors.  A
 * minimum cut separates the sink from the source at least bytes: the
 * v_in -> v_out edges it cuts are the values kept; the nodes on the sink's
 * side are recomputed from them.  Ties go to keeping the value a backward
 * node reads (its capacity one unit lower), so nothing is recomputed for
 * no saving.  A chain of more than RECOMPUTE_DEPTH cheap ops counts as no
 * cheap op (bounded recomputation, bounded recursion).  Random ops
 * (dropout) are not recomputed.  The recomputed ops perform the same
 * arithmetic on the same values, so the step's results do not change
 * beyond the order of rounding inside fused loops.
 *
 * Under --memory-limit (ad_remat with mu >= 0) every pure op can be
 * recomputed, matmuls and convolutions included, at a price: an edge
 *
 *   source -> v_in     (mu flops(v))   recomputing v costs its flops
 *
 * so the cut minimizes bytes kept + mu x flops recomputed.  Recomputation
 * from far back would hold the recomputed values of every earlier layer
 * at once, so the forward is cut into segments of about segment_bytes of
 * the values the backward reads, at the points where the fewest bytes
 * cross (the residual stream between two layers): a value that crosses a
 * segment's start is kept (a checkpoint), and a recomputation chain stays
 * within its segment.  An expensive copy is made once, before its first
 * backward reader, and shared by the later ones; nothing of the last
 * segment is recomputed but cheap ops (the backward reads it first).  The
 * driver chooses segment_bytes and mu by measuring the plans they give.
 *
 * With o->rows (and under mu >= 0), layer and RMS norms count as cheap
 * ops (a pass over each row), and each attention written out op by op
 * (ad_attention_marks: q k^T, the elementwise ops to its softmax, the
 * softmax) may be recomputed from q and k, which the backward keeps anyway
 * for the scores' own gradient: flash attention's memory, no [S, T] matrix
 * kept per layer, for the scores' matmul once more.  Such a copy is made
 * once and shared, like an expensive one (costing mu x its flops).
 *
 * The cut is Dinic's maximum flow (BFS levels, blocking flows by an
 * iterative DFS: a chain of 100,000 nodes needs no deep recursion).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "autodiff.h"

#define RECOMPUTE_DEPTH 16
#define SEGMENT_DEPTH 1024 /* (copy_of recurses along a chain) */
#define CAP_INF (INT64_MAX / 4)

static bool cheap(nv_op op) {
  switch (op) {
  case NV_OP_ADD: case NV_OP_SUB: case NV_OP_MUL: case NV_OP_DIV: case NV_OP_NEG: case NV_OP_EXP:
  case NV_OP_LOG: case NV_OP_SQRT: case NV_OP_TANH: case NV_OP_SIGMOID: case NV_OP_RELU: case NV_OP_GELU:
  case NV_OP_POW: case NV_OP_ABS: case NV_OP_ERF: case NV_OP_MINIMUM: case NV_OP_MAXIMUM: case NV_OP_WHERE:
  case NV_OP_EQUAL: case NV_OP_LESS: case NV_OP_GREATER: case NV_OP_LESS_EQUAL: case NV_OP_GREATER_EQUAL:
  case NV_OP_CAST: case NV_OP_SIN: case NV_OP_COS: case NV_OP_TAN: case NV_OP_ASIN: case NV_OP_ACOS:
  case NV_OP_ATAN: case NV_OP_SINH: case NV_OP_COSH: case NV_OP_ASINH: case NV_OP_ACOSH: case NV_OP_ATANH:
  case NV_OP_FLOOR: case NV_OP_CEIL: case NV_OP_ROUND: case NV_OP_SIGN: case NV_OP_ISNAN: case NV_OP_ISINF:
  case NV_OP_NOT: case NV_OP_AND: case NV_OP_OR: case NV_OP_XOR: case NV_OP_MOD: case NV_OP_FMOD:
  case NV_OP_SHL: case NV_OP_SHR: case NV_OP_RESHAPE: case NV_OP_TRANSPOSE: case NV_OP_BROADCAST:
  case NV_OP_SLICE: case NV_OP_CONCAT:
    return true;
  default:
    return false;
  }
}

/* Ops that give the same value again from the same operands: not the
 * leaves, not the random ones (dropout, stochastic rounding). */
static bool pure(const nv_node *v) {
  switch (v->op) {
  case NV_OP_INPUT: case NV_OP_PARAM: case NV_OP_CONSTANT: case NV_OP_DROPOUT: case NV_OP_STOCHASTIC_ROUND:
  case NV_OP_ALL_REDUCE: case NV_OP_REDUCE_SCATTER: case NV_OP_ALL_GATHER: case NV_OP_SHARD:
    return false;
  default:
    return v->nin <= 64;
  }
}

/* The arithmetic of computing V: multiply-adds count two; other ops one
 * per element they read or write. */
static double node_flops(const nv_node *v) {
  double out = (double)fe_numel(v);
  switch (v->op) {
  case NV_OP_MATMUL: return 2 * out * (double)v->in[0]->shape[v->in[0]->rank - 1];
  case NV_OP_CONV: /* weight [Cout, Cin / groups, k...] */
    return 2 * out * (double)fe_numel(v->in[1]) / (double)(v->in[1]->shape[0] > 0 ? v->in[1]->shape[0] : 1);
  case NV_OP_ATTENTION: /* q [B, H, S, D], k [B, Hk, T, D], v [B, Hk, T, Dv] */
    return 2 * (double)fe_numel(v->in[0]) * (double)v->in[1]->shape[2] + 2 * out * (double)v->in[1]->shape[2];
  default: {
    double f = out;
    for (int j = 0; j < v->nin; j++) f += (double)fe_numel(v->in[j]);
    return f;
  }
  }
}

/* ---- maximum flow (Dinic) ------------------------------------------------ */

typedef struct fedge {
  int to, next;
  int64_t cap;
} fedge;

typedef struct flow {
  int n, ne, cap_e;
  int *head, *level, *it, *queue;
  fedge *e;
} flow;

static void flow_edge(flow *f, int a, int b, int64_t cap) {
  if (f->ne + 2 > f->cap_e) {
    f->cap_e = f->cap_e ? 2 * f->cap_e : 256;
    f->e = nv_xrealloc(f->e, (size_t)f->cap_e * sizeof *f->e);
  }
  f->e[f->ne] = (fedge){b, f->head[a], cap};
  f->head[a] = f->ne++;
  f->e[f->ne] = (fedge){a, f->head[b], 0};
  f->head[b] = f->ne++;
}

/* Levels from S over edges with capacity left; whether T is reached. */
static bool flow_bfs(flow *f, int s, int t) {
  for (int i = 0; i < f->n; i++) f->level[i] = -1;
  int qh = 0, qt = 0;
  f->queue[qt++] = s;
  f->level[s] = 0;
  while (qh < qt) {
    int v = f->queue[qh++];
    for (int k = f->head[v]; k >= 0; k = f->e[k].next)
      if (f->e[k].cap > 0 && f->level[f->e[k].to] < 0) {
        f->level[f->e[k].to] = f->level[v] + 1;
        f->queue[qt++] = f->e[k].to;
      }
  }
  return f->level[t] >= 0;
}

/* One blocking flow: paths along increasing levels, found by a DFS kept on
 * an explicit stack of edges (path[0..depth)). */
static int64_t flow_block(flow *f, int s, int t, int *path) {
  int64_t total = 0;
  for (int i = 0; i < f->n; i++) f->it[i] = f->head[i];
  int depth = 0, v = s;
  for (;;) {
    if (v == t) {
      int64_t push = CAP_INF;
      for (int i = 0; i < depth; i++)
        if (f->e[path[i]].cap < push) push = f->e[path[i]].cap;
      int cut = depth;
      for (int i = depth - 1; i >= 0; i--) {
        f->e[path[i]].cap -= push;
        f->e[path[i] ^ 1].cap += push;
        if (!f->e[path[i]].cap) cut = i;
      }
      total += push;
      depth = cut; /* back to the tail of the first saturated edge */
      v = depth ? f->e[path[depth - 1]].to : s;
      continue;
    }
    int k = f->it[v];
    while (k >= 0 && !(f->e[k].cap > 0 && f->level[f->e[k].to] == f->level[v] + 1)) k = f->e[k].next;
    f->it[v] = k;
    if (k >= 0) {
      path[depth++] = k;
      v = f->e[k].to;
      continue;
    }
    if (!depth) break;
    f->level[v] = -1; /* a dead end: never again in this phase */
    depth--;
    v = depth ? f->e[path[depth - 1]].to : s;
    f->it[v] = f->e[f->it[v]].next;
  }
  return total;
}

/* ---- the rewrite -------------------------------------------------------------- */

typedef struct rstate {
  nv_graph *g;
  nv_diag *d;
  bool *again;       /* forward node id -> recomputed in the backward */
  nv_node **copy;    /* forward node id -> its copy for the use at hand, */
  int *stamp;        /*   when stamp[id] == use */
  int use;
  int *before;       /* copy's id - nold -> the backward node it precedes */
  int ncopies, cap;  /* copies made, room in before */
  int nold;
  int at;            /* the backward node being rewritten */
  bool *heavy;       /* forward node id -> recomputed once, shared by its readers */
  nv_node **shared;  /*   and that copy, once made */
  double flops;      /* the copies' arithmetic */
} rstate;

/* The copies of a use's chain: at most this many per recomputed node, then
 * shared by every later use. */
#define RECOMPUTE_COPIES 4

/* The backward's copy of the recomputed forward node V (and of the
 * recomputed nodes it reads) for the use at hand, made before node R->at.
 * Each use gets copies of its own while there is room (RECOMPUTE_COPIES):
 * a copy with one use fuses into its reader and needs no buffer, where a
 * shared one would be written out in the backward. */
static nv_node *copy_of(rstate *R, nv_node *v) {
  bool one = R->heavy[v->id];
  if (one && R->shared[v->id]) return R->shared[v->id];
  if (!one && R->stamp[v->id] == R->use) return R->copy[v->id];
  nv_node *in[64];
  if (v->nin > 64 || R->ncopies == R->cap) return NULL;
  for (int j = 0; j < v->nin; j++) {
    in[j] = R->again[v->in[j]->id] ? copy_of(R, v->in[j]) : v->in[j];
    if (!in[j]) return NULL;
  }
  nv_node *c = fe_graph_add(R->g, R->d, v->op, v->nin, in, v, v->loc);
  if (!c) return NULL;
  R->before[R->ncopies++] = R->at;
  c->recompute = R->ncopies;
  R->flops += node_flops(c);
  if (one) return R->shared[v->id] = c;
  R->stamp[v->id] = R->use;
  return R->copy[v->id] = c;
}

/* The nodes in their new order: copies just before the backward node that
 * first read them.  Ids renumbered. */
static int reorder(rstate *R) {
  nv_graph *g = R->g;
  int n = g->nnodes, k = 0, c = R->nold;
  nv_node **order = nv_xcalloc((size_t)n + 1, sizeof *order);
  if (!order) return -1;
  for (int i = 0; i < R->nold; i++) {
    while (c < n && R->before[c - R->nold] <= i) order[k++] = g->nodes[c++];
    order[k++] = g->nodes[i];
  }
  while (c < n) order[k++] = g->nodes[c++];
  fe_graph_set_order(g, order);
  free(order);
  return 0;
}

static int64_t node_bytes(const nv_node *v) { return fe_numel(v) * (int64_t)fe_dtype_size(v->dtype); }

/* The segments of the forward nodes [0, NF) (ad_remat): each holds at
 * most BUDGET bytes of values the backward reads (ACT; or one node), and
 * the starts are where the fewest bytes cross in all (values made before
 * a start and read by the forward after it, not counting those alive
 * anyway: KEPT), by dynamic programming over the start points.  Sets
 * PINNED for the values crossing a segment's start and *NSEG; returns the
 * start of the last segment (0: one segment), -1 when out of memory. */
static int segment(const nv_graph *g, int nf, const int64_t *act, const bool *kept, int64_t budget, int nrec,
                   bool *pinned, int *nseg) {
  int *lastf = nv_xcalloc((size_t)nf + 1, sizeof *lastf), *nb = nv_xcalloc((size_t)nf + 2, sizeof *nb);
  int *from = nv_xcalloc((size_t)nf + 2, sizeof *from);
  int64_t *cross = nv_xcalloc((size_t)nf + 2, sizeof *cross), *pre = nv_xcalloc((size_t)nf + 2, sizeof *pre);
  int64_t *cost = nv_xcalloc((size_t)nf + 2, sizeof *cost);
  int last = -1;
  *nseg = 1;
  if (!lastf || !nb || !from || !cross || !pre || !cost) goto out;
  for (int i = 0; i < nf; i++) {
    lastf[i] = i;
    for (int j = 0; j < g->nodes[i]->nin; j++) lastf[g->nodes[i]->in[j]->id] = i;
  }
  for (int v = 0; v < nf; v++) { /* v crosses the points v + 1 .. lastf[v] (a point p: before node p) */
    pre[v + 1] = pre[v] + act[v];
    if (!kept[v] && lastf[v] > v) {
      cross[v + 1] += node_bytes(g->nodes[v]);
      cross[lastf[v] + 1] -= node_bytes(g->nodes[v]);
    }
  }
  for (int p = 1; p <= nf; p++) cross[p] += cross[p - 1];
  cross[nf] = 0; /* (the end: no start there) */
  /* cost[p]: the least bytes crossing the starts of segments tiling [0, p) */
  for (int p = 1; p <= nf; p++) {
    cost[p] = INT64_MAX;
    for (int q = p - 1; q >= 0 && (q == p - 1 || pre[p] - pre[q] <= budget); q--)
      if (cost[q] != INT64_MAX && cost[q] + cross[p] + 1 < cost[p]) { /* (+1: fewer starts, at a tie) */
        cost[p] = cost[q] + cross[p] + 1;
        from[p] = q;
      }
  }
  for (int p = from[nf]; p > 0; p = from[p]) (*nseg)++;
  /* the first NREC segments are recomputed (all but the last: 0), up to LAST */
  last = 0;
  int k = *nseg - 1;
  for (int p = from[nf]; p > 0; p = from[p], k--) {
    if (nrec > 0 && k > nrec) continue;
    nb[p] = 1;
    if (!last) last = p;
    if (getenv("NOVAC_DEBUG_REMAT"))
      fprintf(stderr, "recompute: segment %d from node %d (%s), %lld bytes cross\n", k, p,
              g->nodes[p]->loc.file ? g->nodes[p]->loc.file : "", (long long)cross[p]);
  }
  for (int p = 1; p <= nf; p++) nb[p] += nb[p - 1]; /* starts at or before p */
  for (int v = 0; v < nf; v++) pinned[v] = !kept[v] && nb[lastf[v]] > nb[v];
out:
  free(lastf);
  free(nb);
  free(from);
  free(cross);
  free(pre);
  free(cost);
  return last;
}

int ad_recompute(nv_graph *g, nv_diag *d, const ad_remat *o) {
  int nf = g->nforward, n = g->nnodes, rc = -1;
  double mu = o ? o->mu : -1;
  bool rows = o && (o->rows || mu >= 0); /* norms and attention probabilities too */
  memset(&g->recompute, 0, sizeof g->recompute);
  if (!g->train || nf <= 0 || nf > n) return 0;
  bool *read = nv_xcalloc((size_t)n + 1, sizeof *read);      /* forward nodes the backward reads */
  bool *kept = nv_xcalloc((size_t)n + 1, sizeof *kept);      /* alive anyway: free to keep */
  bool *need = nv_xcalloc((size_t)n + 1, sizeof *need);      /* in the network */
  bool *easy = nv_xcalloc((size_t)n + 1, sizeof *easy);      /* cheap and not too deep */
  bool *heavy = nv_xcalloc((size_t)n + 1, sizeof *heavy);    /* easy, but not cheap: costs its flops */
  bool *attn = nv_xcalloc((size_t)n + 1, sizeof *attn);      /* an attention's scores and probabilities */
  bool *pinned = nv_xcalloc((size_t)n + 1, sizeof *pinned);  /* crosses a segment's start: kept */
  int64_t *act = nv_xcalloc((size_t)n + 1, sizeof *act);
  int *depth = nv_xcalloc((size_t)n + 1, sizeof *depth), *slot = nv_xcalloc((size_t)n + 1, sizeof *slot);
  flow f = {0};
  rstate R = {.g = g, .d = d, .nold = n};
  if (!read || !kept || !need || !easy || !heavy || !attn || !pinned || !act || !depth || !slot ||
      (rows && ad_attention_marks(g, nf, attn)))
    goto out;
  for (int i = nf; i < n; i++)
    for (int j = 0; j < g->nodes[i]->nin; j++)
      if (g->nodes[i]->in[j]->id < nf) read[g->nodes[i]->in[j]->id] = true;
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i].node->id < nf) kept[g->outputs[i].node->id] = true;
  for (int i = 0; i < nf; i++) {
    nv_node *v = g->nodes[i];
    if (v->op == NV_OP_INPUT || v->op == NV_OP_PARAM || v->op == NV_OP_CONSTANT) kept[i] = true;
    act[i] = read[i] && !kept[i] ? node_bytes(v) : 0;
  }
  int lastseg = 0; /* from here on, nothing but cheap ops is recomputed (one segment: nothing expensive) */
  g->recompute.segments = 1;
  if (mu >= 0 && o->segment_bytes > 0 &&
      (lastseg = segment(g, nf, act, kept, o->segment_bytes, o->segments_recomputed, pinned,
                         &g->recompute.segments)) < 0)
    goto out;
  if (mu >= 0 && o->segment_bytes > 0 && lastseg > 0) {
    int all = g->recompute.segments - 1;
    g->recompute.segments_recomputed = o->segments_recomputed > 0 && o->segments_recomputed < all
                                       ? o->segments_recomputed : all;
  }
  for (int i = 0; i < nf; i++) {
    nv_node *v = g->nodes[i];
    bool norm = v->op == NV_OP_LAYER_NORM || v->op == NV_OP_RMS_NORM; /* a pass over each row */
    bool c = (cheap(v->op) || (rows && norm)) && !attn[i];
    bool h = !c && (attn[i] || (mu >= 0 && i < lastseg && pure(v)));
    if (kept[i] || pinned[i] || (!c && !h)) continue;
    int dep = 0;
    for (int j = 0; j < v->nin; j++)
      if (easy[v->in[j]->id] && depth[v->in[j]->id] > dep) dep = depth[v->in[j]->id];
    depth[i] = dep + 1;
    easy[i] = depth[i] <= (mu >= 0 ? SEGMENT_DEPTH : RECOMPUTE_DEPTH) && v->nin <= 64;
    heavy[i] = easy[i] && h;
  }
  int nn = 0;
  for (int i = nf - 1; i >= 0; i--) {
    need[i] |= read[i];
    if (!need[i]) continue;
    if (read[i]) g->recompute.saved_before += kept[i] ? 0 : node_bytes(g->nodes[i]);
    slot[i] = nn++;
    if (easy[i])
      for (int j = 0; j < g->nodes[i]->nin; j++) need[g->nodes[i]->in[j]->id] = true;
  }
  if (!nn) {
    rc = 0;
    goto out;
  }
  /* the network: v_in = 2 slot, v_out = 2 slot + 1, source, sink */
  f.n = 2 * nn + 2;
  int S = 2 * nn, T = 2 * nn + 1;
  f.head = nv_xcalloc((size_t)f.n, sizeof *f.head);
  f.level = nv_xcalloc((size_t)f.n, sizeof *f.level);
  f.it = nv_xcalloc((size_t)f.n, sizeof *f.it);
  f.queue = nv_xcalloc((size_t)f.n, sizeof *f.queue);
  int *path = nv_xcalloc((size_t)f.n + 1, sizeof *path);
  if (!f.head || !f.level || !f.it || !f.queue || !path) {
    free(path);
    goto out;
  }
  for (int i = 0; i < f.n; i++) f.head[i] = -1;
  for (int i = 0; i < nf; i++) {
    if (!need[i]) continue;
    nv_node *v = g->nodes[i];
    int s = slot[i];
    /* 2 units a byte, one less for a value the backward reads: ties keep it */
    flow_edge(&f, 2 * s, 2 * s + 1, kept[i] ? 0 : 2 * node_bytes(v) - (read[i] ? 1 : 0));
    if (!easy[i]) flow_edge(&f, S, 2 * s, CAP_INF);
    else
      for (int j = 0; j < v->nin; j++) flow_edge(&f, 2 * slot[v->in[j]->id] + 1, 2 * s, CAP_INF);
    double price = heavy[i] ? 2 * mu * node_flops(v) : 0;
    if (price > 0) flow_edge(&f, S, 2 * s, price < (double)(CAP_INF / 2) ? (int64_t)price + 1 : CAP_INF);
    if (read[i]) flow_edge(&f, 2 * s + 1, T, CAP_INF);
  }
  while (flow_bfs(&f, S, T)) flow_block(&f, S, T, path);
  free(path);
  flow_bfs(&f, S, T); /* what the source still reaches: its side of the cut */
  R.again = nv_xcalloc((size_t)n + 1, sizeof *R.again);
  R.copy = nv_xcalloc((size_t)n + 1, sizeof *R.copy);
  R.shared = nv_xcalloc((size_t)n + 1, sizeof *R.shared);
  R.heavy = heavy;
  if (!R.again || !R.copy || !R.shared) goto out;
  int nagain = 0;
  for (int i = 0; i < nf; i++) {
    if (!need[i]) continue;
    if (f.level[2 * slot[i]] < 0) { /* the sink's side: recomputed */
      R.again[i] = true;
      nagain++;
      g->recompute.heavy += heavy[i];
    } else if (!kept[i] && f.level[2 * slot[i] + 1] < 0) { /* cut: kept for the backward */
      g->recompute.saved_after += node_bytes(g->nodes[i]);
    }
    heavy[i] &= R.again[i];
  }
  if (!nagain) {
    rc = 0;
    goto out;
  }
  R.cap = RECOMPUTE_COPIES * nagain + 64;
  R.before = nv_xcalloc((size_t)R.cap + 1, sizeof *R.before);
  R.stamp = nv_xcalloc((size_t)n + 1, sizeof *R.stamp);
  if (!R.before || !R.stamp) goto out;
  for (int i = 0; i < n; i++) R.stamp[i] = -1;
  for (int i = nf; i < n; i++) {
    nv_node *u = g->nodes[i];
    R.at = i;
    for (int j = 0; j < u->nin; j++) {
      if (u->in[j]->id >= nf || !R.again[u->in[j]->id]) continue;
      /* a chain of its own while a whole one fits (nagain copies at most), else the shared ones */
      if (R.ncopies + nagain <= R.cap - nagain) R.use++;
      else if (R.use >= 0) R.use = -2; /* (stamps of -2: the shared copies, made from here on) */
      if (!(u->in[j] = copy_of(&R, u->in[j]))) goto out;
    }
  }
  g->recompute.values = g->nnodes - n;
  g->recompute.flops = R.flops;
  if (reorder(&R)) goto out;
  rc = 0;
out:
  free(read);
  free(kept);
  free(need);
  free(easy);
  free(heavy);
  free(attn);
  free(pinned);
  free(act);
  free(depth);
  free(slot);
  free(f.head);
  free(f.level);
  free(f.it);
  free(f.queue);
  free(f.e);
  free(R.again);
  free(R.copy);
  free(R.shared);
  free(R.stamp);
  free(R.before);
  g->recompute.done = !rc;
  return rc;
}
