/* rt_check.c: validation of a step's descriptor (at open) and of index
 * inputs (at every run). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rt_dtype.h"
#include "rt_init.h"
#include "rt_step.h"

/* Writes the message to ERR (RT_ERROR_LEN bytes); returns NOVA_ERR_ABI,
 * the status of every descriptor problem. */
__attribute__((format(printf, 2, 3))) static nova_status rt_bad(char *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, RT_ERROR_LEN, fmt, ap);
  va_end(ap);
  return NOVA_ERR_ABI;
}

/* Everything about tensor I that does not involve other tensors. */
static nova_status rt_check_tensor(const rt_graph *g, int i, size_t *nbytes, char *err) {
  const rt_tensor_desc *t = &g->tensors[i];
  const char *name = t->name;
  char shape[256];
  if (!name || !name[0]) return rt_bad(err, "malformed step: tensor %d has no name", i);
  if (rt_role_name(t->role)[0] == '?')
    return rt_bad(err, "malformed step: tensor '%s': unknown role %d", name, (int)t->role);
  if (rt_dtype_size(t->dtype) == 0)
    return rt_bad(err, "malformed step: tensor '%s': unknown dtype %d", name, (int)t->dtype);
  if (!rt_tensor_nbytes(t->dtype, t->rank, t->shape, nbytes))
    return rt_bad(err, "malformed step: tensor '%s': bad shape %s (rank %d)", name,
                    rt_shape_str(shape, sizeof shape, t->rank, t->shape), (int)t->rank);
  if (t->updates < -1 || t->updates >= g->ntensors || (t->updates >= 0 && (t->role != NOVA_ROLE_UPDATE ||
      (g->tensors[t->updates].role != NOVA_ROLE_PARAM && g->tensors[t->updates].role != NOVA_ROLE_OPT_STATE &&
       g->tensors[t->updates].role != NOVA_ROLE_BUFFER) ||
      g->tensors[t->updates].dtype != t->dtype || g->tensors[t->updates].rank != t->rank ||
      memcmp(g->tensors[t->updates].shape, t->shape, (size_t)t->rank * sizeof t->shape[0]))))
    return rt_bad(err, "malformed step: tensor '%s': updates tensor %d, which is not a param, opt_state or buffer of its type",
                  name, (int)t->updates);
  if (t->inplace != 0 && (t->inplace != 1 || t->updates < 0))
    return rt_bad(err, "malformed step: tensor '%s': in place (%d) without a tensor to update", name, (int)t->inplace);
  if (t->index_lower != 0 && t->index_lower != -t->index_bound)
    return rt_bad(err, "malformed step: tensor '%s': index_lower %lld with index_bound %lld", name,
                  (long long)t->index_lower, (long long)t->index_bound);
  if (t->has_index_skip && (t->has_index_skip != 1 || t->index_bound <= 0))
    return rt_bad(err, "malformed step: tensor '%s': an index_skip without an index_bound", name);
  if (t->index_bound < 0 || (t->index_bound > 0 && t->dtype != NOVA_DTYPE_I32 && t->dtype != NOVA_DTYPE_I64))
    return rt_bad(err, "malformed step: tensor '%s': index_bound %lld on a %s tensor", name,
                    (long long)t->index_bound, rt_dtype_name(t->dtype));
  if (t->init_offset < -1 ||
      (t->init_offset >= 0 && (!g->init_data || (uint64_t)t->init_offset > g->init_size ||
                               *nbytes > g->init_size - (uint64_t)t->init_offset)))
    return rt_bad(err, "malformed step: tensor '%s': initial value at offset %lld, %zu bytes, "
                    "outside the %llu bytes of init data",
                    name, (long long)t->init_offset, *nbytes, (unsigned long long)g->init_size);
  if (t->init_kind < RT_INIT_NONE || t->init_kind > RT_INIT_LAST || (t->init_kind != RT_INIT_NONE && t->init_offset >= 0))
    return rt_bad(err, "malformed step: tensor '%s': generated initial value of kind %d%s", name, (int)t->init_kind,
                  t->init_offset >= 0 ? " beside init data" : "");
  return NOVA_OK;
}

/* Tensor names must be unique: bind() and get() look them up by name. */
static nova_status rt_check_unique(const rt_graph *g, int i, char *err) {
  for (int j = 0; j < i; j++)
    if (strcmp(g->tensors[j].name, g->tensors[i].name) == 0)
      return rt_bad(err, "malformed step: tensors %d and %d are both named '%s'", j, i,
                      g->tensors[i].name);
  return NOVA_OK;
}

nova_status rt_graph_check_header(const rt_graph *g, char *err) {
  if (g->abi_version != NOVA_STEP_ABI_VERSION)
    return rt_bad(err, "step ABI mismatch: the step was compiled for step ABI version %u, its runtime "
                    "implements version %d; rebuild it with a matching novac",
                    (unsigned)g->abi_version, NOVA_STEP_ABI_VERSION);
  if (g->ntensors < 0 || (g->ntensors > 0 && !g->tensors) || g->nargs < 0 || (g->nargs > 0 && !g->arg_tensor) ||
      !g->entry)
    return rt_bad(err, "malformed step: bad graph header (%d tensors, %d args, entry %s)",
                    (int)g->ntensors, (int)g->nargs, g->entry ? "set" : "missing");
  if (g->target != RT_TARGET_CPU && g->target != RT_TARGET_CUDA)
    return rt_bad(err, "malformed step: unknown target %d", (int)g->target);
  if (g->target == RT_TARGET_CUDA && g->arena_bytes > g->scratch_bytes)
    return rt_bad(err, "malformed step: an arena of %llu bytes in %llu bytes of scratch",
                  (unsigned long long)g->arena_bytes, (unsigned long long)g->scratch_bytes);
  if (g->target == RT_TARGET_CUDA && (!g->ptx || (g->cubin_size && !g->cubin) || g->sm < 50))
    return rt_bad(err, "malformed step: a cuda step without its kernels (sm %d)", (int)g->sm);
  return NOVA_OK;
}

/* The evaluation entry: a cpu step's; each argument a tensor, written only
 * where it is an output or the loss. */
static nova_status rt_check_eval(const rt_graph *g, char *err) {
  if (g->target != RT_TARGET_CPU || g->eval_nargs < 0 || (g->eval_nargs > 0 && !g->eval_arg_tensor))
    return rt_bad(err, "malformed step: a bad evaluation entry (%d args)", (int)g->eval_nargs);
  for (int a = 0; a < g->eval_nargs; a++) {
    int t = g->eval_arg_tensor[a];
    if (t < 0 || t >= g->ntensors)
      return rt_bad(err, "malformed step: evaluation argument %d names tensor %d of %d", a, t, (int)g->ntensors);
    if (g->tensors[t].role == NOVA_ROLE_GRAD || g->tensors[t].role == NOVA_ROLE_UPDATE ||
        g->tensors[t].role == NOVA_ROLE_STATUS)
      return rt_bad(err, "malformed step: evaluation argument %d is tensor '%s' of role %s", a, g->tensors[t].name,
                    rt_role_name(g->tensors[t].role));
  }
  return NOVA_OK;
}

nova_status rt_graph_check_tensors(const rt_graph *g, size_t *nbytes, char *err) {
  nova_status st = NOVA_OK;
  for (int i = 0; st == NOVA_OK && i < g->ntensors; i++) {
    st = rt_check_tensor(g, i, &nbytes[i], err);
    if (st == NOVA_OK) st = rt_check_unique(g, i, err);
  }
  for (int a = 0; st == NOVA_OK && a < g->nargs; a++)
    if (g->arg_tensor[a] < 0 || g->arg_tensor[a] >= g->ntensors)
      st = rt_bad(err, "malformed step: entry argument %d names tensor %d of %d", a,
                     (int)g->arg_tensor[a], (int)g->ntensors);
  if (st == NOVA_OK && g->eval_entry) st = rt_check_eval(g, err);
  return st;
}

nova_status rt_check_index(nova_step *s, int i) {
  const rt_tensor_desc *t = &s->graph->tensors[i];
  size_t n = s->nbytes[i] / rt_dtype_size(t->dtype);
  for (size_t k = 0; k < n; k++) {
    int64_t v = t->dtype == NOVA_DTYPE_I64 ? ((const int64_t *)s->buffers[i])[k]
                                           : ((const int32_t *)s->buffers[i])[k];
    if ((v < t->index_lower || v >= t->index_bound) && !(t->has_index_skip && v == t->index_skip))
      return rt_fail(s, NOVA_ERR_OUT_OF_RANGE, "tensor '%s': value %lld at flat index %zu is outside [%lld, %lld)%s",
                     t->name, (long long)v, k, (long long)t->index_lower, (long long)t->index_bound,
                     t->has_index_skip ? " and is not the ignore_index" : "");
  }
  return NOVA_OK;
}
