/* nova/step.h: the public ABI of a step.so written by novac.
 *
 * A step.so is self-contained: the compiled step, its initial parameter values
 * and this runtime are all inside it.  Typical use:
 *
 *   nova_step *s;
 *   if (nova_step_open(&s) != NOVA_OK) { ... nova_step_error(s) ... }
 *   int64_t shape[2] = {8, 784};
 *   nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, shape, x_data);
 *   if (nova_step_run(s) != NOVA_OK) fprintf(stderr, "%s\n", nova_step_error(s));
 *   const void *y; nova_tensor_info info;
 *   nova_step_get(s, "logits", &y, &info);
 *   nova_step_close(s);
 *
 * Every function validates its arguments and returns a status; on failure
 * nova_step_error() describes what was wrong.  Nothing here aborts the process.
 *
 * Handles: a step is live from nova_step_open to nova_step_close.  A call
 * on a closed handle (or one that never came from nova_step_open) is
 * detected without reading the freed memory: it returns
 * NOVA_ERR_INVALID_HANDLE (0, "", -1 or "cpu" for the functions that
 * return a value; nova_step_error says the handle is invalid), and a second
 * nova_step_close is a no-op.  (A handle whose address a later
 * nova_step_open got again names that new step.)
 *
 * Threads: different steps may be used from different threads at once.
 * One step is used by one thread at a time: a call that reads or writes
 * its tensors (bind, run, eval, get, set_profiling) while another such call
 * runs on it returns NOVA_ERR_BUSY and changes nothing, not even the
 * message (which belongs to the call in progress).  Do not close a step
 * while another thread uses it.
 *
 * Values: bind copies any bit pattern, NaN and infinities included (an op
 * such as IsNaN takes them); a training step's "lr" must be finite and not
 * negative (NOVA_ERR_NOT_FINITE).
 *
 * Non-finite steps: a training step checks, in the same run, that its loss
 * and every element of every gradient are finite.  When one is NaN or
 * infinite, the run updates nothing (every param, opt_state and buffer,
 * adam.step included, keeps its bits) and nova_step_run returns
 * NOVA_ERR_NONFINITE, the message naming the loss or the gradients; the
 * loss, the outputs and the gradients still hold what the run computed.
 * The check is the tensor "nonfinite" (role status, bool scalar: true
 * when the run was skipped).  A caller may skip the batch and go on, as
 * PyTorch's GradScaler skips a step whose gradients overflowed.
 */
#ifndef NOVA_STEP_H
#define NOVA_STEP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version 1.  Later additions keep it, being backward compatible (a caller
 * of the old ABI works with a new step.so): NOVA_ROLE_BUFFER,
 * NOVA_ERR_NO_ENTRY, NOVA_ERR_BUSY, NOVA_ERR_INVALID_HANDLE,
 * NOVA_ERR_NOT_FINITE, NOVA_ERR_NONFINITE, NOVA_ROLE_STATUS and
 * nova_step_eval (absent from a step.so built by a novac before 0.2:
 * resolve it with dlsym and fall back). */
#define NOVA_STEP_ABI_VERSION 1
#define NOVA_MAX_RANK 8

typedef enum nova_status {
  NOVA_OK = 0,
  NOVA_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, bad index, ... */
  NOVA_ERR_NOT_FOUND = 2,        /* no tensor of that name */
  NOVA_ERR_DTYPE = 3,            /* dtype differs from the compiled one */
  NOVA_ERR_SHAPE = 4,            /* rank or shape differs from the compiled one */
  NOVA_ERR_UNBOUND = 5,          /* run() before every input was bound */
  NOVA_ERR_OUT_OF_RANGE = 6,     /* an index input holds a value outside its table */
  NOVA_ERR_NO_MEMORY = 7,
  NOVA_ERR_ROLE = 8,             /* e.g. bind() on an output */
  NOVA_ERR_ABI = 9,              /* step.so built for another ABI version */
  NOVA_ERR_DEVICE = 10,          /* the GPU failed or is missing (--target=cuda steps) */
  NOVA_ERR_NO_ENTRY = 11,        /* the step has no such entry (nova_step_eval on a forward step) */
  NOVA_ERR_BUSY = 12,            /* another thread is in a call on the same step */
  NOVA_ERR_INVALID_HANDLE = 13,  /* the step was closed, or never came from nova_step_open */
  NOVA_ERR_NOT_FINITE = 14,      /* a hyper-parameter (lr) that is NaN, infinite or negative */
  NOVA_ERR_NONFINITE = 15,       /* the loss or a gradient was NaN or infinite; params and
                                    optimizer state are unchanged (nova_step_run) */
  NOVA_ERR_COMM = 16             /* a data-parallel step could not join its launcher's world, or
                                    the ranks run different steps or parameters */
} nova_status;

/* Element types; the values are ONNX TensorProto.DataType codes. */
typedef enum nova_dtype {
  NOVA_DTYPE_F32 = 1,
  NOVA_DTYPE_U8 = 2,
  NOVA_DTYPE_I8 = 3,
  NOVA_DTYPE_U16 = 4,
  NOVA_DTYPE_I16 = 5,
  NOVA_DTYPE_I32 = 6,
  NOVA_DTYPE_I64 = 7,
  NOVA_DTYPE_BOOL = 9,
  NOVA_DTYPE_F16 = 10,   /* IEEE half, 2 bytes */
  NOVA_DTYPE_F64 = 11,
  NOVA_DTYPE_U32 = 12,
  NOVA_DTYPE_U64 = 13,
  NOVA_DTYPE_BF16 = 16   /* bfloat16 (the upper half of an f32), 2 bytes */
} nova_dtype;

typedef enum nova_role {
  NOVA_ROLE_INPUT = 0,
  NOVA_ROLE_LABEL = 1,
  NOVA_ROLE_PARAM = 2,
  NOVA_ROLE_OPT_STATE = 3,
  NOVA_ROLE_OUTPUT = 4,
  NOVA_ROLE_LOSS = 5,
  NOVA_ROLE_GRAD = 6,   /* a parameter's gradient, computed by a training step; named NAME.grad */
  NOVA_ROLE_UPDATE = 7, /* internal: a new param/opt_state/buffer value, copied over it after each run */
  NOVA_ROLE_BUFFER = 8, /* state that is not trained (BatchNormalization running statistics in
                           training mode): updated by the step, bindable, saved in checkpoints */
  NOVA_ROLE_STATUS = 9  /* a check the step computes about its own run: a training step's
                           "nonfinite" (bool scalar), read by nova_step_run */
} nova_role;

typedef struct nova_tensor_info {
  const char *name;     /* borrowed: valid until nova_step_close */
  nova_role role;
  nova_dtype dtype;
  int rank;
  const int64_t *shape; /* borrowed, rank entries */
  size_t nbytes;
  int has_default;      /* an input with a value until one is bound (a training step's lr) */
  int64_t index_bound;  /* > 0: an integer input used as an index; run() accepts only values
                           in [0, index_bound) (ONNX Gather also [-index_bound, 0)); 0: none */
} nova_tensor_info;

typedef struct nova_step nova_step;

/* Creates a step with its own buffers, parameters set to their initial
 * values.  On failure *step is NULL, except for NOVA_ERR_ABI and
 * NOVA_ERR_DEVICE (a --target=cuda step where there is no usable GPU, or
 * too little free device memory), where *step holds a step whose only use
 * is nova_step_error() and nova_step_close(). */
nova_status nova_step_open(nova_step **step);
void nova_step_close(nova_step *step);

int nova_step_num_tensors(const nova_step *step);
nova_status nova_step_tensor(const nova_step *step, int index, nova_tensor_info *info);
nova_status nova_step_find(const nova_step *step, const char *name, int *index);

/* A training step with dropout has the input "rng.seed" (i64 scalar,
 * default 0), the seed of its masks, and the buffer "rng.step", its step
 * counter (novac(1), Dropout in training mode).
 *
 * Copies data into the tensor NAME (role input, label, param, opt_state or
 * buffer: restoring a checkpoint binds the optimizer state and buffers too).  dtype, rank and
 * shape must equal the compiled ones. */
nova_status nova_step_bind(nova_step *step, const char *name, nova_dtype dtype,
                           int rank, const int64_t *shape, const void *data);

/* Runs the step once.  Fails with NOVA_ERR_UNBOUND naming the first input
 * that was never bound, or NOVA_ERR_OUT_OF_RANGE for a bad index value
 * (nothing ran); a training step returns NOVA_ERR_NONFINITE when its loss
 * or a gradient was NaN or infinite (it ran, and updated nothing). */
nova_status nova_step_run(nova_step *step);

/* Runs the evaluation entry of a training step once: the forward pass with
 * the current params and buffers, BatchNormalization with its running
 * statistics instead of the batch's, dropout off.  It writes the loss and
 * the outputs (read them with nova_step_get) and changes no param, buffer
 * or optimizer state; no gradient is computed.  Only the inputs and labels
 * the forward pass reads must be bound.  NOVA_ERR_NO_ENTRY for a step
 * without one (a forward step, a --target=cuda step, a step.so from a novac
 * before 0.2, where the symbol is absent: look it up with dlsym). */
nova_status nova_step_eval(nova_step *step);

/* Borrowed view of any tensor's current value (outputs after a run). */
nova_status nova_step_get(nova_step *step, const char *name, const void **data,
                          nova_tensor_info *info);

/* Data-parallel steps (novac --data-parallel): the number of ranks the
 * step's gradients are summed over (1 for any other step, and for a process
 * that no MPI launcher started) and, in *RANK, this process's rank.  The
 * step joins the launcher's world at nova_step_open. */
int nova_step_world(const nova_step *step, int *rank);
/* V[0..N) summed over the ranks of a data-parallel step, in place: every
 * rank must call it, with the same N (a world of one leaves V as it is). */
nova_status nova_step_all_sum(nova_step *step, double *v, int n);

/* Tracing (novarun --trace): from nova_step_trace_start on, the runtime
 * records each run, each parallel loop nest, each gradient bucket's
 * all-reduce and each wait for one.  nova_step_trace_write stops it and
 * writes the events of every rank (a data-parallel step: every rank calls
 * it; rank 0 writes) to PATH as a Chrome/Perfetto trace (JSON; PATH NULL:
 * none), and fills *SUMMARY (may be NULL): milliseconds per rank, over the
 * traced runs. */
typedef struct nova_trace_summary {
  int steps;                    /* traced runs */
  double step_ms;               /* their time (rank 0) */
  double allreduce_ms;          /* the all-reduces' time, from the bucket's last gradient to its sum */
  double waited_ms;             /* the compute track's time waiting for sums (the rest was hidden) */
  double allreduce_ms_but_last; /* both without each run's last bucket */
  double waited_ms_but_last;
  int dropped;                  /* events not kept (the buffer holds 65536) */
} nova_trace_summary;
nova_status nova_step_trace_start(nova_step *step);
nova_status nova_step_trace_write(nova_step *step, const char *path, nova_trace_summary *summary);

/* The structural hash of the graph the step was compiled from (hex, as in
 * the manifest's graph_hash); "" if unknown.  Borrowed. */
const char *nova_step_graph_hash(const nova_step *step);

/* Milliseconds the last run() took on its device: measured with CUDA events
 * around the step's kernels (--target=cuda), or the wall-clock time of the
 * compiled code (cpu); -1 before the first successful run. */
double nova_step_last_run_ms(const nova_step *step);

/* Per-kernel timing (--target=cuda steps): with profiling on, each run
 * records a CUDA event pair around every kernel launch (which adds a little
 * time to the run).  nova_step_num_launches gives the launches of the last
 * run (0 with profiling off, and always for cpu steps); launch I's kernel
 * name (borrowed) and milliseconds come from nova_step_launch. */
nova_status nova_step_set_profiling(nova_step *step, int on);
int nova_step_num_launches(const nova_step *step);
nova_status nova_step_launch(const nova_step *step, int index, const char **kernel, double *ms);

/* A step compiled for several sizes of one dimension (novac
 * --dim=NAME=LO..HI or NAME=A,B,C): the number of its buckets, the
 * dimension's name (*DIM, borrowed), the sizes a run may have (*LO to
 * *HI) and the bucket sizes (*BUCKETS, borrowed, ascending); 0 for a step
 * of one size (then nothing is written).  Any pointer may be NULL.
 *
 * Such a step's inputs, labels and outputs with an axis of the dimension
 * take any size in [LO, HI] along it: bind gives each its size (every one
 * bound for a run must have the same), run computes with the first bucket
 * that holds it, as a step compiled for exactly that size would (its padded
 * rows count in no loss, mean, statistic or gradient), and the outputs'
 * shapes (nova_step_get, nova_step_tensor) are then that size's.  Before
 * the first bind, nova_step_tensor gives the shapes at HI.  The input
 * NAME.size is set by the step (bind refuses it).  Absent from older
 * step.so files, as nova_step_set_size: look them up with dlsym. */
int nova_step_sizes(const nova_step *step, const char **dim, int64_t *lo, int64_t *hi, const int64_t **buckets);
/* For such a step: the size the tensors not bound since report in
 * nova_step_tensor (a caller that sizes its buffers from them, as novarun
 * --dim does); NOVA_ERR_SHAPE outside [LO, HI], NOVA_ERR_INVALID_ARGUMENT
 * for a step of one size. */
nova_status nova_step_set_size(nova_step *step, int64_t size);

/* The target the step was compiled for: "cpu" or "cuda". */
const char *nova_step_target(const nova_step *step);

/* The last error's message; "" after success.  Borrowed. */
const char *nova_step_error(const nova_step *step);

const char *nova_dtype_name(nova_dtype dtype);       /* "f32", ...; "?" if unknown */
size_t nova_dtype_size(nova_dtype dtype);            /* bytes, 0 if unknown */
const char *nova_role_name(nova_role role);          /* "input", ... */

#ifdef __cplusplus
}
#endif
#endif
