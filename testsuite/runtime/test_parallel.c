/* test_parallel.c: nova_rt_parallel_for (runtime/rt_parallel.c) runs every
 * iteration of a loop exactly once, for many loops in a row (the workers
 * between spinning and sleeping), odd ranges and steps, more shares than
 * iterations, and from two threads at once (one of them runs alone).
 * Exit 0 and "parallel: ok", or 1 with a message.  Run with
 * NOVA_NUM_THREADS=3 by testsuite/runtime/run.sh. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void nova_rt_parallel_for(void (*task)(void **, int64_t, int64_t), void **argv, int64_t lb, int64_t ub, int64_t step);

#define N 4096

typedef struct loop {
  unsigned char hits[N];
  int64_t step;
} loop;

static void task(void **argv, int64_t lo, int64_t hi) {
  loop *l = argv[0];
  for (int64_t i = lo; i < hi; i += l->step) l->hits[i]++;
}

/* Runs the loop lb..ub by step and checks each iteration ran once. */
static int check(int64_t lb, int64_t ub, int64_t step) {
  static __thread loop l;
  memset(l.hits, 0, sizeof l.hits);
  l.step = step;
  void *argv[1] = {&l};
  nova_rt_parallel_for(task, argv, lb, ub, step);
  for (int64_t i = 0; i < N; i++) {
    int want = i >= lb && i < ub && (i - lb) % step == 0;
    if (l.hits[i] != want) {
      fprintf(stderr, "loop %lld..%lld step %lld: iteration %lld ran %d times\n", (long long)lb, (long long)ub,
              (long long)step, (long long)i, l.hits[i]);
      return 1;
    }
  }
  return 0;
}

static void *many(void *arg) {
  (void)arg;
  int bad = 0;
  for (int r = 0; r < 400 && !bad; r++) {
    bad |= check(0, N, 1);
    bad |= check(3, 1000 + r, 7);
    bad |= check(5, 7, 1);       /* fewer iterations than threads */
    bad |= check(10, 11, 1);     /* one iteration */
    bad |= check(20, 20, 1);     /* none */
    if (r % 100 == 0) usleep(2000); /* let the workers fall asleep */
  }
  return (void *)(intptr_t)bad;
}

int main(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, many, NULL)) return 1;
  void *a = many(NULL), *b = NULL;
  pthread_join(t, &b);
  if (a || b) return 1;
  printf("parallel: ok\n");
  return 0;
}
