// tools/control_client.cc: the client side of the control socket (emu/services/control.h
// defines the protocol): connect, one request and its reply, and discovery of the live
// sockets in the runtime directory. Only the `softrnic` CLI links this: it never ships in
// libibverbs.so.1.
#include "tools/control_client.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace rnic::emu {
namespace {

constexpr size_t kMaxReplyBuffer = 4u << 20;  // a reply larger than this is a protocol error

std::string errno_text(int e) { return std::strerror(e); }

bool fill_sockaddr(const std::string& path, sockaddr_un* sa) {
  std::memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  if (path.size() >= sizeof(sa->sun_path)) return false;
  std::memcpy(sa->sun_path, path.c_str(), path.size() + 1);
  return true;
}

bool parse_pid(std::string_view s, uint32_t* v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, 10);
  return ec == std::errc() && p == s.data() + s.size();
}

// Parses "<device>.<pid>.sock"; the device name may itself contain dots.
bool parse_socket_name(std::string_view name, std::string* device, pid_t* pid) {
  constexpr std::string_view kSuffix = ".sock";
  if (name.size() <= kSuffix.size() || name.substr(name.size() - kSuffix.size()) != kSuffix) {
    return false;
  }
  name.remove_suffix(kSuffix.size());
  size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot == 0) return false;
  std::string_view p = name.substr(dot + 1);
  uint32_t v = 0;
  if (p.empty() || p.size() > 10 || !parse_pid(p, &v) || p[0] == '0' || v == 0) return false;
  *device = std::string(name.substr(0, dot));
  *pid = static_cast<pid_t>(v);
  return true;
}

}  // namespace

std::unique_ptr<ControlClient> ControlClient::connect(const std::string& path, std::string* err,
                                                      int timeout_ms) {
  sockaddr_un sa;
  if (!fill_sockaddr(path, &sa)) {
    *err = "socket path too long: " + path;
    return nullptr;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = "socket(): " + errno_text(errno);
    return nullptr;
  }
  timeval tv{};
  tv.tv_sec = timeout_ms / 1000;
  tv.tv_usec = (timeout_ms % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    *err = "connect " + path + ": " + errno_text(errno);
    close(fd);
    return nullptr;
  }
  return std::unique_ptr<ControlClient>(new ControlClient(fd));
}

ControlClient::~ControlClient() { close(fd_); }

bool ControlClient::read_line(std::string* line) {
  while (true) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      line->assign(buf_, 0, nl);
      buf_.erase(0, nl + 1);
      return true;
    }
    if (buf_.size() > kMaxReplyBuffer) return false;
    char tmp[8192];
    ssize_t got = recv(fd_, tmp, sizeof(tmp), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(got));
  }
}

std::string ControlClient::request(std::string_view line, ControlReply* reply) {
  *reply = ControlReply{};
  if (line.find('\n') != std::string_view::npos) return "request contains a newline";
  std::string msg(line);
  msg += '\n';
  size_t off = 0;
  while (off < msg.size()) {
    ssize_t w = send(fd_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      // The server may have refused us before reading (peer uid, too many clients) and
      // closed: its "err" is still queued for us and says why.
      std::string why = "send: " + errno_text(errno);
      std::string l;
      if (read_line(&l) && l == "." && read_line(&l) && l.rfind("err ", 0) == 0) {
        reply->error = l.substr(4);
        return "";
      }
      return why;
    }
    off += static_cast<size_t>(w);
  }
  std::string l;
  while (true) {
    if (!read_line(&l)) {
      return errno == EAGAIN || errno == EWOULDBLOCK ? "timed out waiting for the device"
                                                     : "connection closed by the device";
    }
    if (l == ".") break;
    if (!l.empty() && l.front() == '.') l.erase(0, 1);
    reply->lines.push_back(std::move(l));
  }
  if (!read_line(&l)) return "connection closed before the status line";
  if (l == "ok") {
    reply->ok = true;
  } else if (l.rfind("err ", 0) == 0 || l == "err") {
    reply->error = l.size() > 4 ? l.substr(4) : "unspecified error";
  } else {
    return "bad status line from the device: '" + l.substr(0, 80) + "'";
  }
  return "";
}

std::vector<ControlSocketInfo> find_control_sockets(const std::string& dir, bool clean_stale) {
  std::vector<ControlSocketInfo> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  std::vector<ControlSocketInfo> cand;
  while (dirent* e = readdir(d)) {
    ControlSocketInfo info;
    if (!parse_socket_name(e->d_name, &info.device, &info.pid)) continue;
    info.path = dir + (dir.empty() || dir.back() == '/' ? "" : "/") + e->d_name;
    cand.push_back(std::move(info));
  }
  closedir(d);
  for (ControlSocketInfo& c : cand) {
    struct stat st;
    if (lstat(c.path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_un sa;
    if (!fill_sockaddr(c.path, &sa)) continue;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    int e = errno;
    close(fd);
    if (rc == 0) {
      out.push_back(std::move(c));
    } else if (e == ECONNREFUSED && clean_stale && st.st_uid == geteuid()) {
      unlink(c.path.c_str());
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ControlSocketInfo& a, const ControlSocketInfo& b) { return a.path < b.path; });
  return out;
}

std::string select_control_socket(const std::string& dir, std::string_view device, pid_t pid,
                                  ControlSocketInfo* out) {
  std::vector<ControlSocketInfo> all = find_control_sockets(dir, true);
  std::vector<ControlSocketInfo> hit;
  for (ControlSocketInfo& s : all) {
    if (!device.empty() && s.device != device) continue;
    if (pid != 0 && s.pid != pid) continue;
    hit.push_back(s);
  }
  if (hit.size() == 1) {
    *out = hit[0];
    return "";
  }
  std::string what;
  if (!device.empty()) what += " device " + std::string(device);
  if (pid != 0) what += " pid " + std::to_string(pid);
  if (hit.empty()) {
    std::string e = "no running softrnic device" + what + " (no live control socket in " + dir +
                    ")";
    if (!all.empty()) {
      e += "; running:";
      for (const ControlSocketInfo& s : all) e += " " + s.device + "(pid " + std::to_string(s.pid) + ")";
    }
    return e;
  }
  std::string e = std::to_string(hit.size()) + " softrnic devices" + what +
                  " are running; choose one with --device NAME, --pid PID or --socket PATH:";
  for (const ControlSocketInfo& s : hit) {
    e += "\n  " + s.device + " pid " + std::to_string(s.pid) + " " + s.path;
  }
  return e;
}

}  // namespace rnic::emu
