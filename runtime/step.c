/* step.c: the public ABI of nova/step.h over the step's nova_rt_graph.
 *
 * A nova_step owns one RT_BUFFER_ALIGN-aligned buffer per tensor of the
 * graph; run() hands the compiled entry those buffers in the order
 * graph->arg_tensor gives.  Every function checks its arguments and
 * returns a status, recording a message for nova_step_error() where it has
 * a step to record it in.
 */
#include <link.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "rt_dtype.h"
#include "rt_init.h"
#include "rt_comm.h"
#include "rt_step.h"
#include "rt_trace.h"

nova_status rt_fail(nova_step *s, nova_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->error, sizeof s->error, fmt, ap);
  va_end(ap);
  return status;
}

static nova_status rt_ok(nova_step *s) {
  s->error[0] = '\0';
  return NOVA_OK;
}

/* The queries take a const step; their failures still set its message
 * (the step itself was allocated writable by nova_step_open). */
static nova_status rt_fail_const(const nova_step *s, nova_status status, const char *what) {
  return rt_fail((nova_step *)(uintptr_t)s, status, "%s", what);
}

/* Returns from the calling ABI function unless STEP is a live step. */
#define RT_LIVE(step)                                         \
  do {                                                        \
    if (!(step)) return NOVA_ERR_INVALID_ARGUMENT;            \
    if (!rt_handle_live(step)) return NOVA_ERR_INVALID_HANDLE; \
  } while (0)

/* ---- open / close -------------------------------------------------------- */

/* T starts with a value (bytes or generated), not zeros. */
static bool rt_has_initial(const rt_tensor_desc *t) { return t->init_offset >= 0 || t->init_kind != RT_INIT_NONE; }

typedef void (*rt_task)(void **argv, int64_t lo, int64_t hi);
void nova_rt_parallel_for(rt_task task, void **argv, int64_t lb, int64_t ub, int64_t step);

#define RT_INIT_BLOCK 65536 /* elements per share of a generated initial value */

/* Blocks [LO, HI) of the generated initial value of ARGV[0] (an
 * rt_tensor_desc) into ARGV[1], of *ARGV[2] elements. */
static void rt_init_blocks(void **argv, int64_t lo, int64_t hi) {
  const rt_tensor_desc *t = argv[0];
  int64_t n = *(const int64_t *)argv[2], end = hi * RT_INIT_BLOCK < n ? hi * RT_INIT_BLOCK : n;
  rt_init_fill(t->init_kind, t->init_a, t->init_b, t->init_seed, t->dtype, t->rank, t->shape, lo * RT_INIT_BLOCK, end,
               argv[1]);
}

/* The buffer of one tensor: NBYTES rounded up to RT_BUFFER_ALIGN (at least
 * one block, so a 0-element tensor still has a valid pointer), holding the
 * tensor's initial value (bytes of the step's init data, or generated on
 * the step's threads) or zeros; the padding is zeroed too, so vector code
 * reading a whole last block reads defined bytes.  NULL when out of
 * memory. */
static void *rt_buffer_create(const rt_graph *g, const rt_tensor_desc *t, size_t nbytes) {
  size_t size = nbytes ? (nbytes + RT_BUFFER_ALIGN - 1) / RT_BUFFER_ALIGN * RT_BUFFER_ALIGN : RT_BUFFER_ALIGN;
  void *buf = aligned_alloc(RT_BUFFER_ALIGN, size);
  if (!buf) return NULL;
  memset(buf, 0, size);
  if (t->init_offset >= 0 && nbytes > 0) memcpy(buf, g->init_data + t->init_offset, nbytes);
  if (t->init_kind != RT_INIT_NONE && nbytes > 0) {
    int64_t n = (int64_t)(nbytes / rt_dtype_size(t->dtype));
    void *argv[3] = {(void *)(uintptr_t)t, buf, &n};
    nova_rt_parallel_for(rt_init_blocks, argv, 0, (n + RT_INIT_BLOCK - 1) / RT_INIT_BLOCK, 1);
  }
  return buf;
}

/* The step.so's initial values, once copied into the buffers: the pages
 * wholly inside them are given back (MADV_DONTNEED: they are the mapped
 * file's, read again from it if ever touched), so that the process does
 * not hold every parameter twice (a 144M-parameter model: 576 MB). */
static void rt_release_init(const rt_graph *g) {
  long page = sysconf(_SC_PAGESIZE);
  if (!g->init_data || page <= 0 || g->init_size < 2 * (uint64_t)page) return;
  uintptr_t lo = ((uintptr_t)g->init_data + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
  uintptr_t hi = ((uintptr_t)g->init_data + (uintptr_t)g->init_size) / (uintptr_t)page * (uintptr_t)page;
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: a failure changes nothing */
}

/* The evaluation entry's arguments (the buffers of the tensors it names)
 * and its arena. */
static nova_status rt_eval_alloc(nova_step *s) {
  const rt_graph *g = s->graph;
  s->eval_args = calloc((size_t)g->eval_nargs + 1, sizeof *s->eval_args);
  if (!s->eval_args) return NOVA_ERR_NO_MEMORY;
  for (int a = 0; a < g->eval_nargs; a++) s->eval_args[a] = s->buffers[g->eval_arg_tensor[a]];
  uint64_t bytes = rt_sizes_arena(g, 1);
  if (bytes) {
    size_t size = (bytes + RT_BUFFER_ALIGN - 1) / RT_BUFFER_ALIGN * RT_BUFFER_ALIGN;
    if (size < bytes || !(s->eval_arena = aligned_alloc(RT_BUFFER_ALIGN, size)))
      return rt_fail(s, NOVA_ERR_NO_MEMORY, "out of memory for the evaluation's intermediates (%llu bytes)",
                     (unsigned long long)bytes);
    s->eval_args[g->eval_nargs] = s->eval_arena;
  }
  return NOVA_OK;
}

/* A data-parallel step (novac --data-parallel): joins the launcher's
 * world and makes comm.scale 1/world (the sum of the ranks' gradients, each
 * the mean over its own samples, becomes the mean over all of them). */
static nova_status rt_comm_open(nova_step *s) {
  if (s->graph->target != RT_TARGET_CPU) {
    int rank, n;
    (void)rt_comm_init(s->error, sizeof s->error);
    if ((n = rt_comm_world(&rank)) > 1)
      return rt_fail(s, NOVA_ERR_COMM, "launched as %d ranks: the cuda target has no transport between "
                     "processes yet; run it as one process", n);
    return NOVA_OK;
  }
  if (rt_comm_init(s->error, sizeof s->error)) return NOVA_ERR_COMM;
  int n = rt_comm_world(NULL);
  *(float *)s->buffers[s->comm_scale] = 1.0f / (float)n;
  for (int i = 0; i < s->graph->ntensors; i++) { /* novac --world-size=N: the ranks it was made for */
    const rt_tensor_desc *t = &s->graph->tensors[i];
    if (t->role == NOVA_ROLE_INPUT && t->dtype == NOVA_DTYPE_I32 && t->rank == 0 && !strcmp(t->name, "comm.world") &&
        *(int32_t *)s->buffers[i] != n)
      return rt_fail(s, NOVA_ERR_COMM, "the step was compiled for %d ranks (novac --world-size=%d), but runs as %d%s",
                     *(int32_t *)s->buffers[i], *(int32_t *)s->buffers[i], n,
                     n == 1 ? " (start it with mpirun)" : "");
  }
  return NOVA_OK;
}

/* FNV-1a of the executable segments of the object that holds G (the
 * step's code: the optimizer and every constant compiled into it) and of
 * its tensors' names, roles, dtypes and shapes. */
typedef struct rt_code_scan {
  const void *at;
  uint64_t h;
} rt_code_scan;

static uint64_t rt_fnv(uint64_t h, const void *p, size_t n) {
  for (size_t k = 0; k < n; k++) h = (h ^ ((const unsigned char *)p)[k]) * 0x100000001b3ull;
  return h;
}

static int rt_code_cb(struct dl_phdr_info *info, size_t size, void *ud) {
  (void)size;
  rt_code_scan *c = ud;
  uintptr_t at = (uintptr_t)c->at;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    mine = ph->p_type == PT_LOAD && at >= lo && at < lo + ph->p_memsz;
  }
  if (!mine) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X))
      c->h = rt_fnv(c->h, (const void *)(info->dlpi_addr + ph->p_vaddr), ph->p_filesz);
  }
  return 1;
}

static uint64_t rt_code_hash(const rt_graph *g) {
  rt_code_scan c = {g, 0xcbf29ce484222325ull};
  dl_iterate_phdr(rt_code_cb, &c);
  for (int i = 0; i < g->ntensors; i++) {
    const rt_tensor_desc *t = &g->tensors[i];
    c.h = rt_fnv(c.h, t->name, strlen(t->name) + 1);
    int32_t v[3] = {t->role, t->dtype, t->rank};
    c.h = rt_fnv(c.h, v, sizeof v);
    c.h = rt_fnv(c.h, t->shape, (size_t)t->rank * sizeof *t->shape);
  }
  return c.h;
}

/* Before the first run in a world of more than one: every rank must run
 * the same step (graph hash) from the same parameters (a checksum of
 * their bytes), else the sums would mix unrelated gradients. */
static nova_status rt_comm_check(nova_step *s) {
  const rt_graph *g = s->graph;
  int rank, n = rt_comm_world(&rank);
  s->comm_checked = 1;
  if (n <= 1) return NOVA_OK;
  struct { char hash[48]; uint64_t code, params; } mine = {{0}, rt_code_hash(g), 0xcbf29ce484222325ull},
                                                  *all = calloc((size_t)n, sizeof mine);
  if (!all) return rt_fail(s, NOVA_ERR_NO_MEMORY, "out of memory");
  snprintf(mine.hash, sizeof mine.hash, "%s", g->graph_hash ? g->graph_hash : "");
  for (int i = 0; i < g->ntensors; i++) /* every parameter's bytes */
    if (g->tensors[i].role == NOVA_ROLE_PARAM) mine.params = rt_fnv(mine.params, s->buffers[i], s->nbytes[i]);
  nova_status st = NOVA_OK;
  if (rt_comm_allgather(&mine, sizeof mine, all, s->error, sizeof s->error)) st = NOVA_ERR_COMM;
  for (int r = 1; r < n && st == NOVA_OK; r++) {
    if (strcmp(all[r].hash, all[0].hash) || all[r].code != all[0].code)
      st = rt_fail(s, NOVA_ERR_COMM, "rank %d runs another step.so than rank 0 (graph hash %.16s, code %016llx; rank "
                   "0: %.16s, %016llx): every rank must load the same step.so", r, all[r].hash,
                   (unsigned long long)all[r].code, all[0].hash, (unsigned long long)all[0].code);
    else if (all[r].params != all[0].params)
      st = rt_fail(s, NOVA_ERR_COMM, "rank %d starts from other parameters than rank 0 (checksum %016llx, rank 0: "
                   "%016llx): every rank must load the same checkpoint", r, (unsigned long long)all[r].params,
                   (unsigned long long)all[0].params);
  }
  free(all);
  return st;
}

/* Allocates the per-tensor arrays and buffers of S for S->graph, whose
 * header rt_graph_check_header accepted.  Fills nbytes via the descriptor
 * checks; returns NOVA_ERR_ABI (message in S) for a malformed descriptor. */
static nova_status rt_step_alloc(nova_step *s) {
  const rt_graph *g = s->graph;
  size_t nt = g->ntensors > 0 ? (size_t)g->ntensors : 1, na = g->nargs > 0 ? (size_t)g->nargs : 1;
  s->buffers = calloc(nt, sizeof *s->buffers);
  s->nbytes = calloc(nt, sizeof *s->nbytes);
  s->bound = calloc(nt, sizeof *s->bound);
  s->args = calloc(na + 1, sizeof *s->args);
  if (!s->buffers || !s->nbytes || !s->bound || !s->args) return NOVA_ERR_NO_MEMORY;
  nova_status st = rt_graph_check_tensors(g, s->nbytes, s->error);
  if (st == NOVA_OK) st = rt_sizes_check(g, s->error);
  if (st != NOVA_OK) return st;
  for (int i = 0; i < g->ntensors; i++)
    if (!g->tensors[i].inplace && !(s->buffers[i] = rt_buffer_create(g, &g->tensors[i], s->nbytes[i])))
      return rt_fail(s, NOVA_ERR_NO_MEMORY, "out of memory for tensor '%s' (%zu bytes)", g->tensors[i].name,
                     s->nbytes[i]);
  for (int i = 0; i < g->ntensors; i++) /* an update in place shares its param's buffer */
    if (g->tensors[i].inplace) s->buffers[i] = s->buffers[g->tensors[i].updates];
  rt_release_init(g);
  for (int a = 0; a < g->nargs; a++) s->args[a] = s->buffers[g->arg_tensor[a]];
  s->last_ms = -1;
  s->nonfinite = s->skipped = s->comm_scale = -1;
  for (int i = 0; i < g->ntensors; i++) {
    const rt_tensor_desc *t = &g->tensors[i];
    if (t->role == NOVA_ROLE_STATUS && t->dtype == NOVA_DTYPE_BOOL && t->rank == 0 && !strcmp(t->name, "nonfinite"))
      s->nonfinite = i;
    if (t->role == NOVA_ROLE_STATUS && t->dtype == NOVA_DTYPE_I32 && t->rank == 0 &&
        !strcmp(t->name, "nonfinite.skipped"))
      s->skipped = i;
    if (t->role == NOVA_ROLE_INPUT && t->dtype == NOVA_DTYPE_F32 && t->rank == 0 && !strcmp(t->name, "comm.scale"))
      s->comm_scale = i;
  }
  if (s->comm_scale >= 0 && rt_comm_open(s) != NOVA_OK) return NOVA_ERR_COMM;
  uint64_t arena = rt_sizes_arena(g, 0);
  if (arena && g->target == RT_TARGET_CPU) {
    size_t size = (arena + RT_BUFFER_ALIGN - 1) / RT_BUFFER_ALIGN * RT_BUFFER_ALIGN;
    if (size < arena || !(s->arena = aligned_alloc(RT_BUFFER_ALIGN, size)))
      return rt_fail(s, NOVA_ERR_NO_MEMORY, "out of memory for the step's intermediates (%llu bytes)",
                     (unsigned long long)arena);
    s->args[g->nargs] = s->arena;
  }
  if (g->eval_entry && rt_eval_alloc(s) != NOVA_OK) return NOVA_ERR_NO_MEMORY;
  if (rt_sizes_open(s) != NOVA_OK) return rt_fail(s, NOVA_ERR_NO_MEMORY, "out of memory");
  return g->target == RT_TARGET_CUDA ? rt_cuda_open(s) : NOVA_OK;
}

/* Frees the buffers and arrays of S, leaving only its error message: what
 * a step that failed the descriptor checks keeps. */
static void rt_step_release(nova_step *s) {
  rt_cuda_close(s);
  rt_sizes_close(s);
  if (s->buffers && s->graph)
    for (int i = 0; i < s->graph->ntensors; i++)
      if (!s->graph->tensors[i].inplace) free(s->buffers[i]);
  free(s->buffers);
  free(s->nbytes);
  free(s->bound);
  free(s->args);
  free(s->arena);
  free(s->eval_args);
  free(s->eval_arena);
  s->arena = NULL;
  s->eval_args = NULL;
  s->eval_arena = NULL;
  s->buffers = NULL;
  s->nbytes = NULL;
  s->bound = NULL;
  s->args = NULL;
  s->graph = NULL;
}

nova_status rt_step_open_graph(const rt_graph *graph, nova_step **step) {
  if (!step) return NOVA_ERR_INVALID_ARGUMENT;
  *step = NULL;
  if (!graph) return NOVA_ERR_INVALID_ARGUMENT;
  nova_step *s = calloc(1, sizeof *s);
  if (!s) return NOVA_ERR_NO_MEMORY;
  nova_status st = rt_graph_check_header(graph, s->error);
  if (st == NOVA_OK) {
    s->graph = graph;
    st = rt_step_alloc(s);
  }
  if (st != NOVA_OK && st != NOVA_ERR_NO_MEMORY) rt_step_release(s); /* keep only the message */
  if (st == NOVA_ERR_NO_MEMORY || !rt_handle_add(s)) {
    rt_step_release(s);
    free(s);
    return NOVA_ERR_NO_MEMORY;
  }
  *step = s;
  return st;
}

NOVA_API nova_status nova_step_open(nova_step **step) { return rt_step_open_graph(&nova_rt_graph, step); }

NOVA_API void nova_step_close(nova_step *step) {
  if (!rt_handle_remove(step)) return; /* NULL, closed already, or not a step */
  rt_step_release(step);
  free(step);
}

/* ---- queries ------------------------------------------------------------- */

static int rt_find(const nova_step *s, const char *name) {
  for (int i = 0; i < s->graph->ntensors; i++)
    if (strcmp(s->graph->tensors[i].name, name) == 0) return i;
  return -1;
}

static void rt_fill_info(const nova_step *s, int i, nova_tensor_info *info) {
  const rt_tensor_desc *t = &s->graph->tensors[i];
  info->name = t->name;
  info->role = (nova_role)t->role;
  info->dtype = (nova_dtype)t->dtype;
  info->rank = t->rank;
  info->shape = t->shape;
  info->nbytes = s->nbytes[i];
  const int64_t *now = rt_sizes_shape(s, i, &info->nbytes);
  if (now) info->shape = now;
  info->has_default = (t->role == NOVA_ROLE_INPUT || t->role == NOVA_ROLE_LABEL) && rt_has_initial(t);
  info->index_bound = t->index_bound;
}

NOVA_API int nova_step_num_tensors(const nova_step *step) {
  return rt_handle_live(step) && step->graph ? step->graph->ntensors : 0;
}

NOVA_API nova_status nova_step_tensor(const nova_step *step, int index, nova_tensor_info *info) {
  RT_LIVE(step);
  if (!step->graph) return NOVA_ERR_ABI; /* the message says why it did not open */
  if (!info) return rt_fail_const(step, NOVA_ERR_INVALID_ARGUMENT, "nova_step_tensor: info is NULL");
  if (index < 0 || index >= step->graph->ntensors) {
    char m[128];
    snprintf(m, sizeof m, "nova_step_tensor: index %d is outside [0, %d)", index, step->graph->ntensors);
    return rt_fail_const(step, NOVA_ERR_INVALID_ARGUMENT, m);
  }
  rt_fill_info(step, index, info);
  return NOVA_OK;
}

NOVA_API nova_status nova_step_find(const nova_step *step, const char *name, int *index) {
  RT_LIVE(step);
  if (!step->graph) return NOVA_ERR_ABI; /* the message says why it did not open */
  if (!name || !index)
    return rt_fail_const(step, NOVA_ERR_INVALID_ARGUMENT, !name ? "nova_step_find: name is NULL"
                                                                : "nova_step_find: index is NULL");
  *index = rt_find(step, name);
  if (*index >= 0) return NOVA_OK;
  char m[RT_ERROR_LEN];
  snprintf(m, sizeof m, "no tensor named '%.900s' in this step", name);
  return rt_fail_const(step, NOVA_ERR_NOT_FOUND, m);
}

/* ---- bind / run / get ---------------------------------------------------- */

/* Checks that a value of DTYPE, RANK and SHAPE fits tensor I exactly. */
static nova_status rt_check_bind(nova_step *s, int i, nova_dtype dtype, int rank, const int64_t *shape) {
  const rt_tensor_desc *t = &s->graph->tensors[i];
  char given[256], want[256];
  if (t->role != NOVA_ROLE_INPUT && t->role != NOVA_ROLE_LABEL && t->role != NOVA_ROLE_PARAM &&
      t->role != NOVA_ROLE_OPT_STATE && t->role != NOVA_ROLE_BUFFER)
    return rt_fail(s, NOVA_ERR_ROLE,
                   "tensor '%s' has role %s; only inputs, labels, params, opt_state and buffers can be bound", t->name,
                   rt_role_name(t->role));
  if ((int)dtype != t->dtype)
    return rt_fail(s, NOVA_ERR_DTYPE, "tensor '%s': dtype %s given, step compiled for %s", t->name,
                   rt_dtype_name(dtype), rt_dtype_name(t->dtype));
  int sized = rt_sizes_follows(s, i); /* (rt_sizes_bind checks its shape) */
  int same = sized || rank == t->rank;
  for (int d = 0; same && !sized && d < rank; d++) same = shape[d] == t->shape[d];
  if (!same)
    return rt_fail(s, NOVA_ERR_SHAPE, "tensor '%s': shape %s given, step compiled for %s", t->name,
                   rt_shape_str(given, sizeof given, rank, shape), rt_shape_str(want, sizeof want, t->rank, t->shape));
  return NOVA_OK;
}

/* A training step's learning rate must be a finite number, not negative. */
static nova_status rt_check_hyper(nova_step *s, int i, const void *data) {
  const rt_tensor_desc *t = &s->graph->tensors[i];
  if (t->role != NOVA_ROLE_INPUT || t->dtype != NOVA_DTYPE_F32 || t->rank != 0 || strcmp(t->name, "lr")) return NOVA_OK;
  float v;
  memcpy(&v, data, sizeof v);
  if (isfinite(v) && v >= 0) return NOVA_OK;
  return rt_fail(s, NOVA_ERR_NOT_FINITE, "tensor 'lr': the learning rate must be a finite number >= 0, not %g",
                 (double)v);
}

static nova_status rt_bind(nova_step *step, const char *name, nova_dtype dtype, int rank, const int64_t *shape,
                           const void *data) {
  if (!step->graph) return NOVA_ERR_ABI; /* the message says why it did not open */
  if (!name) return rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "nova_step_bind: name is NULL");
  if (!data) return rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "nova_step_bind: tensor '%s': data is NULL", name);
  if (rank > 0 && !shape)
    return rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "nova_step_bind: tensor '%s': shape is NULL", name);
  if (rank < 0 || rank > NOVA_MAX_RANK)
    return rt_fail(step, NOVA_ERR_SHAPE, "tensor '%s': rank %d given, the most a step supports is %d", name,
                   rank, NOVA_MAX_RANK);
  int i = rt_find(step, name);
  if (i < 0) return rt_fail(step, NOVA_ERR_NOT_FOUND, "no tensor named '%s' in this step", name);
  nova_status st = rt_check_bind(step, i, dtype, rank, shape);
  if (st == NOVA_OK) st = rt_check_hyper(step, i, data);
  if (st != NOVA_OK) return st;
  if (step->sizes && (rt_sizes_follows(step, i) || i == step->graph->dim_size_tensor)) {
    if ((st = rt_sizes_bind(step, i, rank, shape, data)) != NOVA_OK) return st;
  } else
    memcpy(step->buffers[i], data, step->nbytes[i]);
  step->bound[i] = 1;
  if (step->cuda) rt_cuda_bound(step, i);
  return rt_ok(step);
}

/* Every input and label tensor I (all, or those ARG[0..n) names) bound or
 * with a default, and its index values in range. */
static nova_status rt_check_inputs(nova_step *step, const int32_t *arg, int n) {
  const rt_graph *g = step->graph;
  for (int k = 0; k < n; k++) {
    int i = arg ? arg[k] : k;
    const rt_tensor_desc *t = &g->tensors[i];
    /* an input with an initial value (a training step's lr) has a default */
    if ((t->role == NOVA_ROLE_INPUT || t->role == NOVA_ROLE_LABEL) && !step->bound[i] && !rt_has_initial(t))
      return rt_fail(step, NOVA_ERR_UNBOUND, "%s '%s' was never bound", rt_role_name(t->role), t->name);
  }
  for (int k = 0; k < n; k++) {
    int i = arg ? arg[k] : k;
    if (g->tensors[i].index_bound > 0 && rt_check_index(step, i) != NOVA_OK) return NOVA_ERR_OUT_OF_RANGE;
  }
  return NOVA_OK;
}

static nova_status rt_eval(nova_step *step) {
  if (!step->graph) return NOVA_ERR_ABI; /* the message says why it did not open */
  const rt_graph *g = step->graph;
  if (!g->eval_entry)
    return rt_fail(step, NOVA_ERR_NO_ENTRY, "this step has no evaluation entry (only training steps compiled by "
                   "novac --train for the cpu have one)");
  nova_status st = rt_check_inputs(step, g->eval_arg_tensor, g->eval_nargs);
  void (*entry)(void **) = g->eval_entry;
  void **args = step->eval_args;
  int64_t size = 0;
  if (st == NOVA_OK && step->sizes) st = rt_sizes_pick(step, true, &entry, &args, &size);
  if (st != NOVA_OK) return st;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  entry(args);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (step->sizes) rt_sizes_done(step, size);
  step->last_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  return rt_ok(step);
}

/* ---- the non-finite check ------------------------------------------------- */

/* Tensor I's host copy, current (fetched from the device for a cuda step);
 * NULL after a failed fetch (the message is set). */
static const void *rt_host(nova_step *step, int i) {
  if (step->cuda && rt_cuda_fetch(step, i) != NOVA_OK) return NULL;
  return step->buffers[i];
}

/* The first element of float tensor I that is NaN or infinite: its flat
 * index into *AT and value into *V; 0 if there is none. */
static int rt_first_nonfinite(nova_step *step, int i, size_t *at, double *v) {
  const rt_tensor_desc *t = &step->graph->tensors[i];
  if (t->dtype != NOVA_DTYPE_F32 && t->dtype != NOVA_DTYPE_F64) return 0;
  const void *p = rt_host(step, i);
  size_t n = p ? step->nbytes[i] / rt_dtype_size(t->dtype) : 0;
  for (size_t k = 0; k < n; k++) {
    double x = t->dtype == NOVA_DTYPE_F32 ? (double)((const float *)p)[k] : ((const double *)p)[k];
    if (!isfinite(x)) {
      *at = k, *v = x;
      return 1;
    }
  }
  return 0;
}

/* After a run of a training step: NOVA_ERR_NONFINITE, naming the loss or
 * the first gradient that holds a NaN or an infinity, when the step's flag
 * is set; NOVA_OK otherwise.  The message says what the step changed:
 * nothing, or (novac --nonfinite=skip-param, a finite loss) every param
 * but the ones whose gradient is not finite. */
static nova_status rt_check_nonfinite(nova_step *step) {
  if (step->nonfinite < 0) return NOVA_OK;
  const unsigned char *flag = rt_host(step, step->nonfinite);
  if (!flag) return NOVA_ERR_DEVICE;
  if (!*flag) return NOVA_OK;
  const rt_graph *g = step->graph;
  const char *unchanged = "the step updated nothing: parameters and optimizer state are unchanged";
  char scaled[160], some[200];
  int trained = 0;
  bool kept = false; /* gradients are outputs (novac --keep-grads): one of them is named */
  for (int i = 0; i < g->ntensors; i++) {
    kept |= g->tensors[i].role == NOVA_ROLE_GRAD;
    trained += g->tensors[i].role == NOVA_ROLE_UPDATE && g->tensors[i].updates >= 0 &&
               g->tensors[g->tensors[i].updates].role == NOVA_ROLE_PARAM;
    if (g->tensors[i].role == NOVA_ROLE_OPT_STATE && !strcmp(g->tensors[i].name, "amp.loss_scale")) {
      const float *sc = rt_host(step, i); /* dynamic loss scaling: the scale, halved by this step */
      snprintf(scaled, sizeof scaled, "loss scale overflow: the step updated only its loss scale, now %g (parameters "
               "and optimizer state are unchanged)", sc ? (double)*sc : 0.0);
      unchanged = scaled;
    }
  }
  size_t at;
  double v;
  for (int i = 0; i < g->ntensors; i++)
    if (g->tensors[i].role == NOVA_ROLE_LOSS && rt_first_nonfinite(step, i, &at, &v))
      return rt_fail(step, NOVA_ERR_NONFINITE, "non-finite loss: '%s' is %s; %s", g->tensors[i].name,
                     isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf", unchanged);
  const int32_t *nskip = step->skipped >= 0 ? rt_host(step, step->skipped) : NULL;
  if (nskip && *nskip < trained) { /* a finite loss: the params with finite gradients were updated */
    snprintf(some, sizeof some, "%d of %d parameters kept their values (their updates skipped), the others were "
             "updated", (int)*nskip, trained);
    unchanged = some;
  }
  for (int i = 0; i < g->ntensors; i++)
    if (g->tensors[i].role == NOVA_ROLE_GRAD && rt_first_nonfinite(step, i, &at, &v))
      return rt_fail(step, NOVA_ERR_NONFINITE, "non-finite gradients: '%s' holds %s at flat index %zu; %s",
                     g->tensors[i].name, isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf", at, unchanged);
  if (!kept)
    return rt_fail(step, NOVA_ERR_NONFINITE, "non-finite gradients (compile with novac --keep-grads to have the "
                   "first one named); %s", unchanged);
  return rt_fail(step, NOVA_ERR_NONFINITE, "non-finite loss or gradients; %s", unchanged);
}

static nova_status rt_run(nova_step *step) {
  if (!step->graph) return NOVA_ERR_ABI; /* the message says why it did not open */
  const rt_graph *g = step->graph;
  nova_status st = rt_check_inputs(step, NULL, g->ntensors);
  void (*entry)(void **) = g->entry;
  void **args = step->args;
  int64_t size = 0;
  if (st == NOVA_OK && step->sizes) st = rt_sizes_pick(step, false, &entry, &args, &size);
  if (st != NOVA_OK) return st;
  if (step->cuda) {
    st = rt_cuda_run(step);
    if (st == NOVA_OK) st = rt_check_nonfinite(step);
    return st == NOVA_OK ? rt_ok(step) : st;
  }
  if (step->comm_scale >= 0 && !step->comm_checked && (st = rt_comm_check(step)) != NOVA_OK) return st;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  entry(args);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (step->sizes) rt_sizes_done(step, size);
  if (atomic_load_explicit(&rt_trace_on, memory_order_relaxed)) {
    rt_event e = {(double)t0.tv_sec + (double)t0.tv_nsec * 1e-9, (double)t1.tv_sec + (double)t1.tv_nsec * 1e-9,
                  RT_EV_STEP, RT_TRACK_COMPUTE, -1, step->runs, 0};
    rt_trace_add(&e);
  }
  step->runs++;
  if (step->comm_scale >= 0) rt_comm_step_done();
  step->last_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  /* a training step's new parameters and optimizer state replace the old */
  for (int i = 0; i < g->ntensors; i++)
    if (g->tensors[i].updates >= 0 && !g->tensors[i].inplace)
      memcpy(step->buffers[g->tensors[i].updates], step->buffers[i], step->nbytes[i]);
  st = rt_check_nonfinite(step);
  return st == NOVA_OK ? rt_ok(step) : st;
}

static nova_status rt_get(nova_step *step, const char *name, const void **data, nova_tensor_info *info) {
  if (!step->graph) return NOVA_ERR_ABI; /* the message says why it did not open */
  if (!name || !data || !info)
    return rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "nova_step_get: %s is NULL",
                   !name ? "name" : !data ? "data" : "info");
  int i = rt_find(step, name);
  if (i < 0) return rt_fail(step, NOVA_ERR_NOT_FOUND, "no tensor named '%s' in this step", name);
  if (step->cuda) {
    nova_status st = rt_cuda_fetch(step, i);
    if (st != NOVA_OK) return st;
  }
  *data = step->buffers[i];
  rt_fill_info(step, i, info);
  return rt_ok(step);
}

/* The calls that use the buffers: on a live step, one thread at a time. */
#define RT_EXCLUSIVE(step, call)                      \
  do {                                                \
    RT_LIVE(step);                                    \
    if (!rt_step_enter(step)) return NOVA_ERR_BUSY;   \
    nova_status st_ = call;                           \
    rt_step_leave(step);                              \
    return st_;                                       \
  } while (0)

NOVA_API nova_status nova_step_bind(nova_step *step, const char *name, nova_dtype dtype, int rank,
                                    const int64_t *shape, const void *data) {
  RT_EXCLUSIVE(step, rt_bind(step, name, dtype, rank, shape, data));
}
NOVA_API nova_status nova_step_run(nova_step *step) { RT_EXCLUSIVE(step, rt_run(step)); }
NOVA_API nova_status nova_step_eval(nova_step *step) { RT_EXCLUSIVE(step, rt_eval(step)); }
NOVA_API nova_status nova_step_set_size(nova_step *step, int64_t size) { RT_EXCLUSIVE(step, rt_sizes_set(step, size)); }
NOVA_API nova_status nova_step_get(nova_step *step, const char *name, const void **data, nova_tensor_info *info) {
  RT_EXCLUSIVE(step, rt_get(step, name, data, info));
}

NOVA_API int nova_step_world(const nova_step *step, int *rank) {
  if (rank) *rank = 0;
  if (!rt_handle_live(step) || !step->graph || step->comm_scale < 0) return 1;
  return rt_comm_world(rank);
}

static nova_status rt_all_sum(nova_step *step, double *v, int n) {
  if (!v || n < 0) return rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "nova_step_all_sum: %s", v ? "n < 0" : "v is NULL");
  if (step->comm_scale < 0) return rt_ok(step);
  return rt_comm_sum(v, n, step->error, sizeof step->error) ? NOVA_ERR_COMM : rt_ok(step);
}
NOVA_API nova_status nova_step_all_sum(nova_step *step, double *v, int n) { RT_EXCLUSIVE(step, rt_all_sum(step, v, n)); }

NOVA_API const char *nova_step_graph_hash(const nova_step *step) {
  return rt_handle_live(step) && step->graph && step->graph->graph_hash ? step->graph->graph_hash : "";
}

NOVA_API double nova_step_last_run_ms(const nova_step *step) {
  if (!rt_handle_live(step) || !step->graph) return -1;
  return step->cuda ? rt_cuda_last_ms(step) : step->last_ms;
}

static nova_status rt_set_profiling(nova_step *step, int on) {
  if (!step->graph) return NOVA_ERR_ABI; /* the message says why it did not open */
  if (!step->cuda) return on ? rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "per-kernel profiling needs a --target=cuda step") : NOVA_OK;
  return rt_cuda_set_profiling(step, on);
}

NOVA_API nova_status nova_step_set_profiling(nova_step *step, int on) { RT_EXCLUSIVE(step, rt_set_profiling(step, on)); }

NOVA_API int nova_step_num_launches(const nova_step *step) {
  return rt_handle_live(step) && step->graph && step->cuda ? rt_cuda_num_launches(step) : 0;
}

NOVA_API nova_status nova_step_launch(const nova_step *step, int index, const char **kernel, double *ms) {
  RT_LIVE(step);
  if (!kernel || !ms) return rt_fail_const(step, NOVA_ERR_INVALID_ARGUMENT, "nova_step_launch: kernel or ms is NULL");
  if (!step->graph) return NOVA_ERR_ABI; /* the message says why it did not open */
  if (!step->cuda || index < 0 || index >= rt_cuda_num_launches(step))
    return rt_fail_const(step, NOVA_ERR_INVALID_ARGUMENT, "nova_step_launch: no such launch in the last run");
  return rt_cuda_launch(step, index, kernel, ms);
}

NOVA_API const char *nova_step_target(const nova_step *step) {
  return rt_handle_live(step) && step->graph && step->graph->target == RT_TARGET_CUDA ? "cuda" : "cpu";
}

NOVA_API const char *nova_step_error(const nova_step *step) {
  if (!step) return "no step (nova_step_open failed, or the step given is NULL)";
  return rt_handle_live(step) ? step->error : "invalid step handle (closed by nova_step_close, or not from nova_step_open)";
}

/* ---- names --------------------------------------------------------------- */

NOVA_API const char *nova_dtype_name(nova_dtype dtype) { return rt_dtype_name(dtype); }
NOVA_API size_t nova_dtype_size(nova_dtype dtype) { return rt_dtype_size(dtype); }
NOVA_API const char *nova_role_name(nova_role role) { return rt_role_name(role); }
