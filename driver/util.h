/* util.h: growable strings, whole-file reading, name patterns. */
#ifndef NOVA_UTIL_H
#define NOVA_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct nv_sbuf {
  char *s;      /* NUL-terminated once anything was written; owned */
  size_t len, cap;
  int oom;      /* an allocation failed: the text is incomplete */
} nv_sbuf;

void nv_sb_printf(nv_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nv_sb_vprintf(nv_sbuf *b, const char *fmt, va_list ap);
void nv_sb_free(nv_sbuf *b);

/* Reads a whole file; returns malloc'd bytes (NUL-terminated) or NULL with
 * errno set.  Refuses files over max_bytes (errno = EFBIG). */
char *nv_read_file(const char *path, size_t *len, size_t max_bytes);

/* Whether NAME matches one of the comma-separated fnmatch(3) patterns of
 * GLOBS (NULL: none; at most NV_MAX_GLOBS are read); sets MATCHED[k] for
 * each pattern k that matches.  nv_glob_count: how many patterns. */
#define NV_MAX_GLOBS 64
bool nv_glob_match(const char *globs, const char *name, bool *matched);
int nv_glob_count(const char *globs);

#endif
