/* cuda_internal.h: what the parts of the cuda target share: cuda.c (loop
 * nests to kernels, GEMMs, PTX) and gpu_rows.c (row kernels). */
#ifndef NOVA_CUDA_INTERNAL_H
#define NOVA_CUDA_INTERNAL_H

#include <mlir-c/IR.h>
#include <stdbool.h>
#include <stdint.h>

#include "../configurator/device.h"
#include "codegen.h"

#define MAX_LOOP_RANK 8

typedef struct gpu_ctx {
  nova_ctx *c;
  MlirContext ctx;
  const cfg_device *dev;
  cg_gpu *out;
  bool sim;      /* --gpu-sim: buffers stay host allocations */
  cg_kernel *gemm;  /* GEMM kernels made by matmuls_to_gemm, in program order */
  int ngemm, gemm_used;
  int block;     /* --gpu-block: threads per block chosen by hand; 0 = the configurator's */
  bool tf32;     /* --matmul-precision=tf32 */
  int failed;
  const int *gemm_tile; /* --gemm-tile: BM, BN, BK, WM, WN (all 0: the configurator's) */
} gpu_ctx;

typedef struct row_region {
  MlirBlock b;
  MlirOperation end;   /* its terminator: insert before it */
} row_region;

/* Building ops (cuda.c): an attribute; op NAME before REF in BLOCK (at
 * its end for a null REF); an index constant; a binary op of X's type;
 * the value of an index constant (false: none). */
MlirNamedAttribute cu_named(MlirContext ctx, const char *name, MlirAttribute a);
MlirOperation cu_mk(MlirBlock block, MlirOperation ref, const char *name, MlirLocation loc, int nops,
                    const MlirValue *ops, int nres, const MlirType *res, int nattr, const MlirNamedAttribute *attrs);
MlirValue cu_index_const(MlirContext ctx, MlirBlock b, MlirOperation ref, MlirLocation loc, int64_t v);
MlirValue cu_binop(MlirBlock b, MlirOperation ref, MlirLocation loc, const char *name, MlirValue x, MlirValue y);
bool cu_const_index(MlirValue v, int64_t *out);
/* scf.if (COND) before REF, its then region; arith.cmpi PRED of X and Y. */
row_region cu_if(MlirBlock b, MlirOperation ref, MlirLocation loc, MlirValue cond);
MlirValue cu_cmp(gpu_ctx *G, MlirBlock b, MlirOperation ref, MlirLocation loc, int pred, MlirValue x, MlirValue y);

/* Kernels (cuda.c): the kernel table's next entry; its op and source
 * from LOC; a gpu.launch (GRID x BLOCK) before REF, its body (ending in
 * *TERM); every op of FROM but its terminator moved before REF. */
cg_kernel *cu_new_kernel(gpu_ctx *G);
void cu_describe_loc(MlirLocation loc, cg_kernel *k);
MlirBlock cu_make_launch(gpu_ctx *G, MlirBlock b, MlirOperation ref, MlirLocation loc, int64_t grid, int64_t block,
                         MlirOperation *term);
void cu_move_body(MlirBlock from, MlirOperation ref);
/* Ops that stay on the host (no computation on tensor data). */
bool cu_host_op(MlirOperation op);
/* Where buffer V lies (its root, first byte, size; false: unknown), and
 * whether two buffers may share bytes. */
bool cu_extent(MlirValue v, MlirValue *base, int64_t *off, int64_t *size);
bool cu_may_overlap(MlirValue a, MlirValue b);

/* Row kernels (gpu_rows.c): the runs among the top-level ops OPS[0..n)
 * (GRP[i]: op i's run, or -1), NULL out of memory; whether OP is run G's
 * last nest (where its kernel goes); the run as one kernel. */
typedef struct cu_rows cu_rows;
cu_rows *cu_rows_find(gpu_ctx *G, MlirOperation *ops, int n, int *grp);
bool cu_rows_is_last(const cu_rows *r, int g, MlirOperation op);
void cu_rows_map(gpu_ctx *G, MlirBlock fb, cu_rows *r, int g);
void cu_rows_free(cu_rows *r);

#endif
