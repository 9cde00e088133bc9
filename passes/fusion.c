/* fusion.c: elementwise fusion of the whole step (cg_fuse).
 *
 * Requires: the step in linalg on tensors (cg_lower_to_linalg), -O1 and up.
 * Changes: producers merged into their consumers by MLIR's
 * linalg-fuse-elementwise-ops, after canonicalize and CSE, within two bounds
 * set by barriers (calls that give a producer a second use, removed
 * afterwards): the size of a fused body (below), a producer that
 * computes read by a broadcast (a contraction's operand) stays apart, and
 * contractions and reductions keep f32 operands where a producer extends
 * an f16/bf16 value
 * (--precision: the CPU tiler vectorizes 16-bit types in elementwise ops
 * only), and a convolution's im2col matrix stays apart from its GEMM.  Where the target's contractions read bf16 operands themselves
 * (HALF_CONTRACTIONS: codegen/cpu_ukernel.c), the bf16 values such an
 * extension reads stay tensors too, not fused into it.  A 16-bit value
 * that several f32 ops read gets one extension per reader, so that it is
 * kept in 16 bits, not as a shared f32 copy.  The counts of
 * linalg ops before and after go to the manifest.
 *
 * After fusing, a producer that computes its value from much smaller
 * tensors and that several loops read, each element once, is copied into
 * each of them (copy_cheap_producers), and fusion runs again: a broadcast
 * is recomputed where it is read instead of being held at full size.
 *
 * The cap: a bound on how much elementwise fusion merges into one op.
 *
 * linalg-fuse-elementwise-ops merges a producer into its consumer by
 * copying both bodies into a new op.  Along a chain (a flat sum of N terms,
 * ((t0 + t1) + t2) + ...) each merge copies the body grown so far, so the
 * pass took time quadratic in the chain (279 s for 10,000 terms), and the
 * one loop nest it built held the whole chain.
 *
 * The pass fuses a producer only when its result has one use.  Before it
 * runs, cg_fusion_barriers estimates the body each linalg.generic would end
 * with (its own ops plus those of the single-use, all-parallel producers
 * fused into it, recursively, in program order) and, where that passes
 * CG_FUSION_CAP ops, gives the largest such producers a second use, a call
 * of an empty private function (@__nova_fusion_barrier_K, one per type),
 * until the estimate is under the cap.  cg_drop_fusion_barriers erases the
 * calls and the functions afterwards.  Steps whose fused bodies stay under
 * the cap (every model in the zoo) are fused exactly as without it.
 */
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "passes.h"

#define CG_FUSION_CAP 128
#define BARRIER_PREFIX "__nova_fusion_barrier_"

typedef struct cap_state {
  MlirModule m;
  cg_ptrmap size; /* linalg.generic -> index into est */
  int64_t *est;
  int n, cap;
  MlirAttribute parallel; /* #linalg.iterator_type<parallel> */
  MlirType *types;        /* the barrier functions made so far, by operand type */
  int ntypes;
  bool half_contractions; /* the target's contractions read 16-bit operands themselves */
} cap_state;

static bool all_parallel(const cap_state *s, MlirOperation op) {
  MlirAttribute it = mlirOperationGetAttributeByName(op, nova_str("iterator_types"));
  if (mlirAttributeIsNull(it) || !mlirAttributeIsAArray(it)) return false;
  for (intptr_t i = 0; i < mlirArrayAttrGetNumElements(it); i++)
    if (!mlirAttributeEqual(mlirArrayAttrGetElement(it, i), s->parallel)) return false;
  return true;
}

static int64_t body_ops(MlirOperation op) {
  int64_t n = 0;
  MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  for (MlirOperation o = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o)) n++;
  return n > 1 ? n - 1 : 1; /* not the yield */
}

/* The producer of operand I of OP that fusion would merge into it, or null. */
static MlirOperation fusable_producer(const cap_state *s, MlirOperation op, intptr_t i) {
  MlirValue v = mlirOperationGetOperand(op, i);
  if (!mlirValueIsAOpResult(v)) return (MlirOperation){NULL};
  MlirOperation p = mlirOpResultGetOwner(v);
  if (!cg_op_is(p, "linalg.generic") || mlirOperationGetNumResults(p) != 1) return (MlirOperation){NULL};
  MlirOpOperand u = mlirValueGetFirstUse(v);
  if (mlirOpOperandIsNull(u) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u))) return (MlirOperation){NULL};
  return all_parallel(s, p) ? p : (MlirOperation){NULL};
}

static int64_t estimate(cap_state *s, MlirOperation op) {
  int k = cg_ptrmap_get(&s->size, op.ptr);
  return k >= 0 ? s->est[k] : body_ops(op);
}

/* A second use of V: a call of the barrier function of its type. */
static void add_barrier(cap_state *s, MlirValue v, MlirOperation before) {
  MlirContext ctx = mlirModuleGetContext(s->m);
  MlirType t = mlirValueGetType(v);
  int k = 0;
  while (k < s->ntypes && !mlirTypeEqual(s->types[k], t)) k++;
  char name[64];
  snprintf(name, sizeof name, BARRIER_PREFIX "%d", k);
  if (k == s->ntypes) {
    s->types = nv_xrealloc(s->types, (size_t)(k + 1) * sizeof *s->types);
    s->types[s->ntypes++] = t;
    MlirOperation ret;
    MlirOperation f = cg_make_func(ctx, mlirLocationUnknownGet(ctx), name, 1, &t, 0, NULL, &ret);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(s->m), f);
  }
  cg_insert_call(before, mlirOperationGetLocation(before), mlirFlatSymbolRefAttrGet(ctx, nova_str(name)), 1, &v, 0, NULL);
}

/* Whether OP reads an f16 or bf16 tensor (a --precision value extended to f32). */
static bool reads_half(MlirOperation op) {
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    MlirType et = mlirTypeIsARankedTensor(t) ? mlirShapedTypeGetElementType(t) : t;
    if (mlirTypeIsAF16(et) || mlirTypeIsABF16(et)) return true;
  }
  return false;
}

/* V's producer through reshapes (each V's only use), which fusion
 * propagates: the value under them and its user, in *V and *USER. */
static void under_reshapes(MlirValue *v, MlirOperation *user) {
  while (mlirValueIsAOpResult(*v) && (cg_op_is(mlirOpResultGetOwner(*v), "tensor.expand_shape") ||
                                      cg_op_is(mlirOpResultGetOwner(*v), "tensor.collapse_shape"))) {
    MlirOpOperand u = mlirValueGetFirstUse(*v);
    if (mlirOpOperandIsNull(u) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u))) return;
    *user = mlirOpResultGetOwner(*v);
    *v = mlirOperationGetOperand(*user, 0);
  }
}

/* The 16-bit operands of the extension P that single-use elementwise ops
 * make (a rounding of f32 to bf16), maybe reshaped (a convolution's
 * weight), stay tensors of their own, with a barrier: a contraction that
 * reads 16-bit operands (codegen/cpu_ukernel.c, the GPU's mma.sync) then
 * reads them instead of P's f32 copy. */
static void keep_half_operands(cap_state *s, MlirOperation p, int *barriers) {
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(p); i++) {
    MlirValue v = mlirOperationGetOperand(p, i);
    MlirType t = mlirValueGetType(v);
    if (!mlirTypeIsARankedTensor(t) || !(mlirTypeIsAF16(mlirShapedTypeGetElementType(t)) ||
                                         mlirTypeIsABF16(mlirShapedTypeGetElementType(t))))
      continue;
    MlirOperation user = p;
    under_reshapes(&v, &user);
    if (!mlirValueIsAOpResult(v)) continue;
    MlirOperation q = mlirOpResultGetOwner(v);
    MlirOpOperand u = mlirValueGetFirstUse(v);
    if (!cg_op_is(q, "linalg.generic") || mlirOperationGetNumResults(q) != 1 || !all_parallel(s, q) ||
        mlirOpOperandIsNull(u) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u)))
      continue;
    add_barrier(s, v, user);
    ++*barriers;
  }
}

/* A contraction or reduction (a generic that is not all parallel, or a
 * linalg.matmul, which fusion merges producers into too) keeps f32
 * operands: the producer extending a half operand stays an elementwise op
 * of its own, with a barrier (the CPU tiler vectorizes f16/bf16 only in
 * elementwise ops; a contraction reading halves would be scalar loops). */
static void half_barriers(cap_state *s, MlirOperation op, int *barriers) {
  intptr_t n = mlirOperationGetNumOperands(op);
  if (cg_op_is(op, "linalg.generic") && all_parallel(s, op)) return;
  for (intptr_t i = 0; i < n; i++) {
    MlirValue v = mlirOperationGetOperand(op, i); /* through reshapes, which fusion propagates */
    while (mlirValueIsAOpResult(v) && (cg_op_is(mlirOpResultGetOwner(v), "tensor.expand_shape") ||
                                       cg_op_is(mlirOpResultGetOwner(v), "tensor.collapse_shape")))
      v = mlirOperationGetOperand(mlirOpResultGetOwner(v), 0);
    if (!mlirValueIsAOpResult(v)) continue;
    MlirOperation p = mlirOpResultGetOwner(v);
    if (cg_op_is(p, "linalg.generic") && mlirOperationGetNumResults(p) == 1 && all_parallel(s, p) && reads_half(p)) {
      add_barrier(s, v, op);
      ++*barriers;
      if (s->half_contractions) keep_half_operands(s, p, barriers);
    }
  }
}

/* Whether OP's body computes (has an op besides its yield). */
static bool computes(MlirOperation op) {
  MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  MlirOperation o = mlirBlockGetFirstOperation(b);
  return !mlirOperationIsNull(o) && !cg_op_is(o, "linalg.yield");
}

/* Whether OP reads its operand I at fewer loops than it has: the same
 * element at every iteration of the others (a matmul's operands, a row
 * statistic broadcast over the row). */
static bool broadcast_read(MlirOperation op, intptr_t i) {
  if (!cg_op_is(op, "linalg.generic")) return true; /* linalg.matmul and the other named contractions */
  MlirAttribute maps = mlirOperationGetAttributeByName(op, nova_str("indexing_maps"));
  if (mlirAttributeIsNull(maps) || !mlirAttributeIsAArray(maps) || i >= mlirArrayAttrGetNumElements(maps)) return true;
  MlirAttribute a = mlirArrayAttrGetElement(maps, i);
  if (!mlirAttributeIsAAffineMap(a)) return true;
  MlirAffineMap m = mlirAffineMapAttrGetValue(a);
  return mlirAffineMapGetNumResults(m) < mlirAffineMapGetNumDims(m);
}

/* A producer that computes, read by OP as a broadcast, keeps its result
 * (a barrier): merged into OP its body would run again at every
 * iteration of the loops it does not depend on (an erf-GELU merged into
 * the matmul that reads it, once per output column: a training step 16x
 * slower).  Copies and transposes (a body of just a yield) still fuse. */
static void broadcast_barriers(cap_state *s, MlirOperation op, int *barriers) {
  MlirAttribute seg = mlirOperationGetAttributeByName(op, nova_str("operandSegmentSizes"));
  if (mlirAttributeIsNull(seg) || !mlirAttributeIsADenseI32Array(seg)) return;
  for (intptr_t i = 0; i < mlirDenseI32ArrayGetElement(seg, 0); i++) { /* the inputs, not the inits */
    MlirOperation p = fusable_producer(s, op, i);
    if (mlirOperationIsNull(p) || !computes(p) || !broadcast_read(op, i)) continue;
    add_barrier(s, mlirOperationGetOperand(op, i), op);
    ++*barriers;
  }
}

/* Whether P gathers windows: a copy (a body of just a yield) whose input
 * map is no projected permutation (im2col: x[n, c, o s + k d]). */
static bool window_copy(MlirOperation p) {
  if (computes(p) || mlirOperationGetNumOperands(p) != 2) return false;
  MlirAttribute maps = mlirOperationGetAttributeByName(p, nova_str("indexing_maps"));
  if (mlirAttributeIsNull(maps) || !mlirAttributeIsAArray(maps) || mlirArrayAttrGetNumElements(maps) < 1) return false;
  MlirAttribute a = mlirArrayAttrGetElement(maps, 0);
  return mlirAttributeIsAAffineMap(a) && !mlirAffineMapIsProjectedPermutation(mlirAffineMapAttrGetValue(a));
}

/* The im2col matrix a convolution's GEMM reads (codegen/lower_window.c)
 * stays a tensor (a barrier): merged into the GEMM it would make it the
 * window loops again, which no contraction kernel takes. */
static void window_barriers(cap_state *s, MlirOperation op, int *barriers) {
  if (all_parallel(s, op)) return;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirOperation p = fusable_producer(s, op, i);
    if (mlirOperationIsNull(p) || !window_copy(p)) continue;
    add_barrier(s, mlirOperationGetOperand(op, i), op);
    ++*barriers;
  }
}

static void visit(cap_state *s, MlirOperation op, int *barriers) {
  intptr_t n = mlirOperationGetNumOperands(op);
  int64_t total = body_ops(op);
  half_barriers(s, op, barriers);
  broadcast_barriers(s, op, barriers);
  window_barriers(s, op, barriers);
  for (intptr_t i = 0; i < n; i++) {
    MlirOperation p = fusable_producer(s, op, i);
    if (!mlirOperationIsNull(p)) total += estimate(s, p);
  }
  while (total > CG_FUSION_CAP) { /* cut off the largest producer left */
    intptr_t best = -1;
    int64_t bs = 0;
    for (intptr_t i = 0; i < n; i++) {
      MlirOperation p = fusable_producer(s, op, i);
      if (!mlirOperationIsNull(p) && estimate(s, p) > bs) {
        bs = estimate(s, p);
        best = i;
      }
    }
    if (best < 0) break;
    add_barrier(s, mlirOperationGetOperand(op, best), op);
    total -= bs;
    ++*barriers;
  }
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 256;
    s->est = nv_xrealloc(s->est, (size_t)s->cap * sizeof *s->est);
  }
  s->est[s->n] = total;
  cg_ptrmap_put(&s->size, op.ptr, s->n++);
}

/* Whether OP is an all-parallel generic whose body only extends its one
 * 16-bit input to f32. */
static bool is_half_extension(const cap_state *s, MlirOperation op) {
  if (!cg_op_is(op, "linalg.generic") || mlirOperationGetNumOperands(op) != 2 || mlirOperationGetNumResults(op) != 1 ||
      !all_parallel(s, op) || !reads_half(op))
    return false;
  MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  MlirOperation e = mlirBlockGetFirstOperation(b);
  if (mlirOperationIsNull(e) || !cg_op_is(e, "arith.extf")) return false;
  MlirOperation y = mlirOperationGetNextInBlock(e);
  return !mlirOperationIsNull(y) && cg_op_is(y, "linalg.yield") && mlirOperationIsNull(mlirOperationGetNextInBlock(y));
}

/* A 16-bit value read by several f32 ops is extended once (amp.c casts
 * each value once, and CSE merges alike casts); fusion would then merge
 * its producer into the extension and keep the f32 copy, twice the bytes,
 * alive for every reader (the backward pass's among them).  Each reader
 * after the first gets an extension of its own instead, which fusion
 * merges into it: the value is kept in 16 bits. */
static void split_extensions(const cap_state *s, MlirBlock body) {
  for (MlirOperation op = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (!is_half_extension(s, op)) continue;
    MlirValue v = mlirOperationGetResult(op, 0);
    MlirOpOperand u = mlirValueGetFirstUse(v);
    if (mlirOpOperandIsNull(u)) continue;
    for (MlirOpOperand next = mlirOpOperandGetNextUse(u); !mlirOpOperandIsNull(next);) {
      MlirOpOperand after = mlirOpOperandGetNextUse(next);
      MlirOperation user = mlirOpOperandGetOwner(next);
      if (cg_op_is(user, "linalg.generic")) {
        MlirOperation c = mlirOperationClone(op);
        mlirBlockInsertOwnedOperationAfter(body, op, c);
        mlirOperationSetOperand(user, (intptr_t)mlirOpOperandGetOperandNumber(next), mlirOperationGetResult(c, 0));
      }
      next = after;
    }
  }
}

int cg_fusion_barriers(MlirModule m, bool half_contractions) {
  MlirContext ctx = mlirModuleGetContext(m);
  cap_state s = {.m = m, .parallel = mlirAttributeParseGet(ctx, nova_str("#linalg.iterator_type<parallel>")),
                 .half_contractions = half_contractions};
  int barriers = 0, nops = 0;
  MlirBlock mb = mlirModuleGetBody(m);
  for (MlirOperation f = mlirBlockGetFirstOperation(mb); !mlirOperationIsNull(f); f = mlirOperationGetNextInBlock(f)) {
    MlirRegion r = mlirOperationGetFirstRegion(f);
    if (!cg_op_is(f, "func.func") || mlirRegionIsNull(r) || mlirBlockIsNull(mlirRegionGetFirstBlock(r))) continue;
    for (MlirOperation op = mlirBlockGetFirstOperation(mlirRegionGetFirstBlock(r)); !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op))
      nops++;
  }
  for (MlirOperation f = mlirBlockGetFirstOperation(mb); !mlirOperationIsNull(f); f = mlirOperationGetNextInBlock(f)) {
    MlirRegion r = mlirOperationGetFirstRegion(f);
    if (cg_op_is(f, "func.func") && !mlirRegionIsNull(r) && !mlirBlockIsNull(mlirRegionGetFirstBlock(r)))
      split_extensions(&s, mlirRegionGetFirstBlock(r));
  }
  cg_ptrmap_init(&s.size, 4 * (size_t)nops + 1);
  for (MlirOperation f = mlirBlockGetFirstOperation(mb); !mlirOperationIsNull(f); f = mlirOperationGetNextInBlock(f)) {
    MlirRegion r = mlirOperationGetFirstRegion(f);
    if (!cg_op_is(f, "func.func") || mlirRegionIsNull(r) || mlirBlockIsNull(mlirRegionGetFirstBlock(r))) continue;
    for (MlirOperation op = mlirBlockGetFirstOperation(mlirRegionGetFirstBlock(r)); !mlirOperationIsNull(op);
         op = mlirOperationGetNextInBlock(op))
      if (cg_op_is(op, "linalg.generic")) visit(&s, op, &barriers);
      else if (cg_op_is(op, "linalg.matmul") || cg_op_is(op, "linalg.batch_matmul")) {
        half_barriers(&s, op, &barriers);
        broadcast_barriers(&s, op, &barriers);
      }
  }
  cg_ptrmap_free(&s.size);
  free(s.est);
  free(s.types);
  return barriers;
}

static MlirWalkResult drop_calls(MlirOperation op, void *ud) {
  cg_op_list *calls = ud;
  if (!cg_op_is(op, "func.call")) return MlirWalkResultAdvance;
  MlirStringRef callee = mlirFlatSymbolRefAttrGetValue(mlirOperationGetAttributeByName(op, nova_str("callee")));
  if (callee.length > strlen(BARRIER_PREFIX) && !memcmp(callee.data, BARRIER_PREFIX, strlen(BARRIER_PREFIX)))
    cg_op_list_push(calls, op);
  return MlirWalkResultAdvance;
}

void cg_drop_fusion_barriers(MlirModule m) {
  cg_op_list calls = {0};
  mlirOperationWalk(mlirModuleGetOperation(m), drop_calls, &calls, MlirWalkPreOrder);
  for (size_t i = 0; i < calls.n; i++) mlirOperationDestroy(calls.v[i]);
  free(calls.v);
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);) {
    MlirOperation next = mlirOperationGetNextInBlock(f);
    MlirAttribute name = mlirOperationGetAttributeByName(f, nova_str("sym_name"));
    MlirStringRef s = mlirAttributeIsNull(name) ? (MlirStringRef){"", 0} : mlirStringAttrGetValue(name);
    if (cg_op_is(f, "func.func") && s.length > strlen(BARRIER_PREFIX) &&
        !memcmp(s.data, BARRIER_PREFIX, strlen(BARRIER_PREFIX)))
      mlirOperationDestroy(f);
    f = next;
  }
}

/* ---- the pass ---- */

static MlirWalkResult count_linalg(MlirOperation op, void *ud) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  if (s.length > 7 && !memcmp(s.data, "linalg.", 7) && (s.length != 12 || memcmp(s.data, "linalg.yield", 12)) &&
      (s.length != 12 || memcmp(s.data, "linalg.index", 12)))
    ++*(int *)ud;
  return MlirWalkResultAdvance;
}

/* ---- cheap producers copied into each reader -------------------------------- */

static int64_t value_elements(MlirValue v) {
  MlirType t = mlirValueGetType(v);
  if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t)) return -1;
  int64_t e = 1;
  for (intptr_t i = 0; i < mlirShapedTypeGetRank(t); i++) e *= mlirShapedTypeGetDimSize(t, i);
  return e;
}


static bool reshape_op(MlirOperation op) {
  return cg_op_is(op, "tensor.expand_shape") || cg_op_is(op, "tensor.collapse_shape");
}

/* Whether the use U is an input of a linalg.generic of block B that reads
 * each element once: its map a projected permutation whose missing loops
 * all have extent 1. */
static bool reads_each_once(MlirOpOperand u, MlirBlock b) {
  MlirOperation c = mlirOpOperandGetOwner(u);
  intptr_t k = mlirOpOperandGetOperandNumber(u);
  if (!cg_op_is(c, "linalg.generic") || !mlirBlockEqual(mlirOperationGetBlock(c), b)) return false;
  MlirAttribute maps = mlirOperationGetAttributeByName(c, nova_str("indexing_maps"));
  MlirAttribute seg = mlirOperationGetAttributeByName(c, nova_str("operandSegmentSizes"));
  if (mlirAttributeIsNull(maps) || mlirAttributeIsNull(seg) || k >= mlirDenseI32ArrayGetElement(seg, 0)) return false;
  MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, k));
  if (!mlirAffineMapIsProjectedPermutation(m)) return false;
  intptr_t nd = mlirAffineMapGetNumDims(m);
  if (nd > 16) return false;
  int64_t extent[16];
  bool used[16] = {0};
  for (intptr_t d = 0; d < nd; d++) extent[d] = -1;
  for (intptr_t j = 0; j < mlirOperationGetNumOperands(c) && j < mlirArrayAttrGetNumElements(maps); j++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(c, j));
    MlirAffineMap mj = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, j));
    if (!mlirTypeIsARankedTensor(t) || mlirAffineMapGetNumResults(mj) != mlirShapedTypeGetRank(t)) continue;
    for (intptr_t i = 0; i < mlirAffineMapGetNumResults(mj); i++) {
      MlirAffineExpr e = mlirAffineMapGetResult(mj, i);
      if (mlirAffineExprIsADim(e)) extent[mlirAffineDimExprGetPosition(e)] = mlirShapedTypeGetDimSize(t, i);
    }
  }
  for (intptr_t i = 0; i < mlirAffineMapGetNumResults(m); i++)
    used[mlirAffineDimExprGetPosition(mlirAffineMapGetResult(m, i))] = true;
  for (intptr_t d = 0; d < nd; d++)
    if (!used[d] && extent[d] != 1) return false;
  return true;
}

/* Readers through an expand_shape R (of P's result) that only inserts unit
 * dimensions read P itself: each reader's map for R loses the unit
 * results (always index 0), so that fusion can merge a copy of P into it
 * (it does not fuse through such a reshape when P broadcasts). */
static void read_through_unit_expand(MlirOperation r, MlirValue src) {
  MlirAttribute re = mlirOperationGetAttributeByName(r, nova_str("reassociation"));
  MlirType rt = mlirValueGetType(mlirOperationGetResult(r, 0));
  if (!cg_op_is(r, "tensor.expand_shape") || mlirAttributeIsNull(re) || !mlirTypeIsARankedTensor(rt)) return;
  intptr_t rank = mlirShapedTypeGetRank(rt);
  bool keep[16] = {0};
  if (rank > 16) return;
  for (intptr_t g = 0; g < mlirArrayAttrGetNumElements(re); g++) {
    MlirAttribute grp = mlirArrayAttrGetElement(re, g);
    intptr_t n = mlirArrayAttrGetNumElements(grp), kept = -1;
    for (intptr_t i = 0; i < n; i++) {
      int64_t d = mlirIntegerAttrGetValueInt(mlirArrayAttrGetElement(grp, i));
      if (mlirShapedTypeGetDimSize(rt, d) != 1) {
        if (kept >= 0) return; /* two real dimensions from one: a real reshape */
        kept = d;
      }
    }
    if (kept < 0 && n) kept = mlirIntegerAttrGetValueInt(mlirArrayAttrGetElement(grp, 0));
    if (kept >= 0) keep[kept] = true;
  }
  MlirValue v = mlirOperationGetResult(r, 0);
  for (MlirOpOperand w = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(w); w = mlirOpOperandGetNextUse(w))
    if (!reads_each_once(w, mlirOperationGetBlock(r))) return;
  for (MlirOpOperand w = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(w);) {
    MlirOpOperand next = mlirOpOperandGetNextUse(w);
    MlirOperation c = mlirOpOperandGetOwner(w);
    intptr_t k = mlirOpOperandGetOperandNumber(w);
    MlirAttribute maps = mlirOperationGetAttributeByName(c, nova_str("indexing_maps"));
    intptr_t nm = mlirArrayAttrGetNumElements(maps);
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, k));
    MlirAffineExpr ex[16];
    intptr_t ne = 0;
    for (intptr_t i = 0; i < mlirAffineMapGetNumResults(m); i++)
      if (keep[i]) ex[ne++] = mlirAffineMapGetResult(m, i);
    MlirContext ctx = mlirOperationGetContext(c);
    MlirAttribute *el = nv_xcalloc((size_t)nm + 1, sizeof *el);
    if (!el) return;
    for (intptr_t i = 0; i < nm; i++) el[i] = mlirArrayAttrGetElement(maps, i);
    el[k] = mlirAffineMapAttrGet(mlirAffineMapGet(ctx, mlirAffineMapGetNumDims(m), 0, ne, ex));
    mlirOperationSetAttributeByName(c, nova_str("indexing_maps"), mlirArrayAttrGet(ctx, nm, el));
    free(el);
    mlirOperationSetOperand(c, k, src);
    w = next;
  }
}

/* A producer that fused elementwise computes its value from much smaller
 * tensors (broadcasts, comparisons with an index: the one-hot rows of a
 * cross-entropy's gradient), read by several linalg.generics that each
 * visit every element once: a copy of it before each reader, which fusion
 * then merges into that reader, instead of one full-size tensor that all
 * of them read (a 1 GiB one for a 50,257-word vocabulary at 7 x 1024
 * positions).  The number of copies made. */
static int copy_cheap_producers(MlirModule m, const cap_state *s) {
  int made = 0;
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    if (!cg_op_is(f, "func.func")) continue;
    MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
    if (mlirBlockIsNull(b)) continue;
    for (MlirOperation p = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(p); p = mlirOperationGetNextInBlock(p)) {
      if (!cg_op_is(p, "linalg.generic") || mlirOperationGetNumResults(p) != 1 || !all_parallel(s, p) ||
          body_ops(p) > 16)
        continue;
      MlirValue r = mlirOperationGetResult(p, 0);
      int64_t out = value_elements(r), in = 0;
      intptr_t n = mlirOperationGetNumOperands(p);
      for (intptr_t i = 0; i + 1 < n && out > 0; i++) {
        int64_t e = value_elements(mlirOperationGetOperand(p, i));
        in = e < 0 ? out : in + e;
      }
      if (out <= 0 || in * 4 > out) continue;
      for (MlirOpOperand u = mlirValueGetFirstUse(r); !mlirOpOperandIsNull(u);) {
        MlirOpOperand next = mlirOpOperandGetNextUse(u);
        if (cg_op_is(mlirOpOperandGetOwner(u), "tensor.expand_shape"))
          read_through_unit_expand(mlirOpOperandGetOwner(u), r);
        u = next;
      }
      /* every reader a generic of this block visiting each element once, as an input, directly or
       * through one reshape */
      int readers = 0;
      bool ok = true;
      for (MlirOpOperand u = mlirValueGetFirstUse(r); ok && !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u)) {
        MlirOperation c = mlirOpOperandGetOwner(u);
        if (reshape_op(c) && mlirBlockEqual(mlirOperationGetBlock(c), b)) {
          for (MlirOpOperand w = mlirValueGetFirstUse(mlirOperationGetResult(c, 0)); ok && !mlirOpOperandIsNull(w);
               w = mlirOpOperandGetNextUse(w), readers++)
            ok = reads_each_once(w, b);
        } else {
          ok = reads_each_once(u, b);
          readers++;
        }
      }
      if (!ok || readers < 2) continue;
      /* each reader but the first gets a copy (and of the reshape) made right before it */
      bool first = true;
      for (MlirOpOperand u = mlirValueGetFirstUse(r); !mlirOpOperandIsNull(u);) {
        MlirOpOperand next = mlirOpOperandGetNextUse(u);
        MlirOperation c = mlirOpOperandGetOwner(u);
        if (!reshape_op(c)) {
          if (!first) {
            MlirOperation copy = mlirOperationClone(p);
            mlirBlockInsertOwnedOperationBefore(b, c, copy);
            mlirOperationSetOperand(c, mlirOpOperandGetOperandNumber(u), mlirOperationGetResult(copy, 0));
            made++;
          }
          first = false;
        } else {
          for (MlirOpOperand w = mlirValueGetFirstUse(mlirOperationGetResult(c, 0)); !mlirOpOperandIsNull(w);) {
            MlirOpOperand wn = mlirOpOperandGetNextUse(w);
            if (!first) {
              MlirOperation reader = mlirOpOperandGetOwner(w);
              MlirOperation copy = mlirOperationClone(p), view = mlirOperationClone(c);
              mlirBlockInsertOwnedOperationBefore(b, reader, copy);
              mlirBlockInsertOwnedOperationBefore(b, reader, view);
              mlirOperationSetOperand(view, 0, mlirOperationGetResult(copy, 0));
              mlirOperationSetOperand(reader, mlirOpOperandGetOperandNumber(w), mlirOperationGetResult(view, 0));
              made++;
            }
            first = false;
            w = wn;
          }
        }
        u = next;
      }
    }
  }
  return made;
}

int cg_fuse(nova_ctx *c, MlirModule m, int opt_level, bool half_contractions, cg_plan *stats) {
  mlirOperationWalk(mlirModuleGetOperation(m), count_linalg, &stats->ops_before_fusion, MlirWalkPreOrder);
  if (opt_level > 0) {
    if (cg_run_pipeline(c, m, "builtin.module(func.func(canonicalize{region-simplify=disabled max-iterations=1},cse))",
                        "fusion"))
      return -1;
    int barriers = cg_fusion_barriers(m, half_contractions);
    if (barriers && getenv("NOVAC_DEBUG_PIPELINES")) fprintf(stderr, "novac: %d fusion barriers\n", barriers);
    int rc = cg_run_pipeline(c, m, "builtin.module(func.func(linalg-fuse-elementwise-ops))", "fusion");
    if (barriers) cg_drop_fusion_barriers(m);
    cap_state cs = {.parallel = mlirAttributeParseGet(mlirOperationGetContext(mlirModuleGetOperation(m)),
                                                      nova_str("#linalg.iterator_type<parallel>"))};
    if (!rc && !getenv("NOVAC_NO_PRODUCER_COPIES") && copy_cheap_producers(m, &cs) > 0) { /* and fused again */
      barriers = cg_fusion_barriers(m, half_contractions);
      rc = cg_run_pipeline(c, m, "builtin.module(func.func(linalg-fuse-elementwise-ops))", "fusion");
      if (barriers) cg_drop_fusion_barriers(m);
    }
    if (rc || cg_run_pipeline(c, m, "builtin.module(func.func(canonicalize{region-simplify=disabled max-iterations=1}))",
                              "fusion"))
      return -1;
  }
  mlirOperationWalk(mlirModuleGetOperation(m), count_linalg, &stats->ops_after_fusion, MlirWalkPreOrder);
  return 0;
}
