/* novarun_elf.c: a step.so checked before dlopen.
 *
 * The dynamic loader maps a shared object's segments with mmap and trusts
 * their sizes: a file cut short (a copy interrupted, a disk full) maps, and
 * the first access past its end is a SIGBUS, not an error.  nr_check_elf
 * reads the ELF header, the program headers and the section headers with
 * pread (never through a mapping) and checks that the file holds each
 * table and every loaded segment's and section's bytes.
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "novarun.h"

/* Whether [OFF, OFF + LEN) lies inside a file of SIZE bytes. */
static int nr_within(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

/* Reads COUNT entries of ENTSIZE bytes at OFF (checked against SIZE) into
 * a new buffer of COUNT * WANT bytes, each entry cut or padded to WANT. */
static void *nr_read_table(int fd, uint64_t off, uint64_t count, uint64_t entsize, size_t want, uint64_t size) {
  errno = 0;
  if (entsize < want || count > (1u << 20) || !nr_within(off, count * entsize, size)) return NULL;
  char *t = calloc(count ? count : 1, want);
  if (!t) errno = ENOMEM; /* not the file's fault: said so */
  for (uint64_t i = 0; t && i < count; i++)
    if (pread(fd, t + i * want, want, (off_t)(off + i * entsize)) != (ssize_t)want) {
      free(t);
      t = NULL;
    }
  return t;
}

static int nr_check_segments(int fd, const Elf64_Ehdr *h, uint64_t size, char *why, size_t n) {
  Elf64_Phdr *ph = nr_read_table(fd, h->e_phoff, h->e_phnum, h->e_phentsize, sizeof *ph, size);
  if (!ph && errno == ENOMEM) {
    snprintf(why, n, "%s", strerror(errno));
    return -1;
  }
  if (!ph) {
    snprintf(why, n, "truncated: the file is %llu bytes, its program headers (%u at byte %llu) do not fit",
             (unsigned long long)size, (unsigned)h->e_phnum, (unsigned long long)h->e_phoff);
    return -1;
  }
  int rc = 0;
  for (unsigned i = 0; i < h->e_phnum && !rc; i++)
    if (ph[i].p_type == PT_LOAD && !nr_within(ph[i].p_offset, ph[i].p_filesz, size)) {
      snprintf(why, n, "truncated: the file is %llu bytes, its segment %u ends at byte %llu", (unsigned long long)size,
               i, (unsigned long long)(ph[i].p_offset + ph[i].p_filesz));
      rc = -1;
    }
  free(ph);
  return rc;
}

static int nr_check_sections(int fd, const Elf64_Ehdr *h, uint64_t size, char *why, size_t n) {
  if (h->e_shnum == 0) return 0; /* no section headers (stripped of them): the segments suffice */
  Elf64_Shdr *sh = nr_read_table(fd, h->e_shoff, h->e_shnum, h->e_shentsize, sizeof *sh, size);
  if (!sh && errno == ENOMEM) {
    snprintf(why, n, "%s", strerror(errno));
    return -1;
  }
  if (!sh) {
    snprintf(why, n, "truncated: the file is %llu bytes, its section headers (%u at byte %llu) do not fit",
             (unsigned long long)size, (unsigned)h->e_shnum, (unsigned long long)h->e_shoff);
    return -1;
  }
  int rc = 0;
  for (unsigned i = 0; i < h->e_shnum && !rc; i++)
    if (sh[i].sh_type != SHT_NOBITS && !nr_within(sh[i].sh_offset, sh[i].sh_size, size)) {
      snprintf(why, n, "truncated: the file is %llu bytes, its section %u ends at byte %llu", (unsigned long long)size,
               i, (unsigned long long)(sh[i].sh_offset + sh[i].sh_size));
      rc = -1;
    }
  free(sh);
  return rc;
}

static int nr_check_header(const Elf64_Ehdr *h, ssize_t got, char *why, size_t n) {
  if (got < EI_NIDENT || memcmp(h->e_ident, ELFMAG, SELFMAG)) {
    snprintf(why, n, "not an ELF file");
    return -1;
  }
  if (h->e_ident[EI_CLASS] != ELFCLASS64 || h->e_ident[EI_DATA] != ELFDATA2LSB) {
    snprintf(why, n, "not a 64-bit little-endian ELF file");
    return -1;
  }
  if (got < (ssize_t)sizeof *h) {
    snprintf(why, n, "truncated: the file is %zd bytes, shorter than an ELF header", got);
    return -1;
  }
  if (h->e_type != ET_DYN) {
    snprintf(why, n, "an ELF file, but not a shared object (e_type %u)", (unsigned)h->e_type);
    return -1;
  }
  return 0;
}

int nr_check_elf(const char *path, char *why, size_t n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, n, "%s", strerror(errno));
    return -1;
  }
  struct stat sb;
  Elf64_Ehdr h;
  memset(&h, 0, sizeof h);
  int rc = -1;
  if (fstat(fd, &sb)) snprintf(why, n, "%s", strerror(errno));
  else if (!S_ISREG(sb.st_mode)) snprintf(why, n, "not a regular file");
  else if (!nr_check_header(&h, pread(fd, &h, sizeof h, 0), why, n) &&
           !nr_check_segments(fd, &h, (uint64_t)sb.st_size, why, n) &&
           !nr_check_sections(fd, &h, (uint64_t)sb.st_size, why, n))
    rc = 0;
  close(fd);
  return rc;
}
