/* half_contract.c: contractions that read their 16-bit operands
 * themselves (both targets).
 *
 * Mixed precision (passes/amp.c) computes a matmul in bf16 or f16 as a
 * contraction of f32 values that are extensions of 16-bit ones,
 * accumulated in f32; the fusion barriers of passes/fusion.c keep each
 * extension a loop of its own, whose f32 copy the contraction reads.  A
 * target whose contractions multiply 16-bit operands (the CPU's vdpbf16ps
 * kernel, codegen/cpu_ukernel.c; the GPU's mma.sync, codegen/gemm_cuda.c)
 * reads the 16-bit values instead: half the bytes, no f32 copy in memory.
 *
 * cg_half_contractions (linalg on tensors, after fusion) rewrites each
 * contraction C += A * B over f32 (linalg.matmul or a mul-add generic of
 * static shapes, made a linalg.contract by cg_to_contract, cpu_contract.c)
 * whose A and B both extend 16-bit tensors of one type (an all-parallel
 * generic whose body is one arith.extf, maybe reshaped by
 * tensor.expand_shape/collapse_shape) into a linalg.contract of the 16-bit
 * tensors with the f32 C (its region extends each product's operands); a
 * 16-bit operand that is a linalg.transpose is read in place through the
 * composed indexing map.  The extensions (and transposes) that nothing else
 * reads are erased: their copies are never made.  The products are exact
 * in f32, as before; only the order of the sums may change.
 *
 * KINDS 0 (CG_CONTRACT_F32): every f32 contraction, its operands as they
 * are (transposes still read in place), for the CPU's f32 kernel.
 */
#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Linalg.h>
#include <stdlib.h>

#include "codegen.h"
#include "cpu_tile.h"

#define HC_MAXL CG_CONTRACT_MAXL

static MlirType elem_of(MlirValue v) {
  MlirType t = mlirValueGetType(v);
  return mlirTypeIsAShaped(t) ? mlirShapedTypeGetElementType(t) : t;
}

static bool identity_map(MlirAttribute m) {
  return mlirAttributeIsAAffineMap(m) && mlirAffineMapIsIdentity(mlirAffineMapAttrGetValue(m));
}

static bool is_half(MlirType t, unsigned kinds) {
  return ((kinds & CG_HALF_BF16) && mlirTypeIsABF16(t)) || ((kinds & CG_HALF_F16) && mlirTypeIsAF16(t));
}

/* Whether OP is an all-parallel generic Y = extf(X), X 16-bit (of KINDS),
 * Y f32, both indexed alike (identity maps). */
static bool is_extension(MlirOperation op, unsigned kinds) {
  if (!cg_op_is(op, "linalg.generic") || mlirOperationGetNumOperands(op) != 2 || mlirOperationGetNumResults(op) != 1)
    return false;
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  if (mlirAttributeIsNull(maps) || mlirArrayAttrGetNumElements(maps) != 2 ||
      !identity_map(mlirArrayAttrGetElement(maps, 0)) || !identity_map(mlirArrayAttrGetElement(maps, 1)))
    return false;
  if (!is_half(elem_of(mlirOperationGetOperand(op, 0)), kinds) ||
      !mlirTypeIsAF32(elem_of(mlirOperationGetResult(op, 0))))
    return false;
  MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  MlirOperation ext = mlirBlockIsNull(b) ? (MlirOperation){NULL} : mlirBlockGetFirstOperation(b);
  if (mlirOperationIsNull(ext) || !cg_op_is(ext, "arith.extf") ||
      !mlirValueEqual(mlirOperationGetOperand(ext, 0), mlirBlockGetArgument(b, 0)))
    return false;
  MlirOperation y = mlirOperationGetNextInBlock(ext);
  return !mlirOperationIsNull(y) && cg_op_is(y, "linalg.yield") && mlirOperationIsNull(mlirOperationGetNextInBlock(y)) &&
         mlirValueEqual(mlirOperationGetOperand(y, 0), mlirOperationGetResult(ext, 0));
}

static bool is_reshape(MlirOperation op) {
  return cg_op_is(op, "tensor.expand_shape") || cg_op_is(op, "tensor.collapse_shape");
}

/* The 16-bit tensor (of KINDS) V extends (through reshapes), or null.
 * With BUILD, the reshapes are made again on the 16-bit values, before the
 * old ones. */
static MlirValue half_source(MlirValue v, bool build, unsigned kinds) {
  if (!kinds) return v; /* CG_CONTRACT_F32: the operand itself */
  if (!mlirValueIsAOpResult(v)) return (MlirValue){NULL};
  MlirOperation op = mlirOpResultGetOwner(v);
  if (is_extension(op, kinds)) return mlirOperationGetOperand(op, 0);
  if (!is_reshape(op) || mlirOperationGetNumResults(op) != 1) return (MlirValue){NULL};
  MlirValue s = half_source(mlirOperationGetOperand(op, 0), build, kinds);
  if (mlirValueIsNull(s) || !build) return s;
  MlirType rt = mlirValueGetType(v);
  int64_t shape[HC_MAXL];
  intptr_t rank = mlirShapedTypeGetRank(rt);
  if (rank > HC_MAXL) return (MlirValue){NULL};
  for (intptr_t i = 0; i < rank; i++) shape[i] = mlirShapedTypeGetDimSize(rt, i);
  MlirType nt = mlirRankedTensorTypeGet(rank, shape, elem_of(s), mlirAttributeGetNull());
  MlirOperationState st = mlirOperationStateGet(mlirIdentifierStr(mlirOperationGetName(op)), mlirOperationGetLocation(op));
  MlirValue ops[HC_MAXL + 1];
  intptr_t nops = mlirOperationGetNumOperands(op);
  if (nops > HC_MAXL + 1) return (MlirValue){NULL};
  ops[0] = s;
  for (intptr_t i = 1; i < nops; i++) ops[i] = mlirOperationGetOperand(op, i);
  mlirOperationStateAddOperands(&st, nops, ops);
  mlirOperationStateAddResults(&st, 1, &nt);
  for (intptr_t i = 0; i < mlirOperationGetNumAttributes(op); i++) {
    MlirNamedAttribute a = mlirOperationGetAttribute(op, i);
    mlirOperationStateAddAttributes(&st, 1, &a);
  }
  MlirOperation r = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(op), op, r);
  return mlirOperationGetResult(r, 0);
}

/* Erases V's defining op and, recursively, the reshapes and extensions that
 * fed it, while they have no uses. */
static void erase_unused(MlirValue v) {
  while (mlirValueIsAOpResult(v) && mlirOpOperandIsNull(mlirValueGetFirstUse(v))) {
    MlirOperation op = mlirOpResultGetOwner(v);
    if (!is_reshape(op) && !is_extension(op, CG_HALF_BF16 | CG_HALF_F16) && !cg_op_is(op, "linalg.transpose")) return;
    MlirValue in = mlirOperationGetOperand(op, 0);
    mlirOperationDestroy(op);
    v = in;
  }
}

/* V made by a linalg.transpose: V becomes the transpose's input and MAP
 * (V's indexing map in a contraction) the map that reads it in place, so
 * that the transposed copy is not made (the kernel reads any strides). */
static void fold_transpose(MlirContext ctx, MlirValue *v, MlirAttribute *map) {
  if (!mlirValueIsAOpResult(*v)) return;
  MlirOperation t = mlirOpResultGetOwner(*v);
  if (!cg_op_is(t, "linalg.transpose")) return;
  MlirAttribute perm = mlirOperationGetAttributeByName(t, nova_str("permutation"));
  MlirAffineMap m = mlirAffineMapAttrGetValue(*map);
  intptr_t rank = mlirAffineMapGetNumResults(m);
  if (mlirAttributeIsNull(perm) || !mlirAttributeIsADenseI64Array(perm) || mlirDenseArrayGetNumElements(perm) != rank ||
      rank > HC_MAXL)
    return;
  /* out[x] = in[y] with y[perm[i]] = x[i]: result r of the new map is result inv[r] of the old */
  MlirAffineExpr e[HC_MAXL];
  for (intptr_t i = 0; i < rank; i++) {
    int64_t r = mlirDenseI64ArrayGetElement(perm, i);
    if (r < 0 || r >= rank) return;
    e[r] = mlirAffineMapGetResult(m, i);
  }
  *map = mlirAffineMapAttrGet(mlirAffineMapGet(ctx, mlirAffineMapGetNumDims(m), 0, rank, e));
  *v = mlirOperationGetOperand(t, 0);
}

/* V = tensor.collapse_shape(linalg.transpose(X)) whose groups each take
 * consecutive dims of X in order (X^T of a [batch, T, C] activation as a
 * [C, batch*T] matrix): V becomes X collapsed alike (a view, no copy) and
 * MAP the map that reads it in place, its results permuted as the groups
 * are.  The new collapse goes before BEFORE. */
static void fold_collapsed_transpose(MlirContext ctx, MlirOperation before, MlirValue *v, MlirAttribute *map) {
  if (!mlirValueIsAOpResult(*v)) return;
  MlirOperation col = mlirOpResultGetOwner(*v);
  if (!cg_op_is(col, "tensor.collapse_shape") || !mlirValueIsAOpResult(mlirOperationGetOperand(col, 0))) return;
  MlirOperation t = mlirOpResultGetOwner(mlirOperationGetOperand(col, 0));
  if (!cg_op_is(t, "linalg.transpose")) return;
  MlirAttribute perm = mlirOperationGetAttributeByName(t, nova_str("permutation"));
  MlirAttribute re = mlirOperationGetAttributeByName(col, nova_str("reassociation"));
  MlirValue x = mlirOperationGetOperand(t, 0);
  MlirType xt = mlirValueGetType(x);
  intptr_t rank = mlirShapedTypeGetRank(xt), ng = mlirAttributeIsNull(re) ? 0 : mlirArrayAttrGetNumElements(re);
  MlirAffineMap m = mlirAffineMapAttrGetValue(*map);
  if (mlirAttributeIsNull(perm) || !mlirAttributeIsADenseI64Array(perm) || mlirDenseArrayGetNumElements(perm) != rank ||
      rank > HC_MAXL || ng < 1 || mlirAffineMapGetNumResults(m) != ng)
    return;
  int64_t start[HC_MAXL], len[HC_MAXL];
  for (intptr_t g = 0; g < ng; g++) { /* group g: output dims o..o+len-1, input dims start..start+len-1 */
    MlirAttribute grp = mlirArrayAttrGetElement(re, g);
    len[g] = mlirArrayAttrGetNumElements(grp);
    for (intptr_t i = 0; i < len[g]; i++) {
      int64_t o = mlirIntegerAttrGetValueInt(mlirArrayAttrGetElement(grp, i));
      if (o < 0 || o >= rank) return;
      int64_t in = mlirDenseI64ArrayGetElement(perm, o);
      if (i == 0) start[g] = in;
      else if (in != start[g] + i) return;
    }
  }
  /* the groups in X's order: result j of the new map is result owner[j] of the old */
  int owner[HC_MAXL], nj = 0;
  MlirAttribute groups[HC_MAXL];
  int64_t shape[HC_MAXL];
  MlirType i64 = mlirIntegerTypeGet(ctx, 64);
  for (int64_t d = 0; d < rank; nj++) {
    intptr_t g = 0;
    while (g < ng && start[g] != d) g++;
    if (g == ng) return;
    MlirAttribute dims[HC_MAXL];
    shape[nj] = 1;
    for (int64_t i = 0; i < len[g]; i++) {
      dims[i] = mlirIntegerAttrGet(i64, d + i);
      shape[nj] *= mlirShapedTypeGetDimSize(xt, d + i);
    }
    groups[nj] = mlirArrayAttrGet(ctx, len[g], dims);
    owner[nj] = (int)g;
    d += len[g];
  }
  MlirAffineExpr e[HC_MAXL];
  for (int j = 0; j < nj; j++) e[j] = mlirAffineMapGetResult(m, owner[j]);
  *map = mlirAffineMapAttrGet(mlirAffineMapGet(ctx, mlirAffineMapGetNumDims(m), 0, nj, e));
  *v = cg_collapse_shape(ctx, before, x, nj, shape, groups);
}

/* The static size of each of OP's NL loops, from its operands' shapes and
 * its maps (results that are dims or the constant 0); false otherwise.
 * DIM_OF (may be NULL): [operand][result] the loop, -1 for a constant. */
bool cg_contract_loop_sizes(MlirOperation op, int nl, int64_t *size, int (*dim_of)[CG_CONTRACT_MAXL]) {
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  for (int d = 0; d < nl; d++) size[d] = 0;
  for (int i = 0; i < 3; i++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    MlirAffineMap mp = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    intptr_t rank = mlirShapedTypeGetRank(t);
    if (!mlirShapedTypeHasStaticShape(t) || rank > HC_MAXL || mlirAffineMapGetNumResults(mp) != rank) return false;
    for (intptr_t r = 0; r < rank; r++) {
      MlirAffineExpr e = mlirAffineMapGetResult(mp, r);
      int d = mlirAffineExprIsADim(e) ? (int)mlirAffineDimExprGetPosition(e) : -1;
      if (dim_of) dim_of[i][r] = d;
      if (d >= 0 && d < nl) size[d] = mlirShapedTypeGetDimSize(t, r);
      else if (d >= 0 || !(mlirAffineExprIsAConstant(e) && mlirAffineConstantExprGetValue(e) == 0)) return false;
    }
  }
  for (int d = 0; d < nl; d++)
    if (size[d] < 1) return false;
  return true;
}

/* The linalg.contract LC (f32, from cg_to_contract) as one of the 16-bit
 * tensors its A and B extend, if HOOK (given LC too) accepts it; LC
 * itself when they do not. */
static MlirOperation contract_half(MlirContext ctx, MlirOperation lc, unsigned kinds, cg_half_hook hook, void *ud) {
  MlirValue a = half_source(mlirOperationGetOperand(lc, 0), true, kinds);
  MlirValue b = mlirValueIsNull(a) ? a : half_source(mlirOperationGetOperand(lc, 1), true, kinds);
  if (mlirValueIsNull(b)) return lc;
  MlirValue ops[3] = {a, b, mlirOperationGetOperand(lc, 2)};
  MlirType rt = mlirValueGetType(mlirOperationGetResult(lc, 0));
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(lc);
  MlirAttribute nm[3] = {mlirArrayAttrGetElement(maps, 0), mlirArrayAttrGetElement(maps, 1),
                         mlirArrayAttrGetElement(maps, 2)};
  for (int i = 0; i < 2; i++) {
    fold_collapsed_transpose(ctx, lc, &ops[i], &nm[i]);
    fold_transpose(ctx, &ops[i], &nm[i]);
  }
  MlirOperation nc = cg_new_contract(ctx, lc, ops, rt, nm);
  MlirValue olda = mlirOperationGetOperand(lc, 0), oldb = mlirOperationGetOperand(lc, 1);
  if (!mlirOperationVerify(nc) || (hook && !hook(nc, lc, ud))) {
    mlirOperationDestroy(nc);
    erase_unused(a), erase_unused(b);
    return lc;
  }
  mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(lc, 0), mlirOperationGetResult(nc, 0));
  mlirOperationDestroy(lc);
  erase_unused(olda), erase_unused(oldb); /* a folded transpose with them */
  return nc;
}

/* Whether OP is a contraction over f32 whose A and B extend 16-bit tensors
 * of one type (of KINDS). */
static bool candidate(MlirOperation op, unsigned kinds) {
  if (!(cg_op_is(op, "linalg.matmul") || cg_op_is(op, "linalg.generic")) || mlirOperationGetNumOperands(op) != 3 ||
      mlirOperationGetNumResults(op) != 1 || !cg_static_operands(op) || !mlirLinalgIsAContractionOp(op))
    return false;
  for (int i = 0; i < 3; i++)
    if (!mlirTypeIsAF32(elem_of(mlirOperationGetOperand(op, i)))) return false;
  if (!kinds) return true;
  MlirValue a = half_source(mlirOperationGetOperand(op, 0), false, kinds);
  MlirValue b = half_source(mlirOperationGetOperand(op, 1), false, kinds);
  return !mlirValueIsNull(a) && !mlirValueIsNull(b) && mlirTypeEqual(elem_of(a), elem_of(b));
}

/* The top-level ops of every function body of M for which WANT(op, KINDS)
 * holds, in order, into OPS; -1 (and an error) when out of memory. */
static int func_ops(nova_ctx *c, MlirModule m, bool (*want)(MlirOperation, unsigned), unsigned kinds,
                    cg_op_list *ops) {
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    if (!cg_op_is(f, "func.func") || mlirRegionIsNull(mlirOperationGetFirstRegion(f))) continue;
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetFirstRegion(f));
    if (mlirBlockIsNull(body)) continue;
    for (MlirOperation o = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o))
      if (want(o, kinds)) cg_op_list_push(ops, o);
  }
  if (!ops->oom) return 0;
  free(ops->v);
  return nv_error(c->diag, (nv_loc){0}, "out of memory"), -1;
}

int cg_half_contractions(nova_ctx *c, MlirModule m, unsigned kinds, cg_half_hook hook, void *ud, int *count) {
  *count = 0;
  cg_op_list ops = {0};
  if (func_ops(c, m, candidate, kinds, &ops)) return -1;
  for (size_t i = 0; i < ops.n; i++) {
    MlirOperation lc = cg_op_is(ops.v[i], "linalg.contract") ? ops.v[i] : cg_to_contract(c->ctx, ops.v[i]);
    if (mlirOperationIsNull(lc)) continue;
    *count += !mlirOperationEqual(contract_half(c->ctx, lc, kinds, hook, ud), lc);
  }
  free(ops.v);
  return 0;
}

/* The elementwise consumer of contraction OP's result: its only user, a
 * linalg.generic in the same block whose one output has an identity map
 * (every loop parallel); else null. */
static MlirOperation sole_elementwise_user(MlirOperation op) {
  if (mlirOperationGetNumResults(op) != 1) return (MlirOperation){NULL};
  MlirOpOperand u = mlirValueGetFirstUse(mlirOperationGetResult(op, 0));
  if (mlirOpOperandIsNull(u) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u))) return (MlirOperation){NULL};
  MlirOperation e = mlirOpOperandGetOwner(u);
  if (!cg_op_is(e, "linalg.generic") || mlirOperationGetNumResults(e) != 1 ||
      !mlirBlockEqual(mlirOperationGetBlock(e), mlirOperationGetBlock(op)))
    return (MlirOperation){NULL};
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(e);
  intptr_t n = mlirArrayAttrGetNumElements(maps);
  return n >= 1 && identity_map(mlirArrayAttrGetElement(maps, n - 1)) ? e : (MlirOperation){NULL};
}

/* A contraction the GPU's tensor cores will take: 16-bit operands, or
 * (TF32) f32 ones. */
static bool is_tc_contract(MlirOperation op, unsigned tf32) {
  if (!cg_op_is(op, "linalg.contract") || mlirOperationGetNumOperands(op) != 3) return false;
  MlirType a = elem_of(mlirOperationGetOperand(op, 0));
  return mlirTypeIsABF16(a) || mlirTypeIsAF16(a) || (tf32 && mlirTypeIsAF32(a));
}

int cg_gemm_epilogue_order(nova_ctx *c, MlirModule m, bool tf32, int *count) {
  *count = 0;
  cg_op_list ops = {0};
  if (func_ops(c, m, is_tc_contract, tf32, &ops)) return -1;
  /* each contraction once (several may feed one generic: the last moved
   * is then the one next to it) */
  for (size_t i = 0; i < ops.n; i++) {
    MlirOperation o = ops.v[i], e = sole_elementwise_user(o);
    if (mlirOperationIsNull(e) || mlirOperationEqual(mlirOperationGetNextInBlock(o), e)) continue;
    /* the zero fill of the contraction's init goes along when only it reads it */
    MlirValue init = mlirOperationGetOperand(o, mlirOperationGetNumOperands(o) - 1);
    MlirOperation fill = mlirValueIsAOpResult(init) ? mlirOpResultGetOwner(init) : (MlirOperation){NULL};
    MlirOpOperand fu = mlirValueGetFirstUse(init);
    bool move_fill = !mlirOperationIsNull(fill) && cg_op_is(fill, "linalg.fill") &&
                     mlirBlockEqual(mlirOperationGetBlock(fill), mlirOperationGetBlock(o)) && !mlirOpOperandIsNull(fu) &&
                     mlirOpOperandIsNull(mlirOpOperandGetNextUse(fu));
    mlirOperationMoveBefore(o, e);
    if (move_fill) mlirOperationMoveBefore(fill, o);
    (*count)++;
  }
  free(ops.v);
  return 0;
}
