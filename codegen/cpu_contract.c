/* cpu_contract.c: recognizing contractions and rewriting them as
 * linalg.contract in the layout cpu_tile.c's register tile needs (see
 * cpu_tile.c's header comment for the schedules). */
#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Linalg.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "cpu_tile.h"
/* Result R of operand I's map as a loop dim, -1 if it is not a dim. */
static int map_dim(MlirAttribute maps, int i, intptr_t r) {
  MlirAffineMap mp = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
  intptr_t nr = mlirAffineMapGetNumResults(mp);
  if (r < 0) r += nr;
  if (r < 0 || r >= nr) return -1;
  MlirAffineExpr e = mlirAffineMapGetResult(mp, r);
  return mlirAffineExprIsADim(e) ? (int)mlirAffineDimExprGetPosition(e) : -1;
}

static bool dims_of(MlirAttribute a, bool *set, int n) {
  if (mlirAttributeIsNull(a) || !mlirAttributeIsADenseI32Array(a)) return false;
  for (intptr_t i = 0; i < mlirDenseArrayGetNumElements(a); i++) {
    int d = mlirDenseI32ArrayGetElement(a, i);
    if (d < 0 || d >= n) return false;
    set[d] = true;
  }
  return true;
}



bool cg_contraction_dims(MlirOperation op, int nloops, cdims *cd) {
  if (!mlirLinalgIsAContractionOp(op)) return false;
  MlirLinalgContractionDimensions ld = mlirLinalgInferContractionDimensions(op);
  bool m[MAXL] = {0}, n[MAXL] = {0};
  memset(cd, 0, sizeof *cd);
  if (!dims_of(ld.m, m, nloops) || !dims_of(ld.n, n, nloops) || !dims_of(ld.k, cd->k, nloops)) return false;
  int nn = 0, nk = 0;
  for (int d = 0; d < nloops; d++) nn += n[d], nk += cd->k[d];
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  cd->n = map_dim(maps, 2, -1);
  cd->m_inner = -1; /* the innermost m dimension of the output (n dimensions may sit between) */
  for (intptr_t r = -2; cd->m_inner < 0; r--) {
    int d = map_dim(maps, 2, r);
    if (d < 0) break;
    if (d < MAXL && m[d]) cd->m_inner = d;
  }
  /* the innermost n dimension is vectorized; other n dimensions (a split
   * output, e.g. heads x head size) are outer loops like batch dimensions */
  if (nn < 1 || !nk || cd->n < 0 || !n[cd->n] || map_dim(maps, 1, -1) != cd->n || cd->m_inner < 0 ||
      !m[cd->m_inner])
    return false;
  cd->k_inner = map_dim(maps, 0, -1);
  if (cd->k_inner < 0 || !cd->k[cd->k_inner])
    for (int d = 0; d < nloops; d++)
      if (cd->k[d]) cd->k_inner = d;
  return true;
}

/* True when OP's body is exactly acc + a * b (or b * a) in one element
 * type, with no casts: what linalg.contract computes. */
static bool plain_mul_add(MlirOperation op) {
  if (cg_op_is(op, "linalg.matmul") || cg_op_is(op, "linalg.contract")) return true;
  MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (mlirBlockIsNull(b) || mlirBlockGetNumArguments(b) != 3) return false;
  MlirOperation mul = mlirBlockGetFirstOperation(b);
  MlirOperation add = mlirOperationIsNull(mul) ? mul : mlirOperationGetNextInBlock(mul);
  MlirOperation yield = mlirOperationIsNull(add) ? add : mlirOperationGetNextInBlock(add);
  if (mlirOperationIsNull(yield) || !mlirOperationIsNull(mlirOperationGetNextInBlock(yield))) return false;
  bool fl = cg_op_is(mul, "arith.mulf");
  if (!(fl ? cg_op_is(add, "arith.addf") : cg_op_is(mul, "arith.muli") && cg_op_is(add, "arith.addi"))) return false;
  MlirType t = mlirValueGetType(mlirBlockGetArgument(b, 2));
  for (int i = 0; i < 2; i++)
    if (!mlirTypeEqual(mlirValueGetType(mlirBlockGetArgument(b, i)), t)) return false;
  MlirValue a0 = mlirBlockGetArgument(b, 0), a1 = mlirBlockGetArgument(b, 1), acc = mlirBlockGetArgument(b, 2);
  MlirValue m0 = mlirOperationGetOperand(mul, 0), m1 = mlirOperationGetOperand(mul, 1);
  MlirValue mr = mlirOperationGetResult(mul, 0);
  MlirValue s0 = mlirOperationGetOperand(add, 0), s1 = mlirOperationGetOperand(add, 1);
  bool mul_ok = (mlirValueEqual(m0, a0) && mlirValueEqual(m1, a1)) ||
                (mlirValueEqual(m0, a1) && mlirValueEqual(m1, a0));
  bool add_ok = (mlirValueEqual(s0, acc) && mlirValueEqual(s1, mr)) ||
                (mlirValueEqual(s0, mr) && mlirValueEqual(s1, acc));
  return mul_ok && add_ok && mlirValueEqual(mlirOperationGetOperand(yield, 0), mlirOperationGetResult(add, 0));
}

bool cg_static_operands(MlirOperation op) {
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t)) return false;
  }
  return true;
}

/* ---- contractions as linalg.contract ---------------------------------- */

static MlirAttribute i64_list(MlirContext ctx, int n, const int *v) {
  MlirAttribute a[MAXL];
  for (int i = 0; i < n; i++) a[i] = mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), v[i]);
  return mlirArrayAttrGet(ctx, n, a);
}

/* tensor.collapse_shape of V merging its dims [at, at + n) into one,
 * inserted before BEFORE; V itself when n == 1. */
static MlirValue collapse(MlirContext ctx, MlirOperation before, MlirValue v, int at, int n) {
  if (n == 1) return v;
  MlirType t = mlirValueGetType(v);
  int rank = (int)mlirShapedTypeGetRank(t), nr = 0, grp[MAXL];
  int64_t shape[MAXL];
  MlirAttribute groups[MAXL];
  for (int i = 0; i < rank;) {
    int len = i == at ? n : 1;
    shape[nr] = 1;
    for (int j = 0; j < len; j++) grp[j] = i + j, shape[nr] *= mlirShapedTypeGetDimSize(t, i + j);
    groups[nr++] = i64_list(ctx, len, grp);
    i += len;
  }
  return cg_collapse_shape(ctx, before, v, nr, shape, groups);
}

MlirValue cg_collapse_shape(MlirContext ctx, MlirOperation before, MlirValue v, int nr, const int64_t *shape,
                            const MlirAttribute *groups) {
  MlirType rt = mlirRankedTensorTypeGet(nr, shape, mlirShapedTypeGetElementType(mlirValueGetType(v)),
                                        mlirAttributeGetNull());
  MlirNamedAttribute na = mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("reassociation")),
                                                mlirArrayAttrGet(ctx, nr, groups));
  MlirOperationState st = mlirOperationStateGet(nova_str("tensor.collapse_shape"), mlirOperationGetLocation(before));
  mlirOperationStateAddOperands(&st, 1, &v);
  mlirOperationStateAddResults(&st, 1, &rt);
  mlirOperationStateAddAttributes(&st, 1, &na);
  MlirOperation c = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(before), before, c);
  return mlirOperationGetResult(c, 0);
}

/* A or B's map in the new loop order: C's dims keep C's positions, the k
 * run (at AT, N long) becomes the single loop K. */
static MlirAttribute new_map(MlirContext ctx, const int *dims, int rank, int at, int n, const int *newpos, int nd,
                             int k) {
  MlirAffineExpr e[MAXL];
  int ne = 0;
  for (int i = 0; i < rank; i++) {
    if (i == at) e[ne++] = mlirAffineDimExprGet(ctx, k);
    if (i >= at && i < at + n) continue;
    e[ne++] = mlirAffineDimExprGet(ctx, newpos[dims[i]]);
  }
  return mlirAffineMapAttrGet(mlirAffineMapGet(ctx, nd, 0, ne, e));
}

/* Where the k loops (dims not in C) sit in a map: a run of NK consecutive
 * results, in the order ORDER (filled by the first call); -1 otherwise. */
static int k_run(const int *dims, int rank, const bool *isk, int nk, int *order, bool set) {
  int at = -1;
  for (int i = 0; i < rank; i++)
    if (isk[dims[i]]) {
      at = i;
      break;
    }
  if (at < 0 || at + nk > rank) return -1;
  for (int j = 0; j < nk; j++) {
    if (!isk[dims[at + j]]) return -1;
    if (set) order[j] = dims[at + j];
    else if (order[j] != dims[at + j]) return -1;
  }
  for (int i = at + nk; i < rank; i++)
    if (isk[dims[i]]) return -1;
  return at;
}

/* Rewrites contraction OP (plain mul-add body, static shapes) as a
 * linalg.contract whose loops are C's dims in C's order, then one k loop:
 * several k loops are merged by collapsing A and B over them
 * (tensor.collapse_shape, a view once bufferized).  After tiling, every
 * unit dim of a register tile is then a leading parallel dim (dropped by
 * cast_away_vector_leading_one_dim) and the tile vectorizes, with
 * create_named_contraction, to a plain (m, n, k) vector.contract that
 * lowers to outer products.  Requires maps of dims only, C of rank >= 2
 * whose last dim n is last in B too, the k dims consecutive and in one
 * order in A and in B.  Returns the new op, or null (OP untouched). */
MlirOperation cg_new_contract(MlirContext ctx, MlirOperation before, const MlirValue *ops, MlirType rt,
                              const MlirAttribute *maps) {
  int32_t seg[2] = {2, 1};
  MlirNamedAttribute na[2] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("indexing_maps")), mlirArrayAttrGet(ctx, 3, maps)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("operandSegmentSizes")),
                            mlirDenseI32ArrayGet(ctx, 2, seg))};
  MlirOperationState st = mlirOperationStateGet(nova_str("linalg.contract"), mlirOperationGetLocation(before));
  mlirOperationStateAddOperands(&st, 3, ops);
  mlirOperationStateAddResults(&st, 1, &rt);
  mlirOperationStateAddAttributes(&st, 2, na);
  MlirRegion region = mlirRegionCreate();
  mlirOperationStateAddOwnedRegions(&st, 1, &region);
  MlirOperation lc = mlirOperationCreate(&st);
  mlirLinalgFillBuiltinNamedOpRegion(lc);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(before), before, lc);
  return lc;
}

MlirOperation cg_to_contract(MlirContext ctx, MlirOperation op) {
  if (mlirOperationGetNumOperands(op) != 3 || mlirOperationGetNumResults(op) != 1 || !plain_mul_add(op) ||
      !mlirLinalgIsAContractionOp(op))
    return (MlirOperation){NULL};
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  int dims[3][MAXL], rank[3], nloops = 0;
  for (int i = 0; i < 3; i++) {
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    nloops = (int)mlirAffineMapGetNumDims(m);
    rank[i] = (int)mlirAffineMapGetNumResults(m);
    if (nloops > MAXL || rank[i] > MAXL) return (MlirOperation){NULL};
    for (int r = 0; r < rank[i]; r++) {
      dims[i][r] = map_dim(maps, i, r);
      if (dims[i][r] < 0) return (MlirOperation){NULL};
    }
  }
  int rc = rank[2];
  if (rc < 2 || rank[1] < 1 || dims[1][rank[1] - 1] != dims[2][rc - 1]) return (MlirOperation){NULL};
  bool isk[MAXL];
  int newpos[MAXL], nk = 0, order[MAXL];
  for (int d = 0; d < nloops; d++) isk[d] = true;
  for (int r = 0; r < rc; r++) isk[dims[2][r]] = false, newpos[dims[2][r]] = r;
  for (int d = 0; d < nloops; d++) nk += isk[d];
  int ka = nk ? k_run(dims[0], rank[0], isk, nk, order, true) : -1;
  int kb = ka >= 0 ? k_run(dims[1], rank[1], isk, nk, order, false) : -1;
  if (kb < 0) return (MlirOperation){NULL};
  MlirValue a = collapse(ctx, op, mlirOperationGetOperand(op, 0), ka, nk);
  MlirValue b = collapse(ctx, op, mlirOperationGetOperand(op, 1), kb, nk);
  MlirAttribute nm[3] = {new_map(ctx, dims[0], rank[0], ka, nk, newpos, rc + 1, rc),
                         new_map(ctx, dims[1], rank[1], kb, nk, newpos, rc + 1, rc),
                         new_map(ctx, dims[2], rc, -1, 0, newpos, rc + 1, rc)};
  MlirValue ops[3] = {a, b, mlirOperationGetOperand(op, 2)};
  MlirOperation lc = cg_new_contract(ctx, op, ops, mlirValueGetType(mlirOperationGetResult(op, 0)), nm);
  if (!mlirOperationVerify(lc)) { /* leave OP as it was; unused collapses go with canonicalization */
    mlirOperationDestroy(lc);
    return (MlirOperation){NULL};
  }
  mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(op, 0), mlirOperationGetResult(lc, 0));
  mlirOperationDestroy(op);
  return lc;
}
