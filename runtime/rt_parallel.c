/* rt_parallel.c: the threads a step's parallel loops are shared out on.
 *
 * novac (codegen/parallel.c) turns the outermost loop of a large parallel
 * nest into nova_rt_parallel_for(task, argv, lb, ub, step): the iterations
 * lb, lb+step, ... < ub, in chunks of consecutive iterations (about
 * RT_CHUNKS per thread), are taken one chunk at a time by the calling
 * thread and by the pool's workers from a shared counter; the call returns
 * when every chunk is done.  The iterations write disjoint data, so the
 * result does not depend on the number of threads or on who ran what.
 *
 * Degrading gracefully when the machine is shared: a worker that another
 * process keeps off its core takes no chunk (the caller and the other
 * workers take them all) or holds one chunk at most, which the caller
 * waits for spinning briefly, then yielding its core (to that worker, when
 * they share one).  The caller never waits for a worker to wake up.
 *
 * Threads: NOVA_NUM_THREADS, else the processors this process may run on
 * (sched_getaffinity: `taskset -c 0` gives one), at most RT_MAX_THREADS.
 * The pool starts at the first parallel loop; workers poll for the next
 * loop for at most RT_SPIN_NS, then sleep on a condition variable.  A
 * second thread running a step while the pool is busy runs its loops
 * alone.  The pool is stopped and joined when the step.so is unloaded.  A
 * child made by fork() has none of its parent's workers: it starts a pool
 * of its own at its first parallel loop (pthread_atfork).
 *
 * The loop being run is published as a claim word (generation << 32 |
 * next chunk): a worker reads it, reads the loop's fields, then takes a
 * chunk with a compare-and-swap that fails when the generation has moved
 * on, so a late worker never runs a chunk of a loop that is over; the
 * fields of the next loop are written only after every chunk of this one
 * is done.
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
#include <time.h>

#include "rt_trace.h"

#define RT_MAX_THREADS 64
#define RT_CHUNKS 4           /* chunks per thread of a loop */
#define RT_SPIN_NS 100000     /* a worker polls this long for the next loop, then sleeps */
#define RT_WAIT_SPINS 2000    /* the caller's polls for the last chunks before it yields */

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
  atomic_uint_fast64_t gen;    /* bumped for each loop (and to stop): what wakes the workers */
  atomic_uint_fast64_t claim;  /* generation << 32 | the next chunk to take */
  atomic_int_fast64_t done;    /* chunks of the loop finished */
  atomic_bool stop;
  /* the loop being run (atomic: a late worker may read them while the next loop's are written) */
  _Atomic(rt_task) task;
  _Atomic(void **) argv;
  atomic_int_fast64_t lb, ub, step, per, chunks; /* per: iterations per chunk */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Takes and runs chunks of the loop of generation G until none is left
 * (or the loop is over); the chunks it ran. */
static int64_t run_chunks(uint_fast64_t g) {
  int64_t ran = 0;
  uint_fast64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
  for (;;) {
    if (c >> 32 != (g & 0xffffffffu)) return ran;
    int64_t k = (int64_t)(c & 0xffffffffu);
    rt_task task = atomic_load_explicit(&pool.task, memory_order_relaxed);
    void **argv = atomic_load_explicit(&pool.argv, memory_order_relaxed);
    int64_t lb = atomic_load_explicit(&pool.lb, memory_order_relaxed), ub = atomic_load_explicit(&pool.ub, memory_order_relaxed);
    int64_t step = atomic_load_explicit(&pool.step, memory_order_relaxed), per = atomic_load_explicit(&pool.per, memory_order_relaxed);
    if (k >= atomic_load_explicit(&pool.chunks, memory_order_relaxed)) return ran;
    /* the fields read above are this loop's when the claim still holds */
    if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire))
      continue;
    int64_t lo = lb + k * per * step, hi = lo + per * step;
    if (hi > ub) hi = ub;
    if (lo < hi) task(argv, lo, hi);
    atomic_fetch_add_explicit(&pool.done, 1, memory_order_acq_rel);
    ran++;
    c = atomic_load_explicit(&pool.claim, memory_order_acquire);
  }
}

static void *worker(void *arg) {
  (void)arg;
  uint_fast64_t seen = 0;
  for (;;) {
    uint_fast64_t g;
    int64_t t0 = 0;
    for (unsigned polls = 0; (g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen; polls++) {
      if (polls % 64 == 0) { /* the clock now and then: polls cost differently on each CPU */
        int64_t t = now_ns();
        if (!t0) t0 = t;
        else if (t - t0 > RT_SPIN_NS) {
          pthread_mutex_lock(&pool.mu);
          while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen)
            pthread_cond_wait(&pool.wake, &pool.mu);
          pthread_mutex_unlock(&pool.mu);
          break;
        }
      }
      relax();
    }
    seen = g;
    if (atomic_load(&pool.stop)) return NULL;
    run_chunks(g);
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
  atomic_store(&pool.claim, 0);
  atomic_store(&pool.done, 0);
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
  int64_t want = (int64_t)pool.nthreads * RT_CHUNKS, chunks = n < want ? n : want;
  int64_t per = (n + chunks - 1) / chunks;
  chunks = (n + per - 1) / per;
  /* every chunk of the previous loop is done: no worker reads these now but
   * to find its claim stale */
  atomic_store_explicit(&pool.task, task, memory_order_relaxed);
  atomic_store_explicit(&pool.argv, argv, memory_order_relaxed);
  atomic_store_explicit(&pool.lb, lb, memory_order_relaxed);
  atomic_store_explicit(&pool.ub, ub, memory_order_relaxed);
  atomic_store_explicit(&pool.step, step, memory_order_relaxed);
  atomic_store_explicit(&pool.per, per, memory_order_relaxed);
  atomic_store_explicit(&pool.chunks, chunks, memory_order_relaxed);
  atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
  uint_fast64_t g = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
  atomic_store_explicit(&pool.claim, (g & 0xffffffffu) << 32, memory_order_release);
  pthread_mutex_lock(&pool.mu);
  atomic_store_explicit(&pool.gen, g, memory_order_release);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  run_chunks(g);
  /* the chunks still running on workers: poll, then give the core away */
  for (unsigned polls = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < chunks; polls++) {
    if (polls < RT_WAIT_SPINS) relax();
    else sched_yield();
  }
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
