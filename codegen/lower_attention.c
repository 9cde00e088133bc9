/* lower_attention.c: nova.attention -> linalg on tensors.
 *
 * q (B, Hq, S, D), k (B, Hk, T, D), v (B, Hk, T, Dv), bias broadcasting to
 * (B, Hq, S, T); R = Hq / Hk query heads share a KV head (query head
 * h = g R + r reads KV head g).  The R query heads of group g are
 * contiguous, so q viewed as (B, Hk, R S, D) makes both products batched
 * matmuls over (B, Hk), with K and V read once per group, never copied per
 * query head:
 *   scores  X = q k^T                                  (B, Hk, R S, T)
 *   Z = scale X, capped (c tanh(Z / c)) when softcap c > 0, + bias
 *   m = max_j Z,  l = sum_j exp(Z - m'),  P = exp(Z - m') / l
 *       (m' = 0 where m = -inf, and P = 0 where l = 0: a row whose keys
 *       are all masked gives 0, not NaN)
 *   Y = P v                                            (B, Hk, R S, Dv)
 * Six structured ops (k^T, the two contractions, the score epilogue with
 * the bias, the two row reductions folded with the normalisation); the
 * contractions have matmul's loop order, so the CPU tiling treats them as
 * it treats nova.matmul.
 */
#include <math.h>
#include <string.h>

#include "lower_internal.h"

/* bias (rank <= 4, broadcasting to (B, Hq, S, T)) viewed as rank 5 against
 * the scores (B, Hk, R, S, T): its head axis split into (Hk, R) or (1, 1). */
static tv bias5(lw *L, tv b, int64_t hk, int64_t r) {
  int64_t s4[4] = {1, 1, 1, 1};
  for (int i = 0; i < b.rank; i++) s4[i + 4 - b.rank] = b.shape[i];
  bool heads = s4[1] != 1;
  int64_t s5[5] = {s4[0], heads ? hk : 1, heads ? r : 1, s4[2], s4[3]};
  return lw_reshape(L, b, 5, s5);
}

/* Z = scale X (capped) + bias, on the rank-5 view of the scores. */
static tv epilogue(lw *L, tv x5, tv b5, double scale, double cap) {
  const char *T = lw_ety(x5.dt);
  char body[900], capped[400];
  if (cap > 0)
    snprintf(capped, sizeof capped,
             "%%c = arith.constant %s : %s\n%%q = arith.divf %%z0, %%c : %s\n%%th = math.tanh %%q : %s\n"
             "%%z1 = arith.mulf %%th, %%c : %s\n", FL(cap, x5.dt), T, T, T, T);
  snprintf(body, sizeof body, "%%sc = arith.constant %s : %s\n%%z0 = arith.mulf %%in0, %%sc : %s\n%s%%r = arith.addf %s, %%in1 : %s",
           FL(scale, x5.dt), T, T, cap > 0 ? capped : "", cap > 0 ? "%z1" : "%z0", T);
  tv ins[2] = {x5, b5};
  return lw_elementwise(L, 2, ins, 5, x5.shape, x5.dt, body);
}

/* P = exp(Z - m') / l along the last axis, 0 for fully masked rows. */
static tv safe_softmax(lw *L, tv z) {
  const char *T = lw_ety(z.dt);
  bool red[NOVA_MAX_RANK] = {0};
  red[z.rank - 1] = true;
  char shift[400];
  snprintf(shift, sizeof shift,
           "%%ninf = arith.constant %s : %s\n%%zero = arith.constant %s : %s\n%%isn = arith.cmpf oeq, %%in1, %%ninf : %s\n"
           "%%ms = arith.select %%isn, %%zero, %%in1 : %s\n%%d = arith.subf %%in0, %%ms : %s\n%%t = math.exp %%d : %s\n",
           FL(-INFINITY, z.dt), T, FL(0, z.dt), T, T, T, T, T);
  tv m = lw_reduce(L, z, red, 'M', 0, NULL, NULL);
  tv l = lw_reduce(L, z, red, '+', 1, &m, shift);
  char body[800];
  snprintf(body, sizeof body,
           "%s%%one = arith.constant %s : %s\n%%lz = arith.cmpf oeq, %%in2, %%zero : %s\n"
           "%%den = arith.select %%lz, %%one, %%in2 : %s\n%%r = arith.divf %%t, %%den : %s",
           shift, FL(1, z.dt), T, T, T, T);
  int zm[NOVA_MAX_RANK], rm[NOVA_MAX_RANK];
  for (int i = 0; i < z.rank; i++) zm[i] = rm[i] = i;
  tv ins[3] = {z, m, l};
  const int *mp[3] = {zm, rm, rm};
  return lw_generic(L, 3, ins, mp, z.rank, "pppppppp", zm, z.rank, z.shape, z.dt, (tv){.id = -1}, body);
}

tv lw_lower_attention(lw *L, MlirOperation op, const tv *in, const tv *res) {
  tv q = in[0], k = in[1], v = in[2];
  int64_t B = q.shape[0], hq = q.shape[1], S = q.shape[2], D = q.shape[3];
  int64_t hk = k.shape[1], T = k.shape[2], dv = v.shape[3], R = hq / hk;
  tv q4 = lw_reshape(L, q, 4, (int64_t[]){B, hk, R * S, D});
  tv kt = lw_transpose(L, k, (int64_t[]){0, 1, 3, 2});
  tv xs = {.rank = 4, .shape = {B, hk, R * S, T}, .dt = res->dt};
  tv x = lw_matmul(L, q4, kt, &xs);
  tv x5 = lw_reshape(L, x, 5, (int64_t[]){B, hk, R, S, T});
  tv z = epilogue(L, x5, bias5(L, in[3], hk, R), lw_fattr(op, "scale"), lw_fattr(op, "softcap"));
  tv p = lw_reshape(L, safe_softmax(L, z), 4, xs.shape);
  tv ys = {.rank = 4, .shape = {B, hk, R * S, dv}, .dt = res->dt};
  return lw_reshape(L, lw_matmul(L, p, v, &ys), 4, res->shape);
}
