/* codegen.h: nova -> linalg -> LLVM -> object -> step.so + manifest. */
#ifndef NOVA_CODEGEN_H
#define NOVA_CODEGEN_H

#include <sys/types.h>

#include "../frontend/graph.h"
#include "../configurator/device.h"
#include "../support/util.h"
#include "../passes/nova_ir.h"
#include "../passes/passes.h"

/* unshare.c: before one-shot bufferization, each written tensor.empty (or
 * fill of one) that CSE shared among writers recomputed for its writer. */
void cg_unshare_destinations(MlirModule m);
/* chunk.c: the long functions of a tensor module cut into private pieces
 * for one-shot bufferization (the number made, or -1), and put back after
 * it (0 or -1). */
int cg_chunk_split(MlirModule m);
int cg_chunk_inline(MlirModule m);
/* Whether a function boundary carries V unchanged: a scalar, or a tensor
 * that is not a view of another (identity layout once bufferized). */
bool cg_passes_whole(MlirValue v);
/* Before one-shot bufferization: a memref.global for each distinct tensor
 * constant, in the module's order.  Bufferization reuses a global of the
 * same value; making them itself, it would name and order them by the
 * order it visits the functions (the pieces: not fixed), and two compiles
 * of one model would give different step.so files. */
#define CG_BUFFER_ALIGNMENT 64 /* one-shot-bufferize's buffer-alignment (its default) */
void cg_constant_globals(MlirModule m);
/* chunk.c, before one-shot bufferization: the entry's ranked tensor
 * arguments become buffers of identity layout, each read through a
 * bufferization.to_tensor (restrict, and writable unless the argument was
 * marked bufferization.writable = false, a mark then dropped); 0 or -1. */
int cg_entry_args_as_buffers(MlirModule m);
/* kernel_once.c: the ops of MARKED (tensor IR, each marked nova.tile), one
 * private function per distinct kernel in a new module (returned; its
 * owner destroys it, after cg_kernels_join); cg_kernels_join, once that
 * module is transformed, puts a copy of each kernel's function in place of each of its ops. */
typedef struct cg_kernels cg_kernels;
MlirModule cg_kernels_split(MlirModule m, const cg_op_list *marked, cg_kernels **out);
int cg_kernels_count(const cg_kernels *ks);
/* after cg_kernels_join: how many ops became calls */
size_t cg_kernels_called(const cg_kernels *ks);
void cg_kernels_join(cg_kernels *ks);
void cg_kernels_free(cg_kernels *ks);
/* The tiled kernels that cg_kernels_join left called (@__nova_tiled_K,
 * a large step's): after one-shot bufferization, cg_tiled_results drops
 * each result that is one of the kernel's arguments (written in place),
 * its calls reading that argument instead; after
 * buffer-results-to-out-params, cg_tiled_settle inlines a kernel that
 * still allocates (the memory plan covers the entry's buffers only);
 * outlining (cg_outline_nests) outlines each kernel's loop nests once and
 * cg_tiled_inline_all then puts the kernel's remaining body (the calls of
 * those nests) in place of each call. */
bool cg_is_tiled_kernel(MlirOperation f);
/* Whether OP is a func.call of a tiled kernel (which may write any tensor it is given). */
bool cg_calls_tiled_kernel(MlirOperation op);
void cg_tiled_results(MlirModule m);
void cg_tiled_settle(MlirModule m);
void cg_tiled_inline_all(MlirModule m);

/* nova -> linalg on tensors, as a new module (null after a diagnostic). */
MlirModule cg_lower_to_linalg(nova_ctx *c, MlirModule nova);

/* fastmath.c: f32 math.exp and math.erf in linalg bodies become arithmetic
 * the vectorizer handles (cpu target, -O1 and up; NOVAC_LIBM=1 keeps the
 * libm calls); 0, or -1 after a diagnostic. */
int cg_fast_math(nova_ctx *c, MlirModule m);

/* groups.c: annotates each op of the nova module NOVA with nova.kernels,
 * the loop nests it is computed in after lowering and fusion at OPT_LEVEL
 * (ops sharing a number are fused), and the module with nova.loop_nests
 * {before, after}; 0, or -1 after a diagnostic. */
int cg_fusion_groups(nova_ctx *c, MlirModule nova, int opt_level);


/* ---- CUDA target (cuda.c) ---- */
#define CG_GPU_ALIGN 256  /* device buffers and scratch allocations */

/* One kernel of a step, in launch order. */
typedef struct cg_kernel {
  char name[24];          /* symbol in the cubin: nova_kI */
  char op[32];            /* linalg op it came from (matmul, generic, ...), or "serial" */
  char loc[160];          /* source location of that op */
  int rank;
  int64_t dims[8];        /* parallel iteration space (rank dims) */
  int64_t n;              /* points = threads that do work */
  int64_t grid, block;    /* grid.x, block.x */
  int64_t grid_y;         /* grid.y (0 = 1) */
  int64_t grid_z;         /* grid.z (0 = 1) */
  bool gemm, tensor_core; /* a tiled GEMM (gemm_cuda.c); on the tensor cores (mma.sync) */
  int64_t gemm_mnk[3];    /* a GEMM's M, N, K (its batch: grid_z) */
  bool gemm_ta, gemm_tb;  /* A stored K x M, B stored N x K */
  bool gemm_overwrite;    /* C = A B (the zero fill of C folded in), else C += A B */
  char gemm_dtype[8];     /* its operands' element type (f32, f64, bf16, f16) */
  int gemm_tile[6];       /* BM, BN, BK, the warp tile (tensor cores) or thread tile (SIMT), stages */
  int gemm_split;         /* split-K ranges (1: none; the grid's z counts batch x split) */
  bool gemm_epilogue;     /* the elementwise op after the product applied in its store */
  int regs;               /* registers per thread (ptxas), 0 if unknown */
  int64_t smem;           /* static shared memory bytes (ptxas) */
  int64_t dyn_smem;       /* dynamic shared memory bytes a launch asks for (the GEMMs' pipeline stages) */
  char reason[192];       /* the configurator's deciding limit */
} cg_kernel;

typedef struct cg_gpu {
  char chip[16];          /* sm_XY */
  cg_kernel *k;
  int nk, cap;
  int64_t scratch_bytes;  /* device scratch arena for intermediates */
  char *ptx;              /* NUL-terminated */
  size_t ptx_len;
  int64_t cubin_size;     /* after cg_cuda_assemble */
  cg_plan plan;           /* the arena of intermediates (scratch_bytes includes it) */
  const cfg_device *dev;
  int split_rows, split_cols; /* reductions split for the threads (gpu_reduce.c): along rows, along columns */
} cg_gpu;

#define CG_EVAL_PREFIX "nova_eval_"

/* One size of a step that serves several (novac --dim=NAME=LO..HI,
 * passes/buckets.h): its graph, masked for that size, lowered like the
 * step to the LLVM dialect with its symbols prefixed PREFIX, and its
 * evaluation entry's (NULL graph: none; symbols PREFIX CG_EVAL_PREFIX...). */
typedef struct cg_bucket {
  int64_t size;
  const nv_graph *graph;
  MlirModule module;
  const cg_plan *plan;
  const nv_graph *eval_graph;
  MlirModule eval_module;
  const cg_plan *eval_plan;
  char prefix[32];
} cg_bucket;

/* An axis of a step's input or output whose extent is A * size + C. */
typedef struct cg_dim_axis {
  const char *tensor; /* borrowed */
  int axis;
  int64_t a, c;
} cg_dim_axis;

typedef struct cg_options {
  const char *output;        /* step.so path */
  const char *manifest;      /* step.json path, or NULL */
  const char *input_name;    /* as given on the command line */
  const char *cpu;           /* LLVM CPU name ("host" = this machine) */
  int opt_level;             /* 0..3 */
  const char *flags_text;    /* the compile flags, for the manifest */
  const char *rt_dir;        /* folder with libnovart.a and include/ */
  const cg_plan *plan;        /* intermediates' arena (NULL or !planned: heap) */
  cg_gpu *gpu;                /* --target=cuda: the kernels; NULL for the cpu target */
  /* a training step's evaluation entry (cpu; NULL: none): its graph, its
   * module in the LLVM dialect with symbols prefixed CG_EVAL_PREFIX, its plan */
  const nv_graph *eval_graph;
  MlirModule eval_module;
  const cg_plan *eval_plan;
  /* several sizes of dimension DIM_NAME in [DIM_LO, DIM_HI] (NULL: one): the
   * smaller buckets (ascending; the step itself, the graph and module given
   * to cg_step_begin, is the largest, DIM_HI's bucket), the axes that follow
   * the size */
  const char *dim_name;
  int64_t dim_lo, dim_hi;
  int nbuckets;
  const cg_bucket *buckets;
  int ndim_axes;
  const cg_dim_axis *dim_axes;
  bool time_passes;
  bool keep_temps;
  bool verbose;
} cg_options;

/* cpu_tile.c: tiles and vectorizes the linalg ops of a linalg-on-tensors
 * module in place (before cg_bufferize), with sizes from the configurator's
 * CPU schedules for HOST (NULL: this machine, cfg_device_host).  OPT_LEVEL
 * 0 does nothing.  An op it cannot transform stays as it was (scalar loops);
 * 0, or -1 after a diagnostic. */
int cg_cpu_tile(nova_ctx *c, MlirModule m, const cfg_device *host, int opt_level);
/* half_contract.c: each f32 contraction of two extensions of 16-bit
 * tensors of one type (of KINDS) becomes a linalg.contract of the 16-bit
 * tensors with its f32 C (linalg on tensors, after fusion; *COUNT of
 * them) where HOOK (may be NULL), called on each with the f32
 * linalg.contract it replaces (the loops' roles are the same; the layouts
 * of the operands may differ) and UD, accepts it.  0, or -1 after a
 * diagnostic.  cg_contract_loop_sizes: the static size of each of a
 * contraction's NL loops from its operands' shapes and maps; DIM_OF (may
 * be NULL) gets [operand][result] the loop, -1 for a constant 0. */
#define CG_HALF_BF16 1u
#define CG_HALF_F16 2u
#define CG_CONTRACT_F32 0u /* every f32 contraction, its own operands */
#define CG_CONTRACT_MAXL 8
typedef bool (*cg_half_hook)(MlirOperation contract, MlirOperation f32_contract, void *ud);
int cg_half_contractions(nova_ctx *c, MlirModule m, unsigned kinds, cg_half_hook hook, void *ud, int *count);
/* On tensors: each linalg.contract the tensor cores will take (16-bit
 * operands; f32 ones with TF32) whose result only an elementwise
 * linalg.generic reads moves (with the zero fill of its init) to just
 * before that generic, so that after bufferization and the memory plan the
 * GPU's GEMM kernel can apply it as its epilogue (cuda.c).  *COUNT: the
 * contractions moved. */
int cg_gemm_epilogue_order(nova_ctx *c, MlirModule m, bool tf32, int *count);

/* gpu_reduce.c (the cuda target, linalg on tensors after fusion): each
 * reduction over a long row, or over a long column with few outputs, split
 * into partial reductions that many threads share and a second, shorter
 * one, in a fixed order; *ROWS, *COLS: the reductions split of each kind.
 * 0, or -1 after a diagnostic. */
int cg_gpu_split_reductions(nova_ctx *c, MlirModule m, const cfg_device *dev, int *rows, int *cols);
bool cg_contract_loop_sizes(MlirOperation op, int nl, int64_t *size, int (*dim_of)[CG_CONTRACT_MAXL]);
/* cpu_ukernel.c, the "ukernels" stage: on a host with bf16 dot products
 * (HOST->has_bf16_dot), cg_half_contractions for bf16; on a host with
 * AVX2 + FMA or AVX-512 (cg_cpu_f32_kernel), every other f32 contraction
 * of the layouts the kernels take; *COUNT of them.  After outlining,
 * cg_cpu_contract_calls makes each such contraction a call of the
 * runtime's kernel (runtime/rt_contract.c).  0, or -1 after a diagnostic.
 * cg_cpu_bf16_dot: whether bf16 applies (fusion keeps the bf16 operands
 * for it). */
/* An f32 contraction of fewer multiply-adds stays with the tiler
 * (cpu_tile.c): its loops are inline and read the operands in place, and
 * the call, the descriptor and the packing cost more than they save
 * (measured on a Zen 4, 1 thread: 64^3 4.8 us inline, 6.3 us as a call;
 * 128^3 37 us and 44 us; from 1024^3 on the call is faster). */
#define CG_UK_MIN_MACS ((int64_t)1 << 18)
bool cg_cpu_bf16_dot(const cfg_device *host, int opt_level);
bool cg_cpu_f32_kernel(const cfg_device *host, int opt_level);
int cg_cpu_contract_kernels(nova_ctx *c, MlirModule m, const cfg_device *host, int opt_level, int *count);
int cg_cpu_contract_calls(nova_ctx *c, MlirModule m);
/* Building ops before AT in BLOCK (cpu_ukernel.c): an op; an integer
 * constant; the address of memref V's first element (aligned pointer plus
 * offset, i64) and, when STRIDES is not NULL, its strides (index, rank of
 * them); the declaration of an external function of NARGS i64 arguments
 * (at most 16) and no result. */
typedef struct cg_builder {
  MlirContext ctx;
  MlirLocation loc;
  MlirBlock block;
  MlirOperation at;
} cg_builder;
MlirOperation cg_build(cg_builder *b, const char *name, int nops, const MlirValue *ops, int nres, const MlirType *rt,
                       int na, const MlirNamedAttribute *attrs);
MlirValue cg_build_const(cg_builder *b, MlirType t, int64_t v);
/* A named linalg op of one input and one output (linalg.fill, .copy), its
 * region filled; RT its result (tensors) or NULL (memrefs). */
MlirOperation cg_build_named(cg_builder *b, const char *name, MlirValue in, MlirValue out, const MlirType *rt);
MlirValue cg_memref_address(cg_builder *b, MlirValue v, MlirValue *strides);
void cg_declare_i64_func(MlirModule m, const char *name, int nargs);
/* comm_calls.c: novac --data-parallel.  The lowering makes each
 * nova.all_reduce, reduce_scatter, all_gather and shard a call of a
 * declared function CG_COMM_MARKER<id> {nova.comm = [kind, bucket,
 * world]}; after bufferization, cg_comm_calls makes each collective the
 * runtime's start (where it is) and wait (before the first op that reads
 * its result), and a shard one call, where the step's code runs on the
 * CPU (CPU: the cpu target and --gpu-sim), and the value itself elsewhere
 * (a world of one).  0, or -1 after a diagnostic. */
#define CG_COMM_MARKER "__nova_comm_"
/* the markers' kinds (nova.comm = [kind, bucket, world]), runtime/rt_comm.c's too */
enum { CG_COMM_ALL_REDUCE, CG_COMM_REDUCE_SCATTER, CG_COMM_ALL_GATHER, CG_COMM_SHARD };
int cg_comm_calls(nova_ctx *c, MlirModule m, bool cpu);
/* Bufferizes a linalg module in place: results become out-parameters
 * (identity layouts); with DEALLOC, buffer deallocation is inserted. */
int cg_bufferize(nova_ctx *c, MlirModule m, int opt_level, bool dealloc);
/* outline.c: each top-level loop nest of the entry becomes a private,
 * noinline function (LLVM's loop passes cost superlinear time in a
 * function's size); 0, or -1 with a diagnostic. */
int cg_outline_nests(nova_ctx *c, MlirModule m);
/* parallel.c: the outlined nests marked nova.parallel (outline.c) run their
 * outermost loop shared out between the runtime's threads.
 * cg_parallel_calls, after the lowering to loops: each such function
 * takes the loop's bounds as two more arguments, and its calls pack their
 * arguments and go through @nova_par_<F>; cg_parallel_thunks, in the LLVM
 * dialect: @nova_par_<F> hands the loop to nova_rt_parallel_for with a
 * task that unpacks the arguments.  Both 0, or -1 with a diagnostic;
 * *COUNT gets the number of parallel functions. */
#define CG_PAR_MIN_BYTES (128 << 10)
int cg_parallel_calls(nova_ctx *c, MlirModule m, int *count);
/* split_entry.c: after outlining and cg_parallel_calls, the entry's long
 * straight-line body cut into private noinline functions called in turn
 * (LLVM's time grows faster than a function's size); 0 (pieces that cannot
 * be cut are left in place). */
int cg_split_entry(nova_ctx *c, MlirModule m);
#define CG_SEG_PREFIX "__nova_seg_" /* the pieces' names */
/* pack_entry.c: after the lowering to the LLVM dialect, the pieces'
 * memref descriptors folded away (a field read back from a descriptor is
 * the value put in it; the dead descriptors erased). */
void cg_fold_piece_descriptors(MlirModule m);
/* pack_entry.c: after the lowering to the LLVM dialect, the entry NAME
 * takes one pointer, to the array of its former (pointer) parameters:
 * `void NAME(void **a)`, the CPU step's calling convention; 0, or -1 with
 * a diagnostic. */
int cg_pack_entry(nova_ctx *c, MlirModule m, const char *name);
int cg_parallel_thunks(nova_ctx *c, MlirModule m);
/* The last stage of the cpu target (driver/pipeline.c): a bufferized,
 * planned module to the LLVM dialect (*PARALLEL: the loop functions shared out between threads;
 * NULL: none are). */
int cg_lower_loops_to_llvm(nova_ctx *c, MlirModule m, int *parallel);

/* The cuda target: host code in the LLVM dialect calling mgpu* launch
 * functions (the runtime's), kernels as PTX in a cg_gpu (free with
 * cg_gpu_free).  With SIM (--gpu-sim) the same kernels become loops over
 * their grid and block in CPU code instead: a cpu step whose numerics
 * check the GPU mapping. */
typedef struct cg_gpu_options {
  int opt_level;
  bool sim;   /* --gpu-sim */
  int block;  /* --gpu-block=N: threads per block for every kernel; 0 = the configurator's */
  bool tf32;  /* --matmul-precision=tf32: f32 matmuls on tensor cores with tf32 operands */
  int64_t memory_limit; /* --memory-limit (0: none) */
  int gemm_tile[6];     /* --gemm-tile=BMxBNxBK,WMxWN[,S]: every tensor-core GEMM's tiles (0: the configurator's) */
} cg_gpu_options;
/* The cuda target's steps, run by the pipeline (driver/pipeline.c) around
 * the whole-step passes: cg_gpu_init checks the options against DEV and
 * clears OUT (keeping its memory limit); after bufferization and the plan,
 * cg_gpu_kernels maps the step's loops onto kernels (GEMMs tiled,
 * gemm_cuda.c) and launches; then cg_gpu_sim_llvm (--gpu-sim) makes each
 * launch loops over its grid and block and lowers to the LLVM dialect, or
 * cg_gpu_nvvm outlines the kernels into one module and compiles it to PTX
 * (OUT->ptx).  0, or -1 after a diagnostic. */
int cg_gpu_init(nova_ctx *c, const cfg_device *dev, const cg_gpu_options *o, cg_gpu *out);
int cg_gpu_kernels(nova_ctx *c, MlirModule m, const cfg_device *dev, const cg_gpu_options *o, cg_gpu *out);
int cg_gpu_sim_llvm(nova_ctx *c, MlirModule m, const cfg_device *dev, const cg_gpu_options *o, cg_gpu *out);
int cg_gpu_nvvm(nova_ctx *c, MlirModule m, const cfg_device *dev, const cg_gpu_options *o, cg_gpu *out);
void cg_gpu_free(cg_gpu *g);
/* An MlirStringCallback appending to an nv_sbuf. */
/* gemm_cuda.c: MLIR text of func.func private @NAME(A, B, C) computing
 * C += A B (C f32 or f64; A and B of C's type, or bf16/f16 with an f32 C,
 * each maybe stored transposed) with the tiled GPU kernel of schedule S
 * (SIM: as CPU loops over the blocks and threads); owned by the caller,
 * NULL when out of memory. */
#define CG_GEMM_MAXB 4 /* batch loops of a batched GEMM */
/* The epilogue of a tensor-core GEMM: the elementwise linalg.generic E
 * that reads C right after the product, applied per output element where
 * the kernel has C's value (cuda.c checks that it may be).  E's loops are
 * C's full buffer's dims; its operands (inputs, then its one output) are
 * each C (block argument: C's value), an input read at its map (IN: the
 * kernel function's argument ARG after A, B, C and the workspace), or its
 * output Y when Y is not C (Y, an argument too).  The kernel text holds
 * E's body as a cast of its block arguments marked nova.epilogue, which
 * cuda.c replaces by E's ops. */
#define CG_EPI_MAX 8
enum { CG_EPI_C, CG_EPI_IN, CG_EPI_Y };
typedef struct cg_gemm_epilogue {
  int n;                          /* E's operands; 0: no epilogue */
  int role[CG_EPI_MAX], arg[CG_EPI_MAX];
  int rank[CG_EPI_MAX], map[CG_EPI_MAX][8]; /* IN: result i of its map is loop map[i] */
  MlirType type[CG_EPI_MAX];      /* IN, Y: the argument's memref type */
  MlirType elem[CG_EPI_MAX];      /* every operand: its block argument's type */
  bool used[CG_EPI_MAX];          /* the block argument is read */
  int nloops, nargs;
  bool y_is_c;                    /* E writes C in place */
  bool store_c;                   /* C is read after E: stored as well */
} cg_gemm_epilogue;

typedef struct cg_gemm_operands {
  MlirType a, b, c; /* the matrices' memref types (2-D, any strides) */
  bool ta, tb;      /* A is stored K x M, B N x K */
  /* VIEWS: the matrices are views of the operands FA, FB, FC (whose types
   * differ: a batch, loops joined to m or n): for the batch point
   * b... (NBATCH loops of BSIZE; grid z, the last loop fastest), operand
   * i's view starts BSTRIDE[i][j] b_j elements past its own offset */
  bool views;
  int nbatch;
  int64_t bsize[CG_GEMM_MAXB], bstride[3][CG_GEMM_MAXB];
  MlirType fa, fb, fc;
  bool overwrite;   /* C was zero-filled just before: the kernel stores C = A B (the fill goes) */
  int64_t work_elems; /* split-K: the f32 elements of the workspace (the function's 4th argument) */
  cg_gemm_epilogue epi;
} cg_gemm_operands;
struct cfg_gemm_simt_schedule;
char *cg_gemm_text(const char *name, const cg_gemm_operands *o, const struct cfg_gemm_simt_schedule *s, bool sim);
/* The same with tensor cores and the tiles of the cfg_gemm schedule S:
 * mma.sync.m16n8k8 with tf32 operands for f32 ones, m16n8k16 for bf16 and
 * f16 ones, accumulated in f32, through S->stages shared-memory stages.
 * With S->split_k > 1 the K tiles of each batch point are cut into
 * split_k ranges of S->k_tiles_per_split: the function then takes a 4th
 * argument, an f32 workspace of O->work_elems >= batch * split_k * M * N
 * elements, which a second kernel sums into C. */
struct cfg_gemm_schedule;
char *cg_gemm_tc_text(const char *name, const cg_gemm_operands *o, const struct cfg_gemm_schedule *s, bool sim);
/* The (dynamic) shared memory of that kernel: S->stages of the staged A
 * and B tiles, as stored (TA: A is K x M, TB: B is N x K), their rows
 * padded against bank conflicts; and of one stage. */
int64_t cg_gemm_tc_smem(const struct cfg_gemm_schedule *s, bool h16, bool ta, bool tb);
int64_t cg_gemm_tc_stage_bytes(const struct cfg_gemm_schedule *s, bool h16, bool ta, bool tb);
/* What the kernel asks for: that, or with an EPILOGUE the block's f32 C
 * tile staged over the stages, whichever is larger. */
int64_t cg_gemm_tc_dyn_smem(const struct cfg_gemm_schedule *s, bool h16, bool ta, bool tb, bool epilogue);

/* step_cuda.c: writes DIR/kernels.ptx and assembles DIR/kernels.cubin with
 * ptxas (registers and shared memory per kernel go into GPU's table). */
int cg_cuda_assemble(nova_ctx *c, const char *dir, cg_gpu *gpu, bool verbose);
/* Descriptor text: the entry wrapper expanding each argument pointer into a
 * memref descriptor, and the embedded cubin and PTX ... */
void cg_cuda_desc_entry(nv_sbuf *b, const char *entry, int n, const int *rank, const int64_t *const *shape);
/* ... and the rt_graph fields after entry. */
void cg_cuda_desc_fields(nv_sbuf *b, const cg_gpu *gpu);
/* Target, device, kernels, streams and scratch memory of the manifest. */
struct cJSON;
void cg_cuda_manifest(struct cJSON *root, const cg_gpu *gpu);
/* Runs argv in dir, output in dir/tool.log; 0 if it exited 0 (else a
 * diagnostic naming WHAT, or argv[0], with its first line of output). */
int cg_run_tool(nova_ctx *c, const char *dir, char *const argv[], bool verbose, const char *what);
/* The CPU name code is generated for (resolving "host"). */
void cg_cpu_name(const cg_options *o, char *out, size_t size);
/* Translates an LLVM-dialect module and writes an object file (in a child
 * process: LLVM's fatal errors become diagnostics). */
int cg_emit_object(nova_ctx *c, MlirModule m, const cg_options *o, const char *obj_path,
                   char *cpu_used, size_t cpu_size);
/* Code generation running in the background: child processes, each
 * writing one object (the module split in parts of about equal size,
 * NOVAC_JOBS of them, else one per processor). */
typedef struct cg_emit_job {
  int n;                 /* objects (processes) */
  bool running;          /* not waited for yet */
  pid_t pid[8];
  int log[8];            /* their stderr (pipes) */
  char obj[8][4200];     /* the objects they write */
} cg_emit_job;
/* Starts J on M: objects DIR/STEM.o or DIR/STEM<k>.o (J->obj).  0, or -1
 * (reported; nothing left running).  The parent may go on changing M. */
int cg_emit_start(nova_ctx *c, MlirModule m, const cg_options *o, const char *dir, const char *stem,
                  cg_emit_job *j);
/* Waits for J: 0 when every object was written, else -1 (reported once;
 * FAILED: an earlier failure, J's messages not reported). */
int cg_emit_wait(nova_ctx *c, const cg_options *o, cg_emit_job *j, bool failed);
/* Stops J if it runs; its objects removed unless KEEP. */
void cg_emit_cancel(cg_emit_job *j, bool keep);
/* The ops in OP's tree, OP included (a function's size, to share out work). */
int64_t cg_count_ops(MlirOperation op);
/* Writes LLVM IR text of an LLVM-dialect module to f. */
int cg_emit_llvm_ir(nova_ctx *c, MlirModule m, FILE *f);

/* The initial values a step.so of G embeds (its init.bin, *SIZE bytes, at
 * the hidden symbol nova_init_data): each tensor's slot, in *SLOTS (owned;
 * names borrowed from G).  0, or -1 when out of memory. */
typedef struct cg_init_slot {
  const char *name;
  nova_dtype dtype;
  int64_t offset, bytes;
} cg_init_slot;
int cg_init_layout(const nv_graph *g, cg_init_slot **slots, int *nslots, int64_t *size);

/* The whole step.so: object + descriptor + runtime, linked into o->output
 * atomically, and the manifest next to it. */
int cg_build_step(nova_ctx *c, const nv_graph *g, MlirModule llvm_module, const cg_options *o);
/* ... in two halves: cg_step_begin starts the code generation of
 * LLVM_MODULE in the background (NULL after a diagnostic); the caller may
 * then build the evaluation entry (o->eval_*) and must end with
 * cg_step_end (which frees B; o->output and o->manifest set by then) or,
 * on a failure of its own, cg_step_cancel. */
typedef struct cg_step_build cg_step_build;
cg_step_build *cg_step_begin(nova_ctx *c, const nv_graph *g, MlirModule llvm_module, const cg_options *o);
int cg_step_end(nova_ctx *c, const nv_graph *g, const cg_options *o, cg_step_build *b);
void cg_step_cancel(const cg_options *o, cg_step_build *b);

/* Writes the manifest ("-" = stdout); cpu is the LLVM CPU name used. */
int cg_write_manifest(nova_ctx *c, const nv_graph *g, const cg_options *o, const char *cpu, const char *path);

/* The structural hash of a graph (hex, 16 digits). */
void cg_graph_hash(const nv_graph *g, char out[17]);

#endif
