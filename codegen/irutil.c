/* irutil.c: small queries on MLIR operations shared by the code generators. */
#include <stdlib.h>
#include <string.h>

#include "codegen.h"

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
    MlirOperation *v = realloc(l->v, cap * sizeof *v);
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
