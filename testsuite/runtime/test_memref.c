/* test_memref.c: memrefCopy (runtime/rt_memref.c), the strided copy of
 * memref.copy, against an element-by-element copy: ranks 0 to 5, sizes of
 * 0 and 1 among them, element sizes 1, 2, 4 and 8, each operand laid out
 * contiguously, transposed, padded (a view into a larger buffer) or
 * broadcast-free with gaps.  Bytes outside the destination's elements must
 * stay as they were.  Exit 0 and "memref: ok", or 1 with the first bad case. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t rank;
  void *descriptor;
} unranked;

void memrefCopy(int64_t elem_size, unranked *src, unranked *dst);

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

/* Strides for SIZES in layout KIND (0 contiguous, 1 reversed dims, 2 each
 * dim padded by one element), the buffer's element count in *SPAN. */
static void layout(int rank, const int64_t *sizes, int kind, int64_t *strides, int64_t *span) {
  int64_t s = 1;
  for (int k = 0; k < rank; k++) {
    int i = kind == 1 ? k : rank - 1 - k;
    strides[i] = s;
    s *= sizes[i] + (kind == 2 ? 1 : 0);
  }
  *span = s + 3;
}

int main(void) {
  for (int iter = 0; iter < 3000; iter++) {
    int rank = (int)(next() % 6), es = 1 << (next() % 4);
    int64_t sizes[5], sst[5], dstr[5], sspan, dspan, total = 1;
    for (int i = 0; i < rank; i++) total *= (sizes[i] = (int64_t)(next() % 5 == 0 ? next() % 2 : 1 + next() % 6));
    int skind = (int)(next() % 3), dkind = (int)(next() % 3);
    layout(rank, sizes, skind, sst, &sspan);
    layout(rank, sizes, dkind, dstr, &dspan);
    int64_t soff = (int64_t)(next() % 3), doff = (int64_t)(next() % 3);
    unsigned char *sb = malloc((size_t)((sspan + soff) * es)), *db = malloc((size_t)((dspan + doff) * es));
    unsigned char *want = malloc((size_t)((dspan + doff) * es));
    for (int64_t i = 0; i < (sspan + soff) * es; i++) sb[i] = (unsigned char)next();
    for (int64_t i = 0; i < (dspan + doff) * es; i++) db[i] = want[i] = (unsigned char)next();
    int64_t idx[5] = {0};
    for (int64_t e = 0; e < total; e++) {
      int64_t so = soff, dof = doff;
      for (int i = 0; i < rank; i++) so += idx[i] * sst[i], dof += idx[i] * dstr[i];
      memcpy(want + dof * es, sb + so * es, (size_t)es);
      for (int k = rank - 1; k >= 0 && ++idx[k] == sizes[k]; k--) idx[k] = 0;
    }
    int64_t sd[3 + 10], dd[3 + 10];
    memcpy(&sd[0], &(void *){sb}, sizeof(void *)), memcpy(&sd[1], &(void *){sb}, sizeof(void *)), sd[2] = soff;
    memcpy(&dd[0], &(void *){db}, sizeof(void *)), memcpy(&dd[1], &(void *){db}, sizeof(void *)), dd[2] = doff;
    for (int i = 0; i < rank; i++) sd[3 + i] = dd[3 + i] = sizes[i], sd[3 + rank + i] = sst[i], dd[3 + rank + i] = dstr[i];
    unranked us = {rank, sd}, ud = {rank, dd};
    memrefCopy(es, &us, &ud);
    if (memcmp(db, want, (size_t)((dspan + doff) * es))) {
      fprintf(stderr, "memref: case %d (rank %d, element %d bytes, layouts %d -> %d) differs\n", iter, rank, es, skind,
              dkind);
      return 1;
    }
    free(sb), free(db), free(want);
  }
  printf("memref: ok\n");
  return 0;
}
