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
 * Datasheets quote tensor throughput "with sparsity"; the table stores dense
 * figures, i.e. half of the sparse figure.
 */
#define _POSIX_C_SOURCE 200809L
#include "device.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB ((int64_t)1024)
#define MiB ((int64_t)1024 * 1024)

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
    } else {
        CFG_INT("cores", 1, 100000, out->cores);
        CFG_INT("vector_bits", 128, 2048, out->vector_bits);
        CFG_INT("vector_regs", 8, 256, out->vector_regs);
        CFG_I64("l1d_bytes", 1024, big, out->l1d_bytes);
        CFG_I64("l3_bytes", 0, big, out->l3_bytes);
        CFG_INT("fma_units", 1, 16, out->fma_units);
    }
    cJSON_Delete(root);
    if (cfg_device_validate(out, err, n)) return -1;
    return 0;
fail:
    cJSON_Delete(root);
    return -1;
}
