/* novac_device.c: --device (which device model the configurator uses),
 * the device-memory check, and --explain-config.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../configurator/gemm.h"
#include "../configurator/kernel.h"
#include "novac_device.h"

static void known_list(char *list, size_t n) {
  const char *names[64];
  int k = cfg_device_list(names, 64);
  snprintf(list, n, "host, auto");
  for (int i = 0; i < k && i < 64; i++) snprintf(list + strlen(list), n - strlen(list), ", %s", names[i]);
}

bool nd_device_is_file(const char *dev) {
  return dev && strcmp(dev, "host") && strcmp(dev, "auto") && !cfg_device_find(dev) &&
         (strchr(dev, '/') || strstr(dev, ".json"));
}

int nd_device(nv_diag *d, bool cuda, const char *dev, cfg_device *out) {
  char err[512] = "", list[1024];
  if (!dev) dev = cuda ? "auto" : "host";
  if (!strcmp(dev, "host") || (!cuda && !strcmp(dev, "auto"))) {
    if (cuda) {
      nv_error_plain(d, "--device=host is the CPU; --target=cuda needs a GPU model (--device=NAME, FILE or auto)");
      return -1;
    }
    if (cfg_device_host(out, err, sizeof err)) {
      nv_error_plain(d, "--device=%s: %s", dev, err);
      return -1;
    }
    return 0;
  }
  if (!strcmp(dev, "auto")) { /* cuda: the GPU of this machine */
    if (cfg_device_auto_gpu(out, err, sizeof err)) {
      known_list(list, sizeof list);
      nv_error_plain(d, "--device=auto: %s; name the GPU to compile for with --device=NAME (known: %s) or a JSON device file",
                     err, list + strlen("host, auto, "));
      return -1;
    }
    return 0;
  }
  const cfg_device *known = cfg_device_find(dev);
  if (known) *out = *known;
  else if (nd_device_is_file(dev)) {
    if (cfg_device_load(dev, out, err, sizeof err)) {
      nv_error_plain(d, "--device=%s: %s", dev, err);
      return -1;
    }
  } else {
    known_list(list, sizeof list);
    nv_error_plain(d, "unknown device '%s'; known: %s (or a JSON device file)", dev, list);
    return -1;
  }
  if (out->kind == CFG_DEV_GPU && !cuda) {
    nv_error_plain(d, "--device=%s is a GPU model; the cpu target compiles for the host (use --target=cuda)", dev);
    return -1;
  }
  if (out->kind == CFG_DEV_CPU && cuda) {
    nv_error_plain(d, "--device=%s is a CPU model; --target=cuda needs a GPU model", dev);
    return -1;
  }
  return 0;
}

static double mib(double b) { return b / (1024.0 * 1024.0); }

int nd_check_memory(nv_diag *d, const cfg_device *dev, const nv_graph *g, const cg_gpu *gpu) {
  if (!dev->total_mem_bytes) return 0;
  double tensors = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const nv_node *x = g->nodes[i];
    if (x->op == NV_OP_INPUT || x->op == NV_OP_PARAM)
      tensors += (double)((fe_numel(x) * (int64_t)fe_dtype_size(x->dtype) + CG_GPU_ALIGN - 1) / CG_GPU_ALIGN * CG_GPU_ALIGN);
  }
  for (int i = 0; i < g->noutputs; i++) { /* an update computed in place shares its param's buffer */
    if (gpu->plan.inplace && i < gpu->plan.noutputs && gpu->plan.inplace[i]) continue;
    const nv_node *x = g->outputs[i].node;
    tensors += (double)((fe_numel(x) * (int64_t)fe_dtype_size(x->dtype) + CG_GPU_ALIGN - 1) / CG_GPU_ALIGN * CG_GPU_ALIGN);
  }
  double need = tensors + (double)gpu->scratch_bytes;
  if (need <= (double)dev->total_mem_bytes) return 0;
  nv_error_plain(d,
                 "the step needs %.1f MiB of device memory (tensors %.1f MiB + intermediates %.1f MiB) but %s has "
                 "%.1f MiB; use a smaller batch (--dim) or a larger device",
                 mib(need), mib(tensors), mib((double)gpu->scratch_bytes), dev->name, mib((double)dev->total_mem_bytes));
  return -1;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* M, N, K and batch of a matmul node: A[..., M, K] x B[..., K, N]. */
static void matmul_dims(const nv_node *x, int64_t *m, int64_t *n, int64_t *k, int64_t *batch) {
  const nv_node *a = x->in[0], *b = x->in[1];
  *m = a->rank >= 2 ? a->shape[a->rank - 2] : 1;
  *k = a->shape[a->rank - 1];
  *n = b->rank >= 2 ? b->shape[b->rank - 1] : 1;
  *batch = 1;
  for (int i = 0; i + 2 < x->rank; i++) *batch *= x->shape[i];
}

static void explain_matmuls(FILE *f, const cfg_device *dev, const nv_graph *g, bool cuda, int *count) {
  bool any = false;
  for (int i = 0; i < g->nnodes; i++) {
    const nv_node *x = g->nodes[i];
    if (x->op != NV_OP_MATMUL || x->nin != 2) continue;
    int64_t m, n, k, batch;
    matmul_dims(x, &m, &n, &k, &batch);
    int eb = (int)fe_dtype_size(x->dtype);
    if (!any)
      fprintf(f, "\nGEMM schedules derived for the matmuls (%s):\n",
              cuda ? "the configurator's full schedule; the matmul kernels above are the generated GEMMs, their "
                     "tiles cut to what the generator takes (at most 8 warps), with their own pipeline stages and split-K"
                   : "the register tile and cache blocks of the runtime's contraction kernel");
    any = true;
    (*count)++;
    char where[200] = "";
    if (x->loc.file) snprintf(where, sizeof where, " at %s:%d:%d", x->loc.file, x->loc.line, x->loc.col);
    fprintf(f, "  matmul %s%s: M=%lld N=%lld K=%lld batch=%lld\n", x->name ? x->name : "", where, (long long)m,
            (long long)n, (long long)k, (long long)batch);
    if (cuda) {
      cfg_gemm_schedule s = cfg_gemm(dev, m, n, k, eb == 2 ? 2 : 4, true);
      if (!s.ok) {
        fprintf(f, "    (no schedule: %s)\n", s.reason);
        continue;
      }
      fprintf(f, "    tile %dx%dx%d, %d warps (%dx%d), %s, %d stages, %lld B smem, split-K %d, %d blocks/SM (%s), "
                 "%lld waves at %.0f%%\n    decided by: %s\n",
              s.bm, s.bn, s.bk, s.warps, s.wm, s.wn, cfg_mma_name(s.mma), s.stages, (long long)s.smem_bytes, s.split_k,
              s.blocks_per_sm, s.occupancy_limit, (long long)s.waves, 100 * s.wave_efficiency, s.reason);
    } else {
      cfg_gemm_cpu_schedule s = cfg_gemm_cpu(dev, m, n, k, eb);
      if (!s.ok) {
        fprintf(f, "    (no schedule: %s)\n", s.reason);
        continue;
      }
      bool kernel = cg_cpu_f32_kernel(dev, 1) && m * n * k * batch >= CG_UK_MIN_MACS;
      fprintf(f, "    %s: register block %dx%d (%d lanes), kc=%lld mc=%lld nc=%lld, %d threads\n    decided by: %s\n",
              kernel ? "runtime kernel" : eb == 4 && !cg_cpu_f32_kernel(dev, 1) ? "inline loops (no AVX2 or AVX-512)"
                       : eb == 4 ? "inline loops (under 2^18 multiply-adds)" : "inline loops",
              s.mr, s.nr, s.lanes, (long long)s.kc, (long long)s.mc, (long long)s.nc, s.threads, s.reason);
    }
  }
}

/* The configurator's time for the whole step: every kernel's and every
 * matmul's schedule derived again, without printing. */
static double config_ms(const cfg_device *dev, const nv_graph *g, const cg_gpu *gpu) {
  double t0 = now_ms();
  volatile int64_t sink = 0;
  for (int i = 0; gpu && i < gpu->nk; i++) sink += cfg_pointwise(dev, gpu->k[i].n, 4, false).grid;
  for (int i = 0; i < g->nnodes; i++) {
    const nv_node *x = g->nodes[i];
    if (x->op != NV_OP_MATMUL || x->nin != 2) continue;
    int64_t m, n, k, batch;
    matmul_dims(x, &m, &n, &k, &batch);
    if (gpu) sink += cfg_gemm(dev, m, n, k, 4, true).bm;
    else sink += cfg_gemm_cpu(dev, m, n, k, 4).mr;
  }
  (void)sink;
  return now_ms() - t0;
}

void nd_explain(FILE *f, const cfg_device *dev, const nv_graph *g, const cg_gpu *gpu) {
  char sum[256];
  int count = 0;
  fprintf(f, "device: %s\n", cfg_device_summary(dev, sum, sizeof sum));
  if (gpu) {
    fprintf(f, "target: cuda (%s), %d kernels, %lld bytes of device scratch for intermediates\n\n", gpu->chip, gpu->nk,
            (long long)gpu->scratch_bytes);
    fprintf(f, "%-9s %-10s %-18s %10s %-16s %6s  %s\n", "kernel", "op", "iteration space", "points", "grid [x,y,z]",
            "block", "decided by [source]");
    for (int i = 0; i < gpu->nk; i++) {
      const cg_kernel *k = &gpu->k[i];
      char space[64] = "";
      for (int d = 0; d < k->rank; d++)
        snprintf(space + strlen(space), sizeof space - strlen(space), "%s%lld", d ? "x" : "", (long long)k->dims[d]);
      if (!k->rank) snprintf(space, sizeof space, "-");
      char grid[48];
      snprintf(grid, sizeof grid, "[%lld,%lld,%lld]", (long long)k->grid, (long long)(k->grid_y ? k->grid_y : 1),
               (long long)(k->grid_z ? k->grid_z : 1));
      fprintf(f, "%-9s %-10s %-18s %10lld %-16s %6lld  %s [%s]\n", k->name, k->op, space, (long long)k->n, grid,
              (long long)k->block, k->reason, k->loc);
      count++;
    }
    int rk = 0;
    for (int i = 0; i < gpu->nk; i++) rk += !strcmp(gpu->k[i].op, "row");
    if (rk)
      fprintf(f, "\nrow kernels: %d (reductions along rows with 32-bit accumulators and the ops around them, a group "
                 "of lanes per row combined by shuffles)\n", rk);
    if (gpu->split_rows)
      fprintf(f, "\nreductions split across threads along rows: %d of 128 or more whose accumulator is not 32-bit "
                 "(one thread per L-th element of a row, L from 16 to 32 dividing it: a warp reads consecutive "
                 "elements); a second kernel adds the partial results in a fixed order\n", gpu->split_rows);
    if (gpu->split_cols)
      fprintf(f, "\nreductions split across threads along columns: %d with fewer outputs than a quarter of the %lld "
                 "resident threads (%d SMs x %d; blocks of rows side by side, as many as fill them); a second kernel "
                 "adds the partial results in a fixed order\n",
              gpu->split_cols, (long long)dev->sm_count * dev->max_threads_per_sm, dev->sm_count,
              dev->max_threads_per_sm);
  } else {
    fprintf(f, "target: cpu, 1 function (the whole step): loops tiled and vectorized for the configurator's vector "
               "width, the large ones shared out between threads\n");
  }
  explain_matmuls(f, dev, g, gpu != NULL, &count);
  fprintf(f, "\nconfigurator: %d schedule%s in %.3f ms\n", count, count == 1 ? "" : "s", config_ms(dev, g, gpu));
}
