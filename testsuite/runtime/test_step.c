/* test_step.c: unit test of the runtime (libnovart.a) over the descriptor
 * in fixture_graph.c.  Prints one `PASS: runtime :: step.CASE` or
 * `FAIL: runtime :: step.CASE` line per case, the reasons indented below a
 * failure, and exits 0: a non-zero exit means a crash or a sanitizer report.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "nova/step.h"
#include "rt_init.h"
#include "rt_step.h"

/* ---- a minimal harness --------------------------------------------------- */

static int case_failures;
static char case_reasons[8192]; /* printed under the FAIL line */

/* Records one failure of the current case. */
__attribute__((format(printf, 1, 2))) static void note_failure(const char *fmt, ...) {
  size_t used = strlen(case_reasons);
  va_list ap;
  case_failures++;
  va_start(ap, fmt);
  vsnprintf(case_reasons + used, sizeof case_reasons - used, fmt, ap);
  va_end(ap);
}

static void expect_at(int ok, const char *file, int line, const char *what) {
  if (!ok) note_failure("    %s:%d: expected %s\n", file, line, what);
}
#define EXPECT(cond) expect_at((cond) != 0, __FILE__, __LINE__, #cond)

/* The status is WANT and the step's message contains TEXT ("" = empty). */
#define EXPECT_STATUS(step, got, want, text) expect_status_at(step, got, want, text, __FILE__, __LINE__)
static void expect_status_at(const nova_step *s, nova_status got, nova_status want, const char *text,
                             const char *file, int line) {
  const char *msg = nova_step_error(s);
  if (got != want)
    note_failure("    %s:%d: status %d, expected %d (message: %s)\n", file, line, (int)got, (int)want, msg);
  else if (text[0] ? !strstr(msg, text) : msg[0] != '\0')
    note_failure("    %s:%d: message '%s' does not contain '%s'\n", file, line, msg, text);
}

static void run_case(const char *name, void (*fn)(void)) {
  case_failures = 0;
  case_reasons[0] = '\0';
  fn();
  printf("%s: runtime :: step.%s\n%s", case_failures ? "FAIL" : "PASS", name, case_reasons);
  fflush(stdout);
}

/* ---- allocation failures ------------------------------------------------ */

/* run.sh links with -Wl,--wrap=calloc,--wrap=aligned_alloc, so the
 * runtime's allocations come here; the alloc_countdown-th one from now
 * fails (0: none does). */
static int alloc_countdown;
void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__real_aligned_alloc(size_t align, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size);

static int alloc_fails(void) { return alloc_countdown > 0 && --alloc_countdown == 0; }
void *__wrap_calloc(size_t n, size_t size) { return alloc_fails() ? NULL : __real_calloc(n, size); }
void *__wrap_aligned_alloc(size_t align, size_t size) {
  return alloc_fails() ? NULL : __real_aligned_alloc(align, size);
}

/* ---- fixtures ------------------------------------------------------------ */

static const float x_val[6] = {1, 2, 3, 4, 5, 6};
static const int64_t x_shape[2] = {2, 3};
static const float scale_val = 2;
static const int64_t idx_val[4] = {4, 0, 2, 1};
static const int64_t idx_shape[1] = {4};
static const int32_t lbl_val[2] = {1, 2};
static const int64_t lbl_shape[1] = {2};

static nova_step *open_ok(void) {
  nova_step *s = NULL;
  nova_status st = nova_step_open(&s);
  EXPECT(st == NOVA_OK && s != NULL);
  return s;
}

static void bind_all(nova_step *s) {
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, x_shape, x_val), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_bind(s, "scale", NOVA_DTYPE_F32, 0, NULL, &scale_val), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_bind(s, "idx", NOVA_DTYPE_I64, 1, idx_shape, idx_val), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_bind(s, "lbl", NOVA_DTYPE_I32, 1, lbl_shape, lbl_val), NOVA_OK, "");
}

static const float *get_f32(nova_step *s, const char *name, size_t n) {
  const void *data = NULL;
  nova_tensor_info info;
  EXPECT_STATUS(s, nova_step_get(s, name, &data, &info), NOVA_OK, "");
  EXPECT(info.dtype == NOVA_DTYPE_F32 && info.nbytes == n * sizeof(float));
  return data;
}

/* ---- cases --------------------------------------------------------------- */

static void test_open_and_query(void) {
  nova_step *s = open_ok();
  nova_tensor_info info;
  int index = -1;
  EXPECT(nova_step_num_tensors(s) == 10);
  EXPECT(nova_step_tensor(s, 0, &info) == NOVA_OK);
  EXPECT(strcmp(info.name, "x") == 0 && info.role == NOVA_ROLE_INPUT && info.dtype == NOVA_DTYPE_F32);
  EXPECT(info.rank == 2 && info.shape[0] == 2 && info.shape[1] == 3 && info.nbytes == 24);
  EXPECT(nova_step_tensor(s, 9, &info) == NOVA_OK);
  EXPECT(strcmp(info.name, "loss") == 0 && info.role == NOVA_ROLE_LOSS && info.rank == 0 && info.nbytes == 4);
  EXPECT(nova_step_find(s, "emb", &index) == NOVA_OK && index == 5);
  EXPECT(strcmp(nova_step_error(s), "") == 0);
  /* a failing query says why, as every failing call does */
  EXPECT_STATUS(s, nova_step_find(s, "nope", &index), NOVA_ERR_NOT_FOUND, "no tensor named 'nope'");
  EXPECT_STATUS(s, nova_step_tensor(s, 10, &info), NOVA_ERR_INVALID_ARGUMENT, "index 10 is outside [0, 10)");
  EXPECT_STATUS(s, nova_step_tensor(s, -1, &info), NOVA_ERR_INVALID_ARGUMENT, "index -1 is outside [0, 10)");
  nova_step_close(s);
}

static void test_initial_values(void) {
  nova_step *s = open_ok();
  const float *w = get_f32(s, "w", 3), *emb = get_f32(s, "emb", 5);
  const float *runs = get_f32(s, "runs", 1), *y = get_f32(s, "y", 6);
  EXPECT(w[0] == 0.5f && w[1] == -1.0f && w[2] == 2.0f);
  EXPECT(emb[0] == 10.0f && emb[4] == 50.0f);
  EXPECT(runs[0] == 0.0f);
  for (int i = 0; i < 6; i++) EXPECT(y[i] == 0.0f);
  for (int i = 0; i < nova_step_num_tensors(s); i++) {
    nova_tensor_info info;
    const void *data = NULL;
    nova_step_tensor(s, i, &info);
    EXPECT(nova_step_get(s, info.name, &data, &info) == NOVA_OK && (uintptr_t)data % 64 == 0);
  }
  nova_step_close(s);
}

static void test_run_values(void) {
  nova_step *s = open_ok();
  bind_all(s);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_OK, "");
  const float *y = get_f32(s, "y", 6), *g = get_f32(s, "g", 4), *loss = get_f32(s, "loss", 1);
  const float want_y[6] = {2.5f, 3, 8, 8.5f, 9, 14};
  for (int i = 0; i < 6; i++) EXPECT(y[i] == want_y[i]);
  EXPECT(g[0] == 50 && g[1] == 10 && g[2] == 30 && g[3] == 20);
  EXPECT(*loss == 45 + 3 + 1);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_OK, "");
  EXPECT(*get_f32(s, "runs", 1) == 2.0f && *loss == 45 + 3 + 2);
  nova_step_close(s);
}

static void test_bind_param(void) {
  nova_step *s = open_ok();
  const float w[3] = {0, 0, 100};
  const int64_t shape[1] = {3};
  bind_all(s);
  EXPECT_STATUS(s, nova_step_bind(s, "w", NOVA_DTYPE_F32, 1, shape, w), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_run(s), NOVA_OK, "");
  const float *y = get_f32(s, "y", 6);
  EXPECT(y[0] == 2 && y[2] == 106 && y[5] == 112);
  nova_step_close(s);
}

/* Optimizer state can be bound (a checkpoint restores it), with the same
 * dtype and shape checks as any other tensor; the next run starts from it. */
static void test_bind_opt_state(void) {
  nova_step *s = open_ok();
  const float runs = 41;
  const double wide = 41;
  const int64_t one[1] = {1}, two[1] = {2};
  bind_all(s);
  EXPECT_STATUS(s, nova_step_bind(s, "runs", NOVA_DTYPE_F64, 1, one, &wide), NOVA_ERR_DTYPE,
                "tensor 'runs': dtype f64 given, step compiled for f32");
  EXPECT_STATUS(s, nova_step_bind(s, "runs", NOVA_DTYPE_F32, 1, two, &runs), NOVA_ERR_SHAPE,
                "tensor 'runs': shape [2] given, step compiled for [1]");
  EXPECT_STATUS(s, nova_step_bind(s, "runs", NOVA_DTYPE_F32, 0, NULL, &runs), NOVA_ERR_SHAPE,
                "tensor 'runs': shape [] given, step compiled for [1]");
  EXPECT(*get_f32(s, "runs", 1) == 0.0f); /* a refused bind changes nothing */
  EXPECT_STATUS(s, nova_step_bind(s, "runs", NOVA_DTYPE_F32, 1, one, &runs), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_run(s), NOVA_OK, "");
  EXPECT(*get_f32(s, "runs", 1) == 42.0f);
  EXPECT(*get_f32(s, "loss", 1) == 49.0f - 1.0f + 42.0f);
  nova_step_close(s);
}

static void test_steps_independent(void) {
  nova_step *a = open_ok(), *b = open_ok();
  bind_all(a);
  EXPECT_STATUS(a, nova_step_run(a), NOVA_OK, "");
  EXPECT(*get_f32(a, "runs", 1) == 1.0f && *get_f32(b, "runs", 1) == 0.0f);
  EXPECT_STATUS(b, nova_step_run(b), NOVA_ERR_UNBOUND, "input 'x' was never bound");
  nova_step_close(a);
  nova_step_close(b);
}

static void test_bind_dtype(void) {
  nova_step *s = open_ok();
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_I64, 2, x_shape, x_val), NOVA_ERR_DTYPE,
                "tensor 'x': dtype i64 given, step compiled for f32");
  EXPECT_STATUS(s, nova_step_bind(s, "idx", NOVA_DTYPE_I32, 1, idx_shape, idx_val), NOVA_ERR_DTYPE,
                "tensor 'idx': dtype i32 given, step compiled for i64");
  EXPECT_STATUS(s, nova_step_bind(s, "x", (nova_dtype)42, 2, x_shape, x_val), NOVA_ERR_DTYPE,
                "dtype ? given");
  nova_step_close(s);
}

static void test_bind_shape(void) {
  nova_step *s = open_ok();
  const int64_t flat[1] = {6}, wide[2] = {3, 3}, big[2] = {8, 3};
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 1, flat, x_val), NOVA_ERR_SHAPE,
                "tensor 'x': shape [6] given, step compiled for [2,3]");
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, wide, x_val), NOVA_ERR_SHAPE,
                "tensor 'x': shape [3,3] given, step compiled for [2,3]");
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, big, x_val), NOVA_ERR_SHAPE,
                "tensor 'x': shape [8,3] given, step compiled for [2,3]");
  EXPECT_STATUS(s, nova_step_bind(s, "scale", NOVA_DTYPE_F32, 1, flat, x_val), NOVA_ERR_SHAPE,
                "tensor 'scale': shape [6] given, step compiled for []");
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 0, NULL, x_val), NOVA_ERR_SHAPE,
                "tensor 'x': shape [] given, step compiled for [2,3]");
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 9, x_shape, x_val), NOVA_ERR_SHAPE, "rank 9 given");
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, -1, x_shape, x_val), NOVA_ERR_SHAPE, "rank -1 given");
  EXPECT_STATUS(s, nova_step_run(s), NOVA_ERR_UNBOUND, "input 'x' was never bound");
  nova_step_close(s);
}

static void test_bind_role_and_name(void) {
  nova_step *s = open_ok();
  const float v[6] = {0};
  EXPECT_STATUS(s, nova_step_bind(s, "y", NOVA_DTYPE_F32, 2, x_shape, v), NOVA_ERR_ROLE,
                "tensor 'y' has role output; only inputs, labels, params, opt_state and buffers can be bound");
  EXPECT_STATUS(s, nova_step_bind(s, "loss", NOVA_DTYPE_F32, 0, NULL, v), NOVA_ERR_ROLE, "role loss");
  EXPECT_STATUS(s, nova_step_bind(s, "xx", NOVA_DTYPE_F32, 2, x_shape, v), NOVA_ERR_NOT_FOUND,
                "no tensor named 'xx'");
  nova_step_close(s);
}

static void test_unbound(void) {
  nova_step *s = open_ok();
  EXPECT_STATUS(s, nova_step_run(s), NOVA_ERR_UNBOUND, "input 'x' was never bound");
  nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, x_shape, x_val);
  nova_step_bind(s, "scale", NOVA_DTYPE_F32, 0, NULL, &scale_val);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_ERR_UNBOUND, "input 'idx' was never bound");
  nova_step_bind(s, "idx", NOVA_DTYPE_I64, 1, idx_shape, idx_val);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_ERR_UNBOUND, "label 'lbl' was never bound");
  EXPECT(*get_f32(s, "runs", 1) == 0.0f);
  nova_step_bind(s, "lbl", NOVA_DTYPE_I32, 1, lbl_shape, lbl_val);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_OK, "");
  nova_step_close(s);
}

static void test_index_range(void) {
  nova_step *s = open_ok();
  const int64_t high[4] = {0, 1, 5, 2}, neg[4] = {0, -1, 1, 1};
  const int32_t lbl_high[2] = {0, 3};
  bind_all(s);
  nova_step_bind(s, "idx", NOVA_DTYPE_I64, 1, idx_shape, high);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_ERR_OUT_OF_RANGE,
                "tensor 'idx': value 5 at flat index 2 is outside [0, 5)");
  nova_step_bind(s, "idx", NOVA_DTYPE_I64, 1, idx_shape, neg);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_ERR_OUT_OF_RANGE,
                "tensor 'idx': value -1 at flat index 1 is outside [0, 5)");
  nova_step_bind(s, "idx", NOVA_DTYPE_I64, 1, idx_shape, idx_val);
  nova_step_bind(s, "lbl", NOVA_DTYPE_I32, 1, lbl_shape, lbl_high);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_ERR_OUT_OF_RANGE,
                "tensor 'lbl': value 3 at flat index 1 is outside [0, 3)");
  EXPECT(*get_f32(s, "runs", 1) == 0.0f); /* the entry never ran */
  nova_step_bind(s, "lbl", NOVA_DTYPE_I32, 1, lbl_shape, lbl_val);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_OK, "");
  nova_step_close(s);
}

static void test_null_arguments(void) {
  nova_step *s = open_ok();
  const void *data;
  nova_tensor_info info;
  int index;
  EXPECT(nova_step_open(NULL) == NOVA_ERR_INVALID_ARGUMENT);
  nova_step_close(NULL);
  EXPECT(nova_step_num_tensors(NULL) == 0);
  EXPECT(nova_step_tensor(NULL, 0, &info) == NOVA_ERR_INVALID_ARGUMENT);
  EXPECT(nova_step_tensor(s, 0, NULL) == NOVA_ERR_INVALID_ARGUMENT);
  EXPECT(nova_step_find(NULL, "x", &index) == NOVA_ERR_INVALID_ARGUMENT);
  EXPECT(nova_step_find(s, NULL, &index) == NOVA_ERR_INVALID_ARGUMENT);
  EXPECT(nova_step_find(s, "x", NULL) == NOVA_ERR_INVALID_ARGUMENT);
  EXPECT(nova_step_bind(NULL, "x", NOVA_DTYPE_F32, 2, x_shape, x_val) == NOVA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(s, nova_step_bind(s, NULL, NOVA_DTYPE_F32, 2, x_shape, x_val), NOVA_ERR_INVALID_ARGUMENT,
                "name is NULL");
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, NULL, x_val), NOVA_ERR_INVALID_ARGUMENT,
                "tensor 'x': shape is NULL");
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, x_shape, NULL), NOVA_ERR_INVALID_ARGUMENT,
                "tensor 'x': data is NULL");
  EXPECT(nova_step_run(NULL) == NOVA_ERR_INVALID_ARGUMENT);
  EXPECT(nova_step_get(NULL, "x", &data, &info) == NOVA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(s, nova_step_get(s, NULL, &data, &info), NOVA_ERR_INVALID_ARGUMENT, "name is NULL");
  EXPECT_STATUS(s, nova_step_get(s, "x", NULL, &info), NOVA_ERR_INVALID_ARGUMENT, "data is NULL");
  EXPECT_STATUS(s, nova_step_get(s, "x", &data, NULL), NOVA_ERR_INVALID_ARGUMENT, "info is NULL");
  EXPECT_STATUS(s, nova_step_get(s, "zz", &data, &info), NOVA_ERR_NOT_FOUND, "no tensor named 'zz'");
  EXPECT(nova_step_error(NULL) != NULL && nova_step_error(NULL)[0] != '\0');
  nova_step_close(s);
}

static void test_error_cleared(void) {
  nova_step *s = open_ok();
  nova_step_bind(s, "x", NOVA_DTYPE_I64, 2, x_shape, x_val);
  EXPECT(nova_step_error(s)[0] != '\0');
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, x_shape, x_val), NOVA_OK, "");
  nova_step_close(s);
}

static void test_names(void) {
  EXPECT(strcmp(nova_dtype_name(NOVA_DTYPE_F32), "f32") == 0 && nova_dtype_size(NOVA_DTYPE_F32) == 4);
  EXPECT(strcmp(nova_dtype_name(NOVA_DTYPE_BF16), "bf16") == 0 && nova_dtype_size(NOVA_DTYPE_BF16) == 2);
  EXPECT(strcmp(nova_dtype_name(NOVA_DTYPE_BOOL), "bool") == 0 && nova_dtype_size(NOVA_DTYPE_BOOL) == 1);
  EXPECT(strcmp(nova_dtype_name(NOVA_DTYPE_I64), "i64") == 0 && nova_dtype_size(NOVA_DTYPE_F64) == 8);
  EXPECT(strcmp(nova_dtype_name((nova_dtype)8), "?") == 0 && nova_dtype_size((nova_dtype)8) == 0);
  EXPECT(strcmp(nova_role_name(NOVA_ROLE_OPT_STATE), "opt_state") == 0);
  EXPECT(strcmp(nova_role_name(NOVA_ROLE_LABEL), "label") == 0);
  EXPECT(strcmp(nova_role_name(NOVA_ROLE_BUFFER), "buffer") == 0);
  EXPECT(strcmp(nova_role_name(NOVA_ROLE_STATUS), "status") == 0);
  EXPECT(strcmp(nova_role_name((nova_role)17), "?") == 0);
}

/* ---- descriptors the runtime must refuse ---------------------------------- */

static rt_graph bad_graph;
static rt_tensor_desc bad_tensors[16];
static int32_t bad_args[16];

/* Resets bad_graph to a modifiable copy of the fixture. */
static void bad_reset(void) {
  bad_graph = nova_rt_graph;
  memcpy(bad_tensors, nova_rt_graph.tensors, (size_t)nova_rt_graph.ntensors * sizeof *bad_tensors);
  memcpy(bad_args, nova_rt_graph.arg_tensor, (size_t)nova_rt_graph.nargs * sizeof *bad_args);
  bad_graph.tensors = bad_tensors;
  bad_graph.arg_tensor = bad_args;
}

/* Opening bad_graph fails with NOVA_ERR_ABI and TEXT in the message, and
 * the step that comes back refuses everything but error() and close(). */
#define EXPECT_REFUSED(text) expect_refused_at(text, __FILE__, __LINE__)
static void expect_refused_at(const char *text, const char *file, int line) {
  nova_step *s = NULL;
  nova_tensor_info info;
  int index;
  nova_status st = rt_step_open_graph(&bad_graph, &s);
  expect_at(s != NULL, file, line, "a step holding the message");
  if (!s) return;
  expect_status_at(s, st, NOVA_ERR_ABI, text, file, line);
  expect_at(nova_step_num_tensors(s) == 0, file, line, "no tensors");
  expect_at(nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, x_shape, x_val) == NOVA_ERR_ABI, file, line, "bind refused");
  expect_at(nova_step_run(s) == NOVA_ERR_ABI, file, line, "run refused");
  expect_at(nova_step_find(s, "x", &index) == NOVA_ERR_ABI, file, line, "find refused");
  expect_at(nova_step_tensor(s, 0, &info) == NOVA_ERR_ABI, file, line, "tensor refused");
  expect_status_at(s, NOVA_ERR_ABI, NOVA_ERR_ABI, text, file, line); /* message kept */
  nova_step_close(s);
}

/* The graph hash of the descriptor, and each tensor's index bound. */
static void test_graph_hash_and_bounds(void) {
  nova_step *s = open_ok();
  nova_tensor_info info;
  EXPECT(strcmp(nova_step_graph_hash(s), "0123456789abcdef") == 0);
  EXPECT(strcmp(nova_step_graph_hash(NULL), "") == 0);
  EXPECT(nova_step_tensor(s, 2, &info) == NOVA_OK && strcmp(info.name, "idx") == 0 && info.index_bound == 5);
  EXPECT(nova_step_tensor(s, 3, &info) == NOVA_OK && strcmp(info.name, "lbl") == 0 && info.index_bound == 3);
  EXPECT(nova_step_tensor(s, 0, &info) == NOVA_OK && info.index_bound == 0);
  EXPECT(nova_step_tensor(s, 4, &info) == NOVA_OK && info.index_bound == 0);
  nova_step_close(s);
  bad_reset();
  bad_graph.abi_version = NOVA_STEP_ABI_VERSION + 1;
  s = NULL;
  EXPECT(rt_step_open_graph(&bad_graph, &s) == NOVA_ERR_ABI && s != NULL);
  EXPECT(strcmp(nova_step_graph_hash(s), "") == 0); /* nothing of a refused descriptor is read */
  nova_step_close(s);
}

static void test_abi_mismatch(void) {
  bad_reset();
  bad_graph.abi_version = NOVA_STEP_ABI_VERSION + 1;
  EXPECT_REFUSED("step ABI mismatch: the step was compiled for step ABI version 2, its runtime implements "
                 "version 1");
}

static void test_malformed(void) {
  bad_reset();
  bad_graph.init_size = 20; /* emb's 20 bytes at offset 12 need 32 */
  EXPECT_REFUSED("tensor 'emb': initial value at offset 12, 20 bytes, outside the 20 bytes of init data");
  bad_reset();
  bad_tensors[4].init_offset = -2;
  EXPECT_REFUSED("tensor 'w': initial value at offset -2");
  bad_reset();
  bad_tensors[4].init_kind = 99;
  EXPECT_REFUSED("tensor 'w': generated initial value of kind 99");
  bad_reset();
  bad_tensors[5].init_kind = 2; /* emb has init data */
  EXPECT_REFUSED("tensor 'emb': generated initial value of kind 2 beside init data");
  bad_reset();
  bad_tensors[3].name = "x";
  EXPECT_REFUSED("tensors 0 and 3 are both named 'x'");
  bad_reset();
  bad_tensors[1].name = "";
  EXPECT_REFUSED("tensor 1 has no name");
  bad_reset();
  bad_tensors[0].dtype = 8;
  EXPECT_REFUSED("tensor 'x': unknown dtype 8");
  bad_reset();
  bad_tensors[0].role = 99;
  EXPECT_REFUSED("tensor 'x': unknown role 99");
  bad_reset();
  bad_tensors[0].shape[1] = -3;
  EXPECT_REFUSED("tensor 'x': bad shape [2,-3]");
  bad_reset();
  bad_tensors[0].rank = NOVA_MAX_RANK + 1;
  EXPECT_REFUSED("tensor 'x': bad shape [?] (rank 9)");
  bad_reset();
  bad_tensors[0].shape[0] = INT64_C(1) << 62;
  EXPECT_REFUSED("tensor 'x': bad shape [4611686018427387904,3]");
  bad_reset();
  bad_tensors[0].index_bound = 4;
  EXPECT_REFUSED("tensor 'x': index_bound 4 on a f32 tensor");
  bad_reset();
  bad_args[3] = 10;
  EXPECT_REFUSED("entry argument 3 names tensor 10 of 10");
  bad_reset();
  bad_graph.entry = NULL;
  EXPECT_REFUSED("entry missing");
  bad_reset();
  bad_graph.ntensors = -1;
  EXPECT_REFUSED("bad graph header (-1 tensors");
  nova_step *s = (nova_step *)1;
  EXPECT(rt_step_open_graph(NULL, &s) == NOVA_ERR_INVALID_ARGUMENT && s == NULL);
}

/* A tensor with a zero dimension still gets a valid, aligned buffer. */
static void test_empty_tensor(void) {
  nova_step *s = NULL;
  const void *data = NULL;
  nova_tensor_info info;
  const int64_t shape[2] = {0, 3};
  bad_reset();
  bad_tensors[0].shape[0] = 0;
  EXPECT(rt_step_open_graph(&bad_graph, &s) == NOVA_OK);
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, shape, x_val), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_get(s, "x", &data, &info), NOVA_OK, "");
  EXPECT(data != NULL && info.nbytes == 0);
  nova_step_close(s);
}

/* A closed handle is detected, never dereferenced (ASan would report it):
 * every call fails with NOVA_ERR_INVALID_HANDLE or returns its neutral
 * value, and a second close is a no-op. */
static void test_closed_handle(void) {
  nova_step *s = open_ok();
  bind_all(s);
  nova_step_close(s);
  const void *data;
  nova_tensor_info info;
  int index;
  EXPECT(nova_step_run(s) == NOVA_ERR_INVALID_HANDLE);
  EXPECT(nova_step_eval(s) == NOVA_ERR_INVALID_HANDLE);
  EXPECT(nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, x_shape, x_val) == NOVA_ERR_INVALID_HANDLE);
  EXPECT(nova_step_get(s, "y", &data, &info) == NOVA_ERR_INVALID_HANDLE);
  EXPECT(nova_step_tensor(s, 0, &info) == NOVA_ERR_INVALID_HANDLE);
  EXPECT(nova_step_find(s, "x", &index) == NOVA_ERR_INVALID_HANDLE);
  EXPECT(nova_step_set_profiling(s, 0) == NOVA_ERR_INVALID_HANDLE);
  EXPECT(nova_step_num_tensors(s) == 0 && nova_step_num_launches(s) == 0);
  EXPECT(nova_step_last_run_ms(s) == -1 && strcmp(nova_step_graph_hash(s), "") == 0);
  EXPECT(strstr(nova_step_error(s), "invalid step handle") != NULL);
  nova_step_close(s);
  nova_step_close(s);
  int not_a_step = 0;
  EXPECT(nova_step_run((nova_step *)&not_a_step) == NOVA_ERR_INVALID_HANDLE);
  nova_step_close((nova_step *)&not_a_step);
}

/* While one call holds the step (as another thread's run would), the
 * others return NOVA_ERR_BUSY and leave the step and its message alone. */
static void test_busy_simulated(void) {
  nova_step *s = open_ok();
  bind_all(s);
  EXPECT(rt_step_enter(s));
  EXPECT(nova_step_run(s) == NOVA_ERR_BUSY);
  EXPECT(nova_step_bind(s, "x", NOVA_DTYPE_I64, 2, x_shape, x_val) == NOVA_ERR_BUSY);
  EXPECT(strcmp(nova_step_error(s), "") == 0);
  rt_step_leave(s);
  EXPECT_STATUS(s, nova_step_run(s), NOVA_OK, "");
  nova_step_close(s);
}

enum { RACE_RUNS = 20000 };
typedef struct race_arg {
  nova_step *s;
  int ok, busy, other;
} race_arg;

static void *race_runs(void *p) {
  race_arg *a = p;
  for (int k = 0; k < RACE_RUNS; k++) {
    nova_status st = nova_step_run(a->s);
    if (st == NOVA_OK) a->ok++;
    else if (st == NOVA_ERR_BUSY) a->busy++;
    else a->other++;
  }
  return NULL;
}

/* Two threads running one step: each run either happens whole or is
 * refused; the step's run counter (opt_state 'runs', +1 per run) counts
 * exactly the runs that returned NOVA_OK. */
static void test_busy_threads(void) {
  nova_step *s = open_ok();
  bind_all(s);
  race_arg a[2] = {{.s = s}, {.s = s}};
  pthread_t th;
  int started = pthread_create(&th, NULL, race_runs, &a[1]) == 0;
  race_runs(&a[0]);
  if (started) pthread_join(th, NULL);
  const float *runs = get_f32(s, "runs", 1);
  EXPECT(started && a[0].other == 0 && a[1].other == 0);
  EXPECT(runs && runs[0] == (float)(a[0].ok + a[1].ok));
  if (runs && runs[0] != (float)(a[0].ok + a[1].ok))
    note_failure("    runs %g, %d + %d runs returned NOVA_OK (%d + %d busy)\n", (double)runs[0], a[0].ok, a[1].ok,
                 a[0].busy, a[1].busy);
  nova_step_close(s);
}

/* Every allocation of open() failing in turn gives NOVA_ERR_NO_MEMORY,
 * no step and no leak (ASan and valgrind check the last part). */
static void test_out_of_memory(void) {
  int n = 0;
  for (int fail_at = 1; fail_at < 100; fail_at++) {
    nova_step *s = (nova_step *)1;
    alloc_countdown = fail_at;
    nova_status st = nova_step_open(&s);
    int failed = alloc_countdown == 0;
    alloc_countdown = 0;
    if (!failed) { /* fewer than fail_at allocations: the open succeeded */
      EXPECT(st == NOVA_OK && s != NULL);
      nova_step_close(s);
      break;
    }
    EXPECT(st == NOVA_ERR_NO_MEMORY && s == NULL);
    n++;
  }
  EXPECT(n >= 5 + 10); /* the step, its 4 arrays, 10 buffers */
}

/* ---- a step for several sizes (rt_sizes.c) ------------------------------------ */

/*   x     input  f32 [B,3]   (B: the size, 1 to 4; buckets 2 and 4)
 *   t     input  f32 [2,B]   (the size along its second axis)
 *   size  input  i64 []      batch.size, set by the runtime
 *   y     output f32 [B,3]   2 x
 *   u     output f32 [2,B]   t + 1
 *   seen  output f32 [2]     {the size, x[last row of the bucket][0]} */
enum { S_X, S_T, S_SIZE, S_Y, S_U, S_SEEN, S_COUNT };
static const rt_tensor_desc sized_tensors[S_COUNT] = {
    [S_X] = {"x", NOVA_ROLE_INPUT, NOVA_DTYPE_F32, 2, {4, 3}, 0, -1, -1},
    [S_T] = {"t", NOVA_ROLE_INPUT, NOVA_DTYPE_F32, 2, {2, 4}, 0, -1, -1},
    [S_SIZE] = {"batch.size", NOVA_ROLE_INPUT, NOVA_DTYPE_I64, 0, {0}, 0, -1, -1, 0, 0, 0, 0, RT_INIT_CONST, 4},
    [S_Y] = {"y", NOVA_ROLE_OUTPUT, NOVA_DTYPE_F32, 2, {4, 3}, 0, -1, -1},
    [S_U] = {"u", NOVA_ROLE_OUTPUT, NOVA_DTYPE_F32, 2, {2, 4}, 0, -1, -1},
    [S_SEEN] = {"seen", NOVA_ROLE_OUTPUT, NOVA_DTYPE_F32, 1, {2}, 0, -1, -1},
};
static const int32_t sized_args[S_COUNT] = {S_X, S_T, S_SIZE, S_Y, S_U, S_SEEN};

static void sized_run(void **a, int b) {
  const float *x = a[S_X], *t = a[S_T];
  float *y = a[S_Y], *u = a[S_U], *seen = a[S_SEEN];
  for (int i = 0; i < b * 3; i++) y[i] = 2 * x[i];
  for (int i = 0; i < 2 * b; i++) u[i] = t[i] + 1;
  seen[0] = (float)*(const int64_t *)a[S_SIZE];
  seen[1] = x[(b - 1) * 3];
}
static void sized_entry2(void **a) { sized_run(a, 2); }
static void sized_entry4(void **a) { sized_run(a, 4); }
static const rt_bucket sized_buckets[2] = {{2, sized_entry2, S_COUNT, sized_args, 0, 0, 0, 0, 0},
                                           {4, sized_entry4, S_COUNT, sized_args, 0, 0, 0, 0, 0}};
static const rt_dim_axis sized_axes[4] = {{S_X, 0, 1, 0}, {S_T, 1, 1, 0}, {S_Y, 0, 1, 0}, {S_U, 1, 1, 0}};
static rt_graph sized_graph;
static rt_bucket bad_buckets[2];
static rt_dim_axis bad_axes[4];

static void sized_reset(void) {
  sized_graph = (rt_graph){.abi_version = NOVA_STEP_ABI_VERSION, .novac_version = "fixture", .graph_hash = "",
                           .ntensors = S_COUNT, .tensors = sized_tensors, .nargs = S_COUNT, .arg_tensor = sized_args,
                           .entry = sized_entry4, .dim_name = "batch", .dim_lo = 1, .dim_hi = 4, .nbuckets = 2,
                           .buckets = bad_buckets, .ndim_axes = 4, .dim_axes = bad_axes, .dim_size_tensor = S_SIZE};
  memcpy(bad_buckets, sized_buckets, sizeof bad_buckets);
  memcpy(bad_axes, sized_axes, sizeof bad_axes);
}

static void test_sizes(void) {
  sized_reset();
  nova_step *s = NULL;
  EXPECT(rt_step_open_graph(&sized_graph, &s) == NOVA_OK && s);
  if (!s) return;
  const char *dim = NULL;
  int64_t lo = 0, hi = 0;
  const int64_t *b = NULL;
  EXPECT(nova_step_sizes(s, &dim, &lo, &hi, &b) == 2 && !strcmp(dim, "batch") && lo == 1 && hi == 4 && b[0] == 2 &&
         b[1] == 4);
  static const float x3[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, t3[6] = {10, 20, 30, 40, 50, 60};
  int64_t xs[2] = {3, 3}, ts[2] = {2, 3};
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, xs, x3), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_bind(s, "t", NOVA_DTYPE_F32, 2, ts, t3), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_run(s), NOVA_OK, "");
  const void *p;
  nova_tensor_info info;
  EXPECT(nova_step_get(s, "y", &p, &info) == NOVA_OK && info.rank == 2 && info.shape[0] == 3 && info.nbytes == 36);
  for (int i = 0; i < 9; i++) EXPECT(((const float *)p)[i] == 2 * x3[i]);
  EXPECT(nova_step_get(s, "u", &p, &info) == NOVA_OK && info.shape[1] == 3); /* moved down to [2,3] */
  for (int i = 0; i < 6; i++) EXPECT(((const float *)p)[i] == t3[i] + 1);
  EXPECT(nova_step_get(s, "seen", &p, &info) == NOVA_OK && ((const float *)p)[0] == 3 && ((const float *)p)[1] == 7);
  xs[0] = 1, ts[1] = 1; /* bucket 2: row 1 a copy of row 0 */
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, xs, x3 + 3), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_bind(s, "t", NOVA_DTYPE_F32, 2, ts, t3), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_run(s), NOVA_OK, "");
  EXPECT(nova_step_get(s, "seen", &p, &info) == NOVA_OK && ((const float *)p)[0] == 1 && ((const float *)p)[1] == 4);
  EXPECT(nova_step_get(s, "u", &p, &info) == NOVA_OK && info.shape[1] == 1 && ((const float *)p)[0] == t3[0] + 1 &&
         ((const float *)p)[1] == t3[1] + 1);
  ts[1] = 2;
  EXPECT_STATUS(s, nova_step_bind(s, "t", NOVA_DTYPE_F32, 2, ts, t3), NOVA_OK, "");
  EXPECT_STATUS(s, nova_step_run(s), NOVA_ERR_SHAPE, "different sizes of batch: 1 and 2");
  xs[0] = 5;
  EXPECT_STATUS(s, nova_step_bind(s, "x", NOVA_DTYPE_F32, 2, xs, x3), NOVA_ERR_SHAPE, "[batch,3] with batch from 1 to 4");
  int64_t one = 2;
  EXPECT_STATUS(s, nova_step_bind(s, "batch.size", NOVA_DTYPE_I64, 0, NULL, &one), NOVA_ERR_ROLE, "size of each run");
  EXPECT_STATUS(s, nova_step_set_size(s, 5), NOVA_ERR_SHAPE, "outside");
  nova_step_close(s);
  EXPECT(nova_step_sizes(s, &dim, &lo, &hi, &b) == 0); /* closed */

  /* a malformed bucket table or axis is refused at open */
  sized_reset();
  bad_buckets[1].size = 3; /* not the largest size */
  s = NULL;
  EXPECT(rt_step_open_graph(&sized_graph, &s) == NOVA_ERR_ABI);
  EXPECT_STATUS(s, NOVA_ERR_ABI, NOVA_ERR_ABI, "the sizes of 'batch': the range or the bucket list is inconsistent");
  nova_step_close(s);
  sized_reset();
  bad_axes[1].axis = 2;
  s = NULL;
  EXPECT(rt_step_open_graph(&sized_graph, &s) == NOVA_ERR_ABI);
  EXPECT_STATUS(s, NOVA_ERR_ABI, NOVA_ERR_ABI, "an axis of the dimension is inconsistent");
  nova_step_close(s);
  sized_reset();
  sized_graph.dim_size_tensor = S_X;
  s = NULL;
  EXPECT(rt_step_open_graph(&sized_graph, &s) == NOVA_ERR_ABI);
  EXPECT_STATUS(s, NOVA_ERR_ABI, NOVA_ERR_ABI, "its size input is inconsistent");
  nova_step_close(s);
}

int main(void) {
  run_case("open_and_query", test_open_and_query);
  run_case("initial_values", test_initial_values);
  run_case("run_values", test_run_values);
  run_case("bind_param", test_bind_param);
  run_case("bind_opt_state", test_bind_opt_state);
  run_case("graph_hash_and_bounds", test_graph_hash_and_bounds);
  run_case("steps_independent", test_steps_independent);
  run_case("bind_dtype", test_bind_dtype);
  run_case("bind_shape", test_bind_shape);
  run_case("bind_role_and_name", test_bind_role_and_name);
  run_case("unbound", test_unbound);
  run_case("index_range", test_index_range);
  run_case("null_arguments", test_null_arguments);
  run_case("error_cleared", test_error_cleared);
  run_case("names", test_names);
  run_case("abi_mismatch", test_abi_mismatch);
  run_case("malformed", test_malformed);
  run_case("empty_tensor", test_empty_tensor);
  run_case("out_of_memory", test_out_of_memory);
  run_case("closed_handle", test_closed_handle);
  run_case("busy_simulated", test_busy_simulated);
  run_case("busy_threads", test_busy_threads);
  run_case("sizes", test_sizes);
  return 0;
}
