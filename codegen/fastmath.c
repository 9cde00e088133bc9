/* fastmath.c: exp and erf of f32 as arithmetic, so that they vectorize.
 *
 * LLVM lowers math.exp and math.erf on vectors to one libm call per lane
 * (expf, erff): in a transformer's step (softmax, cross-entropy, GELU and
 * their backwards) those scalar calls took 7% of the time.  Before the cpu
 * target's tiling, every f32 math.exp and math.erf in a linalg body becomes
 * a short sequence of arith/math ops that the vectorizer turns into vector
 * instructions:
 *
 *   exp(x): n = floor(x log2(e) + 1/2), r = x - n ln2 (ln2 in two parts,
 *     |r| <= ln2/2), exp(r) by its Taylor polynomial to r^7 (truncation
 *     below 6e-9 relative), times 2^n built in the exponent bits, as two
 *     factors 2^(n/2) so that n from -150 to 128 stays representable; x is
 *     clamped to [-104, 88.72284] (below: 0, as expf gives), above: +inf,
 *     NaN stays NaN.  Measured against float64: at most 0.9 ulp.
 *   erf(x): x P(x^2) / Q(x^2) on [-4, 4] (P, Q of degree 5, fitted for
 *     relative error; measured in f32: at most 4e-7), clamped to [-1, 1]; beyond 4
 *     erf is 1 to f32 precision.
 *
 * Only at -O1 and above on the cpu target; f64 keeps libm.
 */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"

typedef struct fm {
  MlirContext ctx;
  MlirBlock block;
  MlirOperation ref;
  MlirLocation loc;
  MlirType f32, i32;
} fm;

static MlirValue op(fm *b, const char *name, int n, MlirValue a0, MlirValue a1, MlirValue a2, MlirType t) {
  MlirValue ops[3] = {a0, a1, a2};
  MlirOperationState st = mlirOperationStateGet(nova_str(name), b->loc);
  mlirOperationStateAddOperands(&st, n, ops);
  mlirOperationStateAddResults(&st, 1, &t);
  MlirOperation o = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(b->block, b->ref, o);
  return mlirOperationGetResult(o, 0);
}

static MlirValue constant(fm *b, MlirAttribute value, MlirType t) {
  MlirNamedAttribute a = mlirNamedAttributeGet(mlirIdentifierGet(b->ctx, nova_str("value")), value);
  MlirOperationState st = mlirOperationStateGet(nova_str("arith.constant"), b->loc);
  mlirOperationStateAddAttributes(&st, 1, &a);
  mlirOperationStateAddResults(&st, 1, &t);
  MlirOperation o = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(b->block, b->ref, o);
  return mlirOperationGetResult(o, 0);
}

static MlirValue cf(fm *b, double v) { return constant(b, mlirFloatAttrDoubleGet(b->ctx, b->f32, v), b->f32); }
static MlirValue ci(fm *b, int64_t v) { return constant(b, mlirIntegerAttrGet(b->i32, v), b->i32); }

static MlirValue f2(fm *b, const char *name, MlirValue x, MlirValue y) { return op(b, name, 2, x, y, x, b->f32); }
static MlirValue fma3(fm *b, MlirValue x, MlirValue y, MlirValue z) { return op(b, "math.fma", 3, x, y, z, b->f32); }

static MlirValue cmpf(fm *b, int pred, MlirValue x, MlirValue y) {
  MlirValue ops[2] = {x, y};
  MlirType i1 = mlirIntegerTypeGet(b->ctx, 1);
  MlirNamedAttribute a = mlirNamedAttributeGet(mlirIdentifierGet(b->ctx, nova_str("predicate")),
                                               mlirIntegerAttrGet(mlirIntegerTypeGet(b->ctx, 64), pred));
  MlirOperationState st = mlirOperationStateGet(nova_str("arith.cmpf"), b->loc);
  mlirOperationStateAddOperands(&st, 2, ops);
  mlirOperationStateAddAttributes(&st, 1, &a);
  mlirOperationStateAddResults(&st, 1, &i1);
  MlirOperation o = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(b->block, b->ref, o);
  return mlirOperationGetResult(o, 0);
}

#define CMPF_OGT 2
#define CMPF_UNO 14

/* Horner: c[0] + t (c[1] + t (... c[n-1])). */
static MlirValue horner(fm *b, const double *c, int n, MlirValue t) {
  MlirValue r = cf(b, c[n - 1]);
  for (int i = n - 2; i >= 0; i--) r = fma3(b, r, t, cf(b, c[i]));
  return r;
}

/* 2^(n) for an i32 n in [-254, 254] as two normal factors multiplied into P. */
static MlirValue scale(fm *b, MlirValue p, MlirValue n) {
  MlirValue h = op(b, "arith.shrsi", 2, n, ci(b, 1), n, b->i32);
  MlirValue g = op(b, "arith.subi", 2, n, h, n, b->i32);
  MlirValue s[2];
  MlirValue e[2] = {h, g};
  for (int i = 0; i < 2; i++) {
    MlirValue biased = op(b, "arith.addi", 2, e[i], ci(b, 127), e[i], b->i32);
    s[i] = op(b, "arith.bitcast", 1, op(b, "arith.shli", 2, biased, ci(b, 23), biased, b->i32), n, n, b->f32);
  }
  return f2(b, "arith.mulf", f2(b, "arith.mulf", p, s[0]), s[1]);
}

static MlirValue exp_f32(fm *b, MlirValue x) {
  static const double taylor[8] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040};
  MlirValue xc = f2(b, "arith.minimumf", f2(b, "arith.maximumf", x, cf(b, -104.0)), cf(b, 88.72284));
  MlirValue nf = op(b, "math.floor", 1, fma3(b, xc, cf(b, 1.4426950408889634), cf(b, 0.5)), x, x, b->f32);
  MlirValue r = fma3(b, nf, cf(b, -0.693359375), xc);
  r = fma3(b, nf, cf(b, 2.12194440e-4), r);
  MlirValue p = horner(b, taylor, 8, r);
  MlirValue res = scale(b, p, op(b, "arith.fptosi", 1, nf, x, x, b->i32));
  MlirValue big = cmpf(b, CMPF_OGT, x, cf(b, 88.72284));
  MlirType f32 = b->f32;
  res = op(b, "arith.select", 3, big, cf(b, __builtin_inf()), res, f32);
  return op(b, "arith.select", 3, cmpf(b, CMPF_UNO, x, x), x, res, f32);
}

static MlirValue erf_f32(fm *b, MlirValue x) {
  static const double P[6] = {1.1283791658969498, 0.18010045055513693, 0.05158180431933441,
                              0.003379832696338524, 0.0002858110627511726, 2.2522128232743826e-06};
  static const double Q[6] = {1.0, 0.4929431564228019, 0.11002787434722236, 0.01418569781994407,
                              0.0010871516300552193, 4.024367871349903e-05};
  MlirValue xc = f2(b, "arith.minimumf", f2(b, "arith.maximumf", x, cf(b, -4.0)), cf(b, 4.0));
  MlirValue t = f2(b, "arith.mulf", xc, xc);
  MlirValue q = f2(b, "arith.divf", horner(b, P, 6, t), horner(b, Q, 6, t));
  MlirValue r = f2(b, "arith.mulf", xc, q);
  return f2(b, "arith.minimumf", f2(b, "arith.maximumf", r, cf(b, -1.0)), cf(b, 1.0));
}

static MlirWalkResult collect(MlirOperation o, void *ud) {
  if ((!cg_op_is(o, "math.exp") && !cg_op_is(o, "math.erf")) || mlirOperationGetNumResults(o) != 1 ||
      !mlirTypeIsAF32(mlirValueGetType(mlirOperationGetResult(o, 0))))
    return MlirWalkResultAdvance;
  MlirOperation parent = mlirOperationGetParentOperation(o);
  if (mlirOperationIsNull(parent) || !cg_op_is(parent, "linalg.generic")) return MlirWalkResultAdvance;
  return cg_op_list_push(ud, o) ? MlirWalkResultAdvance : MlirWalkResultInterrupt;
}

int cg_fast_math(nova_ctx *c, MlirModule m) {
  if (getenv("NOVAC_LIBM")) return 0;
  cg_op_list w = {0};
  mlirOperationWalk(mlirModuleGetOperation(m), collect, &w, MlirWalkPreOrder);
  if (w.oom) {
    free(w.v);
    nv_error_plain(c->diag, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < w.n; i++) {
    MlirOperation o = w.v[i];
    fm b = {c->ctx, mlirOperationGetBlock(o), o, mlirOperationGetLocation(o), mlirF32TypeGet(c->ctx),
            mlirIntegerTypeGet(c->ctx, 32)};
    MlirValue x = mlirOperationGetOperand(o, 0);
    MlirValue r = cg_op_is(o, "math.exp") ? exp_f32(&b, x) : erf_f32(&b, x);
    mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(o, 0), r);
    mlirOperationDestroy(o);
  }
  free(w.v);
  return w.n ? nova_verify(c, m, "expanding exp and erf") : 0;
}
