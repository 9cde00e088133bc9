/* testsuite/configurator/fake_cuda.c: a stand-in libcuda.so.1 for testing
 * cfg_device_auto_gpu on machines without a GPU.  run.sh builds it as
 * BUILD/fake_cuda/libcuda.so.1 and runs `test_schedules --fake-cuda` with
 * that directory first on LD_LIBRARY_PATH.  The environment variable
 * FAKE_CUDA picks the scenario, read on every call:
 *   h200      one NVIDIA H200 (the default)
 *   h100pcie  one NVIDIA H100 PCIe (114 SMs: not the built-in h100 model)
 *   future    one unknown sm_100 part, for the peak estimate
 *   two       an H200 and an L4
 *   nodevice  cuInit fails with CUDA_ERROR_NO_DEVICE
 *   zero      cuInit succeeds, no devices
 *   noattr    the driver refuses MULTIPROCESSOR_COUNT
 * Attribute values are what the CUDA driver reports for those boards (the
 * CUdevice_attribute numbers are those of cuda.h). */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cuInit(unsigned int flags);
int cuDeviceGetCount(int *count);
int cuDeviceGet(int *dev, int ordinal);
int cuDeviceGetName(char *name, int len, int dev);
int cuDeviceGetAttribute(int *v, int attrib, int dev);
int cuDeviceTotalMem_v2(size_t *bytes, int dev);
int cuGetErrorName(int e, const char **s);
int cuGetErrorString(int e, const char **s);

typedef struct fake_gpu {
    const char *name;
    size_t mem;
    int sm, tpb, tpsm, bpsm, regsm, regblk, smemsm, smemblk, optin, l2, ccmaj, ccmin, clock, mclock, bus;
} fake_gpu;

static const fake_gpu fake_h200 = {"NVIDIA H200", 150754820096ull, 132, 1024, 2048, 32, 65536, 65536,
                                   233472, 49152, 232448, 52428800, 9, 0, 1980000, 3201000, 6144};
static const fake_gpu fake_h100pcie = {"NVIDIA H100 PCIe", 85031714816ull, 114, 1024, 2048, 32, 65536, 65536,
                                       233472, 49152, 232448, 52428800, 9, 0, 1755000, 1593000, 5120};
static const fake_gpu fake_future = {"NVIDIA Future GPU", 193273528320ull, 148, 1024, 2048, 32, 65536, 65536,
                                     233472, 49152, 232448, 132120576, 10, 0, 1965000, 3996000, 8192};
static const fake_gpu fake_l4 = {"NVIDIA L4", 23580639232ull, 58, 1024, 1536, 24, 65536, 65536,
                                 102400, 49152, 101376, 50331648, 8, 9, 2040000, 6251000, 192};

static const char *fake_mode(void)
{
    const char *m = getenv("FAKE_CUDA");
    return m && m[0] ? m : "h200";
}

static int fake_count(void)
{
    const char *m = fake_mode();
    if (!strcmp(m, "zero")) return 0;
    if (!strcmp(m, "two")) return 2;
    return 1;
}

static const fake_gpu *fake_dev(int dev)
{
    const char *m = fake_mode();
    if (dev < 0 || dev >= fake_count()) return NULL;
    if (!strcmp(m, "h100pcie")) return &fake_h100pcie;
    if (!strcmp(m, "future")) return &fake_future;
    if (!strcmp(m, "two") && dev == 1) return &fake_l4;
    return &fake_h200;
}

int cuInit(unsigned int flags)
{
    if (flags != 0) return 1; /* CUDA_ERROR_INVALID_VALUE */
    return strcmp(fake_mode(), "nodevice") == 0 ? 100 : 0;
}

int cuDeviceGetCount(int *count)
{
    *count = fake_count();
    return 0;
}

int cuDeviceGet(int *dev, int ordinal)
{
    if (!fake_dev(ordinal)) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}

int cuDeviceGetName(char *name, int len, int dev)
{
    const fake_gpu *g = fake_dev(dev);
    if (!g) return 101;
    snprintf(name, (size_t)len, "%s", g->name);
    return 0;
}

int cuDeviceGetAttribute(int *v, int attrib, int dev)
{
    const fake_gpu *g = fake_dev(dev);
    if (!g) return 101;
    if (attrib == 16 && strcmp(fake_mode(), "noattr") == 0) return 1;
    switch (attrib) {
    case 1: *v = g->tpb; break;
    case 8: *v = g->smemblk; break;
    case 12: *v = g->regblk; break;
    case 13: *v = g->clock; break;
    case 16: *v = g->sm; break;
    case 36: *v = g->mclock; break;
    case 37: *v = g->bus; break;
    case 38: *v = g->l2; break;
    case 39: *v = g->tpsm; break;
    case 75: *v = g->ccmaj; break;
    case 76: *v = g->ccmin; break;
    case 81: *v = g->smemsm; break;
    case 82: *v = g->regsm; break;
    case 97: *v = g->optin; break;
    case 106: *v = g->bpsm; break;
    default: return 1;
    }
    return 0;
}

int cuDeviceTotalMem_v2(size_t *bytes, int dev)
{
    const fake_gpu *g = fake_dev(dev);
    if (!g) return 101;
    *bytes = g->mem;
    return 0;
}

int cuGetErrorName(int e, const char **s)
{
    switch (e) {
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    default: *s = NULL; return 1;
    }
}

int cuGetErrorString(int e, const char **s)
{
    switch (e) {
    case 1: *s = "invalid argument"; return 0;
    case 100: *s = "no CUDA-capable device is detected"; return 0;
    case 101: *s = "invalid device ordinal"; return 0;
    default: *s = NULL; return 1;
    }
}
