/* graph.h: the frontend's graph, from which the nova IR is built.
 *
 * A graph is what a model file says, checked: every node has a dtype and a
 * static shape, computed and verified when the node is made (fe_graph_add),
 * so that every shape error points at the user's source.  Nodes are kept in
 * topological order (a node's inputs precede it).
 */
#ifndef NOVA_GRAPH_H
#define NOVA_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "../support/diag.h"
#include "nova/step.h"

/* The op list.  X(ENUM, "name", min operands, max operands (-1: any)).
 * concat is binary (IRDL binds one type to all operands of a variadic), so
 * the text format's n-ary concat(a, b, c) becomes concat(concat(a, b), c).
 * Everything that switches on nv_op keeps in step with this table
 * (static_assert on NV_OP_COUNT). */
#define NV_OPS(X)                         \
  X(INPUT, "input", 0, 0)                 \
  X(PARAM, "param", 0, 0)                 \
  X(CONSTANT, "constant", 0, 0)           \
  X(ADD, "add", 2, 2)                     \
  X(SUB, "sub", 2, 2)                     \
  X(MUL, "mul", 2, 2)                     \
  X(DIV, "div", 2, 2)                     \
  X(NEG, "neg", 1, 1)                     \
  X(EXP, "exp", 1, 1)                     \
  X(LOG, "log", 1, 1)                     \
  X(SQRT, "sqrt", 1, 1)                   \
  X(TANH, "tanh", 1, 1)                   \
  X(SIGMOID, "sigmoid", 1, 1)             \
  X(RELU, "relu", 1, 1)                   \
  X(GELU, "gelu", 1, 1)                   \
  X(MATMUL, "matmul", 2, 2)               \
  X(SOFTMAX, "softmax", 1, 1)             \
  X(LOG_SOFTMAX, "log_softmax", 1, 1)     \
  X(LAYER_NORM, "layer_norm", 3, 3)       \
  X(REDUCE_SUM, "reduce_sum", 1, 1)       \
  X(REDUCE_MEAN, "reduce_mean", 1, 1)     \
  X(REDUCE_MAX, "reduce_max", 1, 1)       \
  X(RESHAPE, "reshape", 1, 1)             \
  X(TRANSPOSE, "transpose", 1, 1)         \
  X(BROADCAST, "broadcast", 1, 1)         \
  X(CONCAT, "concat", 2, 2)               \
  X(SLICE, "slice", 1, 1)                 \
  X(GATHER, "gather", 2, 2)               \
  X(CROSS_ENTROPY, "cross_entropy", 2, 2) \
  X(POW, "pow", 2, 2)                     \
  X(ABS, "abs", 1, 1)                     \
  X(ERF, "erf", 1, 1)                     \
  X(MINIMUM, "minimum", 2, 2)             \
  X(MAXIMUM, "maximum", 2, 2)             \
  X(WHERE, "where", 3, 3)                 \
  X(EQUAL, "equal", 2, 2)                 \
  X(LESS, "less", 2, 2)                   \
  X(GREATER, "greater", 2, 2)             \
  X(CAST, "cast", 1, 1)                   \
  X(CONV, "conv", 2, 2)                   \
  X(MAX_POOL, "max_pool", 1, 1)           \
  X(AVG_POOL, "avg_pool", 1, 1)           \
  X(CONV_GRAD_INPUT, "conv_grad_input", 2, 2)   \
  X(CONV_GRAD_WEIGHT, "conv_grad_weight", 2, 2) \
  X(MAX_POOL_GRAD, "max_pool_grad", 3, 3)       \
  X(AVG_POOL_GRAD, "avg_pool_grad", 1, 1)       \
  X(MAX_POOL_INDICES, "max_pool_indices", 2, 2)  \
  X(SIN, "sin", 1, 1)                     \
  X(COS, "cos", 1, 1)                     \
  X(TAN, "tan", 1, 1)                     \
  X(ASIN, "asin", 1, 1)                   \
  X(ACOS, "acos", 1, 1)                   \
  X(ATAN, "atan", 1, 1)                   \
  X(SINH, "sinh", 1, 1)                   \
  X(COSH, "cosh", 1, 1)                   \
  X(ASINH, "asinh", 1, 1)                 \
  X(ACOSH, "acosh", 1, 1)                 \
  X(ATANH, "atanh", 1, 1)                 \
  X(FLOOR, "floor", 1, 1)                 \
  X(CEIL, "ceil", 1, 1)                   \
  X(ROUND, "round", 1, 1)                 \
  X(SIGN, "sign", 1, 1)                   \
  X(ISNAN, "isnan", 1, 1)                 \
  X(ISINF, "isinf", 1, 1)                 \
  X(NOT, "not", 1, 1)                     \
  X(AND, "and", 2, 2)                     \
  X(OR, "or", 2, 2)                       \
  X(XOR, "xor", 2, 2)                     \
  X(LESS_EQUAL, "less_equal", 2, 2)       \
  X(GREATER_EQUAL, "greater_equal", 2, 2) \
  X(MOD, "mod", 2, 2)                     \
  X(FMOD, "fmod", 2, 2)                   \
  X(REDUCE_MIN, "reduce_min", 1, 1)       \
  X(REDUCE_PROD, "reduce_prod", 1, 1)     \
  X(GATHER_ELEMENTS, "gather_elements", 2, 2)   \
  X(SCATTER_ELEMENTS, "scatter_elements", 3, 3) \
  X(GATHER_ND, "gather_nd", 2, 2)               \
  X(SCATTER_ND, "scatter_nd", 3, 3)             \
  X(CUMSUM, "cumsum", 1, 1)                     \
  X(DROPOUT, "dropout", 3, 3)                   \
  X(STOCHASTIC_ROUND, "stochastic_round", 3, 3) \
  X(SHL, "shl", 2, 2)                           \
  X(SHR, "shr", 2, 2)                           \
  X(ATTENTION, "attention", 4, 4)             \
  X(RMS_NORM, "rms_norm", 2, 2)                 \
  X(ROTARY, "rotary", 3, 3)                     \
  X(ALL_REDUCE, "all_reduce", 1, 1)             \
  X(REDUCE_SCATTER, "reduce_scatter", 1, 1)     \
  X(ALL_GATHER, "all_gather", 1, 1)             \
  X(SHARD, "shard", 1, 1)

/* How scatter_elements / scatter_nd combine an update with the value there. */
enum { NV_SCATTER_NONE, NV_SCATTER_ADD, NV_SCATTER_MUL, NV_SCATTER_MAX, NV_SCATTER_MIN };
/* cumsum: exclusive (the element itself not included), reverse (from the end),
 * product (running products: ONNX CumProd). */
enum { NV_CUMSUM_EXCLUSIVE = 1, NV_CUMSUM_REVERSE = 2, NV_CUMSUM_PRODUCT = 4 };

typedef enum nv_op {
#define X(e, n, a, b) NV_OP_##e,
  NV_OPS(X)
#undef X
  NV_OP_COUNT
} nv_op;

const char *nv_op_name(nv_op op);
/* NV_OP_COUNT if NAME is no op; only ops callable from the text format. */
nv_op nv_op_lookup(const char *name);
int nv_op_min_inputs(nv_op op);
int nv_op_max_inputs(nv_op op);

/* How a parameter gets its initial value (computed at compile time). */
typedef enum nv_init_kind {
  NV_INIT_ZEROS, NV_INIT_ONES, NV_INIT_CONST, NV_INIT_NORMAL, NV_INIT_UNIFORM,
  NV_INIT_HE, NV_INIT_XAVIER, NV_INIT_FILE, NV_INIT_DATA, NV_INIT_CAUSAL
} nv_init_kind;

typedef struct nv_init {
  nv_init_kind kind;
  double a, b;        /* CONST: a; NORMAL: std a; UNIFORM: [a, b); CAUSAL: a above the diagonal */
  char *path;         /* FILE: resolved path (owned) */
  void *data;         /* DATA: raw bytes (owned), e.g. from an ONNX initializer */
} nv_init;

typedef struct nv_node nv_node;
struct nv_node {
  nv_op op;
  int id;               /* index in graph->nodes */
  nv_loc loc;
  char *name;           /* inputs, params, named values (owned); may be NULL */
  int nin;
  nv_node **in;         /* owned array, borrowed nodes */
  nova_dtype dtype;
  int rank;
  int64_t shape[NOVA_MAX_RANK];
  /* attributes (which are meaningful depends on op) */
  int64_t axis;         /* softmax, log_softmax, concat, slice, gather; all_reduce, reduce_scatter,
                           all_gather: its bucket */
  int nlist;            /* axes (reductions), perm, target shape */
  int64_t list[NOVA_MAX_RANK];
  bool keepdims;
  int64_t start, end, step;  /* slice */
  double eps;           /* layer_norm, rms_norm */
  double scale, softcap; /* attention: the scores' factor; softcap > 0: cap * tanh(s / cap) */
  double value;         /* constant (scalar, broadcast to shape); dropout: the ratio */
  nova_dtype to;        /* cast */
  bool allow_empty;     /* set from the graph: a 0 dimension is not an error */
  /* conv and pools: nspatial = rank - 2 spatial dims (1 to 3) */
  int nspatial;
  int64_t kernel[3], strides[3], dilations[3], pads[6]; /* pads: begins, then ends */
  int64_t groups;       /* conv */
  bool count_include_pad, ceil_mode; /* avg_pool; ceil_mode: pools */
  bool col_major;       /* max_pool_indices: ONNX storage_order 1 */
  int64_t mode;         /* scatter_*: an NV_SCATTER_* combiner; cumsum: NV_CUMSUM_* bits;
                           rotary: 1 interleaved pairs (2i, 2i+1), 0 halves (i, i + D/2);
                           reduce_scatter, all_gather, shard: the number of ranks */
  /* inputs, params and constants (constants: init gives the value) */
  nova_role role;       /* params: NOVA_ROLE_PARAM, NOVA_ROLE_OPT_STATE or NOVA_ROLE_BUFFER */
  bool frozen;          /* params: never trained (an ONNX initializer --train classified constant) */
  bool has_default;     /* inputs: init gives a value used until one is bound (lr) */
  int64_t index_bound;  /* integer inputs used as indices: values must lie in [0, bound) */
  bool has_index_skip;  /* inputs: index_skip is allowed besides [0, bound) (a loss's ignore_index) */
  int64_t index_skip;
  bool index_negative;  /* inputs: every index use also allows [-bound, 0) (ONNX Gather);
                           gather: its indices may count from the end */
  nv_init init;
  int recompute;        /* ad_recompute's copy of a forward value: a tag unique in the step (0: none) */
};

typedef struct nv_output {
  char *name;
  nv_node *node;
  nv_loc loc;
  nova_role role;       /* output, loss, grad or update */
  const nv_node *updates; /* role update: the param or opt_state it replaces */
} nv_output;

/* What --train made of one ONNX initializer (frontend/onnx_roles.c), for
 * the manifest. */
typedef enum nv_init_role { NV_IROLE_PARAM, NV_IROLE_BUFFER, NV_IROLE_CONSTANT } nv_init_role;
typedef struct nv_initializer {
  char *name;           /* owned */
  nv_init_role role;
  bool folded;          /* a compile-time constant (else a tensor of the step) */
  char *reason;         /* owned: the rule that decided */
} nv_initializer;

typedef struct nv_graph {
  int nnodes, capnodes;
  nv_node **nodes;
  int noutputs, capoutputs;
  nv_output *outputs;
  uint64_t seed;        /* parameter initialisation */
  bool train;           /* a training step (autodiff ran): entry @train_step */
  bool allow_empty;     /* dimensions may be 0 (ONNX models); the .nova format wants them positive */
  bool eval;            /* built for a training step's evaluation entry (no batch statistics) */
  char precision[8];    /* fp32, bf16, fp16, tf32: the .nova 'precision' statement, then what
                           novac compiled with ("": not given, fp32) */
  double loss_scale;    /* dynamic loss scaling's initial scale (0: none), set by autodiff */
  int64_t loss_scale_window; /* clean steps after which the scale doubles */
  int nforward;         /* set by autodiff: nodes[0..nforward) are the forward's */
  struct nv_node *update_from; /* --nonfinite=skip-param: the first node after the backward pass (the
                           checks and updates that ad_schedule_updates moves up), else NULL */
  struct nv_recompute_stats { /* ad_recompute: the forward values the backward reads */
    bool done;          /* ad_recompute ran */
    int values;         /* copies made in the backward */
    int64_t saved_before, saved_after; /* bytes of those it read before, and keeps now */
    int heavy;          /* forward values recomputed that are no cheap op (matmuls, ...) */
    int segments;       /* the forward's segments (1: not cut) */
    int segments_recomputed; /* those whose expensive values may be recomputed (the first ones) */
    double flops;       /* the copies' arithmetic */
  } recompute;
  struct nv_comm {      /* --data-parallel (passes/comm.c): the gradient all-reduces' buckets */
    int64_t bucket_bytes;
    int nbuckets;
    struct nv_bucket {
      int64_t bytes;     /* of the values it reduces (all-gather: of this rank's shares) */
      int tensors;
      nv_op kind;        /* NV_OP_ALL_REDUCE, NV_OP_REDUCE_SCATTER or NV_OP_ALL_GATHER */
      int world;         /* reduce-scatter, all-gather: the ranks (--world-size) */
      int after, before; /* it starts after node `after` (its last gradient), ends before node `before` */
      const char *first_read; /* the param whose summed gradient node `before` reads (borrowed) */
    } *buckets;         /* owned */
  } comm;
  int ninits;           /* ONNX with --train: every initializer nodes use, in file order */
  nv_initializer *inits;
} nv_graph;

nv_graph *fe_graph_create(void);
void fe_graph_destroy(nv_graph *g);

/* Makes a node of OP over IN (copied), with attributes taken from ATTRS
 * (op, nin and in are ignored in it), infers its dtype and shape and checks
 * them.  On a mistake records a diagnostic at LOC and returns NULL. */
nv_node *fe_graph_add(nv_graph *g, nv_diag *d, nv_op op, int nin, nv_node **in,
                      const nv_node *attrs, nv_loc loc);
/* Inputs and params: a leaf with a given dtype and shape. */
nv_node *fe_graph_leaf(nv_graph *g, nv_diag *d, nv_op op, const char *name, nova_dtype dt,
                       int rank, const int64_t *shape, nv_loc loc);
int fe_graph_add_output(nv_graph *g, nv_diag *d, const char *name, nv_node *n, nv_loc loc);
/* The step's Philox state (dropout, stochastic rounding): the input
 * rng.seed (i64, default 0) and the buffer rng.step (i64, zeros, frozen),
 * found in G or made at LOC.  1 when made (the caller adds rng.step's
 * update: one more each step), 0 when found, -1 after a diagnostic. */
int fe_rng_state(nv_graph *g, nv_diag *d, nv_loc loc, nv_node **seed, nv_node **step);
/* Class labels of an ONNX loss: the inputs they come from (through
 * data-movement ops) are checked by the step to lie in [0, classes) or to
 * equal ignore_index (when has_ii); constant labels are checked now.
 * Returns 0, or -1 after a diagnostic at loc.  Labels computed otherwise
 * are not checked (the one-hot selection reads no memory out of range). */
int fe_mark_labels(nv_diag *d, nv_node *labels, int64_t classes, bool has_ii, int64_t ii, nv_loc loc);
/* Puts G's nodes in ORDER (a permutation of them, every node after its
 * operands) and renumbers their ids to match. */
void fe_graph_set_order(nv_graph *g, nv_node *const *order);
/* Drops the nodes made from `mark` on (nothing before them may use them). */
void fe_graph_truncate(nv_graph *g, int mark);
/* A training graph's state before passes that rewire operands, add nodes
 * and reorder (ad_recompute, ad_schedule_updates), to try them and go
 * back: fe_graph_save fills S (0, or -1 when out of memory);
 * fe_graph_restore puts G back as it was and frees S's arrays (the
 * nodes made since are dropped). */
typedef struct nv_graph_state {
  int nnodes, nforward;
  nv_node **order, **in;   /* the nodes in order; every node's operands, in that order */
  nv_node *update_from;
  struct nv_recompute_stats recompute;
} nv_graph_state;
int fe_graph_save(const nv_graph *g, nv_graph_state *s);
void fe_graph_restore(nv_graph *g, nv_graph_state *s);

/* Data-movement nodes for importers and passes: x itself when nothing
 * changes, NULL if x is NULL or after a diagnostic. */
nv_node *fe_reshape(nv_graph *g, nv_diag *d, nv_node *x, int rank, const int64_t *shape, nv_loc loc);
nv_node *fe_broadcast(nv_graph *g, nv_diag *d, nv_node *x, int rank, const int64_t *shape, nv_loc loc);
nv_node *fe_transpose(nv_graph *g, nv_diag *d, nv_node *x, const int64_t *perm, nv_loc loc);
nv_node *fe_reduce(nv_graph *g, nv_diag *d, nv_op op, nv_node *x, int naxes, const int64_t *axes, bool keep,
                   nv_loc loc);

int64_t fe_numel(const nv_node *n);
const char *fe_dtype_name(nova_dtype dt);  /* "f32", ... */
size_t fe_dtype_size(nova_dtype dt);
/* Parses "f32" etc.; returns 0 if unknown. */
nova_dtype fe_dtype_parse(const char *s);
bool fe_dtype_is_float(nova_dtype dt);    /* f32, f64, f16, bf16 */
bool fe_dtype_is_half(nova_dtype dt);     /* f16, bf16 (computed in f32 by the CPU lowering) */
bool fe_dtype_is_int(nova_dtype dt);      /* every integer dtype, signed and unsigned (not bool) */
bool fe_dtype_is_unsigned(nova_dtype dt); /* u8, u16, u32, u64 */
bool fe_dtype_is_index(nova_dtype dt);    /* i32, i64: what indices may be */
/* The bits of the f16 or bf16 (dt) nearest to v (ties to even; NaN stays
 * NaN, beyond the largest finite value: inf), and back. */
uint16_t fe_half_from_double(nova_dtype dt, double v);
double fe_half_to_double(nova_dtype dt, uint16_t h);
/* "[8,784]" into buf. */
const char *fe_shape_str(char *buf, size_t size, int rank, const int64_t *shape);
/* Largest element count a tensor may have (keeps sizes far from overflow). */
#define NV_MAX_NUMEL (INT64_C(1) << 34)

/* Fills the initial value of a param (dtype from n) into out (fe_numel(n)
 * elements).  Returns 0, or -1 with a diagnostic at the param. */
int fe_init_fill(const nv_graph *g, nv_diag *d, const nv_node *n, void *out);
/* N's generated initial value as an RT_INIT_* kind (runtime/rt_init.h)
 * with its parameters *A, *B; RT_INIT_NONE for zeros, a file or data. */
int fe_init_recipe(const nv_node *n, double *a, double *b);
/* Whether N's initial value is bytes (a file, an ONNX initializer), which a
 * step.so embeds, rather than generated when it opens. */
bool fe_init_is_bytes(const nv_node *n);

#endif
