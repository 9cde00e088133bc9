/* fuzz_onnx.c: libFuzzer harness for the ONNX loader.
 *
 * Feeds each input to fe_parse_onnx as the bytes of a model file and frees
 * whatever it returns.  Diagnostics go to /dev/null (opened once).  External
 * data is resolved against a folder that holds nothing, so a model naming an
 * external file gets the "cannot read" path, never a real file.
 *
 *   make fuzz-onnx
 *   build-fuzz/fuzz_onnx -max_len=65536 CORPUS_DIR testsuite/fuzz/corpus_onnx
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../support/diag.h"
#include "../../frontend/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *devnull;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!devnull) {
    devnull = fopen("/dev/null", "w");
    if (!devnull) abort();
  }
  /* Bindings for the symbolic dimension names the seeds use, so that inputs
   * get past the input declarations into the op converters. */
  fe_dim_binding dims[] = {
      {.name = "batch", .value = 2},
      {.name = "N", .value = 2},
      {.name = "seq", .value = 4},
  };
  nv_diag *d = nv_diag_create(devnull);
  if (!d) abort();
  nv_graph *g = fe_parse_onnx(d, "fuzz.onnx", data, size, "/nonexistent-fuzz-dir", dims,
                              (int)(sizeof dims / sizeof dims[0]), NULL);
  fe_graph_destroy(g);
  nv_diag_destroy(d);
  return 0;
}
