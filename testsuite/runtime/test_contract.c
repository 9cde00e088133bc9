/* test_contract.c: nova_rt_contract_bf16 (runtime/rt_contract.c) against a
 * float64 reference: C += A * B over bf16 A and B and an f32 C that holds
 * values already, for register-tile edges in m, n and odd k, cache blocks
 * smaller than the ranges, transposed A and B (k contiguous or not), a C
 * with a column stride, batch loops (one shared by A, B and C, one of A
 * only), and blocks of 0 (the kernel's own).  Each element must be within
 * 1e-5 of the sum of |a*b| over its k (f32 rounding of K sums) of the
 * reference.  Exit 0 and "contract: ok", or 1 with the first bad element.
 * testsuite/runtime/run.sh runs it with NOVA_NUM_THREADS=3 and 1, and with
 * NOVA_CONTRACT_PLAIN=1 (the path of CPUs without AVX-512 BF16). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void nova_rt_contract_bf16(int64_t a, int64_t b, int64_t c, int64_t desc);

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
} shape;

/* Loops: 0 batch, 1 aonly, 2 m, 3 n, 4 k. */
static int run(const shape *s) {
  int64_t B = s->batch, Q = s->aonly, M = s->M, N = s->N, K = s->K;
  int64_t na = B * Q * M * K, nb = B * K * N, nc = B * Q * M * N * s->cs;
  uint16_t *a = malloc(sizeof *a * (size_t)na), *b = malloc(sizeof *b * (size_t)nb);
  float *c = malloc(sizeof *c * (size_t)nc);
  double *want = malloc(sizeof *want * (size_t)nc), *mag = malloc(sizeof *mag * (size_t)nc);
  if (!a || !b || !c || !want || !mag) return fprintf(stderr, "out of memory\n"), 1;
  for (int64_t i = 0; i < na; i++) a[i] = to_bf16((float)urand());
  for (int64_t i = 0; i < nb; i++) b[i] = to_bf16((float)urand());
  for (int64_t i = 0; i < nc; i++) c[i] = (float)urand(), want[i] = c[i], mag[i] = fabs(c[i]);
  /* element strides: A [B][Q][M][K] or [B][Q][K][M]; B [B][K][N] or [B][N][K]; C [B][Q][M][N*cs] */
  int64_t sa_m = s->ta ? 1 : K, sa_k = s->ta ? M : 1, sb_k = s->tb ? 1 : N, sb_n = s->tb ? K : 1;
  int64_t desc[7 + 4 * 5] = {5, 2, 3, 4, s->mc, s->nc, s->kc,
                             B, Q, M, N, K,
                             Q * M * K, M * K, sa_m, 0, sa_k,
                             K * N, 0, 0, sb_n, sb_k,
                             Q * M * N * s->cs, M * N * s->cs, N * s->cs, s->cs, 0};
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t q = 0; q < Q; q++)
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
          int64_t ci = bi * desc[22] + q * desc[23] + i * desc[24] + j * desc[25];
          for (int64_t p = 0; p < K; p++) {
            double x = from_bf16(a[bi * desc[12] + q * desc[13] + i * sa_m + p * sa_k]);
            double y = from_bf16(b[bi * desc[17] + j * sb_n + p * sb_k]);
            want[ci] += x * y, mag[ci] += fabs(x * y);
          }
        }
  nova_rt_contract_bf16((int64_t)(intptr_t)a, (int64_t)(intptr_t)b, (int64_t)(intptr_t)c, (int64_t)(intptr_t)desc);
  int bad = 0;
  for (int64_t i = 0; i < nc && !bad; i++) {
    /* a column stride leaves gaps in C: they must stay as they were (mag = |c|, nothing added) */
    double err = fabs(c[i] - want[i]);
    if (err > 1e-5 * mag[i] + 1e-30) {
      fprintf(stderr, "%s: C[%lld] = %.9g, want %.9g (error %.3g, bound %.3g)\n", s->name, (long long)i, c[i],
              want[i], err, 1e-5 * mag[i]);
      bad = 1;
    }
  }
  free(a), free(b), free(c), free(want), free(mag);
  return bad;
}

int main(void) {
  static const shape shapes[] = {
      {"one tile", 1, 1, 12, 32, 16, 0, 0, 1, 0, 0, 0},
      {"edges", 1, 1, 37, 45, 7, 0, 0, 1, 0, 0, 0},
      {"k 1", 1, 1, 5, 3, 1, 0, 0, 1, 0, 0, 0},
      {"blocks smaller than the ranges", 1, 1, 100, 130, 99, 0, 0, 1, 24, 64, 10},
      {"A transposed", 1, 1, 50, 70, 33, 1, 0, 1, 0, 0, 0},
      {"B transposed", 1, 1, 50, 70, 33, 0, 1, 1, 0, 0, 0},
      {"both transposed, blocked", 1, 1, 61, 40, 65, 1, 1, 1, 24, 32, 16},
      {"C column stride", 1, 1, 20, 19, 9, 0, 0, 3, 0, 0, 0},
      {"batch loops", 3, 2, 17, 33, 20, 0, 0, 1, 12, 32, 8},
      {"batch loops, transposed", 2, 3, 13, 9, 31, 1, 1, 2, 0, 0, 6},
      {"large", 1, 1, 300, 260, 300, 0, 0, 1, 96, 128, 128},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) bad |= run(&shapes[i]);
  if (bad) return 1;
  printf("contract: ok\n");
  return 0;
}
