/* configurator/gemm.c: analytic GEMM schedules; formulas in configurator/README.md. */
#include "gemm.h"

#include <stdio.h>
#include <string.h>

static int64_t cfg_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t cfg_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t cfg_max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t cfg_pow2ceil(int64_t x)
{
    int64_t p = 1;
    while (p < x) p <<= 1;
    return p;
}

const char *cfg_mma_name(cfg_mma m)
{
    switch (m) {
    case CFG_MMA_M16N8K16: return "mma.sync.m16n8k16";
    case CFG_MMA_M16N8K8: return "mma.sync.m16n8k8";
    default: return "fma";
    }
}

/* Arithmetic intensity of the compulsory traffic: 2MNK / ((MK + KN + MN) * bytes). */
static double cfg_intensity(int64_t M, int64_t N, int64_t K, int b)
{
    double m = (double)M, n = (double)N, k = (double)K;
    return 2.0 * m * n * k / ((m * k + k * n + m * n) * b);
}

/* Halve the larger of *bm / *bn that is above its floor; false if neither can shrink. */
static bool cfg_shrink(int *bm, int *bn, int min_m, int min_n)
{
    bool can_m = *bm / 2 >= min_m, can_n = *bn / 2 >= min_n;
    if (can_m && (*bm >= *bn || !can_n)) { *bm /= 2; return true; }
    if (can_n) { *bn /= 2; return true; }
    return false;
}

cfg_gemm_schedule cfg_gemm(const cfg_device *d, int64_t M, int64_t N, int64_t K,
                           int b, bool tensor_cores)
{
    cfg_gemm_schedule s;
    memset(&s, 0, sizeof s);
    if (!d || d->kind != CFG_DEV_GPU) { snprintf(s.reason, sizeof s.reason, "not a GPU device"); return s; }
    if (M < 1 || N < 1 || K < 1) { snprintf(s.reason, sizeof s.reason, "M, N, K must be >= 1"); return s; }
    if (b != 2 && b != 4) { snprintf(s.reason, sizeof s.reason, "dtype_bytes must be 2 or 4"); return s; }

    /* Instruction. */
    s.mma = CFG_MMA_NONE;
    if (tensor_cores && b == 2 && (d->has_mma_sync_f16 || d->has_mma_sync_bf16)) {
        s.mma = CFG_MMA_M16N8K16; s.mma_m = 16; s.mma_n = 8; s.mma_k = 16;
    } else if (tensor_cores && b == 4 && d->has_mma_sync_tf32) {
        s.mma = CFG_MMA_M16N8K8; s.mma_m = 16; s.mma_n = 8; s.mma_k = 8;
    }
    bool tc = s.mma != CFG_MMA_NONE;

    /* Roofline classification. */
    s.arith_intensity = cfg_intensity(M, N, K, b);
    double peak = s.mma == CFG_MMA_M16N8K16 ? d->peak_tflops_fp16
                : s.mma == CFG_MMA_M16N8K8 ? d->peak_tflops_tf32 : d->peak_tflops_fp32;
    s.ridge = d->mem_bw_gbs > 0 ? peak * 1e12 / (d->mem_bw_gbs * 1e9) : 0;
    s.compute_bound = s.arith_intensity >= s.ridge;

    /* Warp-tile bounds: mma warps tile 64x64 down to 16x16 (two m16n8 tiles);
     * FMA warps lay 4x8 threads with a tm x tn thread tile, 32x64 down to 4x8. */
    int max_wtm = tc ? 64 : 32, max_wtn = 64;
    const int min_wtm = tc ? 16 : 4, min_wtn = tc ? 16 : 8;

    /* Initial block tile: 128x128, or 256x128 / 128x256 with a large opt-in
     * shared memory (>= 160 KiB: sm_80, sm_90) and tensor cores. */
    int bm = 128, bn = 128;
    const char *why = "default 128x128 tile";
    if (tc && d->smem_per_block_optin >= 160 * 1024) {
        if (N >= M) bn = 256; else bm = 256;
        why = "large opt-in shared memory allows a 256-wide tile";
    }
    /* BK: 64 bytes of K per row for mma (one 128-byte swizzle half), 32 bytes for FMA. */
    int bk = tc ? 64 / b : 32 / b;
    int kgran = tc ? s.mma_k : 1;
    bk = (int)cfg_min64(bk, cfg_cdiv(K, kgran) * kgran);

    /* Cap by the problem. */
    int64_t cap_m = cfg_max64(min_wtm, cfg_pow2ceil(M)), cap_n = cfg_max64(min_wtn, cfg_pow2ceil(N));
    if (bm > cap_m) { bm = (int)cap_m; why = "tile capped by M"; }
    if (bn > cap_n) { bn = (int)cap_n; why = bm == cap_m ? "tile capped by M and N" : "tile capped by N"; }

    /* Fill the SMs: shrink down to 64 while there are fewer tiles than SMs. */
    while (cfg_cdiv(M, bm) * cfg_cdiv(N, bn) < d->sm_count && (bm > 64 || bn > 64)) {
        if (!cfg_shrink(&bm, &bn, 64, 64)) break;
        why = "tile shrunk so the output tiles fill the SMs";
    }

    const int64_t reserve = d->cc_major >= 8 ? 1024 : 0; /* [CCT]: 1 KiB per block reserved by the system */
    const int64_t smem_cap = cfg_min64(d->smem_per_block_optin, d->smem_per_sm - reserve);
    for (int iter = 0; iter < 64; iter++) {
        int wtm = (int)cfg_min64(max_wtm, bm), wtn = (int)cfg_min64(max_wtn, bn);
        int wm = bm / wtm, wn = bn / wtn;
        int warps = wm * wn;
        if (warps * 32 > d->max_threads_per_block) {
            if (cfg_shrink(&bm, &bn, min_wtm, min_wtn)) { why = "tile shrunk to max_threads_per_block"; continue; }
            snprintf(s.reason, sizeof s.reason, "no tile fits max_threads_per_block"); return s;
        }
        /* Registers: f32 accumulators + double-buffered operand fragments + 32 for addressing. */
        int acc = wtm * wtn / 32;
        int frag = tc ? 2 * (int)cfg_cdiv((int64_t)(wtm + wtn) * s.mma_k * b, 4 * 32)
                      : 2 * (wtm / 4 + wtn / 8);
        int regs = (int)(cfg_cdiv(acc + frag + 32, 8) * 8);
        if (regs > d->max_regs_per_thread) {
            if (max_wtm >= max_wtn && max_wtm / 2 >= min_wtm) max_wtm /= 2;
            else if (max_wtn / 2 >= min_wtn) max_wtn /= 2;
            else if (max_wtm / 2 >= min_wtm) max_wtm /= 2;
            else { snprintf(s.reason, sizeof s.reason, "no warp tile fits max_regs_per_thread"); return s; }
            why = "warp tile shrunk to max_regs_per_thread";
            continue;
        }
        /* Split-K when the output tiles cannot fill the SMs. */
        int64_t tiles_m = cfg_cdiv(M, bm), tiles_n = cfg_cdiv(N, bn), tiles = tiles_m * tiles_n;
        int64_t k_tiles = cfg_cdiv(K, bk);
        /* want = ceil(sm_count / tiles); ktps = floor(k_tiles / want) >= 1 so that
         * split = ceil(k_tiles / ktps) >= want (unless bounded by k_tiles) and
         * no split is empty. */
        int64_t want = tiles < d->sm_count ? cfg_cdiv(d->sm_count, tiles) : 1;
        int64_t ktps = cfg_max64(1, k_tiles / want);
        int64_t split = cfg_cdiv(k_tiles, ktps);
        /* Pipeline stages from the shared-memory budget. */
        int64_t stage_bytes = (int64_t)(bm + bn) * bk * b;
        int64_t fit = smem_cap / stage_bytes;
        if (fit < 1 || (fit < 2 && ktps >= 2 && (bm > min_wtm || bn > min_wtn))) {
            if (cfg_shrink(&bm, &bn, min_wtm, min_wtn)) { why = "tile shrunk to the shared-memory budget"; continue; }
            if (fit < 1 && bk > kgran) { bk /= 2; why = "BK shrunk to the shared-memory budget"; continue; }
            if (fit < 1) { snprintf(s.reason, sizeof s.reason, "no tile fits smem_per_block_optin"); return s; }
        }
        int64_t stages = cfg_min64(cfg_min64(4, fit), ktps);
        if (stages < 1) stages = 1;
        int64_t smem = stages * stage_bytes;
        /* Occupancy. */
        int threads = warps * 32;
        int64_t by_threads = d->max_threads_per_sm / threads;
        int64_t regs_per_warp = cfg_cdiv((int64_t)regs * 32, 256) * 256; /* [CCT]: 256-register warp allocation unit */
        int64_t by_regs = (d->regs_per_sm / regs_per_warp) / warps;
        int64_t by_smem = d->smem_per_sm / (smem + reserve);
        int64_t blocks = d->max_blocks_per_sm;
        const char *lim = "blocks";
        if (by_threads < blocks) { blocks = by_threads; lim = "threads"; }
        if (by_regs < blocks) { blocks = by_regs; lim = "registers"; }
        if (by_smem < blocks) { blocks = by_smem; lim = "smem"; }
        if (blocks < 1) {
            if (by_regs < 1 && max_wtm / 2 >= min_wtm) { max_wtm /= 2; why = "warp tile shrunk to regs_per_sm"; continue; }
            if (cfg_shrink(&bm, &bn, min_wtm, min_wtn)) { why = "tile shrunk so one block fits an SM"; continue; }
            snprintf(s.reason, sizeof s.reason, "no tile gives one resident block per SM"); return s;
        }
        s.bm = bm; s.bn = bn; s.bk = bk;
        s.wm = wm; s.wn = wn; s.warp_tile_m = wtm; s.warp_tile_n = wtn;
        s.warps = warps; s.threads = threads;
        s.stages = (int)stages; s.smem_bytes = smem; s.regs_per_thread = regs;
        s.tiles_m = tiles_m; s.tiles_n = tiles_n; s.tiles = tiles;
        s.k_tiles = k_tiles; s.split_k = (int)split; s.k_tiles_per_split = ktps;
        s.blocks_per_sm = (int)blocks;
        snprintf(s.occupancy_limit, sizeof s.occupancy_limit, "%s", lim);
        int64_t slots = (int64_t)d->sm_count * blocks;
        s.waves = cfg_cdiv(tiles * split, slots);
        s.wave_efficiency = (double)(tiles * split) / ((double)s.waves * (double)slots);
        snprintf(s.reason, sizeof s.reason, "%s; %s; occupancy limited by %s%s",
                 why, s.compute_bound ? "compute-bound" : "memory-bound", lim,
                 split > 1 ? "; split-K to fill the SMs" : "");
        s.ok = true;
        return s;
    }
    snprintf(s.reason, sizeof s.reason, "no schedule found");
    return s;
}

int cfg_occupancy(const cfg_device *d, int threads, int64_t smem, int regs, int64_t nblocks, const char **limit,
                  double *waves)
{
    const int64_t reserve = d->cc_major >= 8 ? 1024 : 0; /* [CCT]: 1 KiB per block reserved by the system */
    int64_t regs_per_warp = cfg_cdiv((int64_t)regs * 32, 256) * 256; /* [CCT]: 256-register warp allocation unit */
    int64_t warps = cfg_cdiv(threads, 32);
    int64_t by[4] = {d->max_threads_per_sm / cfg_max64(1, threads),
                     regs_per_warp > 0 ? (d->regs_per_sm / regs_per_warp) / cfg_max64(1, warps) : d->max_blocks_per_sm,
                     smem > 0 ? d->smem_per_sm / (smem + reserve) : d->max_blocks_per_sm, d->max_blocks_per_sm};
    static const char *const names[4] = {"threads", "registers", "smem", "blocks"};
    int k = 0;
    for (int i = 1; i < 4; i++)
        if (by[i] < by[k]) k = i;
    int64_t blocks = cfg_max64(1, by[k]);
    if (limit) *limit = names[k];
    if (waves) *waves = (double)nblocks / ((double)cfg_max64(1, d->sm_count) * (double)blocks);
    return (int)blocks;
}

int cfg_gemm_stages(const cfg_device *d, int64_t stage_bytes, int threads, int regs, int64_t k_tiles,
                    const char **why)
{
    const char *w = "k tiles";
    int s = 1;
    if (stage_bytes < 1 || k_tiles < 2) { if (why) *why = w; return 1; }
    int64_t by_static = d->smem_per_block_optin / stage_bytes;
    if (by_static < 2) { if (why) *why = "shared memory per block"; return 1; }
    s = 2;
    for (;;) {
        if (s >= 4) { w = "at most 4"; break; }
        if (s + 1 > k_tiles) { w = "k tiles"; break; }
        if (s + 1 > by_static) { w = "shared memory per block"; break; }
        int now = cfg_occupancy(d, threads, s * stage_bytes, regs, 1, NULL, NULL);
        int more = cfg_occupancy(d, threads, (s + 1) * stage_bytes, regs, 1, NULL, NULL);
        if (more < now) { w = "shared memory per SM"; break; }
        s++;
    }
    if (why) *why = w;
    return s;
}

int cfg_gemm_split(const cfg_device *d, int64_t tiles, int blocks_per_sm, int64_t k_tiles, int stages,
                   const char **why)
{
    const char *w = "the tiles fill half a wave";
    int64_t slots = (int64_t)d->sm_count * (blocks_per_sm > 0 ? blocks_per_sm : 1), s = 1;
    if (tiles >= 1 && tiles * 2 <= slots) {
        int64_t kmin = stages > 8 ? stages : 8, by_k = k_tiles / kmin, fill = slots / tiles;
        s = cfg_min64(cfg_min64(fill, by_k), 16);
        w = s < 2 ? "K too short to split" : s == fill ? "one wave of SMs" : s == by_k ? "k tiles" : "at most 16";
        if (s < 2) s = 1;
    }
    if (why) *why = w;
    return (int)s;
}

cfg_gemm_cpu_schedule cfg_gemm_cpu(const cfg_device *d, int64_t M, int64_t N, int64_t K, int b)
{
    if (!d || d->kind != CFG_DEV_CPU || (b != 2 && b != 4 && b != 8)) return cfg_gemm_cpu_tile(d, M, N, K, b, 1, 1);
    /* Register block: nr = 2 vectors wide; mr rows so that mr*2 accumulators
     * + 2 B vectors + 1 A broadcast fit the vector registers. */
    const int nr_v = 2, lanes = d->vector_bits / 8 / b;
    int mr = (d->vector_regs - nr_v - 1) / nr_v;
    if (mr < 1) mr = 1;
    if (mr > 16) mr = 16;
    cfg_gemm_cpu_schedule s = cfg_gemm_cpu_tile(d, M, N, K, b, mr, nr_v * lanes);
    if (s.ok)
        snprintf(s.reason, sizeof s.reason, "mr x nr = %d x %d from %d %d-bit registers; kc from L1, mc from L2, nc from %s",
                 s.mr, s.nr, d->vector_regs, d->vector_bits, d->l3_bytes > 0 ? "L3" : "L2");
    return s;
}

cfg_gemm_cpu_schedule cfg_gemm_cpu_tile(const cfg_device *d, int64_t M, int64_t N, int64_t K, int b, int mr, int nr)
{
    cfg_gemm_cpu_schedule s;
    memset(&s, 0, sizeof s);
    if (!d || d->kind != CFG_DEV_CPU) { snprintf(s.reason, sizeof s.reason, "not a CPU device"); return s; }
    if (M < 1 || N < 1 || K < 1) { snprintf(s.reason, sizeof s.reason, "M, N, K must be >= 1"); return s; }
    if (b != 2 && b != 4 && b != 8) { snprintf(s.reason, sizeof s.reason, "dtype_bytes must be 2, 4 or 8"); return s; }
    if (mr < 1 || nr < 1) { snprintf(s.reason, sizeof s.reason, "mr, nr must be >= 1"); return s; }
    s.arith_intensity = cfg_intensity(M, N, K, b);
    s.lanes = d->vector_bits / 8 / b;
    s.mr = mr;
    s.nr = nr;
    /* KC: the mr x kc micro-panel of A, read once per register tile, takes
     * 7/8 of L1; the kc x nr micro-panel of B streams from L2 (one FMA per
     * cycle needs a few bytes per cycle of it).  At most 512: the tile's
     * update of C, once per kc, is then under 1% of its work. */
    int64_t kc = d->l1d_bytes * 7 / 8 / ((int64_t)s.mr * b);
    if (kc > 512) kc = 512;
    if (kc > d->l2_bytes / 2 / ((int64_t)s.mr * b)) kc = d->l2_bytes / 2 / ((int64_t)s.mr * b); /* a block of A in L2 */
    int64_t outer_cache = d->l3_bytes > 0 ? d->l3_bytes : d->l2_bytes;
    if (kc > outer_cache / 2 / ((int64_t)s.nr * b)) kc = outer_cache / 2 / ((int64_t)s.nr * b); /* a panel of B in L3 */
    if (kc >= 8) kc -= kc % 8;
    if (kc < 1) kc = 1;
    s.kc = cfg_min64(kc, K);
    /* MC: the mc x kc packed A block takes at most half of L2. */
    int64_t mc = d->l2_bytes / 2 / (s.kc * b);
    mc -= mc % s.mr;
    if (mc < s.mr) mc = s.mr;
    s.mc = cfg_min64(mc, cfg_cdiv(M, s.mr) * s.mr);
    /* NC: the kc x nc packed B panel takes at most half of L3 (L2 without one). */
    int64_t outer = d->l3_bytes > 0 ? d->l3_bytes : d->l2_bytes;
    int64_t nc = outer / 2 / (s.kc * b);
    nc -= nc % s.nr;
    if (nc < s.nr) nc = s.nr;
    s.nc = cfg_min64(nc, cfg_cdiv(N, s.nr) * s.nr);
    s.l1_use = s.kc * s.mr * b;
    s.l2_use = s.mc * s.kc * b;
    s.l3_use = s.kc * s.nc * b;
    s.threads = d->cores;
    snprintf(s.reason, sizeof s.reason, "mr x nr = %d x %d given; kc from L1, mc from L2, nc from %s", s.mr, s.nr,
             d->l3_bytes > 0 ? "L3" : "L2");
    s.ok = true;
    return s;
}

/* SIMT GEMM (configurator/README.md, "SIMT GEMM"): 256 threads (8 warps) per
 * block.  The 4 x 4 register tile gives each thread 16 accumulators and 8
 * operands per k step, 2 shared loads per 4 FMAs... (arithmetic intensity
 * of the inner loop: TM*TN / (TM+TN) = 2 FMA per shared load); the block
 * tile is then 64 x 64.  When those tiles cannot give every SM a block, the
 * tile shrinks to 32 x 32 (2 x 2 per thread): four times the blocks.  BK =
 * 8 keeps the staged tiles at 8 * (64+64) * 4 = 4 KiB, so shared memory
 * never limits occupancy; registers (about 48 per thread) and the threads
 * per SM do. */
cfg_gemm_simt_schedule cfg_gemm_simt(const cfg_device *d, int64_t M, int64_t N, int64_t K, int b) {
    cfg_gemm_simt_schedule s;
    memset(&s, 0, sizeof s);
    if (!d || d->kind != CFG_DEV_GPU || d->sm_count < 1 || d->max_threads_per_block < 256 || M < 1 || N < 1 ||
        K < 1 || (b != 4 && b != 8)) {
        snprintf(s.reason, sizeof s.reason, "invalid arguments (GPU device, M, N, K >= 1, 4- or 8-byte elements)");
        return s;
    }
    s.threads = 256;
    s.bk = 8;
    s.tm = s.tn = 4;
    s.bm = s.bn = 64;
    int64_t big = ((M + 63) / 64) * ((N + 63) / 64);
    bool shrink = big < d->sm_count;
    if (shrink) {
        s.tm = s.tn = 2;
        s.bm = s.bn = 32;
    }
    s.tiles = ((M + s.bm - 1) / s.bm) * ((N + s.bn - 1) / s.bn);
    s.smem_bytes = (int64_t)s.bk * (s.bm + s.bn) * b;
    s.regs_per_thread = (s.tm * s.tn + s.tm + s.tn) * (b / 4) + 24;
    s.regs_per_thread = (s.regs_per_thread + 7) / 8 * 8;
    int by_threads = d->max_threads_per_sm / s.threads;
    int by_regs = d->regs_per_sm / (s.regs_per_thread * s.threads);
    int by_smem = (int)(d->smem_per_sm / s.smem_bytes);
    int by_blocks = d->max_blocks_per_sm;
    s.blocks_per_sm = by_threads;
    snprintf(s.occupancy_limit, sizeof s.occupancy_limit, "threads");
    if (by_regs < s.blocks_per_sm) s.blocks_per_sm = by_regs, snprintf(s.occupancy_limit, sizeof s.occupancy_limit, "registers");
    if (by_smem < s.blocks_per_sm) s.blocks_per_sm = by_smem, snprintf(s.occupancy_limit, sizeof s.occupancy_limit, "smem");
    if (by_blocks < s.blocks_per_sm) s.blocks_per_sm = by_blocks, snprintf(s.occupancy_limit, sizeof s.occupancy_limit, "blocks");
    if (s.blocks_per_sm < 1) s.blocks_per_sm = 1;
    s.waves = (double)s.tiles / ((double)d->sm_count * s.blocks_per_sm);
    snprintf(s.reason, sizeof s.reason, "SIMT tile %dx%dx%d, %dx%d per thread%s; %d blocks/SM (%s), %.2f waves",
             s.bm, s.bn, s.bk, s.tm, s.tn, shrink ? " (64x64 tiles would leave SMs idle)" : "", s.blocks_per_sm,
             s.occupancy_limit, s.waves);
    s.ok = true;
    return s;
}
