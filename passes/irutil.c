/* irutil.c: small queries on MLIR operations, and the runner of pass
 * pipelines, shared by the passes and the code generators. */
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../support/util.h"
#include "passes.h"
#include "mlir-c/BuiltinAttributes.h"
#include "mlir-c/BuiltinTypes.h"

bool cg_op_is(MlirOperation op, const char *name) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  return s.length == strlen(name) && !memcmp(s.data, name, s.length);
}

MlirOperation cg_entry_func(MlirModule m) {
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    if (cg_op_is(f, "func.func") && mlirAttributeIsNull(mlirOperationGetAttributeByName(f, nova_str("sym_visibility"))) &&
        !mlirBlockIsNull(mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0))))
      return f;
  return (MlirOperation){NULL};
}

bool cg_op_list_push(cg_op_list *l, MlirOperation op) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    MlirOperation *v = nv_xrealloc(l->v, cap * sizeof *v);
    if (!v) {
      l->oom = true;
      return false;
    }
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = op;
  return true;
}

/* The references to renamed functions, replaced in one walk (symbol
 * reference attributes are uniqued: the old reference's pointer is the
 * key).  A walk of the whole module per function, as the symbol table's
 * replaceAllSymbolUses does, made renaming quadratic in the functions. */
typedef struct renames {
  cg_ptrmap map; /* old FlatSymbolRefAttr -> index */
  MlirAttribute *to;
} renames;

static MlirAttribute renamed(const renames *r, MlirAttribute a) {
  int k = mlirAttributeIsAFlatSymbolRef(a) ? cg_ptrmap_get(&r->map, a.ptr) : -1;
  return k >= 0 ? r->to[k] : mlirAttributeGetNull();
}

static MlirWalkResult rename_cb(MlirOperation op, void *ud) {
  const renames *r = ud;
  for (intptr_t i = 0, n = mlirOperationGetNumAttributes(op); i < n; i++) {
    MlirNamedAttribute na = mlirOperationGetAttribute(op, i);
    MlirAttribute to = renamed(r, na.attribute);
    if (mlirAttributeIsAArray(na.attribute)) { /* e.g. a list of constructors */
      intptr_t ne = mlirArrayAttrGetNumElements(na.attribute);
      bool any = false;
      for (intptr_t e = 0; e < ne && !any; e++) any = !mlirAttributeIsNull(renamed(r, mlirArrayAttrGetElement(na.attribute, e)));
      if (any) {
        MlirAttribute *el = nv_xcalloc((size_t)ne + 1, sizeof *el);
        for (intptr_t e = 0; e < ne; e++) {
          MlirAttribute x = mlirArrayAttrGetElement(na.attribute, e), y = renamed(r, x);
          el[e] = mlirAttributeIsNull(y) ? x : y;
        }
        to = mlirArrayAttrGet(mlirOperationGetContext(op), ne, el);
        free(el);
      }
    }
    if (!mlirAttributeIsNull(to)) mlirOperationSetAttributeByName(op, mlirIdentifierStr(na.name), to);
  }
  return MlirWalkResultAdvance;
}

int cg_prefix_symbols(MlirModule m, const char *prefix) {
  MlirStringRef symattr = mlirSymbolTableGetSymbolAttributeName();
  MlirContext ctx = mlirModuleGetContext(m);
  size_t nf = 0;
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    nf++;
  renames r = {.to = nv_xcalloc(nf + 1, sizeof *r.to)};
  cg_ptrmap_init(&r.map, nf);
  int k = 0;
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    if (!cg_op_is(f, "llvm.func") && !cg_op_is(f, "func.func")) continue;
    MlirRegion reg = mlirOperationGetRegion(f, 0);
    if (mlirRegionIsNull(reg) || mlirBlockIsNull(mlirRegionGetFirstBlock(reg))) continue; /* a declaration */
    MlirAttribute name = mlirOperationGetAttributeByName(f, symattr);
    if (mlirAttributeIsNull(name) || !mlirAttributeIsAString(name)) continue;
    MlirStringRef old = mlirStringAttrGetValue(name);
    char buf[512];
    snprintf(buf, sizeof buf, "%s%.*s", prefix, (int)old.length, old.data);
    MlirStringRef nw = mlirStringRefCreateFromCString(buf);
    cg_ptrmap_put(&r.map, mlirFlatSymbolRefAttrGet(ctx, old).ptr, k);
    r.to[k++] = mlirFlatSymbolRefAttrGet(ctx, nw);
    mlirOperationSetAttributeByName(f, symattr, mlirStringAttrGet(ctx, nw));
  }
  mlirOperationWalk(mlirModuleGetOperation(m), rename_cb, &r, MlirWalkPreOrder);
  cg_ptrmap_free(&r.map);
  free(r.to);
  return 0;
}

MlirOperation cg_make_func(MlirContext ctx, MlirLocation loc, const char *name, int nin, const MlirType *tin, int nout,
                           const MlirType *tout, MlirOperation *ret) {
  MlirLocation *locs = nv_xcalloc((size_t)nin + 1, sizeof *locs);
  for (int i = 0; i < nin; i++) locs[i] = loc;
  MlirBlock entry = mlirBlockCreate(nin, tin, locs);
  free(locs);
  MlirRegion region = mlirRegionCreate();
  mlirRegionAppendOwnedBlock(region, entry);
  MlirOperationState rs = mlirOperationStateGet(nova_str("func.return"), loc);
  *ret = mlirOperationCreate(&rs);
  mlirBlockAppendOwnedOperation(entry, *ret);
  MlirNamedAttribute fa[3] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("sym_name")), mlirStringAttrGet(ctx, nova_str(name))),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("function_type")),
                            mlirTypeAttrGet(mlirFunctionTypeGet(ctx, nin, tin, nout, tout))),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("sym_visibility")), mlirStringAttrGet(ctx, nova_str("private")))};
  MlirOperationState fs = mlirOperationStateGet(nova_str("func.func"), loc);
  mlirOperationStateAddAttributes(&fs, 3, fa);
  mlirOperationStateAddOwnedRegions(&fs, 1, &region);
  return mlirOperationCreate(&fs);
}

MlirOperation cg_insert_call(MlirOperation at, MlirLocation loc, MlirAttribute callee, intptr_t nops, const MlirValue *ops,
                             intptr_t nres, const MlirType *rt) {
  MlirContext ctx = mlirOperationGetContext(at);
  MlirOperationState cs = mlirOperationStateGet(nova_str("func.call"), loc);
  MlirNamedAttribute c = mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("callee")), callee);
  mlirOperationStateAddOperands(&cs, nops, ops);
  mlirOperationStateAddResults(&cs, nres, rt);
  mlirOperationStateAddAttributes(&cs, 1, &c);
  MlirOperation call = mlirOperationCreate(&cs);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(at), at, call);
  return call;
}

void cg_inline_func(MlirOperation fn, MlirOperation at, const MlirValue *args, MlirValue *results) {
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
  MlirOperation ret = mlirBlockGetTerminator(entry);
  for (intptr_t a = 0; a < mlirBlockGetNumArguments(entry); a++)
    mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(entry, a), args[a]);
  for (intptr_t r = 0; r < mlirOperationGetNumOperands(ret); r++) results[r] = mlirOperationGetOperand(ret, r);
  for (MlirOperation op = mlirBlockGetFirstOperation(entry); !mlirOperationEqual(op, ret);) {
    MlirOperation next = mlirOperationGetNextInBlock(op);
    mlirOperationMoveBefore(op, at);
    op = next;
  }
}

static size_t ptr_slot(const cg_ptrmap *h, const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x & (h->cap - 1);
}

void cg_ptrmap_init(cg_ptrmap *h, size_t n) {
  h->cap = 64;
  while (h->cap < 2 * n + 64) h->cap *= 2;
  h->key = nv_xcalloc(h->cap, sizeof *h->key);
  h->val = nv_xcalloc(h->cap, sizeof *h->val);
}

void cg_ptrmap_put(cg_ptrmap *h, const void *p, int v) {
  size_t s = ptr_slot(h, p);
  while (h->key[s] && h->key[s] != p) s = (s + 1) & (h->cap - 1);
  h->key[s] = p;
  h->val[s] = v;
}

int cg_ptrmap_get(const cg_ptrmap *h, const void *p) {
  for (size_t s = ptr_slot(h, p); h->key[s]; s = (s + 1) & (h->cap - 1))
    if (h->key[s] == p) return h->val[s];
  return -1;
}

void cg_ptrmap_free(cg_ptrmap *h) {
  free(h->key);
  free(h->val);
  h->key = NULL;
  h->val = NULL;
}

/* ---- an op's structure as a token sequence ---------------------------------
 * Equal sequences, equal functions but for their names and locations: each
 * op in walk order gives its name, attributes and types (uniqued by the
 * context: the pointers identify them), its operands as (op index, result)
 * or (block index, argument), its regions' blocks with their argument
 * types, and its successors; every list is preceded by its length. */

typedef struct tokens {
  uint64_t *v;
  size_t n, cap;
  cg_ptrmap ops, blocks;
  int nops, nblocks;
  MlirIdentifier sym_name;
  cg_outside_fn outside;
  void *ud;
} tokens;

static void tok(tokens *t, uint64_t x) {
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 256;
    t->v = nv_xrealloc(t->v, t->cap * sizeof *t->v);
  }
  t->v[t->n++] = x;
}

static void tok_block(tokens *t, MlirBlock b) {
  int k = cg_ptrmap_get(&t->blocks, b.ptr);
  tok(t, k < 0 ? UINT64_MAX : (uint64_t)k);
}

static MlirWalkResult tok_cb(MlirOperation op, void *ud) {
  tokens *t = ud;
  cg_ptrmap_put(&t->ops, op.ptr, t->nops++);
  tok(t, (uint64_t)(uintptr_t)mlirOperationGetName(op).ptr);
  intptr_t na = mlirOperationGetNumAttributes(op);
  tok(t, (uint64_t)na);
  for (intptr_t i = 0; i < na; i++) {
    MlirNamedAttribute a = mlirOperationGetAttribute(op, i);
    bool own_name = mlirIdentifierEqual(a.name, t->sym_name) && cg_op_is(op, "func.func");
    tok(t, (uint64_t)(uintptr_t)a.name.ptr);
    tok(t, own_name ? 0 : (uint64_t)(uintptr_t)a.attribute.ptr);
  }
  intptr_t nr = mlirOperationGetNumResults(op);
  tok(t, (uint64_t)nr);
  for (intptr_t i = 0; i < nr; i++) tok(t, (uint64_t)(uintptr_t)mlirValueGetType(mlirOperationGetResult(op, i)).ptr);
  intptr_t no = mlirOperationGetNumOperands(op);
  tok(t, (uint64_t)no);
  for (intptr_t i = 0; i < no; i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    int k = mlirValueIsAOpResult(v) ? cg_ptrmap_get(&t->ops, mlirOpResultGetOwner(v).ptr)
                                    : cg_ptrmap_get(&t->blocks, mlirBlockArgumentGetOwner(v).ptr);
    if (k < 0) { /* from outside the op */
      tok(t, UINT64_MAX);
      tok(t, t->outside ? t->outside(v, t->ud) : UINT64_MAX);
    } else if (mlirValueIsAOpResult(v)) {
      tok(t, (uint64_t)k << 1);
      tok(t, (uint64_t)mlirOpResultGetResultNumber(v));
    } else {
      tok(t, (uint64_t)k << 1 | 1);
      tok(t, (uint64_t)mlirBlockArgumentGetArgNumber(v));
    }
  }
  intptr_t ng = mlirOperationGetNumRegions(op);
  tok(t, (uint64_t)ng);
  for (intptr_t g = 0; g < ng; g++) {
    size_t at = t->n;
    tok(t, 0);
    uint64_t nb = 0;
    for (MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, g)); !mlirBlockIsNull(b);
         b = mlirBlockGetNextInRegion(b), nb++) {
      cg_ptrmap_put(&t->blocks, b.ptr, t->nblocks++);
      intptr_t nargs = mlirBlockGetNumArguments(b);
      tok(t, (uint64_t)nargs);
      for (intptr_t i = 0; i < nargs; i++) tok(t, (uint64_t)(uintptr_t)mlirValueGetType(mlirBlockGetArgument(b, i)).ptr);
    }
    t->v[at] = nb;
  }
  intptr_t ns = mlirOperationGetNumSuccessors(op);
  tok(t, (uint64_t)ns);
  for (intptr_t i = 0; i < ns; i++) tok_block(t, mlirOperationGetSuccessor(op, i));
  return MlirWalkResultAdvance;
}

static MlirWalkResult count_one(MlirOperation op, void *ud) {
  (void)op;
  ++*(size_t *)ud;
  return MlirWalkResultAdvance;
}

static size_t count_ops(MlirOperation fn) {
  size_t n = 0;
  mlirOperationWalk(fn, count_one, &n, MlirWalkPreOrder);
  return n;
}

void cg_fingerprint(MlirOperation op, cg_outside_fn outside, void *ud, uint64_t **tokv, size_t *ntok) {
  size_t n = count_ops(op);
  tokens t = {.sym_name = mlirIdentifierGet(mlirOperationGetContext(op), mlirSymbolTableGetSymbolAttributeName()),
              .outside = outside,
              .ud = ud};
  cg_ptrmap_init(&t.ops, n);
  cg_ptrmap_init(&t.blocks, 2 * n); /* at most a few blocks an op */
  mlirOperationWalk(op, tok_cb, &t, MlirWalkPreOrder);
  cg_ptrmap_free(&t.ops);
  cg_ptrmap_free(&t.blocks);
  *tokv = t.v;
  *ntok = t.n;
}


MlirWalkResult cg_remap_cb(MlirOperation op, void *ud) {
  const cg_remap *c = ud;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    int k = cg_ptrmap_get(c->map, mlirOperationGetOperand(op, i).ptr);
    if (k >= 0) mlirOperationSetOperand(op, i, c->to[k]);
  }
  return MlirWalkResultAdvance;
}

void cg_print_to_sbuf(MlirStringRef s, void *ud) { nv_sb_printf(ud, "%.*s", (int)s.length, s.data); }

/* ---- running pass pipelines ---- */

static void err_cb(MlirStringRef s, void *ud) { nv_sb_printf(ud, "%.*s", (int)s.length, s.data); }

static pthread_once_t passes_once = PTHREAD_ONCE_INIT;
static void register_passes(void) { mlirRegisterAllPasses(); }

/* Wall time; NOVAC_DEBUG_PIPELINES=cpu: the process's CPU time (steadier on
 * a busy machine; with NOVAC_JOBS=1, one thread's). */
double cg_now_ms(void) {
  struct timespec ts;
  const char *e = getenv("NOVAC_DEBUG_PIPELINES");
  clock_gettime(e && !strcmp(e, "cpu") ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The process's peak resident size so far, in MiB (NOVAC_DEBUG_PIPELINES
 * prints it beside each stage's time: a stage that makes it jump holds what
 * it built). */
double cg_peak_rss_mib(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) ? 0 : ru.ru_maxrss / 1024.0;
}

/* Runs a textual pipeline on m; 0 on success (NOVAC_DEBUG_PIPELINES: its
 * time on stderr). */
int cg_run_pipeline(nova_ctx *c, MlirModule m, const char *pipeline, const char *stage) {
  pthread_once(&passes_once, register_passes);
  MlirPassManager pm = mlirPassManagerCreate(c->ctx);
  /* the IR is verified at the end of each stage (nova_verify); verifying
   * after every pass as well costs a tenth of a large step's compile time */
  if (!getenv("NOVAC_VERIFY_EACH_PASS")) mlirPassManagerEnableVerifier(pm, false);
  if (getenv("NOVAC_DEBUG_PASS_TIMING")) mlirPassManagerEnableTiming(pm); /* a report per pipeline, on stderr */
  nv_sbuf err = {0};
  int rc = 0;
  const char *dump = getenv("NOVAC_DEBUG_IR_BEFORE"); /* a stage name: the module it starts from, on stderr */
  static bool dumped; /* the first pipeline of that stage only */
  if (dump && !strcmp(dump, stage) && !dumped) {
    dumped = true;
    MlirOpPrintingFlags fl = mlirOpPrintingFlagsCreate();
    mlirOpPrintingFlagsEnableDebugInfo(fl, true, false);
    nv_sbuf b = {0};
    mlirOperationPrintWithFlags(mlirModuleGetOperation(m), fl, cg_print_to_sbuf, &b);
    fputs(b.s ? b.s : "", stderr);
    nv_sb_free(&b);
    mlirOpPrintingFlagsDestroy(fl);
  }
  double t0 = cg_now_ms();
  if (mlirLogicalResultIsFailure(mlirParsePassPipeline(mlirPassManagerGetAsOpPassManager(pm),
                                                       nova_str(pipeline), err_cb, &err))) {
    nv_error_plain(c->diag, "internal: bad %s pipeline: %s", stage, err.s ? err.s : "");
    rc = -1;
  } else if (mlirLogicalResultIsFailure(mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(m)))) {
    nv_error_plain(c->diag, "%s failed (see the messages above)", stage);
    rc = -1;
  }
  if (getenv("NOVAC_DEBUG_PIPELINES"))
    fprintf(stderr, "novac: %8.1f ms %6.0f MiB  %.200s\n", cg_now_ms() - t0, cg_peak_rss_mib(), pipeline);
  nv_sb_free(&err);
  mlirPassManagerDestroy(pm);
  return rc;
}
