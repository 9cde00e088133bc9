/* autodiff.h: the training step, synthesized on the checked graph.
 *
 * Requires: a checked graph with a scalar floating-point loss output.
 * Produces (in place): the same graph extended with the backward pass
 * (reverse topological order, gradients accumulated where a value fans
 * out, no work for values that do not lead from a trainable parameter to
 * the loss) and the optimizer update, so that the step computes
 *   train_step(batch..., lr, params..., opt_state...) ->
 *     (loss, other outputs..., grads..., params'..., opt_state'..., nonfinite)
 * (grads only with keep_grads: else a gradient is an intermediate the update reads)
 * where the primed values are written back over the state by the runtime
 * after each run (role "update").  nonfinite (bool scalar, role "status")
 * is true when the loss or an element of a gradient is NaN or infinite;
 * every primed value is then the old one, bit for bit (the frontend's
 * updates of buffers too); with AD_SKIP_PARAM, only those of the params
 * whose gradient is not finite (all of them for a non-finite loss), and
 * the step has one more output, nonfinite.skipped (i32 scalar, role
 * status): how many params kept their values.  The graph is emitted as nova IR like any
 * other: forward, backward and update are one function.
 */
#ifndef NOVA_AUTODIFF_H
#define NOVA_AUTODIFF_H

#include "../frontend/graph.h"

typedef enum ad_optimizer { AD_SGD, AD_MOMENTUM, AD_ADAMW } ad_optimizer;

/* What a non-finite loss or gradient skips (--nonfinite): the whole step
 * (every update waits for every gradient), or each parameter whose own
 * gradient is not finite (every update as soon as its gradient is
 * complete; a non-finite loss still skips everything). */
typedef enum ad_nonfinite { AD_SKIP_STEP, AD_SKIP_PARAM } ad_nonfinite;

typedef struct ad_options {
  const char *loss;         /* output name; NULL: the one scalar float output */
  const char *freeze;       /* comma-separated globs of params kept constant, or NULL */
  const char *train_only;   /* comma-separated globs: only matching params are trained, or NULL */
  ad_optimizer optimizer;
  double lr, momentum, beta1, beta2, eps, weight_decay;
  /* --clip-grad-norm (0: none): every gradient times min(1, M / (norm + 1e-6)), the norm
   * the 2-norm of all trained params' gradients together, M the run-time input
   * clip.max_norm (default clip_norm); the norm is the output grad_norm (role status) */
  double clip_norm;
  /* --no-decay: comma-separated globs of params updated without weight decay; NULL: those
   * of rank 0 and 1 (biases, norm weights and biases: most recipes' rule); "none": none */
  const char *no_decay;
  /* --accumulate=K (0 or 1: none): each run adds its (unscaled) gradient to NAME.accum
   * (optimizer state); the run that completes the run-time input accum.steps (default K)
   * of them updates the params with their mean and clears them (state accum.count) */
  int accumulate;
  bool nesterov;
  /* dynamic loss scaling (0: none): the backward pass is seeded with the
   * state amp.loss_scale (initially loss_scale), the gradients unscaled
   * before they are used; see scale_rule in autodiff.c */
  double loss_scale;
  int64_t loss_scale_window;
  /* --bf16-master=none: a trained bf16 param is updated in f32 (its
   * optimizer state f32) and stored back with stochastic rounding, from
   * the step's Philox stream (rng.seed, rng.step; made when the model has
   * no dropout) */
  bool bf16_sround;
  /* --keep-grads: each gradient is an output of the step (role grad, NAME.grad);
   * else gradients are intermediates, alive only until the update reads them */
  bool keep_grads;
  ad_nonfinite nonfinite;
  /* --data-parallel: each gradient is summed over the ranks (nova.all_reduce) and scaled by the
   * input comm.scale before the checks and updates read it */
  bool data_parallel;
  /* --shard-optimizer (with data_parallel, over shard_world ranks: --world-size): ZeRO-1.  Each
   * gradient is reduce-scattered instead (each rank gets the sum of its 1/N of the flat gradient),
   * each rank updates its 1/N of every param with optimizer state of that size (NAME.adam_m.shard,
   * ...), and the new params are all-gathered; the finite check is summed over the ranks */
  int shard_world;
  /* --world-size=N (0: any): the step is for N ranks, an input comm.world (i32, default N) that
   * the runtime compares with its launcher's world when it opens */
  int world_size;
} ad_options;

/* Whether param N is trained: role param, float, not frozen, not matched
 * by FREEZE, matched by TRAIN_ONLY when given (comma-separated globs; FM
 * and TM, NV_MAX_GLOBS entries, mark the patterns that matched). */
bool ad_trains(const nv_node *n, const char *freeze, const char *train_only, bool *fm, bool *tm);

/* Returns 0, or -1 with diagnostics (no loss, a loss no parameter reaches,
 * an op without a backward rule on the way, a freeze pattern that matches
 * nothing). */
int ad_train(nv_graph *g, nv_diag *d, const ad_options *o);

/* Which params the loss depends on through differentiable ops: builds the
 * backward pass of every float param of role param on G (which is left
 * extended: a throwaway copy) and sets REACHED[id] for each param that got
 * a gradient (REACHED has g->nnodes entries, as G is on entry).  Returns
 * 0, or -1 with diagnostics (no loss, an op without a backward rule). */
int ad_grad_reach(nv_graph *g, nv_diag *d, const char *loss, bool *reached);

/* Attention written out op by op (softmax of q k^T scaled and masked,
 * times v) becomes one NV_OP_ATTENTION (passes/attention.c), whose
 * backward recomputes the probabilities: before ad_train.  *FUSED: how
 * many.  0, or -1 (out of memory, a diagnostic). */
int ad_fuse_attention(nv_graph *g, nv_diag *d, int *fused);
/* The attentions among G's first N nodes (the forward of a training step),
 * left as they are: MARK[id] set for each one's scores matmul, the
 * elementwise ops between it and the softmax (any single-use ones: casts
 * too), the softmax and a cast after it (what the backward may compute
 * again from q and k instead of keeping the probabilities).  0, or -1 when
 * out of memory. */
int ad_attention_marks(nv_graph *g, int n, bool *mark);

/* What recomputation may cost (--memory-limit): mu < 0, only cheap ops
 * (free); else every pure op at mu bytes a flop, the forward cut into
 * segments of about segment_bytes of values the backward reads (0: one
 * segment, in which only cheap ops are recomputed), expensive ones
 * recomputed in the first segments_recomputed of them. */
typedef struct ad_remat {
  double mu;
  int64_t segment_bytes;
  int segments_recomputed; /* > 0: expensive ops only in the first this many (0: all but the last) */
  bool rows;               /* (also implied by mu >= 0) norms are recomputed like cheap ops, and each
                              attention's scores and probabilities from its q and k, as flash attention
                              does (ad_attention_marks), instead of being kept */
} ad_remat;

/* The forward values the backward reads, chosen by a minimum cut of the
 * bytes kept (passes/recompute.c): cheap ones (elementwise, casts, data
 * movement) are recomputed in the backward from the values it keeps, and
 * with O (NULL: cheap ones only) expensive ones too, at O's price.
 * Needs g->nforward (ad_train); fills g->recompute.  0, or -1 (out of
 * memory, a diagnostic). */
int ad_recompute(nv_graph *g, nv_diag *d, const ad_remat *o);

/* With --nonfinite=skip-param (g->update_from set by ad_train): the nodes
 * after the backward pass move up, each to just after the last node it
 * depends on (passes/schedule.c), so that each param is updated as soon as
 * its gradient is complete and the gradient dies there.  After
 * ad_recompute.  0, or -1 when out of memory. */
int ad_schedule_updates(nv_graph *g);

/* --data-parallel (passes/comm.c): the all-reduces of the gradients in
 * buckets of at least BUCKET_BYTES, in the order the gradients come, each
 * bucket's placed right after its last gradient (what reads them after
 * it); g->comm describes the buckets.  After ad_schedule_updates.  0, or
 * -1 when out of memory. */
int ad_comm_schedule(nv_graph *g, int64_t bucket_bytes);

#endif
