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
 * it with that array.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/LLVM.h>

#include <stdlib.h>

#include "../driver/util.h"
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

static int64_t single_position(MlirOperation op) {
  MlirAttribute p = mlirOperationGetAttributeByName(op, nova_str("position"));
  return !mlirAttributeIsNull(p) && mlirAttributeIsADenseI64Array(p) && mlirDenseArrayGetNumElements(p) == 1
             ? mlirDenseI64ArrayGetElement(p, 0)
             : -1;
}

/* The parameter of the entry block B that the llvm.extractvalue EX reads
 * (a pointer field of a descriptor built by insertvalues), or null. */
static MlirValue inserted_arg(MlirOperation ex, MlirBlock b) {
  int64_t pos = single_position(ex);
  MlirValue v = mlirOperationGetOperand(ex, 0);
  for (int steps = 0; pos >= 0 && steps < 64 && mlirValueIsAOpResult(v); steps++) {
    MlirOperation in = mlirOpResultGetOwner(v);
    if (!cg_op_is(in, "llvm.insertvalue")) break;
    if (single_position(in) == pos) {
      MlirValue x = mlirOperationGetOperand(in, 1);
      bool arg = mlirValueIsABlockArgument(x) && mlirBlockEqual(mlirBlockArgumentGetOwner(x), b);
      return arg ? x : (MlirValue){NULL};
    }
    v = mlirOperationGetOperand(in, 0);
  }
  return (MlirValue){NULL};
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
   * generation for a chain of 4,000 weights).  So a pointer extracted
   * from a descriptor is loaded in place of the extraction ... */
  for (MlirOperation op = mlirBlockGetFirstOperation(b), next; !mlirOperationIsNull(op); op = next) {
    next = mlirOperationGetNextInBlock(op);
    MlirValue arg = cg_op_is(op, "llvm.extractvalue") ? inserted_arg(op, b) : (MlirValue){NULL};
    if (mlirValueIsNull(arg)) continue;
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(op, 0),
                                  load_slot(ctx, loc, b, op, a, (int32_t)mlirBlockArgumentGetArgNumber(arg)));
    mlirOperationDestroy(op);
  }
  /* ... the descriptors left without uses are erased (the last
   * insertvalue of a chain first, which frees the one before it: an
   * 8,000-weight chain's entry was four fifths dead descriptors, each
   * translated and then deleted by LLVM) ... */
  size_t nops = 0, cap = 0;
  MlirOperation *ops = NULL;
  for (MlirOperation op = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    if (nops == cap) ops = nv_xrealloc(ops, sizeof *ops * (cap = cap ? 2 * cap : 4096));
    ops[nops++] = op;
  }
  while (nops-- > 0) {
    MlirOperation op = ops[nops];
    bool pure = cg_op_is(op, "llvm.insertvalue") || cg_op_is(op, "llvm.mlir.poison") ||
                cg_op_is(op, "llvm.mlir.undef") || cg_op_is(op, "llvm.mlir.constant");
    if (pure && mlirOperationGetNumResults(op) == 1 && mlirOpOperandIsNull(mlirValueGetFirstUse(mlirOperationGetResult(op, 0))))
      mlirOperationDestroy(op);
  }
  free(ops);
  /* ... and any other use of a parameter (a view of a descriptor) gets a
   * load of its own */
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
