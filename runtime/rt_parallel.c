/* rt_parallel.c: the threads a step's parallel loops are shared out on.
 *
 * novac (codegen/parallel.c) turns the outermost loop of a large parallel
 * nest into nova_rt_parallel_for(task, argv, lb, ub, step): the iterations
 * lb, lb+step, ... < ub are split into one contiguous share per thread;
 * the calling thread runs the first, the pool's workers the others, and
 * the call returns when all are done.  The iterations write disjoint data,
 * so the result does not depend on the number of threads.
 *
 * Threads: NOVA_NUM_THREADS, else the processors this process may run on
 * (sched_getaffinity: `taskset -c 0` gives one), at most RT_MAX_THREADS.
 * The pool starts at the first parallel loop; workers spin briefly for the
 * next loop of a step, then sleep on a condition variable.  A second thread
 * running a step while the pool is busy runs its loops alone.  The pool is
 * stopped and joined when the step.so is unloaded.  A child made by fork()
 * has none of its parent's workers: it starts a pool of its own at its
 * first parallel loop (pthread_atfork).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "rt_trace.h"

#define RT_MAX_THREADS 64
#define RT_SPIN 20000 /* polls before a worker sleeps */

typedef void (*rt_task)(void **argv, int64_t lo, int64_t hi);
void nova_rt_parallel_for(rt_task task, void **argv, int64_t lb, int64_t ub, int64_t step);
int nova_rt_threads(void);

static struct {
  atomic_bool ready;           /* the pool of this process has started */
  int nthreads;                /* including the caller */
  pthread_t tid[RT_MAX_THREADS];
  int started;                 /* workers running */
  pthread_mutex_t busy;        /* held by the thread whose loop the pool runs */
  pthread_mutex_t mu;
  pthread_cond_t wake;
  atomic_uint_fast64_t gen;    /* bumped for each loop (and to stop) */
  atomic_int pending;          /* workers' shares not finished */
  atomic_bool stop;
  /* the loop being run */
  rt_task task;
  void **argv;
  int64_t lb, ub, step, per;   /* per: iterations per share */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void run_share(int k) {
  int64_t lo = pool.lb + (int64_t)k * pool.per * pool.step;
  int64_t hi = lo + pool.per * pool.step;
  if (hi > pool.ub) hi = pool.ub;
  if (lo < hi) pool.task(pool.argv, lo, hi);
}

static void *worker(void *arg) {
  int k = (int)(intptr_t)arg;
  uint_fast64_t seen = 0;
  for (;;) {
    uint_fast64_t g;
    int spins = 0;
    while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen) {
      if (++spins < RT_SPIN) {
        relax();
        continue;
      }
      pthread_mutex_lock(&pool.mu);
      while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen)
        pthread_cond_wait(&pool.wake, &pool.mu);
      pthread_mutex_unlock(&pool.mu);
      break;
    }
    seen = g;
    if (atomic_load(&pool.stop)) return NULL;
    run_share(k);
    atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel);
  }
}

static int threads_wanted(void) {
  const char *e = getenv("NOVA_NUM_THREADS");
  long n = 0;
  if (e && *e) n = strtol(e, NULL, 10);
  if (n <= 0) {
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  }
  return n < 1 ? 1 : n > RT_MAX_THREADS ? RT_MAX_THREADS : (int)n;
}

/* The threads the pool has (or will have when it starts): what a caller
 * sizes its shares of work by. */
int nova_rt_threads(void) {
  if (atomic_load_explicit(&pool.ready, memory_order_acquire)) return pool.nthreads;
  static atomic_int wanted;
  int n = atomic_load_explicit(&wanted, memory_order_relaxed);
  if (!n) atomic_store_explicit(&wanted, n = threads_wanted(), memory_order_relaxed);
  return n;
}

/* In a child after fork(): only the forking thread exists; the locks may
 * have been held by threads that are gone. */
static void pool_forget(void) {
  pthread_mutex_init(&pool.busy, NULL);
  pthread_mutex_init(&pool.mu, NULL);
  pthread_mutex_init(&start_mu, NULL);
  pthread_cond_init(&pool.wake, NULL);
  pool.started = 0;
  pool.nthreads = 0;
  atomic_store(&pool.gen, 0);
  atomic_store(&pool.pending, 0);
  atomic_store(&pool.stop, false);
  atomic_store(&pool.ready, false);
}

static void pool_start(void) {
  static bool atfork;
  if (!atfork) atfork = pthread_atfork(NULL, NULL, pool_forget) == 0;
  pool.nthreads = threads_wanted();
  for (int k = 1; k < pool.nthreads; k++) {
    if (pthread_create(&pool.tid[k], NULL, worker, (void *)(intptr_t)k)) break;
    pool.started = k;
  }
  pool.nthreads = pool.started + 1; /* fewer if a thread could not start */
}

__attribute__((destructor)) static void pool_stop(void) {
  if (!pool.started) return;
  pthread_mutex_lock(&pool.busy);
  atomic_store(&pool.stop, true);
  pthread_mutex_lock(&pool.mu);
  atomic_fetch_add_explicit(&pool.gen, 1, memory_order_release);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  for (int k = 1; k <= pool.started; k++) pthread_join(pool.tid[k], NULL);
  pool.started = 0;
  pthread_mutex_unlock(&pool.busy);
}

static void parallel_for(rt_task task, void **argv, int64_t lb, int64_t ub, int64_t step) {
  int64_t n = step > 0 && ub > lb ? (ub - lb + step - 1) / step : 0;
  if (!atomic_load_explicit(&pool.ready, memory_order_acquire)) {
    pthread_mutex_lock(&start_mu);
    if (!atomic_load(&pool.ready)) {
      pool_start();
      atomic_store_explicit(&pool.ready, true, memory_order_release);
    }
    pthread_mutex_unlock(&start_mu);
  }
  if (n < 2 || pool.nthreads < 2 || pthread_mutex_trylock(&pool.busy)) {
    task(argv, lb, ub);
    return;
  }
  int shares = n < pool.nthreads ? (int)n : pool.nthreads; /* a worker past the last share has none */
  pool.task = task;
  pool.argv = argv;
  pool.lb = lb;
  pool.ub = ub;
  pool.step = step;
  pool.per = (n + shares - 1) / shares;
  atomic_store_explicit(&pool.pending, pool.nthreads - 1, memory_order_relaxed);
  pthread_mutex_lock(&pool.mu);
  atomic_fetch_add_explicit(&pool.gen, 1, memory_order_release);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  run_share(0);
  while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) relax();
  pthread_mutex_unlock(&pool.busy);
}

/* (traced: one event per loop nest on the compute track) */
void nova_rt_parallel_for(rt_task task, void **argv, int64_t lb, int64_t ub, int64_t step) {
  if (!atomic_load_explicit(&rt_trace_on, memory_order_relaxed)) {
    parallel_for(task, argv, lb, ub, step);
    return;
  }
  rt_event e = {.t0 = rt_trace_now(), .kind = RT_EV_LOOP, .track = RT_TRACK_COMPUTE, .step = -1,
                .arg = (int64_t)(intptr_t)task};
  parallel_for(task, argv, lb, ub, step);
  e.t1 = rt_trace_now();
  rt_trace_add(&e);
}
