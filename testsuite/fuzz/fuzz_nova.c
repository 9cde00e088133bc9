/* fuzz_nova.c: libFuzzer harness for the .nova text parser.
 *
 * Feeds each input to fe_parse_text as the text of a file and frees the
 * graph it returns.  Diagnostics go to /dev/null (opened once).  The
 * symbolic dimensions the examples use are bound, so that inputs get past
 * their declarations; file("...") initializers are only recorded by the
 * parser (their files are read when the step is built), against a folder
 * that holds nothing.
 *
 *   make fuzz-nova
 *   build-fuzz/fuzz_nova -max_len=16384 CORPUS_DIR testsuite/fuzz/corpus_nova
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
  fe_dim_binding dims[] = {
      {.name = "batch", .value = 2}, {.name = "seq", .value = 4}, {.name = "N", .value = 2},
      {.name = "M", .value = 3},     {.name = "K", .value = 2},
  };
  nv_diag *d = nv_diag_create(devnull);
  if (!d) abort();
  /* registered as novac does, so that diagnostics print the offending line */
  const char *name = nv_diag_add_source(d, "fuzz.nova", (const char *)data, size);
  /* the parser reads exactly [data, data + size): no terminator is added,
   * so that ASan sees a read past the end */
  nv_graph *g = fe_parse_text(d, name, (const char *)data, size, "/nonexistent-fuzz-dir", dims,
                              (int)(sizeof dims / sizeof dims[0]));
  fe_graph_destroy(g);
  nv_diag_destroy(d);
  return 0;
}
