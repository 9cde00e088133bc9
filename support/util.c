/* util.c: growable strings, whole-file reading, name patterns, durable
 * output, temporary paths removed on every exit. */
#include "util.h"

#include <ctype.h>
#include <sched.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- parallel work -------------------------------------------------------- */

int nv_jobs(void) {
  const char *e = getenv("NOVAC_JOBS");
  long n = 0;
  if (e && *e) n = strtol(e, NULL, 10);
  else {
    cpu_set_t set;
    n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
  }
  return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

/* ---- the files a compile reads -------------------------------------------- */

static char **g_deps;
static int g_ndeps;

void nv_dep_note(const char *path) {
  while (path[0] == '.' && path[1] == '/' && path[2]) path += 2; /* "./data" as "data", as make names it */
  for (int i = 0; i < g_ndeps; i++)
    if (!strcmp(g_deps[i], path)) return;
  char **d = nv_xrealloc(g_deps, (size_t)(g_ndeps + 1) * sizeof *d);
  char *copy = nv_xstrdup(path);
  if (!d || !copy) { /* (novac makes running out of memory fatal: never a short list there) */
    if (d) g_deps = d;
    free(copy);
    return;
  }
  g_deps = d;
  g_deps[g_ndeps++] = copy;
}

const char *const *nv_deps(int *n) {
  *n = g_ndeps;
  return (const char *const *)g_deps;
}

/* ---- allocation that cannot fail ------------------------------------------ */

static bool oom_fatal;

void nv_oom_set_fatal(void) { oom_fatal = true; }
bool nv_oom_is_fatal(void) { return oom_fatal; }

static void temp_rm_all(void);

void nv_oom_die(size_t n) {
  char msg[160];
  int len = snprintf(msg, sizeof msg, "%s: error: out of memory (allocating %zu bytes)\n",
                     program_invocation_short_name, n);
  if (len > 0 && write(2, msg, (size_t)len) < 0) { /* nothing more to say */
  }
  temp_rm_all(); /* the process that made them; a forked worker removes nothing */
  _exit(1);
}

void *nv_xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p && n) nv_oom_die(n);
  return p;
}

void *nv_xcalloc(size_t n, size_t size) {
  void *p = calloc(n, size);
  if (!p && n && size) nv_oom_die(n * size);
  return p;
}

void *nv_xrealloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (!q && n) nv_oom_die(n);
  return q;
}

char *nv_xstrdup(const char *s) {
  char *d = strdup(s);
  if (!d) nv_oom_die(strlen(s) + 1);
  return d;
}

char *nv_xstrndup(const char *s, size_t n) {
  char *d = strndup(s, n);
  if (!d) nv_oom_die(n + 1);
  return d;
}

void nv_sb_vprintf(nv_sbuf *b, const char *fmt, va_list ap) {
  if (b->oom) return;
  for (;;) {
    va_list aq;
    va_copy(aq, ap);
    size_t room = b->s ? b->cap - b->len : 0;
    int n = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, aq);
    va_end(aq);
    if (n < 0) return;
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = (b->cap + (size_t)n + 1) * 2;
    char *p = realloc(b->s, cap);
    if (!p && oom_fatal) nv_oom_die(cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->s = p;
    b->cap = cap;
  }
}

void nv_sb_printf(nv_sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  nv_sb_vprintf(b, fmt, ap);
  va_end(ap);
}

void nv_sb_free(nv_sbuf *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}

char *nv_read_file(const char *path, size_t *len, size_t max_bytes) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (n > max_bytes) {
      free(buf);
      fclose(f);
      errno = EFBIG;
      return NULL;
    }
    if (got == 0) break;
    if (n == cap) {
      char *p = realloc(buf, 2 * cap + 1);
      if (!p) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = p;
      cap *= 2;
    }
  }
  int err = ferror(f);
  fclose(f);
  if (!buf) {
    errno = ENOMEM;
    return NULL;
  }
  if (err) {
    free(buf);
    errno = EIO;
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

bool nv_number_token(const char *v) {
  return v && *v && *v != '+' && !isspace((unsigned char)*v);
}

bool nv_glob_match(const char *globs, const char *name, bool *matched) {
  if (!globs) return false;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", globs);
  bool hit = false;
  int k = 0;
  char *save = NULL;
  for (char *gl = strtok_r(buf, ",", &save); gl && k < NV_MAX_GLOBS; gl = strtok_r(NULL, ",", &save), k++)
    if (fnmatch(gl, name, 0) == 0) hit = matched[k] = true;
  return hit;
}

int nv_glob_count(const char *globs) {
  int n = globs ? 1 : 0;
  for (const char *p = globs; p && *p; p++) n += *p == ',';
  return n < NV_MAX_GLOBS ? n : NV_MAX_GLOBS;
}

/* ---- temporary paths removed on every exit ------------------------------ */

#define NV_MAX_TEMPS 32
static struct {
  volatile sig_atomic_t used;
  int dir;
  char path[4096];
} temps[NV_MAX_TEMPS];
static pid_t temps_owner;

/* Removes the entries of DIR, then DIR: getdents64, unlinkat and rmdir are
 * system calls, safe in a signal handler (opendir/readdir are not). */
static void temp_rm_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = getdents64(fd, buf, sizeof buf)) > 0)
      for (ssize_t off = 0; off < n;) {
        struct dirent64 *e = (struct dirent64 *)(void *)(buf + off);
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(fd, e->d_name, 0);
        off += e->d_reclen;
      }
    close(fd);
  }
  rmdir(dir);
}

static void temp_rm_all(void) {
  if (getpid() != temps_owner) return;
  for (int i = 0; i < NV_MAX_TEMPS; i++)
    if (temps[i].used) {
      if (temps[i].dir) temp_rm_dir(temps[i].path);
      else unlink(temps[i].path);
      temps[i].used = 0;
    }
}

static void temp_on_signal(int sig) {
  temp_rm_all();
  signal(sig, SIG_DFL);
  raise(sig); /* delivered when the handler returns: the default action */
}

void nv_temp_install(void) {
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  temps_owner = getpid();
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
    struct sigaction old, sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = temp_on_signal;
    sigfillset(&sa.sa_mask);
    /* a signal the caller ignores (nohup) stays ignored */
    if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(sigs[i], &sa, NULL);
  }
  atexit(temp_rm_all);
}

int nv_temp_add(const char *path, int is_dir) {
  if (strlen(path) >= sizeof temps[0].path) return -1;
  for (int i = 0; i < NV_MAX_TEMPS; i++)
    if (!temps[i].used) {
      memcpy(temps[i].path, path, strlen(path) + 1);
      temps[i].dir = is_dir;
      temps[i].used = 1; /* last: the handler sees a complete entry */
      return i;
    }
  return -1;
}

void nv_temp_drop(int slot) {
  if (slot >= 0 && slot < NV_MAX_TEMPS) temps[slot].used = 0;
}

void nv_child_dies_with_parent(int parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != (pid_t)parent) _exit(1); /* died before the prctl */
}

/* ---- temporary folders ---------------------------------------------------- */

static const char *tmp_base(void) {
  const char *t = getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

int nv_tempdir_create(char *dir, size_t n, const char *prefix, int *lock) {
  *lock = -1;
  if ((size_t)snprintf(dir, n, "%s/%s.XXXXXX", tmp_base(), prefix) >= n) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (!mkdtemp(dir)) return -1;
  /* the lock is made under another name and renamed: .lock is never seen
     unlocked while its owner lives */
  char tmp[4200], fin[4200];
  snprintf(tmp, sizeof tmp, "%s/.lock.XXXXXX", dir);
  snprintf(fin, sizeof fin, "%s/.lock", dir);
  int fd = mkostemp(tmp, O_CLOEXEC);
  if (fd < 0 || flock(fd, LOCK_EX) || rename(tmp, fin)) {
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    rmdir(dir);
    errno = e;
    return -1;
  }
  *lock = fd;
  return 0;
}

void nv_tempdir_keep(const char *dir, int lock) {
  char p[4200];
  snprintf(p, sizeof p, "%s/.keep", dir);
  int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
  snprintf(p, sizeof p, "%s/.lock", dir);
  unlink(p);
  if (lock >= 0) close(lock);
}

/* Whether NAME is PREFIX.XXXXXX for one of novac's prefixes. */
static bool sweep_name(const char *name) {
  static const char *const prefixes[] = {"novac.", "novac-cg."};
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
    size_t l = strlen(prefixes[i]);
    if (!strncmp(name, prefixes[i], l) && strlen(name + l) == 6) return true;
  }
  return false;
}

/* The folder NAME in BASE (an open folder) when it is stale: ours, a real
 * folder (no symlink followed), and its .lock free (its novac is gone), or
 * no .lock and older than NV_TEMP_GRACE seconds (one being made, or left by
 * a novac killed before it locked).  Removes its files, then it. */
#define NV_TEMP_GRACE 60
static void sweep_one(int base, const char *name) {
  int d = openat(base, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d < 0) return;
  struct stat st;
  if (fstat(d, &st) || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || faccessat(d, ".keep", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
    close(d);
    return;
  }
  int lk = openat(d, ".lock", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  bool stale;
  if (lk >= 0) {
    stale = flock(lk, LOCK_EX | LOCK_NB) == 0; /* held until the files are gone */
  } else
    stale = errno == ENOENT && st.st_mtime + NV_TEMP_GRACE < time(NULL);
  if (stale) {
    DIR *dd = fdopendir(dup(d));
    struct dirent *e;
    while (dd && (e = readdir(dd)))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, ".lock"))
        unlinkat(d, e->d_name, 0); /* a sub-folder is not ours: it stays, and so does NAME */
    if (dd) closedir(dd);
    unlinkat(d, ".lock", 0);
    unlinkat(base, name, AT_REMOVEDIR);
  }
  if (lk >= 0) close(lk);
  close(d);
}

void nv_tempdir_sweep(void) {
  DIR *b = opendir(tmp_base());
  if (!b) return;
  struct dirent *e;
  while ((e = readdir(b)))
    if ((e->d_type == DT_DIR || e->d_type == DT_UNKNOWN) && sweep_name(e->d_name)) sweep_one(dirfd(b), e->d_name);
  closedir(b);
}

/* ---- durable output ------------------------------------------------------ */

uint64_t nv_fnv1a64(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static size_t strmap_slot(const char *const *key, size_t cap, const char *k) {
  size_t i = (size_t)nv_fnv1a64(NV_FNV_INIT, k, strlen(k)) & (cap - 1);
  while (key[i] && strcmp(key[i], k)) i = (i + 1) & (cap - 1);
  return i;
}

int nv_strmap_put(nv_strmap *m, const char *key, int val) {
  if (2 * (m->n + 1) > m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 64;
    const char **nk = nv_xcalloc(cap, sizeof *nk);
    int *nvl = nv_xcalloc(cap, sizeof *nvl);
    if (!nk || !nvl) {
      free(nk);
      free(nvl);
      return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
      if (m->key[i]) {
        size_t j = strmap_slot(nk, cap, m->key[i]);
        nk[j] = m->key[i];
        nvl[j] = m->val[i];
      }
    free(m->key);
    free(m->val);
    m->key = nk;
    m->val = nvl;
    m->cap = cap;
  }
  size_t i = strmap_slot(m->key, m->cap, key);
  if (!m->key[i]) m->n++;
  m->key[i] = key;
  m->val[i] = val;
  return 0;
}

int nv_strmap_get(const nv_strmap *m, const char *key) {
  if (!m->cap) return -1;
  size_t i = strmap_slot(m->key, m->cap, key);
  return m->key[i] ? m->val[i] : -1;
}

void nv_strmap_free(nv_strmap *m) {
  free(m->key);
  free(m->val);
  memset(m, 0, sizeof *m);
}

int nv_file_fnv(const char *path, uint64_t *size, uint64_t *hash) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  unsigned char buf[1 << 16];
  uint64_t h = NV_FNV_INIT, n = 0;
  ssize_t got;
  while ((got = read(fd, buf, sizeof buf)) != 0) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    h = nv_fnv1a64(h, buf, (size_t)got);
    n += (uint64_t)got;
  }
  close(fd);
  *size = n;
  *hash = h;
  return 0;
}

/* The folder of PATH ("." for a bare name) into DIR. */
static void dir_of(const char *path, char *dir, size_t n) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, n, ".");
  else if (slash == path) snprintf(dir, n, "/");
  else snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

/* Removes BASE.tmp.XXXXXX files in DIR that no live writer holds locked. */
static void remove_stale_temps(const char *dir, const char *base) {
  DIR *d = opendir(dir);
  if (!d) return;
  size_t bl = strlen(base);
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *nm = e->d_name;
    if (strncmp(nm, base, bl) || strncmp(nm + bl, ".tmp.", 5) || strlen(nm + bl + 5) != 6) continue;
    int fd = openat(dirfd(d), nm, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) continue;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0)
      unlinkat(dirfd(d), nm, 0);
    close(fd);
  }
  closedir(d);
}

static int out_fail(nv_out *o, int err) {
  if (!o->failed) o->failed = err ? err : EIO;
  return -1;
}

/* A locked temporary beside O->path; 0 or -1 (errno). */
static int out_make_temp(nv_out *o) {
  size_t n = strlen(o->path) + 12;
  o->tmp = malloc(n);
  if (!o->tmp) return -1;
  char dir[4096];
  dir_of(o->path, dir, sizeof dir);
  const char *slash = strrchr(o->path, '/');
  remove_stale_temps(dir, slash ? slash + 1 : o->path);
  for (int tries = 0; tries < 8; tries++) {
    snprintf(o->tmp, n, "%s.tmp.XXXXXX", o->path);
    int fd = mkstemp(o->tmp);
    if (fd < 0) return -1;
    struct stat st;
    /* a cleaner may have taken it between mkstemp and flock: try again */
    if (flock(fd, LOCK_EX) == 0 && fstat(fd, &st) == 0 && st.st_nlink > 0) {
      mode_t mask = umask(0);
      umask(mask);
      (void)fchmod(fd, 0666 & ~mask);
      o->slot = nv_temp_add(o->tmp, 0);
      o->f = fdopen(fd, "wb");
      if (o->f) return 0;
    }
    int e = errno;
    close(fd);
    unlink(o->tmp);
    errno = e;
  }
  return -1;
}

int nv_out_open(nv_out *o, const char *path, unsigned flags) {
  memset(o, 0, sizeof *o);
  o->slot = -1;
  if (!strcmp(path, "-")) {
    o->path = strdup(path);
    o->f = stdout;
    return o->path ? 0 : -1;
  }
  struct stat st;
  int exists = stat(path, &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) {
    errno = EISDIR;
    return -1;
  }
  if (exists && !S_ISREG(st.st_mode) && (flags & NV_OUT_REGULAR)) {
    errno = ENOTSUP;
    return -1;
  }
  o->path = strdup(path);
  if (!o->path) return -1;
  if (exists && !S_ISREG(st.st_mode)) o->f = fopen(path, "wb"); /* a device or FIFO: in place */
  else if (out_make_temp(o)) o->f = NULL;
  if (o->f) return 0;
  int e = errno;
  nv_out_discard(o);
  errno = e;
  return -1;
}

int nv_out_finish(nv_out *o) {
  if (!o->f) return o->failed ? (errno = o->failed, -1) : 0;
  FILE *f = o->f;
  o->f = NULL;
  if (fflush(f) || ferror(f)) out_fail(o, errno);
  if (f == stdout) return o->failed ? (errno = o->failed, -1) : 0;
  /* fsync fails with EINVAL on a device or FIFO written in place */
  if (o->tmp && fsync(fileno(f))) out_fail(o, errno);
  if (fclose(f)) out_fail(o, errno);
  if (o->failed) errno = o->failed;
  return o->failed ? -1 : 0;
}

static void out_free(nv_out *o) {
  nv_temp_drop(o->slot);
  free(o->path);
  free(o->tmp);
  memset(o, 0, sizeof *o);
  o->slot = -1;
}

int nv_sync_dir_of(const char *path) {
  char dir[4096];
  dir_of(path, dir, sizeof dir);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0; /* a folder we may write in but not read: nothing to sync with */
  int rc = fsync(fd), e = errno;
  close(fd);
  /* some file systems refuse fsync on a folder: nothing lost there */
  if (rc && (e == EINVAL || e == ENOTSUP || e == EBADF || e == EROFS)) rc = 0;
  errno = e;
  return rc;
}

int nv_out_rename(nv_out *o) {
  if (o->failed || (o->tmp && rename(o->tmp, o->path))) {
    int e = o->failed ? o->failed : errno;
    nv_out_discard(o);
    errno = e;
    return -1;
  }
  out_free(o);
  return 0;
}

int nv_out_publish(nv_out *o) {
  char *path = o->tmp ? strdup(o->path) : NULL;
  if (o->tmp && !path) {
    nv_out_discard(o);
    errno = ENOMEM;
    return -1;
  }
  int rc = nv_out_rename(o);
  if (!rc && path) rc = nv_sync_dir_of(path);
  int e = errno;
  free(path);
  errno = e;
  return rc;
}

int nv_out_close(nv_out *o) {
  if (nv_out_finish(o)) {
    int e = errno;
    nv_out_discard(o);
    errno = e;
    return -1;
  }
  return nv_out_publish(o);
}

void nv_out_discard(nv_out *o) {
  if (o->f && o->f != stdout) fclose(o->f);
  if (o->tmp) unlink(o->tmp);
  out_free(o);
}

int nv_write_file(const char *path, const void *data, size_t len, unsigned flags) {
  nv_out o;
  if (nv_out_open(&o, path, flags)) return -1;
  if (len && fwrite(data, 1, len, o.f) != len) out_fail(&o, errno);
  return nv_out_close(&o);
}

int nv_close_stdout(void) {
  int bad = fflush(stdout) != 0 || ferror(stdout);
  int e = errno;
  if (fclose(stdout) && !bad) {
    bad = 1;
    e = errno;
  }
  if (bad) errno = e ? e : EIO;
  return bad ? -1 : 0;
}

const char *nv_human_bytes(char *buf, size_t n, int64_t b) {
  if (b >= 10LL << 20)
    snprintf(buf, n, "%lld bytes (%.1f MiB)", (long long)b, (double)b / (1 << 20));
  else
    snprintf(buf, n, "%lld bytes", (long long)b);
  return buf;
}
