/* irutil.c: small queries on MLIR operations shared by the code generators. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../driver/util.h"
#include "codegen.h"
#include "mlir-c/BuiltinAttributes.h"
#include "mlir-c/BuiltinTypes.h"

bool cg_op_is(MlirOperation op, const char *name) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  return s.length == strlen(name) && !memcmp(s.data, name, s.length);
}

MlirOperation cg_entry_func(MlirModule m) {
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    if (cg_op_is(f, "func.func") && mlirAttributeIsNull(mlirOperationGetAttributeByName(f, nova_str("sym_visibility"))) &&
        !mlirBlockIsNull(mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0))))
      return f;
  return (MlirOperation){NULL};
}

bool cg_op_list_push(cg_op_list *l, MlirOperation op) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    MlirOperation *v = nv_xrealloc(l->v, cap * sizeof *v);
    if (!v) {
      l->oom = true;
      return false;
    }
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = op;
  return true;
}

int cg_prefix_symbols(MlirModule m, const char *prefix) {
  MlirOperation top = mlirModuleGetOperation(m);
  MlirStringRef symattr = mlirSymbolTableGetSymbolAttributeName();
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    if (!cg_op_is(f, "llvm.func") && !cg_op_is(f, "func.func")) continue;
    MlirRegion r = mlirOperationGetRegion(f, 0);
    if (mlirRegionIsNull(r) || mlirBlockIsNull(mlirRegionGetFirstBlock(r))) continue; /* a declaration */
    MlirAttribute name = mlirOperationGetAttributeByName(f, symattr);
    if (mlirAttributeIsNull(name) || !mlirAttributeIsAString(name)) continue;
    MlirStringRef old = mlirStringAttrGetValue(name);
    char buf[512];
    snprintf(buf, sizeof buf, "%s%.*s", prefix, (int)old.length, old.data);
    MlirStringRef nw = mlirStringRefCreateFromCString(buf);
    if (mlirLogicalResultIsFailure(mlirSymbolTableReplaceAllSymbolUses(old, nw, top))) return -1;
    mlirOperationSetAttributeByName(f, symattr, mlirStringAttrGet(mlirOperationGetContext(f), nw));
  }
  return 0;
}

MlirOperation cg_make_func(MlirContext ctx, MlirLocation loc, const char *name, int nin, const MlirType *tin, int nout,
                           const MlirType *tout, MlirOperation *ret) {
  MlirLocation *locs = nv_xcalloc((size_t)nin + 1, sizeof *locs);
  for (int i = 0; i < nin; i++) locs[i] = loc;
  MlirBlock entry = mlirBlockCreate(nin, tin, locs);
  free(locs);
  MlirRegion region = mlirRegionCreate();
  mlirRegionAppendOwnedBlock(region, entry);
  MlirOperationState rs = mlirOperationStateGet(nova_str("func.return"), loc);
  *ret = mlirOperationCreate(&rs);
  mlirBlockAppendOwnedOperation(entry, *ret);
  MlirNamedAttribute fa[3] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("sym_name")), mlirStringAttrGet(ctx, nova_str(name))),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("function_type")),
                            mlirTypeAttrGet(mlirFunctionTypeGet(ctx, nin, tin, nout, tout))),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("sym_visibility")), mlirStringAttrGet(ctx, nova_str("private")))};
  MlirOperationState fs = mlirOperationStateGet(nova_str("func.func"), loc);
  mlirOperationStateAddAttributes(&fs, 3, fa);
  mlirOperationStateAddOwnedRegions(&fs, 1, &region);
  return mlirOperationCreate(&fs);
}

void cg_inline_func(MlirOperation fn, MlirOperation at, const MlirValue *args, MlirValue *results) {
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
  MlirOperation ret = mlirBlockGetTerminator(entry);
  for (intptr_t a = 0; a < mlirBlockGetNumArguments(entry); a++)
    mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(entry, a), args[a]);
  for (intptr_t r = 0; r < mlirOperationGetNumOperands(ret); r++) results[r] = mlirOperationGetOperand(ret, r);
  for (MlirOperation op = mlirBlockGetFirstOperation(entry); !mlirOperationEqual(op, ret);) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    mlirOperationMoveBefore(op, at);
    op = next;
  }
}

static size_t ptr_slot(const cg_ptrmap *h, const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x & (h->cap - 1);
}

void cg_ptrmap_init(cg_ptrmap *h, size_t n) {
  h->cap = 64;
  while (h->cap < 2 * n + 64) h->cap *= 2;
  h->key = nv_xcalloc(h->cap, sizeof *h->key);
  h->val = nv_xcalloc(h->cap, sizeof *h->val);
}

void cg_ptrmap_put(cg_ptrmap *h, const void *p, int v) {
  size_t s = ptr_slot(h, p);
  while (h->key[s] && h->key[s] != p) s = (s + 1) & (h->cap - 1);
  h->key[s] = p;
  h->val[s] = v;
}

int cg_ptrmap_get(const cg_ptrmap *h, const void *p) {
  for (size_t s = ptr_slot(h, p); h->key[s]; s = (s + 1) & (h->cap - 1))
    if (h->key[s] == p) return h->val[s];
  return -1;
}

void cg_ptrmap_free(cg_ptrmap *h) {
  free(h->key);
  free(h->val);
  h->key = NULL;
  h->val = NULL;
}
