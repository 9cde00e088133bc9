/* diag.h: diagnostics.  Library code records errors here and returns a
 * status; only the driver chooses an exit code.
 *
 * Messages look like chibicc's / clang's:
 *   mlp.nova:12:7: error: matmul: inner dimensions differ: [8,784] x [128,10]
 *       h = matmul(x, w2)
 *           ^
 */
#ifndef NOVA_DIAG_H
#define NOVA_DIAG_H

#include <stdarg.h>
#include <stdio.h>

typedef struct nv_loc {
  const char *file; /* borrowed from the diag context (interned); NULL = no location */
  int line, col;    /* 1-based; 0 = unknown */
} nv_loc;

typedef struct nv_diag nv_diag;

/* OUT NULL: a quiet context that counts errors and prints nothing. */
nv_diag *nv_diag_create(FILE *out);
void nv_diag_destroy(nv_diag *d);
/* Registers a source buffer so that errors at its locations print the line
 * and a caret.  Copies name and text; returns the interned name. */
const char *nv_diag_add_source(nv_diag *d, const char *name, const char *text, size_t len);
/* Interns a name without source text (e.g. an .onnx file). */
const char *nv_diag_intern(nv_diag *d, const char *name);

void nv_error(nv_diag *d, nv_loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void nv_verror(nv_diag *d, nv_loc loc, const char *fmt, va_list ap);
void nv_note(nv_diag *d, nv_loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Does not count as an error (the exit status stays 0). */
void nv_warning(nv_diag *d, nv_loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An error without a location: "novac: error: ...". */
void nv_error_plain(nv_diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int nv_diag_count(const nv_diag *d);
/* Stop recording after this many errors (the parser bails out). */
#define NV_MAX_ERRORS 20

#define NV_ASSERT(c) \
  do { if (!(c)) nv_assert_fail(#c, __FILE__, __LINE__); } while (0)
_Noreturn void nv_assert_fail(const char *what, const char *file, int line);

#endif
