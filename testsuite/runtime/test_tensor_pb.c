/* test_tensor_pb.c: unit test of driver/tensor_pb.c.  TensorProtos are
 * built with protobuf-c directly, so the typed-field and malformed cases
 * do not depend on tensor_pb's own writer.  Usage: test_tensor_pb TMPDIR.
 * Prints one `PASS|FAIL: runtime :: tensor_pb.CASE` line per case (reasons
 * indented below a failure) and exits 0 unless it crashed.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"
#include "tensor_pb.h"

static int case_failures;
static char case_reasons[8192];
static const char *tmpdir;

__attribute__((format(printf, 1, 2))) static void note_failure(const char *fmt, ...) {
  size_t used = strlen(case_reasons);
  va_list ap;
  case_failures++;
  va_start(ap, fmt);
  vsnprintf(case_reasons + used, sizeof case_reasons - used, fmt, ap);
  va_end(ap);
}

#define EXPECT(cond) \
  do { if (!(cond)) note_failure("    %s:%d: expected %s\n", __FILE__, __LINE__, #cond); } while (0)

static void run_case(const char *name, void (*fn)(void)) {
  case_failures = 0;
  case_reasons[0] = '\0';
  fn();
  printf("%s: runtime :: tensor_pb.%s\n%s", case_failures ? "FAIL" : "PASS", name, case_reasons);
  fflush(stdout);
}

/* ---- building protos ----------------------------------------------------- */

typedef struct packed {
  uint8_t *buf;
  size_t len;
} packed;

static packed pack(const Onnx__TensorProto *p) {
  packed k;
  k.len = onnx__tensor_proto__get_packed_size(p);
  k.buf = malloc(k.len ? k.len : 1);
  onnx__tensor_proto__pack(p, k.buf);
  return k;
}

static Onnx__TensorProto proto(int dtype, size_t rank, int64_t *dims) {
  Onnx__TensorProto p = ONNX__TENSOR_PROTO__INIT;
  p.has_data_type = 1;
  p.data_type = dtype;
  p.n_dims = rank;
  p.dims = dims;
  return p;
}

/* Decodes P; on success *OUT holds the tensor (caller destroys). */
static tpb_status decode(const Onnx__TensorProto *p, tpb_tensor **out, char *err) {
  packed k = pack(p);
  tpb_status st = tpb_decode(k.buf, k.len, "t.pb", out, err);
  free(k.buf);
  return st;
}

/* Decoding P fails with WANT and a message containing TEXT. */
#define EXPECT_REFUSED(p, want, text) expect_refused_at(p, want, text, __LINE__)
static void expect_refused_at(const Onnx__TensorProto *p, tpb_status want, const char *text, int line) {
  char err[TPB_ERROR_LEN] = "";
  tpb_tensor *t = (tpb_tensor *)1;
  tpb_status st = decode(p, &t, err);
  if (st != want || t != NULL || !strstr(err, text))
    note_failure("    line %d: status %d (want %d), message '%s' (want '%s')\n", line, (int)st, (int)want, err, text);
  if (st == TPB_OK && t != (tpb_tensor *)1) tpb_tensor_destroy(t);
}

/* ---- cases --------------------------------------------------------------- */

static void test_roundtrip(void) {
  char path[1024], err[TPB_ERROR_LEN];
  const int64_t shape[2] = {2, 3};
  tpb_tensor *t = tpb_tensor_create("x", NOVA_DTYPE_F32, 2, shape, err), *r = NULL;
  EXPECT(t && t->nbytes == 24);
  if (!t) return;
  for (int i = 0; i < 6; i++) ((float *)t->data)[i] = (float)i - 2.5f;
  snprintf(path, sizeof path, "%s/rt.pb", tmpdir);
  EXPECT(tpb_write_file(path, t, err) == TPB_OK);
  EXPECT(tpb_read_file(path, &r, err) == TPB_OK);
  if (r) {
    EXPECT(r->name && strcmp(r->name, "x") == 0 && r->dtype == NOVA_DTYPE_F32 && r->rank == 2);
    EXPECT(r->shape[0] == 2 && r->shape[1] == 3 && r->nbytes == 24);
    EXPECT(memcmp(r->data, t->data, 24) == 0);
  }
  tpb_tensor_destroy(t);
  tpb_tensor_destroy(r);
}

static void test_roundtrip_scalar_and_empty(void) {
  char path[1024], err[TPB_ERROR_LEN];
  const int64_t empty_shape[2] = {0, 4};
  tpb_tensor *s = tpb_tensor_create(NULL, NOVA_DTYPE_I64, 0, NULL, err), *e, *r = NULL;
  e = tpb_tensor_create("e", NOVA_DTYPE_BOOL, 2, empty_shape, err);
  EXPECT(s && s->nbytes == 8 && e && e->nbytes == 0);
  if (!s || !e) goto out;
  *(int64_t *)s->data = -1234567890123LL;
  snprintf(path, sizeof path, "%s/scalar.pb", tmpdir);
  EXPECT(tpb_write_file(path, s, err) == TPB_OK && tpb_read_file(path, &r, err) == TPB_OK);
  EXPECT(r && r->rank == 0 && r->name == NULL && *(int64_t *)r->data == -1234567890123LL);
  tpb_tensor_destroy(r);
  r = NULL;
  snprintf(path, sizeof path, "%s/empty.pb", tmpdir);
  EXPECT(tpb_write_file(path, e, err) == TPB_OK && tpb_read_file(path, &r, err) == TPB_OK);
  EXPECT(r && r->rank == 2 && r->shape[0] == 0 && r->shape[1] == 4 && r->nbytes == 0);
out:
  tpb_tensor_destroy(r);
  tpb_tensor_destroy(s);
  tpb_tensor_destroy(e);
}

static void test_typed_fields(void) {
  char err[TPB_ERROR_LEN];
  int64_t dims[1] = {3};
  float f[3] = {1.5f, -2, 3};
  double d[3] = {0.25, -8, 1e300};
  int32_t i32[3] = {7, -1, 0}, b[3] = {0, 5, 1}, h[3] = {0x3c00, 0xc000, 0x7f80};
  int64_t i64[3] = {INT64_MAX, -3, 4};
  tpb_tensor *t = NULL;
  Onnx__TensorProto p = proto(NOVA_DTYPE_F32, 1, dims);
  p.n_float_data = 3, p.float_data = f;
  EXPECT(decode(&p, &t, err) == TPB_OK && t && memcmp(t->data, f, sizeof f) == 0);
  tpb_tensor_destroy(t);
  p = proto(NOVA_DTYPE_F64, 1, dims);
  p.n_double_data = 3, p.double_data = d;
  EXPECT(decode(&p, &t, err) == TPB_OK && t && memcmp(t->data, d, sizeof d) == 0);
  tpb_tensor_destroy(t);
  p = proto(NOVA_DTYPE_I32, 1, dims);
  p.n_int32_data = 3, p.int32_data = i32;
  EXPECT(decode(&p, &t, err) == TPB_OK && t && memcmp(t->data, i32, sizeof i32) == 0);
  tpb_tensor_destroy(t);
  p = proto(NOVA_DTYPE_I64, 1, dims);
  p.n_int64_data = 3, p.int64_data = i64;
  EXPECT(decode(&p, &t, err) == TPB_OK && t && memcmp(t->data, i64, sizeof i64) == 0);
  tpb_tensor_destroy(t);
  p = proto(NOVA_DTYPE_BOOL, 1, dims);
  p.n_int32_data = 3, p.int32_data = b;
  EXPECT(decode(&p, &t, err) == TPB_OK && t && t->nbytes == 3);
  EXPECT(t && memcmp(t->data, "\0\1\1", 3) == 0);
  tpb_tensor_destroy(t);
  int64_t none[2] = {3, 0};
  p = proto(NOVA_DTYPE_F32, 2, none); /* no values at all: 0 elements */
  EXPECT(decode(&p, &t, err) == TPB_OK && t && t->nbytes == 0 && t->rank == 2);
  tpb_tensor_destroy(t);
  p = proto(NOVA_DTYPE_F16, 1, dims);
  p.n_int32_data = 3, p.int32_data = h;
  EXPECT(decode(&p, &t, err) == TPB_OK && t && t->nbytes == 6);
  EXPECT(t && ((uint16_t *)t->data)[0] == 0x3c00 && ((uint16_t *)t->data)[1] == 0xc000);
  tpb_tensor_destroy(t);
  /* the narrow integers in int32_data (their low bits), uint32/uint64 in uint64_data */
  int32_t i8v[3] = {-128, 127, -1}, u16v[3] = {65535, 0, 40000};
  uint64_t u64v[3] = {UINT64_MAX, (UINT64_C(1) << 63) + 5, 7};
  p = proto(NOVA_DTYPE_I8, 1, dims);
  p.n_int32_data = 3, p.int32_data = i8v;
  EXPECT(decode(&p, &t, err) == TPB_OK && t && t->nbytes == 3);
  EXPECT(t && memcmp(t->data, (int8_t[]){-128, 127, -1}, 3) == 0);
  tpb_tensor_destroy(t);
  p = proto(NOVA_DTYPE_U16, 1, dims);
  p.n_int32_data = 3, p.int32_data = u16v;
  EXPECT(decode(&p, &t, err) == TPB_OK && t && t->nbytes == 6);
  EXPECT(t && memcmp(t->data, (uint16_t[]){65535, 0, 40000}, 6) == 0);
  tpb_tensor_destroy(t);
  p = proto(NOVA_DTYPE_U64, 1, dims);
  p.n_uint64_data = 3, p.uint64_data = u64v;
  EXPECT(decode(&p, &t, err) == TPB_OK && t && memcmp(t->data, u64v, sizeof u64v) == 0);
  tpb_tensor_destroy(t);
  p = proto(NOVA_DTYPE_U32, 1, dims);
  p.n_uint64_data = 3, p.uint64_data = (uint64_t[]){UINT32_MAX, 1, 2};
  EXPECT(decode(&p, &t, err) == TPB_OK && t && t->nbytes == 12);
  EXPECT(t && memcmp(t->data, (uint32_t[]){UINT32_MAX, 1, 2}, 12) == 0);
  tpb_tensor_destroy(t);
  p = proto(NOVA_DTYPE_U8, 1, dims); /* a uint8 tensor's values belong in int32_data */
  p.n_uint64_data = 3, p.uint64_data = u64v;
  EXPECT_REFUSED(&p, TPB_ERR_FORMAT, "values of a UINT8 tensor must be in raw_data or int32_data");
}

static void test_refused_data(void) {
  int64_t dims[2] = {2, 3};
  float f[5] = {0};
  int64_t i64[6] = {0};
  uint8_t raw[24] = {0};
  Onnx__TensorProto p = proto(NOVA_DTYPE_F32, 2, dims);
  p.has_raw_data = 1, p.raw_data.len = 20, p.raw_data.data = raw;
  EXPECT_REFUSED(&p, TPB_ERR_FORMAT, "t.pb: raw_data holds 20 bytes; shape [2,3] of f32 needs 24");
  p = proto(NOVA_DTYPE_F32, 2, dims);
  p.n_float_data = 5, p.float_data = f;
  EXPECT_REFUSED(&p, TPB_ERR_FORMAT, "t.pb: float_data holds 5 values; shape [2,3] needs 6");
  p = proto(NOVA_DTYPE_F32, 2, dims);
  EXPECT_REFUSED(&p, TPB_ERR_FORMAT, "float_data holds 0 values; shape [2,3] needs 6");
  p = proto(NOVA_DTYPE_F32, 2, dims);
  p.n_int64_data = 6, p.int64_data = i64;
  EXPECT_REFUSED(&p, TPB_ERR_FORMAT, "values of a FLOAT tensor must be in raw_data or float_data");
  p = proto(NOVA_DTYPE_F32, 2, dims);
  p.has_raw_data = 1, p.raw_data.len = 24, p.raw_data.data = raw;
  p.n_float_data = 5, p.float_data = f;
  EXPECT_REFUSED(&p, TPB_ERR_FORMAT, "both raw_data and typed values are set");
}

static void test_refused_type_and_shape(void) {
  int64_t dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[2] = {2, -3}, huge[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 8};
  uint8_t raw[8] = {0};
  Onnx__TensorProto p = proto(ONNX__TENSOR_PROTO__DATA_TYPE__STRING, 1, dims);
  EXPECT_REFUSED(&p, TPB_ERR_DTYPE, "t.pb: data_type 8 (STRING) is not supported");
  p = proto(ONNX__TENSOR_PROTO__DATA_TYPE__COMPLEX64, 1, dims);
  EXPECT_REFUSED(&p, TPB_ERR_DTYPE, "data_type 14 (COMPLEX64) is not supported");
  p = proto(NOVA_DTYPE_F32, 1, dims);
  p.has_data_type = 0;
  EXPECT_REFUSED(&p, TPB_ERR_FORMAT, "t.pb: no data_type");
  p = proto(NOVA_DTYPE_F32, 9, dims);
  EXPECT_REFUSED(&p, TPB_ERR_SHAPE, "t.pb: 9 dimensions; at most 8 are supported");
  p = proto(NOVA_DTYPE_F32, 2, neg);
  EXPECT_REFUSED(&p, TPB_ERR_SHAPE, "t.pb: negative dimension in shape [2,-3]");
  p = proto(NOVA_DTYPE_F32, 3, huge);
  p.has_raw_data = 1, p.raw_data.len = 8, p.raw_data.data = raw;
  EXPECT_REFUSED(&p, TPB_ERR_SHAPE, "t.pb: shape [1099511627776,1099511627776,8] of f32 is too large");
  p = proto(NOVA_DTYPE_F32, 1, dims);
  p.has_data_location = 1, p.data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
  EXPECT_REFUSED(&p, TPB_ERR_FORMAT, "external data");
}

static void test_refused_bytes(void) {
  char err[TPB_ERROR_LEN];
  tpb_tensor *t = NULL;
  uint8_t raw[24] = {0};
  int64_t dims[2] = {2, 3};
  Onnx__TensorProto p = proto(NOVA_DTYPE_F32, 2, dims);
  p.has_raw_data = 1, p.raw_data.len = 24, p.raw_data.data = raw;
  packed k = pack(&p);
  EXPECT(tpb_decode(k.buf, k.len - 3, "cut.pb", &t, err) == TPB_ERR_FORMAT && !t);
  EXPECT(strstr(err, "cut.pb: not an ONNX TensorProto"));
  EXPECT(tpb_decode((const uint8_t *)"garbage\377\377", 9, "junk.pb", &t, err) == TPB_ERR_FORMAT && !t);
  EXPECT(strstr(err, "junk.pb: not an ONNX TensorProto"));
  EXPECT(tpb_decode(k.buf, 0, "empty.pb", &t, err) == TPB_ERR_FORMAT && strstr(err, "empty.pb: empty file"));
  EXPECT(tpb_decode(k.buf, k.len, "ok.pb", NULL, err) == TPB_ERR_INVALID_ARGUMENT);
  free(k.buf);
}

static void test_files(void) {
  char path[1024], err[TPB_ERROR_LEN];
  tpb_tensor *t = NULL;
  const int64_t shape[1] = {2};
  snprintf(path, sizeof path, "%s/no-such.pb", tmpdir);
  EXPECT(tpb_read_file(path, &t, err) == TPB_ERR_IO && !t);
  EXPECT(strstr(err, "no-such.pb: cannot open: No such file or directory"));
  EXPECT(tpb_read_file(tmpdir, &t, err) != TPB_OK && !t); /* a directory */
  tpb_tensor *w = tpb_tensor_create("w", NOVA_DTYPE_F32, 1, shape, err);
  snprintf(path, sizeof path, "%s/no-such-dir/w.pb", tmpdir);
  EXPECT(w && tpb_write_file(path, w, err) == TPB_ERR_IO && strstr(err, "cannot write"));
  EXPECT(tpb_write_file(path, NULL, err) == TPB_ERR_INVALID_ARGUMENT);
  tpb_tensor_destroy(w);
}

static void test_create(void) {
  char err[TPB_ERROR_LEN];
  const int64_t shape[2] = {2, -1};
  EXPECT(!tpb_tensor_create("a", 8, 0, NULL, err) && strstr(err, "data_type 8 (STRING) is not supported"));
  EXPECT(!tpb_tensor_create("a", NOVA_DTYPE_F32, 2, shape, err) && strstr(err, "negative dimension"));
  EXPECT(!tpb_tensor_create("a", NOVA_DTYPE_F32, 2, NULL, err) && strstr(err, "shape is NULL"));
  EXPECT(!tpb_tensor_create("a", NOVA_DTYPE_F32, 9, shape, NULL));
  EXPECT(strcmp(tpb_onnx_type_name(16), "BFLOAT16") == 0 && strcmp(tpb_onnx_type_name(999), "?") == 0);
  tpb_tensor_destroy(NULL);
}

int main(int argc, char **argv) {
  tmpdir = argc > 1 ? argv[1] : "/tmp";
  run_case("roundtrip", test_roundtrip);
  run_case("roundtrip_scalar_and_empty", test_roundtrip_scalar_and_empty);
  run_case("typed_fields", test_typed_fields);
  run_case("refused_data", test_refused_data);
  run_case("refused_type_and_shape", test_refused_type_and_shape);
  run_case("refused_bytes", test_refused_bytes);
  run_case("files", test_files);
  run_case("create", test_create);
  return 0;
}
