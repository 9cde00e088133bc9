/* configurator/device.h: the limits of a target device, as the analytic
 * configurator needs them.  A device is either a built-in table entry
 * (cfg_device_find), the host CPU (cfg_device_host), the GPU the CUDA driver
 * reports (cfg_device_auto_gpu), or a JSON file (cfg_device_load).  Field
 * names in the JSON file are the member names below.
 */
#ifndef NOVA_CFG_DEVICE_H
#define NOVA_CFG_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum cfg_device_kind { CFG_DEV_GPU = 0, CFG_DEV_CPU = 1 } cfg_device_kind;

typedef struct cfg_device {
    char name[64];
    cfg_device_kind kind;

    /* GPU limits (zero for a CPU). */
    int sm_count;
    int max_threads_per_block;
    int max_threads_per_sm;
    int max_blocks_per_sm;       /* resident thread blocks per SM */
    int regs_per_sm;             /* 32-bit registers */
    int max_regs_per_thread;
    int64_t smem_per_sm;         /* bytes, maximum carve-out */
    int64_t smem_per_block;      /* bytes, static limit (48 KiB) */
    int64_t smem_per_block_optin;/* bytes, dynamic opt-in limit */
    int cc_major, cc_minor;      /* compute capability */
    bool has_mma_sync_f16, has_mma_sync_bf16, has_mma_sync_tf32, has_wgmma;
    int64_t total_mem_bytes;     /* device memory, bytes; 0 = unknown (optional in JSON) */

    /* Shared by both kinds. */
    int64_t l2_bytes;            /* GPU: device L2; CPU: per-core L2 */
    double mem_bw_gbs;           /* DRAM bandwidth, GB/s (0 = unknown) */
    double peak_tflops_fp32;     /* dense peak, 0 = none/unknown */
    double peak_tflops_tf32;
    double peak_tflops_fp16;     /* tensor-core FP16 with FP32 accumulate */
    double peak_tflops_bf16;

    /* CPU limits (zero for a GPU). */
    int cores;
    int vector_bits;             /* 128, 256 or 512 */
    int vector_regs;             /* architectural vector registers */
    int64_t l1d_bytes;
    int64_t l3_bytes;            /* 0 = no L3 */
    int fma_units;               /* FMA pipes per core */
    bool has_bf16_dot;           /* bf16 pair dot products into f32 (AVX-512 BF16 vdpbf16ps);
                                    optional in JSON, false when absent */
} cfg_device;

/* Built-in table lookup by exact name ("h100", "a100-80gb", ...); NULL if unknown. */
const cfg_device *cfg_device_find(const char *name);

/* Writes up to max built-in names into names[]; returns the total count. */
int cfg_device_list(const char **names, int max);

/* Fills *out with the host CPU.  Returns 0, or -1 with a message in err. */
int cfg_device_host(cfg_device *out, char *err, size_t n);

/* Loads a device description from a JSON file and validates it (see
 * cfg_device_validate).  Returns 0, or -1 with a message naming the field. */
int cfg_device_load(const char *path, cfg_device *out, char *err, size_t n);

/* Fills *out from the CUDA driver: dlopen("libcuda.so.1") (novac never links
 * libcuda), device 0 or the index in $NOVAC_CUDA_DEVICE.  The name is
 * "auto:" + the driver's device name.  Returns 0, or -1 with a one-line
 * message in err (no driver, cuInit failure, no device, bad index, or a
 * result that fails cfg_device_validate). */
int cfg_device_auto_gpu(cfg_device *out, char *err, size_t n);

/* One line describing d, e.g. "h100: sm_90, 132 SMs, 228 KiB smem/SM,
 * 50 MiB L2, 80 GiB, 3350 GB/s" or "host: 2 cores, 256-bit vectors,
 * L1d 48 KiB, L2 1.25 MiB, L3 32 MiB".  Writes at most n bytes (truncating)
 * into buf and returns buf ("" when buf is NULL or n is 0). */
const char *cfg_device_summary(const cfg_device *d, char *buf, size_t n);

/* Checks that every limit is present and plausible.  Returns 0, or -1 with a
 * message naming the offending field. */
int cfg_device_validate(const cfg_device *d, char *err, size_t n);

#endif
