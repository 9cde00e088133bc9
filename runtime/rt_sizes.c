/* rt_sizes.c: a step for several sizes of one dimension (novac
 * --dim=NAME=LO..HI).
 *
 * Each tensor with an axis of the dimension has one buffer, big enough for
 * the largest bucket.  Binding it with size n lays it out for n's bucket B
 * (the first bucket of size >= n): along each such axis the n rows given,
 * then B - n copies of the last of them (finite values the step's masks
 * ignore).  A run calls the bucket's entry with NAME.size = n; then each
 * output with such an axis is moved down to the layout of size n, so that
 * nova_step_get gives exactly the rows of a step compiled for n.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_dtype.h"
#include "rt_step.h"

struct rt_sizes {
  void ***args;       /* [nbuckets] each bucket's arguments, then the arena */
  void ***eval_args;  /* [nbuckets] its evaluation entry's (NULL: none), then the evaluation arena */
  int64_t *sizes;     /* [nbuckets] */
  int64_t *at;        /* [ntensors] the size tensor i is laid out for n of (0: no axis of the dimension) */
  int64_t (*shape)[NOVA_MAX_RANK]; /* [ntensors] its shape at that size */
};

/* The extent of an axis (a, c) at size N. */
static int64_t extent(const rt_dim_axis *ax, int64_t n) { return ax->a * n + ax->c; }

nova_status rt_sizes_check(const rt_graph *g, char *err) {
  if (!g->dim_name) return NOVA_OK;
  const char *bad = NULL;
  if (!g->dim_name[0] || g->dim_lo < 1 || g->dim_hi < g->dim_lo || g->nbuckets < 1 || !g->buckets ||
      g->buckets[g->nbuckets - 1].size != g->dim_hi || g->buckets[g->nbuckets - 1].entry != g->entry ||
      g->ndim_axes < 0 || (g->ndim_axes && !g->dim_axes))
    bad = "the range or the bucket list";
  for (int k = 0; !bad && k < g->nbuckets; k++) {
    const rt_bucket *b = &g->buckets[k];
    if (!b->entry || b->nargs < 0 || (b->nargs && !b->arg_tensor) || (k && b->size <= g->buckets[k - 1].size) ||
        b->size < 1 || (b->eval_entry && (b->eval_nargs < 0 || (b->eval_nargs && !b->eval_arg_tensor))))
      bad = "a bucket";
    for (int a = 0; !bad && a < b->nargs; a++)
      if (b->arg_tensor[a] < 0 || b->arg_tensor[a] >= g->ntensors) bad = "a bucket's argument list";
    for (int a = 0; !bad && b->eval_entry && a < b->eval_nargs; a++)
      if (b->eval_arg_tensor[a] < 0 || b->eval_arg_tensor[a] >= g->ntensors) bad = "a bucket's argument list";
  }
  for (int i = 0; !bad && i < g->ndim_axes; i++) {
    const rt_dim_axis *ax = &g->dim_axes[i];
    if (ax->tensor < 0 || ax->tensor >= g->ntensors || ax->axis < 0 || ax->axis >= g->tensors[ax->tensor].rank ||
        ax->a < 1 || extent(ax, g->dim_lo) < 0 || extent(ax, g->dim_hi) != g->tensors[ax->tensor].shape[ax->axis])
      bad = "an axis of the dimension";
  }
  const rt_tensor_desc *st = g->dim_size_tensor >= 0 && g->dim_size_tensor < g->ntensors
                                 ? &g->tensors[g->dim_size_tensor] : NULL;
  if (!bad && (!st || st->role != NOVA_ROLE_INPUT || st->dtype != NOVA_DTYPE_I64 || st->rank != 0))
    bad = "its size input";
  if (!bad) return NOVA_OK;
  snprintf(err, RT_ERROR_LEN, "malformed step: the sizes of '%.200s': %s is inconsistent", g->dim_name, bad);
  return NOVA_ERR_ABI;
}

uint64_t rt_sizes_arena(const rt_graph *g, int eval) {
  uint64_t m = eval ? g->eval_arena_bytes : g->arena_bytes;
  for (int k = 0; g->dim_name && k < g->nbuckets; k++) {
    uint64_t b = eval ? g->buckets[k].eval_arena_bytes : g->buckets[k].arena_bytes;
    if (b > m) m = b;
  }
  return m;
}

nova_status rt_sizes_open(nova_step *s) {
  const rt_graph *g = s->graph;
  if (!g->dim_name) return NOVA_OK;
  struct rt_sizes *z = s->sizes = calloc(1, sizeof *z);
  if (!z) return NOVA_ERR_NO_MEMORY;
  size_t nb = (size_t)g->nbuckets, nt = (size_t)g->ntensors + 1;
  z->args = calloc(nb, sizeof *z->args);
  z->eval_args = calloc(nb, sizeof *z->eval_args);
  z->sizes = calloc(nb, sizeof *z->sizes);
  z->at = calloc(nt, sizeof *z->at);
  z->shape = calloc(nt, sizeof *z->shape);
  if (!z->args || !z->eval_args || !z->sizes || !z->at || !z->shape) return NOVA_ERR_NO_MEMORY;
  for (int k = 0; k < g->nbuckets; k++) {
    const rt_bucket *b = &g->buckets[k];
    z->sizes[k] = b->size;
    if (!(z->args[k] = calloc((size_t)b->nargs + 1, sizeof **z->args))) return NOVA_ERR_NO_MEMORY;
    for (int a = 0; a < b->nargs; a++) z->args[k][a] = s->buffers[b->arg_tensor[a]];
    z->args[k][b->nargs] = s->arena;
    if (!b->eval_entry) continue;
    if (!(z->eval_args[k] = calloc((size_t)b->eval_nargs + 1, sizeof **z->eval_args))) return NOVA_ERR_NO_MEMORY;
    for (int a = 0; a < b->eval_nargs; a++) z->eval_args[k][a] = s->buffers[b->eval_arg_tensor[a]];
    z->eval_args[k][b->eval_nargs] = s->eval_arena;
  }
  for (int i = 0; i < g->ntensors; i++) memcpy(z->shape[i], g->tensors[i].shape, sizeof z->shape[i]);
  for (int i = 0; i < g->ndim_axes; i++) z->at[g->dim_axes[i].tensor] = g->dim_hi;
  return NOVA_OK;
}

void rt_sizes_close(nova_step *s) {
  struct rt_sizes *z = s->sizes;
  if (!z) return;
  for (int k = 0; s->graph && k < s->graph->nbuckets; k++) {
    if (z->args) free(z->args[k]);
    if (z->eval_args) free(z->eval_args[k]);
  }
  free(z->args);
  free(z->eval_args);
  free(z->sizes);
  free(z->at);
  free(z->shape);
  free(z);
  s->sizes = NULL;
}

/* The first bucket of size >= N. */
static int bucket_of(const rt_graph *g, int64_t n) {
  int k = 0;
  while (k + 1 < g->nbuckets && g->buckets[k].size < n) k++;
  return k;
}

/* Tensor I's shape at size N (its axes of the dimension, else the compiled one). */
static void shape_at(const rt_graph *g, int i, int64_t n, int64_t *shape) {
  memcpy(shape, g->tensors[i].shape, NOVA_MAX_RANK * sizeof *shape);
  for (int k = 0; k < g->ndim_axes; k++)
    if (g->dim_axes[k].tensor == i) shape[g->dim_axes[k].axis] = extent(&g->dim_axes[k], n);
}

const int64_t *rt_sizes_shape(const nova_step *s, int i, size_t *nbytes) {
  if (!s->sizes || !s->sizes->at[i]) return NULL;
  const rt_tensor_desc *t = &s->graph->tensors[i];
  size_t n = rt_dtype_size(t->dtype);
  for (int k = 0; k < t->rank; k++) n *= (size_t)s->sizes->shape[i][k];
  *nbytes = n;
  return s->sizes->shape[i];
}

int rt_sizes_follows(const nova_step *s, int i) { return s->sizes && s->sizes->at[i] != 0; }

/* Copies SRC (shape SS) into DST (shape DS, every extent >= SS's, rank R),
 * each axis's missing rows copies of its last one; ES bytes an element. */
static void pad_copy(char *dst, const char *src, int r, const int64_t *ds, const int64_t *ss, size_t es) {
  if (r == 0) {
    memcpy(dst, src, es);
    return;
  }
  size_t din = es, sin = es;
  for (int k = 1; k < r; k++) din *= (size_t)ds[k], sin *= (size_t)ss[k];
  if (din == sin) { /* the inner axes alike: one block, then the last row again */
    memcpy(dst, src, (size_t)ss[0] * sin);
    for (int64_t i = ss[0]; i < ds[0]; i++) memcpy(dst + (size_t)i * din, src + (size_t)(ss[0] - 1) * sin, sin);
    return;
  }
  for (int64_t i = 0; i < ds[0]; i++)
    pad_copy(dst + (size_t)i * din, src + (size_t)(i < ss[0] ? i : ss[0] - 1) * sin, r - 1, ds + 1, ss + 1, es);
}

/* Moves the leading block SS of BUF, laid out as DS, to the start of BUF laid
 * out as SS (in place: each row moves down or stays). */
static void compact(char *buf, int r, const int64_t *ds, const int64_t *ss, size_t es) {
  if (r == 0) return;
  int64_t rows = 1;
  for (int k = 0; k + 1 < r; k++) rows *= ss[k];
  size_t row = (size_t)ss[r - 1] * es;
  bool same = true;
  for (int k = 1; k < r; k++) same &= ds[k] == ss[k];
  if (same || !rows || !row) return; /* the rows are the leading ones already */
  int64_t idx[NOVA_MAX_RANK] = {0};
  for (int64_t q = 0; q < rows; q++) {
    int64_t src = 0;
    for (int k = 0; k + 1 < r; k++) src = src * ds[k] + idx[k];
    memmove(buf + (size_t)q * row, buf + (size_t)src * (size_t)ds[r - 1] * es, row);
    for (int k = r - 2; k >= 0 && ++idx[k] == ss[k]; k--) idx[k] = 0;
  }
}

nova_status rt_sizes_bind(nova_step *s, int i, int rank, const int64_t *shape, const void *data) {
  const rt_graph *g = s->graph;
  const rt_tensor_desc *t = &g->tensors[i];
  char given[256], want[300];
  if (i == g->dim_size_tensor)
    return rt_fail(s, NOVA_ERR_ROLE, "tensor '%s' is the size of each run, set by the step from the size of the tensors "
                   "bound", t->name);
  int64_t n = 0;
  bool ok = rank == t->rank;
  for (int k = 0; ok && k < g->ndim_axes; k++) {
    const rt_dim_axis *ax = &g->dim_axes[k];
    if (ax->tensor != i) continue;
    int64_t e = shape[ax->axis] - ax->c, m = e >= 0 && e % ax->a == 0 ? e / ax->a : -1;
    ok = m >= g->dim_lo && m <= g->dim_hi && (!n || m == n);
    n = m;
  }
  int64_t full[NOVA_MAX_RANK];
  if (ok) shape_at(g, i, n, full);
  for (int k = 0; ok && k < rank; k++) ok = shape[k] == full[k];
  if (!ok) {
    /* the compiled shape, the dimension's axes by name and range */
    int len = snprintf(want, sizeof want, "[");
    for (int k = 0; k < t->rank && len < (int)sizeof want - 80; k++) {
      const rt_dim_axis *ax = NULL;
      for (int j = 0; j < g->ndim_axes; j++)
        if (g->dim_axes[j].tensor == i && g->dim_axes[j].axis == k) ax = &g->dim_axes[j];
      if (!ax) len += snprintf(want + len, sizeof want - (size_t)len, "%s%lld", k ? "," : "", (long long)t->shape[k]);
      else len += snprintf(want + len, sizeof want - (size_t)len, "%s%s%.40s%s", k ? "," : "",
                           ax->a != 1 ? "k*" : "", g->dim_name, ax->c ? "+c" : "");
    }
    snprintf(want + len, sizeof want - (size_t)len, "]");
    return rt_fail(s, NOVA_ERR_SHAPE, "tensor '%s': shape %s given, step compiled for %s with %s from %lld to %lld",
                   t->name, rt_shape_str(given, sizeof given, rank, shape), want, g->dim_name, (long long)g->dim_lo,
                   (long long)g->dim_hi);
  }
  int64_t lay[NOVA_MAX_RANK];
  shape_at(g, i, g->buckets[bucket_of(g, n)].size, lay);
  size_t es = rt_dtype_size(t->dtype), nb = es;
  for (int k = 0; k < rank; k++) nb *= (size_t)shape[k];
  if (nb) pad_copy(s->buffers[i], data, rank, lay, shape, es);
  s->sizes->at[i] = n;
  memcpy(s->sizes->shape[i], full, sizeof full);
  return NOVA_OK;
}

nova_status rt_sizes_pick(nova_step *s, bool eval, void (**entry)(void **), void ***args, int64_t *size) {
  const rt_graph *g = s->graph;
  struct rt_sizes *z = s->sizes;
  int64_t n = 0;
  int first = -1;
  for (int k = 0; k < g->ndim_axes; k++) {
    int i = g->dim_axes[k].tensor;
    const rt_tensor_desc *t = &g->tensors[i];
    if ((t->role != NOVA_ROLE_INPUT && t->role != NOVA_ROLE_LABEL) || !s->bound[i]) continue;
    if (eval) { /* only the tensors the evaluation reads */
      int b = bucket_of(g, z->at[i]), used = 0;
      for (int a = 0; a < g->buckets[b].eval_nargs; a++) used |= g->buckets[b].eval_arg_tensor[a] == i;
      if (!used) continue;
    }
    if (first >= 0 && z->at[i] != n)
      return rt_fail(s, NOVA_ERR_SHAPE, "tensors '%s' and '%s' were bound with different sizes of %s: %lld and %lld",
                     g->tensors[first].name, t->name, g->dim_name, (long long)n, (long long)z->at[i]);
    if (first < 0) first = i, n = z->at[i];
  }
  if (!n) n = g->dim_hi;
  int b = bucket_of(g, n);
  *(int64_t *)s->buffers[g->dim_size_tensor] = n;
  s->bound[g->dim_size_tensor] = 1;
  if (eval && !g->buckets[b].eval_entry)
    return rt_fail(s, NOVA_ERR_NO_ENTRY, "this step has no evaluation entry for %s=%lld", g->dim_name, (long long)n);
  *entry = eval ? g->buckets[b].eval_entry : g->buckets[b].entry;
  *args = eval ? z->eval_args[b] : z->args[b];
  *size = n;
  return NOVA_OK;
}

void rt_sizes_done(nova_step *s, int64_t n) {
  const rt_graph *g = s->graph;
  struct rt_sizes *z = s->sizes;
  int64_t bucket = g->buckets[bucket_of(g, n)].size;
  for (int i = 0; i < g->ntensors; i++) {
    const rt_tensor_desc *t = &g->tensors[i];
    if (!z->at[i] || (t->role != NOVA_ROLE_OUTPUT && t->role != NOVA_ROLE_LOSS)) continue;
    int64_t lay[NOVA_MAX_RANK], sh[NOVA_MAX_RANK];
    shape_at(g, i, bucket, lay);
    shape_at(g, i, n, sh);
    compact(s->buffers[i], t->rank, lay, sh, rt_dtype_size(t->dtype));
    z->at[i] = n;
    memcpy(z->shape[i], sh, sizeof sh);
  }
}

nova_status rt_sizes_set(nova_step *s, int64_t n) {
  const rt_graph *g = s->graph;
  if (!g) return NOVA_ERR_ABI; /* the message says why it did not open */
  if (!s->sizes)
    return rt_fail(s, NOVA_ERR_INVALID_ARGUMENT, "nova_step_set_size: the step was compiled for one size (novac "
                   "--dim=NAME=LO..HI makes one for several)");
  if (n < g->dim_lo || n > g->dim_hi)
    return rt_fail(s, NOVA_ERR_SHAPE, "%s=%lld is outside the sizes the step was compiled for, %lld to %lld",
                   g->dim_name, (long long)n, (long long)g->dim_lo, (long long)g->dim_hi);
  for (int i = 0; i < g->ntensors; i++)
    if (s->sizes->at[i] && !s->bound[i]) { /* (a bound tensor keeps its size until bound again) */
      s->sizes->at[i] = n;
      shape_at(g, i, n, s->sizes->shape[i]);
    }
  s->error[0] = 0;
  return NOVA_OK;
}

NOVA_API int nova_step_sizes(const nova_step *step, const char **dim, int64_t *lo, int64_t *hi,
                             const int64_t **buckets) {
  if (!rt_handle_live(step) || !step->graph || !step->graph->dim_name || !step->sizes) return 0;
  const rt_graph *g = step->graph;
  if (dim) *dim = g->dim_name;
  if (lo) *lo = g->dim_lo;
  if (hi) *hi = g->dim_hi;
  if (buckets) *buckets = step->sizes->sizes;
  return g->nbuckets;
}
