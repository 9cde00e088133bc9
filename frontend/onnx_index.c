/* onnx_index.c: ONNX indexing, padding and tiling ops -> nova nodes.
 *
 * GatherElements, ScatterElements, GatherND, ScatterND and CumSum map to
 * nova ops of their own; Pad (every mode), Tile and OneHot are written as
 * gathers with constant index lists, concatenations and comparisons, so
 * their gradients come from those ops' rules.
 */
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "onnx.h"

#define CV(name) static int name(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout)

/* A known int64 vector as a graph constant. */
static nv_node *index_list(ox_ctx *x, const int64_t *v, int64_t n) {
  ox_tensor *t = ox_tensor_new(NOVA_DTYPE_I64, 1, &n);
  if (!t) return NULL;
  for (int64_t i = 0; i < n; i++) ox_set(t, i, (double)v[i], v[i]);
  nv_node *c = ox_N(x, (ox_val){.k = t, .present = true});
  ox_tensor_free(t);
  return c;
}

nv_node *ox_pick(ox_ctx *x, nv_node *a, int64_t axis, const int64_t *v, int64_t n) {
  nv_node *ix = index_list(x, v, n);
  if (!a || !ix) return NULL;
  nv_node at = {.axis = axis};
  return ox_add(x, NV_OP_GATHER, 2, (nv_node *[]){a, ix}, &at);
}

nv_node *ox_zero_pad(ox_ctx *x, nv_node *a, int64_t axis, int64_t before, int64_t after) {
  int64_t s[NOVA_MAX_RANK];
  nv_node at = {.axis = axis};
  for (int side = 0; side < 2 && a; side++) {
    int64_t n = side ? after : before;
    if (!n) continue;
    memcpy(s, a->shape, sizeof s);
    s[axis] = n;
    nv_node *z = fe_graph_leaf(x->g, x->d, NV_OP_CONSTANT, NULL, a->dtype, a->rank, s, x->loc); /* zeros */
    a = z ? ox_add(x, NV_OP_CONCAT, 2, side ? (nv_node *[]){a, z} : (nv_node *[]){z, a}, &at) : NULL;
  }
  return a;
}

static const char *const scatter_modes[] = {"none", "add", "mul", "max", "min"};

static int scatter_mode(ox_ctx *x, int64_t *mode) {
  char buf[16];
  const char *r = ox_attr_s(x, "reduction", "none", buf, sizeof buf);
  for (int i = 0; i < 5; i++)
    if (!strcmp(r, scatter_modes[i])) {
      *mode = i;
      return 0;
    }
  return ox_err(x, "reduction '%s'; expected none, add, mul, max or min", r);
}

CV(cv_gather_elements) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node at = {.axis = ox_attr_i(x, "axis", 0), .index_negative = true};
  return ox_set_out(out, ox_add(x, NV_OP_GATHER_ELEMENTS, 2, (nv_node *[]){ox_N(x, in[0]), ox_N(x, in[1])}, &at));
}

CV(cv_scatter_elements) {
  (void)nout;
  if (ox_need(x, in, nin, 3, 3)) return -1;
  nv_node at = {.axis = ox_attr_i(x, "axis", 0)};
  if (scatter_mode(x, &at.mode)) return -1;
  return ox_set_out(out, ox_add(x, NV_OP_SCATTER_ELEMENTS, 3, (nv_node *[]){ox_N(x, in[0]), ox_N(x, in[1]), ox_N(x, in[2])}, &at));
}

CV(cv_gather_nd) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node at = {.axis = ox_attr_i(x, "batch_dims", 0)};
  return ox_set_out(out, ox_add(x, NV_OP_GATHER_ND, 2, (nv_node *[]){ox_N(x, in[0]), ox_N(x, in[1])}, &at));
}

CV(cv_scatter_nd) {
  (void)nout;
  if (ox_need(x, in, nin, 3, 3)) return -1;
  nv_node at = {0};
  if (scatter_mode(x, &at.mode)) return -1;
  return ox_set_out(out, ox_add(x, NV_OP_SCATTER_ND, 3, (nv_node *[]){ox_N(x, in[0]), ox_N(x, in[1]), ox_N(x, in[2])}, &at));
}

static int cumulative(ox_ctx *x, ox_val *in, int nin, ox_val *out, int64_t product) {
  if (ox_need(x, in, nin, 2, 2)) return -1;
  int64_t axis;
  if (ox_const_ints(x, in[1], "axis", &axis, 1) != 1) return -1;
  nv_node at = {.axis = axis, .mode = (ox_attr_i(x, "exclusive", 0) ? NV_CUMSUM_EXCLUSIVE : 0) |
                                      (ox_attr_i(x, "reverse", 0) ? NV_CUMSUM_REVERSE : 0) | product};
  nv_node *a = ox_N(x, in[0]);
  return ox_set_out(out, a ? ox_add(x, NV_OP_CUMSUM, 1, &a, &at) : NULL);
}
CV(cv_cumsum) { (void)nout; return cumulative(x, in, nin, out, 0); }
CV(cv_cumprod) { (void)nout; return cumulative(x, in, nin, out, NV_CUMSUM_PRODUCT); }

CV(cv_tile) { /* per axis: a gather of j mod d for j < r d */
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t rep[NOVA_MAX_RANK];
  int n = ox_const_ints(x, in[1], "repeats", rep, NOVA_MAX_RANK);
  if (n < 0) return -1;
  if (n != a->rank) return ox_err(x, "repeats has %d entries for an input of rank %d", n, a->rank);
  for (int i = 0; i < n && a; i++) {
    if (rep[i] < 0) return ox_err(x, "repeats[%d] is %lld; repeats must be >= 0", i, (long long)rep[i]);
    if (rep[i] == 1) continue;
    int64_t d = a->shape[i], m = rep[i] * d;
    if (m > (INT64_C(1) << 28)) return ox_err(x, "the tiled axis %d is too long", i);
    int64_t *v = nv_xmalloc((size_t)(m ? m : 1) * sizeof *v);
    if (!v) return -1;
    for (int64_t j = 0; j < m; j++) v[j] = j % d;
    a = m ? ox_pick(x, a, i, v, m) : ox_slice1(x, a, i, 0, 0, 1);
    free(v);
  }
  return ox_set_out(out, a);
}

/* numpy's pad index maps: where position j of the padded axis (j - b in
 * the original) reads from, for an axis of n. */
static int64_t pad_source(const char *mode, int64_t j, int64_t n) {
  if (!strcmp(mode, "edge")) return j < 0 ? 0 : j >= n ? n - 1 : j;
  if (!strcmp(mode, "wrap")) return ((j % n) + n) % n;
  if (n == 1) return 0; /* reflect */
  int64_t p = 2 * (n - 1), k = ((j % p) + p) % p;
  return k < n ? k : p - k;
}

CV(cv_pad) {
  (void)nout;
  bool attr_form = x->opset < 11;
  if (ox_need(x, in, nin, 1, attr_form ? 1 : 4)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int r = a->rank;
  int64_t pads[2 * NOVA_MAX_RANK], axes[NOVA_MAX_RANK];
  int np = attr_form ? ox_attr_ints(x, "pads", pads, 2 * NOVA_MAX_RANK)
                     : ox_const_ints(x, in[1], "pads", pads, 2 * NOVA_MAX_RANK);
  if (np < 0) return attr_form ? ox_err(x, "the pads attribute is required") : -1;
  int na = r;
  for (int i = 0; i < r; i++) axes[i] = i;
  if (!attr_form && nin > 3 && in[3].present) {
    na = ox_const_ints(x, in[3], "axes", axes, NOVA_MAX_RANK);
    if (na < 0) return -1;
    for (int i = 0; i < na; i++)
      if (ox_norm_axis(x, &axes[i], r)) return -1;
  }
  if (np != 2 * na) return ox_err(x, "pads has %d entries; expected %d (begin and end for each of %d axes)", np, 2 * na, na);
  char buf[16];
  const char *mode = ox_attr_s(x, "mode", "constant", buf, sizeof buf);
  bool constant = !strcmp(mode, "constant");
  if (!constant && strcmp(mode, "reflect") && strcmp(mode, "edge") && strcmp(mode, "wrap"))
    return ox_err(x, "mode '%s'; expected constant, reflect, edge or wrap", mode);
  nv_node *value = NULL;
  if (constant) {
    if (attr_form) value = ox_scalar(x, a->dtype, ox_attr_f(x, "value", 0.0));
    else if (nin > 2 && in[2].present) value = ox_reshape(x, ox_N(x, in[2]), 0, NULL);
    else value = ox_scalar(x, a->dtype, 0.0);
    if (!value) return -1;
  }
  for (int i = 0; i < na && a; i++) {
    int64_t ax = axes[i], b = pads[i], e = pads[na + i], n = a->shape[ax];
    if (b < 0 || e < 0) { /* negative pads crop */
      int64_t s = b < 0 ? -b : 0, t = e < 0 ? n + e : n;
      if (s > t) return ox_err(x, "negative pads remove more than axis %lld holds", (long long)ax);
      a = ox_slice1(x, a, ax, s, t, 1);
      n = t - s;
      b = b < 0 ? 0 : b, e = e < 0 ? 0 : e;
    }
    if (!a || (b == 0 && e == 0)) continue;
    if (constant) {
      int64_t s[NOVA_MAX_RANK];
      memcpy(s, a->shape, sizeof s);
      nv_node at = {.axis = ax};
      if (b) {
        s[ax] = b;
        a = ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){ox_broadcast_to(x, value, r, s), a}, &at);
      }
      if (e && a) {
        s[ax] = e;
        a = ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){a, ox_broadcast_to(x, value, r, s)}, &at);
      }
      continue;
    }
    if (n == 0) return ox_err(x, "mode '%s' cannot pad an empty axis %lld", mode, (long long)ax);
    int64_t m = b + n + e;
    if (m > (INT64_C(1) << 28)) return ox_err(x, "the padded axis %lld is too long", (long long)ax);
    int64_t *v = nv_xmalloc((size_t)m * sizeof *v);
    if (!v) return -1;
    for (int64_t j = 0; j < m; j++) v[j] = pad_source(mode, j - b, n);
    a = ox_pick(x, a, ax, v, m);
    free(v);
  }
  return ox_set_out(out, a);
}

CV(cv_one_hot) { /* (wrap(i) == j) ? on : off along the new axis */
  (void)nout;
  if (ox_need(x, in, nin, 3, 3)) return -1;
  nv_node *idx = ox_N(x, in[0]), *vals = ox_N(x, in[2]);
  if (!idx || !vals) return -1;
  ox_tensor *own = in[1].k ? NULL : ox_initial_value(in[1]);
  const ox_tensor *dk = in[1].k ? in[1].k : own;
  if (!dk || ox_numel(dk) != 1) {
    ox_tensor_free(own);
    return ox_err(x, "depth must be a scalar known when compiling");
  }
  int64_t depth = fe_dtype_is_float(dk->dt) ? (int64_t)ox_getf(dk, 0) : ox_geti(dk, 0);
  ox_tensor_free(own);
  if (depth < 1 || depth > (INT64_C(1) << 24)) return ox_err(x, "depth %lld is out of range [1, 2^24]", (long long)depth);
  if (fe_numel(vals) != 2) return ox_err(x, "values must hold two elements [off, on]");
  int r = idx->rank + 1;
  if (r > NOVA_MAX_RANK) return ox_err(x, "the result rank exceeds %d", NOVA_MAX_RANK);
  int64_t axis = ox_attr_i(x, "axis", -1);
  if (ox_norm_axis(x, &axis, r)) return -1;
  if (idx->dtype != NOVA_DTYPE_I64) {
    nv_node at = {.to = NOVA_DTYPE_I64};
    idx = ox_add(x, NV_OP_CAST, 1, &idx, &at);
    if (!idx) return -1;
  }
  nv_node *w = ox_op3(x, NV_OP_WHERE, ox_op2(x, NV_OP_LESS, idx, ox_scalar(x, NOVA_DTYPE_I64, 0)),
                      ox_op2(x, NV_OP_ADD, idx, ox_scalar(x, NOVA_DTYPE_I64, (double)depth)), idx);
  int64_t s[NOVA_MAX_RANK], cs[NOVA_MAX_RANK];
  for (int i = 0, k = 0; i < r; i++) s[i] = i == axis ? 1 : idx->shape[k++], cs[i] = i == axis ? depth : 1;
  int64_t *v = nv_xmalloc((size_t)depth * sizeof *v);
  if (!v) return -1;
  for (int64_t j = 0; j < depth; j++) v[j] = j;
  nv_node *cls = ox_reshape(x, index_list(x, v, depth), r, cs);
  free(v);
  nv_node *hit = ox_op2(x, NV_OP_EQUAL, ox_reshape(x, w, r, s), cls);
  nv_node *flat = ox_reshape(x, vals, 1, (int64_t[]){2});
  nv_node *off = ox_reshape(x, ox_slice1(x, flat, 0, 0, 1, 1), 0, NULL), *on = ox_reshape(x, ox_slice1(x, flat, 0, 1, 2, 1), 0, NULL);
  return ox_set_out(out, ox_op3(x, NV_OP_WHERE, hit, on, off));
}

/* TopK by ranks: element i's rank is the number of elements before it in
 * the order (larger, or equal at a smaller index; smaller for largest=0);
 * output r takes the element of rank r.  O(n^2) compares along the axis. */
CV(cv_topk) {
  if (ox_need(x, in, nin, x->opset < 10 ? 1 : 2, x->opset < 10 ? 1 : 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t k, axis = ox_attr_i(x, "axis", -1);
  if (x->opset < 10) k = ox_attr_i(x, "k", -1);
  else if (ox_const_ints(x, in[1], "k", &k, 1) != 1) return -1;
  if (a->rank == 0 || ox_norm_axis(x, &axis, a->rank)) return a->rank ? -1 : ox_err(x, "input must have rank >= 1");
  int64_t n = a->shape[axis];
  if (k < 0 || k > n) return ox_err(x, "k = %lld is outside [0, %lld]", (long long)k, (long long)n);
  if (n > 4096) return ox_err(x, "TopK over an axis of %lld elements is not supported (at most 4096)", (long long)n);
  bool largest = ox_attr_i(x, "largest", 1) != 0;
  int r = a->rank;
  if (r + 1 > NOVA_MAX_RANK) return ox_err(x, "input rank %d is too large (at most %d)", r, NOVA_MAX_RANK - 1);
  /* the axis last: t [R..., n] */
  int64_t perm[NOVA_MAX_RANK], inv[NOVA_MAX_RANK];
  for (int i = 0, j = 0; i < r; i++)
    if (i != axis) perm[j++] = i;
  perm[r - 1] = axis;
  for (int i = 0; i < r; i++) inv[perm[i]] = i;
  nv_node *t = axis == r - 1 ? a : ox_transpose(x, a, perm);
  if (!t) return -1;
  int64_t sj[NOVA_MAX_RANK], si[NOVA_MAX_RANK];
  memcpy(sj, t->shape, sizeof sj);
  memcpy(si, t->shape, sizeof si);
  sj[r - 1] = n, sj[r] = 1, si[r - 1] = 1, si[r] = n;
  nv_node *xj = ox_reshape(x, t, r + 1, sj), *xi = ox_reshape(x, t, r + 1, si); /* [.., j, 1], [.., 1, i] */
  int64_t nn[2] = {n, n}, kn[2] = {k, n}, one_n[2] = {1, n};
  ox_tensor *lt = ox_tensor_new(NOVA_DTYPE_BOOL, 2, nn), *kr = ox_tensor_new(NOVA_DTYPE_I64, 2, kn);
  ox_tensor *io = ox_tensor_new(NOVA_DTYPE_I64, 2, one_n);
  if (!lt || !kr || !io) {
    ox_tensor_free(lt), ox_tensor_free(kr), ox_tensor_free(io);
    return -1;
  }
  for (int64_t j = 0; j < n; j++) {
    ox_set(io, j, (double)j, j);
    for (int64_t i = 0; i < n; i++) ox_set(lt, j * n + i, j < i, j < i);
  }
  for (int64_t q = 0; q < k; q++)
    for (int64_t i = 0; i < n; i++) ox_set(kr, q * n + i, (double)q, q);
  nv_node *jbefore = ox_N(x, (ox_val){.k = lt, .present = true}), *ranks = ox_N(x, (ox_val){.k = kr, .present = true});
  nv_node *iota = ox_N(x, (ox_val){.k = io, .present = true});
  ox_tensor_free(lt), ox_tensor_free(kr), ox_tensor_free(io);
  nv_node *ahead = ox_op2(x, largest ? NV_OP_GREATER : NV_OP_LESS, xj, xi);
  nv_node *before = ox_op2(x, NV_OP_OR, ahead, ox_op2(x, NV_OP_AND, ox_op2(x, NV_OP_EQUAL, xj, xi), jbefore));
  nv_node i64 = {.to = NOVA_DTYPE_I64};
  nv_node *cnt = before ? ox_add(x, NV_OP_CAST, 1, &before, &i64) : NULL;
  nv_node *rank = ox_reduce(x, NV_OP_REDUCE_SUM, cnt, 1, (int64_t[]){r - 1}, true); /* [.., 1, i] */
  nv_node *sel = ox_op2(x, NV_OP_EQUAL, rank, ranks);                              /* [.., k, i] */
  int64_t last = r;
  nv_node *vals = ox_reduce(x, NV_OP_REDUCE_SUM, ox_op3(x, NV_OP_WHERE, sel, xi, ox_scalar(x, a->dtype, 0)), 1, &last, false);
  nv_node *idx = ox_reduce(x, NV_OP_REDUCE_SUM, ox_op3(x, NV_OP_WHERE, sel, iota, ox_scalar(x, NOVA_DTYPE_I64, 0)), 1, &last, false);
  if (!vals || !idx) return -1;
  if (axis != r - 1) vals = ox_transpose(x, vals, inv), idx = ox_transpose(x, idx, inv);
  if (ox_set_out(out, vals)) return -1;
  if (nout > 1) out[1] = (ox_val){.node = idx, .present = idx != NULL};
  return idx ? 0 : -1;
}

/* Compress with a known condition: a gather of the positions it holds. */
CV(cv_compress) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  if (!in[1].k) return ox_err(x, "the condition must be known when compiling (the result's shape depends on it)");
  bool has_axis = ox_attr(x, "axis") != NULL;
  int64_t axis = ox_attr_i(x, "axis", 0);
  if (!has_axis) {
    int64_t e = fe_numel(a);
    a = ox_reshape(x, a, 1, &e);
    axis = 0;
  } else if (ox_norm_axis(x, &axis, a->rank))
    return -1;
  if (!a) return -1;
  int64_t n = ox_numel(in[1].k), dim = a->shape[axis], m = 0;
  if (n > dim) return ox_err(x, "the condition has %lld entries for an axis of %lld", (long long)n, (long long)dim);
  int64_t *v = nv_xmalloc((size_t)(n ? n : 1) * sizeof *v);
  if (!v) return -1;
  for (int64_t i = 0; i < n; i++)
    if (ox_geti(in[1].k, i)) v[m++] = i;
  nv_node *r = m ? ox_pick(x, a, axis, v, m) : ox_slice1(x, a, axis, 0, 0, 1);
  free(v);
  return ox_set_out(out, r);
}

const ox_op_entry ox_index_ops[] = {
    {"TopK", cv_topk}, {"Compress", cv_compress},
    {"GatherElements", cv_gather_elements}, {"ScatterElements", cv_scatter_elements}, {"GatherND", cv_gather_nd},
    {"ScatterND", cv_scatter_nd}, {"Scatter", cv_scatter_elements}, {"CumSum", cv_cumsum}, {"CumProd", cv_cumprod}, {"Tile", cv_tile}, {"Pad", cv_pad}, {"OneHot", cv_one_hot},
};
const size_t ox_index_nops = sizeof ox_index_ops / sizeof *ox_index_ops;
