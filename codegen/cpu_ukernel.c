/* cpu_ukernel.c: contractions on the CPU as calls of the runtime's
 * BLIS-structured kernels (runtime/rt_contract.c).
 *
 * The "ukernels" stage (cg_cpu_contract_kernels: linalg on tensors, after
 * fusion and before tiling):
 *   - on a host whose vector unit multiplies bf16 pairs (vdpbf16ps: twice
 *     the multiply-adds of an f32 FMA, half the bytes read), each f32
 *     contraction of two bf16 extensions becomes a linalg.contract of the
 *     bf16 tensors (cg_half_contractions, half_contract.c);
 *   - on an x86 host with AVX2 + FMA or AVX-512, every other static f32
 *     contraction (linalg.matmul, mul-add generics: batched, several k
 *     dims collapsed) becomes a linalg.contract of its own operands, a
 *     linalg.transpose feeding A or B read in place through the composed
 *     map (the backward's dX = dY W^T and dW = X^T dY make no transposed
 *     copy: the kernel's packing reads any strides).
 * Each gets its register tile and cache blocks from the configurator
 * (cfg_gemm_cpu: mr x nr from the vector registers, 14 x 32 with
 * AVX-512, 6 x 16 with AVX2; kc from L1, mc from L2, nc from L3; bf16:
 * the kernel's 12 x 32 tile) as nova.ukernel = [mc, nc, kc], which the
 * tiler leaves alone.  Only layouts the kernels take are rewritten: one k
 * loop, C's last dim an n of B, an m of A inside it (the roles below).
 *
 * cg_cpu_contract_calls (in the lowering to LLVM, after outlining, before
 * the lowering to loops) replaces each such linalg.contract on memrefs by
 * a call nova_rt_contract_bf16 / nova_rt_contract_f32(A, B, C, desc): the
 * addresses of the three buffers (aligned pointer plus offset) and a
 * descriptor on the stack with the loop sizes, each operand's element
 * stride along each loop (from the buffers' strided metadata: any layout)
 * and the blocks.
 *
 * Numerics: f32: each product fused into its sum (FMA), the sums in k
 * order, added to C once per kc block.  bf16: the products exact in f32,
 * the sums f32 sums in k order, two products at a time, denormals flushed
 * (vdpbf16ps).  NOVAC_UKERNEL=0 turns the stage off (to compare).
 */
#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Linalg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../configurator/gemm.h"
#include "codegen.h"
#include "cpu_tile.h"

#define UK_ATTR "nova.ukernel"
#define UK_ZERO_ATTR "nova.ukernel_zero_c" /* C's init was a fill of zeros: the kernel stores (RT_CONTRACT_ZERO_C) */
#define UK_ZERO_C 1                          /* runtime/rt_contract.c's RT_CONTRACT_ZERO_C */
#define UK_HEAD 8                            /* and RT_CONTRACT_HEAD */
#define UK_FUNC_BF16 "nova_rt_contract_bf16"
#define UK_FUNC_F32 "nova_rt_contract_f32"
#define UK_MAXL CG_CONTRACT_MAXL /* runtime/rt_contract.c's RT_CONTRACT_MAXL */
#define UK_MR 12  /* and its bf16 register tile, MR x NR */
#define UK_NR 32

static MlirNamedAttribute nattr(MlirContext ctx, const char *name, MlirAttribute a) {
  return mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str(name)), a);
}

static MlirType elem_of(MlirValue v) {
  MlirType t = mlirValueGetType(v);
  return mlirTypeIsAShaped(t) ? mlirShapedTypeGetElementType(t) : t;
}

/* The loops' roles in contraction OP of NL loops (tensors or memrefs) as
 * the runtime's kernels take them: k, the one loop C does not have; n,
 * C's last, read by B and not A; m, C's innermost other loop read by A
 * and not B (the rest are outer).  False when OP has no such roles. */
static bool roles(MlirOperation op, int nl, int64_t *size, int (*dim_of)[UK_MAXL], int *lm, int *ln, int *lk) {
  if (nl > UK_MAXL || !cg_contract_loop_sizes(op, nl, size, dim_of)) return false;
  bool in[3][UK_MAXL] = {{0}};
  int rank[3];
  for (int i = 0; i < 3; i++) {
    rank[i] = (int)mlirShapedTypeGetRank(mlirValueGetType(mlirOperationGetOperand(op, i)));
    for (int r = 0; r < rank[i]; r++)
      if (dim_of[i][r] >= 0) in[i][dim_of[i][r]] = true;
  }
  int nk = 0;
  *lk = -1, *ln = rank[2] ? dim_of[2][rank[2] - 1] : -1, *lm = -1;
  for (int d = 0; d < nl; d++)
    if (!in[2][d]) *lk = d, nk++;
  for (int r = rank[2] - 2; r >= 0 && *lm < 0; r--) {
    int d = dim_of[2][r];
    if (d >= 0 && in[0][d] && !in[1][d]) *lm = d;
  }
  return nk == 1 && in[0][*lk] && in[1][*lk] && *ln >= 0 && !in[0][*ln] && in[1][*ln] && *lm >= 0;
}

/* The cache blocks of the contraction NC (made by cg_half_contractions
 * from the f32 one LC: of its bf16 sources, or of its own operands with
 * transposes read in place) as its nova.ukernel attribute: rows are C's
 * loops that B does not have (the runtime joins those that continue m).
 * False (LC stays) when NC's layout is not one the kernels take, or for
 * an f32 one under CG_UK_MIN_MACS. */
static bool set_blocks(MlirOperation nc, MlirOperation lc, void *ud) {
  const cfg_device *host = ud;
  MlirContext ctx = mlirOperationGetContext(nc);
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(lc);
  int nl = (int)mlirAffineMapGetNumDims(mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, 0)));
  cdims cd;
  int64_t size[UK_MAXL];
  int dim_of[3][UK_MAXL], lm, ln, lk;
  if (nl > UK_MAXL || !cg_contraction_dims(lc, nl, &cd) || !roles(nc, nl, size, dim_of, &lm, &ln, &lk))
    return false; /* (roles reads the loops' sizes: NC has LC's loops) */
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
  bool f32 = mlirTypeIsAF32(elem_of(mlirOperationGetOperand(nc, 0)));
  int64_t macs = 1;
  for (int d = 0; d < nl; d++) macs *= size[d];
  if (f32 && macs < CG_UK_MIN_MACS) return false; /* small: the tiler's inline loops */
  cfg_gemm_cpu_schedule s = f32 ? cfg_gemm_cpu(host, rows, size[cd.n], size[cd.k_inner], 4)
                                : cfg_gemm_cpu_tile(host, rows, size[cd.n], size[cd.k_inner], 2, UK_MR, UK_NR);
  int64_t blocks[3] = {s.ok ? s.mc : 0, s.ok ? s.nc : 0, s.ok ? s.kc : 0};
  mlirOperationSetDiscardableAttributeByName(nc, nova_str(UK_ATTR), mlirDenseI64ArrayGet(ctx, 3, blocks));
  return true;
}

bool cg_cpu_bf16_dot(const cfg_device *host, int opt_level) {
  const char *knob = getenv("NOVAC_UKERNEL");
  return opt_level > 0 && host && host->kind == CFG_DEV_CPU && host->has_bf16_dot && !(knob && !strcmp(knob, "0"));
}

bool cg_cpu_f32_kernel(const cfg_device *host, int opt_level) {
#if defined(__x86_64__)
  const char *knob = getenv("NOVAC_UKERNEL");
  return opt_level > 0 && host && host->kind == CFG_DEV_CPU && host->vector_bits >= 256 &&
         !(knob && !strcmp(knob, "0"));
#else
  (void)host, (void)opt_level;
  return false; /* the runtime's vector kernels are x86's */
#endif
}

/* V is a linalg.fill of +0.0 (the result of one); its destination in *DEST. */
static bool zero_fill(MlirValue v, MlirValue *dest) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation f = mlirOpResultGetOwner(v);
  if (!cg_op_is(f, "linalg.fill") || mlirOperationGetNumOperands(f) != 2) return false;
  MlirValue x = mlirOperationGetOperand(f, 0);
  if (!mlirValueIsAOpResult(x) || !cg_op_is(mlirOpResultGetOwner(x), "arith.constant")) return false;
  MlirAttribute a = mlirOperationGetAttributeByName(mlirOpResultGetOwner(x), nova_str("value"));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAFloat(a)) return false;
  double z = mlirFloatAttrGetValueDouble(a);
  if (z != 0 || signbit(z)) return false; /* (-0.0 + a sum of +0.0 is +0.0: the store would differ) */
  *dest = mlirOperationGetOperand(f, 1);
  return true;
}

static MlirWalkResult zero_cb(MlirOperation op, void *ud) {
  if (cg_op_is(op, "linalg.contract") &&
      !mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(op, nova_str(UK_ATTR))))
    cg_op_list_push(ud, op);
  return MlirWalkResultAdvance;
}

/* Each kernel contraction whose C starts as a fill of zeros takes the
 * fill's destination instead and is marked UK_ZERO_ATTR: the kernel then
 * stores its first k block's sums, zeroing each tile just before (in
 * cache), rather than adding them to a C that a separate pass zeroed
 * (5% of the 4-layer GPT's step on 2 threads went to those fills).  A
 * fill left without readers is erased.  Should the call not be made
 * (emit_call), the fill is made again in front of the op. */
static void absorb_zero_fills(MlirModule m) {
  cg_op_list ops = {0};
  mlirOperationWalk(mlirModuleGetOperation(m), zero_cb, &ops, MlirWalkPreOrder);
  for (size_t i = 0; i < ops.n; i++) {
    MlirValue c = mlirOperationGetOperand(ops.v[i], 2), dest;
    if (!zero_fill(c, &dest)) continue;
    MlirOperation f = mlirOpResultGetOwner(c);
    mlirOperationSetOperand(ops.v[i], 2, dest);
    mlirOperationSetDiscardableAttributeByName(ops.v[i], nova_str(UK_ZERO_ATTR),
                                               mlirUnitAttrGet(mlirOperationGetContext(f)));
    if (mlirOpOperandIsNull(mlirValueGetFirstUse(c))) mlirOperationDestroy(f);
  }
  free(ops.v);
}

int cg_cpu_contract_kernels(nova_ctx *c, MlirModule m, const cfg_device *host, int opt_level, int *count) {
  int n = 0;
  *count = 0;
  if (cg_cpu_bf16_dot(host, opt_level) && cg_half_contractions(c, m, CG_HALF_BF16, set_blocks, (void *)host, &n))
    return -1;
  *count += n, n = 0;
  if (cg_cpu_f32_kernel(host, opt_level) &&
      cg_half_contractions(c, m, CG_CONTRACT_F32, set_blocks, (void *)host, &n))
    return -1;
  *count += n;
  if (*count) absorb_zero_fills(m);
  return 0;
}

/* ---- the calls ------------------------------------------------------- */

MlirOperation cg_build(cg_builder *b, const char *name, int nops, const MlirValue *ops, int nres, const MlirType *rt,
                       int na, const MlirNamedAttribute *attrs) {
  MlirOperationState st = mlirOperationStateGet(nova_str(name), b->loc);
  if (nops) mlirOperationStateAddOperands(&st, nops, ops);
  if (nres) mlirOperationStateAddResults(&st, nres, rt);
  if (na) mlirOperationStateAddAttributes(&st, na, attrs);
  MlirOperation op = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(b->block, b->at, op);
  return op;
}

static MlirValue val1(cg_builder *b, const char *name, int nops, const MlirValue *ops, MlirType t) {
  return mlirOperationGetResult(cg_build(b, name, nops, ops, 1, &t, 0, NULL), 0);
}

MlirValue cg_build_const(cg_builder *b, MlirType t, int64_t v) {
  MlirNamedAttribute a = nattr(b->ctx, "value", mlirIntegerAttrGet(t, v));
  return mlirOperationGetResult(cg_build(b, "arith.constant", 0, NULL, 1, &t, 1, &a), 0);
}

MlirOperation cg_build_named(cg_builder *b, const char *name, MlirValue in, MlirValue out, const MlirType *rt) {
  MlirValue ops[2] = {in, out};
  MlirNamedAttribute seg = nattr(b->ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(b->ctx, 2, (int32_t[]){1, 1}));
  MlirOperationState st = mlirOperationStateGet(nova_str(name), b->loc);
  mlirOperationStateAddOperands(&st, 2, ops);
  if (rt) mlirOperationStateAddResults(&st, 1, rt);
  mlirOperationStateAddAttributes(&st, 1, &seg);
  MlirRegion r = mlirRegionCreate();
  mlirOperationStateAddOwnedRegions(&st, 1, &r);
  MlirOperation op = mlirOperationCreate(&st);
  mlirLinalgFillBuiltinNamedOpRegion(op);
  mlirBlockInsertOwnedOperationBefore(b->block, b->at, op);
  return op;
}

MlirValue cg_memref_address(cg_builder *b, MlirValue v, MlirValue *strides) {
  MlirType t = mlirValueGetType(v), ix = mlirIndexTypeGet(b->ctx), i64 = mlirIntegerTypeGet(b->ctx, 64);
  intptr_t rank = mlirShapedTypeGetRank(t);
  MlirType et = mlirShapedTypeGetElementType(t);
  MlirType *rt = malloc((size_t)(2 + 2 * rank) * sizeof *rt);
  if (!rt) return (MlirValue){NULL};
  rt[0] = mlirMemRefTypeGet(et, 0, NULL, mlirAttributeGetNull(), mlirMemRefTypeGetMemorySpace(t));
  for (intptr_t i = 1; i < 2 + 2 * rank; i++) rt[i] = ix;
  MlirOperation md = cg_build(b, "memref.extract_strided_metadata", 1, &v, (int)(2 + 2 * rank), rt, 0, NULL);
  free(rt);
  for (intptr_t r = 0; strides && r < rank; r++) strides[r] = mlirOperationGetResult(md, 2 + rank + r);
  MlirValue base = mlirOperationGetResult(md, 0);
  MlirValue p = val1(b, "memref.extract_aligned_pointer_as_index", 1, &base, ix);
  int64_t esize = mlirTypeIsAInteger(et) ? (mlirIntegerTypeGetWidth(et) + 7) / 8
                  : mlirTypeIsAF64(et)   ? 8
                  : mlirTypeIsAF32(et)   ? 4
                                         : 2;
  MlirValue off[2] = {mlirOperationGetResult(md, 1), cg_build_const(b, ix, esize)};
  MlirValue bytes = val1(b, "arith.muli", 2, off, ix);
  MlirValue sum[2] = {p, bytes};
  MlirValue a = val1(b, "arith.addi", 2, sum, ix);
  return val1(b, "arith.index_cast", 1, &a, i64);
}

/* Whether OP is a contraction the stage above gave to a kernel. */
static bool is_kernel_contract(MlirOperation op) {
  if (!cg_op_is(op, "linalg.contract") || mlirOperationGetNumOperands(op) != 3 ||
      mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(op, nova_str(UK_ATTR))))
    return false;
  for (int i = 0; i < 3; i++)
    if (!mlirTypeIsAMemRef(mlirValueGetType(mlirOperationGetOperand(op, i)))) return false;
  MlirType ta = elem_of(mlirOperationGetOperand(op, 0)), tb = elem_of(mlirOperationGetOperand(op, 1));
  return ((mlirTypeIsABF16(ta) && mlirTypeIsABF16(tb)) || (mlirTypeIsAF32(ta) && mlirTypeIsAF32(tb))) &&
         mlirTypeIsAF32(elem_of(mlirOperationGetOperand(op, 2)));
}

/* (every contraction the stage marked: one it cannot call gets its fill back) */
static MlirWalkResult find_cb(MlirOperation op, void *ud) {
  if (cg_op_is(op, "linalg.contract") &&
      !mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(op, nova_str(UK_ATTR))))
    cg_op_list_push(ud, op);
  return MlirWalkResultAdvance;
}

/* OP as the call (*USED |= 1 for bf16, 2 for f32); false (OP untouched)
 * when its shape is not one the runtime takes. */
static bool emit_call(MlirContext ctx, MlirOperation op, int *used) {
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  int nl = (int)mlirAffineMapGetNumDims(mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, 0)));
  if (nl > UK_MAXL) return false;
  int64_t size[UK_MAXL];
  int dim_of[3][UK_MAXL], lm, ln, lk;
  if (!roles(op, nl, size, dim_of, &lm, &ln, &lk)) return false;
  MlirAttribute blk = mlirOperationGetDiscardableAttributeByName(op, nova_str(UK_ATTR));
  int64_t blocks[3] = {0, 0, 0};
  if (!mlirAttributeIsNull(blk) && mlirAttributeIsADenseI64Array(blk) && mlirDenseArrayGetNumElements(blk) == 3)
    for (int i = 0; i < 3; i++) blocks[i] = mlirDenseI64ArrayGetElement(blk, i);
  cg_builder b = {ctx, mlirOperationGetLocation(op), mlirOperationGetBlock(op), op};
  MlirType ix = mlirIndexTypeGet(ctx), i64 = mlirIntegerTypeGet(ctx, 64);
  MlirValue addr[3], strides[3][UK_MAXL];
  for (int i = 0; i < 3; i++) addr[i] = cg_memref_address(&b, mlirOperationGetOperand(op, i), strides[i]);
  /* the descriptor: L, m, n, k, mc, nc, kc, flags, sizes, strides of A, B, C per loop */
  int nd = UK_HEAD + 4 * nl;
  int64_t shape = nd;
  MlirType dt = mlirMemRefTypeGet(i64, 1, &shape, mlirAttributeGetNull(), mlirAttributeGetNull());
  MlirNamedAttribute seg = nattr(ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(ctx, 2, (int32_t[]){0, 0}));
  MlirValue desc = mlirOperationGetResult(cg_build(&b, "memref.alloca", 0, NULL, 1, &dt, 1, &seg), 0);
  bool zero = !mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(op, nova_str(UK_ZERO_ATTR)));
  int64_t head[UK_HEAD] = {nl, lm, ln, lk, blocks[0], blocks[1], blocks[2], zero ? UK_ZERO_C : 0};
  for (int j = 0; j < nd; j++) {
    MlirValue v;
    if (j < UK_HEAD) v = cg_build_const(&b, i64, head[j]);
    else if (j < UK_HEAD + nl) v = cg_build_const(&b, i64, size[j - UK_HEAD]);
    else {
      int i = (j - UK_HEAD - nl) / nl, l = (j - UK_HEAD - nl) % nl;
      MlirValue s = cg_build_const(&b, ix, 0);
      MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
      for (intptr_t r = 0; r < mlirShapedTypeGetRank(t); r++)
        if (dim_of[i][r] == l) {
          MlirValue ab[2] = {s, strides[i][r]};
          s = val1(&b, "arith.addi", 2, ab, ix);
        }
      v = val1(&b, "arith.index_cast", 1, &s, i64);
    }
    MlirValue st[3] = {v, desc, cg_build_const(&b, ix, j)};
    cg_build(&b, "memref.store", 3, st, 0, NULL, 0, NULL);
  }
  MlirValue dp = val1(&b, "memref.extract_aligned_pointer_as_index", 1, &desc, ix);
  MlirValue args[4] = {addr[0], addr[1], addr[2], val1(&b, "arith.index_cast", 1, &dp, i64)};
  bool f32 = mlirTypeIsAF32(elem_of(mlirOperationGetOperand(op, 0)));
  cg_insert_call(op, b.loc, mlirFlatSymbolRefAttrGet(ctx, nova_str(f32 ? UK_FUNC_F32 : UK_FUNC_BF16)), 4, args, 0, NULL);
  mlirOperationDestroy(op);
  *used |= f32 ? 2 : 1;
  return true;
}

/* A kernel contraction OP (on memrefs) left as it is: the fill of zeros
 * absorb_zero_fills took from it made again, in front of it. */
static void refill(MlirContext ctx, MlirOperation op) {
  if (mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(op, nova_str(UK_ZERO_ATTR)))) return;
  mlirOperationRemoveDiscardableAttributeByName(op, nova_str(UK_ZERO_ATTR));
  cg_builder b = {ctx, mlirOperationGetLocation(op), mlirOperationGetBlock(op), op};
  MlirType f32 = mlirF32TypeGet(ctx);
  MlirNamedAttribute zv = nattr(ctx, "value", mlirFloatAttrDoubleGet(ctx, f32, 0));
  MlirValue zero = mlirOperationGetResult(cg_build(&b, "arith.constant", 0, NULL, 1, &f32, 1, &zv), 0);
  cg_build_named(&b, "linalg.fill", zero, mlirOperationGetOperand(op, 2), NULL);
}

int cg_cpu_contract_calls(nova_ctx *c, MlirModule m) {
  cg_op_list ops = {0};
  mlirOperationWalk(mlirModuleGetOperation(m), find_cb, &ops, MlirWalkPreOrder);
  if (ops.oom) {
    free(ops.v);
    return nv_error(c->diag, (nv_loc){0}, "out of memory"), -1;
  }
  int used = 0;
  for (size_t i = 0; i < ops.n; i++)
    if (!is_kernel_contract(ops.v[i]) || !emit_call(c->ctx, ops.v[i], &used)) refill(c->ctx, ops.v[i]);
  free(ops.v);
  if (used & 1) cg_declare_i64_func(m, UK_FUNC_BF16, 4);
  if (used & 2) cg_declare_i64_func(m, UK_FUNC_F32, 4);
  return 0;
}

void cg_declare_i64_func(MlirModule m, const char *name, int nargs) {
  MlirContext ctx = mlirModuleGetContext(m);
  MlirType i64 = mlirIntegerTypeGet(ctx, 64), tin[16];
  for (int i = 0; i < nargs && i < 16; i++) tin[i] = i64;
  MlirNamedAttribute fa[3] = {
      nattr(ctx, "sym_name", mlirStringAttrGet(ctx, nova_str(name))),
      nattr(ctx, "function_type", mlirTypeAttrGet(mlirFunctionTypeGet(ctx, nargs < 16 ? nargs : 16, tin, 0, NULL))),
      nattr(ctx, "sym_visibility", mlirStringAttrGet(ctx, nova_str("private")))};
  MlirOperationState fs = mlirOperationStateGet(nova_str("func.func"), mlirLocationUnknownGet(ctx));
  mlirOperationStateAddAttributes(&fs, 3, fa);
  MlirRegion body = mlirRegionCreate();
  mlirOperationStateAddOwnedRegions(&fs, 1, &body);
  mlirBlockInsertOwnedOperation(mlirModuleGetBody(m), 0, mlirOperationCreate(&fs));
}
