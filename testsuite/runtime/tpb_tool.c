/* tpb_tool.c: writes and prints TensorProto files with driver/tensor_pb.c,
 * for run.sh where the Python onnx package is missing.
 *
 *   tpb_tool write FILE NAME DTYPE DIMS VALUES   DIMS "2,3" ("-" = rank 0),
 *                                                VALUES "1,2,3" ("-" = none)
 *   tpb_tool print FILE     prints "NAME DTYPE [DIMS] V0 V1 ..."
 *
 * DTYPE is f32, f64, i32, i64 or bool.  Numbers print as %.9g (floats) or
 * %lld (integers), the format run.sh's Python printer also uses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_dtype.h"
#include "tensor_pb.h"

static int dtype_code(const char *name) {
  static const int codes[] = {NOVA_DTYPE_F32, NOVA_DTYPE_F64, NOVA_DTYPE_I32, NOVA_DTYPE_I64, NOVA_DTYPE_BOOL};
  for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
    if (strcmp(rt_dtype_name(codes[i]), name) == 0) return codes[i];
  return 0;
}

/* Parses "a,b,c" ("-" = empty) into OUT[max]; returns the count, -1 if too many. */
static int parse_list(const char *s, double *out, int max) {
  int n = 0;
  if (strcmp(s, "-") == 0) return 0;
  for (char *end; *s; s = *end ? end + 1 : end) {
    if (n == max) return -1;
    out[n++] = strtod(s, &end);
  }
  return n;
}

static void store(tpb_tensor *t, size_t i, double v) {
  switch (t->dtype) {
  case NOVA_DTYPE_F32: ((float *)t->data)[i] = (float)v; break;
  case NOVA_DTYPE_F64: ((double *)t->data)[i] = v; break;
  case NOVA_DTYPE_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
  case NOVA_DTYPE_I64: ((int64_t *)t->data)[i] = (int64_t)v; break;
  default: ((uint8_t *)t->data)[i] = v != 0; break;
  }
}

static int cmd_write(char **argv) {
  char err[TPB_ERROR_LEN];
  double dims[NOVA_MAX_RANK + 1], values[4096];
  int64_t shape[NOVA_MAX_RANK];
  int dtype = dtype_code(argv[3]), rank = parse_list(argv[4], dims, NOVA_MAX_RANK);
  int n = parse_list(argv[5], values, 4096);
  if (!dtype || rank < 0 || n < 0) return fprintf(stderr, "tpb_tool: bad dtype, dims or values\n"), 1;
  for (int d = 0; d < rank; d++) shape[d] = (int64_t)dims[d];
  tpb_tensor *t = tpb_tensor_create(argv[2], dtype, rank, shape, err);
  if (!t) return fprintf(stderr, "tpb_tool: %s\n", err), 1;
  size_t count = t->nbytes / rt_dtype_size(dtype);
  for (size_t i = 0; i < count && i < (size_t)n; i++) store(t, i, values[i]);
  int rc = tpb_write_file(argv[1], t, err) != TPB_OK;
  if (rc) fprintf(stderr, "tpb_tool: %s\n", err);
  tpb_tensor_destroy(t);
  return rc;
}

static int cmd_print(const char *path) {
  char err[TPB_ERROR_LEN], shape[256];
  tpb_tensor *t = NULL;
  if (tpb_read_file(path, &t, err) != TPB_OK) return fprintf(stderr, "tpb_tool: %s\n", err), 1;
  printf("%s %s %s", t->name ? t->name : "-", rt_dtype_name(t->dtype),
         rt_shape_str(shape, sizeof shape, t->rank, t->shape));
  for (size_t i = 0; i < t->nbytes / rt_dtype_size(t->dtype); i++) {
    switch (t->dtype) {
    case NOVA_DTYPE_F32: printf(" %.9g", ((float *)t->data)[i]); break;
    case NOVA_DTYPE_F64: printf(" %.9g", ((double *)t->data)[i]); break;
    case NOVA_DTYPE_I32: printf(" %d", ((int32_t *)t->data)[i]); break;
    case NOVA_DTYPE_I64: printf(" %lld", (long long)((int64_t *)t->data)[i]); break;
    case NOVA_DTYPE_BOOL: printf(" %d", ((uint8_t *)t->data)[i]); break;
    default: printf(" ?"); break;
    }
  }
  printf("\n");
  tpb_tensor_destroy(t);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 7 && strcmp(argv[1], "write") == 0) return cmd_write(argv + 1);
  if (argc == 3 && strcmp(argv[1], "print") == 0) return cmd_print(argv[2]);
  fprintf(stderr, "usage: tpb_tool write FILE NAME DTYPE DIMS VALUES | tpb_tool print FILE\n");
  return 2;
}
