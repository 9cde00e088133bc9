/* rt_step.h: the runtime's internal view of a nova_step (not installed).
 *
 * The runtime is compiled with -fvisibility=hidden and linked statically
 * into every step.so; only the functions of nova/step.h, defined with
 * NOVA_API, are exported from it.
 */
#ifndef NOVA_RT_STEP_H
#define NOVA_RT_STEP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include "nova/step.h"
#include "rt_graph.h"

#define NOVA_API __attribute__((visibility("default")))

/* Buffers are aligned for the widest vector loads codegen emits (AVX-512). */
#define RT_BUFFER_ALIGN 64
#define RT_ERROR_LEN 1024

#define RT_STEP_MAGIC 0x6e6f7661u /* "nova": a live step; 0 once closed */

struct nova_step {
  unsigned magic;         /* RT_STEP_MAGIC while open */
  atomic_int busy;        /* 1 while a call that uses the buffers runs (rt_step_enter) */
  const rt_graph *graph;  /* borrowed; NULL in a step that failed the ABI check */
  void **buffers;         /* [ntensors] owned, RT_BUFFER_ALIGN-aligned */
  size_t *nbytes;         /* [ntensors] */
  unsigned char *bound;   /* [ntensors] 1 once bind() succeeded */
  void **args;            /* [nargs + 1] buffers[arg_tensor[i]], then the arena (when planned) */
  void *arena;            /* cpu: the planned intermediates (graph->arena_bytes), owned */
  void **eval_args;       /* [eval_nargs + 1] the evaluation entry's arguments, then its arena */
  void *eval_arena;       /* the evaluation's intermediates (graph->eval_arena_bytes), owned */
  struct rt_cuda *cuda;   /* --target=cuda: device state (rt_cuda.c); NULL on the cpu */
  double last_ms;         /* cpu: wall-clock time of the last run */
  int nonfinite;          /* index of the tensor "nonfinite" (role status) of a training step; -1: none */
  int skipped;            /* index of "nonfinite.skipped" (i32, role status: novac --nonfinite=skip-param,
                             the params whose update a non-finite gradient skipped); -1: none */
  int comm_scale;         /* index of "comm.scale" (novac --data-parallel: 1/world, set at open); -1: none */
  int runs;               /* nova_step_run calls that ran the entry (the trace's step numbers) */
  int comm_checked;       /* the ranks agreed on the step and the params (first run of a world > 1) */
  struct rt_sizes *sizes; /* a step for several sizes (rt_sizes.c); NULL: one size */
  char error[RT_ERROR_LEN];
};

/* nova_step_open over an explicit graph (nova_step_open passes
 * &nova_rt_graph).  Same contract as nova_step_open: on NOVA_ERR_ABI (a
 * graph that is not valid for this runtime) *step holds a step carrying
 * only the message; on any other failure *step is NULL. */
nova_status rt_step_open_graph(const rt_graph *graph, nova_step **step);

/* The table of live steps (rt_handle.c).  _add: S is live (0 when out
 * of memory); _live: whether S is a live step (never dereferences S);
 * _remove: S is no longer live (0 if it was not).  _enter: takes S for one
 * call that reads or writes its buffers (0 if another thread holds it),
 * _leave gives it back. */
int rt_handle_add(nova_step *s);
int rt_handle_live(const nova_step *s);
int rt_handle_remove(nova_step *s);
int rt_step_enter(nova_step *s);
void rt_step_leave(nova_step *s);

/* Records the message for nova_step_error(); returns STATUS. */
nova_status rt_fail(nova_step *step, nova_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Descriptor checks at open.  On failure each writes a message to ERR
 * (RT_ERROR_LEN bytes) and returns NOVA_ERR_ABI.
 * _header: ABI version, tensor and argument counts, entry; must pass before
 *   anything else of GRAPH is read.
 * _tensors: every tensor (name unique, role, dtype, shape, index_bound,
 *   init data range) and every argument index; fills NBYTES[ntensors]. */
nova_status rt_graph_check_header(const rt_graph *graph, char *err);
nova_status rt_graph_check_tensors(const rt_graph *graph, size_t *nbytes, char *err);

/* NOVA_OK if every element of tensor I (index_bound > 0) lies in
 * [0, index_bound); otherwise NOVA_ERR_OUT_OF_RANGE with the message. */
nova_status rt_check_index(nova_step *step, int i);

/* A step for several sizes of one dimension (rt_sizes.c; all no-ops on a
 * step of one size).  _check: the descriptor's bucket fields (at open;
 * NOVA_ERR_ABI with ERR); _arena: the largest arena of the step's buckets
 * (EVAL: of their evaluation entries); _open: the buckets' argument arrays
 * (after the buffers and arenas); _follows: whether tensor I has an axis of
 * the dimension; _shape: its shape now and *NBYTES (NULL: not such a
 * tensor); _bind: binds tensor I (checks the shape against the sizes, lays
 * it out for its bucket; refuses NAME.size); _pick: before a run, the entry
 * and arguments of the bound size's bucket, NAME.size set (*SIZE); _done:
 * after it, the outputs moved to that size's layout. */
nova_status rt_sizes_check(const rt_graph *g, char *err);
uint64_t rt_sizes_arena(const rt_graph *g, int eval);
nova_status rt_sizes_open(nova_step *s);
void rt_sizes_close(nova_step *s);
int rt_sizes_follows(const nova_step *s, int i);
const int64_t *rt_sizes_shape(const nova_step *s, int i, size_t *nbytes);
nova_status rt_sizes_bind(nova_step *s, int i, int rank, const int64_t *shape, const void *data);
nova_status rt_sizes_pick(nova_step *s, bool eval, void (**entry)(void **), void ***args, int64_t *size);
void rt_sizes_done(nova_step *s, int64_t size);
/* nova_step_set_size: the shapes the tensors not bound since report. */
nova_status rt_sizes_set(nova_step *s, int64_t size);

/* --target=cuda (rt_cuda.c).  _open: driver, device, module, arena,
 * stream (NOVA_ERR_DEVICE with the reason when there is no usable GPU);
 * _bound: tensor I's host copy changed; _run: uploads what changed, runs
 * the entry, applies updates; _fetch: makes tensor I's host copy current. */
nova_status rt_cuda_open(nova_step *step);
void rt_cuda_close(nova_step *step);
void rt_cuda_bound(nova_step *step, int i);
nova_status rt_cuda_run(nova_step *step);
nova_status rt_cuda_fetch(nova_step *step, int i);
double rt_cuda_last_ms(const nova_step *step);
/* Profiling: per-launch events (see nova_step_set_profiling). */
nova_status rt_cuda_set_profiling(nova_step *step, int on);
int rt_cuda_num_launches(const nova_step *step);
nova_status rt_cuda_launch(const nova_step *step, int i, const char **kernel, double *ms);

#endif
