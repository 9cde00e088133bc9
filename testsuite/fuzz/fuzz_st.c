/* fuzz_st.c: libFuzzer harness for novarun's safetensors reader.
 *
 * nr_st_open takes a path (it checks that the file is a regular one and
 * reads it with pread), so each input is written to an in-memory file
 * (memfd) and opened as /proc/self/fd/N.  What novarun does with a file
 * that passes the checks follows: --load reads the whole data section at
 * once and looks its tensors and metadata up by name; --data reads each
 * tensor's bytes.  Diagnostics (nr_error, defined here in place of
 * novarun.c's) go to /dev/null.
 *
 *   make fuzz-st
 *   build-fuzz/fuzz_st -max_len=65536 CORPUS_DIR testsuite/fuzz/corpus_st
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../driver/novarun.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *devnull;
static int memfd = -1;
static char path[64];

int nr_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(devnull, fmt, ap);
  va_end(ap);
  return 1;
}

void nr_warning(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(devnull, fmt, ap);
  va_end(ap);
}

/* What novarun reads of an opened file F (novarun_ckpt.c, novarun_data.c). */
static void use(const nr_st_file *f) {
  void *all = malloc(f->data_size ? (size_t)f->data_size : 1);
  if (!all) abort();
  if (nr_st_read(f, 0, all, (size_t)f->data_size)) abort(); /* inside the file: must succeed */
  for (int i = 0; i < f->ntensors; i++) {
    const nr_st_tensor *t = &f->tensors[i];
    if (nr_st_find(f, t->name) == NULL) abort();
    if (nr_st_read(f, t->begin, all, (size_t)(t->end - t->begin))) abort();
  }
  /* one byte beyond the data section must be refused */
  if (!nr_st_read(f, f->data_size, all, 1)) abort();
  (void)nr_st_find(f, "w");
  (void)nr_st_metadata(f, "step");
  (void)nr_st_metadata(f, "graph_hash");
  free(all);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!devnull) {
    devnull = fopen("/dev/null", "w");
    memfd = memfd_create("fuzz_st", 0);
    if (!devnull || memfd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
  }
  if (ftruncate(memfd, 0) != 0) abort();
  for (size_t done = 0; done < size;) {
    ssize_t n = pwrite(memfd, data + done, size - done, (off_t)done);
    if (n <= 0) abort();
    done += (size_t)n;
  }
  nr_st_file f;
  if (nr_st_open(path, &f) == 0) {
    use(&f);
    nr_st_close(&f);
  }
  return 0;
}
