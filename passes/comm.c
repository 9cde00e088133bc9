/* comm.c: the gradient all-reduces of data-parallel training, in buckets
 * (ad_comm_schedule).
 *
 * Requires: a training graph from ad_train with --data-parallel (each
 * trained param's gradient read through one nova.all_reduce, named after
 * the param), after ad_recompute and ad_schedule_updates.
 * Changes: each all_reduce's bucket (its axis field) and the node order;
 * g->comm gets the buckets for the manifest.
 *
 * The all-reduces are grouped, in the order the backward produces the
 * gradients (the last layer's first), into buckets of at least
 * bucket_bytes (the last one smaller; the first at most 1 MiB, so that
 * the first sum starts early), as PyTorch's DDP does: one collective per
 * bucket instead of one per tensor.  A bucket's all-reduces
 * are placed together right after its last gradient is complete, and
 * everything that reads them (the mean's scaling, the checks, the
 * updates) after the next bucket's all-reduces (the last bucket's: at the
 * end), so that each sum runs while the backward computes the next
 * bucket's gradients (codegen/comm_calls.c waits for it before its first
 * reader): the nodes are put in topological order by a key, each node's
 * own position except an all-reduce's, just after the last gradient of
 * its bucket, and its readers', after the next bucket's (keys only grow
 * along the edges); among ready nodes the smallest key goes first, so
 * nothing else moves but what has to wait for a bucket.  The values do
 * not change, nor does the memory: a gradient's buffer is free once its
 * all-reduce has started (the runtime holds the bucket), and its sum's is
 * made where it is waited for.
 */
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "autodiff.h"

static int64_t node_bytes(const nv_node *n) { return fe_numel(n) * (int64_t)fe_dtype_size(n->dtype); }

/* ---- a binary heap of node ids by key ---- */

typedef struct heap {
  int *v, n;
  const double *key;
} heap;

static bool less(const heap *h, int a, int b) {
  return h->key[a] < h->key[b] || (h->key[a] == h->key[b] && a < b);
}

static void push(heap *h, int x) {
  int i = h->n++;
  h->v[i] = x;
  while (i > 0 && less(h, h->v[i], h->v[(i - 1) / 2])) {
    int p = (i - 1) / 2, t = h->v[p];
    h->v[p] = h->v[i];
    h->v[i] = t;
    i = p;
  }
}

static int pop(heap *h) {
  int top = h->v[0];
  h->v[0] = h->v[--h->n];
  for (int i = 0;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && less(h, h->v[l], h->v[m])) m = l;
    if (r < h->n && less(h, h->v[r], h->v[m])) m = r;
    if (m == i) break;
    int t = h->v[m];
    h->v[m] = h->v[i];
    h->v[i] = t;
    i = m;
  }
  return top;
}

/* qsort: all-reduces by the position of the gradient they read. */
static bool is_comm(const nv_node *v) {
  return v->op == NV_OP_ALL_REDUCE || v->op == NV_OP_REDUCE_SCATTER || v->op == NV_OP_ALL_GATHER;
}

static int by_operand(const void *a, const void *b) {
  int x = (*(nv_node *const *)a)->in[0]->id, y = (*(nv_node *const *)b)->in[0]->id;
  return (x > y) - (x < y);
}

int ad_comm_schedule(nv_graph *g, int64_t bucket_bytes) {
  int n = g->nnodes, rc = -1, nb = 0;
  double *key = nv_xcalloc((size_t)n + 1, sizeof *key);
  int *indeg = nv_xcalloc((size_t)n + 1, sizeof *indeg), *nusers = nv_xcalloc((size_t)n + 1, sizeof *nusers);
  int *last = nv_xcalloc((size_t)n + 1, sizeof *last); /* bucket -> the position of its last gradient */
  int **users = nv_xcalloc((size_t)n + 1, sizeof *users);
  nv_node **order = nv_xcalloc((size_t)n + 1, sizeof *order);
  heap h = {.v = nv_xcalloc((size_t)n + 1, sizeof(int)), .key = key};
  if (!key || !indeg || !nusers || !last || !users || !order || !h.v) goto out;
  /* the buckets, in the order the gradients come (with --nonfinite=skip-step the all-reduces are
   * still in the params' order, after the whole backward); a bucket holds one kind of collective
   * (--shard-optimizer: the gradients' reduce-scatters, the checks' all-reduces); then the
   * new params' all-gathers, in the order of the updates */
  int nar = 0, nag = 0;
  for (int i = 0; i < n; i++) {
    key[i] = i;
    if (is_comm(g->nodes[i]) && g->nodes[i]->op != NV_OP_ALL_GATHER) order[nar++] = g->nodes[i];
  }
  qsort(order, (size_t)nar, sizeof *order, by_operand);
  for (int i = 0; i < n; i++)
    if (g->nodes[i]->op == NV_OP_ALL_GATHER) order[nar + nag++] = g->nodes[i];
  qsort(order + nar, (size_t)nag, sizeof *order, by_operand);
  int64_t fill = 0, first_cap = bucket_bytes < (1 << 20) ? bucket_bytes : (1 << 20);
  int first_gather = -1; /* the first all-gather bucket */
  for (int i = 0; i < nar + nag; i++) {
    nv_node *v = order[i];
    bool new_kind = i > 0 && v->op != order[i - 1]->op;
    if (fill > 0 && (new_kind || fill >= (nb ? bucket_bytes : first_cap))) nb++, fill = 0;
    if (v->op == NV_OP_ALL_GATHER && first_gather < 0) first_gather = nb;
    v->axis = nb;
    fill += node_bytes(v->in[0]);
    last[nb] = v->in[0]->id;
  }
  if (fill > 0) nb++;
  /* an all-reduce's key: just after its bucket's last gradient; a node that reads one (or reads
   * such a reader), just after the next bucket's all-reduces, or at the end: the bucket's
   * all-reduces stay together, and the sum has the next bucket's backward to run behind; the
   * all-gathers' readers (the new params) at the end */
  for (int i = 0; i < n; i++) {
    nv_node *v = g->nodes[i];
    if (is_comm(v)) key[i] = last[v->axis] + 0.25;
    for (int j = 0; j < v->nin; j++) {
      nv_node *u = v->in[j];
      int nx = is_comm(u) ? (int)u->axis + 1 : -1; /* the bucket whose start the reader follows */
      double k = !is_comm(u)                  ? key[u->id]
                 : u->op == NV_OP_ALL_GATHER   ? n + 1.5 /* after every update and all-gather */
                 : nx < nb && nx != first_gather ? last[nx] + 0.5
                                                 : n + 0.5;
      if (u->op != NV_OP_INPUT && u->op != NV_OP_PARAM && k > key[i]) key[i] = k;
    }
  }
  /* Kahn's order by key; inputs and params are the step's arguments, there before any node (as
   * ad_schedule_updates leaves them: lr and comm.scale, made after the backward, stay there) */
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i]->nin; j++) nusers[g->nodes[i]->in[j]->id]++;
  for (int i = 0; i < n; i++)
    if (nusers[i] && !(users[i] = nv_xmalloc(sizeof **users * (size_t)nusers[i]))) goto out;
  memset(nusers, 0, sizeof *nusers * (size_t)n); /* (filled again, without the arguments' readers) */
  for (int i = 0; i < n; i++) {
    nv_node *v = g->nodes[i];
    for (int j = 0; j < v->nin; j++) {
      nv_node *u = v->in[j];
      if (u->op == NV_OP_INPUT || u->op == NV_OP_PARAM) continue;
      indeg[i]++;
      users[u->id][nusers[u->id]++] = i;
    }
  }
  for (int i = 0; i < n; i++)
    if (!indeg[i]) push(&h, i);
  int k = 0;
  while (h.n) {
    int x = pop(&h);
    order[k++] = g->nodes[x];
    for (int j = 0; j < nusers[x]; j++)
      if (!--indeg[users[x][j]]) push(&h, users[x][j]);
  }
  if (k != n) goto out; /* (a cycle: cannot be) */
  fe_graph_set_order(g, order);
  /* the buckets for the manifest: bytes, members, after which node they start, before which they end */
  free(g->comm.buckets);
  g->comm = (struct nv_comm){.bucket_bytes = bucket_bytes, .nbuckets = nb};
  if (nb && !(g->comm.buckets = nv_xcalloc((size_t)nb, sizeof *g->comm.buckets))) goto out;
  for (int b = 0; b < nb; b++) g->comm.buckets[b].before = n;
  for (int i = 0; i < n; i++) {
    nv_node *v = g->nodes[i];
    for (int q = 0; q < v->nin; q++) /* the first reader of a bucket's sums */
      if (is_comm(v->in[q]) && i < g->comm.buckets[v->in[q]->axis].before) {
        g->comm.buckets[v->in[q]->axis].before = i;
        g->comm.buckets[v->in[q]->axis].first_read = v->in[q]->name;
      }
    if (!is_comm(v)) continue;
    struct nv_bucket *bk = &g->comm.buckets[v->axis];
    bk->kind = v->op;
    bk->world = v->op == NV_OP_ALL_REDUCE ? 0 : (int)v->mode;
    bk->bytes += node_bytes(v->in[0]);
    bk->tensors++;
    if (v->in[0]->id > bk->after) bk->after = v->in[0]->id;
  }
  rc = 0;
out:
  for (int i = 0; users && i < n; i++) free(users[i]);
  free(users);
  free(key);
  free(indeg);
  free(nusers);
  free(last);
  free(order);
  free(h.v);
  return rc;
}
