/* onnx_ops.c: ONNX operators -> nova graph nodes, one converter per op.
 *
 * Each converter follows the operator's definition for opsets 7 to 28
 * (attributes and their defaults as the spec gives them), checks what the
 * spec requires of its inputs, and says what is not supported instead of
 * approximating it.  Values known at compile time are folded first
 * (onnx_fold.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.h"


/* ---- small helpers -------------------------------------------------- */

int ox_need(ox_ctx *x, ox_val *in, int nin, int min, int max) {
  if (nin < min || (max >= 0 && nin > max))
    return max >= 0 ? ox_err(x, "takes %d to %d inputs, got %d", min, max, nin)
                    : ox_err(x, "takes at least %d inputs, got %d", min, nin);
  for (int i = 0; i < (max < 0 ? nin : min); i++) /* variadic inputs are all required */
    if (!in[i].present) return ox_err(x, "input %d is required", i);
  return 0;
}

int ox_set_out(ox_val *out, nv_node *n) {
  if (!n) return -1;
  out[0] = (ox_val){.node = n, .present = true};
  return 0;
}

nv_node *ox_N(ox_ctx *x, ox_val v) { return ox_node(x, v); }

nv_node *ox_op1(ox_ctx *x, nv_op op, nv_node *a) { return a ? ox_add(x, op, 1, &a, NULL) : NULL; }
nv_node *ox_op2(ox_ctx *x, nv_op op, nv_node *a, nv_node *b) {
  nv_node *in[2] = {a, b};
  return ox_add(x, op, 2, in, NULL);
}
nv_node *ox_op3(ox_ctx *x, nv_op op, nv_node *a, nv_node *b, nv_node *c) {
  nv_node *in[3] = {a, b, c};
  return ox_add(x, op, 3, in, NULL);
}

/* A scalar constant of dtype dt. */
nv_node *ox_scalar(ox_ctx *x, nova_dtype dt, double v) {
  nv_node *n = fe_graph_leaf(x->g, x->d, NV_OP_CONSTANT, NULL, dt, 0, NULL, x->loc);
  if (n) n->init = (nv_init){.kind = NV_INIT_CONST, .a = v};
  return n;
}

nv_node *ox_reshape(ox_ctx *x, nv_node *a, int rank, const int64_t *shape) {
  return fe_reshape(x->g, x->d, a, rank, shape, x->loc);
}
nv_node *ox_transpose(ox_ctx *x, nv_node *a, const int64_t *perm) { return fe_transpose(x->g, x->d, a, perm, x->loc); }
nv_node *ox_broadcast_to(ox_ctx *x, nv_node *a, int rank, const int64_t *shape) {
  return fe_broadcast(x->g, x->d, a, rank, shape, x->loc);
}
nv_node *ox_reduce(ox_ctx *x, nv_op op, nv_node *a, int naxes, const int64_t *axes, bool keep) {
  return fe_reduce(x->g, x->d, op, a, naxes, axes, keep, x->loc);
}

nv_node *ox_slice1(ox_ctx *x, nv_node *a, int64_t axis, int64_t start, int64_t end, int64_t step) {
  nv_node at = {.axis = axis, .start = start, .end = end, .step = step};
  return a ? ox_add(x, NV_OP_SLICE, 1, &a, &at) : NULL;
}

int ox_norm_axis(ox_ctx *x, int64_t *axis, int rank) {
  if (*axis < -rank || *axis >= (rank ? rank : 1)) return ox_err(x, "axis %lld is out of range for rank %d", (long long)*axis, rank);
  if (*axis < 0) *axis += rank;
  return 0;
}

/* A float initializer is a parameter, but where an operand must be known
 * when compiling (Range bounds, Dropout's ratio) its initial value serves:
 * returns a known copy (owned) or NULL. */
ox_tensor *ox_initial_value(ox_val v) {
  if (v.k) return NULL;
  nv_node *n = v.node;
  if (!n || n->op != NV_OP_PARAM || n->init.kind != NV_INIT_DATA || !n->init.data) return NULL;
  ox_tensor *t = ox_tensor_new(n->dtype, n->rank, n->shape);
  if (t) memcpy(t->data, n->init.data, (size_t)fe_numel(n) * fe_dtype_size(n->dtype));
  return t;
}

/* ---- elementwise ------------------------------------------------------ */

static int cv_binary(ox_ctx *x, nv_op op, ox_val *in, int nin, ox_val *out) {
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *a = ox_N(x, in[0]), *b = ox_N(x, in[1]);
  if (a && b && op == NV_OP_POW && !fe_dtype_is_float(a->dtype)) {
    /* integer base: computed in float64, truncated back to the base's type */
    nv_node f64 = {.to = NOVA_DTYPE_F64}, back = {.to = a->dtype};
    nv_node *af = ox_add(x, NV_OP_CAST, 1, &a, &f64), *bf = b->dtype == NOVA_DTYPE_F64 ? b : ox_add(x, NV_OP_CAST, 1, &b, &f64);
    nv_node *p = af && bf ? ox_op2(x, NV_OP_POW, af, bf) : NULL;
    return ox_set_out(out, p ? ox_add(x, NV_OP_CAST, 1, &p, &back) : NULL);
  }
  if (a && b && op == NV_OP_POW && b->dtype != a->dtype) { /* Pow(T, T1): the exponent may be another type */
    nv_node at = {.to = a->dtype};
    b = ox_add(x, NV_OP_CAST, 1, &b, &at);
  }
  return ox_set_out(out, a && b ? ox_op2(x, op, a, b) : NULL);
}
#define BIN(name, op) \
  static int cv_##name(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { (void)nout; return cv_binary(x, op, in, nin, out); }
BIN(add, NV_OP_ADD)
BIN(sub, NV_OP_SUB)
BIN(mul, NV_OP_MUL)
BIN(div, NV_OP_DIV)
BIN(pow, NV_OP_POW)
BIN(equal, NV_OP_EQUAL)
BIN(less, NV_OP_LESS)
BIN(greater, NV_OP_GREATER)

static int cv_unary(ox_ctx *x, nv_op op, ox_val *in, int nin, ox_val *out) {
  if (ox_need(x, in, nin, 1, 1)) return -1;
  return ox_set_out(out, ox_op1(x, op, ox_N(x, in[0])));
}
#define UN(name, op) \
  static int cv_##name(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { (void)nout; return cv_unary(x, op, in, nin, out); }
UN(neg, NV_OP_NEG)
UN(abs, NV_OP_ABS)
UN(exp, NV_OP_EXP)
UN(log, NV_OP_LOG)
UN(sqrt, NV_OP_SQRT)
UN(tanh, NV_OP_TANH)
UN(sigmoid, NV_OP_SIGMOID)
UN(relu, NV_OP_RELU)
UN(erf, NV_OP_ERF)

static int cv_reciprocal(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  return ox_set_out(out, a ? ox_op2(x, NV_OP_DIV, ox_scalar(x, a->dtype, 1.0), a) : NULL);
}

static int cv_leaky_relu(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  double alpha = ox_attr_f(x, "alpha", 0.01);
  nv_node *neg = ox_op2(x, NV_OP_LESS, a, ox_scalar(x, a->dtype, 0.0));
  return ox_set_out(out, ox_op3(x, NV_OP_WHERE, neg, ox_op2(x, NV_OP_MUL, a, ox_scalar(x, a->dtype, alpha)), a));
}

static int cv_gelu(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  char buf[32];
  const char *approx = ox_attr_s(x, "approximate", "none", buf, sizeof buf);
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  if (!strcmp(approx, "none")) return ox_set_out(out, ox_op1(x, NV_OP_GELU, a));
  if (strcmp(approx, "tanh")) return ox_err(x, "approximate='%s'; expected 'none' or 'tanh'", approx);
  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  nova_dtype dt = a->dtype;
  nv_node *x3 = ox_op2(x, NV_OP_MUL, ox_op2(x, NV_OP_MUL, a, a), a);
  nv_node *inner = ox_op2(x, NV_OP_MUL, ox_scalar(x, dt, sqrt(2.0 / M_PI)),
                       ox_op2(x, NV_OP_ADD, a, ox_op2(x, NV_OP_MUL, ox_scalar(x, dt, 0.044715), x3)));
  nv_node *t = ox_op2(x, NV_OP_ADD, ox_scalar(x, dt, 1.0), ox_op1(x, NV_OP_TANH, inner));
  return ox_set_out(out, ox_op2(x, NV_OP_MUL, ox_op2(x, NV_OP_MUL, ox_scalar(x, dt, 0.5), a), t));
}

static int cv_minmax(ox_ctx *x, nv_op op, ox_val *in, int nin, ox_val *out) {
  if (ox_need(x, in, nin, 1, -1)) return -1;
  nv_node *acc = ox_N(x, in[0]);
  for (int i = 1; i < nin && acc; i++) acc = ox_op2(x, op, acc, ox_N(x, in[i]));
  return ox_set_out(out, acc);
}
static int cv_min(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { (void)nout; return cv_minmax(x, NV_OP_MINIMUM, in, nin, out); }
static int cv_max(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { (void)nout; return cv_minmax(x, NV_OP_MAXIMUM, in, nin, out); }

static int cv_clip(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, x->opset < 11 ? 1 : 3)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (a && x->opset < 11) { /* min and max attributes (default: the float range) */
    a = ox_op2(x, NV_OP_MAXIMUM, a, ox_scalar(x, a->dtype, ox_attr_f(x, "min", -HUGE_VAL)));
    return ox_set_out(out, a ? ox_op2(x, NV_OP_MINIMUM, a, ox_scalar(x, a->dtype, ox_attr_f(x, "max", HUGE_VAL))) : NULL);
  }
  if (a && nin > 1 && in[1].present) a = ox_op2(x, NV_OP_MAXIMUM, a, ox_N(x, in[1]));
  if (a && nin > 2 && in[2].present) a = ox_op2(x, NV_OP_MINIMUM, a, ox_N(x, in[2]));
  return ox_set_out(out, a);
}

static int cv_where(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 3, 3)) return -1;
  return ox_set_out(out, ox_op3(x, NV_OP_WHERE, ox_N(x, in[0]), ox_N(x, in[1]), ox_N(x, in[2])));
}

static int cv_cast(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  int64_t to = ox_attr_i(x, "to", 0);
  nv_node at = {.to = ox_dtype_of_onnx((int32_t)to)};
  if (!at.to) return ox_err(x, "cast to %s is not supported (float, double, float16, bfloat16, int8 to int64, uint8 to uint64, bool)",
                          ox_onnx_type_name((int32_t)to));
  nv_node *a = ox_N(x, in[0]);
  if (a && a->dtype == at.to) return ox_set_out(out, a);
  return ox_set_out(out, a ? ox_add(x, NV_OP_CAST, 1, &a, &at) : NULL);
}

static int cv_identity(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  if (in[0].seq) return ox_val_copy(in[0], out); /* a sequence passes as it is */
  return ox_set_out(out, ox_N(x, in[0]));
}

/* Training mode under --train: a Philox mask (ox_dropout); the mask output
 * is the same mask, drawn again over ones. */
static int cv_dropout_train(ox_ctx *x, ox_val *in, double ratio, ox_val *out, int nout) {
  if (!(ratio > 0 && ratio < 1)) return ox_err(x, "Dropout ratio %g outside [0, 1)", ratio);
  nv_node *a = ox_N(x, in[0]);
  if (ox_set_out(out, ox_dropout(x, a, ratio))) return -1;
  if (nout > 1 && a) {
    nv_node *ones = ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_MUL, a, ox_scalar(x, a->dtype, 0)), ox_scalar(x, a->dtype, 1));
    nv_node *kept = ox_dropout(x, ones, ratio);
    if (!kept) return -1;
    kept->axis = out[0].node->axis; /* the output's stream: the same mask */
    nv_node *m = ox_op2(x, NV_OP_GREATER, kept, ox_scalar(x, a->dtype, 0));
    out[1] = (ox_val){.node = m, .present = m != NULL};
  }
  return 0;
}

static int cv_dropout(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  if (ox_need(x, in, nin, 1, 3)) return -1;
  if (nin > 2 && in[2].present && !x->g->eval) { /* the evaluation entry: dropout off */
    if (!in[2].k) return ox_err(x, "training_mode must be known when compiling");
    ox_tensor *iv = nin > 1 && in[1].present ? ox_initial_value(in[1]) : NULL;
    const ox_tensor *rk = nin > 1 && in[1].present ? (in[1].k ? in[1].k : iv) : NULL;
    double ratio = rk ? ox_getf(rk, 0) : nin > 1 && in[1].present ? -1 : 0.5;
    ox_tensor_free(iv);
    if (ox_geti(in[2].k, 0) && ratio != 0 && !x->g->inits)
      return ox_err(x, "Dropout in training mode needs --train (its random mask is drawn by a training step)");
    if (ox_geti(in[2].k, 0) && ratio != 0) return cv_dropout_train(x, in, ratio, out, nout);
  }
  nv_node *a = ox_N(x, in[0]);
  if (ox_set_out(out, a)) return -1;
  if (nout > 1) { /* mask: all true in inference */
    ox_tensor *m = ox_tensor_new(NOVA_DTYPE_BOOL, a->rank, a->shape);
    if (!m) return -1;
    memset(m->data, 1, (size_t)fe_numel(a));
    out[1] = (ox_val){.k = m, .present = true};
  }
  return 0;
}

/* ---- matrix products ---------------------------------------------------- */

/* ONNX MatMul: numpy semantics (1-D operands promoted, batch dims broadcast). */
nv_node *ox_matmul(ox_ctx *x, nv_node *a, nv_node *b) {
  if (!a || !b) return NULL;
  int ra = a->rank, rb = b->rank;
  if (ra == 0 || rb == 0) {
    ox_err(x, "MatMul operands must have rank >= 1");
    return NULL;
  }
  if (ra == 1) a = ox_reshape(x, a, 2, (int64_t[]){1, a->shape[0]});
  if (rb == 1) b = ox_reshape(x, b, 2, (int64_t[]){b->shape[0], 1});
  if (!a || !b) return NULL;
  if (a->rank > 2 || b->rank > 2) { /* broadcast batch dims */
    int r = a->rank > b->rank ? a->rank : b->rank;
    int64_t batch[NOVA_MAX_RANK];
    for (int i = 0; i < r - 2; i++) {
      int ia = i - (r - a->rank), ib = i - (r - b->rank);
      int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
      if (da != db && da != 1 && db != 1) {
        ox_err(x, "MatMul batch dimensions %lld and %lld cannot be broadcast", (long long)da, (long long)db);
        return NULL;
      }
      batch[i] = da == 1 ? db : da;
    }
    int64_t sa[NOVA_MAX_RANK], sb[NOVA_MAX_RANK];
    memcpy(sa, batch, sizeof batch);
    memcpy(sb, batch, sizeof batch);
    sa[r - 2] = a->shape[a->rank - 2], sa[r - 1] = a->shape[a->rank - 1];
    sb[r - 2] = b->shape[b->rank - 2], sb[r - 1] = b->shape[b->rank - 1];
    a = ox_broadcast_to(x, a, r, sa);
    if (b->rank != 2 || a->rank != r) b = ox_broadcast_to(x, b, r, sb);
  }
  nv_node *y = ox_op2(x, NV_OP_MATMUL, a, b);
  if (!y) return NULL;
  if (ra == 1 || rb == 1) { /* drop the promoted dims */
    int64_t s[NOVA_MAX_RANK];
    int k = 0;
    for (int i = 0; i < y->rank; i++)
      if (!((ra == 1 && i == y->rank - 2) || (rb == 1 && i == y->rank - 1))) s[k++] = y->shape[i];
    y = ox_reshape(x, y, k, s);
  }
  return y;
}

static int cv_matmul(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  return ox_set_out(out, ox_matmul(x, ox_N(x, in[0]), ox_N(x, in[1])));
}

static int cv_gemm(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 3)) return -1;
  nv_node *a = ox_N(x, in[0]), *b = ox_N(x, in[1]);
  if (!a || !b) return -1;
  if (a->rank != 2 || b->rank != 2) return ox_err(x, "Gemm needs 2-D A and B");
  double alpha = ox_attr_f(x, "alpha", 1.0), beta = ox_attr_f(x, "beta", 1.0);
  if (ox_attr_i(x, "transA", 0)) a = ox_transpose(x, a, (int64_t[]){1, 0});
  if (ox_attr_i(x, "transB", 0)) b = ox_transpose(x, b, (int64_t[]){1, 0});
  nv_node *y = ox_op2(x, NV_OP_MATMUL, a, b);
  if (y && alpha != 1.0) y = ox_op2(x, NV_OP_MUL, y, ox_scalar(x, y->dtype, alpha));
  if (y && nin > 2 && in[2].present && beta != 0.0) {
    nv_node *c = ox_N(x, in[2]);
    if (c && beta != 1.0) c = ox_op2(x, NV_OP_MUL, c, ox_scalar(x, c->dtype, beta));
    y = c ? ox_op2(x, NV_OP_ADD, y, c) : NULL;
  }
  return ox_set_out(out, y);
}

/* ---- normalisation ------------------------------------------------------ */

nv_node *ox_coerce_2d(ox_ctx *x, nv_node *a, int64_t *axis) {
  if (!a || ox_norm_axis(x, axis, a->rank)) return NULL;
  int64_t s[2] = {1, 1};
  for (int i = 0; i < a->rank; i++) s[i >= *axis] *= a->shape[i];
  *axis = 1;
  return ox_reshape(x, a, 2, s);
}

/* Before opset 13 the input is coerced to 2-D at axis (default 1) and
 * normalised over the whole second dimension. */
static int cv_softmax_like(ox_ctx *x, nv_op op, ox_val *in, int nin, ox_val *out) {
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  nv_node at = {.axis = ox_attr_i(x, "axis", x->opset < 13 ? 1 : -1)};
  if (x->opset >= 13 || a->rank == 0) return ox_set_out(out, ox_add(x, op, 1, &a, &at));
  nv_node *flat = ox_coerce_2d(x, a, &at.axis);
  nv_node *y = flat ? ox_add(x, op, 1, &flat, &at) : NULL;
  return ox_set_out(out, ox_reshape(x, y, a->rank, a->shape));
}
static int cv_softmax(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { (void)nout; return cv_softmax_like(x, NV_OP_SOFTMAX, in, nin, out); }
static int cv_log_softmax(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { (void)nout; return cv_softmax_like(x, NV_OP_LOG_SOFTMAX, in, nin, out); }

static int cv_layer_norm(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  if (ox_need(x, in, nin, 2, 3)) return -1;
  nv_node *a = ox_N(x, in[0]), *sc = ox_N(x, in[1]), *bias = nin > 2 && in[2].present ? ox_N(x, in[2]) : NULL;
  if (!a || !sc) return -1;
  int64_t axis = ox_attr_i(x, "axis", -1);
  if (ox_norm_axis(x, &axis, a->rank)) return -1;
  double eps = ox_attr_f(x, "epsilon", 1e-5);
  int64_t inner = 1, fs[NOVA_MAX_RANK];
  for (int i = (int)axis; i < a->rank; i++) inner *= a->shape[i];
  for (int i = 0; i < axis; i++) fs[i] = a->shape[i];
  fs[axis] = inner;
  /* scale and bias broadcast to the normalised dims, then flattened */
  int tail = a->rank - (int)axis;
  sc = ox_reshape(x, ox_broadcast_to(x, sc, tail, a->shape + axis), 1, &inner);
  bias = bias ? ox_reshape(x, ox_broadcast_to(x, bias, tail, a->shape + axis), 1, &inner) : NULL;
  if (!bias) {
    ox_tensor *z = ox_tensor_new(a->dtype, 1, &inner);
    if (!z) return -1;
    bias = ox_node(x, (ox_val){.k = z, .present = true});
    ox_tensor_free(z);
  }
  nv_node *flat = ox_reshape(x, a, (int)axis + 1, fs);
  nv_node *in3[3] = {flat, sc, bias}, at = {.eps = eps};
  nv_node *y = ox_add(x, NV_OP_LAYER_NORM, 3, in3, &at);
  if (ox_set_out(out, ox_reshape(x, y, a->rank, a->shape))) return -1;
  if (nout > 1) { /* Mean and InvStdDev, shaped like X with 1s from axis on */
    int64_t ax[NOVA_MAX_RANK];
    for (int i = 0; i < tail; i++) ax[i] = axis + i;
    nv_node *mean = ox_reduce(x, NV_OP_REDUCE_MEAN, a, tail, ax, true);
    out[1] = (ox_val){.node = mean, .present = mean != NULL};
    if (nout > 2 && mean) {
      nv_node *dlt = ox_op2(x, NV_OP_SUB, a, mean);
      nv_node *var = ox_reduce(x, NV_OP_REDUCE_MEAN, ox_op2(x, NV_OP_MUL, dlt, dlt), tail, ax, true);
      nv_node *inv = ox_op2(x, NV_OP_DIV, ox_scalar(x, a->dtype, 1.0),
                         ox_op1(x, NV_OP_SQRT, ox_op2(x, NV_OP_ADD, var, ox_scalar(x, a->dtype, eps))));
      out[2] = (ox_val){.node = inv, .present = inv != NULL};
    }
  }
  return 0;
}

/* x shaped [N, C, ...]: a per-channel vector as [C, 1, ...]. */
static nv_node *per_channel(ox_ctx *x, nv_node *v, const nv_node *like) {
  int64_t s[NOVA_MAX_RANK];
  s[0] = like->shape[1];
  for (int i = 2; i < like->rank; i++) s[i - 1] = 1;
  return ox_reshape(x, v, like->rank - 1, s);
}

/* (1 - momentum) n / (n - 1), n the elements per channel (see
 * ox_running_var_scale): a constant, but for a step serving several batch
 * sizes, where n is counted at run time (a sum of ones over the batch
 * statistics' axes, which the buckets' masks count for the run's size). */
static nv_node *running_var_factor(ox_ctx *x, const nv_node *a, double mom) {
  bool ranged = false;
  for (int i = 0; i < x->ndims; i++) ranged |= x->dims[i].ranged;
  if (!ranged || !x->g->inits) return ox_scalar(x, a->dtype, (1 - mom) * ox_running_var_scale(x, a));
  int64_t s[NOVA_MAX_RANK], ax[NOVA_MAX_RANK];
  int k = 0;
  for (int i = 0; i < a->rank; i++) {
    s[i] = i == 1 ? 1 : a->shape[i];
    if (i != 1) ax[k++] = i;
  }
  nv_node *one = ox_scalar(x, a->dtype, 1);
  nv_node *n = ox_reduce(x, NV_OP_REDUCE_SUM, one ? fe_broadcast(x->g, x->d, one, a->rank, s, x->loc) : NULL, k, ax,
                         false);
  nv_node *bessel = ox_op2(x, NV_OP_DIV, n, ox_op2(x, NV_OP_MAXIMUM, ox_op2(x, NV_OP_SUB, n, one), one));
  return ox_op2(x, NV_OP_MUL, bessel, ox_scalar(x, a->dtype, 1 - mom));
}

static int cv_batch_norm(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  if (ox_need(x, in, nin, 5, 5)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  if (a->rank < 2) return ox_err(x, "BatchNormalization needs X of rank >= 2 (N, C, ...)");
  nova_dtype dt = a->dtype;
  double eps = ox_attr_f(x, "epsilon", 1e-5), mom = ox_attr_f(x, "momentum", 0.9);
  nv_node *sc = per_channel(x, ox_N(x, in[1]), a), *b = per_channel(x, ox_N(x, in[2]), a);
  nv_node *mean = ox_N(x, in[3]), *var = ox_N(x, in[4]);
  bool training = ox_attr_i(x, "training_mode", 0) != 0 && !x->g->eval; /* evaluation: running statistics */
  nv_node *m = per_channel(x, mean, a), *v = per_channel(x, var, a);
  nv_node *cur_mean = NULL, *cur_var = NULL;
  if (training) { /* batch statistics over every axis but C */
    int64_t ax[NOVA_MAX_RANK];
    int k = 0;
    for (int i = 0; i < a->rank; i++)
      if (i != 1) ax[k++] = i;
    cur_mean = ox_reduce(x, NV_OP_REDUCE_MEAN, a, k, ax, false);
    nv_node *dl = ox_op2(x, NV_OP_SUB, a, per_channel(x, cur_mean, a));
    cur_var = ox_reduce(x, NV_OP_REDUCE_MEAN, ox_op2(x, NV_OP_MUL, dl, dl), k, ax, false);
    m = per_channel(x, cur_mean, a);
    v = per_channel(x, cur_var, a);
  }
  nv_node *den = ox_op1(x, NV_OP_SQRT, ox_op2(x, NV_OP_ADD, v, ox_scalar(x, dt, eps)));
  nv_node *y = ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_MUL, ox_op2(x, NV_OP_DIV, ox_op2(x, NV_OP_SUB, a, m), den), sc), b);
  if (ox_set_out(out, y)) return -1;
  if (training) { /* running = momentum running + (1 - momentum) batch; var: see ox_running_var_scale */
    nv_node *rm = ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_MUL, mean, ox_scalar(x, dt, mom)),
                         ox_op2(x, NV_OP_MUL, cur_mean, ox_scalar(x, dt, 1 - mom)));
    nv_node *rv = ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_MUL, var, ox_scalar(x, dt, mom)),
                         ox_op2(x, NV_OP_MUL, cur_var, running_var_factor(x, a, mom)));
    if (nout > 1) out[1] = (ox_val){.node = rm, .present = rm != NULL};
    if (nout > 2) out[2] = (ox_val){.node = rv, .present = rv != NULL};
    if (!rm || !rv || ox_state_update(x, in[3], rm) || ox_state_update(x, in[4], rv)) return -1; /* --train: buffers */
  } else if (nout > 1 && x->g->eval) { /* the evaluation entry: the running statistics, unchanged */
    out[1] = (ox_val){.node = mean, .present = mean != NULL};
    if (nout > 2) out[2] = (ox_val){.node = var, .present = var != NULL};
  } else if (nout > 1)
    return ox_err(x, "running mean/var outputs need training_mode=1");
  return 0;
}

/* ---- shape and data movement --------------------------------------------- */

/* Reshape/Flatten/Squeeze/Unsqueeze/Expand result: fold known data, else a node. */
static int reshaped(ox_ctx *x, ox_val *in, int rank, const int64_t *shape, ox_val *out) {
  if (in[0].k) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    if (n != ox_numel(in[0].k)) return ox_err(x, "cannot reshape %lld elements", (long long)ox_numel(in[0].k));
    return ox_fold_reshape(in, rank, shape, out) < 0 ? -1 : 0;
  }
  return ox_set_out(out, ox_reshape(x, in[0].node, rank, shape));
}

static int cv_reshape(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  int64_t s[NOVA_MAX_RANK + 1];
  int n = ox_const_ints(x, in[1], "the target shape", s, NOVA_MAX_RANK);
  if (n < 0) return -1;
  bool allowzero = ox_attr_i(x, "allowzero", 0) != 0;
  int r = ox_val_rank(in[0]);
  const int64_t *src = ox_val_shape(in[0]);
  int64_t total = 1, known = 1;
  int infer = -1;
  for (int i = 0; i < r; i++) total *= src[i];
  for (int i = 0; i < n; i++) {
    if (s[i] == 0 && !allowzero) {
      if (i >= r) return ox_err(x, "shape entry %d is 0 (copy) but the input has rank %d", i, r);
      s[i] = src[i];
    }
    if (s[i] == -1) {
      if (infer >= 0) return ox_err(x, "more than one -1 in the target shape");
      infer = i;
    } else if (s[i] < 0)
      return ox_err(x, "target shape entry %d is %lld", i, (long long)s[i]);
    else if (s[i] && known > NV_MAX_NUMEL / s[i])
      return ox_err(x, "reshape: target shape is too large (more than 2^34 elements)");
    else
      known *= s[i];
  }
  if (infer >= 0) {
    if (known == 0 || total % known) return ox_err(x, "cannot infer -1: %lld elements, %lld known", (long long)total, (long long)known);
    s[infer] = total / known;
  }
  return reshaped(x, in, n, s, out);
}

static int cv_flatten(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  int r = ox_val_rank(in[0]);
  const int64_t *src = ox_val_shape(in[0]);
  int64_t axis = ox_attr_i(x, "axis", 1);
  if (axis < -r || axis > r) return ox_err(x, "axis %lld out of range for rank %d", (long long)axis, r);
  if (axis < 0) axis += r;
  int64_t s[2] = {1, 1};
  for (int i = 0; i < r; i++) s[i >= axis] *= src[i];
  return reshaped(x, in, 2, s, out);
}

static int axes_list(ox_ctx *x, ox_val *in, int nin, int idx, int64_t *axes) {
  if (x->opset >= 13 && nin > idx && in[idx].present) return ox_const_ints(x, in[idx], "axes", axes, NOVA_MAX_RANK);
  return ox_attr_ints(x, "axes", axes, NOVA_MAX_RANK); /* -1: absent */
}

static int cv_unsqueeze(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 2)) return -1;
  int64_t axes[NOVA_MAX_RANK], s[NOVA_MAX_RANK];
  int na = axes_list(x, in, nin, 1, axes);
  if (na <= 0) return na < 0 ? ox_err(x, "Unsqueeze needs axes") : ox_err(x, "Unsqueeze with empty axes");
  int r = ox_val_rank(in[0]), ro = r + na;
  if (ro > NOVA_MAX_RANK) return ox_err(x, "result rank %d exceeds %d", ro, NOVA_MAX_RANK);
  bool ins[NOVA_MAX_RANK] = {0};
  for (int i = 0; i < na; i++) {
    int64_t a = axes[i];
    if (ox_norm_axis(x, &a, ro)) return -1;
    if (ins[a]) return ox_err(x, "axis %lld repeated", (long long)a);
    ins[a] = true;
  }
  const int64_t *src = ox_val_shape(in[0]);
  for (int i = 0, k = 0; i < ro; i++) s[i] = ins[i] ? 1 : src[k++];
  return reshaped(x, in, ro, s, out);
}

static int cv_squeeze(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 2)) return -1;
  int64_t axes[NOVA_MAX_RANK], s[NOVA_MAX_RANK];
  int na = axes_list(x, in, nin, 1, axes), r = ox_val_rank(in[0]), k = 0;
  const int64_t *src = ox_val_shape(in[0]);
  bool drop[NOVA_MAX_RANK] = {0};
  if (na <= 0)
    for (int i = 0; i < r; i++) drop[i] = src[i] == 1;
  for (int i = 0; i < na; i++) {
    int64_t a = axes[i];
    if (ox_norm_axis(x, &a, r)) return -1;
    if (src[a] != 1) return ox_err(x, "cannot squeeze axis %lld of size %lld", (long long)a, (long long)src[a]);
    drop[a] = true;
  }
  for (int i = 0; i < r; i++)
    if (!drop[i]) s[k++] = src[i];
  return reshaped(x, in, k, s, out);
}

static int cv_expand(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  int64_t s[NOVA_MAX_RANK], o[NOVA_MAX_RANK];
  int n = ox_const_ints(x, in[1], "the shape", s, NOVA_MAX_RANK);
  if (n < 0) return -1;
  int r = ox_val_rank(in[0]), ro = r > n ? r : n;
  const int64_t *src = ox_val_shape(in[0]);
  for (int i = 0; i < ro; i++) { /* bidirectional broadcast */
    int ia = i - (ro - r), ib = i - (ro - n);
    int64_t da = ia >= 0 ? src[ia] : 1, db = ib >= 0 ? s[ib] : 1;
    if (da != db && da != 1 && db != 1) return ox_err(x, "cannot expand dimension %lld to %lld", (long long)da, (long long)db);
    o[i] = da == 1 ? db : da;
  }
  if (in[0].k) in[0] = (ox_val){.node = ox_N(x, in[0]), .present = true};
  return ox_set_out(out, ox_broadcast_to(x, in[0].node, ro, o));
}

static int cv_transpose(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  nv_node at = {0};
  at.nlist = ox_attr_ints(x, "perm", at.list, NOVA_MAX_RANK);
  if (at.nlist < 0) at.nlist = 0;
  return ox_set_out(out, ox_add(x, NV_OP_TRANSPOSE, 1, &a, &at));
}

static int cv_concat(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, -1)) return -1;
  nv_node at = {.axis = ox_attr_i(x, "axis", 0)};
  nv_node *acc = ox_N(x, in[0]);
  for (int i = 1; i < nin && acc; i++) {
    nv_node *pair[2] = {acc, ox_N(x, in[i])};
    acc = ox_add(x, NV_OP_CONCAT, 2, pair, &at);
  }
  return ox_set_out(out, acc);
}

static int cv_split(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  if (ox_need(x, in, nin, 1, 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t axis = ox_attr_i(x, "axis", 0), parts[64];
  if (ox_norm_axis(x, &axis, a->rank)) return -1;
  int64_t dim = a->shape[axis];
  int np;
  if (nin > 1 && in[1].present) {
    np = ox_const_ints(x, in[1], "split", parts, 64);
    if (np < 0) return -1;
  } else if ((np = ox_attr_ints(x, "split", parts, 64)) < 0) {
    int64_t k = ox_attr_i(x, "num_outputs", nout);
    if (k <= 0 || k > 64) return ox_err(x, "bad number of outputs %lld", (long long)k);
    np = (int)k;
    int64_t each = (dim + k - 1) / k; /* the last part may be smaller */
    for (int i = 0; i < np; i++) parts[i] = i < np - 1 ? each : dim - each * (np - 1);
  }
  if (np != nout) return ox_err(x, "%d split sizes for %d outputs", np, nout);
  int64_t off = 0;
  for (int i = 0; i < np; i++) {
    if (parts[i] < 0) return ox_err(x, "split part %d has size %lld", i, (long long)parts[i]);
    nv_node *p = ox_slice1(x, a, axis, off, off + parts[i], 1);
    if (!p) return -1;
    out[i] = (ox_val){.node = p, .present = true};
    off += parts[i];
  }
  if (off != dim) return ox_err(x, "split sizes add up to %lld, the axis has %lld", (long long)off, (long long)dim);
  return 0;
}

static int cv_slice(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  bool attrs = x->opset < 10; /* starts, ends and axes as attributes */
  if (ox_need(x, in, nin, attrs ? 1 : 3, attrs ? 1 : 5)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t st[NOVA_MAX_RANK], en[NOVA_MAX_RANK], ax[NOVA_MAX_RANK], sp[NOVA_MAX_RANK];
  int n = attrs ? ox_attr_ints(x, "starts", st, NOVA_MAX_RANK) : ox_const_ints(x, in[1], "starts", st, NOVA_MAX_RANK);
  int ne = attrs ? ox_attr_ints(x, "ends", en, NOVA_MAX_RANK) : ox_const_ints(x, in[2], "ends", en, NOVA_MAX_RANK);
  if (n < 0 || ne != n) return n < 0 && !attrs ? -1 : ox_err(x, "starts and ends must be given with one length");
  for (int i = 0; i < n; i++) ax[i] = i, sp[i] = 1;
  if (attrs && ox_attr(x, "axes") && ox_attr_ints(x, "axes", ax, NOVA_MAX_RANK) != n) return ox_err(x, "axes differs in length");
  if (!attrs && nin > 3 && in[3].present && ox_const_ints(x, in[3], "axes", ax, NOVA_MAX_RANK) != n) return -1;
  if (!attrs && nin > 4 && in[4].present && ox_const_ints(x, in[4], "steps", sp, NOVA_MAX_RANK) != n) return -1;
  for (int i = 0; i < n && a; i++) {
    int64_t axis = ax[i];
    if (ox_norm_axis(x, &axis, a->rank)) return -1;
    int64_t dim = a->shape[axis], s = st[i] < 0 ? st[i] + dim : st[i], e = en[i] < 0 ? en[i] + dim : en[i];
    if (sp[i] == 0) return ox_err(x, "a step of 0");
    if (sp[i] < 0) { /* the same elements ascending, then reversed with a gather */
      int64_t step = -sp[i];
      s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
      e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
      if (s <= e) { /* empty */
        a = ox_slice1(x, a, axis, 0, 0, 1);
        continue;
      }
      int64_t cnt = (s - e - 1) / step + 1, lo = s - (cnt - 1) * step;
      a = ox_slice1(x, a, axis, lo, s + 1, step);
      ox_tensor *rev = ox_tensor_new(NOVA_DTYPE_I64, 1, &cnt);
      if (!rev || !a) return -1;
      for (int64_t j = 0; j < cnt; j++) ox_set(rev, j, 0, cnt - 1 - j);
      nv_node *pair[2] = {a, ox_node(x, (ox_val){.k = rev, .present = true})}, at = {.axis = axis};
      ox_tensor_free(rev);
      a = ox_add(x, NV_OP_GATHER, 2, pair, &at);
      continue;
    }
    s = s < 0 ? 0 : s > dim ? dim : s;
    e = e < 0 ? 0 : e > dim ? dim : e;
    if (e < s) e = s; /* empty */
    if (s == 0 && e == dim && sp[i] == 1) continue;
    a = ox_slice1(x, a, axis, s, e, sp[i]);
  }
  return ox_set_out(out, a);
}

static int cv_gather(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *d = ox_N(x, in[0]);
  if (!d) return -1;
  int64_t axis = ox_attr_i(x, "axis", 0);
  if (ox_norm_axis(x, &axis, d->rank)) return -1;
  ox_val iv = in[1];
  ox_tensor *fixed = NULL;
  if (iv.k) { /* known indices: make negative ones positive (ONNX allows [-n, n)) */
    fixed = ox_tensor_new(iv.k->dt, iv.k->rank, iv.k->shape);
    if (!fixed) return -1;
    for (int64_t i = 0, n = ox_numel(iv.k); i < n; i++) {
      int64_t v = ox_geti(iv.k, i);
      ox_set(fixed, i, 0, v < 0 ? v + d->shape[axis] : v);
    }
    iv = (ox_val){.k = fixed, .present = true};
  }
  nv_node *idx = ox_N(x, iv);
  ox_tensor_free(fixed);
  nv_node *pair[2] = {d, idx}, at = {.axis = axis, .index_negative = true};
  return ox_set_out(out, idx ? ox_add(x, NV_OP_GATHER, 2, pair, &at) : NULL);
}

/* ---- constants and shapes -------------------------------------------------- */

int ox_known(ox_val *out, ox_tensor *t) {
  if (!t) return -1;
  out[0] = (ox_val){.k = t, .present = true};
  return 0;
}

static int cv_constant(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)in, (void)nin, (void)nout;
  const Onnx__AttributeProto *a;
  if ((a = ox_attr(x, "value")) && a->t) {
    return ox_known(out, ox_decode_tensor(x, a->t));
  }
  if ((a = ox_attr(x, "value_float")) && a->has_f) {
    ox_tensor *t = ox_tensor_new(NOVA_DTYPE_F32, 0, NULL);
    if (t) ox_set(t, 0, a->f, 0);
    return ox_known(out, t);
  }
  if ((a = ox_attr(x, "value_int")) && a->has_i) {
    ox_tensor *t = ox_tensor_new(NOVA_DTYPE_I64, 0, NULL);
    if (t) ox_set(t, 0, 0, a->i);
    return ox_known(out, t);
  }
  if ((a = ox_attr(x, "value_floats"))) {
    int64_t n = (int64_t)a->n_floats;
    ox_tensor *t = ox_tensor_new(NOVA_DTYPE_F32, 1, &n);
    for (int64_t i = 0; t && i < n; i++) ox_set(t, i, a->floats[i], 0);
    return ox_known(out, t);
  }
  if ((a = ox_attr(x, "value_ints"))) {
    int64_t n = (int64_t)a->n_ints;
    ox_tensor *t = ox_tensor_new(NOVA_DTYPE_I64, 1, &n);
    for (int64_t i = 0; t && i < n; i++) ox_set(t, i, 0, a->ints[i]);
    return ox_known(out, t);
  }
  return ox_err(x, "Constant without a supported value (value, value_float(s), value_int(s); strings and sparse "
                "tensors are not supported)");
}

static int cv_constant_of_shape(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  int64_t s[NOVA_MAX_RANK];
  int n = ox_const_ints(x, in[0], "the shape", s, NOVA_MAX_RANK);
  if (n < 0) return -1;
  for (int i = 0; i < n; i++)
    if (s[i] < 0) return ox_err(x, "shape entry %d is %lld", i, (long long)s[i]);
  nova_dtype dt = NOVA_DTYPE_F32;
  double fv = 0;
  int64_t iv = 0;
  const Onnx__AttributeProto *a = ox_attr(x, "value");
  if (a && a->t) {
    ox_tensor *v = ox_decode_tensor(x, a->t);
    if (!v) return -1;
    dt = v->dt;
    fv = ox_getf(v, 0);
    iv = ox_geti(v, 0);
    ox_tensor_free(v);
  }
  /* checked before anything is allocated or filled: a few bytes of shape
   * must not cost seconds and gigabytes before the embedding limit
   * (to_nova.c, 256 MiB) rejects the result */
  int64_t bytes = (int64_t)fe_dtype_size(dt);
  for (int i = 0; i < n; i++) bytes = !s[i] || !bytes ? 0 : bytes > OX_MAX_FILL_BYTES / s[i] ? OX_MAX_FILL_BYTES + 1 : bytes * s[i];
  if (bytes > OX_MAX_FILL_BYTES)
    return ox_err(x, "the constant of shape %s is too large: more than %d MiB, the most a compile-time constant holds",
                  fe_shape_str((char[160]){0}, 160, n, s), (int)(OX_MAX_FILL_BYTES >> 20));
  ox_tensor *t = ox_tensor_new(dt, n, s);
  if (!t) return ox_err(x, "the constant is too large (more than 2^28 elements)");
  for (int64_t i = 0, e = ox_numel(t); i < e; i++) ox_set(t, i, fv, iv);
  return ox_known(out, t);
}

static int cv_shape(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  int r = ox_val_rank(in[0]);
  int64_t s = ox_attr_i(x, "start", 0), e = ox_attr_i(x, "end", r);
  s = s < 0 ? s + r : s;
  e = e < 0 ? e + r : e;
  s = s < 0 ? 0 : s > r ? r : s;
  e = e < 0 ? 0 : e > r ? r : e;
  int64_t n = e > s ? e - s : 0;
  ox_tensor *t = ox_tensor_new(NOVA_DTYPE_I64, 1, &n);
  for (int64_t i = 0; t && i < n; i++) ox_set(t, i, 0, ox_val_shape(in[0])[s + i]);
  return ox_known(out, t);
}

static int cv_range(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  if (ox_need(x, in, nin, 3, 3)) return -1;
  ox_val k[3];
  ox_tensor *own[3] = {0};
  for (int i = 0; i < 3; i++) {
    k[i] = in[i];
    if (!k[i].k && (own[i] = ox_initial_value(in[i]))) k[i] = (ox_val){.k = own[i], .present = true};
  }
  int f = k[0].k && k[1].k && k[2].k ? ox_fold(x, "Range", k, 3, out, nout) : 0;
  for (int i = 0; i < 3; i++) ox_tensor_free(own[i]);
  if (f) return f < 0 ? -1 : 0;
  return ox_err(x, "Range with inputs computed by the step is not supported (its length must be known when compiling)");
}

static int cv_trilu(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  if (a->rank < 2) return ox_err(x, "Trilu needs rank >= 2");
  int64_t k = 0;
  if (nin > 1 && in[1].present && ox_const_ints(x, in[1], "k", &k, 1) != 1) return -1;
  bool upper = ox_attr_i(x, "upper", 1) != 0;
  int64_t rows = a->shape[a->rank - 2], cols = a->shape[a->rank - 1], s[2] = {rows, cols};
  ox_tensor *m = ox_tensor_new(NOVA_DTYPE_BOOL, 2, s);
  if (!m) return -1;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) ox_set(m, i * cols + j, 0, upper ? j - i >= k : j - i <= k);
  nv_node *mask = ox_node(x, (ox_val){.k = m, .present = true});
  ox_tensor_free(m);
  return ox_set_out(out, ox_op3(x, NV_OP_WHERE, mask, a, ox_scalar(x, a->dtype, 0)));
}

/* ---- reductions ------------------------------------------------------------ */

int ox_reduce_axes(ox_ctx *x, ox_val *in, int nin, int64_t from, int64_t *axes) {
  bool axes_input = x->opset >= from;
  if (!axes_input && nin > 1 && in[1].present)
    return ox_err(x, "takes axes as an attribute before opset %lld, not as a second input (opset %lld)", (long long)from,
                  (long long)x->opset);
  int na = axes_input && nin > 1 && in[1].present ? ox_const_ints(x, in[1], "axes", axes, NOVA_MAX_RANK)
           : axes_input ? 0 : ox_attr_ints(x, "axes", axes, NOVA_MAX_RANK);
  if (na < 0 && (axes_input || ox_attr(x, "axes"))) return -1;
  if (na < 0) na = 0;
  if (na == 0 && ox_attr_i(x, "noop_with_empty_axes", 0)) return -2;
  return na;
}

static int cv_reduce(ox_ctx *x, nv_op op, ox_val *in, int nin, ox_val *out, int64_t from) {
  if (ox_need(x, in, nin, 1, 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t axes[NOVA_MAX_RANK];
  int na = ox_reduce_axes(x, in, nin, from, axes);
  if (na == -1) return -1;
  if (na == -2) return ox_set_out(out, a);
  bool keep = ox_attr_i(x, "keepdims", 1) != 0;
  if (a->dtype == NOVA_DTYPE_BOOL && op == NV_OP_REDUCE_MAX) { /* "any": max over 0/1, empty sets give false */
    nv_node f32 = {.to = NOVA_DTYPE_F32};
    nv_node *m = ox_reduce(x, op, ox_add(x, NV_OP_CAST, 1, &a, &f32), na, axes, keep);
    return ox_set_out(out, m ? ox_op2(x, NV_OP_GREATER, m, ox_scalar(x, NOVA_DTYPE_F32, 0.5)) : NULL);
  }
  return ox_set_out(out, ox_reduce(x, op, a, na, axes, keep));
}
/* ReduceSum takes axes as an input from opset 13, Mean and Max from 18. */
static int cv_reduce_sum(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { (void)nout; return cv_reduce(x, NV_OP_REDUCE_SUM, in, nin, out, 13); }
static int cv_reduce_mean(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { (void)nout; return cv_reduce(x, NV_OP_REDUCE_MEAN, in, nin, out, 18); }
static int cv_reduce_max(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { (void)nout; return cv_reduce(x, NV_OP_REDUCE_MAX, in, nin, out, 18); }

/* ---- losses ------------------------------------------------------------------ */

/* Negative log-likelihood of log-probabilities lp [N, C, d...] at labels
 * [N, d...], with optional class weights and ignore_index, reduced as the
 * spec says.  The label's entry is picked with a one-hot mask (labels equal
 * to ignore_index match no class and weigh 0), so no index can go out of
 * bounds whatever the label values. */
static nv_node *nll(ox_ctx *x, nv_node *lp, nv_node *lab, nv_node *w, bool has_ii, int64_t ii, const char *red) {
  if (!lp || !lab) return NULL;
  if (lp->rank < 2 || lab->rank != lp->rank - 1 || !fe_dtype_is_index(lab->dtype)) {
    ox_err(x, "expected scores [N, C, ...] and integer labels [N, ...]");
    return NULL;
  }
  for (int i = 0; i < lab->rank; i++)
    if (lab->shape[i] != lp->shape[i ? i + 1 : 0]) {
      ox_err(x, "labels do not match the scores' shape (without C)");
      return NULL;
    }
  nova_dtype dt = lp->dtype;
  int64_t C = lp->shape[1], r = lp->rank;
  if (fe_mark_labels(x->d, lab, C, has_ii, ii, x->loc)) return NULL;
  /* classes [C, 1, ...] against labels [N, 1, d...] */
  ox_tensor *cls = ox_tensor_new(lab->dtype, 1, &C);
  if (!cls) return NULL;
  for (int64_t i = 0; i < C; i++) ox_set(cls, i, 0, i);
  int64_t cs[NOVA_MAX_RANK], ls[NOVA_MAX_RANK];
  cs[0] = C;
  for (int i = 1; i < r - 1; i++) cs[i] = 1;
  ls[0] = lab->shape[0], ls[1] = 1;
  for (int i = 1; i < lab->rank; i++) ls[i + 1] = lab->shape[i];
  nv_node *classes = ox_reshape(x, ox_node(x, (ox_val){.k = cls, .present = true}), (int)r - 1, cs);
  ox_tensor_free(cls);
  nv_node *onehot = ox_op2(x, NV_OP_EQUAL, ox_reshape(x, lab, (int)r, ls), classes); /* [N, C, d...] */
  nv_node *zero = ox_scalar(x, dt, 0.0);
  nv_node *picked = ox_reduce(x, NV_OP_REDUCE_SUM, ox_op3(x, NV_OP_WHERE, onehot, lp, zero), 1, (int64_t[]){1}, false);
  /* per-element weight: w[label], 0 for ignored labels */
  nv_node *wt;
  if (w) {
    if (w->rank != 1 || w->shape[0] != C) {
      ox_err(x, "weights must be [C]");
      return NULL;
    }
    nv_node *wc = ox_reshape(x, w, (int)r - 1, cs);
    wt = ox_reduce(x, NV_OP_REDUCE_SUM, ox_op3(x, NV_OP_WHERE, onehot, wc, zero), 1, (int64_t[]){1}, false);
  } else if (has_ii)
    wt = ox_op3(x, NV_OP_WHERE, ox_op2(x, NV_OP_EQUAL, lab, ox_scalar(x, lab->dtype, (double)ii)), zero, ox_scalar(x, dt, 1.0));
  else
    wt = NULL;
  if (w && has_ii)
    wt = ox_op3(x, NV_OP_WHERE, ox_op2(x, NV_OP_EQUAL, lab, ox_scalar(x, lab->dtype, (double)ii)), zero, wt);
  nv_node *loss = ox_op1(x, NV_OP_NEG, picked);
  if (wt) loss = ox_op2(x, NV_OP_MUL, loss, wt);
  if (!loss) return NULL;
  if (!strcmp(red, "none")) return loss;
  nv_node *sum = ox_reduce(x, NV_OP_REDUCE_SUM, loss, 0, NULL, false);
  if (!strcmp(red, "sum")) return sum;
  if (strcmp(red, "mean")) {
    ox_err(x, "reduction '%s'; expected none, sum or mean", red);
    return NULL;
  }
  bool ranged = false; /* the count at run time (novac --dim=NAME=LO..HI): a mean the buckets mask */
  for (int i = 0; i < x->ndims; i++) ranged |= x->dims[i].ranged;
  if (!wt && ranged) return ox_reduce(x, NV_OP_REDUCE_MEAN, loss, 0, NULL, false);
  if (!wt) return ox_op2(x, NV_OP_DIV, sum, ox_scalar(x, dt, (double)fe_numel(lab)));
  return ox_op2(x, NV_OP_DIV, sum, ox_reduce(x, NV_OP_REDUCE_SUM, wt, 0, NULL, false));
}

static int cv_sce_loss(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  if (ox_need(x, in, nin, 2, 3)) return -1;
  nv_node *s = ox_N(x, in[0]), *lab = ox_N(x, in[1]), *w = nin > 2 && in[2].present ? ox_N(x, in[2]) : NULL;
  if (!s || !lab) return -1;
  char buf[16];
  const char *red = ox_attr_s(x, "reduction", "mean", buf, sizeof buf);
  bool has_ii = ox_attr(x, "ignore_index") != NULL;
  int64_t ii = ox_attr_i(x, "ignore_index", 0);
  nv_node *y;
  if (s->rank == 2 && !w && !has_ii && !strcmp(red, "mean") && nout < 2) {
    y = ox_op2(x, NV_OP_CROSS_ENTROPY, s, lab); /* the fused op: labels checked at run time */
    return ox_set_out(out, y);
  }
  if (s->rank < 2) return ox_err(x, "scores must be [N, C, ...]");
  nv_node at = {.axis = 1};
  nv_node *lp = ox_add(x, NV_OP_LOG_SOFTMAX, 1, &s, &at);
  if (ox_set_out(out, nll(x, lp, lab, w, has_ii, ii, red))) return -1;
  if (nout > 1) out[1] = (ox_val){.node = lp, .present = lp != NULL};
  return 0;
}

static int cv_nll_loss(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 3)) return -1;
  char buf[16];
  const char *red = ox_attr_s(x, "reduction", "mean", buf, sizeof buf);
  return ox_set_out(out, nll(x, ox_N(x, in[0]), ox_N(x, in[1]), nin > 2 && in[2].present ? ox_N(x, in[2]) : NULL,
                          ox_attr(x, "ignore_index") != NULL, ox_attr_i(x, "ignore_index", 0), red));
}

static int cv_global_avg_pool(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  if (a->rank < 3) return ox_err(x, "GlobalAveragePool needs X of rank >= 3 (N, C, spatial...)");
  int64_t ax[NOVA_MAX_RANK];
  for (int i = 2; i < a->rank; i++) ax[i - 2] = i;
  return ox_set_out(out, ox_reduce(x, NV_OP_REDUCE_MEAN, a, a->rank - 2, ax, true));
}

/* ---- convolution and pooling ------------------------------------------------- */

/* Fills the window attributes of `at` from the node (kernel must be set for
 * the auto_pad computation). */
static int window_attrs(ox_ctx *x, nv_node *at, const nv_node *a, bool with_dilations) {
  int ns = a->rank - 2;
  if (ns < 1 || ns > 3) return ox_err(x, "input must be [N, C, spatial...] with 1 to 3 spatial dims");
  at->nspatial = ns;
  int64_t v[6];
  for (int i = 0; i < ns; i++) at->strides[i] = at->dilations[i] = 1, at->pads[i] = at->pads[ns + i] = 0;
  int n;
  if ((n = ox_attr_ints(x, "strides", v, 3)) >= 0) {
    if (n != ns) return ox_err(x, "strides has %d entries for %d spatial dims", n, ns);
    memcpy(at->strides, v, (size_t)ns * sizeof *v);
  }
  if ((n = ox_attr_ints(x, "dilations", v, 3)) >= 0) {
    if (n != ns) return ox_err(x, "dilations has %d entries for %d spatial dims", n, ns);
    for (int i = 0; i < ns; i++)
      if (!with_dilations && v[i] != 1) return ox_err(x, "dilations other than 1 are not supported here");
    memcpy(at->dilations, v, (size_t)ns * sizeof *v);
  }
  char buf[32];
  const char *ap = ox_attr_s(x, "auto_pad", "NOTSET", buf, sizeof buf);
  if (!strcmp(ap, "NOTSET")) {
    if ((n = ox_attr_ints(x, "pads", v, 6)) >= 0) {
      if (n != 2 * ns) return ox_err(x, "pads has %d entries for %d spatial dims", n, ns);
      memcpy(at->pads, v, (size_t)n * sizeof *v);
    }
  } else if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
    for (int i = 0; i < ns; i++) {
      int64_t in = a->shape[2 + i], o = (in + at->strides[i] - 1) / at->strides[i];
      int64_t total = (o - 1) * at->strides[i] + (at->kernel[i] - 1) * at->dilations[i] + 1 - in;
      if (total < 0) total = 0;
      int64_t small = total / 2;
      at->pads[i] = !strcmp(ap, "SAME_UPPER") ? small : total - small;
      at->pads[ns + i] = total - at->pads[i];
    }
  } else if (strcmp(ap, "VALID"))
    return ox_err(x, "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", ap);
  return 0;
}

int ox_conv(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 3)) return -1;
  nv_node *a = ox_N(x, in[0]), *w = ox_N(x, in[1]);
  if (!a || !w) return -1;
  nv_node at = {.groups = ox_attr_i(x, "group", 1)};
  for (int i = 0; i + 2 < w->rank && i < 3; i++) at.kernel[i] = w->shape[2 + i];
  if (window_attrs(x, &at, a, true)) return -1;
  nv_node *pair[2] = {a, w};
  nv_node *y = ox_add(x, NV_OP_CONV, 2, pair, &at);
  if (y && nin > 2 && in[2].present) y = ox_op2(x, NV_OP_ADD, y, per_channel(x, ox_N(x, in[2]), y));
  return ox_set_out(out, y);
}

/* The flat-index stride of dim d of t. */
static int64_t stride_of(const ox_tensor *t, int d) {
  int64_t s = 1;
  for (int i = d + 1; i < t->rank; i++) s *= t->shape[i];
  return s;
}

/* NonZero of a value known when compiling: the [rank, count] int64 positions. */
static int cv_nonzero(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  const ox_tensor *t = in[0].k;
  if (!t) return ox_err(x, "the input must be known when compiling (the result's shape depends on its values)");
  int r = t->rank ? t->rank : 1;
  int64_t e = ox_numel(t), cnt = 0;
  for (int64_t i = 0; i < e; i++) cnt += ox_getf(t, i) != 0 || ox_geti(t, i) != 0;
  ox_tensor *o = ox_tensor_new(NOVA_DTYPE_I64, 2, (int64_t[]){r, cnt});
  if (!o) return -1;
  for (int64_t i = 0, j = 0; i < e; i++) {
    if (!(ox_getf(t, i) != 0 || ox_geti(t, i) != 0)) continue;
    for (int d = t->rank - 1, q = 0; d >= 0 || (t->rank == 0 && q == 0); d--, q++) {
      int64_t v = t->rank ? (i / stride_of(t, d)) % t->shape[d] : 0;
      ox_set(o, (t->rank ? d : 0) * cnt + j, (double)v, v);
      if (t->rank == 0) break;
    }
    j++;
  }
  return ox_known(out, o);
}

/* ConvTranspose: the input gradient of the convolution it transposes
 * (x [N, C, in...], w [C, M/group, k...] -> [N, M, out...]). */
static int cv_conv_transpose(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 3)) return -1;
  nv_node *a = ox_N(x, in[0]), *w = ox_N(x, in[1]);
  if (!a || !w) return -1;
  int ns = a->rank - 2;
  if (ns < 1 || ns > 3 || w->rank != a->rank) return ox_err(x, "X must be [N, C, spatial...] (1 to 3 spatial dims) and W of its rank");
  nv_node at = {.groups = ox_attr_i(x, "group", 1), .nspatial = ns};
  int64_t v[6], op[3] = {0, 0, 0}, os[3];
  for (int i = 0; i < ns; i++) at.strides[i] = at.dilations[i] = 1, at.kernel[i] = w->shape[2 + i];
  if (ox_attr_ints(x, "strides", v, 3) == ns) memcpy(at.strides, v, (size_t)ns * 8);
  if (ox_attr_ints(x, "dilations", v, 3) == ns) memcpy(at.dilations, v, (size_t)ns * 8);
  int nop = ox_attr_ints(x, "output_padding", v, 6);
  if (nop >= ns) memcpy(op, v, (size_t)ns * 8);
  int nos = ox_attr_ints(x, "output_shape", v, 6);
  if (nos > 0 && nos != ns) return ox_err(x, "output_shape has %d entries for %d spatial dims", nos, ns);
  if (nos > 0) memcpy(os, v, (size_t)ns * 8);
  char buf[32];
  const char *ap = ox_attr_s(x, "auto_pad", "NOTSET", buf, sizeof buf);
  int np = ox_attr_ints(x, "pads", v, 6);
  for (int i = 0; i < ns; i++) {
    if (at.strides[i] <= 0 || at.dilations[i] <= 0 || op[i] < 0 || (op[i] >= at.strides[i] && op[i] >= at.dilations[i]))
      return ox_err(x, "strides and dilations must be positive, output_padding below the stride or the dilation");
    int64_t span = at.strides[i] * (a->shape[2 + i] - 1) + op[i] + (at.kernel[i] - 1) * at.dilations[i] + 1;
    if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
      int64_t o = nos > 0 ? os[i] : a->shape[2 + i] * at.strides[i], t = span - o;
      at.pads[i] = !strcmp(ap, "SAME_UPPER") ? t / 2 : t - t / 2;
      at.pads[ns + i] = t - at.pads[i];
    } else if (!strcmp(ap, "NOTSET") || !strcmp(ap, "VALID")) {
      at.pads[i] = np == 2 * ns && strcmp(ap, "VALID") ? v[i] : 0;
      at.pads[ns + i] = np == 2 * ns && strcmp(ap, "VALID") ? v[ns + i] : 0;
    } else
      return ox_err(x, "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", ap);
    if (at.pads[i] < 0 || at.pads[ns + i] < 0) return ox_err(x, "the padding for output_shape is negative");
    at.list[2 + i] = nos > 0 && strcmp(ap, "SAME_UPPER") && strcmp(ap, "SAME_LOWER") ? os[i] : span - at.pads[i] - at.pads[ns + i];
    if (at.list[2 + i] <= 0) return ox_err(x, "the output would be empty on spatial axis %d", i);
  }
  if (np >= 0 && np != 2 * ns) return ox_err(x, "pads has %d entries for %d spatial dims", np, ns);
  if (at.groups <= 0 || a->shape[1] != w->shape[0] || a->shape[1] % at.groups)
    return ox_err(x, "W [C, M/group, k...] must have X's C = %lld channels first, divisible by group %lld",
                  (long long)a->shape[1], (long long)at.groups);
  at.nlist = a->rank;
  at.list[0] = a->shape[0], at.list[1] = w->shape[1] * at.groups;
  nv_node *y = ox_add(x, NV_OP_CONV_GRAD_INPUT, 2, (nv_node *[]){a, w}, &at);
  if (y && nin > 2 && in[2].present) y = ox_op2(x, NV_OP_ADD, y, per_channel(x, ox_N(x, in[2]), y));
  return ox_set_out(out, y);
}

/* include_pad: -1 = the count_include_pad attribute. */
static int pool(ox_ctx *x, nv_op op, ox_val *in, int nin, ox_val *out, int nout, int include_pad) {
  if (ox_need(x, in, nin, 1, 1)) return -1;
  if (nout > 1 && op != NV_OP_MAX_POOL) return ox_err(x, "has one output");
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  nv_node at = {.ceil_mode = ox_attr_i(x, "ceil_mode", 0) != 0,
                .count_include_pad = include_pad >= 0 ? include_pad : ox_attr_i(x, "count_include_pad", 0) != 0};
  int n = ox_attr_ints(x, "kernel_shape", at.kernel, 3);
  if (n != a->rank - 2) return ox_err(x, "kernel_shape must have one entry per spatial dim (%d)", a->rank - 2);
  at.col_major = ox_attr_i(x, "storage_order", 0) != 0;
  if (window_attrs(x, &at, a, true)) return -1;
  nv_node *y = ox_add(x, op, 1, &a, &at);
  if (ox_set_out(out, y)) return -1;
  if (nout > 1) { /* Indices: flat row-major positions in X of each window's maximum */
    nv_node *ix = ox_add(x, NV_OP_MAX_POOL_INDICES, 2, (nv_node *[]){a, y}, &at);
    out[1] = (ox_val){.node = ix, .present = ix != NULL};
    if (!ix) return -1;
  }
  return 0;
}
/* LpPool: (sum of |x|^p over the window)^(1/p), the padding counting as 0,
 * written as (K avg_pool(|x|^p))^(1/p) with the padding included in the
 * average, K the window's element count. */
static int cv_lp_pool(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  double p = x->opset < 11 ? ox_attr_f(x, "p", 2.0) : (double)ox_attr_i(x, "p", 2);
  if (!(p > 0)) return ox_err(x, "p must be positive");
  nv_node *t = p == 2 ? ox_op2(x, NV_OP_MUL, a, a) : ox_op2(x, NV_OP_POW, ox_op1(x, NV_OP_ABS, a), ox_scalar(x, a->dtype, p));
  ox_val v = {.node = t, .present = t != NULL};
  if (!t || pool(x, NV_OP_AVG_POOL, &v, 1, out, 1, 1)) return -1;
  double kn = 1;
  int64_t ks[3];
  int nk = ox_attr_ints(x, "kernel_shape", ks, 3);
  for (int i = 0; i < nk; i++) kn *= (double)ks[i];
  nv_node *s = ox_op2(x, NV_OP_MUL, out[0].node, ox_scalar(x, a->dtype, kn));
  return ox_set_out(out, p == 2 ? ox_op1(x, NV_OP_SQRT, s) : ox_op2(x, NV_OP_POW, s, ox_scalar(x, a->dtype, 1 / p)));
}

static int cv_max_pool(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { return pool(x, NV_OP_MAX_POOL, in, nin, out, nout, -1); }
static int cv_avg_pool(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { return pool(x, NV_OP_AVG_POOL, in, nin, out, nout, -1); }

/* ---- dispatch ------------------------------------------------------------------ */

static const ox_op_entry table[] = {
    {"Add", cv_add}, {"Sub", cv_sub}, {"Mul", cv_mul}, {"Div", cv_div}, {"Pow", cv_pow},
    {"Equal", cv_equal}, {"Less", cv_less}, {"Greater", cv_greater}, {"Neg", cv_neg}, {"Abs", cv_abs},
    {"Exp", cv_exp}, {"Log", cv_log}, {"Sqrt", cv_sqrt}, {"Tanh", cv_tanh}, {"Sigmoid", cv_sigmoid},
    {"Relu", cv_relu}, {"Erf", cv_erf}, {"Reciprocal", cv_reciprocal}, {"LeakyRelu", cv_leaky_relu},
    {"Gelu", cv_gelu}, {"Min", cv_min}, {"Max", cv_max}, {"Clip", cv_clip}, {"Where", cv_where},
    {"Cast", cv_cast}, {"Identity", cv_identity}, {"Dropout", cv_dropout}, {"MatMul", cv_matmul},
    {"Gemm", cv_gemm}, {"Softmax", cv_softmax}, {"LogSoftmax", cv_log_softmax},
    {"LayerNormalization", cv_layer_norm}, {"BatchNormalization", cv_batch_norm}, {"Reshape", cv_reshape},
    {"Flatten", cv_flatten}, {"Unsqueeze", cv_unsqueeze}, {"Squeeze", cv_squeeze}, {"Expand", cv_expand},
    {"Transpose", cv_transpose}, {"Concat", cv_concat}, {"Split", cv_split}, {"Slice", cv_slice},
    {"Gather", cv_gather}, {"Constant", cv_constant}, {"ConstantOfShape", cv_constant_of_shape},
    {"Shape", cv_shape}, {"Range", cv_range}, {"Trilu", cv_trilu}, {"ReduceSum", cv_reduce_sum},
    {"ReduceMean", cv_reduce_mean}, {"ReduceMax", cv_reduce_max}, {"SoftmaxCrossEntropyLoss", cv_sce_loss},
    {"NegativeLogLikelihoodLoss", cv_nll_loss}, {"GlobalAveragePool", cv_global_avg_pool},
    {"Conv", ox_conv}, {"NonZero", cv_nonzero},
    {"ConvTranspose", cv_conv_transpose}, {"LpPool", cv_lp_pool}, {"MaxPool", cv_max_pool}, {"AveragePool", cv_avg_pool},
};

static ox_conv_fn lookup(const char *op) {
  const struct { const ox_op_entry *t; size_t n; } tabs[] = {
      {table, sizeof table / sizeof *table}, {ox_math_ops, ox_math_nops}, {ox_index_ops, ox_index_nops}, {ox_nn_ops, ox_nn_nops}, {ox_resize_ops, ox_resize_nops}, {ox_einsum_ops, ox_einsum_nops}, {ox_rnn_ops, ox_rnn_nops}, {ox_dft_ops, ox_dft_nops},
      {ox_seq_ops, ox_seq_nops}, {ox_qlinear_ops, ox_qlinear_nops}};
  for (size_t k = 0; k < sizeof tabs / sizeof *tabs; k++)
    for (size_t i = 0; i < tabs[k].n; i++)
      if (!strcmp(tabs[k].t[i].name, op)) return tabs[k].t[i].fn;
  return NULL;
}

/* Older versions whose semantics differ from what the converters
 * implement (the converters handle the attribute-versus-input forms). */
static int version_gate(ox_ctx *x, const char *op) {
  if (!strcmp(op, "BatchNormalization") && x->opset < 9 && ox_attr_i(x, "spatial", 1) == 0)
    return ox_err(x, "spatial=0 (per-element statistics, opset %lld) is not supported", (long long)x->opset);
  return 0;
}

int ox_convert(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  const char *op = x->node->op_type;
  ox_conv_fn fn = lookup(op);
  if (fn) {
    if (version_gate(x, op)) return -1;
    int before = nv_diag_count(x->d);
    if (ox_takes_seq(op) && strcmp(op, "Identity")) { /* the sequence operators fold what they can themselves */
      int rc = fn(x, in, nin, out, nout);
      if (rc && nv_diag_count(x->d) == before) ox_err(x, "could not be converted (memory ran out)");
      return rc ? -1 : 0;
    }
    if (!ox_takes_seq(op) && ox_tensors_only(x, in, nin)) return -1; /* Identity passes a sequence on */
    int f = ox_fold(x, op, in, nin, out, nout);
    if (f < 0 && nv_diag_count(x->d) == before)
      ox_err(x, "evaluating it when compiling failed: its result is too large (more than 2^28 elements) or memory ran out");
    if (f) return f < 0 ? -1 : 0;
    /* every input known: convert as always, then evaluate what was built */
    bool known = nin > 0;
    for (int i = 0; i < nin; i++) known &= !in[i].present || in[i].k != NULL;
    int mark = x->g->nnodes;
    int rc = fn(x, in, nin, out, nout);
    if (rc && nv_diag_count(x->d) == before) ox_err(x, "could not be converted");
    if (!rc && known && ox_eval_known(x, mark, out, nout)) fe_graph_truncate(x->g, mark);
    return rc ? -1 : 0;
  }
  return ox_err(x, "operator %s (domain ai.onnx, opset %lld) is not supported", op, (long long)x->opset);
}
