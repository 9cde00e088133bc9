/* buckets.h: one step for a range of sizes of a dimension (novac
 * --dim=NAME=LO..HI or --dim=NAME=A,B,C; passes/buckets.c).
 *
 * The model is built once per bucket size.  A run with a size n below its
 * bucket's B fills the rows n..B-1 of each input with copies of row n-1
 * (runtime/step.c), so they hold finite values like the real rows; the
 * graph makes them count for nothing: every reduction over an axis of the
 * dimension (sums, means, maxima, a softmax, a contraction, a loss) reads
 * only the first n rows, through a mask against the run-time input
 * NAME.size.  The losses, the gradients and every real row of the outputs
 * then equal those of a step compiled for n (up to the order of the
 * additions).
 *
 * Which axes carry the dimension comes from two builds at different sizes:
 * an axis whose extent changes is a*size + c; its first a*n + c elements
 * are the real ones.  Ops that would mix padded rows into real ones in a
 * way no mask undoes (a convolution window along the dimension, a concat
 * along it, a slice that starts from its end) are refused with the node's
 * place. */
#ifndef NOVA_BUCKETS_H
#define NOVA_BUCKETS_H

#include "../frontend/graph.h"

typedef struct bk_axis {
  int64_t a, c; /* the extent is a * size + c; a == 0: the axis does not depend on the size */
} bk_axis;

/* What two builds of one model at sizes S1 != S2 say about each node. */
typedef struct bk_info {
  const char *dim;         /* the dimension's name (borrowed) */
  int nnodes;              /* of each build */
  bk_axis (*axes)[NOVA_MAX_RANK]; /* [nnodes] */
  unsigned char *bad;      /* [nnodes] a constant whose values, or a slice whose start, depend on the size */
} bk_info;

/* Compares G1 (built at size S1) with G2 (at S2): 0, or -1 after a
 * diagnostic (the builds differ in structure). */
int bk_analyze(nv_diag *d, const char *dim, const nv_graph *g1, int64_t s1, const nv_graph *g2, int64_t s2,
               bk_info *out);
void bk_info_free(bk_info *info);

/* Masks G, a build at bucket size SIZE with the structure INFO describes,
 * for runs of sizes LO and up: adds the input "NAME.size" (i64 scalar,
 * default SIZE) and the masks.  Before autodiff.  0, or -1 after a
 * diagnostic at the node that cannot be masked. */
int bk_mask(nv_diag *d, nv_graph *g, const bk_info *info, int64_t size, int64_t lo);

/* The input NAME.size's name, into BUF. */
const char *bk_size_name(char *buf, size_t n, const char *dim);

#endif
