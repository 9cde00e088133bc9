/* testsuite/cuda/fake_driver.c: a stand-in libcuda.so.1 for testing the
 * step runtime's CUDA path (runtime/rt_cuda.c) on machines without a GPU.
 * Device memory is host memory (calloc), copies are memcpy, and launches
 * are counted but run nothing: what a test can check is the runtime's
 * control flow (driver and module loading, the arena, uploads and
 * downloads, launches by name, profiling events, error reporting), not
 * numbers.  The environment picks the failures:
 *   FAKE_CUDA_CC=NN           the device's compute capability (default 90)
 *   FAKE_CUDA_FREE=BYTES      free device memory (default 80 GiB)
 *   FAKE_CUDA_FAIL_LAUNCH=N   the Nth launch (from 1) fails
 *   FAKE_CUDA_NO_BINARY=1     cuModuleLoadData refuses cubins (a cubin for
 *                             another GPU), accepts PTX
 *   FAKE_CUDA_SMEM_OPTIN=B    the dynamic shared memory a kernel may be opted
 *                             in to (default 232448, an H100's); a launch
 *                             asking for more than 48 KiB without that opt-in
 *                             fails
 *   FAKE_CUDA_LOG=FILE        appends one line per launch: the kernel name,
 *                             the threads of the grid and of a block, the
 *                             dynamic shared memory
 */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

/* the functions runtime/rt_cuda_api.h resolves, under their symbol names */
CUresult cuInit(unsigned flags);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(int *dev, int ordinal);
CUresult cuDeviceGetName(char *name, int len, int dev);
CUresult cuDeviceGetAttribute(int *v, int attr, int dev);
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev);
CUresult cuDevicePrimaryCtxRelease_v2(int dev);
CUresult cuCtxSetCurrent(void *ctx);
CUresult cuModuleLoadData(void **m, const void *image);
CUresult cuModuleUnload(void *m);
CUresult cuModuleGetFunction(void **f, void *m, const char *name);
CUresult cuFuncSetAttribute(void *f, int attr, int value);
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *s, void **params, void **extra);
CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s);
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s_, size_t n, void *s);
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s_, size_t n, void *s);
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *s);
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, void *s);
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void *s);
CUresult cuStreamCreate(void **s, unsigned flags);
CUresult cuStreamDestroy_v2(void *s);
CUresult cuStreamSynchronize(void *s);
CUresult cuEventCreate(void **e, unsigned flags);
CUresult cuEventRecord(void *e, void *s);
CUresult cuEventElapsedTime(float *ms, void *a, void *b);
CUresult cuEventDestroy_v2(void *e);
CUresult cuGetErrorName(CUresult r, const char **s);
CUresult cuGetErrorString(CUresult r, const char **s);

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : dflt;
}

static int ctx_token, stream_token;
static long launches;

CUresult cuInit(unsigned flags) { return flags ? 1 : 0; }
CUresult cuDeviceGetCount(int *count) {
  *count = 1;
  return 0;
}
CUresult cuDeviceGet(int *dev, int ordinal) {
  *dev = ordinal;
  return ordinal == 0 ? 0 : 101; /* CUDA_ERROR_INVALID_DEVICE */
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
  (void)dev;
  snprintf(name, (size_t)len, "Fake GPU");
  return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  (void)dev;
  long cc = env_long("FAKE_CUDA_CC", 90);
  if (attr == 75) *v = (int)(cc / 10);
  else if (attr == 76) *v = (int)(cc % 10);
  else return 1;
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  (void)dev;
  *ctx = &ctx_token;
  return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return dev ? 101 : 0; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == &ctx_token ? 0 : 201; }
CUresult cuModuleLoadData(void **m, const void *image) {
  const unsigned char *p = image;
  int elf = p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F';
  if (elf && env_long("FAKE_CUDA_NO_BINARY", 0)) return 209; /* CUDA_ERROR_NO_BINARY_FOR_GPU */
  if (!elf && !strstr((const char *)image, ".version")) return 200; /* CUDA_ERROR_INVALID_IMAGE */
  *m = malloc(1);
  return *m ? 0 : 2;
}
CUresult cuModuleUnload(void *m) {
  free(m);
  return 0;
}
/* The handle is the name, kept here: the launch log prints it. */
static char fn_names[4096][32];
static int nfn;
static long fn_optin[4096]; /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */

static long fn_index(const void *f) {
  long i = ((const char *)f - fn_names[0]) / (long)sizeof fn_names[0];
  return i >= 0 && i < nfn && f == fn_names[i] ? i : -1;
}

CUresult cuFuncSetAttribute(void *f, int attr, int value) {
  long i = fn_index(f);
  if (i < 0) return 400; /* CUDA_ERROR_INVALID_HANDLE */
  if (attr != 8 || value < 0 || value > env_long("FAKE_CUDA_SMEM_OPTIN", 232448)) return 1;
  fn_optin[i] = value;
  return 0;
}

CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  (void)m;
  if (strncmp(name, "nova_k", 6) || strlen(name) >= sizeof fn_names[0]) return 500; /* CUDA_ERROR_NOT_FOUND */
  for (int i = 0; i < nfn; i++)
    if (!strcmp(fn_names[i], name)) {
      *f = fn_names[i];
      return 0;
    }
  if (nfn == 4096) return 2;
  strcpy(fn_names[nfn], name);
  *f = fn_names[nfn++];
  return 0;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void *s, void **params, void **extra) {
  (void)extra;
  long fi = fn_index(f);
  if (s != &stream_token || !params || !gx || !gy || !gz || !bx || !by || !bz || (unsigned long)bx * by * bz > 1024 ||
      fi < 0 || (smem > 48 * 1024 && smem > fn_optin[fi]))
    return 1; /* CUDA_ERROR_INVALID_VALUE */
  launches++;
  const char *log = getenv("FAKE_CUDA_LOG");
  FILE *lf = log && *log ? fopen(log, "a") : NULL;
  if (lf) {
    fprintf(lf, "%s %u %u %u\n", (const char *)f, gx * gy * gz, bx * by * bz, smem);
    fclose(lf);
  }
  return launches == env_long("FAKE_CUDA_FAIL_LAUNCH", 0) ? 719 : 0; /* CUDA_ERROR_LAUNCH_FAILED */
}
CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
  *total_b = (size_t)80 << 30;
  *free_b = (size_t)env_long("FAKE_CUDA_FREE", (long)*total_b);
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  void *m = calloc(1, bytes);
  *p = (CUdeviceptr)(uintptr_t)m;
  return m ? 0 : 2; /* CUDA_ERROR_OUT_OF_MEMORY */
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  free((void *)(uintptr_t)p);
  return 0;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s) {
  memcpy((void *)(uintptr_t)d, h, n);
  return s == &stream_token ? 0 : 400;
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s) {
  memcpy(h, (const void *)(uintptr_t)d, n);
  return s == &stream_token ? 0 : 400;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s_, size_t n, void *s) {
  memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s_, n);
  return s == &stream_token ? 0 : 400;
}
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s_, size_t n, void *s) { return cuMemcpyDtoDAsync_v2(d, s_, n, s); }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *s) {
  memset((void *)(uintptr_t)d, v, n);
  return s == &stream_token ? 0 : 400;
}
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, void *s) {
  for (size_t i = 0; i < n; i++) ((unsigned short *)(uintptr_t)d)[i] = v;
  return s == &stream_token ? 0 : 400;
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void *s) {
  for (size_t i = 0; i < n; i++) ((unsigned *)(uintptr_t)d)[i] = v;
  return s == &stream_token ? 0 : 400;
}
CUresult cuStreamCreate(void **s, unsigned flags) {
  (void)flags;
  *s = &stream_token;
  return 0;
}
CUresult cuStreamDestroy_v2(void *s) { return s == &stream_token ? 0 : 400; }
CUresult cuStreamSynchronize(void *s) { return s == &stream_token ? 0 : 400; }
CUresult cuEventCreate(void **e, unsigned flags) {
  (void)flags;
  *e = malloc(1);
  return *e ? 0 : 2;
}
CUresult cuEventRecord(void *e, void *s) { return e && s == &stream_token ? 0 : 400; }
CUresult cuEventElapsedTime(float *ms, void *a, void *b) {
  *ms = 0.25f;
  return a && b ? 0 : 400;
}
CUresult cuEventDestroy_v2(void *e) {
  free(e);
  return 0;
}
CUresult cuGetErrorName(CUresult r, const char **s) {
  *s = r == 209 ? "CUDA_ERROR_NO_BINARY_FOR_GPU" : r == 719 ? "CUDA_ERROR_LAUNCH_FAILED"
       : r == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : r == 101 ? "CUDA_ERROR_INVALID_DEVICE" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
  *s = r == 719 ? "unspecified launch failure" : "fake driver error";
  return 0;
}
