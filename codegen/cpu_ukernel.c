/* cpu_ukernel.c: bf16 contractions on the CPU as calls of the runtime's
 * AVX-512 BF16 kernel (runtime/rt_contract.c).
 *
 * Mixed precision (passes/amp.c) computes a matmul in bf16 as a contraction
 * of f32 values that are extensions of bf16 ones, accumulated in f32; the
 * fusion barriers of passes/fusion.c keep each extension a loop of its own,
 * whose f32 copy the contraction then reads.  On a host whose vector unit
 * multiplies bf16 pairs (vdpbf16ps: twice the multiply-adds of an f32 FMA,
 * half the bytes read) the contraction can read the bf16 values instead.
 *
 * cg_cpu_bf16_contractions (the "ukernels" stage, linalg on tensors, after
 * fusion and before tiling) rewrites each contraction C += A * B over f32
 * (linalg.matmul or a mul-add generic of static shapes, rewritten as
 * linalg.contract, cpu_contract.c) whose A and B are both extensions of
 * bf16 tensors (an all-parallel generic whose body is one arith.extf, maybe
 * reshaped by tensor.expand_shape/collapse_shape) into a linalg.contract of
 * the bf16 tensors with an f32 C; a bf16 operand that is a linalg.transpose
 * is read in place through the composed indexing map.  The extensions (and
 * transposes) that nothing else reads are erased: their copies are never
 * made.  The tiler leaves the op
 * alone (it tiles 16-bit operands only in elementwise ops); its cache
 * blocks (mc, nc, kc from cfg_gemm_cpu) go with it as nova.ukernel.
 *
 * cg_cpu_contract_calls (in the lowering to LLVM, after outlining, before
 * the lowering to loops) replaces each such linalg.contract on memrefs by
 * a call nova_rt_contract_bf16(A, B, C, desc): the addresses of the three
 * buffers (aligned pointer plus offset) and a descriptor on the stack with
 * the loop sizes, each operand's element stride along each loop (from the
 * buffers' strided metadata: any layout) and the blocks.
 *
 * Numerics: the products are exact in f32 as before; the sums are f32 sums
 * in k order, two products at a time, with denormals flushed (vdpbf16ps).
 * NOVAC_UKERNEL=0 turns the stage off (to compare).
 */
#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Linalg.h>
#include <stdlib.h>
#include <string.h>

#include "../configurator/gemm.h"
#include "codegen.h"
#include "cpu_tile.h"

#define UK_ATTR "nova.ukernel"
#define UK_FUNC "nova_rt_contract_bf16"
#define UK_MAXL 8 /* runtime/rt_contract.c's RT_CONTRACT_MAXL */
#define UK_MR 12  /* and its register tile, MR x NR */
#define UK_NR 32

static MlirNamedAttribute nattr(MlirContext ctx, const char *name, MlirAttribute a) {
  return mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str(name)), a);
}

static MlirType elem_of(MlirValue v) {
  MlirType t = mlirValueGetType(v);
  return mlirTypeIsAShaped(t) ? mlirShapedTypeGetElementType(t) : t;
}

static bool identity_map(MlirAttribute m) {
  return mlirAttributeIsAAffineMap(m) && mlirAffineMapIsIdentity(mlirAffineMapAttrGetValue(m));
}

/* Whether OP is an all-parallel generic Y = extf(X), X bf16, Y f32, both
 * indexed alike (identity maps). */
static bool is_extension(MlirOperation op) {
  if (!cg_op_is(op, "linalg.generic") || mlirOperationGetNumOperands(op) != 2 || mlirOperationGetNumResults(op) != 1)
    return false;
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  if (mlirAttributeIsNull(maps) || mlirArrayAttrGetNumElements(maps) != 2 ||
      !identity_map(mlirArrayAttrGetElement(maps, 0)) || !identity_map(mlirArrayAttrGetElement(maps, 1)))
    return false;
  if (!mlirTypeIsABF16(elem_of(mlirOperationGetOperand(op, 0))) ||
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

/* The bf16 tensor V extends (through reshapes), or null.  With BUILD, the
 * reshapes are made again on the bf16 values, before the old ones. */
static MlirValue bf16_source(MlirValue v, bool build) {
  if (!mlirValueIsAOpResult(v)) return (MlirValue){NULL};
  MlirOperation op = mlirOpResultGetOwner(v);
  if (is_extension(op)) return mlirOperationGetOperand(op, 0);
  if (!is_reshape(op) || mlirOperationGetNumResults(op) != 1) return (MlirValue){NULL};
  MlirValue s = bf16_source(mlirOperationGetOperand(op, 0), build);
  if (mlirValueIsNull(s) || !build) return s;
  MlirType rt = mlirValueGetType(v);
  int64_t shape[UK_MAXL];
  intptr_t rank = mlirShapedTypeGetRank(rt);
  if (rank > UK_MAXL) return (MlirValue){NULL};
  for (intptr_t i = 0; i < rank; i++) shape[i] = mlirShapedTypeGetDimSize(rt, i);
  MlirType nt = mlirRankedTensorTypeGet(rank, shape, elem_of(s), mlirAttributeGetNull());
  MlirOperationState st = mlirOperationStateGet(mlirIdentifierStr(mlirOperationGetName(op)), mlirOperationGetLocation(op));
  MlirValue ops[UK_MAXL + 1];
  intptr_t nops = mlirOperationGetNumOperands(op);
  if (nops > UK_MAXL + 1) return (MlirValue){NULL};
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
    if (!is_reshape(op) && !is_extension(op) && !cg_op_is(op, "linalg.transpose")) return;
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
      rank > UK_MAXL)
    return;
  /* out[x] = in[y] with y[perm[i]] = x[i]: result r of the new map is result inv[r] of the old */
  MlirAffineExpr e[UK_MAXL];
  for (intptr_t i = 0; i < rank; i++) {
    int64_t r = mlirDenseI64ArrayGetElement(perm, i);
    if (r < 0 || r >= rank) return;
    e[r] = mlirAffineMapGetResult(m, i);
  }
  *map = mlirAffineMapAttrGet(mlirAffineMapGet(ctx, mlirAffineMapGetNumDims(m), 0, rank, e));
  *v = mlirOperationGetOperand(t, 0);
}

/* The static size of each of OP's NL loops, from its operands' shapes and
 * its maps (results that are dims or the constant 0); false otherwise.
 * DIM_OF (may be NULL): [operand][result] the loop, -1 for a constant. */
static bool loop_sizes_of(MlirOperation op, int nl, int64_t *size, int (*dim_of)[UK_MAXL]) {
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  for (int d = 0; d < nl; d++) size[d] = 0;
  for (int i = 0; i < 3; i++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    MlirAffineMap mp = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    intptr_t rank = mlirShapedTypeGetRank(t);
    if (!mlirShapedTypeHasStaticShape(t) || rank > UK_MAXL || mlirAffineMapGetNumResults(mp) != rank) return false;
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

static bool loop_sizes(MlirOperation op, int nl, int64_t *size) { return loop_sizes_of(op, nl, size, NULL); }

/* The linalg.contract LC (f32, from cg_to_contract) as one of the bf16
 * tensors its A and B extend; LC itself when they do not. */
static MlirOperation contract_bf16(MlirContext ctx, MlirOperation lc, const cfg_device *host) {
  MlirValue a = bf16_source(mlirOperationGetOperand(lc, 0), true);
  MlirValue b = mlirValueIsNull(a) ? a : bf16_source(mlirOperationGetOperand(lc, 1), true);
  if (mlirValueIsNull(b)) return lc;
  MlirValue ops[3] = {a, b, mlirOperationGetOperand(lc, 2)};
  MlirType rt = mlirValueGetType(mlirOperationGetResult(lc, 0));
  cdims cd;
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(lc);
  int nl = (int)mlirAffineMapGetNumDims(mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, 0)));
  MlirAttribute nm[3] = {mlirArrayAttrGetElement(maps, 0), mlirArrayAttrGetElement(maps, 1),
                         mlirArrayAttrGetElement(maps, 2)};
  fold_transpose(ctx, &ops[0], &nm[0]);
  fold_transpose(ctx, &ops[1], &nm[1]);
  MlirAttribute newmaps = mlirArrayAttrGet(ctx, 3, nm);
  if (nl > UK_MAXL || !cg_contraction_dims(lc, nl, &cd)) return lc;
  int64_t size[UK_MAXL];
  if (!loop_sizes(lc, nl, size)) return lc;
  /* the rows: C's loops that B does not have (the runtime joins those that continue m) */
  int64_t rows = 1;
  MlirAffineMap bm = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, 1));
  MlirAffineMap cm = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, 2));
  for (intptr_t r = 0; r < mlirAffineMapGetNumResults(cm); r++) {
    MlirAffineExpr e = mlirAffineMapGetResult(cm, r);
    if (!mlirAffineExprIsADim(e)) continue;
    bool in_b = false;
    for (intptr_t q = 0; q < mlirAffineMapGetNumResults(bm); q++)
      in_b |= mlirAffineExprEqual(mlirAffineMapGetResult(bm, q), e);
    if (!in_b) rows *= size[mlirAffineDimExprGetPosition(e)];
  }
  cfg_gemm_cpu_schedule s = cfg_gemm_cpu_tile(host, rows, size[cd.n], size[cd.k_inner], 2, UK_MR, UK_NR);
  int64_t blocks[3] = {s.ok ? s.mc : 0, s.ok ? s.nc : 0, s.ok ? s.kc : 0};
  int32_t seg[2] = {2, 1};
  MlirNamedAttribute na[3] = {nattr(ctx, "indexing_maps", newmaps),
                              nattr(ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(ctx, 2, seg)),
                              nattr(ctx, UK_ATTR, mlirDenseI64ArrayGet(ctx, 3, blocks))};
  MlirOperationState st = mlirOperationStateGet(nova_str("linalg.contract"), mlirOperationGetLocation(lc));
  mlirOperationStateAddOperands(&st, 3, ops);
  mlirOperationStateAddResults(&st, 1, &rt);
  mlirOperationStateAddAttributes(&st, 3, na);
  MlirRegion region = mlirRegionCreate();
  mlirOperationStateAddOwnedRegions(&st, 1, &region);
  MlirOperation nc = mlirOperationCreate(&st);
  mlirLinalgFillBuiltinNamedOpRegion(nc);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(lc), lc, nc);
  MlirValue olda = mlirOperationGetOperand(lc, 0), oldb = mlirOperationGetOperand(lc, 1);
  if (!mlirOperationVerify(nc)) {
    mlirOperationDestroy(nc);
    erase_unused(a), erase_unused(b);
    return lc;
  }
  mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(lc, 0), mlirOperationGetResult(nc, 0));
  mlirOperationDestroy(lc);
  erase_unused(olda), erase_unused(oldb); /* a folded transpose with them */
  return nc;
}

/* Whether OP is a contraction over f32 whose A and B extend bf16 tensors. */
static bool candidate(MlirOperation op) {
  if (!(cg_op_is(op, "linalg.matmul") || cg_op_is(op, "linalg.generic")) || mlirOperationGetNumOperands(op) != 3 ||
      mlirOperationGetNumResults(op) != 1 || !cg_static_operands(op) || !mlirLinalgIsAContractionOp(op))
    return false;
  for (int i = 0; i < 3; i++)
    if (!mlirTypeIsAF32(elem_of(mlirOperationGetOperand(op, i)))) return false;
  return !mlirValueIsNull(bf16_source(mlirOperationGetOperand(op, 0), false)) &&
         !mlirValueIsNull(bf16_source(mlirOperationGetOperand(op, 1), false));
}

bool cg_cpu_bf16_dot(const cfg_device *host, int opt_level) {
  const char *knob = getenv("NOVAC_UKERNEL");
  return opt_level > 0 && host && host->kind == CFG_DEV_CPU && host->has_bf16_dot && !(knob && !strcmp(knob, "0"));
}

int cg_cpu_bf16_contractions(nova_ctx *c, MlirModule m, const cfg_device *host, int opt_level, int *count) {
  *count = 0;
  if (!cg_cpu_bf16_dot(host, opt_level)) return 0;
  cg_op_list ops = {0};
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    if (!cg_op_is(f, "func.func") || mlirRegionIsNull(mlirOperationGetFirstRegion(f))) continue;
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetFirstRegion(f));
    if (mlirBlockIsNull(body)) continue;
    for (MlirOperation o = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o))
      if (candidate(o)) cg_op_list_push(&ops, o);
  }
  if (ops.oom) {
    free(ops.v);
    return nv_error(c->diag, (nv_loc){0}, "out of memory"), -1;
  }
  for (size_t i = 0; i < ops.n; i++) {
    MlirOperation lc = cg_op_is(ops.v[i], "linalg.contract") ? ops.v[i] : cg_to_contract(c->ctx, ops.v[i]);
    if (mlirOperationIsNull(lc)) continue;
    MlirOperation nc = contract_bf16(c->ctx, lc, host);
    *count += !mlirOperationEqual(nc, lc);
  }
  free(ops.v);
  return 0;
}

/* ---- the calls ------------------------------------------------------- */

typedef struct builder {
  MlirContext ctx;
  MlirLocation loc;
  MlirBlock block;
  MlirOperation at;
} builder;

static MlirOperation make(builder *b, const char *name, int nops, const MlirValue *ops, int nres, const MlirType *rt,
                          int na, const MlirNamedAttribute *attrs) {
  MlirOperationState st = mlirOperationStateGet(nova_str(name), b->loc);
  if (nops) mlirOperationStateAddOperands(&st, nops, ops);
  if (nres) mlirOperationStateAddResults(&st, nres, rt);
  if (na) mlirOperationStateAddAttributes(&st, na, attrs);
  MlirOperation op = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(b->block, b->at, op);
  return op;
}

static MlirValue val1(builder *b, const char *name, int nops, const MlirValue *ops, MlirType t) {
  return mlirOperationGetResult(make(b, name, nops, ops, 1, &t, 0, NULL), 0);
}

static MlirValue cst(builder *b, MlirType t, int64_t v) {
  MlirNamedAttribute a = nattr(b->ctx, "value", mlirIntegerAttrGet(t, v));
  return mlirOperationGetResult(make(b, "arith.constant", 0, NULL, 1, &t, 1, &a), 0);
}

/* The strided metadata of memref V: its address (aligned pointer plus
 * offset, as i64) and its strides (index). */
static MlirValue address_and_strides(builder *b, MlirValue v, MlirValue *strides) {
  MlirType t = mlirValueGetType(v), ix = mlirIndexTypeGet(b->ctx), i64 = mlirIntegerTypeGet(b->ctx, 64);
  intptr_t rank = mlirShapedTypeGetRank(t);
  MlirType et = mlirShapedTypeGetElementType(t);
  MlirType rt[2 + 2 * UK_MAXL];
  rt[0] = mlirMemRefTypeGet(et, 0, NULL, mlirAttributeGetNull(), mlirMemRefTypeGetMemorySpace(t));
  for (intptr_t i = 1; i < 2 + 2 * rank; i++) rt[i] = ix;
  MlirOperation md = make(b, "memref.extract_strided_metadata", 1, &v, (int)(2 + 2 * rank), rt, 0, NULL);
  for (intptr_t r = 0; r < rank; r++) strides[r] = mlirOperationGetResult(md, 2 + rank + r);
  MlirValue base = mlirOperationGetResult(md, 0);
  MlirValue p = val1(b, "memref.extract_aligned_pointer_as_index", 1, &base, ix);
  MlirValue off[2] = {mlirOperationGetResult(md, 1), cst(b, ix, mlirTypeIsAF32(et) ? 4 : 2)};
  MlirValue bytes = val1(b, "arith.muli", 2, off, ix);
  MlirValue sum[2] = {p, bytes};
  MlirValue a = val1(b, "arith.addi", 2, sum, ix);
  return val1(b, "arith.index_cast", 1, &a, i64);
}

static bool is_bf16_contract(MlirOperation op) {
  if (!cg_op_is(op, "linalg.contract") || mlirOperationGetNumOperands(op) != 3) return false;
  for (int i = 0; i < 3; i++)
    if (!mlirTypeIsAMemRef(mlirValueGetType(mlirOperationGetOperand(op, i)))) return false;
  return mlirTypeIsABF16(elem_of(mlirOperationGetOperand(op, 0))) &&
         mlirTypeIsABF16(elem_of(mlirOperationGetOperand(op, 1))) &&
         mlirTypeIsAF32(elem_of(mlirOperationGetOperand(op, 2)));
}

static MlirWalkResult find_cb(MlirOperation op, void *ud) {
  if (is_bf16_contract(op)) cg_op_list_push(ud, op);
  return MlirWalkResultAdvance;
}

/* OP as the call; false (OP untouched) when its shape is not one the
 * runtime takes. */
static bool emit_call(MlirContext ctx, MlirOperation op) {
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  int nl = (int)mlirAffineMapGetNumDims(mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, 0)));
  if (nl > UK_MAXL) return false;
  int64_t size[UK_MAXL];
  int dim_of[3][UK_MAXL];
  if (!loop_sizes_of(op, nl, size, dim_of)) return false;
  /* k: the one loop C does not have; n: C's last, read by B and not A; m:
   * C's innermost other loop read by A and not B (the rest are outer) */
  bool in[3][UK_MAXL] = {{0}};
  int rank[3];
  for (int i = 0; i < 3; i++) {
    rank[i] = (int)mlirShapedTypeGetRank(mlirValueGetType(mlirOperationGetOperand(op, i)));
    for (int r = 0; r < rank[i]; r++)
      if (dim_of[i][r] >= 0) in[i][dim_of[i][r]] = true;
  }
  int lk = -1, nk = 0, ln = rank[2] ? dim_of[2][rank[2] - 1] : -1, lm = -1;
  for (int d = 0; d < nl; d++)
    if (!in[2][d]) lk = d, nk++;
  for (int r = rank[2] - 2; r >= 0 && lm < 0; r--) {
    int d = dim_of[2][r];
    if (d >= 0 && in[0][d] && !in[1][d]) lm = d;
  }
  if (nk != 1 || !in[0][lk] || !in[1][lk] || ln < 0 || in[0][ln] || !in[1][ln] || lm < 0) return false;
  MlirAttribute blk = mlirOperationGetDiscardableAttributeByName(op, nova_str(UK_ATTR));
  int64_t blocks[3] = {0, 0, 0};
  if (!mlirAttributeIsNull(blk) && mlirAttributeIsADenseI64Array(blk) && mlirDenseArrayGetNumElements(blk) == 3)
    for (int i = 0; i < 3; i++) blocks[i] = mlirDenseI64ArrayGetElement(blk, i);
  builder b = {ctx, mlirOperationGetLocation(op), mlirOperationGetBlock(op), op};
  MlirType ix = mlirIndexTypeGet(ctx), i64 = mlirIntegerTypeGet(ctx, 64);
  MlirValue addr[3], strides[3][UK_MAXL];
  for (int i = 0; i < 3; i++) addr[i] = address_and_strides(&b, mlirOperationGetOperand(op, i), strides[i]);
  /* the descriptor: L, m, n, k, mc, nc, kc, sizes, strides of A, B, C per loop */
  int nd = 7 + 4 * nl;
  int64_t shape = nd;
  MlirType dt = mlirMemRefTypeGet(i64, 1, &shape, mlirAttributeGetNull(), mlirAttributeGetNull());
  MlirNamedAttribute seg = nattr(ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(ctx, 2, (int32_t[]){0, 0}));
  MlirValue desc = mlirOperationGetResult(make(&b, "memref.alloca", 0, NULL, 1, &dt, 1, &seg), 0);
  int64_t head[7] = {nl, lm, ln, lk, blocks[0], blocks[1], blocks[2]};
  for (int j = 0; j < nd; j++) {
    MlirValue v;
    if (j < 7) v = cst(&b, i64, head[j]);
    else if (j < 7 + nl) v = cst(&b, i64, size[j - 7]);
    else {
      int i = (j - 7 - nl) / nl, l = (j - 7 - nl) % nl;
      MlirValue s = cst(&b, ix, 0);
      MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
      for (intptr_t r = 0; r < mlirShapedTypeGetRank(t); r++)
        if (dim_of[i][r] == l) {
          MlirValue ab[2] = {s, strides[i][r]};
          s = val1(&b, "arith.addi", 2, ab, ix);
        }
      v = val1(&b, "arith.index_cast", 1, &s, i64);
    }
    MlirValue st[3] = {v, desc, cst(&b, ix, j)};
    make(&b, "memref.store", 3, st, 0, NULL, 0, NULL);
  }
  MlirValue dp = val1(&b, "memref.extract_aligned_pointer_as_index", 1, &desc, ix);
  MlirValue args[4] = {addr[0], addr[1], addr[2], val1(&b, "arith.index_cast", 1, &dp, i64)};
  cg_insert_call(op, b.loc, mlirFlatSymbolRefAttrGet(ctx, nova_str(UK_FUNC)), 4, args, 0, NULL);
  mlirOperationDestroy(op);
  return true;
}

int cg_cpu_contract_calls(nova_ctx *c, MlirModule m) {
  cg_op_list ops = {0};
  mlirOperationWalk(mlirModuleGetOperation(m), find_cb, &ops, MlirWalkPreOrder);
  if (ops.oom) {
    free(ops.v);
    return nv_error(c->diag, (nv_loc){0}, "out of memory"), -1;
  }
  int n = 0;
  for (size_t i = 0; i < ops.n; i++) n += emit_call(c->ctx, ops.v[i]);
  free(ops.v);
  if (!n) return 0;
  /* its declaration: func.func private @UK_FUNC(i64, i64, i64, i64), no body */
  MlirContext ctx = c->ctx;
  MlirType i64 = mlirIntegerTypeGet(ctx, 64), tin[4] = {i64, i64, i64, i64};
  MlirNamedAttribute fa[3] = {
      nattr(ctx, "sym_name", mlirStringAttrGet(ctx, nova_str(UK_FUNC))),
      nattr(ctx, "function_type", mlirTypeAttrGet(mlirFunctionTypeGet(ctx, 4, tin, 0, NULL))),
      nattr(ctx, "sym_visibility", mlirStringAttrGet(ctx, nova_str("private")))};
  MlirOperationState fs = mlirOperationStateGet(nova_str("func.func"), mlirLocationUnknownGet(ctx));
  mlirOperationStateAddAttributes(&fs, 3, fa);
  MlirRegion body = mlirRegionCreate();
  mlirOperationStateAddOwnedRegions(&fs, 1, &body);
  mlirBlockInsertOwnedOperation(mlirModuleGetBody(m), 0, mlirOperationCreate(&fs));
  return 0;
}
