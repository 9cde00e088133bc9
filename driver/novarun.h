/* novarun.h: what novarun.c (command line, loading, running) and
 * novarun_io.c (input and output tensors) share. */
#ifndef NOVA_NOVARUN_H
#define NOVA_NOVARUN_H

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
} nr_api;

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
  const char *training_option; /* first of --steps, --data, ... given: refused */
} nr_options;

/* A loaded, opened step. */
typedef struct nr_step {
  nr_api api;
  nova_step *step;
  const char *path;
} nr_step;

/* Prints "novarun: MESSAGE" on stderr; returns 1, the exit status of a
 * user error. */
int nr_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void nr_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reads and binds every input and label of S from O->inputs_dir; returns
 * 0 and the number bound in *NBOUND, or 1 after a diagnostic. */
int nr_bind_inputs(nr_step *s, const nr_options *o, int *nbound);

/* mkdir -p DIR; returns 0, or 1 after a diagnostic. */
int nr_make_dirs(const char *dir);

/* Reports every output and loss of S after a run: the summary on stderr
 * (unless quiet), values with --print, files in O->outputs_dir, which must
 * exist (nr_make_dirs).  Returns 0, or 1 after a diagnostic. */
int nr_report_outputs(nr_step *s, const nr_options *o);

/* --dump: writes DIR/param.NAME.pb for every param (its value after the
 * last run) and DIR/loss.pb for the loss, if the step has one. */
int nr_dump(nr_step *s, const nr_options *o);

#endif
