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

void memrefCopy(int64_t elem_size, rt_unranked_memref *src, rt_unranked_memref *dst) {
  int64_t rank = src->rank;
  rt_memref_head *s = src->descriptor, *d = dst->descriptor;
  const int64_t *sizes = s->rest, *sst = s->rest + rank, *dst_st = d->rest + rank;
  char *sp = s->aligned + s->offset * elem_size, *dp = d->aligned + d->offset * elem_size;
  if (rank == 0) {
    memcpy(dp, sp, (size_t)elem_size);
    return;
  }
  for (int64_t i = 0; i < rank; i++)
    if (sizes[i] == 0) return;
  int64_t idx[16] = {0};
  if (rank > 16) return; /* nova tensors have rank <= NOVA_MAX_RANK (8) */
  for (;;) {
    int64_t so = 0, dof = 0;
    for (int64_t i = 0; i < rank; i++) {
      so += idx[i] * sst[i];
      dof += idx[i] * dst_st[i];
    }
    memcpy(dp + dof * elem_size, sp + so * elem_size, (size_t)elem_size);
    int64_t k = rank - 1;
    while (k >= 0 && ++idx[k] == sizes[k]) idx[k--] = 0;
    if (k < 0) return;
  }
}
