// daemon/proto: the wire format between softrnicd and its clients (the verbs shim, and
// `softrnic-ctl status`), over a Unix SOCK_SEQPACKET socket at <runtime dir>/softrnicd.sock.
//
// SHAPE (docs/daemon.md). softrnicd owns each device's address and UDP port 4791: for every
// client that opens a device it binds one more socket on that address with SO_REUSEPORT, and a
// classic BPF program on the group steers each datagram by the top byte of its BTH
// destination QPN — the client's slot — to that client's socket (slot 0, QP1 and anything
// unknown, to the daemon's own socket). The client runs the engine over the socket it is
// handed, with QPNs and memory keys carrying its slot (emu DeviceConfig::slot), so
// post_send/poll_cq never cross a process boundary, and a key or QPN of one process never
// resolves in another. The daemon holds every slot socket for its whole life, so the
// group's order, which the BPF program's return value indexes, never changes.
//
// PROTOCOL. Every message is one datagram: a Header, then the fixed body of its type.
// Descriptors travel as SCM_RIGHTS on kOpened only. A client sends kHello first; the daemon
// answers kDevices. Then kOpen (answer kOpened + sockets), kListen/kUnlisten (answer kReply).
// The connection's end (client exit, SIGKILL included) releases the client's slot, its
// service IDs and its counts at once. Every field from the peer is validated; a malformed
// message closes that connection and is counted, nothing else.
//
// Thread-safety: the helpers are plain functions over a descriptor; callers serialize.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rnic::daemon {

inline constexpr uint32_t kProtoVersion = 1;
inline constexpr const char* kSocketName = "softrnicd.sock";
// A system service's socket, tried after the runtime directory's.
inline constexpr const char* kSystemSocket = "/run/softrnic/softrnicd.sock";
inline constexpr size_t kMaxDevices = 8;
inline constexpr size_t kMaxFds = 17;  // sockets per device (one per GID address) + CM channel
inline constexpr size_t kMaxMsg = 4096;

enum class MsgType : uint32_t {
  kHello = 1,    // client -> daemon: HelloMsg
  kDevices = 2,  // daemon -> client: DevicesMsg
  kOpen = 3,     // client -> daemon: OpenMsg
  kOpened = 4,   // daemon -> client: OpenedMsg, with OpenedMsg::nfds sockets
  kListen = 5,   // client -> daemon: ServiceMsg (claim a CM service ID)
  kUnlisten = 6, // client -> daemon: ServiceMsg
  kReply = 7,    // daemon -> client: ReplyMsg
  kStatus = 8,   // client -> daemon: Header only (softrnic-ctl status)
  kStatusText = 9,  // daemon -> client: Header + UTF-8 text (JSON)
};

struct Header {
  uint32_t type = 0;
  uint32_t len = 0;  // whole datagram, header included
};

struct HelloMsg {
  Header h;
  uint32_t version = kProtoVersion;
  uint32_t pid = 0;
};

struct DeviceInfo {
  char name[64] = {};
  char ip[64] = {};          // primary address, as SOFTRNIC_IP takes it
  uint64_t node_guid = 0;    // host order; one GUID for every client
  uint32_t active_mtu = 0;   // bytes, 0 = from the interface
  uint32_t gso = 0;          // 1: UDP GSO batches are safe on this address (loopback)
  uint32_t nfds = 0;         // sockets a kOpen hands out (one per GID address)
  uint32_t pad = 0;
};

struct DevicesMsg {
  Header h;
  uint32_t version = kProtoVersion;
  uint32_t count = 0;
  DeviceInfo dev[kMaxDevices];
};

struct OpenMsg {
  Header h;
  uint32_t index = 0;  // into DevicesMsg::dev
  uint32_t pad = 0;
};

struct OpenedMsg {
  Header h;
  int32_t err = 0;     // 0, or a positive errno (EUSERS: every slot taken, ...)
  uint32_t slot = 0;   // 1..255
  uint32_t max_qp = 0; // per-client limits
  uint32_t max_mr = 0;
  uint32_t nfds = 0;   // UDP sockets attached, in GID order
  // 1: one more descriptor follows them: the slot's CM channel (wire::UdpPortOptions::side_fd),
  // where the daemon forwards the QP1 datagrams that belong to this client.
  uint32_t side = 0;
};

struct ServiceMsg {
  Header h;
  uint64_t service_id = 0;
  uint32_t seq = 0;
  uint32_t pad = 0;
};

struct ReplyMsg {
  Header h;
  uint32_t seq = 0;
  int32_t err = 0;  // 0 or a positive errno (EADDRINUSE: the service ID is another client's)
};

// Sends one message (and `fds`, if any). Returns 0 or a positive errno. Never raises SIGPIPE.
int send_msg(int sock, const void* msg, size_t len, const int* fds = nullptr, size_t nfds = 0);
// Receives one message into buf (cap bytes) and up to max_fds descriptors (CLOEXEC; extras
// are closed). Returns the message length, 0 at the peer's end, or -errno. A message shorter
// than a Header or whose Header::len differs from its length is -EPROTO (fds closed).
ssize_t recv_msg(int sock, void* buf, size_t cap, std::vector<int>* fds = nullptr,
                 size_t max_fds = 0);
// Sends `req` and waits up to timeout_ms for one message (recv_msg semantics, -ETIMEDOUT).
ssize_t call(int sock, const void* req, size_t req_len, void* buf, size_t cap,
             std::vector<int>* fds, size_t max_fds, int timeout_ms);

// The daemon's socket path a client tries: `runtime_dir`/softrnicd.sock, else kSystemSocket.
// Connects (SOCK_SEQPACKET, CLOEXEC) and returns the descriptor, or -errno (-ENOENT: none).
int connect_daemon(const std::string& runtime_dir, std::string* path_out = nullptr);

// Fills a header for a message of type t and sizeof(M).
template <class M>
void init_msg(M* m, MsgType t) {
  m->h.type = static_cast<uint32_t>(t);
  m->h.len = sizeof(M);
}

}  // namespace rnic::daemon
