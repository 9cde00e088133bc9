/* novarun.h: what the parts of novarun share: novarun.c (command line,
 * loading, running), novarun_io.c (input and output tensors as .pb files),
 * novarun_st.c (safetensors files), novarun_ckpt.c (--save, --load) and
 * novarun_data.c (batches from --data and --seed). */
#ifndef NOVA_NOVARUN_H
#define NOVA_NOVARUN_H

#include <stdint.h>

#include "nova/step.h"

/* The ABI functions of one loaded step.so (nova/step.h), by dlsym. */
typedef struct nr_api {
  void *handle; /* dlopen handle */
  nova_status (*open)(nova_step **);
  void (*close)(nova_step *);
  int (*num_tensors)(const nova_step *);
  nova_status (*tensor)(const nova_step *, int, nova_tensor_info *);
  nova_status (*bind)(nova_step *, const char *, nova_dtype, int, const int64_t *, const void *);
  nova_status (*run)(nova_step *);
  nova_status (*get)(nova_step *, const char *, const void **, nova_tensor_info *);
  const char *(*error)(const nova_step *);
  const char *(*graph_hash)(const nova_step *); /* NULL in a step.so older than it */
  /* optional, NULL in older step.so files: */
  double (*last_run_ms)(const nova_step *);
  const char *(*target)(const nova_step *);
  nova_status (*set_profiling)(nova_step *, int);
  int (*num_launches)(const nova_step *);
  nova_status (*launch)(const nova_step *, int, const char **, double *);
  nova_status (*eval)(nova_step *); /* NULL in a step.so older than it */
  int (*world)(const nova_step *, int *);                 /* NULL in a step.so older than them */
  nova_status (*all_sum)(nova_step *, double *, int);
  nova_status (*trace_start)(nova_step *);                /* NULL in a step.so older than them */
  nova_status (*trace_write)(nova_step *, const char *, nova_trace_summary *);
  int (*sizes)(const nova_step *, const char **, int64_t *, int64_t *, const int64_t **); /* NULL: older */
  nova_status (*set_size)(nova_step *, int64_t);
} nr_api;

/* --lr-schedule and its settings (novarun_sched.c). */
typedef enum { NR_SCHED_NONE, NR_SCHED_CONSTANT, NR_SCHED_LINEAR, NR_SCHED_COSINE, NR_SCHED_STEP } nr_sched_kind;
typedef struct nr_sched {
  nr_sched_kind kind;
  long long warmup;        /* --warmup N */
  double min_lr;           /* --min-lr F (linear, cosine) */
  int min_lr_set;
  long long decay_steps;   /* --decay-steps N (0: the run's last step) */
  long long step_size;     /* --step-size N (step) */
  double gamma;            /* --gamma F (step; default 0.1) */
  int gamma_set;
} nr_sched;

typedef struct nr_options {
  const char *step_path;
  const char *inputs_dir;  /* NULL: no inputs given */
  const char *outputs_dir; /* NULL: outputs are not written */
  long steps;              /* --steps: train for this many steps (0: one inference run) */
  double lr;               /* --lr, when lr_set */
  int lr_set;
  const char *loss_log;    /* --loss-log FILE */
  const char *dump_dir;    /* --dump: param.NAME.pb (values after the run), loss.pb */
  long repeat;             /* >= 1 */
  int print;               /* --print: values and statistics on stdout */
  int quiet;               /* -q: no summary on stderr */
  int profile;             /* --profile: per-kernel times of the last run (cuda steps) */
  const char *data_path;   /* --data FILE: batches from a safetensors file */
  uint64_t seed;           /* --seed N, when seed_set: synthetic batches */
  int seed_set;
  const char *save_path;   /* --save FILE: checkpoint after the last step */
  const char *load_path;   /* --load FILE: checkpoint before the first step */
  int eval;                /* --eval: run the evaluation entry (after --steps, if any) */
  int skip_nonfinite;      /* --skip-nonfinite: count and skip steps the step.so reports
                              non-finite (NOVA_ERR_NONFINITE) instead of stopping */
  const char *trace_path;  /* --trace FILE: a Chrome/Perfetto trace of the runs */
  long comm_timeout;       /* --comm-timeout S (0: the default, NOVA_COMM_TIMEOUT or 300) */
  long max_overflow;       /* --max-overflow-steps K: a loss-scaled step that overflows K+1
                              times in a row stops training (default 20) */
  nr_sched sched;          /* --lr-schedule, --warmup, --min-lr, --decay-steps, --step-size, --gamma */
  const char *log_path;    /* --log FILE: a JSON line per step (and per evaluation) */
  const char *eval_data;   /* --eval-data FILE: held-out batches for the evaluation entry */
  long eval_every;         /* --eval-every N (0: only after the last step) */
  double clip;             /* --clip-grad-norm F (0: the step's) */
  long accumulate;         /* --accumulate K (0: the step's) */
  char size_dim[128];      /* --dim=NAME=N: a step for several sizes runs at size N ("": its largest) */
  long long size;
} nr_options;

/* novarun_sched.c: OPT's value V into S (-1: go on, 2: bad usage, said);
 * nr_sched_check: the settings together, with --steps STEPS (-1 or 2);
 * nr_sched_lr: the rate of the step after T steps (0-based) of TOTAL, from
 * BASE. */
int nr_sched_option(const char *opt, const char *v, nr_sched *s);
int nr_sched_check(nr_sched *s, long steps);
double nr_sched_lr(const nr_sched *s, double base, long long t, long long total);
const char *nr_sched_name(const nr_sched *s);

/* A loaded, opened step. */
typedef struct nr_step {
  nr_api api;
  nova_step *step;
  const char *path;
  int nbound;   /* inputs bound from --inputs */
  int rank, world; /* a data-parallel step's place among the processes launched (0 of 1: alone) */
} nr_step;

/* Checks that PATH is a whole 64-bit ELF shared object (novarun_elf.c):
 * its headers, its loaded segments and its sections inside the file, so
 * that a truncated file is an error before dlopen, not a SIGBUS after it.
 * 0, or -1 with the reason in WHY. */
int nr_check_elf(const char *path, char *why, size_t n);

/* Prints "novarun: MESSAGE" on stderr ("novarun: rank R: MESSAGE" in a
 * data-parallel run of several processes); returns 1, the exit status of a
 * user error. */
extern int nr_rank;
int nr_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void nr_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reads and binds every input and label of S from O->inputs_dir; returns
 * 0 and the number bound in *NBOUND, or 1 after a diagnostic. */
int nr_bind_inputs(nr_step *s, const nr_options *o, int *nbound);

/* nova_step_tensor into *INFO, zeroed first (a step.so older than a field
 * leaves it 0); returns 0, or 1 after a diagnostic. */
int nr_tensor(nr_step *s, int i, nova_tensor_info *info);

/* mkdir -p DIR; returns 0, or 1 after a diagnostic. */
int nr_make_dirs(const char *dir);

/* Reports every output and loss of S after a run: the summary on stderr
 * (unless quiet), values with --print, files in O->outputs_dir, which must
 * exist (nr_make_dirs).  Returns 0, or 1 after a diagnostic. */
int nr_report_outputs(nr_step *s, const nr_options *o);

/* --dump: writes DIR/param.NAME.pb for every param (its value after the
 * last run) and DIR/loss.pb for the loss, if the step has one. */
int nr_dump(nr_step *s, const nr_options *o);

/* ---- safetensors (novarun_st.c) ------------------------------------------ */

#define NR_ST_MAX_RANK (NOVA_MAX_RANK + 1) /* a --data tensor has one extra dimension */

/* One tensor of a safetensors file's header. */
typedef struct nr_st_tensor {
  const char *name;      /* borrowed from the header */
  nova_dtype dtype;
  int rank;
  int64_t shape[NR_ST_MAX_RANK];
  uint64_t begin, end;   /* data_offsets: bytes [begin, end) of the data section */
} nr_st_tensor;

/* An open safetensors file whose header passed nr_st_open's checks. */
typedef struct nr_st_file {
  const char *path;
  int fd;
  uint64_t data_start;   /* 8 + header length: where the data section begins */
  uint64_t data_size;    /* bytes from data_start to the end of the file */
  int ntensors;
  nr_st_tensor *tensors; /* [ntensors] owned, in header order */
  void *header;          /* owned: the parsed header (cJSON) */
} nr_st_file;

/* Opens PATH and checks its header: the length, the JSON, every entry
 * (dtype, shape, data_offsets matching dtype and shape, inside the data
 * section, no two overlapping), names unique, __metadata__ a map of
 * strings.  Returns 0, or 1 after a diagnostic (F then holds nothing). */
int nr_st_open(const char *path, nr_st_file *f);
void nr_st_close(nr_st_file *f);

/* The tensor of F named NAME, or NULL. */
const nr_st_tensor *nr_st_find(const nr_st_file *f, const char *name);

/* __metadata__[KEY] of F, or NULL.  Borrowed. */
const char *nr_st_metadata(const nr_st_file *f, const char *key);

/* Reads N bytes at OFFSET of F's data section into BUF; 0, or 1 after a
 * diagnostic. */
int nr_st_read(const nr_st_file *f, uint64_t offset, void *buf, size_t n);

/* One tensor to write. */
typedef struct nr_st_out {
  const char *name;
  nova_dtype dtype;
  int rank;
  const int64_t *shape;
  size_t nbytes;
  const void *data;
} nr_st_out;

/* Writes N tensors and the metadata (NMETA pairs KEYS[i] = VALUES[i]) to
 * PATH as a safetensors file, atomically: into a temporary file in the same
 * folder, fsync, rename over PATH.  Returns 0, or 1 after a diagnostic
 * (PATH is then unchanged). */
int nr_st_write(const char *path, int n, const nr_st_out *tensors, int nmeta, const char *const *keys,
                const char *const *values);

/* "F32", ... the safetensors name of DTYPE. */
const char *nr_st_dtype_name(nova_dtype dtype);

/* "f32 [2,3]" into BUF (N bytes), for ranks up to NR_ST_MAX_RANK. */
char *nr_type_str(char *buf, size_t n, nova_dtype dtype, int rank, const int64_t *shape);

/* ---- checkpoints (novarun_ckpt.c) ------------------------------------------ */

/* --load: checks every tensor of the checkpoint PATH against S's params
 * and opt_state, then binds them all; *STEP = the steps done recorded in
 * the file (0 if none).  Returns 0, or 1 after a diagnostic with S
 * unchanged. */
int nr_checkpoint_load(nr_step *s, const char *path, long long *step);

/* --save: writes every param and opt_state of S to PATH, with STEP as the
 * steps done.  Returns 0, or 1 after a diagnostic. */
int nr_checkpoint_save(nr_step *s, const char *path, long long step);

/* ---- batches (novarun_data.c) ---------------------------------------------- */

/* Where each step's inputs and labels come from with --data or --seed. */
typedef struct nr_batches nr_batches;

/* Checks O->data_path (or --seed) against S's inputs and labels; *B is
 * then ready for nr_batches_bind.  Returns 0, or 1 after a diagnostic. */
int nr_batches_create(nr_step *s, const nr_options *o, nr_batches **b);

/* Binds the batch of step STEP (1-based, counted over every run, loaded
 * checkpoints included) to S.  Returns 0, or 1 after a diagnostic. */
int nr_batches_bind(nr_batches *b, nr_step *s, long long step);
int nr_batches_count(const nr_batches *b); /* tensors bound per step */
uint64_t nr_batches_samples(const nr_batches *b); /* --data: the samples in the file (--seed: 0) */
int nr_batches_feeds(const nr_batches *b, const char *name); /* whether a batch binds NAME */
void nr_batches_destroy(nr_batches *b);

#endif
