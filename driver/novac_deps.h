/* novac_deps.h: make dependency rules (-M, -MM, -MD, -MMD, -MF, -MT, -MQ,
 * -MP), with gcc's meanings (novac_deps.c). */
#ifndef NOVA_NOVAC_DEPS_H
#define NOVA_NOVAC_DEPS_H

#include <stdbool.h>

#include "../support/diag.h"
#include "../support/util.h"

typedef struct nd_deps {
  bool only;          /* -M / -MM: write the rule instead of compiling */
  bool with_compile;  /* -MD / -MMD: compile, and write the rule beside the output */
  bool user_only;     /* -MM / -MMD: leave out novac's own files (its runtime library and headers) */
  bool phony;         /* -MP: a phony target for each dependency but the input */
  const char *file;   /* -MF FILE */
  nv_sbuf targets;    /* -MT / -MQ targets, space separated (-MQ's quoted for make) */
} nd_deps;

/* ARGV[*I] when it is one of the dependency options (with its argument,
 * *I then past it): 1; 0 when it is not one; -1 after a usage message. */
int nd_deps_arg(int argc, char **argv, int *i, nd_deps *o);

/* Writes the rule: TARGET (or the -MT/-MQ targets) depending on INPUT, the
 * files the compile read (nv_deps), the EXTRA files (NULL entries skipped)
 * and, without user_only, the runtime library and headers in RTDIR.  To
 * -MF's file, else to standard output (-M) or OUTPUT's name with .d for its
 * suffix (-MD).  With -MD the rule is followed by the command line (ARGV),
 * as `novac_cmd_TARGET := ...`, for a Makefile to compare with its own
 * (examples/Makefile).  0, or -1 with a diagnostic. */
int nd_deps_write(nv_diag *d, const nd_deps *o, const char *target, const char *input, const char *const *extra,
                  int nextra, const char *rtdir, int argc, char **argv);

#endif
