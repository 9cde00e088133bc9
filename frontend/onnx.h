/* onnx.h: the ONNX importer's internals, shared by the loader (onnx.c), the
 * compile-time evaluator of constant subgraphs (onnx_fold.c) and the
 * per-operator converters (onnx_ops.c).
 *
 * Every ONNX tensor value is either a graph node (computed by the step) or a
 * host tensor known at compile time (initializers that are not parameters,
 * Constant nodes, and everything computed from known values only: the
 * Shape -> Gather -> Unsqueeze -> Concat -> Reshape arithmetic exporters
 * write).  Known values are folded on the host and become graph constants
 * only where a computed op needs them.  An ONNX sequence is a list of such
 * tensor values whose length is known at compile time (onnx_seq.c): it never
 * reaches the step.
 */
#ifndef NOVA_ONNX_H
#define NOVA_ONNX_H

#include "../support/util.h"
#include "frontend.h"
#include "onnx.pb-c.h"

typedef struct ox_tensor { /* a value known at compile time (owned data) */
  nova_dtype dt;
  int rank;
  int64_t shape[NOVA_MAX_RANK];
  void *data;
} ox_tensor;

typedef struct ox_seq ox_seq;

typedef struct ox_val {
  nv_node *node;   /* computed by the step, or */
  ox_tensor *k;    /* known now (owned by the value table), or */
  ox_seq *seq;     /* a sequence of tensor values (owned by the value table) */
  bool present;    /* false for an omitted optional input ("") */
} ox_val;

/* An ONNX sequence: its length and each element's shape are known at
 * compile time.  Elements are tensor values (node or k, never seq), each
 * owned by the sequence; dt is the element type (an empty one has it too). */
struct ox_seq {
  nova_dtype dt;
  int n, cap;
  ox_val *v;
};

typedef struct ox_ctx {
  nv_diag *d;
  nv_graph *g;
  const char *file;           /* the model's path, interned */
  int64_t opset;              /* of the default domain */
  const Onnx__NodeProto *node;/* being converted */
  nv_loc loc;                 /* "model.onnx: node 'X' (Op)" */
  fe_dim_binding *dims;
  int ndims;
  int depth;                  /* If branches being imported */
  nv_strmap used;             /* the names the main graph's nodes and outputs read */
  nv_strmap inits;            /* g->inits: name -> index */
} ox_ctx;

/* ---- known tensors (onnx.c) ---- */
/* The most bytes ConstantOfShape and Range materialize: the most a constant
 * may embed in the IR (NV_MAX_CONST_BYTES in to_nova.c). */
#define OX_MAX_FILL_BYTES (INT64_C(256) << 20)
ox_tensor *ox_tensor_new(nova_dtype dt, int rank, const int64_t *shape);
void ox_tensor_free(ox_tensor *t);
int64_t ox_numel(const ox_tensor *t);
/* Element i as int64 / double, whatever the dtype. */
int64_t ox_geti(const ox_tensor *t, int64_t i);
int64_t ox_f2i(double v); /* truncated, saturating, NaN 0: no undefined conversion */
double ox_getf(const ox_tensor *t, int64_t i);
void ox_set(ox_tensor *t, int64_t i, double f, int64_t v); /* v for integer dtypes, f for floats */

/* A TensorProto attribute as a known tensor (NULL after a diagnostic). */
ox_tensor *ox_decode_tensor(ox_ctx *x, const Onnx__TensorProto *tp);

/* Adds to USED (value 1) every name that a node of GR (or of its If/Scan
 * subgraphs) or a graph output reads; 0, or -1 out of memory. */
int ox_used_names(const Onnx__GraphProto *gr, nv_strmap *used);

/* ---- errors ---- */
/* Records "model.onnx: node 'X' (Op): error: ..." and returns -1. */
int ox_err(ox_ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Limits on a model's protobuf, checked before it is unpacked (onnx_wire.c):
 * messages nested FE_ONNX_MAX_DEPTH deep at most (the ModelProto is level
 * 1; a subgraph of an If or Loop adds 3 levels (AttributeProto, GraphProto,
 * NodeProto), a sequence or map type 2, so this leaves room for ~20 levels
 * of subgraphs; protobuf-c's unpack recurses once per level with no limit
 * of its own), and FE_ONNX_MAX_BYTES bytes (protobuf's 2 GiB limit on a
 * message).  0, or -1 with the reason in WHY. */
#define FE_ONNX_MAX_DEPTH 64
#define FE_ONNX_MAX_BYTES ((size_t)INT32_MAX)
int fe_onnx_check_wire(const uint8_t *bytes, size_t len, char *why, size_t whylen);

/* ---- attributes of the current node ---- */
const Onnx__AttributeProto *ox_attr(ox_ctx *x, const char *name);
int64_t ox_attr_i(ox_ctx *x, const char *name, int64_t dflt);
double ox_attr_f(ox_ctx *x, const char *name, double dflt);
/* Copies up to max ints; returns the count, or -1 if absent. */
int ox_attr_ints(ox_ctx *x, const char *name, int64_t *out, int max);
const char *ox_attr_s(ox_ctx *x, const char *name, const char *dflt, char *buf, size_t n);

/* ---- values ---- */
/* The node computing v, making a graph constant of a known value. */
nv_node *ox_node(ox_ctx *x, ox_val v);
/* A new graph node (NULL after a diagnostic, which names the ONNX node). */
nv_node *ox_add(ox_ctx *x, nv_op op, int nin, nv_node **in, const nv_node *attrs);
/* A known tensor's int64 values (shape, axes, ...), with a clear error if
 * the input is computed at run time. Returns the count or -1. */
int ox_const_ints(ox_ctx *x, ox_val v, const char *what, int64_t *out, int max);
nova_dtype ox_dtype_of_onnx(int32_t onnx_type); /* 0 if unsupported */
const char *ox_onnx_type_name(int32_t onnx_type); /* "float16", ... */
int ox_val_rank(ox_val v);
const int64_t *ox_val_shape(ox_val v);

/* ---- sequences (onnx_seq.c) ---- */
ox_seq *ox_seq_create(nova_dtype dt);
void ox_seq_destroy(ox_seq *s);
/* Frees what v owns (its known tensor or sequence) and clears those fields. */
void ox_val_free(ox_val *v);
/* *out = a copy of v that the caller owns (known tensors and sequences
 * copied, nodes shared); -1 when memory runs out. */
int ox_val_copy(ox_val v, ox_val *out);
/* Whether op takes sequence operands (the sequence operators, Identity). */
bool ox_takes_seq(const char *op);
/* -1 after "input I ('NAME') is a sequence ..." if one of in[0..nin) is a
 * sequence: every operator but those of ox_takes_seq takes tensors only. */
int ox_tensors_only(ox_ctx *x, const ox_val *in, int nin);
/* T as "tensor(float)", "seq(tensor(int64))", "map(int64,tensor(float))", ... */
const char *ox_type_str(const Onnx__TypeProto *t, char *buf, size_t n);

/* ---- initializer roles with --train (onnx_roles.c) ---- */
/* Fills x->g->inits from the model and R (see onnx_roles.c for the rule);
 * -1 after a diagnostic (a --freeze or --train-only pattern that matches
 * no initializer). */
int ox_roles_decide(ox_ctx *x, const Onnx__ModelProto *m, const fe_train_roles *r);
/* What --train made of initializer NAME; NULL without --train. */
const nv_initializer *ox_init_role(const ox_ctx *x, const char *name);
/* If BUFFER is a buffer of the step (a param node of role buffer), makes
 * VALUE its new value after each step (an output of role update).  0 when
 * done or not a buffer, -1 after a diagnostic. */
int ox_state_update(ox_ctx *x, ox_val buffer, nv_node *value);
/* The factor on the batch variance in a BatchNormalization's new running
 * variance, for input A (N, C, ...) of n = numel / C values per channel:
 * with --train PyTorch's unbiased variance, n / (n - 1); otherwise 1, the
 * population variance the ONNX operator defines. */
double ox_running_var_scale(const ox_ctx *x, const nv_node *a);
/* Dropout in training mode under --train: nova.dropout of A with RATIO,
 * keyed by the step's input rng.seed (i64, default 0) and its buffer
 * rng.step (i64, 0 at first, one more after each step), on a stream of its
 * own (the number of dropouts before it).  NULL after a diagnostic. */
nv_node *ox_dropout(ox_ctx *x, nv_node *a, double ratio);

/* ---- conversion (onnx_ops.c) ---- */
typedef int (*ox_conv_fn)(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout);
typedef struct ox_op_entry {
  const char *name;
  ox_conv_fn fn;
} ox_op_entry;
/* Converters by op family: onnx_math.c (elementwise, activations, logic,
 * reductions), onnx_index.c (indexing, padding, tiling), onnx_nn.c
 * (attention, rotary embeddings, normalizations, space/depth moves),
 * onnx_resize.c (Resize, Upsample), onnx_einsum.c (Einsum), onnx_rnn.c (RNN,
 * GRU, LSTM), onnx_dft.c (DFT), onnx_seq.c (the sequence operators),
 * onnx_qlinear.c (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv). */
extern const ox_op_entry ox_math_ops[], ox_index_ops[], ox_nn_ops[], ox_resize_ops[], ox_einsum_ops[], ox_rnn_ops[],
    ox_dft_ops[], ox_seq_ops[], ox_qlinear_ops[];
extern const size_t ox_math_nops, ox_index_nops, ox_nn_nops, ox_resize_nops, ox_einsum_nops, ox_rnn_nops, ox_dft_nops,
    ox_seq_nops, ox_qlinear_nops;

/* Helpers the converters share (each returns NULL/-1 after a diagnostic). */
int ox_need(ox_ctx *x, ox_val *in, int nin, int min, int max); /* input count; the first min present */
int ox_set_out(ox_val *out, nv_node *n);                        /* out[0] = n; -1 if n is NULL */
int ox_known(ox_val *out, ox_tensor *t);                        /* out[0] = the known t (owned) */
nv_node *ox_N(ox_ctx *x, ox_val v);
nv_node *ox_op1(ox_ctx *x, nv_op op, nv_node *a);
nv_node *ox_op2(ox_ctx *x, nv_op op, nv_node *a, nv_node *b);
nv_node *ox_op3(ox_ctx *x, nv_op op, nv_node *a, nv_node *b, nv_node *c);
nv_node *ox_scalar(ox_ctx *x, nova_dtype dt, double v);         /* a rank-0 constant */
nv_node *ox_reshape(ox_ctx *x, nv_node *a, int rank, const int64_t *shape);
nv_node *ox_transpose(ox_ctx *x, nv_node *a, const int64_t *perm);
nv_node *ox_broadcast_to(ox_ctx *x, nv_node *a, int rank, const int64_t *shape);
nv_node *ox_reduce(ox_ctx *x, nv_op op, nv_node *a, int naxes, const int64_t *axes, bool keep);
nv_node *ox_slice1(ox_ctx *x, nv_node *a, int64_t axis, int64_t start, int64_t end, int64_t step);
int ox_norm_axis(ox_ctx *x, int64_t *axis, int rank);
/* a [d0..dr) as [d0 * .. * d(axis-1), d(axis) * ..], axis then 1 (opset < 13 Softmax, Hardmax). */
nv_node *ox_coerce_2d(ox_ctx *x, nv_node *a, int64_t *axis);
/* ONNX MatMul of a and b (numpy semantics: 1-D operands promoted, batch
 * dims broadcast; onnx_ops.c). */
nv_node *ox_matmul(ox_ctx *x, nv_node *a, nv_node *b);
/* The Conv converter: in[0] convolved with in[1] (plus the bias in[2]) by
 * the current node's Conv attributes (onnx_ops.c). */
int ox_conv(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout);
/* a gathered along axis at the known positions v[0..n) (onnx_index.c). */
nv_node *ox_pick(ox_ctx *x, nv_node *a, int64_t axis, const int64_t *v, int64_t n);
/* a with `before` and `after` zeros added along axis (onnx_index.c). */
nv_node *ox_zero_pad(ox_ctx *x, nv_node *a, int64_t axis, int64_t before, int64_t after);
/* A float initializer's initial value where an operand must be known (owned copy or NULL). */
ox_tensor *ox_initial_value(ox_val v);
/* Reductions' axes: the input from opset `from` on, else the attribute.
 * Returns the count (0: all, unless noop_with_empty_axes) or -1. */
int ox_reduce_axes(ox_ctx *x, ox_val *in, int nin, int64_t from, int64_t *axes);
/* Converts the current node: in[nin] -> out[nout] (out[i].present set for
 * each output produced).  Folds on the host when every input is known and
 * the op can be evaluated (onnx_fold.c). */
int ox_convert(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout);
/* Host evaluation: 1 if folded into out, 0 if this op/input can't be
 * folded, -1 after an error. */
int ox_fold(ox_ctx *x, const char *op, ox_val *in, int nin, ox_val *out, int nout);
/* Evaluates the outputs of the current node, converted into graph nodes
 * from `mark` on over constant leaves only (onnx_eval.c): 1 if every output
 * is now known (the nodes may then be dropped), 0 if one could not be. */
int ox_eval_known(ox_ctx *x, int mark, ox_val *out, int nout);
/* out = the known in[0] under a new shape (same element count). */
int ox_fold_reshape(ox_val *in, int rank, const int64_t *shape, ox_val *out);

#endif
