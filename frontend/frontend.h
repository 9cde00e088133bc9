/* frontend.h: model files -> checked graph. */
#ifndef NOVA_FRONTEND_H
#define NOVA_FRONTEND_H

#include "graph.h"

/* A symbolic dimension bound on the command line (--dim=NAME=N). */
typedef struct fe_dim_binding {
  const char *name;
  int64_t value;
  bool used;
} fe_dim_binding;

/* Parses the .nova text in TEXT[0..LEN) named FILE (as registered with
 * nv_diag_add_source).  Paths in file("...") initializers are relative to
 * BASEDIR.  Returns a graph, or NULL after recording diagnostics. */
nv_graph *fe_parse_text(nv_diag *d, const char *file, const char *text, size_t len,
                        const char *basedir, fe_dim_binding *dims, int ndims);

/* Loads an ONNX model (protobuf) from PATH; tensors with external data are
 * read relative to its folder.  Float initializers become parameters unless
 * they are used only for compile-time arithmetic. */
nv_graph *fe_load_onnx(nv_diag *d, const char *path, fe_dim_binding *dims, int ndims);
/* The same from bytes in memory (the fuzzing entry); basedir for external data. */
nv_graph *fe_parse_onnx(nv_diag *d, const char *name, const uint8_t *bytes, size_t len, const char *basedir,
                        fe_dim_binding *dims, int ndims);

#endif
