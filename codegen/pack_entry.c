/* pack_entry.c: the CPU entry's arguments packed into one array.
 *
 * A step has one buffer per tensor, and a model with a weight per layer
 * thousands of them.  An LLVM function of N parameters costs time
 * quadratic in N: each parameter attribute that a pass infers (nocapture,
 * readonly, ... from PostOrderFunctionAttrs) rebuilds the function's whole
 * attribute list, N slots long; the descriptor's C wrapper that spread an
 * array into N arguments was as slow to compile (an 8,000-weight chain:
 * 1.0 s of cc for one call).
 *
 * Requires: the module in the LLVM dialect, its entry llvm.func NAME with
 * pointer parameters only (bare-pointer memrefs) and no result.
 * Does: the entry takes a single pointer, to an array of the former
 * parameters in their order (`void entry(void **a)`); its body loads
 * a[i] before each operation that read parameter i.  The runtime calls
 * it with that array.  The entry and its pieces (cg_fold_piece_descriptors,
 * the functions split_entry.c made) keep no memref descriptors: a field
 * read back from one is the value put in.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/LLVM.h>

#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "codegen.h"

/* The element I of the pointer array A, inserted before AT. */
static MlirValue load_slot(MlirContext ctx, MlirLocation loc, MlirBlock b, MlirOperation at, MlirValue a, int32_t i) {
  MlirType ptr = mlirLLVMPointerTypeGet(ctx, 0);
  MlirOperationState gs = mlirOperationStateGet(nova_str("llvm.getelementptr"), loc);
  MlirNamedAttribute ga[2] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("rawConstantIndices")), mlirDenseI32ArrayGet(ctx, 1, &i)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("elem_type")), mlirTypeAttrGet(ptr))};
  mlirOperationStateAddOperands(&gs, 1, &a);
  mlirOperationStateAddResults(&gs, 1, &ptr);
  mlirOperationStateAddAttributes(&gs, 2, ga);
  MlirOperation gep = mlirOperationCreate(&gs);
  mlirBlockInsertOwnedOperationBefore(b, at, gep);
  MlirValue addr = mlirOperationGetResult(gep, 0);
  MlirOperationState ls = mlirOperationStateGet(nova_str("llvm.load"), loc);
  MlirNamedAttribute la[1] = {mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("alignment")),
                                                   mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 8))};
  mlirOperationStateAddOperands(&ls, 1, &addr);
  mlirOperationStateAddResults(&ls, 1, &ptr);
  mlirOperationStateAddAttributes(&ls, 1, la);
  MlirOperation ld = mlirOperationCreate(&ls);
  mlirBlockInsertOwnedOperationBefore(b, at, ld);
  return mlirOperationGetResult(ld, 0);
}

/* The field an llvm.insertvalue / extractvalue OP names: its position's
 * first index (-1 if it has none); *DEPTH: the position's length. */
static int64_t position(MlirOperation op, intptr_t *depth) {
  MlirAttribute p = mlirOperationGetAttributeByName(op, nova_str("position"));
  *depth = !mlirAttributeIsNull(p) && mlirAttributeIsADenseI64Array(p) ? mlirDenseArrayGetNumElements(p) : 0;
  return *depth > 0 ? mlirDenseI64ArrayGetElement(p, 0) : -1;
}

/* The value the llvm.extractvalue EX reads when a chain of insertvalues
 * below it set that field, or null. */
static MlirValue inserted(MlirOperation ex) {
  intptr_t d;
  int64_t pos = position(ex, &d);
  if (d != 1) return (MlirValue){NULL};
  MlirValue v = mlirOperationGetOperand(ex, 0);
  for (int steps = 0; steps < 64 && mlirValueIsAOpResult(v); steps++) {
    MlirOperation in = mlirOpResultGetOwner(v);
    if (!cg_op_is(in, "llvm.insertvalue")) break;
    intptr_t din;
    int64_t at = position(in, &din);
    if (at == pos) return din == 1 ? mlirOperationGetOperand(in, 1) : (MlirValue){NULL}; /* [pos, j]: a part of it */
    if (at < 0) break;
    v = mlirOperationGetOperand(in, 0);
  }
  return (MlirValue){NULL};
}

static bool dead_pure(MlirOperation op) {
  bool pure = cg_op_is(op, "llvm.insertvalue") || cg_op_is(op, "llvm.extractvalue") ||
              cg_op_is(op, "llvm.mlir.poison") || cg_op_is(op, "llvm.mlir.undef") || cg_op_is(op, "llvm.mlir.constant");
  return pure && mlirOperationGetNumResults(op) == 1 && mlirOpOperandIsNull(mlirValueGetFirstUse(mlirOperationGetResult(op, 0)));
}

/* The lowering builds a memref descriptor for each pointer parameter and
 * each view, and reads a field back at each use: an extraction from such a
 * chain is replaced by the field, and the descriptors left without uses are
 * erased (the last insertvalue of a chain first, which frees the one
 * before it).  An 8,000-weight chain's entry was four fifths dead
 * descriptors, each translated and then deleted by LLVM; its pieces
 * (split_entry.c) were half. */
static void fold_descriptors(MlirBlock b) {
  size_t nops = 0, cap = 0;
  MlirOperation *ops = NULL;
  for (MlirOperation op = mlirBlockGetFirstOperation(b), next; !mlirOperationIsNull(op); op = next) {
    next = mlirOperationGetNextInBlock(op);
    MlirValue x = cg_op_is(op, "llvm.extractvalue") ? inserted(op) : (MlirValue){NULL};
    if (!mlirValueIsNull(x)) {
      mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(op, 0), x);
      mlirOperationDestroy(op);
      continue;
    }
    if (nops == cap) ops = nv_xrealloc(ops, sizeof *ops * (cap = cap ? 2 * cap : 4096));
    ops[nops++] = op;
  }
  while (nops-- > 0)
    if (dead_pure(ops[nops])) mlirOperationDestroy(ops[nops]);
  free(ops);
}

void cg_fold_piece_descriptors(MlirModule m) {
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    if (!cg_op_is(f, "llvm.func")) continue;
    MlirAttribute nm = mlirOperationGetAttributeByName(f, nova_str("sym_name"));
    MlirStringRef s = mlirAttributeIsNull(nm) ? (MlirStringRef){"", 0} : mlirStringAttrGetValue(nm);
    MlirRegion r = mlirOperationGetRegion(f, 0);
    if (s.length > strlen(CG_SEG_PREFIX) && !memcmp(s.data, CG_SEG_PREFIX, strlen(CG_SEG_PREFIX)) &&
        !mlirBlockIsNull(mlirRegionGetFirstBlock(r)))
      for (MlirBlock b = mlirRegionGetFirstBlock(r); !mlirBlockIsNull(b); b = mlirBlockGetNextInRegion(b))
        fold_descriptors(b);
  }
}

int cg_pack_entry(nova_ctx *c, MlirModule m, const char *name) {
  MlirSymbolTable st = mlirSymbolTableCreate(mlirModuleGetOperation(m));
  MlirOperation f = mlirSymbolTableLookup(st, nova_str(name));
  mlirSymbolTableDestroy(st);
  bool fn = !mlirOperationIsNull(f) && cg_op_is(f, "llvm.func");
  MlirBlock b = fn ? mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0)) : (MlirBlock){NULL};
  if (mlirBlockIsNull(b)) {
    nv_error_plain(c->diag, "internal: the entry @%s is not in the lowered module", name);
    return -1;
  }
  MlirContext ctx = mlirOperationGetContext(f);
  MlirType ptr = mlirLLVMPointerTypeGet(ctx, 0);
  MlirType ft = mlirTypeAttrGetValue(mlirOperationGetAttributeByName(f, nova_str("function_type")));
  intptr_t n = mlirBlockGetNumArguments(b);
  bool ok = mlirLLVMFunctionTypeGetNumInputs(ft) == n &&
            mlirTypeEqual(mlirLLVMFunctionTypeGetReturnType(ft), mlirLLVMVoidTypeGet(ctx));
  for (intptr_t i = 0; ok && i < n; i++) ok = mlirTypeIsALLVMPointerType(mlirValueGetType(mlirBlockGetArgument(b, i)));
  if (!ok || n > INT32_MAX) {
    nv_error_plain(c->diag, "internal: the entry @%s does not take pointers only", name);
    return -1;
  }
  MlirLocation loc = mlirOperationGetLocation(f);
  MlirValue a = mlirBlockAddArgument(b, ptr, loc);
  /* the pointers are loaded where they are used: loaded at the top, where
   * the lowering builds each argument's memref descriptor, thousands of
   * them would be live across the whole entry (and LLVM's scheduler
   * clusters loads from one base quadratically: 1.4 -> 3.5 s of code
   * generation for a chain of 4,000 weights).  So the descriptors go ... */
  fold_descriptors(b);
  /* ... and each use of a parameter gets a load of its own */
  for (intptr_t i = 0; i < n; i++) {
    MlirValue old = mlirBlockGetArgument(b, i);
    for (MlirOpOperand u; !mlirOpOperandIsNull(u = mlirValueGetFirstUse(old));) {
      MlirOperation user = mlirOpOperandGetOwner(u);
      mlirOperationSetOperand(user, mlirOpOperandGetOperandNumber(u),
                              load_slot(ctx, loc, mlirOperationGetBlock(user), user, a, (int32_t)i));
    }
  }
  for (intptr_t i = n; i-- > 0;) mlirBlockEraseArgument(b, (unsigned)i); /* the last first: nothing renumbered */
  mlirOperationSetAttributeByName(f, nova_str("function_type"),
                                  mlirTypeAttrGet(mlirLLVMFunctionTypeGet(mlirLLVMVoidTypeGet(ctx), 1, &ptr, false)));
  mlirOperationRemoveAttributeByName(f, nova_str("arg_attrs"));
  return 0;
}
