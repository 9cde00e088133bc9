/* util.h: growable strings, whole-file reading, name patterns, durable
 * output, temporary paths removed on every exit. */
#ifndef NOVA_UTIL_H
#define NOVA_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

typedef struct nv_sbuf {
  char *s;      /* NUL-terminated once anything was written; owned */
  size_t len, cap;
  int oom;      /* an allocation failed: the text is incomplete */
} nv_sbuf;

/* ---- allocation that cannot fail ------------------------------------------
 * The compiler's allocations (frontend/, passes/, codegen/, configurator/,
 * novac's driver) go through nv_x*: on failure, "PROG: error: out of memory"
 * on stderr, the temporary files of nv_temp_add removed, and _exit(1)
 * (from any thread or forked worker; nothing partial is ever published:
 * outputs are renamed into place only when complete).  Like an assert, the
 * one place outside main that ends the process.  nv_oom_set_fatal (novac's
 * main): nv_sbuf and cJSON growth fail the same way instead of marking the
 * text incomplete; novarun keeps every allocation failure a value. */
void *nv_xmalloc(size_t n);
void *nv_xcalloc(size_t n, size_t size);
void *nv_xrealloc(void *p, size_t n);
char *nv_xstrdup(const char *s);
char *nv_xstrndup(const char *s, size_t n);
void nv_oom_set_fatal(void);
bool nv_oom_is_fatal(void);
_Noreturn void nv_oom_die(size_t n);

void nv_sb_printf(nv_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nv_sb_vprintf(nv_sbuf *b, const char *fmt, va_list ap);
void nv_sb_free(nv_sbuf *b);

/* Reads a whole file; returns malloc'd bytes (NUL-terminated) or NULL with
 * errno set.  Refuses files over max_bytes (errno = EFBIG). */
char *nv_read_file(const char *path, size_t *len, size_t max_bytes);

/* Whether NAME matches one of the comma-separated fnmatch(3) patterns of
 * GLOBS (NULL: none; at most NV_MAX_GLOBS are read); sets MATCHED[k] for
 * each pattern k that matches.  nv_glob_count: how many patterns. */
#define NV_MAX_GLOBS 64
/* The files a compile reads besides its input (novac -M): nv_dep_note
 * records PATH once (its text as given); nv_deps lists them in the order
 * first noted (*N of them). */
void nv_dep_note(const char *path);
const char *const *nv_deps(int *n);
/* Processes or threads for novac's parallel work: NOVAC_JOBS, else the
 * processors this process may run on (taskset -c 0: 1), at most 8. */
int nv_jobs(void);
bool nv_glob_match(const char *globs, const char *name, bool *matched);
int nv_glob_count(const char *globs);


/* Whether V may be handed to strtol/strtod as a whole token: not empty,
 * no leading blank or '+' (which those skip or take); the caller still
 * checks that the number ends the string. */
bool nv_number_token(const char *v);
/* BYTES for a message: "N bytes", with " (X.Y MiB)" from 10 MiB on; BUF. */
const char *nv_human_bytes(char *buf, size_t n, int64_t bytes);

/* ---- durable output ------------------------------------------------------
 * Every file novac and novarun write goes through nv_out: the bytes go to a
 * temporary PATH.tmp.XXXXXX beside PATH (flock'ed while open, registered for
 * removal on a fatal signal), and replace PATH only once every write, the
 * fflush, the fsync and the fclose succeeded; the folder is then fsync'ed.
 * On any failure the temporary is removed and PATH is left as it was.
 * PATH "-" is stdout (its errors are checked, nothing is renamed).  An
 * existing PATH that is not a regular file (/dev/null, a FIFO) is written in
 * place, unless NV_OUT_REGULAR is given, which refuses it (ENOTSUP).
 * Temporaries left by a killed writer (unlocked PATH.tmp.*) are removed by
 * the next nv_out_open of the same PATH.  Functions return 0, or -1 with
 * errno set. */
#include <stdint.h>
#include <stdio.h>

enum { NV_OUT_REGULAR = 1 };

typedef struct nv_out {
  FILE *f;     /* write here; NULL once finished */
  char *path;  /* owned copy of PATH */
  char *tmp;   /* owned; NULL when writing PATH itself */
  int slot;    /* nv_temp_add's slot of TMP, or -1 */
  int failed;  /* errno of the first failure seen, or 0 */
} nv_out;

int nv_out_open(nv_out *o, const char *path, unsigned flags);
int nv_out_finish(nv_out *o);  /* flush, fsync, close; the temporary stays */
/* rename over PATH (after nv_out_finish), then fsync PATH's folder; frees O.
 * -1 after the rename when only that fsync failed (PATH is whole, and is the
 * new file, but may not survive a crash). */
int nv_out_publish(nv_out *o);
int nv_out_rename(nv_out *o);  /* the rename alone; frees O */
int nv_sync_dir_of(const char *path); /* fsync of PATH's folder; 0 where unsupported */
int nv_out_close(nv_out *o);   /* finish + publish, or discard on failure; frees O */
void nv_out_discard(nv_out *o); /* removes the temporary; frees O */
int nv_write_file(const char *path, const void *data, size_t len, unsigned flags);
/* fflush + ferror + fclose of stdout: -1 with errno when anything written to
 * it was lost (a full disk, /dev/full, a closed pipe). */
int nv_close_stdout(void);

/* FNV-1a, 64 bits, of LEN bytes continuing from H (start: NV_FNV_INIT). */
#define NV_FNV_INIT 0xcbf29ce484222325ull
uint64_t nv_fnv1a64(uint64_t h, const void *data, size_t len);
/* A map from strings to ints, open addressing on FNV-1a.  The keys are
 * not copied: each must outlive the map.  put: 0, or -1 out of memory
 * (the map as it was); a key already there gets the new value.  get: the
 * value, or -1 if absent. */
typedef struct nv_strmap {
  const char **key;
  int *val;
  size_t cap, n;
} nv_strmap;
int nv_strmap_put(nv_strmap *m, const char *key, int val);
int nv_strmap_get(const nv_strmap *m, const char *key);
void nv_strmap_free(nv_strmap *m);
/* Size and FNV-1a of a whole file. */
int nv_file_fnv(const char *path, uint64_t *size, uint64_t *hash);

/* ---- temporary folders ---------------------------------------------------
 * nv_tempdir_create makes $TMPDIR/PREFIX.XXXXXX (TMPDIR unset or empty:
 * /tmp) holding .lock, flock'ed through *LOCK (close-on-exec) for as long as
 * the folder is used: close *LOCK after removing the folder (its .lock
 * included).  0, or -1 with errno.  nv_tempdir_keep: the folder stays for
 * good (NOVAC_KEEP_TEMPS): .lock becomes .keep, *LOCK is closed.
 * nv_tempdir_sweep, at start: removes the novac.XXXXXX and novac-cg.XXXXXX
 * folders of $TMPDIR that a killed novac left (this user's, not symlinks,
 * their .lock free, or no .lock and over a minute old); a live novac's
 * folder is locked and stays. */
int nv_tempdir_create(char *dir, size_t n, const char *prefix, int *lock);
void nv_tempdir_keep(const char *dir, int lock);
void nv_tempdir_sweep(void);

/* ---- cJSON's allocations (support/json.c) ----------------------------------
 * nv_json_init, once in main: cJSON allocates through a wrapper that notes a
 * failure; nv_json_oom_take: whether one failed since the last call (and
 * forgets it). */
void nv_json_init(void);
int nv_json_oom_take(void);

/* ---- temporary paths removed on every exit ------------------------------
 * nv_temp_add registers a file (or a flat folder: its entries are removed,
 * then itself) to remove if the process ends by SIGINT, SIGTERM, SIGHUP or
 * SIGQUIT (async-signal-safe calls only, then the signal is raised again) or
 * by exit(); -> a slot for nv_temp_drop, or -1 when the table is full.
 * nv_temp_install: the handlers, once, in main; only the installing process
 * removes anything (forked children inherit the handlers, not the duty).
 * nv_child_dies_with_parent: in a child after fork, so that it is killed
 * when PARENT dies (and exits at once if PARENT is already gone). */
int nv_temp_add(const char *path, int is_dir);
void nv_temp_drop(int slot);
void nv_temp_install(void);
void nv_child_dies_with_parent(int parent);

#endif
