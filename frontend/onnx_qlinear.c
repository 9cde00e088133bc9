/* onnx_qlinear.c: ONNX integer and quantized products -> nova nodes.
 *
 *   MatMulInteger, ConvInteger:  (a - a_zero_point) @ (b - b_zero_point), or
 *     the convolution, in int32;
 *   QLinearMatMul, QLinearConv:  the same product (plus the int32 bias B of
 *     QLinearConv), then
 *       y = saturate(round_half_even(acc * (a_scale * b_scale / y_scale) + y_zero_point))
 *     in y_zero_point's type (int8 or uint8; a's or x's without one).
 *
 * As the onnx reference computes them: the integer product is exact (here
 * in float64: every product sum of 8- and 16-bit integers is an integer
 * below 2^53; the reference's int32 sums wrap only past 2^31, beyond what
 * the ONNX spec allows), the scale factor is computed in the scales' type
 * (float32, float16 or bfloat16, each operation rounded to it, as numpy
 * does), the product with it and the addition of the zero point in
 * float64 (numpy's type for int32 times float32), then rounded to even and
 * saturated.
 *
 * Scales and zero points: one value, per tensor; or a vector, one value per
 * row of a (and of y) or per column of b (QLinearMatMul, MatMulInteger), per
 * filter of w (QLinearConv, ConvInteger); or, for the matrix products, an
 * N-D tensor broadcast as numpy does ([.., M, 1] per row, [.., 1, N] per
 * column).
 *
 * Not differentiable: every result is an integer tensor, so no gradient
 * flows through them (autodiff stops at integer values), and under --train
 * a scale that only they use has no differentiable path to the loss: a
 * constant (onnx_roles.c).
 */
#include "onnx.h"

#define CV(name) static int name(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout)

static nv_node *to(ox_ctx *x, nv_node *a, nova_dtype dt) {
  if (!a || a->dtype == dt) return a;
  nv_node at = {.to = dt};
  return ox_add(x, NV_OP_CAST, 1, &a, &at);
}

/* in[i], or NULL when omitted ("" or past the end). */
static nv_node *opt(ox_ctx *x, ox_val *in, int nin, int i) { return i < nin && in[i].present ? ox_N(x, in[i]) : NULL; }

/* Where a scale or zero point's values lie: along axis AX of the tensor
 * they are for (AX < 0: one value only), one per PER; with ND (the matrix
 * products) also an N-D tensor, broadcast as numpy does. */
typedef struct qpos {
  int ax;
  bool nd;
  const char *what, *per;
} qpos;

/* V for the tensor OF: one value as a rank-0 node; a vector of n values as
 * OF's rank with n at axis p.ax, where OF must be n long; with p.nd, rank
 * >= 2 as it is. */
static nv_node *placed(ox_ctx *x, nv_node *v, const nv_node *of, qpos p) {
  if (!v || !of) return NULL;
  if (fe_numel(v) == 1 && (v->rank <= 1 || p.ax < 0 || !p.nd)) return ox_reshape(x, v, 0, NULL);
  if (v->rank >= 2 && p.ax >= 0 && p.nd) return v;
  if (p.ax < 0) {
    ox_err(x, "%s must be a single value, got %lld", p.what, (long long)fe_numel(v));
    return NULL;
  }
  if (v->rank != 1 || v->shape[0] != of->shape[p.ax]) {
    char buf[64];
    ox_err(x, "%s must be a single value or a vector of %lld (one per %s), got shape %s", p.what,
           (long long)of->shape[p.ax], p.per, fe_shape_str(buf, sizeof buf, v->rank, v->shape));
    return NULL;
  }
  int64_t s[NOVA_MAX_RANK];
  for (int k = 0; k < of->rank; k++) s[k] = k == p.ax ? v->shape[0] : 1;
  return ox_reshape(x, v, of->rank, s);
}

/* v - z (z NULL: 0) in float64, z placed by p along v. */
static nv_node *int_operand(ox_ctx *x, nv_node *v, nv_node *z, qpos p) {
  if (!v) return NULL;
  if (!fe_dtype_is_int(v->dtype) || fe_dtype_size(v->dtype) > 2) {
    ox_err(x, "the operands must be 8- or 16-bit integer tensors, got %s", fe_dtype_name(v->dtype));
    return NULL;
  }
  if (z && z->dtype != v->dtype) {
    ox_err(x, "%s must have its operand's type %s, got %s", p.what, fe_dtype_name(v->dtype), fe_dtype_name(z->dtype));
    return NULL;
  }
  nv_node *f = to(x, v, NOVA_DTYPE_F64);
  return z ? ox_op2(x, NV_OP_SUB, f, to(x, placed(x, z, v, p), NOVA_DTYPE_F64)) : f;
}

static int rows(const nv_node *v) { return v && v->rank >= 2 ? v->rank - 2 : -1; }
static int cols(const nv_node *v) { return v && v->rank >= 2 ? v->rank - 1 : -1; }

/* The type numpy computes a product of a and b in. */
static nova_dtype wider(nova_dtype a, nova_dtype b) {
  if (a == b) return a;
  return a == NOVA_DTYPE_F64 || b == NOVA_DTYPE_F64 ? NOVA_DTYPE_F64 : NOVA_DTYPE_F32;
}

/* s[0] * s[1] / s[2] (named names[0..2]) in the scales' type, each
 * operation rounded to it, then as float64. */
static nv_node *multiplier(ox_ctx *x, nv_node *s[3], const char *const names[3]) {
  nova_dtype dt = 0;
  for (int i = 0; i < 3; i++) {
    if (!s[i]) return NULL;
    if (!fe_dtype_is_float(s[i]->dtype)) {
      ox_err(x, "%s must be floating-point, got %s", names[i], fe_dtype_name(s[i]->dtype));
      return NULL;
    }
    dt = i ? wider(dt, s[i]->dtype) : s[i]->dtype;
  }
  nv_node *m = ox_op2(x, NV_OP_DIV, ox_op2(x, NV_OP_MUL, to(x, s[0], dt), to(x, s[1], dt)), to(x, s[2], dt));
  return to(x, m, NOVA_DTYPE_F64);
}

/* saturate(round_half_even(acc * m + zp)) as dt (int8 or uint8; zp NULL:
 * 0): the product and the sum each rounded in float64. */
static nv_node *requantize(ox_ctx *x, nv_node *acc, nv_node *m, nv_node *zp, nova_dtype dt) {
  if (dt != NOVA_DTYPE_I8 && dt != NOVA_DTYPE_U8) {
    ox_err(x, "the result must be int8 or uint8, got %s", fe_dtype_name(dt));
    return NULL;
  }
  nv_node *d = ox_op2(x, NV_OP_MUL, acc, m);
  if (zp) d = ox_op2(x, NV_OP_ADD, d, to(x, zp, NOVA_DTYPE_F64));
  double lo = dt == NOVA_DTYPE_I8 ? -128 : 0, hi = dt == NOVA_DTYPE_I8 ? 127 : 255;
  d = ox_op2(x, NV_OP_MAXIMUM, ox_op1(x, NV_OP_ROUND, d), ox_scalar(x, NOVA_DTYPE_F64, lo));
  return to(x, ox_op2(x, NV_OP_MINIMUM, d, ox_scalar(x, NOVA_DTYPE_F64, hi)), dt);
}

/* QLinearMatMul and QLinearConv: inputs 0 to 6 but the zero points 2 and
 * 5 are required. */
static int need_q(ox_ctx *x, ox_val *in, int nin, int max) {
  if (ox_need(x, in, nin, 2, max)) return -1;
  if (nin < 7) return ox_err(x, "takes 7 to %d inputs, got %d", max, nin);
  for (int i = 0; i < 7; i++)
    if (!in[i].present && i != 2 && i != 5) return ox_err(x, "input %d is required", i);
  return 0;
}

static int to_int32(ox_ctx *x, nv_node *y, ox_val *out) { return ox_set_out(out, to(x, y, NOVA_DTYPE_I32)); }

/* ---- matrix products ---------------------------------------------------- */

/* MatMulInteger: (A - a_zero_point) @ (B - b_zero_point) in int32. */
CV(cv_matmul_integer) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 4)) return -1;
  nv_node *a = ox_N(x, in[0]), *b = ox_N(x, in[1]);
  nv_node *fa = int_operand(x, a, opt(x, in, nin, 2), (qpos){rows(a), true, "a_zero_point", "row of A"});
  nv_node *fb = int_operand(x, b, opt(x, in, nin, 3), (qpos){cols(b), true, "b_zero_point", "column of B"});
  return to_int32(x, fa && fb ? ox_matmul(x, fa, fb) : NULL, out);
}

/* QLinearMatMul (opsets 10, 21): a's scale and zero point per row, b's per
 * column, y's per row of y. */
CV(cv_qlinear_matmul) {
  (void)nout;
  if (need_q(x, in, nin, 8)) return -1;
  nv_node *a = ox_N(x, in[0]), *b = ox_N(x, in[3]);
  nv_node *fa = int_operand(x, a, opt(x, in, nin, 2), (qpos){rows(a), true, "a_zero_point", "row of a"});
  nv_node *fb = int_operand(x, b, opt(x, in, nin, 5), (qpos){cols(b), true, "b_zero_point", "column of b"});
  nv_node *acc = fa && fb ? ox_matmul(x, fa, fb) : NULL;
  if (!acc) return -1;
  int r = acc->rank, arow = a->rank < 2 ? -1 : b->rank < 2 ? r - 1 : r - 2; /* a's rows in y */
  nv_node *s[3] = {placed(x, ox_N(x, in[1]), acc, (qpos){arow, true, "a_scale", "row of a"}),
                   placed(x, ox_N(x, in[4]), acc, (qpos){b->rank < 2 ? -1 : r - 1, true, "b_scale", "column of b"}),
                   placed(x, ox_N(x, in[6]), acc, (qpos){rows(acc), true, "y_scale", "row of y"})};
  nv_node *zy = opt(x, in, nin, 7);
  nova_dtype dt = zy ? zy->dtype : a->dtype;
  if (zy && !(zy = placed(x, zy, acc, (qpos){rows(acc), true, "y_zero_point", "row of y"}))) return -1;
  static const char *const names[3] = {"a_scale", "b_scale", "y_scale"};
  return ox_set_out(out, requantize(x, acc, multiplier(x, s, names), zy, dt));
}

/* ---- convolutions ---------------------------------------------------------- */

/* The convolution (Conv's attributes) of fx and fw (float64), plus the
 * int32 bias (or NULL), exact. */
static nv_node *conv_f64(ox_ctx *x, nv_node *fx, nv_node *fw, nv_node *bias, int nout) {
  if (!fx || !fw) return NULL;
  ox_val fin[3] = {{.node = fx, .present = true}, {.node = fw, .present = true}}, fo[1] = {{0}};
  if (bias) fin[2] = (ox_val){.node = to(x, bias, NOVA_DTYPE_F64), .present = true};
  if (bias && !fin[2].node) return NULL;
  return ox_conv(x, fin, bias ? 3 : 2, fo, nout) ? NULL : fo[0].node;
}

/* ConvInteger: the convolution of (x - x_zero_point), padded with 0 (the
 * zero point itself), and (w - w_zero_point, per filter), in int32. */
CV(cv_conv_integer) {
  if (ox_need(x, in, nin, 2, 4)) return -1;
  nv_node *a = ox_N(x, in[0]), *w = ox_N(x, in[1]);
  nv_node *fa = int_operand(x, a, opt(x, in, nin, 2), (qpos){-1, false, "x_zero_point", NULL});
  nv_node *fw = int_operand(x, w, opt(x, in, nin, 3), (qpos){0, false, "w_zero_point", "filter"});
  return to_int32(x, conv_f64(x, fa, fw, NULL, nout), out);
}

/* QLinearConv: w's scale and zero point per filter (output channel), the
 * others single values; the bias B (int32, one per filter) added to the
 * integer result. */
CV(cv_qlinear_conv) {
  if (need_q(x, in, nin, 9)) return -1;
  nv_node *a = ox_N(x, in[0]), *w = ox_N(x, in[3]), *bias = opt(x, in, nin, 8);
  if (bias && bias->dtype != NOVA_DTYPE_I32) return ox_err(x, "B must be int32, got %s", fe_dtype_name(bias->dtype));
  nv_node *fa = int_operand(x, a, opt(x, in, nin, 2), (qpos){-1, false, "x_zero_point", NULL});
  nv_node *fw = int_operand(x, w, opt(x, in, nin, 5), (qpos){0, false, "w_zero_point", "filter"});
  nv_node *acc = conv_f64(x, fa, fw, bias, nout);
  if (!acc) return -1;
  nv_node *s[3] = {placed(x, ox_N(x, in[1]), acc, (qpos){-1, false, "x_scale", NULL}),
                   placed(x, ox_N(x, in[4]), acc, (qpos){1, false, "w_scale", "filter"}),
                   placed(x, ox_N(x, in[6]), acc, (qpos){-1, false, "y_scale", NULL})};
  nv_node *zy = opt(x, in, nin, 7);
  nova_dtype dt = zy ? zy->dtype : a->dtype;
  if (zy && !(zy = placed(x, zy, acc, (qpos){-1, false, "y_zero_point", NULL}))) return -1;
  static const char *const names[3] = {"x_scale", "w_scale", "y_scale"};
  return ox_set_out(out, requantize(x, acc, multiplier(x, s, names), zy, dt));
}

const ox_op_entry ox_qlinear_ops[] = {
    {"MatMulInteger", cv_matmul_integer}, {"ConvInteger", cv_conv_integer},
    {"QLinearMatMul", cv_qlinear_matmul}, {"QLinearConv", cv_qlinear_conv},
};
const size_t ox_qlinear_nops = sizeof ox_qlinear_ops / sizeof *ox_qlinear_ops;
