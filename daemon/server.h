// daemon/server: softrnicd's body — the devices it owns (one per address), the reuseport
// group and steering program of each address, client slots, CM service IDs, and the control
// socket clients connect to (daemon/proto/proto.h has the protocol and the whole shape).
//
// Threading: one thread runs run() (epoll over the listening socket, every client connection,
// the daemon's own UDP sockets and the sockets of free slots, a signal/stop eventfd). Every
// member is touched from that thread only, except stop(), which is async-signal-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/proto/proto.h"
#include "wire/udp_port.h"

namespace rnic::daemon {

struct DeviceSpec {
  std::string ip;          // the device's address (IPv4 or IPv6)
  std::string name;        // empty: softrnic<index>
  uint32_t active_mtu = 0; // bytes, 0 = from the interface
};

struct ServerOptions {
  std::vector<DeviceSpec> devices;
  std::string runtime_dir;  // where softrnicd.sock is made (mode 0700 dir unless `system`)
  bool system = false;      // a system service: socket mode 0666, any local user may connect
  // Per device: a slot is the top byte of the QPN, 1..254 (0xFF would make 0xFFxxxx QPNs, and
  // 0xFFFFFF is the multicast QPN).
  uint32_t max_clients = 254;
  // Per client (0 = the slot's capacity: 61440 QPs, 28672 MRs): past them create_qp/reg_mr
  // fail with ENOMEM, as a device whose limits are reached.
  uint32_t max_qp = 0;
  uint32_t max_mr = 0;
};

class Server {
 public:
  // Binds every device's address (UDP 4791, the group's first socket) and the control
  // socket. nullptr and *err on failure (the address is in use, the directory is wrong, ...).
  static std::unique_ptr<Server> open(const ServerOptions& opt, std::string* err);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until stop(). Returns 0, or a positive errno if the loop failed.
  int run();
  // Thread- and async-signal-safe.
  void stop();
  const std::string& socket_path() const { return path_; }

 private:
  struct Slot {
    std::unique_ptr<wire::UdpPort> port;  // one socket per GID address, in the group for life
    int client = -1;                      // connection fd of its client, -1 = free
    int pidfd = -1;                       // released while its process lived: wait for exit
    int cm_tx = -1, cm_rx = -1;           // CM channel: the daemon's end, the client's end
  };
  struct Device {
    DeviceInfo info;
    std::vector<wire::Endpoint> addrs;    // GID addresses (first = info.ip)
    bool gso = false;
    std::unique_ptr<wire::UdpPort> own;   // slot 0: QP1 and unsteered datagrams
    std::vector<Slot> slots;              // index = slot number; slots[0] unused
    std::map<uint64_t, int> services;     // CM service ID -> slot
    // Service IDs whose listen ended: -> {slot, steady ms}. A REQ for one within
    // kRelistenWindowMs (server.cc) goes to that slot, whose CM agent holds it for the
    // next listen (perftest -R listens twice on one port; emu/cm/agent.h).
    std::map<uint64_t, std::pair<int, uint64_t>> unlistened;
  };
  struct Client {
    int fd = -1;
    pid_t pid = 0;
    uid_t uid = 0;
    bool hello = false;
    int dev = -1;   // opened device, -1 none
    int slot = 0;
    uint64_t since_ms = 0;
    std::set<uint64_t> services;
  };

  Server() = default;
  bool add_device(const DeviceSpec& spec, size_t index, std::string* err);
  int new_slot(Device& d);  // creates slot sockets; returns the slot or -errno
  int attach_steering(Device& d);
  void on_accept();
  void on_client(int fd);
  void drop_client(int fd, const char* why);
  void release_slot(Device& d, int slot, pid_t pid);
  void free_slot(Device& d, int slot);
  void drain(int fd, uint64_t* counter);
  void on_own(Device& d);
  int route_cm(const Device& d, const uint8_t* p, size_t len) const;
  void handle(Client& c, const uint8_t* buf, size_t len, bool* close_it);
  std::string status_json() const;
  void watch(int fd, uint64_t tag);
  void unwatch(int fd);

  ServerOptions opt_;
  std::string path_;
  int listen_fd_ = -1;
  int spare_fd_ = -1;  // /dev/null, given up to refuse a connection when out of descriptors
  int ep_ = -1;
  int stop_fd_ = -1;
  std::vector<Device> devs_;
  std::map<int, Client> clients_;
  // Counters (status): datagrams for a free slot, QP1 datagrams with no client to take them,
  // malformed client messages, clients refused (no slot / permission / out of descriptors).
  uint64_t drop_free_slot_ = 0;
  uint64_t drop_cm_unrouted_ = 0;
  uint64_t cm_routed_ = 0;
  uint64_t bad_messages_ = 0;
  uint64_t refused_ = 0;
  uint64_t clients_total_ = 0;
};

}  // namespace rnic::daemon
