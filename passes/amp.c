/* amp.c: mixed precision on the forward graph (see amp.h).
 *
 * The graph is rebuilt in its order into a new node list: leaves (inputs,
 * params, constants) move over as they are; every other node is made
 * again by fe_graph_add over its inputs as this pass maps them (so its
 * dtype is inferred and checked again), after the casts its compute dtype
 * needs.  A value's low and f32 forms are each made at most once. */
#include <cjson/cJSON.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "amp.h"
#include "autodiff.h"
#include "../support/util.h"

void amp_policy_default(amp_policy *p) {
  *p = (amp_policy){0};
  for (int i = 0; i < NV_OP_COUNT; i++) p->op[i] = AMP_FOLLOW;
  static const nv_op low[] = {NV_OP_MATMUL, NV_OP_CONV, NV_OP_CONV_GRAD_INPUT, NV_OP_CONV_GRAD_WEIGHT,
                              NV_OP_ATTENTION};
  static const nv_op wide[] = {NV_OP_SOFTMAX,    NV_OP_LOG_SOFTMAX, NV_OP_LAYER_NORM,  NV_OP_RMS_NORM,
                               NV_OP_REDUCE_SUM, NV_OP_REDUCE_MEAN, NV_OP_REDUCE_PROD, NV_OP_CUMSUM,
                               NV_OP_CROSS_ENTROPY, NV_OP_EXP,      NV_OP_LOG,         NV_OP_POW,
                               NV_OP_SINH,       NV_OP_COSH,        NV_OP_TAN,         NV_OP_ASIN,
                               NV_OP_ACOS};
  for (size_t i = 0; i < sizeof low / sizeof *low; i++) p->op[low[i]] = AMP_LOW;
  for (size_t i = 0; i < sizeof wide / sizeof *wide; i++) p->op[wide[i]] = AMP_F32;
}

void amp_policy_free(amp_policy *p) {
  for (int i = 0; i < p->nrules; i++) free(p->rules[i].glob);
  free(p->rules);
  p->rules = NULL;
  p->nrules = 0;
}

static int parse_class(nv_diag *d, const char *path, const char *key, const cJSON *v, amp_class *out) {
  const char *s = cJSON_IsString(v) ? v->valuestring : NULL;
  if (s && !strcmp(s, "low")) *out = AMP_LOW;
  else if (s && (!strcmp(s, "f32") || !strcmp(s, "fp32"))) *out = AMP_F32;
  else if (s && !strcmp(s, "follow")) *out = AMP_FOLLOW;
  else {
    nv_error_plain(d, "%s: '%s': the class must be \"low\", \"f32\" or \"follow\"", path, key);
    return -1;
  }
  return 0;
}

int amp_policy_load(amp_policy *p, nv_diag *d, const char *path) {
  size_t len = 0;
  char *text = nv_read_file(path, &len, (size_t)1 << 20);
  if (!text) {
    nv_error_plain(d, "--precision-policy: cannot read %s", path);
    return -1;
  }
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  int rc = -1;
  if (!cJSON_IsObject(root)) {
    nv_error_plain(d, "%s: not a JSON object (expected {\"ops\": {...}, \"names\": {...}})", path);
    goto out;
  }
  for (const cJSON *sec = root->child; sec; sec = sec->next) {
    bool ops = !strcmp(sec->string, "ops"), names = !strcmp(sec->string, "names");
    if ((!ops && !names) || !cJSON_IsObject(sec)) {
      nv_error_plain(d, "%s: unknown key '%s' (the policy has objects \"ops\" and \"names\")", path, sec->string);
      goto out;
    }
    for (const cJSON *e = sec->child; e; e = e->next) {
      amp_class c;
      if (parse_class(d, path, e->string, e, &c)) goto out;
      if (ops) {
        nv_op op = nv_op_lookup(e->string);
        if (op == NV_OP_COUNT || op == NV_OP_INPUT || op == NV_OP_PARAM || op == NV_OP_CONSTANT) {
          nv_error_plain(d, "%s: \"ops\": unknown op '%s' (op kinds as nova-format(5) names them: matmul, softmax, ...)",
                         path, e->string);
          goto out;
        }
        p->op[op] = c;
        continue;
      }
      amp_rule *r = nv_xrealloc(p->rules, (size_t)(p->nrules + 1) * sizeof *r);
      if (!r) goto out;
      p->rules = r;
      if (!(r[p->nrules].glob = nv_xstrdup(e->string))) goto out;
      r[p->nrules++].cls = c;
    }
  }
  rc = 0;
out:
  cJSON_Delete(root);
  return rc;
}

/* The name a policy rule matches: the value's own (.nova), else the ONNX
 * node's, from its location "file: node 'NAME' (Op)" (into BUF). */
static const char *node_name(const nv_node *n, char *buf, size_t size) {
  if (n->name) return n->name;
  const char *f = n->loc.file, *s = f ? strstr(f, ": node '") : NULL, *e = s ? strstr(s + 8, "' (") : NULL;
  if (!e) return NULL;
  snprintf(buf, size, "%.*s", (int)(e - s - 8), s + 8);
  return buf;
}

static amp_class class_of(const amp_policy *p, const nv_node *n) {
  char buf[256];
  const char *name = p->nrules ? node_name(n, buf, sizeof buf) : NULL;
  for (int i = 0; name && i < p->nrules; i++)
    if (fnmatch(p->rules[i].glob, name, 0) == 0) return p->rules[i].cls;
  return p->op[n->op];
}

typedef struct amp {
  nv_graph *g, *out;      /* the graph and the one being built */
  nv_diag *d;
  nova_dtype low;         /* 0: no policy (masters only) */
  nv_node **map;          /* old id -> its value in OUT (possibly in the low precision) */
  nv_node **as_low, **as_f32, **as_orig; /* old id -> its cast, when made */
  nova_dtype *orig;       /* old id -> its dtype before this pass (a master's: f16 or bf16) */
  bool *weight;           /* old id -> computed from params and constants only */
  amp_stats *st;
} amp;

/* Old node N's value in OUT in dtype DT (its own, f32 or the low
 * precision): the mapped value or its cast. */
static nv_node *in_dtype(amp *A, const nv_node *n, nova_dtype dt) {
  nv_node *v = A->map[n->id];
  if (v->dtype == dt) return v;
  nv_node **slot = dt == NOVA_DTYPE_F32 ? &A->as_f32[n->id] : dt == A->low ? &A->as_low[n->id] : &A->as_orig[n->id];
  if (!*slot) {
    *slot = fe_graph_add(A->out, A->d, NV_OP_CAST, 1, &v, &(nv_node){.to = dt}, n->loc);
    A->st->casts += *slot != NULL;
  }
  return *slot;
}

/* The dtype N's f32 operands are given, by its class. */
static nova_dtype compute_dtype(amp *A, const nv_node *n, amp_class c) {
  if (!A->low) return NOVA_DTYPE_F32;
  if (c != AMP_FOLLOW) return c == AMP_LOW ? A->low : NOVA_DTYPE_F32;
  bool low = false;
  for (int i = 0; i < n->nin; i++) {
    const nv_node *x = n->in[i];
    if (A->orig[x->id] != NOVA_DTYPE_F32) continue;
    if (A->map[x->id]->dtype == A->low) low = true;
    else if (!A->weight[x->id]) return NOVA_DTYPE_F32; /* an f32 activation: promote */
  }
  return low ? A->low : NOVA_DTYPE_F32;
}

static bool trained(const amp_options *o, const nv_node *n) {
  bool fm[NV_MAX_GLOBS], tm[NV_MAX_GLOBS];
  return o->masters && ad_trains(n, o->freeze, o->train_only, fm, tm);
}

/* Whether N is a trained f16/bf16 param, of which the step keeps an f32
 * master (a bf16 one none with bf16_params). */
static bool wants_master(const amp_options *o, const nv_node *n) {
  return fe_dtype_is_half(n->dtype) && !(o->bf16_params && n->dtype == NOVA_DTYPE_BF16) && trained(o, n);
}

/* Param N's dtype becomes TO (f32 from f16/bf16, or bf16 from f32/f16):
 * its initial bytes converted (exactly to f32; rounded to nearest to
 * bf16); a recipe (normal, ...) draws in TO directly.  0, or -1 after a
 * diagnostic. */
static int retype(amp *A, nv_node *n, nova_dtype to) {
  if (fe_init_is_bytes(n)) {
    int64_t k = fe_numel(n);
    bool from32 = n->dtype == NOVA_DTYPE_F32, to32 = to == NOVA_DTYPE_F32;
    void *src = nv_xmalloc((size_t)k * (from32 ? 4 : 2) + 4), *dst = nv_xmalloc((size_t)k * (to32 ? 4 : 2) + 4);
    if (!src || !dst || fe_init_fill(A->g, A->d, n, src)) {
      free(src);
      free(dst);
      return -1;
    }
    for (int64_t j = 0; j < k; j++) {
      double v = from32 ? ((float *)src)[j] : fe_half_to_double(n->dtype, ((uint16_t *)src)[j]);
      if (to32) ((float *)dst)[j] = (float)v;
      else ((uint16_t *)dst)[j] = fe_half_from_double(to, v);
    }
    free(src);
    free(n->init.path);
    free(n->init.data);
    n->init = (nv_init){.kind = NV_INIT_DATA, .data = dst};
  }
  n->dtype = to;
  return 0;
}

/* N (a param) becomes its own f32 master; or (a trained f32 or f16 param,
 * with bf16_params) a bf16 param. */
static int make_master(amp *A, nv_node *n) {
  A->st->masters++;
  return retype(A, n, NOVA_DTYPE_F32);
}

static int make_bf16(amp *A, nv_node *n) {
  A->st->bf16_params++;
  return retype(A, n, NOVA_DTYPE_BF16);
}

static int rebuild(amp *A, const amp_options *o) {
  nv_graph *g = A->g;
  for (int i = 0; i < g->nnodes; i++) A->orig[i] = g->nodes[i]->dtype;
  for (int i = 0; i < g->nnodes; i++) {
    nv_node *n = g->nodes[i];
    if (!n->nin) {
      A->weight[i] = n->op != NV_OP_INPUT;
      A->map[i] = n; /* placed first, when the rest is built */
      bool to_bf16 = o->bf16_params && n->op == NV_OP_PARAM &&
                     (n->dtype == NOVA_DTYPE_F32 || n->dtype == NOVA_DTYPE_F16) && trained(o, n);
      if (to_bf16 ? make_bf16(A, n) : wants_master(o, n) && make_master(A, n)) return -1;
      continue;
    }
    nova_dtype dt = compute_dtype(A, n, A->low ? class_of(o->policy, n) : AMP_FOLLOW);
    nv_node *in[64];
    if (n->nin > 64) return -1;
    bool weight = true, low = false;
    for (int k = 0; k < n->nin; k++) {
      const nv_node *x = n->in[k];
      nova_dtype was = A->orig[x->id];
      weight &= A->weight[x->id];
      in[k] = was != NOVA_DTYPE_F32 ? in_dtype(A, x, was) /* as it was (a master: rounded) */
            : n->op == NV_OP_CAST ? A->map[x->id]      /* an explicit cast takes any dtype */
            : in_dtype(A, x, dt);
      if (!in[k]) return -1;
      low |= in[k]->dtype == A->low && was == NOVA_DTYPE_F32;
    }
    nv_node *m = fe_graph_add(A->out, A->d, n->op, n->nin, in, n, n->loc);
    if (!m) {
      nv_note(A->d, n->loc, "--precision: %s computed in %s by the precision policy", nv_op_name(n->op),
              fe_dtype_name(dt));
      return -1;
    }
    A->map[i] = m;
    A->weight[i] = weight;
    A->st->low_ops += low || (A->low && m->dtype == A->low && n->dtype == NOVA_DTYPE_F32);
  }
  /* commit: the leaves in their order, then the rebuilt nodes; the
   * outputs and names move over (before this point only masters changed) */
  int nl = 0;
  for (int i = 0; i < g->nnodes; i++) nl += !g->nodes[i]->nin;
  nv_node **outs = nv_xcalloc((size_t)g->noutputs + 1, sizeof *outs), **all = NULL;
  for (int i = 0; outs && i < g->noutputs; i++) /* the interface keeps its dtypes (casts added to A->out) */
    if (!(outs[i] = in_dtype(A, g->outputs[i].node, A->orig[g->outputs[i].node->id]))) break;
  if (outs && (!g->noutputs || outs[g->noutputs - 1])) /* sized after those casts */
    all = nv_xmalloc(((size_t)nl + (size_t)A->out->nnodes + 1) * sizeof *all);
  if (!outs || !all || (g->noutputs && !outs[g->noutputs - 1])) {
    free(outs);
    free(all);
    return -1;
  }
  for (int i = 0; i < g->noutputs; i++) g->outputs[i].node = outs[i];
  free(outs);
  int k = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (!g->nodes[i]->nin) all[k++] = g->nodes[i];
  for (int i = 0; i < A->out->nnodes; i++) all[k++] = A->out->nodes[i];
  for (int i = 0; i < g->nnodes; i++) { /* the old nodes go; names move to the new ones */
    nv_node *x = g->nodes[i];
    if (!x->nin) continue;
    A->map[i]->name = x->name;
    free(x->in);
    free(x);
  }
  for (int i = 0; i < k; i++) all[i]->id = i;
  free(g->nodes);
  free(A->out->nodes);
  g->nodes = all;
  g->nnodes = g->capnodes = k;
  A->out->nodes = NULL;
  A->out->nnodes = 0;
  return 0;
}

int amp_apply(nv_graph *g, nv_diag *d, const amp_options *o, amp_stats *st) {
  size_t n = (size_t)g->nnodes + 1;
  amp_stats none;
  amp A = {.g = g, .d = d, .low = o->low, .st = st ? st : &none};
  *A.st = (amp_stats){0};
  A.out = fe_graph_create();
  A.map = nv_xcalloc(n, sizeof *A.map);
  A.as_low = nv_xcalloc(n, sizeof *A.as_low);
  A.as_f32 = nv_xcalloc(n, sizeof *A.as_f32);
  A.as_orig = nv_xcalloc(n, sizeof *A.as_orig);
  A.orig = nv_xcalloc(n, sizeof *A.orig);
  A.weight = nv_xcalloc(n, sizeof *A.weight);
  int rc = -1;
  if (A.out && A.map && A.as_low && A.as_f32 && A.as_orig && A.orig && A.weight) {
    A.out->allow_empty = g->allow_empty;
    rc = rebuild(&A, o);
  }
  if (A.out) { /* on a failure, what was built goes (G keeps its nodes; the compile stops) */
    for (int i = 0; i < A.out->nnodes; i++) free(A.out->nodes[i]->in), free(A.out->nodes[i]);
    free(A.out->nodes);
    free(A.out);
  }
  free(A.map);
  free(A.as_low);
  free(A.as_f32);
  free(A.as_orig);
  free(A.orig);
  free(A.weight);
  return rc;
}
