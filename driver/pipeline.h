/* pipeline.h: the cpu target's ordered list of passes (pipeline.c). */
#ifndef NOVA_PIPELINE_H
#define NOVA_PIPELINE_H

#include "../codegen/codegen.h"

typedef struct np_run {
  nova_ctx *c;
  const cfg_device *dev;  /* the CPU the code is for */
  int opt_level;
  const char *dump_after; /* --dump-after: print the module after this stage (NULL: none) */
  bool time_passes;       /* --time-passes: each stage's time on stderr */
  int planned;            /* set by the memplan stage: the intermediates got an arena */
  bool idle;              /* set by a stage that had nothing to do (remat without a limit, ...) */
} np_run;

/* Lowers the linalg module M of the step of G to the LLVM dialect through
 * every stage in order (PLAN: the memory plan, with memory_limit set
 * before); 0, or -1 after a diagnostic. */
int np_lower_cpu(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan);
/* The index of stage NAME (-1: none), and the name of stage I (NULL past the last). */
int np_stage_index(const char *name);
const char *np_stage_name(int i);

#endif
