/* rt_dtype.h: the one table of element types, shared by the runtime (which
 * exports it as nova_dtype_name/size) and by driver/ code that reads or
 * writes tensors without linking the runtime (novarun, tensor_pb).
 *
 * Header-only on purpose: novarun does not link libnovart.a, and a step.so
 * must not depend on anything outside itself.
 */
#ifndef NOVA_RT_DTYPE_H
#define NOVA_RT_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "nova/step.h"

/* Bytes per element of DTYPE; 0 if DTYPE is not one of nova_dtype. */
static inline size_t rt_dtype_size(int dtype) {
  switch (dtype) {
  case NOVA_DTYPE_F32: return 4;
  case NOVA_DTYPE_U8: return 1;
  case NOVA_DTYPE_I8: return 1;
  case NOVA_DTYPE_U16: return 2;
  case NOVA_DTYPE_I16: return 2;
  case NOVA_DTYPE_I32: return 4;
  case NOVA_DTYPE_I64: return 8;
  case NOVA_DTYPE_BOOL: return 1;
  case NOVA_DTYPE_F16: return 2;
  case NOVA_DTYPE_F64: return 8;
  case NOVA_DTYPE_U32: return 4;
  case NOVA_DTYPE_U64: return 8;
  case NOVA_DTYPE_BF16: return 2;
  default: return 0;
  }
}

/* Short name of DTYPE ("f32", ...); "?" if DTYPE is not one of nova_dtype. */
static inline const char *rt_dtype_name(int dtype) {
  switch (dtype) {
  case NOVA_DTYPE_F32: return "f32";
  case NOVA_DTYPE_U8: return "u8";
  case NOVA_DTYPE_I8: return "i8";
  case NOVA_DTYPE_U16: return "u16";
  case NOVA_DTYPE_I16: return "i16";
  case NOVA_DTYPE_I32: return "i32";
  case NOVA_DTYPE_I64: return "i64";
  case NOVA_DTYPE_BOOL: return "bool";
  case NOVA_DTYPE_F16: return "f16";
  case NOVA_DTYPE_F64: return "f64";
  case NOVA_DTYPE_U32: return "u32";
  case NOVA_DTYPE_U64: return "u64";
  case NOVA_DTYPE_BF16: return "bf16";
  default: return "?";
  }
}

/* Name of ROLE ("input", ...); "?" if ROLE is not one of nova_role. */
static inline const char *rt_role_name(int role) {
  switch (role) {
  case NOVA_ROLE_INPUT: return "input";
  case NOVA_ROLE_LABEL: return "label";
  case NOVA_ROLE_PARAM: return "param";
  case NOVA_ROLE_OPT_STATE: return "opt_state";
  case NOVA_ROLE_OUTPUT: return "output";
  case NOVA_ROLE_LOSS: return "loss";
  case NOVA_ROLE_GRAD: return "grad";
  case NOVA_ROLE_UPDATE: return "update";
  case NOVA_ROLE_BUFFER: return "buffer";
  case NOVA_ROLE_STATUS: return "status";
  default: return "?";
  }
}

/* Bytes of a dense tensor of DTYPE, RANK and SHAPE (rank 0: one element)
 * into *NBYTES.  Returns 0, leaving *NBYTES alone, if the dtype is unknown,
 * RANK is outside [0, NOVA_MAX_RANK], a dimension is negative, or the size
 * exceeds SIZE_MAX / 2 (no buffer can be that large, and the margin lets
 * callers round sizes up without overflow). */
static inline int rt_tensor_nbytes(int dtype, int rank, const int64_t *shape, size_t *nbytes) {
  const uint64_t limit = (uint64_t)(SIZE_MAX / 2);
  uint64_t total = rt_dtype_size(dtype);
  if (total == 0 || rank < 0 || rank > NOVA_MAX_RANK || (rank > 0 && !shape)) return 0;
  for (int d = 0; d < rank; d++) {
    if (shape[d] < 0) return 0;
    if (shape[d] > 0 && total > limit / (uint64_t)shape[d]) return 0;
    total *= (uint64_t)shape[d];
  }
  *nbytes = (size_t)total;
  return 1;
}

/* Writes "[d0,d1,...]" (rank 0: "[]") into BUF of size N, truncating if
 * needed; returns BUF.  RANK outside [0, NOVA_MAX_RANK] prints "[?]". */
static inline char *rt_shape_str(char *buf, size_t n, int rank, const int64_t *shape) {
  size_t used = 0;
  if (n == 0) return buf;
  buf[0] = '\0';
  if (rank < 0 || rank > NOVA_MAX_RANK || (rank > 0 && !shape)) {
    snprintf(buf, n, "[?]");
    return buf;
  }
  used += (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < rank && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? "," : "", (long long)shape[i]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

#endif
