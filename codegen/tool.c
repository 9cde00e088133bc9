/* tool.c: running the external tools that build a step (cc, ld, ptxas,
 * fatbinary): a child process in the build folder, its output kept in a log
 * and shown in full when it fails. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/util.h"
#include "codegen.h"

int cg_run_tool(nova_ctx *c, const char *dir, char *const argv[], bool verbose, const char *what) {
  if (verbose) {
    fprintf(stderr, "novac: (cd %s &&", dir);
    for (int i = 0; argv[i]; i++) fprintf(stderr, " %s", argv[i]);
    fprintf(stderr, ")\n");
  }
  char log[4096];
  snprintf(log, sizeof log, "%s/tool.log", dir);
  pid_t parent = getpid(), pid = fork();
  if (pid < 0) {
    nv_error_plain(c->diag, "cannot start %s: %s", argv[0], strerror(errno));
    return -1;
  }
  if (pid == 0) {
    nv_child_dies_with_parent(parent);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    if (chdir(dir) == 0) execvp(argv[0], argv);
    fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  /* the tool's whole message (the linker's first line rarely names the
     cause), up to 16 KiB of it */
  size_t len = 0, cap = 16384;
  char *out = nv_read_file(log, &len, 1 << 20);
  size_t shown = out ? strlen(out) : 0;
  while (shown && (out[shown - 1] == '\n' || out[shown - 1] == ' ')) shown--;
  const char *more = shown > cap ? "\n(... cut)" : "";
  if (shown > cap) shown = cap;
  char how[64] = "failed";
  if (WIFSIGNALED(st)) snprintf(how, sizeof how, "was killed by signal %d", WTERMSIG(st));
  if (shown)
    nv_error_plain(c->diag, "%s %s while building the step:\n%.*s%s", what ? what : argv[0], how, (int)shown, out, more);
  else
    nv_error_plain(c->diag, "%s %s while building the step: (no output)", what ? what : argv[0], how);
  free(out);
  return -1;
}
