/* novarun: loads a step.so written by novac, feeds it inputs (ONNX
 * TensorProto files, a safetensors data file or synthetic batches), runs it
 * once or trains it for N steps, and reports or writes its outputs.
 *
 *   novarun STEP.so [--inputs DIR | --data FILE | --seed N] [--steps N [--loss-log F]]
 *                   [--skip-nonfinite] [--max-overflow-steps K] [--lr F] [--load FILE]
 *                   [--save FILE] [--outputs DIR] [--dump DIR] [--repeat N] [--print] [--profile]
 *                   [--trace FILE] [--comm-timeout S] [-q]
 *
 * Exit status: 0 success, 1 user error (one `novarun: ...` line on
 * stderr), 2 bad usage.  See man/novarun.1.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "novarun.h"
#include "../support/util.h"

#ifndef NOVAC_VERSION
#define NOVAC_VERSION "unknown"
#endif

static const char usage_text[] =
    "usage: novarun STEP.so [--inputs DIR | --data FILE | --seed N] [--steps N [--loss-log F]]\n"
    "                       [--skip-nonfinite] [--max-overflow-steps K] [--lr F] [--load FILE]\n"
    "                       [--lr-schedule=KIND [--warmup N] [--min-lr F] [--decay-steps N]\n"
    "                       [--step-size N] [--gamma F]] [--log FILE]\n"
    "                       [--eval-data FILE [--eval-every N]]\n"
    "                       [--save FILE] [--outputs DIR] [--dump DIR] [--eval] [--repeat N]\n"
    "                       [--print] [--profile] [--trace FILE] [--comm-timeout S] [-q]\n"
    "       novarun -h | --help | --version\n"
    "\n"
    "Runs a step compiled by novac once (or N times), or trains it for N steps,\n"
    "and reports its outputs.\n"
    "\n"
    "  --inputs DIR   read each input and label from DIR/input_K.pb (K-th in the\n"
    "                 step's order) or DIR/NAME.pb\n"
    "  --data FILE    batches from a safetensors file: for an input [B,...] of the\n"
    "                 step, a tensor of the same name [S,...] of S samples; step k\n"
    "                 takes samples (k-1)*B .. k*B-1, wrapping around modulo S (a\n"
    "                 data-parallel step on N ranks: of the N*B samples from (k-1)*N*B,\n"
    "                 rank r takes r, r+N, ...)\n"
    "  --seed N       synthetic batches from seed N (0 to 2^64-1): standard normal\n"
    "                 floats, uniform indices below each index input's bound; also\n"
    "                 the seed of the step's dropout (rng.seed), and only that with\n"
    "                 --inputs or --data\n"
    "  --outputs DIR  write outputs and losses to DIR/output_K.pb (DIR is created)\n"
    "  --dump DIR     after the last run, write DIR/param.NAME.pb for every parameter\n"
    "                 (buffer.NAME.pb for every buffer)\n"
    "                 and DIR/loss.pb for the loss, if any (DIR is created)\n"
    "  --repeat N     run N times and report the median time per run (default 1)\n"
    "  --dim NAME=N   a step compiled for several sizes (novac --dim=NAME=LO..HI):\n"
    "                 run it at size N (--data and --seed make batches of that\n"
    "                 size; --inputs files give theirs; default the largest)\n"
    "  --steps N      train: run a training step N times (a new batch each step with\n"
    "                 --data or --seed), with a progress line (step, loss,\n"
    "                 samples/s, ETA)\n"
    "  --max-overflow-steps K  with --steps, a step compiled with loss scaling (novac\n"
    "                 --precision=fp16): a step that overflows is skipped and halves\n"
    "                 the loss scale; K+1 overflows in a row end the run (exit 1,\n"
    "                 nothing saved; default 20)\n"
    "  --skip-nonfinite  with --steps: a step whose loss or gradients are NaN or\n"
    "                 infinite (it updates nothing) is counted and skipped, and\n"
    "                 training goes on; without it such a step ends the run (exit 1;\n"
    "                 --save still writes the last good parameters)\n"
    "  --lr F         bind the training step's learning rate (default: novac --lr)\n"
    "  --loss-log F   with --steps: write 'STEP LOSS' for every step to F\n"
    ;
/* (two strings: ISO C promises 4095 characters a literal) */
static const char usage_text2[] =
    "  --lr-schedule=constant|linear|cosine|step  with --steps: the learning rate of each\n"
    "                 step, from --lr (or the step's): after --warmup N steps rising\n"
    "                 from 0, constant, or decaying linearly or as a cosine to --min-lr F\n"
    "                 (default 0) at --decay-steps N (default the run's last step), or\n"
    "                 times --gamma F (default 0.1) every --step-size N steps\n"
    "  --accumulate K bind the runs per update of a step compiled with novac --accumulate\n"
    "                 (--steps counts runs: micro-batches; schedules count updates)\n"
    "  --clip-grad-norm F  bind the step's gradient clipping norm (a step compiled with\n"
    "                 novac --clip-grad-norm)\n"
    "  --log FILE     with --steps: a JSON line per step (step, loss, lr, grad_norm,\n"
    "                 samples_per_s, elapsed_s, skipped) and per evaluation (eval_loss,\n"
    "                 eval_accuracy)\n"
    "  --eval-data FILE  with --steps: after the last step (and every --eval-every N\n"
    "                 steps), the evaluation entry over FILE's whole batches (safetensors,\n"
    "                 as --data): mean loss, and accuracy for a classifier\n"
    "  --load FILE    before the first step, restore every parameter and optimizer\n"
    "                 state from a safetensors checkpoint; steps count on from it\n"
    "  --save FILE    after the last step, write every parameter and optimizer state\n"
    "                 to FILE, a safetensors checkpoint (atomically)\n"
    "  --eval         run the training step's evaluation entry (the forward pass with\n"
    "                 the current parameters, BatchNormalization's running statistics,\n"
    "                 nothing updated) instead of a run, or once after --steps N;\n"
    "                 its loss and outputs are reported\n"
    "  --print        print the first values and min/max/mean of each output\n"
    "  --profile      (--target=cuda steps) time every kernel launch of the last run\n"
    "                 with CUDA events and print them, the slowest first\n"
    "  --trace FILE   write a Chrome/Perfetto trace (JSON) of the runs: each run and\n"
    "                 parallel loop nest on a compute track, each gradient bucket's\n"
    "                 all-reduce on a communication track, one process per rank; the\n"
    "                 summary says how much of the all-reduces was hidden\n"
    "  --comm-timeout S  a data-parallel step launched by mpirun: a gradient\n"
    "                 all-reduce not done within S seconds (a rank stopped or hangs)\n"
    "                 ends the job, naming the ranks missing (default 300)\n"
    "  -q             no summary on stderr\n"
    "  -h, --help     this help;  --version  the version\n"
    "\n"
    "Exit status: 0 success, 1 error (bad step.so, input or run), 2 bad usage.\n";

int nr_rank = -1; /* >= 0: this process's rank in a world of several */

static void nr_prefix(const char *what) {
  if (nr_rank >= 0) fprintf(stderr, "novarun: rank %d: %s", nr_rank, what);
  else fprintf(stderr, "novarun: %s", what);
}

int nr_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nr_prefix("");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

void nr_warning(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nr_prefix("warning: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ---- command line -------------------------------------------------------- */

/* Prints "novarun: MESSAGE" and a pointer to --help; returns 2, the exit
 * status of bad usage. */
__attribute__((format(printf, 1, 2))) static int nr_usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("novarun: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\nTry 'novarun --help'.\n", stderr);
  va_end(ap);
  return 2;
}

/* Options that take a value: VALUE of "--opt VALUE" or "--opt=VALUE" at
 * ARGV[*I] (advancing *I past it), or NULL if ARGV[*I] is not OPT. */
static const char *nr_option_value(int argc, char **argv, int *i, const char *opt, int *missing) {
  size_t n = strlen(opt);
  const char *a = argv[*i];
  if (strncmp(a, opt, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != '\0') return NULL;
  if (*i + 1 >= argc) {
    *missing = 1;
    return NULL;
  }
  return argv[++*i];
}

/* --repeat keeps every time to take the median: at most 80 MB of them. */
#define NR_MAX_REPEAT 10000000L

/* Parses one option at ARGV[*I] into O.  Returns -1 to go on, else the
 * exit status. */
static int nr_parse_option(int argc, char **argv, int *i, nr_options *o) {
  const char *a = argv[*i], *v;
  int missing = 0;
  if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
    fputs(usage_text, stdout);
    fputs(usage_text2, stdout);
    return 0;
  }
  if (!strcmp(a, "--version")) {
    printf("novarun %s\n", NOVAC_VERSION);
    return 0;
  }
  if (!strcmp(a, "--print")) {
    o->print = 1;
    return -1;
  }
  if (!strcmp(a, "--profile")) {
    o->profile = 1;
    return -1;
  }
  if (!strcmp(a, "--eval")) {
    o->eval = 1;
    return -1;
  }
  if (!strcmp(a, "--skip-nonfinite")) {
    o->skip_nonfinite = 1;
    return -1;
  }
  if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
    o->quiet = 1;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--inputs", &missing))) {
    o->inputs_dir = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--outputs", &missing))) {
    o->outputs_dir = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--steps", &missing))) {
    char *end;
    errno = 0;
    o->steps = strtol(v, &end, 10);
    if (errno || !nv_number_token(v) || end == v || *end || o->steps < 1 || o->steps > NR_MAX_REPEAT)
      return nr_usage_error("--steps needs an integer from 1 to %ld, not '%s'", NR_MAX_REPEAT, v);
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--max-overflow-steps", &missing))) {
    char *end;
    errno = 0;
    o->max_overflow = strtol(v, &end, 10);
    if (errno || !nv_number_token(v) || end == v || *end || o->max_overflow < 0 || o->max_overflow > NR_MAX_REPEAT)
      return nr_usage_error("--max-overflow-steps needs an integer from 0 to %ld, not '%s'", NR_MAX_REPEAT, v);
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--trace", &missing))) {
    o->trace_path = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--comm-timeout", &missing))) {
    char *end;
    errno = 0;
    o->comm_timeout = strtol(v, &end, 10);
    if (errno || !nv_number_token(v) || end == v || *end || o->comm_timeout < 1 || o->comm_timeout > 1000000)
      return nr_usage_error("--comm-timeout needs a number of seconds from 1 to 1000000, not '%s'", v);
    return -1;
  }
  static const char *const sched_opts[] = {"--lr-schedule", "--warmup", "--min-lr", "--decay-steps", "--step-size",
                                           "--gamma"};
  for (size_t k = 0; k < sizeof sched_opts / sizeof *sched_opts; k++)
    if ((v = nr_option_value(argc, argv, i, sched_opts[k], &missing))) return nr_sched_option(sched_opts[k], v, &o->sched);
  if ((v = nr_option_value(argc, argv, i, "--dim", &missing))) {
    const char *eq = strchr(v, '=');
    char *end;
    errno = 0;
    o->size = eq ? strtoll(eq + 1, &end, 10) : 0;
    if (!eq || eq == v || eq - v >= (long)sizeof o->size_dim || errno || !nv_number_token(eq + 1) || *end ||
        o->size < 1)
      return nr_usage_error("--dim takes NAME=N with N a positive integer (the size of each run of a step "
                            "compiled for several), not '%s'", v);
    snprintf(o->size_dim, sizeof o->size_dim, "%.*s", (int)(eq - v), v);
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--accumulate", &missing))) {
    char *end;
    errno = 0;
    o->accumulate = strtol(v, &end, 10);
    if (errno || !nv_number_token(v) || end == v || *end || o->accumulate < 1 || o->accumulate > 1000000)
      return nr_usage_error("--accumulate needs a number of runs from 1 to 1000000, not '%s'", v);
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--clip-grad-norm", &missing))) {
    char *end;
    o->clip = strtod(v, &end);
    if (!nv_number_token(v) || end == v || *end || !(o->clip > 0) || !isfinite(o->clip))
      return nr_usage_error("--clip-grad-norm needs a finite number > 0, not '%s'", v);
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--log", &missing))) {
    o->log_path = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--eval-data", &missing))) {
    o->eval_data = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--eval-every", &missing))) {
    char *end;
    errno = 0;
    o->eval_every = strtol(v, &end, 10);
    if (errno || !nv_number_token(v) || end == v || *end || o->eval_every < 1 || o->eval_every > NR_MAX_REPEAT)
      return nr_usage_error("--eval-every needs a number of steps from 1 to %ld, not '%s'", NR_MAX_REPEAT, v);
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--loss-log", &missing))) {
    o->loss_log = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--lr", &missing))) {
    char *end;
    o->lr = strtod(v, &end);
    if (!nv_number_token(v) || end == v || *end || !(o->lr >= 0) || o->lr > 1e9) return nr_usage_error("--lr needs a number >= 0, not '%s'", v);
    o->lr_set = 1;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--dump", &missing))) {
    o->dump_dir = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--data", &missing))) {
    o->data_path = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--seed", &missing))) {
    char *end;
    errno = 0;
    o->seed = strtoull(v, &end, 10);
    if (errno || end == v || *end || !(*v >= '0' && *v <= '9'))
      return nr_usage_error("--seed needs an integer from 0 to 18446744073709551615, not '%s'", v);
    o->seed_set = 1;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--save", &missing))) {
    o->save_path = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--load", &missing))) {
    o->load_path = v;
    return -1;
  }
  if ((v = nr_option_value(argc, argv, i, "--repeat", &missing))) {
    char *end;
    errno = 0;
    o->repeat = strtol(v, &end, 10);
    if (errno || !nv_number_token(v) || end == v || *end || o->repeat < 1 || o->repeat > NR_MAX_REPEAT)
      return nr_usage_error("--repeat needs an integer from 1 to %ld, not '%s'", NR_MAX_REPEAT, v);
    return -1;
  }
  if (missing) return nr_usage_error("option '%s' needs a value", a);
  return nr_usage_error("unknown option '%s'", a);
}

/* Fills O from the command line.  Returns -1 to go on, else the exit
 * status (0 after --help or --version). */
static int nr_parse_args(int argc, char **argv, nr_options *o) {
  int only_files = 0;
  memset(o, 0, sizeof *o);
  o->repeat = 1;
  o->max_overflow = 20;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!only_files && !strcmp(a, "--")) {
      only_files = 1;
    } else if (!only_files && a[0] == '-' && a[1] != '\0') {
      int rc = nr_parse_option(argc, argv, &i, o);
      if (rc >= 0) return rc;
    } else if (o->step_path) {
      return nr_usage_error("more than one step.so given ('%s')", a);
    } else {
      o->step_path = a;
    }
  }
  if (!o->step_path) return nr_usage_error("no step.so given");
  if (o->skip_nonfinite && !o->steps) return nr_usage_error("--skip-nonfinite needs --steps N%s", "");
  int rc = nr_sched_check(&o->sched, o->steps);
  if (rc >= 0) return rc;
  if ((o->log_path || o->eval_every || o->eval_data) && !o->steps)
    return nr_usage_error("--log, --eval-data and --eval-every go with --steps N%s", "");
  if (o->eval_every && !o->eval_data) return nr_usage_error("--eval-every N needs --eval-data FILE%s", "");
  if (o->inputs_dir && o->data_path) /* with one of them, --seed seeds only the step's dropout */
    return nr_usage_error("--inputs and --data both give the batch; give one of them%s", "");
  return -1;
}

/* ---- loading ------------------------------------------------------------- */

/* dlsym into a function pointer without the object/function pointer cast
 * ISO C leaves undefined: FN points at the function pointer to fill. */
static int nr_sym(void *handle, const char *name, void *fn, size_t fn_size) {
  void *sym = dlsym(handle, name);
  if (!sym || fn_size != sizeof sym) return 0;
  memcpy(fn, &sym, fn_size);
  return 1;
}
#define NR_SYM(api, field, name) nr_sym((api)->handle, name, &(api)->field, sizeof (api)->field)

/* The manifest novac writes beside PATH (step.so -> step.json), when there is
 * one and it records the .so's size and FNV-1a: PATH must match it, else the
 * two come from different compiles (a compile killed between its two
 * renames, or one file copied without the other) and the step is refused. */
static int nr_check_manifest(const char *path) {
  char man[4096];
  size_t n = strlen(path);
  if (n > 3 && !strcmp(path + n - 3, ".so")) n -= 3;
  if (snprintf(man, sizeof man, "%.*s.json", (int)n, path) >= (int)sizeof man) return 0;
  size_t len = 0;
  char *text = nv_read_file(man, &len, (size_t)1 << 30);
  if (!text && errno == ENOENT) return 0; /* no manifest: nothing to check */
  if (!text) return nr_error("%s: cannot read its manifest %s: %s", path, man, strerror(errno));
  nv_json_oom_take();
  cJSON *root = cJSON_Parse(text);
  free(text);
  if (!root)
    return nr_error("%s: its manifest %s %s", path, man,
                    nv_json_oom_take() ? "cannot be read: out of memory" : "is not valid JSON");
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "step_so");
  const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(so, "bytes");
  const cJSON *fnv = cJSON_GetObjectItemCaseSensitive(so, "fnv1a64");
  int rc = 0;
  if (cJSON_IsNumber(bytes) && cJSON_IsString(fnv)) {
    uint64_t size = 0, hash = 0;
    char hex[17];
    if (nv_file_fnv(path, &size, &hash)) rc = nr_error("%s: %s", path, strerror(errno));
    else if (snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash),
             (double)size != bytes->valuedouble || strcmp(hex, fnv->valuestring))
      rc = nr_error("%s does not match its manifest %s (%llu bytes, checksum %s; the manifest records %.0f bytes, "
                    "checksum %s): the two come from different compiles; compile the model again",
                    path, man, (unsigned long long)size, hex, bytes->valuedouble, fnv->valuestring);
  }
  cJSON_Delete(root);
  return rc;
}

/* dlopens PATH (a bare file name is taken from the current directory, not
 * the library search path) and finds every ABI function. */
static int nr_load(const char *path, nr_api *api) {
  char buf[4096];
  const char *p = path;
  if (!strchr(path, '/')) {
    if (snprintf(buf, sizeof buf, "./%s", path) >= (int)sizeof buf) return nr_error("%s: path too long", path);
    p = buf;
  }
  if (access(p, F_OK) != 0) return nr_error("%s: %s", path, strerror(errno));
  if (nr_check_manifest(path)) return 1;
  memset(api, 0, sizeof *api);
  char why[256];
  if (nr_check_elf(p, why, sizeof why)) return nr_error("cannot load step '%s': %s", path, why);
  api->handle = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  if (!api->handle) return nr_error("cannot load step '%s': %s", path, dlerror());
  int ok = NR_SYM(api, open, "nova_step_open") && NR_SYM(api, close, "nova_step_close") &&
           NR_SYM(api, num_tensors, "nova_step_num_tensors") && NR_SYM(api, tensor, "nova_step_tensor") &&
           NR_SYM(api, bind, "nova_step_bind") && NR_SYM(api, run, "nova_step_run") &&
           NR_SYM(api, get, "nova_step_get") && NR_SYM(api, error, "nova_step_error");
  /* optional: a step.so from before it has no graph hash to report */
  if (!NR_SYM(api, graph_hash, "nova_step_graph_hash")) api->graph_hash = NULL;
  if (!NR_SYM(api, eval, "nova_step_eval")) api->eval = NULL;
  if (!NR_SYM(api, world, "nova_step_world") || !NR_SYM(api, all_sum, "nova_step_all_sum")) api->world = NULL;
  if (!NR_SYM(api, trace_start, "nova_step_trace_start") || !NR_SYM(api, trace_write, "nova_step_trace_write"))
    api->trace_start = NULL;
  if (!NR_SYM(api, sizes, "nova_step_sizes") || !NR_SYM(api, set_size, "nova_step_set_size")) api->sizes = NULL;
  if (!NR_SYM(api, last_run_ms, "nova_step_last_run_ms")) api->last_run_ms = NULL;
  if (!NR_SYM(api, target, "nova_step_target")) api->target = NULL;
  if (!NR_SYM(api, set_profiling, "nova_step_set_profiling") || !NR_SYM(api, num_launches, "nova_step_num_launches") ||
      !NR_SYM(api, launch, "nova_step_launch"))
    api->set_profiling = NULL;
  if (!ok) {
    dlclose(api->handle);
    api->handle = NULL;
    return nr_error("'%s' is not a step.so written by novac (it lacks the nova_step_* functions)", path);
  }
  return 0;
}

static int nr_open(nr_step *s, const char *path) {
  memset(s, 0, sizeof *s);
  s->path = path;
  if (nr_load(path, &s->api)) return 1;
  nova_status st = s->api.open(&s->step);
  if (st == NOVA_OK) return 0;
  return nr_error("%s: cannot open the step: %s", path,
                  s->step ? s->api.error(s->step) : st == NOVA_ERR_NO_MEMORY ? "out of memory" : "failed");
}

static void nr_close(nr_step *s) {
  if (s->step) s->api.close(s->step);
  if (s->api.handle) dlclose(s->api.handle);
  s->step = NULL;
  s->api.handle = NULL;
}

/* ---- running ------------------------------------------------------------- */

static double nr_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int nr_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double nr_median(double *t, long n) {
  qsort(t, (size_t)n, sizeof *t, nr_cmp_double);
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* Runs S O->repeat times; *MEDIAN = the median seconds per run, *DEVICE =
 * the median of the step's own device time in ms (CUDA events), or -1. */
static int nr_run(nr_step *s, const nr_options *o, double *median, double *device) {
  double *t = malloc(2 * (size_t)o->repeat * sizeof *t), *dev = t + o->repeat;
  if (!t) return nr_error("out of memory for %ld timings", o->repeat);
  for (long r = 0; r < o->repeat; r++) {
    double start = nr_now();
    if ((o->eval ? s->api.eval : s->api.run)(s->step) != NOVA_OK) {
      free(t);
      return nr_error("%s: %s failed: %s", s->path, o->eval ? "evaluation" : "run", s->api.error(s->step));
    }
    t[r] = nr_now() - start;
    dev[r] = s->api.last_run_ms ? s->api.last_run_ms(s->step) : -1;
  }
  *median = nr_median(t, o->repeat);
  *device = nr_median(dev, o->repeat);
  free(t);
  return 0;
}

/* --profile: each kernel of the last run, its launches and time, the
 * slowest first. */
static void nr_print_profile(nr_step *s) {
  int n = s->api.num_launches(s->step), nk = 0;
  struct { const char *name; int count; double ms; } *k = calloc((size_t)(n ? n : 1), sizeof *k);
  double total = 0;
  for (int i = 0; k && i < n; i++) {
    const char *name;
    double ms;
    if (s->api.launch(s->step, i, &name, &ms) != NOVA_OK || ms < 0) continue;
    int j = 0;
    while (j < nk && strcmp(k[j].name, name)) j++;
    if (j == nk) k[nk++].name = name;
    k[j].count++;
    k[j].ms += ms;
    total += ms;
  }
  for (int i = 1; k && i < nk; i++) /* insertion sort, slowest first */
    for (int j = i; j > 0 && k[j].ms > k[j - 1].ms; j--) {
      __typeof__(*k) x = k[j];
      k[j] = k[j - 1];
      k[j - 1] = x;
    }
  fprintf(stderr, "novarun: profile of the last run: %d launches, %.3f ms in kernels\n", n, total);
  fprintf(stderr, "  %-12s %8s %12s %7s\n", "kernel", "launches", "ms", "share");
  for (int i = 0; k && i < nk; i++)
    fprintf(stderr, "  %-12s %8d %12.4f %6.1f%%\n", k[i].name, k[i].count, k[i].ms, total > 0 ? 100 * k[i].ms / total : 0);
  free(k);
}

/* The value of the scalar state tensor NAME (f32 or i64), or NAN when the
 * step has none: the loss scale "amp.loss_scale" of an fp16 step. */
static double nr_state_scalar(nr_step *s, const char *name) {
  const void *data;
  nova_tensor_info info;
  if (s->api.get(s->step, name, &data, &info) != NOVA_OK || info.rank != 0) return NAN;
  return info.dtype == NOVA_DTYPE_F32 ? *(const float *)data : info.dtype == NOVA_DTYPE_I64 ? (double)*(const int64_t *)data : NAN;
}

/* The step's loss, or NULL. */
static const float *nr_loss(nr_step *s, nova_dtype *dt) {
  nova_tensor_info info;
  int n = s->api.num_tensors(s->step);
  for (int i = 0; i < n; i++) {
    const void *data;
    if (s->api.tensor(s->step, i, &info) == NOVA_OK && info.role == NOVA_ROLE_LOSS &&
        s->api.get(s->step, info.name, &data, &info) == NOVA_OK) {
      *dt = info.dtype;
      return data;
    }
  }
  return NULL;
}

/* A step with a non-finite loss or gradients (NOVA_ERR_NONFINITE, LOSS the
 * loss it computed): "step N: non-finite loss; parameters unchanged (WHY)",
 * WHY from the step's message, or with novac --nonfinite=skip-param and a
 * finite loss "...; K of N parameters kept their values, the others were
 * updated (WHY)"; a warning when SKIPPING, else an error.  Returns whether
 * the step updated some parameters. */
static int nr_nonfinite(const char *msg, long long step, double loss, int skipping) {
  const char *what = isfinite(loss) ? "gradients" : "loss";
  char why[512] = "", effect[256] = "parameters unchanged";
  const char *p = strstr(msg, "non-finite gradients: "), *end = p ? strchr(p, ';') : NULL;
  const char *part = strstr(msg, "parameters kept their values");
  if (!isfinite(loss)) snprintf(why, sizeof why, " (the loss is %s)", isnan(loss) ? "NaN" : loss > 0 ? "+inf" : "-inf");
  else if (p && end) snprintf(why, sizeof why, " (%.*s)", (int)(end - p - 22), p + 22);
  if (part) { /* "K of N parameters kept their values (their updates skipped), the others were updated" */
    const char *k = part;
    while (k > msg && k[-1] != ';') k--;
    while (*k == ' ') k++;
    int kk = 0, n = 0;
    if (sscanf(k, "%d of %d", &kk, &n) == 2)
      snprintf(effect, sizeof effect, "%d of %d parameters kept their values, the others were updated", kk, n);
  }
  if (skipping) nr_warning("step %lld: non-finite %s; %s%s%s", step, what, effect, part ? "" : ", step skipped", why);
  else nr_error("step %lld: non-finite %s; %s%s", step, what, effect, why);
  return part != NULL;
}

/* A JSON number, or null where V is not finite. */
static void nr_json_num(FILE *f, const char *key, double v) {
  if (isfinite(v)) fprintf(f, ", \"%s\": %.9g", key, v);
  else fprintf(f, ", \"%s\": null", key);
}

/* The accuracy of the current outputs of a classifier: an integer label L
 * of rank r and a float output of rank r + 1 whose first r dims are L's
 * (the argmax over its last dim against the label; labels outside
 * [0, C), an ignore_index, not counted).  *RIGHT and *COUNTED, or 0 when
 * the step is no classifier. */
static int nr_accuracy(nr_step *s, double *right, double *counted) {
  nova_tensor_info lab = {0}, out = {0}, info;
  int n = s->api.num_tensors(s->step), nl = 0;
  for (int i = 0; i < n; i++)
    if (s->api.tensor(s->step, i, &info) == NOVA_OK && info.role == NOVA_ROLE_LABEL &&
        (info.dtype == NOVA_DTYPE_I64 || info.dtype == NOVA_DTYPE_I32))
      lab = info, nl++;
  if (nl != 1) return 0;
  for (int i = 0; i < n && !out.name; i++) {
    if (s->api.tensor(s->step, i, &info) != NOVA_OK || info.role != NOVA_ROLE_OUTPUT || info.dtype != NOVA_DTYPE_F32 ||
        info.rank != lab.rank + 1)
      continue;
    int same = 1;
    for (int d = 0; d < lab.rank; d++) same &= info.shape[d] == lab.shape[d];
    if (same) out = info;
  }
  const void *lp, *op;
  if (!out.name || s->api.get(s->step, lab.name, &lp, &lab) != NOVA_OK ||
      s->api.get(s->step, out.name, &op, &out) != NOVA_OK)
    return 0;
  int64_t c = out.shape[out.rank - 1], rows = 1;
  for (int d = 0; d < lab.rank; d++) rows *= lab.shape[d];
  const float *o = op;
  for (int64_t r = 0; r < rows; r++) {
    int64_t y = lab.dtype == NOVA_DTYPE_I64 ? ((const int64_t *)lp)[r] : ((const int32_t *)lp)[r];
    if (y < 0 || y >= c) continue;
    int64_t best = 0;
    for (int64_t k = 1; k < c; k++)
      if (o[r * c + k] > o[r * c + best]) best = k;
    *right += best == y;
    *counted += 1;
  }
  return 1;
}

/* The evaluation entry over the first N whole batches of EB (the held-out
 * file): *LOSS their mean loss, *ACC the accuracy (NaN: no classifier). */
static int nr_eval_pass(nr_step *s, nr_batches *eb, long n, double *loss, double *acc) {
  double sum = 0, acc_v[2] = {0, 0};
  int classifier = 0;
  for (long j = 1; j <= n; j++) {
    if (nr_batches_bind(eb, s, j)) return 1;
    if (s->api.eval(s->step) != NOVA_OK) return nr_error("%s: evaluation failed: %s", s->path, s->api.error(s->step));
    nova_dtype dt = NOVA_DTYPE_F32;
    const void *lp = nr_loss(s, &dt);
    sum += !lp ? 0 : dt == NOVA_DTYPE_F64 ? *(const double *)lp : *(const float *)lp;
    classifier = nr_accuracy(s, &acc_v[0], &acc_v[1]);
  }
  double tot[3] = {sum / (double)n, acc_v[0], acc_v[1]};
  if (s->world > 1) { /* every rank's share of each batch */
    if (s->api.all_sum(s->step, tot, 3) != NOVA_OK) return nr_error("%s: evaluation: %s", s->path, s->api.error(s->step));
    tot[0] /= s->world;
  }
  *loss = tot[0];
  *acc = classifier && tot[2] > 0 ? tot[1] / tot[2] : NAN;
  return 0;
}

/* --steps: runs the step N times, with a progress line: step, loss,
 * samples/s, ETA; updated in place on a terminal.  Steps are numbered on
 * from START (the steps a loaded checkpoint had done); B, if not NULL,
 * binds each step's batch, else every step runs on the bound inputs.
 * *DONE = the steps done after it (skipped ones included).  A step that
 * reports NOVA_ERR_NONFINITE changed nothing (or, compiled with novac
 * --nonfinite=skip-param, no parameter whose gradient was not finite):
 * with --skip-nonfinite it is counted and training goes on, else training
 * stops there with *DONE at the last step whose updates the state holds and
 * *KEEP = 1 (the state holds no non-finite value: good to save). */
/* What nr_train adds around the steps: the JSON log, the held-out batches
 * (NEVAL of them), the schedule's base rate (BASE_LR; has_lr: the step
 * takes a run-time lr). */
typedef struct nr_loop {
  FILE *jl;
  nr_batches *eb;
  long neval;
  double base_lr;
  int has_lr;
  int has_norm; /* the step reports grad_norm (novac --clip-grad-norm) */
  long long accum; /* runs per update (novac --accumulate; 1: every run updates) */
  int64_t batch;   /* samples per run (the first batched input's rows; 0: none) */
} nr_loop;

/* After step STEP (the K-th of the run): the evaluation when it is due. */
static int nr_maybe_eval(nr_step *s, const nr_options *o, nr_loop *L, long k, long long step) {
  if (!L->eb || (k != o->steps && (!o->eval_every || k % o->eval_every))) return 0;
  double loss, acc;
  if (nr_eval_pass(s, L->eb, L->neval, &loss, &acc)) return 1;
  if (!o->quiet) {
    fprintf(stderr, "%snovarun: step %lld: eval loss %.6f", isatty(2) ? "\n" : "", step, loss);
    if (isfinite(acc)) fprintf(stderr, "  accuracy %.4f", acc);
    fprintf(stderr, " (%ld batches of %s)\n", L->neval, o->eval_data);
  }
  if (L->jl) {
    fprintf(L->jl, "{\"step\": %lld", step);
    nr_json_num(L->jl, "eval_loss", loss);
    if (isfinite(acc)) nr_json_num(L->jl, "eval_accuracy", acc);
    fprintf(L->jl, ", \"eval_batches\": %ld}\n", L->neval);
    fflush(L->jl);
  }
  return 0;
}

static int nr_train_steps(nr_step *s, const nr_options *o, nr_batches *b, long long start, long long *done, int *keep,
                          nr_loop *L) {
  nova_dtype dt = NOVA_DTYPE_F32;
  int tty = isatty(2), every = o->steps > 20 ? (int)(o->steps / 20) : 1;
  int64_t batch = L->batch;
  if (!nr_loss(s, &dt))
    return nr_error("%s: --steps needs a training step (compiled with novac --train); this step has no loss", s->path);
  FILE *log = o->loss_log ? fopen(o->loss_log, "w") : NULL;
  if (o->loss_log && !log) return nr_error("%s: %s", o->loss_log, strerror(errno));
  double t0 = nr_now(), first = 0, last = 0;
  long skipped = 0, good = 0, overflows = 0;
  int scaled = !isnan(nr_state_scalar(s, "amp.loss_scale")); /* dynamic loss scaling: overflows are skipped */
  for (long k = 1; k <= o->steps; k++) {
    long long step = start + k;
    if (b && nr_batches_bind(b, s, step)) {
      if (log) fclose(log);
      return 1;
    }
    double lr_now = NAN;
    if (o->sched.kind) { /* this step's learning rate */
      lr_now = nr_sched_lr(&o->sched, L->base_lr, (step - 1) / L->accum, (start + o->steps) / L->accum);
      float f = (float)lr_now;
      if (s->api.bind(s->step, "lr", NOVA_DTYPE_F32, 0, NULL, &f) != NOVA_OK) {
        if (log) fclose(log);
        return nr_error("%s: --lr-schedule: %s", s->path, s->api.error(s->step));
      }
    } else if (L->jl && L->has_lr)
      lr_now = nr_state_scalar(s, "lr");
    nova_status st = s->api.run(s->step);
    char why[600] = ""; /* the step's message (reading the loss replaces it) */
    if (st == NOVA_ERR_NONFINITE) snprintf(why, sizeof why, "%s", s->api.error(s->step));
    if (st != NOVA_OK && st != NOVA_ERR_NONFINITE) {
      if (log) fclose(log);
      return nr_error("%s: step %lld failed: %s", s->path, step, s->api.error(s->step));
    }
    const void *lp = nr_loss(s, &dt);
    double loss = !lp ? 0 : dt == NOVA_DTYPE_F64 ? *(const double *)lp : *(const float *)lp;
    if (s->world > 1) { /* the loss of the global batch: the mean of the ranks' (equal shares) */
      if (s->api.all_sum(s->step, &loss, 1) != NOVA_OK) {
        if (log) fclose(log);
        return nr_error("%s: step %lld: %s", s->path, step, s->api.error(s->step));
      }
      loss /= s->world;
    }
    if (log) fprintf(log, "%lld %.9g\n", step, loss);
    if (L->jl) {
      fprintf(L->jl, "{\"step\": %lld", step);
      nr_json_num(L->jl, "loss", loss);
      if (L->has_lr) nr_json_num(L->jl, "lr", lr_now);
      double gn = nr_state_scalar(s, "grad_norm");
      if (!isnan(gn) || L->has_norm) nr_json_num(L->jl, "grad_norm", gn);
      if (st == NOVA_ERR_NONFINITE) fprintf(L->jl, ", \"skipped\": true");
      else if (L->accum > 1) fprintf(L->jl, ", \"update\": %s", nr_state_scalar(s, "accum.count") == 0 ? "true" : "false");
      double el = nr_now() - t0;
      nr_json_num(L->jl, "samples_per_s", el > 0 ? (double)k * (double)(batch ? batch : 1) * s->world / el : NAN);
      nr_json_num(L->jl, "elapsed_s", el);
      fprintf(L->jl, "}\n");
    }
    if (st == NOVA_ERR_NONFINITE && scaled) { /* an overflow: the step halved its loss scale */
      skipped++;
      *done = step;
      if (++overflows > o->max_overflow) {
        if (log) fclose(log);
        *keep = 0; /* nothing saved over a good checkpoint */
        return nr_error("step %lld: the loss or gradients overflowed in %ld consecutive steps, down to loss scale %g: "
                        "not an fp16 range problem (a diverged run, or a NaN in the data?); nothing saved",
                        step, overflows, nr_state_scalar(s, "amp.loss_scale") * 2);
      }
      if (nr_maybe_eval(s, o, L, k, step)) {
        if (log) fclose(log);
        return 1;
      }
      continue;
    }
    overflows = 0;
    if (st == NOVA_ERR_NONFINITE) {
      if (!o->skip_nonfinite) {
        if (log) fclose(log);
        int partial = nr_nonfinite(why, step, loss, 0);
        *done = partial ? step : step - 1; /* the state is that after step (partly) or before it */
        *keep = 1;
        return 1;
      }
      if (!o->quiet && skipped < 10) nr_nonfinite(why, step, loss, 1);
      if (!o->quiet && skipped == 9) nr_warning("(further skipped steps are counted, not shown)");
      skipped++;
      *done = step;
      if (nr_maybe_eval(s, o, L, k, step)) {
        if (log) fclose(log);
        return 1;
      }
      continue;
    }
    if (!good++) first = loss;
    last = loss;
    *done = step;
    if (!isfinite(loss)) {
      if (log) fclose(log);
      return nr_error("step %lld: the loss is %g; training diverged (lower --lr?)", step, loss);
    }
    if (!o->quiet && (tty || k == 1 || k % every == 0 || k == o->steps)) {
      double el = nr_now() - t0, rate = el > 0 ? (double)k * (double)(batch ? batch : 1) * s->world / el : 0;
      char sc[48] = "";
      if (scaled) snprintf(sc, sizeof sc, "  scale %g", nr_state_scalar(s, "amp.loss_scale"));
      fprintf(stderr, "%sstep %lld/%lld  loss %.6f%s  %.0f samples/s  ETA %.1f s%s", tty ? "\r" : "", step,
              start + o->steps, loss, sc, rate, el / (double)k * (double)(o->steps - k), tty ? "   " : "\n");
    }
    if (nr_maybe_eval(s, o, L, k, step)) {
      if (log) fclose(log);
      return 1;
    }
  }
  double el = nr_now() - t0;
  if (log && fclose(log)) return nr_error("%s: %s", o->loss_log, strerror(errno));
  if (!o->quiet)
    fprintf(stderr, "%snovarun: %ld steps in %.3f s (%.3f ms/step): loss %.6f -> %.6f\n", tty ? "\n" : "", o->steps, el,
            el * 1e3 / (double)o->steps, first, last);
  if (scaled && (skipped || !o->quiet))
    fprintf(stderr, "novarun: %ld of %ld steps skipped on fp16 overflow; loss scale now %g\n", skipped, o->steps,
            nr_state_scalar(s, "amp.loss_scale"));
  else if (o->skip_nonfinite && (skipped || !o->quiet)) /* -q: only when steps were skipped */
    fprintf(stderr, "novarun: %ld of %ld steps skipped (non-finite loss or gradients)\n", skipped, o->steps);
  return 0;
}

/* --steps with what surrounds them: the learning-rate schedule's base, the
 * JSON log, the held-out batches (nr_train_steps). */
static int nr_train(nr_step *s, const nr_options *o, nr_batches *b, long long start, long long *done, int *keep) {
  nr_loop L = {.base_lr = NAN};
  nova_tensor_info info;
  int64_t batch = 0; /* the first batched input's rows */
  for (int i = 0, n = s->api.num_tensors(s->step); i < n; i++)
    if (s->api.tensor(s->step, i, &info) == NOVA_OK) {
      if (info.has_default && !strcmp(info.name, "lr")) L.has_lr = 1;
      if (!strcmp(info.name, "grad_norm")) L.has_norm = 1;
      if (info.has_default && !strcmp(info.name, "accum.steps")) L.accum = 1;
      if (!batch && info.role == NOVA_ROLE_INPUT && info.rank > 0) batch = info.shape[0];
    }
  if (L.accum) { /* runs per update: the schedule counts updates */
    double k = nr_state_scalar(s, "accum.steps");
    L.accum = k >= 1 ? (long long)k : 1;
  } else
    L.accum = 1;
  if (o->sched.kind) {
    if (!L.has_lr)
      return nr_error("%s: --lr-schedule: the step has no run-time learning rate (compile it with novac --train)",
                      s->path);
    if (b && nr_batches_feeds(b, "lr"))
      return nr_error("%s: tensor 'lr' gives the learning rate, and so does --lr-schedule: give one of them",
                      o->data_path);
    L.base_lr = o->lr_set ? o->lr : nr_state_scalar(s, "lr");
    if (!(L.base_lr >= 0)) return nr_error("%s: --lr-schedule: cannot read the step's learning rate", s->path);
  }
  if (o->eval_data) {
    if (!s->api.eval)
      return nr_error("%s: --eval-data: this step.so has no evaluation entry (rebuild it)", s->path);
    if (!b) return nr_error("--eval-data: the training batches must come from --data or --seed (the evaluation binds "
                            "its own batches over them)");
    nr_options eo = *o;
    eo.data_path = o->eval_data;
    eo.seed_set = 0;
    if (nr_batches_create(s, &eo, &L.eb)) return 1;
    uint64_t per = (uint64_t)(batch ? batch : 1) * (uint64_t)(s->world > 0 ? s->world : 1);
    L.neval = (long)(nr_batches_samples(L.eb) / per);
    if (L.neval < 1) {
      nr_batches_destroy(L.eb);
      return nr_error("%s: fewer samples than one batch of %llu", o->eval_data, (unsigned long long)per);
    }
  }
  if (o->log_path && !(L.jl = fopen(o->log_path, "w"))) {
    nr_batches_destroy(L.eb);
    return nr_error("%s: %s", o->log_path, strerror(errno));
  }
  L.batch = batch;
  int rc = nr_train_steps(s, o, b, start, done, keep, &L);
  if (L.jl && fclose(L.jl) && !rc) rc = nr_error("%s: %s", o->log_path, strerror(errno));
  nr_batches_destroy(L.eb);
  return rc;
}

/* 1 if S is a training step: a run updates its params or optimizer state. */
static int nr_is_training_step(nr_step *s) {
  nova_tensor_info info;
  for (int i = 0, n = s->api.num_tensors(s->step); i < n; i++)
    if (s->api.tensor(s->step, i, &info) == NOVA_OK && info.role == NOVA_ROLE_UPDATE) return 1;
  return 0;
}

/* --steps, or one plain run (O->repeat times); *DONE = the steps done
 * after it, counting from START; *KEEP = 1 when it failed with the state
 * still good (a non-finite step, which changed nothing): --save goes on. */
static int nr_execute(nr_step *s, const nr_options *o, nr_batches *b, long long start, long long *done, int *keep) {
  double median = 0, device = -1;
  int rc;
  *done = start;
  if (o->profile) {
    if (!s->api.set_profiling) return nr_error("%s: --profile: this step.so has no profiling (rebuild it)", s->path);
    if (s->api.set_profiling(s->step, 1) != NOVA_OK) return nr_error("--profile: %s", s->api.error(s->step));
  }
  if (o->eval && !s->api.eval)
    return nr_error("%s: --eval: this step.so has no evaluation entry (built by a novac older than 0.2)", s->path);
  if (o->steps) {
    rc = nr_train(s, o, b, start, done, keep);
    if (!rc && o->eval && s->api.eval(s->step) != NOVA_OK) /* on the last step's batch */
      rc = nr_error("%s: evaluation failed: %s", s->path, s->api.error(s->step));
    return rc;
  }
  /* every run of a plain run sees the same batch: that of the next step */
  if (b && nr_batches_bind(b, s, start + 1)) return 1;
  if ((rc = nr_run(s, o, &median, &device))) return rc;
  if (nr_is_training_step(s) && !o->eval) *done = start + o->repeat;
  if (!o->quiet) {
    const char *from = o->inputs_dir ? o->inputs_dir : o->data_path ? o->data_path : o->seed_set ? "--seed" : NULL;
    fprintf(stderr, "novarun: step %s: %d tensors, %d bound from %s\n", o->step_path, s->api.num_tensors(s->step),
            b ? nr_batches_count(b) : s->nbound, from ? from : "(no --inputs)");
    if (median < 1e-3)
      fprintf(stderr, "novarun: %.2f us per run (median of %ld)\n", median * 1e6, o->repeat);
    else
      fprintf(stderr, "novarun: %.3f ms per run (median of %ld)\n", median * 1e3, o->repeat);
    if (device >= 0 && s->api.target && !strcmp(s->api.target(s->step), "cuda"))
      fprintf(stderr, "novarun: %.3f ms per run on the GPU (CUDA events, median of %ld)\n", device, o->repeat);
  }
  if (o->profile) nr_print_profile(s);
  return 0;
}

/* --seed: the seed of the step's random generator (dropout), if it has one. */
static int nr_bind_rng_seed(nr_step *s, uint64_t seed) {
  nova_tensor_info info;
  int64_t v = (int64_t)seed;
  for (int i = 0, n = s->api.num_tensors(s->step); i < n; i++)
    if (s->api.tensor(s->step, i, &info) == NOVA_OK && !strcmp(info.name, "rng.seed")) {
      if (s->api.bind(s->step, "rng.seed", NOVA_DTYPE_I64, 0, NULL, &v) != NOVA_OK)
        return nr_error("--seed: %s", s->api.error(s->step));
      return 0;
    }
  return 0;
}

/* The processes launched together: a step compiled with novac
 * --data-parallel (its input comm.scale) joined its launcher's world when
 * it opened (nova_step_world); any other step launched as one of several
 * processes would train a copy of its own in each, which is refused. */
static int nr_check_world(nr_step *s) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS", "WORLD_SIZE"};
  nova_tensor_info info;
  bool dp = false;
  s->rank = 0, s->world = 1;
  for (int i = 0, n = s->api.num_tensors(s->step); i < n && !dp; i++)
    dp = s->api.tensor(s->step, i, &info) == NOVA_OK && !strcmp(info.name, "comm.scale");
  if (dp && s->api.world) s->world = s->api.world(s->step, &s->rank);
  if (s->world > 1) nr_rank = s->rank;
  for (size_t k = 0; s->world == 1 && k < sizeof vars / sizeof *vars; k++) {
    const char *v = getenv(vars[k]);
    if (!v || atol(v) <= 1) continue;
    if (!dp)
      return nr_error("%s=%s: launched as %s processes, but this step is not data-parallel: each would train a copy "
                      "of its own; compile it with novac --data-parallel", vars[k], v, v);
    if (!s->api.world)
      return nr_error("%s=%s: this step.so comes from a novac without a transport between processes; compile it "
                      "again", vars[k], v);
    return nr_error("%s=%s, but the step joined no MPI world: start the processes with mpirun (or srun with "
                    "PMI/PMIx)", vars[k], v);
  }
  return 0;
}

/* A step compiled with novac --shard-optimizer: each rank holds its own
 * share of the optimizer state (tensors NAME.SUFFIX.shard), which its own
 * checkpoint file keeps: FILE for rank 0, FILE.rankR for rank R. */
static bool nr_sharded(nr_step *s) {
  nova_tensor_info info;
  for (int i = 0, n = s->api.num_tensors(s->step); i < n; i++)
    if (s->api.tensor(s->step, i, &info) == NOVA_OK && info.role == NOVA_ROLE_OPT_STATE && strlen(info.name) > 6 &&
        !strcmp(info.name + strlen(info.name) - 6, ".shard"))
      return true;
  return false;
}

static const char *nr_rank_path(char *buf, size_t n, const char *path, int rank) {
  return snprintf(buf, n, "%s.rank%d", path, rank) < (int)n ? buf : path;
}

static int nr_trace_start(nr_step *s) {
  if (!s->api.trace_start) return nr_error("%s: --trace: this step.so has no tracing (compile it again)", s->path);
  if (s->api.trace_start(s->step) != NOVA_OK) return nr_error("--trace: %s", s->api.error(s->step));
  return 0;
}

/* --trace: every rank gives its events, rank 0 writes the file and says
 * how much of the gradient all-reduces the compute did not wait for. */
static int nr_trace_write(nr_step *s, const nr_options *o) {
  nova_trace_summary t;
  if (s->api.trace_write(s->step, o->trace_path, &t) != NOVA_OK)
    return nr_error("--trace %s: %s", o->trace_path, s->api.error(s->step));
  if (s->rank > 0 || o->quiet) return 0;
  fprintf(stderr, "novarun: trace of %d run%s written to %s", t.steps, t.steps == 1 ? "" : "s", o->trace_path);
  if (t.steps && t.allreduce_ms > 0) {
    double hid = 100 * (1 - t.waited_ms / t.allreduce_ms);
    double hid_but = t.allreduce_ms_but_last > 0 ? 100 * (1 - t.waited_ms_but_last / t.allreduce_ms_but_last) : 100;
    fprintf(stderr, ": all-reduce %.3f ms per run, %.0f%% hidden behind compute (%.0f%% without each run's last bucket)",
            t.allreduce_ms / t.steps, hid < 0 ? 0 : hid, hid_but < 0 ? 0 : hid_but);
  }
  fprintf(stderr, "%s\n", t.dropped ? " (the buffer was full: later events were not kept)" : "");
  return 0;
}

/* --dim=NAME=N: the size of each run of a step compiled for several
 * (novac --dim=NAME=LO..HI); the batches are made at that size. */
static int nr_set_size(nr_step *s, const nr_options *o) {
  const char *dim = NULL;
  int64_t lo = 0, hi = 0;
  if (!s->api.sizes || !s->api.sizes(s->step, &dim, &lo, &hi, NULL))
    return nr_error("--dim=%s=%lld: %s was compiled for one size of each dimension (novac --dim=NAME=LO..HI "
                    "compiles one for several)", o->size_dim, o->size, o->step_path);
  if (strcmp(dim, o->size_dim))
    return nr_error("--dim=%s=%lld: the sizes %s serves are of '%s' (%lld to %lld)", o->size_dim, o->size,
                    o->step_path, dim, (long long)lo, (long long)hi);
  if (s->api.set_size(s->step, o->size) != NOVA_OK)
    return nr_error("--dim=%s=%lld: %s", o->size_dim, o->size, s->api.error(s->step));
  return 0;
}

/* Order: the checkpoint, then the batch source, then the output folders:
 * nothing is created or run unless every input checked out. */
static int nr_main(const nr_options *o) {
  nr_step s;
  nr_batches *b = NULL;
  long long start = 0, done = 0;
  int keep = 0; /* a failed run left the state good to save */
  if (o->comm_timeout) { /* read by the step's runtime when it joins the launcher's world */
    char t[32];
    snprintf(t, sizeof t, "%ld", o->comm_timeout);
    setenv("NOVA_COMM_TIMEOUT", t, 1);
  }
  int rc = nr_open(&s, o->step_path);
  if (!rc) rc = nr_check_world(&s);
  nr_options ro = *o; /* ranks other than 0 train silently and write nothing (but their own shards) */
  char save_r[4096], load_r[4096];
  if (!rc && s.rank > 0) {
    bool sharded = nr_sharded(&s);
    ro.quiet = 1, ro.print = 0, ro.outputs_dir = NULL, ro.dump_dir = NULL, ro.loss_log = NULL;
    ro.save_path = sharded && o->save_path ? nr_rank_path(save_r, sizeof save_r, o->save_path, s.rank) : NULL;
    if (sharded && o->load_path) ro.load_path = nr_rank_path(load_r, sizeof load_r, o->load_path, s.rank);
    o = &ro;
  }
  if (!rc && o->size_dim[0]) rc = nr_set_size(&s, o);
  if (!rc && o->load_path) rc = nr_checkpoint_load(&s, o->load_path, &start);
  if (!rc && (o->data_path || (o->seed_set && !o->inputs_dir))) rc = nr_batches_create(&s, o, &b);
  else if (!rc) rc = nr_bind_inputs(&s, o, &s.nbound);
  if (!rc && o->seed_set) rc = nr_bind_rng_seed(&s, o->seed);
  if (!rc && o->outputs_dir) rc = nr_make_dirs(o->outputs_dir);
  if (!rc && o->dump_dir) rc = nr_make_dirs(o->dump_dir);
  if (!rc && o->lr_set) {
    float lr = (float)o->lr;
    if (s.api.bind(s.step, "lr", NOVA_DTYPE_F32, 0, NULL, &lr) != NOVA_OK)
      rc = nr_error("--lr: %s (the step has no run-time learning rate: compile it with novac --train)",
                    s.api.error(s.step));
  }
  if (!rc && o->accumulate > 0) {
    int64_t k = o->accumulate;
    if (s.api.bind(s.step, "accum.steps", NOVA_DTYPE_I64, 0, NULL, &k) != NOVA_OK)
      rc = nr_error("--accumulate: %s (the step accumulates no gradients: compile it with novac --accumulate)",
                    s.api.error(s.step));
  }
  if (!rc && o->clip > 0) {
    float c = (float)o->clip;
    if (s.api.bind(s.step, "clip.max_norm", NOVA_DTYPE_F32, 0, NULL, &c) != NOVA_OK)
      rc = nr_error("--clip-grad-norm: %s (the step clips no gradients: compile it with novac --clip-grad-norm)",
                    s.api.error(s.step));
  }
  if (!rc && o->trace_path) rc = nr_trace_start(&s);
  if (!rc) rc = nr_execute(&s, o, b, start, &done, &keep);
  if (!rc && o->trace_path) rc = nr_trace_write(&s, o);
  /* after the steps, each result is written even when another could not be
   * (a full disk): the checkpoint first, the trained state being the one
   * that cannot be made again without training again; after a non-finite
   * step (KEEP), only the checkpoint, of the last good parameters */
  if (!rc || keep) {
    int bad = o->save_path ? nr_checkpoint_save(&s, o->save_path, done) : 0;
    if (!rc && nr_report_outputs(&s, o)) bad = 1;
    if (!rc && o->dump_dir && nr_dump(&s, o)) bad = 1;
    if (bad) rc = 1;
  }
  nr_batches_destroy(b);
  nr_close(&s);
  return rc;
}

/* Exit status RC, or 1 when what went to stdout (--print, --help) was lost. */
static int nr_exit_status(int rc) {
  if (nv_close_stdout()) {
    nr_error("writing standard output: %s", strerror(errno));
    return 1;
  }
  return rc;
}

int main(int argc, char **argv) {
  nr_options o;
  nv_temp_install();
  nv_json_init();
  int rc = nr_parse_args(argc, argv, &o);
  if (rc >= 0) return nr_exit_status(rc);
  return nr_exit_status(nr_main(&o));
}
