/* pathmap_probe PATH: calls every function libsoftrnic_paths.so interposes on PATH and prints
 * one line per call with what a caller can observe (return value, errno, the stat fields that
 * do not change between two runs, the first bytes read, sorted directory entries, the link
 * target). tests/pathmap/pathmap_test.sh compares these lines with and without the preload. */
#undef _FILE_OFFSET_BITS
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void rc_line(const char* fn, long rc) {
  if (rc < 0)
    printf("%s: -1 %s\n", fn, strerrorname_np(errno));
  else
    printf("%s: %ld\n", fn, rc);
}

static void st_line(const char* fn, int rc, const struct stat64* st) {
  if (rc != 0) {
    rc_line(fn, rc);
    return;
  }
  printf("%s: 0 mode %o ino %llu dev %llx rdev %llx nlink %lu size %lld uid %u\n", fn, st->st_mode,
         (unsigned long long)st->st_ino, (unsigned long long)st->st_dev,
         (unsigned long long)st->st_rdev, (unsigned long)st->st_nlink, (long long)st->st_size,
         st->st_uid);
}

static void fd_line(const char* fn, int fd) {
  if (fd < 0) {
    rc_line(fn, fd);
    return;
  }
  char buf[65];
  ssize_t n = read(fd, buf, 64);
  if (n < 0) {
    printf("%s: open ok, read -1 %s\n", fn, strerrorname_np(errno));
  } else {
    buf[n] = '\0';
    for (ssize_t i = 0; i < n; i++)
      if (buf[i] == '\n') buf[i] = '|';
    printf("%s: open ok, read %zd '%s'\n", fn, n, buf);
  }
  close(fd);
}

static int cmp(const void* a, const void* b) {
  return strcmp(*(char* const*)a, *(char* const*)b);
}

typedef int (*xstat_fn)(int, const char*, struct stat64*);
typedef int (*fxstatat_fn)(int, int, const char*, struct stat64*, int);

/* The old stat entry points as a binary built against glibc < 2.33 binds them: an unversioned
 * definition (the preloaded one) first, else libc's compat version. (dlvsym alone would skip
 * the unversioned definition, which the dynamic linker does not.) */
static void* compat(const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  return p != NULL ? p : dlvsym(RTLD_DEFAULT, name, "GLIBC_2.2.5");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: pathmap_probe PATH\n");
    return 2;
  }
  const char* p = argv[1];
  struct stat64 st;
  struct stat s32;
  int rc;

  rc = stat(p, &s32);
  memset(&st, 0, sizeof st);
  if (rc == 0) memcpy(&st, &s32, sizeof s32 < sizeof st ? sizeof s32 : sizeof st);
  st_line("stat", rc, &st);
  rc = lstat(p, &s32);
  if (rc == 0) memcpy(&st, &s32, sizeof s32 < sizeof st ? sizeof s32 : sizeof st);
  st_line("lstat", rc, &st);
  st_line("stat64", stat64(p, &st), &st);
  st_line("lstat64", lstat64(p, &st), &st);
  rc = fstatat(AT_FDCWD, p, &s32, 0);
  if (rc == 0) memcpy(&st, &s32, sizeof s32 < sizeof st ? sizeof s32 : sizeof st);
  st_line("fstatat", rc, &st);
  st_line("fstatat64", fstatat64(AT_FDCWD, p, &st, AT_SYMLINK_NOFOLLOW), &st);
  xstat_fn xs = (xstat_fn)compat("__xstat64");
  if (xs != NULL) st_line("__xstat64", xs(1, p, &st), &st);
  xstat_fn lxs = (xstat_fn)compat("__lxstat");
  if (lxs != NULL) st_line("__lxstat", lxs(1, p, &st), &st);
  fxstatat_fn fxs = (fxstatat_fn)compat("__fxstatat64");
  if (fxs != NULL) st_line("__fxstatat64", fxs(1, AT_FDCWD, p, &st, 0), &st);
  struct statx sx;
  rc = statx(AT_FDCWD, p, 0, STATX_BASIC_STATS, &sx);
  if (rc != 0)
    rc_line("statx", rc);
  else
    printf("statx: 0 mode %o ino %llu rdev %x:%x size %llu\n", sx.stx_mode,
           (unsigned long long)sx.stx_ino, sx.stx_rdev_major, sx.stx_rdev_minor,
           (unsigned long long)sx.stx_size);

  rc_line("access(F_OK)", access(p, F_OK));
  rc_line("access(R_OK|W_OK)", access(p, R_OK | W_OK));
  rc_line("faccessat", faccessat(AT_FDCWD, p, R_OK, 0));
  rc_line("euidaccess", euidaccess(p, R_OK));

  fd_line("open", open(p, O_RDONLY));
  fd_line("open64", open64(p, O_RDONLY));
  fd_line("openat", openat(AT_FDCWD, p, O_RDONLY));
  FILE* f = fopen(p, "r");
  if (f == NULL) {
    rc_line("fopen", -1);
  } else {
    char line[128] = "";
    if (fgets(line, sizeof line, f) == NULL) line[0] = '\0';
    line[strcspn(line, "\n")] = '\0';
    printf("fopen: ok '%s'\n", line);
    fclose(f);
  }
  DIR* d = opendir(p);
  if (d == NULL) {
    rc_line("opendir", -1);
  } else {
    char* names[256];
    int n = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL && n < 256) names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp);
    printf("opendir: ok %d:", n);
    for (int i = 0; i < n; i++) {
      printf(" %s", names[i]);
      free(names[i]);
    }
    printf("\n");
  }
  char link[256];
  ssize_t n = readlink(p, link, sizeof link - 1);
  if (n >= 0) link[n] = '\0';
  if (n < 0) rc_line("readlink", -1); else printf("readlink: '%s'\n", link);
  n = readlinkat(AT_FDCWD, p, link, sizeof link - 1);
  if (n >= 0) link[n] = '\0';
  if (n < 0) rc_line("readlinkat", -1); else printf("readlinkat: '%s'\n", link);
  return 0;
}
