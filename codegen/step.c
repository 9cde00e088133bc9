/* step.c: object + descriptor + runtime -> step.so, and its manifest.
 *
 * The descriptor (desc.c, generated into a private temporary folder) defines
 * `nova_rt_graph` (runtime/rt_graph.h): the tensor table, the argument order
 * of @forward, and the initial parameter values, which desc.c pulls in with
 * .incbin from init.bin.  Everything is linked with the runtime into a
 * temporary file that is renamed over the output only when complete.
 * Exports are limited to the nova_step_* ABI by a version script.
 * Same input and flags give byte-identical outputs: no paths, times or
 * addresses reach the files.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../support/util.h"
#include "codegen.h"
#include "rt_init.h"

typedef struct step_tensor {
  const nv_node *node;
  const char *name;
  nova_role role;
  int64_t init_offset; /* params, opt_state, inputs with a default given as bytes: offset in init.bin; else -1 */
  int32_t updates;     /* role update: index of the tensor it replaces; else -1 */
  int init_kind;       /* a generated initial value (RT_INIT_*), computed by the step when it opens */
  double init_a, init_b;
} step_tensor;

/* The step's tensors in entry-argument order: inputs, params, outputs
 * (the same order nova_build_module gives @forward). */
static int collect(const nv_graph *g, step_tensor **out, int64_t *init_size) {
  step_tensor *t = nv_xcalloc((size_t)g->nnodes + (size_t)g->noutputs + 1, sizeof *t);
  if (!t) return -1;
  int n = 0;
  int64_t off = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < g->nnodes; i++) {
      const nv_node *x = g->nodes[i];
      if ((pass == 0 && x->op != NV_OP_INPUT) || (pass == 1 && x->op != NV_OP_PARAM)) continue;
      t[n] = (step_tensor){x, x->name, x->role, -1, -1, RT_INIT_NONE, 0, 0};
      /* init.bin holds only bytes that came from a file or a model: a
       * generated value (normal, he, ...) travels as its recipe, zeros as
       * nothing (the runtime zeroes every buffer it allocates) */
      if (x->op == NV_OP_PARAM || x->has_default) t[n].init_kind = fe_init_recipe(x, &t[n].init_a, &t[n].init_b);
      bool bytes = fe_init_is_bytes(x);
      if (x->has_default && !bytes && t[n].init_kind == RT_INIT_NONE) t[n].init_kind = RT_INIT_CONST; /* 0 */
      if ((x->op == NV_OP_PARAM || x->has_default) && bytes) {
        t[n].init_offset = off;
        off += (fe_numel(x) * (int64_t)fe_dtype_size(x->dtype) + 63) / 64 * 64;
      }
      n++;
    }
  int nargs = n;
  for (int i = 0; i < g->noutputs; i++) {
    const nv_output *o = &g->outputs[i];
    t[n] = (step_tensor){o->node, o->name, o->role, -1, -1, RT_INIT_NONE, 0, 0};
    for (int k = 0; o->updates && k < nargs; k++)
      if (t[k].node == o->updates) t[n].updates = k;
    n++;
  }
  *out = t;
  *init_size = off;
  return n;
}

int cg_init_layout(const nv_graph *g, cg_init_slot **slots, int *nslots, int64_t *size) {
  step_tensor *t;
  int n = collect(g, &t, size), k = 0;
  *slots = n >= 0 ? nv_xcalloc((size_t)n + 1, sizeof **slots) : NULL;
  if (!*slots) {
    if (n >= 0) free(t);
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (t[i].init_offset >= 0)
      (*slots)[k++] = (cg_init_slot){t[i].name, t[i].node->dtype, t[i].init_offset,
                                     fe_numel(t[i].node) * (int64_t)fe_dtype_size(t[i].node->dtype)};
  *nslots = k;
  free(t);
  return 0;
}

static int write_init(nova_ctx *c, const nv_graph *g, const step_tensor *t, int n, int64_t size,
                      const char *path) {
  unsigned char *buf = nv_xcalloc(1, size ? (size_t)size : 1);
  if (!buf) {
    nv_error_plain(c->diag, "out of memory for %lld bytes of initial parameter values", (long long)size);
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < n && !rc; i++)
    if (t[i].init_offset >= 0) rc = fe_init_fill(g, c->diag, t[i].node, buf + t[i].init_offset);
  FILE *f = rc ? NULL : fopen(path, "wb");
  if (!rc && (!f || fwrite(buf, 1, (size_t)size, f) != (size_t)size)) {
    nv_error_plain(c->diag, "cannot write %s: %s", path, strerror(errno));
    rc = -1;
  }
  if (f && fclose(f) && !rc) { /* the buffered bytes are written here */
    nv_error_plain(c->diag, "cannot write %s: %s", path, strerror(errno));
    rc = -1;
  }
  free(buf);
  return rc;
}

/* A C expression for the double V, exactly (hexadecimal). */
static void c_double(nv_sbuf *b, double v) {
  if (isnan(v)) nv_sb_printf(b, "__builtin_nan(\"\")");
  else if (isinf(v)) nv_sb_printf(b, "%s__builtin_inf()", v < 0 ? "-" : "");
  else nv_sb_printf(b, "%a", v);
}

/* A C string literal for s (octal escapes for anything unusual). */
static void c_string(nv_sbuf *b, const char *s) {
  nv_sb_printf(b, "\"");
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch < 32 || ch >= 127 || ch == '"' || ch == '\\' || ch == '?') nv_sb_printf(b, "\\%03o", ch);
    else nv_sb_printf(b, "%c", ch);
  }
  nv_sb_printf(b, "\"");
}

/* Whether tensor X of the training step can stand for E, a tensor of its
 * evaluation entry: the same name, dtype and shape, and a role of the same
 * kind (input or label; param or buffer; output or loss). */
static bool same_tensor(const step_tensor *x, const step_tensor *e, bool any_extent) {
  int kx = x->role <= NOVA_ROLE_LABEL ? 0 : x->role == NOVA_ROLE_PARAM || x->role == NOVA_ROLE_BUFFER ? 1
         : x->role == NOVA_ROLE_OUTPUT || x->role == NOVA_ROLE_LOSS ? 2 : 3;
  int ke = e->role <= NOVA_ROLE_LABEL ? 0 : e->role == NOVA_ROLE_PARAM || e->role == NOVA_ROLE_BUFFER ? 1 : 2;
  if (any_extent) kx = (int)x->role, ke = (int)e->role; /* a bucket's step: the same tensors */
  return kx == ke && !strcmp(x->name, e->name) && x->node->dtype == e->node->dtype && x->node->rank == e->node->rank &&
         (any_extent || !memcmp(x->node->shape, e->node->shape, (size_t)x->node->rank * sizeof x->node->shape[0]));
}

/* The arguments of E (the evaluation entry, or a smaller bucket's step:
 * ANY_EXTENT, its tensors' extents may differ) as tensors of the step
 * T[0..n) (*EA, owned; *NA of them), or -1 after a diagnostic. */
static int eval_args(nova_ctx *c, const nv_graph *e, const step_tensor *t, int n, bool any_extent, int32_t **ea,
                     int *na) {
  step_tensor *et;
  int64_t isz;
  int en = collect(e, &et, &isz), rc = 0;
  *ea = en >= 0 ? nv_xcalloc((size_t)en + 1, sizeof **ea) : NULL;
  for (int k = 0; *ea && k < en && !rc; k++) {
    int j = 0;
    while (j < n && !same_tensor(&t[j], &et[k], any_extent)) j++;
    if (j == n) {
      nv_error_plain(c->diag, "internal: tensor '%s' of the %s is not a tensor of the step", et[k].name,
                     any_extent ? "step of a smaller size" : "evaluation entry");
      rc = -1;
    }
    (*ea)[k] = j;
  }
  if (en >= 0) free(et);
  *na = en;
  return *ea && !rc ? 0 : -1;
}

/* The descriptor's evaluation fields (after arena_bytes). */
static void desc_eval(nv_sbuf *b, const int32_t *ea, int na) {
  if (!ea) return; /* the entry takes its buffers' array, the arena last (cg_pack_entry) */
  nv_sb_printf(b, "extern void " CG_EVAL_PREFIX "forward(void **);\n"
                  "static void eval_entry(void **a) { " CG_EVAL_PREFIX "forward(a); }\n"
                  "static const int32_t eval_args[] = {");
  for (int i = 0; i < na; i++) nv_sb_printf(b, "%s%d", i ? ", " : "", (int)ea[i]);
  nv_sb_printf(b, "%s};\n\n", na ? "" : "0");
}

/* A smaller bucket's arguments (eval_args), its evaluation entry's too. */
typedef struct bucket_args {
  int32_t *args, *eargs;
  int nargs, neargs;
} bucket_args;

static int64_t plan_arena(const cg_plan *p) { return p && p->planned ? p->arena_bytes : 0; }

/* The descriptor's bucket table and axes (before nova_rt_graph), for a
 * step of several sizes: the smaller buckets (BA), then the step itself. */
static void desc_buckets(nv_sbuf *b, const nv_graph *g, const step_tensor *t, int n, const cg_options *o,
                         const bucket_args *ba, const int32_t *ea, int nea, int64_t arena) {
  const char *entry = g->train ? "train_step" : "forward";
  for (int k = 0; k < o->nbuckets; k++) {
    const cg_bucket *bk = &o->buckets[k];
    nv_sb_printf(b, "extern void %s%s(void **);\nstatic const int32_t b%d_args[] = {", bk->prefix, entry, k);
    for (int i = 0; i < ba[k].nargs; i++) nv_sb_printf(b, "%s%d", i ? ", " : "", (int)ba[k].args[i]);
    nv_sb_printf(b, "%s};\n", ba[k].nargs ? "" : "0");
    if (!ba[k].eargs) continue;
    nv_sb_printf(b, "extern void %s" CG_EVAL_PREFIX "forward(void **);\nstatic const int32_t b%d_eargs[] = {",
                 bk->prefix, k);
    for (int i = 0; i < ba[k].neargs; i++) nv_sb_printf(b, "%s%d", i ? ", " : "", (int)ba[k].eargs[i]);
    nv_sb_printf(b, "%s};\n", ba[k].neargs ? "" : "0");
  }
  nv_sb_printf(b, "static const rt_bucket buckets[] = {\n");
  for (int k = 0; k < o->nbuckets; k++) {
    const cg_bucket *bk = &o->buckets[k];
    nv_sb_printf(b, "  {%lld, %s%s, %d, b%d_args, %lld, ", (long long)bk->size, bk->prefix, entry, ba[k].nargs, k,
                 (long long)plan_arena(bk->plan));
    if (ba[k].eargs)
      nv_sb_printf(b, "%s" CG_EVAL_PREFIX "forward, %d, b%d_eargs, %lld},\n", bk->prefix, ba[k].neargs, k,
                   (long long)plan_arena(bk->eval_plan));
    else nv_sb_printf(b, "0, 0, 0, 0},\n");
  }
  nv_sb_printf(b, "  {%lld, entry, %d, args, %lld, ", (long long)o->dim_hi, n, (long long)arena);
  if (ea) nv_sb_printf(b, "eval_entry, %d, eval_args, %lld},\n};\n", nea, (long long)plan_arena(o->eval_plan));
  else nv_sb_printf(b, "0, 0, 0, 0},\n};\n");
  nv_sb_printf(b, "static const rt_dim_axis dim_axes[] = {");
  int na = 0;
  for (int i = 0; i < o->ndim_axes; i++)
    for (int j = 0; j < n; j++)
      if (!strcmp(t[j].name, o->dim_axes[i].tensor) && t[j].role != NOVA_ROLE_GRAD && t[j].role != NOVA_ROLE_UPDATE)
        nv_sb_printf(b, "%s{%d, %d, %lld, %lld}", na++ ? ", " : "", j, o->dim_axes[i].axis,
                     (long long)o->dim_axes[i].a, (long long)o->dim_axes[i].c);
  nv_sb_printf(b, "%s};\n\n", na ? "" : "{0, 0, 0, 0}");
}

/* The descriptor's fields after the evaluation's, for a step of several sizes. */
static void desc_bucket_fields(nv_sbuf *b, const step_tensor *t, int n, const cg_options *o, bool eval) {
  char size[300];
  int st = -1, na = 0;
  snprintf(size, sizeof size, "%s.size", o->dim_name);
  for (int j = 0; j < n; j++)
    if (!strcmp(t[j].name, size) && t[j].role == NOVA_ROLE_INPUT) st = j;
  for (int i = 0; i < o->ndim_axes; i++)
    for (int j = 0; j < n; j++)
      na += !strcmp(t[j].name, o->dim_axes[i].tensor) && t[j].role != NOVA_ROLE_GRAD && t[j].role != NOVA_ROLE_UPDATE;
  if (!eval) nv_sb_printf(b, ", 0, 0, 0, 0");
  nv_sb_printf(b, ", ");
  c_string(b, o->dim_name);
  nv_sb_printf(b, ", %lld, %lld, %d, buckets, %d, dim_axes, %d", (long long)o->dim_lo, (long long)o->dim_hi,
               o->nbuckets + 1, na, st);
}

static int write_desc(const nv_graph *g, const step_tensor *t, int n, int64_t init_size, const char *hash,
                      const cg_gpu *gpu, const cg_plan *plan, const cg_options *o, const int32_t *ea, int nea,
                      const bucket_args *ba, const char *path) {
  int nargs_in = n - g->noutputs;
  nv_sbuf b = {0};
  int64_t arena = plan && plan->planned ? plan->arena_bytes : 0;
  int na = n + (arena > 0); /* the planned arena is the entry's last argument */
  nv_sb_printf(&b, "/* step descriptor generated by novac " NOVAC_VERSION " */\n#include \"rt_graph.h\"\n\n");
  const char *entry = g->train ? "train_step" : "forward";
  if (gpu) {
    int *rank = nv_xcalloc((size_t)n + 1, sizeof *rank);
    const int64_t **shape = nv_xcalloc((size_t)n + 1, sizeof *shape);
    if (!rank || !shape) b.oom = 1;
    for (int i = 0; !b.oom && i < n; i++) rank[i] = t[i].node->rank, shape[i] = t[i].node->shape;
    if (!b.oom && arena) rank[n] = 1, shape[n] = &plan->arena_bytes;
    if (!b.oom) cg_cuda_desc_entry(&b, entry, na, rank, shape);
    free(rank);
    free(shape);
  } else {
    /* the entry takes the array of its buffers (cg_pack_entry) */
    nv_sb_printf(&b, "extern void %s(void **);\nstatic void entry(void **a) { %s(a); }\n\n", entry, entry);
  }
  if (init_size > 0)
    nv_sb_printf(&b, "__asm__(\".section .rodata\\n.balign 64\\n.globl nova_init_data\\n.hidden nova_init_data\\n"
                     "nova_init_data:\\n.incbin \\\"init.bin\\\"\\n.previous\\n\");\n"
                     "extern const unsigned char nova_init_data[];\n\n");
  nv_sb_printf(&b, "static const rt_tensor_desc tensors[] = {\n");
  for (int i = 0; i < n; i++) {
    const nv_node *x = t[i].node;
    nv_sb_printf(&b, "  {");
    c_string(&b, t[i].name);
    nv_sb_printf(&b, ", %d, %d, %d, {", (int)t[i].role, (int)x->dtype, x->rank);
    for (int k = 0; k < x->rank; k++) nv_sb_printf(&b, "%s%lld", k ? ", " : "", (long long)x->shape[k]);
    bool arg = t[i].role == NOVA_ROLE_INPUT || t[i].role == NOVA_ROLE_LABEL || t[i].role == NOVA_ROLE_PARAM ||
               t[i].role == NOVA_ROLE_OPT_STATE || t[i].role == NOVA_ROLE_BUFFER;
    int64_t bound = arg ? x->index_bound : 0;
    bool inplace = plan && plan->inplace && i >= nargs_in && i - nargs_in < plan->noutputs && plan->inplace[i - nargs_in];
    bool skip = bound && x->has_index_skip;
    nv_sb_printf(&b, "%s}, %lld, %lld, %d, %lld, %d, %d, %lld, %d, ", x->rank ? "" : "0", (long long)bound,
                 (long long)t[i].init_offset, (int)t[i].updates, (long long)(bound && x->index_negative ? -bound : 0),
                 inplace ? 1 : 0, skip ? 1 : 0, (long long)(skip ? x->index_skip : 0), t[i].init_kind);
    c_double(&b, t[i].init_a);
    nv_sb_printf(&b, ", ");
    c_double(&b, t[i].init_b);
    nv_sb_printf(&b, ", %lluull},\n", (unsigned long long)(t[i].init_kind ? rt_init_seed(x->name, g->seed) : 0));
  }
  nv_sb_printf(&b, "};\n");
  desc_eval(&b, ea, nea);
  nv_sb_printf(&b, "static const int32_t args[] = {");
  for (int i = 0; i < n; i++) nv_sb_printf(&b, "%s%d", i ? ", " : "", i);
  nv_sb_printf(&b, "};\n\n");
  if (o->dim_name) desc_buckets(&b, g, t, n, o, ba, ea, nea, arena);
  nv_sb_printf(&b, "const rt_graph nova_rt_graph = {NOVA_STEP_ABI_VERSION, \"" NOVAC_VERSION "\", \"%s\",\n"
               "  %d, tensors, %d, args, %s, %lld, entry",
               hash, n, n, init_size > 0 ? "nova_init_data" : "0", (long long)init_size);
  if (gpu) cg_cuda_desc_fields(&b, gpu);
  else nv_sb_printf(&b, ", RT_TARGET_CPU, 0, 0, 0, 0, 0, 0");
  nv_sb_printf(&b, ", %lld", (long long)arena);
  if (ea)
    nv_sb_printf(&b, ", eval_entry, %d, eval_args, %lld", nea,
                 (long long)(o->eval_plan && o->eval_plan->planned ? o->eval_plan->arena_bytes : 0));
  if (o->dim_name) desc_bucket_fields(&b, t, n, o, ea != NULL);
  nv_sb_printf(&b, "};\n");
  FILE *f = b.oom ? NULL : fopen(path, "w");
  if (b.oom) errno = ENOMEM;
  int rc = f && fwrite(b.s, 1, b.len, f) == b.len ? 0 : -1;
  int e = errno;
  if (f && fclose(f) && !rc) rc = -1, e = errno;
  nv_sb_free(&b);
  errno = e;
  return rc;
}

/* The -fsanitize= flag the runtime beside this novac was built with (the
   Makefile's SAN; one build folder builds both): a step linking that runtime
   links the sanitizer's runtime too, else its __asan_* / __ubsan_* symbols
   stay undefined. */
#ifndef NOVA_RT_SANITIZE
#define NOVA_RT_SANITIZE ""
#endif

/* ---- manifest -------------------------------------------------------- */

static const char *role_name(nova_role r) {
  static const char *n[] = {"input", "label", "param", "opt_state", "output", "loss", "grad", "update", "buffer", "status"};
  return (unsigned)r < 10 ? n[r] : "?";
}

/* The number of entry arguments that are inputs (they come first). */
static int nargs_of(const step_tensor *t, int n) {
  int k = 0;
  while (k < n && (t[k].role == NOVA_ROLE_INPUT || t[k].role == NOVA_ROLE_LABEL || t[k].role == NOVA_ROLE_PARAM ||
                   t[k].role == NOVA_ROLE_OPT_STATE || t[k].role == NOVA_ROLE_BUFFER))
    k++;
  return k;
}

/* Whether tensor I (an update) is computed in its param's buffer. */
static bool in_place(const cg_plan *plan, const step_tensor *t, int n, int i) {
  int oi = i - nargs_of(t, n);
  return plan && plan->inplace && oi >= 0 && oi < plan->noutputs && plan->inplace[oi];
}

/* "initializers": what --train made of each initializer of an ONNX model. */
static void add_initializers(cJSON *root, const nv_graph *g) {
  static const char *const role[] = {"param", "buffer", "constant"};
  cJSON *a = cJSON_AddArrayToObject(root, "initializers");
  for (int i = 0; i < g->ninits; i++) {
    const nv_initializer *in = &g->inits[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", in->name);
    cJSON_AddStringToObject(e, "role", role[in->role]);
    cJSON_AddStringToObject(e, "storage", in->folded ? "folded" : "tensor");
    cJSON_AddStringToObject(e, "reason", in->reason);
    cJSON_AddItemToArray(a, e);
  }
}

/* "evaluation": the evaluation entry of a training step. */
static int add_evaluation(cJSON *root, const cg_options *o) {
  step_tensor *et;
  int64_t isz;
  int en = collect(o->eval_graph, &et, &isz);
  if (en < 0) return -1;
  cJSON *ev = cJSON_AddObjectToObject(root, "evaluation");
  cJSON_AddStringToObject(ev, "entry", CG_EVAL_PREFIX "forward");
  cJSON *a = cJSON_AddArrayToObject(ev, "arguments");
  for (int i = 0; i < en; i++) cJSON_AddItemToArray(a, cJSON_CreateString(et[i].name));
  const cg_plan *pl = o->eval_plan;
  cJSON_AddNumberToObject(ev, "arena_bytes", pl && pl->planned ? (double)pl->arena_bytes : 0);
  free(et);
  return 0;
}

/* "sizes": a step for several sizes of one dimension. */
static void add_sizes(cJSON *root, const nv_graph *g, const cg_options *o) {
  cJSON *sz = cJSON_AddObjectToObject(root, "sizes");
  char name[300];
  snprintf(name, sizeof name, "%s.size", o->dim_name);
  cJSON_AddStringToObject(sz, "dimension", o->dim_name);
  cJSON_AddNumberToObject(sz, "min", (double)o->dim_lo);
  cJSON_AddNumberToObject(sz, "max", (double)o->dim_hi);
  cJSON_AddStringToObject(sz, "size_input", name);
  cJSON *bs = cJSON_AddArrayToObject(sz, "buckets");
  const char *entry = g->train ? "train_step" : "forward";
  for (int k = 0; k <= o->nbuckets; k++) {
    const cg_bucket *bk = k < o->nbuckets ? &o->buckets[k] : NULL;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "size", (double)(bk ? bk->size : o->dim_hi));
    snprintf(name, sizeof name, "%s%s", bk ? bk->prefix : "", entry);
    cJSON_AddStringToObject(e, "entry", name);
    cJSON_AddNumberToObject(e, "arena_bytes", (double)plan_arena(bk ? bk->plan : o->plan));
    cJSON_AddItemToArray(bs, e);
  }
  cJSON *ax = cJSON_AddArrayToObject(sz, "axes");
  for (int i = 0; i < o->ndim_axes; i++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "tensor", o->dim_axes[i].tensor);
    cJSON_AddNumberToObject(e, "axis", o->dim_axes[i].axis);
    cJSON_AddNumberToObject(e, "scale", (double)o->dim_axes[i].a);
    cJSON_AddNumberToObject(e, "offset", (double)o->dim_axes[i].c);
    cJSON_AddItemToArray(ax, e);
  }
}

/* The size and FNV-1a of the step.so a manifest describes (novarun refuses
 * a pair that does not match: a killed compile or a copy of one file). */
typedef struct so_sum {
  uint64_t bytes, fnv;
} so_sum;

/* "file:line:col", or the file alone (an ONNX node's). */
static const char *loc_text(char *buf, size_t n, nv_loc l) {
  if (!l.file) snprintf(buf, n, "?");
  else if (l.line > 0) snprintf(buf, n, "%s:%d:%d", l.file, l.line, l.col);
  else snprintf(buf, n, "%s", l.file);
  return buf;
}

/* --data-parallel (passes/comm.c): each bucket's all-reduce, what it sums
 * and where it starts and must end; "data_parallel" says how the step
 * expects to be run. */
static void add_collectives(cJSON *root, const nv_graph *g, bool cpu) {
  cJSON *cs = cJSON_AddArrayToObject(root, "collectives");
  cJSON **names = g->comm.nbuckets ? nv_xcalloc((size_t)g->comm.nbuckets, sizeof *names) : NULL;
  if (!names) return;
  char buf[512];
  for (int b = 0; b < g->comm.nbuckets; b++) {
    const struct nv_bucket *bk = &g->comm.buckets[b];
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "bucket", b);
    cJSON_AddStringToObject(c, "kind", bk->kind == NV_OP_REDUCE_SCATTER ? "reduce_scatter"
                                       : bk->kind == NV_OP_ALL_GATHER  ? "all_gather"
                                                                       : "all_reduce");
    if (bk->kind != NV_OP_ALL_GATHER) cJSON_AddStringToObject(c, "reduction", "sum");
    cJSON_AddNumberToObject(c, "bytes", (double)bk->bytes);
    names[b] = cJSON_AddArrayToObject(c, bk->kind == NV_OP_ALL_GATHER ? "params" : "gradients_of"); /* (filled below,
                                                                                  in one pass over the nodes) */
    if (bk->after >= 0 && bk->after < g->nnodes)
      cJSON_AddStringToObject(c, "starts_after", loc_text(buf, sizeof buf, g->nodes[bk->after]->loc));
    if (bk->first_read) {
      snprintf(buf, sizeof buf, "the first use of the sum of %s", bk->first_read);
      cJSON_AddStringToObject(c, "ends_before", buf);
    }
    cJSON_AddItemToArray(cs, c);
  }
  int64_t *elems = nv_xcalloc((size_t)g->comm.nbuckets, sizeof *elems);
  bool *f64 = nv_xcalloc((size_t)g->comm.nbuckets, sizeof *f64);
  int world = 0;
  bool shard = false;
  for (int i = 0; i < g->nnodes; i++) {
    const nv_node *v = g->nodes[i];
    if (v->op == NV_OP_INPUT && v->name && !strcmp(v->name, "comm.world")) world = (int)v->init.a;
    shard |= v->op == NV_OP_REDUCE_SCATTER;
    if ((v->op != NV_OP_ALL_REDUCE && v->op != NV_OP_REDUCE_SCATTER && v->op != NV_OP_ALL_GATHER) || v->axis < 0 ||
        v->axis >= g->comm.nbuckets)
      continue;
    if (v->name) cJSON_AddItemToArray(names[v->axis], cJSON_CreateString(v->name));
    /* runtime/rt_comm.c's buffers: an all-reduce's block, a reduce-scatter's or all-gather's N */
    int64_t share = v->op == NV_OP_REDUCE_SCATTER ? fe_numel(v) : fe_numel(v->in[0]);
    if (elems) elems[v->axis] += v->op == NV_OP_ALL_REDUCE ? share : share * v->mode;
    if (f64) f64[v->axis] |= v->dtype == NOVA_DTYPE_F64;
  }
  /* runtime/rt_comm.c: a bucket's elements in f32, f64 if one of them is; the reduce-scatters'
   * buffers are given back before the all-gathers' are made */
  double staging = 0, rs = 0, ag = 0;
  for (int b = 0; elems && f64 && b < g->comm.nbuckets; b++) {
    double bytes = (double)elems[b] * (f64[b] ? 8 : 4);
    *(g->comm.buckets[b].kind == NV_OP_REDUCE_SCATTER ? &rs : g->comm.buckets[b].kind == NV_OP_ALL_GATHER ? &ag
                                                                                                        : &staging) += bytes;
  }
  staging += rs > ag ? rs : ag;
  free(names);
  free(elems);
  free(f64);
  cJSON *dp = cJSON_AddObjectToObject(root, "data_parallel");
  cJSON_AddNumberToObject(dp, "bucket_bytes", (double)g->comm.bucket_bytes);
  cJSON_AddNumberToObject(dp, "buckets", g->comm.nbuckets);
  cJSON_AddStringToObject(dp, "scale_input", "comm.scale");
  cJSON_AddNumberToObject(dp, "world_size", world); /* 0: any */
  cJSON_AddBoolToObject(dp, "shard_optimizer", shard);
  cJSON_AddNumberToObject(dp, "staging_bytes", cpu ? staging : 0);
  cJSON *be = cJSON_AddArrayToObject(dp, "backends"); /* cuda: none yet, a world of one rank */
  if (cpu) cJSON_AddItemToArray(be, cJSON_CreateString("mpi"));
}

static char *manifest_json(const nv_graph *g, const step_tensor *t, int n, const char *hash, const cg_options *o,
                           const char *cpu, const so_sum *sum) {
  nv_json_oom_take();
  cJSON *root = cJSON_CreateObject();
  cJSON_AddNumberToObject(root, "format_version", 1);
  cJSON_AddStringToObject(root, "novac_version", NOVAC_VERSION);
  cJSON_AddStringToObject(root, "source", o->input_name ? o->input_name : "");
  cJSON_AddStringToObject(root, "target", "cpu");
  cJSON *dev = cJSON_AddObjectToObject(root, "device");
  cJSON_AddStringToObject(dev, "name", "host");
  cJSON_AddStringToObject(dev, "cpu", cpu);
  cJSON_AddStringToObject(root, "flags", o->flags_text ? o->flags_text : "");
  cJSON_AddStringToObject(root, "graph_hash", hash);
  cJSON_AddNumberToObject(root, "abi_version", NOVA_STEP_ABI_VERSION);
  cJSON_AddStringToObject(root, "entry", g->train ? "train_step" : "forward");
  cJSON_AddStringToObject(root, "precision", g->precision[0] ? g->precision : "fp32");
  if (g->train) { /* novac --keep-grads: the gradients are outputs (role grad) */
    bool kept = false;
    for (int i = 0; i < g->noutputs; i++) kept |= g->outputs[i].role == NOVA_ROLE_GRAD;
    cJSON_AddBoolToObject(root, "keep_grads", kept);
  }
  if (g->loss_scale > 0) {
    cJSON *ls = cJSON_AddObjectToObject(root, "loss_scale");
    cJSON_AddNumberToObject(ls, "initial", g->loss_scale);
    cJSON_AddNumberToObject(ls, "growth_interval", (double)g->loss_scale_window);
    cJSON_AddStringToObject(ls, "scale", "amp.loss_scale");
    cJSON_AddStringToObject(ls, "skipped_steps", "amp.skipped_steps");
  }
  if (sum) {
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sum->fnv);
    cJSON *so = cJSON_AddObjectToObject(root, "step_so");
    cJSON_AddNumberToObject(so, "bytes", (double)sum->bytes);
    cJSON_AddStringToObject(so, "fnv1a64", hex);
  }
  cJSON *ts = cJSON_AddArrayToObject(root, "tensors");
  double io_bytes = 0, param_bytes = 0;
  for (int i = 0; i < n; i++) {
    const nv_node *x = t[i].node;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", t[i].name);
    cJSON_AddStringToObject(e, "role", role_name(t[i].role));
    cJSON_AddStringToObject(e, "dtype", fe_dtype_name(x->dtype));
    cJSON *sh = cJSON_AddArrayToObject(e, "shape");
    for (int k = 0; k < x->rank; k++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)x->shape[k]));
    double bytes = (double)fe_numel(x) * (double)fe_dtype_size(x->dtype);
    cJSON_AddNumberToObject(e, "bytes", bytes);
    cJSON_AddNumberToObject(e, "argument", i);
    if (t[i].updates >= 0) cJSON_AddStringToObject(e, "updates", t[t[i].updates].name);
    bool inplace = in_place(o->plan, t, n, i);
    if (t[i].updates >= 0) cJSON_AddBoolToObject(e, "in_place", inplace);
    if (x->has_default) cJSON_AddNumberToObject(e, "default", x->init.a);
    if (i < nargs_of(t, n) && x->index_bound > 0) {
      cJSON_AddNumberToObject(e, "index_bound", (double)x->index_bound);
      if (x->index_negative) cJSON_AddNumberToObject(e, "index_lower", (double)-x->index_bound);
      if (x->has_index_skip) cJSON_AddNumberToObject(e, "index_ignore", (double)x->index_skip);
    }
    if (t[i].node->loc.file) {
      char where[600];
      snprintf(where, sizeof where, "%s:%d:%d", x->loc.file, x->loc.line, x->loc.col);
      cJSON_AddStringToObject(e, "defined_at", where);
    }
    cJSON_AddItemToArray(ts, e);
    if (t[i].role == NOVA_ROLE_PARAM) param_bytes += bytes;
  }
  if (g->inits) add_initializers(root, g);
  int lost = o->eval_graph && add_evaluation(root, o);
  if (o->dim_name) add_sizes(root, g, o);
  io_bytes = (double)cg_io_bytes(g, o->plan);
  cJSON *mem = cJSON_AddObjectToObject(root, "memory");
  cJSON_AddNumberToObject(mem, "tensor_bytes", io_bytes);
  cJSON_AddNumberToObject(mem, "param_bytes", param_bytes);
  const cg_plan *pl = o->plan && o->plan->planned ? o->plan : NULL;
  cJSON_AddStringToObject(mem, "intermediates", pl ? "planned-arena" : "heap");
  if (pl) {
    cJSON_AddNumberToObject(mem, "arena_bytes", (double)pl->arena_bytes);
    cJSON_AddNumberToObject(mem, "intermediate_bytes", (double)pl->total_bytes);
    cJSON_AddNumberToObject(mem, "planned_peak_bytes", io_bytes + (double)pl->arena_bytes);
    cJSON_AddNumberToObject(mem, "unplanned_peak_bytes", io_bytes + (double)pl->total_bytes);
    cJSON_AddNumberToObject(mem, "lower_bound_bytes", (double)pl->lower_bound);
    cJSON_AddNumberToObject(mem, "peak_op", pl->peak_op);
    cJSON_AddStringToObject(mem, "peak_at", pl->peak_where);
    cJSON *bd = cJSON_AddObjectToObject(mem, "at_peak"); /* what the memory at the peak op holds */
    int64_t kinds[CG_MEM_NKINDS];
    cg_mem_at(g, pl, pl->peak_op, kinds);
    for (int k = 0; k < CG_MEM_NKINDS; k++) cJSON_AddNumberToObject(bd, cg_mem_kind_names[k], (double)kinds[k]);
    cJSON_AddNumberToObject(mem, "outputs_computed_in_place", pl->forwarded);
    if (g->recompute.done) {
      cJSON *rc = cJSON_AddObjectToObject(mem, "recompute");
      cJSON_AddNumberToObject(rc, "values", g->recompute.values);
      cJSON_AddNumberToObject(rc, "kept_bytes", (double)g->recompute.saved_after);
      cJSON_AddNumberToObject(rc, "kept_bytes_without", (double)g->recompute.saved_before);
      cJSON_AddNumberToObject(rc, "expensive_values", g->recompute.heavy);
      cJSON_AddNumberToObject(rc, "segments", g->recompute.segments);
      cJSON_AddNumberToObject(rc, "segments_recomputed", g->recompute.segments_recomputed);
      cJSON_AddNumberToObject(rc, "flops", g->recompute.flops);
    }
    if (pl->memory_limit > 0) {
      cJSON_AddNumberToObject(mem, "memory_limit", (double)pl->memory_limit);
      cJSON *rm = cJSON_AddObjectToObject(mem, "remat");
      cJSON_AddNumberToObject(rm, "peak_without_bytes", (double)pl->peak_without_remat);
      cJSON_AddNumberToObject(rm, "candidates", pl->remat_candidates);
      cJSON_AddNumberToObject(rm, "recomputed", pl->remat_values);
      cJSON_AddNumberToObject(rm, "recomputed_bytes", (double)pl->remat_bytes);
    }
    cJSON *pa = cJSON_AddArrayToObject(mem, "plan");
    for (int i = 0; i < pl->n; i++) {
      const cg_plan_entry *e = &pl->entries[i];
      cJSON *x = cJSON_CreateObject();
      cJSON_AddNumberToObject(x, "offset", (double)e->offset);
      cJSON_AddNumberToObject(x, "bytes", (double)e->bytes);
      cJSON *lv = cJSON_AddArrayToObject(x, "live");
      cJSON_AddItemToArray(lv, cJSON_CreateNumber(e->first));
      cJSON_AddItemToArray(lv, cJSON_CreateNumber(e->last));
      cJSON_AddStringToObject(x, "defined_at", e->where);
      static const char *const kind[] = {"workspace", "activation", "gradient"};
      cJSON_AddStringToObject(x, "kind", kind[e->kind]);
      cJSON_AddItemToArray(pa, x);
    }
  }
  int nops = 0;
  for (int i = 0; i < g->nnodes; i++) nops += g->nodes[i]->op != NV_OP_INPUT && g->nodes[i]->op != NV_OP_PARAM;
  if (o->plan) { /* linalg ops = loop nests, the kernels of a step */
    cJSON *fu = cJSON_AddObjectToObject(root, "fusion");
    cJSON_AddNumberToObject(fu, "ops_before", o->plan->ops_before_fusion);
    cJSON_AddNumberToObject(fu, "ops_after", o->plan->ops_after_fusion);
    if (!o->gpu) cJSON_AddNumberToObject(root, "parallel_loops", o->plan->parallel_loops);
    if (!o->gpu) cJSON_AddNumberToObject(root, "contraction_kernels", o->plan->contraction_kernels);
  }
  cJSON *ks = cJSON_AddArrayToObject(root, "kernels");
  cJSON *k = cJSON_CreateObject();
  cJSON_AddStringToObject(k, "name", g->train ? "train_step" : "forward");
  cJSON_AddStringToObject(k, "kind", "cpu-function");
  cJSON_AddNumberToObject(k, "nova_ops", nops);
  cJSON_AddItemToArray(ks, k);
  cJSON_AddArrayToObject(root, "streams");
  add_collectives(root, g, !o->gpu);
  if (o->gpu) {
    cJSON_ReplaceItemInObject(root, "target", cJSON_CreateString("cuda"));
    cg_cuda_manifest(root, o->gpu);
  }
  char *s = cJSON_Print(root);
  cJSON_Delete(root);
  if (nv_json_oom_take() || lost) { /* an item is missing: no manifest rather than a wrong one */
    cJSON_free(s);
    errno = ENOMEM;
    return NULL;
  }
  return s;
}

/* The manifest text (owned; cJSON_free), or NULL.  SUM: the step.so's, or NULL. */
static char *manifest_text(const nv_graph *g, const cg_options *o, const char *cpu, const so_sum *sum) {
  step_tensor *t;
  int64_t init_size;
  int n = collect(g, &t, &init_size);
  if (n < 0) return NULL;
  char hash[17];
  cg_graph_hash(g, hash);
  char *json = manifest_json(g, t, n, hash, o, cpu, sum);
  free(t);
  return json;
}

int cg_write_manifest(nova_ctx *c, const nv_graph *g, const cg_options *o, const char *cpu, const char *path) {
  char *json = manifest_text(g, o, cpu, NULL);
  if (!json) {
    nv_error_plain(c->diag, "writing %s: %s", strcmp(path, "-") ? path : "standard output", strerror(ENOMEM));
    return -1;
  }
  size_t len = strlen(json);
  json[len] = '\n'; /* over the NUL, restored below */
  int rc = nv_write_file(path, json, len + 1, 0);
  if (rc) nv_error_plain(c->diag, "writing %s: %s", strcmp(path, "-") ? path : "standard output", strerror(errno));
  json[len] = 0;
  cJSON_free(json);
  return rc;
}

/* Copies the linked SRC into OUT (an nv_out being written), summing it. */
static int copy_summed(const char *src, nv_out *out, so_sum *sum) {
  FILE *in = fopen(src, "rb");
  if (!in) return -1;
  unsigned char buf[1 << 16];
  size_t got;
  sum->bytes = 0;
  sum->fnv = NV_FNV_INIT;
  while ((got = fread(buf, 1, sizeof buf, in)) > 0) {
    sum->fnv = nv_fnv1a64(sum->fnv, buf, got);
    sum->bytes += got;
    if (fwrite(buf, 1, got, out->f) != got) break;
  }
  int bad = ferror(in) || ferror(out->f);
  fclose(in);
  if (bad && !errno) errno = EIO;
  return bad ? -1 : 0;
}

/* Publishes DIR/step.so as O->output and its manifest (which records the
 * .so's size and checksum) as O->manifest: both complete, flushed and
 * fsync'ed under temporary names, then the .so renamed first.  A run killed
 * between the two renames leaves the new .so beside the old manifest, a pair
 * novarun refuses; never a pair that loads and does not belong together. */
static int publish_step(nova_ctx *c, const nv_graph *g, const cg_options *o, const char *cpu, const char *dir) {
  char src[4200];
  snprintf(src, sizeof src, "%s/step.so", dir);
  nv_out so, man = {0};
  so_sum sum;
  const char *bad = o->output;
  if (nv_out_open(&so, o->output, 0)) goto fail_open;
  if (copy_summed(src, &so, &sum) || nv_out_finish(&so)) goto fail;
  if (o->manifest) {
    bad = o->manifest;
    char *json = manifest_text(g, o, cpu, &sum);
    if (!json || nv_out_open(&man, o->manifest, 0)) {
      cJSON_free(json);
      goto fail;
    }
    int ok = fputs(json, man.f) >= 0 && fputc('\n', man.f) >= 0;
    cJSON_free(json);
    if (!ok || nv_out_finish(&man)) goto fail;
  }
  bad = o->output;
  if (nv_out_rename(&so)) goto fail;
  bad = o->manifest;
  if (o->manifest && nv_out_rename(&man)) goto fail;
  /* both in place: their folders synced once both renames are done */
  bad = o->output;
  if (nv_sync_dir_of(o->output)) goto synced;
  bad = o->manifest;
  if (o->manifest && nv_sync_dir_of(o->manifest)) goto synced;
  return 0;
synced:
  nv_error_plain(c->diag, "writing %s: syncing its folder: %s", bad, strerror(errno));
  return -1;
fail:;
  int e = errno;
  nv_out_discard(&so);
  if (man.path) nv_out_discard(&man);
  errno = e;
fail_open:
  nv_error_plain(c->diag, "writing %s: %s", bad, strerror(errno));
  return -1;
}

static void rm_tree(const char *dir, const char *const *files) {
  char p[4200];
  for (int i = 0; files[i]; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, files[i]);
    unlink(p);
  }
  rmdir(dir);
}

static double ms_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void lap(const cg_options *o, double *t0, const char *what) {
  double t1 = ms_now();
  if (o->time_passes) fprintf(stderr, "novac: %-22s %9.2f ms\n", what, t1 - *t0);
  *t0 = t1;
}

struct cg_step_build {
  char dir[4096];   /* the temporary folder */
  int lock, slot;
  step_tensor *t;
  int n;
  int64_t init_size;
  char cpu[128];
  cg_emit_job code, eval; /* the step's objects, the evaluation entry's */
  cg_emit_job *bjobs;     /* a step of several sizes: each smaller bucket's step and evaluation entry */
  int nbjobs;
  double t0;
};

/* Removes B's folder (unless kept) and frees B. */
static void step_build_free(const cg_options *o, cg_step_build *b) {
  cg_emit_cancel(&b->code, o->keep_temps);
  cg_emit_cancel(&b->eval, o->keep_temps);
  for (int i = 0; i < b->nbjobs; i++) cg_emit_cancel(&b->bjobs[i], o->keep_temps);
  free(b->bjobs);
  free(b->t);
  if (!o->keep_temps) {
    static const char *const files[] = {"init.bin", "desc.c", "desc.o", "step.so", "exports.map", "tool.log",
                                        "kernels.ptx", "kernels.cubin", ".lock", NULL};
    rm_tree(b->dir, files);
    close(b->lock); /* after .lock is gone: nobody sweeps a folder still in use */
  }
  nv_temp_drop(b->slot);
  if (o->keep_temps) {
    nv_tempdir_keep(b->dir, b->lock);
    fprintf(stderr, "novac: temporary files kept in %s\n", b->dir);
  }
  free(b);
}

cg_step_build *cg_step_begin(nova_ctx *c, const nv_graph *g, MlirModule llvm_module, const cg_options *o) {
  cg_step_build *b = nv_xcalloc(1, sizeof *b);
  if (!b) {
    nv_error_plain(c->diag, "%s", strerror(ENOMEM));
    return NULL;
  }
  b->t0 = ms_now();
  const char *tmpbase = getenv("TMPDIR");
  if (nv_tempdir_create(b->dir, sizeof b->dir, "novac", &b->lock)) {
    nv_error_plain(c->diag, "cannot create a temporary folder in %s: %s", tmpbase ? tmpbase : "/tmp", strerror(errno));
    free(b);
    return NULL;
  }
  b->slot = nv_temp_add(b->dir, 1); /* first: an allocation that fails removes it */
  b->n = collect(g, &b->t, &b->init_size);
  cg_cpu_name(o, b->cpu, sizeof b->cpu);
  if (b->n < 0 || cg_emit_start(c, llvm_module, o, b->dir, "step", &b->code)) {
    step_build_free(o, b);
    return NULL;
  }
  return b;
}

void cg_step_cancel(const cg_options *o, cg_step_build *b) {
  if (b) step_build_free(o, b);
}

int cg_step_end(nova_ctx *c, const nv_graph *g, const cg_options *o, cg_step_build *b) {
  int rc = -1;
  char path[4200], hash[17], rtlib[4200], rtinc[4200];
  cg_graph_hash(g, hash);
  step_tensor *t = b->t;
  int n = b->n;
  double *t0 = &b->t0;
  int32_t *ea = NULL;
  int na = 0;
  /* the evaluation entry's code generation joins the step's, and the
   * descriptor is written and compiled while both run */
  bucket_args *ba = o->nbuckets ? nv_xcalloc((size_t)o->nbuckets, sizeof *ba) : NULL;
  if (o->eval_graph &&
      (eval_args(c, o->eval_graph, t, n, false, &ea, &na) ||
       cg_emit_start(c, o->eval_module, o, b->dir, "eval", &b->eval)))
    goto out;
  /* the smaller buckets' code, one after the other while the step's runs */
  if (o->nbuckets && (!ba || !(b->bjobs = nv_xcalloc(2 * (size_t)o->nbuckets, sizeof *b->bjobs)))) {
    nv_error_plain(c->diag, "%s", strerror(ENOMEM));
    goto out;
  }
  for (int k = 0; k < o->nbuckets; k++) {
    const cg_bucket *bk = &o->buckets[k];
    char stem[64];
    snprintf(stem, sizeof stem, "b%lld", (long long)bk->size);
    if (eval_args(c, bk->graph, t, n, true, &ba[k].args, &ba[k].nargs)) goto out;
    b->nbjobs = 2 * k + 1;
    if (cg_emit_start(c, bk->module, o, b->dir, stem, &b->bjobs[2 * k]) ||
        cg_emit_wait(c, o, &b->bjobs[2 * k], false))
      goto out;
    if (!bk->eval_graph) continue;
    snprintf(stem, sizeof stem, "b%lldeval", (long long)bk->size);
    if (eval_args(c, bk->eval_graph, t, n, true, &ba[k].eargs, &ba[k].neargs)) goto out;
    b->nbjobs = 2 * k + 2;
    if (cg_emit_start(c, bk->eval_module, o, b->dir, stem, &b->bjobs[2 * k + 1]) ||
        cg_emit_wait(c, o, &b->bjobs[2 * k + 1], false))
      goto out;
  }
  if (o->nbuckets) lap(o, t0, "smaller buckets' code");
  snprintf(path, sizeof path, "%s/init.bin", b->dir);
  if (write_init(c, g, t, n, b->init_size, path)) goto out;
  snprintf(path, sizeof path, "%s/desc.c", b->dir);
  if (o->gpu && cg_cuda_assemble(c, b->dir, o->gpu, o->verbose)) goto out;
  if (o->gpu) lap(o, t0, "ptxas");
  if (write_desc(g, t, n, b->init_size, hash, o->gpu, o->plan, o, ea, na, ba, path)) {
    nv_error_plain(c->diag, "cannot write %s: %s", path, strerror(errno));
    goto out;
  }
  snprintf(path, sizeof path, "%s/exports.map", b->dir);
  FILE *f = fopen(path, "w");
  int bad = !f || fputs("{ global: nova_step_*; nova_dtype_*; nova_role_name; local: *; };\n", f) < 0;
  if (f && fclose(f)) bad = 1; /* the text is written here */
  if (bad) {
    nv_error_plain(c->diag, "cannot write %s: %s", path, strerror(errno));
    goto out;
  }
  snprintf(rtinc, sizeof rtinc, "-I%s/include", o->rt_dir);
  snprintf(rtlib, sizeof rtlib, "%s/libnovart.a", o->rt_dir);
  if (access(rtlib, R_OK)) {
    nv_error_plain(c->diag, "the runtime library %s is missing (is novac installed completely?)", rtlib);
    goto out;
  }
  const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
  char *ccargv[] = {(char *)cc, "-c", "-O1", "-fPIC", rtinc, "desc.c", "-o", "desc.o", NULL};
  if (cg_run_tool(c, b->dir, ccargv, o->verbose, NULL)) goto out;
  lap(o, t0, "descriptor");
  if (cg_emit_wait(c, o, &b->code, false) || cg_emit_wait(c, o, &b->eval, false)) goto out;
  lap(o, t0, "LLVM opt + codegen");
  /* the objects (named as cc runs in the folder), desc.o, the runtime */
  char **ldargv = nv_xcalloc(32 + 8 * (2 + (size_t)b->nbjobs), sizeof *ldargv);
  if (!ldargv) {
    nv_error_plain(c->diag, "%s", strerror(ENOMEM));
    goto out;
  }
  ldargv[0] = (char *)cc, ldargv[1] = "-shared", ldargv[2] = "-o", ldargv[3] = "step.so";
  int nld = 4;
  for (int k = 0; k < 2 + b->nbjobs; k++) {
    const cg_emit_job *j = k == 0 ? &b->code : k == 1 ? &b->eval : &b->bjobs[k - 2];
    for (int i = 0; i < j->n; i++) ldargv[nld++] = strrchr(j->obj[i], '/') + 1;
  }
  static const char *const rest[] = {"desc.o", "-Wl,--whole-archive", NULL, "-Wl,--no-whole-archive", "-lm", "-ldl",
                                     "-Wl,--no-undefined", "-Wl,--version-script=exports.map", "-Wl,-z,noexecstack",
                                     "-Wl,--build-id=sha1"};
  for (size_t i = 0; i < sizeof rest / sizeof *rest; i++) ldargv[nld++] = rest[i] ? (char *)rest[i] : rtlib;
  if (*NOVA_RT_SANITIZE) ldargv[nld++] = NOVA_RT_SANITIZE; /* an instrumented runtime needs its sanitizer's */
  ldargv[nld] = NULL;
  int linked = cg_run_tool(c, b->dir, ldargv, o->verbose, NULL);
  free(ldargv);
  if (linked) goto out;
  lap(o, t0, "link");
  if (publish_step(c, g, o, b->cpu, b->dir)) goto out;
  rc = 0;
out:
  free(ea);
  for (int k = 0; ba && k < o->nbuckets; k++) free(ba[k].args), free(ba[k].eargs);
  free(ba);
  step_build_free(o, b);
  return rc;
}

int cg_build_step(nova_ctx *c, const nv_graph *g, MlirModule llvm_module, const cg_options *o) {
  cg_step_build *b = cg_step_begin(c, g, llvm_module, o);
  return b ? cg_step_end(c, g, o, b) : -1;
}

/* FNV-1a over a canonical description of the graph: ops, dtypes, shapes,
 * attributes, operand ids, names and outputs. */
void cg_graph_hash(const nv_graph *g, char out[17]) {
  uint64_t h = 1469598103934665603ull;
#define MIX(p, n)                                                             \
  do {                                                                        \
    const unsigned char *q_ = (const unsigned char *)(p);                     \
    for (size_t i_ = 0; i_ < (n); i_++) h = (h ^ q_[i_]) * 1099511628211ull; \
  } while (0)
  for (int i = 0; i < g->nnodes; i++) {
    const nv_node *x = g->nodes[i];
    int32_t head[4] = {(int32_t)x->op, (int32_t)x->dtype, x->rank, x->nin};
    MIX(head, sizeof head);
    MIX(x->shape, (size_t)x->rank * sizeof x->shape[0]);
    for (int k = 0; k < x->nin; k++) MIX(&x->in[k]->id, sizeof x->in[k]->id);
    int64_t at[6] = {x->axis, x->nlist, x->keepdims, x->start, x->end, x->step};
    MIX(at, sizeof at);
    MIX(x->list, (size_t)x->nlist * sizeof x->list[0]);
    MIX(&x->eps, sizeof x->eps);
    MIX(&x->value, sizeof x->value);
    int64_t win[16] = {x->nspatial, x->groups, x->count_include_pad, x->ceil_mode + 2 * x->col_major, x->to};
    memcpy(win + 5, x->kernel, 3 * sizeof(int64_t));
    memcpy(win + 8, x->strides, 3 * sizeof(int64_t));
    memcpy(win + 11, x->dilations, 3 * sizeof(int64_t));
    MIX(win, sizeof win);
    MIX(x->pads, sizeof x->pads);
    int32_t ik = (int32_t)x->init.kind;
    MIX(&ik, sizeof ik);
    MIX(&x->init.a, sizeof x->init.a);
    MIX(&x->init.b, sizeof x->init.b);
    if (x->name) MIX(x->name, strlen(x->name) + 1);
    int32_t role = (int32_t)x->role + 16 * x->index_negative + 32 * x->has_index_skip;
    MIX(&role, sizeof role);
    if (x->has_index_skip) MIX(&x->index_skip, sizeof x->index_skip);
    if (x->init.path) MIX(x->init.path, strlen(x->init.path) + 1);
    if (x->op == NV_OP_CONSTANT && x->init.kind == NV_INIT_DATA && x->init.data) /* folded ONNX values */
      MIX(x->init.data, (size_t)fe_numel(x) * fe_dtype_size(x->dtype));
  }
  MIX(&g->seed, sizeof g->seed);
  for (int i = 0; i < g->noutputs; i++) MIX(g->outputs[i].name, strlen(g->outputs[i].name) + 1);
#undef MIX
  snprintf(out, 17, "%016llx", (unsigned long long)h);
}
