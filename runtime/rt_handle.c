/* rt_handle.c: the live steps of this step.so, so that a handle used after
 * nova_step_close (or one that never came from nova_step_open) is detected
 * without being dereferenced.
 *
 * A nova_step is live from nova_step_open to nova_step_close; the table
 * holds the live ones under one mutex (a step.so has a handful at most, so
 * a linear scan is enough).  Each live step also carries RT_STEP_MAGIC,
 * cleared at close, for debuggers and core dumps.  A freed address that a
 * later nova_step_open gets again is live again: the handle then names the
 * new step, which is memory-safe but not detectable.
 */
#include <pthread.h>
#include <stdlib.h>

#include "rt_step.h"

static pthread_mutex_t rt_live_lock = PTHREAD_MUTEX_INITIALIZER;
static nova_step **rt_live;
static int rt_nlive, rt_caplive;

int rt_handle_add(nova_step *s) {
  int ok = 1;
  pthread_mutex_lock(&rt_live_lock);
  if (rt_nlive == rt_caplive) {
    int cap = rt_caplive ? 2 * rt_caplive : 8;
    nova_step **n = realloc(rt_live, (size_t)cap * sizeof *n);
    if (n) rt_live = n, rt_caplive = cap;
    else ok = 0;
  }
  if (ok) {
    rt_live[rt_nlive++] = s;
    s->magic = RT_STEP_MAGIC;
  }
  pthread_mutex_unlock(&rt_live_lock);
  return ok;
}

/* The index of S in the table, or -1; the lock is held. */
static int rt_handle_index(const nova_step *s) {
  for (int i = 0; i < rt_nlive; i++)
    if (rt_live[i] == s) return i;
  return -1;
}

int rt_handle_live(const nova_step *s) {
  if (!s) return 0;
  pthread_mutex_lock(&rt_live_lock);
  int live = rt_handle_index(s) >= 0;
  pthread_mutex_unlock(&rt_live_lock);
  return live;
}

int rt_handle_remove(nova_step *s) {
  if (!s) return 0;
  pthread_mutex_lock(&rt_live_lock);
  int i = rt_handle_index(s);
  if (i >= 0) {
    rt_live[i] = rt_live[--rt_nlive];
    s->magic = 0;
  }
  if (rt_nlive == 0) { /* the last one closed: nothing left for a leak checker */
    free(rt_live);
    rt_live = NULL;
    rt_caplive = 0;
  }
  pthread_mutex_unlock(&rt_live_lock);
  return i >= 0;
}

int rt_step_enter(nova_step *s) {
  return atomic_exchange_explicit(&s->busy, 1, memory_order_acquire) == 0;
}

void rt_step_leave(nova_step *s) { atomic_store_explicit(&s->busy, 0, memory_order_release); }
