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

#include "../driver/util.h"
#include "codegen.h"

typedef struct tv { /* a tensor value in the emitted text */
  int id;
  int rank;
  int64_t shape[NOVA_MAX_RANK];
  nova_dtype dt;
} tv;

typedef struct vmap_ent {
  const void *key;
  tv val;
} vmap_ent;

typedef struct lw {
  nova_ctx *c;
  nv_sbuf out;
  int next_id;
  char loc[600];       /* " loc(...)" of the nova op being lowered */
  vmap_ent *map;       /* open addressing, MlirValue.ptr -> tv */
  size_t mapcap;
} lw;

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

static const char *ety(nova_dtype dt) {
  switch (dt) {
  case NOVA_DTYPE_F64: return "f64";
  case NOVA_DTYPE_I32: return "i32";
  case NOVA_DTYPE_I64: return "i64";
  case NOVA_DTYPE_F16: return "f16";
  case NOVA_DTYPE_BF16: return "bf16";
  case NOVA_DTYPE_BOOL: return "i1";
  default: return "f32";
  }
}

/* "tensor<8x784xf32>" */
static const char *ttype(char *buf, size_t n, int rank, const int64_t *shape, nova_dtype dt) {
  size_t k = (size_t)snprintf(buf, n, "tensor<");
  for (int i = 0; i < rank; i++) k += (size_t)snprintf(buf + k, n - k, "%lldx", (long long)shape[i]);
  snprintf(buf + k, n - k, "%s>", ety(dt));
  return buf;
}
#define TT(t) ttype((char[200]){0}, 200, (t).rank, (t).shape, (t).dt)

/* A float literal that MLIR parses back to exactly v in dtype dt. */
static const char *flit(char *buf, size_t n, double v, nova_dtype dt) {
  if (isinf(v)) {
    snprintf(buf, n, dt == NOVA_DTYPE_F64 ? "0x%cFF0000000000000" : "0x%cF800000", v < 0 ? 'F' : '7');
    return buf;
  }
  if (dt == NOVA_DTYPE_F64) snprintf(buf, n, "%.17e", v);
  else snprintf(buf, n, "%.9e", (double)(float)v);
  return buf;
}
#define FL(v, dt) flit((char[64]){0}, 64, (v), (dt))

static void emit(lw *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(lw *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nv_sb_printf(&L->out, "    ");
  nv_sb_vprintf(&L->out, fmt, ap);
  va_end(ap);
  nv_sb_printf(&L->out, "%s\n", L->loc);
}

static tv fresh(lw *L, int rank, const int64_t *shape, nova_dtype dt) {
  tv t = {.id = L->next_id++, .rank = rank, .dt = dt};
  if (rank) memcpy(t.shape, shape, (size_t)rank * sizeof *shape);
  return t;
}

static tv empty(lw *L, int rank, const int64_t *shape, nova_dtype dt) {
  tv t = fresh(L, rank, shape, dt);
  emit(L, "%%v%d = tensor.empty() : %s", t.id, TT(t));
  return t;
}

static tv filled(lw *L, int rank, const int64_t *shape, nova_dtype dt, double v) {
  tv e = empty(L, rank, shape, dt);
  int c = L->next_id++;
  if (fe_dtype_is_float(dt)) emit(L, "%%v%d = arith.constant %s : %s", c, FL(v, dt), ety(dt));
  else emit(L, "%%v%d = arith.constant %lld : %s", c, (long long)v, ety(dt));
  tv f = fresh(L, rank, shape, dt);
  emit(L, "%%v%d = linalg.fill ins(%%v%d : %s) outs(%%v%d : %s) -> %s", f.id, c, ety(dt), e.id,
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
static tv generic(lw *L, int nin, const tv *ins, const int *const *maps, int nloops, const char *iters,
                  const int *outmap, int orank, const int64_t *oshape, nova_dtype odt, tv init,
                  const char *body) {
  if (init.id < 0) init = empty(L, orank, oshape, odt);
  tv r = fresh(L, orank, oshape, odt);
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
  for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%%in%d: %s, ", i, ety(ins[i].dt));
  nv_sb_printf(&b, "%%acc: %s):\n", ety(odt));
  /* body lines, each indented */
  for (const char *p = body; *p;) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n) nv_sb_printf(&b, "      %.*s%s\n", (int)n, p, L->loc);
    p += n + (e ? 1 : 0);
  }
  nv_sb_printf(&b, "      linalg.yield %s : %s%s\n    } -> %s", *body ? "%r" : "%in0", ety(odt), L->loc, TT(r));
  emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

static const tv NO_INIT = {.id = -1};

static int64_t tv_numel(const tv *t) {
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
static tv elementwise(lw *L, int nin, const tv *ins, int orank, const int64_t *oshape, nova_dtype odt,
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

/* Reduction of x over red[] (kind '+' or 'M' for max), result without the
 * reduced axes.  pre: body lines computing %t from %in0.. (extra inputs
 * given in more[], read through drop maps); NULL: %t = %in0. */
static tv reduce(lw *L, tv x, const bool *red, char kind, int nmore, const tv *more, const char *pre) {
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
  tv init = filled(L, orank, os, x.dt, kind == 'M' ? -INFINITY : 0.0);
  const char *op = kind == 'M' ? "arith.maximumf" : "arith.addf";
  char body[600];
  if (pre)
    snprintf(body, sizeof body, "%s%%r = %s %%t, %%acc : %s", pre, op, ety(x.dt));
  else /* plain reduction: the element itself */
    snprintf(body, sizeof body, "%%r = %s %%in0, %%acc : %s", op, ety(x.dt));
  return generic(L, 1 + nmore, ins, mp, x.rank, iters, om, orank, os, x.dt, init, body);
}

/* x reshaped to shape (same element count), through a collapse to 1-D and
 * an expand; rank 0 on either side uses an empty reassociation. */
static tv reshape(lw *L, tv x, int rank, const int64_t *shape) {
  if (x.rank == rank && !memcmp(x.shape, shape, (size_t)rank * sizeof *shape)) return x;
  int64_t n = 1;
  for (int i = 0; i < x.rank; i++) n *= x.shape[i];
  tv flat = x;
  if (x.rank > 1 || (x.rank == 1 && rank == 0) || (x.rank > 0 && rank == 0)) {
    int64_t one = n;
    flat = fresh(L, rank == 0 ? 0 : 1, &one, x.dt);
    nv_sbuf b = {0};
    nv_sb_printf(&b, "%%v%d = tensor.collapse_shape %%v%d [", flat.id, x.id);
    if (rank != 0) {
      nv_sb_printf(&b, "[");
      for (int i = 0; i < x.rank; i++) nv_sb_printf(&b, "%s%d", i ? ", " : "", i);
      nv_sb_printf(&b, "]");
    }
    nv_sb_printf(&b, "] : %s into %s", TT(x), TT(flat));
    emit(L, "%s", b.s ? b.s : "");
    nv_sb_free(&b);
  }
  if (rank == flat.rank) return flat;
  tv r = fresh(L, rank, shape, x.dt);
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
  emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* ---- per-op rules ----------------------------------------------------- */

static int64_t iattr(MlirOperation op, const char *name) {
  return mlirIntegerAttrGetValueInt(mlirOperationGetAttributeByName(op, nova_str(name)));
}

static int iarray(MlirOperation op, const char *name, int64_t *out) {
  MlirAttribute a = mlirOperationGetAttributeByName(op, nova_str(name));
  int n = (int)mlirDenseArrayGetNumElements(a);
  for (int i = 0; i < n && i < NOVA_MAX_RANK; i++) out[i] = mlirDenseI64ArrayGetElement(a, i);
  return n;
}

static void attr_cb(MlirStringRef s, void *ud) { nv_sb_printf(ud, "%.*s", (int)s.length, s.data); }

static const char *unary_body(nv_op op, nova_dtype dt, char *buf, size_t n) {
  const char *T = ety(dt);
  switch (op) {
  case NV_OP_NEG: snprintf(buf, n, "%%r = arith.negf %%in0 : %s", T); break;
  case NV_OP_EXP: snprintf(buf, n, "%%r = math.exp %%in0 : %s", T); break;
  case NV_OP_LOG: snprintf(buf, n, "%%r = math.log %%in0 : %s", T); break;
  case NV_OP_SQRT: snprintf(buf, n, "%%r = math.sqrt %%in0 : %s", T); break;
  case NV_OP_TANH: snprintf(buf, n, "%%r = math.tanh %%in0 : %s", T); break;
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

/* Converts %in0 from dtype `from` to `to` into %r ("" when equal). */
static const char *cast_body(nova_dtype from, nova_dtype to, char *buf, size_t n) {
  const char *F = ety(from), *T = ety(to);
  bool ff = fe_dtype_is_float(from), ft = fe_dtype_is_float(to);
  size_t wf = fe_dtype_size(from), wt = fe_dtype_size(to);
  if (from == to) buf[0] = 0;
  else if (to == NOVA_DTYPE_BOOL)
    snprintf(buf, n, "%%z = arith.constant %s : %s\n%%r = %s %%in0, %%z : %s", ff ? FL(0.0, from) : "0", F,
             ff ? "arith.cmpf une," : "arith.cmpi ne,", F);
  else if (from == NOVA_DTYPE_BOOL)
    snprintf(buf, n, "%%r = %s %%in0 : i1 to %s", ft ? "arith.uitofp" : "arith.extui", T);
  else if (ff && ft)
    snprintf(buf, n, "%%r = %s %%in0 : %s to %s", wt > wf ? "arith.extf" : "arith.truncf", F, T);
  else if (ff)
    snprintf(buf, n, "%%r = arith.fptosi %%in0 : %s to %s", F, T);
  else if (ft)
    snprintf(buf, n, "%%r = arith.sitofp %%in0 : %s to %s", F, T);
  else
    snprintf(buf, n, "%%r = %s %%in0 : %s to %s", wt > wf ? "arith.extsi" : "arith.trunci", F, T);
  return buf;
}

static tv lower_matmul(lw *L, tv a, tv b, const tv *res) {
  if (a.rank == 2) {
    tv f = filled(L, res->rank, res->shape, res->dt, 0.0);
    tv r = fresh(L, res->rank, res->shape, res->dt);
    emit(L, "%%v%d = linalg.matmul ins(%%v%d, %%v%d : %s, %s) outs(%%v%d : %s) -> %s", r.id, a.id, b.id,
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
  tv f = filled(L, res->rank, res->shape, res->dt, 0.0);
  char body[256];
  snprintf(body, sizeof body, "%%p = arith.mulf %%in0, %%in1 : %s\n%%r = arith.addf %%acc, %%p : %s",
           ety(a.dt), ety(a.dt));
  return generic(L, 2, ins, mp, nl, iters, om, res->rank, res->shape, res->dt, f, body);
}

static tv lower_softmax(lw *L, tv x, int axis, bool logsm) {
  bool red[NOVA_MAX_RANK] = {0};
  red[axis] = true;
  const char *T = ety(x.dt);
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
  const char *T = ety(x.dt);
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

static tv lower_reduce(lw *L, nv_op kind, tv x, MlirOperation op, const tv *res) {
  int64_t axes[NOVA_MAX_RANK];
  int n = iarray(op, "axes", axes);
  bool red[NOVA_MAX_RANK] = {0};
  int64_t count = 1;
  for (int i = 0; i < n; i++) {
    red[axes[i]] = true;
    count *= x.shape[axes[i]];
  }
  tv r = reduce(L, x, red, kind == NV_OP_REDUCE_MAX ? 'M' : '+', 0, NULL, NULL);
  if (kind == NV_OP_REDUCE_MEAN) {
    char body[200];
    snprintf(body, sizeof body, "%%c = arith.constant %s : %s\n%%r = arith.divf %%in0, %%c : %s",
             FL((double)count, x.dt), ety(x.dt), ety(x.dt));
    r = elementwise(L, 1, &r, r.rank, r.shape, r.dt, body);
  }
  return reshape(L, r, res->rank, res->shape); /* keepdims */
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
               ety(idx.dt), (long long)data.shape[axis]);
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
  const char *T = ety(x.dt);
  tv m = reduce(L, x, red, 'M', 0, NULL, NULL);
  char pre[300];
  snprintf(pre, sizeof pre, "%%d = arith.subf %%in0, %%in1 : %s\n%%t = math.exp %%d : %s\n", T, T);
  tv s = reduce(L, x, red, '+', 1, &m, pre);
  int id[NOVA_MAX_RANK];
  iota(id, lab.rank);
  tv ins[3] = {lab, m, s};
  const int *mp[3] = {id, id, id};
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%i = arith.index_cast %%in0 : %s to index\n", ety(lab.dt));
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
  return elementwise(L, 1, &tot, 0, NULL, x.dt, body);
}

static tv lower_concat(lw *L, int n, const tv *in, int axis, const tv *res) {
  tv acc = empty(L, res->rank, res->shape, res->dt);
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    if (tv_numel(&in[i]) == 0) continue; /* an empty operand adds nothing */
    tv r = fresh(L, res->rank, res->shape, res->dt);
    nv_sbuf b = {0};
    nv_sb_printf(&b, "%%v%d = tensor.insert_slice %%v%d into %%v%d[", r.id, in[i].id, acc.id);
    for (int j = 0; j < res->rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)(j == axis ? off : 0));
    nv_sb_printf(&b, "] [");
    for (int j = 0; j < res->rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)in[i].shape[j]);
    nv_sb_printf(&b, "] [");
    for (int j = 0; j < res->rank; j++) nv_sb_printf(&b, "%s1", j ? ", " : "");
    nv_sb_printf(&b, "] : %s into %s", TT(in[i]), TT(r));
    emit(L, "%s", b.s ? b.s : "");
    nv_sb_free(&b);
    off += in[i].shape[axis];
    acc = r;
  }
  return acc;
}

static tv lower_slice(lw *L, tv x, MlirOperation op, const tv *res) {
  int axis = (int)iattr(op, "axis");
  int64_t start = iattr(op, "start"), step = iattr(op, "step");
  if (tv_numel(res) == 0) return empty(L, res->rank, res->shape, res->dt); /* nothing to copy */
  tv r = fresh(L, res->rank, res->shape, res->dt);
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = tensor.extract_slice %%v%d[", r.id, x.id);
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)(j == axis ? start : 0));
  nv_sb_printf(&b, "] [");
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)res->shape[j]);
  nv_sb_printf(&b, "] [");
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, "%s%lld", j ? ", " : "", (long long)(j == axis ? step : 1));
  nv_sb_printf(&b, "] : %s to %s", TT(x), TT(r));
  emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* ---- convolution and pooling ------------------------------------------ */

typedef struct window {
  int ns;
  int64_t k[3], s[3], dl[3], pb[3], pe[3];
} window;

/* x padded with `value` so every window of the result lies inside it. */
static tv pad_for(lw *L, tv x, const window *w, const tv *res, double value) {
  int64_t hi[3], shape[NOVA_MAX_RANK];
  bool any = false;
  memcpy(shape, x.shape, sizeof shape);
  for (int i = 0; i < w->ns; i++) {
    int64_t need = (res->shape[2 + i] - 1) * w->s[i] + w->dl[i] * (w->k[i] - 1) + 1 - (x.shape[2 + i] + w->pb[i]);
    hi[i] = need > 0 ? need : 0;
    shape[2 + i] = x.shape[2 + i] + w->pb[i] + hi[i];
    any |= w->pb[i] || hi[i];
  }
  if (!any) return x;
  tv r = fresh(L, x.rank, shape, x.dt);
  int c = L->next_id++;
  emit(L, "%%v%d = arith.constant %s : %s", c, FL(value, x.dt), ety(x.dt));
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = tensor.pad %%v%d low[0, 0", r.id, x.id);
  for (int i = 0; i < w->ns; i++) nv_sb_printf(&b, ", %lld", (long long)w->pb[i]);
  nv_sb_printf(&b, "] high[0, 0");
  for (int i = 0; i < w->ns; i++) nv_sb_printf(&b, ", %lld", (long long)hi[i]);
  nv_sb_printf(&b, "] {\n    ^bb0(");
  for (int i = 0; i < x.rank; i++) nv_sb_printf(&b, "%s%%i%d: index", i ? ", " : "", i);
  nv_sb_printf(&b, "):\n      tensor.yield %%v%d : %s\n    } : %s to %s", c, ety(x.dt), TT(x), TT(r));
  emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* A structured op whose maps are given as text (strided windows). */
static tv generic_text(lw *L, int nin, const tv *ins, const char *const *maps, const char *outmap, int nloops,
                       const char *iters, tv init, const char *body) {
  tv r = fresh(L, init.rank, init.shape, init.dt);
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = linalg.generic {indexing_maps = [", r.id);
  for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%s, ", maps[i]);
  nv_sb_printf(&b, "%s], iterator_types = [", outmap);
  for (int i = 0; i < nloops; i++) nv_sb_printf(&b, "%s\"%s\"", i ? ", " : "", iters[i] == 'r' ? "reduction" : "parallel");
  nv_sb_printf(&b, "]} ins(");
  for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%s%%v%d", i ? ", " : "", ins[i].id);
  nv_sb_printf(&b, " : ");
  for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%s%s", i ? ", " : "", TT(ins[i]));
  nv_sb_printf(&b, ") outs(%%v%d : %s) {\n    ^bb0(", init.id, TT(init));
  for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%%in%d: %s, ", i, ety(ins[i].dt));
  nv_sb_printf(&b, "%%acc: %s):\n", ety(init.dt));
  for (const char *p = body; *p;) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n) nv_sb_printf(&b, "      %.*s%s\n", (int)n, p, L->loc);
    p += n + (e ? 1 : 0);
  }
  nv_sb_printf(&b, "      linalg.yield %%r : %s%s\n    } -> %s", ety(init.dt), L->loc, TT(r));
  emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* "affine_map<(d0, ...) -> (" with nloops dims. */
static void map_head(nv_sbuf *b, int nloops) {
  nv_sb_printf(b, "affine_map<(");
  for (int i = 0; i < nloops; i++) nv_sb_printf(b, "%sd%d", i ? ", " : "", i);
  nv_sb_printf(b, ") -> (");
}

static void read_window(MlirOperation op, window *w, int ns) {
  int64_t v[6];
  w->ns = ns;
  for (int i = 0; i < ns; i++) w->k[i] = w->s[i] = w->dl[i] = 1, w->pb[i] = w->pe[i] = 0;
  if (!mlirAttributeIsNull(mlirOperationGetAttributeByName(op, nova_str("kernel")))) {
    iarray(op, "kernel", v);
    memcpy(w->k, v, (size_t)ns * sizeof *v);
  }
  iarray(op, "strides", v);
  memcpy(w->s, v, (size_t)ns * sizeof *v);
  if (!mlirAttributeIsNull(mlirOperationGetAttributeByName(op, nova_str("dilations")))) {
    iarray(op, "dilations", v);
    memcpy(w->dl, v, (size_t)ns * sizeof *v);
  }
  iarray(op, "pads", v);
  for (int i = 0; i < ns; i++) w->pb[i] = v[i], w->pe[i] = v[ns + i];
}

/* conv: x [N, C, S...], w [F, C/G, K...] -> [N, F, O...], computed as
 * [N, G, F/G, O...] over loops (n, g, f, o..., c, k...). */
static tv lower_conv(lw *L, MlirOperation op, tv x, tv wt, const tv *res) {
  int ns = x.rank - 2;
  window w;
  read_window(op, &w, ns);
  for (int i = 0; i < ns; i++) w.k[i] = wt.shape[2 + i];
  int64_t G = iattr(op, "groups"), C = x.shape[1], F = wt.shape[0], Cg = C / G, Fg = F / G;
  tv xp = pad_for(L, x, &w, res, 0.0);
  int64_t xs[NOVA_MAX_RANK] = {xp.shape[0], G, Cg}, ws[NOVA_MAX_RANK] = {G, Fg, Cg}, os[NOVA_MAX_RANK] = {res->shape[0], G, Fg};
  for (int i = 0; i < ns; i++) xs[3 + i] = xp.shape[2 + i], ws[3 + i] = w.k[i], os[3 + i] = res->shape[2 + i];
  tv xg = reshape(L, xp, ns + 3, xs), wg = reshape(L, wt, ns + 3, ws);
  int nl = 4 + 2 * ns; /* n g f o... c k... */
  char iters[16] = {0};
  for (int i = 0; i < nl; i++) iters[i] = i < 3 + ns ? 'p' : 'r';
  nv_sbuf mx = {0}, mw = {0}, mo = {0};
  map_head(&mx, nl);
  nv_sb_printf(&mx, "d0, d1, d%d", 3 + ns);
  for (int i = 0; i < ns; i++)
    nv_sb_printf(&mx, ", d%d * %lld + d%d * %lld", 3 + i, (long long)w.s[i], 4 + ns + i, (long long)w.dl[i]);
  nv_sb_printf(&mx, ")>");
  map_head(&mw, nl);
  nv_sb_printf(&mw, "d1, d2, d%d", 3 + ns);
  for (int i = 0; i < ns; i++) nv_sb_printf(&mw, ", d%d", 4 + ns + i);
  nv_sb_printf(&mw, ")>");
  map_head(&mo, nl);
  nv_sb_printf(&mo, "d0, d1, d2");
  for (int i = 0; i < ns; i++) nv_sb_printf(&mo, ", d%d", 3 + i);
  nv_sb_printf(&mo, ")>");
  tv init = filled(L, ns + 3, os, x.dt, 0.0);
  char body[200];
  snprintf(body, sizeof body, "%%p = arith.mulf %%in0, %%in1 : %s\n%%r = arith.addf %%acc, %%p : %s", ety(x.dt), ety(x.dt));
  tv ins[2] = {xg, wg};
  const char *maps[2] = {mx.s, mw.s};
  tv y = generic_text(L, 2, ins, maps, mo.s, nl, iters, init, body);
  nv_sb_free(&mx);
  nv_sb_free(&mw);
  nv_sb_free(&mo);
  return reshape(L, y, res->rank, res->shape);
}

/* Window positions of output o on one axis that fall inside [lo, hi). */
static int64_t window_count(int64_t o, const window *w, int i, int64_t lo, int64_t hi) {
  int64_t n = 0;
  for (int64_t k = 0; k < w->k[i]; k++) {
    int64_t p = o * w->s[i] + k * w->dl[i] - w->pb[i];
    n += p >= lo && p < hi;
  }
  return n;
}

/* max_pool / avg_pool over loops (n, c, o..., k...), with a [K...] window
 * operand giving the k loops their range. */
static tv lower_pool(lw *L, MlirOperation op, nv_op kind, tv x, const tv *res) {
  int ns = x.rank - 2;
  window w;
  read_window(op, &w, ns);
  bool avg = kind == NV_OP_AVG_POOL;
  tv xp = pad_for(L, x, &w, res, avg ? 0.0 : -INFINITY);
  tv win = empty(L, ns, w.k, x.dt);
  int nl = 2 + 2 * ns;
  char iters[16] = {0};
  for (int i = 0; i < nl; i++) iters[i] = i < 2 + ns ? 'p' : 'r';
  nv_sbuf mx = {0}, mw = {0}, mo = {0};
  map_head(&mx, nl);
  nv_sb_printf(&mx, "d0, d1");
  for (int i = 0; i < ns; i++)
    nv_sb_printf(&mx, ", d%d * %lld + d%d * %lld", 2 + i, (long long)w.s[i], 2 + ns + i, (long long)w.dl[i]);
  nv_sb_printf(&mx, ")>");
  map_head(&mw, nl);
  for (int i = 0; i < ns; i++) nv_sb_printf(&mw, "%sd%d", i ? ", " : "", 2 + ns + i);
  nv_sb_printf(&mw, ")>");
  map_head(&mo, nl);
  nv_sb_printf(&mo, "d0, d1");
  for (int i = 0; i < ns; i++) nv_sb_printf(&mo, ", d%d", 2 + i);
  nv_sb_printf(&mo, ")>");
  tv init = filled(L, res->rank, res->shape, x.dt, avg ? 0.0 : -INFINITY);
  char body[200];
  snprintf(body, sizeof body, "%%r = %s %%in0, %%acc : %s", avg ? "arith.addf" : "arith.maximumf", ety(x.dt));
  tv ins[2] = {xp, win};
  const char *maps[2] = {mx.s, mw.s};
  tv y = generic_text(L, 2, ins, maps, mo.s, nl, iters, init, body);
  nv_sb_free(&mx);
  nv_sb_free(&mw);
  nv_sb_free(&mo);
  if (!avg) return y;
  /* divide by the number of elements each window counts: a constant over O... */
  bool incl = iattr(op, "count_include_pad") != 0;
  int64_t nout = 1, os[3];
  for (int i = 0; i < ns; i++) nout *= (os[i] = res->shape[2 + i]);
  tv cnt = fresh(L, 1, &nout, x.dt);
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = arith.constant dense<[", cnt.id);
  int64_t idx[3] = {0};
  for (int64_t e = 0; e < nout; e++) {
    int64_t c = 1;
    for (int i = 0; i < ns; i++) {
      int64_t lo = incl ? -w.pb[i] : 0, hi = x.shape[2 + i] + (incl ? w.pe[i] : 0);
      c *= window_count(idx[i], &w, i, lo, hi);
    }
    nv_sb_printf(&b, "%s%s", e ? ", " : "", FL((double)(c ? c : 1), x.dt));
    for (int i = ns - 1; i >= 0 && ++idx[i] == os[i]; i--) idx[i] = 0;
  }
  nv_sb_printf(&b, "]> : %s", TT(cnt));
  emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  tv div[2] = {y, reshape(L, cnt, ns, os)};
  char db[120];
  snprintf(db, sizeof db, "%%r = arith.divf %%in0, %%in1 : %s", ety(x.dt));
  return elementwise(L, 2, div, res->rank, res->shape, x.dt, db);
}

/* ---- backward of convolution and pooling -------------------------------- */

/* The window-sum target: a zero tensor [N, C', P...] large enough for
 * every window position (P_i covers the padded input and all of O). */
static tv window_target(lw *L, const window *w, int64_t n, int64_t c2, int64_t c3, const int64_t *in,
                        const int64_t *out, nova_dtype dt, int lead) {
  int64_t s[NOVA_MAX_RANK] = {n, c2, c3};
  for (int i = 0; i < w->ns; i++) {
    int64_t need = (out[i] - 1) * w->s[i] + w->dl[i] * (w->k[i] - 1) + 1, have = in[i] + w->pb[i] + w->pe[i];
    s[lead + i] = need > have ? need : have;
  }
  return filled(L, lead + w->ns, s, dt, 0.0);
}

/* full[..., pb_i : pb_i + I_i] as [lead dims..., I...]. */
static tv interior(lw *L, tv full, const window *w, int lead, const int64_t *in) {
  int64_t s[NOVA_MAX_RANK];
  memcpy(s, full.shape, sizeof s);
  for (int i = 0; i < w->ns; i++) s[lead + i] = in[i];
  tv r = fresh(L, full.rank, s, full.dt);
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = tensor.extract_slice %%v%d[", r.id, full.id);
  for (int i = 0; i < full.rank; i++) nv_sb_printf(&b, "%s%lld", i ? ", " : "", (long long)(i < lead ? 0 : w->pb[i - lead]));
  nv_sb_printf(&b, "] [");
  for (int i = 0; i < full.rank; i++) nv_sb_printf(&b, "%s%lld", i ? ", " : "", (long long)s[i]);
  nv_sb_printf(&b, "] [");
  for (int i = 0; i < full.rank; i++) nv_sb_printf(&b, "%s1", i ? ", " : "");
  nv_sb_printf(&b, "] : %s to %s", TT(full), TT(r));
  emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* "affine_map<(...) -> (d0, d1, [d2,] dO*s + dK*d ...)>" for a window access. */
static void window_map(nv_sbuf *b, int nl, const char *lead, int o0, int k0, const window *w) {
  map_head(b, nl);
  nv_sb_printf(b, "%s", lead);
  for (int i = 0; i < w->ns; i++)
    nv_sb_printf(b, ", d%d * %lld + d%d * %lld", o0 + i, (long long)w->s[i], k0 + i, (long long)w->dl[i]);
  nv_sb_printf(b, ")>");
}

static void plain_map(nv_sbuf *b, int nl, const char *lead, int first, int n) {
  map_head(b, nl);
  nv_sb_printf(b, "%s", lead);
  for (int i = 0; i < n; i++) nv_sb_printf(b, "%sd%d", *lead || i ? ", " : "", first + i);
  nv_sb_printf(b, ")>");
}

/* dx of conv: loops (n, g, f, o..., c, k...), dx[n, g, c, o s + k d] += dy[n, g, f, o] w[g, f, c, k]. */
static tv lower_conv_grad_input(lw *L, MlirOperation op, tv gy, tv wt, const tv *res) {
  int ns = res->rank - 2;
  window w;
  read_window(op, &w, ns);
  for (int i = 0; i < ns; i++) w.k[i] = wt.shape[2 + i];
  int64_t G = iattr(op, "groups"), F = wt.shape[0], Cg = wt.shape[1], Fg = F / G, N = res->shape[0];
  int64_t gs[NOVA_MAX_RANK] = {N, G, Fg}, ws[NOVA_MAX_RANK] = {G, Fg, Cg};
  for (int i = 0; i < ns; i++) gs[3 + i] = gy.shape[2 + i], ws[3 + i] = w.k[i];
  tv g2 = reshape(L, gy, ns + 3, gs), w2 = reshape(L, wt, ns + 3, ws);
  tv acc = window_target(L, &w, N, G, Cg, res->shape + 2, gy.shape + 2, res->dt, 3);
  int nl = 4 + 2 * ns;
  char iters[16] = {0}, lead[32];
  for (int i = 0; i < nl; i++) iters[i] = (i == 0 || i == 1 || i == 3 + ns) ? 'p' : 'r';
  nv_sbuf mg = {0}, mw = {0}, mo = {0};
  plain_map(&mg, nl, "d0, d1, d2", 3, ns);
  snprintf(lead, sizeof lead, "d1, d2, d%d", 3 + ns);
  plain_map(&mw, nl, lead, 4 + ns, ns);
  snprintf(lead, sizeof lead, "d0, d1, d%d", 3 + ns);
  window_map(&mo, nl, lead, 3, 4 + ns, &w);
  char body[200];
  snprintf(body, sizeof body, "%%p = arith.mulf %%in0, %%in1 : %s\n%%r = arith.addf %%acc, %%p : %s", ety(res->dt),
           ety(res->dt));
  tv ins[2] = {g2, w2};
  const char *maps[2] = {mg.s, mw.s};
  tv full = generic_text(L, 2, ins, maps, mo.s, nl, iters, acc, body);
  nv_sb_free(&mg);
  nv_sb_free(&mw);
  nv_sb_free(&mo);
  return reshape(L, interior(L, full, &w, 3, res->shape + 2), res->rank, res->shape);
}

/* dw of conv: loops (g, f, c, k..., n, o...), dw[g, f, c, k] += x[n, g, c, o s + k d] dy[n, g, f, o]. */
static tv lower_conv_grad_weight(lw *L, MlirOperation op, tv x, tv gy, const tv *res) {
  int ns = x.rank - 2;
  window w;
  read_window(op, &w, ns);
  for (int i = 0; i < ns; i++) w.k[i] = res->shape[2 + i];
  int64_t G = iattr(op, "groups"), F = res->shape[0], Cg = res->shape[1], Fg = F / G, N = x.shape[0];
  tv xp = pad_for(L, x, &w, &gy, 0.0);
  int64_t xs[NOVA_MAX_RANK] = {N, G, Cg}, gs[NOVA_MAX_RANK] = {N, G, Fg}, os[NOVA_MAX_RANK] = {G, Fg, Cg};
  for (int i = 0; i < ns; i++) xs[3 + i] = xp.shape[2 + i], gs[3 + i] = gy.shape[2 + i], os[3 + i] = w.k[i];
  tv x2 = reshape(L, xp, ns + 3, xs), g2 = reshape(L, gy, ns + 3, gs);
  int nl = 4 + 2 * ns; /* g f c k... n o... */
  char iters[16] = {0}, lead[32];
  for (int i = 0; i < nl; i++) iters[i] = i < 3 + ns ? 'p' : 'r';
  nv_sbuf mx = {0}, mg = {0}, mo = {0};
  snprintf(lead, sizeof lead, "d%d, d0, d2", 3 + ns);
  window_map(&mx, nl, lead, 4 + ns, 3, &w);
  snprintf(lead, sizeof lead, "d%d, d0, d1", 3 + ns);
  plain_map(&mg, nl, lead, 4 + ns, ns);
  plain_map(&mo, nl, "d0, d1, d2", 3, ns);
  tv init = filled(L, ns + 3, os, res->dt, 0.0);
  char body[200];
  snprintf(body, sizeof body, "%%p = arith.mulf %%in0, %%in1 : %s\n%%r = arith.addf %%acc, %%p : %s", ety(res->dt),
           ety(res->dt));
  tv ins[2] = {x2, g2};
  const char *maps[2] = {mx.s, mg.s};
  tv y = generic_text(L, 2, ins, maps, mo.s, nl, iters, init, body);
  nv_sb_free(&mx);
  nv_sb_free(&mg);
  nv_sb_free(&mo);
  return reshape(L, y, res->rank, res->shape);
}

/* dx of max_pool: every input position equal to its window's maximum
 * receives that window's gradient; dx of avg_pool: each window spreads its
 * gradient over the elements it counted.  Loops (n, c, o..., k...). */
static tv lower_pool_grad(lw *L, MlirOperation op, nv_op kind, tv *in, const tv *res) {
  int ns = res->rank - 2;
  window w;
  read_window(op, &w, ns);
  bool avg = kind == NV_OP_AVG_POOL_GRAD;
  tv gy = avg ? in[0] : in[2];
  const int64_t *I = res->shape + 2, *O = gy.shape + 2;
  tv acc = window_target(L, &w, res->shape[0], res->shape[1], 0, I, O, res->dt, 2);
  tv win = empty(L, ns, w.k, res->dt);
  int nl = 2 + 2 * ns;
  char iters[16] = {0};
  for (int i = 0; i < nl; i++) iters[i] = i < 2 ? 'p' : 'r';
  nv_sbuf mo = {0}, my = {0}, mw = {0}, mx = {0};
  window_map(&mo, nl, "d0, d1", 2, 2 + ns, &w);
  plain_map(&my, nl, "d0, d1", 2, ns);
  plain_map(&mw, nl, "", 2 + ns, ns);
  char body[400];
  tv full;
  const char *T = ety(res->dt);
  if (avg) {
    bool incl = iattr(op, "count_include_pad") != 0;
    int64_t nout = 1, os[3], idx[3] = {0};
    for (int i = 0; i < ns; i++) nout *= (os[i] = O[i]);
    tv cnt = fresh(L, 1, &nout, res->dt);
    nv_sbuf b = {0};
    nv_sb_printf(&b, "%%v%d = arith.constant dense<[", cnt.id);
    for (int64_t e = 0; e < nout; e++) {
      int64_t c = 1;
      for (int i = 0; i < ns; i++) c *= window_count(idx[i], &w, i, incl ? -w.pb[i] : 0, I[i] + (incl ? w.pe[i] : 0));
      nv_sb_printf(&b, "%s%s", e ? ", " : "", FL((double)(c ? c : 1), res->dt));
      for (int i = ns - 1; i >= 0 && ++idx[i] == os[i]; i--) idx[i] = 0;
    }
    nv_sb_printf(&b, "]> : %s", TT(cnt));
    emit(L, "%s", b.s ? b.s : "");
    nv_sb_free(&b);
    tv dv[2] = {gy, reshape(L, cnt, ns, os)};
    char db[120];
    snprintf(db, sizeof db, "%%r = arith.divf %%in0, %%in1 : %s", T);
    tv q = elementwise(L, 2, dv, gy.rank, gy.shape, res->dt, db);
    snprintf(body, sizeof body, "%%r = arith.addf %%acc, %%in0 : %s", T);
    tv ins[2] = {q, win};
    const char *maps[2] = {my.s, mw.s};
    full = generic_text(L, 2, ins, maps, mo.s, nl, iters, acc, body);
  } else {
    tv xp = pad_for(L, in[0], &w, &gy, -INFINITY);
    window_map(&mx, nl, "d0, d1", 2, 2 + ns, &w);
    snprintf(body, sizeof body, "%%eq = arith.cmpf oeq, %%in0, %%in1 : %s\n%%s = arith.addf %%acc, %%in2 : %s\n"
             "%%r = arith.select %%eq, %%s, %%acc : %s", T, T, T);
    tv ins[4] = {xp, in[1], gy, win};
    const char *maps[4] = {mx.s, my.s, my.s, mw.s};
    full = generic_text(L, 4, ins, maps, mo.s, nl, iters, acc, body);
  }
  nv_sb_free(&mo);
  nv_sb_free(&my);
  nv_sb_free(&mw);
  nv_sb_free(&mx);
  return interior(L, full, &w, 2, I);
}

/* ONNX MaxPool's Indices: per window, the row-major flat index into x of
 * its first maximum; loops (n, c, o..., k...). */
static tv lower_pool_indices(lw *L, MlirOperation op, tv x, tv y, const tv *res) {
  int ns = x.rank - 2;
  window w;
  read_window(op, &w, ns);
  tv xp = pad_for(L, x, &w, &y, -INFINITY);
  tv win = empty(L, ns, w.k, x.dt);
  int nl = 2 + 2 * ns;
  char iters[16] = {0};
  for (int i = 0; i < nl; i++) iters[i] = i < 2 + ns ? 'p' : 'r';
  nv_sbuf mx = {0}, my = {0}, mw = {0}, b = {0};
  window_map(&mx, nl, "d0, d1", 2, 2 + ns, &w);
  plain_map(&my, nl, "d0, d1", 2, ns);
  plain_map(&mw, nl, "", 2 + ns, ns);
  tv init = filled(L, res->rank, res->shape, NOVA_DTYPE_I64, 0x1p62); /* above any index */
  bool colmajor = iattr(op, "storage_order") != 0;
  nv_sb_printf(&b, "%%eq = arith.cmpf oeq, %%in0, %%in1 : %s\n", ety(x.dt));
  for (int i = 0; i < nl; i++) nv_sb_printf(&b, "%%l%d = linalg.index %d : index\n", i, i);
  /* flat = ((n C + c) I0 + h0) I1 + h1 ..., h_i = o_i s_i + k_i d_i - pb_i */
  nv_sb_printf(&b, "%%cC = arith.constant %lld : index\n%%f1 = arith.muli %%l0, %%cC : index\n"
               "%%f2 = arith.addi %%f1, %%l1 : index\n", (long long)x.shape[1]);
  int cur = 2;
  for (int q = 0; q < ns; q++) {
    int i = colmajor ? ns - 1 - q : q; /* storage_order 1: the last spatial axis varies slowest */
    nv_sb_printf(&b, "%%s%d = arith.constant %lld : index\n%%d%d = arith.constant %lld : index\n"
                 "%%p%d = arith.constant %lld : index\n%%I%d = arith.constant %lld : index\n"
                 "%%os%d = arith.muli %%l%d, %%s%d : index\n%%kd%d = arith.muli %%l%d, %%d%d : index\n"
                 "%%h%d = arith.addi %%os%d, %%kd%d : index\n%%hh%d = arith.subi %%h%d, %%p%d : index\n"
                 "%%m%d = arith.muli %%f%d, %%I%d : index\n%%f%d = arith.addi %%m%d, %%hh%d : index\n",
                 i, (long long)w.s[i], i, (long long)w.dl[i], i, (long long)w.pb[i], i, (long long)x.shape[2 + i],
                 i, 2 + i, i, i, 2 + ns + i, i, i, i, i, i, i, i, i, cur, i, cur + 1, i, i);

    cur++;
  }
  nv_sb_printf(&b, "%%fi = arith.index_cast %%f%d : index to i64\n%%mn = arith.minsi %%acc, %%fi : i64\n"
               "%%r = arith.select %%eq, %%mn, %%acc : i64", cur);
  tv ins[3] = {xp, y, win};
  const char *maps[3] = {mx.s, my.s, mw.s};
  tv r = generic_text(L, 3, ins, maps, my.s, nl, iters, init, b.s ? b.s : "");
  nv_sb_free(&mx);
  nv_sb_free(&my);
  nv_sb_free(&mw);
  nv_sb_free(&b);
  return r;
}

static int lower_op(lw *L, MlirOperation op, nv_op kind) {
  int nin = (int)mlirOperationGetNumOperands(op);
  tv in[64];
  for (int i = 0; i < nin && i < 64; i++) in[i] = map_get(L, mlirOperationGetOperand(op, i));
  MlirType rt = mlirValueGetType(mlirOperationGetResult(op, 0));
  tv res = {.rank = (int)mlirShapedTypeGetRank(rt), .dt = nova_dtype_of(rt)};
  for (int i = 0; i < res.rank; i++) res.shape[i] = mlirShapedTypeGetDimSize(rt, i);
  const char *T = ety(res.dt);
  char body[1024];
  tv r;
  switch (kind) {
  case NV_OP_CONSTANT: {
    r = fresh(L, res.rank, res.shape, res.dt);
    nv_sbuf b = {0};
    mlirAttributePrint(mlirOperationGetAttributeByName(op, nova_str("value")), attr_cb, &b);
    emit(L, "%%v%d = arith.constant %s", r.id, b.s ? b.s : "");
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
    bool fl = fe_dtype_is_float(res.dt);
    const char *o = kind == NV_OP_ADD ? (fl ? "arith.addf" : "arith.addi")
                  : kind == NV_OP_SUB ? (fl ? "arith.subf" : "arith.subi")
                  : kind == NV_OP_MUL ? (fl ? "arith.mulf" : "arith.muli")
                  : kind == NV_OP_DIV ? (fl ? "arith.divf" : "arith.divsi")
                  : kind == NV_OP_MINIMUM ? (fl ? "arith.minimumf" : "arith.minsi")
                  : kind == NV_OP_MAXIMUM ? (fl ? "arith.maximumf" : "arith.maxsi") : "math.powf";
    if (kind == NV_OP_DIV && !fl) /* no trap: x / 0 = 0, x / -1 = -x (wrapping) */
      snprintf(body, sizeof body,
               "%%z = arith.constant 0 : %s\n%%one = arith.constant 1 : %s\n%%m1 = arith.constant -1 : %s\n"
               "%%isz = arith.cmpi eq, %%in1, %%z : %s\n%%ism = arith.cmpi eq, %%in1, %%m1 : %s\n"
               "%%bad = arith.ori %%isz, %%ism : i1\n%%d = arith.select %%bad, %%one, %%in1 : %s\n"
               "%%q = arith.divsi %%in0, %%d : %s\n%%ng = arith.subi %%z, %%in0 : %s\n"
               "%%q2 = arith.select %%ism, %%ng, %%q : %s\n%%r = arith.select %%isz, %%z, %%q2 : %s",
               T, T, T, T, T, T, T, T, T, T);
    else
      snprintf(body, sizeof body, "%%r = %s %%in0, %%in1 : %s", o, T);
    r = elementwise(L, 2, in, res.rank, res.shape, res.dt, body);
    break;
  }
  case NV_OP_EQUAL:
  case NV_OP_LESS:
  case NV_OP_GREATER: {
    bool fl = fe_dtype_is_float(in[0].dt);
    const char *pred = kind == NV_OP_EQUAL ? (fl ? "oeq" : "eq") : kind == NV_OP_LESS ? (fl ? "olt" : "slt")
                                                                                   : (fl ? "ogt" : "sgt");
    snprintf(body, sizeof body, "%%r = %s %s, %%in0, %%in1 : %s", fl ? "arith.cmpf" : "arith.cmpi", pred,
             ety(in[0].dt));
    r = elementwise(L, 2, in, res.rank, res.shape, res.dt, body);
    break;
  }
  case NV_OP_WHERE:
    snprintf(body, sizeof body, "%%r = arith.select %%in0, %%in1, %%in2 : %s", T);
    r = elementwise(L, 3, in, res.rank, res.shape, res.dt, body);
    break;
  case NV_OP_ABS:
    snprintf(body, sizeof body, "%%r = %s %%in0 : %s", fe_dtype_is_float(res.dt) ? "math.absf" : "math.absi", T);
    r = elementwise(L, 1, in, res.rank, res.shape, res.dt, body);
    break;
  case NV_OP_ERF:
    snprintf(body, sizeof body, "%%r = math.erf %%in0 : %s", T);
    r = elementwise(L, 1, in, res.rank, res.shape, res.dt, body);
    break;
  case NV_OP_CAST:
    r = elementwise(L, 1, in, res.rank, res.shape, res.dt, cast_body(in[0].dt, res.dt, body, sizeof body));
    break;
  case NV_OP_CONV: r = lower_conv(L, op, in[0], in[1], &res); break;
  case NV_OP_MAX_POOL:
  case NV_OP_AVG_POOL: r = lower_pool(L, op, kind, in[0], &res); break;
  case NV_OP_CONV_GRAD_INPUT: r = lower_conv_grad_input(L, op, in[0], in[1], &res); break;
  case NV_OP_MAX_POOL_INDICES: r = lower_pool_indices(L, op, in[0], in[1], &res); break;
  case NV_OP_CONV_GRAD_WEIGHT: r = lower_conv_grad_weight(L, op, in[0], in[1], &res); break;
  case NV_OP_MAX_POOL_GRAD:
  case NV_OP_AVG_POOL_GRAD: r = lower_pool_grad(L, op, kind, in, &res); break;
  case NV_OP_NEG: case NV_OP_EXP: case NV_OP_LOG: case NV_OP_SQRT: case NV_OP_TANH:
  case NV_OP_SIGMOID: case NV_OP_RELU: case NV_OP_GELU:
    r = elementwise(L, 1, in, res.rank, res.shape, res.dt, unary_body(kind, res.dt, body, sizeof body));
    break;
  case NV_OP_MATMUL: r = lower_matmul(L, in[0], in[1], &res); break;
  case NV_OP_SOFTMAX:
  case NV_OP_LOG_SOFTMAX: r = lower_softmax(L, in[0], (int)iattr(op, "axis"), kind == NV_OP_LOG_SOFTMAX); break;
  case NV_OP_LAYER_NORM:
    r = lower_layer_norm(L, in[0], in[1], in[2],
                         mlirFloatAttrGetValueDouble(mlirOperationGetAttributeByName(op, nova_str("eps"))));
    break;
  case NV_OP_REDUCE_SUM:
  case NV_OP_REDUCE_MEAN:
  case NV_OP_REDUCE_MAX: r = lower_reduce(L, kind, in[0], op, &res); break;
  case NV_OP_RESHAPE: r = reshape(L, in[0], res.rank, res.shape); break;
  case NV_OP_TRANSPOSE: {
    int64_t perm[NOVA_MAX_RANK];
    int n = iarray(op, "perm", perm);
    tv e = empty(L, res.rank, res.shape, res.dt);
    r = fresh(L, res.rank, res.shape, res.dt);
    nv_sbuf b = {0};
    nv_sb_printf(&b, "%%v%d = linalg.transpose ins(%%v%d : %s) outs(%%v%d : %s) permutation = [", r.id,
                 in[0].id, TT(in[0]), e.id, TT(e));
    for (int i = 0; i < n; i++) nv_sb_printf(&b, "%s%lld", i ? ", " : "", (long long)perm[i]);
    nv_sb_printf(&b, "]");
    emit(L, "%s", b.s ? b.s : "");
    nv_sb_free(&b);
    break;
  }
  case NV_OP_BROADCAST: r = elementwise(L, 1, in, res.rank, res.shape, res.dt, ""); break;
  case NV_OP_CONCAT: r = lower_concat(L, nin, in, (int)iattr(op, "axis"), &res); break;
  case NV_OP_SLICE: r = lower_slice(L, in[0], op, &res); break;
  case NV_OP_GATHER: r = lower_gather(L, in[0], in[1], (int)iattr(op, "axis"), &res); break;
  case NV_OP_CROSS_ENTROPY: r = lower_cross_entropy(L, in[0], in[1]); break;
  default:
    nv_error_plain(L->c->diag, "internal: no lowering for nova.%s", nv_op_name(kind));
    return -1;
  }
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
  L.map = calloc(L.mapcap, sizeof *L.map);
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
    if (tv_numel(&v) == 0 && nempty < 256) {
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
    if (tv_numel(&v) == 0) v.rank = 1, v.shape[0] = 1;
    nv_sb_printf(&L.out, "%s%s", i ? ", " : "", TT(v));
  }
  nv_sb_printf(&L.out, ") {\n");

  for (int e = 0; e < nempty; e++) { /* the real (empty) value of a placeholder argument */
    tv v = map_get(&L, mlirBlockGetArgument(body, empties[e]));
    tv r = empty(&L, v.rank, v.shape, v.dt);
    map_put(&L, mlirBlockGetArgument(body, empties[e]), r);
  }
  int rc = 0;
  for (MlirOperation o = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(o) && !rc;
       o = mlirOperationGetNextInBlock(o)) {
    nv_op kind = nova_op_kind(o);
    set_loc(&L, o);
    if (kind != NV_OP_COUNT) {
      rc = lower_op(&L, o, kind);
      continue;
    }
    /* func.return */
    int n = (int)mlirOperationGetNumOperands(o);
    L.loc[0] = 0;
    nv_sbuf b = {0};
    tv rv[256];
    for (int i = 0; i < n && i < 256; i++) {
      rv[i] = map_get(&L, mlirOperationGetOperand(o, i));
      if (tv_numel(&rv[i]) == 0) rv[i] = filled(&L, 1, (int64_t[]){1}, rv[i].dt, 0.0); /* placeholder */
    }
    nv_sb_printf(&b, "return ");
    for (int i = 0; i < n && i < 256; i++) nv_sb_printf(&b, "%s%%v%d", i ? ", " : "", rv[i].id);
    nv_sb_printf(&b, " : ");
    for (int i = 0; i < n && i < 256; i++) nv_sb_printf(&b, "%s%s", i ? ", " : "", TT(rv[i]));
    emit(&L, "%s", b.s ? b.s : "");
    nv_sb_free(&b);
  }
  nv_sb_printf(&L.out, "  }\n}\n");
  free(L.map);
  MlirModule out = {NULL};
  if (!rc && !L.out.oom) {
    if (getenv("NOVAC_DEBUG_LINALG_TEXT")) fputs(L.out.s, stderr);
    out = mlirModuleCreateParse(c->ctx, nova_str(L.out.s));
  }
  nv_sb_free(&L.out);
  return out;
}
