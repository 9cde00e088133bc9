/* rt_graph.h: the contract between code novac generates and the runtime.
 *
 * Every step.so defines exactly one `const rt_graph nova_rt_graph` (in the
 * descriptor file novac generates) and links runtime/ statically.  The
 * runtime owns one buffer per tensor; the compiled entry receives, in the
 * order arg_tensor gives, a pointer to each tensor's buffer.
 */
#ifndef NOVA_RT_GRAPH_H
#define NOVA_RT_GRAPH_H

#include <stdint.h>
#include "nova/step.h"

typedef struct rt_tensor_desc {
  const char *name;
  int32_t role;          /* nova_role */
  int32_t dtype;         /* nova_dtype */
  int32_t rank;
  int64_t shape[NOVA_MAX_RANK];
  int64_t index_bound;   /* > 0: integer input whose every value must lie in [0, index_bound) */
  int64_t init_offset;   /* >= 0: byte offset of the initial value in init_data; -1: zeros or
                            generated (init_kind) */
  int32_t updates;       /* >= 0 (role update): after each run this tensor is copied over
                            tensors[updates] (a param or opt_state); -1 otherwise */
  int64_t index_lower;   /* with index_bound: the lowest value allowed, 0 or -index_bound (ONNX
                            Gather counts negative indices from the end) */
  int32_t inplace;       /* with updates >= 0: 1 = the step computes this tensor in the buffer of
                            tensors[updates] (they share it; nothing is copied after a run) */
  int32_t has_index_skip; /* with index_bound: 1 = index_skip is allowed too (a label equal to an
                            ONNX loss's ignore_index) */
  int64_t index_skip;
  /* a generated initial value (init_offset is then -1), computed when the step opens:
   * init_kind is an RT_INIT_* of rt_init.h (0: none), with its parameters and seed */
  int32_t init_kind;
  double init_a, init_b;
  uint64_t init_seed;
} rt_tensor_desc;

typedef struct rt_graph {
  uint32_t abi_version;          /* NOVA_STEP_ABI_VERSION */
  const char *novac_version;
  const char *graph_hash;        /* structural hash, hex */
  int32_t ntensors;
  const rt_tensor_desc *tensors;
  int32_t nargs;
  const int32_t *arg_tensor;     /* entry argument i is the buffer of tensors[arg_tensor[i]] */
  const unsigned char *init_data;
  uint64_t init_size;
  void (*entry)(void **args);    /* runs the step */
  int32_t target;                /* RT_TARGET_CPU or RT_TARGET_CUDA */
  int32_t sm;                    /* cuda: compute capability compiled for (90 = sm_90) */
  const unsigned char *cubin;    /* cuda: the kernels, assembled by ptxas for sm */
  uint64_t cubin_size;
  const char *ptx;               /* cuda: the kernels' PTX (NUL-terminated), for other GPUs */
  uint64_t ptx_size;
  uint64_t scratch_bytes;        /* cuda: device scratch space for intermediates */
  uint64_t arena_bytes;          /* > 0: the entry takes one more argument, the planned arena of
                                    intermediates (this many bytes; cuda: the start of the scratch) */
  /* the evaluation entry of a cpu training step (NULL: none): the forward pass with the
   * current params and buffers, writing the loss and outputs, updating nothing */
  void (*eval_entry)(void **args);
  int32_t eval_nargs;
  const int32_t *eval_arg_tensor; /* eval argument i is the buffer of tensors[eval_arg_tensor[i]] */
  uint64_t eval_arena_bytes;     /* > 0: one more argument, the evaluation's own arena */
  /* a step for several sizes of one dimension (novac --dim=NAME=LO..HI; NULL dim_name: one size):
   * the buckets, ascending, the last the step's own entry above; a run of size n takes the first
   * bucket of size >= n */
  const char *dim_name;
  int64_t dim_lo, dim_hi;        /* the sizes a run may have */
  int32_t nbuckets;
  const struct rt_bucket *buckets;
  int32_t ndim_axes;
  const struct rt_dim_axis *dim_axes; /* the axes of inputs, labels and outputs that follow the size */
  int32_t dim_size_tensor;       /* the input NAME.size (i64 scalar): the run's size, set by the runtime */
} rt_graph;

/* One bucket: the step compiled for SIZE, its padded rows masked out. */
typedef struct rt_bucket {
  int64_t size;
  void (*entry)(void **args);
  int32_t nargs;
  const int32_t *arg_tensor;
  uint64_t arena_bytes;
  void (*eval_entry)(void **args); /* NULL: none */
  int32_t eval_nargs;
  const int32_t *eval_arg_tensor;
  uint64_t eval_arena_bytes;
} rt_bucket;

/* Axis AXIS of tensors[TENSOR] has A * size + C elements at size `size`;
 * in the buffer, laid out for its bucket's size, the first A * n + C are a
 * run's (n its size), the rest copies of the last of them. */
typedef struct rt_dim_axis {
  int32_t tensor, axis;
  int64_t a, c;
} rt_dim_axis;

#define RT_TARGET_CPU 0
#define RT_TARGET_CUDA 1

extern const rt_graph nova_rt_graph;

#endif
