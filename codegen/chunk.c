/* chunk.c: the step bufferized in pieces.
 *
 * One-shot bufferization analyses each write against every use of every
 * value that aliases the written one, within a function.  A weight that
 * every layer reads, sliced by every tiled kernel, has one alias per
 * kernel: a chain of N statements on one weight spent time quadratic in N
 * there (4.5 s at 2,000 statements, 48 s at 8,000).
 *
 * Requires: tensor IR (after tiling and cg_unshare_destinations).
 * Does (cg_chunk_split): cuts the straight-line body of each public
 * function longer than CG_CHUNK_OPS top-level ops into consecutive pieces
 * of about that many ops (more in a very long function, fewer where a
 * piece would take more than CG_CHUNK_ARGS values from before it), each
 * moved into a private function (@__nova_chunk_K) called in its place;
 * the values a piece uses from before are its arguments (constants,
 * slices of whole tensors and fresh ones, empty or filled with a constant,
 * are cloned into it), the values used after it its results.  A cut is
 * placed where no view (a tensor-dialect result other than
 * tensor.empty) and nothing but tensors and scalars is live across it,
 * so that bufferization passes only whole buffers of identity layout at
 * the calls and copies nothing there.  After bufferization,
 * cg_chunk_inline puts every piece back in place (by hand, not the
 * inliner pass: no canonicalization on the way), so what follows sees one
 * function, as before.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "codegen.h"

#define CG_CHUNK_OPS 400
#define CG_CHUNK_ARGS 128
#define MIN_PIECE 8
#define CHUNK_PREFIX "__nova_chunk_"

typedef struct body {
  MlirBlock block;
  MlirOperation *ops; /* top-level ops but the terminator */
  int n;
  cg_ptrmap idx;       /* ops[i] -> i; the terminator -> n */
} body;

/* The index of the top-level op that holds OP (n: the terminator; -1: not in the body). */
static int top_index(const body *b, MlirOperation op) {
  while (!mlirOperationIsNull(op) && !mlirBlockEqual(mlirOperationGetBlock(op), b->block))
    op = mlirOperationGetParentOperation(op);
  return mlirOperationIsNull(op) ? -1 : cg_ptrmap_get(&b->idx, op.ptr);
}

/* The top-level op that defines V, as an index; -1 for an argument of the body's block. */
static int def_index(const body *b, MlirValue v) {
  if (!mlirValueIsAOpResult(v)) {
    MlirBlock owner = mlirBlockArgumentGetOwner(v);
    return mlirBlockEqual(owner, b->block) ? -1 : top_index(b, mlirBlockGetParentOperation(owner));
  }
  return top_index(b, mlirOpResultGetOwner(v));
}

/* Whether a function boundary can carry V unchanged: a scalar, or a tensor
 * that is not a view of another. */
bool cg_passes_whole(MlirValue v) {
  MlirType t = mlirValueGetType(v);
  if (mlirTypeIsAIndex(t) || mlirTypeIsAInteger(t) || mlirTypeIsAFloat(t)) return true;
  if (!mlirTypeIsARankedTensor(t)) return false;
  if (!mlirValueIsAOpResult(v)) return true;
  MlirOperation d = mlirOpResultGetOwner(v);
  /* a reshape of a whole tensor is whole (identity layout after bufferization) */
  if (cg_op_is(d, "tensor.expand_shape") || cg_op_is(d, "tensor.collapse_shape"))
    return cg_passes_whole(mlirOperationGetOperand(d, 0));
  if (cg_op_is(d, "tensor.insert_slice")) return cg_passes_whole(mlirOperationGetOperand(d, 1)); /* its destination */
  MlirStringRef name = mlirIdentifierStr(mlirOperationGetName(d));
  return !(name.length > 7 && !memcmp(name.data, "tensor.", 7)) || cg_op_is(d, "tensor.empty");
}

static bool is_piece(MlirOperation f, MlirStringRef *name);

/* ---- values crossing a piece's edges ------------------------------------- */

typedef struct vals {
  MlirValue *v;
  int n, cap;
} vals;

/* Appends V (the callers add each value once). */
static void vals_add(vals *s, MlirValue v) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 64;
    s->v = nv_xrealloc(s->v, (size_t)s->cap * sizeof *s->v);
  }
  s->v[s->n++] = v;
}

static bool is_constant(MlirValue v) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  return cg_op_is(d, "arith.constant") || cg_op_is(d, "ub.poison");
}

typedef struct inputs_ctx {
  const body *b;
  int start, end;
  vals *in, *consts; /* arguments; constants from before, cloned into the piece */
  cg_ptrmap *seen; /* values already taken (keyed by the value pointer) */
} inputs_ctx;

static bool recomputable_at(MlirValue v, int depth);

/* An empty tensor of a static shape, or one filled with a constant. */
static bool fresh(MlirOperation d, int depth) {
  if (cg_op_is(d, "tensor.empty")) return mlirOperationGetNumOperands(d) == 0;
  return cg_op_is(d, "linalg.fill") && mlirOperationGetNumOperands(d) == 2 && mlirOperationGetNumResults(d) == 1 &&
         is_constant(mlirOperationGetOperand(d, 0)) && mlirValueIsAOpResult(mlirOperationGetOperand(d, 1)) &&
         cg_op_is(mlirOpResultGetOwner(mlirOperationGetOperand(d, 1)), "tensor.empty") &&
         recomputable_at(mlirOperationGetOperand(d, 1), depth + 1);
}

/* A slice of a whole tensor (or a reshape of one), made by top-level ops,
 * or a fresh tensor: recomputed in each piece that reads it (from the
 * tensor, passed whole) rather than passed.  (The destinations that
 * unshare.c gives a run of writes from one source op stand at the run's
 * start: a training step's non-finite check, one reduction per gradient,
 * passed a thousand zero fills to a piece, and the analysis of the piece
 * grew with the square of its length.) */
static bool recomputable_at(MlirValue v, int depth) {
  if (!mlirValueIsAOpResult(v) || depth > 8) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  if (fresh(d, depth)) return true;
  if (!cg_op_is(d, "tensor.extract_slice") && !cg_op_is(d, "tensor.expand_shape") &&
      !cg_op_is(d, "tensor.collapse_shape"))
    return false;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(d); i++) {
    MlirValue o = mlirOperationGetOperand(d, i);
    if (!cg_passes_whole(o) && !is_constant(o) && !recomputable_at(o, depth + 1)) return false;
  }
  return true;
}

static bool recomputable(MlirValue v) { return recomputable_at(v, 0); }

/* V, read inside the piece and made before it: an argument, or a clone
 * (constants, slices: their operands first). */
static void take_input(inputs_ctx *c, MlirValue v) {
  int d = def_index(c->b, v);
  if ((d >= c->start && d < c->end) || cg_ptrmap_get(c->seen, v.ptr) >= 0) return;
  cg_ptrmap_put(c->seen, v.ptr, 1);
  if (is_constant(v)) {
    vals_add(c->consts, v);
  } else if (recomputable(v)) {
    MlirOperation def = mlirOpResultGetOwner(v);
    for (intptr_t i = 0; i < mlirOperationGetNumOperands(def); i++) take_input(c, mlirOperationGetOperand(def, i));
    vals_add(c->consts, v);
  } else {
    vals_add(c->in, v);
  }
}

static MlirWalkResult inputs_cb(MlirOperation op, void *ud) {
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) take_input(ud, mlirOperationGetOperand(op, i));
  return MlirWalkResultAdvance;
}

static MlirWalkResult count_cb(MlirOperation op, void *ud) {
  *(size_t *)ud += (size_t)mlirOperationGetNumOperands(op) + 1;
  return MlirWalkResultAdvance;
}

/* Replaces the uses of FROM by TO where the user lies outside ROOT. */
static void replace_uses_outside(MlirValue from, MlirValue to, MlirOperation root) {
  MlirOpOperand u = mlirValueGetFirstUse(from);
  while (!mlirOpOperandIsNull(u)) {
    MlirOpOperand next = mlirOpOperandGetNextUse(u);
    MlirOperation user = mlirOpOperandGetOwner(u);
    bool in = false;
    for (MlirOperation p = user; !mlirOperationIsNull(p) && !in; p = mlirOperationGetParentOperation(p))
      in = mlirOperationEqual(p, root);
    if (!in) mlirOperationSetOperand(user, (intptr_t)mlirOpOperandGetOperandNumber(u), to);
    u = next;
  }
}

/* Moves ops [start, end) of B into a new private function @NAME, called
 * where they were. */
static void split_piece(MlirModule m, body *b, int start, int end, const char *name) {
  MlirOperation first = b->ops[start];
  MlirContext ctx = mlirOperationGetContext(first);
  MlirLocation loc = mlirOperationGetLocation(first);
  vals in = {0}, out = {0}, consts = {0};
  cg_ptrmap seen = {0};
  size_t operands = 0; /* a bound on the values SEEN will hold (with the slices' operands) */
  for (int i = start; i < end; i++) mlirOperationWalk(b->ops[i], count_cb, &operands, MlirWalkPreOrder);
  cg_ptrmap_init(&seen, 2 * operands);
  inputs_ctx ic = {b, start, end, &in, &consts, &seen};
  for (int i = start; i < end; i++) mlirOperationWalk(b->ops[i], inputs_cb, &ic, MlirWalkPreOrder);
  for (int i = start; i < end; i++)
    for (intptr_t r = 0; r < mlirOperationGetNumResults(b->ops[i]); r++) {
      MlirValue v = mlirOperationGetResult(b->ops[i], r);
      for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u))
        if (top_index(b, mlirOpOperandGetOwner(u)) >= end) {
          vals_add(&out, v);
          break;
        }
    }
  MlirValue *sub = nv_xcalloc((size_t)(in.n + consts.n) + 1, sizeof *sub);
  MlirType *tin = nv_xcalloc((size_t)in.n + 1, sizeof *tin), *tout = nv_xcalloc((size_t)out.n + 1, sizeof *tout);
  for (int i = 0; i < in.n; i++) tin[i] = mlirValueGetType(in.v[i]);
  for (int i = 0; i < out.n; i++) tout[i] = mlirValueGetType(out.v[i]);
  MlirOperation ret;
  MlirOperation fn = cg_make_func(ctx, loc, name, in.n, tin, out.n, tout, &ret);
  mlirOperationSetOperands(ret, out.n, out.v);
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
  mlirBlockAppendOwnedOperation(mlirModuleGetBody(m), fn);

  MlirOperation call = cg_insert_call(first, loc, mlirFlatSymbolRefAttrGet(ctx, nova_str(name)), in.n, in.v, out.n, tout);
  cg_ptrmap_put(&b->idx, call.ptr, start); /* an earlier piece's values it reads are used at `start` */

  for (int i = start; i < end; i++) mlirOperationMoveBefore(b->ops[i], ret);
  /* later users read the call's results; the piece reads its arguments */
  for (int i = 0; i < out.n; i++) replace_uses_outside(out.v[i], mlirOperationGetResult(call, i), fn);
  /* inside, the arguments and the clones of constants instead: the piece's
   * operands looked up in SEEN (value -> its stand-in's index + 1 in SUB) */
  memset(seen.key, 0, seen.cap * sizeof *seen.key);
  for (int i = 0; i < in.n; i++) {
    sub[i] = mlirBlockGetArgument(entry, i);
    cg_ptrmap_put(&seen, in.v[i].ptr, i);
  }
  MlirOperation at = mlirBlockGetFirstOperation(entry);
  cg_remap sc = {&seen, sub};
  for (int i = 0; i < consts.n; i++) { /* in order: a clone's operands are mapped before it */
    MlirOperation clone = mlirOperationClone(mlirOpResultGetOwner(consts.v[i]));
    mlirBlockInsertOwnedOperationBefore(entry, at, clone);
    cg_remap_cb(clone, &sc);
    sub[in.n + i] = mlirOperationGetResult(clone, mlirOpResultGetResultNumber(consts.v[i]));
    cg_ptrmap_put(&seen, consts.v[i].ptr, in.n + i);
  }
  for (int i = start; i < end; i++) mlirOperationWalk(b->ops[i], cg_remap_cb, &sc, MlirWalkPreOrder);
  free(sub);
  free(tin);
  free(tout);
  free(in.v);
  free(out.v);
  free(consts.v);
  cg_ptrmap_free(&seen);
}

/* Where the pieces of B end: CUT[k] = 1 before ops[k] for a cut there (CUT
 * comes zeroed, b->n + 1 bytes).
 * No cut where a value that cg_passes_whole refuses is live. */
static void plan_cuts(const body *b, int max_ops, char *cut) {
  int *live = nv_xcalloc((size_t)b->n + 2, sizeof *live); /* difference array of blocked cut positions */
  for (int i = 0; i < b->n; i++)
    for (intptr_t r = 0; r < mlirOperationGetNumResults(b->ops[i]); r++) {
      MlirValue v = mlirOperationGetResult(b->ops[i], r);
      if (cg_passes_whole(v) || is_constant(v) || recomputable(v)) continue; /* the last two are cloned into pieces */
      int last = i;
      for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u)) {
        int k = top_index(b, mlirOpOperandGetOwner(u));
        if (k > last) last = k;
      }
      if (last > i) live[i + 1]++, live[last + 1]--; /* cuts before ops i+1 .. last are blocked */
      if (last > i + 1 && getenv("NOVAC_DEBUG_CHUNKS")) {
        MlirStringRef nm = mlirIdentifierStr(mlirOperationGetName(b->ops[i]));
        fprintf(stderr, "novac: no cut across %d ops: %.*s\n", last - i, (int)nm.length, nm.data);
      }
    }
  int run = 0;
  char *blocked = nv_xcalloc((size_t)b->n + 1, 1);
  for (int k = 0; k <= b->n; k++) blocked[k] = (char)((run += live[k]) > 0);
  free(live);
  size_t nuses = 0;
  for (int i = 0; i < b->n; i++) nuses += (size_t)mlirOperationGetNumOperands(b->ops[i]);
  cg_ptrmap taken; /* value -> 1 + the start of the last piece that counted it */
  cg_ptrmap_init(&taken, nuses + 1);
  for (int start = 0; start < b->n;) {
    int end = start + max_ops < b->n ? start + max_ops : b->n;
    /* fewer ops where the piece would take more than CG_CHUNK_ARGS values
     * from before it (at least MIN_PIECE ops: one op may take more) */
    int args = 0;
    for (int i = start; i < end && args < CG_CHUNK_ARGS; i++)
      for (intptr_t k = 0; k < mlirOperationGetNumOperands(b->ops[i]); k++) {
        MlirValue v = mlirOperationGetOperand(b->ops[i], k);
        if (def_index(b, v) >= start || is_constant(v) || cg_ptrmap_get(&taken, v.ptr) == start + 1) continue;
        cg_ptrmap_put(&taken, v.ptr, start + 1);
        if (++args == CG_CHUNK_ARGS) {
          int e = i + 1 > start + MIN_PIECE ? i + 1 : start + MIN_PIECE;
          if (e < end) end = e;
        }
      }
    if (getenv("NOVAC_DEBUG_CHUNKS")) fprintf(stderr, "novac: piece at %d: %d ops, %d values from before\n", start, end - start, args);
    if (end >= b->n) break;
    int k = end;
    while (k > start + (end - start) / 2 && blocked[k]) k--;
    if (blocked[k])
      for (k = end; k < b->n && blocked[k]; k++) {
      }
    if (k >= b->n) break;
    cut[k] = 1;
    start = k;
  }
  cg_ptrmap_free(&taken);
  free(blocked);
}

static void split_func(MlirModule m, MlirOperation f, int *counter) {
  body b = {0};
  b.block = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
  int n = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(b.block); !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op))
    n++;
  if (n - 1 <= 2 * CG_CHUNK_OPS) return;
  /* the analysis also spends time quadratic in the number of pieces (2,400
   * pieces of 100 ops took 4.7 times as long as 600 of 400): beyond 160,000
   * ops, pieces of sqrt(n) ops (a 50,000-statement chain, 750,000 ops:
   * 12.0 s in 1,876 pieces of 400, 7.5 s in 867 of 866) */
  int root = (int)sqrt((double)n), per = root > CG_CHUNK_OPS ? root : CG_CHUNK_OPS;
  b.ops = nv_xcalloc((size_t)n, sizeof *b.ops);
  cg_ptrmap_init(&b.idx, 2 * (size_t)n + 1); /* the ops, and a call per piece */
  char *cut = nv_xcalloc((size_t)n + 1, 1);
  for (MlirOperation op = mlirBlockGetFirstOperation(b.block); !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    cg_ptrmap_put(&b.idx, op.ptr, b.n);
    if (!mlirOperationIsNull(mlirOperationGetNextInBlock(op))) b.ops[b.n++] = op; /* not the terminator */
  }
  plan_cuts(&b, per, cut);
  bool any = false;
  for (int k = 1; k < b.n && !any; k++) any = cut[k];
  /* last piece first: a piece's later users are then still top-level ops of
   * the body; nowhere to cut (!ANY): bufferized whole */
  for (int k = b.n - 1, end = b.n; any && k >= 0; k--) {
    if (k > 0 && !cut[k]) continue;
    char name[64];
    snprintf(name, sizeof name, CHUNK_PREFIX "%d", (*counter)++);
    split_piece(m, &b, k, end, name);
    end = k;
  }
  free(b.ops);
  cg_ptrmap_free(&b.idx);
  free(cut);
}

/* The fresh tensors of B's top level left without uses (the pieces read
 * clones of them) erased, the fills before their empties. */
static void erase_dead_fresh(MlirBlock b) {
  cg_op_list ops = {0};
  for (MlirOperation op = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op))
    if (fresh(op, 0) || cg_op_is(op, "tensor.empty")) cg_op_list_push(&ops, op);
  for (size_t i = ops.n; i-- > 0 && !ops.oom;)
    if (mlirOpOperandIsNull(mlirValueGetFirstUse(mlirOperationGetResult(ops.v[i], 0)))) mlirOperationDestroy(ops.v[i]);
  free(ops.v);
}

int cg_chunk_split(MlirModule m) {
  int counter = 0;
  cg_op_list funcs = {0};
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    MlirStringRef name;
    if (is_piece(f, &name)) counter++; /* cut already, not put back yet: left alone */
  }
  if (counter) return counter;
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    if (cg_op_is(f, "func.func") && mlirAttributeIsNull(mlirOperationGetAttributeByName(f, nova_str("sym_visibility"))) &&
        !mlirBlockIsNull(mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0))))
      cg_op_list_push(&funcs, f);
  for (size_t i = 0; i < funcs.n && !funcs.oom; i++) split_func(m, funcs.v[i], &counter);
  if (counter) { /* the pieces first: their clones may leave the originals dead */
    MlirStringRef name;
    for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
         f = mlirOperationGetNextInBlock(f))
      if (is_piece(f, &name)) erase_dead_fresh(mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0)));
    for (size_t i = 0; i < funcs.n && !funcs.oom; i++)
      erase_dead_fresh(mlirRegionGetFirstBlock(mlirOperationGetRegion(funcs.v[i], 0)));
  }
  free(funcs.v);
  return funcs.oom ? -1 : counter;
}

/* ---- putting the pieces back ----------------------------------------------- */

/* K of the name CHUNK_PREFIX K, or -1. */
static int piece_number(MlirStringRef s) {
  size_t pl = strlen(CHUNK_PREFIX);
  if (s.length <= pl || s.length - pl > 9 || memcmp(s.data, CHUNK_PREFIX, pl)) return -1;
  int k = 0;
  for (size_t i = pl; i < s.length; i++) {
    if (s.data[i] < '0' || s.data[i] > '9') return -1;
    k = 10 * k + (s.data[i] - '0');
  }
  return k;
}

static bool is_piece(MlirOperation f, MlirStringRef *name) {
  if (!cg_op_is(f, "func.func")) return false;
  MlirAttribute a = mlirOperationGetAttributeByName(f, mlirSymbolTableGetSymbolAttributeName());
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAString(a)) return false;
  *name = mlirStringAttrGetValue(a);
  return piece_number(*name) >= 0;
}

typedef struct calls_ctx {
  cg_op_list calls;
} calls_ctx;

static MlirWalkResult calls_cb(MlirOperation op, void *ud) {
  if (!cg_op_is(op, "func.call")) return MlirWalkResultAdvance;
  MlirAttribute a = mlirOperationGetAttributeByName(op, nova_str("callee"));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAFlatSymbolRef(a)) return MlirWalkResultAdvance;
  if (piece_number(mlirFlatSymbolRefAttrGetValue(a)) >= 0) cg_op_list_push(&((calls_ctx *)ud)->calls, op);
  return MlirWalkResultAdvance;
}

int cg_chunk_inline(MlirModule m) {
  /* the pieces by number (CHUNK_PREFIX K) */
  cg_op_list pieces = {0};
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    MlirStringRef name;
    if (!is_piece(f, &name)) continue;
    int k = piece_number(name);
    while (!pieces.oom && pieces.n <= (size_t)k) cg_op_list_push(&pieces, (MlirOperation){NULL});
    if (!pieces.oom) pieces.v[k] = f;
  }
  if (pieces.n == 0) return 0;
  calls_ctx cc = {{0}};
  if (!pieces.oom) mlirOperationWalk(mlirModuleGetOperation(m), calls_cb, &cc, MlirWalkPreOrder);
  int rc = pieces.oom || cc.calls.oom ? -1 : 0;
  for (size_t i = 0; i < cc.calls.n && !rc; i++) {
    MlirOperation call = cc.calls.v[i];
    int k = piece_number(mlirFlatSymbolRefAttrGetValue(mlirOperationGetAttributeByName(call, nova_str("callee"))));
    if (k < 0 || (size_t)k >= pieces.n || mlirOperationIsNull(pieces.v[k])) {
      rc = -1;
      break;
    }
    MlirOperation fn = pieces.v[k];
    MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
    MlirOperation ret = mlirBlockGetTerminator(entry);
    if (mlirBlockGetNumArguments(entry) != mlirOperationGetNumOperands(call) ||
        mlirOperationGetNumOperands(ret) != mlirOperationGetNumResults(call)) {
      rc = -1;
      break;
    }
    intptr_t na = mlirOperationGetNumOperands(call), nr = mlirOperationGetNumResults(call);
    MlirValue *args = nv_xcalloc((size_t)(na + nr) + 1, sizeof *args);
    for (intptr_t a = 0; a < na; a++) args[a] = mlirOperationGetOperand(call, a);
    cg_inline_func(fn, call, args, args + na);
    for (intptr_t r = 0; r < nr; r++) mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(call, r), args[na + r]);
    free(args);
    mlirOperationDestroy(call);
  }
  for (size_t k = 0; k < pieces.n && !rc; k++)
    if (!mlirOperationIsNull(pieces.v[k])) mlirOperationDestroy(pieces.v[k]);
  free(pieces.v);
  free(cc.calls.v);
  return rc;
}

/* ---- the constants' globals, made in a fixed order ------------------------ */

typedef struct globals_ctx {
  MlirModule m;
  MlirOperation anchor; /* the module's first op: the globals go before it, in order */
  cg_ptrmap made;       /* value attribute -> 1 */
  int n;
} globals_ctx;

static MlirWalkResult globals_cb(MlirOperation op, void *ud) {
  globals_ctx *g = ud;
  if (!cg_op_is(op, "arith.constant")) return MlirWalkResultAdvance;
  MlirType t = mlirValueGetType(mlirOperationGetResult(op, 0));
  MlirAttribute v = mlirOperationGetAttributeByName(op, nova_str("value"));
  if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t) || mlirAttributeIsNull(v) ||
      !mlirAttributeIsAElements(v) || cg_ptrmap_get(&g->made, v.ptr) >= 0)
    return MlirWalkResultAdvance;
  cg_ptrmap_put(&g->made, v.ptr, 1);
  MlirContext ctx = mlirOperationGetContext(op);
  intptr_t rank = mlirShapedTypeGetRank(t);
  int64_t shape[16];
  if (rank > 16) return MlirWalkResultAdvance;
  for (intptr_t i = 0; i < rank; i++) shape[i] = mlirShapedTypeGetDimSize(t, i);
  MlirType mt = mlirMemRefTypeContiguousGet(mlirShapedTypeGetElementType(t), rank, shape, mlirAttributeGetNull());
  char name[48];
  snprintf(name, sizeof name, "__nova_const_%d", g->n++);
  MlirNamedAttribute a[6] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("sym_name")), mlirStringAttrGet(ctx, nova_str(name))),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("sym_visibility")), mlirStringAttrGet(ctx, nova_str("private"))),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("type")), mlirTypeAttrGet(mt)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("initial_value")), v),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("constant")), mlirUnitAttrGet(ctx)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("alignment")),
                            mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), CG_BUFFER_ALIGNMENT))};
  MlirOperationState s = mlirOperationStateGet(nova_str("memref.global"), mlirOperationGetLocation(op));
  mlirOperationStateAddAttributes(&s, 6, a);
  mlirBlockInsertOwnedOperationBefore(mlirModuleGetBody(g->m), g->anchor, mlirOperationCreate(&s));
  return MlirWalkResultAdvance;
}

void cg_constant_globals(MlirModule m) {
  size_t n = 0;
  mlirOperationWalk(mlirModuleGetOperation(m), count_cb, &n, MlirWalkPreOrder);
  globals_ctx g = {m, mlirBlockGetFirstOperation(mlirModuleGetBody(m)), {0}, 0};
  cg_ptrmap_init(&g.made, n);
  mlirOperationWalk(mlirModuleGetOperation(m), globals_cb, &g, MlirWalkPreOrder);
  cg_ptrmap_free(&g.made);
}

/* The entry's tensor arguments as buffers (see codegen.h).  One-shot
 * bufferization drops bufferization.writable from each argument of a
 * function one at a time, and every removal makes a new arg_attrs array
 * of all of them, kept by the context: with one argument per weight, time
 * and memory quadratic in their number (a chain of 8,000 weights: 480 MB). */
static bool is_writable_attr(MlirNamedAttribute x) {
  MlirStringRef nm = mlirIdentifierStr(x.name);
  return nm.length == strlen("bufferization.writable") && !memcmp(nm.data, "bufferization.writable", nm.length);
}

int cg_entry_args_as_buffers(MlirModule m) {
  MlirOperation func = cg_entry_func(m);
  if (mlirOperationIsNull(func)) return 0;
  MlirContext ctx = mlirOperationGetContext(func);
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
  MlirType ft = mlirTypeAttrGetValue(mlirOperationGetAttributeByName(func, nova_str("function_type")));
  intptr_t na = mlirBlockGetNumArguments(fb), nr = mlirFunctionTypeGetNumResults(ft);
  if (na == 0 || mlirFunctionTypeGetNumInputs(ft) != na) return 0;
  MlirAttribute aa = mlirOperationGetAttributeByName(func, nova_str("arg_attrs"));
  if (!mlirAttributeIsNull(aa) && (!mlirAttributeIsAArray(aa) || mlirArrayAttrGetNumElements(aa) != na)) return 0;
  intptr_t most = 0; /* the longest argument dictionary */
  for (intptr_t i = 0; !mlirAttributeIsNull(aa) && i < na; i++) {
    MlirAttribute d = mlirArrayAttrGetElement(aa, i);
    if (mlirAttributeIsADictionary(d) && mlirDictionaryAttrGetNumElements(d) > most)
      most = mlirDictionaryAttrGetNumElements(d);
  }
  MlirType *in = nv_xcalloc((size_t)(na + nr), sizeof *in);
  MlirAttribute *el = nv_xcalloc((size_t)na, sizeof *el);
  MlirNamedAttribute *ent = nv_xcalloc((size_t)most + 1, sizeof *ent);
  if (!in || !el || !ent) {
    free(in);
    free(el);
    free(ent);
    return -1;
  }
  for (intptr_t i = 0; i < nr; i++) in[na + i] = mlirFunctionTypeGetResult(ft, i);
  MlirOperation first = mlirBlockGetFirstOperation(fb);
  MlirLocation loc = mlirOperationGetLocation(func);
  for (intptr_t i = 0; i < na; i++) {
    MlirValue arg = mlirBlockGetArgument(fb, i);
    MlirType t = mlirValueGetType(arg);
    in[i] = t;
    bool writable = true; /* one-shot's default for an argument */
    MlirAttribute d = mlirAttributeIsNull(aa) ? aa : mlirArrayAttrGetElement(aa, i);
    el[i] = d;
    if (!mlirAttributeIsNull(d) && mlirAttributeIsADictionary(d)) {
      intptr_t ne = mlirDictionaryAttrGetNumElements(d), k = 0;
      for (intptr_t e = 0; e < ne; e++) {
        MlirNamedAttribute x = mlirDictionaryAttrGetElement(d, e);
        if (!is_writable_attr(x)) ent[k++] = x;
        else if (mlirAttributeIsABool(x.attribute)) writable = mlirBoolAttrGetValue(x.attribute);
      }
      if (k != ne) el[i] = mlirDictionaryAttrGet(ctx, k, ent);
    }
    if (!mlirTypeIsARankedTensor(t)) continue;
    intptr_t rank = mlirShapedTypeGetRank(t);
    int64_t shape[16];
    if (rank > 16) continue;
    for (intptr_t k = 0; k < rank; k++) shape[k] = mlirShapedTypeGetDimSize(t, k);
    MlirType mt = mlirMemRefTypeContiguousGet(mlirShapedTypeGetElementType(t), rank, shape, mlirAttributeGetNull());
    in[i] = mt;
    mlirValueSetType(arg, mt);
    MlirOperationState st = mlirOperationStateGet(nova_str("bufferization.to_tensor"), loc);
    MlirNamedAttribute at[2] = {
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("restrict")), mlirUnitAttrGet(ctx)),
        mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("writable")), mlirUnitAttrGet(ctx))};
    mlirOperationStateAddOperands(&st, 1, &arg);
    mlirOperationStateAddResults(&st, 1, &t);
    mlirOperationStateAddAttributes(&st, writable ? 2 : 1, at);
    MlirOperation tt = mlirOperationCreate(&st);
    if (mlirOperationIsNull(first)) mlirBlockAppendOwnedOperation(fb, tt);
    else mlirBlockInsertOwnedOperationBefore(fb, first, tt);
    mlirValueReplaceAllUsesExcept(arg, mlirOperationGetResult(tt, 0), 1, &tt);
  }
  mlirOperationSetAttributeByName(func, nova_str("function_type"),
                                  mlirTypeAttrGet(mlirFunctionTypeGet(ctx, na, in, nr, in + na)));
  if (!mlirAttributeIsNull(aa)) mlirOperationSetAttributeByName(func, nova_str("arg_attrs"), mlirArrayAttrGet(ctx, na, el));
  free(in);
  free(el);
  free(ent);
  return 0;
}
