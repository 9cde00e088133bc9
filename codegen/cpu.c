/* cpu.c: linalg on tensors -> LLVM dialect -> LLVM IR -> native object.
 *
 * Requires: a verified linalg module with func @forward over static tensors.
 * After cg_lower_to_llvm, @forward takes one bare pointer per argument and
 * then one per result (results become caller-provided out-buffers), which is
 * the calling convention the runtime's descriptor uses.
 */
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>
#include <mlir-c/Target/LLVMIR.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mlir-c/BuiltinAttributes.h>

#include "../driver/util.h"
#include "codegen.h"

static void err_cb(MlirStringRef s, void *ud) { nv_sb_printf(ud, "%.*s", (int)s.length, s.data); }

static pthread_once_t passes_once = PTHREAD_ONCE_INIT;
static void register_passes(void) { mlirRegisterAllPasses(); }

/* Runs a textual pipeline on m; 0 on success. */
int cg_run_pipeline(nova_ctx *c, MlirModule m, const char *pipeline, const char *stage) {
  pthread_once(&passes_once, register_passes);
  MlirPassManager pm = mlirPassManagerCreate(c->ctx);
  /* the IR is verified at the end of each stage (nova_verify); verifying
   * after every pass as well costs a tenth of a large step's compile time */
  if (!getenv("NOVAC_VERIFY_EACH_PASS")) mlirPassManagerEnableVerifier(pm, false);
  nv_sbuf err = {0};
  int rc = 0;
  if (mlirLogicalResultIsFailure(mlirParsePassPipeline(mlirPassManagerGetAsOpPassManager(pm),
                                                       nova_str(pipeline), err_cb, &err))) {
    nv_error_plain(c->diag, "internal: bad %s pipeline: %s", stage, err.s ? err.s : "");
    rc = -1;
  } else if (mlirLogicalResultIsFailure(mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(m)))) {
    nv_error_plain(c->diag, "%s failed (see the messages above)", stage);
    rc = -1;
  }
  nv_sb_free(&err);
  mlirPassManagerDestroy(pm);
  return rc;
}

/* After bufferization a function may return one buffer twice (two outputs
 * with the same value), which buffer-results-to-out-params does not handle:
 * each repeated result gets its own buffer, a copy. */
static void distinct_results(nova_ctx *c, MlirModule m) {
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    MlirRegion r = mlirOperationGetFirstRegion(f);
    if (mlirRegionIsNull(r) || mlirBlockIsNull(mlirRegionGetFirstBlock(r))) continue;
    MlirBlock b = mlirRegionGetFirstBlock(r);
    MlirOperation ret = mlirBlockGetTerminator(b);
    if (mlirOperationIsNull(ret)) continue;
    intptr_t n = mlirOperationGetNumOperands(ret);
    for (intptr_t i = 1; i < n; i++)
      for (intptr_t j = 0; j < i; j++) {
        MlirValue v = mlirOperationGetOperand(ret, i);
        if (!mlirValueEqual(v, mlirOperationGetOperand(ret, j))) continue;
        MlirLocation loc = mlirOperationGetLocation(ret);
        MlirType t = mlirValueGetType(v);
        MlirOperationState as = mlirOperationStateGet(nova_str("memref.alloc"), loc);
        mlirOperationStateAddResults(&as, 1, &t);
        int32_t seg[2] = {0, 0};
        MlirNamedAttribute na = mlirNamedAttributeGet(mlirIdentifierGet(c->ctx, nova_str("operandSegmentSizes")),
                                                      mlirDenseI32ArrayGet(c->ctx, 2, seg));
        mlirOperationStateAddAttributes(&as, 1, &na);
        MlirOperation alloc = mlirOperationCreate(&as);
        mlirBlockInsertOwnedOperationBefore(b, ret, alloc);
        MlirValue fresh = mlirOperationGetResult(alloc, 0);
        MlirOperationState cs = mlirOperationStateGet(nova_str("memref.copy"), loc);
        MlirValue ops[2] = {v, fresh};
        mlirOperationStateAddOperands(&cs, 2, ops);
        mlirBlockInsertOwnedOperationBefore(b, ret, mlirOperationCreate(&cs));
        mlirOperationSetOperand(ret, i, fresh);
        break;
      }
  }
}

static MlirWalkResult count_linalg(MlirOperation op, void *ud) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  if (s.length > 7 && !memcmp(s.data, "linalg.", 7) && (s.length != 12 || memcmp(s.data, "linalg.yield", 12)) &&
      (s.length != 12 || memcmp(s.data, "linalg.index", 12)))
    ++*(int *)ud;
  return MlirWalkResultAdvance;
}

int cg_fuse(nova_ctx *c, MlirModule m, int opt_level, cg_plan *stats) {
  mlirOperationWalk(mlirModuleGetOperation(m), count_linalg, &stats->ops_before_fusion, MlirWalkPreOrder);
  if (opt_level > 0 &&
      cg_run_pipeline(c, m, "builtin.module(func.func(canonicalize,cse,linalg-fuse-elementwise-ops,canonicalize))",
                      "fusion"))
    return -1;
  mlirOperationWalk(mlirModuleGetOperation(m), count_linalg, &stats->ops_after_fusion, MlirWalkPreOrder);
  return 0;
}

int cg_bufferize(nova_ctx *c, MlirModule m, int opt_level, bool dealloc) {
  (void)opt_level;
  nv_sbuf p = {0};
  int rc = cg_run_pipeline(c, m,
                           "builtin.module(one-shot-bufferize{bufferize-function-boundaries=1 "
                           "function-boundary-type-conversion=identity-layout-map})",
                           "bufferization");
  if (rc) return rc;
  distinct_results(c, m);
  /* canonicalize: loops that carry a buffer unchanged (tiled code) return it
   * directly, which the memory plan and the in-place updates rely on */
  nv_sb_printf(&p,
               "builtin.module(buffer-results-to-out-params{hoist-static-allocs=1 modify-public-functions=1}%s,"
               "func.func(canonicalize))",
               dealloc ? ",buffer-deallocation-pipeline" : "");
  rc = p.oom ? -1 : cg_run_pipeline(c, m, p.s, "bufferization");
  nv_sb_free(&p);
  return rc;
}

typedef struct cpu_plan_args {
  const cfg_device *cpu;
  int opt_level;
} cpu_plan_args;

/* The CPU pipeline from the fused module to the memory plan (-O1 and up):
 * 0 planned, 1 not plannable, -1 error. */
static int plan_cpu(nova_ctx *c, const nv_graph *g, MlirModule m, cg_plan *plan, void *ud) {
  const cpu_plan_args *a = ud;
  if (cg_prepare_inplace(c, g, m) || cg_cpu_tile(c, m, a->cpu, a->opt_level) ||
      cg_bufferize(c, m, a->opt_level, false) || cg_plan_inplace(g, m, plan))
    return -1;
  return cg_memplan(c, m, plan);
}

int cg_lower_to_llvm(nova_ctx *c, const nv_graph *g, MlirModule m, const cfg_device *cpu, int opt_level,
                     cg_plan *plan) {
  if (cg_fuse(c, m, opt_level, plan)) return -1;
  int rc = 1;
  if (opt_level > 0) {
    cpu_plan_args a = {cpu, opt_level};
    if (plan->memory_limit > 0 && cg_fit_memory(c, g, m, plan_cpu, &a, plan)) return -1;
    rc = plan_cpu(c, g, m, plan, &a);
  } else if (cg_bufferize(c, m, opt_level, false)) {
    return -1;
  }
  if (rc < 0) return -1;
  if (rc == 1 && cg_run_pipeline(c, m, "builtin.module(buffer-deallocation-pipeline)", "buffer deallocation"))
    return -1;
  return cg_lower_loops_to_llvm(c, m);
}

int cg_lower_loops_to_llvm(nova_ctx *c, MlirModule m) {
  if (cg_run_pipeline(c, m, "builtin.module(func.func(convert-linalg-to-loops),convert-vector-to-scf{full-unroll=1})",
                      "lowering to loops") ||
      cg_outline_nests(c, m))
    return -1;
  return cg_run_pipeline(c, m,
                         "builtin.module(convert-scf-to-cf,expand-strided-metadata,"
                         "lower-affine,convert-math-to-llvm,convert-math-to-libm,finalize-memref-to-llvm,convert-vector-to-llvm,"
                         "convert-arith-to-llvm,convert-func-to-llvm{use-bare-ptr-memref-call-conv=1},convert-cf-to-llvm,"
                         "convert-ub-to-llvm,reconcile-unrealized-casts)",
                         "lowering to LLVM");
}

/* The entry's arguments carry {nova.name, nova.role}, which LLVM IR has no
 * place for: the translation warns about each, printing the whole entry
 * function into every warning (seconds for a large step).  They are
 * dropped before translating (argument attributes of the llvm dialect are
 * kept). */
static void drop_nova_arg_attrs(MlirModule m) {
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    MlirAttribute a = mlirOperationGetAttributeByName(f, nova_str("arg_attrs"));
    if (mlirAttributeIsNull(a)) continue;
    nv_sbuf sb = {0};
    mlirAttributePrint(a, err_cb, &sb);
    if (sb.s && !sb.oom && !strstr(sb.s, "llvm.")) mlirOperationRemoveAttributeByName(f, nova_str("arg_attrs"));
    nv_sb_free(&sb);
  }
}

int cg_emit_llvm_ir(nova_ctx *c, MlirModule m, FILE *f) {
  drop_nova_arg_attrs(m);
  char *s = mlirTranslateModuleToLLVMIRToString(mlirModuleGetOperation(m));
  if (!s) {
    nv_error_plain(c->diag, "translation to LLVM IR failed");
    return -1;
  }
  fputs(s, f);
  free(s);
  return 0;
}

void cg_cpu_name(const cg_options *o, char *out, size_t size) {
  if (!o->cpu || !strcmp(o->cpu, "host")) {
    char *h = LLVMGetHostCPUName();
    snprintf(out, size, "%s", h);
    LLVMDisposeMessage(h);
  } else
    snprintf(out, size, "%s", o->cpu);
}

/* Translation, optimisation and emission, in this process.  LLVM may end
 * the process (report_fatal_error) on inputs it rejects, e.g. an unknown
 * CPU, so cg_emit_object runs this in a child. */
static int emit_object_here(nova_ctx *c, MlirModule m, const cg_options *o, const char *obj_path) {
  LLVMInitializeNativeTarget();
  LLVMInitializeNativeAsmPrinter();
  LLVMContextRef llctx = LLVMContextCreate();
  drop_nova_arg_attrs(m);
  LLVMModuleRef lm = mlirTranslateModuleToLLVMIR(mlirModuleGetOperation(m), llctx);
  int rc = -1;
  char *triple = LLVMGetDefaultTargetTriple(), *err = NULL, *cpu = NULL, *features = NULL;
  LLVMTargetMachineRef tm = NULL;
  LLVMTargetRef target;
  if (!lm) {
    nv_error_plain(c->diag, "translation to LLVM IR failed");
    goto out;
  }
  LLVMSetSourceFileName(lm, "step", 4);
  if (LLVMGetTargetFromTriple(triple, &target, &err)) {
    nv_error_plain(c->diag, "no LLVM target for %s: %s", triple, err);
    goto out;
  }
  bool host = !o->cpu || !strcmp(o->cpu, "host");
  cpu = host ? LLVMGetHostCPUName() : strdup(o->cpu);
  features = host ? LLVMGetHostCPUFeatures() : strdup("");
  static const LLVMCodeGenOptLevel lv[] = {LLVMCodeGenLevelNone, LLVMCodeGenLevelLess, LLVMCodeGenLevelDefault,
                                           LLVMCodeGenLevelAggressive};
  int ol = o->opt_level < 0 ? 0 : o->opt_level > 3 ? 3 : o->opt_level;
  tm = LLVMCreateTargetMachine(target, triple, cpu, features, lv[ol], LLVMRelocPIC, LLVMCodeModelDefault);
  if (!tm) {
    nv_error_plain(c->diag, "LLVM does not know the CPU '%s'", cpu);
    goto out;
  }
  LLVMSetTarget(lm, triple);
  LLVMTargetDataRef dl = LLVMCreateTargetDataLayout(tm);
  LLVMSetModuleDataLayout(lm, dl);
  LLVMDisposeTargetData(dl);
  char passes[32];
  snprintf(passes, sizeof passes, "default<O%d>", ol);
  LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
  LLVMErrorRef e = LLVMRunPasses(lm, passes, tm, po);
  LLVMDisposePassBuilderOptions(po);
  if (e) {
    char *msg = LLVMGetErrorMessage(e);
    nv_error_plain(c->diag, "LLVM optimisation failed: %s", msg);
    LLVMDisposeErrorMessage(msg);
    goto out;
  }
  if (LLVMTargetMachineEmitToFile(tm, lm, obj_path, LLVMObjectFile, &err)) {
    nv_error_plain(c->diag, "writing the object file failed: %s", err);
    goto out;
  }
  rc = 0;
out:
  if (err) LLVMDisposeMessage(err);
  if (tm) LLVMDisposeTargetMachine(tm);
  if (lm) LLVMDisposeModule(lm);
  LLVMContextDispose(llctx);
  LLVMDisposeMessage(triple);
  free(cpu);  /* LLVMGetHostCPUName's result is malloc'd like strdup's */
  free(features);
  return rc;
}

int cg_emit_object(nova_ctx *c, MlirModule m, const cg_options *o, const char *obj_path, char *cpu_used,
                   size_t cpu_size) {
  cg_cpu_name(o, cpu_used, cpu_size);
  char log[4200];
  snprintf(log, sizeof log, "%s.log", obj_path);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    nv_error_plain(c->diag, "cannot start code generation: %s", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 2);
      close(fd);
    }
    _exit(emit_object_here(c, m, o, obj_path) ? 1 : 0);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  size_t len = 0;
  char *text = nv_read_file(log, &len, 1 << 20);
  unlink(log);
  int rc = WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
  if (rc && text && strstr(text, "is not a recognized processor"))
    nv_error_plain(c->diag, "--cpu=%s: LLVM does not know this CPU (try host, x86-64, x86-64-v3, skylake-avx512, znver4)",
                   o->cpu ? o->cpu : "host");
  else if (rc) {
    /* the child's own diagnostics, or LLVM's fatal message */
    char *line = text ? strstr(text, "LLVM ERROR: ") : NULL;
    if (!line && text && *text) line = text;
    char *nl = line ? strchr(line, '\n') : NULL;
    if (nl) *nl = 0;
    nv_error_plain(c->diag, "code generation failed: %s", line ? line : "(the code generator stopped with no message)");
  } else if (text && len)
    fputs(text, stderr); /* warnings */
  free(text);
  return rc;
}
