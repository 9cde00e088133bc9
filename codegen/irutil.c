/* irutil.c: small queries on MLIR operations shared by the code generators. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../driver/util.h"
#include "codegen.h"
#include "mlir-c/BuiltinAttributes.h"

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
