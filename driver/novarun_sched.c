/* novarun_sched.c: learning-rate schedules for novarun --steps.
 *
 * The step's learning rate is a run-time input (lr, a scalar with the
 * novac --lr value as its default), so a schedule is a value bound before
 * each step: nothing is recompiled.  With t the steps done before this one
 * (0 for the first; counted on from a loaded checkpoint), W the warm-up
 * steps, T the decay steps (--decay-steps, default the run's last step)
 * and p = min(1, (t - W) / max(1, T - W)):
 *   warm-up (t < W):  base * t / W    (the first step at 0, as the
 *                                      schedules of Hugging Face
 *                                      transformers start)
 *   constant:         base
 *   linear:           min + (base - min) (1 - p)
 *   cosine:           min + (base - min) (1 + cos(pi p)) / 2
 *                     (torch.optim.lr_scheduler.CosineAnnealingLR's
 *                     curve, eta_min = min, T_max = T - W)
 *   step:             base * gamma ^ floor((t - W) / step_size)
 *                     (StepLR's)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "novarun.h"

static const char *const kinds[] = {"", "constant", "linear", "cosine", "step"};

const char *nr_sched_name(const nr_sched *s) { return kinds[s->kind]; }

/* A number for OPT from V: finite, >= LO (and an integer when INTEGER). */
static int number(const char *opt, const char *v, double lo, int integer, double *out) {
  char *end;
  double x = strtod(v, &end);
  if (!nv_number_token(v) || end == v || *end || !isfinite(x) || x < lo || x > 1e15 || (integer && x != floor(x))) {
    fprintf(stderr, "novarun: %s needs %s %s %g, not '%s'\nTry 'novarun --help'.\n", opt,
            integer ? "an integer" : "a finite number", lo > 0 && !integer ? ">" : ">=", lo > 0 && !integer ? 0 : lo,
            v);
    return 2;
  }
  *out = x;
  return -1;
}

int nr_sched_option(const char *opt, const char *v, nr_sched *s) {
  double x = 0;
  int rc;
  if (!strcmp(opt, "--lr-schedule")) {
    for (int k = 1; k < (int)(sizeof kinds / sizeof *kinds); k++)
      if (!strcmp(v, kinds[k])) {
        s->kind = (nr_sched_kind)k;
        return -1;
      }
    fprintf(stderr, "novarun: --lr-schedule is constant, linear, cosine or step, not '%s'\nTry 'novarun --help'.\n", v);
    return 2;
  }
  if (!strcmp(opt, "--warmup")) {
    if ((rc = number(opt, v, 0, 1, &x)) >= 0) return rc;
    s->warmup = (long long)x;
  } else if (!strcmp(opt, "--min-lr")) {
    if ((rc = number(opt, v, 0, 0, &x)) >= 0) return rc;
    s->min_lr = x, s->min_lr_set = 1;
  } else if (!strcmp(opt, "--decay-steps")) {
    if ((rc = number(opt, v, 1, 1, &x)) >= 0) return rc;
    s->decay_steps = (long long)x;
  } else if (!strcmp(opt, "--step-size")) {
    if ((rc = number(opt, v, 1, 1, &x)) >= 0) return rc;
    s->step_size = (long long)x;
  } else if (!strcmp(opt, "--gamma")) {
    if ((rc = number(opt, v, 1e-300, 0, &x)) >= 0) return rc;
    s->gamma = x, s->gamma_set = 1;
  }
  return -1;
}

int nr_sched_check(nr_sched *s, long steps) {
  const char *why = NULL;
  if (!s->kind && (s->warmup || s->decay_steps)) s->kind = NR_SCHED_CONSTANT; /* --warmup alone */
  if (!s->kind && (s->min_lr_set || s->step_size || s->gamma_set))
    why = "--min-lr, --step-size and --gamma shape a --lr-schedule: name one";
  else if (s->kind && !steps)
    why = "a learning-rate schedule needs --steps N";
  else if (s->min_lr_set && s->kind != NR_SCHED_LINEAR && s->kind != NR_SCHED_COSINE)
    why = "--min-lr is the end of a linear or cosine schedule";
  else if ((s->step_size || s->gamma_set) && s->kind != NR_SCHED_STEP)
    why = "--step-size and --gamma belong to --lr-schedule=step";
  else if (s->kind == NR_SCHED_STEP && !s->step_size)
    why = "--lr-schedule=step needs --step-size N (and --gamma, default 0.1)";
  if (why) {
    fprintf(stderr, "novarun: %s\nTry 'novarun --help'.\n", why);
    return 2;
  }
  if (!s->gamma_set) s->gamma = 0.1;
  return -1;
}

double nr_sched_lr(const nr_sched *s, double base, long long t, long long total) {
  if (t < s->warmup) return base * (double)t / (double)s->warmup;
  long long T = s->decay_steps ? s->decay_steps : total;
  double span = (double)(T - s->warmup) > 1 ? (double)(T - s->warmup) : 1;
  double p = (double)(t - s->warmup) / span;
  if (p > 1) p = 1;
  switch (s->kind) {
  case NR_SCHED_LINEAR: return s->min_lr + (base - s->min_lr) * (1 - p);
  case NR_SCHED_COSINE: return s->min_lr + (base - s->min_lr) * 0.5 * (1 + cos(M_PI * p));
  case NR_SCHED_STEP: return base * pow(s->gamma, (double)((t - s->warmup) / s->step_size));
  default: return base;
  }
}
