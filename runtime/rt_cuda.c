/* rt_cuda.c: running a step compiled for --target=cuda, over the CUDA
 * driver API (opened with dlopen, see rt_cuda_api.h).
 *
 * Once per process (per step.so): the driver, the device (ordinal 0, or
 * $NOVA_CUDA_DEVICE), its primary context and the step's one module: the
 * cubin ptxas made at compile time, or, when the driver rejects it (another
 * architecture), the PTX it was assembled from, compiled by the driver.
 * Per nova_step: one stream, two events, and one device allocation (the
 * arena) holding every tensor of the step and, after them, the scratch space
 * the compiled code takes intermediates from (mgpuMemAlloc below bumps a
 * pointer; the whole scratch space is reused by the next run).
 *
 * The host copy of each tensor (nova_step.buffers) stays the value the ABI
 * shows: bind() marks the device copy stale (uploaded before the next run),
 * run() marks what the step wrote as newer on the device, and get() copies
 * a tensor back only when its host copy is stale.
 *
 * The compiled host code calls the mgpu* functions below (the names the
 * upstream gpu-to-llvm lowering uses) while rt_cuda_run has made the step
 * current in this thread.  Every driver call's status is checked; the first
 * failure is recorded and reported by run() as NOVA_ERR_DEVICE.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_cuda_api.h"
#include "rt_dtype.h"
#include "rt_step.h"

#define RT_CUDA_ALIGN 256 /* codegen's CG_GPU_ALIGN */

/* ---- the driver, once per process --------------------------------------- */

static struct {
  pthread_mutex_t mu;
  bool tried, ok;
  char err[RT_ERROR_LEN];
  void *lib;
#define X(ret, name, sym, params) ret(*name) params;
  RT_CUDA_FUNCS(X)
#undef X
  CUdevice dev;
  CUcontext ctx;
  char dev_name[128];
  int cc;                 /* device compute capability, e.g. 90 */
  CUmodule mod;
  const char *mod_from;   /* "cubin" or "ptx" */
  struct {
    const char *name;
    CUfunction f;
  } fn[4096];
  int nfn;
} D = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *cu_name(CUresult r) {
  const char *s = NULL;
  if (D.cuGetErrorName && D.cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
  return "CUDA_ERROR_UNKNOWN";
}

static const char *cu_text(CUresult r) {
  const char *s = NULL;
  if (D.cuGetErrorString && D.cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "";
}

/* Opens the driver, the device and the module for GRAPH; D.err on failure.
 * Called with D.mu held. */
static bool driver_open(const rt_graph *g) {
  if (D.tried) return D.ok;
  D.tried = true;
  D.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!D.lib) {
    snprintf(D.err, sizeof D.err,
             "this step was compiled for --target=cuda (sm_%d) and needs the CUDA driver, which is not on this "
             "machine (%s)", (int)g->sm, dlerror());
    return false;
  }
#define X(ret, name, sym, params)                                                                  \
  if (!(*(void **)&D.name = dlsym(D.lib, sym))) {                                                 \
    snprintf(D.err, sizeof D.err, "the CUDA driver (libcuda.so.1) lacks %s: it is too old", sym); \
    return false;                                                                                 \
  }
  RT_CUDA_FUNCS(X)
#undef X
  CUresult r = D.cuInit(0);
  if (r) {
    snprintf(D.err, sizeof D.err, "cuInit failed: %s (%s)", cu_name(r), cu_text(r));
    return false;
  }
  int count = 0, ordinal = 0;
  if ((r = D.cuDeviceGetCount(&count)) || count < 1) {
    snprintf(D.err, sizeof D.err, "no CUDA device%s%s", r ? ": " : "", r ? cu_name(r) : "");
    return false;
  }
  const char *env = getenv("NOVA_CUDA_DEVICE");
  if (env && *env) {
    char *end;
    long v = strtol(env, &end, 10);
    if (*end || v < 0 || v >= count) {
      snprintf(D.err, sizeof D.err, "NOVA_CUDA_DEVICE=%s: this machine has %d CUDA device%s (0..%d)", env, count,
               count == 1 ? "" : "s", count - 1);
      return false;
    }
    ordinal = (int)v;
  }
  int major = 0, minor = 0;
  if ((r = D.cuDeviceGet(&D.dev, ordinal)) ||
      (r = D.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, D.dev)) ||
      (r = D.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, D.dev))) {
    snprintf(D.err, sizeof D.err, "CUDA device %d: %s (%s)", ordinal, cu_name(r), cu_text(r));
    return false;
  }
  if (D.cuDeviceGetName(D.dev_name, sizeof D.dev_name, D.dev)) snprintf(D.dev_name, sizeof D.dev_name, "device %d", ordinal);
  D.cc = major * 10 + minor;
  if (D.cc < g->sm) {
    snprintf(D.err, sizeof D.err,
             "this step was compiled for sm_%d; CUDA device %d (%s) is sm_%d: compile it with a --device of this "
             "GPU (--device=auto on this machine)", (int)g->sm, ordinal, D.dev_name, D.cc);
    return false;
  }
  if ((r = D.cuDevicePrimaryCtxRetain(&D.ctx, D.dev)) || (r = D.cuCtxSetCurrent(D.ctx))) {
    snprintf(D.err, sizeof D.err, "cannot create a CUDA context on %s: %s (%s)", D.dev_name, cu_name(r), cu_text(r));
    return false;
  }
  D.mod_from = "cubin";
  if (!g->ptx[0]) { /* a step without kernels */
    D.ok = true;
    return true;
  }
  r = g->cubin_size ? D.cuModuleLoadData(&D.mod, g->cubin) : CUDA_ERROR_NO_BINARY_FOR_GPU;
  if (r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_IMAGE) {
    D.mod_from = "ptx";
    r = D.cuModuleLoadData(&D.mod, g->ptx);
  }
  if (r) {
    snprintf(D.err, sizeof D.err, "loading the step's kernels (%s for sm_%d) on %s (sm_%d) failed: %s (%s)", D.mod_from,
             (int)g->sm, D.dev_name, D.cc, cu_name(r), cu_text(r));
    return false;
  }
  D.ok = true;
  return true;
}

/* When the step.so is unloaded: its module, and its hold on the primary
 * context (errors ignored: at process exit the driver may be gone first). */
__attribute__((destructor)) static void driver_close(void) {
  if (!D.ok) return;
  if (D.mod && !D.cuCtxSetCurrent(D.ctx)) D.cuModuleUnload(D.mod);
  D.cuDevicePrimaryCtxRelease(D.dev);
  D.ok = false;
}

/* ---- one step ------------------------------------------------------------ */

struct rt_cuda {
  CUstream stream;
  CUevent ev[2];
  CUdeviceptr arena;
  size_t arena_size, scratch_base, scratch_size, scratch_used, scratch_planned;
  CUdeviceptr *dptr;          /* [ntensors] */
  void **dargs;               /* [nargs] entry arguments: device pointers */
  unsigned char *dev_stale;   /* [ntensors] the host copy is newer */
  unsigned char *host_stale;  /* [ntensors] the device copy is newer */
  CUresult failed;            /* first failure of this run, with the message in err */
  int profiling;
  struct {
    const char *name;
    CUevent ev[2];
    double ms;
  } *launch;                  /* profiling: one entry per launch of the run */
  int nlaunch, launch_cap;
  char err[RT_ERROR_LEN];
  float last_ms;
};

static __thread struct rt_cuda *rt_cur; /* the step whose entry runs in this thread */

static void cu_fail(struct rt_cuda *cu, CUresult r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void cu_fail(struct rt_cuda *cu, CUresult r, const char *fmt, ...) {
  if (!cu || cu->failed) return;
  cu->failed = r ? r : -1;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cu->err, sizeof cu->err, fmt, ap);
  va_end(ap);
  if (r && n > 0 && (size_t)n < sizeof cu->err)
    snprintf(cu->err + n, sizeof cu->err - (size_t)n, ": %s (%s)", cu_name(r), cu_text(r));
}

static size_t align_up(size_t n) { return (n + RT_CUDA_ALIGN - 1) / RT_CUDA_ALIGN * RT_CUDA_ALIGN; }

static bool is_input_role(int role) {
  return role == NOVA_ROLE_INPUT || role == NOVA_ROLE_LABEL || role == NOVA_ROLE_PARAM || role == NOVA_ROLE_OPT_STATE ||
         role == NOVA_ROLE_BUFFER;
}

nova_status rt_cuda_open(nova_step *s) {
  const rt_graph *g = s->graph;
  pthread_mutex_lock(&D.mu);
  bool ok = driver_open(g);
  pthread_mutex_unlock(&D.mu);
  if (!ok) return rt_fail(s, NOVA_ERR_DEVICE, "%s", D.err);
  struct rt_cuda *cu = calloc(1, sizeof *cu);
  if (!cu) return NOVA_ERR_NO_MEMORY;
  s->cuda = cu;
  size_t nt = (size_t)g->ntensors + 1;
  cu->dptr = calloc(nt, sizeof *cu->dptr);
  cu->dargs = calloc((size_t)g->nargs + 2, sizeof *cu->dargs);
  cu->dev_stale = calloc(nt, 1);
  cu->host_stale = calloc(nt, 1);
  if (!cu->dptr || !cu->dargs || !cu->dev_stale || !cu->host_stale) return NOVA_ERR_NO_MEMORY;
  size_t off = 0, tensors;
  for (int i = 0; i < g->ntensors; i++)
    if (!g->tensors[i].inplace) off += align_up(s->nbytes[i] ? s->nbytes[i] : 1);
  tensors = off;
  cu->scratch_base = off;
  cu->scratch_size = (size_t)g->scratch_bytes;
  cu->arena_size = off + cu->scratch_size;
  CUresult r = D.cuCtxSetCurrent(D.ctx);
  size_t free_b = 0, total_b = 0;
  if (!r) r = D.cuMemGetInfo(&free_b, &total_b);
  if (r) return rt_fail(s, NOVA_ERR_DEVICE, "CUDA device %s: %s (%s)", D.dev_name, cu_name(r), cu_text(r));
  if (cu->arena_size > free_b)
    return rt_fail(s, NOVA_ERR_DEVICE,
                   "the step needs %.1f MiB of device memory (tensors %.1f MiB + scratch %.1f MiB); %s has %.1f MiB "
                   "free of %.1f MiB", cu->arena_size / 1048576.0, tensors / 1048576.0, cu->scratch_size / 1048576.0,
                   D.dev_name, free_b / 1048576.0, total_b / 1048576.0);
  if ((r = D.cuMemAlloc(&cu->arena, cu->arena_size ? cu->arena_size : RT_CUDA_ALIGN)))
    return rt_fail(s, NOVA_ERR_DEVICE, "allocating %.1f MiB on %s: %s (%s)",
                   cu->arena_size / 1048576.0, D.dev_name, cu_name(r), cu_text(r));
  if ((r = D.cuStreamCreate(&cu->stream, CU_STREAM_NON_BLOCKING)) || (r = D.cuEventCreate(&cu->ev[0], CU_EVENT_DEFAULT)) ||
      (r = D.cuEventCreate(&cu->ev[1], CU_EVENT_DEFAULT)))
    return rt_fail(s, NOVA_ERR_DEVICE, "creating a CUDA stream on %s: %s (%s)", D.dev_name, cu_name(r), cu_text(r));
  off = 0;
  for (int i = 0; i < g->ntensors; i++) {
    if (g->tensors[i].inplace) continue; /* below: its param's */
    cu->dptr[i] = cu->arena + off;
    off += align_up(s->nbytes[i] ? s->nbytes[i] : 1);
    cu->dev_stale[i] = is_input_role(g->tensors[i].role); /* initial values go up before the first run */
  }
  for (int i = 0; i < g->ntensors; i++)
    if (g->tensors[i].inplace) cu->dptr[i] = cu->dptr[g->tensors[i].updates];
  for (int a = 0; a < g->nargs; a++) cu->dargs[a] = (void *)(uintptr_t)cu->dptr[g->arg_tensor[a]];
  /* the planned intermediates start the scratch space; gpu.alloc takes the rest */
  cu->dargs[g->nargs] = (void *)(uintptr_t)(cu->arena + cu->scratch_base);
  cu->scratch_planned = (g->arena_bytes + RT_CUDA_ALIGN - 1) / RT_CUDA_ALIGN * RT_CUDA_ALIGN;
  cu->last_ms = -1;
  return NOVA_OK;
}

void rt_cuda_close(nova_step *s) {
  struct rt_cuda *cu = s->cuda;
  if (!cu) return;
  if (D.ok && !D.cuCtxSetCurrent(D.ctx)) {
    if (cu->stream) D.cuStreamSynchronize(cu->stream);
    if (cu->arena) D.cuMemFree(cu->arena);
    for (int e = 0; e < 2; e++)
      if (cu->ev[e]) D.cuEventDestroy(cu->ev[e]);
    if (cu->stream) D.cuStreamDestroy(cu->stream);
  }
  for (int i = 0; i < cu->launch_cap; i++)
    for (int e = 0; e < 2; e++)
      if (cu->launch[i].ev[e]) D.cuEventDestroy(cu->launch[i].ev[e]);
  free(cu->launch);
  free(cu->dptr);
  free(cu->dargs);
  free(cu->dev_stale);
  free(cu->host_stale);
  free(cu);
  s->cuda = NULL;
}

void rt_cuda_bound(nova_step *s, int i) {
  s->cuda->dev_stale[i] = 1;
  s->cuda->host_stale[i] = 0;
}

static nova_status run_failed(nova_step *s, struct rt_cuda *cu) {
  /* let queued work finish (or fail) before the buffers may be reused */
  D.cuStreamSynchronize(cu->stream);
  /* what the failed run wrote is not a result: keep the host copies */
  for (int i = 0; i < s->graph->ntensors; i++) cu->host_stale[i] = 0;
  return rt_fail(s, NOVA_ERR_DEVICE, "%s", cu->err);
}

nova_status rt_cuda_run(nova_step *s) {
  const rt_graph *g = s->graph;
  struct rt_cuda *cu = s->cuda;
  cu->failed = 0;
  cu->err[0] = 0;
  cu->scratch_used = cu->scratch_planned;
  cu->nlaunch = 0;
  CUresult r = D.cuCtxSetCurrent(D.ctx);
  if (r) cu_fail(cu, r, "making the CUDA context current");
  for (int i = 0; i < g->ntensors && !cu->failed; i++)
    if (cu->dev_stale[i]) {
      if ((r = D.cuMemcpyHtoDAsync(cu->dptr[i], s->buffers[i], s->nbytes[i], cu->stream)))
        cu_fail(cu, r, "copying '%s' to the device", g->tensors[i].name);
      else cu->dev_stale[i] = 0;
    }
  if (!cu->failed && (r = D.cuEventRecord(cu->ev[0], cu->stream))) cu_fail(cu, r, "recording an event");
  if (!cu->failed) {
    rt_cur = cu;
    g->entry(cu->dargs);
    rt_cur = NULL;
  }
  if (!cu->failed && (r = D.cuEventRecord(cu->ev[1], cu->stream))) cu_fail(cu, r, "recording an event");
  /* a training step's new parameters and optimizer state replace the old */
  for (int i = 0; i < g->ntensors && !cu->failed; i++) {
    int u = g->tensors[i].updates;
    if (u >= 0 && !g->tensors[i].inplace && (r = D.cuMemcpyDtoDAsync(cu->dptr[u], cu->dptr[i], s->nbytes[i], cu->stream)))
      cu_fail(cu, r, "updating '%s'", g->tensors[u].name);
  }
  if (!cu->failed && (r = D.cuStreamSynchronize(cu->stream))) cu_fail(cu, r, "running the step on %s", D.dev_name);
  if (cu->failed) return run_failed(s, cu);
  float ms = -1;
  if (!D.cuEventElapsedTime(&ms, cu->ev[0], cu->ev[1])) cu->last_ms = ms;
  for (int i = 0; i < cu->nlaunch; i++) {
    float k = -1;
    cu->launch[i].ms = D.cuEventElapsedTime(&k, cu->launch[i].ev[0], cu->launch[i].ev[1]) ? -1 : k;
  }
  for (int i = 0; i < g->ntensors; i++) {
    const rt_tensor_desc *t = &g->tensors[i];
    if (!is_input_role(t->role)) cu->host_stale[i] = 1;
    if (t->updates >= 0) cu->host_stale[t->updates] = 1;
  }
  return NOVA_OK;
}

nova_status rt_cuda_fetch(nova_step *s, int i) {
  struct rt_cuda *cu = s->cuda;
  if (!cu->host_stale[i]) return NOVA_OK;
  CUresult r = D.cuCtxSetCurrent(D.ctx);
  if (!r) r = D.cuMemcpyDtoHAsync(s->buffers[i], cu->dptr[i], s->nbytes[i], cu->stream);
  if (!r) r = D.cuStreamSynchronize(cu->stream);
  if (r)
    return rt_fail(s, NOVA_ERR_DEVICE, "copying '%s' from the device: %s (%s)", s->graph->tensors[i].name, cu_name(r),
                   cu_text(r));
  cu->host_stale[i] = 0;
  return NOVA_OK;
}

double rt_cuda_last_ms(const nova_step *s) { return s->cuda ? s->cuda->last_ms : -1; }

nova_status rt_cuda_set_profiling(nova_step *s, int on) {
  s->cuda->profiling = on != 0;
  s->cuda->nlaunch = 0;
  return NOVA_OK;
}

int rt_cuda_num_launches(const nova_step *s) { return s->cuda->nlaunch; }

nova_status rt_cuda_launch(const nova_step *s, int i, const char **kernel, double *ms) {
  *kernel = s->cuda->launch[i].name;
  *ms = s->cuda->launch[i].ms;
  return NOVA_OK;
}

/* The event pair of the next launch (profiling), or NULL when none can be
 * had (the launch then goes unrecorded, the run does not fail for it). */
static CUevent *next_launch_events(struct rt_cuda *cu, const char *name) {
  if (cu->nlaunch == cu->launch_cap) {
    int cap = cu->launch_cap ? 2 * cu->launch_cap : 64;
    void *p = realloc(cu->launch, (size_t)cap * sizeof *cu->launch);
    if (!p) return NULL;
    cu->launch = p;
    memset(cu->launch + cu->launch_cap, 0, (size_t)(cap - cu->launch_cap) * sizeof *cu->launch);
    cu->launch_cap = cap;
  }
  CUevent *ev = cu->launch[cu->nlaunch].ev;
  for (int e = 0; e < 2; e++)
    if (!ev[e] && D.cuEventCreate(&ev[e], CU_EVENT_DEFAULT)) return NULL;
  cu->launch[cu->nlaunch].name = name;
  cu->launch[cu->nlaunch++].ms = -1;
  return ev;
}

/* ---- what the compiled host code calls ----------------------------------- */

/* Their declarations: the signatures the gpu-to-llvm lowering calls. */
void *mgpuModuleLoad(void *data, size_t size);
void *mgpuModuleLoadJIT(void *data, int opt_level);
void mgpuModuleUnload(void *module);
CUfunction mgpuModuleGetFunction(void *module, const char *name);
void mgpuLaunchKernel(CUfunction f, intptr_t gx, intptr_t gy, intptr_t gz, intptr_t bx, intptr_t by, intptr_t bz,
                      int32_t smem, void *stream, void **params, void **extra, size_t nparams);
void *mgpuStreamCreate(void);
void mgpuStreamDestroy(void *stream);
void mgpuStreamSynchronize(void *stream);
void *mgpuMemAlloc(uint64_t size, void *stream, bool host_shared);
void mgpuMemFree(void *ptr, void *stream);
void mgpuMemcpy(void *dst, void *src, size_t size, void *stream);
void mgpuMemset32(void *dst, unsigned value, size_t count, void *stream);
void mgpuMemset16(void *dst, unsigned short value, size_t count, void *stream);
void mgpuSetDefaultDevice(int32_t device);

/* The module is the step's, loaded at nova_step_open; the one the code
 * passes (the PTX embedded by the lowering) names it only. */
static char rt_module_token;

void *mgpuModuleLoad(void *data, size_t size) {
  (void)data, (void)size;
  return &rt_module_token;
}

void *mgpuModuleLoadJIT(void *data, int opt_level) {
  (void)data, (void)opt_level;
  return &rt_module_token;
}

void mgpuModuleUnload(void *module) { (void)module; }

/* Kernel handles by name: open addressing on the name's address (each
 * kernel name is one constant string of the step), names compared on
 * collision. */
CUfunction mgpuModuleGetFunction(void *module, const char *name) {
  (void)module;
  const size_t cap = sizeof D.fn / sizeof D.fn[0];
  size_t h = (size_t)(((uintptr_t)name >> 3) * 0x9E3779B97F4A7C15ull % cap);
  CUfunction f = NULL;
  pthread_mutex_lock(&D.mu);
  for (size_t probe = 0; probe < cap; probe++, h = (h + 1) % cap) {
    if (!D.fn[h].name) break;
    if (D.fn[h].name == name || !strcmp(D.fn[h].name, name)) {
      f = D.fn[h].f;
      break;
    }
  }
  if (!f && D.ok) {
    CUresult r = D.cuModuleGetFunction(&f, D.mod, name);
    if (r) {
      f = NULL;
      cu_fail(rt_cur, r, "kernel %s is not in the step's module", name);
    } else if (!D.fn[h].name && D.nfn < (int)cap - 1) {
      D.fn[h].name = name;
      D.fn[h].f = f;
      D.nfn++;
    }
  }
  pthread_mutex_unlock(&D.mu);
  return f;
}

static const char *fn_name(CUfunction f) {
  for (size_t i = 0; i < sizeof D.fn / sizeof D.fn[0]; i++)
    if (D.fn[i].name && D.fn[i].f == f) return D.fn[i].name;
  return "?";
}

void mgpuLaunchKernel(CUfunction f, intptr_t gx, intptr_t gy, intptr_t gz, intptr_t bx, intptr_t by, intptr_t bz,
                      int32_t smem, void *stream, void **params, void **extra, size_t nparams) {
  (void)stream, (void)nparams;
  struct rt_cuda *cu = rt_cur;
  if (!cu || cu->failed || !f) return;
  /* past 48 KiB of dynamic shared memory (a GEMM's pipeline stages) a
   * kernel must be opted in, up to the device's limit */
  CUresult r;
  if (smem > 48 * 1024 && (r = D.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))) {
    cu_fail(cu, r, "kernel %s needs %d bytes of shared memory a block, more than this GPU allows (compile for it: "
            "--device=auto)", fn_name(f), (int)smem);
    return;
  }
  CUevent *ev = cu->profiling ? next_launch_events(cu, fn_name(f)) : NULL;
  if (ev) D.cuEventRecord(ev[0], cu->stream);
  r = D.cuLaunchKernel(f, (unsigned)gx, (unsigned)gy, (unsigned)gz, (unsigned)bx, (unsigned)by,
                                (unsigned)bz, (unsigned)smem, cu->stream, params, extra);
  if (ev) D.cuEventRecord(ev[1], cu->stream);
  if (r)
    cu_fail(cu, r, "launching kernel %s (grid %ld, block %ld)", fn_name(f), (long)(gx * gy * gz), (long)(bx * by * bz));
}

void *mgpuStreamCreate(void) { return rt_cur ? (void *)rt_cur->stream : NULL; }
void mgpuStreamDestroy(void *stream) { (void)stream; }

/* The compiled code synchronizes after each launch; all of a step's work is
 * in order on its one stream and nothing reads device memory on the host
 * during the step, so rt_cuda_run synchronizes once, at the end. */
void mgpuStreamSynchronize(void *stream) { (void)stream; }

void *mgpuMemAlloc(uint64_t size, void *stream, bool host_shared) {
  (void)stream, (void)host_shared;
  struct rt_cuda *cu = rt_cur;
  if (!cu || cu->failed) return NULL;
  size_t n = align_up(size ? (size_t)size : 1);
  if (cu->scratch_used + n > cu->scratch_size) {
    cu_fail(cu, 0, "internal: the step's scratch space (%zu bytes) is exhausted", cu->scratch_size);
    return NULL;
  }
  void *p = (void *)(uintptr_t)(cu->arena + cu->scratch_base + cu->scratch_used);
  cu->scratch_used += n;
  return p;
}

void mgpuMemFree(void *ptr, void *stream) { (void)ptr, (void)stream; }

void mgpuMemcpy(void *dst, void *src, size_t size, void *stream) {
  (void)stream;
  struct rt_cuda *cu = rt_cur;
  if (!cu || cu->failed) return;
  CUresult r = D.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, size, cu->stream);
  if (r) cu_fail(cu, r, "a device copy of %zu bytes", size);
}

void mgpuMemset32(void *dst, unsigned value, size_t count, void *stream) {
  (void)stream;
  struct rt_cuda *cu = rt_cur;
  if (!cu || cu->failed) return;
  CUresult r = D.cuMemsetD32Async((CUdeviceptr)(uintptr_t)dst, value, count, cu->stream);
  if (r) cu_fail(cu, r, "a device memset");
}

void mgpuMemset16(void *dst, unsigned short value, size_t count, void *stream) {
  (void)stream;
  struct rt_cuda *cu = rt_cur;
  if (!cu || cu->failed) return;
  CUresult r = D.cuMemsetD16Async((CUdeviceptr)(uintptr_t)dst, value, count, cu->stream);
  if (r) cu_fail(cu, r, "a device memset");
}

void mgpuSetDefaultDevice(int32_t device) { (void)device; }
