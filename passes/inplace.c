/* inplace.c: parameter and optimizer-state updates computed in place.
 *
 * Requires: a training step in linalg on tensors (cg_prepare_inplace,
 * before one-shot bufferization), then bufferized (cg_plan_inplace).
 * Changes: update destinations and writable arguments; after bufferization
 * the copies of in-place updates removed, and which updates are in place
 * (cg_plan.inplace, for the runtime's descriptors and the manifest).
 *
 * A training step returns each new parameter (and optimizer state) as an
 * output of role update; the runtime would copy it over the old value
 * after the run, so both live at once.  Instead:
 *  1. before bufferization (cg_mark_writable), each update computed by an
 *     all-parallel linalg.generic that reads its parameter element for
 *     element (the optimizer's fused update) gets the parameter as its
 *     destination instead of a new tensor, and the parameter's argument is
 *     marked bufferization.writable: one-shot bufferization then computes
 *     it in the parameter's buffer where its own analysis proves that safe
 *     (no later read of the old value), and into a copy otherwise;
 *  2. after it (cg_inplace), an update whose value ended up in its
 *     parameter's buffer is returned by a single copy of that argument
 *     into the update's out-parameter: the copy is removed and the runtime
 *     passes the parameter's buffer for the update (rt_tensor_desc.inplace):
 *     no second buffer, no copy during or after the run.
 * Updates bufferization did not place in their parameter keep their own
 * buffer and the copy after the run.
 * The same way, before bufferization, every other elementwise op into a
 * new tensor that reads a value for the last time, element for element,
 * computes into that value's tensor (reuse_dying; NOVAC_NO_REUSE turns it
 * off): the buffer is reused where the value dies.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "passes.h"

/* G if it is an all-parallel linalg.generic with one result whose
 * destination is a tensor.empty (its payload never reads the destination's
 * element); its indexing maps in *MAPS and operand count in *N. */
static bool empty_elementwise(MlirOperation g, MlirAttribute *maps, intptr_t *n) {
  if (!cg_op_is(g, "linalg.generic") || mlirOperationGetNumResults(g) != 1) return false;
  MlirAttribute seg = mlirOperationGetAttributeByName(g, nova_str("operandSegmentSizes"));
  MlirAttribute it = mlirOperationGetAttributeByName(g, nova_str("iterator_types"));
  *maps = mlirOperationGetAttributeByName(g, nova_str("indexing_maps"));
  if (mlirAttributeIsNull(seg) || mlirAttributeIsNull(it) || mlirAttributeIsNull(*maps) ||
      mlirDenseI32ArrayGetElement(seg, 1) != 1)
    return false;
  for (intptr_t i = 0; i < mlirArrayAttrGetNumElements(it); i++) {
    nv_sbuf b = {0};
    mlirAttributePrint(mlirArrayAttrGetElement(it, i), cg_print_to_sbuf, &b);
    bool par = b.s && strstr(b.s, "parallel");
    nv_sb_free(&b);
    if (!par) return false;
  }
  *n = mlirOperationGetNumOperands(g);
  MlirValue init = mlirOperationGetOperand(g, *n - 1);
  return mlirValueIsAOpResult(init) && cg_op_is(mlirOpResultGetOwner(init), "tensor.empty");
}

/* G (empty_elementwise) computes into its operand X instead, which it
 * reads with the destination's indexing map: the payload reads X's element
 * from the destination's, and the input X is left unused (canonicalization
 * drops it).  Once tiled, each tile reads the tensor the loop carries,
 * which keeps bufferization in place. */
static void compute_into(MlirOperation g, MlirAttribute maps, intptr_t n, MlirValue x) {
  MlirAttribute omap = mlirArrayAttrGetElement(maps, n - 1);
  mlirOperationSetOperand(g, n - 1, x);
  MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(g, 0));
  if (!mlirBlockIsNull(b) && mlirBlockGetNumArguments(b) == n)
    for (intptr_t i = 0; i + 1 < n; i++)
      if (mlirValueEqual(mlirOperationGetOperand(g, i), x) &&
          mlirAttributeEqual(mlirArrayAttrGetElement(maps, i), omap))
        mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(b, i), mlirBlockGetArgument(b, n - 1));
}

/* If the value RESULT (an update of the argument P) comes from an
 * empty_elementwise generic that reads P with the destination's indexing
 * map, P becomes its destination. */
static void retarget(MlirValue result, MlirValue p) {
  MlirAttribute maps;
  intptr_t n;
  if (!mlirValueIsAOpResult(result) || !mlirTypeEqual(mlirValueGetType(result), mlirValueGetType(p))) return;
  MlirOperation g = mlirOpResultGetOwner(result);
  if (!empty_elementwise(g, &maps, &n)) return;
  MlirAttribute omap = mlirArrayAttrGetElement(maps, n - 1);
  for (intptr_t k = 0; k + 1 < n; k++)
    if (mlirValueEqual(mlirOperationGetOperand(g, k), p) &&
        mlirAttributeEqual(mlirArrayAttrGetElement(maps, k), omap)) {
      compute_into(g, maps, n, p);
      return;
    }
}

/* Whether X, read by G (in block B), is read there for the last time: made
 * by a linalg op of B (its own buffer, no view of another), every other
 * reader an op of B before G, and G reads it only with the map OMAP. */
static bool dies_at(MlirValue x, MlirOperation g, MlirBlock b, MlirAttribute maps, MlirAttribute omap) {
  if (!mlirValueIsAOpResult(x)) return false;
  MlirOperation def = mlirOpResultGetOwner(x);
  MlirStringRef nm = mlirIdentifierStr(mlirOperationGetName(def));
  if (nm.length < 7 || memcmp(nm.data, "linalg.", 7) || !mlirBlockEqual(mlirOperationGetBlock(def), b)) return false;
  for (MlirOpOperand u = mlirValueGetFirstUse(x); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u)) {
    MlirOperation r = mlirOpOperandGetOwner(u);
    if (mlirOperationEqual(r, g)) {
      if (!mlirAttributeEqual(mlirArrayAttrGetElement(maps, mlirOpOperandGetOperandNumber(u)), omap)) return false;
    } else if (!mlirBlockEqual(mlirOperationGetBlock(r), b) || !mlirOperationIsBeforeInBlock(r, g)) {
      return false;
    }
  }
  return true;
}

/* Each elementwise op into a new tensor that reads a value for the last
 * time, element for element, computes into that value's tensor instead:
 * the value's buffer is reused where it dies (as XLA shares an elementwise
 * op's operand buffer), not held beside a new one.  A backward's chains
 * of elementwise ops (a GELU's gradient, the softmax cross-entropy's)
 * then need one buffer, not one per op. */
static void reuse_dying(MlirBlock b) {
  for (MlirOperation g = mlirBlockGetFirstOperation(b); !mlirOperationIsNull(g); g = mlirOperationGetNextInBlock(g)) {
    MlirAttribute maps;
    intptr_t n;
    if (!empty_elementwise(g, &maps, &n)) continue;
    MlirAttribute omap = mlirArrayAttrGetElement(maps, n - 1);
    MlirType t = mlirValueGetType(mlirOperationGetResult(g, 0));
    for (intptr_t k = 0; k + 1 < n; k++) {
      MlirValue x = mlirOperationGetOperand(g, k);
      if (mlirTypeEqual(mlirValueGetType(x), t) && mlirAttributeEqual(mlirArrayAttrGetElement(maps, k), omap) &&
          dies_at(x, g, b, maps, omap)) {
        compute_into(g, maps, n, x);
        break;
      }
    }
  }
}

int cg_mark_writable(MlirModule m, const int *param_arg, int n) {
  MlirOperation func = cg_entry_func(m);
  if (mlirOperationIsNull(func)) return 0;
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
  MlirOperation ret = mlirBlockGetTerminator(fb);
  intptr_t nargs = mlirBlockGetNumArguments(fb);
  for (int j = 0; j < n && !mlirOperationIsNull(ret); j++)
    if (param_arg[j] >= 0 && param_arg[j] < nargs && j < mlirOperationGetNumOperands(ret))
      retarget(mlirOperationGetOperand(ret, j), mlirBlockGetArgument(fb, param_arg[j]));
  if (!getenv("NOVAC_NO_REUSE")) reuse_dying(fb);
  MlirAttribute aa = mlirOperationGetAttributeByName(func, nova_str("arg_attrs"));
  if (mlirAttributeIsNull(aa) || !mlirAttributeIsAArray(aa)) return 0;
  MlirContext ctx = mlirOperationGetContext(func);
  intptr_t na = mlirArrayAttrGetNumElements(aa);
  MlirAttribute *el = nv_xcalloc((size_t)na + 1, sizeof *el);
  if (!el) return -1;
  for (intptr_t i = 0; i < na; i++) el[i] = mlirArrayAttrGetElement(aa, i);
  for (int j = 0; j < n; j++) {
    int a = param_arg[j];
    if (a < 0 || a >= na || !mlirAttributeIsADictionary(el[a])) continue;
    intptr_t ne = mlirDictionaryAttrGetNumElements(el[a]);
    MlirNamedAttribute *ent = nv_xcalloc((size_t)ne + 1, sizeof *ent);
    if (!ent) {
      free(el);
      return -1;
    }
    int k = 0;
    for (intptr_t e = 0; e < ne; e++) {
      MlirNamedAttribute x = mlirDictionaryAttrGetElement(el[a], e);
      MlirStringRef nm = mlirIdentifierStr(x.name);
      if (nm.length == strlen("bufferization.writable") && !memcmp(nm.data, "bufferization.writable", nm.length))
        continue;
      ent[k++] = x;
    }
    ent[k++] = mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("bufferization.writable")),
                                     mlirBoolAttrGet(ctx, 1));
    el[a] = mlirDictionaryAttrGet(ctx, k, ent);
    free(ent);
  }
  mlirOperationSetAttributeByName(func, nova_str("arg_attrs"), mlirArrayAttrGet(ctx, na, el));
  free(el);
  return 0;
}

int cg_inplace(MlirModule m, const int *param_arg, const int *update_arg, int n, bool *ok) {
  MlirOperation func = cg_entry_func(m);
  for (int j = 0; j < n; j++) ok[j] = false;
  if (mlirOperationIsNull(func)) return 0;
  MlirBlock fb = mlirRegionGetFirstBlock(mlirOperationGetRegion(func, 0));
  intptr_t nargs = mlirBlockGetNumArguments(fb);
  for (int j = 0; j < n; j++) {
    if (param_arg[j] < 0 || update_arg[j] < 0 || param_arg[j] >= nargs || update_arg[j] >= nargs) continue;
    MlirValue p = mlirBlockGetArgument(fb, param_arg[j]), u = mlirBlockGetArgument(fb, update_arg[j]);
    /* the update's only use: memref.copy %p, %u at the top level */
    MlirOpOperand use = mlirValueGetFirstUse(u);
    if (mlirOpOperandIsNull(use) || !mlirOpOperandIsNull(mlirOpOperandGetNextUse(use))) continue;
    MlirOperation cp = mlirOpOperandGetOwner(use);
    if (!cg_op_is(cp, "memref.copy") || !mlirOperationEqual(mlirOperationGetParentOperation(cp), func) ||
        mlirOpOperandGetOperandNumber(use) != 1 || !mlirValueEqual(mlirOperationGetOperand(cp, 0), p))
      continue;
    mlirOperationDestroy(cp);
    ok[j] = true;
  }
  return 0;
}

/* ---- the step's pairs ---- */

/* For each output j of G: the entry argument of the param it updates
 * (PA[j], -1: none) and its own out-parameter argument (UA[j]).  The
 * entry's arguments are the inputs, then the params, each in node order,
 * then one out-parameter per output (nova_build_module's order, and
 * step.c's). */
static int update_pairs(const nv_graph *g, int **pa, int **ua) {
  int *arg = nv_xcalloc((size_t)g->nnodes + 1, sizeof *arg), nargs = 0;
  *pa = nv_xcalloc((size_t)g->noutputs + 1, sizeof **pa);
  *ua = nv_xcalloc((size_t)g->noutputs + 1, sizeof **ua);
  if (!arg || !*pa || !*ua) {
    free(arg);
    return -1;
  }
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < g->nnodes; i++)
      if (g->nodes[i]->op == (pass ? NV_OP_PARAM : NV_OP_INPUT)) arg[i] = nargs++;
  for (int j = 0; j < g->noutputs; j++) {
    const nv_node *u = g->outputs[j].updates;
    (*pa)[j] = u ? arg[u->id] : -1;
    (*ua)[j] = u ? nargs + j : -1;
  }
  free(arg);
  return 0;
}

int cg_prepare_inplace(nova_ctx *c, const nv_graph *g, MlirModule m) {
  int *pa = NULL, *ua = NULL;
  int rc = update_pairs(g, &pa, &ua);
  if (!rc) rc = cg_mark_writable(m, pa, g->noutputs);
  if (!rc) rc = cg_run_pipeline(c, m, "builtin.module(func.func(canonicalize{region-simplify=disabled max-iterations=1}))", "in-place updates");
  free(pa);
  free(ua);
  return rc;
}

int cg_plan_inplace(const nv_graph *g, MlirModule m, cg_plan *plan) {
  int *pa = NULL, *ua = NULL;
  free(plan->inplace);
  plan->inplace = nv_xcalloc((size_t)g->noutputs + 1, sizeof *plan->inplace);
  plan->noutputs = g->noutputs;
  int rc = plan->inplace ? update_pairs(g, &pa, &ua) : -1;
  if (!rc) rc = cg_inplace(m, pa, ua, g->noutputs, plan->inplace);
  free(pa);
  free(ua);
  return rc;
}
