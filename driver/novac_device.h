/* novac_device.h: device models for the targets, the device-memory check
 * and --explain-config (novac_device.c). */
#ifndef NOVA_NOVAC_DEVICE_H
#define NOVA_NOVAC_DEVICE_H

#include <stdio.h>

#include "../codegen/codegen.h"
#include "../configurator/device.h"

/* --device=NAME|FILE|auto (NULL: the default, host for the cpu target, auto
 * for cuda) -> *out; a GPU model for cuda, the host or a CPU file for the
 * cpu.  0, or -1 with a diagnostic (unknown names list the known ones). */
int nd_device(nv_diag *d, bool cuda, const char *dev, cfg_device *out);
/* Whether --device=DEV names a JSON device file (not host, auto or a
 * built-in model). */
bool nd_device_is_file(const char *dev);

/* 0 if the step's tensors and intermediates fit DEV's memory (or it is
 * unknown); else -1 with a diagnostic giving both sizes. */
int nd_check_memory(nv_diag *d, const cfg_device *dev, const nv_graph *g, const cg_gpu *gpu);

/* --explain-config: each kernel's schedule and the limit that decided it
 * (GPU NULL: the cpu target), and the time the configurator took. */
void nd_explain(FILE *f, const cfg_device *dev, const nv_graph *g, const cg_gpu *gpu);

#endif
