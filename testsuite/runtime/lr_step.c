/* lr_step.c: a training step compiled by novac refuses a learning rate
 * that is NaN, infinite or negative through the ABI (NOVA_ERR_NOT_FINITE,
 * with a message), and takes a finite one.  Prints "lr: ok" on success.
 *
 *   lr_step STEP.so
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nova/step.h"

typedef nova_status (*open_fn)(nova_step **);
typedef void (*close_fn)(nova_step *);
typedef nova_status (*bind_fn)(nova_step *, const char *, nova_dtype, int, const int64_t *, const void *);
typedef const char *(*error_fn)(const nova_step *);

int main(int argc, char **argv) {
  void *h = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
  if (!h) return fprintf(stderr, "lr: cannot load the step: %s\n", argc > 1 ? dlerror() : "no path"), 1;
  open_fn op;
  close_fn cl;
  bind_fn bi;
  error_fn er;
  *(void **)&op = dlsym(h, "nova_step_open");
  *(void **)&cl = dlsym(h, "nova_step_close");
  *(void **)&bi = dlsym(h, "nova_step_bind");
  *(void **)&er = dlsym(h, "nova_step_error");
  nova_step *s = NULL;
  if (!op || !cl || !bi || !er || op(&s) != NOVA_OK) return fprintf(stderr, "lr: cannot open the step\n"), 1;
  const float bad[] = {NAN, INFINITY, -INFINITY, -0.5f};
  int fails = 0;
  for (int i = 0; i < 4; i++) {
    nova_status st = bi(s, "lr", NOVA_DTYPE_F32, 0, NULL, &bad[i]);
    if (st != NOVA_ERR_NOT_FINITE || !strstr(er(s), "learning rate must be a finite number >= 0"))
      fails++, fprintf(stderr, "lr: %g gave status %d, '%s'\n", (double)bad[i], (int)st, er(s));
  }
  const float good = 0.01f;
  if (bi(s, "lr", NOVA_DTYPE_F32, 0, NULL, &good) != NOVA_OK) fails++, fprintf(stderr, "lr: 0.01: %s\n", er(s));
  cl(s);
  dlclose(h);
  if (!fails) printf("lr: ok\n");
  return fails != 0;
}
