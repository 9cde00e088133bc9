/* cpu_tile.h: what cpu_tile.c and cpu_contract.c share. */
#ifndef NOVA_CPU_TILE_H
#define NOVA_CPU_TILE_H

#include <mlir-c/IR.h>
#include <stdbool.h>

#include "../frontend/graph.h"

#define MAXL (NOVA_MAX_RANK + 2) /* loops of one op */

/* The roles of the loops of a contraction C[.., m, n] += A[.., k] B[.., n]
 * (linalg's inference: batch, m, n, k dims) when its layout suits the
 * register tile: one n loop, last in B and in C (contiguous), and an m loop
 * just before it in C.  M_INNER, N and K_INNER (the k loop innermost in A
 * if there is one, else the last k loop) get the register tile and the
 * K-by-1 loop; every other loop is tiled by 1. */
typedef struct cdims {
  int m_inner, n, k_inner;
  bool k[MAXL];
} cdims;

bool cg_contraction_dims(MlirOperation op, int nloops, cdims *cd);
/* Whether every operand of OP has a static shape. */
bool cg_static_operands(MlirOperation op);
/* OP (a contraction: linalg.matmul or a mul-add generic) as a
 * linalg.contract whose layout suits the register tile (several k loops
 * collapsed into one, operands collapsed to match), in its place; null
 * (OP unchanged) when it cannot be. */
MlirOperation cg_to_contract(MlirContext ctx, MlirOperation op);
/* A linalg.contract of OPS (A, B, C) with the indexing MAPS and result
 * type RT, its region filled, inserted before BEFORE (at its location);
 * not verified. */
MlirOperation cg_new_contract(MlirContext ctx, MlirOperation before, const MlirValue *ops, MlirType rt,
                              const MlirAttribute *maps);
/* OP (a linalg.generic on static tensors, not a contraction) with adjacent
 * loops of one iterator type merged where every operand has them adjacent
 * (or neither), the operands collapsed, the result expanded back; the new
 * op, or OP when nothing merges (cpu_tile.c). */
MlirOperation cg_merge_loops(MlirContext ctx, MlirOperation op);
/* tensor.collapse_shape of V into NR dims of SHAPE, GROUPS its
 * reassociation (arrays of i64 attributes), inserted before BEFORE. */
MlirValue cg_collapse_shape(MlirContext ctx, MlirOperation before, MlirValue v, int nr, const int64_t *shape,
                            const MlirAttribute *groups);

#endif
