/* cuda.c: linalg on tensors -> GPU kernels -> NVVM -> PTX (ptxas makes the
 * cubin when the step is linked, codegen/step.c).
 *
 * After bufferization every linalg op becomes loops (upstream
 * convert-linalg-to-parallel-loops); then, in this file:
 *  - each top-level scf.parallel becomes one gpu.launch over its iteration
 *    space, linearized: thread g = blockIdx.x * B + threadIdx.x computes the
 *    point g (guarded by g < N), B from the configurator's pointwise
 *    schedule.  Reduction dimensions stay loops inside the thread.
 *  - a run of reductions along rows and the elementwise ops around them
 *    becomes one row kernel, a group of lanes per row (gpu_rows.c).
 *  - top-level code that is not a parallel loop (a reduction to a scalar, a
 *    0-d op) runs as a one-thread kernel: correct, not fast.
 *  - memref.alloc becomes gpu.alloc, served by the runtime from the step's
 *    scratch arena, whose size is summed here; deallocation is not needed
 *    (the arena is reset for each run).  memref.copy becomes linalg.copy (a
 *    kernel).  memref.get_global is cloned into each kernel that reads it, so
 *    constants become device globals.
 * Upstream gpu-kernel-outlining then makes one gpu.module per launch; they
 * are merged into one (one PTX file, one ptxas run, one module load), the
 * kernels renamed nova_kI in launch order.
 */
#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/GPU.h>
#include <mlir-c/Dialect/Linalg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../configurator/gemm.h"
#include "../configurator/kernel.h"
#include "../support/util.h"
#include "codegen.h"
#include "cuda_internal.h"


MlirNamedAttribute cu_named(MlirContext ctx, const char *name, MlirAttribute a) {
  return mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str(name)), a);
}

/* Creates NAME with the given operands, results and attributes and inserts
 * it into BLOCK before REF (at the end when REF is null). */
MlirOperation cu_mk(MlirBlock block, MlirOperation ref, const char *name, MlirLocation loc,
                        int nops, const MlirValue *ops, int nres, const MlirType *res, int nattr,
                        const MlirNamedAttribute *attrs) {
  MlirOperationState st = mlirOperationStateGet(nova_str(name), loc);
  if (nops) mlirOperationStateAddOperands(&st, nops, ops);
  if (nres) mlirOperationStateAddResults(&st, nres, res);
  if (nattr) mlirOperationStateAddAttributes(&st, nattr, attrs);
  MlirOperation op = mlirOperationCreate(&st);
  if (mlirOperationIsNull(ref)) mlirBlockAppendOwnedOperation(block, op);
  else mlirBlockInsertOwnedOperationBefore(block, ref, op);
  return op;
}

MlirValue cu_index_const(MlirContext ctx, MlirBlock b, MlirOperation ref, MlirLocation loc, int64_t v) {
  MlirType it = mlirIndexTypeGet(ctx);
  MlirNamedAttribute a = cu_named(ctx, "value", mlirIntegerAttrGet(it, v));
  return mlirOperationGetResult(cu_mk(b, ref, "arith.constant", loc, 0, NULL, 1, &it, 1, &a), 0);
}

MlirValue cu_binop(MlirBlock b, MlirOperation ref, MlirLocation loc, const char *name,
                       MlirValue x, MlirValue y) {
  MlirValue ops[2] = {x, y};
  MlirType t = mlirValueGetType(x);
  return mlirOperationGetResult(cu_mk(b, ref, name, loc, 2, ops, 1, &t, 0, NULL), 0);
}

/* The static value of an index constant; false if V is not one. */
bool cu_const_index(MlirValue v, int64_t *out) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  if (!cg_op_is(d, "arith.constant")) return false;
  MlirAttribute a = mlirOperationGetAttributeByName(d, nova_str("value"));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a)) return false;
  *out = mlirIntegerAttrGetValueInt(a);
  return true;
}

/* Fills K's source op name and location from LOC: the linalg lowering
 * gives each loop nest the location of the linalg op (wrapped in a name
 * location "linalg.OP" by tag_linalg_ops). */
void cu_describe_loc(MlirLocation loc, cg_kernel *k) {
  if (mlirLocationIsAName(loc)) {
    MlirStringRef n = mlirIdentifierStr(mlirLocationNameGetName(loc));
    const char *dot = memchr(n.data, '.', n.length);
    size_t skip = dot ? (size_t)(dot - n.data) + 1 : 0;
    snprintf(k->op, sizeof k->op, "%.*s", (int)(n.length - skip), n.data + skip);
    loc = mlirLocationNameGetChildLoc(loc);
  }
  nv_sbuf b = {0};
  mlirLocationPrint(loc, cg_print_to_sbuf, &b);
  const char *s = b.s ? b.s : "";
  if (!strncmp(s, "loc(", 4)) s += 4;
  snprintf(k->loc, sizeof k->loc, "%s", s);
  size_t n = strlen(k->loc);
  if (n && k->loc[n - 1] == ')') k->loc[--n] = 0;
  if (n > 4 && !strcmp(k->loc + n - 4, ":0:0")) k->loc[n - 4] = 0; /* ONNX nodes: no line */
  for (char *p = k->loc; *p; p++)
    if (*p == '"') memmove(p, p + 1, strlen(p));
  nv_sb_free(&b);
}

cg_kernel *cu_new_kernel(gpu_ctx *G) {
  cg_gpu *o = G->out;
  if (o->nk == o->cap) {
    int cap = o->cap ? 2 * o->cap : 32;
    cg_kernel *k = nv_xrealloc(o->k, (size_t)cap * sizeof *k);
    if (!k) return NULL;
    o->k = k;
    o->cap = cap;
  }
  cg_kernel *k = &o->k[o->nk++];
  memset(k, 0, sizeof *k);
  snprintf(k->name, sizeof k->name, "nova_k%d", o->nk - 1);
  return k;
}

/* Creates gpu.launch (GRID x 1 x 1 blocks of BLOCK x 1 x 1 threads) in B
 * before REF; returns its body block, which ends in gpu.terminator. */
MlirBlock cu_make_launch(gpu_ctx *G, MlirBlock b, MlirOperation ref, MlirLocation loc, int64_t grid,
                             int64_t block, MlirOperation *term) {
  MlirContext ctx = G->ctx;
  MlirValue one = cu_index_const(ctx, b, ref, loc, 1);
  MlirValue gx = cu_index_const(ctx, b, ref, loc, grid), bx = cu_index_const(ctx, b, ref, loc, block);
  MlirValue ops[6] = {gx, one, one, bx, one, one};
  MlirType it = mlirIndexTypeGet(ctx);
  MlirType at[12];
  MlirLocation al[12];
  for (int i = 0; i < 12; i++) at[i] = it, al[i] = loc;
  MlirRegion region = mlirRegionCreate();
  MlirBlock body = mlirBlockCreate(12, at, al);
  mlirRegionAppendOwnedBlock(region, body);
  int32_t seg[11] = {0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0};
  MlirNamedAttribute attrs[2] = {
      cu_named(ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(ctx, 11, seg)),
      cu_named(ctx, "workgroup_attributions", mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 0))};
  MlirOperationState st = mlirOperationStateGet(nova_str("gpu.launch"), loc);
  mlirOperationStateAddOperands(&st, 6, ops);
  mlirOperationStateAddAttributes(&st, 2, attrs);
  mlirOperationStateAddOwnedRegions(&st, 1, &region);
  mlirBlockInsertOwnedOperationBefore(b, ref, mlirOperationCreate(&st));
  *term = cu_mk(body, (MlirOperation){NULL}, "gpu.terminator", loc, 0, NULL, 0, NULL, 0, NULL);
  return body;
}

/* Moves every op of FROM except its terminator before REF in TO. */
void cu_move_body(MlirBlock from, MlirOperation ref) {
  MlirOperation op = mlirBlockGetFirstOperation(from), term = mlirBlockGetTerminator(from);
  while (!mlirOperationIsNull(op) && !mlirOperationEqual(op, term)) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    mlirOperationMoveBefore(op, ref);
    op = next;
  }
}

/* The scf.parallel at the bottom of TOP, a top-level chain of scf.for loops
 * each holding only the next (what convert-linalg-to-parallel-loops makes
 * of an op whose reduction dimensions come before its parallel ones), or
 * null. */
static MlirOperation for_chain_parallel(MlirOperation top) {
  MlirOperation op = top;
  while (cg_op_is(op, "scf.for") && mlirOperationGetNumResults(op) == 0) {
    MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
    MlirOperation first = mlirBlockGetFirstOperation(b);
    if (mlirOperationIsNull(first) || !mlirOperationEqual(mlirOperationGetNextInBlock(first), mlirBlockGetTerminator(b)))
      return (MlirOperation){NULL};
    op = first;
  }
  return cg_op_is(op, "scf.parallel") && !mlirOperationEqual(op, top) ? op : (MlirOperation){NULL};
}


/* scf.if (COND) { } before REF in B, without an else; its then region. */
row_region cu_if(MlirBlock b, MlirOperation ref, MlirLocation loc, MlirValue cond) {
  MlirRegion then_r = mlirRegionCreate(), else_r = mlirRegionCreate();
  MlirBlock tb = mlirBlockCreate(0, NULL, NULL);
  mlirRegionAppendOwnedBlock(then_r, tb);
  MlirRegion regs[2] = {then_r, else_r};
  MlirOperationState st = mlirOperationStateGet(nova_str("scf.if"), loc);
  mlirOperationStateAddOperands(&st, 1, &cond);
  mlirOperationStateAddOwnedRegions(&st, 2, regs);
  mlirBlockInsertOwnedOperationBefore(b, ref, mlirOperationCreate(&st));
  return (row_region){tb, cu_mk(tb, (MlirOperation){NULL}, "scf.yield", loc, 0, NULL, 0, NULL, 0, NULL)};
}

MlirValue cu_cmp(gpu_ctx *G, MlirBlock b, MlirOperation ref, MlirLocation loc, int pred, MlirValue x,
                         MlirValue y) {
  MlirValue ops[2] = {x, y};
  MlirType i1 = mlirIntegerTypeGet(G->ctx, 1);
  MlirNamedAttribute a = cu_named(G->ctx, "predicate", mlirIntegerAttrGet(mlirIntegerTypeGet(G->ctx, 64), pred));
  return mlirOperationGetResult(cu_mk(b, ref, "arith.cmpi", loc, 2, ops, 1, &i1, 1, &a), 0);
}

/* One scf.parallel P (lower bounds 0, steps 1, constant upper bounds: what
 * convert-linalg-to-parallel-loops makes from static shapes) -> a
 * linearized one-thread-per-point gpu.launch.  TOP is P, or the top-level
 * chain of scf.for loops around P (for_chain_parallel): the loops are then
 * interchanged, each thread running the whole chain for its point.  That is
 * legal for loops made from a linalg op: an output element is written only
 * by iterations with its own parallel indices. */
static void map_parallel(gpu_ctx *G, MlirBlock fb, MlirOperation top, MlirOperation p) {
  MlirContext ctx = G->ctx;
  MlirLocation loc = mlirOperationGetLocation(p);
  MlirBlock pb = mlirRegionGetFirstBlock(mlirOperationGetRegion(p, 0));
  intptr_t r = mlirBlockGetNumArguments(pb);
  if (r < 1 || r > MAX_LOOP_RANK || mlirOperationGetNumResults(p) || mlirOperationGetNumOperands(p) != 3 * r) {
    nv_error_plain(G->c->diag, "internal: cannot map a parallel loop of rank %d to the GPU", (int)r);
    G->failed = 1;
    return;
  }
  int64_t ub[MAX_LOOP_RANK], n = 1;
  for (intptr_t i = 0; i < r; i++) {
    int64_t lo = -1, st = -1;
    if (!cu_const_index(mlirOperationGetOperand(p, i), &lo) || !cu_const_index(mlirOperationGetOperand(p, r + i), &ub[i]) ||
        !cu_const_index(mlirOperationGetOperand(p, 2 * r + i), &st) || lo != 0 || st != 1 || ub[i] < 1) {
      nv_error_plain(G->c->diag, "internal: a parallel loop without static bounds cannot be mapped to the GPU");
      G->failed = 1;
      return;
    }
    n *= ub[i];
  }
  cg_kernel *k = cu_new_kernel(G);
  if (!k) {
    G->failed = 1;
    return;
  }
  cfg_pointwise_schedule s = cfg_pointwise(G->dev, n, 4, false);
  if (!s.ok) {
    nv_error_plain(G->c->diag, "cannot configure a kernel over %lld points: %s", (long long)n, s.reason);
    G->failed = 1;
    return;
  }
  if (G->block) { /* by hand (tuning experiments): same one-thread-per-point mapping */
    s.threads = G->block;
    s.grid = (n + G->block - 1) / G->block;
    snprintf(s.reason, sizeof s.reason, "--gpu-block=%d (set by hand)", G->block);
  }
  cu_describe_loc(loc, k);
  k->rank = (int)r;
  memcpy(k->dims, ub, (size_t)r * sizeof *ub);
  k->n = n;
  k->grid = s.grid;
  k->block = s.threads;
  snprintf(k->reason, sizeof k->reason, "%s", s.reason);
  if (!mlirOperationEqual(top, p) && strlen(k->reason) + 40 < sizeof k->reason)
    strcat(k->reason, "; reduction loop inside each thread");
  MlirOperation term;
  MlirBlock body = cu_make_launch(G, fb, top, loc, s.grid, s.threads, &term);
  /* g = blockIdx.x * B + threadIdx.x; if (g < N) { i_k = delinearize(g); ... } */
  MlirValue bid = mlirBlockGetArgument(body, 0), tid = mlirBlockGetArgument(body, 3);
  MlirValue g = cu_binop(body, term, loc, "arith.addi",
                      cu_binop(body, term, loc, "arith.muli", bid, cu_index_const(ctx, body, term, loc, s.threads)), tid);
  MlirValue ok = cu_cmp(G, body, term, loc, 6 /* ult */, g, cu_index_const(ctx, body, term, loc, n));
  row_region then = cu_if(body, term, loc, ok);
  MlirBlock then_b = then.b;
  MlirOperation yield = then.end;
  MlirValue rest = g;
  for (intptr_t i = r - 1; i >= 0; i--) {
    MlirValue iv;
    if (i == 0) iv = rest;
    else {
      MlirValue d = cu_index_const(ctx, then_b, yield, loc, ub[i]);
      iv = cu_binop(then_b, yield, loc, "arith.remui", rest, d);
      rest = cu_binop(then_b, yield, loc, "arith.divui", rest, d);
    }
    mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(pb, i), iv);
  }
  if (mlirOperationEqual(top, p)) cu_move_body(pb, yield);
  else {
    mlirOperationMoveBefore(top, yield);
    cu_move_body(pb, p);
  }
  mlirOperationDestroy(p);
}

/* Ops that stay on the host: no computation on tensor data. */
bool cu_host_op(MlirOperation op) {
  static const char *const names[] = {"arith.constant", "memref.alloc", "memref.get_global", "memref.expand_shape",
                                      "memref.collapse_shape", "memref.subview", "memref.reinterpret_cast",
                                      "memref.cast", "memref.view", "func.return", "gpu.launch", "gpu.alloc",
                                      NULL};
  for (int i = 0; names[i]; i++)
    if (cg_op_is(op, names[i])) return true;
  return false;
}

/* OPS[0..n) (top-level computation that is not a parallel loop) -> one
 * single-thread kernel, placed after the last of them. */
static void map_serial(gpu_ctx *G, MlirBlock fb, MlirOperation *ops, int n) {
  MlirOperation last = ops[n - 1], after = mlirOperationGetNextInBlock(last);
  cg_kernel *k = cu_new_kernel(G);
  if (!k) {
    G->failed = 1;
    return;
  }
  MlirLocation loc = mlirOperationGetLocation(ops[0]);
  cu_describe_loc(loc, k);
  snprintf(k->op, sizeof k->op, "serial");
  k->n = 1;
  k->grid = k->block = 1;
  snprintf(k->reason, sizeof k->reason, "no parallel dimension (a reduction to a scalar or a 0-d op): one thread");
  MlirOperation term;
  cu_make_launch(G, fb, after, loc, 1, 1, &term);
  for (int i = 0; i < n; i++) mlirOperationMoveBefore(ops[i], term);
}

/* memref.alloc -> gpu.alloc of the same static type; adds its size to the
 * scratch arena. */
static void alloc_to_gpu(gpu_ctx *G, MlirBlock fb, MlirOperation a) {
  MlirType t = mlirValueGetType(mlirOperationGetResult(a, 0));
  int64_t bytes = cg_type_bytes(t); /* >= 1: an empty buffer gets one aligned block too */
  G->out->scratch_bytes += (bytes + CG_GPU_ALIGN - 1) / CG_GPU_ALIGN * CG_GPU_ALIGN;
  int32_t seg[3] = {0, 0, 0};
  /* host_shared: the synchronous form gpu-to-llvm lowers (to mgpuMemAlloc,
   * which takes it from the device scratch arena whatever the flag says) */
  MlirNamedAttribute na[2] = {cu_named(G->ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(G->ctx, 3, seg)),
                              cu_named(G->ctx, "hostShared", mlirUnitAttrGet(G->ctx))};
  MlirOperation g = cu_mk(fb, a, "gpu.alloc", mlirOperationGetLocation(a), 0, NULL, 1, &t, 2, na);
  mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(a, 0), mlirOperationGetResult(g, 0));
  mlirOperationDestroy(a);
}

/* Clones each top-level memref.get_global that a kernel reads into the
 * kernel, so the outlined kernel addresses a device copy of the global. */
typedef struct sink_ud {
  MlirBlock launch_body;
  MlirOperation launch;
} sink_ud;

static MlirWalkResult sink_cb(MlirOperation op, void *ud) {
  sink_ud *s = ud;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    if (!mlirValueIsAOpResult(v)) continue;
    MlirOperation d = mlirOpResultGetOwner(v);
    if (!cg_op_is(d, "memref.get_global")) continue;
    MlirOperation parent = mlirOperationGetParentOperation(d);
    if (mlirOperationEqual(parent, s->launch) || !cg_op_is(parent, "func.func")) continue;
    MlirOperation copy = mlirOperationClone(d);
    mlirBlockInsertOwnedOperation(s->launch_body, 0, copy);
    mlirOperationSetOperand(op, i, mlirOperationGetResult(copy, 0));
  }
  return MlirWalkResultAdvance;
}

static void map_function(gpu_ctx *G, MlirOperation f) {
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
  int n = 0, cap = 64;
  MlirOperation *ops = nv_xmalloc((size_t)cap * sizeof *ops);
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); ops && !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (n == cap) {
      MlirOperation *o2 = nv_xrealloc(ops, (size_t)(cap *= 2) * sizeof *ops);
      if (!o2) break;
      ops = o2;
    }
    ops[n++] = op;
  }
  if (!ops) {
    G->failed = 1;
    return;
  }
  MlirOperation *run = nv_xmalloc((size_t)(n ? n : 1) * sizeof *run);
  int *grp = nv_xmalloc((size_t)(n ? n : 1) * sizeof *grp);
  cu_rows *rows = run && grp ? cu_rows_find(G, ops, n, grp) : NULL;
  if (!rows) {
    free(run), free(grp), free(ops);
    G->failed = 1;
    return;
  }
  int nrun = 0;
  for (int i = 0; i < n && !G->failed; i++) {
    MlirOperation op = ops[i];
    MlirOperation inner = cg_op_is(op, "scf.for") ? for_chain_parallel(op) : (MlirOperation){NULL};
    if (grp[i] >= 0) { /* a row kernel's nest: mapped with its last */
      int g = grp[i];
      if (nrun) map_serial(G, fb, run, nrun), nrun = 0;
      if (cu_rows_is_last(rows, g, op)) cu_rows_map(G, fb, rows, g);
    } else if (cg_op_is(op, "scf.parallel") || !mlirOperationIsNull(inner)) {
      if (nrun) map_serial(G, fb, run, nrun), nrun = 0;
      map_parallel(G, fb, op, mlirOperationIsNull(inner) ? op : inner);
    } else if (cg_op_is(op, "gpu.launch")) { /* a GEMM kernel */
      if (nrun) map_serial(G, fb, run, nrun), nrun = 0;
      cg_kernel *k = cu_new_kernel(G);
      if (!k || G->gemm_used >= G->ngemm) {
        G->failed = 1;
        break;
      }
      char name[sizeof k->name];
      memcpy(name, k->name, sizeof name);
      *k = G->gemm[G->gemm_used++];
      memcpy(k->name, name, sizeof name);
    } else if (cg_op_is(op, "memref.alloc") && !G->sim) alloc_to_gpu(G, fb, op);
    else if (cg_op_is(op, "memref.dealloc")) {
      /* the kernel of the pending run goes before a buffer is freed (sim) */
      if (nrun && G->sim) map_serial(G, fb, run, nrun), nrun = 0;
      if (!G->sim) mlirOperationDestroy(op);
    } else if (!cu_host_op(op)) run[nrun++] = op;
  }
  if (nrun && !G->failed) map_serial(G, fb, run, nrun);
  free(run);
  free(grp);
  cu_rows_free(rows);
  free(ops);
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !G->failed && !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    if (cg_op_is(op, "gpu.launch")) {
      sink_ud s = {mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0)), op};
      mlirOperationWalk(op, sink_cb, &s, MlirWalkPreOrder);
    }
}

/* memref.copy -> linalg.copy, so that copies become kernels too. */
static MlirWalkResult collect_copies(MlirOperation op, void *ud) {
  if (!cg_op_is(op, "memref.copy")) return MlirWalkResultAdvance;
  return cg_op_list_push(ud, op) ? MlirWalkResultAdvance : MlirWalkResultInterrupt;
}

static int copies_to_linalg(gpu_ctx *G, MlirModule m) {
  cg_op_list l = {0};
  mlirOperationWalk(mlirModuleGetOperation(m), collect_copies, &l, MlirWalkPostOrder);
  for (size_t i = 0; i < l.n; i++) {
    MlirOperation cp = l.v[i];
    cg_builder b = {G->ctx, mlirOperationGetLocation(cp), mlirOperationGetBlock(cp), cp};
    cg_build_named(&b, "linalg.copy", mlirOperationGetOperand(cp, 0), mlirOperationGetOperand(cp, 1), NULL);
    mlirOperationDestroy(cp);
  }
  free(l.v);
  return l.oom ? -1 : 0;
}

/* A 2-D view of element type and memory space of T: SIZES, STRIDES, a
 * dynamic offset. */
static MlirType matrix_view(MlirContext ctx, MlirType t, const int64_t *sizes, const int64_t *strides) {
  MlirAttribute layout = mlirStridedLayoutAttrGet(ctx, mlirShapedTypeGetDynamicStrideOrOffset(), 2, strides);
  return mlirMemRefTypeGet(mlirShapedTypeGetElementType(t), 2, sizes, layout, mlirMemRefTypeGetMemorySpace(t));
}

/* Whether OP is a GEMM the kernels take (gemm_cuda.c), its operands in O:
 * a linalg.matmul of f32 or f64 buffers (identity layouts), or a
 * linalg.contract of static buffers, any static strides: C[.., m, .., n]
 * += A[.., m, k ..] B[.., k, n ..] (f32 or f64; or bf16 or f16 A and B and
 * an f32 C, half_contract.c): n C's last dim, m its innermost other dim
 * of A and not B, one k loop, every other loop a batch loop of C that A
 * or B or both walk (a weight shared by the batch; the heads of a
 * projection written [b, t, h, d]).  A batch loop that continues m in A
 * and C and that B lacks (the rows of a batch of sequences times a
 * weight) joins m, one that continues n in B and C and that A lacks joins
 * n: one GEMM of more rows or columns instead of a batch of small ones.
 * A or B is read transposed where its k (A) or n (B) dim is the
 * contiguous one. */
static bool gemm_operands(MlirContext ctx, MlirOperation op, cg_gemm_operands *o) {
  bool matmul = cg_op_is(op, "linalg.matmul");
  if (!(matmul || cg_op_is(op, "linalg.contract")) || mlirOperationGetNumOperands(op) != 3) return false;
  MlirType t[3], et[3];
  for (int i = 0; i < 3; i++) {
    t[i] = mlirValueGetType(mlirOperationGetOperand(op, i));
    if (!mlirTypeIsAMemRef(t[i]) || mlirShapedTypeGetRank(t[i]) < 2 || mlirShapedTypeGetRank(t[i]) > 8 ||
        !mlirShapedTypeHasStaticShape(t[i]))
      return false;
    et[i] = mlirShapedTypeGetElementType(t[i]);
  }
  bool wide = mlirTypeEqual(et[0], et[2]) && mlirTypeEqual(et[1], et[2]) && (mlirTypeIsAF32(et[2]) || mlirTypeIsAF64(et[2]));
  bool half = mlirTypeEqual(et[0], et[1]) && (mlirTypeIsABF16(et[0]) || mlirTypeIsAF16(et[0])) && mlirTypeIsAF32(et[2]);
  if (!wide && !(half && !matmul)) return false;
  memset(o, 0, sizeof *o);
  if (matmul) {
    for (int i = 0; i < 3; i++)
      if (mlirShapedTypeGetRank(t[i]) != 2 || !mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(t[i]))) return false;
    o->a = t[0], o->b = t[1], o->c = t[2];
    return true;
  }
  /* the maps (each result one loop), the loops' sizes and each operand's element stride along each loop */
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  int nl = (int)mlirAffineMapGetNumDims(mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, 0)));
  int d[3][8], rank[3];
  int64_t size[8] = {0}, ls[3][8] = {{0}};
  bool has[3][8] = {{false}};
  if (nl > 8) return false;
  for (int i = 0; i < 3; i++) {
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    rank[i] = (int)mlirShapedTypeGetRank(t[i]);
    int64_t st[8], off;
    if ((int)mlirAffineMapGetNumDims(m) != nl || mlirAffineMapGetNumResults(m) != rank[i] ||
        mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(t[i], st, &off)))
      return false;
    for (int r = 0; r < rank[i]; r++) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, r);
      if (!mlirAffineExprIsADim(e) || st[r] == mlirShapedTypeGetDynamicStrideOrOffset()) return false;
      int l = d[i][r] = (int)mlirAffineDimExprGetPosition(e);
      if (has[i][l]) return false; /* a diagonal */
      has[i][l] = true, ls[i][l] = st[r], size[l] = mlirShapedTypeGetDimSize(t[i], r);
    }
  }
  /* roles: n C's last dim (B's, not A's); m C's innermost other dim that
   * A has and B lacks; k the one loop C lacks (A's and B's); the others
   * batch loops */
  int rc = rank[2], dn = d[2][rc - 1], dm = -1, dk = -1, batch[8], nb = 0;
  if (!has[1][dn] || has[0][dn]) return false;
  for (int r = rc - 2; r >= 0 && dm < 0; r--)
    if (has[0][d[2][r]] && !has[1][d[2][r]]) dm = d[2][r];
  for (int l = 0; l < nl; l++) {
    if (has[2][l]) continue;
    if (dk >= 0 || !has[0][l] || !has[1][l]) return false; /* two k loops, or a loop summed over one operand */
    dk = l;
  }
  if (dm < 0 || dk < 0) return false;
  for (int r = 0; r < rc - 1; r++)
    if (d[2][r] != dm) batch[nb++] = d[2][r];
  /* batch loops that continue m or n join them (innermost first, again while any does) */
  int64_t M = size[dm], N = size[dn], K = size[dk];
  for (bool joined = true; joined;) {
    joined = false;
    for (int j = nb - 1; j >= 0; j--) {
      int l = batch[j];
      bool jm = !has[1][l] && ls[0][l] == ls[0][dm] * M && ls[2][l] == ls[2][dm] * M;
      bool jn = !has[0][l] && ls[1][l] == ls[1][dn] * N && ls[2][l] == ls[2][dn] * N;
      if (!jm && !jn) continue;
      if (jm) M *= size[l];
      else N *= size[l];
      memmove(batch + j, batch + j + 1, (size_t)(nb - j - 1) * sizeof *batch);
      nb--, joined = true;
    }
  }
  if (nb > CG_GEMM_MAXB) return false;
  int64_t points = 1;
  o->nbatch = nb;
  for (int j = 0; j < nb; j++) {
    o->bsize[j] = size[batch[j]], points *= size[batch[j]];
    for (int i = 0; i < 3; i++) o->bstride[i][j] = ls[i][batch[j]];
  }
  if (points > 65535) return false; /* grid.z */
  /* the views: A [M, K] or, m contiguous, [K, M]; B [K, N] or, k contiguous, [N, K]; C [M, N] */
  o->ta = ls[0][dm] < ls[0][dk], o->tb = ls[1][dk] < ls[1][dn];
  int64_t sa[2] = {o->ta ? K : M, o->ta ? M : K}, ta2[2] = {o->ta ? ls[0][dk] : ls[0][dm], o->ta ? ls[0][dm] : ls[0][dk]};
  int64_t sb[2] = {o->tb ? N : K, o->tb ? K : N}, tb2[2] = {o->tb ? ls[1][dn] : ls[1][dk], o->tb ? ls[1][dk] : ls[1][dn]};
  int64_t sc[2] = {M, N}, tc2[2] = {ls[2][dm], ls[2][dn]};
  o->a = matrix_view(ctx, t[0], sa, ta2);
  o->b = matrix_view(ctx, t[1], sb, tb2);
  o->c = matrix_view(ctx, t[2], sc, tc2);
  o->views = true;
  o->fa = t[0], o->fb = t[1], o->fc = t[2];
  return true;
}

/* --gemm-tile: TC (the configurator's schedule of one tensor-core GEMM)
 * with the block tile BM x BN x BK, warp tile WM x WN and S pipeline
 * stages given by hand (S 0: the configurator's), checked
 * against what the generator emits and the device holds: warp tiles of
 * whole mma tiles (16 x 8), at most 64 x 64; at most 8 warps (a block of
 * 255-register threads fits an SM's 64K registers); every stage of the
 * staged tiles in the (opt-in, dynamic) shared memory of a block.  -1
 * (and an error) where the tile does not fit. */
static int forced_tile(gpu_ctx *G, cfg_gemm_schedule *tc, bool h16, bool ta, bool tb, const char *kind) {
  const int *t = G->gemm_tile;
  int kstep = h16 ? 16 : 8;
  cfg_gemm_schedule ts = {.bm = t[0], .bn = t[1], .bk = t[2], .stages = t[5] ? t[5] : 1};
  int warps = t[3] && t[4] ? (t[0] / t[3]) * (t[1] / t[4]) : 0;
  int64_t smem = cg_gemm_tc_smem(&ts, h16, ta, tb);
  /* the stages are in dynamic shared memory */
  int64_t lim = G->dev->smem_per_block_optin;
  char sfx[16] = "";
  if (t[5]) snprintf(sfx, sizeof sfx, ",%d", t[5]);
  const char *why = t[3] % 16 || t[4] % 8 ? "the warp tile must be whole 16x8 mma tiles"
                    : t[3] * t[4] > 4096 ? "the warp tile holds at most 64x64 accumulators"
                    : t[0] % t[3] || t[1] % t[4] ? "the block tile must be whole warp tiles"
                    : t[2] % kstep ? (h16 ? "BK must be a multiple of 16 (the mma's k)" : "BK must be a multiple of 8 "
                                                                                            "(the tf32 mma's k)")
                    : warps > 8 || warps * 32 > G->dev->max_threads_per_block ? "at most 8 warps a block"
                    : smem > lim ? "the staged tiles exceed a block's shared memory (opt-in)"
                                 : NULL;
  if (why) {
    nv_error_plain(G->c->diag, "--gemm-tile=%dx%dx%d,%dx%d%s: %s (%s operands: %lld bytes of shared memory in %d "
                   "stage%s, %d warps; %s holds %lld bytes a block)", t[0], t[1], t[2], t[3], t[4], sfx, why, kind,
                   (long long)smem, ts.stages, ts.stages == 1 ? "" : "s", warps, G->dev->name, (long long)lim);
    return -1;
  }
  tc->bm = t[0], tc->bn = t[1], tc->bk = t[2], tc->warp_tile_m = t[3], tc->warp_tile_n = t[4];
  tc->wm = t[0] / t[3], tc->wn = t[1] / t[4], tc->warps = warps, tc->threads = 32 * warps;
  tc->smem_bytes = smem, tc->stages = t[5], tc->split_k = 1;
  return 0;
}

/* Registers a thread of a tensor-core GEMM with a WTM x WTN warp tile, as
 * the configurator estimates them: the f32 accumulators, one k step's
 * fragments, 32 for addresses. */
static int tc_regs(const cfg_gemm_schedule *tc) {
  int regs = tc->warp_tile_m * tc->warp_tile_n / 32 + (tc->warp_tile_m / 16) * 4 + (tc->warp_tile_n / 8) * 2 + 32;
  return regs > 255 ? 255 : (regs + 7) / 8 * 8;
}

/* Ops that neither read nor write a buffer's contents. */
static bool no_data_access(MlirOperation p) {
  return cg_op_is(p, "arith.constant") || cg_op_is(p, "memref.view") || cg_op_is(p, "memref.subview") ||
         cg_op_is(p, "memref.expand_shape") || cg_op_is(p, "memref.collapse_shape") ||
         cg_op_is(p, "memref.reinterpret_cast") || cg_op_is(p, "memref.cast");
}

/* FILL (the last linalg.fill before the contraction OP, with only
 * no_data_access ops between them) if it fills OP's output buffer C with
 * +0.0, else null: the GEMM then writes C = A B (every element of C is one
 * block's and written once) and the fill goes: C is not written, read and
 * written again. */
static MlirOperation zero_fill_of_c(MlirOperation op, MlirOperation fill) {
  MlirValue c = mlirOperationGetOperand(op, mlirOperationGetNumOperands(op) - 1);
  if (mlirOperationIsNull(fill) || mlirOperationGetNumOperands(fill) != 2 ||
      !mlirValueEqual(mlirOperationGetOperand(fill, 1), c))
    return (MlirOperation){NULL};
  MlirValue v = mlirOperationGetOperand(fill, 0);
  if (!mlirValueIsAOpResult(v) || !cg_op_is(mlirOpResultGetOwner(v), "arith.constant")) return (MlirOperation){NULL};
  MlirAttribute a = mlirOperationGetAttributeByName(mlirOpResultGetOwner(v), nova_str("value"));
  return mlirAttributeIsAFloat(a) && mlirFloatAttrGetValueDouble(a) == 0.0 && !signbit(mlirFloatAttrGetValueDouble(a))
             ? fill
             : (MlirOperation){NULL};
}

/* Each GEMM (gemm_operands) -> the tiled GEMM kernel (gemm_cuda.c, a
 * function whose body takes its place): tensor cores for 16-bit operands
 * and, with --matmul-precision=tf32, for f32 ones; SIMT tiles otherwise.
 * The kernels' table entries wait in G->gemm until map_function meets
 * their launches. */
/* ---- epilogues: the elementwise op after a GEMM, in its store ---------- */

/* Where buffer V lies, at most: its root buffer (a function argument, or
 * what a memref.view cuts) in *BASE, its first byte *OFF and size *SIZE (a
 * reshape, transpose, cast or subview of another buffer: that whole
 * buffer's); false when unknown (a dynamic offset, a reinterpret_cast,
 * another op). */
bool cu_extent(MlirValue v, MlirValue *base, int64_t *off, int64_t *size) {
  MlirType t = mlirValueGetType(v);
  if (!mlirTypeIsAMemRef(t) || !mlirShapedTypeHasStaticShape(t)) return false;
  *size = cg_type_bytes(t), *off = 0, *base = v;
  if (mlirValueIsABlockArgument(v)) return true;
  MlirOperation d = mlirOpResultGetOwner(v);
  if (cg_op_is(d, "memref.collapse_shape") || cg_op_is(d, "memref.expand_shape") || cg_op_is(d, "memref.subview") ||
      cg_op_is(d, "memref.transpose") || cg_op_is(d, "memref.cast"))
    return cu_extent(mlirOperationGetOperand(d, 0), base, off, size);
  if (!cg_op_is(d, "memref.view") || mlirOperationGetNumOperands(d) != 2) return false;
  MlirValue sh = mlirOperationGetOperand(d, 1);
  if (!mlirValueIsAOpResult(sh) || !cg_op_is(mlirOpResultGetOwner(sh), "arith.constant")) return false;
  MlirAttribute a = mlirOperationGetAttributeByName(mlirOpResultGetOwner(sh), nova_str("value"));
  if (!mlirAttributeIsAInteger(a)) return false;
  *base = mlirOperationGetOperand(d, 0), *off = mlirIntegerAttrGetValueInt(a);
  return true;
}

/* Whether buffers A and B may share bytes (unknown: yes). */
bool cu_may_overlap(MlirValue a, MlirValue b) {
  MlirValue ba, bb;
  int64_t oa, ob, sa, sb;
  if (!cu_extent(a, &ba, &oa, &sa) || !cu_extent(b, &bb, &ob, &sb)) return true;
  /* (two of the step's arguments are distinct buffers) */
  if (!mlirValueEqual(ba, bb)) return !(mlirValueIsABlockArgument(ba) && mlirValueIsABlockArgument(bb));
  return oa < ob + sb && ob < oa + sa;
}

/* The map attribute's results as loop numbers (each a dim); false if one is
 * not. */
static bool dims_of(MlirAttribute mattr, int *out, int *rank) {
  MlirAffineMap m = mlirAffineMapAttrGetValue(mattr);
  int r = (int)mlirAffineMapGetNumResults(m);
  if (r > 8) return false;
  for (int i = 0; i < r; i++) {
    MlirAffineExpr x = mlirAffineMapGetResult(m, i);
    if (!mlirAffineExprIsADim(x)) return false;
    out[i] = (int)mlirAffineDimExprGetPosition(x);
  }
  *rank = r;
  return true;
}

/* The elementwise linalg.generic E that a tensor-core GEMM OP (operands GO)
 * can apply as its epilogue: the next op that touches data (constants and
 * views may come between: they are moved before OP), reading
 * C's value with an identity map, its other inputs at projected
 * permutations, writing one output Y with an identity map over C's full
 * shape, Y either C or sharing no byte with A, B, C and E's inputs; E's
 * body plain ops (no regions) on its arguments, its loop indices
 * (linalg.index) and constants.  Fills
 * GO->epi and XV (the values of E's IN and Y operands, by argument);
 * null when there is none. */
static MlirOperation find_epilogue(MlirOperation op, cg_gemm_operands *go, MlirValue *xv) {
  memset(&go->epi, 0, sizeof go->epi);
  MlirOperation e = mlirOperationGetNextInBlock(op);
  while (!mlirOperationIsNull(e) && no_data_access(e)) e = mlirOperationGetNextInBlock(e);
  if (mlirOperationIsNull(e) || !cg_op_is(e, "linalg.generic") || mlirOperationGetNumResults(e) ||
      mlirOperationGetNumRegions(e) != 1)
    return (MlirOperation){NULL};
  int n = (int)mlirOperationGetNumOperands(e);
  /* one output (an optimizer's update writes several: not an epilogue) */
  MlirAttribute seg = mlirOperationGetAttributeByName(e, nova_str("operandSegmentSizes"));
  if (mlirAttributeIsNull(seg) || !mlirAttributeIsADenseI32Array(seg) || mlirDenseArrayGetNumElements(seg) != 2 ||
      mlirDenseI32ArrayGetElement(seg, 1) != 1)
    return (MlirOperation){NULL};
  MlirValue cv = mlirOperationGetOperand(op, mlirOperationGetNumOperands(op) - 1);
  MlirType cfull = go->views ? go->fc : go->c;
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(e);
  if (n < 2 || n > CG_EPI_MAX || mlirAttributeIsNull(maps) || mlirArrayAttrGetNumElements(maps) != n) return (MlirOperation){NULL};
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(e, 0));
  if (mlirBlockGetNumArguments(body) != n) return (MlirOperation){NULL};
  cg_gemm_epilogue *ep = &go->epi;
  int nl = (int)mlirAffineMapGetNumDims(mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, 0)));
  int64_t fst[8], foff;
  if (nl != mlirShapedTypeGetRank(cfull) || nl > 8 ||
      mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(cfull, fst, &foff)))
    return (MlirOperation){NULL};
  /* views: C's full buffer contiguous (its indices from an element's offset) */
  if (go->views) {
    int64_t want = 1;
    for (int k = nl - 1; k >= 0; k--) {
      if (fst[k] != want && mlirShapedTypeGetDimSize(cfull, k) != 1) return (MlirOperation){NULL};
      want *= mlirShapedTypeGetDimSize(cfull, k);
    }
  }
  bool reads_c = false;
  for (int i = 0; i < n; i++) {
    MlirValue v = mlirOperationGetOperand(e, i);
    MlirAttribute ma = mlirArrayAttrGetElement(maps, i);
    MlirType t = mlirValueGetType(v);
    ep->elem[i] = mlirValueGetType(mlirBlockGetArgument(body, i));
    ep->used[i] = !mlirOpOperandIsNull(mlirValueGetFirstUse(mlirBlockGetArgument(body, i)));
    if (!mlirTypeIsAMemRef(t) || !mlirShapedTypeHasStaticShape(t)) return (MlirOperation){NULL};
    if (mlirValueEqual(v, cv)) {
      if (!mlirAffineMapIsIdentity(mlirAffineMapAttrGetValue(ma))) return (MlirOperation){NULL};
      ep->role[i] = CG_EPI_C, reads_c = true;
      if (i == n - 1) ep->y_is_c = true;
      continue;
    }
    if (!dims_of(ma, ep->map[i], &ep->rank[i])) return (MlirOperation){NULL};
    if (i == n - 1) {
      if (!mlirAffineMapIsIdentity(mlirAffineMapAttrGetValue(ma)) || mlirShapedTypeGetRank(t) != nl)
        return (MlirOperation){NULL};
      for (int k = 0; k < nl; k++)
        if (mlirShapedTypeGetDimSize(t, k) != mlirShapedTypeGetDimSize(cfull, k)) return (MlirOperation){NULL};
    }
    ep->role[i] = i == n - 1 ? CG_EPI_Y : CG_EPI_IN;
    ep->type[i] = t;
    /* E's operands may not be written under it: Y shares no byte with A, B, C or an input; an input none with C */
    for (int j = 0; j < n; j++)
      if (j != i && (i == n - 1 || j == n - 1) && !mlirValueEqual(mlirOperationGetOperand(e, j), v) &&
          cu_may_overlap(v, mlirOperationGetOperand(e, j)))
        return (MlirOperation){NULL};
    if (cu_may_overlap(v, cv) ||
        (i == n - 1 && (cu_may_overlap(v, mlirOperationGetOperand(op, 0)) || cu_may_overlap(v, mlirOperationGetOperand(op, 1)))))
      return (MlirOperation){NULL};
    int a = ep->nargs++;
    ep->arg[i] = a, xv[a] = v;
  }
  if (!reads_c || !mlirTypeIsAF32(mlirShapedTypeGetElementType(mlirValueGetType(cv)))) return (MlirOperation){NULL};
  /* the body: plain ops on its arguments, its own results and constants */
  for (MlirOperation b = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(b); b = mlirOperationGetNextInBlock(b)) {
    if (mlirOperationGetNumRegions(b)) return (MlirOperation){NULL};
    for (intptr_t k = 0; k < mlirOperationGetNumOperands(b); k++) {
      MlirValue x = mlirOperationGetOperand(b, k);
      if (mlirValueIsABlockArgument(x) && mlirBlockEqual(mlirBlockArgumentGetOwner(x), body)) continue;
      if (mlirValueIsAOpResult(x) && mlirBlockEqual(mlirOperationGetBlock(mlirOpResultGetOwner(x)), body)) continue;
      if (mlirValueIsAOpResult(x) && cg_op_is(mlirOpResultGetOwner(x), "arith.constant")) continue;
      return (MlirOperation){NULL};
    }
  }
  /* C is stored too unless E writes it in place or nothing reads it after E
   * (a buffer of the arena that only the fill, the product and E touch) */
  ep->store_c = !ep->y_is_c;
  if (ep->store_c && mlirValueIsAOpResult(cv) && cg_op_is(mlirOpResultGetOwner(cv), "memref.view")) {
    bool other = false;
    for (MlirOpOperand u = mlirValueGetFirstUse(cv); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u)) {
      MlirOperation w = mlirOpOperandGetOwner(u);
      other |= !(mlirOperationEqual(w, op) || mlirOperationEqual(w, e) || cg_op_is(w, "linalg.fill"));
    }
    ep->store_c = other;
  }
  /* the constants and views between OP and E (E's operands, the constants
   * its body reads): before OP, where the kernel reads them */
  for (MlirOperation b = mlirOperationGetNextInBlock(op); !mlirOperationEqual(b, e);) {
    MlirOperation next = mlirOperationGetNextInBlock(b);
    mlirOperationMoveBefore(b, op);
    b = next;
  }
  ep->n = n, ep->nloops = nl;
  return e;
}

/* Replaces each cast marked nova.epilogue under ROOT (the GEMM kernel's
 * text, parsed) by a copy of E's body on the cast's operands (E's block
 * arguments, then its loop indices, for linalg.index). */
typedef struct epi_calls {
  MlirOperation v[512];
  int n;
  bool full;
} epi_calls;

static MlirWalkResult find_epi_call(MlirOperation op, void *ud) {
  epi_calls *c = ud;
  if (!cg_op_is(op, "builtin.unrealized_conversion_cast") ||
      mlirAttributeIsNull(mlirOperationGetAttributeByName(op, nova_str("nova.epilogue"))))
    return MlirWalkResultAdvance;
  if (c->n == (int)(sizeof c->v / sizeof c->v[0])) c->full = true;
  else c->v[c->n++] = op;
  return MlirWalkResultAdvance;
}

static int inline_epilogue(MlirOperation root, MlirOperation e) {
  epi_calls *calls = nv_xmalloc(sizeof *calls);
  if (!calls) return -1;
  calls->n = 0, calls->full = false;
  mlirOperationWalk(root, find_epi_call, calls, MlirWalkPreOrder);
  MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(e, 0));
  int rc = calls->full ? -1 : 0;
  /* the value map: E's arguments and every result of its body */
  intptr_t cap = mlirBlockGetNumArguments(body);
  for (MlirOperation b = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(b); b = mlirOperationGetNextInBlock(b))
    cap += mlirOperationGetNumResults(b);
  MlirValue *from = nv_xmalloc((size_t)cap * sizeof *from), *to = nv_xmalloc((size_t)cap * sizeof *to);
  if (!from || !to) rc = -1;
  for (int ci = 0; !rc && ci < calls->n; ci++) {
    MlirOperation call = calls->v[ci];
    intptr_t nm = 0;
    for (intptr_t i = 0; i < mlirBlockGetNumArguments(body); i++)
      from[nm] = mlirBlockGetArgument(body, i), to[nm++] = mlirOperationGetOperand(call, i);
    for (MlirOperation b = mlirBlockGetFirstOperation(body); !rc && !mlirOperationIsNull(b);
         b = mlirOperationGetNextInBlock(b)) {
      bool yield = cg_op_is(b, "linalg.yield");
      if (cg_op_is(b, "linalg.index")) { /* loop index DIM: the cast's operand after the arguments */
        MlirAttribute d = mlirOperationGetAttributeByName(b, nova_str("dim"));
        intptr_t at = mlirBlockGetNumArguments(body) + (mlirAttributeIsAInteger(d) ? mlirIntegerAttrGetValueInt(d) : 0);
        if (!mlirAttributeIsAInteger(d) || at >= mlirOperationGetNumOperands(call)) {
          rc = -1;
          break;
        }
        from[nm] = mlirOperationGetResult(b, 0), to[nm++] = mlirOperationGetOperand(call, at);
        continue;
      }
      MlirOperation cl = yield ? b : mlirOperationClone(b);
      MlirValue res = {NULL};
      for (intptr_t k = 0; k < mlirOperationGetNumOperands(cl); k++) {
        MlirValue x = mlirOperationGetOperand(cl, k);
        for (intptr_t j = 0; j < nm; j++)
          if (mlirValueEqual(x, from[j])) {
            if (yield) res = to[j];
            else mlirOperationSetOperand(cl, k, to[j]);
            break;
          }
        if (yield && mlirValueIsNull(res)) res = x; /* a constant or an argument */
      }
      if (yield) {
        mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(call, 0), res);
        break;
      }
      mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(call), call, cl);
      for (intptr_t k = 0; k < mlirOperationGetNumResults(b); k++)
        from[nm] = mlirOperationGetResult(b, k), to[nm++] = mlirOperationGetResult(cl, k);
    }
    if (rc) break; /* (the caller drops the whole kernel text) */
    mlirOperationDestroy(call);
  }
  free(from);
  free(to);
  free(calls);
  return rc;
}

/* A GEMM's plan: its product and the kernel's schedule. */
typedef struct gemm_plan {
  int64_t M, N, K, nb;     /* nb: batch points */
  bool bf16, f16, h16;
  int eb;                  /* C's element bytes */
  const char *tc_kind;     /* "bf16", "f16", "tf32" or NULL (SIMT) */
  cfg_gemm_schedule tc;    /* .ok: on the tensor cores */
  const char *stage_lim, *split_lim;
  int64_t work;            /* split-K: workspace elements, nb * split * M * N */
} gemm_plan;

/* The tensor-core schedule of GO (-1 and an error where --gemm-tile gives
 * a tile that does not fit): the configurator's tile cut to what the
 * generator emits, or --gemm-tile's; the pipeline's depth; split-K where
 * the output tiles leave most of a wave idle. */
static int plan_gemm(gpu_ctx *G, const cg_gemm_operands *go, gemm_plan *pl) {
  memset(pl, 0, sizeof *pl);
  MlirType ot = mlirShapedTypeGetElementType(go->a);
  pl->bf16 = mlirTypeIsABF16(ot), pl->f16 = mlirTypeIsAF16(ot), pl->h16 = pl->bf16 || pl->f16;
  int64_t M = mlirShapedTypeGetDimSize(go->a, go->ta ? 1 : 0), K = mlirShapedTypeGetDimSize(go->a, go->ta ? 0 : 1);
  int64_t N = mlirShapedTypeGetDimSize(go->b, go->tb ? 0 : 1);
  pl->M = M, pl->N = N, pl->K = K, pl->nb = 1;
  for (int r = 0; r < go->nbatch; r++) pl->nb *= go->bsize[r];
  pl->eb = mlirTypeIsAF64(mlirShapedTypeGetElementType(go->c)) ? 8 : 4;
  bool h16 = pl->h16;
  /* (m16n8k16 with 16-bit operands is sm_80's; sm_75's f16 mma is m16n8k8, not generated) */
  bool sm80 = G->dev->cc_major >= 8;
  const char *tc_kind = pl->bf16 && sm80 && G->dev->has_mma_sync_bf16 ? "bf16"
                        : pl->f16 && sm80 && G->dev->has_mma_sync_f16 ? "f16"
                        : G->tf32 && pl->eb == 4 && !h16 ? "tf32"
                                                         : NULL;
  pl->tc_kind = tc_kind;
  cfg_gemm_schedule tc = {0};
  if (tc_kind && G->gemm_tile[0]) {
    tc = cfg_gemm(G->dev, M, N, K, h16 ? 2 : 4, true);
    if (tc.ok && forced_tile(G, &tc, h16, go->ta, go->tb, tc_kind)) return -1;
  } else if (tc_kind) {
    tc = cfg_gemm(G->dev, M, N, K, h16 ? 2 : 4, true);
    /* the generator keeps warp tiles at most 64x32 (64 accumulators a
     * thread; larger ones spill in the code it emits), using more warps,
     * and blocks at most 8 warps (a thread then has up to 255 registers),
     * shrinking the block tile */
    while (tc.ok && tc.warp_tile_m * tc.warp_tile_n > 2048) {
      if (tc.warp_tile_m >= tc.warp_tile_n && tc.warp_tile_m >= 32) tc.warp_tile_m /= 2, tc.wm *= 2;
      else tc.warp_tile_n /= 2, tc.wn *= 2;
    }
    while (tc.ok && tc.wm * tc.wn > 8) {
      if (tc.wm >= tc.wn) tc.wm /= 2, tc.bm /= 2;
      else tc.wn /= 2, tc.bn /= 2;
    }
    tc.warps = tc.wm * tc.wn;
    tc.threads = 32 * tc.warps;
    int kstep = h16 ? 16 : 8;
    tc.stages = 0;
    tc.ok = tc.ok && tc.mma == (h16 ? CFG_MMA_M16N8K16 : CFG_MMA_M16N8K8) && tc.warp_tile_m % 16 == 0 &&
            tc.warp_tile_n % 8 == 0 && tc.bk % kstep == 0 && tc.bm == tc.wm * tc.warp_tile_m &&
            tc.bn == tc.wn * tc.warp_tile_n && tc.threads <= G->dev->max_threads_per_block &&
            tc.warp_tile_m <= 256 && tc.warp_tile_n <= 256 && (tc.warp_tile_m / 16) * (tc.warp_tile_n / 8) <= 256 &&
            cg_gemm_tc_smem(&tc, h16, go->ta, go->tb) <= G->dev->smem_per_block_optin;
  }
  /* the pipeline's depth, unless --gemm-tile gave it */
  pl->stage_lim = "given";
  int64_t k_tiles = tc.ok ? (K + tc.bk - 1) / tc.bk : 0;
  if (tc.ok && !tc.stages)
    tc.stages = cfg_gemm_stages(G->dev, cg_gemm_tc_stage_bytes(&tc, h16, go->ta, go->tb), tc.threads, tc_regs(&tc),
                                k_tiles, &pl->stage_lim);
  /* split-K: the K tiles cut into ranges whose partial products a second
   * kernel sums (fixed order: deterministic) */
  tc.split_k = 1, tc.k_tiles_per_split = k_tiles;
  if (tc.ok) {
    int bps = cfg_occupancy(G->dev, tc.threads, cg_gemm_tc_smem(&tc, h16, go->ta, go->tb), tc_regs(&tc), 1, NULL,
                            NULL);
    int64_t tiles = ((M + tc.bm - 1) / tc.bm) * ((N + tc.bn - 1) / tc.bn) * pl->nb;
    int sp = cfg_gemm_split(G->dev, tiles, bps, k_tiles, tc.stages, &pl->split_lim);
    if (sp > 1) {
      tc.k_tiles_per_split = (k_tiles + sp - 1) / sp;
      tc.split_k = (int)((k_tiles + tc.k_tiles_per_split - 1) / tc.k_tiles_per_split);
      pl->work = pl->nb * tc.split_k * M * N;
    }
  }
  pl->tc = tc;
  return 0;
}

static int matmuls_to_gemm(gpu_ctx *G, MlirOperation f) {
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
  /* split-K's workspace: one buffer for every GEMM (they run one after
   * the other), freed at the end of the step */
  int64_t work = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    cg_gemm_operands go;
    gemm_plan pl;
    if (!gemm_operands(G->ctx, op, &go)) continue;
    if (plan_gemm(G, &go, &pl)) return -1;
    if (pl.work > work) work = pl.work;
  }
  MlirValue wbuf = {NULL};
  if (work) {
    MlirType wt = mlirMemRefTypeContiguousGet(mlirF32TypeGet(G->ctx), 1, &work, mlirAttributeGetNull());
    MlirLocation loc = mlirOperationGetLocation(f);
    MlirOperation first = mlirBlockGetFirstOperation(fb);
    int32_t seg[2] = {0, 0};
    MlirNamedAttribute na = cu_named(G->ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(G->ctx, 2, seg));
    MlirOperationState st = mlirOperationStateGet(nova_str("memref.alloc"), loc);
    mlirOperationStateAddResults(&st, 1, &wt);
    mlirOperationStateAddAttributes(&st, 1, &na);
    MlirOperation al = mlirOperationCreate(&st);
    mlirBlockInsertOwnedOperationBefore(fb, first, al);
    wbuf = mlirOperationGetResult(al, 0);
    MlirOperationState ds = mlirOperationStateGet(nova_str("memref.dealloc"), loc);
    mlirOperationStateAddOperands(&ds, 1, &wbuf);
    mlirBlockInsertOwnedOperationBefore(fb, mlirBlockGetTerminator(fb), mlirOperationCreate(&ds));
  }
  MlirOperation last_fill = {NULL}; /* the last linalg.fill, while only no_data_access ops follow it */
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationIsNull(op);) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    cg_gemm_operands go;
    if (!gemm_operands(G->ctx, op, &go)) {
      if (cg_op_is(op, "linalg.fill")) last_fill = op;
      else if (!no_data_access(op)) last_fill = (MlirOperation){NULL};
      op = next;
      continue;
    }
    gemm_plan pl;
    if (plan_gemm(G, &go, &pl)) return -1;
    go.work_elems = work;
    int64_t M = pl.M, N = pl.N, K = pl.K;
    int eb = pl.eb;
    bool bf16 = pl.bf16, f16 = pl.f16, h16 = pl.h16;
    const char *tc_kind = pl.tc_kind, *stage_lim = pl.stage_lim;
    cfg_gemm_schedule tc = pl.tc;
    cfg_gemm_simt_schedule s = cfg_gemm_simt(G->dev, M, N, K, eb);
    int split = tc.ok ? tc.split_k : 1;
    cg_kernel *gk = nv_xrealloc(G->gemm, (size_t)(G->ngemm + 2) * sizeof *gk);
    if (!s.ok || !gk) {
      nv_error_plain(G->c->diag, "cannot configure the %lldx%lldx%lld GEMM: %s", (long long)M, (long long)N,
                     (long long)K, s.ok ? "out of memory" : s.reason);
      return -1;
    }
    G->gemm = gk;
    MlirOperation fill = zero_fill_of_c(op, last_fill);
    last_fill = (MlirOperation){NULL};
    go.overwrite = !mlirOperationIsNull(fill);
    if (go.overwrite) mlirOperationDestroy(fill);
    cg_kernel *k = &G->gemm[G->ngemm];
    memset(k, 0, sizeof *k);
    cu_describe_loc(mlirOperationGetLocation(op), k);
    snprintf(k->op, sizeof k->op, "matmul");
    k->gemm = true, k->tensor_core = tc.ok;
    k->gemm_mnk[0] = M, k->gemm_mnk[1] = N, k->gemm_mnk[2] = K, k->gemm_ta = go.ta, k->gemm_tb = go.tb;
    k->gemm_overwrite = go.overwrite;
    snprintf(k->gemm_dtype, sizeof k->gemm_dtype, "%s", bf16 ? "bf16" : f16 ? "f16" : eb == 8 ? "f64" : "f32");
    k->grid_z = 1;
    for (int r = 0; r < go.nbatch; r++) k->dims[k->rank++] = go.bsize[r], k->grid_z *= go.bsize[r];
    k->dims[k->rank++] = M;
    k->dims[k->rank++] = N;
    k->n = M * N * k->grid_z;
    char fname[48];
    snprintf(fname, sizeof fname, "nova_gemm_%d", G->ngemm++);
    char *text;
    MlirValue xv[CG_EPI_MAX];
    MlirOperation epi = {NULL};
    memset(&go.epi, 0, sizeof go.epi);
    if (tc.ok) {
      epi = find_epilogue(op, &go, xv);
      /* (the staged C tile must fit the block's shared memory too) */
      if (!mlirOperationIsNull(epi) && split == 1 &&
          cg_gemm_tc_dyn_smem(&tc, h16, go.ta, go.tb, true) > G->dev->smem_per_block_optin)
        epi = (MlirOperation){NULL};
      if (mlirOperationIsNull(epi)) memset(&go.epi, 0, sizeof go.epi);
      k->grid = (N + tc.bn - 1) / tc.bn;
      k->grid_y = (M + tc.bm - 1) / tc.bm;
      k->grid_z *= split;
      k->block = tc.threads;
      k->gemm_split = split;
      int tt[6] = {tc.bm, tc.bn, tc.bk, tc.warp_tile_m, tc.warp_tile_n, tc.stages};
      memcpy(k->gemm_tile, tt, sizeof tt);
      char sk[96] = "";
      if (split > 1)
        snprintf(sk, sizeof sk, ", split-K: %d ranges of %lld k tiles (%s)", split, (long long)tc.k_tiles_per_split,
                 pl.split_lim);
      snprintf(k->reason, sizeof k->reason, "%s %s, tile %dx%dx%d, %dx%d warps of %dx%d, %d stage%s (%s)%s%s",
               h16 ? "mma.sync.m16n8k16" : "mma.sync.m16n8k8", tc_kind, tc.bm, tc.bn, tc.bk, tc.wm, tc.wn,
               tc.warp_tile_m, tc.warp_tile_n, tc.stages, tc.stages == 1 ? "" : "s", stage_lim, sk,
               G->gemm_tile[0] ? " (--gemm-tile)" : "");
      const char *lim = "";
      double waves = 0;
      int bps = cfg_occupancy(G->dev, tc.threads, cg_gemm_tc_smem(&tc, h16, go.ta, go.tb), tc_regs(&tc),
                              k->grid * k->grid_y * k->grid_z, &lim, &waves);
      snprintf(k->reason + strlen(k->reason), sizeof k->reason - strlen(k->reason), "; %d blocks/SM (%s), %.2f waves%s%s",
               bps, lim, waves, go.overwrite ? "; C written, its zero fill folded in" : "",
               !mlirOperationIsNull(epi) ? "; the elementwise op after it applied in its store" : "");
      k->gemm_epilogue = !mlirOperationIsNull(epi);
      k->dyn_smem = cg_gemm_tc_dyn_smem(&tc, h16, go.ta, go.tb, !mlirOperationIsNull(epi) && split == 1);
      if (split > 1) { /* the second kernel: C (+)= the sum of the partial products */
        cg_kernel *k2 = &G->gemm[G->ngemm++];
        memset(k2, 0, sizeof *k2);
        cu_describe_loc(mlirOperationGetLocation(op), k2);
        snprintf(k2->op, sizeof k2->op, "matmul");
        k2->grid = (M * N + 255) / 256, k2->grid_y = 1, k2->grid_z = pl.nb, k2->block = 256;
        for (int r = 0; r < go.nbatch; r++) k2->dims[k2->rank++] = go.bsize[r];
        k2->dims[k2->rank++] = M;
        k2->dims[k2->rank++] = N;
        k2->n = M * N * pl.nb;
        const char *lim2 = "";
        double waves2 = 0;
        int bps2 = cfg_occupancy(G->dev, 256, 0, 32, k2->grid * k2->grid_z, &lim2, &waves2);
        snprintf(k2->reason, sizeof k2->reason, "split-K: C %s the sum of the %d partial products, in order; one "
                 "thread an element, 256 a block: %d blocks/SM (%s), %.2f waves", go.overwrite ? "=" : "+=", split,
                 bps2, lim2, waves2);
      }
      text = cg_gemm_tc_text(fname, &go, &tc, G->sim);
    } else {
      k->grid = (N + s.bn - 1) / s.bn;
      k->grid_y = (M + s.bm - 1) / s.bm;
      k->block = s.threads;
      int tt[5] = {s.bm, s.bn, s.bk, s.tm, s.tn};
      memcpy(k->gemm_tile, tt, sizeof tt);
      snprintf(k->reason, sizeof k->reason, "%.140s%s%s%s", s.reason, tc_kind ? " (no usable " : "",
               tc_kind ? tc_kind : "", tc_kind ? " schedule)" : "");
      text = cg_gemm_text(fname, &go, &s, G->sim);
    }
    MlirOperation fn = text ? mlirOperationCreateParse(G->ctx, nova_str(text), nova_str(fname)) : (MlirOperation){NULL};
    free(text);
    if (mlirOperationIsNull(fn)) {
      nv_error_plain(G->c->diag, "internal: the GEMM kernel text for %lldx%lldx%lld does not parse", (long long)M,
                     (long long)N, (long long)K);
      return -1;
    }
    /* the function's body replaces the matmul, its arguments the matmul's
     * operands (no inliner: nvgpu ops have no inlining interface) */
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
    if (!mlirOperationIsNull(epi) && inline_epilogue(fn, epi)) {
      nv_error_plain(G->c->diag, "internal: cannot apply the epilogue of the %lldx%lldx%lld GEMM", (long long)M,
                     (long long)N, (long long)K);
      mlirOperationDestroy(fn);
      return -1;
    }
    for (int i = 0; i < 3; i++)
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, i), mlirOperationGetOperand(op, i));
    if (split > 1) mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, 3), wbuf);
    for (int j = 0; j < go.epi.nargs; j++)
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(body, 3 + (split > 1) + j), xv[j]);
    cu_move_body(body, op);
    mlirOperationDestroy(fn);
    if (!mlirOperationIsNull(epi)) {
      next = mlirOperationGetNextInBlock(epi);
      mlirOperationDestroy(epi);
    }
    mlirOperationDestroy(op);
    op = next;
  }
  return 0;
}

/* Wraps each top-level linalg op's location in a name location
 * "linalg.OP", which the loops made from it keep (for the kernel table). */
static void tag_linalg_ops(gpu_ctx *G, MlirOperation f) {
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
    if (s.length < 7 || memcmp(s.data, "linalg.", 7)) continue;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)s.length, s.data);
    mlirOperationSetLocation(op, mlirLocationNameGet(G->ctx, nova_str(name), mlirOperationGetLocation(op)));
  }
}

/* --gpu-sim: each gpu.launch (grid G x 1 x 1, block B x 1 x 1, as
 * make_launch builds them) becomes scf.parallel (%b, %t) = (0, 0) to (G, B)
 * running the same body on the CPU, so the mapping's numerics can be
 * checked where there is no GPU. */
static void launch_to_loops(gpu_ctx *G, MlirOperation f) {
  MlirContext ctx = G->ctx;
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
  for (MlirOperation l = mlirBlockGetFirstOperation(fb); !mlirOperationIsNull(l);) {
    MlirOperation next = mlirOperationGetNextInBlock(l);
    if (!cg_op_is(l, "gpu.launch")) {
      l = next;
      continue;
    }
    MlirLocation loc = mlirOperationGetLocation(l);
    MlirBlock lb = mlirRegionGetFirstBlock(mlirOperationGetRegion(l, 0));
    MlirValue zero = cu_index_const(ctx, fb, l, loc, 0), one = cu_index_const(ctx, fb, l, loc, 1);
    MlirValue ops[6] = {zero, zero, mlirOperationGetOperand(l, 0), mlirOperationGetOperand(l, 3), one, one};
    MlirType it = mlirIndexTypeGet(ctx);
    MlirType at[2] = {it, it};
    MlirLocation al[2] = {loc, loc};
    MlirRegion region = mlirRegionCreate();
    MlirBlock body = mlirBlockCreate(2, at, al);
    mlirRegionAppendOwnedBlock(region, body);
    int32_t seg[4] = {2, 2, 2, 0};
    MlirNamedAttribute na = cu_named(ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(ctx, 4, seg));
    MlirOperationState st = mlirOperationStateGet(nova_str("scf.parallel"), loc);
    mlirOperationStateAddOperands(&st, 6, ops);
    mlirOperationStateAddAttributes(&st, 1, &na);
    mlirOperationStateAddOwnedRegions(&st, 1, &region);
    mlirBlockInsertOwnedOperationBefore(fb, l, mlirOperationCreate(&st));
    MlirOperation red = cu_mk(body, (MlirOperation){NULL}, "scf.reduce", loc, 0, NULL, 0, NULL, 0, NULL);
    /* block ids, thread ids, grid and block sizes: x from the loop, the rest 0 or 1 */
    for (int i = 0; i < 12; i++) {
      MlirValue v = i == 0 ? mlirBlockGetArgument(body, 0) : i == 3 ? mlirBlockGetArgument(body, 1)
                    : i == 6 ? mlirOperationGetOperand(l, 0) : i == 9 ? mlirOperationGetOperand(l, 3)
                    : i < 6 ? zero : one;
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(lb, i), v);
    }
    cu_move_body(lb, red);
    mlirOperationDestroy(l);
    l = next;
  }
}

static MlirOperation entry_function(MlirModule m) {
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    if (cg_op_is(f, "func.func") && !mlirRegionIsNull(mlirOperationGetRegion(f, 0)) &&
        !mlirBlockIsNull(mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0))))
      return f;
  return (MlirOperation){NULL};
}

/* The outlined kernels, one gpu.module each, become functions of the first
 * module, renamed nova_kI in launch order (globals cloned into several
 * modules are kept once). */
/* Every shared-memory buffer of kernel F 16-byte aligned (llvm.align of
 * its workgroup attributions; the lowering's default is the element's):
 * the GEMMs' cp.async, ldmatrix and vector accesses move 16 bytes at a
 * time. */
static void align_workgroup(MlirContext ctx, MlirOperation f) {
  MlirAttribute n = mlirOperationGetAttributeByName(f, nova_str("workgroup_attributions"));
  int64_t nw = mlirAttributeIsNull(n) || !mlirAttributeIsAInteger(n) ? 0 : mlirIntegerAttrGetValueInt(n);
  if (nw < 1 || nw > 64) return;
  MlirAttribute d[64];
  MlirNamedAttribute al = mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("llvm.align")),
                                                mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 16));
  for (int64_t i = 0; i < nw; i++) d[i] = mlirDictionaryAttrGet(ctx, 1, &al);
  mlirOperationSetAttributeByName(f, nova_str("workgroup_attrib_attrs"), mlirArrayAttrGet(ctx, nw, d));
}

static int merge_modules(gpu_ctx *G, MlirModule m, MlirOperation f) {
  MlirOperation first = {NULL};
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
  int ki = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (!cg_op_is(op, "gpu.launch_func")) continue;
    MlirAttribute kref = mlirOperationGetAttributeByName(op, nova_str("kernel"));
    if (mlirAttributeIsNull(kref) || ki >= G->out->nk) return -1;
    MlirStringRef modname = mlirSymbolRefAttrGetRootReference(kref);
    MlirStringRef fname = mlirSymbolRefAttrGetLeafReference(kref);
    MlirOperation mod = {NULL};
    for (MlirOperation x = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(x);
         x = mlirOperationGetNextInBlock(x)) {
      MlirAttribute sn = mlirOperationGetAttributeByName(x, nova_str("sym_name"));
      if (cg_op_is(x, "gpu.module") && !mlirAttributeIsNull(sn) &&
          mlirStringRefEqual(mlirStringAttrGetValue(sn), modname)) {
        mod = x;
        break;
      }
    }
    if (mlirOperationIsNull(mod)) return -1;
    if (mlirOperationIsNull(first)) first = mod;
    MlirBlock mb = mlirRegionGetFirstBlock(mlirOperationGetRegion(mod, 0));
    MlirBlock firstb = mlirRegionGetFirstBlock(mlirOperationGetRegion(first, 0));
    const char *kname = G->out->k[ki++].name;
    for (MlirOperation x = mlirBlockGetFirstOperation(mb); !mlirOperationIsNull(x);) {
      MlirOperation next = mlirOperationGetNextInBlock(x);
      MlirAttribute sn = mlirOperationGetAttributeByName(x, nova_str("sym_name"));
      if (cg_op_is(x, "gpu.func") && mlirStringRefEqual(mlirStringAttrGetValue(sn), fname)) {
        mlirOperationSetAttributeByName(x, nova_str("sym_name"), mlirStringAttrGet(G->ctx, nova_str(kname)));
        align_workgroup(G->ctx, x);
        if (!mlirOperationEqual(mod, first)) {
          mlirOperationRemoveFromParent(x);
          mlirBlockAppendOwnedOperation(firstb, x);
        }
      } else if (!mlirOperationEqual(mod, first) && !mlirAttributeIsNull(sn)) {
        /* a global: keep the first module's copy */
        bool have = false;
        for (MlirOperation y = mlirBlockGetFirstOperation(firstb); !have && !mlirOperationIsNull(y);
             y = mlirOperationGetNextInBlock(y)) {
          MlirAttribute yn = mlirOperationGetAttributeByName(y, nova_str("sym_name"));
          have = !mlirAttributeIsNull(yn) && mlirStringRefEqual(mlirStringAttrGetValue(yn), mlirStringAttrGetValue(sn));
        }
        if (!have) {
          mlirOperationRemoveFromParent(x);
          mlirBlockAppendOwnedOperation(firstb, x);
        }
      }
      x = next;
    }
    MlirAttribute leaf = mlirFlatSymbolRefAttrGet(G->ctx, nova_str(kname));
    MlirAttribute fsn = mlirOperationGetAttributeByName(first, nova_str("sym_name"));
    mlirOperationSetAttributeByName(op, nova_str("kernel"),
                                    mlirSymbolRefAttrGet(G->ctx, mlirStringAttrGetValue(fsn), 1, &leaf));
    if (!mlirOperationEqual(mod, first)) mlirOperationDestroy(mod);
  }
  if (!mlirOperationIsNull(first))
    mlirOperationSetAttributeByName(first, nova_str("sym_name"), mlirStringAttrGet(G->ctx, nova_str("nova_kernels")));
  /* the launches refer to the module by name: update them */
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (!cg_op_is(op, "gpu.launch_func")) continue;
    MlirAttribute kref = mlirOperationGetAttributeByName(op, nova_str("kernel"));
    MlirAttribute leaf = mlirFlatSymbolRefAttrGet(G->ctx, mlirSymbolRefAttrGetLeafReference(kref));
    mlirOperationSetAttributeByName(op, nova_str("kernel"),
                                    mlirSymbolRefAttrGet(G->ctx, nova_str("nova_kernels"), 1, &leaf));
  }
  return ki == G->out->nk ? 0 : -1;
}

/* The PTX of the (single) gpu.binary. */
static int take_ptx(gpu_ctx *G, MlirModule m) {
  for (MlirOperation x = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(x);
       x = mlirOperationGetNextInBlock(x)) {
    if (!cg_op_is(x, "gpu.binary")) continue;
    MlirAttribute objs = mlirOperationGetAttributeByName(x, nova_str("objects"));
    if (mlirAttributeIsNull(objs) || !mlirAttributeIsAArray(objs) || mlirArrayAttrGetNumElements(objs) != 1) break;
    MlirAttribute o = mlirArrayAttrGetElement(objs, 0);
    if (!mlirAttributeIsAGPUObjectAttr(o)) break;
    MlirStringRef s = mlirGPUObjectAttrGetObject(o);
    G->out->ptx = nv_xmalloc(s.length + 1);
    if (!G->out->ptx) return -1;
    memcpy(G->out->ptx, s.data, s.length);
    G->out->ptx[s.length] = 0;
    G->out->ptx_len = s.length;
    return 0;
  }
  if (G->out->nk == 0) { /* a step without any kernel (only copies of inputs): empty PTX */
    G->out->ptx = nv_xstrdup("");
    return G->out->ptx ? 0 : -1;
  }
  nv_error_plain(G->c->diag, "internal: the GPU lowering produced no PTX");
  return -1;
}

int cg_gpu_init(nova_ctx *c, const cfg_device *dev, const cg_gpu_options *o, cg_gpu *out) {
  memset(out, 0, sizeof *out);
  out->plan.memory_limit = o->memory_limit;
  if (dev->cc_major < 5) {
    nv_error_plain(c->diag, "--target=cuda: device '%s' has no compute capability", dev->name);
    return -1;
  }
  snprintf(out->chip, sizeof out->chip, "sm_%d%d", dev->cc_major, dev->cc_minor);
  if (o->block && (o->block % 32 || o->block > dev->max_threads_per_block)) {
    nv_error_plain(c->diag, "--gpu-block=%d: a block is a multiple of 32 threads, at most %d on %s", o->block,
                   dev->max_threads_per_block, dev->name);
    return -1;
  }
  if (o->tf32 && !dev->has_mma_sync_tf32) {
    nv_error_plain(c->diag, "--matmul-precision=tf32: %s (sm_%d%d) has no tf32 tensor cores (sm_80 and newer have)",
                   dev->name, dev->cc_major, dev->cc_minor);
    return -1;
  }
  return 0;
}

static gpu_ctx gpu_context(nova_ctx *c, const cfg_device *dev, const cg_gpu_options *o, cg_gpu *out) {
  return (gpu_ctx){c, c->ctx, dev, out, o->sim, NULL, 0, 0, o->block, o->tf32, 0, o->gemm_tile};
}

int cg_gpu_kernels(nova_ctx *c, MlirModule m, const cfg_device *dev, const cg_gpu_options *o, cg_gpu *out) {
  gpu_ctx G = gpu_context(c, dev, o, out);
  out->scratch_bytes = out->plan.planned ? (out->plan.arena_bytes + CG_GPU_ALIGN - 1) / CG_GPU_ALIGN * CG_GPU_ALIGN : 0;
  MlirOperation f = entry_function(m);
  if (mlirOperationIsNull(f)) {
    nv_error_plain(c->diag, "internal: no entry function to compile for the GPU");
    return -1;
  }
  if (copies_to_linalg(&G, m)) return -1;
  int rc = matmuls_to_gemm(&G, f);
  if (rc) {
    free(G.gemm);
    return -1;
  }
  f = entry_function(m);
  tag_linalg_ops(&G, f);
  if (cg_run_pipeline(c, m, "builtin.module(func.func(convert-linalg-to-parallel-loops,canonicalize))",
                      "lowering linalg to loops")) {
    free(G.gemm);
    return -1;
  }
  f = entry_function(m);
  map_function(&G, f);
  free(G.gemm);
  return G.failed ? -1 : 0;
}

int cg_gpu_sim_llvm(nova_ctx *c, MlirModule m, const cfg_device *dev, const cg_gpu_options *o, cg_gpu *out) {
  gpu_ctx G = gpu_context(c, dev, o, out);
  launch_to_loops(&G, entry_function(m));
  if (nova_verify(c, m, "turning kernels into CPU loops (--gpu-sim)")) return -1;
  return cg_lower_loops_to_llvm(c, m, &out->plan.parallel_loops);
}

int cg_gpu_nvvm(nova_ctx *c, MlirModule m, const cfg_device *dev, const cg_gpu_options *o, cg_gpu *out) {
  gpu_ctx G = gpu_context(c, dev, o, out);
  if (cg_run_pipeline(c, m, "builtin.module(gpu-kernel-outlining)", "kernel outlining")) return -1;
  if (merge_modules(&G, m, entry_function(m))) {
    nv_error_plain(c->diag, "internal: outlined kernels do not match the launches");
    return -1;
  }
  if (nova_verify(c, m, "merging GPU modules")) return -1;
  if (getenv("NOVAC_DEBUG_GPU_IR")) nova_print_op(mlirModuleGetOperation(m), stderr);
  nv_sbuf p = {0};
  /* PTX ISA 8.1 (CUDA 12.1 drivers): a kernel takes up to 32,764 bytes of
   * parameters, not 4,352 (the fused non-finite check of the 144M-parameter
   * GPT reads a scalar of every parameter: 9,728 bytes) */
  nv_sb_printf(&p,
               "builtin.module(func.func(convert-scf-to-cf),gpu-lower-to-nvvm-pipeline{cubin-chip=%s "
               "cubin-features=+ptx81 cubin-format=isa opt-level=%d})",
               out->chip, o->opt_level > 3 ? 3 : o->opt_level < 0 ? 0 : o->opt_level);
  int rc = p.oom ? -1 : cg_run_pipeline(c, m, p.s, "lowering to NVVM and PTX");
  nv_sb_free(&p);
  if (rc) return -1;
  return take_ptx(&G, m);
}

void cg_gpu_free(cg_gpu *g) {
  cg_plan_free(&g->plan);
  free(g->k);
  free(g->ptx);
  memset(g, 0, sizeof *g);
}
