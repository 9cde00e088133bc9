/* faultinject.c: an LD_PRELOAD shim that fails the Nth allocation, the Nth
 * write or the Nth fsync of a program (testsuite/faults/run.sh; the rules
 * are in testsuite/faults/README.md).
 *
 *   NV_FAULT_MALLOC=N   (0: count only) the Nth malloc/calloc/realloc/strdup/strndup/
 *                       posix_memalign/aligned_alloc returns NULL (ENOMEM);
 *                       only calls made directly by the objects named in
 *                       NV_FAULT_MALLOC_IN count (comma-separated substrings
 *                       of their file names, "exe" for the program itself;
 *                       default "exe"): C code that checks what it gets, not
 *                       C++ operator new inside LLVM/MLIR, nor functions of
 *                       the program named with a prefix of
 *                       NV_FAULT_MALLOC_SKIP (default "mlir,LLVM,_Z")
 *   NV_FAULT_WRITE=N    the Nth write/pwrite/writev/pwritev, or the Nth
 *                       fwrite/fputs/fputc/putc/fprintf/vfprintf/fflush/fclose
 *                       of a stream, fails (NV_FAULT_ERRNO: ENOSPC or EIO;
 *                       default ENOSPC); a failing stdio call sets the
 *                       stream's error flag, a failing fflush or fclose
 *                       drops the buffered bytes (fclose still closes)
 *   NV_FAULT_FSYNC=N    the Nth fsync/fdatasync fails with EIO
 *   NV_FAULT_MALLOC_AFTER=TEXT  allocations count only once the program
 *                       has opened a path whose absolute form contains TEXT (novac: its
 *                       output folder, the stage that writes the files)
 *   NV_FAULT_STICKY=1   every call from the Nth on fails (a full disk)
 *   NV_FAULT_PATH=DIR   only writes and fsyncs on descriptors opened under
 *                       DIR (open/openat/creat/fopen/freopen/mkstemp...,
 *                       followed through dup and fdopen) count
 *   NV_FAULT_PROGS      comma-separated program names the shim acts in
 *                       (default "novac,novarun"); a compiler or linker
 *                       started by them loads the shim and ignores it
 *   NV_FAULT_TRACE=1    each counted write/fsync, and the failing call with a
 *                       backtrace, on stderr (prefixed "nvfault:"), or
 *                       appended to NV_FAULT_TRACE_FILE
 *   NV_FAULT_REPORT=F   at exit the first process appends to F one line:
 *                       "malloc=A write=W fsync=S hit=H" (H: faults injected)
 *
 * Calls are counted from the shim's constructor on, across fork (the
 * counters live in shared memory), not across exec.  glibc's stdio writes
 * through internal calls that an LD_PRELOAD cannot see, hence the stream
 * functions are intercepted themselves. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

enum { K_MALLOC, K_WRITE, K_FSYNC, K_N };

typedef struct shared {
  volatile unsigned long count[K_N];
  volatile unsigned long hit;
  volatile int started; /* NV_FAULT_MALLOC_AFTER's path was opened */
} shared;

static shared *S;          /* NULL: inactive */
static unsigned long nth[K_N];
static int sticky, werr = ENOSPC, malloc_on, trace;
static char prefix[4096];
static size_t prefix_len;
static char report[4096];
static pid_t root_pid;
static char eligible[1024], malloc_after[1024];

#define MAX_FD 65536
static unsigned char tracked[MAX_FD];
static _Thread_local int busy __attribute__((tls_model("initial-exec"))); /* inside the shim: pass everything through */

/* ---- real functions ------------------------------------------------------ */

#define REAL(ret, name, args)                                  \
  static ret(*real_##name) args;                               \
  static ret(*get_##name(void)) args {                         \
    if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name);   \
    return real_##name;                                        \
  }

REAL(int, open, (const char *, int, ...))
REAL(int, open64, (const char *, int, ...))
REAL(int, openat, (int, const char *, int, ...))
REAL(int, openat64, (int, const char *, int, ...))
REAL(int, creat, (const char *, mode_t))
REAL(int, creat64, (const char *, mode_t))
REAL(FILE *, fopen, (const char *, const char *))
REAL(FILE *, fopen64, (const char *, const char *))
REAL(FILE *, freopen, (const char *, const char *, FILE *))
REAL(int, mkstemp, (char *))
REAL(int, mkostemp, (char *, int))
REAL(int, mkstemps, (char *, int))
REAL(int, mkostemps, (char *, int, int))
REAL(int, close, (int))
REAL(int, dup, (int))
REAL(int, dup2, (int, int))
REAL(int, dup3, (int, int, int))
REAL(ssize_t, write, (int, const void *, size_t))
REAL(ssize_t, pwrite, (int, const void *, size_t, off_t))
REAL(ssize_t, pwrite64, (int, const void *, size_t, off_t))
REAL(ssize_t, writev, (int, const struct iovec *, int))
REAL(ssize_t, pwritev, (int, const struct iovec *, int, off_t))
REAL(int, fsync, (int))
REAL(int, fdatasync, (int))
REAL(size_t, fwrite, (const void *, size_t, size_t, FILE *))
REAL(int, fputs, (const char *, FILE *))
REAL(int, fputc, (int, FILE *))
REAL(int, putc, (int, FILE *))
REAL(int, vfprintf, (FILE *, const char *, va_list))
REAL(int, fflush, (FILE *))
REAL(int, fclose, (FILE *))

/* ---- set-up -------------------------------------------------------------- */

static unsigned long env_ul(const char *name) {
  const char *v = getenv(name);
  return v && *v ? strtoul(v, NULL, 10) : 0;
}

static int in_list(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; p && *p;) {
    const char *e = strchr(p, ',');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == n && !strncmp(p, name, n)) return 1;
    p = e ? e + 1 : NULL;
  }
  return 0;
}

static void write_report(void) {
  if (!S || getpid() != root_pid || !*report) return;
  busy++;
  char line[256];
  int n = snprintf(line, sizeof line, "malloc=%lu write=%lu fsync=%lu hit=%lu\n", S->count[K_MALLOC],
                   S->count[K_WRITE], S->count[K_FSYNC], S->hit);
  int fd = get_open()(report, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    if (get_write()(fd, line, (size_t)n) < 0) { /* nothing to do */
    }
    get_close()(fd);
  }
  busy--;
}

static void read_skips(uintptr_t base);

static int first_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  *(uintptr_t *)data = info->dlpi_addr;
  return 1;
}

/* The load address of the program (the first object dl_iterate_phdr lists). */
static uintptr_t exe_base(void) {
  uintptr_t b = 0;
  dl_iterate_phdr(first_object, &b);
  return b;
}

__attribute__((constructor)) static void fault_init(void) {
  busy++;
  char exe[4096];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  const char *progs = getenv("NV_FAULT_PROGS");
  if (k > 0) {
    exe[k] = 0;
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    if (in_list(progs ? progs : "novac,novarun", base)) {
      void *m = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
      if (m != MAP_FAILED) {
        nth[K_MALLOC] = env_ul("NV_FAULT_MALLOC");
        malloc_on = getenv("NV_FAULT_MALLOC") != NULL;
        nth[K_WRITE] = env_ul("NV_FAULT_WRITE");
        nth[K_FSYNC] = env_ul("NV_FAULT_FSYNC");
        sticky = env_ul("NV_FAULT_STICKY") != 0;
        trace = (int)env_ul("NV_FAULT_TRACE");
        const char *e = getenv("NV_FAULT_ERRNO");
        if (e && !strcmp(e, "EIO")) werr = EIO;
        const char *p = getenv("NV_FAULT_PATH");
        if (p && *p) {
          snprintf(prefix, sizeof prefix, "%s", p);
          prefix_len = strlen(prefix);
          while (prefix_len > 1 && prefix[prefix_len - 1] == '/') prefix[--prefix_len] = 0;
        }
        const char *r = getenv("NV_FAULT_REPORT");
        if (r) snprintf(report, sizeof report, "%s", r);
        const char *in = getenv("NV_FAULT_MALLOC_IN");
        snprintf(eligible, sizeof eligible, "%s", in && *in ? in : "exe");
        const char *after = getenv("NV_FAULT_MALLOC_AFTER");
        if (after) snprintf(malloc_after, sizeof malloc_after, "%s", after);
        root_pid = getpid();
        if (getenv("NV_FAULT_MALLOC")) read_skips(exe_base());
        S = m;
        atexit(write_report);
      }
    }
  }
  busy--;
}

static void trace_call(int k, unsigned long n, int fd, int failing) {
  static const char *const kind[] = {"malloc", "write", "fsync"};
  char path[512] = "", link[64], line[768];
  if (fd >= 0) {
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t l = readlink(link, path, sizeof path - 1);
    path[l > 0 ? l : 0] = 0;
  }
  int len = snprintf(line, sizeof line, "nvfault: [%d] %s #%lu fd %d %s%s\n", (int)getpid(), kind[k], n, fd, path,
                     failing ? " FAILS" : "");
  const char *to = getenv("NV_FAULT_TRACE_FILE");
  int out = to ? get_open()(to, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : 2;
  if (out < 0) return;
  if (get_write()(out, line, (size_t)len) >= 0 && (failing || trace > 1)) {
    void *bt[32];
    backtrace_symbols_fd(bt, backtrace(bt, 32), out);
  }
  if (out != 2) get_close()(out);
}

/* Counts one call of kind K (on FD, or -1); 1 when it is to fail. */
static int fault_fd(int k, int fd) {
  if (!S || busy) return 0;
  unsigned long n = __atomic_add_fetch(&S->count[k], 1, __ATOMIC_SEQ_CST);
  int fails = nth[k] && (sticky ? n >= nth[k] : n == nth[k]);
  if (trace && (fails || k != K_MALLOC)) {
    busy++;
    trace_call(k, n, fd, fails);
    busy--;
  }
  if (fails) __atomic_add_fetch(&S->hit, 1, __ATOMIC_SEQ_CST);
  return fails;
}
#define fault(k) fault_fd(k, -1)

/* ---- which descriptors count --------------------------------------------- */

/* PATH (relative to DIRFD) made absolute into ABS (8192 bytes); 0 or -1. */
static int abs_path(int dirfd, const char *path, char *abs) {
  if (path[0] == '/') snprintf(abs, 8192, "%s", path);
  else {
    char base[4096];
    ssize_t n = -1;
    if (dirfd == AT_FDCWD) {
      if (getcwd(base, sizeof base)) n = (ssize_t)strlen(base);
    } else {
      char link[64];
      snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
      n = readlink(link, base, sizeof base - 1);
    }
    if (n < 0) return -1;
    base[n] = 0;
    snprintf(abs, 8192, "%s/%s", base, path);
  }
  return 0;
}

static int under_prefix(const char *abs) {
  if (!prefix_len) return 1;
  return !strncmp(abs, prefix, prefix_len) && (abs[prefix_len] == '/' || abs[prefix_len] == 0);
}

static void track(int fd, int yes) {
  if (fd >= 0 && fd < MAX_FD) tracked[fd] = (unsigned char)yes;
}

static int counts_fd(int fd) {
  if (!prefix_len) return 1;
  return fd >= 0 && fd < MAX_FD && tracked[fd];
}

/* A stream counts when it writes (an fclose of a read stream never fails
 * for want of room) to a descriptor that counts. */
static int counts_file(FILE *f) {
  if (!f) return 0;
  int fd = fileno_unlocked(f), fl = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
  return fl >= 0 && (fl & O_ACCMODE) != O_RDONLY && counts_fd(fd);
}

static int after_open(int fd, int dirfd, const char *path) {
  if (fd >= 0 && S && !busy) {
    busy++;
    char abs[8192];
    int ok = path && !abs_path(dirfd, path, abs);
    if (ok && *malloc_after && strstr(abs, malloc_after)) S->started = 1;
    track(fd, ok && under_prefix(abs));
    busy--;
  }
  return fd;
}

static FILE *after_fopen(FILE *f, const char *path) {
  if (f) after_open(fileno_unlocked(f), AT_FDCWD, path);
  return f;
}

#define MODE_ARG(flags, mode)                     \
  mode_t mode = 0;                                \
  if ((flags) & (O_CREAT | O_TMPFILE)) {        \
    va_list ap;                                   \
    va_start(ap, flags);                          \
    mode = (mode_t)va_arg(ap, int);               \
    va_end(ap);                                   \
  }

int open(const char *path, int flags, ...) {
  MODE_ARG(flags, mode);
  return after_open(get_open()(path, flags, mode), AT_FDCWD, path);
}
int open64(const char *path, int flags, ...) {
  MODE_ARG(flags, mode);
  return after_open(get_open64()(path, flags, mode), AT_FDCWD, path);
}
int openat(int dirfd, const char *path, int flags, ...) {
  MODE_ARG(flags, mode);
  return after_open(get_openat()(dirfd, path, flags, mode), dirfd, path);
}
int openat64(int dirfd, const char *path, int flags, ...) {
  MODE_ARG(flags, mode);
  return after_open(get_openat64()(dirfd, path, flags, mode), dirfd, path);
}
int creat(const char *path, mode_t mode) { return after_open(get_creat()(path, mode), AT_FDCWD, path); }
int creat64(const char *path, mode_t mode) { return after_open(get_creat64()(path, mode), AT_FDCWD, path); }
FILE *fopen(const char *path, const char *mode) { return after_fopen(get_fopen()(path, mode), path); }
FILE *fopen64(const char *path, const char *mode) { return after_fopen(get_fopen64()(path, mode), path); }
FILE *freopen(const char *path, const char *mode, FILE *f) {
  return after_fopen(get_freopen()(path, mode, f), path);
}
int mkstemp(char *t) { return after_open(get_mkstemp()(t), AT_FDCWD, t); }
int mkostemp(char *t, int fl) { return after_open(get_mkostemp()(t, fl), AT_FDCWD, t); }
int mkstemps(char *t, int sl) { return after_open(get_mkstemps()(t, sl), AT_FDCWD, t); }
int mkostemps(char *t, int sl, int fl) { return after_open(get_mkostemps()(t, sl, fl), AT_FDCWD, t); }

int close(int fd) {
  track(fd, 0);
  return get_close()(fd);
}
int dup(int fd) {
  int r = get_dup()(fd);
  if (r >= 0) track(r, counts_fd(fd) && prefix_len);
  return r;
}
int dup2(int fd, int to) {
  int r = get_dup2()(fd, to);
  if (r >= 0) track(r, counts_fd(fd) && prefix_len);
  return r;
}
int dup3(int fd, int to, int fl) {
  int r = get_dup3()(fd, to, fl);
  if (r >= 0) track(r, counts_fd(fd) && prefix_len);
  return r;
}

/* ---- writes and fsyncs ---------------------------------------------------- */

static int fail_write(void) {
  errno = werr;
  return -1;
}

ssize_t write(int fd, const void *b, size_t n) {
  if (counts_fd(fd) && fault_fd(K_WRITE, fd)) return fail_write();
  return get_write()(fd, b, n);
}
ssize_t pwrite(int fd, const void *b, size_t n, off_t off) {
  if (counts_fd(fd) && fault_fd(K_WRITE, fd)) return fail_write();
  return get_pwrite()(fd, b, n, off);
}
ssize_t pwrite64(int fd, const void *b, size_t n, off_t off) {
  if (counts_fd(fd) && fault_fd(K_WRITE, fd)) return fail_write();
  return get_pwrite64()(fd, b, n, off);
}
ssize_t writev(int fd, const struct iovec *v, int n) {
  if (counts_fd(fd) && fault_fd(K_WRITE, fd)) return fail_write();
  return get_writev()(fd, v, n);
}
ssize_t pwritev(int fd, const struct iovec *v, int n, off_t off) {
  if (counts_fd(fd) && fault_fd(K_WRITE, fd)) return fail_write();
  return get_pwritev()(fd, v, n, off);
}
int fsync(int fd) {
  if (counts_fd(fd) && fault_fd(K_FSYNC, fd)) {
    errno = EIO;
    return -1;
  }
  return get_fsync()(fd);
}
int fdatasync(int fd) {
  if (counts_fd(fd) && fault_fd(K_FSYNC, fd)) {
    errno = EIO;
    return -1;
  }
  return get_fdatasync()(fd);
}

/* A stream write that fails: the error flag set, as a failed flush sets it. */
static int stream_fault(FILE *f) {
  if (!counts_file(f) || !fault_fd(K_WRITE, fileno_unlocked(f))) return 0;
  f->_flags |= _IO_ERR_SEEN;
  errno = werr;
  return 1;
}

size_t fwrite(const void *p, size_t size, size_t n, FILE *f) {
  if (size && n && stream_fault(f)) return 0;
  return get_fwrite()(p, size, n, f);
}
int fputs(const char *s, FILE *f) {
  if (stream_fault(f)) return EOF;
  return get_fputs()(s, f);
}
int fputc(int c, FILE *f) {
  if (stream_fault(f)) return EOF;
  return get_fputc()(c, f);
}
int putc(int c, FILE *f) {
  if (stream_fault(f)) return EOF;
  return get_putc()(c, f);
}
int vfprintf(FILE *f, const char *fmt, va_list ap) {
  if (stream_fault(f)) return -1;
  return get_vfprintf()(f, fmt, ap);
}
int fprintf(FILE *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vfprintf(f, fmt, ap);
  va_end(ap);
  return r;
}
/* A failing fflush or fclose loses what the stream had buffered, as a
 * failed write(2) underneath it would. */
int fflush(FILE *f) {
  if (f && stream_fault(f)) {
    __fpurge(f);
    return EOF;
  }
  return get_fflush()(f);
}
int fclose(FILE *f) {
  int fail = stream_fault(f);
  if (fail) __fpurge(f);
  if (f) track(fileno_unlocked(f), 0);
  int r = get_fclose()(f);
  if (fail) {
    errno = werr;
    return EOF;
  }
  return r;
}

/* A program that ends with _exit (novac out of memory) still reports. */
void _exit(int status) {
  static void (*real_exit)(int);
  write_report();
  if (!real_exit) real_exit = (void (*)(int))dlsym(RTLD_NEXT, "_exit");
  real_exit(status);
  __builtin_unreachable();
}

/* ---- allocations ----------------------------------------------------------- */

/* Address ranges of the loaded objects, each eligible or not; rebuilt when
 * an address falls in none (an object loaded since). */
#define MAX_RANGES 512
static struct range {
  uintptr_t lo, hi;
  int ok;
} ranges[MAX_RANGES];
static int nranges;
static unsigned long long seen_adds;

static int name_eligible(const char *name) {
  const char *p = eligible;
  while (p && *p) {
    const char *e = strchr(p, ',');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    char w[256];
    if (l < sizeof w) {
      memcpy(w, p, l);
      w[l] = 0;
      if (!strcmp(w, "exe") ? !*name : (*name && strstr(name, w) != NULL)) return 1;
    }
    p = e ? e + 1 : NULL;
  }
  return 0;
}

static int add_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  (void)data;
  seen_adds = info->dlpi_adds;
  int ok = name_eligible(info->dlpi_name ? info->dlpi_name : "");
  for (int i = 0; i < info->dlpi_phnum && nranges < MAX_RANGES; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    ranges[nranges++] = (struct range){lo, lo + ph->p_memsz, ok};
  }
  return 0;
}

static int adds_of(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  *(unsigned long long *)data = info->dlpi_adds;
  return 1;
}

/* Functions of the program itself whose allocations never count: those
 * named with a prefix of NV_FAULT_MALLOC_SKIP (default "mlir,LLVM,_Z": the
 * MLIR C API and the C++ linked into novac, which do not check what malloc
 * returns), found in the program's symbol table. */
static struct range *skips;
static size_t nskips;

static int range_cmp(const void *a, const void *b) {
  const struct range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int skip_name(const char *nm, const char *list) {
  for (const char *p = list; p && *p;) {
    const char *e = strchr(p, ',');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l && !strncmp(nm, p, l)) return 1;
    p = e ? e + 1 : NULL;
  }
  return 0;
}

/* Reads the skipped functions of the program (loaded at BASE). */
static void read_skips(uintptr_t base) {
  const char *list = getenv("NV_FAULT_MALLOC_SKIP");
  if (!list) list = "mlir,LLVM,_Z";
  int fd = get_open()("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  off_t size = lseek(fd, 0, SEEK_END);
  void *m = size > 0 ? mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  get_close()(fd);
  if (m == MAP_FAILED) return;
  const unsigned char *f = m;
  const Elf64_Ehdr *eh = m;
  const Elf64_Shdr *sh = (const Elf64_Shdr *)(f + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; i++) {
    if (sh[i].sh_type != SHT_SYMTAB) continue;
    const Elf64_Sym *sym = (const Elf64_Sym *)(f + sh[i].sh_offset);
    size_t n = sh[i].sh_size / sizeof *sym;
    const char *str = (const char *)(f + sh[sh[i].sh_link].sh_offset);
    skips = mmap(NULL, n * sizeof *skips, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (skips == MAP_FAILED) {
      skips = NULL;
      break;
    }
    for (size_t k = 0; k < n; k++)
      if (ELF64_ST_TYPE(sym[k].st_info) == STT_FUNC && sym[k].st_value && skip_name(str + sym[k].st_name, list))
        skips[nskips++] = (struct range){base + sym[k].st_value, base + sym[k].st_value + sym[k].st_size, 0};
    qsort(skips, nskips, sizeof *skips, range_cmp);
    break;
  }
  munmap(m, (size_t)size);
}

static int skipped(uintptr_t a) {
  size_t lo = 0, hi = nskips;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (skips[mid].hi <= a) lo = mid + 1;
    else if (skips[mid].lo > a) hi = mid;
    else return 1;
  }
  return 0;
}

static int caller_eligible(const void *ret) {
  uintptr_t a = (uintptr_t)ret;
  if (skipped(a)) return 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < nranges; i++)
      if (a >= ranges[i].lo && a < ranges[i].hi) return ranges[i].ok;
    unsigned long long adds = 0;
    dl_iterate_phdr(adds_of, &adds);
    if (pass || (nranges && adds == seen_adds)) return 0;
    nranges = 0;
    dl_iterate_phdr(add_object, NULL);
  }
  return 0;
}

static int alloc_fault(const void *ret) {
  if (!S || busy || !malloc_on || (*malloc_after && !S->started)) return 0;
  busy++;
  int ok = caller_eligible(ret);
  busy--;
  if (!ok || !fault(K_MALLOC)) return 0;
  errno = ENOMEM;
  return 1;
}

void *malloc(size_t n) {
  if (alloc_fault(__builtin_return_address(0))) return NULL;
  return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
  if (alloc_fault(__builtin_return_address(0))) return NULL;
  return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  if (alloc_fault(__builtin_return_address(0))) return NULL;
  return __libc_realloc(p, n);
}
char *strdup(const char *s) {
  if (alloc_fault(__builtin_return_address(0))) return NULL;
  size_t n = strlen(s) + 1;
  char *d = __libc_malloc(n);
  return d ? memcpy(d, s, n) : NULL;
}
char *strndup(const char *s, size_t max) {
  if (alloc_fault(__builtin_return_address(0))) return NULL;
  size_t n = strnlen(s, max);
  char *d = __libc_malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}
int posix_memalign(void **out, size_t align, size_t n) {
  if (alloc_fault(__builtin_return_address(0))) return ENOMEM;
  if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
  void *p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
void *aligned_alloc(size_t align, size_t n) {
  if (alloc_fault(__builtin_return_address(0))) return NULL;
  return __libc_memalign(align, n);
}
