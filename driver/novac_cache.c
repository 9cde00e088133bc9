/* novac_cache.c: the compile cache.
 *
 * An entry is a folder DIR/KEY holding step.so, step.json (the manifest)
 * and meta: the parts of the key and each file's size and checksum.  KEY
 * hashes the parts (nc_key_make): novac's version, its ABI version and
 * build (the executable's and the runtime library's size and time); the
 * graph as loaded (cg_graph_hash: ops, shapes, dtypes, attributes, names,
 * initializer kinds); the initializer data (ONNX initializers, the files
 * of .nova file() parameters); the options that change the output; the
 * device model (every field; on the cpu target also the host CPU's name
 * and features, which the code is compiled for); the precision policy
 * file.  A hit checks the files against meta (a corrupt entry is removed
 * with a warning, and the step rebuilt) and copies them to the outputs
 * (the manifest's "source" made the input's name).
 *
 * Entries are written whole into DIR/.tmp.XXXXXX and renamed to DIR/KEY:
 * a reader never sees a partial entry, and of two novac processes storing
 * the same key the second's rename fails and its copy is dropped.  After a
 * store, entries beyond --cache-max go, least recently used first (a hit
 * touches its folder), and temporaries a killed novac left (an hour old)
 * are removed.  A cache folder that cannot be written is warned
 * about once; the compile goes on without it.
 *
 * New initializer data alone (the same model and flags, other weights) is
 * no compile either: an entry also records where its step.so holds its
 * init.bin and each tensor's place in it (the file "init"); a lookup that
 * finds no entry for its key but one that differs from it only in the
 * initializer data writes that entry's step.so with the new values in
 * those places (each tensor found by name in the new graph, with the same
 * dtype and size, else it is a miss), its manifest with the new checksum,
 * and stores the result under the new key. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../codegen/codegen.h"
#include "../include/nova/step.h"
#include "../support/util.h"
#include "novac_cache.h"

static const char *const part_names[NC_PARTS] = {"novac (version and build)", "graph", "initializer data",
                                                 "options", "device", "precision policy"};
static const char *const files[2] = {"step.so", "step.json"};

/* A 64-bit hash of LEN bytes from H, eight at a time (a checksum and a
 * key, not a defence against collisions made on purpose). */
static uint64_t mix(uint64_t h, const void *p, size_t n) {
  const unsigned char *q = p;
  for (; n >= 8; q += 8, n -= 8) {
    uint64_t w;
    memcpy(&w, q, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 31;
  }
  for (; n; q++, n--) h = (h ^ *q) * 0x100000001b3ull;
  return h;
}

static uint64_t mix_str(uint64_t h, const char *s) { return mix(h, s ? s : "", s ? strlen(s) + 1 : 1); }

/* The whole of file PATH into H (its name and "unreadable" where it cannot
 * be read: the compile then reports it). */
static uint64_t mix_file(uint64_t h, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return mix_str(mix_str(h, path), "unreadable");
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = mix(h, buf, n);
  fclose(f);
  return h;
}

static uint64_t mix_stat(uint64_t h, const char *path) {
  struct stat st;
  if (stat(path, &st)) return mix_str(h, "absent");
  int64_t v[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
  return mix(h, v, sizeof v);
}

void nc_key_make(nc_key *k, const nv_graph *g, const char *options, const cfg_device *dev, bool cuda,
                 const char *cpu, const char *policy) {
  memset(k, 0, sizeof *k);
  const uint64_t seed = NV_FNV_INIT;
  /* novac itself: a rebuilt novac or runtime makes other steps */
  uint64_t h = mix_str(seed, NOVAC_VERSION);
  int abi = NOVA_STEP_ABI_VERSION;
  h = mix(h, &abi, sizeof abi);
  char exe[PATH_MAX], rt[PATH_MAX + 40];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  h = mix_stat(h, exe);
  char *slash = strrchr(exe, '/');
  if (slash) *slash = 0;
  snprintf(rt, sizeof rt, "%s/../lib/novac/libnovart.a", exe);
  k->part[NC_NOVAC] = mix_stat(h, rt);
  char gh[17];
  cg_graph_hash(g, gh);
  k->part[NC_GRAPH] = mix_str(seed, gh);
  h = seed;
  for (int i = 0; i < g->nnodes; i++) {
    const nv_node *x = g->nodes[i];
    if (x->init.kind == NV_INIT_DATA && x->init.data)
      h = mix(h, x->init.data, (size_t)fe_numel(x) * fe_dtype_size(x->dtype));
    else if (x->init.kind == NV_INIT_FILE && x->init.path)
      h = mix_file(h, x->init.path);
  }
  k->part[NC_DATA] = h;
  k->part[NC_OPTIONS] = mix_str(seed, options);
  char d[1024];
  snprintf(d, sizeof d,
           "%s %d | %d %d %d %d %d %d %lld %lld %lld %d.%d %d%d%d%d %lld | %lld %.6g %.6g %.6g %.6g %.6g | %d %d %d "
           "%lld %lld %d %d",
           dev->name, (int)dev->kind, dev->sm_count, dev->max_threads_per_block, dev->max_threads_per_sm,
           dev->max_blocks_per_sm, dev->regs_per_sm, dev->max_regs_per_thread, (long long)dev->smem_per_sm,
           (long long)dev->smem_per_block, (long long)dev->smem_per_block_optin, dev->cc_major, dev->cc_minor,
           dev->has_mma_sync_f16, dev->has_mma_sync_bf16, dev->has_mma_sync_tf32, dev->has_wgmma,
           (long long)dev->total_mem_bytes, (long long)dev->l2_bytes, dev->mem_bw_gbs, dev->peak_tflops_fp32,
           dev->peak_tflops_tf32, dev->peak_tflops_fp16, dev->peak_tflops_bf16, dev->cores, dev->vector_bits,
           dev->vector_regs, (long long)dev->l1d_bytes, (long long)dev->l3_bytes, dev->fma_units, dev->has_bf16_dot);
  h = mix_str(mix_str(seed, d), cuda ? "cuda" : "cpu");
  if (!cuda || !cpu || !strcmp(cpu, "host")) { /* the host's CPU: what the step's code is compiled for */
    char *name = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
    h = mix_str(mix_str(h, name), feat);
    LLVMDisposeMessage(name);
    LLVMDisposeMessage(feat);
  }
  k->part[NC_DEVICE] = mix_str(h, cpu);
  k->part[NC_POLICY] = policy ? mix_file(mix_str(seed, "policy"), policy) : seed;
  h = seed;
  for (int i = 0; i < NC_PARTS; i++) h = mix(h, &k->part[i], sizeof k->part[i]);
  snprintf(k->hex, sizeof k->hex, "%016llx", (unsigned long long)h);
}

/* ---- entries ---- */

typedef struct meta {
  uint64_t part[NC_PARTS];
  int64_t size[2];
  uint64_t sum[2];
} meta;

static bool read_meta(const char *entry, meta *m) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/meta", entry);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  int version = 0;
  bool ok = fscanf(f, "novac-cache %d\n", &version) == 1 && version == 1;
  for (int i = 0; ok && i < NC_PARTS; i++) {
    unsigned long long v;
    int idx;
    ok = fscanf(f, "part %d %llx\n", &idx, &v) == 2 && idx == i;
    m->part[i] = v;
  }
  for (int i = 0; ok && i < 2; i++) {
    char name[32];
    long long sz;
    unsigned long long s;
    ok = fscanf(f, "file %31s %lld %llx\n", name, &sz, &s) == 3 && !strcmp(name, files[i]) && sz >= 0;
    m->size[i] = sz, m->sum[i] = s;
  }
  fclose(f);
  return ok;
}

static void remove_entry(const char *entry) {
  char path[PATH_MAX + 32];
  DIR *d = opendir(entry);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", entry, e->d_name);
    unlink(path);
  }
  if (d) closedir(d);
  rmdir(entry);
}

/* The entry whose parts agree most with K's (ties: the newest), for
 * --explain-cache: which parts differ. */
static void explain_miss(nc_cache *c, const nc_key *k) {
  DIR *d = opendir(c->dir);
  int best = -1;
  time_t best_time = 0;
  char best_name[64] = "";
  uint64_t best_parts[NC_PARTS];
  for (struct dirent *e; d && (e = readdir(d));) {
    if (strlen(e->d_name) != 16 || strspn(e->d_name, "0123456789abcdef") != 16) continue;
    char entry[PATH_MAX];
    snprintf(entry, sizeof entry, "%s/%s", c->dir, e->d_name);
    meta m;
    struct stat st;
    if (!read_meta(entry, &m) || stat(entry, &st)) continue;
    int same = 0;
    for (int i = 0; i < NC_PARTS; i++) same += m.part[i] == k->part[i];
    if (same > best || (same == best && st.st_mtime > best_time)) {
      best = same, best_time = st.st_mtime;
      snprintf(best_name, sizeof best_name, "%s", e->d_name);
      memcpy(best_parts, m.part, sizeof best_parts);
    }
  }
  if (d) closedir(d);
  if (best < 0) {
    fprintf(stderr, "novac: cache miss (%s): %s holds no entry\n", k->hex, c->dir);
    return;
  }
  fprintf(stderr, "novac: cache miss (%s): the closest entry, %s, differs in", k->hex, best_name);
  const char *sep = " ";
  for (int i = 0; i < NC_PARTS; i++)
    if (best_parts[i] != k->part[i]) {
      fprintf(stderr, "%s%s", sep, part_names[i]);
      sep = ", ";
    }
  if (best == NC_PARTS) fprintf(stderr, " nothing (a key collision)");
  fprintf(stderr, "\n");
}

/* The manifest TEXT (LEN bytes, as novac wrote it: "source" among its
 * first keys) with "source" set to SOURCE, the string escaped as JSON. */
static char *with_source(const char *text, size_t len, const char *source) {
  const char *key = strstr(text, "\"source\":");
  const char *q = key ? strchr(key + 9, '"') : NULL, *end = q;
  while (end && *++end && *end != '"')
    if (*end == '\\' && end[1]) end++;
  if (!q || !end || !*end) return NULL;
  nv_sbuf b = {0};
  nv_sb_printf(&b, "%.*s\"", (int)(q - text), text);
  for (const unsigned char *p = (const unsigned char *)(source ? source : ""); *p; p++) {
    if (*p == '"' || *p == '\\') nv_sb_printf(&b, "\\%c", *p);
    else if (*p < 0x20) nv_sb_printf(&b, "\\u%04x", *p);
    else nv_sb_printf(&b, "%c", *p);
  }
  nv_sb_printf(&b, "%.*s", (int)(len - (size_t)(end - text)), end);
  if (b.oom) {
    nv_sb_free(&b);
    return NULL;
  }
  return b.s;
}

/* ENTRY's step.so and manifest into BYTES (owned; LEN bytes each), checked
 * against M; false (*WHY, may be NULL, says which failed) if one is not. */
static bool read_files(const char *entry, const meta *m, char *bytes[2], size_t len[2], const char **why) {
  char path[PATH_MAX + 16];
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/%s", entry, files[i]);
    bytes[i] = nv_read_file(path, &len[i], (size_t)8 << 30);
    if (!bytes[i] || (int64_t)len[i] != m->size[i] || mix(NV_FNV_INIT, bytes[i], len[i]) != m->sum[i]) {
      if (why) *why = i ? "its manifest fails its checksum" : "its step.so fails its checksum";
      return false;
    }
  }
  return true;
}

/* ---- new initializer data into a cached step ---- */

/* ENTRY's init layout: where its step.so holds init.bin (*AT, *SIZE) and
 * each tensor's slot (*SLOTS, owned, names owned: free with free_slots). */
typedef struct slot {
  char *name;
  int dtype;
  int64_t offset, bytes;
} slot;

static void free_slots(slot *v, int n) {
  for (int i = 0; v && i < n; i++) free(v[i].name);
  free(v);
}

static slot *read_init(const char *entry, int64_t *at, int64_t *size, int *n) {
  char path[PATH_MAX + 16], line[4096];
  snprintf(path, sizeof path, "%s/init", entry);
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  slot *v = NULL;
  int cap = 0;
  long long a, b;
  bool ok = fgets(line, sizeof line, f) && !strcmp(line, "novac-init 1\n") && fgets(line, sizeof line, f) &&
            sscanf(line, "at %lld %lld", &a, &b) == 2 && a >= 0 && b > 0;
  *at = a, *size = b, *n = 0;
  while (ok && fgets(line, sizeof line, f)) {
    long long off, by;
    int dt, used = 0;
    size_t len = strlen(line);
    ok = len && line[len - 1] == '\n' && sscanf(line, "slot %d %lld %lld %n", &dt, &off, &by, &used) == 3 && used &&
         off >= 0 && by >= 0 && off + by <= *size;
    if (!ok) break;
    if (*n == cap) {
      slot *v2 = nv_xrealloc(v, sizeof *v2 * (size_t)(cap = cap ? 2 * cap : 16));
      if (!v2) {
        ok = false;
        break;
      }
      v = v2;
    }
    line[len - 1] = 0;
    v[*n] = (slot){nv_xstrdup(line + used), dt, off, by};
    ok = v[*n].name != NULL;
    (*n)++;
  }
  fclose(f);
  if (!ok) {
    free_slots(v, *n);
    return NULL;
  }
  return v;
}

/* The entry (into ENTRY) that differs from K in the initializer data
 * alone, and has an init layout; false if none. */
static bool data_only_entry(nc_cache *c, const nc_key *k, char *entry, size_t n) {
  DIR *d = opendir(c->dir);
  bool found = false;
  for (struct dirent *e; d && !found && (e = readdir(d));) {
    if (strlen(e->d_name) != 16 || strspn(e->d_name, "0123456789abcdef") != 16) continue;
    snprintf(entry, n, "%s/%s", c->dir, e->d_name);
    meta m;
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/init", entry);
    found = read_meta(entry, &m) && !access(p, R_OK);
    for (int i = 0; found && i < NC_PARTS; i++) found = i == NC_DATA ? m.part[i] != k->part[i] : m.part[i] == k->part[i];
  }
  if (d) closedir(d);
  return found;
}

/* The manifest TEXT with its step_so checksum set to SUM (the size is the
 * same); NULL if it has none. */
static char *with_checksum(const char *text, uint64_t sum) {
  const char *q = strstr(text, "\"fnv1a64\":");
  if (!q) return NULL;
  q += 10;
  q += strspn(q, " \t");
  if (*q != '"' || strspn(q + 1, "0123456789abcdef") != 16 || q[17] != '"') return NULL;
  char *out = nv_xstrdup(text);
  if (!out) return NULL;
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sum);
  memcpy(out + (q + 1 - text), hex, 16);
  return out;
}

/* The step.so of ENTRY with G's initializer data (BYTES[0..LEN)) in place
 * of its own: 0, or -1 when G's tensors do not fit its layout (a miss). */
static int reembed(const char *entry, const nv_graph *g, char *bytes, size_t len) {
  int64_t at, size;
  int n;
  slot *v = read_init(entry, &at, &size, &n);
  if (!v || at + size > (int64_t)len) {
    free_slots(v, n);
    return -1;
  }
  nv_diag *quiet = nv_diag_create(NULL);
  int rc = quiet ? 0 : -1;
  for (int i = 0; !rc && i < n; i++) {
    const nv_node *x = NULL;
    for (int j = 0; j < g->nnodes && !x; j++) {
      const nv_node *y = g->nodes[j];
      if ((y->op == NV_OP_PARAM || (y->op == NV_OP_INPUT && y->has_default)) && y->name && !strcmp(y->name, v[i].name))
        x = y;
    }
    rc = x && fe_init_is_bytes(x) && (int)x->dtype == v[i].dtype &&
         fe_numel(x) * (int64_t)fe_dtype_size(x->dtype) == v[i].bytes ? 0 : -1;
    if (!rc) rc = fe_init_fill(g, quiet, x, bytes + at + v[i].offset);
  }
  nv_diag_destroy(quiet);
  free_slots(v, n);
  return rc;
}

/* The step.so BYTES[0..LEN) changed: its GNU build ID (the linker's hash
 * of what it wrote) made a hash of its new contents, so that two steps
 * with different values never share one.  (A step's build ID is then not
 * the linker's SHA-1 of it, the one difference from a fresh compile.) */
static void new_build_id(unsigned char *b, size_t len) {
  if (len < 64 || memcmp(b, "\177ELF", 4) || b[4] != 2 || b[5] != 1) return; /* ELF64, little-endian */
  uint64_t phoff;
  uint16_t phentsize, phnum;
  memcpy(&phoff, b + 32, 8);
  memcpy(&phentsize, b + 54, 2);
  memcpy(&phnum, b + 56, 2);
  for (uint16_t i = 0; i < phnum && phentsize >= 56 && phoff + (uint64_t)(i + 1) * phentsize <= len; i++) {
    const unsigned char *ph = b + phoff + (uint64_t)i * phentsize;
    uint32_t type;
    uint64_t off, size;
    memcpy(&type, ph, 4);
    memcpy(&off, ph + 8, 8);
    memcpy(&size, ph + 32, 8);
    if (type != 4 /* PT_NOTE */ || off > len || size > len - off) continue;
    for (uint64_t p = off; p + 12 <= off + size;) {
      uint32_t namesz, descsz, ntype;
      memcpy(&namesz, b + p, 4);
      memcpy(&descsz, b + p + 4, 4);
      memcpy(&ntype, b + p + 8, 4);
      uint64_t desc = p + 12 + ((namesz + 3u) & ~3u), next = desc + ((descsz + 3u) & ~3u);
      if (next > off + size) break;
      if (ntype == 3 /* NT_GNU_BUILD_ID */ && namesz == 4 && !memcmp(b + p + 12, "GNU", 4)) {
        memset(b + desc, 0, descsz);
        uint64_t h = mix(NV_FNV_INIT, b, len);
        for (uint32_t k = 0; k < descsz; k += 8) {
          uint64_t w = mix(h, &k, sizeof k);
          memcpy(b + desc + k, &w, descsz - k < 8 ? descsz - k : 8);
        }
        return;
      }
      p = next;
    }
  }
}

static void store_entry(nc_cache *c, const nc_key *k, const char *const bytes[2], const size_t len[2],
                        const char *init);

/* A lookup that found no entry for K: one that differs only in the
 * initializer data, with G's put into its step.so (1), or none (0). */
static int lookup_data_only(nc_cache *c, const nc_key *k, const nv_graph *g, const char *so, const char *manifest,
                            const char *source) {
  char entry[PATH_MAX], path[PATH_MAX + 16];
  if (!g || !data_only_entry(c, k, entry, sizeof entry)) return 0;
  meta m;
  char *bytes[2] = {NULL, NULL}, *man = NULL, *named = NULL, *init = NULL;
  size_t len[2] = {0, 0}, ilen = 0;
  bool ok = read_meta(entry, &m) && read_files(entry, &m, bytes, len, NULL);
  snprintf(path, sizeof path, "%s/init", entry);
  ok = ok && (init = nv_read_file(path, &ilen, (size_t)64 << 20)) && !reembed(entry, g, bytes[0], len[0]);
  if (ok) new_build_id((unsigned char *)bytes[0], len[0]);
  ok = ok && (man = with_checksum(bytes[1], nv_fnv1a64(NV_FNV_INIT, bytes[0], len[0])));
  int rc = 0;
  if (ok) {
    len[1] = strlen(man);
    named = with_source(man, len[1], source);
    if (nv_write_file(so, bytes[0], len[0], 0)) {
      nv_error_plain(c->d, "writing %s from the compile cache: %s", so, strerror(errno));
      rc = -1;
    } else if (!named || nv_write_file(manifest, named, strlen(named), 0)) {
      nv_error_plain(c->d, "writing %s from the compile cache: %s", manifest, named ? strerror(errno) : "out of memory");
      unlink(so);
      rc = -1;
    } else {
      const char *b[2] = {bytes[0], man};
      store_entry(c, k, b, len, init);
      if (c->explain)
        fprintf(stderr, "novac: cache hit (%s) with new initializer data, put into %s's step\n", k->hex, entry);
      rc = 1;
    }
  }
  free(bytes[0]), free(bytes[1]), free(man), free(named), free(init);
  return rc;
}

int nc_lookup(nc_cache *c, const nc_key *k, const nv_graph *g, const char *so, const char *manifest,
              const char *source) {
  if (!c->dir) return 0;
  char entry[PATH_MAX];
  snprintf(entry, sizeof entry, "%s/%s", c->dir, k->hex);
  meta m;
  struct stat st;
  if (stat(entry, &st)) {
    int hit = lookup_data_only(c, k, g, so, manifest, source);
    if (!hit && c->explain) explain_miss(c, k);
    return hit;
  }
  bool ok = read_meta(entry, &m) && !memcmp(m.part, k->part, sizeof m.part);
  const char *why = ok ? NULL : "its description is unreadable or does not match";
  char *bytes[2] = {NULL, NULL};
  size_t len[2] = {0, 0};
  ok = ok && read_files(entry, &m, bytes, len, &why); /* each file read once: checked, then copied */
  if (!ok) {
    nv_warning(c->d, (nv_loc){0}, "the compile cache's entry %s is corrupt (%s): removed, the step is rebuilt", entry,
               why);
    remove_entry(entry);
    free(bytes[0]), free(bytes[1]);
    return 0;
  }
  char *man = with_source(bytes[1], len[1], source);
  int rc = 0;
  if (nv_write_file(so, bytes[0], len[0], 0)) {
    nv_error_plain(c->d, "writing %s from the compile cache: %s", so, strerror(errno));
    rc = -1;
  } else if (!man || nv_write_file(manifest, man, strlen(man), 0)) {
    nv_error_plain(c->d, "writing %s from the compile cache: %s", manifest, man ? strerror(errno) : "out of memory");
    unlink(so);
    rc = -1;
  }
  free(man);
  free(bytes[0]), free(bytes[1]);
  if (rc) return -1;
  utimensat(AT_FDCWD, entry, NULL, 0); /* recently used */
  if (c->explain) fprintf(stderr, "novac: cache hit (%s): %s\n", k->hex, entry);
  return 1;
}

static void warn_once(nc_cache *c, const char *what) {
  if (c->warned) return;
  c->warned = true;
  nv_warning(c->d, (nv_loc){0}, "the compile cache %s cannot be written (%s: %s); compiling without it", c->dir, what,
                   strerror(errno));
}

/* Entries by age, removed from the oldest while the cache exceeds its cap
 * (KEEP, just stored, stays). */
typedef struct aged {
  char name[17];
  time_t when;
  int64_t bytes;
} aged;

static int by_age(const void *a, const void *b) {
  const aged *x = a, *y = b;
  return x->when < y->when ? -1 : x->when > y->when;
}

static void trim(nc_cache *c, const char *keep) {
  DIR *d = opendir(c->dir);
  if (!d) return;
  aged *v = NULL;
  int n = 0, cap = 0;
  int64_t total = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (strlen(e->d_name) != 16 || strspn(e->d_name, "0123456789abcdef") != 16) continue;
    char entry[PATH_MAX];
    snprintf(entry, sizeof entry, "%s/%s", c->dir, e->d_name);
    meta m;
    struct stat st;
    if (stat(entry, &st) || !read_meta(entry, &m)) continue;
    if (n == cap) {
      aged *v2 = nv_xrealloc(v, sizeof *v2 * (size_t)(cap = cap ? 2 * cap : 64));
      if (!v2) break;
      v = v2;
    }
    snprintf(v[n].name, sizeof v[n].name, "%s", e->d_name);
    v[n].when = st.st_mtime;
    v[n].bytes = m.size[0] + m.size[1];
    total += v[n++].bytes;
  }
  closedir(d);
  if (v) qsort(v, (size_t)n, sizeof *v, by_age);
  for (int i = 0; i < n && total > c->max_bytes; i++) {
    if (!strcmp(v[i].name, keep)) continue;
    char entry[PATH_MAX];
    snprintf(entry, sizeof entry, "%s/%s", c->dir, v[i].name);
    remove_entry(entry);
    total -= v[i].bytes;
  }
  free(v);
}

/* Removes the temporary folders a novac killed while storing left (an
 * hour old: no store takes that long). */
static void sweep_temporaries(const char *dir) {
  DIR *d = opendir(dir);
  time_t now = time(NULL);
  for (struct dirent *e; d && (e = readdir(d));) {
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (!strncmp(e->d_name, ".tmp.", 5) && !stat(path, &st) && S_ISDIR(st.st_mode) && now - st.st_mtime > 3600)
      remove_entry(path);
  }
  if (d) closedir(d);
}

/* The init layout of the step.so BYTES[0..LEN) of G (the graph it was
 * built from, after the passes): owned text, or NULL where it has no
 * initial bytes or they cannot be found in it once. */
/* The file offset in the ELF64 shared object B[0..LEN) of the bytes its
 * symbol NAME (in .symtab: the step's hidden nova_init_data) stands for;
 * -1 if it has none. */
static int64_t elf_symbol_offset(const unsigned char *b, size_t len, const char *name) {
  if (len < 64 || memcmp(b, "\177ELF", 4) || b[4] != 2 || b[5] != 1) return -1;
  uint64_t shoff;
  uint16_t shentsize, shnum;
  memcpy(&shoff, b + 40, 8);
  memcpy(&shentsize, b + 58, 2);
  memcpy(&shnum, b + 60, 2);
  if (shentsize < 64 || shoff > len || (uint64_t)shnum * shentsize > len - shoff) return -1;
#define SH(i, field, size) (memcpy(&v, b + shoff + (uint64_t)(i) * shentsize + (field), size), v)
  for (uint16_t i = 0; i < shnum; i++) {
    uint64_t v = 0;
    if ((uint32_t)SH(i, 4, 4) != 2 /* SHT_SYMTAB */) continue;
    uint64_t off = SH(i, 24, 8), size = SH(i, 32, 8), link = (uint32_t)SH(i, 40, 4);
    if (link >= shnum || off > len || size > len - off) return -1;
    uint64_t stroff = SH(link, 24, 8), strsize = SH(link, 32, 8);
    if (stroff > len || strsize > len - stroff) return -1;
    for (uint64_t p = off; p + 24 <= off + size; p += 24) {
      uint32_t st_name;
      uint16_t shndx;
      uint64_t value;
      memcpy(&st_name, b + p, 4);
      memcpy(&shndx, b + p + 6, 2);
      memcpy(&value, b + p + 8, 8);
      if (st_name >= strsize || strncmp((const char *)b + stroff + st_name, name, strsize - st_name) ||
          shndx == 0 || shndx >= shnum)
        continue;
      uint64_t addr = SH(shndx, 16, 8), soff = SH(shndx, 24, 8);
      return value >= addr && soff + (value - addr) <= len ? (int64_t)(soff + (value - addr)) : -1;
    }
  }
#undef SH
  return -1;
}

/* The init layout of the step.so BYTES[0..LEN) of G (the graph it was
 * built from, after the passes): owned text, or NULL where it embeds no
 * initial values or they cannot be found in it. */
static char *init_layout(const nv_graph *g, const char *bytes, size_t len) {
  cg_init_slot *slots;
  int n;
  int64_t size;
  if (!g || cg_init_layout(g, &slots, &n, &size)) return NULL;
  int64_t at = size > 0 ? elf_symbol_offset((const unsigned char *)bytes, len, "nova_init_data") : -1;
  nv_sbuf b = {0};
  bool ok = at >= 0 && at + size <= (int64_t)len;
  if (ok) {
    nv_sb_printf(&b, "novac-init 1\nat %lld %lld\n", (long long)at, (long long)size);
    for (int i = 0; i < n; i++)
      if (!strchr(slots[i].name, '\n'))
        nv_sb_printf(&b, "slot %d %lld %lld %s\n", (int)slots[i].dtype, (long long)slots[i].offset,
                     (long long)slots[i].bytes, slots[i].name);
  }
  free(slots);
  if (!ok || b.oom) {
    nv_sb_free(&b);
    return NULL;
  }
  return b.s;
}

void nc_store(nc_cache *c, const nc_key *k, const char *so, const char *manifest, const nv_graph *g) {
  if (!c->dir) return;
  char *bytes[2];
  size_t len[2] = {0, 0};
  bytes[0] = nv_read_file(so, &len[0], (size_t)8 << 30);
  bytes[1] = nv_read_file(manifest, &len[1], (size_t)8 << 30);
  char *init = bytes[0] ? init_layout(g, bytes[0], len[0]) : NULL;
  if (bytes[0] && bytes[1]) store_entry(c, k, (const char *const *)bytes, len, init);
  else warn_once(c, "writing an entry");
  free(bytes[0]), free(bytes[1]), free(init);
}

/* Stores K's entry: the step.so and manifest BYTES[i] (LEN[i] bytes), and
 * INIT (may be NULL). */
static void store_entry(nc_cache *c, const nc_key *k, const char *const bytes[2], const size_t len[2],
                        const char *init) {
  if (mkdir(c->dir, 0777) && errno != EEXIST) {
    warn_once(c, "creating it");
    return;
  }
  sweep_temporaries(c->dir);
  char tmp[PATH_MAX], path[PATH_MAX + 16], entry[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s/.tmp.XXXXXX", c->dir);
  if (!mkdtemp(tmp)) {
    warn_once(c, "a new entry");
    return;
  }
  meta m;
  memcpy(m.part, k->part, sizeof m.part);
  bool ok = true;
  for (int i = 0; ok && i < 2; i++) {
    snprintf(path, sizeof path, "%s/%s", tmp, files[i]);
    ok = nv_write_file(path, bytes[i], len[i], 0) == 0;
    m.size[i] = (int64_t)len[i];
    m.sum[i] = mix(NV_FNV_INIT, bytes[i], len[i]);
  }
  if (ok && init) {
    snprintf(path, sizeof path, "%s/init", tmp);
    ok = nv_write_file(path, init, strlen(init), 0) == 0;
  }
  nv_sbuf b = {0};
  nv_sb_printf(&b, "novac-cache 1\n");
  for (int i = 0; i < NC_PARTS; i++) nv_sb_printf(&b, "part %d %016llx\n", i, (unsigned long long)m.part[i]);
  for (int i = 0; i < 2; i++)
    nv_sb_printf(&b, "file %s %lld %016llx\n", files[i], (long long)m.size[i], (unsigned long long)m.sum[i]);
  snprintf(path, sizeof path, "%s/meta", tmp);
  ok = ok && !b.oom && nv_write_file(path, b.s, strlen(b.s), 0) == 0;
  nv_sb_free(&b);
  snprintf(entry, sizeof entry, "%s/%s", c->dir, k->hex);
  if (!ok) {
    warn_once(c, "writing an entry");
    remove_entry(tmp);
    return;
  }
  if (rename(tmp, entry)) { /* stored meanwhile by another novac (or a stale entry: replaced) */
    if (errno == EEXIST || errno == ENOTEMPTY) {
      meta old;
      if (!read_meta(entry, &old)) {
        remove_entry(entry);
        if (!rename(tmp, entry)) goto stored;
      }
    } else {
      warn_once(c, "renaming an entry");
    }
    remove_entry(tmp);
    return;
  }
stored:
  if (c->max_bytes > 0) trim(c, k->hex);
}
