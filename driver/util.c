/* util.c: growable strings, whole-file reading, name patterns. */
#include "util.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void nv_sb_vprintf(nv_sbuf *b, const char *fmt, va_list ap) {
  if (b->oom) return;
  for (;;) {
    va_list aq;
    va_copy(aq, ap);
    size_t room = b->s ? b->cap - b->len : 0;
    int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, aq);
    va_end(aq);
    if (n < 0) return;
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = (b->cap + (size_t)n + 1) * 2;
    char *p = realloc(b->s, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->s = p;
    b->cap = cap;
  }
}

void nv_sb_printf(nv_sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nv_sb_vprintf(b, fmt, ap);
  va_end(ap);
}

void nv_sb_free(nv_sbuf *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}

char *nv_read_file(const char *path, size_t *len, size_t max_bytes) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (n > max_bytes) {
      free(buf);
      fclose(f);
      errno = EFBIG;
      return NULL;
    }
    if (got == 0) break;
    if (n == cap) {
      char *p = realloc(buf, 2 * cap + 1);
      if (!p) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = p;
      cap *= 2;
    }
  }
  int err = ferror(f);
  fclose(f);
  if (!buf) {
    errno = ENOMEM;
    return NULL;
  }
  if (err) {
    free(buf);
    errno = EIO;
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

bool nv_glob_match(const char *globs, const char *name, bool *matched) {
  if (!globs) return false;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", globs);
  bool hit = false;
  int k = 0;
  char *save = NULL;
  for (char *gl = strtok_r(buf, ",", &save); gl && k < NV_MAX_GLOBS; gl = strtok_r(NULL, ",", &save), k++)
    if (fnmatch(gl, name, 0) == 0) hit = matched[k] = true;
  return hit;
}

int nv_glob_count(const char *globs) {
  int n = globs ? 1 : 0;
  for (const char *p = globs; p && *p; p++) n += *p == ',';
  return n < NV_MAX_GLOBS ? n : NV_MAX_GLOBS;
}
