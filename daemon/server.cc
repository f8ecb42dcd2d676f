// daemon/server: softrnicd's event loop, slots and steering (server.h, daemon/proto/proto.h).
#include "daemon/server.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/hash.h"
#include "base/log.h"
#include "emu/objects/device.h"
#include "emu/services/control.h"

namespace rnic::daemon {

namespace {

// epoll tags: kind in the top byte, then device and slot (or the fd).
enum : uint64_t { kTagListen = 1, kTagStop = 2, kTagClient = 3, kTagOwn = 4, kTagFree = 5, kTagPid = 6 };
uint64_t tag(uint64_t kind, uint64_t dev = 0, uint64_t slot = 0, uint64_t fd = 0) {
  return kind << 56 | dev << 48 | slot << 32 | (fd & 0xffffffffu);
}

uint64_t ms_on(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}
uint64_t now_ms() { return ms_on(CLOCK_REALTIME); }  // wall clock, for people (since_ms)

// The CM agent's cm::kRelistenWindowMs (emu/cm/agent.h; the daemon's layer does not include
// emu/cm): a REQ for a service whose listen ended this recently goes to that listener's slot.
constexpr uint64_t kRelistenWindowMs = 1000;
// True while a listen that ended at `ended_ms` (CLOCK_MONOTONIC) may still come back.
bool within_relisten_window(uint64_t ended_ms, uint64_t now = ms_on(CLOCK_MONOTONIC)) {
  return now - ended_ms <= kRelistenWindowMs;
}

}  // namespace

namespace {

int pidfd_open_(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o + "\"";
}

}  // namespace

std::unique_ptr<Server> Server::open(const ServerOptions& opt, std::string* err) {
  std::unique_ptr<Server> s(new Server());
  s->opt_ = opt;
  if (s->opt_.max_clients == 0 || s->opt_.max_clients > 254) s->opt_.max_clients = 254;
  if (opt.devices.empty() || opt.devices.size() > kMaxDevices) {
    *err = "between 1 and " + std::to_string(kMaxDevices) + " devices (--ip/--interface)";
    return nullptr;
  }
  s->ep_ = epoll_create1(EPOLL_CLOEXEC);
  s->stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->ep_ < 0 || s->stop_fd_ < 0) {
    *err = std::string("epoll/eventfd: ") + std::strerror(errno);
    return nullptr;
  }
  s->devs_.reserve(opt.devices.size());
  for (size_t i = 0; i < opt.devices.size(); ++i) {
    if (!s->add_device(opt.devices[i], i, err)) return nullptr;
  }
  // The control socket.
  std::string dir = opt.runtime_dir.empty() ? emu::control_runtime_dir() : opt.runtime_dir;
  if (opt.system) {
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      *err = dir + ": " + std::strerror(errno);
      return nullptr;
    }
  } else if (std::string e = emu::check_runtime_dir(dir, true, geteuid()); !e.empty()) {
    *err = e;
    return nullptr;
  }
  s->path_ = dir + "/" + kSocketName;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (s->path_.size() >= sizeof sa.sun_path) {
    *err = s->path_ + ": path too long";
    return nullptr;
  }
  std::memcpy(sa.sun_path, s->path_.c_str(), s->path_.size() + 1);
  s->listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->listen_fd_ < 0) {
    *err = std::string("socket: ") + std::strerror(errno);
    return nullptr;
  }
  // A live daemon answers on the path: refuse to steal it; a stale file is replaced.
  int probe = connect_daemon(dir);
  if (probe >= 0) {
    close(probe);
    *err = s->path_ + ": another softrnicd is serving it";
    s->path_.clear();
    return nullptr;
  }
  unlink(s->path_.c_str());
  if (bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      chmod(s->path_.c_str(), opt.system ? 0666 : 0600) != 0 || listen(s->listen_fd_, 64) != 0) {
    *err = s->path_ + ": " + std::strerror(errno);
    return nullptr;
  }
  s->spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  s->watch(s->listen_fd_, tag(kTagListen));
  s->watch(s->stop_fd_, tag(kTagStop));
  return s;
}

Server::~Server() {
  for (auto& [fd, c] : clients_) close(fd);
  for (Device& d : devs_) {
    for (Slot& sl : d.slots) {
      if (sl.pidfd >= 0) close(sl.pidfd);
      if (sl.cm_tx >= 0) close(sl.cm_tx);
      if (sl.cm_rx >= 0) close(sl.cm_rx);
    }
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    if (!path_.empty()) unlink(path_.c_str());
  }
  if (spare_fd_ >= 0) close(spare_fd_);
  if (ep_ >= 0) close(ep_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void Server::stop() {
  uint64_t one = 1;
  ssize_t w = write(stop_fd_, &one, sizeof one);
  (void)w;
}

void Server::watch(int fd, uint64_t t) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = t;
  (void)epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
}

void Server::unwatch(int fd) { (void)epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr); }

bool Server::add_device(const DeviceSpec& spec, size_t index, std::string* err) {
  // The GID table exactly as a client's device computes it (emu's own code), so socket i of
  // every slot is the address of GID i.
  emu::DeviceConfig dc;
  dc.name = spec.name.empty() ? "softrnic" + std::to_string(index) : spec.name;
  dc.ip = spec.ip;
  dc.active_mtu = spec.active_mtu;
  auto r = emu::Device::open(dc);
  if (!r.has_value()) {
    *err = "device " + dc.name + " on " + spec.ip + ": " + std::strerror(static_cast<int>(r.error()));
    return false;
  }
  std::shared_ptr<emu::Device> probe = std::move(r.value());
  Device d;
  std::snprintf(d.info.name, sizeof d.info.name, "%s", dc.name.c_str());
  std::snprintf(d.info.ip, sizeof d.info.ip, "%s", spec.ip.c_str());
  d.info.active_mtu = spec.active_mtu;
  // One node GUID for the device, whoever opens it.
  const uint64_t h = base::fnv1a64(dc.name + "/" + spec.ip + "/" + std::to_string(getpid()) + "/" +
                                   std::to_string(now_ms()));
  d.info.node_guid = (h & 0x0000ffffffffffffull) | 0x0200000000000000ull;
  for (const emu::GidEntry& g : probe->gids()) {
    wire::Endpoint e = g.addr;
    e.port = wire::kRoceUdpPort;
    d.addrs.push_back(e);
  }
  probe->close();
  if (d.addrs.empty() || d.addrs.size() > kMaxFds) {
    *err = "device " + dc.name + ": no usable address";
    return false;
  }
  // GSO batches are safe only where they are never cut (docs/wire.md §4): loopback.
  d.gso = emu::ip_on_loopback(spec.ip);
  d.info.gso = d.gso ? 1 : 0;
  d.info.nfds = static_cast<uint32_t>(d.addrs.size());
  wire::UdpPortOptions o;
  o.bind = d.addrs[0];
  o.more.assign(d.addrs.begin() + 1, d.addrs.end());
  o.reuseport = true;
  o.gro = false;
  o.rcvbuf = 1 << 20;
  o.sndbuf = 1 << 20;
  int e = 0;
  d.own = wire::UdpPort::open(o, &e);
  if (!d.own && !o.more.empty()) {
    // An address that cannot be bound (a tentative IPv6 address still in DAD, ...): serve the
    // primary address alone, as an embedded device does (its clients then list GID 0 only).
    RNIC_LOG(kWarn, "softrnicd: %s: cannot bind every GID's address (%s): only %s", dc.name.c_str(),
             std::strerror(e), spec.ip.c_str());
    d.addrs.resize(1);
    d.info.nfds = 1;
    o.more.clear();
    d.own = wire::UdpPort::open(o, &e);
  }
  if (!d.own) {
    *err = "device " + dc.name + ": cannot bind UDP " + spec.ip + " port 4791: " + std::strerror(e);
    return false;
  }
  d.slots.resize(1);  // slot 0 is the daemon's own socket
  devs_.push_back(std::move(d));
  Device& dd = devs_.back();
  if (int rc = attach_steering(dd); rc != 0) {
    *err = "device " + dc.name + ": SO_ATTACH_REUSEPORT_CBPF: " + std::strerror(rc);
    return false;
  }
  for (size_t i = 0; i < dd.own->sockets(); ++i) watch(dd.own->fd(i), tag(kTagOwn, index, 0, i));
  return true;
}

// The steering program of every address group of `d`: A = byte 5 of the UDP payload (the
// top byte of the BTH destination QPN, the slot); a slot not yet created -> socket 0. A
// datagram shorter than 6 bytes makes the load fail, which returns 0: socket 0 too.
int Server::attach_steering(Device& d) {
  const uint32_t n = static_cast<uint32_t>(d.slots.size());  // sockets in each group
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 5),
      BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, n, 1, 0),
      BPF_STMT(BPF_RET | BPF_A, 0),
      BPF_STMT(BPF_RET | BPF_K, 0),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
  for (size_t i = 0; i < d.own->sockets(); ++i) {
    if (setsockopt(d.own->fd(i), SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) != 0) {
      return errno;
    }
  }
  return 0;
}

int Server::new_slot(Device& d) {
  if (d.slots.size() > opt_.max_clients) return -EUSERS;
  wire::UdpPortOptions o;
  o.bind = d.addrs[0];
  o.more.assign(d.addrs.begin() + 1, d.addrs.end());
  o.reuseport = true;
  int e = 0;
  std::unique_ptr<wire::UdpPort> p = wire::UdpPort::open(o, &e);
  if (!p) return -(e != 0 ? e : EIO);
  Slot s;
  s.port = std::move(p);
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) return -errno;
  s.cm_tx = sp[0];
  s.cm_rx = sp[1];
  int big = 1 << 20;
  (void)setsockopt(s.cm_tx, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  (void)fcntl(s.cm_tx, F_SETFL, O_NONBLOCK);
  d.slots.push_back(std::move(s));
  if (int rc = attach_steering(d); rc != 0) {
    RNIC_LOG(kError, "softrnicd: %s: steering program: %s", d.info.name, std::strerror(rc));
  }
  return static_cast<int>(d.slots.size() - 1);
}

void Server::drain(int fd, uint64_t* counter) {
  char buf[256];
  for (;;) {
    ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
    if (r < 0) {
      if (errno == EINTR) continue;
      return;
    }
    ++*counter;
  }
}

void Server::free_slot(Device& d, int slot) {
  Slot& s = d.slots[slot];
  s.client = -1;
  if (s.pidfd >= 0) {
    unwatch(s.pidfd);
    close(s.pidfd);
    s.pidfd = -1;
  }
  const size_t di = static_cast<size_t>(&d - devs_.data());
  for (size_t i = 0; i < s.port->sockets(); ++i) {
    drain(s.port->fd(i), &drop_free_slot_);
    watch(s.port->fd(i), tag(kTagFree, di, slot, i));
  }
}

// Whether process `pid` still holds a descriptor of one of `port`'s sockets (its
// /proc/<pid>/fd links name "socket:[inode]"). Unreadable counts as holding.
static bool holds_socket(pid_t pid, const wire::UdpPort& port) {
  std::set<std::string> want;
  for (size_t i = 0; i < port.sockets(); ++i) {
    struct stat st;
    if (fstat(port.fd(i), &st) == 0) want.insert("socket:[" + std::to_string(st.st_ino) + "]");
  }
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dp = opendir(dir.c_str());
  if (dp == nullptr) return errno != ENOENT;
  bool held = false;
  while (dirent* e = readdir(dp)) {
    if (e->d_name[0] == '.') continue;
    char link[64] = {};
    ssize_t n = readlink((dir + "/" + e->d_name).c_str(), link, sizeof link - 1);
    if (n > 0 && want.count(std::string(link, size_t(n))) != 0) {
      held = true;
      break;
    }
  }
  closedir(dp);
  return held;
}

// A client left. Its sockets are handed on only once no descriptor of them is left in its
// process (a clean close has closed them; a crash closes them as the process exits), so a
// client that closes the connection but keeps a socket cannot read the next client's
// traffic: then the slot waits for the process to exit.
void Server::release_slot(Device& d, int slot, pid_t pid) {
  Slot& s = d.slots[slot];
  s.client = -1;
  int pfd = pid > 0 ? pidfd_open_(pid) : -1;
  if (pfd < 0 || !holds_socket(pid, *s.port)) {
    if (pfd >= 0) close(pfd);
    free_slot(d, slot);
    return;
  }
  s.pidfd = pfd;
  watch(pfd, tag(kTagPid, static_cast<size_t>(&d - devs_.data()), slot));
}

void Server::on_accept() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
      // Out of descriptors (many connections): a pending connection would keep the listening
      // socket readable and the loop spinning. Refuse it with the descriptor kept for this.
      close(spare_fd_);
      fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) close(fd);
      spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      ++refused_;
      if (fd < 0) return;
      continue;
    }
    if (fd < 0) return;
    ucred cr{};
    socklen_t l = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) != 0 ||
        (!opt_.system && cr.uid != geteuid() && geteuid() != 0)) {
      ++refused_;
      close(fd);
      continue;
    }
    Client c;
    c.fd = fd;
    c.pid = cr.pid;
    c.uid = cr.uid;
    c.since_ms = now_ms();
    clients_[fd] = c;
    ++clients_total_;
    watch(fd, tag(kTagClient, 0, 0, static_cast<uint64_t>(fd)));
  }
}

void Server::drop_client(int fd, const char* why) {
  auto it = clients_.find(fd);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (c.dev >= 0) {
    Device& d = devs_[c.dev];
    for (uint64_t sid : c.services) d.services.erase(sid);
    std::erase_if(d.unlistened, [&](const auto& kv) { return kv.second.first == c.slot; });
    RNIC_LOG(kInfo, "softrnicd: %s: client pid %d left slot %d (%s)", d.info.name, int(c.pid), c.slot, why);
    release_slot(d, c.slot, c.pid);
  }
  unwatch(fd);
  close(fd);
  clients_.erase(it);
}

void Server::on_client(int fd) {
  alignas(8) uint8_t buf[kMaxMsg];
  for (;;) {
    auto it = clients_.find(fd);
    if (it == clients_.end()) return;
    ssize_t r = recv_msg(fd, buf, sizeof buf);
    if (r == -EAGAIN || r == -EWOULDBLOCK) return;
    if (r == 0) {
      drop_client(fd, "closed");
      return;
    }
    if (r < 0) {
      if (r == -EPROTO) ++bad_messages_;
      drop_client(fd, "receive error");
      return;
    }
    bool close_it = false;
    handle(it->second, buf, static_cast<size_t>(r), &close_it);
    if (close_it) {
      ++bad_messages_;
      drop_client(fd, "malformed message");
      return;
    }
  }
}

void Server::handle(Client& c, const uint8_t* buf, size_t len, bool* close_it) {
  Header h;
  std::memcpy(&h, buf, sizeof h);
  auto need = [&](size_t n) {
    if (len != n) *close_it = true;
    return len == n;
  };
  switch (static_cast<MsgType>(h.type)) {
    case MsgType::kHello: {
      HelloMsg m;
      if (!need(sizeof m)) return;
      std::memcpy(&m, buf, sizeof m);
      if (m.version != kProtoVersion || c.hello) {
        *close_it = true;
        return;
      }
      c.hello = true;
      DevicesMsg out;
      init_msg(&out, MsgType::kDevices);
      out.count = static_cast<uint32_t>(devs_.size());
      for (size_t i = 0; i < devs_.size(); ++i) out.dev[i] = devs_[i].info;
      (void)send_msg(c.fd, &out, sizeof out);
      return;
    }
    case MsgType::kOpen: {
      OpenMsg m;
      if (!need(sizeof m) || !c.hello || c.dev >= 0) {
        *close_it = true;
        return;
      }
      std::memcpy(&m, buf, sizeof m);
      OpenedMsg out;
      init_msg(&out, MsgType::kOpened);
      if (m.index >= devs_.size()) {
        out.err = ENODEV;
        (void)send_msg(c.fd, &out, sizeof out);
        return;
      }
      Device& d = devs_[m.index];
      int slot = -1;
      for (size_t s = 1; s < d.slots.size(); ++s) {
        if (d.slots[s].client < 0 && d.slots[s].pidfd < 0) {
          slot = static_cast<int>(s);
          break;
        }
      }
      if (slot < 0) slot = new_slot(d);
      if (slot < 0) {
        ++refused_;
        out.err = -slot;
        (void)send_msg(c.fd, &out, sizeof out);
        return;
      }
      Slot& s = d.slots[slot];
      int fds[kMaxFds];
      size_t nfds = 0;
      for (size_t i = 0; i < s.port->sockets(); ++i) {
        unwatch(s.port->fd(i));
        drain(s.port->fd(i), &drop_free_slot_);  // whatever a previous owner left behind
        fds[nfds++] = s.port->fd(i);
      }
      drain(s.cm_rx, &drop_free_slot_);
      fds[nfds++] = s.cm_rx;
      s.client = c.fd;
      c.dev = static_cast<int>(m.index);
      c.slot = slot;
      out.slot = static_cast<uint32_t>(slot);
      out.max_qp = opt_.max_qp;
      out.max_mr = opt_.max_mr;
      out.nfds = static_cast<uint32_t>(s.port->sockets());
      out.side = 1;
      if (send_msg(c.fd, &out, sizeof out, fds, nfds) != 0) *close_it = true;
      RNIC_LOG(kInfo, "softrnicd: %s: pid %d opened slot %d", d.info.name, int(c.pid), slot);
      return;
    }
    case MsgType::kListen:
    case MsgType::kUnlisten: {
      ServiceMsg m;
      if (!need(sizeof m) || c.dev < 0) {
        *close_it = true;
        return;
      }
      std::memcpy(&m, buf, sizeof m);
      Device& d = devs_[c.dev];
      ReplyMsg out;
      init_msg(&out, MsgType::kReply);
      out.seq = m.seq;
      if (static_cast<MsgType>(h.type) == MsgType::kListen) {
        auto it = d.services.find(m.service_id);
        if (it != d.services.end() && it->second != c.slot) {
          out.err = EADDRINUSE;
        } else {
          d.services[m.service_id] = c.slot;
          c.services.insert(m.service_id);
          d.unlistened.erase(m.service_id);
        }
      } else {
        auto it = d.services.find(m.service_id);
        if (it != d.services.end() && it->second == c.slot) {
          d.services.erase(it);
          const uint64_t now = ms_on(CLOCK_MONOTONIC);
          std::erase_if(d.unlistened, [&](const auto& kv) {
            return !within_relisten_window(kv.second.second, now);
          });
          d.unlistened[m.service_id] = {c.slot, now};
        }
        c.services.erase(m.service_id);
      }
      (void)send_msg(c.fd, &out, sizeof out);
      return;
    }
    case MsgType::kStatus: {
      if (!need(sizeof(Header))) return;
      std::string js = status_json();
      std::vector<uint8_t> out(sizeof(Header) + js.size());
      Header oh{static_cast<uint32_t>(MsgType::kStatusText), static_cast<uint32_t>(out.size())};
      std::memcpy(out.data(), &oh, sizeof oh);
      std::memcpy(out.data() + sizeof oh, js.data(), js.size());
      (void)send_msg(c.fd, out.data(), out.size());
      return;
    }
    default:
      *close_it = true;
      return;
  }
}

std::string Server::status_json() const {
  std::string o = "{\"pid\":" + std::to_string(getpid()) + ",\"socket\":" + json_str(path_) +
                  ",\"clients_total\":" + std::to_string(clients_total_) +
                  ",\"refused\":" + std::to_string(refused_) +
                  ",\"bad_messages\":" + std::to_string(bad_messages_) +
                  ",\"drop_free_slot\":" + std::to_string(drop_free_slot_) +
                  ",\"drop_cm_unrouted\":" + std::to_string(drop_cm_unrouted_) +
                  ",\"cm_routed\":" + std::to_string(cm_routed_) + ",\"devices\":[";
  for (size_t i = 0; i < devs_.size(); ++i) {
    const Device& d = devs_[i];
    if (i) o += ",";
    size_t used = 0, waiting = 0;
    for (const Slot& s : d.slots) {
      used += s.client >= 0;
      waiting += s.pidfd >= 0;
    }
    o += "{\"name\":" + json_str(d.info.name) + ",\"ip\":" + json_str(d.info.ip) +
         ",\"gids\":" + std::to_string(d.addrs.size()) +
         ",\"slots_created\":" + std::to_string(d.slots.size() - 1) +
         ",\"slots_in_use\":" + std::to_string(used) +
         ",\"slots_waiting_exit\":" + std::to_string(waiting) +
         ",\"services\":" + std::to_string(d.services.size()) + ",\"clients\":[";
    bool first = true;
    for (const auto& [fd, c] : clients_) {
      if (c.dev != static_cast<int>(i)) continue;
      if (!first) o += ",";
      first = false;
      o += "{\"pid\":" + std::to_string(c.pid) + ",\"uid\":" + std::to_string(c.uid) +
           ",\"slot\":" + std::to_string(c.slot) + ",\"since_ms\":" + std::to_string(c.since_ms) +
           ",\"services\":" + std::to_string(c.services.size()) + "}";
    }
    o += "]}";
  }
  return o + "]}";
}

// The slot a QP1 datagram belongs to (IBA 12.6 message layouts; cm-notes §3), or 0:
//  - REQ, SIDR_REQ: the client listening on its Service ID; with none, the client whose listen
//    on it ended less than kRelistenWindowMs ago (its CM holds the REQ for a new listen),
//    else the first client (its CM answers REJ "invalid service ID" / SIDR status 1, as one
//    device's CM would);
//  - every other CM message names our comm ID (REP, RTU, REJ, MRA, DREQ, DREP, LAP, APR: the
//    Remote Comm ID; SIDR_REP: the Request ID), whose top byte is the client's slot
//    (cm::AgentOptions::comm_id_prefix);
//  - anything else (other classes, ClassPortInfo): the first client, whose CM counts it.
int Server::route_cm(const Device& d, const uint8_t* p, size_t len) const {
  auto first_client = [&] {
    for (size_t s = 1; s < d.slots.size(); ++s) {
      if (d.slots[s].client >= 0) return static_cast<int>(s);
    }
    return 0;
  };
  constexpr size_t kMad = 12 + 8;  // BTH + DETH
  if (len < kMad + 24 + 16) return first_client();
  const uint8_t* mad = p + kMad;
  const uint8_t* data = mad + 24;
  if (mad[1] != 0x07) return first_client();  // not the CM class
  const uint16_t attr = static_cast<uint16_t>(mad[16] << 8 | mad[17]);
  auto be64 = [](const uint8_t* b) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | b[i];
    return v;
  };
  switch (attr) {
    case 0x0010:    // REQ
    case 0x0017: {  // SIDR_REQ
      const uint64_t sid = be64(data + 8);
      auto it = d.services.find(sid);
      if (it != d.services.end()) return it->second;
      // A listen that ended just now: its process may listen again (agent.h, Passive).
      auto u = d.unlistened.find(sid);
      if (u != d.unlistened.end() && within_relisten_window(u->second.second) &&
          d.slots[u->second.first].client >= 0)
        return u->second.first;
      return first_client();
    }
    case 0x0018:  // SIDR_REP: Request ID
      return data[0];
    case 0x0011: case 0x0012: case 0x0013: case 0x0014:
    case 0x0015: case 0x0016: case 0x0019: case 0x001A:  // Remote Comm ID
      return data[4];
    default:
      return first_client();
  }
}

void Server::on_own(Device& d) {
  // QP1 datagrams (and anything no slot takes): each to the client it belongs to, over its
  // CM channel, as it arrived; the client's engine checks it like any datagram.
  alignas(8) static uint8_t bufs[16][4096 + 256];
  wire::RxDesc descs[16];
  for (int round = 0; round < 64; ++round) {
    for (size_t i = 0; i < 16; ++i) {
      descs[i] = wire::RxDesc{};
      descs[i].buf = bufs[i];
      descs[i].cap = sizeof bufs[i];
    }
    int n = d.own->recv_batch(descs);
    if (n <= 0) return;
    for (int i = 0; i < n; ++i) {
      const wire::RxDesc& x = descs[i];
      int slot = x.truncated ? 0 : route_cm(d, x.buf, x.len);
      if (slot <= 0 || static_cast<size_t>(slot) >= d.slots.size() || d.slots[slot].client < 0) {
        ++drop_cm_unrouted_;
        continue;
      }
      wire::SideFrame f;
      f.ipv6 = x.src.ipv6 ? 1 : 0;
      std::memcpy(f.src_addr, x.src.addr, 16);
      std::memcpy(f.dst_addr, x.dst.addr, 16);
      f.src_port = x.src.port;
      f.dst_index = x.dst.src_index;
      f.tos = x.tos;
      f.scope_id = x.src.scope_id;
      iovec iov[2] = {{&f, sizeof f}, {x.buf, x.len}};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = 2;
      if (sendmsg(d.slots[slot].cm_tx, &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
        ++drop_cm_unrouted_;
      } else {
        ++cm_routed_;
      }
    }
  }
}

int Server::run() {
  epoll_event evs[64];
  for (;;) {
    int n = epoll_wait(ep_, evs, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t t = evs[i].data.u64;
      const uint64_t kind = t >> 56;
      const size_t dev = (t >> 48) & 0xff;
      const int slot = static_cast<int>((t >> 32) & 0xffff);
      const int fd = static_cast<int>(t & 0xffffffffu);
      switch (kind) {
        case kTagStop:
          return 0;
        case kTagListen:
          on_accept();
          break;
        case kTagClient:
          on_client(fd);
          break;
        case kTagOwn:
          on_own(devs_[dev]);
          break;
        case kTagFree:
          if (devs_[dev].slots[slot].client < 0) {
            drain(devs_[dev].slots[slot].port->fd(static_cast<size_t>(fd)), &drop_free_slot_);
          }
          break;
        case kTagPid:
          free_slot(devs_[dev], slot);
          break;
      }
    }
  }
}

}  // namespace rnic::daemon
