/* kernel_once.c: each distinct kernel tiled once.
 *
 * The layers of a model repeat, and so do their kernels: a chain of N
 * statements on one weight has N copies of one matmul+tanh kernel, a
 * 12-layer GPT twelve copies of each of its layer's kernels.  Tiling runs a
 * transform script whose greedy canonicalizations walk the whole function
 * each time (six times), which grew faster than the function (N^1.3).
 *
 * Requires: tensor IR, each op to tile marked nova.tile (cpu_tile.c).
 * Does (cg_kernels_split): gives each marked op a key, its structure
 * (cg_fingerprint: ops, attributes, types, its values from outside
 * numbered in the order it reads them) followed by what each outside value
 * is: a constant (its attribute, uniqued by the context), an empty tensor,
 * or another value, with its type.  Ops with equal keys compute the same
 * function of their outside values.  The first op of each key is cloned
 * into a function of its own in a new module (outside values as
 * arguments, constants and empty tensors cloned in); the script then
 * tiles that module, one small function per distinct kernel.
 * cg_kernels_join puts a copy of the tiled function in place of every op
 * of its key, its arguments bound to that op's outside values; or, in a
 * large step (CG_CALL_MIN_OPS kernel ops, NOVAC_KERNEL_CALLS), moves the
 * tiled function into the step as @__nova_tiled_K and makes each op of
 * its key a func.call of it, where every value passed is a scalar or a
 * whole tensor (else the op gets its copy).  One-shot bufferization then
 * bufferizes each kernel once, across the function boundary (it writes
 * into the tensors it is given where its analysis allows, and
 * cg_unshare_destinations gives each call its own empty or filled
 * destination); the calls stay calls through the memory plan, and
 * outlining makes the kernel's loop nests functions once and puts what is
 * left of the kernel (calls of them) in place of each call, so the entry
 * ends as it would with copies.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "codegen.h"

#define KERNEL_PREFIX "__nova_kernel_"
#define CG_TILED_PREFIX "__nova_tiled_"
/* kernel ops from which a step calls its kernels (cg_kernels_join): a
 * copy per op costs every later stage its size (an 8,000-statement chain:
 * 40 ops of tiled code per matmul, bufferized, outlined and deduplicated
 * again one by one) */
#define CG_CALL_MIN_OPS 2048

typedef struct vlist {
  MlirValue *v;
  int n, cap;
} vlist;

static void vlist_add(vlist *l, MlirValue v) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 8;
    l->v = nv_xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
  }
  l->v[l->n++] = v;
}

static int vlist_find(const vlist *l, MlirValue v) {
  for (int i = 0; i < l->n; i++)
    if (mlirValueEqual(l->v[i], v)) return i;
  return -1;
}

/* ---- an op's outside values ------------------------------------------------ */

static bool within(MlirOperation op, MlirOperation root) {
  for (; !mlirOperationIsNull(op); op = mlirOperationGetParentOperation(op))
    if (mlirOperationEqual(op, root)) return true;
  return false;
}

static MlirOperation value_site(MlirValue v) {
  return mlirValueIsAOpResult(v) ? mlirOpResultGetOwner(v)
                                 : mlirBlockGetParentOperation(mlirBlockArgumentGetOwner(v));
}

typedef struct outside_ctx {
  MlirOperation root;
  vlist *out;
} outside_ctx;

static MlirWalkResult outside_cb(MlirOperation op, void *ud) {
  outside_ctx *c = ud;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    if (!within(value_site(v), c->root) && vlist_find(c->out, v) < 0) vlist_add(c->out, v);
  }
  return MlirWalkResultAdvance;
}

/* The values OP reads from outside itself, each once, in walk order. */
static void outside_values(MlirOperation op, vlist *out) {
  out->n = 0;
  outside_ctx c = {op, out};
  mlirOperationWalk(op, outside_cb, &c, MlirWalkPreOrder);
}

/* Made inside each kernel's function rather than passed to it: a constant
 * (the canonicalizations fold it) or a static empty tensor (a destination
 * the tiling slices). */
static bool cloned_in(MlirValue v) {
  if (!mlirValueIsAOpResult(v)) return false;
  MlirOperation d = mlirOpResultGetOwner(v);
  return cg_op_is(d, "arith.constant") || cg_op_is(d, "ub.poison") ||
         (cg_op_is(d, "tensor.empty") && mlirOperationGetNumOperands(d) == 0);
}

static uint64_t outside_index(MlirValue v, void *ud) { return (uint64_t)vlist_find(ud, v); }

/* OP's structure (cg_fingerprint, its outside values numbered in walk
 * order), then what each outside value is. */
static void key_of(MlirOperation op, vlist *outside, uint64_t **key, size_t *n) {
  cg_fingerprint(op, outside_index, outside, key, n);
  *key = nv_xrealloc(*key, (*n + 3 * (size_t)outside->n + 1) * sizeof **key);
  for (int i = 0; i < outside->n; i++) {
    MlirValue v = outside->v[i];
    uint64_t kind = 0, attr = 0;
    if (cloned_in(v)) {
      MlirOperation d = mlirOpResultGetOwner(v);
      MlirAttribute a = mlirOperationGetAttributeByName(d, nova_str("value"));
      kind = 1 + (uint64_t)cg_op_is(d, "tensor.empty") + 2 * (uint64_t)cg_op_is(d, "ub.poison");
      attr = mlirAttributeIsNull(a) ? 0 : (uint64_t)(uintptr_t)a.ptr;
    }
    (*key)[(*n)++] = kind;
    (*key)[(*n)++] = attr;
    (*key)[(*n)++] = (uint64_t)(uintptr_t)mlirValueGetType(v).ptr;
  }
}

/* ---- keys -> kernels ------------------------------------------------------- */

typedef struct kernel {
  uint64_t *key;
  size_t nkey;
  uint64_t hash;
  MlirOperation fn; /* in the kernels' module */
  char name[48];    /* its copy's in the step's module, once called ("" before) */
} kernel;

struct cg_kernels {
  kernel *k;
  int n, cap;
  size_t *slot; /* open addressing: index + 1, 0 empty */
  size_t nslot;
  MlirOperation *member; /* the marked ops, and the kernel of each */
  int *of;
  size_t nmember;
  MlirModule host; /* the step's module */
  size_t called;   /* ops that cg_kernels_join made calls */
};

static void grow_slots(cg_kernels *ks) {
  size_t n = ks->nslot ? 2 * ks->nslot : 256;
  size_t *s = nv_xcalloc(n, sizeof *s);
  for (int i = 0; i < ks->n; i++) {
    size_t j = ks->k[i].hash & (n - 1);
    while (s[j]) j = (j + 1) & (n - 1);
    s[j] = (size_t)i + 1;
  }
  free(ks->slot);
  ks->slot = s;
  ks->nslot = n;
}

/* The kernel of KEY, or -1 with *SLOT where a new one goes. */
static int find_kernel(cg_kernels *ks, const uint64_t *key, size_t nkey, uint64_t h, size_t *slot) {
  if ((size_t)(ks->n + 1) * 2 > ks->nslot) grow_slots(ks);
  size_t j = h & (ks->nslot - 1);
  for (; ks->slot[j]; j = (j + 1) & (ks->nslot - 1)) {
    const kernel *k = &ks->k[ks->slot[j] - 1];
    if (k->hash == h && k->nkey == nkey && !memcmp(k->key, key, nkey * sizeof *key)) return (int)(ks->slot[j] - 1);
  }
  *slot = j;
  return -1;
}

/* Replaces, in OP and everything in it, each use of FROM[i] by TO[i]. */
typedef struct subst_ctx {
  const vlist *from;
  const MlirValue *to;
} subst_ctx;

static MlirWalkResult subst_cb(MlirOperation op, void *ud) {
  subst_ctx *c = ud;
  for (intptr_t i = 0; i < mlirOperationGetNumOperands(op); i++) {
    int k = vlist_find(c->from, mlirOperationGetOperand(op, i));
    if (k >= 0) mlirOperationSetOperand(op, i, c->to[k]);
  }
  return MlirWalkResultAdvance;
}

/* A function @NAME computing OP from its outside values: the passed ones
 * are its arguments, in order; the others are cloned in. */
static MlirOperation kernel_func(MlirOperation op, const vlist *outside, const char *name) {
  MlirContext ctx = mlirOperationGetContext(op);
  MlirLocation loc = mlirOperationGetLocation(op);
  int nin = 0, nres = (int)mlirOperationGetNumResults(op);
  MlirType *tin = nv_xcalloc((size_t)outside->n + 1, sizeof *tin), *tres = nv_xcalloc((size_t)nres + 1, sizeof *tres);
  for (int i = 0; i < outside->n; i++)
    if (!cloned_in(outside->v[i])) tin[nin++] = mlirValueGetType(outside->v[i]);
  for (int i = 0; i < nres; i++) tres[i] = mlirValueGetType(mlirOperationGetResult(op, i));
  MlirOperation ret;
  MlirOperation fn = cg_make_func(ctx, loc, name, nin, tin, nres, tres, &ret);
  MlirBlock entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(fn, 0));
  MlirValue *to = nv_xcalloc((size_t)outside->n + 1, sizeof *to);
  for (int i = 0, a = 0; i < outside->n; i++) {
    if (!cloned_in(outside->v[i])) {
      to[i] = mlirBlockGetArgument(entry, a++);
      continue;
    }
    MlirOperation d = mlirOperationClone(mlirOpResultGetOwner(outside->v[i]));
    mlirBlockInsertOwnedOperationBefore(entry, ret, d);
    to[i] = mlirOperationGetResult(d, 0);
  }
  MlirOperation body = mlirOperationClone(op);
  mlirBlockInsertOwnedOperationBefore(entry, ret, body);
  subst_ctx sc = {outside, to};
  mlirOperationWalk(body, subst_cb, &sc, MlirWalkPreOrder);
  MlirValue *res = nv_xcalloc((size_t)nres + 1, sizeof *res);
  for (int i = 0; i < nres; i++) res[i] = mlirOperationGetResult(body, i);
  mlirOperationSetOperands(ret, nres, res);
  free(tin);
  free(tres);
  free(to);
  free(res);
  return fn;
}

MlirModule cg_kernels_split(MlirModule m, const cg_op_list *marked, cg_kernels **out) {
  cg_kernels *ks = nv_xcalloc(1, sizeof *ks);
  ks->host = m;
  MlirOperation mop = mlirModuleGetOperation(m);
  MlirModule km = mlirModuleCreateEmpty(mlirOperationGetLocation(mop));
  /* what the kernels may refer to: the declarations */
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f)) {
    MlirRegion r = mlirOperationGetNumRegions(f) ? mlirOperationGetRegion(f, 0) : (MlirRegion){NULL};
    if (!mlirRegionIsNull(r) && !mlirBlockIsNull(mlirRegionGetFirstBlock(r))) continue;
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(km), mlirOperationClone(f));
  }
  ks->member = nv_xcalloc(marked->n + 1, sizeof *ks->member);
  ks->of = nv_xcalloc(marked->n + 1, sizeof *ks->of);
  ks->nmember = marked->n;
  vlist outside = {0};
  for (size_t i = 0; i < marked->n; i++) {
    MlirOperation op = marked->v[i];
    outside_values(op, &outside);
    uint64_t *key;
    size_t nkey;
    key_of(op, &outside, &key, &nkey);
    uint64_t h = nv_fnv1a64(1469598103934665603ull, key, nkey * sizeof *key);
    size_t slot = 0;
    int k = find_kernel(ks, key, nkey, h, &slot);
    if (k >= 0) {
      free(key);
    } else {
      if (ks->n == ks->cap) {
        ks->cap = ks->cap ? 2 * ks->cap : 64;
        ks->k = nv_xrealloc(ks->k, (size_t)ks->cap * sizeof *ks->k);
      }
      char name[48];
      snprintf(name, sizeof name, KERNEL_PREFIX "%d", ks->n);
      MlirOperation fn = kernel_func(op, &outside, name);
      mlirBlockAppendOwnedOperation(mlirModuleGetBody(km), fn);
      k = ks->n++;
      ks->k[k] = (kernel){key, nkey, h, fn, ""};
      ks->slot[slot] = (size_t)k + 1;
    }
    ks->member[i] = op;
    ks->of[i] = k;
  }
  free(outside.v);
  *out = ks;
  return km;
}

int cg_kernels_count(const cg_kernels *ks) { return ks->n; }

size_t cg_kernels_called(const cg_kernels *ks) { return ks->called; }

/* Whether the ops of kernel K are called rather than copied: see
 * cg_kernels_join.  NOVAC_KERNEL_CALLS=0 / 1 forces either way. */
static bool wants_calls(const cg_kernels *ks) {
  const char *e = getenv("NOVAC_KERNEL_CALLS");
  if (e && *e) return strcmp(e, "0") != 0;
  /* in a training step too since chunk.c cuts a piece after CG_CHUNK_ARGS
   * values from before it: one-shot's aliasing queries at a piece's call
   * grew with its arguments times its results, all written in place by
   * the kernels (a 1,000-weight chain with --train: 3.55 s in pieces of
   * 400 ops, 0.45 s with the cap, 0.67 s with copies) */
  return ks->nmember >= CG_CALL_MIN_OPS;
}

/* Whether a call can pass ARGS: one tensor at least (a kernel of
 * constants alone, a fill, stays a copy that cg_unshare_destinations can
 * recompute for each writer), and each a scalar or a whole tensor. */
static bool callable(const MlirValue *args, int n) {
  bool tensor = false;
  for (int i = 0; i < n; i++) {
    if (!cg_passes_whole(args[i])) return false;
    tensor |= mlirTypeIsARankedTensor(mlirValueGetType(args[i]));
  }
  return tensor;
}

/* Kernel K's tiled function, moved into the step's module the first time. */
static MlirStringRef placed(cg_kernels *ks, int k) {
  kernel *kn = &ks->k[k];
  if (!kn->name[0]) {
    snprintf(kn->name, sizeof kn->name, CG_TILED_PREFIX "%d", k);
    MlirOperation fn = mlirOperationClone(kn->fn);
    MlirContext ctx = mlirOperationGetContext(fn);
    mlirOperationSetAttributeByName(fn, nova_str("sym_name"), mlirStringAttrGet(ctx, nova_str(kn->name)));
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(ks->host), fn);
  }
  return nova_str(kn->name);
}

void cg_kernels_join(cg_kernels *ks) {
  vlist outside = {0};
  MlirValue *args = NULL, *res = NULL;
  bool calls = wants_calls(ks);
  for (size_t i = 0; i < ks->nmember; i++) {
    MlirOperation op = ks->member[i];
    outside_values(op, &outside);
    intptr_t nres = mlirOperationGetNumResults(op);
    args = nv_xrealloc(args, ((size_t)outside.n + 1) * sizeof *args);
    res = nv_xrealloc(res, ((size_t)nres + 1) * sizeof *res);
    int nin = 0;
    for (int a = 0; a < outside.n; a++)
      if (!cloned_in(outside.v[a])) args[nin++] = outside.v[a];
    if (calls && callable(args, nin)) {
      MlirType *rt = nv_xcalloc((size_t)nres + 1, sizeof *rt);
      for (intptr_t r = 0; r < nres; r++) rt[r] = mlirValueGetType(mlirOperationGetResult(op, r));
      MlirAttribute callee = mlirFlatSymbolRefAttrGet(mlirOperationGetContext(op), placed(ks, ks->of[i]));
      MlirOperation call = cg_insert_call(op, mlirOperationGetLocation(op), callee, nin, args, nres, rt);
      free(rt);
      for (intptr_t r = 0; r < nres; r++) res[r] = mlirOperationGetResult(call, r);
      ks->called++;
    } else {
      MlirOperation fn = mlirOperationClone(ks->k[ks->of[i]].fn);
      cg_inline_func(fn, op, args, res);
      mlirOperationDestroy(fn);
    }
    for (intptr_t r = 0; r < nres; r++) mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(op, r), res[r]);
    mlirOperationDestroy(op);
  }
  free(outside.v);
  free(args);
  free(res);
}

/* ---- the called kernels, after bufferization ------------------------------- */

/* K of a name @__nova_tiled_K, or -1. */
static int tiled_number(MlirStringRef n) {
  size_t p = strlen(CG_TILED_PREFIX);
  if (n.length <= p || n.length > p + 9 || memcmp(n.data, CG_TILED_PREFIX, p)) return -1;
  int k = 0;
  for (size_t i = p; i < n.length; i++) {
    if (n.data[i] < '0' || n.data[i] > '9') return -1;
    k = 10 * k + (n.data[i] - '0');
  }
  return k;
}

static int kernel_number(MlirOperation f) {
  MlirAttribute a = mlirOperationGetAttributeByName(f, nova_str("sym_name"));
  return mlirAttributeIsNull(a) || !mlirAttributeIsAString(a) ? -1 : tiled_number(mlirStringAttrGetValue(a));
}

/* a pointer-map key for the number K */
static const void *num_key(int k) { return (const void *)(uintptr_t)((size_t)k + 1); }

bool cg_is_tiled_kernel(MlirOperation f) { return cg_op_is(f, "func.func") && kernel_number(f) >= 0; }

/* K of a func.call of @__nova_tiled_K, or -1. */
static int called_number(MlirOperation op) {
  if (!cg_op_is(op, "func.call")) return -1;
  MlirAttribute c = mlirOperationGetAttributeByName(op, nova_str("callee"));
  return mlirAttributeIsNull(c) ? -1 : tiled_number(mlirFlatSymbolRefAttrGetValue(c));
}

bool cg_calls_tiled_kernel(MlirOperation op) { return called_number(op) >= 0; }

static MlirBlock func_body(MlirOperation f) { return mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0)); }

/* The kernel a func.call calls (in TAB), or null. */
static MlirOperation callee_of(MlirOperation call, const cg_ptrmap *tab, MlirOperation *funcs) {
  int t = called_number(call);
  int k = t < 0 ? -1 : cg_ptrmap_get(tab, num_key(t));
  return k < 0 ? (MlirOperation){NULL} : funcs[k];
}

/* The step's tiled kernels: *FUNCS (their number returned), TAB from
 * each one's K (num_key) to its index in *FUNCS. */
static int tiled_funcs(MlirModule m, MlirOperation **funcs, cg_ptrmap *tab) {
  int n = 0, cap = 0;
  *funcs = NULL;
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    if (cg_is_tiled_kernel(f) && !mlirBlockIsNull(func_body(f))) {
      if (n == cap) *funcs = nv_xrealloc(*funcs, sizeof **funcs * (size_t)(cap = cap ? 2 * cap : 16));
      (*funcs)[n++] = f;
    }
  cg_ptrmap_init(tab, (size_t)n);
  for (int i = 0; i < n; i++) cg_ptrmap_put(tab, num_key(kernel_number((*funcs)[i])), i);
  return n;
}

/* The calls of the kernels in the entry, each given to FN. */
static void each_call(MlirModule m, MlirOperation *funcs, const cg_ptrmap *tab,
                      void (*fn)(MlirOperation call, MlirOperation kernel, void *ud), void *ud) {
  MlirOperation entry = cg_entry_func(m);
  if (mlirOperationIsNull(entry)) return;
  for (MlirOperation op = mlirBlockGetFirstOperation(func_body(entry)), next; !mlirOperationIsNull(op); op = next) {
    next = mlirOperationGetNextInBlock(op);
    MlirOperation k = callee_of(op, tab, funcs);
    if (!mlirOperationIsNull(k)) fn(op, k, ud);
  }
}

/* Kernel K's result R is its argument drop[K][R] (-1: a result of its own). */
typedef struct dropped {
  const cg_ptrmap *tab;
  int **drop;
} dropped;

static void reread_arg(MlirOperation call, MlirOperation kfn, void *ud) {
  const dropped *d = ud;
  int k = cg_ptrmap_get(d->tab, num_key(kernel_number(kfn)));
  const int *drop = d->drop[k];
  if (!drop) return;
  intptr_t nres = mlirOperationGetNumResults(call), kept = 0;
  MlirType *rt = nv_xcalloc((size_t)nres + 1, sizeof *rt);
  for (intptr_t r = 0; r < nres; r++)
    if (drop[r] < 0) rt[kept++] = mlirValueGetType(mlirOperationGetResult(call, r));
  intptr_t nops = mlirOperationGetNumOperands(call);
  MlirValue *ops = nv_xcalloc((size_t)nops + 1, sizeof *ops);
  for (intptr_t i = 0; i < nops; i++) ops[i] = mlirOperationGetOperand(call, i);
  MlirAttribute callee = mlirOperationGetAttributeByName(call, nova_str("callee"));
  MlirOperation nc = cg_insert_call(call, mlirOperationGetLocation(call), callee, nops, ops, kept, rt);
  for (intptr_t r = 0, j = 0; r < nres; r++)
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(call, r),
                                  drop[r] < 0 ? mlirOperationGetResult(nc, j++) : ops[drop[r]]);
  mlirOperationDestroy(call);
  free(rt);
  free(ops);
}

/* What V is once the loops that carry a buffer unchanged are seen
 * through (a result of scf.for whose body yields its iteration argument
 * is that argument's initial value): the buffer a kernel returns, for
 * buffer-results-to-out-params to recognize its allocation (it copies
 * a loop's result into the out-parameter instead). */
static MlirValue through_loops(MlirValue v, int depth) {
  for (; depth < 64 && mlirValueIsAOpResult(v); depth++) {
    MlirOperation loop = mlirOpResultGetOwner(v);
    if (!cg_op_is(loop, "scf.for")) break;
    intptr_t r = mlirOpResultGetResultNumber(v);
    MlirBlock body = mlirRegionGetFirstBlock(mlirOperationGetRegion(loop, 0));
    MlirOperation y = mlirBlockGetTerminator(body);
    /* the body yields its argument, perhaps through inner loops */
    if (r >= mlirOperationGetNumOperands(y) ||
        !mlirValueEqual(through_loops(mlirOperationGetOperand(y, r), depth + 1), mlirBlockGetArgument(body, r + 1)))
      break;
    v = mlirOperationGetOperand(loop, 3 + r);
  }
  return v;
}

void cg_tiled_results(MlirModule m) {
  MlirOperation *funcs;
  cg_ptrmap tab;
  int n = tiled_funcs(m, &funcs, &tab);
  int **drop = nv_xcalloc((size_t)n + 1, sizeof *drop);
  for (int k = 0; k < n; k++) {
    MlirBlock b = func_body(funcs[k]);
    MlirOperation ret = mlirBlockGetTerminator(b);
    intptr_t nres = mlirOperationGetNumOperands(ret), kept = 0;
    int *d = nv_xcalloc((size_t)nres + 1, sizeof *d);
    MlirValue *keep = nv_xcalloc((size_t)nres + 1, sizeof *keep);
    MlirType *rt = nv_xcalloc((size_t)nres + 1, sizeof *rt);
    bool any = false;
    for (intptr_t r = 0; r < nres; r++) {
      MlirValue v = through_loops(mlirOperationGetOperand(ret, r), 0);
      bool arg = mlirValueIsABlockArgument(v) && mlirBlockEqual(mlirBlockArgumentGetOwner(v), b);
      d[r] = arg ? (int)mlirBlockArgumentGetArgNumber(v) : -1;
      any |= arg;
      if (!arg) keep[kept] = v, rt[kept++] = mlirValueGetType(v);
    }
    mlirOperationSetOperands(ret, kept, keep);
    if (any) {
      MlirContext ctx = mlirOperationGetContext(ret);
      intptr_t na = mlirBlockGetNumArguments(b);
      MlirType *at = nv_xcalloc((size_t)na + 1, sizeof *at);
      for (intptr_t a = 0; a < na; a++) at[a] = mlirValueGetType(mlirBlockGetArgument(b, a));
      mlirOperationSetAttributeByName(funcs[k], nova_str("function_type"),
                                      mlirTypeAttrGet(mlirFunctionTypeGet(ctx, na, at, kept, rt)));
      free(at);
      drop[k] = d;
    } else {
      free(d);
    }
    free(keep);
    free(rt);
  }
  dropped dd = {&tab, drop};
  each_call(m, funcs, &tab, reread_arg, &dd);
  for (int k = 0; k < n; k++) free(drop[k]);
  free(drop);
  free(funcs);
  cg_ptrmap_free(&tab);
}

/* A copy of the kernel KFN's body in place of CALL. */
static void inline_call(MlirOperation call, MlirOperation kfn, void *ud) {
  (void)ud;
  intptr_t nops = mlirOperationGetNumOperands(call), nres = mlirOperationGetNumResults(call);
  MlirValue *ops = nv_xcalloc((size_t)nops + 1, sizeof *ops), *res = nv_xcalloc((size_t)nres + 1, sizeof *res);
  for (intptr_t i = 0; i < nops; i++) ops[i] = mlirOperationGetOperand(call, i);
  MlirOperation fn = mlirOperationClone(kfn);
  cg_inline_func(fn, call, ops, res);
  mlirOperationDestroy(fn);
  for (intptr_t r = 0; r < nres; r++) mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(call, r), res[r]);
  mlirOperationDestroy(call);
  free(ops);
  free(res);
}

static MlirWalkResult find_alloc(MlirOperation op, void *ud) {
  if (cg_op_is(op, "memref.alloc") || cg_op_is(op, "memref.alloca") || cg_op_is(op, "memref.dealloc")) {
    *(bool *)ud = true;
    return MlirWalkResultInterrupt;
  }
  return MlirWalkResultAdvance;
}

/* The kernels that ALL says (all, or those that allocate) inlined at
 * their calls and erased. */
static void inline_kernels(MlirModule m, bool all) {
  MlirOperation *funcs;
  cg_ptrmap tab, pick;
  int n = tiled_funcs(m, &funcs, &tab), np = 0;
  MlirOperation *chosen = nv_xcalloc((size_t)n + 1, sizeof *chosen);
  for (int k = 0; k < n; k++) {
    bool allocates = false;
    if (!all) mlirOperationWalk(funcs[k], find_alloc, &allocates, MlirWalkPreOrder);
    if (all || allocates) chosen[np++] = funcs[k];
  }
  cg_ptrmap_init(&pick, (size_t)np);
  for (int i = 0; i < np; i++) cg_ptrmap_put(&pick, num_key(kernel_number(chosen[i])), i);
  if (np) each_call(m, chosen, &pick, inline_call, NULL);
  for (int i = 0; i < np; i++) mlirOperationDestroy(chosen[i]);
  free(chosen);
  free(funcs);
  cg_ptrmap_free(&tab);
  cg_ptrmap_free(&pick);
}

void cg_tiled_settle(MlirModule m) { inline_kernels(m, false); }

void cg_tiled_inline_all(MlirModule m) { inline_kernels(m, true); }

void cg_kernels_free(cg_kernels *ks) {
  if (!ks) return;
  for (int i = 0; i < ks->n; i++) free(ks->k[i].key);
  free(ks->k);
  free(ks->slot);
  free(ks->member);
  free(ks->of);
  free(ks);
}
