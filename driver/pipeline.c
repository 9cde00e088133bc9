/* pipeline.c: each target's passes from linalg on tensors to the LLVM
 * dialect (and, for cuda, PTX), in order, as one flat list per target.
 *
 * Each stage is a whole-step pass (passes/) or a target step (codegen/);
 * the lists are the only place that orders them.  After each stage of the
 * main run that changed the module, it is verified (a failure names the
 * stage; a verification of a 16,000-op step takes 0.13 s), timed
 * (--time-passes), and printed when it is the --dump-after stage.  A stage
 * with min_opt 1 is skipped at -O0.  remat runs the stages from inplace to
 * memplan again on copies of the module, to measure the peak each set of
 * recomputed values gives (passes/remat.c), without verifying or printing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../passes/autodiff.h"
#include "../passes/nova_ir.h"
#include "../support/util.h"
#include "pipeline.h"

typedef struct np_stage {
  const char *name;
  int min_opt;
  int (*run)(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan);
} np_stage;

/* (a cuda contraction reads 16-bit operands itself at -O1 and up:
 * half_contract.c, the half-contract stage) */
static int st_fusion(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g;
  bool half = r->gpu ? r->opt_level > 0 : cg_cpu_bf16_dot(r->dev, r->opt_level);
  return cg_fuse(r->c, m, r->opt_level, half, plan);
}

/* (every other f32 contraction too: the GEMM kernels take them batched,
 * their transposed operands read in place, gemm_cuda.c) */
static int st_half(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g, (void)plan;
  int n = 0, n32 = 0;
  int rc = cg_half_contractions(r->c, m, CG_HALF_BF16 | CG_HALF_F16, NULL, NULL, &n);
  if (!rc) rc = cg_half_contractions(r->c, m, CG_CONTRACT_F32, NULL, NULL, &n32);
  int moved = 0;
  if (!rc) rc = cg_gemm_epilogue_order(r->c, m, r->gpu && r->gpu->tf32, &moved);
  r->idle = !n && !n32 && !moved;
  return rc;
}

/* reductions split for the GPU's threads (codegen/gpu_reduce.c) */
static int st_split(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g, (void)plan;
  int rows = 0, cols = 0;
  int rc = cg_gpu_split_reductions(r->c, m, r->dev, &rows, &cols);
  if (r->gpu_out) r->gpu_out->split_rows = rows, r->gpu_out->split_cols = cols;
  r->idle = !rows && !cols;
  return rc;
}

static int run_range(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan, int from, int to, bool main);

/* cg_plan_fn for remat: the stages inplace .. memplan on a copy. */
static int trial_plan(nova_ctx *c, const nv_graph *g, MlirModule m, cg_plan *plan, void *ud) {
  np_run r = *(np_run *)ud;
  r.c = c;
  r.planned = 0;
  int from = np_stage_index(r.gpu != NULL, "inplace"), to = np_stage_index(r.gpu != NULL, "memplan");
  int rc = run_range(&r, g, m, plan, from, to, false);
  return rc < 0 ? -1 : r.planned ? 0 : 1;
}

static int st_remat(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  r->idle = plan->memory_limit <= 0;
  return r->idle ? 0 : cg_fit_memory(r->c, g, m, trial_plan, r, plan);
}

static int st_inplace(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)plan;
  return cg_prepare_inplace(r->c, g, m);
}

static int st_fastmath(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g, (void)plan;
  return cg_fast_math(r->c, m);
}

static int st_ukernels(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g;
  int n = 0;
  int rc = cg_cpu_contract_kernels(r->c, m, r->dev, r->opt_level, &n);
  r->idle = !n;
  plan->contraction_kernels = n;
  return rc;
}

static int st_tiling(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g, (void)plan;
  return cg_cpu_tile(r->c, m, r->dev, r->opt_level);
}

static int st_bufferize(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g, (void)plan;
  return cg_bufferize(r->c, m, r->opt_level, false) || cg_comm_calls(r->c, m, !r->gpu || r->gpu->sim) ? -1 : 0;
}

static int st_plan_inplace(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)r;
  return cg_plan_inplace(g, m, plan);
}

/* The entry argument the loss is written to: after the inputs and params,
 * the outputs as out-parameters in their order (-1: no training step). */
static int loss_argument(const nv_graph *g) {
  int nargs = 0;
  for (int i = 0; i < g->nnodes; i++) nargs += g->nodes[i]->op == NV_OP_INPUT || g->nodes[i]->op == NV_OP_PARAM;
  for (int j = 0; g->train && j < g->noutputs; j++)
    if (g->outputs[j].role == NOVA_ROLE_LOSS) return nargs + j;
  return -1;
}

static int st_memplan(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  plan->loss_arg = loss_argument(g);
  int rc = cg_memplan(r->c, m, plan); /* 1: not plannable (intermediates stay on the heap) */
  r->planned = rc == 0;
  return rc < 0 ? -1 : 0;
}

static int st_dealloc(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g, (void)plan;
  r->idle = r->planned || (r->gpu && !r->gpu->sim); /* (device memory: the runtime's) */
  return r->idle ? 0 : cg_run_pipeline(r->c, m, "builtin.module(buffer-deallocation-pipeline)", "buffer deallocation");
}

static int st_llvm(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g;
  return cg_lower_loops_to_llvm(r->c, m, r->opt_level > 0 ? &plan->parallel_loops : NULL);
}

static int st_kernels(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g, (void)plan;
  return cg_gpu_kernels(r->c, m, r->dev, r->gpu, r->gpu_out);
}

static int st_sim_llvm(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g, (void)plan;
  r->idle = !r->gpu->sim;
  return r->idle ? 0 : cg_gpu_sim_llvm(r->c, m, r->dev, r->gpu, r->gpu_out);
}

static int st_nvvm(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  (void)g, (void)plan;
  r->idle = r->gpu->sim;
  return r->idle ? 0 : cg_gpu_nvvm(r->c, m, r->dev, r->gpu, r->gpu_out);
}

static const np_stage cpu_stages[] = {
    {"fusion", 0, st_fusion},              /* passes/fusion.c */
    {"remat", 1, st_remat},                /* passes/remat.c: with --memory-limit */
    {"inplace", 1, st_inplace},            /* passes/inplace.c: update destinations */
    {"fastmath", 1, st_fastmath},          /* codegen/fastmath.c */
    {"ukernels", 1, st_ukernels},          /* codegen/cpu_ukernel.c: contractions as the runtime's kernels */
    {"tiling", 1, st_tiling},              /* codegen/cpu_tile.c */
    {"bufferization", 0, st_bufferize},    /* codegen/cpu.c (one-shot, in pieces: chunk.c) */
    {"inplace-plan", 1, st_plan_inplace},  /* passes/inplace.c: copies of in-place updates removed */
    {"memplan", 1, st_memplan},            /* passes/memplan.c */
    {"dealloc", 0, st_dealloc},            /* unplanned steps: frees on the heap */
    {"llvm", 0, st_llvm},                  /* codegen/cpu.c: loops, threads, entry packing, LLVM dialect */
    {NULL, 0, NULL},
};

static const np_stage gpu_stages[] = {
    {"fusion", 0, st_fusion},              /* passes/fusion.c */
    {"half-contract", 1, st_half},         /* codegen/half_contract.c: contractions read 16-bit operands */
    {"split-reduce", 1, st_split},         /* codegen/gpu_reduce.c: long reductions shared by many threads */
    {"remat", 1, st_remat},                /* passes/remat.c: with --memory-limit */
    {"inplace", 1, st_inplace},            /* passes/inplace.c: update destinations */
    {"bufferization", 0, st_bufferize},    /* codegen/cpu.c */
    {"inplace-plan", 1, st_plan_inplace},  /* passes/inplace.c */
    {"memplan", 1, st_memplan},            /* passes/memplan.c: the scratch area */
    {"dealloc", 0, st_dealloc},            /* --gpu-sim, unplanned: frees on the heap */
    {"kernels", 0, st_kernels},            /* codegen/cuda.c, gemm_cuda.c: kernels and launches */
    {"llvm", 0, st_sim_llvm},              /* --gpu-sim: launches as CPU loops, LLVM dialect */
    {"nvvm", 0, st_nvvm},                  /* codegen/cuda.c: kernels outlined, NVVM, PTX */
    {NULL, 0, NULL},
};

static const np_stage *list(bool gpu) { return gpu ? gpu_stages : cpu_stages; }

int np_stage_index(bool gpu, const char *name) {
  const np_stage *l = list(gpu);
  for (int i = 0; l[i].name; i++)
    if (!strcmp(l[i].name, name)) return i;
  return -1;
}

const char *np_stage_name(bool gpu, int i) {
  const np_stage *l = list(gpu);
  for (int k = 0; k < i; k++)
    if (!l[k].name) return NULL;
  return i >= 0 ? l[i].name : NULL;
}

static int run_range(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan, int from, int to, bool main) {
  for (int i = from; i <= to; i++) {
    const np_stage *s = &list(r->gpu != NULL)[i];
    if (r->opt_level < s->min_opt) continue;
    double t0 = cg_now_ms();
    r->idle = false;
    if (s->run(r, g, m, plan)) return -1;
    if (getenv("NOVAC_DEBUG_PIPELINES"))
      fprintf(stderr, "novac: %8.1f ms %6.0f MiB  (%s%s)\n", cg_now_ms() - t0, cg_peak_rss_mib(), s->name,
              main ? "" : ", a trial plan");
    if (!main) continue;
    char what[64];
    snprintf(what, sizeof what, "the %s stage", s->name);
    if (!r->idle && nova_verify(r->c, m, what)) return -1; /* a stage that changed nothing: not again */
    if (r->time_passes) fprintf(stderr, "novac:   %-20s %9.2f ms\n", s->name, cg_now_ms() - t0);
    if (r->dump_after && !strcmp(r->dump_after, s->name)) {
      fprintf(stderr, "// ----- IR after %s -----\n", s->name);
      nova_print_op(mlirModuleGetOperation(m), stderr);
    }
  }
  return 0;
}

int np_lower(np_run *r, const nv_graph *g, MlirModule m, cg_plan *plan) {
  r->planned = 0;
  if (r->gpu && cg_gpu_init(r->c, r->dev, r->gpu, r->gpu_out)) return -1;
  if (r->gpu) plan = &r->gpu_out->plan;
  int n = 0;
  while (list(r->gpu != NULL)[n].name) n++;
  return run_range(r, g, m, plan, 0, n - 1, true);
}

/* ---- --memory-limit: what the backward recomputes (passes/recompute.c) ---- */

typedef struct fit_trial {
  ad_remat a;
  int64_t peak;               /* -1: not planned */
  struct nv_recompute_stats st;
  char where[160];            /* the op at the peak */
} fit_trial;

/* The peak of the step of G with T->a's recomputation: G through the nova
 * IR, linalg and R's stages up to the memory plan, then G as it was.  0,
 * or -1 after a diagnostic. */
static int graph_trial(np_run *r, nv_graph *g, fit_trial *t) {
  nv_graph_state st;
  nv_diag *d = r->c->diag;
  if (fe_graph_save(g, &st)) {
    nv_error_plain(d, "out of memory while trying recomputations");
    return -1;
  }
  int rc = -1;
  MlirModule nova = {NULL}, lin = {NULL};
  cg_plan p = {0};
  cg_gpu gpu = {0};
  cg_gpu_options go = r->gpu ? *r->gpu : (cg_gpu_options){0};
  np_run tr = *r;
  tr.planned = 0;
  t->peak = -1;
  if (ad_recompute(g, d, &t->a) || ad_schedule_updates(g) ||
      (r->bucket_bytes > 0 && ad_comm_schedule(g, r->bucket_bytes)))
    goto out;
  t->st = g->recompute;
  nova = nova_build_module(r->c, g);
  if (mlirModuleIsNull(nova)) goto out;
  lin = cg_lower_to_linalg(r->c, nova);
  if (mlirModuleIsNull(lin)) goto out;
  cg_plan *pl = &p;
  if (r->gpu) {
    go.memory_limit = 0; /* (no linalg remat in a trial) */
    tr.gpu = &go;
    tr.gpu_out = &gpu;
    if (cg_gpu_init(r->c, r->dev, &go, &gpu)) goto out;
    pl = &gpu.plan;
  }
  if (run_range(&tr, g, lin, pl, 0, np_stage_index(r->gpu != NULL, "memplan"), false)) goto out;
  if (tr.planned) {
    t->peak = cg_io_bytes(g, pl) + pl->arena_bytes;
    snprintf(t->where, sizeof t->where, "%s", pl->peak_where);
  }
  rc = 0;
  if (getenv("NOVAC_DEBUG_REMAT"))
    fprintf(stderr, "recompute: mu %g, segments of %lld bytes (%d, %d recomputed): peak %lld, %d values (%d "
            "expensive), %.3g flops\n", t->a.mu, (long long)t->a.segment_bytes, t->st.segments,
            t->st.segments_recomputed, (long long)t->peak, t->st.values, t->st.heavy, t->st.flops);
out:
  cg_plan_free(&p);
  cg_gpu_free(&gpu);
  if (!mlirModuleIsNull(lin)) mlirModuleDestroy(lin);
  if (!mlirModuleIsNull(nova)) mlirModuleDestroy(nova);
  fe_graph_restore(g, &st);
  return rc;
}

static bool lower_peak(const fit_trial *a, const fit_trial *b) {
  return a->peak >= 0 && (b->peak < 0 || a->peak < b->peak);
}

int np_fit_recompute(np_run *r, nv_graph *g, int64_t limit, ad_remat *out, np_fit *fit) {
  memset(fit, 0, sizeof *fit);
  *out = (ad_remat){-1, 0, 0, false};
  if (cg_limit_below_state(r->c->diag, g, limit)) return -1;
  fit_trial t = {.a = {-1, 0, 0, false}}, best;
  if (graph_trial(r, g, &t)) return -1;
  best = t;
  fit->trials = 1;
  fit->peak_cheap = t.peak;
  if (t.peak >= 0 && t.peak <= limit) goto done;
  /* norms and attention probabilities recomputed too: a pass over rows
   * each, and the scores' matmul (flash attention's price) */
  t = (fit_trial){.a = {-1, 0, 0, true}};
  if (graph_trial(r, g, &t)) return -1;
  fit->trials++;
  fit->peak_rows = t.peak;
  if (lower_peak(&t, &best)) best = t;
  if (best.peak >= 0 && best.peak <= limit) goto done;
  const char *force = getenv("NOVAC_DEBUG_REMAT_FORCE"); /* "MU:SEGMENT_BYTES": that one, measured */
  if (force) {
    const char *c1 = strchr(force, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL; /* MU:BYTES[:SEGMENTS] */
    t = (fit_trial){.a = {strtod(force, NULL), c1 ? strtoll(c1 + 1, NULL, 10) : 0, c2 ? atoi(c2 + 1) : 0, true}};
    if (graph_trial(r, g, &t)) return -1;
    best = t;
    goto done;
  }
  /* the segments: each recomputed whole from its start (mu 0), the
   * forward cut into more and more; the peak falls with the values kept
   * through the backward, then rises with the checkpoints */
  int64_t total = t.st.saved_before;
  static const int parts[] = {2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};
  int worse = 0;
  for (size_t i = 0; i < sizeof parts / sizeof *parts && total > 0 && worse < 2; i++) {
    t = (fit_trial){.a = {0, total / parts[i] > 0 ? total / parts[i] : 1, 0, true}};
    if (graph_trial(r, g, &t)) return -1;
    fit->trials++;
    if (lower_peak(&t, &best)) {
      best = t;
      worse = 0;
    } else {
      worse++;
    }
  }
  if (best.peak >= 0 && best.peak <= limit && best.a.mu >= 0) {
    /* the least recomputation that still fits: as few segments as can be
     * (the first ones: their activations live longest), by bisection */
    int lo = 0, hi = best.st.segments_recomputed;
    while (hi - lo > 1) {
      int mid = (lo + hi) / 2;
      t = (fit_trial){.a = {0, best.a.segment_bytes, mid, true}};
      if (graph_trial(r, g, &t)) return -1;
      fit->trials++;
      if (t.peak >= 0 && t.peak <= limit) {
        hi = mid;
        best = t;
      } else {
        lo = mid;
      }
    }
  }
  if (best.peak >= 0 && best.peak <= limit && best.a.mu >= 0) {
    /* then within them, mu as high as it can be, by bisection of its
     * logarithm (2^-24 .. 2^2 bytes a flop) */
    double lo = -24, hi = 2;
    for (int i = 0; i < 6; i++) {
      double m = (lo + hi) / 2;
      t = (fit_trial){.a = {exp2(m), best.a.segment_bytes, best.a.segments_recomputed, true}};
      if (graph_trial(r, g, &t)) return -1;
      fit->trials++;
      if (t.peak >= 0 && t.peak <= limit) {
        lo = m;
        if (t.st.flops < best.st.flops) best = t;
      } else {
        hi = m;
      }
    }
  }
done:
  *out = best.a;
  fit->peak = best.peak;
  fit->flops = best.st.flops;
  snprintf(fit->where, sizeof fit->where, "%s", best.where);
  return 0;
}
