/* outline.c: one function per loop nest of the CPU step.
 *
 * After lowering to loops the step is one function of thousands of loop
 * nests, and LLVM's loop passes (IndVarSimplify above all) take time
 * superlinear in a function's size: a 4-layer GPT training step spent
 * minutes there.  Each top-level op with regions (a loop nest, an scf.if)
 * of the entry becomes a private function of its own, called in place and
 * kept out of line (noinline); LLVM then optimizes many small functions.
 * The values a nest uses from outside become arguments: buffers with an
 * identity layout and scalars; constants and views with other layouts
 * (subviews, strided results) are recomputed inside, from their source
 * buffers, so every argument passes as a bare pointer.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "../support/util.h"
#include "codegen.h"

#define MAX_CAPTURE 4096

static bool is_view(MlirOperation op) {
  return cg_op_is(op, "memref.expand_shape") || cg_op_is(op, "memref.collapse_shape") || cg_op_is(op, "memref.subview") ||
         cg_op_is(op, "memref.cast") || cg_op_is(op, "memref.reinterpret_cast") || cg_op_is(op, "memref.view");
}

/* Whether OP lies inside ROOT (or is it). */
static bool inside(MlirOperation op, MlirOperation root) {
  for (; !mlirOperationIsNull(op); op = mlirOperationGetParentOperation(op))
    if (mlirOperationEqual(op, root)) return true;
  return false;
}

typedef struct capture {
  MlirOperation root;     /* the nest being outlined */
  MlirValue v[MAX_CAPTURE];
  int n;
  bool overflow;
} capture;

static void add_unique(capture *c, MlirValue v) {
  for (int i = 0; i < c->n; i++)
    if (mlirValueEqual(c->v[i], v)) return;
  if (c->n == MAX_CAPTURE) {
    c->overflow = true;
    return;
  }
  c->v[c->n++] = v;
}

static MlirWalkResult collect_cb(MlirOperation op, void *ud) {
  capture *c = ud;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    MlirOperation def = mlirValueIsAOpResult(v) ? mlirOpResultGetOwner(v)
                                                : mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v));
    if (!inside(def, c->root)) add_unique(c, v);
  }
  return MlirWalkResultAdvance;
}

/* Values recomputed inside instead of passed: constants, and views whose
 * type a bare pointer cannot carry (a layout other than identity). */
static bool recompute(MlirValue v) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  if (cg_op_is(d, "arith.constant")) return true;
  if (!is_view(d)) return false;
  MlirType t = mlirValueGetType(v);
  return !mlirTypeIsAMemRef(t) || !mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(t));
}

typedef struct vmap {
  MlirValue from[MAX_CAPTURE * 2], to[MAX_CAPTURE * 2];
  int n;
} vmap;

static MlirValue lookup(const vmap *m, MlirValue v) {
  for (int i = 0; i < m->n; i++)
    if (mlirValueEqual(m->from[i], v)) return m->to[i];
  return (MlirValue){NULL};
}

/* The value V stands for inside the outlined function: an argument, or a
 * clone (of a constant or view, its operands mapped the same way) placed
 * before REF in B. */
static MlirValue map_value(vmap *m, MlirValue v, MlirBlock b, MlirOperation ref, int depth) {
  MlirValue got = lookup(m, v);
  if (!mlirValueIsNull(got) || depth > 16 || !recompute(v) || m->n >= MAX_CAPTURE * 2) return got;
  MlirOperation d = mlirOpResultGetOwner(v);
  MlirOperation clone = mlirOperationClone(d);
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(clone); i++) {
    MlirValue o = map_value(m, mlirOperationGetOperand(clone, i), b, ref, depth + 1);
    if (mlirValueIsNull(o)) {
      mlirOperationDestroy(clone);
      return o;
    }
    mlirOperationSetOperand(clone, i, o);
  }
  mlirBlockInsertOwnedOperationBefore(b, ref, clone);
  for (intptr_t r = 0; r < mlirOperationGetNumResults(clone); r++) {
    m->from[m->n] = mlirOperationGetResult(d, r);
    m->to[m->n++] = mlirOperationGetResult(clone, r);
  }
  return lookup(m, v);
}

typedef struct remap {
  const vmap *m;
} remap;

static MlirWalkResult remap_cb(MlirOperation op, void *ud) {
  const vmap *m = ((remap *)ud)->m;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue to = lookup(m, mlirOperationGetOperand(op, i));
    if (!mlirValueIsNull(to)) mlirOperationSetOperand(op, i, to);
  }
  return MlirWalkResultAdvance;
}

/* The roots a recomputed value needs (the arguments), into ARGS. */
static void roots(capture *args, MlirValue v, int depth) {
  if (!recompute(v) || depth > 16) {
    add_unique(args, v);
    return;
  }
  MlirOperation d = mlirOpResultGetOwner(v);
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(d); i++) roots(args, mlirOperationGetOperand(d, i), depth + 1);
}

/* Whether NEST's outermost loop may be shared out between threads
 * (parallel.c): a tile loop over a parallel dimension (cpu_tile.c marks
 * it nova.par), or an elementwise-like linalg.generic whose first
 * dimension is parallel, and enough data that a split pays for the
 * threads' wake-up: the memrefs it takes, summed, at least
 * CG_PAR_MIN_BYTES. */
static bool parallel_nest(MlirOperation nest, const capture *args) {
  bool par = false;
  if (cg_op_is(nest, "scf.for")) {
    par = !mlirAttributeIsNull(mlirOperationGetAttributeByName(nest, nova_str("nova.par")));
  } else if (cg_op_is(nest, "linalg.generic")) {
    MlirAttribute it = mlirOperationGetAttributeByName(nest, nova_str("iterator_types"));
    if (!mlirAttributeIsNull(it) && mlirAttributeIsAArray(it) && mlirArrayAttrGetNumElements(it) > 0) {
      nv_sbuf sb = {0};
      mlirAttributePrint(mlirArrayAttrGetElement(it, 0), cg_print_to_sbuf, &sb);
      par = sb.s && strstr(sb.s, "parallel");
      nv_sb_free(&sb);
    }
  }
  int64_t bytes = 0;
  for (int i = 0; par && i < args->n; i++) {
    MlirType t = mlirValueGetType(args->v[i]);
    if (mlirTypeIsAVector(t)) return false; /* parallel.c passes scalars and buffers only */
    if (mlirTypeIsAMemRef(t) && mlirShapedTypeHasStaticShape(t)) bytes += cg_type_bytes(t);
  }
  return par && bytes >= CG_PAR_MIN_BYTES;
}

/* Outlines NEST (a top-level op of the entry) into @NAME; 0 or -1 (the nest
 * is then left in place). */
static int outline_one(MlirModule m, MlirOperation nest, const char *name, capture *cap, capture *args, vmap *vm,
                       MlirOperation *fn_out, MlirOperation *call_out) {
  MlirContext ctx = mlirOperationGetContext(nest);
  cap->root = nest;
  cap->n = 0;
  cap->overflow = false;
  mlirOperationWalk(nest, collect_cb, cap, MlirWalkPreOrder);
  args->n = 0;
  args->overflow = false;
  for (int i = 0; i < cap->n; i++) roots(args, cap->v[i], 0);
  if (cap->overflow || args->overflow) return -1;
  for (int i = 0; i < args->n; i++) {
    MlirType t = mlirValueGetType(args->v[i]);
    if (mlirTypeIsAMemRef(t) && !mlirAffineMapIsIdentity(mlirMemRefTypeGetAffineMap(t))) return -1;
    if (!mlirTypeIsAMemRef(t) && !mlirTypeIsAIndex(t) && !mlirTypeIsAInteger(t) && !mlirTypeIsAFloat(t) &&
        !mlirTypeIsAVector(t))
      return -1;
  }
  MlirType *types = nv_xcalloc((size_t)args->n + 1, sizeof *types);
  MlirLocation *locs = nv_xcalloc((size_t)args->n + 1, sizeof *locs);
  if (!types || !locs) {
    free(types);
    free(locs);
    return -1;
  }
  MlirLocation loc = mlirOperationGetLocation(nest);
  for (int i = 0; i < args->n; i++) types[i] = mlirValueGetType(args->v[i]), locs[i] = loc;
  MlirBlock body = mlirBlockCreate(args->n, types, locs);
  MlirRegion region = mlirRegionCreate();
  mlirRegionAppendOwnedBlock(region, body);
  MlirOperationState rs = mlirOperationStateGet(nova_str("func.return"), loc);
  MlirOperation ret = mlirOperationCreate(&rs);
  mlirBlockAppendOwnedOperation(body, ret);
  MlirAttribute passthrough = mlirArrayAttrGet(ctx, 1, (MlirAttribute[]){mlirStringAttrGet(ctx, nova_str("noinline"))});
  MlirNamedAttribute fa[4] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("sym_name")), mlirStringAttrGet(ctx, nova_str(name))),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("function_type")),
                            mlirTypeAttrGet(mlirFunctionTypeGet(ctx, args->n, types, 0, NULL))),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("sym_visibility")), mlirStringAttrGet(ctx, nova_str("private"))),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("passthrough")), passthrough)};
  MlirOperationState fs = mlirOperationStateGet(nova_str("func.func"), loc);
  mlirOperationStateAddAttributes(&fs, 4, fa);
  mlirOperationStateAddOwnedRegions(&fs, 1, &region);
  MlirOperation fn = mlirOperationCreate(&fs);
  if (parallel_nest(nest, args))
    mlirOperationSetDiscardableAttributeByName(fn, nova_str("nova.parallel"), mlirUnitAttrGet(ctx));
  mlirBlockAppendOwnedOperation(mlirModuleGetBody(m), fn);
  /* the call, where the nest was */
  MlirOperation call = cg_insert_call(nest, loc, mlirFlatSymbolRefAttrGet(ctx, nova_str(name)), args->n, args->v, 0, NULL);
  *fn_out = fn;
  *call_out = call;
  /* the nest, its outside values mapped to arguments and clones */
  vm->n = 0;
  for (int i = 0; i < args->n; i++) {
    vm->from[vm->n] = args->v[i];
    vm->to[vm->n++] = mlirBlockGetArgument(body, i);
  }
  mlirOperationMoveBefore(nest, ret);
  int rc = 0;
  for (int i = 0; i < cap->n && !rc; i++)
    if (mlirValueIsNull(map_value(vm, cap->v[i], body, nest, 0))) rc = -1;
  remap r = {vm};
  mlirOperationWalk(nest, remap_cb, &r, MlirWalkPreOrder);
  free(types);
  free(locs);
  return rc;
}

/* ---- one function per distinct nest -------------------------------------
 * The layers of a model repeat: their nests are the same code on other
 * buffers.  Functions whose text is equal but for their name are kept
 * once, every call going to the first (a 4-layer GPT step: 656 functions,
 * 131 distinct), which divides LLVM's work accordingly. */

typedef struct part {
  MlirOperation fn, call;
  char name[48];
  uint64_t *tok;  /* the function's structure (fingerprint below) */
  size_t ntok;
  uint64_t hash;
} part;

static void fingerprint(part *p) {
  cg_fingerprint(p->fn, NULL, NULL, &p->tok, &p->ntok);
  p->hash = nv_fnv1a64(1469598103934665603ull, p->tok, p->ntok * sizeof *p->tok);
}

static void dedupe(MlirContext ctx, part *p, int n) {
  for (int i = 0; i < n; i++) fingerprint(&p[i]);
  /* the first part of each structure, by hash (open addressing; slot = index + 1) */
  size_t cap = 16;
  while (cap < 2 * (size_t)n + 2) cap *= 2;
  int *first = nv_xcalloc(cap, sizeof *first);
  for (int i = 0; i < n; i++) {
    size_t h = (size_t)p[i].hash & (cap - 1);
    for (; first[h]; h = (h + 1) & (cap - 1)) {
      const part *q = &p[first[h] - 1];
      if (q->hash == p[i].hash && q->ntok == p[i].ntok && !memcmp(q->tok, p[i].tok, q->ntok * sizeof *q->tok)) break;
    }
    if (!first[h]) {
      first[h] = i + 1;
      continue;
    }
    if (mlirOperationIsNull(p[i].call)) continue; /* its calls are not known here: kept */
    const part *q = &p[first[h] - 1];
    mlirOperationSetAttributeByName(p[i].call, nova_str("callee"), mlirFlatSymbolRefAttrGet(ctx, nova_str(q->name)));
    mlirOperationDestroy(p[i].fn);
    p[i].fn = (MlirOperation){NULL};
  }
  free(first);
  for (int i = 0; i < n; i++) free(p[i].tok);
}

/* ---- runs of straight-line code ------------------------------------------
 * A register-tiled matmul leaves its tile as straight-line vector code in
 * the entry: a read of C, a K loop that carries the tile in registers (an
 * op with results), a write of C.  Each maximal run of such ops that come
 * from one source op (one location) and whose values nothing after the run
 * uses is wrapped in an scf.execute_region without results, which is then
 * outlined like a loop nest.  Without it the entry kept thousands of loops,
 * and lowering SCF to branches splits the entry's block once per loop,
 * moving everything after it each time: time quadratic in the step. */

static bool stays_in_entry(MlirOperation op) {
  return cg_op_is(op, "arith.constant") || cg_op_is(op, "func.call") || cg_op_is(op, "func.return") ||
         cg_op_is(op, "memref.alloc") || cg_op_is(op, "memref.alloca") || cg_op_is(op, "memref.dealloc") ||
         cg_op_is(op, "memref.view") || cg_op_is(op, "memref.subview") || cg_op_is(op, "memref.expand_shape") ||
         cg_op_is(op, "memref.collapse_shape") || cg_op_is(op, "memref.cast") ||
         cg_op_is(op, "memref.reinterpret_cast") || cg_op_is(op, "ub.poison") ||
         (mlirOperationGetNumRegions(op) > 0 && mlirOperationGetNumResults(op) == 0); /* a nest: outlined alone */
}

/* Whether a result of an op in [first, end) is used outside it. */
static bool escapes(MlirOperation first, MlirOperation end) {
  for (MlirOperation op = first; !mlirOperationEqual(op, end); op = mlirOperationGetNextInBlock(op))
    for (intptr_t r = 0; r < mlirOperationGetNumResults(op); r++)
      for (MlirOpOperand u = mlirValueGetFirstUse(mlirOperationGetResult(op, r)); !mlirOpOperandIsNull(u);
           u = mlirOpOperandGetNextUse(u)) {
        MlirOperation user = mlirOpOperandGetOwner(u);
        while (!mlirOperationIsNull(user) && !mlirBlockEqual(mlirOperationGetBlock(user), mlirOperationGetBlock(first)))
          user = mlirOperationGetParentOperation(user);
        bool in = false;
        for (MlirOperation q = first; !in && !mlirOperationEqual(q, end); q = mlirOperationGetNextInBlock(q))
          in = mlirOperationEqual(q, user);
        if (!in) return true;
      }
  return false;
}

/* [first, end) moved into an scf.execute_region placed where they were. */
static void wrap(MlirBlock b, MlirOperation first, MlirOperation end) {
  MlirLocation loc = mlirOperationGetLocation(first);
  MlirBlock body = mlirBlockCreate(0, NULL, NULL);
  MlirRegion region = mlirRegionCreate();
  mlirRegionAppendOwnedBlock(region, body);
  MlirOperationState ys = mlirOperationStateGet(nova_str("scf.yield"), loc);
  MlirOperation yield = mlirOperationCreate(&ys);
  mlirBlockAppendOwnedOperation(body, yield);
  MlirOperationState es = mlirOperationStateGet(nova_str("scf.execute_region"), loc);
  mlirOperationStateAddOwnedRegions(&es, 1, &region);
  MlirOperation er = mlirOperationCreate(&es);
  mlirBlockInsertOwnedOperationBefore(b, first, er);
  for (MlirOperation op = first, next; !mlirOperationEqual(op, end); op = next) {
    next = mlirOperationGetNextInBlock(op);
    mlirOperationMoveBefore(op, yield);
  }
}

static void wrap_runs(MlirBlock b) {
  for (MlirOperation op = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(op);) {
    if (stays_in_entry(op)) {
      op = mlirOperationGetNextInBlock(op);
      continue;
    }
    MlirLocation loc = mlirOperationGetLocation(op);
    MlirOperation end = mlirOperationGetNextInBlock(op);
    bool nest = mlirOperationGetNumRegions(op) > 0;
    int n = 1;
    while (!mlirOperationIsNull(end) && !stays_in_entry(end) && mlirLocationEqual(mlirOperationGetLocation(end), loc)) {
      nest |= mlirOperationGetNumRegions(end) > 0;
      end = mlirOperationGetNextInBlock(end), n++;
    }
    if (mlirOperationIsNull(end)) break; /* the terminator stays */
    if (nest && n > 1 && !escapes(op, end)) wrap(b, op, end);
    op = end;
  }
}

typedef struct outliner {
  MlirModule m;
  capture *cap, *args;
  vmap *vm;
  part *parts;
  int np, cp, k;
} outliner;

/* The nests of FN's body outlined (parts appended to O); 0 or -1. */
static int outline_func(nova_ctx *c, outliner *o, MlirOperation fn) {
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
  wrap_runs(fb);
  for (MlirOperation op = mlirBlockGetFirstOperation(fb); !mlirOperationIsNull(op);) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    if (mlirOperationGetNumRegions(op) > 0 && mlirOperationGetNumResults(op) == 0) {
      if (o->np == o->cp) o->parts = nv_xrealloc(o->parts, sizeof *o->parts * (size_t)(o->cp = o->cp ? 2 * o->cp : 64));
      part *pt = &o->parts[o->np];
      memset(pt, 0, sizeof *pt);
      snprintf(pt->name, sizeof pt->name, "nova_part_%d", o->k++);
      if (getenv("NOVAC_DEBUG_OUTLINE")) { /* which source op each function computes (for perf) */
        nv_sbuf l = {0};
        mlirLocationPrint(mlirOperationGetLocation(op), cg_print_to_sbuf, &l);
        fprintf(stderr, "novac: %s: %s\n", pt->name, l.s ? l.s : "?");
        nv_sb_free(&l);
        if (getenv("NOVAC_DEBUG_OUTLINE_OPS")) {
          mlirOperationPrint(op, cg_print_to_sbuf, &l);
          fprintf(stderr, "%s\n", l.s ? l.s : "?");
          nv_sb_free(&l);
        }
      }
      if (outline_one(o->m, op, pt->name, o->cap, o->args, o->vm, &pt->fn, &pt->call)) {
        nv_error_plain(c->diag, "internal: cannot outline loop nest %d of the step", o->k - 1);
        return -1;
      }
      o->np++;
    }
    op = next;
  }
  return 0;
}

/* The parts that dedupe kept (a function of their own), first N of O's. */
static int kept_parts(outliner *o, int n) {
  int j = 0;
  for (int i = 0; i < n; i++)
    if (!mlirOperationIsNull(o->parts[i].fn)) o->parts[j++] = o->parts[i];
  memmove(&o->parts[j], &o->parts[n], sizeof *o->parts * (size_t)(o->np - n));
  o->np -= n - j;
  return j;
}

int cg_outline_nests(nova_ctx *c, MlirModule m) {
  MlirOperation entry = cg_entry_func(m);
  if (mlirOperationIsNull(entry)) return 0;
  outliner o = {m, nv_xmalloc(sizeof *o.cap), nv_xmalloc(sizeof *o.args), nv_xmalloc(sizeof *o.vm), NULL, 0, 0, 0};
  MlirContext ctx = mlirOperationGetContext(entry);
  bool dedup = !getenv("NOVAC_NO_DEDUPE");
  int rc = 0;
  /* the nests of each called kernel (kernel_once.c) once; their calls,
   * deduplicated, are then what each call of the kernel becomes; then
   * the entry's own nests.  The kernels' parts are deduplicated again with
   * the entry's, their calls gone with the kernels (null). */
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !rc && !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    if (cg_is_tiled_kernel(f)) rc = outline_func(c, &o, f);
  int nk = o.np;
  if (!rc && nk) {
    if (dedup) dedupe(ctx, o.parts, nk);
    cg_tiled_inline_all(m);
    nk = kept_parts(&o, nk);
    for (int i = 0; i < nk; i++) o.parts[i].call = (MlirOperation){NULL};
  }
  if (!rc) rc = outline_func(c, &o, entry);
  if (!rc && dedup) dedupe(ctx, o.parts, o.np);
  free(o.parts);
  free(o.cap);
  free(o.args);
  free(o.vm);
  return rc;
}
