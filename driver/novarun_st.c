/* novarun_st.c: safetensors files, as --save/--load checkpoints and --data
 * training data are written.
 *
 * Layout: an 8-byte little-endian header length N; N bytes of JSON, an
 * object mapping each tensor name to {"dtype": "F32", "shape": [...],
 * "data_offsets": [begin, end]} (bytes of the data section) plus an
 * optional "__metadata__" object of strings; then the data section, each
 * tensor's elements in row-major order, little-endian.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "novarun.h"
#include "../support/util.h"
#include "rt_dtype.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "novarun reads and writes tensors as little-endian bytes: a big-endian host needs byte swapping here"
#endif

/* The header is parsed whole: a larger one is refused (the limit of the
 * reference implementation, which no real file comes near). */
#define NR_ST_MAX_HEADER (100u << 20)
/* JSON numbers are doubles: integers above 2^53 are not exact. */
#define NR_ST_MAX_INT 9007199254740992.0

static const struct {
  const char *name;
  nova_dtype dtype;
} nr_st_dtypes[] = {
    {"F32", NOVA_DTYPE_F32}, {"F64", NOVA_DTYPE_F64}, {"F16", NOVA_DTYPE_F16},  {"BF16", NOVA_DTYPE_BF16},
    {"I64", NOVA_DTYPE_I64}, {"I32", NOVA_DTYPE_I32}, {"I16", NOVA_DTYPE_I16},  {"I8", NOVA_DTYPE_I8},
    {"U64", NOVA_DTYPE_U64}, {"U32", NOVA_DTYPE_U32}, {"U16", NOVA_DTYPE_U16},  {"U8", NOVA_DTYPE_U8},
    {"BOOL", NOVA_DTYPE_BOOL},
};
#define NR_ST_NDTYPES (sizeof nr_st_dtypes / sizeof *nr_st_dtypes)

const char *nr_st_dtype_name(nova_dtype dtype) {
  for (size_t i = 0; i < NR_ST_NDTYPES; i++)
    if (nr_st_dtypes[i].dtype == dtype) return nr_st_dtypes[i].name;
  return "?";
}

char *nr_type_str(char *buf, size_t n, nova_dtype dtype, int rank, const int64_t *shape) {
  size_t used = (size_t)snprintf(buf, n, "%s [", rt_dtype_name(dtype));
  for (int d = 0; d < rank && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? "," : "", (long long)shape[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

/* ---- reading ------------------------------------------------------------- */

/* Reads N bytes at OFFSET of FD into BUF; 0, or -1 with errno (0: the file
 * ended first). */
static int nr_pread_all(int fd, void *buf, size_t n, uint64_t offset) {
  char *p = buf;
  while (n > 0) {
    ssize_t got = pread(fd, p, n, (off_t)offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return -1;
    }
    p += got;
    n -= (size_t)got;
    offset += (uint64_t)got;
  }
  return 0;
}

int nr_st_read(const nr_st_file *f, uint64_t offset, void *buf, size_t n) {
  if (offset > f->data_size || n > f->data_size - offset)
    return nr_error("%s: reading bytes [%llu, %llu) beyond the data section (%llu bytes)", f->path,
                    (unsigned long long)offset, (unsigned long long)(offset + n), (unsigned long long)f->data_size);
  if (nr_pread_all(f->fd, buf, n, f->data_start + offset))
    return nr_error("%s: %s", f->path, errno ? strerror(errno) : "the file became shorter while it was read");
  return 0;
}

/* A JSON integer in [0, 2^53] into *V; 0 if ITEM is anything else. */
static int nr_json_uint(const cJSON *item, uint64_t *v) {
  if (!cJSON_IsNumber(item)) return 0;
  double d = item->valuedouble;
  if (!(d >= 0 && d <= NR_ST_MAX_INT) || d != floor(d)) return 0;
  *v = (uint64_t)d;
  return 1;
}

/* Bytes of DTYPE x SHAPE into *NBYTES; 0 if beyond 2^63. */
static int nr_st_nbytes(nova_dtype dtype, int rank, const int64_t *shape, uint64_t *nbytes) {
  uint64_t total = rt_dtype_size(dtype);
  for (int d = 0; d < rank; d++) {
    if (shape[d] > 0 && total > ((uint64_t)1 << 62) / (uint64_t)shape[d]) return 0;
    total *= (uint64_t)shape[d];
  }
  *nbytes = total;
  return 1;
}

/* The entry NAME: VALUE of the header into *T. */
static int nr_st_parse_tensor(const nr_st_file *f, const char *name, const cJSON *value, nr_st_tensor *t) {
  char type[320];
  memset(t, 0, sizeof *t);
  t->name = name;
  if (!cJSON_IsObject(value)) return nr_error("%s: tensor '%s': its header entry is not a JSON object", f->path, name);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(value, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(value, "shape");
  const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(value, "data_offsets");
  if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets))
    return nr_error("%s: tensor '%s': its header entry lacks %s", f->path, name,
                    !cJSON_IsString(dtype) ? "a \"dtype\" string"
                    : !cJSON_IsArray(shape) ? "a \"shape\" array"
                                            : "a \"data_offsets\" array");
  size_t k = 0;
  while (k < NR_ST_NDTYPES && strcmp(nr_st_dtypes[k].name, dtype->valuestring) != 0) k++;
  if (k == NR_ST_NDTYPES)
    return nr_error("%s: tensor '%s': dtype \"%s\" is not supported (F32, F64, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL)", f->path,
                    name, dtype->valuestring);
  t->dtype = nr_st_dtypes[k].dtype;
  int rank = cJSON_GetArraySize(shape);
  if (rank > NR_ST_MAX_RANK)
    return nr_error("%s: tensor '%s': rank %d, more than novarun supports (%d)", f->path, name, rank, NR_ST_MAX_RANK);
  t->rank = rank;
  int d = 0;
  for (const cJSON *dim = shape->child; dim; dim = dim->next, d++) {
    uint64_t v;
    if (!nr_json_uint(dim, &v)) return nr_error("%s: tensor '%s': shape entry %d is not a size", f->path, name, d);
    t->shape[d] = (int64_t)v;
  }
  uint64_t nbytes;
  if (cJSON_GetArraySize(offsets) != 2 || !nr_json_uint(offsets->child, &t->begin) ||
      !nr_json_uint(offsets->child->next, &t->end) || t->begin > t->end)
    return nr_error("%s: tensor '%s': data_offsets is not a pair [begin, end] with begin <= end", f->path, name);
  if (!nr_st_nbytes(t->dtype, t->rank, t->shape, &nbytes))
    return nr_error("%s: tensor '%s': shape %s is too large", f->path, name,
                    nr_type_str(type, sizeof type, t->dtype, t->rank, t->shape));
  if (t->end > f->data_size)
    return nr_error("%s: tensor '%s': data_offsets [%llu, %llu] out of bounds: the data section has %llu bytes "
                    "(truncated file?)",
                    f->path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                    (unsigned long long)f->data_size);
  if (t->end - t->begin != nbytes)
    return nr_error("%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes, but %s needs %llu", f->path, name,
                    (unsigned long long)t->begin, (unsigned long long)t->end,
                    (unsigned long long)(t->end - t->begin),
                    nr_type_str(type, sizeof type, t->dtype, t->rank, t->shape), (unsigned long long)nbytes);
  return 0;
}

/* "__metadata__" must map names to strings. */
static int nr_st_check_metadata(const nr_st_file *f, const cJSON *meta) {
  if (!cJSON_IsObject(meta)) return nr_error("%s: __metadata__ is not a JSON object", f->path);
  for (const cJSON *m = meta->child; m; m = m->next)
    if (!cJSON_IsString(m)) return nr_error("%s: __metadata__ entry '%s' is not a string", f->path, m->string);
  return 0;
}

static int nr_st_by_begin(const void *a, const void *b) {
  const nr_st_tensor *x = *(const nr_st_tensor *const *)a, *y = *(const nr_st_tensor *const *)b;
  return (x->begin > y->begin) - (x->begin < y->begin);
}

static int nr_st_by_name(const void *a, const void *b) {
  return strcmp((*(const nr_st_tensor *const *)a)->name, (*(const nr_st_tensor *const *)b)->name);
}

/* No bytes after the last tensor's data (the safetensors format forbids
 * them).  Holes between tensors are let through: a checkpoint that lacks a
 * tensor is reported by name, not as a hole. */
static int nr_st_check_covered(const nr_st_file *f, const nr_st_tensor *const *v, int n) {
  uint64_t end = 0;
  for (int i = 0; i < n; i++)
    if (v[i]->end > end) end = v[i]->end;
  if (end != f->data_size)
    return nr_error("%s: %llu bytes after the last tensor's data (the safetensors format forbids trailing bytes)",
                    f->path, (unsigned long long)(f->data_size - end));
  return 0;
}

/* Names unique, no two tensors' bytes overlapping, nothing after the last. */
static int nr_st_check_layout(const nr_st_file *f) {
  int n = f->ntensors, rc = 0;
  const nr_st_tensor **v = malloc((size_t)(n ? n : 1) * sizeof *v);
  if (!v) return nr_error("%s: out of memory", f->path);
  for (int i = 0; i < n; i++) v[i] = &f->tensors[i];
  qsort(v, (size_t)n, sizeof *v, nr_st_by_name);
  for (int i = 1; i < n && !rc; i++)
    if (!strcmp(v[i - 1]->name, v[i]->name))
      rc = nr_error("%s: tensor '%s' appears twice in the header", f->path, v[i]->name);
  /* sorted by begin, a nonempty tensor overlaps another iff it overlaps the
   * nonempty one that ends last among those before it */
  qsort(v, (size_t)n, sizeof *v, nr_st_by_begin);
  const nr_st_tensor *last = NULL;
  for (int i = 0; i < n && !rc; i++) {
    if (v[i]->begin == v[i]->end) continue;
    if (last && v[i]->begin < last->end)
      rc = nr_error("%s: tensors '%s' and '%s' overlap: data_offsets [%llu, %llu] and [%llu, %llu]", f->path,
                    last->name, v[i]->name, (unsigned long long)last->begin, (unsigned long long)last->end,
                    (unsigned long long)v[i]->begin, (unsigned long long)v[i]->end);
    if (!last || v[i]->end > last->end) last = v[i];
  }
  if (!rc) rc = nr_st_check_covered(f, v, n);
  free(v);
  return rc;
}

/* The JSON header of F (HLEN bytes at offset 8) into F->header/tensors. */
static int nr_st_parse_header(nr_st_file *f, uint64_t hlen) {
  char *text = malloc((size_t)hlen + 1);
  if (!text) return nr_error("%s: out of memory for a %llu-byte header", f->path, (unsigned long long)hlen);
  if (nr_pread_all(f->fd, text, (size_t)hlen, 8)) {
    free(text);
    return nr_error("%s: %s", f->path, errno ? strerror(errno) : "the file became shorter while it was read");
  }
  text[hlen] = '\0';
  const char *end = NULL;
  nv_json_oom_take();
  cJSON *root = hlen && text[0] == '{' ? cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0) : NULL;
  if (!root && nv_json_oom_take()) {
    free(text);
    return nr_error("%s: out of memory reading its %llu-byte header", f->path, (unsigned long long)hlen);
  }
  if (!root) {
    int object = hlen && text[0] == '{';
    const char *at = cJSON_GetErrorPtr();
    long pos = object && at >= text && at <= text + hlen ? (long)(at - text) : 0;
    free(text);
    if (!object) return nr_error("%s: not a safetensors file: its header does not start with '{'", f->path);
    return nr_error("%s: the header is not valid JSON (at byte %ld of %llu)", f->path, pos,
                    (unsigned long long)hlen);
  }
  /* the writer may pad the header with spaces, nothing else */
  for (const char *p = end; p < text + hlen; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
      long pos = (long)(p - text);
      free(text);
      cJSON_Delete(root);
      return nr_error("%s: the header is not valid JSON (text after the object, at byte %ld of %llu)", f->path, pos,
                      (unsigned long long)hlen);
    }
  free(text);
  f->header = root;
  if (!cJSON_IsObject(root)) return nr_error("%s: not a safetensors file: its header is not a JSON object", f->path);
  int n = 0;
  for (const cJSON *e = root->child; e; e = e->next) n += strcmp(e->string, "__metadata__") != 0;
  f->tensors = calloc((size_t)(n ? n : 1), sizeof *f->tensors);
  if (!f->tensors) return nr_error("%s: out of memory for %d tensors", f->path, n);
  for (const cJSON *e = root->child; e; e = e->next) {
    if (!strcmp(e->string, "__metadata__")) {
      if (nr_st_check_metadata(f, e)) return 1;
    } else if (nr_st_parse_tensor(f, e->string, e, &f->tensors[f->ntensors++])) {
      return 1;
    }
  }
  return nr_st_check_layout(f);
}

int nr_st_open(const char *path, nr_st_file *f) {
  unsigned char len[8];
  struct stat st;
  memset(f, 0, sizeof *f);
  f->path = path;
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) return nr_error("%s: %s", path, strerror(errno));
  int rc = 0;
  uint64_t hlen = 0, size = 0;
  if (fstat(f->fd, &st) != 0) {
    rc = nr_error("%s: %s", path, strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    rc = nr_error("%s: not a regular file", path);
  } else if ((size = (uint64_t)st.st_size) < 8) {
    rc = nr_error("%s: not a safetensors file: %llu bytes, too short for the 8-byte header length", path,
                  (unsigned long long)size);
  } else if (nr_pread_all(f->fd, len, 8, 0)) {
    rc = nr_error("%s: %s", path, errno ? strerror(errno) : "the file became shorter while it was read");
  } else {
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len[i];
    if (hlen > size - 8)
      rc = nr_error("%s: not a safetensors file, or a truncated one: its header length %llu goes beyond the end "
                    "of the file (%llu bytes)",
                    path, (unsigned long long)hlen, (unsigned long long)size);
    else if (hlen > NR_ST_MAX_HEADER)
      rc = nr_error("%s: header length %llu is more than novarun reads (%u)", path, (unsigned long long)hlen,
                    NR_ST_MAX_HEADER);
  }
  if (!rc) {
    f->data_start = 8 + hlen;
    f->data_size = size - f->data_start;
    rc = nr_st_parse_header(f, hlen);
  }
  if (rc) nr_st_close(f);
  return rc;
}

void nr_st_close(nr_st_file *f) {
  if (f->fd >= 0) close(f->fd);
  cJSON_Delete(f->header);
  free(f->tensors);
  f->fd = -1;
  f->header = NULL;
  f->tensors = NULL;
  f->ntensors = 0;
}

const nr_st_tensor *nr_st_find(const nr_st_file *f, const char *name) {
  for (int i = 0; i < f->ntensors; i++)
    if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
  return NULL;
}

const char *nr_st_metadata(const nr_st_file *f, const char *key) {
  const cJSON *meta = cJSON_GetObjectItemCaseSensitive(f->header, "__metadata__");
  const cJSON *v = meta ? cJSON_GetObjectItemCaseSensitive(meta, key) : NULL;
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- writing ------------------------------------------------------------- */

/* An integer as a raw JSON number (exact, unlike cJSON's doubles). */
static int nr_json_add_uint(cJSON *array, uint64_t v) {
  char text[24];
  snprintf(text, sizeof text, "%llu", (unsigned long long)v);
  cJSON *item = cJSON_CreateRaw(text);
  return item && cJSON_AddItemToArray(array, item);
}

/* The header text: metadata, then each tensor at consecutive offsets;
 * padded with spaces to a multiple of 8 bytes so the data section starts
 * aligned.  Caller frees; NULL when out of memory. */
static char *nr_st_header(int n, const nr_st_out *t, int nmeta, const char *const *keys, const char *const *values,
                          size_t *len) {
  cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject();
  int ok = root && meta && cJSON_AddItemToObject(root, "__metadata__", meta);
  if (!ok) cJSON_Delete(meta);
  for (int i = 0; ok && i < nmeta; i++) ok = cJSON_AddStringToObject(meta, keys[i], values[i]) != NULL;
  uint64_t offset = 0;
  for (int i = 0; ok && i < n; i++) {
    cJSON *e = cJSON_AddObjectToObject(root, t[i].name), *shape, *offsets;
    ok = e && cJSON_AddStringToObject(e, "dtype", nr_st_dtype_name(t[i].dtype)) &&
         (shape = cJSON_AddArrayToObject(e, "shape")) && (offsets = cJSON_AddArrayToObject(e, "data_offsets"));
    for (int d = 0; ok && d < t[i].rank; d++) ok = nr_json_add_uint(shape, (uint64_t)t[i].shape[d]);
    ok = ok && nr_json_add_uint(offsets, offset) && nr_json_add_uint(offsets, offset + t[i].nbytes);
    offset += t[i].nbytes;
  }
  char *text = ok ? cJSON_PrintUnformatted(root) : NULL, *padded = NULL;
  cJSON_Delete(root);
  if (!text) return NULL;
  size_t n0 = strlen(text);
  *len = (n0 + 7) / 8 * 8;
  if ((padded = malloc(*len + 1))) {
    memcpy(padded, text, n0);
    memset(padded + n0, ' ', *len - n0);
    padded[*len] = '\0';
  }
  cJSON_free(text);
  return padded;
}

int nr_st_write(const char *path, int n, const nr_st_out *tensors, int nmeta, const char *const *keys,
                const char *const *values) {
  size_t hlen = 0;
  char *header = nr_st_header(n, tensors, nmeta, keys, values, &hlen);
  if (!header) return nr_error("%s: out of memory for the header", path);
  nv_out out;
  if (nv_out_open(&out, path, NV_OUT_REGULAR)) {
    free(header);
    if (errno == ENOTSUP) return nr_error("%s: not a regular file; refusing to replace it with a checkpoint", path);
    return nr_error("writing %s: %s", path, strerror(errno));
  }
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  int ok = fwrite(len, 1, 8, out.f) == 8 && fwrite(header, 1, hlen, out.f) == hlen;
  for (int i = 0; ok && i < n; i++) ok = fwrite(tensors[i].data, 1, tensors[i].nbytes, out.f) == tensors[i].nbytes;
  free(header);
  if (!ok) {
    int e = errno ? errno : EIO;
    nv_out_discard(&out);
    return nr_error("writing %s: %s", path, strerror(e));
  }
  if (nv_out_close(&out)) return nr_error("writing %s: %s", path, strerror(errno));
  return 0;
}
