/* unshare.c: one destination per write, before bufferization.
 *
 * CSE merges every `tensor.empty` of one type, and every zero fill of one
 * type, into a single value; a step of N matmuls then writes all N results
 * into one shared tensor.  One-shot bufferization must then decide, write
 * by write, whether writing in place would clobber a later read of any of
 * the N aliasing values: its analysis grows with the square of the shared
 * uses (a 1,000-layer chain took minutes there alone), and where a write
 * cannot be in place it copies the shared tensor first.
 *
 * Requires: tensor IR (after tiling, before one-shot bufferization).
 * Does: for each operand that an op writes (a destination: the init of a
 * linalg op, scf.for's iteration arguments, vector.transfer_write's and
 * tensor.insert_slice's destination) whose value has other uses and is
 * cheap to recompute (a tensor.empty; a linalg.fill, a loop or a reshape
 * whose tensors are themselves cheap and which reads nothing from outside
 * but constants), the producing ops are cloned right before the writer, which
 * then writes into its own copy.  The values are the same; the IR is the
 * one before CSE, and bufferization analyses each write against its own
 * few uses.  Producers left without uses are erased.  Such a destination
 * with one writer that was made more than FAR_OPS ops before it (CSE
 * keeps the first of the fills it merges: one in the forward pass for a
 * writer in the backward) is made again just before it: a buffer is held
 * from where its tensor is made.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"

#define MAX_DEPTH 4

static bool is_reshape(MlirOperation op) {
  return cg_op_is(op, "tensor.expand_shape") || cg_op_is(op, "tensor.collapse_shape");
}

/* Whether v has other uses than one, or is a reshape of such a value. */
static bool has_other_uses(MlirValue v) {
  MlirOpOperand u = mlirValueGetFirstUse(v);
  if (!mlirOpOperandIsNull(u) && !mlirOpOperandIsNull(mlirOpOperandGetNextUse(u))) return true;
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  return is_reshape(d) && has_other_uses(mlirOperationGetOperand(d, 0));
}

static bool is_constant_like(MlirOperation op) {
  return cg_op_is(op, "arith.constant") || cg_op_is(op, "ub.poison");
}

typedef struct reads_ctx {
  MlirOperation root, at;
  bool outside; /* reads a value defined outside root that is not a constant defined before `at` */
} reads_ctx;

/* Whether v's definition comes before `at` (v's block encloses at's). */
static bool before(MlirValue v, MlirOperation at) {
  if (!mlirValueIsAOpResult(v)) return true;
  MlirOperation d = mlirOpResultGetOwner(v);
  return !mlirBlockEqual(mlirOperationGetBlock(d), mlirOperationGetBlock(at)) || mlirOperationIsBeforeInBlock(d, at);
}

static bool inside(MlirOperation op, MlirOperation root) {
  for (; !mlirOperationIsNull(op); op = mlirOperationGetParentOperation(op))
    if (mlirOperationEqual(op, root)) return true;
  return false;
}

static MlirWalkResult check_reads(MlirOperation op, void *ud) {
  reads_ctx *r = ud;
  if (mlirOperationEqual(op, r->root)) return MlirWalkResultAdvance; /* its own operands are checked by cheap() */
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    MlirOperation def = mlirValueIsAOpResult(v) ? mlirOpResultGetOwner(v)
                                                : mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v));
    if (mlirValueIsAOpResult(v) && is_constant_like(def) && (inside(def, r->root) || before(v, r->at))) continue;
    if (!inside(def, r->root)) {
      r->outside = true;
      return MlirWalkResultInterrupt;
    }
  }
  return MlirWalkResultAdvance;
}

/* Whether v can be recomputed before `at`: see the header. */
static bool cheap(MlirValue v, MlirOperation at, int depth) {
  if (!mlirValueIsAOpResult(v) || depth > MAX_DEPTH) return false;
  MlirOperation op = mlirOpResultGetOwner(v);
  if (cg_op_is(op, "tensor.empty")) return mlirOperationGetNumOperands(op) == 0; /* static shapes */
  if (!cg_op_is(op, "linalg.fill") && !cg_op_is(op, "scf.for") && !cg_op_is(op, "tensor.expand_shape") &&
      !cg_op_is(op, "tensor.collapse_shape"))
    return false;
  if (mlirOperationGetNumResults(op) != 1) return false;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue o = mlirOperationGetOperand(op, i);
    if (mlirTypeIsARankedTensor(mlirValueGetType(o))
            ? !cheap(o, at, depth + 1)
            : !(mlirValueIsAOpResult(o) && is_constant_like(mlirOpResultGetOwner(o)) && before(o, at)))
      return false;
  }
  reads_ctx r = {op, at, false};
  mlirOperationWalk(op, check_reads, &r, MlirWalkPreOrder);
  return !r.outside;
}

/* A clone of v's producer (and of its cheap tensor operands) before `at`. */
static MlirValue clone_before(MlirBlock b, MlirOperation at, MlirValue v) {
  MlirOperation op = mlirOpResultGetOwner(v), c = mlirOperationClone(op);
  mlirBlockInsertOwnedOperationBefore(b, at, c);
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(c); i++) {
    MlirValue o = mlirOperationGetOperand(c, i);
    if (mlirTypeIsARankedTensor(mlirValueGetType(o))) mlirOperationSetOperand(c, i, clone_before(b, c, o));
  }
  return mlirOperationGetResult(c, mlirOpResultGetResultNumber(v));
}

/* The operands [first, first + n) of op that it writes. */
static bool written(MlirOperation op, intptr_t *first, intptr_t *n) {
  intptr_t nops = mlirOperationGetNumOperands(op);
  if (cg_op_is(op, "vector.transfer_write") || cg_op_is(op, "tensor.insert_slice")) {
    *first = 1, *n = 1;
    return nops > 1 && mlirTypeIsARankedTensor(mlirValueGetType(mlirOperationGetOperand(op, 1)));
  }
  if (cg_op_is(op, "scf.for")) {
    *first = 3, *n = nops - 3;
    return nops > 3;
  }
  if (cg_calls_tiled_kernel(op)) { /* a kernel may write any tensor it is given */
    *first = 0, *n = nops;
    return nops > 0;
  }
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(op));
  MlirAttribute seg = mlirOperationGetAttributeByName(op, nova_str("operandSegmentSizes"));
  if (name.length > 7 && !memcmp(name.data, "linalg.", 7) && !mlirAttributeIsNull(seg) &&
      mlirAttributeIsADenseI32Array(seg) && mlirDenseArrayGetNumElements(seg) == 2) {
    *n = mlirDenseI32ArrayGetElement(seg, 1);
    *first = nops - *n;
    return *n > 0;
  }
  return false;
}

/* v's producer, if v (cheap) lost its last use, erased with the producers
 * of its operands that then lose theirs; not KEEP (where later clones of
 * the same writer go). */
static void erase_if_dead(MlirValue v, MlirOperation keep) {
  if (!mlirValueIsAOpResult(v) || !mlirOpOperandIsNull(mlirValueGetFirstUse(v))) return;
  MlirOperation op = mlirOpResultGetOwner(v);
  if (mlirOperationGetNumResults(op) != 1 || mlirOperationEqual(op, keep)) return;
  intptr_t n = mlirOperationGetNumOperands(op);
  MlirValue ops[8];
  if (n > 8) return;
  for (intptr_t i = 0; i < n; i++) ops[i] = mlirOperationGetOperand(op, i);
  mlirOperationDestroy(op);
  for (intptr_t i = 0; i < n; i++)
    if (mlirTypeIsARankedTensor(mlirValueGetType(ops[i]))) erase_if_dead(ops[i], keep);
}

static void unshare_block(MlirBlock b);

/* Whether DEF lies more than FAR_OPS ops before AT in their block (a
 * fresh destination made there would hold its buffer all that time:
 * CSE keeps the first of the fills it merges, in the forward pass, for a
 * writer in the backward). */
#define FAR_OPS 16
static bool far_before(MlirOperation def, MlirOperation at) {
  if (!mlirOperationIsBeforeInBlock(def, at)) return false;
  int k = 0;
  for (MlirOperation o = def; !mlirOperationIsNull(o) && !mlirOperationEqual(o, at); o = mlirOperationGetNextInBlock(o))
    if (++k > FAR_OPS) return true;
  return false;
}

/* The clones go before `at`: the first op of the run of ops from the
 * writer's source op (one location), so that each source op's code stays
 * contiguous (outline.c outlines such runs). */
static void unshare_op(MlirBlock b, MlirOperation op, MlirOperation at) {
  intptr_t first = 0, n = 0;
  bool writes = written(op, &first, &n);
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    if (!mlirTypeIsARankedTensor(mlirValueGetType(v)) || !mlirValueIsAOpResult(v)) continue;
    if (!has_other_uses(v)) { /* its one writer: made just before it, if made far before */
      MlirOperation def = mlirOpResultGetOwner(v), src = def;
      /* (a reshape made just before it of a tensor made far before: both again) */
      while (is_reshape(src) && mlirValueIsAOpResult(mlirOperationGetOperand(src, 0)))
        src = mlirOpResultGetOwner(mlirOperationGetOperand(src, 0));
      if (writes && i >= first && i < first + n && mlirBlockEqual(mlirOperationGetBlock(def), b) &&
          mlirBlockEqual(mlirOperationGetBlock(src), b) && far_before(src, at) && cheap(v, at, 0)) {
        mlirOperationSetOperand(op, i, clone_before(b, at, v));
        erase_if_dead(v, at);
      }
      continue;
    }
    MlirOperation def = mlirOpResultGetOwner(v);
    /* a read: only of a fill (not of an empty tensor) made for another source op */
    if (!(writes && i >= first && i < first + n) &&
        (cg_op_is(def, "tensor.empty") || mlirLocationEqual(mlirOperationGetLocation(def), mlirOperationGetLocation(op))))
      continue;
    if (!mlirBlockEqual(mlirOperationGetBlock(def), b)) continue;
    MlirOperation where = cheap(v, at, 0) && mlirOperationIsBeforeInBlock(def, at) ? at : op;
    if (!mlirOperationEqual(where, op) || cheap(v, op, 0)) mlirOperationSetOperand(op, i, clone_before(b, where, v));
    else continue;
    erase_if_dead(v, at);
  }
  for (intptr_t r = 0; r < mlirOperationGetNumRegions(op); r++)
    for (MlirBlock ib = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, r)); !mlirBlockIsNull(ib);
         ib = mlirBlockGetNextInRegion(ib))
      unshare_block(ib);
}


static void unshare_block(MlirBlock b) {
  MlirOperation at = mlirBlockGetFirstOperation(b);
  for (MlirOperation op = at; !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    if (!mlirLocationEqual(mlirOperationGetLocation(op), mlirOperationGetLocation(at)) || is_constant_like(op) ||
        is_constant_like(at))
      at = op;
    unshare_op(b, op, at);
  }
}

void cg_unshare_destinations(MlirModule m) {
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    if (cg_op_is(f, "func.func"))
      for (MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0)); !mlirBlockIsNull(b);
           b = mlirBlockGetNextInRegion(b))
        unshare_block(b);
}
