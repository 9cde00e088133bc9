/* lower_window.c: convolution and pooling (forward, backward, MaxPool
 * indices) as strided linalg.generic ops over padded inputs.  Loops over
 * windows read the input at o * stride + k * dilation (affine maps); the
 * backward ops accumulate into a zero tensor covering every window and
 * keep its interior. */
#include <math.h>
#include <mlir-c/BuiltinAttributes.h>
#include <stdlib.h>
#include <string.h>

#include "lower_internal.h"

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
  tv r = lw_fresh(L, x.rank, shape, x.dt);
  int c = L->next_id++;
  lw_emit(L, "%%v%d = arith.constant %s : %s", c, FL(value, x.dt), lw_ety(x.dt));
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = tensor.pad %%v%d low[0, 0", r.id, x.id);
  for (int i = 0; i < w->ns; i++) nv_sb_printf(&b, ", %lld", (long long)w->pb[i]);
  nv_sb_printf(&b, "] high[0, 0");
  for (int i = 0; i < w->ns; i++) nv_sb_printf(&b, ", %lld", (long long)hi[i]);
  nv_sb_printf(&b, "] {\n    ^bb0(");
  for (int i = 0; i < x.rank; i++) nv_sb_printf(&b, "%s%%i%d: index", i ? ", " : "", i);
  nv_sb_printf(&b, "):\n      tensor.yield %%v%d : %s\n    } : %s to %s", c, lw_ety(x.dt), TT(x), TT(r));
  lw_emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  return r;
}

/* A structured op whose maps are given as text (strided windows); BODY
 * "": the op yields %in0 (a copy). */
static tv generic_text(lw *L, int nin, const tv *ins, const char *const *maps, const char *outmap, int nloops,
                       const char *iters, tv init, const char *body) {
  tv r = lw_fresh(L, init.rank, init.shape, init.dt);
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
  for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%%in%d: %s, ", i, lw_ety(ins[i].dt));
  nv_sb_printf(&b, "%%acc: %s):\n", lw_ety(init.dt));
  for (const char *p = body; *p;) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n) nv_sb_printf(&b, "      %.*s%s\n", (int)n, p, L->loc);
    p += n + (e ? 1 : 0);
  }
  nv_sb_printf(&b, "      linalg.yield %s : %s%s\n    } -> %s", *body ? "%r" : "%in0", lw_ety(init.dt), L->loc, TT(r));
  lw_emit(L, "%s", b.s ? b.s : "");
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
    lw_iarray(op, "kernel", v);
    memcpy(w->k, v, (size_t)ns * sizeof *v);
  }
  lw_iarray(op, "strides", v);
  memcpy(w->s, v, (size_t)ns * sizeof *v);
  if (!mlirAttributeIsNull(mlirOperationGetAttributeByName(op, nova_str("dilations")))) {
    lw_iarray(op, "dilations", v);
    memcpy(w->dl, v, (size_t)ns * sizeof *v);
  }
  lw_iarray(op, "pads", v);
  for (int i = 0; i < ns; i++) w->pb[i] = v[i], w->pe[i] = v[ns + i];
}

/* ---- convolution as GEMM (im2col) -------------------------------------- */

static void window_map(nv_sbuf *b, int nl, const char *lead, int o0, int k0, const window *w);
static void plain_map(nv_sbuf *b, int nl, const char *lead, int first, int n);

/* Whether the convolution goes through an im2col matrix and contractions
 * (L->c->conv_gemm: a CPU whose contractions are the runtime's BLIS-style
 * kernels) rather than loops over windows: not depthwise (one input and
 * one output channel per group make a GEMM of one row), the matrix's rank
 * within NOVA_MAX_RANK. */
static bool conv_as_gemm(const lw *L, int ns, int64_t Cg, int64_t Fg) {
  return L->c->conv_gemm && 3 + 2 * ns <= NOVA_MAX_RANK && !(Cg == 1 && Fg == 1);
}

/* The im2col matrix of XG [N, G, Cg, P...] (padded) for outputs O...:
 * col[g, c, k..., n, o...] = xg[n, g, c, o s + k d], a copy over loops
 * (g, c, k..., n, o...): as [G, Cg K..., N O...], B of the forward GEMM
 * (w [G, F, Cg K...] x col), its n contiguous.  ROWS_BY_POSITION: the
 * transposed layout [g, n, o..., c, k...] instead, B of the weight
 * gradient's GEMM (dy^T [G, F, N O...] x col), its n (c, k...) contiguous
 * again. */
static tv im2col(lw *L, tv xg, const window *w, const int64_t *O, bool rows_by_position) {
  int ns = w->ns, nl = 3 + 2 * ns;
  /* loops (g, c, k..., n, o...); the result's dims in that order or as (g, n, o..., c, k...) */
  int64_t shape[NOVA_MAX_RANK] = {xg.shape[1]};
  int dims[NOVA_MAX_RANK] = {0}, r = 1;
  if (rows_by_position) {
    dims[r] = 2 + ns, shape[r++] = xg.shape[0];
    for (int i = 0; i < ns; i++) dims[r] = 3 + ns + i, shape[r++] = O[i];
  }
  dims[r] = 1, shape[r++] = xg.shape[2];
  for (int i = 0; i < ns; i++) dims[r] = 2 + i, shape[r++] = w->k[i];
  if (!rows_by_position) {
    dims[r] = 2 + ns, shape[r++] = xg.shape[0];
    for (int i = 0; i < ns; i++) dims[r] = 3 + ns + i, shape[r++] = O[i];
  }
  char lead[48], iters[16] = {0};
  for (int i = 0; i < nl; i++) iters[i] = 'p';
  nv_sbuf mx = {0}, mo = {0};
  snprintf(lead, sizeof lead, "d%d, d0, d1", 2 + ns);
  window_map(&mx, nl, lead, 3 + ns, 2, w);
  map_head(&mo, nl);
  for (int i = 0; i < nl; i++) nv_sb_printf(&mo, "%sd%d", i ? ", " : "", dims[i]);
  nv_sb_printf(&mo, ")>");
  const char *maps[1] = {mx.s};
  tv col = generic_text(L, 1, &xg, maps, mo.s, nl, iters, lw_empty(L, nl, shape, xg.dt), "");
  nv_sb_free(&mx);
  nv_sb_free(&mo);
  return col;
}

/* "affine_map<(d0, ...) -> (dA, dB, dB0 ..., dC, dC0 ...)>": two leading
 * loops each followed by a run of NS loops (an im2col matrix's operand). */
static void col_map(nv_sbuf *b, int nl, int a, int bl, int b0, int cl, int c0, int ns) {
  map_head(b, nl);
  nv_sb_printf(b, "d%d, d%d", a, bl);
  for (int i = 0; i < ns; i++) nv_sb_printf(b, ", d%d", b0 + i);
  nv_sb_printf(b, ", d%d", cl);
  for (int i = 0; i < ns; i++) nv_sb_printf(b, ", d%d", c0 + i);
  nv_sb_printf(b, ")>");
}

/* The body "%r = %acc + %in0 * %in1" of a contraction generic over DT, in BUF. */
static const char *mul_add(char *buf, size_t n, nova_dtype dt) {
  snprintf(buf, n, "%%p = arith.mulf %%in0, %%in1 : %s\n%%r = arith.addf %%acc, %%p : %s", lw_ety(dt), lw_ety(dt));
  return buf;
}

/* yt[g, f, n, o...] = sum over c, k... of wg[g, f, c, k...] col[g, c, k..., n, o...], then
 * y [n, g, f, o...] its transpose: the GEMM's columns are the whole batch's
 * positions (n o... contiguous in col and yt), not one image's (a 2 x 2
 * map of a late layer: 4 columns of the register tile's 32). */
static tv conv_forward_gemm(lw *L, tv xg, tv wg, const window *w, const int64_t *os) {
  int ns = w->ns, nl = 4 + 2 * ns; /* n g f o... c k... */
  tv col = lw_to_f32(L, im2col(L, xg, w, os + 3, false));
  wg = lw_to_f32(L, wg);
  char iters[16] = {0}, lead[48], body[200];
  for (int i = 0; i < nl; i++) iters[i] = i < 3 + ns ? 'p' : 'r';
  nv_sbuf mw = {0}, mc = {0}, mo = {0};
  snprintf(lead, sizeof lead, "d1, d2, d%d", 3 + ns);
  plain_map(&mw, nl, lead, 4 + ns, ns);
  col_map(&mc, nl, 1, 3 + ns, 4 + ns, 0, 3, ns); /* (g, c, k..., n, o...) */
  plain_map(&mo, nl, "d1, d2, d0", 3, ns);
  int64_t ts[NOVA_MAX_RANK] = {os[1], os[2], os[0]}, perm[NOVA_MAX_RANK] = {2, 0, 1};
  for (int i = 0; i < ns; i++) ts[3 + i] = os[3 + i], perm[3 + i] = 3 + i;
  tv ins[2] = {wg, col};
  const char *maps[2] = {mw.s, mc.s};
  tv yt = generic_text(L, 2, ins, maps, mo.s, nl, iters, lw_filled(L, ns + 3, ts, col.dt, 0.0),
                       mul_add(body, sizeof body, col.dt));
  nv_sb_free(&mw);
  nv_sb_free(&mc);
  nv_sb_free(&mo);
  return lw_transpose(L, yt, perm);
}

/* conv: x [N, C, S...], w [F, C/G, K...] -> [N, F, O...], computed as
 * [N, G, F/G, O...] over loops (n, g, f, o..., c, k...). */
tv lw_lower_conv(lw *L, MlirOperation op, tv x, tv wt, const tv *res) {
  int ns = x.rank - 2;
  window w;
  read_window(op, &w, ns);
  for (int i = 0; i < ns; i++) w.k[i] = wt.shape[2 + i];
  int64_t G = lw_iattr(op, "groups"), C = x.shape[1], F = wt.shape[0], Cg = C / G, Fg = F / G;
  bool gemm = conv_as_gemm(L, ns, Cg, Fg);
  if (!gemm) x = lw_to_f32(L, x), wt = lw_to_f32(L, wt);
  tv xp = pad_for(L, x, &w, res, 0.0);
  int64_t xs[NOVA_MAX_RANK] = {xp.shape[0], G, Cg}, ws[NOVA_MAX_RANK] = {G, Fg, Cg}, os[NOVA_MAX_RANK] = {res->shape[0], G, Fg};
  for (int i = 0; i < ns; i++) xs[3 + i] = xp.shape[2 + i], ws[3 + i] = w.k[i], os[3 + i] = res->shape[2 + i];
  tv xg = lw_reshape(L, xp, ns + 3, xs), wg = lw_reshape(L, wt, ns + 3, ws);
  if (gemm) return lw_reshape(L, conv_forward_gemm(L, xg, wg, &w, os), res->rank, res->shape);
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
  tv init = lw_filled(L, ns + 3, os, x.dt, 0.0);
  char body[200];
  mul_add(body, sizeof body, x.dt);
  tv ins[2] = {xg, wg};
  const char *maps[2] = {mx.s, mw.s};
  tv y = generic_text(L, 2, ins, maps, mo.s, nl, iters, init, body);
  nv_sb_free(&mx);
  nv_sb_free(&mw);
  nv_sb_free(&mo);
  return lw_reshape(L, y, res->rank, res->shape);
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
tv lw_lower_pool(lw *L, MlirOperation op, nv_op kind, tv x, const tv *res) {
  int ns = x.rank - 2;
  window w;
  read_window(op, &w, ns);
  bool avg = kind == NV_OP_AVG_POOL;
  tv xp = pad_for(L, x, &w, res, avg ? 0.0 : -INFINITY);
  tv win = lw_empty(L, ns, w.k, x.dt);
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
  tv init = lw_filled(L, res->rank, res->shape, x.dt, avg ? 0.0 : -INFINITY);
  char body[200];
  snprintf(body, sizeof body, "%%r = %s %%in0, %%acc : %s", avg ? "arith.addf" : "arith.maximumf", lw_ety(x.dt));
  tv ins[2] = {xp, win};
  const char *maps[2] = {mx.s, mw.s};
  tv y = generic_text(L, 2, ins, maps, mo.s, nl, iters, init, body);
  nv_sb_free(&mx);
  nv_sb_free(&mw);
  nv_sb_free(&mo);
  if (!avg) return y;
  /* divide by the number of elements each window counts: a constant over O... */
  bool incl = lw_iattr(op, "count_include_pad") != 0;
  int64_t nout = 1, os[3];
  for (int i = 0; i < ns; i++) nout *= (os[i] = res->shape[2 + i]);
  tv cnt = lw_fresh(L, 1, &nout, x.dt);
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
  lw_emit(L, "%s", b.s ? b.s : "");
  nv_sb_free(&b);
  tv div[2] = {y, lw_reshape(L, cnt, ns, os)};
  char db[120];
  snprintf(db, sizeof db, "%%r = arith.divf %%in0, %%in1 : %s", lw_ety(x.dt));
  return lw_elementwise(L, 2, div, res->rank, res->shape, x.dt, db);
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
  return lw_filled(L, lead + w->ns, s, dt, 0.0);
}

/* full[..., pb_i : pb_i + I_i] as [lead dims..., I...]. */
static tv interior(lw *L, tv full, const window *w, int lead, const int64_t *in) {
  int64_t s[NOVA_MAX_RANK];
  memcpy(s, full.shape, sizeof s);
  for (int i = 0; i < w->ns; i++) s[lead + i] = in[i];
  tv r = lw_fresh(L, full.rank, s, full.dt);
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%%v%d = tensor.extract_slice %%v%d[", r.id, full.id);
  for (int i = 0; i < full.rank; i++) nv_sb_printf(&b, "%s%lld", i ? ", " : "", (long long)(i < lead ? 0 : w->pb[i - lead]));
  nv_sb_printf(&b, "] [");
  for (int i = 0; i < full.rank; i++) nv_sb_printf(&b, "%s%lld", i ? ", " : "", (long long)s[i]);
  nv_sb_printf(&b, "] [");
  for (int i = 0; i < full.rank; i++) nv_sb_printf(&b, "%s1", i ? ", " : "");
  nv_sb_printf(&b, "] : %s to %s", TT(full), TT(r));
  lw_emit(L, "%s", b.s ? b.s : "");
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

/* DY [N, G, F, O...] as [G, F, N, O...] (both gradients' GEMMs read it so;
 * CSE keeps one copy). */
static tv dy_by_filter(lw *L, tv dy) {
  int64_t perm[NOVA_MAX_RANK] = {1, 2, 0};
  for (int i = 3; i < dy.rank; i++) perm[i] = i;
  return lw_transpose(L, dy, perm);
}

/* dw[g, f, c, k...] = sum over n, o... of dy[n, g, f, o...] col[g, n, o..., c, k...]: dy
 * transposed to [G, F, N, O...] first, so that the sum's n and o are one
 * contiguous k in both operands. */
static tv conv_grad_weight_gemm(lw *L, tv x2, tv g2, const window *w, const int64_t *os) {
  int ns = w->ns, nl = 4 + 2 * ns; /* g f c k... n o... */
  tv col = lw_to_f32(L, im2col(L, x2, w, g2.shape + 3, true)), gt = lw_to_f32(L, dy_by_filter(L, g2));
  char iters[16] = {0}, lead[48], body[200];
  for (int i = 0; i < nl; i++) iters[i] = i < 3 + ns ? 'p' : 'r';
  nv_sbuf mg = {0}, mc = {0}, mo = {0};
  snprintf(lead, sizeof lead, "d0, d1, d%d", 3 + ns);
  plain_map(&mg, nl, lead, 4 + ns, ns);
  col_map(&mc, nl, 0, 3 + ns, 4 + ns, 2, 3, ns); /* (g, n, o..., c, k...) */
  plain_map(&mo, nl, "d0, d1, d2", 3, ns);
  tv ins[2] = {gt, col};
  const char *maps[2] = {mg.s, mc.s};
  tv dw = generic_text(L, 2, ins, maps, mo.s, nl, iters, lw_filled(L, ns + 3, os, col.dt, 0.0),
                       mul_add(body, sizeof body, col.dt));
  nv_sb_free(&mg);
  nv_sb_free(&mc);
  nv_sb_free(&mo);
  return dw;
}

/* dx through the columns: dcol[g, c, k..., n, o...] = sum over f of w2[g, f, c, k...]
 * dyt[g, f, n, o...] (a GEMM over the whole batch's positions; dyt, dy
 * transposed, is the weight gradient's too), then each column added into
 * the window it came from (col2im) in ACC [N, G, Cg, P...]. */
static tv conv_grad_input_gemm(lw *L, tv g2, tv w2, const window *w, tv acc) {
  int ns = w->ns, nl = 4 + 2 * ns; /* g c k... n o... f */
  tv gt = lw_to_f32(L, dy_by_filter(L, g2));
  w2 = lw_to_f32(L, w2);
  int64_t shape[NOVA_MAX_RANK] = {w2.shape[0], w2.shape[2]};
  for (int i = 0; i < ns; i++) shape[2 + i] = w->k[i], shape[3 + ns + i] = g2.shape[3 + i];
  shape[2 + ns] = g2.shape[0];
  char iters[16] = {0}, lead[48], body[200];
  for (int i = 0; i < nl; i++) iters[i] = i < nl - 1 ? 'p' : 'r';
  nv_sbuf mw = {0}, mg = {0}, mo = {0};
  snprintf(lead, sizeof lead, "d0, d%d, d1", nl - 1);
  plain_map(&mw, nl, lead, 2, ns);
  snprintf(lead, sizeof lead, "d0, d%d, d%d", nl - 1, 2 + ns);
  plain_map(&mg, nl, lead, 3 + ns, ns);
  plain_map(&mo, nl, "", 0, nl - 1);
  tv ins[2] = {w2, gt};
  const char *maps[2] = {mw.s, mg.s};
  tv dcol = generic_text(L, 2, ins, maps, mo.s, nl, iters, lw_filled(L, nl - 1, shape, gt.dt, 0.0),
                         mul_add(body, sizeof body, gt.dt));
  nv_sb_free(&mw);
  nv_sb_free(&mg);
  nv_sb_free(&mo);
  /* col2im: loops (g, c, k..., n, o...), dx[n, g, c, o s + k d] += dcol[...] */
  int nc = nl - 1;
  for (int i = 0; i < nc; i++) iters[i] = (i == 0 || i == 1 || i == 2 + ns) ? 'p' : 'r';
  iters[nc] = 0;
  nv_sbuf mi = {0}, mx = {0};
  plain_map(&mi, nc, "", 0, nc);
  snprintf(lead, sizeof lead, "d%d, d0, d1", 2 + ns);
  window_map(&mx, nc, lead, 3 + ns, 2, w);
  snprintf(body, sizeof body, "%%r = arith.addf %%acc, %%in0 : %s", lw_ety(gt.dt));
  const char *cmaps[1] = {mi.s};
  tv full = generic_text(L, 1, &dcol, cmaps, mx.s, nc, iters, acc, body);
  nv_sb_free(&mi);
  nv_sb_free(&mx);
  return full;
}

/* dx of conv: loops (n, g, f, o..., c, k...), dx[n, g, c, o s + k d] += dy[n, g, f, o] w[g, f, c, k]. */
tv lw_lower_conv_grad_input(lw *L, MlirOperation op, tv gy, tv wt, const tv *res) {
  int ns = res->rank - 2;
  window w;
  read_window(op, &w, ns);
  for (int i = 0; i < ns; i++) w.k[i] = wt.shape[2 + i];
  int64_t G = lw_iattr(op, "groups"), F = wt.shape[0], Cg = wt.shape[1], Fg = F / G, N = res->shape[0];
  bool gemm = conv_as_gemm(L, ns, Cg, Fg);
  if (!gemm) gy = lw_to_f32(L, gy), wt = lw_to_f32(L, wt);
  int64_t gs[NOVA_MAX_RANK] = {N, G, Fg}, ws[NOVA_MAX_RANK] = {G, Fg, Cg};
  for (int i = 0; i < ns; i++) gs[3 + i] = gy.shape[2 + i], ws[3 + i] = w.k[i];
  tv g2 = lw_reshape(L, gy, ns + 3, gs), w2 = lw_reshape(L, wt, ns + 3, ws);
  tv acc = window_target(L, &w, N, G, Cg, res->shape + 2, gy.shape + 2, res->dt, 3);
  if (gemm) {
    tv full = conv_grad_input_gemm(L, g2, w2, &w, acc);
    return lw_reshape(L, interior(L, full, &w, 3, res->shape + 2), res->rank, res->shape);
  }
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
  mul_add(body, sizeof body, res->dt);
  tv ins[2] = {g2, w2};
  const char *maps[2] = {mg.s, mw.s};
  tv full = generic_text(L, 2, ins, maps, mo.s, nl, iters, acc, body);
  nv_sb_free(&mg);
  nv_sb_free(&mw);
  nv_sb_free(&mo);
  return lw_reshape(L, interior(L, full, &w, 3, res->shape + 2), res->rank, res->shape);
}

/* dw of conv: loops (g, f, c, k..., n, o...), dw[g, f, c, k] += x[n, g, c, o s + k d] dy[n, g, f, o]. */
tv lw_lower_conv_grad_weight(lw *L, MlirOperation op, tv x, tv gy, const tv *res) {
  int ns = x.rank - 2;
  window w;
  read_window(op, &w, ns);
  for (int i = 0; i < ns; i++) w.k[i] = res->shape[2 + i];
  int64_t G = lw_iattr(op, "groups"), F = res->shape[0], Cg = res->shape[1], Fg = F / G, N = x.shape[0];
  bool gemm = conv_as_gemm(L, ns, Cg, Fg);
  if (!gemm) x = lw_to_f32(L, x), gy = lw_to_f32(L, gy);
  tv xp = pad_for(L, x, &w, &gy, 0.0);
  int64_t xs[NOVA_MAX_RANK] = {N, G, Cg}, gs[NOVA_MAX_RANK] = {N, G, Fg}, os[NOVA_MAX_RANK] = {G, Fg, Cg};
  for (int i = 0; i < ns; i++) xs[3 + i] = xp.shape[2 + i], gs[3 + i] = gy.shape[2 + i], os[3 + i] = w.k[i];
  tv x2 = lw_reshape(L, xp, ns + 3, xs), g2 = lw_reshape(L, gy, ns + 3, gs);
  if (gemm) return lw_reshape(L, conv_grad_weight_gemm(L, x2, g2, &w, os), res->rank, res->shape);
  int nl = 4 + 2 * ns; /* g f c k... n o... */
  char iters[16] = {0}, lead[32];
  for (int i = 0; i < nl; i++) iters[i] = i < 3 + ns ? 'p' : 'r';
  nv_sbuf mx = {0}, mg = {0}, mo = {0};
  snprintf(lead, sizeof lead, "d%d, d0, d2", 3 + ns);
  window_map(&mx, nl, lead, 4 + ns, 3, &w);
  snprintf(lead, sizeof lead, "d%d, d0, d1", 3 + ns);
  plain_map(&mg, nl, lead, 4 + ns, ns);
  plain_map(&mo, nl, "d0, d1, d2", 3, ns);
  tv init = lw_filled(L, ns + 3, os, res->dt, 0.0);
  char body[200];
  mul_add(body, sizeof body, res->dt);
  tv ins[2] = {x2, g2};
  const char *maps[2] = {mx.s, mg.s};
  tv y = generic_text(L, 2, ins, maps, mo.s, nl, iters, init, body);
  nv_sb_free(&mx);
  nv_sb_free(&mg);
  nv_sb_free(&mo);
  return lw_reshape(L, y, res->rank, res->shape);
}

/* dx of max_pool: every input position equal to its window's maximum
 * receives that window's gradient; dx of avg_pool: each window spreads its
 * gradient over the elements it counted.  Loops (n, c, o..., k...). */
tv lw_lower_pool_grad(lw *L, MlirOperation op, nv_op kind, tv *in, const tv *res) {
  int ns = res->rank - 2;
  window w;
  read_window(op, &w, ns);
  bool avg = kind == NV_OP_AVG_POOL_GRAD;
  tv gy = avg ? in[0] : in[2];
  const int64_t *I = res->shape + 2, *O = gy.shape + 2;
  tv acc = window_target(L, &w, res->shape[0], res->shape[1], 0, I, O, res->dt, 2);
  tv win = lw_empty(L, ns, w.k, res->dt);
  int nl = 2 + 2 * ns;
  char iters[16] = {0};
  for (int i = 0; i < nl; i++) iters[i] = i < 2 ? 'p' : 'r';
  nv_sbuf mo = {0}, my = {0}, mw = {0}, mx = {0};
  window_map(&mo, nl, "d0, d1", 2, 2 + ns, &w);
  plain_map(&my, nl, "d0, d1", 2, ns);
  plain_map(&mw, nl, "", 2 + ns, ns);
  char body[400];
  tv full;
  const char *T = lw_ety(res->dt);
  if (avg) {
    bool incl = lw_iattr(op, "count_include_pad") != 0;
    int64_t nout = 1, os[3], idx[3] = {0};
    for (int i = 0; i < ns; i++) nout *= (os[i] = O[i]);
    tv cnt = lw_fresh(L, 1, &nout, res->dt);
    nv_sbuf b = {0};
    nv_sb_printf(&b, "%%v%d = arith.constant dense<[", cnt.id);
    for (int64_t e = 0; e < nout; e++) {
      int64_t c = 1;
      for (int i = 0; i < ns; i++) c *= window_count(idx[i], &w, i, incl ? -w.pb[i] : 0, I[i] + (incl ? w.pe[i] : 0));
      nv_sb_printf(&b, "%s%s", e ? ", " : "", FL((double)(c ? c : 1), res->dt));
      for (int i = ns - 1; i >= 0 && ++idx[i] == os[i]; i--) idx[i] = 0;
    }
    nv_sb_printf(&b, "]> : %s", TT(cnt));
    lw_emit(L, "%s", b.s ? b.s : "");
    nv_sb_free(&b);
    tv dv[2] = {gy, lw_reshape(L, cnt, ns, os)};
    char db[120];
    snprintf(db, sizeof db, "%%r = arith.divf %%in0, %%in1 : %s", T);
    tv q = lw_elementwise(L, 2, dv, gy.rank, gy.shape, res->dt, db);
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
tv lw_lower_pool_indices(lw *L, MlirOperation op, tv x, tv y, const tv *res) {
  int ns = x.rank - 2;
  window w;
  read_window(op, &w, ns);
  tv xp = pad_for(L, x, &w, &y, -INFINITY);
  tv win = lw_empty(L, ns, w.k, x.dt);
  int nl = 2 + 2 * ns;
  char iters[16] = {0};
  for (int i = 0; i < nl; i++) iters[i] = i < 2 + ns ? 'p' : 'r';
  nv_sbuf mx = {0}, my = {0}, mw = {0}, b = {0};
  window_map(&mx, nl, "d0, d1", 2, 2 + ns, &w);
  plain_map(&my, nl, "d0, d1", 2, ns);
  plain_map(&mw, nl, "", 2 + ns, ns);
  tv init = lw_filled(L, res->rank, res->shape, NOVA_DTYPE_I64, 0x1p62); /* above any index */
  bool colmajor = lw_iattr(op, "storage_order") != 0;
  nv_sb_printf(&b, "%%eq = arith.cmpf oeq, %%in0, %%in1 : %s\n", lw_ety(x.dt));
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

