/* to_nova.c: a checked graph -> func.func @forward in nova ops.
 *
 * Signature: inputs and labels (declaration order), then params, each with
 * {nova.name, nova.role}; results are the outputs in declaration order.
 * Every op carries its source location (file:line:col, or the ONNX node
 * name), so later errors point at the model.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "../passes/nova_ir.h"

/* Constants live in the IR as dense attributes; larger data belongs in params. */
#define NV_MAX_CONST_BYTES (256 << 20)

static MlirLocation loc_of(MlirContext ctx, nv_loc l) {
  if (!l.file) return mlirLocationUnknownGet(ctx);
  return mlirLocationFileLineColGet(ctx, nova_str(l.file), (unsigned)l.line, (unsigned)l.col);
}

static MlirNamedAttribute named(MlirContext ctx, const char *name, MlirAttribute a) {
  return mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str(name)), a);
}

static MlirAttribute i64_attr(MlirContext ctx, int64_t v) {
  return mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), v);
}

/* A constant's value: a splat, or every element from its initializer.
 * Integers and f16/bf16 are given as their little-endian bits (raw buffer). */
static MlirAttribute constant_value(MlirContext ctx, const nv_graph *g, nv_diag *d, const nv_node *n) {
  MlirType t = nova_tensor_type(ctx, n->dtype, n->rank, n->shape), et = nova_elem_type(ctx, n->dtype);
  bool f64 = n->dtype == NOVA_DTYPE_F64, half = fe_dtype_is_half(n->dtype);
  size_t es = fe_dtype_size(n->dtype);
  nv_init_kind k = n->init.kind;
  if (!fe_dtype_is_float(n->dtype)) { /* integer and bool constants: folded ONNX values */
    intptr_t count = (intptr_t)fe_numel(n);
    const void *p = n->init.data;
    if (k == NV_INIT_ZEROS || k == NV_INIT_ONES || k == NV_INIT_CONST) { /* literals */
      int64_t v = k == NV_INIT_ONES ? 1 : k == NV_INIT_CONST ? (int64_t)n->init.a : 0;
      if (n->dtype == NOVA_DTYPE_BOOL) return mlirDenseElementsAttrBoolSplatGet(t, v != 0);
      uint64_t bits = es == 8 ? (uint64_t)v : (uint64_t)v & ((UINT64_C(1) << (8 * es)) - 1); /* fits the width */
      return mlirDenseElementsAttrSplatGet(t, mlirIntegerAttrGet(et, (int64_t)bits));
    }
    if (n->init.kind != NV_INIT_DATA || !p) {
      nv_error(d, n->loc, "internal: a %s constant without data", fe_dtype_name(n->dtype));
      return mlirAttributeGetNull();
    }
    if (n->dtype == NOVA_DTYPE_BOOL) {
      int *b = nv_xmalloc((size_t)count * sizeof *b + 1);
      if (!b) return mlirAttributeGetNull();
      for (intptr_t i = 0; i < count; i++) b[i] = ((const unsigned char *)p)[i] != 0;
      MlirAttribute a = mlirDenseElementsAttrBoolGet(t, count, b);
      free(b);
      return a;
    }
    return mlirDenseElementsAttrRawBufferGet(t, (size_t)count * es, p);
  }
  if (k == NV_INIT_ZEROS || k == NV_INIT_ONES || k == NV_INIT_CONST || fe_numel(n) == 1) {
    double v = k == NV_INIT_ONES ? 1.0 : k == NV_INIT_CONST ? n->init.a : 0.0;
    if (fe_numel(n) == 1 && k != NV_INIT_ZEROS && k != NV_INIT_ONES && k != NV_INIT_CONST) {
      union { double d; float f; uint16_t h; } one = {0};
      if (fe_init_fill(g, d, n, &one)) return mlirAttributeGetNull();
      v = f64 ? one.d : half ? fe_half_to_double(n->dtype, one.h) : (double)one.f;
    }
    if (half) return mlirDenseElementsAttrSplatGet(t, mlirFloatAttrDoubleGet(ctx, et, v)); /* v rounded to et */
    return f64 ? mlirDenseElementsAttrDoubleSplatGet(t, v) : mlirDenseElementsAttrFloatSplatGet(t, (float)v);
  }
  size_t count = (size_t)fe_numel(n), bytes = count * es;
  if (bytes > NV_MAX_CONST_BYTES) {
    nv_error(d, n->loc, "const '%s': %zu bytes is too large to embed in the IR (limit %d MiB); make it a param",
             n->name ? n->name : "", bytes, NV_MAX_CONST_BYTES >> 20);
    return mlirAttributeGetNull();
  }
  void *buf = nv_xcalloc(count, es);
  if (!buf) {
    nv_error(d, n->loc, "const '%s': out of memory for %zu bytes", n->name ? n->name : "", bytes);
    return mlirAttributeGetNull();
  }
  MlirAttribute a = mlirAttributeGetNull();
  if (fe_init_fill(g, d, n, buf) == 0)
    a = half ? mlirDenseElementsAttrRawBufferGet(t, bytes, buf)
        : f64 ? mlirDenseElementsAttrDoubleGet(t, (intptr_t)count, buf)
              : mlirDenseElementsAttrFloatGet(t, (intptr_t)count, buf);
  free(buf);
  return a;
}

/* The attributes an op carries, as nova_op_attrs() lists them. */
static int op_attributes(MlirContext ctx, const nv_graph *g, nv_diag *d, const nv_node *n, MlirNamedAttribute *out) {
  int k = 0;
  switch (n->op) {
  case NV_OP_CONSTANT: out[k++] = named(ctx, "value", constant_value(ctx, g, d, n)); break;
  case NV_OP_SOFTMAX:
  case NV_OP_LOG_SOFTMAX:
  case NV_OP_CONCAT:
  case NV_OP_GATHER_ELEMENTS:
  case NV_OP_GATHER: out[k++] = named(ctx, "axis", i64_attr(ctx, n->axis)); break;
  case NV_OP_GATHER_ND: out[k++] = named(ctx, "batch_dims", i64_attr(ctx, n->axis)); break;
  case NV_OP_SCATTER_ND: out[k++] = named(ctx, "mode", i64_attr(ctx, n->mode)); break;
  case NV_OP_SCATTER_ELEMENTS:
  case NV_OP_CUMSUM:
    out[k++] = named(ctx, "axis", i64_attr(ctx, n->axis));
    out[k++] = named(ctx, "mode", i64_attr(ctx, n->mode));
    break;
  case NV_OP_LAYER_NORM:
    out[k++] = named(ctx, "eps", mlirFloatAttrDoubleGet(ctx, mlirF64TypeGet(ctx), n->eps));
    break;
  case NV_OP_ATTENTION:
    out[k++] = named(ctx, "scale", mlirFloatAttrDoubleGet(ctx, mlirF64TypeGet(ctx), n->scale));
    out[k++] = named(ctx, "softcap", mlirFloatAttrDoubleGet(ctx, mlirF64TypeGet(ctx), n->softcap));
    break;
  case NV_OP_DROPOUT: /* axis: the random stream of this dropout */
    out[k++] = named(ctx, "ratio", mlirFloatAttrDoubleGet(ctx, mlirF64TypeGet(ctx), n->value));
    out[k++] = named(ctx, "stream", i64_attr(ctx, n->axis));
    break;
  case NV_OP_STOCHASTIC_ROUND: /* axis: the random stream */
    out[k++] = named(ctx, "stream", i64_attr(ctx, n->axis));
    break;
  case NV_OP_REDUCE_SUM:
  case NV_OP_REDUCE_MEAN:
  case NV_OP_REDUCE_MAX:
  case NV_OP_REDUCE_MIN:
  case NV_OP_REDUCE_PROD:
    out[k++] = named(ctx, "axes", mlirDenseI64ArrayGet(ctx, n->nlist, n->list));
    out[k++] = named(ctx, "keepdims", i64_attr(ctx, n->keepdims));
    break;
  case NV_OP_RESHAPE:
  case NV_OP_BROADCAST: out[k++] = named(ctx, "shape", mlirDenseI64ArrayGet(ctx, n->rank, n->shape)); break;
  case NV_OP_TRANSPOSE: out[k++] = named(ctx, "perm", mlirDenseI64ArrayGet(ctx, n->nlist, n->list)); break;
  case NV_OP_CAST: out[k++] = named(ctx, "to", i64_attr(ctx, (int64_t)n->to)); break; /* a nova_dtype code */
  case NV_OP_CONV:
  case NV_OP_MAX_POOL:
  case NV_OP_AVG_POOL:
  case NV_OP_CONV_GRAD_INPUT:
  case NV_OP_CONV_GRAD_WEIGHT:
  case NV_OP_MAX_POOL_GRAD:
  case NV_OP_MAX_POOL_INDICES:
  case NV_OP_AVG_POOL_GRAD: {
    int ns = n->nspatial;
    bool conv = n->op == NV_OP_CONV || n->op == NV_OP_CONV_GRAD_INPUT || n->op == NV_OP_CONV_GRAD_WEIGHT;
    bool avg = n->op == NV_OP_AVG_POOL || n->op == NV_OP_AVG_POOL_GRAD;
    if (!conv) out[k++] = named(ctx, "kernel", mlirDenseI64ArrayGet(ctx, ns, n->kernel));
    out[k++] = named(ctx, "strides", mlirDenseI64ArrayGet(ctx, ns, n->strides));
    out[k++] = named(ctx, "pads", mlirDenseI64ArrayGet(ctx, 2 * ns, n->pads));
    out[k++] = named(ctx, "dilations", mlirDenseI64ArrayGet(ctx, ns, n->dilations));
    if (conv) out[k++] = named(ctx, "groups", i64_attr(ctx, n->groups));
    if (avg) out[k++] = named(ctx, "count_include_pad", i64_attr(ctx, n->count_include_pad));
    if (n->op == NV_OP_MAX_POOL_INDICES) out[k++] = named(ctx, "storage_order", i64_attr(ctx, n->col_major));
    if (n->op == NV_OP_CONV_GRAD_INPUT || n->op == NV_OP_CONV_GRAD_WEIGHT || n->op == NV_OP_AVG_POOL_GRAD)
      out[k++] = named(ctx, "shape", mlirDenseI64ArrayGet(ctx, n->rank, n->shape));
    break;
  }
  case NV_OP_SLICE:
    out[k++] = named(ctx, "axis", i64_attr(ctx, n->axis));
    out[k++] = named(ctx, "start", i64_attr(ctx, n->start));
    out[k++] = named(ctx, "end", i64_attr(ctx, n->end));
    out[k++] = named(ctx, "step", i64_attr(ctx, n->step));
    break;
  case NV_OP_RMS_NORM:
    out[k++] = named(ctx, "eps", mlirFloatAttrDoubleGet(ctx, mlirF64TypeGet(ctx), n->eps));
    break;
  case NV_OP_ROTARY: out[k++] = named(ctx, "interleaved", i64_attr(ctx, n->mode)); break;
  case NV_OP_ALL_REDUCE: out[k++] = named(ctx, "bucket", i64_attr(ctx, n->axis)); break;
  case NV_OP_REDUCE_SCATTER:
  case NV_OP_ALL_GATHER:
    out[k++] = named(ctx, "bucket", i64_attr(ctx, n->axis));
    out[k++] = named(ctx, "world", i64_attr(ctx, n->mode));
    break;
  case NV_OP_SHARD: out[k++] = named(ctx, "world", i64_attr(ctx, n->mode)); break;
  default: break;
  }
  return k;
}

static const char *role_str(nova_role r) {
  static const char *names[] = {"input", "label", "param", "opt_state", "output", "loss", "grad", "update", "buffer", "status"};
  return (unsigned)r < 10 ? names[r] : "input";
}

static bool is_arg(const nv_node *n) { return n->op == NV_OP_INPUT || n->op == NV_OP_PARAM; }

MlirModule nova_build_module(nova_ctx *c, const nv_graph *g) {
  MlirContext ctx = c->ctx;
  MlirLocation unk = mlirLocationUnknownGet(ctx);
  MlirModule m = mlirModuleCreateEmpty(unk);
  int nargs = 0;
  nv_node **args = nv_xmalloc(((size_t)g->nnodes + 1) * sizeof *args);
  MlirValue *val = nv_xcalloc((size_t)g->nnodes + 1, sizeof *val);
  MlirType *argt = nv_xmalloc(((size_t)g->nnodes + 1) * sizeof *argt);
  MlirLocation *argl = nv_xmalloc(((size_t)g->nnodes + 1) * sizeof *argl);
  MlirType *rest = nv_xmalloc(((size_t)g->noutputs + 1) * sizeof *rest);
  MlirAttribute *argattr = nv_xmalloc(((size_t)g->nnodes + 1) * sizeof *argattr);
  MlirAttribute *outnames = nv_xmalloc(((size_t)g->noutputs + 1) * sizeof *outnames);
  if (!args || !val || !argt || !argl || !rest || !argattr || !outnames) goto out;
  /* inputs first, then params: the step ABI's argument order */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < g->nnodes; i++) {
      nv_node *n = g->nodes[i];
      if (!is_arg(n) || (n->op == NV_OP_PARAM) != (pass == 1)) continue;
      argt[nargs] = nova_tensor_type(ctx, n->dtype, n->rank, n->shape);
      argl[nargs] = loc_of(ctx, n->loc);
      MlirNamedAttribute na[2] = {named(ctx, "nova.name", mlirStringAttrGet(ctx, nova_str(n->name))),
                                  named(ctx, "nova.role", mlirStringAttrGet(ctx, nova_str(role_str(n->role))))};
      argattr[nargs] = mlirDictionaryAttrGet(ctx, 2, na);
      args[nargs++] = n;
    }
  for (int i = 0; i < g->noutputs; i++) {
    const nv_node *n = g->outputs[i].node;
    rest[i] = nova_tensor_type(ctx, n->dtype, n->rank, n->shape);
    outnames[i] = mlirStringAttrGet(ctx, nova_str(g->outputs[i].name));
  }
  MlirType fty = mlirFunctionTypeGet(ctx, nargs, argt, g->noutputs, rest);
  MlirBlock body = mlirBlockCreate(nargs, argt, argl);
  for (int i = 0; i < nargs; i++) val[args[i]->id] = mlirBlockGetArgument(body, i);

  for (int i = 0; i < g->nnodes; i++) {
    const nv_node *n = g->nodes[i];
    if (is_arg(n)) continue;
    MlirNamedAttribute at[12];
    int na = op_attributes(ctx, g, c->diag, n, at);
    if (na > 0 && mlirAttributeIsNull(at[0].attribute)) { /* diagnosed */
      mlirBlockDestroy(body);
      mlirModuleDestroy(m);
      m = (MlirModule){NULL};
      goto out;
    }
    if (n->recompute) at[na++] = named(ctx, "nova.recompute", i64_attr(ctx, n->recompute)); /* ad_recompute's copy */
    char opname[64];
    snprintf(opname, sizeof opname, "nova.%s", nv_op_name(n->op));
    MlirOperationState st = mlirOperationStateGet(nova_str(opname), loc_of(ctx, n->loc));
    MlirValue ops[64];
    for (int j = 0; j < n->nin && j < 64; j++) ops[j] = val[n->in[j]->id];
    mlirOperationStateAddOperands(&st, n->nin, ops);
    MlirType rt = nova_tensor_type(ctx, n->dtype, n->rank, n->shape);
    mlirOperationStateAddResults(&st, 1, &rt);
    mlirOperationStateAddAttributes(&st, na, at);
    MlirOperation op = mlirOperationCreate(&st);
    mlirBlockAppendOwnedOperation(body, op);
    val[n->id] = mlirOperationGetResult(op, 0);
  }
  MlirValue *rets = nv_xcalloc((size_t)g->noutputs + 1, sizeof *rets);
  if (!rets) {
    mlirBlockDestroy(body);
    mlirModuleDestroy(m);
    m = (MlirModule){NULL};
    goto out;
  }
  for (int i = 0; i < g->noutputs; i++) rets[i] = val[g->outputs[i].node->id];
  MlirOperationState rs = mlirOperationStateGet(nova_str("func.return"), unk);
  mlirOperationStateAddOperands(&rs, g->noutputs, rets);
  mlirBlockAppendOwnedOperation(body, mlirOperationCreate(&rs));
  free(rets);

  MlirRegion region = mlirRegionCreate();
  mlirRegionAppendOwnedBlock(region, body);
  MlirOperationState fs = mlirOperationStateGet(nova_str("func.func"), unk);
  MlirNamedAttribute fa[4] = {
      named(ctx, "sym_name", mlirStringAttrGet(ctx, nova_str(g->train ? "train_step" : "forward"))),
      named(ctx, "function_type", mlirTypeAttrGet(fty)),
      named(ctx, "arg_attrs", mlirArrayAttrGet(ctx, nargs, argattr)),
      named(ctx, "nova.outputs", mlirArrayAttrGet(ctx, g->noutputs, outnames)),
  };
  mlirOperationStateAddAttributes(&fs, 4, fa);
  mlirOperationStateAddOwnedRegions(&fs, 1, &region);
  mlirBlockAppendOwnedOperation(mlirModuleGetBody(m), mlirOperationCreate(&fs));
out:
  free(args);
  free(val);
  free(argt);
  free(argl);
  free(rest);
  free(argattr);
  free(outnames);
  return m;
}
