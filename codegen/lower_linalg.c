/* lower_linalg.c: nova -> linalg on tensors.
 *
 * Requires: a verified module whose @forward holds nova ops (frontend output).
 * Produces: a new module, same signature, in linalg/tensor/arith/math ops,
 * each op keeping the location of the nova op it came from.
 *
 * The lowering walks @forward's ops in order and writes each as MLIR text
 * (linalg.generic with explicit indexing maps, linalg.matmul, ...), which is
 * then parsed and verified in the same context.  Text keeps each rule a
 * readable few lines; the parser checks every op it produces.
 *
 * Conventions in the emitted text: tensors are %vN; generic bodies name their
 * block arguments %in0, %in1, ... and %acc (the output), and end in %r.
 */
#include <math.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "lower_internal.h"

/* ---- value map ------------------------------------------------------ */

static size_t hash_ptr(const void *p, size_t cap) {
  uintptr_t x = (uintptr_t)p;
  x ^= x >> 17;
  x *= 0xed5ad4bbu;
  return (size_t)(x ^ (x >> 11)) & (cap - 1);
}

static void map_put(lw *L, MlirValue v, tv t) {
  size_t i = hash_ptr(v.ptr, L->mapcap);
  while (L->map[i].key && L->map[i].key != v.ptr) i = (i + 1) & (L->mapcap - 1);
  L->map[i] = (vmap_ent){v.ptr, t};
}

static tv map_get(lw *L, MlirValue v) {
  size_t i = hash_ptr(v.ptr, L->mapcap);
  while (L->map[i].key && L->map[i].key != v.ptr) i = (i + 1) & (L->mapcap - 1);
  return L->map[i].val;
}

/* ---- text helpers --------------------------------------------------- */

/* MLIR's integers are signless: u8 and i8 are both i8, and every op whose
 * result depends on the sign picks its unsigned form for the unsigned
 * dtypes (fe_dtype_is_unsigned). */
const char *lw_ety(nova_dtype dt) {
  switch (dt) {
  case NOVA_DTYPE_F64: return "f64";
  case NOVA_DTYPE_I32: case NOVA_DTYPE_U32: return "i32";
  case NOVA_DTYPE_I64: case NOVA_DTYPE_U64: return "i64";
  case NOVA_DTYPE_I16: case NOVA_DTYPE_U16: return "i16";
  case NOVA_DTYPE_I8: case NOVA_DTYPE_U8: return "i8";
  case NOVA_DTYPE_F16: return "f16";
  case NOVA_DTYPE_BF16: return "bf16";
  case NOVA_DTYPE_BOOL: return "i1";
  default: return "f32";
  }
}

/* "tensor<8x784xf32>" */
const char *lw_ttype(char *buf, size_t n, int rank, const int64_t *shape, nova_dtype dt) {
  size_t k = (size_t)snprintf(buf, n, "tensor<");
  for (int i = 0; i < rank; i++) k += (size_t)snprintf(buf + k, n - k, "%lldx", (long long)shape[i]);
  snprintf(buf + k, n - k, "%s>", lw_ety(dt));
  return buf;
}

/* A float literal that MLIR parses back to exactly v in dtype dt. */
const char *lw_flit(char *buf, size_t n, double v, nova_dtype dt) {
  if (fe_dtype_is_half(dt)) { /* the bits: exact, inf and NaN included */
    snprintf(buf, n, "0x%04X", (unsigned)fe_half_from_double(dt, v));
    return buf;
  }
  if (isinf(v)) {
    snprintf(buf, n, dt == NOVA_DTYPE_F64 ? "0x%cFF0000000000000" : "0x%cF800000", v < 0 ? 'F' : '7');
    return buf;
  }
  if (dt == NOVA_DTYPE_F64) snprintf(buf, n, "%.17e", v);
  else snprintf(buf, n, "%.9e", (double)(float)v);
  return buf;
}

void lw_emit(lw *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void lw_emit(lw *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nv_sb_printf(&L->out, "    ");
  nv_sb_vprintf(&L->out, fmt, ap);
  va_end(ap);
  nv_sb_printf(&L->out, "%s\n", L->loc);
}

tv lw_fresh(lw *L, int rank, const int64_t *shape, nova_dtype dt) {
  tv t = {.id = L->next_id++, .rank = rank, .dt = dt};
  if (rank) memcpy(t.shape, shape, (size_t)rank * sizeof *shape);
  return t;
}

tv lw_empty(lw *L, int rank, const int64_t *shape, nova_dtype dt) {
  tv t = lw_fresh(L, rank, shape, dt);
  /* a value ad_recompute copied into the backward: its destination is
   * tagged, so that CSE does not merge the copy with the forward's op */
  if (L->recompute)
    lw_emit(L, "%%v%d = tensor.empty() {nova.recompute = %lld} : %s", t.id, (long long)L->recompute, TT(t));
  else lw_emit(L, "%%v%d = tensor.empty() : %s", t.id, TT(t));
  return t;
}

tv lw_filled(lw *L, int rank, const int64_t *shape, nova_dtype dt, double v) {
  tv e = lw_empty(L, rank, shape, dt);
  int c = L->next_id++;
  if (fe_dtype_is_float(dt)) lw_emit(L, "%%v%d = arith.constant %s : %s", c, FL(v, dt), lw_ety(dt));
  else lw_emit(L, "%%v%d = arith.constant %lld : %s", c, (long long)v, lw_ety(dt));
  tv f = lw_fresh(L, rank, shape, dt);
  lw_emit(L, "%%v%d = linalg.fill ins(%%v%d : %s) outs(%%v%d : %s) -> %s", f.id, c, lw_ety(dt), e.id,
       TT(e), TT(f));
  return f;
}

/* Writes "affine_map<(d0, d1) -> (d1, 0)>" for a map over nloops loops whose
 * results are dims[i] (-1 = the constant 0). */
static void affine(nv_sbuf *b, int nloops, int nres, const int *dims) {
  nv_sb_printf(b, "affine_map<(");
  for (int i = 0; i < nloops; i++) nv_sb_printf(b, "%sd%d", i ? ", " : "", i);
  nv_sb_printf(b, ") -> (");
  for (int i = 0; i < nres; i++)
    if (dims[i] < 0) nv_sb_printf(b, "%s0", i ? ", " : "");
    else nv_sb_printf(b, "%sd%d", i ? ", " : "", dims[i]);
  nv_sb_printf(b, ")>");
}

/* The general structured op.  ins[i] is read through maps[i] (ins[i].rank
 * entries); the result has shape out over the loops outmap names; iters has
 * one 'p' or 'r' per loop.  init: the output's initial value (id < 0: empty).
 * body: lines using %in0.. and %acc, defining %r ("": the result is %in0). */
tv lw_generic(lw *L, int nin, const tv *ins, const int *const *maps, int nloops, const char *iters,
                  const int *outmap, int orank, const int64_t *oshape, nova_dtype odt, tv init,
                  const char *body) {
  if (init.id < 0) init = lw_empty(L, orank, oshape, odt);
  tv r = lw_fresh(L, orank, oshape, odt);
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = linalg.generic {indexing_maps = [", r.id);
  for (int i = 0; i < nin; i++) {
    affine(&b, nloops, ins[i].rank, maps[i]);
    nv_sb_printf(&b, ", ");
  }
  affine(&b, nloops, orank, outmap);
  nv_sb_printf(&b, "], iterator_types = [");
  for (int i = 0; i < nloops; i++)
    nv_sb_printf(&b, "%s\"%s\"", i ? ", " : "", iters[i] == 'r' ? "reduction" : "parallel");
  nv_sb_printf(&b, "]}");
  if (nin) {
    nv_sb_printf(&b, " ins(");
    for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%s%%v%d", i ? ", " : "", ins[i].id);
    nv_sb_printf(&b, " : ");
    for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%s%s", i ? ", " : "", TT(ins[i]));
    nv_sb_printf(&b, ")");
  }
  nv_sb_printf(&b, " outs(%%v%d : %s) {\n    ^bb0(", init.id, TT(init));
  for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%%in%d: %s, ", i, lw_ety(ins[i].dt));
  nv_sb_printf(&b, "%%acc: %s):\n", lw_ety(odt));
  /* body lines, each indented */
  for (const char *p = body; *p;) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n) nv_sb_printf(&b, "      %.*s%s\n", (int)n, p, L->loc);
    p += n + (e ? 1 : 0);
  }
  nv_sb_printf(&b, "      linalg.yield %s : %s%s\n    } -> %s", *body ? "%r" : "%in0", lw_ety(odt), L->loc, TT(r));
  lw_emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}
#define generic lw_generic

static const tv NO_INIT = {.id = -1};

int64_t lw_tv_numel(const tv *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->shape[i];
  return n;
}

/* Identity map over n loops. */
static void iota(int *m, int n) {
  for (int i = 0; i < n; i++) m[i] = i;
}

/* numpy broadcasting: the map reading x (rank <= out rank) into out. */
static void bcast_map(int *m, const tv *x, int orank, const int64_t *oshape) {
  for (int j = 0; j < x->rank; j++) {
    int i = j + orank - x->rank;
    m[j] = (x->shape[j] == 1 && oshape[i] != 1) ? -1 : i;
  }
}

/* Elementwise op over broadcast operands into shape out. */
tv lw_elementwise(lw *L, int nin, const tv *ins, int orank, const int64_t *oshape, nova_dtype odt,
                      const char *body) {
  int maps[4][NOVA_MAX_RANK], om[NOVA_MAX_RANK];
  const int *mp[4];
  for (int i = 0; i < nin; i++) {
    bcast_map(maps[i], &ins[i], orank, oshape);
    mp[i] = maps[i];
  }
  iota(om, orank);
  return generic(L, nin, ins, mp, orank, "pppppppp", om, orank, oshape, odt, NO_INIT, body);
}

/* The map of a tensor that is x with the axes in red[] removed. */
static int drop_map(int *m, int rank, const bool *red) {
  int k = 0;
  for (int i = 0; i < rank; i++)
    if (!red[i]) m[k++] = i;
  return k;
}

/* The identity of a reduction kind ('+' sum, '*' product, 'M' max, 'm' min)
 * as a literal of dt, and its combining op. */
static const char *reduce_init(char *buf, size_t n, char kind, nova_dtype dt) {
  if (fe_dtype_is_float(dt))
    return lw_flit(buf, n, kind == '+' ? 0.0 : kind == '*' ? 1.0 : kind == 'M' ? -INFINITY : INFINITY, dt);
  /* max starts at the dtype's least value, min at its greatest (u: 0 and all
   * ones, written as -1) */
  int bits = 8 * (int)fe_dtype_size(dt);
  long long lo = fe_dtype_is_unsigned(dt) ? 0 : bits == 64 ? (long long)INT64_MIN : -(1LL << (bits - 1));
  long long hi = fe_dtype_is_unsigned(dt) ? -1 : bits == 64 ? (long long)INT64_MAX : (1LL << (bits - 1)) - 1;
  snprintf(buf, n, "%lld", kind == '+' ? 0LL : kind == '*' ? 1LL : kind == 'M' ? lo : hi);
  return buf;
}
static const char *reduce_op(char kind, nova_dtype dt) {
  bool fl = fe_dtype_is_float(dt), u = fe_dtype_is_unsigned(dt);
  switch (kind) {
  case '*': return fl ? "arith.mulf" : "arith.muli";
  case 'M': return fl ? "arith.maximumf" : u ? "arith.maxui" : "arith.maxsi";
  case 'm': return fl ? "arith.minimumf" : u ? "arith.minui" : "arith.minsi";
  default: return fl ? "arith.addf" : "arith.addi";
  }
}

/* Reduction of x over red[] (kind as for reduce_init), result without the
 * reduced axes.  pre: body lines computing %t from %in0.. (extra inputs
 * given in more[], read through drop maps); NULL: %t = %in0. */
tv lw_reduce(lw *L, tv x, const bool *red, char kind, int nmore, const tv *more, const char *pre) {
  int64_t os[NOVA_MAX_RANK];
  int om[NOVA_MAX_RANK], xm[NOVA_MAX_RANK], mm[4][NOVA_MAX_RANK];
  int orank = drop_map(om, x.rank, red);
  for (int i = 0; i < orank; i++) os[i] = x.shape[om[i]];
  char iters[NOVA_MAX_RANK + 1] = {0};
  for (int i = 0; i < x.rank; i++) iters[i] = red[i] ? 'r' : 'p';
  iota(xm, x.rank);
  tv ins[5] = {x};
  const int *mp[5] = {xm};
  for (int i = 0; i < nmore; i++) {
    ins[1 + i] = more[i];
    drop_map(mm[i], x.rank, red);
    mp[1 + i] = mm[i];
  }
  tv init = lw_empty(L, orank, os, x.dt);
  int c = L->next_id++;
  lw_emit(L, "%%v%d = arith.constant %s : %s", c, reduce_init((char[64]){0}, 64, kind, x.dt), lw_ety(x.dt));
  tv f = lw_fresh(L, orank, os, x.dt);
  lw_emit(L, "%%v%d = linalg.fill ins(%%v%d : %s) outs(%%v%d : %s) -> %s", f.id, c, lw_ety(x.dt), init.id, TT(init), TT(f));
  init = f;
  const char *op = reduce_op(kind, x.dt);
  char body[600];
  if (pre)
    snprintf(body, sizeof body, "%s%%r = %s %%t, %%acc : %s", pre, op, lw_ety(x.dt));
  else /* plain reduction: the element itself */
    snprintf(body, sizeof body, "%%r = %s %%in0, %%acc : %s", op, lw_ety(x.dt));
  return generic(L, 1 + nmore, ins, mp, x.rank, iters, om, orank, os, x.dt, init, body);
}

#define reduce lw_reduce

/* x reshaped to shape (same element count), through a collapse to 1-D and
 * an expand; rank 0 on either side uses an empty reassociation. */
tv lw_reshape(lw *L, tv x, int rank, const int64_t *shape) {
  if (x.rank == rank && !memcmp(x.shape, shape, (size_t)rank * sizeof *shape)) return x;
  int64_t n = 1;
  for (int i = 0; i < x.rank; i++) n *= x.shape[i];
  tv flat = x;
  if (x.rank > 1 || (x.rank == 1 && rank == 0) || (x.rank > 0 && rank == 0)) {
    int64_t one = n;
    flat = lw_fresh(L, rank == 0 ? 0 : 1, &one, x.dt);
    nv_sbuf b = {0};
    nv_sb_printf(&b, "%%v%d = tensor.collapse_shape %%v%d [", flat.id, x.id);
    if (rank != 0) {
      nv_sb_printf(&b, "[");
      for (int i = 0; i < x.rank; i++) nv_sb_printf(&b, "%s%d", i ? ", " : "", i);
      nv_sb_printf(&b, "]");
    }
    nv_sb_printf(&b, "] : %s into %s", TT(x), TT(flat));
    lw_emit(L, "%s", b.s ? b.s : "");
    nv_sb_free(&b);
  }
  if (rank == flat.rank) return flat;
  tv r = lw_fresh(L, rank, shape, x.dt);
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = tensor.expand_shape %%v%d [", r.id, flat.id);
  if (flat.rank == 1) {
    nv_sb_printf(&b, "[");
    for (int i = 0; i < rank; i++) nv_sb_printf(&b, "%s%d", i ? ", " : "", i);
    nv_sb_printf(&b, "]");
  }
  nv_sb_printf(&b, "] output_shape [");
  for (int i = 0; i < rank; i++) nv_sb_printf(&b, "%s%lld", i ? ", " : "", (long long)shape[i]);
  nv_sb_printf(&b, "] : %s into %s", TT(flat), TT(r));
  lw_emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* x with its axes permuted: result axis i is x's axis perm[i]. */
tv lw_transpose(lw *L, tv x, const int64_t *perm) {
  int64_t s[NOVA_MAX_RANK] = {0};
  for (int i = 0; i < x.rank; i++) s[i] = x.shape[perm[i]];
  tv e = lw_empty(L, x.rank, s, x.dt);
  tv r = lw_fresh(L, x.rank, s, x.dt);
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = linalg.transpose ins(%%v%d : %s) outs(%%v%d : %s) permutation = [", r.id, x.id, TT(x),
               e.id, TT(e));
  for (int i = 0; i < x.rank; i++) nv_sb_printf(&b, "%s%lld", i ? ", " : "", (long long)perm[i]);
  nv_sb_printf(&b, "]");
  lw_emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* ---- per-op rules ----------------------------------------------------- */

double lw_fattr(MlirOperation op, const char *name) {
  return mlirFloatAttrGetValueDouble(mlirOperationGetAttributeByName(op, nova_str(name)));
}

int64_t lw_iattr(MlirOperation op, const char *name) {
  return mlirIntegerAttrGetValueInt(mlirOperationGetAttributeByName(op, nova_str(name)));
}

int lw_iarray(MlirOperation op, const char *name, int64_t *out) {
  MlirAttribute a = mlirOperationGetAttributeByName(op, nova_str(name));
  int n = (int)mlirDenseArrayGetNumElements(a);
  for (int i = 0; i < n && i < NOVA_MAX_RANK; i++) out[i] = mlirDenseI64ArrayGetElement(a, i);
  return n;
}

static void attr_cb(MlirStringRef s, void *ud) { nv_sb_printf(ud, "%.*s", (int)s.length, s.data); }

static const char *unary_body(nv_op op, nova_dtype dt, char *buf, size_t n) {
  const char *T = lw_ety(dt);
  switch (op) {
  case NV_OP_NEG: snprintf(buf, n, "%%r = arith.negf %%in0 : %s", T); break;
  case NV_OP_EXP: snprintf(buf, n, "%%r = math.exp %%in0 : %s", T); break;
  case NV_OP_LOG: snprintf(buf, n, "%%r = math.log %%in0 : %s", T); break;
  case NV_OP_SQRT: snprintf(buf, n, "%%r = math.sqrt %%in0 : %s", T); break;
  case NV_OP_TANH: snprintf(buf, n, "%%r = math.tanh %%in0 : %s", T); break;
  case NV_OP_ERF: snprintf(buf, n, "%%r = math.erf %%in0 : %s", T); break;
  case NV_OP_SIN: case NV_OP_COS: case NV_OP_TAN: case NV_OP_ASIN: case NV_OP_ACOS: case NV_OP_ATAN:
  case NV_OP_SINH: case NV_OP_COSH: case NV_OP_ASINH: case NV_OP_ACOSH: case NV_OP_ATANH:
  case NV_OP_FLOOR: case NV_OP_CEIL:
    snprintf(buf, n, "%%r = math.%s %%in0 : %s", nv_op_name(op), T);
    break;
  case NV_OP_ROUND: snprintf(buf, n, "%%r = math.roundeven %%in0 : %s", T); break; /* halves to even, as ONNX */
  case NV_OP_ISNAN: snprintf(buf, n, "%%r = arith.cmpf uno, %%in0, %%in0 : %s", T); break;
  case NV_OP_ISINF:
    snprintf(buf, n, "%%a = math.absf %%in0 : %s\n%%inf = arith.constant %s : %s\n%%r = arith.cmpf oeq, %%a, %%inf : %s",
             T, FL(INFINITY, dt), T, T);
    break;
  case NV_OP_NOT: /* logical on i1, bitwise on integers: x xor all-ones */
    /* (an i1 constant is written "true", without a type: "true : i1" does not parse) */
    snprintf(buf, n, "%%t = arith.constant %s%s%s\n%%r = arith.xori %%in0, %%t : %s", dt == NOVA_DTYPE_BOOL ? "true" : "-1",
             dt == NOVA_DTYPE_BOOL ? "" : " : ", dt == NOVA_DTYPE_BOOL ? "" : T, T);
    break;
  case NV_OP_SIGN: /* -1, 0 or 1; NaN stays NaN */
    if (fe_dtype_is_float(dt))
      snprintf(buf, n, "%%z = arith.constant %s : %s\n%%o = arith.constant %s : %s\n%%m = arith.constant %s : %s\n"
               "%%p = arith.cmpf ogt, %%in0, %%z : %s\n%%q = arith.cmpf olt, %%in0, %%z : %s\n"
               "%%s = arith.select %%q, %%m, %%in0 : %s\n%%r = arith.select %%p, %%o, %%s : %s",
               FL(0.0, dt), T, FL(1.0, dt), T, FL(-1.0, dt), T, T, T, T, T);
    else if (fe_dtype_is_unsigned(dt))
      snprintf(buf, n, "%%z = arith.constant 0 : %s\n%%o = arith.constant 1 : %s\n%%p = arith.cmpi ne, %%in0, %%z : %s\n"
               "%%r = arith.select %%p, %%o, %%z : %s", T, T, T, T);
    else
      snprintf(buf, n, "%%z = arith.constant 0 : %s\n%%o = arith.constant 1 : %s\n%%m = arith.constant -1 : %s\n"
               "%%p = arith.cmpi sgt, %%in0, %%z : %s\n%%q = arith.cmpi slt, %%in0, %%z : %s\n"
               "%%s = arith.select %%q, %%m, %%z : %s\n%%r = arith.select %%p, %%o, %%s : %s", T, T, T, T, T, T, T);
    break;
  case NV_OP_SIGMOID:
    snprintf(buf, n, "%%one = arith.constant %s : %s\n%%n = arith.negf %%in0 : %s\n%%e = math.exp %%n : %s\n"
             "%%d = arith.addf %%one, %%e : %s\n%%r = arith.divf %%one, %%d : %s",
             FL(1.0, dt), T, T, T, T, T);
    break;
  case NV_OP_RELU:
    snprintf(buf, n, "%%z = arith.constant %s : %s\n%%r = arith.maximumf %%in0, %%z : %s", FL(0.0, dt), T, T);
    break;
  case NV_OP_GELU: /* exact: x/2 (1 + erf(x / sqrt 2)) */
    snprintf(buf, n, "%%h = arith.constant %s : %s\n%%one = arith.constant %s : %s\n"
             "%%s = arith.constant %s : %s\n%%xs = arith.mulf %%in0, %%s : %s\n%%e = math.erf %%xs : %s\n"
             "%%p = arith.addf %%one, %%e : %s\n%%hx = arith.mulf %%h, %%in0 : %s\n%%r = arith.mulf %%hx, %%p : %s",
             FL(0.5, dt), T, FL(1.0, dt), T, FL(M_SQRT1_2, dt), T, T, T, T, T, T);
    break;
  default: buf[0] = 0;
  }
  return buf;
}

/* %ro (f32): the f64 SRC rounded to odd (toward zero, the last bit set
 * when inexact).  Rounding that to a format of at most 22 bits of precision
 * gives the correctly rounded f64 value (no double rounding). */
static int round_to_odd(char *buf, size_t n, const char *src) {
  return snprintf(buf, n,
                  "%%ro_t = arith.truncf %s : f64 to f32\n%%ro_b = arith.extf %%ro_t : f32 to f64\n"
                  "%%ro_ne = arith.cmpf one, %%ro_b, %s : f64\n%%ro_ax = math.absf %s : f64\n"
                  "%%ro_ab = math.absf %%ro_b : f64\n%%ro_up = arith.cmpf ogt, %%ro_ab, %%ro_ax : f64\n"
                  "%%ro_i = arith.bitcast %%ro_t : f32 to i32\n%%ro_1 = arith.constant 1 : i32\n"
                  "%%ro_d = arith.subi %%ro_i, %%ro_1 : i32\n%%ro_z = arith.select %%ro_up, %%ro_d, %%ro_i : i32\n"
                  "%%ro_o = arith.ori %%ro_z, %%ro_1 : i32\n%%ro_k = arith.select %%ro_ne, %%ro_o, %%ro_i : i32\n"
                  "%%ro = arith.bitcast %%ro_k : i32 to f32\n",
                  src, src, src);
}

/* Converts %in0 from dtype `from` to `to` into %r ("" when the MLIR types
 * are equal: a change of signedness keeps the bits, as ONNX's Cast does).
 * Integers widen by the source's signedness; floats to integers truncate
 * (fptosi/fptoui: out-of-range values are undefined, as in ONNX).  f16 and
 * bf16 are read through f32 (exact), and written from f32: from f64 after
 * rounding to odd, from integers after their f32 value (exact over f16's
 * range; integers beyond 2^24 round twice on their way to bf16, as
 * ml_dtypes' conversion through float does). */
static const char *cast_body(nova_dtype from, nova_dtype to, char *buf, size_t n) {
  const char *src = "%in0";
  int k = 0;
  buf[0] = 0;
  if (!strcmp(lw_ety(from), lw_ety(to))) return buf;
  if (fe_dtype_is_half(from)) {
    k = snprintf(buf, n, "%s = arith.extf %%in0 : %s to f32%s", to == NOVA_DTYPE_F32 ? "%r" : "%h", lw_ety(from),
                 to == NOVA_DTYPE_F32 ? "" : "\n");
    if (to == NOVA_DTYPE_F32) return buf;
    src = "%h";
    from = NOVA_DTYPE_F32;
  }
  nova_dtype final = to;
  const char *dst = "%r";
  if (fe_dtype_is_half(to)) { /* computed in f32, then rounded once */
    if (from == NOVA_DTYPE_F64) {
      k += round_to_odd(buf + k, n - (size_t)k, src);
      src = "%ro";
    }
    if (from == NOVA_DTYPE_F64 || from == NOVA_DTYPE_F32) {
      snprintf(buf + k, n - (size_t)k, "%%r = arith.truncf %s : f32 to %s", src, lw_ety(to));
      return buf;
    }
    to = NOVA_DTYPE_F32;
    dst = "%t";
  }
  const char *F = lw_ety(from), *T = lw_ety(to);
  bool ff = fe_dtype_is_float(from), ft = fe_dtype_is_float(to);
  size_t wf = fe_dtype_size(from), wt = fe_dtype_size(to);
  if (to == NOVA_DTYPE_BOOL)
    k += snprintf(buf + k, n - (size_t)k, "%%z = arith.constant %s : %s\n%s = %s %s, %%z : %s", ff ? FL(0.0, from) : "0",
                  F, dst, ff ? "arith.cmpf une," : "arith.cmpi ne,", src, F);
  else if (from == NOVA_DTYPE_BOOL)
    k += snprintf(buf + k, n - (size_t)k, "%s = %s %s : i1 to %s", dst, ft ? "arith.uitofp" : "arith.extui", src, T);
  else if (ff && ft)
    k += snprintf(buf + k, n - (size_t)k, "%s = %s %s : %s to %s", dst, wt > wf ? "arith.extf" : "arith.truncf", src, F, T);
  else if (ff)
    k += snprintf(buf + k, n - (size_t)k, "%s = %s %s : %s to %s", dst,
                  fe_dtype_is_unsigned(to) ? "arith.fptoui" : "arith.fptosi", src, F, T);
  else if (ft)
    k += snprintf(buf + k, n - (size_t)k, "%s = %s %s : %s to %s", dst,
                  fe_dtype_is_unsigned(from) ? "arith.uitofp" : "arith.sitofp", src, F, T);
  else
    k += snprintf(buf + k, n - (size_t)k, "%s = %s %s : %s to %s", dst,
                  wt < wf ? "arith.trunci" : fe_dtype_is_unsigned(from) ? "arith.extui" : "arith.extsi", src, F, T);
  if (final != to) snprintf(buf + k, n - (size_t)k, "\n%%r = arith.truncf %%t : f32 to %s", lw_ety(final));
  return buf;
}

/* x converted to dtype `to`, elementwise. */
static tv convert(lw *L, tv x, nova_dtype to) {
  char body[1024];
  return lw_elementwise(L, 1, &x, x.rank, x.shape, to, cast_body(x.dt, to, body, sizeof body));
}

tv lw_to_f32(lw *L, tv x) { return fe_dtype_is_half(x.dt) ? convert(L, x, NOVA_DTYPE_F32) : x; }

tv lw_matmul(lw *L, tv a, tv b, const tv *res) {
  if (a.rank == 2) {
    tv f = lw_filled(L, res->rank, res->shape, res->dt, 0.0);
    tv r = lw_fresh(L, res->rank, res->shape, res->dt);
    lw_emit(L, "%%v%d = linalg.matmul ins(%%v%d, %%v%d : %s, %s) outs(%%v%d : %s) -> %s", r.id, a.id, b.id,
         TT(a), TT(b), f.id, TT(f), TT(r));
    return r;
  }
  /* batched: loops (batch..., m, n, k) */
  int nb = a.rank - 2, nl = a.rank + 1, am[NOVA_MAX_RANK], bm[NOVA_MAX_RANK], om[NOVA_MAX_RANK];
  char iters[NOVA_MAX_RANK + 2] = {0};
  for (int i = 0; i < nb; i++) am[i] = bm[i] = om[i] = i, iters[i] = 'p';
  iters[nb] = iters[nb + 1] = 'p';
  iters[nb + 2] = 'r';
  am[nb] = nb, am[nb + 1] = nb + 2;                  /* (m, k) */
  int boff = b.rank == 2 ? 0 : nb;
  bm[boff] = nb + 2, bm[boff + 1] = nb + 1;          /* (k, n) */
  om[nb] = nb, om[nb + 1] = nb + 1;
  tv ins[2] = {a, b};
  const int *mp[2] = {am, bm};
  tv f = lw_filled(L, res->rank, res->shape, res->dt, 0.0);
  char body[256];
  snprintf(body, sizeof body, "%%p = arith.mulf %%in0, %%in1 : %s\n%%r = arith.addf %%acc, %%p : %s",
           lw_ety(a.dt), lw_ety(a.dt));
  return generic(L, 2, ins, mp, nl, iters, om, res->rank, res->shape, res->dt, f, body);
}

static tv lower_softmax(lw *L, tv x, int axis, bool logsm) {
  bool red[NOVA_MAX_RANK] = {0};
  red[axis] = true;
  const char *T = lw_ety(x.dt);
  tv m = reduce(L, x, red, 'M', 0, NULL, NULL);
  char pre[300];
  snprintf(pre, sizeof pre, "%%d = arith.subf %%in0, %%in1 : %s\n%%t = math.exp %%d : %s\n", T, T);
  tv s = reduce(L, x, red, '+', 1, &m, pre);
  int xm[NOVA_MAX_RANK], dm[NOVA_MAX_RANK];
  iota(xm, x.rank);
  drop_map(dm, x.rank, red);
  tv ins[3] = {x, m, s};
  const int *mp[3] = {xm, dm, dm};
  char body[400];
  if (logsm)
    snprintf(body, sizeof body, "%%d = arith.subf %%in0, %%in1 : %s\n%%l = math.log %%in2 : %s\n"
             "%%r = arith.subf %%d, %%l : %s", T, T, T);
  else
    snprintf(body, sizeof body, "%%d = arith.subf %%in0, %%in1 : %s\n%%e = math.exp %%d : %s\n"
             "%%r = arith.divf %%e, %%in2 : %s", T, T, T);
  return generic(L, 3, ins, mp, x.rank, "pppppppp", xm, x.rank, x.shape, x.dt, NO_INIT, body);
}

static tv lower_layer_norm(lw *L, tv x, tv g, tv b, double eps) {
  bool red[NOVA_MAX_RANK] = {0};
  int last = x.rank - 1;
  red[last] = true;
  const char *T = lw_ety(x.dt);
  double c = (double)x.shape[last];
  tv sum = reduce(L, x, red, '+', 0, NULL, NULL);
  char pre[300];
  snprintf(pre, sizeof pre, "%%c = arith.constant %s : %s\n%%mu = arith.divf %%in1, %%c : %s\n"
           "%%d = arith.subf %%in0, %%mu : %s\n%%t = arith.mulf %%d, %%d : %s\n", FL(c, x.dt), T, T, T, T);
  tv ss = reduce(L, x, red, '+', 1, &sum, pre);
  int xm[NOVA_MAX_RANK], dm[NOVA_MAX_RANK], lm[1] = {last};
  iota(xm, x.rank);
  drop_map(dm, x.rank, red);
  tv ins[5] = {x, sum, ss, g, b};
  const int *mp[5] = {xm, dm, dm, lm, lm};
  char body[800];
  snprintf(body, sizeof body,
           "%%c = arith.constant %s : %s\n%%eps = arith.constant %s : %s\n%%mu = arith.divf %%in1, %%c : %s\n"
           "%%var = arith.divf %%in2, %%c : %s\n%%ve = arith.addf %%var, %%eps : %s\n%%rs = math.rsqrt %%ve : %s\n"
           "%%d = arith.subf %%in0, %%mu : %s\n%%n = arith.mulf %%d, %%rs : %s\n%%s = arith.mulf %%n, %%in3 : %s\n"
           "%%r = arith.addf %%s, %%in4 : %s",
           FL(c, x.dt), T, FL(eps, x.dt), T, T, T, T, T, T, T, T, T);
  return generic(L, 5, ins, mp, x.rank, "pppppppp", xm, x.rank, x.shape, x.dt, NO_INIT, body);
}

/* x / sqrt(mean(x^2) + eps) * scale over the last axis: the sum of squares
 * (one reduction, into which fusion moves the squares), then one elementwise
 * pass.  The squares and their sum are written as the lowering of
 * reduce_sum(mul(x, x), axes=[last]) writes them, so that a training step's
 * backward, which computes that (autodiff.c), shares them with the forward
 * (CSE before fusion) instead of summing again. */
static tv lower_rms_norm(lw *L, tv x, tv g, double eps) {
  bool red[NOVA_MAX_RANK] = {0};
  int last = x.rank - 1;
  red[last] = true;
  const char *T = lw_ety(x.dt);
  char sq[100];
  snprintf(sq, sizeof sq, "%%r = arith.mulf %%in0, %%in1 : %s", T);
  tv ss = reduce(L, lw_elementwise(L, 2, (tv[]){x, x}, x.rank, x.shape, x.dt, sq), red, '+', 0, NULL, NULL);
  int xm[NOVA_MAX_RANK], dm[NOVA_MAX_RANK], lm[1] = {last};
  iota(xm, x.rank);
  drop_map(dm, x.rank, red);
  tv ins[3] = {x, ss, g};
  const int *mp[3] = {xm, dm, lm};
  char body[600];
  snprintf(body, sizeof body,
           "%%c = arith.constant %s : %s\n%%eps = arith.constant %s : %s\n%%ms = arith.divf %%in1, %%c : %s\n"
           "%%ve = arith.addf %%ms, %%eps : %s\n%%rs = math.rsqrt %%ve : %s\n%%n = arith.mulf %%in0, %%rs : %s\n"
           "%%r = arith.mulf %%n, %%in2 : %s",
           FL((double)x.shape[last], x.dt), T, FL(eps, x.dt), T, T, T, T, T, T);
  return generic(L, 3, ins, mp, x.rank, "pppppppp", xm, x.rank, x.shape, x.dt, NO_INIT, body);
}

/* x[..., start:start + step * n:step] (the last axis), a view. */
static tv slice_last(lw *L, tv x, int64_t start, int64_t n, int64_t step) {
  tv r = x;
  r.id = L->next_id++;
  r.shape[x.rank - 1] = n;
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = tensor.extract_slice %%v%d[", r.id, x.id);
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)(j == x.rank - 1 ? start : 0));
  nv_sb_printf(&b, "] [");
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)r.shape[j]);
  nv_sb_printf(&b, "] [");
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)(j == x.rank - 1 ? step : 1));
  nv_sb_printf(&b, "] : %s to %s", TT(x), TT(r));
  lw_emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* The rotation of the pairs (x1, x2) of the last axis by the angles whose
 * cos and sin are given: (x1 cos - x2 sin, x2 cos + x1 sin).  x1 and x2 are
 * views of x (the halves, or the even and odd elements when interleaved);
 * one generic writes the result as [..., 2, D/2] (or [..., D/2, 2]), the
 * size-2 loop h choosing which of the pair it computes: x_h cos + x_(1-h)
 * (h ? sin : -sin).  Every map is a projected permutation (cos and sin
 * broadcast over their size-1 dims), so the op tiles and vectorizes. */
static tv lower_rotary(lw *L, tv x, tv c, tv s, bool inter) {
  int r = x.rank, nl = r + 1;
  int64_t half = x.shape[r - 1] / 2;
  tv x1 = inter ? slice_last(L, x, 0, half, 2) : slice_last(L, x, 0, half, 1);
  tv x2 = inter ? slice_last(L, x, 1, half, 2) : slice_last(L, x, half, half, 1);
  int hl = inter ? r : r - 1, il = inter ? r - 1 : r; /* the loops of h and of the pair's index i */
  int xm[NOVA_MAX_RANK], cm[NOVA_MAX_RANK], sm[NOVA_MAX_RANK], om[NOVA_MAX_RANK + 1];
  for (int i = 0; i < r - 1; i++) {
    xm[i] = i;
    cm[i] = c.shape[i] == 1 && x.shape[i] != 1 ? -1 : i;
    sm[i] = s.shape[i] == 1 && x.shape[i] != 1 ? -1 : i;
  }
  xm[r - 1] = cm[r - 1] = sm[r - 1] = il;
  int64_t os[NOVA_MAX_RANK + 1];
  for (int i = 0; i < nl; i++) om[i] = i, os[i] = i < r - 1 ? x.shape[i] : i == hl ? 2 : half;
  tv ins[4] = {x1, x2, c, s};
  const int *mp[4] = {xm, xm, cm, sm};
  const char *T = lw_ety(x.dt);
  char body[800];
  snprintf(body, sizeof body,
           "%%h = linalg.index %d : index\n%%z = arith.constant 0 : index\n%%first = arith.cmpi eq, %%h, %%z : index\n"
           "%%p = arith.select %%first, %%in0, %%in1 : %s\n%%q = arith.select %%first, %%in1, %%in0 : %s\n"
           "%%ns = arith.negf %%in3 : %s\n%%sg = arith.select %%first, %%ns, %%in3 : %s\n"
           "%%u = arith.mulf %%p, %%in2 : %s\n%%w = arith.mulf %%q, %%sg : %s\n%%r = arith.addf %%u, %%w : %s",
           hl, T, T, T, T, T, T, T);
  tv y = generic(L, 4, ins, mp, nl, "ppppppppp", om, nl, os, x.dt, NO_INIT, body);
  return lw_reshape(L, y, x.rank, x.shape);
}

static tv lower_reduce(lw *L, nv_op kind, tv x, MlirOperation op, const tv *res) {
  int64_t axes[NOVA_MAX_RANK];
  int n = lw_iarray(op, "axes", axes);
  bool red[NOVA_MAX_RANK] = {0};
  int64_t count = 1;
  for (int i = 0; i < n; i++) {
    red[axes[i]] = true;
    count *= x.shape[axes[i]];
  }
  tv r = reduce(L, x, red, kind == NV_OP_REDUCE_MAX ? 'M' : kind == NV_OP_REDUCE_MIN ? 'm' : kind == NV_OP_REDUCE_PROD ? '*' : '+',
                0, NULL, NULL);
  if (kind == NV_OP_REDUCE_MEAN) {
    char body[200];
    snprintf(body, sizeof body, "%%c = arith.constant %s : %s\n%%r = arith.divf %%in0, %%c : %s",
             FL((double)count, x.dt), lw_ety(x.dt), lw_ety(x.dt));
    r = lw_elementwise(L, 1, &r, r.rank, r.shape, r.dt, body);
  }
  return lw_reshape(L, r, res->rank, res->shape); /* keepdims */
}

static tv lower_gather(lw *L, tv data, tv idx, int axis, const tv *res) {
  /* loops over the result: (data[:axis], idx dims, data[axis+1:]) */
  int im[NOVA_MAX_RANK], om[NOVA_MAX_RANK];
  for (int i = 0; i < idx.rank; i++) im[i] = axis + i;
  iota(om, res->rank);
  nv_sbuf b = {0};
  /* indices may count from the end (ONNX): i < 0 ? i + n : i */
  nv_sb_printf(&b, "%%ii = arith.index_cast %%in0 : %s to index\n%%n = arith.constant %lld : index\n"
               "%%z = arith.constant 0 : index\n%%neg = arith.cmpi slt, %%ii, %%z : index\n"
               "%%iw = arith.addi %%ii, %%n : index\n%%i = arith.select %%neg, %%iw, %%ii : index\n",
               lw_ety(idx.dt), (long long)data.shape[axis]);
  for (int i = 0; i < res->rank; i++) nv_sb_printf(&b, "%%l%d = linalg.index %d : index\n", i, i);
  nv_sb_printf(&b, "%%r = tensor.extract %%v%d[", data.id);
  for (int j = 0; j < data.rank; j++) {
    if (j < axis) nv_sb_printf(&b, "%s%%l%d", j ? ", " : "", j);
    else if (j == axis) nv_sb_printf(&b, "%s%%i", j ? ", " : "");
    else nv_sb_printf(&b, ", %%l%d", j - 1 + idx.rank);
  }
  nv_sb_printf(&b, "] : %s", TT(data));
  const int *mp[1] = {im};
  tv r = generic(L, 1, &idx, mp, res->rank, "pppppppp", om, res->rank, res->shape, res->dt, NO_INIT,
                 b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* mean over rows of logsumexp(logits) - logits[label] */
static tv lower_cross_entropy(lw *L, tv x, tv lab) {
  bool red[NOVA_MAX_RANK] = {0};
  int last = x.rank - 1;
  red[last] = true;
  const char *T = lw_ety(x.dt);
  tv m = reduce(L, x, red, 'M', 0, NULL, NULL);
  char pre[300];
  snprintf(pre, sizeof pre, "%%d = arith.subf %%in0, %%in1 : %s\n%%t = math.exp %%d : %s\n", T, T);
  tv s = reduce(L, x, red, '+', 1, &m, pre);
  int id[NOVA_MAX_RANK];
  iota(id, lab.rank);
  tv ins[3] = {lab, m, s};
  const int *mp[3] = {id, id, id};
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%i = arith.index_cast %%in0 : %s to index\n", lw_ety(lab.dt));
  for (int i = 0; i < lab.rank; i++) nv_sb_printf(&b, "%%l%d = linalg.index %d : index\n", i, i);
  nv_sb_printf(&b, "%%x = tensor.extract %%v%d[", x.id);
  for (int i = 0; i < lab.rank; i++) nv_sb_printf(&b, "%%l%d, ", i);
  nv_sb_printf(&b, "%%i] : %s\n%%lg = math.log %%in2 : %s\n%%lse = arith.addf %%lg, %%in1 : %s\n"
               "%%r = arith.subf %%lse, %%x : %s", TT(x), T, T, T);
  tv row = generic(L, 3, ins, mp, lab.rank, "pppppppp", id, lab.rank, lab.shape, x.dt, NO_INIT, b.s ? b.s : "");
  nv_sb_free(&b);
  bool all[NOVA_MAX_RANK];
  for (int i = 0; i < NOVA_MAX_RANK; i++) all[i] = true;
  int64_t n = 1;
  for (int i = 0; i < lab.rank; i++) n *= lab.shape[i];
  tv tot = reduce(L, row, all, '+', 0, NULL, NULL);
  char body[200];
  snprintf(body, sizeof body, "%%c = arith.constant %s : %s\n%%r = arith.divf %%in0, %%c : %s",
           FL((double)n, x.dt), T, T);
  return lw_elementwise(L, 1, &tot, 0, NULL, x.dt, body);
}

static tv lower_concat(lw *L, int n, const tv *in, int axis, const tv *res) {
  tv acc = lw_empty(L, res->rank, res->shape, res->dt);
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    if (lw_tv_numel(&in[i]) == 0) continue; /* an empty operand adds nothing */
    tv r = lw_fresh(L, res->rank, res->shape, res->dt);
    nv_sbuf b = {0};
    nv_sb_printf(&b, "%%v%d = tensor.insert_slice %%v%d into %%v%d[", r.id, in[i].id, acc.id);
    for (int j = 0; j < res->rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)(j == axis ? off : 0));
    nv_sb_printf(&b, "] [");
    for (int j = 0; j < res->rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)in[i].shape[j]);
    nv_sb_printf(&b, "] [");
    for (int j = 0; j < res->rank; j++) nv_sb_printf(&b, "%s1", j ? ", " : "");
    nv_sb_printf(&b, "] : %s into %s", TT(in[i]), TT(r));
    lw_emit(L, "%s", b.s ? b.s : "");
    nv_sb_free(&b);
    off += in[i].shape[axis];
    acc = r;
  }
  return acc;
}

static tv lower_slice(lw *L, tv x, MlirOperation op, const tv *res) {
  int axis = (int)lw_iattr(op, "axis");
  int64_t start = lw_iattr(op, "start"), step = lw_iattr(op, "step");
  if (lw_tv_numel(res) == 0) return lw_empty(L, res->rank, res->shape, res->dt); /* nothing to copy */
  tv r = lw_fresh(L, res->rank, res->shape, res->dt);
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = tensor.extract_slice %%v%d[", r.id, x.id);
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)(j == axis ? start : 0));
  nv_sb_printf(&b, "] [");
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)res->shape[j]);
  nv_sb_printf(&b, "] [");
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)(j == axis ? step : 1));
  nv_sb_printf(&b, "] : %s to %s", TT(x), TT(r));
  lw_emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* Whether OP computes values (not only moves or converts them). */
static bool computes(nv_op kind) {
  switch (kind) {
  case NV_OP_CONSTANT: case NV_OP_CAST: case NV_OP_RESHAPE: case NV_OP_TRANSPOSE: case NV_OP_BROADCAST:
  case NV_OP_CONCAT: case NV_OP_SLICE: case NV_OP_GATHER: case NV_OP_GATHER_ELEMENTS: case NV_OP_GATHER_ND:
  case NV_OP_WHERE:
  case NV_OP_STOCHASTIC_ROUND: /* (its own rounding of f32 to bf16) */
    return false;
  default: return true;
  }
}

static int lower_op(lw *L, MlirOperation op, nv_op kind) {
  int nin = (int)mlirOperationGetNumOperands(op);
  tv in[64];
  for (int i = 0; i < nin && i < 64; i++) in[i] = map_get(L, mlirOperationGetOperand(op, i));
  MlirType rt = mlirValueGetType(mlirOperationGetResult(op, 0));
  tv res = {.rank = (int)mlirShapedTypeGetRank(rt), .dt = nova_dtype_of(rt)};
  for (int i = 0; i < res.rank; i++) res.shape[i] = mlirShapedTypeGetDimSize(rt, i);
  /* f16 and bf16 are storage types here: data movement takes them as they
   * are, every other op computes in f32 (its operands extended, its result
   * rounded once, as numpy computes float16 per operation) */
  nova_dtype narrow = (nova_dtype)0;
  bool bytes = kind == NV_OP_MAX_POOL && fe_dtype_is_int(res.dt); /* i8, u8: exact in f32 too */
  /* convolutions move their 16-bit operands as they are (padding, im2col,
   * transposes: half the bytes) and extend them where they compute
   * (lower_window.c): a contraction of extended 16-bit operands, which the
   * targets' 16-bit kernels read directly (half_contract.c) */
  bool conv = kind == NV_OP_CONV || kind == NV_OP_CONV_GRAD_INPUT || kind == NV_OP_CONV_GRAD_WEIGHT;
  if (computes(kind)) {
    for (int i = 0; i < nin && i < 64; i++)
      if ((fe_dtype_is_half(in[i].dt) && !conv) || bytes) in[i] = convert(L, in[i], NOVA_DTYPE_F32);
    if (fe_dtype_is_half(res.dt) || bytes) narrow = res.dt, res.dt = NOVA_DTYPE_F32;
  }
  const char *T = lw_ety(res.dt);
  char body[1024];
  tv r;
  switch (kind) {
  case NV_OP_CONSTANT: {
    r = lw_fresh(L, res.rank, res.shape, res.dt);
    nv_sbuf b = {0};
    MlirAttribute v = mlirOperationGetAttributeByName(op, nova_str("value"));
    if (fe_dtype_is_unsigned(res.dt)) /* the same bits in the signless type */
      v = mlirDenseElementsAttrRawBufferGet(
          mlirRankedTensorTypeGet(res.rank, res.shape, mlirIntegerTypeGet(L->c->ctx, 8 * (unsigned)fe_dtype_size(res.dt)),
                                  mlirAttributeGetNull()),
          mlirDenseElementsAttrIsSplat(v) ? fe_dtype_size(res.dt) : (size_t)lw_tv_numel(&res) * fe_dtype_size(res.dt),
          mlirDenseElementsAttrGetRawData(v));
    mlirAttributePrint(v, attr_cb, &b);
    lw_emit(L, "%%v%d = arith.constant %s", r.id, b.s ? b.s : "");
    nv_sb_free(&b);
    break;
  }
  case NV_OP_ADD:
  case NV_OP_SUB:
  case NV_OP_MUL:
  case NV_OP_DIV:
  case NV_OP_MINIMUM:
  case NV_OP_MAXIMUM:
  case NV_OP_POW: {
    bool fl = fe_dtype_is_float(res.dt), u = fe_dtype_is_unsigned(res.dt);
    const char *o = kind == NV_OP_ADD ? (fl ? "arith.addf" : "arith.addi")
                  : kind == NV_OP_SUB ? (fl ? "arith.subf" : "arith.subi")
                  : kind == NV_OP_MUL ? (fl ? "arith.mulf" : "arith.muli")
                  : kind == NV_OP_DIV ? (fl ? "arith.divf" : u ? "arith.divui" : "arith.divsi")
                  : kind == NV_OP_MINIMUM ? (fl ? "arith.minimumf" : u ? "arith.minui" : "arith.minsi")
                  : kind == NV_OP_MAXIMUM ? (fl ? "arith.maximumf" : u ? "arith.maxui" : "arith.maxsi") : "math.powf";
    if (kind == NV_OP_DIV && u) /* no trap: x / 0 = 0 */
      snprintf(body, sizeof body,
               "%%z = arith.constant 0 : %s\n%%one = arith.constant 1 : %s\n%%isz = arith.cmpi eq, %%in1, %%z : %s\n"
               "%%d = arith.select %%isz, %%one, %%in1 : %s\n%%q = arith.divui %%in0, %%d : %s\n"
               "%%r = arith.select %%isz, %%z, %%q : %s", T, T, T, T, T, T);
    else if (kind == NV_OP_DIV && !fl) /* no trap: x / 0 = 0, x / -1 = -x (wrapping) */
      snprintf(body, sizeof body,
               "%%z = arith.constant 0 : %s\n%%one = arith.constant 1 : %s\n%%m1 = arith.constant -1 : %s\n"
               "%%isz = arith.cmpi eq, %%in1, %%z : %s\n%%ism = arith.cmpi eq, %%in1, %%m1 : %s\n"
               "%%bad = arith.ori %%isz, %%ism : i1\n%%d = arith.select %%bad, %%one, %%in1 : %s\n"
               "%%q = arith.divsi %%in0, %%d : %s\n%%ng = arith.subi %%z, %%in0 : %s\n"
               "%%q2 = arith.select %%ism, %%ng, %%q : %s\n%%r = arith.select %%isz, %%z, %%q2 : %s",
               T, T, T, T, T, T, T, T, T, T);
    else
      snprintf(body, sizeof body, "%%r = %s %%in0, %%in1 : %s", o, T);
    r = lw_elementwise(L, 2, in, res.rank, res.shape, res.dt, body);
    break;
  }
  case NV_OP_AND:
  case NV_OP_OR:
  case NV_OP_XOR:
    snprintf(body, sizeof body, "%%r = arith.%s %%in0, %%in1 : %s", kind == NV_OP_AND ? "andi" : kind == NV_OP_OR ? "ori" : "xori", T);
    r = lw_elementwise(L, 2, in, res.rank, res.shape, res.dt, body);
    break;
  case NV_OP_SHL:
  case NV_OP_SHR: { /* a shift by the width or more (or a negative one) shifts everything out: 0, or the sign for a
                       signed right shift (LLVM leaves such shifts undefined) */
    bool sar = kind == NV_OP_SHR && !fe_dtype_is_unsigned(res.dt);
    int w = (int)(8 * fe_dtype_size(res.dt));
    snprintf(body, sizeof body,
             "%%w = arith.constant %d : %s\n%%z = arith.constant %d : %s\n%%big = arith.cmpi uge, %%in1, %%w : %s\n"
             "%%s = %s %%in0, %%in1 : %s\n%%out = %s : %s\n%%r = arith.select %%big, %%out, %%s : %s",
             w, T, sar ? w - 1 : 0, T, T, kind == NV_OP_SHL ? "arith.shli" : sar ? "arith.shrsi" : "arith.shrui", T,
             sar ? "arith.shrsi %in0, %z" : "arith.addi %z, %z", T, T);
    r = lw_elementwise(L, 2, in, res.rank, res.shape, res.dt, body);
    break;
  }
  case NV_OP_MOD:
  case NV_OP_FMOD:
    r = lw_elementwise(L, 2, in, res.rank, res.shape, res.dt, lw_mod_body(kind == NV_OP_FMOD, res.dt, body, sizeof body));
    break;
  case NV_OP_EQUAL:
  case NV_OP_LESS:
  case NV_OP_GREATER:
  case NV_OP_LESS_EQUAL:
  case NV_OP_GREATER_EQUAL: {
    bool fl = fe_dtype_is_float(in[0].dt), u = fe_dtype_is_unsigned(in[0].dt);
    const char *pred = kind == NV_OP_EQUAL ? (fl ? "oeq" : "eq")
                     : kind == NV_OP_LESS ? (fl ? "olt" : u ? "ult" : "slt")
                     : kind == NV_OP_LESS_EQUAL ? (fl ? "ole" : u ? "ule" : "sle")
                     : kind == NV_OP_GREATER_EQUAL ? (fl ? "oge" : u ? "uge" : "sge") : (fl ? "ogt" : u ? "ugt" : "sgt");
    snprintf(body, sizeof body, "%%r = %s %s, %%in0, %%in1 : %s", fl ? "arith.cmpf" : "arith.cmpi", pred,
             lw_ety(in[0].dt));
    r = lw_elementwise(L, 2, in, res.rank, res.shape, res.dt, body);
    break;
  }
  case NV_OP_WHERE:
    snprintf(body, sizeof body, "%%r = arith.select %%in0, %%in1, %%in2 : %s", T);
    r = lw_elementwise(L, 3, in, res.rank, res.shape, res.dt, body);
    break;
  case NV_OP_ABS: /* unsigned: x itself */
    if (fe_dtype_is_unsigned(res.dt)) body[0] = 0;
    else snprintf(body, sizeof body, "%%r = %s %%in0 : %s", fe_dtype_is_float(res.dt) ? "math.absf" : "math.absi", T);
    r = lw_elementwise(L, 1, in, res.rank, res.shape, res.dt, body);
    break;
  case NV_OP_CAST: r = convert(L, in[0], res.dt); break;
  case NV_OP_CONV: r = lw_lower_conv(L, op, in[0], in[1], &res); break;
  case NV_OP_MAX_POOL:
  case NV_OP_AVG_POOL: r = lw_lower_pool(L, op, kind, in[0], &res); break;
  case NV_OP_CONV_GRAD_INPUT: r = lw_lower_conv_grad_input(L, op, in[0], in[1], &res); break;
  case NV_OP_MAX_POOL_INDICES: r = lw_lower_pool_indices(L, op, in[0], in[1], &res); break;
  case NV_OP_CONV_GRAD_WEIGHT: r = lw_lower_conv_grad_weight(L, op, in[0], in[1], &res); break;
  case NV_OP_MAX_POOL_GRAD:
  case NV_OP_AVG_POOL_GRAD: r = lw_lower_pool_grad(L, op, kind, in, &res); break;
  case NV_OP_NEG: case NV_OP_EXP: case NV_OP_LOG: case NV_OP_SQRT: case NV_OP_TANH:
  case NV_OP_SIGMOID: case NV_OP_RELU: case NV_OP_GELU: case NV_OP_ERF:
  case NV_OP_SIN: case NV_OP_COS: case NV_OP_TAN: case NV_OP_ASIN: case NV_OP_ACOS: case NV_OP_ATAN:
  case NV_OP_SINH: case NV_OP_COSH: case NV_OP_ASINH: case NV_OP_ACOSH: case NV_OP_ATANH:
  case NV_OP_FLOOR: case NV_OP_CEIL: case NV_OP_ROUND: case NV_OP_ISNAN: case NV_OP_ISINF: case NV_OP_NOT:
  case NV_OP_SIGN:
    r = lw_elementwise(L, 1, in, res.rank, res.shape, res.dt, unary_body(kind, in[0].dt, body, sizeof body));
    break;
  case NV_OP_MATMUL: r = lw_matmul(L, in[0], in[1], &res); break;
  case NV_OP_SOFTMAX:
  case NV_OP_LOG_SOFTMAX: r = lower_softmax(L, in[0], (int)lw_iattr(op, "axis"), kind == NV_OP_LOG_SOFTMAX); break;
  case NV_OP_LAYER_NORM:
    r = lower_layer_norm(L, in[0], in[1], in[2], lw_fattr(op, "eps"));
    break;
  case NV_OP_REDUCE_SUM:
  case NV_OP_REDUCE_MEAN:
  case NV_OP_REDUCE_MAX:
  case NV_OP_REDUCE_MIN:
  case NV_OP_REDUCE_PROD: r = lower_reduce(L, kind, in[0], op, &res); break;
  case NV_OP_RESHAPE: r = lw_reshape(L, in[0], res.rank, res.shape); break;
  case NV_OP_TRANSPOSE: {
    int64_t perm[NOVA_MAX_RANK];
    lw_iarray(op, "perm", perm);
    r = lw_transpose(L, in[0], perm);
    break;
  }
  case NV_OP_BROADCAST: r = lw_elementwise(L, 1, in, res.rank, res.shape, res.dt, ""); break;
  case NV_OP_CONCAT: r = lower_concat(L, nin, in, (int)lw_iattr(op, "axis"), &res); break;
  case NV_OP_SLICE: r = lower_slice(L, in[0], op, &res); break;
  case NV_OP_GATHER: r = lower_gather(L, in[0], in[1], (int)lw_iattr(op, "axis"), &res); break;
  case NV_OP_CROSS_ENTROPY: r = lower_cross_entropy(L, in[0], in[1]); break;
  case NV_OP_GATHER_ELEMENTS: r = lw_lower_gather_elements(L, in[0], in[1], (int)lw_iattr(op, "axis"), &res); break;
  case NV_OP_SCATTER_ELEMENTS:
    r = lw_lower_scatter_elements(L, in, (int)lw_iattr(op, "axis"), (int)lw_iattr(op, "mode"), &res);
    break;
  case NV_OP_GATHER_ND: r = lw_lower_gather_nd(L, in[0], in[1], (int)lw_iattr(op, "batch_dims"), &res); break;
  case NV_OP_SCATTER_ND: r = lw_lower_scatter_nd(L, in, (int)lw_iattr(op, "mode"), &res); break;
  case NV_OP_CUMSUM: r = lw_lower_cumsum(L, in[0], (int)lw_iattr(op, "axis"), (int)lw_iattr(op, "mode"), &res); break;
  case NV_OP_DROPOUT: r = lw_lower_dropout(L, op, in[0], in[1], in[2], &res); break;
  case NV_OP_STOCHASTIC_ROUND: r = lw_lower_sround(L, op, in[0], in[1], in[2], &res); break;
  case NV_OP_ATTENTION: r = lw_lower_attention(L, op, in, &res); break;
  case NV_OP_RMS_NORM:
    r = lower_rms_norm(L, in[0], in[1], mlirFloatAttrGetValueDouble(mlirOperationGetAttributeByName(op, nova_str("eps"))));
    break;
  case NV_OP_ROTARY: r = lower_rotary(L, in[0], in[1], in[2], lw_iattr(op, "interleaved") != 0); break;
  case NV_OP_ALL_REDUCE:
  case NV_OP_REDUCE_SCATTER:
  case NV_OP_ALL_GATHER:
  case NV_OP_SHARD: {
    /* a call of a declared function (opaque to fusion and bufferization alike) that
     * codegen/comm_calls.c makes the runtime's calls after bufferization */
    if (kind == NV_OP_ALL_REDUCE && lw_tv_numel(&in[0]) == 0) {
      r = in[0];
      break;
    }
    MlirType out_t = mlirValueGetType(mlirOperationGetResult(op, 0));
    int64_t shape[NOVA_MAX_RANK];
    int rank = (int)mlirShapedTypeGetRank(out_t);
    for (int k = 0; k < rank; k++) shape[k] = mlirShapedTypeGetDimSize(out_t, k);
    r = lw_fresh(L, rank, shape, in[0].dt);
    int ck = kind == NV_OP_ALL_REDUCE ? CG_COMM_ALL_REDUCE : kind == NV_OP_REDUCE_SCATTER ? CG_COMM_REDUCE_SCATTER
             : kind == NV_OP_ALL_GATHER ? CG_COMM_ALL_GATHER : CG_COMM_SHARD;
    long long bucket = kind == NV_OP_SHARD ? -1 : (long long)lw_iattr(op, "bucket");
    long long world = kind == NV_OP_ALL_REDUCE ? 0 : (long long)lw_iattr(op, "world");
    lw_emit(L, "%%v%d = func.call @" CG_COMM_MARKER "%d(%%v%d) {nova.comm = array<i64: %d, %lld, %lld>} : (%s) -> %s",
            r.id, r.id, in[0].id, ck, bucket, world, TT(in[0]), TT(r));
    nv_sb_printf(&L->decls, "  func.func private @" CG_COMM_MARKER "%d(%s) -> %s\n", r.id, TT(in[0]), TT(r));
    break;
  }
  default:
    nv_error_plain(L->c->diag, "internal: no lowering for nova.%s", nv_op_name(kind));
    return -1;
  }
  if (narrow) r = convert(L, r, narrow);
  map_put(L, mlirOperationGetResult(op, 0), r);
  return 0;
}

/* " loc("file":line:col)" for op, with the file name escaped. */
static void set_loc(lw *L, MlirOperation op) {
  nv_sbuf b = {0};
  MlirLocation l = mlirOperationGetLocation(op);
  MlirAttribute a = mlirLocationGetAttribute(l);
  mlirAttributePrint(a, attr_cb, &b);
  if (b.s && b.len < sizeof L->loc - 8) snprintf(L->loc, sizeof L->loc, " %s", b.s);
  else L->loc[0] = 0;
  nv_sb_free(&b);
}

MlirModule cg_lower_to_linalg(nova_ctx *c, MlirModule m) {
  lw L = {.c = c};
  MlirOperation func = mlirBlockGetFirstOperation(mlirModuleGetBody(m));
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetFirstRegion(func));
  size_t nops = 0;
  for (MlirOperation o = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o))
    nops++;
  int nargs = (int)mlirBlockGetNumArguments(body);
  L.mapcap = 64;
  while (L.mapcap < 2 * (nops + (size_t)nargs)) L.mapcap *= 2;
  L.map = nv_xcalloc(L.mapcap, sizeof *L.map);
  if (!L.map) return (MlirModule){NULL};

  /* signature: same arguments (read-only buffers) and results */
  MlirAttribute argattrs = mlirOperationGetAttributeByName(func, nova_str("arg_attrs"));
  MlirStringRef fname = mlirStringAttrGetValue(mlirOperationGetAttributeByName(func, nova_str("sym_name")));
  nv_sb_printf(&L.out, "module {\n  func.func @%.*s(", (int)fname.length, fname.data);
  /* Empty tensors (a 0 dimension) cross the function boundary as a
   * one-element placeholder: the bare-pointer calling convention does not
   * take 0-sized memrefs, and an empty tensor carries no data anyway. */
  int nempty = 0, empties[256];
  for (int i = 0; i < nargs; i++) {
    MlirValue a = mlirBlockGetArgument(body, i);
    MlirType t = mlirValueGetType(a);
    tv v = {.id = L.next_id++, .rank = (int)mlirShapedTypeGetRank(t), .dt = nova_dtype_of(t)};
    for (int k = 0; k < v.rank; k++) v.shape[k] = mlirShapedTypeGetDimSize(t, k);
    map_put(&L, a, v);
    if (lw_tv_numel(&v) == 0 && nempty < 256) {
      empties[nempty++] = i;
      v.rank = 1;
      v.shape[0] = 1;
    }
    nv_sbuf d = {0};
    if (!mlirAttributeIsNull(argattrs)) mlirAttributePrint(mlirArrayAttrGetElement(argattrs, i), attr_cb, &d);
    /* drop the closing brace of the dictionary and add writable = false */
    if (d.s && d.len > 2) d.s[d.len - 1] = 0;
    nv_sb_printf(&L.out, "%s%%v%d: %s %s%sbufferization.writable = false}", i ? ", " : "", v.id, TT(v),
                 d.s && d.len > 2 ? d.s : "{", d.s && d.len > 2 ? ", " : "");
    nv_sb_free(&d);
  }
  nv_sb_printf(&L.out, ") -> (");
  MlirType fty = mlirTypeAttrGetValue(mlirOperationGetAttributeByName(func, nova_str("function_type")));
  int nres = (int)mlirFunctionTypeGetNumResults(fty);
  for (int i = 0; i < nres; i++) {
    MlirType t = mlirFunctionTypeGetResult(fty, i);
    tv v = {.rank = (int)mlirShapedTypeGetRank(t), .dt = nova_dtype_of(t)};
    for (int k = 0; k < v.rank; k++) v.shape[k] = mlirShapedTypeGetDimSize(t, k);
    if (lw_tv_numel(&v) == 0) v.rank = 1, v.shape[0] = 1;
    nv_sb_printf(&L.out, "%s%s", i ? ", " : "", TT(v));
  }
  nv_sb_printf(&L.out, ") {\n");

  for (int e = 0; e < nempty; e++) { /* the real (empty) value of a placeholder argument */
    tv v = map_get(&L, mlirBlockGetArgument(body, empties[e]));
    tv r = lw_empty(&L, v.rank, v.shape, v.dt);
    map_put(&L, mlirBlockGetArgument(body, empties[e]), r);
  }
  int rc = 0;
  for (MlirOperation o = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(o) && !rc;
       o = mlirOperationGetNextInBlock(o)) {
    nv_op kind = nova_op_kind(o);
    set_loc(&L, o);
    MlirAttribute tag = mlirOperationGetAttributeByName(o, nova_str("nova.recompute"));
    L.recompute = !mlirAttributeIsNull(tag) && mlirAttributeIsAInteger(tag) ? mlirIntegerAttrGetValueInt(tag) : 0;
    if (kind != NV_OP_COUNT) {
      rc = lower_op(&L, o, kind);
      continue;
    }
    /* func.return */
    int n = (int)mlirOperationGetNumOperands(o);
    L.loc[0] = 0;
    nv_sbuf b = {0};
    tv *rv = nv_xcalloc((size_t)n + 1, sizeof *rv);
    if (!rv) {
      rc = -1;
      break;
    }
    for (int i = 0; i < n; i++) {
      rv[i] = map_get(&L, mlirOperationGetOperand(o, i));
      if (lw_tv_numel(&rv[i]) == 0) rv[i] = lw_filled(&L, 1, (int64_t[]){1}, rv[i].dt, 0.0); /* placeholder */
    }
    nv_sb_printf(&b, "return ");
    for (int i = 0; i < n; i++) nv_sb_printf(&b, "%s%%v%d", i ? ", " : "", rv[i].id);
    nv_sb_printf(&b, " : ");
    for (int i = 0; i < n; i++) nv_sb_printf(&b, "%s%s", i ? ", " : "", TT(rv[i]));
    lw_emit(&L, "%s", b.s ? b.s : "");
    nv_sb_free(&b);
    free(rv);
  }
  nv_sb_printf(&L.out, "  }\n%s}\n", L.decls.s ? L.decls.s : "");
  if (L.decls.oom) L.out.oom = true;
  nv_sb_free(&L.decls);
  free(L.map);
  MlirModule out = {NULL};
  if (!rc && !L.out.oom) {
    if (getenv("NOVAC_DEBUG_LINALG_TEXT")) fputs(L.out.s, stderr);
    out = mlirModuleCreateParse(c->ctx, nova_str(L.out.s));
  }
  nv_sb_free(&L.out);
  return out;
}
