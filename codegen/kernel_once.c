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
 * of its key, its arguments bound to that op's outside values.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../driver/util.h"
#include "codegen.h"

#define KERNEL_PREFIX "__nova_kernel_"

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
} kernel;

struct cg_kernels {
  kernel *k;
  int n, cap;
  size_t *slot; /* open addressing: index + 1, 0 empty */
  size_t nslot;
  MlirOperation *member; /* the marked ops, and the kernel of each */
  int *of;
  size_t nmember;
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
      ks->k[k] = (kernel){key, nkey, h, fn};
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

void cg_kernels_join(cg_kernels *ks) {
  vlist outside = {0};
  MlirValue *args = NULL, *res = NULL;
  for (size_t i = 0; i < ks->nmember; i++) {
    MlirOperation op = ks->member[i];
    outside_values(op, &outside);
    intptr_t nres = mlirOperationGetNumResults(op);
    args = nv_xrealloc(args, ((size_t)outside.n + 1) * sizeof *args);
    res = nv_xrealloc(res, ((size_t)nres + 1) * sizeof *res);
    int nin = 0;
    for (int a = 0; a < outside.n; a++)
      if (!cloned_in(outside.v[a])) args[nin++] = outside.v[a];
    MlirOperation fn = mlirOperationClone(ks->k[ks->of[i]].fn);
    cg_inline_func(fn, op, args, res);
    mlirOperationDestroy(fn);
    for (intptr_t r = 0; r < nres; r++) mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(op, r), res[r]);
    mlirOperationDestroy(op);
  }
  free(outside.v);
  free(args);
  free(res);
}

void cg_kernels_free(cg_kernels *ks) {
  if (!ks) return;
  for (int i = 0; i < ks->n; i++) free(ks->k[i].key);
  free(ks->k);
  free(ks->slot);
  free(ks->member);
  free(ks->of);
  free(ks);
}
