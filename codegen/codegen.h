/* codegen.h: nova -> linalg -> LLVM -> object -> step.so + manifest. */
#ifndef NOVA_CODEGEN_H
#define NOVA_CODEGEN_H

#include "../frontend/graph.h"
#include "../passes/nova_ir.h"

/* nova -> linalg on tensors, as a new module (null after a diagnostic). */
MlirModule cg_lower_to_linalg(nova_ctx *c, MlirModule nova);

typedef struct cg_options {
  const char *output;        /* step.so path */
  const char *manifest;      /* step.json path, or NULL */
  const char *input_name;    /* as given on the command line */
  const char *cpu;           /* LLVM CPU name ("host" = this machine) */
  int opt_level;             /* 0..3 */
  const char *flags_text;    /* the compile flags, for the manifest */
  const char *rt_dir;        /* folder with libnovart.a and include/ */
  bool time_passes;
  bool keep_temps;
  bool verbose;
} cg_options;

/* Bufferizes and lowers a linalg module to the LLVM dialect in place. */
int cg_lower_to_llvm(nova_ctx *c, MlirModule m, int opt_level);
/* The CPU name code is generated for (resolving "host"). */
void cg_cpu_name(const cg_options *o, char *out, size_t size);
/* Translates an LLVM-dialect module and writes an object file (in a child
 * process: LLVM's fatal errors become diagnostics). */
int cg_emit_object(nova_ctx *c, MlirModule m, const cg_options *o, const char *obj_path,
                   char *cpu_used, size_t cpu_size);
/* Writes LLVM IR text of an LLVM-dialect module to f. */
int cg_emit_llvm_ir(nova_ctx *c, MlirModule m, FILE *f);

/* The whole step.so: object + descriptor + runtime, linked into o->output
 * atomically, and the manifest next to it. */
int cg_build_step(nova_ctx *c, const nv_graph *g, MlirModule llvm_module, const cg_options *o);

/* Writes the manifest ("-" = stdout); cpu is the LLVM CPU name used. */
int cg_write_manifest(nova_ctx *c, const nv_graph *g, const cg_options *o, const char *cpu, const char *path);

/* The structural hash of a graph (hex, 16 digits). */
void cg_graph_hash(const nv_graph *g, char out[17]);

#endif
