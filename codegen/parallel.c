/* parallel.c: loop nests shared out between threads.
 *
 * outline.c marks the functions of nests whose outermost loop is parallel
 * and large enough (nova.parallel).  After the lowering to loops, such a
 * function F gets the bounds of that loop as two more arguments (lo, hi),
 * and each call of F, F(a0..an-1), becomes
 *
 *     argv = memref.alloca : memref<n x i64>      (each argument as 64 bits:
 *     argv[i] = ai                                 a buffer's address, an
 *     @nova_par_F(argv, lb, ub, step)              integer, a float's bits)
 *
 * In the LLVM dialect @nova_par_F is defined as a call of the runtime's
 * nova_rt_parallel_for(@F.task, argv, lb, ub, step), which splits the
 * iterations into one contiguous share per thread and runs, on each,
 * @F.task(argv, lo, hi): the arguments loaded back from argv, then
 * F(a0..an-1, lo, hi).  The loop is parallel (its iterations write
 * disjoint data: a parallel dimension), so the shares can run in any
 * order, and each point is computed exactly as before.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/LLVM.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "codegen.h"

#define PAR_PREFIX "nova_par_"

static MlirBlock body_of(MlirOperation f) {
  MlirRegion r = mlirOperationGetRegion(f, 0);
  return mlirRegionIsNull(r) ? (MlirBlock){NULL} : mlirRegionGetFirstBlock(r);
}

static MlirStringRef sym_of(MlirOperation f) {
  MlirAttribute a = mlirOperationGetAttributeByName(f, nova_str("sym_name"));
  return mlirAttributeIsNull(a) ? (MlirStringRef){"", 0} : mlirStringAttrGetValue(a);
}

/* The only op with regions in F's body, if it is an scf.for. */
static MlirOperation root_loop(MlirOperation f) {
  MlirOperation root = {NULL};
  for (MlirOperation op = mlirBlockGetFirstOperation(body_of(f)); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (mlirOperationGetNumRegions(op) == 0) continue;
    if (!mlirOperationIsNull(root)) return (MlirOperation){NULL};
    root = op;
  }
  return !mlirOperationIsNull(root) && cg_op_is(root, "scf.for") ? root : (MlirOperation){NULL};
}

static bool const_int(MlirValue v, int64_t *out) {
  if (!mlirValueIsAOpResult(v) || !cg_op_is(mlirOpResultGetOwner(v), "arith.constant")) return false;
  MlirAttribute a = mlirOperationGetAttributeByName(mlirOpResultGetOwner(v), nova_str("value"));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a)) return false;
  *out = mlirIntegerAttrGetValueInt(a);
  return true;
}

/* ---- building ops before REF ---- */

typedef struct builder {
  MlirContext ctx;
  MlirBlock block;
  MlirOperation ref;
  MlirLocation loc;
} builder;

static MlirValue op1(builder *b, const char *name, int nops, const MlirValue *ops, MlirType t, int nattr,
                     const MlirNamedAttribute *attrs) {
  MlirOperationState st = mlirOperationStateGet(nova_str(name), b->loc);
  if (nops) mlirOperationStateAddOperands(&st, nops, ops);
  if (!mlirTypeIsNull(t)) mlirOperationStateAddResults(&st, 1, &t);
  if (nattr) mlirOperationStateAddAttributes(&st, nattr, attrs);
  MlirOperation op = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(b->block, b->ref, op);
  return mlirTypeIsNull(t) ? (MlirValue){NULL} : mlirOperationGetResult(op, 0);
}

static MlirNamedAttribute nattr(MlirContext ctx, const char *name, MlirAttribute a) {
  return mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str(name)), a);
}

static MlirValue cindex(builder *b, int64_t v) {
  MlirType it = mlirIndexTypeGet(b->ctx);
  MlirNamedAttribute a = nattr(b->ctx, "value", mlirIntegerAttrGet(it, v));
  return op1(b, "arith.constant", 0, NULL, it, 1, &a);
}

/* V as 64 bits (NULL value for a type that cannot be packed). */
static MlirValue as_i64(builder *b, MlirValue v) {
  MlirType t = mlirValueGetType(v), i64 = mlirIntegerTypeGet(b->ctx, 64);
  if (mlirTypeIsAMemRef(t)) {
    MlirValue p = op1(b, "memref.extract_aligned_pointer_as_index", 1, &v, mlirIndexTypeGet(b->ctx), 0, NULL);
    return op1(b, "arith.index_cast", 1, &p, i64, 0, NULL);
  }
  if (mlirTypeIsAIndex(t)) return op1(b, "arith.index_cast", 1, &v, i64, 0, NULL);
  if (mlirTypeIsAInteger(t)) {
    unsigned w = mlirIntegerTypeGetWidth(t);
    return w == 64 ? v : w < 64 ? op1(b, "arith.extui", 1, &v, i64, 0, NULL) : (MlirValue){NULL};
  }
  if (mlirTypeIsAF64(t)) return op1(b, "arith.bitcast", 1, &v, i64, 0, NULL);
  if (mlirTypeIsAF32(t)) {
    MlirValue x = op1(b, "arith.bitcast", 1, &v, mlirIntegerTypeGet(b->ctx, 32), 0, NULL);
    return op1(b, "arith.extui", 1, &x, i64, 0, NULL);
  }
  return (MlirValue){NULL};
}

static bool packable(MlirType t) {
  return mlirTypeIsAMemRef(t) || mlirTypeIsAIndex(t) || mlirTypeIsAF64(t) || mlirTypeIsAF32(t) ||
         (mlirTypeIsAInteger(t) && mlirIntegerTypeGetWidth(t) <= 64);
}

/* The call CALL of a parallel function becomes the packing of its
 * arguments and a call of PAR (the bounds LB, UB, STEP). */
static void rewrite_call(MlirContext ctx, MlirOperation call, const char *par, const int64_t bounds[3]) {
  builder b = {ctx, mlirOperationGetBlock(call), call, mlirOperationGetLocation(call)};
  intptr_t n = mlirOperationGetNumOperands(call);
  int64_t shape = n ? n : 1;
  MlirType argv_t = mlirMemRefTypeContiguousGet(mlirIntegerTypeGet(ctx, 64), 1, &shape, mlirAttributeGetNull());
  int32_t seg[2] = {0, 0};
  MlirNamedAttribute sa = nattr(ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(ctx, 2, seg));
  MlirValue argv = op1(&b, "memref.alloca", 0, NULL, argv_t, 1, &sa);
  for (intptr_t i = 0; i < n; i++) {
    MlirValue ops[3] = {as_i64(&b, mlirOperationGetOperand(call, i)), argv, cindex(&b, i)};
    op1(&b, "memref.store", 3, ops, (MlirType){NULL}, 0, NULL);
  }
  MlirValue ops[4] = {argv, cindex(&b, bounds[0]), cindex(&b, bounds[1]), cindex(&b, bounds[2])};
  MlirNamedAttribute callee = nattr(ctx, "callee", mlirFlatSymbolRefAttrGet(ctx, nova_str(par)));
  op1(&b, "func.call", 4, ops, (MlirType){NULL}, 1, &callee);
  mlirOperationDestroy(call);
}

/* func.func private @NAME(memref<N x i64>, index, index, index), at the end of M. */
static void declare_par(MlirContext ctx, MlirModule m, const char *name, intptr_t n, MlirLocation loc) {
  int64_t shape = n ? n : 1;
  MlirType it = mlirIndexTypeGet(ctx);
  MlirType in[4] = {mlirMemRefTypeContiguousGet(mlirIntegerTypeGet(ctx, 64), 1, &shape, mlirAttributeGetNull()), it,
                    it, it};
  MlirNamedAttribute fa[3] = {nattr(ctx, "sym_name", mlirStringAttrGet(ctx, nova_str(name))),
                              nattr(ctx, "function_type", mlirTypeAttrGet(mlirFunctionTypeGet(ctx, 4, in, 0, NULL))),
                              nattr(ctx, "sym_visibility", mlirStringAttrGet(ctx, nova_str("private")))};
  MlirOperationState fs = mlirOperationStateGet(nova_str("func.func"), loc);
  mlirOperationStateAddAttributes(&fs, 3, fa);
  MlirRegion r = mlirRegionCreate();
  mlirOperationStateAddOwnedRegions(&fs, 1, &r);
  mlirBlockAppendOwnedOperation(mlirModuleGetBody(m), mlirOperationCreate(&fs));
}

/* F takes its root loop's bounds as two more arguments; its calls in
 * ENTRY go through @nova_par_F.  false (nothing changed) when F does not
 * qualify after all. */
static bool parallelize(MlirContext ctx, MlirModule m, MlirOperation entry, MlirOperation f) {
  MlirOperation loop = root_loop(f);
  int64_t bounds[3];
  if (mlirOperationIsNull(loop) || !const_int(mlirOperationGetOperand(loop, 0), &bounds[0]) ||
      !const_int(mlirOperationGetOperand(loop, 1), &bounds[1]) ||
      !const_int(mlirOperationGetOperand(loop, 2), &bounds[2]) || bounds[2] <= 0 ||
      (bounds[1] - bounds[0] + bounds[2] - 1) / bounds[2] < 2)
    return false;
  MlirBlock fb = body_of(f);
  intptr_t n = mlirBlockGetNumArguments(fb);
  for (intptr_t i = 0; i < n; i++)
    if (!packable(mlirValueGetType(mlirBlockGetArgument(fb, i)))) return false;
  MlirStringRef fname = sym_of(f);
  char par[160];
  snprintf(par, sizeof par, PAR_PREFIX "%.*s", (int)fname.length, fname.data);
  /* F(args..., lo, hi) */
  MlirType it = mlirIndexTypeGet(ctx);
  MlirLocation loc = mlirOperationGetLocation(f);
  MlirValue lo = mlirBlockAddArgument(fb, it, loc), hi = mlirBlockAddArgument(fb, it, loc);
  MlirType *in = nv_xmalloc(sizeof *in * (size_t)(n + 2));
  if (!in) return false;
  for (intptr_t i = 0; i < n + 2; i++) in[i] = mlirValueGetType(mlirBlockGetArgument(fb, i));
  mlirOperationSetAttributeByName(f, nova_str("function_type"),
                                  mlirTypeAttrGet(mlirFunctionTypeGet(ctx, n + 2, in, 0, NULL)));
  free(in);
  mlirOperationSetOperand(loop, 0, lo);
  mlirOperationSetOperand(loop, 1, hi);
  /* the calls */
  MlirBlock eb = body_of(entry);
  for (MlirOperation op = mlirBlockGetFirstOperation(eb); !mlirOperationIsNull(op);) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    if (cg_op_is(op, "func.call")) {
      MlirAttribute callee = mlirOperationGetAttributeByName(op, nova_str("callee"));
      MlirStringRef cn = mlirFlatSymbolRefAttrGetValue(callee);
      if (cn.length == fname.length && !memcmp(cn.data, fname.data, cn.length)) rewrite_call(ctx, op, par, bounds);
    }
    op = next;
  }
  declare_par(ctx, m, par, n, loc);
  return true;
}

int cg_parallel_calls(nova_ctx *c, MlirModule m, int *count) {
  *count = 0;
  MlirOperation entry = cg_entry_func(m);
  if (mlirOperationIsNull(entry) || getenv("NOVAC_NO_PARALLEL")) return 0;
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    if (cg_op_is(f, "func.func") && !mlirAttributeIsNull(mlirOperationGetAttributeByName(f, nova_str("nova.parallel"))) &&
        !mlirBlockIsNull(body_of(f)) && parallelize(c->ctx, m, entry, f))
      ++*count;
  return nova_verify(c, m, "sharing loops out between threads");
}

/* ---- the LLVM dialect: @nova_par_F and @F.task ---- */

static void type_text(MlirType t, nv_sbuf *b) { mlirTypePrint(t, cg_print_to_sbuf, b); }

/* The definitions of PAR (= nova_par_F) and F's task, as text. */
static void thunk_text(nv_sbuf *b, MlirStringRef fname, MlirType fty) {
  intptr_t n = mlirLLVMFunctionTypeGetNumInputs(fty) - 2; /* F's own arguments, then lo and hi */
  const char *f = fname.data;
  int fl = (int)fname.length;
  /* F declared, for the parse (the declaration is not kept) */
  nv_sb_printf(b, "llvm.func @%.*s(", fl, f);
  for (intptr_t i = 0; i < n + 2; i++) {
    if (i) nv_sb_printf(b, ", ");
    type_text(mlirLLVMFunctionTypeGetInput(fty, i), b);
  }
  nv_sb_printf(b, ")\n");
  nv_sb_printf(b, "llvm.func internal @%.*s.task(%%argv: !llvm.ptr, %%lo: i64, %%hi: i64) {\n", fl, f);
  for (intptr_t i = 0; i < n; i++) {
    nv_sb_printf(b, "  %%p%ld = llvm.getelementptr %%argv[%ld] : (!llvm.ptr) -> !llvm.ptr, i64\n", (long)i, (long)i);
    nv_sb_printf(b, "  %%a%ld = llvm.load %%p%ld : !llvm.ptr -> ", (long)i, (long)i);
    type_text(mlirLLVMFunctionTypeGetInput(fty, i), b);
    nv_sb_printf(b, "\n");
  }
  nv_sb_printf(b, "  llvm.call @%.*s(", fl, f);
  for (intptr_t i = 0; i < n; i++) nv_sb_printf(b, "%%a%ld, ", (long)i);
  nv_sb_printf(b, "%%lo, %%hi) : (");
  for (intptr_t i = 0; i < n + 2; i++) {
    if (i) nv_sb_printf(b, ", ");
    type_text(mlirLLVMFunctionTypeGetInput(fty, i), b);
  }
  nv_sb_printf(b, ") -> ()\n  llvm.return\n}\n");
  nv_sb_printf(b,
               "llvm.func internal @" PAR_PREFIX "%.*s(%%argv: !llvm.ptr, %%lb: i64, %%ub: i64, %%st: i64) {\n"
               "  %%t = llvm.mlir.addressof @%.*s.task : !llvm.ptr\n"
               "  llvm.call @nova_rt_parallel_for(%%t, %%argv, %%lb, %%ub, %%st) : "
               "(!llvm.ptr, !llvm.ptr, i64, i64, i64) -> ()\n  llvm.return\n}\n",
               fl, f, fl, f);
}

static MlirOperation find_func(MlirModule m, const char *name, size_t len) {
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    MlirStringRef s = sym_of(f);
    if (cg_op_is(f, "llvm.func") && s.length == len && !memcmp(s.data, name, len)) return f;
  }
  return (MlirOperation){NULL};
}

int cg_parallel_thunks(nova_ctx *c, MlirModule m) {
  nv_sbuf text = {0};
  nv_sb_printf(&text, "module {\nllvm.func @nova_rt_parallel_for(!llvm.ptr, !llvm.ptr, i64, i64, i64)\n");
  int n = 0, cap = 0;
  MlirOperation *decls = NULL;
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    MlirStringRef s = sym_of(f);
    size_t pl = strlen(PAR_PREFIX);
    if (!cg_op_is(f, "llvm.func") || s.length <= pl || memcmp(s.data, PAR_PREFIX, pl) || !mlirBlockIsNull(body_of(f)))
      continue;
    MlirOperation target = find_func(m, s.data + pl, s.length - pl);
    if (mlirOperationIsNull(target)) {
      nv_error_plain(c->diag, "internal: no function for the parallel call %.*s", (int)s.length, s.data);
      nv_sb_free(&text);
      free(decls);
      return -1;
    }
    if (n == cap) {
      MlirOperation *d = nv_xrealloc(decls, sizeof *d * (size_t)(cap = cap ? 2 * cap : 64));
      if (!d) {
        nv_error_plain(c->diag, "out of memory");
        nv_sb_free(&text);
        free(decls);
        return -1;
      }
      decls = d;
    }
    MlirType fty = mlirTypeAttrGetValue(mlirOperationGetAttributeByName(target, nova_str("function_type")));
    thunk_text(&text, (MlirStringRef){s.data + pl, s.length - pl}, fty);
    decls[n++] = f;
  }
  nv_sb_printf(&text, "}\n");
  int rc = 0;
  if (n > 0) {
    MlirModule parsed = text.oom ? (MlirModule){NULL} : mlirModuleCreateParse(c->ctx, nova_str(text.s));
    if (mlirModuleIsNull(parsed)) {
      nv_error_plain(c->diag, "internal: the parallel loop thunks do not parse");
      rc = -1;
    } else {
      for (int i = 0; i < n; i++) mlirOperationDestroy(decls[i]);
      MlirBlock to = mlirModuleGetBody(m);
      for (MlirOperation op = mlirBlockGetFirstOperation(mlirModuleGetBody(parsed)); !mlirOperationIsNull(op);) {
        MlirOperation next = mlirOperationGetNextInBlock(op);
        MlirStringRef s = sym_of(op);
        if (mlirOperationIsNull(find_func(m, s.data, s.length))) { /* not a declaration of an existing one */
          mlirOperationRemoveFromParent(op);
          mlirBlockAppendOwnedOperation(to, op);
        }
        op = next;
      }
      mlirModuleDestroy(parsed);
      rc = nova_verify(c, m, "defining the parallel loop thunks");
    }
  }
  nv_sb_free(&text);
  free(decls);
  return rc;
}
