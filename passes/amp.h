/* amp.h: mixed precision, a whole-graph pass on the checked forward graph.
 *
 * Requires: a checked graph (before autodiff, so that the backward pass is
 * synthesized through the casts this pass inserts, and every gradient of a
 * low-precision value is computed in that precision, as torch.autocast's
 * backward is).
 * Changes (in place): each op is given a compute dtype, f32 or the low
 * precision (bf16 or f16), by a policy, and casts are inserted where a
 * value's dtype differs from what its user computes in.  Only f32 values
 * change (f64, integer and 16-bit values are left as they are), but for
 * the f32 masters of trained 16-bit params (amp_options.masters) and, with
 * amp_options.bf16_params (--bf16-master=none), trained params stored in
 * bf16.  Inputs, parameters and constants keep their dtype otherwise
 * (parameters stay f32 masters, cast where a low-precision op reads them: one cast per value
 * and dtype, so a weight's low copy is made once per step); every output
 * keeps its dtype (a low value is cast back), so the step's interface is
 * the same at every precision.
 *
 * The default policy (amp_policy_default):
 *   low    matmul, conv, attention (accumulation stays f32: the lowering
 *          reads half operands through f32);
 *   f32    softmax, log_softmax, layer_norm, rms_norm, the sums, means and
 *          products (reduce_sum, reduce_mean, reduce_prod, cumsum),
 *          cross_entropy, and the functions whose low-precision results
 *          lose most (exp, log, pow, sinh, cosh, tan, asin, acos);
 *   follow everything else: computed in the low precision when a float
 *          operand is a low-precision value and none is an f32 activation
 *          (weights and constants are then cast down, as a bias is); in f32
 *          when one is (type promotion: a residual sum stays f32); an op
 *          whose float operands are all weights and constants stays f32.
 * A policy file (amp_policy_load) overrides this per op kind or per name.
 */
#ifndef NOVA_AMP_H
#define NOVA_AMP_H

#include "../frontend/graph.h"

typedef enum amp_class { AMP_FOLLOW, AMP_LOW, AMP_F32 } amp_class;

typedef struct amp_rule {
  char *glob;     /* owned: matched against a value's name (.nova) or an ONNX node's name */
  amp_class cls;
} amp_rule;

typedef struct amp_policy {
  amp_class op[NV_OP_COUNT];
  int nrules;
  amp_rule *rules; /* the first that matches wins, before the op's class */
} amp_policy;

/* The default policy above. */
void amp_policy_default(amp_policy *p);
/* Overrides P from the JSON file PATH:
 *   {"ops": {"softmax": "low", "matmul": "f32"}, "names": {"head*": "f32"}}
 * classes "low", "f32" (or "fp32") and "follow"; op kinds as the nova
 * format names them.  Returns 0, or -1 after a diagnostic (unreadable
 * file, bad JSON, an unknown key, op or class). */
int amp_policy_load(amp_policy *p, nv_diag *d, const char *path);
void amp_policy_free(amp_policy *p);

typedef struct amp_stats {
  int low_ops;    /* ops computed in the low precision */
  int casts;      /* casts inserted */
  int masters;    /* f16/bf16 params given an f32 master */
  int bf16_params; /* f32 params stored in bf16 (amp_options.bf16_params) */
} amp_stats;

typedef struct amp_options {
  nova_dtype low;             /* NOVA_DTYPE_BF16 or F16; 0: no policy (masters only) */
  const amp_policy *policy;   /* with LOW (unread without) */
  /* --train: each trained f16/bf16 param (role param, not frozen, not
   * matched by FREEZE, matched by TRAIN_ONLY when given; comma-separated
   * globs) becomes an f32 master, cast to its own dtype where it is read:
   * the optimizer updates the master, the forward pass reads the rounded
   * copy (a 16-bit model trains as PyTorch's master-weight recipes do) */
  bool masters;
  /* --bf16-master=none (with LOW bf16 and MASTERS): each trained f32 or
   * f16 param is stored in bf16 instead (its initial value rounded to
   * nearest), and a bf16 one keeps no master: the optimizer updates it
   * with stochastic rounding (ad_options.bf16_sround) */
  bool bf16_params;
  const char *freeze, *train_only;
} amp_options;

/* Applies the policy (and the masters) to G.  Returns 0, or -1 after a
 * diagnostic (an op that cannot take the dtypes the policy gives it: the
 * policy file's op is named). */
int amp_apply(nv_graph *g, nv_diag *d, const amp_options *o, amp_stats *st);

#endif
