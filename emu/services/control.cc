// Control socket: request execution, the epoll-driven server, the blocking client and the
// discovery of live sockets in the runtime directory. Control path only (allocates freely).
#include "emu/services/control.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "base/config.h"

namespace rnic::emu {
namespace {

constexpr size_t kMaxPendingOutput = 4u << 20;  // a client that never reads is dropped
constexpr int kMaxReadsPerEvent = 16;           // fairness between clients

std::string errno_text(int e) { return std::strerror(e); }

// One line for a status message: newlines would break the framing.
std::string one_line(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (char c : s) {
    if (c == '\n') {
      r += "; ";
    } else if (c == '\r' || c == '\0') {
      r += ' ';
    } else {
      r += c;
    }
  }
  while (!r.empty() && (r.back() == ' ' || r.back() == ';')) r.pop_back();
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Splits off the first whitespace-delimited word.
std::string_view next_word(std::string_view* s) {
  *s = trim(*s);
  size_t n = 0;
  while (n < s->size() && (*s)[n] != ' ' && (*s)[n] != '\t') ++n;
  std::string_view w = s->substr(0, n);
  s->remove_prefix(n);
  *s = trim(*s);
  return w;
}

bool parse_u32(std::string_view s, uint32_t* v) {
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, base);
  return ec == std::errc() && p == s.data() + s.size();
}

struct Response {
  std::string text;
  void line(std::string_view l) {
    // Data lines never contain '\n' (split them) and are dot-stuffed.
    size_t start = 0;
    while (true) {
      size_t nl = l.find('\n', start);
      std::string_view part = l.substr(start, nl == std::string_view::npos ? nl : nl - start);
      if (!part.empty() && part.front() == '.') text += '.';
      text.append(part);
      text += '\n';
      if (nl == std::string_view::npos) break;
      start = nl + 1;
    }
  }
  std::string finish(std::string_view err) {
    text += ".\n";
    if (err.empty()) {
      text += "ok\n";
    } else {
      text += "err ";
      text += one_line(err);
      text += '\n';
    }
    return std::move(text);
  }
};

constexpr const char* kHelp[] = {
    "info",
    "help",
    "fault add PLAN",
    "fault list",
    "fault clear",
    "stats",
    "stats qp QPN",
    "capture start PATH",
    "capture stop",
};

std::string execute(ControlTarget& t, std::string_view req, Response& r) {
  for (char c : req) {
    auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f) return "bad request: control character in line";
  }
  std::string_view rest = req;
  std::string_view cmd = next_word(&rest);
  if (cmd.empty()) return "empty request (try 'help')";
  if (cmd == "help") {
    for (const char* h : kHelp) r.line(h);
    return "";
  }
  if (cmd == "info") {
    if (!rest.empty()) return "usage: info";
    r.line("device " + t.device_name());
    r.line("pid " + std::to_string(getpid()));
    return "";
  }
  if (cmd == "fault") {
    std::string_view sub = next_word(&rest);
    if (sub == "add") {
      if (rest.empty()) return "usage: fault add PLAN";
      return t.fault_add(rest);
    }
    if (sub == "list") {
      if (!rest.empty()) return "usage: fault list";
      for (const FaultRuleInfo& f : t.fault_list()) {
        r.line(std::to_string(f.id) + " fired=" + std::to_string(f.fired) +
               " matched=" + std::to_string(f.matched) + " " + one_line(f.text));
      }
      return "";
    }
    if (sub == "clear") {
      if (!rest.empty()) return "usage: fault clear";
      t.fault_clear();
      return "";
    }
    return "usage: fault add PLAN | fault list | fault clear";
  }
  if (cmd == "stats") {
    std::optional<uint32_t> qpn;
    if (!rest.empty()) {
      std::string_view k = next_word(&rest);
      std::string_view v = next_word(&rest);
      uint32_t q = 0;
      if (k != "qp" || v.empty() || !rest.empty()) return "usage: stats [qp QPN]";
      if (!parse_u32(v, &q) || q > 0xffffff) return "bad QPN '" + std::string(v) + "'";
      qpn = q;
    }
    StatList list;
    std::string err = t.stats(qpn, &list);
    if (!err.empty()) return err;
    for (const auto& [name, value] : list) r.line(name + " " + std::to_string(value));
    return "";
  }
  if (cmd == "capture") {
    std::string_view sub = next_word(&rest);
    if (sub == "start") {
      if (rest.empty()) return "usage: capture start PATH";
      if (rest.front() != '/') return "capture path must be absolute";
      return t.capture_start(rest);
    }
    if (sub == "stop") {
      if (!rest.empty()) return "usage: capture stop";
      return t.capture_stop();
    }
    return "usage: capture start PATH | capture stop";
  }
  return "unknown command '" + one_line(cmd.substr(0, 64)) + "' (try 'help')";
}

bool fill_sockaddr(const std::string& path, sockaddr_un* sa) {
  std::memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  if (path.size() >= sizeof(sa->sun_path)) return false;
  std::memcpy(sa->sun_path, path.c_str(), path.size() + 1);
  return true;
}

}  // namespace

void append_counter_stats(const Counters& c, StatList* out) {
  std::array<uint64_t, kNumCtrs> v = c.snapshot();
  for (size_t i = 0; i < kNumCtrs; ++i) {
    out->emplace_back(std::string(counter_name(static_cast<Ctr>(i))), v[i]);
  }
}

void append_fault_stats(const FaultCounters& f, StatList* out) {
  const std::pair<const char*, uint64_t> rows[] = {
      {"fault_packets", f.packets},         {"fault_examined", f.examined},
      {"fault_fired", f.fired},             {"fault_dropped", f.dropped},
      {"fault_duplicated", f.duplicated},   {"fault_delayed", f.delayed},
      {"fault_reordered", f.reordered},     {"fault_corrupted", f.corrupted},
      {"fault_rewritten", f.rewritten},     {"fault_truncated", f.truncated},
      {"fault_injected", f.injected},       {"fault_blackholed", f.blackholed},
      {"fault_inject_unresolved", f.inject_unresolved},
      {"fault_hold_overflow", f.hold_overflow}, {"fault_trace_overflow", f.trace_overflow},
  };
  for (const auto& [name, v] : rows) out->emplace_back(name, v);
}

std::string execute_control_request(ControlTarget& target, std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  Response r;
  std::string err = execute(target, line, r);
  if (!err.empty()) r.text.clear();  // a failed command returns no partial data
  return r.finish(err);
}

// ---- Runtime directory --------------------------------------------------------------

std::string control_runtime_dir() {
  // SOFTRNIC_RUNTIME_DIR / XDG_RUNTIME_DIR through base/config.h (paths: never invalid).
  static constexpr std::string_view kVars[] = {"SOFTRNIC_RUNTIME_DIR", "XDG_RUNTIME_DIR"};
  base::Config c;
  (void)base::parse_config(base::process_env(), &c, kVars);
  if (!c.runtime_dir.empty()) return c.runtime_dir;
  if (const std::string& x = c.xdg_runtime_dir; !x.empty()) {
    struct stat st;
    if (stat(x.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return x + "/softrnic";
  }
  return "/tmp/softrnic-" + std::to_string(geteuid());
}

std::string check_runtime_dir(const std::string& dir, bool create, uid_t uid) {
  if (dir.empty()) return "runtime directory: empty path";
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT || !create) {
      return "runtime directory " + dir + ": " + errno_text(errno);
    }
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return "cannot create runtime directory " + dir + ": " + errno_text(errno) +
             " (set SOFTRNIC_RUNTIME_DIR to a directory you own)";
    }
    if (lstat(dir.c_str(), &st) != 0) return "runtime directory " + dir + ": " + errno_text(errno);
  }
  if (S_ISLNK(st.st_mode)) return "runtime directory " + dir + " is a symlink; refusing to use it";
  if (!S_ISDIR(st.st_mode)) return "runtime directory " + dir + " is not a directory";
  if (st.st_uid != uid) {
    return "runtime directory " + dir + " is owned by uid " + std::to_string(st.st_uid) +
           ", not by us (uid " + std::to_string(uid) +
           "); refusing to use it (set SOFTRNIC_RUNTIME_DIR to a directory you own)";
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return "runtime directory " + dir + " has mode " + mode +
           " (group/other access); refusing to use it (chmod 700 " + dir + ")";
  }
  return "";
}

std::string control_socket_path(const std::string& dir, std::string_view device, pid_t pid) {
  std::string p = dir;
  if (p.empty() || p.back() != '/') p += '/';
  p.append(device);
  p += '.';
  p += std::to_string(pid);
  p += ".sock";
  return p;
}

// ---- Server -------------------------------------------------------------------------

std::unique_ptr<ControlServer> ControlServer::open(ControlTarget* target, std::string* err) {
  return open(target, Options{}, err);
}

std::unique_ptr<ControlServer> ControlServer::open(ControlTarget* target, const Options& opt,
                                                   std::string* err) {
  std::string name = target->device_name();
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    *err = "control socket: bad device name '" + name + "'";
    return nullptr;
  }
  std::unique_ptr<ControlServer> s(new ControlServer());
  s->target_ = target;
  s->opt_ = opt;
  if (s->opt_.runtime_dir.empty()) s->opt_.runtime_dir = control_runtime_dir();
  s->allowed_uid_ = opt.allowed_uid.value_or(geteuid());
  s->owner_pid_ = getpid();
  const std::string& dir = s->opt_.runtime_dir;
  if (std::string e = check_runtime_dir(dir, true, geteuid()); !e.empty()) {
    *err = "control socket: " + e;
    return nullptr;
  }
  s->path_ = control_socket_path(dir, name, s->owner_pid_);
  sockaddr_un sa;
  if (!fill_sockaddr(s->path_, &sa)) {
    *err = "control socket path too long (" + std::to_string(s->path_.size()) +
           " bytes): " + s->path_ + " (set SOFTRNIC_RUNTIME_DIR to a shorter directory)";
    s->path_.clear();
    return nullptr;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *err = "control socket: socket(): " + errno_text(errno);
    s->path_.clear();
    return nullptr;
  }
  s->listen_fd_ = fd;
  // Linux creates the socket file with the socket inode's mode (less the umask): setting it
  // before bind avoids a window in which the file is more open than 0600.
  (void)fchmod(fd, 0600);
  // A leftover file of the same name (an earlier process with our pid) is stale by definition.
  struct stat st;
  if (lstat(s->path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool live = probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      *err = "control socket " + s->path_ + " is in use (two devices named '" + name +
             "' in one process?)";
      s->path_.clear();
      return nullptr;
    }
    unlink(s->path_.c_str());
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    *err = "control socket: bind " + s->path_ + ": " + errno_text(errno);
    s->path_.clear();
    return nullptr;
  }
  if (chmod(s->path_.c_str(), 0600) != 0 || lstat(s->path_.c_str(), &st) != 0) {
    *err = "control socket: chmod " + s->path_ + ": " + errno_text(errno);
    return nullptr;  // the destructor removes the file
  }
  s->sock_dev_ = st.st_dev;
  s->sock_ino_ = st.st_ino;
  if (listen(fd, 16) != 0) {
    *err = "control socket: listen: " + errno_text(errno);
    return nullptr;
  }
  s->epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (s->epfd_ < 0) {
    *err = "control socket: epoll_create1: " + errno_text(errno);
    return nullptr;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(s->epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    *err = "control socket: epoll_ctl: " + errno_text(errno);
    return nullptr;
  }
  return s;
}

ControlServer::~ControlServer() {
  stop();
  while (!clients_.empty()) close_client(clients_.begin()->first);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (epfd_ >= 0) close(epfd_);
  if (stop_fd_ >= 0) close(stop_fd_);
  // Remove the file only if it is still the one we bound, and only in the process that
  // bound it.
  struct stat st;
  if (!path_.empty() && getpid() == owner_pid_ && lstat(path_.c_str(), &st) == 0 &&
      (sock_ino_ == 0 || (st.st_dev == sock_dev_ && st.st_ino == sock_ino_))) {
    unlink(path_.c_str());
  }
}

std::string ControlServer::start_thread() {
  if (thread_.joinable()) return "control server thread already running";
  if (stop_fd_ < 0) {
    stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd_ < 0) return "control server: eventfd: " + errno_text(errno);
  }
  thread_ = std::thread([this] { thread_main(); });
  return "";
}

void ControlServer::stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  ssize_t n = write(stop_fd_, &one, sizeof(one));
  (void)n;
  thread_.join();
  uint64_t v;
  n = read(stop_fd_, &v, sizeof(v));  // re-arm for a later start_thread()
}

void ControlServer::thread_main() {
  pollfd p[2] = {{epfd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (true) {
    int n = poll(p, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents) return;
    if (p[0].revents) handle_ready();
  }
}

void ControlServer::handle_ready() {
  epoll_event evs[32];
  int n = epoll_wait(epfd_, evs, 32, 0);
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.fd == listen_fd_) {
      accept_all();
    } else {
      serve_client(evs[i].data.fd, evs[i].events);
    }
  }
}

void ControlServer::accept_all() {
  while (true) {
    int cfd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (cfd < 0) return;  // EAGAIN, or a transient error: the next readiness retries
    ucred cred{};
    socklen_t len = sizeof(cred);
    std::string refuse;
    if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      refuse = "cannot read peer credentials";
    } else if (cred.uid != allowed_uid_) {
      refuse = "permission denied (peer uid " + std::to_string(cred.uid) + ")";
    } else if (clients_.size() >= opt_.max_clients) {
      // Full: first serve what the current clients have pending; those that have hung up
      // are closed by it (their hang-up may sit later in this epoll batch).
      std::vector<int> fds;
      for (const auto& kv : clients_) fds.push_back(kv.first);
      for (int f : fds) serve_client(f, EPOLLIN);
      if (clients_.size() >= opt_.max_clients) refuse = "too many control connections";
    }
    if (!refuse.empty()) {
      std::string msg = ".\nerr " + refuse + "\n";
      ssize_t w = send(cfd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)w;
      close(cfd);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = cfd;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, cfd, &ev) != 0) {
      close(cfd);
      continue;
    }
    clients_.emplace(cfd, Client{});
  }
}

void ControlServer::serve_client(int cfd, uint32_t events) {
  auto it = clients_.find(cfd);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (events & (EPOLLERR)) {
    close_client(cfd);
    return;
  }
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) {
    char buf[16384];
    for (int reads = 0; reads < kMaxReadsPerEvent && !c.eof; ++reads) {
      ssize_t got = recv(cfd, buf, sizeof(buf), MSG_DONTWAIT);
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EINTR) continue;
        close_client(cfd);
        return;
      }
      if (got == 0) {
        c.eof = true;
        break;
      }
      std::string_view data(buf, static_cast<size_t>(got));
      while (!data.empty()) {
        size_t nl = data.find('\n');
        if (c.discarding) {
          if (nl == std::string_view::npos) break;
          c.discarding = false;
          data.remove_prefix(nl + 1);
          continue;
        }
        if (nl == std::string_view::npos) {
          if (c.in.size() + data.size() > kMaxRequestLine) {
            c.in.clear();
            c.discarding = true;
            c.out += Response{}.finish("request line too long (max " +
                                       std::to_string(kMaxRequestLine) + " bytes)");
          } else {
            c.in.append(data);
          }
          break;
        }
        std::string_view part = data.substr(0, nl);
        data.remove_prefix(nl + 1);
        if (c.in.size() + part.size() > kMaxRequestLine) {
          c.in.clear();
          c.out += Response{}.finish("request line too long (max " +
                                     std::to_string(kMaxRequestLine) + " bytes)");
          continue;
        }
        c.in.append(part);
        c.out += execute_control_request(*target_, c.in);
        c.in.clear();
      }
      if (c.out.size() > kMaxPendingOutput) {
        close_client(cfd);
        return;
      }
    }
  }
  if (!flush_client(cfd, c)) return;
  if (c.eof && c.out.empty()) close_client(cfd);
}

bool ControlServer::flush_client(int cfd, Client& c) {
  while (!c.out.empty()) {
    ssize_t w = send(cfd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_client(cfd);
      return false;
    }
    c.out.erase(0, static_cast<size_t>(w));
  }
  epoll_event ev{};
  // Stop reading while output is stuck (backpressure); wait for writability instead.
  ev.events = c.out.empty() ? (EPOLLIN | EPOLLRDHUP) : EPOLLOUT;
  if (c.eof && !c.out.empty()) ev.events = EPOLLOUT;
  ev.data.fd = cfd;
  epoll_ctl(epfd_, EPOLL_CTL_MOD, cfd, &ev);
  return true;
}

void ControlServer::close_client(int cfd) {
  epoll_ctl(epfd_, EPOLL_CTL_DEL, cfd, nullptr);
  close(cfd);
  clients_.erase(cfd);
}

}  // namespace rnic::emu
