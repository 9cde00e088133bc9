/* nova_dialect.c: the nova dialect's IRDL definition, the context, and the
 * bridge from MLIR diagnostics to novac's. */
#include <assert.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/Dialect/IRDL.h>
#include <mlir-c/RegisterEverything.h>
#include <mlir-c/Target/LLVMIR.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "nova_ir.h"

static const char *const op_attrs[] = {
    [NV_OP_INPUT] = "", [NV_OP_PARAM] = "", [NV_OP_CONSTANT] = "value",
    [NV_OP_ADD] = "", [NV_OP_SUB] = "", [NV_OP_MUL] = "", [NV_OP_DIV] = "",
    [NV_OP_NEG] = "", [NV_OP_EXP] = "", [NV_OP_LOG] = "", [NV_OP_SQRT] = "",
    [NV_OP_TANH] = "", [NV_OP_SIGMOID] = "", [NV_OP_RELU] = "", [NV_OP_GELU] = "",
    [NV_OP_MATMUL] = "", [NV_OP_SOFTMAX] = "axis", [NV_OP_LOG_SOFTMAX] = "axis",
    [NV_OP_LAYER_NORM] = "eps", [NV_OP_REDUCE_SUM] = "axes keepdims",
    [NV_OP_REDUCE_MEAN] = "axes keepdims", [NV_OP_REDUCE_MAX] = "axes keepdims",
    [NV_OP_RESHAPE] = "shape", [NV_OP_TRANSPOSE] = "perm", [NV_OP_BROADCAST] = "shape",
    [NV_OP_CONCAT] = "axis", [NV_OP_SLICE] = "axis start end step", [NV_OP_GATHER] = "axis",
    [NV_OP_CROSS_ENTROPY] = "", [NV_OP_POW] = "", [NV_OP_ABS] = "", [NV_OP_ERF] = "",
    [NV_OP_MINIMUM] = "", [NV_OP_MAXIMUM] = "", [NV_OP_WHERE] = "", [NV_OP_EQUAL] = "",
    [NV_OP_LESS] = "", [NV_OP_GREATER] = "", [NV_OP_CAST] = "to",
    [NV_OP_CONV] = "strides pads dilations groups", [NV_OP_MAX_POOL] = "kernel strides pads dilations",
    [NV_OP_AVG_POOL] = "kernel strides pads dilations count_include_pad",
    [NV_OP_CONV_GRAD_INPUT] = "strides pads dilations groups shape",
    [NV_OP_CONV_GRAD_WEIGHT] = "strides pads dilations groups shape",
    [NV_OP_MAX_POOL_GRAD] = "kernel strides pads dilations",
    [NV_OP_MAX_POOL_INDICES] = "kernel strides pads dilations storage_order",
    [NV_OP_AVG_POOL_GRAD] = "kernel strides pads dilations count_include_pad shape",
    [NV_OP_SIN] = "", [NV_OP_COS] = "", [NV_OP_TAN] = "", [NV_OP_ASIN] = "", [NV_OP_ACOS] = "",
    [NV_OP_ATAN] = "", [NV_OP_SINH] = "", [NV_OP_COSH] = "", [NV_OP_ASINH] = "", [NV_OP_ACOSH] = "",
    [NV_OP_ATANH] = "", [NV_OP_FLOOR] = "", [NV_OP_CEIL] = "", [NV_OP_ROUND] = "", [NV_OP_SIGN] = "",
    [NV_OP_ISNAN] = "", [NV_OP_ISINF] = "", [NV_OP_NOT] = "", [NV_OP_AND] = "", [NV_OP_OR] = "",
    [NV_OP_XOR] = "", [NV_OP_LESS_EQUAL] = "", [NV_OP_GREATER_EQUAL] = "", [NV_OP_MOD] = "",
    [NV_OP_FMOD] = "", [NV_OP_REDUCE_MIN] = "axes keepdims", [NV_OP_REDUCE_PROD] = "axes keepdims",
    [NV_OP_GATHER_ELEMENTS] = "axis", [NV_OP_SCATTER_ELEMENTS] = "axis mode", [NV_OP_GATHER_ND] = "batch_dims",
    [NV_OP_SCATTER_ND] = "mode", [NV_OP_CUMSUM] = "axis mode", [NV_OP_DROPOUT] = "ratio stream",
    [NV_OP_STOCHASTIC_ROUND] = "stream", [NV_OP_SHL] = "", [NV_OP_SHR] = "",
    [NV_OP_ATTENTION] = "scale softcap",
    [NV_OP_RMS_NORM] = "eps", [NV_OP_ROTARY] = "interleaved", [NV_OP_ALL_REDUCE] = "bucket",
    [NV_OP_REDUCE_SCATTER] = "bucket world", [NV_OP_ALL_GATHER] = "bucket world", [NV_OP_SHARD] = "world",
};
static_assert(sizeof op_attrs / sizeof op_attrs[0] == NV_OP_COUNT, "attribute table out of step with NV_OPS");

const char *nova_op_attrs(nv_op op) { return op < NV_OP_COUNT && op_attrs[op] ? op_attrs[op] : ""; }

/* The IRDL base of an attribute, by name. */
static const char *attr_base(const char *name) {
  if (!strcmp(name, "value")) return "#builtin.dense_int_or_fp_elements";
  if (!strcmp(name, "axes") || !strcmp(name, "perm") || !strcmp(name, "shape") || !strcmp(name, "kernel") ||
      !strcmp(name, "strides") || !strcmp(name, "pads") || !strcmp(name, "dilations"))
    return "#builtin.dense_array";
  if (!strcmp(name, "eps") || !strcmp(name, "ratio") || !strcmp(name, "scale") || !strcmp(name, "softcap"))
    return "#builtin.float";
  return "#builtin.integer";
}

char *nova_dialect_irdl(void) {
  nv_sbuf b = {0};
  nv_sb_printf(&b, "irdl.dialect @nova {\n");
  for (int op = NV_OP_CONSTANT; op < NV_OP_COUNT; op++) {
    nv_sb_printf(&b, "  irdl.operation @%s {\n", nv_op_name((nv_op)op));
    int min = nv_op_min_inputs((nv_op)op), max = nv_op_max_inputs((nv_op)op);
    int nin = max < 0 ? 1 : min;
    for (int i = 0; i <= nin; i++) nv_sb_printf(&b, "    %%t%d = irdl.base \"!builtin.tensor\"\n", i);
    char attrs[128];
    snprintf(attrs, sizeof attrs, "%s", nova_op_attrs((nv_op)op));
    int na = 0;
    char *save = NULL;
    char names[8][32];
    for (char *w = strtok_r(attrs, " ", &save); w && na < 8; w = strtok_r(NULL, " ", &save)) {
      snprintf(names[na], sizeof names[na], "%s", w);
      nv_sb_printf(&b, "    %%a%d = irdl.base \"%s\"\n", na, attr_base(w));
      na++;
    }
    if (na) {
      nv_sb_printf(&b, "    irdl.attributes {");
      for (int i = 0; i < na; i++) nv_sb_printf(&b, "%s\"%s\" = %%a%d", i ? ", " : "", names[i], i);
      nv_sb_printf(&b, "}\n");
    }
    if (max < 0)
      nv_sb_printf(&b, "    irdl.operands(inputs: variadic %%t0)\n");
    else if (nin > 0) {
      nv_sb_printf(&b, "    irdl.operands(");
      for (int i = 0; i < nin; i++) nv_sb_printf(&b, "%sin%d: %%t%d", i ? ", " : "", i, i);
      nv_sb_printf(&b, ")\n");
    }
    nv_sb_printf(&b, "    irdl.results(result: %%t%d)\n  }\n", nin);
  }
  nv_sb_printf(&b, "}\n");
  return b.s;
}

/* ---- diagnostics ---------------------------------------------------- */

typedef struct str_acc {
  char buf[1024];
  size_t len;
} str_acc;

static void acc_cb(MlirStringRef s, void *ud) {
  str_acc *a = ud;
  size_t room = sizeof a->buf - 1 - a->len;
  size_t n = s.length < room ? s.length : room;
  memcpy(a->buf + a->len, s.data, n);
  a->len += n;
  a->buf[a->len] = 0;
}

/* A FileLineCol location (possibly under a name or call site) as nv_loc. */
static nv_loc to_loc(nova_ctx *c, MlirLocation l) {
  for (int depth = 0; depth < 8; depth++) {
    if (mlirLocationIsAFileLineColRange(l)) {
      MlirIdentifier f = mlirLocationFileLineColRangeGetFilename(l);
      MlirStringRef s = mlirIdentifierStr(f);
      char name[512];
      snprintf(name, sizeof name, "%.*s", (int)s.length, s.data);
      return (nv_loc){nv_diag_intern(c->diag, name), mlirLocationFileLineColRangeGetStartLine(l),
                      mlirLocationFileLineColRangeGetStartColumn(l)};
    }
    if (mlirLocationIsAName(l)) l = mlirLocationNameGetChildLoc(l);
    else if (mlirLocationIsACallSite(l)) l = mlirLocationCallSiteGetCaller(l);
    else if (mlirLocationIsAFused(l) && mlirLocationFusedGetNumLocations(l) > 0) {
      MlirLocation ls[16];
      if (mlirLocationFusedGetNumLocations(l) > 16) break;
      mlirLocationFusedGetLocations(l, ls);
      l = ls[0];
    } else
      break;
  }
  return (nv_loc){0};
}

static MlirLogicalResult on_diag(MlirDiagnostic dg, void *ud) {
  nova_ctx *c = ud;
  MlirDiagnosticSeverity sev = mlirDiagnosticGetSeverity(dg);
  if (sev != MlirDiagnosticError) return mlirLogicalResultSuccess();
  str_acc a = {{0}, 0};
  mlirDiagnosticPrint(dg, acc_cb, &a);
  /* keep the first line only: notes can carry whole op dumps */
  char *nl = strchr(a.buf, '\n');
  if (nl) *nl = 0;
  if (a.len > 400) strcpy(a.buf + 400, "...");
  c->mlir_errors++;
  nv_error(c->diag, to_loc(c, mlirDiagnosticGetLocation(dg)), "%s", a.buf);
  return mlirLogicalResultSuccess();
}

/* ---- context -------------------------------------------------------- */

MlirStringRef nova_str(const char *s) { return mlirStringRefCreateFromCString(s); }

int nova_ctx_init(nova_ctx *c, nv_diag *d) {
  memset(c, 0, sizeof *c);
  c->diag = d;
  MlirDialectRegistry reg = mlirDialectRegistryCreate();
  mlirRegisterAllDialects(reg);
  c->ctx = mlirContextCreateWithRegistry(reg, false);
  mlirDialectRegistryDestroy(reg);
  mlirContextLoadAllAvailableDialects(c->ctx);
  mlirRegisterAllLLVMTranslations(c->ctx);
  mlirContextAttachDiagnosticHandler(c->ctx, on_diag, c, NULL);
  char *irdl = nova_dialect_irdl();
  if (!irdl) return -1;
  MlirModule m = mlirModuleCreateParse(c->ctx, nova_str(irdl));
  free(irdl);
  if (mlirModuleIsNull(m) || mlirLogicalResultIsFailure(mlirLoadIRDLDialects(m))) {
    nv_error_plain(d, "internal: the nova dialect definition did not load");
    if (!mlirModuleIsNull(m)) mlirModuleDestroy(m);
    return -1;
  }
  mlirModuleDestroy(m);
  return 0;
}

void nova_ctx_dispose(nova_ctx *c) {
  if (!mlirContextIsNull(c->ctx)) mlirContextDestroy(c->ctx);
  c->ctx.ptr = NULL;
}

int nova_verify(nova_ctx *c, MlirModule m, const char *after) {
  int before = c->mlir_errors;
  if (mlirOperationVerify(mlirModuleGetOperation(m)) && c->mlir_errors == before) return 0;
  nv_error_plain(c->diag, "internal: the IR does not verify after %s", after);
  return -1;
}

/* ---- types ---------------------------------------------------------- */

MlirType nova_elem_type(MlirContext ctx, nova_dtype dt) {
  switch (dt) {
  case NOVA_DTYPE_F32: return mlirF32TypeGet(ctx);
  case NOVA_DTYPE_F64: return mlirF64TypeGet(ctx);
  case NOVA_DTYPE_F16: return mlirF16TypeGet(ctx);
  case NOVA_DTYPE_BF16: return mlirBF16TypeGet(ctx);
  case NOVA_DTYPE_I32: return mlirIntegerTypeGet(ctx, 32);
  case NOVA_DTYPE_I64: return mlirIntegerTypeGet(ctx, 64);
  case NOVA_DTYPE_BOOL: return mlirIntegerTypeGet(ctx, 1);
  case NOVA_DTYPE_I8: return mlirIntegerTypeGet(ctx, 8);
  case NOVA_DTYPE_I16: return mlirIntegerTypeGet(ctx, 16);
  case NOVA_DTYPE_U8: return mlirIntegerTypeUnsignedGet(ctx, 8);
  case NOVA_DTYPE_U16: return mlirIntegerTypeUnsignedGet(ctx, 16);
  case NOVA_DTYPE_U32: return mlirIntegerTypeUnsignedGet(ctx, 32);
  case NOVA_DTYPE_U64: return mlirIntegerTypeUnsignedGet(ctx, 64);
  }
  return mlirNoneTypeGet(ctx);
}

MlirType nova_tensor_type(MlirContext ctx, nova_dtype dt, int rank, const int64_t *shape) {
  return mlirRankedTensorTypeGet(rank, shape, nova_elem_type(ctx, dt), mlirAttributeGetNull());
}

nova_dtype nova_dtype_of(MlirType t) {
  if (mlirTypeIsAShaped(t)) t = mlirShapedTypeGetElementType(t);
  if (mlirTypeIsAF32(t)) return NOVA_DTYPE_F32;
  if (mlirTypeIsAF64(t)) return NOVA_DTYPE_F64;
  if (mlirTypeIsAF16(t)) return NOVA_DTYPE_F16;
  if (mlirTypeIsABF16(t)) return NOVA_DTYPE_BF16;
  if (mlirTypeIsAInteger(t)) {
    unsigned w = mlirIntegerTypeGetWidth(t);
    if (mlirIntegerTypeIsUnsigned(t))
      return w == 64 ? NOVA_DTYPE_U64 : w == 32 ? NOVA_DTYPE_U32 : w == 16 ? NOVA_DTYPE_U16 : w == 8 ? NOVA_DTYPE_U8
                                                                                                : (nova_dtype)0;
    return w == 64 ? NOVA_DTYPE_I64 : w == 32 ? NOVA_DTYPE_I32 : w == 16 ? NOVA_DTYPE_I16 : w == 8 ? NOVA_DTYPE_I8
         : w == 1 ? NOVA_DTYPE_BOOL : (nova_dtype)0;
  }
  return (nova_dtype)0;
}

nv_op nova_op_kind(MlirOperation op) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  if (s.length < 6 || strncmp(s.data, "nova.", 5) != 0) return NV_OP_COUNT;
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)(s.length - 5), s.data + 5);
  if (!strcmp(name, "constant")) return NV_OP_CONSTANT;
  return nv_op_lookup(name);
}

static void file_cb(MlirStringRef s, void *ud) { fwrite(s.data, 1, s.length, (FILE *)ud); }

void nova_print_op(MlirOperation op, FILE *f) {
  mlirOperationPrint(op, file_cb, f);
  fputc('\n', f);
}
