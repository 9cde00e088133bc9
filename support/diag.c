/* diag.c: error collection and printing with source line and caret. */
#include "diag.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct nv_source {
  char *name;
  char *text; /* NULL for interned names without text */
  size_t len;
} nv_source;

struct nv_diag {
  FILE *out;
  int nerr;
  int nsrc, capsrc;
  nv_source *src;
  nv_strmap index; /* name -> position in src (a node of a model is one name each) */
};

nv_diag *nv_diag_create(FILE *out) {
  nv_diag *d = nv_xcalloc(1, sizeof *d);
  if (!d) return NULL;
  d->out = out;
  return d;
}

void nv_diag_destroy(nv_diag *d) {
  if (!d) return;
  for (int i = 0; i < d->nsrc; i++) {
    free(d->src[i].name);
    free(d->src[i].text);
  }
  free(d->src);
  nv_strmap_free(&d->index);
  free(d);
}

static nv_source *find_source(nv_diag *d, const char *name) {
  int i = nv_strmap_get(&d->index, name);
  return i >= 0 ? &d->src[i] : NULL;
}

static nv_source *add(nv_diag *d, const char *name) {
  nv_source *s = find_source(d, name);
  if (s) return s;
  if (d->nsrc == d->capsrc) {
    int cap = d->capsrc ? 2 * d->capsrc : 8;
    nv_source *n = nv_xrealloc(d->src, (size_t)cap * sizeof *n);
    if (!n) return NULL;
    d->src = n;
    d->capsrc = cap;
  }
  s = &d->src[d->nsrc];
  memset(s, 0, sizeof *s);
  s->name = nv_xstrdup(name);
  if (!s->name || nv_strmap_put(&d->index, s->name, d->nsrc)) {
    free(s->name);
    return NULL;
  }
  d->nsrc++;
  return s;
}

const char *nv_diag_add_source(nv_diag *d, const char *name, const char *text, size_t len) {
  nv_source *s = add(d, name);
  if (!s || !s->name) return name;
  free(s->text);
  s->text = nv_xmalloc(len + 1);
  if (s->text) {
    memcpy(s->text, text, len);
    s->text[len] = 0;
    s->len = len;
  }
  return s->name;
}

const char *nv_diag_intern(nv_diag *d, const char *name) {
  nv_source *s = add(d, name);
  return s && s->name ? s->name : name;
}

/* Prints the source line of loc and a caret under its column.  Control
 * characters are shown as '?', so binary input cannot garble the terminal. */
static void print_caret(nv_diag *d, nv_loc loc) {
  nv_source *s = loc.file ? find_source(d, loc.file) : NULL;
  if (!s || !s->text || loc.line <= 0) return;
  const char *p = s->text, *end = s->text + s->len;
  for (int line = 1; line < loc.line && p < end; p++)
    if (*p == '\n') line++;
  if (p >= end && loc.line > 1) return;
  const char *e = p;
  while (e < end && *e != '\n' && e - p < 200) e++;
  fputs("    ", d->out);
  for (const char *q = p; q < e; q++) {
    unsigned char c = (unsigned char)*q;
    fputc(c == '\t' ? ' ' : (c < 32 || c >= 127) ? '?' : c, d->out);
  }
  fputc('\n', d->out);
  fputs("    ", d->out);
  for (int i = 1; i < loc.col && i < 200; i++) fputc(' ', d->out);
  fputs("^\n", d->out);
}

static void emit(nv_diag *d, nv_loc loc, const char *kind, const char *fmt, va_list ap) {
  if (!d->out) return; /* a quiet context: counts errors, prints nothing */
  if (loc.file && loc.line > 0)
    fprintf(d->out, "%s:%d:%d: %s: ", loc.file, loc.line, loc.col, kind);
  else if (loc.file)
    fprintf(d->out, "%s: %s: ", loc.file, kind);
  else
    fprintf(d->out, "novac: %s: ", kind);
  vfprintf(d->out, fmt, ap);
  fputc('\n', d->out);
  print_caret(d, loc);
}

void nv_verror(nv_diag *d, nv_loc loc, const char *fmt, va_list ap) {
  d->nerr++;
  if (d->nerr > NV_MAX_ERRORS) return;
  emit(d, loc, "error", fmt, ap);
  if (d->nerr == NV_MAX_ERRORS && d->out) fprintf(d->out, "novac: too many errors, stopping\n");
}

void nv_error(nv_diag *d, nv_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nv_verror(d, loc, fmt, ap);
  va_end(ap);
}

void nv_note(nv_diag *d, nv_loc loc, const char *fmt, ...) {
  if (d->nerr > NV_MAX_ERRORS) return;
  va_list ap;
  va_start(ap, fmt);
  emit(d, loc, "note", fmt, ap);
  va_end(ap);
}

void nv_warning(nv_diag *d, nv_loc loc, const char *fmt, ...) {
  if (d->nerr > NV_MAX_ERRORS) return;
  va_list ap;
  va_start(ap, fmt);
  emit(d, loc, "warning", fmt, ap);
  va_end(ap);
}

void nv_error_plain(nv_diag *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nv_verror(d, (nv_loc){0}, fmt, ap);
  va_end(ap);
}

int nv_diag_count(const nv_diag *d) { return d->nerr; }

_Noreturn void nv_assert_fail(const char *what, const char *file, int line) {
  fprintf(stderr, "novac: internal error: %s:%d: assertion '%s' failed\n", file, line, what);
  abort();
}
