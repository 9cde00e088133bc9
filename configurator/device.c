/* configurator/device.c: built-in device table, host probing, JSON loading.
 *
 * Sources for the figures, abbreviated in the comments below:
 *   [CCT]  CUDA C++ Programming Guide, "Compute Capabilities", Table
 *          "Technical Specifications per Compute Capability" (threads, blocks,
 *          registers, shared memory per SM and per block, 48 KiB static limit).
 *   [PTX]  PTX ISA, "Warp-level matrix multiply-accumulate instructions"
 *          (mma.sync .f16/.bf16/.tf32 need sm_80+; wgmma needs sm_90a).
 *   [H100W] NVIDIA H100 Tensor Core GPU Architecture whitepaper (GH100).
 *   [H100D] NVIDIA H100 Tensor Core GPU datasheet (SXM column).
 *   [H200D] NVIDIA H200 Tensor Core GPU datasheet (SXM column).
 *   [A100W] NVIDIA A100 Tensor Core GPU Architecture whitepaper (GA100).
 *   [A100D] NVIDIA A100 Tensor Core GPU datasheet (SXM columns).
 *   [GA10xW] NVIDIA Ampere GA102 GPU Architecture whitepaper (GA10x SM rates).
 *   [ADAW] NVIDIA Ada GPU Architecture whitepaper (appendix tables).
 *   [L4D]  NVIDIA L4 Tensor Core GPU datasheet.
 *   [R6KD] NVIDIA RTX 6000 Ada Generation datasheet.
 *   [3060S] GeForce RTX 3060 product specifications page (12 GB model).
 *   [CUDRV] CUDA Driver API reference, cuDeviceGetAttribute and the
 *          CUdevice_attribute / CUresult enums in cuda.h (CUDA 13.0).
 * Datasheets quote tensor throughput "with sparsity"; the table stores dense
 * figures, i.e. half of the sparse figure.  Memory capacities are the
 * datasheets' "GB" figures, which are binary (an "80 GB" part reports
 * 80 GiB to the driver, less its reservations), so they are stored as GiB.
 */
#define _POSIX_C_SOURCE 200809L
#include "device.h"

#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB ((int64_t)1024)
#define MiB ((int64_t)1024 * 1024)
#define GiB ((int64_t)1024 * 1024 * 1024)

/* Per-compute-capability limits, all from [CCT]. */
#define CC80_LIMITS                                                         \
    .max_threads_per_block = 1024, .max_threads_per_sm = 2048,              \
    .max_blocks_per_sm = 32, .regs_per_sm = 65536, .max_regs_per_thread = 255, \
    .smem_per_sm = 164 * KiB, .smem_per_block = 48 * KiB,                   \
    .smem_per_block_optin = 163 * KiB, .cc_major = 8, .cc_minor = 0
#define CC86_LIMITS                                                         \
    .max_threads_per_block = 1024, .max_threads_per_sm = 1536,              \
    .max_blocks_per_sm = 16, .regs_per_sm = 65536, .max_regs_per_thread = 255, \
    .smem_per_sm = 100 * KiB, .smem_per_block = 48 * KiB,                   \
    .smem_per_block_optin = 99 * KiB, .cc_major = 8, .cc_minor = 6
#define CC89_LIMITS                                                         \
    .max_threads_per_block = 1024, .max_threads_per_sm = 1536,              \
    .max_blocks_per_sm = 24, .regs_per_sm = 65536, .max_regs_per_thread = 255, \
    .smem_per_sm = 100 * KiB, .smem_per_block = 48 * KiB,                   \
    .smem_per_block_optin = 99 * KiB, .cc_major = 8, .cc_minor = 9
#define CC90_LIMITS                                                         \
    .max_threads_per_block = 1024, .max_threads_per_sm = 2048,              \
    .max_blocks_per_sm = 32, .regs_per_sm = 65536, .max_regs_per_thread = 255, \
    .smem_per_sm = 228 * KiB, .smem_per_block = 48 * KiB,                   \
    .smem_per_block_optin = 227 * KiB, .cc_major = 9, .cc_minor = 0
/* [PTX]: mma.sync with f16, bf16 and tf32 operands from sm_80; wgmma on sm_90a. */
#define MMA_SM80 .has_mma_sync_f16 = true, .has_mma_sync_bf16 = true, \
                 .has_mma_sync_tf32 = true, .has_wgmma = false
#define MMA_SM90 .has_mma_sync_f16 = true, .has_mma_sync_bf16 = true, \
                 .has_mma_sync_tf32 = true, .has_wgmma = true

static const cfg_device cfg_builtin[] = {
    {
        .name = "h100", .kind = CFG_DEV_GPU, CC90_LIMITS, MMA_SM90,
        .sm_count = 132,             /* [H100W]: H100 SXM5 has 132 SMs */
        .l2_bytes = 50 * MiB,        /* [H100W]: 50 MB L2 */
        .total_mem_bytes = 80 * GiB, /* [H100D]: 80 GB HBM3 (SXM) */
        .mem_bw_gbs = 3350,          /* [H100D]: 3.35 TB/s HBM3 */
        .peak_tflops_fp32 = 67,      /* [H100D]: 67 TFLOPS FP32 */
        .peak_tflops_tf32 = 494.7,   /* [H100D]: 989 sparse -> dense/2 */
        .peak_tflops_fp16 = 989.4,   /* [H100D]: 1,979 sparse -> dense/2 */
        .peak_tflops_bf16 = 989.4,   /* [H100D]: 1,979 sparse -> dense/2 */
    },
    {
        .name = "h200", .kind = CFG_DEV_GPU, CC90_LIMITS, MMA_SM90,
        .sm_count = 132,             /* GH100 SXM5 configuration, as [H100W] */
        .l2_bytes = 50 * MiB,        /* GH100 SXM5, as [H100W] */
        .total_mem_bytes = 141 * GiB, /* [H200D]: 141 GB HBM3e */
        .mem_bw_gbs = 4800,          /* [H200D]: 4.8 TB/s HBM3e */
        .peak_tflops_fp32 = 67,      /* [H200D]: 67 TFLOPS FP32 */
        .peak_tflops_tf32 = 494.7,   /* [H200D]: 989 sparse -> dense/2 */
        .peak_tflops_fp16 = 989.4,   /* [H200D]: 1,979 sparse -> dense/2 */
        .peak_tflops_bf16 = 989.4,   /* [H200D]: 1,979 sparse -> dense/2 */
    },
    {
        .name = "a100-40gb", .kind = CFG_DEV_GPU, CC80_LIMITS, MMA_SM80,
        .sm_count = 108,             /* [A100W]: A100 has 108 SMs */
        .l2_bytes = 40 * MiB,        /* [A100W]: 40 MB L2 */
        .total_mem_bytes = 40 * GiB, /* [A100D]: 40 GB HBM2 */
        .mem_bw_gbs = 1555,          /* [A100D]: 1,555 GB/s (40GB SXM) */
        .peak_tflops_fp32 = 19.5,    /* [A100D] */
        .peak_tflops_tf32 = 156,     /* [A100D]: 312 sparse -> dense/2 */
        .peak_tflops_fp16 = 312,     /* [A100D]: 624 sparse -> dense/2 */
        .peak_tflops_bf16 = 312,     /* [A100D]: 624 sparse -> dense/2 */
    },
    {
        .name = "a100-80gb", .kind = CFG_DEV_GPU, CC80_LIMITS, MMA_SM80,
        .sm_count = 108,             /* [A100W] */
        .l2_bytes = 40 * MiB,        /* [A100W] */
        .total_mem_bytes = 80 * GiB, /* [A100D]: 80 GB HBM2e */
        .mem_bw_gbs = 2039,          /* [A100D]: 2,039 GB/s (80GB SXM) */
        .peak_tflops_fp32 = 19.5,    /* [A100D] */
        .peak_tflops_tf32 = 156,     /* [A100D] */
        .peak_tflops_fp16 = 312,     /* [A100D] */
        .peak_tflops_bf16 = 312,     /* [A100D] */
    },
    {
        .name = "l4", .kind = CFG_DEV_GPU, CC89_LIMITS, MMA_SM80,
        .sm_count = 58,              /* [L4D]: 7,424 CUDA cores / 128 per Ada SM [ADAW] */
        .l2_bytes = 48 * MiB,        /* [ADAW]: AD104 L2 as configured on L4 */
        .total_mem_bytes = 24 * GiB, /* [L4D]: 24 GB GDDR6 */
        .mem_bw_gbs = 300,           /* [L4D]: 300 GB/s */
        .peak_tflops_fp32 = 30.3,    /* [L4D] */
        .peak_tflops_tf32 = 60,      /* [L4D]: 120 sparse -> dense/2 */
        .peak_tflops_fp16 = 121,     /* [L4D]: 242 sparse -> dense/2 */
        .peak_tflops_bf16 = 121,     /* [L4D]: 242 sparse -> dense/2 */
    },
    {
        .name = "rtx3060", .kind = CFG_DEV_GPU, CC86_LIMITS, MMA_SM80,
        .sm_count = 28,              /* [3060S]: 3,584 CUDA cores / 128 per GA10x SM [GA10xW] */
        .l2_bytes = 3 * MiB,         /* [GA10xW]: GA106 L2 */
        .total_mem_bytes = 12 * GiB, /* [3060S]: 12 GB GDDR6 */
        .mem_bw_gbs = 360,           /* [3060S]: 15 Gbps x 192-bit */
        .peak_tflops_fp32 = 12.7,    /* 3,584 x 2 x 1.777 GHz boost [3060S] */
        .peak_tflops_tf32 = 12.7,    /* [GA10xW] GeForce rate 256 FLOP/clk/SM x 28 x 1.777 GHz */
        .peak_tflops_fp16 = 25.5,    /* [GA10xW] FP32-accumulate rate 512 FLOP/clk/SM */
        .peak_tflops_bf16 = 25.5,    /* [GA10xW] same rate as FP16/FP32-acc */
    },
    {
        .name = "rtx4090", .kind = CFG_DEV_GPU, CC89_LIMITS, MMA_SM80,
        .sm_count = 128,             /* [ADAW]: RTX 4090 appendix, 128 SMs */
        .l2_bytes = 72 * MiB,        /* [ADAW]: 72 MB L2 */
        .total_mem_bytes = 24 * GiB, /* [ADAW]: 24 GB GDDR6X */
        .mem_bw_gbs = 1008,          /* [ADAW]: 21 Gbps x 384-bit */
        .peak_tflops_fp32 = 82.6,    /* [ADAW] */
        .peak_tflops_tf32 = 82.6,    /* [ADAW]: 165.2 sparse -> dense/2 */
        .peak_tflops_fp16 = 165.2,   /* [ADAW]: FP16 with FP32 accumulate, dense */
        .peak_tflops_bf16 = 165.2,   /* [ADAW]: BF16 with FP32 accumulate, dense */
    },
    {
        .name = "rtx6000ada", .kind = CFG_DEV_GPU, CC89_LIMITS, MMA_SM80,
        .sm_count = 142,             /* [R6KD]: 18,176 CUDA cores / 128 per SM [ADAW] */
        .l2_bytes = 96 * MiB,        /* [ADAW]: AD102 full L2 */
        .total_mem_bytes = 48 * GiB, /* [R6KD]: 48 GB GDDR6 */
        .mem_bw_gbs = 960,           /* [R6KD]: 960 GB/s */
        .peak_tflops_fp32 = 91.1,    /* [R6KD] */
        .peak_tflops_tf32 = 182.1,   /* [ADAW]: 364.2 sparse -> dense/2 */
        .peak_tflops_fp16 = 364.2,   /* [ADAW]: FP32 accumulate, dense */
        .peak_tflops_bf16 = 364.2,   /* [ADAW] */
    },
};

#define CFG_NBUILTIN ((int)(sizeof cfg_builtin / sizeof cfg_builtin[0]))

static void cfg_errf(char *err, size_t n, const char *fmt, ...)
{
    if (!err || n == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

const cfg_device *cfg_device_find(const char *name)
{
    if (!name) return NULL;
    for (int i = 0; i < CFG_NBUILTIN; i++)
        if (strcmp(cfg_builtin[i].name, name) == 0) return &cfg_builtin[i];
    return NULL;
}

int cfg_device_list(const char **names, int max)
{
    for (int i = 0; i < CFG_NBUILTIN && i < max; i++) names[i] = cfg_builtin[i].name;
    return CFG_NBUILTIN;
}

/* ---- host ---- */

static int64_t cfg_sys_cache(int index, int want_level, const char *want_type)
{
    char path[128], buf[64];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int level = 0;
    if (fscanf(f, "%d", &level) != 1) level = 0;
    fclose(f);
    if (level != want_level) return 0;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", index);
    f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
    fclose(f);
    if (strncmp(buf, want_type, strlen(want_type)) != 0 && strncmp(buf, "Unified", 7) != 0)
        return 0;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
    f = fopen(path, "r");
    if (!f) return 0;
    long v = 0;
    char unit = 0;
    int got = fscanf(f, "%ld%c", &v, &unit);
    fclose(f);
    if (got < 1) return 0;
    if (got == 2 && (unit == 'K' || unit == 'k')) v *= 1024;
    else if (got == 2 && (unit == 'M' || unit == 'm')) v *= 1024 * 1024;
    return v;
}

/* Cache size of the given level: sysconf first, then sysfs; 0 if unknown. */
static int64_t cfg_host_cache(int level)
{
    long v = -1;
#if defined(_SC_LEVEL1_DCACHE_SIZE)
    if (level == 1) v = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    else if (level == 2) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    else if (level == 3) v = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    if (v > 0) return v;
    for (int i = 0; i < 16; i++) {
        int64_t s = cfg_sys_cache(i, level, level == 1 ? "Data" : "Unified");
        if (s < 0) break;
        if (s > 0) return s;
    }
    return 0;
}

int cfg_device_host(cfg_device *out, char *err, size_t n)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "host");
    out->kind = CFG_DEV_CPU;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    out->cores = cores > 0 ? (int)cores : 1;
    out->vector_bits = 128;
    out->vector_regs = 32; /* AArch64 NEON: 32 x 128-bit registers */
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    out->vector_regs = 16; /* SSE / AVX2: 16 xmm/ymm registers */
    if (__builtin_cpu_supports("avx512f")) {
        out->vector_bits = 512;
        out->vector_regs = 32; /* AVX-512: 32 zmm registers */
        out->has_bf16_dot = __builtin_cpu_supports("avx512bf16");
    } else if (__builtin_cpu_supports("avx2")) {
        out->vector_bits = 256;
    }
#endif
    out->fma_units = 2; /* two FMA pipes per core on current x86 and Neoverse cores */
    out->l1d_bytes = cfg_host_cache(1);
    out->l2_bytes = cfg_host_cache(2);
    out->l3_bytes = cfg_host_cache(3);
    /* Conservative defaults when the OS reports nothing. */
    if (out->l1d_bytes <= 0) out->l1d_bytes = 32 * KiB;
    if (out->l2_bytes <= 0) out->l2_bytes = 256 * KiB;
    if (out->l3_bytes < 0) out->l3_bytes = 0;
    return cfg_device_validate(out, err, n);
}

/* ---- validation ---- */

#define CFG_BAD(field, ...) \
    do { cfg_errf(err, n, "field '" field "': " __VA_ARGS__); return -1; } while (0)

int cfg_device_validate(const cfg_device *d, char *err, size_t n)
{
    if (d->name[0] == 0) CFG_BAD("name", "empty");
    if (d->peak_tflops_fp32 < 0 || d->peak_tflops_fp32 > 1e5) CFG_BAD("peak_tflops_fp32", "out of range");
    if (d->peak_tflops_tf32 < 0 || d->peak_tflops_tf32 > 1e5) CFG_BAD("peak_tflops_tf32", "out of range");
    if (d->peak_tflops_fp16 < 0 || d->peak_tflops_fp16 > 1e5) CFG_BAD("peak_tflops_fp16", "out of range");
    if (d->peak_tflops_bf16 < 0 || d->peak_tflops_bf16 > 1e5) CFG_BAD("peak_tflops_bf16", "out of range");
    if (d->mem_bw_gbs < 0 || d->mem_bw_gbs > 1e6) CFG_BAD("mem_bw_gbs", "out of range");
    /* 0 = unknown; otherwise between 64 MiB and 1 PiB (2^50 bytes). */
    if (d->total_mem_bytes < 0 || (d->total_mem_bytes > 0 && (d->total_mem_bytes < 64 * MiB ||
                                                               d->total_mem_bytes > ((int64_t)1 << 50))))
        CFG_BAD("total_mem_bytes", "must be 0 (unknown) or in 64 MiB..1 PiB, got %lld",
                (long long)d->total_mem_bytes);
    if (d->kind == CFG_DEV_GPU) {
        if (d->sm_count <= 0 || d->sm_count > 100000) CFG_BAD("sm_count", "must be in 1..100000, got %d", d->sm_count);
        if (d->max_threads_per_block < 32 || d->max_threads_per_block % 32)
            CFG_BAD("max_threads_per_block", "must be a positive multiple of 32, got %d", d->max_threads_per_block);
        if (d->max_threads_per_sm < d->max_threads_per_block || d->max_threads_per_sm % 32)
            CFG_BAD("max_threads_per_sm", "must be a multiple of 32 and >= max_threads_per_block, got %d", d->max_threads_per_sm);
        if (d->max_blocks_per_sm <= 0 || d->max_blocks_per_sm > 1024)
            CFG_BAD("max_blocks_per_sm", "must be in 1..1024, got %d", d->max_blocks_per_sm);
        if (d->regs_per_sm <= 0) CFG_BAD("regs_per_sm", "must be positive, got %d", d->regs_per_sm);
        if (d->max_regs_per_thread < 16 || d->max_regs_per_thread > d->regs_per_sm / 32)
            CFG_BAD("max_regs_per_thread", "must be in 16..regs_per_sm/32, got %d", d->max_regs_per_thread);
        if (d->smem_per_sm <= 0) CFG_BAD("smem_per_sm", "must be positive");
        if (d->smem_per_block <= 0) CFG_BAD("smem_per_block", "must be positive");
        if (d->smem_per_block > d->smem_per_sm) CFG_BAD("smem_per_block", "exceeds smem_per_sm");
        if (d->smem_per_block_optin < d->smem_per_block)
            CFG_BAD("smem_per_block_optin", "smaller than smem_per_block");
        if (d->smem_per_block_optin > d->smem_per_sm) CFG_BAD("smem_per_block_optin", "exceeds smem_per_sm");
        if (d->l2_bytes <= 0) CFG_BAD("l2_bytes", "must be positive");
        if (d->mem_bw_gbs <= 0) CFG_BAD("mem_bw_gbs", "must be positive");
        if (d->peak_tflops_fp32 <= 0) CFG_BAD("peak_tflops_fp32", "must be positive");
        if (d->cc_major < 1 || d->cc_major > 99) CFG_BAD("cc_major", "out of range, got %d", d->cc_major);
        if (d->cc_minor < 0 || d->cc_minor > 99) CFG_BAD("cc_minor", "out of range, got %d", d->cc_minor);
    } else if (d->kind == CFG_DEV_CPU) {
        if (d->cores <= 0 || d->cores > 100000) CFG_BAD("cores", "must be in 1..100000, got %d", d->cores);
        if (d->vector_bits < 128 || d->vector_bits > 2048 || d->vector_bits % 128)
            CFG_BAD("vector_bits", "must be a multiple of 128 in 128..2048, got %d", d->vector_bits);
        if (d->vector_regs < 8 || d->vector_regs > 256)
            CFG_BAD("vector_regs", "must be in 8..256, got %d", d->vector_regs);
        if (d->l1d_bytes < 1024) CFG_BAD("l1d_bytes", "must be at least 1024");
        if (d->l2_bytes < d->l1d_bytes) CFG_BAD("l2_bytes", "smaller than l1d_bytes");
        if (d->l3_bytes < 0) CFG_BAD("l3_bytes", "negative");
        if (d->fma_units <= 0 || d->fma_units > 16) CFG_BAD("fma_units", "must be in 1..16, got %d", d->fma_units);
    } else {
        CFG_BAD("kind", "must be \"gpu\" or \"cpu\"");
    }
    return 0;
}

/* ---- JSON ---- */

static int cfg_json_num(const cJSON *o, const char *key, double lo, double hi, bool integral,
                        double *v, char *err, size_t n)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it) { cfg_errf(err, n, "missing field '%s'", key); return -1; }
    if (!cJSON_IsNumber(it)) { cfg_errf(err, n, "field '%s': not a number", key); return -1; }
    double x = it->valuedouble;
    if (integral && x != (double)(int64_t)x) { cfg_errf(err, n, "field '%s': not an integer", key); return -1; }
    if (!(x >= lo && x <= hi)) {
        cfg_errf(err, n, "field '%s': %g out of range [%g, %g]", key, x, lo, hi);
        return -1;
    }
    *v = x;
    return 0;
}

static int cfg_json_bool(const cJSON *o, const char *key, bool *v, char *err, size_t n)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it) { cfg_errf(err, n, "missing field '%s'", key); return -1; }
    if (!cJSON_IsBool(it)) { cfg_errf(err, n, "field '%s': not a boolean", key); return -1; }
    *v = cJSON_IsTrue(it);
    return 0;
}

#define CFG_INT(key, lo, hi, dst) \
    do { double t_; if (cfg_json_num(root, key, lo, hi, true, &t_, err, n)) goto fail; dst = (int)t_; } while (0)
#define CFG_I64(key, lo, hi, dst) \
    do { double t_; if (cfg_json_num(root, key, lo, hi, true, &t_, err, n)) goto fail; dst = (int64_t)t_; } while (0)
#define CFG_DBL(key, lo, hi, dst) \
    do { double t_; if (cfg_json_num(root, key, lo, hi, false, &t_, err, n)) goto fail; dst = t_; } while (0)
#define CFG_BOOL(key, dst) \
    do { if (cfg_json_bool(root, key, &dst, err, n)) goto fail; } while (0)

int cfg_device_load(const char *path, cfg_device *out, char *err, size_t n)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) { cfg_errf(err, n, "%s: cannot open", path); return -1; }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            if (cap > ((size_t)16 << 20)) { fclose(f); free(buf); cfg_errf(err, n, "%s: too large", path); return -1; }
            char *nb = realloc(buf, cap);
            if (!nb) { fclose(f); free(buf); cfg_errf(err, n, "out of memory"); return -1; }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, 4096, f);
        len += got;
        if (got < 4096) break;
    }
    fclose(f);
    buf[len] = 0;
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    if (!root) { cfg_errf(err, n, "%s: invalid JSON", path); return -1; }
    if (!cJSON_IsObject(root)) { cfg_errf(err, n, "%s: top level is not an object", path); goto fail; }

    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    if (!name) { cfg_errf(err, n, "missing field 'name'"); goto fail; }
    if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) >= sizeof out->name) {
        cfg_errf(err, n, "field 'name': must be a non-empty string under %zu bytes", sizeof out->name);
        goto fail;
    }
    snprintf(out->name, sizeof out->name, "%s", name->valuestring);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(root, "kind");
    if (!kind) { cfg_errf(err, n, "missing field 'kind'"); goto fail; }
    if (cJSON_IsString(kind) && strcmp(kind->valuestring, "gpu") == 0) out->kind = CFG_DEV_GPU;
    else if (cJSON_IsString(kind) && strcmp(kind->valuestring, "cpu") == 0) out->kind = CFG_DEV_CPU;
    else { cfg_errf(err, n, "field 'kind': must be \"gpu\" or \"cpu\""); goto fail; }

    const double big = 9.0e15;
    CFG_DBL("peak_tflops_fp32", 0, 1e5, out->peak_tflops_fp32);
    CFG_DBL("peak_tflops_tf32", 0, 1e5, out->peak_tflops_tf32);
    CFG_DBL("peak_tflops_fp16", 0, 1e5, out->peak_tflops_fp16);
    CFG_DBL("peak_tflops_bf16", 0, 1e5, out->peak_tflops_bf16);
    CFG_DBL("mem_bw_gbs", 0, 1e6, out->mem_bw_gbs);
    CFG_I64("l2_bytes", 1, big, out->l2_bytes);
    if (out->kind == CFG_DEV_GPU) {
        CFG_INT("sm_count", 1, 100000, out->sm_count);
        CFG_INT("max_threads_per_block", 32, 1 << 20, out->max_threads_per_block);
        CFG_INT("max_threads_per_sm", 32, 1 << 20, out->max_threads_per_sm);
        CFG_INT("max_blocks_per_sm", 1, 1024, out->max_blocks_per_sm);
        CFG_INT("regs_per_sm", 1, 1 << 24, out->regs_per_sm);
        CFG_INT("max_regs_per_thread", 1, 1 << 16, out->max_regs_per_thread);
        CFG_I64("smem_per_sm", 1, big, out->smem_per_sm);
        CFG_I64("smem_per_block", 1, big, out->smem_per_block);
        CFG_I64("smem_per_block_optin", 1, big, out->smem_per_block_optin);
        CFG_INT("cc_major", 1, 99, out->cc_major);
        CFG_INT("cc_minor", 0, 99, out->cc_minor);
        CFG_BOOL("has_mma_sync_f16", out->has_mma_sync_f16);
        CFG_BOOL("has_mma_sync_bf16", out->has_mma_sync_bf16);
        CFG_BOOL("has_mma_sync_tf32", out->has_mma_sync_tf32);
        CFG_BOOL("has_wgmma", out->has_wgmma);
        /* Optional: absent or 0 means unknown; cfg_device_validate checks the range. */
        if (cJSON_GetObjectItemCaseSensitive(root, "total_mem_bytes"))
            CFG_I64("total_mem_bytes", 0, big, out->total_mem_bytes);
    } else {
        CFG_INT("cores", 1, 100000, out->cores);
        CFG_INT("vector_bits", 128, 2048, out->vector_bits);
        CFG_INT("vector_regs", 8, 256, out->vector_regs);
        CFG_I64("l1d_bytes", 1024, big, out->l1d_bytes);
        CFG_I64("l3_bytes", 0, big, out->l3_bytes);
        CFG_INT("fma_units", 1, 16, out->fma_units);
        if (cJSON_GetObjectItemCaseSensitive(root, "has_bf16_dot")) CFG_BOOL("has_bf16_dot", out->has_bf16_dot);
    }
    cJSON_Delete(root);
    if (cfg_device_validate(out, err, n)) return -1;
    return 0;
fail:
    cJSON_Delete(root);
    return -1;
}

/* ---- summary ---- */

/* Bytes in the largest binary unit that keeps the value >= 1, with up to two
 * decimals and no trailing zeros: 49152 -> "48 KiB", 1310720 -> "1.25 MiB". */
static void cfg_fmt_bytes(char *buf, size_t n, int64_t v)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double x = (double)v;
    int u = 0;
    while (x >= 1024.0 && u < 5) { x /= 1024.0; u++; }
    if (x == (double)(int64_t)x) { snprintf(buf, n, "%lld %s", (long long)x, unit[u]); return; }
    char num[32];
    snprintf(num, sizeof num, "%.2f", x);
    size_t len = strlen(num);
    while (len > 0 && num[len - 1] == '0') num[--len] = 0;
    if (len > 0 && num[len - 1] == '.') num[--len] = 0;
    snprintf(buf, n, "%s %s", num, unit[u]);
}

const char *cfg_device_summary(const cfg_device *d, char *buf, size_t n)
{
    if (!buf || n == 0) return "";
    if (!d) { snprintf(buf, n, "(no device)"); return buf; }
    char a[32], b[32], c[32], bw[32];
    if (d->mem_bw_gbs > 0) snprintf(bw, sizeof bw, ", %.0f GB/s", d->mem_bw_gbs);
    else bw[0] = 0;
    if (d->kind == CFG_DEV_GPU) {
        cfg_fmt_bytes(a, sizeof a, d->smem_per_sm);
        cfg_fmt_bytes(b, sizeof b, d->l2_bytes);
        char mem[48] = "";
        if (d->total_mem_bytes > 0) {
            cfg_fmt_bytes(c, sizeof c, d->total_mem_bytes);
            snprintf(mem, sizeof mem, ", %s memory", c);
        }
        snprintf(buf, n, "%s: sm_%d%d, %d SMs, %s smem/SM, %s L2%s%s", d->name, d->cc_major,
                 d->cc_minor, d->sm_count, a, b, mem, bw);
    } else {
        cfg_fmt_bytes(a, sizeof a, d->l1d_bytes);
        cfg_fmt_bytes(b, sizeof b, d->l2_bytes);
        char l3[48] = ", no L3";
        if (d->l3_bytes > 0) {
            cfg_fmt_bytes(c, sizeof c, d->l3_bytes);
            snprintf(l3, sizeof l3, ", L3 %s", c);
        }
        snprintf(buf, n, "%s: %d core%s, %d-bit vectors%s, L1d %s, L2 %s%s%s", d->name, d->cores,
                 d->cores == 1 ? "" : "s", d->vector_bits, d->has_bf16_dot ? " (bf16 dot)" : "", a, b, l3, bw);
    }
    return buf;
}

/* ---- --device=auto for GPUs: the CUDA driver through dlopen ----
 *
 * novac neither links libcuda nor needs the CUDA headers: the few types and
 * enum values used are declared here, with the values of cuda.h [CUDRV]
 * (they are part of the driver ABI and do not change between releases). */

typedef int cfg_CUresult;  /* CUresult: enum cudaError_enum, 0 = CUDA_SUCCESS */
typedef int cfg_CUdevice;  /* CUdevice: an ordinal */

enum { /* CUdevice_attribute [CUDRV] */
    CFG_CU_ATTR_MAX_THREADS_PER_BLOCK = 1,
    CFG_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CFG_CU_ATTR_MAX_REGISTERS_PER_BLOCK = 12,
    CFG_CU_ATTR_CLOCK_RATE = 13,                  /* kHz */
    CFG_CU_ATTR_MULTIPROCESSOR_COUNT = 16,
    CFG_CU_ATTR_MEMORY_CLOCK_RATE = 36,           /* kHz */
    CFG_CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37,     /* bits */
    CFG_CU_ATTR_L2_CACHE_SIZE = 38,               /* bytes */
    CFG_CU_ATTR_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CFG_CU_ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
    CFG_CU_ATTR_COMPUTE_CAPABILITY_MINOR = 76,
    CFG_CU_ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
    CFG_CU_ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
    CFG_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CFG_CU_ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR = 106
};

typedef cfg_CUresult (*cfg_cuInit_fn)(unsigned int flags);
typedef cfg_CUresult (*cfg_cuDeviceGetCount_fn)(int *count);
typedef cfg_CUresult (*cfg_cuDeviceGet_fn)(cfg_CUdevice *dev, int ordinal);
typedef cfg_CUresult (*cfg_cuDeviceGetName_fn)(char *name, int len, cfg_CUdevice dev);
typedef cfg_CUresult (*cfg_cuDeviceGetAttribute_fn)(int *v, int attrib, cfg_CUdevice dev);
typedef cfg_CUresult (*cfg_cuDeviceTotalMem_fn)(size_t *bytes, cfg_CUdevice dev);
typedef cfg_CUresult (*cfg_cuGetErrorText_fn)(cfg_CUresult e, const char **text);

typedef struct cfg_cuda_api {
    cfg_cuInit_fn init;
    cfg_cuDeviceGetCount_fn get_count;
    cfg_cuDeviceGet_fn get;
    cfg_cuDeviceGetName_fn get_name;
    cfg_cuDeviceGetAttribute_fn get_attr;
    cfg_cuDeviceTotalMem_fn total_mem;
    cfg_cuGetErrorText_fn err_name;    /* optional (cuGetErrorName) */
    cfg_cuGetErrorText_fn err_string;  /* optional (cuGetErrorString) */
} cfg_cuda_api;

/* dlsym into a function pointer.  ISO C has no conversion from void * to a
 * function pointer; POSIX guarantees they have the same representation, so
 * copy the bits. */
static void *cfg_dlsym_fn(void *lib, const char *sym, void *fn_out, size_t fn_size)
{
    void *p = dlsym(lib, sym);
    if (p && fn_size == sizeof p) memcpy(fn_out, &p, sizeof p);
    return p;
}
#define CFG_DLSYM(lib, sym, dst) cfg_dlsym_fn(lib, sym, &(dst), sizeof(dst))

/* "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)": the driver's
 * own name and text when it exports cuGetErrorName/String, else the cuda.h
 * name of the common codes and the number. */
static void cfg_cu_error(const cfg_cuda_api *api, cfg_CUresult e, char *buf, size_t n)
{
    const char *name = NULL, *text = NULL;
    if (api->err_name && api->err_name(e, &name) != 0) name = NULL;
    if (api->err_string && api->err_string(e, &text) != 0) text = NULL;
    if (!name) {
        static const struct { int code; const char *name; } known[] = {
            {1, "CUDA_ERROR_INVALID_VALUE"}, {2, "CUDA_ERROR_OUT_OF_MEMORY"},
            {3, "CUDA_ERROR_NOT_INITIALIZED"}, {4, "CUDA_ERROR_DEINITIALIZED"},
            {34, "CUDA_ERROR_STUB_LIBRARY"}, {35, "CUDA_ERROR_INSUFFICIENT_DRIVER"},
            {100, "CUDA_ERROR_NO_DEVICE"}, {101, "CUDA_ERROR_INVALID_DEVICE"},
            {304, "CUDA_ERROR_OPERATING_SYSTEM"}, {801, "CUDA_ERROR_NOT_SUPPORTED"},
            {802, "CUDA_ERROR_SYSTEM_NOT_READY"}, {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
            {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"}, {999, "CUDA_ERROR_UNKNOWN"},
        };
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            if (known[i].code == e) name = known[i].name;
    }
    if (name && text) snprintf(buf, n, "%s (%s)", name, text);
    else if (name) snprintf(buf, n, "%s (error %d)", name, e);
    else snprintf(buf, n, "CUDA error %d", e);
}

/* Per-SM throughput in FLOP per clock (one FMA = 2 FLOP), by compute
 * capability.  fp32: 2 x the "32-bit floating-point add, multiply,
 * multiply-add" results per clock per SM of [CCT] "Arithmetic Instructions".
 * Tensor (dense f16 with f32 accumulate): the built-in peaks divided by
 * SMs x clock -- sm_80 2048 (A100: 312 TFLOPS / 108 / 1.41 GHz), sm_89 1024
 * (L4: 121 / 58 / 2.04 GHz), sm_90 4096 (H100: 989.4 / 132 / 1.83 GHz);
 * sm_7x 1024 (V100: 125 / 80 / 1.53 GHz); GA10x 1024 as AD10x [GA10xW];
 * sm_100 8192 and sm_120 1024 by the same reading of the Blackwell
 * datasheets.  GeForce boards run f32 accumulate at half the tensor rate,
 * so for them these figures are optimistic. */
static void cfg_cc_rates(int major, int minor, int *fp32, int *tensor)
{
    *fp32 = 256;   /* 128 FP32 lanes: sm_5x, sm_61/62, sm_86/87/89, sm_90, sm_100, sm_120 */
    *tensor = 0;   /* no tensor cores before sm_70 */
    if (major == 6 && minor == 0) *fp32 = 128;   /* GP100: 64 lanes */
    if (major == 7 || major == 8) *fp32 = 128;   /* sm_70/72/75/80: 64 lanes */
    if (major == 8 && minor >= 6) *fp32 = 256;   /* GA10x / AD10x: 128 lanes */
    if (major == 7) *tensor = 1024;
    else if (major == 8) *tensor = minor == 0 ? 2048 : 1024;
    else if (major == 9) *tensor = 4096;
    else if (major == 10 || major == 11) *tensor = 8192;
    else if (major >= 12) *tensor = 1024;
}

/* Does s contain tok as a whole word (not inside a longer alphanumeric run)? */
static bool cfg_has_token(const char *s, const char *tok)
{
    size_t k = strlen(tok);
    for (const char *p = strstr(s, tok); p; p = strstr(p + 1, tok)) {
        bool left = p == s || !((p[-1] >= '0' && p[-1] <= '9') || (p[-1] >= 'A' && p[-1] <= 'Z') ||
                                (p[-1] >= 'a' && p[-1] <= 'z'));
        char r = p[k];
        bool right = !((r >= '0' && r <= '9') || (r >= 'A' && r <= 'Z') || (r >= 'a' && r <= 'z'));
        if (left && right) return true;
    }
    return false;
}

/* The built-in model a driver-reported device is, or NULL.  The name must
 * contain the model's marketing name and the SM count and compute capability
 * must agree, which rules out cut-down variants such as the H100 PCIe (114
 * SMs) or the RTX 3060 Ti (38 SMs). */
static const cfg_device *cfg_match_builtin(const cfg_device *g)
{
    static const struct { const char *token, *model; } map[] = {
        {"H200", "h200"}, {"H100", "h100"}, {"A100", NULL}, {"L4", "l4"},
        {"RTX 3060", "rtx3060"}, {"RTX 4090", "rtx4090"}, {"RTX 6000 Ada", "rtx6000ada"},
    };
    const char *name = g->name;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (!cfg_has_token(name, map[i].token)) continue;
        const char *model = map[i].model;
        if (!model) /* A100: the 40 and 80 GB boards differ in memory only */
            model = g->total_mem_bytes > 48 * GiB ? "a100-80gb" : "a100-40gb";
        const cfg_device *b = cfg_device_find(model);
        if (b && b->sm_count == g->sm_count && b->cc_major == g->cc_major && b->cc_minor == g->cc_minor)
            return b;
    }
    return NULL;
}

int cfg_device_auto_gpu(cfg_device *out, char *err, size_t n)
{
    memset(out, 0, sizeof *out);
    if (err && n) err[0] = 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        cfg_errf(err, n, "no CUDA driver on this machine (%s)", why ? why : "libcuda.so.1: cannot be loaded");
        return -1;
    }
    cfg_cuda_api api;
    memset(&api, 0, sizeof api);
    static const char *const required[] = {"cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
                                           "cuDeviceGetAttribute", "cuDeviceTotalMem_v2"};
    void *got[6] = {
        CFG_DLSYM(lib, required[0], api.init), CFG_DLSYM(lib, required[1], api.get_count),
        CFG_DLSYM(lib, required[2], api.get), CFG_DLSYM(lib, required[3], api.get_name),
        CFG_DLSYM(lib, required[4], api.get_attr), CFG_DLSYM(lib, required[5], api.total_mem),
    };
    for (int i = 0; i < 6; i++) {
        if (!got[i]) {
            cfg_errf(err, n, "libcuda.so.1 has no %s (CUDA driver too old?)", required[i]);
            dlclose(lib);
            return -1;
        }
    }
    CFG_DLSYM(lib, "cuGetErrorName", api.err_name);
    CFG_DLSYM(lib, "cuGetErrorString", api.err_string);
    /* From here on the library stays loaded: an initialized driver keeps
     * threads and exit handlers that must not be unmapped. */
    char cuerr[192];
    cfg_CUresult r = api.init(0);
    if (r != 0) { cfg_cu_error(&api, r, cuerr, sizeof cuerr); cfg_errf(err, n, "cuInit failed: %s", cuerr); return -1; }
    int count = 0;
    r = api.get_count(&count);
    if (r != 0) { cfg_cu_error(&api, r, cuerr, sizeof cuerr); cfg_errf(err, n, "cuDeviceGetCount failed: %s", cuerr); return -1; }
    if (count < 1) { cfg_errf(err, n, "no CUDA device"); return -1; }
    int index = 0;
    const char *env = getenv("NOVAC_CUDA_DEVICE");
    if (env && env[0]) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v > 1000000) {
            cfg_errf(err, n, "NOVAC_CUDA_DEVICE=%.32s is not a device index (0..%d)", env, count - 1);
            return -1;
        }
        if (v >= count) {
            cfg_errf(err, n, "NOVAC_CUDA_DEVICE=%ld but there %s %d device%s", v, count == 1 ? "is" : "are",
                     count, count == 1 ? "" : "s");
            return -1;
        }
        index = (int)v;
    }
    cfg_CUdevice dev = 0;
    r = api.get(&dev, index);
    if (r != 0) { cfg_cu_error(&api, r, cuerr, sizeof cuerr); cfg_errf(err, n, "cuDeviceGet(%d) failed: %s", index, cuerr); return -1; }
    char dname[256] = "";
    r = api.get_name(dname, (int)sizeof dname - 1, dev);
    if (r != 0) { cfg_cu_error(&api, r, cuerr, sizeof cuerr); cfg_errf(err, n, "cuDeviceGetName failed: %s", cuerr); return -1; }
    dname[sizeof dname - 1] = 0;
    for (char *p = dname; *p; p++) if (*p == '\n' || *p == '\r') *p = ' ';
    snprintf(out->name, sizeof out->name, "auto:%.58s", dname[0] ? dname : "CUDA device");
    out->kind = CFG_DEV_GPU;

    /* Attributes.  A required one that the driver refuses is an error; the
     * optional ones (newer than CUDA 9) fall back as commented below. */
    static const struct { int attr; const char *name; bool required; } want[] = {
        {CFG_CU_ATTR_MULTIPROCESSOR_COUNT, "MULTIPROCESSOR_COUNT", true},
        {CFG_CU_ATTR_MAX_THREADS_PER_BLOCK, "MAX_THREADS_PER_BLOCK", true},
        {CFG_CU_ATTR_MAX_THREADS_PER_MULTIPROCESSOR, "MAX_THREADS_PER_MULTIPROCESSOR", true},
        {CFG_CU_ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR, "MAX_BLOCKS_PER_MULTIPROCESSOR", false},
        {CFG_CU_ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR, "MAX_REGISTERS_PER_MULTIPROCESSOR", true},
        {CFG_CU_ATTR_MAX_REGISTERS_PER_BLOCK, "MAX_REGISTERS_PER_BLOCK", true},
        {CFG_CU_ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", true},
        {CFG_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK, "MAX_SHARED_MEMORY_PER_BLOCK", true},
        {CFG_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", false},
        {CFG_CU_ATTR_L2_CACHE_SIZE, "L2_CACHE_SIZE", true},
        {CFG_CU_ATTR_COMPUTE_CAPABILITY_MAJOR, "COMPUTE_CAPABILITY_MAJOR", true},
        {CFG_CU_ATTR_COMPUTE_CAPABILITY_MINOR, "COMPUTE_CAPABILITY_MINOR", true},
        {CFG_CU_ATTR_CLOCK_RATE, "CLOCK_RATE", false},
        {CFG_CU_ATTR_MEMORY_CLOCK_RATE, "MEMORY_CLOCK_RATE", false},
        {CFG_CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH, "GLOBAL_MEMORY_BUS_WIDTH", false},
    };
    enum { A_SM, A_TPB, A_TPSM, A_BPSM, A_REGSM, A_REGBLK, A_SMEMSM, A_SMEMBLK, A_OPTIN, A_L2,
           A_CCMAJ, A_CCMIN, A_CLOCK, A_MCLOCK, A_BUS, A_COUNT };
    _Static_assert(sizeof want / sizeof want[0] == A_COUNT, "want[] follows the A_ enum");
    int v[A_COUNT];
    for (int i = 0; i < A_COUNT; i++) {
        v[i] = 0;
        r = api.get_attr(&v[i], want[i].attr, dev);
        if (r != 0) v[i] = 0;
        if (r != 0 && want[i].required) {
            cfg_cu_error(&api, r, cuerr, sizeof cuerr);
            cfg_errf(err, n, "%s: cuDeviceGetAttribute(%s) failed: %s", out->name, want[i].name, cuerr);
            return -1;
        }
    }
    size_t mem = 0;
    if (api.total_mem(&mem, dev) == 0) out->total_mem_bytes = (int64_t)mem;

    out->sm_count = v[A_SM];
    out->max_threads_per_block = v[A_TPB];
    out->max_threads_per_sm = v[A_TPSM];
    /* Without the attribute (drivers before CUDA 11): 16, the smallest
     * [CCT] value from sm_75 on, so occupancy is never overestimated. */
    out->max_blocks_per_sm = v[A_BPSM] > 0 ? v[A_BPSM] : 16;
    out->regs_per_sm = v[A_REGSM];
    /* No attribute: [CCT] gives 255 registers per thread from sm_35 on (63
     * before); one warp of a block may not use more than regs_per_block/32. */
    out->cc_major = v[A_CCMAJ];
    out->cc_minor = v[A_CCMIN];
    int regs = (out->cc_major > 3 || (out->cc_major == 3 && out->cc_minor >= 5)) ? 255 : 63;
    if (v[A_REGBLK] / 32 < regs) regs = v[A_REGBLK] / 32;
    out->max_regs_per_thread = regs;
    out->smem_per_sm = v[A_SMEMSM];
    out->smem_per_block = v[A_SMEMBLK];
    out->smem_per_block_optin = v[A_OPTIN] > 0 ? v[A_OPTIN] : v[A_SMEMBLK]; /* no opt-in before sm_70 */
    out->l2_bytes = v[A_L2];
    /* [PTX]: mma.sync with f16/bf16/tf32 operands from sm_80; wgmma only on
     * sm_90a (Blackwell replaces it with tcgen05). */
    out->has_mma_sync_f16 = out->has_mma_sync_bf16 = out->has_mma_sync_tf32 = out->cc_major >= 8;
    out->has_wgmma = out->cc_major == 9;
    /* DRAM bandwidth = memory clock x bus width x 2 (double data rate; the
     * driver reports HBM and GDDR6X clocks so that this holds), in GB/s:
     * kHz * 1e3 * (bits / 8) * 2 / 1e9. */
    out->mem_bw_gbs = (double)v[A_MCLOCK] * 1e3 * ((double)v[A_BUS] / 8.0) * 2.0 / 1e9;

    const cfg_device *known = cfg_match_builtin(out);
    if (known) {
        /* A known model: datasheet peaks from the table. */
        out->peak_tflops_fp32 = known->peak_tflops_fp32;
        out->peak_tflops_tf32 = known->peak_tflops_tf32;
        out->peak_tflops_fp16 = known->peak_tflops_fp16;
        out->peak_tflops_bf16 = known->peak_tflops_bf16;
        if (out->mem_bw_gbs <= 0) out->mem_bw_gbs = known->mem_bw_gbs;
        if (out->total_mem_bytes <= 0) out->total_mem_bytes = known->total_mem_bytes;
    } else {
        /* An estimate, not a datasheet figure: SMs x clock x per-SM rate of
         * cfg_cc_rates.  tf32 runs at half the f16 tensor rate and bf16 at
         * the f16 rate (sm_80+: A100 156/312/312, H100 494.7/989.4/989.4). */
        int fp32_rate, tensor_rate;
        cfg_cc_rates(out->cc_major, out->cc_minor, &fp32_rate, &tensor_rate);
        double clk = (double)v[A_CLOCK] * 1e3; /* Hz */
        double sm_clk = (double)out->sm_count * clk / 1e12;
        out->peak_tflops_fp32 = sm_clk * fp32_rate;
        out->peak_tflops_fp16 = sm_clk * tensor_rate;
        out->peak_tflops_tf32 = out->cc_major >= 8 ? out->peak_tflops_fp16 / 2 : 0;
        out->peak_tflops_bf16 = out->cc_major >= 8 ? out->peak_tflops_fp16 : 0;
    }
    char verr[192] = "";
    if (cfg_device_validate(out, verr, sizeof verr)) {
        cfg_errf(err, n, "%s: driver-reported limits are implausible: %s", out->name, verr);
        return -1;
    }
    return 0;
}
