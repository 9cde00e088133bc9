/* gpu_reduce.c: reductions split in two for the GPU (the cuda target's
 * split-reduce stage, linalg on tensors after fusion).
 *
 * The GPU mapping (cuda.c) runs one thread per output point with the
 * reduction as a loop inside it.  For a row reduction (softmax's max and
 * sum, layer norm's moments, a cross-entropy's log-sum-exp: the reduced
 * loop innermost, contiguous in memory) the 32 threads of a warp then read
 * 32 rows, a cache line each per step, and a few thousand rows occupy a few
 * SMs; for a column reduction (a bias's or a norm weight's gradient: the
 * sum over every token, the reduced loop outermost) there are only as many
 * threads as columns (768), each summing 8192 values.
 *
 * Each such linalg.generic (one output, one reduction loop of static size
 * K, the output indexed by the parallel loops in order, no linalg.index in
 * its body) becomes two (upstream split_reduction, then an interchange that
 * puts the reduction loop innermost):
 *   - a row reduction: K = K/L x L with the L (16..32, dividing K) inner
 *     part parallel: partial[p.., l] = sum over j of x[p.., j L + l], one
 *     thread per (row, l), the 32 threads of a warp reading 32 consecutive
 *     elements of one row; then out[p..] = sum over l of partial[p.., l];
 *   - a column reduction with fewer output points P than a quarter of the
 *     GPU's resident threads: K = S x K/S with S (a power of two dividing K,
 *     at most the threads wanted / P and K / 16) parallel: partial[s, p..]
 *     = the sum of the s-th contiguous K/S block, S P threads; then
 *     out[p..] = sum over s of partial[s, p..].
 * The partial sums start from the combiner's neutral element (0, -inf,
 * ...) and the second op adds them to the output's initial value, so the
 * result is that of the original op up to the order of the sums: a fixed
 * order (no atomics), the same on the GPU and under --gpu-sim.  An op the
 * transform does not take (a combiner it does not recognize, several
 * outputs) stays as it was.
 */
#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Linalg.h>
#include <mlir-c/Dialect/Transform/Interpreter.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "codegen.h"
#include "cpu_tile.h"

#define GR_MAXL 12
#define GR_ATTR "nova.split"

typedef struct gr_state {
  const cfg_device *dev;
  nv_sbuf script;
  int n;              /* ops marked (their ids 0 .. n-1) */
  int rows, cols;     /* of them, row and column reductions */
  bool *is_row;       /* by id: a row reduction */
  MlirContext ctx;
  MlirAttribute reduction; /* #linalg.iterator_type<reduction> */
} gr_state;

/* Whether OP's body reads linalg.index or holds an op with regions (the
 * split would have to rewrite them). */
static bool body_has_index(MlirOperation op) {
  MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  for (MlirOperation o = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o))
    if (cg_op_is(o, "linalg.index") || mlirOperationGetNumRegions(o) > 0) return true;
  return false;
}

/* The loops of generic OP: their static ranges and which one is the
 * reduction (*RED, exactly one); false where OP does not qualify: every
 * map a projected permutation of dims alone, the output's the parallel
 * loops in order. */
static bool read_op(MlirOperation op, MlirAttribute reduction, int *nl, int64_t *range, int *red) {
  if (mlirOperationGetNumResults(op) != 1) return false;
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  MlirAttribute it = mlirOperationGetAttributeByName(op, nova_str("iterator_types"));
  intptr_t nops = mlirOperationGetNumOperands(op);
  if (mlirAttributeIsNull(maps) || mlirAttributeIsNull(it) || !mlirAttributeIsAArray(it) ||
      mlirArrayAttrGetNumElements(maps) != nops)
    return false;
  int n = (int)mlirArrayAttrGetNumElements(it);
  if (n < 1 || n > GR_MAXL) return false;
  *red = -1;
  for (int d = 0; d < n; d++)
    if (mlirAttributeEqual(mlirArrayAttrGetElement(it, d), reduction)) {
      if (*red >= 0) return false;
      *red = d;
    }
  if (*red < 0) return false;
  bool seen[GR_MAXL] = {0};
  for (intptr_t i = 0; i < nops; i++) {
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    if ((int)mlirAffineMapGetNumDims(m) != n) return false;
    if (!mlirTypeIsARankedTensor(t)) {
      if (i == nops - 1) return false;
      continue;
    }
    if (!mlirShapedTypeHasStaticShape(t) || mlirAffineMapGetNumResults(m) != mlirShapedTypeGetRank(t)) return false;
    int prev = -1;
    for (intptr_t r = 0; r < mlirAffineMapGetNumResults(m); r++) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, r);
      if (!mlirAffineExprIsADim(e)) return false; /* (a unit dim read at 0: split_reduction mis-expands it) */
      int d = (int)mlirAffineDimExprGetPosition(e);
      range[d] = mlirShapedTypeGetDimSize(t, r);
      seen[d] = true;
      if (i == nops - 1 && (d == *red || d < prev)) return false; /* the output: the parallel loops in order */
      prev = d;
    }
  }
  for (int d = 0; d < n; d++)
    if (!seen[d] || range[d] < 1) return false;
  *nl = n;
  return true;
}

static int64_t largest_divisor(int64_t k, int64_t lo, int64_t hi) {
  for (int64_t f = hi; f >= lo; f--)
    if (k % f == 0) return f;
  return 0;
}

/* Marks OP and adds its script section when it qualifies. */
static void consider(gr_state *S, MlirOperation op) {
  int n, red;
  int64_t range[GR_MAXL];
  if (!cg_op_is(op, "linalg.generic") || body_has_index(op) || !read_op(op, S->reduction, &n, range, &red)) return;
  int64_t K = range[red], P = 1;
  for (int d = 0; d < n; d++)
    if (d != red) P *= range[d];
  int64_t resident = (int64_t)S->dev->sm_count * S->dev->max_threads_per_sm;
  int64_t factor = 0;
  bool inner = red == n - 1;
  int insert = 0;
  if (inner) { /* a row: a warp's lanes along it */
    /* a 32-bit accumulator: the row kernels (cuda.c) take it whole */
    MlirType et = mlirShapedTypeGetElementType(mlirValueGetType(mlirOperationGetResult(op, 0)));
    if (mlirTypeIsAF32(et) || (mlirTypeIsAInteger(et) && mlirIntegerTypeGetWidth(et) == 32)) return;
    if (K < 128) return;
    factor = largest_divisor(K, 16, 32);
    insert = n - 1; /* after every parallel loop of the output */
  } else {      /* a column: S blocks of rows side by side */
    if (P >= resident / 4 || K < 64) return;
    int64_t want = resident / P, cap = K / 16;
    for (int64_t s = 1; s <= want && s <= cap; s *= 2)
      if (K % s == 0) factor = s;
    if (factor < 4) return;
    for (int d = 0; d < red; d++) insert++; /* the parallel loops before it */
  }
  if (factor < 2) return;
  bool *is_row = nv_xrealloc(S->is_row, (size_t)(S->n + 1) * sizeof *is_row);
  if (!is_row) return;
  S->is_row = is_row;
  int id = S->n++;
  S->is_row[id] = inner;
  if (inner) S->rows++;
  else S->cols++;
  mlirOperationSetDiscardableAttributeByName(op, nova_str(GR_ATTR),
                                             mlirIntegerAttrGet(mlirIntegerTypeGet(S->ctx, 64), id));
  /* after the split: the loops with the reduction's two parts at RED, RED + 1
   * (inner: reduction then parallel; outer: parallel then reduction); the
   * interchange keeps the parallel loops in order and the reduction last */
  int perm[GR_MAXL + 1], k = 0, rloop = inner ? red : red + 1;
  for (int d = 0; d <= n; d++)
    if (d != rloop) perm[k++] = d;
  perm[k++] = rloop;
  nv_sb_printf(&S->script,
               "    %%m%d = transform.structured.match attributes{" GR_ATTR " = %d} in %%root : (!transform.any_op) -> "
               "!transform.any_op\n"
               "    transform.foreach %%m%d : !transform.any_op {\n"
               "    ^bb0(%%o: !transform.any_op):\n"
               "      transform.sequence %%o : !transform.any_op failures(suppress) {\n"
               "      ^bb1(%%o2: !transform.any_op):\n"
               "        %%a, %%b, %%c, %%d = transform.structured.split_reduction %%o2 {split_factor = %lld, "
               "insert_split_dimension = %d%s} : (!transform.any_op) -> (!transform.any_op, !transform.any_op, "
               "!transform.any_op, !transform.any_op)\n"
               "        %%e = transform.structured.interchange %%c iterator_interchange = [",
               id, id, id, (long long)factor, insert, inner ? ", inner_parallel" : "");
  for (int i = 0; i <= n; i++) nv_sb_printf(&S->script, "%s%d", i ? ", " : "", perm[i]);
  nv_sb_printf(&S->script, "] : (!transform.any_op) -> !transform.any_op\n      }\n    }\n");
}

typedef struct gr_list {
  MlirOperation *v;
  size_t n, cap;
  MlirAttribute reduction;
} gr_list;

/* The generics with a reduction loop, in order (changed after the walk). */
static MlirWalkResult collect_cb(MlirOperation op, void *ud) {
  gr_list *l = ud;
  if (!cg_op_is(op, "linalg.generic")) return MlirWalkResultAdvance;
  MlirAttribute it = mlirOperationGetAttributeByName(op, nova_str("iterator_types"));
  bool red = false;
  for (intptr_t d = 0; !mlirAttributeIsNull(it) && d < mlirArrayAttrGetNumElements(it); d++)
    red |= mlirAttributeEqual(mlirArrayAttrGetElement(it, d), l->reduction);
  if (!red) return MlirWalkResultAdvance;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    MlirOperation *v = nv_xrealloc(l->v, cap * sizeof *v);
    if (!v) return MlirWalkResultInterrupt;
    l->v = v, l->cap = cap;
  }
  l->v[l->n++] = op;
  return MlirWalkResultAdvance;
}

static MlirWalkResult unmark_cb(MlirOperation op, void *ud) {
  (void)ud;
  mlirOperationRemoveDiscardableAttributeByName(op, nova_str(GR_ATTR));
  return MlirWalkResultAdvance;
}

/* An op the transform did not take (still marked): not counted as split. */
static MlirWalkResult uncount_cb(MlirOperation op, void *ud) {
  gr_state *S = ud;
  MlirAttribute a = mlirOperationGetDiscardableAttributeByName(op, nova_str(GR_ATTR));
  if (mlirAttributeIsNull(a) || !mlirAttributeIsAInteger(a)) return MlirWalkResultAdvance;
  int64_t id = mlirIntegerAttrGetValueInt(a);
  if (id >= 0 && id < S->n) {
    if (S->is_row[id]) S->rows--;
    else S->cols--;
  }
  return MlirWalkResultAdvance;
}

int cg_gpu_split_reductions(nova_ctx *c, MlirModule m, const cfg_device *dev, int *rows, int *cols) {
  gr_state S = {.dev = dev, .ctx = c->ctx,
                .reduction = mlirAttributeParseGet(c->ctx, nova_str("#linalg.iterator_type<reduction>"))};
  *rows = *cols = 0;
  if (!dev || dev->kind != CFG_DEV_GPU || dev->sm_count < 1) return 0;
  nv_sb_printf(&S.script, "module attributes {transform.with_named_sequence} {\n"
                          "  transform.named_sequence @__transform_main(%%root: !transform.any_op "
                          "{transform.readonly}) {\n");
  /* adjacent loops merged first (a bias's gradient sums over [batch, time]:
   * one reduction loop), then each reduction considered */
  gr_list L = {.reduction = S.reduction};
  mlirOperationWalk(mlirModuleGetOperation(m), collect_cb, &L, MlirWalkPreOrder);
  for (size_t i = 0; i < L.n; i++) consider(&S, cg_merge_loops(c->ctx, L.v[i]));
  free(L.v);
  nv_sb_printf(&S.script, "    transform.yield\n  }\n}\n");
  int rc = 0;
  if (S.n && !S.script.oom) {
    MlirModule sm = mlirModuleCreateParse(c->ctx, nova_str(S.script.s));
    if (mlirModuleIsNull(sm)) {
      nv_error_plain(c->diag, "internal: the split-reduce transform script did not parse");
      rc = -1;
    } else {
      MlirOperation seq = mlirBlockGetFirstOperation(mlirModuleGetBody(sm));
      MlirTransformOptions opts = mlirTransformOptionsCreate();
      mlirTransformOptionsEnableExpensiveChecks(opts, false);
      if (mlirLogicalResultIsFailure(
              mlirTransformApplyNamedSequence(mlirModuleGetOperation(m), seq, mlirModuleGetOperation(sm), opts))) {
        nv_error_plain(c->diag, "internal: the split-reduce transform failed");
        rc = -1;
      }
      mlirTransformOptionsDestroy(opts);
      mlirModuleDestroy(sm);
    }
  } else if (S.script.oom) {
    rc = -1;
  }
  /* the ops the transform did not take keep the mark (not counted as split); it goes */
  mlirOperationWalk(mlirModuleGetOperation(m), uncount_cb, &S, MlirWalkPreOrder);
  mlirOperationWalk(mlirModuleGetOperation(m), unmark_cb, NULL, MlirWalkPreOrder);
  *rows = S.rows, *cols = S.cols;
  free(S.is_row);
  nv_sb_free(&S.script);
  return rc;
}
