/* remat.c: rematerialization under --memory-limit.
 *
 * Requires: the fused step in linalg on tensors, a memory limit, and the
 * target's pipeline up to the memory plan (a callback).
 * Changes: cheap activations recomputed before their backward uses, until
 * the measured plan fits; cg_plan's remat fields.
 *
 * In the one train_step function an activation lives from the forward op
 * that computes it to its last use in the backward pass.  A cheap one (an
 * elementwise linalg.generic after fusion: gelu's pieces, a scaled or
 * shifted copy, a relu) can instead be computed again just before its
 * backward uses, from operands that are live there anyway (the function's
 * arguments, constants, values the backward uses later still), or that are
 * cheap to recompute in turn (up to REMAT_DEPTH levels).  Its buffer is then
 * free between the forward and the backward.
 *
 * Candidates: every tensor result of such an op whose uses, in op order,
 * have a gap of at least max(16, ops/8) top-level ops: the uses after the
 * gap get the recomputed value.  They are tried largest first.  The peak a
 * set of them gives is measured, not estimated: the target's own pipeline
 * up to the memory plan runs on a copy of the module.  cg_fit_memory adds
 * candidates one at a time, largest first, keeping each only when the
 * measured peak drops (first-fit placement is not monotone), until the plan
 * fits the limit; else it reports the smallest peak it reached.  A value
 * the step returns is no candidate: it is kept to the end anyway.
 * Recomputing performs the same arithmetic on the same values, so the
 * gradients do not change.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "passes.h"

#define REMAT_DEPTH 4

typedef struct cand {
  int op;        /* index of the generic among the entry's top-level ops (unchanged module) */
  int result;
  int64_t bytes;
  int late;      /* index of its first use after the gap */
} cand;

/* top-level ops of the entry function, with a pointer -> index map */
typedef struct body {
  MlirOperation func;
  MlirOperation *ops;
  int n;
  const void **keys;
  int *vals;
  int cap;
} body;

static void body_free(body *b) {
  free(b->ops);
  free(b->keys);
  free(b->vals);
  memset(b, 0, sizeof *b);
}

static size_t hash_ptr(const void *p, int cap) { return ((uintptr_t)p >> 4) * 2654435761u % (size_t)cap; }

static int body_index(body *b, MlirOperation func) {
  body_free(b);
  b->func = func;
  MlirBlock blk = mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
  int cap = 64;
  b->ops = nv_xmalloc(sizeof *b->ops * (size_t)cap);
  for (MlirOperation op = mlirBlockGetFirstOperation(blk); b->ops && !mlirOperationIsNull(op);
       op = mlirOperationGetNextInBlock(op)) {
    if (b->n == cap) {
      MlirOperation *o = nv_xrealloc(b->ops, sizeof *o * (size_t)(cap *= 2));
      if (!o) return -1;
      b->ops = o;
    }
    b->ops[b->n++] = op;
  }
  if (!b->ops) return -1;
  b->cap = 4 * b->n + 16;
  b->keys = nv_xcalloc((size_t)b->cap, sizeof *b->keys);
  b->vals = nv_xcalloc((size_t)b->cap, sizeof *b->vals);
  if (!b->keys || !b->vals) return -1;
  for (int i = 0; i < b->n; i++) {
    size_t h = hash_ptr(b->ops[i].ptr, b->cap);
    while (b->keys[h]) h = (h + 1) % (size_t)b->cap;
    b->keys[h] = b->ops[i].ptr;
    b->vals[h] = i;
  }
  return 0;
}

/* Index of the top-level op holding OP, -1 if outside the entry. */
static int pos_of(const body *b, MlirOperation op) {
  for (;;) {
    MlirOperation p = mlirOperationGetParentOperation(op);
    if (mlirOperationIsNull(p)) return -1;
    if (mlirOperationEqual(p, b->func)) break;
    op = p;
  }
  for (size_t h = hash_ptr(op.ptr, b->cap); b->keys[h]; h = (h + 1) % (size_t)b->cap)
    if (b->keys[h] == op.ptr) return b->vals[h];
  return -1;
}

static void attr_text(MlirStringRef s, void *ud) {
  nv_sbuf *sb = ud;
  nv_sb_printf(sb, "%.*s", (int)s.length, s.data);
}

static int num_inputs(MlirOperation op) {
  MlirAttribute seg = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("operandSegmentSizes"));
  if (mlirAttributeIsNull(seg) || !mlirAttributeIsADenseI32Array(seg)) return -1;
  return mlirDenseI32ArrayGetElement(seg, 0);
}

/* An elementwise linalg.generic: every loop parallel, every output a fresh
 * tensor.empty (the payload computes, it does not accumulate). */
static bool cheap(MlirOperation op) {
  if (!cg_op_is(op, "linalg.generic")) return false;
  MlirAttribute it = mlirOperationGetAttributeByName(op, mlirStringRefCreateFromCString("iterator_types"));
  if (mlirAttributeIsNull(it)) return false;
  nv_sbuf s = {0};
  mlirAttributePrint(it, attr_text, &s);
  bool par = s.s && !s.oom && !strstr(s.s, "reduction");
  nv_sb_free(&s);
  int ni = num_inputs(op);
  if (!par || ni < 0) return false;
  for (intptr_t i = ni; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    if (!mlirValueIsAOpResult(v) || !cg_op_is(mlirOpResultGetOwner(v), "tensor.empty")) return false;
  }
  return mlirOperationGetNumResults(op) > 0;
}

static bool free_value(MlirValue v) {
  if (mlirValueIsABlockArgument(v)) return true;
  MlirOperation d = mlirOpResultGetOwner(v);
  return cg_op_is(d, "arith.constant") || cg_op_is(d, "tensor.empty");
}

/* V is available at top-level position AT: an argument or constant, or
 * defined before AT and used at or after AT anyway. */
static bool available(const body *b, MlirValue v, int at) {
  if (free_value(v)) return true;
  int d = pos_of(b, mlirOpResultGetOwner(v));
  if (d < 0 || d >= at) return false;
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u))
    if (pos_of(b, mlirOpOperandGetOwner(u)) >= at) return true;
  return false;
}

/* Whether GEN's inputs can be had at AT (recomputing cheap ones). */
static bool recomputable(const body *b, MlirOperation gen, int at, int depth) {
  int ni = num_inputs(gen);
  for (int i = 0; i < ni; i++) {
    MlirValue v = mlirOperationGetOperand(gen, i);
    if (available(b, v, at)) continue;
    if (depth >= REMAT_DEPTH || !mlirValueIsAOpResult(v) || !cheap(mlirOpResultGetOwner(v)) ||
        !recomputable(b, mlirOpResultGetOwner(v), at, depth + 1))
      return false;
  }
  return true;
}

/* Clones GEN (and its tensor.empty outputs, and the cheap producers of
 * inputs not available at AT) before BEFORE; returns the clone. */
static MlirOperation clone_at(const body *b, MlirOperation gen, MlirOperation before, int at) {
  MlirBlock blk = mlirOperationGetBlock(before);
  MlirOperation cl = mlirOperationClone(gen);
  /* marked, so that common-subexpression elimination later does not merge
   * the recomputation (or its fresh output) back into the original */
  MlirAttribute unit = mlirUnitAttrGet(mlirOperationGetContext(gen));
  mlirOperationSetDiscardableAttributeByName(cl, mlirStringRefCreateFromCString("nova.remat"), unit);
  int ni = num_inputs(gen);
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(gen); i++) {
    MlirValue v = mlirOperationGetOperand(gen, i);
    if (i >= ni) { /* a fresh output buffer of its own */
      MlirOperation e = mlirOperationClone(mlirOpResultGetOwner(v));
      mlirOperationSetDiscardableAttributeByName(e, mlirStringRefCreateFromCString("nova.remat"), unit);
      mlirBlockInsertOwnedOperationBefore(blk, before, e);
      mlirOperationSetOperand(cl, i, mlirOperationGetResult(e, 0));
    } else if (!available(b, v, at)) {
      MlirOperation p = clone_at(b, mlirOpResultGetOwner(v), before, at);
      mlirOperationSetOperand(cl, i, mlirOperationGetResult(p, mlirOpResultGetResultNumber(v)));
    }
  }
  mlirBlockInsertOwnedOperationBefore(blk, before, cl);
  return cl;
}

/* Position of the first use after the largest gap of RES's uses (>= MINGAP
 * ops after the use before it), -1 if none. */
static int late_point(const body *b, MlirValue res, int def, int mingap) {
  int n = 0, cap = 16;
  int *p = nv_xmalloc(sizeof *p * (size_t)cap);
  if (!p) return -1;
  p[n++] = def;
  for (MlirOpOperand u = mlirValueGetFirstUse(res); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u)) {
    if (cg_op_is(mlirOpOperandGetOwner(u), "func.return")) { /* an output: kept to the end anyway */
      free(p);
      return -1;
    }
    if (n == cap) {
      int *q = nv_xrealloc(p, sizeof *q * (size_t)(cap *= 2));
      if (!q) {
        free(p);
        return -1;
      }
      p = q;
    }
    p[n++] = pos_of(b, mlirOpOperandGetOwner(u));
  }
  for (int i = 1; i < n; i++) /* insertion sort: few uses */
    for (int j = i; j > 0 && p[j] < p[j - 1]; j--) {
      int t = p[j];
      p[j] = p[j - 1];
      p[j - 1] = t;
    }
  int best = -1, gap = mingap - 1;
  for (int i = 1; i < n; i++)
    if (p[i] - p[i - 1] > gap) {
      gap = p[i] - p[i - 1];
      best = p[i];
    }
  /* only the uses after the gap are rewritten: at least one must come before it */
  free(p);
  return best;
}

static int by_bytes(const void *x, const void *y) {
  const cand *a = x, *b = y;
  if (a->bytes != b->bytes) return a->bytes < b->bytes ? 1 : -1;
  return a->op != b->op ? a->op - b->op : a->result - b->result;
}

/* The candidates of M, largest first; -1 when out of memory. */
static int find_candidates(MlirModule m, cand **out) {
  *out = NULL;
  MlirOperation f = cg_entry_func(m);
  if (mlirOperationIsNull(f)) return 0;
  body b = {0};
  if (body_index(&b, f)) {
    body_free(&b);
    return -1;
  }
  int mingap = b.n / 8 > 16 ? b.n / 8 : 16;
  int n = 0, cap = 16;
  cand *c = nv_xmalloc(sizeof *c * (size_t)cap);
  for (int i = 0; c && i < b.n; i++) {
    if (!cheap(b.ops[i])) continue;
    for (intptr_t r = 0; r < mlirOperationGetNumResults(b.ops[i]); r++) {
      MlirValue res = mlirOperationGetResult(b.ops[i], r);
      MlirType t = mlirValueGetType(res);
      if (!mlirTypeIsARankedTensor(t) || !mlirShapedTypeHasStaticShape(t)) continue;
      int late = late_point(&b, res, i, mingap);
      if (late < 0 || !recomputable(&b, b.ops[i], late, 0)) continue;
      if (n == cap) {
        cand *d = nv_xrealloc(c, sizeof *d * (size_t)(cap *= 2));
        if (!d) {
          free(c);
          c = NULL;
          break;
        }
        c = d;
      }
      c[n++] = (cand){i, (int)r, cg_type_bytes(t), late};
    }
  }
  body_free(&b);
  if (!c) return -1;
  qsort(c, (size_t)n, sizeof *c, by_bytes);
  *out = c;
  return n;
}

/* Applies the candidates C[i] with USE[i] (found on an identical module)
 * to M; returns how many were applied, -1 when out of memory. */
static int apply(MlirModule m, const cand *c, const bool *use, int k) {
  MlirOperation f = cg_entry_func(m);
  if (mlirOperationIsNull(f) || k == 0) return 0;
  body b = {0};
  if (body_index(&b, f)) {
    body_free(&b);
    return -1;
  }
  MlirOperation *orig = nv_xmalloc(sizeof *orig * (size_t)b.n);
  if (!orig) {
    body_free(&b);
    return -1;
  }
  memcpy(orig, b.ops, sizeof *orig * (size_t)b.n);
  int norig = b.n, done = 0;
  for (int i = 0; i < k; i++) {
    if (!use[i] || c[i].op >= norig) continue;
    MlirOperation gen = orig[c[i].op];
    if (done > 0 && body_index(&b, f)) {
      done = -1;
      break;
    }
    MlirValue res = mlirOperationGetResult(gen, c[i].result);
    int mingap = b.n / 8 > 16 ? b.n / 8 : 16;
    int late = late_point(&b, res, pos_of(&b, gen), mingap);
    if (late < 0 || !recomputable(&b, gen, late, 0)) continue; /* an earlier one changed its uses */
    MlirOperation cl = clone_at(&b, gen, b.ops[late], late);
    MlirValue nres = mlirOperationGetResult(cl, c[i].result);
    /* the uses at or after the late point take the recomputed value */
    MlirOpOperand u = mlirValueGetFirstUse(res);
    while (!mlirOpOperandIsNull(u)) {
      MlirOpOperand next = mlirOpOperandGetNextUse(u);
      MlirOperation owner = mlirOpOperandGetOwner(u);
      int p = pos_of(&b, owner);
      if (p >= late) mlirOperationSetOperand(owner, mlirOpOperandGetOperandNumber(u), nres);
      u = next;
    }
    done++;
  }
  free(orig);
  body_free(&b);
  return done;
}

/* The peak of M with the candidates CS[i] with USE[i] recomputed: a copy
 * of M through PLAN_FN; -1 when that failed (a diagnostic was given). */
static int64_t trial(nova_ctx *c, const nv_graph *g, MlirModule m, const cand *cs, const bool *use, int k,
                     cg_plan_fn plan_fn, void *ud) {
  MlirModule copy = mlirModuleFromOperation(mlirOperationClone(mlirModuleGetOperation(m)));
  cg_plan p = {0};
  int64_t peak = -1;
  int rc = apply(copy, cs, use, k) < 0 ? -1 : plan_fn(c, g, copy, &p, ud);
  if (rc == 0 && p.planned)
    peak = cg_io_bytes(g, &p) + p.arena_bytes;
  else if (rc >= 0)
    nv_error_plain(c->diag, "--memory-limit: this step's intermediates cannot be planned statically");
  if (getenv("NOVAC_DEBUG_REMAT"))
    fprintf(stderr, "remat: up to candidate %d: peak %lld (arena %lld, %d buffers)\n", k - 1, (long long)peak,
            (long long)p.arena_bytes, p.n);
  cg_plan_free(&p);
  mlirModuleDestroy(copy);
  return peak;
}

int cg_limit_below_state(nv_diag *d, const nv_graph *g, int64_t limit) {
  int64_t kinds[CG_MEM_NKINDS];
  cg_mem_at(g, NULL, -1, kinds); /* what no recomputation changes: said without searching */
  if (limit >= kinds[CG_MEM_PARAMS] + kinds[CG_MEM_OPT_STATE]) return 0;
  char l0[64], p0[64];
  nv_human_bytes(l0, sizeof l0, limit);
  nv_human_bytes(p0, sizeof p0, kinds[CG_MEM_PARAMS] + kinds[CG_MEM_OPT_STATE]);
  nv_error_plain(d, "--memory-limit: the step does not fit in %s: its parameters and optimizer state alone take %s", l0,
                 p0);
  return -1;
}

int cg_fit_memory(nova_ctx *c, const nv_graph *g, MlirModule m, cg_plan_fn plan_fn, void *ud, cg_plan *plan) {
  int64_t limit = plan->memory_limit;
  if (cg_limit_below_state(c->diag, g, limit)) return -1;
  cand *cs = NULL;
  int n = find_candidates(m, &cs);
  if (n < 0) {
    nv_error_plain(c->diag, "out of memory while looking for activations to recompute");
    return -1;
  }
  int rc = -1;
  bool *use = NULL;
  char a[64], b[64], l[64];
  nv_human_bytes(l, sizeof l, limit);
  if (getenv("NOVAC_DEBUG_REMAT"))
    for (int i = 0; i < n; i++)
      fprintf(stderr, "remat: candidate %d: op %d result %d, %lld bytes, late uses from op %d\n", i, cs[i].op,
              cs[i].result, (long long)cs[i].bytes, cs[i].late);
  use = nv_xcalloc((size_t)n + 1, sizeof *use);
  if (!use) {
    nv_error_plain(c->diag, "out of memory while looking for activations to recompute");
    goto out;
  }
  int64_t peak0 = trial(c, g, m, cs, use, 0, plan_fn, ud), best = peak0;
  plan->peak_without_remat = peak0;
  plan->remat_candidates = n;
  if (peak0 < 0) goto out;
  /* greedy, largest first: a candidate is kept when the measured peak drops
   * (first-fit placement is not monotone: recomputing can also raise it) */
  for (int i = 0; i < n && best > limit; i++) {
    use[i] = true;
    int64_t pk = trial(c, g, m, cs, use, i + 1, plan_fn, ud);
    if (pk < 0) goto out;
    if (pk < best)
      best = pk;
    else
      use[i] = false;
  }
  if (best > limit) {
    nv_human_bytes(a, sizeof a, peak0);
    nv_human_bytes(b, sizeof b, best);
    nv_error_plain(c->diag,
                   "--memory-limit: the step does not fit in %s: its planned peak is %s; recomputing cheap "
                   "activations in the backward pass instead of keeping them (%d candidates), the smallest "
                   "peak reached is %s",
                   l, a, n, b);
    goto out;
  }
  int done = apply(m, cs, use, n);
  if (done < 0) {
    nv_error_plain(c->diag, "out of memory while recomputing activations");
    goto out;
  }
  plan->remat_values = done;
  for (int i = 0; i < n; i++) plan->remat_bytes += use[i] ? cs[i].bytes : 0;
  rc = 0;
out:
  free(use);
  free(cs);
  return rc;
}
