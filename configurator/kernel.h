/* configurator/kernel.h: analytic schedules for pointwise (fused elementwise)
 * kernels and row reductions, on a GPU (cfg_pointwise, cfg_reduce) and on a
 * CPU (cfg_pointwise_cpu, cfg_reduce_cpu).  No search: every figure follows
 * from the device limits by the formulas in configurator/README.md.  Every
 * function checks its arguments and the device, and returns .ok == false with
 * a one-line reason instead of failing. */
#ifndef NOVA_CFG_KERNEL_H
#define NOVA_CFG_KERNEL_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"

/* Registers per thread assumed for occupancy: an index, a few addresses and
 * values.  65536 registers / 32 = 2048 threads, so on every built-in GPU the
 * assumption never limits occupancy below max_threads_per_sm. */
#define CFG_KERNEL_REGS 32
/* Waves of resident blocks a grid-stride pointwise grid is capped at. */
#define CFG_POINTWISE_WAVES 4
/* gridDim.x limit (2^31 - 1) [CCT]. */
#define CFG_GRID_MAX ((int64_t)2147483647)
/* Smallest piece of work (bytes of one operand) worth a CPU thread. */
#define CFG_CPU_MIN_CHUNK_BYTES ((int64_t)16 * 1024)

typedef struct cfg_pointwise_schedule {
    bool ok;            /* false: arguments or device invalid, see reason */
    int64_t n;          /* elements */
    int vec;            /* elements per thread per access: 1, 2 or 4 (at most 16 bytes),
                           only when n % vec == 0; always 1 without allow_vector */
    int threads;        /* per block, multiple of 32, <= max_threads_per_block */
    int64_t grid;       /* blocks, 1..CFG_GRID_MAX */
    int64_t per_thread; /* grid-stride iterations per thread, each of vec elements
                           (a thread handles up to vec * per_thread elements);
                           grid * threads * vec * per_thread >= n */
    int blocks_per_sm;  /* resident blocks per SM (occupancy) */
    char reason[192];   /* the limits that decided it, one line */
} cfg_pointwise_schedule;

/* Elementwise kernel over n elements of elem_bytes (1, 2, 4 or 8) each.
 * allow_vector == false: vec = 1, grid = ceil(n / threads) and per_thread = 1
 * (one thread per element, guarded by i < n) whenever that grid fits in
 * 2^31 - 1 blocks.  allow_vector == true: 16-byte-or-narrower vector accesses
 * and a grid-stride loop over at most CFG_POINTWISE_WAVES waves of blocks. */
cfg_pointwise_schedule cfg_pointwise(const cfg_device *d, int64_t n, int elem_bytes, bool allow_vector);

typedef struct cfg_reduce_schedule {
    bool ok;
    int64_t rows, cols;  /* reduce cols contiguous elements for each of rows rows */
    int vec;             /* elements per access: 1, 2 or 4 (<= 16 bytes), cols % vec == 0 */
    int threads_per_row; /* power of two, 1..1024, <= cols / vec; up to 32: a (sub-)warp
                            group per row; above 32: a whole block per row */
    int rows_per_block;  /* 1 when threads_per_row > 32 */
    int threads;         /* threads_per_row * rows_per_block, multiple of 32,
                            <= max_threads_per_block */
    int64_t grid;        /* ceil(rows / rows_per_block) blocks */
    int64_t smem_bytes;  /* cross-warp partials: (threads_per_row / 32) * rows_per_block
                            * accumulator bytes when threads_per_row > 32, else 0 */
    int blocks_per_sm;
    char reason[192];
} cfg_reduce_schedule;

/* Row reduction on a GPU; the accumulator is 4 bytes (f32/i32) for 1- to
 * 4-byte elements and 8 bytes for 8-byte elements. */
cfg_reduce_schedule cfg_reduce(const cfg_device *d, int64_t rows, int64_t cols, int elem_bytes);

/* The same for the cuda target's row kernels (codegen/cuda.c): one element
 * per access (vec = 1, each lane's body a copy of the loop's) and at most a
 * warp per row (threads_per_row <= 32, rows_per_block >= 1, no shared
 * memory: the lanes combine by shuffles). */
cfg_reduce_schedule cfg_row(const cfg_device *d, int64_t rows, int64_t cols, int elem_bytes);

typedef struct cfg_pointwise_cpu_schedule {
    bool ok;
    int64_t n;
    int threads;        /* 1..cores, and no more than n * elem_bytes / 16 KiB */
    int lanes;          /* elements per vector register: vector_bits / (8 * elem_bytes) */
    int64_t chunk;      /* elements per thread: n when threads == 1, else a multiple of
                           max(lanes, 64 / elem_bytes) (whole vectors and cache lines);
                           threads * chunk >= n > (threads - 1) * chunk */
    char reason[192];
} cfg_pointwise_cpu_schedule;

/* Elementwise kernel over n elements on a CPU device (d->kind == CFG_DEV_CPU). */
cfg_pointwise_cpu_schedule cfg_pointwise_cpu(const cfg_device *d, int64_t n, int elem_bytes);

typedef struct cfg_reduce_cpu_schedule {
    bool ok;
    int64_t rows, cols;
    int threads;             /* threads over rows: 1..min(cores, rows); a row is never split */
    int64_t rows_per_thread; /* threads * rows_per_thread >= rows > (threads - 1) * rows_per_thread */
    int lanes;               /* vector_bits / (8 * elem_bytes) */
    int accumulators;        /* independent vector accumulators per row: covers the FMA
                                latency (fma_units * 4), at most vector_regs / 2 and at
                                most the vectors in a row */
    char reason[192];
} cfg_reduce_cpu_schedule;

/* Row reduction on a CPU device. */
cfg_reduce_cpu_schedule cfg_reduce_cpu(const cfg_device *d, int64_t rows, int64_t cols, int elem_bytes);

#endif
