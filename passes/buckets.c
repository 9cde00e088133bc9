/* buckets.c: the masks that make one build serve every size of its bucket
 * (buckets.h says what they do and why). */
#include "buckets.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"

const char *bk_size_name(char *buf, size_t n, const char *dim) {
  snprintf(buf, n, "%s.size", dim);
  return buf;
}

void bk_info_free(bk_info *info) {
  free(info->axes);
  free(info->bad);
  memset(info, 0, sizeof *info);
}

/* Element FLAT of a tensor of SHAPE (rank R) as an offset in a tensor of
 * BIG's shape, same rank (every extent at least SHAPE's). */
static int64_t offset_in(int64_t flat, int r, const int64_t *shape, const int64_t *big) {
  int64_t off = 0, stride = 1;
  for (int k = r - 1; k >= 0; k--) {
    int64_t i = shape[k] ? flat % shape[k] : 0;
    flat = shape[k] ? flat / shape[k] : 0;
    off += i * stride;
    stride *= big[k];
  }
  return off;
}

/* Whether constant A (the smaller build's) is the leading block of B, or
 * both the same recipe. */
static bool same_prefix(const nv_node *a, const nv_node *b) {
  if (a->init.kind != b->init.kind) return false;
  switch (a->init.kind) {
  case NV_INIT_ZEROS: case NV_INIT_ONES: return true;
  case NV_INIT_CONST: case NV_INIT_CAUSAL: return a->init.a == b->init.a || (isnan(a->init.a) && isnan(b->init.a));
  case NV_INIT_DATA: {
    if (!a->init.data || !b->init.data) return false;
    size_t es = fe_dtype_size(a->dtype);
    int64_t n = fe_numel(a);
    for (int64_t i = 0; i < n; i++)
      if (memcmp((const char *)a->init.data + i * (int64_t)es,
                 (const char *)b->init.data + offset_in(i, a->rank, a->shape, b->shape) * (int64_t)es, es))
        return false;
    return true;
  }
  default: return false; /* random values */
  }
}

int bk_analyze(nv_diag *d, const char *dim, const nv_graph *g1, int64_t s1, const nv_graph *g2, int64_t s2,
               bk_info *out) {
  memset(out, 0, sizeof *out);
  out->dim = dim;
  if (s1 > s2) {
    const nv_graph *t = g1;
    g1 = g2, g2 = t;
    int64_t u = s1;
    s1 = s2, s2 = u;
  }
  if (g1->nnodes != g2->nnodes || g1->noutputs != g2->noutputs) {
    nv_error_plain(d, "--dim=%s with several sizes: the model builds into %d ops at %s=%lld and %d at %s=%lld; one "
                      "step for several sizes needs the same ops at every size (compile one step per size)",
                   dim, g1->nnodes, dim, (long long)s1, g2->nnodes, dim, (long long)s2);
    return -1;
  }
  out->nnodes = g1->nnodes;
  out->axes = nv_xcalloc((size_t)g1->nnodes + 1, sizeof *out->axes);
  out->bad = nv_xcalloc((size_t)g1->nnodes + 1, 1);
  if (!out->axes || !out->bad) {
    bk_info_free(out);
    nv_error_plain(d, "out of memory");
    return -1;
  }
  for (int i = 0; i < g1->nnodes; i++) {
    const nv_node *x = g1->nodes[i], *y = g2->nodes[i];
    bool same = x->op == y->op && x->rank == y->rank && x->dtype == y->dtype && x->nin == y->nin;
    for (int k = 0; same && k < x->nin; k++) same = x->in[k]->id == y->in[k]->id;
    for (int k = 0; same && k < x->rank; k++) {
      int64_t dd = y->shape[k] - x->shape[k];
      if (dd < 0 || dd % (s2 - s1)) {
        char a[64], b[64];
        nv_error(d, x->loc, "--dim=%s with several sizes: %s's extent %lld of %s at %s=%lld, %s at %s=%lld, is not "
                            "a multiple of the size plus a constant",
                 dim, nv_op_name(x->op), (long long)k, fe_shape_str(a, sizeof a, x->rank, x->shape), dim,
                 (long long)s1, fe_shape_str(b, sizeof b, y->rank, y->shape), dim, (long long)s2);
        bk_info_free(out);
        return -1;
      }
      out->axes[i][k].a = dd / (s2 - s1);
      out->axes[i][k].c = x->shape[k] - out->axes[i][k].a * s1;
    }
    if (!same) {
      nv_error(d, x->loc, "--dim=%s with several sizes: the model builds into different ops at %s=%lld and %s=%lld "
                          "(%s here, %s there); compile one step per size",
               dim, dim, (long long)s1, dim, (long long)s2, nv_op_name(x->op), nv_op_name(y->op));
      bk_info_free(out);
      return -1;
    }
    if (x->op == NV_OP_CONSTANT) out->bad[i] = !same_prefix(x, y);
    if (x->op == NV_OP_SLICE && out->axes[x->in[0]->id][x->axis].a && (x->start != y->start || x->step != y->step))
      out->bad[i] = 1;
  }
  return 0;
}

/* ---- masking ----------------------------------------------------------------- */

typedef struct bk {
  nv_graph *g;
  nv_diag *d;
  const bk_info *info;
  nv_node *size;      /* NAME.size */
  nv_loc loc;         /* of the node being masked */
  bool failed;
  int64_t lo;         /* the smallest size a run may have */
} bk;

static const bk_axis *axes_of(const bk *B, const nv_node *x) { return B->info->axes[x->id]; }

static bool any_axis(const bk *B, const nv_node *x) {
  for (int k = 0; k < x->rank; k++)
    if (axes_of(B, x)[k].a) return true;
  return false;
}

static nv_node *mk(bk *B, nv_op op, int nin, nv_node **in, const nv_node *attrs) {
  for (int i = 0; i < nin; i++)
    if (!in[i]) return NULL;
  nv_node *n = fe_graph_add(B->g, B->d, op, nin, in, attrs, B->loc);
  if (!n) B->failed = true;
  return n;
}
static nv_node *op2(bk *B, nv_op op, nv_node *a, nv_node *b) { return mk(B, op, 2, (nv_node *[]){a, b}, NULL); }

static nv_node *konst(bk *B, nova_dtype dt, double v) {
  nv_node *n = fe_graph_leaf(B->g, B->d, NV_OP_CONSTANT, NULL, dt, 0, NULL, B->loc);
  if (n) n->init = (nv_init){.kind = NV_INIT_CONST, .a = v};
  else B->failed = true;
  return n;
}

/* a * size + c, in DT (i64 or a float). */
static nv_node *valid_count(bk *B, bk_axis ax, nova_dtype dt) {
  nv_node *s = B->size;
  if (dt != NOVA_DTYPE_I64) {
    nv_node at = {.to = dt};
    s = mk(B, NV_OP_CAST, 1, &s, &at);
  }
  if (ax.a != 1) s = op2(B, NV_OP_MUL, s, konst(B, dt, (double)ax.a));
  if (ax.c) s = op2(B, NV_OP_ADD, s, konst(B, dt, (double)ax.c));
  return s;
}

/* True where every axis of X in AXES (bits) that depends on the size is
 * below its valid count: a bool of X's rank, extent 1 elsewhere. */
static nv_node *mask_of(bk *B, const nv_node *x, unsigned axes) {
  nv_node *m = NULL;
  const bk_axis *ax = axes_of(B, x);
  for (int k = 0; k < x->rank; k++) {
    if (!(axes & (1u << k)) || !ax[k].a) continue;
    int64_t e = x->shape[k];
    int64_t *v = nv_xcalloc((size_t)e + 1, sizeof *v);
    nv_node *io = v ? fe_graph_leaf(B->g, B->d, NV_OP_CONSTANT, NULL, NOVA_DTYPE_I64, 1, &e, B->loc) : NULL;
    if (!io) {
      free(v);
      B->failed = true;
      return NULL;
    }
    for (int64_t i = 0; i < e; i++) v[i] = i;
    io->init = (nv_init){.kind = NV_INIT_DATA, .data = v};
    int64_t s[NOVA_MAX_RANK];
    for (int j = 0; j < x->rank; j++) s[j] = j == k ? e : 1;
    nv_node *lt = op2(B, NV_OP_LESS, fe_reshape(B->g, B->d, io, x->rank, s, B->loc), valid_count(B, ax[k], NOVA_DTYPE_I64));
    m = m ? op2(B, NV_OP_AND, m, lt) : lt;
  }
  return m;
}

/* X with the padded elements along AXES replaced by FILL. */
static nv_node *masked(bk *B, nv_node *x, unsigned axes, double fill) {
  nv_node *m = mask_of(B, x, axes);
  if (!m) return x;
  return mk(B, NV_OP_WHERE, 3, (nv_node *[]){m, x, konst(B, x->dtype, fill)}, NULL);
}

/* The axes (bits) of X along which it is reduced by node N, that depend
 * on the size. */
static unsigned sized_axes(const bk *B, const nv_node *x, int n, const int64_t *list) {
  unsigned bits = 0;
  for (int i = 0; i < n; i++)
    if (list[i] >= 0 && list[i] < x->rank && axes_of(B, x)[list[i]].a) bits |= 1u << list[i];
  return bits;
}

/* Replaces N's operands with IN[0..nin) and its op with OP (keeping its id,
 * place, dtype, shape and users). */
static void become(bk *B, nv_node *n, nv_op op, int nin, nv_node **in) {
  nv_node **a = nv_xcalloc((size_t)nin, sizeof *a);
  if (!a) {
    B->failed = true;
    return;
  }
  memcpy(a, in, (size_t)nin * sizeof *a);
  free(n->in);
  n->in = a;
  n->nin = nin;
  n->op = op;
}

/* The number of elements REDUCED (bits) of X counts at this run, in DT. */
static nv_node *count_of(bk *B, const nv_node *x, unsigned reduced, nova_dtype dt) {
  double fixed = 1;
  nv_node *n = NULL;
  for (int k = 0; k < x->rank; k++) {
    if (!(reduced & (1u << k))) continue;
    if (!axes_of(B, x)[k].a) {
      fixed *= (double)x->shape[k];
      continue;
    }
    nv_node *v = valid_count(B, axes_of(B, x)[k], dt);
    n = n ? op2(B, NV_OP_MUL, n, v) : v;
  }
  return fixed != 1 ? op2(B, NV_OP_MUL, n, konst(B, dt, fixed)) : n;
}

static int refuse(bk *B, const nv_node *n, const char *why) {
  nv_error(B->d, n->loc, "--dim=%s with several sizes: %s %s; one step cannot serve several sizes here (compile "
                         "one step per size)",
           B->info->dim, nv_op_name(n->op), why);
  B->failed = true;
  return -1;
}

/* A cross-entropy over labels whose rows depend on the size: the mean of
 * the real rows' losses, -log_softmax(logits)[label]. */
static void mask_cross_entropy(bk *B, nv_node *n) {
  nv_node *lg = n->in[0], *lab = n->in[1];
  int r = lg->rank;
  nv_node at = {.axis = r - 1};
  nv_node *lp = mk(B, NV_OP_LOG_SOFTMAX, 1, &lg, &at);
  int64_t s[NOVA_MAX_RANK];
  memcpy(s, lab->shape, sizeof s);
  s[r - 1] = 1;
  nv_node *picked = mk(B, NV_OP_GATHER_ELEMENTS, 2, (nv_node *[]){lp, fe_reshape(B->g, B->d, lab, r, s, B->loc)}, &at);
  nv_node *row = mk(B, NV_OP_NEG, 1, (nv_node *[]){fe_reshape(B->g, B->d, picked, lab->rank, lab->shape, B->loc)}, NULL);
  unsigned all = (1u << lab->rank) - 1; /* the row losses have the labels' axes: the mask reads the labels' */
  nv_node *mm = row ? mask_of(B, lab, all) : NULL;
  nv_node *m = mm ? mk(B, NV_OP_WHERE, 3, (nv_node *[]){mm, row, konst(B, row->dtype, 0)}, NULL) : row;
  nv_node *sum = m ? fe_reduce(B->g, B->d, NV_OP_REDUCE_SUM, m, 0, NULL, false, B->loc) : NULL;
  nv_node *cnt = count_of(B, lab, all, n->dtype);
  if (!sum || !cnt) {
    B->failed = true;
    return;
  }
  become(B, n, NV_OP_DIV, 2, (nv_node *[]){sum, cnt});
}

static bool elementwise(nv_op op) {
  switch (op) {
  case NV_OP_ADD: case NV_OP_SUB: case NV_OP_MUL: case NV_OP_DIV: case NV_OP_NEG: case NV_OP_EXP: case NV_OP_LOG:
  case NV_OP_SQRT: case NV_OP_TANH: case NV_OP_SIGMOID: case NV_OP_RELU: case NV_OP_GELU: case NV_OP_POW:
  case NV_OP_ABS: case NV_OP_ERF: case NV_OP_MINIMUM: case NV_OP_MAXIMUM: case NV_OP_WHERE: case NV_OP_EQUAL:
  case NV_OP_LESS: case NV_OP_GREATER: case NV_OP_CAST: case NV_OP_SIN: case NV_OP_COS: case NV_OP_TAN:
  case NV_OP_ASIN: case NV_OP_ACOS: case NV_OP_ATAN: case NV_OP_SINH: case NV_OP_COSH: case NV_OP_ASINH:
  case NV_OP_ACOSH: case NV_OP_ATANH: case NV_OP_FLOOR: case NV_OP_CEIL: case NV_OP_ROUND: case NV_OP_SIGN:
  case NV_OP_ISNAN: case NV_OP_ISINF: case NV_OP_NOT: case NV_OP_AND: case NV_OP_OR: case NV_OP_XOR:
  case NV_OP_LESS_EQUAL: case NV_OP_GREATER_EQUAL: case NV_OP_MOD: case NV_OP_FMOD: case NV_OP_DROPOUT:
  case NV_OP_STOCHASTIC_ROUND: case NV_OP_SHL: case NV_OP_SHR: case NV_OP_TRANSPOSE: case NV_OP_BROADCAST:
    return true;
  default: return false;
  }
}

/* Whether a reshape of X into N keeps the real elements of every axis a
 * prefix: each axis of N that depends on the size starts at the same
 * element count as one of X (every axis before both fixed), and is that
 * axis merged with fixed inner axes, or a part of it split off with fixed
 * inner axes. */
static bool reshape_keeps_prefix(const bk *B, const nv_node *x, const nv_node *n) {
  const bk_axis *ax = axes_of(B, x), *an = axes_of(B, n);
  int kx = 0, kn = 0;
  for (int j = 0; j < n->rank; j++) kn += an[j].a != 0;
  for (int k = 0; k < x->rank; k++) kx += ax[k].a != 0;
  if (kx != kn) return false;
  for (int j = 0; j < n->rank; j++) {
    if (!an[j].a) continue;
    int64_t outer_n = 1;
    for (int i = 0; i < j; i++) outer_n *= n->shape[i];
    int64_t outer_x = 1;
    int k = 0;
    while (k < x->rank && outer_x < outer_n) outer_x *= x->shape[k++];
    while (k < x->rank && x->shape[k] == 1 && !ax[k].a) k++;
    if (outer_x != outer_n || k == x->rank || !ax[k].a) return false;
    for (int i = 0; i < j; i++)
      if (an[i].a) return false;
    if (n->shape[j] >= x->shape[k]) { /* merged with inner axes: fixed ones */
      int64_t p = x->shape[k];
      for (int i = k + 1; i < x->rank && p < n->shape[j]; i++) {
        if (ax[i].a) return false;
        p *= x->shape[i];
      }
      if (p != n->shape[j]) return false;
    } else { /* split: the rest of the axis goes to fixed inner axes of N */
      int64_t p = n->shape[j];
      for (int i = j + 1; i < n->rank && p < x->shape[k]; i++) {
        if (an[i].a) return false;
        p *= n->shape[i];
      }
      if (p != x->shape[k]) return false;
    }
  }
  return true;
}

/* Checks or masks node N. */
static void mask_node(bk *B, nv_node *n) {
  B->loc = n->loc;
  bool sized_in = false;
  for (int k = 0; k < n->nin; k++) sized_in |= any_axis(B, n->in[k]);
  if (B->info->bad[n->id]) {
    refuse(B, n, n->op == NV_OP_SLICE ? "slices an axis of the dimension from a place that moves with its size"
                                       : "is a constant whose values change with the size");
    return;
  }
  if (n->op == NV_OP_PARAM && any_axis(B, n)) {
    refuse(B, n, "has an axis of the dimension (parameters must not)");
    return;
  }
  if (!sized_in || elementwise(n->op)) return;
  nv_node *x = n->in[0];
  const bk_axis *ax = axes_of(B, x);
  unsigned red;
  switch (n->op) {
  case NV_OP_REDUCE_SUM: case NV_OP_REDUCE_MEAN: case NV_OP_REDUCE_MAX: case NV_OP_REDUCE_MIN:
  case NV_OP_REDUCE_PROD: {
    red = sized_axes(B, x, n->nlist, n->list);
    if (!red) return;
    if (n->op == NV_OP_REDUCE_MEAN) {
      nv_node at = *n;
      nv_node *s = mk(B, NV_OP_REDUCE_SUM, 1, (nv_node *[]){masked(B, x, red, 0)}, &at);
      unsigned all = 0;
      for (int i = 0; i < n->nlist; i++) all |= 1u << n->list[i];
      nv_node *c = count_of(B, x, all, n->dtype);
      if (s && c) become(B, n, NV_OP_DIV, 2, (nv_node *[]){s, c});
      return;
    }
    bool fl = fe_dtype_is_float(x->dtype);
    double fill = n->op == NV_OP_REDUCE_SUM ? 0 : n->op == NV_OP_REDUCE_PROD ? 1
                : n->op == NV_OP_REDUCE_MAX ? (fl ? -INFINITY : x->dtype == NOVA_DTYPE_I32 ? -2147483648.0 : -9.2233720368547758e18)
                : (fl ? INFINITY : x->dtype == NOVA_DTYPE_I32 ? 2147483647.0 : 9.2233720368547748e18);
    if (!fl && !fe_dtype_is_index(x->dtype) && n->op != NV_OP_REDUCE_SUM && n->op != NV_OP_REDUCE_PROD) {
      refuse(B, n, "reduces a small integer type along an axis of the dimension");
      return;
    }
    n->in[0] = masked(B, x, red, fill);
    return;
  }
  case NV_OP_SOFTMAX:
    if (ax[n->axis].a) n->in[0] = masked(B, x, 1u << n->axis, -INFINITY);
    return;
  case NV_OP_LOG_SOFTMAX:
    if (ax[n->axis].a) refuse(B, n, "normalizes along an axis of the dimension");
    return;
  case NV_OP_LAYER_NORM: case NV_OP_RMS_NORM:
    if (ax[x->rank - 1].a) refuse(B, n, "normalizes along an axis of the dimension");
    return;
  case NV_OP_MATMUL:
    if (ax[x->rank - 1].a) n->in[0] = masked(B, x, 1u << (x->rank - 1), 0);
    return;
  case NV_OP_CROSS_ENTROPY:
    if (ax[x->rank - 1].a) refuse(B, n, "has its classes along an axis of the dimension");
    else mask_cross_entropy(B, n);
    return;
  case NV_OP_RESHAPE:
    if (!reshape_keeps_prefix(B, x, n)) refuse(B, n, "mixes an axis of the dimension with other axes");
    return;
  case NV_OP_SLICE: {
    bk_axis in = ax[n->axis], out = axes_of(B, n)[n->axis];
    if (!in.a) return;
    if (n->step != 1) refuse(B, n, "takes every k-th element along an axis of the dimension");
    /* a slice of fixed length must lie within the real rows of the smallest size */
    else if (!out.a && n->end > in.a * B->lo + in.c)
      refuse(B, n, "cuts a fixed length from an axis of the dimension that can be shorter");
    return;
  }
  case NV_OP_CONCAT:
    if (ax[n->axis].a || axes_of(B, n->in[1])[n->axis].a) refuse(B, n, "joins along an axis of the dimension");
    return;
  case NV_OP_GATHER: case NV_OP_GATHER_ELEMENTS:
    if (ax[n->axis].a) refuse(B, n, "indexes along an axis of the dimension");
    return;
  case NV_OP_GATHER_ND:
    if (any_axis(B, x)) refuse(B, n, "indexes a tensor with an axis of the dimension");
    return;
  case NV_OP_CUMSUM:
    if (ax[n->axis].a && (n->mode & NV_CUMSUM_REVERSE)) refuse(B, n, "runs backwards along an axis of the dimension");
    return;
  case NV_OP_CONV: case NV_OP_MAX_POOL: case NV_OP_AVG_POOL: case NV_OP_MAX_POOL_INDICES:
    for (int k = 1; k < x->rank; k++)
      if (ax[k].a) {
        refuse(B, n, "has a channel or window axis of the dimension (only the batch axis, the first, may be)");
        return;
      }
    if (n->op == NV_OP_CONV && any_axis(B, n->in[1])) refuse(B, n, "has weights with an axis of the dimension");
    return;
  case NV_OP_ATTENTION:
    for (int i = 0; i < 4; i++)
      for (int k = 2; k < n->in[i]->rank; k++)
        if (axes_of(B, n->in[i])[k].a) {
          refuse(B, n, "has its sequence or head axis along the dimension (only batch and heads may be)");
          return;
        }
    return;
  case NV_OP_ROTARY:
    if (ax[x->rank - 1].a) refuse(B, n, "rotates along an axis of the dimension");
    return;
  default:
    refuse(B, n, "reads an operand with an axis of the dimension in a way buckets do not handle");
    return;
  }
}

/* Puts G's nodes in an order where each follows its operands, the old
 * order kept where it can be (the masks go just before their users). */
static int reorder(nv_graph *g) {
  int n = g->nnodes;
  nv_node **order = nv_xcalloc((size_t)n + 1, sizeof *order);
  unsigned char *state = nv_xcalloc((size_t)n + 1, 1);
  nv_node **stack = nv_xcalloc((size_t)n + 1, sizeof *stack);
  int *next = nv_xcalloc((size_t)n + 1, sizeof *next);
  int k = 0, rc = order && state && stack && next ? 0 : -1;
  for (int i = 0; !rc && i < n; i++) {
    if (state[i]) continue;
    int sp = 0;
    stack[sp++] = g->nodes[i];
    state[i] = 1;
    next[i] = 0;
    while (sp) {
      nv_node *x = stack[sp - 1];
      if (next[x->id] < x->nin) {
        nv_node *y = x->in[next[x->id]++];
        if (!state[y->id]) {
          state[y->id] = 1;
          next[y->id] = 0;
          stack[sp++] = y;
        }
        continue;
      }
      order[k++] = x;
      sp--;
    }
  }
  if (!rc) fe_graph_set_order(g, order);
  free(order);
  free(state);
  free(stack);
  free(next);
  return rc;
}

int bk_mask(nv_diag *d, nv_graph *g, const bk_info *info, int64_t size, int64_t lo) {
  if (g->nnodes != info->nnodes) {
    nv_error_plain(d, "--dim=%s with several sizes: the model builds into %d ops at %s=%lld, %d at other sizes", info->dim,
                   g->nnodes, info->dim, (long long)size, info->nnodes);
    return -1;
  }
  char name[256];
  bk_size_name(name, sizeof name, info->dim);
  bk B = {g, d, info, NULL, {0}, false, lo};
  int n0 = g->nnodes;
  for (int i = 0; i < n0; i++)
    if (g->nodes[i]->name && !strcmp(g->nodes[i]->name, name)) {
      nv_error(d, g->nodes[i]->loc, "--dim=%s with several sizes: the step's input '%s' is the size of each run; the "
                                    "model has a value of that name",
               info->dim, name);
      return -1;
    }
  nv_loc nowhere = {0};
  B.size = fe_graph_leaf(g, d, NV_OP_INPUT, name, NOVA_DTYPE_I64, 0, NULL, nowhere);
  if (!B.size) return -1;
  B.size->has_default = true;
  B.size->init = (nv_init){.kind = NV_INIT_CONST, .a = (double)size};
  /* (the new nodes have no entries in INFO: only nodes below n0 are looked up) */
  for (int i = 0; i < n0 && !B.failed; i++) mask_node(&B, g->nodes[i]);
  for (int i = 0; i < g->noutputs && !B.failed; i++) {
    const nv_output *o = &g->outputs[i];
    if (o->role == NOVA_ROLE_LOSS && o->node->id < n0 && any_axis(&B, o->node)) {
      nv_error(d, o->loc, "--dim=%s with several sizes: the loss '%s' has an axis of the dimension; a loss is a "
                          "scalar", info->dim, o->name);
      B.failed = true;
    }
  }
  if (B.failed) return -1;
  if (reorder(g)) {
    nv_error_plain(d, "out of memory");
    return -1;
  }
  return 0;
}
