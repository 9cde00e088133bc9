/* lower_internal.h: what the nova -> linalg lowering's files share
 * (lower_linalg.c: the value map, text helpers and most ops;
 * lower_window.c: convolution and pooling, forward and backward). */
#ifndef NOVA_LOWER_INTERNAL_H
#define NOVA_LOWER_INTERNAL_H

#include <mlir-c/IR.h>

#include "../support/util.h"
#include "codegen.h"

typedef struct tv { /* a tensor value in the emitted text */
  int id;
  int rank;
  int64_t shape[NOVA_MAX_RANK];
  nova_dtype dt;
} tv;

typedef struct vmap_ent {
  const void *key;
  tv val;
} vmap_ent;

typedef struct lw {
  nova_ctx *c;
  nv_sbuf out;
  int next_id;
  char loc[600];       /* " loc(...)" of the nova op being lowered */
  vmap_ent *map;       /* open addressing, MlirValue.ptr -> tv */
  size_t mapcap;
  int64_t recompute;   /* the nova op's nova.recompute tag (0: none): its tensor.empty ops carry it */
  nv_sbuf decls;       /* module-level declarations (the all-reduce markers' functions) */
} lw;


/* text helpers (lower_linalg.c) */
const char *lw_ety(nova_dtype dt);   /* "f32", "i64", "i1", ... */
const char *lw_ttype(char *buf, size_t n, int rank, const int64_t *shape, nova_dtype dt);
const char *lw_flit(char *buf, size_t n, double v, nova_dtype dt);
#define TT(t) lw_ttype((char[200]){0}, 200, (t).rank, (t).shape, (t).dt)
#define FL(v, dt) lw_flit((char[64]){0}, 64, (v), (dt))
/* Appends one op line (with the current location). */
void lw_emit(lw *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
tv lw_fresh(lw *L, int rank, const int64_t *shape, nova_dtype dt);
tv lw_empty(lw *L, int rank, const int64_t *shape, nova_dtype dt);
tv lw_filled(lw *L, int rank, const int64_t *shape, nova_dtype dt, double v);
int64_t lw_tv_numel(const tv *t);
tv lw_elementwise(lw *L, int nin, const tv *ins, int orank, const int64_t *oshape, nova_dtype odt, const char *body);
tv lw_reshape(lw *L, tv x, int rank, const int64_t *shape);
/* The general structured op (see lower_linalg.c): maps[i] has ins[i].rank
 * entries (loop numbers, -1 = 0); iters one 'p' or 'r' per loop; init.id < 0:
 * an empty output; body defines %r from %in0.. and %acc ("": %in0). */
tv lw_generic(lw *L, int nin, const tv *ins, const int *const *maps, int nloops, const char *iters,
              const int *outmap, int orank, const int64_t *oshape, nova_dtype odt, tv init, const char *body);
/* Reduction of x over red[] ('+', '*', 'M' max, 'm' min), the reduced axes
 * dropped; pre: body lines computing %t from %in0 (x) and %in1.. (more[],
 * shaped like the result); NULL: %t = %in0. */
tv lw_reduce(lw *L, tv x, const bool *red, char kind, int nmore, const tv *more, const char *pre);
/* nova.matmul's rule: a (.., m, k) x b (.., k, n) or b (k, n) into res. */
tv lw_matmul(lw *L, tv a, tv b, const tv *res);
tv lw_transpose(lw *L, tv x, const int64_t *perm);
/* X extended to f32 where it is f16 or bf16, else X itself. */
tv lw_to_f32(lw *L, tv x);
double lw_fattr(MlirOperation op, const char *name);
int64_t lw_iattr(MlirOperation op, const char *name);
int lw_iarray(MlirOperation op, const char *name, int64_t *out);

/* window ops (lower_window.c) */
tv lw_lower_conv(lw *L, MlirOperation op, tv x, tv wt, const tv *res);
tv lw_lower_pool(lw *L, MlirOperation op, nv_op kind, tv x, const tv *res);
tv lw_lower_conv_grad_input(lw *L, MlirOperation op, tv gy, tv wt, const tv *res);
tv lw_lower_conv_grad_weight(lw *L, MlirOperation op, tv x, tv gy, const tv *res);
tv lw_lower_pool_grad(lw *L, MlirOperation op, nv_op kind, tv *in, const tv *res);
tv lw_lower_pool_indices(lw *L, MlirOperation op, tv x, tv y, const tv *res);

/* nova.dropout (lower_rng.c): Philox4x32-10 masks */
tv lw_lower_dropout(lw *L, MlirOperation op, tv x, tv seed, tv step, const tv *res);
/* nova.stochastic_round (lower_rng.c): f32 to bf16, unbiased, from the same Philox words */
tv lw_lower_sround(lw *L, MlirOperation op, tv x, tv seed, tv step, const tv *res);

/* nova.attention (lower_attention.c) */
tv lw_lower_attention(lw *L, MlirOperation op, const tv *in, const tv *res);
/* indexing ops (lower_index.c) */
const char *lw_mod_body(bool fmod, nova_dtype dt, char *buf, size_t n);
tv lw_lower_gather_elements(lw *L, tv x, tv idx, int axis, const tv *res);
tv lw_lower_scatter_elements(lw *L, const tv *in, int axis, int mode, const tv *res);
tv lw_lower_gather_nd(lw *L, tv x, tv idx, int batch_dims, const tv *res);
tv lw_lower_scatter_nd(lw *L, const tv *in, int mode, const tv *res);
tv lw_lower_cumsum(lw *L, tv x, int axis, int mode, const tv *res);

#endif
