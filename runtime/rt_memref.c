/* rt_memref.c: the strided copy that compiled code calls for memref.copy
 * between non-contiguous buffers (the MLIR runtime-utils ABI):
 *   void memrefCopy(int64_t elem_size, UnrankedMemRef *src, UnrankedMemRef *dst)
 * where an unranked memref is {rank, descriptor} and a ranked descriptor is
 * {allocated, aligned, offset, sizes[rank], strides[rank]} (sizes and strides
 * in elements).  Both memrefs have the same shape. */
#include <stdint.h>
#include <string.h>

typedef struct rt_unranked_memref {
  int64_t rank;
  void *descriptor;
} rt_unranked_memref;

typedef struct rt_memref_head {
  char *allocated;
  char *aligned;
  int64_t offset;
  int64_t rest[]; /* sizes[rank], then strides[rank] */
} rt_memref_head;

void memrefCopy(int64_t elem_size, rt_unranked_memref *src, rt_unranked_memref *dst);

/* N elements of ES bytes from SP (stride SS elements) to DP (stride DS). */
static void copy_line(char *dp, int64_t ds, const char *sp, int64_t ss, int64_t n, int64_t es) {
  if (ds == 1 && ss == 1) {
    memcpy(dp, sp, (size_t)(n * es));
  } else if (es == 4) {
    uint32_t *d = (uint32_t *)(void *)dp;
    const uint32_t *s = (const uint32_t *)(const void *)sp;
    for (int64_t i = 0; i < n; i++) d[i * ds] = s[i * ss];
  } else if (es == 2) {
    uint16_t *d = (uint16_t *)(void *)dp;
    const uint16_t *s = (const uint16_t *)(const void *)sp;
    for (int64_t i = 0; i < n; i++) d[i * ds] = s[i * ss];
  } else {
    for (int64_t i = 0; i < n; i++) memcpy(dp + i * ds * es, sp + i * ss * es, (size_t)es);
  }
}

void memrefCopy(int64_t elem_size, rt_unranked_memref *src, rt_unranked_memref *dst) {
  int64_t rank = src->rank;
  rt_memref_head *s = src->descriptor, *d = dst->descriptor;
  char *sp = s->aligned + s->offset * elem_size, *dp = d->aligned + d->offset * elem_size;
  if (rank == 0) {
    memcpy(dp, sp, (size_t)elem_size);
    return;
  }
  if (rank > 16) return; /* nova tensors have rank <= NOVA_MAX_RANK (8) */
  /* dims of size 1 dropped, neighbours that are contiguous in both merged
   * (a padded image's interior: each row one memcpy) */
  int64_t n[16], ss[16], ds[16], r = 0;
  for (int64_t i = 0; i < rank; i++) {
    int64_t size = s->rest[i], a = s->rest[rank + i], b = d->rest[rank + i];
    if (size == 0) return;
    if (size == 1) continue;
    if (r > 0 && ss[r - 1] == a * size && ds[r - 1] == b * size) {
      n[r - 1] *= size, ss[r - 1] = a, ds[r - 1] = b;
      continue;
    }
    n[r] = size, ss[r] = a, ds[r] = b, r++;
  }
  if (r == 0) {
    memcpy(dp, sp, (size_t)elem_size);
    return;
  }
  /* the innermost dim a line, the others counted */
  int64_t idx[16] = {0}, lines = 1;
  for (int64_t i = 0; i < r - 1; i++) lines *= n[i];
  for (int64_t l = 0; l < lines; l++) {
    int64_t so = 0, dof = 0;
    for (int64_t i = 0; i < r - 1; i++) so += idx[i] * ss[i], dof += idx[i] * ds[i];
    copy_line(dp + dof * elem_size, ds[r - 1], sp + so * elem_size, ss[r - 1], n[r - 1], elem_size);
    for (int64_t k = r - 2; k >= 0 && ++idx[k] == n[k]; k--) idx[k] = 0;
  }
}
