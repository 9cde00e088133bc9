/* json.c: cJSON through an allocator that remembers a failure.  cJSON's
 * builders (cJSON_AddNumberToObject, ...) return NULL on a failed allocation
 * and leave the tree without the item; its parser returns NULL for bad text
 * and for want of memory alike.  nv_json_oom_take tells the two apart: a
 * manifest missing a field is never written, a file is never called invalid
 * JSON when memory ran out. */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "util.h"

static int json_oom;

static void *json_malloc(size_t n) {
  void *p = malloc(n);
  if (!p && nv_oom_is_fatal()) nv_oom_die(n);
  if (!p) json_oom = 1;
  return p;
}

void nv_json_init(void) {
  cJSON_Hooks h = {json_malloc, free};
  cJSON_InitHooks(&h);
}

int nv_json_oom_take(void) {
  int r = json_oom;
  json_oom = 0;
  return r;
}
