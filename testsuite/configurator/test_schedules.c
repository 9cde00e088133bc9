/* testsuite/configurator/test_schedules.c: property tests of the analytic
 * configurator.  Usage: test_schedules TMPDIR.  Prints one
 * 'PASS: configurator :: NAME' or 'FAIL: configurator :: NAME' line per test. */
#define _POSIX_C_SOURCE 200809L
#include "../../configurator/device.h"
#include "../../configurator/gemm.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
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
            else if (s.l1_use != s.kc * s.nr * b || s.l1_use > d->l1d_bytes / 2) why = "B micro-panel exceeds half of L1";
            else if ((int64_t)s.mr * s.kc * b > d->l1d_bytes / 2) why = "A micro-panel exceeds half of L1";
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
    const char *dir = argc > 1 ? argv[1] : ".";
    for (int i = 0; i < NSHAPES; i++)
        for (int j = 0; j < 3; j++) g_shapes[i][j] = rand_dim();
    test_gpu_properties();
    test_cpu_properties();
    test_device_files(dir);
    test_timing();
    show_examples();
    printf("%d failed\n", g_failures);
    return g_failures != 0;
}
