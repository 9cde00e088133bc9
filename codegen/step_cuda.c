/* step_cuda.c: the parts of a --target=cuda step.so that the cpu target
 * does not have: ptxas, the descriptor's entry and kernel data, and the
 * manifest's kernel table.
 *
 * ptxas (the CUDA toolkit's assembler) is looked for in $NOVAC_PTXAS, then
 * on PATH, then in $CUDA_HOME/bin and /usr/local/cuda/bin.  Its -v report
 * gives each kernel's registers and shared memory for the manifest.  A
 * ptxas that takes --split-compile (CUDA 12.x and newer) assembles on
 * NOVAC_JOBS threads (nv_jobs).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../support/util.h"
#include "codegen.h"

/* The ptxas to use, written to OUT; 0, or -1 with a diagnostic. */
static int find_ptxas(nova_ctx *c, char *out, size_t n) {
  const char *env = getenv("NOVAC_PTXAS");
  if (env && *env) {
    if (access(env, X_OK)) {
      nv_error_plain(c->diag, "NOVAC_PTXAS=%s: %s", env, strerror(errno));
      return -1;
    }
    snprintf(out, n, "%s", env);
    return 0;
  }
  const char *path = getenv("PATH");
  char *copy = nv_xstrdup(path ? path : "");
  for (char *save = NULL, *d = copy ? strtok_r(copy, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save)) {
    snprintf(out, n, "%s/ptxas", *d ? d : ".");
    if (!access(out, X_OK)) {
      free(copy);
      return 0;
    }
  }
  free(copy);
  const char *home = getenv("CUDA_HOME");
  if (home && *home) {
    snprintf(out, n, "%s/bin/ptxas", home);
    if (!access(out, X_OK)) return 0;
  }
  snprintf(out, n, "/usr/local/cuda/bin/ptxas");
  if (!access(out, X_OK)) return 0;
  nv_error_plain(c->diag,
                 "ptxas not found: --target=cuda assembles its kernels with the CUDA toolkit's ptxas; install the "
                 "toolkit, put ptxas on PATH, or set NOVAC_PTXAS");
  return -1;
}

/* Reads "ptxas info : Function properties for nova_kI" / "Used R registers,
 * ... S bytes smem" lines of ptxas -v into the kernel table. */
static void read_ptxas_report(cg_gpu *gpu, const char *log) {
  cg_kernel *k = NULL;
  for (const char *p = log; p && *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
    const char *q = strstr(line, "Compiling entry function '");
    if (q) {
      q += strlen("Compiling entry function '");
      k = NULL;
      for (int i = 0; i < gpu->nk; i++) {
        size_t kl = strlen(gpu->k[i].name);
        if (!strncmp(q, gpu->k[i].name, kl) && q[kl] == '\'') k = &gpu->k[i];
      }
    } else if (k && (q = strstr(line, "Used "))) {
      int regs = 0;
      if (sscanf(q, "Used %d registers", &regs) == 1) k->regs = regs;
      const char *sm = strstr(q, "bytes smem");
      if (sm) {
        const char *b = sm;
        while (b > q && b[-1] == ' ') b--;
        while (b > q && (b[-1] >= '0' && b[-1] <= '9')) b--;
        k->smem = strtoll(b, NULL, 10);
      }
    }
    p = nl ? nl + 1 : NULL;
  }
}

/* Whether PTXAS takes --split-compile (CUDA 12.x and newer): its --help
 * names it. */
static bool ptxas_splits(nova_ctx *c, const char *dir, char *ptxas) {
  char *argv[] = {ptxas, "--help", NULL};
  if (cg_run_tool(c, dir, argv, false, "ptxas")) return false;
  char path[4200];
  snprintf(path, sizeof path, "%s/tool.log", dir);
  size_t len = 0;
  char *help = nv_read_file(path, &len, 1 << 20);
  bool yes = help && strstr(help, "--split-compile");
  free(help);
  return yes;
}

int cg_cuda_assemble(nova_ctx *c, const char *dir, cg_gpu *gpu, bool verbose) {
  char ptxas[4200], path[4200];
  snprintf(path, sizeof path, "%s/kernels.ptx", dir);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(gpu->ptx, 1, gpu->ptx_len, f) == gpu->ptx_len;
  if (f && fclose(f)) ok = 0;
  if (!ok) {
    nv_error_plain(c->diag, "cannot write %s: %s", path, strerror(errno));
    return -1;
  }
  snprintf(path, sizeof path, "%s/kernels.cubin", dir);
  if (gpu->nk == 0) { /* nothing to assemble: an empty cubin, the runtime loads nothing */
    f = fopen(path, "wb");
    return f && !fclose(f) ? 0 : -1;
  }
  if (find_ptxas(c, ptxas, sizeof ptxas)) return -1;
  char arch[32];
  snprintf(arch, sizeof arch, "-arch=%s", gpu->chip);
  /* the kernels assembled on as many threads as code generation's processes */
  char jobs[16];
  snprintf(jobs, sizeof jobs, "%d", nv_jobs());
  char *argv[] = {ptxas, arch, "-O3", "-v", "kernels.ptx", "-o", "kernels.cubin", NULL, NULL, NULL};
  if (nv_jobs() > 1 && gpu->nk > 1 && ptxas_splits(c, dir, ptxas)) argv[7] = "--split-compile", argv[8] = jobs;
  if (cg_run_tool(c, dir, argv, verbose, "ptxas")) return -1;
  snprintf(path, sizeof path, "%s/tool.log", dir);
  size_t len = 0;
  char *log = nv_read_file(path, &len, 16 << 20);
  read_ptxas_report(gpu, log);
  free(log);
  snprintf(path, sizeof path, "%s/kernels.cubin", dir);
  struct stat st;
  if (stat(path, &st)) {
    nv_error_plain(c->diag, "ptxas wrote no %s", path);
    return -1;
  }
  gpu->cubin_size = (int64_t)st.st_size;
  return 0;
}

void cg_cuda_desc_entry(nv_sbuf *b, const char *entry, int n, const int *rank, const int64_t *const *shape) {
  nv_sb_printf(b, "#include <stdint.h>\n/* the step's host code: a memref descriptor (allocated, aligned, offset,\n"
                  " * sizes, strides) for each argument */\nextern void %s(", entry);
  for (int i = 0; i < n; i++) {
    nv_sb_printf(b, "%svoid *, void *, int64_t", i ? ",\n  " : "");
    for (int k = 0; k < 2 * rank[i]; k++) nv_sb_printf(b, ", int64_t");
  }
  nv_sb_printf(b, ");\nstatic void entry(void **a) {\n  %s(", entry);
  for (int i = 0; i < n; i++) {
    nv_sb_printf(b, "%sa[%d], a[%d], 0", i ? ",\n    " : "", i, i);
    for (int k = 0; k < rank[i]; k++) nv_sb_printf(b, ", %lld", (long long)shape[i][k]);
    for (int k = 0; k < rank[i]; k++) {
      long long stride = 1;
      for (int j = k + 1; j < rank[i]; j++) stride *= shape[i][j];
      nv_sb_printf(b, ", %lld", stride);
    }
  }
  nv_sb_printf(b, ");\n}\n\n");
  nv_sb_printf(b, "__asm__(\".section .rodata\\n.balign 64\\n.globl nova_cubin\\n.hidden nova_cubin\\n"
                  "nova_cubin:\\n.incbin \\\"kernels.cubin\\\"\\n.balign 64\\n.globl nova_ptx\\n.hidden nova_ptx\\nnova_ptx:\\n"
                  ".incbin \\\"kernels.ptx\\\"\\n.byte 0\\n.previous\\n\");\n"
                  "extern const unsigned char nova_cubin[];\nextern const char nova_ptx[];\n\n");
}

void cg_cuda_desc_fields(nv_sbuf *b, const cg_gpu *gpu) {
  int sm = 0;
  sscanf(gpu->chip, "sm_%d", &sm);
  nv_sb_printf(b, ",\n  RT_TARGET_CUDA, %d, nova_cubin, %lld, nova_ptx, %zu, %lld", sm, (long long)gpu->cubin_size,
               gpu->ptx_len + 1, (long long)gpu->scratch_bytes);
}

void cg_cuda_manifest(cJSON *root, const cg_gpu *gpu) {
  cJSON *dev = cJSON_GetObjectItem(root, "device");
  if (dev) {
    cJSON_DeleteItemFromObject(dev, "cpu");
    cJSON_ReplaceItemInObject(dev, "name", cJSON_CreateString(gpu->dev ? gpu->dev->name : "?"));
    cJSON_AddStringToObject(dev, "arch", gpu->chip);
    if (gpu->dev) {
      cJSON_AddNumberToObject(dev, "sm_count", gpu->dev->sm_count);
      if (gpu->dev->total_mem_bytes) cJSON_AddNumberToObject(dev, "memory_bytes", (double)gpu->dev->total_mem_bytes);
    }
  }
  cJSON *mem = cJSON_GetObjectItem(root, "memory");
  if (mem) {
    if (!gpu->plan.planned) cJSON_ReplaceItemInObject(mem, "intermediates", cJSON_CreateString("scratch-arena"));
    cJSON_AddNumberToObject(mem, "scratch_bytes", (double)gpu->scratch_bytes);
  }
  cJSON *ks = cJSON_CreateArray();
  for (int i = 0; i < gpu->nk; i++) {
    const cg_kernel *k = &gpu->k[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", k->name);
    cJSON_AddStringToObject(e, "kind", !strcmp(k->op, "serial") ? "serial" : !strcmp(k->op, "row") ? "row" : "loop-nest");
    cJSON_AddStringToObject(e, "op", k->op);
    cJSON_AddStringToObject(e, "defined_at", k->loc);
    cJSON *it = cJSON_AddArrayToObject(e, "iteration_space");
    for (int d = 0; d < k->rank; d++) cJSON_AddItemToArray(it, cJSON_CreateNumber((double)k->dims[d]));
    cJSON *gr = cJSON_AddArrayToObject(e, "grid");
    cJSON_AddItemToArray(gr, cJSON_CreateNumber((double)k->grid));
    cJSON_AddItemToArray(gr, cJSON_CreateNumber(k->grid_y ? (double)k->grid_y : 1));
    cJSON_AddItemToArray(gr, cJSON_CreateNumber(k->grid_z ? (double)k->grid_z : 1));
    cJSON *bl = cJSON_AddArrayToObject(e, "block");
    cJSON_AddItemToArray(bl, cJSON_CreateNumber((double)k->block));
    cJSON_AddItemToArray(bl, cJSON_CreateNumber(1));
    cJSON_AddItemToArray(bl, cJSON_CreateNumber(1));
    cJSON_AddNumberToObject(e, "shared_memory", (double)(k->smem + k->dyn_smem));
    if (k->dyn_smem) cJSON_AddNumberToObject(e, "dynamic_shared_memory", (double)k->dyn_smem);
    if (k->regs) cJSON_AddNumberToObject(e, "registers", k->regs);
    cJSON_AddStringToObject(e, "schedule", k->reason);
    if (k->gemm) { /* what a tile search needs to make the GEMM again (bench/bench_gpu.py) */
      cJSON *g = cJSON_AddObjectToObject(e, "gemm");
      cJSON_AddNumberToObject(g, "m", (double)k->gemm_mnk[0]);
      cJSON_AddNumberToObject(g, "n", (double)k->gemm_mnk[1]);
      cJSON_AddNumberToObject(g, "k", (double)k->gemm_mnk[2]);
      cJSON_AddNumberToObject(g, "batch", k->grid_z ? (double)(k->grid_z / (k->gemm_split > 1 ? k->gemm_split : 1)) : 1);
      cJSON_AddBoolToObject(g, "a_transposed", k->gemm_ta);
      cJSON_AddBoolToObject(g, "b_transposed", k->gemm_tb);
      cJSON_AddStringToObject(g, "operands", k->gemm_dtype);
      cJSON_AddStringToObject(g, "c", k->gemm_overwrite ? "written" : "accumulated");
      cJSON_AddStringToObject(g, "instruction", k->tensor_core ? (strcmp(k->gemm_dtype, "f32") ? "mma.sync.m16n8k16"
                                                                                             : "mma.sync.m16n8k8")
                                                               : "fma");
      cJSON *t = cJSON_AddArrayToObject(g, "tile");
      for (int j = 0; j < 5; j++) cJSON_AddItemToArray(t, cJSON_CreateNumber(k->gemm_tile[j]));
      if (k->tensor_core) cJSON_AddNumberToObject(g, "stages", k->gemm_tile[5]);
      if (k->tensor_core) cJSON_AddNumberToObject(g, "split_k", k->gemm_split > 1 ? k->gemm_split : 1);
      if (k->tensor_core) cJSON_AddBoolToObject(g, "epilogue", k->gemm_epilogue);
    }
    cJSON_AddItemToArray(ks, e);
  }
  cJSON_ReplaceItemInObject(root, "kernels", ks);
  int gemms = 0, tcs = 0;
  for (int i = 0; i < gpu->nk; i++) gemms += gpu->k[i].gemm, tcs += gpu->k[i].tensor_core;
  cJSON_AddNumberToObject(root, "gemm_kernels", gemms);
  cJSON_AddNumberToObject(root, "tensor_core_kernels", tcs);
  cJSON *st = cJSON_CreateArray();
  cJSON *s0 = cJSON_CreateObject();
  cJSON_AddStringToObject(s0, "name", "step");
  cJSON_AddNumberToObject(s0, "kernels", gpu->nk);
  cJSON_AddItemToArray(st, s0);
  cJSON_ReplaceItemInObject(root, "streams", st);
}
