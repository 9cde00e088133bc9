/* onnx_fold.c: evaluates ONNX ops on values known at compile time.
 *
 * Exporters compute shapes at run time (Shape -> Gather -> Unsqueeze ->
 * Concat -> Reshape); with static shapes those subgraphs are constants.
 * Floating-point parameters are never known values (they stay trainable),
 * so folding only ever touches constants, shapes and integer arithmetic.
 * Each rule follows the operator's ONNX definition for the supported
 * dtypes; anything else is left to the converters (returns 0).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.h"

/* numpy broadcasting of n shapes into out; -1 if incompatible. */
static int bcast_shape(int n, const ox_tensor *const *t, int *rank, int64_t *out) {
  int r = 0;
  for (int i = 0; i < n; i++) r = t[i]->rank > r ? t[i]->rank : r;
  for (int k = 0; k < r; k++) {
    int64_t d = 1;
    for (int i = 0; i < n; i++) {
      int j = k - (r - t[i]->rank);
      int64_t e = j >= 0 ? t[i]->shape[j] : 1;
      if (e != 1 && d != 1 && e != d) return -1;
      if (e != 1) d = e;
    }
    out[k] = d;
  }
  *rank = r;
  return 0;
}

/* Flat index into t of the broadcast position idx (in a rank-r result). */
static int64_t bcast_index(const ox_tensor *t, int r, const int64_t *idx) {
  int64_t off = 0;
  for (int j = 0; j < t->rank; j++) {
    int k = j + r - t->rank;
    off = off * t->shape[j] + (t->shape[j] == 1 ? 0 : idx[k]);
  }
  return off;
}

static bool next_index(int r, const int64_t *shape, int64_t *idx) {
  for (int k = r - 1; k >= 0; k--) {
    if (++idx[k] < shape[k]) return true;
    idx[k] = 0;
  }
  return false;
}

static double fapply(const char *op, double a, double b, double c) {
  if (!strcmp(op, "Add")) return a + b;
  if (!strcmp(op, "Sub")) return a - b;
  if (!strcmp(op, "Mul")) return a * b;
  if (!strcmp(op, "Div")) return a / b;
  if (!strcmp(op, "Pow")) return pow(a, b);
  if (!strcmp(op, "Min")) return a < b ? a : b;
  if (!strcmp(op, "Max")) return a > b ? a : b;
  if (!strcmp(op, "Equal")) return a == b;
  if (!strcmp(op, "Less")) return a < b;
  if (!strcmp(op, "Greater")) return a > b;
  if (!strcmp(op, "Where")) return a != 0 ? b : c;
  if (!strcmp(op, "Neg")) return -a;
  if (!strcmp(op, "Abs")) return fabs(a);
  if (!strcmp(op, "Sqrt")) return sqrt(a);
  if (!strcmp(op, "Reciprocal")) return 1 / a;
  if (!strcmp(op, "Exp")) return exp(a);
  return a;
}

static int64_t iapply(const char *op, int64_t a, int64_t b, int64_t c, bool *bad) {
  if (!strcmp(op, "Add")) return (int64_t)((uint64_t)a + (uint64_t)b);
  if (!strcmp(op, "Sub")) return (int64_t)((uint64_t)a - (uint64_t)b);
  if (!strcmp(op, "Mul")) return (int64_t)((uint64_t)a * (uint64_t)b);
  if (!strcmp(op, "Div")) {
    if (b == 0 || (a == INT64_MIN && b == -1)) *bad = true;
    return b && !(a == INT64_MIN && b == -1) ? a / b : 0;
  }
  if (!strcmp(op, "Min")) return a < b ? a : b;
  if (!strcmp(op, "Max")) return a > b ? a : b;
  if (!strcmp(op, "Equal")) return a == b;
  if (!strcmp(op, "Less")) return a < b;
  if (!strcmp(op, "Greater")) return a > b;
  if (!strcmp(op, "Where")) return a ? b : c;
  if (!strcmp(op, "Neg")) return -a;
  if (!strcmp(op, "Abs")) return a < 0 ? -a : a;
  return a;
}

/* Elementwise ops over known tensors with broadcasting. */
static int fold_elementwise(ox_ctx *x, const char *op, ox_val *in, int nin, ox_val *out) {
  const ox_tensor *t[3];
  for (int i = 0; i < nin; i++) t[i] = in[i].k;
  int r;
  int64_t shape[NOVA_MAX_RANK], idx[NOVA_MAX_RANK] = {0};
  if (bcast_shape(nin, t, &r, shape)) return ox_err(x, "operand shapes cannot be broadcast together");
  bool cmp = !strcmp(op, "Equal") || !strcmp(op, "Less") || !strcmp(op, "Greater");
  const ox_tensor *ty = !strcmp(op, "Where") ? t[1] : t[0];
  if (nin == 2 && t[0]->dt != t[1]->dt && strcmp(op, "Pow")) return 0;
  if (!strcmp(op, "Where") && t[1]->dt != t[2]->dt) return 0;
  if (ty->dt == NOVA_DTYPE_U64 || t[0]->dt == NOVA_DTYPE_U64) return 0; /* int64 arithmetic below: the step computes it */
  ox_tensor *o = ox_tensor_new(cmp ? NOVA_DTYPE_BOOL : ty->dt, r, shape);
  if (!o) return -1;
  bool fl = fe_dtype_is_float(ty->dt) || fe_dtype_is_float(t[0]->dt), bad = false;
  int64_t n = ox_numel(o);
  for (int64_t e = 0; e < n; e++, next_index(r, shape, idx)) {
    double fa[3] = {0};
    int64_t ia[3] = {0};
    for (int i = 0; i < nin; i++) {
      int64_t off = bcast_index(t[i], r, idx);
      fa[i] = ox_getf(t[i], off);
      ia[i] = ox_geti(t[i], off);
    }
    if (fl) {
      double v = fapply(op, fa[0], fa[1], fa[2]);
      ox_set(o, e, v, ox_f2i(v)); /* v may be NaN or beyond int64 (unused then) */
    } else {
      int64_t v = iapply(op, ia[0], ia[1], ia[2], &bad);
      ox_set(o, e, (double)v, v);
    }
  }
  if (bad) {
    ox_tensor_free(o);
    return ox_err(x, "integer division by zero in a constant expression");
  }
  out[0] = (ox_val){.k = o, .present = true};
  return 1;
}

static ox_tensor *clone_shape(const ox_tensor *t, int rank, const int64_t *shape) {
  ox_tensor *o = ox_tensor_new(t->dt, rank, shape);
  if (o) memcpy(o->data, t->data, (size_t)ox_numel(t) * fe_dtype_size(t->dt));
  return o;
}

static int fold_cast(ox_ctx *x, ox_val *in, ox_val *out) {
  nova_dtype to = ox_dtype_of_onnx((int32_t)ox_attr_i(x, "to", 0));
  if (!to) return 0;
  ox_tensor *o = ox_tensor_new(to, in[0].k->rank, in[0].k->shape);
  if (!o) return -1;
  for (int64_t i = 0, n = ox_numel(o); i < n; i++) /* to bool: any nonzero value (0.5 too) is true */
    ox_set(o, i, ox_getf(in[0].k, i), to == NOVA_DTYPE_BOOL ? ox_getf(in[0].k, i) != 0 : ox_geti(in[0].k, i));
  out[0] = (ox_val){.k = o, .present = true};
  return 1;
}

static int fold_concat(ox_ctx *x, ox_val *in, int nin, ox_val *out) {
  const ox_tensor *a = in[0].k;
  int64_t axis = ox_attr_i(x, "axis", 0);
  if (axis < 0) axis += a->rank;
  if (axis < 0 || axis >= a->rank) return ox_err(x, "axis out of range");
  int64_t shape[NOVA_MAX_RANK];
  memcpy(shape, a->shape, sizeof shape);
  shape[axis] = 0;
  for (int i = 0; i < nin; i++) {
    const ox_tensor *t = in[i].k;
    if (t->rank != a->rank || t->dt != a->dt) return ox_err(x, "operands differ in rank or dtype");
    shape[axis] += t->shape[axis];
  }
  ox_tensor *o = ox_tensor_new(a->dt, a->rank, shape);
  if (!o) return -1;
  int64_t outer = 1, es = (int64_t)fe_dtype_size(a->dt);
  for (int i = 0; i < axis; i++) outer *= a->shape[i];
  char *dst = o->data;
  for (int64_t b = 0; b < outer; b++)
    for (int i = 0; i < nin; i++) {
      const ox_tensor *t = in[i].k;
      int64_t inner = ox_numel(t) / (outer ? outer : 1) * es;
      memcpy(dst, (const char *)t->data + b * inner, (size_t)inner);
      dst += inner;
    }
  out[0] = (ox_val){.k = o, .present = true};
  return 1;
}

static int fold_gather(ox_ctx *x, ox_val *in, ox_val *out) {
  const ox_tensor *d = in[0].k, *ix = in[1].k;
  int64_t axis = ox_attr_i(x, "axis", 0);
  if (axis < 0) axis += d->rank;
  if (axis < 0 || axis >= d->rank) return ox_err(x, "axis out of range");
  int r = d->rank - 1 + ix->rank;
  if (r > NOVA_MAX_RANK) return 0;
  int64_t shape[NOVA_MAX_RANK];
  int k = 0;
  for (int i = 0; i < axis; i++) shape[k++] = d->shape[i];
  for (int i = 0; i < ix->rank; i++) shape[k++] = ix->shape[i];
  for (int i = (int)axis + 1; i < d->rank; i++) shape[k++] = d->shape[i];
  ox_tensor *o = ox_tensor_new(d->dt, r, shape);
  if (!o) return -1;
  int64_t outer = 1, inner = 1, dim = d->shape[axis], es = (int64_t)fe_dtype_size(d->dt), ni = ox_numel(ix);
  for (int i = 0; i < axis; i++) outer *= d->shape[i];
  for (int i = (int)axis + 1; i < d->rank; i++) inner *= d->shape[i];
  for (int64_t b = 0; b < outer; b++)
    for (int64_t j = 0; j < ni; j++) {
      int64_t v = ox_geti(ix, j);
      if (v < 0) v += dim;
      if (v < 0 || v >= dim) {
        ox_tensor_free(o);
        return ox_err(x, "index %lld is out of range for a dimension of %lld", (long long)ox_geti(ix, j), (long long)dim);
      }
      memcpy((char *)o->data + ((b * ni + j) * inner) * es, (const char *)d->data + ((b * dim + v) * inner) * es,
             (size_t)(inner * es));
    }
  out[0] = (ox_val){.k = o, .present = true};
  return 1;
}

static int fold_slice(ox_ctx *x, ox_val *in, int nin, ox_val *out) {
  const ox_tensor *d = in[0].k;
  int64_t st[NOVA_MAX_RANK], en[NOVA_MAX_RANK], ax[NOVA_MAX_RANK], sp[NOVA_MAX_RANK];
  int n = ox_const_ints(x, in[1], "starts", st, NOVA_MAX_RANK);
  if (n < 0 || ox_const_ints(x, in[2], "ends", en, NOVA_MAX_RANK) != n) return -1;
  for (int i = 0; i < n; i++) ax[i] = i, sp[i] = 1;
  if (nin > 3 && in[3].present && ox_const_ints(x, in[3], "axes", ax, NOVA_MAX_RANK) != n) return -1;
  if (nin > 4 && in[4].present && ox_const_ints(x, in[4], "steps", sp, NOVA_MAX_RANK) != n) return -1;
  int64_t lo[NOVA_MAX_RANK], step[NOVA_MAX_RANK], shape[NOVA_MAX_RANK];
  for (int i = 0; i < d->rank; i++) lo[i] = 0, step[i] = 1, shape[i] = d->shape[i];
  for (int i = 0; i < n; i++) {
    int64_t a = ax[i] < 0 ? ax[i] + d->rank : ax[i], dim;
    if (a < 0 || a >= d->rank || sp[i] == 0) return ox_err(x, "bad slice axis or step");
    dim = d->shape[a];
    int64_t s = st[i] < 0 ? st[i] + dim : st[i], e = en[i] < 0 ? en[i] + dim : en[i];
    if (sp[i] > 0) {
      s = s < 0 ? 0 : s > dim ? dim : s;
      e = e < 0 ? 0 : e > dim ? dim : e;
      shape[a] = e > s ? (e - s - 1) / sp[i] + 1 : 0;
    } else {
      s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
      e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
      shape[a] = s > e ? (s - e - 1) / -sp[i] + 1 : 0;
    }
    lo[a] = s;
    step[a] = sp[i];
  }
  ox_tensor *o = ox_tensor_new(d->dt, d->rank, shape);
  if (!o) return -1;
  int64_t idx[NOVA_MAX_RANK] = {0}, total = ox_numel(o);
  for (int64_t e = 0; e < total; e++, next_index(d->rank, shape, idx)) {
    int64_t off = 0;
    for (int k = 0; k < d->rank; k++) off = off * d->shape[k] + lo[k] + idx[k] * step[k];
    ox_set(o, e, ox_getf(d, off), ox_geti(d, off));
  }
  out[0] = (ox_val){.k = o, .present = true};
  return 1;
}

static int fold_range(ox_ctx *x, ox_val *in, ox_val *out) {
  const ox_tensor *s = in[0].k, *l = in[1].k, *dl = in[2].k;
  bool fl = fe_dtype_is_float(s->dt);
  if (ox_numel(s) != 1 || ox_numel(l) != 1 || ox_numel(dl) != 1) return ox_err(x, "Range takes scalars");
  if (s->dt != l->dt || s->dt != dl->dt) return ox_err(x, "start, limit and delta must have one element type");
  double fs = ox_getf(s, 0), fe = ox_getf(l, 0), fd = ox_getf(dl, 0);
  if (!isfinite(fs) || !isfinite(fe) || !isfinite(fd)) return ox_err(x, "start, limit and delta must be finite");
  if (fd == 0) return ox_err(x, "delta is 0");
  /* the count, computed in long double so no integer arithmetic overflows */
  long double cnt = fl ? ceill(((long double)fe - fs) / fd)
                       : ceill(((long double)ox_geti(l, 0) - (long double)ox_geti(s, 0)) / (long double)ox_geti(dl, 0));
  /* checked before anything is allocated or filled, as ConstantOfShape does:
   * 17 bytes of operands must not cost a minute and gigabytes */
  if (cnt * (long double)fe_dtype_size(s->dt) > (long double)OX_MAX_FILL_BYTES)
    return ox_err(x, "the range is too large (%.3Lg elements of %d bytes; at most %d MiB, the most a compile-time "
                  "constant holds)", cnt, (int)fe_dtype_size(s->dt), (int)(OX_MAX_FILL_BYTES >> 20));
  int64_t n = cnt > 0 ? (int64_t)cnt : 0;
  ox_tensor *o = ox_tensor_new(s->dt, 1, &n);
  if (!o) return -1;
  uint64_t is = (uint64_t)ox_geti(s, 0), id = (uint64_t)ox_geti(dl, 0); /* read once: up to 2^28 elements */
  for (int64_t i = 0; i < n; i++) /* wrapping unsigned arithmetic: no signed overflow */
    ox_set(o, i, fs + (double)i * fd, (int64_t)(is + (uint64_t)i * id));
  out[0] = (ox_val){.k = o, .present = true};
  return 1;
}

static int fold_transpose(ox_ctx *x, ox_val *in, ox_val *out) {
  const ox_tensor *d = in[0].k;
  int64_t perm[NOVA_MAX_RANK], shape[NOVA_MAX_RANK], idx[NOVA_MAX_RANK] = {0};
  int np = ox_attr_ints(x, "perm", perm, NOVA_MAX_RANK);
  if (np < 0)
    for (int i = 0; i < d->rank; i++) perm[i] = d->rank - 1 - i;
  else if (np != d->rank)
    return 0;
  for (int i = 0; i < d->rank; i++) {
    if (perm[i] < 0 || perm[i] >= d->rank) return 0;
    shape[i] = d->shape[perm[i]];
  }
  ox_tensor *o = ox_tensor_new(d->dt, d->rank, shape);
  if (!o) return -1;
  int64_t total = ox_numel(o);
  for (int64_t e = 0; e < total; e++, next_index(d->rank, shape, idx)) {
    int64_t src[NOVA_MAX_RANK], off = 0;
    for (int i = 0; i < d->rank; i++) src[perm[i]] = idx[i];
    for (int i = 0; i < d->rank; i++) off = off * d->shape[i] + src[i];
    ox_set(o, e, ox_getf(d, off), ox_geti(d, off));
  }
  out[0] = (ox_val){.k = o, .present = true};
  return 1;
}

/* Shape-only ops whose result is the data under a new shape, computed by
 * the converter's shape rule: fold by re-shaping a copy. */
static int fold_reshaped(ox_val *in, const nv_node *shaped, ox_val *out) {
  ox_tensor *o = clone_shape(in[0].k, shaped->rank, shaped->shape);
  if (!o) return -1;
  out[0] = (ox_val){.k = o, .present = true};
  return 1;
}

/* Used by the converters for Reshape/Squeeze/Unsqueeze/Flatten/Expand of
 * known data: the result shape is computed like a graph op's. */
int ox_fold_reshape(ox_val *in, int rank, const int64_t *shape, ox_val *out) {
  nv_node s = {.rank = rank};
  memcpy(s.shape, shape, (size_t)rank * sizeof *shape);
  return fold_reshaped(in, &s, out);
}

int ox_fold(ox_ctx *x, const char *op, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  /* every operand known; only Slice's axes and steps may be omitted */
  int required = !strcmp(op, "Slice") ? 3 : nin;
  for (int i = 0; i < nin; i++)
    if ((in[i].present && !in[i].k) || (!in[i].present && i < required)) return 0;
  if (nin == 0) return 0;
  static const char *const ew[] = {"Add", "Sub", "Mul", "Div", "Pow", "Min", "Max", "Equal", "Less", "Greater",
                                   "Where", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp"};
  for (size_t i = 0; i < sizeof ew / sizeof *ew; i++)
    if (!strcmp(op, ew[i])) {
      int n = !strcmp(op, "Where") ? 3 : (!strcmp(op, "Neg") || !strcmp(op, "Abs") || !strcmp(op, "Sqrt") ||
                                          !strcmp(op, "Reciprocal") || !strcmp(op, "Exp")) ? 1 : 2;
      if ((!strcmp(op, "Min") || !strcmp(op, "Max")) && nin != 2) return 0;
      if (nin != n) return 0;
      return fold_elementwise(x, op, in, n, out);
    }
  if (!strcmp(op, "Identity")) return ox_fold_reshape(in, in[0].k->rank, in[0].k->shape, out);
  if (!strcmp(op, "Cast")) return fold_cast(x, in, out);
  if (!strcmp(op, "Concat")) return fold_concat(x, in, nin, out);
  if (!strcmp(op, "Gather") && nin == 2) return fold_gather(x, in, out);
  if (!strcmp(op, "Slice") && nin >= 3) return fold_slice(x, in, nin, out);
  if (!strcmp(op, "Range") && nin == 3) return fold_range(x, in, out);
  if (!strcmp(op, "Transpose")) return fold_transpose(x, in, out);
  return 0;
}

