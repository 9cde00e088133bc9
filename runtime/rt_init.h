/* rt_init.h: generated initial values (normal, he, xavier, ...), computed
 * the same way by novac (compile-time constants, frontend/init.c) and by a
 * step.so when it opens (parameters: a step.so carries the recipe, not the
 * values, so a 162M-parameter model compiles to a small file).
 *
 * The generator is splitmix64, seeded with FNV-1a(tensor name) xor the
 * graph's seed.  Its state advances by a constant per draw, so draw k of a
 * tensor is mix(seed + (k + 1) * golden): any range of elements can be
 * computed alone (threads fill disjoint ranges and the values do not depend
 * on how many there are).  A uniform element i uses draw i; a normal
 * element i uses draws 2i and 2i+1 (Box-Muller, the cosine branch).
 * Values are drawn in float64 and rounded to the tensor's dtype.
 *   he:     normal(0, sqrt(2 / fan_in))
 *   xavier: uniform(-sqrt(6 / (fan_in + fan_out)), +sqrt(...))
 *   causal: a at (..., i, j) with j > i, else 0 (attention masks)
 * with fan_in = shape[0] and fan_out = shape[1] for a [in, out] weight (as
 * matmul(x, w) uses it), times the product of any further dims (receptive
 * field); for rank 1, fan_in = fan_out = shape[0].
 *
 * Header-only: novac and the runtime each compile it in (a step.so depends
 * on nothing outside itself).
 */
#ifndef NOVA_RT_INIT_H
#define NOVA_RT_INIT_H

#include <math.h>
#include <stdint.h>
#include "nova/step.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* What a tensor's initial value is generated from; RT_INIT_NONE: zeros or
 * the bytes in the step's init data. */
enum {
  RT_INIT_NONE = 0,
  RT_INIT_CONST = 1, /* a */
  RT_INIT_NORMAL = 2, /* a * N(0, 1) */
  RT_INIT_UNIFORM = 3, /* U(a, b) */
  RT_INIT_HE = 4,
  RT_INIT_XAVIER = 5,
  RT_INIT_CAUSAL = 6, /* a above the diagonal of the last two dims */
  RT_INIT_LAST = RT_INIT_CAUSAL
};

#define RT_INIT_GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t rt_init_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Draw K (from 0) of the generator seeded with SEED, uniform in [0, 1)
 * with 53 random bits. */
static inline double rt_init_unif(uint64_t seed, uint64_t k) {
  return (double)(rt_init_mix(seed + (k + 1) * RT_INIT_GOLDEN) >> 11) * 0x1.0p-53;
}

static inline double rt_init_gauss(uint64_t seed, uint64_t i) {
  double u = 1.0 - rt_init_unif(seed, 2 * i), v = rt_init_unif(seed, 2 * i + 1); /* u in (0, 1] */
  return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* The seed of tensor NAME in a graph seeded with GRAPH_SEED. */
static inline uint64_t rt_init_seed(const char *name, uint64_t graph_seed) {
  uint64_t h = 1469598103934665603ull;
  for (; name && *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
  return h ^ graph_seed;
}

/* V rounded to the nearest f16 or bf16 (DT), ties to even, as bits. */
static inline uint16_t rt_half_from_double(int dt, double v) {
  int mant = dt == NOVA_DTYPE_BF16 ? 7 : 10, ebits = dt == NOVA_DTYPE_BF16 ? 8 : 5;
  int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias;
  uint16_t sign = signbit(v) ? (uint16_t)0x8000 : 0, inf = (uint16_t)(((1u << ebits) - 1) << mant);
  if (isnan(v)) return (uint16_t)(sign | inf | (1u << (mant - 1)));
  double a = fabs(v);
  if (a == 0) return sign;
  int e;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  int q = (e - 1 < emin ? emin : e - 1) - mant; /* the spacing 2^q */
  double r = nearbyint(ldexp(a, -q));            /* a / 2^q, rounded: an integer */
  double m = ldexp(r, q);                         /* the largest finite value, or a binade beyond it */
  if (isinf(a) || m > ldexp(2.0 - ldexp(1.0, -mant), bias)) return (uint16_t)(sign | inf);
  if (m < ldexp(1.0, emin)) return (uint16_t)(sign | (uint16_t)ldexp(m, mant - emin)); /* subnormal */
  frexp(m, &e);
  uint32_t frac = (uint32_t)(ldexp(m, mant - (e - 1)) - ldexp(1.0, mant));
  return (uint16_t)(sign | (uint16_t)((uint32_t)(e - 1 + bias) << mant) | (uint16_t)frac);
}

/* Element I of the DTYPE array OUT set to V (rounded to nearest for
 * floating-point types, truncated toward zero for integers, V != 0 for
 * bool). */
static inline void rt_init_store(int dtype, void *out, int64_t i, double v) {
  switch (dtype) {
  case NOVA_DTYPE_F64: ((double *)out)[i] = v; break;
  case NOVA_DTYPE_F16:
  case NOVA_DTYPE_BF16: ((uint16_t *)out)[i] = rt_half_from_double(dtype, v); break;
  case NOVA_DTYPE_I8: ((int8_t *)out)[i] = (int8_t)v; break;
  case NOVA_DTYPE_U8: ((uint8_t *)out)[i] = (uint8_t)v; break;
  case NOVA_DTYPE_I16: ((int16_t *)out)[i] = (int16_t)v; break;
  case NOVA_DTYPE_U16: ((uint16_t *)out)[i] = (uint16_t)v; break;
  case NOVA_DTYPE_I32: ((int32_t *)out)[i] = (int32_t)v; break;
  case NOVA_DTYPE_U32: ((uint32_t *)out)[i] = (uint32_t)v; break;
  case NOVA_DTYPE_I64: ((int64_t *)out)[i] = (int64_t)v; break;
  case NOVA_DTYPE_U64: ((uint64_t *)out)[i] = (uint64_t)v; break;
  case NOVA_DTYPE_BOOL: ((uint8_t *)out)[i] = v != 0; break;
  default: ((float *)out)[i] = (float)v; break;
  }
}

/* Elements [BEGIN, END) of a DTYPE tensor of shape SHAPE (RANK dims)
 * generated by KIND with parameters A, B from SEED, written to OUT (which
 * points at element 0), as rt_init_store converts. */
static inline void rt_init_fill(int kind, double a, double b, uint64_t seed, int dtype, int rank,
                                const int64_t *shape, int64_t begin, int64_t end, void *out) {
  double fan_in = rank ? (double)shape[0] : 1, fan_out = rank > 1 ? (double)shape[1] : fan_in;
  for (int i = 2; i < rank; i++) {
    fan_in *= (double)shape[i];
    fan_out *= (double)shape[i];
  }
  double lim = sqrt(6.0 / (fan_in + fan_out)), std = sqrt(2.0 / fan_in);
  int64_t cols = rank ? shape[rank - 1] : 1, rows = rank > 1 ? shape[rank - 2] : 1;
  for (int64_t i = begin; i < end; i++) {
    double v = 0;
    switch (kind) {
    case RT_INIT_CONST: v = a; break;
    case RT_INIT_NORMAL: v = a * rt_init_gauss(seed, (uint64_t)i); break;
    case RT_INIT_UNIFORM: v = a + (b - a) * rt_init_unif(seed, (uint64_t)i); break;
    case RT_INIT_HE: v = std * rt_init_gauss(seed, (uint64_t)i); break;
    case RT_INIT_XAVIER: v = -lim + 2 * lim * rt_init_unif(seed, (uint64_t)i); break;
    case RT_INIT_CAUSAL: v = (i % cols) > ((i / cols) % rows) ? a : 0.0; break;
    default: break;
    }
    rt_init_store(dtype, out, i, v);
  }
}

#endif
