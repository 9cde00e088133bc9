/* onnx_math.c: ONNX elementwise math, logic, activations and reductions ->
 * nova nodes.
 *
 * Ops with a nova counterpart map to it; the others are written as their
 * ONNX function bodies (or a numerically safer equivalent, said where
 * used) in nova ops, so their gradients come from the rules of those ops.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "onnx.h"

#define CV(name) static int name(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout)

static int unary(ox_ctx *x, nv_op op, ox_val *in, int nin, ox_val *out) {
  if (ox_need(x, in, nin, 1, 1)) return -1;
  return ox_set_out(out, ox_op1(x, op, ox_N(x, in[0])));
}
static int binary(ox_ctx *x, nv_op op, ox_val *in, int nin, ox_val *out) {
  if (ox_need(x, in, nin, 2, 2)) return -1;
  return ox_set_out(out, ox_op2(x, op, ox_N(x, in[0]), ox_N(x, in[1])));
}
#define UNARY(name, op) CV(cv_##name) { (void)nout; return unary(x, op, in, nin, out); }
#define BINARY(name, op) CV(cv_##name) { (void)nout; return binary(x, op, in, nin, out); }
UNARY(sin, NV_OP_SIN)
UNARY(cos, NV_OP_COS)
UNARY(tan, NV_OP_TAN)
UNARY(asin, NV_OP_ASIN)
UNARY(acos, NV_OP_ACOS)
UNARY(atan, NV_OP_ATAN)
UNARY(sinh, NV_OP_SINH)
UNARY(cosh, NV_OP_COSH)
UNARY(asinh, NV_OP_ASINH)
UNARY(acosh, NV_OP_ACOSH)
UNARY(atanh, NV_OP_ATANH)
UNARY(floor, NV_OP_FLOOR)
UNARY(ceil, NV_OP_CEIL)
UNARY(round, NV_OP_ROUND)
UNARY(sign, NV_OP_SIGN)
UNARY(isnan, NV_OP_ISNAN)
UNARY(not, NV_OP_NOT)
BINARY(and, NV_OP_AND)
BINARY(or, NV_OP_OR)
BINARY(xor, NV_OP_XOR)
BINARY(less_equal, NV_OP_LESS_EQUAL)
BINARY(greater_equal, NV_OP_GREATER_EQUAL)

BINARY(bitwise_and, NV_OP_AND)
BINARY(bitwise_or, NV_OP_OR)
BINARY(bitwise_xor, NV_OP_XOR)
UNARY(bitwise_not, NV_OP_NOT)

CV(cv_bit_shift) {
  (void)nout;
  char buf[8];
  const char *dir = ox_attr_s(x, "direction", "", buf, sizeof buf);
  if (strcmp(dir, "LEFT") && strcmp(dir, "RIGHT")) return ox_err(x, "direction '%s'; expected LEFT or RIGHT", dir);
  return binary(x, strcmp(dir, "LEFT") ? NV_OP_SHR : NV_OP_SHL, in, nin, out);
}

CV(cv_isinf) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  nv_node *r = ox_op1(x, NV_OP_ISINF, a);
  bool neg = ox_attr_i(x, "detect_negative", 1) != 0, pos = ox_attr_i(x, "detect_positive", 1) != 0;
  if (r && !neg) r = ox_op2(x, NV_OP_AND, r, ox_op2(x, NV_OP_GREATER, a, ox_scalar(x, a->dtype, 0)));
  if (r && !pos) r = ox_op2(x, NV_OP_AND, r, ox_op2(x, NV_OP_LESS, a, ox_scalar(x, a->dtype, 0)));
  return ox_set_out(out, r);
}

CV(cv_mod) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  return ox_set_out(out, ox_op2(x, ox_attr_i(x, "fmod", 0) ? NV_OP_FMOD : NV_OP_MOD, ox_N(x, in[0]), ox_N(x, in[1])));
}

/* ---- activations ------------------------------------------------------ */

static nv_node *K(ox_ctx *x, const nv_node *like, double v) { return like ? ox_scalar(x, like->dtype, v) : NULL; }

/* log(1 + exp(x)) as relu(x) + log(1 + exp(-|x|)): no overflow for large x. */
static nv_node *softplus(ox_ctx *x, nv_node *a) {
  if (!a) return NULL;
  nv_node *t = ox_op1(x, NV_OP_EXP, ox_op1(x, NV_OP_NEG, ox_op1(x, NV_OP_ABS, a)));
  return ox_op2(x, NV_OP_ADD, ox_op1(x, NV_OP_RELU, a), ox_op1(x, NV_OP_LOG, ox_op2(x, NV_OP_ADD, K(x, a, 1), t)));
}

/* max(0, min(1, alpha x + beta)) */
static nv_node *hard_sigmoid(ox_ctx *x, nv_node *a, double alpha, double beta) {
  if (!a) return NULL;
  nv_node *l = ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_MUL, a, K(x, a, alpha)), K(x, a, beta));
  return ox_op2(x, NV_OP_MAXIMUM, ox_op2(x, NV_OP_MINIMUM, l, K(x, a, 1)), K(x, a, 0));
}

CV(cv_softplus) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  return ox_set_out(out, softplus(x, ox_N(x, in[0])));
}

CV(cv_softsign) { /* x / (1 + |x|) */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  return ox_set_out(out, a ? ox_op2(x, NV_OP_DIV, a, ox_op2(x, NV_OP_ADD, K(x, a, 1), ox_op1(x, NV_OP_ABS, a))) : NULL);
}

CV(cv_mish) { /* x tanh(softplus(x)) */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  return ox_set_out(out, a ? ox_op2(x, NV_OP_MUL, a, ox_op1(x, NV_OP_TANH, softplus(x, a))) : NULL);
}

CV(cv_hard_sigmoid) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  return ox_set_out(out, hard_sigmoid(x, ox_N(x, in[0]), ox_attr_f(x, "alpha", 0.2), ox_attr_f(x, "beta", 0.5)));
}

CV(cv_hard_swish) { /* x hardsigmoid(x; 1/6, 1/2) */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  return ox_set_out(out, a ? ox_op2(x, NV_OP_MUL, a, hard_sigmoid(x, a, 1.0 / 6, 0.5)) : NULL);
}

/* x < 0 (or <= 0) ? neg : x */
static nv_node *negative_part(ox_ctx *x, nv_node *a, nv_node *neg, bool or_equal) {
  if (!a || !neg) return NULL;
  nv_node *c = ox_op2(x, or_equal ? NV_OP_LESS_EQUAL : NV_OP_LESS, a, K(x, a, 0));
  return ox_op3(x, NV_OP_WHERE, c, neg, a);
}

CV(cv_elu) { /* x < 0: alpha (exp(x) - 1) */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  double alpha = ox_attr_f(x, "alpha", 1.0);
  nv_node *e = a ? ox_op2(x, NV_OP_MUL, K(x, a, alpha), ox_op2(x, NV_OP_SUB, ox_op1(x, NV_OP_EXP, a), K(x, a, 1))) : NULL;
  return ox_set_out(out, negative_part(x, a, e, false));
}

CV(cv_selu) { /* gamma (x <= 0 ? alpha e^x - alpha : x) */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  double alpha = ox_attr_f(x, "alpha", 1.67326319217681884765625), gamma = ox_attr_f(x, "gamma", 1.05070102214813232421875);
  nv_node *e = a ? ox_op2(x, NV_OP_SUB, ox_op2(x, NV_OP_MUL, K(x, a, alpha), ox_op1(x, NV_OP_EXP, a)), K(x, a, alpha)) : NULL;
  nv_node *y = negative_part(x, a, e, true);
  return ox_set_out(out, y ? ox_op2(x, NV_OP_MUL, y, K(x, a, gamma)) : NULL);
}

CV(cv_celu) { /* max(0, x) + min(0, alpha (exp(x / alpha) - 1)) */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  double alpha = ox_attr_f(x, "alpha", 1.0);
  if (alpha == 0) return ox_err(x, "alpha must not be 0");
  nv_node *e = ox_op2(x, NV_OP_MUL, K(x, a, alpha),
                      ox_op2(x, NV_OP_SUB, ox_op1(x, NV_OP_EXP, ox_op2(x, NV_OP_DIV, a, K(x, a, alpha))), K(x, a, 1)));
  return ox_set_out(out, ox_op2(x, NV_OP_ADD, ox_op1(x, NV_OP_RELU, a), ox_op2(x, NV_OP_MINIMUM, K(x, a, 0), e)));
}

CV(cv_prelu) { /* x < 0 ? slope x : x, slope broadcast to x */
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *a = ox_N(x, in[0]), *s = ox_N(x, in[1]);
  return ox_set_out(out, a && s ? negative_part(x, a, ox_op2(x, NV_OP_MUL, a, s), false) : NULL);
}

CV(cv_thresholded_relu) { /* x > alpha ? x : 0 */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  nv_node *c = ox_op2(x, NV_OP_GREATER, a, K(x, a, ox_attr_f(x, "alpha", 1.0)));
  return ox_set_out(out, ox_op3(x, NV_OP_WHERE, c, a, K(x, a, 0)));
}

CV(cv_swish) { /* x sigmoid(alpha x) */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  double alpha = ox_attr_f(x, "alpha", 1.0);
  nv_node *s = ox_op1(x, NV_OP_SIGMOID, alpha == 1.0 ? a : ox_op2(x, NV_OP_MUL, a, K(x, a, alpha)));
  return ox_set_out(out, ox_op2(x, NV_OP_MUL, a, s));
}

CV(cv_shrink) { /* x < -lambd: x + bias; x > lambd: x - bias; else 0 */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  double l = ox_attr_f(x, "lambd", 0.5), b = ox_attr_f(x, "bias", 0.0);
  nv_node *lo = ox_op2(x, NV_OP_LESS, a, K(x, a, -l)), *hi = ox_op2(x, NV_OP_GREATER, a, K(x, a, l));
  nv_node *inner = ox_op3(x, NV_OP_WHERE, hi, ox_op2(x, NV_OP_SUB, a, K(x, a, b)), K(x, a, 0));
  return ox_set_out(out, ox_op3(x, NV_OP_WHERE, lo, ox_op2(x, NV_OP_ADD, a, K(x, a, b)), inner));
}

static int variadic(ox_ctx *x, ox_val *in, int nin, ox_val *out, bool mean) {
  if (ox_need(x, in, nin, 1, -1)) return -1;
  nv_node *acc = ox_N(x, in[0]);
  for (int i = 1; i < nin && acc; i++) acc = ox_op2(x, NV_OP_ADD, acc, ox_N(x, in[i]));
  if (acc && mean && nin > 1) acc = ox_op2(x, NV_OP_DIV, acc, K(x, acc, nin));
  return ox_set_out(out, acc);
}
CV(cv_sum) { (void)nout; return variadic(x, in, nin, out, false); }
CV(cv_mean) { (void)nout; return variadic(x, in, nin, out, true); }

CV(cv_cast_like) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  nova_dtype to = in[1].k ? in[1].k->dt : in[1].node ? in[1].node->dtype : (nova_dtype)0;
  if (a->dtype == to) return ox_set_out(out, a);
  nv_node at = {.to = to};
  return ox_set_out(out, ox_add(x, NV_OP_CAST, 1, &a, &at));
}

CV(cv_size) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  int r = ox_val_rank(in[0]);
  const int64_t *s = ox_val_shape(in[0]);
  ox_tensor *t = ox_tensor_new(NOVA_DTYPE_I64, 0, NULL);
  if (!t) return -1;
  int64_t n = 1;
  for (int i = 0; i < r; i++) n *= s[i];
  ox_set(t, 0, (double)n, n);
  return ox_known(out, t);
}

/* ---- reductions -------------------------------------------------------- */

enum { R_MIN, R_PROD, R_L1, R_L2, R_LOG_SUM, R_LOG_SUM_EXP, R_SUM_SQUARE };

static int reduction(ox_ctx *x, int kind, ox_val *in, int nin, ox_val *out) {
  if (ox_need(x, in, nin, 1, 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t axes[NOVA_MAX_RANK];
  int na = ox_reduce_axes(x, in, nin, 18, axes);
  if (na == -1) return -1;
  bool keep = ox_attr_i(x, "keepdims", 1) != 0;
  if (na == -2) { /* no reduction: the elementwise part only */
    switch (kind) {
    case R_L1: return ox_set_out(out, ox_op1(x, NV_OP_ABS, a));
    case R_L2: return ox_set_out(out, ox_op1(x, NV_OP_ABS, a));
    case R_LOG_SUM: return ox_set_out(out, ox_op1(x, NV_OP_LOG, a));
    case R_SUM_SQUARE: return ox_set_out(out, ox_op2(x, NV_OP_MUL, a, a));
    default: return ox_set_out(out, a);
    }
  }
  switch (kind) {
  case R_MIN:
    if (a->dtype == NOVA_DTYPE_BOOL) { /* "all": min over 0/1 */
      nv_node f32 = {.to = NOVA_DTYPE_F32};
      nv_node *m = ox_reduce(x, NV_OP_REDUCE_MIN, ox_add(x, NV_OP_CAST, 1, &a, &f32), na, axes, keep);
      return ox_set_out(out, m ? ox_op2(x, NV_OP_GREATER, m, ox_scalar(x, NOVA_DTYPE_F32, 0.5)) : NULL);
    }
    return ox_set_out(out, ox_reduce(x, NV_OP_REDUCE_MIN, a, na, axes, keep));
  case R_PROD: return ox_set_out(out, ox_reduce(x, NV_OP_REDUCE_PROD, a, na, axes, keep));
  case R_L1: return ox_set_out(out, ox_reduce(x, NV_OP_REDUCE_SUM, ox_op1(x, NV_OP_ABS, a), na, axes, keep));
  case R_SUM_SQUARE: return ox_set_out(out, ox_reduce(x, NV_OP_REDUCE_SUM, ox_op2(x, NV_OP_MUL, a, a), na, axes, keep));
  case R_L2: {
    if (!fe_dtype_is_float(a->dtype)) { /* integer L2: computed in f64, truncated back (the reference's cast) */
      nv_node f64 = {.to = NOVA_DTYPE_F64}, back = {.to = a->dtype};
      nv_node *af = ox_add(x, NV_OP_CAST, 1, &a, &f64);
      nv_node *s = ox_reduce(x, NV_OP_REDUCE_SUM, ox_op2(x, NV_OP_MUL, af, af), na, axes, keep);
      nv_node *r = ox_op1(x, NV_OP_SQRT, s);
      return ox_set_out(out, r ? ox_add(x, NV_OP_CAST, 1, &r, &back) : NULL);
    }
    return ox_set_out(out, ox_op1(x, NV_OP_SQRT, ox_reduce(x, NV_OP_REDUCE_SUM, ox_op2(x, NV_OP_MUL, a, a), na, axes, keep)));
  }
  case R_LOG_SUM: return ox_set_out(out, ox_op1(x, NV_OP_LOG, ox_reduce(x, NV_OP_REDUCE_SUM, a, na, axes, keep)));
  default: { /* log sum exp(x - m) + m, m the max: no overflow */
    nv_node *m = ox_reduce(x, NV_OP_REDUCE_MAX, a, na, axes, true);
    nv_node *s = ox_reduce(x, NV_OP_REDUCE_SUM, ox_op1(x, NV_OP_EXP, ox_op2(x, NV_OP_SUB, a, m)), na, axes, true);
    nv_node *r = ox_op2(x, NV_OP_ADD, ox_op1(x, NV_OP_LOG, s), m);
    if (!r || keep) return ox_set_out(out, r);
    nv_node *q = ox_reduce(x, NV_OP_REDUCE_SUM, a, na, axes, false); /* only for the shape */
    return ox_set_out(out, q ? ox_reshape(x, r, q->rank, q->shape) : NULL);
  }
  }
}
#define REDUCTION(name, kind) CV(cv_##name) { (void)nout; return reduction(x, kind, in, nin, out); }
REDUCTION(reduce_min, R_MIN)
REDUCTION(reduce_prod, R_PROD)
REDUCTION(reduce_l1, R_L1)
REDUCTION(reduce_l2, R_L2)
REDUCTION(reduce_log_sum, R_LOG_SUM)
REDUCTION(reduce_log_sum_exp, R_LOG_SUM_EXP)
REDUCTION(reduce_sum_square, R_SUM_SQUARE)

/* 0, 1, ..., n-1 along `axis` of a rank-r int64 constant (1 elsewhere). */
static nv_node *iota(ox_ctx *x, int r, int axis, int64_t n) {
  int64_t s[NOVA_MAX_RANK];
  for (int i = 0; i < r; i++) s[i] = i == axis ? n : 1;
  ox_tensor *t = ox_tensor_new(NOVA_DTYPE_I64, r, s);
  if (!t) return NULL;
  for (int64_t i = 0; i < n; i++) ox_set(t, i, (double)i, i);
  nv_node *c = ox_N(x, (ox_val){.k = t, .present = true});
  ox_tensor_free(t);
  return c;
}

/* The index of the first (or last) extremum along axis, int64. */
static nv_node *arg_extremum(ox_ctx *x, nv_node *a, int64_t axis, bool max, bool last, bool keep) {
  if (!a) return NULL;
  int64_t n = a->shape[axis];
  nv_node *m = ox_reduce(x, max ? NV_OP_REDUCE_MAX : NV_OP_REDUCE_MIN, a, 1, &axis, true);
  nv_node *hit = ox_op2(x, NV_OP_EQUAL, a, m);
  nv_node *cand = ox_op3(x, NV_OP_WHERE, hit, iota(x, a->rank, (int)axis, n), ox_scalar(x, NOVA_DTYPE_I64, last ? -1 : (double)n));
  return ox_reduce(x, last ? NV_OP_REDUCE_MAX : NV_OP_REDUCE_MIN, cand, 1, &axis, keep);
}

static int argext(ox_ctx *x, ox_val *in, int nin, ox_val *out, bool max) {
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  if (a->rank == 0) return ox_err(x, "data must have rank >= 1");
  int64_t axis = ox_attr_i(x, "axis", 0);
  if (ox_norm_axis(x, &axis, a->rank)) return -1;
  if (a->dtype == NOVA_DTYPE_BOOL) {
    nv_node i32 = {.to = NOVA_DTYPE_I32};
    a = ox_add(x, NV_OP_CAST, 1, &a, &i32);
  }
  return ox_set_out(out, arg_extremum(x, a, axis, max, ox_attr_i(x, "select_last_index", 0) != 0,
                                      ox_attr_i(x, "keepdims", 1) != 0));
}
CV(cv_argmax) { (void)nout; return argext(x, in, nin, out, true); }
CV(cv_argmin) { (void)nout; return argext(x, in, nin, out, false); }

CV(cv_hardmax) { /* 1 at the first maximum along axis */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t axis = ox_attr_i(x, "axis", x->opset < 13 ? 1 : -1);
  if (a->rank == 0) return ox_err(x, "input must have rank >= 1");
  nv_node *src = x->opset < 13 ? ox_coerce_2d(x, a, &axis) : a; /* before 13: over the flattened trailing dims */
  if (!src || ox_norm_axis(x, &axis, src->rank)) return -1;
  nv_node *am = arg_extremum(x, src, axis, true, false, true);
  nv_node *hit = ox_op2(x, NV_OP_EQUAL, am, iota(x, src->rank, (int)axis, src->shape[axis]));
  nv_node *y = ox_op3(x, NV_OP_WHERE, hit, K(x, a, 1), K(x, a, 0));
  return ox_set_out(out, ox_reshape(x, y, a->rank, a->shape));
}

/* ---- quantization ------------------------------------------------------ */

/* A scale or zero point shaped to broadcast against x [.. d(axis) ..]: a
 * scalar as is, a vector along axis, a blocked tensor repeated block_size
 * times along axis (cut to x's length). */
static nv_node *quant_param(ox_ctx *x, nv_node *v, const nv_node *a, int64_t axis, int64_t block) {
  if (!v || v->rank == 0 || fe_numel(v) == 1) return v ? ox_reshape(x, v, 0, NULL) : NULL;
  if (!block) {
    if (v->rank != 1 || v->shape[0] != a->shape[axis]) {
      ox_err(x, "a per-axis scale or zero point must be [%lld] (axis %lld)", (long long)a->shape[axis], (long long)axis);
      return NULL;
    }
    int64_t s[NOVA_MAX_RANK];
    for (int i = 0; i < a->rank; i++) s[i] = i == axis ? v->shape[0] : 1;
    return ox_reshape(x, v, a->rank, s);
  }
  if (v->rank != a->rank || block <= 0 || (a->shape[axis] + block - 1) / block != v->shape[axis]) {
    ox_err(x, "a blocked scale or zero point must have the input's rank and ceil(d / %lld) entries along axis %lld",
           (long long)block, (long long)axis);
    return NULL;
  }
  int64_t n = a->shape[axis], *ix = nv_xmalloc((size_t)n * sizeof *ix);
  if (!ix) return NULL;
  for (int64_t i = 0; i < n; i++) ix[i] = i / block;
  nv_node *r = ox_pick(x, v, axis, ix, n);
  free(ix);
  return r;
}

static nv_node *to(ox_ctx *x, nv_node *a, nova_dtype dt) {
  if (!a || a->dtype == dt) return a;
  nv_node at = {.to = dt};
  return ox_add(x, NV_OP_CAST, 1, &a, &at);
}

/* The quantization axis matters only for a per-axis or blocked scale. */
static int quant_axis(ox_ctx *x, const nv_node *a, const nv_node *scale, int64_t *axis, int64_t *block) {
  *axis = ox_attr_i(x, "axis", 1), *block = ox_attr_i(x, "block_size", 0);
  if (fe_numel(scale) == 1 && scale->rank <= 1) return *axis = 0, 0;
  return ox_norm_axis(x, axis, a->rank);
}

/* (x - zero_point) * scale, in float32 (the reference's), then the scale's type */
CV(cv_dequantize) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 3)) return -1;
  nv_node *a = ox_N(x, in[0]), *sc = ox_N(x, in[1]), *zp = nin > 2 && in[2].present ? ox_N(x, in[2]) : NULL;
  if (!a || !sc) return -1;
  if (!fe_dtype_is_int(a->dtype)) return ox_err(x, "x of type %s is not supported (integer types only)", fe_dtype_name(a->dtype));
  if (zp && zp->dtype != a->dtype) return ox_err(x, "the zero point must have x's type");
  int64_t axis, block;
  if (quant_axis(x, a, sc, &axis, &block)) return -1;
  nv_node *d = to(x, a, NOVA_DTYPE_F32);
  if (zp) d = ox_op2(x, NV_OP_SUB, d, to(x, quant_param(x, zp, a, axis, block), NOVA_DTYPE_F32));
  nova_dtype odt = ox_attr(x, "output_dtype") ? ox_dtype_of_onnx((int32_t)ox_attr_i(x, "output_dtype", 1)) : sc->dtype;
  nv_node *y = ox_op2(x, NV_OP_MUL, d, to(x, quant_param(x, sc, a, axis, block), NOVA_DTYPE_F32));
  return ox_set_out(out, to(x, y, odt));
}

/* saturate(round_half_even(x / scale) + zero_point) in the zero point's type (uint8 by default) */
CV(cv_quantize) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 3)) return -1;
  nv_node *a = ox_N(x, in[0]), *sc = ox_N(x, in[1]), *zp = nin > 2 && in[2].present ? ox_N(x, in[2]) : NULL;
  if (!a || !sc) return -1;
  nova_dtype odt = zp ? zp->dtype : ox_attr(x, "output_dtype") ? ox_dtype_of_onnx((int32_t)ox_attr_i(x, "output_dtype", 2))
                                                                : NOVA_DTYPE_U8;
  if (!fe_dtype_is_int(odt) || fe_dtype_size(odt) > 2)
    return ox_err(x, "quantizing to %s is not supported (uint8, int8, uint16, int16)", odt ? fe_dtype_name(odt) : "that type");
  int64_t axis, block;
  if (quant_axis(x, a, sc, &axis, &block)) return -1;
  bool un = fe_dtype_is_unsigned(odt);
  double lo = un ? 0 : -(double)(1 << (8 * fe_dtype_size(odt) - 1)), hi = un ? (double)((1 << (8 * fe_dtype_size(odt))) - 1) : -lo - 1;
  nova_dtype ct = a->dtype == NOVA_DTYPE_F64 ? NOVA_DTYPE_F64 : NOVA_DTYPE_F32;
  nv_node *q = ox_op1(x, NV_OP_ROUND, ox_op2(x, NV_OP_DIV, to(x, a, ct), to(x, quant_param(x, sc, a, axis, block), ct)));
  if (zp) q = ox_op2(x, NV_OP_ADD, q, to(x, quant_param(x, zp, a, axis, block), ct));
  if (!q) return -1;
  q = ox_op2(x, NV_OP_MINIMUM, ox_op2(x, NV_OP_MAXIMUM, q, ox_scalar(x, ct, lo)), ox_scalar(x, ct, hi));
  return ox_set_out(out, to(x, q, odt));
}

/* DynamicQuantizeLinear, its function body: the uint8 scale and zero point of
 * [min(x, 0), max(x, 0)], then x quantized with them. */
CV(cv_dynamic_quantize) {
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a || a->dtype != NOVA_DTYPE_F32) return a ? ox_err(x, "x must be float") : -1;
  nv_node *mx = ox_op2(x, NV_OP_MAXIMUM, ox_reduce(x, NV_OP_REDUCE_MAX, a, 0, NULL, false), K(x, a, 0));
  nv_node *mn = ox_op2(x, NV_OP_MINIMUM, ox_reduce(x, NV_OP_REDUCE_MIN, a, 0, NULL, false), K(x, a, 0));
  nv_node *sc = ox_op2(x, NV_OP_DIV, ox_op2(x, NV_OP_SUB, mx, mn), K(x, a, 255));
  nv_node *zpf = ox_op2(x, NV_OP_MINIMUM, ox_op2(x, NV_OP_MAXIMUM, ox_op1(x, NV_OP_ROUND, ox_op2(x, NV_OP_SUB, K(x, a, 0),
                                                                                                 ox_op2(x, NV_OP_DIV, mn, sc))),
                                               K(x, a, 0)), K(x, a, 255));
  nv_node *q = ox_op2(x, NV_OP_ADD, ox_op1(x, NV_OP_ROUND, ox_op2(x, NV_OP_DIV, a, sc)), zpf);
  q = ox_op2(x, NV_OP_MINIMUM, ox_op2(x, NV_OP_MAXIMUM, q, K(x, a, 0)), K(x, a, 255));
  nv_node *outs[3] = {to(x, q, NOVA_DTYPE_U8), sc, to(x, zpf, NOVA_DTYPE_U8)};
  for (int i = 0; i < nout && i < 3; i++) {
    if (!outs[i]) return -1;
    out[i] = (ox_val){.node = outs[i], .present = true};
  }
  return 0;
}

const ox_op_entry ox_math_ops[] = {
    {"DequantizeLinear", cv_dequantize}, {"QuantizeLinear", cv_quantize}, {"DynamicQuantizeLinear", cv_dynamic_quantize},
    {"Sin", cv_sin}, {"Cos", cv_cos}, {"Tan", cv_tan}, {"Asin", cv_asin}, {"Acos", cv_acos}, {"Atan", cv_atan},
    {"Sinh", cv_sinh}, {"Cosh", cv_cosh}, {"Asinh", cv_asinh}, {"Acosh", cv_acosh}, {"Atanh", cv_atanh},
    {"Floor", cv_floor}, {"Ceil", cv_ceil}, {"Round", cv_round}, {"Sign", cv_sign}, {"IsNaN", cv_isnan},
    {"IsInf", cv_isinf}, {"BitwiseAnd", cv_bitwise_and}, {"BitwiseOr", cv_bitwise_or}, {"BitwiseXor", cv_bitwise_xor},
    {"BitwiseNot", cv_bitwise_not}, {"BitShift", cv_bit_shift}, {"Not", cv_not}, {"And", cv_and}, {"Or", cv_or}, {"Xor", cv_xor},
    {"LessOrEqual", cv_less_equal}, {"GreaterOrEqual", cv_greater_equal}, {"Mod", cv_mod},
    {"Softplus", cv_softplus}, {"Softsign", cv_softsign}, {"Mish", cv_mish}, {"HardSigmoid", cv_hard_sigmoid},
    {"HardSwish", cv_hard_swish}, {"Elu", cv_elu}, {"Selu", cv_selu}, {"Celu", cv_celu}, {"PRelu", cv_prelu},
    {"ThresholdedRelu", cv_thresholded_relu}, {"Swish", cv_swish}, {"Shrink", cv_shrink}, {"Sum", cv_sum},
    {"Mean", cv_mean}, {"CastLike", cv_cast_like}, {"Size", cv_size}, {"ReduceMin", cv_reduce_min},
    {"ReduceProd", cv_reduce_prod}, {"ReduceL1", cv_reduce_l1}, {"ReduceL2", cv_reduce_l2},
    {"ReduceLogSum", cv_reduce_log_sum}, {"ReduceLogSumExp", cv_reduce_log_sum_exp},
    {"ReduceSumSquare", cv_reduce_sum_square}, {"ArgMax", cv_argmax}, {"ArgMin", cv_argmin}, {"Hardmax", cv_hardmax},
};
const size_t ox_math_nops = sizeof ox_math_ops / sizeof *ox_math_ops;
