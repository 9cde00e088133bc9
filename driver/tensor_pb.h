/* tensor_pb.h: ONNX TensorProto files (the ONNX backend-test `.pb` layout)
 * read into and written from plain dense tensors.
 *
 * Reading accepts data in raw_data (little-endian) or in the typed fields
 * (float_data, double_data, int32_data, int64_data; bool, f16 and bf16 in
 * int32_data as ONNX specifies).  Writing always uses raw_data.  Every
 * function returns a status and, on failure, a one-line message naming the
 * file; nothing here exits or prints.
 */
#ifndef NOVA_TENSOR_PB_H
#define NOVA_TENSOR_PB_H

#include <stddef.h>
#include <stdint.h>

#include "nova/step.h"

#define TPB_ERROR_LEN 512

typedef enum tpb_status {
  TPB_OK = 0,
  TPB_ERR_IO = 1,        /* cannot open, read or write the file */
  TPB_ERR_FORMAT = 2,    /* not a TensorProto, or its data does not match its shape */
  TPB_ERR_DTYPE = 3,     /* an element type novarun does not handle */
  TPB_ERR_SHAPE = 4,     /* too many, negative or overflowing dimensions */
  TPB_ERR_NO_MEMORY = 5,
  TPB_ERR_INVALID_ARGUMENT = 6
} tpb_status;

/* A dense tensor.  shape[0..rank) valid; data holds nbytes bytes in the
 * host's (little-endian) layout; name may be NULL. */
typedef struct tpb_tensor {
  char *name;
  int dtype; /* nova_dtype, the ONNX TensorProto.DataType code */
  int rank;
  int64_t shape[NOVA_MAX_RANK];
  void *data;
  size_t nbytes;
} tpb_tensor;

/* A zero-filled tensor (caller owns; tpb_tensor_destroy).  NAME may be
 * NULL; SHAPE may be NULL when RANK is 0.  On failure returns NULL and
 * writes why to ERR (TPB_ERROR_LEN bytes) when ERR is not NULL. */
tpb_tensor *tpb_tensor_create(const char *name, int dtype, int rank, const int64_t *shape, char *err);
void tpb_tensor_destroy(tpb_tensor *t);

/* Bytes of a dense tensor of DTYPE, RANK, SHAPE into *NBYTES; TPB_ERR_DTYPE
 * or TPB_ERR_SHAPE (message in ERR) if it has none. */
tpb_status tpb_tensor_nbytes(int dtype, int rank, const int64_t *shape, size_t *nbytes, char *err);

/* Reads the TensorProto in PATH into *OUT (caller owns).  On failure *OUT
 * is NULL and ERR holds "PATH: reason". */
tpb_status tpb_read_file(const char *path, tpb_tensor **out, char *err);

/* Decodes one serialized TensorProto of LEN bytes; WHERE names it in
 * messages ("WHERE: reason"). */
tpb_status tpb_decode(const uint8_t *buf, size_t len, const char *where, tpb_tensor **out, char *err);

/* Writes T to PATH as a TensorProto (raw_data, dims, data_type, name). */
tpb_status tpb_write_file(const char *path, const tpb_tensor *t, char *err);

/* The ONNX name of an ONNX TensorProto.DataType code ("FLOAT", "STRING",
 * ...) for messages; "?" if unknown. */
const char *tpb_onnx_type_name(int data_type);

#endif
