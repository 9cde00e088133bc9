/* cpu.c: linalg on tensors -> LLVM dialect -> LLVM IR -> native object.
 *
 * Requires: a verified linalg module with func @forward over static tensors.
 * After the last stage (cg_lower_loops_to_llvm), @forward takes one pointer, to an array of one
 * bare pointer per argument and then one per result (results become
 * caller-provided out-buffers), which is the calling convention the
 * runtime's descriptor uses (pack_entry.c).
 */
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <mlir-c/Target/LLVMIR.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>

#include "../support/util.h"
#include "codegen.h"

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

int cg_bufferize(nova_ctx *c, MlirModule m, int opt_level, bool dealloc) {
  (void)opt_level;
  nv_sbuf p = {0};
  cg_unshare_destinations(m);
  int pieces = getenv("NOVAC_NO_CHUNKS") ? 0 : cg_chunk_split(m);
  if (pieces < 0) {
    nv_error_plain(c->diag, "out of memory cutting the step for bufferization");
    return -1;
  }
  cg_constant_globals(m);
  if (cg_entry_args_as_buffers(m)) {
    nv_error_plain(c->diag, "out of memory preparing the step for bufferization");
    return -1;
  }
  int rc = cg_run_pipeline(c, m,
                           "builtin.module(one-shot-bufferize{bufferize-function-boundaries=1 "
                           "function-boundary-type-conversion=identity-layout-map})",
                           "bufferization");
  if (rc) return rc;
  if (pieces > 0 && getenv("NOVAC_DEBUG_PIPELINES")) fprintf(stderr, "novac: bufferized in %d pieces\n", pieces);
  if (pieces > 0 && cg_chunk_inline(m)) {
    nv_error_plain(c->diag, "internal: the bufferized pieces of the step do not fit back together");
    return -1;
  }
  cg_tiled_results(m);
  distinct_results(c, m);
  /* canonicalize: loops that carry a buffer unchanged (tiled code) return it
   * directly, which the memory plan and the in-place updates rely on (the
   * region simplification, a third of the time on a long step, finds
   * nothing here: bufferized straight-line code has no blocks to merge) */
  nv_sb_printf(&p,
               "builtin.module(buffer-results-to-out-params{hoist-static-allocs=1 modify-public-functions=1}%s,"
               "func.func(canonicalize{region-simplify=disabled max-iterations=1}))",
               dealloc ? ",buffer-deallocation-pipeline" : "");
  rc = p.oom ? -1 : cg_run_pipeline(c, m, p.s, "bufferization");
  nv_sb_free(&p);
  if (!rc) cg_tiled_settle(m);
  return rc;
}

/* NOVAC_DEBUG_PIPELINES: the time of a stage that is not a pass pipeline. */
static int timed(int rc, double *t, const char *what) {
  double t1 = cg_now_ms();
  if (getenv("NOVAC_DEBUG_PIPELINES"))
    fprintf(stderr, "novac: %8.1f ms %6.0f MiB  (%s)\n", t1 - *t, cg_peak_rss_mib(), what);
  *t = t1;
  return rc;
}

static MlirWalkResult find_bf16(MlirOperation op, void *ud) {
  for (intptr_t i = 0, n = mlirOperationGetNumResults(op); i < n; i++) {
    MlirType t = mlirValueGetType(mlirOperationGetResult(op, i));
    if (mlirTypeIsAShaped(t)) t = mlirShapedTypeGetElementType(t);
    if (mlirTypeIsABF16(t)) {
      *(bool *)ud = true;
      return MlirWalkResultInterrupt;
    }
  }
  return MlirWalkResultAdvance;
}

int cg_lower_loops_to_llvm(nova_ctx *c, MlirModule m, int *parallel) {
  /* bf16 <-> f32 conversions become integer arithmetic (arith-expand): LLVM
   * would call __truncsfbf2, which this toolchain's libgcc lacks */
  bool bf16 = false;
  mlirOperationWalk(mlirModuleGetOperation(m), find_bf16, &bf16, MlirWalkPreOrder);
  char pipe[800];
  snprintf(pipe, sizeof pipe,
           "builtin.module(func.func(convert-scf-to-cf,expand-strided-metadata,lower-affine,"
           "convert-math-to-llvm),convert-math-to-libm,finalize-memref-to-llvm,"
           "func.func(%sconvert-vector-to-llvm,convert-arith-to-llvm),"
           "convert-func-to-llvm{use-bare-ptr-memref-call-conv=1},convert-cf-to-llvm,"
           "convert-ub-to-llvm,reconcile-unrealized-casts)",
           bf16 ? "arith-expand{include-bf16=1}," : "");
  /* outlined first: the lowering to loops then runs once per distinct nest */
  int npar = 0;
  double t = cg_now_ms();
  char entry[256] = ""; /* its name, for cg_pack_entry after the lowering */
  MlirOperation ef = cg_entry_func(m);
  MlirAttribute en = mlirAttributeGetNull();
  if (!mlirOperationIsNull(ef)) en = mlirOperationGetAttributeByName(ef, nova_str("sym_name"));
  if (!mlirAttributeIsNull(en)) {
    MlirStringRef s = mlirStringAttrGetValue(en);
    snprintf(entry, sizeof entry, "%.*s", (int)s.length, s.data);
  }
  if (timed(cg_outline_nests(c, m), &t, "outlining") || timed(cg_cpu_contract_calls(c, m), &t, "kernel calls"))
    return -1;
  /* one function per distinct nest from here: the function-level passes
   * run on several threads (stopped again before code generation forks) */
  if (nv_jobs() > 1) mlirContextEnableMultithreading(c->ctx, true);
  int rc = cg_run_pipeline(c, m, "builtin.module(func.func(convert-linalg-to-loops,convert-vector-to-scf{full-unroll=1}))",
                           "lowering to loops");
  t = cg_now_ms(); /* each pipeline reports its own time, and each stage only its own */
  rc = rc || (parallel && timed(cg_parallel_calls(c, m, &npar), &t, "parallel calls")) ||
       timed(cg_split_entry(c, m), &t, "entry in pieces") || cg_run_pipeline(c, m, pipe, "lowering to LLVM") ||
       cg_pack_entry(c, m, entry);
  if (!rc) cg_fold_piece_descriptors(m);
  mlirContextEnableMultithreading(c->ctx, false);
  if (rc) return -1;
  if (parallel) *parallel = npar;
  t = cg_now_ms();
  return npar > 0 ? timed(cg_parallel_thunks(c, m), &t, "parallel thunks") : 0;
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
    mlirAttributePrint(a, cg_print_to_sbuf, &sb);
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

/* A string LLVM's C API made with strdup (LLVMGetHostCPUName, ...): NULL
 * is a failed allocation, which LLVM passes on unchecked. */
static char *llvm_str(char *s) {
  if (!s) nv_oom_die(64);
  return s;
}

void cg_cpu_name(const cg_options *o, char *out, size_t size) {
  if (!o->cpu || !strcmp(o->cpu, "host")) {
    char *h = llvm_str(LLVMGetHostCPUName());
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
  char *triple = llvm_str(LLVMGetDefaultTargetTriple()), *err = NULL, *cpu = NULL, *features = NULL;
  LLVMTargetMachineRef tm = NULL;
  LLVMTargetRef target;
  if (!lm) {
    nv_error_plain(c->diag, "translation to LLVM IR failed");
    goto out;
  }
  LLVMSetSourceFileName(lm, "step", 4);
  for (LLVMValueRef fn = LLVMGetFirstFunction(lm); fn; fn = LLVMGetNextFunction(fn)) {
    size_t len;
    const char *name = LLVMGetValueName2(fn, &len);
    if (len > 10 && !memcmp(name, "nova_part_", 10)) LLVMSetVisibility(fn, LLVMHiddenVisibility);
  }
  if (LLVMGetTargetFromTriple(triple, &target, &err)) {
    nv_error_plain(c->diag, "no LLVM target for %s: %s", triple, err);
    goto out;
  }
  bool host = !o->cpu || !strcmp(o->cpu, "host");
  cpu = host ? llvm_str(LLVMGetHostCPUName()) : nv_xstrdup(o->cpu);
  features = host ? llvm_str(LLVMGetHostCPUFeatures()) : nv_xstrdup("");
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
  /* the loop nests come tiled and vectorized: LLVM's O2 pipeline made the
   * same code as O1 (a 4-layer GPT, the MLP, GEMMs), in a third more time */
  snprintf(passes, sizeof passes, "default<O%d>", ol == 2 ? 1 : ol);
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

/* ---- parallel code generation ---------------------------------------
 * A large step is many functions (one per distinct loop nest): they are
 * split into parts of about equal size, one child process per part, each
 * keeping only its part's function bodies (the others become declarations,
 * every function external), and the objects are combined with `cc -r`. */

typedef struct parts {
  int n;        /* parts */
  int nfn;      /* defined llvm.func ops, in module order */
  int *of;      /* [nfn] the part of each */
} parts;

static bool defined_func(MlirOperation f) {
  MlirStringRef nm = mlirIdentifierStr(mlirOperationGetName(f));
  if (nm.length != 9 || memcmp(nm.data, "llvm.func", 9)) return false;
  MlirRegion r = mlirOperationGetRegion(f, 0);
  return !mlirRegionIsNull(r) && !mlirBlockIsNull(mlirRegionGetFirstBlock(r));
}

static MlirWalkResult count_op(MlirOperation op, void *ud) {
  (void)op;
  ++*(int64_t *)ud;
  return MlirWalkResultAdvance;
}

int64_t cg_count_ops(MlirOperation op) {
  int64_t n = 0;
  mlirOperationWalk(op, count_op, &n, MlirWalkPreOrder);
  return n;
}

/* Parts for M: largest function first onto the lightest part.  0, or -1
 * when M is better done in one piece (few functions, a global that is not
 * private: it would be defined in every part). */
static int split_module(MlirModule m, int nparts, parts *pt) {
  memset(pt, 0, sizeof *pt);
  int cap = 0;
  int64_t *size = NULL;
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    MlirStringRef nm = mlirIdentifierStr(mlirOperationGetName(f));
    if (nm.length == 16 && !memcmp(nm.data, "llvm.mlir.global", 16)) {
      nv_sbuf sb = {0};
      MlirAttribute l = mlirOperationGetAttributeByName(f, nova_str("linkage"));
      if (!mlirAttributeIsNull(l)) mlirAttributePrint(l, cg_print_to_sbuf, &sb);
      bool priv = sb.s && (strstr(sb.s, "private") || strstr(sb.s, "internal"));
      nv_sb_free(&sb);
      if (!priv) goto whole;
    }
    if (!defined_func(f)) continue;
    if (pt->nfn == cap) {
      int64_t *ns = nv_xrealloc(size, sizeof *ns * (size_t)(cap = cap ? 2 * cap : 256));
      if (!ns) goto whole;
      size = ns;
    }
    size[pt->nfn] = cg_count_ops(f);
    pt->nfn++;
  }
  if (pt->nfn < 4 * nparts) goto whole;
  pt->of = nv_xmalloc(sizeof *pt->of * (size_t)pt->nfn);
  int64_t load[8] = {0};
  bool *done = nv_xcalloc((size_t)pt->nfn, sizeof *done);
  if (!pt->of || !done) {
    free(done);
    goto whole;
  }
  for (int k = 0; k < pt->nfn; k++) {
    int big = -1, light = 0;
    for (int i = 0; i < pt->nfn; i++)
      if (!done[i] && (big < 0 || size[i] > size[big])) big = i;
    for (int q = 1; q < nparts; q++)
      if (load[q] < load[light]) light = q;
    done[big] = true;
    pt->of[big] = light;
    load[light] += size[big];
  }
  free(done);
  free(size);
  pt->n = nparts;
  return 0;
whole:
  free(size);
  free(pt->of);
  memset(pt, 0, sizeof *pt);
  return -1;
}

/* In the child for part K: the bodies of the other parts' functions are
 * dropped, and every function becomes external (a private one is hidden
 * again in the LLVM module, see emit_object_here). */
static void keep_part(MlirModule m, const parts *pt, int k) {
  MlirContext ctx = mlirOperationGetContext(mlirModuleGetOperation(m));
  MlirAttribute ext = mlirAttributeParseGet(ctx, nova_str("#llvm.linkage<external>"));
  int i = 0;
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    if (!defined_func(f)) continue;
    if (!mlirAttributeIsNull(ext)) mlirOperationSetAttributeByName(f, nova_str("linkage"), ext);
    if (pt->of[i++] != k) {
      MlirRegion tmp = mlirRegionCreate();
      mlirRegionTakeBody(tmp, mlirOperationGetRegion(f, 0));
      mlirRegionDestroy(tmp);
    }
  }
}

/* Runs emit_object_here in a child, its stderr into a pipe (*LOG, the read
 * end; a pipe needs no disk, so a full TMPDIR still leaves the child's
 * message), after KEEP (if any) trimmed the module to part K; -> the
 * child's pid or -1. */
static pid_t spawn_emit(nova_ctx *c, MlirModule m, const cg_options *o, const char *obj, const parts *pt, int k,
                        int *log) {
  int fds[2];
  *log = -1;
  if (pipe2(fds, O_CLOEXEC)) return -1;
  pid_t parent = getpid(), pid = fork();
  if (pid == 0) {
    nv_child_dies_with_parent(parent);
    dup2(fds[1], 2);
    if (pt) keep_part(m, pt, k);
    _exit(emit_object_here(c, m, o, obj) ? 1 : 0);
  }
  int e = errno;
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    errno = e;
    return -1;
  }
  *log = fds[0];
  return pid;
}

/* Reads the N pipes FDS to their ends (all at once: a child blocked on a
 * full pipe would never exit) into TEXT[k], at most 1 MiB each; closes them. */
static void read_logs(int *fds, nv_sbuf *text, int n) {
  struct pollfd pf[8];
  int open_n = 0;
  for (int k = 0; k < n; k++) {
    pf[k] = (struct pollfd){.fd = fds[k], .events = POLLIN};
    open_n += fds[k] >= 0;
    if (fds[k] < 0) pf[k].fd = -1;
  }
  char buf[4096];
  while (open_n > 0) {
    if (poll(pf, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int k = 0; k < n; k++) {
      if (pf[k].fd < 0 || !pf[k].revents) continue;
      ssize_t got = read(pf[k].fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        close(pf[k].fd);
        pf[k].fd = -1;
        open_n--;
      } else if (text[k].len < (1u << 20))
        nv_sb_printf(&text[k], "%.*s", (int)got, buf);
    }
  }
  for (int k = 0; k < n; k++)
    if (pf[k].fd >= 0) close(pf[k].fd);
}

/* Waits for PID; its messages (TEXT) become a diagnostic when it failed
 * (else its warnings are printed).  0 or -1. */
static int reap_emit(nova_ctx *c, const cg_options *o, pid_t pid, nv_sbuf *log, bool quiet) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  char *text = log->s;
  size_t len = log->len;
  int rc = WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
  if (rc && quiet) {
    /* reported once, by the first failing part */
  } else if (rc && text && strstr(text, "is not a recognized processor"))
    nv_error_plain(c->diag, "--cpu=%s: LLVM does not know this CPU (try host, x86-64, x86-64-v3, skylake-avx512, znver4)",
                   o->cpu ? o->cpu : "host");
  else if (rc) {
    /* the child's own diagnostics, or LLVM's fatal message */
    char *line = text ? strstr(text, "LLVM ERROR: ") : NULL;
    if (!line && text && *text) line = text;
    char *nl = line ? strchr(line, '\n') : NULL;
    if (nl) *nl = 0;
    char how[64] = "";
    if (WIFSIGNALED(st)) snprintf(how, sizeof how, " (killed by signal %d)", WTERMSIG(st));
    nv_error_plain(c->diag, "code generation failed: %s%s",
                   line ? line : "(the code generator stopped with no message)", how);
  } else if (text && len && !quiet)
    fputs(text, stderr); /* warnings */
  nv_sb_free(log);
  return rc;
}

/* Starts J's processes on M: one writing DIR/STEM.o, or one per part
 * writing DIR/STEM<k>.o; 0, or -1 (reported, nothing left running). */
static int start_job(nova_ctx *c, MlirModule m, const cg_options *o, const parts *pt, const char *dir,
                     const char *stem, cg_emit_job *j) {
  memset(j, 0, sizeof *j);
  fflush(NULL);
  for (int k = 0; k < (pt ? pt->n : 1); k++) {
    if (pt) snprintf(j->obj[k], sizeof j->obj[k], "%s/%s%d.o", dir, stem, k);
    else snprintf(j->obj[k], sizeof j->obj[k], "%s/%s.o", dir, stem);
    j->pid[k] = spawn_emit(c, m, o, j->obj[k], pt, k, &j->log[k]);
    if (j->pid[k] < 0) {
      nv_error_plain(c->diag, "cannot start code generation: %s", strerror(errno));
      cg_emit_wait(c, o, j, true);
      return -1;
    }
    j->n++;
    j->running = true;
  }
  return 0;
}

int cg_emit_start(nova_ctx *c, MlirModule m, const cg_options *o, const char *dir, const char *stem,
                  cg_emit_job *j) {
  parts pt;
  int jobs = nv_jobs();
  bool split = jobs >= 2 && !split_module(m, jobs, &pt);
  int rc = start_job(c, m, o, split ? &pt : NULL, dir, stem, j);
  if (split) free(pt.of);
  return rc;
}

int cg_emit_wait(nova_ctx *c, const cg_options *o, cg_emit_job *j, bool failed) {
  nv_sbuf texts[8] = {{0}};
  if (!j->running) return failed ? -1 : 0;
  read_logs(j->log, texts, j->n);
  int rc = failed ? -1 : 0;
  for (int k = 0; k < j->n; k++)
    if (reap_emit(c, o, j->pid[k], &texts[k], rc != 0)) rc = -1;
  j->running = false;
  return rc;
}

void cg_emit_cancel(cg_emit_job *j, bool keep) {
  for (int k = 0; k < j->n; k++) {
    if (j->running) {
      kill(j->pid[k], SIGKILL);
      close(j->log[k]);
      while (waitpid(j->pid[k], NULL, 0) < 0 && errno == EINTR) {}
    }
    if (!keep) unlink(j->obj[k]);
  }
  j->running = false;
  j->n = 0;
}

int cg_emit_object(nova_ctx *c, MlirModule m, const cg_options *o, const char *obj_path, char *cpu_used,
                   size_t cpu_size) {
  cg_cpu_name(o, cpu_used, cpu_size);
  parts pt;
  cg_emit_job j;
  int jobs = nv_jobs();
  if (jobs < 2 || split_module(m, jobs, &pt)) { /* straight into OBJ_PATH */
    int fd;
    nv_sbuf text = {0};
    fflush(NULL);
    pid_t pid = spawn_emit(c, m, o, obj_path, NULL, 0, &fd);
    if (pid < 0) {
      nv_error_plain(c->diag, "cannot start code generation: %s", strerror(errno));
      return -1;
    }
    read_logs(&fd, &text, 1);
    return reap_emit(c, o, pid, &text, false);
  }
  /* the parts and the combined object in a folder of their own */
  char dir[4096], out[8400], log[4200], cwd[4096];
  int lock;
  if (nv_tempdir_create(dir, sizeof dir, "novac-cg", &lock)) {
    nv_error_plain(c->diag, "cannot create a temporary folder: %s", strerror(errno));
    free(pt.of);
    return -1;
  }
  int slot = nv_temp_add(dir, 1);
  int rc = start_job(c, m, o, &pt, dir, "part", &j);
  free(pt.of);
  int started = j.n;
  if (!rc) rc = cg_emit_wait(c, o, &j, false);
  /* cc runs in DIR: the output path made absolute */
  if (obj_path[0] == '/') snprintf(out, sizeof out, "%s", obj_path);
  else if (getcwd(cwd, sizeof cwd)) snprintf(out, sizeof out, "%s/%s", cwd, obj_path);
  else rc = -1;
  if (!rc) {
    const char *cc = getenv("CC") && *getenv("CC") ? getenv("CC") : "cc";
    char *argv[16] = {(char *)cc, "-r", "-nostdlib", "-o", out};
    for (int k = 0; k < started; k++) argv[5 + k] = strrchr(j.obj[k], '/') + 1; /* (DIR may be relative) */
    argv[5 + started] = NULL;
    rc = cg_run_tool(c, dir, argv, o->verbose, "combining the object files");
  }
  for (int k = 0; k < started; k++) unlink(j.obj[k]);
  snprintf(log, sizeof log, "%s/tool.log", dir);
  unlink(log);
  snprintf(log, sizeof log, "%s/.lock", dir);
  unlink(log);
  rmdir(dir);
  close(lock);
  nv_temp_drop(slot);
  return rc;
}
