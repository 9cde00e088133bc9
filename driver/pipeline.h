/* pipeline.h: each target's ordered list of passes (pipeline.c). */
#ifndef NOVA_PIPELINE_H
#define NOVA_PIPELINE_H

#include "../codegen/codegen.h"
#include "../passes/autodiff.h"

typedef struct np_run {
  nova_ctx *c;
  const cfg_device *dev;  /* the CPU or GPU the code is for */
  const cg_gpu_options *gpu; /* the cuda target's options (NULL: the cpu target) */
  cg_gpu *gpu_out;        /* and its kernels, PTX and plan */
  int opt_level;
  const char *dump_after; /* --dump-after: print the module after this stage (NULL: none) */
  bool time_passes;       /* --time-passes: each stage's time on stderr */
  int planned;            /* set by the memplan stage: the intermediates got an arena */
  bool idle;              /* set by a stage that had nothing to do (remat without a limit, ...) */
  int64_t bucket_bytes;   /* --data-parallel's buckets (0: not data-parallel): the trials place them too */
} np_run;

/* Lowers the linalg module M of the step of G to the LLVM dialect through
 * every stage of its target's list in order (PLAN: the cpu target's memory
 * plan, with memory_limit set before; the cuda target plans into
 * R->gpu_out, whose memory limit comes from R->gpu); 0, or -1 after a
 * diagnostic. */
int np_lower(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan);
/* What np_fit_recompute found. */
typedef struct np_fit {
  int trials;                /* plans measured */
  int64_t peak_cheap;        /* the peak with cheap ops recomputed (the default; -1: not planned) */
  int64_t peak_rows;         /* and with norms and attention probabilities as well (0: not tried) */
  int64_t peak;              /* and with the choice */
  double flops;              /* the choice's recomputation */
  char where[160];           /* the op at its peak */
} np_fit;

/* --memory-limit=LIMIT for the training step G (passes/recompute.c): the
 * recomputation whose measured plan fits LIMIT with the fewest flops
 * recomputed, else the one with the smallest peak, into OUT (mu < 0:
 * recomputing cheap ops is enough).  Each plan is measured on G through
 * the nova IR, linalg and R's stages up to the memory plan (R set up as
 * for np_lower); G is left as it was.  0, or -1 after a diagnostic. */
int np_fit_recompute(np_run *r, nv_graph *g, int64_t limit, ad_remat *out, np_fit *fit);
/* The index of stage NAME in the list of the cuda target (GPU) or the cpu
 * target (-1: none), and the name of stage I (NULL past the last). */
int np_stage_index(bool gpu, const char *name);
const char *np_stage_name(bool gpu, int i);

#endif
