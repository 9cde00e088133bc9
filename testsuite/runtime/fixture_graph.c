/* fixture_graph.c: a hand-written step descriptor, standing in for the one
 * novac generates, shared by test_step.c (linked into a test program) and
 * run.sh (built into a step.so with libnovart.a).
 *
 *   x     input     f32 [2,3]
 *   scale input     f32 []        rank 0
 *   idx   input     i64 [4]       index_bound 5 (rows of emb)
 *   lbl   label     i32 [2]       index_bound 3
 *   w     param     f32 [3]       initial value {0.5, -1, 2}
 *   emb   param     f32 [5]       initial value {10, 20, 30, 40, 50}
 *   runs  opt_state f32 [1]       zeros; the entry adds 1 per run
 *   y     output    f32 [2,3]     y[i][j] = scale * x[i][j] + w[j]
 *   g     output    f32 [4]       g[k] = emb[idx[k]]
 *   loss  loss      f32 []        sum(y) + lbl[0] + lbl[1] + runs[0] (after the increment)
 *
 * The entry's arguments come in an order unlike the tensor order, so a
 * runtime that ignored arg_tensor would compute wrong values.
 * -DFIXTURE_ABI=N builds a descriptor claiming step ABI version N.
 */
#include <stdint.h>

#include "rt_graph.h"

#ifndef FIXTURE_ABI
#define FIXTURE_ABI NOVA_STEP_ABI_VERSION
#endif

enum { T_X, T_SCALE, T_IDX, T_LBL, T_W, T_EMB, T_RUNS, T_Y, T_G, T_LOSS, T_COUNT };

static const rt_tensor_desc fixture_tensors[T_COUNT] = {
    [T_X] = {"x", NOVA_ROLE_INPUT, NOVA_DTYPE_F32, 2, {2, 3}, 0, -1, -1},
    [T_SCALE] = {"scale", NOVA_ROLE_INPUT, NOVA_DTYPE_F32, 0, {0}, 0, -1, -1},
    [T_IDX] = {"idx", NOVA_ROLE_INPUT, NOVA_DTYPE_I64, 1, {4}, 5, -1, -1},
    [T_LBL] = {"lbl", NOVA_ROLE_LABEL, NOVA_DTYPE_I32, 1, {2}, 3, -1, -1},
    [T_W] = {"w", NOVA_ROLE_PARAM, NOVA_DTYPE_F32, 1, {3}, 0, 0, -1},
    [T_EMB] = {"emb", NOVA_ROLE_PARAM, NOVA_DTYPE_F32, 1, {5}, 0, 3 * sizeof(float), -1},
    [T_RUNS] = {"runs", NOVA_ROLE_OPT_STATE, NOVA_DTYPE_F32, 1, {1}, 0, -1, -1},
    [T_Y] = {"y", NOVA_ROLE_OUTPUT, NOVA_DTYPE_F32, 2, {2, 3}, 0, -1, -1},
    [T_G] = {"g", NOVA_ROLE_OUTPUT, NOVA_DTYPE_F32, 1, {4}, 0, -1, -1},
    [T_LOSS] = {"loss", NOVA_ROLE_LOSS, NOVA_DTYPE_F32, 0, {0}, 0, -1, -1},
};

/* Entry argument a is the buffer of tensor fixture_args[a]. */
enum { A_Y, A_LBL, A_W, A_X, A_G, A_IDX, A_EMB, A_LOSS, A_SCALE, A_RUNS, A_COUNT };
static const int32_t fixture_args[A_COUNT] = {
    [A_Y] = T_Y,     [A_LBL] = T_LBL,   [A_W] = T_W,         [A_X] = T_X,         [A_G] = T_G,
    [A_IDX] = T_IDX, [A_EMB] = T_EMB,   [A_LOSS] = T_LOSS,   [A_SCALE] = T_SCALE, [A_RUNS] = T_RUNS,
};

static const float fixture_init[8] = {0.5f, -1.0f, 2.0f, 10.0f, 20.0f, 30.0f, 40.0f, 50.0f};

static void fixture_entry(void **args) {
  const float *x = args[A_X], *w = args[A_W], *emb = args[A_EMB], *scale = args[A_SCALE];
  const int64_t *idx = args[A_IDX];
  const int32_t *lbl = args[A_LBL];
  float *y = args[A_Y], *g = args[A_G], *loss = args[A_LOSS], *runs = args[A_RUNS];
  float sum = 0;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) sum += y[i * 3 + j] = *scale * x[i * 3 + j] + w[j];
  for (int k = 0; k < 4; k++) g[k] = emb[idx[k]];
  runs[0] += 1;
  *loss = sum + (float)(lbl[0] + lbl[1]) + runs[0];
}

const rt_graph nova_rt_graph = {
    .abi_version = FIXTURE_ABI,
    .novac_version = "fixture",
    .graph_hash = "0123456789abcdef",
    .ntensors = T_COUNT,
    .tensors = fixture_tensors,
    .nargs = A_COUNT,
    .arg_tensor = fixture_args,
    .init_data = (const unsigned char *)fixture_init,
    .init_size = sizeof fixture_init,
    .entry = fixture_entry,
};
