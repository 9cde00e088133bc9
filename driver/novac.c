/* novac: the compiler driver.  Parses the command line and runs the
 * pipeline, one stage per call with the verifier between stages:
 *
 *   frontend (.nova) -> nova IR -> linalg -> LLVM dialect -> object -> step.so + manifest
 *
 * Exit status: 0 success, 1 an error in the user's input (diagnostic
 * printed), 2 bad usage.
 */
#include <errno.h>
#include <math.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../codegen/codegen.h"
#include "../configurator/device.h"
#include "../frontend/frontend.h"
#include "../passes/amp.h"
#include "../passes/autodiff.h"
#include "../passes/buckets.h"
#include "../support/diag.h"
#include "novac_cache.h"
#include "novac_deps.h"
#include "novac_device.h"
#include "memreport.h"
#include "pipeline.h"
#include "../support/util.h"

typedef enum emit_kind { EMIT_SO, EMIT_OBJ, EMIT_NOVA, EMIT_LINALG, EMIT_LLVM, EMIT_PTX, EMIT_MANIFEST } emit_kind;
static const char *const emit_names[] = {"so", "obj", "nova", "linalg", "llvm", "ptx", "manifest"};

typedef struct opts {
  const char *input, *output, *manifest, *target, *device, *cpu, *dump_after;
  emit_kind emit;
  int opt_level;
  bool train, time_passes, verbose, explain_config, gpu_sim;
  int gpu_block;
  int gemm_tile[6]; /* --gemm-tile=BMxBNxBK,WMxWN[,S] */
  bool tf32;
  int64_t memory_limit; /* --memory-limit, bytes (0: none) */
  bool no_recompute;    /* --recompute=none */
  bool fused_attention; /* --attention=fused */
  int64_t bucket_bytes; /* --data-parallel: --bucket-size (default 25 MiB) */
  bool shard_optimizer; /* --shard-optimizer (ZeRO-1; with --world-size) */
  const char *memory_report; /* --memory-report=FILE */
  const char *nonfinite; /* --nonfinite (NULL: skip-param, skip-step with dynamic loss scaling) */
  const char *precision, *policy; /* --precision (NULL: the model's, else fp32), --precision-policy */
  bool loss_scale_set, window_set;
  const char *bf16_master; /* --bf16-master (NULL: fp32) */
  ad_options ad;
  bool lr_set, wd_set;
  fe_dim_binding dims[32];
  int ndims;
  int ranged;         /* --dim=NAME=LO..HI or =A,B,C: the index of that dimension in dims (-1: none) */
  int64_t size_lo, size_hi; /* its sizes */
  int nsizes;
  int64_t sizes[16];  /* its buckets, ascending */
  nv_sbuf flags;     /* the flags that affect the output, for the manifest */
  nv_diag *eval_diag; /* the quiet diagnostics of the evaluation graph's import: its
                         locations are interned there (destroyed after the graph) */
  nd_deps deps;       /* -M, -MM, -MD, -MMD, -MF, -MT, -MQ, -MP */
  const char *cache_dir; /* --cache-dir (else NOVAC_CACHE_DIR; NULL or empty: none) */
  int64_t cache_max;     /* --cache-max, bytes (0: no cap) */
  bool explain_cache;    /* --explain-cache */
  int argc;           /* the command line, for -MD's record of it */
  char **argv;
} opts;

static void usage(FILE *f) {
  fputs("usage: novac INPUT [options]\n"
        "  INPUT                 a .nova graph (see nova-format(5)) or an ONNX model (.onnx, opsets 13-21)\n"
        "  -o FILE               output (default: INPUT's base name with .so; '-' = stdout for text)\n"
        "  --manifest FILE       where to write the launch manifest (default: output with .json)\n"
        "  -M, -MM               print a make rule for the output (what it is built from), do not\n"
        "                        compile; -MM leaves novac's runtime files out\n"
        "  -MD, -MMD             compile, and write that rule (and the command) to OUTPUT.d\n"
        "  -MF FILE              the rule to FILE;  -MT TARGET, -MQ TARGET: its target (-MQ quoted)\n"
        "  -MP                   an empty rule for each prerequisite but the input\n"
        "  --cache-dir=DIR       reuse a step compiled before with the same model, data, options\n"
        "                        and device (default NOVAC_CACHE_DIR; none when unset)\n"
        "  --cache-max=SIZE      keep the cache under SIZE bytes (K, M, G), least recently used out\n"
        "  --explain-cache       say whether the step came from the cache, and why not\n"
        "  --emit=KIND           so | obj | nova | linalg | llvm | ptx | manifest (ptx: --target=cuda;\n"
        "                        llvm and obj: the host code of a cuda step)\n"
        "  --target=cpu|cuda     code generation target (default cpu)\n"
        "  --device=NAME|FILE|auto  device model: host (cpu), a GPU model (h100, h200, a100-40gb,\n"
        "                        a100-80gb, l4, rtx3060, rtx4090, rtx6000ada), a JSON device file,\n"
        "                        or auto (this machine's CPU or GPU)\n"
        "  --explain-config      print each kernel's schedule and the limit that decided it\n"
        "  --gpu-block=N         (cuda) N threads per block for every kernel instead of the\n"
        "                        configurator's choice (tuning experiments)\n"
        "  --gemm-tile=BMxBNxBK,WMxWN[,S]  (cuda) every tensor-core GEMM with this block tile,\n"
        "                        warp tile and S pipeline stages instead of the configurator's\n"
        "                        (tile searches)\n"
        "  --matmul-precision=highest|tf32  (cuda) tf32: f32 matmuls on tensor cores with tf32\n"
        "                        operands (10-bit mantissa; sm_80+); default highest (exact f32)\n"
        "  --gpu-sim             (cuda) run the GPU kernels as CPU loops over their grid and\n"
        "                        block: checks the GPU mapping where there is no GPU\n"
        "  --precision=fp32|bf16|fp16|tf32  compute precision (default: the model's 'precision', else\n"
        "                        fp32): bf16/fp16 compute matmuls, convolutions and elementwise\n"
        "                        chains in 16 bits, reductions, norms, softmax, the loss and the\n"
        "                        update in f32, parameters kept as f32 masters; tf32 (cuda):\n"
        "                        f32 matmuls on tensor cores\n"
        "  --precision-policy=FILE  JSON overrides of the precision policy, per op or name glob\n"
        "  --loss-scale=F|none   (--train) dynamic loss scaling's initial scale (default 65536 with\n"
        "                        fp16, none otherwise)\n"
        "  --loss-scale-window=N (--train) clean steps after which the loss scale doubles (2000)\n"
        "  --bf16-master=fp32|none  (--train, bf16) none: parameters stored only in bf16, updated\n"
        "                        in f32 and stochastically rounded back (default fp32 masters)\n",
        f);
  fputs("  --cpu=NAME            LLVM CPU to generate code for (default host; e.g. x86-64-v3)\n"
        "  --dim=NAME=N          bind a symbolic dimension\n"
        "  --dim=NAME=LO..HI     one step for every size in [LO, HI] (buckets: the powers of two\n"
        "                        in [LO, HI), and HI); --dim=NAME=A,B,C: buckets A, B, C (sizes\n"
        "                        1 to the largest); a run takes the smallest bucket that holds it\n"
        "  -O0 .. -O3            optimisation level (default -O2)\n"
        "  --memory-limit=BYTES  (-O1 and up) recompute activations in the backward pass, matmuls\n"
        "                        too (layers from checkpoints), until the planned peak fits\n"
        "                        BYTES (suffix K, M or G: KiB, MiB, GiB) with the fewest flops,\n"
        "                        or fail with the smallest peak reached and its op\n"
        "  --memory-report=FILE  the step's memory over its ops (parameters, optimizer state,\n"
        "                        gradients, activations, workspace; the peak and its op): an SVG\n"
        "                        picture, or JSON when FILE ends in .json\n"
        "  --accumulate=K        (--train) update every K runs with the mean of their gradients\n"
        "                        (K micro-batches: one batch K times larger); K is the run-time\n"
        "                        input accum.steps\n"
        "  --no-decay=GLOB[,GLOB]|none  (--train) params updated without weight decay (default:\n"
        "                        those of rank 0 and 1, biases and norm weights; none: every param decays)\n"
        "  --clip-grad-norm=F    (--train) scale the gradients to a 2-norm of at most F (all of\n"
        "                        them together, as torch.nn.utils.clip_grad_norm_); F is the run-time\n"
        "                        input clip.max_norm, the norm the output grad_norm\n"
        "  --nonfinite=skip-param|skip-step  (--train) a non-finite loss skips the whole step;\n"
        "                        a non-finite gradient skips its own param's update, each update\n"
        "                        running as soon as its gradient is complete (skip-param, the\n"
        "                        default), or the whole step, every update waiting for every\n"
        "                        gradient (skip-step; the default with dynamic loss scaling)\n"
        "  --keep-grads          (--train) the gradients are outputs of the step (NAME.grad: novarun\n"
        "                        --dump writes them); else each lives only until its update\n"
        "  --data-parallel       (--train) each gradient is summed over the ranks the step runs\n"
        "                        as (nova.all_reduce, in buckets placed after their last gradient)\n"
        "                        over MPI (mpirun) and scaled by 1/ranks while the backward goes on\n"
        "  --bucket-size=BYTES   (--data-parallel) the all-reduces' buckets (default 25M)\n"
        "  --world-size=N        (--data-parallel) the step is for N ranks: launched as another\n"
        "                        number, it refuses to open\n"
        "  --shard-optimizer     (--data-parallel, --world-size) ZeRO-1: each rank keeps and updates\n"
        "                        1/N of the optimizer state; gradients are reduce-scattered and\n"
        "                        the new parameters all-gathered\n"
        "  --recompute=cheap|none  (--train, -O1 and up) cheap: the backward recomputes the cheap\n"
        "                        forward values it reads (elementwise, casts, data movement)\n"
        "                        from those it keeps, chosen by a minimum cut of the bytes kept\n"
        "                        (default); none: it keeps every forward value it reads\n"
        "  --attention=decomposed|fused  (-O1 and up) decomposed: attention written out op by op\n"
        "                        is compiled as written (default); fused: it becomes one attention\n"
        "                        op (softmax(q k^T scaled and masked) v), whose backward recomputes\n"
        "                        the scores from q and k instead of keeping every layer's\n"
        "                        probabilities\n"
        "  --dump-after=STAGE    print the IR after STAGE to stderr: amp, attention, autodiff, recompute,\n"
        "                        schedule, frontend, linalg,\n"
        "                        fusion, remat, inplace, fastmath, ukernels, tiling,\n"
        "                        bufferization, inplace-plan, memplan, dealloc, llvm\n"
        "  --time-passes         report the time of each stage\n"
        , f);
  fputs(/* (two strings: ISO C promises 4095 characters a literal) */
        "  --train               compile a training step: forward, backward and optimizer update\n"
        "  --loss=NAME           the loss output (default: the one scalar float output)\n"
        "  --freeze=GLOB[,GLOB]  params kept constant (every other float param is trained)\n"
        "  --train-only=GLOB[,GLOB]  train only the params these match; the rest are constants\n"
        "  --optimizer=sgd|momentum|adamw, --nesterov\n"
        "  --lr=F                learning rate (default 0.01; adamw 0.001); also a run-time input 'lr'\n"
        "  --momentum=F --beta1=F --beta2=F --eps=F --weight-decay=F\n"
        "  -v                    print the commands run\n"
        "  --print-nova-dialect  print the nova dialect's IRDL definition (for mlir-opt --irdl-file)\n"
        "  --version, --help\n",
        f);
}

static int bad_usage(const char *fmt, const char *arg) {
  fprintf(stderr, "novac: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nTry 'novac --help'.\n");
  return 2;
}

/* Value of "--name=V" or "--name V"; advances *i for the second form. */
static const char *opt_value(int argc, char **argv, int *i, const char *name) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] == 0 && *i + 1 < argc) return argv[++*i];
  return NULL;
}

/* A finite number for option NAME, or bad usage. */
static int num_value(const char *name, const char *v, double *out) {
  char *end;
  double x = strtod(v, &end);
  if (!nv_number_token(v) || *end || !isfinite(x)) {
    fprintf(stderr, "novac: %s takes a number, got '%s'\nTry 'novac --help'.\n", name, v);
    return 2;
  }
  *out = x;
  return 0;
}

/* --freeze and --train-only: 1 to 64 non-empty patterns, 1000 characters. */
static int check_globs(const char *opt, const char *v) {
  if (!v) return 0;
  int n = 1;
  for (const char *p = v; *p; p++) n += *p == ',';
  bool empty = !*v || *v == ',' || v[strlen(v) - 1] == ',' || strstr(v, ",,");
  if (n > 64 || strlen(v) > 1000 || empty) {
    fprintf(stderr, "novac: %s takes 1 to 64 non-empty patterns separated by commas (1000 characters at most), "
            "got '%s'\nTry 'novac --help'.\n", opt, v);
    return 2;
  }
  return 0;
}

/* Exits with RC, or 1 when what went to stdout was lost (e.g. > /dev/full). */
_Noreturn static void exit_stdout(int rc) {
  if (nv_close_stdout()) {
    fprintf(stderr, "novac: error: writing standard output: %s\n", strerror(errno));
    exit(1);
  }
  exit(rc);
}

/* A positive byte count, with an optional K, M or G suffix (2^10, 2^20,
 * 2^30), into *OUT; 0, or -1. */
static int parse_bytes(const char *v, int64_t *out) {
  char *end;
  errno = 0;
  long long b = strtoll(v, &end, 10);
  int sh = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
  if (sh) end++;
  if (!nv_number_token(v) || *end || errno || b <= 0 || b > (INT64_MAX >> sh)) return -1;
  *out = (int64_t)b << sh;
  return 0;
}

/* The sizes of --dim=NAME=LO..HI (buckets: the powers of two in [LO, HI),
 * then HI) or NAME=A,B,C (buckets A, B, C; sizes 1 to the largest) into
 * O; 0, or -1 after the usage message. */
static int parse_sizes(const char *v, opts *o) {
  const char *usage = "--dim=NAME=LO..HI takes integers 1 <= LO < HI, or NAME=A,B,C several different positive "
                      "integers, got '%s'";
  char *end;
  const char *dots = strstr(v, "..");
  o->nsizes = 0;
  if (dots) {
    long long lo = strtoll(v, &end, 10), hi;
    if (end != dots || !nv_number_token(v) || (hi = strtoll(dots + 2, &end, 10)) < 0 || *end ||
        !nv_number_token(dots + 2) || lo < 1 || hi <= lo || hi > ((long long)1 << 40))
      return bad_usage(usage, v);
    o->size_lo = lo, o->size_hi = hi;
    for (long long p = 1; p < hi; p *= 2)
      if (p >= lo) {
        if (o->nsizes == 15) return bad_usage("--dim=NAME=%s: more than 16 buckets; narrow the range or list them", v);
        o->sizes[o->nsizes++] = p;
      }
    o->sizes[o->nsizes++] = hi;
    return 0;
  }
  for (const char *p = v;; p = end + 1) {
    long long n = strtoll(p, &end, 10);
    if (end == p || !nv_number_token(p) || n < 1 || n > ((long long)1 << 40) || (*end && *end != ',')) return bad_usage(usage, v);
    int k = o->nsizes;
    if (k == 16) return bad_usage("--dim=NAME=%s: more than 16 buckets", v);
    while (k > 0 && o->sizes[k - 1] > n) k--;
    if (k > 0 && o->sizes[k - 1] == n) return bad_usage("--dim=NAME=%s: a size listed twice", v);
    memmove(o->sizes + k + 1, o->sizes + k, (size_t)(o->nsizes - k) * sizeof *o->sizes);
    o->sizes[k] = n;
    o->nsizes++;
    if (!*end) break;
  }
  if (o->nsizes < 2) return bad_usage(usage, v);
  o->size_lo = 1, o->size_hi = o->sizes[o->nsizes - 1];
  return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
  o->ranged = -1;
  o->opt_level = 2;
  o->target = "cpu";
  o->ad = (ad_options){.optimizer = AD_SGD, .momentum = 0.9, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
  o->argc = argc, o->argv = argv;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int dr = nd_deps_arg(argc, argv, &i, &o->deps);
    if (dr) {
      if (dr < 0) return 2;
      continue;
    }
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit_stdout(0);
    } else if (!strcmp(a, "--version")) {
      printf("novac %s (MLIR/LLVM 22)\n", NOVAC_VERSION);
      exit_stdout(0);
    } else if (!strcmp(a, "--print-nova-dialect")) {
      char *irdl = nova_dialect_irdl();
      if (irdl) fputs(irdl, stdout);
      free(irdl);
      exit_stdout(irdl ? 0 : 1);
    } else if (!strcmp(a, "-o")) {
      if (++i >= argc) return bad_usage("-o needs a file name%s", "");
      o->output = argv[i];
    } else if ((v = opt_value(argc, argv, &i, "--manifest"))) o->manifest = v;
    else if ((v = opt_value(argc, argv, &i, "--emit"))) {
      size_t k = 0;
      while (k < sizeof emit_names / sizeof *emit_names && strcmp(emit_names[k], v)) k++;
      if (k == sizeof emit_names / sizeof *emit_names)
        return bad_usage("unknown --emit kind '%s' (so, obj, nova, linalg, llvm, ptx, manifest)", v);
      o->emit = (emit_kind)k;
    } else if ((v = opt_value(argc, argv, &i, "--target"))) {
      if (strcmp(v, "cpu") && strcmp(v, "cuda")) return bad_usage("unknown --target '%s' (cpu or cuda)", v);
      o->target = v;
      nv_sb_printf(&o->flags, " --target=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--device"))) {
      o->device = v;
      nv_sb_printf(&o->flags, " --device=%s", v);
    }
    else if ((v = opt_value(argc, argv, &i, "--cpu"))) {
      o->cpu = v;
      nv_sb_printf(&o->flags, " --cpu=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--dump-after"))) o->dump_after = v;
    else if ((v = opt_value(argc, argv, &i, "--dim"))) {
      const char *eq = strchr(v, '=');
      char *end = NULL;
      long long n = 0;
      if (eq && (strstr(eq, "..") || strchr(eq, ','))) {
        if (o->ranged >= 0) return bad_usage("--dim=%s: only one dimension may have several sizes", v);
        if (eq == v || eq - v > 200)
          return bad_usage("--dim takes NAME=N, NAME=LO..HI or NAME=A,B,C with positive integers, got '%s'", v);
        int u = parse_sizes(eq + 1, o);
        if (u) return u;
        o->ranged = o->ndims;
        n = o->size_hi;
      } else {
        n = eq ? strtoll(eq + 1, &end, 10) : 0;
        if (!eq || eq == v || !end || *end || !nv_number_token(eq + 1) || n <= 0 || eq - v > 200)
          return bad_usage("--dim takes NAME=N, NAME=LO..HI or NAME=A,B,C with positive integers, got '%s'", v);
      }
      if (o->ndims == 32) return bad_usage("too many --dim options%s", "");
      for (int k = 0; k < o->ndims; k++)
        if (strlen(o->dims[k].name) == (size_t)(eq - v) && !strncmp(o->dims[k].name, v, (size_t)(eq - v)))
          return bad_usage("--dim binds '%s' twice", o->dims[k].name);
      char *name = nv_xstrndup(v, (size_t)(eq - v));
      bool ranged = o->ranged == o->ndims;
      o->dims[o->ndims++] = (fe_dim_binding){name, n, false, ranged};
      nv_sb_printf(&o->flags, " --dim=%s", v);
    } else if (a[0] == '-' && a[1] == 'O' && a[2] >= '0' && a[2] <= '3' && !a[3]) {
      o->opt_level = a[2] - '0';
      nv_sb_printf(&o->flags, " %s", a);
    } else if (!strcmp(a, "--train")) o->train = true;
    else if ((v = opt_value(argc, argv, &i, "--loss"))) {
      o->ad.loss = v;
      nv_sb_printf(&o->flags, " --loss=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--accumulate"))) {
      char *end;
      errno = 0;
      long k = strtol(v, &end, 10);
      if (!nv_number_token(v) || *end || errno || k < 1 || k > 1000000)
        return bad_usage("--accumulate takes a number of runs from 1 to 1000000, got '%s'", v);
      o->ad.accumulate = (int)k;
      nv_sb_printf(&o->flags, " --accumulate=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--no-decay"))) {
      o->ad.no_decay = v;
      nv_sb_printf(&o->flags, " --no-decay=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--freeze"))) {
      o->ad.freeze = v;
      nv_sb_printf(&o->flags, " --freeze=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--train-only"))) {
      o->ad.train_only = v;
      nv_sb_printf(&o->flags, " --train-only=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--cache-dir"))) o->cache_dir = v;
    else if ((v = opt_value(argc, argv, &i, "--cache-max"))) {
      if (parse_bytes(v, &o->cache_max)) return bad_usage("--cache-max takes a size in bytes (K, M or G suffix), got '%s'", v);
    } else if (!strcmp(a, "--explain-cache")) o->explain_cache = true;
    else if ((v = opt_value(argc, argv, &i, "--optimizer"))) {
      if (!strcmp(v, "sgd")) o->ad.optimizer = AD_SGD;
      else if (!strcmp(v, "momentum")) o->ad.optimizer = AD_MOMENTUM;
      else if (!strcmp(v, "adamw")) o->ad.optimizer = AD_ADAMW;
      else return bad_usage("unknown --optimizer '%s' (sgd, momentum, adamw)", v);
      nv_sb_printf(&o->flags, " --optimizer=%s", v);
    } else if (!strcmp(a, "--nesterov")) {
      o->ad.nesterov = true;
      nv_sb_printf(&o->flags, " --nesterov");
    } else if ((v = opt_value(argc, argv, &i, "--lr")) || (v = opt_value(argc, argv, &i, "--momentum")) ||
               (v = opt_value(argc, argv, &i, "--beta1")) || (v = opt_value(argc, argv, &i, "--beta2")) ||
               (v = opt_value(argc, argv, &i, "--eps")) || (v = opt_value(argc, argv, &i, "--weight-decay"))) {
      const char *nm = a[2] == 'l' ? "--lr" : a[2] == 'm' ? "--momentum" : !strncmp(a, "--beta1", 7) ? "--beta1"
                     : !strncmp(a, "--beta2", 7) ? "--beta2" : a[2] == 'e' ? "--eps" : "--weight-decay";
      double *dst = a[2] == 'l' ? &o->ad.lr : a[2] == 'm' ? &o->ad.momentum : !strncmp(a, "--beta1", 7) ? &o->ad.beta1
                  : !strncmp(a, "--beta2", 7) ? &o->ad.beta2 : a[2] == 'e' ? &o->ad.eps : &o->ad.weight_decay;
      if (num_value(nm, v, dst)) return 2;
      o->lr_set |= dst == &o->ad.lr;
      o->wd_set |= dst == &o->ad.weight_decay;
      nv_sb_printf(&o->flags, " %s=%s", nm, v);
    }
    else if (!strcmp(a, "--time-passes")) o->time_passes = true;
    else if (!strcmp(a, "--explain-config")) o->explain_config = true;
    else if ((v = opt_value(argc, argv, &i, "--gpu-block"))) {
      char *end;
      long b = strtol(v, &end, 10);
      if (!nv_number_token(v) || *end || b < 32 || b > 1024 || b % 32)
        return bad_usage("--gpu-block takes a multiple of 32 from 32 to 1024, not '%s'", v);
      o->gpu_block = (int)b;
      nv_sb_printf(&o->flags, " --gpu-block=%ld", b);
    } else if ((v = opt_value(argc, argv, &i, "--gemm-tile"))) {
      int t[6] = {0}, n = 0, n2 = 0;
      char tail;
      if (sscanf(v, "%dx%dx%d,%dx%d%n,%d%n%c", &t[0], &t[1], &t[2], &t[3], &t[4], &n, &t[5], &n2, &tail) < 5 ||
          (v[n] && (!n2 || v[n2])) || t[0] < 16 || t[1] < 8 || t[2] < 8 || t[3] < 16 || t[4] < 8 || t[0] > 512 ||
          t[1] > 512 || t[2] > 256 || t[3] > 256 || t[4] > 256 || (v[n] && (t[5] < 1 || t[5] > 8)) ||
          strspn(v, "0123456789x,") != strlen(v))
        return bad_usage("--gemm-tile takes BMxBNxBK,WMxWN[,S] (block tile, warp tile and, optionally, 1 to 8 "
                         "pipeline stages; e.g. 128x128x32,64x32,3), not '%s'", v);
      memcpy(o->gemm_tile, t, sizeof t);
      nv_sb_printf(&o->flags, " --gemm-tile=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--memory-limit"))) {
      if (parse_bytes(v, &o->memory_limit))
        return bad_usage("--memory-limit takes a positive number of bytes (suffix K, M or G allowed), not '%s'", v);
      nv_sb_printf(&o->flags, " --memory-limit=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--matmul-precision"))) {
      if (strcmp(v, "highest") && strcmp(v, "tf32"))
        return bad_usage("--matmul-precision takes highest or tf32, not '%s'", v);
      o->tf32 = !strcmp(v, "tf32");
      nv_sb_printf(&o->flags, " --matmul-precision=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--precision"))) {
      if (strcmp(v, "fp32") && strcmp(v, "bf16") && strcmp(v, "fp16") && strcmp(v, "tf32"))
        return bad_usage("--precision takes fp32, bf16, fp16 or tf32, not '%s'", v);
      o->precision = v;
    } else if ((v = opt_value(argc, argv, &i, "--precision-policy"))) {
      o->policy = v;
      nv_sb_printf(&o->flags, " --precision-policy=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--loss-scale"))) {
      o->loss_scale_set = true;
      if (!strcmp(v, "none")) o->ad.loss_scale = 0;
      else if (num_value("--loss-scale", v, &o->ad.loss_scale)) return 2;
      else if (!(o->ad.loss_scale >= 1 && o->ad.loss_scale <= 0x1p64))
        return bad_usage("--loss-scale takes a number from 1 to 2^64, or none, not '%s'", v);
      nv_sb_printf(&o->flags, " --loss-scale=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--bf16-master"))) {
      if (strcmp(v, "fp32") && strcmp(v, "none")) return bad_usage("--bf16-master takes fp32 or none, not '%s'", v);
      o->bf16_master = v;
      nv_sb_printf(&o->flags, " --bf16-master=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--loss-scale-window"))) {
      char *end;
      errno = 0;
      long long w = strtoll(v, &end, 10);
      if (!nv_number_token(v) || *end || errno || w < 1 || w > (1LL << 40))
        return bad_usage("--loss-scale-window takes a positive number of steps, not '%s'", v);
      o->ad.loss_scale_window = w;
      o->window_set = true;
      nv_sb_printf(&o->flags, " --loss-scale-window=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--memory-report"))) {
      if (!*v) return bad_usage("--memory-report takes a file name%s", "");
      o->memory_report = v;
    } else if ((v = opt_value(argc, argv, &i, "--clip-grad-norm"))) {
      double x;
      if (num_value("--clip-grad-norm", v, &x)) return 2;
      if (!(x > 0)) return bad_usage("--clip-grad-norm takes a norm > 0, got '%s'", v);
      o->ad.clip_norm = x;
      nv_sb_printf(&o->flags, " --clip-grad-norm=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--nonfinite"))) {
      if (strcmp(v, "skip-step") && strcmp(v, "skip-param"))
        return bad_usage("--nonfinite takes skip-step or skip-param, not '%s'", v);
      o->nonfinite = v;
      nv_sb_printf(&o->flags, " --nonfinite=%s", v);
    } else if (!strcmp(a, "--keep-grads")) {
      o->ad.keep_grads = true;
      nv_sb_printf(&o->flags, " --keep-grads");
    } else if ((v = opt_value(argc, argv, &i, "--recompute"))) {
      if (strcmp(v, "cheap") && strcmp(v, "none")) return bad_usage("--recompute takes cheap or none, not '%s'", v);
      o->no_recompute = !strcmp(v, "none");
      nv_sb_printf(&o->flags, " --recompute=%s", v);
    } else if (!strcmp(a, "--data-parallel")) {
      o->ad.data_parallel = true;
      nv_sb_printf(&o->flags, " --data-parallel");
    } else if (!strcmp(a, "--shard-optimizer")) {
      o->shard_optimizer = true;
      nv_sb_printf(&o->flags, " --shard-optimizer");
    } else if ((v = opt_value(argc, argv, &i, "--world-size"))) {
      char *end;
      errno = 0;
      long n = strtol(v, &end, 10);
      if (errno || end == v || *end || !nv_number_token(v) || n < 1 || n > 65536)
        return bad_usage("--world-size takes a number of ranks from 1 to 65536, not '%s'", v);
      o->ad.world_size = (int)n;
      nv_sb_printf(&o->flags, " --world-size=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--bucket-size"))) {
      if (parse_bytes(v, &o->bucket_bytes))
        return bad_usage("--bucket-size takes a positive number of bytes (suffix K, M or G allowed), not '%s'", v);
      nv_sb_printf(&o->flags, " --bucket-size=%s", v);
    } else if ((v = opt_value(argc, argv, &i, "--attention"))) {
      if (strcmp(v, "fused") && strcmp(v, "decomposed"))
        return bad_usage("--attention takes decomposed or fused, not '%s'", v);
      o->fused_attention = !strcmp(v, "fused");
      nv_sb_printf(&o->flags, " --attention=%s", v);
    } else if (!strcmp(a, "--gpu-sim")) {
      o->gpu_sim = true;
      nv_sb_printf(&o->flags, " --gpu-sim");
    }
    else if (!strcmp(a, "-v")) o->verbose = true;
    else if (a[0] == '-' && a[1]) return bad_usage("unknown option '%s'", a);
    else if (o->input) return bad_usage("more than one input file ('%s')", a);
    else o->input = a;
  }
  if (!o->input) return bad_usage("no input file%s", "");
  if (!o->deps.only && !o->deps.with_compile && (o->deps.file || o->deps.targets.s || o->deps.phony))
    return bad_usage("-MF, -MT, -MQ and -MP shape a dependency rule: add -M, -MM, -MD or -MMD%s", "");
  if (!o->lr_set) o->ad.lr = o->ad.optimizer == AD_ADAMW ? 1e-3 : 1e-2;       /* torch.optim's usual values */
  if (o->ad.lr < 0 || o->ad.momentum < 0 || o->ad.weight_decay < 0 || !(o->ad.eps > 0) || o->ad.beta1 < 0 ||
      o->ad.beta1 >= 1 || o->ad.beta2 < 0 || o->ad.beta2 >= 1)
    return bad_usage("optimizer settings out of range%s: need lr, momentum, weight-decay >= 0, eps > 0 and "
                     "0 <= beta1, beta2 < 1", "");
  if (check_globs("--freeze", o->ad.freeze) || check_globs("--train-only", o->ad.train_only) ||
      (o->ad.no_decay && strcmp(o->ad.no_decay, "none") && check_globs("--no-decay", o->ad.no_decay)))
    return 2;
  if (!o->wd_set) o->ad.weight_decay = o->ad.optimizer == AD_ADAMW ? 1e-2 : 0;
  if (o->train) nv_sb_printf(&o->flags, " --train");
  return 0;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

typedef struct timer {
  bool on;
  double t0, total;
} timer;

static void stage_done(timer *t, const char *stage) {
  double t1 = now_ms();
  if (t->on) fprintf(stderr, "novac: %-22s %9.2f ms\n", stage, t1 - t->t0);
  t->total += t1 - t->t0;
  t->t0 = t1;
}

/* Where the runtime lives: <bindir>/../lib/novac. */
static void runtime_dir(char *out, size_t n) {
  char exe[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k <= 0) {
    snprintf(out, n, "/usr/local/lib/novac");
    return;
  }
  exe[k] = 0;
  snprintf(out, n, "%s/../lib/novac", dirname(exe));
}

/* Opens the output of a text stage ("-" or no -o: stdout) through nv_out. */
static FILE *open_text_out(nv_diag *d, nv_out *out, const char *path) {
  if (!nv_out_open(out, path ? path : "-", 0)) return out->f;
  nv_error_plain(d, "writing %s: %s", path, strerror(errno));
  return NULL;
}

/* Publishes the text stage's output: 0, or -1 with a diagnostic (the
 * temporary removed, the previous file kept). */
static int close_text_out(nv_diag *d, nv_out *out, int rc) {
  char *path = nv_xstrdup(out->path ? out->path : "-");
  if (rc) nv_out_discard(out);
  else if (nv_out_close(out)) {
    nv_error_plain(d, "writing %s: %s", path && strcmp(path, "-") ? path : "standard output", strerror(errno));
    rc = -1;
  }
  free(path);
  return rc;
}

/* --dump-after's stages before the target's list (pipeline.c):
 * frontend is the nova IR as built (after autodiff, with --train); amp and
 * autodiff print the graph after that pass, as nova IR. */
static const char *const graph_stages[] = {"amp", "attention", "autodiff", "recompute", "schedule", "frontend", "linalg", NULL};

static bool known_stage(bool cuda, const char *s) {
  for (int i = 0; graph_stages[i]; i++)
    if (!strcmp(graph_stages[i], s)) return true;
  return np_stage_index(cuda, s) >= 0;
}

/* With --dump-after=STAGE (amp, autodiff): the graph G as nova IR, on stderr. */
static int dump_graph(const opts *o, const char *stage, nv_diag *d, const nv_graph *g) {
  if (!o->dump_after || strcmp(o->dump_after, stage)) return 0;
  nova_ctx c;
  if (nova_ctx_init(&c, d)) return -1;
  MlirModule m = nova_build_module(&c, g);
  int rc = mlirModuleIsNull(m) ? -1 : 0;
  if (!rc) {
    fprintf(stderr, "// ----- IR after %s -----\n", stage);
    nova_print_op(mlirModuleGetOperation(m), stderr);
    mlirModuleDestroy(m);
  }
  nova_ctx_dispose(&c);
  return rc;
}

static int dump_if(const opts *o, const char *stage, MlirModule m) {
  if (o->dump_after && !strcmp(o->dump_after, stage)) {
    fprintf(stderr, "// ----- IR after %s -----\n", stage);
    nova_print_op(mlirModuleGetOperation(m), stderr);
  }
  return 0;
}

/* The initial values a step.so embeds (init.bin, pulled in by .incbin and
 * reached by 32-bit PC-relative relocations: the bytes of file(...) params
 * and of ONNX initializers; generated values travel as their recipe): at
 * most 1 GiB, checked before any of them is read. */
#define NV_MAX_INIT_BYTES (INT64_C(1) << 30)

/* Params (and inputs with a default) whose initial bytes the step.so
 * would embed: one over NV_MAX_INIT_BYTES, or all of them together, is an
 * error.  0 or -1 after a diagnostic. */
static int check_init_bytes(nv_diag *d, const nv_graph *g, const char *input) {
  int64_t total = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const nv_node *x = g->nodes[i];
    if ((x->op != NV_OP_PARAM && !(x->op == NV_OP_INPUT && x->has_default)) || !fe_init_is_bytes(x)) continue;
    int64_t bytes = fe_numel(x) * (int64_t)fe_dtype_size(x->dtype);
    if (bytes > NV_MAX_INIT_BYTES) {
      nv_error(d, x->loc, "%s '%s': %lld bytes of initial values; a step.so holds at most %lld MiB of them",
               x->op == NV_OP_PARAM ? "param" : "input", x->name ? x->name : "", (long long)bytes,
               (long long)(NV_MAX_INIT_BYTES >> 20));
      return -1;
    }
    total += bytes;
  }
  if (total > NV_MAX_INIT_BYTES) {
    nv_error_plain(d, "%s: the params' initial values take %lld bytes; a step.so holds at most %lld MiB of them",
                   input, (long long)total, (long long)(NV_MAX_INIT_BYTES >> 20));
    return -1;
  }
  return 0;
}

/* The names of the params G's loss depends on through differentiable ops
 * (into NAMES, borrowed from G), or -1 when that is not known. */
static int reached_params(nv_graph *g, nv_diag *quiet, const char *loss, const char **names) {
  int nf = g->nnodes, k = 0;
  bool *reached = nv_xcalloc((size_t)nf + 1, sizeof *reached);
  if (!reached || ad_grad_reach(g, quiet, loss, reached)) k = -1;
  for (int i = 0; k >= 0 && i < nf; i++)
    if (reached[i]) names[k++] = g->nodes[i]->name;
  free(reached);
  return k;
}

/* An ONNX model for --train, imported twice: first with every float
 * initializer a parameter, quietly, to find those the loss depends on
 * through differentiable ops; then for real, with the roles onnx_roles.c
 * gives them.  --freeze and --train-only are applied here, not by
 * autodiff.  With EVAL, a third time, quietly, for the evaluation entry
 * (*EVAL NULL if that import failed). */
static nv_graph *load_onnx_train(nv_diag *d, opts *o, nv_graph **eval) {
  nv_diag *quiet = nv_diag_create(NULL);
  fe_train_roles probe = {.nreach = -1, .probe = true}; /* training-mode Dropout is built, too */
  nv_graph *g1 = quiet ? fe_load_onnx(quiet, o->input, o->dims, o->ndims, &probe) : NULL;
  const char **names = g1 ? nv_xcalloc((size_t)g1->nnodes + 1, sizeof *names) : NULL;
  fe_train_roles r = {o->ad.freeze, o->ad.train_only, names, -1, false, false};
  if (names) r.nreach = reached_params(g1, quiet, o->ad.loss, names);
  nv_graph *g = fe_load_onnx(d, o->input, o->dims, o->ndims, &r);
  if (g && eval && (o->eval_diag = nv_diag_create(NULL))) {
    r.eval = true;
    *eval = fe_load_onnx(o->eval_diag, o->input, o->dims, o->ndims, &r);
  }
  free(names);
  fe_graph_destroy(g1);
  nv_diag_destroy(quiet);
  o->ad.freeze = o->ad.train_only = NULL;
  return g;
}

/* .nova or .onnx input -> graph; with EVAL (--train, cpu) also the graph
 * of the evaluation entry into *EVAL (NULL if it could not be made). */
static nv_graph *load_input(nv_diag *d, opts *o, nv_graph **eval) {
  size_t len = 0;
  const char *ext = strrchr(o->input, '.');
  nv_graph *g = NULL;
  if (ext && !strcmp(ext, ".onnx")) {
    g = o->train ? load_onnx_train(d, o, eval) : fe_load_onnx(d, o->input, o->dims, o->ndims, NULL);
    goto check_dims;
  }
  if (!ext || strcmp(ext, ".nova")) {
    nv_error_plain(d, "%s: unknown input kind; expected a .nova or .onnx file", o->input);
    return NULL;
  }
  char *text = nv_read_file(o->input, &len, (size_t)64 << 20);
  if (!text) {
    nv_error_plain(d, "cannot read %s: %s", o->input,
                   errno == EFBIG ? "file is larger than 64 MiB" : strerror(errno));
    return NULL;
  }
  const char *name = nv_diag_add_source(d, o->input, text, len);
  char *dircopy = nv_xstrdup(o->input);
  const char *base = dircopy ? dirname(dircopy) : ".";
  g = fe_parse_text(d, name, text, len, base, o->dims, o->ndims);
  if (g && eval && (o->eval_diag = nv_diag_create(NULL))) /* .nova has no train/eval differences */
    *eval = fe_parse_text(o->eval_diag, name, text, len, base, o->dims, o->ndims);
  free(dircopy);
  free(text);
check_dims:
  for (int i = 0; g && i < o->ndims; i++)
    if (!o->dims[i].used) {
      nv_error_plain(d, "--dim=%s=%lld: the model has no dimension named '%s'", o->dims[i].name,
                     (long long)o->dims[i].value, o->dims[i].name);
      fe_graph_destroy(g);
      return NULL;
    }
  return g;
}

/* The manifest's default path: OUTPUT with .json for .so. */
static char *manifest_of(const char *output) {
  size_t n = output ? strlen(output) : 0;
  char *m = output ? nv_xmalloc(n + 6) : NULL;
  if (!m) return NULL;
  memcpy(m, output, n + 1);
  if (n > 3 && !strcmp(m + n - 3, ".so")) m[n - 3] = 0;
  strcat(m, ".json");
  return m;
}

static char *default_output(const char *input, const char *ext) {
  char *copy = nv_xstrdup(input);
  if (!copy) return NULL;
  char *base = basename(copy);
  char *dot = strrchr(base, '.');
  if (dot && dot != base) *dot = 0;
  size_t n = strlen(base) + strlen(ext) + 1;
  char *out = nv_xmalloc(n);
  if (out) snprintf(out, n, "%s%s", base, ext);
  free(copy);
  return out;
}

/* The evaluation entry of the training step G: GE, its forward graph
 * (BatchNormalization with running statistics), lowered like the step to
 * the LLVM dialect (*LIN, with plan PLAN) with its symbols renamed
 * CG_EVAL_PREFIX*, so that both link into one step.so. */
static int build_eval(nova_ctx *c, const opts *o, const nv_graph *g, nv_graph *ge, const cfg_device *dev,
                      MlirModule *nova, MlirModule *lin, cg_plan *plan) {
  if (!ge) {
    nv_error_plain(c->diag, "internal: the forward graph of the evaluation entry could not be built");
    return -1;
  }
  for (int i = 0; i < g->noutputs; i++) /* the loss is the training step's */
    for (int k = 0; g->outputs[i].role == NOVA_ROLE_LOSS && k < ge->noutputs; k++)
      if (!strcmp(ge->outputs[k].name, g->outputs[i].name)) ge->outputs[k].role = NOVA_ROLE_LOSS;
  *nova = nova_build_module(c, ge);
  if (mlirModuleIsNull(*nova) || nova_verify(c, *nova, "the evaluation entry")) return -1;
  *lin = cg_lower_to_linalg(c, *nova);
  if (mlirModuleIsNull(*lin) || nova_verify(c, *lin, "lowering the evaluation entry to linalg")) return -1;
  np_run r = {.c = c, .dev = dev, .opt_level = o->opt_level};
  if (np_lower(&r, ge, *lin, plan)) return -1;
  if (cg_prefix_symbols(*lin, CG_EVAL_PREFIX)) {
    nv_error_plain(c->diag, "internal: the evaluation entry's functions could not be renamed");
    return -1;
  }
  return 0;
}

/* --precision (or the model's 'precision'): the amp pass on G and on GE
 * (the evaluation entry's graph, or NULL), before autodiff; tf32 turns on
 * cuda's tensor-core f32 matmuls; fp16 training gets dynamic loss scaling
 * unless --loss-scale=none.  0, or -1 after a diagnostic. */
static int apply_precision(nv_diag *d, opts *o, nv_graph *g, nv_graph *ge, const cfg_device *dev) {
  bool cuda = dev->kind == CFG_DEV_GPU;
  char p[sizeof g->precision];
  snprintf(p, sizeof p, "%s", o->precision ? o->precision : g->precision[0] ? g->precision : "fp32");
  memcpy(g->precision, p, sizeof p);
  /* bf16 arithmetic (and its tensor cores) came with sm_80: computing in
   * bf16 on an older GPU would be f32 work on rounded values, slower than
   * fp32, so it is refused there (as PyTorch's autocast does) */
  if (cuda && !strcmp(p, "bf16") && (dev->cc_major < 8 || !dev->has_mma_sync_bf16)) {
    nv_error_plain(d, "--precision=bf16%s: %s (sm_%d%d) has no bf16 arithmetic or tensor cores (sm_80 and newer "
                      "have); use --precision=fp16 or fp32",
                   o->precision ? "" : " (the model's precision statement)", dev->name, dev->cc_major, dev->cc_minor);
    return -1;
  }
  if (strcmp(p, "fp32")) nv_sb_printf(&o->flags, " --precision=%s", p);
  bool low = !strcmp(p, "bf16") || !strcmp(p, "fp16");
  if (!strcmp(p, "tf32")) {
    if (!cuda) {
      nv_error_plain(d, "--precision=tf32: tf32 is the tensor-core format of NVIDIA GPUs (sm_80 and up); the cpu "
                        "target has no tf32 arithmetic and computes f32 matmuls exactly (use fp32, or bf16)");
      return -1;
    }
    o->tf32 = true;
  }
  if (o->policy && !low) {
    nv_error_plain(d, "--precision-policy needs --precision=bf16 or fp16 (at %s every op computes in its own dtype)", p);
    return -1;
  }
  if ((o->loss_scale_set || o->window_set) && !o->train) {
    nv_error_plain(d, "--loss-scale and --loss-scale-window need --train");
    return -1;
  }
  bool no_master = o->bf16_master && !strcmp(o->bf16_master, "none");
  if (no_master && (!o->train || strcmp(p, "bf16"))) {
    nv_error_plain(d, "--bf16-master=none needs --train and --precision=bf16 (here %s%s): it stores the trained "
                      "parameters in bf16",
                   o->train ? "--precision=" : "no --train", o->train ? p : "");
    return -1;
  }
  o->ad.bf16_sround = no_master;
  if (!o->loss_scale_set && !strcmp(p, "fp16")) o->ad.loss_scale = 65536; /* torch.amp.GradScaler's */
  if (!o->window_set) o->ad.loss_scale_window = 2000;
  bool half_params = false; /* trained 16-bit params get f32 masters at every precision */
  for (int i = 0; o->train && i < g->nnodes && !half_params; i++)
    half_params = g->nodes[i]->op == NV_OP_PARAM && fe_dtype_is_half(g->nodes[i]->dtype);
  if (!low && !half_params) return 0;
  amp_policy pol;
  amp_policy_default(&pol);
  int rc = o->policy ? amp_policy_load(&pol, d, o->policy) : 0;
  amp_options ao = {.low = !low ? (nova_dtype)0 : !strcmp(p, "bf16") ? NOVA_DTYPE_BF16 : NOVA_DTYPE_F16,
                    .policy = &pol, .masters = o->train, .bf16_params = no_master, .freeze = o->ad.freeze,
                    .train_only = o->ad.train_only};
  amp_stats st;
  if (!rc) rc = amp_apply(g, d, &ao, &st);
  if (!rc && o->verbose)
    fprintf(stderr, "novac: --precision=%s: %d ops in %s, %d casts, %d f32 masters, %d params in bf16\n", p,
            st.low_ops, p, st.casts, st.masters, st.bf16_params);
  if (!rc && ge) {
    snprintf(ge->precision, sizeof ge->precision, "%s", p);
    rc = amp_apply(ge, o->eval_diag ? o->eval_diag : d, &ao, NULL);
  }
  amp_policy_free(&pol);
  return rc;
}

/* --attention=fused (-O1 and up): attention written out op by op becomes
 * one attention op (passes/attention.c), in the step and its evaluation
 * entry alike.  (Not the default: on the cpu its lowering is slower than the
 * ops as written; --memory-limit recomputes their probabilities instead.) */
static int fuse_attention(nv_diag *d, const opts *o, nv_graph *g, nv_graph *ge) {
  if (o->opt_level == 0 || !o->fused_attention) return 0;
  int n = 0, ne = 0;
  if (ad_fuse_attention(g, d, &n) || (ge && ad_fuse_attention(ge, o->eval_diag ? o->eval_diag : d, &ne))) return -1;
  if (o->verbose && n) fprintf(stderr, "novac: --attention=fused: %d attention%s fused\n", n, n == 1 ? "" : "s");
  return 0;
}

/* -M / -MD: the dependency rule of the output (o->output, else the
 * default step.so name), the device and policy files among its
 * prerequisites where they are files. */
static int write_deps(nv_diag *d, const opts *o) {
  char rtdir[PATH_MAX + 32];
  runtime_dir(rtdir, sizeof rtdir);
  const char *extra[2] = {nd_device_is_file(o->device) ? o->device : NULL, o->policy};
  char *def = o->output ? NULL : default_output(o->input, o->emit == EMIT_OBJ ? ".o" : ".so");
  const char *target = o->output ? o->output : def;
  int rc = target ? nd_deps_write(d, &o->deps, target, o->input, extra, 2, rtdir, o->argc, o->argv) : -1;
  free(def);
  return rc;
}

/* A step for several sizes (--dim=NAME=LO..HI; passes/buckets.h): the
 * analysis of two builds, the axes of the inputs and outputs that follow
 * the size, and the smaller buckets' steps, made one after the other. */
typedef struct sizes {
  bool on;
  bk_info info, einfo;  /* the step's builds; the evaluation entry's (nnodes 0: none) */
  cg_dim_axis axes[64];
  int naxes;
  int n;                /* the smaller buckets */
  cg_bucket b[16];
  nv_graph *g[16], *ge[16];
  MlirModule nova[16], enova[16];
  cg_plan plan[16], eplan[16];
  nv_diag *diags[34];   /* the evaluation imports' quiet diagnostics (their graphs' locations) */
  int ndiags;
} sizes;

/* The model loaded again with the ranged dimension at SIZE (and its
 * evaluation graph into *GE when GE): --freeze and --train-only, which a
 * load uses up, kept for the next. */
static nv_graph *load_at(nv_diag *d, opts *o, sizes *sz, int64_t size, nv_graph **ge) {
  const char *freeze = o->ad.freeze, *only = o->ad.train_only;
  nv_diag *keep = o->eval_diag;
  int64_t was = o->dims[o->ranged].value;
  o->dims[o->ranged].value = size;
  o->eval_diag = NULL;
  nv_graph *g = load_input(d, o, ge);
  if (o->eval_diag && sz->ndiags < (int)(sizeof sz->diags / sizeof *sz->diags)) sz->diags[sz->ndiags++] = o->eval_diag;
  else nv_diag_destroy(o->eval_diag);
  o->eval_diag = keep;
  o->dims[o->ranged].value = was;
  o->ad.freeze = freeze, o->ad.train_only = only;
  return g;
}

static void sizes_free(sizes *sz) {
  for (int k = 0; k < sz->n; k++) {
    if (!mlirModuleIsNull(sz->b[k].module)) mlirModuleDestroy(sz->b[k].module);
    if (!mlirModuleIsNull(sz->b[k].eval_module)) mlirModuleDestroy(sz->b[k].eval_module);
    if (!mlirModuleIsNull(sz->nova[k])) mlirModuleDestroy(sz->nova[k]);
    if (!mlirModuleIsNull(sz->enova[k])) mlirModuleDestroy(sz->enova[k]);
    cg_plan_free(&sz->plan[k]);
    cg_plan_free(&sz->eplan[k]);
    fe_graph_destroy(sz->g[k]);
    fe_graph_destroy(sz->ge[k]);
  }
  for (int i = 0; i < sz->ndiags; i++) nv_diag_destroy(sz->diags[i]);
  bk_info_free(&sz->info);
  bk_info_free(&sz->einfo);
  memset(sz, 0, sizeof *sz);
}

/* What the axes of G's inputs and outputs (the build at the largest size)
 * do with the size, from INFO.  0, or -1 after a diagnostic (too many). */
static int io_axes(nv_diag *d, sizes *sz, const nv_graph *g) {
  for (int i = 0; i < g->nnodes + g->noutputs; i++) {
    const nv_node *x = i < g->nnodes ? g->nodes[i] : g->outputs[i - g->nnodes].node;
    const char *name = i < g->nnodes ? x->name : g->outputs[i - g->nnodes].name;
    if (i < g->nnodes && x->op != NV_OP_INPUT) continue;
    for (int k = 0; k < x->rank; k++) {
      if (!sz->info.axes[x->id][k].a) continue;
      if (sz->naxes == (int)(sizeof sz->axes / sizeof *sz->axes)) {
        nv_error_plain(d, "--dim=%s with several sizes: more than %d axes of inputs and outputs follow the size",
                       sz->info.dim, sz->naxes);
        return -1;
      }
      sz->axes[sz->naxes++] = (cg_dim_axis){name, k, sz->info.axes[x->id][k].a, sz->info.axes[x->id][k].c};
    }
  }
  return 0;
}

/* Before the passes: the builds compared (G, GE at the largest size and
 * one more) and G, GE masked for the largest size.  0, or -1 after a
 * diagnostic. */
static int sizes_begin(nv_diag *d, opts *o, bool cuda, nv_graph *g, nv_graph *ge, sizes *sz) {
  const char *dim = o->dims[o->ranged].name, *why = NULL;
  if (cuda) why = "--target=cuda (the cpu target has them)";
  else if (o->emit != EMIT_SO) why = "--emit other than so";
  else if (o->memory_limit) why = "--memory-limit";
  else if (o->ad.data_parallel) why = "--data-parallel";
  else if (o->explain_config || o->memory_report || o->dump_after) why = "--explain-config, --memory-report or --dump-after";
  if (why) {
    nv_error_plain(d, "--dim=%s with several sizes does not work with %s yet; give one size (--dim=%s=N)", dim, why, dim);
    return -1;
  }
  int64_t probe = o->nsizes > 1 ? o->sizes[0] : o->size_lo;
  nv_graph *gep = NULL, *gp = load_at(d, o, sz, probe, ge ? &gep : NULL);
  int rc = gp ? bk_analyze(d, dim, gp, probe, g, o->size_hi, &sz->info) : -1;
  if (!rc && ge && gep) rc = bk_analyze(d, dim, gep, probe, ge, o->size_hi, &sz->einfo);
  fe_graph_destroy(gp);
  fe_graph_destroy(gep);
  if (rc) return -1;
  sz->on = true;
  if (io_axes(d, sz, g)) return -1;
  if (bk_mask(d, g, &sz->info, o->size_hi, o->size_lo) ||
      (ge && bk_mask(o->eval_diag ? o->eval_diag : d, ge, &sz->einfo, o->size_hi, o->size_lo)))
    return -1;
  return 0;
}

/* The smaller buckets: each loaded, masked, through the graph passes the
 * step took (precision, attention, autodiff, recompute, schedule) and
 * lowered to the LLVM dialect with its symbols prefixed; CO told of them.
 * 0, or -1 after a diagnostic. */
static int sizes_lower(nova_ctx *c, nv_diag *d, opts *o, const cfg_device *dev, sizes *sz, cg_options *co) {
  size_t flags_len = o->flags.len; /* apply_precision adds to them again */
  bool eval = co->eval_graph != NULL;
  for (int k = 0; k + 1 < o->nsizes; k++) {
    int64_t size = o->sizes[k];
    cg_bucket *b = &sz->b[k];
    sz->n = k + 1;
    b->size = size;
    snprintf(b->prefix, sizeof b->prefix, "nova_b%lld_", (long long)size);
    nv_graph *g = sz->g[k] = load_at(d, o, sz, size, eval ? &sz->ge[k] : NULL), *ge = sz->ge[k];
    nv_diag *qd = o->eval_diag ? o->eval_diag : d;
    if (!g || (eval && !ge)) return -1;
    if (bk_mask(d, g, &sz->info, size, o->size_lo) || (ge && bk_mask(qd, ge, &sz->einfo, size, o->size_lo))) return -1;
    int rc = apply_precision(d, o, g, ge, dev) || fuse_attention(d, o, g, ge);
    o->flags.len = flags_len;
    if (o->flags.s) o->flags.s[flags_len] = 0;
    if (rc) return -1;
    if (o->train && (ad_train(g, d, &o->ad) ||
                     (o->opt_level > 0 && !o->no_recompute && ad_recompute(g, d, NULL)) || ad_schedule_updates(g)))
      return -1;
    sz->nova[k] = nova_build_module(c, g);
    if (mlirModuleIsNull(sz->nova[k]) || nova_verify(c, sz->nova[k], "frontend")) return -1;
    b->module = cg_lower_to_linalg(c, sz->nova[k]);
    if (mlirModuleIsNull(b->module) || nova_verify(c, b->module, "lowering to linalg")) return -1;
    np_run r = {.c = c, .dev = dev, .opt_level = o->opt_level};
    if (np_lower(&r, g, b->module, &sz->plan[k])) return -1;
    b->graph = g;
    b->plan = &sz->plan[k];
    if (ge && build_eval(c, o, g, ge, dev, &sz->enova[k], &b->eval_module, &sz->eplan[k])) return -1;
    if (cg_prefix_symbols(b->module, b->prefix) || (ge && cg_prefix_symbols(b->eval_module, b->prefix))) {
      nv_error_plain(d, "internal: the functions of the step for %s=%lld could not be renamed", o->dims[o->ranged].name,
                     (long long)size);
      return -1;
    }
    if (ge) {
      b->eval_graph = ge;
      b->eval_plan = &sz->eplan[k];
    }
  }
  co->dim_name = o->dims[o->ranged].name;
  co->dim_lo = o->size_lo;
  co->dim_hi = o->size_hi;
  co->nbuckets = sz->n;
  co->buckets = sz->b;
  co->ndim_axes = sz->naxes;
  co->dim_axes = sz->axes;
  return 0;
}

static int compile(nv_diag *d, opts *o) {
  timer tm = {o->time_passes, now_ms(), 0};
  bool cuda = !strcmp(o->target, "cuda");
  if (o->gpu_sim && !cuda) {
    nv_error_plain(d, "--gpu-sim needs --target=cuda");
    return -1;
  }
  if (o->tf32 && !cuda) {
    nv_error_plain(d, "--matmul-precision=tf32 needs --target=cuda (the cpu target computes matmuls in full precision)");
    return -1;
  }
  if (o->gpu_block && !cuda) {
    nv_error_plain(d, "--gpu-block needs --target=cuda");
    return -1;
  }
  if (o->gemm_tile[0] && !cuda) {
    nv_error_plain(d, "--gemm-tile needs --target=cuda (the cpu target's tiles come from its registers and caches)");
    return -1;
  }
  if (o->gpu_sim && o->emit == EMIT_PTX) {
    nv_error_plain(d, "--gpu-sim makes CPU code: there is no PTX to emit");
    return -1;
  }
  if (o->emit == EMIT_PTX && !cuda) {
    nv_error_plain(d, "--emit=ptx needs --target=cuda");
    return -1;
  }
  if (o->memory_limit && o->opt_level == 0) {
    nv_error_plain(d, "--memory-limit needs -O1 or above (at -O0 intermediates live on the heap, unplanned)");
    return -1;
  }
  cfg_device dev;
  if (nd_device(d, cuda, o->device, &dev)) return -1;
  if (o->dump_after && !known_stage(cuda, o->dump_after)) {
    nv_sbuf names = {0};
    for (int i = 0; graph_stages[i]; i++) nv_sb_printf(&names, "%s, ", graph_stages[i]);
    for (int i = 0; np_stage_name(cuda, i); i++)
      nv_sb_printf(&names, "%s%s", np_stage_name(cuda, i), np_stage_name(cuda, i + 1) ? ", " : "");
    nv_error_plain(d, "unknown --dump-after stage '%s'%s; stages: %s", o->dump_after, cuda ? " for --target=cuda" : "",
                   names.s ? names.s : "");
    nv_sb_free(&names);
    return -1;
  }
  nv_graph *ge = NULL; /* the evaluation entry's graph (a cpu training step.so) */
  nv_graph *g = load_input(d, o, o->train && !cuda && o->emit == EMIT_SO ? &ge : NULL);
  stage_done(&tm, "frontend");
  if (!g) return -1;
  for (int i = 0; i < g->nnodes; i++) /* a .nova model's parameter files */
    if (g->nodes[i]->init.kind == NV_INIT_FILE && g->nodes[i]->init.path) nv_dep_note(g->nodes[i]->init.path);
  if (o->deps.only) {
    int rc = write_deps(d, o);
    fe_graph_destroy(g);
    fe_graph_destroy(ge);
    return rc;
  }
  /* the compile cache: a hit copies the step and its manifest */
  nc_cache cache = {.dir = o->cache_dir ? o->cache_dir : getenv("NOVAC_CACHE_DIR"), .max_bytes = o->cache_max,
                    .explain = o->explain_cache, .d = d};
  if (cache.dir && !*cache.dir) cache.dir = NULL;
  bool cacheable = cache.dir && o->emit == EMIT_SO && !o->explain_config && !o->dump_after && !o->memory_report;
  nc_key key;
  if (cacheable) {
    /* the flags that change the output, but for those that name what the
       device and policy parts hash (a policy file moved is the same policy) */
    nv_sbuf opt = {0};
    const char *f = o->flags.s ? o->flags.s : "";
    while (*f) {
      while (*f == ' ') f++;
      size_t n = strcspn(f, " ");
      if (n && strncmp(f, "--device=", 9) && strncmp(f, "--target=", 9) && strncmp(f, "--cpu=", 6) &&
          strncmp(f, "--precision-policy=", 19))
        nv_sb_printf(&opt, " %.*s", (int)n, f);
      f += n;
    }
    nv_sb_printf(&opt, " precision=%s", o->precision ? o->precision : g->precision[0] ? g->precision : "fp32");
    nc_key_make(&key, g, opt.oom ? "" : opt.s, &dev, cuda, o->cpu, o->policy);
    nv_sb_free(&opt);
    char *so = o->output ? NULL : default_output(o->input, ".so");
    char *man = o->manifest ? NULL : manifest_of(so ? so : o->output);
    int hit = nc_lookup(&cache, &key, g, so ? so : o->output, man ? man : o->manifest, o->input);
    if (hit == 1 && o->deps.with_compile && write_deps(d, o)) hit = -1;
    free(so);
    free(man);
    if (hit) {
      stage_done(&tm, "compile cache (hit)");
      fe_graph_destroy(g);
      fe_graph_destroy(ge);
      return hit == 1 ? 0 : -1;
    }
    stage_done(&tm, "compile cache (miss)");
  }
  sizes sz = {0};
  if ((o->emit == EMIT_SO && check_init_bytes(d, g, o->input)) ||
      (o->ranged >= 0 && sizes_begin(d, o, cuda, g, ge, &sz))) {
    sizes_free(&sz);
    fe_graph_destroy(g);
    fe_graph_destroy(ge);
    return -1;
  }
  if (apply_precision(d, o, g, ge, &dev) || dump_graph(o, "amp", d, g)) {
    fe_graph_destroy(g);
    fe_graph_destroy(ge);
    sizes_free(&sz);
    return -1;
  }
  if (fuse_attention(d, o, g, ge) || dump_graph(o, "attention", d, g)) {
    fe_graph_destroy(g);
    fe_graph_destroy(ge);
    sizes_free(&sz);
    return -1;
  }
  if (o->train) {
    /* dynamic loss scaling skips an overflowing step whole */
    o->ad.nonfinite = o->nonfinite ? (!strcmp(o->nonfinite, "skip-param") ? AD_SKIP_PARAM : AD_SKIP_STEP)
                      : o->ad.loss_scale > 0 || o->shard_optimizer || o->ad.clip_norm > 0 || o->ad.accumulate > 1
                          ? AD_SKIP_STEP
                                                                                          : AD_SKIP_PARAM;
    if (o->shard_optimizer && o->ad.data_parallel && o->ad.world_size < 2) {
      nv_error_plain(d, "--shard-optimizer needs --world-size=N, N >= 2: the ranks the optimizer state is shared "
                        "out over (each holds 1/N of it)");
      fe_graph_destroy(g);
      fe_graph_destroy(ge);
      return -1;
    }
    o->ad.shard_world = o->shard_optimizer && o->ad.data_parallel ? o->ad.world_size : 0;
    if (ad_train(g, d, &o->ad) || dump_graph(o, "autodiff", d, g)) {
      fe_graph_destroy(g);
      fe_graph_destroy(ge);
      return -1;
    }
    stage_done(&tm, "autodiff + optimizer");
  } else if (o->ad.clip_norm > 0 || o->ad.no_decay || o->ad.accumulate) {
    nv_error_plain(d, "%s needs --train", o->ad.no_decay     ? "--no-decay"
                                          : o->ad.accumulate ? "--accumulate"
                                                             : "--clip-grad-norm");
    fe_graph_destroy(g);
    fe_graph_destroy(ge);
    sizes_free(&sz);
    return -1;
  } else if (o->ad.loss || o->ad.freeze || o->ad.train_only || o->ad.keep_grads || o->nonfinite ||
             o->ad.data_parallel || o->bucket_bytes || o->shard_optimizer || o->ad.world_size) {
    nv_error_plain(d, o->ad.loss || o->ad.freeze || o->ad.train_only ? "--loss, --freeze and --train-only need --train"
                      : o->ad.keep_grads ? "--keep-grads needs --train"
                      : o->nonfinite ? "--nonfinite needs --train"
                                     : "--data-parallel, --bucket-size, --shard-optimizer and --world-size need --train");
    fe_graph_destroy(g);
    fe_graph_destroy(ge);
    sizes_free(&sz);
    return -1;
  }
  if ((o->bucket_bytes || o->shard_optimizer || o->ad.world_size) && !o->ad.data_parallel) {
    nv_error_plain(d, "%s needs --data-parallel", o->bucket_bytes ? "--bucket-size" : o->shard_optimizer ? "--shard-optimizer" : "--world-size");
    fe_graph_destroy(g);
    fe_graph_destroy(ge);
    sizes_free(&sz);
    return -1;
  }
  if (o->ad.data_parallel && !o->bucket_bytes) o->bucket_bytes = (int64_t)25 << 20; /* PyTorch DDP's */
  nova_ctx c;
  int rc = -1;
  MlirModule nova = {NULL}, lin = {NULL}, enova = {NULL}, elin = {NULL};
  cg_gpu gpu = {0};
  cg_plan plan = {0}, eplan = {0};
  cg_step_build *build = NULL; /* the step.so being built (cg_step_begin) */
  plan.memory_limit = o->memory_limit;
  char *out_default = NULL, *man_default = NULL;
  if (nova_ctx_init(&c, d)) {
    fe_graph_destroy(g);
    fe_graph_destroy(ge);
    sizes_free(&sz);
    return -1;
  }
  /* convolutions as im2col + GEMMs where contractions are the fast kernels: the
   * cpu's runtime kernels, the GPU's tiled GEMMs (tensor cores under bf16/fp16) */
  c.conv_gemm = cuda ? o->opt_level > 0 : cg_cpu_f32_kernel(&dev, o->opt_level);
  cg_gpu_options go = {o->opt_level, o->gpu_sim, o->gpu_block, o->tf32, o->memory_limit, {0}};
  memcpy(go.gemm_tile, o->gemm_tile, sizeof go.gemm_tile);
  if (o->train && (o->opt_level > 0 && !o->no_recompute)) {
    ad_remat pick = {-1, 0, 0, false};
    if (o->memory_limit) { /* what the backward recomputes: measured plans (driver/pipeline.c) */
      np_run r = {.c = &c, .dev = &dev, .gpu = cuda ? &go : NULL, .opt_level = o->opt_level,
                  .bucket_bytes = o->ad.data_parallel ? o->bucket_bytes : 0};
      np_fit fit;
      if (np_fit_recompute(&r, g, o->memory_limit, &pick, &fit)) goto out;
      if (o->verbose) {
        char rows[64] = "";
        if (fit.peak_rows > 0 && pick.mu >= 0)
          snprintf(rows, sizeof rows, "; with norms and attention: %.1f MiB", fit.peak_rows / 1048576.0);
        fprintf(stderr, "novac: --memory-limit: %d plans measured; %s: peak %.1f MiB (cheap ops alone: %.1f MiB%s)\n",
                fit.trials, pick.mu >= 0 ? "recomputing by segments" : pick.rows ? "recomputing cheap ops, norms and "
                "attention probabilities" : "recomputing cheap ops", fit.peak / 1048576.0, fit.peak_cheap / 1048576.0,
                rows);
      }
      stage_done(&tm, "recompute for --memory-limit");
      if (pick.mu >= 0 && fit.peak > o->memory_limit) { /* (the linalg stage's cheap candidates: no more) */
        char l[64], a[64], b[64];
        nv_error_plain(d, "--memory-limit: the step does not fit in %s: its planned peak is %s with cheap values "
                       "recomputed; recomputing the layers from checkpoints (%d plans measured), the smallest peak "
                       "reached is %s, at %s",
                       nv_human_bytes(l, sizeof l, o->memory_limit), nv_human_bytes(a, sizeof a, fit.peak_cheap),
                       fit.trials, nv_human_bytes(b, sizeof b, fit.peak), fit.where);
        goto out;
      }
    }
    if (ad_recompute(g, d, pick.mu < 0 && !pick.rows ? NULL : &pick)) goto out;
  }
  if (o->train && (dump_graph(o, "recompute", d, g) || ad_schedule_updates(g) ||
                   (o->ad.data_parallel && ad_comm_schedule(g, o->bucket_bytes)) || dump_graph(o, "schedule", d, g)))
    goto out;
  nova = nova_build_module(&c, g);
  if (mlirModuleIsNull(nova) || nova_verify(&c, nova, "frontend")) goto out;
  stage_done(&tm, "build nova IR");
  dump_if(o, "frontend", nova);
  if (o->emit == EMIT_NOVA) {
    if (cg_fusion_groups(&c, nova, o->opt_level)) goto out;
    nv_out to;
    FILE *f = open_text_out(d, &to, o->output);
    if (!f) goto out;
    nova_print_op(mlirModuleGetOperation(nova), f);
    rc = close_text_out(d, &to, 0);
    goto out;
  }
  lin = cg_lower_to_linalg(&c, nova);
  if (mlirModuleIsNull(lin) || nova_verify(&c, lin, "lowering to linalg")) {
    if (mlirModuleIsNull(lin)) nv_error_plain(d, "internal: the linalg lowering produced invalid IR");
    goto out;
  }
  stage_done(&tm, "lower to linalg");
  dump_if(o, "linalg", lin);
  if (o->emit == EMIT_LINALG) {
    nv_out to;
    FILE *f = open_text_out(d, &to, o->output);
    if (!f) goto out;
    nova_print_op(mlirModuleGetOperation(lin), f);
    rc = close_text_out(d, &to, 0);
    goto out;
  }
  char rtdir[PATH_MAX + 32];
  runtime_dir(rtdir, sizeof rtdir);
  cg_options co = {.input_name = o->input, .cpu = o->cpu, .opt_level = o->opt_level,
                   .flags_text = o->flags.s ? o->flags.s + 1 : "", .rt_dir = rtdir,
                   .time_passes = o->time_passes, .verbose = o->verbose,
                   .keep_temps = getenv("NOVAC_KEEP_TEMPS") != NULL};
  if (cuda) {
    np_run r = {.c = &c, .dev = &dev, .gpu = &go, .gpu_out = &gpu, .opt_level = o->opt_level,
                .dump_after = o->dump_after, .time_passes = o->time_passes};
    if (np_lower(&r, g, lin, NULL)) goto out;
    gpu.dev = &dev;
    co.gpu = o->gpu_sim ? NULL : &gpu; /* --gpu-sim: a cpu step */
    co.plan = &gpu.plan;
    stage_done(&tm, "bufferize + GPU kernels + PTX");
    if (nd_check_memory(d, &dev, g, &gpu)) goto out;
  } else if (o->emit != EMIT_MANIFEST) {
    np_run r = {.c = &c, .dev = &dev, .opt_level = o->opt_level, .dump_after = o->dump_after,
                .time_passes = o->time_passes};
    if (np_lower(&r, g, lin, &plan)) goto out;
    co.plan = &plan;
    stage_done(&tm, "bufferize + to LLVM");
    /* the step's code generation runs while the evaluation entry is built */
    if (o->emit == EMIT_SO && !(build = cg_step_begin(&c, g, lin, &co))) goto out;
    if (o->train && o->emit == EMIT_SO) {
      if (build_eval(&c, o, g, ge, &dev, &enova, &elin, &eplan)) goto out;
      co.eval_graph = ge;
      co.eval_module = elin;
      co.eval_plan = &eplan;
      stage_done(&tm, "evaluation entry");
    }
    if (sz.on) {
      if (sizes_lower(&c, d, o, &dev, &sz, &co)) goto out;
      stage_done(&tm, "smaller sizes' steps");
    }
  }
  if (o->explain_config) nd_explain(stdout, &dev, g, cuda ? &gpu : NULL);
  if (o->memory_report && o->emit == EMIT_SO) { /* not over what the compile writes */
    char *so = o->output ? NULL : default_output(o->input, ".so");
    char *man = o->manifest ? NULL : manifest_of(so ? so : o->output);
    const char *so_path = so ? so : o->output, *man_path = man ? man : o->manifest;
    bool clash = (so_path && !strcmp(o->memory_report, so_path)) || (man_path && !strcmp(o->memory_report, man_path));
    free(so);
    free(man);
    if (clash) {
      nv_error_plain(d, "--memory-report=%s would be overwritten by the step or its manifest; name another file",
                     o->memory_report);
      goto out;
    }
  }
  if (o->memory_report && nd_memory_report(d, g, co.plan, o->memory_report)) goto out;
  if (o->emit == EMIT_MANIFEST) {
    char cpu[128];
    cg_cpu_name(&co, cpu, sizeof cpu);
    rc = cg_write_manifest(&c, g, &co, cpu, o->output ? o->output : "-");
    goto out;
  }
  if (o->emit == EMIT_PTX) {
    nv_out to;
    FILE *f = open_text_out(d, &to, o->output);
    if (!f) goto out;
    fputs(gpu.ptx, f);
    rc = close_text_out(d, &to, 0);
    goto out;
  }
  if (o->emit == EMIT_LLVM) {
    nv_out to;
    FILE *f = open_text_out(d, &to, o->output);
    if (!f) goto out;
    rc = close_text_out(d, &to, cg_emit_llvm_ir(&c, lin, f));
    goto out;
  }
  if (o->emit == EMIT_OBJ) {
    char cpu[128];
    if (!o->output) o->output = out_default = default_output(o->input, ".o");
    rc = cg_emit_object(&c, lin, &co, o->output, cpu, sizeof cpu);
    stage_done(&tm, "LLVM codegen");
    goto out;
  }
  if (!o->output) o->output = out_default = default_output(o->input, ".so");
  if (!o->manifest && !(o->manifest = man_default = manifest_of(o->output))) goto out;
  co.output = o->output;
  co.manifest = o->manifest;
  tm.on = false; /* cg_step_end reports its own stages */
  rc = build ? cg_step_end(&c, g, &co, build) : cg_build_step(&c, g, lin, &co);
  build = NULL;
  stage_done(&tm, "");
  if (o->time_passes) fprintf(stderr, "novac: %-22s %9.2f ms\n", "total", tm.total);
out:
  if (rc == 0 && o->deps.with_compile) rc = write_deps(d, o);
  if (rc == 0 && cacheable) nc_store(&cache, &key, o->output, o->manifest, g);
  cg_step_cancel(&co, build);
  sizes_free(&sz);
  cg_gpu_free(&gpu);
  cg_plan_free(&plan);
  cg_plan_free(&eplan);
  if (!mlirModuleIsNull(lin)) mlirModuleDestroy(lin);
  if (!mlirModuleIsNull(nova)) mlirModuleDestroy(nova);
  if (!mlirModuleIsNull(elin)) mlirModuleDestroy(elin);
  if (!mlirModuleIsNull(enova)) mlirModuleDestroy(enova);
  nova_ctx_dispose(&c);
  fe_graph_destroy(g);
  fe_graph_destroy(ge);
  free(out_default);
  free(man_default);
  return rc;
}

int main(int argc, char **argv) {
  nv_oom_set_fatal(); /* first: the options' text is built in an nv_sbuf */
  opts o = {0};
  int u = parse_args(argc, argv, &o);
  if (u) {
    for (int i = 0; i < o.ndims; i++) free((char *)o.dims[i].name);
    nv_sb_free(&o.flags);
    nv_sb_free(&o.deps.targets);
    return u;
  }
  nv_diag *d = nv_diag_create(stderr);
  if (!d) return 1;
  nv_temp_install();
  nv_json_init();
  nv_tempdir_sweep(); /* what a novac killed by SIGKILL left in $TMPDIR */
  int rc = compile(d, &o);
  if (rc == 0 && nv_diag_count(d)) rc = -1;
  if (nv_close_stdout() && rc == 0) {
    nv_error_plain(d, "writing standard output: %s", strerror(errno));
    rc = -1;
  }
  nv_diag_destroy(d);
  nv_diag_destroy(o.eval_diag);
  for (int i = 0; i < o.ndims; i++) free((char *)o.dims[i].name);
  nv_sb_free(&o.flags);
  nv_sb_free(&o.deps.targets);
  return rc ? 1 : 0;
}
