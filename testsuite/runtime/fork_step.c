/* fork_step.c: a step whose loops run on the thread pool keeps working in a
 * child made by fork() after the pool started (the child has none of the
 * parent's threads), with the same loss as the parent.
 *   fork_step STEP.so   (the MLP of examples/mlp.nova, batch 256)
 * Exit 0 and "fork: ok", or 1 with a message. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nova/step.h"

#define B 256

static float x[B][784];
static int64_t y[B];

typedef struct api {
  nova_status (*open)(nova_step **);
  nova_status (*bind)(nova_step *, const char *, nova_dtype, int, const int64_t *, const void *);
  nova_status (*run)(nova_step *);
  nova_status (*get)(nova_step *, const char *, const void **, nova_tensor_info *);
  void (*close)(nova_step *);
} api;

/* One run of a freshly opened step: its loss, or -1. */
static double loss_of(const api *a) {
  nova_step *s = NULL;
  int64_t xs[2] = {B, 784}, ys[1] = {B};
  const void *l;
  nova_tensor_info info;
  double r = -1;
  if (a->open(&s) == NOVA_OK && a->bind(s, "x", NOVA_DTYPE_F32, 2, xs, x) == NOVA_OK &&
      a->bind(s, "y", NOVA_DTYPE_I64, 1, ys, y) == NOVA_OK && a->run(s) == NOVA_OK &&
      a->get(s, "loss", &l, &info) == NOVA_OK)
    r = *(const float *)l;
  a->close(s);
  return r;
}

int main(int argc, char **argv) {
  void *so = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
  if (!so) {
    fprintf(stderr, "fork_step: %s\n", argc > 1 ? dlerror() : "usage: fork_step STEP.so");
    return 1;
  }
  api a;
  *(void **)&a.open = dlsym(so, "nova_step_open");
  *(void **)&a.bind = dlsym(so, "nova_step_bind");
  *(void **)&a.run = dlsym(so, "nova_step_run");
  *(void **)&a.get = dlsym(so, "nova_step_get");
  *(void **)&a.close = dlsym(so, "nova_step_close");
  if (!a.open || !a.bind || !a.run || !a.get || !a.close) return 1;
  for (int i = 0; i < B; i++) {
    y[i] = i % 10;
    for (int j = 0; j < 784; j++) x[i][j] = (float)((i * 31 + j * 17) % 97) / 97.0f - 0.5f;
  }
  double parent = loss_of(&a); /* starts the pool */
  if (parent < 0) return 1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20); /* a child waiting for threads it does not have would hang */
    double child = loss_of(&a);
    _exit(child == parent ? 0 : 2);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
    fprintf(stderr, "fork_step: the child failed (status %d)\n", st);
    return 1;
  }
  printf("fork: ok\n");
  dlclose(so);
  return 0;
}
