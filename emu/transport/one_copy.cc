// emu/transport/one_copy.cc: the link between two devices of one host (design in one_copy.h).
#include "emu/transport/one_copy.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/log.h"
#include "emu/transport/recv.h"
#include "wire/byteorder.h"

namespace rnic::emu {

namespace {

constexpr uint32_t kMagic = 0x53524f43;  // "SROC"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMsgHello = 1, kMsgShare = 2, kMsgForget = 3;
constexpr size_t kMaxForget = 500;  // memfd ids per forget message

// Every message: magic, type, then its fields (host order: both ends are one host).
struct MsgHello {
  uint32_t magic, type, version, pad;
  uint64_t token;
};
struct MsgShare {
  uint32_t magic, type, id, pad;
  uint64_t size;
};
struct MsgForget {
  uint32_t magic, type, n, pad;
  uint32_t ids[kMaxForget];
};

socklen_t abstract_addr(const std::string& name, sockaddr_un* a) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(a->sun_path) - 1);
  std::memcpy(a->sun_path + 1, name.data(), n);  // sun_path[0] == 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

bool same_user(int fd) {
  ucred c{};
  socklen_t l = sizeof c;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &l) == 0 && c.uid == ::geteuid();
}

}  // namespace

void put_one_copy_desc(uint8_t* out, const OneCopyDesc& d) {
  wire::store_be64(out, d.token);
  wire::store_be32(out + 8, d.id);
  wire::store_be32(out + 12, d.len);
  wire::store_be64(out + 16, d.off);
}

bool get_one_copy_desc(std::span<const uint8_t> in, OneCopyDesc* d) {
  if (in.size() != kOneCopyDescBytes) return false;
  const uint8_t* p = in.data();
  d->token = wire::load_be64(p);
  d->id = wire::load_be32(p + 8);
  d->len = wire::load_be32(p + 12);
  d->off = wire::load_be64(p + 16);
  return true;
}

// ---------------------------------------------------------------- requester side

class OneCopyLink {
 public:
  int fd = -1;  // mu; -1 once retired
  uint64_t token = 0;
  std::mutex mu;
  // Memfds the peer has mapped, by id; expired: dropped here, to be forgotten there.
  std::unordered_map<uint32_t, std::weak_ptr<const PinBacking>> shared;
  // The peer hung up or a send failed: QPs on it link again (OneCopy::link).
  std::atomic<bool> broken{false};
  ~OneCopyLink() {
    if (fd >= 0) ::close(fd);
  }
};

bool OneCopy::broken(const Link* l) { return l->broken.load(std::memory_order_acquire); }

// Marks l broken and closes its socket (REQUIRES: l->mu). QPs may still point to it: the
// object stays (dead_), only the fd goes, so a long-lived device keeps no fd per relink.
void OneCopy::retire_locked(Link& l) {
  l.broken.store(true, std::memory_order_release);
  if (l.fd >= 0) {
    (void)::epoll_ctl(ep_fd_, EPOLL_CTL_DEL, l.fd, nullptr);
    ::close(l.fd);
    l.fd = -1;
  }
  l.shared.clear();
}

std::string OneCopy::name_for(const wire::Endpoint& ep) {
  return "softrnic-oc/" + std::to_string(::geteuid()) + "/" + EndpointText(ep).c_str();
}

std::unique_ptr<OneCopy> OneCopy::open(const wire::Endpoint& local, std::string* err) {
  std::unique_ptr<OneCopy> oc(new OneCopy());
  oc->listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un a;
  const socklen_t al = abstract_addr(name_for(local), &a);
  oc->ep_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = oc->listen_fd_;
  if (oc->listen_fd_ < 0 || oc->ep_fd_ < 0 ||
      ::bind(oc->listen_fd_, reinterpret_cast<sockaddr*>(&a), al) != 0 ||
      ::listen(oc->listen_fd_, 64) != 0 ||
      ::epoll_ctl(oc->ep_fd_, EPOLL_CTL_ADD, oc->listen_fd_, &ev) != 0) {
    *err = std::string("one-copy: cannot listen on @") + name_for(local) + ": " +
           std::strerror(errno);
    return nullptr;
  }
  return oc;
}

OneCopy::~OneCopy() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (ep_fd_ >= 0) ::close(ep_fd_);
  for (InLink& in : in_) drop_link(in);
}

OneCopy::Link* OneCopy::link(const wire::Endpoint& peer) {
  const std::string name = name_for(peer);
  std::lock_guard lk(out_mu_);
  auto it = out_.find(name);
  const uint64_t now = wire::monotonic_ns();
  if (it != out_.end()) {
    Link* l = it->second.get();
    if (l == nullptr && now < it->second.retry_ns) return nullptr;
    if (l != nullptr) {
      // Still the device we linked to? One that closed (its process ended; another may now
      // hold its address) hangs up: link again, or its descriptors would carry a dead token.
      std::lock_guard ll(l->mu);
      pollfd p{l->fd, POLLRDHUP, 0};
      if (!broken(l) && l->fd >= 0 &&
          (::poll(&p, 1, 0) == 0 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0))
        return l;
      retire_locked(*l);
    }
    // QPs may still hold the old link (broken: they link again): it is kept, closed.
    if (it->second.link) dead_.push_back(std::move(it->second.link));
    out_.erase(it);
  }
  std::unique_ptr<Link> l = std::make_unique<Link>();
  // Non-blocking: a peer whose backlog is full (it is not accepting) is no peer; never wait
  // for it under the QP's send lock.
  l->fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un a;
  const socklen_t al = abstract_addr(name, &a);
  MsgHello h{kMagic, kMsgHello, kVersion, 0, 0};
  bool ok = l->fd >= 0 && ::connect(l->fd, reinterpret_cast<sockaddr*>(&a), al) == 0 &&
            same_user(l->fd) && ::getrandom(&h.token, sizeof h.token, 0) == sizeof h.token &&
            h.token != 0 && ::send(l->fd, &h, sizeof h, MSG_NOSIGNAL) == sizeof h;
  if (!ok) {
    RNIC_LOG(kDebug, "one-copy: no link to @%s (%s): payloads go by value", name.c_str(),
             std::strerror(errno));
    out_.emplace(name, Out{nullptr, now + kRetryNs});  // asked again a second later
    return nullptr;
  }
  l->token = h.token;
  // The engine's epoll set sees the peer hang up (service() retires the link then).
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = kOutTag | static_cast<uint32_t>(l->fd);
  (void)::epoll_ctl(ep_fd_, EPOLL_CTL_ADD, l->fd, &ev);
  RNIC_LOG(kInfo, "one-copy: linked to @%s", name.c_str());
  return out_.emplace(name, Out{std::move(l), 0}).first->second.get();
}

uint64_t OneCopy::token(const Link* l) { return l->token; }

bool OneCopy::share(Link* l, const std::shared_ptr<const PinBacking>& b) {
  std::lock_guard lk(l->mu);
  if (broken(l)) return false;
  if (l->shared.count(b->id) != 0) return true;
  // The peer maps what it is given until told otherwise: tell it about memfds gone here.
  MsgForget f{kMagic, kMsgForget, 0, 0, {}};
  for (auto it = l->shared.begin(); it != l->shared.end() && f.n < kMaxForget;) {
    if (it->second.expired()) {
      f.ids[f.n++] = it->first;
      it = l->shared.erase(it);
    } else {
      ++it;
    }
  }
  if (f.n != 0) {
    const size_t len = offsetof(MsgForget, ids) + f.n * sizeof(uint32_t);
    if (::send(l->fd, &f, len, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(len)) {
      if (errno != EAGAIN) {
        retire_locked(*l);
        return false;
      }
      for (uint32_t i = 0; i < f.n; ++i) l->shared.emplace(f.ids[i], std::weak_ptr<const PinBacking>());
      return false;
    }
  }
  // The peer gets the memfd read-only: a descriptor of it is all it needs.
  char path[48];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", b->fd);
  const int ro = ::open(path, O_RDONLY | O_CLOEXEC);
  if (ro < 0) return false;
  MsgShare m{kMagic, kMsgShare, b->id, 0, b->size};
  iovec iov{&m, sizeof m};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &ro, sizeof(int));
  const bool sent = ::sendmsg(l->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof m);
  const int err = errno;
  ::close(ro);
  if (!sent) {
    if (err != EAGAIN) retire_locked(*l);
    return false;
  }
  l->shared.emplace(b->id, b);
  return true;
}

// ---------------------------------------------------------------- responder side

size_t OneCopy::imports() const {
  std::lock_guard lk(in_mu_);
  size_t n = 0;
  for (const InLink& in : in_) n += in.map.size();
  return n;
}

void OneCopy::drop_link(InLink& in) {
  for (auto& [id, im] : in.map) ::munmap(const_cast<uint8_t*>(im.base), im.size);
  in.map.clear();
  if (in.fd >= 0) ::close(in.fd);
  in.fd = -1;
}

bool OneCopy::read_link(InLink& in) {
  for (;;) {
    union {
      MsgHello h;
      MsgShare s;
      MsgForget f;
    } m;
    iovec iov{&m, sizeof m};
    alignas(cmsghdr) char ctl[CMSG_SPACE(4 * sizeof(int))];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    const ssize_t n = ::recvmsg(in.fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    if (n == 0) return false;  // the peer device closed
    int fd = -1;
    bool bad = (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; ++i) {
        int x;
        std::memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof x);
        if (fd < 0 && i == 0) {
          fd = x;
        } else {
          ::close(x);
          bad = true;
        }
      }
    }
    const auto un = static_cast<size_t>(n);
    const uint32_t type = un >= 8 ? m.h.type : 0;
    if (un < 8 || m.h.magic != kMagic) bad = true;
    if (!bad && in.token == 0) {
      // The first message is the hello, and only the first.
      bad = type != kMsgHello || un != sizeof(MsgHello) || m.h.version != kVersion ||
            m.h.token == 0 || fd >= 0;
      if (!bad) in.token = m.h.token;
    } else if (!bad && type == kMsgShare && un == sizeof(MsgShare) && fd >= 0) {
      // Map what the peer shares, read-only, once it proves to be a memfd sealed against
      // shrinking and at least as long as announced (so the mapping never faults).
      struct stat st {};
      const int seals = ::fcntl(fd, F_GET_SEALS);
      struct statfs fs {};
      // Only a tmpfs memfd (not hugetlbfs, where a hole can fault) sealed against shrinking.
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || ::fstatfs(fd, &fs) != 0 ||
          fs.f_type != TMPFS_MAGIC || seals < 0 ||
          (seals & F_SEAL_SHRINK) == 0 || m.s.size == 0 ||
          static_cast<uint64_t>(st.st_size) < m.s.size) {
        RNIC_LOG(kWarn, "one-copy: a peer shared an unsealed or short file; link closed");
        bad = true;
      } else {
        void* p = ::mmap(nullptr, m.s.size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
          RNIC_LOG(kWarn, "one-copy: cannot map a peer's memory: %s", std::strerror(errno));
        } else {
          (void)::madvise(p, m.s.size, MADV_DONTFORK);
          auto [it, fresh] = in.map.try_emplace(m.s.id);
          if (!fresh) ::munmap(const_cast<uint8_t*>(it->second.base), it->second.size);
          it->second = Import{static_cast<const uint8_t*>(p), m.s.size};
        }
      }
    } else if (!bad && type == kMsgForget && un >= offsetof(MsgForget, ids) &&
               m.f.n <= kMaxForget && un == offsetof(MsgForget, ids) + m.f.n * sizeof(uint32_t) &&
               fd < 0) {
      for (uint32_t i = 0; i < m.f.n; ++i) {
        auto it = in.map.find(m.f.ids[i]);
        if (it == in.map.end()) continue;
        ::munmap(const_cast<uint8_t*>(it->second.base), it->second.size);
        in.map.erase(it);
      }
    } else {
      bad = true;
    }
    if (fd >= 0) ::close(fd);
    if (bad) return false;
  }
}

void OneCopy::pump() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    if (!same_user(fd)) {
      RNIC_LOG(kWarn, "one-copy: refused a peer of another user");
      ::close(fd);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(ep_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      continue;
    }
    in_.push_back(InLink{fd, 0, {}});
  }
  for (size_t i = 0; i < in_.size();) {
    if (read_link(in_[i])) {
      ++i;
      continue;
    }
    drop_link(in_[i]);
    in_[i] = std::move(in_.back());
    in_.pop_back();
  }
}

void OneCopy::service() {
  // Peers we linked to that hung up: their links retire (QPs on them link again).
  epoll_event evs[16];
  const int n = ::epoll_wait(ep_fd_, evs, 16, 0);
  for (int i = 0; i < n; ++i) {
    if ((evs[i].data.u64 & kOutTag) == 0) continue;
    const int fd = static_cast<int>(static_cast<uint32_t>(evs[i].data.u64));
    std::lock_guard lk(out_mu_);
    for (auto& [name, o] : out_) {
      if (!o.link) continue;
      std::lock_guard ll(o.link->mu);
      if (o.link->fd == fd) retire_locked(*o.link);
    }
  }
  std::lock_guard lk(in_mu_);
  pump();
}

void OneCopy::drop_links_for_test() {
  std::lock_guard lk(in_mu_);
  for (InLink& in : in_) drop_link(in);
  in_.clear();
}

const uint8_t* OneCopy::resolve(const OneCopyDesc& d) {
  std::lock_guard lk(in_mu_);
  if (fail_for_test_.load(std::memory_order_relaxed) != 0) {
    fail_for_test_.fetch_sub(1, std::memory_order_relaxed);
    return nullptr;
  }
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) pump();  // a share always precedes the first packet naming it
    for (InLink& in : in_) {
      if (in.token != d.token) continue;
      auto it = in.map.find(d.id);
      if (it == in.map.end()) break;
      const Import& im = it->second;
      if (d.off > im.size || d.len > im.size - d.off) return nullptr;
      return im.base + d.off;
    }
  }
  return nullptr;
}

}  // namespace rnic::emu
