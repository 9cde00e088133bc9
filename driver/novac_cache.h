/* novac_cache.h: the compile cache (--cache-dir, NOVAC_CACHE_DIR;
 * novac_cache.c). */
#ifndef NOVA_NOVAC_CACHE_H
#define NOVA_NOVAC_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "../configurator/device.h"
#include "../frontend/graph.h"
#include "../support/diag.h"

/* What a cached step depends on, each part hashed apart (so that a miss
 * can name the part that differs from the closest entry). */
enum { NC_NOVAC, NC_GRAPH, NC_DATA, NC_OPTIONS, NC_DEVICE, NC_POLICY, NC_PARTS };

typedef struct nc_key {
  uint64_t part[NC_PARTS];
  char hex[17];  /* the key: a hash of the parts */
} nc_key;

typedef struct nc_cache {
  const char *dir;     /* NULL: no cache */
  int64_t max_bytes;   /* --cache-max (0: no cap) */
  bool explain;        /* --explain-cache */
  nv_diag *d;
  bool warned;         /* a write failed once: said once */
} nc_cache;

/* The key of the step of G (as loaded, before any pass) compiled with
 * OPTIONS (the flags that change the output, canonical), for DEV (the cpu
 * target: with the host CPU's name and features), with the precision
 * policy file POLICY (or NULL). */
void nc_key_make(nc_key *k, const nv_graph *g, const char *options, const cfg_device *dev, bool cuda,
                 const char *cpu, const char *policy);

/* A hit: the entry's step.so copied to SO and its manifest to MANIFEST
 * (its "source" set to SOURCE): 1; also where only the initializer data
 * differ from an entry's, G's (the graph K was made of) put into its step
 * (and stored under K).  A miss: 0 (a corrupt entry is removed,
 * with a warning).  -1 after a diagnostic (the outputs could not be
 * written). */
int nc_lookup(nc_cache *c, const nc_key *k, const nv_graph *g, const char *so, const char *manifest,
              const char *source);

/* Stores SO and MANIFEST as K's entry, with where the step holds the
 * initial values of G (the graph it was built from, after the passes; may
 * be NULL), then trims the cache to its cap (least recently used first).  Failures are warnings: the compile has
 * succeeded. */
void nc_store(nc_cache *c, const nc_key *k, const char *so, const char *manifest, const nv_graph *g);

#endif
