/* rt_trace.c: a traced run's events (the trace file: rt_trace_file.c).
 *
 * While tracing is on (nova_step_trace_start), the runtime records each
 * step's run and each parallel loop nest on the compute track, each
 * gradient bucket's all-reduce (from the moment its last gradient was
 * handed over until MPI reports it done) on the communication track, and
 * each time the compute track had to wait for a sum.  Up to RT_TRACE_MAX
 * events per process (later ones are counted, not kept).
 *
 * nova_step_trace_write gathers every rank's events (a collective of a
 * data-parallel step: every rank calls it) and rank 0 writes them as a
 * Chrome trace (JSON: one process per rank, threads "compute" and
 * "communication"), which chrome://tracing and ui.perfetto.dev open.  The
 * summary says how much of the all-reduces' time the compute track did not
 * wait for: the share hidden behind compute.
 */
#include <stdlib.h>
#include <time.h>

#include "rt_trace.h"

#define RT_TRACE_MAX (1 << 16)

atomic_int rt_trace_on;
static rt_event *events;
static atomic_int nevents, dropped;
static double origin;

int rt_trace_begin(void) {
  if (!events && !(events = calloc(RT_TRACE_MAX, sizeof *events))) return -1;
  atomic_store(&nevents, 0);
  atomic_store(&dropped, 0);
  origin = rt_trace_now();
  atomic_store(&rt_trace_on, 1);
  return 0;
}

const rt_event *rt_trace_events(int *n, int *ndropped, double *t0) {
  atomic_store(&rt_trace_on, 0);
  int k = atomic_load(&nevents);
  *n = events ? (k < RT_TRACE_MAX ? k : RT_TRACE_MAX) : 0;
  *ndropped = atomic_load(&dropped);
  *t0 = origin;
  return events;
}

double rt_trace_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void rt_trace_add(const rt_event *e) {
  int i = atomic_fetch_add(&nevents, 1);
  if (i < RT_TRACE_MAX && events) events[i] = *e;
  else atomic_fetch_add(&dropped, 1);
}

