/* comm_calls.c: the gradient all-reduces of a data-parallel step as calls
 * of the runtime (runtime/rt_comm.c).
 *
 * Requires: the step bufferized, results as out-parameters, before the
 * in-place plan and the memory plan.  The lowering (lower_linalg.c) made
 * each nova.all_reduce %y = call @CG_COMM_MARKER<id>(%x) {nova.comm =
 * bucket}: a call of a declared function, which fusion leaves apart and
 * bufferization turns into one over memrefs, with a result of its own.
 *
 * {nova.comm = [kind, bucket, world]}: an all-reduce, a reduce-scatter or
 * an all-gather (--shard-optimizer), or a shard (this rank's share of a
 * value).
 *
 * Changes, on the cpu: each collective's marker becomes
 *   - where it is (right after the gradient's last op, as passes/comm.c
 *     placed it): nova_rt_comm_start(&x, count, dtype, bucket, offset,
 *     block, members, f64, kind, world): x is copied into its place in the
 *     bucket, so that x's buffer dies there;
 *   - before the first top-level op that uses %y: %y's buffer (a new
 *     memref.alloc, which the memory plan places like any other, live from
 *     here) and nova_rt_comm_wait(&y, unit, dtype, bucket, offset).
 * Offsets and the block are in one rank's block of the bucket: a member
 * takes its whole count in an all-reduce, its share in the others.  A
 * shard is nova_rt_comm_shard(&x, count, &y, share, dtype, world), where it
 * is.
 * Between the two the backward goes on while the bucket is summed.  A
 * bucket's members take slices in the order of their markers; its
 * elements are f64 when one member is, else f32 (bf16/f16 widened).
 * On the cuda target (not --gpu-sim, whose kernels are CPU loops: the cpu
 * case) %y is %x, a world of one.  The markers' declarations
 * are erased.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"

#define START_FUNC "nova_rt_comm_start"
#define WAIT_FUNC "nova_rt_comm_wait"
#define SHARD_FUNC "nova_rt_comm_shard"
#define MAX_BUCKETS 4096 /* runtime/rt_comm.c's COMM_MAX_BUCKETS */

typedef struct marker {
  MlirOperation call;
  int kind;                 /* CG_COMM_* */
  int64_t bucket, world;
  int64_t count;            /* the operand's elements */
  int64_t unit;             /* its elements in one rank's block of the bucket (reduce-scatter,
                               all-gather: a share; all-reduce: all of them) */
  int64_t offset;           /* in the block */
  int dtype;                /* nova_dtype */
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
 * (the block's terminator when none does; NULL when out of memory);
 * *EARLY: whether it comes before AFTER (the last start of the bucket: a
 * wait there would never end). */
static MlirOperation first_reader(MlirValue v, MlirOperation from, MlirOperation after, bool *early) {
  MlirBlock block = mlirOperationGetBlock(from);
  cg_op_list users = {0}; /* the ops of BLOCK that hold a use of V */
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u)) {
    MlirOperation t = in_block(mlirOpOperandGetOwner(u), block);
    if (!mlirOperationIsNull(t) && !cg_op_list_push(&users, t)) break;
  }
  MlirOperation found = users.oom ? (MlirOperation){NULL} : mlirBlockGetTerminator(block);
  bool passed = mlirOperationEqual(from, after);
  *early = false;
  for (MlirOperation o = mlirOperationGetNextInBlock(from); !users.oom && !mlirOperationIsNull(o);
       o = mlirOperationGetNextInBlock(o)) {
    bool hit = false;
    for (size_t i = 0; i < users.n && !hit; i++) hit = mlirOperationEqual(users.v[i], o);
    if (hit) {
      *early = !passed;
      found = o;
      break;
    }
    passed |= mlirOperationEqual(o, after);
  }
  free(users.v);
  return found;
}

static MlirWalkResult find_cb(MlirOperation op, void *ud) {
  if (is_marker(op) && !cg_op_list_push(ud, op)) return MlirWalkResultInterrupt;
  return MlirWalkResultAdvance;
}

/* The marker OP's kind, bucket, sizes and element type. */
static marker read_marker(MlirOperation op) {
  MlirAttribute a = mlirOperationGetDiscardableAttributeByName(op, nova_str("nova.comm"));
  MlirType t = mlirValueGetType(mlirOperationGetOperand(op, 0)), rt = mlirValueGetType(mlirOperationGetResult(op, 0));
  int64_t count = 1, out = 1;
  for (intptr_t r = 0; r < mlirShapedTypeGetRank(t); r++) count *= mlirShapedTypeGetDimSize(t, r);
  for (intptr_t r = 0; r < mlirShapedTypeGetRank(rt); r++) out *= mlirShapedTypeGetDimSize(rt, r);
  marker mk = {op, -1, -1, 0, count, count, 0, dtype_code(mlirShapedTypeGetElementType(t))};
  if (!mlirAttributeIsNull(a) && mlirAttributeIsADenseI64Array(a) && mlirDenseArrayGetNumElements(a) == 3) {
    mk.kind = (int)mlirDenseI64ArrayGetElement(a, 0);
    mk.bucket = mlirDenseI64ArrayGetElement(a, 1);
    mk.world = mlirDenseI64ArrayGetElement(a, 2);
  }
  if (mk.kind == CG_COMM_REDUCE_SCATTER || mk.kind == CG_COMM_SHARD) mk.unit = out;
  return mk;
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

static MlirValue new_buffer(cg_builder *b, MlirType t) {
  MlirContext ctx = b->ctx;
  MlirNamedAttribute na[2] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("operandSegmentSizes")),
                            mlirDenseI32ArrayGet(ctx, 2, (int32_t[]){0, 0})),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("alignment")),
                            mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 64))};
  return mlirOperationGetResult(cg_build(b, "memref.alloc", 0, NULL, 1, &t, 2, na), 0);
}

static MlirOperation call(cg_builder *b, const char *fn, MlirValue addr, int n, const int64_t *v) {
  MlirType i64 = mlirIntegerTypeGet(b->ctx, 64);
  MlirValue args[12] = {addr};
  for (int i = 0; i < n; i++) args[i + 1] = cg_build_const(b, i64, v[i]);
  return cg_insert_call(b->at, b->loc, mlirFlatSymbolRefAttrGet(b->ctx, nova_str(fn)), n + 1, args, 0, NULL);
}

static int emit(nova_ctx *c, const marker *mk, const int64_t *bcount, const int *bmembers, const bool *bf64,
                MlirOperation *blast) {
  MlirContext ctx = c->ctx;
  MlirOperation op = mk->call;
  MlirValue x = mlirOperationGetOperand(op, 0), y = mlirOperationGetResult(op, 0);
  cg_builder b = {ctx, mlirOperationGetLocation(op), mlirOperationGetBlock(op), op};
  if (mk->kind == CG_COMM_SHARD) { /* this rank's share of x, now */
    MlirValue buf = new_buffer(&b, mlirValueGetType(y));
    mlirValueReplaceAllUsesOfWith(y, buf);
    MlirType i64 = mlirIntegerTypeGet(ctx, 64);
    MlirValue args[6] = {cg_memref_address(&b, x, NULL), cg_build_const(&b, i64, mk->count),
                         cg_memref_address(&b, buf, NULL), cg_build_const(&b, i64, mk->unit),
                         cg_build_const(&b, i64, mk->dtype), cg_build_const(&b, i64, mk->world)};
    cg_insert_call(op, b.loc, mlirFlatSymbolRefAttrGet(ctx, nova_str(SHARD_FUNC)), 6, args, 0, NULL);
    mlirOperationDestroy(op);
    return 0;
  }
  int64_t bk = mk->bucket;
  MlirOperation start = call(&b, START_FUNC, cg_memref_address(&b, x, NULL), 9,
       (int64_t[]){mk->count, mk->dtype, bk, mk->offset, bcount[bk], bmembers[bk], bf64[bk], mk->kind, mk->world});
  bool early;
  b.at = first_reader(y, op, blast[bk], &early);
  if (mlirOperationIsNull(b.at)) {
    nv_error_plain(c->diag, "out of memory");
    return -1;
  }
  if (early) {
    nv_error_plain(c->diag, "internal: the sum of bucket %lld is read before the bucket's last collective starts",
                   (long long)bk);
    return -1;
  }
  MlirValue buf = new_buffer(&b, mlirValueGetType(y));
  mlirValueReplaceAllUsesOfWith(y, buf);
  call(&b, WAIT_FUNC, cg_memref_address(&b, buf, NULL), 4, (int64_t[]){mk->unit, mk->dtype, bk, mk->offset});
  if (mlirOperationEqual(blast[bk], op)) blast[bk] = start; /* (the marker goes) */
  mlirOperationDestroy(op);
  return 0;
}

int cg_comm_calls(nova_ctx *c, MlirModule m, bool cpu) {
  cg_op_list ops = {0};
  mlirOperationWalk(mlirModuleGetOperation(m), find_cb, &ops, MlirWalkPreOrder);
  struct { marker *v; size_t n; } l = {ops.oom ? NULL : calloc(ops.n ? ops.n : 1, sizeof *l.v), ops.oom ? 0 : ops.n};
  for (size_t i = 0; l.v && i < l.n; i++) l.v[i] = read_marker(ops.v[i]);
  free(ops.v);
  int64_t *bcount = calloc(MAX_BUCKETS, sizeof *bcount);
  int *bmembers = calloc(MAX_BUCKETS, sizeof *bmembers);
  bool *bf64 = calloc(MAX_BUCKETS, sizeof *bf64);
  MlirOperation *blast = calloc(MAX_BUCKETS, sizeof *blast); /* each bucket's last marker */
  int rc = 0;
  if (!l.v || !bcount || !bmembers || !bf64 || !blast) {
    nv_error(c->diag, (nv_loc){0}, "out of memory");
    rc = -1;
    goto out;
  }
  for (size_t i = 0; i < l.n; i++) {
    marker *mk = &l.v[i];
    if ((mk->kind != CG_COMM_SHARD && (mk->bucket < 0 || mk->bucket >= MAX_BUCKETS)) || mk->kind < 0 || !mk->dtype) {
      nv_error(c->diag, (nv_loc){0}, "internal: an all-reduce with no bucket or of a type that is not float");
      rc = -1;
      goto out;
    }
    if (mk->kind == CG_COMM_SHARD) continue;
    mk->offset = bcount[mk->bucket];
    bcount[mk->bucket] += mk->unit;
    bmembers[mk->bucket]++;
    bf64[mk->bucket] |= mk->dtype == 11;
    blast[mk->bucket] = mk->call;
  }
  for (size_t i = 0; i < l.n; i++) {
    if (!cpu) { /* (a cuda step runs as one rank: data-parallel, never sharded) */
      mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(l.v[i].call, 0), mlirOperationGetOperand(l.v[i].call, 0));
      mlirOperationDestroy(l.v[i].call);
    } else if (emit(c, &l.v[i], bcount, bmembers, bf64, blast)) {
      rc = -1;
      goto out;
    }
  }
  erase_declarations(m);
  if (cpu && l.n) {
    cg_declare_i64_func(m, START_FUNC, 10);
    cg_declare_i64_func(m, WAIT_FUNC, 5);
    cg_declare_i64_func(m, SHARD_FUNC, 6);
  }
out:
  free(l.v);
  free(bcount);
  free(bmembers);
  free(bf64);
  free(blast);
  return rc;
}
