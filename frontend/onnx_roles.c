/* onnx_roles.c: with --train, what each initializer of an ONNX model is:
 * a trained parameter, a buffer (state that is not trained) or a constant.
 *
 * The rule (novac(1), TRAINING), first match wins, for an initializer that
 * nodes use:
 *   1. not floating-point                         -> constant
 *   2. input 4 or 5 of a BatchNormalization in training mode
 *                                                 -> buffer, updated by the step
 *   3. matched by --freeze                        -> constant
 *   4. --train-only given: matched -> parameter, else constant
 *   5. the model has training_info: named in an update_binding -> parameter
 *   6. the dynamo exporter's InputSpec.kind (value_info metadata_props):
 *      PARAMETER -> parameter, BUFFER -> buffer, CONSTANT_TENSOR -> constant
 *   7. input 4 or 5 of a BatchNormalization (inference mode) -> buffer
 *   8. named like a PyTorch buffer (running_mean, running_var,
 *      num_batches_tracked, inv_freq)             -> buffer (a warning when
 *      the loss depends on it through differentiable ops)
 *   9. training_info present (not named in it)    -> constant
 *  10. otherwise                                  -> parameter
 * and a parameter the loss does not depend on through differentiable ops
 * (fe_train_roles.reach, computed by the driver on a first import) is a
 * constant.  Buffers and constants are known at compile time (folded) up
 * to FE_FOLD_MAX_NUMEL elements, except buffers the step updates.
 *
 * Requires: the model's graph (before its initializers are imported).
 * Produces: g->inits, one entry per initializer that nodes use, in file
 * order, consulted by the import loop (ox_init_role).
 */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "onnx.h"

#define OX_KIND_KEY "pkg.torch.export.graph_signature.InputSpec.kind"

typedef struct facts {
  const char *bn_node;   /* the BatchNormalization this is input 4 or 5 of, or NULL */
  int bn_input;          /* 4 or 5 (1-based, as the ONNX spec counts) */
  bool bn_train;         /* that node is in training mode */
  char torch_kind[32];   /* InputSpec.kind, or "" */
  bool ti_bound;         /* named in a training_info update_binding */
  bool reached;          /* the loss depends on it through differentiable ops */
} facts;

static bool str_eq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static bool bn_training(const Onnx__NodeProto *n) {
  for (size_t i = 0; i < n->n_attribute; i++)
    if (str_eq(n->attribute[i]->name, "training_mode") && n->attribute[i]->i) return true;
  return false;
}

/* What the facts of each initializer are looked up in: a scan of the
 * nodes, inputs and value_infos per initializer was quadratic in a model
 * with a weight per node. */
typedef struct roles_index {
  nv_strmap bn;     /* name -> 4 * node index + 2 * (input k - 3) + training (0 or 1) */
  nv_strmap vinfo;  /* name -> its value_info (the last of the name) */
  nv_strmap input;  /* name -> its graph input (the last of the name) */
  nv_strmap bound;  /* names in a training_info update_binding */
  nv_strmap reach;  /* fe_train_roles.reach */
} roles_index;

static void index_free(roles_index *ix) {
  nv_strmap_free(&ix->bn);
  nv_strmap_free(&ix->vinfo);
  nv_strmap_free(&ix->input);
  nv_strmap_free(&ix->bound);
  nv_strmap_free(&ix->reach);
}

static int index_build(const Onnx__ModelProto *m, const fe_train_roles *r, roles_index *ix) {
  const Onnx__GraphProto *gr = m->graph;
  for (size_t i = 0; i < gr->n_node; i++) { /* a node in training mode wins, else the last node */
    const Onnx__NodeProto *n = gr->node[i];
    if (!str_eq(n->op_type, "BatchNormalization") || i > INT32_MAX / 8) continue;
    bool train = bn_training(n);
    for (size_t k = 3; k < 5 && k < n->n_input; k++) {
      if (!n->input[k]) continue;
      int was = nv_strmap_get(&ix->bn, n->input[k]);
      if ((was < 0 || !(was & 1)) && nv_strmap_put(&ix->bn, n->input[k], (int)(4 * i + 2 * (k - 3) + train)))
        return -1;
    }
  }
  for (size_t i = 0; i < gr->n_value_info && i < INT32_MAX; i++)
    if (gr->value_info[i]->name && nv_strmap_put(&ix->vinfo, gr->value_info[i]->name, (int)i)) return -1;
  for (size_t i = 0; i < gr->n_input && i < INT32_MAX; i++)
    if (gr->input[i]->name && nv_strmap_put(&ix->input, gr->input[i]->name, (int)i)) return -1;
  for (size_t t = 0; t < m->n_training_info; t++)
    for (size_t i = 0; i < m->training_info[t]->n_update_binding; i++) {
      const char *k = m->training_info[t]->update_binding[i]->key;
      if (k && nv_strmap_put(&ix->bound, k, 1)) return -1;
    }
  for (int i = 0; i < r->nreach; i++)
    if (r->reach[i] && nv_strmap_put(&ix->reach, r->reach[i], 1)) return -1;
  return 0;
}

static void find_bn(const Onnx__GraphProto *gr, const roles_index *ix, const char *name, facts *f) {
  int b = nv_strmap_get(&ix->bn, name);
  if (b < 0) return;
  const Onnx__NodeProto *n = gr->node[b / 4];
  f->bn_node = n->name && *n->name ? n->name : "?";
  f->bn_input = b / 2 % 2 + 4;
  f->bn_train = b & 1;
}

/* A varint at p[0..len); its value and size, or 0 if malformed. */
static size_t varint(const uint8_t *p, size_t len, uint64_t *v) {
  *v = 0;
  for (size_t i = 0; i < len && i < 10; i++) {
    *v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
    if (!(p[i] & 0x80)) return i + 1;
  }
  return 0;
}

/* ValueInfoProto.metadata_props (field 4, newer than the onnx.proto novac is
 * built with: kept by protobuf-c as an unknown field). */
static void torch_kind(const Onnx__ValueInfoProto *vi, facts *f) {
  const ProtobufCMessage *b = &vi->base;
  for (unsigned i = 0; i < b->n_unknown_fields; i++) {
    const ProtobufCMessageUnknownField *u = &b->unknown_fields[i];
    if (u->tag != 4 || u->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) continue;
    uint64_t n;
    size_t h = varint(u->data, u->len, &n);
    const uint8_t *p = u->data;
    size_t len = u->len;
    if (h && h + n == u->len) p += h, len = (size_t)n; /* the length prefix is kept with the data */
    Onnx__StringStringEntryProto *e = onnx__string_string_entry_proto__unpack(NULL, len, p);
    if (!e) continue;
    if (str_eq(e->key, OX_KIND_KEY) && e->value) snprintf(f->torch_kind, sizeof f->torch_kind, "%s", e->value);
    onnx__string_string_entry_proto__free_unpacked(e, NULL);
  }
}

static void gather_facts(const Onnx__ModelProto *m, const roles_index *ix, const char *name, const fe_train_roles *r,
                         facts *f) {
  const Onnx__GraphProto *gr = m->graph;
  find_bn(gr, ix, name, f);
  int v = nv_strmap_get(&ix->vinfo, name), in = nv_strmap_get(&ix->input, name);
  if (v >= 0) torch_kind(gr->value_info[v], f);
  if (in >= 0) torch_kind(gr->input[in], f);
  f->ti_bound = nv_strmap_get(&ix->bound, name) >= 0;
  f->reached = r->nreach < 0 || nv_strmap_get(&ix->reach, name) >= 0;
}

/* Rule 8: the PyTorch buffer name it looks like, or NULL. */
static const char *buffer_name(const char *name) {
  static const char *const pat[] = {"*running_mean", "*running_var", "*num_batches_tracked", "*inv_freq"};
  for (size_t i = 0; i < sizeof pat / sizeof *pat; i++)
    if (fnmatch(pat[i], name, 0) == 0) return pat[i];
  return NULL;
}

/* The role of one float initializer by rules 2 to 10 (before the
 * differentiable-path check); the reason into WHY. */
static nv_init_role decide(const Onnx__ModelProto *m, const char *name, const fe_train_roles *r, const facts *f,
                           bool *fm, bool *tm, bool *updated, char *why, size_t n) {
  bool only = nv_glob_match(r->train_only, name, tm); /* counted even where another rule wins */
  bool frozen = nv_glob_match(r->freeze, name, fm);
  if (f->bn_node && f->bn_train) { /* never trained; --freeze does not stop the update (PyTorch's eval() would) */
    *updated = true;
    snprintf(why, n, "input %d of BatchNormalization '%s' in training mode: a running statistic, updated by the step",
             f->bn_input, f->bn_node);
    return NV_IROLE_BUFFER;
  }
  if (frozen) return snprintf(why, n, "--freeze"), NV_IROLE_CONSTANT;
  if (r->train_only) {
    snprintf(why, n, only ? "--train-only" : "not matched by --train-only");
    return only ? NV_IROLE_PARAM : NV_IROLE_CONSTANT;
  }
  if (f->ti_bound) return snprintf(why, n, "training_info: named in an update_binding"), NV_IROLE_PARAM;
  if (*f->torch_kind) {
    snprintf(why, n, "torch.export InputSpec.kind %s", f->torch_kind);
    if (!strcmp(f->torch_kind, "PARAMETER")) return NV_IROLE_PARAM;
    if (!strcmp(f->torch_kind, "BUFFER")) return NV_IROLE_BUFFER;
    if (!strcmp(f->torch_kind, "CONSTANT_TENSOR")) return NV_IROLE_CONSTANT;
  }
  if (f->bn_node) {
    snprintf(why, n, "input %d of BatchNormalization '%s' (inference mode): a running statistic", f->bn_input,
             f->bn_node);
    return NV_IROLE_BUFFER;
  }
  const char *b = buffer_name(name);
  if (b) return snprintf(why, n, "named like a PyTorch buffer (%s)", b), NV_IROLE_BUFFER;
  if (m->n_training_info) return snprintf(why, n, "training_info: not named in any update_binding"), NV_IROLE_CONSTANT;
  return snprintf(why, n, "floating-point, with a differentiable path to the loss"), NV_IROLE_PARAM;
}

static int64_t numel_of(const Onnx__TensorProto *tp) {
  int64_t n = 1;
  for (size_t i = 0; i < tp->n_dims; i++) n = tp->dims[i] > 0 && n <= NV_MAX_NUMEL ? n * tp->dims[i] : 0;
  return n;
}

/* One initializer's entry of g->inits. */
static int classify(ox_ctx *x, const Onnx__ModelProto *m, const roles_index *ix, const Onnx__TensorProto *tp,
                    const fe_train_roles *r, bool *fm, bool *tm, nv_initializer *out) {
  char why[400];
  facts f = {0};
  bool updated = false;
  nv_init_role role = NV_IROLE_CONSTANT;
  if (!fe_dtype_is_float(ox_dtype_of_onnx(tp->data_type))) snprintf(why, sizeof why, "not floating-point");
  else if (r->probe) { /* the first import: every float a parameter, to find the differentiable paths */
    snprintf(why, sizeof why, "probe");
    role = NV_IROLE_PARAM;
  } else {
    gather_facts(m, ix, tp->name, r, &f);
    role = decide(m, tp->name, r, &f, fm, tm, &updated, why, sizeof why);
    if (role == NV_IROLE_PARAM && !f.reached) {
      size_t k = strlen(why);
      snprintf(why + k, sizeof why - k, ", but no differentiable path to the loss");
      role = NV_IROLE_CONSTANT;
    }
    if (role == NV_IROLE_BUFFER && f.reached && !strncmp(why, "named like", 10))
      nv_warning(x->d, x->loc, "initializer '%s' is %s, but the loss depends on it through differentiable ops: it is "
                 "kept a buffer (not trained); to train it, name it in --train-only (with the parameters to train), "
                 "or --freeze it to keep it constant without this warning", tp->name, why);
  }
  *out = (nv_initializer){nv_xstrdup(tp->name), role, role != NV_IROLE_PARAM && !updated && numel_of(tp) <= FE_FOLD_MAX_NUMEL,
                          nv_xstrdup(why)};
  return out->name && out->reason ? 0 : -1;
}

/* Each pattern of GLOBS (option OPT) must match an initializer. */
static int check_globs(ox_ctx *x, const char *opt, const char *globs, const bool *matched) {
  for (int k = 0; k < nv_glob_count(globs); k++)
    if (!matched[k]) return ox_err(x, "%s: pattern %d of '%s' matches no initializer", opt, k + 1, globs);
  return 0;
}

int ox_roles_decide(ox_ctx *x, const Onnx__ModelProto *m, const fe_train_roles *r) {
  const Onnx__GraphProto *gr = m->graph;
  bool fm[64] = {0}, tm[64] = {0};
  nv_graph *g = x->g;
  g->inits = nv_xcalloc(gr->n_initializer + 1, sizeof *g->inits);
  if (!g->inits || gr->n_initializer > INT32_MAX) return -1;
  roles_index ix = {0};
  int rc = index_build(m, r, &ix);
  for (size_t i = 0; !rc && i < gr->n_initializer; i++) {
    const Onnx__TensorProto *tp = gr->initializer[i];
    if (!tp->name || !*tp->name || nv_strmap_get(&x->used, tp->name) < 0) continue;
    int k = g->ninits++; /* counted even when it fails: the graph frees what it holds */
    rc = classify(x, m, &ix, tp, r, fm, tm, &g->inits[k]);
    if (!rc && nv_strmap_get(&x->inits, tp->name) < 0) rc = nv_strmap_put(&x->inits, g->inits[k].name, k);
  }
  index_free(&ix);
  if (rc) return -1;
  if (!r->probe && (check_globs(x, "--freeze", r->freeze, fm) || check_globs(x, "--train-only", r->train_only, tm)))
    return -1;
  return 0;
}

const nv_initializer *ox_init_role(const ox_ctx *x, const char *name) {
  int i = nv_strmap_get(&x->inits, name);
  return i >= 0 ? &x->g->inits[i] : NULL;
}

int ox_state_update(ox_ctx *x, ox_val v, nv_node *value) {
  nv_node *buffer = v.node;
  if (!buffer || buffer->op != NV_OP_PARAM || buffer->role != NOVA_ROLE_BUFFER) return 0;
  if (!value) return -1;
  char name[600];
  snprintf(name, sizeof name, "%s.next", buffer->name);
  for (int i = 0; i < x->g->noutputs; i++)
    if (x->g->outputs[i].updates == buffer)
      return ox_err(x, "buffer '%s' is updated by two nodes (a running statistic may belong to one "
                    "BatchNormalization only)", buffer->name);
  if (fe_graph_add_output(x->g, x->d, name, value, x->loc)) return -1;
  x->g->outputs[x->g->noutputs - 1].role = NOVA_ROLE_UPDATE;
  x->g->outputs[x->g->noutputs - 1].updates = buffer;
  return 0;
}

double ox_running_var_scale(const ox_ctx *x, const nv_node *a) {
  double n = a->shape[1] > 0 ? (double)fe_numel(a) / (double)a->shape[1] : 0;
  return x->g->inits && n > 1 ? n / (n - 1) : 1;
}

/* rng.seed and rng.step, made at the first dropout (with rng.step's update). */
static int rng_state(ox_ctx *x, nv_node **seed, nv_node **step) {
  nv_loc nowhere = {x->file, 0, 0};
  int made = fe_rng_state(x->g, x->d, nowhere, seed, step);
  if (made <= 0) return made;
  nv_node *one = fe_graph_leaf(x->g, x->d, NV_OP_CONSTANT, NULL, NOVA_DTYPE_I64, 0, NULL, nowhere);
  if (!one) return -1;
  one->init = (nv_init){.kind = NV_INIT_CONST, .a = 1};
  return ox_state_update(x, (ox_val){.node = *step, .present = true}, ox_add(x, NV_OP_ADD, 2, (nv_node *[]){*step, one}, NULL));
}

nv_node *ox_dropout(ox_ctx *x, nv_node *a, double ratio) {
  nv_node *seed, *step;
  if (!a || rng_state(x, &seed, &step)) return NULL;
  int64_t stream = 0;
  for (int i = 0; i < x->g->nnodes; i++) stream += x->g->nodes[i]->op == NV_OP_DROPOUT;
  nv_node at = {.value = ratio, .axis = stream};
  return ox_add(x, NV_OP_DROPOUT, 3, (nv_node *[]){a, seed, step}, &at);
}
