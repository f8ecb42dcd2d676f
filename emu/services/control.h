// Runtime control of a running device: ControlTarget (what a device offers) and ControlServer
// (a per-device Unix socket speaking a line protocol). The client side (softrnic-ctl) is in
// tools/control_client.h and does not ship in libibverbs.so.1.
//
// Protocol (text, one request per line, any number of requests per connection):
//   request  := COMMAND [ARGS] "\n"            at most kMaxRequestLine bytes, '\r' before '\n'
//                                              tolerated; no other control bytes
//   response := { DATA "\n" } "." "\n" STATUS "\n"
//     DATA   : a line; a data line that starts with '.' is sent with one more '.' in front
//              (dot-stuffing, as SMTP), so "." alone always ends the data
//     STATUS : "ok" | "err " MESSAGE           (MESSAGE is one line)
//   commands:
//     info                       -> "device NAME", "pid PID"
//     help                       -> one line per command
//     fault add PLAN             PLAN: rules of emu/fault/fault_rules.h, ';'-separated; all or none
//     fault list                 -> "ID fired=N matched=M TEXT" per rule
//     fault clear
//     stats                      -> "NAME VALUE" per device counter
//     stats qp QPN               -> "NAME VALUE" per counter of that QP (QPN decimal or 0x hex)
//     capture start PATH         PATH absolute (the client makes it so)
//     capture stop
//   A malformed or unknown request gets "err ..." and the connection stays usable; a line
//   longer than kMaxRequestLine gets "err request line too long" and the rest of it (up to
//   the next '\n') is discarded.
//
// Security: the socket lives at <runtime_dir>/<device>.<pid>.sock, mode 0600, in a directory
// that must be ours and mode 0700 (created so if missing); a peer whose SO_PEERCRED uid is
// not ours gets "err permission denied" and is disconnected.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "emu/objects/counters.h"
#include "emu/fault/fault.h"  // FaultRuleInfo, FaultCounters

namespace rnic::emu {

inline constexpr size_t kMaxRequestLine = 64 * 1024;

// (name, value) pairs as the CLI prints them ("sent_pkts 12").
using StatList = std::vector<std::pair<std::string, uint64_t>>;

// What a device must offer to be controlled at run time. Every method is called on the
// control server's thread (start_thread) or on whichever thread calls handle_ready(), while
// the device's own threads keep running: implementations must be thread-safe against the
// data path. Error returns are "" for success or a one-line message for the user.
class ControlTarget {
 public:
  virtual ~ControlTarget() = default;

  // The device name, e.g. "softrnic0" (names the socket; no '/', not empty).
  virtual std::string device_name() const = 0;
  // Parses PLAN (rule language of emu/fault/fault_rules.h, ';'-separated rules) and appends its
  // rules to the device's fault engine, all or nothing.
  virtual std::string fault_add(std::string_view plan) = 0;
  // The rules in evaluation order with their counts (FaultEngine::list()).
  virtual std::vector<FaultRuleInfo> fault_list() = 0;
  // Removes every rule.
  virtual void fault_clear() = 0;
  // Device counters (qpn empty) or one QP's counters into *out, in a stable order.
  // Unknown QPN -> error.
  virtual std::string stats(std::optional<uint32_t> qpn, StatList* out) = 0;
  // Starts writing every packet sent and received to a pcap file at path (absolute).
  // Already capturing or cannot open -> error.
  virtual std::string capture_start(std::string_view path) = 0;
  // Stops and closes the capture. Not capturing -> error.
  virtual std::string capture_stop() = 0;
};

// Helpers for implementing ControlTarget::stats(): append every counter of c as
// (counter_name(ctr), value), in Ctr order; and the fault engine's totals as "fault_packets",
// "fault_fired", "fault_dropped", ... (one per FaultCounters field).
void append_counter_stats(const Counters& c, StatList* out);
void append_fault_stats(const FaultCounters& f, StatList* out);

// Executes one request line against target and returns the full response text
// (data lines, ".", status line, each ending in '\n'). Never throws on bad input.
std::string execute_control_request(ControlTarget& target, std::string_view line);

// ---- Runtime directory --------------------------------------------------------------

// $SOFTRNIC_RUNTIME_DIR, else $XDG_RUNTIME_DIR/softrnic (when XDG_RUNTIME_DIR is set and is a
// directory), else /tmp/softrnic-<uid>.
std::string control_runtime_dir();

// Checks that dir is a directory (not a symlink) owned by uid with no group/other access.
// create: makes it with mode 0700 first if it is missing (the parent must exist).
// Returns "" or a message naming the directory and what is wrong.
std::string check_runtime_dir(const std::string& dir, bool create, uid_t uid);

// "<dir>/<device>.<pid>.sock"
std::string control_socket_path(const std::string& dir, std::string_view device, pid_t pid);

// ---- Server -------------------------------------------------------------------------

class ControlServer {
 public:
  struct Options {
    std::string runtime_dir;           // empty: control_runtime_dir()
    std::optional<uid_t> allowed_uid;  // empty: geteuid() (tests override it)
    size_t max_clients = 16;           // further connections get "err" and are closed
  };

  // Prepares the runtime directory and binds + listens on the device's socket (replacing a
  // leftover file of the same name). target must outlive the server. Returns nullptr and
  // *err on failure. Does not start serving: call start_thread() or poll fd().
  static std::unique_ptr<ControlServer> open(ControlTarget* target, std::string* err);
  static std::unique_ptr<ControlServer> open(ControlTarget* target, const Options& opt,
                                             std::string* err);

  // stop(), closes every connection and removes the socket file (only in the process that
  // opened it, so a forked child exiting does not remove its parent's socket).
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  const std::string& socket_path() const { return path_; }

  // Serves on a thread of its own until stop(). Returns "" or an error.
  std::string start_thread();
  // Stops and joins the thread (no-op without one). Must not be called from a target method.
  void stop();

  // For an existing event loop instead of start_thread(): fd() is an epoll descriptor that
  // polls readable when handle_ready() has work; handle_ready() never blocks and serves
  // whatever is ready. REQUIRES: no thread started; one caller at a time.
  int fd() const { return epfd_; }
  void handle_ready();

  size_t client_count() const { return clients_.size(); }

 private:
  struct Client {
    std::string in;
    std::string out;
    bool discarding = false;  // inside an over-long line, dropping bytes until '\n'
    bool eof = false;         // peer shut down its write side
  };

  ControlServer() = default;
  void accept_all();
  void serve_client(int cfd, uint32_t events);
  bool flush_client(int cfd, Client& c);  // false: the client is gone
  void close_client(int cfd);
  void thread_main();

  ControlTarget* target_ = nullptr;
  Options opt_;
  uid_t allowed_uid_ = 0;
  std::string path_;
  pid_t owner_pid_ = 0;
  dev_t sock_dev_ = 0;
  ino_t sock_ino_ = 0;
  int listen_fd_ = -1;
  int epfd_ = -1;
  int stop_fd_ = -1;  // eventfd that wakes the thread for stop()
  std::map<int, Client> clients_;
  std::thread thread_;
};

}  // namespace rnic::emu
