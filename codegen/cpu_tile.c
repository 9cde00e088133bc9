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
 *   first, adjacent loops of a generic that every operand walks
 *     contiguously are merged (merge_loops), and the finite check's sums
 *     of x - x become partial sums in vector lanes (split_free_sum);
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
#include <pthread.h>
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
    /* LLVM 22's x86 back end cannot split a bf16 vector of 8k + 1 (k >= 1)
     * elements (a copy of one aborts it): vectors of 8 then, the
     * remainder under 8 */
    int64_t v = p.tile[last] ? p.tile[last] : p.range[last], rem = p.tile[last] ? p.range[last] % p.tile[last] : 0;
    if (half && ((v > 8 && v % 8 == 1) || (rem > 8 && rem % 8 == 1))) p.tile[last] = 8;
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

/* ---- merging loops ---------------------------------------------------- */

typedef struct index_check {
  bool found;
} index_check;

static MlirWalkResult index_cb(MlirOperation op, void *ud) {
  if (!cg_op_is(op, "linalg.index")) return MlirWalkResultAdvance;
  ((index_check *)ud)->found = true;
  return MlirWalkResultInterrupt;
}

/* The op of ST, inserted before BEFORE; its first result. */
static MlirValue insert_before(MlirOperation before, MlirOperationState *st) {
  MlirOperation o = mlirOperationCreate(st);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(before), before, o);
  return mlirOperationGetResult(o, 0);
}

/* A linalg.generic of NOPS operands (the last its one output, of type RT),
 * MAPS, the NL iterator types ITERS and the region BODY (taken), inserted
 * before BEFORE. */
static MlirOperation new_generic(MlirContext ctx, MlirOperation before, intptr_t nops, const MlirValue *ops, MlirType rt,
                                 const MlirAttribute *maps, intptr_t nl, const MlirAttribute *iters, MlirRegion body) {
  int32_t seg[2] = {(int32_t)nops - 1, 1};
  MlirNamedAttribute na[3] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("indexing_maps")), mlirArrayAttrGet(ctx, nops, maps)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("iterator_types")), mlirArrayAttrGet(ctx, nl, iters)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("operandSegmentSizes")),
                            mlirDenseI32ArrayGet(ctx, 2, seg))};
  MlirOperationState st = mlirOperationStateGet(nova_str("linalg.generic"), mlirOperationGetLocation(before));
  mlirOperationStateAddOperands(&st, nops, ops);
  mlirOperationStateAddResults(&st, 1, &rt);
  mlirOperationStateAddAttributes(&st, 3, na);
  mlirOperationStateAddOwnedRegions(&st, 1, &body);
  MlirOperation g = mlirOperationCreate(&st);
  mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(before), before, g);
  return g;
}

static bool reshape(MlirOperation op) {
  return cg_op_is(op, "tensor.collapse_shape") || cg_op_is(op, "tensor.expand_shape");
}

/* V is a slice of another tensor (through reshapes). */
static bool from_slice(MlirValue v) {
  while (mlirValueIsAOpResult(v) && reshape(mlirOpResultGetOwner(v)))
    v = mlirOperationGetOperand(mlirOpResultGetOwner(v), 0);
  return mlirValueIsAOpResult(v) && cg_op_is(mlirOpResultGetOwner(v), "tensor.extract_slice");
}

/* V is inserted into another tensor (through reshapes). */
static bool into_slice(MlirValue v, int depth) {
  for (MlirOpOperand u = mlirValueGetFirstUse(v); !mlirOpOperandIsNull(u); u = mlirOpOperandGetNextUse(u)) {
    MlirOperation o = mlirOpOperandGetOwner(u);
    if (cg_op_is(o, "tensor.insert_slice") || (depth < 8 && reshape(o) && into_slice(mlirOperationGetResult(o, 0), depth + 1)))
      return true;
  }
  return false;
}

/* tensor.expand_shape of V into type RT (GROUPS: NG arrays of i64
 * attributes), inserted before BEFORE. */
static MlirValue expand_shape(MlirContext ctx, MlirOperation before, MlirValue v, MlirType rt, int ng,
                              const MlirAttribute *groups) {
  int rank = (int)mlirShapedTypeGetRank(rt);
  int64_t shape[MAXL];
  for (int i = 0; i < rank; i++) shape[i] = mlirShapedTypeGetDimSize(rt, i);
  MlirNamedAttribute na[2] = {
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("reassociation")), mlirArrayAttrGet(ctx, ng, groups)),
      mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("static_output_shape")),
                            mlirDenseI64ArrayGet(ctx, rank, shape))};
  MlirOperationState st = mlirOperationStateGet(nova_str("tensor.expand_shape"), mlirOperationGetLocation(before));
  mlirOperationStateAddOperands(&st, 1, &v);
  mlirOperationStateAddResults(&st, 1, &rt);
  mlirOperationStateAddAttributes(&st, 2, na);
  return insert_before(before, &st);
}

/* OP (a linalg.generic on static tensors, not a contraction) with its
 * adjacent loops d, d + 1 merged wherever both have one iterator type and
 * every operand's map has neither or has d followed at once by d + 1: the
 * new generic runs over the operands collapsed accordingly
 * (tensor.collapse_shape: views once bufferized, the tensors being
 * contiguous) and its result is expanded back.  The vectors run along the
 * last loop: the update of a [512, 512, 3, 3] convolution weight, or a
 * batch norm's [N, C, 4, 4] activations, otherwise ran on vectors of 3 or
 * 4 lanes.  Returns the new op, or OP when nothing merges. */
static MlirOperation merge_loops(MlirContext ctx, MlirOperation op) {
  if (!cg_op_is(op, "linalg.generic") || mlirOperationGetNumResults(op) != 1 || mlirLinalgIsAContractionOp(op))
    return op;
  MlirAttribute maps = mlirLinalgGetIndexingMapsAttribute(op);
  MlirAttribute iters = mlirOperationGetAttributeByName(op, nova_str("iterator_types"));
  intptr_t nops = mlirOperationGetNumOperands(op);
  if (mlirAttributeIsNull(maps) || mlirAttributeIsNull(iters) || mlirArrayAttrGetNumElements(maps) != nops ||
      nops > 16)
    return op;
  int n = (int)mlirArrayAttrGetNumElements(iters);
  if (n < 2 || n > MAXL) return op;
  int res[16][MAXL], rank[16], pos[16][MAXL]; /* map results (dim, or -1: the constant 0); where each dim is */
  for (intptr_t i = 0; i < nops; i++) {
    MlirType t = mlirValueGetType(mlirOperationGetOperand(op, i));
    MlirAffineMap m = mlirAffineMapAttrGetValue(mlirArrayAttrGetElement(maps, i));
    rank[i] = (int)mlirAffineMapGetNumResults(m);
    if ((int)mlirAffineMapGetNumDims(m) != n || mlirAffineMapGetNumSymbols(m) != 0) return op;
    if (mlirTypeIsARankedTensor(t) ? !mlirShapedTypeHasStaticShape(t) || mlirShapedTypeGetRank(t) != rank[i]
                                   : mlirTypeIsAShaped(t) || rank[i] != 0)
      return op;
    for (int d = 0; d < n; d++) pos[i][d] = -1;
    for (int r = 0; r < rank[i]; r++) {
      MlirAffineExpr e = mlirAffineMapGetResult(m, r);
      if (mlirAffineExprIsAConstant(e) && mlirAffineConstantExprGetValue(e) == 0) res[i][r] = -1;
      else if (mlirAffineExprIsADim(e)) res[i][r] = (int)mlirAffineDimExprGetPosition(e);
      else return op;
      if (res[i][r] >= 0) {
        if (pos[i][res[i][r]] >= 0) return op; /* a dim twice: not a projected permutation */
        pos[i][res[i][r]] = r;
      }
    }
  }
  index_check ic = {false};
  mlirOperationWalk(op, index_cb, &ic, MlirWalkPreOrder);
  if (ic.found) return op;
  /* a slice of a larger tensor (a padded one: bufferization writes the
   * producer of an insert_slice in place) is strided: collapsed, a copy */
  for (intptr_t i = 0; i < nops; i++)
    if (from_slice(mlirOperationGetOperand(op, i))) return op;
  if (into_slice(mlirOperationGetResult(op, 0), 0)) return op;
  /* the new loop of each old one */
  int nl[MAXL], nn = 0;
  for (int d = 0; d < n; d++) {
    bool merge = d > 0 && mlirAttributeEqual(mlirArrayAttrGetElement(iters, d - 1), mlirArrayAttrGetElement(iters, d));
    for (intptr_t i = 0; i < nops && merge; i++)
      merge = pos[i][d - 1] < 0 ? pos[i][d] < 0 : pos[i][d] == pos[i][d - 1] + 1;
    nl[d] = merge ? nn - 1 : nn++;
  }
  if (nn == n) return op;
  MlirOperation before = op;
  MlirValue ops[16];
  MlirAttribute nmaps[16], out_groups[MAXL];
  int nout_groups = 0;
  for (intptr_t i = 0; i < nops; i++) {
    MlirValue v = mlirOperationGetOperand(op, i);
    MlirAffineExpr e[MAXL];
    MlirAttribute groups[MAXL];
    int64_t shape[MAXL];
    int ng = 0;
    /* groups of results: a dim and the dims that continue its new loop,
     * the unit dims (constant 0) with the group before them (or after,
     * at the start): the vectorizer wants no constant in a map */
    int first[MAXL + 1], nd = 0;
    for (int r = 0; r < rank[i]; r++)
      if (res[i][r] >= 0 && (nd == 0 || nl[res[i][r]] != nl[res[i][first[nd - 1]]] || res[i][r - 1] < 0))
        first[nd++] = r;
    if (nd > 0) first[0] = 0;
    first[nd] = rank[i];
    for (int k = 0; k < nd; k++) {
      MlirAttribute ga[MAXL];
      int len = first[k + 1] - first[k], d = -1;
      shape[ng] = 1;
      for (int j = 0; j < len; j++) {
        int r = first[k] + j;
        if (res[i][r] >= 0 && d < 0) d = res[i][r];
        shape[ng] *= mlirShapedTypeGetDimSize(mlirValueGetType(v), r);
        ga[j] = mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), r);
      }
      e[ng] = mlirAffineDimExprGet(ctx, nl[d]);
      groups[ng++] = mlirArrayAttrGet(ctx, len, ga);
    }
    nmaps[i] = mlirAffineMapAttrGet(mlirAffineMapGet(ctx, nn, 0, ng, e));
    ops[i] = v;
    if (ng < rank[i]) {
      intptr_t same = -1; /* one collapse for a tensor read twice the same way (an in-place update) */
      for (intptr_t j = 0; j < i && same < 0; j++)
        if (mlirValueEqual(mlirOperationGetOperand(op, j), v) && mlirAttributeEqual(nmaps[j], nmaps[i])) same = j;
      ops[i] = same >= 0 ? ops[same] : cg_collapse_shape(ctx, before, v, ng, shape, groups);
    }
    if (i == nops - 1) {
      nout_groups = ng;
      for (int k = 0; k < ng; k++) out_groups[k] = groups[k];
    }
  }
  MlirAttribute it[MAXL];
  for (int d = 0; d < n; d++) it[nl[d]] = mlirArrayAttrGetElement(iters, d);
  MlirRegion region = mlirRegionCreate();
  mlirRegionTakeBody(region, mlirOperationGetRegion(op, 0));
  MlirOperation g = new_generic(ctx, op, nops, ops, mlirValueGetType(ops[nops - 1]), nmaps, nn, it, region);
  for (intptr_t k = 0; k < mlirOperationGetNumDiscardableAttributes(op); k++) {
    MlirNamedAttribute a = mlirOperationGetDiscardableAttribute(op, k);
    mlirOperationSetDiscardableAttributeByName(g, mlirIdentifierStr(a.name), a.attribute);
  }
  MlirValue old = mlirOperationGetResult(op, 0);
  MlirValue r = mlirOperationGetResult(g, 0);
  if (nout_groups < (int)mlirShapedTypeGetRank(mlirValueGetType(old)))
    r = expand_shape(ctx, op, r, mlirValueGetType(old), nout_groups, out_groups);
  mlirValueReplaceAllUsesOfWith(old, r);
  mlirOperationDestroy(op);
  return g;
}

MlirOperation cg_merge_loops(MlirContext ctx, MlirOperation op) { return merge_loops(ctx, op); }

/* ---- order-free sums --------------------------------------------------- */

/* OP's body (one input, one output) adds IN - IN to OUT. */
static bool sums_x_minus_x(MlirOperation op) {
  MlirBlock b = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
  if (mlirBlockIsNull(b) || mlirBlockGetNumArguments(b) != 2) return false;
  MlirValue in = mlirBlockGetArgument(b, 0), out = mlirBlockGetArgument(b, 1);
  MlirOperation sub = mlirBlockGetFirstOperation(b);
  if (mlirOperationIsNull(sub) || !cg_op_is(sub, "arith.subf") ||
      !mlirValueEqual(mlirOperationGetOperand(sub, 0), in) || !mlirValueEqual(mlirOperationGetOperand(sub, 1), in))
    return false;
  MlirOperation add = mlirOperationGetNextInBlock(sub);
  if (mlirOperationIsNull(add) || !cg_op_is(add, "arith.addf")) return false;
  MlirValue d = mlirOperationGetResult(sub, 0), a0 = mlirOperationGetOperand(add, 0), a1 = mlirOperationGetOperand(add, 1);
  if (!((mlirValueEqual(a0, d) && mlirValueEqual(a1, out)) || (mlirValueEqual(a0, out) && mlirValueEqual(a1, d))))
    return false;
  MlirOperation y = mlirOperationGetNextInBlock(add);
  return !mlirOperationIsNull(y) && cg_op_is(y, "linalg.yield") && mlirOperationGetNumOperands(y) == 1 &&
         mlirValueEqual(mlirOperationGetOperand(y, 0), mlirOperationGetResult(add, 0)) &&
         mlirOperationIsNull(mlirOperationGetNextInBlock(y));
}

/* OP, a sum of x - x over the R elements of a 1-D x into a scalar (the
 * training step's finite check, autodiff.c: 0, or NaN, whatever the
 * order of the additions), R a multiple of the vector lanes L: as L
 * partial sums side by side (x as [R / L, L], summed down its columns into
 * a zeroed [L], one vector accumulator) and then those L into OP's
 * output: a vector add per L elements instead of a chain of R scalar
 * adds.  Returns the partial sums' op (the final sum follows it), or OP. */
static MlirOperation split_free_sum(MlirContext ctx, MlirOperation op, int64_t lanes) {
  if (!cg_op_is(op, "linalg.generic") || mlirOperationGetNumOperands(op) != 2 ||
      mlirOperationGetNumResults(op) != 1 || lanes < 2)
    return op;
  MlirValue x = mlirOperationGetOperand(op, 0), init = mlirOperationGetOperand(op, 1);
  MlirType xt = mlirValueGetType(x), ot = mlirValueGetType(init);
  if (!mlirTypeIsARankedTensor(xt) || !mlirTypeIsARankedTensor(ot) || mlirShapedTypeGetRank(xt) != 1 ||
      mlirShapedTypeGetRank(ot) != 0 || !mlirShapedTypeHasStaticShape(xt))
    return op;
  MlirType et = mlirShapedTypeGetElementType(xt);
  int64_t R = mlirShapedTypeGetDimSize(xt, 0);
  if (!(mlirTypeIsAF32(et) || mlirTypeIsAF64(et)) || !mlirTypeEqual(et, mlirShapedTypeGetElementType(ot)) ||
      R < 16 * lanes || R % lanes || !sums_x_minus_x(op))
    return op;
  MlirLocation loc = mlirOperationGetLocation(op);
  /* x as [R / L, L] */
  int64_t shape2[2] = {R / lanes, lanes};
  MlirAttribute g01[2] = {mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 0),
                          mlirIntegerAttrGet(mlirIntegerTypeGet(ctx, 64), 1)};
  MlirAttribute grp = mlirArrayAttrGet(ctx, 2, g01);
  MlirValue x2 = expand_shape(ctx, op, x, mlirRankedTensorTypeGet(2, shape2, et, mlirAttributeGetNull()), 1, &grp);
  /* a zeroed [L] */
  MlirType pt = mlirRankedTensorTypeGet(1, &lanes, et, mlirAttributeGetNull());
  MlirOperationState st = mlirOperationStateGet(nova_str("arith.constant"), loc);
  MlirNamedAttribute zv = mlirNamedAttributeGet(mlirIdentifierGet(ctx, nova_str("value")), mlirFloatAttrDoubleGet(ctx, et, 0));
  mlirOperationStateAddAttributes(&st, 1, &zv);
  mlirOperationStateAddResults(&st, 1, &et);
  MlirValue zero = insert_before(op, &st);
  st = mlirOperationStateGet(nova_str("tensor.empty"), loc);
  mlirOperationStateAddResults(&st, 1, &pt);
  MlirValue empty = insert_before(op, &st);
  cg_builder b = {ctx, loc, mlirOperationGetBlock(op), op};
  MlirOperation fill = cg_build_named(&b, "linalg.fill", zero, empty, &pt);
  /* the partial sums: OP's body over [R / L, L], rows reduced */
  MlirAttribute red = mlirAttributeParseGet(ctx, nova_str("#linalg.iterator_type<reduction>"));
  MlirAttribute par = mlirAttributeParseGet(ctx, nova_str("#linalg.iterator_type<parallel>"));
  MlirAffineExpr d0 = mlirAffineDimExprGet(ctx, 0), d1 = mlirAffineDimExprGet(ctx, 1);
  MlirAttribute pmaps[2] = {mlirAffineMapAttrGet(mlirAffineMapGet(ctx, 2, 0, 2, (MlirAffineExpr[]){d0, d1})),
                            mlirAffineMapAttrGet(mlirAffineMapGet(ctx, 2, 0, 1, &d1))};
  MlirRegion pr = mlirRegionCreate();
  mlirRegionTakeBody(pr, mlirOperationGetRegion(op, 0));
  MlirOperation partial = new_generic(ctx, op, 2, (MlirValue[]){x2, mlirOperationGetResult(fill, 0)}, pt, pmaps, 2,
                                      (MlirAttribute[]){red, par}, pr);
  /* the L partial sums added to OP's output */
  MlirAttribute fmaps[2] = {mlirAffineMapAttrGet(mlirAffineMapGet(ctx, 1, 0, 1, &d0)),
                            mlirAffineMapAttrGet(mlirAffineMapGet(ctx, 1, 0, 0, NULL))};
  MlirType ets[2] = {et, et};
  MlirLocation locs[2] = {loc, loc};
  MlirBlock body = mlirBlockCreate(2, ets, locs);
  st = mlirOperationStateGet(nova_str("arith.addf"), loc);
  mlirOperationStateAddOperands(&st, 2, (MlirValue[]){mlirBlockGetArgument(body, 0), mlirBlockGetArgument(body, 1)});
  mlirOperationStateAddResults(&st, 1, &et);
  MlirOperation add = mlirOperationCreate(&st);
  mlirBlockAppendOwnedOperation(body, add);
  MlirValue sum = mlirOperationGetResult(add, 0);
  st = mlirOperationStateGet(nova_str("linalg.yield"), loc);
  mlirOperationStateAddOperands(&st, 1, &sum);
  mlirBlockAppendOwnedOperation(body, mlirOperationCreate(&st));
  MlirRegion rr = mlirRegionCreate();
  mlirRegionAppendOwnedBlock(rr, body);
  MlirOperation total = new_generic(ctx, op, 2, (MlirValue[]){mlirOperationGetResult(partial, 0), init}, ot, fmaps, 1,
                                    &red, rr);
  mlirValueReplaceAllUsesOfWith(mlirOperationGetResult(op, 0), mlirOperationGetResult(total, 0));
  mlirOperationDestroy(op);
  return partial;
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
    o = merge_loops(mk->ctx, o);
    o = split_free_sum(mk->ctx, o, cfg_pointwise_cpu(mk->dev, 1, 4).lanes);
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

/* Parses and applies SCRIPT to M (its own parse: each thread reads its
 * own copy); 0, or -1 with WHY set when no diagnostic said why. */
static int run_script(MlirContext ctx, MlirModule m, const char *script, const char **why) {
  int rc = -1;
  MlirModule sm = mlirModuleCreateParse(ctx, nova_str(script));
  if (mlirModuleIsNull(sm)) {
    *why = "the transform script did not parse";
    return -1;
  }
  MlirOperation seq = mlirBlockGetFirstOperation(mlirModuleGetBody(sm));
  MlirTransformOptions opts = mlirTransformOptionsCreate();
  mlirTransformOptionsEnableExpensiveChecks(opts, false);
  if (mlirLogicalResultIsSuccess(
          mlirTransformApplyNamedSequence(mlirModuleGetOperation(m), seq, mlirModuleGetOperation(sm), opts)))
    rc = 0;
  else
    *why = "the transform script failed";
  mlirTransformOptionsDestroy(opts);
  mlirModuleDestroy(sm);
  return rc;
}

typedef struct script_job {
  MlirContext ctx;
  MlirModule m;
  const char *script, *why;
  int rc;
} script_job;

static void *script_thread(void *ud) {
  script_job *j = ud;
  j->rc = run_script(j->ctx, j->m, j->script, &j->why);
  return NULL;
}

/* Applies SCRIPT to M (kernel_once.c's module: one function per distinct
 * kernel, after the declarations they may refer to); 0 on success, else
 * the first error in CAP.  With several processors and enough kernels,
 * the functions are dealt, in their order, each onto the thread with the
 * fewest ops so far, into one module per thread, each with the declarations, and the script runs on
 * them side by side, the context in its thread-safe mode (the transform
 * interpreter is single-threaded; a step of 850 distinct kernels spent
 * 2.4 s in it); the functions then go back into M. */
static int apply_script(nova_ctx *c, MlirModule m, const char *script, captured *cap) {
  MlirDiagnosticHandlerID h = mlirContextAttachDiagnosticHandler(c->ctx, capture_diag, cap, NULL);
  enum { MAXT = 8 };
  int nt = nv_jobs(), nf = 0;
  MlirBlock body = mlirModuleGetBody(m);
  for (MlirOperation f = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(f); f = mlirOperationGetNextInBlock(f))
    nf += cg_op_is(f, "func.func") && !mlirRegionIsNull(mlirOperationGetRegion(f, 0)) &&
          !mlirBlockIsNull(mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0)));
  if (nt > nf / 16) nt = nf / 16; /* (16 kernels a thread at least) */
  if (nt > MAXT) nt = MAXT;
  script_job jobs[MAXT];
  pthread_t tid[MAXT];
  bool started[MAXT] = {0};
  int rc = 0;
  if (nt < 2) {
    jobs[0] = (script_job){.ctx = c->ctx, .m = m, .script = script};
    script_thread(&jobs[0]);
    rc = jobs[0].rc;
    nt = 1;
  } else {
    /* the parts: declarations cloned, functions moved */
    MlirLocation loc = mlirOperationGetLocation(mlirModuleGetOperation(m));
    int64_t load[MAXT] = {0};
    for (int t = 0; t < nt; t++) jobs[t] = (script_job){.ctx = c->ctx, .m = mlirModuleCreateEmpty(loc), .script = script};
    cg_op_list fns = {0};
    for (MlirOperation f = mlirBlockGetFirstOperation(body); !mlirOperationIsNull(f);
         f = mlirOperationGetNextInBlock(f)) {
      MlirRegion r = mlirOperationGetNumRegions(f) ? mlirOperationGetRegion(f, 0) : (MlirRegion){NULL};
      if (!mlirRegionIsNull(r) && !mlirBlockIsNull(mlirRegionGetFirstBlock(r))) cg_op_list_push(&fns, f);
      else
        for (int t = 0; t < nt; t++) mlirBlockAppendOwnedOperation(mlirModuleGetBody(jobs[t].m), mlirOperationClone(f));
    }
    for (size_t i = 0; i < fns.n; i++) {
      int light = 0;
      for (int t = 1; t < nt; t++)
        if (load[t] < load[light]) light = t;
      load[light] += cg_count_ops(fns.v[i]);
      mlirOperationRemoveFromParent(fns.v[i]);
      mlirBlockAppendOwnedOperation(mlirModuleGetBody(jobs[light].m), fns.v[i]);
    }
    mlirContextEnableMultithreading(c->ctx, true);
    for (int t = 1; t < nt; t++) started[t] = !pthread_create(&tid[t], NULL, script_thread, &jobs[t]);
    script_thread(&jobs[0]);
    for (int t = 1; t < nt; t++) {
      if (started[t]) pthread_join(tid[t], NULL);
      else script_thread(&jobs[t]); /* no thread: here */
    }
    mlirContextEnableMultithreading(c->ctx, false);
    /* the functions back, in their order; the parts' declarations dropped */
    for (size_t i = 0; i < fns.n; i++) {
      mlirOperationRemoveFromParent(fns.v[i]);
      mlirBlockAppendOwnedOperation(body, fns.v[i]);
    }
    free(fns.v);
    for (int t = 0; t < nt; t++) {
      mlirModuleDestroy(jobs[t].m);
      if (jobs[t].rc) rc = -1;
    }
  }
  if (rc) {
    for (int t = 0; t < nt && !cap->first[0]; t++)
      if (jobs[t].rc && jobs[t].why) snprintf(cap->first, sizeof cap->first, "%s", jobs[t].why);
  } else if (!mlirOperationVerify(mlirModuleGetOperation(m))) {
    if (!cap->first[0]) snprintf(cap->first, sizeof cap->first, "the tiled module does not verify");
    rc = -1;
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
