/* tensor_pb.c: ONNX TensorProto files <-> tpb_tensor, with protobuf-c. */
#include "tensor_pb.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"
#include "../support/util.h"
#include "rt_dtype.h"

/* raw_data is little-endian by the ONNX spec and is copied as is. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensor_pb.c assumes a little-endian host"
#endif

/* Writes "WHERE: message" to ERR (TPB_ERROR_LEN bytes, may be NULL);
 * returns STATUS. */
__attribute__((format(printf, 4, 5))) static tpb_status tpb_fail(char *err, tpb_status status, const char *where,
                                                                 const char *fmt, ...) {
  if (!err) return status;
  int used = where ? snprintf(err, TPB_ERROR_LEN, "%s: ", where) : 0;
  if (used < 0 || used >= TPB_ERROR_LEN) return status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + used, TPB_ERROR_LEN - (size_t)used, fmt, ap);
  va_end(ap);
  return status;
}

const char *tpb_onnx_type_name(int data_type) {
  const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&onnx__tensor_proto__data_type__descriptor,
                                                                     data_type);
  return v ? v->name : "?";
}

/* ---- tensors ------------------------------------------------------------- */

tpb_status tpb_tensor_nbytes(int dtype, int rank, const int64_t *shape, size_t *nbytes, char *err) {
  char buf[256];
  if (rt_dtype_size(dtype) == 0)
    return tpb_fail(err, TPB_ERR_DTYPE, NULL,
                    "data_type %d (%s) is not supported; supported: FLOAT, DOUBLE, FLOAT16, BFLOAT16, INT8, "
                    "INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64, BOOL",
                    dtype, tpb_onnx_type_name(dtype));
  if (rank < 0 || rank > NOVA_MAX_RANK)
    return tpb_fail(err, TPB_ERR_SHAPE, NULL, "%d dimensions; at most %d are supported", rank, NOVA_MAX_RANK);
  if (rank > 0 && !shape) return tpb_fail(err, TPB_ERR_INVALID_ARGUMENT, NULL, "shape is NULL");
  for (int d = 0; d < rank; d++)
    if (shape[d] < 0)
      return tpb_fail(err, TPB_ERR_SHAPE, NULL, "negative dimension in shape %s",
                      rt_shape_str(buf, sizeof buf, rank, shape));
  if (!rt_tensor_nbytes(dtype, rank, shape, nbytes))
    return tpb_fail(err, TPB_ERR_SHAPE, NULL, "shape %s of %s is too large",
                    rt_shape_str(buf, sizeof buf, rank, shape), rt_dtype_name(dtype));
  return TPB_OK;
}

tpb_tensor *tpb_tensor_create(const char *name, int dtype, int rank, const int64_t *shape, char *err) {
  size_t nbytes = 0;
  if (tpb_tensor_nbytes(dtype, rank, shape, &nbytes, err) != TPB_OK) return NULL;
  tpb_tensor *t = calloc(1, sizeof *t);
  if (!t) goto oom;
  t->dtype = dtype;
  t->rank = rank;
  if (rank > 0) memcpy(t->shape, shape, (size_t)rank * sizeof *shape);
  t->nbytes = nbytes;
  t->data = calloc(1, nbytes ? nbytes : 1);
  t->name = name ? strdup(name) : NULL;
  if (!t->data || (name && !t->name)) goto oom;
  return t;
oom:
  tpb_tensor_destroy(t);
  tpb_fail(err, TPB_ERR_NO_MEMORY, NULL, "out of memory for a tensor of %zu bytes", nbytes);
  return NULL;
}

void tpb_tensor_destroy(tpb_tensor *t) {
  if (!t) return;
  free(t->name);
  free(t->data);
  free(t);
}

/* ---- decoding ------------------------------------------------------------ */

/* The typed field that holds values of DTYPE and its length. */
static size_t tpb_typed_count(const Onnx__TensorProto *p, int dtype, const char **field) {
  switch (dtype) {
  case NOVA_DTYPE_F32: *field = "float_data"; return p->n_float_data;
  case NOVA_DTYPE_F64: *field = "double_data"; return p->n_double_data;
  case NOVA_DTYPE_I64: *field = "int64_data"; return p->n_int64_data;
  case NOVA_DTYPE_U32:
  case NOVA_DTYPE_U64: *field = "uint64_data"; return p->n_uint64_data;
  default: *field = "int32_data"; return p->n_int32_data; /* i32, i16, i8, u16, u8, bool, f16, bf16 */
  }
}

/* Copies COUNT typed values of P into DATA, converted to DTYPE's layout. */
static void tpb_copy_typed(const Onnx__TensorProto *p, int dtype, size_t count, void *data) {
  switch (dtype) {
  case NOVA_DTYPE_F32: memcpy(data, p->float_data, count * sizeof(float)); break;
  case NOVA_DTYPE_F64: memcpy(data, p->double_data, count * sizeof(double)); break;
  case NOVA_DTYPE_I64: memcpy(data, p->int64_data, count * sizeof(int64_t)); break;
  case NOVA_DTYPE_I32: memcpy(data, p->int32_data, count * sizeof(int32_t)); break;
  case NOVA_DTYPE_BOOL:
    for (size_t i = 0; i < count; i++) ((uint8_t *)data)[i] = p->int32_data[i] != 0;
    break;
  case NOVA_DTYPE_I8:
  case NOVA_DTYPE_U8: /* the low bits of each value */
    for (size_t i = 0; i < count; i++) ((uint8_t *)data)[i] = (uint8_t)(p->int32_data[i] & 0xff);
    break;
  case NOVA_DTYPE_U32:
    for (size_t i = 0; i < count; i++) ((uint32_t *)data)[i] = (uint32_t)p->uint64_data[i];
    break;
  case NOVA_DTYPE_U64: memcpy(data, p->uint64_data, count * sizeof(uint64_t)); break;
  default: /* i16, u16, f16, bf16: the 16 bits of each value, as ONNX stores them */
    for (size_t i = 0; i < count; i++) ((uint16_t *)data)[i] = (uint16_t)(p->int32_data[i] & 0xffff);
    break;
  }
}

/* Checks that P carries exactly the data of a tensor of DTYPE, RANK,
 * SHAPE (NBYTES bytes), in raw_data or in DTYPE's typed field. */
static tpb_status tpb_check_data(const Onnx__TensorProto *p, int dtype, int rank, const int64_t *shape,
                                 size_t nbytes, const char *where, char *err) {
  char buf[256];
  const char *field;
  size_t count = nbytes / rt_dtype_size(dtype), typed = tpb_typed_count(p, dtype, &field);
  size_t any_typed = p->n_float_data + p->n_double_data + p->n_int32_data + p->n_int64_data + p->n_uint64_data +
                     p->n_string_data;
  const char *shape_str = rt_shape_str(buf, sizeof buf, rank, shape);
  if (p->has_raw_data && any_typed > 0)
    return tpb_fail(err, TPB_ERR_FORMAT, where, "both raw_data and typed values are set");
  if (p->has_raw_data && p->raw_data.len != nbytes)
    return tpb_fail(err, TPB_ERR_FORMAT, where, "raw_data holds %zu bytes; shape %s of %s needs %zu",
                    p->raw_data.len, shape_str, rt_dtype_name(dtype), nbytes);
  if (p->has_raw_data) return TPB_OK;
  if (typed != any_typed)
    return tpb_fail(err, TPB_ERR_FORMAT, where, "values of a %s tensor must be in raw_data or %s",
                    tpb_onnx_type_name(dtype), field);
  if (typed != count)
    return tpb_fail(err, TPB_ERR_FORMAT, where, "%s holds %zu values; shape %s needs %zu", field, typed, shape_str,
                    count);
  return TPB_OK;
}

/* What decoding refuses before looking at shape and data. */
static tpb_status tpb_check_proto(const Onnx__TensorProto *p, const char *where, char *err) {
  if (p->n_external_data > 0 ||
      (p->has_data_location && p->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL))
    return tpb_fail(err, TPB_ERR_FORMAT, where, "tensors with external data are not supported");
  if (p->segment) return tpb_fail(err, TPB_ERR_FORMAT, where, "segmented tensors are not supported");
  if (!p->has_data_type || p->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__UNDEFINED)
    return tpb_fail(err, TPB_ERR_FORMAT, where, "no data_type: not an ONNX TensorProto of a supported type");
  if (p->n_dims > NOVA_MAX_RANK)
    return tpb_fail(err, TPB_ERR_SHAPE, where, "%zu dimensions; at most %d are supported", p->n_dims,
                    NOVA_MAX_RANK);
  return TPB_OK;
}

/* *OUT = the tensor P describes; every check runs before any allocation
 * of the tensor's size. */
static tpb_status tpb_from_proto(const Onnx__TensorProto *p, const char *where, tpb_tensor **out, char *err) {
  char why[TPB_ERROR_LEN];
  size_t nbytes;
  int rank = (int)p->n_dims;
  tpb_status st = tpb_check_proto(p, where, err);
  if (st != TPB_OK) return st;
  st = tpb_tensor_nbytes(p->data_type, rank, p->dims, &nbytes, why);
  if (st != TPB_OK) return tpb_fail(err, st, where, "%s", why);
  st = tpb_check_data(p, p->data_type, rank, p->dims, nbytes, where, err);
  if (st != TPB_OK) return st;
  tpb_tensor *t = tpb_tensor_create(p->name && p->name[0] ? p->name : NULL, p->data_type, rank, p->dims, why);
  if (!t) return tpb_fail(err, TPB_ERR_NO_MEMORY, where, "%s", why);
  /* With nothing to copy the source pointers may be NULL: no memcpy then. */
  if (nbytes > 0 && p->has_raw_data)
    memcpy(t->data, p->raw_data.data, nbytes);
  else if (nbytes > 0)
    tpb_copy_typed(p, t->dtype, nbytes / rt_dtype_size(t->dtype), t->data);
  *out = t;
  return TPB_OK;
}

tpb_status tpb_decode(const uint8_t *buf, size_t len, const char *where, tpb_tensor **out, char *err) {
  if (!out) return tpb_fail(err, TPB_ERR_INVALID_ARGUMENT, where, "no place for the result");
  *out = NULL;
  if (!buf && len > 0) return tpb_fail(err, TPB_ERR_INVALID_ARGUMENT, where, "no data");
  if (len == 0) return tpb_fail(err, TPB_ERR_FORMAT, where, "empty file, not an ONNX TensorProto");
  Onnx__TensorProto *p = onnx__tensor_proto__unpack(NULL, len, buf);
  if (!p) return tpb_fail(err, TPB_ERR_FORMAT, where, "not an ONNX TensorProto (protobuf decoding failed)");
  tpb_status st = tpb_from_proto(p, where, out, err);
  onnx__tensor_proto__free_unpacked(p, NULL);
  return st;
}

/* ---- files --------------------------------------------------------------- */

/* The whole content of F into *BUF (caller frees) and *LEN. */
static tpb_status tpb_slurp(FILE *f, const char *path, uint8_t **buf, size_t *len, char *err) {
  size_t cap = 1 << 16, n = 0;
  uint8_t *b = malloc(cap);
  while (b) {
    n += fread(b + n, 1, cap - n, f);
    if (n < cap) break;
    uint8_t *bigger = cap <= SIZE_MAX / 2 ? realloc(b, cap * 2) : NULL;
    if (!bigger) free(b);
    b = bigger;
    cap *= 2;
  }
  if (!b) return tpb_fail(err, TPB_ERR_NO_MEMORY, path, "out of memory reading the file");
  if (ferror(f)) {
    free(b);
    return tpb_fail(err, TPB_ERR_IO, path, "read error: %s", strerror(errno));
  }
  *buf = b;
  *len = n;
  return TPB_OK;
}

tpb_status tpb_read_file(const char *path, tpb_tensor **out, char *err) {
  uint8_t *buf = NULL;
  size_t len = 0;
  if (!out) return tpb_fail(err, TPB_ERR_INVALID_ARGUMENT, path, "no place for the result");
  *out = NULL;
  if (!path) return tpb_fail(err, TPB_ERR_INVALID_ARGUMENT, NULL, "no file name");
  FILE *f = fopen(path, "rb");
  if (!f) return tpb_fail(err, TPB_ERR_IO, path, "cannot open: %s", strerror(errno));
  tpb_status st = tpb_slurp(f, path, &buf, &len, err);
  fclose(f);
  if (st != TPB_OK) return st;
  st = tpb_decode(buf, len, path, out, err);
  free(buf);
  return st;
}

tpb_status tpb_write_file(const char *path, const tpb_tensor *t, char *err) {
  if (!path || !t || (!t->data && t->nbytes))
    return tpb_fail(err, TPB_ERR_INVALID_ARGUMENT, path, "nothing to write");
  int64_t dims[NOVA_MAX_RANK];
  size_t nbytes;
  tpb_status st = tpb_tensor_nbytes(t->dtype, t->rank, t->shape, &nbytes, err);
  if (st != TPB_OK) return st;
  if (nbytes != t->nbytes)
    return tpb_fail(err, TPB_ERR_INVALID_ARGUMENT, path, "tensor holds %zu bytes, its shape needs %zu", t->nbytes,
                    nbytes);
  if (t->rank > 0) memcpy(dims, t->shape, (size_t)t->rank * sizeof *dims);
  Onnx__TensorProto p = ONNX__TENSOR_PROTO__INIT;
  p.n_dims = (size_t)t->rank;
  p.dims = dims;
  p.has_data_type = 1;
  p.data_type = t->dtype;
  p.name = t->name;
  p.has_raw_data = 1;
  p.raw_data.len = t->nbytes;
  p.raw_data.data = t->data;
  size_t len = onnx__tensor_proto__get_packed_size(&p);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return tpb_fail(err, TPB_ERR_NO_MEMORY, path, "out of memory encoding %zu bytes", len);
  onnx__tensor_proto__pack(&p, buf);
  int bad = nv_write_file(path, buf, len, 0);
  int saved = errno;
  free(buf);
  if (bad) return tpb_fail(err, TPB_ERR_IO, path, "cannot write: %s", strerror(saved));
  return TPB_OK;
}
