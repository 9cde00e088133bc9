/* onnx_dft.c: ONNX DFT (opsets 17 and 20) -> nova nodes.
 *
 * The transform along the signal axis is a matmul with constant cosine and
 * sine matrices of the (known) length: forward, one-sided, inverse and the
 * one-sided inverse (numpy's irfft), real or complex input (last dim 1 or
 * 2).  Gradients come from slice, matmul and concat.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.h"

/* A constant [rows, cols] of f(i, j). */
static nv_node *table(ox_ctx *x, nova_dtype dt, int64_t rows, int64_t cols, double (*f)(int64_t, int64_t, int64_t, int),
                      int64_t L, int mode) {
  ox_tensor *t = ox_tensor_new(dt, 2, (int64_t[]){rows, cols});
  if (!t) return NULL;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) ox_set(t, i * cols + j, f(i, j, L, mode), 0);
  nv_node *n = ox_N(x, (ox_val){.k = t, .present = true});
  ox_tensor_free(t);
  return n;
}

/* mode 0: cos(2 pi n k / L), 1: sin; 2, 3: the same scaled for the inverse
 * (1/L), 4, 5: the one-sided inverse's (weight 2 for the bins counted twice). */
static double coef(int64_t n, int64_t k, int64_t L, int mode) {
  double th = 2 * M_PI * (double)((n * k) % L) / (double)L, w = 1;
  if (mode >= 2) w = 1.0 / (double)L;
  if (mode >= 4 && k != 0 && !(L % 2 == 0 && k == L / 2)) w *= 2;
  return w * (mode % 2 ? sin(th) : cos(th));
}
/* transposed (rows = frequencies in): for the inverses the input index is k */
static double coef_t(int64_t k, int64_t n, int64_t L, int mode) { return coef(n, k, L, mode); }

/* v [..., m at axis, ...] cut or zero-padded to len along axis */
static nv_node *fit(ox_ctx *x, nv_node *v, int axis, int64_t len) {
  int64_t m = v->shape[axis];
  return m > len ? ox_slice1(x, v, axis, 0, len, 1) : ox_zero_pad(x, v, axis, 0, len - m);
}

/* v with axis moved last, [rows, n] @ m [n, k], moved back */
static nv_node *along(ox_ctx *x, nv_node *v, int axis, nv_node *m) {
  if (!v || !m) return NULL;
  int r = v->rank;
  int64_t perm[NOVA_MAX_RANK], inv[NOVA_MAX_RANK], s[NOVA_MAX_RANK];
  for (int i = 0, j = 0; i < r; i++)
    if (i != axis) perm[j++] = i;
  perm[r - 1] = axis;
  for (int i = 0; i < r; i++) inv[perm[i]] = i;
  nv_node *t = axis == r - 1 ? v : ox_transpose(x, v, perm);
  if (!t) return NULL;
  int64_t n = t->shape[r - 1], rows = fe_numel(t) / (n ? n : 1);
  memcpy(s, t->shape, sizeof s);
  s[r - 1] = m->shape[1];
  nv_node *p = ox_reshape(x, ox_op2(x, NV_OP_MATMUL, ox_reshape(x, t, 2, (int64_t[]){rows, n}), m), r, s);
  return p && axis != r - 1 ? ox_transpose(x, p, inv) : p;
}

static int cv_dft(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 3)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  if (!fe_dtype_is_float(a->dtype) || a->dtype == NOVA_DTYPE_F16 || a->dtype == NOVA_DTYPE_BF16)
    return ox_err(x, "input must be float or double");
  int r = a->rank;
  if (r < 2 || (a->shape[r - 1] != 1 && a->shape[r - 1] != 2)) return ox_err(x, "input must be [..., signal, 1 or 2]");
  int64_t axis = x->opset >= 20 ? -2 : ox_attr_i(x, "axis", 1);
  if (x->opset >= 20 && nin > 2 && in[2].present && ox_const_ints(x, in[2], "axis", &axis, 1) != 1) return -1;
  if (ox_norm_axis(x, &axis, r)) return -1;
  if (axis == r - 1) return ox_err(x, "the axis cannot be the last (real/imaginary) one");
  bool inv = ox_attr_i(x, "inverse", 0) != 0, one = ox_attr_i(x, "onesided", 0) != 0;
  int64_t n = a->shape[axis], L;
  if (nin > 1 && in[1].present) {
    if (ox_const_ints(x, in[1], "dft_length", &L, 1) != 1) return -1;
  } else
    L = inv && one ? 2 * (n - 1) : n;
  if (L <= 0 || L > 8192) return ox_err(x, "dft_length %lld is outside [1, 8192]", (long long)L);
  int64_t sq[NOVA_MAX_RANK];
  memcpy(sq, a->shape, sizeof sq);
  nv_node *re = ox_reshape(x, ox_slice1(x, a, r - 1, 0, 1, 1), r - 1, sq);
  nv_node *im = a->shape[r - 1] == 2 ? ox_reshape(x, ox_slice1(x, a, r - 1, 1, 2, 1), r - 1, sq) : NULL;
  nova_dtype dt = a->dtype;
  nv_node *yr, *yi = NULL;
  if (inv && one) { /* the input's L/2 + 1 bins -> L real samples */
    int64_t nb = L / 2 + 1;
    re = fit(x, re, (int)axis, nb), im = im ? fit(x, im, (int)axis, nb) : NULL;
    yr = along(x, re, (int)axis, table(x, dt, nb, L, coef_t, L, 4));
    if (im) yr = ox_op2(x, NV_OP_SUB, yr, along(x, im, (int)axis, table(x, dt, nb, L, coef_t, L, 5)));
  } else {
    int64_t K = !inv && one ? L / 2 + 1 : L;
    int base = inv ? 2 : 0;
    double s = inv ? 1 : -1; /* e^{-i theta} forward, e^{+i theta} inverse */
    re = fit(x, re, (int)axis, L), im = im ? fit(x, im, (int)axis, L) : NULL;
    nv_node *C = table(x, dt, L, K, coef, L, base), *S = table(x, dt, L, K, coef, L, base + 1);
    /* (re + i im)(cos + i s sin) */
    yr = along(x, re, (int)axis, C);
    yi = ox_op2(x, NV_OP_MUL, along(x, re, (int)axis, S), ox_scalar(x, dt, s));
    if (im) {
      yr = ox_op2(x, NV_OP_SUB, yr, ox_op2(x, NV_OP_MUL, along(x, im, (int)axis, S), ox_scalar(x, dt, s)));
      yi = ox_op2(x, NV_OP_ADD, yi, along(x, im, (int)axis, C));
    }
  }
  if (!yr) return -1;
  int64_t os[NOVA_MAX_RANK];
  memcpy(os, yr->shape, sizeof os);
  os[r - 1] = 1;
  nv_node *y = ox_reshape(x, yr, r, os), at = {.axis = r - 1};
  if (yi) y = ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){y, ox_reshape(x, yi, r, os)}, &at);
  return ox_set_out(out, y);
}

const ox_op_entry ox_dft_ops[] = {{"DFT", cv_dft}};
const size_t ox_dft_nops = 1;
