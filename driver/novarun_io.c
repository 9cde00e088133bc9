/* novarun_io.c: novarun's tensors in and out of a step: inputs read from
 * TensorProto files and bound, outputs summarized, printed and written. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "novarun.h"
#include "rt_dtype.h"
#include "tensor_pb.h"

#define NR_PATH_LEN 4096
#define NR_PRINT_VALUES 8 /* values --print shows per output */

static int nr_is_fed(nova_role r) { return r == NOVA_ROLE_INPUT || r == NOVA_ROLE_LABEL; }
static int nr_is_result(nova_role r) { return r == NOVA_ROLE_OUTPUT || r == NOVA_ROLE_LOSS; }

/* "DIR/LEAF" into PATH (NR_PATH_LEN bytes); 1 after a diagnostic if too long. */
__attribute__((format(printf, 3, 4))) static int nr_path(char *path, const char *dir, const char *fmt, ...) {
  char leaf[NR_PATH_LEN];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(leaf, sizeof leaf, fmt, ap);
  va_end(ap);
  if (n < 0 || n >= NR_PATH_LEN || snprintf(path, NR_PATH_LEN, "%s/%s", dir, leaf) >= NR_PATH_LEN)
    return nr_error("%s/%s: path too long", dir, leaf);
  return 0;
}

int nr_tensor(nr_step *s, int i, nova_tensor_info *info) {
  memset(info, 0, sizeof *info);
  if (s->api.tensor(s->step, i, info) != NOVA_OK) return nr_error("%s: cannot query tensor %d", s->path, i);
  return 0;
}

/* ---- inputs -------------------------------------------------------------- */

/* The file holding input K (INFO) under DIR into PATH: DIR/input_K.pb if
 * it exists, else DIR/NAME.pb; *POSITIONAL says which. */
static int nr_input_path(const char *dir, int k, const nova_tensor_info *info, char *path, int *positional) {
  char alt[NR_PATH_LEN];
  if (nr_path(path, dir, "input_%d.pb", k) || nr_path(alt, dir, "%s.pb", info->name)) return 1;
  *positional = access(path, F_OK) == 0;
  if (*positional) return 0;
  if (access(alt, F_OK) != 0)
    return nr_error("no file for %s '%s': neither %s nor %s exists", rt_role_name(info->role), info->name, path,
                    alt);
  memcpy(path, alt, sizeof alt);
  return 0;
}

static int nr_same_type(const tpb_tensor *t, const nova_tensor_info *info) {
  if (t->dtype != (int)info->dtype || t->rank != info->rank) return 0;
  for (int d = 0; d < t->rank; d++)
    if (t->shape[d] != info->shape[d]) return 0;
  return 1;
}

/* Reads input K (INFO) from O->inputs_dir and binds it. */
static int nr_bind_one(nr_step *s, const nr_options *o, int k, const nova_tensor_info *info) {
  char path[NR_PATH_LEN], err[TPB_ERROR_LEN], have[256], want[256];
  int positional = 0;
  tpb_tensor *t = NULL;
  if (nr_input_path(o->inputs_dir, k, info, path, &positional)) return 1;
  if (tpb_read_file(path, &t, err) != TPB_OK) return nr_error("%s", err);
  int rc = 0;
  if (!nr_same_type(t, info))
    rc = nr_error("%s: holds %s %s, but %s '%s' of the step is %s %s", path, rt_dtype_name(t->dtype),
                  rt_shape_str(have, sizeof have, t->rank, t->shape), rt_role_name(info->role), info->name,
                  rt_dtype_name(info->dtype), rt_shape_str(want, sizeof want, info->rank, info->shape));
  else if (s->api.bind(s->step, info->name, info->dtype, t->rank, t->shape, t->data) != NOVA_OK)
    rc = nr_error("%s: %s", path, s->api.error(s->step));
  else if (positional && t->name && strcmp(t->name, info->name) != 0)
    nr_warning("%s holds tensor '%s', bound to %s %d of the step, '%s'", path, t->name, rt_role_name(info->role),
               k, info->name);
  tpb_tensor_destroy(t);
  return rc;
}

/* 1 after a diagnostic if S has inputs and no --inputs was given. */
static int nr_check_inputs_given(nr_step *s, const nr_options *o) {
  nova_tensor_info info;
  int n = s->api.num_tensors(s->step), fed = 0;
  const char *first = NULL;
  for (int i = 0; i < n; i++)
    if (s->api.tensor(s->step, i, &info) == NOVA_OK && nr_is_fed(info.role) && !info.has_default && fed++ == 0)
      first = info.name;
  if (fed == 0 || o->inputs_dir) return 0;
  return nr_error("%s: the step has %d input%s ('%s'%s); give %s with --inputs DIR, --data FILE or --seed N",
                  o->step_path, fed,
                  fed > 1 ? "s" : "", first, fed > 1 ? ", ..." : "", fed > 1 ? "them" : "it");
}

int nr_bind_inputs(nr_step *s, const nr_options *o, int *nbound) {
  nova_tensor_info info;
  struct stat st;
  int n = s->api.num_tensors(s->step);
  *nbound = 0;
  if (o->inputs_dir && stat(o->inputs_dir, &st) != 0) return nr_error("%s: %s", o->inputs_dir, strerror(errno));
  if (o->inputs_dir && !S_ISDIR(st.st_mode)) return nr_error("%s: not a directory", o->inputs_dir);
  if (nr_check_inputs_given(s, o)) return 1;
  for (int i = 0; i < n; i++) {
    if (s->api.tensor(s->step, i, &info) != NOVA_OK) return nr_error("%s: cannot query tensor %d", o->step_path, i);
    if (!nr_is_fed(info.role)) continue;
    if (info.has_default) { /* e.g. lr: bound from DIR/NAME.pb only if that file exists */
      char path[NR_PATH_LEN];
      if (!o->inputs_dir || nr_path(path, o->inputs_dir, "%s.pb", info.name) || access(path, F_OK)) continue;
    }
    if (nr_bind_one(s, o, *nbound, &info)) return 1;
    ++*nbound;
  }
  return 0;
}

/* ---- outputs ------------------------------------------------------------- */

int nr_make_dirs(const char *dir) {
  char path[NR_PATH_LEN];
  struct stat st;
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return nr_error("%s: path too long", dir);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(path, 0777) != 0 && errno != EEXIST) return nr_error("cannot create %s: %s", path, strerror(errno));
    *p = '/';
  }
  if (mkdir(path, 0777) != 0 && errno != EEXIST) return nr_error("cannot create %s: %s", path, strerror(errno));
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return nr_error("%s exists and is not a directory", path);
  return 0;
}

static float nr_f16_to_float(uint16_t h) {
  int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v = exp == 0    ? ldexpf((float)man, -24)
            : exp == 31 ? (man ? NAN : INFINITY)
                        : ldexpf((float)(man | 0x400), exp - 25);
  return h >> 15 ? -v : v;
}

static float nr_bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

/* Element I of DATA, of DTYPE, as a double (i64 beyond 2^53 rounds). */
static double nr_value(const void *data, nova_dtype dtype, size_t i) {
  switch (dtype) {
  case NOVA_DTYPE_F32: return ((const float *)data)[i];
  case NOVA_DTYPE_F64: return ((const double *)data)[i];
  case NOVA_DTYPE_I32: return ((const int32_t *)data)[i];
  case NOVA_DTYPE_I64: return (double)((const int64_t *)data)[i];
  case NOVA_DTYPE_I8: return ((const int8_t *)data)[i];
  case NOVA_DTYPE_U8: return ((const uint8_t *)data)[i];
  case NOVA_DTYPE_I16: return ((const int16_t *)data)[i];
  case NOVA_DTYPE_U16: return ((const uint16_t *)data)[i];
  case NOVA_DTYPE_U32: return ((const uint32_t *)data)[i];
  case NOVA_DTYPE_U64: return (double)((const uint64_t *)data)[i];
  case NOVA_DTYPE_BOOL: return ((const uint8_t *)data)[i] != 0;
  case NOVA_DTYPE_F16: return nr_f16_to_float(((const uint16_t *)data)[i]);
  case NOVA_DTYPE_BF16: return nr_bf16_to_float(((const uint16_t *)data)[i]);
  }
  return NAN;
}

static void nr_print_value(const void *data, nova_dtype dtype, size_t i) {
  if (dtype == NOVA_DTYPE_I64)
    printf("%lld", (long long)((const int64_t *)data)[i]);
  else if (dtype == NOVA_DTYPE_U64)
    printf("%llu", (unsigned long long)((const uint64_t *)data)[i]);
  else
    printf("%.7g", nr_value(data, dtype, i));
}

/* "NAME DTYPE SHAPE = [v0, v1, ...]  min A  max B  mean C" on stdout. */
static void nr_print_tensor(const nova_tensor_info *info, const void *data) {
  char shape[256];
  size_t n = info->nbytes / rt_dtype_size(info->dtype);
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  printf("%s %s %s = [", info->name, rt_dtype_name(info->dtype),
         rt_shape_str(shape, sizeof shape, info->rank, info->shape));
  for (size_t i = 0; i < n; i++) {
    double v = nr_value(data, info->dtype, i);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    sum += v;
    if (i < NR_PRINT_VALUES) {
      if (i) printf(", ");
      nr_print_value(data, info->dtype, i);
    }
  }
  if (n > NR_PRINT_VALUES) printf(", ...");
  if (n == 0)
    printf("]  (empty)\n");
  else
    printf("]  min %.7g  max %.7g  mean %.7g\n", lo, hi, sum / (double)n);
}

/* Writes a tensor (INFO, DATA) to PATH as a TensorProto. */
static int nr_write_tensor(const char *path, const nova_tensor_info *info, const void *data) {
  char err[TPB_ERROR_LEN];
  tpb_tensor view = {.name = (char *)info->name, .dtype = info->dtype, .rank = info->rank, .nbytes = info->nbytes};
  if (info->rank > 0) memcpy(view.shape, info->shape, (size_t)info->rank * sizeof *view.shape);
  view.data = (void *)data; /* tpb_write_file only reads it */
  if (tpb_write_file(path, &view, err) != TPB_OK) return nr_error("%s", err);
  return 0;
}

/* Writes output K (INFO, DATA) to DIR/output_K.pb into PATH. */
static int nr_write_output(const char *dir, int k, const nova_tensor_info *info, const void *data, char *path) {
  if (nr_path(path, dir, "output_%d.pb", k)) return 1;
  return nr_write_tensor(path, info, data);
}

/* A tensor name as a file-name part: '/' and control characters become '_'. */
static void nr_file_part(char *out, size_t n, const char *name) {
  size_t k = 0;
  for (; *name && k + 1 < n; name++) {
    unsigned char c = (unsigned char)*name;
    out[k++] = (c == '/' || c < 32 || c == 127) ? '_' : (char)c;
  }
  out[k] = 0;
}

int nr_dump(nr_step *s, const nr_options *o) {
  nova_tensor_info info;
  int n = s->api.num_tensors(s->step), loss = 0, grads = 0;
  for (int i = 0; i < n; i++) {
    if (s->api.tensor(s->step, i, &info) != NOVA_OK) return nr_error("%s: cannot query tensor %d", o->step_path, i);
    loss += info.role == NOVA_ROLE_LOSS;
    grads += info.role == NOVA_ROLE_GRAD;
    if (info.role != NOVA_ROLE_PARAM && info.role != NOVA_ROLE_LOSS && info.role != NOVA_ROLE_GRAD &&
        info.role != NOVA_ROLE_BUFFER)
      continue;
    const void *data = NULL;
    nova_tensor_info got;
    if (s->api.get(s->step, info.name, &data, &got) != NOVA_OK)
      return nr_error("%s: %s", o->step_path, s->api.error(s->step));
    char path[NR_PATH_LEN], part[256];
    nr_file_part(part, sizeof part, got.name);
    size_t pl = strlen(part);
    if (got.role == NOVA_ROLE_GRAD && pl > 5 && !strcmp(part + pl - 5, ".grad")) part[pl - 5] = 0; /* NAME.grad */
    if (got.role == NOVA_ROLE_LOSS ? nr_path(path, o->dump_dir, "loss.pb%s", "")
        : got.role == NOVA_ROLE_GRAD ? nr_path(path, o->dump_dir, "grad.%s.pb", part)
        : got.role == NOVA_ROLE_BUFFER ? nr_path(path, o->dump_dir, "buffer.%s.pb", part)
                                       : nr_path(path, o->dump_dir, "param.%s.pb", part))
      return 1;
    if (nr_write_tensor(path, &got, data)) return 1;
  }
  if (loss && !grads && !o->quiet)
    fprintf(stderr, "novarun: note: %s keeps no gradients (novac --keep-grads makes them outputs): --dump wrote "
            "the loss and the parameters\n", o->step_path);
  return 0;
}

/* Summary, --print and --outputs for output K (INFO). */
static int nr_report_one(nr_step *s, const nr_options *o, int k, const nova_tensor_info *info) {
  char path[NR_PATH_LEN] = "", shape[256];
  const void *data = NULL;
  nova_tensor_info got;
  if (s->api.get(s->step, info->name, &data, &got) != NOVA_OK)
    return nr_error("%s: %s", o->step_path, s->api.error(s->step));
  if (o->outputs_dir && nr_write_output(o->outputs_dir, k, &got, data, path)) return 1;
  if (!o->quiet)
    fprintf(stderr, "novarun: %s %d '%s' %s %s%s%s\n", rt_role_name(got.role), k, got.name,
            rt_dtype_name(got.dtype), rt_shape_str(shape, sizeof shape, got.rank, got.shape), path[0] ? " -> " : "",
            path);
  if (o->print) nr_print_tensor(&got, data);
  return 0;
}

int nr_report_outputs(nr_step *s, const nr_options *o) {
  nova_tensor_info info;
  int n = s->api.num_tensors(s->step), k = 0;
  for (int i = 0; i < n; i++) {
    if (s->api.tensor(s->step, i, &info) != NOVA_OK) return nr_error("%s: cannot query tensor %d", o->step_path, i);
    if (!nr_is_result(info.role)) continue;
    if (nr_report_one(s, o, k++, &info)) return 1;
  }
  if (k == 0 && !o->quiet) fprintf(stderr, "novarun: the step has no outputs\n");
  if (o->print) fflush(stdout);
  return 0;
}
