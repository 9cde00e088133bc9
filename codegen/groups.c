/* groups.c: the fused groups of a step, shown on its nova ops.
 *
 * For --emit=nova: a copy of the nova module, each op's location wrapped in
 * a name "nova.op.N" (N its position), is lowered to linalg and fused as the
 * step is compiled; each linalg op left is one loop nest (one kernel on the
 * GPU), and its location, fused from those of everything merged into it,
 * names the nova ops it computes.  Each nova op of the original module then
 * gets nova.kernels = [K, ...], the numbers (in order) of the loop nests it
 * is computed in: ops that share a number were fused into one loop nest;
 * an op with several numbers is split into several (a softmax: a max, a sum,
 * then the quotients).  The module gets nova.loop_nests = {before, after}.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "codegen.h"

static MlirBlock entry_block(MlirModule m) {
  MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m));
  return mlirOperationIsNull(f) ? (MlirBlock){NULL} : mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
}

typedef struct kernel_lists {
  int64_t **k;  /* [nops] the loop nests of each nova op */
  int *n, *cap;
} kernel_lists;

static void add_kernel(kernel_lists *L, int op, int64_t k) {
  if (L->n[op] && L->k[op][L->n[op] - 1] == k) return;
  if (L->n[op] == L->cap[op]) {
    int cap = L->cap[op] ? 2 * L->cap[op] : 4;
    int64_t *nk = nv_xrealloc(L->k[op], sizeof *nk * (size_t)cap);
    if (!nk) return;
    L->k[op] = nk;
    L->cap[op] = cap;
  }
  L->k[op][L->n[op]++] = k;
}

/* For each linalg op of LIN's entry, in order, the nova ops its location
 * names: added to L as loop nest K (with L), or only marked in HAD. */
static void scan(MlirModule lin, int nops, kernel_lists *L, bool *had) {
  int64_t k = 0;
  for (MlirOperation o = mlirBlockGetFirstOperation(entry_block(lin)); !mlirOperationIsNull(o);
       o = mlirOperationGetNextInBlock(o)) {
    MlirStringRef nm = mlirIdentifierStr(mlirOperationGetName(o));
    if (nm.length < 7 || memcmp(nm.data, "linalg.", 7)) continue;
    nv_sbuf s = {0};
    mlirLocationPrint(mlirOperationGetLocation(o), cg_print_to_sbuf, &s);
    for (const char *p = s.s; p && (p = strstr(p, "nova.op.")); p += 8) {
      int n = atoi(p + 8);
      if (n < 0 || n >= nops) continue;
      if (L) add_kernel(L, n, k);
      else had[n] = true;
    }
    nv_sb_free(&s);
    k++;
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

int cg_fusion_groups(nova_ctx *c, MlirModule nova, int opt_level) {
  MlirBlock nb = entry_block(nova);
  if (mlirBlockIsNull(nb)) return 0;
  int nops = 0;
  for (MlirOperation o = mlirBlockGetFirstOperation(nb); !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o))
    nops++;
  MlirModule copy = mlirModuleFromOperation(mlirOperationClone(mlirModuleGetOperation(nova)));
  MlirBlock cb = entry_block(copy);
  int i = 0;
  char name[32];
  for (MlirOperation o = mlirBlockGetFirstOperation(cb); !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o)) {
    snprintf(name, sizeof name, "nova.op.%d", i++);
    mlirOperationSetLocation(o, mlirLocationNameGet(c->ctx, nova_str(name), mlirOperationGetLocation(o)));
  }
  MlirModule lin = cg_lower_to_linalg(c, copy);
  mlirModuleDestroy(copy);
  if (mlirModuleIsNull(lin)) return -1;
  cg_plan stats = {0};
  kernel_lists L = {nv_xcalloc((size_t)nops + 1, sizeof *L.k), nv_xcalloc((size_t)nops + 1, sizeof *L.n),
                    nv_xcalloc((size_t)nops + 1, sizeof *L.cap)};
  bool *had = nv_xcalloc((size_t)nops + 1, sizeof *had);
  int rc = !L.k || !L.n || !L.cap || !had ? -1 : 0;
  if (!rc) scan(lin, nops, NULL, had); /* which ops have loops of their own before fusion */
  if (!rc && cg_fuse(c, lin, opt_level, false, &stats)) rc = -1;
  if (!rc) scan(lin, nops, &L, NULL);
  mlirModuleDestroy(lin);
  /* An op that had loops but is named by no loop nest after fusion was
   * fused into its users' nests (an elementwise producer moves into its
   * consumers): it gets theirs.  Users come later in the block. */
  MlirOperation *ops = rc ? NULL : nv_xcalloc((size_t)nops + 1, sizeof *ops);
  i = 0;
  for (MlirOperation o = mlirBlockGetFirstOperation(nb); ops && !mlirOperationIsNull(o); o = mlirOperationGetNextInBlock(o))
    ops[i++] = o;
  for (int n = nops - 1; ops && n >= 0; n--) {
    if (!had[n] || L.n[n]) continue;
    for (intptr_t r = 0; r < mlirOperationGetNumResults(ops[n]); r++)
      for (MlirOpOperand u = mlirValueGetFirstUse(mlirOperationGetResult(ops[n], r)); !mlirOpOperandIsNull(u);
           u = mlirOpOperandGetNextUse(u))
        for (int j = n + 1; j < nops; j++)
          if (mlirOperationEqual(ops[j], mlirOpOperandGetOwner(u)))
            for (int q = 0; q < L.n[j]; q++) add_kernel(&L, n, L.k[j][q]);
    if (L.n[n] > 1) { /* sorted, without repeats */
      qsort(L.k[n], (size_t)L.n[n], sizeof *L.k[n], cmp_i64);
      int w = 1;
      for (int q = 1; q < L.n[n]; q++)
        if (L.k[n][q] != L.k[n][w - 1]) L.k[n][w++] = L.k[n][q];
      L.n[n] = w;
    }
  }
  free(ops);
  free(had);
  i = 0;
  for (MlirOperation o = mlirBlockGetFirstOperation(nb); !rc && !mlirOperationIsNull(o);
       o = mlirOperationGetNextInBlock(o), i++) {
    if (!L.n[i]) continue;
    MlirAttribute *el = nv_xmalloc(sizeof *el * (size_t)L.n[i]);
    if (!el) break;
    for (int j = 0; j < L.n[i]; j++) el[j] = mlirIntegerAttrGet(mlirIntegerTypeGet(c->ctx, 64), L.k[i][j]);
    mlirOperationSetDiscardableAttributeByName(o, nova_str("nova.kernels"), mlirArrayAttrGet(c->ctx, L.n[i], el));
    free(el);
  }
  if (!rc) {
    MlirAttribute i64[2] = {mlirIntegerAttrGet(mlirIntegerTypeGet(c->ctx, 64), stats.ops_before_fusion),
                            mlirIntegerAttrGet(mlirIntegerTypeGet(c->ctx, 64), stats.ops_after_fusion)};
    MlirNamedAttribute na[2] = {
        mlirNamedAttributeGet(mlirIdentifierGet(c->ctx, nova_str("before")), i64[0]),
        mlirNamedAttributeGet(mlirIdentifierGet(c->ctx, nova_str("after")), i64[1])};
    mlirOperationSetDiscardableAttributeByName(mlirModuleGetOperation(nova), nova_str("nova.loop_nests"),
                                               mlirDictionaryAttrGet(c->ctx, 2, na));
  }
  for (int j = 0; j < nops && L.k; j++) free(L.k[j]);
  free(L.k);
  free(L.n);
  free(L.cap);
  return rc;
}
