/* nova_ir.h: the nova dialect (value-semantic ops on ranked tensors) and
 * the MLIR context novac compiles in.
 *
 * The dialect is defined through IRDL, generated from the op table in
 * frontend/graph.h, so it cannot drift from it.  Ops print in generic form:
 *   %3 = "nova.matmul"(%0, %1) : (tensor<8x784xf32>, tensor<784x128xf32>) -> tensor<8x128xf32>
 * IRDL checks operand counts and attribute presence; the dtype and shape
 * rules live in frontend/graph.c (every graph is checked when built) and in
 * nova_verify(), which re-checks the IR between passes.
 */
#ifndef NOVA_IR_H
#define NOVA_IR_H

#include <mlir-c/IR.h>

#include "../frontend/graph.h"

typedef struct nova_ctx {
  MlirContext ctx;
  nv_diag *diag;
  int mlir_errors;     /* diagnostics MLIR reported through the handler */
  bool conv_gemm;      /* lower convolutions through im2col and GEMMs (a CPU with contraction kernels) */
} nova_ctx;

/* Creates a context with every upstream dialect and nova loaded, MLIR
 * diagnostics routed to d.  Returns 0 or -1 (diagnostic recorded). */
int nova_ctx_init(nova_ctx *c, nv_diag *d);
void nova_ctx_dispose(nova_ctx *c);

/* The IRDL text defining the nova dialect (owned by the caller; free). */
char *nova_dialect_irdl(void);

/* Attribute names each op carries (space separated; "" for none). */
const char *nova_op_attrs(nv_op op);

/* Builds func.func @forward(inputs..., params...) -> (outputs...) in nova
 * ops from a checked graph.  Arguments carry {nova.name, nova.role}; the
 * function carries nova.outputs (the output names). */
MlirModule nova_build_module(nova_ctx *c, const nv_graph *g);

/* Runs the MLIR verifier; 0 if the module verifies. */
int nova_verify(nova_ctx *c, MlirModule m, const char *after_stage);

/* Helpers shared by passes. */
MlirType nova_elem_type(MlirContext ctx, nova_dtype dt);
MlirType nova_tensor_type(MlirContext ctx, nova_dtype dt, int rank, const int64_t *shape);
nova_dtype nova_dtype_of(MlirType t);  /* element type of a tensor type; 0 if unsupported */
nv_op nova_op_kind(MlirOperation op);  /* NV_OP_COUNT if not a nova op */
MlirStringRef nova_str(const char *s);
/* Writes the module (or op) as text to f. */
void nova_print_op(MlirOperation op, FILE *f);

#endif
