/* rt_trace_file.c: nova_step_trace_start and nova_step_trace_write: the
 * events of rt_trace.c from every rank, as a Chrome/Perfetto trace. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_comm.h"
#include "rt_step.h"
#include "rt_trace.h"

static bool started;

NOVA_API nova_status nova_step_trace_start(nova_step *step) {
  if (!rt_handle_live(step)) return NOVA_ERR_INVALID_HANDLE;
  if (rt_trace_begin()) return rt_fail(step, NOVA_ERR_NO_MEMORY, "out of memory for the trace");
  started = true;
  return NOVA_OK;
}

/* The offset of code address P in the object that holds it (a loop nest's name in the trace). */
static int64_t code_offset(const void *p) {
  Dl_info info;
  if (dladdr(p, &info) && info.dli_fbase) return (int64_t)((const char *)p - (const char *)info.dli_fbase);
  return 0;
}

static const char *event_name(const rt_event *e, char *buf, size_t n) {
  switch (e->kind) {
  case RT_EV_STEP: snprintf(buf, n, "step %d", e->bucket + 1); break;
  case RT_EV_LOOP: snprintf(buf, n, "loop nest +0x%llx", (unsigned long long)e->arg); break;
  case RT_EV_WAIT: snprintf(buf, n, "wait for bucket %d", e->bucket); break;
  default: snprintf(buf, n, "all-reduce bucket %d (%lld bytes)", e->bucket, (long long)e->arg); break;
  }
  return buf;
}

/* The summary over every rank's events: all-reduce time, the compute
 * track's waits, and both without each step's last bucket (which the
 * backward has nothing left to hide). */
static void summarize(const rt_event *ev, const int *count, int max, int n, nova_trace_summary *s) {
  memset(s, 0, sizeof *s);
  for (int r = 0; r < n; r++) {
    const rt_event *e = ev + (size_t)r * (size_t)max;
    int last_bucket = -1;
    for (int i = 0; i < count[r]; i++)
      if (e[i].kind == RT_EV_ALLREDUCE && e[i].bucket > last_bucket) last_bucket = e[i].bucket;
    for (int i = 0; i < count[r]; i++) {
      double ms = (e[i].t1 - e[i].t0) * 1e3;
      if (e[i].kind == RT_EV_STEP && r == 0) s->steps++, s->step_ms += ms;
      if (e[i].kind == RT_EV_ALLREDUCE) {
        s->allreduce_ms += ms / n;
        if (e[i].bucket != last_bucket) s->allreduce_ms_but_last += ms / n;
      }
      if (e[i].kind == RT_EV_WAIT) {
        s->waited_ms += ms / n;
        if (e[i].bucket != last_bucket) s->waited_ms_but_last += ms / n;
      }
    }
  }
}

static nova_status write_trace(nova_step *step, const char *path, const rt_event *ev, const int *count, int max, int n) {
  char tmp[4096], name[128];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "trace file name too long");
  FILE *f = fopen(tmp, "w");
  if (!f) return rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "%s: cannot write the trace", path);
  fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  bool first = true;
  for (int r = 0; r < n; r++) {
    for (int t = 0; t < 2; t++) {
      fprintf(f, "%s{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}}",
              first ? "" : ",\n", r, t, t ? "communication" : "compute");
      first = false;
    }
    fprintf(f, ",\n{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}", r, r);
    const rt_event *e = ev + (size_t)r * (size_t)max;
    for (int i = 0; i < count[r]; i++)
      fprintf(f, ",\n{\"ph\": \"X\", \"name\": \"%s\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}",
              event_name(&e[i], name, sizeof name), r, e[i].track, (e[i].t0) * 1e6, (e[i].t1 - e[i].t0) * 1e6);
  }
  fprintf(f, "\n]}\n");
  if (fclose(f) || rename(tmp, path)) {
    remove(tmp);
    return rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "%s: cannot write the trace", path);
  }
  return NOVA_OK;
}

static nova_status trace_write(nova_step *step, const char *path, nova_trace_summary *summary) {
  int rank, n = rt_comm_world(&rank), mine, ndropped, max = 0;
  double origin;
  const rt_event *events = rt_trace_events(&mine, &ndropped, &origin);
  if (step->comm_scale < 0) n = 1, rank = 0;
  int *count = calloc((size_t)n, sizeof *count);
  if (!count) return rt_fail(step, NOVA_ERR_NO_MEMORY, "out of memory");
  nova_status st = NOVA_OK;
  if (n > 1 ? rt_comm_allgather(&mine, sizeof mine, count, step->error, sizeof step->error) : (count[0] = mine, 0))
    st = NOVA_ERR_COMM;
  for (int r = 0; r < n; r++)
    if (count[r] > max) max = count[r];
  rt_event *all = st == NOVA_OK ? calloc((size_t)n * (size_t)(max ? max : 1), sizeof *all) : NULL;
  rt_event *pad = st == NOVA_OK ? calloc((size_t)(max ? max : 1), sizeof *pad) : NULL;
  if (st == NOVA_OK && (!all || !pad)) st = rt_fail(step, NOVA_ERR_NO_MEMORY, "out of memory for the trace");
  if (st == NOVA_OK) {
    for (int i = 0; i < mine; i++) { /* times from the first traced moment */
      pad[i] = events[i];
      pad[i].t0 -= origin, pad[i].t1 -= origin;
      if (pad[i].kind == RT_EV_LOOP) pad[i].arg = code_offset((const void *)(intptr_t)pad[i].arg);
    }
    if (n > 1 ? rt_comm_allgather(pad, (size_t)max * sizeof *pad, all, step->error, sizeof step->error)
              : (memcpy(all, pad, (size_t)mine * sizeof *pad), 0))
      st = NOVA_ERR_COMM;
  }
  if (st == NOVA_OK) {
    if (summary) summarize(all, count, max, n, summary);
    if (summary) summary->dropped = ndropped;
    if (rank == 0 && path) st = write_trace(step, path, all, count, max, n);
  }
  free(all);
  free(pad);
  free(count);
  return st;
}

NOVA_API nova_status nova_step_trace_write(nova_step *step, const char *path, nova_trace_summary *summary) {
  if (!rt_handle_live(step)) return NOVA_ERR_INVALID_HANDLE;
  if (!step->graph) return NOVA_ERR_ABI;
  if (!started) return rt_fail(step, NOVA_ERR_INVALID_ARGUMENT, "nova_step_trace_write: no trace was started");
  return trace_write(step, path, summary);
}

