/* rt_trace.h: the events of a traced run (nova_step_trace_start; written
 * by nova_step_trace_write as a Chrome/Perfetto trace). */
#ifndef NOVA_RT_TRACE_H
#define NOVA_RT_TRACE_H

#include <stdatomic.h>
#include <stdint.h>

enum { RT_EV_STEP, RT_EV_LOOP, RT_EV_WAIT, RT_EV_ALLREDUCE };
enum { RT_TRACK_COMPUTE, RT_TRACK_COMM };

typedef struct rt_event {
  double t0, t1;    /* seconds, CLOCK_MONOTONIC */
  int32_t kind;     /* RT_EV_* */
  int32_t track;    /* RT_TRACK_* */
  int32_t step;     /* the data-parallel step's run (RT_EV_WAIT, RT_EV_ALLREDUCE), else -1 */
  int32_t bucket;   /* RT_EV_WAIT, RT_EV_ALLREDUCE; RT_EV_STEP: the run's number */
  int64_t arg;      /* RT_EV_ALLREDUCE: bytes; RT_EV_LOOP: the loop body's offset in the step.so */
} rt_event;

extern atomic_int rt_trace_on;
double rt_trace_now(void);
void rt_trace_add(const rt_event *e);
/* Starts recording (0; -1: out of memory); stops it and gives the events
 * recorded (*N, *NDROPPED more not kept) and when it started. */
int rt_trace_begin(void);
const rt_event *rt_trace_events(int *n, int *ndropped, double *t0);

#endif
