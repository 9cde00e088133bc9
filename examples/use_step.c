/* use_step.c: calling a step.so from C through nova/step.h.
 *
 *   novac examples/mlp.nova --dim=batch=8 -o mlp.so
 *   cc -Iinclude examples/use_step.c -ldl -o use_step && ./use_step ./mlp.so
 */
#include <dlfcn.h>
#include <stdio.h>

#include "nova/step.h"

int main(int argc, char **argv) {
  void *so = dlopen(argc > 1 ? argv[1] : "./mlp.so", RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  /* each step.so carries its own copy of the ABI functions */
  nova_status (*open)(nova_step **) = (nova_status(*)(nova_step **))dlsym(so, "nova_step_open");
  nova_status (*bind)(nova_step *, const char *, nova_dtype, int, const int64_t *, const void *) =
      (nova_status(*)(nova_step *, const char *, nova_dtype, int, const int64_t *, const void *))dlsym(so, "nova_step_bind");
  nova_status (*run)(nova_step *) = (nova_status(*)(nova_step *))dlsym(so, "nova_step_run");
  nova_status (*get)(nova_step *, const char *, const void **, nova_tensor_info *) =
      (nova_status(*)(nova_step *, const char *, const void **, nova_tensor_info *))dlsym(so, "nova_step_get");
  const char *(*error)(const nova_step *) = (const char *(*)(const nova_step *))dlsym(so, "nova_step_error");
  void (*close)(nova_step *) = (void (*)(nova_step *))dlsym(so, "nova_step_close");
  if (!open || !bind || !run || !get || !error || !close) return 1;

  static float x[8][784];
  int64_t y[8], xs[2] = {8, 784}, ys[1] = {8};
  for (int i = 0; i < 8; i++) {
    y[i] = i;
    for (int j = 0; j < 784; j++) x[i][j] = (float)((i * 31 + j * 17) % 97) / 97.0f - 0.5f;
  }
  nova_step *s = NULL;
  if (open(&s) != NOVA_OK || bind(s, "x", NOVA_DTYPE_F32, 2, xs, x) != NOVA_OK ||
      bind(s, "y", NOVA_DTYPE_I64, 1, ys, y) != NOVA_OK || run(s) != NOVA_OK) {
    fprintf(stderr, "step: %s\n", s ? error(s) : "cannot open");
    close(s);
    return 1;
  }
  const void *loss;
  nova_tensor_info info;
  if (get(s, "loss", &loss, &info) == NOVA_OK) printf("loss = %f\n", *(const float *)loss);
  /* a mistake is reported, not a crash: */
  int64_t bad[2] = {4, 784};
  if (bind(s, "x", NOVA_DTYPE_F32, 2, bad, x) != NOVA_OK) printf("error: %s\n", error(s));
  close(s);
  dlclose(so);
  return 0;
}
