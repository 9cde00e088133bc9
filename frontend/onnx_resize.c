/* onnx_resize.c: ONNX Resize (opsets 10 to 19) and Upsample -> nova nodes.
 *
 * Resizing is separable: each resized axis is an interpolation matrix M
 * [out, in] applied along it, computed here from the scales or sizes (known
 * when compiling) with the reference's coordinate transformations, kernels
 * (nearest with its four rounding modes, linear, cubic, their antialiased
 * forms), exclude_outside and tf_crop_and_resize's extrapolation.  A nearest
 * axis is a gather of the chosen indices (any dtype, exact); the others are
 * a matmul with M (float), so gradients come from gather and matmul.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "onnx.h"

typedef struct rz {
  char mode[16], ctm[32], nearest[32];
  double cubic_a, extrapolation;
  bool exclude_outside, antialias;
} rz;

/* The kernel's coefficients at ratio in (0, 1] (at most 64). */
static int coeffs(const rz *R, double ratio, double scale, double *c) {
  if (!strcmp(R->mode, "nearest")) {
    bool whole = ratio == floor(ratio);
    bool second = whole || !strcmp(R->nearest, "ceil") ? true : !strcmp(R->nearest, "floor") ? false
                : !strcmp(R->nearest, "round_prefer_ceil") ? ratio >= 0.5 : ratio > 0.5;
    c[0] = !second, c[1] = second;
    return 2;
  }
  double A = R->cubic_a;
  if (!strcmp(R->mode, "linear") && !R->antialias) {
    c[0] = 1 - ratio, c[1] = ratio;
    return 2;
  }
  if (!strcmp(R->mode, "cubic") && !R->antialias) {
    double r1 = ratio + 1, q = 1 - ratio, q1 = q + 1;
    c[0] = ((A * r1 - 5 * A) * r1 + 8 * A) * r1 - 4 * A;
    c[1] = ((A + 2) * ratio - (A + 3)) * ratio * ratio + 1;
    c[2] = ((A + 2) * q - (A + 3)) * q * q + 1;
    c[3] = ((A * q1 - 5 * A) * q1 + 8 * A) * q1 - 4 * A;
    return 4;
  }
  double s = scale < 1 ? scale : 1, sum = 0; /* antialiased: the kernel stretched by 1/scale */
  bool lin = !strcmp(R->mode, "linear");
  int start = (int)floor((lin ? -1 : -2) / s) + 1, n = 2 - 2 * start;
  if (n > 64 || n < 1) return -1;
  for (int i = 0; i < n; i++) {
    double t = fabs(s * (start + i - ratio));
    double w = lin ? (t < 1 ? 1 - t : 0)
                   : t <= 1 ? (A + 2) * t * t * t - (A + 3) * t * t + 1 : t < 2 ? A * t * t * t - 5 * A * t * t + 8 * A * t - 4 * A : 0;
    c[i] = w, sum += w;
  }
  for (int i = 0; i < n; i++) c[i] /= sum;
  return n;
}

/* Fills M [out, in] (row-major) and extrap[out]; 0, or -1 if the kernel is too wide. */
static int axis_matrix(const rz *R, int64_t in, int64_t out, double scale, const double *roi, double *M, bool *extrap) {
  double ow = scale * (double)in;
  for (int64_t y = 0; y < out; y++) {
    double xo, yd = (double)y;
    extrap[y] = false;
    if (!strcmp(R->ctm, "align_corners")) xo = ow == 1 ? 0 : yd * (double)(in - 1) / (ow - 1);
    else if (!strcmp(R->ctm, "asymmetric")) xo = yd / scale;
    else if (!strcmp(R->ctm, "tf_crop_and_resize")) {
      xo = (ow == 1 ? (roi[1] - roi[0]) * (double)(in - 1) / 2 : yd * (roi[1] - roi[0]) * (double)(in - 1) / (ow - 1)) +
           roi[0] * (double)(in - 1);
      extrap[y] = xo < 0 || xo > (double)(in - 1);
    } else if (!strcmp(R->ctm, "pytorch_half_pixel")) xo = ow == 1 ? -0.5 : (yd + 0.5) / scale - 0.5;
    else if (!strcmp(R->ctm, "half_pixel_symmetric")) {
      double adj = (double)out / ow, center = (double)in / 2;
      xo = center * (1 - adj) + (yd + 0.5) / scale - 0.5;
    } else xo = (yd + 0.5) / scale - 0.5; /* half_pixel */
    double fl = floor(xo), ratio = xo == fl ? 1 : xo - fl, c[64];
    int n = coeffs(R, ratio, scale, c);
    if (n < 0) return -1;
    int pad = (n + 1) / 2;
    double xp = xo + pad, pp = floor(xp), frac = xp - pp;
    int64_t off = n % 2 == 0 ? (frac == 0 ? -(n / 2) : -(n / 2) + 1) : (frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1);
    int64_t start = (int64_t)pp + off - pad;
    if (R->exclude_outside) {
      double sum = 0;
      for (int k = 0; k < n; k++) {
        if (start + k < 0 || start + k >= in) c[k] = 0;
        sum += c[k];
      }
      for (int k = 0; k < n; k++) c[k] /= sum == 0 ? 1 : sum;
    }
    double *row = M + y * in;
    memset(row, 0, (size_t)in * sizeof *row);
    for (int k = 0; k < n; k++) {
      int64_t i = start + k < 0 ? 0 : start + k >= in ? in - 1 : start + k;
      row[i] += c[k];
    }
  }
  return 0;
}

/* a resized along axis with M (out x in): a gather when every row is one-hot. */
static nv_node *apply_axis(ox_ctx *x, nv_node *a, int axis, int64_t out, const double *M, const bool *extrap, double ev) {
  int64_t in = a->shape[axis], r = a->rank;
  bool onehot = true;
  int64_t *pick = nv_xmalloc((size_t)(out ? out : 1) * sizeof *pick);
  if (!pick) return NULL;
  for (int64_t y = 0; y < out && onehot; y++) {
    int ones = 0;
    for (int64_t i = 0; i < in; i++)
      if (M[y * in + i] == 1) ones++, pick[y] = i;
      else if (M[y * in + i] != 0) onehot = false;
    onehot &= ones == 1;
  }
  nv_node *res;
  if (onehot)
    res = ox_pick(x, a, axis, pick, out);
  else if (!fe_dtype_is_float(a->dtype)) {
    ox_err(x, "linear and cubic resizing of %s is not supported (float and double only)", fe_dtype_name(a->dtype));
    res = NULL;
  } else { /* move the axis last, [rows, in] @ M^T, back */
    int64_t perm[NOVA_MAX_RANK], inv[NOVA_MAX_RANK], ms[2] = {in, out};
    for (int i = 0, k = 0; i < r; i++)
      if (i != axis) perm[k++] = i;
    perm[r - 1] = axis;
    for (int i = 0; i < r; i++) inv[perm[i]] = i;
    nv_node *t = axis == r - 1 ? a : ox_transpose(x, a, perm);
    ox_tensor *mt = ox_tensor_new(a->dtype, 2, ms);
    for (int64_t i = 0; mt && i < in; i++)
      for (int64_t y = 0; y < out; y++) ox_set(mt, i * out + y, M[y * in + i], 0);
    nv_node *mn = mt ? ox_N(x, (ox_val){.k = mt, .present = true}) : NULL;
    ox_tensor_free(mt);
    res = NULL;
    if (t && mn) {
      int64_t rows = fe_numel(t) / (in ? in : 1), s[NOVA_MAX_RANK];
      memcpy(s, t->shape, sizeof s);
      s[r - 1] = out;
      nv_node *p = ox_op2(x, NV_OP_MATMUL, ox_reshape(x, t, 2, (int64_t[]){rows, in}), mn);
      res = ox_reshape(x, p, (int)r, s);
      if (res && axis != r - 1) res = ox_transpose(x, res, inv);
    }
  }
  free(pick);
  bool any = false;
  for (int64_t y = 0; y < out; y++) any |= extrap[y];
  if (res && any) { /* tf_crop_and_resize: positions outside the input take the extrapolation value */
    int64_t s[NOVA_MAX_RANK];
    for (int i = 0; i < r; i++) s[i] = i == axis ? out : 1;
    ox_tensor *m = ox_tensor_new(NOVA_DTYPE_BOOL, (int)r, s);
    for (int64_t y = 0; m && y < out; y++) ox_set(m, y, extrap[y], extrap[y]);
    nv_node *mn = m ? ox_N(x, (ox_val){.k = m, .present = true}) : NULL;
    ox_tensor_free(m);
    res = mn ? ox_op3(x, NV_OP_WHERE, mn, ox_scalar(x, res->dtype, ev), res) : NULL;
  }
  return res;
}

/* Known float values of an optional input (roi, scales): the count, or -1. */
static int known_floats(ox_ctx *x, ox_val *in, int nin, int i, const char *what, double *out, int max) {
  if (nin <= i || !in[i].present) return 0;
  ox_tensor *own = in[i].k ? NULL : ox_initial_value(in[i]); /* a float initializer: its value */
  const ox_tensor *t = in[i].k ? in[i].k : own;
  if (!t) return ox_err(x, "%s must be known when compiling", what);
  int64_t n = ox_numel(t);
  for (int64_t k = 0; k < n && k < max; k++) out[k] = ox_getf(t, k);
  ox_tensor_free(own);
  if (n > max) return ox_err(x, "%s has %lld entries, more than %d", what, (long long)n, max);
  return (int)n;
}

static int resize(ox_ctx *x, nv_node *a, rz *R, const double *scales_in, int nsc, const int64_t *sizes_in, int nsz,
                  const double *roi_in, int nroi, const int64_t *axes_in, int naxes, const char *policy, ox_val *out) {
  int r = a->rank;
  int64_t axes[NOVA_MAX_RANK], osz[NOVA_MAX_RANK];
  double sc[NOVA_MAX_RANK], roi[2 * NOVA_MAX_RANK];
  if (naxes == 0) {
    naxes = r;
    for (int i = 0; i < r; i++) axes[i] = i;
  } else
    for (int i = 0; i < naxes; i++) {
      axes[i] = axes_in[i];
      if (ox_norm_axis(x, &axes[i], r)) return -1;
    }
  int n = nsz ? nsz : nsc;
  if (n != naxes) return ox_err(x, "%s has %d entries for %d axes", nsz ? "sizes" : "scales", n, naxes);
  if (nroi && nroi != 2 * naxes) return ox_err(x, "roi has %d entries; expected %d", nroi, 2 * naxes);
  for (int i = 0; i < r; i++) sc[i] = 1, osz[i] = a->shape[i], roi[i] = 0, roi[r + i] = 1;
  for (int i = 0; i < naxes; i++) {
    int d = (int)axes[i];
    if (nroi) roi[d] = roi_in[i], roi[r + d] = roi_in[naxes + i];
    if (nsz) {
      if (sizes_in[i] < 0) return ox_err(x, "sizes must be >= 0");
      osz[d] = sizes_in[i], sc[d] = a->shape[d] ? (double)sizes_in[i] / (double)a->shape[d] : 1;
    } else {
      if (!(scales_in[i] > 0)) return ox_err(x, "scales must be positive");
      sc[d] = scales_in[i], osz[d] = (int64_t)(scales_in[i] * (double)a->shape[d]);
    }
  }
  if (nsz && strcmp(policy, "stretch")) {
    if (strcmp(policy, "not_larger") && strcmp(policy, "not_smaller"))
      return ox_err(x, "keep_aspect_ratio_policy '%s'; expected stretch, not_larger or not_smaller", policy);
    double s = sc[axes[0]];
    for (int i = 1; i < naxes; i++) s = !strcmp(policy, "not_larger") ? fmin(s, sc[axes[i]]) : fmax(s, sc[axes[i]]);
    for (int i = 0; i < naxes; i++) sc[axes[i]] = s, osz[axes[i]] = (int64_t)(s * (double)a->shape[axes[i]] + 0.5);
  }
  for (int i = 0; i < naxes && a; i++) {
    int d = (int)axes[i];
    int64_t in = a->shape[d];
    if (fabs(sc[d] - 1) < 1e-9 && osz[d] == in && roi[d] == 0 && roi[r + d] == 1) continue;
    if (in == 0 || osz[d] > (INT64_C(1) << 16) || in > (INT64_C(1) << 16))
      return ox_err(x, "resizing axis %d from %lld to %lld is not supported (1 to 65536 elements)", d, (long long)in, (long long)osz[d]);
    double *M = nv_xmalloc((size_t)(osz[d] * in + 1) * sizeof *M), rr[2] = {roi[d], roi[r + d]};
    bool *ex = nv_xmalloc((size_t)osz[d] + 1);
    if (!M || !ex || axis_matrix(R, in, osz[d], sc[d], rr, M, ex) < 0) {
      free(M), free(ex);
      return M && ex ? ox_err(x, "the antialiasing kernel is too wide for this downscale") : -1;
    }
    a = apply_axis(x, a, d, osz[d], M, ex, R->extrapolation);
    free(M), free(ex);
  }
  return ox_set_out(out, a);
}

static int read_rz(ox_ctx *x, rz *R, bool v10) {
  memset(R, 0, sizeof *R);
  char b[3][32];
  snprintf(R->mode, sizeof R->mode, "%s", ox_attr_s(x, "mode", "nearest", b[0], sizeof b[0]));
  snprintf(R->ctm, sizeof R->ctm, "%s",
           ox_attr_s(x, "coordinate_transformation_mode", v10 ? "asymmetric" : "half_pixel", b[1], sizeof b[1]));
  snprintf(R->nearest, sizeof R->nearest, "%s", ox_attr_s(x, "nearest_mode", v10 ? "floor" : "round_prefer_floor", b[2], sizeof b[2]));
  R->cubic_a = ox_attr_f(x, "cubic_coeff_a", -0.75);
  R->extrapolation = ox_attr_f(x, "extrapolation_value", 0);
  R->exclude_outside = ox_attr_i(x, "exclude_outside", 0) != 0;
  R->antialias = ox_attr_i(x, "antialias", 0) != 0;
  if (!strcmp(R->mode, "bilinear") || !strcmp(R->mode, "trilinear")) strcpy(R->mode, "linear"); /* Upsample-7 */
  if (strcmp(R->mode, "nearest") && strcmp(R->mode, "linear") && strcmp(R->mode, "cubic"))
    return ox_err(x, "mode '%s'; expected nearest, linear or cubic", R->mode);
  if (!strcmp(R->mode, "nearest") && R->antialias) return ox_err(x, "antialias applies to linear and cubic modes only");
  static const char *const ctms[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                     "asymmetric", "tf_crop_and_resize"};
  bool ok = false;
  for (size_t i = 0; i < sizeof ctms / sizeof *ctms; i++) ok |= !strcmp(R->ctm, ctms[i]);
  if (!ok) return ox_err(x, "coordinate_transformation_mode '%s' is not one ONNX defines", R->ctm);
  if (strcmp(R->nearest, "round_prefer_floor") && strcmp(R->nearest, "round_prefer_ceil") && strcmp(R->nearest, "floor") &&
      strcmp(R->nearest, "ceil"))
    return ox_err(x, "nearest_mode '%s' is not one ONNX defines", R->nearest);
  return 0;
}

static int cv_resize(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  bool v10 = x->opset < 11;
  if (ox_need(x, in, nin, v10 ? 2 : 1, v10 ? 2 : 4)) return -1;
  nv_node *a = ox_N(x, in[0]);
  rz R;
  if (!a || read_rz(x, &R, v10)) return -1;
  double roi[2 * NOVA_MAX_RANK], sc[NOVA_MAX_RANK];
  int64_t sz[NOVA_MAX_RANK], axes[NOVA_MAX_RANK];
  int nroi = v10 ? 0 : known_floats(x, in, nin, 1, "roi", roi, 2 * NOVA_MAX_RANK);
  int nsc = known_floats(x, in, nin, v10 ? 1 : 2, "scales", sc, NOVA_MAX_RANK);
  int nsz = nin > 3 && in[3].present ? ox_const_ints(x, in[3], "sizes", sz, NOVA_MAX_RANK) : 0;
  if (nroi < 0 || nsc < 0 || nsz < 0) return -1;
  if (!nsc == !nsz) return ox_err(x, "exactly one of scales and sizes must be given");
  int naxes = ox_attr(x, "axes") ? ox_attr_ints(x, "axes", axes, NOVA_MAX_RANK) : 0;
  if (!strcmp(R.ctm, "tf_crop_and_resize") && !nroi) return ox_err(x, "tf_crop_and_resize needs roi");
  if (strcmp(R.ctm, "tf_crop_and_resize")) nroi = 0;
  char pol[16];
  return resize(x, a, &R, sc, nsc, sz, nsz, roi, nroi, axes, naxes,
                ox_attr_s(x, "keep_aspect_ratio_policy", "stretch", pol, sizeof pol), out);
}

static int cv_upsample(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  bool attr = x->opset < 9; /* scales: an attribute until opset 9 */
  if (ox_need(x, in, nin, attr ? 1 : 2, attr ? 1 : 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  rz R;
  if (!a || read_rz(x, &R, true)) return -1;
  if (!strcmp(R.mode, "cubic")) return ox_err(x, "Upsample takes nearest or linear");
  double sc[NOVA_MAX_RANK];
  int nsc;
  if (attr) {
    const Onnx__AttributeProto *at = ox_attr(x, "scales");
    if (!at || at->n_floats > NOVA_MAX_RANK) return ox_err(x, "the scales attribute is required");
    nsc = (int)at->n_floats;
    for (int i = 0; i < nsc; i++) sc[i] = at->floats[i];
  } else if ((nsc = known_floats(x, in, nin, 1, "scales", sc, NOVA_MAX_RANK)) < 0)
    return -1;
  return resize(x, a, &R, sc, nsc, NULL, 0, NULL, 0, NULL, 0, "stretch", out);
}

/* ---- GridSample ---------------------------------------------------------- */

static nv_node *F(ox_ctx *x, const nv_node *like, double v) { return ox_scalar(x, like->dtype, v); }
static nv_node *sel(ox_ctx *x, nv_node *c, nv_node *a, nv_node *b) { return ox_op3(x, NV_OP_WHERE, c, a, b); }

/* The reference's reflection of v into [lo, hi] (by the near border, until inside). */
static nv_node *reflect(ox_ctx *x, nv_node *v, double lo, double hi) {
  double rng = hi - lo;
  nv_node *below = ox_op2(x, NV_OP_LESS, v, F(x, v, lo)), *above = ox_op2(x, NV_OP_GREATER, v, F(x, v, hi));
  nv_node *dx = sel(x, below, ox_op2(x, NV_OP_SUB, F(x, v, lo), v), ox_op2(x, NV_OP_SUB, v, F(x, v, hi)));
  nv_node *k = ox_op1(x, NV_OP_FLOOR, ox_op2(x, NV_OP_DIV, dx, F(x, v, rng)));
  nv_node *r = ox_op2(x, NV_OP_SUB, dx, ox_op2(x, NV_OP_MUL, k, F(x, v, rng)));
  nv_node *even = ox_op2(x, NV_OP_EQUAL, ox_op2(x, NV_OP_MOD, k, F(x, v, 2)), F(x, v, 0));
  nv_node *lo_r = ox_op2(x, NV_OP_ADD, F(x, v, lo), r), *hi_r = ox_op2(x, NV_OP_SUB, F(x, v, hi), r);
  nv_node *b = sel(x, even, lo_r, hi_r), *a = sel(x, even, hi_r, lo_r);
  return sel(x, below, b, sel(x, above, a, v));
}

typedef struct tap {
  nv_node *idx;    /* int64 position along the dim (clamped into it) */
  nv_node *w;      /* weight (zero for a zeros-padding tap outside) */
} tap;

/* The taps of one spatial dim of size S at the (denormalised) coordinate v. */
static int dim_taps(ox_ctx *x, nv_node *v, int64_t S, const char *mode, const char *pad, bool ac, tap *t) {
  double lo = ac ? 0 : -0.5, hi = ac ? (double)S - 1 : (double)S - 0.5;
  bool zeros = !strcmp(pad, "zeros"), border = !strcmp(pad, "border");
  if (!strcmp(mode, "nearest")) v = ox_op1(x, NV_OP_ROUND, v);
  if (!zeros) { /* coordinates outside the borders are moved in first */
    nv_node *out = ox_op2(x, NV_OP_OR, ox_op2(x, NV_OP_LESS, v, F(x, v, lo)), ox_op2(x, NV_OP_GREATER, v, F(x, v, hi)));
    nv_node *in = border ? ox_op2(x, NV_OP_MINIMUM, ox_op2(x, NV_OP_MAXIMUM, v, F(x, v, 0)), F(x, v, (double)S - 1))
                         : reflect(x, v, lo, hi);
    v = sel(x, out, in, v);
  }
  int n = !strcmp(mode, "nearest") ? 1 : !strcmp(mode, "linear") ? 2 : 4;
  nv_node *x0 = n == 1 ? v : ox_op1(x, NV_OP_FLOOR, v), *f = ox_op2(x, NV_OP_SUB, v, x0), *c[4];
  if (!x0 || !f) return -1;
  if (n == 1) c[0] = ox_op2(x, NV_OP_ADD, f, F(x, v, 1)); /* ones shaped like v */
  else if (n == 2) c[0] = ox_op2(x, NV_OP_SUB, F(x, v, 1), f), c[1] = f;
  else { /* Keys' cubic, A = -0.75, at distances 1 + f, f, 1 - f, 2 - f */
    double A = -0.75;
    for (int k = 0; k < 4; k++) {
      nv_node *d = ox_op1(x, NV_OP_ABS, ox_op2(x, NV_OP_SUB, f, F(x, v, k - 1)));
      nv_node *d2 = ox_op2(x, NV_OP_MUL, d, d), *d3 = ox_op2(x, NV_OP_MUL, d2, d);
      nv_node *near = ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_SUB, ox_op2(x, NV_OP_MUL, d3, F(x, v, A + 2)),
                                                  ox_op2(x, NV_OP_MUL, d2, F(x, v, A + 3))), F(x, v, 1));
      nv_node *far = ox_op2(x, NV_OP_SUB, ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_SUB, ox_op2(x, NV_OP_MUL, d3, F(x, v, A)),
                                                                   ox_op2(x, NV_OP_MUL, d2, F(x, v, 5 * A))),
                                                 ox_op2(x, NV_OP_MUL, d, F(x, v, 8 * A))), F(x, v, 4 * A));
      c[k] = sel(x, ox_op2(x, NV_OP_LESS_EQUAL, d, F(x, v, 1)), near, far);
    }
  }
  nv_node i64 = {.to = NOVA_DTYPE_I64};
  for (int k = 0; k < n; k++) {
    nv_node *pos = n == 4 ? ox_op2(x, NV_OP_ADD, x0, F(x, v, k - 1)) : n == 2 ? ox_op2(x, NV_OP_ADD, x0, F(x, v, k)) : x0;
    nv_node *w = c[k];
    if (zeros) { /* outside: weight 0 */
      nv_node *ok = ox_op2(x, NV_OP_AND, ox_op2(x, NV_OP_GREATER_EQUAL, pos, F(x, v, 0)), ox_op2(x, NV_OP_LESS, pos, F(x, v, (double)S)));
      w = sel(x, ok, w, F(x, v, 0));
    } else if (border)
      pos = ox_op2(x, NV_OP_MINIMUM, ox_op2(x, NV_OP_MAXIMUM, pos, F(x, v, 0)), F(x, v, (double)S - 1));
    else
      pos = reflect(x, pos, lo, hi);
    nv_node *ip = pos ? ox_add(x, NV_OP_CAST, 1, &pos, &i64) : NULL; /* truncation, as the reference's int() */
    t[k] = (tap){ip ? ox_op2(x, NV_OP_MINIMUM, ox_op2(x, NV_OP_MAXIMUM, ip, ox_scalar(x, NOVA_DTYPE_I64, 0)),
                             ox_scalar(x, NOVA_DTYPE_I64, (double)S - 1)) : NULL, w};
    if (!t[k].idx || !t[k].w) return -1;
  }
  return n;
}

/* GridSample: every output point a weighted sum of input pixels, each read by
 * gather_elements at a flat position the grid gives (clamped into the image,
 * so always in range; zeros padding weighs the outside taps 0). */
static int cv_grid_sample(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *X = ox_N(x, in[0]), *G = ox_N(x, in[1]);
  if (!X || !G) return -1;
  int k = X->rank - 2;
  if (k < 1 || k > 3 || G->rank != k + 2 || G->shape[0] != X->shape[0] || G->shape[k + 1] != k || !fe_dtype_is_float(X->dtype))
    return ox_err(x, "X must be float [N, C, D1..Dk] and grid [N, O1..Ok, k], k 1 to 3");
  char b1[16], b2[16];
  char mode[16], pad[16];
  snprintf(mode, sizeof mode, "%s", ox_attr_s(x, "mode", x->opset < 20 ? "bilinear" : "linear", b1, sizeof b1));
  snprintf(pad, sizeof pad, "%s", ox_attr_s(x, "padding_mode", "zeros", b2, sizeof b2));
  if (!strcmp(mode, "bilinear")) strcpy(mode, "linear");
  if (!strcmp(mode, "bicubic")) strcpy(mode, "cubic");
  if (strcmp(mode, "nearest") && strcmp(mode, "linear") && strcmp(mode, "cubic")) return ox_err(x, "mode '%s'", mode);
  if (strcmp(pad, "zeros") && strcmp(pad, "border") && strcmp(pad, "reflection")) return ox_err(x, "padding_mode '%s'", pad);
  bool ac = ox_attr_i(x, "align_corners", 0) != 0;
  if (G->dtype != X->dtype) G = ox_add(x, NV_OP_CAST, 1, &G, &(nv_node){.to = X->dtype});
  int64_t N = X->shape[0], C = X->shape[1], P = 1, O = 1, osh[NOVA_MAX_RANK] = {N};
  for (int i = 0; i < k; i++) P *= X->shape[2 + i], O *= G->shape[1 + i], osh[1 + i] = G->shape[1 + i];
  tap taps[3][4];
  int nt[3];
  for (int d = 0; d < k; d++) { /* grid's last axis holds (x, y, z): the last spatial dim first */
    int64_t S = X->shape[2 + d];
    nv_node *g = ox_reshape(x, ox_slice1(x, G, k + 1, k - 1 - d, k - d, 1), k + 1, osh);
    nv_node *v = ac ? ox_op2(x, NV_OP_MUL, ox_op2(x, NV_OP_DIV, ox_op2(x, NV_OP_ADD, g, F(x, X, 1)), F(x, X, 2)), F(x, X, (double)S - 1))
                    : ox_op2(x, NV_OP_DIV, ox_op2(x, NV_OP_SUB, ox_op2(x, NV_OP_MUL, ox_op2(x, NV_OP_ADD, g, F(x, X, 1)),
                                                                       F(x, X, (double)S)), F(x, X, 1)), F(x, X, 2));
    if (!v || (nt[d] = dim_taps(x, v, S, mode, pad, ac, taps[d])) < 0) return -1;
  }
  nv_node *flat = ox_reshape(x, X, 3, (int64_t[]){N, C, P}), *acc = NULL;
  int total = 1;
  for (int d = 0; d < k; d++) total *= nt[d];
  for (int c = 0; c < total; c++) { /* one combination of taps */
    nv_node *idx = NULL, *w = NULL;
    int64_t stride = 1;
    for (int d = k - 1, r = c; d >= 0; d--) {
      const tap *t = &taps[d][r % nt[d]];
      r /= nt[d];
      nv_node *term = stride == 1 ? t->idx : ox_op2(x, NV_OP_MUL, t->idx, ox_scalar(x, NOVA_DTYPE_I64, (double)stride));
      idx = idx ? ox_op2(x, NV_OP_ADD, idx, term) : term;
      w = w ? ox_op2(x, NV_OP_MUL, w, t->w) : t->w;
      stride *= X->shape[2 + d];
    }
    idx = ox_op2(x, NV_OP_MINIMUM, ox_op2(x, NV_OP_MAXIMUM, idx, ox_scalar(x, NOVA_DTYPE_I64, 0)), ox_scalar(x, NOVA_DTYPE_I64, (double)P - 1));
    nv_node *ib = ox_broadcast_to(x, ox_reshape(x, idx, 3, (int64_t[]){N, 1, O}), 3, (int64_t[]){N, C, O});
    nv_node ge = {.axis = 2};
    nv_node *val = ib ? ox_add(x, NV_OP_GATHER_ELEMENTS, 2, (nv_node *[]){flat, ib}, &ge) : NULL;
    nv_node *term = val && w ? ox_op2(x, NV_OP_MUL, val, ox_reshape(x, w, 3, (int64_t[]){N, 1, O})) : NULL;
    acc = acc ? ox_op2(x, NV_OP_ADD, acc, term) : term;
    if (!acc) return -1;
  }
  int64_t ys[NOVA_MAX_RANK] = {N, C};
  for (int i = 0; i < k; i++) ys[2 + i] = G->shape[1 + i];
  return ox_set_out(out, ox_reshape(x, acc, k + 2, ys));
}

const ox_op_entry ox_resize_ops[] = {{"Resize", cv_resize}, {"Upsample", cv_upsample}, {"GridSample", cv_grid_sample}};
const size_t ox_resize_nops = sizeof ox_resize_ops / sizeof *ox_resize_ops;
