/* novac_deps.c: make dependency rules, as gcc writes them.
 *
 *   step.so: model.onnx model.onnx.data device.json \
 *    /usr/local/lib/novac/libnovart.a ...
 *   novac_cmd_step.so := novac model.onnx --train -MMD -MP -o step.so
 *
 *   model.onnx.data:
 *   ...
 *
 * The dependencies are the input, the files the compile read besides it
 * (an ONNX model's external data, a .nova model's parameter files: noted
 * by the frontends with nv_dep_note), a --device file and a
 * --precision-policy file; -M and -MD add novac's runtime library and
 * headers, which every step.so is built from (-MM and -MMD leave them
 * out).  Names are quoted for make: a space as "\ ", '#' as "\#", '$' as
 * "$$".  The novac_cmd_ line (-MD and -MMD) records the command line, so
 * that a Makefile can rebuild a step whose flags changed (as the Linux
 * kernel's .cmd files do; examples/Makefile shows the rule). */
#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "novac_deps.h"

static int usage_error(const char *what) {
  fprintf(stderr, "novac: %s\nTry 'novac --help'.\n", what);
  return -1;
}

/* NAME quoted for a make rule into B. */
static void quote(nv_sbuf *b, const char *name) {
  for (const char *p = name; *p; p++) {
    if (*p == ' ' || *p == '\t' || *p == '#') nv_sb_printf(b, "\\");
    if (*p == '$') nv_sb_printf(b, "$");
    nv_sb_printf(b, "%c", *p);
  }
}

int nd_deps_arg(int argc, char **argv, int *i, nd_deps *o) {
  const char *a = argv[*i];
  if (a[0] != '-' || a[1] != 'M') return 0;
  if (!strcmp(a, "-M") || !strcmp(a, "-MM")) {
    o->only = true;
    o->user_only = a[2] == 'M';
  } else if (!strcmp(a, "-MD") || !strcmp(a, "-MMD")) {
    o->with_compile = true;
    o->user_only = a[2] == 'M';
  } else if (!strcmp(a, "-MP")) {
    o->phony = true;
  } else if (!strcmp(a, "-MF") || !strcmp(a, "-MT") || !strcmp(a, "-MQ")) {
    if (*i + 1 >= argc || !argv[*i + 1][0]) {
      char m[64];
      snprintf(m, sizeof m, "%s needs a %s", a, a[2] == 'F' ? "file name" : "target");
      return usage_error(m);
    }
    const char *v = argv[++*i];
    if (a[2] == 'F') o->file = v;
    else {
      if (o->targets.s) nv_sb_printf(&o->targets, " ");
      if (a[2] == 'Q') quote(&o->targets, v);
      else nv_sb_printf(&o->targets, "%s", v);
    }
  } else {
    return 0;
  }
  return 1;
}

/* Appends " NAME" (quoted) to the rule in B, breaking lines as gcc does. */
static void add_dep(nv_sbuf *b, size_t *col, const char *name) {
  nv_sbuf q = {0};
  quote(&q, name);
  size_t n = q.s ? strlen(q.s) : 0;
  if (*col + 1 + n > 78 && *col > 1) {
    nv_sb_printf(b, " \\\n ");
    *col = 1;
  }
  nv_sb_printf(b, " %s", q.s ? q.s : "");
  *col += 1 + n;
  nv_sb_free(&q);
}

/* The names of the runtime's files under RTDIR: libnovart.a and the
 * headers of include/ and include/nova/ (sorted, for a stable rule). */
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void runtime_files(const char *rtdir, char ***out, int *n) {
  *out = NULL, *n = 0;
  char path[4200];
  const char *dirs[2] = {"include", "include/nova"};
  char **v = nv_xmalloc(sizeof *v * 64);
  if (!v) return;
  snprintf(path, sizeof path, "%s/libnovart.a", rtdir);
  v[(*n)++] = nv_xstrdup(path);
  for (int k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "%s/%s", rtdir, dirs[k]);
    DIR *dir = opendir(path);
    int first = *n;
    for (struct dirent *e; dir && (e = readdir(dir)) && *n < 64;) {
      size_t len = strlen(e->d_name);
      if (len < 3 || strcmp(e->d_name + len - 2, ".h")) continue;
      char f[4400];
      snprintf(f, sizeof f, "%s/%s", path, e->d_name);
      v[(*n)++] = nv_xstrdup(f);
    }
    if (dir) closedir(dir);
    qsort(v + first, (size_t)(*n - first), sizeof *v, cmp_str);
  }
  *out = v;
}

/* OUTPUT with its suffix (after the last '.' of its last component) made .d. */
static char *dep_file_of(const char *output) {
  size_t n = strlen(output);
  char *f = nv_xmalloc(n + 3);
  if (!f) return NULL;
  memcpy(f, output, n + 1);
  char *slash = strrchr(f, '/'), *dot = strrchr(f, '.');
  if (dot && dot > (slash ? slash + 1 : f)) *dot = 0;
  strcat(f, ".d");
  return f;
}

/* Whether NAME can follow novac_cmd_ in a make variable's name. */
static bool variable_safe(const char *name) {
  for (const char *p = name; *p; p++)
    if (*p == ' ' || *p == '\t' || *p == ':' || *p == '#' || *p == '=' || *p == '$' || *p == '\\' || *p == '\n')
      return false;
  return *name != 0;
}

int nd_deps_write(nv_diag *d, const nd_deps *o, const char *target, const char *input, const char *const *extra,
                  int nextra, const char *rtdir, int argc, char **argv) {
  nv_sbuf b = {0};
  const char *targets = o->targets.s;
  nv_sbuf qt = {0};
  if (!targets) {
    quote(&qt, target);
    targets = qt.s ? qt.s : "";
  }
  nv_sb_printf(&b, "%s:", targets);
  size_t col = strlen(targets) + 1;
  /* the files in order, each once */
  int nd = 0;
  const char *const *deps = nv_deps(&nd);
  char **rt = NULL;
  int nrt = 0;
  char real[PATH_MAX];
  if (!o->user_only) runtime_files(realpath(rtdir, real) ? real : rtdir, &rt, &nrt);
  int total = 1 + nd + nextra + nrt, n = 0;
  const char **all = nv_xmalloc(sizeof *all * (size_t)total);
  if (!all) {
    nv_sb_free(&b), nv_sb_free(&qt);
    return -1;
  }
  all[n++] = input;
  for (int i = 0; i < nd + nextra + nrt; i++) {
    const char *f = i < nd ? deps[i] : i < nd + nextra ? extra[i - nd] : rt[i - nd - nextra];
    if (!f) continue;
    bool seen = false;
    for (int k = 0; k < n && !seen; k++) seen = !strcmp(all[k], f);
    if (!seen) all[n++] = f;
  }
  for (int i = 0; i < n; i++) add_dep(&b, &col, all[i]);
  nv_sb_printf(&b, "\n");
  /* the command line, for a Makefile to compare with its own */
  char *first = nv_xstrdup(targets);
  if (first) {
    char *sp = first;
    while (*sp && !(*sp == ' ' && (sp == first || sp[-1] != '\\'))) sp++;
    *sp = 0;
  }
  if (o->with_compile && first && variable_safe(first)) {
    nv_sb_printf(&b, "novac_cmd_%s :=", first);
    for (int i = 0; i < argc; i++) {
      nv_sb_printf(&b, " ");
      for (const char *p = argv[i]; *p; p++) {
        if (*p == '$') nv_sb_printf(&b, "$");
        if (*p == '#') nv_sb_printf(&b, "\\");
        nv_sb_printf(&b, "%c", *p == '\n' ? ' ' : *p);
      }
    }
    nv_sb_printf(&b, "\n");
  }
  free(first);
  if (o->phony)
    for (int i = 1; i < n; i++) {
      nv_sb_printf(&b, "\n");
      nv_sbuf q = {0};
      quote(&q, all[i]);
      nv_sb_printf(&b, "%s:\n", q.s ? q.s : "");
      nv_sb_free(&q);
    }
  free(all);
  for (int i = 0; i < nrt; i++) free(rt[i]);
  free(rt);
  nv_sb_free(&qt);
  /* where: -MF, else stdout (-M) or OUTPUT.d (-MD) */
  char *derived = NULL;
  const char *path = o->file ? o->file : o->only ? "-" : (derived = dep_file_of(target));
  int rc = -1;
  nv_out out;
  if (b.oom || !path) {
    nv_error_plain(d, "out of memory writing the dependency rule");
  } else if (nv_out_open(&out, path, 0)) {
    nv_error_plain(d, "writing %s: %s", path, strerror(errno));
  } else {
    fputs(b.s, out.f);
    rc = nv_out_close(&out);
    if (rc) nv_error_plain(d, "writing %s: %s", path, strerror(errno));
  }
  free(derived);
  nv_sb_free(&b);
  return rc;
}
