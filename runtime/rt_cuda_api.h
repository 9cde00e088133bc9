/* rt_cuda_api.h: the part of the CUDA driver API the runtime uses, declared
 * here so that the runtime builds without the CUDA toolkit's headers.  The
 * driver (libcuda.so.1) is opened with dlopen when a step compiled for
 * --target=cuda is opened: a step.so loads on any machine and says why it
 * cannot run where there is no GPU.  Names, types and values are those of
 * the toolkit's cuda.h (driver API 12.x/13.x); functions whose ABI changed
 * are resolved under their versioned symbol names (cuMemAlloc_v2, ...).
 */
#ifndef NOVA_RT_CUDA_API_H
#define NOVA_RT_CUDA_API_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_NO_BINARY_FOR_GPU 209
#define CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222

#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DEFAULT 0x0
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8

/* X(return, name, symbol, parameters) for every driver function used. */
#define RT_CUDA_FUNCS(X)                                                                            \
  X(CUresult, cuInit, "cuInit", (unsigned flags))                                                    \
  X(CUresult, cuDeviceGetCount, "cuDeviceGetCount", (int *count))                                    \
  X(CUresult, cuDeviceGet, "cuDeviceGet", (CUdevice * dev, int ordinal))                             \
  X(CUresult, cuDeviceGetName, "cuDeviceGetName", (char *name, int len, CUdevice dev))               \
  X(CUresult, cuDeviceGetAttribute, "cuDeviceGetAttribute", (int *v, int attr, CUdevice dev))        \
  X(CUresult, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext * ctx, CUdevice dev)) \
  X(CUresult, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice dev))             \
  X(CUresult, cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext ctx))                                   \
  X(CUresult, cuModuleLoadData, "cuModuleLoadData", (CUmodule * m, const void *image))               \
  X(CUresult, cuModuleUnload, "cuModuleUnload", (CUmodule m))                                        \
  X(CUresult, cuModuleGetFunction, "cuModuleGetFunction", (CUfunction * f, CUmodule m, const char *name)) \
  X(CUresult, cuFuncSetAttribute, "cuFuncSetAttribute", (CUfunction f, int attr, int value))           \
  X(CUresult, cuLaunchKernel, "cuLaunchKernel",                                                      \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,      \
     unsigned smem, CUstream s, void **params, void **extra))                                         \
  X(CUresult, cuMemGetInfo, "cuMemGetInfo_v2", (size_t * free_bytes, size_t * total_bytes))          \
  X(CUresult, cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr * p, size_t bytes))                          \
  X(CUresult, cuMemFree, "cuMemFree_v2", (CUdeviceptr p))                                            \
  X(CUresult, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", (CUdeviceptr d, const void *h, size_t n, CUstream s)) \
  X(CUresult, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", (void *h, CUdeviceptr d, size_t n, CUstream s)) \
  X(CUresult, cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", (CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s)) \
  X(CUresult, cuMemcpyAsync, "cuMemcpyAsync", (CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s)) \
  X(CUresult, cuMemsetD8Async, "cuMemsetD8Async", (CUdeviceptr d, unsigned char v, size_t n, CUstream s)) \
  X(CUresult, cuMemsetD16Async, "cuMemsetD16Async", (CUdeviceptr d, unsigned short v, size_t n, CUstream s)) \
  X(CUresult, cuMemsetD32Async, "cuMemsetD32Async", (CUdeviceptr d, unsigned v, size_t n, CUstream s)) \
  X(CUresult, cuStreamCreate, "cuStreamCreate", (CUstream * s, unsigned flags))                      \
  X(CUresult, cuStreamDestroy, "cuStreamDestroy_v2", (CUstream s))                                   \
  X(CUresult, cuStreamSynchronize, "cuStreamSynchronize", (CUstream s))                              \
  X(CUresult, cuEventCreate, "cuEventCreate", (CUevent * e, unsigned flags))                         \
  X(CUresult, cuEventRecord, "cuEventRecord", (CUevent e, CUstream s))                               \
  X(CUresult, cuEventElapsedTime, "cuEventElapsedTime", (float *ms, CUevent a, CUevent b))           \
  X(CUresult, cuEventDestroy, "cuEventDestroy_v2", (CUevent e))                                      \
  X(CUresult, cuGetErrorName, "cuGetErrorName", (CUresult r, const char **s))                        \
  X(CUresult, cuGetErrorString, "cuGetErrorString", (CUresult r, const char **s))

#endif
