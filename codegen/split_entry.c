/* split_entry.c: the CPU step's entry cut into straight-line pieces.
 *
 * Once every loop nest is outlined (outline.c), the entry is a long run of
 * calls, views of the arena and constants: three calls per statement of a
 * chain, tens of thousands in a large model.  LLVM's function passes and
 * its code generation take time superlinear in one function's size (a
 * 16,000-statement chain: 2.5 s at 8,000, 6.3 s at 16,000).
 *
 * Requires: the entry after outlining and cg_parallel_calls (memref IR,
 * before the lowering to LLVM).
 * Does: moves the views and constants that depend only on the entry's
 * arguments (and on each other) to its top, one of each alike kind; then
 * cuts the rest into consecutive pieces of about CG_PIECE_OPS ops (fewer
 * where a piece would take more than CG_PIECE_ARGS values from before it)
 * where nothing a piece defines is used after it, and moves each piece
 * into a private noinline function @__nova_seg_K called in its place.  A
 * piece recomputes the views and constants it uses (from the entry's
 * arguments it receives); every other value it uses is passed, which the
 * bare-pointer convention allows for scalars and identity-layout memrefs
 * only: a piece that would need another is left in the entry, as is one
 * that frees a buffer it is passed.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "codegen.h"

#define CG_PIECE_OPS 256
/* a call passes its arguments past the sixth on the stack, and LLVM's
 * instruction scheduler takes time quadratic in the stores of one call
 * (a 2,000-statement training chain with a weight each: pieces of 500
 * arguments, 5.3 s of code generation) */
#define CG_PIECE_ARGS 64

static bool movable_kind(MlirOperation op) {
  return mlirOperationGetNumRegions(op) == 0 &&
         (cg_op_is(op, "arith.constant") || cg_op_is(op, "ub.poison") || cg_op_is(op, "memref.view") ||
          cg_op_is(op, "memref.subview") || cg_op_is(op, "memref.expand_shape") ||
          cg_op_is(op, "memref.collapse_shape") || cg_op_is(op, "memref.cast") ||
          cg_op_is(op, "memref.reinterpret_cast"));
}

typedef struct entry {
  MlirBlock block;
  cg_ptrmap hoisted; /* ops moved to the top (recomputed in the pieces) -> 1 */
  cg_ptrmap pos;     /* the other top-level ops -> position; the terminator -> n */
  MlirOperation *ops;
  int n;
} entry;

static bool is_hoisted_value(const entry *e, MlirValue v) {
  return mlirValueIsAOpResult(v) && cg_ptrmap_get(&e->hoisted, mlirOpResultGetOwner(v).ptr) >= 0;
}

/* The position of the top-level op that holds OP; -1 if none or hoisted. */
static int pos_of(const entry *e, MlirOperation op) {
  while (!mlirOperationIsNull(op) && !mlirBlockEqual(mlirOperationGetBlock(op), e->block))
    op = mlirOperationGetParentOperation(op);
  return mlirOperationIsNull(op) ? -1 : cg_ptrmap_get(&e->pos, op.ptr);
}

/* Whether a bare pointer (or a scalar) carries V. */
static bool passable(MlirValue v) {
  MlirType t = mlirValueGetType(v);
  if (mlirTypeIsAIndex(t) || mlirTypeIsAInteger(t) || mlirTypeIsAFloat(t)) return true;
  return mlirTypeIsAMemRef(t) && mlirShapedTypeHasStaticShape(t) &&
         mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(t));
}

/* ---- one piece ---------------------------------------------------------- */

typedef struct piece {
  const entry *e;
  int start, end;
  MlirValue *in;     /* passed */
  int nin, capin;
  MlirOperation *re; /* hoisted ops recomputed, in the entry's order */
  int nre, capre;
  cg_ptrmap seen;    /* values and hoisted ops taken */
  bool bad;
} piece;

static void take(piece *p, MlirValue v);

static void take_op(piece *p, MlirOperation d) {
  if (cg_ptrmap_get(&p->seen, d.ptr) >= 0) return;
  cg_ptrmap_put(&p->seen, d.ptr, 1);
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(d); i++) take(p, mlirOperationGetOperand(d, i));
  if (p->nre == p->capre) {
    p->capre = p->capre ? 2 * p->capre : 32;
    p->re = nv_xrealloc(p->re, (size_t)p->capre * sizeof *p->re);
  }
  p->re[p->nre++] = d;
}

static void take(piece *p, MlirValue v) {
  if (is_hoisted_value(p->e, v)) {
    take_op(p, mlirOpResultGetOwner(v));
    return;
  }
  MlirOperation site = mlirValueIsAOpResult(v) ? mlirOpResultGetOwner(v)
                                               : mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v));
  int at = pos_of(p->e, site); /* -1 for the entry's own arguments */
  if (at >= p->start && at < p->end) return; /* made inside */
  if (cg_ptrmap_get(&p->seen, v.ptr) >= 0) return;
  cg_ptrmap_put(&p->seen, v.ptr, 1);
  if (!passable(v)) p->bad = true;
  if (p->nin == p->capin) {
    p->capin = p->capin ? 2 * p->capin : 32;
    p->in = nv_xrealloc(p->in, (size_t)p->capin * sizeof *p->in);
  }
  p->in[p->nin++] = v;
}

static MlirWalkResult take_cb(MlirOperation op, void *ud) {
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) take(ud, mlirOperationGetOperand(op, i));
  return MlirWalkResultAdvance;
}

typedef struct frees_ctx {
  const piece *p;
  bool frees_passed;
} frees_ctx;

static MlirWalkResult frees_cb(MlirOperation op, void *ud) {
  frees_ctx *c = ud;
  if (cg_op_is(op, "memref.dealloc")) {
    MlirValue v = mlirOperationGetOperand(op, 0);
    for (int i = 0; i < c->p->nin; i++)
      if (mlirValueEqual(c->p->in[i], v)) c->frees_passed = true;
  }
  return MlirWalkResultAdvance;
}

static MlirWalkResult count_cb(MlirOperation op, void *ud) {
  *(size_t *)ud += (size_t)mlirOperationGetNumOperands(op) + 1;
  return MlirWalkResultAdvance;
}

/* Moves ops [start, end) into @NAME; false (nothing changed) if a value it
 * uses cannot be passed, or it frees a buffer it would be passed. */
static bool split_piece(MlirModule m, const entry *e, int start, int end, const char *name) {
  size_t operands = 0;
  for (int i = start; i < end; i++) mlirOperationWalk(e->ops[i], count_cb, &operands, MlirWalkPreOrder);
  piece p = {.e = e, .start = start, .end = end};
  cg_ptrmap_init(&p.seen, 2 * operands);
  for (int i = start; i < end; i++) mlirOperationWalk(e->ops[i], take_cb, &p, MlirWalkPreOrder);
  frees_ctx fc = {&p, false};
  for (int i = start; i < end && !p.bad; i++) mlirOperationWalk(e->ops[i], frees_cb, &fc, MlirWalkPreOrder);
  bool ok = !p.bad && !fc.frees_passed;
  if (ok) {
    MlirOperation first = e->ops[start];
    MlirContext ctx = mlirOperationGetContext(first);
    MlirLocation loc = mlirOperationGetLocation(first);
    MlirType *tin = nv_xcalloc((size_t)p.nin + 1, sizeof *tin);
    for (int i = 0; i < p.nin; i++) tin[i] = mlirValueGetType(p.in[i]);
    MlirOperation ret;
    MlirOperation fn = cg_make_func(ctx, loc, name, p.nin, tin, 0, NULL, &ret);
    MlirAttribute noinline = mlirArrayAttrGet(ctx, 1, (MlirAttribute[]){mlirStringAttrGet(ctx, nova_str("noinline"))});
    mlirOperationSetAttributeByName(fn, nova_str("passthrough"), noinline);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(m), fn);
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
    cg_insert_call(first, loc, mlirFlatSymbolRefAttrGet(ctx, nova_str(name)), p.nin, p.in, 0, NULL);
    /* inside: the arguments, then clones of the hoisted ops, then the piece */
    size_t nmap = (size_t)p.nin;
    for (int i = 0; i < p.nre; i++) nmap += (size_t)mlirOperationGetNumResults(p.re[i]);
    MlirValue *to = nv_xcalloc(nmap + 1, sizeof *to);
    cg_ptrmap map;
    cg_ptrmap_init(&map, nmap);
    int k = 0;
    for (int i = 0; i < p.nin; i++) {
      cg_ptrmap_put(&map, p.in[i].ptr, k);
      to[k++] = mlirBlockGetArgument(body, i);
    }
    cg_remap rc = {&map, to};
    for (int i = 0; i < p.nre; i++) {
      MlirOperation clone = mlirOperationClone(p.re[i]);
      mlirBlockInsertOwnedOperationBefore(body, ret, clone);
      cg_remap_cb(clone, &rc);
      for (intptr_t r = 0; r < mlirOperationGetNumResults(clone); r++) {
        cg_ptrmap_put(&map, mlirOperationGetResult(p.re[i], r).ptr, k);
        to[k++] = mlirOperationGetResult(clone, r);
      }
    }
    for (int i = start; i < end; i++) {
      mlirOperationMoveBefore(e->ops[i], ret);
      mlirOperationWalk(e->ops[i], cg_remap_cb, &rc, MlirWalkPreOrder);
    }
    cg_ptrmap_free(&map);
    free(to);
    free(tin);
  }
  cg_ptrmap_free(&p.seen);
  free(p.in);
  free(p.re);
  return ok;
}

/* ---- the entry ---------------------------------------------------------- */

/* ---- alike hoisted ops -----------------------------------------------------
 * The memory plan gives each use of a buffer its own view of the arena: a
 * chain's entry holds two views per statement of the same two offsets.
 * Hoisted ops are pure, so two of the same name, operands, attributes and
 * result types are one value: the later is replaced by the earlier (which
 * is above it), and each piece recomputes a few views instead of one per
 * use (a 16,000-statement chain's LLVM IR: 630,000 -> 297,000 lines from
 * this alone). */

static uint64_t mix(uint64_t h, const void *p) {
  h ^= (uint64_t)(uintptr_t)p;
  return h * 0x100000001b3ull;
}

static uint64_t alike_key(MlirOperation op) {
  uint64_t h = mix(0xcbf29ce484222325ull, mlirOperationGetName(op).ptr);
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) h = mix(h, mlirOperationGetOperand(op, i).ptr);
  for (intptr_t i = 0; i < mlirOperationGetNumResults(op); i++)
    h = mix(h, mlirValueGetType(mlirOperationGetResult(op, i)).ptr);
  for (intptr_t i = 0; i < mlirOperationGetNumAttributes(op); i++) {
    MlirNamedAttribute a = mlirOperationGetAttribute(op, i);
    h = mix(mix(h, a.name.ptr), a.attribute.ptr);
  }
  return h | 1; /* never the empty key */
}

static bool alike(MlirOperation a, MlirOperation b) {
  intptr_t n = mlirOperationGetNumOperands(a), r = mlirOperationGetNumResults(a), k = mlirOperationGetNumAttributes(a);
  if (!mlirIdentifierEqual(mlirOperationGetName(a), mlirOperationGetName(b)) || n != mlirOperationGetNumOperands(b) ||
      r != mlirOperationGetNumResults(b) || k != mlirOperationGetNumAttributes(b))
    return false;
  for (intptr_t i = 0; i < n; i++)
    if (!mlirValueEqual(mlirOperationGetOperand(a, i), mlirOperationGetOperand(b, i))) return false;
  for (intptr_t i = 0; i < r; i++)
    if (!mlirTypeEqual(mlirValueGetType(mlirOperationGetResult(a, i)), mlirValueGetType(mlirOperationGetResult(b, i))))
      return false;
  for (intptr_t i = 0; i < k; i++) {
    MlirNamedAttribute x = mlirOperationGetAttribute(a, i), y = mlirOperationGetAttribute(b, i);
    if (!mlirIdentifierEqual(x.name, y.name) || !mlirAttributeEqual(x.attribute, y.attribute)) return false;
  }
  return true;
}

/* OP is hoisted: the earlier alike op in *FIRST (by key, into OPS) takes its
 * uses and OP is erased (true), or OP is recorded. */
static bool merge_alike(cg_ptrmap *first, MlirOperation *ops, int *nops, MlirOperation op) {
  const void *key = (const void *)(uintptr_t)alike_key(op);
  int at = cg_ptrmap_get(first, key);
  if (at >= 0 && alike(ops[at], op)) {
    for (intptr_t i = 0; i < mlirOperationGetNumResults(op); i++)
      mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(op, i), mlirOperationGetResult(ops[at], i));
    mlirOperationDestroy(op);
    return true;
  }
  if (at < 0) { /* a key taken by an unlike op (a collision) keeps that one */
    cg_ptrmap_put(first, key, *nops);
    ops[(*nops)++] = op;
  }
  return false;
}

static bool operands_hoisted(const entry *e, MlirOperation op) {
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    if (mlirValueIsAOpResult(v) ? !is_hoisted_value(e, v) : !mlirBlockEqual(mlirBlockArgumentGetOwner(v), e->block))
      return false;
  }
  return true;
}

int cg_split_entry(nova_ctx *c, MlirModule m) {
  (void)c;
  MlirOperation f = cg_entry_func(m);
  if (mlirOperationIsNull(f) || getenv("NOVAC_NO_SPLIT_ENTRY")) return 0;
  entry e = {.block = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0))};
  size_t total = 0;
  for (MlirOperation op = mlirBlockGetFirstOperation(e.block); !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op))
    total++;
  if (total <= 2 * CG_PIECE_OPS) return 0;
  cg_ptrmap_init(&e.hoisted, total);
  cg_ptrmap_init(&e.pos, total);
  e.ops = nv_xcalloc(total + 1, sizeof *e.ops);
  /* views and constants of the arguments to the top, in order */
  MlirOperation anchor = mlirBlockGetFirstOperation(e.block);
  cg_ptrmap first;
  cg_ptrmap_init(&first, total);
  MlirOperation *kept = nv_xcalloc(total + 1, sizeof *kept);
  int nkept = 0;
  for (MlirOperation op = anchor, next; !mlirOperationIsNull(op); op = next) {
    next = mlirOperationGetNextInBlock(op);
    if (movable_kind(op) && operands_hoisted(&e, op)) {
      bool was_anchor = mlirOperationEqual(op, anchor);
      if (merge_alike(&first, kept, &nkept, op)) {
        if (was_anchor) anchor = next;
        continue;
      }
      cg_ptrmap_put(&e.hoisted, op.ptr, 1);
      if (was_anchor) anchor = next;
      else mlirOperationMoveBefore(op, anchor);
    }
  }
  cg_ptrmap_free(&first);
  free(kept);
  for (MlirOperation op = anchor; !mlirOperationIsNull(op); op = mlirOperationGetNextInBlock(op)) {
    cg_ptrmap_put(&e.pos, op.ptr, e.n);
    e.ops[e.n++] = op;
  }
  int n = e.n - 1; /* the terminator stays */
  /* the last position using each op's results */
  int *last = nv_xcalloc((size_t)n + 1, sizeof *last);
  for (int i = 0; i < n; i++) {
    last[i] = i;
    for (intptr_t r = 0; r < mlirOperationGetNumResults(e.ops[i]); r++)
      for (MlirOpOperand u = mlirValueGetFirstUse(mlirOperationGetResult(e.ops[i], r)); !mlirOpOperandIsNull(u);
           u = mlirOpOperandGetNextUse(u)) {
        int j = pos_of(&e, mlirOpOperandGetOwner(u));
        if (j < 0) j = n; /* a user that is not in the entry's body: never cut around it */
        if (j > last[i]) last[i] = j;
      }
  }
  /* the values each piece takes from before it, counted as it grows */
  size_t nuses = 0;
  for (int i = 0; i < n; i++) nuses += (size_t)mlirOperationGetNumOperands(e.ops[i]);
  cg_ptrmap taken;
  cg_ptrmap_init(&taken, nuses);
  int pieces = 0, start = 0, reach = -1, args = 0;
  for (int i = 0; i <= n; i++) {
    if ((i - start >= CG_PIECE_OPS || args >= CG_PIECE_ARGS) && reach < i &&
        (n - i >= CG_PIECE_OPS / 4 || i == n)) {
      char name[48];
      snprintf(name, sizeof name, CG_SEG_PREFIX "%d", pieces);
      if (split_piece(m, &e, start, i, name)) pieces++;
      start = i;
      reach = -1;
      args = 0;
    }
    if (i == n) break;
    if (last[i] > reach) reach = last[i];
    for (intptr_t k = 0; k < mlirOperationGetNumOperands(e.ops[i]); k++) {
      MlirValue v = mlirOperationGetOperand(e.ops[i], k);
      int d = mlirValueIsAOpResult(v) ? pos_of(&e, mlirOpResultGetOwner(v)) : -1;
      if (d < start && cg_ptrmap_get(&taken, v.ptr) != start) {
        cg_ptrmap_put(&taken, v.ptr, start);
        args++;
      }
    }
  }
  cg_ptrmap_free(&taken);
  if (getenv("NOVAC_DEBUG_PIPELINES")) fprintf(stderr, "novac: the entry in %d pieces\n", pieces);
  free(last);
  free(e.ops);
  cg_ptrmap_free(&e.hoisted);
  cg_ptrmap_free(&e.pos);
  return 0;
}
