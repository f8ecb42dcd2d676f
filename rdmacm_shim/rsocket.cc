// rsockets (rdma/rsocket.h): exported for the ABI, not implemented yet. Every call fails
// with ENOSYS (README support table), except rpoll and rselect: no rsocket ever exists, so
// every descriptor they see is a plain one and they pass through to poll / select — which
// is what rdmacm-utils' common.c needs (rping, ucmatose, udaddy import rpoll).
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/select.h>

#include <cerrno>
#include <cstdarg>

#define RDMACM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
int nosys() {
  errno = ENOSYS;
  return -1;
}
}  // namespace

RDMACM_EXPORT int rsocket(int, int, int) { return nosys(); }
RDMACM_EXPORT int rbind(int, const struct sockaddr*, socklen_t) { return nosys(); }
RDMACM_EXPORT int rlisten(int, int) { return nosys(); }
RDMACM_EXPORT int raccept(int, struct sockaddr*, socklen_t*) { return nosys(); }
RDMACM_EXPORT int rconnect(int, const struct sockaddr*, socklen_t) { return nosys(); }
RDMACM_EXPORT int rshutdown(int, int) { return nosys(); }
RDMACM_EXPORT int rclose(int) { return nosys(); }
RDMACM_EXPORT ssize_t rrecv(int, void*, size_t, int) { return nosys(); }
RDMACM_EXPORT ssize_t rrecvfrom(int, void*, size_t, int, struct sockaddr*, socklen_t*) { return nosys(); }
RDMACM_EXPORT ssize_t rrecvmsg(int, struct msghdr*, int) { return nosys(); }
RDMACM_EXPORT ssize_t rsend(int, const void*, size_t, int) { return nosys(); }
RDMACM_EXPORT ssize_t rsendto(int, const void*, size_t, int, const struct sockaddr*, socklen_t) { return nosys(); }
RDMACM_EXPORT ssize_t rsendmsg(int, const struct msghdr*, int) { return nosys(); }
RDMACM_EXPORT ssize_t rread(int, void*, size_t) { return nosys(); }
RDMACM_EXPORT ssize_t rreadv(int, const struct iovec*, int) { return nosys(); }
RDMACM_EXPORT ssize_t rwrite(int, const void*, size_t) { return nosys(); }
RDMACM_EXPORT ssize_t rwritev(int, const struct iovec*, int) { return nosys(); }
RDMACM_EXPORT int rpoll(struct pollfd* fds, nfds_t nfds, int timeout) { return poll(fds, nfds, timeout); }
RDMACM_EXPORT int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, struct timeval* timeout) {
  return select(nfds, readfds, writefds, exceptfds, timeout);
}
RDMACM_EXPORT int rgetpeername(int, struct sockaddr*, socklen_t*) { return nosys(); }
RDMACM_EXPORT int rgetsockname(int, struct sockaddr*, socklen_t*) { return nosys(); }
RDMACM_EXPORT int rsetsockopt(int, int, int, const void*, socklen_t) { return nosys(); }
RDMACM_EXPORT int rgetsockopt(int, int, int, void*, socklen_t*) { return nosys(); }
RDMACM_EXPORT int rfcntl(int, int, ...) { return nosys(); }
RDMACM_EXPORT off_t riomap(int, void*, size_t, int, int, off_t) { return nosys(); }
RDMACM_EXPORT int riounmap(int, void*, size_t) { return nosys(); }
RDMACM_EXPORT size_t riowrite(int, const void*, size_t, off_t, int) {
  errno = ENOSYS;
  return 0;
}
