/* init.c: initial parameter values, computed at compile time.
 *
 * Random initializers are deterministic: the generator (splitmix64) is seeded
 * with FNV-1a(param name) xor the graph's seed, so a parameter's values do
 * not depend on the order of declarations.  Values are drawn in float64 and
 * rounded to the parameter's dtype.
 *   he:     normal(0, sqrt(2 / fan_in))
 *   xavier: uniform(-sqrt(6 / (fan_in + fan_out)), +sqrt(...))
 *   causal_mask(a): a at (..., i, j) with j > i, else 0 (attention masks)
 * with fan_in = shape[0] and fan_out = shape[1] for a [in, out] weight (as
 * matmul(x, w) uses it), times the product of any further dims (receptive
 * field); for rank 1, fan_in = fan_out = shape[0].
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double unif(uint64_t *s) { return (double)(splitmix(s) >> 11) * 0x1.0p-53; }

static double gauss(uint64_t *s) {
  double u = 1.0 - unif(s), v = unif(s); /* u in (0, 1] */
  return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static const char *kind_name(const nv_node *n) { return n->op == NV_OP_CONSTANT ? "const" : "param"; }

static int read_file_init(nv_diag *d, const nv_node *n, void *out, size_t nbytes) {
  FILE *f = fopen(n->init.path, "rb");
  if (!f) {
    nv_error(d, n->loc, "%s '%s': cannot open '%s'", kind_name(n), n->name, n->init.path);
    return -1;
  }
  size_t got = fread(out, 1, nbytes, f);
  int extra = fgetc(f) != EOF;
  fclose(f);
  if (got != nbytes || extra) {
    nv_error(d, n->loc, "%s '%s': '%s' must hold exactly %zu bytes (%s[%lld elements], little-endian), %s",
             kind_name(n), n->name, n->init.path, nbytes, fe_dtype_name(n->dtype), (long long)fe_numel(n),
             extra ? "it is longer" : "it is shorter");
    return -1;
  }
  return 0;
}

int fe_init_fill(const nv_graph *g, nv_diag *d, const nv_node *n, void *out) {
  int64_t count = fe_numel(n);
  size_t nbytes = (size_t)count * fe_dtype_size(n->dtype);
  if (n->init.kind == NV_INIT_FILE) return read_file_init(d, n, out, nbytes);
  if (n->init.kind == NV_INIT_DATA) {
    memcpy(out, n->init.data, nbytes);
    return 0;
  }
  double fan_in = n->rank ? (double)n->shape[0] : 1, fan_out = n->rank > 1 ? (double)n->shape[1] : fan_in;
  for (int i = 2; i < n->rank; i++) {
    fan_in *= (double)n->shape[i];
    fan_out *= (double)n->shape[i];
  }
  uint64_t s = fnv1a(n->name) ^ g->seed;
  double lim = sqrt(6.0 / (fan_in + fan_out)), std = sqrt(2.0 / fan_in);
  for (int64_t i = 0; i < count; i++) {
    double v = 0;
    switch (n->init.kind) {
    case NV_INIT_ZEROS: v = 0; break;
    case NV_INIT_ONES: v = 1; break;
    case NV_INIT_CONST: v = n->init.a; break;
    case NV_INIT_NORMAL: v = n->init.a * gauss(&s); break;
    case NV_INIT_UNIFORM: v = n->init.a + (n->init.b - n->init.a) * unif(&s); break;
    case NV_INIT_HE: v = std * gauss(&s); break;
    case NV_INIT_XAVIER: v = -lim + 2 * lim * unif(&s); break;
    case NV_INIT_CAUSAL: { /* (..., i, j): a where j > i */
      int64_t cols = n->rank ? n->shape[n->rank - 1] : 1, rows = n->rank > 1 ? n->shape[n->rank - 2] : 1;
      v = (i % cols) > ((i / cols) % rows) ? n->init.a : 0.0;
      break;
    }
    case NV_INIT_FILE:
    case NV_INIT_DATA: break;
    }
    if (n->dtype == NOVA_DTYPE_F64) ((double *)out)[i] = v;
    else if (fe_dtype_is_half(n->dtype)) ((uint16_t *)out)[i] = fe_half_from_double(n->dtype, v);
    else ((float *)out)[i] = (float)v;
  }
  return 0;
}
