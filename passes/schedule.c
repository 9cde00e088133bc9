/* schedule.c: each parameter's update right after its gradient
 * (ad_schedule_updates).
 *
 * Requires: a training graph from ad_train with --nonfinite=skip-param
 * (g->update_from: the first node after the backward pass), after
 * ad_recompute (whose copies read parameters too).
 * Changes: the order of the nodes from g->update_from on (the finite
 * checks, the optimizer, the updates); node ids renumbered.  Leaves keep
 * their relative order (the step's arguments do not move).
 *
 * ad_train appends the optimizer after the whole backward pass, and the
 * step's op order is the graph's: every gradient would stay alive to the
 * end of the step, the full set at once.  With each param's update
 * guarded by its own gradient's check alone, nothing after the backward
 * pass depends on more than what it reads, so each such node moves up to
 * just after the last node it depends on:
 *   - its operands (those after the backward pass at their new place);
 *   - for a parameter or state it reads, the last node before the
 *     backward pass ends that reads it too: the update is computed in the
 *     parameter's buffer (passes/inplace.c) only when no later op reads
 *     the old value (a matmul of the backward pass, or a recomputed copy
 *     of a cast of the weight).
 * Nodes that land after the same node keep their order.  The gradient
 * then dies at its update, during the backward pass.  The values do not
 * change: the same ops on the same operands.
 */
#include <stdlib.h>

#include "../support/util.h"
#include "autodiff.h"

static bool leaf(const nv_node *n) { return n->op == NV_OP_INPUT || n->op == NV_OP_PARAM; }

int ad_schedule_updates(nv_graph *g) {
  if (!g->update_from) return 0;
  int from = g->update_from->id, n = g->nnodes;
  if (from <= 0 || from >= n || g->nodes[from] != g->update_from) return 0;
  int *last = nv_xcalloc((size_t)n + 1, sizeof *last);   /* leaf id -> its last reader before FROM */
  int *after = nv_xcalloc((size_t)n + 1, sizeof *after); /* id >= FROM -> the node before FROM it follows */
  int *count = nv_xcalloc((size_t)from + 2, sizeof *count);
  nv_node **order = nv_xcalloc((size_t)n + 1, sizeof *order);
  int rc = -1;
  if (!last || !after || !count || !order) goto out;
  for (int i = 0; i < n; i++) last[i] = -1;
  for (int i = 0; i < from; i++)
    for (int j = 0; j < g->nodes[i]->nin; j++)
      if (leaf(g->nodes[i]->in[j])) last[g->nodes[i]->in[j]->id] = i;
  for (int i = from; i < n; i++) {
    const nv_node *v = g->nodes[i];
    int e = -1;
    for (int j = 0; j < v->nin; j++) {
      const nv_node *u = v->in[j];
      int k = leaf(u) ? last[u->id] : u->id >= from ? after[u->id] : u->id; /* (a leaf: -1 if only these read it) */
      if (k > e) e = k;
    }
    after[i] = leaf(v) ? from - 1 : e; /* a leaf stays last: the arguments keep their order */
    count[after[i] + 1]++;
  }
  /* bucket starts: bucket b (b - 1 = the node it follows) in order */
  int k = 0;
  for (int b = 0; b <= from; b++) {
    int c = count[b];
    count[b] = k;
    k += c + (b < from); /* the node b itself comes first in its slot, then its followers */
  }
  for (int b = 1; b <= from; b++) order[count[b] - 1] = g->nodes[b - 1];
  for (int i = from; i < n; i++) order[count[after[i] + 1]++] = g->nodes[i];
  fe_graph_set_order(g, order);
  rc = 0;
out:
  free(last);
  free(after);
  free(count);
  free(order);
  return rc;
}
