/* libsoftrnic_paths.so: lets unmodified programs find the emulated device at the fixed paths
 * they hard-code, without root. `scripts/softrnic run` always LD_PRELOADs it.
 *
 * UCX (uct_ib_device_is_accessible) keeps a verbs device only if /dev/infiniband/<dev_name>
 * is a character device that access(R_OK|W_OK) accepts; UCX, Open MPI's common_ucx and NCCL
 * read /sys/class/infiniband/<dev>/... by fixed path, ignoring SYSFS_PATH
 * (docs: README "UCX, Open MPI, libfabric"). This library answers exactly those paths:
 *
 *   /sys/class/infiniband/<dev>/<rest>  -> $SYSFS_PATH/class/infiniband/<dev>/<rest>
 *       (open, fopen, opendir, readlink, the stat and access families)
 *   /dev/infiniband/<uverbsN>           -> /dev/null, for the stat and access families only
 *       (a read-write character device; open() of it still fails as before)
 *
 * and only when (1) SYSFS_PATH names a generated tree other than /sys, (2) that tree holds
 * <dev> (class/infiniband/<dev>) or <uverbsN> (class/infiniband_verbs/<uverbsN>), (3) the
 * real path's first component below the prefix does not exist (a host's real device is never
 * shadowed), and (4) the path has no empty, "." or ".." component. Every other call goes to
 * the next definition (libc) untouched, with errno as libc leaves it.
 *
 * Being preloaded, it works whenever the verbs library is loaded (also by a late dlopen, as
 * UCX's libuct_ib is). It exports only the interposed libc functions (the build checks it
 * with tests/pathmap/pathmap_test.sh) and never writes to stdout or stderr.
 */
#undef _FILE_OFFSET_BITS /* define stat and stat64 under their own names */
#undef _FORTIFY_SOURCE
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum { kMaxPath = 4096 };

static const char kSysPrefix[] = "/sys/class/infiniband/";
static const char kDevPrefix[] = "/dev/infiniband/";

/* The interposed functions and the symbol version of the next definition (libc's) to bind:
 * NULL for the default one; the old stat entry points glibc 2.33+ keeps only as compat
 * symbols (x86_64 version). */
#define kCompatVer "GLIBC_2.2.5"
#define PATHMAP_SYMBOLS(X)                                                                \
  X(stat, NULL) X(stat64, NULL) X(lstat, NULL) X(lstat64, NULL) X(fstatat, NULL)          \
  X(fstatat64, NULL) X(__xstat, kCompatVer) X(__xstat64, kCompatVer)                       \
  X(__lxstat, kCompatVer) X(__lxstat64, kCompatVer) X(__fxstatat, kCompatVer)              \
  X(__fxstatat64, kCompatVer) X(statx, NULL) X(access, NULL) X(faccessat, NULL)            \
  X(euidaccess, NULL) X(eaccess, NULL) X(open, NULL) X(open64, NULL) X(__open_2, NULL)     \
  X(__open64_2, NULL) X(openat, NULL) X(openat64, NULL) X(__openat_2, NULL)                \
  X(__openat64_2, NULL) X(fopen, NULL) X(fopen64, NULL) X(opendir, NULL) X(readlink, NULL) \
  X(readlinkat, NULL)

enum {
#define X(name, ver) kSym_##name,
  PATHMAP_SYMBOLS(X)
#undef X
  kSymCount
};
static const struct {
  const char* name;
  const char* version;
} kSyms[kSymCount] = {
#define X(name, ver) {#name, ver},
    PATHMAP_SYMBOLS(X)
#undef X
};
static void* g_next[kSymCount];

/* The next definition of symbol i. Lock-free: every thread that races stores the same pointer. */
static void* next_sym(int i) {
  void* p = __atomic_load_n(&g_next[i], __ATOMIC_ACQUIRE);
  if (p != NULL) return p;
  if (kSyms[i].version != NULL) p = dlvsym(RTLD_NEXT, kSyms[i].name, kSyms[i].version);
  if (p == NULL) p = dlsym(RTLD_NEXT, kSyms[i].name);
  __atomic_store_n(&g_next[i], p, __ATOMIC_RELEASE);
  return p;
}
#define NEXT(type, name) ((type)next_sym(kSym_##name))

/* Resolved before main, so no lookup (which may allocate) runs inside a caller's open() later. */
__attribute__((constructor)) static void resolve_all(void) {
  for (int i = 0; i < kSymCount; i++) (void)next_sym(i);
}

/* True if `p` exists (without following a final symlink), asked of libc, errno kept. */
static int exists(const char* p) {
  struct stat st;
  int saved = errno;
  int r = NEXT(int (*)(const char*, struct stat*), lstat)(p, &st);
  errno = saved;
  return r == 0;
}

/* No empty, "." or ".." component in `s` (a relative path). */
static int plain_components(const char* s) {
  while (*s != '\0') {
    const char* e = strchr(s, '/');
    size_t n = e != NULL ? (size_t)(e - s) : strlen(s);
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
    if (e == NULL) break;
    s = e + 1;
    if (*s == '\0') break; /* one trailing slash is fine */
  }
  return 1;
}

/* The generated tree's root from SYSFS_PATH, or NULL when there is none to serve. */
static const char* tree_root(void) {
  const char* r = getenv("SYSFS_PATH");
  if (r == NULL || r[0] != '/' || strlen(r) >= kMaxPath / 2) return NULL;
  if (strcmp(r, "/sys") == 0 || strcmp(r, "/sys/") == 0) return NULL;
  return r;
}

enum Use { kOpen, kStat };

/* If `path` is one this library answers for `use`, writes the path to use instead into out
 * and returns out; otherwise returns NULL (the caller passes the original through). */
static const char* map_path(const char* path, enum Use use, char out[kMaxPath]) {
  if (path == NULL || path[0] != '/') return NULL;
  int sys = strncmp(path, kSysPrefix, sizeof kSysPrefix - 1) == 0;
  int dev = !sys && use == kStat && strncmp(path, kDevPrefix, sizeof kDevPrefix - 1) == 0;
  if (!sys && !dev) return NULL;
  const char* rest = path + (sys ? sizeof kSysPrefix : sizeof kDevPrefix) - 1;
  if (rest[0] == '\0' || strlen(path) >= kMaxPath / 2 || !plain_components(rest)) return NULL;
  const char* root = tree_root();
  if (root == NULL) return NULL;
  size_t name_len = strcspn(rest, "/");
  if (dev && rest[name_len] != '\0') return NULL; /* /dev/infiniband/<name> only */

  /* (3): the real first component must be absent. */
  char probe[kMaxPath];
  snprintf(probe, sizeof probe, "%.*s", (int)(rest - path + name_len), path);
  if (exists(probe)) return NULL;
  /* (2): the generated tree must describe it. */
  snprintf(probe, sizeof probe, "%s/class/%s/%.*s", root, sys ? "infiniband" : "infiniband_verbs",
           (int)name_len, rest);
  if (!exists(probe)) return NULL;
  if (dev) return "/dev/null";
  snprintf(out, kMaxPath, "%s/class/infiniband/%s", root, rest);
  return out;
}

#define MAPPED(path, use) \
  char map_buf_[kMaxPath]; \
  const char* m_ = map_path(path, use, map_buf_); \
  const char* p_ = m_ != NULL ? m_ : (path)

/* ---- the stat family ---- */

EXPORT int stat(const char* path, struct stat* st) {
  MAPPED(path, kStat);
  return NEXT(int (*)(const char*, struct stat*), stat)(p_, st);
}
EXPORT int stat64(const char* path, struct stat64* st) {
  MAPPED(path, kStat);
  return NEXT(int (*)(const char*, struct stat64*), stat64)(p_, st);
}
EXPORT int lstat(const char* path, struct stat* st) {
  MAPPED(path, kStat);
  return NEXT(int (*)(const char*, struct stat*), lstat)(p_, st);
}
EXPORT int lstat64(const char* path, struct stat64* st) {
  MAPPED(path, kStat);
  return NEXT(int (*)(const char*, struct stat64*), lstat64)(p_, st);
}
EXPORT int fstatat(int dirfd, const char* path, struct stat* st, int flags) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, const char*, struct stat*, int), fstatat)(dirfd, p_, st, flags);
}
EXPORT int fstatat64(int dirfd, const char* path, struct stat64* st, int flags) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, const char*, struct stat64*, int), fstatat64)(dirfd, p_, st, flags);
}
EXPORT int __xstat(int ver, const char* path, struct stat* st) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, const char*, struct stat*), __xstat)(ver, p_, st);
}
EXPORT int __xstat64(int ver, const char* path, struct stat64* st) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, const char*, struct stat64*), __xstat64)(ver, p_, st);
}
EXPORT int __lxstat(int ver, const char* path, struct stat* st) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, const char*, struct stat*), __lxstat)(ver, p_, st);
}
EXPORT int __lxstat64(int ver, const char* path, struct stat64* st) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, const char*, struct stat64*), __lxstat64)(ver, p_, st);
}
EXPORT int __fxstatat(int ver, int dirfd, const char* path, struct stat* st, int flags) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, int, const char*, struct stat*, int), __fxstatat)(ver, dirfd, p_, st,
                                                                            flags);
}
EXPORT int __fxstatat64(int ver, int dirfd, const char* path, struct stat64* st, int flags) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, int, const char*, struct stat64*, int), __fxstatat64)(ver, dirfd, p_,
                                                                                st, flags);
}
EXPORT int statx(int dirfd, const char* path, int flags, unsigned int mask, struct statx* stx) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, const char*, int, unsigned int, struct statx*), statx)(dirfd, p_, flags,
                                                                                 mask, stx);
}

/* ---- the access family ---- */

EXPORT int access(const char* path, int mode) {
  MAPPED(path, kStat);
  return NEXT(int (*)(const char*, int), access)(p_, mode);
}
EXPORT int faccessat(int dirfd, const char* path, int mode, int flags) {
  MAPPED(path, kStat);
  return NEXT(int (*)(int, const char*, int, int), faccessat)(dirfd, p_, mode, flags);
}
EXPORT int euidaccess(const char* path, int mode) {
  MAPPED(path, kStat);
  return NEXT(int (*)(const char*, int), euidaccess)(p_, mode);
}
EXPORT int eaccess(const char* path, int mode) {
  MAPPED(path, kStat);
  return NEXT(int (*)(const char*, int), eaccess)(p_, mode);
}

/* ---- the open family ---- */

/* open's third argument exists only with O_CREAT or O_TMPFILE. */
#define MODE_ARG(flags) \
  mode_t mode = 0; \
  if (((flags) & O_CREAT) || ((flags) & O_TMPFILE) == O_TMPFILE) { \
    va_list ap; \
    va_start(ap, flags); \
    mode = (mode_t)va_arg(ap, int); \
    va_end(ap); \
  }

EXPORT int open(const char* path, int flags, ...) {
  MODE_ARG(flags);
  MAPPED(path, kOpen);
  return NEXT(int (*)(const char*, int, ...), open)(p_, flags, mode);
}
EXPORT int open64(const char* path, int flags, ...) {
  MODE_ARG(flags);
  MAPPED(path, kOpen);
  return NEXT(int (*)(const char*, int, ...), open64)(p_, flags, mode);
}
EXPORT int __open_2(const char* path, int flags) {
  MAPPED(path, kOpen);
  return NEXT(int (*)(const char*, int), __open_2)(p_, flags);
}
EXPORT int __open64_2(const char* path, int flags) {
  MAPPED(path, kOpen);
  return NEXT(int (*)(const char*, int), __open64_2)(p_, flags);
}
EXPORT int openat(int dirfd, const char* path, int flags, ...) {
  MODE_ARG(flags);
  MAPPED(path, kOpen);
  return NEXT(int (*)(int, const char*, int, ...), openat)(dirfd, p_, flags, mode);
}
EXPORT int openat64(int dirfd, const char* path, int flags, ...) {
  MODE_ARG(flags);
  MAPPED(path, kOpen);
  return NEXT(int (*)(int, const char*, int, ...), openat64)(dirfd, p_, flags, mode);
}
EXPORT int __openat_2(int dirfd, const char* path, int flags) {
  MAPPED(path, kOpen);
  return NEXT(int (*)(int, const char*, int), __openat_2)(dirfd, p_, flags);
}
EXPORT int __openat64_2(int dirfd, const char* path, int flags) {
  MAPPED(path, kOpen);
  return NEXT(int (*)(int, const char*, int), __openat64_2)(dirfd, p_, flags);
}
EXPORT FILE* fopen(const char* path, const char* mode) {
  MAPPED(path, kOpen);
  return NEXT(FILE * (*)(const char*, const char*), fopen)(p_, mode);
}
EXPORT FILE* fopen64(const char* path, const char* mode) {
  MAPPED(path, kOpen);
  return NEXT(FILE * (*)(const char*, const char*), fopen64)(p_, mode);
}
EXPORT DIR* opendir(const char* path) {
  MAPPED(path, kOpen);
  return NEXT(DIR * (*)(const char*), opendir)(p_);
}
EXPORT ssize_t readlink(const char* path, char* buf, size_t len) {
  MAPPED(path, kOpen);
  return NEXT(ssize_t(*)(const char*, char*, size_t), readlink)(p_, buf, len);
}
EXPORT ssize_t readlinkat(int dirfd, const char* path, char* buf, size_t len) {
  MAPPED(path, kOpen);
  return NEXT(ssize_t(*)(int, const char*, char*, size_t), readlinkat)(dirfd, p_, buf, len);
}
