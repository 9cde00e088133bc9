/* novarun_data.c: the batch of each training step from --data FILE or
 * --seed N.
 *
 * --data: a safetensors file with one tensor per input and label of the
 * step, under the same name and dtype; where the step's tensor is [B, d1,
 * ...], the file's is [S, d1, ...]: S samples (a rank-0 input: [S], B = 1).
 * Step k takes samples (k-1)*B ... k*B-1, modulo S: the data wraps around,
 * and a batch that straddles the end continues with the first samples.
 * Inputs with a default value (a training step's lr) may be left out.
 * A data-parallel step run as N processes: step k's global batch is the
 * N*B samples from (k-1)*N*B on (mod S), and rank r takes those at r, r+N,
 * r+2N, ... of it, B of them.
 *
 * --seed: a fresh synthetic batch for every step, a function of the seed,
 * the step number and the tensor only (so a run resumed from a checkpoint
 * sees the batches the uninterrupted run would have): standard normal
 * values for floating-point tensors, uniform integers in [0, index_bound)
 * for index tensors, uniform 0/1 for bool.  Inputs with a default keep it.
 * Each rank of a data-parallel run has a stream of its own (rank 0 that of
 * a run alone).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "novarun.h"
#include "rt_dtype.h"

#define NR_TYPE_LEN 320

__extension__ typedef unsigned __int128 nr_u128;

/* One input or label that the batches feed. */
typedef struct nr_feed {
  nova_tensor_info info;   /* the step's tensor (name and shape borrowed from the step) */
  const nr_st_tensor *src; /* --data: its tensor in the file */
  uint64_t rows;           /* B: samples per step */
  size_t row_bytes;        /* bytes of one sample */
  uint64_t stream;         /* --seed: which random stream */
  void *buf;               /* info.nbytes: the batch, bound to the step */
} nr_feed;

struct nr_batches {
  nr_st_file file;         /* --data */
  int have_file;
  uint64_t samples;        /* --data: S */
  uint64_t seed;           /* --seed */
  int rank, world;         /* a data-parallel run's share: rank of world */
  int nfeeds;
  nr_feed *feeds;
};

static int nr_is_fed(nova_role r) { return r == NOVA_ROLE_INPUT || r == NOVA_ROLE_LABEL; }

uint64_t nr_batches_samples(const nr_batches *b) { return b->have_file ? b->samples : 0; }

int nr_batches_feeds(const nr_batches *b, const char *name) {
  for (int i = 0; i < b->nfeeds; i++)
    if (!strcmp(b->feeds[i].info.name, name)) return 1;
  return 0;
}

void nr_batches_destroy(nr_batches *b) {
  if (!b) return;
  if (b->have_file) nr_st_close(&b->file);
  for (int i = 0; i < b->nfeeds; i++) free(b->feeds[i].buf);
  free(b->feeds);
  free(b);
}

/* Adds the step's tensor INFO to B's feeds (B->feeds holds room). */
static int nr_add_feed(nr_batches *b, const nova_tensor_info *info) {
  nr_feed *f = &b->feeds[b->nfeeds];
  memset(f, 0, sizeof *f);
  f->info = *info;
  f->rows = info->rank > 0 ? (uint64_t)info->shape[0] : 1;
  f->row_bytes = f->rows ? info->nbytes / f->rows : 0;
  f->stream = (uint64_t)b->nfeeds;
  if (!(f->buf = malloc(info->nbytes ? info->nbytes : 1))) return nr_error("out of memory for '%s'", info->name);
  b->nfeeds++;
  return 0;
}

/* ---- --data -------------------------------------------------------------- */

/* The file's tensor T can feed INFO: same dtype, [S, d1, ...] for
 * [B, d1, ...], S >= max(B, 1) and the S of the tensors before. */
static int nr_data_check(nr_batches *b, const nr_st_tensor *t, const nova_tensor_info *info) {
  char have[NR_TYPE_LEN], want[NR_TYPE_LEN], need[NR_TYPE_LEN];
  int rank = info->rank > 0 ? info->rank : 1, same = t->dtype == info->dtype && t->rank == rank;
  for (int d = 1; same && d < rank; d++) same = t->shape[d] == info->shape[d];
  if (!same) {
    size_t used = (size_t)snprintf(need, sizeof need, "%s [S", rt_dtype_name(info->dtype));
    for (int d = 1; d < rank && used < sizeof need; d++)
      used += (size_t)snprintf(need + used, sizeof need - used, ",%lld", (long long)info->shape[d]);
    if (used < sizeof need) snprintf(need + used, sizeof need - used, "]");
    return nr_error("%s: tensor '%s' is %s, but for the step's %s %s it must be %s (S samples)", b->file.path,
                    t->name, nr_type_str(have, sizeof have, t->dtype, t->rank, t->shape), rt_role_name(info->role),
                    nr_type_str(want, sizeof want, info->dtype, info->rank, info->shape), need);
  }
  uint64_t s = (uint64_t)t->shape[0], rows = info->rank > 0 ? (uint64_t)info->shape[0] : 1;
  if (b->samples && s != b->samples)
    return nr_error("%s: tensor '%s' holds %llu samples, the tensors before it %llu: every tensor needs the same "
                    "number",
                    b->file.path, t->name, (unsigned long long)s, (unsigned long long)b->samples);
  if (s == 0 || s < rows)
    return nr_error("%s: tensor '%s' holds %llu samples, fewer than one batch of the step's %s (%llu)", b->file.path,
                    t->name, (unsigned long long)s, rt_role_name(info->role), (unsigned long long)rows);
  b->samples = s;
  return 0;
}

/* Matches the file's tensors with the step's inputs and labels (V[N]). */
static int nr_data_create(nr_batches *b, const nr_options *o, const nova_tensor_info *v, int n) {
  if (nr_st_open(o->data_path, &b->file)) return 1;
  b->have_file = 1;
  for (int i = 0; i < b->file.ntensors; i++) {
    const nr_st_tensor *t = &b->file.tensors[i];
    int k = 0;
    while (k < n && strcmp(v[k].name, t->name) != 0) k++;
    if (k == n) return nr_error("%s: tensor '%s' is not an input or label of the step", o->data_path, t->name);
    if (!nr_is_fed(v[k].role))
      return nr_error("%s: tensor '%s' is the step's %s, not an input or label", o->data_path, t->name,
                      rt_role_name(v[k].role));
    if (v[k].has_default && o->lr_set && !strcmp(t->name, "lr"))
      return nr_error("%s: tensor 'lr' gives the learning rate, and so does --lr: give one of them", o->data_path);
  }
  for (int i = 0; i < n; i++) {
    if (!nr_is_fed(v[i].role)) continue;
    const nr_st_tensor *t = nr_st_find(&b->file, v[i].name);
    char want[NR_TYPE_LEN];
    if (!t && v[i].has_default) continue;
    if (!t)
      return nr_error("%s: no tensor '%s' for the step's %s '%s' (%s)", o->data_path, v[i].name,
                      rt_role_name(v[i].role), v[i].name,
                      nr_type_str(want, sizeof want, v[i].dtype, v[i].rank, v[i].shape));
    if (nr_data_check(b, t, &v[i]) || nr_add_feed(b, &v[i])) return 1;
    b->feeds[b->nfeeds - 1].src = t;
  }
  return 0;
}

/* Reads samples [(STEP-1)*B, STEP*B) mod S of F into its buffer; in a
 * world of N, rank r's: (STEP-1)*N*B + r + N*j mod S, j < B. */
static int nr_data_fill(nr_batches *b, nr_feed *f, long long step) {
  uint64_t S = b->samples, B = f->rows, N = (uint64_t)b->world;
  unsigned char *buf = f->buf;
  if (N > 1) {
    uint64_t base = (uint64_t)((nr_u128)((uint64_t)(step - 1) % S) * (B * N % S) % S);
    for (uint64_t j = 0; j < B; j++) {
      uint64_t at = (uint64_t)(((nr_u128)base + (uint64_t)b->rank + (nr_u128)N * j) % S);
      if (nr_st_read(&b->file, f->src->begin + at * f->row_bytes, buf + j * f->row_bytes, f->row_bytes)) return 1;
    }
    return 0;
  }
  uint64_t start = (uint64_t)((nr_u128)((uint64_t)(step - 1) % S) * B % S);
  uint64_t first = S - start < B ? S - start : B; /* rows before the end; the rest wrap to sample 0 */
  if (nr_st_read(&b->file, f->src->begin + start * f->row_bytes, buf, (size_t)(first * f->row_bytes))) return 1;
  if (first < B && nr_st_read(&b->file, f->src->begin, buf + first * f->row_bytes, (size_t)((B - first) * f->row_bytes)))
    return 1;
  return 0;
}

/* ---- --seed -------------------------------------------------------------- */

/* splitmix64: the finalizer and the generator. */
static uint64_t nr_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t nr_next(uint64_t *state) { return nr_mix(*state += 0x9e3779b97f4a7c15ULL); }

/* Uniform in [0, BOUND), BOUND > 0, without modulo bias. */
static uint64_t nr_below(uint64_t *state, uint64_t bound) {
  uint64_t floor_ = -bound % bound, x; /* 2^64 mod bound: the values below it are rejected */
  do x = nr_next(state);
  while (x < floor_);
  return x % bound;
}

static uint16_t nr_to_f16(float v) {
  uint32_t x;
  memcpy(&x, &v, sizeof x);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  x &= 0x7fffffff;
  if (x >= 0x7f800000) return sign | 0x7c00 | (x > 0x7f800000 ? 0x200 : 0);
  if (x >= 0x477ff000) return sign | 0x7c00;                         /* rounds beyond 65504 */
  if (x < 0x38800000) return sign | (uint16_t)lrintf(fabsf(v) * 0x1p24f); /* subnormal */
  return sign | (uint16_t)((x - 0x38000000 + 0xfff + ((x >> 13) & 1)) >> 13);
}

static uint16_t nr_to_bf16(float v) {
  uint32_t x;
  memcpy(&x, &v, sizeof x);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* The values --seed can make for INFO; 1 after a diagnostic if none. */
static int nr_seed_check(const nova_tensor_info *info) {
  if (info->dtype != NOVA_DTYPE_BOOL && info->dtype != NOVA_DTYPE_F32 && info->dtype != NOVA_DTYPE_F64 &&
      info->dtype != NOVA_DTYPE_F16 && info->dtype != NOVA_DTYPE_BF16) { /* integers: only indices have a range */
    if (info->index_bound > 0) return 0;
    return nr_error("--seed: the step's %s '%s' is %s without an index bound, so no synthetic value is known to "
                    "fit it; give the batch with --inputs or --data",
                    rt_role_name(info->role), info->name, rt_dtype_name(info->dtype));
  }
  return 0;
}

/* The batch of STEP for F: its own stream of (seed, step, tensor). */
static void nr_seed_fill(const nr_batches *b, nr_feed *f, long long step) {
  uint64_t state = nr_mix(nr_mix(nr_mix(b->seed) ^ (uint64_t)step) + f->stream);
  if (b->rank > 0) state = nr_mix(state + (uint64_t)b->rank);
  size_t n = f->info.nbytes / rt_dtype_size(f->info.dtype);
  double spare = 0;
  for (size_t i = 0; i < n; i++) {
    double z = 0;
    uint64_t u = 0;
    if (f->info.dtype == NOVA_DTYPE_I32 || f->info.dtype == NOVA_DTYPE_I64) {
      u = nr_below(&state, (uint64_t)f->info.index_bound);
    } else if (f->info.dtype == NOVA_DTYPE_BOOL) {
      u = nr_next(&state) >> 63;
    } else if (i % 2) {
      z = spare;
    } else { /* Box-Muller: two standard normal values from two uniforms */
      double u1 = (double)((nr_next(&state) >> 11) + 1) * 0x1p-53, u2 = (double)(nr_next(&state) >> 11) * 0x1p-53;
      double r = sqrt(-2 * log(u1));
      z = r * cos(2 * M_PI * u2);
      spare = r * sin(2 * M_PI * u2);
    }
    switch (f->info.dtype) {
    case NOVA_DTYPE_F32: ((float *)f->buf)[i] = (float)z; break;
    case NOVA_DTYPE_F64: ((double *)f->buf)[i] = z; break;
    case NOVA_DTYPE_F16: ((uint16_t *)f->buf)[i] = nr_to_f16((float)z); break;
    case NOVA_DTYPE_BF16: ((uint16_t *)f->buf)[i] = nr_to_bf16((float)z); break;
    case NOVA_DTYPE_I32: ((int32_t *)f->buf)[i] = (int32_t)u; break;
    case NOVA_DTYPE_I64: ((int64_t *)f->buf)[i] = (int64_t)u; break;
    case NOVA_DTYPE_BOOL: ((uint8_t *)f->buf)[i] = (uint8_t)u; break;
    default: break; /* other integers: refused by nr_seed_check */
    }
  }
}

/* ---- both ---------------------------------------------------------------- */

int nr_batches_create(nr_step *s, const nr_options *o, nr_batches **out) {
  int n = s->api.num_tensors(s->step), rc = 0;
  nr_batches *b = calloc(1, sizeof *b);
  nova_tensor_info *v = calloc((size_t)(n > 0 ? n : 1), sizeof *v);
  *out = NULL;
  if (b) b->feeds = calloc((size_t)(n > 0 ? n : 1), sizeof *b->feeds);
  if (b) b->rank = s->rank, b->world = s->world > 0 ? s->world : 1;
  if (!b || !v || !b->feeds) rc = nr_error("out of memory");
  for (int i = 0; !rc && i < n; i++) rc = nr_tensor(s, i, &v[i]);
  if (!rc && o->data_path) {
    rc = nr_data_create(b, o, v, n);
  } else if (!rc) {
    b->seed = o->seed;
    for (int i = 0; !rc && i < n; i++)
      if (nr_is_fed(v[i].role) && !v[i].has_default) rc = nr_seed_check(&v[i]) || nr_add_feed(b, &v[i]);
  }
  free(v);
  if (rc) {
    nr_batches_destroy(b);
    return 1;
  }
  *out = b;
  return 0;
}

int nr_batches_count(const nr_batches *b) { return b->nfeeds; }

int nr_batches_bind(nr_batches *b, nr_step *s, long long step) {
  for (int i = 0; i < b->nfeeds; i++) {
    nr_feed *f = &b->feeds[i];
    if (b->have_file) {
      if (nr_data_fill(b, f, step)) return 1;
    } else {
      nr_seed_fill(b, f, step);
    }
    if (s->api.bind(s->step, f->info.name, f->info.dtype, f->info.rank, f->info.shape, f->buf) != NOVA_OK)
      return nr_error("%s: step %lld: %s", b->have_file ? b->file.path : "--seed", step, s->api.error(s->step));
  }
  return 0;
}
