/* nonfinite_step.c: a training step compiled by novac from nonfinite.nova
 * (x f32[2,3], t f32[2,2], loss = mean |x w + b - t|) skips a step whose
 * loss or gradients are not finite: nova_step_run returns
 * NOVA_ERR_NONFINITE with a message naming the loss or the gradients, the
 * loss holds what was computed, and every param, opt_state and buffer is
 * bit for bit what it was; the next good batch then gives exactly what a
 * second step that never saw the bad batches gives.  Three bad batches:
 * a NaN in x (NaN loss), x = 1e30 (the squares overflow: loss +inf), and
 * x = 0 with t = b (d = 0 exactly: loss 0, gradient of sqrt at 0 NaN).
 * Prints "nonfinite: ok" on success.
 *
 *   nonfinite_step STEP.so
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nova/step.h"

typedef struct api {
  nova_status (*open)(nova_step **);
  void (*close)(nova_step *);
  nova_status (*bind)(nova_step *, const char *, nova_dtype, int, const int64_t *, const void *);
  nova_status (*run)(nova_step *);
  nova_status (*get)(nova_step *, const char *, const void **, nova_tensor_info *);
  int (*num)(const nova_step *);
  nova_status (*tensor)(const nova_step *, int, nova_tensor_info *);
  const char *(*error)(const nova_step *);
} api;

static int fails;
#define CHECK(c, ...) ((c) ? (void)0 : (void)(fails++, fprintf(stderr, "nonfinite: " __VA_ARGS__), fputc('\n', stderr)))

static const int64_t xs[2] = {2, 3}, ts[2] = {2, 2};

static nova_status batch(const api *A, nova_step *s, const float *x, const float *t) {
  nova_status st = A->bind(s, "x", NOVA_DTYPE_F32, 2, xs, x);
  return st == NOVA_OK ? A->bind(s, "t", NOVA_DTYPE_F32, 2, ts, t) : st;
}

static int is_state(nova_role r) { return r == NOVA_ROLE_PARAM || r == NOVA_ROLE_OPT_STATE || r == NOVA_ROLE_BUFFER; }

/* A copy of every param, opt_state and buffer of S, one after another. */
static unsigned char *snapshot(const api *A, nova_step *s, size_t *size) {
  size_t n = 0;
  nova_tensor_info in;
  for (int i = 0; i < A->num(s); i++)
    if (A->tensor(s, i, &in) == NOVA_OK && is_state(in.role)) n += in.nbytes;
  unsigned char *buf = malloc(n + 1), *p = buf;
  for (int i = 0; buf && i < A->num(s); i++) {
    const void *d;
    if (A->tensor(s, i, &in) != NOVA_OK || !is_state(in.role)) continue;
    if (A->get(s, in.name, &d, &in) != NOVA_OK) return free(buf), NULL;
    memcpy(p, d, in.nbytes);
    p += in.nbytes;
  }
  *size = n;
  return buf;
}

/* Whether S's state is bit for bit SNAP (of SIZE bytes); names the first
 * tensor that differs. */
static int same_state(const api *A, nova_step *s, const unsigned char *snap, size_t size, const char *what) {
  size_t n;
  unsigned char *now = snapshot(A, s, &n);
  int ok = now && n == size && !memcmp(now, snap, n);
  if (!ok && now && n == size) {
    size_t off = 0;
    nova_tensor_info in;
    for (int i = 0; i < A->num(s); i++)
      if (A->tensor(s, i, &in) == NOVA_OK && is_state(in.role)) {
        if (memcmp(now + off, snap + off, in.nbytes)) {
          fprintf(stderr, "nonfinite: %s: '%s' changed\n", what, in.name);
          break;
        }
        off += in.nbytes;
      }
  }
  free(now);
  return ok;
}

static float value(const api *A, nova_step *s, const char *name, int k) {
  const void *d = NULL;
  nova_tensor_info in;
  if (A->get(s, name, &d, &in) != NOVA_OK) return NAN;
  return ((const float *)d)[k];
}

int main(int argc, char **argv) {
  void *h = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
  if (!h) return fprintf(stderr, "nonfinite: cannot load the step: %s\n", argc > 1 ? dlerror() : "no path"), 1;
  api A;
  *(void **)&A.open = dlsym(h, "nova_step_open");
  *(void **)&A.close = dlsym(h, "nova_step_close");
  *(void **)&A.bind = dlsym(h, "nova_step_bind");
  *(void **)&A.run = dlsym(h, "nova_step_run");
  *(void **)&A.get = dlsym(h, "nova_step_get");
  *(void **)&A.num = dlsym(h, "nova_step_num_tensors");
  *(void **)&A.tensor = dlsym(h, "nova_step_tensor");
  *(void **)&A.error = dlsym(h, "nova_step_error");
  nova_step *s = NULL, *ref = NULL; /* s sees the bad batches, ref never does */
  if (!A.open || !A.close || !A.bind || !A.run || !A.get || !A.num || !A.tensor || !A.error || A.open(&s) != NOVA_OK ||
      A.open(&ref) != NOVA_OK)
    return fprintf(stderr, "nonfinite: cannot open the step\n"), 1;
  int flag = -1;
  nova_tensor_info in;
  for (int i = 0; i < A.num(s); i++)
    if (A.tensor(s, i, &in) == NOVA_OK && !strcmp(in.name, "nonfinite")) flag = i;
  CHECK(flag >= 0 && A.tensor(s, flag, &in) == NOVA_OK && in.role == NOVA_ROLE_STATUS && in.dtype == NOVA_DTYPE_BOOL &&
            in.rank == 0, "no bool scalar 'nonfinite' of role status");

  const float x1[6] = {1, 2, -1, 0.5f, -2, 3}, t1[4] = {1, -1, 0.25f, 2};
  const float x2[6] = {-1, 0.5f, 2, 1, 1, -3}, t2[4] = {0, 1, -2, 0.5f};
  CHECK(batch(&A, s, x1, t1) == NOVA_OK && A.run(s) == NOVA_OK, "first good step: %s", A.error(s));
  CHECK(batch(&A, ref, x1, t1) == NOVA_OK && A.run(ref) == NOVA_OK, "first good step (reference): %s", A.error(ref));
  size_t size;
  unsigned char *snap = snapshot(&A, s, &size);
  CHECK(snap != NULL, "cannot read the state");

  float xn[6], xi[6], x0[6] = {0}, tb[4];
  memcpy(xn, x1, sizeof xn);
  xn[4] = NAN;
  for (int i = 0; i < 6; i++) xi[i] = 1e30f;
  for (int i = 0; i < 4; i++) tb[i] = value(&A, s, "b", i % 2); /* x = 0: d = b - t = 0 */
  struct {
    const char *what, *says;
    const float *x, *t;
    int loss_nan, loss_inf;
  } bad[] = {
      {"a NaN in the batch", "non-finite loss", xn, t1, 1, 0},
      {"a loss that overflows", "non-finite loss", xi, t1, 0, 1},
      {"gradients that are NaN", "non-finite gradients", x0, tb, 0, 0},
  };
  for (int k = 0; snap && k < 3; k++) {
    CHECK(batch(&A, s, bad[k].x, bad[k].t) == NOVA_OK, "%s: bind: %s", bad[k].what, A.error(s));
    nova_status st = A.run(s);
    CHECK(st == NOVA_ERR_NONFINITE, "%s: status %d, not NOVA_ERR_NONFINITE (%s)", bad[k].what, (int)st, A.error(s));
    CHECK(strstr(A.error(s), bad[k].says) && strstr(A.error(s), "unchanged"), "%s: message '%s' does not say '%s'",
          bad[k].what, A.error(s), bad[k].says);
    float loss = value(&A, s, "loss", 0);
    CHECK(bad[k].loss_nan ? isnan(loss) : bad[k].loss_inf ? isinf(loss) && loss > 0 : loss == 0,
          "%s: the loss is %g", bad[k].what, (double)loss);
    const void *f;
    CHECK(A.get(s, "nonfinite", &f, &in) == NOVA_OK && *(const unsigned char *)f == 1, "%s: the flag is not set",
          bad[k].what);
    CHECK(same_state(&A, s, snap, size, bad[k].what), "%s: the state changed", bad[k].what);
  }
  /* the step after: as if the bad batches never came */
  CHECK(batch(&A, s, x2, t2) == NOVA_OK && A.run(s) == NOVA_OK, "good step after the bad ones: %s", A.error(s));
  CHECK(batch(&A, ref, x2, t2) == NOVA_OK && A.run(ref) == NOVA_OK, "second good step (reference): %s", A.error(ref));
  const void *f;
  CHECK(A.get(s, "nonfinite", &f, &in) == NOVA_OK && *(const unsigned char *)f == 0, "the flag is set after a good step");
  size_t rsize;
  unsigned char *rsnap = snapshot(&A, ref, &rsize);
  CHECK(rsnap && same_state(&A, s, rsnap, rsize, "after the bad batches"),
        "the state differs from a run that never saw the bad batches");
  int adam = 0;
  for (int i = 0; i < A.num(s); i++)
    if (A.tensor(s, i, &in) == NOVA_OK && !strcmp(in.name, "adam.step")) adam = 1;
  if (adam) CHECK(value(&A, s, "adam.step", 0) == 2.0f, "adam.step is %g after two good steps", (double)value(&A, s, "adam.step", 0));
  free(snap);
  free(rsnap);
  A.close(s);
  A.close(ref);
  dlclose(h);
  if (!fails) printf("nonfinite: ok\n");
  return fails != 0;
}
