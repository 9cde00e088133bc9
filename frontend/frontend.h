/* frontend.h: model files -> checked graph. */
#ifndef NOVA_FRONTEND_H
#define NOVA_FRONTEND_H

#include "graph.h"

/* A symbolic dimension bound on the command line (--dim=NAME=N). */
typedef struct fe_dim_binding {
  const char *name;
  int64_t value;
  bool used;
  bool ranged;     /* one of several sizes one step serves (novac --dim=NAME=LO..HI): counts over its
                      axes are computed at run time, not folded from the shapes */
} fe_dim_binding;

/* Parses the .nova text in TEXT[0..LEN) named FILE (as registered with
 * nv_diag_add_source).  Paths in file("...") initializers are relative to
 * BASEDIR.  Returns a graph, or NULL after recording diagnostics. */
nv_graph *fe_parse_text(nv_diag *d, const char *file, const char *text, size_t len,
                        const char *basedir, fe_dim_binding *dims, int ndims);

/* How --train decides what each float initializer of an ONNX model is
 * (frontend/onnx_roles.c; the rule is in novac(1), TRAINING). */
typedef struct fe_train_roles {
  const char *freeze;       /* --freeze globs (comma-separated), or NULL */
  const char *train_only;   /* --train-only globs, or NULL */
  const char *const *reach; /* names of the initializers the loss depends on through */
  int nreach;               /* differentiable ops; nreach < 0: not known (all may) */
  bool eval;                /* the graph of the evaluation entry: BatchNormalization with its
                               running statistics, no state updated */
  bool probe;               /* the first import: every float initializer a parameter (the rest
                               ignored), as a training step would build it otherwise */
} fe_train_roles;

/* Loads an ONNX model (protobuf) from PATH; tensors with external data are
 * read relative to its folder.  ROLES NULL: every float initializer nodes
 * use becomes a parameter.  With ROLES (--train) each becomes a trained
 * parameter, a buffer or a constant (compile-time known, so that folding
 * evaluates what depends on it, up to FE_FOLD_MAX_NUMEL elements; a larger
 * one is a parameter that is never trained), recorded in g->inits. */
nv_graph *fe_load_onnx(nv_diag *d, const char *path, fe_dim_binding *dims, int ndims, const fe_train_roles *roles);
/* The same from bytes in memory (the fuzzing entry); basedir for external data. */
nv_graph *fe_parse_onnx(nv_diag *d, const char *name, const uint8_t *bytes, size_t len, const char *basedir,
                        fe_dim_binding *dims, int ndims, const fe_train_roles *roles);
#define FE_FOLD_MAX_NUMEL (INT64_C(1) << 16)

#endif
