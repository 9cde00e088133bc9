/* memreport.c: novac --memory-report=FILE, the step's memory over its
 * order of operations.
 *
 * From the memory plan (passes/memplan.c): at each top-level op of the
 * planned entry, the bytes the step holds, by what they hold
 * (cg_mem_at: parameters, optimizer state, inputs and outputs, gradients,
 * activations, workspace), with the peak marked and named by the op
 * there.  FILE ending in .json gets the numbers (the values at each op
 * where they change); any other name an SVG picture of stacked areas.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "memreport.h"

/* The step's memory by kind (cg_mem_kind) from op OP on, until the next point. */
typedef struct point {
  int op;
  int64_t v[CG_MEM_NKINDS];
} point;

typedef struct event {
  int op, kind;
  int64_t bytes;
} event;

static int by_op(const void *a, const void *b) {
  const event *x = a, *y = b;
  return (x->op > y->op) - (x->op < y->op);
}

/* The points where the memory changes, from one sweep over the live
 * ranges (each range adds its bytes at its first op and takes them back
 * after its last); their number, or -1. */
static int series(const nv_graph *g, const cg_plan *p, point **out) {
  event *ev = nv_xcalloc(2 * (size_t)p->n + 1, sizeof *ev);
  point *pt = nv_xcalloc(2 * (size_t)p->n + 2, sizeof *pt);
  if (!ev || !pt) {
    free(ev);
    free(pt);
    return -1;
  }
  for (int i = 0; i < p->n; i++) {
    int64_t b = (p->entries[i].bytes + 63) / 64 * 64;
    int k = cg_mem_kind_of(p->entries[i].kind);
    ev[2 * i] = (event){p->entries[i].first, k, b};
    ev[2 * i + 1] = (event){p->entries[i].last + 1, k, -b};
  }
  qsort(ev, 2 * (size_t)p->n, sizeof *ev, by_op);
  point cur = {0};
  cg_mem_at(g, p, -1, cur.v); /* what does not change: no intermediate yet */
  int k = 0;
  if (!p->n || ev[0].op > 0) pt[k++] = cur; /* from op 0 */
  for (int i = 0; i < 2 * p->n;) {
    int op = ev[i].op;
    for (; i < 2 * p->n && ev[i].op == op; i++) cur.v[ev[i].kind] += ev[i].bytes;
    cur.op = op;
    pt[k++] = cur;
  }
  free(ev);
  *out = pt;
  return k;
}

static double mib(int64_t b) { return (double)b / (1024.0 * 1024.0); }

static void xml_text(FILE *f, const char *s) {
  for (; *s; s++)
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else if (*s == '"') fputs("&quot;", f);
    else fputc(*s, f);
}

static int64_t total(const int64_t *v) {
  int64_t t = 0;
  for (int k = 0; k < CG_MEM_NKINDS; k++) t += v[k];
  return t;
}

/* The report as JSON (cJSON, like the manifest); NULL when out of memory. */
static char *report_json(const cg_plan *p, const point *pt, int npts, const int64_t *peak) {
  nv_json_oom_take();
  cJSON *root = cJSON_CreateObject();
  cJSON_AddNumberToObject(root, "ops", p->nops);
  cJSON_AddNumberToObject(root, "forward_end", p->forward_end);
  cJSON_AddNumberToObject(root, "arena_bytes", (double)p->arena_bytes);
  cJSON_AddNumberToObject(root, "lower_bound_bytes", (double)p->lower_bound);
  cJSON_AddItemToObject(root, "kinds", cJSON_CreateStringArray(cg_mem_kind_names, CG_MEM_NKINDS));
  cJSON *pk = cJSON_AddObjectToObject(root, "peak");
  cJSON_AddNumberToObject(pk, "op", p->peak_op);
  cJSON_AddStringToObject(pk, "at", p->peak_where);
  cJSON_AddNumberToObject(pk, "total_bytes", (double)total(peak));
  cJSON *pb = cJSON_AddArrayToObject(pk, "bytes");
  for (int k = 0; k < CG_MEM_NKINDS; k++) cJSON_AddItemToArray(pb, cJSON_CreateNumber((double)peak[k]));
  cJSON *ser = cJSON_AddArrayToObject(root, "series"); /* [op, bytes by kind...] where they change */
  for (int i = 0; i < npts; i++) {
    cJSON *row = cJSON_CreateArray();
    cJSON_AddItemToArray(row, cJSON_CreateNumber(pt[i].op));
    for (int k = 0; k < CG_MEM_NKINDS; k++) cJSON_AddItemToArray(row, cJSON_CreateNumber((double)pt[i].v[k]));
    cJSON_AddItemToArray(ser, row);
  }
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (nv_json_oom_take()) { /* an item is missing: no report rather than a wrong one */
    cJSON_free(text);
    return NULL;
  }
  return text;
}

#define W 960
#define H 460
#define L 70  /* margins */
#define R 240
#define T 40
#define B 50

static void write_svg(FILE *f, const nv_graph *g, const cg_plan *p, const point *pt, int npts,
                      const int64_t *peak) {
  static const char *const colour[CG_MEM_NKINDS] = {"#4e79a7", "#b07aa1", "#bab0ac", "#f28e2b", "#59a14f",
                                                     "#edc948"};
  static const char *const label[CG_MEM_NKINDS] = {"parameters", "optimizer state", "inputs and outputs",
                                                   "gradients", "activations", "workspace"};
  int64_t top = 1;
  for (int i = 0; i < npts; i++)
    if (total(pt[i].v) > top) top = total(pt[i].v);
  int nops = p->nops > 0 ? p->nops : 1;
  double xs = (double)(W - L - R) / nops, ys = (double)(H - T - B) / (double)top;
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
          "font-size=\"12\">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H, W, H);
  fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"15\">%s step: peak %.1f MiB (arena %.1f MiB, lower bound "
          "%.1f MiB)</text>\n", L, g->train ? "Training" : "Forward", mib(top), mib(p->arena_bytes),
          mib(p->lower_bound));
  /* stacked step areas, bottom up: kind k between the sum below it and that plus its bytes */
  for (int k = 0; k < CG_MEM_NKINDS; k++) {
    fprintf(f, "<path fill=\"%s\" d=\"", colour[k]);
    for (int dir = 0; dir < 2; dir++) /* the upper edge left to right, the lower one back */
      for (int j = 0; j < npts; j++) {
        int i = dir ? npts - 1 - j : j;
        int64_t below = 0;
        for (int q = 0; q < k; q++) below += pt[i].v[q];
        double x0 = L + xs * pt[i].op, x1 = L + xs * (i + 1 < npts ? pt[i + 1].op : nops);
        double y = H - B - ys * (double)(below + (dir ? 0 : pt[i].v[k]));
        if (dir) fprintf(f, "L%.1f %.1f L%.1f %.1f ", x1, y, x0, y);
        else fprintf(f, "%s%.1f %.1f L%.1f %.1f ", j ? "L" : "M", x0, y, x1, y);
      }
    fprintf(f, "Z\"/>\n");
  }
  /* axes, ticks in MiB, the end of the forward pass, the peak */
  fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
  fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L, H - B);
  for (int i = 0; i <= 4; i++) {
    double y = H - B - (H - T - B) * i / 4.0;
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.1f MiB</text>\n", L - 6, y + 4, mib(top) * i / 4);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">top-level operations of the step (%d), in order"
          "</text>\n", (L + W - R) / 2, H - 14, p->nops);
  if (p->forward_end >= 0) {
    double x = L + xs * p->forward_end;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#555\" stroke-dasharray=\"3,3\"/>\n"
            "<text x=\"%.1f\" y=\"%d\" fill=\"#555\">forward | backward</text>\n", x, T, x, H - B, x + 4, H - B - 6);
  }
  double px = L + xs * p->peak_op;
  fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#c00\" stroke-width=\"1.5\"/>\n", px, T,
          px, H - B);
  fprintf(f, "<text x=\"%.1f\" y=\"%d\" fill=\"#c00\" text-anchor=\"%s\">peak %.1f MiB at op %d: ",
          px > (L + W - R) / 2 ? px - 4 : px + 4, T + 12, px > (L + W - R) / 2 ? "end" : "start", mib(total(peak)),
          p->peak_op);
  xml_text(f, p->peak_where);
  fprintf(f, "</text>\n");
  for (int k = CG_MEM_NKINDS - 1, row = 0; k >= 0; k--, row++) { /* the legend, top kind first */
    int y = T + 20 + 22 * row;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/>\n<text x=\"%d\" y=\"%d\">%s: %.1f "
            "MiB</text>\n", W - R + 16, y, colour[k], W - R + 36, y + 12, label[k], mib(peak[k]));
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#555\">(at the peak)</text>\n</svg>\n", W - R + 16,
          T + 20 + 22 * CG_MEM_NKINDS + 12);
}

int nd_memory_report(nv_diag *d, const nv_graph *g, const cg_plan *p, const char *path) {
  if (!p || !p->planned) {
    nv_error_plain(d, "--memory-report: the step has no memory plan (intermediates on the heap: -O0, or a step "
                      "that cannot be planned); compile at -O1 or above");
    return -1;
  }
  point *pt = NULL;
  int npts = series(g, p, &pt);
  if (npts < 0) return -1;
  int64_t peak[CG_MEM_NKINDS];
  cg_mem_at(g, p, p->peak_op, peak);
  FILE *f = fopen(path, "w");
  if (!f) {
    nv_error_plain(d, "--memory-report: cannot write '%s': %s", path, strerror(errno));
    free(pt);
    return -1;
  }
  size_t n = strlen(path);
  if (n > 5 && !strcmp(path + n - 5, ".json")) {
    char *text = report_json(p, pt, npts, peak);
    if (text) fprintf(f, "%s\n", text);
    else nv_error_plain(d, "--memory-report: out of memory");
    cJSON_free(text);
    if (!text) {
      fclose(f);
      free(pt);
      return -1;
    }
  } else {
    write_svg(f, g, p, pt, npts, peak);
  }
  free(pt);
  if (ferror(f) | fclose(f)) {
    nv_error_plain(d, "--memory-report: writing '%s' failed", path);
    return -1;
  }
  return 0;
}
