/* cpu_tile.c: tiling and vectorization of linalg on tensors for the CPU.
 *
 * Requires: a verified linalg-on-tensors module (cg_lower_to_linalg's
 * output) after elementwise fusion (cg_fuse: a tiled op no longer fuses)
 * and before bufferization.
 * Produces: the same module in which each linalg op this file knows how to
 * schedule became scf.for loops over vector ops (vector.transfer_read/write
 * on tensors, vector.fma, ...); ops it does not know, or whose
 * transformation fails, stay as they are and become scalar loops later
 * (convert-linalg-to-loops).  The lowering after bufferization then needs
 * the vector passes: convert-vector-to-scf{full-unroll=1} before
 * convert-scf-to-cf, convert-vector-to-llvm, and convert-ub-to-llvm after
 * it (cg_lower_loops_to_llvm).  Bufferized, a tiled op is a chain of loops
 * that carry their memref (scf.for iter_args yielding it unchanged): a
 * buffer is live until the last use of any loop result derived from it.
 *
 * How: each op gets a discardable attribute nova.tile = K, and a transform
 * script (printed here, the sizes written into it) tiles op K, marks the
 * tiled op (nova.vec, nova.vecc for contractions) and peels every loop
 * whose trip count the tile does not divide, so that every tile,
 * remainders included, has a static shape.  The script then vectorizes
 * the marked ops and simplifies the vector code: tensor slices folded into
 * the transfers, the C tile of a contraction carried in registers across
 * its K loop (loop.hoist_loop_invariant_subsets), leading unit dims
 * dropped, vector.contract lowered to broadcast-FMA outer products,
 * multi-reductions to vector reductions.
 *
 * Schedules (no search; every size from the configurator):
 *   contraction C[.., m, n] += A[.., k] B[.., k.., n] (linalg.matmul and
 *     mul-add generics, rewritten as linalg.contract over C's dims plus one
 *     k, several k dims collapsed into one; n contiguous in B and C):
 *     outer dims by 1, m by mr (or a divisor of M in [mr/2, mr]), n by nr,
 *     then k by 1 inside; mr x nr from cfg_gemm_cpu (nr = 2 vectors, mr from
 *     the vector registers).  Loops n outside m, so the K x nr panel of B is
 *     reused across the m tiles (BLIS order jr, ir; no packing).  A k of
 *     2048 or more is first split into cache blocks (m by mc, k by kc).
 *   elementwise (all-parallel generic, fill, transpose): the innermost dim
 *     by the vector lanes of cfg_pointwise_cpu, the others by 1.
 *   reductions (generic with reduction iterators): innermost dim parallel:
 *     as elementwise, the reduction loops moved inside (the accumulator
 *     stays in a register); innermost dim reduced: one vector per row when
 *     the row is at most CG_TILE_MAX_ROW elements, else the row in chunks
 *     of whole vectors (the largest chunk up to CG_TILE_MAX_ROW that divides
 *     it; a row no multiple of the vector lanes stays scalar), each chunk
 *     reduced into the output in turn.
 * Ops left alone: contractions given to the runtime's kernels
 * (nova.ukernel, cpu_ukernel.c), dynamic shapes, i1/index element types (f16/bf16 but in
 * elementwise ops), maps
 * that are not projected permutations (convolution windows), bodies with
 * tensor.extract (gathers) or ops outside arith/math.
 * Numerics: the same operations in the same order as the scalar loops,
 * except that a contraction's multiply-add is fused (FMA).
 *
 * Failure policy: each op's tiling runs in its own failures(suppress)
 * sequence, each op's vectorization too, so a silenceable failure leaves
 * that op (or tile) scalar.  A definite failure of the script, or a module
 * that no longer verifies, restores the module as it was before this pass
 * (a clone taken first) and leaves a note: the compile goes on with the
 * scalar code.  MLIR diagnostics raised meanwhile are captured, not
 * reported as errors.
 *
 * NOVAC_DEBUG_TILE=1 prints the plans, the script and the module before
 * and after; NOVAC_TILE=0 turns the pass off (to bisect);
 * NOVAC_TILE_FAULT=1 makes the script fail at its end (tests).
 */
#include <mlir-c/AffineExpr.h>
#include <mlir-c/AffineMap.h>
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/Dialect/Linalg.h>
#include <mlir-c/Dialect/Transform/Interpreter.h>
#include <stdlib.h>
#include <string.h>

#include "../configurator/gemm.h"
#include "../configurator/kernel.h"
#include "../support/util.h"
#include "codegen.h"
#include "cpu_tile.h"

/* Longest reduced row vectorized as one vector (elements): a row of
 * vector<256xf32> is 16 zmm registers, about what unrolling pays for. */
#define CG_TILE_MAX_ROW 256

typedef enum tile_kind { TK_NONE = 0, TK_CONTRACT, TK_POINTWISE, TK_REDUCE } tile_kind;

typedef struct tile_plan {
  tile_kind kind;
  int n;                  /* loops */
  int64_t range[MAXL];    /* static loop ranges */
  bool red[MAXL];         /* reduction loop */
  int64_t tile[MAXL];     /* first tiling, 0 = not tiled */
  int inter[MAXL];        /* loop order of the first tiling (a permutation) */
  bool interchange;
  int kdim;               /* TK_CONTRACT: the k loop, tiled by 1 inside; else -1 */
  int64_t block[MAXL];    /* TK_CONTRACT with a long k: the cache blocks (m by mc, k by kc) tiled
                             first, the ranges above then those of one block; else all 0 */
  bool blocked;
} tile_plan;

#define CG_TILE_BLOCK_K 2048  /* contractions with at least this k get cache blocks */

/* ---- reading a linalg op -------------------------------------------- */

static bool name_starts(MlirOperation op, const char *prefix) {
  MlirStringRef s = mlirIdentifierStr(mlirOperationGetName(op));
  return s.length >= strlen(prefix) && !memcmp(s.data, prefix, strlen(prefix));
}

/* Element types the vector code handles like the scalar code: i1 vectors
 * are bit-packed in memory; f16/bf16 only in elementwise ops (plan_op:
 * their conversions to and from f32, and data movement). */
static bool is_half(MlirType t) { return mlirTypeIsAF16(t) || mlirTypeIsABF16(t); }

static bool vec_elem_ok(MlirType t) {
  if (mlirTypeIsAF32(t) || mlirTypeIsAF64(t) || is_half(t)) return true;
  if (mlirTypeIsAInteger(t)) {
    unsigned w = mlirIntegerTypeGetWidth(t);
    return w == 32 || w == 64;
  }
  return false;
}

static int elem_bytes(MlirType t) {
  if (mlirTypeIsAF64(t)) return 8;
  if (is_half(t)) return 2;
  if (mlirTypeIsAInteger(t)) return (int)mlirIntegerTypeGetWidth(t) / 8;
  return 4;
}

typedef struct body_check {
  bool ok;
} body_check;

static MlirWalkResult body_cb(MlirOperation op, void *ud) {
  body_check *b = ud;
  if (name_starts(op, "arith.") || name_starts(op, "math.") || cg_op_is(op, "linalg.yield") ||
      cg_op_is(op, "linalg.index") || cg_op_is(op, "linalg.generic") || cg_op_is(op, "linalg.matmul") ||
      cg_op_is(op, "linalg.fill") || cg_op_is(op, "linalg.transpose"))
    return MlirWalkResultAdvance;
  b->ok = false;
  return MlirWalkResultInterrupt;
}

/* Loop ranges and reduction loops from the indexing maps and the operand
 * shapes; false unless every operand is a static tensor (or a scalar) of a
 * vectorizable element type and every map a projected permutation (dims and
 * the constant 0). */
static bool read_loops(MlirOperation op, tile_plan *p, int *ebytes, bool *half) {
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  if (mlirAttributeIsNull(maps) || !mlirAttributeIsAArray(maps)) return false;
  intptr_t nops = mlirOperationGetNumOperands(op), nmaps = mlirArrayAttrGetNumElements(maps);
  if (nmaps != nops || nops < 1) return false;
  p->n = -1;
  *ebytes = 4;
  bool seen[MAXL] = {0}, in_out[MAXL] = {0};
  for (intptr_t i = 0; i < nops; i++) {
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    int nd = (int)mlirAffineMapGetNumDims(m);
    if (p->n < 0) p->n = nd;
    if (nd != p->n || nd > MAXL || nd < 1) return false;
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    bool out = i == nops - 1; /* one output: checked by the caller */
    if (!mlirTypeIsARankedTensor(t)) {
      if (out || mlirAffineMapGetNumResults(m) != 0 || !vec_elem_ok(t)) return false;
      continue;
    }
    MlirType et = mlirShapedTypeGetElementType(t);
    /* an i1 scalar read by every element (a training step's finite check,
     * the condition of each guarded update) is one load and a broadcast */
    bool flag = !out && mlirShapedTypeGetRank(t) == 0 && mlirTypeIsAInteger(et) && mlirIntegerTypeGetWidth(et) == 1;
    if (!mlirShapedTypeHasStaticShape(t) || (!vec_elem_ok(et) && !flag)) return false;
    *half |= is_half(et);
    if (out) *ebytes = elem_bytes(et);
    intptr_t nr = mlirAffineMapGetNumResults(m);
    if (nr != mlirShapedTypeGetRank(t)) return false;
    for (intptr_t r = 0; r < nr; r++) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, r);
      int64_t size = mlirShapedTypeGetDimSize(t, r);
      if (mlirAffineExprIsAConstant(e) && mlirAffineConstantExprGetValue(e) == 0) continue;
      if (!mlirAffineExprIsADim(e)) return false;
      int d = (int)mlirAffineDimExprGetPosition(e);
      if (seen[d] && p->range[d] != size) return false;
      seen[d] = true;
      p->range[d] = size;
      if (out) in_out[d] = true;
    }
  }
  for (int d = 0; d < p->n; d++) {
    if (!seen[d] || p->range[d] < 1) return false;
    p->red[d] = !in_out[d];
  }
  return true;
}

/* The m tile: MR from the configurator, or the largest size in
 * [MR/2, MR] that divides M (no remainder tile, a little less reuse). */
static int64_t m_tile(int64_t M, int64_t mr) {
  if (M <= mr) return 0;
  for (int64_t t = mr; 2 * t >= mr; t--)
    if (M % t == 0) return t;
  return mr;
}

static int64_t tile_or_full(int64_t range, int64_t t) { return range <= t ? 0 : t; }

/* The schedule of one op from the device model; kind TK_NONE: left alone. */
static tile_plan plan_op(MlirOperation op, const cfg_device *dev) {
  tile_plan p = {.kind = TK_NONE, .kdim = -1};
  bool generic = cg_op_is(op, "linalg.generic");
  if (!generic && !cg_op_is(op, "linalg.matmul") && !cg_op_is(op, "linalg.contract") && !cg_op_is(op, "linalg.fill") &&
      !cg_op_is(op, "linalg.transpose"))
    return p;
  if (mlirOperationGetNumResults(op) != 1) return p;
  /* a contraction given to the runtime's kernel (cpu_ukernel.c) */
  if (!mlirAttributeIsNull(mlirOperationGetDiscardableAttributeByName(op, nova_str("nova.ukernel")))) return p;
  int eb;
  bool half = false;
  if (!read_loops(op, &p, &eb, &half)) return (tile_plan){.kind = TK_NONE};
  if (generic) {
    body_check b = {true};
    mlirOperationWalk(op, body_cb, &b, MlirWalkPreOrder);
    if (!b.ok) return (tile_plan){.kind = TK_NONE};
  }
  for (int d = 0; d < p.n; d++) p.inter[d] = d;
  int nred = 0;
  for (int d = 0; d < p.n; d++) nred += p.red[d];
  if (half && nred) return (tile_plan){.kind = TK_NONE};
  int last = p.n - 1;
  cdims cd;
  if (nred && cg_op_is(op, "linalg.contract") && cg_contraction_dims(op, p.n, &cd)) {
    int64_t kk = 1;
    for (int d = 0; d < p.n; d++)
      if (cd.k[d]) kk *= p.range[d];
    cfg_gemm_cpu_schedule s = cfg_gemm_cpu(dev, p.range[cd.m_inner], p.range[cd.n], kk, eb);
    if (!s.ok) return (tile_plan){.kind = TK_NONE};
    p.kind = TK_CONTRACT;
    for (int d = 0; d < p.n; d++) p.tile[d] = p.range[d] == 1 ? 0 : 1; /* batch, outer m and k loops */
    p.tile[cd.m_inner] = m_tile(p.range[cd.m_inner], s.mr);
    p.tile[cd.n] = tile_or_full(p.range[cd.n], s.nr);
    p.tile[cd.k_inner] = 0;
    p.kdim = cd.k_inner;
    /* A long k (at least CG_TILE_BLOCK_K): cache blocks first, mc x kc of A
     * reused from L2 across every n tile (the blocks divide M and K: the
     * tiles inside keep static shapes).  kc is 4x the configurator's packed
     * BLIS kc (half of L1): without packing, the C tile is loaded and stored
     * once per k block, and 2048^3 measured 181 ms at kc 512 (4x), 223 ms at
     * 128 (1x), 288 ms unblocked, on one Zen 4 core.  The m blocks run in
     * parallel (disjoint rows of C), the k blocks in order inside each. */
    int64_t kc = 0, mc = 0;
    for (int64_t t = 4 * s.kc; kk == p.range[cd.k_inner] && t >= 64 && !kc; t--)
      if (p.range[cd.k_inner] % t == 0) kc = t;
    int64_t mc_max = s.mc; /* and at least one m block per core, for the threads */
    if (s.threads > 1 && p.range[cd.m_inner] / s.threads >= 4 * s.mr && p.range[cd.m_inner] / s.threads < mc_max)
      mc_max = p.range[cd.m_inner] / s.threads;
    for (int64_t t = mc_max; kc && t >= 4 * s.mr && !mc; t--)
      if (p.range[cd.m_inner] % t == 0) mc = t;
    if (kk >= CG_TILE_BLOCK_K && kc && mc && cd.m_inner < cd.k_inner) {
      p.blocked = true;
      p.block[cd.m_inner] = mc < p.range[cd.m_inner] ? mc : 0;
      p.block[cd.k_inner] = kc;
      p.range[cd.m_inner] = mc;
      p.range[cd.k_inner] = kc;
      p.tile[cd.m_inner] = m_tile(mc, s.mr);
    }
    /* n outside m: the B micro-panel is reused across the m tiles */
    int j = 0;
    for (int d = 0; d < p.n; d++)
      if (d != cd.m_inner && d != cd.n && d != cd.k_inner) p.inter[j++] = d;
    p.inter[j++] = cd.n, p.inter[j++] = cd.m_inner, p.inter[j++] = cd.k_inner;
    p.interchange = true;
    return p;
  }
  int64_t lanes = cfg_pointwise_cpu(dev, 1, eb).lanes;
  if (lanes < 1) lanes = 1;
  for (int d = 0; d < p.n; d++) p.tile[d] = p.range[d] == 1 ? 0 : 1;
  if (!nred) {
    p.kind = TK_POINTWISE;
    p.tile[last] = tile_or_full(p.range[last], lanes);
    return p;
  }
  p.kind = TK_REDUCE;
  if (p.red[last]) {
    p.tile[last] = 0;
    if (p.range[last] > CG_TILE_MAX_ROW) {
      /* a longer row in chunks of whole vectors (the largest that divides
       * it), the partial sums carried from chunk to chunk in the output */
      int64_t chunk = CG_TILE_MAX_ROW / lanes * lanes;
      while (chunk >= lanes && p.range[last] % chunk) chunk -= lanes;
      if (chunk < lanes) return (tile_plan){.kind = TK_NONE};
      p.tile[last] = chunk;
    }
  } else {
    p.tile[last] = tile_or_full(p.range[last], lanes);
  }
  /* parallel loops outside, reduction loops inside, each group in order */
  int j = 0;
  for (int d = 0; d < p.n; d++)
    if (!p.red[d]) p.inter[j++] = d;
  for (int d = 0; d < p.n; d++)
    if (p.red[d]) p.inter[j++] = d;
  p.interchange = true;
  return p;
}

/* ---- the script ------------------------------------------------------ */


static void print_sizes(nv_sbuf *b, const int64_t *t, int n) {
  nv_sb_printf(b, "[");
  for (int i = 0; i < n; i++) nv_sb_printf(b, "%s%lld", i ? ", " : "", (long long)t[i]);
  nv_sb_printf(b, "]");
}

/* tile_using_for on %SRC giving %tDST and loop handles %lDST_0.. */
static int emit_tile(nv_sbuf *b, const char *src, const char *dst, const int64_t *t, int n, const int *inter) {
  int nloops = 0;
  for (int i = 0; i < n; i++) nloops += t[i] != 0;
  nv_sb_printf(b, "      %%t%s", dst);
  for (int i = 0; i < nloops; i++) nv_sb_printf(b, ", %%l%s_%d", dst, i);
  nv_sb_printf(b, " = transform.structured.tile_using_for %%%s tile_sizes ", src);
  print_sizes(b, t, n);
  if (inter) {
    int64_t it[MAXL];
    for (int i = 0; i < n; i++) it[i] = inter[i];
    nv_sb_printf(b, " interchange = ");
    print_sizes(b, it, n);
  }
  nv_sb_printf(b, " : (!transform.any_op) -> (!transform.any_op");
  for (int i = 0; i < nloops; i++) nv_sb_printf(b, ", !transform.op<\"scf.for\">");
  nv_sb_printf(b, ")\n");
  return nloops;
}

/* The sequence for one op %o: tile, mark for vectorization, peel. */
static void emit_op(nv_sbuf *b, const tile_plan *p) {
  /* the loops of the first tiling, outermost first: which need a remainder */
  int nl = 0;
  bool peel[MAXL];
  for (int i = 0; i < p->n; i++) {
    int d = p->inter[i];
    if (p->tile[d]) peel[nl++] = p->range[d] % p->tile[d] != 0;
  }
  const char *src = "o";
  if (p->blocked) { /* the cache blocks: m (if split) then k, in loop order */
    emit_tile(b, "o", "b", p->block, p->n, NULL);
    src = "tb";
  }
  emit_tile(b, src, "1", p->tile, p->n, p->interchange ? p->inter : NULL);
  /* the outermost loop runs over a parallel dimension: its iterations
   * write disjoint tiles (outline.c may share them out) */
  for (int i = 0; i < p->n; i++) {
    int d = p->blocked ? i : p->inter[i];
    int64_t t = p->blocked ? p->block[d] : p->tile[d];
    if (!t) continue;
    if (!p->red[d])
      nv_sb_printf(b, "      transform.annotate %%%s_0 \"nova.par\" : !transform.op<\"scf.for\">\n",
                   p->blocked ? "lb" : "l1");
    break;
  }
  const char *vec = "t1";
  if (p->kdim >= 0 && p->range[p->kdim] > 1) {
    int64_t kt[MAXL] = {0};
    kt[p->kdim] = 1;
    emit_tile(b, "t1", "2", kt, p->n, NULL);
    vec = "t2";
  }
  nv_sb_printf(b, "      transform.annotate %%%s \"%s\" : !transform.any_op\n", vec,
               p->kind == TK_CONTRACT ? "nova.vecc" : "nova.vec");
  for (int i = nl - 1; i >= 0; i--) /* innermost first: outer peels clone the inner remainders */
    if (peel[i])
      nv_sb_printf(b, "      %%p%d, %%q%d = transform.loop.peel %%l1_%d : (!transform.op<\"scf.for\">)"
                      " -> (!transform.any_op, !transform.any_op)\n", i, i, i);
}

/* The ops marked nova.tile = ID share one sequence TEXT (layers repeat:
 * one match per distinct plan, not per op), applied to each of them. */
static void emit_group(nv_sbuf *b, int id, const char *text) {
  nv_sb_printf(b,
               "    %%g%d = transform.structured.match attributes{nova.tile = %d : i64} in %%root"
               " : (!transform.any_op) -> !transform.any_op\n"
               "    transform.foreach %%g%d : !transform.any_op {\n"
               "    ^bb0(%%r: !transform.any_op):\n"
               "      transform.sequence %%r : !transform.any_op failures(suppress) {\n"
               "      ^bb1(%%o: !transform.any_op):\n%s"
               "      }\n"
               "    }\n",
               id, id, id, text);
}

/* Vectorizes each op marked nova.vec that has static shapes (the others
 * fail silently and stay marked). */
#define VECTORIZE_ATTR(H, ATTR, FLAGS)                                                                   \
  "    %" H " = transform.structured.match attributes{" ATTR "} in %root"                                   \
  " : (!transform.any_op) -> !transform.any_op\n"                                                          \
  "    transform.foreach %" H " : !transform.any_op {\n"                                                      \
  "    ^bb0(%o: !transform.any_op):\n"                                                                      \
  "      transform.sequence %o : !transform.any_op failures(suppress) {\n"                                  \
  "      ^bb1(%o2: !transform.any_op):\n"                                                                   \
  "        transform.structured.vectorize %o2 " FLAGS ": !transform.any_op\n"                               \
  "      }\n"                                                                                               \
  "    }\n"
/* Contraction tiles (linalg.contract) become vector.contract directly. */
#define VECTORIZE_MARKED(H) \
  VECTORIZE_ATTR(H "a", "nova.vec", "") VECTORIZE_ATTR(H "b", "nova.vecc", "{create_named_contraction} ")

/* Reductions of products to vector.contract, before any canonicalization
 * folds a multi_reduction over a unit dim into a plain add. */
#define TO_CONTRACT                                 \
  "    transform.apply_patterns to %f {\n"           \
  "      transform.apply_patterns.vector.reduction_to_contract\n" \
  "    } : !transform.any_op\n"

/* After every op's tiling: vectorize the tiles that are static already
 * (before canonicalization folds a unit-dim transpose into a slice copy),
 * canonicalize (the remainders of peeled loops become static), vectorize
 * the rest, then simplify: matmul tiles to vector.contract, tensor slices
 * folded into the transfers, the C tile hoisted out of the K loop into
 * registers, leading unit dims dropped, contractions lowered to
 * broadcast-FMA outer products, multi-reductions to vector reductions. */
static const char *SCRIPT_TAIL =
    "    %f = transform.structured.match ops{[\"func.func\"]} in %root : (!transform.any_op) -> !transform.any_op\n"
    VECTORIZE_MARKED("v1")
    TO_CONTRACT
    "    transform.apply_patterns to %f {\n"
    "      transform.apply_patterns.canonicalization\n"
    "    } : !transform.any_op\n"
    VECTORIZE_MARKED("v2")
    TO_CONTRACT
    "    transform.apply_patterns to %f {\n"
    "      transform.apply_patterns.vector.transfer_permutation_patterns\n"
    "      transform.apply_patterns.tensor.fold_tensor_subset_ops_into_vector_transfers\n"
    "      transform.apply_patterns.canonicalization\n"
    "    } : !transform.any_op\n"
    "    %loops = transform.structured.match ops{[\"scf.for\"]} in %root : (!transform.any_op) -> !transform.any_op\n"
    "    transform.apply_cse to %loops : !transform.any_op\n"
    "    transform.loop.hoist_loop_invariant_subsets %loops : !transform.any_op\n"
    "    transform.apply_patterns to %f {\n"
    "      transform.apply_patterns.tensor.fold_tensor_subset_ops_into_vector_transfers\n"
    "      transform.apply_patterns.canonicalization\n"
    "    } : !transform.any_op\n"
    "    transform.apply_patterns to %f {\n"
    "      transform.apply_patterns.vector.cast_away_vector_leading_one_dim\n"
    "      transform.apply_patterns.canonicalization\n"
    "    } : !transform.any_op\n"
    "    transform.apply_patterns to %f {\n"
    "      transform.apply_patterns.vector.lower_contraction lowering_strategy = \"outerproduct\"\n"
    "      transform.apply_patterns.vector.lower_outerproduct\n"
    "      transform.apply_patterns.vector.lower_multi_reduction lowering_strategy = \"innerreduction\"\n"
    "      transform.apply_patterns.canonicalization\n"
    "    } : !transform.any_op\n";

static const char *SCRIPT_END = "    transform.yield\n  }\n}\n";

/* NOVAC_TILE_FAULT=1 (tests): the script fails after it transformed
 * everything, which must leave the module as it was. */
static const char *SCRIPT_FAULT =
    "    %fault = transform.cast %f : !transform.any_op to !transform.op<\"scf.for\">\n";

/* An all-parallel generic that reads its own destination (an in-place
 * update, inplace.c: ins(.., P, ..) outs(P) with the same map) reads it
 * through the output block argument instead.  Same values; but once tiled,
 * each tile then reads the loop-carried tensor it writes rather than the
 * original P, which lets one-shot bufferization keep the update in P's
 * buffer. */
static void read_dest_in_place(MlirOperation op) {
  if (!cg_op_is(op, "linalg.generic") || mlirOperationGetNumResults(op) != 1) return;
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  intptr_t n = mlirOperationGetNumOperands(op);
  if (mlirAttributeIsNull(maps) || mlirArrayAttrGetNumElements(maps) != n) return;
  MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (mlirBlockIsNull(b) || mlirBlockGetNumArguments(b) != n) return;
  MlirValue dest = mlirOperationGetOperand(op, n - 1);
  MlirAttribute dmap = mlirArrayAttrGetElement(maps, n - 1);
  for (intptr_t i = 0; i < n - 1; i++)
    if (mlirValueEqual(mlirOperationGetOperand(op, i), dest) &&
        mlirAttributeEqual(mlirArrayAttrGetElement(maps, i), dmap))
      mlirValueReplaceAllUsesOfWith(mlirBlockGetArgument(b, i), mlirBlockGetArgument(b, n - 1));
}

/* ---- marking, snapshots, diagnostics --------------------------------- */

typedef struct marker {
  const cfg_device *dev;
  nv_sbuf *script;
  MlirContext ctx;
  int next;
  int counts[4];
  bool debug;
  char **texts;   /* [next]: the sequence of plan ID */
  cg_op_list marked;
  bool oom;
} marker;

static void mark_func(marker *mk, MlirOperation func) {
  MlirRegion r = mlirOperationGetFirstRegion(func);
  if (mlirRegionIsNull(r)) return;
  MlirBlock body = mlirRegionGetFirstBlock(r);
  if (mlirBlockIsNull(body)) return;
  for (MlirOperation o = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(o);
       o = mlirOperationGetNextInBlock(o)) {
    tile_plan p = plan_op(o, mk->dev);
    if (p.kind == TK_POINTWISE) read_dest_in_place(o);
    if (p.kind == TK_REDUCE ||
        (p.kind == TK_NONE && (cg_op_is(o, "linalg.matmul") || cg_op_is(o, "linalg.generic")))) {
      /* (a reduction too long for a row of vectors may still be a contraction) */
      /* a contraction the register tile suits, once rewritten? */
      MlirOperation lc = cg_static_operands(o) ? cg_to_contract(mk->ctx, o) : (MlirOperation){NULL};
      if (!mlirOperationIsNull(lc)) o = lc, p = plan_op(lc, mk->dev);
    }
    if (p.kind == TK_NONE) continue;
    nv_sbuf t = {0};
    emit_op(&t, &p);
    int id = 0;
    while (id < mk->next && t.s && strcmp(mk->texts[id], t.s)) id++;
    if (t.oom || !t.s) {
      mk->oom = true;
      nv_sb_free(&t);
      continue;
    }
    if (id == mk->next) {
      char **nt = nv_xrealloc(mk->texts, sizeof *nt * (size_t)(mk->next + 1));
      if (!nt) {
        mk->oom = true;
        nv_sb_free(&t);
        continue;
      }
      mk->texts = nt;
      mk->texts[mk->next++] = t.s;
    } else {
      nv_sb_free(&t);
    }
    mk->counts[p.kind]++;
    mlirOperationSetDiscardableAttributeByName(o, nova_str("nova.tile"),
                                               mlirIntegerAttrGet(mlirIntegerTypeGet(mk->ctx, 64), id));
    cg_op_list_push(&mk->marked, o);
    if (mk->debug) {
      static const char *kn[] = {"-", "contract", "pointwise", "reduce"};
      fprintf(stderr, "// nova.tile = %d: %s, ranges", id, kn[p.kind]);
      for (int d = 0; d < p.n; d++) fprintf(stderr, " %lld%s", (long long)p.range[d], p.red[d] ? "r" : "");
      fprintf(stderr, ", tiles");
      for (int d = 0; d < p.n; d++) fprintf(stderr, " %lld", (long long)p.tile[d]);
      fprintf(stderr, "\n");
    }
  }
}

static MlirWalkResult unmark_cb(MlirOperation op, void *ud) {
  (void)ud;
  mlirOperationRemoveDiscardableAttributeByName(op, nova_str("nova.tile"));
  mlirOperationRemoveDiscardableAttributeByName(op, nova_str("nova.vec"));
  mlirOperationRemoveDiscardableAttributeByName(op, nova_str("nova.vecc"));
  return MlirWalkResultAdvance;
}

/* Puts the body of SNAP (a clone of m taken earlier) back into m and
 * destroys SNAP. */
static void restore(MlirModule m, MlirOperation snap) {
  MlirBlock body = mlirModuleGetBody(m);
  for (MlirOperation o = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(o);) {
    MlirOperation next = mlirOperationGetNextInBlock(o);
    mlirOperationDestroy(o);
    o = next;
  }
  MlirBlock sb = mlirRegionGetFirstBlock(mlirOperationGetFirstRegion(snap));
  for (MlirOperation o = mlirBlockGetFirstOperation(sb); !mlirOperationIsNull(o);) {
    MlirOperation next = mlirOperationGetNextInBlock(o);
    mlirOperationRemoveFromParent(o);
    mlirBlockAppendOwnedOperation(body, o);
    o = next;
  }
  mlirOperationDestroy(snap);
}

typedef struct captured {
  char first[400];
  int n;
} captured;

static void cap_print(MlirStringRef s, void *ud) {
  captured *c = ud;
  size_t len = strlen(c->first);
  size_t room = sizeof c->first - 1 - len;
  size_t k = s.length < room ? s.length : room;
  memcpy(c->first + len, s.data, k);
  c->first[len + k] = 0;
}

/* Keeps the first error and swallows every diagnostic: the transform
 * interpreter reports failures this file recovers from. */
static MlirLogicalResult capture_diag(MlirDiagnostic d, void *ud) {
  captured *c = ud;
  if (mlirDiagnosticGetSeverity(d) == MlirDiagnosticError && c->n++ == 0) {
    mlirDiagnosticPrint(d, cap_print, c);
    char *nl = strchr(c->first, '\n');
    if (nl) *nl = 0;
  }
  return mlirLogicalResultSuccess();
}

static void debug_print(MlirStringRef s, void *ud) {
  (void)ud;
  fwrite(s.data, 1, s.length, stderr);
}

/* ---- entry ----------------------------------------------------------- */

/* Parses and applies SCRIPT to m; 0 on success, else the first error in CAP. */
static int apply_script(nova_ctx *c, MlirModule m, const char *script, captured *cap) {
  MlirDiagnosticHandlerID h = mlirContextAttachDiagnosticHandler(c->ctx, capture_diag, cap, NULL);
  int rc = -1;
  MlirModule sm = mlirModuleCreateParse(c->ctx, nova_str(script));
  if (mlirModuleIsNull(sm)) {
    if (!cap->first[0]) snprintf(cap->first, sizeof cap->first, "the transform script did not parse");
  } else {
    MlirOperation seq = mlirBlockGetFirstOperation(mlirModuleGetBody(sm));
    MlirTransformOptions opts = mlirTransformOptionsCreate();
    mlirTransformOptionsEnableExpensiveChecks(opts, false);
    if (mlirLogicalResultIsSuccess(
            mlirTransformApplyNamedSequence(mlirModuleGetOperation(m), seq, mlirModuleGetOperation(sm), opts))) {
      if (mlirOperationVerify(mlirModuleGetOperation(m))) rc = 0;
      else if (!cap->first[0]) snprintf(cap->first, sizeof cap->first, "the tiled module does not verify");
    } else if (!cap->first[0])
      snprintf(cap->first, sizeof cap->first, "the transform script failed");
    mlirTransformOptionsDestroy(opts);
    mlirModuleDestroy(sm);
  }
  mlirContextDetachDiagnosticHandler(c->ctx, h);
  return rc;
}

int cg_cpu_tile(nova_ctx *c, MlirModule m, const cfg_device *host, int opt_level) {
  const char *knob = getenv("NOVAC_TILE");
  if (opt_level <= 0 || (knob && !strcmp(knob, "0"))) return 0;
  cfg_device own;
  if (!host) {
    char err[256];
    if (cfg_device_host(&own, err, sizeof err)) return 0; /* no model: scalar code */
    host = &own;
  }
  if (host->kind != CFG_DEV_CPU) return 0;
  bool debug = getenv("NOVAC_DEBUG_TILE") != NULL;
  nv_sbuf script = {0};
  nv_sb_printf(&script,
               "module attributes {transform.with_named_sequence} {\n"
               "  transform.named_sequence @__transform_main(%%root: !transform.any_op {transform.readonly}) {\n");
  MlirOperation snap = mlirOperationClone(mlirModuleGetOperation(m));
  marker mk = {.dev = host, .script = &script, .ctx = c->ctx, .debug = debug};
  for (MlirOperation f = mlirBlockGetFirstOperation(mlirModuleGetBody(m)); !mlirOperationIsNull(f);
       f = mlirOperationGetNextInBlock(f))
    if (cg_op_is(f, "func.func")) mark_func(&mk, f);
  for (int i = 0; i < mk.next; i++) {
    emit_group(&script, i, mk.texts[i]);
    free(mk.texts[i]);
  }
  free(mk.texts);
  script.oom |= mk.oom;
  nv_sb_printf(&script, "%s%s%s", SCRIPT_TAIL, getenv("NOVAC_TILE_FAULT") ? SCRIPT_FAULT : "", SCRIPT_END);
  if (debug) {
    fprintf(stderr, "// cpu tiling: %d contractions, %d elementwise, %d reductions\n%s", mk.counts[TK_CONTRACT],
            mk.counts[TK_POINTWISE], mk.counts[TK_REDUCE], script.s ? script.s : "");
    fprintf(stderr, "// ---- before tiling\n");
    mlirOperationPrint(mlirModuleGetOperation(m), debug_print, NULL);
  }
  captured cap = {{0}, 0};
  int rc = 0;
  if (mk.next == 0) {
    mlirOperationDestroy(snap);
  } else {
    /* the script runs on one function per distinct kernel (kernel_once.c) */
    double t0 = cg_now_ms();
    cg_kernels *ks = NULL;
    MlirModule km = cg_kernels_split(m, &mk.marked, &ks);
    if (getenv("NOVAC_DEBUG_PIPELINES"))
      fprintf(stderr, "novac: %8.1f ms  (tiling: %zu ops, %d distinct kernels)\n", cg_now_ms() - t0, mk.marked.n,
              cg_kernels_count(ks));
    t0 = cg_now_ms();
    if (script.oom || apply_script(c, km, script.s, &cap)) {
      restore(m, snap);
      nv_note(c->diag, (nv_loc){0}, "cpu tiling skipped, the step uses scalar loops: %s",
              script.oom ? "out of memory" : cap.first);
    } else {
      double t1 = cg_now_ms();
      cg_kernels_join(ks);
      mlirOperationDestroy(snap);
      if (getenv("NOVAC_DEBUG_PIPELINES"))
        fprintf(stderr,
                "novac: %8.1f ms  (tiling: the script)\nnovac: %8.1f ms  (tiling: kernels in place)\n"
                "novac: tiling: %zu ops, %d distinct kernels, %zu called\n",
                t1 - t0, cg_now_ms() - t1, mk.marked.n, cg_kernels_count(ks), cg_kernels_called(ks));
    }
    mlirModuleDestroy(km);
    cg_kernels_free(ks);
  }
  free(mk.marked.v);
  mlirOperationWalk(mlirModuleGetOperation(m), unmark_cb, NULL, MlirWalkPostOrder);
  if (debug) {
    fprintf(stderr, "// ---- after tiling\n");
    mlirOperationPrint(mlirModuleGetOperation(m), debug_print, NULL);
  }
  nv_sb_free(&script);
  return rc;
}
