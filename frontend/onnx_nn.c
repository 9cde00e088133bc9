/* onnx_nn.c: ONNX neural-network building blocks -> nova nodes: Attention
 * (opset 23 on), RotaryEmbedding, RMSNormalization, InstanceNormalization,
 * GroupNormalization, LpNormalization, MeanVarianceNormalization,
 * GlobalMaxPool, DepthToSpace, SpaceToDepth, EyeLike.
 *
 * Each is written as the composition of nova ops that its ONNX reference
 * computes (onnx/reference/ops and the function bodies), so the gradients
 * come from those ops' rules.  Attention follows the reference's edge cases:
 * the mask padded to the key length with -inf (False), bottom-right causal
 * alignment after a past cache, softcap before the mask, a softmax whose
 * fully masked rows are 0 (decided on the additive bias).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "onnx.h"

#define CV(name) static int name(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout)

static nv_node *K(ox_ctx *x, const nv_node *like, double v) { return like ? ox_scalar(x, like->dtype, v) : NULL; }
static nv_node *add(ox_ctx *x, nv_node *a, nv_node *b) { return ox_op2(x, NV_OP_ADD, a, b); }
static nv_node *sub(ox_ctx *x, nv_node *a, nv_node *b) { return ox_op2(x, NV_OP_SUB, a, b); }
static nv_node *mul(ox_ctx *x, nv_node *a, nv_node *b) { return ox_op2(x, NV_OP_MUL, a, b); }
static nv_node *dvd(ox_ctx *x, nv_node *a, nv_node *b) { return ox_op2(x, NV_OP_DIV, a, b); }
static nv_node *opt(ox_ctx *x, ox_val *in, int nin, int i) { return nin > i && in[i].present ? ox_N(x, in[i]) : NULL; }

/* The axes [from, rank). */
static int tail_axes(int64_t *ax, int from, int rank) {
  for (int i = from; i < rank; i++) ax[i - from] = i;
  return rank - from;
}

/* (a - mean) / sqrt(var + eps) over axes (population variance). */
static nv_node *standardize(ox_ctx *x, nv_node *a, int n, const int64_t *ax, double eps) {
  nv_node *m = ox_reduce(x, NV_OP_REDUCE_MEAN, a, n, ax, true);
  nv_node *d = sub(x, a, m);
  nv_node *v = ox_reduce(x, NV_OP_REDUCE_MEAN, mul(x, d, d), n, ax, true);
  return dvd(x, d, ox_op1(x, NV_OP_SQRT, add(x, v, K(x, a, eps))));
}

/* v [C] shaped [1, C, 1, ...] against a of rank r. */
static nv_node *channel(ox_ctx *x, nv_node *v, int r) {
  if (!v) return NULL;
  int64_t s[NOVA_MAX_RANK];
  for (int i = 0; i < r; i++) s[i] = i == 1 ? fe_numel(v) : 1;
  return ox_reshape(x, v, r, s);
}

/* The normalised axes [axis, rank) flattened into one, the scale broadcast
 * to them and flattened too: one rms_norm node (computed in X's dtype, the
 * scale cast to it; Y cast to the scale's dtype where they differ). */
CV(cv_rms_norm) {
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *a = ox_N(x, in[0]), *w = ox_N(x, in[1]);
  if (!a || !w) return -1;
  int64_t axis = ox_attr_i(x, "axis", -1), inner = 1, fs[NOVA_MAX_RANK];
  if (ox_norm_axis(x, &axis, a->rank)) return -1;
  if (ox_attr_i(x, "stash_type", 1) != 1) return ox_err(x, "stash_type other than 1 (float) is not supported");
  nova_dtype ydt = w->dtype;
  if (w->dtype != a->dtype) w = ox_add(x, NV_OP_CAST, 1, &w, &(nv_node){.to = a->dtype});
  for (int i = (int)axis; i < a->rank; i++) inner *= a->shape[i];
  for (int i = 0; i < axis; i++) fs[i] = a->shape[i];
  fs[axis] = inner;
  w = ox_reshape(x, ox_broadcast_to(x, w, a->rank - (int)axis, a->shape + axis), 1, &inner);
  nv_node *flat = ox_reshape(x, a, (int)axis + 1, fs), at = {.eps = ox_attr_f(x, "epsilon", 1e-5)};
  nv_node *y = flat && w ? ox_add(x, NV_OP_RMS_NORM, 2, (nv_node *[]){flat, w}, &at) : NULL;
  y = ox_reshape(x, y, a->rank, a->shape);
  if (y && y->dtype != ydt) y = ox_add(x, NV_OP_CAST, 1, &y, &(nv_node){.to = ydt});
  return ox_set_out(out, y);
}

CV(cv_instance_norm) {
  (void)nout;
  if (ox_need(x, in, nin, 3, 3)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a || a->rank < 3) return a ? ox_err(x, "input must be [N, C, spatial...]") : -1;
  int64_t ax[NOVA_MAX_RANK];
  int n = tail_axes(ax, 2, a->rank);
  nv_node *y = standardize(x, a, n, ax, ox_attr_f(x, "epsilon", 1e-5));
  return ox_set_out(out, add(x, mul(x, y, channel(x, ox_N(x, in[1]), a->rank)), channel(x, ox_N(x, in[2]), a->rank)));
}

CV(cv_group_norm) {
  (void)nout;
  if (ox_need(x, in, nin, 3, 3)) return -1;
  nv_node *a = ox_N(x, in[0]), *sc = ox_N(x, in[1]), *b = ox_N(x, in[2]);
  if (!a || !sc || !b) return -1;
  if (a->rank < 2) return ox_err(x, "input must be [N, C, ...]");
  int64_t G = ox_attr_i(x, "num_groups", 0), C = a->shape[1];
  if (G <= 0 || C % G) return ox_err(x, "num_groups %lld must divide the %lld channels", (long long)G, (long long)C);
  if (ox_attr_i(x, "stash_type", 1) != 1) return ox_err(x, "stash_type other than 1 (float) is not supported");
  int64_t s3[3] = {a->shape[0], G, fe_numel(a) / (a->shape[0] * G)}, ax[1] = {2};
  nv_node *y = ox_reshape(x, standardize(x, ox_reshape(x, a, 3, s3), 1, ax, ox_attr_f(x, "epsilon", 1e-5)), a->rank, a->shape);
  if (fe_numel(sc) == G && G != C) { /* opset 18: one scale and bias per group */
    int64_t gs[2] = {G, 1}, gc[2] = {G, C / G};
    sc = ox_reshape(x, ox_broadcast_to(x, ox_reshape(x, sc, 2, gs), 2, gc), 1, &C);
    b = ox_reshape(x, ox_broadcast_to(x, ox_reshape(x, b, 2, gs), 2, gc), 1, &C);
  }
  if (!sc || !b || fe_numel(sc) != C || fe_numel(b) != C) return sc && b ? ox_err(x, "scale and bias must have C entries") : -1;
  return ox_set_out(out, add(x, mul(x, y, channel(x, sc, a->rank)), channel(x, b, a->rank)));
}

CV(cv_lp_norm) { /* x / ||x||_p along axis; 0 where the norm is 0 */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t axis = ox_attr_i(x, "axis", -1), p = ox_attr_i(x, "p", 2);
  if (ox_norm_axis(x, &axis, a->rank)) return -1;
  if (p != 1 && p != 2) return ox_err(x, "p is %lld; expected 1 or 2", (long long)p);
  nv_node *t = p == 1 ? ox_op1(x, NV_OP_ABS, a) : mul(x, a, a);
  nv_node *nrm = ox_reduce(x, NV_OP_REDUCE_SUM, t, 1, &axis, true);
  if (p == 2) nrm = ox_op1(x, NV_OP_SQRT, nrm);
  nv_node *z = ox_op2(x, NV_OP_EQUAL, nrm, K(x, a, 0));
  return ox_set_out(out, ox_op3(x, NV_OP_WHERE, z, K(x, a, 0), dvd(x, a, ox_op3(x, NV_OP_WHERE, z, K(x, a, 1), nrm))));
}

CV(cv_mvn) { /* (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9), its function body */
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t ax[NOVA_MAX_RANK] = {0, 2, 3};
  int n = ox_attr_ints(x, "axes", ax, NOVA_MAX_RANK);
  if (n < 0) n = 3;
  nv_node *m = ox_reduce(x, NV_OP_REDUCE_MEAN, a, n, ax, true);
  nv_node *m2 = ox_reduce(x, NV_OP_REDUCE_MEAN, mul(x, a, a), n, ax, true);
  nv_node *sd = ox_op1(x, NV_OP_SQRT, sub(x, m2, mul(x, m, m)));
  return ox_set_out(out, dvd(x, sub(x, a, m), add(x, sd, K(x, a, 1e-9))));
}

CV(cv_global_max_pool) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a || a->rank < 3) return a ? ox_err(x, "input must be [N, C, spatial...]") : -1;
  int64_t ax[NOVA_MAX_RANK];
  return ox_set_out(out, ox_reduce(x, NV_OP_REDUCE_MAX, a, tail_axes(ax, 2, a->rank), ax, true));
}

/* reshape to s6, transpose by perm, reshape to s4 */
static nv_node *shuffle(ox_ctx *x, nv_node *a, const int64_t *s6, const int64_t *perm, const int64_t *s4) {
  return ox_reshape(x, ox_transpose(x, ox_reshape(x, a, 6, s6), perm), 4, s4);
}

CV(cv_depth_to_space) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t b = ox_attr_i(x, "blocksize", 0);
  if (a->rank != 4 || b <= 0 || a->shape[1] % (b * b)) return ox_err(x, "needs [N, C, H, W] with C divisible by blocksize^2");
  char buf[8];
  bool crd = !strcmp(ox_attr_s(x, "mode", "DCR", buf, sizeof buf), "CRD");
  int64_t N = a->shape[0], C = a->shape[1] / (b * b), H = a->shape[2], W = a->shape[3];
  int64_t s6d[6] = {N, b, b, C, H, W}, pd[6] = {0, 3, 4, 1, 5, 2};
  int64_t s6c[6] = {N, C, b, b, H, W}, pc[6] = {0, 1, 4, 2, 5, 3}, s4[4] = {N, C, H * b, W * b};
  return ox_set_out(out, crd ? shuffle(x, a, s6c, pc, s4) : shuffle(x, a, s6d, pd, s4));
}

CV(cv_space_to_depth) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t b = ox_attr_i(x, "blocksize", 0);
  if (a->rank != 4 || b <= 0 || a->shape[2] % b || a->shape[3] % b)
    return ox_err(x, "needs [N, C, H, W] with H and W divisible by blocksize");
  char buf[8];
  const char *mode = ox_attr_s(x, "mode", "DCR", buf, sizeof buf);
  if (strcmp(mode, "DCR") && strcmp(mode, "CRD")) return ox_err(x, "mode '%s'; expected DCR or CRD", mode);
  int64_t N = a->shape[0], C = a->shape[1], H = a->shape[2] / b, W = a->shape[3] / b;
  int64_t s6[6] = {N, C, H, b, W, b}, pd[6] = {0, 3, 5, 1, 2, 4}, pc[6] = {0, 1, 3, 5, 2, 4}, s4[4] = {N, C * b * b, H, W};
  return ox_set_out(out, shuffle(x, a, s6, strcmp(mode, "CRD") ? pd : pc, s4));
}

CV(cv_eye_like) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  if (ox_val_rank(in[0]) != 2) return ox_err(x, "input must be 2-D");
  const int64_t *s = ox_val_shape(in[0]);
  nova_dtype dt = in[0].k ? in[0].k->dt : in[0].node->dtype;
  if (ox_attr(x, "dtype") && !(dt = ox_dtype_of_onnx((int32_t)ox_attr_i(x, "dtype", 1))))
    return ox_err(x, "dtype %s is not supported", ox_onnx_type_name((int32_t)ox_attr_i(x, "dtype", 1)));
  int64_t k = ox_attr_i(x, "k", 0);
  ox_tensor *t = ox_tensor_new(dt, 2, s);
  if (!t) return -1;
  for (int64_t i = 0; i < s[0]; i++)
    for (int64_t j = 0; j < s[1]; j++) ox_set(t, i * s[1] + j, j - i == k, j - i == k);
  return ox_known(out, t);
}

/* ---- RotaryEmbedding ------------------------------------------------------ */

/* One rotary node over [B, S, H, D] (3-D input, reshaped) or [B, H, S, D]
 * (4-D), the caches [B or 1, S, rd/2] (after the position ids' gather)
 * reshaped to broadcast over the heads; a rotary_embedding_dim rd below the
 * head size rotates the first rd elements and concatenates the rest back. */
CV(cv_rotary) {
  (void)nout;
  if (ox_need(x, in, nin, 3, 4)) return -1;
  nv_node *a = ox_N(x, in[0]), *cs = ox_N(x, in[1]), *sn = ox_N(x, in[2]), *pos = opt(x, in, nin, 3);
  if (!a || !cs || !sn) return -1;
  bool inter = ox_attr_i(x, "interleaved", 0) != 0;
  int64_t nh = ox_attr_i(x, "num_heads", 0), rd = ox_attr_i(x, "rotary_embedding_dim", 0);
  if (a->rank != 3 && a->rank != 4) return ox_err(x, "input must be [B, S, hidden] or [B, H, S, D]");
  nv_node *t = a;
  if (a->rank == 3) {
    if (nh <= 0 || a->shape[2] % nh) return ox_err(x, "num_heads must divide the hidden size of a 3-D input");
    t = ox_reshape(x, a, 4, (int64_t[]){a->shape[0], a->shape[1], nh, a->shape[2] / nh});
  }
  if (!t) return -1;
  int64_t D = t->shape[3];
  if (rd == 0) rd = D;
  if (rd > D || rd % 2) return ox_err(x, "rotary_embedding_dim %lld must be even and at most the head size %lld", (long long)rd, (long long)D);
  if (pos) { /* caches indexed by position ids [B, S] */
    nv_node at = {.axis = 0, .index_negative = true};
    cs = ox_add(x, NV_OP_GATHER, 2, (nv_node *[]){cs, pos}, &at);
    sn = ox_add(x, NV_OP_GATHER, 2, (nv_node *[]){sn, pos}, &at);
    if (!cs || !sn) return -1;
  }
  if (cs->rank < 2 || cs->shape[cs->rank - 1] != rd / 2 || sn->shape[sn->rank - 1] != rd / 2)
    return ox_err(x, "the caches must be [.., S, rotary_embedding_dim / 2 = %lld]", (long long)(rd / 2));
  /* [.., S, rd/2] -> [B or 1, S, 1, rd/2] (3-D input) or [B or 1, 1, S, rd/2] (4-D) */
  int64_t b = cs->rank == 3 ? cs->shape[0] : 1, S = cs->shape[cs->rank - 2];
  int64_t s4[4] = {b, a->rank == 3 ? S : 1, a->rank == 3 ? 1 : S, rd / 2};
  cs = ox_reshape(x, cs, 4, s4), sn = ox_reshape(x, sn, 4, s4);
  nv_node *rot = rd < D ? ox_slice1(x, t, 3, 0, rd, 1) : t, at = {.mode = inter};
  nv_node *r = rot && cs && sn ? ox_add(x, NV_OP_ROTARY, 3, (nv_node *[]){rot, cs, sn}, &at) : NULL;
  nv_node c3 = {.axis = 3};
  if (r && rd < D) r = ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){r, ox_slice1(x, t, 3, rd, D, 1)}, &c3);
  if (!r) return -1;
  return ox_set_out(out, a->rank == 4 ? r : ox_reshape(x, r, 3, a->shape));
}

/* ---- Attention ------------------------------------------------------------ */

/* [B, S, H*D] -> [B, H, S, D] */
static nv_node *heads(ox_ctx *x, nv_node *a, int64_t h) {
  if (!a) return NULL;
  if (h <= 0 || a->shape[2] % h) {
    ox_err(x, "a 3-D input needs q_num_heads and kv_num_heads dividing its hidden size");
    return NULL;
  }
  nv_node *r = ox_reshape(x, a, 4, (int64_t[]){a->shape[0], a->shape[1], h, a->shape[2] / h});
  return ox_transpose(x, r, (int64_t[]){0, 2, 1, 3});
}

/* A constant [q, kv] bool: j <= i + off (causal) or within the window. */
static nv_node *band(ox_ctx *x, int64_t q, int64_t kv, int64_t off, int64_t left, int64_t right, bool causal) {
  int64_t s[2] = {q, kv};
  ox_tensor *t = ox_tensor_new(NOVA_DTYPE_BOOL, 2, s);
  if (!t) return NULL;
  for (int64_t i = 0; i < q; i++)
    for (int64_t j = 0; j < kv; j++) {
      int64_t d = i + off - j;
      bool ok = causal ? d >= 0 : (left < 0 || d <= left) && (right < 0 || -d <= right);
      ox_set(t, i * kv + j, ok, ok);
    }
  nv_node *n = ox_N(x, (ox_val){.k = t, .present = true});
  ox_tensor_free(t);
  return n;
}

/* An int64 constant [1, 1, n, 1] (axis 2) or [1, 1, 1, n] (axis 3) of 0..n-1. */
static nv_node *positions(ox_ctx *x, int64_t n, int axis) {
  int64_t s[4] = {1, 1, 1, 1};
  s[axis] = n;
  ox_tensor *t = ox_tensor_new(NOVA_DTYPE_I64, 4, s);
  for (int64_t i = 0; t && i < n; i++) ox_set(t, i, (double)i, i);
  nv_node *c = t ? ox_N(x, (ox_val){.k = t, .present = true}) : NULL;
  ox_tensor_free(t);
  return c;
}

/* The band of band() with a per-batch offset computed by the step: off
 * [B, 1, 1, 1] int64; the result is bool [B, 1, q, kv]. */
static nv_node *band_per_batch(ox_ctx *x, int64_t q, int64_t kv, nv_node *off, int64_t left, int64_t right, bool causal) {
  nv_node *d = sub(x, add(x, positions(x, q, 2), off), positions(x, kv, 3)); /* i + off - j */
  if (!d) return NULL;
  if (causal) return ox_op2(x, NV_OP_GREATER_EQUAL, d, ox_scalar(x, NOVA_DTYPE_I64, 0));
  nv_node *ok = ox_op2(x, NV_OP_EQUAL, d, d); /* all true */
  if (left >= 0) ok = ox_op2(x, NV_OP_AND, ok, ox_op2(x, NV_OP_LESS_EQUAL, d, ox_scalar(x, NOVA_DTYPE_I64, (double)left)));
  if (right >= 0)
    ok = ox_op2(x, NV_OP_AND, ok, ox_op2(x, NV_OP_GREATER_EQUAL, d, ox_scalar(x, NOVA_DTYPE_I64, (double)-right)));
  return ok;
}

/* where(allowed, 0, -inf) added to the bias */
static nv_node *add_allowed(ox_ctx *x, nv_node *bias, nv_node *allowed) {
  if (!bias || !allowed) return NULL;
  return add(x, bias, ox_op3(x, NV_OP_WHERE, allowed, K(x, bias, 0), K(x, bias, -INFINITY)));
}

/* softmax over the last axis with all--inf rows giving 0 (the reference's). */
static nv_node *safe_softmax(ox_ctx *x, nv_node *s) {
  int64_t last = s->rank - 1;
  nv_node *m = ox_reduce(x, NV_OP_REDUCE_MAX, s, 1, &last, true);
  nv_node *safe = ox_op3(x, NV_OP_WHERE, ox_op2(x, NV_OP_EQUAL, m, K(x, s, -INFINITY)), K(x, s, 0), m);
  nv_node *e = ox_op1(x, NV_OP_EXP, sub(x, s, safe));
  nv_node *sum = ox_reduce(x, NV_OP_REDUCE_SUM, e, 1, &last, true);
  nv_node *den = ox_op3(x, NV_OP_WHERE, ox_op2(x, NV_OP_EQUAL, sum, K(x, s, 0)), K(x, s, 1), sum);
  return dvd(x, e, den);
}

/* Y [B, H, S, Dv] (back to [B, S, H Dv] for 3-D inputs), then present_key,
 * present_value and the scores (outs[0..2]) as the node asks for them. */
static int attention_outputs(ox_ctx *x, nv_node *y, bool three, nv_node *const *outs, int nouts, ox_val *out, int nout) {
  if (y && three) {
    nv_node *t = ox_transpose(x, y, (int64_t[]){0, 2, 1, 3});
    y = ox_reshape(x, t, 3, (int64_t[]){t->shape[0], t->shape[1], t->shape[2] * t->shape[3]});
  }
  if (!y || ox_set_out(out, y)) return -1;
  for (int i = 1; i < nout && i <= nouts; i++) {
    if (!outs[i - 1]) return -1;
    out[i] = (ox_val){.node = outs[i - 1], .present = true};
  }
  return 0;
}

CV(cv_attention) {
  if (ox_need(x, in, nin, 3, 7)) return -1;
  nv_node *q = ox_N(x, in[0]), *k = ox_N(x, in[1]), *v = ox_N(x, in[2]);
  nv_node *mask = opt(x, in, nin, 3), *pk = opt(x, in, nin, 4), *pv = opt(x, in, nin, 5), *nonpad = opt(x, in, nin, 6);
  if (!q || !k || !v) return -1;
  if (!pk != !pv) return ox_err(x, "past_key and past_value must be given together");
  if (nonpad && pk) return ox_err(x, "nonpad_kv_seqlen cannot be combined with past_key and past_value");
  if (q->rank != k->rank || q->rank != v->rank || (q->rank != 3 && q->rank != 4))
    return ox_err(x, "Q, K and V must all be 3-D or all 4-D");
  bool three = q->rank == 3;
  if (three) q = heads(x, q, ox_attr_i(x, "q_num_heads", 0)), k = heads(x, k, ox_attr_i(x, "kv_num_heads", 0)),
             v = heads(x, v, ox_attr_i(x, "kv_num_heads", 0));
  if (!q || !k || !v) return -1;
  nova_dtype dt = q->dtype;
  double scale = ox_attr(x, "scale") ? ox_attr_f(x, "scale", 1) : 1 / sqrt((double)q->shape[3]);
  nv_node *sq = ox_scalar(x, dt, (double)(float)sqrt(scale));
  nv_node c2 = {.axis = 2};
  if (pk) k = ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){pk, k}, &c2), v = ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){pv, v}, &c2);
  if (!k || !v) return -1;
  nv_node *present_k = k, *present_v = v;
  int64_t ql = q->shape[2], kvl = k->shape[2], off = pk ? pk->shape[2] : 0;
  /* the additive bias */
  nv_node *bias = ox_scalar(x, dt, 0);
  if (mask) {
    int64_t pad = kvl - mask->shape[mask->rank - 1];
    if (pad < 0) return ox_err(x, "attn_mask's last dimension exceeds the key length %lld", (long long)kvl);
    if (pad) {
      int64_t s[NOVA_MAX_RANK];
      memcpy(s, mask->shape, sizeof s);
      s[mask->rank - 1] = pad;
      nv_node *fill = mask->dtype == NOVA_DTYPE_BOOL ? ox_scalar(x, NOVA_DTYPE_BOOL, 0) : K(x, mask, -INFINITY);
      nv_node at = {.axis = mask->rank - 1};
      mask = ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){mask, ox_broadcast_to(x, fill, mask->rank, s)}, &at);
      if (!mask) return -1;
    }
    bias = mask->dtype == NOVA_DTYPE_BOOL ? add_allowed(x, bias, mask) : add(x, bias, mask);
  }
  int64_t left = ox_attr_i(x, "left_window_size", -1), right = ox_attr_i(x, "right_window_size", -1);
  bool causal = ox_attr_i(x, "is_causal", 0) != 0, window = left >= 0 || right >= 0;
  if (nonpad) { /* an external cache: batch b holds nonpad[b] valid keys, the queries are the last ones */
    if (nonpad->dtype != NOVA_DTYPE_I64 || fe_numel(nonpad) != q->shape[0])
      return ox_err(x, "nonpad_kv_seqlen must be int64 [batch]");
    nv_node *nb = ox_reshape(x, nonpad, 4, (int64_t[]){q->shape[0], 1, 1, 1});
    nv_node *offb = sub(x, nb, ox_scalar(x, NOVA_DTYPE_I64, (double)ql));
    if (causal) bias = add_allowed(x, bias, band_per_batch(x, ql, kvl, offb, -1, -1, true));
    if (window) bias = add_allowed(x, bias, band_per_batch(x, ql, kvl, offb, left, right, false));
    bias = add_allowed(x, bias, ox_op2(x, NV_OP_LESS, positions(x, kvl, 3), nb));
  } else {
    if (causal) bias = add_allowed(x, bias, band(x, ql, kvl, off, -1, -1, true));
    if (window) bias = add_allowed(x, bias, band(x, ql, kvl, off, left, right, false));
  }
  if (!bias) return -1;
  /* grouped-query attention: KV head h serves query heads h*r .. h*r + r - 1 */
  int64_t hq = q->shape[1], hk = k->shape[1];
  if (hk == 0 || hq % hk || v->shape[1] != hk)
    return ox_err(x, "%lld query heads do not group over %lld KV heads", (long long)hq, (long long)hk);
  double cap = ox_attr_f(x, "softcap", 0);
  nova_dtype sp = ox_attr(x, "softmax_precision") ? ox_dtype_of_onnx((int32_t)ox_attr_i(x, "softmax_precision", 1)) : dt;
  if (sp != NOVA_DTYPE_F32 && sp != NOVA_DTYPE_F64 && sp != dt) return ox_err(x, "softmax_precision must be float or double");
  bool scores_out = nout > 3 && x->node->n_output > 3 && x->node->output[3][0];
  if (!scores_out && (sp == dt || fe_dtype_is_half(dt))) { /* one nova.attention (half types: computed in f32) */
    nv_node at = {.scale = scale, .softcap = cap > 0 ? cap : 0};
    nv_node *y = ox_add(x, NV_OP_ATTENTION, 4, (nv_node *[]){q, k, v, bias}, &at);
    return attention_outputs(x, y, three, (nv_node *[]){present_k, present_v}, 2, out, nout);
  }
  if (hq != hk) {
    int64_t *ix = nv_xmalloc((size_t)hq * sizeof *ix);
    if (!ix) return -1;
    for (int64_t i = 0; i < hq; i++) ix[i] = i / (hq / hk);
    k = ox_pick(x, k, 1, ix, hq), v = ox_pick(x, v, 1, ix, hq);
    free(ix);
    if (!k || !v) return -1;
  }
  nv_node *kt = ox_transpose(x, mul(x, k, sq), (int64_t[]){0, 1, 3, 2});
  nv_node *qk = ox_op2(x, NV_OP_MATMUL, mul(x, q, sq), kt);
  if (qk && cap > 0) qk = mul(x, ox_op1(x, NV_OP_TANH, dvd(x, qk, K(x, qk, cap))), K(x, qk, cap));
  nv_node *qkb = add(x, qk, bias);
  if (!qkb) return -1;
  if (sp != dt) qkb = ox_add(x, NV_OP_CAST, 1, &qkb, &(nv_node){.to = sp});
  nv_node *p = safe_softmax(x, qkb);
  /* rows whose bias masks every key are 0 */
  int64_t last = bias->rank - 1;
  if (bias->rank >= 1) {
    nv_node *bm = ox_reduce(x, NV_OP_REDUCE_MAX, bias, 1, &last, true);
    p = ox_op3(x, NV_OP_WHERE, ox_op2(x, NV_OP_EQUAL, bm, K(x, bias, -INFINITY)), K(x, p, 0), p);
  }
  if (p && p->dtype != dt) p = ox_add(x, NV_OP_CAST, 1, &p, &(nv_node){.to = dt});
  int64_t mode = ox_attr_i(x, "qk_matmul_output_mode", 0);
  nv_node *outs[3] = {present_k, present_v, mode == 2 ? qkb : mode == 3 ? p : qk};
  if (mode == 2 && outs[2] && outs[2]->dtype != dt) outs[2] = ox_add(x, NV_OP_CAST, 1, &outs[2], &(nv_node){.to = dt});
  return attention_outputs(x, ox_op2(x, NV_OP_MATMUL, p, v), three, outs, 3, out, nout);
}

/* LRN: x / (bias + alpha/size * sum of x^2 over the channel window)^beta,
 * the window [c - floor((size-1)/2), c + ceil((size-1)/2)] cut at the edges. */
CV(cv_lrn) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 1)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t size = ox_attr_i(x, "size", 0);
  if (a->rank < 3 || size <= 0) return ox_err(x, "needs [N, C, spatial...] and a positive size");
  int64_t C = a->shape[1], lo = (size - 1) / 2, hi = size - 1 - lo;
  nv_node *sq = mul(x, a, a), *sum = NULL;
  for (int64_t k = -lo; k <= hi; k++) { /* the channels shifted by k, zero past the edges */
    int64_t from = k > 0 ? k : 0, to = k < 0 ? C + k : C;
    if (from >= to) continue;
    /* channel c reads c + k: zeros first for k < 0, last for k > 0 */
    nv_node *part = ox_zero_pad(x, ox_slice1(x, sq, 1, from, to, 1), 1, k < 0 ? -k : 0, k > 0 ? k : 0);
    sum = sum ? add(x, sum, part) : part;
  }
  double alpha = ox_attr_f(x, "alpha", 1e-4), beta = ox_attr_f(x, "beta", 0.75), bias = ox_attr_f(x, "bias", 1.0);
  nv_node *den = add(x, K(x, a, bias), mul(x, K(x, a, alpha / (double)size), sum));
  return ox_set_out(out, dvd(x, a, ox_op2(x, NV_OP_POW, den, K(x, a, beta))));
}

/* Hann, Hamming and Blackman windows of a known size: constants. */
static int window_fn(ox_ctx *x, ox_val *in, int nin, ox_val *out, int kind) {
  if (ox_need(x, in, nin, 1, 1)) return -1;
  int64_t n;
  if (ox_const_ints(x, in[0], "size", &n, 1) != 1) return -1;
  if (n < 0 || n > (INT64_C(1) << 24)) return ox_err(x, "size %lld is out of range", (long long)n);
  nova_dtype dt = ox_dtype_of_onnx((int32_t)ox_attr_i(x, "output_datatype", 1));
  if (!dt) return ox_err(x, "output_datatype %s is not supported", ox_onnx_type_name((int32_t)ox_attr_i(x, "output_datatype", 1)));
  double N = ox_attr_i(x, "periodic", 1) ? (double)n : (double)n - 1;
  ox_tensor *t = ox_tensor_new(dt, 1, &n);
  if (!t) return -1;
  for (int64_t i = 0; i < n; i++) {
    double c = cos(2 * M_PI * (double)i / N), w;
    if (kind == 0) w = 0.5 - 0.5 * c;
    else if (kind == 1) w = 25.0 / 46.0 - (21.0 / 46.0) * c;
    else w = 0.42 - 0.5 * c + 0.08 * cos(4 * M_PI * (double)i / N);
    ox_set(t, i, w, (int64_t)w);
  }
  return ox_known(out, t);
}
CV(cv_hann) { (void)nout; return window_fn(x, in, nin, out, 0); }
CV(cv_hamming) { (void)nout; return window_fn(x, in, nin, out, 1); }
CV(cv_blackman) { (void)nout; return window_fn(x, in, nin, out, 2); }

CV(cv_center_crop_pad) { /* per axis: the centred part, or zeros around (the odd one after) */
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  int64_t sh[NOVA_MAX_RANK], axes[NOVA_MAX_RANK];
  int n = ox_const_ints(x, in[1], "shape", sh, NOVA_MAX_RANK), na = ox_attr_ints(x, "axes", axes, NOVA_MAX_RANK);
  if (n < 0) return -1;
  if (na < 0) {
    na = a->rank;
    for (int i = 0; i < na; i++) axes[i] = i;
  }
  if (n != na) return ox_err(x, "shape has %d entries for %d axes", n, na);
  for (int i = 0; i < na && a; i++) {
    if (ox_norm_axis(x, &axes[i], a->rank)) return -1;
    int64_t ax = axes[i], dim = a->shape[ax], want = sh[i];
    if (want < 0) return ox_err(x, "shape entries must be >= 0");
    if (want < dim) a = ox_slice1(x, a, ax, (dim - want) / 2, (dim - want) / 2 + want, 1);
    else if (want > dim)
      a = ox_zero_pad(x, a, ax, (want - dim) / 2, want - dim - (want - dim) / 2);
  }
  return ox_set_out(out, a);
}

CV(cv_reverse_sequence) { /* known lengths: one gather_elements along the time axis */
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *a = ox_N(x, in[0]);
  if (!a) return -1;
  if (!in[1].k) return ox_err(x, "sequence_lens must be known when compiling");
  int64_t ba = ox_attr_i(x, "batch_axis", 1), ta = ox_attr_i(x, "time_axis", 0);
  if (a->rank < 2 || (ba != 0 && ba != 1) || (ta != 0 && ta != 1) || ba == ta) return ox_err(x, "batch_axis and time_axis must be 0 and 1");
  if (ox_numel(in[1].k) != a->shape[ba]) return ox_err(x, "sequence_lens must have one entry per batch");
  if (fe_numel(a) > (INT64_C(1) << 22)) return ox_err(x, "the input is too large for a known reversal (2^22 elements)");
  ox_tensor *t = ox_tensor_new(NOVA_DTYPE_I64, a->rank, a->shape);
  if (!t) return -1;
  int64_t idx[NOVA_MAX_RANK] = {0}, e = fe_numel(a);
  for (int64_t i = 0; i < e; i++) {
    int64_t b = idx[ba], tt = idx[ta], l = ox_geti(in[1].k, b), v = tt < l ? l - 1 - tt : tt;
    if (l < 0 || l > a->shape[ta]) {
      ox_tensor_free(t);
      return ox_err(x, "sequence_lens[%lld] = %lld is outside [0, %lld]", (long long)b, (long long)l, (long long)a->shape[ta]);
    }
    ox_set(t, i, (double)v, v);
    for (int k = a->rank - 1; k >= 0 && ++idx[k] == a->shape[k]; k--) idx[k] = 0;
  }
  nv_node *ix = ox_N(x, (ox_val){.k = t, .present = true}), at = {.axis = ta};
  ox_tensor_free(t);
  return ox_set_out(out, ix ? ox_add(x, NV_OP_GATHER_ELEMENTS, 2, (nv_node *[]){a, ix}, &at) : NULL);
}

CV(cv_affine_grid) { /* theta [N, r, r+1] times the homogeneous base grid of the size */
  (void)nout;
  if (ox_need(x, in, nin, 2, 2)) return -1;
  nv_node *th = ox_N(x, in[0]);
  int64_t sz[5];
  int ns = ox_const_ints(x, in[1], "size", sz, 5);
  if (!th || ns < 0) return -1;
  int r = ns - 2;
  if ((r != 2 && r != 3) || th->rank != 3 || th->shape[1] != r || th->shape[2] != r + 1)
    return ox_err(x, "theta must be [N, %d, %d] for a size of %d entries", r, r + 1, ns);
  bool ac = ox_attr_i(x, "align_corners", 0) != 0;
  int64_t pts = 1;
  for (int i = 2; i < ns; i++) pts *= sz[i];
  if (pts > (INT64_C(1) << 22)) return ox_err(x, "the grid is too large");
  int64_t bs[2] = {r + 1, pts};
  ox_tensor *b = ox_tensor_new(th->dtype, 2, bs);
  if (!b) return -1;
  for (int64_t p = 0; p < pts; p++) { /* coordinates x (last dim) first */
    int64_t q = p;
    for (int d = ns - 1; d >= 2; d--) {
      int64_t n = sz[d], i = q % n;
      q /= n;
      double c = ac ? (n > 1 ? -1 + 2.0 * (double)i / (double)(n - 1) : 0) : -1 + (2.0 * (double)i + 1) / (double)n;
      ox_set(b, (int64_t)(ns - 1 - d) * pts + p, c, 0);
    }
    ox_set(b, (int64_t)r * pts + p, 1, 0);
  }
  nv_node *base = ox_N(x, (ox_val){.k = b, .present = true});
  ox_tensor_free(b);
  nv_node *g = ox_op2(x, NV_OP_MATMUL, th, base); /* [N, r, pts] */
  int64_t os[5] = {th->shape[0]};
  for (int i = 2; i < ns; i++) os[i - 1] = sz[i];
  os[ns - 1] = r;
  return ox_set_out(out, g ? ox_reshape(x, ox_transpose(x, g, (int64_t[]){0, 2, 1}), ns, os) : NULL);
}

/* CausalConvWithState: the depthwise convolution of [past_state, input]
 * (zeros without a state), optionally with SiLU; the new state is the last
 * k - 1 steps of that padded input. */
CV(cv_causal_conv) {
  if (ox_need(x, in, nin, 2, 4)) return -1;
  nv_node *a = ox_N(x, in[0]), *w = ox_N(x, in[1]), *b = opt(x, in, nin, 2), *st = opt(x, in, nin, 3);
  if (!a || !w) return -1;
  if (a->rank != 3 || w->rank != 3 || w->shape[0] != a->shape[1] || w->shape[1] != 1)
    return ox_err(x, "input must be [N, C, L] and weight [C, 1, k]");
  int64_t N = a->shape[0], C = a->shape[1], k = w->shape[2];
  char buf[8];
  const char *act = ox_attr_s(x, "activation", "none", buf, sizeof buf);
  if (strcmp(act, "none") && strcmp(act, "silu") && strcmp(act, "swish"))
    return ox_err(x, "activation '%s'; expected none, silu or swish", act);
  nv_node *padded = a;
  if (k > 1) {
    if (!st) {
      st = fe_graph_leaf(x->g, x->d, NV_OP_CONSTANT, NULL, a->dtype, 3, (int64_t[]){N, C, k - 1}, x->loc);
      if (!st) return -1;
    }
    nv_node at = {.axis = 2};
    padded = ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){st, a}, &at);
    if (!padded) return -1;
  }
  nv_node cv = {.groups = C, .nspatial = 1, .kernel = {k}, .strides = {1}, .dilations = {1}};
  nv_node *y = ox_add(x, NV_OP_CONV, 2, (nv_node *[]){padded, w}, &cv);
  if (y && b) y = add(x, y, channel(x, b, 3));
  if (y && strcmp(act, "none")) y = mul(x, y, ox_op1(x, NV_OP_SIGMOID, y));
  if (ox_set_out(out, y)) return -1;
  if (nout > 1) {
    nv_node *ns = k > 1 ? ox_slice1(x, padded, 2, padded->shape[2] - (k - 1), padded->shape[2], 1)
                        : ox_slice1(x, padded, 2, 0, 0, 1);
    out[1] = (ox_val){.node = ns, .present = ns != NULL};
    if (!ns) return -1;
  }
  return 0;
}

/* LinearAttention, unrolled over the sequence: the state S [B, Hkv, dk, dv]
 * decays by exp(decay) (gated), takes beta (v - k S) (delta) or v, adds the
 * outer product k v; each step reads scale q S (KV heads shared by groups). */
CV(cv_linear_attention) {
  if (ox_need(x, in, nin, 3, 6)) return -1;
  nv_node *q = ox_N(x, in[0]), *k = ox_N(x, in[1]), *v = ox_N(x, in[2]);
  nv_node *st = opt(x, in, nin, 3), *decay = opt(x, in, nin, 4), *beta = opt(x, in, nin, 5);
  if (!q || !k || !v) return -1;
  char buf[16];
  const char *rule = ox_attr_s(x, "update_rule", "gated_delta", buf, sizeof buf);
  bool gating = !strcmp(rule, "gated") || !strcmp(rule, "gated_delta"), delta = !strcmp(rule, "delta") || !strcmp(rule, "gated_delta");
  if (!gating && !delta && strcmp(rule, "linear")) return ox_err(x, "update_rule '%s'; expected linear, gated, delta or gated_delta", rule);
  if (gating != (decay != NULL) || delta != (beta != NULL))
    return ox_err(x, "update_rule '%s' takes %s decay and %s beta", rule, gating ? "a" : "no", delta ? "a" : "no");
  int64_t hq = ox_attr_i(x, "q_num_heads", 0), hk = ox_attr_i(x, "kv_num_heads", 0);
  if (q->rank != 3 || k->rank != 3 || v->rank != 3) return ox_err(x, "query, key and value must be [B, T, H*D]");
  if (hq <= 0 || hk <= 0 || hq % hk) return ox_err(x, "q_num_heads must be a positive multiple of kv_num_heads");
  int64_t B = q->shape[0], T = q->shape[1], dk = q->shape[2] / hq, dv = v->shape[2] / hk;
  if (T > 1024) return ox_err(x, "sequences longer than 1024 steps are not supported (unrolled)");
  nova_dtype odt = q->dtype, sdt = st ? st->dtype : q->dtype; /* computed in float32 (at least), as the reference does */
  nova_dtype cdt = odt == NOVA_DTYPE_F64 ? NOVA_DTYPE_F64 : NOVA_DTYPE_F32;
  nv_node **all[6] = {&q, &k, &v, &st, &decay, &beta};
  for (int i = 0; i < 6; i++)
    if (*all[i] && (*all[i])->dtype != cdt) *all[i] = ox_add(x, NV_OP_CAST, 1, all[i], &(nv_node){.to = cdt});
  if (!q || !k || !v) return -1;
  q = heads(x, q, hq), k = heads(x, k, hk), v = heads(x, v, hk); /* [B, H, T, D] */
  if (!q || !k || !v || k->shape[3] != dk) return q && k && v ? ox_err(x, "key's head size differs from query's") : -1;
  double sc = ox_attr_f(x, "scale", 0);
  if (sc == 0) sc = 1 / sqrt((double)dk);
  nova_dtype dt = cdt;
  nv_node *g4 = NULL, *b4 = NULL;
  if (decay) { /* [B, T, Hkv] or [B, T, Hkv*dk] -> [B, Hkv, T, 1 or dk] */
    int64_t last = decay->shape[2];
    if (decay->rank != 3 || (last != hk && last != hk * dk)) return ox_err(x, "decay must be [B, T, kv_num_heads (* d_k)]");
    g4 = ox_transpose(x, ox_reshape(x, decay, 4, (int64_t[]){B, T, hk, last / hk}), (int64_t[]){0, 2, 1, 3});
  }
  if (beta) {
    int64_t last = beta->shape[2];
    if (beta->rank != 3 || (last != hk && last != 1)) return ox_err(x, "beta must be [B, T, kv_num_heads or 1]");
    b4 = ox_transpose(x, ox_reshape(x, beta, 4, (int64_t[]){B, T, last, 1}), (int64_t[]){0, 2, 1, 3});
  }
  int64_t ss[4] = {B, hk, dk, dv};
  nv_node *S = st ? st : fe_graph_leaf(x->g, x->d, NV_OP_CONSTANT, NULL, dt, 4, ss, x->loc);
  if (!S || S->rank != 4 || memcmp(S->shape, ss, sizeof ss)) return S ? ox_err(x, "past_state must be [B, kv_num_heads, d_k, d_v]") : -1;
  int64_t *rep = NULL; /* query head h reads KV head h / (hq / hk) */
  if (hq != hk) {
    if (!(rep = nv_xmalloc((size_t)hq * sizeof *rep))) return -1;
    for (int64_t i = 0; i < hq; i++) rep[i] = i / (hq / hk);
  }
  nv_node *y = NULL, c2 = {.axis = 2};
  for (int64_t t = 0; t < T && S; t++) {
    nv_node *qt = ox_slice1(x, q, 2, t, t + 1, 1), *kt = ox_slice1(x, k, 2, t, t + 1, 1), *vt = ox_slice1(x, v, 2, t, t + 1, 1);
    if (g4) { /* [B, H, 1, 1 or dk] -> [B, H, 1 or dk, 1] */
      nv_node *g = ox_slice1(x, g4, 2, t, t + 1, 1);
      g = ox_reshape(x, g, 4, (int64_t[]){B, hk, g4->shape[3], 1});
      S = mul(x, S, ox_op1(x, NV_OP_EXP, g));
    }
    if (b4) vt = mul(x, ox_slice1(x, b4, 2, t, t + 1, 1), sub(x, vt, ox_op2(x, NV_OP_MATMUL, kt, S)));
    S = add(x, S, ox_op2(x, NV_OP_MATMUL, ox_transpose(x, kt, (int64_t[]){0, 1, 3, 2}), vt));
    nv_node *Sr = rep && S ? ox_pick(x, S, 1, rep, hq) : S;
    nv_node *ot = mul(x, ox_op2(x, NV_OP_MATMUL, qt, Sr), K(x, q, sc)); /* [B, Hq, 1, dv] */
    y = y ? ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){y, ot}, &c2) : ot;
  }
  free(rep);
  if (!y || !S) return -1;
  nv_node *o = ox_reshape(x, ox_transpose(x, y, (int64_t[]){0, 2, 1, 3}), 3, (int64_t[]){B, T, hq * dv});
  if (o && odt != cdt) o = ox_add(x, NV_OP_CAST, 1, &o, &(nv_node){.to = odt});
  if (sdt != cdt) S = ox_add(x, NV_OP_CAST, 1, &S, &(nv_node){.to = sdt});
  if (ox_set_out(out, o) || !S) return -1;
  if (nout > 1) out[1] = (ox_val){.node = S, .present = true};
  return 0;
}

const ox_op_entry ox_nn_ops[] = {
    {"CausalConvWithState", cv_causal_conv}, {"LinearAttention", cv_linear_attention},
    {"LRN", cv_lrn}, {"HannWindow", cv_hann}, {"HammingWindow", cv_hamming}, {"BlackmanWindow", cv_blackman},
    {"CenterCropPad", cv_center_crop_pad}, {"ReverseSequence", cv_reverse_sequence}, {"AffineGrid", cv_affine_grid},
    {"Attention", cv_attention}, {"RotaryEmbedding", cv_rotary}, {"RMSNormalization", cv_rms_norm},
    {"InstanceNormalization", cv_instance_norm}, {"GroupNormalization", cv_group_norm},
    {"LpNormalization", cv_lp_norm}, {"MeanVarianceNormalization", cv_mvn}, {"GlobalMaxPool", cv_global_max_pool},
    {"DepthToSpace", cv_depth_to_space}, {"SpaceToDepth", cv_space_to_depth}, {"EyeLike", cv_eye_like},
};
const size_t ox_nn_nops = sizeof ox_nn_ops / sizeof *ox_nn_ops;
