/* autodiff.c: reverse-mode differentiation and the optimizer update, on
 * the checked graph (see autodiff.h for the contract).
 *
 * One switch holds every backward rule (vjp): given the gradient g of a
 * node's result, it adds the gradients of the operands that need one.
 * Broadcasting operands get g summed back to their shape.  Rules are
 * written with the same node constructors as the frontend, so every node
 * they make is shape-checked, and carries the location of the forward op
 * it differentiates.  The optimizer's update of each trained param
 * follows (SGD, momentum, AdamW; a bf16 param of --bf16-master=none is
 * updated in f32 and stochastically rounded back), every state it writes
 * guarded by the step's finite check (--nonfinite=skip-param: by the
 * loss's and the param's own gradient's).
 */
#include "autodiff.h"

#include "../support/util.h"

#include <assert.h>
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ad {
  nv_graph *g;
  nv_diag *d;
  nv_loc loc;      /* of the forward op being differentiated */
  nv_node **grad;  /* by node id: accumulated gradient, or NULL */
  bool *needs;     /* by node id: depends on a trainable parameter */
  int nforward;    /* nodes before the backward pass */
  nv_node *bad;    /* the optimizer's guard: true when the loss or a gradient is not finite
                      (AD_SKIP_PARAM: the loss, or the param's own gradient, at hand) */
  nv_node *l0;     /* loss - loss: 0, or NaN for a non-finite loss */
  bool failed;
} ad;

/* ---- node constructors ------------------------------------------------ */

/* Values gradients flow through: f16 and bf16 too (the ops --precision
 * makes low, a 16-bit model's loss); a trained param is f32 or f64 (a
 * 16-bit one has an f32 master, passes/amp.c). */
static bool differentiable(nova_dtype dt) { return fe_dtype_is_float(dt); }
static bool wide_float(nova_dtype dt) { return dt == NOVA_DTYPE_F32 || dt == NOVA_DTYPE_F64; }

static nv_node *mk(ad *A, nv_op op, int nin, nv_node **in, const nv_node *attrs) {
  for (int i = 0; i < nin; i++)
    if (!in[i]) return NULL;
  nv_node *n = fe_graph_add(A->g, A->d, op, nin, in, attrs, A->loc);
  if (!n) A->failed = true;
  return n;
}
static nv_node *u1(ad *A, nv_op op, nv_node *a) { return mk(A, op, 1, &a, NULL); }
static nv_node *b2(ad *A, nv_op op, nv_node *a, nv_node *b) { return mk(A, op, 2, (nv_node *[]){a, b}, NULL); }
static nv_node *w3(ad *A, nv_node *c, nv_node *a, nv_node *b) { return mk(A, NV_OP_WHERE, 3, (nv_node *[]){c, a, b}, NULL); }
static nv_node *add(ad *A, nv_node *a, nv_node *b) { return b2(A, NV_OP_ADD, a, b); }
static nv_node *sub(ad *A, nv_node *a, nv_node *b) { return b2(A, NV_OP_SUB, a, b); }
static nv_node *mul(ad *A, nv_node *a, nv_node *b) { return b2(A, NV_OP_MUL, a, b); }
static nv_node *dvd(ad *A, nv_node *a, nv_node *b) { return b2(A, NV_OP_DIV, a, b); }

static nv_node *konst(ad *A, nova_dtype dt, double v) {
  nv_node *n = fe_graph_leaf(A->g, A->d, NV_OP_CONSTANT, NULL, dt, 0, NULL, A->loc);
  if (n) n->init = (nv_init){.kind = NV_INIT_CONST, .a = v};
  else A->failed = true;
  return n;
}

static nv_node *reshape(ad *A, nv_node *a, int rank, const int64_t *shape) {
  return fe_reshape(A->g, A->d, a, rank, shape, A->loc);
}
static nv_node *bcast(ad *A, nv_node *a, int rank, const int64_t *shape) {
  return fe_broadcast(A->g, A->d, a, rank, shape, A->loc);
}
static nv_node *rsum(ad *A, nv_node *a, int n, const int64_t *axes, bool keep) {
  return fe_reduce(A->g, A->d, NV_OP_REDUCE_SUM, a, n, axes, keep, A->loc);
}
static nv_node *transpose(ad *A, nv_node *a, const int64_t *perm) { return fe_transpose(A->g, A->d, a, perm, A->loc); }

/* Swaps the last two axes. */
static nv_node *tr_last(ad *A, nv_node *a) {
  if (!a) return NULL;
  int64_t p[NOVA_MAX_RANK];
  for (int i = 0; i < a->rank; i++) p[i] = i;
  p[a->rank - 2] = a->rank - 1, p[a->rank - 1] = a->rank - 2;
  return transpose(A, a, p);
}

/* g (broadcast result) summed back to the shape of x. */
static nv_node *unbroadcast(ad *A, nv_node *g, const nv_node *x) {
  if (!g) return NULL;
  if (g->rank == x->rank && !memcmp(g->shape, x->shape, (size_t)x->rank * sizeof *x->shape)) return g;
  int64_t axes[NOVA_MAX_RANK];
  int n = 0, lead = g->rank - x->rank;
  for (int i = 0; i < g->rank; i++)
    if (i < lead || (x->shape[i - lead] == 1 && g->shape[i] != 1)) axes[n++] = i;
  return reshape(A, rsum(A, g, n, axes, false), x->rank, x->shape);
}

/* A reduced gradient (shape of y = reduce(x, axes)) broadcast back to x. */
static nv_node *expand_back(ad *A, nv_node *g, const nv_node *x, const nv_node *y) {
  int64_t keep[NOVA_MAX_RANK];
  bool red[NOVA_MAX_RANK] = {0};
  for (int i = 0; i < y->nlist; i++) red[y->list[i]] = true;
  for (int i = 0; i < x->rank; i++) keep[i] = red[i] ? 1 : x->shape[i];
  return bcast(A, reshape(A, g, x->rank, keep), x->rank, x->shape);
}

/* ---- the rules --------------------------------------------------------- */

static void accumulate(ad *A, nv_node *x, nv_node *g) {
  if (!g || !A->needs[x->id]) return;
  A->grad[x->id] = A->grad[x->id] ? add(A, A->grad[x->id], g) : g;
}

static int64_t numel(const nv_node *n) { return fe_numel(n); }

/* Softmax of x along axis (recomputed for log_softmax and cross_entropy). */
static nv_node *softmax(ad *A, nv_node *x, int64_t axis) {
  nv_node at = {.axis = axis};
  return mk(A, NV_OP_SOFTMAX, 1, &x, &at);
}

/* nova.attention, recomputing the probabilities P (flash attention's
 * backward): with Z = scale q k^T (capped) + bias and Y = P v,
 *   dv = P^T g,  dP = g v^T,  dZ = P (dP - rowsum(dP P)),
 *   ds = dZ (1 - tanh^2) under a cap,  dq = scale ds k,  dk = scale ds^T q,
 *   dbias = dZ summed to the bias's shape.
 * Grouped heads use lower_attention.c's view: q as (B, Hk, R S, D), so the
 * products with k and v run per KV head and dk, dv sum over its R query
 * heads by the matmul itself. */
static void attention_rule(ad *A, nv_node *y, nv_node *g) {
  nv_node *q = y->in[0], *k = y->in[1], *v = y->in[2], *bias = y->in[3];
  nova_dtype dt = y->dtype;
  int64_t B = q->shape[0], hq = q->shape[1], S = q->shape[2], D = q->shape[3];
  int64_t hk = k->shape[1], T = k->shape[2], R = hq / hk, last = 3;
  int64_t g4s[4] = {B, hk, R * S, D}, full[4] = {B, hq, S, T}, grp[4] = {B, hk, R * S, T};
  nv_node *q4 = reshape(A, q, 4, g4s);
  nv_node *s = reshape(A, b2(A, NV_OP_MATMUL, q4, tr_last(A, k)), 4, full);
  s = mul(A, s, konst(A, dt, y->scale));
  nv_node *th = y->softcap > 0 ? u1(A, NV_OP_TANH, dvd(A, s, konst(A, dt, y->softcap))) : NULL;
  nv_node *z = add(A, th ? mul(A, th, konst(A, dt, y->softcap)) : s, bias);
  nv_node *m = fe_reduce(A->g, A->d, NV_OP_REDUCE_MAX, z, 1, &last, true, A->loc);
  nv_node *ms = w3(A, b2(A, NV_OP_EQUAL, m, konst(A, dt, -INFINITY)), konst(A, dt, 0), m);
  nv_node *e = u1(A, NV_OP_EXP, sub(A, z, ms));
  nv_node *l = rsum(A, e, 1, &last, true);
  nv_node *p = dvd(A, e, w3(A, b2(A, NV_OP_EQUAL, l, konst(A, dt, 0)), konst(A, dt, 1), l));
  nv_node *p4 = reshape(A, p, 4, grp);
  nv_node *g4 = reshape(A, g, 4, (int64_t[]){B, hk, R * S, v->shape[3]});
  if (A->needs[v->id]) accumulate(A, v, b2(A, NV_OP_MATMUL, tr_last(A, p4), g4));
  if (!A->needs[q->id] && !A->needs[k->id] && !A->needs[bias->id]) return;
  nv_node *dp = reshape(A, b2(A, NV_OP_MATMUL, g4, tr_last(A, v)), 4, full);
  nv_node *dz = mul(A, p, sub(A, dp, rsum(A, mul(A, dp, p), 1, &last, true)));
  if (A->needs[bias->id]) accumulate(A, bias, unbroadcast(A, dz, bias));
  nv_node *ds = th ? mul(A, dz, sub(A, konst(A, dt, 1), mul(A, th, th))) : dz;
  nv_node *ds4 = reshape(A, mul(A, ds, konst(A, dt, y->scale)), 4, grp);
  if (A->needs[q->id]) accumulate(A, q, reshape(A, b2(A, NV_OP_MATMUL, ds4, k), 4, q->shape));
  if (A->needs[k->id]) accumulate(A, k, b2(A, NV_OP_MATMUL, tr_last(A, ds4), q4));
}

/* The gradient of y = cumprod(x) (cumsum with NV_CUMSUM_PRODUCT, every
 * exclusive/reverse mode), correct where x has zeros (PyTorch's
 * cumprod_backward, in scan order along each line): before the line's
 * first zero z, dx_i = sum g_j y_j / x_i over j >= i (j > i: exclusive),
 * the sum the other way round (x_i is not 0 there, and every y_j after z
 * is); at z, the same sum of g_j y'_j with y' the running product of x
 * with x_z set to 1; after z, 0 (each product holds x_z). */
static nv_node *cumprod_grad(ad *A, nv_node *y, nv_node *g) {
  nv_node *x = y->in[0], *one = konst(A, y->dtype, 1), *zero = konst(A, y->dtype, 0);
  nv_node back = *y, count = *y;
  back.mode = (y->mode & ~NV_CUMSUM_PRODUCT) ^ NV_CUMSUM_REVERSE; /* sums the other way round */
  count.mode = y->mode & NV_CUMSUM_REVERSE;                       /* inclusive sums in scan order */
  nv_node *isz = b2(A, NV_OP_EQUAL, x, zero);
  nv_node *nz = mk(A, NV_OP_CUMSUM, 1, (nv_node *[]){w3(A, isz, one, zero)}, &count); /* zeros up to i */
  nv_node *before = b2(A, NV_OP_EQUAL, nz, zero), *first = b2(A, NV_OP_AND, isz, b2(A, NV_OP_EQUAL, nz, one));
  nv_node *t = mk(A, NV_OP_CUMSUM, 1, (nv_node *[]){mul(A, g, y)}, &back);
  nv_node *y1 = mk(A, NV_OP_CUMSUM, 1, (nv_node *[]){w3(A, first, one, x)}, y);
  nv_node *t1 = mk(A, NV_OP_CUMSUM, 1, (nv_node *[]){mul(A, g, y1)}, &back);
  return w3(A, before, dvd(A, t, w3(A, isz, one, x)), w3(A, first, t1, zero));
}

static bool rule(ad *A, nv_node *y, nv_node *g) {
  nv_node **in = y->in, *x = y->nin ? in[0] : NULL;
  nova_dtype dt = y->dtype;
  switch (y->op) {
  case NV_OP_INPUT: case NV_OP_PARAM: case NV_OP_CONSTANT:
  case NV_OP_EQUAL: case NV_OP_LESS: case NV_OP_GREATER: case NV_OP_LESS_EQUAL: case NV_OP_GREATER_EQUAL:
  case NV_OP_ISNAN: case NV_OP_ISINF: case NV_OP_NOT: case NV_OP_AND: case NV_OP_OR: case NV_OP_XOR:
  case NV_OP_SHL: case NV_OP_SHR:
    return true; /* leaves; comparisons are not differentiable (bool) */
  case NV_OP_FLOOR: case NV_OP_CEIL: case NV_OP_ROUND: case NV_OP_SIGN:
    return true; /* piecewise constant: zero gradient, as PyTorch defines it */
  case NV_OP_SIN: accumulate(A, x, mul(A, g, u1(A, NV_OP_COS, x))); return true;
  case NV_OP_COS: accumulate(A, x, u1(A, NV_OP_NEG, mul(A, g, u1(A, NV_OP_SIN, x)))); return true;
  case NV_OP_TAN: accumulate(A, x, mul(A, g, add(A, konst(A, dt, 1), mul(A, y, y)))); return true;
  case NV_OP_SINH: accumulate(A, x, mul(A, g, u1(A, NV_OP_COSH, x))); return true;
  case NV_OP_COSH: accumulate(A, x, mul(A, g, u1(A, NV_OP_SINH, x))); return true;
  case NV_OP_ATAN: accumulate(A, x, dvd(A, g, add(A, konst(A, dt, 1), mul(A, x, x)))); return true;
  case NV_OP_ATANH: accumulate(A, x, dvd(A, g, sub(A, konst(A, dt, 1), mul(A, x, x)))); return true;
  case NV_OP_ASIN: /* 1/sqrt(1 - x^2) */
  case NV_OP_ACOS: { /* -1/sqrt(1 - x^2) */
    nv_node *q = dvd(A, g, u1(A, NV_OP_SQRT, sub(A, konst(A, dt, 1), mul(A, x, x))));
    accumulate(A, x, y->op == NV_OP_ACOS ? u1(A, NV_OP_NEG, q) : q);
    return true;
  }
  case NV_OP_ASINH: accumulate(A, x, dvd(A, g, u1(A, NV_OP_SQRT, add(A, mul(A, x, x), konst(A, dt, 1))))); return true;
  case NV_OP_ACOSH: accumulate(A, x, dvd(A, g, u1(A, NV_OP_SQRT, sub(A, mul(A, x, x), konst(A, dt, 1))))); return true;
  case NV_OP_MOD:  /* a - b floor(a/b): d/db = -floor(a/b) */
  case NV_OP_FMOD: { /* a - b trunc(a/b) */
    accumulate(A, in[0], unbroadcast(A, g, in[0]));
    if (A->needs[in[1]->id]) {
      nv_node *q = dvd(A, in[0], in[1]);
      nv_node *k = y->op == NV_OP_MOD ? u1(A, NV_OP_FLOOR, q)
                                      : w3(A, b2(A, NV_OP_LESS, q, konst(A, dt, 0)), u1(A, NV_OP_CEIL, q), u1(A, NV_OP_FLOOR, q));
      accumulate(A, in[1], unbroadcast(A, u1(A, NV_OP_NEG, mul(A, g, k)), in[1]));
    }
    return true;
  }
  case NV_OP_REDUCE_PROD: { /* prod of the others: y/x, or where x is the only zero the product of the rest */
    nv_node *z = konst(A, dt, 0), *one = konst(A, dt, 1);
    nv_node *isz = b2(A, NV_OP_EQUAL, x, z);
    nv_node *nz = expand_back(A, mk(A, NV_OP_REDUCE_SUM, 1, (nv_node *[]){w3(A, isz, one, z)}, y), x, y);
    nv_node *rest = expand_back(A, mk(A, NV_OP_REDUCE_PROD, 1, (nv_node *[]){w3(A, isz, one, x)}, y), x, y);
    nv_node *yb = expand_back(A, y, x, y);
    nv_node *others = w3(A, isz, w3(A, b2(A, NV_OP_EQUAL, nz, one), rest, z), dvd(A, yb, w3(A, isz, one, x)));
    accumulate(A, x, mul(A, expand_back(A, g, x, y), others));
    return true;
  }
  case NV_OP_DROPOUT: /* the same mask (same seed, step and stream), recomputed on g, not kept */
    accumulate(A, x, mk(A, NV_OP_DROPOUT, 3, (nv_node *[]){g, in[1], in[2]}, y));
    return true;
  case NV_OP_CUMSUM: { /* the sum the other way round */
    if (y->mode & NV_CUMSUM_PRODUCT) {
      accumulate(A, x, cumprod_grad(A, y, g));
      return true;
    }
    nv_node at = *y;
    at.mode = y->mode ^ NV_CUMSUM_REVERSE;
    accumulate(A, x, mk(A, NV_OP_CUMSUM, 1, &g, &at));
    return true;
  }
  case NV_OP_GATHER_ELEMENTS:
  case NV_OP_GATHER_ND: { /* scatter-add of g into zeros shaped like x */
    nv_node *z = fe_graph_leaf(A->g, A->d, NV_OP_CONSTANT, NULL, dt, x->rank, x->shape, A->loc);
    if (!z) return false;
    nv_node at = {.axis = y->axis, .mode = NV_SCATTER_ADD};
    if (y->op == NV_OP_GATHER_ND && y->axis) return false; /* batch dims: no rule yet */
    accumulate(A, x, mk(A, y->op == NV_OP_GATHER_ND ? NV_OP_SCATTER_ND : NV_OP_SCATTER_ELEMENTS, 3,
                        (nv_node *[]){z, in[1], g}, &at));
    return true;
  }
  case NV_OP_SCATTER_ELEMENTS:
  case NV_OP_SCATTER_ND: { /* none: g where nothing was written; add: g.  Updates: g at their places */
    if (y->mode != NV_SCATTER_NONE && y->mode != NV_SCATTER_ADD) return false;
    bool nd = y->op == NV_OP_SCATTER_ND;
    nv_node ga = {.axis = nd ? 0 : y->axis};
    if (A->needs[x->id]) {
      nv_node *gx = g;
      if (y->mode == NV_SCATTER_NONE) {
        nv_node *z = fe_graph_leaf(A->g, A->d, NV_OP_CONSTANT, NULL, dt, in[2]->rank, in[2]->shape, A->loc);
        nv_node at = {.axis = y->axis, .mode = NV_SCATTER_NONE};
        gx = z ? mk(A, y->op, 3, (nv_node *[]){g, in[1], z}, &at) : NULL;
      }
      accumulate(A, x, gx);
    }
    if (A->needs[in[2]->id])
      accumulate(A, in[2], mk(A, nd ? NV_OP_GATHER_ND : NV_OP_GATHER_ELEMENTS, 2, (nv_node *[]){g, in[1]}, &ga));
    return true;
  }
  case NV_OP_ADD:
    accumulate(A, in[0], unbroadcast(A, g, in[0]));
    accumulate(A, in[1], unbroadcast(A, g, in[1]));
    return true;
  case NV_OP_SUB:
    accumulate(A, in[0], unbroadcast(A, g, in[0]));
    if (A->needs[in[1]->id]) accumulate(A, in[1], unbroadcast(A, u1(A, NV_OP_NEG, g), in[1]));
    return true;
  case NV_OP_MUL:
    if (A->needs[in[0]->id]) accumulate(A, in[0], unbroadcast(A, mul(A, g, in[1]), in[0]));
    if (A->needs[in[1]->id]) accumulate(A, in[1], unbroadcast(A, mul(A, g, in[0]), in[1]));
    return true;
  case NV_OP_DIV: /* d(a/b) = g/b, -g a / b^2 = -g y / b */
    if (A->needs[in[0]->id]) accumulate(A, in[0], unbroadcast(A, dvd(A, g, in[1]), in[0]));
    if (A->needs[in[1]->id]) accumulate(A, in[1], unbroadcast(A, u1(A, NV_OP_NEG, dvd(A, mul(A, g, y), in[1])), in[1]));
    return true;
  case NV_OP_POW: /* d a^b = b a^(b-1), a^b log a */
    if (A->needs[in[0]->id])
      accumulate(A, in[0], unbroadcast(A, mul(A, g, mul(A, in[1], b2(A, NV_OP_POW, in[0], sub(A, in[1], konst(A, dt, 1))))), in[0]));
    if (A->needs[in[1]->id]) accumulate(A, in[1], unbroadcast(A, mul(A, g, mul(A, y, u1(A, NV_OP_LOG, in[0]))), in[1]));
    return true;
  case NV_OP_NEG: accumulate(A, x, u1(A, NV_OP_NEG, g)); return true;
  case NV_OP_EXP: accumulate(A, x, mul(A, g, y)); return true;
  case NV_OP_LOG: accumulate(A, x, dvd(A, g, x)); return true;
  case NV_OP_SQRT: accumulate(A, x, dvd(A, mul(A, g, konst(A, dt, 0.5)), y)); return true;
  case NV_OP_TANH: accumulate(A, x, mul(A, g, sub(A, konst(A, dt, 1), mul(A, y, y)))); return true;
  case NV_OP_SIGMOID: accumulate(A, x, mul(A, g, mul(A, y, sub(A, konst(A, dt, 1), y)))); return true;
  case NV_OP_RELU: accumulate(A, x, w3(A, b2(A, NV_OP_GREATER, x, konst(A, dt, 0)), g, konst(A, dt, 0))); return true;
  case NV_OP_ABS: {
    nv_node *z = konst(A, dt, 0);
    accumulate(A, x, w3(A, b2(A, NV_OP_GREATER, x, z), g, w3(A, b2(A, NV_OP_LESS, x, z), u1(A, NV_OP_NEG, g), z)));
    return true;
  }
  case NV_OP_ERF: /* 2/sqrt(pi) exp(-x^2) */
    accumulate(A, x, mul(A, g, mul(A, konst(A, dt, 2 / sqrt(M_PI)), u1(A, NV_OP_EXP, u1(A, NV_OP_NEG, mul(A, x, x))))));
    return true;
  case NV_OP_GELU: { /* Phi(x) + x phi(x) */
    nv_node *cdf = mul(A, konst(A, dt, 0.5), add(A, konst(A, dt, 1), u1(A, NV_OP_ERF, mul(A, x, konst(A, dt, M_SQRT1_2)))));
    nv_node *pdf = mul(A, konst(A, dt, 1 / sqrt(2 * M_PI)), u1(A, NV_OP_EXP, mul(A, konst(A, dt, -0.5), mul(A, x, x))));
    accumulate(A, x, mul(A, g, add(A, cdf, mul(A, x, pdf))));
    return true;
  }
  case NV_OP_MINIMUM:
  case NV_OP_MAXIMUM: { /* ties send the gradient to the first operand */
    nv_node *first = b2(A, y->op == NV_OP_MINIMUM ? NV_OP_GREATER : NV_OP_LESS, in[0], in[1]);
    nv_node *z = konst(A, dt, 0);
    if (A->needs[in[0]->id]) accumulate(A, in[0], unbroadcast(A, w3(A, first, z, g), in[0]));
    if (A->needs[in[1]->id]) accumulate(A, in[1], unbroadcast(A, w3(A, first, g, z), in[1]));
    return true;
  }
  case NV_OP_WHERE: {
    nv_node *z = konst(A, dt, 0);
    if (A->needs[in[1]->id]) accumulate(A, in[1], unbroadcast(A, w3(A, in[0], g, z), in[1]));
    if (A->needs[in[2]->id]) accumulate(A, in[2], unbroadcast(A, w3(A, in[0], z, g), in[2]));
    return true;
  }
  case NV_OP_CAST:
    if (differentiable(x->dtype)) {
      nv_node at = {.to = x->dtype};
      accumulate(A, x, x->dtype == dt ? g : mk(A, NV_OP_CAST, 1, &g, &at));
    }
    return true;
  case NV_OP_MATMUL: {
    nv_node *a = in[0], *b = in[1];
    if (A->needs[a->id]) accumulate(A, a, b2(A, NV_OP_MATMUL, g, tr_last(A, b)));
    if (A->needs[b->id]) {
      if (b->rank == 2 && a->rank > 2) { /* b shared by the batch: (a^T g) over all rows */
        int64_t ak[2] = {numel(a) / a->shape[a->rank - 1], a->shape[a->rank - 1]};
        int64_t gn[2] = {numel(g) / g->shape[g->rank - 1], g->shape[g->rank - 1]};
        accumulate(A, b, b2(A, NV_OP_MATMUL, tr_last(A, reshape(A, a, 2, ak)), reshape(A, g, 2, gn)));
      } else
        accumulate(A, b, b2(A, NV_OP_MATMUL, tr_last(A, a), g));
    }
    return true;
  }
  case NV_OP_SOFTMAX: { /* y (g - sum(g y)) */
    int64_t ax = y->axis;
    accumulate(A, x, mul(A, y, sub(A, g, rsum(A, mul(A, g, y), 1, &ax, true))));
    return true;
  }
  case NV_OP_LOG_SOFTMAX: { /* g - exp(y) sum(g) */
    int64_t ax = y->axis;
    accumulate(A, x, sub(A, g, mul(A, u1(A, NV_OP_EXP, y), rsum(A, g, 1, &ax, true))));
    return true;
  }
  case NV_OP_ATTENTION: attention_rule(A, y, g); return true;
  case NV_OP_LAYER_NORM: {
    /* xhat = (x - mu) rstd; dgamma = sum(g xhat), dbeta = sum(g),
     * dx = rstd (gh - mean(gh) - xhat mean(gh xhat)), gh = g gamma */
    int64_t last = x->rank - 1, rows[NOVA_MAX_RANK];
    for (int i = 0; i < last; i++) rows[i] = i;
    nv_node *C = konst(A, dt, (double)x->shape[last]);
    nv_node *mu = dvd(A, rsum(A, x, 1, &last, true), C);
    nv_node *xc = sub(A, x, mu);
    nv_node *var = dvd(A, rsum(A, mul(A, xc, xc), 1, &last, true), C);
    nv_node *rstd = dvd(A, konst(A, dt, 1), u1(A, NV_OP_SQRT, add(A, var, konst(A, dt, y->eps))));
    nv_node *xhat = mul(A, xc, rstd);
    if (A->needs[in[1]->id]) accumulate(A, in[1], rsum(A, mul(A, g, xhat), (int)last, rows, false));
    if (A->needs[in[2]->id]) accumulate(A, in[2], rsum(A, g, (int)last, rows, false));
    if (A->needs[x->id]) {
      nv_node *gh = mul(A, g, in[1]);
      nv_node *m1 = dvd(A, rsum(A, gh, 1, &last, true), C);
      nv_node *m2 = dvd(A, rsum(A, mul(A, gh, xhat), 1, &last, true), C);
      accumulate(A, x, mul(A, rstd, sub(A, sub(A, gh, m1), mul(A, xhat, m2))));
    }
    return true;
  }
  case NV_OP_REDUCE_SUM: accumulate(A, x, expand_back(A, g, x, y)); return true;
  case NV_OP_REDUCE_MEAN:
    accumulate(A, x, expand_back(A, dvd(A, g, konst(A, dt, (double)numel(x) / (double)numel(y))), x, y));
    return true;
  case NV_OP_REDUCE_MAX:
  case NV_OP_REDUCE_MIN: { /* split evenly between tied extrema */
    nv_node *yb = expand_back(A, y, x, y);
    nv_node *hit = w3(A, b2(A, NV_OP_EQUAL, x, yb), konst(A, dt, 1), konst(A, dt, 0));
    nv_node *cnt = expand_back(A, rsum(A, hit, y->nlist, y->list, y->keepdims), x, y);
    accumulate(A, x, mul(A, expand_back(A, g, x, y), dvd(A, hit, cnt)));
    return true;
  }
  case NV_OP_RESHAPE: accumulate(A, x, reshape(A, g, x->rank, x->shape)); return true;
  case NV_OP_TRANSPOSE: {
    int64_t inv[NOVA_MAX_RANK];
    for (int i = 0; i < y->nlist; i++) inv[y->list[i]] = i;
    accumulate(A, x, transpose(A, g, inv));
    return true;
  }
  case NV_OP_BROADCAST: accumulate(A, x, unbroadcast(A, g, x)); return true;
  case NV_OP_CONCAT: {
    int64_t off = 0;
    for (int i = 0; i < 2; i++) {
      nv_node at = {.axis = y->axis, .start = off, .end = off + in[i]->shape[y->axis], .step = 1};
      if (A->needs[in[i]->id]) accumulate(A, in[i], mk(A, NV_OP_SLICE, 1, &g, &at));
      off += in[i]->shape[y->axis];
    }
    return true;
  }
  case NV_OP_SLICE: { /* g placed back between zeros (step 1) */
    if (y->step != 1) { /* strided: gather from g with a zero row appended, index n where nothing was taken */
      int64_t n = y->shape[y->axis], dim = x->shape[y->axis], s1[NOVA_MAX_RANK];
      memcpy(s1, g->shape, sizeof s1);
      s1[y->axis] = 1;
      nv_node *z = fe_graph_leaf(A->g, A->d, NV_OP_CONSTANT, NULL, dt, g->rank, s1, A->loc);
      nv_node *ix = fe_graph_leaf(A->g, A->d, NV_OP_CONSTANT, NULL, NOVA_DTYPE_I64, 1, &dim, A->loc);
      if (!z || !ix || !(ix->init.data = nv_xmalloc((size_t)dim * 8))) return false;
      ix->init.kind = NV_INIT_DATA;
      for (int64_t j = 0; j < dim; j++) {
        int64_t k = j - y->start;
        ((int64_t *)ix->init.data)[j] = k >= 0 && k % y->step == 0 && k / y->step < n ? k / y->step : n;
      }
      nv_node cat = {.axis = y->axis}, gat = {.axis = y->axis};
      nv_node *gz = mk(A, NV_OP_CONCAT, 2, (nv_node *[]){g, z}, &cat);
      accumulate(A, x, mk(A, NV_OP_GATHER, 2, (nv_node *[]){gz, ix}, &gat));
      return true;
    }
    nv_node *acc = g;
    int64_t s[NOVA_MAX_RANK];
    memcpy(s, x->shape, sizeof s);
    nv_node at = {.axis = y->axis};
    if (y->start > 0) {
      s[y->axis] = y->start;
      nv_node *z = fe_graph_leaf(A->g, A->d, NV_OP_CONSTANT, NULL, dt, x->rank, s, A->loc);
      if (z) z->init.kind = NV_INIT_ZEROS;
      acc = mk(A, NV_OP_CONCAT, 2, (nv_node *[]){z, acc}, &at);
    }
    if (y->end < x->shape[y->axis]) {
      s[y->axis] = x->shape[y->axis] - y->end;
      nv_node *z = fe_graph_leaf(A->g, A->d, NV_OP_CONSTANT, NULL, dt, x->rank, s, A->loc);
      if (z) z->init.kind = NV_INIT_ZEROS;
      acc = mk(A, NV_OP_CONCAT, 2, (nv_node *[]){acc, z}, &at);
    }
    accumulate(A, x, acc);
    return true;
  }
  case NV_OP_GATHER: { /* scatter-add as one-hot^T @ g: [n, V]^T [n, D], the gathered axis moved first */
    if (!A->needs[x->id]) return true;
    nv_node *idx = in[1];
    int ax = (int)y->axis, ni = idx->rank, r = x->rank;
    int64_t V = x->shape[ax], n = numel(idx), D = numel(x) / V;
    nv_node *cls = fe_graph_leaf(A->g, A->d, NV_OP_CONSTANT, NULL, idx->dtype, 1, &V, A->loc);
    if (!cls) return false;
    cls->init.kind = NV_INIT_DATA;
    size_t es = fe_dtype_size(idx->dtype);
    cls->init.data = nv_xmalloc((size_t)V * es);
    if (!cls->init.data) return false;
    for (int64_t i = 0; i < V; i++) {
      if (es == 8) ((int64_t *)cls->init.data)[i] = i;
      else ((int32_t *)cls->init.data)[i] = (int32_t)i;
    }
    /* g [A..., I..., B...] -> [I..., A..., B...] -> [n, D] */
    int64_t gp[NOVA_MAX_RANK], xs[NOVA_MAX_RANK], xp[NOVA_MAX_RANK];
    int k = 0;
    for (int i = 0; i < ni; i++) gp[k++] = ax + i;
    for (int i = 0; i < ax; i++) gp[k++] = i;
    for (int i = ax + ni; i < g->rank; i++) gp[k++] = i;
    nv_node *gt = ax ? transpose(A, g, gp) : g;
    int64_t ncol[2] = {n, 1}, gs[2] = {n, D};
    nv_node *idxn = reshape(A, idx, 2, ncol);
    if (idx->index_negative || y->index_negative) { /* i < 0 counts from the end */
      nv_node *w = add(A, idxn, konst(A, idx->dtype, (double)V));
      idxn = w3(A, b2(A, NV_OP_LESS, idxn, konst(A, idx->dtype, 0)), w, idxn);
    }
    nv_node at = {.to = dt};
    nv_node *hit = b2(A, NV_OP_EQUAL, idxn, cls);
    nv_node *oh = mk(A, NV_OP_CAST, 1, &hit, &at);
    nv_node *gx = b2(A, NV_OP_MATMUL, tr_last(A, oh), reshape(A, gt, 2, gs)); /* [V, A... B...] */
    /* back to [A..., V, B...] */
    k = 0;
    xs[k++] = V;
    for (int i = 0; i < r; i++)
      if (i != ax) xs[k++] = x->shape[i];
    for (int i = 0; i < r; i++) xp[i] = i < ax ? i + 1 : i == ax ? 0 : i;
    gx = reshape(A, gx, r, xs);
    accumulate(A, x, ax ? transpose(A, gx, xp) : gx);
    return true;
  }
  case NV_OP_CROSS_ENTROPY: { /* (softmax(x) - onehot(labels)) g / n */
    nv_node *lab = in[1];
    int64_t C = x->shape[x->rank - 1], n = numel(lab);
    nv_node *cls = fe_graph_leaf(A->g, A->d, NV_OP_CONSTANT, NULL, lab->dtype, 1, &C, A->loc);
    if (!cls) return false;
    cls->init.kind = NV_INIT_DATA;
    size_t es = fe_dtype_size(lab->dtype);
    cls->init.data = nv_xmalloc((size_t)C * es);
    if (!cls->init.data) return false;
    for (int64_t i = 0; i < C; i++) {
      if (es == 8) ((int64_t *)cls->init.data)[i] = i;
      else ((int32_t *)cls->init.data)[i] = (int32_t)i;
    }
    int64_t ls[NOVA_MAX_RANK];
    memcpy(ls, lab->shape, sizeof ls);
    ls[lab->rank] = 1;
    nv_node at = {.to = dt};
    nv_node *hit = b2(A, NV_OP_EQUAL, reshape(A, lab, lab->rank + 1, ls), cls);
    nv_node *oh = mk(A, NV_OP_CAST, 1, &hit, &at);
    nv_node *p = softmax(A, x, x->rank - 1);
    accumulate(A, x, mul(A, sub(A, p, oh), dvd(A, g, konst(A, dt, (double)n))));
    return true;
  }
  case NV_OP_CONV: { /* window ops keep the forward op's attributes */
    nv_node at = *y;
    if (A->needs[x->id]) {
      at.nlist = x->rank;
      memcpy(at.list, x->shape, sizeof at.list);
      accumulate(A, x, mk(A, NV_OP_CONV_GRAD_INPUT, 2, (nv_node *[]){g, in[1]}, &at));
    }
    if (A->needs[in[1]->id]) {
      at.nlist = in[1]->rank;
      memcpy(at.list, in[1]->shape, sizeof at.list);
      accumulate(A, in[1], mk(A, NV_OP_CONV_GRAD_WEIGHT, 2, (nv_node *[]){x, g}, &at));
    }
    return true;
  }
  case NV_OP_MAX_POOL:
    accumulate(A, x, mk(A, NV_OP_MAX_POOL_GRAD, 3, (nv_node *[]){x, y, g}, y));
    return true;
  case NV_OP_AVG_POOL: {
    nv_node at = *y;
    at.nlist = x->rank;
    memcpy(at.list, x->shape, sizeof at.list);
    accumulate(A, x, mk(A, NV_OP_AVG_POOL_GRAD, 1, &g, &at));
    return true;
  }
  case NV_OP_MAX_POOL_INDICES:
    return true; /* integer result */
  case NV_OP_CONV_GRAD_INPUT: { /* ConvTranspose: d input = conv(g, w) (cut to the input), d w = conv_grad_weight(g, input) */
    nv_node at = *y;
    nv_node *gin = in[0], *w = in[1];
    if (A->needs[gin->id]) {
      nv_node *c = mk(A, NV_OP_CONV, 2, (nv_node *[]){g, w}, &at);
      for (int i = 2; c && i < c->rank; i++)
        if (c->shape[i] != gin->shape[i]) {
          nv_node sl = {.axis = i, .start = 0, .end = gin->shape[i], .step = 1};
          c = mk(A, NV_OP_SLICE, 1, &c, &sl);
        }
      accumulate(A, gin, c);
    }
    if (A->needs[w->id]) {
      at.nlist = w->rank;
      memcpy(at.list, w->shape, sizeof at.list);
      accumulate(A, w, mk(A, NV_OP_CONV_GRAD_WEIGHT, 2, (nv_node *[]){g, gin}, &at));
    }
    return true;
  }
  case NV_OP_RMS_NORM: {
    /* rstd = 1/sqrt(mean(x^2) + eps), xhat = x rstd; dscale = sum over rows of g xhat,
     * dx = rstd (gs - xhat mean(gs xhat)), gs = g scale */
    int64_t last = x->rank - 1, rows[NOVA_MAX_RANK];
    for (int i = 0; i < last; i++) rows[i] = i;
    nv_node *C = konst(A, dt, (double)x->shape[last]);
    /* the sum of squares as the forward's lowering writes it: the step computes it once */
    nv_node *ms = dvd(A, rsum(A, mul(A, x, x), 1, &last, true), C);
    nv_node *rstd = dvd(A, konst(A, dt, 1), u1(A, NV_OP_SQRT, add(A, ms, konst(A, dt, y->eps))));
    nv_node *xhat = mul(A, x, rstd);
    if (A->needs[in[1]->id]) { /* rank 1: one row, nothing to sum */
      nv_node *gx = mul(A, g, xhat);
      accumulate(A, in[1], last ? rsum(A, gx, (int)last, rows, false) : gx);
    }
    if (A->needs[x->id]) {
      nv_node *gs = mul(A, g, in[1]);
      nv_node *m = dvd(A, rsum(A, mul(A, gs, xhat), 1, &last, true), C);
      accumulate(A, x, mul(A, rstd, sub(A, gs, mul(A, xhat, m))));
    }
    return true;
  }
  case NV_OP_ROTARY: {
    /* the inverse rotation, rotary(g, cos, -sin); with x1, x2 and g1, g2
     * the pairs' halves, dcos = g1 x1 + g2 x2 and dsin = g2 x1 - g1 x2,
     * summed over the dims cos and sin are broadcast along */
    nv_node *c = in[1], *s = in[2];
    if (A->needs[x->id]) accumulate(A, x, mk(A, NV_OP_ROTARY, 3, (nv_node *[]){g, c, u1(A, NV_OP_NEG, s)}, y));
    if (A->needs[c->id] || A->needs[s->id]) {
      int64_t last = x->rank - 1, D = x->shape[last];
      bool il = y->mode != 0;
      nv_node h1 = {.axis = last, .start = 0, .end = il ? D : D / 2, .step = il ? 2 : 1};
      nv_node h2 = {.axis = last, .start = il ? 1 : D / 2, .end = D, .step = il ? 2 : 1};
      nv_node *x1 = mk(A, NV_OP_SLICE, 1, &x, &h1), *x2 = mk(A, NV_OP_SLICE, 1, &x, &h2);
      nv_node *g1 = mk(A, NV_OP_SLICE, 1, &g, &h1), *g2 = mk(A, NV_OP_SLICE, 1, &g, &h2);
      if (A->needs[c->id]) accumulate(A, c, unbroadcast(A, add(A, mul(A, g1, x1), mul(A, g2, x2)), c));
      if (A->needs[s->id]) accumulate(A, s, unbroadcast(A, sub(A, mul(A, g2, x1), mul(A, g1, x2)), s));
    }
    return true;
  }
  case NV_OP_CONV_GRAD_WEIGHT: case NV_OP_MAX_POOL_GRAD: case NV_OP_AVG_POOL_GRAD:
  case NV_OP_STOCHASTIC_ROUND: /* (the optimizer's: after the backward pass) */
  case NV_OP_ALL_REDUCE:       /* (--data-parallel's: after it too) */
  case NV_OP_REDUCE_SCATTER: case NV_OP_ALL_GATHER: case NV_OP_SHARD:
  case NV_OP_COUNT:
    return false; /* no second derivatives */
  }
  return false;
}

/* ---- optimizer ----------------------------------------------------------- */

/* A new optimizer-state tensor (zeros) of the shape of PV (P, or this
 * rank's shard of it: NAME.SUFFIX.shard) in dtype DT, an argument of the
 * step. */
static nv_node *state(ad *A, const nv_node *p, const nv_node *pv, const char *suffix, nova_dtype dt) {
  char name[600];
  snprintf(name, sizeof name, "%s.%s%s", p->name, suffix, pv != p ? ".shard" : "");
  nv_node *s = fe_graph_leaf(A->g, A->d, NV_OP_PARAM, name, dt, pv->rank, pv->shape, p->loc);
  if (!s) {
    A->failed = true;
    return NULL;
  }
  s->role = NOVA_ROLE_OPT_STATE;
  s->init.kind = NV_INIT_ZEROS;
  return s;
}

/* The new value of TARGET (a param or optimizer state): where(A->bad,
 * TARGET, VALUE), an output of role update; returns that guarded value
 * (what later updates must read, so that each update stays one fused loop
 * nest), or NULL. */
static nv_node *add_update(ad *A, nv_node *target, nv_node *value) {
  nv_node *kept = w3(A, A->bad, target, value);
  if (!kept) return NULL;
  char name[600];
  snprintf(name, sizeof name, "%s.next", target->name);
  if (fe_graph_add_output(A->g, A->d, name, kept, target->loc)) return NULL;
  A->g->outputs[A->g->noutputs - 1].role = NOVA_ROLE_UPDATE;
  A->g->outputs[A->g->noutputs - 1].updates = target;
  return kept;
}

static nv_node *cast_to(ad *A, nv_node *x, nova_dtype dt) {
  return !x || x->dtype == dt ? x : mk(A, NV_OP_CAST, 1, &x, &(nv_node){.to = dt});
}

/* The new value P1 (f32) of the bf16 param P stochastically rounded to
 * bf16 (its own stream of the step's Philox numbers: 2^30 + STREAM, above
 * every dropout's), as P's update. */
static nv_node *sround_update(ad *A, nv_node *p, nv_node *p1, nv_node *seed, nv_node *step, int64_t stream) {
  nv_node *r = mk(A, NV_OP_STOCHASTIC_ROUND, 3, (nv_node *[]){p1, seed, step},
                  &(nv_node){.axis = (INT64_C(1) << 30) + stream});
  return r ? add_update(A, p, r) : NULL;
}

/* The new value of param p with gradient gr; lr is the run-time input,
 * t1 (adamw) the step count after this step.  Every state it writes goes
 * through add_update, and what it reads of the new state is the guarded
 * value (on a skipped step the moments are the old ones, and the param's
 * value, computed from them, is thrown away by its own guard).  A bf16
 * param with RNG (seed and step; the param's own STREAM) is updated in
 * f32, with f32 state, and stochastically rounded back. */
static int update(ad *A, const ad_options *o, nv_node *p, nv_node *gr, nv_node *lr, nv_node *t1, nv_node **rng,
                  int64_t stream, double wd) {
  bool sr = rng && p->dtype == NOVA_DTYPE_BF16;
  nova_dtype dt = sr ? NOVA_DTYPE_F32 : p->dtype;
  A->loc = p->loc;
  nv_node *ps = o->shard_world > 1 ? mk(A, NV_OP_SHARD, 1, &p, &(nv_node){.mode = o->shard_world}) : p;
  if (!ps) return -1;
  nv_node *pv = sr ? cast_to(A, p, dt) : ps; /* p's value (or this rank's shard of it) in dt */
  if (sr) gr = cast_to(A, gr, dt);
  nv_node *lrp = cast_to(A, lr, dt), *p1;
  if (o->optimizer == AD_SGD) { /* p - lr (g + wd p) */
    nv_node *d = wd ? add(A, gr, mul(A, konst(A, dt, wd), pv)) : gr;
    p1 = sub(A, pv, mul(A, lrp, d));
  } else if (o->optimizer == AD_MOMENTUM) { /* v = mu v + g; p - lr (nesterov ? g + mu v : v) */
    nv_node *d = wd ? add(A, gr, mul(A, konst(A, dt, wd), pv)) : gr;
    nv_node *v = state(A, p, pv, "momentum", dt);
    nv_node *v1 = add_update(A, v, add(A, mul(A, konst(A, dt, o->momentum), v), d));
    if (!v1) return -1;
    nv_node *step = o->nesterov ? add(A, d, mul(A, konst(A, dt, o->momentum), v1)) : v1;
    p1 = sub(A, pv, mul(A, lrp, step));
  } else {
    /* adamw: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     * p - lr wd p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) */
    nv_node *m = state(A, p, pv, "adam_m", dt), *v = state(A, p, pv, "adam_v", dt);
    nv_node *m1 = add_update(A, m, add(A, mul(A, konst(A, dt, o->beta1), m), mul(A, konst(A, dt, 1 - o->beta1), gr)));
    nv_node *v1 = add_update(A, v, add(A, mul(A, konst(A, dt, o->beta2), v),
                                       mul(A, konst(A, dt, 1 - o->beta2), mul(A, gr, gr))));
    nv_node *tt = cast_to(A, t1, dt);
    nv_node *bc1 = sub(A, konst(A, dt, 1), b2(A, NV_OP_POW, konst(A, dt, o->beta1), tt));
    nv_node *bc2 = sub(A, konst(A, dt, 1), b2(A, NV_OP_POW, konst(A, dt, o->beta2), tt));
    nv_node *den = add(A, u1(A, NV_OP_SQRT, dvd(A, v1, bc2)), konst(A, dt, o->eps));
    nv_node *pd = wd ? sub(A, pv, mul(A, mul(A, lrp, konst(A, dt, wd)), pv)) : pv;
    p1 = sub(A, pd, mul(A, lrp, dvd(A, dvd(A, m1, bc1), den)));
  }
  if (!p1) return -1;
  if (ps != p) { /* every rank's share of the new value, gathered, cut to P's size and shape */
    nv_node *ag = mk(A, NV_OP_ALL_GATHER, 1, &p1, &(nv_node){.axis = 0, .mode = o->shard_world});
    if (!ag || !(ag->name = nv_xstrdup(p->name))) return -1;
    nv_node *flat = mk(A, NV_OP_SLICE, 1, &ag, &(nv_node){.axis = 0, .start = 0, .end = fe_numel(p), .step = 1});
    p1 = flat ? reshape(A, flat, p->rank, p->shape) : NULL;
    if (!p1) return -1;
  }
  return (sr ? sround_update(A, p, p1, rng[0], rng[1], stream) : add_update(A, p, p1)) ? 0 : -1;
}

/* The step's Philox state, for stochastic rounding (fe_rng_state): made,
 * when the model has no dropout, with the update of rng.step (guarded:
 * a skipped step does not advance it).  0, or -1. */
static int rng_state(ad *A, nv_node **rng) {
  nv_loc nowhere = {0};
  int made = fe_rng_state(A->g, A->d, nowhere, &rng[0], &rng[1]);
  if (made <= 0) return made;
  A->loc = nowhere;
  return add_update(A, rng[1], add(A, rng[1], konst(A, NOVA_DTYPE_I64, 1))) ? 0 : -1;
}

/* Whether node I is a trained param with a gradient. */
static bool has_grad(const ad *A, int i) {
  return A->g->nodes[i]->op == NV_OP_PARAM && A->needs[i] && A->grad[i];
}

/* ---- the finite check ----------------------------------------------------------- */

/* x - x summed over every element (into dtype DT): 0 exactly when every
 * element of x is finite, NaN when one is NaN or infinite (inf - inf is
 * NaN, and a NaN term makes the sum NaN in any order: the cpu target sums
 * it in vector lanes, cpu_tile.c).  One read of x, in
 * one reduction; nothing folds x - x away (no fast-math flags). */
static nv_node *nonfinite_term(ad *A, nv_node *x, nova_dtype dt) {
  int64_t axes[NOVA_MAX_RANK];
  for (int i = 0; i < x->rank; i++) axes[i] = i;
  nv_node *d = sub(A, x, x);
  nv_node *t = x->rank ? rsum(A, d, x->rank, axes, false) : d;
  return !t || t->dtype == dt ? t : mk(A, NV_OP_CAST, 1, &t, &(nv_node){.to = dt});
}

/* The step's check, made once the backward pass is complete:
 *   A->bad = isnan((loss - loss) + sum over the gradients of sum(g - g)),
 * true when the loss or any element of a gradient is NaN or infinite (one
 * reduction per gradient, then a few scalar ops).  The optimizer guards
 * each update with it (add_update), and so are, here, the updates the
 * frontend made (buffers: BatchNormalization's running statistics,
 * rng.step), so that a skipped step leaves every bit of the state as it
 * was.  PER_PARAM (AD_SKIP_PARAM): A->bad is the loss's check alone
 * (the frontend's updates); each param's update is guarded by the loss's
 * and its own gradient's (ad_train), so that it needs no other gradient
 * and can run as soon as its own is complete.  The flag is the output
 * "nonfinite" (role status), read by nova_step_run after each run
 * (NOVA_ERR_NONFINITE). */
static int finite_check(ad *A, nv_node *loss, bool per_param, bool sharded) {
  nv_graph *g = A->g;
  A->loc = loss->loc;
  nv_node *sum = A->l0 = A->l0 ? A->l0 : nonfinite_term(A, loss, loss->dtype);
  for (int i = 0; i < A->nforward && !per_param; i++)
    if (has_grad(A, i))
      sum = add(A, sum, nonfinite_term(A, A->grad[i], loss->dtype));
  if (sharded && sum) { /* each rank checked its shards: the verdict is the sum over the ranks */
    sum = mk(A, NV_OP_ALL_REDUCE, 1, &sum, &(nv_node){.axis = 0});
    if (!sum || !(sum->name = nv_xstrdup("nonfinite"))) return -1;
  }
  A->bad = u1(A, NV_OP_ISNAN, sum); /* per param: the loss's alone, for the frontend's updates and adam.step */
  if (!A->bad) return -1;
  for (int i = 0; i < g->noutputs; i++) {
    nv_output *o = &g->outputs[i];
    if (o->role != NOVA_ROLE_UPDATE || !o->updates) continue;
    A->loc = o->loc;
    if (!(o->node = w3(A, A->bad, g->nodes[o->updates->id], o->node))) return -1;
  }
  return 0;
}

/* --accumulate: with K the run-time input accum.steps (i64, default
 * o->accumulate) and the state accum.count (the runs accumulated so far),
 * each trained param's gradient g (unscaled by INV) is added to its state
 * NAME.accum; A->grad becomes the mean (accum + g) / K that the optimizer
 * reads, and A->bad, the optimizer's guard, also holds unless count + 1
 * reaches K: that run updates, and clears the sums and the count.  The
 * sums and the count are guarded by the finite check alone (a skipped run
 * adds nothing).  With --shard-optimizer the sums are of this rank's
 * shares (each run's gradients are reduce-scattered: a sum of sums).  0,
 * or -1 after a diagnostic. */
static int accumulate_runs(ad *A, const ad_options *o, nv_node *inv, bool per_param) {
  nv_graph *g = A->g;
  nv_loc nowhere = {0};
  if (per_param) {
    nv_error_plain(A->d, "--accumulate keeps or skips each run whole: use --nonfinite=skip-step");
    return -1;
  }
  nv_node *k = fe_graph_leaf(g, A->d, NV_OP_INPUT, "accum.steps", NOVA_DTYPE_I64, 0, NULL, nowhere);
  nv_node *count = fe_graph_leaf(g, A->d, NV_OP_PARAM, "accum.count", NOVA_DTYPE_I64, 0, NULL, nowhere);
  if (!k || !count) return -1;
  k->has_default = true;
  k->init = (nv_init){.kind = NV_INIT_CONST, .a = o->accumulate};
  count->role = NOVA_ROLE_OPT_STATE;
  count->init.kind = NV_INIT_ZEROS;
  A->loc = nowhere;
  nv_node *c1 = add(A, count, konst(A, NOVA_DTYPE_I64, 1));
  nv_node *apply = b2(A, NV_OP_GREATER_EQUAL, c1, k);
  nv_node *keep = u1(A, NV_OP_NOT, apply); /* the sums go on: not an update */
  if (!add_update(A, count, mul(A, c1, cast_to(A, keep, NOVA_DTYPE_I64)))) return -1;
  nv_node *inv_k = dvd(A, konst(A, NOVA_DTYPE_F32, 1), cast_to(A, k, NOVA_DTYPE_F32));
  for (int i = 0; i < A->nforward; i++) {
    nv_node *p = g->nodes[i];
    if (!has_grad(A, i)) continue;
    A->loc = p->loc;
    nv_node *gr = A->grad[i];
    if (inv) gr = mul(A, gr, cast_to(A, inv, gr->dtype));
    /* (--shard-optimizer: GR is this rank's share of the sum, which the sums keep: NAME.accum.shard) */
    nv_node *acc = gr ? state(A, p, o->shard_world > 1 ? gr : p, "accum", gr->dtype) : NULL;
    nv_node *acc1 = add(A, acc, gr);
    if (!acc1 || !add_update(A, acc, mul(A, acc1, cast_to(A, keep, acc1->dtype)))) return -1;
    A->grad[i] = mul(A, acc1, cast_to(A, inv_k, acc1->dtype));
  }
  A->loc = nowhere;
  A->bad = b2(A, NV_OP_OR, A->bad, keep);
  return A->bad && !A->failed ? 0 : -1;
}

/* --clip-grad-norm: min(1, M / (norm + 1e-6)) with norm the 2-norm of
 * every trained param's gradient (unscaled by INV under loss scaling),
 * summed in f32, and M the run-time input clip.max_norm; as
 * torch.nn.utils.clip_grad_norm_ scales them.  The norm is the output
 * grad_norm (role status).  The factor reads every gradient: the step's
 * updates wait for all of them, as the whole-step finite check makes
 * them (per-parameter skipping cannot be combined with it).  With
 * --shard-optimizer a rank's gradients are its shares of the sums: their
 * squares are summed over the ranks by one more (scalar) all-reduce. */
static nv_node *clip_factor(ad *A, const ad_options *o, nv_node *inv, bool per_param) {
  nv_graph *g = A->g;
  nv_loc nowhere = {0};
  if (per_param) {
    nv_error_plain(A->d, "--clip-grad-norm scales every gradient by the norm of them all, so a step is kept or "
                         "skipped whole: use --nonfinite=skip-step");
    return NULL;
  }
  nv_node *mx = fe_graph_leaf(g, A->d, NV_OP_INPUT, "clip.max_norm", NOVA_DTYPE_F32, 0, NULL, nowhere);
  if (!mx) return NULL;
  mx->has_default = true;
  mx->init = (nv_init){.kind = NV_INIT_CONST, .a = o->clip_norm};
  nv_node *total = NULL;
  for (int i = 0; i < A->nforward; i++) {
    nv_node *p = g->nodes[i];
    if (!has_grad(A, i)) continue;
    A->loc = p->loc;
    nv_node *gf = cast_to(A, A->grad[i], NOVA_DTYPE_F32);
    int64_t axes[NOVA_MAX_RANK];
    for (int k = 0; k < p->rank; k++) axes[k] = k;
    nv_node *sq = mul(A, gf, gf);
    nv_node *t = gf && gf->rank ? rsum(A, sq, gf->rank, axes, false) : sq;
    total = total ? add(A, total, t) : t;
  }
  if (!total) return NULL;
  A->loc = nowhere;
  if (o->shard_world > 1) { /* each rank summed the squares of its shares (zero-padded): the sum over the ranks */
    total = mk(A, NV_OP_ALL_REDUCE, 1, &total, &(nv_node){.axis = 0});
    if (!total || !(total->name = nv_xstrdup("grad_norm.squares"))) return NULL;
  }
  if (inv) total = mul(A, total, mul(A, inv, inv));
  nv_node *norm = u1(A, NV_OP_SQRT, total);
  if (!norm || fe_graph_add_output(g, A->d, "grad_norm", norm, nowhere)) return NULL;
  g->outputs[g->noutputs - 1].role = NOVA_ROLE_STATUS;
  nv_node *c = dvd(A, mx, add(A, norm, konst(A, NOVA_DTYPE_F32, 1e-6)));
  return b2(A, NV_OP_MINIMUM, konst(A, NOVA_DTYPE_F32, 1), c);
}

/* The flags' names are the step's: a model tensor of either name is
 * refused (0, or -1 after a diagnostic). */
static int check_one_name(nv_graph *g, nv_diag *d, const char *n) {
  for (int i = 0; i < g->noutputs; i++)
    if (!strcmp(g->outputs[i].name, n)) {
      nv_error(d, g->outputs[i].loc, "--train: the training step's finite check is the tensor '%s'; rename the "
               "output '%s'", n, n);
      return -1;
    }
  for (int i = 0; i < g->nnodes; i++)
    if ((g->nodes[i]->op == NV_OP_INPUT || g->nodes[i]->op == NV_OP_PARAM) && g->nodes[i]->name &&
        !strcmp(g->nodes[i]->name, n)) {
      nv_error(d, g->nodes[i]->loc, "--train: the training step's finite check is the tensor '%s'; rename the "
               "%s '%s'", n, g->nodes[i]->op == NV_OP_INPUT ? "input" : "parameter", n);
      return -1;
    }
  return 0;
}

static int check_flag_name(nv_graph *g, nv_diag *d) {
  return check_one_name(g, d, "nonfinite") || check_one_name(g, d, "nonfinite.skipped") ? -1 : 0;
}

/* ---- dynamic loss scaling ------------------------------------------------------ */

/* A scalar of the step's state (role opt_state, initially INIT). */
static nv_node *scalar_state(ad *A, const char *name, nova_dtype dt, double init) {
  nv_node *s = fe_graph_leaf(A->g, A->d, NV_OP_PARAM, name, dt, 0, NULL, A->loc);
  if (!s) {
    A->failed = true;
    return NULL;
  }
  s->role = NOVA_ROLE_OPT_STATE;
  s->init = (nv_init){.kind = NV_INIT_CONST, .a = init};
  return s;
}

/* The new value of TARGET, written on every step (not guarded by the
 * finite check: the loss scale changes on a skipped step too). */
static int scale_state_update(ad *A, nv_node *target, nv_node *value) {
  char name[600];
  snprintf(name, sizeof name, "%s.next", target->name);
  if (!value || fe_graph_add_output(A->g, A->d, name, value, target->loc)) return -1;
  A->g->outputs[A->g->noutputs - 1].role = NOVA_ROLE_UPDATE;
  A->g->outputs[A->g->noutputs - 1].updates = target;
  return 0;
}

/* GradScaler's rule, once the finite check A->bad is made: on a step with a
 * NaN or an infinity the scale halves (and the step changes nothing else);
 * after WINDOW clean steps in a row it doubles (up to 2^64).  The counts of
 * clean steps since the last change and of skipped steps are state too. */
static int scale_rule(ad *A, nv_node *scale, int64_t window) {
  nv_node *good = scalar_state(A, "amp.good_steps", NOVA_DTYPE_I64, 0);
  nv_node *skipped = scalar_state(A, "amp.skipped_steps", NOVA_DTYPE_I64, 0);
  if (!good || !skipped) return -1;
  nv_node *one = konst(A, NOVA_DTYPE_I64, 1), *zero = konst(A, NOVA_DTYPE_I64, 0);
  nv_node *g1 = add(A, good, one);
  nv_node *grow = b2(A, NV_OP_GREATER_EQUAL, g1, konst(A, NOVA_DTYPE_I64, (double)window));
  nv_node *up = b2(A, NV_OP_MINIMUM, mul(A, scale, konst(A, NOVA_DTYPE_F32, 2)), konst(A, NOVA_DTYPE_F32, 0x1p64));
  nv_node *s1 = w3(A, A->bad, mul(A, scale, konst(A, NOVA_DTYPE_F32, 0.5)), w3(A, grow, up, scale));
  nv_node *good1 = w3(A, A->bad, zero, w3(A, grow, zero, g1));
  nv_node *sk1 = w3(A, A->bad, add(A, skipped, one), skipped);
  return scale_state_update(A, scale, s1) || scale_state_update(A, good, good1) ||
         scale_state_update(A, skipped, sk1) ? -1 : 0;
}

/* ---- the pass --------------------------------------------------------------- */

/* The index of the loss among g's outputs, or -1 after a diagnostic. */
static int find_loss(nv_graph *g, nv_diag *d, const char *name) {
  int li = -1;
  for (int i = 0; i < g->noutputs; i++) {
    const nv_node *n = g->outputs[i].node;
    if (g->outputs[i].role == NOVA_ROLE_UPDATE) continue; /* state updates the frontend made */
    if (name ? !strcmp(g->outputs[i].name, name) : (n->rank == 0 && differentiable(n->dtype))) {
      if (!name && li >= 0) {
        nv_error(d, g->outputs[i].loc, "--train: outputs '%s' and '%s' are both scalars; choose the loss with --loss=NAME",
                 g->outputs[li].name, g->outputs[i].name);
        return -1;
      }
      li = i;
    }
  }
  if (li < 0) {
    if (name) nv_error_plain(d, "--loss=%s: the model has no output named '%s'", name, name);
    else nv_error_plain(d, "--train needs a loss: a scalar floating-point output (or --loss=NAME)");
    return -1;
  }
  const nv_node *loss = g->outputs[li].node;
  if (loss->rank != 0 || !differentiable(loss->dtype)) {
    nv_error(d, g->outputs[li].loc, "the loss '%s' must be a floating-point scalar, got %s with %d dims",
             g->outputs[li].name, fe_dtype_name(loss->dtype), loss->rank);
    return -1;
  }
  return li;
}

/* A.needs of every forward node, given which params are trained (A.needs
 * preset for params); returns the number of trained params. */
static int propagate_needs(ad *A) {
  int ntrain = 0;
  for (int i = 0; i < A->nforward; i++) {
    nv_node *n = A->g->nodes[i];
    ntrain += n->op == NV_OP_PARAM && A->needs[i];
    for (int k = 0; k < n->nin && !A->needs[i]; k++)
      A->needs[i] = A->needs[n->in[k]->id] && differentiable(n->dtype);
  }
  return ntrain;
}

/* The backward pass from LOSS, in reverse topological order, seeded with
 * SEED (NULL: 1; the loss scale, in the loss's dtype: an f16 loss's seed of
 * 65536 is +inf, and that first step halves the scale like any overflow). */
static int backward(ad *A, nv_node *loss, nv_node *seed) {
  A->loc = loss->loc;
  A->grad[loss->id] = !seed ? konst(A, loss->dtype, 1.0)
                    : seed->dtype == loss->dtype ? seed : mk(A, NV_OP_CAST, 1, &seed, &(nv_node){.to = loss->dtype});
  for (int i = A->nforward - 1; i >= 0 && !A->failed; i--) {
    nv_node *n = A->g->nodes[i];
    if (!A->grad[i] || !A->needs[i]) continue;
    A->loc = n->loc;
    if (!rule(A, n, A->grad[i]) && !A->failed) {
      nv_error(A->d, n->loc, "--train: %s has no backward rule", nv_op_name(n->op));
      A->failed = true;
    }
  }
  return A->failed || nv_diag_count(A->d) ? -1 : 0;
}

static bool trainable(const nv_node *n) {
  return n->op == NV_OP_PARAM && n->role == NOVA_ROLE_PARAM && !n->frozen && fe_dtype_is_float(n->dtype);
}

bool ad_trains(const nv_node *n, const char *freeze, const char *train_only, bool *fm, bool *tm) {
  bool only = !train_only || nv_glob_match(train_only, n->name, tm); /* evaluated first: marks TM */
  return trainable(n) && !nv_glob_match(freeze, n->name, fm) && only;
}

int ad_grad_reach(nv_graph *g, nv_diag *d, const char *loss, bool *reached) {
  int li = find_loss(g, d, loss), nf = g->nnodes, rc = -1;
  if (li < 0) return -1;
  ad A = {.g = g, .d = d, .nforward = nf};
  A.grad = nv_xcalloc((size_t)nf + 1, sizeof *A.grad);
  A.needs = nv_xcalloc((size_t)nf + 1, sizeof *A.needs);
  if (!A.grad || !A.needs) goto out;
  for (int i = 0; i < nf; i++) A.needs[i] = trainable(g->nodes[i]);
  propagate_needs(&A);
  nv_node *l = g->outputs[li].node;
  if (A.needs[l->id] && backward(&A, l, NULL)) goto out;
  for (int i = 0; i < nf; i++) reached[i] = g->nodes[i]->op == NV_OP_PARAM && A.grad[i];
  rc = 0;
out:
  free(A.grad);
  free(A.needs);
  return rc;
}

/* Checks that every pattern of GLOBS (option OPT) matched a parameter. */
static int check_globs(nv_diag *d, const char *opt, const char *globs, const bool *matched) {
  for (int k = 0; k < nv_glob_count(globs); k++)
    if (!matched[k]) {
      nv_error_plain(d, "%s: pattern %d of '%s' matches no parameter", opt, k + 1, globs);
      return -1;
    }
  return 0;
}

/* Marks the trained params in A->needs (role param, float, not frozen,
 * matched by --train-only if given, not by --freeze); returns how many, or
 * -1 after a diagnostic. */
static int choose_params(ad *A, const ad_options *o) {
  bool fm[64] = {0}, tm[64] = {0};
  for (int i = 0; i < A->nforward; i++) {
    const nv_node *n = A->g->nodes[i];
    if (n->op != NV_OP_PARAM) continue;
    A->needs[i] = ad_trains(n, o->freeze, o->train_only, fm, tm);
    if (A->needs[i] && !wide_float(n->dtype) && !(o->bf16_sround && n->dtype == NOVA_DTYPE_BF16)) {
      nv_error(A->d, n->loc, "--train: param '%s' is %s; training f16/bf16 parameters is not supported (freeze it with "
               "--freeze=%s)", n->name, fe_dtype_name(n->dtype), n->name);
      return -1;
    }
  }
  if (check_globs(A->d, "--freeze", o->freeze, fm) || check_globs(A->d, "--train-only", o->train_only, tm)) return -1;
  int ntrain = propagate_needs(A);
  if (!ntrain)
    nv_error_plain(A->d, "--train: the model has no trainable parameters%s",
                   o->freeze || o->train_only ? " (all are frozen, or not matched by --train-only)" : "");
  return ntrain ? ntrain : -1;
}

/* --data-parallel: each trained param's gradient summed over the ranks
 * (nova.all_reduce, bucketed and placed by passes/comm.c) and scaled by the
 * input comm.scale (1 / the number of ranks, set by the runtime; 1 by
 * default), a multiply the update fuses: every check and update reads the
 * mean gradient of the global batch. */
static int all_reduce_grads(ad *A, int nf, int shard_world, int world_size) {
  nv_node *s = fe_graph_leaf(A->g, A->d, NV_OP_INPUT, "comm.scale", NOVA_DTYPE_F32, 0, NULL, (nv_loc){0});
  if (!s) return -1;
  s->has_default = true;
  s->init = (nv_init){.kind = NV_INIT_CONST, .a = 1};
  if (world_size > 0) { /* (read by the runtime alone: the ranks it expects) */
    nv_node *w = fe_graph_leaf(A->g, A->d, NV_OP_INPUT, "comm.world", NOVA_DTYPE_I32, 0, NULL, (nv_loc){0});
    if (!w) return -1;
    w->has_default = true;
    w->init = (nv_init){.kind = NV_INIT_CONST, .a = world_size};
  }
  for (int i = 0; i < nf; i++) {
    nv_node *p = A->g->nodes[i], *gr = A->grad[i];
    if (p->op != NV_OP_PARAM || !A->needs[i] || !gr) continue;
    A->loc = p->loc;
    nv_node *r = shard_world > 1 ? mk(A, NV_OP_REDUCE_SCATTER, 1, &gr, &(nv_node){.axis = 0, .mode = shard_world})
                                 : mk(A, NV_OP_ALL_REDUCE, 1, &gr, &(nv_node){.axis = 0});
    if (r && !(r->name = nv_xstrdup(p->name))) return -1; /* (the param it is the gradient of: the manifest's) */
    A->grad[i] = mul(A, r, s->dtype == gr->dtype ? s : mk(A, NV_OP_CAST, 1, &s, &(nv_node){.to = gr->dtype}));
    if (!A->grad[i]) return -1;
  }
  return 0;
}

int ad_train(nv_graph *g, nv_diag *d, const ad_options *o) {
  nv_loc nowhere = {0};
  int li = find_loss(g, d, o->loss);
  if (li < 0 || check_flag_name(g, d)) return -1;
  nv_node *loss = g->outputs[li].node;
  int nf = g->nnodes, rc = -1;
  ad A = {.g = g, .d = d, .nforward = nf};
  A.grad = nv_xcalloc((size_t)nf + 1, sizeof *A.grad);
  A.needs = nv_xcalloc((size_t)nf + 1, sizeof *A.needs);
  if (!A.grad || !A.needs || choose_params(&A, o) < 0) goto out;
  if (!A.needs[loss->id]) {
    nv_error(d, g->outputs[li].loc, "the loss '%s' does not depend on any trainable parameter", g->outputs[li].name);
    goto out;
  }
  nv_node *scale = NULL, *inv = NULL; /* dynamic loss scaling: the state, 1 / it */
  if (o->loss_scale > 0) {
    A.loc = loss->loc;
    if (!(scale = scalar_state(&A, "amp.loss_scale", NOVA_DTYPE_F32, o->loss_scale))) goto out;
  }
  bool per_param = o->nonfinite == AD_SKIP_PARAM;
  if (per_param && scale) {
    nv_error_plain(d, "--nonfinite=skip-param cannot be used with dynamic loss scaling: an overflowing step must "
                      "change nothing but the loss scale (use --nonfinite=skip-step, or --loss-scale=none)");
    goto out;
  }
  if (o->data_parallel && o->shard_world <= 1) {
    /* the loss's check summed over the ranks too (NaN if one rank's loss is not finite), so that
     * every rank skips the same steps; made before the backward, it goes in the first bucket
     * (sharded, the whole check is summed: finite_check) */
    A.loc = loss->loc;
    nv_node *t = nonfinite_term(&A, loss, loss->dtype);
    A.l0 = t ? mk(&A, NV_OP_ALL_REDUCE, 1, &t, &(nv_node){.axis = 0}) : NULL;
    if (!A.l0 || !(A.l0->name = nv_xstrdup("nonfinite.loss"))) goto out;
  }
  if (o->shard_world > 1 && (per_param || o->bf16_sround)) {
    nv_error_plain(d, per_param ? "--shard-optimizer checks the gradients for the whole step (each rank holds only "
                                  "its shards): use --nonfinite=skip-step"
                                : "--shard-optimizer cannot update bf16 params by stochastic rounding yet (use "
                                  "f32 master params)");
    goto out;
  }
  if (backward(&A, loss, scale)) goto out;
  int after_backward = g->nnodes; /* the nodes from here on: check and update (ad_schedule_updates) */
  if (o->data_parallel && all_reduce_grads(&A, nf, o->shard_world, o->world_size)) goto out;
  if (finite_check(&A, loss, per_param, o->shard_world > 1) || A.failed) goto out;
  if (scale) {
    A.loc = loss->loc;
    inv = dvd(&A, konst(&A, NOVA_DTYPE_F32, 1), scale);
    if (!inv || scale_rule(&A, scale, o->loss_scale_window)) goto out;
    g->loss_scale = o->loss_scale;
    g->loss_scale_window = o->loss_scale_window;
  }
  /* the optimizer */
  nv_node *lr = fe_graph_leaf(g, d, NV_OP_INPUT, "lr", NOVA_DTYPE_F32, 0, NULL, nowhere);
  if (!lr) goto out;
  lr->has_default = true;
  lr->init = (nv_init){.kind = NV_INIT_CONST, .a = o->lr};
  nv_node *bad_step = A.bad; /* the finite check (accumulation narrows the optimizer's guard) */
  if (o->accumulate > 1) {
    if (accumulate_runs(&A, o, inv, per_param)) goto out;
    inv = NULL; /* the gradients A.grad now are the unscaled means */
  }
  nv_node *clip = NULL;
  if (o->clip_norm > 0 && !(clip = clip_factor(&A, o, inv, per_param))) goto out;
  nv_node *t1 = NULL, *adam_t = NULL;
  if (o->optimizer == AD_ADAMW) {
    nv_node *t = fe_graph_leaf(g, d, NV_OP_PARAM, "adam.step", NOVA_DTYPE_F32, 0, NULL, nowhere);
    if (!t) goto out;
    t->role = NOVA_ROLE_OPT_STATE;
    A.loc = nowhere;
    /* per param: the updates read t + 1 unguarded (a skipped param's result is dropped anyway); the
     * count advances unless every param was skipped (its update, after them) */
    adam_t = t;
    t1 = add(&A, t, konst(&A, NOVA_DTYPE_F32, 1.0));
    if (!per_param) t1 = add_update(&A, t, t1);
    if (!t1) goto out;
  }
  nv_node *rng[2];
  if (o->bf16_sround && rng_state(&A, rng)) goto out;
  int64_t stream = 0; /* each stochastically rounded param's */
  nv_node *status = NULL, *skipped = per_param ? konst(&A, NOVA_DTYPE_I32, 0) : NULL; /* per param */
  int ntrained = 0;
  bool ndm[NV_MAX_GLOBS] = {0}; /* the --no-decay patterns that matched */
  g->outputs[li].role = NOVA_ROLE_LOSS;
  for (int i = 0; i < nf && !A.failed; i++) {
    nv_node *p = g->nodes[i];
    if (p->op != NV_OP_PARAM || !A.needs[i]) continue;
    A.loc = p->loc;
    if (!A.grad[i]) { /* no differentiable path to the loss (e.g. a mask used through a comparison) */
      nv_note(d, p->loc, "param '%s' does not affect the loss through differentiable ops; it is kept constant", p->name);
      continue;
    }
    nv_node *gr = A.grad[i];
    if (inv) /* unscaled before it is reported and used (one multiply, fused into the update) */
      gr = mul(&A, gr, inv->dtype == gr->dtype ? inv : mk(&A, NV_OP_CAST, 1, &inv, &(nv_node){.to = gr->dtype}));
    if (clip) /* clipped (--clip-grad-norm): fused into the update too */
      gr = mul(&A, gr, cast_to(&A, clip, gr->dtype));
    char name[600];
    snprintf(name, sizeof name, "%s.grad", p->name);
    if (!gr || (o->keep_grads && fe_graph_add_output(g, d, name, gr, p->loc))) goto out;
    if (o->keep_grads) g->outputs[g->noutputs - 1].role = NOVA_ROLE_GRAD;
    nv_node *step_bad = A.bad;
    if (per_param) { /* guarded by the loss's check and this gradient's alone */
      A.loc = p->loc;
      nv_node *term = nonfinite_term(&A, gr, loss->dtype);
      status = add(&A, status ? status : A.l0, term);
      A.bad = u1(&A, NV_OP_ISNAN, add(&A, A.l0, term));
      skipped = add(&A, skipped, mk(&A, NV_OP_CAST, 1, &A.bad, &(nv_node){.to = NOVA_DTYPE_I32}));
      if (A.failed) goto out;
    }
    /* weight decay, unless --no-decay excludes P (by default: rank 0 or 1) */
    bool no_wd = !o->no_decay ? p->rank < 2 : strcmp(o->no_decay, "none") && nv_glob_match(o->no_decay, p->name, ndm);
    int rc_u = update(&A, o, p, gr, lr, t1, o->bf16_sround ? rng : NULL, stream, no_wd ? 0 : o->weight_decay);
    ntrained++;
    A.bad = step_bad;
    if (rc_u) goto out;
    stream += o->bf16_sround && p->dtype == NOVA_DTYPE_BF16;
  }
  if (A.failed || nv_diag_count(d)) goto out;
  A.bad = bad_step; /* the step's status: the finite check's alone */
  if (o->no_decay && strcmp(o->no_decay, "none") && check_globs(d, "--no-decay", o->no_decay, ndm)) goto out;
  if (per_param && adam_t) { /* adam.step, unless the loss or every param's gradient was not finite */
    A.loc = nowhere;
    A.bad = b2(&A, NV_OP_OR, A.bad, b2(&A, NV_OP_EQUAL, skipped, konst(&A, NOVA_DTYPE_I32, (double)ntrained)));
    if (!A.bad || !add_update(&A, adam_t, t1)) goto out;
  }
  if (per_param) { /* the step's flag over every gradient; how many params were skipped */
    A.loc = loss->loc;
    A.bad = u1(&A, NV_OP_ISNAN, status ? status : A.l0);
    if (!A.bad || fe_graph_add_output(g, d, "nonfinite.skipped", skipped, loss->loc)) goto out;
    g->outputs[g->noutputs - 1].role = NOVA_ROLE_STATUS;
  }
  if (fe_graph_add_output(g, d, "nonfinite", A.bad, loss->loc)) goto out; /* the flag, last */
  g->outputs[g->noutputs - 1].role = NOVA_ROLE_STATUS;
  g->update_from = per_param && after_backward < g->nnodes ? g->nodes[after_backward] : NULL;
  g->train = true;
  g->nforward = nf;
  rc = 0;
out:
  free(A.grad);
  free(A.needs);
  return rc;
}
