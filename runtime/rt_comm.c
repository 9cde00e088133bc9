/* rt_comm.c: the collectives of a data-parallel step (novac
 * --data-parallel), over MPI between the processes of one job.
 *
 * novac (codegen/comm_calls.c) turns each gradient's nova.all_reduce into
 * two calls: nova_rt_comm_start where the backward has produced the
 * gradient, nova_rt_comm_wait before the first op that reads the sum.
 * Gradients are grouped in buckets (passes/comm.c).  start copies the
 * gradient into its place in the bucket's buffer (f32, or f64 for f64
 * gradients; bf16/f16 widened to f32), so the gradient's own buffer is
 * free again when it returns; the bucket's last start hands the bucket to
 * the communication thread, which runs MPI_Iallreduce (sum, in place) on
 * it while the backward goes on, polling it (MPI_Test: with short sleeps
 * in between while the compute threads work, so as not to take their
 * cores; at full speed while one waits for a sum).  wait blocks until the
 * bucket's sum is there and copies its part out (rounded back to
 * bf16/f16).  The buckets are started in the order the step reaches them,
 * the same on every rank, as MPI requires of collectives.
 *
 * --shard-optimizer (ZeRO-1) adds two kinds of bucket and one call: a
 * reduce-scatter (MPI_Ireduce_scatter_block, in place: each member's
 * flat gradient cut into N shares, share r of every member in block r;
 * rank r gets block r summed), an all-gather (MPI_Iallgather, in place:
 * each rank's new shares in its block, every block back), whose buffers
 * are mapped for the step and unmapped once read, and
 * nova_rt_comm_shard, this rank's share of a value (zero-padded).
 *
 * The world: a process launched by mpirun (Open MPI: OMPI_COMM_WORLD_SIZE;
 * MPICH/Hydra: PMI_SIZE; PMIx: PMIX_SIZE) with more than one rank loads the
 * MPI library with dlopen (NOVA_MPI_LIB, else libmpi.so.40, Open MPI, then
 * libmpi.so.12, MPICH), so that a step.so needs no MPI to run as one
 * process.  MPI is initialized with MPI_THREAD_MULTIPLE, unless the host
 * program did it already, and finalized at exit.  A world of one runs the
 * same calls without MPI (the sum of one rank is the value).
 *
 * Failure: a collective not finished after NOVA_COMM_TIMEOUT seconds
 * (default 300) ends the job: the ranks that timed out tell each other so,
 * the message names the collective and the ranks that never joined it, and
 * MPI_Abort stops every process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "rt_comm.h"
#include "rt_dtype.h"
#include "rt_init.h"
#include "rt_trace.h"

/* The calls the generated code makes (declared by codegen/comm_calls.c). */
void nova_rt_comm_start(int64_t src, int64_t count, int64_t dtype, int64_t bucket, int64_t offset, int64_t block,
                        int64_t members, int64_t f64, int64_t kind, int64_t world);
void nova_rt_comm_shard(int64_t src, int64_t count, int64_t dst, int64_t share, int64_t dtype, int64_t world);
void nova_rt_comm_wait(int64_t dst, int64_t count, int64_t dtype, int64_t bucket, int64_t offset);

/* ---- MPI through dlopen ------------------------------------------------ */

/* Handles are pointers in Open MPI and ints in MPICH: both fit intptr_t and
 * travel in the same registers. */
typedef intptr_t mpi_h;
typedef struct mpi_api {
  int (*Initialized)(int *);
  int (*Init_thread)(int *, char ***, int, int *);
  int (*Finalized)(int *);
  int (*Finalize)(void);
  int (*Comm_rank)(mpi_h, int *);
  int (*Comm_size)(mpi_h, int *);
  int (*Iallreduce)(const void *, void *, int, mpi_h, mpi_h, mpi_h, intptr_t *);
  int (*Iallgather)(const void *, int, mpi_h, void *, int, mpi_h, mpi_h, intptr_t *);
  int (*Ireduce_scatter_block)(const void *, void *, int, mpi_h, mpi_h, mpi_h, intptr_t *);
  int (*Test)(intptr_t *, int *, void *);
  int (*Isend)(const void *, int, mpi_h, int, int, mpi_h, intptr_t *);
  int (*Iprobe)(int, int, mpi_h, int *, void *);
  int (*Recv)(void *, int, mpi_h, int, int, mpi_h, void *);
  int (*Abort)(mpi_h, int);
  mpi_h world, f32, f64, byte, sum;
  void *in_place, *status_ignore;
  int thread_multiple;
} mpi_api;

#define COMM_MAX_BUCKETS 4096
#define COMM_TAG_TIMEOUT 0x6e76 /* the timed-out ranks' messages to each other */

enum { KIND_ALL_REDUCE, KIND_REDUCE_SCATTER, KIND_ALL_GATHER }; /* codegen.h's CG_COMM_* */

typedef struct bucket {
  void *send;              /* f32 or f64 elements, summed or gathered in place: an all-reduce's
                              one block; a reduce-scatter's N blocks (the sum of this rank's
                              comes back in the first); an all-gather's N (this rank's in its
                              place); the last two freed when the last member has its result */
  int waited;              /* members that have their result, this step */
  size_t bytes;            /* of send */
  bool mapped;             /* send is an mmap of its own */
  int64_t count;           /* elements of one rank's block */
  int f64, kind, world;
  int members, arrived;    /* starts this step, of members */
  int state;               /* 0 idle, 1 handed to the thread, 2 running, 3 summed */
  intptr_t req;
  double deadline, handed; /* handed: when the last member arrived (the trace) */
  int step;
} bucket;

static struct {
  pthread_once_t once;
  int state;               /* 0: world of one; 1: MPI; -1: failed (error says why) */
  char error[512];
  int rank, size;
  bool we_initialized;
  mpi_api m;
  double timeout_s;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  bool thread_running, stop;
  bucket b[COMM_MAX_BUCKETS];
  int queue[COMM_MAX_BUCKETS], qhead, qtail; /* handed over, in order */
  int step;                /* runs of a data-parallel step so far */
  int waiters;             /* compute threads blocked in nova_rt_comm_wait */
  bool failed;
} C = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static long env_long(const char *name) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : 0;
}

/* The launcher's world size (0: not launched by one). */
static long launcher_size(const char **var) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
    if (getenv(vars[i])) {
      if (var) *var = vars[i];
      return env_long(vars[i]);
    }
  return 0;
}

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(C.error, sizeof C.error, fmt, ap);
  va_end(ap);
  C.state = -1;
}

static int load_mpi(void) {
  const char *env = getenv("NOVA_MPI_LIB");
  const char *names[3] = {env && *env ? env : "libmpi.so.40", env && *env ? NULL : "libmpi.so.12", NULL};
  void *lib = NULL;
  for (int i = 0; i < 2 && !lib && names[i]; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    set_error("launched as %d ranks, but no MPI library could be loaded (%s); install Open MPI (Debian: "
              "openmpi-bin) or set NOVA_MPI_LIB to the MPI library's path", C.size, dlerror());
    return -1;
  }
  mpi_api *m = &C.m;
#define SYM(field, name)                                                                      \
  do {                                                                                        \
    *(void **)&m->field = dlsym(lib, name);                                                   \
    if (!m->field) {                                                                          \
      set_error("the MPI library lacks %s", name);                                            \
      return -1;                                                                              \
    }                                                                                         \
  } while (0)
  SYM(Initialized, "MPI_Initialized");
  SYM(Init_thread, "MPI_Init_thread");
  SYM(Finalized, "MPI_Finalized");
  SYM(Finalize, "MPI_Finalize");
  SYM(Comm_rank, "MPI_Comm_rank");
  SYM(Comm_size, "MPI_Comm_size");
  SYM(Iallreduce, "MPI_Iallreduce");
  SYM(Iallgather, "MPI_Iallgather");
  SYM(Ireduce_scatter_block, "MPI_Ireduce_scatter_block");
  SYM(Test, "MPI_Test");
  SYM(Isend, "MPI_Isend");
  SYM(Iprobe, "MPI_Iprobe");
  SYM(Recv, "MPI_Recv");
  SYM(Abort, "MPI_Abort");
#undef SYM
  void *ow = dlsym(lib, "ompi_mpi_comm_world");
  if (ow) { /* Open MPI: the predefined handles are the addresses of its objects */
    void *f32 = dlsym(lib, "ompi_mpi_float"), *f64 = dlsym(lib, "ompi_mpi_double"), *byte = dlsym(lib, "ompi_mpi_byte"),
         *sum = dlsym(lib, "ompi_mpi_op_sum");
    if (!f32 || !f64 || !byte || !sum) {
      set_error("the Open MPI library lacks its predefined datatypes");
      return -1;
    }
    m->world = (mpi_h)ow, m->f32 = (mpi_h)f32, m->f64 = (mpi_h)f64, m->byte = (mpi_h)byte, m->sum = (mpi_h)sum;
    m->in_place = (void *)1, m->status_ignore = NULL;
  } else { /* MPICH and its derivatives: integer handles fixed by its mpi.h */
    m->world = 0x44000000, m->f32 = 0x4c00040a, m->f64 = 0x4c00080b, m->byte = 0x4c00010d, m->sum = 0x58000003;
    m->in_place = (void *)(intptr_t)-1, m->status_ignore = (void *)(intptr_t)1;
  }
  m->thread_multiple = 3; /* MPI_THREAD_MULTIPLE in both */
  return 0;
}

static void *comm_thread(void *arg);

static void finish(void) {
  if (C.state != 1) return;
  pthread_mutex_lock(&C.mu);
  C.stop = true;
  pthread_cond_broadcast(&C.cv);
  pthread_mutex_unlock(&C.mu);
  if (C.thread_running) pthread_join(C.thread, NULL);
  C.thread_running = false;
  int done = 0;
  if (C.we_initialized && C.m.Finalized(&done) == 0 && !done) C.m.Finalize();
  C.state = 0;
}

static void init_once(void) {
  C.rank = 0, C.size = 1;
  long t = env_long("NOVA_COMM_TIMEOUT");
  C.timeout_s = t > 0 ? (double)t : 300.0;
  const char *var = NULL;
  long n = launcher_size(&var);
  if (n <= 1) {
    long w = env_long("WORLD_SIZE");
    if (w > 1)
      set_error("WORLD_SIZE=%ld, but this process was not started by an MPI launcher: a cpu step's "
                "gradients are summed over MPI; start the ranks with mpirun -np %ld (torchrun's variables "
                "are not enough without it)", w, w);
    return;
  }
  C.size = (int)n;
  if (load_mpi()) return;
  int inited = 0, provided = 0;
  C.m.Initialized(&inited);
  if (!inited) {
    if (C.m.Init_thread(NULL, NULL, C.m.thread_multiple, &provided) != 0) {
      set_error("MPI_Init_thread failed");
      return;
    }
    C.we_initialized = true;
    if (provided < C.m.thread_multiple) {
      set_error("the MPI library gives no MPI_THREAD_MULTIPLE (level %d), which the communication thread needs",
                provided);
      return;
    }
  }
  int size = 0;
  C.m.Comm_rank(C.m.world, &C.rank);
  C.m.Comm_size(C.m.world, &size);
  if (size != C.size) {
    set_error("%s=%ld, but MPI_COMM_WORLD has %d rank%s: start the processes with mpirun", var, n, size, size == 1 ? "" : "s");
    return;
  }
  if (pthread_create(&C.thread, NULL, comm_thread, NULL)) {
    set_error("cannot start the communication thread");
    return;
  }
  C.thread_running = true;
  C.state = 1;
  atexit(finish);
}

int rt_comm_init(char *err, size_t errlen) {
  pthread_once(&C.once, init_once);
  if (C.state < 0) {
    snprintf(err, errlen, "%s", C.error);
    return -1;
  }
  return 0;
}

static int64_t rt_comm_rank(void) { return C.state == 1 ? C.rank : 0; }

int rt_comm_world(int *rank) {
  if (rank) *rank = C.state == 1 ? C.rank : 0;
  return C.state == 1 ? C.size : 1;
}

/* ---- the collectives ---------------------------------------------------- */

static void comm_fail(const char *what, int step, int bi) __attribute__((noreturn));

/* A collective that timed out (WHAT, in run STEP): tell every other rank, listen a moment for the
 * ranks that timed out too, name those that did not, and abort the job. */
static void comm_fail(const char *what, int step, int bi) {
  int msg[3] = {C.rank, step, bi};
  intptr_t *req = calloc((size_t)C.size, sizeof *req);
  char *heard = calloc((size_t)C.size, 1);
  if (req && heard) {
    heard[C.rank] = 1;
    for (int r = 0; r < C.size; r++)
      if (r != C.rank) C.m.Isend(msg, (int)sizeof msg, C.m.byte, r, COMM_TAG_TIMEOUT, C.m.world, &req[r]);
    for (double until = now_s() + 2.0; now_s() < until;) {
      int flag = 0, got[3];
      char st[64];
      C.m.Iprobe(-1, COMM_TAG_TIMEOUT, C.m.world, &flag, st);
      if (!flag) {
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        continue;
      }
      C.m.Recv(got, (int)sizeof got, C.m.byte, -1, COMM_TAG_TIMEOUT, C.m.world, C.m.status_ignore);
      if (got[0] >= 0 && got[0] < C.size) heard[got[0]] = 1;
    }
  }
  char who[256] = "";
  size_t len = 0;
  int missing = 0;
  for (int r = 0; heard && r < C.size && len + 16 < sizeof who; r++)
    if (!heard[r]) len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", missing++ ? ", " : "", r);
  fprintf(stderr,
          "novarun: rank %d: %s in step %d did not finish within %g s (--comm-timeout): %s%s%s\n",
          C.rank, what, step + 1, C.timeout_s, missing ? (missing > 1 ? "ranks " : "rank ") : "",
          missing ? who : "a rank stopped or hangs", missing ? " never joined it (stopped or hung); stopping the job" : "");
  fflush(stderr);
  C.m.Abort(C.m.world, 1);
  abort();
}

/* Waits for the request REQ of a collective made outside the step (a
 * host-side sum or gather, every rank taking part), polling as the
 * communication thread does, within the timeout. */
static void wait_request(intptr_t *req, const char *what) {
  double deadline = now_s() + C.timeout_s;
  for (long spins = 0;; spins++) {
    int flag = 0;
    C.m.Test(req, &flag, C.m.status_ignore);
    if (flag) return;
    if (now_s() > deadline) comm_fail(what, C.step - 1, -1);
    if (spins < 1000) sched_yield();
    else nanosleep(&(struct timespec){0, 100000}, NULL);
  }
}

static void *comm_thread(void *arg) {
  (void)arg;
  int running[COMM_MAX_BUCKETS], nrun = 0;
  long nap_ns = 20000;
  pthread_mutex_lock(&C.mu);
  for (;;) {
    while (!C.stop && nrun == 0 && C.qhead == C.qtail) pthread_cond_wait(&C.cv, &C.mu);
    if (C.stop) break;
    while (C.qhead != C.qtail) { /* start what was handed over, in order */
      int bi = C.queue[C.qhead];
      C.qhead = (C.qhead + 1) % COMM_MAX_BUCKETS;
      bucket *b = &C.b[bi];
      b->state = 2;
      b->deadline = now_s() + C.timeout_s;
      b->req = 0;
      pthread_mutex_unlock(&C.mu);
      mpi_h ty = b->f64 ? C.m.f64 : C.m.f32;
      int rc = b->kind == KIND_REDUCE_SCATTER
                   ? C.m.Ireduce_scatter_block(C.m.in_place, b->send, (int)b->count, ty, C.m.sum, C.m.world, &b->req)
               : b->kind == KIND_ALL_GATHER
                   ? C.m.Iallgather(C.m.in_place, 0, ty, b->send, (int)b->count, ty, C.m.world, &b->req)
                   : C.m.Iallreduce(C.m.in_place, b->send, (int)b->count, ty, C.m.sum, C.m.world, &b->req);
      pthread_mutex_lock(&C.mu);
      if (rc != 0) {
        fprintf(stderr, "novarun: rank %d: the collective of bucket %d failed (MPI error %d)\n", C.rank, bi, rc);
        C.m.Abort(C.m.world, 1);
      }
      running[nrun++] = bi;
      nap_ns = 20000;
    }
    pthread_mutex_unlock(&C.mu);
    bool progress = false;
    double t = now_s();
    for (int i = 0; i < nrun; i++) {
      int flag = 0;
      bucket *b = &C.b[running[i]];
      C.m.Test(&b->req, &flag, C.m.status_ignore);
      if (flag) {
        if (atomic_load_explicit(&rt_trace_on, memory_order_relaxed)) {
          rt_event e = {b->handed, now_s(), RT_EV_ALLREDUCE, RT_TRACK_COMM, b->step, running[i],
                        b->count * (b->f64 ? 8 : 4) * (b->kind == KIND_ALL_REDUCE ? 1 : b->world)};
          rt_trace_add(&e);
        }
        pthread_mutex_lock(&C.mu);
        b->state = 3;
        pthread_cond_broadcast(&C.cv);
        pthread_mutex_unlock(&C.mu);
        running[i--] = running[--nrun];
        progress = true;
      } else if (t > b->deadline) {
        char what[64];
        snprintf(what, sizeof what, "the %s of bucket %d",
                 b->kind == KIND_REDUCE_SCATTER ? "reduce-scatter" : b->kind == KIND_ALL_GATHER ? "all-gather" : "all-reduce",
                 running[i]);
        comm_fail(what, b->step, running[i]);
      }
    }
    if (!progress && nrun) {
      /* the compute thread waits for a sum: its core is free, poll at full speed; else poll with
       * short sleeps in between, so as not to take a core from the backward */
      if (__atomic_load_n(&C.waiters, __ATOMIC_RELAXED) > 0) {
        sched_yield();
        nap_ns = 20000;
      } else {
        nanosleep(&(struct timespec){0, nap_ns}, NULL);
        if (nap_ns < 200000) nap_ns *= 2;
      }
    }
    pthread_mutex_lock(&C.mu);
  }
  pthread_mutex_unlock(&C.mu);
  return NULL;
}

/* A bf16 or f16 (DT) value as f32 (exact). */
static float half_to_f32(int dt, uint16_t h) {
  if (dt == NOVA_DTYPE_BF16) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 0x400), e - 25);
  return h & 0x8000 ? -v : v;
}

static void release(bucket *b) {
  if (b->mapped && b->send) munmap(b->send, b->bytes ? b->bytes : 1);
  else free(b->send);
  b->send = NULL;
  b->mapped = false;
}

/* COUNT elements of dtype DTYPE at S into the staging elements D (f64 or f32) */
static void to_stage(void *d, int f64, const void *s, int64_t dtype, int64_t count) {
  if (f64) {
    if (dtype == NOVA_DTYPE_F64) memcpy(d, s, (size_t)count * 8);
    else
      for (int64_t i = 0; i < count; i++) ((double *)d)[i] = ((const float *)s)[i];
  } else if (dtype == NOVA_DTYPE_F32) {
    memcpy(d, s, (size_t)count * 4);
  } else {
    for (int64_t i = 0; i < count; i++) ((float *)d)[i] = half_to_f32((int)dtype, ((const uint16_t *)s)[i]);
  }
}

/* and back (rounded to nearest for bf16/f16) */
static void from_stage(void *d, int64_t dtype, const void *s, int f64, int64_t count) {
  if (f64) {
    if (dtype == NOVA_DTYPE_F64) memcpy(d, s, (size_t)count * 8);
    else
      for (int64_t i = 0; i < count; i++) ((float *)d)[i] = (float)((const double *)s)[i];
  } else if (dtype == NOVA_DTYPE_F32) {
    memcpy(d, s, (size_t)count * 4);
  } else {
    for (int64_t i = 0; i < count; i++) ((uint16_t *)d)[i] = rt_half_from_double((int)dtype, ((const float *)s)[i]);
  }
}

static void *stage_at(void *base, int f64, int64_t i) { return (char *)base + (size_t)i * (f64 ? 8 : 4); }

static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("novarun: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  if (C.state == 1) C.m.Abort(C.m.world, 1);
  abort();
}

void nova_rt_comm_start(int64_t src, int64_t count, int64_t dtype, int64_t bucket_id, int64_t offset, int64_t block,
                        int64_t members, int64_t f64, int64_t kind, int64_t world) {
  if (bucket_id < 0 || bucket_id >= COMM_MAX_BUCKETS) abort();
  bucket *b = &C.b[bucket_id];
  int n = kind == KIND_ALL_REDUCE ? 1 : (int)world;
  if (kind != KIND_ALL_REDUCE && n != rt_comm_world(NULL))
    fatal("bucket %lld: the step shards over %d ranks, but runs as %d", (long long)bucket_id, n, rt_comm_world(NULL));
  if (!b->send || b->count != block || b->f64 != (int)f64 || b->kind != (int)kind || b->world != n) {
    release(b);
    b->bytes = (size_t)block * (size_t)n * (f64 ? 8 : 4);
    if (kind == KIND_ALL_REDUCE) { /* (kept from step to step) */
      b->send = aligned_alloc(64, (b->bytes + 63) / 64 * 64);
    } else { /* mapped, and unmapped once read, so that its pages go back at once */
      void *p = mmap(NULL, b->bytes ? b->bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      b->send = p == MAP_FAILED ? NULL : p;
      b->mapped = true;
    }
    if (!b->send) fatal("out of memory for the buffer of bucket %lld", (long long)bucket_id);
    b->count = block, b->f64 = (int)f64, b->kind = (int)kind, b->world = n, b->arrived = 0, b->waited = 0;
    b->state = 0;
  }
  const void *s = (const void *)(intptr_t)src;
  if (kind == KIND_REDUCE_SCATTER) { /* rank r's share of the flat value in block r, zero-padded */
    int64_t share = (count + n - 1) / n;
    size_t es = rt_dtype_size((int)dtype);
    for (int r = 0; r < n; r++) {
      int64_t lo = r * share, len = lo >= count ? 0 : count - lo < share ? count - lo : share;
      void *d = stage_at(b->send, (int)f64, r * block + offset);
      to_stage(d, (int)f64, (const char *)s + (size_t)lo * es, dtype, len);
      memset(stage_at(d, (int)f64, len), 0, (size_t)(share - len) * (f64 ? 8 : 4));
    }
  } else { /* (an all-gather: in this rank's block) */
    int64_t at = kind == KIND_ALL_GATHER ? rt_comm_rank() * block + offset : offset;
    to_stage(stage_at(b->send, (int)f64, at), (int)f64, s, dtype, count);
  }
  pthread_mutex_lock(&C.mu);
  if (b->state == 3 && b->arrived == 0) b->state = 0; /* last step's */
  b->members = (int)members;
  if (++b->arrived == b->members) {
    b->arrived = 0;
    b->step = C.step;
    if (C.state == 1 && C.size > 1) {
      b->state = 1;
      b->handed = now_s();
      C.queue[C.qtail] = (int)bucket_id;
      C.qtail = (C.qtail + 1) % COMM_MAX_BUCKETS;
      pthread_cond_broadcast(&C.cv);
    } else {
      b->state = 3; /* a world of one: the sum is the value (a reduce-scatter or all-gather of one
                       rank: refused above) */
    }
  }
  pthread_mutex_unlock(&C.mu);
}

void nova_rt_comm_wait(int64_t dst, int64_t unit, int64_t dtype, int64_t bucket_id, int64_t offset) {
  if (bucket_id < 0 || bucket_id >= COMM_MAX_BUCKETS) abort();
  bucket *b = &C.b[bucket_id];
  pthread_mutex_lock(&C.mu);
  if (b->state != 3) {
    double t0 = now_s();
    __atomic_add_fetch(&C.waiters, 1, __ATOMIC_RELAXED);
    while (b->state != 3) pthread_cond_wait(&C.cv, &C.mu);
    __atomic_sub_fetch(&C.waiters, 1, __ATOMIC_RELAXED);
    if (atomic_load_explicit(&rt_trace_on, memory_order_relaxed)) {
      rt_event e = {t0, now_s(), RT_EV_WAIT, RT_TRACK_COMPUTE, b->step, (int32_t)bucket_id, 0};
      rt_trace_add(&e);
    }
  }
  pthread_mutex_unlock(&C.mu);
  void *d = (void *)(intptr_t)dst;
  if (b->kind == KIND_ALL_GATHER) { /* every rank's share, in rank order */
    size_t es = rt_dtype_size((int)dtype);
    for (int r = 0; r < b->world; r++)
      from_stage((char *)d + (size_t)(r * unit) * es, dtype, stage_at(b->send, b->f64, r * b->count + offset), b->f64,
                 unit);
  } else {
    from_stage(d, dtype, stage_at(b->send, b->f64, offset), b->f64, unit);
  }
  /* a reduce-scatter's or all-gather's buffer (N blocks) is given back once its members have
   * their results: those of the gradients are gone before the new params' are needed */
  if (b->kind != KIND_ALL_REDUCE && ++b->waited == b->members) {
    release(b);
    b->waited = 0;
  }
}

void nova_rt_comm_shard(int64_t src, int64_t count, int64_t dst, int64_t share, int64_t dtype, int64_t world) {
  int rank = 0, n = rt_comm_world(&rank);
  if (n != world) fatal("the step shards its optimizer over %lld ranks, but runs as %d", (long long)world, n);
  size_t es = rt_dtype_size((int)dtype);
  int64_t lo = rank * share, len = lo >= count ? 0 : count - lo < share ? count - lo : share;
  memcpy((void *)(intptr_t)dst, (const char *)(intptr_t)src + (size_t)lo * es, (size_t)len * es);
  memset((char *)(intptr_t)dst + (size_t)len * es, 0, (size_t)(share - len) * es);
}

void rt_comm_step_done(void) {
  pthread_mutex_lock(&C.mu);
  C.step++;
  pthread_mutex_unlock(&C.mu);
}

int rt_comm_sum(double *v, int n, char *err, size_t errlen) {
  if (C.state != 1 || C.size == 1) return 0;
  intptr_t req = 0;
  if (C.m.Iallreduce(C.m.in_place, v, n, C.m.f64, C.m.sum, C.m.world, &req) != 0) {
    snprintf(err, errlen, "MPI_Iallreduce failed");
    return -1;
  }
  wait_request(&req, "the sum of the loss over the ranks");
  return 0;
}

int rt_comm_allgather(const void *mine, size_t bytes, void *all, char *err, size_t errlen) {
  if (C.state != 1 || C.size == 1) {
    memcpy(all, mine, bytes);
    return 0;
  }
  intptr_t req = 0;
  if (C.m.Iallgather(mine, (int)bytes, C.m.byte, all, (int)bytes, C.m.byte, C.m.world, &req) != 0) {
    snprintf(err, errlen, "MPI_Iallgather failed");
    return -1;
  }
  wait_request(&req, "a gather over the ranks (the step check or the trace)");
  return 0;
}
