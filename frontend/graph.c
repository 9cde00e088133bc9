/* graph.c: graph construction with dtype and shape inference per op.
 * Each op's rule checks its operands and says what was expected, naming the
 * shapes involved. */
#include "../support/util.h"
#include "graph.h"
#include "rt_init.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name;
  int min, max;
} op_table[] = {
#define X(e, n, a, b) {n, a, b},
    NV_OPS(X)
#undef X
};
static_assert(sizeof op_table / sizeof op_table[0] == NV_OP_COUNT, "op table out of step");

const char *nv_op_name(nv_op op) { return op < NV_OP_COUNT ? op_table[op].name : "?"; }
int nv_op_min_inputs(nv_op op) { return op_table[op].min; }
int nv_op_max_inputs(nv_op op) { return op_table[op].max; }

nv_op nv_op_lookup(const char *name) {
  for (int i = NV_OP_CONSTANT + 1; i < NV_OP_COUNT; i++)
    if (strcmp(op_table[i].name, name) == 0) return (nv_op)i;
  return NV_OP_COUNT;
}

nv_graph *fe_graph_create(void) { return nv_xcalloc(1, sizeof(nv_graph)); }

void fe_graph_destroy(nv_graph *g) {
  if (!g) return;
  for (int i = 0; i < g->nnodes; i++) {
    nv_node *n = g->nodes[i];
    free(n->name);
    free(n->in);
    free(n->init.path);
    free(n->init.data);
    free(n);
  }
  for (int i = 0; i < g->noutputs; i++) free(g->outputs[i].name);
  for (int i = 0; i < g->ninits; i++) free(g->inits[i].name), free(g->inits[i].reason);
  free(g->inits);
  free(g->comm.buckets);
  free(g->nodes);
  free(g->outputs);
  free(g);
}

int64_t fe_numel(const nv_node *n) {
  int64_t e = 1;
  for (int i = 0; i < n->rank; i++) e *= n->shape[i];
  return e;
}

const char *fe_dtype_name(nova_dtype dt) {
  switch (dt) {
  case NOVA_DTYPE_F32: return "f32";
  case NOVA_DTYPE_F64: return "f64";
  case NOVA_DTYPE_I32: return "i32";
  case NOVA_DTYPE_I64: return "i64";
  case NOVA_DTYPE_BOOL: return "bool";
  case NOVA_DTYPE_F16: return "f16";
  case NOVA_DTYPE_BF16: return "bf16";
  case NOVA_DTYPE_I8: return "i8";
  case NOVA_DTYPE_U8: return "u8";
  case NOVA_DTYPE_I16: return "i16";
  case NOVA_DTYPE_U16: return "u16";
  case NOVA_DTYPE_U32: return "u32";
  case NOVA_DTYPE_U64: return "u64";
  }
  return "?";
}

size_t fe_dtype_size(nova_dtype dt) {
  switch (dt) {
  case NOVA_DTYPE_F32: case NOVA_DTYPE_I32: case NOVA_DTYPE_U32: return 4;
  case NOVA_DTYPE_F64: case NOVA_DTYPE_I64: case NOVA_DTYPE_U64: return 8;
  case NOVA_DTYPE_BOOL: case NOVA_DTYPE_I8: case NOVA_DTYPE_U8: return 1;
  case NOVA_DTYPE_F16: case NOVA_DTYPE_BF16: case NOVA_DTYPE_I16: case NOVA_DTYPE_U16: return 2;
  }
  return 0;
}

nova_dtype fe_dtype_parse(const char *s) {
  static const nova_dtype all[] = {NOVA_DTYPE_F32, NOVA_DTYPE_F64, NOVA_DTYPE_I32, NOVA_DTYPE_I64, NOVA_DTYPE_F16,
                                   NOVA_DTYPE_BF16, NOVA_DTYPE_I8,  NOVA_DTYPE_I16, NOVA_DTYPE_U8,  NOVA_DTYPE_U16,
                                   NOVA_DTYPE_U32, NOVA_DTYPE_U64};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (strcmp(s, fe_dtype_name(all[i])) == 0) return all[i];
  return (nova_dtype)0;
}

bool fe_dtype_is_float(nova_dtype dt) {
  return dt == NOVA_DTYPE_F32 || dt == NOVA_DTYPE_F64 || dt == NOVA_DTYPE_F16 || dt == NOVA_DTYPE_BF16;
}
bool fe_dtype_is_half(nova_dtype dt) { return dt == NOVA_DTYPE_F16 || dt == NOVA_DTYPE_BF16; }
bool fe_dtype_is_unsigned(nova_dtype dt) {
  return dt == NOVA_DTYPE_U8 || dt == NOVA_DTYPE_U16 || dt == NOVA_DTYPE_U32 || dt == NOVA_DTYPE_U64;
}
bool fe_dtype_is_int(nova_dtype dt) {
  return dt == NOVA_DTYPE_I32 || dt == NOVA_DTYPE_I64 || dt == NOVA_DTYPE_I8 || dt == NOVA_DTYPE_I16 ||
         fe_dtype_is_unsigned(dt);
}
bool fe_dtype_is_index(nova_dtype dt) { return dt == NOVA_DTYPE_I32 || dt == NOVA_DTYPE_I64; }

/* IEEE binary16 (5 exponent, 10 fraction bits) and bfloat16 (8, 7), by
 * rounding the double v to nearest, ties to even: the scaled magnitude is
 * rounded with nearbyint (the default rounding mode) at the spacing of v's
 * binade, which is exact in double for every binade of these formats. */
uint16_t fe_half_from_double(nova_dtype dt, double v) { return rt_half_from_double(dt, v); }

double fe_half_to_double(nova_dtype dt, uint16_t h) {
  int mant = dt == NOVA_DTYPE_BF16 ? 7 : 10, ebits = dt == NOVA_DTYPE_BF16 ? 8 : 5;
  int bias = (1 << (ebits - 1)) - 1;
  int ex = (h >> mant) & ((1 << ebits) - 1);
  double f = (double)(h & ((1u << mant) - 1)), s = h & 0x8000 ? -1.0 : 1.0;
  if (ex == (1 << ebits) - 1) return f ? NAN : s * INFINITY;
  if (ex == 0) return s * ldexp(f, 1 - bias - mant);
  return s * ldexp(f + ldexp(1.0, mant), ex - bias - mant);
}

const char *fe_shape_str(char *buf, size_t size, int rank, const int64_t *shape) {
  size_t n = 0;
  n += (size_t)snprintf(buf + n, size - n, "[");
  for (int i = 0; i < rank && n < size; i++)
    n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? "," : "", (long long)shape[i]);
  if (n < size) snprintf(buf + n, size - n, "]");
  return buf;
}

#define SHP(n) fe_shape_str((char[160]){0}, 160, (n)->rank, (n)->shape)

static nv_node *push(nv_graph *g, nv_node *n) {
  if (g->nnodes == g->capnodes) {
    int cap = g->capnodes ? 2 * g->capnodes : 64;
    nv_node **p = nv_xrealloc(g->nodes, (size_t)cap * sizeof *p);
    if (!p) return NULL;
    g->nodes = p;
    g->capnodes = cap;
  }
  n->id = g->nnodes;
  g->nodes[g->nnodes++] = n;
  return n;
}

static void free_node(nv_node *n) {
  free(n->name);
  free(n->in);
  free(n);
}

/* Checks a shape (dims >= 0, element count bounded) and sets it on n. */
static int set_shape(nv_diag *d, nv_node *n, int rank, const int64_t *shape) {
  if (rank < 0 || rank > NOVA_MAX_RANK) {
    nv_error(d, n->loc, "%s: rank %d exceeds the maximum of %d", nv_op_name(n->op), rank,
             NOVA_MAX_RANK);
    return -1;
  }
  int64_t e = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0 || (shape[i] == 0 && !n->allow_empty)) {
      nv_error(d, n->loc, "%s: dimension %d is %lld; dimensions must be positive",
               nv_op_name(n->op), i, (long long)shape[i]);
      return -1;
    }
    if (shape[i] > NV_MAX_NUMEL || (shape[i] && e > NV_MAX_NUMEL / shape[i])) {
      nv_error(d, n->loc, "%s: tensor of shape %s is too large (more than 2^34 elements)",
               nv_op_name(n->op), fe_shape_str((char[160]){0}, 160, rank, shape));
      return -1;
    }
    e *= shape[i];
  }
  n->rank = rank;
  if (rank) memcpy(n->shape, shape, (size_t)rank * sizeof *shape);
  return 0;
}

int fe_rng_state(nv_graph *g, nv_diag *d, nv_loc loc, nv_node **seed, nv_node **step) {
  *seed = *step = NULL;
  for (int i = 0; i < g->nnodes; i++) {
    nv_node *n = g->nodes[i];
    if (n->name && n->op == NV_OP_INPUT && !strcmp(n->name, "rng.seed")) *seed = n;
    if (n->name && n->op == NV_OP_PARAM && !strcmp(n->name, "rng.step")) *step = n;
  }
  if (*seed && *step) return 0;
  *seed = fe_graph_leaf(g, d, NV_OP_INPUT, "rng.seed", NOVA_DTYPE_I64, 0, NULL, loc);
  *step = fe_graph_leaf(g, d, NV_OP_PARAM, "rng.step", NOVA_DTYPE_I64, 0, NULL, loc);
  if (!*seed || !*step) return -1;
  (*seed)->has_default = true;
  (*seed)->init = (nv_init){.kind = NV_INIT_CONST, .a = 0};
  (*step)->role = NOVA_ROLE_BUFFER;
  (*step)->frozen = true;
  (*step)->init.kind = NV_INIT_ZEROS;
  return 1;
}

nv_node *fe_graph_leaf(nv_graph *g, nv_diag *d, nv_op op, const char *name, nova_dtype dt,
                       int rank, const int64_t *shape, nv_loc loc) {
  nv_node *n = nv_xcalloc(1, sizeof *n);
  if (!n) return NULL;
  n->op = op;
  n->loc = loc;
  n->dtype = dt;
  n->name = name ? nv_xstrdup(name) : NULL;
  n->role = op == NV_OP_PARAM ? NOVA_ROLE_PARAM : NOVA_ROLE_INPUT;
  n->init.kind = NV_INIT_ZEROS;
  n->allow_empty = g->allow_empty;
  if (set_shape(d, n, rank, shape) != 0 || !push(g, n)) {
    free_node(n);
    return NULL;
  }
  return n;
}

static int need_float(nv_diag *d, nv_node *n, const nv_node *x, const char *what) {
  if (fe_dtype_is_float(x->dtype)) return 0;
  nv_error(d, n->loc, "%s: %s must be a floating-point tensor (f32, f64, f16 or bf16), got %s",
           nv_op_name(n->op), what, fe_dtype_name(x->dtype));
  return -1;
}

/* Arithmetic takes floats and integers (not bool). */
static int need_number(nv_diag *d, nv_node *n, const nv_node *x, const char *what) {
  if (fe_dtype_is_float(x->dtype) || fe_dtype_is_int(x->dtype)) return 0;
  nv_error(d, n->loc, "%s: %s must be a number tensor, got %s", nv_op_name(n->op), what, fe_dtype_name(x->dtype));
  return -1;
}

static int norm_axis(nv_diag *d, nv_node *n, int64_t *axis, int rank) {
  if (*axis < -rank || *axis >= (rank ? rank : 1)) {
    nv_error(d, n->loc, "%s: axis %lld is out of range for rank %d", nv_op_name(n->op),
             (long long)*axis, rank);
    return -1;
  }
  if (*axis < 0) *axis += rank;
  return 0;
}

/* numpy broadcasting of a and b into out. */
static int infer_broadcast(nv_diag *d, nv_node *n, const nv_node *a, const nv_node *b) {
  if (a->dtype != b->dtype) {
    nv_error(d, n->loc, "%s: operand dtypes differ: %s and %s", nv_op_name(n->op),
             fe_dtype_name(a->dtype), fe_dtype_name(b->dtype));
    return -1;
  }
  int r = a->rank > b->rank ? a->rank : b->rank;
  int64_t s[NOVA_MAX_RANK];
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      nv_error(d, n->loc, "%s: shapes %s and %s cannot be broadcast together (dimension %d: %lld vs %lld)",
               nv_op_name(n->op), SHP(a), SHP(b), i, (long long)da, (long long)db);
      return -1;
    }
    s[i] = da == 1 ? db : da;
  }
  n->dtype = a->dtype;
  return set_shape(d, n, r, s);
}

static int infer_matmul(nv_diag *d, nv_node *n, const nv_node *a, const nv_node *b) {
  if (need_float(d, n, a, "left operand") || need_float(d, n, b, "right operand")) return -1;
  if (a->dtype != b->dtype) {
    nv_error(d, n->loc, "matmul: operand dtypes differ: %s and %s", fe_dtype_name(a->dtype),
             fe_dtype_name(b->dtype));
    return -1;
  }
  if (a->rank < 2 || b->rank < 2) {
    nv_error(d, n->loc, "matmul: operands must have rank >= 2, got %s x %s", SHP(a), SHP(b));
    return -1;
  }
  if (b->rank != 2 && b->rank != a->rank) {
    nv_error(d, n->loc, "matmul: right operand must have rank 2 or the left operand's rank %d, got %s",
             a->rank, SHP(b));
    return -1;
  }
  int64_t k = a->shape[a->rank - 1], kb = b->shape[b->rank - 2];
  if (k != kb) {
    nv_error(d, n->loc, "matmul: inner dimensions differ: %s x %s (%lld vs %lld)", SHP(a), SHP(b),
             (long long)k, (long long)kb);
    return -1;
  }
  for (int i = 0; b->rank > 2 && i < a->rank - 2; i++)
    if (a->shape[i] != b->shape[i]) {
      nv_error(d, n->loc, "matmul: batch dimensions differ: %s x %s", SHP(a), SHP(b));
      return -1;
    }
  int64_t s[NOVA_MAX_RANK];
  memcpy(s, a->shape, sizeof s);
  s[a->rank - 1] = b->shape[b->rank - 1];
  n->dtype = a->dtype;
  return set_shape(d, n, a->rank, s);
}

/* Reductions: axes (empty = all), keepdims. */
static int infer_reduce(nv_diag *d, nv_node *n, const nv_node *x) {
  if (n->op == NV_OP_REDUCE_MEAN ? need_float(d, n, x, "operand") : need_number(d, n, x, "operand")) return -1;
  bool red[NOVA_MAX_RANK] = {0};
  if (n->nlist == 0) {
    n->nlist = x->rank;
    for (int i = 0; i < x->rank; i++) n->list[i] = i;
  }
  for (int i = 0; i < n->nlist; i++) {
    if (norm_axis(d, n, &n->list[i], x->rank)) return -1;
    if (red[n->list[i]]) {
      nv_error(d, n->loc, "%s: axis %lld listed twice", nv_op_name(n->op), (long long)n->list[i]);
      return -1;
    }
    red[n->list[i]] = true;
  }
  /* keep axes sorted: the lowering relies on it */
  for (int i = 0, j = 0; i < x->rank; i++)
    if (red[i]) n->list[j++] = i;
  int64_t s[NOVA_MAX_RANK];
  int r = 0;
  for (int i = 0; i < x->rank; i++)
    if (!red[i]) s[r++] = x->shape[i];
    else if (n->keepdims) s[r++] = 1;
  n->dtype = x->dtype;
  return set_shape(d, n, r, s);
}

static int infer_reshape(nv_diag *d, nv_node *n, const nv_node *x) {
  int64_t s[NOVA_MAX_RANK], known = 1;
  int infer = -1;
  for (int i = 0; i < n->nlist; i++) {
    s[i] = n->list[i];
    if (s[i] == -1 && infer < 0) infer = i;
    else if (s[i] == 0 && n->allow_empty)
      known = 0;
    else if (s[i] <= 0) {
      nv_error(d, n->loc, "reshape: target dimension %d is %lld (use positive sizes and at most one -1)",
               i, (long long)s[i]);
      return -1;
    } else if (known > NV_MAX_NUMEL / s[i]) {
      nv_error(d, n->loc, "reshape: target shape is too large");
      return -1;
    } else
      known *= s[i];
  }
  int64_t e = fe_numel(x);
  if (infer >= 0) {
    if (known == 0) {
      nv_error(d, n->loc, "reshape: cannot infer the -1 dimension of an empty target shape");
      return -1;
    }
    if (e % known) {
      nv_error(d, n->loc, "reshape: cannot infer the -1 dimension: %lld elements of %s do not divide by %lld",
               (long long)e, SHP(x), (long long)known);
      return -1;
    }
    s[infer] = e / known;
    known = e;
  }
  if (known != e) {
    nv_error(d, n->loc, "reshape: %s has %lld elements, target %s has %lld", SHP(x), (long long)e,
             fe_shape_str((char[160]){0}, 160, n->nlist, s), (long long)known);
    return -1;
  }
  memcpy(n->list, s, sizeof s);
  n->dtype = x->dtype;
  return set_shape(d, n, n->nlist, s);
}

static int infer_transpose(nv_diag *d, nv_node *n, const nv_node *x) {
  if (n->nlist == 0) {
    n->nlist = x->rank;
    for (int i = 0; i < x->rank; i++) n->list[i] = x->rank - 1 - i;
  }
  if (n->nlist != x->rank) {
    nv_error(d, n->loc, "transpose: perm has %d entries for an operand of rank %d %s", n->nlist,
             x->rank, SHP(x));
    return -1;
  }
  bool seen[NOVA_MAX_RANK] = {0};
  int64_t s[NOVA_MAX_RANK];
  for (int i = 0; i < n->nlist; i++) {
    int64_t p = n->list[i];
    if (p < 0 || p >= x->rank || seen[p]) {
      nv_error(d, n->loc, "transpose: perm is not a permutation of 0..%d", x->rank - 1);
      return -1;
    }
    seen[p] = true;
    s[i] = x->shape[p];
  }
  n->dtype = x->dtype;
  return set_shape(d, n, x->rank, s);
}

static int infer_broadcast_to(nv_diag *d, nv_node *n, const nv_node *x) {
  if (n->nlist < x->rank) {
    nv_error(d, n->loc, "broadcast: target rank %d is below the operand's rank (%s)", n->nlist, SHP(x));
    return -1;
  }
  for (int i = 0; i < x->rank; i++) {
    int64_t dx = x->shape[i], dt = n->list[n->nlist - x->rank + i];
    if (dx != dt && dx != 1) {
      nv_error(d, n->loc, "broadcast: %s cannot be broadcast to %s", SHP(x),
               fe_shape_str((char[160]){0}, 160, n->nlist, n->list));
      return -1;
    }
  }
  n->dtype = x->dtype;
  return set_shape(d, n, n->nlist, n->list);
}

static int infer_concat(nv_diag *d, nv_node *n) {
  const nv_node *x = n->in[0];
  if (x->rank == 0) {
    nv_error(d, n->loc, "concat: operands must have rank >= 1");
    return -1;
  }
  if (norm_axis(d, n, &n->axis, x->rank)) return -1;
  int64_t s[NOVA_MAX_RANK];
  memcpy(s, x->shape, sizeof s);
  for (int i = 1; i < n->nin; i++) {
    const nv_node *y = n->in[i];
    bool ok = y->rank == x->rank && y->dtype == x->dtype;
    for (int j = 0; ok && j < x->rank; j++) ok = j == n->axis || y->shape[j] == x->shape[j];
    if (!ok) {
      nv_error(d, n->loc, "concat: operand %d is %s %s, operand 0 is %s %s (must agree except on axis %lld)",
               i, fe_dtype_name(y->dtype), SHP(y), fe_dtype_name(x->dtype), SHP(x),
               (long long)n->axis);
      return -1;
    }
    s[n->axis] += y->shape[n->axis];
  }
  n->dtype = x->dtype;
  return set_shape(d, n, x->rank, s);
}

static int infer_slice(nv_diag *d, nv_node *n, const nv_node *x) {
  if (norm_axis(d, n, &n->axis, x->rank)) return -1;
  int64_t dim = x->shape[n->axis];
  if (n->start < 0) n->start += dim;
  if (n->end < 0) n->end += dim;
  if (n->end > dim && n->end != INT64_MAX) goto bad;
  if (n->end == INT64_MAX) n->end = dim;
  if (n->step <= 0) {
    nv_error(d, n->loc, "slice: step must be positive, got %lld", (long long)n->step);
    return -1;
  }
  if (n->start < 0 || n->end > dim || n->start > n->end || (n->start == n->end && !n->allow_empty)) goto bad;
  int64_t s[NOVA_MAX_RANK];
  memcpy(s, x->shape, sizeof s);
  s[n->axis] = n->end > n->start ? (n->end - n->start - 1) / n->step + 1 : 0; /* no overflow for any step > 0 */
  n->dtype = x->dtype;
  return set_shape(d, n, x->rank, s);
bad:
  nv_error(d, n->loc, "slice: range [%lld, %lld) is empty or outside axis %lld of %s",
           (long long)n->start, (long long)n->end, (long long)n->axis, SHP(x));
  return -1;
}

/* Integer tensors only come from inputs, through data-movement ops (integer
 * arithmetic is not allowed), so the inputs an index tensor is made of are
 * found by walking back; each gets the tightest bound any use needs, and
 * the step checks them at run time. */
/* A rank-0 (or one-element) integer constant's value. */
static bool const_int(const nv_node *n, int64_t *v) {
  if (n->op != NV_OP_CONSTANT || !fe_dtype_is_index(n->dtype) || fe_numel(n) != 1) return false;
  if (n->init.kind == NV_INIT_CONST) *v = (int64_t)n->init.a;
  else if (n->init.kind == NV_INIT_ZEROS) *v = 0;
  else if (n->init.kind == NV_INIT_DATA && n->init.data)
    *v = n->dtype == NOVA_DTYPE_I64 ? *(const int64_t *)n->init.data : *(const int32_t *)n->init.data;
  else return false;
  return true;
}

/* min(max(e, lo), hi) with constant lo, hi inside [lower, bound): in range
 * whatever e is (indices the frontend computes and clamps, as GridSample's). */
static bool clamped_into(const nv_node *n, int64_t lower, int64_t bound) {
  int64_t hi, lo;
  if (n->op != NV_OP_MINIMUM || !const_int(n->in[1], &hi) || hi >= bound) return false;
  const nv_node *m = n->in[0];
  return m->op == NV_OP_MAXIMUM && const_int(m->in[1], &lo) && lo >= lower && lo <= hi;
}

static const nv_node *mark_index_bound(nv_node *n, int64_t bound, bool neg) {
  if (clamped_into(n, neg ? -bound : 0, bound)) return NULL;
  switch (n->op) {
  case NV_OP_INPUT:
    n->has_index_skip = false; /* an index use: no value outside the range */
    n->index_negative = (n->index_bound == 0 || n->index_negative) && neg;
    if (n->index_bound == 0 || bound < n->index_bound) n->index_bound = bound;
    return NULL;
  case NV_OP_RESHAPE:
  case NV_OP_TRANSPOSE:
  case NV_OP_SLICE:
  case NV_OP_BROADCAST:
  case NV_OP_GATHER: /* the values are those of the data operand */
  case NV_OP_GATHER_ELEMENTS:
  case NV_OP_GATHER_ND:
    return mark_index_bound(n->in[0], bound, neg);
  case NV_OP_CONCAT:
    for (int i = 0; i < n->nin; i++) {
      const nv_node *bad = mark_index_bound(n->in[i], bound, neg);
      if (bad) return bad;
    }
    return NULL;
  case NV_OP_WHERE: {
    const nv_node *bad = mark_index_bound(n->in[1], bound, neg);
    return bad ? bad : mark_index_bound(n->in[2], bound, neg);
  }
  case NV_OP_CONSTANT: /* known now: check every value */
    if (n->init.kind == NV_INIT_DATA && fe_dtype_is_index(n->dtype)) {
      for (int64_t i = 0, e = fe_numel(n); i < e; i++) {
        int64_t v = n->dtype == NOVA_DTYPE_I64 ? ((const int64_t *)n->init.data)[i] : ((const int32_t *)n->init.data)[i];
        if (v < (neg ? -bound : 0) || v >= bound) return n;
      }
      return NULL;
    }
    return n;
  default:
    return n; /* computed at run time: cannot be checked before the step runs */
  }
}

static int label_walk(nv_diag *d, nv_node *n, int64_t C, bool has_ii, int64_t ii, nv_loc loc) {
  switch (n->op) {
  case NV_OP_INPUT:
    if (n->index_bound == 0) { /* its only index use so far */
      n->index_bound = C, n->has_index_skip = has_ii, n->index_skip = ii;
    } else if (n->has_index_skip && (!has_ii || ii != n->index_skip || C != n->index_bound)) {
      n->has_index_skip = false; /* uses that disagree: the tightest, no exception */
      if (C < n->index_bound) n->index_bound = C;
    } else if (C < n->index_bound)
      n->index_bound = C;
    if (n->op == NV_OP_INPUT && n->role == NOVA_ROLE_INPUT) n->role = NOVA_ROLE_LABEL;
    return 0;
  case NV_OP_RESHAPE: case NV_OP_TRANSPOSE: case NV_OP_SLICE: case NV_OP_BROADCAST: case NV_OP_GATHER: case NV_OP_CAST:
    return label_walk(d, n->in[0], C, has_ii, ii, loc);
  case NV_OP_CONCAT:
    for (int i = 0; i < n->nin; i++)
      if (label_walk(d, n->in[i], C, has_ii, ii, loc)) return -1;
    return 0;
  case NV_OP_CONSTANT:
    if (n->init.kind == NV_INIT_DATA && fe_dtype_is_index(n->dtype))
      for (int64_t i = 0, e = fe_numel(n); i < e; i++) {
        int64_t v = n->dtype == NOVA_DTYPE_I64 ? ((const int64_t *)n->init.data)[i] : ((const int32_t *)n->init.data)[i];
        if ((v < 0 || v >= C) && !(has_ii && v == ii)) {
          nv_error(d, loc, "constant class label %lld is outside [0, %lld)%s", (long long)v, (long long)C,
                   has_ii ? " and is not the ignore_index" : "");
          return -1;
        }
      }
    return 0;
  default:
    return 0;
  }
}

int fe_mark_labels(nv_diag *d, nv_node *labels, int64_t classes, bool has_ii, int64_t ii, nv_loc loc) {
  return labels ? label_walk(d, labels, classes, has_ii, ii, loc) : 0;
}

/* Marks the bound, or reports that the indices are computed. */
static int index_operand(nv_diag *d, nv_node *user, nv_node *idx, int64_t bound, bool neg) {
  const nv_node *bad = mark_index_bound(idx, bound, neg);
  if (!bad) return 0;
  if (bad->op == NV_OP_CONSTANT) {
    nv_error(d, user->loc, "%s: constant indices hold a value outside [0, %lld)", nv_op_name(user->op), (long long)bound);
    return -1;
  }
  nv_error(d, user->loc, "%s: indices computed at run time (by '%s') cannot be range-checked; indices must come "
           "from inputs through data-movement ops (reshape, transpose, slice, concat, gather, where)",
           nv_op_name(user->op), nv_op_name(bad->op));
  return -1;
}

static int infer_gather(nv_diag *d, nv_node *n, const nv_node *x, nv_node *idx) {
  if (!fe_dtype_is_index(idx->dtype)) {
    nv_error(d, n->loc, "gather: indices must be i32 or i64, got %s", fe_dtype_name(idx->dtype));
    return -1;
  }
  if (x->rank == 0 || norm_axis(d, n, &n->axis, x->rank)) {
    if (x->rank == 0) nv_error(d, n->loc, "gather: data must have rank >= 1");
    return -1;
  }
  int r = x->rank - 1 + idx->rank;
  if (r > NOVA_MAX_RANK) {
    nv_error(d, n->loc, "gather: result rank %d exceeds %d", r, NOVA_MAX_RANK);
    return -1;
  }
  int64_t s[NOVA_MAX_RANK];
  int k = 0;
  for (int i = 0; i < n->axis; i++) s[k++] = x->shape[i];
  for (int i = 0; i < idx->rank; i++) s[k++] = idx->shape[i];
  for (int i = (int)n->axis + 1; i < x->rank; i++) s[k++] = x->shape[i];
  if (index_operand(d, n, idx, x->shape[n->axis], n->index_negative)) return -1;
  n->dtype = x->dtype;
  return set_shape(d, n, r, s);
}

/* dropout(x, seed, step): like x; the seed and the step are i64 scalars,
 * the ratio in [0, 1), the elements numbered below 2^32 (lower_rng.c). */
static int infer_dropout(nv_diag *d, nv_node *n, const nv_node *x, const nv_node *seed, const nv_node *step) {
  if (need_float(d, n, x, "operand")) return -1;
  if (seed->dtype != NOVA_DTYPE_I64 || seed->rank || step->dtype != NOVA_DTYPE_I64 || step->rank) {
    nv_error(d, n->loc, "dropout: the seed and the step must be i64 scalars");
    return -1;
  }
  if (!(n->value >= 0 && n->value < 1) || fe_numel(x) > (INT64_C(1) << 32)) {
    nv_error(d, n->loc, "dropout: ratio %g outside [0, 1), or more than 2^32 elements", n->value);
    return -1;
  }
  n->dtype = x->dtype;
  return set_shape(d, n, x->rank, x->shape);
}

/* stochastic_round(x, seed, step) {axis: stream}: f32 x rounded to bf16,
 * up or down with the probabilities that make the rounding unbiased
 * (--bf16-master=none's parameter updates, codegen/lower_rng.c). */
static int infer_sround(nv_diag *d, nv_node *n, const nv_node *x, const nv_node *seed, const nv_node *step) {
  if (x->dtype != NOVA_DTYPE_F32) {
    nv_error(d, n->loc, "stochastic_round: the operand must be f32, got %s", fe_dtype_name(x->dtype));
    return -1;
  }
  if (seed->dtype != NOVA_DTYPE_I64 || seed->rank || step->dtype != NOVA_DTYPE_I64 || step->rank) {
    nv_error(d, n->loc, "stochastic_round: the seed and the step must be i64 scalars");
    return -1;
  }
  if (fe_numel(x) > (INT64_C(1) << 32)) {
    nv_error(d, n->loc, "stochastic_round: more than 2^32 elements");
    return -1;
  }
  n->dtype = NOVA_DTYPE_BF16;
  return set_shape(d, n, x->rank, x->shape);
}

static int infer_cross_entropy(nv_diag *d, nv_node *n, const nv_node *logits, nv_node *labels) {
  if (need_float(d, n, logits, "logits")) return -1;
  if (!fe_dtype_is_index(labels->dtype)) {
    nv_error(d, n->loc, "cross_entropy: labels must be i32 or i64 class indices, got %s",
             fe_dtype_name(labels->dtype));
    return -1;
  }
  bool ok = logits->rank >= 1 && labels->rank == logits->rank - 1;
  for (int i = 0; ok && i < labels->rank; i++) ok = labels->shape[i] == logits->shape[i];
  if (!ok) {
    nv_error(d, n->loc, "cross_entropy: labels %s must have the shape of logits %s without its last (class) axis",
             SHP(labels), SHP(logits));
    return -1;
  }
  if (index_operand(d, n, labels, logits->shape[logits->rank - 1], false)) return -1;
  if (labels->op == NV_OP_INPUT) labels->role = NOVA_ROLE_LABEL;
  n->dtype = logits->dtype;
  return set_shape(d, n, 0, NULL);
}

static int infer_layer_norm(nv_diag *d, nv_node *n, const nv_node *x, const nv_node *g, const nv_node *b) {
  if (need_float(d, n, x, "operand")) return -1;
  if (x->rank < 1) {
    nv_error(d, n->loc, "layer_norm: operand must have rank >= 1");
    return -1;
  }
  int64_t c = x->shape[x->rank - 1];
  const nv_node *pb[2] = {g, b};
  for (int i = 0; i < 2; i++)
    if (pb[i]->rank != 1 || pb[i]->shape[0] != c || pb[i]->dtype != x->dtype) {
      nv_error(d, n->loc, "layer_norm: %s must be %s[%lld] (the last axis of %s), got %s %s",
               i ? "bias" : "scale", fe_dtype_name(x->dtype), (long long)c, SHP(x),
               fe_dtype_name(pb[i]->dtype), SHP(pb[i]));
      return -1;
    }
  if (!(n->eps > 0)) {
    nv_error(d, n->loc, "layer_norm: eps must be positive");
    return -1;
  }
  n->dtype = x->dtype;
  return set_shape(d, n, x->rank, x->shape);
}

/* attention(q [B, Hq, S, D], k [B, Hk, T, D], v [B, Hk, T, Dv], bias) ->
 * [B, Hq, S, Dv]: softmax(scale q k^T (capped), + bias) v over the keys; query
 * head h reads KV head h / (Hq / Hk) (grouped-query attention); bias
 * broadcasts (numpy) to [B, Hq, S, T]; rows with every key at -inf are 0. */
static int infer_attention(nv_diag *d, nv_node *n, nv_node *const *in) {
  const nv_node *q = in[0], *k = in[1], *v = in[2], *b = in[3];
  static const char *const what[4] = {"q", "k", "v", "bias"};
  for (int i = 0; i < 4; i++) {
    if (need_float(d, n, in[i], what[i])) return -1;
    if (in[i]->dtype != q->dtype) {
      nv_error(d, n->loc, "attention: %s is %s; q is %s", what[i], fe_dtype_name(in[i]->dtype), fe_dtype_name(q->dtype));
      return -1;
    }
  }
  if (q->rank != 4 || k->rank != 4 || v->rank != 4) {
    nv_error(d, n->loc, "attention: q, k and v must be [batch, heads, sequence, head size], got %s, %s, %s", SHP(q),
             SHP(k), SHP(v));
    return -1;
  }
  if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[3] != q->shape[3] ||
      v->shape[1] != k->shape[1] || v->shape[2] != k->shape[2] || q->shape[1] % k->shape[1]) {
    nv_error(d, n->loc, "attention: q %s, k %s and v %s do not match: expected [B, Hq, S, D], [B, Hk, T, D], "
             "[B, Hk, T, Dv] with Hk dividing Hq", SHP(q), SHP(k), SHP(v));
    return -1;
  }
  int64_t st[4] = {q->shape[0], q->shape[1], q->shape[2], k->shape[2]};
  bool ok = b->rank <= 4;
  for (int i = 0; ok && i < b->rank; i++) ok = b->shape[i] == 1 || b->shape[i] == st[i + 4 - b->rank];
  if (!ok) {
    nv_error(d, n->loc, "attention: bias %s does not broadcast to the scores %s", SHP(b),
             fe_shape_str((char[160]){0}, 160, 4, st));
    return -1;
  }
  if (isnan(n->scale)) n->scale = 1 / sqrt((double)q->shape[3]);
  if (!isfinite(n->scale) || !(n->softcap >= 0) || !isfinite(n->softcap)) {
    nv_error(d, n->loc, "attention: scale must be finite and softcap finite and >= 0 (0: none)");
    return -1;
  }
  int64_t s[4] = {q->shape[0], q->shape[1], q->shape[2], v->shape[3]};
  n->dtype = q->dtype;
  return set_shape(d, n, 4, s);
}

/* rms_norm(x [..., C], scale [C]): x / sqrt(mean(x^2 over the last axis) + eps) * scale. */
static int infer_rms_norm(nv_diag *d, nv_node *n, const nv_node *x, const nv_node *g) {
  if (need_float(d, n, x, "operand")) return -1;
  if (x->rank < 1) {
    nv_error(d, n->loc, "rms_norm: operand must have rank >= 1");
    return -1;
  }
  int64_t c = x->shape[x->rank - 1];
  if (g->rank != 1 || g->shape[0] != c || g->dtype != x->dtype) {
    nv_error(d, n->loc, "rms_norm: scale must be %s[%lld] (the last axis of %s), got %s %s", fe_dtype_name(x->dtype),
             (long long)c, SHP(x), fe_dtype_name(g->dtype), SHP(g));
    return -1;
  }
  if (!(n->eps >= 0) || isinf(n->eps)) {
    nv_error(d, n->loc, "rms_norm: eps must be finite and >= 0, got %g", n->eps);
    return -1;
  }
  n->dtype = x->dtype;
  return set_shape(d, n, x->rank, x->shape);
}

/* rotary(x [..., D], cos [..., D/2], sin [..., D/2]): D even; cos and sin
 * have x's dtype and rank, and each of their other dims is 1 or x's. */
static int infer_rotary(nv_diag *d, nv_node *n, const nv_node *x, const nv_node *c, const nv_node *s) {
  if (need_float(d, n, x, "operand")) return -1;
  if (x->rank < 1 || x->rank >= NOVA_MAX_RANK || x->shape[x->rank - 1] % 2) { /* the lowering adds a loop */
    nv_error(d, n->loc, "rotary: operand %s must have a rank from 1 to %d and an even last dimension", SHP(x),
             NOVA_MAX_RANK - 1);
    return -1;
  }
  if (n->mode != 0 && n->mode != 1) {
    nv_error(d, n->loc, "rotary: interleaved must be 0 or 1, got %lld", (long long)n->mode);
    return -1;
  }
  int r = x->rank;
  const nv_node *cs[2] = {c, s};
  for (int k = 0; k < 2; k++) {
    bool ok = cs[k]->dtype == x->dtype && cs[k]->rank == r && cs[k]->shape[r - 1] == x->shape[r - 1] / 2;
    for (int i = 0; ok && i < r - 1; i++) ok = cs[k]->shape[i] == 1 || cs[k]->shape[i] == x->shape[i];
    if (!ok) {
      nv_error(d, n->loc, "rotary: %s %s %s must be %s of rank %d, last dimension %lld (half of %s's), each other "
               "dimension 1 or x's", k ? "sin" : "cos", fe_dtype_name(cs[k]->dtype), SHP(cs[k]), fe_dtype_name(x->dtype),
               r, (long long)(x->shape[r - 1] / 2), SHP(x));
      return -1;
    }
  }
  n->dtype = x->dtype;
  return set_shape(d, n, x->rank, x->shape);
}

/* Output size of a sliding window: floor (or ceil) of
 * (in + pad_b + pad_e - dil (k - 1) - 1) / stride + 1; with ceil_mode the
 * last window must start inside the input or its begin padding. */
static int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t dl, int64_t pb, int64_t pe, bool ceil_mode) {
  int64_t span = in + pb + pe - dl * (k - 1) - 1;
  if (span < 0) return 0;
  int64_t o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (o - 1) * s >= in + pb) o--;
  return o;
}

/* conv (x [N, C, S...], w [F, C/groups, K...]) and pools (x [N, C, S...]). */
static int infer_window(nv_diag *d, nv_node *n, const nv_node *x, const nv_node *w) {
  bool byte = fe_dtype_is_int(x->dtype) && fe_dtype_size(x->dtype) == 1; /* max_pool also takes i8 and u8 (ONNX) */
  if (!(n->op == NV_OP_MAX_POOL && byte) && need_float(d, n, x, "input")) return -1;
  int ns = x->rank - 2;
  if (ns < 1 || ns > 3) {
    nv_error(d, n->loc, "%s: input must be [N, C, spatial...] with 1 to 3 spatial dims, got %s", nv_op_name(n->op), SHP(x));
    return -1;
  }
  n->nspatial = ns;
  int64_t s[NOVA_MAX_RANK] = {x->shape[0], x->shape[1]};
  if (w) {
    if (w->dtype != x->dtype || w->rank != x->rank) {
      nv_error(d, n->loc, "conv: weight %s %s must be %s [F, C/groups, kernel...] of rank %d", fe_dtype_name(w->dtype),
               SHP(w), fe_dtype_name(x->dtype), x->rank);
      return -1;
    }
    if (n->groups <= 0 || x->shape[1] % n->groups || w->shape[0] % n->groups || w->shape[1] * n->groups != x->shape[1]) {
      nv_error(d, n->loc, "conv: %lld groups do not fit input %s and weight %s (C = groups * weight dim 1, F divisible by groups)",
               (long long)n->groups, SHP(x), SHP(w));
      return -1;
    }
    s[1] = w->shape[0];
    for (int i = 0; i < ns; i++) n->kernel[i] = w->shape[2 + i];
  }
  for (int i = 0; i < ns; i++) {
    if (n->kernel[i] <= 0 || n->strides[i] <= 0 || n->dilations[i] <= 0 || n->pads[i] < 0 || n->pads[ns + i] < 0) {
      nv_error(d, n->loc, "%s: kernel, strides and dilations must be positive and pads >= 0", nv_op_name(n->op));
      return -1;
    }
    if (n->pads[i] >= n->kernel[i] * n->dilations[i] || n->pads[ns + i] >= n->kernel[i] * n->dilations[i]) {
      nv_error(d, n->loc, "%s: a pad of %lld is not smaller than the window (%lld) on spatial axis %d", nv_op_name(n->op),
               (long long)(n->pads[i] > n->pads[ns + i] ? n->pads[i] : n->pads[ns + i]),
               (long long)(n->kernel[i] * n->dilations[i]), i);
      return -1;
    }
    s[2 + i] = window_out(x->shape[2 + i], n->kernel[i], n->strides[i], n->dilations[i], n->pads[i], n->pads[ns + i],
                          n->ceil_mode);
    if (s[2 + i] <= 0) {
      nv_error(d, n->loc, "%s: the window (%lld, dilation %lld) is larger than spatial axis %d of %s with its padding",
               nv_op_name(n->op), (long long)n->kernel[i], (long long)n->dilations[i], i, SHP(x));
      return -1;
    }
  }
  n->dtype = x->dtype;
  return set_shape(d, n, x->rank, s);
}

/* The dims of x other than axis must hold those of idx (gather_elements,
 * scatter_elements: same rank, idx no larger). */
static int elements_shapes(nv_diag *d, nv_node *n, const nv_node *x, const nv_node *idx) {
  if (!fe_dtype_is_index(idx->dtype)) {
    nv_error(d, n->loc, "%s: indices must be i32 or i64, got %s", nv_op_name(n->op), fe_dtype_name(idx->dtype));
    return -1;
  }
  if (x->rank == 0 || idx->rank != x->rank) {
    nv_error(d, n->loc, "%s: data %s and indices %s must have the same rank (>= 1)", nv_op_name(n->op), SHP(x), SHP(idx));
    return -1;
  }
  if (norm_axis(d, n, &n->axis, x->rank)) return -1;
  for (int i = 0; i < x->rank; i++)
    if (i != n->axis && idx->shape[i] > x->shape[i]) {
      nv_error(d, n->loc, "%s: indices %s exceed data %s on axis %d", nv_op_name(n->op), SHP(idx), SHP(x), i);
      return -1;
    }
  return 0;
}

/* gather_nd / scatter_nd: the last axis of idx [.., k] indexes the k dims of
 * x from `first` on.  Constant tuples are checked entry by entry; run-time
 * ones need one bound, so those k dims must agree. */
static int nd_indices(nv_diag *d, nv_node *n, const nv_node *x, nv_node *idx, int first) {
  if (!fe_dtype_is_index(idx->dtype) || idx->rank < 1) {
    nv_error(d, n->loc, "%s: indices must be an i32 or i64 tensor of rank >= 1, got %s %s", nv_op_name(n->op),
             fe_dtype_name(idx->dtype), SHP(idx));
    return -1;
  }
  int64_t k = idx->shape[idx->rank - 1];
  if (k < 1 || first + k > x->rank) {
    nv_error(d, n->loc, "%s: index tuples of %lld entries do not fit data %s (after %d batch dims)", nv_op_name(n->op),
             (long long)k, SHP(x), first);
    return -1;
  }
  if (idx->op == NV_OP_CONSTANT && idx->init.kind == NV_INIT_DATA) {
    for (int64_t i = 0, e = fe_numel(idx); i < e; i++) {
      int64_t v = idx->dtype == NOVA_DTYPE_I64 ? ((const int64_t *)idx->init.data)[i] : ((const int32_t *)idx->init.data)[i];
      int64_t dim = x->shape[first + i % k];
      if (v < -dim || v >= dim) {
        nv_error(d, n->loc, "%s: constant index %lld is outside [%lld, %lld) for dim %lld of %s", nv_op_name(n->op),
                 (long long)v, (long long)-dim, (long long)dim, (long long)(first + i % k), SHP(x));
        return -1;
      }
    }
    return 0;
  }
  for (int i = 1; i < k; i++)
    if (x->shape[first + i] != x->shape[first]) {
      nv_error(d, n->loc, "%s: indices known only at run time are range-checked against one bound, so the dims they index must "
               "have one size, got %s; make the indices constant",
               nv_op_name(n->op), SHP(x));
      return -1;
    }
  return index_operand(d, n, idx, x->shape[first], true);
}

static int infer_indexing(nv_diag *d, nv_node *n, nv_node **in) {
  nv_node *x = in[0], *idx = in[1];
  int64_t s[NOVA_MAX_RANK];
  switch (n->op) {
  case NV_OP_GATHER_ELEMENTS:
    if (elements_shapes(d, n, x, idx) || index_operand(d, n, idx, x->shape[n->axis], true)) return -1;
    n->dtype = x->dtype;
    return set_shape(d, n, idx->rank, idx->shape);
  case NV_OP_SCATTER_ELEMENTS:
    if (elements_shapes(d, n, x, idx)) return -1;
    if (in[2]->dtype != x->dtype || in[2]->rank != idx->rank || memcmp(in[2]->shape, idx->shape, (size_t)idx->rank * 8)) {
      nv_error(d, n->loc, "scatter_elements: updates %s %s must be %s shaped like the indices %s",
               fe_dtype_name(in[2]->dtype), SHP(in[2]), fe_dtype_name(x->dtype), SHP(idx));
      return -1;
    }
    if (index_operand(d, n, idx, x->shape[n->axis], true)) return -1;
    break;
  case NV_OP_GATHER_ND: {
    int b = (int)n->axis, q = idx->rank;
    if (b < 0 || b >= q || b >= x->rank) {
      nv_error(d, n->loc, "gather_nd: batch_dims %d must be below the ranks of data %s and indices %s", b, SHP(x), SHP(idx));
      return -1;
    }
    for (int i = 0; i < b; i++)
      if (idx->shape[i] != x->shape[i]) {
        nv_error(d, n->loc, "gather_nd: the %d batch dims of data %s and indices %s differ", b, SHP(x), SHP(idx));
        return -1;
      }
    if (nd_indices(d, n, x, idx, b)) return -1;
    int64_t k = idx->shape[q - 1];
    int r = 0;
    if (q - 1 + x->rank - b - (int)k > NOVA_MAX_RANK) {
      nv_error(d, n->loc, "gather_nd: result rank exceeds %d", NOVA_MAX_RANK);
      return -1;
    }
    for (int i = 0; i < q - 1; i++) s[r++] = idx->shape[i];
    for (int i = b + (int)k; i < x->rank; i++) s[r++] = x->shape[i];
    n->dtype = x->dtype;
    return set_shape(d, n, r, s);
  }
  case NV_OP_SCATTER_ND: {
    if (nd_indices(d, n, x, idx, 0)) return -1;
    int q = idx->rank, r = 0;
    int64_t k = idx->shape[q - 1];
    for (int i = 0; i < q - 1; i++) s[r++] = idx->shape[i];
    for (int i = (int)k; i < x->rank; i++) s[r++] = x->shape[i];
    if (in[2]->dtype != x->dtype || in[2]->rank != r || memcmp(in[2]->shape, s, (size_t)r * 8)) {
      nv_error(d, n->loc, "scatter_nd: updates %s %s must be %s %s (indices' leading dims, then data's from dim %lld)",
               fe_dtype_name(in[2]->dtype), SHP(in[2]), fe_dtype_name(x->dtype),
               fe_shape_str((char[160]){0}, 160, r, s), (long long)k);
      return -1;
    }
    break;
  }
  default: break;
  }
  n->dtype = x->dtype;
  return set_shape(d, n, x->rank, x->shape);
}

static int infer(nv_diag *d, nv_node *n) {
  nv_node **in = n->in;
  switch (n->op) {
  case NV_OP_INPUT:
  case NV_OP_PARAM:
  case NV_OP_CONSTANT:
    return set_shape(d, n, n->rank, n->shape);
  case NV_OP_ADD:
  case NV_OP_SUB:
  case NV_OP_MUL:
  case NV_OP_DIV:
  case NV_OP_MINIMUM:
  case NV_OP_MAXIMUM:
    if (need_number(d, n, in[0], "left operand") || need_number(d, n, in[1], "right operand")) return -1;
    return infer_broadcast(d, n, in[0], in[1]);
  case NV_OP_POW:
    if (need_float(d, n, in[0], "base") || need_float(d, n, in[1], "exponent")) return -1;
    return infer_broadcast(d, n, in[0], in[1]);
  case NV_OP_MOD:
  case NV_OP_FMOD:
    if (need_number(d, n, in[0], "left operand") || need_number(d, n, in[1], "right operand")) return -1;
    return infer_broadcast(d, n, in[0], in[1]);
  case NV_OP_SHL:
  case NV_OP_SHR:
  case NV_OP_AND:
  case NV_OP_OR:
  case NV_OP_XOR:
  case NV_OP_NOT: /* logic on bool, bitwise on integers; shifts on integers only */
    for (int i = 0; i < n->nin; i++)
      if (!fe_dtype_is_int(in[i]->dtype) && (in[i]->dtype != NOVA_DTYPE_BOOL || n->op == NV_OP_SHL || n->op == NV_OP_SHR)) {
        nv_error(d, n->loc, "%s: operands must be %sintegers, got %s", nv_op_name(n->op),
                 n->op == NV_OP_SHL || n->op == NV_OP_SHR ? "" : "bool or ", fe_dtype_name(in[i]->dtype));
        return -1;
      }
    if (n->op == NV_OP_NOT) {
      n->dtype = in[0]->dtype;
      return set_shape(d, n, in[0]->rank, in[0]->shape);
    }
    return infer_broadcast(d, n, in[0], in[1]);
  case NV_OP_ISNAN:
  case NV_OP_ISINF:
    if (need_float(d, n, in[0], "operand")) return -1;
    n->dtype = NOVA_DTYPE_BOOL;
    return set_shape(d, n, in[0]->rank, in[0]->shape);
  case NV_OP_SIGN:
  case NV_OP_CUMSUM:
    if (need_number(d, n, in[0], "operand")) return -1;
    if (n->op == NV_OP_CUMSUM && (in[0]->rank == 0 || norm_axis(d, n, &n->axis, in[0]->rank))) {
      if (in[0]->rank == 0) nv_error(d, n->loc, "cumsum: operand must have rank >= 1");
      return -1;
    }
    n->dtype = in[0]->dtype;
    return set_shape(d, n, in[0]->rank, in[0]->shape);
  case NV_OP_GATHER_ELEMENTS:
  case NV_OP_SCATTER_ELEMENTS:
  case NV_OP_GATHER_ND:
  case NV_OP_SCATTER_ND: return infer_indexing(d, n, in);
  case NV_OP_EQUAL:
  case NV_OP_LESS:
  case NV_OP_GREATER:
  case NV_OP_LESS_EQUAL:
  case NV_OP_GREATER_EQUAL:
    if (n->op != NV_OP_EQUAL && (need_number(d, n, in[0], "left operand") || need_number(d, n, in[1], "right operand")))
      return -1;
    if (infer_broadcast(d, n, in[0], in[1])) return -1;
    n->dtype = NOVA_DTYPE_BOOL;
    return 0;
  case NV_OP_WHERE: {
    if (in[0]->dtype != NOVA_DTYPE_BOOL) {
      nv_error(d, n->loc, "where: the condition must be bool, got %s", fe_dtype_name(in[0]->dtype));
      return -1;
    }
    nv_node t = *n; /* broadcast cond with a, then with b */
    t.dtype = in[1]->dtype;
    nv_node c = *in[0];
    c.dtype = in[1]->dtype;
    if (infer_broadcast(d, &t, &c, in[1]) || infer_broadcast(d, n, &t, in[2])) return -1;
    return 0;
  }
  case NV_OP_ABS:
    if (need_number(d, n, in[0], "operand")) return -1;
    n->dtype = in[0]->dtype;
    return set_shape(d, n, in[0]->rank, in[0]->shape);
  case NV_OP_CONV: return infer_window(d, n, in[0], in[1]);
  /* backward ops made by autodiff: the result is shaped like the forward
   * operand (list holds its shape) */
  case NV_OP_CONV_GRAD_INPUT:   /* (g [N, F, O...], w) -> [N, C, I...] */
  case NV_OP_AVG_POOL_GRAD:     /* (g) -> [N, C, I...] */
  case NV_OP_CONV_GRAD_WEIGHT:  /* (x, g) -> w [F, C/groups, K...] */
    n->dtype = in[0]->dtype;
    n->nspatial = in[0]->rank - 2;
    return set_shape(d, n, n->nlist, n->list);
  case NV_OP_MAX_POOL_INDICES:  /* (x, y) -> i64 like y: flat index into x of each window's first maximum */
    n->dtype = NOVA_DTYPE_I64;
    n->nspatial = in[0]->rank - 2;
    return set_shape(d, n, in[1]->rank, in[1]->shape);
  case NV_OP_MAX_POOL_GRAD:     /* (x, y, g) -> [N, C, I...] */
    n->dtype = in[0]->dtype;
    n->nspatial = in[0]->rank - 2;
    return set_shape(d, n, in[0]->rank, in[0]->shape);
  case NV_OP_MAX_POOL:
  case NV_OP_AVG_POOL: return infer_window(d, n, in[0], NULL);
  case NV_OP_CAST:
    if (!fe_dtype_size(n->to)) {
      nv_error(d, n->loc, "cast: unsupported target dtype %d", (int)n->to);
      return -1;
    }
    n->dtype = n->to;
    return set_shape(d, n, in[0]->rank, in[0]->shape);
  case NV_OP_NEG:
  case NV_OP_EXP:
  case NV_OP_LOG:
  case NV_OP_SQRT:
  case NV_OP_TANH:
  case NV_OP_SIGMOID:
  case NV_OP_RELU:
  case NV_OP_GELU:
  case NV_OP_ERF:
  case NV_OP_SIN: case NV_OP_COS: case NV_OP_TAN: case NV_OP_ASIN: case NV_OP_ACOS: case NV_OP_ATAN:
  case NV_OP_SINH: case NV_OP_COSH: case NV_OP_ASINH: case NV_OP_ACOSH: case NV_OP_ATANH:
  case NV_OP_FLOOR: case NV_OP_CEIL: case NV_OP_ROUND:
    if (need_float(d, n, in[0], "operand")) return -1;
    n->dtype = in[0]->dtype;
    return set_shape(d, n, in[0]->rank, in[0]->shape);
  case NV_OP_SOFTMAX:
  case NV_OP_LOG_SOFTMAX:
    if (need_float(d, n, in[0], "operand")) return -1;
    if (in[0]->rank == 0) {
      nv_error(d, n->loc, "%s: operand must have rank >= 1", nv_op_name(n->op));
      return -1;
    }
    if (norm_axis(d, n, &n->axis, in[0]->rank)) return -1;
    n->dtype = in[0]->dtype;
    return set_shape(d, n, in[0]->rank, in[0]->shape);
  case NV_OP_MATMUL: return infer_matmul(d, n, in[0], in[1]);
  case NV_OP_LAYER_NORM: return infer_layer_norm(d, n, in[0], in[1], in[2]);
  case NV_OP_ATTENTION: return infer_attention(d, n, in);
  case NV_OP_REDUCE_SUM:
  case NV_OP_REDUCE_MEAN:
  case NV_OP_REDUCE_MAX:
  case NV_OP_REDUCE_MIN:
  case NV_OP_REDUCE_PROD: return infer_reduce(d, n, in[0]);
  case NV_OP_RESHAPE: return infer_reshape(d, n, in[0]);
  case NV_OP_TRANSPOSE: return infer_transpose(d, n, in[0]);
  case NV_OP_BROADCAST: return infer_broadcast_to(d, n, in[0]);
  case NV_OP_CONCAT: return infer_concat(d, n);
  case NV_OP_SLICE: return infer_slice(d, n, in[0]);
  case NV_OP_GATHER: return infer_gather(d, n, in[0], in[1]);
  case NV_OP_CROSS_ENTROPY: return infer_cross_entropy(d, n, in[0], in[1]);
  case NV_OP_DROPOUT: return infer_dropout(d, n, in[0], in[1], in[2]);
  case NV_OP_STOCHASTIC_ROUND: return infer_sround(d, n, in[0], in[1], in[2]);
  case NV_OP_RMS_NORM: return infer_rms_norm(d, n, in[0], in[1]);
  case NV_OP_ROTARY: return infer_rotary(d, n, in[0], in[1], in[2]);
  case NV_OP_ALL_REDUCE: /* the sum over the ranks of data-parallel training (passes/comm.c) */
    if (need_float(d, n, in[0], "operand")) return -1;
    n->dtype = in[0]->dtype;
    return set_shape(d, n, in[0]->rank, in[0]->shape);
  case NV_OP_REDUCE_SCATTER: /* --shard-optimizer (passes/autodiff.c): this rank's share of the flat sum */
  case NV_OP_SHARD:          /* this rank's share of the flat value, zero-padded */
  case NV_OP_ALL_GATHER: {   /* every rank's share, in rank order */
    if (need_float(d, n, in[0], "operand")) return -1;
    if (n->mode < 1 || (n->op == NV_OP_ALL_GATHER && in[0]->rank != 1)) {
      nv_error(d, n->loc, "internal: %s of %d ranks over a rank-%d value", nv_op_name(n->op), (int)n->mode, in[0]->rank);
      return -1;
    }
    n->dtype = in[0]->dtype;
    int64_t len = n->op == NV_OP_ALL_GATHER ? in[0]->shape[0] * n->mode : (fe_numel(in[0]) + n->mode - 1) / n->mode;
    return set_shape(d, n, 1, &len);
  }
  case NV_OP_COUNT: break;
  }
  nv_error(d, n->loc, "internal: no shape rule for op %d", (int)n->op);
  return -1;
}

nv_node *fe_graph_add(nv_graph *g, nv_diag *d, nv_op op, int nin, nv_node **in,
                      const nv_node *attrs, nv_loc loc) {
  nv_node *n = nv_xcalloc(1, sizeof *n);
  if (!n) return NULL;
  if (attrs) *n = *attrs;
  n->name = NULL;
  n->init = (nv_init){0};
  n->op = op;
  n->loc = loc;
  n->allow_empty = g->allow_empty;
  n->nin = nin;
  n->in = nin ? nv_xmalloc((size_t)nin * sizeof *n->in) : NULL;
  if (nin && !n->in) {
    free(n);
    return NULL;
  }
  if (nin) memcpy(n->in, in, (size_t)nin * sizeof *in);
  int min = nv_op_min_inputs(op), max = nv_op_max_inputs(op);
  if (nin < min || (max >= 0 && nin > max)) {
    if (min == max)
      nv_error(d, loc, "%s takes %d operand%s, got %d", nv_op_name(op), min, min == 1 ? "" : "s", nin);
    else
      nv_error(d, loc, "%s takes at least %d operand%s, got %d", nv_op_name(op), min,
               min == 1 ? "" : "s", nin);
    free_node(n);
    return NULL;
  }
  if (infer(d, n) != 0 || !push(g, n)) {
    free_node(n);
    return NULL;
  }
  return n;
}

void fe_graph_set_order(nv_graph *g, nv_node *const *order) {
  for (int i = 0; i < g->nnodes; i++) {
    g->nodes[i] = order[i];
    g->nodes[i]->id = i;
  }
}

void fe_graph_truncate(nv_graph *g, int mark) {
  while (g->nnodes > mark) {
    nv_node *n = g->nodes[--g->nnodes];
    free(n->init.path);
    free(n->init.data);
    free_node(n);
  }
}

int fe_graph_save(const nv_graph *g, nv_graph_state *s) {
  memset(s, 0, sizeof *s);
  size_t nin = 0;
  for (int i = 0; i < g->nnodes; i++) nin += (size_t)g->nodes[i]->nin;
  s->order = nv_xmalloc(sizeof *s->order * ((size_t)g->nnodes + 1));
  s->in = nv_xmalloc(sizeof *s->in * (nin + 1));
  if (!s->order || !s->in) {
    free(s->order);
    free(s->in);
    return -1;
  }
  memcpy(s->order, g->nodes, sizeof *s->order * (size_t)g->nnodes);
  nin = 0;
  for (int i = 0; i < g->nnodes; i++)
    for (int j = 0; j < g->nodes[i]->nin; j++) s->in[nin++] = g->nodes[i]->in[j];
  s->nnodes = g->nnodes;
  s->nforward = g->nforward;
  s->update_from = g->update_from;
  s->recompute = g->recompute;
  return 0;
}

void fe_graph_restore(nv_graph *g, nv_graph_state *s) {
  /* the nodes made since are those not in the saved order: after it */
  for (int i = 0; i < g->nnodes; i++) g->nodes[i]->id = -1;
  for (int i = 0; i < s->nnodes; i++) s->order[i]->id = i;
  int k = s->nnodes;
  for (int i = 0; i < g->nnodes; i++)
    if (g->nodes[i]->id < 0) g->nodes[i]->id = k++;
  nv_node **order = g->nodes; /* in place: by id */
  for (int i = 0; i < g->nnodes;) {
    int to = order[i]->id;
    if (to == i) {
      i++;
      continue;
    }
    nv_node *t = order[to];
    order[to] = order[i];
    order[i] = t;
  }
  size_t nin = 0;
  for (int i = 0; i < s->nnodes; i++)
    for (int j = 0; j < g->nodes[i]->nin; j++) g->nodes[i]->in[j] = s->in[nin++];
  fe_graph_truncate(g, s->nnodes);
  g->nforward = s->nforward;
  g->update_from = s->update_from;
  g->recompute = s->recompute;
  free(s->order);
  free(s->in);
  memset(s, 0, sizeof *s);
}

int fe_graph_add_output(nv_graph *g, nv_diag *d, const char *name, nv_node *n, nv_loc loc) {
  for (int i = 0; i < g->nnodes; i++) {
    const nv_node *x = g->nodes[i];
    if ((x->op == NV_OP_INPUT || x->op == NV_OP_PARAM) && x->name && !strcmp(x->name, name)) {
      nv_error(d, loc, "output '%s' has the name of %s %s '%s'; give the output its own name: output %s_out = %s",
               name, x->op == NV_OP_PARAM ? "a" : "an", x->op == NV_OP_PARAM ? "param" : "input", name, name, name);
      return -1;
    }
  }
  for (int i = 0; i < g->noutputs; i++)
    if (strcmp(g->outputs[i].name, name) == 0) {
      nv_error(d, loc, "output '%s' is declared twice", name);
      return -1;
    }
  if (g->noutputs == g->capoutputs) {
    int cap = g->capoutputs ? 2 * g->capoutputs : 8;
    nv_output *p = nv_xrealloc(g->outputs, (size_t)cap * sizeof *p);
    if (!p) return -1;
    g->outputs = p;
    g->capoutputs = cap;
  }
  g->outputs[g->noutputs++] = (nv_output){nv_xstrdup(name), n, loc, NOVA_ROLE_OUTPUT, NULL};
  return 0;
}

/* ---- data-movement helpers -------------------------------------------- */

static bool same_shape(const nv_node *x, int rank, const int64_t *shape) {
  return x->rank == rank && (rank == 0 || !memcmp(x->shape, shape, (size_t)rank * sizeof *shape)); /* SHAPE may be NULL */
}

static nv_node *with_list(nv_graph *g, nv_diag *d, nv_op op, nv_node *x, int n, const int64_t *list, bool keep,
                          nv_loc loc) {
  nv_node at = {.nlist = n, .keepdims = keep};
  if (n) memcpy(at.list, list, (size_t)n * sizeof *list);
  return fe_graph_add(g, d, op, 1, &x, &at, loc);
}

nv_node *fe_reshape(nv_graph *g, nv_diag *d, nv_node *x, int rank, const int64_t *shape, nv_loc loc) {
  if (!x || same_shape(x, rank, shape)) return x;
  return with_list(g, d, NV_OP_RESHAPE, x, rank, shape, false, loc);
}

nv_node *fe_broadcast(nv_graph *g, nv_diag *d, nv_node *x, int rank, const int64_t *shape, nv_loc loc) {
  if (!x || same_shape(x, rank, shape)) return x;
  return with_list(g, d, NV_OP_BROADCAST, x, rank, shape, false, loc);
}

nv_node *fe_transpose(nv_graph *g, nv_diag *d, nv_node *x, const int64_t *perm, nv_loc loc) {
  return x ? with_list(g, d, NV_OP_TRANSPOSE, x, x->rank, perm, false, loc) : NULL;
}

nv_node *fe_reduce(nv_graph *g, nv_diag *d, nv_op op, nv_node *x, int naxes, const int64_t *axes, bool keep,
                   nv_loc loc) {
  return x ? with_list(g, d, op, x, naxes, axes, keep, loc) : NULL;
}
