/* passes.h: the whole-step passes on linalg, between the lowering from
 * nova (codegen/lower_linalg.c) and the targets, and the IR utilities every
 * layer above the frontend uses.
 *
 * A whole-step pass sees the training step as one function (forward,
 * backward and update) and changes it for every target: elementwise fusion
 * (fusion.c), the in-place parameter updates (inplace.c), the static memory
 * plan (memplan.c) and rematerialization under --memory-limit (remat.c).
 * The passes on the graph before the IR is built live here too: autodiff
 * (autodiff.h) and mixed precision (amp.h).  Each file's header says what
 * it requires and what it changes.  Nothing here knows a target: the
 * target's pipeline up to the memory plan reaches remat.c as a callback.
 */
#ifndef NOVA_PASSES_H
#define NOVA_PASSES_H

#include <mlir-c/IR.h>
#include <stdint.h>

#include "../frontend/graph.h"
#include "../support/util.h"
#include "nova_ir.h"

/* ---- IR utilities (irutil.c) ---- */

/* Whether OP is the operation NAME ("linalg.generic"); the step's entry,
 * the public func.func with a body (null if none). */
bool cg_op_is(MlirOperation op, const char *name);
MlirOperation cg_entry_func(MlirModule m);
/* Renames every function M defines (llvm.func or func.func with a body,
 * the entry included) to PREFIX + its name, uses included, so that its
 * object links with another step's (the evaluation entry, next to the
 * training step); 0, or -1 if a use could not be renamed. */
int cg_prefix_symbols(MlirModule m, const char *prefix);
/* A growing list of operations (collected by a walk); push is false, and
 * OOM set, when out of memory. */
typedef struct cg_op_list {
  MlirOperation *v;
  size_t n, cap;
  bool oom;
} cg_op_list;
bool cg_op_list_push(cg_op_list *l, MlirOperation op);
/* Pointer -> int (open addressing; a capacity fixed at init, for at most
 * N keys; get: -1 when absent). */
typedef struct cg_ptrmap {
  const void **key;
  int *val;
  size_t cap;
} cg_ptrmap;
void cg_ptrmap_init(cg_ptrmap *h, size_t n);
void cg_ptrmap_put(cg_ptrmap *h, const void *p, int v);
int cg_ptrmap_get(const cg_ptrmap *h, const void *p);
void cg_ptrmap_free(cg_ptrmap *h);
/* A walk callback (UD: a cg_remap): each operand V of the op with MAP[V] =
 * k >= 0 becomes TO[k]. */
typedef struct cg_remap {
  const cg_ptrmap *map;
  const MlirValue *to;
} cg_remap;
MlirWalkResult cg_remap_cb(MlirOperation op, void *ud);
/* OP's structure as tokens (*TOK, malloc'd, *N of them): equal sequences,
 * equal ops but for locations (and a func.func's own name).  The ops and
 * blocks within OP are numbered in walk order; attributes and types are
 * identified by their uniqued pointers; a value from outside OP is
 * OUTSIDE(v, UD) (NULL: all alike). */
typedef uint64_t (*cg_outside_fn)(MlirValue v, void *ud);
void cg_fingerprint(MlirOperation op, cg_outside_fn outside, void *ud, uint64_t **tok, size_t *n);
/* A private func.func @NAME (NIN arguments, NOUT results) whose entry
 * block holds only a func.return without operands (*RET; the caller sets
 * them), not yet in a module. */
MlirOperation cg_make_func(MlirContext ctx, MlirLocation loc, const char *name, int nin, const MlirType *tin, int nout,
                           const MlirType *tout, MlirOperation *ret);
/* A func.call of CALLEE (a symbol reference attribute) with the NOPS
 * operands OPS and NRES results of the types RT, at LOC, inserted before
 * AT. */
MlirOperation cg_insert_call(MlirOperation at, MlirLocation loc, MlirAttribute callee, intptr_t nops, const MlirValue *ops,
                             intptr_t nres, const MlirType *rt);
/* Moves the body of FN's entry block before AT, its arguments replaced by
 * ARGS (one per argument); RESULTS[i]: the value it returned i-th.  FN is
 * left with only its return (the caller destroys it). */
void cg_inline_func(MlirOperation fn, MlirOperation at, const MlirValue *args, MlirValue *results);
/* ---- static memory plan (memplan.c) ---- */
/* What an intermediate of a training step holds (memplan.c): a forward
 * value the backward reads, a gradient (its last reader updates the state
 * in place), or anything else (in a forward step, everything). */
typedef enum cg_buf_kind { CG_BUF_WORKSPACE, CG_BUF_ACTIVATION, CG_BUF_GRADIENT } cg_buf_kind;

typedef struct cg_plan_entry {
  int64_t offset, bytes;  /* in the arena */
  int first, last;        /* live range: indices of top-level ops of the entry, inclusive */
  cg_buf_kind kind;
  char where[160];        /* the defining op's location */
} cg_plan_entry;

typedef struct cg_plan {
  bool planned;           /* false: intermediates on the heap (-O0, or not plannable) */
  cg_plan_entry *entries;
  int n;
  int64_t arena_bytes;    /* the planned peak of intermediates */
  int64_t lower_bound;    /* the most bytes live at once in the step's op order: no
                             placement of these live ranges needs less arena */
  int peak_op;            /* the top-level op where that many are live */
  char peak_where[160];   /* its location */
  int nops;               /* top-level ops of the planned entry */
  int forward_end;        /* a training step's first op that writes the loss (-1: none) */
  int loss_arg;           /* set before planning: the entry argument the loss is written to
                             (a training step; -1: none), which ends the forward pass */
  int64_t total_bytes;    /* the sum of every intermediate (aligned): the memory without reuse */
  int ops_before_fusion;  /* linalg ops (loop nests) of the step before and after fusion */
  int ops_after_fusion;
  bool *inplace;          /* [noutputs] an update computed in its param's buffer (inplace.c) */
  int noutputs;
  int64_t memory_limit;   /* --memory-limit (0: none), set before lowering */
  int64_t peak_without_remat; /* with a limit: the planned peak before recomputing anything */
  int remat_candidates;   /* cheap activations that could be recomputed */
  int remat_values;       /* recomputed in the backward instead of kept */
  int64_t remat_bytes;    /* their sizes, summed */
  int parallel_loops;     /* loop functions shared out between threads (parallel.c) */
  int contraction_kernels; /* contractions compiled as calls of the runtime's kernels (cpu_ukernel.c) */
  int forwarded;          /* results computed in the caller's output buffer, their copy removed */
} cg_plan;

/* The bytes of a step's inputs, parameters, state and outputs (an update
 * computed in place counts once): the planned peak is this plus the arena. */
int64_t cg_io_bytes(const nv_graph *g, const cg_plan *plan);

/* The step's memory at top-level op AT of the plan, by what it holds:
 * parameters (and buffers), optimizer state, inputs and outputs (the
 * caller's; gradients kept as outputs count as gradients), and the
 * arena's buffers live there by kind.  The first four do not change
 * during a run; the sum is at most the planned peak. */
enum { CG_MEM_PARAMS, CG_MEM_OPT_STATE, CG_MEM_IO, CG_MEM_GRADIENTS, CG_MEM_ACTIVATIONS, CG_MEM_WORKSPACE,
       CG_MEM_NKINDS };
extern const char *const cg_mem_kind_names[CG_MEM_NKINDS];
int cg_mem_kind_of(cg_buf_kind k); /* the CG_MEM_* an arena buffer of kind K counts in */
void cg_mem_at(const nv_graph *g, const cg_plan *plan, int at, int64_t out[CG_MEM_NKINDS]);

/* remat.c: with PLAN->memory_limit set, recomputes cheap activations of the
 * fused linalg module M in the backward pass (the fewest, largest first)
 * until the planned peak fits the limit.  PLAN_FN runs the target's
 * pipeline up to the memory plan on a copy of M (0 on success).  0 with M
 * rewritten and PLAN's remat fields set, or -1 after a diagnostic (the step
 * cannot fit: the message gives the smallest peak reached). */
typedef int (*cg_plan_fn)(nova_ctx *c, const nv_graph *g, MlirModule m, cg_plan *plan, void *ud);
int cg_fit_memory(nova_ctx *c, const nv_graph *g, MlirModule m, cg_plan_fn plan_fn, void *ud, cg_plan *plan);
/* -1 after a diagnostic when LIMIT is below G's parameters and optimizer
 * state alone (no plan can fit), else 0. */
int cg_limit_below_state(nv_diag *d, const nv_graph *g, int64_t limit);

/* inplace.c: before bufferization, for each result j of the entry that
 * updates argument PARAM_ARG[j] (-1: none), makes the update compute into
 * its argument where it can and marks the argument writable; after it, for each (param
 * argument, update argument) pair, whether the update was computed in the
 * param's buffer (OK[j]; its copy into the out-parameter is removed).  0,
 * or -1 when out of memory. */
int cg_mark_writable(MlirModule m, const int *param_arg, int n);
int cg_inplace(MlirModule m, const int *param_arg, const int *update_arg, int n, bool *ok);
/* The same for the step of G (step.c knows the argument order):
 * cg_prepare_inplace before bufferization, cg_plan_inplace after it (into
 * PLAN->inplace). */
int cg_prepare_inplace(nova_ctx *c, const nv_graph *g, MlirModule m);
int cg_plan_inplace(const nv_graph *g, MlirModule m, cg_plan *plan);

/* Elementwise fusion over the whole linalg module (at -O1 and above),
 * counting the linalg ops before and after into STATS. */
int cg_fuse(nova_ctx *c, MlirModule m, int opt_level, bool half_contractions, cg_plan *stats);
/* fusion_cap.c: a second use (a call) of the producers that would make a
 * fused body pass the cap; their number.  Then the calls removed. */
int cg_fusion_barriers(MlirModule m, bool half_contractions);
void cg_drop_fusion_barriers(MlirModule m);

/* Plans the intermediates of a bufferized module (see memplan.c): 0 when
 * planned (the entry then takes the arena as one more argument), 1 when
 * the module is not plannable (unchanged), -1 on an internal error. */
int cg_memplan(nova_ctx *c, MlirModule m, cg_plan *plan);
/* Bytes of a static memref type's data (at least 1). */
int64_t cg_type_bytes(MlirType t);
void cg_plan_free(cg_plan *p);
/* An MlirStringCallback appending to the nv_sbuf UD. */
void cg_print_to_sbuf(MlirStringRef s, void *ud);
/* The process's peak resident size so far, in MiB. */
double cg_peak_rss_mib(void);
/* Runs a textual pass pipeline on m; 0 on success (else a diagnostic
 * naming STAGE). */
int cg_run_pipeline(nova_ctx *c, MlirModule m, const char *pipeline, const char *stage);
/* Milliseconds of wall time (NOVAC_DEBUG_PIPELINES=cpu: of process CPU time). */
double cg_now_ms(void);

#endif
