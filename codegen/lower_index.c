/* lower_index.c: nova indexing ops -> linalg on tensors (gather_elements,
 * scatter_elements, gather_nd, scatter_nd, cumsum) and the mod bodies.
 *
 * Scatters are written densely: every output position reduces over every
 * update and takes those whose index hits it (one linalg.generic with a
 * reduction loop), so the result is defined for repeated indices (updates
 * combine in index order; 'none' keeps the last) and the loops stay
 * parallel over the output for the GPU mapping.  Indices may count from the
 * end (i < 0: i + dim); their range is checked before the step runs
 * (constants when compiling, inputs by the step's bind checks).
 */
#include <string.h>

#include "lower_internal.h"

static void loop_indices(nv_sbuf *b, int n) {
  for (int i = 0; i < n; i++) nv_sb_printf(b, "%%l%d = linalg.index %d : index\n", i, i);
}

/* %NAME: the integer SRC of type T as an index, wrapped once if negative. */
static void wrapped(nv_sbuf *b, const char *name, const char *src, const char *T, int64_t dim) {
  nv_sb_printf(b, "%%%s_c = arith.index_cast %s : %s to index\n%%%s_n = arith.constant %lld : index\n"
               "%%%s_z = arith.constant 0 : index\n%%%s_neg = arith.cmpi slt, %%%s_c, %%%s_z : index\n"
               "%%%s_w = arith.addi %%%s_c, %%%s_n : index\n%%%s = arith.select %%%s_neg, %%%s_w, %%%s_c : index\n",
               name, src, T, name, (long long)dim, name, name, name, name, name, name, name, name, name, name, name);
}

/* %comb = ACC combined with VAL by a NV_SCATTER_* mode. */
static void combine(nv_sbuf *b, int mode, const char *acc, const char *val, nova_dtype dt) {
  bool fl = fe_dtype_is_float(dt), u = fe_dtype_is_unsigned(dt);
  const char *T = lw_ety(dt);
  const char *op = mode == NV_SCATTER_ADD ? (fl ? "arith.addf" : "arith.addi")
                 : mode == NV_SCATTER_MUL ? (fl ? "arith.mulf" : "arith.muli")
                 : mode == NV_SCATTER_MAX ? (fl ? "arith.maximumf" : u ? "arith.maxui" : "arith.maxsi")
                 : mode == NV_SCATTER_MIN ? (fl ? "arith.minimumf" : u ? "arith.minui" : "arith.minsi") : NULL;
  if (!op) nv_sb_printf(b, "%%comb = arith.select %%true, %s, %s : %s\n", val, acc, T);
  else nv_sb_printf(b, "%%comb = %s %s, %s : %s\n", op, acc, val, T);
}

tv lw_lower_gather_elements(lw *L, tv x, tv idx, int axis, const tv *res) {
  int im[NOVA_MAX_RANK], om[NOVA_MAX_RANK];
  for (int i = 0; i < idx.rank; i++) im[i] = om[i] = i;
  nv_sbuf b = {0};
  loop_indices(&b, res->rank);
  wrapped(&b, "i", "%in0", lw_ety(idx.dt), x.shape[axis]);
  nv_sb_printf(&b, "%%r = tensor.extract %%v%d[", x.id);
  for (int j = 0; j < x.rank; j++) nv_sb_printf(&b, j == axis ? "%s%%i" : "%s%%l%d", j ? ", " : "", j);
  nv_sb_printf(&b, "] : %s", TT(x));
  const int *mp[1] = {im};
  tv r = lw_generic(L, 1, &idx, mp, res->rank, "pppppppp", om, res->rank, res->shape, res->dt, (tv){.id = -1},
                    b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* A splat bool tensor of n elements: an operand that gives a loop its range. */
static tv extent(lw *L, int64_t n) {
  tv t = lw_fresh(L, 1, &n, NOVA_DTYPE_BOOL);
  lw_emit(L, "%%v%d = arith.constant dense<false> : %s", t.id, TT(t));
  return t;
}

/* Loops (x dims..., j over idx's axis), j a reduction: the output at p takes
 * upd[c] for every c with c[axis] = j, c = p elsewhere, idx[c] = p[axis]. */
tv lw_lower_scatter_elements(lw *L, const tv *in, int axis, int mode, const tv *res) {
  tv x = in[0], idx = in[1], upd = in[2];
  int r = x.rank, em[1] = {r}, om[NOVA_MAX_RANK];
  for (int i = 0; i < r; i++) om[i] = i;
  char iters[NOVA_MAX_RANK + 2] = "pppppppp";
  iters[r] = 'r', iters[r + 1] = 0;
  nv_sbuf b = {0};
  loop_indices(&b, r + 1);
  nv_sb_printf(&b, "%%true = arith.constant true\n%%zi = arith.constant 0 : index\n%%v_0 = arith.constant true\n");
  int nv = 0;
  for (int k = 0; k < r; k++) {
    if (k == axis) {
      nv_sb_printf(&b, "%%c%d = arith.addi %%l%d, %%zi : index\n", k, r);
      continue;
    }
    if (idx.shape[k] == x.shape[k]) {
      nv_sb_printf(&b, "%%c%d = arith.addi %%l%d, %%zi : index\n", k, k);
      continue;
    }
    nv_sb_printf(&b, "%%s%d = arith.constant %lld : index\n%%u%d = arith.cmpi ult, %%l%d, %%s%d : index\n"
                 "%%v_%d = arith.andi %%v_%d, %%u%d : i1\n", k, (long long)idx.shape[k], k, k, k, nv + 1, nv, k);
    nv++;
  }
  for (int k = 0; k < r; k++) /* clamped coordinates where not valid */
    if (k != axis && idx.shape[k] != x.shape[k])
      nv_sb_printf(&b, "%%c%d = arith.select %%v_%d, %%l%d, %%zi : index\n", k, nv, k);
  nv_sb_printf(&b, "%%e = tensor.extract %%v%d[", idx.id);
  for (int k = 0; k < r; k++) nv_sb_printf(&b, "%s%%c%d", k ? ", " : "", k);
  nv_sb_printf(&b, "] : %s\n", TT(idx));
  wrapped(&b, "w", "%e", lw_ety(idx.dt), x.shape[axis]);
  nv_sb_printf(&b, "%%h0 = arith.cmpi eq, %%w, %%l%d : index\n%%hit = arith.andi %%h0, %%v_%d : i1\n", axis, nv);
  nv_sb_printf(&b, "%%u = tensor.extract %%v%d[", upd.id);
  for (int k = 0; k < r; k++) nv_sb_printf(&b, "%s%%c%d", k ? ", " : "", k);
  nv_sb_printf(&b, "] : %s\n", TT(upd));
  combine(&b, mode, "%acc", "%u", x.dt);
  nv_sb_printf(&b, "%%r = arith.select %%hit, %%comb, %%acc : %s", lw_ety(x.dt));
  tv e = extent(L, idx.shape[axis]);
  const int *mp[1] = {em};
  tv out = lw_generic(L, 1, &e, mp, r + 1, iters, om, r, res->shape, res->dt, x, b.s ? b.s : "");
  nv_sb_free(&b);
  return out;
}

/* out[b.., i.., t..] = x[b.., idx[b.., i.., :], t..] */
tv lw_lower_gather_nd(lw *L, tv x, tv idx, int nb, const tv *res) {
  int q = idx.rank, R = res->rank, om[NOVA_MAX_RANK];
  int64_t k = idx.shape[q - 1];
  for (int i = 0; i < R; i++) om[i] = i;
  nv_sbuf b = {0};
  loop_indices(&b, R);
  for (int64_t t = 0; t < k; t++) {
    nv_sb_printf(&b, "%%k%lld = arith.constant %lld : index\n%%e%lld = tensor.extract %%v%d[", (long long)t, (long long)t,
                 (long long)t, idx.id);
    for (int i = 0; i < q - 1; i++) nv_sb_printf(&b, "%%l%d, ", i);
    nv_sb_printf(&b, "%%k%lld] : %s\n", (long long)t, TT(idx));
    char name[32], src[32];
    snprintf(name, sizeof name, "w%lld", (long long)t);
    snprintf(src, sizeof src, "%%e%lld", (long long)t);
    wrapped(&b, name, src, lw_ety(idx.dt), x.shape[nb + t]);
  }
  nv_sb_printf(&b, "%%r = tensor.extract %%v%d[", x.id);
  int c = 0;
  for (int i = 0; i < nb; i++) nv_sb_printf(&b, "%s%%l%d", c++ ? ", " : "", i);
  for (int64_t t = 0; t < k; t++) nv_sb_printf(&b, "%s%%w%lld", c++ ? ", " : "", (long long)t);
  for (int i = q - 1; i < R; i++) nv_sb_printf(&b, "%s%%l%d", c++ ? ", " : "", i);
  nv_sb_printf(&b, "] : %s", TT(x));
  tv r = lw_generic(L, 0, NULL, NULL, R, "pppppppp", om, R, res->shape, res->dt, (tv){.id = -1}, b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* Loops (x dims p..., update dims u...), u reductions: the output at p
 * combines upd[u, p[k:]] for every u with idx[u, :] = p[:k]. */
tv lw_lower_scatter_nd(lw *L, const tv *in, int mode, const tv *res) {
  tv x = in[0], idx = in[1], upd = in[2];
  int r = x.rank, q = idx.rank, nl = r + q - 1, um[NOVA_MAX_RANK], om[NOVA_MAX_RANK];
  int64_t k = idx.shape[q - 1];
  char iters[2 * NOVA_MAX_RANK + 1] = {0};
  for (int i = 0; i < nl; i++) iters[i] = i < r ? 'p' : 'r';
  for (int i = 0; i < r; i++) om[i] = i;
  int nu = 0;
  for (int i = 0; i < q - 1; i++) um[nu++] = r + i;
  for (int i = (int)k; i < r; i++) um[nu++] = i;
  nv_sbuf b = {0};
  loop_indices(&b, nl);
  nv_sb_printf(&b, "%%true = arith.constant true\n%%hit0 = arith.constant true\n");
  for (int64_t t = 0; t < k; t++) {
    nv_sb_printf(&b, "%%k%lld = arith.constant %lld : index\n%%e%lld = tensor.extract %%v%d[", (long long)t, (long long)t,
                 (long long)t, idx.id);
    for (int i = 0; i < q - 1; i++) nv_sb_printf(&b, "%%l%d, ", r + i);
    nv_sb_printf(&b, "%%k%lld] : %s\n", (long long)t, TT(idx));
    char name[32], src[32];
    snprintf(name, sizeof name, "w%lld", (long long)t);
    snprintf(src, sizeof src, "%%e%lld", (long long)t);
    wrapped(&b, name, src, lw_ety(idx.dt), x.shape[t]);
    nv_sb_printf(&b, "%%h%lld = arith.cmpi eq, %%w%lld, %%l%lld : index\n%%hit%lld = arith.andi %%hit%lld, %%h%lld : i1\n",
                 (long long)t, (long long)t, (long long)t, (long long)t + 1, (long long)t, (long long)t);
  }
  combine(&b, mode, "%acc", "%in0", x.dt);
  nv_sb_printf(&b, "%%r = arith.select %%hit%lld, %%comb, %%acc : %s", (long long)k, lw_ety(x.dt));
  const int *mp[1] = {um};
  tv out = lw_generic(L, 1, &upd, mp, nl, iters, om, r, res->shape, res->dt, x, b.s ? b.s : "");
  nv_sb_free(&b);
  return out;
}

/* Loops (x dims..., j over the axis), j a reduction: out[i] sums (or
 * multiplies) x[j] for j before i (or after it, reversed; i itself unless
 * exclusive). */
tv lw_lower_cumsum(lw *L, tv x, int axis, int mode, const tv *res) {
  int r = x.rank, xm[NOVA_MAX_RANK], om[NOVA_MAX_RANK];
  for (int i = 0; i < r; i++) xm[i] = i == axis ? r : i, om[i] = i;
  char iters[NOVA_MAX_RANK + 2] = "pppppppp";
  iters[r] = 'r', iters[r + 1] = 0;
  bool fl = fe_dtype_is_float(x.dt), ex = mode & NV_CUMSUM_EXCLUSIVE, rev = mode & NV_CUMSUM_REVERSE,
       prod = mode & NV_CUMSUM_PRODUCT;
  const char *pred = rev ? (ex ? "ugt" : "uge") : (ex ? "ult" : "ule");
  char body[600];
  snprintf(body, sizeof body,
           "%%i = linalg.index %d : index\n%%j = linalg.index %d : index\n%%in = arith.cmpi %s, %%j, %%i : index\n"
           "%%s = %s %%acc, %%in0 : %s\n%%r = arith.select %%in, %%s, %%acc : %s",
           axis, r, pred, prod ? (fl ? "arith.mulf" : "arith.muli") : (fl ? "arith.addf" : "arith.addi"), lw_ety(x.dt),
           lw_ety(x.dt));
  tv z = lw_filled(L, r, res->shape, res->dt, prod ? 1.0 : 0.0);
  const int *mp[1] = {xm};
  return lw_generic(L, 1, &x, mp, r + 1, iters, om, r, res->shape, res->dt, z, body);
}

/* Floor modulo (Python's %, the sign of the divisor) or, with fmod, C's
 * truncated remainder, of %in0 by %in1 into %r.  Integer x mod 0 and
 * x mod -1 are 0 (no trap). */
const char *lw_mod_body(bool fmod, nova_dtype dt, char *buf, size_t n) {
  const char *T = lw_ety(dt);
  if (fe_dtype_is_float(dt)) {
    if (fmod) snprintf(buf, n, "%%r = arith.remf %%in0, %%in1 : %s", T);
    else
      snprintf(buf, n, "%%z = arith.constant %s : %s\n%%m = arith.remf %%in0, %%in1 : %s\n"
               "%%mnz = arith.cmpf one, %%m, %%z : %s\n%%ms = arith.cmpf olt, %%m, %%z : %s\n"
               "%%ds = arith.cmpf olt, %%in1, %%z : %s\n%%df = arith.xori %%ms, %%ds : i1\n"
               "%%fix = arith.andi %%mnz, %%df : i1\n%%ma = arith.addf %%m, %%in1 : %s\n"
               "%%r = arith.select %%fix, %%ma, %%m : %s", lw_flit((char[64]){0}, 64, 0.0, dt), T, T, T, T, T, T, T);
    return buf;
  }
  if (fe_dtype_is_unsigned(dt)) { /* floor and truncated remainders agree; x mod 0 = 0 */
    snprintf(buf, n, "%%z = arith.constant 0 : %s\n%%one = arith.constant 1 : %s\n%%isz = arith.cmpi eq, %%in1, %%z : %s\n"
             "%%d = arith.select %%isz, %%one, %%in1 : %s\n%%m = arith.remui %%in0, %%d : %s\n"
             "%%r = arith.select %%isz, %%z, %%m : %s", T, T, T, T, T, T);
    return buf;
  }
  int k = snprintf(buf, n, "%%z = arith.constant 0 : %s\n%%one = arith.constant 1 : %s\n%%m1 = arith.constant -1 : %s\n"
                   "%%isz = arith.cmpi eq, %%in1, %%z : %s\n%%ism = arith.cmpi eq, %%in1, %%m1 : %s\n"
                   "%%bad = arith.ori %%isz, %%ism : i1\n%%d = arith.select %%bad, %%one, %%in1 : %s\n"
                   "%%m = arith.remsi %%in0, %%d : %s\n", T, T, T, T, T, T, T);
  if (fmod)
    snprintf(buf + k, n - (size_t)k, "%%r = arith.select %%bad, %%z, %%m : %s", T);
  else
    snprintf(buf + k, n - (size_t)k,
             "%%mnz = arith.cmpi ne, %%m, %%z : %s\n%%ms = arith.cmpi slt, %%m, %%z : %s\n"
             "%%ds = arith.cmpi slt, %%d, %%z : %s\n%%df = arith.xori %%ms, %%ds : i1\n%%fix = arith.andi %%mnz, %%df : i1\n"
             "%%ma = arith.addi %%m, %%d : %s\n%%m2 = arith.select %%fix, %%ma, %%m : %s\n"
             "%%r = arith.select %%bad, %%z, %%m2 : %s", T, T, T, T, T, T);
  return buf;
}
