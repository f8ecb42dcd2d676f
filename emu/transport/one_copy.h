// emu/transport/one_copy.h: one copy between two devices of one host (issue 15's stretch).
//
// Through sockets a message is copied four times: registered memory -> the packet arena ->
// the kernel -> the receive buffer -> registered memory. When the two devices of an RC QP
// run in processes of one user on one host (one network namespace), the responder can copy
// the payload straight out of the requester's registered pages instead:
//   - Shadow pinning (emu/objects/pin.h) already keeps every registered page in a memfd,
//     sealed against shrinking. The requester's device hands such a memfd (SCM_RIGHTS) to the
//     peer device (reopened read-only) over a Unix socket the first time a packet names it;
//     the peer maps it PROT_READ, MAP_SHARED, once it proves to be a tmpfs memfd sealed
//     against shrinking: such a mapping never faults.
//   - The request packet keeps every header (BTH with its PSN and AckReq, RETH, ImmDt, IETH)
//     and its ICRC, but its payload is a 24-byte descriptor: the link's token, the memfd's
//     id, the length and the offset. BTH TVer is 1 (wire::kTverOneCopy) so nothing else
//     mistakes it for data; a real RNIC drops it.
//   - The responder runs every check as for any packet (ICRC, QPN, PSN, rkey, PD, access,
//     bounds, RQ WQE), with the payload now pointing into the mapping: its single memcpy is
//     the only copy. The ACK follows the copy, so the requester's buffer is not reused before.
// Agreement and authentication:
//   - Each device listens on the abstract Unix socket "softrnic-oc/<uid>/<ip>:<port>" (its
//     UDP endpoint; abstract names are per network namespace). Both ends check SO_PEERCRED:
//     the peer must have our effective uid, else the connection is closed.
//   - The requester's first message carries a random 64-bit token; every descriptor carries
//     it. A descriptor with an unknown token, an unknown memfd id, or a range outside the
//     memfd is dropped and counted (drop_one_copy): a forged UDP packet cannot make the
//     responder read memory the requester did not share, or any process's but the
//     requester's.
//   - What the peer can read is every page the requester's device registered (the memfds),
//     not only the MR a packet names: a process of the same user could ptrace it anyway.
// Only first transmissions go as descriptors: a resend (after a loss, or after the peer could
// not resolve one) carries the bytes, so a QP always makes progress. A link whose peer hung
// up is retired (its fd closed) and the QPs on it link again.
// Off unless SOFTRNIC_ONE_COPY=1 at both ends (the responder must listen), in embedded hosting,
// for RC SEND and WRITE payloads that lie in one shadowed piece of one SGE. A requester with
// capture or faults attached (Engine::fault_engine_attached) sends payloads as usual. A
// memfd the requester no longer uses is unmapped by the peer at the requester's next share.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu/objects/pin.h"
#include "wire/port.h"

namespace rnic::emu {

inline constexpr uint32_t kOneCopyDescBytes = 24;
// Smaller payloads go by value: a descriptor saves no copy worth its lookups.
inline constexpr uint32_t kOneCopyMinBytes = 256;

class OneCopyLink;

// The payload of a TVer-1 request (big-endian on the wire).
struct OneCopyDesc {
  uint64_t token = 0;
  uint32_t id = 0;   // PinBacking::id
  uint32_t len = 0;  // payload bytes
  uint64_t off = 0;  // file offset in the memfd
};
void put_one_copy_desc(uint8_t* out, const OneCopyDesc& d);
bool get_one_copy_desc(std::span<const uint8_t> in, OneCopyDesc* d);

class OneCopy {
 public:
  // Listens for peers on local's abstract name. nullptr (and *err) when it cannot.
  static std::unique_ptr<OneCopy> open(const wire::Endpoint& local, std::string* err);
  ~OneCopy();
  OneCopy(const OneCopy&) = delete;
  OneCopy& operator=(const OneCopy&) = delete;

  // ---- requester side (any thread)
  using Link = OneCopyLink;
  // The link to the device at `peer`: connects and says hello the first time, and again when
  // the device it linked to has closed; a peer that does not answer (no listener, another
  // user, a full backlog) is asked again at most once a second. Stable pointer.
  Link* link(const wire::Endpoint& peer);
  static uint64_t token(const Link* l);
  // The link's peer hung up or a send to it failed: link() again for a fresh one.
  static bool broken(const Link* l);
  // Makes sure the link's peer has `b` mapped (sends its fd the first time, and tells it to
  // unmap the memfds this process dropped since). false: it cannot (send refused: use the
  // payload path for this packet).
  bool share(Link* l, const std::shared_ptr<const PinBacking>& b);

  // ---- responder side (REQUIRES: one caller at a time: the engine's receive lock)
  // The requester's bytes the descriptor names, or nullptr.
  const uint8_t* resolve(const OneCopyDesc& d);
  // Readable when a peer links, sends a message or closes (the engine's epoll set watches
  // it): then call service(), which accepts and reads them (a closed peer's mappings go).
  int wait_fd() const { return ep_fd_; }
  void service();

  // Tests.
  static std::string name_for(const wire::Endpoint& ep);
  size_t imports() const;
  // The next n resolves fail, as when a mapping cannot be made (responder side).
  void fail_resolves_for_test(uint32_t n) { fail_for_test_.store(n); }
  // Drops every peer's link and mappings, as a failed receive of a share would.
  void drop_links_for_test();

 private:
  struct Import {
    const uint8_t* base = nullptr;
    uint64_t size = 0;
  };
  struct InLink {
    int fd = -1;
    uint64_t token = 0;  // 0 until its hello
    std::unordered_map<uint32_t, Import> map;
  };
  OneCopy() = default;
  static constexpr uint64_t kOutTag = uint64_t{1} << 32;  // epoll data of a link we made
  void retire_locked(Link& l);
  void pump();                 // accepts peers and reads their messages (responder side)
  bool read_link(InLink& in);  // false: closed
  void drop_link(InLink& in);

  int listen_fd_ = -1;
  int ep_fd_ = -1;  // epoll set: the listener and every peer's socket
  std::mutex out_mu_;
  struct Out {
    std::unique_ptr<Link> link;  // nullptr: the peer did not answer
    uint64_t retry_ns = 0;       // then: not asked again before this
    Link* get() const { return link.get(); }
  };
  static constexpr uint64_t kRetryNs = 1'000'000'000;
  std::unordered_map<std::string, Out> out_;
  std::vector<std::unique_ptr<Link>> dead_;  // replaced links QPs may still point to
  mutable std::mutex in_mu_;
  std::vector<InLink> in_;
  std::atomic<uint32_t> fail_for_test_{0};
};

}  // namespace rnic::emu
