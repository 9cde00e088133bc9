/* rt_contract.c: the CPU's bf16 contraction kernel.
 *
 * novac (codegen/cpu_ukernel.c) replaces a contraction C += A * B whose A
 * and B are bf16 and whose C is f32, on a host with AVX-512 BF16, by a call
 * nova_rt_contract_bf16(A, B, C, desc): vdpbf16ps multiplies pairs of bf16
 * along k and accumulates them in f32, twice the multiply-adds of an f32
 * FMA per instruction, reading half the bytes.  The pairs must sit next to
 * each other in a register, so the kernel packs, as BLIS does: a kc x nc
 * block of B into panels of NR columns, each a run of k pairs
 * [kc/2][NR][2]; an mc x kc block of A into panels of MR rows [kc/2][MR][2];
 * then an MR x NR register tile of C accumulates over the block's k pairs.
 * Packing reads any strides (a transposed operand is as fast as a plain
 * one: lines contiguous, two k rows are interleaved in registers; k
 * contiguous, 16 x 16 blocks of k pairs are transposed in registers) and
 * pads the edges with zeros, so the register tile always runs whole; only
 * its store to C is cut to the edge.
 *
 * desc (int64, written by novac): [0] the number of loops L (at most
 * RT_CONTRACT_MAXL), [1..3] which loop is m, n and k, [4..6] mc, nc, kc
 * (the cache blocks, from the configurator: kc even), then L loop sizes and
 * L element strides for each of A, B and C (0: the operand does not vary
 * along that loop).  Loops other than m, n and k (batch dims, a second m
 * dim) are outer loops.  The blocks of different outer iterations and of
 * different m and n blocks write disjoint parts of C: they are shared out
 * on the step's threads (nova_rt_parallel_for); the k blocks of one tile
 * run in order.
 *
 * A CPU without AVX-512 BF16 (a step built for another machine) gets the
 * same sums one element of C at a time (NOVA_CONTRACT_PLAIN=1 takes that
 * path anywhere, for tests).
 *
 * Numerics: each product of two bf16 values is exact in f32; vdpbf16ps adds
 * the two products of a pair to the f32 accumulator, rounding to nearest
 * even with denormal inputs and results flushed to zero.  The sum runs over
 * k in order, one pair at a time, per kc block.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RT_CONTRACT_MAXL 8
#define MR 12 /* the register tile: MR rows of C by NR columns (two zmm registers) */
#define NR 32

typedef void (*rt_task)(void **argv, int64_t lo, int64_t hi);
void nova_rt_parallel_for(rt_task task, void **argv, int64_t lb, int64_t ub, int64_t step);
int nova_rt_threads(void);
void nova_rt_contract_bf16(int64_t a, int64_t b, int64_t c, int64_t desc);

typedef struct contract {
  const uint16_t *a, *b;
  float *c;
  int nl, lm, ln, lk;
  int64_t mc, nc, kc;
  int64_t size[RT_CONTRACT_MAXL], sa[RT_CONTRACT_MAXL], sb[RT_CONTRACT_MAXL], sc[RT_CONTRACT_MAXL];
  int64_t nouter, nblocks, mgroups;
} contract;

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

#define TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))


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

/* R[k] := column k of the 16 x 16 u32 matrix whose rows are R. */
TARGET static inline __attribute__((always_inline)) void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; j++) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

/* The k-contiguous case of pack_pairs: the pairs (u32) of 16 lines at a
 * time, 16 pairs at a time, transposed in registers. */
TARGET static inline __attribute__((always_inline)) void pack_k_contiguous(const uint16_t *base, int64_t sl,
                                                                           int64_t h, int64_t kb, int64_t w,
                                                                           uint32_t *d32) {
  int64_t full = kb / 2;
  for (int64_t g = 0; g < w; g += 16) {
    int64_t lines = w - g < 16 ? w - g : 16;
    __mmask16 lm = lines == 16 ? 0xFFFF : (__mmask16)((1u << lines) - 1);
    for (int64_t q0 = 0; q0 < full; q0 += 16) {
      int64_t nq = full - q0 < 16 ? full - q0 : 16;
      __mmask16 qm = nq == 16 ? 0xFFFF : (__mmask16)((1u << nq) - 1);
      __m512i r[16];
      for (int l = 0; l < 16; l++)
        r[l] = g + l < h ? _mm512_maskz_loadu_epi32(qm, base + (g + l) * sl + 2 * q0) : _mm512_setzero_si512();
      transpose16(r);
      for (int64_t k = 0; k < nq; k++) _mm512_mask_storeu_epi32(d32 + (q0 + k) * w + g, lm, r[k]);
    }
  }
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

/* A's rows [i0, i0 + mb) and k [p0, p0 + kb) as panels of MR rows
 * (dst[q][i][2] = A[i, 2q], A[i, 2q + 1]); B's k [p0, p0 + kb) and columns
 * [j0, j0 + nb) as panels of NR columns (dst[q][j][2] = B[2q, j],
 * B[2q + 1, j]). */
TARGET static void pack_a(const contract *x, const uint16_t *a, int64_t i0, int64_t mb, int64_t p0, int64_t kb,
                          uint16_t *dst) {
  int64_t sm = x->sa[x->lm], sk = x->sa[x->lk];
  pack_pairs(a + i0 * sm + p0 * sk, sm, sk, mb, kb, MR, dst);
}

TARGET static void pack_b(const contract *x, const uint16_t *b, int64_t p0, int64_t kb, int64_t j0, int64_t nb,
                          uint16_t *dst) {
  int64_t sk = x->sb[x->lk], sn = x->sb[x->ln];
  pack_pairs(b + p0 * sk + j0 * sn, sn, sk, nb, kb, NR, dst);
}

/* C[MR x NR tile at c] += the packed panels' product over KP k pairs; the
 * tile is cut to mr x nr rows and columns. */
TARGET static void tile(const uint16_t *ap, const uint16_t *bp, int64_t kp, float *c, int64_t scm, int64_t scn,
                        int64_t mr, int64_t nr) {
  __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; i++) acc0[i] = acc1[i] = _mm512_setzero_ps();
  for (int64_t q = 0; q < kp; q++, ap += MR * 2, bp += NR * 2) {
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 32);
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
      uint32_t pair;
      memcpy(&pair, ap + 2 * i, 4);
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair);
      acc0[i] = _mm512_dpbf16_ps(acc0[i], av, b0);
      acc1[i] = _mm512_dpbf16_ps(acc1[i], av, b1);
    }
  }
  if (scn == 1) {
    __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    for (int i = 0; i < MR && i < mr; i++) {
      float *row = c + i * scm;
      _mm512_mask_storeu_ps(row, m0, _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), acc0[i]));
      if (m1) _mm512_mask_storeu_ps(row + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), acc1[i]));
    }
    return;
  }
  float t[NR];
  for (int i = 0; i < MR && i < mr; i++) {
    _mm512_storeu_ps(t, acc0[i]);
    _mm512_storeu_ps(t + 16, acc1[i]);
    for (int64_t j = 0; j < nr; j++) c[i * scm + j * scn] += t[j];
  }
}

/* One task: an outer iteration, an n block and a group of rows (whole
 * register tiles, mc at a time); k block by block, B's block packed once
 * for the group. */
TARGET static void block(const contract *x, int64_t t, uint16_t *pa, uint16_t *pb) {
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
  int64_t scm = x->sc[x->lm], scn = x->sc[x->ln];
  for (int64_t p0 = 0; p0 < K; p0 += x->kc) {
    int64_t kb = K - p0 < x->kc ? K - p0 : x->kc, kp = (kb + 1) / 2;
    pack_b(x, x->b + ob, p0, kb, j0, nb, pb);
    for (int64_t i0 = mlo; i0 < mhi; i0 += mc) {
      int64_t mb = mhi - i0 < mc ? mhi - i0 : mc;
      pack_a(x, x->a + oa, i0, mb, p0, kb, pa);
      for (int64_t jr = 0; jr < nb; jr += NR)
        for (int64_t ir = 0; ir < mb; ir += MR)
          tile(pa + (ir / MR) * kp * MR * 2, pb + (jr / NR) * kp * NR * 2, kp,
               x->c + oc + (i0 + ir) * scm + (j0 + jr) * scn, scm, scn, mb - ir, nb - jr);
    }
  }
}

static size_t pack_elems(const contract *x) {
  int64_t kp = (x->kc + 1) / 2;
  int64_t mcr = (x->mc + MR - 1) / MR * MR, ncr = (x->nc + NR - 1) / NR * NR;
  return (size_t)(kp * 2 * (mcr + ncr));
}

#define RT_CONTRACT_STACK 32768 /* bytes of packed panels kept on the stack; more: the heap */

static void run_tasks(void **argv, int64_t lo, int64_t hi) {
  const contract *x = argv[0];
  size_t bytes = (pack_elems(x) * sizeof(uint16_t) + 63) / 64 * 64;
  _Alignas(64) uint16_t small[RT_CONTRACT_STACK / sizeof(uint16_t)];
  uint16_t *buf = bytes <= sizeof small ? small : aligned_alloc(64, bytes);
  if (!buf) abort(); /* a few hundred KiB; a step that cannot get them cannot go on */
  int64_t mcr = (x->mc + MR - 1) / MR * MR;
  for (int64_t t = lo; t < hi; t++) block(x, t, buf, buf + (x->kc + 1) / 2 * 2 * mcr);
  if (buf != small) free(buf);
}

static int64_t clamp_block(int64_t v, int64_t unit, int64_t range) {
  if (v < unit) v = unit;
  v = v / unit * unit;
  return v > range ? (range + unit - 1) / unit * unit : v;
}

static void run_blocked(contract *x) {
  int64_t M = x->size[x->lm], N = x->size[x->ln], K = x->size[x->lk];
  x->mc = clamp_block(x->mc, MR, M);
  x->nc = clamp_block(x->nc, NR, N);
  x->kc = clamp_block(x->kc, 2, K);
  x->nblocks = (N + x->nc - 1) / x->nc;
  /* with several threads, at least two tasks per thread where the rows
   * allow (whole register tiles each); one thread: the blocks alone */
  int threads = nova_rt_threads();
  int64_t want = threads > 1 ? 2 * (int64_t)threads : 1, panels = (M + MR - 1) / MR;
  x->mgroups = 1;
  if (x->nouter * x->nblocks < want) x->mgroups = (want + x->nouter * x->nblocks - 1) / (x->nouter * x->nblocks);
  if (x->mgroups > panels) x->mgroups = panels;
  int64_t n = x->nouter * x->nblocks * x->mgroups;
  void *argv[1] = {x};
  if (n == 1) run_tasks(argv, 0, 1);
  else nova_rt_parallel_for(run_tasks, argv, 0, n, 1);
}
#define HAVE_BLOCKED 1
#else
#define HAVE_BLOCKED 0
#endif

static float bf16_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Any CPU: the same sums, one element of C at a time. */
static void run_plain(const contract *x) {
  int64_t M = x->size[x->lm], N = x->size[x->ln], K = x->size[x->lk];
  for (int64_t o = 0; o < x->nouter; o++) {
    int64_t oa, ob, oc;
    outer_offsets(x, o, &oa, &ob, &oc);
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        const uint16_t *pa = x->a + oa + i * x->sa[x->lm], *pb = x->b + ob + j * x->sb[x->ln];
        float s = 0;
        for (int64_t p = 0; p < K; p++) s += bf16_f32(pa[p * x->sa[x->lk]]) * bf16_f32(pb[p * x->sb[x->lk]]);
        x->c[oc + i * x->sc[x->lm] + j * x->sc[x->ln]] += s;
      }
  }
}

void nova_rt_contract_bf16(int64_t a, int64_t b, int64_t c, int64_t desc) {
  const int64_t *d = (const int64_t *)(intptr_t)desc;
  contract x = {.a = (const uint16_t *)(intptr_t)a, .b = (const uint16_t *)(intptr_t)b, .c = (float *)(intptr_t)c,
                .nl = (int)d[0], .lm = (int)d[1], .ln = (int)d[2], .lk = (int)d[3], .mc = d[4], .nc = d[5], .kc = d[6]};
  if (x.nl < 3 || x.nl > RT_CONTRACT_MAXL) abort(); /* written by novac: never */
  for (int l = 0; l < x.nl; l++) {
    x.size[l] = d[7 + l];
    x.sa[l] = d[7 + x.nl + l];
    x.sb[l] = d[7 + 2 * x.nl + l];
    x.sc[l] = d[7 + 3 * x.nl + l];
    if (x.size[l] < 1) return;
  }
  /* an outer loop that continues m in A and C and that B does not have (a
   * batch of rows: [batch, T, k] x [k, n]) joins m: one B block serves all */
  for (int joined = 1; joined;) {
    joined = 0;
    for (int l = 0; l < x.nl; l++)
      if (l != x.lm && l != x.ln && l != x.lk && x.size[l] > 1 && x.sb[l] == 0 &&
          x.sa[l] == x.sa[x.lm] * x.size[x.lm] && x.sc[l] == x.sc[x.lm] * x.size[x.lm]) {
        x.size[x.lm] *= x.size[l];
        x.size[l] = 1;
        joined = 1;
      }
  }
  x.nouter = 1;
  for (int l = 0; l < x.nl; l++)
    if (l != x.lm && l != x.ln && l != x.lk) x.nouter *= x.size[l];
#if HAVE_BLOCKED
  static int has = -1;
  if (has < 0) {
    __builtin_cpu_init();
    const char *plain = getenv("NOVA_CONTRACT_PLAIN"); /* tests: the path of other CPUs */
    has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && !(plain && *plain == '1');
  }
  if (has) {
    run_blocked(&x);
    return;
  }
#endif
  run_plain(&x); /* a step built for another CPU */
}
