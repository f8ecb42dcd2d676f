// tools/control_client.h: the client of a device's control socket (protocol in
// emu/services/control.h): ControlClient sends one request line and reads its reply;
// find_control_sockets / select_control_socket locate the live "<device>.<pid>.sock" entries
// of a runtime directory. Control path only; used by softrnic-ctl and the tests.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rnic::emu {

struct ControlReply {
  bool ok = false;
  std::string error;               // the message of "err MESSAGE"
  std::vector<std::string> lines;  // data lines, dot-stuffing removed
};

class ControlClient {
 public:
  // Connects to a control socket. timeout_ms bounds every later send/receive.
  static std::unique_ptr<ControlClient> connect(const std::string& path, std::string* err,
                                                int timeout_ms = 5000);
  ~ControlClient();
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  // Sends one request (no '\n' inside) and reads its response into *reply. Returns "" or a
  // transport/protocol error (the reply's own "err" is not a transport error).
  std::string request(std::string_view line, ControlReply* reply);

 private:
  explicit ControlClient(int fd) : fd_(fd) {}
  bool read_line(std::string* line);
  int fd_;
  std::string buf_;
};

// A live control socket found in a runtime directory.
struct ControlSocketInfo {
  std::string path;
  std::string device;
  pid_t pid = 0;
};

// Lists "<device>.<pid>.sock" entries of dir, sorted by path, that accept a connection.
// Entries that refuse it (stale: their process is gone) are skipped, and removed when
// clean_stale and they are ours. A missing dir yields an empty list.
std::vector<ControlSocketInfo> find_control_sockets(const std::string& dir, bool clean_stale);

// Picks the socket to talk to: filters find_control_sockets(dir) by device (if non-empty)
// and pid (if non-zero); exactly one must remain. Returns "" and *out, or an error that
// lists the candidates when there are several.
std::string select_control_socket(const std::string& dir, std::string_view device, pid_t pid,
                                  ControlSocketInfo* out);

}  // namespace rnic::emu
