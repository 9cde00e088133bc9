/* configurator/kernel.c: analytic schedules for pointwise kernels and row
 * reductions (GPU and CPU); formulas in configurator/README.md. */
#include "kernel.h"

#include <stdio.h>
#include <string.h>

static int64_t cfg_k_cdiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }
static int64_t cfg_k_min(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t cfg_k_max(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t cfg_k_pow2floor(int64_t x)
{
    int64_t p = 1;
    while (p <= x / 2) p <<= 1;
    return p;
}
static int64_t cfg_k_pow2ceil(int64_t x)
{
    int64_t p = 1;
    while (p < x) p <<= 1;
    return p;
}

/* Common argument checks: a device of the right kind that passes
 * cfg_device_validate (so no limit is zero), and a supported element size.
 * Returns true when all is well, else writes the reason and returns false. */
static bool cfg_k_check(const cfg_device *d, cfg_device_kind kind, int b, char *reason, size_t n)
{
    char err[160];
    if (!d) { snprintf(reason, n, "no device"); return false; }
    if (d->kind != kind) {
        snprintf(reason, n, "%s is not a %s device", d->name[0] ? d->name : "device",
                 kind == CFG_DEV_GPU ? "GPU" : "CPU");
        return false;
    }
    if (cfg_device_validate(d, err, sizeof err)) { snprintf(reason, n, "invalid device: %s", err); return false; }
    if (b != 1 && b != 2 && b != 4 && b != 8) {
        snprintf(reason, n, "elem_bytes must be 1, 2, 4 or 8, got %d", b);
        return false;
    }
    return true;
}

/* Widest vector of 4, 2 or 1 elements that is at most 16 bytes (one
 * ld.global.v4.b32 / LDG.128) and divides count, so every access stays
 * aligned and no thread needs a scalar tail. */
static int cfg_k_vec(int64_t count, int b)
{
    for (int v = 4; v > 1; v /= 2)
        if (v * b <= 16 && count % v == 0) return v;
    return 1;
}

/* ---- GPU occupancy ---- */

/* System shared memory reserved per block: 1 KiB on sm_80 and later [CCT]. */
static int64_t cfg_k_reserve(const cfg_device *d) { return d->cc_major >= 8 ? 1024 : 0; }

/* Resident blocks per SM for `threads` threads and `smem` bytes per block:
 * the minimum of max_blocks_per_sm, max_threads_per_sm / threads,
 * (regs_per_sm / roundup(CFG_KERNEL_REGS * 32, 256)) / warps and
 * smem_per_sm / (smem + reserve).  *lim names the deciding term. */
static int64_t cfg_k_occupancy(const cfg_device *d, int threads, int64_t smem, const char **lim)
{
    int64_t warps = threads / 32;
    int64_t regs_per_warp = cfg_k_cdiv((int64_t)CFG_KERNEL_REGS * 32, 256) * 256; /* [CCT]: 256-register unit */
    int64_t by_threads = d->max_threads_per_sm / threads;
    int64_t by_regs = (d->regs_per_sm / regs_per_warp) / warps;
    int64_t per_block = smem + cfg_k_reserve(d);
    int64_t by_smem = per_block > 0 ? d->smem_per_sm / per_block : d->max_blocks_per_sm;
    int64_t blocks = d->max_blocks_per_sm;
    *lim = "blocks";
    if (by_threads < blocks) { blocks = by_threads; *lim = "threads"; }
    if (by_regs < blocks) { blocks = by_regs; *lim = "registers"; }
    if (by_smem < blocks) { blocks = by_smem; *lim = "smem"; }
    return blocks;
}

/* Block size for a memory-bound kernel.  DRAM latency is hidden by keeping
 * as many warps resident as the SM allows, so the block size is chosen for
 * the most resident threads, blocks_per_sm * threads (ties: the smaller
 * block, which quantizes better on small grids), among multiples of 32 from
 *   lo = max(128, roundup32(ceil(max_threads_per_sm / max_blocks_per_sm)))
 * up to max_threads_per_block.  Below max_threads_per_sm / max_blocks_per_sm
 * threads the block limit stops an SM from filling; 128 threads give each of
 * the four warp schedulers of an SM (sm_70 and later) a warp of every block.
 * sm_80/sm_90: 128 threads x 16 blocks = 2048; sm_86/sm_89: 128 x 12 = 1536. */
static int cfg_k_block(const cfg_device *d)
{
    int64_t lo = cfg_k_cdiv(d->max_threads_per_sm, d->max_blocks_per_sm);
    lo = cfg_k_max(128, cfg_k_cdiv(lo, 32) * 32);
    if (lo > d->max_threads_per_block) lo = d->max_threads_per_block;
    int best = (int)lo;
    int64_t best_res = -1;
    for (int64_t t = lo; t <= d->max_threads_per_block; t += 32) {
        const char *lim;
        int64_t res = cfg_k_occupancy(d, (int)t, 0, &lim) * t;
        if (res > best_res) { best_res = res; best = (int)t; }
        if (res >= d->max_threads_per_sm) break; /* cannot do better */
    }
    return best;
}

/* ---- GPU pointwise ---- */

cfg_pointwise_schedule cfg_pointwise(const cfg_device *d, int64_t n, int b, bool allow_vector)
{
    cfg_pointwise_schedule s;
    memset(&s, 0, sizeof s);
    if (!cfg_k_check(d, CFG_DEV_GPU, b, s.reason, sizeof s.reason)) return s;
    if (n < 1) { snprintf(s.reason, sizeof s.reason, "n must be >= 1, got %lld", (long long)n); return s; }
    s.n = n;
    s.vec = allow_vector ? cfg_k_vec(n, b) : 1;
    int64_t units = n / s.vec; /* vector accesses; exact since vec divides n */

    /* Threads: the occupancy block size, or fewer whole warps when n fits in
     * one block. */
    int block = cfg_k_block(d);
    bool one_block = units < block;
    s.threads = one_block ? (int)(cfg_k_cdiv(units, 32) * 32) : block;
    const char *lim;
    int64_t bps = cfg_k_occupancy(d, s.threads, 0, &lim);
    if (bps < 1) { snprintf(s.reason, sizeof s.reason, "no block of %d threads fits an SM", s.threads); return s; }
    s.blocks_per_sm = (int)bps;

    char why[96];
    if (one_block)
        snprintf(why, sizeof why, "n fits one block of %d warps", s.threads / 32);
    else
        snprintf(why, sizeof why, "%d threads x %lld blocks/SM = %lld of %d threads/SM (%s limit)",
                 s.threads, (long long)bps, (long long)(bps * s.threads), d->max_threads_per_sm, lim);

    /* Grid.  blocks = ceil(units / threads) gives one access per thread. */
    int64_t blocks = cfg_k_cdiv(units, s.threads);
    if (!allow_vector && blocks <= CFG_GRID_MAX) {
        s.grid = blocks;
        s.per_thread = 1;
        snprintf(s.reason, sizeof s.reason, "%s; one thread per element, grid = ceil(n/%d)", why, s.threads);
    } else {
        /* Grid-stride: at most CFG_POINTWISE_WAVES waves of resident blocks,
         * cap = sm_count * blocks_per_sm * waves; each thread then loops
         * per_thread = ceil(units / (grid * threads)) times. */
        int64_t cap = cfg_k_min((int64_t)d->sm_count * bps * CFG_POINTWISE_WAVES, CFG_GRID_MAX);
        s.grid = cfg_k_min(blocks, cap);
        s.per_thread = cfg_k_cdiv(units, s.grid * s.threads);
        if (!allow_vector)
            snprintf(s.reason, sizeof s.reason, "%s; ceil(n/%d) > 2^31-1 blocks: grid-stride, %lld per thread",
                     why, s.threads, (long long)s.per_thread);
        else if (s.grid == cap && blocks > cap)
            snprintf(s.reason, sizeof s.reason, "vec %d; %s; grid capped at %d waves (%d SMs), %lld accesses per thread",
                     s.vec, why, CFG_POINTWISE_WAVES, d->sm_count, (long long)s.per_thread);
        else
            snprintf(s.reason, sizeof s.reason, "vec %d; %s; grid = ceil(n/(%d x %d)) within %d waves",
                     s.vec, why, s.threads, s.vec, CFG_POINTWISE_WAVES);
    }
    s.ok = true;
    return s;
}

/* false (with the reason) unless a reduction of ROWS x COLS makes sense. */
static bool cfg_k_rows_cols(int64_t rows, int64_t cols, char *reason, size_t n)
{
    if (rows >= 1 && cols >= 1) return true;
    snprintf(reason, n, "rows and cols must be >= 1, got %lld x %lld", (long long)rows, (long long)cols);
    return false;
}

/* ---- GPU row reduction ---- */

/* WARP_ONLY: the row kernels' form (cfg_row): one element per access and
 * at most a warp per row. */
static cfg_reduce_schedule reduce_schedule(const cfg_device *d, int64_t rows, int64_t cols, int b, bool warp_only)
{
    cfg_reduce_schedule s;
    memset(&s, 0, sizeof s);
    if (!cfg_k_check(d, CFG_DEV_GPU, b, s.reason, sizeof s.reason)) return s;
    if (!cfg_k_rows_cols(rows, cols, s.reason, sizeof s.reason)) return s;
    s.rows = rows;
    s.cols = cols;
    s.vec = warp_only ? 1 : cfg_k_vec(cols, b);
    int64_t units = cols / s.vec;       /* vector accesses per row */
    int64_t acc = b > 4 ? 8 : 4;        /* accumulator bytes: f32/i32, or f64/i64 */
    const char *lim;

    /* Cap for a block per row: the power of two in 32..min(1024, max_threads_per_block)
     * with the most resident threads (ties: the larger, fewer partials).
     * sm_80/sm_90: 1024 (2 blocks = 2048); sm_86/sm_89: 512 (3 blocks = 1536). */
    int64_t cap = 32, cap_res = -1;
    for (int64_t p = cfg_k_pow2floor(cfg_k_min(warp_only ? 32 : 1024, d->max_threads_per_block)); p >= 32; p /= 2) {
        int64_t res = cfg_k_occupancy(d, (int)p, p > 32 ? p / 32 * acc : 0, &lim) * p;
        if (res > cap_res) { cap_res = res; cap = p; }
    }

    /* Threads per row: the larger of
     *   coal = min(32, pow2ceil(128 / (vec * b)))   (a row's group reads whole 128-byte lines)
     *   fill = pow2ceil(ceil(sm_count * max_threads_per_sm / rows))   (rows * tpr fill every SM)
     * then at most useful = pow2floor(units) (every thread has an access) and cap. */
    int64_t coal = cfg_k_min(32, cfg_k_pow2ceil(cfg_k_cdiv(128, (int64_t)s.vec * b)));
    int64_t capacity = (int64_t)d->sm_count * d->max_threads_per_sm;
    int64_t fill = cfg_k_pow2ceil(cfg_k_min(1024, cfg_k_cdiv(capacity, rows)));
    int64_t useful = cfg_k_pow2floor(units);
    int64_t tpr = cfg_k_max(coal, fill);
    const char *tpr_why = fill > coal ? "to fill the SMs" : "a 128-byte line per access";
    if (tpr > useful) { tpr = useful; tpr_why = warp_only ? "one per element" : "one per vector access"; }
    if (tpr > cap) { tpr = cap; tpr_why = warp_only ? "a warp at most" : "the occupancy cap"; }
    s.threads_per_row = (int)tpr;

    char shape[112];
    if (tpr <= 32) {
        /* Short rows: several rows per block, each to a group of tpr lanes of
         * a warp.  Few rows are spread over the SMs before being packed:
         * threads = min(block, roundup32(ceil(rows / sm_count) * tpr)). */
        int64_t block = cfg_k_block(d);
        int64_t per_sm = cfg_k_cdiv(rows, d->sm_count);
        s.threads = (int)(per_sm < block / tpr ? cfg_k_cdiv(per_sm * tpr, 32) * 32 : block);
        s.rows_per_block = (int)(s.threads / tpr);
        s.smem_bytes = 0; /* warp shuffles only */
        snprintf(shape, sizeof shape, "short rows: %d threads per row (%s), %d rows per %d-thread block",
                 s.threads_per_row, tpr_why, s.rows_per_block, s.threads);
    } else {
        /* Long rows: a block per row; warps reduce by shuffles and then
         * through shared memory, one partial per warp. */
        s.threads = (int)tpr;
        s.rows_per_block = 1;
        s.smem_bytes = tpr / 32 * acc;
        snprintf(shape, sizeof shape, "long rows: a %d-thread block per row (%s)", s.threads, tpr_why);
    }
    s.grid = cfg_k_cdiv(rows, s.rows_per_block);
    if (s.grid > CFG_GRID_MAX) {
        snprintf(s.reason, sizeof s.reason, "%lld rows need more than 2^31-1 blocks", (long long)rows);
        return s;
    }
    if (s.smem_bytes > d->smem_per_block) {
        snprintf(s.reason, sizeof s.reason, "partials need %lld bytes of shared memory", (long long)s.smem_bytes);
        return s;
    }
    int64_t bps = cfg_k_occupancy(d, s.threads, s.smem_bytes, &lim);
    if (bps < 1) { snprintf(s.reason, sizeof s.reason, "no block of %d threads fits an SM", s.threads); return s; }
    s.blocks_per_sm = (int)bps;
    if (s.grid < d->sm_count && tpr > 32 && units > tpr)
        snprintf(s.reason, sizeof s.reason, "%.90s; only %lld rows for %d SMs: a split over blocks is not used",
                 shape, (long long)rows, d->sm_count);
    else
        snprintf(s.reason, sizeof s.reason, "%s; %lld blocks/SM (%s limit)", shape, (long long)bps, lim);
    s.ok = true;
    return s;
}

cfg_reduce_schedule cfg_reduce(const cfg_device *d, int64_t rows, int64_t cols, int b)
{
    return reduce_schedule(d, rows, cols, b, false);
}

cfg_reduce_schedule cfg_row(const cfg_device *d, int64_t rows, int64_t cols, int b)
{
    return reduce_schedule(d, rows, cols, b, true);
}

/* ---- CPU ---- */

cfg_pointwise_cpu_schedule cfg_pointwise_cpu(const cfg_device *d, int64_t n, int b)
{
    cfg_pointwise_cpu_schedule s;
    memset(&s, 0, sizeof s);
    if (!cfg_k_check(d, CFG_DEV_CPU, b, s.reason, sizeof s.reason)) return s;
    if (n < 1) { snprintf(s.reason, sizeof s.reason, "n must be >= 1, got %lld", (long long)n); return s; }
    s.n = n;
    s.lanes = d->vector_bits / (8 * b);
    /* threads = min(cores, max(1, floor(n / (16 KiB / b)))): every thread gets
     * at least 16 KiB of one operand, enough to amortize waking it. */
    int64_t min_chunk = CFG_CPU_MIN_CHUNK_BYTES / b;
    int64_t chunks = cfg_k_max(1, n / min_chunk);
    int64_t threads = cfg_k_min(d->cores, chunks);
    if (threads == 1) {
        s.threads = 1;
        s.chunk = n;
    } else {
        /* chunk = ceil(n / threads) rounded up to align = max(lanes, 64 / b)
         * elements, so chunks start on a vector and a 64-byte cache line
         * (no false sharing); threads = ceil(n / chunk) drops an empty one. */
        int64_t align = cfg_k_max(s.lanes, 64 / b);
        s.chunk = cfg_k_cdiv(cfg_k_cdiv(n, threads), align) * align;
        s.threads = (int)cfg_k_cdiv(n, s.chunk);
    }
    snprintf(s.reason, sizeof s.reason, "%d of %d cores (%s), %d lanes of %d bits, chunk %lld elements",
             s.threads, d->cores, threads < d->cores ? "16 KiB per thread" : "all cores",
             s.lanes, d->vector_bits, (long long)s.chunk);
    s.ok = true;
    return s;
}

cfg_reduce_cpu_schedule cfg_reduce_cpu(const cfg_device *d, int64_t rows, int64_t cols, int b)
{
    cfg_reduce_cpu_schedule s;
    memset(&s, 0, sizeof s);
    if (!cfg_k_check(d, CFG_DEV_CPU, b, s.reason, sizeof s.reason)) return s;
    if (!cfg_k_rows_cols(rows, cols, s.reason, sizeof s.reason)) return s;
    s.rows = rows;
    s.cols = cols;
    s.lanes = d->vector_bits / (8 * b);
    /* Threads over whole rows, at least 16 KiB each: a row of cols >=
     * 16 KiB / b elements is a chunk by itself, shorter rows are grouped
     * ceil((16 KiB / b) / cols) to a chunk.  threads = min(cores, chunks). */
    int64_t min_chunk = CFG_CPU_MIN_CHUNK_BYTES / b;
    int64_t chunks = cols >= min_chunk ? rows : rows / cfg_k_cdiv(min_chunk, cols);
    int64_t threads = cfg_k_min(d->cores, cfg_k_max(1, chunks));
    s.rows_per_thread = cfg_k_cdiv(rows, threads);
    s.threads = (int)cfg_k_cdiv(rows, s.rows_per_thread);
    /* Accumulators: an add/FMA has ~4 cycles of latency and fma_units issue
     * per cycle, so fma_units * 4 independent chains keep the pipes busy;
     * at most half the vector registers (the rest hold loads), and no more
     * than the vectors in a row, floor(cols / lanes). */
    int64_t acc = (int64_t)d->fma_units * 4;
    acc = cfg_k_min(acc, d->vector_regs / 2);
    acc = cfg_k_min(acc, cfg_k_max(1, cols / s.lanes));
    s.accumulators = (int)cfg_k_max(1, acc);
    if (rows < d->cores && cols >= min_chunk)
        snprintf(s.reason, sizeof s.reason,
                 "only %lld rows for %d cores: a row is not split over threads; %d lanes x %d accumulators",
                 (long long)rows, d->cores, s.lanes, s.accumulators);
    else
        snprintf(s.reason, sizeof s.reason, "%d threads x %lld rows (%s); %d lanes x %d accumulators",
                 s.threads, (long long)s.rows_per_thread, threads < d->cores ? "16 KiB per thread" : "all cores",
                 s.lanes, s.accumulators);
    s.ok = true;
    return s;
}
