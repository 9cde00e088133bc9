/* testsuite/configurator/test_schedules.c: property tests of the analytic
 * configurator.  Usage: test_schedules TMPDIR, or test_schedules --fake-cuda
 * with testsuite/configurator/fake_cuda.c loadable as libcuda.so.1 (run.sh
 * arranges it).  Prints one 'PASS: configurator :: NAME' or
 * 'FAIL: configurator :: NAME' line per test. */
#define _POSIX_C_SOURCE 200809L
#include "../../configurator/device.h"
#include "../../configurator/gemm.h"
#include "../../configurator/kernel.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_failures;

static void report(const char *name, int bad, const char *detail)
{
    if (bad) {
        printf("FAIL: configurator :: %s\n", name);
        if (detail && detail[0]) printf("  %s\n", detail);
        g_failures++;
    } else {
        printf("PASS: configurator :: %s\n", name);
    }
}

/* xorshift64*: deterministic across platforms. */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1Dull;
}

/* Dimension in 1..16384: half log-uniform, a quarter multiples of 64, a quarter edges. */
static int64_t rand_dim(void)
{
    uint64_t r = rng_next();
    switch (r % 4) {
    case 0: case 1: {
        int e = (int)((r >> 8) % 15); /* 2^0 .. 2^14 */
        int64_t lo = (int64_t)1 << e;
        return lo + (int64_t)((r >> 16) % (uint64_t)lo); /* lo .. 2lo-1 */
    }
    case 2: return 64 * (int64_t)(1 + (r >> 8) % 256);
    default: {
        static const int64_t edge[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 65, 127, 129,
                                       255, 257, 1000, 4095, 4097, 16383, 16384};
        return edge[(r >> 8) % (sizeof edge / sizeof edge[0])];
    }
    }
}

#define NSHAPES 4000
static int64_t g_shapes[NSHAPES][3];

/* Returns non-zero and fills msg if the schedule breaks a limit. */
static int check_gpu(const cfg_device *d, int64_t M, int64_t N, int64_t K, int b, bool tcreq,
                     const cfg_gemm_schedule *s, char *msg, size_t n)
{
#define REQ(cond)                                                                        \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            snprintf(msg, n, "%s M=%" PRId64 " N=%" PRId64 " K=%" PRId64 " b=%d: %s [%s]", \
                     d->name, M, N, K, b, #cond, s->reason);                              \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)
    REQ(s->ok);
    REQ(s->threads >= 32 && s->threads <= d->max_threads_per_block);
    REQ(s->warps * 32 == s->threads);
    REQ(s->wm * s->wn == s->warps);
    REQ(s->wm * s->warp_tile_m == s->bm && s->wn * s->warp_tile_n == s->bn);
    REQ(s->smem_bytes == (int64_t)s->stages * (s->bm + s->bn) * s->bk * b);
    REQ(s->smem_bytes <= d->smem_per_block_optin);
    REQ(s->regs_per_thread >= 1 && s->regs_per_thread <= d->max_regs_per_thread);
    REQ(s->tiles_m * s->bm >= M && (s->tiles_m - 1) * s->bm < M);
    REQ(s->tiles_n * s->bn >= N && (s->tiles_n - 1) * s->bn < N);
    REQ(s->tiles == s->tiles_m * s->tiles_n);
    REQ(s->bk >= 1 && s->k_tiles * s->bk >= K && (s->k_tiles - 1) * s->bk < K);
    REQ(s->split_k >= 1 && s->split_k <= s->k_tiles);
    REQ((int64_t)s->split_k * s->k_tiles_per_split >= s->k_tiles);
    REQ((int64_t)(s->split_k - 1) * s->k_tiles_per_split < s->k_tiles);
    REQ(s->tiles * s->split_k >= d->sm_count || s->k_tiles_per_split == 1 || s->tiles >= d->sm_count);
    REQ(s->stages >= 1 && s->stages <= 4);
    REQ(s->blocks_per_sm >= 1 && s->blocks_per_sm <= d->max_blocks_per_sm);
    REQ((int64_t)s->blocks_per_sm * s->threads <= d->max_threads_per_sm);
    REQ((int64_t)s->blocks_per_sm * s->regs_per_thread * s->threads <= d->regs_per_sm);
    REQ((int64_t)s->blocks_per_sm * s->smem_bytes <= d->smem_per_sm);
    REQ(s->waves >= 1 && s->wave_efficiency > 0 && s->wave_efficiency <= 1.0 + 1e-12);
    REQ(s->waves * d->sm_count * s->blocks_per_sm >= s->tiles * s->split_k);
    REQ(s->arith_intensity > 0);
    bool want_tc = tcreq && (b == 2 ? d->has_mma_sync_f16 : d->has_mma_sync_tf32);
    REQ(want_tc == (s->mma != CFG_MMA_NONE));
    if (s->mma != CFG_MMA_NONE) {
        REQ(s->bk % s->mma_k == 0);
        REQ(s->warp_tile_m % s->mma_m == 0 && s->warp_tile_n % s->mma_n == 0);
        REQ(s->mma == (b == 2 ? CFG_MMA_M16N8K16 : CFG_MMA_M16N8K8));
    }
    REQ(s->reason[0] != 0);
    return 0;
#undef REQ
}

static void test_gpu_properties(void)
{
    const char *names[32];
    int nd = cfg_device_list(names, 32);
    static const struct { const char *tag; int b; bool tc; } variants[] = {
        {"f16-mma", 2, true}, {"tf32-mma", 4, true}, {"f32-fma", 4, false}, {"f16-fma", 2, false},
    };
    for (int i = 0; i < nd; i++) {
        const cfg_device *d = cfg_device_find(names[i]);
        char err[256] = "";
        char name[96];
        snprintf(name, sizeof name, "device/%s/valid", names[i]);
        report(name, !d || cfg_device_validate(d, err, sizeof err) != 0, err);
        if (!d) continue;
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            char msg[512] = "";
            int bad = 0;
            for (int k = 0; k < NSHAPES && !bad; k++) {
                int64_t M = g_shapes[k][0], N = g_shapes[k][1], K = g_shapes[k][2];
                cfg_gemm_schedule s = cfg_gemm(d, M, N, K, variants[v].b, variants[v].tc);
                bad = check_gpu(d, M, N, K, variants[v].b, variants[v].tc, &s, msg, sizeof msg);
            }
            snprintf(name, sizeof name, "gemm/%s/%s", names[i], variants[v].tag);
            report(name, bad, msg);
        }
    }
}

static int check_cpu_device(const cfg_device *d, char *msg, size_t n)
{
    for (int k = 0; k < NSHAPES; k++) {
        int64_t M = g_shapes[k][0], N = g_shapes[k][1], K = g_shapes[k][2];
        for (int b = 2; b <= 4; b += 2) {
            cfg_gemm_cpu_schedule s = cfg_gemm_cpu(d, M, N, K, b);
            int64_t outer = d->l3_bytes > 0 ? d->l3_bytes : d->l2_bytes;
            const char *why = NULL;
            if (!s.ok) why = "not ok";
            else if (s.lanes * b * 8 != d->vector_bits) why = "lanes";
            else if (s.nr % s.lanes) why = "nr not whole vectors";
            else if (s.mr * (s.nr / s.lanes) + s.nr / s.lanes + 1 > d->vector_regs) why = "register block exceeds vector registers";
            else if (s.kc < 1 || s.kc > K) why = "kc range";
            else if (s.kc > 512) why = "kc above 512";
            else if (s.l1_use != s.kc * s.mr * b || s.l1_use > d->l1d_bytes * 7 / 8) why = "A micro-panel exceeds 7/8 of L1";
            else if (s.mc < s.mr || s.mc % s.mr) why = "mc not a multiple of mr";
            else if (s.l2_use != s.mc * s.kc * b || s.l2_use > d->l2_bytes / 2) why = "A block exceeds half of L2";
            else if (s.nc < s.nr || s.nc % s.nr) why = "nc not a multiple of nr";
            else if (s.l3_use != s.kc * s.nc * b || s.l3_use > outer / 2) why = "B panel exceeds half of L3";
            else if (s.mc > M + s.mr - 1 || s.nc > N + s.nr - 1) why = "block larger than the problem";
            if (why) {
                snprintf(msg, n, "%s M=%" PRId64 " N=%" PRId64 " K=%" PRId64 " b=%d: %s", d->name, M, N, K, b, why);
                return 1;
            }
        }
    }
    return 0;
}

static cfg_device mk_cpu(const char *name, int cores, int vbits, int vregs, int64_t l1, int64_t l2, int64_t l3)
{
    cfg_device d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "%s", name);
    d.kind = CFG_DEV_CPU;
    d.cores = cores; d.vector_bits = vbits; d.vector_regs = vregs;
    d.l1d_bytes = l1; d.l2_bytes = l2; d.l3_bytes = l3; d.fma_units = 2;
    return d;
}

static void test_cpu_properties(void)
{
    char err[256] = "", msg[512] = "";
    cfg_device host;
    int rc = cfg_device_host(&host, err, sizeof err);
    report("device/host", rc != 0, err);
    if (rc == 0) {
        printf("  host: %d cores, %d-bit vectors, L1d %" PRId64 " L2 %" PRId64 " L3 %" PRId64 "\n",
               host.cores, host.vector_bits, host.l1d_bytes, host.l2_bytes, host.l3_bytes);
        report("gemm-cpu/host", check_cpu_device(&host, msg, sizeof msg), msg);
    }
    /* Synthetic hosts spanning the register and cache range. */
    cfg_device syn[] = {
        mk_cpu("avx512-like", 32, 512, 32, 48 << 10, 2 << 20, 32 << 20),
        mk_cpu("avx2-like", 8, 256, 16, 32 << 10, 256 << 10, 8 << 20),
        mk_cpu("neon-like", 64, 128, 32, 64 << 10, 1 << 20, 0),
        mk_cpu("tiny", 1, 512, 8, 1024, 1024, 0),
    };
    for (size_t i = 0; i < sizeof syn / sizeof syn[0]; i++) {
        char name[96];
        msg[0] = 0;
        int bad = cfg_device_validate(&syn[i], msg, sizeof msg) != 0;
        if (!bad) bad = check_cpu_device(&syn[i], msg, sizeof msg);
        snprintf(name, sizeof name, "gemm-cpu/%.63s", syn[i].name);
        report(name, bad, msg);
    }
}

/* ---- device files ---- */

static cJSON *device_json(const cfg_device *d)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", "test-gpu");
    cJSON_AddStringToObject(o, "kind", "gpu");
    cJSON_AddNumberToObject(o, "sm_count", d->sm_count);
    cJSON_AddNumberToObject(o, "max_threads_per_block", d->max_threads_per_block);
    cJSON_AddNumberToObject(o, "max_threads_per_sm", d->max_threads_per_sm);
    cJSON_AddNumberToObject(o, "max_blocks_per_sm", d->max_blocks_per_sm);
    cJSON_AddNumberToObject(o, "regs_per_sm", d->regs_per_sm);
    cJSON_AddNumberToObject(o, "max_regs_per_thread", d->max_regs_per_thread);
    cJSON_AddNumberToObject(o, "smem_per_sm", (double)d->smem_per_sm);
    cJSON_AddNumberToObject(o, "smem_per_block", (double)d->smem_per_block);
    cJSON_AddNumberToObject(o, "smem_per_block_optin", (double)d->smem_per_block_optin);
    cJSON_AddNumberToObject(o, "l2_bytes", (double)d->l2_bytes);
    cJSON_AddNumberToObject(o, "mem_bw_gbs", d->mem_bw_gbs);
    cJSON_AddNumberToObject(o, "peak_tflops_fp32", d->peak_tflops_fp32);
    cJSON_AddNumberToObject(o, "peak_tflops_tf32", d->peak_tflops_tf32);
    cJSON_AddNumberToObject(o, "peak_tflops_fp16", d->peak_tflops_fp16);
    cJSON_AddNumberToObject(o, "peak_tflops_bf16", d->peak_tflops_bf16);
    cJSON_AddNumberToObject(o, "cc_major", d->cc_major);
    cJSON_AddNumberToObject(o, "cc_minor", d->cc_minor);
    cJSON_AddBoolToObject(o, "has_mma_sync_f16", d->has_mma_sync_f16);
    cJSON_AddBoolToObject(o, "has_mma_sync_bf16", d->has_mma_sync_bf16);
    cJSON_AddBoolToObject(o, "has_mma_sync_tf32", d->has_mma_sync_tf32);
    cJSON_AddBoolToObject(o, "has_wgmma", d->has_wgmma);
    return o;
}

static int write_json(const char *path, cJSON *o)
{
    char *txt = cJSON_Print(o);
    FILE *f = fopen(path, "w");
    int rc = -1;
    if (f && txt) rc = fputs(txt, f) < 0 ? -1 : 0;
    if (f) fclose(f);
    free(txt);
    return rc;
}

/* Loads o from a file; expects rejection naming `field` (NULL: expects success). */
static void file_case(const char *dir, const char *name, cJSON *o, const char *field)
{
    char path[512], err[256] = "", msg[400] = "";
    snprintf(path, sizeof path, "%s/cfg_device_%d.json", dir, (int)(rng_next() % 1000000));
    if (write_json(path, o)) { report(name, 1, "cannot write temporary file"); return; }
    cfg_device d;
    int rc = cfg_device_load(path, &d, err, sizeof err);
    remove(path);
    int bad;
    if (!field) {
        bad = rc != 0;
        snprintf(msg, sizeof msg, "unexpected error: %s", err);
    } else {
        char quoted[96];
        snprintf(quoted, sizeof quoted, "'%s'", field);
        bad = rc == 0 || !strstr(err, quoted);
        snprintf(msg, sizeof msg, "expected an error naming %s, got rc=%d '%s'", quoted, rc, err);
    }
    report(name, bad, bad ? msg : NULL);
    if (!bad && field) printf("  rejected: %s\n", err);
}

static void test_device_files(const char *dir)
{
    const cfg_device *h = cfg_device_find("h100");
    cJSON *o;

    o = device_json(h);
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/cfg_device_valid.json", dir);
    int bad = write_json(path, o) != 0;
    cfg_device d;
    if (!bad) bad = cfg_device_load(path, &d, err, sizeof err) != 0;
    remove(path);
    if (!bad) { /* same limits give the same schedule as the built-in entry */
        cfg_gemm_schedule a = cfg_gemm(h, 4096, 4096, 4096, 2, true), c = cfg_gemm(&d, 4096, 4096, 4096, 2, true);
        bad = a.bm != c.bm || a.bn != c.bn || a.bk != c.bk || a.stages != c.stages || a.split_k != c.split_k;
        if (bad) snprintf(err, sizeof err, "loaded device schedules differently from h100");
    }
    report("file/valid-gpu", bad, err);
    cJSON_Delete(o);

    cJSON *cpu = cJSON_CreateObject();
    cJSON_AddStringToObject(cpu, "name", "test-cpu");
    cJSON_AddStringToObject(cpu, "kind", "cpu");
    cJSON_AddNumberToObject(cpu, "cores", 16);
    cJSON_AddNumberToObject(cpu, "vector_bits", 512);
    cJSON_AddNumberToObject(cpu, "vector_regs", 32);
    cJSON_AddNumberToObject(cpu, "l1d_bytes", 49152);
    cJSON_AddNumberToObject(cpu, "l2_bytes", 2097152);
    cJSON_AddNumberToObject(cpu, "l3_bytes", 33554432);
    cJSON_AddNumberToObject(cpu, "fma_units", 2);
    cJSON_AddNumberToObject(cpu, "mem_bw_gbs", 200);
    cJSON_AddNumberToObject(cpu, "peak_tflops_fp32", 3.0);
    cJSON_AddNumberToObject(cpu, "peak_tflops_tf32", 0);
    cJSON_AddNumberToObject(cpu, "peak_tflops_fp16", 0);
    cJSON_AddNumberToObject(cpu, "peak_tflops_bf16", 6.0);
    file_case(dir, "file/valid-cpu", cpu, NULL);
    cJSON_DeleteItemFromObjectCaseSensitive(cpu, "l1d_bytes");
    file_case(dir, "file/cpu-missing-l1d", cpu, "l1d_bytes");
    cJSON_Delete(cpu);

    o = device_json(h);
    cJSON_DeleteItemFromObjectCaseSensitive(o, "sm_count");
    file_case(dir, "file/missing-field", o, "sm_count");
    cJSON_Delete(o);

    o = device_json(h);
    cJSON_ReplaceItemInObjectCaseSensitive(o, "sm_count", cJSON_CreateNumber(-4));
    file_case(dir, "file/negative-sm-count", o, "sm_count");
    cJSON_Delete(o);

    o = device_json(h);
    cJSON_ReplaceItemInObjectCaseSensitive(o, "smem_per_block", cJSON_CreateNumber(300 * 1024));
    file_case(dir, "file/smem-per-block-exceeds-sm", o, "smem_per_block");
    cJSON_Delete(o);

    o = device_json(h);
    cJSON_ReplaceItemInObjectCaseSensitive(o, "max_threads_per_block", cJSON_CreateNumber(1000));
    file_case(dir, "file/threads-not-multiple-of-32", o, "max_threads_per_block");
    cJSON_Delete(o);

    o = device_json(h);
    cJSON_ReplaceItemInObjectCaseSensitive(o, "regs_per_sm", cJSON_CreateNumber(0));
    file_case(dir, "file/zero-registers", o, "regs_per_sm");
    cJSON_Delete(o);

    o = device_json(h);
    cJSON_ReplaceItemInObjectCaseSensitive(o, "has_wgmma", cJSON_CreateString("yes"));
    file_case(dir, "file/bool-type", o, "has_wgmma");
    cJSON_Delete(o);

    o = device_json(h);
    cJSON_ReplaceItemInObjectCaseSensitive(o, "smem_per_block_optin", cJSON_CreateNumber(1024 * 1024));
    file_case(dir, "file/optin-exceeds-sm", o, "smem_per_block_optin");
    cJSON_Delete(o);

    /* total_mem_bytes: optional; when present, 0 or a plausible size. */
    o = device_json(h);
    cJSON_AddNumberToObject(o, "total_mem_bytes", 80.0 * 1024 * 1024 * 1024);
    snprintf(path, sizeof path, "%s/cfg_device_mem.json", dir);
    err[0] = 0;
    bad = write_json(path, o) != 0 || cfg_device_load(path, &d, err, sizeof err) != 0 ||
          d.total_mem_bytes != (int64_t)80 << 30;
    remove(path);
    report("file/total-mem-present", bad, err);
    cJSON_Delete(o);

    o = device_json(h);
    cJSON_AddNumberToObject(o, "total_mem_bytes", 1000);
    file_case(dir, "file/total-mem-implausible", o, "total_mem_bytes");
    cJSON_Delete(o);

    o = device_json(h);
    cJSON_AddNumberToObject(o, "total_mem_bytes", -1);
    file_case(dir, "file/total-mem-negative", o, "total_mem_bytes");
    cJSON_Delete(o);

    o = device_json(h);
    cJSON_AddStringToObject(o, "total_mem_bytes", "80GB");
    file_case(dir, "file/total-mem-type", o, "total_mem_bytes");
    cJSON_Delete(o);

    snprintf(path, sizeof path, "%s/cfg_device_broken.json", dir);
    FILE *f = fopen(path, "w");
    if (f) { fputs("{ \"name\": ", f); fclose(f); }
    err[0] = 0;
    bad = cfg_device_load(path, &d, err, sizeof err) == 0 || !strstr(err, "invalid JSON");
    remove(path);
    report("file/invalid-json", bad, err);
    err[0] = 0;
    bad = cfg_device_load("/nonexistent/cfg_device.json", &d, err, sizeof err) == 0;
    report("file/missing-file", bad, err);
}

/* ---- pointwise and reduction kernels ---- */

static int64_t cdiv64(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* Pointwise n in 1..2^41: half log-uniform, a quarter multiples of 4, a
 * quarter edges around warps, blocks and the 2^31-1 grid limit. */
static int64_t rand_n(void)
{
    uint64_t r = rng_next();
    switch (r % 4) {
    case 0: case 1: {
        int e = (int)((r >> 8) % 41);
        int64_t lo = (int64_t)1 << e;
        return lo + (int64_t)((r >> 16) % (uint64_t)lo);
    }
    case 2: return 4 * (int64_t)(1 + (r >> 8) % (1u << 26));
    default: {
        static const int64_t edge[] = {1, 2, 3, 4, 5, 31, 32, 33, 127, 128, 129, 1023, 1024, 1025,
                                       2147483647LL, 2147483648LL, 2147483649LL,
                                       2147483647LL * 128, 2147483647LL * 128 + 1, 2147483647LL * 1024 + 1,
                                       (int64_t)1 << 40, ((int64_t)1 << 40) + 2};
        return edge[(r >> 8) % (sizeof edge / sizeof edge[0])];
    }
    }
}

/* Reduction extent: log-uniform in 1..2^(maxe+1)-1, or an edge. */
static int64_t rand_ext(int maxe)
{
    uint64_t r = rng_next();
    if (r % 4 == 3) {
        static const int64_t edge[] = {1, 2, 3, 4, 7, 8, 31, 32, 33, 64, 127, 128, 1000, 1024, 4096, 50257, 65536};
        return edge[(r >> 8) % (sizeof edge / sizeof edge[0])];
    }
    int e = (int)((r >> 8) % (uint64_t)(maxe + 1));
    int64_t lo = (int64_t)1 << e;
    return lo + (int64_t)((r >> 16) % (uint64_t)lo);
}

#define NKSHAPES 4000
static int64_t g_pw_n[NKSHAPES];
static int64_t g_red[NKSHAPES][2];

/* Is v the widest of 4, 2 that is <= 16 bytes and divides count (else 1)? */
static int widest_vec(int64_t count, int b)
{
    for (int v = 4; v > 1; v /= 2)
        if (v * b <= 16 && count % v == 0) return v;
    return 1;
}

/* blocks_per_sm respects every SM limit, and one more block would break one. */
static int bps_consistent(const cfg_device *d, int threads, int64_t smem, int bps)
{
    int64_t reserve = d->cc_major >= 8 ? 1024 : 0;
    for (int k = 0; k < 2; k++) {
        int64_t b = bps + k;
        int fits = b <= d->max_blocks_per_sm && b * threads <= d->max_threads_per_sm &&
                   b * threads * CFG_KERNEL_REGS <= d->regs_per_sm && b * (smem + reserve) <= d->smem_per_sm;
        if (k == 0 && (!fits || bps < 1)) return 0;
        if (k == 1 && fits) return 0;
    }
    return 1;
}

#define KREQ(cond)                                                                       \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            snprintf(msg, len, "%s %s b=%d: %s [%s]", d->name, what, b, #cond, s->reason); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

static int check_pointwise(const cfg_device *d, int64_t n, int b, bool av, const cfg_pointwise_schedule *s,
                           bool builtin, char *msg, size_t len)
{
    char what[64];
    snprintf(what, sizeof what, "n=%" PRId64 " vector=%d", n, av);
    KREQ(s->ok);
    KREQ(s->reason[0] != 0);
    KREQ(s->n == n);
    KREQ(s->vec == (av ? widest_vec(n, b) : 1));
    KREQ(s->vec * b <= 16 || s->vec == 1);
    KREQ(n % s->vec == 0);
    KREQ(s->threads >= 32 && s->threads % 32 == 0 && s->threads <= d->max_threads_per_block);
    KREQ(s->grid >= 1 && s->grid <= CFG_GRID_MAX);
    KREQ(s->per_thread >= 1);
    int64_t span = s->grid * s->threads * s->vec;   /* elements per grid-stride step, <= 2^43 */
    KREQ(s->per_thread >= cdiv64(n, span));         /* grid*threads*vec*per_thread >= n */
    KREQ(s->per_thread == cdiv64(n, span));         /* and no extra iteration */
    KREQ((s->grid - 1) * s->threads * s->vec < n);  /* every block has work */
    int64_t blocks = cdiv64(n / s->vec, s->threads);
    if (!av && cdiv64(n, s->threads) <= CFG_GRID_MAX)
        KREQ(s->per_thread == 1 && s->grid == cdiv64(n, s->threads));
    int64_t cap = (int64_t)d->sm_count * s->blocks_per_sm * CFG_POINTWISE_WAVES;
    if (cap > CFG_GRID_MAX) cap = CFG_GRID_MAX;
    if (av) KREQ(s->grid == (blocks < cap ? blocks : cap));
    KREQ(bps_consistent(d, s->threads, 0, s->blocks_per_sm));
    /* a full-size block fills the SM (built-in devices) */
    if (builtin && n / s->vec >= 1024) KREQ((int64_t)s->blocks_per_sm * s->threads == d->max_threads_per_sm);
    return 0;
}

/* ROW: cfg_row's schedule (vec 1, a warp per row at most, no shared memory). */
static int check_reduce(const cfg_device *d, int64_t rows, int64_t cols, int b, bool row, const cfg_reduce_schedule *s,
                        char *msg, size_t len)
{
    char what[64];
    snprintf(what, sizeof what, "rows=%" PRId64 " cols=%" PRId64, rows, cols);
    KREQ(s->ok);
    KREQ(s->reason[0] != 0);
    KREQ(s->rows == rows && s->cols == cols);
    KREQ(s->vec == (row ? 1 : widest_vec(cols, b)));
    KREQ(cols % s->vec == 0);
    int tpr = s->threads_per_row;
    if (row) KREQ(tpr <= 32 && s->smem_bytes == 0);
    KREQ(tpr >= 1 && tpr <= 1024 && (tpr & (tpr - 1)) == 0);
    KREQ(tpr <= d->max_threads_per_block);
    KREQ((int64_t)tpr * s->vec <= cols);            /* every thread of a row has an access */
    KREQ(tpr <= 32 || s->rows_per_block == 1);      /* a (sub-)warp group, or a block per row */
    KREQ(s->rows_per_block >= 1);
    KREQ(s->threads == tpr * s->rows_per_block);
    KREQ(s->threads >= 32 && s->threads % 32 == 0 && s->threads <= d->max_threads_per_block);
    KREQ(s->grid >= 1 && s->grid <= CFG_GRID_MAX);
    KREQ(s->grid * s->rows_per_block >= rows);       /* every row covered */
    KREQ((s->grid - 1) * s->rows_per_block < rows);  /* no empty block */
    int64_t acc = b > 4 ? 8 : 4;
    KREQ(s->smem_bytes == (tpr > 32 ? (int64_t)(tpr / 32) * acc : 0));
    KREQ(s->smem_bytes <= d->smem_per_block && s->smem_bytes <= d->smem_per_block_optin);
    KREQ(bps_consistent(d, s->threads, s->smem_bytes, s->blocks_per_sm));
    if (rows < d->sm_count && tpr > 32 && cols / s->vec > tpr) KREQ(strstr(s->reason, "split") != NULL);
    return 0;
}

static int check_pointwise_cpu(const cfg_device *d, int64_t n, int b, const cfg_pointwise_cpu_schedule *s,
                               char *msg, size_t len)
{
    char what[64];
    snprintf(what, sizeof what, "n=%" PRId64, n);
    int64_t min_chunk = CFG_CPU_MIN_CHUNK_BYTES / b;
    KREQ(s->ok);
    KREQ(s->reason[0] != 0);
    KREQ(s->n == n);
    KREQ(s->threads >= 1 && s->threads <= d->cores);
    KREQ(s->threads == 1 || s->threads <= n / min_chunk); /* >= 16 KiB per thread */
    KREQ((int64_t)s->lanes * 8 * b == d->vector_bits);
    KREQ(s->chunk >= 1);
    /* threads * chunk >= n > (threads - 1) * chunk, without overflowing int64 */
    KREQ((s->threads - 1) * s->chunk < n && n - (s->threads - 1) * s->chunk <= s->chunk);
    if (s->threads > 1) {
        int64_t align = s->lanes > 64 / b ? s->lanes : 64 / b;
        KREQ(s->chunk % align == 0 && s->chunk % s->lanes == 0);
        KREQ(s->chunk >= min_chunk);
    }
    return 0;
}

static int check_reduce_cpu(const cfg_device *d, int64_t rows, int64_t cols, int b,
                            const cfg_reduce_cpu_schedule *s, char *msg, size_t len)
{
    char what[64];
    snprintf(what, sizeof what, "rows=%" PRId64 " cols=%" PRId64, rows, cols);
    int64_t min_chunk = CFG_CPU_MIN_CHUNK_BYTES / b;
    KREQ(s->ok);
    KREQ(s->reason[0] != 0);
    KREQ(s->rows == rows && s->cols == cols);
    KREQ(s->threads >= 1 && s->threads <= d->cores && s->threads <= rows);
    KREQ(s->rows_per_thread >= 1);
    KREQ(s->threads * s->rows_per_thread >= rows && (s->threads - 1) * s->rows_per_thread < rows);
    KREQ(s->threads == 1 || s->rows_per_thread * cols >= min_chunk); /* >= 16 KiB per thread */
    KREQ((int64_t)s->lanes * 8 * b == d->vector_bits);
    KREQ(s->accumulators >= 1 && s->accumulators <= d->fma_units * 4);
    KREQ(s->accumulators == 1 || s->accumulators <= d->vector_regs / 2);
    KREQ(s->accumulators == 1 || s->accumulators <= cols / s->lanes);
    return 0;
}
#undef KREQ

static const int k_elem[] = {1, 2, 4, 8};
#define NELEM ((int)(sizeof k_elem / sizeof k_elem[0]))

/* Synthetic GPUs whose shared memory, registers or odd thread limits decide
 * the occupancy, which no built-in model does for these small kernels. */
static cfg_device mk_gpu(const char *name, int sms, int tpb, int tpsm, int bpsm, int regs, int64_t smem_sm,
                         int64_t smem_blk, int64_t optin, int ccmaj)
{
    cfg_device d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "%s", name);
    d.kind = CFG_DEV_GPU;
    d.sm_count = sms; d.max_threads_per_block = tpb; d.max_threads_per_sm = tpsm; d.max_blocks_per_sm = bpsm;
    d.regs_per_sm = regs; d.max_regs_per_thread = regs / 32 < 255 ? regs / 32 : 255;
    d.smem_per_sm = smem_sm; d.smem_per_block = smem_blk; d.smem_per_block_optin = optin;
    d.cc_major = ccmaj; d.l2_bytes = 1 << 20; d.mem_bw_gbs = 100; d.peak_tflops_fp32 = 1;
    return d;
}

static void test_kernel_gpu(void)
{
    const char *names[32];
    int nd = cfg_device_list(names, 32);
    cfg_device syn[] = {
        mk_gpu("tiny-gpu", 2, 256, 768, 4, 16384, 4 << 10, 2 << 10, 3 << 10, 8),
        mk_gpu("odd-gpu", 7, 512, 1536, 8, 32768, 64 << 10, 48 << 10, 48 << 10, 7),
    };
    int nsyn = (int)(sizeof syn / sizeof syn[0]);
    for (int i = 0; i < nd + nsyn; i++) {
        const cfg_device *d = i < nd ? cfg_device_find(names[i]) : &syn[i - nd];
        char name[96], msg[512] = "";
        if (i < nd) {
            snprintf(name, sizeof name, "device/%s/total-mem", names[i]);
            report(name, !d || d->total_mem_bytes < ((int64_t)1 << 30), "total_mem_bytes missing");
        } else {
            snprintf(name, sizeof name, "device/%s/valid", d->name);
            report(name, cfg_device_validate(d, msg, sizeof msg) != 0, msg);
        }
        if (!d) continue;
        for (int av = 1; av >= 0; av--) {
            int bad = 0;
            msg[0] = 0;
            for (int k = 0; k < NKSHAPES && !bad; k++)
                for (int e = 0; e < NELEM && !bad; e++) {
                    cfg_pointwise_schedule s = cfg_pointwise(d, g_pw_n[k], k_elem[e], av);
                    bad = check_pointwise(d, g_pw_n[k], k_elem[e], av, &s, i < nd, msg, sizeof msg);
                }
            snprintf(name, sizeof name, "pointwise/%s/%s", d->name, av ? "vector" : "scalar");
            report(name, bad, msg);
        }
        for (int row = 0; row < 2; row++) { /* cfg_reduce, then cfg_row (the row kernels') */
            int bad = 0;
            msg[0] = 0;
            for (int k = 0; k < NKSHAPES && !bad; k++)
                for (int e = 0; e < NELEM && !bad; e++) {
                    cfg_reduce_schedule s = (row ? cfg_row : cfg_reduce)(d, g_red[k][0], g_red[k][1], k_elem[e]);
                    bad = check_reduce(d, g_red[k][0], g_red[k][1], k_elem[e], row, &s, msg, sizeof msg);
                }
            snprintf(name, sizeof name, "%s/%s", row ? "row" : "reduce", d->name);
            report(name, bad, msg);
        }
    }
}

static void test_kernel_cpu(void)
{
    cfg_device cpus[6];
    int nc = 0;
    char err[256] = "";
    if (cfg_device_host(&cpus[nc], err, sizeof err) == 0) nc++;
    cpus[nc++] = mk_cpu("avx512-like", 32, 512, 32, 48 << 10, 2 << 20, 32 << 20);
    cpus[nc++] = mk_cpu("avx2-like", 8, 256, 16, 32 << 10, 256 << 10, 8 << 20);
    cpus[nc++] = mk_cpu("neon-like", 64, 128, 32, 64 << 10, 1 << 20, 0);
    cpus[nc++] = mk_cpu("sve2048-like", 48, 2048, 32, 64 << 10, 1 << 20, 0);
    cpus[nc++] = mk_cpu("tiny", 1, 512, 8, 1024, 1024, 0); /* 8 registers cap the accumulators at 4 */
    for (int i = 0; i < nc; i++) {
        const cfg_device *d = &cpus[i];
        char name[96], msg[512] = "";
        int bad = 0;
        for (int k = 0; k < NKSHAPES && !bad; k++)
            for (int e = 0; e < NELEM && !bad; e++) {
                cfg_pointwise_cpu_schedule s = cfg_pointwise_cpu(d, g_pw_n[k], k_elem[e]);
                bad = check_pointwise_cpu(d, g_pw_n[k], k_elem[e], &s, msg, sizeof msg);
            }
        snprintf(name, sizeof name, "pointwise-cpu/%.63s", d->name);
        report(name, bad, msg);
        bad = 0;
        msg[0] = 0;
        for (int k = 0; k < NKSHAPES && !bad; k++)
            for (int e = 0; e < NELEM && !bad; e++) {
                cfg_reduce_cpu_schedule s = cfg_reduce_cpu(d, g_red[k][0], g_red[k][1], k_elem[e]);
                bad = check_reduce_cpu(d, g_red[k][0], g_red[k][1], k_elem[e], &s, msg, sizeof msg);
            }
        snprintf(name, sizeof name, "reduce-cpu/%.63s", d->name);
        report(name, bad, msg);
    }
}

/* Every invalid argument gives ok == false and a reason; never a crash. */
static void test_kernel_invalid(void)
{
    const cfg_device *g = cfg_device_find("h100");
    cfg_device cpu = mk_cpu("avx2-like", 8, 256, 16, 32 << 10, 256 << 10, 8 << 20);
    cfg_device broken_gpu = *g, broken_cpu = cpu;
    broken_gpu.max_threads_per_block = 0;
    broken_cpu.cores = 0;
    const cfg_device *gpus[] = {NULL, &cpu, &broken_gpu};
    const cfg_device *cpus[] = {NULL, g, &broken_cpu};
    static const int64_t bad_n[] = {0, -1, INT64_MIN};
    static const int bad_b[] = {0, 3, 16, -4};
    int bad_pw = 0, bad_red = 0, bad_pwc = 0, bad_redc = 0;
    char first[4][256] = {"", "", "", ""};
#define EXPECT_FAIL(type, flag, idx, call)                                            \
    do {                                                                              \
        type s_ = (call);                                                             \
        if (s_.ok || !s_.reason[0] || strchr(s_.reason, '\n')) {                      \
            if (!flag) snprintf(first[idx], sizeof first[idx], "%s -> ok=%d '%s'", #call, s_.ok, s_.reason); \
            flag = 1;                                                                 \
        }                                                                             \
    } while (0)
    for (size_t i = 0; i < 3; i++) {
        EXPECT_FAIL(cfg_pointwise_schedule, bad_pw, 0, cfg_pointwise(gpus[i], 1000, 4, true));
        EXPECT_FAIL(cfg_pointwise_schedule, bad_pw, 0, cfg_pointwise(gpus[i], 1000, 4, false));
        EXPECT_FAIL(cfg_reduce_schedule, bad_red, 1, cfg_reduce(gpus[i], 10, 10, 4));
        EXPECT_FAIL(cfg_pointwise_cpu_schedule, bad_pwc, 2, cfg_pointwise_cpu(cpus[i], 1000, 4));
        EXPECT_FAIL(cfg_reduce_cpu_schedule, bad_redc, 3, cfg_reduce_cpu(cpus[i], 10, 10, 4));
    }
    for (size_t i = 0; i < sizeof bad_n / sizeof bad_n[0]; i++) {
        EXPECT_FAIL(cfg_pointwise_schedule, bad_pw, 0, cfg_pointwise(g, bad_n[i], 4, true));
        EXPECT_FAIL(cfg_pointwise_schedule, bad_pw, 0, cfg_pointwise(g, bad_n[i], 4, false));
        EXPECT_FAIL(cfg_reduce_schedule, bad_red, 1, cfg_reduce(g, bad_n[i], 10, 4));
        EXPECT_FAIL(cfg_reduce_schedule, bad_red, 1, cfg_reduce(g, 10, bad_n[i], 4));
        EXPECT_FAIL(cfg_pointwise_cpu_schedule, bad_pwc, 2, cfg_pointwise_cpu(&cpu, bad_n[i], 4));
        EXPECT_FAIL(cfg_reduce_cpu_schedule, bad_redc, 3, cfg_reduce_cpu(&cpu, bad_n[i], 10, 4));
        EXPECT_FAIL(cfg_reduce_cpu_schedule, bad_redc, 3, cfg_reduce_cpu(&cpu, 10, bad_n[i], 4));
    }
    for (size_t i = 0; i < sizeof bad_b / sizeof bad_b[0]; i++) {
        EXPECT_FAIL(cfg_pointwise_schedule, bad_pw, 0, cfg_pointwise(g, 1000, bad_b[i], true));
        EXPECT_FAIL(cfg_reduce_schedule, bad_red, 1, cfg_reduce(g, 10, 10, bad_b[i]));
        EXPECT_FAIL(cfg_pointwise_cpu_schedule, bad_pwc, 2, cfg_pointwise_cpu(&cpu, 1000, bad_b[i]));
        EXPECT_FAIL(cfg_reduce_cpu_schedule, bad_redc, 3, cfg_reduce_cpu(&cpu, 10, 10, bad_b[i]));
    }
#undef EXPECT_FAIL
    report("invalid/pointwise", bad_pw, first[0]);
    report("invalid/reduce", bad_red, first[1]);
    report("invalid/pointwise-cpu", bad_pwc, first[2]);
    report("invalid/reduce-cpu", bad_redc, first[3]);

    /* Extreme but valid sizes: either a schedule that passes every check, or
     * a refusal with a reason (rows beyond 2^31-1 blocks). */
    char msg[512] = "";
    int bad = 0;
    const char *names[32];
    int nd = cfg_device_list(names, 32);
    for (int i = 0; i < nd && !bad; i++) {
        const cfg_device *d = cfg_device_find(names[i]);
        for (int e = 0; e < NELEM && !bad; e++) {
            int b = k_elem[e];
            for (int av = 0; av < 2 && !bad; av++) {
                cfg_pointwise_schedule s = cfg_pointwise(d, INT64_MAX, b, av);
                bad = check_pointwise(d, INT64_MAX, b, av, &s, true, msg, sizeof msg);
            }
            cfg_reduce_schedule r = cfg_reduce(d, 1, INT64_MAX, b);
            if (!bad) bad = check_reduce(d, 1, INT64_MAX, b, false, &r, msg, sizeof msg);
            r = cfg_row(d, 1, INT64_MAX, b);
            if (!bad) bad = check_reduce(d, 1, INT64_MAX, b, true, &r, msg, sizeof msg);
            r = cfg_reduce(d, INT64_MAX, 1, b);
            if (!bad && (r.ok || !r.reason[0])) {
                bad = 1;
                snprintf(msg, sizeof msg, "%s: INT64_MAX rows accepted or no reason", d->name);
            }
        }
    }
    cfg_pointwise_cpu_schedule pc = cfg_pointwise_cpu(&cpu, INT64_MAX, 1);
    if (!bad) bad = check_pointwise_cpu(&cpu, INT64_MAX, 1, &pc, msg, sizeof msg);
    cfg_reduce_cpu_schedule rc = cfg_reduce_cpu(&cpu, INT64_MAX, INT64_MAX, 8);
    if (!bad && (!rc.ok || rc.threads != cpu.cores)) { bad = 1; snprintf(msg, sizeof msg, "cpu INT64_MAX^2: %s", rc.reason); }
    report("extreme/int64-max", bad, msg);
}

static void test_summary(void)
{
    char buf[256];
    const char *want = "h100: sm_90, 132 SMs, 228 KiB smem/SM, 50 MiB L2, 80 GiB memory, 3350 GB/s";
    const char *got = cfg_device_summary(cfg_device_find("h100"), buf, sizeof buf);
    char msg[400];
    snprintf(msg, sizeof msg, "got '%s'", got);
    report("summary/h100", strcmp(got, want) != 0, msg);

    const char *names[32];
    int nd = cfg_device_list(names, 32), bad = 0;
    for (int i = 0; i < nd && !bad; i++) {
        got = cfg_device_summary(cfg_device_find(names[i]), buf, sizeof buf);
        bad = strncmp(got, names[i], strlen(names[i])) != 0 || !strstr(got, " SMs, ") || !strstr(got, " GB/s") ||
              strchr(got, '\n') != NULL;
        snprintf(msg, sizeof msg, "got '%s'", got);
    }
    report("summary/gpu-models", bad, msg);

    cfg_device c = mk_cpu("avx2-like", 8, 256, 16, 32 << 10, (5 << 20) / 4, 0);
    want = "avx2-like: 8 cores, 256-bit vectors, L1d 32 KiB, L2 1.25 MiB, no L3";
    got = cfg_device_summary(&c, buf, sizeof buf);
    snprintf(msg, sizeof msg, "got '%s'", got);
    report("summary/cpu", strcmp(got, want) != 0, msg);

    cfg_device host;
    char err[256] = "";
    bad = cfg_device_host(&host, err, sizeof err) != 0;
    if (!bad) {
        got = cfg_device_summary(&host, buf, sizeof buf);
        bad = strncmp(got, "host: ", 6) != 0 || !strstr(got, "-bit vectors");
        snprintf(msg, sizeof msg, "got '%s'", got);
        printf("  %s\n", got);
    }
    report("summary/host", bad, bad ? msg : NULL);

    char small[12];
    memset(small, 'x', sizeof small);
    got = cfg_device_summary(cfg_device_find("rtx6000ada"), small, 8);
    bad = strlen(got) != 7 || small[8] != 'x' || strcmp(cfg_device_summary(NULL, buf, sizeof buf), "(no device)") ||
          strcmp(cfg_device_summary(&c, NULL, 10), "") || strcmp(cfg_device_summary(&c, buf, 0), "");
    report("summary/truncation", bad, "buffer bounds, NULL device or NULL buffer");
}

/* cfg_device_auto_gpu on this machine: without a GPU, -1 and a one-line
 * message; with one, a device that validates. */
static void test_auto_gpu_here(void)
{
    cfg_device g;
    char err[512] = "", msg[600];
    memset(err, 0, sizeof err);
    int rc = cfg_device_auto_gpu(&g, err, sizeof err);
    int bad;
    if (rc == 0) {
        char buf[256];
        bad = g.kind != CFG_DEV_GPU || cfg_device_validate(&g, err, sizeof err) != 0;
        printf("  auto: %s\n", cfg_device_summary(&g, buf, sizeof buf));
    } else {
        bad = rc != -1 || !err[0] || strchr(err, '\n') != NULL;
        printf("  auto: %s\n", err);
    }
    snprintf(msg, sizeof msg, "rc=%d '%s'", rc, err);
    report("auto-gpu/this-machine", bad, bad ? msg : NULL);
}

/* 10,000 random kernels over every device kind; reports the time only. */
static void test_kernel_timing(void)
{
    const char *names[32];
    int nd = cfg_device_list(names, 32);
    cfg_device cpu = mk_cpu("avx512-like", 32, 512, 32, 48 << 10, 2 << 20, 32 << 20);
    struct timespec t0, t1;
    int notok = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 10000; i++) {
        const cfg_device *d = cfg_device_find(names[i % nd]);
        int b = k_elem[(i / nd) % NELEM];
        int64_t n = g_pw_n[i % NKSHAPES], rows = g_red[i % NKSHAPES][0], cols = g_red[i % NKSHAPES][1];
        switch (i % 5) {
        case 0: notok += !cfg_pointwise(d, n, b, true).ok; break;
        case 1: notok += !cfg_pointwise(d, n, b, false).ok; break;
        case 2: notok += !cfg_reduce(d, rows, cols, b).ok; break;
        case 3: notok += !cfg_pointwise_cpu(&cpu, n, b).ok; break;
        default: notok += !cfg_reduce_cpu(&cpu, rows, cols, b).ok; break;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("  timing: 10000 pointwise/reduction schedules in %.3f ms (%.2f us each)\n", ms, ms * 1e3 / 10000);
    char msg[64];
    snprintf(msg, sizeof msg, "%d schedules not ok", notok);
    report("timing/10000-kernels", notok != 0, msg);
}

static void show_kernel_examples(void)
{
    const cfg_device *d = cfg_device_find("h100");
    static const int64_t pw[] = {1000, (int64_t)1 << 24, 3000000001LL};
    for (size_t i = 0; i < sizeof pw / sizeof pw[0]; i++) {
        cfg_pointwise_schedule s = cfg_pointwise(d, pw[i], 4, true);
        printf("  h100 pointwise f32 n=%" PRId64 ": vec %d threads %d grid %" PRId64 " per_thread %" PRId64
               " blocks/SM %d (%s)\n", pw[i], s.vec, s.threads, s.grid, s.per_thread, s.blocks_per_sm, s.reason);
    }
    static const int64_t rd[][2] = {{65536, 64}, {4096, 4096}, {16, 50257}};
    for (size_t i = 0; i < sizeof rd / sizeof rd[0]; i++) {
        cfg_reduce_schedule s = cfg_reduce(d, rd[i][0], rd[i][1], 2);
        printf("  h100 reduce f16 %" PRId64 "x%" PRId64 ": vec %d threads/row %d rows/block %d threads %d grid %"
               PRId64 " smem %" PRId64 " (%s)\n", rd[i][0], rd[i][1], s.vec, s.threads_per_row, s.rows_per_block,
               s.threads, s.grid, s.smem_bytes, s.reason);
    }
    static const int64_t rw[][2] = {{8192, 768}, {8192, 50257}, {32, 16}};
    for (size_t i = 0; i < sizeof rw / sizeof rw[0]; i++) {
        cfg_reduce_schedule s = cfg_row(d, rw[i][0], rw[i][1], 4);
        printf("  h100 row kernel f32 %" PRId64 "x%" PRId64 ": threads/row %d rows/block %d threads %d grid %" PRId64
               " (%s)\n", rw[i][0], rw[i][1], s.threads_per_row, s.rows_per_block, s.threads, s.grid, s.reason);
    }
}

/* ---- cfg_device_auto_gpu against testsuite/configurator/fake_cuda.c ---- */

static int auto_with(const char *mode, const char *index, cfg_device *g, char *err, size_t n)
{
    setenv("FAKE_CUDA", mode, 1);
    if (index) setenv("NOVAC_CUDA_DEVICE", index, 1);
    else unsetenv("NOVAC_CUDA_DEVICE");
    err[0] = 0;
    return cfg_device_auto_gpu(g, err, n);
}

static double rel(double a, double b) { return b != 0 ? (a - b) / b : a; }

static void test_auto_fake(void)
{
    cfg_device g;
    char err[512], msg[700];
    int rc, bad;

    /* H200: limits from the driver, peaks from the built-in table. */
    const cfg_device *h = cfg_device_find("h200");
    rc = auto_with("h200", NULL, &g, err, sizeof err);
    bad = rc != 0 || strcmp(g.name, "auto:NVIDIA H200") != 0 || g.kind != CFG_DEV_GPU || g.sm_count != 132 ||
          g.cc_major != 9 || g.cc_minor != 0 || !g.has_wgmma || !g.has_mma_sync_f16 || !g.has_mma_sync_tf32 ||
          g.smem_per_sm != h->smem_per_sm || g.smem_per_block != h->smem_per_block ||
          g.smem_per_block_optin != h->smem_per_block_optin || g.l2_bytes != h->l2_bytes ||
          g.max_threads_per_sm != h->max_threads_per_sm || g.max_blocks_per_sm != h->max_blocks_per_sm ||
          g.regs_per_sm != h->regs_per_sm || g.max_regs_per_thread != 255 ||
          g.peak_tflops_fp16 != h->peak_tflops_fp16 || g.peak_tflops_fp32 != h->peak_tflops_fp32 ||
          g.total_mem_bytes != 150754820096LL || fabs(rel(g.mem_bw_gbs, h->mem_bw_gbs)) > 0.05;
    if (!bad) {
        cfg_gemm_schedule a = cfg_gemm(h, 4096, 4096, 4096, 2, true), c = cfg_gemm(&g, 4096, 4096, 4096, 2, true);
        bad = a.bm != c.bm || a.bn != c.bn || a.bk != c.bk || a.stages != c.stages || a.blocks_per_sm != c.blocks_per_sm;
    }
    char buf[256];
    snprintf(msg, sizeof msg, "rc=%d err='%s' got %s", rc, err, cfg_device_summary(&g, buf, sizeof buf));
    report("auto-gpu/fake-h200", bad, msg);
    if (rc == 0) printf("  %s\n", cfg_device_summary(&g, buf, sizeof buf));

    /* H100 PCIe: the name says H100 but the SM count does not match the
     * built-in SXM model, so the peaks are estimated; the fp32 estimate is
     * the datasheet's 51.2 TFLOPS (114 SMs x 256 FLOP/clk x 1.755 GHz). */
    rc = auto_with("h100pcie", NULL, &g, err, sizeof err);
    bad = rc != 0 || g.sm_count != 114 || fabs(rel(g.peak_tflops_fp32, 51.2)) > 0.02 ||
          fabs(rel(g.mem_bw_gbs, 2039)) > 0.05 || !g.has_wgmma;
    snprintf(msg, sizeof msg, "rc=%d err='%s' fp32 %.1f bw %.0f", rc, err, g.peak_tflops_fp32, g.mem_bw_gbs);
    report("auto-gpu/fake-h100pcie-estimate", bad, msg);

    /* Unknown sm_100 part: estimated peaks, mma.sync yes, wgmma no. */
    rc = auto_with("future", NULL, &g, err, sizeof err);
    double clk = 1965000 * 1e3;
    bad = rc != 0 || g.has_wgmma || !g.has_mma_sync_bf16 || g.cc_major != 10 ||
          fabs(rel(g.peak_tflops_fp32, 148 * 256 * clk / 1e12)) > 1e-9 ||
          fabs(rel(g.peak_tflops_fp16, 148 * 8192 * clk / 1e12)) > 1e-9 ||
          fabs(rel(g.peak_tflops_tf32, g.peak_tflops_fp16 / 2)) > 1e-9 ||
          fabs(rel(g.mem_bw_gbs, 3996000 * 1e3 * 8192 / 8 * 2 / 1e9)) > 1e-9;
    snprintf(msg, sizeof msg, "rc=%d err='%s' fp32 %.1f fp16 %.1f wgmma %d", rc, err, g.peak_tflops_fp32,
             g.peak_tflops_fp16, g.has_wgmma);
    report("auto-gpu/fake-unknown-model", bad, msg);

    /* Two devices: NOVAC_CUDA_DEVICE picks one, or is refused. */
    const cfg_device *l4 = cfg_device_find("l4");
    rc = auto_with("two", "1", &g, err, sizeof err);
    bad = rc != 0 || strcmp(g.name, "auto:NVIDIA L4") != 0 || g.peak_tflops_fp16 != l4->peak_tflops_fp16 ||
          g.max_blocks_per_sm != 24 || g.has_wgmma;
    snprintf(msg, sizeof msg, "rc=%d err='%s' name '%s'", rc, err, g.name);
    report("auto-gpu/fake-device-index", bad, msg);
    rc = auto_with("two", "7", &g, err, sizeof err);
    bad = rc != -1 || !strstr(err, "NOVAC_CUDA_DEVICE=7") || !strstr(err, "2 devices");
    snprintf(msg, sizeof msg, "rc=%d err='%s'", rc, err);
    report("auto-gpu/fake-index-out-of-range", bad, msg);
    if (!bad) printf("  rejected: %s\n", err);
    rc = auto_with("two", "x1", &g, err, sizeof err);
    bad = rc != -1 || !strstr(err, "NOVAC_CUDA_DEVICE");
    snprintf(msg, sizeof msg, "rc=%d err='%s'", rc, err);
    report("auto-gpu/fake-index-not-a-number", bad, msg);

    /* Driver errors. */
    rc = auto_with("nodevice", NULL, &g, err, sizeof err);
    bad = rc != -1 || !strstr(err, "cuInit failed: CUDA_ERROR_NO_DEVICE");
    snprintf(msg, sizeof msg, "rc=%d err='%s'", rc, err);
    report("auto-gpu/fake-cuinit-fails", bad, msg);
    if (!bad) printf("  rejected: %s\n", err);
    rc = auto_with("zero", NULL, &g, err, sizeof err);
    bad = rc != -1 || strcmp(err, "no CUDA device") != 0;
    snprintf(msg, sizeof msg, "rc=%d err='%s'", rc, err);
    report("auto-gpu/fake-no-device", bad, msg);
    rc = auto_with("noattr", NULL, &g, err, sizeof err);
    bad = rc != -1 || !strstr(err, "MULTIPROCESSOR_COUNT");
    snprintf(msg, sizeof msg, "rc=%d err='%s'", rc, err);
    report("auto-gpu/fake-attribute-refused", bad, msg);
    if (!bad) printf("  rejected: %s\n", err);
}

static void test_timing(void)
{
    const cfg_device *d = cfg_device_find("h100");
    struct timespec t0, t1;
    volatile int64_t sink = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 10000; i++) {
        cfg_gemm_schedule s = cfg_gemm(d, g_shapes[i % NSHAPES][0], g_shapes[i % NSHAPES][1],
                                       g_shapes[i % NSHAPES][2], 2, true);
        sink += s.bm;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("  timing: 10000 GEMM schedules in %.3f ms (%.2f us each)\n", ms, ms * 1e3 / 10000);
    char msg[96];
    snprintf(msg, sizeof msg, "took %.3f ms, limit 100 ms", ms);
    report("timing/10000-gemms", ms >= 100.0 || sink == 0, msg);
}

static void show_examples(void)
{
    static const int64_t ex[][3] = {{4096, 4096, 4096}, {8, 4096, 4096}, {128, 128, 65536 / 4}, {1, 1, 1}};
    const cfg_device *d = cfg_device_find("h100");
    for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
        cfg_gemm_schedule s = cfg_gemm(d, ex[i][0], ex[i][1], ex[i][2], 2, true);
        printf("  h100 f16 %" PRId64 "x%" PRId64 "x%" PRId64 ": tile %dx%dx%d warps %dx%d %s stages %d "
               "split %d blocks/SM %d waves %" PRId64 " eff %.2f AI %.1f (%s)\n",
               ex[i][0], ex[i][1], ex[i][2], s.bm, s.bn, s.bk, s.wm, s.wn, cfg_mma_name(s.mma),
               s.stages, s.split_k, s.blocks_per_sm, s.waves, s.wave_efficiency, s.arith_intensity,
               s.reason);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--fake-cuda") == 0) {
        test_auto_fake();
        printf("%d failed\n", g_failures);
        return g_failures != 0;
    }
    const char *dir = argc > 1 ? argv[1] : ".";
    for (int i = 0; i < NSHAPES; i++)
        for (int j = 0; j < 3; j++) g_shapes[i][j] = rand_dim();
    test_gpu_properties();
    test_cpu_properties();
    test_device_files(dir);
    test_timing();
    show_examples();
    for (int i = 0; i < NKSHAPES; i++) {
        g_pw_n[i] = rand_n();
        g_red[i][0] = rand_ext(24); /* rows up to 2^25 - 1 */
        g_red[i][1] = rand_ext(22); /* cols up to 2^23 - 1 */
    }
    test_kernel_gpu();
    test_kernel_cpu();
    test_kernel_invalid();
    test_summary();
    test_auto_gpu_here();
    test_kernel_timing();
    show_kernel_examples();
    printf("%d failed\n", g_failures);
    return g_failures != 0;
}
