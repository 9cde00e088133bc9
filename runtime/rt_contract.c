/* rt_contract.c: the CPU's contraction kernels, BLIS-structured.
 *
 * novac (codegen/cpu_ukernel.c) replaces each contraction C += A * B of a
 * step (batched, either operand transposed, any strides) by a call
 *   nova_rt_contract_f32(A, B, C, desc)   f32 A, B and C;
 *   nova_rt_contract_bf16(A, B, C, desc)  bf16 A and B, f32 C (AVX-512 BF16
 *                                         hosts: vdpbf16ps multiplies pairs
 *                                         of bf16, twice the multiply-adds
 *                                         of an f32 FMA).
 * The structure is BLIS's: a kc x nc block of B packed into panels of NR
 * columns ([kc][NR]; bf16: runs of k pairs [kc/2][NR][2]), an mc x kc
 * block of A into panels of MR rows, and an MR x NR register tile of C
 * accumulating over the block's k.  Packing reads any strides (a
 * transposed operand costs what a plain one does: lines contiguous, k rows
 * are copied or interleaved in registers; k contiguous, 16 x 16 (AVX2:
 * 8 x 8) blocks are transposed in registers) and pads the edges with
 * zeros, so the register tile always runs whole; only its store to C is
 * cut to the edge.
 *
 * Register tiles, chosen from the CPU the step runs on (the configurator
 * sizes the blocks for the same tiles, from the host's vector registers):
 *   f32, AVX-512: 14 x 32 (28 zmm accumulators, 2 for B, 1 broadcast);
 *   f32, AVX2 + FMA: 6 x 16 (12 ymm accumulators, 2 for B, 1 broadcast);
 *   bf16, AVX-512 BF16: 12 x 32.
 * C with at most 24 rows on one side (AVX2: 12) gets narrow tiles
 * instead (below: 4 x 96, 8 x 48, 12 x 32; AVX2 2 x 48, 4 x 24), its few
 * rows packed once, the wide operand read in place where it can be.
 * A CPU without them (a step built for another machine) gets the same
 * sums one element of C at a time.  NOVA_CONTRACT_PLAIN=1 takes that path
 * anywhere and NOVA_CONTRACT_ISA=avx2 the AVX2 kernel on an AVX-512 CPU
 * (tests).
 *
 * desc (int64, written by novac): [0] the number of loops L (at most
 * RT_CONTRACT_MAXL), [1..3] which loop is m, n and k, [4..6] mc, nc, kc
 * (the cache blocks, from the configurator; 0: the kernel's own), [7]
 * flags (bit 0, RT_CONTRACT_ZERO_C: C = A B, C's values not read: the
 * register tiles of the first k block are stored rather than added, where
 * a fill of zeros over all of C came before the call), then L loop
 * sizes and L element strides for each of A, B and C (0: the operand does
 * not vary along that loop).  Loops other than m, n and k (batch
 * dims, a second m dim) are outer loops.  The blocks of different outer
 * iterations and of different m and n blocks write disjoint parts of C:
 * they are shared out on the step's threads (nova_rt_parallel_for); the k
 * blocks of one tile run in order.
 *
 * Numerics: C's element gets its products summed in k order, one FMA each,
 * added to C once per kc block (f32; narrow tiles: once, the sums of
 * their k chunks carried in f32).  bf16: each product of two bf16
 * values is exact in f32; vdpbf16ps adds the two products of a pair to the
 * f32 accumulator, rounding to nearest even with denormal inputs and
 * results flushed to zero.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RT_CONTRACT_MAXL 8
#define BF_MR 12 /* bf16: MR rows of C by NR columns (two zmm registers) */
#define BF_NR 32
#define F5_MR 14 /* f32, AVX-512 */
#define F5_NR 32
#define F2_MR 6 /* f32, AVX2 */
#define F2_NR 16

typedef void (*rt_task)(void **argv, int64_t lo, int64_t hi);
void nova_rt_parallel_for(rt_task task, void **argv, int64_t lb, int64_t ub, int64_t step);
int nova_rt_threads(void);
void nova_rt_contract_bf16(int64_t a, int64_t b, int64_t c, int64_t desc);
void nova_rt_contract_f32(int64_t a, int64_t b, int64_t c, int64_t desc);

/* A register-tile kernel: its tile, the k elements that make one packed
 * step (bf16: a pair), the operands' element size, and its parts. */
typedef struct kernel {
  int mr, nr, ku;
  size_t esize;
  /* N lines (A's rows, B's columns) at SRC, line l at SRC + l SL
   * elements, k [0, kb) at stride SK, as panels of mr lines (A) or of nr
   * (IS_B), zeros past the edges */
  void (*pack)(const void *src, int64_t sl, int64_t sk, int64_t n, int64_t kb, bool is_b, void *dst);
  /* C[the MR x NR tile at c, cut to mr x nr] += the panels' product over KS steps (ADD false: =) */
  void (*tile)(const void *ap, const void *bp, int64_t ks, float *c, int64_t scm, int64_t scn, int64_t mr, int64_t nr,
               bool add);
  /* the same with A read in place, whole tiles of MR rows: k contiguous,
   * row i at AP + i LDA (tile_ak); m contiguous, step q at AP + q LDA
   * (tile_am); NULL: A is packed */
  void (*tile_ak)(const void *ap, int64_t lda, const void *bp, int64_t ks, float *c, int64_t scm, int64_t scn,
                  int64_t nr, bool add);
  void (*tile_am)(const void *ap, int64_t lda, const void *bp, int64_t ks, float *c, int64_t scm, int64_t scn,
                  int64_t nr, bool add);
} kernel;

typedef struct contract {
  const kernel *k;
  const char *a, *b; /* element esize */
  float *c;
  int nl, lm, ln, lk;
  int64_t mc, nc, kc;
  int64_t size[RT_CONTRACT_MAXL], sa[RT_CONTRACT_MAXL], sb[RT_CONTRACT_MAXL], sc[RT_CONTRACT_MAXL];
  int64_t nouter, nblocks, mgroups;
  int inplace_a; /* whole tiles of A read in place: 1 k contiguous (kernel->tile_ak), 2 m contiguous (tile_am) */
  bool zero_c;   /* RT_CONTRACT_ZERO_C */
} contract;

#define RT_CONTRACT_ZERO_C 1
#define RT_CONTRACT_HEAD 8 /* the desc's entries before the loop sizes */


/* Offsets of outer iteration O into A, B and C. */
static void outer_offsets(const contract *x, int64_t o, int64_t *oa, int64_t *ob, int64_t *oc) {
  *oa = *ob = *oc = 0;
  for (int l = x->nl - 1; l >= 0; l--) {
    if (l == x->lm || l == x->ln || l == x->lk) continue;
    int64_t i = o % x->size[l];
    o /= x->size[l];
    *oa += i * x->sa[l], *ob += i * x->sb[l], *oc += i * x->sc[l];
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_BLOCKED 1

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))
#define TARGET5 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TARGET2 __attribute__((target("avx2,fma")))
#define INLINE inline __attribute__((always_inline))

/* C's rows += the accumulators (two zmm per row), cut to mr x nr (ADD false: =). */
TARGET5 static INLINE void store_tile512(const __m512 *acc0, const __m512 *acc1, int rows, float *c, int64_t scm,
                                         int64_t scn, int64_t mr, int64_t nr, bool add) {
  if (scn == 1) {
    __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    for (int i = 0; i < rows && i < mr; i++) {
      float *row = c + i * scm;
      __m512 v0 = add ? _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), acc0[i]) : acc0[i];
      _mm512_mask_storeu_ps(row, m0, v0);
      if (m1) _mm512_mask_storeu_ps(row + 16, m1, add ? _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), acc1[i]) : acc1[i]);
    }
    return;
  }
  float t[32];
  for (int i = 0; i < rows && i < mr; i++) {
    _mm512_storeu_ps(t, acc0[i]);
    _mm512_storeu_ps(t + 16, acc1[i]);
    for (int64_t j = 0; j < nr; j++) c[i * scm + j * scn] = add ? c[i * scm + j * scn] + t[j] : t[j];
  }
}

/* Interleaves 32 columns of two k rows: out[2j] = r0[j], out[2j + 1] = r1[j]. */
TARGET static void pair_rows(__m512i r0, __m512i r1, void *dst, int64_t n) {
  static const uint16_t lo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                  8,  40, 9,  41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  __m512i il = _mm512_loadu_si512(lo), ih = _mm512_add_epi16(il, _mm512_set1_epi16(16));
  __m512i a = _mm512_permutex2var_epi16(r0, il, r1), b = _mm512_permutex2var_epi16(r0, ih, r1);
  uint16_t *d = dst;
  if (n >= 32) {
    _mm512_storeu_si512(d, a);
    _mm512_storeu_si512(d + 32, b);
    return;
  }
  __mmask32 ma = n >= 16 ? ~(__mmask32)0 : (__mmask32)((1ull << (2 * n)) - 1);
  __mmask32 mb = n <= 16 ? 0 : (__mmask32)((1ull << (2 * (n - 16))) - 1);
  _mm512_mask_storeu_epi16(d, ma, a);
  if (mb) _mm512_mask_storeu_epi16(d + 32, mb, b);
}

/* W contiguous bf16 (at most 32) of a row, zeros past them (and for a row past the k edge). */
TARGET static __m512i row_load(const uint16_t *row, int64_t w, bool present) {
  if (!present) return _mm512_setzero_si512();
  return w >= 32 ? _mm512_loadu_si512(row) : _mm512_maskz_loadu_epi16((__mmask32)((1ull << w) - 1), row);
}

/* R[k] := column k of the 8 x 8 matrix of 32-bit values whose rows are R. */
TARGET2 static INLINE void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; i++) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xee);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) {
    r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
    r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
  }
}

/* dst[q * w + l] = the 32-bit value at byte LINE + l * SL + 4 q, for lines
 * l < h and q < nq; zeros for the lines [h, w): 8 lines by 8 values at a
 * time, transposed in ymm registers (16 of them: a 16 x 16 block in zmm
 * registers would not fit with its temporaries and goes through memory). */
TARGET5 static INLINE void transpose_u32(const char *line, int64_t sl, int64_t h, int64_t nq, int64_t w,
                                         uint32_t *dst) {
  for (int64_t g = 0; g < w; g += 8) {
    for (int64_t q0 = 0; q0 < nq; q0 += 8) {
      int64_t n = nq - q0 < 8 ? nq - q0 : 8;
      __mmask8 qm = (__mmask8)((1u << n) - 1);
      const char *p = line + g * sl + 4 * q0;
      __m256 r[8];
#pragma GCC unroll 8
      for (int l = 0; l < 8; l++) {
        __mmask8 m = g + l < h ? qm : 0;
        r[l] = _mm256_maskz_loadu_ps(m, p + l * sl);
        if (m) _mm_prefetch(p + l * sl + 512, _MM_HINT_T1); /* 16 blocks on, into L2 */
      }
      transpose8(r);
      float *d = (float *)dst + q0 * w + g;
      __mmask8 lm = w - g >= 8 ? 0xff : (__mmask8)((1u << (w - g)) - 1);
#pragma GCC unroll 8
      for (int k = 0; k < 8; k++)
        if (k < n) _mm256_mask_storeu_ps(d + k * w, lm, r[k]);
    }
  }
}

/* The k-contiguous case of pack_pairs: the pairs (u32) transposed. */
TARGET static inline __attribute__((always_inline)) void pack_k_contiguous(const uint16_t *base, int64_t sl,
                                                                           int64_t h, int64_t kb, int64_t w,
                                                                           uint32_t *d32) {
  int64_t full = kb / 2;
  transpose_u32((const char *)base, sl * 2, h, full, w, d32);
  if (kb & 1)
    for (int64_t l = 0; l < w; l++) d32[full * w + l] = l < h ? base[l * sl + kb - 1] : 0;
}

/* N lines (A's rows, B's columns) of an operand from SRC, line L at SRC +
 * L SL, k [0, kb) at stride SK, as panels of W lines, k in pairs:
 * dst[q][l][2] = line l's k 2q and 2q + 1, zeros past the edges. */
/* (inlined: each caller's W a constant) */
TARGET static inline __attribute__((always_inline)) void pack_pairs(const uint16_t *src, int64_t sl, int64_t sk,
                                                                    int64_t n, int64_t kb, int64_t w, uint16_t *dst) {
  int64_t kp = (kb + 1) / 2;
  for (int64_t lr = 0; lr < n; lr += w, dst += kp * w * 2) {
    int64_t h = n - lr < w ? n - lr : w;
    const uint16_t *base = src + lr * sl;
    if (sl == 1) { /* the lines contiguous: two k rows interleaved */
      for (int64_t q = 0; q < kp; q++)
        pair_rows(row_load(base + 2 * q * sk, h, true), row_load(base + (2 * q + 1) * sk, h, 2 * q + 1 < kb),
                  dst + q * w * 2, w);
      continue;
    }
    uint32_t *d32 = (uint32_t *)dst;
    if (sk == 1) {
      pack_k_contiguous(base, sl, h, kb, w, d32);
      continue;
    }
    for (int64_t l = 0; l < w; l++) {
      const uint16_t *line = base + l * sl;
      if (l >= h) {
        for (int64_t q = 0; q < kp; q++) d32[q * w + l] = 0;
      } else {
        for (int64_t q = 0; q < kp; q++)
          d32[q * w + l] = line[2 * q * sk] | (2 * q + 1 < kb ? (uint32_t)line[(2 * q + 1) * sk] << 16 : 0);
      }
    }
  }
}

/* (pack_pairs with the panel width a constant) */
TARGET static void bf16_pack(const void *src, int64_t sl, int64_t sk, int64_t n, int64_t kb, bool is_b, void *dst) {
  if (is_b) pack_pairs(src, sl, sk, n, kb, BF_NR, dst);
  else pack_pairs(src, sl, sk, n, kb, BF_MR, dst);
}

/* C[BF_MR x BF_NR tile at c] += the packed panels' product over KP k pairs; the
 * tile is cut to mr x nr rows and columns. */
TARGET static void bf16_tile(const void *apv, const void *bpv, int64_t kp, float *c, int64_t scm, int64_t scn,
                             int64_t mr, int64_t nr, bool add) {
  const uint16_t *ap = apv, *bp = bpv;
  __m512 acc0[BF_MR], acc1[BF_MR];
#pragma GCC unroll 16
  for (int i = 0; i < BF_MR; i++) acc0[i] = acc1[i] = _mm512_setzero_ps();
  for (int64_t q = 0; q < kp; q++, ap += BF_MR * 2, bp += BF_NR * 2) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 32);
#pragma GCC unroll 16
    for (int i = 0; i < BF_MR; i++) {
      uint32_t pair;
      memcpy(&pair, ap + 2 * i, 4);
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair);
      acc0[i] = _mm512_dpbf16_ps(acc0[i], av, b0);
      acc1[i] = _mm512_dpbf16_ps(acc1[i], av, b1);
    }
  }
  store_tile512(acc0, acc1, BF_MR, c, scm, scn, mr, nr, add);
}


/* ---- f32, AVX-512: 14 x 32 ------------------------------------------- */

/* N lines of f32 (A's rows, B's columns) from SRC, line l at SRC + l SL, k
 * [0, kb) at stride SK, as panels of W lines: dst[q][l] = line l's k q,
 * zeros past the edges. */
TARGET5 static INLINE void pack_f32_512(const float *src, int64_t sl, int64_t sk, int64_t n, int64_t kb, int64_t w,
                                        float *dst) {
  for (int64_t lr = 0; lr < n; lr += w, dst += kb * w) {
    int64_t h = n - lr < w ? n - lr : w;
    const float *base = src + lr * sl;
    if (sl == 1) { /* the lines contiguous: k rows copied */
      for (int64_t g = 0; g < w; g += 16) {
        int64_t lw = w - g < 16 ? w - g : 16, lh = h - g < 0 ? 0 : h - g < 16 ? h - g : 16;
        __mmask16 sm = (__mmask16)((1u << lw) - 1), lm = (__mmask16)((1u << lh) - 1);
        for (int64_t q = 0; q < kb; q++)
          _mm512_mask_storeu_ps(dst + q * w + g, sm, _mm512_maskz_loadu_ps(lm, base + q * sk + g));
      }
    } else if (sk == 1) {
      transpose_u32((const char *)base, sl * 4, h, kb, w, (uint32_t *)dst);
    } else {
      for (int64_t q = 0; q < kb; q++)
        for (int64_t l = 0; l < w; l++) dst[q * w + l] = l < h ? base[l * sl + q * sk] : 0.0f;
    }
  }
}

TARGET5 static void f5_pack(const void *src, int64_t sl, int64_t sk, int64_t n, int64_t kb, bool is_b, void *dst) {
  if (is_b) pack_f32_512(src, sl, sk, n, kb, F5_NR, dst);
  else pack_f32_512(src, sl, sk, n, kb, F5_MR, dst);
}

/* C's tile += the accumulators: a whole tile straight from the registers. */
TARGET5 static INLINE void f5_store(const __m512 *acc0, const __m512 *acc1, float *c, int64_t scm, int64_t scn,
                                    int64_t mr, int64_t nr, bool add) {
  if (mr == F5_MR && nr == F5_NR && scn == 1) {
    if (!add) {
#pragma GCC unroll 16
      for (int i = 0; i < F5_MR; i++) _mm512_storeu_ps(c + i * scm, acc0[i]), _mm512_storeu_ps(c + i * scm + 16, acc1[i]);
      return;
    }
#pragma GCC unroll 16
    for (int i = 0; i < F5_MR; i++) {
      float *row = c + i * scm;
      _mm512_storeu_ps(row, _mm512_add_ps(_mm512_loadu_ps(row), acc0[i]));
      _mm512_storeu_ps(row + 16, _mm512_add_ps(_mm512_loadu_ps(row + 16), acc1[i]));
    }
    return;
  }
  store_tile512(acc0, acc1, F5_MR, c, scm, scn, mr, nr, add);
}

/* The 14 x 32 tile over KN steps: A's 14 values of step q contiguous at AP +
 * q SAK (a packed panel: SAK = 14; A in place, m contiguous: its k stride),
 * B's packed panel at BP. */
TARGET5 static INLINE void f5_body(const float *ap, int64_t sak, const float *bp, int64_t kn, float *c, int64_t scm,
                                   int64_t scn, int64_t mr, int64_t nr, bool add) {
  __m512 acc0[F5_MR], acc1[F5_MR];
#pragma GCC unroll 16
  for (int i = 0; i < F5_MR; i++) {
    acc0[i] = acc1[i] = _mm512_setzero_ps();
    _mm_prefetch((const char *)(c + i * scm), _MM_HINT_T0); /* C's tile, read at the end */
    _mm_prefetch((const char *)(c + i * scm + 16 * scn), _MM_HINT_T0);
  }
  for (int64_t q = 0; q < kn; q++, ap += sak, bp += F5_NR) {
    __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
    _mm_prefetch((const char *)(bp + 8 * F5_NR), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int i = 0; i < F5_MR; i++) {
      __m512 av = _mm512_set1_ps(ap[i]);
      acc0[i] = _mm512_fmadd_ps(av, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(av, b1, acc1[i]);
    }
  }
  f5_store(acc0, acc1, c, scm, scn, mr, nr, add);
}

TARGET5 static void f5_tile(const void *ap, const void *bp, int64_t kn, float *c, int64_t scm, int64_t scn, int64_t mr,
                            int64_t nr, bool add) {
  f5_body(ap, F5_MR, bp, kn, c, scm, scn, mr, nr, add);
}

TARGET5 static void f5_tile_am(const void *ap, int64_t lda, const void *bp, int64_t kn, float *c, int64_t scm,
                               int64_t scn, int64_t nr, bool add) {
  f5_body(ap, lda, bp, kn, c, scm, scn, F5_MR, nr, add);
}

/* f5_tile with A in place: 14 rows at stride LDA, k contiguous.  The rows
 * are addressed from five bases three rows apart (base, + LDA, + 2 LDA),
 * so that they fit the general registers. */
TARGET5 static void f5_tile_ak(const void *apv, int64_t lda, const void *bpv, int64_t kn, float *c, int64_t scm,
                               int64_t scn, int64_t nr, bool add) {
  const float *bp = bpv;
  const float *r0 = apv, *r3 = r0 + 3 * lda, *r6 = r0 + 6 * lda, *r9 = r0 + 9 * lda, *r12 = r0 + 12 * lda;
  __m512 acc0[F5_MR], acc1[F5_MR];
#pragma GCC unroll 16
  for (int i = 0; i < F5_MR; i++) {
    acc0[i] = acc1[i] = _mm512_setzero_ps();
    _mm_prefetch((const char *)(c + i * scm), _MM_HINT_T0);
    _mm_prefetch((const char *)(c + i * scm + 16 * scn), _MM_HINT_T0);
  }
#define F5_ROW(i, p)                                                                                                  \
  do {                                                                                                                \
    __m512 av = _mm512_set1_ps(p);                                                                                    \
    acc0[i] = _mm512_fmadd_ps(av, b0, acc0[i]);                                                                       \
    acc1[i] = _mm512_fmadd_ps(av, b1, acc1[i]);                                                                       \
  } while (0)
  for (int64_t q = 0; q < kn; q++, bp += F5_NR) {
    __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
    F5_ROW(0, r0[q]);
    F5_ROW(1, r0[q + lda]);
    F5_ROW(2, r0[q + 2 * lda]);
    F5_ROW(3, r3[q]);
    F5_ROW(4, r3[q + lda]);
    F5_ROW(5, r3[q + 2 * lda]);
    F5_ROW(6, r6[q]);
    F5_ROW(7, r6[q + lda]);
    F5_ROW(8, r6[q + 2 * lda]);
    F5_ROW(9, r9[q]);
    F5_ROW(10, r9[q + lda]);
    F5_ROW(11, r9[q + 2 * lda]);
    F5_ROW(12, r12[q]);
    F5_ROW(13, r12[q + lda]);
  }
#undef F5_ROW
  f5_store(acc0, acc1, c, scm, scn, F5_MR, nr, add);
}

/* ---- f32, AVX2: 6 x 16 ------------------------------------------------- */

/* Lanes [0, n) of 8 set (a maskload/maskstore mask). */
TARGET2 static INLINE __m256i lanes8(int64_t n) {
  n = n < 0 ? 0 : n > 8 ? 8 : n;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

TARGET2 static INLINE void pack_f32_256(const float *src, int64_t sl, int64_t sk, int64_t n, int64_t kb, int64_t w,
                                        float *dst) {
  for (int64_t lr = 0; lr < n; lr += w, dst += kb * w) {
    int64_t h = n - lr < w ? n - lr : w;
    const float *base = src + lr * sl;
    if (sl == 1) {
      for (int64_t g = 0; g < w; g += 8) {
        __m256i lm = lanes8(h - g);
        for (int64_t q = 0; q < kb; q++) {
          __m256 v = _mm256_maskload_ps(base + q * sk + g, lm);
          if (w - g >= 8) {
            _mm256_storeu_ps(dst + q * w + g, v);
          } else {
            _Alignas(32) float t[8];
            _mm256_store_ps(t, v);
            memcpy(dst + q * w + g, t, (size_t)(w - g) * sizeof(float));
          }
        }
      }
    } else if (sk == 1) {
      for (int64_t g = 0; g < w; g += 8) {
        for (int64_t q0 = 0; q0 < kb; q0 += 8) {
          int64_t nq = kb - q0 < 8 ? kb - q0 : 8;
          __m256i qm = lanes8(nq);
          __m256 r[8];
          for (int l = 0; l < 8; l++)
            r[l] = g + l < h ? _mm256_maskload_ps(base + (g + l) * sl + q0, qm) : _mm256_setzero_ps();
          transpose8(r);
          if (w - g >= 8) {
            for (int64_t k = 0; k < nq; k++) _mm256_storeu_ps(dst + (q0 + k) * w + g, r[k]);
          } else { /* (vmaskmovps stores are slow on AMD's cores: a copy of the lanes instead) */
            _Alignas(32) float t[8];
            for (int64_t k = 0; k < nq; k++) {
              _mm256_store_ps(t, r[k]);
              memcpy(dst + (q0 + k) * w + g, t, (size_t)(w - g) * sizeof(float));
            }
          }
        }
      }
    } else {
      for (int64_t q = 0; q < kb; q++)
        for (int64_t l = 0; l < w; l++) dst[q * w + l] = l < h ? base[l * sl + q * sk] : 0.0f;
    }
  }
}

TARGET2 static void f2_pack(const void *src, int64_t sl, int64_t sk, int64_t n, int64_t kb, bool is_b, void *dst) {
  if (is_b) pack_f32_256(src, sl, sk, n, kb, F2_NR, dst);
  else pack_f32_256(src, sl, sk, n, kb, F2_MR, dst);
}

/* C's tile (+)= the accumulators, cut to mr x nr.  They leave the
 * registers here, once (indexing them in the update below would keep them
 * in memory through the k loop). */
TARGET2 static INLINE void f2_store(const __m256 *acc0, const __m256 *acc1, float *c, int64_t scm, int64_t scn,
                                    int64_t mr, int64_t nr, bool add) {
  _Alignas(32) float t[F2_MR][F2_NR];
#pragma GCC unroll 8
  for (int i = 0; i < F2_MR; i++) _mm256_store_ps(t[i], acc0[i]), _mm256_store_ps(t[i] + 8, acc1[i]);
  __m256i m0 = lanes8(nr), m1 = lanes8(nr - 8);
  for (int i = 0; i < F2_MR && i < mr; i++) {
    float *row = c + i * scm;
    __m256 z = _mm256_setzero_ps();
    if (scn != 1) {
      for (int64_t j = 0; j < nr; j++) row[j * scn] = add ? row[j * scn] + t[i][j] : t[i][j];
    } else if (nr >= 16) {
      _mm256_storeu_ps(row, _mm256_add_ps(add ? _mm256_loadu_ps(row) : z, _mm256_load_ps(t[i])));
      _mm256_storeu_ps(row + 8, _mm256_add_ps(add ? _mm256_loadu_ps(row + 8) : z, _mm256_load_ps(t[i] + 8)));
    } else {
      _mm256_maskstore_ps(row, m0, _mm256_add_ps(add ? _mm256_maskload_ps(row, m0) : z, _mm256_load_ps(t[i])));
      if (nr > 8)
        _mm256_maskstore_ps(row + 8, m1, _mm256_add_ps(add ? _mm256_maskload_ps(row + 8, m1) : z, _mm256_load_ps(t[i] + 8)));
    }
  }
}

/* The 6 x 16 tile over KN steps: A's 6 values of step q contiguous at AP +
 * q SAK (a packed panel: SAK = 6; A in place, m contiguous: its k stride). */
TARGET2 static INLINE void f2_body(const float *ap, int64_t sak, const float *bp, int64_t kn, float *c, int64_t scm,
                                   int64_t scn, int64_t mr, int64_t nr, bool add) {
  __m256 acc0[F2_MR], acc1[F2_MR];
#pragma GCC unroll 8
  for (int i = 0; i < F2_MR; i++) acc0[i] = acc1[i] = _mm256_setzero_ps();
  for (int64_t q = 0; q < kn; q++, ap += sak, bp += F2_NR) {
    __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
    _mm_prefetch((const char *)(bp + 8 * F2_NR), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int i = 0; i < F2_MR; i++) {
      __m256 av = _mm256_broadcast_ss(ap + i);
      acc0[i] = _mm256_fmadd_ps(av, b0, acc0[i]);
      acc1[i] = _mm256_fmadd_ps(av, b1, acc1[i]);
    }
  }
  f2_store(acc0, acc1, c, scm, scn, mr, nr, add);
}

TARGET2 static void f2_tile(const void *ap, const void *bp, int64_t kn, float *c, int64_t scm, int64_t scn, int64_t mr,
                            int64_t nr, bool add) {
  f2_body(ap, F2_MR, bp, kn, c, scm, scn, mr, nr, add);
}

TARGET2 static void f2_tile_am(const void *ap, int64_t lda, const void *bp, int64_t kn, float *c, int64_t scm,
                               int64_t scn, int64_t nr, bool add) {
  f2_body(ap, lda, bp, kn, c, scm, scn, F2_MR, nr, add);
}

/* f2_tile with A in place: 6 rows at stride LDA, k contiguous, addressed
 * from two bases three rows apart. */
TARGET2 static void f2_tile_ak(const void *apv, int64_t lda, const void *bpv, int64_t kn, float *c, int64_t scm,
                               int64_t scn, int64_t nr, bool add) {
  const float *bp = bpv, *r0 = apv, *r3 = r0 + 3 * lda;
  __m256 acc0[F2_MR], acc1[F2_MR];
#pragma GCC unroll 8
  for (int i = 0; i < F2_MR; i++) acc0[i] = acc1[i] = _mm256_setzero_ps();
#define F2_ROW(i, p)                                                                                                  \
  do {                                                                                                                \
    __m256 av = _mm256_broadcast_ss(p);                                                                               \
    acc0[i] = _mm256_fmadd_ps(av, b0, acc0[i]);                                                                       \
    acc1[i] = _mm256_fmadd_ps(av, b1, acc1[i]);                                                                       \
  } while (0)
  for (int64_t q = 0; q < kn; q++, bp += F2_NR) {
    __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
    _mm_prefetch((const char *)(bp + 8 * F2_NR), _MM_HINT_T0);
    F2_ROW(0, r0 + q);
    F2_ROW(1, r0 + q + lda);
    F2_ROW(2, r0 + q + 2 * lda);
    F2_ROW(3, r3 + q);
    F2_ROW(4, r3 + q + lda);
    F2_ROW(5, r3 + q + 2 * lda);
  }
#undef F2_ROW
  f2_store(acc0, acc1, c, scm, scn, F2_MR, nr, add);
}

static const kernel k_bf16 = {BF_MR, BF_NR, 2, 2, bf16_pack, bf16_tile, NULL, NULL};
static const kernel k_f32_512 = {F5_MR, F5_NR, 1, 4, f5_pack, f5_tile, f5_tile_ak, f5_tile_am};
static const kernel k_f32_256 = {F2_MR, F2_NR, 1, 4, f2_pack, f2_tile, f2_tile_ak, f2_tile_am};

/* C^T = B^T A^T: A and B, m and n trade places. */
static void swap_ab(contract *x) {
  const char *t = x->a;
  x->a = x->b, x->b = t;
  for (int l = 0; l < x->nl; l++) {
    int64_t s = x->sa[l];
    x->sa[l] = x->sb[l], x->sb[l] = s;
  }
  int l = x->lm;
  x->lm = x->ln, x->ln = l;
  int64_t b = x->mc;
  x->mc = x->nc, x->nc = b;
}

/* ---- narrow: C of a few rows ------------------------------------------ */

/* A contraction whose C has few rows (a late convolution layer's input
 * gradient: 4 positions by 4608 window elements; its forward as C^T: 8
 * positions by 512 filters) fills a 14 x 32 tile poorly and packs the wide
 * operand only to read it once.  Here the rows get a tile of their own
 * height and wider columns (AVX-512: 4 x 96, 8 x 48, 12 x 32; AVX2: 2 x
 * 48, 4 x 24), the few rows of A are packed once for the whole k range,
 * and B is read in place where its columns are contiguous (else packed a k
 * chunk at a time).  Up to NW_ROWS rows (AVX2: half) in several panels of
 * the tile where B is read in place, one panel otherwise.  Loops that B
 * does not have (the batch of an input gradient read through a transpose)
 * join the rows while they fit, whatever their strides: each row has its
 * own offsets into A and C. */
#define NW_MAXR 12 /* the tallest narrow tile */
#define NW_ROWS 24  /* rows taken in narrow tiles (AVX2: half): two 14-row tiles fill 28 well */
#define NW_KC 8 /* k steps of a chunk, B read in place */
#define NW_KCP 128 /* k steps of a chunk, B packed */
#define NW_KCR 32 /* the same, B read in place by several panels of rows */
#define NW_MAX_A (8 << 20) /* at most this many bytes of A packed */

/* A narrow tile: R rows by NV vectors.  T[r][j] := (LOAD: T[r][j] +) the
 * sum over KN steps of AP[q R + r] B[q LDB + j] (BP: B's step 0 at the
 * tile's columns), each product fused into the sum in k order. */
typedef void (*narrow_fn)(const float *ap, const float *bp, int64_t ldb, int64_t kn, float *t, bool load);

typedef struct narrow {
  narrow_fn tile;
  int r, nr; /* rows, columns (NV vectors) */
  /* B's columns packed in one panel of nr (pack_f32_512 / _256) */
  void (*pack)(const float *src, int64_t sl, int64_t sk, int64_t n, int64_t kb, int64_t w, float *dst);
} narrow;

/* The narrow tile's body for one ISA: R rows by NV vectors of VT (W
 * lanes) in registers; B's line prefetched 8 steps ahead once per 64 bytes. */
#define NARROW_BODY(name, TGT, VT, W, maxr, load, zero, bcast, fma, store)                                         \
  TGT static INLINE void name(int R, int NV, const float *ap, const float *bp, int64_t ldb, int64_t kn, float *t,    \
                              bool ld) {                                                                            \
    VT acc[maxr][6];                                                                                                \
    _Pragma("GCC unroll 16") for (int i = 0; i < R; i++)                                                           \
      _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) acc[i][v] = ld ? load(t + (i * NV + v) * W) : zero();  \
    for (int64_t q = 0; q < kn; q++, ap += R, bp += ldb) {                                                          \
      VT b[6];                                                                                                      \
      _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) {                                                       \
        b[v] = load(bp + W * v);                                                                                    \
        if (v * W % 16 == 0) _mm_prefetch((const char *)(bp + 8 * ldb + W * v), _MM_HINT_T0);                      \
      }                                                                                                             \
      _Pragma("GCC unroll 16") for (int i = 0; i < R; i++) {                                                       \
        VT av = bcast(ap + i);                                                                                      \
        _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) acc[i][v] = fma(av, b[v], acc[i][v]);                 \
      }                                                                                                             \
    }                                                                                                               \
    _Pragma("GCC unroll 16") for (int i = 0; i < R; i++)                                                           \
      _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) store(t + (i * NV + v) * W, acc[i][v]);                 \
  }

#define BCAST512(p) _mm512_set1_ps(*(p))
NARROW_BODY(f5n_body, TARGET5, __m512, 16, NW_MAXR, _mm512_loadu_ps, _mm512_setzero_ps, BCAST512, _mm512_fmadd_ps,
            _mm512_storeu_ps)
NARROW_BODY(f2n_body, TARGET2, __m256, 8, 4, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_broadcast_ss, _mm256_fmadd_ps,
            _mm256_storeu_ps)

TARGET5 static void f5n_4(const float *ap, const float *bp, int64_t ldb, int64_t kn, float *t, bool load) {
  f5n_body(4, 6, ap, bp, ldb, kn, t, load);
}
TARGET5 static void f5n_8(const float *ap, const float *bp, int64_t ldb, int64_t kn, float *t, bool load) {
  f5n_body(8, 3, ap, bp, ldb, kn, t, load);
}
TARGET5 static void f5n_12(const float *ap, const float *bp, int64_t ldb, int64_t kn, float *t, bool load) {
  f5n_body(12, 2, ap, bp, ldb, kn, t, load);
}

TARGET2 static void f2n_2(const float *ap, const float *bp, int64_t ldb, int64_t kn, float *t, bool load) {
  f2n_body(2, 6, ap, bp, ldb, kn, t, load);
}
TARGET2 static void f2n_4(const float *ap, const float *bp, int64_t ldb, int64_t kn, float *t, bool load) {
  f2n_body(4, 3, ap, bp, ldb, kn, t, load);
}

TARGET5 static void f5n_pack(const float *src, int64_t sl, int64_t sk, int64_t n, int64_t kb, int64_t w, float *dst) {
  pack_f32_512(src, sl, sk, n, kb, w, dst);
}
TARGET2 static void f2n_pack(const float *src, int64_t sl, int64_t sk, int64_t n, int64_t kb, int64_t w, float *dst) {
  pack_f32_256(src, sl, sk, n, kb, w, dst);
}

static const narrow nw_512[] = {{f5n_4, 4, 96, f5n_pack}, {f5n_8, 8, 48, f5n_pack}, {f5n_12, 12, 32, f5n_pack}};
static const narrow nw_256[] = {{f2n_2, 2, 48, f2n_pack}, {f2n_4, 4, 24, f2n_pack}};

typedef struct narrow_run {
  const contract *x;
  const narrow *w;
  const float *ap;             /* A's rows packed by panels of w->r: [panel][K][r], zeros past the rows */
  const int64_t *oc;           /* each row's offset into C */
  int64_t rows, panels, ncb;   /* rows, their panels, column blocks */
  bool in_place;               /* B read in place */
} narrow_run;

/* C's rows of panel P += (ADD; else =) T's, columns [0, nr) at stride SCN. */
static void narrow_store(const narrow_run *n, int64_t p, float *c, const float *t, int64_t nr, int64_t scn, bool add) {
  int64_t w = n->w->nr, R = n->w->r;
  for (int64_t i = 0; i < R && p * R + i < n->rows; i++) {
    float *row = c + n->oc[p * R + i];
    const float *ti = t + i * w;
    if (scn == 1 && add)
      for (int64_t j = 0; j < nr; j++) row[j] += ti[j];
    else if (scn == 1)
      memcpy(row, ti, (size_t)nr * sizeof *row);
    else if (add)
      for (int64_t j = 0; j < nr; j++) row[j * scn] += ti[j];
    else
      for (int64_t j = 0; j < nr; j++) row[j * scn] = ti[j];
  }
}

/* Task T: a block of columns, all of k: k chunk by k chunk, each chunk
 * over every panel of columns and, for each, every panel of rows (B read
 * in place is then read row after row, as it lies in memory, rather than
 * down one panel's columns 4 KiB apart at a time: 3x faster from DRAM),
 * the sums kept in a buffer of the block's tiles, added to C at the end. */
static void narrow_tasks(void **argv, int64_t lo, int64_t hi) {
  const narrow_run *n = argv[0];
  const contract *x = n->x;
  int64_t NR = n->w->nr, R = n->w->r, P = n->panels, N = x->size[x->ln], K = x->size[x->lk];
  int64_t sbn = x->sb[x->ln], sbk = x->sb[x->lk], scn = x->sc[x->ln];
  int64_t per = ((N + n->ncb - 1) / n->ncb + NR - 1) / NR * NR, kc = !n->in_place ? NW_KCP : P == 1 ? NW_KC : NW_KCR;
  if (kc > K) kc = K;
  float *pb = aligned_alloc(64, (size_t)(kc * NR * 4 + 63) / 64 * 64);
  float *t = aligned_alloc(64, (size_t)(per * P * R * 4 + 63) / 64 * 64);
  if (!pb || !t) abort(); /* (as run_tasks) */
  const float *b = (const float *)x->b;
  for (int64_t cb = lo; cb < hi; cb++) {
    int64_t jlo = cb * per, jhi = jlo + per < N ? jlo + per : N;
    for (int64_t p0 = 0; p0 < K; p0 += kc) {
      int64_t kb = K - p0 < kc ? K - p0 : kc;
      for (int64_t j0 = jlo; j0 < jhi; j0 += NR) {
        int64_t nr = jhi - j0 < NR ? jhi - j0 : NR, ldb = NR;
        const float *bp = pb;
        if (n->in_place && nr == NR) bp = b + p0 * sbk + j0 * sbn, ldb = sbk;
        else n->w->pack(b + p0 * sbk + j0 * sbn, sbn, sbk, nr, kb, NR, pb); /* (an edge: zeros past it) */
        for (int64_t p = 0; p < P; p++)
          n->w->tile(n->ap + (p * K + p0) * R, bp, ldb, kb, t + ((j0 - jlo) * P + p * NR) * R, p0 > 0);
      }
    }
    for (int64_t j0 = jlo; j0 < jhi; j0 += NR)
      for (int64_t p = 0; p < P; p++)
        narrow_store(n, p, x->c + j0 * scn, t + ((j0 - jlo) * P + p * NR) * R, jhi - j0 < NR ? jhi - j0 : NR, scn,
                     !x->zero_c);
  }
  free(pb);
  free(t);
}

/* The narrow tile for ROWS rows: the fewest rows of padding, then the
 * tallest. */
static const narrow *narrow_for(const narrow *ws, int nws, int64_t rows) {
  const narrow *best = ws;
  for (int i = 1; i < nws; i++) {
    int64_t pad = (rows + ws[i].r - 1) / ws[i].r * ws[i].r, bpad = (rows + best->r - 1) / best->r * best->r;
    if (pad <= bpad) best = &ws[i];
  }
  return best;
}

/* C's rows (the smaller side of C) joined with the outer loops B does not
 * have, while they are at most NW_ROWS; false (X as it was) when there
 * are more. */
static bool run_narrow(contract *x) {
  if (x->k != &k_f32_512 && x->k != &k_f32_256) return false;
  const narrow *ws = x->k == &k_f32_512 ? nw_512 : nw_256;
  int nws = x->k == &k_f32_512 ? 3 : 2, maxr = x->k == &k_f32_512 ? NW_ROWS : NW_ROWS / 2;
  int64_t M = x->size[x->lm], N = x->size[x->ln], K = x->size[x->lk];
  if ((M < N ? M : N) > maxr || K * (maxr + NW_MAXR) * 4 > NW_MAX_A) return false;
  if (N < M) swap_ab(x); /* (kept if the 14 x 32 tiles take it after all: either way round is C) */
  /* the outer loops that join the rows */
  bool join[RT_CONTRACT_MAXL] = {false};
  int64_t rows = x->size[x->lm];
  for (int l = 0; l < x->nl; l++)
    if (l != x->lm && l != x->ln && l != x->lk && x->size[l] >= 2 && x->sb[l] == 0 && rows * x->size[l] <= maxr)
      join[l] = true, rows *= x->size[l];
  const narrow *w = narrow_for(ws, nws, rows);
  int64_t R = w->r, P = (rows + R - 1) / R;
  if (P > 1 && x->sb[x->ln] != 1) return false; /* B packed for several panels of rows: the 14 x 32 tiles are faster */
  int64_t oa[NW_ROWS], oc[NW_ROWS], have = x->size[x->lm];
  for (int64_t i = 0; i < have; i++) oa[i] = i * x->sa[x->lm], oc[i] = i * x->sc[x->lm];
  for (int l = 0; l < x->nl; l++) {
    if (!join[l]) continue;
    for (int64_t j = 1; j < x->size[l]; j++)
      for (int64_t i = 0; i < have; i++)
        oa[j * have + i] = oa[i] + j * x->sa[l], oc[j * have + i] = oc[i] + j * x->sc[l];
    have *= x->size[l];
    x->nouter /= x->size[l];
    x->size[l] = 1;
  }
  float *ap = aligned_alloc(64, (size_t)(P * K * R * 4 + 63) / 64 * 64);
  if (!ap) abort();
  const float *a = (const float *)x->a;
  int64_t sak = x->sa[x->lk];
  narrow_run n = {x, w, ap, oc, rows, P, 1, x->sb[x->ln] == 1};
  /* the columns in blocks: two per thread at least, of whole tiles */
  int threads = nova_rt_threads();
  int64_t panels = (x->size[x->ln] + w->nr - 1) / w->nr;
  n.ncb = threads > 1 ? 2 * (int64_t)threads : 1;
  if (n.ncb > panels) n.ncb = panels;
  for (int64_t o = 0; o < x->nouter; o++) {
    int64_t ooa, oob, ooc;
    outer_offsets(x, o, &ooa, &oob, &ooc);
    for (int64_t p = 0; p < P; p++)
      for (int64_t q = 0; q < K; q++)
        for (int64_t i = 0; i < R; i++)
          ap[(p * K + q) * R + i] = p * R + i < rows ? a[ooa + oa[p * R + i] + q * sak] : 0.0f;
    contract one = *x; /* this outer iteration alone */
    one.b = x->b + oob * 4, one.c = x->c + ooc;
    n.x = &one;
    void *argv[1] = {&n};
    if (n.ncb == 1) narrow_tasks(argv, 0, 1);
    else nova_rt_parallel_for(narrow_tasks, argv, 0, n.ncb, 1);
  }
  free(ap);
  return true;
}

/* ---- blocks and tasks -------------------------------------------------- */

/* One task: an outer iteration, an n block and a group of rows (whole
 * register tiles, mc at a time); k block by block, B's block packed once
 * for the group. */
static void block(const contract *x, int64_t t, char *pa, char *pb) {
  const kernel *kr = x->k;
  int64_t MR = kr->mr, NR = kr->nr;
  int64_t g = t % x->mgroups, nbk = (t / x->mgroups) % x->nblocks, o = t / x->mgroups / x->nblocks;
  int64_t oa, ob, oc;
  outer_offsets(x, o, &oa, &ob, &oc);
  int64_t M = x->size[x->lm], N = x->size[x->ln], K = x->size[x->lk];
  int64_t panels = (M + MR - 1) / MR;
  int64_t mlo = g * panels / x->mgroups * MR, mhi = (g + 1) * panels / x->mgroups * MR;
  if (mhi > M) mhi = M;
  /* blocks of at most mc rows, of one size (whole tiles) */
  int64_t nblk = (mhi - mlo + x->mc - 1) / x->mc, mc = ((mhi - mlo + nblk - 1) / nblk + MR - 1) / MR * MR;
  int64_t j0 = nbk * x->nc, nb = N - j0 < x->nc ? N - j0 : x->nc;
  int64_t scm = x->sc[x->lm], scn = x->sc[x->ln], sam = x->sa[x->lm], sak = x->sa[x->lk];
  const char *a = x->a + oa * (int64_t)kr->esize, *b = x->b + ob * (int64_t)kr->esize;
  for (int64_t p0 = 0; p0 < K; p0 += x->kc) {
    int64_t kb = K - p0 < x->kc ? K - p0 : x->kc, ks = (kb + kr->ku - 1) / kr->ku;
    int64_t panel = ks * kr->ku * (int64_t)kr->esize; /* bytes of one panel line */
    int64_t es = (int64_t)kr->esize, sbk = x->sb[x->lk], sbn = x->sb[x->ln];
    bool add = p0 > 0 || !x->zero_c; /* the first k block stores into a C to be zeroed */
    kr->pack(b + (p0 * sbk + j0 * sbn) * es, sbn, sbk, nb, kb, true, pb);
    for (int64_t i0 = mlo; i0 < mhi; i0 += mc) {
      int64_t mb = mhi - i0 < mc ? mhi - i0 : mc;
      /* whole tiles of A read in place where the kernel can (k contiguous);
       * the rest packed (the edge: zeros past it) */
      int64_t inplace = x->inplace_a ? mb / MR * MR : 0;
      if (inplace < mb) kr->pack(a + ((i0 + inplace) * sam + p0 * sak) * es, sam, sak, mb - inplace, kb, false, pa);
      for (int64_t jr = 0; jr < nb; jr += NR) {
        int64_t nr = nb - jr < NR ? nb - jr : NR;
        for (int64_t ir = 0; ir < mb; ir += MR) {
          float *c = x->c + oc + (i0 + ir) * scm + (j0 + jr) * scn;
          if (ir < inplace && x->inplace_a == 1)
            kr->tile_ak(a + ((i0 + ir) * sam + p0) * (int64_t)kr->esize, sam, pb + jr * panel, ks, c, scm, scn, nr, add);
          else if (ir < inplace)
            kr->tile_am(a + (i0 + ir + p0 * sak) * (int64_t)kr->esize, sak, pb + jr * panel, ks, c, scm, scn, nr, add);
          else
            kr->tile(pa + (ir - inplace) * panel, pb + jr * panel, ks, c, scm, scn, mb - ir < MR ? mb - ir : MR, nr,
                     add);
        }
      }
    }
  }
}

#define RT_CONTRACT_STACK 32768 /* bytes of packed panels kept on the stack; more: the heap */

static void run_tasks(void **argv, int64_t lo, int64_t hi) {
  const contract *x = argv[0];
  const kernel *kr = x->k;
  int64_t kcr = (x->kc + kr->ku - 1) / kr->ku * kr->ku;
  int64_t mcr = (x->mc + kr->mr - 1) / kr->mr * kr->mr, ncr = (x->nc + kr->nr - 1) / kr->nr * kr->nr;
  size_t abytes = ((size_t)(kcr * mcr) * kr->esize + 63) / 64 * 64, bytes = abytes + (size_t)(kcr * ncr) * kr->esize;
  _Alignas(64) char small[RT_CONTRACT_STACK];
  char *buf = bytes <= sizeof small ? small : aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!buf) abort(); /* a few hundred KiB; a step that cannot get them cannot go on */
  for (int64_t t = lo; t < hi; t++) block(x, t, buf, buf + abytes);
  if (buf != small) free(buf);
}

/* Whether MR lines STRIDE bytes apart, read side by side, keep their
 * lines in L1 together: at most RT_L1_WAYS - 1 of them on one set (lines
 * that share bits 6-11 of their address share a set, on every x86 L1 of
 * 32 KiB and 8 ways or 48 KiB and 12 ways).  A's rows 4 KiB apart (K =
 * 1024 f32) all fall on one set and evict each other: A is packed instead.
 * Measured on a Zen 4, 1 thread, GFLOP/s in place / packed: rows 1 KiB
 * apart (K = 256) 107 / 104; 4 KiB apart 89 / 104; m contiguous, k steps
 * 2 KiB apart (M = 512) 107 / 105, 4 KiB apart 92 / 96. */
#define RT_L1_SET_SPAN 4096
#define RT_L1_WAYS 8
static bool rows_spread(int64_t stride, int mr) {
  int count[RT_L1_SET_SPAN / 64] = {0}, most = 0;
  for (int i = 0; i < mr; i++) {
    int set = (int)((i * stride) % RT_L1_SET_SPAN / 64);
    if (++count[set] > most) most = count[set];
  }
  return most < RT_L1_WAYS;
}

static int64_t clamp_block(int64_t v, int64_t unit, int64_t range) {
  if (v < unit) v = unit;
  v = v / unit * unit;
  return v > range ? (range + unit - 1) / unit * unit : v;
}

/* Blocks of 0 (or for another register tile): the kernel's own, BLIS's
 * rule of thumb for a 32 KiB L1 and 1 MiB L2. */
/* The share of the register tiles' lanes that hold C's elements, for M
 * rows in tiles of MR and N columns in tiles of NR. */
static double tile_use(int64_t M, int64_t N, int mr, int nr) {
  return (double)M / (double)((M + mr - 1) / mr * mr) * (double)N / (double)((N + nr - 1) / nr * nr);
}

static void run_blocked(contract *x) {
  const kernel *kr = x->k;
  if (run_narrow(x)) return;
  /* few columns and many rows (a convolution's late layer: 8 positions,
   * 4608 rows): C^T = B^T A^T fills the wide side of the tile instead */
  if (tile_use(x->size[x->ln], x->size[x->lm], kr->mr, kr->nr) >
      1.25 * tile_use(x->size[x->lm], x->size[x->ln], kr->mr, kr->nr))
    swap_ab(x);
  int64_t M = x->size[x->lm], N = x->size[x->ln], K = x->size[x->lk];
  x->mc = clamp_block(x->mc > 0 ? x->mc : 8 * kr->mr, kr->mr, M);
  x->nc = clamp_block(x->nc > 0 ? x->nc : 16 * kr->nr, kr->nr, N);
  x->kc = clamp_block(x->kc > 0 ? x->kc : 256, kr->ku, K);
  x->nblocks = (N + x->nc - 1) / x->nc;
  int64_t sam = x->sa[x->lm] * (int64_t)kr->esize, sak = x->sa[x->lk] * (int64_t)kr->esize;
  x->inplace_a = kr->tile_ak && sak == (int64_t)kr->esize && rows_spread(sam, kr->mr)            ? 1
                 : kr->tile_am && sam == (int64_t)kr->esize && rows_spread(sak, RT_L1_WAYS) ? 2
                                                                                             : 0;
  /* with several threads, at least two tasks per thread where the rows
   * allow (whole register tiles each); one thread: the blocks alone.  The
   * tasks of one outer iteration share the work by columns (each packs
   * the whole of A, unless A is read in place) or by rows (each packs the
   * whole of B): whichever packs less twice */
  int threads = nova_rt_threads();
  int64_t want = threads > 1 ? 2 * (int64_t)threads : 1, panels = (M + kr->mr - 1) / kr->mr;
  if (x->nouter * x->nblocks < want) {
    int64_t per = (want + x->nouter - 1) / x->nouter, nc = ((N + per - 1) / per + kr->nr - 1) / kr->nr * kr->nr;
    if (nc >= 2 * kr->nr && nc < x->nc && (x->inplace_a || M <= N)) {
      x->nc = nc;
      x->nblocks = (N + nc - 1) / nc;
    }
  }
  x->mgroups = 1;
  if (x->nouter * x->nblocks < want) x->mgroups = (want + x->nouter * x->nblocks - 1) / (x->nouter * x->nblocks);
  if (x->mgroups > panels) x->mgroups = panels;
  int64_t n = x->nouter * x->nblocks * x->mgroups;
  void *argv[1] = {x};
  if (n == 1) run_tasks(argv, 0, 1);
  else nova_rt_parallel_for(run_tasks, argv, 0, n, 1);
}
#else
#define HAVE_BLOCKED 0
#endif

/* ---- any CPU ----------------------------------------------------------- */

static float bf16_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float elem(const char *p, int64_t i, size_t esize) {
  if (esize == 2) return bf16_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

/* The same sums, one element of C at a time. */
static void run_plain(const contract *x, size_t esize) {
  int64_t M = x->size[x->lm], N = x->size[x->ln], K = x->size[x->lk];
  for (int64_t o = 0; o < x->nouter; o++) {
    int64_t oa, ob, oc;
    outer_offsets(x, o, &oa, &ob, &oc);
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        int64_t ia = oa + i * x->sa[x->lm], ib = ob + j * x->sb[x->ln];
        float s = 0, *c = &x->c[oc + i * x->sc[x->lm] + j * x->sc[x->ln]];
        for (int64_t p = 0; p < K; p++)
          s += elem(x->a, ia + p * x->sa[x->lk], esize) * elem(x->b, ib + p * x->sb[x->lk], esize);
        *c = x->zero_c ? s : *c + s;
      }
  }
}

/* X from the call's arguments; false: nothing to do (a loop of size 0,
 * but k's when C is to be zeroed: run_plain writes the zeros). */
static bool read_desc(contract *x, int64_t a, int64_t b, int64_t c, int64_t desc) {
  const int64_t *d = (const int64_t *)(intptr_t)desc;
  *x = (contract){.a = (const char *)(intptr_t)a, .b = (const char *)(intptr_t)b, .c = (float *)(intptr_t)c,
                  .nl = (int)d[0], .lm = (int)d[1], .ln = (int)d[2], .lk = (int)d[3], .mc = d[4], .nc = d[5], .kc = d[6],
                  .zero_c = (d[7] & RT_CONTRACT_ZERO_C) != 0};
  if (x->nl < 3 || x->nl > RT_CONTRACT_MAXL) abort(); /* written by novac: never */
  const int64_t *ls = d + RT_CONTRACT_HEAD;
  for (int l = 0; l < x->nl; l++) {
    x->size[l] = ls[l];
    x->sa[l] = ls[x->nl + l];
    x->sb[l] = ls[2 * x->nl + l];
    x->sc[l] = ls[3 * x->nl + l];
    if (x->size[l] < 1 && !(l == x->lk && x->zero_c)) return false;
  }
  /* an outer loop that continues m in A and C and that B does not have (a
   * batch of rows: [batch, T, k] x [k, n]) joins m: one B block serves
   * all; one that continues n in B and C and that A does not have (heads:
   * [T, k] x [k, h, d]) joins n: A is packed once for all */
  for (int joined = 1; joined;) {
    joined = 0;
    for (int l = 0; l < x->nl; l++) {
      if (l == x->lm || l == x->ln || l == x->lk || x->size[l] < 2) continue;
      if (x->sb[l] == 0 && x->sa[l] == x->sa[x->lm] * x->size[x->lm] &&
          x->sc[l] == x->sc[x->lm] * x->size[x->lm]) {
        x->size[x->lm] *= x->size[l];
        x->size[l] = 1;
        joined = 1;
      } else if (x->sa[l] == 0 && x->sb[l] == x->sb[x->ln] * x->size[x->ln] &&
                 x->sc[l] == x->sc[x->ln] * x->size[x->ln]) {
        x->size[x->ln] *= x->size[l];
        x->size[l] = 1;
        joined = 1;
      }
    }
  }
  x->nouter = 1;
  for (int l = 0; l < x->nl; l++)
    if (l != x->lm && l != x->ln && l != x->lk) x->nouter *= x->size[l];
  return true;
}

/* What this CPU runs: bit 0 AVX2 + FMA, bit 1 AVX-512 (F, BW, VL), bit 2
 * AVX-512 BF16; 0 with NOVA_CONTRACT_PLAIN=1. */
static int cpu_kernels(void) {
  static int has = -1;
  if (has >= 0) return has;
  int h = 0;
#if HAVE_BLOCKED
  __builtin_cpu_init();
  const char *plain = getenv("NOVA_CONTRACT_PLAIN"), *isa = getenv("NOVA_CONTRACT_ISA");
  if (!(plain && *plain == '1')) {
    h |= __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
    if (!(isa && !strcmp(isa, "avx2"))) {
      bool f = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
      h |= f ? 2 : 0;
      h |= f && __builtin_cpu_supports("avx512bf16") ? 4 : 0;
    }
  }
#endif
  return has = h;
}

void nova_rt_contract_bf16(int64_t a, int64_t b, int64_t c, int64_t desc) {
  contract x;
  if (!read_desc(&x, a, b, c, desc)) return;
#if HAVE_BLOCKED
  if ((cpu_kernels() & 4) && x.size[x.lk] > 0) {
    x.k = &k_bf16;
    run_blocked(&x);
    return;
  }
#endif
  run_plain(&x, 2); /* a step built for another CPU */
}

void nova_rt_contract_f32(int64_t a, int64_t b, int64_t c, int64_t desc) {
  contract x;
  if (!read_desc(&x, a, b, c, desc)) return;
#if HAVE_BLOCKED
  int h = cpu_kernels();
  if ((h & 3) && x.size[x.lk] > 0) {
    x.k = h & 2 ? &k_f32_512 : &k_f32_256;
    run_blocked(&x);
    return;
  }
#endif
  run_plain(&x, 4);
}
