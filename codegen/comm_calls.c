/* comm_calls.c: the gradient all-reduces of a data-parallel step as calls
 * of the runtime (runtime/rt_comm.c).
 *
 * Requires: the step bufferized, results as out-parameters, before the
 * in-place plan and the memory plan.  The lowering (lower_linalg.c) made
 * each nova.all_reduce %y = call @CG_COMM_MARKER<id>(%x) {nova.comm =
 * bucket}: a call of a declared function, which fusion leaves apart and
 * bufferization turns into one over memrefs, with a result of its own.
 *
 * Changes, on the cpu: each marker becomes
 *   - where it is (right after the gradient's last op, as passes/comm.c
 *     placed it): nova_rt_comm_start(&x, count, dtype, bucket, offset,
 *     bucket_count, members, f64): x is copied into its slice of the
 *     bucket, so that x's buffer dies there;
 *   - before the first top-level op that uses %y: %y's buffer (a new
 *     memref.alloc, which the memory plan places like any other, live from
 *     here) and nova_rt_comm_wait(&y, count, dtype, bucket, offset).
 * Between the two the backward goes on while the bucket is summed.  A
 * bucket's members take slices in the order of their markers; its
 * elements are f64 when one member is, else f32 (bf16/f16 widened).
 * Elsewhere (cuda, a world of one) %y is %x.  The markers' declarations
 * are erased.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"

#define START_FUNC "nova_rt_comm_start"
#define WAIT_FUNC "nova_rt_comm_wait"
#define MAX_BUCKETS 4096 /* runtime/rt_comm.c's COMM_MAX_BUCKETS */

typedef struct marker {
  MlirOperation call;
  int64_t bucket, count, offset;
  int dtype; /* nova_dtype */
} marker;

static bool is_marker(MlirOperation op) {
  if (!cg_op_is(op, "func.call")) return false;
  MlirAttribute callee = mlirOperationGetAttributeByName(op, nova_str("callee"));
  if (mlirAttributeIsNull(callee)) return false;
  MlirStringRef n = mlirFlatSymbolRefAttrGetValue(callee);
  size_t pl = strlen(CG_COMM_MARKER);
  return n.length > pl && !strncmp(n.data, CG_COMM_MARKER, pl);
}

static int dtype_code(MlirType et) {
  if (mlirTypeIsAF32(et)) return 1;
  if (mlirTypeIsAF64(et)) return 11;
  if (mlirTypeIsABF16(et)) return 16;
  if (mlirTypeIsAF16(et)) return 10;
  return 0;
}

/* The op of BLOCK that holds OP (OP itself when it is in BLOCK). */
static MlirOperation in_block(MlirOperation op, MlirBlock block) {
  while (!mlirOperationIsNull(op) && !mlirBlockEqual(mlirOperationGetBlock(op), block))
    op = mlirOperationGetParentOperation(op);
  return op;
}

/* The first op after FROM in its block that uses V, directly or nested
 * (the block's terminator when none does). */
static MlirOperation first_reader(MlirValue v, MlirOperation from) {
  MlirBlock block = mlirOperationGetBlock(from);
  MlirOperation users[64];
  int nu = 0;
  bool many = false;
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u)) {
    MlirOperation t = in_block(mlirOpOperandGetOwner(u), block);
    if (mlirOperationIsNull(t)) continue;
    if (nu < 64) users[nu++] = t;
    else many = true;
  }
  for (MlirOperation o = mlirOperationGetNextInBlock(from); !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o)) {
    for (int i = 0; i < nu; i++)
      if (mlirOperationEqual(users[i], o)) return o;
    if (many) /* (more users than the list holds: look at the op's own operands too) */
      for (intptr_t k = 0; k < mlirOperationGetNumOperands(o); k++)
        if (mlirValueEqual(mlirOperationGetOperand(o, k), v)) return o;
    if (mlirOperationIsNull(mlirOperationGetNextInBlock(o))) return o; /* the terminator */
  }
  return mlirBlockGetTerminator(block);
}

typedef struct mlist {
  marker *v;
  size_t n, cap;
  bool oom;
} mlist;

static MlirWalkResult find_cb(MlirOperation op, void *ud) {
  mlist *l = ud;
  if (!is_marker(op)) return MlirWalkResultAdvance;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    marker *v = realloc(l->v, cap * sizeof *v);
    if (!v) {
      l->oom = true;
      return MlirWalkResultInterrupt;
    }
    l->v = v, l->cap = cap;
  }
  MlirAttribute b = mlirOperationGetDiscardableAttributeByName(op, nova_str("nova.comm"));
  MlirType t = mlirValueGetType(mlirOperationGetOperand(op, 0));
  int64_t count = 1;
  for (intptr_t r = 0; r < mlirShapedTypeGetRank(t); r++) count *= mlirShapedTypeGetDimSize(t, r);
  l->v[l->n++] = (marker){op, !mlirAttributeIsNull(b) && mlirAttributeIsAInteger(b) ? mlirIntegerAttrGetValueInt(b) : -1,
                          count, 0, dtype_code(mlirShapedTypeGetElementType(t))};
  return MlirWalkResultAdvance;
}

static void erase_declarations(MlirModule m) {
  MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m));
  while (!mlirOperationIsNull(f)) {
    MlirOperation next = mlirOperationGetNextInBlock(f);
    MlirAttribute n = mlirOperationGetAttributeByName(f, nova_str("sym_name"));
    size_t pl = strlen(CG_COMM_MARKER);
    if (cg_op_is(f, "func.func") && !mlirAttributeIsNull(n) && mlirStringAttrGetValue(n).length > pl &&
        !strncmp(mlirStringAttrGetValue(n).data, CG_COMM_MARKER, pl))
      mlirOperationDestroy(f);
    f = next;
  }
}

static void emit(MlirContext ctx, const marker *mk, const int64_t *bcount, const int *bmembers, const bool *bf64) {
  MlirOperation call = mk->call;
  MlirValue x = mlirOperationGetOperand(call, 0), y = mlirOperationGetResult(call, 0);
  MlirLocation loc = mlirOperationGetLocation(call);
  MlirType i64 = mlirIntegerTypeGet(ctx, 64);
  cg_builder b = {ctx, loc, mlirOperationGetBlock(call), call};
  int64_t bk = mk->bucket;
  int64_t head[7] = {mk->count, mk->dtype, bk, mk->offset, bcount[bk], bmembers[bk], bf64[bk]};
  MlirValue sa[8] = {cg_memref_address(&b, x, NULL)};
  for (int i = 0; i < 7; i++) sa[i + 1] = cg_build_const(&b, i64, head[i]);
  cg_insert_call(call, loc, mlirFlatSymbolRefAttrGet(ctx, nova_str(START_FUNC)), 8, sa, 0, NULL);
  b.at = first_reader(y, call);
  MlirType yt = mlirValueGetType(y);
  MlirNamedAttribute na[2] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("operandSegmentSizes")), mlirDenseI32ArrayGet(ctx, 2, (int32_t[]){0, 0})),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("alignment")), mlirIntegerAttrGet(i64, 64))};
  MlirValue buf = mlirOperationGetResult(cg_build(&b, "memref.alloc", 0, NULL, 1, &yt, 2, na), 0);
  mlirValueReplaceAllUsesOfWith(y, buf);
  MlirValue wa[5] = {cg_memref_address(&b, buf, NULL)};
  for (int i = 0; i < 4; i++) wa[i + 1] = cg_build_const(&b, i64, head[i]);
  cg_insert_call(b.at, loc, mlirFlatSymbolRefAttrGet(ctx, nova_str(WAIT_FUNC)), 5, wa, 0, NULL);
  mlirOperationDestroy(call);
}

int cg_comm_calls(nova_ctx *c, MlirModule m, bool cpu) {
  mlist l = {0};
  mlirOperationWalk(mlirModuleGetOperation(m), find_cb, &l, MlirWalkPreOrder);
  int64_t *bcount = calloc(MAX_BUCKETS, sizeof *bcount);
  int *bmembers = calloc(MAX_BUCKETS, sizeof *bmembers);
  bool *bf64 = calloc(MAX_BUCKETS, sizeof *bf64);
  int rc = 0;
  if (l.oom || !bcount || !bmembers || !bf64) {
    nv_error(c->diag, (nv_loc){0}, "out of memory");
    rc = -1;
    goto out;
  }
  for (size_t i = 0; i < l.n; i++) {
    marker *mk = &l.v[i];
    if (mk->bucket < 0 || mk->bucket >= MAX_BUCKETS || !mk->dtype) {
      nv_error(c->diag, (nv_loc){0}, "internal: an all-reduce with no bucket or of a type that is not float");
      rc = -1;
      goto out;
    }
    mk->offset = bcount[mk->bucket];
    bcount[mk->bucket] += mk->count;
    bmembers[mk->bucket]++;
    bf64[mk->bucket] |= mk->dtype == 11;
  }
  for (size_t i = 0; i < l.n; i++) {
    if (!cpu) {
      mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(l.v[i].call, 0), mlirOperationGetOperand(l.v[i].call, 0));
      mlirOperationDestroy(l.v[i].call);
    } else {
      emit(c->ctx, &l.v[i], bcount, bmembers, bf64);
    }
  }
  erase_declarations(m);
  if (cpu && l.n) {
    cg_declare_i64_func(m, START_FUNC, 8);
    cg_declare_i64_func(m, WAIT_FUNC, 5);
  }
out:
  free(l.v);
  free(bcount);
  free(bmembers);
  free(bf64);
  return rc;
}
