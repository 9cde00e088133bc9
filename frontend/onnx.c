/* onnx.c: ONNX model loading (protobuf-c) and the import loop.
 *
 * Requires: a ModelProto with a graph whose nodes are in topological order
 * (as the ONNX spec demands; a use before its definition is reported as a
 * cycle or misordering).  Produces: a checked nv_graph whose inputs are the
 * graph inputs that are not initializers (in graph order), whose params are
 * the floating-point initializers nodes use (in initializer order; with
 * --train those onnx_roles.c does not make compile-time constants), and
 * whose outputs are the graph outputs.
 */
#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "onnx.h"

/* ---- known tensors -------------------------------------------------- */

#define OX_SUPPORTED_TYPES "float, double, float16, bfloat16, int64, int32, int16, int8, uint64, uint32, uint16, uint8, bool"

ox_tensor *ox_tensor_new(nova_dtype dt, int rank, const int64_t *shape) {
  /* known values are shapes, indices and constants: 2^28 elements at most
   * (larger data belongs in initializers, which become parameters) */
  int64_t total = 1;
  if (rank < 0 || rank > NOVA_MAX_RANK) return NULL;
  for (int i = 0; i < rank; i++) {
    if (shape[i] < 0 || (shape[i] && total > (INT64_C(1) << 28) / shape[i])) return NULL;
    total *= shape[i];
  }
  ox_tensor *t = nv_xcalloc(1, sizeof *t);
  if (!t) return NULL;
  t->dt = dt;
  t->rank = rank;
  if (rank) memcpy(t->shape, shape, (size_t)rank * sizeof *shape);
  int64_t n = ox_numel(t);
  t->data = nv_xcalloc((size_t)(n ? n : 1), fe_dtype_size(dt) ? fe_dtype_size(dt) : 1);
  if (!t->data) {
    free(t);
    return NULL;
  }
  return t;
}

void ox_tensor_free(ox_tensor *t) {
  if (!t) return;
  free(t->data);
  free(t);
}

int64_t ox_numel(const ox_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->shape[i];
  return n;
}

/* A float as int64 (truncated), saturating; NaN gives 0 (no undefined conversion). */
int64_t ox_f2i(double v) {
  if (!(v == v)) return 0;
  if (v >= 0x1p63) return INT64_MAX;
  if (v < -0x1p63) return INT64_MIN;
  return (int64_t)v;
}

int64_t ox_geti(const ox_tensor *t, int64_t i) {
  switch (t->dt) {
  case NOVA_DTYPE_I64: return ((const int64_t *)t->data)[i];
  case NOVA_DTYPE_I32: return ((const int32_t *)t->data)[i];
  case NOVA_DTYPE_I16: return ((const int16_t *)t->data)[i];
  case NOVA_DTYPE_I8: return ((const int8_t *)t->data)[i];
  case NOVA_DTYPE_U8: return ((const uint8_t *)t->data)[i];
  case NOVA_DTYPE_U16: return ((const uint16_t *)t->data)[i];
  case NOVA_DTYPE_U32: return ((const uint32_t *)t->data)[i];
  case NOVA_DTYPE_U64: return (int64_t)((const uint64_t *)t->data)[i]; /* the bits: wraps above INT64_MAX */
  case NOVA_DTYPE_BOOL: return ((const uint8_t *)t->data)[i] != 0;
  case NOVA_DTYPE_F32: return ox_f2i(((const float *)t->data)[i]);
  case NOVA_DTYPE_F64: return ox_f2i(((const double *)t->data)[i]);
  case NOVA_DTYPE_F16:
  case NOVA_DTYPE_BF16: return ox_f2i(fe_half_to_double(t->dt, ((const uint16_t *)t->data)[i]));
  default: return 0;
  }
}

double ox_getf(const ox_tensor *t, int64_t i) {
  switch (t->dt) {
  case NOVA_DTYPE_F32: return ((const float *)t->data)[i];
  case NOVA_DTYPE_F64: return ((const double *)t->data)[i];
  case NOVA_DTYPE_F16:
  case NOVA_DTYPE_BF16: return fe_half_to_double(t->dt, ((const uint16_t *)t->data)[i]);
  case NOVA_DTYPE_U64: return (double)((const uint64_t *)t->data)[i];
  default: return (double)ox_geti(t, i);
  }
}

/* Integers are stored modulo 2^width (two's complement), as the step's casts do. */
void ox_set(ox_tensor *t, int64_t i, double f, int64_t v) {
  switch (t->dt) {
  case NOVA_DTYPE_I64: ((int64_t *)t->data)[i] = v; break;
  case NOVA_DTYPE_I32: ((int32_t *)t->data)[i] = (int32_t)(uint32_t)v; break;
  case NOVA_DTYPE_I16: ((int16_t *)t->data)[i] = (int16_t)(uint16_t)v; break;
  case NOVA_DTYPE_I8: ((int8_t *)t->data)[i] = (int8_t)(uint8_t)v; break;
  case NOVA_DTYPE_U8: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
  case NOVA_DTYPE_U16: ((uint16_t *)t->data)[i] = (uint16_t)v; break;
  case NOVA_DTYPE_U32: ((uint32_t *)t->data)[i] = (uint32_t)v; break;
  case NOVA_DTYPE_U64: ((uint64_t *)t->data)[i] = (uint64_t)v; break;
  case NOVA_DTYPE_BOOL: ((uint8_t *)t->data)[i] = v != 0; break;
  case NOVA_DTYPE_F32: ((float *)t->data)[i] = (float)f; break;
  case NOVA_DTYPE_F64: ((double *)t->data)[i] = f; break;
  case NOVA_DTYPE_F16:
  case NOVA_DTYPE_BF16: ((uint16_t *)t->data)[i] = fe_half_from_double(t->dt, f); break;
  default: break;
  }
}

/* ONNX TensorProto.DataType codes are nova_dtype's values. */
nova_dtype ox_dtype_of_onnx(int32_t t) {
  switch (t) {
  case 1: case 2: case 3: case 4: case 5: case 6: case 7: case 9: case 10: case 11: case 12: case 13: case 16:
    return (nova_dtype)t;
  default: return (nova_dtype)0;
  }
}

const char *ox_onnx_type_name(int32_t t) {
  static const char *n[] = {"undefined", "float", "uint8", "int8", "uint16", "int16", "int32", "int64", "string",
                            "bool", "float16", "double", "uint32", "uint64", "complex64", "complex128", "bfloat16",
                            "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "uint4", "int4",
                            "float4e2m1", "float8e8m0", "uint2", "int2", "float6e2m3", "float6e3m2"};
  return t >= 0 && t < (int32_t)(sizeof n / sizeof n[0]) ? n[t] : "an unknown type";
}

/* ---- errors, attributes ----------------------------------------------- */

int ox_err(ox_ctx *x, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nv_verror(x->d, x->loc, fmt, ap);
  va_end(ap);
  return -1;
}

const Onnx__AttributeProto *ox_attr(ox_ctx *x, const char *name) {
  for (size_t i = 0; i < x->node->n_attribute; i++)
    if (x->node->attribute[i]->name && !strcmp(x->node->attribute[i]->name, name)) return x->node->attribute[i];
  return NULL;
}

int64_t ox_attr_i(ox_ctx *x, const char *name, int64_t dflt) {
  const Onnx__AttributeProto *a = ox_attr(x, name);
  return a && a->has_i ? a->i : dflt;
}

double ox_attr_f(ox_ctx *x, const char *name, double dflt) {
  const Onnx__AttributeProto *a = ox_attr(x, name);
  return a && a->has_f ? (double)a->f : dflt;
}

int ox_attr_ints(ox_ctx *x, const char *name, int64_t *out, int max) {
  const Onnx__AttributeProto *a = ox_attr(x, name);
  if (!a) return -1;
  if (a->n_ints > (size_t)max) return ox_err(x, "attribute '%s' has %zu entries, more than %d", name, a->n_ints, max);
  for (size_t i = 0; i < a->n_ints; i++) out[i] = a->ints[i];
  return (int)a->n_ints;
}

const char *ox_attr_s(ox_ctx *x, const char *name, const char *dflt, char *buf, size_t n) {
  const Onnx__AttributeProto *a = ox_attr(x, name);
  if (!a || !a->has_s) return dflt;
  snprintf(buf, n, "%.*s", (int)a->s.len, (const char *)a->s.data);
  return buf;
}

/* ---- values ------------------------------------------------------------ */

int ox_val_rank(ox_val v) { return v.node ? v.node->rank : v.k ? v.k->rank : 0; }
const int64_t *ox_val_shape(ox_val v) { return v.node ? v.node->shape : v.k->shape; }

nv_node *ox_add(ox_ctx *x, nv_op op, int nin, nv_node **in, const nv_node *attrs) {
  for (int i = 0; i < nin; i++)
    if (!in[i]) return NULL;
  return fe_graph_add(x->g, x->d, op, nin, in, attrs, x->loc);
}

nv_node *ox_node(ox_ctx *x, ox_val v) {
  if (v.node) return v.node;
  if (!v.k) {
    ox_err(x, "internal: a value with neither node nor data");
    return NULL;
  }
  nv_node *n = fe_graph_leaf(x->g, x->d, NV_OP_CONSTANT, NULL, v.k->dt, v.k->rank, v.k->shape, x->loc);
  if (!n) return NULL;
  size_t bytes = (size_t)ox_numel(v.k) * fe_dtype_size(v.k->dt);
  n->init.kind = NV_INIT_DATA;
  n->init.data = nv_xmalloc(bytes ? bytes : 1);
  if (!n->init.data) return NULL;
  memcpy(n->init.data, v.k->data, bytes);
  return n;
}

int ox_const_ints(ox_ctx *x, ox_val v, const char *what, int64_t *out, int max) {
  if (!v.k) return ox_err(x, "%s must be known when compiling (a constant, or computed from shapes), not computed by "
                          "the step", what);
  if (!fe_dtype_is_index(v.k->dt)) return ox_err(x, "%s must be int64 or int32, got %s", what, fe_dtype_name(v.k->dt));
  int64_t n = ox_numel(v.k);
  if (n > max) return ox_err(x, "%s has %lld entries, more than %d", what, (long long)n, max);
  for (int64_t i = 0; i < n; i++) out[i] = ox_geti(v.k, i);
  return (int)n;
}

/* ---- value table (name -> value) ---------------------------------------- */

typedef struct ox_entry {
  char *name;
  ox_val v;
} ox_entry;

typedef struct ox_table {
  ox_entry *e;
  size_t cap, n;
  struct ox_table *parent; /* a Scan body's iteration: outer values are looked up there */
} ox_table;

static size_t str_hash(const char *s) {
  size_t h = 1469598103934665603ull;
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
  return h;
}

static ox_entry *tab_find(ox_table *t, const char *name) {
  size_t i = str_hash(name) & (t->cap - 1);
  while (t->e[i].name && strcmp(t->e[i].name, name)) i = (i + 1) & (t->cap - 1);
  return &t->e[i];
}

static int tab_put(ox_table *t, const char *name, ox_val v) {
  if (2 * (t->n + 1) > t->cap) {
    ox_table bigger = {nv_xcalloc(t->cap * 2, sizeof(ox_entry)), t->cap * 2, 0, NULL};
    if (!bigger.e) {
      ox_val_free(&v);
      return -1;
    }
    for (size_t i = 0; i < t->cap; i++)
      if (t->e[i].name) {
        *tab_find(&bigger, t->e[i].name) = t->e[i];
        bigger.n++;
      }
    free(t->e);
    bigger.parent = t->parent;
    *t = bigger;
  }
  ox_entry *e = tab_find(t, name);
  if (e->name) { /* redefinition (SSA violation): keep the first, report */
    ox_val_free(&v);
    return 1;
  }
  e->name = nv_xstrdup(name);
  if (!e->name) {
    ox_val_free(&v);
    return -1;
  }
  e->v = v;
  t->n++;
  return 0;
}

/* NAME's entry in t or an enclosing table; t's empty slot if none has it. */
static ox_entry *tab_lookup(ox_table *t, const char *name) {
  ox_entry *e = tab_find(t, name);
  for (ox_table *p = t->parent; !e->name && p; p = p->parent) {
    ox_entry *f = tab_find(p, name);
    if (f->name) return f;
  }
  return e;
}

static void tab_free(ox_table *t) {
  for (size_t i = 0; i < t->cap; i++)
    if (t->e[i].name) {
      free(t->e[i].name);
      ox_val_free(&t->e[i].v);
    }
  free(t->e);
}

/* ---- tensors from the file ---------------------------------------------- */

/* Reads external data (location/offset/length, relative to basedir). */
static int read_external(ox_ctx *x, const Onnx__TensorProto *tp, const char *basedir, void *dst, size_t bytes) {
  const char *loc = NULL;
  long long off = 0, len = -1;
  for (size_t i = 0; i < tp->n_external_data; i++) {
    const char *k = tp->external_data[i]->key, *v = tp->external_data[i]->value;
    if (!k || !v) continue;
    if (!strcmp(k, "location")) loc = v;
    else if (!strcmp(k, "offset")) off = atoll(v);
    else if (!strcmp(k, "length")) len = atoll(v);
  }
  const char *tn = tp->name ? tp->name : "";
  if (!loc || !*loc) return ox_err(x, "tensor '%s': external data without a location", tn);
  if (loc[0] == '/' || strstr(loc, "..")) return ox_err(x, "tensor '%s': external data location '%s' must be a "
                                                       "relative path inside the model's folder", tn, loc);
  if (off < 0 || (len >= 0 && (size_t)len != bytes))
    return ox_err(x, "tensor '%s': external data length %lld, expected %zu bytes", tn, len, bytes);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", basedir, loc);
  nv_dep_note(path);
  FILE *f = fopen(path, "rb");
  if (!f) return ox_err(x, "tensor '%s': cannot open external data '%s': %s", tn, path, strerror(errno));
  int ok = fseeko(f, (off_t)off, SEEK_SET) == 0 && fread(dst, 1, bytes, f) == bytes;
  fclose(f);
  if (!ok) return ox_err(x, "tensor '%s': '%s' holds fewer than %lld + %zu bytes", tn, path, off, bytes);
  return 0;
}

/* How many values the typed field that holds dtype DT carries: ONNX keeps
 * the integers up to 32 bits, bool, and the bits of f16/bf16 in int32_data,
 * uint32 and uint64 in uint64_data. */
static size_t typed_count(const Onnx__TensorProto *tp, nova_dtype dt) {
  switch (dt) {
  case NOVA_DTYPE_F32: return tp->n_float_data;
  case NOVA_DTYPE_F64: return tp->n_double_data;
  case NOVA_DTYPE_I64: return tp->n_int64_data;
  case NOVA_DTYPE_U32:
  case NOVA_DTYPE_U64: return tp->n_uint64_data;
  default: return tp->n_int32_data;
  }
}

/* A TensorProto as a known tensor (NULL after a diagnostic). */
static ox_tensor *decode_tensor(ox_ctx *x, const Onnx__TensorProto *tp, const char *basedir) {
  const char *tn = tp->name ? tp->name : "";
  nova_dtype dt = ox_dtype_of_onnx(tp->data_type);
  if (!dt) {
    ox_err(x, "tensor '%s' has element type %s; supported: " OX_SUPPORTED_TYPES, tn,
           ox_onnx_type_name(tp->data_type));
    return NULL;
  }
  if (tp->n_dims > NOVA_MAX_RANK) {
    ox_err(x, "tensor '%s' has rank %zu, more than %d", tn, tp->n_dims, NOVA_MAX_RANK);
    return NULL;
  }
  int64_t n = 1;
  for (size_t i = 0; i < tp->n_dims; i++) {
    if (tp->dims[i] < 0 || (tp->dims[i] && n > NV_MAX_NUMEL / tp->dims[i])) {
      ox_err(x, "tensor '%s': dimension %zu is %lld (negative or too large)", tn, i, (long long)tp->dims[i]);
      return NULL;
    }
    n *= tp->dims[i];
  }
  size_t es = fe_dtype_size(dt), bytes = (size_t)n * es;
  bool external = tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
  if (!external) { /* the data must be there before anything is allocated for it */
    size_t have = tp->has_raw_data ? tp->raw_data.len : typed_count(tp, dt) * es;
    if (have != bytes) {
      ox_err(x, "tensor '%s': holds %zu bytes of data, its shape %s needs %zu", tn, have,
             fe_shape_str((char[160]){0}, 160, (int)tp->n_dims, tp->dims), bytes);
      return NULL;
    }
  }
  ox_tensor *t = ox_tensor_new(dt, (int)tp->n_dims, tp->dims);
  if (!t) {
    ox_err(x, "tensor '%s': %lld elements is more than novac loads (2^28 elements per tensor)", tn, (long long)n);
    return NULL;
  }
  bool ok = true;
  if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
    ok = read_external(x, tp, basedir, t->data, bytes) == 0;
    if (!ok) goto fail;
  } else if (tp->has_raw_data) {
    if (tp->raw_data.len != bytes) {
      ox_err(x, "tensor '%s': raw_data has %zu bytes, %s[%lld elements] needs %zu", tn, tp->raw_data.len,
             fe_dtype_name(dt), (long long)n, bytes);
      goto fail;
    }
    if (bytes) memcpy(t->data, tp->raw_data.data, bytes);
  } else {
    size_t have = typed_count(tp, dt);
    if (have != (size_t)n) {
      ox_err(x, "tensor '%s': holds %zu values, its shape needs %lld", tn, have, (long long)n);
      goto fail;
    }
    for (int64_t i = 0; i < n; i++)
      switch (dt) {
      case NOVA_DTYPE_F32: ((float *)t->data)[i] = tp->float_data[i]; break;
      case NOVA_DTYPE_F64: ((double *)t->data)[i] = tp->double_data[i]; break;
      case NOVA_DTYPE_I64: ((int64_t *)t->data)[i] = tp->int64_data[i]; break;
      case NOVA_DTYPE_U32:
      case NOVA_DTYPE_U64: ox_set(t, i, 0, (int64_t)tp->uint64_data[i]); break;
      case NOVA_DTYPE_F16:
      case NOVA_DTYPE_BF16: ((uint16_t *)t->data)[i] = (uint16_t)tp->int32_data[i]; break; /* the bits */
      default: ox_set(t, i, 0, tp->int32_data[i]); break;
      }
  }
  return t;
fail:
  ox_tensor_free(t);
  return NULL;
}

ox_tensor *ox_decode_tensor(ox_ctx *x, const Onnx__TensorProto *tp) {
  if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
    ox_err(x, "attribute tensors cannot use external data");
    return NULL;
  }
  return decode_tensor(x, tp, ".");
}

/* ---- the import loop ------------------------------------------------------ */

static void set_node_loc(ox_ctx *x, const Onnx__NodeProto *n, size_t index) {
  char where[600];
  if (n->name && *n->name)
    snprintf(where, sizeof where, "%s: node '%.200s' (%.80s)", x->file, n->name, n->op_type ? n->op_type : "?");
  else
    snprintf(where, sizeof where, "%s: node #%zu (%.80s)", x->file, index, n->op_type ? n->op_type : "?");
  x->loc = (nv_loc){nv_diag_intern(x->d, where), 0, 0};
}

static int64_t opset_of(ox_ctx *x, const Onnx__ModelProto *m) {
  for (size_t i = 0; i < m->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *o = m->opset_import[i];
    if (!o->domain || !*o->domain || !strcmp(o->domain, "ai.onnx")) return o->has_version ? o->version : 1;
  }
  (void)x;
  return 0;
}

/* Graph input -> INPUT node with bound dims. */
static nv_node *make_input(ox_ctx *x, const Onnx__ValueInfoProto *vi) {
  const char *name = vi->name ? vi->name : "";
  if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !vi->type->tensor_type) {
    ox_err(x, "graph input '%s' is not a tensor but %s; the step's inputs are tensors (sequences, maps and "
           "optionals are not supported)", name, ox_type_str(vi->type, (char[400]){0}, 400));
    return NULL;
  }
  const Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
  nova_dtype dt = ox_dtype_of_onnx(tt->elem_type);
  if (!dt) {
    ox_err(x, "graph input '%s' has element type %s; supported: " OX_SUPPORTED_TYPES, name,
           ox_onnx_type_name(tt->elem_type));
    return NULL;
  }
  if (!tt->shape) {
    ox_err(x, "graph input '%s' has no shape; novac compiles static shapes", name);
    return NULL;
  }
  if (tt->shape->n_dim > NOVA_MAX_RANK) {
    ox_err(x, "graph input '%s' has rank %zu, more than %d", name, tt->shape->n_dim, NOVA_MAX_RANK);
    return NULL;
  }
  int64_t shape[NOVA_MAX_RANK];
  for (size_t i = 0; i < tt->shape->n_dim; i++) {
    const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[i];
    if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
      shape[i] = dm->dim_value;
      continue;
    }
    const char *sym = dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && dm->dim_param
                          ? dm->dim_param : "";
    fe_dim_binding *b = NULL;
    for (int k = 0; *sym && k < x->ndims; k++)
      if (!strcmp(x->dims[k].name, sym)) b = &x->dims[k];
    if (!b) {
      if (*sym)
        ox_err(x, "graph input '%s': dimension %zu is symbolic ('%s'); bind it with --dim=%s=N", name, i, sym, sym);
      else
        ox_err(x, "graph input '%s': dimension %zu has no size and no name; novac compiles static shapes", name, i);
      return NULL;
    }
    b->used = true;
    shape[i] = b->value;
  }
  return fe_graph_leaf(x->g, x->d, NV_OP_INPUT, name, dt, (int)tt->shape->n_dim, shape, x->loc);
}

int ox_used_names(const Onnx__GraphProto *gr, nv_strmap *used) {
  for (size_t i = 0; i < gr->n_node; i++) {
    for (size_t j = 0; j < gr->node[i]->n_input; j++)
      if (gr->node[i]->input[j] && nv_strmap_put(used, gr->node[i]->input[j], 1)) return -1;
    for (size_t a = 0; a < gr->node[i]->n_attribute; a++) { /* the subgraphs of If and Scan see it too */
      const Onnx__AttributeProto *at = gr->node[i]->attribute[a];
      if (at->g && ox_used_names(at->g, used)) return -1;
    }
  }
  for (size_t i = 0; i < gr->n_output; i++)
    if (gr->output[i]->name && nv_strmap_put(used, gr->output[i]->name, 1)) return -1;
  return 0;
}

/* A graph output declared, or computed, as something else than a tensor. */
static int output_not_tensor(ox_ctx *x, const Onnx__ValueInfoProto *vi, ox_val v) {
  if (vi->type && vi->type->value_case != ONNX__TYPE_PROTO__VALUE__NOT_SET &&
      vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
    return ox_err(x, "graph output '%s' is not a tensor but %s; the step's outputs are tensors (sequences, maps and "
                  "optionals are not supported)", vi->name, ox_type_str(vi->type, (char[400]){0}, 400));
  if (v.seq)
    return ox_err(x, "graph output '%s' is a sequence of %d %s tensors; the step's outputs are tensors (sequences are "
                  "not supported there)", vi->name, v.seq->n, fe_dtype_name(v.seq->dt));
  return 0;
}

/* Checks a computed output against what the model declares. */
static int check_declared(ox_ctx *x, const Onnx__ValueInfoProto *vi, const nv_node *n) {
  if (!vi->type || vi->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !vi->type->tensor_type) return 0;
  const Onnx__TypeProto__Tensor *tt = vi->type->tensor_type;
  nova_dtype dt = ox_dtype_of_onnx(tt->elem_type);
  if (tt->has_elem_type && tt->elem_type && dt != n->dtype)
    return ox_err(x, "graph output '%s' is declared %s, the graph computes %s", vi->name, ox_onnx_type_name(tt->elem_type),
                  fe_dtype_name(n->dtype));
  if (!tt->shape) return 0;
  if ((int)tt->shape->n_dim != n->rank)
    return ox_err(x, "graph output '%s' is declared with rank %zu, the graph computes %s", vi->name, tt->shape->n_dim,
                  fe_shape_str((char[160]){0}, 160, n->rank, n->shape));
  for (int i = 0; i < n->rank; i++) {
    const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[i];
    if (dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && dm->dim_value != n->shape[i])
      return ox_err(x, "graph output '%s': dimension %d is declared %lld, the graph computes %s", vi->name, i,
                    (long long)dm->dim_value, fe_shape_str((char[160]){0}, 160, n->rank, n->shape));
  }
  return 0;
}

#define OX_MAX_IO 64

static int import_nodes(ox_ctx *x, ox_table *tab, const Onnx__GraphProto *gr);

/* If with a condition known when compiling: the chosen branch's nodes are
 * imported in place (they see every outer value), its outputs become the
 * node's. */
static int import_if(ox_ctx *x, ox_table *tab, ox_val *in, int nin, ox_val *out, int nout) {
  if (nin != 1 || !in[0].present) return ox_err(x, "takes one input, the condition");
  if (ox_tensors_only(x, in, nin)) return -1;
  if (!in[0].k) return ox_err(x, "the condition must be known when compiling (a branch chosen at run time is not supported)");
  if (ox_numel(in[0].k) != 1) return ox_err(x, "the condition must hold one element");
  const char *which = ox_geti(in[0].k, 0) ? "then_branch" : "else_branch";
  const Onnx__AttributeProto *a = ox_attr(x, which);
  if (!a || a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH || !a->g) return ox_err(x, "%s is missing", which);
  const Onnx__GraphProto *br = a->g;
  if (br->n_initializer) return ox_err(x, "initializers inside %s are not supported", which);
  if ((int)br->n_output != nout) return ox_err(x, "%s has %zu outputs, the node %d", which, br->n_output, nout);
  if (x->depth >= 16) return ox_err(x, "If branches nested more than 16 deep");
  const Onnx__NodeProto *node = x->node;
  nv_loc loc = x->loc;
  x->depth++;
  int rc = import_nodes(x, tab, br);
  x->depth--;
  x->node = node, x->loc = loc;
  for (int j = 0; !rc && j < nout; j++) {
    ox_entry *e = br->output[j]->name ? tab_lookup(tab, br->output[j]->name) : NULL;
    if (!e || !e->name) return ox_err(x, "%s output '%s' is not computed", which, br->output[j]->name ? br->output[j]->name : "");
    if (ox_val_copy(e->v, &out[j])) return -1; /* the table keeps its own */
  }
  return rc;
}

/* Scan (opset 9 on), unrolled: each iteration imports the body in a table of
 * its own over the outer one, with the states and this step's slices of the
 * scan inputs; the scan outputs are stacked along their axes. */
static int import_scan(ox_ctx *x, ox_table *tab, ox_val *in, int nin, ox_val *out, int nout) {
  if (x->opset < 9) return ox_err(x, "Scan before opset 9 (a batch axis and sequence_lens) is not supported");
  const Onnx__AttributeProto *ba = ox_attr(x, "body");
  if (!ba || ba->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH || !ba->g) return ox_err(x, "the body is missing");
  const Onnx__GraphProto *body = ba->g;
  int M = (int)ox_attr_i(x, "num_scan_inputs", 0), N = nin - M, K = nout - N;
  if (M <= 0 || N < 0 || K < 0 || (int)body->n_input != nin || (int)body->n_output != nout || nin > 32 || nout > 32)
    return ox_err(x, "num_scan_inputs, the inputs and outputs do not agree with the body");
  if (body->n_initializer) return ox_err(x, "initializers inside the body are not supported");
  if (x->depth >= 16) return ox_err(x, "subgraphs nested more than 16 deep");
  if (ox_tensors_only(x, in, nin)) return -1;
  int64_t iax[32] = {0}, idir[32] = {0}, oax[32] = {0}, odir[32] = {0};
  ox_attr_ints(x, "scan_input_axes", iax, 32), ox_attr_ints(x, "scan_input_directions", idir, 32);
  ox_attr_ints(x, "scan_output_axes", oax, 32), ox_attr_ints(x, "scan_output_directions", odir, 32);
  nv_node *sin[32];
  int64_t T = -1;
  for (int j = 0; j < M; j++) {
    sin[j] = ox_N(x, in[N + j]);
    if (!sin[j] || ox_norm_axis(x, &iax[j], sin[j]->rank)) return -1;
    if (T >= 0 && sin[j]->shape[iax[j]] != T) return ox_err(x, "the scan inputs differ in length");
    T = sin[j]->shape[iax[j]];
  }
  if (T > 4096) return ox_err(x, "more than 4096 iterations are not supported (unrolled)");
  ox_val st[32];
  for (int i = 0; i < N; i++) st[i] = in[i]; /* borrowed from the caller's table */
  nv_node **ys = nv_xcalloc((size_t)(K ? K : 1) * (size_t)(T > 0 ? T : 1), sizeof *ys);
  if (!ys) return -1;
  const Onnx__NodeProto *node = x->node;
  nv_loc loc = x->loc;
  int rc = 0;
  bool own[32] = {0};
  for (int64_t t = 0; t < T && !rc; t++) {
    ox_table it = {nv_xcalloc(64, sizeof(ox_entry)), 64, 0, tab};
    if (!it.e) rc = -1;
    for (int i = 0; i < nin && !rc; i++) {
      ox_val v;
      if (i < N) rc = ox_val_copy(st[i], &v);
      else {
        nv_node *a = sin[i - N];
        int64_t p = idir[i - N] ? T - 1 - t : t, s[NOVA_MAX_RANK];
        int r = 0;
        for (int k = 0; k < a->rank; k++)
          if (k != iax[i - N]) s[r++] = a->shape[k];
        nv_node *sl = ox_reshape(x, ox_slice1(x, a, iax[i - N], p, p + 1, 1), r, s);
        v = (ox_val){.node = sl, .present = sl != NULL};
        rc = sl ? 0 : -1;
      }
      if (!rc && (!body->input[i]->name || tab_put(&it, body->input[i]->name, v))) rc = -1;
    }
    x->depth++;
    if (!rc) rc = import_nodes(x, &it, body);
    x->depth--;
    x->node = node, x->loc = loc;
    for (int i = 0; i < nout && !rc; i++) {
      ox_entry *e = body->output[i]->name ? tab_lookup(&it, body->output[i]->name) : NULL;
      if (!e || !e->name) {
        rc = ox_err(x, "the body's output '%s' is not computed", body->output[i]->name ? body->output[i]->name : "");
        break;
      }
      if (i < N) { /* the next state */
        if (own[i]) ox_val_free(&st[i]);
        rc = ox_val_copy(e->v, &st[i]);
        own[i] = true;
      } else
        rc = (ys[(i - N) * T + t] = ox_node(x, e->v)) ? 0 : -1;
    }
    tab_free(&it);
  }
  for (int i = 0; i < N && !rc; i++) {
    rc = ox_val_copy(st[i], &out[i]);
    out[i].present = true;
  }
  for (int i = 0; i < N; i++)
    if (own[i]) ox_val_free(&st[i]);
  for (int j = 0; j < K && !rc; j++) { /* stack: a new axis of length T */
    nv_node *acc = NULL, *first = ys[j * T];
    if (!first) {
      rc = ox_err(x, "a Scan without iterations is not supported");
      break;
    }
    int64_t ax = oax[j];
    if (ax < 0) ax += first->rank + 1;
    if (ax < 0 || ax > first->rank || first->rank + 1 > NOVA_MAX_RANK) {
      rc = ox_err(x, "scan_output_axes entry %lld is out of range", (long long)oax[j]);
      break;
    }
    int64_t s[NOVA_MAX_RANK];
    for (int k = 0, m = 0; k <= first->rank; k++) s[k] = k == ax ? 1 : first->shape[m++];
    nv_node at = {.axis = ax};
    for (int64_t t = 0; t < T && !rc; t++) {
      nv_node *p = ox_reshape(x, ys[j * T + (odir[j] ? T - 1 - t : t)], first->rank + 1, s);
      acc = acc ? ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){acc, p}, &at) : p;
      if (!acc) rc = -1;
    }
    out[N + j] = (ox_val){.node = acc, .present = acc != NULL};
  }
  free(ys);
  return rc;
}

static int import_nodes(ox_ctx *x, ox_table *tab, const Onnx__GraphProto *gr) {
  for (size_t i = 0; i < gr->n_node && nv_diag_count(x->d) == 0; i++) {
    const Onnx__NodeProto *nd = gr->node[i];
    x->node = nd;
    set_node_loc(x, nd, i);
    if (!nd->op_type || !*nd->op_type) {
      ox_err(x, "node without an op_type");
      return -1;
    }
    if (nd->domain && *nd->domain && strcmp(nd->domain, "ai.onnx")) {
      ox_err(x, "operator %s of domain '%s' is not supported (only the default ONNX domain, opset %lld)", nd->op_type,
             nd->domain, (long long)x->opset);
      return -1;
    }
    if (nd->n_input > OX_MAX_IO || nd->n_output > OX_MAX_IO) {
      ox_err(x, "more than %d inputs or outputs", OX_MAX_IO);
      return -1;
    }
    ox_val in[OX_MAX_IO] = {{0}}, out[OX_MAX_IO] = {{0}};
    for (size_t j = 0; j < nd->n_input; j++) {
      const char *nm = nd->input[j];
      if (!nm || !*nm) continue; /* omitted optional input */
      ox_entry *e = tab_lookup(tab, nm);
      if (!e->name) {
        ox_err(x, "input %zu ('%s') is not defined by an earlier node, a graph input or an initializer "
               "(the graph is not in topological order, or has a cycle)", j, nm);
        return -1;
      }
      in[j] = e->v;
      in[j].k = e->v.k; /* borrowed */
    }
    int crc = !strcmp(nd->op_type, "If")     ? import_if(x, tab, in, (int)nd->n_input, out, (int)nd->n_output)
              : !strcmp(nd->op_type, "Scan") ? import_scan(x, tab, in, (int)nd->n_input, out, (int)nd->n_output)
                                             : ox_convert(x, in, (int)nd->n_input, out, (int)nd->n_output);
    /* the table takes the named outputs; everything else a converter made is freed */
    int err = crc;
    for (size_t j = 0; j < OX_MAX_IO; j++) {
      const char *nm = j < nd->n_output ? nd->output[j] : NULL;
      if (err || !nm || !*nm || !out[j].present) {
        ox_val_free(&out[j]);
        continue;
      }
      int r = tab_put(tab, nm, out[j]); /* frees the value when it fails */
      if (r > 0) ox_err(x, "output '%s' is already defined (a value may be assigned once)", nm);
      if (r) err = -1;
    }
    if (err) return -1;
  }
  return nv_diag_count(x->d) ? -1 : 0;
}


static int import_graph(ox_ctx *x, const Onnx__ModelProto *m, const fe_train_roles *roles, const char *basedir) {
  const Onnx__GraphProto *gr = m->graph;
  ox_table tab = {nv_xcalloc(64, sizeof(ox_entry)), 64, 0, NULL};
  int rc = -1;
  if (!tab.e) return -1;
  x->loc = (nv_loc){x->file, 0, 0};
  nv_strmap init_names = {0}; /* a name -> hash lookup each, not a scan (a weight per node: quadratic) */
  for (size_t i = 0; i < gr->n_initializer; i++)
    if (gr->initializer[i]->name && nv_strmap_put(&init_names, gr->initializer[i]->name, 1)) goto out;
  if (ox_used_names(gr, &x->used)) goto out;
  if (roles && ox_roles_decide(x, m, roles)) goto out;
  /* graph inputs that are not initializers, in order */
  for (size_t i = 0; i < gr->n_input; i++) {
    const char *name = gr->input[i]->name;
    if (!name || !*name) {
      ox_err(x, "graph input %zu has no name", i);
      goto out;
    }
    if (nv_strmap_get(&init_names, name) >= 0) continue;
    nv_node *n = make_input(x, gr->input[i]);
    if (!n || tab_put(&tab, name, (ox_val){.node = n, .present = true})) goto out;
  }
  /* initializers: floats are parameters, the rest known values */
  for (size_t i = 0; i < gr->n_initializer; i++) {
    const Onnx__TensorProto *tp = gr->initializer[i];
    if (!tp->name || !*tp->name) {
      ox_err(x, "initializer %zu has no name", i);
      goto out;
    }
    if (nv_strmap_get(&x->used, tp->name) < 0) continue;
    ox_tensor *t = decode_tensor(x, tp, basedir);
    if (!t) goto out;
    ox_val v = {.k = t, .present = true};
    const nv_initializer *ir = ox_init_role(x, tp->name); /* --train: param, buffer or constant */
    if (fe_dtype_is_float(t->dt) && !(ir && ir->folded)) {
      nv_node *p = fe_graph_leaf(x->g, x->d, NV_OP_PARAM, tp->name, t->dt, t->rank, t->shape, x->loc);
      if (!p) {
        ox_tensor_free(t);
        goto out;
      }
      p->frozen = ir && ir->role != NV_IROLE_PARAM;
      if (ir && ir->role == NV_IROLE_BUFFER) p->role = NOVA_ROLE_BUFFER;
      p->init.kind = NV_INIT_DATA;
      p->init.data = t->data; /* the param takes the data */
      t->data = NULL;
      ox_tensor_free(t);
      v = (ox_val){.node = p, .present = true};
    }
    int r = tab_put(&tab, tp->name, v);
    if (r < 0) goto out;
    if (r > 0) {
      ox_err(x, "initializer '%s' has the name of a graph input or an earlier initializer", tp->name);
      goto out;
    }
  }
  if (import_nodes(x, &tab, gr)) goto out;
  if (nv_diag_count(x->d)) goto out;
  /* outputs */
  x->loc = (nv_loc){x->file, 0, 0};
  for (size_t i = 0; i < gr->n_output; i++) {
    const char *nm = gr->output[i]->name;
    ox_entry *e = nm ? tab_find(&tab, nm) : NULL;
    if (!e || !e->name) {
      ox_err(x, "graph output '%s' is not computed by any node", nm ? nm : "");
      goto out;
    }
    if (output_not_tensor(x, gr->output[i], e->v)) goto out;
    nv_node *n = ox_node(x, e->v);
    if (!n || check_declared(x, gr->output[i], n) || fe_graph_add_output(x->g, x->d, nm, n, x->loc)) goto out;
  }
  if (gr->n_output == 0) {
    ox_err(x, "the graph has no outputs");
    goto out;
  }
  rc = 0;
out:
  tab_free(&tab);
  nv_strmap_free(&init_names);
  nv_strmap_free(&x->used);
  nv_strmap_free(&x->inits);
  return rc;
}

nv_graph *fe_parse_onnx(nv_diag *d, const char *name, const uint8_t *bytes, size_t len, const char *basedir,
                        fe_dim_binding *dims, int ndims, const fe_train_roles *roles) {
  ox_ctx x = {.d = d, .file = nv_diag_intern(d, name), .dims = dims, .ndims = ndims};
  x.loc = (nv_loc){x.file, 0, 0};
  char why[256];
  if (fe_onnx_check_wire(bytes, len, why, sizeof why)) {
    ox_err(&x, "%s", why);
    return NULL;
  }
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, bytes);
  if (!m) {
    ox_err(&x, "not a valid ONNX model (the protobuf does not parse: truncated, corrupt or not an .onnx file)");
    return NULL;
  }
  nv_graph *g = NULL;
  if (!m->graph) {
    ox_err(&x, "the model has no graph");
    goto out;
  }
  x.opset = opset_of(&x, m);
  if (x.opset < 7) {
    if (x.opset)
      ox_err(&x, "opset %lld is too old; novac supports opsets 7 to 28 (convert the model with "
             "onnx.version_converter)", (long long)x.opset);
    else
      ox_err(&x, "the model imports no opset of the default ONNX domain");
    goto out;
  }
  /* Opsets 22 to 28 changed the supported operators only by adding element
   * types novac does not take (bfloat16, float8, int4, ...), which the
   * loader rejects by type; their semantics for float, double, int64, int32
   * and bool are those of opset 21. */
  if (x.opset > 28) {
    ox_err(&x, "opset %lld is newer than novac knows (7 to 28)", (long long)x.opset);
    goto out;
  }
  g = fe_graph_create();
  if (g) g->allow_empty = true; /* ONNX tensors may have 0-sized dimensions */
  if (g) g->eval = roles && roles->eval;
  x.g = g;
  if (!g || import_graph(&x, m, roles, basedir) || nv_diag_count(d)) {
    fe_graph_destroy(g);
    g = NULL;
  }
out:
  onnx__model_proto__free_unpacked(m, NULL);
  return g;
}

nv_graph *fe_load_onnx(nv_diag *d, const char *path, fe_dim_binding *dims, int ndims, const fe_train_roles *roles) {
  size_t len = 0;
  /* protobuf messages are limited to 2 GiB; larger tensors use external data */
  char *buf = nv_read_file(path, &len, (size_t)2 << 30);
  if (!buf) {
    nv_error_plain(d, "cannot read %s: %s", path,
                   errno == EFBIG ? "larger than 2 GiB (store large tensors as external data)" : strerror(errno));
    return NULL;
  }
  char *copy = nv_xstrdup(path);
  nv_graph *g = copy ? fe_parse_onnx(d, path, (const uint8_t *)buf, len, dirname(copy), dims, ndims, roles) : NULL;
  free(copy);
  free(buf);
  return g;
}
