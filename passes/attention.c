/* attention.c: attention written out op by op becomes one nova.attention.
 *
 * Models exported from PyTorch spell attention as the ops of its formula:
 *   y = softmax(f(q k^T)) v
 * with f a chain of scalings (mul or div by a scalar constant), additive
 * masks (add of a tensor broadcasting to the scores) and fills
 * (where(mask, s, c) with c = -inf or a huge negative c such as
 * finfo.min, either way round).  Such a chain is an affine map of the
 * scores, f(s) = scale s + bias, with bias made by the same ops applied to
 * 0 in the same order (so z is the same value: where the fill applies,
 * bias is the fill; elsewhere scale s plus the masks).  The softmax and its
 * matmul then become one nova.attention(q, k, v, bias) {scale}: its
 * backward (autodiff.c, attention_rule) recomputes the probabilities from
 * q and k, so the step keeps q, k and v between the forward and the
 * backward, never the [S, T] scores or probabilities of every layer.
 *
 * Matched only where every value of the chain has this one use (no output
 * reads the probabilities, no dropout between them and v), q, k^T and v
 * have the same batch dimensions (rank 2 to 4, the scores' shape) and the
 * dtype is f32 or f64 (under --precision=bf16/fp16 the chain is split by
 * casts to the softmax's f32 and stays as it is).  The operands are viewed
 * as [B, H, S, D] (a reshape, free); k^T's transpose is undone (folded
 * into the transpose that made it, usually to none).  This is
 * --attention=fused, not the default: on the cpu the ops as written run
 * faster than nova.attention's lowering and its backward.
 *
 * ad_attention_marks finds the same pattern, more loosely (any single-use
 * elementwise ops between the scores and the softmax, casts included), and
 * changes nothing: it tells ad_recompute which forward values it may
 * compute again in the backward (the scores' matmul, those ops, the
 * softmax), the memory of flash attention under --memory-limit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "../support/util.h"

enum { ST_MUL, ST_DIV, ST_ADD, ST_FILL_TRUE, ST_FILL_FALSE }; /* FILL_TRUE: where(cond, c, s) */

typedef struct step {
  int kind;
  nv_node *node; /* the op of the chain */
  nv_node *arg;  /* the scalar, the added tensor, or the fill (cond is node->in[0]) */
} step;

#define MAX_STEPS 16

typedef struct matcher {
  nv_graph *g;
  int n0;       /* nodes before the pass: use counts are known for these */
  int *uses;
  step st[MAX_STEPS];
  int nst;
} matcher;

static bool float_const(const nv_graph *g, const nv_node *n, double *v) {
  if (n->op != NV_OP_CONSTANT || fe_numel(n) != 1 || (n->dtype != NOVA_DTYPE_F32 && n->dtype != NOVA_DTYPE_F64))
    return false;
  double d64;
  float f32;
  if (fe_init_fill(g, NULL, n, n->dtype == NOVA_DTYPE_F64 ? (void *)&d64 : (void *)&f32)) return false;
  *v = n->dtype == NOVA_DTYPE_F64 ? d64 : f32;
  return true;
}

/* A fill that masks a score out: -inf, or so negative that adding any
 * finite score of sane size leaves it unchanged (|c| >= 2^100: finfo.min,
 * -1e30), so that scale s + c rounds to c as the fill itself does. */
static bool mask_fill(const nv_graph *g, const nv_node *n) {
  double c;
  return float_const(g, n, &c) && c < 0 && (isinf(c) || c <= -0x1p100);
}

static bool same_shape(const nv_node *a, const nv_node *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

/* A value only the chain reads, shaped as the scores. */
static bool chain_value(const matcher *M, const nv_node *n, const nv_node *scores_like) {
  return n->id < M->n0 && M->uses[n->id] == 1 && n->dtype == scores_like->dtype && same_shape(n, scores_like);
}

/* Walks from z back to the scores' matmul, recording the chain's steps
 * (outermost first).  The matmul, or NULL. */
static nv_node *walk(matcher *M, nv_node *z, const nv_node *shape) {
  if (!chain_value(M, z, shape)) return NULL;
  if (z->op == NV_OP_MATMUL) return z;
  if (M->nst == MAX_STEPS) return NULL;
  int mark = M->nst;
  step *s = &M->st[M->nst++];
  double c;
  s->node = z;
  switch (z->op) {
  case NV_OP_MUL:
  case NV_OP_DIV:
    s->kind = z->op == NV_OP_MUL ? ST_MUL : ST_DIV;
    for (int i = z->op == NV_OP_MUL ? 0 : 1; i < 2; i++) { /* the scalar on either side of a mul */
      if (!float_const(M->g, z->in[i], &c) || z->in[i]->dtype != z->dtype) continue;
      s->arg = z->in[i];
      nv_node *r = walk(M, z->in[1 - i], shape);
      if (r) return r;
      M->nst = mark + 1;
    }
    break;
  case NV_OP_ADD:
    s->kind = ST_ADD;
    for (int i = 0; i < 2; i++) {
      nv_node *t = z->in[1 - i];
      if (t->dtype != z->dtype || t->rank > 4) continue;
      s->arg = t;
      nv_node *r = walk(M, z->in[i], shape);
      if (r) return r;
      M->nst = mark + 1;
    }
    break;
  case NV_OP_WHERE:
    for (int i = 1; i < 3; i++) {
      if (!mask_fill(M->g, z->in[i]) || z->in[i]->dtype != z->dtype || z->in[0]->rank > 4) continue;
      s->kind = i == 1 ? ST_FILL_TRUE : ST_FILL_FALSE;
      s->arg = z->in[i];
      nv_node *r = walk(M, z->in[3 - i], shape);
      if (r) return r;
      M->nst = mark + 1;
    }
    break;
  default: break;
  }
  M->nst = mark;
  return NULL;
}

static bool same_batch(const nv_node *a, const nv_node *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank - 2; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

/* x viewed as rank 4 (leading 1s). */
static nv_node *as4(nv_graph *g, nv_diag *d, nv_node *x, nv_loc loc) {
  if (!x) return NULL;
  int64_t s[4] = {1, 1, 1, 1};
  for (int i = 0; i < x->rank; i++) s[4 - x->rank + i] = x->shape[i];
  return fe_reshape(g, d, x, 4, s, loc);
}

/* k from k^T: the transpose that made k^T with its last two axes swapped
 * back (none left where it only swapped them), else a new transpose. */
static nv_node *untranspose(nv_graph *g, nv_diag *d, nv_node *kt, nv_loc loc) {
  int r = kt->rank;
  int64_t swap[NOVA_MAX_RANK];
  for (int i = 0; i < r; i++) swap[i] = i;
  swap[r - 2] = r - 1, swap[r - 1] = r - 2;
  if (kt->op != NV_OP_TRANSPOSE) return fe_transpose(g, d, kt, swap, loc);
  int64_t p[NOVA_MAX_RANK];
  bool id = true;
  for (int i = 0; i < r; i++) id &= (p[i] = kt->list[swap[i]]) == i;
  return id ? kt->in[0] : fe_transpose(g, d, kt->in[0], p, loc);
}

/* The bias: the chain's steps applied to 0, innermost first; *scale gets
 * the product of its scalings. */
/* The product of the chain's scalings (M->st from walk). */
static double chain_scale(const matcher *M) {
  double scale = 1, c = 0;
  for (int i = M->nst - 1; i >= 0; i--)
    if ((M->st[i].kind == ST_MUL || M->st[i].kind == ST_DIV) && float_const(M->g, M->st[i].arg, &c))
      scale = M->st[i].kind == ST_MUL ? scale * c : scale / c;
  return scale;
}

static nv_node *build_bias(matcher *M, nv_diag *d, nova_dtype dt, nv_loc loc) {
  nv_graph *g = M->g;
  nv_node *b = NULL;
  for (int i = M->nst - 1; i >= 0; i--) {
    step *s = &M->st[i];
    if (s->kind == ST_MUL || s->kind == ST_DIV) {
      if (!b) continue;
      b = fe_graph_add(g, d, s->kind == ST_MUL ? NV_OP_MUL : NV_OP_DIV, 2, (nv_node *[]){b, s->arg}, NULL, loc);
    } else if (s->kind == ST_ADD) {
      b = b ? fe_graph_add(g, d, NV_OP_ADD, 2, (nv_node *[]){b, s->arg}, NULL, loc) : s->arg;
    } else {
      nv_node *b0 = b ? b : fe_graph_leaf(g, d, NV_OP_CONSTANT, NULL, dt, 0, NULL, loc); /* 0 */
      nv_node *cond = s->node->in[0];
      b = b0 ? fe_graph_add(g, d, NV_OP_WHERE, 3,
                            s->kind == ST_FILL_TRUE ? (nv_node *[]){cond, s->arg, b0} : (nv_node *[]){cond, b0, s->arg},
                            NULL, loc)
             : NULL;
    }
    if (!b) return NULL;
  }
  return b ? b : fe_graph_leaf(g, d, NV_OP_CONSTANT, NULL, dt, 0, NULL, loc);
}

/* For ad_attention_marks, where the ops stay as they are (only what the
 * backward recomputes is chosen): any chain of single-use elementwise ops
 * of the scores' shape (casts of a mixed precision, a softcap's tanh, masks
 * of any value).  The matmul, or NULL. */
static nv_node *walk_loose(matcher *M, nv_node *z, const nv_node *shape) {
  if (z->id >= M->n0 || M->uses[z->id] != 1 || !same_shape(z, shape) || !fe_dtype_is_float(z->dtype)) return NULL;
  if (z->op == NV_OP_MATMUL) return z;
  switch (z->op) {
  case NV_OP_MUL: case NV_OP_DIV: case NV_OP_ADD: case NV_OP_SUB: case NV_OP_WHERE: case NV_OP_CAST:
  case NV_OP_TANH: case NV_OP_NEG:
    break;
  default:
    return NULL;
  }
  if (M->nst == MAX_STEPS) return NULL;
  int mark = M->nst;
  M->st[M->nst++] = (step){.node = z};
  for (int i = 0; i < z->nin; i++) {
    nv_node *r = walk_loose(M, z->in[i], shape);
    if (r) return r;
    M->nst = mark + 1;
  }
  M->nst = mark;
  return NULL;
}

/* y = softmax(chain(q k^T)) v: the scores' matmul (the chain in M->st,
 * the softmax in *p), or NULL.  LOOSE: the chain as walk_loose takes it,
 * and a cast between the softmax and y. */
static nv_node *match(matcher *M, nv_node *y, nv_node **p, bool loose) {
  if (y->op != NV_OP_MATMUL || y->rank < 2 || y->rank > 4) return NULL;
  if (!loose && y->dtype != NOVA_DTYPE_F32 && y->dtype != NOVA_DTYPE_F64) return NULL;
  nv_node *v = y->in[1];
  M->nst = 0;
  *p = y->in[0];
  if (loose && (*p)->op == NV_OP_CAST && (*p)->id < M->n0 && M->uses[(*p)->id] == 1) {
    M->st[M->nst++] = (step){.node = *p};
    *p = (*p)->in[0];
  }
  if ((*p)->op != NV_OP_SOFTMAX || (*p)->id >= M->n0 || M->uses[(*p)->id] != 1 || (*p)->rank != y->rank ||
      (*p)->axis != (*p)->rank - 1 || (!loose && v->dtype != y->dtype) || !same_batch(*p, v))
    return NULL;
  nv_node *s = loose ? walk_loose(M, (*p)->in[0], *p) : walk(M, (*p)->in[0], *p);
  if (!s || (!loose && (s->in[0]->dtype != y->dtype || s->in[1]->dtype != y->dtype)) || !same_batch(s->in[0], s) ||
      !same_batch(s->in[1], s) || (!loose && !isfinite(chain_scale(M)))) /* (a division by 0: left as written) */
    return NULL;
  return s;
}

/* The attention that computes y (matched: s its scores), viewed as y; NULL
 * after a diagnostic. */
static nv_node *fuse(matcher *M, nv_diag *d, nv_node *y, nv_node *s) {
  nv_graph *g = M->g;
  nv_loc loc = y->loc;
  double scale = chain_scale(M);
  nv_node *bias = build_bias(M, d, y->dtype, loc);
  nv_node *k = bias ? untranspose(g, d, s->in[1], loc) : NULL;
  nv_node *in[4] = {as4(g, d, s->in[0], loc), as4(g, d, k, loc), as4(g, d, y->in[1], loc), bias};
  nv_node attrs = {.scale = scale};
  nv_node *a = in[0] && in[1] && in[2] && bias ? fe_graph_add(g, d, NV_OP_ATTENTION, 4, in, &attrs, loc) : NULL;
  return a ? fe_reshape(g, d, a, y->rank, y->shape, loc) : NULL;
}

/* Use counts of G's first N nodes by those nodes and the outputs. */
static int *count_uses(const nv_graph *g, int n) {
  int *uses = nv_xcalloc((size_t)n + 1, sizeof *uses);
  if (!uses) return NULL;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i]->nin; j++) uses[g->nodes[i]->in[j]->id]++;
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i].node->id < n) uses[g->outputs[i].node->id]++;
  return uses;
}

int ad_attention_marks(nv_graph *g, int n, bool *mark) {
  matcher M = {.g = g, .n0 = n, .uses = count_uses(g, n)};
  if (!M.uses) return -1;
  for (int i = 0; i < n; i++) {
    nv_node *p, *s = M.uses[i] ? match(&M, g->nodes[i], &p, true) : NULL;
    if (!s) continue;
    mark[s->id] = mark[p->id] = true;
    for (int j = 0; j < M.nst; j++) mark[M.st[j].node->id] = true;
  }
  free(M.uses);
  return 0;
}

/* Puts every node reachable by operands before its readers (depth first
 * from each node in the present order, so that nodes keep their places as
 * far as their operands allow), the DEAD ones last, and drops those. */
static int reorder(nv_graph *g, const bool *dead) {
  int n = g->nnodes, k = 0, top;
  nv_node **order = nv_xmalloc(sizeof *order * (size_t)n);
  int *stack = nv_xmalloc(sizeof *stack * (size_t)n * 2);
  char *state = nv_xcalloc((size_t)n, 1); /* 0 new, 1 open, 2 placed */
  int rc = -1;
  if (!order || !stack || !state) goto out;
  for (int i = 0; i < n; i++) {
    if (dead[i] || state[i]) continue;
    top = 0;
    stack[top++] = i;
    while (top) {
      int id = stack[top - 1];
      nv_node *x = g->nodes[id];
      if (state[id] == 2) {
        top--;
        continue;
      }
      if (state[id] == 1) {
        state[id] = 2;
        order[k++] = x;
        top--;
        continue;
      }
      state[id] = 1;
      for (int j = x->nin - 1; j >= 0; j--)
        if (!state[x->in[j]->id]) stack[top++] = x->in[j]->id;
    }
  }
  int live = k;
  for (int i = 0; i < n; i++)
    if (dead[i]) order[k++] = g->nodes[i];
  fe_graph_set_order(g, order);
  fe_graph_truncate(g, live);
  rc = 0;
out:
  free(order);
  free(stack);
  free(state);
  return rc;
}

int ad_fuse_attention(nv_graph *g, nv_diag *d, int *fused) {
  *fused = 0;
  int n0 = g->nnodes;
  matcher M = {.g = g, .n0 = n0, .uses = count_uses(g, n0)};
  nv_node **repl = nv_xcalloc((size_t)n0 + 1, sizeof *repl);
  int rc = -1;
  if (!M.uses || !repl) goto out;
  for (int i = 0; i < n0; i++) {
    nv_node *p, *s = M.uses[i] ? match(&M, g->nodes[i], &p, false) : NULL;
    if (!s) continue;
    if (!(repl[i] = fuse(&M, d, g->nodes[i], s))) goto out;
    ++*fused;
  }
  if (!*fused) {
    rc = 0;
    goto out;
  }
  /* readers of a replaced matmul read the attention */
  for (int i = 0; i < g->nnodes; i++)
    for (int j = 0; j < g->nodes[i]->nin; j++) {
      nv_node *x = g->nodes[i]->in[j];
      if (x->id < n0 && repl[x->id]) g->nodes[i]->in[j] = repl[x->id];
    }
  for (int i = 0; i < g->noutputs; i++)
    if (repl[g->outputs[i].node->id]) g->outputs[i].node = repl[g->outputs[i].node->id];
  /* what only the replaced chains read is dead: their ops, scalars and k^T */
  int n = g->nnodes;
  int *uses = nv_xcalloc((size_t)n, sizeof *uses);
  bool *dead = nv_xcalloc((size_t)n, sizeof *dead);
  if (!uses || !dead) {
    free(uses);
    free(dead);
    goto out;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i]->nin; j++) uses[g->nodes[i]->in[j]->id]++;
  for (int i = 0; i < g->noutputs; i++) uses[g->outputs[i].node->id]++;
  for (int i = n0 - 1; i >= 0; i--) { /* readers first: a dead op's operands may die with it */
    nv_node *x = g->nodes[i];
    bool leaf = x->op == NV_OP_INPUT || x->op == NV_OP_PARAM || (x->op == NV_OP_CONSTANT && x->name);
    if (uses[i] || leaf || !M.uses[i]) continue; /* (what nothing read before stays as it was) */
    dead[i] = true;
    for (int j = 0; j < x->nin; j++) uses[x->in[j]->id]--;
  }
  rc = reorder(g, dead);
  free(uses);
  free(dead);
out:
  free(M.uses);
  free(repl);
  return rc;
}
