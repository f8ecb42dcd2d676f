// daemon/proto: message framing and descriptor passing between softrnicd and its clients.
#include "daemon/proto/proto.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rnic::daemon {

int send_msg(int sock, const void* msg, size_t len, const int* fds, size_t nfds) {
  if (nfds > kMaxFds) return EINVAL;
  iovec iov{const_cast<void*>(msg), len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (nfds > 0) {
    mh.msg_control = ctrl;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  for (;;) {
    ssize_t r = sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (r == static_cast<ssize_t>(len)) return 0;
    if (r >= 0) return EMSGSIZE;
    if (errno != EINTR) return errno;
  }
}

ssize_t recv_msg(int sock, void* buf, size_t cap, std::vector<int>* fds, size_t max_fds) {
  iovec iov{buf, cap};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFds)];
  mh.msg_control = ctrl;
  mh.msg_controllen = sizeof ctrl;
  ssize_t r;
  do {
    r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return -errno;
  std::vector<int> got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      got.push_back(fd);
    }
  }
  bool bad = (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  if (r > 0 && !bad) {
    if (static_cast<size_t>(r) < sizeof(Header)) {
      bad = true;
    } else {
      Header h;
      std::memcpy(&h, buf, sizeof h);
      bad = h.len != static_cast<size_t>(r);
    }
  }
  if (bad || fds == nullptr) {
    for (int fd : got) close(fd);
    got.clear();
  }
  if (bad) return -EPROTO;
  if (fds != nullptr) {
    while (got.size() > max_fds) {
      close(got.back());
      got.pop_back();
    }
    *fds = std::move(got);
  }
  return r;
}

ssize_t call(int sock, const void* req, size_t req_len, void* buf, size_t cap,
             std::vector<int>* fds, size_t max_fds, int timeout_ms) {
  if (int e = send_msg(sock, req, req_len); e != 0) return -e;
  pollfd p{sock, POLLIN, 0};
  int r;
  do {
    r = poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return -errno;
  if (r == 0) return -ETIMEDOUT;
  return recv_msg(sock, buf, cap, fds, max_fds);
}

namespace {

// Only a daemon we can trust: its directory is ours or root's and nobody else may write it,
// and the process that answers runs as us or as root (SO_PEERCRED). Anything else is refused
// as if absent (EACCES), so another user cannot stand in for the device.
bool trusted_dir(const std::string& path) {
  std::string dir = path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return true;  // connect reports the real error
  return (st.st_uid == geteuid() || st.st_uid == 0) && (st.st_mode & 022) == 0;
}

int connect_path(const std::string& path) {
  if (!trusted_dir(path)) return -EACCES;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof sa.sun_path) return -ENAMETOOLONG;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  ucred cr{};
  socklen_t l = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) != 0 || (cr.uid != geteuid() && cr.uid != 0)) {
    close(fd);
    return -EACCES;
  }
  return fd;
}

}  // namespace

int connect_daemon(const std::string& runtime_dir, std::string* path_out) {
  std::string first = runtime_dir + "/" + kSocketName;
  int fd = connect_path(first);
  std::string used = first;
  if (fd < 0 && (fd == -ENOENT || fd == -ECONNREFUSED) && first != kSystemSocket) {
    int fd2 = connect_path(kSystemSocket);
    if (fd2 >= 0 || fd2 != -ENOENT) {
      fd = fd2;
      used = kSystemSocket;
    }
  }
  if (path_out != nullptr) *path_out = used;
  return fd;
}

}  // namespace rnic::daemon
