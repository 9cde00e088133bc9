/* memreport.h: novac --memory-report=FILE (memreport.c). */
#ifndef NOVA_MEMREPORT_H
#define NOVA_MEMREPORT_H

#include "../passes/passes.h"

/* Writes the memory of the planned step of G (plan P) over its op order
 * to PATH: JSON when PATH ends in .json, else an SVG picture.  0, or -1
 * after a diagnostic (no plan, a file that cannot be written). */
int nd_memory_report(nv_diag *d, const nv_graph *g, const cg_plan *p, const char *path);

#endif
