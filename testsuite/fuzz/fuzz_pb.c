/* fuzz_pb.c: libFuzzer harness for novarun's TensorProto reader.
 *
 * Feeds each input to tpb_decode as the bytes of a .pb file (what
 * tpb_read_file does after reading the file, for --inputs DIR) and checks
 * that a decoded tensor holds what its shape says.  Messages go to a buffer
 * and are dropped.
 *
 *   make fuzz-pb
 *   build-fuzz/fuzz_pb -max_len=65536 CORPUS_DIR testsuite/fuzz/corpus_pb
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../driver/tensor_pb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[TPB_ERROR_LEN];
  tpb_tensor *t = NULL;
  err[0] = '\0';
  tpb_status st = tpb_decode(data, size, "fuzz.pb", &t, err);
  if (st == TPB_OK) {
    size_t nbytes = 0;
    if (!t || tpb_tensor_nbytes(t->dtype, t->rank, t->shape, &nbytes, NULL) != TPB_OK || nbytes != t->nbytes)
      abort();
    volatile uint8_t sum = 0; /* every byte readable */
    for (size_t i = 0; i < t->nbytes; i++) sum ^= ((const uint8_t *)t->data)[i];
    (void)sum;
  } else if (t || !err[0] || !memchr(err, '\0', sizeof err)) {
    abort(); /* a failure leaves no tensor and says why */
  }
  tpb_tensor_destroy(t);
  return 0;
}
