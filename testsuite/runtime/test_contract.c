/* test_contract.c: nova_rt_contract_bf16 and nova_rt_contract_f32
 * (runtime/rt_contract.c) against a float64 reference: C += A * B over bf16
 * (f32) A and B and an f32 C that holds values already, for register-tile
 * edges in m, n and odd k, cache blocks smaller than the ranges,
 * transposed A and B (k contiguous or not), a C with a column stride,
 * batch loops (one shared by A, B and C, one of A only, one of B only), A
 * read in place or packed, few columns (computed as C^T), few rows (the
 * narrow tiles: rows of a loop of A only joined to m, B in place or
 * packed k chunk by k chunk), and blocks of 0
 * (the kernel's own); each also with the flag RT_CONTRACT_ZERO_C (C = A * B:
 * C's elements start as NaN, which must not be read; k of 0 gives zeros),
 * the gaps a column stride leaves untouched.  Each
 * element must be within 1e-5 of the sum of |a*b| over its k (f32 rounding
 * of K sums) of the reference.  Exit 0 and "contract: ok", or 1 with the
 * first bad element.  testsuite/runtime/run.sh runs it with
 * NOVA_NUM_THREADS=3, 2 and 1, with NOVA_CONTRACT_PLAIN=1 (the path of
 * CPUs without the vector kernels) and NOVA_CONTRACT_ISA=avx2 (the AVX2
 * kernel on an AVX-512 CPU). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void nova_rt_contract_bf16(int64_t a, int64_t b, int64_t c, int64_t desc);
void nova_rt_contract_f32(int64_t a, int64_t b, int64_t c, int64_t desc);

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0 * 2 - 1;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

typedef struct shape {
  const char *name;
  int64_t batch, aonly; /* a batch loop of A, B and C; a loop of A (and C) only */
  int64_t M, N, K;
  int ta, tb;           /* A stored [k][m] (m contiguous); B stored [n][k] (k contiguous) */
  int64_t cs;           /* C's column stride (1: contiguous) */
  int64_t mc, nc, kc;
  int64_t bonly;        /* a loop of B (and C) only, outside n (heads: [k] x [k, R, n]); 0: 1 */
} shape;

/* Loops: 0 batch, 1 aonly, 2 m, 3 n, 4 k, 5 bonly. */
static int run(const shape *s, int f32, int zero) {
  int64_t B = s->batch, Q = s->aonly, M = s->M, N = s->N, K = s->K, R = s->bonly ? s->bonly : 1;
  int64_t na = B * Q * M * K, nb = B * K * R * N, nc = B * Q * M * R * N * s->cs;
  /* bf16 operands, or f32 ones (of values that bf16 holds exactly, and the rest) */
  uint16_t *a = malloc(sizeof *a * (size_t)(na + 1)), *b = malloc(sizeof *b * (size_t)(nb + 1));
  float *af = malloc(sizeof *af * (size_t)(na + 1)), *bf = malloc(sizeof *bf * (size_t)(nb + 1));
  float *c = malloc(sizeof *c * (size_t)nc);
  double *want = malloc(sizeof *want * (size_t)nc), *mag = malloc(sizeof *mag * (size_t)nc);
  if (!a || !b || !af || !bf || !c || !want || !mag) return fprintf(stderr, "out of memory\n"), 1;
  for (int64_t i = 0; i < na; i++) af[i] = (float)urand(), a[i] = to_bf16(af[i]);
  for (int64_t i = 0; i < nb; i++) bf[i] = (float)urand(), b[i] = to_bf16(bf[i]);
  for (int64_t i = 0; i < nc; i++) c[i] = (float)urand(), want[i] = c[i], mag[i] = fabs(c[i]);
  /* element strides: A [B][Q][M][K] or [B][Q][K][M]; B [B][K][R][N] or [B][R][N][K]; C [B][Q][M][R][N*cs] */
  int64_t sa_m = s->ta ? 1 : K, sa_k = s->ta ? M : 1;
  int64_t sb_k = s->tb ? 1 : R * N, sb_n = s->tb ? K : 1, sb_r = s->tb ? N * K : N;
  int64_t desc[8 + 4 * 6] = {6, 2, 3, 4, s->mc, s->nc, s->kc, zero,
                             B, Q, M, N, K, R,
                             Q * M * K, M * K, sa_m, 0, sa_k, 0,
                             K * R * N, 0, 0, sb_n, sb_k, sb_r,
                             Q * M * R * N * s->cs, M * R * N * s->cs, R * N * s->cs, s->cs, 0, N * s->cs};
  const int64_t *sa = desc + 8 + 6, *sb = desc + 8 + 12, *sc = desc + 8 + 18;
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t q = 0; q < Q; q++)
      for (int64_t i = 0; i < M; i++)
        for (int64_t r = 0; r < R; r++)
          for (int64_t j = 0; j < N; j++) {
            int64_t ci = bi * sc[0] + q * sc[1] + i * sc[2] + j * sc[3] + r * sc[5];
            if (zero) c[ci] = NAN, want[ci] = 0, mag[ci] = 0;
            for (int64_t p = 0; p < K; p++) {
              int64_t ia = bi * sa[0] + q * sa[1] + i * sa[2] + p * sa[4];
              int64_t ib = bi * sb[0] + j * sb[3] + p * sb[4] + r * sb[5];
              double x = f32 ? af[ia] : from_bf16(a[ia]), y = f32 ? bf[ib] : from_bf16(b[ib]);
              want[ci] += x * y, mag[ci] += fabs(x * y);
            }
          }
  if (f32)
    nova_rt_contract_f32((int64_t)(intptr_t)af, (int64_t)(intptr_t)bf, (int64_t)(intptr_t)c, (int64_t)(intptr_t)desc);
  else
    nova_rt_contract_bf16((int64_t)(intptr_t)a, (int64_t)(intptr_t)b, (int64_t)(intptr_t)c, (int64_t)(intptr_t)desc);
  int bad = 0;
  for (int64_t i = 0; i < nc && !bad; i++) {
    /* a column stride leaves gaps in C: they must stay as they were (mag = |c|, nothing added) */
    double err = fabs(c[i] - want[i]);
    if (!(err <= 1e-5 * mag[i] + 1e-30)) { /* (NaN: bad) */
      fprintf(stderr, "%s %s%s: C[%lld] = %.9g, want %.9g (error %.3g, bound %.3g)\n", f32 ? "f32" : "bf16", s->name,
              zero ? " (C zeroed)" : "", (long long)i, c[i], want[i], err, 1e-5 * mag[i]);
      bad = 1;
    }
  }
  free(a), free(b), free(af), free(bf), free(c), free(want), free(mag);
  return bad;
}

int main(void) {
  static const shape shapes[] = {
      {"one tile", 1, 1, 12, 32, 16, 0, 0, 1, 0, 0, 0, 0},
      {"edges", 1, 1, 37, 45, 7, 0, 0, 1, 0, 0, 0, 0},
      {"k 1", 1, 1, 5, 3, 1, 0, 0, 1, 0, 0, 0, 0},
      {"k 0", 1, 1, 5, 3, 0, 0, 0, 1, 0, 0, 0, 0},
      {"blocks smaller than the ranges", 1, 1, 100, 130, 99, 0, 0, 1, 24, 64, 10, 0},
      {"A transposed", 1, 1, 50, 70, 33, 1, 0, 1, 0, 0, 0, 0},
      {"B transposed", 1, 1, 50, 70, 33, 0, 1, 1, 0, 0, 0, 0},
      {"both transposed, blocked", 1, 1, 61, 40, 65, 1, 1, 1, 24, 32, 16, 0},
      {"C column stride", 1, 1, 20, 19, 9, 0, 0, 3, 0, 0, 0, 0},
      {"C column stride, wider than a tile", 1, 1, 20, 70, 9, 0, 0, 2, 0, 0, 0, 0},
      {"batch loops", 3, 2, 17, 33, 20, 0, 0, 1, 12, 32, 8, 0},
      {"batch loops, transposed", 2, 3, 13, 9, 31, 1, 1, 2, 0, 0, 6, 0},
      {"large", 1, 1, 300, 260, 300, 0, 0, 1, 96, 128, 128, 0},
      {"large, own blocks, B transposed", 1, 1, 290, 600, 700, 0, 1, 1, 0, 0, 0, 0},
      {"register-tile rows", 2, 1, 28, 64, 40, 1, 0, 1, 14, 32, 17, 0},
      {"rows 4 KiB apart (A packed)", 1, 1, 30, 40, 1024, 0, 0, 1, 0, 0, 0, 0},
      {"A in place, m contiguous, k steps 2 KiB apart", 1, 1, 512, 40, 30, 1, 0, 1, 0, 0, 0, 0},
      {"few columns, many rows (as C^T)", 1, 1, 300, 5, 40, 0, 0, 1, 0, 0, 0, 0},
      {"few columns, transposed, batched, C column stride", 2, 1, 90, 3, 17, 1, 1, 2, 0, 0, 0, 0},
      {"a loop of B only (joins n)", 2, 1, 33, 20, 17, 0, 0, 1, 0, 0, 0, 3},
      {"a loop of B only, B transposed", 1, 2, 20, 24, 9, 1, 1, 1, 0, 0, 0, 4},
      {"a loop of B only, C column stride", 1, 1, 15, 20, 9, 0, 0, 2, 0, 0, 0, 3},
      {"narrow: 3 rows, B in place, long k", 1, 1, 3, 200, 600, 0, 0, 1, 0, 0, 0, 0},
      {"narrow: a loop of A only joins the rows, A transposed", 1, 3, 2, 100, 50, 1, 0, 1, 0, 0, 0, 0},
      {"narrow: 8 rows as C^T, B transposed (packed by k chunks)", 1, 1, 300, 8, 700, 0, 1, 1, 0, 0, 0, 0},
      {"narrow: 11 rows, C column stride, edge columns", 2, 1, 11, 77, 33, 0, 0, 3, 0, 0, 0, 0},
      {"narrow: rows that would not fit stay apart", 1, 2, 7, 90, 20, 1, 0, 1, 0, 0, 0, 0},
      {"narrow: a loop of B only", 1, 1, 4, 40, 25, 0, 1, 1, 0, 0, 0, 3},
      {"narrow: 20 rows in panels, B in place, k in chunks", 1, 1, 20, 150, 70, 0, 0, 1, 0, 0, 0, 0},
      {"narrow: a loop of A only joins rows in panels, C column stride", 1, 2, 8, 100, 40, 1, 0, 2, 0, 0, 0, 0},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int zero = 0; zero < 2; zero++) bad |= run(&shapes[i], 0, zero) | run(&shapes[i], 1, zero);
  if (bad) return 1;
  printf("contract: ok\n");
  return 0;
}
