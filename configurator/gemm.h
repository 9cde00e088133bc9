/* configurator/gemm.h: analytic GEMM schedules (C[M,N] += A[M,K] B[K,N]).
 * No search: every figure follows from the device limits by the formulas in
 * configurator/README.md. */
#ifndef NOVA_CFG_GEMM_H
#define NOVA_CFG_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"

typedef enum cfg_mma {
    CFG_MMA_NONE = 0,    /* CUDA-core FMA */
    CFG_MMA_M16N8K16,    /* mma.sync.m16n8k16, f16/bf16 operands, f32 accumulate */
    CFG_MMA_M16N8K8      /* mma.sync.m16n8k8, tf32 operands, f32 accumulate */
} cfg_mma;

typedef struct cfg_gemm_schedule {
    bool ok;                 /* false: arguments invalid, see reason */
    int bm, bn, bk;          /* block tile */
    int wm, wn;              /* warp layout: wm x wn warps */
    int warp_tile_m, warp_tile_n;
    int warps, threads;      /* threads == warps * 32 */
    cfg_mma mma;
    int mma_m, mma_n, mma_k; /* 0 for FMA */
    int stages;              /* shared-memory pipeline depth, >= 1 */
    int64_t smem_bytes;      /* stages * (bm + bn) * bk * dtype_bytes */
    int regs_per_thread;     /* estimate, rounded up to a multiple of 8 */
    int64_t tiles_m, tiles_n, tiles; /* output tiles; tiles_m*bm >= M, tiles_n*bn >= N */
    int64_t k_tiles;         /* ceil(K / bk); the last one is predicated */
    int split_k;             /* >= 1, <= k_tiles */
    int64_t k_tiles_per_split;
    int blocks_per_sm;       /* occupancy, >= 1 */
    char occupancy_limit[16];/* "threads", "registers", "smem" or "blocks" */
    int64_t waves;
    double wave_efficiency;  /* tiles*split / (waves * sm_count * blocks_per_sm) */
    double arith_intensity;  /* FLOP per byte of compulsory traffic */
    double ridge;            /* device FLOP/byte at the roofline ridge, 0 if unknown */
    bool compute_bound;
    char reason[192];        /* which limit decided the tile */
} cfg_gemm_schedule;

/* Schedule for a GPU device.  dtype_bytes is 2 (f16/bf16) or 4 (f32/tf32);
 * tensor_cores asks for mma.sync when the device has it for that type.
 * M, N, K >= 1.  On bad arguments returns .ok == false with a reason. */
cfg_gemm_schedule cfg_gemm(const cfg_device *d, int64_t M, int64_t N, int64_t K,
                           int dtype_bytes, bool tensor_cores);

typedef struct cfg_gemm_cpu_schedule {
    bool ok;
    int lanes;               /* elements per vector register */
    int mr, nr;              /* register block (micro-kernel) */
    int64_t kc, mc, nc;      /* cache blocks: B micro-panel in L1, A block in L2, B panel in L3 */
    int64_t l1_use, l2_use, l3_use; /* bytes: kc*mr*b, mc*kc*b, kc*nc*b */
    int threads;
    double arith_intensity;
    char reason[192];
} cfg_gemm_cpu_schedule;

/* BLIS-style schedule for a CPU device (d->kind == CFG_DEV_CPU). */
cfg_gemm_cpu_schedule cfg_gemm_cpu(const cfg_device *d, int64_t M, int64_t N, int64_t K,
                                   int dtype_bytes);

/* The same cache blocks for a given MR x NR register tile (a packed
 * kernel's, e.g. the runtime's bf16 kernel). */
cfg_gemm_cpu_schedule cfg_gemm_cpu_tile(const cfg_device *d, int64_t M, int64_t N, int64_t K, int dtype_bytes, int mr,
                                        int nr);

const char *cfg_mma_name(cfg_mma m);

/* The SIMT (CUDA-core, exact fp32/fp64) GEMM the cuda code generator emits
 * today: BM x BN block tiles of THREADS threads, each thread a TM x TN
 * register tile, K staged BK at a time through shared memory. */
typedef struct cfg_gemm_simt_schedule {
    bool ok;
    int bm, bn, bk, tm, tn, threads;
    int64_t tiles;           /* blocks: ceil(M/bm) * ceil(N/bn) */
    int64_t smem_bytes;      /* bk * (bm + bn) * dtype_bytes */
    int regs_per_thread;     /* estimate */
    int blocks_per_sm;
    char occupancy_limit[16];
    double waves;            /* tiles / (sm_count * blocks_per_sm) */
    char reason[192];
} cfg_gemm_simt_schedule;

/* Resident blocks per SM of a kernel of THREADS threads a block, SMEM
 * bytes of static shared memory and about REGS registers a thread (at
 * least 1), the limit that sets them ("threads", "registers", "smem",
 * "blocks") in *LIMIT, and the waves NBLOCKS blocks take in *WAVES. */
int cfg_occupancy(const cfg_device *d, int threads, int64_t smem, int regs, int64_t nblocks, const char **limit,
                  double *waves);
/* Shared-memory pipeline depth of a GEMM kernel whose staged tiles take
 * STAGE_BYTES a stage (THREADS threads a block, about REGS registers a
 * thread, K_TILES tiles along K): two stages where two fit a block's
 * (opt-in, dynamic) shared memory and there are two tiles (a block's copies
 * of the next tile then overlap its MMAs even when it is alone on its SM),
 * then more, up to 4, while each costs no resident block (shared memory
 * per SM).  The limit that stopped it goes to WHY ("k tiles", "shared
 * memory per block", "shared memory per SM", "at most 4"). */
int cfg_gemm_stages(const cfg_device *d, int64_t stage_bytes, int threads, int regs, int64_t k_tiles,
                    const char **why);
/* Split-K of a GEMM kernel with TILES output tiles (batch included),
 * BLOCKS_PER_SM resident, K_TILES tiles along K through STAGES stages:
 * 1 when the tiles fill half a wave or more; else the most splits that
 * keep the blocks within one wave (floor(slots / tiles), slots = SMs x
 * blocks per SM), each at least max(8, STAGES) k tiles (the summing
 * kernel's launch must be paid for), at most 16.  The reason goes to
 * WHY. */
int cfg_gemm_split(const cfg_device *d, int64_t tiles, int blocks_per_sm, int64_t k_tiles, int stages,
                   const char **why);
cfg_gemm_simt_schedule cfg_gemm_simt(const cfg_device *d, int64_t M, int64_t N, int64_t K, int dtype_bytes);

#endif
