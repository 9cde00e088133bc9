/* onnx_eval.c: compile-time evaluation of nova nodes on the host.
 *
 * When every input of an ONNX node is known, its converter still builds the
 * nova nodes it always builds (so any op converts the same way), and this
 * evaluator then computes them from their constant leaves with the same
 * semantics as the lowering (lower_linalg.c): integer arithmetic wraps,
 * integer x / 0 and x mod 0 are 0, float min/max propagate NaN, rounding is
 * to even.  Floats are computed in double and stored in the node's dtype.
 * The evaluated nodes are then dropped from the graph (onnx_ops.c).
 *
 * A node it cannot evaluate (an op without a rule here, a leaf that is not
 * a constant, a result above EVAL_MAX elements, a gather index out of
 * range) makes it give up: the value is then computed by the step.  A
 * float -> integer cast out of range (or of NaN) gives the most negative
 * value, x86's "integer indefinite", as numpy, PyTorch and onnxruntime do
 * there (ONNX leaves it undefined; exporters' T5 buckets cast log(0)).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "onnx.h"

#define EVAL_MAX (INT64_C(1) << 20)

typedef struct ev {
  ox_ctx *x;
  int mark;          /* nodes below it are the graph's earlier nodes */
  ox_tensor **memo;  /* by id - mark */
} ev;

static ox_tensor *eval(ev *E, const nv_node *n);

static ox_tensor *leaf(const nv_node *n) {
  if (n->op != NV_OP_CONSTANT) return NULL;
  ox_tensor *t = ox_tensor_new(n->dtype, n->rank, n->shape);
  if (!t) return NULL;
  int64_t e = ox_numel(t);
  if (n->init.kind == NV_INIT_DATA && n->init.data) memcpy(t->data, n->init.data, (size_t)e * fe_dtype_size(n->dtype));
  else if (n->init.kind == NV_INIT_CONST || n->init.kind == NV_INIT_ONES) {
    double v = n->init.kind == NV_INIT_ONES ? 1.0 : n->init.a;
    for (int64_t i = 0; i < e; i++) ox_set(t, i, v, ox_f2i(v));
  } else if (n->init.kind != NV_INIT_ZEROS) {
    ox_tensor_free(t);
    return NULL;
  }
  return t;
}

/* Offset into t (rank <= r, numpy-broadcast) of the rank-r position idx. */
static int64_t bpos(const ox_tensor *t, int r, const int64_t *idx) {
  int64_t off = 0;
  for (int j = 0; j < t->rank; j++) off = off * t->shape[j] + (t->shape[j] == 1 ? 0 : idx[j + r - t->rank]);
  return off;
}
static void step_index(int r, const int64_t *shape, int64_t *idx) {
  for (int k = r - 1; k >= 0; k--) {
    if (++idx[k] < shape[k]) return;
    idx[k] = 0;
  }
}

static double fmin_nan(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }
static double fmax_nan(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }

/* One element of a float op (a, b, c: operands as doubles). */
static double fop(nv_op op, double a, double b, double c) {
  switch (op) {
  case NV_OP_ADD: return a + b;
  case NV_OP_SUB: return a - b;
  case NV_OP_MUL: return a * b;
  case NV_OP_DIV: return a / b;
  case NV_OP_POW: return pow(a, b);
  case NV_OP_MINIMUM: return fmin_nan(a, b);
  case NV_OP_MAXIMUM: return fmax_nan(a, b);
  case NV_OP_MOD: { double m = fmod(a, b); return m != 0 && ((m < 0) != (b < 0)) ? m + b : m; }
  case NV_OP_FMOD: return fmod(a, b);
  case NV_OP_NEG: return -a;
  case NV_OP_ABS: return fabs(a);
  case NV_OP_EXP: return exp(a);
  case NV_OP_LOG: return log(a);
  case NV_OP_SQRT: return sqrt(a);
  case NV_OP_TANH: return tanh(a);
  case NV_OP_SIGMOID: return 1 / (1 + exp(-a));
  case NV_OP_RELU: return fmax_nan(a, 0);
  case NV_OP_GELU: return 0.5 * a * (1 + erf(a * M_SQRT1_2));
  case NV_OP_ERF: return erf(a);
  case NV_OP_SIN: return sin(a);
  case NV_OP_COS: return cos(a);
  case NV_OP_TAN: return tan(a);
  case NV_OP_ASIN: return asin(a);
  case NV_OP_ACOS: return acos(a);
  case NV_OP_ATAN: return atan(a);
  case NV_OP_SINH: return sinh(a);
  case NV_OP_COSH: return cosh(a);
  case NV_OP_ASINH: return asinh(a);
  case NV_OP_ACOSH: return acosh(a);
  case NV_OP_ATANH: return atanh(a);
  case NV_OP_FLOOR: return floor(a);
  case NV_OP_CEIL: return ceil(a);
  case NV_OP_ROUND: return nearbyint(a); /* the default rounding mode: halves to even */
  case NV_OP_SIGN: return a > 0 ? 1 : a < 0 ? -1 : a;
  case NV_OP_WHERE: return a != 0 ? b : c;
  default: return NAN;
  }
}

/* One element of an integer op, wrapping (two's complement). */
static int64_t iop(nv_op op, int64_t a, int64_t b, int64_t c, bool boolean) {
  uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
  switch (op) {
  case NV_OP_ADD: return (int64_t)(ua + ub);
  case NV_OP_SUB: return (int64_t)(ua - ub);
  case NV_OP_MUL: return (int64_t)(ua * ub);
  case NV_OP_DIV: return b == 0 ? 0 : b == -1 ? (int64_t)(0 - ua) : a / b;
  case NV_OP_MOD: case NV_OP_FMOD: {
    if (b == 0 || b == -1) return 0;
    int64_t m = a % b;
    return op == NV_OP_MOD && m != 0 && ((m < 0) != (b < 0)) ? m + b : m;
  }
  case NV_OP_MINIMUM: return a < b ? a : b;
  case NV_OP_MAXIMUM: return a > b ? a : b;
  case NV_OP_NEG: return (int64_t)(0 - ua);
  case NV_OP_ABS: return a < 0 ? (int64_t)(0 - ua) : a;
  case NV_OP_SIGN: return a > 0 ? 1 : a < 0 ? -1 : 0;
  case NV_OP_WHERE: return a ? b : c;
  case NV_OP_NOT: return boolean ? !a : ~a; /* logical on bool, bitwise on integers */
  case NV_OP_AND: return a & b;
  case NV_OP_OR: return a | b;
  case NV_OP_XOR: return a ^ b;
  default: return 0;
  }
}

/* Comparisons and predicates: bool results of number operands. */
static int cmp(nv_op op, bool fl, double fa, double fb, int64_t ia, int64_t ib) {
  switch (op) {
  case NV_OP_EQUAL: return fl ? fa == fb : ia == ib;
  case NV_OP_LESS: return fl ? fa < fb : ia < ib;
  case NV_OP_GREATER: return fl ? fa > fb : ia > ib;
  case NV_OP_LESS_EQUAL: return fl ? fa <= fb : ia <= ib;
  case NV_OP_GREATER_EQUAL: return fl ? fa >= fb : ia >= ib;
  case NV_OP_ISNAN: return isnan(fa);
  case NV_OP_ISINF: return isinf(fa) != 0;
  default: return 0;
  }
}

static bool is_cmp(nv_op op) {
  return op == NV_OP_EQUAL || op == NV_OP_LESS || op == NV_OP_GREATER || op == NV_OP_LESS_EQUAL ||
         op == NV_OP_GREATER_EQUAL || op == NV_OP_ISNAN || op == NV_OP_ISINF;
}

static ox_tensor *elementwise(const nv_node *n, ox_tensor **a) {
  ox_tensor *o = ox_tensor_new(n->dtype, n->rank, n->shape);
  if (!o) return NULL;
  int64_t idx[NOVA_MAX_RANK] = {0}, e = ox_numel(o);
  /* the operation's type: of the operands (comparisons), of the values (where) */
  const ox_tensor *ty = n->op == NV_OP_WHERE ? a[1] : a[0];
  bool fl = fe_dtype_is_float(ty->dt);
  for (int64_t i = 0; i < e; i++, step_index(n->rank, n->shape, idx)) {
    double f[3] = {0};
    int64_t v[3] = {0};
    for (int k = 0; k < n->nin; k++) {
      int64_t p = bpos(a[k], n->rank, idx);
      f[k] = ox_getf(a[k], p);
      v[k] = ox_geti(a[k], p);
    }
    if (is_cmp(n->op)) ox_set(o, i, cmp(n->op, fl, f[0], f[1], v[0], v[1]), cmp(n->op, fl, f[0], f[1], v[0], v[1]));
    else if (fl) {
      double r = fop(n->op, f[0], f[1], f[2]);
      ox_set(o, i, r, 0);
    } else {
      int64_t r = iop(n->op, v[0], v[1], v[2], n->dtype == NOVA_DTYPE_BOOL);
      ox_set(o, i, (double)r, r);
    }
  }
  return o;
}

static ox_tensor *cast(const nv_node *n, const ox_tensor *a) {
  ox_tensor *o = ox_tensor_new(n->dtype, n->rank, n->shape);
  if (!o) return NULL;
  bool from_f = fe_dtype_is_float(a->dt), to_int = fe_dtype_is_int(n->dtype);
  double lim = fe_dtype_size(n->dtype) == 8 ? 9223372036854775807.0 : 2147483647.0;
  for (int64_t i = 0, e = ox_numel(o); i < e; i++) {
    double f = ox_getf(a, i);
    if (from_f && to_int && !(f > -lim - 1 && f < lim)) { /* out of range: integer indefinite */
      ox_set(o, i, -lim - 1, fe_dtype_size(n->dtype) == 8 ? INT64_MIN : INT32_MIN);
      continue;
    }
    if (n->dtype == NOVA_DTYPE_BOOL) ox_set(o, i, from_f ? f != 0 : ox_geti(a, i) != 0, from_f ? f != 0 : ox_geti(a, i) != 0);
    else ox_set(o, i, f, from_f ? (int64_t)f : ox_geti(a, i));
  }
  return o;
}

/* Copies of the data under a gather of positions: out element i reads
 * a at src(i). */
static ox_tensor *moved(const nv_node *n, const ox_tensor *a, const ox_tensor *ix) {
  ox_tensor *o = ox_tensor_new(n->dtype, n->rank, n->shape);
  if (!o) return NULL;
  int64_t idx[NOVA_MAX_RANK] = {0}, e = ox_numel(o), es = (int64_t)fe_dtype_size(a->dt);
  for (int64_t i = 0; i < e; i++, step_index(n->rank, n->shape, idx)) {
    int64_t src[NOVA_MAX_RANK], off = 0;
    switch (n->op) {
    case NV_OP_TRANSPOSE:
      for (int k = 0; k < n->rank; k++) src[n->list[k]] = idx[k];
      break;
    case NV_OP_BROADCAST:
      for (int k = 0; k < a->rank; k++) src[k] = a->shape[k] == 1 ? 0 : idx[k + n->rank - a->rank];
      break;
    case NV_OP_SLICE:
      memcpy(src, idx, sizeof src);
      src[n->axis] = n->start + idx[n->axis] * n->step;
      break;
    default: { /* gather */
      int nx = ix->rank, k = 0;
      int64_t ioff = 0;
      for (int j = 0; j < nx; j++) ioff = ioff * ix->shape[j] + idx[n->axis + j];
      int64_t v = ox_geti(ix, ioff), dim = a->shape[n->axis];
      v = v < 0 ? v + dim : v;
      if (v < 0 || v >= dim) {
        ox_tensor_free(o);
        return NULL;
      }
      for (int j = 0; j < a->rank; j++) src[j] = j < n->axis ? idx[k++] : j == n->axis ? v : idx[(k++) + nx];
      break;
    }
    }
    for (int k = 0; k < a->rank; k++) off = off * a->shape[k] + src[k];
    memcpy((char *)o->data + i * es, (const char *)a->data + off * es, (size_t)es);
  }
  return o;
}

static ox_tensor *concat(const nv_node *n, ox_tensor *a, ox_tensor *b) {
  ox_tensor *o = ox_tensor_new(n->dtype, n->rank, n->shape);
  if (!o) return NULL;
  int64_t idx[NOVA_MAX_RANK] = {0}, e = ox_numel(o), es = (int64_t)fe_dtype_size(n->dtype), cut = a->shape[n->axis];
  for (int64_t i = 0; i < e; i++, step_index(n->rank, n->shape, idx)) {
    const ox_tensor *t = idx[n->axis] < cut ? a : b;
    int64_t off = 0;
    for (int k = 0; k < n->rank; k++) off = off * t->shape[k] + (k == n->axis && t == b ? idx[k] - cut : idx[k]);
    memcpy((char *)o->data + i * es, (const char *)t->data + off * es, (size_t)es);
  }
  return o;
}

static ox_tensor *reduction(const nv_node *n, const ox_tensor *a) {
  ox_tensor *o = ox_tensor_new(n->dtype, n->rank, n->shape);
  if (!o) return NULL;
  bool red[NOVA_MAX_RANK] = {0};
  for (int i = 0; i < n->nlist; i++) red[n->list[i]] = true;
  int64_t e = ox_numel(o), cnt = ox_numel(a) / (e ? e : 1);
  double *fa = nv_xmalloc((size_t)(e ? e : 1) * sizeof *fa);
  int64_t *ia = nv_xmalloc((size_t)(e ? e : 1) * sizeof *ia);
  bool *seen = nv_xcalloc((size_t)(e ? e : 1), 1);
  if (!fa || !ia || !seen) {
    free(fa), free(ia), free(seen);
    ox_tensor_free(o);
    return NULL;
  }
  int64_t idx[NOVA_MAX_RANK] = {0};
  for (int64_t i = 0, m = ox_numel(a); i < m; i++, step_index(a->rank, a->shape, idx)) {
    int64_t p = 0;
    for (int k = 0; k < a->rank; k++)
      if (!red[k]) p = p * a->shape[k] + idx[k];
    double f = ox_getf(a, i);
    int64_t v = ox_geti(a, i);
    if (!seen[p]) fa[p] = f, ia[p] = v, seen[p] = true;
    else if (n->op == NV_OP_REDUCE_SUM || n->op == NV_OP_REDUCE_MEAN) fa[p] += f, ia[p] = (int64_t)((uint64_t)ia[p] + (uint64_t)v);
    else if (n->op == NV_OP_REDUCE_PROD) fa[p] *= f, ia[p] = (int64_t)((uint64_t)ia[p] * (uint64_t)v);
    else if (n->op == NV_OP_REDUCE_MAX) fa[p] = fmax_nan(fa[p], f), ia[p] = v > ia[p] ? v : ia[p];
    else fa[p] = fmin_nan(fa[p], f), ia[p] = v < ia[p] ? v : ia[p];
  }
  for (int64_t p = 0; p < e; p++) {
    if (!seen[p]) { /* empty reduction: the identity */
      fa[p] = n->op == NV_OP_REDUCE_PROD ? 1 : n->op == NV_OP_REDUCE_MAX ? -INFINITY : n->op == NV_OP_REDUCE_MIN ? INFINITY : 0;
      ia[p] = n->op == NV_OP_REDUCE_PROD ? 1 : n->op == NV_OP_REDUCE_MAX ? INT64_MIN : n->op == NV_OP_REDUCE_MIN ? INT64_MAX : 0;
    }
    if (n->op == NV_OP_REDUCE_MEAN) fa[p] /= (double)cnt;
    ox_set(o, p, fa[p], ia[p]);
  }
  free(fa), free(ia), free(seen);
  return o;
}

/* rms_norm over the last axis (C): x / sqrt(sum(x^2) / C + eps) * scale. */
static ox_tensor *rms_norm(const nv_node *n, const ox_tensor *a, const ox_tensor *w) {
  ox_tensor *o = ox_tensor_new(n->dtype, n->rank, n->shape);
  if (!o) return NULL;
  int64_t c = n->shape[n->rank - 1], rows = c ? ox_numel(o) / c : 0;
  for (int64_t i = 0; i < rows; i++) {
    double ss = 0;
    for (int64_t j = 0; j < c; j++) ss += ox_getf(a, i * c + j) * ox_getf(a, i * c + j);
    double rs = 1 / sqrt(ss / (double)c + n->eps);
    for (int64_t j = 0; j < c; j++) ox_set(o, i * c + j, ox_getf(a, i * c + j) * rs * ox_getf(w, j), 0);
  }
  return o;
}

/* rotary: element j of the last axis (D) and its partner k in the pair,
 * at pair index p: y_j = x_j cos_p - x_k sin_p for the first of the pair,
 * x_j cos_p + x_k sin_p for the second (halves, or interleaved (2p, 2p+1)). */
static ox_tensor *rotary(const nv_node *n, const ox_tensor *a, const ox_tensor *c, const ox_tensor *s) {
  ox_tensor *o = ox_tensor_new(n->dtype, n->rank, n->shape);
  if (!o) return NULL;
  int r = n->rank;
  int64_t idx[NOVA_MAX_RANK] = {0}, e = ox_numel(o), D = n->shape[r - 1], h = D / 2;
  for (int64_t i = 0; i < e; i++, step_index(r, n->shape, idx)) {
    int64_t j = idx[r - 1], p = n->mode ? j / 2 : j % h, k = n->mode ? j ^ 1 : j < h ? j + h : j - h;
    bool first = n->mode ? j % 2 == 0 : j < h;
    int64_t ci[NOVA_MAX_RANK];
    memcpy(ci, idx, sizeof ci);
    ci[r - 1] = p;
    double cv = ox_getf(c, bpos(c, r, ci)), sv = ox_getf(s, bpos(s, r, ci));
    double xj = ox_getf(a, i), xk = ox_getf(a, i - j + k);
    ox_set(o, i, xj * cv + xk * (first ? -sv : sv), 0);
  }
  return o;
}

/* uint64 values above 2^63 do not fit the int64 arithmetic here, and a
 * float cast to a narrow or unsigned integer is left to the step's own
 * conversion: such nodes are computed by the step. */
static bool evaluable(const nv_node *n) {
  if (n->dtype == NOVA_DTYPE_U64) return false;
  for (int i = 0; i < n->nin; i++)
    if (n->in[i]->dtype == NOVA_DTYPE_U64) return false;
  return n->op != NV_OP_CAST || !fe_dtype_is_int(n->dtype) || fe_dtype_is_index(n->dtype) ||
         !fe_dtype_is_float(n->in[0]->dtype);
}

static ox_tensor *compute(ev *E, const nv_node *n) {
  if (fe_numel(n) > EVAL_MAX || !evaluable(n)) return NULL;
  ox_tensor *a[3] = {0};
  for (int i = 0; i < n->nin && i < 3; i++)
    if (!(a[i] = eval(E, n->in[i]))) return NULL;
  switch (n->op) {
  case NV_OP_ADD: case NV_OP_SUB: case NV_OP_MUL: case NV_OP_DIV: case NV_OP_POW: case NV_OP_MINIMUM:
  case NV_OP_MAXIMUM: case NV_OP_MOD: case NV_OP_FMOD: case NV_OP_NEG: case NV_OP_ABS: case NV_OP_EXP:
  case NV_OP_LOG: case NV_OP_SQRT: case NV_OP_TANH: case NV_OP_SIGMOID: case NV_OP_RELU: case NV_OP_GELU:
  case NV_OP_ERF: case NV_OP_SIN: case NV_OP_COS: case NV_OP_TAN: case NV_OP_ASIN: case NV_OP_ACOS:
  case NV_OP_ATAN: case NV_OP_SINH: case NV_OP_COSH: case NV_OP_ASINH: case NV_OP_ACOSH: case NV_OP_ATANH:
  case NV_OP_FLOOR: case NV_OP_CEIL: case NV_OP_ROUND: case NV_OP_SIGN: case NV_OP_WHERE: case NV_OP_NOT:
  case NV_OP_AND: case NV_OP_OR: case NV_OP_XOR: case NV_OP_EQUAL: case NV_OP_LESS: case NV_OP_GREATER:
  case NV_OP_LESS_EQUAL: case NV_OP_GREATER_EQUAL: case NV_OP_ISNAN: case NV_OP_ISINF:
    return elementwise(n, a);
  case NV_OP_CAST: return cast(n, a[0]);
  case NV_OP_RESHAPE: {
    ox_tensor *o = ox_tensor_new(n->dtype, n->rank, n->shape);
    if (o) memcpy(o->data, a[0]->data, (size_t)ox_numel(o) * fe_dtype_size(n->dtype));
    return o;
  }
  case NV_OP_TRANSPOSE: case NV_OP_BROADCAST: case NV_OP_SLICE: return moved(n, a[0], NULL);
  case NV_OP_GATHER: return moved(n, a[0], a[1]);
  case NV_OP_CONCAT: return concat(n, a[0], a[1]);
  case NV_OP_REDUCE_SUM: case NV_OP_REDUCE_MEAN: case NV_OP_REDUCE_MAX: case NV_OP_REDUCE_MIN:
  case NV_OP_REDUCE_PROD:
    return reduction(n, a[0]);
  case NV_OP_RMS_NORM: return rms_norm(n, a[0], a[1]);
  case NV_OP_ROTARY: return rotary(n, a[0], a[1], a[2]);
  default: return NULL;
  }
}

static ox_tensor *eval(ev *E, const nv_node *n) {
  if (n->id < E->mark) return NULL; /* an earlier node: a param or a run-time value */
  ox_tensor **slot = &E->memo[n->id - E->mark];
  if (!*slot) *slot = n->op == NV_OP_CONSTANT ? leaf(n) : compute(E, n);
  return *slot;
}

int ox_eval_known(ox_ctx *x, int mark, ox_val *out, int nout) {
  int n = x->g->nnodes - mark;
  if (n <= 0) return 0;
  ev E = {.x = x, .mark = mark, .memo = nv_xcalloc((size_t)n, sizeof(ox_tensor *))};
  if (!E.memo) return 0;
  ox_tensor *res[64] = {0};
  bool ok = nout <= 64;
  for (int i = 0; ok && i < nout; i++) {
    if (!out[i].present) continue;
    if (out[i].k) continue; /* already known */
    ok = out[i].node && (res[i] = eval(&E, out[i].node)) != NULL;
  }
  if (ok) /* the results move out of the memo */
    for (int i = 0; i < nout; i++)
      if (res[i]) {
        for (int j = 0; j < n; j++)
          if (E.memo[j] == res[i]) E.memo[j] = NULL;
        ox_tensor *dup = NULL;
        for (int k = 0; k < i; k++)
          if (res[k] == res[i]) dup = out[k].k; /* two outputs of one node: a copy each */
        out[i] = (ox_val){.k = dup ? ox_tensor_new(dup->dt, dup->rank, dup->shape) : res[i], .present = true};
        if (dup && out[i].k) memcpy(out[i].k->data, dup->data, (size_t)ox_numel(dup) * fe_dtype_size(dup->dt));
      }
  for (int j = 0; j < n; j++) ox_tensor_free(E.memo[j]);
  free(E.memo);
  return ok;
}
