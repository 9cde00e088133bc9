/* gpu_rows.c: row kernels for the cuda target.
 *
 * A run of top-level loop nests over the same rows (softmax's maxima, its
 * exponentials and sums, its normalization; layer norm's two moments and
 * its output; a cross-entropy's log-sum-exp; their backwards), each one of
 *   R  a reduction along the row: scf.parallel over the rows holding one
 *      scf.for over the K elements of a row, whose accumulators (a store
 *      at indices that do not use the element's index, of a recognized
 *      combiner of a load of the same element) are 32-bit;
 *   E  an elementwise op over rows x K (the last loop the row's elements);
 *   S  an op once per row (an accumulator's initial fill),
 * with at least one R, becomes one kernel: a group of TPR lanes per row
 * (cfg_row: a warp at most), lane l taking the row's elements l, l + TPR,
 * ... (consecutive lanes, consecutive addresses).  An R's lanes accumulate
 * privately from the combiner's neutral element, combine by butterfly
 * shuffles (offsets TPR/2 .. 1: every lane ends with the same value), and
 * lane 0 combines the result with the accumulator's initial value; an S
 * runs on lane 0; a block barrier separates the ops (the next reads what
 * the last wrote).  A nest joins the run only where every buffer it shares
 * with an earlier member (one of the two writing it) is addressed by both
 * as the row's elements or as the row's own value, from the same first
 * byte: then a row's data is read and written only by its own lanes.
 *
 * The --gpu-sim form runs a row per CPU "thread" with the lanes as a loop
 * and the butterfly as the same pairwise combinations in the same order
 * (lane l < off takes l and l + off), so the sums match the GPU's bit for
 * bit. */

#include <math.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "../configurator/kernel.h"
#include "../support/util.h"
#include "cuda_internal.h"

#define ROW_MAX_ACC 4
#define ROW_MAX_MEMBERS 24
#define ROW_MAX_ACCESS 64

typedef enum { RA_OTHER, RA_ELEM, RA_SCALAR } row_class;

typedef struct row_access {
  MlirOperation op;    /* a memref.load or memref.store */
  MlirValue mem;
  bool store;
  row_class cls;
} row_access;

typedef struct row_acc {
  MlirOperation load, store, comb;
  int side;            /* the operand of COMB that the load is */
  MlirAttribute neutral;
} row_acc;

typedef struct row_op {
  MlirOperation p;     /* the top-level scf.parallel */
  char kind;           /* 'R', 'E' or 'S' */
  int rank, r;         /* p's loops; the first r index the row */
  int64_t ub[MAX_LOOP_RANK];
  int64_t rows, K;
  MlirOperation loop;  /* R: the scf.for along the row */
  row_acc acc[ROW_MAX_ACC];
  int nacc;
  row_access a[ROW_MAX_ACCESS];
  int na;
  bool bad;            /* an op the row mapping does not take */
} row_op;

/* P's static loop bounds (lower 0, step 1) into UB; its rank, or -1. */
static int par_bounds(MlirOperation p, int64_t *ub) {
  if (!cg_op_is(p, "scf.parallel") || mlirOperationGetNumResults(p)) return -1;
  MlirBlock pb = mlirRegionGetFirstBlock(mlirOperationGetRegion(p, 0));
  intptr_t r = mlirBlockGetNumArguments(pb);
  if (r < 1 || r > MAX_LOOP_RANK || mlirOperationGetNumOperands(p) != 3 * r) return -1;
  for (intptr_t i = 0; i < r; i++) {
    int64_t lo = -1, st = -1;
    if (!cu_const_index(mlirOperationGetOperand(p, i), &lo) || !cu_const_index(mlirOperationGetOperand(p, r + i), &ub[i]) ||
        !cu_const_index(mlirOperationGetOperand(p, 2 * r + i), &st) || lo != 0 || st != 1 || ub[i] < 1)
      return -1;
  }
  return (int)r;
}

/* Whether T is MEMREF of shape DIMS[0..n) with the identity layout. */
static bool row_major_of(MlirType t, const int64_t *dims, int n) {
  if (!mlirTypeIsAMemRef(t) || mlirShapedTypeGetRank(t) != n) return false;
  MlirAttribute lay = mlirMemRefTypeGetLayout(t);
  if (!mlirAttributeIsNull(lay) &&
      !(mlirAttributeIsAAffineMap(lay) && mlirAffineMapIsIdentity(mlirAffineMapAttrGetValue(lay))))
    return false;
  for (int i = 0; i < n; i++)
    if (mlirShapedTypeGetDimSize(t, i) != dims[i]) return false;
  return true;
}

typedef struct row_walk {
  row_op *o;
  MlirValue kv;        /* the row element's index (null for an S) */
} row_walk;

static MlirWalkResult row_access_cb(MlirOperation op, void *ud) {
  row_walk *w = ud;
  row_op *o = w->o;
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(op));
  bool load = cg_op_is(op, "memref.load"), store = cg_op_is(op, "memref.store");
  if (!load && !store) {
    /* anything else that touches memory is not taken */
    if ((n.length > 7 && !memcmp(n.data, "memref.", 7)) || (n.length > 7 && !memcmp(n.data, "linalg.", 7)) ||
        (n.length > 4 && !memcmp(n.data, "gpu.", 4)) || cg_op_is(op, "func.call") ||
        (n.length > 7 && !memcmp(n.data, "vector.", 7)))
      o->bad = true;
    return o->bad ? MlirWalkResultInterrupt : MlirWalkResultAdvance;
  }
  if (o->na == ROW_MAX_ACCESS) {
    o->bad = true;
    return MlirWalkResultInterrupt;
  }
  int first = store ? 2 : 1;
  MlirValue mem = mlirOperationGetOperand(op, first - 1);
  int ni = (int)mlirOperationGetNumOperands(op) - first;
  MlirBlock pb = mlirRegionGetFirstBlock(mlirOperationGetRegion(o->p, 0));
  bool rowidx = ni >= o->r;
  for (int i = 0; rowidx && i < o->r; i++)
    rowidx = mlirValueEqual(mlirOperationGetOperand(op, first + i), mlirBlockGetArgument(pb, i));
  row_class cls = RA_OTHER;
  if (rowidx && ni == o->r && row_major_of(mlirValueGetType(mem), o->ub, o->r)) cls = RA_SCALAR;
  else if (rowidx && ni == o->r + 1 && !mlirValueIsNull(w->kv) &&
           mlirValueEqual(mlirOperationGetOperand(op, first + o->r), w->kv)) {
    int64_t dims[MAX_LOOP_RANK + 1];
    memcpy(dims, o->ub, (size_t)o->r * sizeof *dims);
    dims[o->r] = o->K;
    if (row_major_of(mlirValueGetType(mem), dims, o->r + 1)) cls = RA_ELEM;
  }
  o->a[o->na++] = (row_access){op, mem, store, cls};
  return MlirWalkResultAdvance;
}

/* The combiner OP's neutral element for T (f32 or i32), or null. */
static MlirAttribute row_neutral(MlirContext ctx, MlirOperation op, MlirType t) {
  if (mlirTypeIsAF32(t)) {
    double v;
    if (cg_op_is(op, "arith.addf")) v = -0.0;
    else if (cg_op_is(op, "arith.mulf")) v = 1.0;
    else if (cg_op_is(op, "arith.maximumf") || cg_op_is(op, "arith.maxnumf")) v = -INFINITY;
    else if (cg_op_is(op, "arith.minimumf") || cg_op_is(op, "arith.minnumf")) v = INFINITY;
    else return (MlirAttribute){NULL};
    return mlirFloatAttrDoubleGet(ctx, t, v);
  }
  if (!mlirTypeIsAInteger(t) || mlirIntegerTypeGetWidth(t) != 32) return (MlirAttribute){NULL};
  int64_t v;
  if (cg_op_is(op, "arith.addi") || cg_op_is(op, "arith.ori") || cg_op_is(op, "arith.xori") ||
      cg_op_is(op, "arith.maxui"))
    v = 0;
  else if (cg_op_is(op, "arith.muli")) v = 1;
  else if (cg_op_is(op, "arith.andi") || cg_op_is(op, "arith.minui")) v = -1;
  else if (cg_op_is(op, "arith.maxsi")) v = INT32_MIN;
  else if (cg_op_is(op, "arith.minsi")) v = INT32_MAX;
  else return (MlirAttribute){NULL};
  return mlirIntegerAttrGet(t, v);
}

/* Whether V is defined outside BLOCK (a value the loop in BLOCK does not compute). */
static bool defined_outside(MlirValue v, MlirBlock block) {
  if (mlirValueIsABlockArgument(v)) return !mlirBlockEqual(mlirBlockArgumentGetOwner(v), block);
  return !mlirBlockEqual(mlirOperationGetBlock(mlirOpResultGetOwner(v)), block);
}

/* An R's accumulator: the store S (at indices without the element's index)
 * of COMB(load, x) or COMB(x, load), the load in the loop's body at the
 * same indices and read only by COMB. */
static bool row_accumulator(MlirContext ctx, MlirOperation s, MlirBlock fb, row_acc *a) {
  MlirValue v = mlirOperationGetOperand(s, 0), mem = mlirOperationGetOperand(s, 1);
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation c = mlirOpResultGetOwner(v);
  if (!mlirBlockEqual(mlirOperationGetBlock(c), fb) || mlirOperationGetNumOperands(c) != 2) return false;
  MlirAttribute neutral = row_neutral(ctx, c, mlirValueGetType(v));
  if (mlirAttributeIsNull(neutral)) return false;
  intptr_t ni = mlirOperationGetNumOperands(s) - 2;
  for (intptr_t i = 0; i < ni; i++)
    if (!defined_outside(mlirOperationGetOperand(s, 2 + i), fb)) return false;
  for (int side = 0; side < 2; side++) {
    MlirValue l = mlirOperationGetOperand(c, side);
    if (!mlirValueIsAOpResult(l)) continue;
    MlirOperation lo = mlirOpResultGetOwner(l);
    if (!cg_op_is(lo, "memref.load") || !mlirBlockEqual(mlirOperationGetBlock(lo), fb) ||
        !mlirValueEqual(mlirOperationGetOperand(lo, 0), mem) || mlirOperationGetNumOperands(lo) != ni + 1)
      continue;
    bool same = true;
    for (intptr_t i = 0; same && i < ni; i++)
      same = mlirValueEqual(mlirOperationGetOperand(lo, 1 + i), mlirOperationGetOperand(s, 2 + i));
    MlirOpOperand use = mlirValueGetFirstUse(l);
    if (!same || mlirOpOperandIsNull(use) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(use))) continue;
    *a = (row_acc){lo, s, c, side, neutral};
    return true;
  }
  return false;
}

/* Whether load or store OP (its indices from operand FIRST on) uses K
 * only as its last index, of a dimension with unit stride (or not at all). */
static bool unit_stride_along(MlirOperation op, int first, MlirValue k) {
  int n = (int)mlirOperationGetNumOperands(op) - first;
  for (int i = 0; i < n - 1; i++)
    if (mlirValueEqual(mlirOperationGetOperand(op, first + i), k)) return false;
  if (n < 1 || !mlirValueEqual(mlirOperationGetOperand(op, first + n - 1), k)) return true;
  MlirType t = mlirValueGetType(mlirOperationGetOperand(op, first - 1));
  int64_t strides[MAX_LOOP_RANK + 1], off;
  if (!mlirTypeIsAMemRef(t) || n > MAX_LOOP_RANK + 1 ||
      mlirLogicalResultIsFailure(mlirMemRefTypeGetStridesAndOffset(t, strides, &off)))
    return false;
  return strides[n - 1] == 1;
}

/* Reads P as a member of a run over ROWS rows of K elements (ROWS == 0:
 * only as an R, which sets ROWS and K); false where it is none of R, E,
 * S for them. */
static bool row_read(gpu_ctx *G, MlirOperation p, int64_t rows, int64_t K, row_op *o) {
  memset(o, 0, sizeof *o);
  o->p = p;
  o->rank = par_bounds(p, o->ub);
  if (o->rank < 1) return false;
  int64_t all = 1, lead = 1;
  for (int i = 0; i < o->rank; i++) all *= o->ub[i];
  lead = all / o->ub[o->rank - 1];
  MlirBlock pb = mlirRegionGetFirstBlock(mlirOperationGetRegion(p, 0));
  MlirOperation first = mlirBlockGetFirstOperation(pb);
  bool one_loop = cg_op_is(first, "scf.for") && mlirOperationEqual(mlirOperationGetNextInBlock(first),
                                                                      mlirBlockGetTerminator(pb));
  row_walk w = {o, {NULL}};
  if (one_loop) { /* an R? */
    int64_t lo = -1, st = -1, k = 0;
    if (mlirOperationGetNumResults(first) || !cu_const_index(mlirOperationGetOperand(first, 0), &lo) ||
        !cu_const_index(mlirOperationGetOperand(first, 1), &k) || !cu_const_index(mlirOperationGetOperand(first, 2), &st) ||
        lo != 0 || st != 1 || k < 1 || (rows && (all != rows || k != K)))
      return false;
    o->kind = 'R', o->r = o->rank, o->rows = all, o->K = k, o->loop = first;
    MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(first, 0));
    w.kv = mlirBlockGetArgument(fb, 0);
    mlirOperationWalk(p, row_access_cb, &w, MlirWalkPreOrder);
    if (o->bad) return false;
    /* the lanes read consecutive addresses: every access that moves with
     * the element moves along a unit-stride last dimension (a column sum,
     * the element's index on rows, stays one thread per output, whose
     * neighbours read neighbouring columns) */
    for (int i = 0; i < o->na; i++)
      if (!unit_stride_along(o->a[i].op, o->a[i].store ? 2 : 1, w.kv)) return false;
    for (int i = 0; i < o->na; i++) {
      if (!o->a[i].store) continue;
      MlirOperation s = o->a[i].op;
      bool uses_k = false;
      for (intptr_t j = 2; j < mlirOperationGetNumOperands(s); j++)
        uses_k |= mlirValueEqual(mlirOperationGetOperand(s, j), w.kv);
      if (uses_k) continue; /* an element of the row: its own lane's */
      if (o->nacc == ROW_MAX_ACC || !row_accumulator(G->ctx, s, fb, &o->acc[o->nacc])) return false;
      o->nacc++;
    }
    if (!o->nacc) return false;
    /* nothing else in the nest touches an accumulator's buffer */
    for (int j = 0; j < o->nacc; j++)
      for (int i = 0; i < o->na; i++)
        if (!mlirOperationEqual(o->a[i].op, o->acc[j].load) && !mlirOperationEqual(o->a[i].op, o->acc[j].store) &&
            cu_may_overlap(o->a[i].mem, mlirOperationGetOperand(o->acc[j].store, 1)))
          return false;
    return true;
  }
  if (!rows) return false;
  if (all == rows) o->kind = 'S', o->r = o->rank;
  else if (o->rank >= 2 && lead == rows && o->ub[o->rank - 1] == K) {
    o->kind = 'E', o->r = o->rank - 1;
    w.kv = mlirBlockGetArgument(pb, o->r);
  } else
    return false;
  o->rows = rows, o->K = K;
  mlirOperationWalk(p, row_access_cb, &w, MlirWalkPreOrder);
  return !o->bad;
}

/* Whether A (earlier) and B might touch another row's data of a buffer
 * one of them writes (see the section's comment). */
static bool row_conflict(const row_op *a, const row_op *b) {
  for (int i = 0; i < a->na; i++)
    for (int j = 0; j < b->na; j++) {
      const row_access *x = &a->a[i], *y = &b->a[j];
      if (!(x->store || y->store) || !cu_may_overlap(x->mem, y->mem)) continue;
      MlirValue bx, by;
      int64_t ox, oy, sx, sy;
      if (x->cls == RA_OTHER || x->cls != y->cls || !cu_extent(x->mem, &bx, &ox, &sx) || !cu_extent(y->mem, &by, &oy, &sy) ||
          !mlirValueEqual(bx, by) || ox != oy ||
          !mlirTypeEqual(mlirShapedTypeGetElementType(mlirValueGetType(x->mem)),
                         mlirShapedTypeGetElementType(mlirValueGetType(y->mem))))
        return true;
    }
  return false;
}

/* scf.for %i = LO to HI step STEP { } before REF in B; its body (%i its argument 0). */
static row_region row_for(gpu_ctx *G, MlirBlock b, MlirOperation ref, MlirLocation loc, MlirValue lo, MlirValue hi,
                          MlirValue step) {
  MlirType it = mlirIndexTypeGet(G->ctx);
  MlirRegion r = mlirRegionCreate();
  MlirBlock fb = mlirBlockCreate(1, &it, &loc);
  mlirRegionAppendOwnedBlock(r, fb);
  MlirValue ops[3] = {lo, hi, step};
  MlirOperationState st = mlirOperationStateGet(nova_str("scf.for"), loc);
  mlirOperationStateAddOperands(&st, 3, ops);
  mlirOperationStateAddOwnedRegions(&st, 1, &r);
  mlirBlockInsertOwnedOperationBefore(b, ref, mlirOperationCreate(&st));
  return (row_region){fb, cu_mk(fb, (MlirOperation){NULL}, "scf.yield", loc, 0, NULL, 0, NULL, 0, NULL)};
}

/* A new op like combiner C (same name, result type and attributes) of X and Y. */
static MlirValue row_combine(MlirBlock b, MlirOperation ref, MlirOperation c, MlirValue x, MlirValue y) {
  MlirNamedAttribute at[8];
  int na = 0;
  for (intptr_t i = 0; i < mlirOperationGetNumAttributes(c) && na < 8; i++) at[na++] = mlirOperationGetAttribute(c, i);
  MlirValue ops[2] = {x, y};
  MlirType t = mlirValueGetType(mlirOperationGetResult(c, 0));
  MlirStringRef n = mlirIdentifierStr(mlirOperationGetName(c));
  char name[48];
  snprintf(name, sizeof name, "%.*s", (int)n.length, n.data);
  return mlirOperationGetResult(cu_mk(b, ref, name, mlirOperationGetLocation(c), 2, ops, 1, &t, na, at), 0);
}

static MlirValue row_load(MlirBlock b, MlirOperation ref, MlirLocation loc, MlirValue mem, int ni, const MlirValue *idx) {
  MlirValue ops[MAX_LOOP_RANK + 2];
  ops[0] = mem;
  for (int i = 0; i < ni; i++) ops[1 + i] = idx[i];
  MlirType t = mlirShapedTypeGetElementType(mlirValueGetType(mem));
  return mlirOperationGetResult(cu_mk(b, ref, "memref.load", loc, 1 + ni, ops, 1, &t, 0, NULL), 0);
}

static void row_store(MlirBlock b, MlirOperation ref, MlirLocation loc, MlirValue v, MlirValue mem, int ni,
                      const MlirValue *idx) {
  MlirValue ops[MAX_LOOP_RANK + 3];
  ops[0] = v, ops[1] = mem;
  for (int i = 0; i < ni; i++) ops[2 + i] = idx[i];
  cu_mk(b, ref, "memref.store", loc, 2 + ni, ops, 0, NULL, 0, NULL);
}

/* A private buffer of N elements of T (the GPU: memref.alloca, in
 * registers once promoted; --gpu-sim: memref.alloc, freed by the caller). */
static MlirValue row_private(gpu_ctx *G, MlirBlock b, MlirOperation ref, MlirLocation loc, int64_t n, MlirType t) {
  MlirType mt = mlirMemRefTypeContiguousGet(t, 1, &n, mlirAttributeGetNull());
  int32_t seg[2] = {0, 0};
  MlirNamedAttribute na = cu_named(G->ctx, "operandSegmentSizes", mlirDenseI32ArrayGet(G->ctx, 2, seg));
  return mlirOperationGetResult(cu_mk(b, ref, G->sim ? "memref.alloc" : "memref.alloca", loc, 0, NULL, 1, &mt, 1, &na), 0);
}

static MlirValue i32_const(gpu_ctx *G, MlirBlock b, MlirOperation ref, MlirLocation loc, int64_t v) {
  MlirType t = mlirIntegerTypeGet(G->ctx, 32);
  MlirNamedAttribute a = cu_named(G->ctx, "value", mlirIntegerAttrGet(t, v));
  return mlirOperationGetResult(cu_mk(b, ref, "arith.constant", loc, 0, NULL, 1, &t, 1, &a), 0);
}


/* An R's body in the launch: each accumulator privatized, the loop's
 * lanes, the butterfly, lane 0's final combination. */
static void row_reduce(gpu_ctx *G, MlirBlock body, MlirOperation term, row_op *o, MlirValue lane, MlirValue valid,
                       MlirValue lane0, MlirValue c0, MlirValue ctpr, int tpr) {
  MlirLocation loc = mlirOperationGetLocation(o->p);
  MlirValue priv[ROW_MAX_ACC];
  for (int j = 0; j < o->nacc; j++) {
    row_acc *a = &o->acc[j];
    MlirType t = mlirValueGetType(mlirOperationGetResult(a->comb, 0));
    priv[j] = row_private(G, body, term, loc, G->sim ? tpr : 1, t);
    MlirNamedAttribute va = cu_named(G->ctx, "value", a->neutral);
    MlirValue z = mlirOperationGetResult(cu_mk(body, term, "arith.constant", loc, 0, NULL, 1, &t, 1, &va), 0);
    if (G->sim) {
      row_region l = row_for(G, body, term, loc, c0, ctpr, cu_index_const(G->ctx, body, term, loc, 1));
      MlirValue iv = mlirBlockGetArgument(l.b, 0);
      row_store(l.b, l.end, loc, z, priv[j], 1, &iv);
    } else
      row_store(body, term, loc, z, priv[j], 1, &c0);
  }
  /* the lanes: for k = lane to K step TPR (the sim form: for lane = 0 to TPR around it) */
  row_region v = cu_if(body, term, loc, valid);
  MlirValue ln = lane;
  if (G->sim) {
    row_region l = row_for(G, v.b, v.end, loc, c0, ctpr, cu_index_const(G->ctx, v.b, v.end, loc, 1));
    ln = mlirBlockGetArgument(l.b, 0);
    v = l;
  }
  mlirOperationMoveBefore(o->loop, v.end);
  mlirOperationSetOperand(o->loop, 0, ln);
  mlirOperationSetOperand(o->loop, 2, ctpr);
  MlirValue slot = G->sim ? ln : c0;
  for (int j = 0; j < o->nacc; j++) {
    row_acc *a = &o->acc[j];
    MlirBlock lb = mlirOperationGetBlock(a->load);
    MlirValue nl = row_load(lb, a->load, loc, priv[j], 1, &slot);
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(a->load, 0), nl);
    row_store(lb, a->store, loc, mlirOperationGetOperand(a->store, 0), priv[j], 1, &slot);
  }
  /* the butterfly, then lane 0 */
  for (int j = 0; j < o->nacc; j++) {
    row_acc *a = &o->acc[j];
    MlirValue part = (MlirValue){NULL};
    if (!G->sim) part = row_load(body, term, loc, priv[j], 1, &c0);
    for (int off = tpr / 2; off >= 1; off /= 2) {
      if (G->sim) { /* lanes l < off: l and l + off */
        row_region l = row_for(G, body, term, loc, c0, cu_index_const(G->ctx, body, term, loc, off),
                               cu_index_const(G->ctx, body, term, loc, 1));
        MlirValue li = mlirBlockGetArgument(l.b, 0);
        MlirValue lj = cu_binop(l.b, l.end, loc, "arith.addi", li, cu_index_const(G->ctx, l.b, l.end, loc, off));
        MlirValue x = row_load(l.b, l.end, loc, priv[j], 1, &li), y = row_load(l.b, l.end, loc, priv[j], 1, &lj);
        row_store(l.b, l.end, loc, row_combine(l.b, l.end, a->comb, x, y), priv[j], 1, &li);
      } else {
        MlirValue ops[3] = {part, i32_const(G, body, term, loc, off), i32_const(G, body, term, loc, 32)};
        MlirType rt[2] = {mlirValueGetType(part), mlirIntegerTypeGet(G->ctx, 1)};
        MlirNamedAttribute mode =
            cu_named(G->ctx, "mode", mlirAttributeParseGet(G->ctx, nova_str("#gpu<shuffle_mode xor>")));
        MlirValue other = mlirOperationGetResult(cu_mk(body, term, "gpu.shuffle", loc, 3, ops, 2, rt, 1, &mode), 0);
        part = row_combine(body, term, a->comb, part, other);
      }
    }
    row_region f = cu_if(body, term, loc, lane0);
    if (G->sim) part = row_load(f.b, f.end, loc, priv[j], 1, &c0);
    MlirValue mem = mlirOperationGetOperand(a->store, 1);
    int ni = (int)mlirOperationGetNumOperands(a->store) - 2;
    MlirValue idx[MAX_LOOP_RANK];
    for (int i = 0; i < ni && i < MAX_LOOP_RANK; i++) idx[i] = mlirOperationGetOperand(a->store, 2 + i);
    MlirValue init = row_load(f.b, f.end, loc, mem, ni, idx);
    MlirValue res = a->side == 0 ? row_combine(f.b, f.end, a->comb, init, part)
                                 : row_combine(f.b, f.end, a->comb, part, init);
    row_store(f.b, f.end, loc, res, mem, ni, idx);
    mlirOperationDestroy(a->store);
    mlirOperationDestroy(a->load);
    if (G->sim) cu_mk(body, term, "memref.dealloc", loc, 1, &priv[j], 0, NULL, 0, NULL);
  }
}

/* The run M[0..nm) -> one gpu.launch, placed before its last nest. */
static void map_rows(gpu_ctx *G, MlirBlock fb, row_op *m, int nm) {
  MlirContext ctx = G->ctx;
  int anchor = 0;
  while (m[anchor].kind != 'R') anchor++;
  MlirLocation loc = mlirOperationGetLocation(m[anchor].p);
  int64_t rows = m[anchor].rows, K = m[anchor].K;
  cfg_reduce_schedule s = cfg_row(G->dev, rows, K, 4);
  cg_kernel *k = s.ok ? cu_new_kernel(G) : NULL;
  if (!k) {
    if (!s.ok) nv_error_plain(G->c->diag, "cannot configure a row kernel of %lld rows of %lld: %s", (long long)rows,
                              (long long)K, s.reason);
    G->failed = 1;
    return;
  }
  int tpr = s.threads_per_row, nr = 0;
  for (int i = 0; i < nm; i++) nr += m[i].kind == 'R';
  cu_describe_loc(loc, k);
  snprintf(k->op, sizeof k->op, "row");
  k->rank = 2, k->dims[0] = rows, k->dims[1] = K;
  k->n = rows * tpr;
  k->grid = s.grid;
  k->block = s.threads;
  snprintf(k->reason, sizeof k->reason, "%.130s; %d ops (%d reductions) in one kernel", s.reason, nm, nr);
  MlirOperation term;
  MlirBlock body = cu_make_launch(G, fb, m[nm - 1].p, loc, s.grid, G->sim ? s.rows_per_block : s.threads, &term);
  MlirValue bid = mlirBlockGetArgument(body, 0), tid = mlirBlockGetArgument(body, 3);
  MlirValue c0 = cu_index_const(ctx, body, term, loc, 0), ctpr = cu_index_const(ctx, body, term, loc, tpr);
  MlirValue lane = G->sim ? c0 : cu_binop(body, term, loc, "arith.remui", tid, ctpr);
  MlirValue grp = G->sim ? tid : cu_binop(body, term, loc, "arith.divui", tid, ctpr);
  MlirValue row = cu_binop(body, term, loc, "arith.addi",
                        cu_binop(body, term, loc, "arith.muli", bid, cu_index_const(ctx, body, term, loc, s.rows_per_block)),
                        grp);
  MlirValue valid = cu_cmp(G, body, term, loc, 6 /* ult */, row, cu_index_const(ctx, body, term, loc, rows));
  MlirValue lane0 = G->sim ? valid
                           : cu_binop(body, term, loc, "arith.andi", valid, cu_cmp(G, body, term, loc, 0 /* eq */, lane, c0));
  for (int i = 0; i < nm; i++) {
    row_op *o = &m[i];
    MlirLocation ol = mlirOperationGetLocation(o->p);
    MlirBlock pb = mlirRegionGetFirstBlock(mlirOperationGetRegion(o->p, 0));
    MlirValue rest = row;
    for (int d = o->r - 1; d >= 0; d--) { /* the row's loop indices */
      MlirValue iv = rest;
      if (d > 0) {
        MlirValue dv = cu_index_const(ctx, body, term, ol, o->ub[d]);
        iv = cu_binop(body, term, ol, "arith.remui", rest, dv);
        rest = cu_binop(body, term, ol, "arith.divui", rest, dv);
      }
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(pb, d), iv);
    }
    if (o->kind == 'R') row_reduce(G, body, term, o, lane, valid, lane0, c0, ctpr, tpr);
    else if (o->kind == 'S') {
      row_region t = cu_if(body, term, ol, lane0);
      cu_move_body(pb, t.end);
    } else {
      row_region t = cu_if(body, term, ol, valid);
      MlirValue ln = lane;
      if (G->sim) {
        t = row_for(G, t.b, t.end, ol, c0, ctpr, cu_index_const(ctx, t.b, t.end, ol, 1));
        ln = mlirBlockGetArgument(t.b, 0);
      }
      t = row_for(G, t.b, t.end, ol, ln, cu_index_const(ctx, t.b, t.end, ol, K), ctpr);
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(pb, o->r), mlirBlockGetArgument(t.b, 0));
      cu_move_body(pb, t.end);
    }
    mlirOperationDestroy(o->p);
    if (i + 1 < nm && !G->sim) cu_mk(body, term, "gpu.barrier", ol, 0, NULL, 0, NULL, 0, NULL);
  }
}

/* Between two members of a run: ops that compute nothing on the device. */
static bool row_between(gpu_ctx *G, MlirOperation op) {
  return (cu_host_op(op) && !cg_op_is(op, "gpu.launch")) || (!G->sim && cg_op_is(op, "memref.alloc"));
}

/* Groups OPS[0..n) into runs (GRP[i]: the run of op i, or -1); the runs'
 * members in *MEMBERS (run g: MEMBERS[START[g] .. START[g + 1])). */
static int row_runs(gpu_ctx *G, MlirOperation *ops, int n, int *grp, row_op **members, int **start) {
  int nrun = 0, nmem = 0, capm = 0;
  row_op *mem = NULL;
  int *st = nv_xmalloc(sizeof *st);
  if (!st) return -1;
  st[0] = 0;
  row_op *tmp = nv_xmalloc(sizeof *tmp * ROW_MAX_MEMBERS);
  int *idx = nv_xmalloc(sizeof *idx * ROW_MAX_MEMBERS);
  if (!tmp || !idx) goto oom;
  for (int i = 0; i < n; i++) grp[i] = -1;
  for (int i = 0; i < n; i++) {
    if (!cg_op_is(ops[i], "scf.parallel") || !row_read(G, ops[i], 0, 0, &tmp[0])) continue;
    int cnt = 1, first = 0;
    idx[0] = i;
    int64_t rows = tmp[0].rows, K = tmp[0].K;
    /* back over the elementwise and per-row nests before it */
    for (int j = i - 1; j >= 0 && cnt < ROW_MAX_MEMBERS; j--) {
      if (row_between(G, ops[j])) continue;
      row_op o;
      if (grp[j] >= 0 || !row_read(G, ops[j], rows, K, &o) || o.kind == 'R') break;
      bool clash = false;
      for (int q = 0; q < cnt && !clash; q++) clash = row_conflict(&o, &tmp[(first + q) % ROW_MAX_MEMBERS]);
      if (clash) break;
      first = (first + ROW_MAX_MEMBERS - 1) % ROW_MAX_MEMBERS;
      tmp[first] = o, idx[first] = j, cnt++;
    }
    /* then forward */
    int last = i;
    for (int j = i + 1; j < n && cnt < ROW_MAX_MEMBERS; j++) {
      if (row_between(G, ops[j])) continue;
      row_op o;
      if (!row_read(G, ops[j], rows, K, &o)) break;
      bool clash = false;
      for (int q = 0; q < cnt && !clash; q++) clash = row_conflict(&tmp[(first + q) % ROW_MAX_MEMBERS], &o);
      if (clash) break;
      int at = (first + cnt) % ROW_MAX_MEMBERS;
      tmp[at] = o, idx[at] = j, cnt++;
      last = j;
    }
    if (nmem + cnt > capm) {
      capm = (nmem + cnt) * 2;
      row_op *m2 = nv_xrealloc(mem, sizeof *m2 * (size_t)capm);
      if (!m2) goto oom;
      mem = m2;
    }
    int *st2 = nv_xrealloc(st, sizeof *st2 * (size_t)(nrun + 2));
    if (!st2) goto oom;
    st = st2;
    for (int q = 0; q < cnt; q++) {
      int at = (first + q) % ROW_MAX_MEMBERS;
      mem[nmem++] = tmp[at];
      grp[idx[at]] = nrun;
    }
    st[++nrun] = nmem;
    i = last;
  }
  free(tmp);
  free(idx);
  *members = mem, *start = st;
  return nrun;
oom:
  free(tmp);
  free(idx);
  free(mem);
  free(st);
  return -1;
}


struct cu_rows {
  row_op *mem;
  int *start; /* run g: mem[start[g] .. start[g + 1]) */
};

cu_rows *cu_rows_find(gpu_ctx *G, MlirOperation *ops, int n, int *grp) {
  cu_rows *r = nv_xcalloc(1, sizeof *r);
  if (!r) return NULL;
  if (row_runs(G, ops, n, grp, &r->mem, &r->start) < 0) {
    free(r);
    return NULL;
  }
  return r;
}

bool cu_rows_is_last(const cu_rows *r, int g, MlirOperation op) {
  return mlirOperationEqual(r->mem[r->start[g + 1] - 1].p, op);
}

void cu_rows_map(gpu_ctx *G, MlirBlock fb, cu_rows *r, int g) {
  map_rows(G, fb, r->mem + r->start[g], r->start[g + 1] - r->start[g]);
}

void cu_rows_free(cu_rows *r) {
  if (!r) return;
  free(r->mem);
  free(r->start);
  free(r);
}
