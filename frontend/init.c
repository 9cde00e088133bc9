/* init.c: initial values of params and constants at compile time.
 *
 * Generated kinds (normal, uniform, he, xavier, causal_mask, a constant)
 * come from runtime/rt_init.h, which a step.so uses too: a step.so carries
 * a parameter's recipe (fe_init_recipe) and computes its values when it
 * opens; files and ONNX initializers are bytes (init.bin).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "rt_init.h"

static const char *kind_name(const nv_node *n) { return n->op == NV_OP_CONSTANT ? "const" : "param"; }

static int read_file_init(nv_diag *d, const nv_node *n, void *out, size_t nbytes) {
  FILE *f = fopen(n->init.path, "rb");
  if (!f) {
    nv_error(d, n->loc, "%s '%s': cannot open '%s'", kind_name(n), n->name, n->init.path);
    return -1;
  }
  size_t got = fread(out, 1, nbytes, f);
  int extra = fgetc(f) != EOF;
  fclose(f);
  if (got != nbytes || extra) {
    nv_error(d, n->loc, "%s '%s': '%s' must hold exactly %zu bytes (%s[%lld elements], little-endian), %s",
             kind_name(n), n->name, n->init.path, nbytes, fe_dtype_name(n->dtype), (long long)fe_numel(n),
             extra ? "it is longer" : "it is shorter");
    return -1;
  }
  return 0;
}

int fe_init_fill(const nv_graph *g, nv_diag *d, const nv_node *n, void *out) {
  int64_t count = fe_numel(n);
  size_t nbytes = (size_t)count * fe_dtype_size(n->dtype);
  if (n->init.kind == NV_INIT_FILE) return read_file_init(d, n, out, nbytes);
  if (n->init.kind == NV_INIT_DATA) {
    memcpy(out, n->init.data, nbytes);
    return 0;
  }
  double x, y;
  int kind = fe_init_recipe(n, &x, &y);
  if (kind == RT_INIT_NONE) memset(out, 0, nbytes);
  else rt_init_fill(kind, x, y, rt_init_seed(n->name, g->seed), n->dtype, n->rank, n->shape, 0, count, out);
  return 0;
}

int fe_init_recipe(const nv_node *n, double *a, double *b) {
  *a = n->init.a, *b = n->init.b;
  switch (n->init.kind) {
  case NV_INIT_ONES: *a = 1; return RT_INIT_CONST;
  case NV_INIT_CONST: return n->init.a == 0.0 && !signbit(n->init.a) ? RT_INIT_NONE : RT_INIT_CONST;
  case NV_INIT_NORMAL: return RT_INIT_NORMAL;
  case NV_INIT_UNIFORM: return RT_INIT_UNIFORM;
  case NV_INIT_HE: return RT_INIT_HE;
  case NV_INIT_XAVIER: return RT_INIT_XAVIER;
  case NV_INIT_CAUSAL: return RT_INIT_CAUSAL;
  case NV_INIT_ZEROS:
  case NV_INIT_FILE:
  case NV_INIT_DATA: break;
  }
  *a = *b = 0;
  return RT_INIT_NONE;
}

bool fe_init_is_bytes(const nv_node *n) { return n->init.kind == NV_INIT_FILE || n->init.kind == NV_INIT_DATA; }
